/* batchnorm_cpu.c: reference batch normalisation over the rows of x (M, C), forward (training
 * and eval) and backward, computed in double for every dtype through sg_ld/sg_st (bf16 outputs
 * rounded only on the store). The oracle the CUDA kernels are tested against.
 * Shapes: x, y, dy, dx (M, C); gamma, beta, mean, rstd, running stats, dgamma, dbeta (C). */
#include "ops/batchnorm.h"

#include <math.h>

/* Channels per pass: the rows are walked in order (row-major, cache friendly) with this many
 * per-channel sums on the stack, so nothing is allocated (a captured CPU plan's replay must
 * not allocate). */
#define BN_CPU_CHUNK 64

/* Per chunk of channels: the mean, then the biased variance of x - mean (two passes, so a large
 * common offset does not cancel), then y. */
void sg_batchnorm_forward_cpu(const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *beta,
                              const sg_tensor *res, int relu, sg_tensor *running_mean,
                              sg_tensor *running_var, double momentum, double eps, int training,
                              sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    const int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    double m[BN_CPU_CHUNK], rs[BN_CPU_CHUNK];
    for (int64_t c0 = 0; c0 < C; c0 += BN_CPU_CHUNK) {
        const int n = (int)(C - c0 < BN_CPU_CHUNK ? C - c0 : BN_CPU_CHUNK);
        if (training) {
            double q[BN_CPU_CHUNK];
            for (int j = 0; j < n; j++) m[j] = q[j] = 0;
            for (int64_t r = 0; r < M; r++)
                for (int j = 0; j < n; j++) m[j] += sg_ld(x, r * C + c0 + j);
            for (int j = 0; j < n; j++) m[j] /= (double)M;
            for (int64_t r = 0; r < M; r++)
                for (int j = 0; j < n; j++) {
                    double d = sg_ld(x, r * C + c0 + j) - m[j];
                    q[j] += d * d;
                }
            for (int j = 0; j < n; j++) {
                const int64_t c = c0 + j;
                double var = q[j] / (double)M;
                rs[j] = 1.0 / sqrt(var + eps);
                if (running_mean) {
                    sg_st(running_mean, c,
                          (1 - momentum) * sg_ld(running_mean, c) + momentum * m[j]);
                    if (M > 1)
                        sg_st(running_var, c,
                              (1 - momentum) * sg_ld(running_var, c) +
                                  momentum * q[j] / (double)(M - 1));
                }
            }
        } else {
            for (int j = 0; j < n; j++) {
                m[j] = sg_ld(running_mean, c0 + j);
                rs[j] = 1.0 / sqrt(sg_ld(running_var, c0 + j) + eps);
            }
        }
        for (int j = 0; j < n; j++) {
            sg_st(mean, c0 + j, m[j]);
            sg_st(rstd, c0 + j, rs[j]);
        }
        for (int64_t r = 0; r < M; r++)
            for (int j = 0; j < n; j++) {
                const int64_t c = c0 + j, i = r * C + c;
                double v = (sg_ld(x, i) - m[j]) * rs[j] * sg_ld(gamma, c) + sg_ld(beta, c);
                if (res) v += sg_ld(res, i);
                sg_st(y, i, relu && !(v > 0) ? 0.0 : v); /* as sg_relu_forward: NaN -> 0 */
            }
    }
}

/* g = dy where y > 0 (y given: the ReLU's output), else dy. */
static double grad_at(const sg_tensor *y, const sg_tensor *dy, int64_t i)
{
    return y && !(sg_ld(y, i) > 0) ? 0.0 : sg_ld(dy, i);
}

/* With xhat = (x - mean) rstd, per channel over the M rows: dbeta = sum g, dgamma = sum g xhat,
 * and dx = gamma rstd (g - dbeta / M - xhat dgamma / M) (the batch statistics depend on every
 * row); dres = g. The saved statistics are used, as the CUDA kernels do. */
void sg_batchnorm_backward_cpu(const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *mean,
                               const sg_tensor *rstd, const sg_tensor *y, const sg_tensor *dy,
                               sg_tensor *dx, sg_tensor *dres, sg_tensor *dgamma,
                               sg_tensor *dbeta)
{
    const int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    double m[BN_CPU_CHUNK], rs[BN_CPU_CHUNK], dg[BN_CPU_CHUNK], db[BN_CPU_CHUNK];
    for (int64_t c0 = 0; c0 < C; c0 += BN_CPU_CHUNK) {
        const int n = (int)(C - c0 < BN_CPU_CHUNK ? C - c0 : BN_CPU_CHUNK);
        for (int j = 0; j < n; j++) {
            m[j] = sg_ld(mean, c0 + j);
            rs[j] = sg_ld(rstd, c0 + j);
            dg[j] = db[j] = 0;
        }
        for (int64_t r = 0; r < M; r++)
            for (int j = 0; j < n; j++) {
                const int64_t i = r * C + c0 + j;
                double d = grad_at(y, dy, i);
                db[j] += d;
                dg[j] += d * (sg_ld(x, i) - m[j]) * rs[j];
            }
        for (int64_t r = 0; r < M; r++)
            for (int j = 0; j < n; j++) {
                const int64_t c = c0 + j, i = r * C + c;
                double xhat = (sg_ld(x, i) - m[j]) * rs[j], g = grad_at(y, dy, i);
                sg_st(dx, i, sg_ld(gamma, c) * rs[j] * (g - db[j] / (double)M - xhat * dg[j] / (double)M));
                if (dres) sg_st(dres, i, g);
            }
        for (int j = 0; j < n; j++) {
            sg_st(dgamma, c0 + j, dg[j]);
            sg_st(dbeta, c0 + j, db[j]);
        }
    }
}
