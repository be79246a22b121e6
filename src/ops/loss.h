/* loss.h: the losses: fused softmax + cross-entropy over the last dim, and mean squared error,
 * each forward and backward in one pass: CPU references (loss_cpu.c), CUDA kernels
 * (loss_cuda.cu), and the public entry points that check arguments (loss.c).
 *
 * Dtypes. sg_softmax_xent: logits and dlogits f32 with an f32 loss; f64 with an f64 loss (CPU
 * only); or, for mixed precision, logits and dlogits bf16 with an f32 loss on both backends:
 * the loss of bf16 logits stays f32 (as under PyTorch's autocast, which runs cross-entropy in
 * f32), so the value the host reads and logs has f32 resolution. With bf16 the logits are read
 * exactly, the arithmetic is f32 (CUDA) or double (CPU), and dlogits, with grad_scale (the
 * loss scale of mixed-precision training enters here) already applied, is rounded once to
 * bf16. targets are I32 in every case. sg_mse: f32, or f64 on the CPU. Any other combination
 * fails with SG_ERR_DTYPE naming the tensor. */
#ifndef SG_OPS_LOSS_H
#define SG_OPS_LOSS_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* logits (M,C) or (..., C) with targets (M) I32 already validated (every target < C on the
 * CPU): loss(1) and, when dlogits is not NULL, dlogits (M,C), which may be logits itself
 * (in place, as llm.c does for a vocabulary-sized row). Computed in double for every dtype
 * (bf16 logits read exactly; each output rounded once to its dtype). */
void sg_softmax_xent_cpu(const sg_tensor *logits, const sg_tensor *targets, float grad_scale,
                         sg_tensor *loss, sg_tensor *dlogits);
/* x, target (any shape, same): loss(1) = mean((x - t)^2); dx = 2 (x - t) grad_scale / numel. */
void sg_mse_cpu(const sg_tensor *x, const sg_tensor *target, float grad_scale, sg_tensor *loss,
                sg_tensor *dx);

/* One launch each, deterministic; xent takes f32 or bf16 logits (loss f32 either way), mse
 * f32. A target >= C cannot be reported by the kernel: that row reads no logit out of bounds,
 * its loss term and its dlogits row are NaN, so the loss reads NaN (see loss_cuda.cu). */
sg_status sg_softmax_xent_cuda(sg_ctx *ctx, const sg_tensor *logits, const sg_tensor *targets,
                               float grad_scale, sg_tensor *loss, sg_tensor *dlogits);
sg_status sg_mse_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *target, float grad_scale,
                      sg_tensor *loss, sg_tensor *dx);

#ifdef __cplusplus
}
#endif
#endif
