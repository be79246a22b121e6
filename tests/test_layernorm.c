/* test_layernorm.c: LayerNorm forward and backward, and the fused residual forms
 * (sg_add_layernorm_forward, sg_layernorm_backward_add). `cpu`: the forward against the formula
 * written here, float64 finite differences of dx, dgamma and dbeta (N-D x, C odd and even; the
 * fused ops through L = sum(r y) + sum(q s)), bf16 storage against f64 on the same bf16 values,
 * the fused ops in f32 and bf16 against float64 within the roundings they make and bit for bit
 * against the unfused pair (sg_add_forward with the plain op) in every dtype, the column sums'
 * form (sg_layernorm_backward_add_sums) bit for bit the plain fused backward with its sums
 * against the host's, on both backends, argument errors
 * (mixed dtypes included; the context usable afterwards), and a captured plan that replays
 * them. `gpu`: the CUDA kernels, f32 and bf16, against the CPU reference in the same dtype on
 * fresh random inputs (warp-per-row and block-per-row, 16-byte and scalar paths, blocks of one
 * tile of rows and of several; the fused ops with unaligned a, b and dres), outputs poisoned
 * first; the fused ops bit for bit against the unfused pair; bitwise determinism; the launches
 * per call; a captured graph that reproduces the eager results bit for bit. */
#include "ops/layernorm.h" /* SG_LAYERNORM_CUDA_MAX_C */
#include "testutil.h"

/* ---- shared helpers ---- */

/* x values: uniform in [-2, 2) plus an offset per row in [-off, off), so the mean is not ~0
 * and the variance pass must subtract it. Two elements of each row (C >= 2) sit at offset
 * -+1.5, so no row's variance is tiny by chance: f32 cannot resolve x - mean of such a row
 * (an f32 mean is off by up to half an ulp of |mean|, and y scales that by rstd), whatever
 * the kernel. Returns host doubles (caller frees). */
static double *random_rows(sg_tensor *x, double off)
{
    int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    double *v = malloc((size_t)x->numel * sizeof *v);
    for (int64_t r = 0; r < M; r++) {
        double o = off > 0 ? tu_uniform(-off, off) : 0;
        for (int64_t c = 0; c < C; c++) v[r * C + c] = o + tu_uniform(-2, 2);
        if (C >= 2) {
            int64_t p = tu_randint(0, (int)C - 1), q = (p + tu_randint(1, (int)C - 1)) % C;
            v[r * C + p] = o - 1.5;
            v[r * C + q] = o + 1.5;
        }
    }
    tu_set(x, v);
    return v;
}

/* The definition, written out: mean, biased variance, y = (x - mean) / sqrt(var + eps) * g + b. */
static void naive_layernorm(const double *x, const double *g, const double *b, int64_t M, int64_t C,
                            double eps, double *y, double *mean, double *rstd)
{
    for (int64_t r = 0; r < M; r++) {
        const double *xr = x + r * C;
        double s = 0, q = 0;
        for (int64_t c = 0; c < C; c++) s += xr[c];
        double m = s / C;
        for (int64_t c = 0; c < C; c++) q += (xr[c] - m) * (xr[c] - m);
        double sd = sqrt(q / C + eps);
        for (int64_t c = 0; c < C; c++) y[r * C + c] = (xr[c] - m) / sd * g[c] + b[c];
        mean[r] = m;
        rstd[r] = 1 / sd;
    }
}

static int64_t rows_of(const sg_tensor *x)
{
    return x->numel / x->shape[x->ndim - 1];
}

/* ---- cpu: formula, finite differences, capture, errors ---- */

typedef struct ln_case {
    sg_ctx *ctx;
    sg_tensor *x, *g, *b, *y, *mean, *rstd, *r;
    float eps;
} ln_case;

/* L = sum(y * r): dL/dy = r, so the backward with dy = r gives dL/dx, dL/dgamma, dL/dbeta. */
static double ln_loss(void *u)
{
    ln_case *c = u;
    TU_OK(c->ctx, sg_layernorm_forward(c->ctx, c->x, c->g, c->b, c->eps, c->y, c->mean, c->rstd));
    return tu_dot(c->y, c->r);
}

