/* optim.h: the optimizer steps (AdamW, SGD with momentum) over one flat parameter buffer cut
 * into segments: CPU references (optim_cpu.c), the multi-tensor CUDA kernel (optim_cuda.cu),
 * and the public entry points (optim.c). Hyperparameters are read from device memory, and so
 * is the mixed-precision `skip` flag (sg_amp_unscale's found: a step with non-finite gradients
 * changes nothing). param_lo, when given, receives bf16(param) in the same pass: the compute
 * copy of mixed precision, rounded to nearest even. */
#ifndef SG_OPS_OPTIM_H
#define SG_OPS_OPTIM_H

#include "core/core.h"
#include "ops/dropout.h" /* Philox-4x32-10, the stochastic rounding's bits */

#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element indices of sg_optim_hparams inside the hp tensor (8 floats). */
enum {
    SG_HP_LR = 0,
    SG_HP_BETA1,
    SG_HP_BETA2,
    SG_HP_EPS,
    SG_HP_WEIGHT_DECAY,
    SG_HP_MOMENTUM,
    SG_HP_DAMPENING,
    SG_HP_STEP,
    SG_HP_COUNT
};

/* Bytes of sg_ctx_scratch(ctx, SG_SLOT_OPTIM, ...) the CUDA step uses: its "last block done"
 * counter. The first step of a context allocates and zero-fills it (one extra launch); an
 * optimizer reserves it up front with this size so that steps (and captures) allocate
 * nothing and the address stays put. Always ask for exactly this size. */
#define SG_OPTIM_SCRATCH_BYTES 16

/* ---- bf16 optimizer state: stochastic rounding ----
 * With m and v (AdamW) or buf (SGD) stored in bf16 beside f32 parameters, each new state value
 * is computed in f32 and rounded to bf16 stochastically: up with probability equal to the
 * fraction of a bf16 unit it lies above the bf16 below it, so the stored value is unbiased.
 * Rounding to nearest would stall the second moment: v = 0.999 v + 0.001 g^2 moves v by less
 * than half a bf16 unit (2^-9 relative) whenever g^2 is within a factor of about 3 of v, so v
 * would stop following g^2. The bits are a pure function of (step, element): Philox-4x32-10
 * with counter (i / 4 as two words, SG_OPTIM_SR_SITE, t = hp.step + 1) and key SG_OPTIM_SR_KEY;
 * word i % 4 serves element i, its low 16 bits m (or buf), its high 16 bits v. So a step is
 * deterministic, eager and captured runs agree bit for bit, and the CPU reference draws the
 * same bits. */
#define SG_OPTIM_SR_SITE 0x6f707431u /* "opt1" */
#define SG_OPTIM_SR_KEY0 0x243f6a88u /* pi's fraction */
#define SG_OPTIM_SR_KEY1 0x85a308d3u

/* The four words of elements 4*g .. 4*g+3 at step t (t = hp.step + 1, as a u32). */
SG_PHILOX_FN sg_philox_out sg_optim_sr_bits(uint64_t g, uint32_t t)
{
    return sg_philox4x32_10((uint32_t)g, (uint32_t)(g >> 32), SG_OPTIM_SR_SITE, t, SG_OPTIM_SR_KEY0,
                            SG_OPTIM_SR_KEY1);
}

/* bf16 of x rounded stochastically with r (16 random bits): the f32's low 16 bits plus r,
 * carried into the top half, which is kept. The magnitude rounds up with probability
 * (low 16 bits) / 2^16, whatever the sign. inf and NaN keep their class (a NaN stays a NaN). */
SG_PHILOX_FN uint16_t sg_bf16_round_stochastic(float x, uint32_t r)
{
    uint32_t b;
#ifdef __CUDA_ARCH__
    b = __float_as_uint(x);
#else
    memcpy(&b, &x, sizeof b);
#endif
    if ((b & 0x7f800000u) == 0x7f800000u) /* inf or NaN */
        return (uint16_t)((b >> 16) | ((b & 0x007fffffu) ? 0x40u : 0u));
    return (uint16_t)((b + (r & 0xffffu)) >> 16);
}

/* References, in double through sg_ld/sg_st (f32 or f64 tensors; hp f32 or f64). The
 * arguments are valid (optim.c checks them). inv (1 or 2) or NULL: grad holds mixed precision's
 * scaled gradients (any float dtype), each used as f32(grad * inv[0]), sg_amp_unscale's value,
 * and with 2 elements as f32(that * inv[1]), clipped by the factor inv[1].
 * m, v, buf: (P), like param, or BF16 (P) beside an F32 param: then each new state value is
 * rounded to f32, then stochastically to bf16 with the bits above (the kernel computes it in
 * f32: the two agree but for the rare value whose f32 rounding differs). skip (1 I32) or NULL:
 * read when the work runs; nonzero returns at once, nothing written. param_lo (P BF16) or
 * NULL: bf16 of each new param as stored (sg_double_to_bf16: round to nearest even). */
void sg_adamw_step_cpu(sg_tensor *param, const sg_tensor *grad, const sg_tensor *inv, sg_tensor *m,
                       sg_tensor *v, sg_tensor *hp, const sg_tensor *seg_start, const sg_tensor *seg_decay,
                       int n_seg, const sg_tensor *skip, sg_tensor *param_lo);
void sg_sgd_step_cpu(sg_tensor *param, const sg_tensor *grad, const sg_tensor *inv, sg_tensor *buf,
                     sg_tensor *hp, const sg_tensor *seg_start, const sg_tensor *seg_decay, int n_seg,
                     const sg_tensor *skip, sg_tensor *param_lo);

/* One launch each, f32 params with f32 or bf16 state; seg_start/seg_decay/skip are device
 * tensors (skip read by the kernel: on nonzero every block returns at entry, so neither the
 * buffers nor hp.step nor the block counter move). grad: F32, or with inv (1 or 2 F32, device)
 * BF16 or F32 scaled gradients, each multiplied by inv[0] in f32 as it is read (then by inv[1]). */
sg_status sg_adamw_step_cuda(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, const sg_tensor *inv,
                             sg_tensor *m, sg_tensor *v, sg_tensor *hp, const sg_tensor *seg_start,
                             const sg_tensor *seg_decay, int n_seg, const sg_tensor *skip,
                             sg_tensor *param_lo);
sg_status sg_sgd_step_cuda(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, const sg_tensor *inv,
                           sg_tensor *buf, sg_tensor *hp, const sg_tensor *seg_start,
                           const sg_tensor *seg_decay, int n_seg, const sg_tensor *skip, sg_tensor *param_lo);

#ifdef __cplusplus
}
#endif
#endif
