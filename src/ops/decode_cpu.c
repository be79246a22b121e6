/* decode_cpu.c: references of the decode ops (decode.h): the cache attention in double, the
 * positioned embedding, the last-row gather, and the sampler in the order the kernel decides
 * (its weights in f32 as the kernel forms them, summed in index order here). The oracle the
 * CUDA kernels are tested against, and the CPU backend's generation. */
#include "ops/act.h"
#include "ops/decode.h"

#include <math.h>
#include <stdlib.h>

void sg_kv_attention_cpu(const sg_tensor *qkv, int heads, const sg_tensor *start, sg_tensor *kcache,
                         sg_tensor *vcache, sg_tensor *out)
{
    const int64_t B = start->numel, Tq = qkv->shape[0] / B, C = out->shape[1], H = heads, hs = C / H;
    const int64_t Tc = kcache->shape[2];
    const int32_t *st = start->data;
    const double scale = 1.0 / sqrt((double)hs);
    double *s = malloc((size_t)Tc * sizeof *s), *acc = malloc((size_t)hs * sizeof *acc);
    SG_ASSERT(s && acc);
    /* Every row stores first, so that rows read the cache only below start (as the kernel). */
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Tq; i++) {
            int64_t p = (int64_t)st[b] + i, row = b * Tq + i;
            if (p < 0 || p >= Tc) continue;
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < hs; d++) {
                    int64_t c = ((b * H + h) * Tc + p) * hs + d;
                    sg_st(kcache, c, sg_ld(qkv, row * 3 * C + C + h * hs + d));
                    sg_st(vcache, c, sg_ld(qkv, row * 3 * C + 2 * C + h * hs + d));
                }
        }
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Tq; i++) {
            int64_t p = (int64_t)st[b] + i, row = b * Tq + i;
            for (int64_t h = 0; h < H; h++) {
                int64_t o = row * C + h * hs;
                if (p < 0 || p >= Tc) {
                    for (int64_t d = 0; d < hs; d++) sg_st(out, o + d, 0.0);
                    continue;
                }
                int64_t cb = (b * H + h) * Tc * hs, q = row * 3 * C + h * hs;
                double m = -INFINITY, sum = 0;
                for (int64_t t = 0; t <= p; t++) {
                    double dot = 0;
                    for (int64_t d = 0; d < hs; d++) dot += sg_ld(qkv, q + d) * sg_ld(kcache, cb + t * hs + d);
                    s[t] = dot * scale;
                    if (s[t] > m) m = s[t];
                }
                for (int64_t t = 0; t <= p; t++) sum += s[t] = exp(s[t] - m);
                for (int64_t d = 0; d < hs; d++) acc[d] = 0;
                for (int64_t t = 0; t <= p; t++)
                    for (int64_t d = 0; d < hs; d++) acc[d] += s[t] * sg_ld(vcache, cb + t * hs + d);
                for (int64_t d = 0; d < hs; d++) sg_st(out, o + d, acc[d] / sum);
            }
        }
    free(s), free(acc);
}

void sg_embed_at_cpu(const sg_tensor *tok, const sg_tensor *pos, const sg_tensor *wte, const sg_tensor *wpe,
                     sg_tensor *y)
{
    const int64_t B = tok->numel, C = y->shape[1];
    const int32_t *tk = tok->data, *ps = pos->data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++)
            sg_st(y, b * C + c, sg_ld(wte, (int64_t)tk[b] * C + c) + sg_ld(wpe, (int64_t)ps[b] * C + c));
}

void sg_gen_last_rows_cpu(const sg_tensor *x, const sg_tensor *info, sg_tensor *y)
{
    const int64_t B = y->shape[0], C = y->shape[1], Tp = x->shape[0] / B;
    const int32_t *in = info->data;
    for (int64_t b = 0; b < B; b++) {
        int64_t row = b * Tp + in[b * SG_GEN_INFO + SG_GEN_PLEN] - 1;
        for (int64_t c = 0; c < C; c++) sg_st(y, b * C + c, sg_ld(x, row * C + c));
    }
}

void sg_gen_begin_cpu(sg_tensor *tok, sg_tensor *pos, sg_tensor *info, sg_tensor *ctl)
{
    int32_t *in = info->data, *cl = ctl->data, *tk = tok->data, *ps = pos->data;
    for (int64_t b = 0; b < info->shape[0]; b++) {
        int32_t *r = in + b * SG_GEN_INFO;
        tk[b] = 0;
        ps[b] = r[SG_GEN_PLEN] - 1;
        r[SG_GEN_LEN] = 0;
        r[SG_GEN_DONE] = r[SG_GEN_MAXNEW] <= 0 ? SG_GEN_DONE_LENGTH : SG_GEN_RUNNING;
    }
    cl[SG_GEN_COUNT] = 0;
    cl[SG_GEN_GO] = 0;
}