/* x of shape `shape` (last dim C), f64; mean and rstd as x's leading dims when stats_nd. */
static void cpu_gradcheck(sg_ctx *ctx, int ndim, const int64_t *shape, bool stats_nd)
{
    const int64_t C = shape[ndim - 1];
    sg_tensor *x = tu_tensor(ctx, SG_DTYPE_F64, ndim, shape, "x");
    const int64_t M = rows_of(x);
    sg_tensor *y = tu_tensor(ctx, SG_DTYPE_F64, ndim, shape, "y"),
              *r = tu_tensor(ctx, SG_DTYPE_F64, ndim, shape, "r"),
              *dx = tu_tensor(ctx, SG_DTYPE_F64, ndim, shape, "dx");
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_F64, C, "gamma"),
              *b = tu_tensor1(ctx, SG_DTYPE_F64, C, "beta"),
              *dg = tu_tensor1(ctx, SG_DTYPE_F64, C, "dgamma"),
              *db = tu_tensor1(ctx, SG_DTYPE_F64, C, "dbeta");
    sg_tensor *mean, *rstd;
    if (stats_nd && ndim > 1) {
        mean = tu_tensor(ctx, SG_DTYPE_F64, ndim - 1, shape, "mean");
        rstd = tu_tensor(ctx, SG_DTYPE_F64, ndim - 1, shape, "rstd");
    } else {
        mean = tu_tensor1(ctx, SG_DTYPE_F64, M, "mean");
        rstd = tu_tensor1(ctx, SG_DTYPE_F64, M, "rstd");
    }
    double *xv = random_rows(x, 1.0), *gv = tu_random(g, -1.5, 1.5), *bv = tu_random(b, -1, 1);
    free(tu_random(r, -1, 1));
    float eps = (float)tu_uniform(1e-5, 1e-2);

    char what[128];
    int k = snprintf(what, sizeof what, "layernorm f64 (");
    for (int i = 0; i < ndim; i++)
        k += snprintf(what + k, sizeof what - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    snprintf(what + k, sizeof what - k, ")");

    /* Forward against the formula. */
    tu_poison(y), tu_poison(mean), tu_poison(rstd);
    TU_OK(ctx, sg_layernorm_forward(ctx, x, g, b, eps, y, mean, rstd));
    double *ye = malloc((size_t)x->numel * sizeof *ye), *me = malloc((size_t)M * sizeof *me),
           *re = malloc((size_t)M * sizeof *re);
    naive_layernorm(xv, gv, bv, M, C, eps, ye, me, re);
    char w[160];
    snprintf(w, sizeof w, "%s y vs formula", what);
    tu_close_vals(w, y, ye, x->numel, tu_tol_for(SG_DTYPE_F64));
    snprintf(w, sizeof w, "%s mean vs formula", what);
    tu_close_vals(w, mean, me, M, tu_tol_for(SG_DTYPE_F64));
    snprintf(w, sizeof w, "%s rstd vs formula", what);
    tu_close_vals(w, rstd, re, M, tu_tol_for(SG_DTYPE_F64));

    /* Backward with dy = r, then central differences of L through the forward alone. */
    tu_poison(dx), tu_poison(dg), tu_poison(db);
    TU_OK(ctx, sg_layernorm_backward(ctx, x, g, mean, rstd, r, dx, dg, db));
    ln_case c = {ctx, x, g, b, y, mean, rstd, r, eps};
    /* h = 1e-5: truncation ~h^2 f''' and rounding ~1e-16 |L| / h both stay under 1e-8. */
    tu_tol tol = {1e-8, 1e-6};
    snprintf(w, sizeof w, "%s dx", what);
    tu_gradcheck(w, ln_loss, &c, x, dx, 0, 1e-5, tol);
    snprintf(w, sizeof w, "%s dgamma", what);
    tu_gradcheck(w, ln_loss, &c, g, dg, 0, 1e-5, tol);
    snprintf(w, sizeof w, "%s dbeta", what);
    tu_gradcheck(w, ln_loss, &c, b, db, 0, 1e-5, tol);

    /* Each row of dx sums to 0 (y is invariant to adding a constant to a row of x). */
    for (int64_t row = 0; row < M; row++) {
        double s = 0, a = 0;
        for (int64_t j = 0; j < C; j++)
            s += sg_ld(dx, row * C + j), a += fabs(sg_ld(dx, row * C + j));
        TU_CHECK(fabs(s) <= 1e-12 * (1 + a), "%s: row %lld of dx sums to %g", what, (long long)row,
                 s);
    }
    free(xv), free(gv), free(bv), free(ye), free(me), free(re);
    sg_tensor *ts[] = {x, y, r, dx, g, b, dg, db, mean, rstd};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* The f32 path (the GPU test's oracle) against the formula, f32 statistics. */
static void cpu_f32(sg_ctx *ctx)
{
    int64_t M = tu_randint(1, 40), C = tu_randint(1, 300);
    sg_tensor *x = tu_tensor2(ctx, SG_DTYPE_F32, M, C, "x"),
              *y = tu_tensor2(ctx, SG_DTYPE_F32, M, C, "y");
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_F32, C, "gamma"),
              *b = tu_tensor1(ctx, SG_DTYPE_F32, C, "beta");
    sg_tensor *mean = tu_tensor1(ctx, SG_DTYPE_F32, M, "mean"),
              *rstd = tu_tensor1(ctx, SG_DTYPE_F32, M, "rstd");
    free(random_rows(x, 3.0));
    free(tu_random(g, -1.5, 1.5));
    free(tu_random(b, -1, 1));
    double *xv = tu_get(x), *gv = tu_get(g), *bv = tu_get(b); /* as stored in f32 */
    double *ye = malloc((size_t)(M * C) * sizeof *ye), *me = malloc((size_t)M * sizeof *me),
           *re = malloc((size_t)M * sizeof *re);
    naive_layernorm(xv, gv, bv, M, C, 1e-5, ye, me, re);
    TU_OK(ctx, sg_layernorm_forward(ctx, x, g, b, 1e-5f, y, mean, rstd));
    tu_close_vals("layernorm f32 cpu y vs formula", y, ye, M * C, tu_tol_for(SG_DTYPE_F32));
    tu_close_vals("layernorm f32 cpu mean vs formula", mean, me, M, tu_tol_for(SG_DTYPE_F32));
    tu_close_vals("layernorm f32 cpu rstd vs formula", rstd, re, M, tu_tol_for(SG_DTYPE_F32));
    free(xv), free(gv), free(bv), free(ye), free(me), free(re);
    sg_tensor *ts[] = {x, y, g, b, mean, rstd};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* bf16 on the CPU: x, gamma, beta, y, dy, dx, dgamma, dbeta bf16; mean and rstd f32. The
 * forward against the formula on the bf16 values, the backward against the f64 backward
 * (checked by finite differences above) on the same values: the reference computes in double
 * and rounds only the outputs, so bf16 outputs sit within half a bf16 ulp of f64 (inside the
 * bf16 rule) and mean, rstd within f32 rounding (inside the f32 rule). */
static void cpu_bf16(sg_ctx *ctx)
{
    int64_t M = tu_randint(1, 40), C = tu_randint(1, 300);
    const sg_dtype bf = SG_DTYPE_BF16, f64 = SG_DTYPE_F64;
    sg_tensor *x = tu_tensor2(ctx, bf, M, C, "x"), *y = tu_tensor2(ctx, bf, M, C, "y"),
              *dy = tu_tensor2(ctx, bf, M, C, "dy"), *dx = tu_tensor2(ctx, bf, M, C, "dx");
    sg_tensor *g = tu_tensor1(ctx, bf, C, "gamma"), *b = tu_tensor1(ctx, bf, C, "beta"),
              *dg = tu_tensor1(ctx, bf, C, "dgamma"), *db = tu_tensor1(ctx, bf, C, "dbeta");
    sg_tensor *mean = tu_tensor1(ctx, SG_DTYPE_F32, M, "mean"),
              *rstd = tu_tensor1(ctx, SG_DTYPE_F32, M, "rstd");
    free(random_rows(x, 3.0));
    free(tu_random(g, -1.5, 1.5));
    free(tu_random(b, -1, 1));
    free(tu_random(dy, -1, 1));
    double *xv = tu_get(x), *gv = tu_get(g), *bv = tu_get(b); /* as stored in bf16 */
    double *ye = malloc((size_t)(M * C) * sizeof *ye), *me = malloc((size_t)M * sizeof *me),
           *re = malloc((size_t)M * sizeof *re);
    naive_layernorm(xv, gv, bv, M, C, 1e-5f, ye, me, re);
    tu_poison(y), tu_poison(mean), tu_poison(rstd);
    TU_OK(ctx, sg_layernorm_forward(ctx, x, g, b, 1e-5f, y, mean, rstd));
    tu_close_vals("layernorm bf16 cpu y vs formula", y, ye, M * C, tu_tol_for(SG_DTYPE_BF16));
    tu_close_vals("layernorm bf16 cpu mean vs formula", mean, me, M, tu_tol_for(SG_DTYPE_F32));
    tu_close_vals("layernorm bf16 cpu rstd vs formula", rstd, re, M, tu_tol_for(SG_DTYPE_F32));

    /* The f64 reference: the same values, its own f64 statistics. */
    sg_tensor *x64 = tu_clone_to(ctx, x, f64), *g64 = tu_clone_to(ctx, g, f64),
              *b64 = tu_clone_to(ctx, b, f64), *dy64 = tu_clone_to(ctx, dy, f64);
    sg_tensor *y64 = tu_tensor2(ctx, f64, M, C, "y64"), *dx64 = tu_tensor2(ctx, f64, M, C, "dx64");
    sg_tensor *m64 = tu_tensor1(ctx, f64, M, "mean64"), *r64 = tu_tensor1(ctx, f64, M, "rstd64");
    sg_tensor *dg64 = tu_tensor1(ctx, f64, C, "dgamma64"),
              *db64 = tu_tensor1(ctx, f64, C, "dbeta64");
    TU_OK(ctx, sg_layernorm_forward(ctx, x64, g64, b64, 1e-5f, y64, m64, r64));
    TU_OK(ctx, sg_layernorm_backward(ctx, x64, g64, m64, r64, dy64, dx64, dg64, db64));
    tu_poison(dx), tu_poison(dg), tu_poison(db);
    TU_OK(ctx, sg_layernorm_backward(ctx, x, g, mean, rstd, dy, dx, dg, db));
    tu_tol tol = tu_tol_for(SG_DTYPE_BF16);
    tu_close_tensors("layernorm bf16 cpu dx vs f64", dx, dx64, tol);
    tu_close_tensors("layernorm bf16 cpu dgamma vs f64", dg, dg64, tol);
    tu_close_tensors("layernorm bf16 cpu dbeta vs f64", db, db64, tol);
    free(xv), free(gv), free(bv), free(ye), free(me), free(re);
    sg_tensor *ts[] = {x,   y,   dy,   dx,  g,   b,   dg,  db,   mean, rstd, x64,
                       g64, b64, dy64, y64, dx64, m64, r64, dg64, db64};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* Mixed float dtypes: x sets the dtype of every tensor but mean and rstd (f32 for bf16 x); the
 * first tensor that differs is named. No f64 tensors, so it runs on either backend. */
static void mixed_dtypes(sg_ctx *ctx)
{
    int64_t M = 3, C = 8;
    const sg_dtype bf = SG_DTYPE_BF16, f32 = SG_DTYPE_F32;
    sg_tensor *xb = tu_tensor2(ctx, bf, M, C, "xb"), *yb = tu_tensor2(ctx, bf, M, C, "yb"),
              *dyb = tu_tensor2(ctx, bf, M, C, "dyb"), *dxb = tu_tensor2(ctx, bf, M, C, "dxb");
    sg_tensor *gb = tu_tensor1(ctx, bf, C, "gb"), *bb = tu_tensor1(ctx, bf, C, "bb"),
              *dgb = tu_tensor1(ctx, bf, C, "dgb"), *dbb = tu_tensor1(ctx, bf, C, "dbb");
    sg_tensor *xf = tu_tensor2(ctx, f32, M, C, "xf"), *yf = tu_tensor2(ctx, f32, M, C, "yf");
    sg_tensor *gf = tu_tensor1(ctx, f32, C, "gf"), *bf32 = tu_tensor1(ctx, f32, C, "bf32");
    sg_tensor *mean = tu_tensor1(ctx, f32, M, "mean"), *rstd = tu_tensor1(ctx, f32, M, "rstd"),
              *mb = tu_tensor1(ctx, bf, M, "mb");
    free(random_rows(xb, 1.0));
    free(tu_random(gb, -1, 1)), free(tu_random(bb, -1, 1)), free(tu_random(dyb, -1, 1));
    TU_FAILS(ctx, sg_layernorm_forward(ctx, xb, gf, bb, 1e-5f, yb, mean, rstd), SG_ERR_DTYPE,
             "sg_layernorm_forward: tensor 'gamma' is f32, expected bf16");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, xb, gb, bf32, 1e-5f, yb, mean, rstd), SG_ERR_DTYPE,
             "tensor 'beta' is f32, expected bf16");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, xb, gb, bb, 1e-5f, yf, mean, rstd), SG_ERR_DTYPE,
             "'x' is (3, 8) bf16 but 'y' is (3, 8) f32");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, xb, gb, bb, 1e-5f, yb, mb, rstd), SG_ERR_DTYPE,
             "tensor 'mean' is bf16, expected f32");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, xf, gb, bf32, 1e-5f, yf, mean, rstd), SG_ERR_DTYPE,
             "tensor 'gamma' is bf16, expected f32");
    TU_OK(ctx, sg_layernorm_forward(ctx, xb, gb, bb, 1e-5f, yb, mean, rstd));
    TU_FAILS(ctx, sg_layernorm_backward(ctx, xb, gf, mean, rstd, dyb, dxb, dgb, dbb),
             SG_ERR_DTYPE, "sg_layernorm_backward: tensor 'gamma' is f32, expected bf16");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, xb, gb, mean, mb, dyb, dxb, dgb, dbb), SG_ERR_DTYPE,
             "tensor 'rstd' is bf16, expected f32");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, xb, gb, mean, rstd, yf, dxb, dgb, dbb), SG_ERR_DTYPE,
             "'x' is (3, 8) bf16 but 'dy' is (3, 8) f32");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, xb, gb, mean, rstd, dyb, xf, dgb, dbb), SG_ERR_DTYPE,
             "'x' is (3, 8) bf16 but 'dx' is (3, 8) f32");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, xb, gb, mean, rstd, dyb, dxb, gf, dbb), SG_ERR_DTYPE,
             "tensor 'dgamma' is f32, expected bf16");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, xb, gb, mean, rstd, dyb, dxb, dgb, bf32),
             SG_ERR_DTYPE, "tensor 'dbeta' is f32, expected bf16");
    TU_OK(ctx, sg_layernorm_backward(ctx, xb, gb, mean, rstd, dyb, dxb, dgb, dbb));
    /* The fused forms: a sets the dtype (b, s), x sets it for dres. */
    TU_FAILS(ctx, sg_add_layernorm_forward(ctx, xb, xf, gb, bb, 1e-5f, dxb, yb, mean, rstd),
             SG_ERR_DTYPE, "sg_add_layernorm_forward: 'a' is (3, 8) bf16 but 'b' is (3, 8) f32");
    TU_FAILS(ctx, sg_add_layernorm_forward(ctx, xb, dyb, gb, bb, 1e-5f, yf, yb, mean, rstd),
             SG_ERR_DTYPE, "'a' is (3, 8) bf16 but 's' is (3, 8) f32");
    TU_FAILS(ctx, sg_add_layernorm_forward(ctx, xb, dyb, gf, bb, 1e-5f, dxb, yb, mean, rstd),
             SG_ERR_DTYPE, "tensor 'gamma' is f32, expected bf16");
    TU_OK(ctx, sg_add_layernorm_forward(ctx, xb, dyb, gb, bb, 1e-5f, dxb, yb, mean, rstd));
    TU_FAILS(ctx, sg_layernorm_backward_add(ctx, xb, gb, mean, rstd, dyb, xf, dxb, dgb, dbb),
             SG_ERR_DTYPE,
             "sg_layernorm_backward_add: 'x' is (3, 8) bf16 but 'dres' is (3, 8) f32");
    TU_OK(ctx, sg_layernorm_backward_add(ctx, xb, gb, mean, rstd, dyb, yb, dxb, dgb, dbb));
    sg_tensor *ts[] = {xb, yb, dyb, dxb, gb, bb, dgb, dbb, xf, yf, gf, bf32, mean, rstd, mb};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void cpu_errors(sg_ctx *ctx)
{
    int64_t M = 3, C = 5;
    sg_tensor *x = tu_tensor2(ctx, SG_DTYPE_F64, M, C, "x"),
              *y = tu_tensor2(ctx, SG_DTYPE_F64, M, C, "y");
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_F64, C, "gamma"),
              *b = tu_tensor1(ctx, SG_DTYPE_F64, C, "beta");
    sg_tensor *mean = tu_tensor1(ctx, SG_DTYPE_F64, M, "mean"),
              *rstd = tu_tensor1(ctx, SG_DTYPE_F64, M, "rstd");
    sg_tensor *dy = tu_tensor2(ctx, SG_DTYPE_F64, M, C, "dy"),
              *dx = tu_tensor2(ctx, SG_DTYPE_F64, M, C, "dx");
    sg_tensor *dg = tu_tensor1(ctx, SG_DTYPE_F64, C, "dgamma"),
              *db = tu_tensor1(ctx, SG_DTYPE_F64, C, "dbeta");
    sg_tensor *g6 = tu_tensor1(ctx, SG_DTYPE_F64, C + 1, "g6"),
              *b32 = tu_tensor1(ctx, SG_DTYPE_F32, C, "b32");
    sg_tensor *y36 = tu_tensor2(ctx, SG_DTYPE_F64, M, C + 1, "y36"),
              *m4 = tu_tensor1(ctx, SG_DTYPE_F64, M + 1, "m4");
    sg_tensor *mi = tu_tensor1(ctx, SG_DTYPE_I32, M, "mi"),
              *xb = tu_tensor2(ctx, SG_DTYPE_BF16, M, C, "xb");
    sg_tensor *x32 = tu_tensor2(ctx, SG_DTYPE_F32, M, C, "x32"),
              *y32 = tu_tensor2(ctx, SG_DTYPE_F32, M, C, "y32");
    sg_tensor *g32 = tu_tensor1(ctx, SG_DTYPE_F32, C, "g32"),
              *dx32 = tu_tensor2(ctx, SG_DTYPE_F32, M, C, "dx32");
    sg_tensor *g2d = tu_tensor2(ctx, SG_DTYPE_F64, 1, C, "g2d");
    double *xv = random_rows(x, 1.0), *gv = tu_random(g, -1, 1), *bv = tu_random(b, -1, 1);
    free(tu_random(dy, -1, 1));
    free(tu_random(x32, -1, 1));
    free(tu_random(g32, -1, 1));
    free(tu_random(b32, -1, 1));

    TU_FAILS(ctx, sg_layernorm_forward(ctx, NULL, g, b, 1e-5f, y, mean, rstd), SG_ERR_NULL,
             "sg_layernorm_forward: tensor 'x' is NULL");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, NULL, b, 1e-5f, y, mean, rstd), SG_ERR_NULL,
             "tensor 'gamma' is NULL");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g, NULL, 1e-5f, y, mean, rstd), SG_ERR_NULL,
             "tensor 'beta' is NULL");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g, b, 1e-5f, NULL, mean, rstd), SG_ERR_NULL,
             "tensor 'y' is NULL");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g, b, 1e-5f, y, mean, NULL), SG_ERR_NULL,
             "tensor 'rstd' is NULL");
    TU_CHECK(sg_layernorm_forward(NULL, x, g, b, 1e-5f, y, mean, rstd) == SG_ERR_NULL, "ctx NULL");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g6, b, 1e-5f, y, mean, rstd), SG_ERR_SHAPE,
             "'gamma' is (6) f64, expected (5) f64");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g2d, b, 1e-5f, y, mean, rstd), SG_ERR_SHAPE,
             "'gamma' is (1, 5) f64");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g, b32, 1e-5f, y, mean, rstd), SG_ERR_DTYPE,
             "tensor 'beta' is f32, expected f64");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g, b, 1e-5f, y36, mean, rstd), SG_ERR_SHAPE,
             "but 'y' is (3, 6) f64");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g, b, 1e-5f, y, m4, rstd), SG_ERR_SHAPE,
             "'mean' is (4) f64 but 'x' is (3, 5) f64; expected (3)");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g, b, 1e-5f, y, mean, mi), SG_ERR_DTYPE,
             "tensor 'rstd' is i32, expected f32 or f64");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x32, g32, b32, 1e-5f, y32, mean, rstd), SG_ERR_DTYPE,
             "tensor 'mean' is f64, expected f32");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, mi, g, b, 1e-5f, y, mean, rstd), SG_ERR_DTYPE,
             "tensor 'x' is i32, expected f32 or f64");
    /* bf16 x is taken (mixed precision); then gamma must be bf16 too. */
    TU_FAILS(ctx, sg_layernorm_forward(ctx, xb, g, b, 1e-5f, y, mean, rstd), SG_ERR_DTYPE,
             "tensor 'gamma' is f64, expected bf16");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g, b, -1e-3f, y, mean, rstd), SG_ERR_INVALID,
             "eps is -0.001");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g, b, NAN, y, mean, rstd), SG_ERR_INVALID,
             "expected a finite value >= 0");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g, b, 1e-5f, x, mean, rstd), SG_ERR_INVALID,
             "output 'y' overlaps 'x' in memory");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, g, b, 1e-5f, y, mean, mean), SG_ERR_INVALID,
             "output 'mean' overlaps 'rstd'");

    sg_ctx *other = tu_ctx(SG_BACKEND_CPU);
    sg_tensor *go = tu_tensor1(other, SG_DTYPE_F64, C, "gamma_other");
    TU_FAILS(ctx, sg_layernorm_forward(ctx, x, go, b, 1e-5f, y, mean, rstd), SG_ERR_BACKEND,
             "'gamma' (gamma_other) belongs to another context");

    /* The forward, for the backward's statistics; then the backward's argument errors. */
    TU_OK(ctx, sg_layernorm_forward(ctx, x, g, b, 1e-5f, y, mean, rstd));
    TU_FAILS(ctx, sg_layernorm_backward(ctx, x, g, mean, rstd, dy, dx, NULL, db), SG_ERR_NULL,
             "sg_layernorm_backward: tensor 'dgamma' is NULL");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, x, g, mean, rstd, NULL, dx, dg, db), SG_ERR_NULL,
             "tensor 'dy' is NULL");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, x, g, NULL, rstd, dy, dx, dg, db), SG_ERR_NULL,
             "tensor 'mean' is NULL");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, x, g, mean, rstd, y36, dx, dg, db), SG_ERR_SHAPE,
             "but 'dy' is (3, 6) f64");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, x, g, mean, rstd, dy, dx32, dg, db), SG_ERR_DTYPE,
             "but 'dx' is (3, 5) f32");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, x, g, mean, rstd, dy, dx, g6, db), SG_ERR_SHAPE,
             "'dgamma' is (6) f64, expected (5) f64");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, x, g, mean, m4, dy, dx, dg, db), SG_ERR_SHAPE,
             "'rstd' is (4) f64");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, x, g, mean, rstd, dy, dy, dg, db), SG_ERR_INVALID,
             "output 'dx' overlaps 'dy'");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, x, g, mean, rstd, dy, dx, dg, dg), SG_ERR_INVALID,
             "output 'dgamma' overlaps 'dbeta'");
    TU_FAILS(ctx, sg_layernorm_backward(ctx, x, g, mean, rstd, dy, dx, g, db), SG_ERR_INVALID,
             "output 'dgamma' overlaps 'gamma'");

    /* A failed call writes nothing. */
    TU_OK(ctx, sg_tensor_fill(dg, 12345.0));
    TU_FAILS(ctx, sg_layernorm_backward(ctx, x, g, mean, rstd, dy, dy, dg, db), SG_ERR_INVALID,
             "overlaps");
    TU_CHECK(sg_ld(dg, 0) == 12345.0 && sg_ld(dg, C - 1) == 12345.0, "a failed call wrote dgamma");

    /* The context is still usable, and computes the right thing. */
    tu_poison(y);
    TU_OK(ctx, sg_layernorm_forward(ctx, x, g, b, 1e-5f, y, mean, rstd));
    double ye[15], me[3], re[3];
    naive_layernorm(xv, gv, bv, M, C, 1e-5f, ye, me, re);
    tu_close_vals("layernorm after errors: y", y, ye, M * C, tu_tol_for(SG_DTYPE_F64));
    TU_OK(ctx, sg_layernorm_backward(ctx, x, g, mean, rstd, dy, dx, dg, db));
    TU_CHECK(isfinite(sg_ld(dg, 0)) && sg_ld(dg, 0) != 12345.0, "layernorm after errors: dgamma %g",
             sg_ld(dg, 0));
    free(xv), free(gv), free(bv);
    sg_tensor_destroy(go);
    sg_ctx_destroy(other);
    sg_tensor *ts[] = {x,   y,   g,  b,  mean, rstd, dy,  dx,  dg,   db, g6,
                       b32, y36, m4, mi, xb,   x32,  y32, g32, dx32, g2d};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* ---- the fused residual forms: sg_add_layernorm_forward, sg_layernorm_backward_add ---- */

