/* own_loop.c: a training loop written by hand from stepgraph's public ops, as a user would:
 * a two-layer network (Linear + ReLU, Linear) fitting a random linear teacher with MSE and
 * AdamW, its gradients clipped to a global norm of 0.5 (the norm measured, the clipping factor
 * applied by the optimizer as it reads them: no pass over the gradients of its own), its
 * parameters in one flat buffer (views per tensor, so addresses never move). The
 * same step runs twice from the same start: eagerly, and captured once with sg_graph_capture
 * and replayed, the batch copied into static inputs before each replay. The program checks
 * that the loss fell and that both copies end bit for bit equal. Usage: own_loop [cpu|cuda]. */
#include <stepgraph.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 64, D = 16, H = 32, O = 4, STEPS = 300, WARMUP = 3 };
#define MAX_NORM 0.5f

#define TRY(call)                                                                          \
    do {                                                                                   \
        if ((call) != SG_OK) {                                                             \
            fprintf(stderr, "own_loop: %s: %s\n", #call, sg_ctx_last_error(ctx));          \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static sg_ctx *ctx;

/* One copy of the network: flat parameters and gradients with views, AdamW state, the batch
 * (static inputs of the graph) and the activations. */
typedef struct net {
    sg_tensor *params, *grads, *m, *v, *hp, *seg_start, *seg_decay;
    sg_tensor *w1, *b1, *w2, *b2, *dw1, *db1, *dw2, *db2;
    sg_tensor *x, *t, *h, *y, *loss, *dy, *dh;
    sg_tensor *norm, *nonfinite, *factor; /* clipping: the gradients' norm, a flag, the factor */
} net;

static sg_tensor *make(int ndim, const int64_t *shape, const char *name)
{
    sg_tensor *t;
    TRY(sg_tensor_create(ctx, SG_DTYPE_F32, ndim, shape, name, &t));
    return t;
}

static sg_tensor *view(sg_tensor *base, int64_t off, int ndim, const int64_t *shape, const char *name)
{
    sg_tensor *t;
    TRY(sg_tensor_view(base, off, ndim, shape, name, &t));
    return t;
}

/* Segments of the flat buffer: w1 (H,D), b1 (H), w2 (O,H), b2 (O); decay on weights only. */
static const int64_t seg[5] = {0, H * D, H * D + H, H * D + H + O * H, H * D + H + O * H + O};

static void net_init(net *n, const float *init)
{
    const int64_t P = seg[4];
    n->params = make(1, &P, "params"), n->grads = make(1, &P, "grads");
    n->m = make(1, &P, "adam.m"), n->v = make(1, &P, "adam.v");
    TRY(sg_tensor_copy_from_host(n->params, init, (size_t)P * sizeof(float)));
    TRY(sg_tensor_fill(n->m, 0.0));
    TRY(sg_tensor_fill(n->v, 0.0));
    n->w1 = view(n->params, seg[0], 2, (int64_t[]){H, D}, "w1"), n->b1 = view(n->params, seg[1], 1, (int64_t[]){H}, "b1");
    n->w2 = view(n->params, seg[2], 2, (int64_t[]){O, H}, "w2"), n->b2 = view(n->params, seg[3], 1, (int64_t[]){O}, "b2");
    n->dw1 = view(n->grads, seg[0], 2, (int64_t[]){H, D}, "dw1"), n->db1 = view(n->grads, seg[1], 1, (int64_t[]){H}, "db1");
    n->dw2 = view(n->grads, seg[2], 2, (int64_t[]){O, H}, "dw2"), n->db2 = view(n->grads, seg[3], 1, (int64_t[]){O}, "db2");
    /* AdamW's hyperparameters live on the device; the kernel counts the steps. */
    sg_optim_hparams hp = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-4f};
    n->hp = make(1, (int64_t[]){8}, "adam.hparams");
    TRY(sg_tensor_copy_from_host(n->hp, &hp, sizeof hp));
    int32_t start[5], decay[4] = {1, 0, 1, 0};
    for (int i = 0; i < 5; i++) start[i] = (int32_t)seg[i];
    TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){5}, "seg_start", &n->seg_start));
    TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){4}, "seg_decay", &n->seg_decay));
    TRY(sg_tensor_copy_from_host(n->seg_start, start, sizeof start));
    TRY(sg_tensor_copy_from_host(n->seg_decay, decay, sizeof decay));
    n->x = make(2, (int64_t[]){B, D}, "x"), n->t = make(2, (int64_t[]){B, O}, "target");
    n->h = make(2, (int64_t[]){B, H}, "h"), n->dh = make(2, (int64_t[]){B, H}, "dh");
    n->y = make(2, (int64_t[]){B, O}, "y"), n->dy = make(2, (int64_t[]){B, O}, "dy");
    n->loss = make(1, (int64_t[]){1}, "loss");
    n->norm = make(1, (int64_t[]){1}, "grad.norm"), n->factor = make(1, (int64_t[]){1}, "clip.factor");
    TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "grad.nonfinite", &n->nonfinite));
}

