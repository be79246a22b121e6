/* test_decode.c: the decode ops (ops/decode.h), inference only (no backward: nothing here is
 * differentiated; the training attention they mirror has its own gradient checks). `cpu`: the
 * references against independent computations written here; `gpu`: the CUDA kernels against
 * the CPU references on the same fresh inputs, outputs poisoned first. f32 and bf16.
 *   - sg_kv_attention as a prefill (start 0) equals the training attention (sg_attention_forward)
 *     and stores every k and v bit for bit; as decode steps (Tq 1 and 3, random starts, one
 *     sequence past the cache) it equals a direct softmax over the cache (cpu) or the reference
 *     (gpu), stores exactly its rows, zeroes rows past the cache and leaves other positions be;
 *     shapes: T not a multiple of anything, T = 1, heads 1, 2 and 12.
 *   - sg_embed_at, sg_gen_last_rows: against direct sums / copies.
 *   - sg_gen_sample: greedy picks the largest logit (the lowest index of a planted tie); a sampled
 *     token lies where u * sum falls in the running sum of weights (within the sum's rounding);
 *     top-k keeps only the k largest; the state (tok, pos, LEN, out, DONE, GO) as the rule says
 *     for running, finished, length-limited and stop-sequence cases; the empirical frequencies
 *     of 4096 draws match softmax within 5 standard deviations.
 *   - sg_gen_row_linear (one row, LayerNorm before and residual after fused): against a direct
 *     computation in double within a derived bound (see row_linear_case), at the gpt-768
 *     decode step's four shapes and odd ones (N not a multiple of 8, K not of the vector width,
 *     no bias, ReLU, GELU, r apart and in place); on the GPU the reference too;
 *   - refusals naming the argument, the context usable after. */
#include "testutil.h"

#include "ops/decode.h"

static sg_ctx *dev, *ref; /* dev: the backend under test; ref: the CPU (== dev in cpu mode) */
static bool gpu;

static tu_tol tol_of(sg_dtype dt) { return tu_tol_for(dt); }

/* A tensor on dev with fresh uniform values, and its twin on ref (the same values). */
static sg_tensor *fresh(sg_dtype dt, int nd, const int64_t *shape, const char *name, sg_tensor **twin)
{
    sg_tensor *t = tu_tensor(dev, dt, nd, shape, name);
    free(tu_random(t, -1, 1));
    *twin = gpu ? tu_clone_to(ref, t, dt) : t;
    return t;
}

static void drop2(sg_tensor *a, sg_tensor *b)
{
    if (b != a) sg_tensor_destroy(b);
    sg_tensor_destroy(a);
}

static sg_tensor *ints(sg_ctx *ctx, int64_t n, const int32_t *v, const char *name)
{
    sg_tensor *t = tu_tensor1(ctx, SG_DTYPE_I32, n, name);
    TU_OK(ctx, sg_tensor_copy_from_host(t, v, (size_t)n * sizeof *v));
    return t;
}

static int32_t *get_ints(const sg_tensor *t)
{
    int32_t *v = malloc((size_t)t->numel * sizeof *v);
    TU_OK(t->ctx, sg_tensor_copy_to_host(t, v, (size_t)t->numel * sizeof *v));
    return v;
}

/* ---- the cache attention ---- */

/* Prefill: start 0, Tq = T; out against sg_attention_forward on the same backend, the caches'
 * first T positions bit-equal to k and v. */
static void prefill_case(sg_dtype dt, int64_t B, int64_t T, int64_t C, int H)
{
    const int64_t hs = C / H, Tc = T + 3;
    sg_tensor *qkv_r, *unused;
    sg_tensor *qkv = fresh(dt, 2, (int64_t[]){B * T, 3 * C}, "qkv", &qkv_r);
    (void)qkv_r;
    sg_tensor *kc = fresh(dt, 4, (int64_t[]){B + 1, H, Tc, hs}, "kcache", &unused);
    if (unused != kc) sg_tensor_destroy(unused);
    sg_tensor *vc = fresh(dt, 4, (int64_t[]){B + 1, H, Tc, hs}, "vcache", &unused);
    if (unused != vc) sg_tensor_destroy(unused);
    sg_tensor *out = tu_tensor2(dev, dt, B * T, C, "out"), *out2 = tu_tensor2(dev, dt, B * T, C, "out2");
    sg_tensor *att = tu_tensor(dev, dt, 4, (int64_t[]){B, H, T, T}, "att");
    sg_tensor *work = tu_tensor1(dev, SG_DTYPE_F32, sg_attention_work_elems(B, T, C, H), "work");
    int32_t z[8] = {0};
    sg_tensor *start = ints(dev, B, z, "start");
    tu_poison(out), tu_poison(out2);
    TU_OK(dev, sg_kv_attention(dev, qkv, H, start, kc, vc, out));
    TU_OK(dev, sg_attention_forward(dev, qkv, H, out2, att, work));
    char w[96];
    snprintf(w, sizeof w, "kv prefill %s B%lld T%lld C%lld H%d", sg_dtype_name(dt), (long long)B, (long long)T,
             (long long)C, H);
    /* The training attention rounds its probabilities to bf16 before P v (attention.h); this op
     * keeps them f32: one more bf16 rounding apart, within the dtype's tolerance. */
    tu_close_tensors(w, out, out2, tol_of(dt));
    double *q = tu_get(qkv), *k = tu_get(kc), *v = tu_get(vc);
    int64_t bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < hs; d++) {
                    int64_t c = ((b * H + h) * Tc + t) * hs + d, r = (b * T + t) * 3 * C + h * hs + d;
                    bad += k[c] != q[r + C] || v[c] != q[r + 2 * C];
                }
    TU_CHECK(bad == 0, "%s: %lld cache elements differ from k, v", w, (long long)bad);
    free(q), free(k), free(v);
    sg_tensor *ts[] = {qkv, kc, vc, out, out2, att, work, start};
    tu_destroy_all(ts, 8);
}

