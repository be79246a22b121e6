/* loss.c: public entry points of the losses (sg_softmax_xent, sg_softmax_xent_scaled, sg_mse):
 * check arguments, then run the CPU reference or the CUDA kernel. On the CPU the targets are
 * checked against the class count here; on CUDA they live on the device and are not read by
 * the host. Dtypes are in loss.h (cross-entropy takes bf16 logits and an optional loss scaler;
 * mse f32, or f64 on the CPU). */
#include "ops/loss.h"

#include <limits.h>
#include <math.h>

static sg_status check_grad_scale(sg_ctx *ctx, const char *fn, float grad_scale)
{
    if (!isfinite(grad_scale))
        return sg_fail(ctx, SG_ERR_INVALID, "%s: grad_scale is %g, expected a finite value", fn,
                       (double)grad_scale);
    return SG_OK;
}

/* targets: (M), or logits' leading dims ((B,T) for logits (B,T,C)); I32. */
static sg_status check_targets(sg_ctx *ctx, const char *fn, const sg_tensor *logits,
                               const sg_tensor *targets, int64_t rows)
{
    SG_TRY(sg_check_dtype(ctx, fn, "targets", targets, SG_DTYPE_I32));
    bool ok = targets->ndim == 1 && targets->shape[0] == rows;
    if (!ok && targets->ndim == logits->ndim - 1) {
        ok = true;
        for (int i = 0; i < targets->ndim; i++) ok = ok && targets->shape[i] == logits->shape[i];
    }
    if (!ok) {
        char st[96], sl[96];
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: 'targets' is %s but 'logits' is %s; expected (%lld) i32, one target "
                       "per row",
                       fn, sg_shape_str(targets, st, sizeof st),
                       sg_shape_str(logits, sl, sizeof sl), (long long)rows);
    }
    return SG_OK;
}

/* CPU only (the targets are host memory): every target is < C; negative ones mask a row. */
static sg_status check_target_range(sg_ctx *ctx, const char *fn, const sg_tensor *targets,
                                    int64_t classes)
{
    const int32_t *t = targets->data;
    for (int64_t i = 0; i < targets->numel; i++)
        if (t[i] >= classes)
            return sg_fail(ctx, SG_ERR_INVALID,
                           "%s: targets[%lld] (row %lld) is %d, but logits has %lld classes; "
                           "expected 0 to %lld, or a negative value to mask the row",
                           fn, (long long)i, (long long)i, (int)t[i], (long long)classes,
                           (long long)classes - 1);
    return SG_OK;
}

/* The CPU references run through sg_cpu_run, so a CPU capture records them; the target range
 * is checked when the work runs, since a replay sees the targets of its own step. */
typedef struct loss_args {
    const char *fn; /* the public call, for the target range message */
    const sg_tensor *x, *t, *scaler;
    float grad_scale;
    sg_tensor *loss, *dx;
    int64_t classes;
} loss_args;

static sg_status xent_cpu(sg_ctx *ctx, const void *p)
{
    const loss_args *a = p;
    SG_TRY(check_target_range(ctx, a->fn, a->t, a->classes));
    sg_softmax_xent_cpu(a->x, a->t, a->grad_scale, a->scaler, a->loss, a->dx);
    return SG_OK;
}

static sg_status mse_cpu(sg_ctx *ctx, const void *p)
{
    const loss_args *a = p;
    sg_mse_cpu(a->x, a->t, a->grad_scale, a->loss, a->dx);
    return SG_OK;
}

/* scaler: NULL, or the loss scaler's state (SG_SCALER_COUNT F32, sg_loss_scaler), read-only
 * here, so it must not share bytes with what this call writes. */
