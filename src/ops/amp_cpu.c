/* amp_cpu.c: reference unscale and loss-scaler update of dynamic loss scaling (PyTorch's
 * GradScaler: _amp_foreach_non_finite_check_and_unscale_ then _amp_update_scale_), in double
 * through sg_ld/sg_st for every dtype. The oracle the CUDA kernel is tested against. */
#include "ops/amp.h"

#include <math.h>

void sg_amp_unscale_cpu(const sg_tensor *grad_lo, sg_tensor *grad, sg_tensor *scaler,
                        sg_tensor *found, sg_tensor *inv_out)
{
    /* 1 / scale divided in f32, as the kernel does, so that a scale that is not a power of two
     * gives the same factor on both backends; a product of two floats is exact in double, so
     * grad below is the f32 product rounded once, again as the kernel's. */
    const double inv = (double)(1.0f / (float)sg_ld(scaler, SG_SCALER_SCALE));
    int bad = 0;
    for (int64_t i = 0; i < grad_lo->numel; i++) {
        float g = sg_amp_unscaled(sg_ld(grad_lo, i), inv); /* grad may be grad_lo: read, then write */
        bad |= !isfinite(g);
        if (grad) sg_st(grad, i, g);
    }
    sg_st(found, 0, bad);
    if (inv_out) sg_st(inv_out, 0, inv);

    double scale = sg_ld(scaler, SG_SCALER_SCALE), good = sg_ld(scaler, SG_SCALER_GOOD_STEPS);
    double skipped = sg_ld(scaler, SG_SCALER_SKIPPED);
    if (bad) {
        scale *= 0.5;
        good = 0;
        skipped += 1;
    } else {
        good += 1;
        if (good >= sg_ld(scaler, SG_SCALER_GROWTH_INTERVAL)) {
            scale *= 2;
            good = 0;
        }
    }
    /* fmax(NaN, MIN) is MIN and fmin(inf, MAX) is MAX: a broken scale comes back usable. */
    scale = fmin(fmax(scale, (double)SG_LOSS_SCALE_MIN), (double)SG_LOSS_SCALE_MAX);
    sg_st(scaler, SG_SCALER_SCALE, scale);
    sg_st(scaler, SG_SCALER_GOOD_STEPS, good);
    sg_st(scaler, SG_SCALER_SKIPPED, skipped);
}
