/* test_batchnorm.c: batch normalisation forward (training and eval) and backward. `cpu`: the
 * forward against the formula written here (2-D and 4-D x, M = 1), the running statistics'
 * update against its formula (momentum, unbiased variance), eval mode, float64 finite
 * differences of dx, dgamma and dbeta through the training forward, bf16 storage against f64
 * on the same values, argument errors (the context usable afterwards), and a captured plan.
 * `gpu`: the CUDA kernels, f32 and bf16, against the CPU reference in the same dtype on fresh
 * random inputs (odd channel counts, M = 1, wide C, many rows, 16-byte and scalar paths),
 * outputs poisoned first; bitwise determinism; the launches per call; a captured graph that
 * reproduces the eager results bit for bit. */
#include "ops/batchnorm.h" /* SG_BATCHNORM_CUDA_MAX_C */
#include "testutil.h"

/* ---- shared helpers ---- */

static int64_t chans_of(const sg_tensor *x)
{
    return x->shape[x->ndim - 1];
}

static int64_t rows_of(const sg_tensor *x)
{
    return x->numel / chans_of(x);
}

/* x values: uniform in [-2, 2) plus an offset per channel in [-off, off), so the mean is not ~0
 * and the variance pass must subtract it. With M >= 2 two rows of each channel sit at offset
 * -+1.5, so no channel's variance is tiny by chance (f32 could not resolve x - mean then,
 * whatever the kernel). Returns host doubles (caller frees). */
static double *random_cols(sg_tensor *x, double off)
{
    const int64_t C = chans_of(x), M = rows_of(x);
    double *v = malloc((size_t)x->numel * sizeof *v);
    for (int64_t c = 0; c < C; c++) {
        double o = off > 0 ? tu_uniform(-off, off) : 0;
        for (int64_t r = 0; r < M; r++) v[r * C + c] = o + tu_uniform(-2, 2);
        if (M >= 2) {
            int64_t p = tu_randint(0, (int)M - 1), q = (p + tu_randint(1, (int)M - 1)) % M;
            v[p * C + c] = o - 1.5;
            v[q * C + c] = o + 1.5;
        }
    }
    tu_set(x, v);
    return v;
}

/* The definition, written out. training: batch mean and biased variance; the running statistics
 * (rm, rv; may be NULL) move to (1 - mom) r + mom s with s the mean and the unbiased variance
 * (rv unchanged when M = 1). Eval: rm, rv normalise. */
static void naive_bn(const double *x, const double *g, const double *b, int64_t M, int64_t C,
                     double eps, int training, double mom, double *rm, double *rv, double *y,
                     double *mean, double *rstd)
{
    for (int64_t c = 0; c < C; c++) {
        double m, var;
        if (training) {
            double s = 0, q = 0;
            for (int64_t r = 0; r < M; r++) s += x[r * C + c];
            m = s / M;
            for (int64_t r = 0; r < M; r++) q += (x[r * C + c] - m) * (x[r * C + c] - m);
            var = q / M;
            if (rm) {
                rm[c] = (1 - mom) * rm[c] + mom * m;
                if (M > 1) rv[c] = (1 - mom) * rv[c] + mom * q / (M - 1);
            }
        } else {
            m = rm[c];
            var = rv[c];
        }
        double sd = sqrt(var + eps);
        for (int64_t r = 0; r < M; r++) y[r * C + c] = (x[r * C + c] - m) / sd * g[c] + b[c];
        mean[c] = m;
        rstd[c] = 1 / sd;
    }
}

static void shape_label(char *buf, size_t n, const char *pre, int ndim, const int64_t *shape)
{
    int k = snprintf(buf, n, "%s (", pre);
    for (int i = 0; i < ndim; i++)
        k += snprintf(buf + k, n - (size_t)k, "%s%lld", i ? "," : "", (long long)shape[i]);
    snprintf(buf + k, n - (size_t)k, ")");
}

/* ---- cpu: formula, running statistics, eval, finite differences ---- */

typedef struct bn_case {
    sg_ctx *ctx;
    sg_tensor *x, *g, *b, *y, *mean, *rstd, *r;
    float eps;
} bn_case;

/* L = sum(y * r) through the training forward (running statistics not tracked): dL/dy = r, so
 * the backward with dy = r gives dL/dx, dL/dgamma, dL/dbeta. */
static double bn_loss(void *u)
{
    bn_case *c = u;
    TU_OK(c->ctx, sg_batchnorm_forward(c->ctx, c->x, c->g, c->b, NULL, NULL, 0.1f, c->eps, 1, c->y,
                                       c->mean, c->rstd));
    return tu_dot(c->y, c->r);
}

