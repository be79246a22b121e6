/* attention_cpu.c: the reference causal self-attention, forward and backward, computed in
 * double for f32, f64 and bf16 tensors (bf16 read and rounded through sg_ld / sg_st). It is
 * the oracle the CUDA path is tested against and it trains small GPTs in CI, so loops run per
 * (batch, head, query row) with contiguous inner loops over the head's hs columns. Sums run in
 * a fixed order: results are deterministic. */
#include "ops/attention.h"

#include <math.h>
#include <stdlib.h>


static sg_status oom(sg_ctx *ctx, const char *fn)
{
    return sg_fail(ctx, SG_ERR_OOM, "%s: out of host memory for the CPU reference's buffers", fn);
}

static double dot(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* The row of query t of (b, h): p[s] = exp(score_s - max) for s <= t, with score_s = q_t . k_s
 * / sqrt(hs); *mx the max and *sum the sum of p. */
static void row_exp(const double *x, sg_attn_dims d, int64_t b, int64_t h, int64_t t, double *p, double *mx,
                    double *sum)
{
    const int64_t T = d.T, C = d.C, hs = d.hs, C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)hs), *q = x + (b * T + t) * C3 + h * hs;
    *mx = -INFINITY, *sum = 0;
    for (int64_t s = 0; s <= t; s++) {
        p[s] = scale * dot(q, x + (b * T + s) * C3 + C + h * hs, hs);
        *mx = p[s] > *mx ? p[s] : *mx;
    }
    for (int64_t s = 0; s <= t; s++) *sum += p[s] = exp(p[s] - *mx);
}

/* Per (b, h, t): p(T) = softmax over s <= t of q_t . k_s / sqrt(hs); out[b,t,h*hs:(h+1)*hs] =
 * sum_s p[s] v_s; and either the row p, zeros for s > t, into att[b,h,t,:] (lse NULL), or only
 * lse[b,h,t] = max + log(sum) (the fused form). */
static sg_status forward_rows(sg_ctx *ctx, const char *fn, const sg_tensor *qkv, sg_tensor *out, sg_tensor *att,
                              sg_tensor *lse, sg_attn_dims d)
{
    const int64_t T = d.T, C = d.C, H = d.H, hs = d.hs, C3 = 3 * C;
    double *qo = NULL;
    const double *x = sg_cpu_as_f64(qkv, &qo);
    double *p = malloc((size_t)T * sizeof *p), *acc = malloc((size_t)hs * sizeof *acc);
    sg_status st = SG_OK;
    if (!x || !p || !acc) {
        st = oom(ctx, fn);
        goto done;
    }
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                double mx, sum;
                row_exp(x, d, b, h, t, p, &mx, &sum);
                for (int64_t s = 0; s <= t; s++) p[s] /= sum;
                for (int64_t s = t + 1; s < T; s++) p[s] = 0;
                if (lse) {
                    const double l = mx + log(sum);
                    sg_cpu_store(lse, (b * H + h) * T + t, &l, 1);
                } else {
                    sg_cpu_store(att, ((b * H + h) * T + t) * T, p, T);
                }
                for (int64_t i = 0; i < hs; i++) acc[i] = 0;
                for (int64_t s = 0; s <= t; s++) {
                    const double a = p[s], *restrict v = x + (b * T + s) * C3 + 2 * C + h * hs;
                    double *restrict o = acc;
                    for (int64_t i = 0; i < hs; i++) o[i] += a * v[i];
                }
                sg_cpu_store(out, (b * T + t) * C + h * hs, acc, hs);
            }
done:
    free(qo);
    free(p);
    free(acc);
    return st;
}

sg_status sg_attention_forward_cpu(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                   sg_tensor *att, sg_attn_dims d)
{
    return forward_rows(ctx, "sg_attention_forward", qkv, out, att, NULL, d);
}

/* With p = att[b,h,t,:] (the forward's, as saved) and g = dout[b,t,h-th head]:
 *   dv_s += p[s] g;  dp[s] = g . v_s;  dpre[s] = p[s] (dp[s] - sum_r p[r] dp[r]) / sqrt(hs);
 *   dq_t += dpre[s] k_s;  dk_s += dpre[s] q_t   (s <= t; the mask passes no gradient).
 * Accumulated in a double copy of dqkv, stored once. */