static void net_free(net *n)
{
    sg_tensor *ts[] = {n->w1, n->b1, n->w2, n->b2, n->dw1, n->db1, n->dw2, n->db2, /* views first */
                       n->params, n->grads, n->m, n->v, n->hp, n->seg_start, n->seg_decay,
                       n->x, n->t, n->h, n->y, n->loss, n->dy, n->dh, n->norm, n->nonfinite, n->factor};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

/* Forward, MSE, backward, clipping, AdamW: the work of one step, queued on the context's stream.
 * The same calls every time, so it can be captured. Clipping: sg_clip_factor writes the factor
 * min(1, MAX_NORM / (norm + 1e-6)) and leaves the gradients alone; AdamW's _amp form multiplies each
 * gradient by it as it reads it, bit for bit sg_clip_grad_norm then sg_adamw_step. */
static sg_status step(void *user)
{
    net *n = user;
    sg_status st = sg_linear_forward(ctx, n->x, n->w1, n->b1, SG_ACT_RELU, n->h, NULL);
    if (st == SG_OK) st = sg_linear_forward(ctx, n->h, n->w2, n->b2, SG_ACT_NONE, n->y, NULL);
    if (st == SG_OK) st = sg_mse(ctx, n->y, n->t, 1.f, n->loss, n->dy);
    if (st == SG_OK) st = sg_linear_backward(ctx, n->h, n->w2, n->dy, SG_ACT_NONE, NULL, n->dh, n->dw2, n->db2);
    if (st == SG_OK) st = sg_linear_backward(ctx, n->x, n->w1, n->dh, SG_ACT_RELU, n->h, NULL, n->dw1, n->db1);
    if (st == SG_OK) st = sg_clip_factor(ctx, n->grads, MAX_NORM, n->norm, n->nonfinite, n->factor);
    if (st == SG_OK)
        st = sg_adamw_step_amp(ctx, n->params, n->grads, n->factor, n->m, n->v, n->hp, n->seg_start, n->seg_decay, 4,
                               NULL, NULL);
    return st;
}

static uint64_t rng = 0x5eed;
static float uniform(void) /* [-1, 1) */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.f;
}

/* Batch s of the data set: x uniform, target = x @ teacher^T. The same for both copies. */
static void load_batch(net *n, int s, const float *teacher)
{
    static float x[B * D], t[B * O];
    rng = 0x9e3779b97f4a7c15ull * (uint64_t)(s % 16 + 1);
    for (int i = 0; i < B * D; i++) x[i] = uniform();
    for (int b = 0; b < B; b++)
        for (int o = 0; o < O; o++) {
            double acc = 0;
            for (int d = 0; d < D; d++) acc += (double)x[b * D + d] * teacher[o * D + d];
            t[b * O + o] = (float)acc;
        }
    TRY(sg_tensor_copy_from_host(n->x, x, sizeof x));
    TRY(sg_tensor_copy_from_host(n->t, t, sizeof t));
}

int main(int argc, char **argv)
{
    sg_ctx_options o = sg_ctx_options_default();
    o.backend = argc > 1 && !strcmp(argv[1], "cuda") ? SG_BACKEND_CUDA : SG_BACKEND_CPU;
    if (sg_ctx_create(&o, &ctx) != SG_OK) {
        fprintf(stderr, "own_loop: %s\n", sg_ctx_last_error(NULL));
        return 1;
    }
    static float init[H * D + H + O * H + O], teacher[O * D];
    for (int i = 0; i < (int)(sizeof init / sizeof *init); i++) init[i] = 0.3f * uniform();
    for (int i = 0; i < O * D; i++) teacher[i] = uniform();
    net eager, graphed;
    net_init(&eager, init);
    net_init(&graphed, init);

    /* The graph's inputs: the batch tensors, refilled before each replay. */
    const sg_tensor *inputs[2] = {graphed.x, graphed.t};
    sg_graph_options go = sg_graph_options_default();
    go.name = "own_loop.step", go.warmup = 0, go.static_inputs = inputs, go.n_static_inputs = 2;
    sg_graph *g = NULL;
    float first = 0, last_e = 0, last_g = 0, norm0 = 0;
    for (int s = 0; s < STEPS; s++) {
        load_batch(&eager, s, teacher);
        TRY(step(&eager));
        load_batch(&graphed, s, teacher);
        if (s < WARMUP) TRY(step(&graphed)); /* eager steps first: lazy set-up happens there */
        else {
            if (!g) TRY(sg_graph_capture(ctx, step, &graphed, &go, &g));
            TRY(sg_graph_replay(g));
        }
        if (s == 0) TRY(sg_tensor_copy_to_host(eager.loss, &first, sizeof first));
        if (s == 0) TRY(sg_tensor_copy_to_host(eager.norm, &norm0, sizeof norm0));
    }
    TRY(sg_tensor_copy_to_host(eager.loss, &last_e, sizeof last_e));
    TRY(sg_tensor_copy_to_host(graphed.loss, &last_g, sizeof last_g));
    static float pe[sizeof init / sizeof *init], pg[sizeof init / sizeof *init];
    TRY(sg_tensor_copy_to_host(eager.params, pe, sizeof pe));
    TRY(sg_tensor_copy_to_host(graphed.params, pg, sizeof pg));
    int same = !memcmp(pe, pg, sizeof pe) && !memcmp(&last_e, &last_g, sizeof last_e);
    printf("own_loop on %s: loss %.5f -> %.5f over %d steps (%d eager, %d replayed; gradient norm %.3g at "
           "step 1, clipped to %g); graph and eager %s\n", sg_ctx_device_name(ctx), first, last_e, STEPS, WARMUP,
           STEPS - WARMUP, norm0, (double)MAX_NORM, same ? "bit-exact" : "DIFFER");
    sg_graph_destroy(g);
    net_free(&eager);
    net_free(&graphed);
    sg_ctx_destroy(ctx);
    if (!same || !(last_e < first / 4)) {
        fprintf(stderr, "own_loop: %s\n", same ? "the loss did not fall to a quarter" : "the captured loop differs");
        return 1;
    }
    return 0;
}