static void cpu_gradcheck(sg_ctx *ctx, int ndim, const int64_t *shape)
{
    const sg_dtype f64 = SG_DTYPE_F64;
    const int64_t C = shape[ndim - 1];
    sg_tensor *x = tu_tensor(ctx, f64, ndim, shape, "x");
    const int64_t M = rows_of(x);
    sg_tensor *y = tu_tensor(ctx, f64, ndim, shape, "y"),
              *r = tu_tensor(ctx, f64, ndim, shape, "r"),
              *dx = tu_tensor(ctx, f64, ndim, shape, "dx");
    sg_tensor *g = tu_tensor1(ctx, f64, C, "gamma"), *b = tu_tensor1(ctx, f64, C, "beta"),
              *dg = tu_tensor1(ctx, f64, C, "dgamma"), *db = tu_tensor1(ctx, f64, C, "dbeta"),
              *mean = tu_tensor1(ctx, f64, C, "mean"), *rstd = tu_tensor1(ctx, f64, C, "rstd"),
              *rm = tu_tensor1(ctx, f64, C, "running_mean"),
              *rv = tu_tensor1(ctx, f64, C, "running_var");
    double *xv = random_cols(x, 2.0), *gv = tu_random(g, -1.5, 1.5), *bv = tu_random(b, -1, 1);
    double *rmv = tu_random(rm, -1, 1), *rvv = tu_random(rv, 0.5, 2);
    free(tu_random(r, -1, 1));
    const float eps = (float)tu_uniform(1e-5, 1e-2), mom = (float)tu_uniform(0.05, 0.9);
    char what[80], w[112];
    shape_label(what, sizeof what, "batchnorm f64", ndim, shape);

    /* Training forward against the formula, running statistics included. */
    double *ye = malloc((size_t)x->numel * sizeof *ye), *me = malloc((size_t)C * sizeof *me),
           *re = malloc((size_t)C * sizeof *re);
    tu_poison(y), tu_poison(mean), tu_poison(rstd);
    TU_OK(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv, mom, eps, 1, y, mean, rstd));
    naive_bn(xv, gv, bv, M, C, eps, 1, mom, rmv, rvv, ye, me, re);
    const tu_tol t64 = tu_tol_for(f64);
    snprintf(w, sizeof w, "%s y vs formula", what), tu_close_vals(w, y, ye, x->numel, t64);
    snprintf(w, sizeof w, "%s mean vs formula", what), tu_close_vals(w, mean, me, C, t64);
    snprintf(w, sizeof w, "%s rstd vs formula", what), tu_close_vals(w, rstd, re, C, t64);
    snprintf(w, sizeof w, "%s running_mean vs formula", what), tu_close_vals(w, rm, rmv, C, t64);
    snprintf(w, sizeof w, "%s running_var vs formula%s", what, M == 1 ? " (M = 1)" : "");
    tu_close_vals(w, rv, rvv, C, t64);

    /* Eval: the running statistics (as just updated) normalise; nothing changes them. */
    tu_poison(y), tu_poison(mean), tu_poison(rstd);
    void *rm0 = tu_raw(rm), *rv0 = tu_raw(rv);
    TU_OK(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv, mom, eps, 0, y, mean, rstd));
    naive_bn(xv, gv, bv, M, C, eps, 0, mom, rmv, rvv, ye, me, re);
    snprintf(w, sizeof w, "%s eval y vs formula", what), tu_close_vals(w, y, ye, x->numel, t64);
    snprintf(w, sizeof w, "%s eval mean", what), tu_close_vals(w, mean, me, C, t64);
    snprintf(w, sizeof w, "%s eval rstd", what), tu_close_vals(w, rstd, re, C, t64);
    TU_CHECK(tu_same_bytes(rm, rm0) && tu_same_bytes(rv, rv0),
             "%s: eval changed the running "
             "statistics",
             what);
    free(rm0), free(rv0);

    /* Backward with dy = r, from the training forward's statistics; central differences of L
     * through the training forward alone. h = 1e-5: truncation ~h^2 f''' and rounding
     * ~1e-16 |L| / h both stay under 1e-8. */
    TU_OK(ctx, sg_batchnorm_forward(ctx, x, g, b, NULL, NULL, mom, eps, 1, y, mean, rstd));
    tu_poison(dx), tu_poison(dg), tu_poison(db);
    TU_OK(ctx, sg_batchnorm_backward(ctx, x, g, mean, rstd, r, dx, dg, db));
    bn_case c = {ctx, x, g, b, y, mean, rstd, r, eps};
    const tu_tol tol = {1e-8, 1e-6};
    snprintf(w, sizeof w, "%s dx", what), tu_gradcheck(w, bn_loss, &c, x, dx, 0, 1e-5, tol);
    snprintf(w, sizeof w, "%s dgamma", what), tu_gradcheck(w, bn_loss, &c, g, dg, 0, 1e-5, tol);
    snprintf(w, sizeof w, "%s dbeta", what), tu_gradcheck(w, bn_loss, &c, b, db, 0, 1e-5, tol);

    /* Each channel of dx sums to 0 over the rows (y is invariant to a constant added to a
     * channel of x). */
    for (int64_t ch = 0; ch < C; ch++) {
        double s = 0, a = 0;
        for (int64_t row = 0; row < M; row++)
            s += sg_ld(dx, row * C + ch), a += fabs(sg_ld(dx, row * C + ch));
        TU_CHECK(fabs(s) <= 1e-12 * (1 + a), "%s: channel %lld of dx sums to %g", what,
                 (long long)ch, s);
    }
    free(xv), free(gv), free(bv), free(rmv), free(rvv), free(ye), free(me), free(re);
    sg_tensor *ts[] = {x, y, r, dx, g, b, dg, db, mean, rstd, rm, rv};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* Storage dtype dt (f32 or bf16; per-channel tensors f32) on the CPU against the f64 reference
 * (checked by the formula and finite differences above) on the same values: the reference
 * computes in double and rounds only the outputs, so dt's outputs sit within half an ulp of
 * dt of f64 (inside dt's rule) and the f32 statistics within f32 rounding (the f32 rule). */
static void cpu_lowp(sg_ctx *ctx, sg_dtype dt)
{
    const int64_t shape[4] = {tu_randint(1, 3), tu_randint(1, 5), tu_randint(1, 5),
                              tu_randint(1, 70)};
    const int64_t C = shape[3];
    const sg_dtype f32 = SG_DTYPE_F32, f64 = SG_DTYPE_F64;
    sg_tensor *x = tu_tensor(ctx, dt, 4, shape, "x"), *y = tu_tensor(ctx, dt, 4, shape, "y"),
              *dy = tu_tensor(ctx, dt, 4, shape, "dy"), *dx = tu_tensor(ctx, dt, 4, shape, "dx");
    sg_tensor *g = tu_tensor1(ctx, f32, C, "gamma"), *b = tu_tensor1(ctx, f32, C, "beta"),
              *dg = tu_tensor1(ctx, f32, C, "dgamma"), *db = tu_tensor1(ctx, f32, C, "dbeta"),
              *mean = tu_tensor1(ctx, f32, C, "mean"), *rstd = tu_tensor1(ctx, f32, C, "rstd"),
              *rm = tu_tensor1(ctx, f32, C, "running_mean"),
              *rv = tu_tensor1(ctx, f32, C, "running_var");
    free(random_cols(x, 3.0));
    free(tu_random(g, -1.5, 1.5)), free(tu_random(b, -1, 1)), free(tu_random(dy, -1, 1));
    free(tu_random(rm, -1, 1)), free(tu_random(rv, 0.5, 2));
    sg_tensor *x64 = tu_clone_to(ctx, x, f64), *g64 = tu_clone_to(ctx, g, f64),
              *b64 = tu_clone_to(ctx, b, f64), *dy64 = tu_clone_to(ctx, dy, f64),
              *rm64 = tu_clone_to(ctx, rm, f64), *rv64 = tu_clone_to(ctx, rv, f64);
    sg_tensor *y64 = tu_tensor(ctx, f64, 4, shape, "y64"),
              *dx64 = tu_tensor(ctx, f64, 4, shape, "dx64");
    sg_tensor *m64 = tu_tensor1(ctx, f64, C, "mean64"), *r64 = tu_tensor1(ctx, f64, C, "rstd64"),
              *dg64 = tu_tensor1(ctx, f64, C, "dgamma64"),
              *db64 = tu_tensor1(ctx, f64, C, "dbeta64");
    char what[64];
    snprintf(what, sizeof what, "batchnorm %s cpu vs f64", sg_dtype_name(dt));
    const tu_tol tol = tu_tol_for(dt), t32 = tu_tol_for(f32);
    for (int training = 1; training >= 0; training--) {
        tu_poison(y), tu_poison(mean), tu_poison(rstd);
        TU_OK(ctx,
              sg_batchnorm_forward(ctx, x, g, b, rm, rv, 0.1f, 1e-5f, training, y, mean, rstd));
        TU_OK(ctx, sg_batchnorm_forward(ctx, x64, g64, b64, rm64, rv64, 0.1f, 1e-5f, training, y64,
                                        m64, r64));
        char w[112];
        const char *mode = training ? "training" : "eval";
        snprintf(w, sizeof w, "%s %s y", what, mode), tu_close_tensors(w, y, y64, tol);
        snprintf(w, sizeof w, "%s %s mean", what, mode), tu_close_tensors(w, mean, m64, t32);
        snprintf(w, sizeof w, "%s %s rstd", what, mode), tu_close_tensors(w, rstd, r64, t32);
        snprintf(w, sizeof w, "%s %s running_mean", what, mode), tu_close_tensors(w, rm, rm64, t32);
        snprintf(w, sizeof w, "%s %s running_var", what, mode), tu_close_tensors(w, rv, rv64, t32);
    }
    TU_OK(ctx, sg_batchnorm_forward(ctx, x64, g64, b64, NULL, NULL, 0.1f, 1e-5f, 1, y64, m64, r64));
    TU_OK(ctx, sg_batchnorm_forward(ctx, x, g, b, NULL, NULL, 0.1f, 1e-5f, 1, y, mean, rstd));
    TU_OK(ctx, sg_batchnorm_backward(ctx, x64, g64, m64, r64, dy64, dx64, dg64, db64));
    tu_poison(dx), tu_poison(dg), tu_poison(db);
    TU_OK(ctx, sg_batchnorm_backward(ctx, x, g, mean, rstd, dy, dx, dg, db));
    char w[112];
    snprintf(w, sizeof w, "%s dx", what), tu_close_tensors(w, dx, dx64, tol);
    snprintf(w, sizeof w, "%s dgamma", what), tu_close_tensors(w, dg, dg64, t32);
    snprintf(w, sizeof w, "%s dbeta", what), tu_close_tensors(w, db, db64, t32);
    sg_tensor *ts[] = {x,   y,   dy,  dx,   g,    b,    dg,  db,   mean, rstd, rm,   rv,
                       x64, g64, b64, dy64, rm64, rv64, y64, dx64, m64,  r64,  dg64, db64};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* Argument errors on either backend (f32 and bf16 tensors only); each names the call and the
 * tensor; a failed call writes nothing; the context is usable afterwards. */
static void errors(sg_ctx *ctx)
{
    const int64_t M = 6, C = 5;
    const sg_dtype f32 = SG_DTYPE_F32, bf = SG_DTYPE_BF16;
    sg_tensor *x = tu_tensor2(ctx, f32, M, C, "x"), *y = tu_tensor2(ctx, f32, M, C, "y"),
              *dy = tu_tensor2(ctx, f32, M, C, "dy"), *dx = tu_tensor2(ctx, f32, M, C, "dx");
    sg_tensor *g = tu_tensor1(ctx, f32, C, "gamma"), *b = tu_tensor1(ctx, f32, C, "beta"),
              *dg = tu_tensor1(ctx, f32, C, "dgamma"), *db = tu_tensor1(ctx, f32, C, "dbeta"),
              *mean = tu_tensor1(ctx, f32, C, "mean"), *rstd = tu_tensor1(ctx, f32, C, "rstd"),
              *rm = tu_tensor1(ctx, f32, C, "running_mean"),
              *rv = tu_tensor1(ctx, f32, C, "running_var");
    sg_tensor *g6 = tu_tensor1(ctx, f32, C + 1, "g6"), *gb = tu_tensor1(ctx, bf, C, "gb"),
              *g2d = tu_tensor2(ctx, f32, 1, C, "g2d"), *y6 = tu_tensor2(ctx, f32, M, C + 1, "y6"),
              *yb = tu_tensor2(ctx, bf, M, C, "yb"), *xb = tu_tensor2(ctx, bf, M, C, "xb"),
              *xi = tu_tensor2(ctx, SG_DTYPE_I32, M, C, "xi"),
              *rv4 = tu_tensor1(ctx, f32, C - 1, "rv4");
    double *xv = random_cols(x, 1.0), *gv = tu_random(g, -1, 1), *bv = tu_random(b, -1, 1);
    free(tu_random(dy, -1, 1)), free(tu_random(rm, -1, 1)), free(tu_random(rv, 0.5, 2));

    TU_CHECK(sg_batchnorm_forward(NULL, x, g, b, rm, rv, 0.1f, 1e-5f, 1, y, mean, rstd) ==
                 SG_ERR_NULL,
             "ctx NULL");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, NULL, g, b, rm, rv, 0.1f, 1e-5f, 1, y, mean, rstd),
             SG_ERR_NULL, "sg_batchnorm_forward: tensor 'x' is NULL");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, xi, g, b, rm, rv, 0.1f, 1e-5f, 1, y, mean, rstd),
             SG_ERR_DTYPE, "sg_batchnorm_forward: tensor 'x' is i32");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g6, b, rm, rv, 0.1f, 1e-5f, 1, y, mean, rstd),
             SG_ERR_SHAPE,
             "'gamma' is (6) f32 but 'x' is (6, 5) f32; expected (5), one value per channel");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g2d, b, rm, rv, 0.1f, 1e-5f, 1, y, mean, rstd),
             SG_ERR_SHAPE, "'gamma' is (1, 5) f32");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, gb, rm, rv, 0.1f, 1e-5f, 1, y, mean, rstd),
             SG_ERR_DTYPE, "tensor 'beta' is bf16, expected f32");
    /* bf16 activations keep f32 per-channel tensors. */
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, xb, gb, b, rm, rv, 0.1f, 1e-5f, 1, yb, mean, rstd),
             SG_ERR_DTYPE, "tensor 'gamma' is bf16, expected f32");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, xb, g, b, rm, rv, 0.1f, 1e-5f, 1, y, mean, rstd),
             SG_ERR_DTYPE, "'x' is (6, 5) bf16 but 'y' is (6, 5) f32");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv, 0.1f, 1e-5f, 1, y6, mean, rstd),
             SG_ERR_SHAPE, "but 'y' is (6, 6) f32");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv4, 0.1f, 1e-5f, 1, y, mean, rstd),
             SG_ERR_SHAPE, "'running_var' is (4) f32");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, NULL, 0.1f, 1e-5f, 1, y, mean, rstd),
             SG_ERR_NULL, "tensor 'running_var' is NULL but 'running_mean' is not");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, NULL, NULL, 0.1f, 1e-5f, 0, y, mean, rstd),
             SG_ERR_NULL, "tensor 'running_mean' is NULL; eval mode");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv, 0.1f, 1e-5f, 1, y, NULL, rstd),
             SG_ERR_NULL, "tensor 'mean' is NULL");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv, 0.1f, 1e-5f, 1, y, mean, g6),
             SG_ERR_SHAPE, "'rstd' is (6) f32");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv, 1.5f, 1e-5f, 1, y, mean, rstd),
             SG_ERR_INVALID, "momentum is 1.5, expected a value in [0, 1]");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv, NAN, 1e-5f, 1, y, mean, rstd),
             SG_ERR_INVALID, "momentum is nan");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv, 0.1f, -1e-3f, 1, y, mean, rstd),
             SG_ERR_INVALID, "eps is -0.001");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv, 0.1f, 1e-5f, 1, x, mean, rstd),
             SG_ERR_INVALID, "output 'y' overlaps 'x' in memory");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv, 0.1f, 1e-5f, 1, y, mean, mean),
             SG_ERR_INVALID, "output 'mean' overlaps 'rstd'");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rm, 0.1f, 1e-5f, 1, y, mean, rstd),
             SG_ERR_INVALID, "output 'running_mean' overlaps 'running_var'");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv, 0.1f, 1e-5f, 0, y, rm, rstd),
             SG_ERR_INVALID, "output 'mean' overlaps 'running_mean'");

    /* A failed call writes nothing: not y, not the running statistics. */
    TU_OK(ctx, sg_tensor_fill(y, 12345.0));
    void *rm0 = tu_raw(rm);
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, rm, rv, 0.1f, 1e-5f, 1, y, mean, mean),
             SG_ERR_INVALID, "overlaps");
    double *yv = tu_get(y);
    TU_CHECK(yv[0] == 12345.0 && yv[M * C - 1] == 12345.0, "a failed call wrote y");
    TU_CHECK(tu_same_bytes(rm, rm0), "a failed call changed running_mean");
    free(yv), free(rm0);

    TU_OK(ctx, sg_batchnorm_forward(ctx, x, g, b, NULL, NULL, 0.1f, 1e-5f, 1, y, mean, rstd));
    TU_FAILS(ctx, sg_batchnorm_backward(ctx, x, g, mean, rstd, dy, dx, NULL, db), SG_ERR_NULL,
             "sg_batchnorm_backward: tensor 'dgamma' is NULL");
    TU_FAILS(ctx, sg_batchnorm_backward(ctx, x, g, mean, rstd, y6, dx, dg, db), SG_ERR_SHAPE,
             "but 'dy' is (6, 6) f32");
    TU_FAILS(ctx, sg_batchnorm_backward(ctx, x, g, mean, rstd, dy, yb, dg, db), SG_ERR_DTYPE,
             "but 'dx' is (6, 5) bf16");
    TU_FAILS(ctx, sg_batchnorm_backward(ctx, x, g, mean, rv4, dy, dx, dg, db), SG_ERR_SHAPE,
             "'rstd' is (4) f32");
    TU_FAILS(ctx, sg_batchnorm_backward(ctx, x, g, mean, rstd, dy, dx, g6, db), SG_ERR_SHAPE,
             "'dgamma' is (6) f32");
    TU_FAILS(ctx, sg_batchnorm_backward(ctx, x, g, mean, rstd, dy, dx, dg, gb), SG_ERR_DTYPE,
             "tensor 'dbeta' is bf16, expected f32");
    TU_FAILS(ctx, sg_batchnorm_backward(ctx, x, g, mean, rstd, dy, dy, dg, db), SG_ERR_INVALID,
             "output 'dx' overlaps 'dy'");
    TU_FAILS(ctx, sg_batchnorm_backward(ctx, x, g, mean, rstd, dy, dx, dg, dg), SG_ERR_INVALID,
             "output 'dgamma' overlaps 'dbeta'");

    /* Usable afterwards, and right. */
    double ye[30], me[5], re[5];
    tu_poison(y);
    TU_OK(ctx, sg_batchnorm_forward(ctx, x, g, b, NULL, NULL, 0.1f, 1e-5f, 1, y, mean, rstd));
    naive_bn(xv, gv, bv, M, C, 1e-5, 1, 0, NULL, NULL, ye, me, re);
    tu_close_vals("batchnorm after errors: y", y, ye, M * C, tu_tol_for(f32));
    tu_poison(dg);
    TU_OK(ctx, sg_batchnorm_backward(ctx, x, g, mean, rstd, dy, dx, dg, db));
    double *dgv = tu_get(dg);
    TU_CHECK(isfinite(dgv[0]), "batchnorm after errors: dgamma %g", dgv[0]);
    free(dgv), free(xv), free(gv), free(bv);
    sg_tensor *ts[] = {x,  y,  dy, dx, g,   b,  dg, db, mean, rstd,
                       rm, rv, g6, gb, g2d, y6, yb, xb, xi,   rv4};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* f64 only exists on the CPU; there it sets every per-channel dtype to f64. */