/* Unit roundoff of a storage dtype: rounding to nearest moves a value by at most u |value|. */
static double unit_roundoff(sg_dtype dt)
{
    return dt == SG_DTYPE_F64 ? 0x1p-53 : dt == SG_DTYPE_F32 ? 0x1p-24 : 0x1p-8; /* bf16: 8 bits */
}

/* |got[i] - ref[i]| <= bound[i] for every i (NaN fails); the worst element printed. */
static void close_bounded(const char *what, const double *got, const double *ref,
                          const double *bound, int64_t n)
{
    int64_t worst = -1, bad = 0;
    double excess = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]) - bound[i];
        if (isnan(e)) e = INFINITY;
        if (e > 0) bad++;
        if (e > excess) excess = e, worst = i;
    }
    TU_CHECK(
        !bad,
        "%s: %lld of %lld elements outside their bound; worst [%lld] got %.9g ref %.9g bound %.3g",
        what, (long long)bad, (long long)n, (long long)worst, got[worst], ref[worst], bound[worst]);
}

/* Tensor t against ref (n values) within bound, labelled "<what> <name>". */
static void check_bounded(const char *what, const char *name, const sg_tensor *t, const double *ref,
                          const double *bound, int64_t n)
{
    char w[200];
    snprintf(w, sizeof w, "%s %s", what, name);
    double *got = tu_get(t);
    close_bounded(w, got, ref, bound, n);
    free(got);
}

/* LayerNorm's backward written out from the definition, from given statistics (the saved
 * ones, as the op reads them): dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma;
 * dgamma = sum_r dy xhat, dbeta = sum_r dy. */
static void naive_layernorm_backward(const double *x, const double *gam, const double *mean,
                                     const double *rstd, const double *dy, int64_t M, int64_t C,
                                     double *dx, double *dg, double *db)
{
    for (int64_t c = 0; c < C; c++) dg[c] = db[c] = 0;
    for (int64_t r = 0; r < M; r++) {
        const double *xr = x + r * C, *dyr = dy + r * C;
        double sg = 0, sgx = 0;
        for (int64_t c = 0; c < C; c++) {
            double xhat = (xr[c] - mean[r]) * rstd[r], g = dyr[c] * gam[c];
            sg += g, sgx += g * xhat;
            dg[c] += dyr[c] * xhat, db[c] += dyr[c];
        }
        for (int64_t c = 0; c < C; c++) {
            double xhat = (xr[c] - mean[r]) * rstd[r];
            dx[r * C + c] = rstd[r] * (dyr[c] * gam[c] - sg / C - xhat * sgx / C);
        }
    }
}

