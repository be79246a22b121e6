/* clip_cpu.c: reference global-norm gradient clipping (torch.nn.utils.clip_grad_norm_ with
 * error_if_nonfinite=False, but leaving g alone when it holds an inf or a NaN), in double for
 * every dtype. The oracle the CUDA kernels are tested against. */
#include "ops/clip.h"
#include "ops/amp.h"

#include <math.h>
#include <string.h>

/* sqrt(sum g^2), all of g finite. Squares of f32 values cannot overflow a double sum (below
 * 2^256 * 2^63); f64 ones can, and then the sum is redone on g / max|g|. */
static double norm2(const sg_tensor *g)
{
    double s = 0;
    for (int64_t i = 0; i < g->numel; i++) {
        double v = sg_ld(g, i);
        s += v * v;
    }
    if (isfinite(s)) return sqrt(s);
    double amax = 0;
    for (int64_t i = 0; i < g->numel; i++) amax = fmax(amax, fabs(sg_ld(g, i)));
    s = 0;
    for (int64_t i = 0; i < g->numel; i++) {
        double v = sg_ld(g, i) / amax;
        s += v * v;
    }
    return amax * sqrt(s);
}

/* The factor clipping multiplies g by: coef = max_norm / (nd + 1e-6) in double, rounded once
 * to f32, when g is finite, max_norm > 0 and that is below 1; else 1. */
static float clip_coef(float max_norm, double nd, int bad)
{
    if (bad || !(max_norm > 0)) return 1.f;
    const float coef = (float)((double)max_norm / (nd + 1e-6));
    return coef < 1.f ? coef : 1.f;
}

/* Writes the norm and the flag, then either factor (when given) or g *= the factor, rounded
 * once to g's dtype (a factor of 1 is skipped). f64 gradients are scaled by the coefficient in
 * f64: as an f32 it would underflow to 0 for norms above about 2^149 max_norm, which f64
 * gradients can reach. */
static void finish(sg_tensor *grad, float max_norm, double nd, int bad, sg_tensor *norm, sg_tensor *nonfinite,
                   sg_tensor *factor)
{
    sg_st(norm, 0, nd);
    sg_st(nonfinite, 0, bad);
    const float coef = clip_coef(max_norm, nd, bad);
    if (factor) sg_st(factor, 0, coef);
    if (!grad || bad || !(max_norm > 0)) return;
    const double c = grad->dtype == SG_DTYPE_F64 ? (double)max_norm / (nd + 1e-6) : (double)coef;
    if (!(c < 1.0)) return;
    for (int64_t i = 0; i < grad->numel; i++) sg_st(grad, i, sg_ld(grad, i) * c);
}

void sg_clip_grad_norm_cpu(sg_tensor *grad, float max_norm, sg_tensor *norm, sg_tensor *nonfinite,
                           sg_tensor *factor)
{
    int bad = 0;
    double s = 0; /* with an inf or NaN in g: inf or NaN, what the norm reads then */
    for (int64_t i = 0; i < grad->numel && !bad; i++) bad = !isfinite(sg_ld(grad, i));
    double nd;
    if (bad) {
        for (int64_t i = 0; i < grad->numel; i++) {
            double v = sg_ld(grad, i);
            s += v * v;
        }
        nd = sqrt(s);
    } else {
        nd = norm2(grad);
    }
    finish(factor ? NULL : grad, max_norm, nd, bad, norm, nonfinite, factor);
}

/* Part i's f64 sum of squares is held as 8 raw bytes at element 2 i of an I32 tensor (F64
 * tensors exist on the CPU only; the bytes travel between ranks as they are). */
static double sum_at(const sg_tensor *sums, int64_t i)
{
    double v;
    memcpy(&v, (const char *)sums->data + 8 * i, sizeof v);
    return v;
}

void sg_clip_sumsq_cpu(const sg_tensor *grad, const sg_tensor *inv, sg_tensor *sums, int part)
{
    const double f = inv ? sg_ld(inv, 0) : 1.0;
    double s = 0; /* f32 squares: no overflow, so inf or NaN exactly when an element is */
    for (int64_t i = 0; i < grad->numel; i++) {
        double v = inv ? sg_amp_unscaled(sg_ld(grad, i), f) : sg_ld(grad, i);
        s += v * v;
    }
    memcpy((char *)sums->data + 8 * (int64_t)part, &s, sizeof s);
}

void sg_clip_apply_cpu(sg_tensor *grad, float max_norm, const sg_tensor *sums, sg_tensor *norm, sg_tensor *nonfinite,
                       sg_tensor *factor)
{
    double s = 0; /* the parts in order; one part: its sum, bit for bit (0 + x is x) */
    for (int64_t i = 0; i < sums->numel / 2; i++) s += sum_at(sums, i);
    double nd = sqrt(s);
    int bad = !isfinite(s);
    finish(factor ? NULL : grad, max_norm, nd, bad, norm, nonfinite, factor);
}
