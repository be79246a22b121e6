/* test_loss.c: softmax cross-entropy and MSE. `cpu`: float64 finite-difference checks of
 * dlogits and dx on the reference, the loss against a naive formula written here, and the
 * argument errors; bf16 logits (f32 loss) against the f64 reference, and mixed dtypes.
 * `gpu`: the CUDA kernels against the CPU reference on fresh random inputs (vocabulary-sized
 * rows, masked rows, N-D logits, in place), outputs poisoned first, f32 and bf16 logits;
 * bitwise determinism; one launch per call; the scratch counter left at 0 between calls.
 * Both: sg_softmax_xent_scaled (the loss scale read from a scaler tensor): dlogits exactly
 * scale times the unscaled ones, the loss unscaled, the scaler untouched, scaler NULL the same
 * as sg_softmax_xent, its argument errors; on the GPU also against the CPU reference. */
#include "testutil.h"

/* ---- shared helpers ---- */

/* Random targets in 0..C-1, about one row in `mask_every` masked (negative: -1 or -100). */
static double *random_targets(int64_t M, int64_t C, int mask_every)
{
    double *t = malloc((size_t)M * sizeof *t);
    for (int64_t r = 0; r < M; r++) {
        t[r] = tu_randint(0, (int)C - 1);
        if (mask_every > 0 && tu_randint(1, mask_every) == 1) t[r] = tu_randint(0, 1) ? -1 : -100;
    }
    return t;
}

/* mean over rows with t >= 0 of log(sum_j exp(x_j)) - x_t, without the max trick (inputs are
 * small), so it shares no code path with the reference. */
static double naive_xent(const double *x, const double *t, int64_t M, int64_t C)
{
    double sum = 0;
    int64_t count = 0;
    for (int64_t r = 0; r < M; r++) {
        if (t[r] < 0) continue;
        double se = 0;
        for (int64_t j = 0; j < C; j++) se += exp(x[r * C + j]);
        sum += log(se) - x[r * C + (int64_t)t[r]];
        count++;
    }
    return count ? sum / count : 0;
}

static double naive_mse(const double *x, const double *t, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (x[i] - t[i]) * (x[i] - t[i]);
    return s / n;
}

static int64_t count_unmasked(const double *t, int64_t M)
{
    int64_t c = 0;
    for (int64_t r = 0; r < M; r++) c += t[r] >= 0;
    return c;
}

static double read_scalar(const sg_tensor *t)
{
    double *v = tu_get(t);
    double x = v[0];
    free(v);
    return x;
}

/* ---- cpu: finite differences, naive loss, errors ---- */

typedef struct {
    sg_ctx *ctx;
    int op; /* 0 xent, 1 mse */
    sg_tensor *x, *t, *loss;
    float gs;
} loss_case;

/* grad_scale * loss: the function whose gradient dlogits (dx) is. */
static double case_loss(void *u)
{
    loss_case *c = u;
    if (c->op == 0)
        TU_OK(c->ctx, sg_softmax_xent(c->ctx, c->x, c->t, c->gs, c->loss, NULL));
    else
        TU_OK(c->ctx, sg_mse(c->ctx, c->x, c->t, c->gs, c->loss, NULL));
    return c->gs * sg_ld(c->loss, 0);
}

/* logits of shape `shape` (last dim C), targets of the leading dims, f64. */
static void cpu_xent_gradcheck(sg_ctx *ctx, int ndim, const int64_t *shape)
{
    int64_t C = shape[ndim - 1], M = 1;
    for (int i = 0; i < ndim - 1; i++) M *= shape[i];
    sg_tensor *x = tu_tensor(ctx, SG_DTYPE_F64, ndim, shape, "logits");
    sg_tensor *t = ndim > 1 ? tu_tensor(ctx, SG_DTYPE_I32, ndim - 1, shape, "targets")
                            : tu_tensor1(ctx, SG_DTYPE_I32, 1, "targets");
    sg_tensor *loss = tu_tensor1(ctx, SG_DTYPE_F64, 1, "loss");
    sg_tensor *dl = tu_tensor(ctx, SG_DTYPE_F64, ndim, shape, "dlogits");
    double *xv = tu_random(x, -3, 3);
    double *tv = random_targets(M, C, 3);
    if (M >= 2) { /* at least one masked row and one counted row */
        tv[0] = -1;
        tv[1] = tu_randint(0, (int)C - 1);
    } else {
        tv[0] = tu_randint(0, (int)C - 1);
    }
    tu_set(t, tv);
    float gs = (float)tu_uniform(0.5, 3.0);
    TU_OK(ctx, sg_softmax_xent(ctx, x, t, gs, loss, dl));

    char what[96];
    snprintf(what, sizeof what, "xent f64 M=%lld C=%lld ndim=%d", (long long)M, (long long)C, ndim);
    double got = sg_ld(loss, 0), ref = naive_xent(xv, tv, M, C);
    TU_CHECK(fabs(got - ref) <= 1e-12 + 1e-10 * fabs(ref), "%s: loss %.17g, naive %.17g", what, got,
             ref);
    /* Masked rows: exactly zero gradient. */
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = 0; tv[r] < 0 && j < C; j++)
            TU_CHECK(sg_ld(dl, r * C + j) == 0.0, "%s: masked row %lld has dlogits %g", what,
                     (long long)r, sg_ld(dl, r * C + j));
    /* Each row of dlogits sums to 0 (softmax sums to 1): a check independent of h. */
    for (int64_t r = 0; r < M; r++) {
        double s = 0;
        for (int64_t j = 0; j < C; j++) s += sg_ld(dl, r * C + j);
        TU_CHECK(fabs(s) < 1e-12, "%s: row %lld of dlogits sums to %g", what, (long long)r, s);
    }
    loss_case c = {ctx, 0, x, t, loss, gs};
    tu_gradcheck(what, case_loss, &c, x, dl, 0, 1e-5, (tu_tol){1e-8, 1e-6});

    /* The loss alone (dlogits NULL) is the same number. */
    TU_OK(ctx, sg_softmax_xent(ctx, x, t, gs, loss, NULL));
    TU_CHECK(sg_ld(loss, 0) == got, "%s: loss without dlogits %.17g vs %.17g", what, sg_ld(loss, 0),
             got);

    /* In place: dlogits may be logits itself. */
    sg_tensor *xi = tu_tensor(ctx, SG_DTYPE_F64, ndim, shape, "logits_inplace");
    tu_set(xi, xv);
    TU_OK(ctx, sg_softmax_xent(ctx, xi, t, gs, loss, xi));
    TU_CHECK(sg_ld(loss, 0) == got, "%s: in-place loss %.17g vs %.17g", what, sg_ld(loss, 0), got);
    snprintf(what + strlen(what), sizeof what - strlen(what), " in place");
    tu_close_tensors(what, xi, dl, tu_tol_for(SG_DTYPE_F64));

    free(xv);
    free(tv);
    sg_tensor *ts[] = {x, t, loss, dl, xi};
    for (int i = 0; i < 5; i++) sg_tensor_destroy(ts[i]);
}

