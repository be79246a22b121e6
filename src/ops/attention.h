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
 * ignores it; the entry points check it on both backends so that callers are portable.
 *
 * Dtypes. qkv, out, att, dout and dqkv share one dtype: f32 (both backends), f64 (CPU), or
 * bf16 (mixed precision, both backends); another dtype on any of them is SG_ERR_DTYPE naming
 * it. work is F32 for every dtype, and sg_attention_work_elems (which takes no dtype) counts
 * F32 elements for all of them: the bf16 path fits in the same bytes (attention_cuda.cu).
 * With bf16, att is BF16 too: the fp32 softmax's probabilities rounded once, as PyTorch's
 * autocast and flash attention feed P to the P v product in bf16. One rounded P is what the
 * forward's att v reads and what the backward reads, so forward and backward agree on it, and
 * the saved tensor is half the bytes of an F32 one ((B,H,T,T) is the largest activation of a
 * GPT block). The GEMMs run bf16 x bf16 with fp32 accumulation and fp32 results (scores,
 * att v, datt, dv, dq, dk), the softmax and its backward run in fp32, and the outputs (out,
 * att, dqkv) are rounded to bf16 once; d(scores) is rounded to bf16 for the two GEMMs that
 * read it. The CPU reference computes bf16 in double from the stored values (att as saved,
 * rounded) and rounds out, att and dqkv once. */
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

/* Arguments checked by attention.c. The CPU functions compute in double for f32, f64 and
 * bf16 tensors and fail only when host memory runs out. */
sg_status sg_attention_forward_cpu(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                   sg_tensor *att, sg_attn_dims d);
sg_status sg_attention_backward_cpu(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *att,
                                    const sg_tensor *dout, sg_tensor *dqkv, sg_attn_dims d);

/* f32 or bf16: the launchers dispatch on qkv's dtype. */
sg_status sg_attention_forward_cuda(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                    sg_tensor *att, sg_tensor *work, sg_attn_dims d);
sg_status sg_attention_backward_cuda(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *att,
                                     const sg_tensor *dout, sg_tensor *dqkv, sg_tensor *work,
                                     sg_attn_dims d);

/* The fused form (sg_attention_fused_*: stepgraph.h): lse (B, H, T) F32 instead of att; the
 * backward also writes delta (B, H, T) F32 = dout . out per row. CPU: f32, f64, bf16, any head
 * size; CUDA: bf16 and head size 64 (attention_fused_cuda.cu), f32 and head sizes that are
 * multiples of 4 up to 128 (attention_fused_f32_cuda.cu, which attention.c sends every dtype
 * but bf16 to), 16-byte aligned activations, else SG_ERR_UNSUPPORTED. */
/* The fused kernels' alignment rule: each of ts[0..n) 16-byte aligned (they read 16 bytes at a
 * time), else SG_ERR_UNSUPPORTED naming the tensor. */
sg_status sg_attention_check_aligned(sg_ctx *ctx, const char *fn, const sg_tensor *const *ts, int n);
sg_status sg_attention_fused_forward_cpu(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                         sg_tensor *lse, sg_attn_dims d);
sg_status sg_attention_fused_backward_cpu(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out,
                                          const sg_tensor *lse, const sg_tensor *dout, sg_tensor *dqkv,
                                          sg_tensor *delta, sg_attn_dims d);
/* The reference of sg_attention_fused_backward_sums' dbias: dqkv's column sums over its B*T
 * rows, of the values as stored, in double, rounded once to dbias's dtype. */
void sg_attention_col_sums_cpu(const sg_tensor *dqkv, sg_tensor *dbias);
sg_status sg_attention_fused_forward_cuda(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                          sg_tensor *lse, sg_attn_dims d);
/* dbias and parts NULL: the backward alone; else also dbias (3C) = dqkv's column sums, the
 * kernels' per-tile sums in parts (sg_attention_fused_parts elements) added in order. */
sg_status sg_attention_fused_backward_cuda(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out,
                                           const sg_tensor *lse, const sg_tensor *dout, sg_tensor *dqkv,
                                           sg_tensor *delta, sg_tensor *dbias, sg_tensor *parts, sg_attn_dims d);
/* Under sg_ctx_tf32: f32 with head size 64 on the tensor cores in TF32, the bf16 kernels' scheme
 * (attention_fused_cuda.cu); the f32 entry points send it there. */
sg_status sg_attention_fused_forward_tf32_cuda(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                               sg_tensor *lse, sg_attn_dims d);
sg_status sg_attention_fused_backward_tf32_cuda(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out,
                                                const sg_tensor *lse, const sg_tensor *dout, sg_tensor *dqkv,
                                                sg_tensor *delta, sg_attn_dims d);
sg_status sg_attention_fused_forward_f32_cuda(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                              sg_tensor *lse, sg_attn_dims d);
sg_status sg_attention_fused_backward_f32_cuda(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out,
                                               const sg_tensor *lse, const sg_tensor *dout, sg_tensor *dqkv,
                                               sg_tensor *delta, sg_attn_dims d);

#ifdef __cplusplus
}
#endif
#endif
