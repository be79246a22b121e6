/* dropout_cpu.c: reference dropout (forward and backward are one function: both multiply by
 * the same mask) and the RNG offset advance. The mask comes from dropout.h's Philox, the same
 * code the CUDA kernel runs, so the two backends draw the same bits; the oracle for the GPU. */
#include "ops/dropout.h"

/* rng's four I32 read as the u32 words of the mapping in dropout.h (a signed and an unsigned
 * type of one width may alias). */
static void rng_words(const sg_tensor *rng, uint32_t w[4])
{
    const uint32_t *r = rng->data;
    for (int k = 0; k < SG_RNG_COUNT; k++) w[k] = r[k];
}

/* x, y (n): one Philox call per group of four elements, word k for element 4g + k. The
 * product x * scale is rounded to the output dtype by sg_st (bf16 by way of f32), as the
 * kernel does. */
void sg_dropout_cpu(const sg_tensor *x, float p, double scale, const sg_tensor *rng,
                    uint32_t site, sg_tensor *y)
{
    int64_t n = x->numel;
    if (p == 0.f) { /* nothing drops: a copy */
        for (int64_t i = 0; i < n; i++) sg_st(y, i, sg_ld(x, i));
        return;
    }
    uint32_t w[4];
    rng_words(rng, w);
    for (int64_t g = 0; 4 * g < n; g++) {
        sg_philox_out r = sg_dropout_bits(w, site, (uint64_t)g);
        for (int k = 0; k < 4 && 4 * g + k < n; k++) {
            int64_t i = 4 * g + k;
            sg_st(y, i, sg_ld(x, i) * (sg_dropout_keep(r.v[k], p) ? scale : 0.0));
        }
    }
}

void sg_rng_advance_cpu(sg_tensor *rng)
{
    uint32_t *r = rng->data;
    uint64_t off = ((uint64_t)r[SG_RNG_OFFSET_HI] << 32 | r[SG_RNG_OFFSET_LO]) + 1;
    r[SG_RNG_OFFSET_LO] = (uint32_t)off;
    r[SG_RNG_OFFSET_HI] = (uint32_t)(off >> 32);
}