static void cpu_errors_f64(sg_ctx *ctx)
{
    sg_tensor *x = tu_tensor2(ctx, SG_DTYPE_F64, 4, 3, "x"),
              *y = tu_tensor2(ctx, SG_DTYPE_F64, 4, 3, "y");
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_F32, 3, "gamma"),
              *b = tu_tensor1(ctx, SG_DTYPE_F64, 3, "beta"),
              *m = tu_tensor1(ctx, SG_DTYPE_F64, 3, "mean"),
              *r = tu_tensor1(ctx, SG_DTYPE_F64, 3, "rstd");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, g, b, NULL, NULL, 0.1f, 1e-5f, 1, y, m, r),
             SG_ERR_DTYPE, "sg_batchnorm_forward: tensor 'gamma' is f32, expected f64");
    sg_ctx *other = tu_ctx(SG_BACKEND_CPU);
    sg_tensor *bo = tu_tensor1(other, SG_DTYPE_F64, 3, "beta_other");
    TU_FAILS(ctx, sg_batchnorm_forward(ctx, x, b, bo, NULL, NULL, 0.1f, 1e-5f, 1, y, m, r),
             SG_ERR_BACKEND, "'beta' (beta_other) belongs to another context");
    sg_tensor_destroy(bo);
    sg_ctx_destroy(other);
    sg_tensor *ts[] = {x, y, g, b, m, r};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* ---- capture: a training step recorded into a graph (CPU: a plan) replays what eager does ---- */

