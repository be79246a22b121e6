/* test_recompute.c: activation recompute (sg_builder_begin_recompute, sg_module_recompute).
 * A small vision network of fresh random sizes, built twice from one seed, once with three
 * recompute regions (residual blocks with batch norm, ReLU and SiLU, a depthwise convolution,
 * stochastic depth drawing masks, a strided shortcut) and once without: every step's loss, the
 * parameters and the running statistics equal bit for bit (batch norm moves them once, the
 * masks are drawn again alike), the recomputing model's peak memory is lower, and its steps
 * allocate nothing; every scope bit for bit against eager through sg_verify with graphs
 * replayed; the built-in models' --recompute (a GPT with dropout, resnet18, efficientnet_b0)
 * against theirs without; and the refusals, each naming what was wrong, after which the
 * context still trains. Modes: cpu, gpu (skipped without a GPU). */
#include "testutil.h"

typedef struct spec {
    int64_t B, n, H, W, Cin, C1, C2, classes;
    uint64_t seed, dseed;
    sg_dtype precision;
    int recompute;
} spec;

static spec draw(void)
{
    spec s = {.B = tu_randint(2, 5), .H = tu_randint(6, 11), .W = tu_randint(6, 11), .Cin = tu_randint(1, 4),
              .C1 = tu_randint(3, 13), .C2 = tu_randint(3, 13), .classes = tu_randint(2, 6), .seed = tu_next(),
              .dseed = tu_next(), .precision = SG_DTYPE_F32};
    s.n = s.B * tu_randint(2, 3) + tu_randint(0, (int)s.B - 1);
    return s;
}

/* x (n, H, W, Cin) N(0,1), labels uniform over the classes: the same for the same spec. */
static sg_dataset *images(sg_ctx *ctx, const spec *s)
{
    return tu_images(ctx, s->n, s->H, s->W, s->Cin, s->classes, s->dseed);
}

/* Block "layer<i>": conv 3x3 (stride), BN + act, depthwise 3x3, BN, stochastic depth when the
 * shape is kept, a residual around it (a strided 1x1 conv + BN shortcut where it is not). */
static sg_module *block(sg_ctx *ctx, sg_builder *b, int i, const int64_t in[3], int64_t C, int stride,
                        sg_activation act, int64_t out[3])
{
    char scope[16];
    snprintf(scope, sizeof scope, "layer%d", i);
    TU_OK(ctx, sg_builder_push_scope(b, scope));
    sg_module *m[5], *seq, *sc[2], *sc_seq = NULL, *r;
    int64_t c[3];
    tu_conv_bn(ctx, b, "conv1", "bn1", in, C, 3, stride, 1, act, c, &m[0]);
    tu_conv_bn(ctx, b, "conv2", "bn2", c, C, 3, 1, (int)C, SG_ACT_NONE, out, &m[2]);
    int n = 4;
    bool same = stride == 1 && in[2] == C;
    if (same) TU_OK(ctx, sg_module_stochastic_depth(b, "sd", out[0], out[1], C, 0.3f, &m[n++]));
    TU_OK(ctx, sg_module_sequential(b, "main", m, n, &seq));
    if (!same) {
        TU_OK(ctx, sg_builder_push_scope(b, "downsample"));
        int64_t so[3];
        tu_conv_bn(ctx, b, "0", "1", in, C, 1, stride, 1, SG_ACT_NONE, so, sc);
        sg_builder_pop_scope(b);
        TU_OK(ctx, sg_module_sequential(b, "downsample", sc, 2, &sc_seq));
    }
    TU_OK(ctx, sg_module_residual_block(b, "", seq, sc_seq, in, out, SG_ACT_RELU, &r));
    sg_builder_pop_scope(b);
    return r;
}

/* stem conv + BN + ReLU; layer1 (C1, ReLU, identity), layer2 (C1, SiLU, identity), layer3 (C2,
 * stride 2, shortcut): each a region when s->recompute; average pool; fc. */