/* Decode: caches of random contents, Tq new rows per sequence at random starts (the last
 * sequence's start past the cache). cpu: against a direct computation; gpu: against the
 * reference on the same inputs. */
static void decode_case(sg_dtype dt, int64_t B, int64_t Tq, int64_t C, int H, int64_t Tc)
{
    const int64_t hs = C / H;
    sg_tensor *qkv_r, *kc_r, *vc_r;
    sg_tensor *qkv = fresh(dt, 2, (int64_t[]){B * Tq, 3 * C}, "qkv", &qkv_r);
    sg_tensor *kc = fresh(dt, 4, (int64_t[]){B, H, Tc, hs}, "kcache", &kc_r);
    sg_tensor *vc = fresh(dt, 4, (int64_t[]){B, H, Tc, hs}, "vcache", &vc_r);
    int32_t st[8];
    for (int64_t b = 0; b < B; b++) st[b] = tu_randint(0, (int)(Tc - Tq));
    st[B - 1] = (int32_t)(Tc - Tq + 1 + tu_randint(0, 2)); /* its last rows fall past the cache */
    sg_tensor *start = ints(dev, B, st, "start"), *start_r = gpu ? ints(ref, B, st, "start") : start;
    double *k0 = tu_get(kc), *v0 = tu_get(vc), *q = tu_get(qkv);
    sg_tensor *out = tu_tensor2(dev, dt, B * Tq, C, "out");
    tu_poison(out);
    TU_OK(dev, sg_kv_attention(dev, qkv, H, start, kc, vc, out));
    char w[96];
    snprintf(w, sizeof w, "kv decode %s B%lld Tq%lld C%lld H%d Tc%lld", sg_dtype_name(dt), (long long)B,
             (long long)Tq, (long long)C, H, (long long)Tc);
    double *o = tu_get(out), *k = tu_get(kc), *v = tu_get(vc);
    double *want = malloc((size_t)(B * Tq * C) * sizeof *want);
    /* The expected cache: the old one with each in-range row's k, v stored. */
    double *k1 = malloc((size_t)kc->numel * sizeof *k1), *v1 = malloc((size_t)kc->numel * sizeof *v1);
    memcpy(k1, k0, (size_t)kc->numel * sizeof *k1), memcpy(v1, v0, (size_t)kc->numel * sizeof *v1);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Tq; i++) {
            int64_t p = st[b] + i, row = b * Tq + i;
            if (p >= Tc) continue;
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < hs; d++) {
                    int64_t c = ((b * H + h) * Tc + p) * hs + d;
                    k1[c] = q[row * 3 * C + C + h * hs + d], v1[c] = q[row * 3 * C + 2 * C + h * hs + d];
                }
        }
    int64_t bad = 0;
    for (int64_t i = 0; i < kc->numel; i++) bad += k[i] != k1[i] || v[i] != v1[i];
    TU_CHECK(bad == 0, "%s: %lld cache elements are not the old cache with the new rows stored", w, (long long)bad);
    if (!gpu) { /* direct: softmax over positions 0..p of the expected cache, in double */
        double s[512];
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < Tq; i++)
                for (int64_t h = 0; h < H; h++) {
                    int64_t p = st[b] + i, row = b * Tq + i, cb = (b * H + h) * Tc * hs;
                    double *y = want + row * C + h * hs, m = -INFINITY, sum = 0;
                    for (int64_t d = 0; d < hs; d++) y[d] = 0;
                    if (p >= Tc) continue;
                    for (int64_t t = 0; t <= p; t++) {
                        double dot = 0;
                        for (int64_t d = 0; d < hs; d++) dot += q[row * 3 * C + h * hs + d] * k1[cb + t * hs + d];
                        s[t] = dot / sqrt((double)hs), m = fmax(m, s[t]);
                    }
                    for (int64_t t = 0; t <= p; t++) sum += s[t] = exp(s[t] - m);
                    for (int64_t t = 0; t <= p; t++)
                        for (int64_t d = 0; d < hs; d++) y[d] += s[t] / sum * v1[cb + t * hs + d];
                }
    } else { /* the reference on the old cache */
        sg_tensor *out_r = tu_tensor2(ref, dt, B * Tq, C, "out_r");
        TU_OK(ref, sg_kv_attention(ref, qkv_r, H, start_r, kc_r, vc_r, out_r));
        double *r = tu_get(out_r);
        memcpy(want, r, (size_t)(B * Tq * C) * sizeof *want);
        free(r);
        sg_tensor_destroy(out_r);
    }
    /* Rows past the cache are exactly zero; the others within the dtype's tolerance. */
    for (int64_t i = (B - 1) * Tq; i < B * Tq; i++)
        if (st[B - 1] + i - (B - 1) * Tq >= Tc)
            for (int64_t c = 0; c < C; c++)
                TU_CHECK(o[i * C + c] == 0, "%s: row %lld past the cache holds %g, expected 0", w, (long long)i,
                         o[i * C + c]);
    tu_close(w, o, want, B * Tq * C, tol_of(dt));
    free(o), free(k), free(v), free(k0), free(v0), free(q), free(want), free(k1), free(v1);
    drop2(qkv, qkv_r), drop2(kc, kc_r), drop2(vc, vc_r), drop2(start, start_r);
    sg_tensor_destroy(out);
}