/* The token drawn from one row of logits l (V), as decode.h says. w: V floats. */
static int32_t draw(const sg_tensor *logits, int64_t row, int64_t V, float temperature, int32_t topk, float u,
                    float *w)
{
    int64_t best = 0;
    float m = (float)sg_ld(logits, row * V);
    for (int64_t v = 1; v < V; v++) {
        float l = (float)sg_ld(logits, row * V + v);
        if (l > m) m = l, best = v;
    }
    if (temperature <= 0.f || topk == 1) return (int32_t)best;
    /* The k-th largest key: the largest threshold with at least k keys at or above it. */
    uint32_t thr = 0;
    if (topk > 0 && topk < V) {
        for (int bit = 31; bit >= 0; bit--) {
            uint32_t cand = thr | (1u << bit);
            int64_t n = 0;
            for (int64_t v = 0; v < V; v++) n += sg_gen_order_key((float)sg_ld(logits, row * V + v)) >= cand;
            if (n >= topk) thr = cand;
        }
    }
    float sum = 0.f;
    for (int64_t v = 0; v < V; v++) {
        float l = (float)sg_ld(logits, row * V + v);
        w[v] = sg_gen_order_key(l) >= thr ? expf((l - m) / temperature) : 0.f;
        sum += w[v];
    }
    float target = u * sum, run = 0.f;
    int64_t last = best;
    for (int64_t v = 0; v < V; v++) {
        if (w[v] <= 0.f) continue;
        run += w[v];
        last = v;
        if (run > target) return (int32_t)v;
    }
    return (int32_t)last; /* rounding left the target at the very end */
}

void sg_gen_sample_cpu(const sg_tensor *logits, sg_tensor *tok, sg_tensor *pos, sg_tensor *info,
                       sg_tensor *out, sg_tensor *ctl, float temperature, float *work)
{
    const int64_t B = logits->shape[0], V = logits->shape[1], N = out->shape[1];
    int32_t *tk = tok->data, *ps = pos->data, *in = info->data, *o = out->data, *cl = ctl->data;
    int go = 0;
    for (int64_t b = 0; b < B; b++) {
        int32_t *r = in + b * SG_GEN_INFO;
        if (r[SG_GEN_DONE] != SG_GEN_RUNNING) continue;
        float u = sg_gen_uniform((uint32_t)cl[SG_GEN_SEED_LO], (uint32_t)cl[SG_GEN_SEED_HI], (uint32_t)b,
                                 (uint32_t)r[SG_GEN_LEN]);
        int32_t t = draw(logits, b, V, temperature, cl[SG_GEN_TOPK], u, work);
        int32_t n = r[SG_GEN_LEN];
        if (n < N) o[b * N + n] = t;
        r[SG_GEN_LEN] = ++n;
        tk[b] = t;
        ps[b] = r[SG_GEN_PLEN] + n - 1;
        int ns = cl[SG_GEN_NSTOP], match = ns > 0 && n >= ns;
        for (int k = 0; match && k < ns; k++) match = o[b * N + n - ns + k] == cl[SG_GEN_STOP + k];
        r[SG_GEN_DONE] = n >= r[SG_GEN_MAXNEW] ? SG_GEN_DONE_LENGTH : match ? SG_GEN_DONE_STOP : SG_GEN_RUNNING;
        go |= r[SG_GEN_DONE] == SG_GEN_RUNNING;
    }
    cl[SG_GEN_GO] = go;
}

/* x rounded as a tensor of dtype dt stores it. */
static double round_as(sg_dtype dt, double v)
{
    if (dt == SG_DTYPE_F32) return (double)(float)v;
    if (dt == SG_DTYPE_BF16) return sg_bf16_to_double(sg_double_to_bf16(v));
    return v;
}

void sg_gen_row_linear_cpu(const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *beta, float eps,
                           const sg_tensor *w, const sg_tensor *b, sg_activation act, const sg_tensor *r,
                           sg_tensor *y, double *h)
{
    const int64_t N = w->shape[0], K = w->shape[1];
    for (int64_t k = 0; k < K; k++) h[k] = sg_ld(x, k);
    if (gamma) { /* as sg_layernorm_forward_cpu: the mean, then the variance about it */
        double m = 0, var = 0;
        for (int64_t k = 0; k < K; k++) m += h[k];
        m /= (double)K;
        for (int64_t k = 0; k < K; k++) var += (h[k] - m) * (h[k] - m);
        const double rs = 1.0 / sqrt(var / (double)K + (double)eps);
        for (int64_t k = 0; k < K; k++)
            h[k] = round_as(x->dtype, (h[k] - m) * rs * sg_ld(gamma, k) + sg_ld(beta, k));
    }
    for (int64_t n = 0; n < N; n++) {
        double v = b ? sg_ld(b, n) : 0.0;
        for (int64_t k = 0; k < K; k++) v += sg_ld(w, n * K + k) * h[k];
        if (act == SG_ACT_GELU)
            v = 0.5 * v * (1 + tanh(SG_GELU_K0 * (v + SG_GELU_K1 * v * v * v)));
        else if (act == SG_ACT_RELU)
            v = v > 0 ? v : 0.0;
        if (r) v += sg_ld(r, n); /* r may be y: element n is read before it is written */
        sg_st(y, n, v);
    }
}
