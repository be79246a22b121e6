/* attention.h: causal multi-head self-attention, forward and backward: CPU reference
 * (attention_cpu.c), permute / softmax kernels around cuBLAS strided-batched GEMMs
 * (attention_cuda.cu), and the public entry points that check arguments (attention.c).
 *
 * Shapes (row-major): qkv (B,T,3C), q | k | v side by side, head h in columns h*hs..h*hs+hs-1
 * of each (hs = C/heads); out and dout (B,T,C); att (B,H,T,T) with H = heads: the softmax
 * probabilities, 0 above the diagonal, saved by the forward for the backward; dqkv like qkv.
 * qkv, out, dout and dqkv may also be 2-D with the B*T rows flattened ((B*T,3C), (B*T,C)), as
 * the linear layer that feeds them takes them; B and T then come from att.
 * work: F32 scratch of at least sg_attention_work_elems(B,T,C,H) elements, any shape, laid
 * out by the CUDA path as
 *     [ q (B,H,T,hs) | k (B,H,T,hs) | v (B,H,T,hs) | y (B,H,T,hs) | s (B,H,T,T) ]
 * (see attention_cuda.cu for what each region holds in the backward). The CPU reference
 * ignores it; the entry points check it on both backends so that callers are portable. */
#ifndef SG_OPS_ATTENTION_H
#define SG_OPS_ATTENTION_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The problem, from the checked arguments. */
typedef struct sg_attn_dims {
    int64_t B, T, C, H, hs;
} sg_attn_dims;

/* Arguments checked by attention.c. The CPU functions compute in double for f32 and f64
 * tensors and fail only when host memory runs out. */
sg_status sg_attention_forward_cpu(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                   sg_tensor *att, sg_attn_dims d);
sg_status sg_attention_backward_cpu(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *att,
                                    const sg_tensor *dout, sg_tensor *dqkv, sg_attn_dims d);

/* f32 now; the launchers dispatch on qkv's dtype, so a bf16 variant slots in there. */
sg_status sg_attention_forward_cuda(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                    sg_tensor *att, sg_tensor *work, sg_attn_dims d);
sg_status sg_attention_backward_cuda(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *att,
                                     const sg_tensor *dout, sg_tensor *dqkv, sg_tensor *work,
                                     sg_attn_dims d);

#ifdef __cplusplus
}
#endif
#endif
