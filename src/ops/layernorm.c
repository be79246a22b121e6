/* layernorm.c: public entry points of LayerNorm (sg_layernorm_forward, sg_layernorm_backward)
 * and of its fused residual forms (sg_add_layernorm_forward, sg_layernorm_backward_add, and
 * sg_layernorm_backward_add_sums, which also sums dres's and dx's columns): check
 * every argument (dtypes, shapes, eps, outputs that overlap anything else the call touches),
 * then run the CPU reference through sg_cpu_run or the CUDA kernels. x (or a) sets the dtype
 * (f32, bf16, or f64 on the CPU) of every tensor but mean and rstd, which stay f32 (f64 with
 * f64 x): a tensor of another float dtype is SG_ERR_DTYPE, by name. */
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

/* mean or rstd: (M), or the leading dims of x (named wx) ((B, T) for x (B, T, C)); F32 (bf16
 * x too), or F64 when x is F64 (the CPU's gradient checks keep the statistics in double). */
static sg_status check_stats(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                             const char *wx, const sg_tensor *x, int64_t M)
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
                       "%s: '%s' is %s but '%s' is %s; expected (%lld), one "
                       "value per row",
                       fn, what, sg_shape_str(t, s, sizeof s), wx, sg_shape_str(x, sx, sizeof sx),
                       (long long)M);
    }
    return SG_OK;
}

/* The CPU references run through sg_cpu_run, so that a CPU capture records them. */
typedef struct ln_args {
    const sg_tensor *x, *b, *gamma, *beta, *mean_in, *rstd_in, *dy, *dres;
    float eps;
    sg_tensor *s, *y, *mean, *rstd; /* forward (s: the residual sum, with b) */
    sg_tensor *dx, *dgamma, *dbeta; /* backward */
    sg_tensor *dres_sum, *dx_sum;   /* backward: the column sums, or NULL */
} ln_args;

static sg_status ln_forward_cpu(sg_ctx *ctx, const void *p)
{
    const ln_args *a = p;
    if (a->b)
        sg_add_layernorm_forward_cpu(a->x, a->b, a->gamma, a->beta, a->eps, a->s, a->y, a->mean,
                                     a->rstd);
    else
        sg_layernorm_forward_cpu(a->x, a->gamma, a->beta, a->eps, a->y, a->mean, a->rstd);
    return SG_OK;
}

static sg_status ln_backward_cpu(sg_ctx *ctx, const void *p)
{
    const ln_args *a = p;
    sg_layernorm_backward_cpu(a->x, a->gamma, a->mean_in, a->rstd_in, a->dy, a->dres, a->dx,
                              a->dgamma, a->dbeta, a->dres_sum, a->dx_sum);
    return SG_OK;
}

/* Both forwards. add false: y = LayerNorm(x) (b and s unused); true: s = x + b and
 * y = LayerNorm(s), x named 'a' in messages. */
static sg_status forward(sg_ctx *ctx, const char *fn, bool add, const sg_tensor *x,
                         const sg_tensor *b, const sg_tensor *gamma, const sg_tensor *beta,
                         float eps, sg_tensor *s, sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    if (!ctx) return SG_ERR_NULL;
    const char *wx = add ? "a" : "x";
    SG_TRY(sg_check_float_or_bf16(ctx, fn, wx, x));
    int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    if (add) {
        SG_TRY(sg_check_same_shape(ctx, fn, wx, x, "b", b));
        SG_TRY(sg_check_same_shape(ctx, fn, wx, x, "s", s));
    } else {
        b = NULL, s = NULL;
    }
    SG_TRY(check_vec(ctx, fn, "gamma", gamma, C, x->dtype));
    SG_TRY(check_vec(ctx, fn, "beta", beta, C, x->dtype));
    SG_TRY(sg_check_same_shape(ctx, fn, wx, x, "y", y));
    SG_TRY(check_stats(ctx, fn, "mean", mean, wx, x, M));
    SG_TRY(check_stats(ctx, fn, "rstd", rstd, wx, x, M));
    if (!isfinite(eps) || eps < 0)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: eps is %g, expected a finite value >= 0", fn,
                       (double)eps);
    /* The first four are outputs (s NULL without add: NULLs pass); a and b may share memory,
     * as inputs may. */
    const char *names[] = {"y", "mean", "rstd", "s", wx, "gamma", "beta", "b"};
    const sg_tensor *ts[] = {y, mean, rstd, s, x, gamma, beta, b};
    SG_TRY(sg_check_disjoint(ctx, fn, 4, 8, names, ts));
    /* The fewest bytes: every input read once, every output written once. */
    sg_ctx_count_work(ctx, SG_WORK_NORM, 0, sg_tensors_bytes(x, b, gamma, beta, s, y, mean, rstd));
    if (ctx->backend == SG_BACKEND_CPU) {
        ln_args a = {.x = x,
                     .b = b,
                     .gamma = gamma,
                     .beta = beta,
                     .eps = eps,
                     .s = s,
                     .y = y,
                     .mean = mean,
                     .rstd = rstd};
        return sg_cpu_run(ctx, ln_forward_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx,
                            sg_layernorm_forward_cuda(ctx, x, b, gamma, beta, eps, s, y, mean, rstd));
}