static sg_model *mini(sg_ctx *ctx, const spec *s)
{
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = s->B, bo.precision = s->precision, bo.dropout = 0.25f; /* stochastic depth's generator */
    sg_builder *b;
    TU_OK(ctx, sg_builder_create(ctx, "mini", &bo, &b));
    sg_module *l[8], *root;
    int n = 0;
    int64_t x[3] = {s->H, s->W, s->Cin}, a[3], c[3];
    tu_conv_bn(ctx, b, "conv1", "bn1", x, s->C1, 3, 1, 1, SG_ACT_RELU, a, &l[n]);
    n += 2;
    const int64_t width[3] = {s->C1, s->C1, s->C2};
    const int stride[3] = {1, 1, 2};
    const sg_activation act[3] = {SG_ACT_RELU, SG_ACT_SILU, SG_ACT_RELU};
    for (int i = 0; i < 3; i++) {
        if (s->recompute) TU_OK(ctx, sg_builder_begin_recompute(b));
        l[n] = block(ctx, b, i + 1, a, width[i], stride[i], act[i], c);
        if (s->recompute) TU_OK(ctx, sg_module_recompute(b, "", l[n], &l[n]));
        n++;
        memcpy(a, c, sizeof c);
    }
    TU_OK(ctx, sg_module_avgpool(b, "avgpool", a[0], a[1], a[2], &l[n++]));
    TU_OK(ctx, sg_module_linear(b, "fc", a[2], s->classes, 1, SG_ACT_NONE, &l[n++]));
    TU_OK(ctx, sg_module_sequential(b, "net", l, n, &root));
    sg_model *m;
    TU_OK(ctx, sg_builder_finish(b, root, SG_LOSS_SOFTMAX_XENT, images(ctx, s), s->seed, &m));
    return m;
}

static sg_status factory(sg_ctx *ctx, void *user, sg_model **out)
{
    *out = mini(ctx, user);
    return *out ? SG_OK : SG_ERR_INVALID;
}

/* One model (made by make on a context of its own) trained `steps` steps under scope: each
 * step's loss, then the parameters and buffers, and the context's peak bytes in use. */
typedef struct run {
    float loss[8];
    float *params, *bufs;
    int64_t np, nb;
    size_t peak;
    unsigned long long allocs; /* device allocations in the last two steps (of 6 or more) */
} run;

static run train(sg_backend be, sg_model *(*make)(sg_ctx *, const void *), const void *arg, sg_scope scope,
                 int steps)
{
    run r = {0};
    sg_ctx *ctx = tu_ctx(be);
    sg_model *m = make(ctx, arg);
    sg_optim *o;
    sg_trainer *t;
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = scope, to.warmup = 1;
    TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
    sg_alloc_stats a0, a1;
    for (int st = 0; st < steps; st++) {
        if (st == steps - 2) TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a0)); /* (static inputs come at step 3) */
        TU_OK(ctx, sg_trainer_step(t, st));
        TU_OK(ctx, sg_model_loss_read(m, &r.loss[st]));
    }
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a1));
    r.allocs = a1.device_allocs - a0.device_allocs;
    r.peak = a1.peak_bytes_in_use;
    r.np = sg_tensor_numel(sg_model_params(m));
    r.params = malloc((size_t)r.np * 4);
    TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(m), r.params, (size_t)r.np * 4));
    sg_tensor *bt = sg_model_buffers(m);
    r.nb = bt ? sg_tensor_numel(bt) : 0;
    r.bufs = malloc((size_t)(r.nb + 1) * 4);
    if (bt) TU_OK(ctx, sg_tensor_copy_to_host(bt, r.bufs, (size_t)r.nb * 4));
    sg_trainer_destroy(t), sg_optim_destroy(o), sg_model_destroy(m);
    sg_ctx_destroy(ctx);
    return r;
}