typedef struct bn_step {
    sg_ctx *ctx;
    const sg_tensor *x, *g, *b, *dy;
    sg_tensor *rm, *rv, *y, *mean, *rstd, *dx, *dg, *db;
} bn_step;

static sg_status bn_step_fn(void *u)
{
    bn_step *s = u;
    SG_TRY(sg_batchnorm_forward(s->ctx, s->x, s->g, s->b, s->rm, s->rv, 0.1f, 1e-5f, 1, s->y,
                                s->mean, s->rstd));
    return sg_batchnorm_backward(s->ctx, s->x, s->g, s->mean, s->rstd, s->dy, s->dx, s->dg, s->db);
}

/* Eager outputs and replayed outputs compared bit for bit, for two input fills; the running
 * statistics of both set to the same values before each round. */
static void capture_case(sg_ctx *ctx, int ndim, const int64_t *shape, sg_dtype dt)
{
    const int64_t C = shape[ndim - 1];
    const sg_dtype f32 = SG_DTYPE_F32;
    sg_tensor *x = tu_tensor(ctx, dt, ndim, shape, "x"),
              *dy = tu_tensor(ctx, dt, ndim, shape, "dy");
    sg_tensor *g = tu_tensor1(ctx, f32, C, "gamma"), *b = tu_tensor1(ctx, f32, C, "beta");
    bn_step e = {.ctx = ctx, .x = x, .g = g, .b = b, .dy = dy}, r = e;
    bn_step *both[2] = {&e, &r};
    for (int k = 0; k < 2; k++) {
        bn_step *s = both[k];
        s->y = tu_tensor(ctx, dt, ndim, shape, "y"), s->dx = tu_tensor(ctx, dt, ndim, shape, "dx");
        s->rm = tu_tensor1(ctx, f32, C, "running_mean"),
        s->rv = tu_tensor1(ctx, f32, C, "running_var");
        s->mean = tu_tensor1(ctx, f32, C, "mean"), s->rstd = tu_tensor1(ctx, f32, C, "rstd");
        s->dg = tu_tensor1(ctx, f32, C, "dgamma"), s->db = tu_tensor1(ctx, f32, C, "dbeta");
    }
    free(random_cols(x, 2.0));
    free(tu_random(dy, -1, 1)), free(tu_random(g, -1.5, 1.5)), free(tu_random(b, -1, 1));
    free(tu_random(e.rm, -1, 1)), free(tu_random(e.rv, 0.5, 2));

    const sg_tensor *ins[2] = {x, dy};
    sg_graph_options o = sg_graph_options_default();
    o.name = "batchnorm";
    o.warmup = 1;
    o.static_inputs = ins;
    o.n_static_inputs = 2;
    sg_graph *graph = NULL;
    TU_OK(ctx, sg_graph_capture(ctx, bn_step_fn, &r, &o, &graph));
    for (int round = 0; round < 2; round++) {
        if (round) {
            free(random_cols(x, 2.0));
            free(tu_random(dy, -1, 1));
        }
        TU_OK(ctx, sg_tensor_copy(r.rm, e.rm));
        TU_OK(ctx, sg_tensor_copy(r.rv, e.rv));
        sg_tensor *pe[] = {e.y, e.mean, e.rstd, e.dx, e.dg, e.db};
        sg_tensor *pr[] = {r.y, r.mean, r.rstd, r.dx, r.dg, r.db};
        for (int i = 0; i < 6; i++) tu_poison(pe[i]), tu_poison(pr[i]);
        TU_OK(ctx, bn_step_fn(&e));
        TU_OK(ctx, sg_graph_replay(graph));
        const sg_tensor *ge[] = {e.y, e.mean, e.rstd, e.rm, e.rv, e.dx, e.dg, e.db};
        const sg_tensor *gr[] = {r.y, r.mean, r.rstd, r.rm, r.rv, r.dx, r.dg, r.db};
        for (int i = 0; i < 8; i++) {
            char w[112];
            snprintf(w, sizeof w, "batchnorm %s C=%lld replay %d: %s vs eager", sg_dtype_name(dt),
                     (long long)C, round, ge[i]->name);
            tu_close_tensors(w, gr[i], ge[i], (tu_tol){0, 0});
        }
    }
    sg_graph_destroy(graph);
    sg_tensor *ts[] = {x,    dy,   g,   b,    e.y,  e.dx, e.rm,   e.rv,   e.mean, e.rstd,
                       e.dg, e.db, r.y, r.dx, r.rm, r.rv, r.mean, r.rstd, r.dg,   r.db};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void cpu_tests(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    int64_t s2[2] = {tu_randint(2, 12), tu_randint(1, 9)};
    cpu_gradcheck(ctx, 2, s2);
    int64_t s4[4] = {2, tu_randint(1, 3), tu_randint(1, 3),
                     2 * tu_randint(0, 3) + 1}; /* NHWC, C odd */
    cpu_gradcheck(ctx, 4, s4);
    int64_t m1[2] = {1, tu_randint(1, 6)}; /* M = 1: y = beta, running_var unchanged */
    cpu_gradcheck(ctx, 2, m1);
    int64_t c1[1] = {tu_randint(2, 9)}; /* 1-D x: one row */
    cpu_gradcheck(ctx, 1, c1);
    int64_t wide[2] = {3, tu_randint(65, 140)}; /* more than one 64-channel chunk */
    cpu_gradcheck(ctx, 2, wide);
    cpu_lowp(ctx, SG_DTYPE_F32);
    cpu_lowp(ctx, SG_DTYPE_BF16);
    errors(ctx);
    cpu_errors_f64(ctx);
    int64_t cs[4] = {2, 3, 3, tu_randint(1, 20)};
    capture_case(ctx, 4, cs, SG_DTYPE_F32);
    capture_case(ctx, 4, cs, SG_DTYPE_BF16);
    sg_ctx_destroy(ctx);
}

/* ---- gpu: CUDA against the CPU reference ---- */


/* One shape, one dtype dt (f32 or bf16; per-channel tensors f32): the training forward, the
 * eval forward and the backward against the CPU reference in dt (outputs poisoned), then all
 * again: the same bits, and 3 + 1 + 3 launches.
 * Tolerances: dt's rule as is (f32's for every per-channel tensor). The GPU sums each channel
 * in double (only the order differs from the reference's double sums), so mean, rstd, the
 * running statistics, dgamma and dbeta differ from the reference by their final rounding to
 * f32. y and dx are f32 arithmetic on O(1) values (|x| <= 5, rstd ~ 1, gamma <= 1.5): a few
 * f32 ulp, ~1e-6 absolute, under f32's atol 1e-5; in bf16 both sides round each output once
 * from the same bf16 inputs, so they differ by at most one bf16 ulp (2^-8 relative), under
 * bf16's rtol 1.6e-2 (atol 1e-2 below |y| ~ 0.6). */
static void gpu_case(sg_ctx *gpu, sg_ctx *cpu, int ndim, const int64_t *shape, bool odd,
                     sg_dtype dt)
{
    const int64_t C = shape[ndim - 1];
    const sg_dtype f32 = SG_DTYPE_F32;
    char what[80];
    shape_label(what, sizeof what, "batchnorm", ndim, shape);
    snprintf(what + strlen(what), sizeof what - strlen(what), " %s%s", sg_dtype_name(dt),
             odd ? " unaligned views" : "");

    sg_tensor *xbase, *dybase;
    sg_tensor *x = tu_maybe_view(gpu, dt, ndim, shape, odd, "x", &xbase);
    sg_tensor *dy = tu_maybe_view(gpu, dt, ndim, shape, odd, "dy", &dybase);
    sg_tensor *y = tu_tensor(gpu, dt, ndim, shape, "y"),
              *dx = tu_tensor(gpu, dt, ndim, shape, "dx");
    sg_tensor *g = tu_tensor1(gpu, f32, C, "gamma"), *b = tu_tensor1(gpu, f32, C, "beta"),
              *mean = tu_tensor1(gpu, f32, C, "mean"), *rstd = tu_tensor1(gpu, f32, C, "rstd"),
              *rm = tu_tensor1(gpu, f32, C, "running_mean"),
              *rv = tu_tensor1(gpu, f32, C, "running_var"), *dg = tu_tensor1(gpu, f32, C, "dgamma"),
              *db = tu_tensor1(gpu, f32, C, "dbeta");
    free(random_cols(x, 3.0));
    free(tu_random(dy, -1, 1)), free(tu_random(g, -1.5, 1.5)), free(tu_random(b, -1, 1));
    free(tu_random(rm, -1, 1)), free(tu_random(rv, 0.5, 2));
    const float mom = (float)tu_uniform(0.05, 0.5), eps = 1e-5f;

    sg_tensor *xc = tu_clone_to(cpu, x, dt), *dyc = tu_clone_to(cpu, dy, dt),
              *gc = tu_clone_to(cpu, g, f32), *bc = tu_clone_to(cpu, b, f32),
              *rmc = tu_clone_to(cpu, rm, f32), *rvc = tu_clone_to(cpu, rv, f32);
    sg_tensor *yc = tu_tensor(cpu, dt, ndim, shape, "y_ref"),
              *dxc = tu_tensor(cpu, dt, ndim, shape, "dx_ref");
    sg_tensor *mc = tu_tensor1(cpu, f32, C, "mean_ref"), *rc = tu_tensor1(cpu, f32, C, "rstd_ref"),
              *dgc = tu_tensor1(cpu, f32, C, "dgamma_ref"),
              *dbc = tu_tensor1(cpu, f32, C, "dbeta_ref");
    const tu_tol tol = tu_tol_for(dt), t32 = tu_tol_for(f32);

    /* Eval first (the running statistics as given), then training (which updates them). */
    void *rm0 = tu_raw(rm), *rv0 = tu_raw(rv);
    TU_OK(cpu, sg_batchnorm_forward(cpu, xc, gc, bc, rmc, rvc, mom, eps, 0, yc, mc, rc));
    tu_poison(y), tu_poison(mean), tu_poison(rstd);
    TU_OK(gpu, sg_batchnorm_forward(gpu, x, g, b, rm, rv, mom, eps, 0, y, mean, rstd));
    char w[112];
    snprintf(w, sizeof w, "%s eval y", what), tu_close_tensors(w, y, yc, tol);
    snprintf(w, sizeof w, "%s eval mean", what), tu_close_tensors(w, mean, mc, t32);
    snprintf(w, sizeof w, "%s eval rstd", what), tu_close_tensors(w, rstd, rc, t32);
    TU_CHECK(tu_same_bytes(rm, rm0) && tu_same_bytes(rv, rv0),
             "%s: eval changed the running "
             "statistics",
             what);
    void *eval_y = tu_raw(y);

    TU_OK(cpu, sg_batchnorm_forward(cpu, xc, gc, bc, rmc, rvc, mom, eps, 1, yc, mc, rc));
    tu_poison(y), tu_poison(mean), tu_poison(rstd);
    TU_OK(gpu, sg_batchnorm_forward(gpu, x, g, b, rm, rv, mom, eps, 1, y, mean, rstd));
    snprintf(w, sizeof w, "%s training y", what), tu_close_tensors(w, y, yc, tol);
    snprintf(w, sizeof w, "%s training mean", what), tu_close_tensors(w, mean, mc, t32);
    snprintf(w, sizeof w, "%s training rstd", what), tu_close_tensors(w, rstd, rc, t32);
    snprintf(w, sizeof w, "%s running_mean", what), tu_close_tensors(w, rm, rmc, t32);
    snprintf(w, sizeof w, "%s running_var%s", what, rows_of(x) == 1 ? " (M = 1: unchanged)" : "");
    tu_close_tensors(w, rv, rvc, t32);
    if (rows_of(x) == 1) TU_CHECK(tu_same_bytes(rv, rv0), "%s: M = 1 changed running_var", what);

    /* The backward reads the reference's statistics, so both sides start from the same. */
    sg_tensor *mg = tu_clone_to(gpu, mc, f32), *rg = tu_clone_to(gpu, rc, f32);
    TU_OK(cpu, sg_batchnorm_backward(cpu, xc, gc, mc, rc, dyc, dxc, dgc, dbc));
    tu_poison(dx), tu_poison(dg), tu_poison(db);
    TU_OK(gpu, sg_batchnorm_backward(gpu, x, g, mg, rg, dy, dx, dg, db));
    /* dx with M = 1: dy - dbeta/M - xhat dgamma/M is 0 in exact arithmetic (dbeta = dy, xhat = 0)
     * but rstd = 1/sqrt(eps) = 316 multiplies f32's rounding of dy - dbeta there (up to one ulp
     * of dy): atol scales with rstd. */
    tu_tol tol_dx = tol;
    if (rows_of(x) == 1) tol_dx.atol *= 1.0 / sqrt(eps);
    snprintf(w, sizeof w, "%s dx", what), tu_close_tensors(w, dx, dxc, tol_dx);
    snprintf(w, sizeof w, "%s dgamma", what), tu_close_tensors(w, dg, dgc, t32);
    snprintf(w, sizeof w, "%s dbeta", what), tu_close_tensors(w, db, dbc, t32);

    /* Again from the same running statistics: the same bits, and the documented launches. */
    const sg_tensor *outs[8] = {y, mean, rstd, rm, rv, dx, dg, db};
    void *first[8];
    for (int i = 0; i < 8; i++) first[i] = tu_raw(outs[i]);
    TU_OK(gpu, sg_tensor_copy_from_host(rm, rm0, sg_tensor_nbytes(rm)));
    TU_OK(gpu, sg_tensor_copy_from_host(rv, rv0, sg_tensor_nbytes(rv)));
    tu_poison(y), tu_poison(mean), tu_poison(rstd);
    uint64_t n0 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_batchnorm_forward(gpu, x, g, b, rm, rv, mom, eps, 0, y, mean, rstd));
    uint64_t n1 = sg_ctx_launch_count(gpu), n_eval = n1 - n0;
    TU_CHECK(tu_same_bytes(y, eval_y), "%s: eval y differs between two identical runs", what);
    tu_poison(y), tu_poison(mean), tu_poison(rstd), tu_poison(dx), tu_poison(dg), tu_poison(db);
    n1 = sg_ctx_launch_count(gpu); /* after the poisons, which launch fills */
    TU_OK(gpu, sg_batchnorm_forward(gpu, x, g, b, rm, rv, mom, eps, 1, y, mean, rstd));
    uint64_t n2 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_batchnorm_backward(gpu, x, g, mg, rg, dy, dx, dg, db));
    uint64_t n3 = sg_ctx_launch_count(gpu);
    TU_CHECK(n_eval == 1, "%s: eval forward made %llu launches, expected 1", what,
             (unsigned long long)n_eval);
    TU_CHECK(n2 - n1 == 3, "%s: training forward made %llu launches, expected 3", what,
             (unsigned long long)(n2 - n1));
    TU_CHECK(n3 - n2 == 3, "%s: backward made %llu launches, expected 3", what,
             (unsigned long long)(n3 - n2));
    for (int i = 0; i < 8; i++) {
        TU_CHECK(tu_same_bytes(outs[i], first[i]), "%s: %s differs between two identical runs",
                 what, outs[i]->name);
        free(first[i]);
    }
    free(rm0), free(rv0), free(eval_y);
    sg_tensor *ts[] = {x,  dy,  y,  dx, g,   b,   mean, rstd, rm, rv, dg,  db,  xbase, dybase,
                       xc, dyc, gc, bc, rmc, rvc, yc,   dxc,  mc, rc, dgc, dbc, mg,    rg};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* The CUDA kernels' channel cap (the scratch of per-part sums). */
