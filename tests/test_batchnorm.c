/* test_batchnorm.c: batch normalisation forward (training and eval) and backward, plain and
 * fused with a residual and a ReLU (sg_batchnorm_act_*). `cpu`: the forward against the formula
 * written here (2-D and 4-D x, M = 1), the running statistics' update against its formula
 * (momentum, unbiased variance), eval mode, float64 finite differences of dx, dgamma, dbeta
 * (and dresidual) through the training forward, f32 and bf16 storage against f64 on the same
 * values, argument errors (the context usable afterwards), and a captured plan.
 * `gpu`: the CUDA kernels, f32 and bf16, against the CPU reference in the same dtype on fresh
 * random inputs (odd channel counts, M = 1, wide C, many rows, 16-byte and scalar paths),
 * outputs poisoned first; bitwise determinism; the act variants with NONE and no residual equal
 * to the plain calls; the launches per call; dy left as it was; a captured graph that
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

/* The fused forms' definition: naive_bn, then the residual (res: NULL for none) and the ReLU. */
static void naive_bn_act(const double *x, const double *g, const double *b, const double *res,
                         sg_activation act, int64_t M, int64_t C, double eps, int training,
                         double mom, double *rm, double *rv, double *y, double *mean, double *rstd)
{
    naive_bn(x, g, b, M, C, eps, training, mom, rm, rv, y, mean, rstd);
    for (int64_t i = 0; i < M * C; i++) {
        if (res) y[i] += res[i];
        if (act == SG_ACT_RELU) y[i] = y[i] > 0 ? y[i] : 0;
    }
}

/* dresidual's value: dy where y > 0 with RELU, else dy (n values; caller frees). */
static double *masked(const sg_tensor *dy, const sg_tensor *y, sg_activation act)
{
    double *g = tu_get(dy), *yv = act == SG_ACT_RELU ? tu_get(y) : NULL;
    for (int64_t i = 0; yv && i < dy->numel; i++) g[i] = yv[i] > 0 ? g[i] : 0;
    free(yv);
    return g;
}

