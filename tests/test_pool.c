/* test_pool.c: max pooling, global average pooling and channel scaling (channels-last images).
 * `cpu`: each forward against the definition written here (max pooling: ties to the first in
 * row-major order, padding that never wins, -inf and NaN windows), float64 finite differences
 * of every backward (max pooling on distinct, well separated values so no window's winner
 * changes under the step), bf16 and f32 storage against f64 on the same values, argument
 * errors (the context usable afterwards). `gpu`: the CUDA kernels, f32 and bf16, against the
 * CPU reference in the same dtype on fresh random inputs (odd channel counts, 1 x 1 images,
 * k 3 / stride 2 / pad 1 and other windows, more images than a grid column), outputs poisoned
 * first; bitwise determinism; one launch per call. */
#include "ops/pool.h" /* sg_maxpool2d_out_size */
#include "testutil.h"

/* ---- shared helpers ---- */

typedef struct win {
    int k, stride, pad;
} win;

static sg_tensor *tensor4(sg_ctx *ctx, sg_dtype dt, int64_t n, int64_t h, int64_t w, int64_t c,
                          const char *name)
{
    const int64_t s[4] = {n, h, w, c};
    return tu_tensor(ctx, dt, 4, s, name);
}

/* Max pooling by the definition: over the window's positions inside the image in row-major
 * order, the first strictly greatest (a NaN wins, the first one). x (N, H, W, C) doubles. */
static void naive_maxpool(const double *x, int64_t N, int64_t H, int64_t W, int64_t C, win p,
                          double *y, int32_t *arg)
{
    const int64_t OH = sg_maxpool2d_out_size(H, p.k, p.stride, p.pad),
                  OW = sg_maxpool2d_out_size(W, p.k, p.stride, p.pad);
    for (int64_t n = 0; n < N; n++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++)
                for (int64_t c = 0; c < C; c++) {
                    double best = -INFINITY;
                    int32_t a = -1;
                    for (int i = 0; i < p.k; i++)
                        for (int j = 0; j < p.k; j++) {
                            int64_t h = oh * p.stride - p.pad + i, w = ow * p.stride - p.pad + j;
                            if (h < 0 || h >= H || w < 0 || w >= W) continue; /* padding */
                            double v = x[((n * H + h) * W + w) * C + c];
                            bool nan_seen = a >= 0 && isnan(best);
                            if (!nan_seen && (a < 0 || v > best || isnan(v))) {
                                best = v;
                                a = (int32_t)(h * W + w);
                            }
                        }
                    int64_t o = ((n * OH + oh) * OW + ow) * C + c;
                    y[o] = best;
                    arg[o] = a;
                }
}

/* Distinct values at least 0.03 apart (a shuffled ladder, step 0.05, jitter +-0.01), so a
 * finite-difference step of FD_H changes no window's winner. Returns host doubles. */
static double *distinct_values(sg_tensor *t)
{
    const int64_t n = t->numel;
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)(i - n / 2) * 0.05 + tu_uniform(-0.01, 0.01);
    for (int64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = (int64_t)(tu_next() % (uint64_t)(i + 1));
        double s = v[i];
        v[i] = v[j], v[j] = s;
    }
    tu_set(t, v);
    return v;
}

static void label(char *buf, size_t n, const char *op, const sg_tensor *x, const win *p)
{
    int k = snprintf(buf, n, "%s (%lld,%lld,%lld,%lld) %s", op, (long long)x->shape[0],
                     (long long)x->shape[1], (long long)x->shape[2], (long long)x->shape[3],
                     sg_dtype_name(x->dtype));
    if (p) snprintf(buf + k, n - (size_t)k, " k%d s%d p%d", p->k, p->stride, p->pad);
}

/* ---- cpu: definitions, finite differences ---- */

typedef struct pool_case {
    sg_ctx *ctx;
    int op; /* 0 maxpool, 1 avgpool, 2 channel scale */
    win p;
    sg_tensor *x, *s, *y, *arg, *r;
} pool_case;

/* L = sum(y * r): the backward with dy = r gives dL/dx (and dL/ds). */
static double pool_loss(void *u)
{
    pool_case *c = u;
    if (c->op == 0)
        TU_OK(c->ctx,
              sg_maxpool2d_forward(c->ctx, c->x, c->p.k, c->p.stride, c->p.pad, c->y, c->arg));
    if (c->op == 1) TU_OK(c->ctx, sg_avgpool_forward(c->ctx, c->x, c->y));
    if (c->op == 2) TU_OK(c->ctx, sg_channel_scale_forward(c->ctx, c->x, c->s, c->y));
    return tu_dot(c->y, c->r);
}

/* The losses are piecewise linear (max: the ladder's gaps of >= 0.03 keep every winner under
 * a step of FD_H), linear (average) and bilinear (scale): the central difference has no
 * truncation error, so the step can be large, which keeps the rounding error ~1e-16 |L| / h
 * (|L| up to ~100 with the ladder's values) far under atol. */
#define FD_H 1e-4
static const tu_tol FD_TOL = {1e-8, 1e-6};

