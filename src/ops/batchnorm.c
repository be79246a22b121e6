/* batchnorm.c: public entry points of batch normalisation (sg_batchnorm_forward,
 * sg_batchnorm_backward, and the fused forms with a residual and ReLU after the normalisation,
 * sg_batchnorm_act_forward and sg_batchnorm_act_backward): check every argument (dtypes,
 * shapes, the activation, momentum, eps, the running statistics, outputs that overlap anything
 * else the call touches), then run the CPU reference through sg_cpu_run or the CUDA kernels. x sets the dtype of y, dy and dx (f32, bf16, or f64 on
 * the CPU); every per-channel tensor is f32, or f64 with f64 x. */
#include "ops/batchnorm.h"

#include <math.h>

/* The dtype of the per-channel tensors for x: f64 with f64 x (the CPU's gradient checks),
 * f32 otherwise (bf16 activations too). */
static sg_dtype chan_dtype(const sg_tensor *x)
{
    return x->dtype == SG_DTYPE_F64 ? SG_DTYPE_F64 : SG_DTYPE_F32;
}

/* A per-channel tensor (gamma, beta, mean, rstd, running stats, dgamma, dbeta): (C). */
static sg_status check_chan(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                            const sg_tensor *x, int64_t C)
{
    SG_TRY(sg_check_dtype(ctx, fn, what, t, chan_dtype(x)));
    if (t->ndim != 1 || t->shape[0] != C) {
        char s[96], sx[96];
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: '%s' is %s but 'x' is %s; expected (%lld), one "
                       "value per channel",
                       fn, what, sg_shape_str(t, s, sizeof s), sg_shape_str(x, sx, sizeof sx),
                       (long long)C);
    }
    return SG_OK;
}

/* The CPU references run through sg_cpu_run, so that a CPU capture records them. */
typedef struct bn_args {
    const sg_tensor *x, *gamma, *beta, *res, *mean_in, *rstd_in, *y_in, *dy;
    sg_activation act;
    sg_tensor *running_mean, *running_var;
    float momentum, eps;
    int training;
    sg_tensor *y, *mean, *rstd;           /* forward */
    sg_tensor *dx, *dres, *dgamma, *dbeta; /* backward */
} bn_args;

static sg_status bn_forward_cpu(sg_ctx *ctx, const void *p)
{
    const bn_args *a = p;
    sg_batchnorm_forward_cpu(a->x, a->gamma, a->beta, a->res, a->act == SG_ACT_RELU,
                             a->running_mean, a->running_var, a->momentum, a->eps, a->training,
                             a->y, a->mean, a->rstd);
    return SG_OK;
}

static sg_status bn_backward_cpu(sg_ctx *ctx, const void *p)
{
    const bn_args *a = p;
    sg_batchnorm_backward_cpu(a->x, a->gamma, a->mean_in, a->rstd_in, a->y_in, a->dy, a->dx,
                              a->dres, a->dgamma, a->dbeta);
    return SG_OK;
}

/* The fused activation: NONE or RELU. */
static sg_status check_act(sg_ctx *ctx, const char *fn, sg_activation act)
{
    if (act == SG_ACT_NONE || act == SG_ACT_RELU) return SG_OK;
    return sg_fail(ctx, SG_ERR_INVALID,
                   "%s: activation %d: expected SG_ACT_NONE or SG_ACT_RELU (the others run as "
                   "their own ops after sg_batchnorm_forward)",
                   fn, (int)act);
}

/* The running statistics: both or neither in training (neither: not tracked), both in eval. */
static sg_status check_running(sg_ctx *ctx, const char *fn, const sg_tensor *rm,
                               const sg_tensor *rv, const sg_tensor *x, int64_t C, int training)
{
    if (training && !rm && !rv) return SG_OK;
    if (!training && (!rm || !rv))
        return sg_fail(ctx, SG_ERR_NULL,
                       "%s: tensor '%s' is NULL; eval mode (training == 0) normalises with "
                       "running_mean and running_var",
                       fn, rm ? "running_var" : "running_mean");
    if (!rm || !rv)
        return sg_fail(ctx, SG_ERR_NULL,
                       "%s: tensor '%s' is NULL but '%s' is not; pass both running "
                       "statistics, or neither (not tracked)",
                       fn, rm ? "running_var" : "running_mean",
                       rm ? "running_mean" : "running_var");
    SG_TRY(check_chan(ctx, fn, "running_mean", rm, x, C));
    return check_chan(ctx, fn, "running_var", rv, x, C);
}

