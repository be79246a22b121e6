/* clip.h: global-norm gradient clipping over one flat buffer: the CPU reference (clip_cpu.c),
 * the CUDA kernels (clip_cuda.cu: a deterministic sum of squares, then an in-place scale that
 * reads the norm from device memory, so no host sync and capture-safe), and the public entry
 * point (clip.c). */
#ifndef SG_OPS_CLIP_H
#define SG_OPS_CLIP_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The grid of the sum of squares never exceeds this many blocks (H100: 132 SMs x 4 = 528). */
#define SG_CLIP_MAX_BLOCKS 2048
/* Bytes of sg_ctx_scratch(ctx, SG_SLOT_CLIP, ...) the CUDA path uses: the counter at byte 0,
 * the norm (double) at byte 8, partials (double) from byte 256. The first call of a context
 * allocates and zero-fills it (one extra launch, not allowed during capture); reserve it up
 * front with exactly this size so that every call (and capture) allocates nothing and the
 * address stays put. */
#define SG_CLIP_SCRATCH_BYTES (256 + 8 * SG_CLIP_MAX_BLOCKS)

/* grad (P) f32 or f64, norm (1) F32, nonfinite (1) I32. In double: norm = sqrt(sum g^2) in
 * index order (rescaled by the largest |g| when the f64 sum overflows); nonfinite = any g is
 * inf or NaN. The factor: coef = max_norm / (norm + 1e-6) computed in double and rounded once
 * to f32, when it is below 1, g is finite and max_norm > 0; else 1 (min(1, coef)). With factor
 * NULL g *= it (rounded once to g's dtype; a factor of 1 is skipped; f64 gradients by the
 * coefficient in f64, which cannot underflow); else factor (1 F32) holds it and g is left
 * alone. */
void sg_clip_grad_norm_cpu(sg_tensor *grad, float max_norm, sg_tensor *norm, sg_tensor *nonfinite,
                           sg_tensor *factor);

/* f32: one launch (max_norm <= 0, or a factor given: measure) or two (measure, then scale). */
sg_status sg_clip_grad_norm_cuda(sg_ctx *ctx, sg_tensor *grad, float max_norm, sg_tensor *norm,
                                 sg_tensor *nonfinite, sg_tensor *factor);

/* The split form (sg_clip_sumsq, sg_clip_apply, sg_clip_factor_sums), f32 gradients: sums, I32
 * (2 n), holds part i's f64 sum of squares as raw bytes at element 2 i (index order on the CPU,
 * clip_sumsq_kernel's order on CUDA); apply adds the n parts in order in f64, then norm = sqrt
 * of that, nonfinite = it is not finite, and the factor above: g (which may be NULL then) *= it,
 * or factor (when not NULL) holds it. On one part the two are sg_clip_grad_norm bit for bit, on
 * each backend. With inv (1 F32; sg_clip_sumsq_amp) the sum is of grad (BF16 or F32, F64 too on
 * the CPU) times inv[0], each product rounded to f32 (sg_amp_unscale's value), in the order of
 * the f32 sum: the sum of sg_amp_unscale's output bit for bit. */
void sg_clip_sumsq_cpu(const sg_tensor *grad, const sg_tensor *inv, sg_tensor *sums, int part);
void sg_clip_apply_cpu(sg_tensor *grad, float max_norm, const sg_tensor *sums, sg_tensor *norm,
                       sg_tensor *nonfinite, sg_tensor *factor);
sg_status sg_clip_sumsq_cuda(sg_ctx *ctx, const sg_tensor *grad, const sg_tensor *inv, sg_tensor *sums, int part);
sg_status sg_clip_apply_cuda(sg_ctx *ctx, sg_tensor *grad, float max_norm, const sg_tensor *sums,
                             sg_tensor *norm, sg_tensor *nonfinite, sg_tensor *factor);

#ifdef __cplusplus
}
#endif
#endif