static void cpu_maxpool(sg_ctx *ctx, int64_t N, int64_t H, int64_t W, int64_t C, win p)
{
    const sg_dtype f64 = SG_DTYPE_F64;
    const int64_t OH = sg_maxpool2d_out_size(H, p.k, p.stride, p.pad),
                  OW = sg_maxpool2d_out_size(W, p.k, p.stride, p.pad);
    sg_tensor *x = tensor4(ctx, f64, N, H, W, C, "x"), *dx = tensor4(ctx, f64, N, H, W, C, "dx");
    sg_tensor *y = tensor4(ctx, f64, N, OH, OW, C, "y"), *r = tensor4(ctx, f64, N, OH, OW, C, "r");
    sg_tensor *arg = tensor4(ctx, SG_DTYPE_I32, N, OH, OW, C, "argmax");
    char what[80], w[112];
    label(what, sizeof what, "maxpool", x, &p);
    double *xv = distinct_values(x);
    free(tu_random(r, -1, 1));
    double *ye = malloc((size_t)y->numel * sizeof *ye);
    int32_t *ae = malloc((size_t)y->numel * sizeof *ae);
    naive_maxpool(xv, N, H, W, C, p, ye, ae);
    tu_poison(y), tu_poison(arg);
    TU_OK(ctx, sg_maxpool2d_forward(ctx, x, p.k, p.stride, p.pad, y, arg));
    snprintf(w, sizeof w, "%s y vs definition", what),
        tu_close_vals(w, y, ye, y->numel, (tu_tol){0, 0});
    double *ad = malloc((size_t)y->numel * sizeof *ad);
    for (int64_t i = 0; i < y->numel; i++) ad[i] = ae[i];
    snprintf(w, sizeof w, "%s argmax vs definition", what),
        tu_close_vals(w, arg, ad, y->numel, (tu_tol){0, 0});

    tu_poison(dx);
    TU_OK(ctx, sg_maxpool2d_backward(ctx, r, arg, p.k, p.stride, p.pad, dx));
    pool_case c = {ctx, 0, p, x, NULL, y, arg, r};
    snprintf(w, sizeof w, "%s dx", what), tu_gradcheck(w, pool_loss, &c, x, dx, 0, FD_H, FD_TOL);
    /* Every dy lands somewhere once: sum dx = sum dy. */
    double sx = 0, sy = 0;
    for (int64_t i = 0; i < dx->numel; i++) sx += sg_ld(dx, i);
    for (int64_t i = 0; i < r->numel; i++) sy += sg_ld(r, i);
    TU_CHECK(fabs(sx - sy) <= 1e-12 * (1 + fabs(sy) + (double)r->numel), "%s: sum dx %g, sum dy %g",
             what, sx, sy);
    free(xv), free(ye), free(ae), free(ad);
    sg_tensor *ts[] = {x, dx, y, r, arg};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* The rules at the edges, f32 on either backend: ties to the first in row-major order (values
 * from {1, 2, 3}), padding that never wins (all values negative), a window of -inf names one of
 * its own positions, and a NaN wins (the first one). */
static void maxpool_rules(sg_ctx *ctx)
{
    const sg_dtype f32 = SG_DTYPE_F32;
    const win p = {3, 2, 1};
    const int64_t N = 2, H = 5, W = 6, C = 3, OH = 3, OW = 3, n = N * H * W * C,
                  no = N * OH * OW * C;
    sg_tensor *x = tensor4(ctx, f32, N, H, W, C, "x"), *y = tensor4(ctx, f32, N, OH, OW, C, "y");
    sg_tensor *arg = tensor4(ctx, SG_DTYPE_I32, N, OH, OW, C, "argmax");
    double *v = malloc((size_t)n * sizeof *v), *ye = malloc((size_t)no * sizeof *ye),
           *ad = malloc((size_t)no * sizeof *ad);
    int32_t *ae = malloc((size_t)no * sizeof *ae);
    char what[96];
    for (int rule = 0; rule < 4; rule++) {
        const char *names[] = {"ties", "negative (padding never wins)", "-inf", "NaN"};
        for (int64_t i = 0; i < n; i++) {
            if (rule == 0) v[i] = tu_randint(1, 3);
            if (rule == 1) v[i] = tu_uniform(-3, -1);
            if (rule == 2) v[i] = (i / C) % 4 == 0 ? tu_uniform(-1, 1) : -INFINITY;
            if (rule == 3) v[i] = tu_randint(0, 5) == 0 ? NAN : tu_uniform(-1, 1);
        }
        if (rule == 2) v[0] = v[1] = v[2] = -INFINITY; /* a corner window of -inf only */
        tu_set(x, v);
        double *xs = tu_get(x); /* as stored in f32 */
        naive_maxpool(xs, N, H, W, C, p, ye, ae);
        free(xs);
        tu_poison(y), tu_poison(arg);
        TU_OK(ctx, sg_maxpool2d_forward(ctx, x, p.k, p.stride, p.pad, y, arg));
        double *yv = tu_get(y), *av = tu_get(arg);
        int bad = 0;
        for (int64_t i = 0; i < no; i++) {
            bool same_y = isnan(ye[i]) ? isnan(yv[i]) : yv[i] == ye[i];
            if (!same_y || av[i] != ae[i]) bad++;
        }
        snprintf(what, sizeof what, "maxpool %s on %s", names[rule], sg_ctx_device_name(ctx));
        TU_CHECK(bad == 0, "%s: %d of %lld outputs differ from the definition", what, bad,
                 (long long)no);
        if (rule == 1)
            for (int64_t i = 0; i < no; i++)
                TU_CHECK(yv[i] < 0, "%s: y[%lld] = %g", what, (long long)i, yv[i]);
        free(yv), free(av);
    }
    free(v), free(ye), free(ad), free(ae);
    sg_tensor *ts[] = {x, y, arg};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void cpu_avgpool_scale(sg_ctx *ctx, int64_t N, int64_t H, int64_t W, int64_t C)
{
    const sg_dtype f64 = SG_DTYPE_F64;
    sg_tensor *x = tensor4(ctx, f64, N, H, W, C, "x"), *dx = tensor4(ctx, f64, N, H, W, C, "dx"),
              *yi = tensor4(ctx, f64, N, H, W, C, "y"), *ri = tensor4(ctx, f64, N, H, W, C, "r");
    sg_tensor *y = tu_tensor2(ctx, f64, N, C, "y"), *r = tu_tensor2(ctx, f64, N, C, "r"),
              *s = tu_tensor2(ctx, f64, N, C, "s"), *ds = tu_tensor2(ctx, f64, N, C, "ds");
    char what[80], w[112];
    double *xv = tu_random(x, -2, 2), *sv = tu_random(s, -1.5, 1.5);
    free(tu_random(r, -1, 1)), free(tu_random(ri, -1, 1));
    const int64_t HW = H * W;

    /* Average pooling: the definition, then dx by finite differences. */
    label(what, sizeof what, "avgpool", x, NULL);
    double *ye = calloc((size_t)(N * C), sizeof *ye);
    for (int64_t n = 0; n < N; n++)
        for (int64_t q = 0; q < HW; q++)
            for (int64_t c = 0; c < C; c++) ye[n * C + c] += xv[(n * HW + q) * C + c] / (double)HW;
    tu_poison(y);
    TU_OK(ctx, sg_avgpool_forward(ctx, x, y));
    snprintf(w, sizeof w, "%s y vs definition", what),
        tu_close_vals(w, y, ye, N * C, tu_tol_for(f64));
    tu_poison(dx);
    TU_OK(ctx, sg_avgpool_backward(ctx, r, dx));
    pool_case c = {ctx, 1, {0, 0, 0}, x, NULL, y, NULL, r};
    snprintf(w, sizeof w, "%s dx", what), tu_gradcheck(w, pool_loss, &c, x, dx, 0, FD_H, FD_TOL);

    /* Channel scaling: the definition, then dx and ds by finite differences. */
    label(what, sizeof what, "channel_scale", x, NULL);
    double *yie = malloc((size_t)x->numel * sizeof *yie);
    for (int64_t i = 0; i < x->numel; i++) yie[i] = xv[i] * sv[(i / (HW * C)) * C + i % C];
    tu_poison(yi);
    TU_OK(ctx, sg_channel_scale_forward(ctx, x, s, yi));
    snprintf(w, sizeof w, "%s y vs definition", what),
        tu_close_vals(w, yi, yie, x->numel, tu_tol_for(f64));
    tu_poison(dx), tu_poison(ds);
    TU_OK(ctx, sg_channel_scale_backward(ctx, x, s, ri, dx, ds));
    pool_case cs = {ctx, 2, {0, 0, 0}, x, s, yi, NULL, ri};
    snprintf(w, sizeof w, "%s dx", what), tu_gradcheck(w, pool_loss, &cs, x, dx, 0, FD_H, FD_TOL);
    snprintf(w, sizeof w, "%s ds", what), tu_gradcheck(w, pool_loss, &cs, s, ds, 0, FD_H, FD_TOL);
    free(xv), free(sv), free(ye), free(yie);
    sg_tensor *ts[] = {x, dx, yi, ri, y, r, s, ds};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* Storage dtype dt (f32 or bf16) on the CPU against the f64 reference (checked above) on the
 * same values: the reference computes in double and rounds only the outputs, so dt's outputs
 * sit within half an ulp of dt of f64: inside dt's rule; argmax exactly the same (bf16 values
 * tie often: both sides apply the same rule to the same values). */
static void cpu_lowp(sg_ctx *ctx, sg_dtype dt)
{
    const sg_dtype f64 = SG_DTYPE_F64;
    const win p = {3, 2, 1};
    const int64_t N = tu_randint(1, 3), H = tu_randint(1, 9), W = tu_randint(1, 9),
                  C = tu_randint(1, 20);
    const int64_t OH = sg_maxpool2d_out_size(H, 3, 2, 1), OW = sg_maxpool2d_out_size(W, 3, 2, 1);
    sg_tensor *x = tensor4(ctx, dt, N, H, W, C, "x"), *dx = tensor4(ctx, dt, N, H, W, C, "dx"),
              *yi = tensor4(ctx, dt, N, H, W, C, "yi"), *dyi = tensor4(ctx, dt, N, H, W, C, "dyi");
    sg_tensor *y = tensor4(ctx, dt, N, OH, OW, C, "y"), *dy = tensor4(ctx, dt, N, OH, OW, C, "dy"),
              *arg = tensor4(ctx, SG_DTYPE_I32, N, OH, OW, C, "argmax");
    sg_tensor *s = tu_tensor2(ctx, dt, N, C, "s"), *ds = tu_tensor2(ctx, dt, N, C, "ds"),
              *ya = tu_tensor2(ctx, dt, N, C, "ya"), *dya = tu_tensor2(ctx, dt, N, C, "dya");
    free(tu_random(x, -3, 3)), free(tu_random(dy, -1, 1)), free(tu_random(dyi, -1, 1));
    free(tu_random(s, -1.5, 1.5)), free(tu_random(dya, -1, 1));
    sg_tensor *x64 = tu_clone_to(ctx, x, f64), *dy64 = tu_clone_to(ctx, dy, f64),
              *dyi64 = tu_clone_to(ctx, dyi, f64), *s64 = tu_clone_to(ctx, s, f64),
              *dya64 = tu_clone_to(ctx, dya, f64);
    sg_tensor *y64 = tensor4(ctx, f64, N, OH, OW, C, "y64"),
              *dx64 = tensor4(ctx, f64, N, H, W, C, "dx64"),
              *yi64 = tensor4(ctx, f64, N, H, W, C, "yi64"),
              *arg64 = tensor4(ctx, SG_DTYPE_I32, N, OH, OW, C, "arg64"),
              *ds64 = tu_tensor2(ctx, f64, N, C, "ds64"),
              *ya64 = tu_tensor2(ctx, f64, N, C, "ya64");
    const tu_tol tol = tu_tol_for(dt), exact = {0, 0};
    char what[80], w[112];
    label(what, sizeof what, "pool cpu vs f64", x, &p);

    TU_OK(ctx, sg_maxpool2d_forward(ctx, x64, 3, 2, 1, y64, arg64));
    tu_poison(y), tu_poison(arg);
    TU_OK(ctx, sg_maxpool2d_forward(ctx, x, 3, 2, 1, y, arg));
    snprintf(w, sizeof w, "%s maxpool y", what), tu_close_tensors(w, y, y64, exact);
    snprintf(w, sizeof w, "%s maxpool argmax", what), tu_close_tensors(w, arg, arg64, exact);
    TU_OK(ctx, sg_maxpool2d_backward(ctx, dy64, arg64, 3, 2, 1, dx64));
    tu_poison(dx);
    TU_OK(ctx, sg_maxpool2d_backward(ctx, dy, arg, 3, 2, 1, dx));
    snprintf(w, sizeof w, "%s maxpool dx", what), tu_close_tensors(w, dx, dx64, tol);

    TU_OK(ctx, sg_avgpool_forward(ctx, x64, ya64));
    tu_poison(ya);
    TU_OK(ctx, sg_avgpool_forward(ctx, x, ya));
    snprintf(w, sizeof w, "%s avgpool y", what), tu_close_tensors(w, ya, ya64, tol);
    TU_OK(ctx, sg_avgpool_backward(ctx, dya64, dx64));
    tu_poison(dx);
    TU_OK(ctx, sg_avgpool_backward(ctx, dya, dx));
    snprintf(w, sizeof w, "%s avgpool dx", what), tu_close_tensors(w, dx, dx64, tol);

    TU_OK(ctx, sg_channel_scale_forward(ctx, x64, s64, yi64));
    tu_poison(yi);
    TU_OK(ctx, sg_channel_scale_forward(ctx, x, s, yi));
    snprintf(w, sizeof w, "%s channel_scale y", what), tu_close_tensors(w, yi, yi64, tol);
    TU_OK(ctx, sg_channel_scale_backward(ctx, x64, s64, dyi64, dx64, ds64));
    tu_poison(dx), tu_poison(ds);
    TU_OK(ctx, sg_channel_scale_backward(ctx, x, s, dyi, dx, ds));
    snprintf(w, sizeof w, "%s channel_scale dx", what), tu_close_tensors(w, dx, dx64, tol);
    snprintf(w, sizeof w, "%s channel_scale ds", what), tu_close_tensors(w, ds, ds64, tol);
    sg_tensor *ts[] = {x,   dx,   yi,    dyi, y,     dy,  arg,  s,    ds,    ya,   dya,
                       x64, dy64, dyi64, s64, dya64, y64, dx64, yi64, arg64, ds64, ya64};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* Argument errors on either backend (f32, bf16 and i32 tensors only); each names the call and
 * the tensor; a failed call writes nothing; the context is usable afterwards. */
static void errors(sg_ctx *ctx)
{
    const sg_dtype f32 = SG_DTYPE_F32, bf = SG_DTYPE_BF16, i32 = SG_DTYPE_I32;
    sg_tensor *x = tensor4(ctx, f32, 2, 5, 6, 3, "x"), *dx = tensor4(ctx, f32, 2, 5, 6, 3, "dx");
    sg_tensor *y = tensor4(ctx, f32, 2, 3, 3, 3, "y"), *dy = tensor4(ctx, f32, 2, 3, 3, 3, "dy"),
              *arg = tensor4(ctx, i32, 2, 3, 3, 3, "argmax");
    sg_tensor *y4 = tensor4(ctx, f32, 2, 3, 4, 3, "y4"), *yb = tensor4(ctx, bf, 2, 3, 3, 3, "yb"),
              *argf = tensor4(ctx, f32, 2, 3, 3, 3, "argf"),
              *x3 = tu_tensor2(ctx, f32, 30, 3, "x3");
    sg_tensor *nc = tu_tensor2(ctx, f32, 2, 3, "nc"), *nc2 = tu_tensor2(ctx, f32, 2, 3, "nc2"),
              *nc4 = tu_tensor2(ctx, f32, 2, 4, "nc4"), *ncb = tu_tensor2(ctx, bf, 2, 3, "ncb"),
              *yi = tensor4(ctx, f32, 2, 5, 6, 3, "yi"),
              *yi4 = tensor4(ctx, f32, 2, 5, 6, 4, "yi4"),
              *arg5 = tensor4(ctx, i32, 2, 5, 6, 3, "arg5");
    free(tu_random(x, -1, 1)), free(tu_random(dy, -1, 1)), free(tu_random(nc, -1, 1));
    const char *MF = "sg_maxpool2d_forward: ", *MB = "sg_maxpool2d_backward: ";
    char n[160];
#define NEEDLE(pre, s) (snprintf(n, sizeof n, "%s%s", pre, s), n)

    TU_CHECK(sg_maxpool2d_forward(NULL, x, 3, 2, 1, y, arg) == SG_ERR_NULL, "ctx NULL");
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, NULL, 3, 2, 1, y, arg), SG_ERR_NULL,
             NEEDLE(MF, "tensor 'x' is NULL"));
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, x3, 3, 2, 1, y, arg), SG_ERR_SHAPE,
             NEEDLE(MF, "'x' is (30, 3) f32, expected an image batch (N, H, W, C)"));
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, arg, 3, 2, 1, y, arg), SG_ERR_DTYPE,
             "tensor 'x' is i32");
    TU_FAILS(
        ctx, sg_maxpool2d_forward(ctx, x, 0, 2, 0, y, arg), SG_ERR_INVALID,
        NEEDLE(MF, "k 0, stride 2, pad 0; expected k >= 1, stride >= 1 and 0 <= pad <= k / 2"));
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, x, 3, 0, 1, y, arg), SG_ERR_INVALID, "stride 0");
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, x, 3, 2, 2, y, arg), SG_ERR_INVALID, "pad 2;");
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, x, 3, 2, -1, y, arg), SG_ERR_INVALID, "pad -1;");
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, x, 9, 2, 1, y, arg), SG_ERR_SHAPE,
             "its padded image is smaller than the 9 x 9 window");
    TU_FAILS(
        ctx, sg_maxpool2d_forward(ctx, x, 3, 2, 1, y4, arg), SG_ERR_SHAPE,
        NEEDLE(MF,
               "'y' is (2, 3, 4, 3) f32, expected (2, 3, 3, 3) f32 (k 3, stride 2, pad 1 over x)"));
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, x, 3, 2, 1, yb, arg), SG_ERR_DTYPE,
             "tensor 'y' is bf16, expected f32");
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, x, 3, 2, 1, y, argf), SG_ERR_DTYPE,
             "tensor 'argmax' is f32, expected i32");
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, x, 3, 2, 1, y, NULL), SG_ERR_NULL,
             "tensor 'argmax' is NULL");
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, x, 3, 1, 1, x, arg5), SG_ERR_INVALID,
             NEEDLE(MF, "output 'y' overlaps 'x' in memory"));
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, x, 3, 1, 1, dx, (sg_tensor *)dx), SG_ERR_DTYPE,
             "tensor 'argmax' is f32, expected i32");
    /* A failed call writes nothing. */
    TU_OK(ctx, sg_tensor_fill(y, 12345.0));
    TU_FAILS(ctx, sg_maxpool2d_forward(ctx, x, 3, 2, 1, y, argf), SG_ERR_DTYPE, "argmax");
    double *yv = tu_get(y);
    TU_CHECK(yv[0] == 12345.0 && yv[y->numel - 1] == 12345.0, "a failed call wrote y");
    free(yv);
    tu_poison(y);
    TU_OK(ctx, sg_maxpool2d_forward(ctx, x, 3, 2, 1, y, arg));

    TU_FAILS(ctx, sg_maxpool2d_backward(ctx, dy, arg, 3, 2, 1, NULL), SG_ERR_NULL,
             NEEDLE(MB, "tensor 'dx' is NULL"));
    TU_FAILS(
        ctx, sg_maxpool2d_backward(ctx, dy, arg, 3, 1, 1, dx), SG_ERR_SHAPE,
        NEEDLE(
            MB,
            "'dy' is (2, 3, 3, 3) f32, expected (2, 5, 6, 3) f32 (k 3, stride 1, pad 1 over dx)"));
    TU_FAILS(ctx, sg_maxpool2d_backward(ctx, dy, argf, 3, 2, 1, dx), SG_ERR_DTYPE,
             "tensor 'argmax' is f32, expected i32");
    TU_FAILS(ctx, sg_maxpool2d_backward(ctx, dy, arg, 3, 2, 1, yi4), SG_ERR_SHAPE,
             "'dy' is (2, 3, 3, 3) f32, expected (2, 3, 3, 4) f32");
    TU_FAILS(ctx, sg_maxpool2d_backward(ctx, yb, arg, 3, 2, 1, dx), SG_ERR_DTYPE,
             "tensor 'dy' is bf16, expected f32");
    TU_FAILS(ctx, sg_maxpool2d_backward(ctx, dy, arg, 4, 2, 3, dx), SG_ERR_INVALID, "pad 3;");
    /* A failed call writes nothing. */
    TU_OK(ctx, sg_tensor_fill(dx, 12345.0));
    TU_FAILS(ctx, sg_maxpool2d_backward(ctx, dy, arg, 3, 1, 1, dx), SG_ERR_SHAPE, "expected");
    double *dxv = tu_get(dx);
    TU_CHECK(dxv[0] == 12345.0 && dxv[dx->numel - 1] == 12345.0, "a failed call wrote dx");
    free(dxv);

    const char *AF = "sg_avgpool_forward: ", *AB = "sg_avgpool_backward: ";
    TU_FAILS(ctx, sg_avgpool_forward(ctx, x, nc4), SG_ERR_SHAPE,
             NEEDLE(AF, "'y' is (2, 4) f32, expected (2, 3) f32 ((N, C) of x)"));
    TU_FAILS(ctx, sg_avgpool_forward(ctx, x, ncb), SG_ERR_DTYPE,
             "tensor 'y' is bf16, expected f32");
    TU_FAILS(ctx, sg_avgpool_forward(ctx, x3, nc), SG_ERR_SHAPE,
             "'x' is (30, 3) f32, expected an image batch");
    TU_FAILS(ctx, sg_avgpool_backward(ctx, nc4, dx), SG_ERR_SHAPE,
             NEEDLE(AB, "'dy' is (2, 4) f32, expected (2, 3) f32 ((N, C) of dx)"));
    TU_FAILS(ctx, sg_avgpool_backward(ctx, nc, NULL), SG_ERR_NULL, "tensor 'dx' is NULL");

    const char *SF = "sg_channel_scale_forward: ", *SB = "sg_channel_scale_backward: ";
    TU_FAILS(ctx, sg_channel_scale_forward(ctx, x, nc4, yi), SG_ERR_SHAPE,
             NEEDLE(SF, "'s' is (2, 4) f32, expected (2, 3) f32 ((N, C) of x)"));
    TU_FAILS(ctx, sg_channel_scale_forward(ctx, x, ncb, yi), SG_ERR_DTYPE,
             "tensor 's' is bf16, expected f32");
    TU_FAILS(ctx, sg_channel_scale_forward(ctx, x, nc, yi4), SG_ERR_SHAPE,
             "'x' is (2, 5, 6, 3) f32 but 'y' is (2, 5, 6, 4) f32");
    TU_FAILS(ctx, sg_channel_scale_forward(ctx, x, nc, x), SG_ERR_INVALID,
             "output 'y' overlaps 'x'");
    TU_FAILS(ctx, sg_channel_scale_backward(ctx, x, nc, yi, dx, nc4), SG_ERR_SHAPE,
             NEEDLE(SB, "'ds' is (2, 4) f32, expected (2, 3) f32"));
    TU_FAILS(ctx, sg_channel_scale_backward(ctx, x, nc, yi4, dx, nc2), SG_ERR_SHAPE,
             "'x' is (2, 5, 6, 3) f32 but 'dy' is (2, 5, 6, 4) f32");
    TU_FAILS(ctx, sg_channel_scale_backward(ctx, x, nc, yi, dx, nc), SG_ERR_INVALID,
             "output 'ds' overlaps 's'");
    TU_FAILS(ctx, sg_channel_scale_backward(ctx, x, nc, yi, yi, nc2), SG_ERR_INVALID,
             "output 'dx' overlaps 'dy'");

    /* Usable afterwards, and right. */
    tu_poison(nc2);
    TU_OK(ctx, sg_avgpool_forward(ctx, x, nc2));
    double *xv = tu_get(x), *av = tu_get(nc2);
    for (int64_t c = 0; c < 3; c++) {
        double s = 0;
        for (int64_t q = 0; q < 30; q++) s += xv[q * 3 + c];
        TU_CHECK(fabs(av[c] - s / 30) < 1e-6, "avgpool after errors: [%lld] %g vs %g", (long long)c,
                 av[c], s / 30);
    }
    free(xv), free(av);