static void cpu_mse_gradcheck(sg_ctx *ctx)
{
    int64_t r = tu_randint(1, 6), cdim = tu_randint(1, 9);
    sg_tensor *x = tu_tensor2(ctx, SG_DTYPE_F64, r, cdim, "x"),
              *t = tu_tensor2(ctx, SG_DTYPE_F64, r, cdim, "target");
    sg_tensor *dx = tu_tensor2(ctx, SG_DTYPE_F64, r, cdim, "dx"),
              *loss = tu_tensor1(ctx, SG_DTYPE_F64, 1, "loss");
    double *xv = tu_random(x, -2, 2), *tv = tu_random(t, -2, 2);
    float gs = (float)tu_uniform(0.5, 3.0);
    TU_OK(ctx, sg_mse(ctx, x, t, gs, loss, dx));
    double got = sg_ld(loss, 0), ref = naive_mse(xv, tv, r * cdim);
    TU_CHECK(fabs(got - ref) <= 1e-12 + 1e-10 * fabs(ref), "mse f64: loss %.17g, naive %.17g", got,
             ref);
    loss_case c = {ctx, 1, x, t, loss, gs};
    tu_gradcheck("mse f64", case_loss, &c, x, dx, 0, 1e-5, (tu_tol){1e-8, 1e-6});
    free(xv);
    free(tv);
    sg_tensor *ts[] = {x, t, dx, loss};
    for (int i = 0; i < 4; i++) sg_tensor_destroy(ts[i]);
}

/* The f32 reference path (the oracle of the GPU test) against the naive formula. */
static void cpu_f32(sg_ctx *ctx)
{
    int64_t M = tu_randint(1, 40), C = tu_randint(2, 300);
    sg_tensor *x = tu_tensor2(ctx, SG_DTYPE_F32, M, C, "logits"),
              *t = tu_tensor1(ctx, SG_DTYPE_I32, M, "targets");
    sg_tensor *loss = tu_tensor1(ctx, SG_DTYPE_F32, 1, "loss"),
              *dl = tu_tensor2(ctx, SG_DTYPE_F32, M, C, "dlogits");
    free(tu_random(x, -4, 4));
    double *xv = tu_get(x), *tv = random_targets(M, C, 4); /* xv: the values as stored in f32 */
    tu_set(t, tv);
    TU_OK(ctx, sg_softmax_xent(ctx, x, t, 1.0f, loss, dl));
    double ref = naive_xent(xv, tv, M, C);
    tu_close("xent f32 cpu loss vs naive", (double[]){sg_ld(loss, 0)}, &ref, 1,
             tu_tol_for(SG_DTYPE_F32));
    free(xv);
    free(tv);
    sg_tensor *ts[] = {x, t, loss, dl};
    for (int i = 0; i < 4; i++) sg_tensor_destroy(ts[i]);
}

static void cpu_all_masked(sg_ctx *ctx)
{
    sg_tensor *x = tu_tensor2(ctx, SG_DTYPE_F64, 5, 7, "logits"),
              *t = tu_tensor1(ctx, SG_DTYPE_I32, 5, "targets");
    sg_tensor *loss = tu_tensor1(ctx, SG_DTYPE_F64, 1, "loss"),
              *dl = tu_tensor2(ctx, SG_DTYPE_F64, 5, 7, "dlogits");
    free(tu_random(x, -3, 3));
    TU_OK(ctx, sg_tensor_fill(t, -1));
    TU_OK(ctx, sg_tensor_fill(dl, NAN));
    TU_OK(ctx, sg_softmax_xent(ctx, x, t, 2.0f, loss, dl));
    TU_CHECK(sg_ld(loss, 0) == 0.0, "all rows masked: loss %g, expected 0", sg_ld(loss, 0));
    for (int64_t i = 0; i < dl->numel; i++)
        TU_CHECK(sg_ld(dl, i) == 0.0, "all rows masked: dlogits[%lld] = %g", (long long)i,
                 sg_ld(dl, i));
    sg_tensor *ts[] = {x, t, loss, dl};
    for (int i = 0; i < 4; i++) sg_tensor_destroy(ts[i]);
}