static void gpu_edges(sg_ctx *gpu)
{
    const int64_t big = SG_BATCHNORM_CUDA_MAX_C + 1;
    const sg_dtype f32 = SG_DTYPE_F32;
    sg_tensor *x = tu_tensor2(gpu, f32, 1, big, "x"), *y = tu_tensor2(gpu, f32, 1, big, "y");
    sg_tensor *g = tu_tensor1(gpu, f32, big, "gamma"), *b = tu_tensor1(gpu, f32, big, "beta"),
              *m = tu_tensor1(gpu, f32, big, "mean"), *r = tu_tensor1(gpu, f32, big, "rstd");
    TU_FAILS(gpu, sg_batchnorm_forward(gpu, x, g, b, NULL, NULL, 0.1f, 1e-5f, 1, y, m, r),
             SG_ERR_UNSUPPORTED, "the CUDA kernels take at most");
    sg_tensor *ts[] = {x, y, g, b, m, r};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void gpu_tests(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    int64_t rm = tu_randint(1, 5000), rc = tu_randint(1, 3000);
    if (rm * rc > (2 << 20)) rm = (2 << 20) / rc; /* keep the double reference quick */
    const int64_t s2[][2] = {{1, 7},   {1, 64},   {5, 3},     {37, 13},
                             {300, 2}, {2, 4096}, {4097, 40}, {rm, rc}};
    const int64_t s4[][4] = {{2, 7, 9, 19},    {4, 28, 28, 64}, {8, 7, 7, 2048},
                             {32, 32, 32, 24}, {3, 1, 1, 33},   {16, 56, 56, 8}};
    const sg_dtype dts[2] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        const sg_dtype dt = dts[d];
        for (size_t s = 0; s < sizeof s2 / sizeof *s2; s++) gpu_case(gpu, cpu, 2, s2[s], false, dt);
        for (size_t s = 0; s < sizeof s4 / sizeof *s4; s++) gpu_case(gpu, cpu, 4, s4[s], false, dt);
        const int64_t v1[4] = {2, 5, 5, 64}, v2[2] = {33, 256}; /* C % 8 == 0 but unaligned */
        gpu_case(gpu, cpu, 4, v1, true, dt);
        gpu_case(gpu, cpu, 2, v2, true, dt);
        const int64_t cs[4] = {8, 14, 14, 96}, cs2[2] = {3, 33};
        capture_case(gpu, 4, cs, dt);
        capture_case(gpu, 2, cs2, dt);
    }
    errors(gpu);
    gpu_edges(gpu);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_batchnorm");
    if (!strcmp(mode, "gpu"))
        gpu_tests();
    else
        cpu_tests();
    return tu_finish("test_batchnorm");
}