#undef NEEDLE
    sg_tensor *ts[] = {x, dx, y, dy, arg, y4, yb, argf, x3, nc, nc2, nc4, ncb, yi, yi4, arg5};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void cpu_tests(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const win wins[] = {{3, 2, 1}, {2, 2, 0}, {3, 1, 1}, {1, 1, 0},
                        {3, 3, 0}, {2, 1, 1}, {4, 2, 2}};
    for (size_t i = 0; i < sizeof wins / sizeof *wins; i++) {
        win p = wins[i];
        int64_t lo = p.k - 2 * p.pad < 1 ? 1 : p.k - 2 * p.pad;
        cpu_maxpool(ctx, tu_randint(1, 2), tu_randint((int)lo, 7), tu_randint((int)lo, 7),
                    tu_randint(1, 5), p);
    }
    cpu_maxpool(ctx, 2, 1, 1, 3, (win){3, 2, 1}); /* 1 x 1 images */
    cpu_maxpool(ctx, 1, 1, 1, 2, (win){1, 1, 0});
    maxpool_rules(ctx);
    cpu_avgpool_scale(ctx, tu_randint(1, 3), tu_randint(1, 5), tu_randint(1, 5), tu_randint(1, 7));
    cpu_avgpool_scale(ctx, 2, 1, 1, 3);
    cpu_lowp(ctx, SG_DTYPE_F32);
    cpu_lowp(ctx, SG_DTYPE_BF16);
    errors(ctx);
    sg_ctx_destroy(ctx);
}

