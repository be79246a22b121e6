/* test_effnet.c: EfficientNet's modules and the built-in efficientnet_b0: squeeze-excitation's
 * input and parameter gradients against finite differences (CPU, fresh random sizes, channels
 * not a multiple of 8); stochastic depth's per-image masks (all of an image dropped or scaled by
 * 1 / (1 - p), fresh after the generator moves, the identity when evaluating); efficientnet_b0-
 * 2-32 under every scope bit for bit against eager through sg_verify, graphs replayed;
 * torchvision's parameter names and counts; and the refusals, after which the context still
 * trains. Modes: cpu, gpu (skipped without a GPU). */
#include "testutil.h"
#include "train/model.h"

/* n images (H, W, C) N(0,1), labels uniform over `classes`. */
static sg_dataset *images(sg_ctx *ctx, int64_t n, int64_t H, int64_t W, int64_t C, int64_t classes)
{
    sg_tensor *tx = tu_tensor(ctx, SG_DTYPE_F32, 4, (int64_t[]){n, H, W, C}, "x");
    sg_tensor *ty = tu_tensor1(ctx, SG_DTYPE_I32, n, "y");
    double *x = malloc((size_t)tx->numel * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < tx->numel; i++) x[i] = tu_normal();
    for (int64_t i = 0; i < n; i++) y[i] = tu_randint(0, (int)classes - 1);
    tu_set(tx, x), tu_set(ty, y);
    free(x), free(y);
    sg_dataset *d;
    TU_OK(ctx, sg_dataset_create(ctx, tx, ty, &d));
    return d;
}

/* The model around a module under test `mid` (made by make()): conv 1x1 "pre" (so that mid's
 * input gradient is needed), mid, average pool, "fc" to 3 classes. */
static sg_model *around(sg_ctx *ctx, int64_t B, int64_t H, int64_t W, int64_t C, float dropout,
                        sg_status (*make)(sg_builder *, const int64_t *, sg_module **), const int64_t *arg,
                        sg_module **mid)
{
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = B, bo.dropout = dropout;
    sg_builder *b;
    TU_OK(ctx, sg_builder_create(ctx, "around", &bo, &b));
    sg_module *l[4], *root;
    TU_OK(ctx, sg_module_conv2d(b, "pre", H, W, C, C, 1, 1, 0, 1, 1, &l[0]));
    TU_OK(ctx, make(b, arg, &l[1]));
    TU_OK(ctx, sg_module_avgpool(b, "pool", H, W, C, &l[2]));
    TU_OK(ctx, sg_module_linear(b, "fc", C, 3, 1, SG_ACT_NONE, &l[3]));
    TU_OK(ctx, sg_module_sequential(b, "net", l, 4, &root));
    sg_model *m;
    TU_OK(ctx, sg_builder_finish(b, root, SG_LOSS_SOFTMAX_XENT, images(ctx, B, H, W, C, 3), tu_next(), &m));
    *mid = l[1];
    return m;
}

/* arg: H, W, C, Csq */
static sg_status make_se(sg_builder *b, const int64_t *a, sg_module **m)
{
    return sg_module_squeeze_excitation(b, "se", a[0], a[1], a[2], a[3], m);
}

/* arg: H, W, C, p in millionths */
static sg_status make_sd(sg_builder *b, const int64_t *a, sg_module **m)
{
    return sg_module_stochastic_depth(b, "sd", a[0], a[1], a[2], (float)(a[3] * 1e-6), m);
}

static int64_t draw_channels(void)
{
    int64_t C = tu_randint(1, 21);
    return C % 8 ? C : C + 1;
}

/* Squeeze-excitation's input gradient (6 random elements) and each parameter's (3 random
 * elements apiece) against finite differences of L = sum(c * y), c U(-1, 1), driving the module
 * alone on the CPU. Central differences at 2h and h (h = 1e-2) combined by Richardson
 * extrapolation cancel the h^2 term: the truncation left is O(h^4) times fifth derivatives of
 * O(1) (sigmoid and SiLU of O(1) values): ~1e-8. The noise is f32 rounding in L: up to
 * N = B H W C <= 4 x 6 x 6 x 21 = 3024 terms, each y rounded to ~6e-8 |y| (|y| <~ 3) and the
 * gate's intermediates alike, a random walk of ~sqrt(N) 6e-8 x 3 ~ 1e-5 in L, over 2h with the
 * extrapolation's 4/3: ~7e-4 at the very worst (measured up to 1.9e-4 over 2000 seeds):
 * tolerance 1e-3 + 1e-3 |g|. Dropping the gate's path to dx (the average pool's backward) fails
 * every seed tried, as would a transposed weight or a wrong derivative: they are off by O(|g|),
 * and a third of the gradients checked are above 1e-2 (asserted; over 2000 seeds at least 7 of
 * 18 were). */