/* ---- embedding at positions, last rows ---- */

static void embed_case(sg_dtype dt)
{
    const int64_t B = 5, V = 40, T = 17, C = 96;
    sg_tensor *wte_r, *wpe_r, *x_r;
    sg_tensor *wte = fresh(dt, 2, (int64_t[]){V, C}, "wte", &wte_r), *wpe = fresh(dt, 2, (int64_t[]){T, C}, "wpe", &wpe_r);
    int32_t tk[5], ps[5], info[5 * SG_GEN_INFO] = {0};
    for (int b = 0; b < B; b++) tk[b] = tu_randint(0, V - 1), ps[b] = tu_randint(0, T - 1);
    sg_tensor *tok = ints(dev, B, tk, "tok"), *pos = ints(dev, B, ps, "pos");
    sg_tensor *y = tu_tensor2(dev, dt, B, C, "y");
    tu_poison(y);
    TU_OK(dev, sg_embed_at(dev, tok, pos, wte, wpe, y));
    double *e = tu_get(wte), *p = tu_get(wpe), *g = tu_get(y), want[5 * 96];
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            sg_tensor one = {0};
            one.dtype = dt; /* the sum rounded once to the dtype */
            uint32_t buf[2];
            one.data = buf;
            sg_st(&one, 0, e[tk[b] * C + c] + p[ps[b] * C + c]);
            want[b * C + c] = sg_ld(&one, 0);
        }
    tu_close("embed_at", g, want, B * C, (tu_tol){0, 0});
    /* Last rows: x (B*Tp, C), each prompt's last row. */
    const int64_t Tp = 6;
    sg_tensor *x = fresh(dt, 2, (int64_t[]){B * Tp, C}, "x", &x_r);
    for (int b = 0; b < B; b++) info[b * SG_GEN_INFO + SG_GEN_PLEN] = tu_randint(1, (int)Tp);
    sg_tensor *in = tu_tensor2(dev, SG_DTYPE_I32, B, SG_GEN_INFO, "info");
    TU_OK(dev, sg_tensor_copy_from_host(in, info, sizeof info));
    tu_poison(y);
    TU_OK(dev, sg_gen_last_rows(dev, x, in, y));
    double *xv = tu_get(x), *gl = tu_get(y);
    int64_t bad = 0;
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) bad += gl[b * C + c] != xv[(b * Tp + info[b * SG_GEN_INFO] - 1) * C + c];
    TU_CHECK(bad == 0, "last_rows %s: %lld elements differ", sg_dtype_name(dt), (long long)bad);
    free(e), free(p), free(g), free(xv), free(gl);
    drop2(wte, wte_r), drop2(wpe, wpe_r), drop2(x, x_r);
    sg_tensor *ts[] = {tok, pos, y, in};
    tu_destroy_all(ts, 4);
}

/* ---- the sampler ---- */

typedef struct samp {
    sg_tensor *logits, *tok, *pos, *info, *out, *ctl, *temp;
} samp;

static samp samp_make(sg_dtype dt, int64_t B, int64_t V, int64_t N)
{
    samp s;
    s.logits = tu_tensor2(dev, dt, B, V, "logits");
    s.tok = tu_tensor1(dev, SG_DTYPE_I32, B, "tok"), s.pos = tu_tensor1(dev, SG_DTYPE_I32, B, "pos");
    s.info = tu_tensor2(dev, SG_DTYPE_I32, B, SG_GEN_INFO, "info"), s.out = tu_tensor2(dev, SG_DTYPE_I32, B, N, "out");
    s.ctl = tu_tensor1(dev, SG_DTYPE_I32, SG_GEN_CTL, "ctl"), s.temp = tu_tensor1(dev, SG_DTYPE_F32, 1, "temp");
    return s;
}

static void samp_drop(samp *s)
{
    sg_tensor *ts[] = {s->logits, s->tok, s->pos, s->info, s->out, s->ctl, s->temp};
    tu_destroy_all(ts, 7);
}