/* The fused op's tensors for (M, C) in dt (mean and rstd f32, or f64 with f64), inputs fresh
 * and random, never zero: a with an offset per row (so the mean is not ~0), b, gamma, beta,
 * dy, dres. odd: a, b and dres are views one element into a buffer (not 16-byte aligned),
 * while s, y, dx and the rest are aligned, so the kernels keep their 16-byte path for those
 * and read a, b, dres element by element (the fused ops' own case). */
typedef struct fused_t {
    sg_ctx *ctx;
    sg_dtype dt;
    int64_t M, C;
    sg_tensor *a, *b, *g, *beta, *dy, *dres;       /* inputs */
    sg_tensor *s, *y, *mean, *rstd, *dx, *dg, *db; /* outputs */
    sg_tensor *base[3];                            /* the buffers of odd views, or NULL */
    float eps;
} fused_t;

static fused_t fused_make(sg_ctx *ctx, int64_t M, int64_t C, sg_dtype dt, bool odd)
{
    fused_t f = {.ctx = ctx, .dt = dt, .M = M, .C = C};
    const int64_t sh[2] = {M, C};
    const sg_dtype st = dt == SG_DTYPE_F64 ? SG_DTYPE_F64 : SG_DTYPE_F32;
    f.a = tu_maybe_view(ctx, dt, 2, sh, odd, "a", &f.base[0]);
    f.b = tu_maybe_view(ctx, dt, 2, sh, odd, "b", &f.base[1]);
    f.dres = tu_maybe_view(ctx, dt, 2, sh, odd, "dres", &f.base[2]);
    f.g = tu_tensor1(ctx, dt, C, "gamma"), f.beta = tu_tensor1(ctx, dt, C, "beta");
    f.dy = tu_tensor2(ctx, dt, M, C, "dy");
    f.s = tu_tensor2(ctx, dt, M, C, "s"), f.y = tu_tensor2(ctx, dt, M, C, "y");
    f.dx = tu_tensor2(ctx, dt, M, C, "dx");
    f.mean = tu_tensor1(ctx, st, M, "mean"), f.rstd = tu_tensor1(ctx, st, M, "rstd");
    f.dg = tu_tensor1(ctx, dt, C, "dgamma"), f.db = tu_tensor1(ctx, dt, C, "dbeta");
    free(random_rows(f.a, 2.0));
    free(tu_random(f.b, -1, 1));
    free(tu_random(f.g, -1.5, 1.5));
    free(tu_random(f.beta, -1, 1));
    free(tu_random(f.dy, -1, 1));
    free(tu_random(f.dres, -1, 1));
    f.eps = (float)tu_uniform(1e-5, 1e-3);
    return f;
}