/* The two runs equal bit for bit; the recomputing one (b) holds less memory at its peak. */
static void same_runs(const char *what, const run *a, const run *b, int steps)
{
    for (int st = 0; st < steps; st++)
        TU_CHECK(!memcmp(&a->loss[st], &b->loss[st], 4), "%s: step %d loss %.9g without recompute, %.9g with", what,
                 st, a->loss[st], b->loss[st]);
    TU_CHECK(a->np == b->np && !memcmp(a->params, b->params, (size_t)a->np * 4), "%s: parameters differ", what);
    TU_CHECK(a->nb == b->nb && !memcmp(a->bufs, b->bufs, (size_t)a->nb * 4),
             "%s: running statistics differ (moved twice by the recomputed forward?)", what);
    TU_CHECK(b->peak < a->peak, "%s: peak %zu bytes with recompute, %zu without", what, b->peak, a->peak);
    TU_CHECK(steps < 6 || b->allocs == 0, "%s: %llu device allocations in the last two steps", what, b->allocs);
    free(a->params), free(a->bufs), free(b->params), free(b->bufs);
}

static sg_model *make_mini(sg_ctx *ctx, const void *arg) { return mini(ctx, arg); }

/* The mini network with and without regions, eager and step scope (the graph's steps are
 * compared with the eager plain run: both equal eager). */
static void mini_matches(sg_backend be, sg_dtype precision)
{
    spec s = draw();
    s.precision = precision;
    enum { STEPS = 6 };
    const sg_scope scopes[2] = {SG_SCOPE_EAGER, SG_SCOPE_STEP};
    for (int k = 0; k < 2; k++) {
        sg_scope sc = scopes[k];
        s.recompute = 0;
        run a = train(be, make_mini, &s, sc, STEPS);
        s.recompute = 1;
        run b = train(be, make_mini, &s, sc, STEPS);
        char what[64];
        snprintf(what, sizeof what, "mini %s %s", sg_dtype_name(precision), sg_scope_name(sc));
        same_runs(what, &a, &b, STEPS);
    }
}

/* Every scope of the recomputing network equals eager bit for bit, graphs replayed. */
static void scopes_match_eager(sg_backend be, sg_dtype precision)
{
    sg_ctx *ctx = tu_ctx(be);
    spec s = draw();
    s.precision = precision, s.recompute = 1;
    for (sg_scope sc = SG_SCOPE_LAYER; sc <= SG_SCOPE_STEP; sc++) {
        sg_verify_options o = sg_verify_options_default();
        o.scope = sc, o.steps = 6;
        sg_verify_result r;
        TU_OK(ctx, sg_verify(ctx, factory, &s, &o, &r));
        TU_CHECK(r.passed && r.steps == 6 && r.replayed == 6 - o.warmup && r.stats.replays > 0,
                 "%s %s: passed %d, %lld steps, %lld replayed, mismatch at %lld: %s", sg_dtype_name(precision),
                 sg_scope_name(sc), r.passed, (long long)r.steps, (long long)r.replayed, (long long)r.mismatch_step,
                 r.mismatch);
    }
    sg_ctx_destroy(ctx);
}

typedef struct builtin {
    const char *name;
    sg_dtype precision;
    float dropout;
    int recompute;
} builtin;

static sg_model *make_builtin(sg_ctx *ctx, const void *arg)
{
    const builtin *w = arg;
    sg_model_options mo = {.precision = w->precision, .dropout = w->dropout, .classes = w->name[0] == 'g' ? 0 : 7,
                           .recompute = w->recompute};
    sg_model *m = NULL;
    TU_OK(ctx, sg_model_create_ex(ctx, w->name, 5, &mo, &m));
    return m;
}

/* --recompute on the built-in models: the same steps as without, less memory. */
static void builtins(sg_backend be)
{
    builtin ws[] = {{"gpt-64-3-4-32", SG_DTYPE_F32, 0.1f, 0}, {"gpt-64-3-4-32", SG_DTYPE_BF16, 0.1f, 0},
                    {"resnet18-2-32", SG_DTYPE_F32, 0, 0}, {"efficientnet_b0-2-32", SG_DTYPE_BF16, 0, 0}};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) {
        int steps = be == SG_BACKEND_CPU && ws[i].name[0] != 'g' ? 3 : 6;
        run a = train(be, make_builtin, &ws[i], SG_SCOPE_EAGER, steps);
        ws[i].recompute = 1;
        run b = train(be, make_builtin, &ws[i], SG_SCOPE_EAGER, steps);
        char what[64];
        snprintf(what, sizeof what, "%s %s", ws[i].name, sg_dtype_name(ws[i].precision));
        same_runs(what, &a, &b, steps);
    }
}