/* A case's label: "batchnorm+relu", "batchnorm+residual+relu", ... */
static const char *act_label(sg_activation act, bool res)
{
    if (act == SG_ACT_RELU) return res ? "batchnorm+residual+relu" : "batchnorm+relu";
    return res ? "batchnorm+residual" : "batchnorm act NONE";
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
    sg_tensor *res; /* the fused forms (bn_act_loss): residual (NULL: none) and act */
    sg_activation act;
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
    bn_case c = {ctx, x, g, b, y, mean, rstd, r, eps, NULL, SG_ACT_NONE};
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

/* L = sum(y * r) through the fused training forward, y = act(bn(x) + residual). */
static double bn_act_loss(void *u)
{
    bn_case *c = u;
    TU_OK(c->ctx, sg_batchnorm_act_forward(c->ctx, c->x, c->g, c->b, c->res, c->act, NULL, NULL,
                                           0.1f, c->eps, 1, c->y, c->mean, c->rstd));
    return tu_dot(c->y, c->r);
}

/* How close to the ReLU's kink a pre-activation v = gamma xhat + beta + residual may lie when
 * the finite differences move one input by h: within h * L of 0 a step can cross the kink and
 * the difference quotient is wrong. L bounds |dv/d(input)| to first order, the largest of
 *   beta, residual: 1;
 *   gamma_c: |xhat| of the channel;
 *   x_i: |gamma| rstd max |delta_ij - 1/M - xhat_i xhat_j / M| <= |gamma| rstd (1 - 1/M + max
 *        xhat^2 / M) (d xhat_j / d x_i = rstd (delta_ij - 1/M - xhat_i xhat_j / M); 0 at M = 1,
 *        where y = beta whatever x is).
 * Ten times h L leaves room for the second-order terms: ~h^2 |gamma| rstd^2, at most h rstd
 * <= 1e-5 / sqrt(eps) ~ 3e-3 of h L here. */
static double kink_margin(const double *x, const double *g, const double *mean,
                          const double *rstd, int64_t M, int64_t C, double h)
{
    double lip = 1;
    for (int64_t c = 0; c < C; c++) {
        double xh = 0;
        for (int64_t r = 0; r < M; r++) xh = fmax(xh, fabs((x[r * C + c] - mean[c]) * rstd[c]));
        lip = fmax(lip, xh);
        lip = fmax(lip, fabs(g[c]) * rstd[c] * (1 - 1.0 / M + xh * xh / M));
    }
    return 10 * h * lip;
}

/* The fused forms in f64: the forward (training with the running statistics, then eval)
 * against naive_bn_act, and the backward's dx, dgamma, dbeta, dresidual against central
 * differences of L = sum(r * y) through the training forward (dy = r, left as it was). With
 * RELU the inputs are drawn again until no pre-activation lies within kink_margin of 0, so the
 * differences never straddle the kink, whatever the seed. */
static void cpu_gradcheck_act(sg_ctx *ctx, int ndim, const int64_t *shape, sg_activation act,
                              bool with_res)
{
    const sg_dtype f64 = SG_DTYPE_F64;
    const int64_t C = shape[ndim - 1];
    sg_tensor *x = tu_tensor(ctx, f64, ndim, shape, "x");
    const int64_t M = rows_of(x), n = x->numel;
    sg_tensor *y = tu_tensor(ctx, f64, ndim, shape, "y"),
              *r = tu_tensor(ctx, f64, ndim, shape, "r"),
              *dx = tu_tensor(ctx, f64, ndim, shape, "dx"),
              *res = with_res ? tu_tensor(ctx, f64, ndim, shape, "residual") : NULL,
              *dres = with_res ? tu_tensor(ctx, f64, ndim, shape, "dresidual") : NULL;
    sg_tensor *g = tu_tensor1(ctx, f64, C, "gamma"), *b = tu_tensor1(ctx, f64, C, "beta"),
              *dg = tu_tensor1(ctx, f64, C, "dgamma"), *db = tu_tensor1(ctx, f64, C, "dbeta"),
              *mean = tu_tensor1(ctx, f64, C, "mean"), *rstd = tu_tensor1(ctx, f64, C, "rstd"),
              *rm = tu_tensor1(ctx, f64, C, "running_mean"),
              *rv = tu_tensor1(ctx, f64, C, "running_var");
    const float eps = (float)tu_uniform(1e-5, 1e-2), mom = (float)tu_uniform(0.05, 0.9);
    const double h = 1e-5;
    char what[80], w[112];
    shape_label(what, sizeof what, act_label(act, with_res), ndim, shape);
    snprintf(what + strlen(what), sizeof what - strlen(what), " f64");

    double *ye = malloc((size_t)n * sizeof *ye), *me = malloc((size_t)C * sizeof *me),
           *re = malloc((size_t)C * sizeof *re);
    double *xv = NULL, *gv = NULL, *bv = NULL, *resv = NULL, vmin = 0, margin = 0;
    int draws = 0;
    do {
        free(xv), free(gv), free(bv), free(resv);
        xv = random_cols(x, 2.0), gv = tu_random(g, -1.5, 1.5), bv = tu_random(b, -1, 1);
        resv = with_res ? tu_random(res, -1, 1) : NULL;
        naive_bn_act(xv, gv, bv, resv, SG_ACT_NONE, M, C, eps, 1, 0, NULL, NULL, ye, me, re);
        margin = kink_margin(xv, gv, me, re, M, C, h);
        vmin = INFINITY;
        for (int64_t i = 0; i < n; i++) vmin = fmin(vmin, fabs(ye[i]));
    } while (act == SG_ACT_RELU && vmin < margin && ++draws < 200);
    TU_CHECK(act != SG_ACT_RELU || vmin >= margin,
             "%s: 200 draws left a pre-activation within %g of the kink", what, margin);
    free(tu_random(r, -1, 1));
    double *rmv = tu_random(rm, -1, 1), *rvv = tu_random(rv, 0.5, 2);

    /* Training (the running statistics move), then eval (they normalise, unchanged). */
    const tu_tol t64 = tu_tol_for(f64);
    for (int training = 1; training >= 0; training--) {
        const char *mode = training ? "training" : "eval";
        void *rm0 = tu_raw(rm), *rv0 = tu_raw(rv);
        tu_poison(y), tu_poison(mean), tu_poison(rstd);
        TU_OK(ctx, sg_batchnorm_act_forward(ctx, x, g, b, res, act, rm, rv, mom, eps, training, y,
                                            mean, rstd));
        naive_bn_act(xv, gv, bv, resv, act, M, C, eps, training, mom, rmv, rvv, ye, me, re);
        snprintf(w, sizeof w, "%s %s y vs formula", what, mode);
        tu_close_vals(w, y, ye, n, t64);
        snprintf(w, sizeof w, "%s %s mean", what, mode), tu_close_vals(w, mean, me, C, t64);
        snprintf(w, sizeof w, "%s %s rstd", what, mode), tu_close_vals(w, rstd, re, C, t64);
        snprintf(w, sizeof w, "%s %s running_mean", what, mode), tu_close_vals(w, rm, rmv, C, t64);
        snprintf(w, sizeof w, "%s %s running_var", what, mode), tu_close_vals(w, rv, rvv, C, t64);
        if (!training)
            TU_CHECK(tu_same_bytes(rm, rm0) && tu_same_bytes(rv, rv0),
                     "%s: eval changed the running statistics", what);
        free(rm0), free(rv0);
    }

    /* Backward with dy = r from the training forward's statistics and y (the mask); dresidual
     * is g itself (dy, or 0 where y <= 0): exact. Central differences as cpu_gradcheck. */
    TU_OK(ctx, sg_batchnorm_act_forward(ctx, x, g, b, res, act, NULL, NULL, mom, eps, 1, y, mean,
                                        rstd));
    void *r0 = tu_raw(r);
    tu_poison(dx), tu_poison(dg), tu_poison(db);
    if (dres) tu_poison(dres);
    TU_OK(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, act,
                                         act == SG_ACT_RELU ? y : NULL, r, dx, dres, dg, db));
    TU_CHECK(tu_same_bytes(r, r0), "%s: the backward changed dy", what);
    if (dres) {
        double *ge = masked(r, y, act);
        snprintf(w, sizeof w, "%s dresidual vs dy masked", what);
        tu_close_vals(w, dres, ge, n, (tu_tol){0, 0});
        free(ge);
    }
    bn_case c = {ctx, x, g, b, y, mean, rstd, r, eps, res, act};
    const tu_tol tol = {1e-8, 1e-6};
    snprintf(w, sizeof w, "%s dx", what), tu_gradcheck(w, bn_act_loss, &c, x, dx, 0, h, tol);
    snprintf(w, sizeof w, "%s dgamma", what), tu_gradcheck(w, bn_act_loss, &c, g, dg, 0, h, tol);
    snprintf(w, sizeof w, "%s dbeta", what), tu_gradcheck(w, bn_act_loss, &c, b, db, 0, h, tol);
    if (res) {
        snprintf(w, sizeof w, "%s dresidual", what);
        tu_gradcheck(w, bn_act_loss, &c, res, dres, 0, h, tol);
    }
    free(xv), free(gv), free(bv), free(resv), free(rmv), free(rvv), free(ye), free(me), free(re);
    free(r0);
    sg_tensor *ts[] = {x, y, r, dx, res, dres, g, b, dg, db, mean, rstd, rm, rv};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* Every shape of the f64 checks: the plain calls, then the fused ones with and without a
 * residual, act NONE and RELU. */
static void cpu_gradcheck_all(sg_ctx *ctx, int ndim, const int64_t *shape)
{
    cpu_gradcheck(ctx, ndim, shape);
    for (int k = 0; k < 4; k++)
        cpu_gradcheck_act(ctx, ndim, shape, k & 1 ? SG_ACT_RELU : SG_ACT_NONE, k >= 2);
}

/* Storage dtype dt (f32 or bf16; per-channel tensors f32), plain or fused, on the CPU against
 * the f64 reference (checked by the formula and finite differences above) on the same values:
 * the reference computes in double and rounds only the outputs, so dt's outputs sit within half
 * an ulp of dt of f64 (inside dt's rule) and the f32 statistics within f32 rounding (the f32
 * rule). SG_ACT_NONE without a residual is also run through the plain calls: the same bits.
 * The backward of both sides takes one mask: the f64 forward's y, and
 * for dt that y rounded to dt. Rounding keeps y > 0 versus y == 0 (f32 and bf16 reach down to
 * ~1e-38, denormals aside, far below any positive y here), so both mask the same elements; and
 * dresidual (dy or 0, dy exact in dt) agrees exactly. dy is left as it was. */
static void cpu_lowp_act(sg_ctx *ctx, sg_dtype dt, sg_activation act, bool with_res)
{
    const int64_t shape[4] = {tu_randint(1, 3), tu_randint(1, 5), tu_randint(1, 5),
                              tu_randint(1, 70)};
    const int64_t C = shape[3];
    const sg_dtype f32 = SG_DTYPE_F32, f64 = SG_DTYPE_F64;
    sg_tensor *x = tu_tensor(ctx, dt, 4, shape, "x"), *y = tu_tensor(ctx, dt, 4, shape, "y"),
              *dy = tu_tensor(ctx, dt, 4, shape, "dy"), *dx = tu_tensor(ctx, dt, 4, shape, "dx"),
              *res = with_res ? tu_tensor(ctx, dt, 4, shape, "residual") : NULL,
              *dres = with_res ? tu_tensor(ctx, dt, 4, shape, "dresidual") : NULL;
    sg_tensor *g = tu_tensor1(ctx, f32, C, "gamma"), *b = tu_tensor1(ctx, f32, C, "beta"),
              *dg = tu_tensor1(ctx, f32, C, "dgamma"), *db = tu_tensor1(ctx, f32, C, "dbeta"),
              *mean = tu_tensor1(ctx, f32, C, "mean"), *rstd = tu_tensor1(ctx, f32, C, "rstd"),
              *rm = tu_tensor1(ctx, f32, C, "running_mean"),
              *rv = tu_tensor1(ctx, f32, C, "running_var");
    free(random_cols(x, 3.0));
    free(tu_random(g, -1.5, 1.5)), free(tu_random(b, -1, 1)), free(tu_random(dy, -1, 1));
    free(tu_random(rm, -1, 1)), free(tu_random(rv, 0.5, 2));
    if (res) free(tu_random(res, -2, 2));
    sg_tensor *x64 = tu_clone_to(ctx, x, f64), *g64 = tu_clone_to(ctx, g, f64),
              *b64 = tu_clone_to(ctx, b, f64), *dy64 = tu_clone_to(ctx, dy, f64),
              *rm64 = tu_clone_to(ctx, rm, f64), *rv64 = tu_clone_to(ctx, rv, f64),
              *res64 = res ? tu_clone_to(ctx, res, f64) : NULL;
    sg_tensor *y64 = tu_tensor(ctx, f64, 4, shape, "y64"),
              *dx64 = tu_tensor(ctx, f64, 4, shape, "dx64"),
              *dres64 = res ? tu_tensor(ctx, f64, 4, shape, "dresidual64") : NULL;
    sg_tensor *m64 = tu_tensor1(ctx, f64, C, "mean64"), *r64 = tu_tensor1(ctx, f64, C, "rstd64"),
              *dg64 = tu_tensor1(ctx, f64, C, "dgamma64"),
              *db64 = tu_tensor1(ctx, f64, C, "dbeta64");
    char what[96], w[144];
    snprintf(what, sizeof what, "%s %s cpu vs f64", act_label(act, with_res), sg_dtype_name(dt));
    const tu_tol tol = tu_tol_for(dt), t32 = tu_tol_for(f32);
    for (int training = 1; training >= 0; training--) {
        tu_poison(y), tu_poison(mean), tu_poison(rstd);
        TU_OK(ctx, sg_batchnorm_act_forward(ctx, x, g, b, res, act, rm, rv, 0.1f, 1e-5f, training,
                                            y, mean, rstd));
        TU_OK(ctx, sg_batchnorm_act_forward(ctx, x64, g64, b64, res64, act, rm64, rv64, 0.1f,
                                            1e-5f, training, y64, m64, r64));
        const char *mode = training ? "training" : "eval";
        snprintf(w, sizeof w, "%s %s y", what, mode), tu_close_tensors(w, y, y64, tol);
        snprintf(w, sizeof w, "%s %s mean", what, mode), tu_close_tensors(w, mean, m64, t32);
        snprintf(w, sizeof w, "%s %s rstd", what, mode), tu_close_tensors(w, rstd, r64, t32);
        snprintf(w, sizeof w, "%s %s running_mean", what, mode), tu_close_tensors(w, rm, rm64, t32);
        snprintf(w, sizeof w, "%s %s running_var", what, mode), tu_close_tensors(w, rv, rv64, t32);
    }
    TU_OK(ctx, sg_batchnorm_act_forward(ctx, x64, g64, b64, res64, act, NULL, NULL, 0.1f, 1e-5f, 1,
                                        y64, m64, r64));
    TU_OK(ctx, sg_batchnorm_act_forward(ctx, x, g, b, res, act, NULL, NULL, 0.1f, 1e-5f, 1, y,
                                        mean, rstd));
    sg_tensor *ym = tu_clone_to(ctx, y64, dt); /* the f64 mask, in dt */
    /* The CPU computes every dtype in double, from the same values, and rounds y once (the
     * header: bn(x) is not rounded before the sum): the training y in dt is the f64 y rounded to
     * dt, exactly. (Eval differs: the running statistics were rounded to f32 by the update.) */
    snprintf(w, sizeof w, "%s training y vs f64 y rounded once", what);
    tu_close_tensors(w, y, ym, (tu_tol){0, 0});
    const bool relu = act == SG_ACT_RELU;
    TU_OK(ctx, sg_batchnorm_act_backward(ctx, x64, g64, m64, r64, act, relu ? y64 : NULL, dy64,
                                         dx64, dres64, dg64, db64));
    void *dy0 = tu_raw(dy);
    tu_poison(dx), tu_poison(dg), tu_poison(db);
    if (dres) tu_poison(dres);
    TU_OK(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, act, relu ? ym : NULL, dy, dx,
                                         dres, dg, db));
    TU_CHECK(tu_same_bytes(dy, dy0), "%s: the backward changed dy", what);
    snprintf(w, sizeof w, "%s dx", what), tu_close_tensors(w, dx, dx64, tol);
    snprintf(w, sizeof w, "%s dgamma", what), tu_close_tensors(w, dg, dg64, t32);
    snprintf(w, sizeof w, "%s dbeta", what), tu_close_tensors(w, db, db64, t32);
    if (dres) {
        snprintf(w, sizeof w, "%s dresidual (exact)", what);
        tu_close_tensors(w, dres, dres64, (tu_tol){0, 0});
    }
    free(dy0);
    if (act == SG_ACT_NONE && !res) { /* the plain calls are these */
        sg_tensor *outs[6] = {y, mean, rstd, dx, dg, db};
        void *fused[6];
        for (int i = 0; i < 6; i++) fused[i] = tu_raw(outs[i]), tu_poison(outs[i]);
        TU_OK(ctx, sg_batchnorm_forward(ctx, x, g, b, NULL, NULL, 0.1f, 1e-5f, 1, y, mean, rstd));
        TU_OK(ctx, sg_batchnorm_backward(ctx, x, g, mean, rstd, dy, dx, dg, db));
        for (int i = 0; i < 6; i++) {
            TU_CHECK(tu_same_bytes(outs[i], fused[i]), "%s: %s of the plain call differs from the "
                     "act variant's (NONE)", what, outs[i]->name);
            free(fused[i]);
        }
    }
    sg_tensor *ts[] = {x,    y,    dy,  dx,   res,  dres,   g,   b,    dg,     db,  mean,
                       rstd, rm,   rv,  x64,  g64,  b64,    dy64, rm64, rv64,  res64, y64,
                       dx64, dres64, m64, r64, dg64, db64,   ym};
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

    /* The fused forms: act NONE or RELU; a residual like x; y (RELU: the mask) and dresidual
     * like x; outputs apart from everything the call touches. */
    sg_tensor *res = tu_tensor2(ctx, f32, M, C, "residual"),
              *dres = tu_tensor2(ctx, f32, M, C, "dresidual");
    double *resv = tu_random(res, -1, 1);
    const sg_activation relu = SG_ACT_RELU;
    TU_CHECK(sg_batchnorm_act_forward(NULL, x, g, b, res, relu, rm, rv, 0.1f, 1e-5f, 1, y, mean,
                                      rstd) == SG_ERR_NULL,
             "ctx NULL");
    TU_FAILS(ctx, sg_batchnorm_act_forward(ctx, x, g, b, res, SG_ACT_GELU, rm, rv, 0.1f, 1e-5f, 1,
                                           y, mean, rstd),
             SG_ERR_INVALID, "SG_ACT_NONE or SG_ACT_RELU");
    TU_FAILS(ctx, sg_batchnorm_act_forward(ctx, NULL, g, b, res, relu, rm, rv, 0.1f, 1e-5f, 1, y,
                                           mean, rstd),
             SG_ERR_NULL, "sg_batchnorm_act_forward: tensor 'x' is NULL");
    TU_FAILS(ctx, sg_batchnorm_act_forward(ctx, x, g, b, y6, relu, rm, rv, 0.1f, 1e-5f, 1, y, mean,
                                           rstd),
             SG_ERR_SHAPE, "'residual' is (6, 6) f32");
    TU_FAILS(ctx, sg_batchnorm_act_forward(ctx, x, g, b, yb, relu, rm, rv, 0.1f, 1e-5f, 1, y, mean,
                                           rstd),
             SG_ERR_DTYPE, "tensor 'residual' is bf16, expected f32");
    TU_FAILS(ctx, sg_batchnorm_act_forward(ctx, x, g, b, res, relu, rm, rv, 0.1f, 1e-5f, 1, y6,
                                           mean, rstd),
             SG_ERR_SHAPE, "but 'y' is (6, 6) f32");
    TU_FAILS(ctx, sg_batchnorm_act_forward(ctx, x, g, b, res, relu, rm, rv, 0.1f, 1e-5f, 1, res,
                                           mean, rstd),
             SG_ERR_INVALID, "output 'y' overlaps 'residual'");
    TU_FAILS(ctx, sg_batchnorm_act_forward(ctx, x, g, b, res, relu, rm, rv, 0.1f, 1e-5f, 1, x,
                                           mean, rstd),
             SG_ERR_INVALID, "output 'y' overlaps 'x'");
    TU_FAILS(ctx, sg_batchnorm_act_forward(ctx, x, g, b, res, relu, rm, rv, 2.0f, 1e-5f, 1, y, mean,
                                           rstd),
             SG_ERR_INVALID, "momentum is 2");
    TU_OK(ctx, sg_batchnorm_act_forward(ctx, x, g, b, res, relu, NULL, NULL, 0.1f, 1e-5f, 1, y,
                                        mean, rstd));
    TU_FAILS(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, SG_ACT_SILU, y, dy, dx, dres,
                                            dg, db),
             SG_ERR_INVALID, "SG_ACT_NONE or SG_ACT_RELU");
    TU_FAILS(ctx,
             sg_batchnorm_act_backward(ctx, x, g, mean, rstd, relu, NULL, dy, dx, dres, dg, db),
             SG_ERR_NULL, "'y'");
    TU_FAILS(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, relu, y6, dy, dx, dres, dg, db),
             SG_ERR_SHAPE, "but 'y' is (6, 6) f32");
    TU_FAILS(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, relu, yb, dy, dx, dres, dg, db),
             SG_ERR_DTYPE, "but 'y' is (6, 5) bf16");
    TU_FAILS(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, relu, y, dy, dx, y6, dg, db),
             SG_ERR_SHAPE, "but 'dresidual' is (6, 6) f32");
    TU_FAILS(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, relu, y, dy, dx, yb, dg, db),
             SG_ERR_DTYPE, "but 'dresidual' is (6, 5) bf16");
    TU_FAILS(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, relu, y, dy, dx, dy, dg, db),
             SG_ERR_INVALID, "output 'dresidual' overlaps 'dy'");
    TU_FAILS(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, relu, y, dy, dx, y, dg, db),
             SG_ERR_INVALID, "output 'dresidual' overlaps 'y'");
    TU_FAILS(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, relu, y, dy, y, dres, dg, db),
             SG_ERR_INVALID, "output 'dx' overlaps 'y'");
    TU_FAILS(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, relu, y, dy, dx, dx, dg, db),
             SG_ERR_INVALID, "'dresidual'");
    /* With NONE there is no mask to read: y may be NULL. */
    TU_OK(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, SG_ACT_NONE, NULL, dy, dx, dres,
                                         dg, db));

    /* A failed fused call writes nothing: not y, dx or dresidual; and never dy. */
    TU_OK(ctx, sg_tensor_fill(dx, 12345.0));
    TU_OK(ctx, sg_tensor_fill(dres, 12345.0));
    void *dy0 = tu_raw(dy), *y0 = tu_raw(y);
    TU_FAILS(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, relu, y, dy, dx, dres, dg, dg),
             SG_ERR_INVALID, "overlaps");
    TU_FAILS(ctx, sg_batchnorm_act_forward(ctx, x, g, b, res, relu, NULL, NULL, 0.1f, 1e-5f, 1, y,
                                           mean, mean),
             SG_ERR_INVALID, "overlaps");
    double *dxv = tu_get(dx), *drv = tu_get(dres);
    TU_CHECK(dxv[0] == 12345.0 && dxv[M * C - 1] == 12345.0, "a failed fused call wrote dx");
    TU_CHECK(drv[0] == 12345.0 && drv[M * C - 1] == 12345.0,
             "a failed fused call wrote dresidual");
    TU_CHECK(tu_same_bytes(dy, dy0), "a failed fused call changed dy");
    TU_CHECK(tu_same_bytes(y, y0), "a failed fused call changed y");
    free(dxv), free(drv), free(dy0), free(y0);

    /* Usable afterwards, and right: the fused forms too. */
    double ye[30], me[5], re[5];
    tu_poison(y);
    TU_OK(ctx, sg_batchnorm_act_forward(ctx, x, g, b, res, relu, NULL, NULL, 0.1f, 1e-5f, 1, y,
                                        mean, rstd));
    naive_bn_act(xv, gv, bv, resv, relu, M, C, 1e-5, 1, 0, NULL, NULL, ye, me, re);
    tu_close_vals("batchnorm+residual+relu after errors: y", y, ye, M * C, tu_tol_for(f32));
    tu_poison(dres);
    TU_OK(ctx, sg_batchnorm_act_backward(ctx, x, g, mean, rstd, relu, y, dy, dx, dres, dg, db));
    double *dre = masked(dy, y, relu);
    tu_close_vals("batchnorm+residual+relu after errors: dresidual", dres, dre, M * C,
                  (tu_tol){0, 0});
    free(dre), free(resv);
    tu_poison(y);
    TU_OK(ctx, sg_batchnorm_forward(ctx, x, g, b, NULL, NULL, 0.1f, 1e-5f, 1, y, mean, rstd));
    naive_bn(xv, gv, bv, M, C, 1e-5, 1, 0, NULL, NULL, ye, me, re);
    tu_close_vals("batchnorm after errors: y", y, ye, M * C, tu_tol_for(f32));
    tu_poison(dg);
    TU_OK(ctx, sg_batchnorm_backward(ctx, x, g, mean, rstd, dy, dx, dg, db));
    double *dgv = tu_get(dg);
    TU_CHECK(isfinite(dgv[0]), "batchnorm after errors: dgamma %g", dgv[0]);
    free(dgv), free(xv), free(gv), free(bv);
    sg_tensor *ts[] = {x,  y,  dy, dx, g,   b,  dg, db, mean, rstd, rm,
                       rv, g6, gb, g2d, y6, yb, xb, xi, rv4, res, dres};
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
    const sg_tensor *x, *g, *b, *dy, *res; /* res: the fused forms (with RELU), else NULL */
    sg_tensor *rm, *rv, *y, *mean, *rstd, *dx, *dg, *db, *dres;
} bn_step;