sg_status sg_layernorm_forward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                               const sg_tensor *beta, float eps, sg_tensor *y, sg_tensor *mean,
                               sg_tensor *rstd)
{
    return forward(ctx, "sg_layernorm_forward", false, x, NULL, gamma, beta, eps, NULL, y, mean,
                   rstd);
}

sg_status sg_add_layernorm_forward(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b,
                                   const sg_tensor *gamma, const sg_tensor *beta, float eps,
                                   sg_tensor *s, sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    return forward(ctx, "sg_add_layernorm_forward", true, a, b, gamma, beta, eps, s, y, mean, rstd);
}

/* The three backwards; dres NULL: LayerNorm's dx alone; dres_sum and dx_sum NULL: no column
 * sums (sums: the _sums form, where dres is required). */
static sg_status backward(sg_ctx *ctx, const char *fn, bool sums, const sg_tensor *x,
                          const sg_tensor *gamma, const sg_tensor *mean, const sg_tensor *rstd,
                          const sg_tensor *dy, const sg_tensor *dres, sg_tensor *dx,
                          sg_tensor *dgamma, sg_tensor *dbeta, sg_tensor *dres_sum,
                          sg_tensor *dx_sum)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "x", x));
    int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    SG_TRY(check_vec(ctx, fn, "gamma", gamma, C, x->dtype));
    SG_TRY(check_stats(ctx, fn, "mean", mean, "x", x, M));
    SG_TRY(check_stats(ctx, fn, "rstd", rstd, "x", x, M));
    SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "dy", dy));
    if (sums) SG_TRY(sg_check_tensor(ctx, fn, "dres", dres));
    if (dres) SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "dres", dres));
    SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "dx", dx));
    SG_TRY(check_vec(ctx, fn, "dgamma", dgamma, C, x->dtype));
    SG_TRY(check_vec(ctx, fn, "dbeta", dbeta, C, x->dtype));
    if (dres_sum) SG_TRY(check_vec(ctx, fn, "dres_sum", dres_sum, C, x->dtype));
    if (dx_sum) SG_TRY(check_vec(ctx, fn, "dx_sum", dx_sum, C, x->dtype));
    /* The first five are outputs (dres, dres_sum, dx_sum NULL pass). */
    const char *names[] = {"dx",  "dgamma", "dbeta", "dres_sum", "dx_sum", "x",
                           "gamma", "mean", "rstd",  "dy",       "dres"};
    const sg_tensor *ts[] = {dx, dgamma, dbeta, dres_sum, dx_sum, x, gamma, mean, rstd, dy, dres};
    SG_TRY(sg_check_disjoint(ctx, fn, 5, 11, names, ts));
    /* The fewest bytes: every input read once, every output written once (11 tensors). */
    sg_ctx_count_work(ctx, SG_WORK_NORM, 0,
                      sg_tensors_bytes(x, gamma, mean, rstd, dy, dres, dx, dgamma) +
                          sg_tensors_bytes(dbeta, dres_sum, dx_sum, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        ln_args a = {.x = x,
                     .gamma = gamma,
                     .mean_in = mean,
                     .rstd_in = rstd,
                     .dy = dy,
                     .dres = dres,
                     .dx = dx,
                     .dgamma = dgamma,
                     .dbeta = dbeta,
                     .dres_sum = dres_sum,
                     .dx_sum = dx_sum};
        return sg_cpu_run(ctx, ln_backward_cpu, &a, sizeof a);
    }
    if (C > SG_LAYERNORM_CUDA_MAX_C)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "%s: x has %lld columns; the CUDA backward takes "
                       "at most %lld",
                       fn, (long long)C, (long long)SG_LAYERNORM_CUDA_MAX_C);
    return SG_CUDA_DISPATCH(ctx, sg_layernorm_backward_cuda(ctx, x, gamma, mean, rstd, dy, dres,
                                                            dx, dgamma, dbeta, dres_sum, dx_sum));
}

sg_status sg_layernorm_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                const sg_tensor *mean, const sg_tensor *rstd, const sg_tensor *dy,
                                sg_tensor *dx, sg_tensor *dgamma, sg_tensor *dbeta)
{
    return backward(ctx, "sg_layernorm_backward", false, x, gamma, mean, rstd, dy, NULL, dx,
                    dgamma, dbeta, NULL, NULL);
}

sg_status sg_layernorm_backward_add(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                    const sg_tensor *mean, const sg_tensor *rstd,
                                    const sg_tensor *dy, const sg_tensor *dres, sg_tensor *dx,
                                    sg_tensor *dgamma, sg_tensor *dbeta)
{
    return backward(ctx, "sg_layernorm_backward_add", false, x, gamma, mean, rstd, dy, dres, dx,
                    dgamma, dbeta, NULL, NULL);
}

sg_status sg_layernorm_backward_add_sums(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                         const sg_tensor *mean, const sg_tensor *rstd,
                                         const sg_tensor *dy, const sg_tensor *dres, sg_tensor *dx,
                                         sg_tensor *dgamma, sg_tensor *dbeta, sg_tensor *dres_sum,
                                         sg_tensor *dx_sum)
{
    return backward(ctx, "sg_layernorm_backward_add_sums", true, x, gamma, mean, rstd, dy, dres,
                    dx, dgamma, dbeta, dres_sum, dx_sum);
}
