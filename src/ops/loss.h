/* loss.h: the losses: fused softmax + cross-entropy over the last dim (optionally with the
 * dynamic loss scale of mixed precision read from the device), and mean squared error, each
 * forward and backward in one pass: CPU references (loss_cpu.c), CUDA kernels (loss_cuda.cu),
 * and the public entry points that check arguments (loss.c).
 *
 * Dtypes. sg_softmax_xent: logits and dlogits f32 with an f32 loss; f64 with an f64 loss (CPU
 * only); or, for mixed precision, logits and dlogits bf16 with an f32 loss on both backends:
 * the loss of bf16 logits stays f32 (as under PyTorch's autocast, which runs cross-entropy in
 * f32), so the value the host reads and logs has f32 resolution. With bf16 the logits are read
 * exactly, the arithmetic is f32 (CUDA) or double (CPU), and dlogits, with grad_scale (a
 * static loss scale may enter here) already applied, is rounded once to bf16. targets are I32
 * in every case. sg_mse: f32, or f64 on the CPU. Any other combination fails with
 * SG_ERR_DTYPE naming the tensor.
 *
 * Dynamic loss scaling. sg_softmax_xent_scaled takes the same dtypes plus scaler
 * (SG_SCALER_COUNT F32, laid out as sg_loss_scaler; see ops/amp.h) and multiplies dlogits by
 * scaler[0], read when the work runs (by the kernel on CUDA: no host sync, and a replayed
 * graph follows the scale). Order: unit = grad_scale / count first, exactly as without a
 * scaler, then unit * scale. The scale is a power of two, so that product is exact and the
 * scaled dlogits are the unscaled ones times the scale, bit for bit (barring subnormal
 * results, and overflow to inf, which sg_amp_unscale then reports). The loss is never scaled.
 * sg_softmax_xent is this call with scaler NULL. */
#ifndef SG_OPS_LOSS_H
#define SG_OPS_LOSS_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* logits (M,C) or (..., C) with targets (M) I32 already validated (every target < C on the
 * CPU): loss(1) and, when dlogits is not NULL, dlogits (M,C), which may be logits itself
 * (in place, as llm.c does for a vocabulary-sized row). Computed in double for every dtype
 * (bf16 logits read exactly; each output rounded once to its dtype). scaler (SG_SCALER_COUNT
 * F32) or NULL: dlogits also times scaler[0], read (in double) when the work runs. */
void sg_softmax_xent_cpu(const sg_tensor *logits, const sg_tensor *targets, float grad_scale,
                         const sg_tensor *scaler, sg_tensor *loss, sg_tensor *dlogits);
/* x, target (any shape, same): loss(1) = mean((x - t)^2); dx = 2 (x - t) grad_scale / numel. */
void sg_mse_cpu(const sg_tensor *x, const sg_tensor *target, float grad_scale, sg_tensor *loss,
                sg_tensor *dx);

/* One launch each, deterministic; xent takes f32 or bf16 logits (loss f32 either way) and
 * reads scaler[0] (when not NULL) in the kernel, so a captured step follows the scale; mse
 * f32. A target >= C cannot be reported by the kernel: that row reads no logit out of bounds,
 * its loss term and its dlogits row are NaN, so the loss reads NaN (see loss_cuda.cu). */
sg_status sg_softmax_xent_cuda(sg_ctx *ctx, const sg_tensor *logits, const sg_tensor *targets,
                               float grad_scale, const sg_tensor *scaler, sg_tensor *loss,
                               sg_tensor *dlogits);
sg_status sg_mse_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *target, float grad_scale,
                      sg_tensor *loss, sg_tensor *dx);

#ifdef __cplusplus
}
#endif
#endif