/* ---- gpu: CUDA against the CPU reference ---- */

/* Runs `call` twice more on fresh poison and checks it makes one launch and the same bits. */
static void again(sg_ctx *gpu, const char *what, sg_status (*fn)(void *), void *u,
                  sg_tensor *const *outs, int nout)
{
    void *first[4];
    for (int i = 0; i < nout; i++) first[i] = tu_raw(outs[i]), tu_poison(outs[i]);
    uint64_t n0 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, fn(u));
    uint64_t n1 = sg_ctx_launch_count(gpu);
    TU_CHECK(n1 - n0 == 1, "%s: %llu launches, expected 1", what, (unsigned long long)(n1 - n0));
    for (int i = 0; i < nout; i++) {
        TU_CHECK(tu_same_bytes(outs[i], first[i]), "%s: %s differs between two identical runs",
                 what, outs[i]->name);
        free(first[i]);
    }
}

typedef struct gpu_call {
    sg_ctx *ctx;
    int op;
    win p;
    const sg_tensor *a, *b, *c;
    sg_tensor *y, *z;
} gpu_call;

static sg_status gpu_run(void *u)
{
    gpu_call *g = u;
    switch (g->op) {
    case 0: return sg_maxpool2d_forward(g->ctx, g->a, g->p.k, g->p.stride, g->p.pad, g->y, g->z);
    case 1: return sg_maxpool2d_backward(g->ctx, g->a, g->b, g->p.k, g->p.stride, g->p.pad, g->y);
    case 2: return sg_avgpool_forward(g->ctx, g->a, g->y);
    case 3: return sg_avgpool_backward(g->ctx, g->a, g->y);
    case 4: return sg_channel_scale_forward(g->ctx, g->a, g->b, g->y);
    default: return sg_channel_scale_backward(g->ctx, g->a, g->b, g->c, g->y, g->z);
    }
}