/* Sets the state, runs the sampler; returns the tokens drawn (tok) and leaves the state. */
static void samp_run(samp *s, const double *logits, const int32_t *info, const int32_t *out, const int32_t *ctl,
                     float temp)
{
    tu_set(s->logits, logits);
    TU_OK(dev, sg_tensor_copy_from_host(s->info, info, (size_t)s->info->numel * 4));
    TU_OK(dev, sg_tensor_copy_from_host(s->out, out, (size_t)s->out->numel * 4));
    TU_OK(dev, sg_tensor_copy_from_host(s->ctl, ctl, SG_GEN_CTL * 4));
    TU_OK(dev, sg_tensor_copy_from_host(s->temp, &temp, 4));
    tu_poison(s->tok), tu_poison(s->pos);
    TU_OK(dev, sg_gen_sample(dev, s->logits, s->tok, s->pos, s->info, s->out, s->ctl, s->temp));
}

/* Where u * sum lands in the running sum of weights exp((l - max) / temp) over the kept tokens:
 * whether token t is a valid draw, allowing the f32 sum's rounding (V * 2^-23 of the sum). */
static bool valid_draw(const double *l, int V, double temp, int topk, double u, int t)
{
    double m = -INFINITY, kth = -INFINITY;
    for (int v = 0; v < V; v++) m = fmax(m, l[v]);
    if (topk > 0 && topk < V) { /* the k-th largest value */
        double *c = malloc((size_t)V * sizeof *c);
        memcpy(c, l, (size_t)V * sizeof *c);
        for (int i = 0; i < topk; i++) {
            int b = i;
            for (int j = i + 1; j < V; j++)
                if (c[j] > c[b]) b = j;
            double x = c[i];
            c[i] = c[b], c[b] = x;
        }
        kth = c[topk - 1];
        free(c);
    }
    double sum = 0, before = 0, wt = 0;
    for (int v = 0; v < V; v++) {
        double wv = l[v] >= kth ? exp((l[v] - m) / temp) : 0;
        if (v < t) before += wv;
        if (v == t) wt = wv;
        sum += wv;
    }
    double slack = V * 0x1p-23 * sum + 1e-12, target = u * sum;
    return wt > 0 && before <= target + slack && before + wt >= target - slack;
}

