/* batchnorm.h: batch normalisation over the rows of x (M, C) (channels last: (N, H, W, C) is
 * M = N H W rows), forward (training and eval) and backward: CPU references (batchnorm_cpu.c),
 * CUDA kernels (batchnorm_cuda.cu), and the public entry points that check arguments
 * (batchnorm.c). gamma, beta, mean, rstd, running statistics, dgamma, dbeta: (C). */
#ifndef SG_OPS_BATCHNORM_H
#define SG_OPS_BATCHNORM_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Channels the CUDA kernels take at most: the per-part channel sums (double) live in a scratch
 * buffer of fixed size (4 MiB), which must hold at least one part's 2*C sums. */
#define SG_BATCHNORM_CUDA_MAX_C ((int64_t)1 << 18)

/* x, y (M, C); the rest (C). training: batch statistics (two passes: the mean, then the biased
 * variance of x - mean), mean and rstd written, the running statistics (when not NULL) updated
 * with the unbiased variance (running_var left alone when M = 1). Eval: mean = running_mean,
 * rstd = 1 / sqrt(running_var + eps). y = bn(x) (+ res when not NULL), then max(., 0) when relu.
 * Computed in double for every dtype (bf16 outputs rounded only on the store). */
void sg_batchnorm_forward_cpu(const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *beta,
                              const sg_tensor *res, int relu, sg_tensor *running_mean,
                              sg_tensor *running_var, double momentum, double eps, int training,
                              sg_tensor *y, sg_tensor *mean, sg_tensor *rstd);
/* g = dy, masked by y > 0 when y is not NULL (the ReLU's output); dx (M, C), dgamma (C),
 * dbeta (C) written from x, gamma, the saved mean and rstd, and g; dres = g when not NULL. */
void sg_batchnorm_backward_cpu(const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *mean,
                               const sg_tensor *rstd, const sg_tensor *y, const sg_tensor *dy,
                               sg_tensor *dx, sg_tensor *dres, sg_tensor *dgamma,
                               sg_tensor *dbeta);

/* x, y, res, dy, dx, dres f32 or bf16 (one dtype per call), every (C) tensor f32; C <=
 * SG_BATCHNORM_CUDA_MAX_C. Arguments as the CPU references'. Forward: two launches in training
 * (per-part channel sums, whose last block to finish turns them into the statistics; the
 * normalisation with the residual and ReLU), one in eval. Backward: two launches (per-part
 * sums of g and g xhat, the last block's dgamma and dbeta; dx and dres). Deterministic. */
sg_status sg_batchnorm_forward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                    const sg_tensor *beta, const sg_tensor *res, int relu,
                                    sg_tensor *running_mean, sg_tensor *running_var,
                                    float momentum, float eps, int training, sg_tensor *y,
                                    sg_tensor *mean, sg_tensor *rstd);
sg_status sg_batchnorm_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                     const sg_tensor *mean, const sg_tensor *rstd,
                                     const sg_tensor *y, const sg_tensor *dy, sg_tensor *dx,
                                     sg_tensor *dres, sg_tensor *dgamma, sg_tensor *dbeta);

#ifdef __cplusplus
}
#endif
#endif
