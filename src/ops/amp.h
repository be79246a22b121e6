/* amp.h: dynamic loss scaling for mixed precision, entirely on the device: sg_amp_unscale turns
 * the scaled low-precision gradients into f32 ones, reports non-finite values and updates the
 * scaler's state (sg_loss_scaler) in the same launch. The CPU reference (amp_cpu.c), the CUDA
 * kernel (amp_cuda.cu) and the public entry point (amp.c).
 *
 * A mixed-precision step: sg_softmax_xent_scaled multiplies dlogits by scaler.scale; backward
 * runs in bf16; sg_amp_unscale(grad_lo -> grad, scaler, found); the optimizer takes found as
 * its `skip` (nothing changes on an overflow) and writes the bf16 compute copy (param_lo). No
 * host sync anywhere, so the whole step can be captured. */
#ifndef SG_OPS_AMP_H
#define SG_OPS_AMP_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element indices of sg_loss_scaler inside the scaler tensor (SG_SCALER_COUNT floats). */
enum {
    SG_SCALER_SCALE = 0,
    SG_SCALER_GOOD_STEPS,
    SG_SCALER_GROWTH_INTERVAL,
    SG_SCALER_SKIPPED
};

/* Bytes of sg_ctx_scratch(ctx, SG_SLOT_AMP, ...) the CUDA kernel uses: the "last block done"
 * counter (unsigned) at byte 0 and the found word (unsigned, the OR of the blocks' flags) at
 * byte 4, both left at zero by the kernel. The first call of a context allocates and
 * zero-fills it (one extra launch, and an allocation capture forbids); reserve it up front
 * with exactly this size, as an optimizer reserves SG_OPTIM_SCRATCH_BYTES, so that every call
 * (and capture) allocates nothing and the address stays put. */
#define SG_AMP_SCRATCH_BYTES 16

/* Mixed precision's scaled gradients as the ops that read them take them: grad_lo BF16 or F32
 * on both backends, F64 too on the CPU (the reference's dtypes); fails naming fn otherwise. */
sg_status sg_amp_check_grad_lo(const sg_ctx *ctx, const char *fn, const sg_tensor *grad_lo);

/* The references' unscaled gradient: g times inv (1 / scale, an f32), rounded once to f32, the
 * value sg_amp_unscale writes (a product of two floats is exact in double, so for bf16 and f32
 * g this is the kernel's f32 product); the optimizer and clipping references that unscale as
 * they read compute it here too. */
static inline float sg_amp_unscaled(double g, double inv) { return (float)(g * inv); }

/* The reference: grad_lo (P) f32, bf16 or f64, grad (P) F32 (may be grad_lo itself when both
 * are f32) or NULL, scaler (SG_SCALER_COUNT) F32, found (1) I32, inv_out (1) F32 or NULL,
 * already validated. inv = 1 / scale in f32 (as the kernel); each unscaled value is
 * f32(grad_lo * inv), written to grad unless grad is NULL (sg_amp_check: the optimizer unscales
 * as it reads, sg_adamw_step_amp); found = some unscaled value is inf or NaN (a non-finite
 * grad_lo, or an unscaled value past f32's range, possible when scale < 1); inv_out = inv, the
 * factor of this step (the scale before the update below).
 * Then the scaler: found: scale *= 0.5, good_steps = 0, skipped += 1; else good_steps += 1 and
 * at growth_interval scale *= 2, good_steps = 0; scale clamped to [SG_LOSS_SCALE_MIN,
 * SG_LOSS_SCALE_MAX] with fmin(fmax(...)), so inf becomes the maximum and NaN the minimum. */
void sg_amp_unscale_cpu(const sg_tensor *grad_lo, sg_tensor *grad, sg_tensor *scaler,
                        sg_tensor *found, sg_tensor *inv_out);

/* One launch, f32 or bf16 grad_lo: grid-stride unscale (grad NULL: only the check) and flag,
 * the last block writes found, inv_out (when given) and the scaler, and resets the scratch
 * words. */
sg_status sg_amp_unscale_cuda(sg_ctx *ctx, const sg_tensor *grad_lo, sg_tensor *grad,
                              sg_tensor *scaler, sg_tensor *found, sg_tensor *inv_out);

#ifdef __cplusplus
}
#endif
#endif