static sg_status check_scaler(sg_ctx *ctx, const char *fn, const sg_tensor *scaler,
                              const sg_tensor *loss, const sg_tensor *dlogits)
{
    if (!scaler) return SG_OK;
    SG_TRY(sg_check_dtype(ctx, fn, "scaler", scaler, SG_DTYPE_F32));
    if (scaler->numel != SG_SCALER_COUNT) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'scaler' is %s, expected %d elements "
                       "(sg_loss_scaler: scale, good_steps, growth_interval, skipped)", fn,
                       sg_shape_str(scaler, s, sizeof s), SG_SCALER_COUNT);
    }
    SG_TRY(sg_check_not_overlapping(ctx, fn, "loss", loss, "scaler", scaler));
    return sg_check_not_overlapping(ctx, fn, "dlogits", dlogits, "scaler", scaler);
}

/* Both public cross-entropy calls: fn names the one the caller made. */
static sg_status softmax_xent(sg_ctx *ctx, const char *fn, const sg_tensor *logits,
                              const sg_tensor *targets, float grad_scale, const sg_tensor *scaler,
                              sg_tensor *loss, sg_tensor *dlogits)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "logits", logits));
    int64_t classes = logits->shape[logits->ndim - 1], rows = logits->numel / classes;
    SG_TRY(check_targets(ctx, fn, logits, targets, rows));
    /* bf16 logits (mixed precision): the loss stays f32, as PyTorch's autocast keeps it. */
    SG_TRY(sg_check_count(ctx, fn, "loss", loss, logits->dtype == SG_DTYPE_BF16 ? SG_DTYPE_F32 : logits->dtype,
                          1, NULL));
    if (dlogits) SG_TRY(sg_check_same_shape(ctx, fn, "logits", logits, "dlogits", dlogits));
    SG_TRY(check_grad_scale(ctx, fn, grad_scale));
    SG_TRY(check_scaler(ctx, fn, scaler, loss, dlogits));
    sg_ctx_count_work(ctx, SG_WORK_LOSS, 0, sg_tensors_bytes(logits, targets, dlogits, loss, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        loss_args a = {fn, logits, targets, scaler, grad_scale, loss, dlogits, classes};
        return sg_cpu_run(ctx, xent_cpu, &a, sizeof a);
    }
    if (rows > INT_MAX)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: %lld rows; the CUDA kernel takes at most %d",
                       fn, (long long)rows, INT_MAX);
    return SG_CUDA_DISPATCH(ctx, sg_softmax_xent_cuda(ctx, logits, targets, grad_scale, scaler,
                                                      loss, dlogits));
}

sg_status sg_softmax_xent_scaled(sg_ctx *ctx, const sg_tensor *logits, const sg_tensor *targets,
                                 float grad_scale, const sg_tensor *scaler, sg_tensor *loss,
                                 sg_tensor *dlogits)
{
    return softmax_xent(ctx, "sg_softmax_xent_scaled", logits, targets, grad_scale, scaler, loss,
                        dlogits);
}

sg_status sg_softmax_xent(sg_ctx *ctx, const sg_tensor *logits, const sg_tensor *targets,
                          float grad_scale, sg_tensor *loss, sg_tensor *dlogits)
{
    return softmax_xent(ctx, "sg_softmax_xent", logits, targets, grad_scale, NULL, loss, dlogits);
}

sg_status sg_mse(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *target, float grad_scale,
                 sg_tensor *loss, sg_tensor *dx)
{
    const char *fn = "sg_mse";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float(ctx, fn, "x", x));
    SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "target", target));
    SG_TRY(sg_check_count(ctx, fn, "loss", loss, x->dtype, 1, NULL));
    if (dx) SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "dx", dx));
    SG_TRY(check_grad_scale(ctx, fn, grad_scale));
    sg_ctx_count_work(ctx, SG_WORK_LOSS, 0, sg_tensors_bytes(x, target, dx, loss, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        loss_args a = {"sg_mse", x, target, NULL, grad_scale, loss, dx, 0};
        return sg_cpu_run(ctx, mse_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_mse_cuda(ctx, x, target, grad_scale, loss, dx));
}
