/* test_scopes.c: training under every capture scope reproduces eager training bit for bit
 * (our kernels are deterministic and the graphs run the same kernels in the same order), with
 * a warm-up + cosine lr schedule set on the device between replays (no re-capture), and
 * falls back to eager with a reason when capture fails; capture needs no memory beyond the
 * static buffers (sg_trainer_stats's breakdown: the graphs' pool stays empty). `cpu`:
 * mlp-64-2-32 on the CPU backend (graphs are plans); `gpu`: mlp-512-6-32 on CUDA over 50 steps. */
#include "testutil.h"
#include "train/model.h"

typedef struct side {
    sg_model *m;
    sg_optim *o;
    sg_trainer *t;
} side;

static side make(sg_ctx *ctx, const char *name, uint64_t seed, sg_trainer_options *to)
{
    side s = {0};
    TU_OK(ctx, sg_model_create(ctx, name, seed, &s.m));
    TU_OK(ctx, sg_optim_create(ctx, s.m, SG_OPTIM_ADAMW, &s.o));
    TU_OK(ctx, sg_trainer_create(s.m, s.o, to, &s.t));
    return s;
}

static void drop(side *s)
{
    sg_trainer_destroy(s->t);
    sg_optim_destroy(s->o);
    sg_model_destroy(s->m);
}


/* Eager and `scope` side by side for `steps` steps; schedule: lr set every step. */
static void against_eager(sg_backend be, const char *name, sg_scope scope, int steps, bool schedule,
                          const char *modules)
{
    sg_ctx *ctx = tu_ctx(be);
    uint64_t seed = tu_next();
    sg_trainer_options eo = sg_trainer_options_default(), go = sg_trainer_options_default();
    go.scope = scope;
    go.graph_modules = modules;
    side e = make(ctx, name, seed, &eo), g = make(ctx, name, seed, &go);
    bool ok = true;
    for (int s = 0; s < steps && ok; s++) {
        if (schedule) {
            float lr = sg_lr_warmup_cosine(s, steps / 5, steps, 3e-3f, 1e-4f);
            TU_OK(ctx, sg_optim_set_lr(e.o, lr));
            TU_OK(ctx, sg_optim_set_lr(g.o, lr));
        }
        TU_OK(ctx, sg_trainer_step(e.t, s));
        TU_OK(ctx, sg_trainer_step(g.t, s));
        ok = tu_same_bits(sg_model_loss(e.m), sg_model_loss(g.m), "loss", s + 1) &&
             tu_same_bits(sg_model_grads(e.m), sg_model_grads(g.m), "gradients", s + 1) &&
             /* bf16: what the backward wrote (the f32 ones are not written when the optimizer
              * unscales as it reads) */
             (!sg_model_grads_lo(e.m) ||
              tu_same_bits(sg_model_grads_lo(e.m), sg_model_grads_lo(g.m), "bf16 gradients", s + 1)) &&
             tu_same_bits(sg_model_params(e.m), sg_model_params(g.m), "parameters", s + 1);
    }
    sg_trainer_stats ts;
    TU_OK(ctx, sg_trainer_get_stats(g.t, &ts));
    int want = scope == SG_SCOPE_STEP ? 1 : scope == SG_SCOPE_MODEL ? 2 : 0;
    if (want) TU_CHECK(ts.graphs == want, "%s scope holds %d graphs, expected %d", sg_scope_name(scope), ts.graphs, want);
    else TU_CHECK(ts.graphs >= 2 && ts.graphs % 2 == 0, "layer scope holds %d graphs", ts.graphs);
    /* Every graph was captured once and replayed every step after warm-up: no re-capture, even
     * with the lr changing every step. */
    uint64_t per_step = scope == SG_SCOPE_STEP ? 1 : (uint64_t)ts.graphs / (scope == SG_SCOPE_MODEL ? 2 : 2);
    if (scope != SG_SCOPE_LAYER)
        TU_CHECK(ts.replays == per_step * (uint64_t)(steps - 3) * (scope == SG_SCOPE_MODEL ? 2 : 1),
                 "%llu replays", (unsigned long long)ts.replays);
    TU_CHECK(!ts.fell_back, "fell back: %s", ts.fallback_reason);
    /* Memory: the static buffers hold at least their tensors' bytes and no more than the context
     * holds; capture needed nothing beyond them, so the graphs' pool stayed empty. */
    size_t p4 = 4 * (size_t)sg_model_param_count(g.m);
    size_t statics = ts.param_bytes + ts.grad_bytes + ts.optim_bytes + ts.data_bytes + ts.activation_bytes;
    sg_alloc_stats as;
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &as));
    TU_CHECK(ts.param_bytes >= p4 && ts.grad_bytes >= p4 && ts.optim_bytes >= 2 * p4 && ts.data_bytes > 0 &&
             ts.activation_bytes > 0 && statics <= as.bytes_in_use,
             "memory: params %zu, grads %zu, optim %zu, data %zu, activations %zu (%zu parameter bytes, %zu in use)",
             ts.param_bytes, ts.grad_bytes, ts.optim_bytes, ts.data_bytes, ts.activation_bytes, p4, as.bytes_in_use);
    TU_CHECK(ts.graph_pool.bytes_reserved == 0 && ts.graph_pool.device_allocs == 0,
             "the graphs' pool reserved %zu bytes in %llu allocations", ts.graph_pool.bytes_reserved,
             (unsigned long long)ts.graph_pool.device_allocs);
    printf("%s scope on %s: %d steps bit-exact with eager%s; %d graphs, %d nodes, %llu replays\n",
           sg_scope_name(scope), name, steps, schedule ? " under a warm-up + cosine lr schedule" : "",
           ts.graphs, ts.nodes, (unsigned long long)ts.replays);
    drop(&g), drop(&e);
    sg_ctx_destroy(ctx);
}