static void se_gradients(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    int64_t B = tu_randint(1, 4), H = tu_randint(1, 6), W = tu_randint(1, 6), C = draw_channels();
    int64_t Csq = tu_randint(1, (int)(C > 3 ? C / 2 : 1)), arg[4] = {H, W, C, Csq};
    sg_module *se;
    sg_model *m = around(ctx, B, H, W, C, 0, make_se, arg, &se);
    TU_CHECK(sg_module_needs_input_grad(se), "the SE after 'pre' needs no input gradient");
    sg_tensor *x = tu_tensor(ctx, SG_DTYPE_F32, 4, (int64_t[]){B, H, W, C}, "se.x");
    sg_tensor *dy = tu_tensor(ctx, SG_DTYPE_F32, 4, (int64_t[]){B, H, W, C}, "se.dy");
    int64_t n = x->numel, np = sg_tensor_numel(sg_model_params(m));
    double *xv = malloc((size_t)n * sizeof *xv), *c = malloc((size_t)n * sizeof *c);
    for (int64_t i = 0; i < n; i++) xv[i] = (float)(1.5 * tu_normal()), c[i] = tu_uniform(-1, 1);
    float *p = malloc((size_t)np * 4);
    TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(m), p, (size_t)np * 4));
    const sg_tensor *y = NULL;
#define LOSS(res)                                                                                   \
    do {                                                                                           \
        TU_OK(ctx, sg_tensor_copy_from_host(sg_model_params(m), p, (size_t)np * 4));               \
        tu_set(x, xv);                                                                             \
        TU_OK(ctx, sg_module_forward(se, x, &y));                                                  \
        double *yv_ = tu_get(y), l_ = 0;                                                           \
        for (int64_t i_ = 0; i_ < n; i_++) l_ += c[i_] * yv_[i_];                                  \
        free(yv_);                                                                                 \
        res = l_;                                                                                  \
    } while (0)
    double l0;
    LOSS(l0);
    TU_CHECK(isfinite(l0), "L = %g", l0);
    tu_set(dy, c);
    TU_OK(ctx, sg_tensor_fill(sg_model_grads(m), 0.0));
    sg_tensor *dx = NULL;
    TU_OK(ctx, sg_module_backward(se, dy, &dx));
    TU_CHECK(dx != NULL, "no input gradient");
    if (!dx) exit(1);
    double *dxv = tu_get(dx);
    float *g = malloc((size_t)np * 4);
    TU_OK(ctx, sg_tensor_copy_to_host(sg_model_grads(m), g, (size_t)np * 4));
    const double h = 1e-2;
    int checked = 0, big = 0;
    double worst = 0;
    /* target: -1 the input x, else parameter tensor i (only "se." ones) */
    for (int i = -1; i < sg_model_param_tensors(m); i++) {
        const char *nm = "x";
        int64_t off = 0, cnt = n;
        if (i >= 0) {
            TU_OK(ctx, sg_model_param_info(m, i, &nm, &off, &cnt));
            if (strncmp(nm, "se.", 3)) continue;
        }
        for (int k = 0; k < (i < 0 ? 6 : 3); k++) {
            int64_t j = tu_randint(0, (int)cnt - 1);
            double keep = i < 0 ? xv[j] : p[off + j], fdh[2];
            for (int r = 0; r < 2; r++) { /* at 2h and h */
                double lp, lm, hh = h * (2 - r);
                /* x and the parameters are stored in f32: the step taken is their rounding's */
                float up = (float)(keep + hh), down = (float)(keep - hh);
                if (i < 0) xv[j] = up;
                else p[off + j] = up;
                LOSS(lp);
                if (i < 0) xv[j] = down;
                else p[off + j] = down;
                LOSS(lm);
                if (i < 0) xv[j] = keep;
                else p[off + j] = (float)keep;
                double step = (double)up - (double)down;
                fdh[r] = (lp - lm) / step;
            }
            double fd = (4 * fdh[1] - fdh[0]) / 3; /* Richardson: the h^2 term cancels */
            double got = i < 0 ? dxv[j] : g[off + j];
            checked++, big += fabs(fd) > 1e-2;
            if (fabs(fd - got) > worst) worst = fabs(fd - got);
            TU_CHECK(fabs(fd - got) <= 1e-3 + 1e-3 * fabs(fd), "%s[%lld] (B %lld, H %lld, W %lld, C %lld, Csq %lld): "
                     "gradient %.7g, finite differences %.7g", nm, (long long)j, (long long)B, (long long)H,
                     (long long)W, (long long)C, (long long)Csq, got, fd);
        }
    }