static void sample_cases(sg_dtype dt)
{
    const int64_t B = 6, V = 300, N = 10;
    samp s = samp_make(dt, B, V, N);
    double *l = malloc((size_t)(B * V) * sizeof *l);
    for (int64_t i = 0; i < B * V; i++) l[i] = tu_uniform(-3, 3);
    /* Round the logits to the dtype first, so the host reasons on what the kernel reads. */
    sg_tensor *lr = tu_tensor2(ref, dt, B, V, "l");
    tu_set(lr, l);
    free(l);
    l = tu_get(lr);
    sg_tensor_destroy(lr);
    int32_t info[6 * SG_GEN_INFO], out[6 * 10], ctl[SG_GEN_CTL] = {0};
    uint64_t seed = tu_next();
    ctl[SG_GEN_SEED_LO] = (int32_t)(uint32_t)seed, ctl[SG_GEN_SEED_HI] = (int32_t)(uint32_t)(seed >> 32);
    for (int k = 0; k < B * N; k++) out[k] = tu_randint(0, (int)V - 2); /* V - 1: only row 4's */
    for (int b = 0; b < B; b++) {
        int32_t *r = info + b * SG_GEN_INFO;
        r[SG_GEN_PLEN] = tu_randint(1, 5), r[SG_GEN_LEN] = tu_randint(0, 6), r[SG_GEN_MAXNEW] = 9;
        r[SG_GEN_DONE] = SG_GEN_RUNNING;
    }
    /* Greedy with a planted tie at the top in row 0: the lower index wins. */
    l[17] = l[203] = 5.0;
    info[2 * SG_GEN_INFO + SG_GEN_DONE] = SG_GEN_DONE_STOP;                   /* row 2 finished */
    info[3 * SG_GEN_INFO + SG_GEN_MAXNEW] = info[3 * SG_GEN_INFO + SG_GEN_LEN] + 1; /* row 3 ends by length */
    /* Row 4: the stop sequence {a, argmax} completes with this token. */
    int am4 = 0;
    for (int v = 1; v < V; v++)
        if (l[4 * V + v] > l[4 * V + am4]) am4 = v;
    int len4 = info[4 * SG_GEN_INFO + SG_GEN_LEN];
    if (len4 == 0) info[4 * SG_GEN_INFO + SG_GEN_LEN] = len4 = 1;
    out[4 * N + len4 - 1] = (int32_t)V - 1;
    ctl[SG_GEN_NSTOP] = 2, ctl[SG_GEN_STOP] = (int32_t)V - 1, ctl[SG_GEN_STOP + 1] = am4;
    samp_run(&s, l, info, out, ctl, 0.f);
    int32_t *tk = get_ints(s.tok), *ps = get_ints(s.pos), *in = get_ints(s.info), *o = get_ints(s.out), *c = get_ints(s.ctl);
    for (int b = 0; b < B; b++) {
        const int32_t *r0 = info + b * SG_GEN_INFO, *r1 = in + b * SG_GEN_INFO;
        if (b == 2) {
            TU_CHECK(!memcmp(r0, r1, sizeof(int32_t) * SG_GEN_INFO) && !memcmp(o + b * N, out + b * N, 4 * N),
                     "sample: a finished sequence was changed");
            continue;
        }
        int am = 0;
        for (int v = 1; v < V; v++)
            if (l[b * V + v] > l[b * V + am]) am = v;
        int n = r0[SG_GEN_LEN] + 1;
        TU_CHECK(tk[b] == am && o[b * N + n - 1] == am, "greedy %s row %d: token %d, out %d; expected argmax %d",
                 sg_dtype_name(dt), b, tk[b], o[b * N + n - 1], am);
        TU_CHECK(r1[SG_GEN_LEN] == n && ps[b] == r0[SG_GEN_PLEN] + n - 1, "row %d: LEN %d pos %d", b, r1[SG_GEN_LEN],
                 ps[b]);
        int want = b == 3 ? SG_GEN_DONE_LENGTH : b == 4 ? SG_GEN_DONE_STOP : SG_GEN_RUNNING;
        TU_CHECK(r1[SG_GEN_DONE] == want, "row %d: DONE %d, expected %d", b, r1[SG_GEN_DONE], want);
    }
    TU_CHECK(tk[0] == 17, "greedy: the tie at 17 and 203 gave %d", tk[0]);
    TU_CHECK(c[SG_GEN_GO] == 1 && c[SG_GEN_COUNT] == 0, "greedy: GO %d COUNT %d", c[SG_GEN_GO], c[SG_GEN_COUNT]);
    free(tk), free(ps), free(in), free(o), free(c);
    /* Every sequence finishing: GO drops to 0. */
    for (int b = 0; b < B; b++) info[b * SG_GEN_INFO + SG_GEN_MAXNEW] = info[b * SG_GEN_INFO + SG_GEN_LEN] + 1;
    ctl[SG_GEN_NSTOP] = 0;
    samp_run(&s, l, info, out, ctl, 0.f);
    c = get_ints(s.ctl);
    TU_CHECK(c[SG_GEN_GO] == 0, "all finished: GO %d", c[SG_GEN_GO]);
    free(c);
    /* Sampling, without and with top-k: each draw valid for its u. */
    const int ks[3] = {0, 7, 1};
    for (int ki = 0; ki < 3; ki++) {
        for (int b = 0; b < B; b++) info[b * SG_GEN_INFO + SG_GEN_MAXNEW] = 9, info[b * SG_GEN_INFO + SG_GEN_DONE] = 0;
        ctl[SG_GEN_TOPK] = ks[ki];
        const float temp = 0.7f;
        samp_run(&s, l, info, out, ctl, temp);
        tk = get_ints(s.tok);
        for (int b = 0; b < B; b++) {
            double u = sg_gen_uniform((uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)b,
                                      (uint32_t)info[b * SG_GEN_INFO + SG_GEN_LEN]);
            if (ks[ki] == 1) { /* top-1: the argmax */
                int am = 0;
                for (int v = 1; v < V; v++)
                    if (l[b * V + v] > l[b * V + am]) am = v;
                TU_CHECK(tk[b] == am, "top-1 row %d: %d, expected %d", b, tk[b], am);
            } else {
                TU_CHECK(valid_draw(l + b * V, (int)V, temp, ks[ki], u, tk[b]), "sample %s top-k %d row %d: token %d is "
                         "not where u %.6f falls", sg_dtype_name(dt), ks[ki], b, tk[b], u);
            }
        }
        free(tk);
    }
    free(l);
    samp_drop(&s);
}

/* 4096 draws from one distribution over 8 tokens (one per sequence, keyed by the sequence). */
static void sample_frequencies(void)
{
    const int64_t B = 4096, V = 8;
    samp s = samp_make(SG_DTYPE_F32, B, V, 1);
    double *l = malloc((size_t)(B * V) * sizeof *l), p[8], sum = 0, base[8];
    for (int v = 0; v < V; v++) base[v] = tu_uniform(-2, 2), sum += p[v] = exp(base[v]);
    for (int v = 0; v < V; v++) p[v] /= sum;
    for (int64_t i = 0; i < B * V; i++) l[i] = (float)base[i % V];
    int32_t *info = calloc((size_t)B * SG_GEN_INFO, sizeof *info), *out = calloc((size_t)B, sizeof *out), ctl[SG_GEN_CTL] = {0};
    for (int b = 0; b < B; b++) info[b * SG_GEN_INFO + SG_GEN_PLEN] = 1, info[b * SG_GEN_INFO + SG_GEN_MAXNEW] = 1;
    uint64_t seed = tu_next();
    ctl[SG_GEN_SEED_LO] = (int32_t)(uint32_t)seed, ctl[SG_GEN_SEED_HI] = (int32_t)(uint32_t)(seed >> 32);
    samp_run(&s, l, info, out, ctl, 1.f);
    int32_t *tk = get_ints(s.tok);
    int cnt[8] = {0};
    for (int b = 0; b < B; b++) cnt[tk[b]]++;
    for (int v = 0; v < V; v++) {
        double f = cnt[v] / (double)B, sd = sqrt(p[v] * (1 - p[v]) / B);
        TU_CHECK(fabs(f - p[v]) <= 5 * sd + 1.0 / B, "frequencies: token %d drawn %.4f of the time, softmax %.4f "
                 "(5 sd %.4f)", v, f, p[v], 5 * sd);
    }
    free(tk), free(l), free(info), free(out);
    samp_drop(&s);
}

