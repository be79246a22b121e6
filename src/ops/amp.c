/* amp.c: public entry points of dynamic loss scaling (sg_amp_unscale, and sg_amp_check, its
 * check and scaler update without the unscaled copy): check grad_lo, grad, scaler, found and
 * inv, then run the CPU reference (through sg_cpu_run, so a CPU capture records
 * it) or the CUDA kernel. Nothing is written before every check has passed. */
#include "ops/amp.h"

#include <stddef.h>

_Static_assert(sizeof(sg_loss_scaler) == SG_SCALER_COUNT * sizeof(float),
               "sg_loss_scaler must be SG_SCALER_COUNT packed floats: the kernels index it");
_Static_assert(offsetof(sg_loss_scaler, skipped) == SG_SCALER_SKIPPED * sizeof(float),
               "sg_loss_scaler.skipped must be element SG_SCALER_SKIPPED");
_Static_assert(offsetof(sg_loss_scaler, growth_interval) ==
                   SG_SCALER_GROWTH_INTERVAL * sizeof(float),
               "sg_loss_scaler.growth_interval must be element SG_SCALER_GROWTH_INTERVAL");

sg_status sg_amp_check_grad_lo(const sg_ctx *ctx, const char *fn, const sg_tensor *grad_lo)
{
    SG_TRY(sg_check_tensor(ctx, fn, "grad_lo", grad_lo));
    if (grad_lo->dtype == SG_DTYPE_BF16) return SG_OK;
    if (grad_lo->dtype == SG_DTYPE_F32 ||
        (grad_lo->dtype == SG_DTYPE_F64 && ctx->backend == SG_BACKEND_CPU))
        return SG_OK;
    return sg_fail(ctx, SG_ERR_DTYPE, "%s: tensor 'grad_lo' is %s, expected bf16 or f32%s", fn,
                   sg_dtype_name(grad_lo->dtype),
                   ctx->backend == SG_BACKEND_CPU ? " (or f64 on the CPU)" : "");
}

/* grad: F32 with grad_lo's element count (any shape: both are read as flat). */
static sg_status check_grad(sg_ctx *ctx, const char *fn, const sg_tensor *grad_lo,
                            const sg_tensor *grad)
{
    SG_TRY(sg_check_dtype(ctx, fn, "grad", grad, SG_DTYPE_F32));
    if (grad->numel != grad_lo->numel) {
        char sg[96], sl[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'grad' is %s but 'grad_lo' is %s; expected the "
                       "same number of elements", fn, sg_shape_str(grad, sg, sizeof sg),
                       sg_shape_str(grad_lo, sl, sizeof sl));
    }
    return SG_OK;
}

/* In place (grad is grad_lo, both f32, the same element count) is the one sharing allowed:
 * each element is read, then written, by the same thread. Everything else is disjoint. */
static sg_status check_overlaps(sg_ctx *ctx, const char *fn, const sg_tensor *grad_lo,
                                const sg_tensor *grad, const sg_tensor *scaler,
                                const sg_tensor *found)
{
    const char *names[4] = {"scaler", "found", "grad", "grad_lo"};
    const sg_tensor *ts[4] = {scaler, found, grad, grad_lo};
    SG_TRY(sg_check_disjoint(ctx, fn, 2, 4, names, ts));
    if (grad->data == grad_lo->data) {
        if (grad_lo->dtype != SG_DTYPE_F32)
            return sg_fail(ctx, SG_ERR_INVALID, "%s: 'grad' is 'grad_lo' itself but 'grad_lo' "
                           "is %s; in place takes f32 only, expected a separate f32 'grad'", fn,
                           sg_dtype_name(grad_lo->dtype));
        return SG_OK;
    }
    return sg_check_not_overlapping(ctx, fn, "grad", grad, "grad_lo", grad_lo);
}

typedef struct amp_args {
    const sg_tensor *grad_lo;
    sg_tensor *grad, *scaler, *found, *inv;
} amp_args;

static sg_status unscale_cpu(sg_ctx *ctx, const void *p)
{
    const amp_args *a = p;
    sg_amp_unscale_cpu(a->grad_lo, a->grad, a->scaler, a->found, a->inv);
    return SG_OK;
}

static sg_status check_scaler_found(sg_ctx *ctx, const char *fn, const sg_tensor *scaler, const sg_tensor *found)
{
    SG_TRY(sg_check_count(ctx, fn, "scaler", scaler, SG_DTYPE_F32, SG_SCALER_COUNT,
                          "sg_loss_scaler: scale, good_steps, growth_interval, skipped"));
    return sg_check_count(ctx, fn, "found", found, SG_DTYPE_I32, 1, "a flag");
}

sg_status sg_amp_unscale(sg_ctx *ctx, const sg_tensor *grad_lo, sg_tensor *grad,
                         sg_tensor *scaler, sg_tensor *found)
{
    const char *fn = "sg_amp_unscale";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_amp_check_grad_lo(ctx, fn, grad_lo));
    SG_TRY(check_grad(ctx, fn, grad_lo, grad));
    SG_TRY(check_scaler_found(ctx, fn, scaler, found));
    SG_TRY(check_overlaps(ctx, fn, grad_lo, grad, scaler, found));
    sg_ctx_count_work(ctx, SG_WORK_OPTIMIZER, 0, sg_tensors_bytes(grad_lo, grad, NULL, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        amp_args a = {grad_lo, grad, scaler, found, NULL};
        return sg_cpu_run(ctx, unscale_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_amp_unscale_cuda(ctx, grad_lo, grad, scaler, found, NULL));
}

sg_status sg_amp_check(sg_ctx *ctx, const sg_tensor *grad_lo, sg_tensor *scaler, sg_tensor *found, sg_tensor *inv)
{
    const char *fn = "sg_amp_check";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_amp_check_grad_lo(ctx, fn, grad_lo));
    SG_TRY(check_scaler_found(ctx, fn, scaler, found));
    SG_TRY(sg_check_count(ctx, fn, "inv", inv, SG_DTYPE_F32, 1, "1 / scale"));
    /* The outputs (scaler, found, inv) against each other and against grad_lo. */
    const char *names[4] = {"scaler", "found", "inv", "grad_lo"};
    const sg_tensor *ts[4] = {scaler, found, inv, grad_lo};
    SG_TRY(sg_check_disjoint(ctx, fn, 3, 4, names, ts));
    sg_ctx_count_work(ctx, SG_WORK_OPTIMIZER, 0, sg_tensors_bytes(grad_lo, NULL, NULL, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        amp_args a = {grad_lo, NULL, scaler, found, inv};
        return sg_cpu_run(ctx, unscale_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_amp_unscale_cuda(ctx, grad_lo, NULL, scaler, found, inv));
}