static void fused_free(fused_t *f)
{
    sg_tensor *ts[] = {f->a,    f->b,    f->g,  f->beta, f->dy, f->dres,    f->s,       f->y,
                       f->mean, f->rstd, f->dx, f->dg,   f->db, f->base[0], f->base[1], f->base[2]};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void fused_forward(fused_t *f)
{
    tu_poison(f->s), tu_poison(f->y), tu_poison(f->mean), tu_poison(f->rstd);
    TU_OK(f->ctx, sg_add_layernorm_forward(f->ctx, f->a, f->b, f->g, f->beta, f->eps, f->s, f->y,
                                           f->mean, f->rstd));
}

/* The backward of the stored s, with the forward's statistics. */
static void fused_backward(fused_t *f)
{
    tu_poison(f->dx), tu_poison(f->dg), tu_poison(f->db);
    TU_OK(f->ctx, sg_layernorm_backward_add(f->ctx, f->s, f->g, f->mean, f->rstd, f->dy, f->dres,
                                            f->dx, f->dg, f->db));
}

/* L = sum(r y) + sum(q s) with s = a + b, y = LayerNorm(s): dL/ds = LN's backward of r plus q,
 * which is sg_layernorm_backward_add with dy = r and dres = q; and dL/da = dL/db = dL/ds. So
 * finite differences through the fused forward alone check the fused backward. */
static double fused_loss(void *u)
{
    fused_t *f = u;
    TU_OK(f->ctx, sg_add_layernorm_forward(f->ctx, f->a, f->b, f->g, f->beta, f->eps, f->s, f->y,
                                           f->mean, f->rstd));
    return tu_dot(f->y, f->dy) + tu_dot(f->s, f->dres);
}

/* f64: the forward against the formula (s exactly a + b: both sides add the same two doubles),
 * then finite differences of dx (through a and through b), dgamma and dbeta. */
static void cpu_fused_gradcheck(sg_ctx *ctx, int64_t M, int64_t C)
{
    fused_t f = fused_make(ctx, M, C, SG_DTYPE_F64, false);
    char w[160];
    fused_forward(&f);
    double *av = tu_get(f.a), *bv = tu_get(f.b), *gv = tu_get(f.g), *bev = tu_get(f.beta);
    double *sv = malloc((size_t)(M * C) * sizeof *sv), *ye = malloc((size_t)(M * C) * sizeof *ye),
           *me = malloc((size_t)M * sizeof *me), *re = malloc((size_t)M * sizeof *re);
    for (int64_t i = 0; i < M * C; i++) sv[i] = av[i] + bv[i];
    naive_layernorm(sv, gv, bev, M, C, f.eps, ye, me, re);
    snprintf(w, sizeof w, "add+layernorm f64 (%lld,%lld) s vs a + b", (long long)M, (long long)C);
    tu_close_vals(w, f.s, sv, M * C, (tu_tol){0, 0});
    snprintf(w, sizeof w, "add+layernorm f64 (%lld,%lld) y vs formula", (long long)M, (long long)C);
    tu_close_vals(w, f.y, ye, M * C, tu_tol_for(SG_DTYPE_F64));
    snprintf(w, sizeof w, "add+layernorm f64 (%lld,%lld) rstd vs formula", (long long)M,
             (long long)C);
    tu_close_vals(w, f.rstd, re, M, tu_tol_for(SG_DTYPE_F64));

    fused_backward(&f);
    /* h = 1e-5: truncation ~h^2 f''' and rounding ~1e-16 |L| / h both stay under 1e-8 (the
     * q s term is linear: its differences are exact). */
    tu_tol tol = {1e-8, 1e-6};
    sg_tensor *wrt[4] = {f.a, f.b, f.g, f.beta}, *grad[4] = {f.dx, f.dx, f.dg, f.db};
    const char *names[4] = {"dx (through a)", "dx (through b)", "dgamma", "dbeta"};
    for (int i = 0; i < 4; i++) {
        char gw[96]; /* tu_gradcheck appends to it, in 160 bytes */
        snprintf(gw, sizeof gw, "add+layernorm f64 (%lld,%lld) %s", (long long)M, (long long)C,
                 names[i]);
        tu_gradcheck(gw, fused_loss, &f, wrt[i], grad[i], 0, 1e-5, tol);
    }
    free(av), free(bv), free(gv), free(bev), free(sv), free(ye), free(me), free(re);
    fused_free(&f);
}

/* f32 and bf16 on the CPU against float64 computed here from the same stored values, each
 * output within the roundings the reference makes (u = the dtype's unit roundoff; at = 1e-10
 * for the double arithmetic, which the two sides order differently: sums of C <= 300 terms of
 * size <= ~10, times rstd <= ~10, differ by under 1e-12):
 *   s: one rounding of a + b: u |a + b|.  y: one rounding of the double result: u |y|.
 *   mean, rstd: stored in f32: 2^-24 |value|.  dgamma, dbeta: one rounding: u |value|.
 *   dx: LayerNorm's dx rounded (u |ln|), added to dres and rounded again (u times the sum,
 *   which is within u |ln| of dres + ln). */
static void cpu_fused_dtype(sg_ctx *ctx, sg_dtype dt, int64_t M, int64_t C)
{
    const double u = unit_roundoff(dt), u32 = 0x1p-24, at = 1e-10;
    const int64_t n = M * C;
    char what[96];
    snprintf(what, sizeof what, "add+layernorm %s cpu (%lld,%lld)", sg_dtype_name(dt), (long long)M,
             (long long)C);
    fused_t f = fused_make(ctx, M, C, dt, false);
    fused_forward(&f);
    double *av = tu_get(f.a), *bv = tu_get(f.b), *gv = tu_get(f.g), *bev = tu_get(f.beta);
    double *sv = tu_get(f.s), *sum = calloc((size_t)n, sizeof *sum),
           *bound = calloc((size_t)n, sizeof *bound);
    for (int64_t i = 0; i < n; i++) sum[i] = av[i] + bv[i], bound[i] = u * fabs(sum[i]);
    check_bounded(what, "s vs a + b", f.s, sum, bound, n);

    /* y, mean, rstd: the formula on s as stored (the op normalises the rounded sum). */
    double *ye = malloc((size_t)n * sizeof *ye), *me = malloc((size_t)M * sizeof *me),
           *re = malloc((size_t)M * sizeof *re);
    naive_layernorm(sv, gv, bev, M, C, f.eps, ye, me, re);
    for (int64_t i = 0; i < n; i++) bound[i] = u * fabs(ye[i]) + at;
    check_bounded(what, "y vs formula", f.y, ye, bound, n);
    for (int64_t r = 0; r < M; r++) bound[r] = u32 * fabs(me[r]) + at;
    check_bounded(what, "mean vs formula", f.mean, me, bound, M);
    for (int64_t r = 0; r < M; r++) bound[r] = u32 * fabs(re[r]) + at;
    check_bounded(what, "rstd vs formula", f.rstd, re, bound, M);

    /* The backward from the saved (f32) statistics, as the op reads them. */
    fused_backward(&f);
    double *mv = tu_get(f.mean), *rv = tu_get(f.rstd), *dyv = tu_get(f.dy), *dresv = tu_get(f.dres);
    double *ln = malloc((size_t)n * sizeof *ln), *dxe = malloc((size_t)n * sizeof *dxe),
           *dge = malloc((size_t)C * sizeof *dge), *dbe = malloc((size_t)C * sizeof *dbe);
    naive_layernorm_backward(sv, gv, mv, rv, dyv, M, C, ln, dge, dbe);
    for (int64_t i = 0; i < n; i++) {
        dxe[i] = dresv[i] + ln[i];
        bound[i] = u * fabs(ln[i]) + u * (fabs(dxe[i]) + u * fabs(ln[i])) + at;
    }
    check_bounded(what, "dx vs dres + formula", f.dx, dxe, bound, n);
    for (int64_t c = 0; c < C; c++) bound[c] = u * fabs(dge[c]) + at;
    check_bounded(what, "dgamma vs formula", f.dg, dge, bound, C);
    for (int64_t c = 0; c < C; c++) bound[c] = u * fabs(dbe[c]) + at;
    check_bounded(what, "dbeta vs formula", f.db, dbe, bound, C);

    double *hs[] = {av, bv, gv, bev, sv,    sum, bound, ye,  me,
                    re, mv, rv, dyv, dresv, ln,  dxe,   dge, dbe};
    for (size_t k = 0; k < sizeof hs / sizeof *hs; k++) free(hs[k]);
    fused_free(&f);
}

/* A case's name for messages: "<op> <backend> <dtype> (M,C)<odd><tail>". */
static void case_label(char *w, size_t n, const char *op, const sg_ctx *ctx, sg_dtype dt, int64_t M, int64_t C,
                       const char *odd, const char *tail)
{
    snprintf(w, n, "%s %s %s (%lld,%lld)%s%s", op, ctx->backend == SG_BACKEND_CPU ? "cpu" : "gpu",
             sg_dtype_name(dt), (long long)M, (long long)C, odd, tail);
}

/* Are two tensors equal bit for bit? (what: the comparison, for the message) */
static void same_bits(const char *what, const sg_tensor *a, const sg_tensor *b)
{
    void *x = tu_raw(a);
    TU_CHECK(tu_same_bytes(b, x), "%s: '%s' and '%s' differ", what, a->name, b->name);
    free(x);
}

/* The fused ops against the pair they replace, on ctx's backend, in dt: sg_add_forward then
 * sg_layernorm_forward; sg_layernorm_backward then sg_add_forward(dres, dx). Bit for bit, as
 * documented. Also: dres NULL is sg_layernorm_backward, bit for bit; a call twice gives the
 * same bits; and on the GPU, one launch forward and two backward. */
static void fused_vs_pair(sg_ctx *ctx, int64_t M, int64_t C, sg_dtype dt, bool odd)
{
    char what[160];
    case_label(what, sizeof what, "add+layernorm", ctx, dt, M, C, odd ? " unaligned a, b, dres" : "",
               " vs the unfused pair");
    fused_t f = fused_make(ctx, M, C, dt, odd);
    const sg_dtype st = f.mean->dtype;
    sg_tensor *s2 = tu_tensor2(ctx, dt, M, C, "s_pair"), *y2 = tu_tensor2(ctx, dt, M, C, "y_pair"),
              *m2 = tu_tensor1(ctx, st, M, "mean_pair"), *r2 = tu_tensor1(ctx, st, M, "rstd_pair"),
              *ln = tu_tensor2(ctx, dt, M, C, "ln_dx_pair"),
              *dx2 = tu_tensor2(ctx, dt, M, C, "dx_pair"),
              *dg2 = tu_tensor1(ctx, dt, C, "dgamma_pair"),
              *db2 = tu_tensor1(ctx, dt, C, "dbeta_pair");
    sg_tensor *outs[] = {f.s, f.y, f.mean, f.rstd, f.dx, f.dg, f.db};
    for (int i = 0; i < 7; i++) tu_poison(outs[i]); /* before counting: a fill is a launch */
    uint64_t n0 = sg_ctx_launch_count(ctx);
    TU_OK(ctx,
          sg_add_layernorm_forward(ctx, f.a, f.b, f.g, f.beta, f.eps, f.s, f.y, f.mean, f.rstd));
    uint64_t n1 = sg_ctx_launch_count(ctx);
    TU_OK(ctx,
          sg_layernorm_backward_add(ctx, f.s, f.g, f.mean, f.rstd, f.dy, f.dres, f.dx, f.dg, f.db));
    uint64_t n2 = sg_ctx_launch_count(ctx);
    void *first[2] = {tu_raw(f.y), tu_raw(f.dx)};
    if (ctx->backend == SG_BACKEND_CUDA) {
        TU_CHECK(n1 - n0 == 1, "%s: the fused forward made %llu launches, expected 1", what,
                 (unsigned long long)(n1 - n0));
        TU_CHECK(n2 - n1 == 2, "%s: the fused backward made %llu launches, expected 2", what,
                 (unsigned long long)(n2 - n1));
    }
    sg_tensor *o2[] = {s2, y2, m2, r2, ln, dx2, dg2, db2};
    for (size_t i = 0; i < sizeof o2 / sizeof *o2; i++) tu_poison(o2[i]);
    TU_OK(ctx, sg_add_forward(ctx, f.a, f.b, s2));
    TU_OK(ctx, sg_layernorm_forward(ctx, s2, f.g, f.beta, f.eps, y2, m2, r2));
    same_bits(what, f.s, s2), same_bits(what, f.y, y2), same_bits(what, f.mean, m2),
        same_bits(what, f.rstd, r2);
    TU_OK(ctx, sg_layernorm_backward(ctx, f.s, f.g, f.mean, f.rstd, f.dy, ln, dg2, db2));
    TU_OK(ctx, sg_add_forward(ctx, f.dres, ln, dx2));
    same_bits(what, f.dx, dx2), same_bits(what, f.dg, dg2), same_bits(what, f.db, db2);

    /* dres NULL: LayerNorm's backward alone. */
    tu_poison(f.dx), tu_poison(f.dg), tu_poison(f.db);
    TU_OK(ctx,
          sg_layernorm_backward_add(ctx, f.s, f.g, f.mean, f.rstd, f.dy, NULL, f.dx, f.dg, f.db));
    same_bits(what, f.dx, ln), same_bits(what, f.dg, dg2), same_bits(what, f.db, db2);

    /* Again: the same bits. */
    fused_forward(&f);
    fused_backward(&f);
    TU_CHECK(tu_same_bytes(f.y, first[0]) && tu_same_bytes(f.dx, first[1]),
             "%s: two identical runs differ", what);
    free(first[0]), free(first[1]);
    tu_destroy_all(o2, sizeof o2 / sizeof *o2);
    fused_free(&f);
}

/* sg_layernorm_backward_add_sums on ctx's backend, fresh inputs: dx, dgamma and dbeta bit for
 * bit sg_layernorm_backward_add's (the same kernels' sums, two more beside them); dres_sum and
 * dx_sum against the host's column sums of dres and of dx as the op stored it. Bound: one
 * rounding to dt, u |sum|, plus the two double sums' own errors (each adds M terms in some
 * order, so each is within (M - 1) 2^-53 sum|terms| of the exact sum: 2 M 2^-53 sum|terms|
 * covers both). With one of the two NULL the other has the same bits and the NULL one's
 * tensor stays poisoned; two launches on the GPU; the call again, the same bits. */
static void sums_case(sg_ctx *ctx, int64_t M, int64_t C, sg_dtype dt, bool odd)
{
    char what[160];
    case_label(what, sizeof what, "layernorm_backward_add_sums", ctx, dt, M, C, odd ? " unaligned dres" : "", "");
    fused_t f = fused_make(ctx, M, C, dt, odd);
    fused_forward(&f);
    fused_backward(&f);
    void *dx0 = tu_raw(f.dx), *dg0 = tu_raw(f.dg), *db0 = tu_raw(f.db);
    sg_tensor *rs = tu_tensor1(ctx, dt, C, "dres_sum"), *xs = tu_tensor1(ctx, dt, C, "dx_sum");
    tu_poison(f.dx), tu_poison(f.dg), tu_poison(f.db), tu_poison(rs), tu_poison(xs);
    const uint64_t n0 = sg_ctx_launch_count(ctx);
    TU_OK(ctx, sg_layernorm_backward_add_sums(ctx, f.s, f.g, f.mean, f.rstd, f.dy, f.dres, f.dx, f.dg,
                                              f.db, rs, xs));
    const uint64_t n1 = sg_ctx_launch_count(ctx);
    if (ctx->backend == SG_BACKEND_CUDA)
        TU_CHECK(n1 - n0 == 2, "%s: %llu launches, expected 2", what, (unsigned long long)(n1 - n0));
    TU_CHECK(tu_same_bytes(f.dx, dx0), "%s: dx differs from sg_layernorm_backward_add's", what);
    TU_CHECK(tu_same_bytes(f.dg, dg0), "%s: dgamma differs from sg_layernorm_backward_add's", what);
    TU_CHECK(tu_same_bytes(f.db, db0), "%s: dbeta differs from sg_layernorm_backward_add's", what);

    const double u = unit_roundoff(dt);
    double *rv = tu_get(f.dres), *xv = tu_get(f.dx);
    double *want = malloc((size_t)C * sizeof *want), *bound = malloc((size_t)C * sizeof *bound);
    for (int k = 0; k < 2; k++) {
        const double *v = k ? xv : rv;
        for (int64_t c = 0; c < C; c++) {
            double t = 0, a = 0;
            for (int64_t r = 0; r < M; r++) t += v[r * C + c], a += fabs(v[r * C + c]);
            want[c] = t, bound[c] = u * fabs(t) + 2.0 * (double)M * 0x1p-53 * a;
        }
        check_bounded(what, k ? "dx_sum vs the host's sums of dx" : "dres_sum vs the host's sums of dres",
                      k ? xs : rs, want, bound, C);
    }
    void *rs0 = tu_raw(rs), *xs0 = tu_raw(xs);
    for (int k = 0; k < 2; k++) { /* one sum at a time */
        tu_poison(rs), tu_poison(xs);
        TU_OK(ctx, sg_layernorm_backward_add_sums(ctx, f.s, f.g, f.mean, f.rstd, f.dy, f.dres, f.dx, f.dg,
                                                  f.db, k ? NULL : rs, k ? xs : NULL));
        sg_tensor *on = k ? xs : rs, *off = k ? rs : xs;
        TU_CHECK(tu_same_bytes(on, k ? xs0 : rs0), "%s: %s alone differs from both together", what, on->name);
        double *ov = tu_get(off);
        int64_t written = 0;
        for (int64_t c = 0; c < C; c++) written += !isnan(ov[c]);
        TU_CHECK(written == 0, "%s: %lld of %lld values of %s written when it was NULL", what,
                 (long long)written, (long long)C, off->name);
        free(ov);
    }
    TU_CHECK(tu_same_bytes(f.dx, dx0) && tu_same_bytes(f.dg, dg0) && tu_same_bytes(f.db, db0),
             "%s: the calls with one sum differ from sg_layernorm_backward_add's", what);
    void *ptrs[] = {dx0, dg0, db0, rs0, xs0, rv, xv, want, bound};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) free(ptrs[i]);
    sg_tensor *ts[] = {rs, xs};
    tu_destroy_all(ts, 2);
    fused_free(&f);
}