static sg_status check_cuda_c(sg_ctx *ctx, const char *fn, int64_t C)
{
    if (C <= SG_BATCHNORM_CUDA_MAX_C) return SG_OK;
    return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                   "%s: x has %lld channels; the CUDA kernels take at most %lld", fn, (long long)C,
                   (long long)SG_BATCHNORM_CUDA_MAX_C);
}

/* The forward behind both entry points; fn names the one called in errors. */
static sg_status forward(sg_ctx *ctx, const char *fn, const sg_tensor *x, const sg_tensor *gamma,
                         const sg_tensor *beta, const sg_tensor *residual, sg_activation act,
                         sg_tensor *running_mean, sg_tensor *running_var, float momentum,
                         float eps, int training, sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "x", x));
    const int64_t C = x->shape[x->ndim - 1];
    SG_TRY(check_chan(ctx, fn, "gamma", gamma, x, C));
    SG_TRY(check_chan(ctx, fn, "beta", beta, x, C));
    SG_TRY(check_act(ctx, fn, act));
    if (residual) {
        SG_TRY(sg_check_dtype(ctx, fn, "residual", residual, x->dtype));
        SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "residual", residual));
    }
    SG_TRY(check_running(ctx, fn, running_mean, running_var, x, C, training));
    SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "y", y));
    SG_TRY(check_chan(ctx, fn, "mean", mean, x, C));
    SG_TRY(check_chan(ctx, fn, "rstd", rstd, x, C));
    if (!isfinite(eps) || eps < 0)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: eps is %g, expected a finite value >= 0", fn,
                       (double)eps);
    if (!(momentum >= 0 && momentum <= 1))
        return sg_fail(ctx, SG_ERR_INVALID, "%s: momentum is %g, expected a value in [0, 1]", fn,
                       (double)momentum);
    /* In training the running statistics are outputs too; in eval, inputs. */
    const char *names[] = {"y",           "mean", "rstd",  "running_mean", "running_var",
                           "x",           "gamma", "beta", "residual"};
    const sg_tensor *ts[] = {y, mean, rstd, running_mean, running_var, x, gamma, beta, residual};
    SG_TRY(sg_check_disjoint(ctx, fn, training ? 5 : 3, 9, names, ts));
    sg_ctx_count_work(ctx, SG_WORK_NORM, 0, (training ? 2 : 1) * sg_tensors_bytes(x, NULL, NULL, NULL, NULL, NULL, NULL, NULL) + sg_tensors_bytes(y, residual, gamma, beta, mean, rstd, running_mean, running_var));
    if (ctx->backend == SG_BACKEND_CPU) {
        bn_args a = {.x = x,
                     .gamma = gamma,
                     .beta = beta,
                     .res = residual,
                     .act = act,
                     .running_mean = running_mean,
                     .running_var = running_var,
                     .momentum = momentum,
                     .eps = eps,
                     .training = training,
                     .y = y,
                     .mean = mean,
                     .rstd = rstd};
        return sg_cpu_run(ctx, bn_forward_cpu, &a, sizeof a);
    }
    if (training) SG_TRY(check_cuda_c(ctx, fn, C));
    return SG_CUDA_DISPATCH(ctx, sg_batchnorm_forward_cuda(ctx, x, gamma, beta, residual,
                                                           act == SG_ACT_RELU, running_mean,
                                                           running_var, momentum, eps, training, y,
                                                           mean, rstd));
}