/* A block of one conv made in b (inside or outside a region). */
static sg_module *conv(sg_ctx *ctx, sg_builder *b, const char *name)
{
    sg_module *m;
    TU_OK(ctx, sg_module_conv2d(b, name, 6, 6, 3, 4, 3, 1, 1, 1, 1, &m));
    return m;
}

static sg_builder *builder(sg_ctx *ctx)
{
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = 2;
    sg_builder *b;
    TU_OK(ctx, sg_builder_create(ctx, "refused", &bo, &b));
    return b;
}

static void refusals(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    sg_module *m = NULL, *a, *c;
    sg_builder *b = builder(ctx);
    TU_FAILS(ctx, sg_module_recompute(b, "r", conv(ctx, b, "c"), &m), SG_ERR_INVALID, "no region is open");
    TU_OK(ctx, sg_builder_begin_recompute(b));
    TU_FAILS(ctx, sg_builder_begin_recompute(b), SG_ERR_INVALID, "do not nest");
    a = conv(ctx, b, "a");
    c = conv(ctx, b, "c2");
    TU_FAILS(ctx, sg_module_recompute(b, "r", a, &m), SG_ERR_INVALID, "'c2' was made in the region but");
    sg_builder_destroy(b);

    b = builder(ctx); /* a module from before the region */
    a = conv(ctx, b, "before");
    TU_OK(ctx, sg_builder_begin_recompute(b));
    TU_FAILS(ctx, sg_module_recompute(b, "r", a, &m), SG_ERR_INVALID, "'before' was not made in the open region");
    sg_builder_destroy(b);

    b = builder(ctx); /* left open */
    TU_OK(ctx, sg_builder_begin_recompute(b));
    a = conv(ctx, b, "open");
    TU_FAILS(ctx, sg_builder_finish(b, a, SG_LOSS_SOFTMAX_XENT, images(ctx, &(spec){.B = 2, .n = 2, .H = 6, .W = 6,
                                                                              .Cin = 3, .classes = 2}),
                                    1, &(sg_model *){NULL}),
             SG_ERR_INVALID, "was opened (sg_builder_begin_recompute) and never closed");

    b = builder(ctx); /* a region's module destroyed before the build */
    TU_OK(ctx, sg_builder_begin_recompute(b));
    a = conv(ctx, b, "kept");
    c = conv(ctx, b, "gone");
    sg_module_destroy(c);
    TU_OK(ctx, sg_module_recompute(b, "r", a, &m));
    TU_FAILS(ctx, sg_builder_finish(b, m, SG_LOSS_SOFTMAX_XENT, images(ctx, &(spec){.B = 2, .n = 2, .H = 6, .W = 6,
                                                                              .Cin = 3, .classes = 2}),
                                    1, &(sg_model *){NULL}),
             SG_ERR_INVALID, "was destroyed before the model was built");
    spec s = draw();
    s.recompute = 1;
    tu_trains_a_step(ctx, mini(ctx, &s), "after the refusals");
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    sg_backend be;
    if (!tu_start("test_recompute", argc, argv, &be)) return TU_SKIP;
    /* Runs on two contexts are compared: algorithms chosen by timing (grouped convolutions,
     * STEPGRAPH_DEPTHWISE=auto) may differ between them and change the bits; fixed choices. */
    setenv("STEPGRAPH_CONV_ALGO", "heuristic", 1);
    setenv("STEPGRAPH_DEPTHWISE", "own", 1);
    mini_matches(be, SG_DTYPE_F32);
    mini_matches(be, SG_DTYPE_BF16);
    scopes_match_eager(be, SG_DTYPE_F32);
    scopes_match_eager(be, SG_DTYPE_BF16);
    builtins(be);
    refusals(be);
    return tu_finish("test_recompute");
}