static void cpu_errors(sg_ctx *ctx)
{
    int64_t M = 6, C = 5;
    sg_tensor *x = tu_tensor2(ctx, SG_DTYPE_F64, M, C, "logits"),
              *t = tu_tensor1(ctx, SG_DTYPE_I32, M, "targets");
    sg_tensor *loss = tu_tensor1(ctx, SG_DTYPE_F64, 1, "loss"),
              *dl = tu_tensor2(ctx, SG_DTYPE_F64, M, C, "dlogits");
    sg_tensor *t_short = tu_tensor1(ctx, SG_DTYPE_I32, M - 1, "t_short");
    sg_tensor *t_f32 = tu_tensor1(ctx, SG_DTYPE_F32, M, "t_f32");
    sg_tensor *loss2 = tu_tensor1(ctx, SG_DTYPE_F64, 2, "loss2"),
              *loss_f32 = tu_tensor1(ctx, SG_DTYPE_F32, 1, "loss_f32");
    sg_tensor *dl_bad = tu_tensor2(ctx, SG_DTYPE_F64, M, C + 1, "dl_bad");
    sg_tensor *x_bf16 = tu_tensor2(ctx, SG_DTYPE_BF16, M, C, "x_bf16");
    sg_tensor *y = tu_tensor2(ctx, SG_DTYPE_F64, M, C + 1, "y");
    double *xv = tu_random(x, -2, 2), *tv = random_targets(M, C, 0);
    tu_set(t, tv);

    TU_FAILS(ctx, sg_softmax_xent(ctx, x, t_short, 1.0f, loss, dl), SG_ERR_SHAPE,
             "'targets' is (5) i32");
    TU_FAILS(ctx, sg_softmax_xent(ctx, x, t_f32, 1.0f, loss, dl), SG_ERR_DTYPE,
             "'targets' is f32, expected i32");
    TU_FAILS(ctx, sg_softmax_xent(ctx, x, NULL, 1.0f, loss, dl), SG_ERR_NULL, "'targets' is NULL");
    TU_FAILS(ctx, sg_softmax_xent(ctx, NULL, t, 1.0f, loss, dl), SG_ERR_NULL, "'logits' is NULL");
    TU_FAILS(ctx, sg_softmax_xent(ctx, x, t, 1.0f, NULL, dl), SG_ERR_NULL, "'loss' is NULL");
    TU_FAILS(ctx, sg_softmax_xent(ctx, x, t, 1.0f, loss2, dl), SG_ERR_SHAPE,
             "'loss' (loss2) is (2) f64, expected 1 element");
    TU_FAILS(ctx, sg_softmax_xent(ctx, x, t, 1.0f, loss_f32, dl), SG_ERR_DTYPE,
             "tensor 'loss' is f32, expected f64");
    TU_FAILS(ctx, sg_softmax_xent(ctx, x, t, 1.0f, loss, dl_bad), SG_ERR_SHAPE,
             "'dlogits' is (6, 6) f64");
    /* bf16 logits take an f32 loss (see xent_bf16_errors for the rest). */
    TU_FAILS(ctx, sg_softmax_xent(ctx, x_bf16, t, 1.0f, loss, NULL), SG_ERR_DTYPE,
             "tensor 'loss' is f64, expected f32");
    TU_FAILS(ctx, sg_softmax_xent(ctx, x, t, NAN, loss, dl), SG_ERR_INVALID, "grad_scale");

    /* A target >= C: an error naming the row, and nothing written. */
    double keep = 12345.0;
    sg_st(loss, 0, keep);
    TU_OK(ctx, sg_tensor_fill(dl, keep));
    ((int32_t *)t->data)[3] = (int32_t)C;
    TU_FAILS(ctx, sg_softmax_xent(ctx, x, t, 1.0f, loss, dl), SG_ERR_INVALID,
             "targets[3] (row 3) is 5");
    TU_CHECK(strstr(sg_ctx_last_error(ctx), "sg_softmax_xent") != NULL,
             "message names the call: %s", sg_ctx_last_error(ctx));
    TU_CHECK(sg_ld(loss, 0) == keep && sg_ld(dl, 0) == keep, "a failed call wrote its outputs");
    ((int32_t *)t->data)[3] = (int32_t)tv[3];

    TU_FAILS(ctx, sg_mse(ctx, x, y, 1.0f, loss, NULL), SG_ERR_SHAPE, "'target' is (6, 6) f64");
    TU_FAILS(ctx, sg_mse(ctx, x, dl, 1.0f, loss, dl_bad), SG_ERR_SHAPE, "'dx' is (6, 6) f64");
    TU_FAILS(ctx, sg_mse(ctx, x, dl, 1.0f, NULL, NULL), SG_ERR_NULL,
             "sg_mse: tensor 'loss' is NULL");
    TU_FAILS(ctx, sg_mse(ctx, x, dl, 1.0f, loss_f32, NULL), SG_ERR_DTYPE, "sg_mse: tensor 'loss' is f32, expected f64");

    /* The context is still usable, and computes the right thing. */
    TU_OK(ctx, sg_softmax_xent(ctx, x, t, 1.0f, loss, dl));
    double ref = naive_xent(xv, tv, M, C);
    TU_CHECK(fabs(sg_ld(loss, 0) - ref) <= 1e-10 * fabs(ref),
             "after errors: loss %.17g, naive %.17g", sg_ld(loss, 0), ref);
    free(xv);
    free(tv);
    sg_tensor *ts[] = {x, t, loss, dl, t_short, t_f32, loss2, loss_f32, dl_bad, x_bf16, y};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

/* ---- bf16 logits (mixed precision) ----
 * logits and dlogits bf16, targets i32, loss f32. The reference is the same op in f64 on the
 * logits as stored (rounded to bf16, read exactly). Tolerances: the loss is f32 and held to
 * the f32 rule (its arithmetic is that of the f32 path, on the same values); dlogits by the
 * bf16 rtol (1.6e-2: one rounding to bf16 is <= 2^-8 = 3.9e-3 relative) with an absolute
 * floor of 1e-6 of the unit grad_scale / count, as grad_tol below and for the same reason
 * (the bf16 rule's atol of 1e-2 would pass any softmax entry of a wide row), and, from 16
 * elements, by ||got - ref|| / ||ref|| < 1e-2. On the CPU the bf16 path is the f64
 * computation plus one rounding per output, so there the loss must be the f64 loss rounded to
 * f32 and dlogits the f64 dlogits rounded to bf16, exactly. */

static tu_tol bf16_grad_tol(double unit)
{
    tu_tol t = tu_tol_for(SG_DTYPE_BF16);
    t.atol = 1e-6 * fabs(unit);
    return t;
}

/* ||got - ref|| / ||ref|| (0 when both are zero). */
static double rel_l2(const double *got, const double *ref, int64_t n)
{
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        e += (got[i] - ref[i]) * (got[i] - ref[i]);
        r += ref[i] * ref[i];
    }
    if (r == 0) return e == 0 ? 0 : INFINITY;
    return sqrt(e / r);
}

/* dlogits (bf16, either backend) against the f64 reference: the rule, the L2 error and, with
 * exact, the f64 value rounded to bf16. */
static void check_bf16_dlogits(const char *what, const sg_tensor *got, const sg_tensor *ref,
                               double unit, int exact)
{
    double *g = tu_get(got), *r = tu_get(ref);
    tu_close(what, g, r, got->numel, bf16_grad_tol(unit));
    /* Over a few elements the norm is one element's relative error: p - 1 with p near 1
     * (a 2-class row) loses f32 digits, which the absolute floor admits. */
    double e = rel_l2(g, r, got->numel);
    if (got->numel >= 16)
        TU_CHECK(e < 1e-2, "%s: ||got - ref|| / ||ref|| = %.3g, limit 1e-2", what, e);
    if (exact) {
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < got->numel; i++)
            if (sg_bf16_to_double(sg_double_to_bf16(r[i])) != g[i] && bad++ == 0) first = i;
        TU_CHECK(bad == 0,
                 "%s: %lld of %lld elements are not the f64 value rounded once to bf16; first "
                 "[%lld] got %.9g ref %.17g",
                 what, (long long)bad, (long long)got->numel, (long long)first,
                 first >= 0 ? g[first] : 0.0, first >= 0 ? r[first] : 0.0);
    }
    free(g);
    free(r);
}

/* The loss (f32) against the f64 reference by the f32 rule; with exact, (float)ref itself. */
static void check_bf16_loss(const char *what, const sg_tensor *got, const sg_tensor *ref,
                            int exact)
{
    double g = read_scalar(got), r = read_scalar(ref);
    tu_close(what, &g, &r, 1, tu_tol_for(SG_DTYPE_F32));
    if (exact)
        TU_CHECK(g == (double)(float)r, "%s: %.9g is not the f64 loss %.17g rounded to f32", what,
                 g, r);
}

/* One shape on ctx (CPU or CUDA), bf16 logits, against ref (CPU) in f64: loss only, loss and
 * dlogits (outputs poisoned), masked rows zero, in place; on CUDA also one launch and bitwise
 * the same twice. */
