/* embedding.h: token + position embedding, forward and backward: CPU references
 * (embedding_cpu.c), CUDA kernels (embedding_cuda.cu), and the public entry points that check
 * arguments (embedding.c). Shapes: tokens (B, T) I32; wte (V, C); wpe (Tmax >= T, C);
 * y, dy (B, T, C) or (B*T, C). */
#ifndef SG_OPS_EMBEDDING_H
#define SG_OPS_EMBEDDING_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every token already checked to lie in 0..V-1. y[b, t] = wte[tokens[b, t]] + wpe[t], added in
 * double and rounded only on the store to y's dtype (as the backward's sums are). */
void sg_embedding_forward_cpu(const sg_tensor *tokens, const sg_tensor *wte, const sg_tensor *wpe,
                              sg_tensor *y);
/* dwte (V, C), dwpe (Tmax, C) written in full, summed in double in token order. Needs a
 * (V, C) double buffer: SG_ERR_OOM (nothing written) when the host has none. */
sg_status sg_embedding_backward_cpu(sg_ctx *ctx, const sg_tensor *tokens, const sg_tensor *dy,
                                    sg_tensor *dwte, sg_tensor *dwpe);

/* f32 or bf16 (every float tensor of the call), one launch each, deterministic. A token
 * outside 0..V-1 cannot be reported by a kernel: the forward reads its wte row as zeros, the
 * backward adds its dy to no dwte row (dwpe still gets it), and nothing is read out of
 * bounds. */
sg_status sg_embedding_forward_cuda(sg_ctx *ctx, const sg_tensor *tokens, const sg_tensor *wte,
                                    const sg_tensor *wpe, sg_tensor *y);
sg_status sg_embedding_backward_cuda(sg_ctx *ctx, const sg_tensor *tokens, const sg_tensor *dy,
                                     sg_tensor *dwte, sg_tensor *dwpe);

#ifdef __cplusplus
}
#endif
#endif