#undef LOSS
    TU_CHECK(checked == 6 + 4 * 3, "%d gradients checked, expected 18 (the input's and 4 parameters')", checked);
    TU_CHECK(big >= checked / 3, "only %d of %d gradients above 1e-2", big, checked);
    if (getenv("SG_TEST_VERBOSE")) printf("se_gradients: worst |fd - g| %.3g, %d of %d above 1e-2\n", worst, big, checked);
    free(xv), free(c), free(p), free(g), free(dxv);
    sg_tensor_destroy(x), sg_tensor_destroy(dy);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
}

/* Stochastic depth drops whole images: each row of y is 0 or x / (1 - p) (its factor rounded
 * to f32 once, as the dropout op rounds it), the backward applies the same factors to dy; the
 * generator moved (sg_rng_advance, as the trainer does each step) draws other masks; evaluating
 * passes x through. */
static void stochastic_depth(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    int64_t B = tu_randint(12, 20), H = tu_randint(1, 4), W = tu_randint(1, 4), C = draw_channels();
    float p = (float)tu_uniform(0.2, 0.6);
    int64_t arg[4] = {H, W, C, (int64_t)(p * 1e6)};
    p = (float)(arg[3] * 1e-6);
    sg_module *sd;
    sg_model *m = around(ctx, B, H, W, C, 0.1f, make_sd, arg, &sd);
    sg_tensor *x = tu_tensor(ctx, SG_DTYPE_F32, 4, (int64_t[]){B, H, W, C}, "sd.x");
    sg_tensor *dy = tu_tensor(ctx, SG_DTYPE_F32, 4, (int64_t[]){B, H, W, C}, "sd.dy");
    free(tu_random(x, 0.5, 1.5)), free(tu_random(dy, 0.5, 1.5));
    double *xv = tu_get(x), *dyv = tu_get(dy); /* as stored: f32 */
    int64_t row = H * W * C;
    float k = (float)(1.0 / (1.0 - (double)p));
    int kept[2] = {0, 0}, changed = 0, prev[32];
    for (int draw = 0; draw < 4; draw++) {
        const sg_tensor *y = NULL;
        sg_tensor *dx = NULL;
        TU_OK(ctx, sg_module_forward(sd, x, &y));
        TU_OK(ctx, sg_module_backward(sd, dy, &dx));
        double *yv = tu_get(y), *dxv = tu_get(dx);
        for (int64_t r = 0; r < B; r++) {
            int keep = yv[r * row] != 0;
            kept[keep]++;
            if (draw) changed += keep != prev[r];
            prev[r] = keep;
            for (int64_t e = r * row; e < (r + 1) * row; e++) {
                float wy = keep ? (float)(xv[e] * k) : 0.f, wd = keep ? (float)(dyv[e] * k) : 0.f;
                TU_CHECK(yv[e] == wy && dxv[e] == wd, "row %lld element %lld: y %.9g dx %.9g, expected %.9g and "
                         "%.9g (p %g)", (long long)r, (long long)(e - r * row), yv[e], dxv[e], wy, wd, (double)p);
            }
        }
        free(yv), free(dxv);
        TU_OK(ctx, sg_rng_advance(ctx, m->rng));
    }
    /* 4 draws of 12..20 rows with p in 0.2..0.6: no row kept or none dropped, or the same masks
     * four times, with probability below 1e-6. */
    TU_CHECK(kept[0] > 0 && kept[1] > 0 && changed > 0, "%d rows dropped, %d kept, %d changed between draws",
             kept[0], kept[1], changed);
    sg_model_set_eval(m, true);
    const sg_tensor *y = NULL;
    TU_OK(ctx, sg_module_forward(sd, x, &y));
    TU_CHECK(y == x, "evaluating: stochastic depth is not the identity");
    sg_model_set_eval(m, false);
    free(xv), free(dyv);
    sg_tensor_destroy(x), sg_tensor_destroy(dy);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
}