static void xent_bf16_case(sg_ctx *ctx, sg_ctx *ref, int ndim, const int64_t *shape,
                           int mask_every, float gs)
{
    const int gpu = sg_ctx_backend(ctx) == SG_BACKEND_CUDA, exact = !gpu;
    int64_t C = shape[ndim - 1], M = 1;
    for (int i = 0; i < ndim - 1; i++) M *= shape[i];
    char what[160];
    int k = snprintf(what, sizeof what, "%s xent bf16 (", gpu ? "gpu" : "cpu");
    for (int i = 0; i < ndim; i++)
        k += snprintf(what + k, sizeof what - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    snprintf(what + k, sizeof what - k, ") grad_scale %g", (double)gs);

    sg_tensor *x = tu_tensor(ctx, SG_DTYPE_BF16, ndim, shape, "logits");
    sg_tensor *t = tu_tensor1(ctx, SG_DTYPE_I32, M, "targets");
    sg_tensor *l = tu_tensor1(ctx, SG_DTYPE_F32, 1, "loss");
    sg_tensor *d = tu_tensor(ctx, SG_DTYPE_BF16, ndim, shape, "dlogits");
    free(tu_random(x, -6, 6));
    double *tv = random_targets(M, C, mask_every);
    if (M == 1) tv[0] = tu_randint(0, (int)C - 1);
    tu_set(t, tv);
    int64_t count = count_unmasked(tv, M);
    double unit = count ? gs / (double)count : 1.0;

    sg_tensor *xr = tu_clone_to(ref, x, SG_DTYPE_F64), *tr = tu_clone_to(ref, t, SG_DTYPE_I32);
    sg_tensor *lr = tu_tensor1(ref, SG_DTYPE_F64, 1, "loss_ref");
    sg_tensor *dr = tu_tensor(ref, SG_DTYPE_F64, ndim, shape, "dlogits_ref");
    TU_OK(ref, sg_softmax_xent(ref, xr, tr, gs, lr, dr));
    char w2[224];

    tu_poison(l);
    TU_OK(ctx, sg_softmax_xent(ctx, x, t, gs, l, NULL));
    snprintf(w2, sizeof w2, "%s: loss (dlogits NULL)", what);
    check_bf16_loss(w2, l, lr, exact);

    tu_poison(l);
    tu_poison(d);
    uint64_t before = sg_ctx_launch_count(ctx);
    TU_OK(ctx, sg_softmax_xent(ctx, x, t, gs, l, d));
    uint64_t launches = sg_ctx_launch_count(ctx) - before;
    snprintf(w2, sizeof w2, "%s: loss", what);
    check_bf16_loss(w2, l, lr, exact);
    snprintf(w2, sizeof w2, "%s: dlogits", what);
    check_bf16_dlogits(w2, d, dr, unit, exact);
    double *dv = tu_get(d);
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = 0; tv[r] < 0 && j < C; j++)
            TU_CHECK(dv[r * C + j] == 0.0, "%s: masked row %lld has dlogits %g", what,
                     (long long)r, dv[r * C + j]);

    if (gpu) {
        TU_CHECK(launches == 1, "%s: %llu launches, expected 1", what,
                 (unsigned long long)launches);
        double l1 = read_scalar(l);
        tu_poison(l);
        tu_poison(d);
        TU_OK(ctx, sg_softmax_xent(ctx, x, t, gs, l, d));
        double *dv2 = tu_get(d), l2 = read_scalar(l);
        TU_CHECK(l2 == l1, "%s: loss differs between two identical runs", what);
        TU_CHECK(!memcmp(dv, dv2, (size_t)d->numel * sizeof *dv),
                 "%s: dlogits differ between two identical runs", what);
        free(dv2);
    }

    /* In place: dlogits is logits; the same numbers, bit for bit. */
    TU_OK(ctx, sg_tensor_copy(d, x));
    tu_poison(l);
    TU_OK(ctx, sg_softmax_xent(ctx, d, t, gs, l, d));
    snprintf(w2, sizeof w2, "%s: loss in place", what);
    check_bf16_loss(w2, l, lr, exact);
    double *dv3 = tu_get(d);
    TU_CHECK(!memcmp(dv, dv3, (size_t)d->numel * sizeof *dv),
             "%s: in-place dlogits differ from out-of-place", what);
    free(dv3);
    free(dv);
    free(tv);
    sg_tensor *ts[] = {x, t, l, d, xr, tr, lr, dr};
    for (int i = 0; i < 8; i++) sg_tensor_destroy(ts[i]);
}

/* Mixed dtypes fail with SG_ERR_DTYPE naming the tensor; the context works afterwards. */
static void xent_bf16_errors(sg_ctx *ctx)
{
    int64_t M = 6, C = 5;
    sg_tensor *x = tu_tensor2(ctx, SG_DTYPE_BF16, M, C, "logits"),
              *t = tu_tensor1(ctx, SG_DTYPE_I32, M, "targets");
    sg_tensor *l = tu_tensor1(ctx, SG_DTYPE_F32, 1, "loss"),
              *lh = tu_tensor1(ctx, SG_DTYPE_BF16, 1, "loss_bf16");
    sg_tensor *d = tu_tensor2(ctx, SG_DTYPE_BF16, M, C, "dlogits"),
              *df = tu_tensor2(ctx, SG_DTYPE_F32, M, C, "dlogits_f32");
    sg_tensor *xf = tu_tensor2(ctx, SG_DTYPE_F32, M, C, "logits_f32");
    free(tu_random(x, -2, 2));
    free(tu_random(xf, -2, 2));
    double *tv = random_targets(M, C, 0);
    tu_set(t, tv);
    TU_FAILS(ctx, sg_softmax_xent(ctx, x, t, 1.0f, lh, d), SG_ERR_DTYPE,
             "sg_softmax_xent: tensor 'loss' is bf16, expected f32");
    TU_FAILS(ctx, sg_softmax_xent(ctx, x, t, 1.0f, l, df), SG_ERR_DTYPE,
             "'logits' is (6, 5) bf16 but 'dlogits' is (6, 5) f32");
    TU_FAILS(ctx, sg_softmax_xent(ctx, xf, t, 1.0f, l, d), SG_ERR_DTYPE,
             "'logits' is (6, 5) f32 but 'dlogits' is (6, 5) bf16");
    TU_FAILS(ctx, sg_mse(ctx, x, x, 1.0f, l, NULL), SG_ERR_DTYPE, "sg_mse: tensor 'x' is bf16");
    TU_OK(ctx, sg_softmax_xent(ctx, x, t, 1.0f, l, d));
    TU_CHECK(isfinite(read_scalar(l)), "bf16 loss after the errors: %g", read_scalar(l));
    free(tv);
    sg_tensor *ts[] = {x, t, l, lh, d, df, xf};
    for (int i = 0; i < 7; i++) sg_tensor_destroy(ts[i]);
}

static void cpu_bf16(sg_ctx *ctx)
{
    int64_t s2[2] = {tu_randint(1, 40), tu_randint(2, 300)};
    xent_bf16_case(ctx, ctx, 2, s2, 4, (float)tu_uniform(0.5, 3.0));
    int64_t s3[3] = {2, tu_randint(2, 4), tu_randint(2, 60)};
    xent_bf16_case(ctx, ctx, 3, s3, 3, 1.0f);
    int64_t s1[1] = {tu_randint(2, 100)};
    xent_bf16_case(ctx, ctx, 1, s1, 0, 65536.0f); /* a loss scale: dlogits scaled, loss not */
    xent_bf16_errors(ctx);
}

static void xent_scaled_tests(sg_ctx *ctx, sg_ctx *ref); /* with the gpu helpers, below */

static void cpu_tests(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    int64_t s2[2] = {tu_randint(3, 10), tu_randint(2, 9)};
    cpu_xent_gradcheck(ctx, 2, s2);
    int64_t s3[3] = {2, tu_randint(2, 4), tu_randint(2, 6)};
    cpu_xent_gradcheck(ctx, 3, s3);
    int64_t s1[1] = {tu_randint(2, 8)};
    cpu_xent_gradcheck(ctx, 1, s1);
    cpu_mse_gradcheck(ctx);
    cpu_f32(ctx);
    cpu_all_masked(ctx);
    cpu_errors(ctx);
    cpu_bf16(ctx);
    xent_scaled_tests(ctx, ctx);
    sg_ctx_destroy(ctx);
}

/* ---- gpu: CUDA against the CPU reference ---- */

/* Gradients are (softmax - onehot) * unit with unit = grad_scale / count (xent) or
 * 2 grad_scale / n (mse). The f32 atol of 1e-5 is far above the small entries (softmax
 * entries of a 50257-class row are ~2e-5 of the unit), so the absolute floor is 1e-6 of the
 * unit instead: it covers p - 1 near p = 1 (f32 ulp of 1 is 1.2e-7) and nothing more. */
