/* dropout.h: dropout with a counter-based generator (Philox-4x32-10) and the RNG state advance:
 * the generator itself (below, C and CUDA alike, so the CPU reference in dropout_cpu.c and the
 * kernel in dropout_cuda.cu draw identical masks), the references, the launchers, and the
 * public entry points (dropout.c).
 *
 * The mask. rng is 4 I32 in device memory: {seed lo, seed hi, offset lo, offset hi}, read by
 * the kernel (never passed by value), so a captured graph draws fresh masks after each
 * sg_rng_advance. Element i (of the flat tensor) at call site `site` takes word i % 4 of
 *
 *     Philox4x32-10(counter = {(u32)(i/4), (u32)((i/4) >> 32), site, offset lo},
 *                   key     = {seed lo, seed hi ^ offset hi})
 *
 * so four neighbouring elements share one Philox call. uniform = (word >> 8) * 2^-24, exact in
 * f32, in [0, 1 - 2^-24]; the element is kept when uniform >= p, which happens with probability
 * 1 - ceil(p 2^24) / 2^24 (1 - p to within 2^-24). The high offset word is folded into the key
 * (XOR with seed hi) because the counter has no room left: (seed, offset) pairs that differ
 * only by the same XOR in seed hi and offset hi collide, which needs 2^32 steps to reach.
 *
 * Dtypes: x and y (dy and dx) share one: f32, f64 (CPU) or bf16 (mixed precision). The mask
 * depends on (seed, offset, site, i) only, so a bf16 call keeps exactly the elements an f32
 * call at the same state keeps; a kept bf16 element is the f32 call's value on the same input
 * rounded once more, to nearest even bf16 (the product itself is formed in double). */
#ifndef SG_OPS_DROPOUT_H
#define SG_OPS_DROPOUT_H

#include "core/core.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element indices of the rng tensor (4 I32). */
enum { SG_RNG_SEED_LO = 0, SG_RNG_SEED_HI, SG_RNG_OFFSET_LO, SG_RNG_OFFSET_HI, SG_RNG_COUNT };

/* ---- Philox-4x32-10 (Salmon, Moraes, Dror, Shaw, SC 2011; Random123's philox4x32_R) ---- */

#ifdef __CUDACC__
#define SG_PHILOX_FN static __host__ __device__ __forceinline__
#else
#define SG_PHILOX_FN static inline
#endif

#define SG_PHILOX_M0 0xD2511F53u
#define SG_PHILOX_M1 0xCD9E8D57u
#define SG_PHILOX_W0 0x9E3779B9u /* golden ratio */
#define SG_PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

typedef struct sg_philox_out {
    uint32_t v[4];
} sg_philox_out;

/* One round: two 32x32 -> 64-bit products (mul.wide.u32 on the GPU), then the S-box. */
SG_PHILOX_FN void sg_philox_round(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    uint64_t p0 = (uint64_t)SG_PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)SG_PHILOX_M1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

/* Ten rounds, the key bumped by the Weyl constants before rounds 2..10. */
SG_PHILOX_FN sg_philox_out sg_philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                            uint32_t k0, uint32_t k1)
{
    uint32_t c[4] = {c0, c1, c2, c3};
    sg_philox_round(c, k0, k1);
    for (int r = 1; r < 10; r++) {
        k0 += SG_PHILOX_W0;
        k1 += SG_PHILOX_W1;
        sg_philox_round(c, k0, k1);
    }
    sg_philox_out o = {{c[0], c[1], c[2], c[3]}};
    return o;
}

/* The four words of elements 4g .. 4g+3 at `site` under rng = {seed lo, seed hi, offset lo,
 * offset hi} (as u32): the mapping documented at the top of this file. */
SG_PHILOX_FN sg_philox_out sg_dropout_bits(const uint32_t rng[4], uint32_t site, uint64_t g)
{
    return sg_philox4x32_10((uint32_t)g, (uint32_t)(g >> 32), site, rng[SG_RNG_OFFSET_LO],
                            rng[SG_RNG_SEED_LO], rng[SG_RNG_SEED_HI] ^ rng[SG_RNG_OFFSET_HI]);
}

/* uniform = (word >> 8) * 2^-24: a 24-bit integer times a power of two, exact in f32. */
SG_PHILOX_FN float sg_philox_uniform(uint32_t word) { return (float)(word >> 8) * 0x1p-24f; }

/* Whether an element whose word is `word` is kept at drop probability p. */
SG_PHILOX_FN int sg_dropout_keep(uint32_t word, float p) { return sg_philox_uniform(word) >= p; }

/* ---- the op ---- */

/* References (double through sg_ld/sg_st; f32, f64 or bf16). y = x * (keep ? scale : 0) with
 * scale = 1 / (1 - p) in double, rounded to the dtype by sg_st (bf16: to f32, then to nearest
 * even bf16); the forward and the backward are this one function (dx from dy). rng is read
 * when the function runs. x and y may alias. */
void sg_dropout_cpu(const sg_tensor *x, float p, double scale, const sg_tensor *rng,
                    uint32_t site, sg_tensor *y);
/* offset (lo, hi as one u64) += 1. */
void sg_rng_advance_cpu(sg_tensor *rng);

/* One launch each, f32 or bf16; the kernel computes each kept element as
 * (float)((double)x * scale), the reference's operations (bf16: then rounded to nearest even,
 * as sg_st), so GPU and CPU outputs are bit-identical. */
sg_status sg_dropout_cuda(sg_ctx *ctx, const sg_tensor *x, float p, double scale,
                          const sg_tensor *rng, uint32_t site, sg_tensor *y);
sg_status sg_rng_advance_cuda(sg_ctx *ctx, sg_tensor *rng);

#ifdef __cplusplus
}
#endif
#endif