/* Varying batch: step scope with a graph per bucket against eager on the same padded batches,
 * bit for bit; and the padding must not change the result: a step on n rows padded to its
 * bucket equals a step of a model whose batch is exactly n (loss compared). */
static void vary_batch(sg_backend be, const char *name, int steps)
{
    sg_ctx *ctx = tu_ctx(be);
    uint64_t seed = tu_next();
    int64_t buckets[] = {8, 16, 32};
    sg_trainer_options eo = sg_trainer_options_default(), go = sg_trainer_options_default();
    eo.batch_buckets = go.batch_buckets = buckets;
    eo.n_buckets = go.n_buckets = 3;
    go.scope = SG_SCOPE_STEP;
    side e = make(ctx, name, seed, &eo), g = make(ctx, name, seed, &go);
    bool ok = true;
    for (int s = 0; s < steps && ok; s++) {
        int64_t rows = tu_randint(1, 32);
        TU_OK(ctx, sg_trainer_step_rows(e.t, s, rows));
        TU_OK(ctx, sg_trainer_step_rows(g.t, s, rows));
        ok = tu_same_bits(sg_model_loss(e.m), sg_model_loss(g.m), "loss (varying batch)", s + 1) &&
             tu_same_bits(sg_model_params(e.m), sg_model_params(g.m), "parameters (varying batch)", s + 1);
    }
    sg_trainer_stats ts;
    TU_OK(ctx, sg_trainer_get_stats(g.t, &ts));
    TU_CHECK(ts.cache.captures >= 1 && ts.cache.captures <= 3 && ts.cache.evictions == 0,
             "%llu captures, %llu evictions", (unsigned long long)ts.cache.captures,
             (unsigned long long)ts.cache.evictions);
    printf("varying batch on %s: %d steps bit-exact with eager; %llu graphs for 3 buckets, %llu hits\n", name,
           steps, (unsigned long long)ts.cache.captures, (unsigned long long)ts.cache.hits);
    TU_FAILS(ctx, sg_trainer_step_rows(g.t, 0, 33), SG_ERR_SHAPE, "33 rows");
    drop(&g), drop(&e);

    /* Padding is masked: 13 rows padded to 16 give the loss of exactly those 13 rows. */
    char exact[64];
    snprintf(exact, sizeof exact, "%.*s-13", (int)(strrchr(name, '-') - name), name);
    side p = make(ctx, name, seed, &eo);
    sg_model *x;
    TU_OK(ctx, sg_model_create(ctx, exact, seed, &x));
    /* Same teacher, but batch 0 of the 13-row model holds the first 13 rows of batch 0. */
    TU_OK(ctx, sg_tensor_copy(sg_model_params(x), sg_model_params(p.m)));
    sg_tensor *xin = x->x_view, *pin = p.m->x_view;
    void *keep = xin->data;
    xin->data = pin->data; /* point the small model at the big one's first rows */
    sg_tensor *xt = x->t_view;
    void *keep_t = xt->data;
    xt->data = p.m->t_view->data;
    TU_OK(ctx, sg_model_forward(x));
    xin->data = keep, xt->data = keep_t;
    TU_OK(ctx, sg_trainer_step_rows(p.t, 0, 13));
    float la, lb;
    TU_OK(ctx, sg_model_loss_read(x, &la));
    TU_OK(ctx, sg_model_loss_read(p.m, &lb));
    double da = la, db = lb;
    tu_close("loss of 13 rows padded to 16 vs exactly 13 rows", &db, &da, 1, (tu_tol){1e-6, 1e-5});
    sg_model_destroy(x);
    drop(&p);
    sg_ctx_destroy(ctx);
}