static tu_tol grad_tol(double unit)
{
    tu_tol t = tu_tol_for(SG_DTYPE_F32);
    t.atol = 1e-6 * fabs(unit);
    return t;
}

/* Copies a float tensor's raw bytes (for bitwise comparison). */
static float *raw(const sg_tensor *t)
{
    float *v = malloc(sg_tensor_nbytes(t));
    TU_OK(t->ctx, sg_tensor_copy_to_host(t, v, sg_tensor_nbytes(t)));
    return v;
}

static int same_bits(const sg_tensor *a, const float *b)
{
    float *v = raw(a);
    int same = memcmp(v, b, sg_tensor_nbytes(a)) == 0;
    free(v);
    return same;
}

/* One shape: loss only, then loss and dlogits, then again (bitwise the same, one launch),
 * then in place. Three calls in a row on one context: the scratch counter must be back at 0
 * after each, or the next call's loss stays poisoned. */
static void gpu_xent_case(sg_ctx *gpu, sg_ctx *cpu, int ndim, const int64_t *shape, int mask_every)
{
    int64_t C = shape[ndim - 1], M = 1;
    for (int i = 0; i < ndim - 1; i++) M *= shape[i];
    char what[128];
    int k = snprintf(what, sizeof what, "xent (");
    for (int i = 0; i < ndim; i++)
        k += snprintf(what + k, sizeof what - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    snprintf(what + k, sizeof what - k, ")");

    sg_tensor *xg = tu_tensor(gpu, SG_DTYPE_F32, ndim, shape, "logits");
    sg_tensor *tg = tu_tensor1(gpu, SG_DTYPE_I32, M, "targets");
    sg_tensor *lg = tu_tensor1(gpu, SG_DTYPE_F32, 1, "loss"),
              *dg = tu_tensor(gpu, SG_DTYPE_F32, ndim, shape, "dlogits");
    free(tu_random(xg, -6, 6));
    double *tv = random_targets(M, C, mask_every);
    if (M == 1) tv[0] = tu_randint(0, (int)C - 1);
    tu_set(tg, tv);
    int64_t count = count_unmasked(tv, M);
    float gs = (float)tu_uniform(0.5, 4.0);

    sg_tensor *xc = tu_clone_to(cpu, xg, SG_DTYPE_F32), *tc = tu_clone_to(cpu, tg, SG_DTYPE_I32);
    sg_tensor *lc = tu_tensor1(cpu, SG_DTYPE_F32, 1, "loss_ref"),
              *dc = tu_tensor(cpu, SG_DTYPE_F32, ndim, shape, "dlogits_ref");
    TU_OK(cpu, sg_softmax_xent(cpu, xc, tc, gs, lc, dc));
    /* The loss: per-row terms are f32 (~1e-7 relative, a few 1e-6 for 50k-term sums) but
     * rows and blocks are summed in double, so the error of the mean does not grow with M
     * and the f32 rule holds without loosening. */
    tu_tol ltol = tu_tol_for(SG_DTYPE_F32), dtol = grad_tol(count ? gs / (double)count : 1.0);
    char w2[160];

    tu_poison(lg);
    TU_OK(gpu, sg_softmax_xent(gpu, xg, tg, gs, lg, NULL));
    snprintf(w2, sizeof w2, "%s loss (dlogits NULL)", what);
    tu_close_tensors(w2, lg, lc, ltol);

    tu_poison(lg);
    tu_poison(dg);
    TU_OK(gpu, sg_softmax_xent(gpu, xg, tg, gs, lg, dg));
    snprintf(w2, sizeof w2, "%s loss", what);
    tu_close_tensors(w2, lg, lc, ltol);
    snprintf(w2, sizeof w2, "%s dlogits", what);
    tu_close_tensors(w2, dg, dc, dtol);

    float *l1 = raw(lg), *d1 = raw(dg);
    tu_poison(lg);
    tu_poison(dg);
    uint64_t before = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_softmax_xent(gpu, xg, tg, gs, lg, dg));
    uint64_t launches = sg_ctx_launch_count(gpu) - before;
    TU_CHECK(launches == 1, "%s: %llu launches, expected 1", what, (unsigned long long)launches);
    TU_CHECK(same_bits(lg, l1), "%s: loss differs between two identical runs", what);
    TU_CHECK(same_bits(dg, d1), "%s: dlogits differ between two identical runs", what);
    free(l1);
    free(d1);

    /* In place: dlogits is logits. */
    TU_OK(gpu, sg_tensor_copy(dg, xg));
    tu_poison(lg);
    TU_OK(gpu, sg_softmax_xent(gpu, dg, tg, gs, lg, dg));
    snprintf(w2, sizeof w2, "%s loss in place", what);
    tu_close_tensors(w2, lg, lc, ltol);
    snprintf(w2, sizeof w2, "%s dlogits in place", what);
    tu_close_tensors(w2, dg, dc, dtol);

    free(tv);
    sg_tensor *ts[] = {xg, tg, lg, dg, xc, tc, lc, dc};
    for (int i = 0; i < 8; i++) sg_tensor_destroy(ts[i]);
}

static void gpu_mse_case(sg_ctx *gpu, sg_ctx *cpu, int64_t r, int64_t c)
{
    char what[96];
    snprintf(what, sizeof what, "mse (%lld,%lld)", (long long)r, (long long)c);
    sg_tensor *xg = tu_tensor2(gpu, SG_DTYPE_F32, r, c, "x"),
              *tg = tu_tensor2(gpu, SG_DTYPE_F32, r, c, "target");
    sg_tensor *lg = tu_tensor1(gpu, SG_DTYPE_F32, 1, "loss"),
              *dg = tu_tensor2(gpu, SG_DTYPE_F32, r, c, "dx");
    free(tu_random(xg, -3, 3));
    free(tu_random(tg, -3, 3));
    float gs = (float)tu_uniform(0.5, 4.0);
    sg_tensor *xc = tu_clone_to(cpu, xg, SG_DTYPE_F32), *tc = tu_clone_to(cpu, tg, SG_DTYPE_F32);
    sg_tensor *lc = tu_tensor1(cpu, SG_DTYPE_F32, 1, "loss_ref"),
              *dc = tu_tensor2(cpu, SG_DTYPE_F32, r, c, "dx_ref");
    TU_OK(cpu, sg_mse(cpu, xc, tc, gs, lc, dc));
    tu_tol ltol = tu_tol_for(SG_DTYPE_F32), dtol = grad_tol(2.0 * gs / (double)(r * c));
    char w2[128];

    tu_poison(lg);
    TU_OK(gpu, sg_mse(gpu, xg, tg, gs, lg, NULL));
    snprintf(w2, sizeof w2, "%s loss (dx NULL)", what);
    tu_close_tensors(w2, lg, lc, ltol);

    tu_poison(lg);
    tu_poison(dg);
    TU_OK(gpu, sg_mse(gpu, xg, tg, gs, lg, dg));
    snprintf(w2, sizeof w2, "%s loss", what);
    tu_close_tensors(w2, lg, lc, ltol);
    snprintf(w2, sizeof w2, "%s dx", what);
    tu_close_tensors(w2, dg, dc, dtol);

    float *l1 = raw(lg), *d1 = raw(dg);
    tu_poison(lg);
    tu_poison(dg);
    uint64_t before = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_mse(gpu, xg, tg, gs, lg, dg));
    uint64_t launches = sg_ctx_launch_count(gpu) - before;
    TU_CHECK(launches == 1, "%s: %llu launches, expected 1", what, (unsigned long long)launches);
    TU_CHECK(same_bits(lg, l1), "%s: loss differs between two identical runs", what);
    TU_CHECK(same_bits(dg, d1), "%s: dx differs between two identical runs", what);
    free(l1);
    free(d1);
    sg_tensor *ts[] = {xg, tg, lg, dg, xc, tc, lc, dc};
    for (int i = 0; i < 8; i++) sg_tensor_destroy(ts[i]);
}