static void refusals(void)
{
    sg_tensor *qkv = tu_tensor2(dev, SG_DTYPE_F32, 4, 3 * 128, "qkv"), *out = tu_tensor2(dev, SG_DTYPE_F32, 4, 128, "out");
    sg_tensor *kc = tu_tensor(dev, SG_DTYPE_F32, 4, (int64_t[]){2, 2, 8, 64}, "kc");
    sg_tensor *vc = tu_tensor(dev, SG_DTYPE_F32, 4, (int64_t[]){2, 2, 8, 64}, "vc");
    sg_tensor *vb = tu_tensor(dev, SG_DTYPE_BF16, 4, (int64_t[]){2, 2, 8, 64}, "vb");
    int32_t z[2] = {0, 0};
    sg_tensor *start = ints(dev, 2, z, "start"), *st3 = ints(dev, 3, (int32_t[]){0, 0, 0}, "st3");
    TU_FAILS(dev, sg_kv_attention(dev, qkv, 2, start, kc, vb, out), SG_ERR_DTYPE, "vcache");
    TU_FAILS(dev, sg_kv_attention(dev, qkv, 2, st3, kc, vc, out), SG_ERR_SHAPE, "qkv");
    TU_FAILS(dev, sg_kv_attention(dev, qkv, 3, start, kc, vc, out), SG_ERR_SHAPE, "heads");
    TU_FAILS(dev, sg_kv_attention(dev, qkv, 2, start, kc, kc, out), SG_ERR_INVALID, "kcache");
    TU_FAILS(dev, sg_kv_attention(dev, qkv, 1, start, kc, vc, out), SG_ERR_SHAPE, "kcache");
    int32_t bad_tok[2] = {999, 0};
    sg_tensor *wte = tu_tensor2(dev, SG_DTYPE_F32, 16, 128, "wte"), *wpe = tu_tensor2(dev, SG_DTYPE_F32, 8, 128, "wpe");
    sg_tensor *tok = ints(dev, 2, bad_tok, "tok"), *y = tu_tensor2(dev, SG_DTYPE_F32, 2, 128, "y");
    TU_FAILS(dev, sg_embed_at(dev, tok, start, wte, wpe, out), SG_ERR_SHAPE, "y");
    TU_FAILS(dev, sg_embed_at(dev, tok, st3, wte, wpe, y), SG_ERR_SHAPE, "'pos' (st3) is (3) i32, expected 2 elements");
    if (!gpu) TU_FAILS(dev, sg_embed_at(dev, tok, start, wte, wpe, y), SG_ERR_INVALID, "token 999");
    /* Usable after: a valid call runs. */
    free(tu_random(qkv, -1, 1));
    TU_OK(dev, sg_kv_attention(dev, qkv, 2, start, kc, vc, out));
    sg_tensor *ts[] = {qkv, out, kc, vc, vb, start, st3, wte, wpe, tok, y};
    tu_destroy_all(ts, 11);
}

/* ---- one row through a linear layer, LayerNorm and residual fused ---- */

static double round_to(sg_dtype dt, double v)
{
    if (dt == SG_DTYPE_BF16) return sg_bf16_to_double(sg_double_to_bf16(v));
    return dt == SG_DTYPE_F32 ? (double)(float)v : v;
}

/* y = act(norm(x) W^T + b) + r against a direct computation in double, each element within a
 * bound derived from how the kernel (and the reference) compute it:
 *   - the output is rounded once on each side: 2 u_T |y|;
 *   - the kernel sums K products, the bias and r in f32: (K + 3) u32 S, S = sum |w h| + |b| + |r|
 *     (GELU, whose slope is at most 1.13, and tanhf's few ulps: x 1.13 plus 4 u32 |y|);
 *   - with the LayerNorm, norm(x) is rounded to T after an f32 computation (mean, variance,
 *     rsqrt: within 2^-16 relative of the double one, a wide margin): an element whose double
 *     value lies that close to a rounding boundary of T may round the other way, moving y by
 *     |w_k| times T's spacing there; only those elements (found here) count.
 * A product dropped or a row misread moves y by ~|w h| ~ 0.3, well above the bound (~0.05 for
 * bf16 at K 768). */
