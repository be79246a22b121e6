/* loss.h: the losses: fused softmax + cross-entropy over the last dim, and mean squared error,
 * each forward and backward in one pass: CPU references (loss_cpu.c), CUDA kernels
 * (loss_cuda.cu), and the public entry points that check arguments (loss.c). */
#ifndef SG_OPS_LOSS_H
#define SG_OPS_LOSS_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* logits (M,C) or (..., C) with targets (M) I32 already validated (every target < C on the
 * CPU): loss(1) and, when dlogits is not NULL, dlogits (M,C), which may be logits itself
 * (in place, as llm.c does for a vocabulary-sized row). Computed in double. */
void sg_softmax_xent_cpu(const sg_tensor *logits, const sg_tensor *targets, float grad_scale,
                         sg_tensor *loss, sg_tensor *dlogits);
/* x, target (any shape, same): loss(1) = mean((x - t)^2); dx = 2 (x - t) grad_scale / numel. */
void sg_mse_cpu(const sg_tensor *x, const sg_tensor *target, float grad_scale, sg_tensor *loss,
                sg_tensor *dx);

/* f32, one launch each, deterministic. A target >= C cannot be reported by the kernel: that
 * row reads no logit out of bounds, its loss term and its dlogits row are NaN, so the loss
 * reads NaN (see loss_cuda.cu). */
sg_status sg_softmax_xent_cuda(sg_ctx *ctx, const sg_tensor *logits, const sg_tensor *targets,
                               float grad_scale, sg_tensor *loss, sg_tensor *dlogits);
sg_status sg_mse_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *target, float grad_scale,
                      sg_tensor *loss, sg_tensor *dx);

#ifdef __cplusplus
}
#endif
#endif
