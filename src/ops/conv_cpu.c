/* conv_cpu.c: the reference 2-D convolution, channels last, forward and backward, computed in
 * double for f32, bf16 and f64 tensors (read exactly; each output rounded once to its dtype).
 * It is the oracle cuDNN is tested against and trains small vision models in CI, so the loops
 * keep a contiguous innermost loop over channels on double copies of the operands. Every sum
 * runs in a fixed order. Each output is a gather (dx from the dy it feeds, not a scatter), so
 * it is written once, never accumulated into.
 * Shapes: x, dx (N, H, W, Cin); w, dw (Cout, KH, KW, Cg), Cg = Cin/groups; b, db (Cout);
 * y, dy (N, OH, OW, Cout). Output channel co belongs to group co / (Cout/groups), which reads
 * input channels [g Cg, (g+1) Cg). */
#include "ops/conv.h"

#include <stdlib.h>

/* The plan's sizes, unpacked once. */
typedef struct dims {
    int64_t N, H, W, Cin, Cout, KH, KW, Cg, Coutg, OH, OW;
    int64_t sh, sw, ph, pw, dh, dw;
} dims;

static dims dims_of(const sg_conv2d *c)
{
    dims d = {.N = c->x_shape[0], .H = c->x_shape[1], .W = c->x_shape[2], .Cin = c->x_shape[3],
              .Cout = c->w_shape[0], .KH = c->w_shape[1], .KW = c->w_shape[2],
              .Cg = c->w_shape[3], .OH = c->y_shape[1], .OW = c->y_shape[2],
              .sh = c->p.stride_h, .sw = c->p.stride_w, .ph = c->p.pad_h, .pw = c->p.pad_w,
              .dh = c->p.dil_h, .dw = c->p.dil_w};
    d.Coutg = d.Cout / c->p.groups;
    return d;
}

static sg_status oom(sg_ctx *ctx, const char *fn)
{
    return sg_fail(ctx, SG_ERR_OOM, "%s: out of host memory for the CPU reference's buffers", fn);
}