static void row_linear_case(sg_dtype dt, int64_t N, int64_t K, bool ln, bool bias, sg_activation act, int res)
{
    const double uT = dt == SG_DTYPE_BF16 ? 0x1p-9 : 0x1p-24, u32 = 0x1p-24, eps = 1e-5;
    sg_tensor *w_r, *g_r = NULL, *be_r = NULL, *b_r = NULL, *r_r = NULL;
    sg_tensor *x = tu_tensor2(dev, dt, 1, K, "x"), *w = fresh(dt, 2, (int64_t[]){N, K}, "w", &w_r);
    free(ln ? tu_random(x, 1.5, 3.5) : tu_random(x, -1, 1)); /* LN: an offset (the variance is about the mean) */
    sg_tensor *x_r = gpu ? tu_clone_to(ref, x, dt) : x;
    sg_tensor *g = ln ? fresh(dt, 1, (int64_t[]){K}, "gamma", &g_r) : NULL;
    sg_tensor *be = ln ? fresh(dt, 1, (int64_t[]){K}, "beta", &be_r) : NULL;
    sg_tensor *b = bias ? fresh(dt, 1, (int64_t[]){N}, "b", &b_r) : NULL;
    /* res: 0 none, 1 r apart from y, 2 y is r (in place) */
    sg_tensor *r = res ? fresh(dt, 2, (int64_t[]){1, N}, "r", &r_r) : NULL;
    sg_tensor *y = res == 2 ? r : tu_tensor2(dev, dt, 1, N, "y");
    double *xv = tu_get(x), *wv = tu_get(w), *gv = ln ? tu_get(g) : NULL, *bev = ln ? tu_get(be) : NULL;
    double *bv = bias ? tu_get(b) : NULL, *rv = res ? tu_get(r) : NULL;
    if (res != 2) tu_poison(y);
    TU_OK(dev, sg_gen_row_linear(dev, x, g, be, (float)eps, w, b, act, r, y));
    double *got = tu_get(y);
    double *h = malloc((size_t)K * sizeof *h), *near = calloc((size_t)K, sizeof *near);
    for (int64_t k = 0; k < K; k++) h[k] = xv[k];
    if (ln) {
        double m = 0, var = 0;
        for (int64_t k = 0; k < K; k++) m += xv[k];
        m /= (double)K;
        for (int64_t k = 0; k < K; k++) var += (xv[k] - m) * (xv[k] - m);
        const double rs = 1 / sqrt(var / (double)K + eps);
        for (int64_t k = 0; k < K; k++) {
            double e = (xv[k] - m) * rs * gv[k] + bev[k], slack = 0x1p-16 * (fabs(e) + fabs(bev[k]));
            h[k] = round_to(dt, e);
            /* may round the other way: the two neighbours of e within slack round apart */
            if (round_to(dt, e - slack) != round_to(dt, e + slack))
                near[k] = fabs(round_to(dt, e + slack) - round_to(dt, e - slack));
        }
    }
    double *want = malloc((size_t)N * sizeof *want), *tol = malloc((size_t)N * sizeof *tol);
    for (int64_t n = 0; n < N; n++) {
        double v = bias ? bv[n] : 0, S = bias ? fabs(bv[n]) : 0, A = 0;
        for (int64_t k = 0; k < K; k++) {
            v += wv[n * K + k] * h[k];
            S += fabs(wv[n * K + k] * h[k]);
            A += fabs(wv[n * K + k]) * near[k];
        }
        double slope = 1;
        if (act == SG_ACT_GELU) v = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))), slope = 1.13;
        if (act == SG_ACT_RELU) v = v > 0 ? v : 0;
        if (res) v += rv[n], S += fabs(rv[n]);
        want[n] = v;
        tol[n] = 2 * uT * fabs(v) + slope * ((double)(K + 3) * u32 * S + A) + (act == SG_ACT_GELU ? 4 * u32 * fabs(v) : 0) +
                 1e-30;
    }
    char w_[128];
    snprintf(w_, sizeof w_, "row_linear %s N%lld K%lld%s%s act %d res %d", sg_dtype_name(dt), (long long)N, (long long)K,
             ln ? " ln" : "", bias ? " bias" : "", (int)act, res);
    int64_t bad = 0, worst = 0;
    for (int64_t n = 0; n < N; n++) {
        bool out = !(fabs(got[n] - want[n]) <= tol[n]);
        if (out && !bad) worst = n;
        bad += out;
    }
    TU_CHECK(bad == 0, "%s: %lld of %lld outside the bound; [%lld] got %.9g want %.9g bound %.3g", w_, (long long)bad,
             (long long)N, (long long)worst, got[worst], want[worst], tol[worst]);
    /* The bound is tight enough to fail: dropping most single products of the middle column
     * would leave it. */
    int64_t caught = 0;
    for (int64_t k = 0; k < K; k++) caught += fabs(wv[(N / 2) * K + k] * h[k]) > tol[N / 2];
    TU_CHECK(caught >= K / 8, "%s: the bound %.3g admits all but %lld of %lld dropped products", w_, tol[N / 2],
             (long long)caught, (long long)K);
    if (gpu) { /* the reference on the same inputs, within the same bound */
        sg_tensor *y_r = res == 2 ? r_r : tu_tensor2(ref, dt, 1, N, "y_r");
        TU_OK(ref, sg_gen_row_linear(ref, x_r, g_r, be_r, (float)eps, w_r, b_r, act, r_r, y_r));
        double *rr = tu_get(y_r);
        int64_t rbad = 0;
        for (int64_t n = 0; n < N; n++) rbad += !(fabs(rr[n] - want[n]) <= tol[n]);
        TU_CHECK(rbad == 0, "%s: the reference: %lld outside the bound", w_, (long long)rbad);
        free(rr);
        if (res != 2) sg_tensor_destroy(y_r);
    }
    free(xv), free(wv), free(gv), free(bev), free(bv), free(rv), free(got), free(h), free(near), free(want), free(tol);
    drop2(x, x_r), drop2(w, w_r);
    if (g) drop2(g, g_r), drop2(be, be_r);
    if (b) drop2(b, b_r);
    if (r) drop2(r, r_r);
    if (res != 2) sg_tensor_destroy(y);
}