/* A step graph of K consecutive steps (one launch for K steps) against eager one at a time. */
static void multi_step_graph(sg_backend be, const char *name, int calls, int K)
{
    sg_ctx *ctx = tu_ctx(be);
    uint64_t seed = tu_next();
    sg_trainer_options eo = sg_trainer_options_default(), go = sg_trainer_options_default();
    go.scope = SG_SCOPE_STEP;
    go.steps_per_call = K;
    side e = make(ctx, name, seed, &eo), g = make(ctx, name, seed, &go);
    bool ok = true;
    uint64_t launches = 0;
    for (int c = 0; c < calls && ok; c++) {
        for (int k = 0; k < K; k++) TU_OK(ctx, sg_trainer_step(e.t, (int64_t)c * K + k));
        uint64_t l0 = sg_ctx_launch_count(ctx);
        TU_OK(ctx, sg_trainer_step(g.t, (int64_t)c * K));
        if (c == calls - 1) launches = sg_ctx_launch_count(ctx) - l0;
        ok = tu_same_bits(sg_model_loss(e.m), sg_model_loss(g.m), "loss (K-step graph)", (c + 1) * K) &&
             tu_same_bits(sg_model_params(e.m), sg_model_params(g.m), "parameters (K-step graph)", (c + 1) * K);
    }
    if (be == SG_BACKEND_CUDA) TU_CHECK(launches == 1, "a replay of %d steps made %llu launches", K, (unsigned long long)launches);
    printf("step graph of %d steps on %s: %d calls bit-exact with eager\n", K, name, calls);
    drop(&g), drop(&e);
    sg_ctx_destroy(ctx);
}

static void bad_options(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    sg_model *m;
    sg_optim *o;
    sg_trainer *t = NULL;
    tu_model_optim(ctx, "mlp-16-2-4", &m, &o);
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = SG_SCOPE_LAYER;
    to.graph_modules = "layers.9";
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "names no module");
    TU_CHECK(t == NULL, "trainer set on failure");
    /* A list is taken strictly: one unknown item, an empty item or a module named twice (by
     * name and by index) is refused, naming it, where it used to be ignored. */
    to.graph_modules = "layers.0,layers.9";
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "'layers.9' names no module");
    to.graph_modules = "layers.0,,1";
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "empty item");
    to.graph_modules = "layers.0,layers.1,0";
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "names module 0 (layers.0) twice");
    TU_CHECK(t == NULL, "trainer set on failure");
    to.scope = (sg_scope)7;
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "scope 7");
    /* Layer scope on two chosen modules, by name and by index, trains. */
    to.scope = SG_SCOPE_LAYER;
    to.graph_modules = "layers.0,2";
    TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
    for (int s = 0; s < 6; s++) TU_OK(ctx, sg_trainer_step(t, s));
    sg_trainer_stats ts;
    TU_OK(ctx, sg_trainer_get_stats(t, &ts));
    TU_CHECK(ts.graphs == 4, "two graphed modules hold %d graphs, expected 4", ts.graphs);
    sg_trainer_destroy(t);
    sg_scope sc;
    TU_CHECK(sg_scope_parse("model", &sc) == SG_OK && sc == SG_SCOPE_MODEL, "parse model");
    TU_CHECK(sg_scope_parse("graph", &sc) != SG_OK, "parse of an unknown scope succeeded");
    sg_optim_destroy(o);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
}

