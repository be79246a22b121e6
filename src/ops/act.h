/* act.h: elementwise activations (ReLU, GELU tanh, SiLU, sigmoid) and the residual add: CPU
 * references (act_cpu.c), CUDA kernels (act_cuda.cu), and the public entry points (act.c). */
#ifndef SG_OPS_ACT_H
#define SG_OPS_ACT_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GELU, tanh approximation, and its derivative, shared by CPU code (double). */
#define SG_GELU_K0 0.7978845608028654 /* sqrt(2/pi) */
#define SG_GELU_K1 0.044715

void sg_relu_forward_cpu(const sg_tensor *x, sg_tensor *y);
void sg_relu_backward_cpu(const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx);
void sg_gelu_forward_cpu(const sg_tensor *x, sg_tensor *y);
void sg_gelu_backward_cpu(const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx);
void sg_add_forward_cpu(const sg_tensor *a, const sg_tensor *b, sg_tensor *y);
void sg_silu_forward_cpu(const sg_tensor *x, sg_tensor *y);
void sg_silu_backward_cpu(const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx);
void sg_sigmoid_forward_cpu(const sg_tensor *x, sg_tensor *y);
/* Reads the forward's output y: dx = dy y (1 - y). */
void sg_sigmoid_backward_cpu(const sg_tensor *y, const sg_tensor *dy, sg_tensor *dx);

sg_status sg_relu_forward_cuda(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y);
sg_status sg_relu_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx);
sg_status sg_gelu_forward_cuda(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y);
sg_status sg_gelu_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx);
sg_status sg_add_forward_cuda(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b, sg_tensor *y);
sg_status sg_silu_forward_cuda(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y);
sg_status sg_silu_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx);
sg_status sg_sigmoid_forward_cuda(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y);
sg_status sg_sigmoid_backward_cuda(sg_ctx *ctx, const sg_tensor *y, const sg_tensor *dy, sg_tensor *dx);

#ifdef __cplusplus
}
#endif
#endif
