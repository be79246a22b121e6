/* linear.h: the fully connected layer y = act(x @ w^T + b), forward and backward: CPU
 * reference (linear_cpu.c), cuBLASLt matmuls with fused epilogues plus one activation/bias
 * gradient kernel (linear_cuda.cu), and the public entry points that check arguments (linear.c).
 *
 * Shapes (row-major): x (M,K) or N-D (..., K) with its leading dims flattened into M rows;
 * w (N,K) stored (out, in) as PyTorch's; b (N); y and pre (M,N) or N-D (..., N) with M rows;
 * dy and act_in like y; dx like x; dw like w; db like b.
 *
 * `pre` (forward): required when act is SG_ACT_GELU (the backward needs the pre-activation)
 * and must be NULL otherwise: a non-NULL pre with RELU or NONE fails with SG_ERR_INVALID
 * rather than being silently left unwritten.
 * `act_in` (backward): with RELU the forward's output y (relu'(pre) = y > 0), with GELU the
 * forward's pre, with NONE ignored (NULL is fine). dy is overwritten with d(pre) when act is
 * not NONE. dx, dw and db are written, not accumulated.
 *
 * Dtypes: every tensor of a call has x's dtype: f32, f64 (CPU only), or bf16 on both backends
 * (mixed precision, as PyTorch's autocast): bf16 storage, f32 (CUDA) or f64 (CPU) arithmetic,
 * each output rounded once to bf16. d(pre) is rounded to bf16 when it is stored in dy, and
 * dw, dx and db are computed from d(pre) as stored, on both backends (the CUDA matmuls read
 * it from dy). Mixing dtypes in one call fails with SG_ERR_DTYPE naming the tensor. */
#ifndef SG_OPS_LINEAR_H
#define SG_OPS_LINEAR_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Arguments checked by linear.c; m, n, k are the rows of x, the rows of w and the columns of
 * x. The CPU functions fail only when host memory runs out. */
/* res: NULL, or the residual added before y is rounded (sg_linear_forward_residual: act NONE;
 * res may be y itself). */
sg_status sg_linear_forward_cpu(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                                const sg_tensor *b, sg_activation act, const sg_tensor *res, sg_tensor *y,
                                sg_tensor *pre, int64_t m, int64_t n, int64_t k);
/* Backward: with x_act not NONE (sg_linear_backward_through), dx is dx_pre = x_act'(x_pre) *
 * (d(pre) @ w), rounded once, and x_db (may be NULL) its column sums as stored. */
typedef struct sg_linear_through {
    sg_activation x_act;
    const sg_tensor *x_pre;
    sg_tensor *x_db;
} sg_linear_through;
sg_status sg_linear_backward_cpu(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                                 sg_tensor *dy, sg_activation act, const sg_tensor *act_in,
                                 sg_tensor *dx, sg_tensor *dw, sg_tensor *db,
                                 const sg_linear_through *th, int64_t m, int64_t n, int64_t k);

sg_status sg_linear_forward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                                 const sg_tensor *b, sg_activation act, const sg_tensor *res, sg_tensor *y,
                                 sg_tensor *pre, int64_t m, int64_t n, int64_t k);
sg_status sg_linear_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                                  sg_tensor *dy, sg_activation act, const sg_tensor *act_in,
                                  sg_tensor *dx, sg_tensor *dw, sg_tensor *db,
                                  const sg_linear_through *th, int64_t m, int64_t n, int64_t k);

/* sg_ctx_gemm_tune: how many matmul plans of ctx had their candidates timed, and how many of
 * those replaced the heuristic's first (0 and 0 without CUDA, or before any plan). For tests. */
void sg_linear_tune_counts(sg_ctx *ctx, int *timed, int *switched);

#ifdef __cplusplus
}
#endif
#endif