/* Refusals of the fused ops, each naming what is wrong; a refused call writes nothing; the
 * context computes afterwards. */
static void cpu_fused_errors(sg_ctx *ctx)
{
    const int64_t M = 3, C = 5;
    const sg_dtype d = SG_DTYPE_F64;
    fused_t f = fused_make(ctx, M, C, d, false);
    sg_tensor *b36 = tu_tensor2(ctx, d, M, C + 1, "b36"),
              *b32 = tu_tensor2(ctx, SG_DTYPE_F32, M, C, "b32"),
              *g6 = tu_tensor1(ctx, d, C + 1, "g6"), *m4 = tu_tensor1(ctx, d, M + 1, "m4");
    const char *fw = "sg_add_layernorm_forward: ", *bw = "sg_layernorm_backward_add: ";
    char want[160];
#define FWD(a_, b_, s_, y_, m_)                                                                    \
    sg_add_layernorm_forward(ctx, a_, b_, f.g, f.beta, 1e-5f, s_, y_, m_, f.rstd)
#define BWD(dy_, dres_, dx_)                                                                       \
    sg_layernorm_backward_add(ctx, f.s, f.g, f.mean, f.rstd, dy_, dres_, dx_, f.dg, f.db)
    TU_CHECK(sg_add_layernorm_forward(NULL, f.a, f.b, f.g, f.beta, 1e-5f, f.s, f.y, f.mean,
                                      f.rstd) == SG_ERR_NULL,
             "ctx NULL");
    snprintf(want, sizeof want, "%stensor 'a' is NULL", fw);
    TU_FAILS(ctx, FWD(NULL, f.b, f.s, f.y, f.mean), SG_ERR_NULL, want);
    TU_FAILS(ctx, FWD(f.a, NULL, f.s, f.y, f.mean), SG_ERR_NULL, "tensor 'b' is NULL");
    TU_FAILS(ctx, FWD(f.a, f.b, NULL, f.y, f.mean), SG_ERR_NULL, "tensor 's' is NULL");
    TU_FAILS(ctx, FWD(f.a, f.b, f.s, NULL, f.mean), SG_ERR_NULL, "tensor 'y' is NULL");
    TU_FAILS(ctx, FWD(f.a, b36, f.s, f.y, f.mean), SG_ERR_SHAPE,
             "'a' is (3, 5) f64 but 'b' is (3, 6) f64");
    TU_FAILS(ctx, FWD(f.a, b32, f.s, f.y, f.mean), SG_ERR_DTYPE,
             "'a' is (3, 5) f64 but 'b' is (3, 5) f32");
    TU_FAILS(ctx, FWD(f.a, f.b, b36, f.y, f.mean), SG_ERR_SHAPE, "but 's' is (3, 6) f64");
    TU_FAILS(ctx, FWD(f.a, f.b, f.s, b36, f.mean), SG_ERR_SHAPE, "but 'y' is (3, 6) f64");
    TU_FAILS(ctx, FWD(f.a, f.b, f.s, f.y, m4), SG_ERR_SHAPE,
             "'mean' is (4) f64 but 'a' is (3, 5) f64; expected (3)");
    TU_FAILS(ctx,
             sg_add_layernorm_forward(ctx, f.a, f.b, g6, f.beta, 1e-5f, f.s, f.y, f.mean, f.rstd),
             SG_ERR_SHAPE, "'gamma' is (6) f64, expected (5) f64");
    TU_FAILS(ctx,
             sg_add_layernorm_forward(ctx, f.a, f.b, f.g, f.beta, NAN, f.s, f.y, f.mean, f.rstd),
             SG_ERR_INVALID, "sg_add_layernorm_forward: eps is nan, expected a finite value >= 0");
    TU_FAILS(ctx, FWD(f.a, f.b, f.a, f.y, f.mean), SG_ERR_INVALID,
             "output 's' overlaps 'a' in memory");
    TU_FAILS(ctx, FWD(f.a, f.b, f.b, f.y, f.mean), SG_ERR_INVALID,
             "output 's' overlaps 'b' in memory");
    TU_FAILS(ctx, FWD(f.a, f.b, f.s, f.s, f.mean), SG_ERR_INVALID,
             "output 'y' overlaps 's' in memory");
    TU_FAILS(ctx, FWD(f.a, f.b, f.s, f.y, f.rstd), SG_ERR_INVALID, "output 'mean' overlaps 'rstd'");

    /* a and b may be one tensor (inputs may share memory): s = 2a exactly. */
    TU_OK(ctx, FWD(f.a, f.a, f.s, f.y, f.mean));
    double *av = tu_get(f.a), *sv = tu_get(f.s);
    for (int64_t i = 0; i < M * C; i++)
        TU_CHECK(sv[i] == 2 * av[i], "a + a: s[%lld] = %g, a = %g", (long long)i, sv[i], av[i]);
    free(av), free(sv);

    snprintf(want, sizeof want, "%stensor 'dy' is NULL", bw);
    TU_FAILS(ctx, BWD(NULL, f.dres, f.dx), SG_ERR_NULL, want);
    TU_FAILS(ctx, BWD(f.dy, f.dres, NULL), SG_ERR_NULL, "tensor 'dx' is NULL");
    TU_FAILS(ctx, BWD(f.dy, b36, f.dx), SG_ERR_SHAPE, "'x' is (3, 5) f64 but 'dres' is (3, 6) f64");
    TU_FAILS(ctx, BWD(f.dy, b32, f.dx), SG_ERR_DTYPE, "'x' is (3, 5) f64 but 'dres' is (3, 5) f32");
    TU_FAILS(ctx, BWD(f.dy, f.dres, f.dres), SG_ERR_INVALID,
             "output 'dx' overlaps 'dres' in memory");
    TU_FAILS(ctx, BWD(f.dy, f.dres, f.dy), SG_ERR_INVALID, "output 'dx' overlaps 'dy' in memory");
    TU_FAILS(ctx,
             sg_layernorm_backward_add(ctx, f.s, f.g, m4, f.rstd, f.dy, f.dres, f.dx, f.dg, f.db),
             SG_ERR_SHAPE, "sg_layernorm_backward_add: 'mean' is (4) f64 but 'x' is (3, 5) f64");
    /* A refused call writes nothing. */
    TU_OK(ctx, sg_tensor_fill(f.dx, 12345.0));
    TU_FAILS(ctx, BWD(f.dy, f.dres, f.dres), SG_ERR_INVALID, "overlaps");
    double *dxv = tu_get(f.dx);
    for (int64_t i = 0; i < M * C; i++)
        TU_CHECK(dxv[i] == 12345.0, "a refused call wrote dx[%lld]", (long long)i);
    free(dxv);
    /* dres may be dy (inputs may share memory): dx = dy + LayerNorm's dx. */
    TU_OK(ctx, BWD(f.dy, f.dy, f.dx));
    /* The sums' form: dres required, the sums (C) of x's dtype, outputs apart. */
    sg_tensor *rs = tu_tensor1(ctx, d, C, "rs"), *xs = tu_tensor1(ctx, d, C, "xs"),
              *rs32 = tu_tensor1(ctx, SG_DTYPE_F32, C, "rs32");
#define SUMS(dres_, rs_, xs_)                                                                      \
    sg_layernorm_backward_add_sums(ctx, f.s, f.g, f.mean, f.rstd, f.dy, dres_, f.dx, f.dg, f.db, rs_, xs_)
    TU_FAILS(ctx, SUMS(NULL, rs, xs), SG_ERR_NULL, "sg_layernorm_backward_add_sums: tensor 'dres' is NULL");
    TU_FAILS(ctx, SUMS(f.dres, g6, xs), SG_ERR_SHAPE,
             "sg_layernorm_backward_add_sums: 'dres_sum' is (6) f64, expected (5) f64");
    TU_FAILS(ctx, SUMS(f.dres, rs, rs32), SG_ERR_DTYPE, "'dx_sum'");
    TU_FAILS(ctx, SUMS(f.dres, f.dg, xs), SG_ERR_INVALID, "output 'dgamma' overlaps 'dres_sum' in memory");
    TU_FAILS(ctx, SUMS(f.dres, rs, rs), SG_ERR_INVALID, "output 'dres_sum' overlaps 'dx_sum' in memory");
    TU_FAILS(ctx, SUMS(f.dres, rs, f.g), SG_ERR_INVALID, "output 'dx_sum' overlaps 'gamma' in memory");
    TU_OK(ctx, sg_tensor_fill(rs, 12345.0));
    TU_FAILS(ctx, SUMS(f.dres, rs, rs), SG_ERR_INVALID, "overlaps");
    double *rsv = tu_get(rs);
    for (int64_t c = 0; c < C; c++) TU_CHECK(rsv[c] == 12345.0, "a refused call wrote dres_sum[%lld]", (long long)c);
    free(rsv);
    sg_tensor *es[] = {rs, xs, rs32};
    tu_destroy_all(es, 3);
#undef SUMS
#undef FWD
#undef BWD
    /* The context still computes: the pair's bits, as above. */
    fused_vs_pair(ctx, M, C, d, false);
    sg_tensor *ts[] = {b36, b32, g6, m4};
    tu_destroy_all(ts, 4);
    fused_free(&f);
}

/* ---- capture: the op recorded into a graph (CPU: a plan) replays what eager computes ---- */

/* The plain op, then the fused ones: s = x + x2 normalised, and its backward adding dres. */
typedef struct ln_step {
    sg_ctx *ctx;
    const sg_tensor *x, *g, *b, *dy, *x2, *dres;
    sg_tensor *o[13]; /* y, mean, rstd, dx, dgamma, dbeta; s, y, mean, rstd, dx, dgamma, dbeta */
} ln_step;

static sg_status ln_step_fn(void *u)
{
    ln_step *s = u;
    sg_tensor **o = s->o;
    SG_TRY(sg_layernorm_forward(s->ctx, s->x, s->g, s->b, 1e-5f, o[0], o[1], o[2]));
    SG_TRY(sg_layernorm_backward(s->ctx, s->x, s->g, o[1], o[2], s->dy, o[3], o[4], o[5]));
    SG_TRY(
        sg_add_layernorm_forward(s->ctx, s->x, s->x2, s->g, s->b, 1e-5f, o[6], o[7], o[8], o[9]));
    return sg_layernorm_backward_add(s->ctx, o[6], s->g, o[8], o[9], s->dy, s->dres, o[10], o[11],
                                     o[12]);
}

static void poison_step(ln_step *s)
{
    for (int i = 0; i < 13; i++) tu_poison(s->o[i]);
}

