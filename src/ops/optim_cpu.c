/* optim_cpu.c: reference AdamW and SGD-with-momentum steps over the flat parameter buffer,
 * computed in double for every dtype with PyTorch's formulas (torch.optim.AdamW, SGD), with
 * mixed precision's skip flag and bf16 compute copy. The oracle the CUDA kernel is tested
 * against. */
#include "ops/amp.h"
#include "ops/optim.h"

#include <math.h>

typedef struct hp_d {
    double lr, beta1, beta2, eps, wd, momentum, dampening, step;
} hp_d;

static hp_d hp_read(const sg_tensor *hp)
{
    return (hp_d){sg_ld(hp, SG_HP_LR),       sg_ld(hp, SG_HP_BETA1),    sg_ld(hp, SG_HP_BETA2),
                  sg_ld(hp, SG_HP_EPS),      sg_ld(hp, SG_HP_WEIGHT_DECAY),
                  sg_ld(hp, SG_HP_MOMENTUM), sg_ld(hp, SG_HP_DAMPENING), sg_ld(hp, SG_HP_STEP)};
}

/* skip: a nonzero flag (non-finite gradients) means the step changes nothing. */
static bool skipped(const sg_tensor *skip) { return skip && sg_ld(skip, 0) != 0; }

/* Gradient i: as stored, or (inv given: mixed precision's scaled gradients) times inv[0]
 * rounded to f32 once, the value sg_amp_unscale_cpu writes (a product of two floats is exact in
 * double), and with a second element times that (the clipping factor), rounded again. */
static double grad_at(const sg_tensor *grad, const sg_tensor *inv, int64_t i)
{
    if (!inv) return sg_ld(grad, i);
    double g = sg_amp_unscaled(sg_ld(grad, i), sg_ld(inv, 0));
    return inv->numel > 1 ? sg_amp_unscaled(g, sg_ld(inv, 1)) : g;
}

/* param_lo[i] = bf16 of param[i] as stored, rounded to nearest even as __float2bfloat16_rn
 * on the device (an f64 param goes through f32 first: sg_double_to_bf16). */
static void store_lo(sg_tensor *param_lo, const sg_tensor *param, int64_t i)
{
    if (param_lo) sg_st(param_lo, i, sg_ld(param, i));
}

/* The state's bits for element i at step t (sg_optim_sr_bits' word i % 4), when a state
 * tensor is bf16; 0 otherwise (unused). */
static uint32_t sr_word(const sg_tensor *state, int64_t i, double t)
{
    if (state->dtype != SG_DTYPE_BF16) return 0;
    return sg_optim_sr_bits((uint64_t)i / 4, (uint32_t)t).v[i % 4];
}

/* Stores a new state value: bf16 state rounds it to f32, then stochastically with r. */
static void st_state(sg_tensor *state, int64_t i, double v, uint32_t r)
{
    if (state->dtype == SG_DTYPE_BF16) ((uint16_t *)state->data)[i] = sg_bf16_round_stochastic((float)v, r);
    else sg_st(state, i, v);
}

/* t = step + 1. Per element: decoupled decay p *= 1 - lr*wd (decayed segments only);
 * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr * mhat / (sqrt(vhat) + eps). */
void sg_adamw_step_cpu(sg_tensor *param, const sg_tensor *grad, const sg_tensor *inv, sg_tensor *m, sg_tensor *v,
                       sg_tensor *hp, const sg_tensor *seg_start, const sg_tensor *seg_decay,
                       int n_seg, const sg_tensor *skip, sg_tensor *param_lo)
{
    if (skipped(skip)) return;
    hp_d h = hp_read(hp);
    double t = h.step + 1;
    double bc1 = 1 - pow(h.beta1, t), bc2 = 1 - pow(h.beta2, t);
    const int32_t *start = seg_start->data, *decay = seg_decay->data;
    for (int s = 0; s < n_seg; s++) {
        for (int64_t i = start[s]; i < start[s + 1]; i++) {
            double p = sg_ld(param, i), g = grad_at(grad, inv, i);
            if (decay[s]) p *= 1 - h.lr * h.wd;
            double mi = h.beta1 * sg_ld(m, i) + (1 - h.beta1) * g;
            double vi = h.beta2 * sg_ld(v, i) + (1 - h.beta2) * g * g;
            p -= h.lr * (mi / bc1) / (sqrt(vi / bc2) + h.eps);
            sg_st(param, i, p);
            store_lo(param_lo, param, i);
            uint32_t w = sr_word(m, i, t);
            st_state(m, i, mi, w & 0xffffu);
            st_state(v, i, vi, w >> 16);
        }
    }
    sg_st(hp, SG_HP_STEP, t);
}

/* g += wd p (decayed segments); with momentum: buf = g on the first step (t == 1), else
 * buf = momentum buf + (1 - dampening) g, and g = buf; p -= lr g. buf is neither read nor
 * written when momentum is 0 (PyTorch keeps no buffer then). */
void sg_sgd_step_cpu(sg_tensor *param, const sg_tensor *grad, const sg_tensor *inv, sg_tensor *buf, sg_tensor *hp,
                     const sg_tensor *seg_start, const sg_tensor *seg_decay, int n_seg,
                     const sg_tensor *skip, sg_tensor *param_lo)
{
    if (skipped(skip)) return;
    hp_d h = hp_read(hp);
    double t = h.step + 1;
    const int32_t *start = seg_start->data, *decay = seg_decay->data;
    for (int s = 0; s < n_seg; s++) {
        for (int64_t i = start[s]; i < start[s + 1]; i++) {
            double p = sg_ld(param, i), g = grad_at(grad, inv, i);
            if (decay[s]) g += h.wd * p;
            if (h.momentum != 0) {
                double b = t == 1 ? g : h.momentum * sg_ld(buf, i) + (1 - h.dampening) * g;
                st_state(buf, i, b, sr_word(buf, i, t) & 0xffffu);
                g = b;
            }
            sg_st(param, i, p - h.lr * g);
            store_lo(param_lo, param, i);
        }
    }
    sg_st(hp, SG_HP_STEP, t);
}