static sg_status bn_step_fn(void *u)
{
    bn_step *s = u;
    if (s->res) {
        SG_TRY(sg_batchnorm_act_forward(s->ctx, s->x, s->g, s->b, s->res, SG_ACT_RELU, s->rm, s->rv,
                                        0.1f, 1e-5f, 1, s->y, s->mean, s->rstd));
        return sg_batchnorm_act_backward(s->ctx, s->x, s->g, s->mean, s->rstd, SG_ACT_RELU, s->y,
                                         s->dy, s->dx, s->dres, s->dg, s->db);
    }
    SG_TRY(sg_batchnorm_forward(s->ctx, s->x, s->g, s->b, s->rm, s->rv, 0.1f, 1e-5f, 1, s->y,
                                s->mean, s->rstd));
    return sg_batchnorm_backward(s->ctx, s->x, s->g, s->mean, s->rstd, s->dy, s->dx, s->dg, s->db);
}

/* Eager outputs and replayed outputs compared bit for bit, for two input fills; the running
 * statistics of both set to the same values before each round. fused: the act forms with a
 * residual and RELU (dresidual compared too). */
static void capture_case(sg_ctx *ctx, int ndim, const int64_t *shape, sg_dtype dt, bool fused)
{
    const int64_t C = shape[ndim - 1];
    const sg_dtype f32 = SG_DTYPE_F32;
    sg_tensor *x = tu_tensor(ctx, dt, ndim, shape, "x"),
              *dy = tu_tensor(ctx, dt, ndim, shape, "dy"),
              *res = fused ? tu_tensor(ctx, dt, ndim, shape, "residual") : NULL;
    sg_tensor *g = tu_tensor1(ctx, f32, C, "gamma"), *b = tu_tensor1(ctx, f32, C, "beta");
    bn_step e = {.ctx = ctx, .x = x, .g = g, .b = b, .dy = dy, .res = res}, r = e;
    bn_step *both[2] = {&e, &r};
    for (int k = 0; k < 2; k++) {
        bn_step *s = both[k];
        s->y = tu_tensor(ctx, dt, ndim, shape, "y"), s->dx = tu_tensor(ctx, dt, ndim, shape, "dx");
        s->rm = tu_tensor1(ctx, f32, C, "running_mean"),
        s->rv = tu_tensor1(ctx, f32, C, "running_var");
        s->mean = tu_tensor1(ctx, f32, C, "mean"), s->rstd = tu_tensor1(ctx, f32, C, "rstd");
        s->dg = tu_tensor1(ctx, f32, C, "dgamma"), s->db = tu_tensor1(ctx, f32, C, "dbeta");
        s->dres = fused ? tu_tensor(ctx, dt, ndim, shape, "dresidual") : NULL;
    }
    free(random_cols(x, 2.0));
    free(tu_random(dy, -1, 1)), free(tu_random(g, -1.5, 1.5)), free(tu_random(b, -1, 1));
    free(tu_random(e.rm, -1, 1)), free(tu_random(e.rv, 0.5, 2));
    if (res) free(tu_random(res, -2, 2));

    const sg_tensor *ins[3] = {x, dy, res};
    sg_graph_options o = sg_graph_options_default();
    o.name = "batchnorm";
    o.warmup = 1;
    o.static_inputs = ins;
    o.n_static_inputs = fused ? 3 : 2;
    sg_graph *graph = NULL;
    TU_OK(ctx, sg_graph_capture(ctx, bn_step_fn, &r, &o, &graph));
    const int nout = fused ? 9 : 8;
    for (int round = 0; round < 2; round++) {
        if (round) {
            free(random_cols(x, 2.0));
            free(tu_random(dy, -1, 1));
            if (res) free(tu_random(res, -2, 2));
        }
        TU_OK(ctx, sg_tensor_copy(r.rm, e.rm));
        TU_OK(ctx, sg_tensor_copy(r.rv, e.rv));
        sg_tensor *pe[] = {e.y, e.mean, e.rstd, e.dx, e.dg, e.db, e.dres};
        sg_tensor *pr[] = {r.y, r.mean, r.rstd, r.dx, r.dg, r.db, r.dres};
        for (int i = 0; i < nout - 2; i++) tu_poison(pe[i]), tu_poison(pr[i]);
        TU_OK(ctx, bn_step_fn(&e));
        TU_OK(ctx, sg_graph_replay(graph));
        const sg_tensor *ge[] = {e.y, e.mean, e.rstd, e.rm, e.rv, e.dx, e.dg, e.db, e.dres};
        const sg_tensor *gr[] = {r.y, r.mean, r.rstd, r.rm, r.rv, r.dx, r.dg, r.db, r.dres};
        for (int i = 0; i < nout; i++) {
            char w[128];
            snprintf(w, sizeof w, "%s %s C=%lld replay %d: %s vs eager",
                     fused ? "batchnorm+residual+relu" : "batchnorm", sg_dtype_name(dt),
                     (long long)C, round, ge[i]->name);
            tu_close_tensors(w, gr[i], ge[i], (tu_tol){0, 0});
        }
    }
    sg_graph_destroy(graph);
    sg_tensor *ts[] = {x,      dy,   g,    b,    res,  e.y,    e.dx,   e.rm, e.rv,
                       e.mean, e.rstd, e.dg, e.db, e.dres, r.y, r.dx, r.rm, r.rv,
                       r.mean, r.rstd, r.dg, r.db, r.dres};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void cpu_tests(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    int64_t s2[2] = {tu_randint(2, 12), tu_randint(1, 9)};
    cpu_gradcheck_all(ctx, 2, s2);
    int64_t s4[4] = {2, tu_randint(1, 3), tu_randint(1, 3),
                     2 * tu_randint(0, 3) + 1}; /* NHWC, C odd */
    cpu_gradcheck_all(ctx, 4, s4);
    int64_t m1[2] = {1, tu_randint(1, 6)}; /* M = 1: y = beta, running_var unchanged */
    cpu_gradcheck_all(ctx, 2, m1);
    int64_t c1[1] = {tu_randint(2, 9)}; /* 1-D x: one row */
    cpu_gradcheck_all(ctx, 1, c1);
    int64_t wide[2] = {3, tu_randint(65, 140)}; /* more than one 64-channel chunk */
    cpu_gradcheck_all(ctx, 2, wide);
    const sg_dtype lowp[2] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        for (int k = 0; k < 4; k++)
            cpu_lowp_act(ctx, lowp[d], k & 1 ? SG_ACT_RELU : SG_ACT_NONE, k >= 2);
    }
    errors(ctx);
    cpu_errors_f64(ctx);
    int64_t cs[4] = {2, 3, 3, tu_randint(1, 20)};
    for (int fused = 0; fused < 2; fused++) {
        capture_case(ctx, 4, cs, SG_DTYPE_F32, fused);
        capture_case(ctx, 4, cs, SG_DTYPE_BF16, fused);
    }
    sg_ctx_destroy(ctx);
}