/* Max pooling, one shape and window, dtype dt. Tolerances: y and argmax exact (the winner is
 * one of the same input values under the same rule; bf16 inputs tie often, which exercises
 * it). dx: a sum of at most ceil(k / stride)^2 dy values, f32 on the GPU against double: a few
 * f32 ulp, inside the f32 rule; bf16 rounds once on both sides: one bf16 ulp at most, inside
 * the bf16 rule. */
static void gpu_maxpool(sg_ctx *gpu, sg_ctx *cpu, sg_dtype dt, int64_t N, int64_t H, int64_t W,
                        int64_t C, win p)
{
    const int64_t OH = sg_maxpool2d_out_size(H, p.k, p.stride, p.pad),
                  OW = sg_maxpool2d_out_size(W, p.k, p.stride, p.pad);
    sg_tensor *x = tensor4(gpu, dt, N, H, W, C, "x"), *dx = tensor4(gpu, dt, N, H, W, C, "dx");
    sg_tensor *y = tensor4(gpu, dt, N, OH, OW, C, "y"), *dy = tensor4(gpu, dt, N, OH, OW, C, "dy"),
              *arg = tensor4(gpu, SG_DTYPE_I32, N, OH, OW, C, "argmax");
    free(tu_random(x, -3, 3)), free(tu_random(dy, -1, 1));
    sg_tensor *xc = tu_clone_to(cpu, x, dt), *dyc = tu_clone_to(cpu, dy, dt);
    sg_tensor *yc = tensor4(cpu, dt, N, OH, OW, C, "y_ref"),
              *dxc = tensor4(cpu, dt, N, H, W, C, "dx_ref"),
              *argc = tensor4(cpu, SG_DTYPE_I32, N, OH, OW, C, "argmax_ref");
    char what[80], w[112];
    label(what, sizeof what, "maxpool", x, &p);
    TU_OK(cpu, sg_maxpool2d_forward(cpu, xc, p.k, p.stride, p.pad, yc, argc));
    TU_OK(cpu, sg_maxpool2d_backward(cpu, dyc, argc, p.k, p.stride, p.pad, dxc));
    gpu_call f = {gpu, 0, p, x, NULL, NULL, y, arg}, b = {gpu, 1, p, dy, arg, NULL, dx, NULL};
    tu_poison(y), tu_poison(arg);
    TU_OK(gpu, gpu_run(&f));
    snprintf(w, sizeof w, "%s y", what), tu_close_tensors(w, y, yc, (tu_tol){0, 0});
    snprintf(w, sizeof w, "%s argmax", what), tu_close_tensors(w, arg, argc, (tu_tol){0, 0});
    tu_poison(dx);
    TU_OK(gpu, gpu_run(&b));
    snprintf(w, sizeof w, "%s dx", what), tu_close_tensors(w, dx, dxc, tu_tol_for(dt));
    sg_tensor *fo[2] = {y, arg}, *bo[1] = {dx};
    snprintf(w, sizeof w, "%s forward", what), again(gpu, w, gpu_run, &f, fo, 2);
    snprintf(w, sizeof w, "%s backward", what), again(gpu, w, gpu_run, &b, bo, 1);
    sg_tensor *ts[] = {x, dx, y, dy, arg, xc, dyc, yc, dxc, argc};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* Average pooling and channel scaling, one shape, dtype dt. Tolerances: dt's rule. avgpool y
 * and ds are double sums on both sides (only the order differs), rounded once to dt; avgpool dx
 * is dy / HW and channel scaling's y and dx one product each, in f32 against double: at most
 * one rounding apart in f32, one ulp of bf16 in bf16. */
static void gpu_avg_scale(sg_ctx *gpu, sg_ctx *cpu, sg_dtype dt, int64_t N, int64_t H, int64_t W,
                          int64_t C)
{
    sg_tensor *x = tensor4(gpu, dt, N, H, W, C, "x"), *dx = tensor4(gpu, dt, N, H, W, C, "dx"),
              *yi = tensor4(gpu, dt, N, H, W, C, "y"), *dyi = tensor4(gpu, dt, N, H, W, C, "dy");
    sg_tensor *ya = tu_tensor2(gpu, dt, N, C, "y"), *dya = tu_tensor2(gpu, dt, N, C, "dy"),
              *s = tu_tensor2(gpu, dt, N, C, "s"), *ds = tu_tensor2(gpu, dt, N, C, "ds");
    free(tu_random(x, -3, 3)), free(tu_random(dyi, -1, 1)), free(tu_random(dya, -1, 1));
    free(tu_random(s, -1.5, 1.5));
    sg_tensor *xc = tu_clone_to(cpu, x, dt), *dyic = tu_clone_to(cpu, dyi, dt),
              *dyac = tu_clone_to(cpu, dya, dt), *sc = tu_clone_to(cpu, s, dt);
    sg_tensor *dxc = tensor4(cpu, dt, N, H, W, C, "dx_ref"),
              *yic = tensor4(cpu, dt, N, H, W, C, "y_ref"),
              *yac = tu_tensor2(cpu, dt, N, C, "y_ref"), *dsc = tu_tensor2(cpu, dt, N, C, "ds_ref");
    const tu_tol tol = tu_tol_for(dt);
    char what[80], w[112];

    label(what, sizeof what, "avgpool", x, NULL);
    gpu_call af = {gpu, 2, {0, 0, 0}, x, NULL, NULL, ya, NULL},
             ab = {gpu, 3, {0, 0, 0}, dya, NULL, NULL, dx, NULL};
    TU_OK(cpu, sg_avgpool_forward(cpu, xc, yac));
    tu_poison(ya);
    TU_OK(gpu, gpu_run(&af));
    snprintf(w, sizeof w, "%s y", what), tu_close_tensors(w, ya, yac, tol);
    TU_OK(cpu, sg_avgpool_backward(cpu, dyac, dxc));
    tu_poison(dx);
    TU_OK(gpu, gpu_run(&ab));
    snprintf(w, sizeof w, "%s dx", what), tu_close_tensors(w, dx, dxc, tol);
    sg_tensor *o1[1] = {ya}, *o2[1] = {dx};
    snprintf(w, sizeof w, "%s forward", what), again(gpu, w, gpu_run, &af, o1, 1);
    snprintf(w, sizeof w, "%s backward", what), again(gpu, w, gpu_run, &ab, o2, 1);

    label(what, sizeof what, "channel_scale", x, NULL);
    gpu_call sf = {gpu, 4, {0, 0, 0}, x, s, NULL, yi, NULL},
             sb = {gpu, 5, {0, 0, 0}, x, s, dyi, dx, ds};
    TU_OK(cpu, sg_channel_scale_forward(cpu, xc, sc, yic));
    tu_poison(yi);
    TU_OK(gpu, gpu_run(&sf));
    snprintf(w, sizeof w, "%s y", what), tu_close_tensors(w, yi, yic, tol);
    TU_OK(cpu, sg_channel_scale_backward(cpu, xc, sc, dyic, dxc, dsc));
    tu_poison(dx), tu_poison(ds);
    TU_OK(gpu, gpu_run(&sb));
    snprintf(w, sizeof w, "%s dx", what), tu_close_tensors(w, dx, dxc, tol);
    snprintf(w, sizeof w, "%s ds", what), tu_close_tensors(w, ds, dsc, tol);
    sg_tensor *o3[1] = {yi}, *o4[2] = {dx, ds};
    snprintf(w, sizeof w, "%s forward", what), again(gpu, w, gpu_run, &sf, o3, 1);
    snprintf(w, sizeof w, "%s backward", what), again(gpu, w, gpu_run, &sb, o4, 2);
    sg_tensor *ts[] = {x, dx, yi, dyi, ya, dya, s, ds, xc, dyic, dyac, sc, dxc, yic, yac, dsc};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void gpu_tests(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    const sg_dtype dts[2] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        const sg_dtype dt = dts[d];
        gpu_maxpool(gpu, cpu, dt, 2, 7, 9, 19, (win){3, 2, 1});
        gpu_maxpool(gpu, cpu, dt, 4, 56, 56, 64, (win){3, 2, 1}); /* ResNet's stem */
        gpu_maxpool(gpu, cpu, dt, 3, 1, 1, 5, (win){3, 2, 1});    /* 1 x 1 images */
        gpu_maxpool(gpu, cpu, dt, 3, 1, 1, 5, (win){1, 1, 0});
        gpu_maxpool(gpu, cpu, dt, 2, 8, 8, 3, (win){2, 2, 0});
        gpu_maxpool(gpu, cpu, dt, 1, 13, 11, 33, (win){3, 1, 1});
        gpu_maxpool(gpu, cpu, dt, 2, 10, 10, 7,
                    (win){3, 3, 0}); /* the last row and column: no window */
        gpu_maxpool(gpu, cpu, dt, 5, 6, 6, 8, (win){4, 2, 2});
        gpu_maxpool(gpu, cpu, dt, tu_randint(1, 4), tu_randint(3, 40), tu_randint(3, 40),
                    tu_randint(1, 70), (win){3, 2, 1});
        gpu_avg_scale(gpu, cpu, dt, 2, 7, 7, 2048);
        gpu_avg_scale(gpu, cpu, dt, 3, 1, 1, 5);
        gpu_avg_scale(gpu, cpu, dt, 4, 56, 56, 16); /* few blocks, many positions: 32 slices */
        gpu_avg_scale(gpu, cpu, dt, 2, 5, 3, 33);
        gpu_avg_scale(gpu, cpu, dt, 66000, 1, 1, 3); /* more images than one grid column */
        gpu_avg_scale(gpu, cpu, dt, tu_randint(1, 8), tu_randint(1, 30), tu_randint(1, 30),
                      tu_randint(1, 300));
    }
    maxpool_rules(gpu);
    errors(gpu);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_pool");
    if (!strcmp(mode, "gpu"))
        gpu_tests();
    else
        cpu_tests();
    return tu_finish("test_pool");
}