/* Alternating xent and mse calls share one scratch counter: three rounds, each result
 * checked, so a counter left non-zero by either kernel shows as a poisoned loss. */
static void gpu_alternate(sg_ctx *gpu, sg_ctx *cpu)
{
    int64_t M = 300, C = 77, n = 5000;
    sg_tensor *xg = tu_tensor2(gpu, SG_DTYPE_F32, M, C, "logits"),
              *tg = tu_tensor1(gpu, SG_DTYPE_I32, M, "targets");
    sg_tensor *ag = tu_tensor1(gpu, SG_DTYPE_F32, n, "a"),
              *bg = tu_tensor1(gpu, SG_DTYPE_F32, n, "b");
    sg_tensor *lg = tu_tensor1(gpu, SG_DTYPE_F32, 1, "loss");
    free(tu_random(xg, -5, 5));
    double *tv = random_targets(M, C, 5);
    tu_set(tg, tv);
    free(tu_random(ag, -1, 1));
    free(tu_random(bg, -1, 1));
    sg_tensor *xc = tu_clone_to(cpu, xg, SG_DTYPE_F32), *tc = tu_clone_to(cpu, tg, SG_DTYPE_I32);
    sg_tensor *ac = tu_clone_to(cpu, ag, SG_DTYPE_F32), *bc = tu_clone_to(cpu, bg, SG_DTYPE_F32);
    sg_tensor *lx = tu_tensor1(cpu, SG_DTYPE_F32, 1, "loss_xent"),
              *lm = tu_tensor1(cpu, SG_DTYPE_F32, 1, "loss_mse");
    TU_OK(cpu, sg_softmax_xent(cpu, xc, tc, 1.0f, lx, NULL));
    TU_OK(cpu, sg_mse(cpu, ac, bc, 1.0f, lm, NULL));
    for (int round = 0; round < 3; round++) {
        char w[64];
        tu_poison(lg);
        TU_OK(gpu, sg_softmax_xent(gpu, xg, tg, 1.0f, lg, NULL));
        snprintf(w, sizeof w, "alternate round %d xent", round);
        tu_close_tensors(w, lg, lx, tu_tol_for(SG_DTYPE_F32));
        tu_poison(lg);
        TU_OK(gpu, sg_mse(gpu, ag, bg, 1.0f, lg, NULL));
        snprintf(w, sizeof w, "alternate round %d mse", round);
        tu_close_tensors(w, lg, lm, tu_tol_for(SG_DTYPE_F32));
    }
    free(tv);
    sg_tensor *ts[] = {xg, tg, ag, bg, lg, xc, tc, ac, bc, lx, lm};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

/* Edge cases: every row masked; a target >= C (documented: no out-of-bounds read, NaN loss
 * and NaN dlogits row, the next call unaffected); a dtype CUDA does not take. */
static void gpu_edges(sg_ctx *gpu)
{
    int64_t M = 16, C = 10;
    sg_tensor *x = tu_tensor2(gpu, SG_DTYPE_F32, M, C, "logits"),
              *t = tu_tensor1(gpu, SG_DTYPE_I32, M, "targets");
    sg_tensor *l = tu_tensor1(gpu, SG_DTYPE_F32, 1, "loss"),
              *d = tu_tensor2(gpu, SG_DTYPE_F32, M, C, "dlogits");
    free(tu_random(x, -3, 3));

    TU_OK(gpu, sg_tensor_fill(t, -1));
    tu_poison(l);
    tu_poison(d);
    TU_OK(gpu, sg_softmax_xent(gpu, x, t, 1.0f, l, d));
    TU_CHECK(read_scalar(l) == 0.0, "gpu all rows masked: loss %g, expected 0", read_scalar(l));
    double *dv = tu_get(d);
    for (int64_t i = 0; i < d->numel; i++)
        TU_CHECK(dv[i] == 0.0, "gpu all masked: dlogits[%lld] = %g", (long long)i, dv[i]);
    free(dv);

    double *tv = random_targets(M, C, 0);
    tv[5] = (double)C; /* out of range */
    tu_set(t, tv);
    tu_poison(l);
    TU_OK(gpu, sg_softmax_xent(gpu, x, t, 1.0f, l, d));
    TU_OK(gpu, sg_ctx_sync(gpu));
    TU_CHECK(isnan(read_scalar(l)), "gpu target >= C: loss %g, expected NaN", read_scalar(l));
    dv = tu_get(d);
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = 0; j < C; j++)
            TU_CHECK(r == 5 ? isnan(dv[r * C + j]) : isfinite(dv[r * C + j]),
                     "gpu target >= C: dlogits[%lld][%lld] = %g", (long long)r, (long long)j,
                     dv[r * C + j]);
    free(dv);
    tv[5] = 0;
    tu_set(t, tv);
    tu_poison(l);
    TU_OK(gpu, sg_softmax_xent(gpu, x, t, 1.0f, l, NULL));
    TU_CHECK(isfinite(read_scalar(l)), "gpu: the call after a bad target gives loss %g",
             read_scalar(l));

    /* bf16 logits: every row masked gives loss 0 and zero dlogits; a target >= C a NaN loss
     * and a NaN dlogits row, as f32. MSE takes no bf16 (xent_bf16_errors). */
    sg_tensor *xb = tu_tensor2(gpu, SG_DTYPE_BF16, M, C, "logits_bf16");
    sg_tensor *db = tu_tensor2(gpu, SG_DTYPE_BF16, M, C, "dlogits_bf16");
    free(tu_random(xb, -3, 3));
    TU_OK(gpu, sg_tensor_fill(t, -1));
    tu_poison(l);
    tu_poison(db);
    TU_OK(gpu, sg_softmax_xent(gpu, xb, t, 1.0f, l, db));
    TU_CHECK(read_scalar(l) == 0.0, "gpu bf16 all rows masked: loss %g, expected 0",
             read_scalar(l));
    dv = tu_get(db);
    for (int64_t i = 0; i < db->numel; i++)
        TU_CHECK(dv[i] == 0.0, "gpu bf16 all masked: dlogits[%lld] = %g", (long long)i, dv[i]);
    free(dv);
    tv[5] = (double)C;
    tu_set(t, tv);
    tu_poison(l);
    TU_OK(gpu, sg_softmax_xent(gpu, xb, t, 1.0f, l, db));
    TU_CHECK(isnan(read_scalar(l)), "gpu bf16 target >= C: loss %g, expected NaN", read_scalar(l));
    dv = tu_get(db);
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = 0; j < C; j++)
            TU_CHECK(r == 5 ? isnan(dv[r * C + j]) : isfinite(dv[r * C + j]),
                     "gpu bf16 target >= C: dlogits[%lld][%lld] = %g", (long long)r, (long long)j,
                     dv[r * C + j]);
    free(dv);
    TU_FAILS(gpu, sg_mse(gpu, xb, xb, 1.0f, l, NULL), SG_ERR_DTYPE, "'x' is bf16");
    free(tv);
    sg_tensor *ts[] = {x, t, l, d, xb, db};
    for (int i = 0; i < 6; i++) sg_tensor_destroy(ts[i]);
}

