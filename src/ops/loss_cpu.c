/* loss_cpu.c: reference softmax cross-entropy and mean squared error, loss and gradient, in
 * double for every dtype. These are the oracle the CUDA kernels are tested against. */
#include "ops/loss.h"

#include <math.h>

/* Per row r of logits (M,C) with t = targets[r] >= 0 (t < C, checked by the caller):
 *   m = max_j x_j, s = sum_j exp(x_j - m), loss_r = log s + m - x_t
 *   dlogits_rj = (exp(x_j - m) / s - [j == t]) * (grad_scale / count * S)
 * with S = scaler[0] (1 when scaler is NULL), multiplied after the division: a power of two,
 * so exactly. Rows with t < 0 add nothing and get dlogits 0. dlogits may be logits itself:
 * x_t is read before the row is written, and each x_j just before its own d_j. */
void sg_softmax_xent_cpu(const sg_tensor *logits, const sg_tensor *targets, float grad_scale,
                         const sg_tensor *scaler, sg_tensor *loss, sg_tensor *dlogits)
{
    int64_t C = logits->shape[logits->ndim - 1], M = logits->numel / C;
    int64_t count = 0;
    for (int64_t r = 0; r < M; r++) count += sg_ld(targets, r) >= 0;
    double scale = count ? (double)grad_scale / (double)count : 0.0;
    if (scaler) scale *= sg_ld(scaler, 0);
    double sum = 0;
    for (int64_t r = 0; r < M; r++) {
        int64_t t = (int64_t)sg_ld(targets, r), off = r * C;
        if (t < 0) {
            if (dlogits)
                for (int64_t j = 0; j < C; j++) sg_st(dlogits, off + j, 0.0);
            continue;
        }
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; j++) m = fmax(m, sg_ld(logits, off + j));
        for (int64_t j = 0; j < C; j++) s += exp(sg_ld(logits, off + j) - m);
        sum += log(s) + m - sg_ld(logits, off + t);
        if (!dlogits) continue;
        for (int64_t j = 0; j < C; j++) {
            double p = exp(sg_ld(logits, off + j) - m) / s;
            sg_st(dlogits, off + j, (p - (j == t ? 1.0 : 0.0)) * scale);
        }
    }
    sg_st(loss, 0, count ? sum / (double)count : 0.0);
}

void sg_mse_cpu(const sg_tensor *x, const sg_tensor *target, float grad_scale, sg_tensor *loss,
                sg_tensor *dx)
{
    int64_t n = x->numel;
    double k = 2.0 * grad_scale / (double)n, sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = sg_ld(x, i) - sg_ld(target, i);
        sum += d * d;
        if (dx) sg_st(dx, i, d * k);
    }
    sg_st(loss, 0, sum / (double)n);
}