static double dot(const double *restrict a, const double *restrict b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y[n, oh, ow, co] = b[co] + sum over (kh, kw, ci) of x[n, ih, iw, g Cg + ci] w[co, kh, kw, ci],
 * ih = oh sh - ph + kh dh (iw likewise); taps that land in the padding read 0. */
sg_status sg_conv2d_forward_cpu(sg_ctx *ctx, const sg_conv2d *c, const sg_tensor *x,
                                const sg_tensor *w, const sg_tensor *b, sg_tensor *y)
{
    const dims d = dims_of(c);
    double *xo = NULL, *wo = NULL, *bo = NULL;
    const double *xd = sg_cpu_as_f64(x, &xo), *wd = sg_cpu_as_f64(w, &wo);
    const double *bd = b ? sg_cpu_as_f64(b, &bo) : NULL;
    double *acc = malloc((size_t)d.Cout * sizeof *acc);
    sg_status st = SG_OK;
    if (!xd || !wd || (b && !bd) || !acc) {
        st = oom(ctx, "sg_conv2d_forward");
        goto done;
    }
    for (int64_t n = 0; n < d.N; n++)
        for (int64_t oh = 0; oh < d.OH; oh++)
            for (int64_t ow = 0; ow < d.OW; ow++) {
                for (int64_t co = 0; co < d.Cout; co++) acc[co] = bd ? bd[co] : 0.0;
                for (int64_t kh = 0; kh < d.KH; kh++) {
                    const int64_t ih = oh * d.sh - d.ph + kh * d.dh;
                    if (ih < 0 || ih >= d.H) continue;
                    for (int64_t kw = 0; kw < d.KW; kw++) {
                        const int64_t iw = ow * d.sw - d.pw + kw * d.dw;
                        if (iw < 0 || iw >= d.W) continue;
                        const double *xp = xd + ((n * d.H + ih) * d.W + iw) * d.Cin;
                        for (int64_t co = 0; co < d.Cout; co++) {
                            const double *wp = wd + ((co * d.KH + kh) * d.KW + kw) * d.Cg;
                            acc[co] += dot(xp + (co / d.Coutg) * d.Cg, wp, d.Cg);
                        }
                    }
                }
                sg_cpu_store(y, ((n * d.OH + oh) * d.OW + ow) * d.Cout, acc, d.Cout);
            }
done:
    free(xo), free(wo), free(bo), free(acc);
    return st;
}

/* dx[n, ih, iw, g Cg + ci] = sum over the (kh, kw) whose output position (oh, ow) exists,
 * oh = (ih + ph - kh dh) / sh when that divides exactly, and over co of group g, of
 * dy[n, oh, ow, co] w[co, kh, kw, ci]; acc holds one position's Cin sums. */
static void backward_data(const dims *d, const double *dyd, const double *wd, double *acc,
                          sg_tensor *dx)
{
    for (int64_t n = 0; n < d->N; n++)
        for (int64_t ih = 0; ih < d->H; ih++)
            for (int64_t iw = 0; iw < d->W; iw++) {
                double *a = acc;
                for (int64_t ci = 0; ci < d->Cin; ci++) a[ci] = 0;
                for (int64_t kh = 0; kh < d->KH; kh++) {
                    const int64_t th = ih + d->ph - kh * d->dh;
                    if (th < 0 || th % d->sh) continue;
                    const int64_t oh = th / d->sh;
                    if (oh >= d->OH) continue;
                    for (int64_t kw = 0; kw < d->KW; kw++) {
                        const int64_t tw = iw + d->pw - kw * d->dw;
                        if (tw < 0 || tw % d->sw) continue;
                        const int64_t ow = tw / d->sw;
                        if (ow >= d->OW) continue;
                        const double *g = dyd + ((n * d->OH + oh) * d->OW + ow) * d->Cout;
                        for (int64_t co = 0; co < d->Cout; co++) {
                            const double gv = g[co];
                            const double *restrict wp =
                                wd + ((co * d->KH + kh) * d->KW + kw) * d->Cg;
                            double *restrict ap = a + (co / d->Coutg) * d->Cg;
                            for (int64_t ci = 0; ci < d->Cg; ci++) ap[ci] += gv * wp[ci];
                        }
                    }
                }
                sg_cpu_store(dx, ((n * d->H + ih) * d->W + iw) * d->Cin, a, d->Cin);
            }
}

/* dw[co, kh, kw, ci] = sum over (n, oh, ow) of dy[n, oh, ow, co] x[n, ih, iw, g Cg + ci], and
 * db[co] = sum of dy[., ., ., co]: both accumulated in double over the output positions in
 * row-major order (acc holds all of dw), then stored once. */
static void backward_filter(const dims *d, const double *xd, const double *dyd, double *acc,
                            double *bacc, sg_tensor *dw, sg_tensor *db)
{
    const int64_t nw = d->Cout * d->KH * d->KW * d->Cg;
    for (int64_t i = 0; i < nw; i++) acc[i] = 0;
    for (int64_t co = 0; co < d->Cout; co++) bacc[co] = 0;
    for (int64_t n = 0; n < d->N; n++)
        for (int64_t oh = 0; oh < d->OH; oh++)
            for (int64_t ow = 0; ow < d->OW; ow++) {
                const double *g = dyd + ((n * d->OH + oh) * d->OW + ow) * d->Cout;
                for (int64_t co = 0; co < d->Cout; co++) bacc[co] += g[co];
                for (int64_t kh = 0; kh < d->KH; kh++) {
                    const int64_t ih = oh * d->sh - d->ph + kh * d->dh;
                    if (ih < 0 || ih >= d->H) continue;
                    for (int64_t kw = 0; kw < d->KW; kw++) {
                        const int64_t iw = ow * d->sw - d->pw + kw * d->dw;
                        if (iw < 0 || iw >= d->W) continue;
                        const double *xp = xd + ((n * d->H + ih) * d->W + iw) * d->Cin;
                        for (int64_t co = 0; co < d->Cout; co++) {
                            const double gv = g[co];
                            const double *restrict xg = xp + (co / d->Coutg) * d->Cg;
                            double *restrict ap = acc + ((co * d->KH + kh) * d->KW + kw) * d->Cg;
                            for (int64_t ci = 0; ci < d->Cg; ci++) ap[ci] += gv * xg[ci];
                        }
                    }
                }
            }
    sg_cpu_store(dw, 0, acc, nw);
    if (db) sg_cpu_store(db, 0, bacc, d->Cout);
}

sg_status sg_conv2d_backward_cpu(sg_ctx *ctx, const sg_conv2d *c, const sg_tensor *x,
                                 const sg_tensor *w, const sg_tensor *dy, sg_tensor *dx,
                                 sg_tensor *dw, sg_tensor *db)
{
    const dims d = dims_of(c);
    const int64_t nw = d.Cout * d.KH * d.KW * d.Cg;
    double *xo = NULL, *wo = NULL, *go = NULL;
    const double *xd = sg_cpu_as_f64(x, &xo), *dyd = sg_cpu_as_f64(dy, &go);
    const double *wd = dx ? sg_cpu_as_f64(w, &wo) : NULL;
    /* One buffer: dw's sums (nw), db's (Cout), then dx's for one position (Cin). */
    double *acc = malloc((size_t)(nw + d.Cout + d.Cin) * sizeof *acc);
    sg_status st = SG_OK;
    if (!xd || !dyd || (dx && !wd) || !acc) {
        st = oom(ctx, "sg_conv2d_backward");
        goto done;
    }
    if (dx) backward_data(&d, dyd, wd, acc + nw + d.Cout, dx);
    backward_filter(&d, xd, dyd, acc, acc + nw, dw, db);
done:
    free(xo), free(wo), free(go), free(acc);
    return st;
}