static void row_linear_refusals(void)
{
    sg_tensor *x = tu_tensor2(dev, SG_DTYPE_F32, 1, 64, "x"), *x2 = tu_tensor2(dev, SG_DTYPE_F32, 2, 64, "x2");
    sg_tensor *w = tu_tensor2(dev, SG_DTYPE_F32, 32, 64, "w"), *y = tu_tensor2(dev, SG_DTYPE_F32, 1, 32, "y");
    sg_tensor *g = tu_tensor(dev, SG_DTYPE_F32, 1, (int64_t[]){64}, "gamma");
    sg_tensor *gb = tu_tensor(dev, SG_DTYPE_BF16, 1, (int64_t[]){64}, "gbf");
    sg_tensor *b33 = tu_tensor(dev, SG_DTYPE_F32, 1, (int64_t[]){33}, "b33");
    free(tu_random(x, -1, 1)), free(tu_random(w, -1, 1)), free(tu_random(g, 0.5, 1.5));
    TU_FAILS(dev, sg_gen_row_linear(dev, x2, NULL, NULL, 0.f, w, NULL, SG_ACT_NONE, NULL, y), SG_ERR_SHAPE, "'x'");
    TU_FAILS(dev, sg_gen_row_linear(dev, x, g, NULL, 1e-5f, w, NULL, SG_ACT_NONE, NULL, y), SG_ERR_INVALID, "beta");
    TU_FAILS(dev, sg_gen_row_linear(dev, x, g, gb, 1e-5f, w, NULL, SG_ACT_NONE, NULL, y), SG_ERR_DTYPE, "beta");
    TU_FAILS(dev, sg_gen_row_linear(dev, x, g, g, 0.f, w, NULL, SG_ACT_NONE, NULL, y), SG_ERR_INVALID, "eps");
    TU_FAILS(dev, sg_gen_row_linear(dev, x, NULL, NULL, 0.f, w, b33, SG_ACT_NONE, NULL, y), SG_ERR_SHAPE, "'b'");
    TU_FAILS(dev, sg_gen_row_linear(dev, x, NULL, NULL, 0.f, w, NULL, SG_ACT_SILU, NULL, y), SG_ERR_INVALID,
             "activation");
    TU_FAILS(dev, sg_gen_row_linear(dev, x, NULL, NULL, 0.f, w, NULL, SG_ACT_NONE, x, y), SG_ERR_SHAPE, "'r'");
    /* Usable after: a valid call runs. */
    TU_OK(dev, sg_gen_row_linear(dev, x, g, g, 1e-5f, w, NULL, SG_ACT_GELU, NULL, y));
    sg_tensor *ts[] = {x, x2, w, y, g, gb, b33};
    tu_destroy_all(ts, 7);
}

int main(int argc, char **argv)
{
    sg_backend be;
    if (!tu_start("decode", argc, argv, &be)) return TU_SKIP;
    gpu = be == SG_BACKEND_CUDA;
    dev = tu_ctx(be);
    ref = gpu ? tu_ctx(SG_BACKEND_CPU) : dev;
    const sg_dtype dts[2] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int k = 0; k < 2; k++) {
        sg_dtype dt = dts[k];
        prefill_case(dt, 2, 37, 128, 2);
        prefill_case(dt, 1, 1, 96, 12);
        prefill_case(dt, 3, 5, 64, 1);
        decode_case(dt, 3, 1, 128, 2, 40);
        decode_case(dt, 2, 3, 96, 12, 9);
        decode_case(dt, 4, 1, 64, 1, 300);
        embed_case(dt);
        sample_cases(dt);
        /* the decode step's four layers (gpt-768), then odd shapes: N not a multiple of the
         * block's 8 columns, K not of the vector width (scalar loads), no bias, ReLU */
        row_linear_case(dt, 2304, 768, true, true, SG_ACT_NONE, 0);
        row_linear_case(dt, 768, 768, false, true, SG_ACT_NONE, 2);
        row_linear_case(dt, 3072, 768, true, true, SG_ACT_GELU, 0);
        row_linear_case(dt, 768, 3072, false, true, SG_ACT_NONE, 2);
        row_linear_case(dt, 37, 200, true, false, SG_ACT_NONE, 1);
        row_linear_case(dt, 13, 77, true, true, SG_ACT_RELU, 1);
        row_linear_case(dt, 256, 77, false, false, SG_ACT_GELU, 0);
    }
    row_linear_refusals();
    sample_frequencies();
    refusals();
    if (gpu) sg_ctx_destroy(ref);
    sg_ctx_destroy(dev);
    return tu_finish("decode");
}