/* ---- sg_softmax_xent_scaled: the loss scale of mixed precision, read from the device ----
 * dlogits = (softmax - onehot) * (grad_scale / count) * scale: the scale (a power of two)
 * multiplies after the division, so the scaled dlogits are exactly scale times sg_softmax_xent's
 * on the same backend (f32 and bf16 alike: no result here is subnormal or overflows), and the
 * loss is the unscaled loss bit for bit. Against the CPU reference, the tolerances of the
 * unscaled comparisons with the unit grad_scale / count * scale. */

/* A scaler of SG_SCALER_COUNT F32 on ctx: {scale, good_steps 0, growth_interval 2000, 0}. */
static void set_scaler(sg_tensor *sc, double scale)
{
    double v[SG_SCALER_COUNT] = {scale, 0, 2000, 0};
    tu_set(sc, v);
}

/* One shape and dtype on ctx against sg_softmax_xent on ctx (exact) and, when ref is another
 * context, the CPU reference (by tolerance); three scales in turn through one scaler tensor
 * (each call reads the current one), then scaler NULL, which is sg_softmax_xent itself. */
static void xent_scaled_case(sg_ctx *ctx, sg_ctx *ref, sg_dtype dt, int ndim,
                             const int64_t *shape, int mask_every)
{
    const int gpu = ctx->backend == SG_BACKEND_CUDA;
    int64_t C = shape[ndim - 1], M = 1;
    for (int i = 0; i < ndim - 1; i++) M *= shape[i];
    char what[160];
    int k = snprintf(what, sizeof what, "%s xent_scaled %s (", gpu ? "gpu" : "cpu",
                     sg_dtype_name(dt));
    for (int i = 0; i < ndim; i++)
        k += snprintf(what + k, sizeof what - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    k += snprintf(what + k, sizeof what - k, ")");
    sg_dtype ldt = dt == SG_DTYPE_F64 ? SG_DTYPE_F64 : SG_DTYPE_F32;

    sg_tensor *x = tu_tensor(ctx, dt, ndim, shape, "logits");
    sg_tensor *t = tu_tensor1(ctx, SG_DTYPE_I32, M, "targets");
    sg_tensor *l0 = tu_tensor1(ctx, ldt, 1, "loss"), *l1 = tu_tensor1(ctx, ldt, 1, "loss_scaled");
    sg_tensor *d0 = tu_tensor(ctx, dt, ndim, shape, "dlogits");
    sg_tensor *d1 = tu_tensor(ctx, dt, ndim, shape, "dlogits_scaled");
    sg_tensor *sc = tu_tensor1(ctx, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler");
    free(tu_random(x, -6, 6));
    double *tv = random_targets(M, C, mask_every);
    tv[0] = tu_randint(0, (int)C - 1); /* at least one counted row */
    tu_set(t, tv);
    int64_t count = count_unmasked(tv, M);
    float gs = (float)tu_uniform(0.5, 4.0);
    double unit = gs / (double)count;
    TU_OK(ctx, sg_softmax_xent(ctx, x, t, gs, l0, d0));
    double *dv0 = tu_get(d0), lv0 = read_scalar(l0);

    /* The CPU reference of the scaled call, on another context (GPU mode only). */
    sg_tensor *xr = NULL, *tr = NULL, *lr = NULL, *dr = NULL, *scr = NULL;
    if (ref != ctx) {
        xr = tu_clone_to(ref, x, dt), tr = tu_clone_to(ref, t, SG_DTYPE_I32);
        lr = tu_tensor1(ref, ldt, 1, "loss_ref");
        dr = tu_tensor(ref, dt, ndim, shape, "dlogits_ref");
        scr = tu_tensor1(ref, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler_ref");
    }

    const double scales[3] = {65536.0, 0.125, 1024.0};
    for (int s = 0; s < 3; s++) {
        char w2[224];
        snprintf(what + k, sizeof what - k, " scale %g", scales[s]);
        set_scaler(sc, scales[s]);
        double *before = tu_get(sc);
        tu_poison(l1);
        tu_poison(d1);
        uint64_t launches = sg_ctx_launch_count(ctx);
        TU_OK(ctx, sg_softmax_xent_scaled(ctx, x, t, gs, sc, l1, d1));
        launches = sg_ctx_launch_count(ctx) - launches;
        if (gpu)
            TU_CHECK(launches == 1, "%s: %llu launches, expected 1", what,
                     (unsigned long long)launches);
        double *dv1 = tu_get(d1), lv1 = read_scalar(l1);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < d1->numel; i++)
            if (dv1[i] != scales[s] * dv0[i] && bad++ == 0) first = i;
        TU_CHECK(bad == 0, "%s: %lld of %lld dlogits are not exactly scale times the unscaled "
                 "ones; first [%lld] %.9g vs %.9g * %g", what, (long long)bad,
                 (long long)d1->numel, (long long)first, first >= 0 ? dv1[first] : 0.0,
                 first >= 0 ? dv0[first] : 0.0, scales[s]);
        TU_CHECK(!memcmp(&lv1, &lv0, sizeof lv0), "%s: loss %.9g, unscaled %.9g: the loss must "
                 "not be scaled", what, lv1, lv0);
        double *after = tu_get(sc);
        TU_CHECK(!memcmp(before, after, SG_SCALER_COUNT * sizeof *after),
                 "%s: the scaler changed (scale %g -> %g)", what, before[0], after[0]);
        free(before), free(after), free(dv1);
        if (ref != ctx) {
            set_scaler(scr, scales[s]);
            TU_OK(ref, sg_softmax_xent_scaled(ref, xr, tr, gs, scr, lr, dr));
            snprintf(w2, sizeof w2, "%s: dlogits against the CPU", what);
            tu_tol tol = dt == SG_DTYPE_BF16 ? bf16_grad_tol(unit * scales[s])
                                             : grad_tol(unit * scales[s]);
            tu_close_tensors(w2, d1, dr, tol);
            snprintf(w2, sizeof w2, "%s: loss against the CPU", what);
            tu_close_tensors(w2, l1, lr, tu_tol_for(SG_DTYPE_F32));
        }
    }

    /* scaler NULL: sg_softmax_xent, bit for bit. */
    tu_poison(l1);
    tu_poison(d1);
    TU_OK(ctx, sg_softmax_xent_scaled(ctx, x, t, gs, NULL, l1, d1));
    double *dv1 = tu_get(d1), lv1 = read_scalar(l1);
    snprintf(what + k, sizeof what - k, " scaler NULL");
    TU_CHECK(!memcmp(dv1, dv0, (size_t)d1->numel * sizeof *dv1) && !memcmp(&lv1, &lv0, sizeof lv0),
             "%s: not sg_softmax_xent's results bit for bit", what);
    free(dv1), free(dv0), free(tv);
    sg_tensor *ts[] = {x, t, l0, l1, d0, d1, sc, xr, tr, lr, dr, scr};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

/* The scaler's checks, each failing before anything is written, named after the call made;
 * the context works afterwards. */
static void xent_scaled_errors(sg_ctx *ctx)
{
    int64_t M = 6, C = 5;
    sg_tensor *x = tu_tensor2(ctx, SG_DTYPE_F32, M, C, "logits"),
              *t = tu_tensor1(ctx, SG_DTYPE_I32, M, "targets");
    sg_tensor *l = tu_tensor1(ctx, SG_DTYPE_F32, 1, "loss");
    sg_tensor *l2 = tu_tensor1(ctx, SG_DTYPE_F32, 2, "loss2");
    sg_tensor *d = tu_tensor2(ctx, SG_DTYPE_F32, M, C, "dlogits");
    sg_tensor *sc = tu_tensor1(ctx, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler");
    sg_tensor *sc3 = tu_tensor1(ctx, SG_DTYPE_F32, 3, "sc3");
    sg_tensor *sc_i32 = tu_tensor1(ctx, SG_DTYPE_I32, SG_SCALER_COUNT, "sc_i32");
    /* A scaler sharing bytes with dlogits, and one with the loss: views of one buffer. */
    sg_tensor *base = tu_tensor1(ctx, SG_DTYPE_F32, M * C, "base");
    int64_t four = SG_SCALER_COUNT, one = 1, mc[2] = {M, C};
    sg_tensor *sc_in = NULL, *d_over = NULL, *l_over = NULL;
    TU_OK(ctx, sg_tensor_view(base, 0, 1, &four, "sc_in", &sc_in));
    TU_OK(ctx, sg_tensor_view(base, 0, 2, mc, "d_over", &d_over));
    TU_OK(ctx, sg_tensor_view(base, 3, 1, &one, "l_over", &l_over));
    free(tu_random(x, -2, 2));
    double *tv = random_targets(M, C, 0);
    tu_set(t, tv);
    set_scaler(sc, 256);
    tu_poison(l);
    tu_poison(d);

    TU_FAILS(ctx, sg_softmax_xent_scaled(ctx, x, t, 1.0f, sc3, l, d), SG_ERR_SHAPE,
             "sg_softmax_xent_scaled: 'scaler' is (3) f32, expected 4 elements");
    TU_FAILS(ctx, sg_softmax_xent_scaled(ctx, x, t, 1.0f, sc_i32, l, d), SG_ERR_DTYPE,
             "sg_softmax_xent_scaled: tensor 'scaler' is i32, expected f32");
    TU_FAILS(ctx, sg_softmax_xent_scaled(ctx, x, t, 1.0f, sc_in, l, d_over), SG_ERR_INVALID,
             "output 'dlogits' overlaps 'scaler'");
    TU_FAILS(ctx, sg_softmax_xent_scaled(ctx, x, t, 1.0f, sc_in, l_over, NULL), SG_ERR_INVALID,
             "output 'loss' overlaps 'scaler'");
    TU_FAILS(ctx, sg_softmax_xent_scaled(ctx, x, t, 1.0f, sc, l2, d), SG_ERR_SHAPE,
             "sg_softmax_xent_scaled: 'loss' (loss2) is (2) f32, expected 1 element");
    TU_FAILS(ctx, sg_softmax_xent_scaled(ctx, x, t, NAN, sc, l, d), SG_ERR_INVALID,
             "sg_softmax_xent_scaled: grad_scale");
    TU_CHECK(sg_softmax_xent_scaled(NULL, x, t, 1.0f, sc, l, d) == SG_ERR_NULL,
             "NULL ctx accepted");
    double *dv = tu_get(d);
    int64_t written = 0;
    for (int64_t i = 0; i < d->numel; i++) written += !isnan(dv[i]);
    TU_CHECK(written == 0 && isnan(read_scalar(l)), "rejected scaled calls wrote %lld dlogits "
             "(loss %g)", (long long)written, read_scalar(l));
    free(dv);
    TU_OK(ctx, sg_softmax_xent_scaled(ctx, x, t, 1.0f, sc, l, d));
    TU_CHECK(isfinite(read_scalar(l)), "scaled loss after the errors: %g", read_scalar(l));
    free(tv);
    sg_tensor *ts[] = {sc_in, d_over, l_over, base, x, t, l, l2, d, sc, sc3, sc_i32};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

/* Both modes: f32 (and f64 on the CPU) and bf16 logits, warp-per-row and block-per-row shapes,
 * masked rows, then the errors. ref: the CPU context (ctx itself in cpu mode). */
static void xent_scaled_tests(sg_ctx *ctx, sg_ctx *ref)
{
    int64_t s2[2] = {tu_randint(1, 300), tu_randint(2, 300)}, big[2] = {64, 50257};
    int64_t s3[3] = {2, tu_randint(2, 4), tu_randint(2, 60)};
    const sg_dtype dts[3] = {SG_DTYPE_F32, SG_DTYPE_BF16, SG_DTYPE_F64};
    for (int i = 0; i < (ctx == ref ? 3 : 2); i++) {
        xent_scaled_case(ctx, ref, dts[i], 2, s2, 4);
        xent_scaled_case(ctx, ref, dts[i], 3, s3, 0);
        if (ctx != ref || dts[i] != SG_DTYPE_F64) xent_scaled_case(ctx, ref, dts[i], 2, big, 8);
    }
    xent_scaled_errors(ctx);
}

static void gpu_tests(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    int64_t rm = tu_randint(1, 3000), rc = tu_randint(2, 6000);
    if (rm * rc > (4 << 20)) rm = (4 << 20) / rc; /* keep the double reference quick */
    int64_t shapes[][2] = {{1, 2},      {32, 10}, {256, 10}, {2048, 256},
                           {64, 50257}, {rm, rc}, {3, 2048}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        gpu_xent_case(gpu, cpu, 2, shapes[s], 8);
    int64_t s3[3] = {4, 16, 33};
    gpu_xent_case(gpu, cpu, 3, s3, 6);
    int64_t v1[1] = {5000};
    gpu_xent_case(gpu, cpu, 1, v1, 0);

    int64_t mse_shapes[][2] = {{1, 1},    {1, 3},     {10, 100},
                               {1, 4097}, {256, 512}, {1, tu_randint(1, 1 << 20)}};
    for (size_t s = 0; s < sizeof mse_shapes / sizeof *mse_shapes; s++)
        gpu_mse_case(gpu, cpu, mse_shapes[s][0], mse_shapes[s][1]);

    gpu_alternate(gpu, cpu);
    gpu_edges(gpu);

    /* bf16 logits against the f64 reference on the same shapes (a loss scale among the
     * grad_scales), then the mixed-dtype errors. */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        xent_bf16_case(gpu, cpu, 2, shapes[s], 8, s == 4 ? 65536.0f : (float)tu_uniform(0.5, 4.0));
    xent_bf16_case(gpu, cpu, 3, s3, 6, 1.0f);
    xent_bf16_case(gpu, cpu, 1, v1, 0, 1024.0f);
    xent_bf16_errors(gpu);
    xent_scaled_tests(gpu, cpu);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_loss");
    if (!strcmp(mode, "gpu"))
        gpu_tests();
    else
        cpu_tests();
    return tu_finish("test_loss");
}
