/* pool_cpu.c: reference max pooling, global average pooling and channel scaling over
 * channels-last images, forward and backward, computed in double for every dtype through
 * sg_ld/sg_st (bf16 outputs rounded only on the store). The oracle the CUDA kernels are
 * tested against. x, dx (N, H, W, C); see pool.h for the rest. */
#include "ops/pool.h"

#include <math.h>

/* The window of output (oh, ow) covers rows oh*stride - pad .. + k - 1 (likewise columns);
 * positions outside the image never win. The first real position starts the scan, so a
 * window of -inf still names one of its own elements; later ones win only when strictly
 * greater (ties: the first in row-major order), or when NaN (the first NaN stays). */
void sg_maxpool2d_forward_cpu(const sg_tensor *x, int k, int stride, int pad, sg_tensor *y,
                              sg_tensor *argmax)
{
    const int64_t N = x->shape[0], H = x->shape[1], W = x->shape[2], C = x->shape[3];
    const int64_t OH = y->shape[1], OW = y->shape[2];
    for (int64_t n = 0; n < N; n++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++)
                for (int64_t c = 0; c < C; c++) {
                    double best = 0;
                    int64_t arg = -1;
                    for (int64_t h = oh * stride - pad; h < oh * stride - pad + k; h++) {
                        if (h < 0 || h >= H) continue;
                        for (int64_t w = ow * stride - pad; w < ow * stride - pad + k; w++) {
                            if (w < 0 || w >= W) continue;
                            double v = sg_ld(x, ((n * H + h) * W + w) * C + c);
                            if (arg < 0 || (!isnan(best) && (v > best || isnan(v)))) {
                                best = v;
                                arg = h * W + w;
                            }
                        }
                    }
                    const int64_t o = ((n * OH + oh) * OW + ow) * C + c;
                    sg_st(y, o, best);
                    sg_st(argmax, o, (double)arg);
                }
}

/* The outputs whose window contains position i along a dim of `in` positions: o in [*lo, *hi]
 * (empty when *lo > *hi). o covers i when o*stride - pad <= i <= o*stride - pad + k - 1. */
static void windows_of(int64_t i, int k, int stride, int pad, int64_t out, int64_t *lo, int64_t *hi)
{
    const int64_t t = i + pad - k + 1; /* o*stride >= t */
    *lo = t <= 0 ? 0 : (t + stride - 1) / stride;
    *hi = (i + pad) / stride;
    if (*hi > out - 1) *hi = out - 1;
}

void sg_maxpool2d_backward_cpu(const sg_tensor *dy, const sg_tensor *argmax, int k, int stride,
                               int pad, sg_tensor *dx)
{
    const int64_t N = dx->shape[0], H = dx->shape[1], W = dx->shape[2], C = dx->shape[3];
    const int64_t OH = dy->shape[1], OW = dy->shape[2];
    for (int64_t n = 0; n < N; n++)
        for (int64_t h = 0; h < H; h++) {
            int64_t oh0, oh1;
            windows_of(h, k, stride, pad, OH, &oh0, &oh1);
            for (int64_t w = 0; w < W; w++) {
                int64_t ow0, ow1;
                windows_of(w, k, stride, pad, OW, &ow0, &ow1);
                for (int64_t c = 0; c < C; c++) {
                    double s = 0;
                    for (int64_t oh = oh0; oh <= oh1; oh++)
                        for (int64_t ow = ow0; ow <= ow1; ow++) {
                            const int64_t o = ((n * OH + oh) * OW + ow) * C + c;
                            if (sg_ld(argmax, o) == (double)(h * W + w)) s += sg_ld(dy, o);
                        }
                    sg_st(dx, ((n * H + h) * W + w) * C + c, s);
                }
            }
        }
}

/* y (N, C): the sum over the H W positions, in order, divided by H W. */
void sg_avgpool_forward_cpu(const sg_tensor *x, sg_tensor *y)
{
    const int64_t N = x->shape[0], HW = x->shape[1] * x->shape[2], C = x->shape[3];
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t p = 0; p < HW; p++) s += sg_ld(x, (n * HW + p) * C + c);
            sg_st(y, n * C + c, s / (double)HW);
        }
}

void sg_avgpool_backward_cpu(const sg_tensor *dy, sg_tensor *dx)
{
    const int64_t N = dx->shape[0], HW = dx->shape[1] * dx->shape[2], C = dx->shape[3];
    for (int64_t n = 0; n < N; n++)
        for (int64_t p = 0; p < HW; p++)
            for (int64_t c = 0; c < C; c++)
                sg_st(dx, (n * HW + p) * C + c, sg_ld(dy, n * C + c) / (double)HW);
}

void sg_channel_scale_forward_cpu(const sg_tensor *x, const sg_tensor *s, sg_tensor *y)
{
    const int64_t N = x->shape[0], HW = x->shape[1] * x->shape[2], C = x->shape[3];
    for (int64_t n = 0; n < N; n++)
        for (int64_t p = 0; p < HW; p++)
            for (int64_t c = 0; c < C; c++) {
                const int64_t i = (n * HW + p) * C + c;
                sg_st(y, i, sg_ld(x, i) * sg_ld(s, n * C + c));
            }
}

/* dx = dy s; ds (N, C) = the sum over the H W positions, in order, of dy x. */
void sg_channel_scale_backward_cpu(const sg_tensor *x, const sg_tensor *s, const sg_tensor *dy,
                                   sg_tensor *dx, sg_tensor *ds)
{
    const int64_t N = x->shape[0], HW = x->shape[1] * x->shape[2], C = x->shape[3];
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            const double sc = sg_ld(s, n * C + c);
            double a = 0;
            for (int64_t p = 0; p < HW; p++) {
                const int64_t i = (n * HW + p) * C + c;
                const double d = sg_ld(dy, i);
                a += d * sg_ld(x, i);
                sg_st(dx, i, d * sc);
            }
            sg_st(ds, n * C + c, a);
        }
}