/* Two sets of outputs (eager, graph) compared bit for bit, for two input fills. dt: f32 or
 * bf16 (the statistics f32 either way). */
static void capture_case(sg_ctx *ctx, int64_t M, int64_t C, sg_dtype dt)
{
    sg_tensor *x = tu_tensor2(ctx, dt, M, C, "x"), *dy = tu_tensor2(ctx, dt, M, C, "dy");
    sg_tensor *x2 = tu_tensor2(ctx, dt, M, C, "x2"), *dres = tu_tensor2(ctx, dt, M, C, "dres");
    sg_tensor *g = tu_tensor1(ctx, dt, C, "gamma"), *b = tu_tensor1(ctx, dt, C, "beta");
    ln_step e = {.ctx = ctx, .x = x, .g = g, .b = b, .dy = dy, .x2 = x2, .dres = dres}, r = e;
    ln_step *both[2] = {&e, &r};
    static const char *const on[13] = {"y",          "mean",       "rstd",     "dx",
                                       "dgamma",     "dbeta",      "s",        "fused.y",
                                       "fused.mean", "fused.rstd", "fused.dx", "fused.dgamma",
                                       "fused.dbeta"};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 13; i++) {
            bool row = i == 1 || i == 2 || i == 8 || i == 9, col = i == 4 || i == 5 || i > 10;
            both[k]->o[i] = row   ? tu_tensor1(ctx, SG_DTYPE_F32, M, on[i])
                            : col ? tu_tensor1(ctx, dt, C, on[i])
                                  : tu_tensor2(ctx, dt, M, C, on[i]);
        }
    free(random_rows(x, 2.0));
    free(tu_random(dy, -1, 1));
    free(tu_random(x2, -1, 1));
    free(tu_random(dres, -1, 1));
    free(tu_random(g, -1.5, 1.5));
    free(tu_random(b, -1, 1));

    const sg_tensor *ins[4] = {x, dy, x2, dres};
    sg_graph_options o = sg_graph_options_default();
    o.name = "layernorm";
    o.warmup = 1;
    o.static_inputs = ins;
    o.n_static_inputs = 4;
    sg_graph *graph = NULL;
    TU_OK(ctx, sg_graph_capture(ctx, ln_step_fn, &r, &o, &graph));
    for (int round = 0; round < 2; round++) {
        if (round) { /* new inputs, refilled in place */
            free(random_rows(x, 2.0));
            free(tu_random(dy, -1, 1));
            free(tu_random(x2, -1, 1));
            free(tu_random(dres, -1, 1));
        }
        poison_step(&e), poison_step(&r);
        TU_OK(ctx, ln_step_fn(&e));
        TU_OK(ctx, sg_graph_replay(graph));
        for (int i = 0; i < 13; i++) {
            char w[128];
            snprintf(w, sizeof w, "layernorm %s (%lld,%lld) replay %d: %s vs eager",
                     sg_dtype_name(dt), (long long)M, (long long)C, round, e.o[i]->name);
            tu_close_tensors(w, r.o[i], e.o[i], (tu_tol){0, 0});
        }
    }
    sg_graph_destroy(graph);
    sg_tensor *ts[] = {x, dy, x2, dres, g, b};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
    tu_destroy_all(e.o, 13), tu_destroy_all(r.o, 13);
}

static void cpu_tests(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    int64_t s2[2] = {tu_randint(1, 6), 2 * tu_randint(1, 6)}; /* C even */
    cpu_gradcheck(ctx, 2, s2, false);
    int64_t s3[3] = {2, tu_randint(1, 3), 2 * tu_randint(0, 4) + 1}; /* C odd, stats (2, T) */
    cpu_gradcheck(ctx, 3, s3, true);
    int64_t s4[4] = {2, 1, 2, tu_randint(2, 7)}; /* 4-D, stats (M) */
    cpu_gradcheck(ctx, 4, s4, false);
    int64_t s1[1] = {tu_randint(2, 9)}; /* one row */
    cpu_gradcheck(ctx, 1, s1, false);
    int64_t c1[2] = {3, 1}; /* C = 1: y = beta */
    cpu_gradcheck(ctx, 2, c1, false);
    cpu_f32(ctx);
    cpu_bf16(ctx);
    cpu_errors(ctx);
    mixed_dtypes(ctx);
    /* The fused forms: gradients (C even, C odd with M = 1, C = 1), f32 and bf16 against float64
     * (M = 1 with C not a multiple of 8, and a random shape), the unfused pair bit for bit in
     * every dtype (unaligned views once), the column sums' form, refusals. */
    cpu_fused_gradcheck(ctx, tu_randint(2, 5), 2 * tu_randint(1, 6));
    cpu_fused_gradcheck(ctx, 1, 2 * tu_randint(1, 5) + 1);
    cpu_fused_gradcheck(ctx, tu_randint(2, 4), 1);
    const sg_dtype fdt[3] = {SG_DTYPE_F64, SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int d = 0; d < 3; d++) {
        if (fdt[d] != SG_DTYPE_F64) {
            cpu_fused_dtype(ctx, fdt[d], 1, 8 * tu_randint(0, 30) + tu_randint(1, 7));
            cpu_fused_dtype(ctx, fdt[d], tu_randint(2, 40), tu_randint(1, 300));
        }
        fused_vs_pair(ctx, tu_randint(1, 40), tu_randint(1, 300), fdt[d], false);
        fused_vs_pair(ctx, 1, 8 * tu_randint(0, 30) + tu_randint(1, 7), fdt[d], true);
        sums_case(ctx, tu_randint(1, 40), tu_randint(1, 300), fdt[d], false);
        sums_case(ctx, tu_randint(1, 40), 8 * tu_randint(0, 30) + tu_randint(1, 7), fdt[d], true);
    }
    cpu_fused_errors(ctx);
    capture_case(ctx, tu_randint(1, 20), tu_randint(1, 40), SG_DTYPE_F32);
    capture_case(ctx, tu_randint(1, 20), tu_randint(1, 40), SG_DTYPE_BF16);
    sg_ctx_destroy(ctx);
}

/* ---- gpu: CUDA against the CPU reference ---- */



/* One shape, one dtype dt (f32 or bf16; mean and rstd f32): forward against the CPU reference
 * in dt (outputs poisoned), backward against it from the same statistics, then both again:
 * bitwise the same, and 1 + 2 launches. Tolerance: dt's rule holds as is (mean and rstd: f32's
 * rule). y, mean and rstd: f32 sums of at most a few thousand terms, far below 1e-4 relative.
 * dx: per-row f32 sums, errors ~1e-7 * rstd. dgamma, dbeta: summed in double on the GPU, so
 * only the final rounding to dt differs. In bf16 both sides start from the same bf16 values
 * and round each output once, so they differ by at most one bf16 ulp (2^-8 relative). */
static void gpu_case(sg_ctx *gpu, sg_ctx *cpu, int ndim, const int64_t *shape, bool odd,
                     sg_dtype dt)
{
    const int64_t C = shape[ndim - 1];
    char what[128];
    int k = snprintf(what, sizeof what, "layernorm (");
    for (int i = 0; i < ndim; i++)
        k += snprintf(what + k, sizeof what - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    snprintf(what + k, sizeof what - k, ") %s%s", sg_dtype_name(dt), odd ? " unaligned views" : "");

    sg_tensor *xbase, *gbase;
    sg_tensor *x = tu_maybe_view(gpu, dt, ndim, shape, odd, "x", &xbase);
    sg_tensor *g = tu_maybe_view(gpu, dt, 1, &C, odd, "gamma", &gbase);
    const int64_t M = rows_of(x);
    sg_tensor *b = tu_tensor1(gpu, dt, C, "beta"),
              *dy = tu_tensor(gpu, dt, ndim, shape, "dy");
    sg_tensor *y = tu_tensor(gpu, dt, ndim, shape, "y"),
              *dx = tu_tensor(gpu, dt, ndim, shape, "dx");
    sg_tensor *mean = tu_tensor1(gpu, SG_DTYPE_F32, M, "mean"),
              *rstd = tu_tensor1(gpu, SG_DTYPE_F32, M, "rstd"); /* f32 for every dt */
    sg_tensor *dg = tu_tensor1(gpu, dt, C, "dgamma"),
              *db = tu_tensor1(gpu, dt, C, "dbeta");
    free(random_rows(x, 3.0));
    free(tu_random(g, -1.5, 1.5));
    free(tu_random(b, -1, 1));
    free(tu_random(dy, -1, 1));

    sg_tensor *xc = tu_clone_to(cpu, x, dt), *gc = tu_clone_to(cpu, g, dt),
              *bc = tu_clone_to(cpu, b, dt), *dyc = tu_clone_to(cpu, dy, dt);
    sg_tensor *yc = tu_tensor(cpu, dt, ndim, shape, "y_ref"),
              *dxc = tu_tensor(cpu, dt, ndim, shape, "dx_ref");
    sg_tensor *mc = tu_tensor1(cpu, SG_DTYPE_F32, M, "mean_ref"),
              *rc = tu_tensor1(cpu, SG_DTYPE_F32, M, "rstd_ref"); /* f32 for every dt */
    sg_tensor *dgc = tu_tensor1(cpu, dt, C, "dgamma_ref"),
              *dbc = tu_tensor1(cpu, dt, C, "dbeta_ref");
    TU_OK(cpu, sg_layernorm_forward(cpu, xc, gc, bc, 1e-5f, yc, mc, rc));
    TU_OK(cpu, sg_layernorm_backward(cpu, xc, gc, mc, rc, dyc, dxc, dgc, dbc));

    tu_tol tol = tu_tol_for(dt), tol_stats = tu_tol_for(SG_DTYPE_F32);
    tu_poison(y), tu_poison(mean), tu_poison(rstd);
    TU_OK(gpu, sg_layernorm_forward(gpu, x, g, b, 1e-5f, y, mean, rstd));
    tu_close_named(what, "y", y, yc, tol);
    tu_close_named(what, "mean", mean, mc, tol_stats);
    tu_close_named(what, "rstd", rstd, rc, tol_stats);

    /* The backward reads the reference's statistics, so both sides start from the same. */
    sg_tensor *mg = tu_clone_to(gpu, mc, SG_DTYPE_F32), *rg = tu_clone_to(gpu, rc, SG_DTYPE_F32);
    tu_poison(dx), tu_poison(dg), tu_poison(db);
    TU_OK(gpu, sg_layernorm_backward(gpu, x, g, mg, rg, dy, dx, dg, db));
    /* dx = rstd (dy g - mean(dy g) - xhat mean(dy g xhat)): a row with C = 1 has variance 0, so
     * rstd = 1/sqrt(eps) = 316 multiplies the one-ulp rounding of dy g - mean(dy g) (exactly 0 in
     * the double reference): seen on the H100 as -1.7e-5 against 0. atol scales with rstd there. */
    tu_tol tol_dx = tol;
    if (C == 1) tol_dx.atol *= 1.0 / sqrt(1e-5);
    tu_close_named(what, "dx", dx, dxc, tol_dx);
    tu_close_named(what, "dgamma", dg, dgc, tol);
    tu_close_named(what, "dbeta", db, dbc, tol);

    /* Again: the same bits, and the documented launches. */
    const sg_tensor *outs[6] = {y, mean, rstd, dx, dg, db};
    void *first[6];
    for (int i = 0; i < 6; i++) first[i] = tu_raw(outs[i]);
    for (int i = 0; i < 6; i++) tu_poison((sg_tensor *)outs[i]);
    uint64_t n0 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_layernorm_forward(gpu, x, g, b, 1e-5f, y, mean, rstd));
    uint64_t n1 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_layernorm_backward(gpu, x, g, mg, rg, dy, dx, dg, db));
    uint64_t n2 = sg_ctx_launch_count(gpu);
    TU_CHECK(n1 - n0 == 1, "%s: forward made %llu launches, expected 1", what,
             (unsigned long long)(n1 - n0));
    TU_CHECK(n2 - n1 == 2, "%s: backward made %llu launches, expected 2", what,
             (unsigned long long)(n2 - n1));
    for (int i = 0; i < 6; i++) {
        TU_CHECK(tu_same_bytes(outs[i], first[i]), "%s: %s differs between two identical runs", what,
                 outs[i]->name);
        free(first[i]);
    }

    sg_tensor *ts[] = {x,  g,  b,  dy,  y,  dx,  mean, rstd, dg,  db,  xbase, gbase,
                       xc, gc, bc, dyc, yc, dxc, mc,   rc,   dgc, dbc, mg,    rg};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* Copies src's inputs (and eps) into dst, of another context. */
