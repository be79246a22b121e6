/* layernorm_cpu.c: reference LayerNorm over the last dim, forward and backward, and its fused
 * residual forms, computed in double for every dtype through sg_ld/sg_st (outputs are rounded
 * only on the store). The oracle the CUDA kernels are tested against.
 * Shapes: a, b, s, x, y, dy, dres, dx (M, C); gamma, beta, dgamma, dbeta (C); mean, rstd (M). */
#include "ops/layernorm.h"

#include <math.h>

/* Two passes per row: the mean, then the biased variance of (x - mean), so a large common
 * offset does not cancel catastrophically as E[x^2] - mean^2 would. */
void sg_layernorm_forward_cpu(const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *beta,
                              double eps, sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    for (int64_t r = 0; r < M; r++) {
        const int64_t o = r * C;
        double m = 0;
        for (int64_t c = 0; c < C; c++) m += sg_ld(x, o + c);
        m /= (double)C;
        double v = 0;
        for (int64_t c = 0; c < C; c++) {
            double d = sg_ld(x, o + c) - m;
            v += d * d;
        }
        v /= (double)C;
        double s = 1.0 / sqrt(v + eps);
        for (int64_t c = 0; c < C; c++)
            sg_st(y, o + c, (sg_ld(x, o + c) - m) * s * sg_ld(gamma, c) + sg_ld(beta, c));
        sg_st(mean, r, m);
        sg_st(rstd, r, s);
    }
}

/* The residual sum, stored (so rounded to s's dtype as sg_add_forward rounds it), then
 * normalised as stored: the pair sg_add_forward + sg_layernorm_forward, bit for bit. */
void sg_add_layernorm_forward_cpu(const sg_tensor *a, const sg_tensor *b, const sg_tensor *gamma,
                                  const sg_tensor *beta, double eps, sg_tensor *s, sg_tensor *y,
                                  sg_tensor *mean, sg_tensor *rstd)
{
    for (int64_t i = 0; i < a->numel; i++) sg_st(s, i, sg_ld(a, i) + sg_ld(b, i));
    sg_layernorm_forward_cpu(s, gamma, beta, eps, y, mean, rstd);
}

/* With xhat = (x - mean) * rstd and g = dy * gamma, per row:
 *   dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),
 * and over rows: dgamma = sum_r dy * xhat, dbeta = sum_r dy (and dres_sum = sum_r dres,
 * dx_sum = sum_r dx as stored, where asked for). The statistics are the saved
 * ones (as the CUDA kernels read them), not recomputed. dgamma and dbeta are summed column by
 * column (strided reads, no temporary buffer: replaying a captured plan allocates nothing).
 * With dres, dx is rounded to its dtype, read back and added to dres, and rounded again: what
 * sg_layernorm_backward then sg_add_forward store, bit for bit (the CUDA kernels do the same). */
void sg_layernorm_backward_cpu(const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *mean,
                               const sg_tensor *rstd, const sg_tensor *dy, const sg_tensor *dres,
                               sg_tensor *dx, sg_tensor *dgamma, sg_tensor *dbeta,
                               sg_tensor *dres_sum, sg_tensor *dx_sum)
{
    int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    for (int64_t r = 0; r < M; r++) {
        const int64_t o = r * C;
        double m = sg_ld(mean, r), s = sg_ld(rstd, r);
        double g_mean = 0, gx_mean = 0;
        for (int64_t c = 0; c < C; c++) {
            double g = sg_ld(dy, o + c) * sg_ld(gamma, c);
            g_mean += g;
            gx_mean += g * (sg_ld(x, o + c) - m) * s;
        }
        g_mean /= (double)C;
        gx_mean /= (double)C;
        for (int64_t c = 0; c < C; c++) {
            double g = sg_ld(dy, o + c) * sg_ld(gamma, c);
            double xhat = (sg_ld(x, o + c) - m) * s;
            sg_st(dx, o + c, s * (g - g_mean - xhat * gx_mean));
            if (dres) sg_st(dx, o + c, sg_ld(dres, o + c) + sg_ld(dx, o + c));
        }
    }
    for (int64_t c = 0; c < C; c++) {
        double dg = 0, db = 0, rs = 0, xs = 0;
        for (int64_t r = 0; r < M; r++) {
            double d = sg_ld(dy, r * C + c);
            dg += d * (sg_ld(x, r * C + c) - sg_ld(mean, r)) * sg_ld(rstd, r);
            db += d;
            if (dres_sum) rs += sg_ld(dres, r * C + c);
            if (dx_sum) xs += sg_ld(dx, r * C + c);
        }
        sg_st(dgamma, c, dg);
        sg_st(dbeta, c, db);
        if (dres_sum) sg_st(dres_sum, c, rs);
        if (dx_sum) sg_st(dx_sum, c, xs);
    }
}