typedef struct b0_args {
    uint64_t seed;
    sg_dtype precision;
} b0_args;

static sg_status b0_factory(sg_ctx *ctx, void *user, sg_model **out)
{
    const b0_args *a = user;
    sg_model_options o = {0};
    o.classes = 10, o.precision = a->precision;
    return sg_model_create_ex(ctx, "efficientnet_b0-2-32", a->seed, &o, out);
}

/* Every scope equals eager bit for bit (loss, gradients, parameters, running statistics; bf16:
 * the loss scaler too), the two dropouts drawing alike, with graphs replayed. */
static void scopes_match_eager(sg_backend be, sg_dtype precision)
{
    sg_ctx *ctx = tu_ctx(be);
    b0_args seed = {tu_next(), precision};
    for (sg_scope sc = SG_SCOPE_EAGER; sc <= SG_SCOPE_STEP; sc++) {
        sg_verify_options o = sg_verify_options_default();
        o.scope = sc, o.steps = 6;
        sg_verify_result r;
        TU_OK(ctx, sg_verify(ctx, b0_factory, &seed, &o, &r));
        TU_CHECK(r.passed && r.steps == 6, "%s %s: passed %d, %lld steps, mismatch at %lld: %s",
                 sg_dtype_name(precision), sg_scope_name(sc), r.passed, (long long)r.steps, (long long)r.mismatch_step, r.mismatch);
        TU_CHECK(sc == SG_SCOPE_EAGER || (r.replayed == 6 - o.warmup && r.stats.replays > 0),
                 "%s: %lld steps replayed, %llu replays", sg_scope_name(sc), (long long)r.replayed,
                 (unsigned long long)r.stats.replays);
    }
    sg_ctx_destroy(ctx);
}

static bool named(sg_model *m, bool buffers, const char *want, int64_t numel)
{
    int n = buffers ? sg_model_buffer_tensors(m) : sg_model_param_tensors(m);
    for (int i = 0; i < n; i++) {
        const char *nm = NULL;
        int64_t cnt = 0;
        if (buffers) sg_model_buffer_info(m, i, &nm, NULL, &cnt);
        else sg_model_param_info(m, i, &nm, NULL, &cnt);
        if (nm && !strcmp(nm, want)) return numel == 0 || cnt == numel;
    }
    return false;
}

/* torchvision's names and counts. efficientnet_b0 has 5,288,548 parameters at 1000 classes
 * (torchvision's documented num_params; by hand: stem 3x3x3x32 + BN 64; per block expand
 * in x 6in + BN, depthwise 6in k k + BN, SE 2 x 6in sq + sq + 6in, project 6in out + BN; head
 * 320 x 1280 + BN 2560: 4,007,548 without the classifier, which adds 1281 classes), so
 * 4,020,358 at 10 classes; sg_model_estimate counts the same. 49 BNs: 98 buffers. */
