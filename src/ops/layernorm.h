/* layernorm.h: LayerNorm over the last dim, forward and backward, and its fused residual
 * forms (the residual sum written and normalised in one pass; the residual gradient added to
 * LayerNorm's dx): CPU references (layernorm_cpu.c), CUDA kernels (layernorm_cuda.cu), and the
 * public entry points that check arguments (layernorm.c). Shapes: x (M, C) with leading dims
 * flattened into M. */
#ifndef SG_OPS_LAYERNORM_H
#define SG_OPS_LAYERNORM_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Columns the CUDA backward takes at most: its per-block partials (double: dgamma's and dbeta's,
 * and with the column sums dres's and dx's) live in a scratch buffer of fixed size, which holds
 * MAX_C / C blocks' 4*C partials. */
#define SG_LAYERNORM_CUDA_MAX_C ((int64_t)1 << 18)

/* x, y (M, C); gamma, beta (C); mean, rstd (M). Computed in double for every dtype (bf16
 * outputs rounded only on the store, by sg_st); mean and rstd are stored in their own dtype
 * (F32, or F64 for f64 gradient checks). */
void sg_layernorm_forward_cpu(const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *beta,
                              double eps, sg_tensor *y, sg_tensor *mean, sg_tensor *rstd);
/* s = a + b (M, C), rounded to s's dtype, then sg_layernorm_forward_cpu of s as stored. */
void sg_add_layernorm_forward_cpu(const sg_tensor *a, const sg_tensor *b, const sg_tensor *gamma,
                                  const sg_tensor *beta, double eps, sg_tensor *s, sg_tensor *y,
                                  sg_tensor *mean, sg_tensor *rstd);
/* dx (M, C), dgamma (C), dbeta (C) written from x, gamma, the saved mean and rstd, and dy.
 * dres (M, C) or NULL; with it, dx = dres + LayerNorm's dx rounded to dx's dtype, the sum
 * rounded again (as sg_layernorm_backward then sg_add_forward would store them). dres_sum and
 * dx_sum (C), each NULL or written: the column sums of dres and of dx as stored, in double. */
void sg_layernorm_backward_cpu(const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *mean,
                               const sg_tensor *rstd, const sg_tensor *dy, const sg_tensor *dres,
                               sg_tensor *dx, sg_tensor *dgamma, sg_tensor *dbeta,
                               sg_tensor *dres_sum, sg_tensor *dx_sum);

/* x and its companions f32 or bf16 (one dtype per call), mean and rstd f32, math in f32.
 * Forward: one launch; b NULL: y = LayerNorm(a) (s unused), else s = a + b and y =
 * LayerNorm(s). Backward: two launches (the rows, with the column sums in double, then the
 * reduction of the per-block partials), deterministic; dres NULL or added to dx; dres_sum and
 * dx_sum NULL or written; C <= SG_LAYERNORM_CUDA_MAX_C. */
sg_status sg_layernorm_forward_cuda(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b,
                                    const sg_tensor *gamma, const sg_tensor *beta, float eps,
                                    sg_tensor *s, sg_tensor *y, sg_tensor *mean, sg_tensor *rstd);
sg_status sg_layernorm_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                     const sg_tensor *mean, const sg_tensor *rstd,
                                     const sg_tensor *dy, const sg_tensor *dres, sg_tensor *dx,
                                     sg_tensor *dgamma, sg_tensor *dbeta, sg_tensor *dres_sum,
                                     sg_tensor *dx_sum);

#ifdef __cplusplus
}
#endif
#endif