static sg_status backward(sg_ctx *ctx, const char *fn, const sg_tensor *x, const sg_tensor *gamma,
                          const sg_tensor *mean, const sg_tensor *rstd, sg_activation act,
                          const sg_tensor *y, const sg_tensor *dy, sg_tensor *dx,
                          sg_tensor *dresidual, sg_tensor *dgamma, sg_tensor *dbeta)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "x", x));
    const int64_t C = x->shape[x->ndim - 1];
    SG_TRY(check_chan(ctx, fn, "gamma", gamma, x, C));
    SG_TRY(check_chan(ctx, fn, "mean", mean, x, C));
    SG_TRY(check_chan(ctx, fn, "rstd", rstd, x, C));
    SG_TRY(check_act(ctx, fn, act));
    if (act == SG_ACT_RELU) {
        if (!y)
            return sg_fail(ctx, SG_ERR_NULL,
                           "%s: tensor 'y' is NULL; with SG_ACT_RELU the forward's output y "
                           "gives the mask",
                           fn);
        SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "y", y));
    } else {
        y = NULL; /* not read */
    }
    SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "dy", dy));
    SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "dx", dx));
    if (dresidual) SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "dresidual", dresidual));
    SG_TRY(check_chan(ctx, fn, "dgamma", dgamma, x, C));
    SG_TRY(check_chan(ctx, fn, "dbeta", dbeta, x, C));
    const char *names[] = {"dx", "dgamma", "dbeta", "dresidual", "x",
                           "gamma", "mean", "rstd", "dy", "y"};
    const sg_tensor *ts[] = {dx, dgamma, dbeta, dresidual, x, gamma, mean, rstd, dy, y};
    SG_TRY(sg_check_disjoint(ctx, fn, 4, 10, names, ts));
    sg_ctx_count_work(ctx, SG_WORK_NORM, 0, sg_tensors_bytes(x, dy, dx, dresidual, y, gamma, dgamma, dbeta));
    if (ctx->backend == SG_BACKEND_CPU) {
        bn_args a = {.x = x,
                     .gamma = gamma,
                     .mean_in = mean,
                     .rstd_in = rstd,
                     .y_in = y,
                     .dy = dy,
                     .dx = dx,
                     .dres = dresidual,
                     .dgamma = dgamma,
                     .dbeta = dbeta};
        return sg_cpu_run(ctx, bn_backward_cpu, &a, sizeof a);
    }
    SG_TRY(check_cuda_c(ctx, fn, C));
    return SG_CUDA_DISPATCH(ctx, sg_batchnorm_backward_cuda(ctx, x, gamma, mean, rstd, y, dy, dx,
                                                            dresidual, dgamma, dbeta));
}

sg_status sg_batchnorm_forward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                               const sg_tensor *beta, sg_tensor *running_mean,
                               sg_tensor *running_var, float momentum, float eps, int training,
                               sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    return forward(ctx, "sg_batchnorm_forward", x, gamma, beta, NULL, SG_ACT_NONE, running_mean,
                   running_var, momentum, eps, training, y, mean, rstd);
}

sg_status sg_batchnorm_act_forward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                   const sg_tensor *beta, const sg_tensor *residual,
                                   sg_activation act, sg_tensor *running_mean,
                                   sg_tensor *running_var, float momentum, float eps, int training,
                                   sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    return forward(ctx, "sg_batchnorm_act_forward", x, gamma, beta, residual, act, running_mean,
                   running_var, momentum, eps, training, y, mean, rstd);
}

sg_status sg_batchnorm_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                const sg_tensor *mean, const sg_tensor *rstd, const sg_tensor *dy,
                                sg_tensor *dx, sg_tensor *dgamma, sg_tensor *dbeta)
{
    return backward(ctx, "sg_batchnorm_backward", x, gamma, mean, rstd, SG_ACT_NONE, NULL, dy, dx,
                    NULL, dgamma, dbeta);
}

sg_status sg_batchnorm_act_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                    const sg_tensor *mean, const sg_tensor *rstd,
                                    sg_activation act, const sg_tensor *y, const sg_tensor *dy,
                                    sg_tensor *dx, sg_tensor *dresidual, sg_tensor *dgamma,
                                    sg_tensor *dbeta)
{
    return backward(ctx, "sg_batchnorm_act_backward", x, gamma, mean, rstd, act, y, dy, dx,
                    dresidual, dgamma, dbeta);
}