static void names_and_counts(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    static const struct {
        int64_t classes, params;
    } want[] = {{1000, 5288548}, {10, 4020358}};
    for (int w = 0; w < 2; w++) {
        sg_model_options o = {0};
        o.classes = want[w].classes;
        sg_model *m;
        TU_OK(ctx, sg_model_create_ex(ctx, "efficientnet_b0-1-32", tu_next(), &o, &m));
        int64_t total = 0;
        for (int i = 0; i < sg_model_param_tensors(m); i++) {
            int64_t n = 0;
            TU_OK(ctx, sg_model_param_info(m, i, NULL, NULL, &n));
            total += n;
        }
        TU_CHECK(total == want[w].params && sg_model_param_count(m) == want[w].params,
                 "%lld classes: %lld parameters (sg_model_param_count %lld), torchvision has %lld",
                 (long long)want[w].classes, (long long)total, (long long)sg_model_param_count(m),
                 (long long)want[w].params);
        sg_model_size z;
        TU_OK(ctx, sg_model_estimate("efficientnet_b0-1-32", &o, &z));
        TU_CHECK(z.params == want[w].params, "estimate: %lld parameters, expected %lld", (long long)z.params,
                 (long long)want[w].params);
        const struct {
            const char *name;
            int64_t numel;
        } params[] = {{"features.0.0.weight", 32 * 3 * 3 * 3}, {"features.0.1.weight", 32},
                      {"features.1.0.block.0.0.weight", 32 * 3 * 3}, {"features.1.0.block.1.fc1.weight", 8 * 32},
                      {"features.1.0.block.1.fc2.bias", 32}, {"features.1.0.block.2.0.weight", 16 * 32},
                      {"features.2.0.block.0.0.weight", 96 * 16}, {"features.2.0.block.1.0.weight", 96 * 3 * 3},
                      {"features.2.0.block.2.fc1.weight", 4 * 96}, {"features.2.1.block.2.fc1.bias", 6},
                      {"features.3.0.block.1.0.weight", 144 * 5 * 5}, {"features.6.3.block.3.1.bias", 192},
                      {"features.7.0.block.3.0.weight", 320 * 1152}, {"features.8.0.weight", 1280 * 320},
                      {"features.8.1.bias", 1280}, {"classifier.1.weight", 1280 * want[w].classes},
                      {"classifier.1.bias", want[w].classes}};
        for (size_t i = 0; i < sizeof params / sizeof *params; i++)
            TU_CHECK(named(m, false, params[i].name, params[i].numel), "no parameter '%s' of %lld elements",
                     params[i].name, (long long)params[i].numel);
        static const char *const bufs[] = {"features.0.1.running_mean", "features.1.0.block.0.1.running_var",
                                           "features.5.2.block.3.1.running_mean", "features.8.1.running_var"};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            TU_CHECK(named(m, true, bufs[i], 0), "no buffer '%s'", bufs[i]);
        TU_CHECK(sg_model_buffer_tensors(m) == 2 * 49, "%d buffers, expected 98 (49 batch norms)",
                 sg_model_buffer_tensors(m));
        sg_model_destroy(m);
    }
    sg_ctx_destroy(ctx);
}

/* Bad arguments are refused, named, and the context trains afterwards. */
static void refusals(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = 2;
    sg_builder *b;
    sg_module *m = NULL;
    TU_OK(ctx, sg_builder_create(ctx, "bad", &bo, &b));
    TU_FAILS(ctx, sg_module_squeeze_excitation(b, "se", 4, 4, 8, 0, &m), SG_ERR_SHAPE, "Csq 0");
    TU_FAILS(ctx, sg_module_stochastic_depth(b, "sd", 4, 4, 8, 1.f, &m), SG_ERR_INVALID, "0 <= p < 1");
    TU_FAILS(ctx, sg_module_stochastic_depth(b, "sd", 4, 4, 8, 0.1f, &m), SG_ERR_INVALID,
             "needs the builder's dropout above 0");
    TU_OK(ctx, sg_module_squeeze_excitation(b, "se", 4, 4, 8, 2, &m));
    sg_tensor *x = tu_tensor(ctx, SG_DTYPE_F32, 4, (int64_t[]){2, 4, 4, 5}, "x5");
    TU_OK(ctx, sg_tensor_fill(x, 0.5));
    const sg_tensor *y = NULL;
    TU_FAILS(ctx, sg_module_forward(m, x, &y), SG_ERR_SHAPE, "'x5' is (2, 4, 4, 5)");
    sg_tensor_destroy(x);
    sg_builder_destroy(b);
    sg_model_options o = {0};
    sg_model *mm = NULL;
    o.dropout = 0.3f;
    TU_FAILS(ctx, sg_model_create_ex(ctx, "efficientnet_b0-2-32", 1, &o, &mm), SG_ERR_INVALID, "dropout");
    TU_FAILS(ctx, sg_model_create(ctx, "efficientnet_b0-2-0", 1, &mm), SG_ERR_INVALID, "efficientnet_b0-BATCH-R");
    /* Still usable: efficientnet_b0 at 1 x 1 pixels (torchvision's minimum) trains a step. */
    o.dropout = 0, o.classes = 5;
    TU_OK(ctx, sg_model_create_ex(ctx, "efficientnet_b0-2-1", tu_next(), &o, &mm));
    tu_trains_a_step(ctx, mm, "after the refusals");
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    tu_seed("test_effnet");
    bool gpu = argc > 1 && !strcmp(argv[1], "gpu");
    sg_backend be = gpu ? SG_BACKEND_CUDA : SG_BACKEND_CPU;
    if (gpu && !sg_cuda_available()) return TU_SKIP;
    stochastic_depth(be);
    scopes_match_eager(be, SG_DTYPE_F32);
    scopes_match_eager(be, SG_DTYPE_BF16);
    refusals(be);
    if (!gpu) se_gradients(), names_and_counts();
    return tu_finish("test_effnet");
}