static void fused_copy_inputs(fused_t *dst, const fused_t *src)
{
    const sg_tensor *from[] = {src->a, src->b, src->g, src->beta, src->dy, src->dres};
    sg_tensor *to[] = {dst->a, dst->b, dst->g, dst->beta, dst->dy, dst->dres};
    for (int i = 0; i < 6; i++) {
        double *v = tu_get(from[i]);
        tu_set(to[i], v);
        free(v);
    }
    dst->eps = src->eps;
}

/* The fused ops on the GPU against the CPU reference in dt, fresh random inputs, outputs
 * poisoned (fused_forward, fused_backward). Tolerances:
 *   s: bit for bit. Both round the exact a + b once: the GPU's f32 sum of two f32 is the rounded
 *   exact sum; of two bf16, rounded to f32 then to bf16, the same as rounding once, since
 *   24 >= 2*8 + 2 bits make that double rounding innocuous.
 *   y, mean, rstd, dgamma, dbeta: gpu_case's rules for the plain op (the same arithmetic, on s).
 *   dx = dres + LayerNorm's dx: LayerNorm's part within gpu_case's rule for dx (atol + rtol |ln|,
 *   ln the reference's plain dx), then each side rounds the sum once: up to 2u |dx| apart more
 *   (u the dtype's unit roundoff; the factor (1 + 2u) on the first part: the roundings scale it).
 * The backward reads the reference's statistics and s (bit for bit the GPU's), so both start
 * from the same values. */
static void gpu_fused_case(sg_ctx *gpu, sg_ctx *cpu, int64_t M, int64_t C, sg_dtype dt, bool odd)
{
    char what[128];
    snprintf(what, sizeof what, "add+layernorm (%lld,%lld) %s%s", (long long)M, (long long)C,
             sg_dtype_name(dt), odd ? " unaligned a, b, dres" : "");
    fused_t g = fused_make(gpu, M, C, dt, odd), c = fused_make(cpu, M, C, dt, false);
    fused_copy_inputs(&c, &g);
    fused_forward(&c);
    fused_forward(&g);
    tu_tol tol = tu_tol_for(dt), tol_stats = tu_tol_for(SG_DTYPE_F32);
    tu_close_named(what, "s", g.s, c.s, (tu_tol){0, 0});
    tu_close_named(what, "y", g.y, c.y, tol);
    tu_close_named(what, "mean", g.mean, c.mean, tol_stats);
    tu_close_named(what, "rstd", g.rstd, c.rstd, tol_stats);

    double *v = tu_get(c.mean);
    tu_set(g.mean, v), free(v);
    v = tu_get(c.rstd);
    tu_set(g.rstd, v), free(v);
    fused_backward(&c);
    fused_backward(&g);
    sg_tensor *ln = tu_tensor2(cpu, dt, M, C, "ln_dx_ref"), *dg2 = tu_tensor1(cpu, dt, C, "dg2"),
              *db2 = tu_tensor1(cpu, dt, C, "db2");
    TU_OK(cpu, sg_layernorm_backward(cpu, c.s, c.g, c.mean, c.rstd, c.dy, ln, dg2, db2));
    /* As gpu_case: with C = 1, rstd = 1/sqrt(eps) multiplies a one-ulp rounding of LN's dx. */
    tu_tol tol_dx = tol;
    if (C == 1) tol_dx.atol *= 1.0 / sqrt(g.eps);
    const double u = unit_roundoff(dt);
    double *lnv = tu_get(ln), *ref = tu_get(c.dx), *got = tu_get(g.dx);
    double *bound = malloc((size_t)(M * C) * sizeof *bound);
    for (int64_t i = 0; i < M * C; i++)
        bound[i] = (1 + 2 * u) * (tol_dx.atol + tol_dx.rtol * fabs(lnv[i])) + 2 * u * fabs(ref[i]);
    char w[200];
    snprintf(w, sizeof w, "%s dx", what);
    close_bounded(w, got, ref, bound, M * C);
    tu_close_named(what, "dgamma", g.dg, c.dg, tol);
    tu_close_named(what, "dbeta", g.db, c.db, tol);
    free(lnv), free(ref), free(got), free(bound);
    sg_tensor *ts[] = {ln, dg2, db2};
    tu_destroy_all(ts, 3);
    fused_free(&g), fused_free(&c);
}

/* Documented limits: mixed dtypes (as on the CPU); the backward's column cap. */
static void gpu_edges(sg_ctx *gpu)
{
    mixed_dtypes(gpu);

    int64_t big = SG_LAYERNORM_CUDA_MAX_C + 1;
    sg_tensor *x = tu_tensor2(gpu, SG_DTYPE_F32, 1, big, "x"),
              *dy = tu_tensor2(gpu, SG_DTYPE_F32, 1, big, "dy");
    sg_tensor *dx = tu_tensor2(gpu, SG_DTYPE_F32, 1, big, "dx"),
              *g = tu_tensor1(gpu, SG_DTYPE_F32, big, "gamma");
    sg_tensor *dg = tu_tensor1(gpu, SG_DTYPE_F32, big, "dgamma"),
              *db = tu_tensor1(gpu, SG_DTYPE_F32, big, "dbeta");
    sg_tensor *m1 = tu_tensor1(gpu, SG_DTYPE_F32, 1, "m1"),
              *r1 = tu_tensor1(gpu, SG_DTYPE_F32, 1, "r1");
    TU_FAILS(gpu, sg_layernorm_backward(gpu, x, g, m1, r1, dy, dx, dg, db), SG_ERR_UNSUPPORTED,
             "the CUDA backward takes at most");
    TU_FAILS(gpu, sg_layernorm_backward_add(gpu, x, g, m1, r1, dy, NULL, dx, dg, db),
             SG_ERR_UNSUPPORTED,
             "sg_layernorm_backward_add: x has 262145 columns; the CUDA backward takes at most");
    sg_tensor *ts[] = {x, dy, dx, g, dg, db, m1, r1};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void gpu_tests(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    int64_t rm = tu_randint(1, 3000), rc = tu_randint(1, 6000);
    if (rm * rc > (4 << 20)) rm = (4 << 20) / rc; /* keep the double reference quick */
    /* Warp per row (C < 2048) and block per row; C % 4 (f32) or C % 8 (bf16) == 0: 16-byte
     * path, and not; 20000 rows: backward blocks of several tiles of rows (rows per block >
     * LN_TILE_ROWS on up to 300 SMs); 1001 columns: a warp per row, element by element, the
     * row longer than a warp holds in registers (read twice). bf16's backward takes a warp a
     * row for C % 8 == 0 up to 768: (5, 8) gives a block fewer rows than warps, (13, 760) lanes
     * with no vector in a row's last pass, (2048, 768) its widest. The same shapes in both
     * dtypes. */
    int64_t shapes[][2] = {{1, 1},    {7, 33},  {2048, 256}, {2048, 768},  {64, 4096}, {5, 3001},
                           {300, 2}, {1, 2048}, {8, 100000}, {20000, 96}, {3, 1001}, {rm, rc},
                           {5, 8},   {13, 760}};
    const sg_dtype dts[2] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        sg_dtype dt = dts[d];
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            gpu_case(gpu, cpu, 2, shapes[s], false, dt);
        int64_t s3[3] = {4, 16, 33};
        gpu_case(gpu, cpu, 3, s3, false, dt);
        int64_t s3b[3] = {8, 128, 256};
        gpu_case(gpu, cpu, 3, s3b, false, dt);
        int64_t v1[2] = {37, 256}, v2[2] = {3, 4096}; /* C % 8 == 0 but unaligned: scalar */
        gpu_case(gpu, cpu, 2, v1, true, dt);
        gpu_case(gpu, cpu, 2, v2, true, dt);
        /* The fused forms on the same shapes, against the CPU and against the unfused pair;
         * then with a, b and dres unaligned (their element-by-element loads). */
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            gpu_fused_case(gpu, cpu, shapes[s][0], shapes[s][1], dt, false);
            fused_vs_pair(gpu, shapes[s][0], shapes[s][1], dt, false);
            sums_case(gpu, shapes[s][0], shapes[s][1], dt, false);
        }
        int64_t odd[][2] = {{37, 256}, {3, 4096}, {2048, 768}};
        for (size_t s = 0; s < sizeof odd / sizeof *odd; s++) {
            gpu_fused_case(gpu, cpu, odd[s][0], odd[s][1], dt, true);
            fused_vs_pair(gpu, odd[s][0], odd[s][1], dt, true);
            sums_case(gpu, odd[s][0], odd[s][1], dt, true);
        }
        capture_case(gpu, 256, 768, dt);
        capture_case(gpu, 33, 4100, dt);
    }
    gpu_edges(gpu);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_layernorm");
    if (!strcmp(mode, "gpu"))
        gpu_tests();
    else
        cpu_tests();
    return tu_finish("test_layernorm");
}