/* On CUDA, warm-up 0 captures the first step, whose lazy set-up (the loss kernel's scratch)
 * allocates device memory: the capture fails. With on_capture_fail = eager the trainer says
 * why and trains on, eagerly, with the same results as eager; with error the step fails and
 * the context keeps working. */
static void gpu_fallback(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CUDA);
    uint64_t seed = tu_next();
    sg_trainer_options eo = sg_trainer_options_default(), go = sg_trainer_options_default();
    go.scope = SG_SCOPE_STEP;
    go.warmup = 0;
    go.on_capture_fail = SG_CAPTURE_FAIL_ERROR;
    side f = make(ctx, "mlp-64-2-32", seed, &go);
    TU_FAILS(ctx, sg_trainer_step(f.t, 0), SG_ERR_CAPTURE, "new device memory");
    drop(&f);
    /* A fresh context (the failed one already allocated its scratch while warming nothing). */
    sg_ctx_destroy(ctx);
    ctx = tu_ctx(SG_BACKEND_CUDA);
    go.on_capture_fail = SG_CAPTURE_FAIL_EAGER;
    side e = make(ctx, "mlp-64-2-32", seed, &eo), g = make(ctx, "mlp-64-2-32", seed, &go);
    for (int s = 0; s < 10; s++) {
        TU_OK(ctx, sg_trainer_step(g.t, s));
        TU_OK(ctx, sg_trainer_step(e.t, s));
    }
    tu_same_bits(sg_model_params(e.m), sg_model_params(g.m), "parameters (fallback)", 10);
    sg_trainer_stats ts;
    TU_OK(ctx, sg_trainer_get_stats(g.t, &ts));
    TU_CHECK(ts.fell_back && strstr(ts.fallback_reason, "step runs eagerly") &&
                 strstr(ts.fallback_reason, "new device memory"),
             "fallback reason: '%s'", ts.fallback_reason);
    printf("fallback: %s\n", ts.fallback_reason);
    drop(&g), drop(&e);
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_scopes");
    bool gpu = !strcmp(mode, "gpu");
    sg_backend be = gpu ? SG_BACKEND_CUDA : SG_BACKEND_CPU;
    const char *name = gpu ? "mlp-512-6-32" : "mlp-64-2-32";
    int steps = gpu ? 50 : 20;
    /* SG_TEST_MODEL: a smaller run for the sanitizers, which slow cuBLAS down 100x. */
    if (getenv("SG_TEST_MODEL")) name = getenv("SG_TEST_MODEL"), steps = 10;
    if (gpu) tu_ctx(be); /* skips (77) without a GPU, before any work */
    for (int sc = SG_SCOPE_LAYER; sc <= SG_SCOPE_STEP; sc++) against_eager(be, name, (sg_scope)sc, steps, false, NULL);
    against_eager(be, name, SG_SCOPE_STEP, steps, true, NULL);
    against_eager(be, name, SG_SCOPE_LAYER, steps, true, "1,layers.2");
    vary_batch(be, name, steps);
    multi_step_graph(be, name, 8, 4);
    bad_options(be);
    if (gpu) gpu_fallback();
    return tu_finish("test_scopes");
}