sg_status sg_attention_backward_cpu(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *att,
                                    const sg_tensor *dout, sg_tensor *dqkv, sg_attn_dims d)
{
    const int64_t T = d.T, C = d.C, H = d.H, hs = d.hs, C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    double *xo = NULL, *ao = NULL, *go = NULL;
    const double *x = sg_cpu_as_f64(qkv, &xo), *pa = sg_cpu_as_f64(att, &ao), *ga = sg_cpu_as_f64(dout, &go);
    double *dx = calloc((size_t)dqkv->numel, sizeof *dx), *dp = malloc((size_t)T * sizeof *dp);
    sg_status st = SG_OK;
    if (!x || !pa || !ga || !dx || !dp) {
        st = oom(ctx, "sg_attention_backward");
        goto done;
    }
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                const double *p = pa + ((b * H + h) * T + t) * T;
                const double *g = ga + (b * T + t) * C + h * hs;
                const double *q = x + (b * T + t) * C3 + h * hs;
                double *dq = dx + (b * T + t) * C3 + h * hs;
                double sum = 0;
                for (int64_t s = 0; s <= t; s++) {
                    const int64_t row = (b * T + s) * C3 + h * hs;
                    double *restrict dv = dx + row + 2 * C;
                    dp[s] = dot(g, x + row + 2 * C, hs);
                    sum += p[s] * dp[s];
                    for (int64_t i = 0; i < hs; i++) dv[i] += p[s] * g[i];
                }
                for (int64_t s = 0; s <= t; s++) {
                    const int64_t row = (b * T + s) * C3 + h * hs;
                    const double dpre = scale * p[s] * (dp[s] - sum);
                    const double *restrict k = x + row + C;
                    double *restrict dk = dx + row + C;
                    for (int64_t i = 0; i < hs; i++) {
                        dq[i] += dpre * k[i];
                        dk[i] += dpre * q[i];
                    }
                }
            }
    sg_cpu_store(dqkv, 0, dx, dqkv->numel);
done:
    free(xo);
    free(ao);
    free(go);
    free(dx);
    free(dp);
    return st;
}

/* ---- the fused form: lse instead of the probabilities ---- */

/* As sg_attention_forward_cpu, keeping per (b, h, t) only lse = m + log(sum_s exp(s_s - m)) of
 * the scaled scores (F32, (B, H, T)) instead of the row of probabilities. */
sg_status sg_attention_fused_forward_cpu(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                         sg_tensor *lse, sg_attn_dims d)
{
    return forward_rows(ctx, "sg_attention_fused_forward", qkv, out, NULL, lse, d);
}

/* The gradient the fused kernels compute, from the saved out and lse: p[s] = exp(score_s -
 * lse), delta = g . out_t (the out saved, as rounded), dpre[s] = p[s] (g . v_s - delta) /
 * sqrt(hs); dq, dk, dv as in sg_attention_backward_cpu. delta is written to `delta` (B, H, T)
 * F32, as the CUDA path leaves it. */
sg_status sg_attention_fused_backward_cpu(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out,
                                          const sg_tensor *lse, const sg_tensor *dout, sg_tensor *dqkv,
                                          sg_tensor *delta, sg_attn_dims d)
{
    const int64_t T = d.T, C = d.C, H = d.H, hs = d.hs, C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    double *xo = NULL, *oo = NULL, *lo = NULL, *go = NULL;
    const double *x = sg_cpu_as_f64(qkv, &xo), *ya = sg_cpu_as_f64(out, &oo), *la = sg_cpu_as_f64(lse, &lo),
                 *ga = sg_cpu_as_f64(dout, &go);
    double *dx = calloc((size_t)dqkv->numel, sizeof *dx);
    sg_status st = SG_OK;
    if (!x || !ya || !la || !ga || !dx) {
        st = oom(ctx, "sg_attention_fused_backward");
        goto done;
    }
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                const double *g = ga + (b * T + t) * C + h * hs, *q = x + (b * T + t) * C3 + h * hs;
                const double l = la[(b * H + h) * T + t], dl = dot(g, ya + (b * T + t) * C + h * hs, hs);
                sg_cpu_store(delta, (b * H + h) * T + t, &dl, 1);
                double *dq = dx + (b * T + t) * C3 + h * hs;
                for (int64_t s = 0; s <= t; s++) {
                    const int64_t row = (b * T + s) * C3 + h * hs;
                    const double *restrict k = x + row + C, *restrict v = x + row + 2 * C;
                    double *restrict dk = dx + row + C, *restrict dv = dx + row + 2 * C;
                    const double p = exp(scale * dot(q, k, hs) - l), dpre = scale * p * (dot(g, v, hs) - dl);
                    for (int64_t i = 0; i < hs; i++) {
                        dv[i] += p * g[i];
                        dq[i] += dpre * k[i];
                        dk[i] += dpre * q[i];
                    }
                }
            }
    sg_cpu_store(dqkv, 0, dx, dqkv->numel);
done:
    free(xo);
    free(oo);
    free(lo);
    free(go);
    free(dx);
    return st;
}

void sg_attention_col_sums_cpu(const sg_tensor *dqkv, sg_tensor *dbias)
{
    const int64_t cols = dbias->numel, rows = dqkv->numel / cols;
    for (int64_t c = 0; c < cols; c++) {
        double v = 0;
        for (int64_t r = 0; r < rows; r++) v += sg_ld(dqkv, r * cols + c);
        sg_st(dbias, c, v);
    }
}