/* ---- gpu: CUDA against the CPU reference ---- */


/* One shape, one dtype dt (f32 or bf16; per-channel tensors f32): the training forward, the
 * eval forward and the backward against the CPU reference in dt (outputs poisoned), then all
 * again twice, the plain calls and then the act variants with SG_ACT_NONE and no residual: the
 * same bits, and 1 launch (eval forward), 2 (training forward: per-part sums with the
 * statistics from the last block, then the normalisation) and 2 (backward: sums with dgamma
 * and dbeta, then dx).
 * Tolerances: dt's rule as is (f32's for every per-channel tensor). The GPU's backward sums in
 * double (only the order differs from the reference's), so dgamma and dbeta differ from the
 * reference by their final rounding to f32. Its forward sums in f32 over at most 8 rows of a
 * thread, then in double, so each sum carries a relative error of at most about 8 f32 ulp
 * (5e-7), and the mean's, divided by M, stays far under atol. The variance,
 * E[d^2] - E[d]^2 with d = x - x[0, c], amplifies it by E[d^2] / var: random_cols' values are
 * an offset plus U(-2, 2) (var 1.33), x[0, c] within 2 of the mean, so E[d^2] <= 1.33 + 4 and
 * the factor is at most 4: rstd and the running variance within ~1e-6 relative, well under
 * f32's rtol 1e-4. y and dx are f32 arithmetic on O(1) values (|x| <= 5, rstd ~ 1,
 * gamma <= 1.5): a few f32 ulp, ~1e-6 absolute, under f32's atol 1e-5; in bf16 both sides
 * round each output once from the same bf16 inputs, so they differ by at most one bf16 ulp
 * (2^-8 relative), under bf16's rtol 1.6e-2 (atol 1e-2 below |y| ~ 0.6). */
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

    /* Again from the same running statistics, the plain calls and then the act variants (NONE,
     * no residual): the same bits, and the documented launches. */
    const sg_tensor *outs[8] = {y, mean, rstd, rm, rv, dx, dg, db};
    void *first[8];
    for (int i = 0; i < 8; i++) first[i] = tu_raw(outs[i]);
    for (int fused = 0; fused < 2; fused++) {
        const char *how = fused ? "the act variant (NONE) vs the plain call" : "two identical runs";
        TU_OK(gpu, sg_tensor_copy_from_host(rm, rm0, sg_tensor_nbytes(rm)));
        TU_OK(gpu, sg_tensor_copy_from_host(rv, rv0, sg_tensor_nbytes(rv)));
        tu_poison(y), tu_poison(mean), tu_poison(rstd);
        uint64_t n0 = sg_ctx_launch_count(gpu);
        TU_OK(gpu, fused ? sg_batchnorm_act_forward(gpu, x, g, b, NULL, SG_ACT_NONE, rm, rv, mom,
                                                    eps, 0, y, mean, rstd)
                         : sg_batchnorm_forward(gpu, x, g, b, rm, rv, mom, eps, 0, y, mean, rstd));
        uint64_t n1 = sg_ctx_launch_count(gpu), n_eval = n1 - n0;
        TU_CHECK(tu_same_bytes(y, eval_y), "%s: eval y differs: %s", what, how);
        tu_poison(y), tu_poison(mean), tu_poison(rstd), tu_poison(dx), tu_poison(dg), tu_poison(db);
        n1 = sg_ctx_launch_count(gpu); /* after the poisons, which launch fills */
        TU_OK(gpu, fused ? sg_batchnorm_act_forward(gpu, x, g, b, NULL, SG_ACT_NONE, rm, rv, mom,
                                                    eps, 1, y, mean, rstd)
                         : sg_batchnorm_forward(gpu, x, g, b, rm, rv, mom, eps, 1, y, mean, rstd));
        uint64_t n2 = sg_ctx_launch_count(gpu);
        TU_OK(gpu, fused ? sg_batchnorm_act_backward(gpu, x, g, mg, rg, SG_ACT_NONE, NULL, dy, dx,
                                                     NULL, dg, db)
                         : sg_batchnorm_backward(gpu, x, g, mg, rg, dy, dx, dg, db));
        uint64_t n3 = sg_ctx_launch_count(gpu);
        const char *call = fused ? " (act variant)" : "";
        TU_CHECK(n_eval == 1, "%s: eval forward%s made %llu launches, expected 1", what, call,
                 (unsigned long long)n_eval);
        TU_CHECK(n2 - n1 == 2, "%s: training forward%s made %llu launches, expected 2", what, call,
                 (unsigned long long)(n2 - n1));
        TU_CHECK(n3 - n2 == 2, "%s: backward%s made %llu launches, expected 2", what, call,
                 (unsigned long long)(n3 - n2));
        for (int i = 0; i < 8; i++)
            TU_CHECK(tu_same_bytes(outs[i], first[i]), "%s: %s differs: %s", what, outs[i]->name,
                     how);
    }
    for (int i = 0; i < 8; i++) free(first[i]);
    free(rm0), free(rv0), free(eval_y);
    sg_tensor *ts[] = {x,  dy,  y,  dx, g,   b,   mean, rstd, rm, rv, dg,  db,  xbase, dybase,
                       xc, dyc, gc, bc, rmc, rvc, yc,   dxc,  mc, rc, dgc, dbc, mg,    rg};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* The fused forms on the GPU, one shape, dt f32 or bf16, act NONE or RELU, with or without a
 * residual: eval and training forward against the CPU reference in dt, then the backward with
 * both sides reading the same y (the GPU's, copied to the CPU: the ReLU masks agree exactly)
 * and the reference's statistics; outputs poisoned; dy left as it was; then all again: the same
 * bits, 1 + 2 + 2 launches. odd: x, dy, residual and dresidual as unaligned views.
 * Tolerances as gpu_case: the residual is added in f32 on the GPU and in double on the CPU
 * before the one rounding to dt, which keeps y within a few f32 ulp (f32) or one bf16 ulp
 * (bf16). dresidual is dy or 0 on both sides under one mask: exact. */
static void gpu_fused_case(sg_ctx *gpu, sg_ctx *cpu, int ndim, const int64_t *shape, bool odd,
                           sg_dtype dt, sg_activation act, bool with_res)
{
    const int64_t C = shape[ndim - 1];
    const sg_dtype f32 = SG_DTYPE_F32;
    const bool relu = act == SG_ACT_RELU;
    char what[112];
    shape_label(what, sizeof what, act_label(act, with_res), ndim, shape);
    snprintf(what + strlen(what), sizeof what - strlen(what), " %s%s", sg_dtype_name(dt),
             odd ? " unaligned views" : "");

    sg_tensor *xbase, *dybase, *resbase = NULL, *dresbase = NULL;
    sg_tensor *x = tu_maybe_view(gpu, dt, ndim, shape, odd, "x", &xbase);
    sg_tensor *dy = tu_maybe_view(gpu, dt, ndim, shape, odd, "dy", &dybase);
    sg_tensor *res = with_res ? tu_maybe_view(gpu, dt, ndim, shape, odd, "residual", &resbase)
                              : NULL;
    sg_tensor *dres = with_res ? tu_maybe_view(gpu, dt, ndim, shape, odd, "dresidual", &dresbase)
                               : NULL;
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
    if (res) free(tu_random(res, -2, 2));
    const float mom = (float)tu_uniform(0.05, 0.5), eps = 1e-5f;

    sg_tensor *xc = tu_clone_to(cpu, x, dt), *dyc = tu_clone_to(cpu, dy, dt),
              *resc = res ? tu_clone_to(cpu, res, dt) : NULL, *gc = tu_clone_to(cpu, g, f32),
              *bc = tu_clone_to(cpu, b, f32), *rmc = tu_clone_to(cpu, rm, f32),
              *rvc = tu_clone_to(cpu, rv, f32);
    sg_tensor *yc = tu_tensor(cpu, dt, ndim, shape, "y_ref"),
              *dxc = tu_tensor(cpu, dt, ndim, shape, "dx_ref"),
              *dresc = res ? tu_tensor(cpu, dt, ndim, shape, "dresidual_ref") : NULL;
    sg_tensor *mc = tu_tensor1(cpu, f32, C, "mean_ref"), *rc = tu_tensor1(cpu, f32, C, "rstd_ref"),
              *dgc = tu_tensor1(cpu, f32, C, "dgamma_ref"),
              *dbc = tu_tensor1(cpu, f32, C, "dbeta_ref");
    const tu_tol tol = tu_tol_for(dt), t32 = tu_tol_for(f32);
    char w[160];

    /* Eval first (the running statistics as given), then training (which updates them). */
    void *rm0 = tu_raw(rm), *rv0 = tu_raw(rv);
    TU_OK(cpu, sg_batchnorm_act_forward(cpu, xc, gc, bc, resc, act, rmc, rvc, mom, eps, 0, yc, mc,
                                        rc));
    tu_poison(y), tu_poison(mean), tu_poison(rstd);
    TU_OK(gpu, sg_batchnorm_act_forward(gpu, x, g, b, res, act, rm, rv, mom, eps, 0, y, mean,
                                        rstd));
    snprintf(w, sizeof w, "%s eval y", what), tu_close_tensors(w, y, yc, tol);
    snprintf(w, sizeof w, "%s eval mean", what), tu_close_tensors(w, mean, mc, t32);
    snprintf(w, sizeof w, "%s eval rstd", what), tu_close_tensors(w, rstd, rc, t32);
    TU_CHECK(tu_same_bytes(rm, rm0) && tu_same_bytes(rv, rv0),
             "%s: eval changed the running statistics", what);
    void *eval_y = tu_raw(y);

    TU_OK(cpu, sg_batchnorm_act_forward(cpu, xc, gc, bc, resc, act, rmc, rvc, mom, eps, 1, yc, mc,
                                        rc));
    tu_poison(y), tu_poison(mean), tu_poison(rstd);
    TU_OK(gpu, sg_batchnorm_act_forward(gpu, x, g, b, res, act, rm, rv, mom, eps, 1, y, mean,
                                        rstd));
    snprintf(w, sizeof w, "%s training y", what), tu_close_tensors(w, y, yc, tol);
    snprintf(w, sizeof w, "%s training mean", what), tu_close_tensors(w, mean, mc, t32);
    snprintf(w, sizeof w, "%s training rstd", what), tu_close_tensors(w, rstd, rc, t32);
    snprintf(w, sizeof w, "%s running_mean", what), tu_close_tensors(w, rm, rmc, t32);
    snprintf(w, sizeof w, "%s running_var", what), tu_close_tensors(w, rv, rvc, t32);

    /* The backward: the GPU's y (the mask) and the reference's statistics on both sides. */
    sg_tensor *mg = tu_clone_to(gpu, mc, f32), *rg = tu_clone_to(gpu, rc, f32);
    sg_tensor *ygc = relu ? tu_clone_to(cpu, y, dt) : NULL;
    TU_OK(cpu, sg_batchnorm_act_backward(cpu, xc, gc, mc, rc, act, ygc, dyc, dxc, dresc, dgc, dbc));
    void *dy0 = tu_raw(dy);
    tu_poison(dx), tu_poison(dg), tu_poison(db);
    if (dres) tu_poison(dres);
    TU_OK(gpu, sg_batchnorm_act_backward(gpu, x, g, mg, rg, act, relu ? y : NULL, dy, dx, dres, dg,
                                         db));
    TU_CHECK(tu_same_bytes(dy, dy0), "%s: the backward changed dy", what);
    tu_tol tol_dx = tol; /* M = 1: as gpu_case */
    if (rows_of(x) == 1) tol_dx.atol *= 1.0 / sqrt(eps);
    snprintf(w, sizeof w, "%s dx", what), tu_close_tensors(w, dx, dxc, tol_dx);
    snprintf(w, sizeof w, "%s dgamma", what), tu_close_tensors(w, dg, dgc, t32);
    snprintf(w, sizeof w, "%s dbeta", what), tu_close_tensors(w, db, dbc, t32);
    if (dres) {
        snprintf(w, sizeof w, "%s dresidual (exact)", what);
        tu_close_tensors(w, dres, dresc, (tu_tol){0, 0});
    }

    /* Again from the same running statistics: the same bits, and the documented launches. */
    const sg_tensor *outs[9] = {y, mean, rstd, rm, rv, dx, dg, db, dres};
    const int nout = dres ? 9 : 8;
    void *first[9];
    for (int i = 0; i < nout; i++) first[i] = tu_raw(outs[i]);
    TU_OK(gpu, sg_tensor_copy_from_host(rm, rm0, sg_tensor_nbytes(rm)));
    TU_OK(gpu, sg_tensor_copy_from_host(rv, rv0, sg_tensor_nbytes(rv)));
    tu_poison(y), tu_poison(mean), tu_poison(rstd);
    uint64_t n0 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_batchnorm_act_forward(gpu, x, g, b, res, act, rm, rv, mom, eps, 0, y, mean,
                                        rstd));
    uint64_t n1 = sg_ctx_launch_count(gpu), n_eval = n1 - n0;
    TU_CHECK(tu_same_bytes(y, eval_y), "%s: eval y differs between two identical runs", what);
    tu_poison(y), tu_poison(mean), tu_poison(rstd), tu_poison(dx), tu_poison(dg), tu_poison(db);
    if (dres) tu_poison(dres);
    n1 = sg_ctx_launch_count(gpu); /* after the poisons, which launch fills */
    TU_OK(gpu, sg_batchnorm_act_forward(gpu, x, g, b, res, act, rm, rv, mom, eps, 1, y, mean,
                                        rstd));
    uint64_t n2 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_batchnorm_act_backward(gpu, x, g, mg, rg, act, relu ? y : NULL, dy, dx, dres, dg,
                                         db));
    uint64_t n3 = sg_ctx_launch_count(gpu);
    TU_CHECK(n_eval == 1, "%s: eval forward made %llu launches, expected 1", what,
             (unsigned long long)n_eval);
    TU_CHECK(n2 - n1 == 2, "%s: training forward made %llu launches, expected 2", what,
             (unsigned long long)(n2 - n1));
    TU_CHECK(n3 - n2 == 2, "%s: backward made %llu launches, expected 2", what,
             (unsigned long long)(n3 - n2));
    TU_CHECK(tu_same_bytes(dy, dy0), "%s: the second backward changed dy", what);
    for (int i = 0; i < nout; i++) {
        TU_CHECK(tu_same_bytes(outs[i], first[i]), "%s: %s differs between two identical runs",
                 what, outs[i]->name);
        free(first[i]);
    }
    free(rm0), free(rv0), free(eval_y), free(dy0);
    sg_tensor *ts[] = {x,   dy,  res,   dres, y,    dx,   g,   b,   mean, rstd, rm,  rv,
                       dg,  db,  xbase, dybase, resbase, dresbase, xc, dyc, resc, gc, bc,
                       rmc, rvc, yc,    dxc,  dresc, mc,  rc,  dgc, dbc,  mg,  rg,  ygc};
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
    TU_FAILS(gpu, sg_batchnorm_act_forward(gpu, x, g, b, NULL, SG_ACT_RELU, NULL, NULL, 0.1f, 1e-5f,
                                           1, y, m, r),
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
        /* The fused forms: a residual with NONE, RELU alone, both; M = 1, odd C, wide C, many
         * rows, the 16-byte and the scalar paths. */
        const int64_t f2[][2] = {{1, 7}, {5, 3}, {37, 13}, {300, 2}, {2, 4096}, {rm, rc}};
        const int64_t f4[][4] = {{2, 7, 9, 19}, {4, 28, 28, 64}, {3, 1, 1, 33}, {16, 56, 56, 8}};
        for (int k = 0; k < 3; k++) {
            const sg_activation act = k ? SG_ACT_RELU : SG_ACT_NONE;
            const bool res = k != 1;
            for (size_t s = 0; s < sizeof f2 / sizeof *f2; s++)
                gpu_fused_case(gpu, cpu, 2, f2[s], false, dt, act, res);
            for (size_t s = 0; s < sizeof f4 / sizeof *f4; s++)
                gpu_fused_case(gpu, cpu, 4, f4[s], false, dt, act, res);
            gpu_fused_case(gpu, cpu, 4, v1, true, dt, act, res);
            gpu_fused_case(gpu, cpu, 2, v2, true, dt, act, res);
        }
        const int64_t cs[4] = {8, 14, 14, 96}, cs2[2] = {3, 33};
        for (int fused = 0; fused < 2; fused++) {
            capture_case(gpu, 4, cs, dt, fused);
            capture_case(gpu, 2, cs2, dt, fused);
        }
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
