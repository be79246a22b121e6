/* layernorm.c: public entry points of LayerNorm (sg_layernorm_forward, sg_layernorm_backward):
 * check every argument (dtypes, shapes, eps, outputs that overlap anything else the call
 * touches), then run the CPU reference through sg_cpu_run or the CUDA kernels. x sets the
 * dtype (f32, bf16, or f64 on the CPU) of every tensor but mean and rstd, which stay f32 (f64
 * with f64 x): a tensor of another float dtype is SG_ERR_DTYPE, by name. */
#include "ops/layernorm.h"

#include <math.h>

/* A per-channel vector (gamma, beta, dgamma, dbeta): (C) of x's dtype. */
static sg_status check_vec(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                           int64_t C, sg_dtype dt)
{
    SG_TRY(sg_check_dtype(ctx, fn, what, t, dt));
    if (t->ndim != 1 || t->shape[0] != C) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: '%s' is %s, expected (%lld) %s", fn, what,
                       sg_shape_str(t, s, sizeof s), (long long)C, sg_dtype_name(dt));
    }
    return SG_OK;
}

/* mean or rstd: (M), or x's leading dims ((B, T) for x (B, T, C)); F32 (bf16 x too), or F64
 * when x is F64 (the CPU's gradient checks keep the statistics in double). */
static sg_status check_stats(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                             const sg_tensor *x, int64_t M)
{
    SG_TRY(sg_check_tensor(ctx, fn, what, t));
    if (t->dtype != SG_DTYPE_F32 && !(t->dtype == SG_DTYPE_F64 && x->dtype == SG_DTYPE_F64))
        return sg_fail(ctx, SG_ERR_DTYPE, "%s: tensor '%s' is %s, expected f32%s", fn, what,
                       sg_dtype_name(t->dtype), x->dtype == SG_DTYPE_F64 ? " or f64" : "");
    bool ok = t->ndim == 1 && t->shape[0] == M;
    if (!ok && x->ndim > 1 && t->ndim == x->ndim - 1) {
        ok = true;
        for (int i = 0; i < t->ndim; i++) ok = ok && t->shape[i] == x->shape[i];
    }
    if (!ok) {
        char s[96], sx[96];
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: '%s' is %s but 'x' is %s; expected (%lld), one "
                       "value per row",
                       fn, what, sg_shape_str(t, s, sizeof s), sg_shape_str(x, sx, sizeof sx),
                       (long long)M);
    }
    return SG_OK;
}

/* The CPU references run through sg_cpu_run, so that a CPU capture records them. */
typedef struct ln_args {
    const sg_tensor *x, *gamma, *beta, *mean_in, *rstd_in, *dy;
    float eps;
    sg_tensor *y, *mean, *rstd;     /* forward */
    sg_tensor *dx, *dgamma, *dbeta; /* backward */
} ln_args;

static sg_status ln_forward_cpu(sg_ctx *ctx, const void *p)
{
    const ln_args *a = p;
    sg_layernorm_forward_cpu(a->x, a->gamma, a->beta, a->eps, a->y, a->mean, a->rstd);
    return SG_OK;
}

static sg_status ln_backward_cpu(sg_ctx *ctx, const void *p)
{
    const ln_args *a = p;
    sg_layernorm_backward_cpu(a->x, a->gamma, a->mean_in, a->rstd_in, a->dy, a->dx, a->dgamma,
                              a->dbeta);
    return SG_OK;
}

sg_status sg_layernorm_forward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                               const sg_tensor *beta, float eps, sg_tensor *y, sg_tensor *mean,
                               sg_tensor *rstd)
{
    const char *fn = "sg_layernorm_forward";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "x", x));
    int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    SG_TRY(check_vec(ctx, fn, "gamma", gamma, C, x->dtype));
    SG_TRY(check_vec(ctx, fn, "beta", beta, C, x->dtype));
    SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "y", y));
    SG_TRY(check_stats(ctx, fn, "mean", mean, x, M));
    SG_TRY(check_stats(ctx, fn, "rstd", rstd, x, M));
    if (!isfinite(eps) || eps < 0)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: eps is %g, expected a finite value >= 0", fn,
                       (double)eps);
    const char *names[] = {"y", "mean", "rstd", "x", "gamma", "beta"};
    const sg_tensor *ts[] = {y, mean, rstd, x, gamma, beta};
    SG_TRY(sg_check_disjoint(ctx, fn, 3, 6, names, ts));
    sg_ctx_count_work(ctx, SG_WORK_NORM, 0, sg_tensors_bytes(x, gamma, beta, y, mean, rstd, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        ln_args a = {
            .x = x, .gamma = gamma, .beta = beta, .eps = eps, .y = y, .mean = mean, .rstd = rstd};
        return sg_cpu_run(ctx, ln_forward_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx,
                            sg_layernorm_forward_cuda(ctx, x, gamma, beta, eps, y, mean, rstd));
}

sg_status sg_layernorm_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                const sg_tensor *mean, const sg_tensor *rstd, const sg_tensor *dy,
                                sg_tensor *dx, sg_tensor *dgamma, sg_tensor *dbeta)
{
    const char *fn = "sg_layernorm_backward";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "x", x));
    int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    SG_TRY(check_vec(ctx, fn, "gamma", gamma, C, x->dtype));
    SG_TRY(check_stats(ctx, fn, "mean", mean, x, M));
    SG_TRY(check_stats(ctx, fn, "rstd", rstd, x, M));
    SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "dy", dy));
    SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "dx", dx));
    SG_TRY(check_vec(ctx, fn, "dgamma", dgamma, C, x->dtype));
    SG_TRY(check_vec(ctx, fn, "dbeta", dbeta, C, x->dtype));
    const char *names[] = {"dx", "dgamma", "dbeta", "x", "gamma", "mean", "rstd", "dy"};
    const sg_tensor *ts[] = {dx, dgamma, dbeta, x, gamma, mean, rstd, dy};
    SG_TRY(sg_check_disjoint(ctx, fn, 3, 8, names, ts));
    sg_ctx_count_work(ctx, SG_WORK_NORM, 0, sg_tensors_bytes(x, gamma, mean, rstd, dy, dx, dgamma, dbeta));
    if (ctx->backend == SG_BACKEND_CPU) {
        ln_args a = {.x = x,
                     .gamma = gamma,
                     .mean_in = mean,
                     .rstd_in = rstd,
                     .dy = dy,
                     .dx = dx,
                     .dgamma = dgamma,
                     .dbeta = dbeta};
        return sg_cpu_run(ctx, ln_backward_cpu, &a, sizeof a);
    }
    if (C > SG_LAYERNORM_CUDA_MAX_C)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "%s: x has %lld columns; the CUDA backward takes "
                       "at most %lld",
                       fn, (long long)C, (long long)SG_LAYERNORM_CUDA_MAX_C);
    return SG_CUDA_DISPATCH(
        ctx, sg_layernorm_backward_cuda(ctx, x, gamma, mean, rstd, dy, dx, dgamma, dbeta));
}
