/* test_optim.c: AdamW and SGD with momentum over a segmented flat buffer. `cpu`: several
 * steps of the reference against an independent per-tensor implementation of PyTorch's
 * formulas (torch.optim.AdamW, torch.optim.SGD), in double; hp.step, a changed lr, and the
 * argument checks. `gpu`: the CUDA kernel against the CPU reference (f32) for 5 consecutive
 * steps on several sizes, one launch per step. Both: mixed precision's `skip` flag (nonzero:
 * param, moments, hp and param_lo bit for bit as they were; 0: the same bits as no flag) and
 * bf16 copy (param_lo is bf16(param), rounded to nearest even, bit for bit; the update itself
 * unchanged by it); the unscale folded into the step (sg_amp_check + sg_adamw_step_amp /
 * sg_sgd_step_amp) bit for bit the separate passes (amp_case).
 * No finite-difference check: an optimizer step is not the gradient of anything; its
 * correctness is the update rule itself, which the reference comparison checks. */
#include "testutil.h"

#include "ops/amp.h"
#include "ops/optim.h"

#include <math.h>

#define N_STEPS 5
#define MAX_SEG 4096

/* ---- segment tables ---- */

/* n_seg segments over P elements: sorted random cut points (repeats give empty segments,
 * which the API allows) and random decay flags, with the first non-empty segment decayed and
 * the last non-empty one not, so that both kinds of update are exercised. */
static void make_segments(int64_t P, int n_seg, int32_t *start, int32_t *decay)
{
    start[0] = 0;
    start[n_seg] = (int32_t)P;
    for (int s = 1; s < n_seg; s++) start[s] = (int32_t)(tu_next() % (uint64_t)(P + 1));
    for (int s = 1; s < n_seg; s++) /* insertion sort of start[1 .. n_seg-1] */
        for (int j = s; j > 1 && start[j - 1] > start[j]; j--) {
            int32_t t = start[j];
            start[j] = start[j - 1];
            start[j - 1] = t;
        }
    int first = -1, last = -1;
    for (int s = 0; s < n_seg; s++) {
        decay[s] = tu_randint(0, 1);
        if (start[s + 1] > start[s]) {
            if (first < 0) first = s;
            last = s;
        }
    }
    decay[first] = 1;
    if (last != first) decay[last] = 0;
}

static sg_tensor *int_tensor(sg_ctx *ctx, const int32_t *v, int64_t n, const char *name)
{
    sg_tensor *t = tu_tensor1(ctx, SG_DTYPE_I32, n, name);
    double *d = malloc((size_t)n * sizeof *d);
    for (int64_t i = 0; i < n; i++) d[i] = v[i];
    tu_set(t, d);
    free(d);
    return t;
}

/* Writes hp[idx] = val in hp's dtype, stream-ordered (a kernel on CUDA, a memcpy on CPU). */
static void hp_write(sg_tensor *hp, int idx, double val)
{
    if (hp->dtype == SG_DTYPE_F64) {
        TU_OK(hp->ctx, sg_tensor_write_small(hp, (size_t)idx * 8, &val, 8));
    } else {
        float f = (float)val;
        TU_OK(hp->ctx, sg_tensor_write_small(hp, (size_t)idx * 4, &f, 4));
    }
}

/* ---- the independent reference: a list of tensors, PyTorch's per-parameter loops ---- */

typedef struct ref_param {
    int64_t n;
    int decay;        /* this tensor's param group has weight_decay; the other has 0 */
    double *p, *m, *v; /* SGD: m is momentum_buffer */
    int has_buf;      /* SGD: PyTorch's momentum_buffer is None until the first step */
} ref_param;

typedef struct ref_hp {
    double lr, beta1, beta2, eps, wd, momentum, dampening;
    int step;
} ref_hp;

/* torch.optim.AdamW, _single_tensor_adamw: step += 1; p *= 1 - lr*wd; m.lerp_(g, 1-b1);
 * v = b2 v + (1-b2) g g; denom = sqrt(v)/sqrt(bc2) + eps; p -= lr/bc1 * m / denom. */
static void ref_adamw(ref_param *ps, int nt, double *const *grads, ref_hp *h)
{
    h->step += 1;
    double bc1 = 1 - pow(h->beta1, h->step), bc2 = 1 - pow(h->beta2, h->step);
    for (int k = 0; k < nt; k++) {
        ref_param *q = &ps[k];
        double wd = q->decay ? h->wd : 0;
        for (int64_t i = 0; i < q->n; i++) {
            double g = grads[k][i];
            q->p[i] *= 1 - h->lr * wd;
            q->m[i] += (g - q->m[i]) * (1 - h->beta1);
            q->v[i] = q->v[i] * h->beta2 + (1 - h->beta2) * g * g;
            double denom = sqrt(q->v[i]) / sqrt(bc2) + h->eps;
            q->p[i] -= h->lr / bc1 * q->m[i] / denom;
        }
    }
}

/* torch.optim.SGD, _single_tensor_sgd (no nesterov, no maximize): d = g + wd p; with
 * momentum, buf = clone(d) when it is None, else buf = momentum buf + (1-dampening) d, and
 * d = buf; p -= lr d. */
static void ref_sgd(ref_param *ps, int nt, double *const *grads, ref_hp *h)
{
    h->step += 1;
    for (int k = 0; k < nt; k++) {
        ref_param *q = &ps[k];
        double wd = q->decay ? h->wd : 0;
        for (int64_t i = 0; i < q->n; i++) {
            double d = grads[k][i] + wd * q->p[i];
            if (h->momentum != 0) {
                q->m[i] = q->has_buf ? h->momentum * q->m[i] + (1 - h->dampening) * d : d;
                d = q->m[i];
            }
            q->p[i] -= h->lr * d;
        }
        if (h->momentum != 0) q->has_buf = 1;
    }
}

enum { OPT_ADAMW = 0, OPT_SGD = 1 };

/* Values for hp: the fields an optimizer does not use hold junk, so mixing fields up fails. */
static void hp_values(int op, double momentum, double *hv)
{
    double adamw[8] = {0.01, 0.9, 0.999, 1e-8, 0.1, 0.5, 0.5, 0};
    double sgd[8] = {0.05, 0.5, 0.5, 0.5, 0.2, momentum, 0.3, 0};
    memcpy(hv, op == OPT_ADAMW ? adamw : sgd, sizeof adamw);
}

/* ---- mixed precision: skip and param_lo (either backend) ---- */

/* A tensor's raw bytes (caller frees), for bit-for-bit comparisons. */

static void expect_bits(const char *what, const sg_tensor *t, const void *want)
{
    void *now = tu_raw(t);
    TU_CHECK(memcmp(now, want, sg_tensor_nbytes(t)) == 0, "%s: '%s' is not bit for bit what it "
             "should be", what, t->name);
    free(now);
}

/* f32 to bf16 bits, rounding to nearest even (finite values), written here independently of
 * the library's sg_double_to_bf16 and __float2bfloat16_rn. */
static uint16_t bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* param_lo (bf16) against bf16(param) for every element; param f32 or f64 (f64 goes through
 * f32 first, as documented). */
static void expect_lo(const char *what, const sg_tensor *param_lo, const sg_tensor *param)
{
    uint16_t *lo = tu_raw(param_lo);
    double *p = tu_get(param);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < param->numel; i++)
        if (lo[i] != bf16_bits((float)p[i]) && bad++ == 0) first = i;
    TU_CHECK(bad == 0, "%s: %lld of %lld elements of param_lo are not bf16(param); first [%lld] "
             "0x%04x for param %.9g (want 0x%04x)", what, (long long)bad, (long long)param->numel,
             (long long)first, first >= 0 ? lo[first] : 0, first >= 0 ? p[first] : 0.0,
             first >= 0 ? bf16_bits((float)p[first]) : 0);
    free(lo);
    free(p);
}

/* The optimizer's buffers on one context: param, grad, m, v (AdamW) or buf (SGD; v unused),
 * and hp. */
typedef struct opt_state {
    sg_tensor *t[4], *hp;
} opt_state;

/* One step; on CUDA one launch, skipped or not (the flag is read by the kernel). */
static void one_step(int op, opt_state *s, const sg_tensor *ss, const sg_tensor *sd, int n_seg,
                     const sg_tensor *skip, sg_tensor *param_lo)
{
    sg_ctx *ctx = s->hp->ctx;
    uint64_t before = sg_ctx_launch_count(ctx);
    if (op == OPT_ADAMW)
        TU_OK(ctx, sg_adamw_step(ctx, s->t[0], s->t[1], s->t[2], s->t[3], s->hp, ss, sd, n_seg,
                                 skip, param_lo));
    else
        TU_OK(ctx, sg_sgd_step(ctx, s->t[0], s->t[1], s->t[2], s->hp, ss, sd, n_seg, skip,
                               param_lo));
    uint64_t launches = sg_ctx_launch_count(ctx) - before;
    if (ctx->backend == SG_BACKEND_CUDA)
        TU_CHECK(launches == 1, "gpu %s: %llu launches for one step, expected 1",
                 op == OPT_ADAMW ? "adamw" : "sgd", (unsigned long long)launches);
}

/* The bits of what a step writes: param, m or buf, v (AdamW), hp. */
static void snapshot(int op, const opt_state *s, void **bits)
{
    bits[0] = tu_raw(s->t[0]);
    bits[1] = tu_raw(s->t[2]);
    bits[2] = op == OPT_ADAMW ? tu_raw(s->t[3]) : NULL;
    bits[3] = tu_raw(s->hp);
}

static void expect_state(const char *what, int op, const opt_state *s, void **bits)
{
    expect_bits(what, s->t[0], bits[0]);
    expect_bits(what, s->t[2], bits[1]);
    if (op == OPT_ADAMW) expect_bits(what, s->t[3], bits[2]);
    expect_bits(what, s->hp, bits[3]);
}

static void free_bits(void **bits)
{
    for (int i = 0; i < 4; i++) free(bits[i]);
}

/* A tensor of P elements, or (misaligned) a view of one at element 1, whose owner goes to
 * *base (NULL otherwise). */
static sg_tensor *layout_tensor(sg_ctx *ctx, sg_dtype dt, int64_t P, int misaligned,
                                const char *name, sg_tensor **base)
{
    *base = NULL;
    if (!misaligned) return tu_tensor1(ctx, dt, P, name);
    *base = tu_tensor1(ctx, dt, P + 1, "base");
    sg_tensor *t = NULL;
    TU_OK(ctx, sg_tensor_view(*base, 1, 1, &P, name, &t));
    return t;
}

/* On ctx, two optimizer states A and B from the same random values, stepped in turn:
 *   1. A with skip = 1 and param_lo (preset to 3.0): A and param_lo unchanged, bit for bit;
 *   2. A with skip = 0, B with no flag: the same bits;
 *   3. new gradients; A with skip = 0 and param_lo, B with neither (param_lo alone
 *      misaligned: B writes its own, see below): the same bits, and param_lo = bf16(param)
 *      bit for bit;
 *   4. A with skip = -7 (any nonzero) and param_lo: A and param_lo unchanged.
 * On CUDA each step is one launch and the block counter ends at 0 (a skipped launch never
 * touches it). misaligned 1: param_lo a view at element 1 (2 bytes off: the scalar path);
 * 2: every buffer a view at element 1. */
static void mixed_case(sg_ctx *ctx, int op, sg_dtype dt, int64_t P, int n_seg, double momentum,
                       int misaligned)
{
    const int gpu = ctx->backend == SG_BACKEND_CUDA;
    char what[200];
    int k = snprintf(what, sizeof what, "%s %s %s P=%lld n_seg=%d momentum %g%s",
                     gpu ? "gpu" : "cpu", op == OPT_ADAMW ? "adamw" : "sgd", sg_dtype_name(dt),
                     (long long)P, n_seg, momentum,
                     misaligned == 1 ? " param_lo misaligned" : misaligned ? " misaligned" : "");
    int32_t *start = malloc((size_t)(n_seg + 1) * sizeof *start);
    int32_t *decay = malloc((size_t)n_seg * sizeof *decay);
    make_segments(P, n_seg, start, decay);
    sg_tensor *ss = int_tensor(ctx, start, n_seg + 1, "seg_start");
    sg_tensor *sd = int_tensor(ctx, decay, n_seg, "seg_decay");
    const char *names[4] = {"param", "grad", op == OPT_ADAMW ? "m" : "buf", "v"};
    double lo[4] = {-1, -1, -0.1, 1e-3}, hi[4] = {1, 1, 0.1, 1e-2};
    /* A and B have the same layout, so that on CUDA they take the same path of the kernel
     * (float4 or scalar, whose arithmetic may contract into fmas differently) and bit-for-bit
     * comparisons hold. */
    opt_state A, B;
    sg_tensor *bases[10] = {NULL};
    int nb = 0;
    for (int j = 0; j < 4; j++) {
        A.t[j] = layout_tensor(ctx, dt, P, misaligned == 2, names[j], &bases[nb++]);
        B.t[j] = layout_tensor(ctx, dt, P, misaligned == 2, names[j], &bases[nb++]);
        double *x = tu_random(A.t[j], lo[j], hi[j]);
        tu_set(B.t[j], x);
        free(x);
    }
    double hv[8];
    hp_values(op, momentum, hv);
    A.hp = tu_tensor1(ctx, dt, 8, "hp"), B.hp = tu_tensor1(ctx, dt, 8, "hp");
    tu_set(A.hp, hv);
    tu_set(B.hp, hv);
    sg_tensor *skip = tu_tensor1(ctx, SG_DTYPE_I32, 1, "skip");
    sg_tensor *plo = layout_tensor(ctx, SG_DTYPE_BF16, P, misaligned != 0, "param_lo",
                                   &bases[nb++]);
    /* With param_lo alone misaligned, A takes the scalar path on CUDA whenever it writes
     * param_lo: then B writes one too, laid out the same way. */
    sg_tensor *plo_b = misaligned == 1 ? layout_tensor(ctx, SG_DTYPE_BF16, P, 1, "param_lo_b",
                                                       &bases[nb++]) : NULL;
    TU_OK(ctx, sg_tensor_fill(plo, 3.0));
    void *before[4], *lo_bits = tu_raw(plo);

    /* 1. skip = 1: nothing moves. */
    TU_OK(ctx, sg_tensor_fill(skip, 1));
    snapshot(op, &A, before);
    one_step(op, &A, ss, sd, n_seg, skip, plo);
    snprintf(what + k, sizeof what - k, ": skip 1");
    expect_state(what, op, &A, before);
    expect_bits(what, plo, lo_bits);
    free_bits(before);

    /* 2. skip = 0 is no flag at all. */
    TU_OK(ctx, sg_tensor_fill(skip, 0));
    one_step(op, &A, ss, sd, n_seg, skip, NULL);
    one_step(op, &B, ss, sd, n_seg, NULL, NULL);
    snapshot(op, &B, before);
    snprintf(what + k, sizeof what - k, ": skip 0 against no flag");
    expect_state(what, op, &A, before);
    expect_bits(what, plo, lo_bits);
    free_bits(before);

    /* 3. param_lo: bf16 of the new param; the update is the same without it. */
    double *g = tu_random(A.t[1], -1, 1);
    tu_set(B.t[1], g);
    free(g);
    one_step(op, &A, ss, sd, n_seg, skip, plo);
    one_step(op, &B, ss, sd, n_seg, NULL, plo_b);
    snapshot(op, &B, before);
    snprintf(what + k, sizeof what - k, ": with param_lo against without");
    expect_state(what, op, &A, before);
    free_bits(before);
    snprintf(what + k, sizeof what - k, ": param_lo after a step");
    expect_lo(what, plo, A.t[0]);
    if (plo_b) expect_lo(what, plo_b, B.t[0]);
    double *hn = tu_get(A.hp);
    TU_CHECK(hn[SG_HP_STEP] == 2, "%s: hp.step is %g after two steps and a skip", what,
             hn[SG_HP_STEP]);
    free(hn);

    /* 4. Any nonzero flag skips, param_lo included. */
    int32_t neg = -7;
    TU_OK(ctx, sg_tensor_write_small(skip, 0, &neg, sizeof neg));
    free(lo_bits);
    lo_bits = tu_raw(plo);
    snapshot(op, &A, before);
    one_step(op, &A, ss, sd, n_seg, skip, plo);
    snprintf(what + k, sizeof what - k, ": skip -7");
    expect_state(what, op, &A, before);
    expect_bits(what, plo, lo_bits);
    free_bits(before);

    if (gpu) {
        double *cnt = tu_get(ctx->scratch[SG_SLOT_OPTIM]);
        TU_CHECK(cnt[0] == 0, "%s: the block counter is %g, expected 0", what, cnt[0]);
        free(cnt);
    }
    free(lo_bits);
    for (int j = 0; j < 4; j++) sg_tensor_destroy(A.t[j]), sg_tensor_destroy(B.t[j]);
    sg_tensor_destroy(A.hp), sg_tensor_destroy(B.hp), sg_tensor_destroy(skip);
    sg_tensor_destroy(plo), sg_tensor_destroy(plo_b), sg_tensor_destroy(ss), sg_tensor_destroy(sd);
    for (int i = 0; i < nb; i++) sg_tensor_destroy(bases[i]);
    free(start);
    free(decay);
}

/* The unscale folded into the step (sg_amp_check, then sg_adamw_step_amp / sg_sgd_step_amp)
 * against the separate passes (sg_amp_unscale into f32 gradients, then sg_adamw_step /
 * sg_sgd_step), on one context from the same values: param, the state, hp, param_lo, the
 * scaler and found bit for bit after each of 4 steps, with fresh bf16 gradients every step, an
 * inf among them at step 3 (both skip, the scale halves), a scale that is not a power of two
 * (the f32 product is what both must agree on), and inv = f32(1 / the scale before the step).
 * On CUDA the folded step is two launches. state: the state dtype (F32 or BF16);
 * misaligned: grad_lo a view at element 1 (the scalar path).
 * clip: clipping between the unscale and the step, folded too: the separate side clips its f32
 * gradients (sg_clip_grad_norm), the folded one measures the scaled ones (sg_clip_sumsq_amp),
 * writes the factor beside inv (sg_clip_factor_sums into the second element of a 2-element
 * inv) and steps with both; the norms and flags bit for bit as well, four launches. The
 * unscaled gradients are U(-1, 1) times 3000 / scale, of norm about sqrt(P / 3) 3000 / scale
 * (a spread of about 5% at P = 77); max_norm is a fifth of that at the largest scale reached
 * (6001), a tenth at 3000.5, so every finite step clips (checked: factor < 1). */
static void amp_case_clip(sg_ctx *ctx, int op, sg_dtype state, sg_dtype gdt, int64_t P, int n_seg, double momentum,
                          int misaligned, bool clip)
{
    const int gpu = ctx->backend == SG_BACKEND_CUDA;
    char what[200];
    int k = snprintf(what, sizeof what, "%s %s amp %s grad_lo %s state P=%lld%s%s", gpu ? "gpu" : "cpu",
                     op == OPT_ADAMW ? "adamw" : "sgd", sg_dtype_name(gdt), sg_dtype_name(state), (long long)P,
                     misaligned ? " grad_lo misaligned" : "", clip ? " clipped" : "");
    const float max_norm = (float)(0.2 * sqrt((double)P / 3) * 3000 / 6001);
    int32_t *start = malloc((size_t)(n_seg + 1) * sizeof *start), *decay = malloc((size_t)n_seg * sizeof *decay);
    make_segments(P, n_seg, start, decay);
    sg_tensor *ss = int_tensor(ctx, start, n_seg + 1, "seg_start"), *sd = int_tensor(ctx, decay, n_seg, "seg_decay");
    const char *names[4] = {"param", "grad", op == OPT_ADAMW ? "m" : "buf", "v"};
    double lo[4] = {-1, -1, -0.1, 1e-3}, hi[4] = {1, 1, 0.1, 1e-2};
    opt_state A, B; /* A: separate passes (t[1] the f32 gradients), B: folded (t[1] unused) */
    for (int j = 0; j < 4; j++) {
        sg_dtype dt = j >= 2 ? state : SG_DTYPE_F32;
        A.t[j] = tu_tensor1(ctx, dt, P, names[j]);
        B.t[j] = tu_tensor1(ctx, dt, P, names[j]);
        free(tu_random(A.t[j], lo[j], hi[j]));
        double *x = tu_get(A.t[j]); /* as stored (bf16 state rounded) */
        tu_set(B.t[j], x);
        free(x);
    }
    double hv[8];
    hp_values(op, momentum, hv);
    A.hp = tu_tensor1(ctx, SG_DTYPE_F32, 8, "hp"), B.hp = tu_tensor1(ctx, SG_DTYPE_F32, 8, "hp");
    tu_set(A.hp, hv), tu_set(B.hp, hv);
    sg_tensor *glo_base = NULL, *glo = layout_tensor(ctx, gdt, P, misaligned, "grad_lo", &glo_base);
    sg_tensor *sa = tu_tensor1(ctx, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler_a");
    sg_tensor *sb = tu_tensor1(ctx, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler_b");
    sg_tensor *fa = tu_tensor1(ctx, SG_DTYPE_I32, 1, "found_a"), *fb = tu_tensor1(ctx, SG_DTYPE_I32, 1, "found_b");
    /* inv: 1 element, or with clip the first of muls (inv, factor) */
    sg_tensor *muls = tu_tensor1(ctx, SG_DTYPE_F32, clip ? 2 : 1, "inv_factor"), *inv = muls, *fac = NULL;
    if (clip) {
        TU_OK(ctx, sg_tensor_view(muls, 0, 1, (int64_t[]){1}, "inv", &inv));
        TU_OK(ctx, sg_tensor_view(muls, 1, 1, (int64_t[]){1}, "factor", &fac));
    }
    sg_tensor *na = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm_a"), *nb = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm_b");
    sg_tensor *nfa = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nonfinite_a"), *nfb = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nonfinite_b");
    sg_tensor *sums = tu_tensor1(ctx, SG_DTYPE_I32, 2, "sums");
    sg_tensor *pla = tu_tensor1(ctx, SG_DTYPE_BF16, P, "param_lo_a"), *plb = tu_tensor1(ctx, SG_DTYPE_BF16, P, "param_lo_b");
    /* scale 3000.5 (not a power of two), growth every 2 finite steps: it doubles at step 2,
     * halves at step 3 (the inf), and the factor differs from step to step. */
    const double sc0[SG_SCALER_COUNT] = {3000.5, 0, 2, 0};
    tu_set(sa, sc0), tu_set(sb, sc0);
    for (int t = 1; t <= 4; t++) {
        double *g = tu_random(glo, -3000, 3000);
        if (t == 3) {
            g[tu_randint(0, (int)(P - 1))] = INFINITY;
            tu_set(glo, g);
        }
        free(g);
        double *scv = tu_get(sb);
        const float want_inv = 1.0f / (float)scv[SG_SCALER_SCALE];
        free(scv);
        tu_poison(A.t[1]), tu_poison(fa), tu_poison(fb), tu_poison(muls);
        tu_poison(na), tu_poison(nb), tu_poison(nfa), tu_poison(nfb);
        TU_OK(ctx, sg_amp_unscale(ctx, glo, A.t[1], sa, fa));
        if (clip) TU_OK(ctx, sg_clip_grad_norm(ctx, A.t[1], max_norm, na, nfa));
        if (op == OPT_ADAMW)
            TU_OK(ctx, sg_adamw_step(ctx, A.t[0], A.t[1], A.t[2], A.t[3], A.hp, ss, sd, n_seg, fa, pla));
        else
            TU_OK(ctx, sg_sgd_step(ctx, A.t[0], A.t[1], A.t[2], A.hp, ss, sd, n_seg, fa, pla));
        uint64_t before = sg_ctx_launch_count(ctx);
        TU_OK(ctx, sg_amp_check(ctx, glo, sb, fb, inv));
        if (clip) {
            TU_OK(ctx, sg_clip_sumsq_amp(ctx, glo, inv, sums, 0));
            TU_OK(ctx, sg_clip_factor_sums(ctx, max_norm, sums, nb, nfb, fac));
        }
        if (op == OPT_ADAMW)
            TU_OK(ctx, sg_adamw_step_amp(ctx, B.t[0], glo, muls, B.t[2], B.t[3], B.hp, ss, sd, n_seg, fb, plb));
        else
            TU_OK(ctx, sg_sgd_step_amp(ctx, B.t[0], glo, muls, B.t[2], B.hp, ss, sd, n_seg, fb, plb));
        uint64_t launches = sg_ctx_launch_count(ctx) - before;
        snprintf(what + k, sizeof what - k, " step %d", t);
        const uint64_t want_launches = clip ? 4 : 2;
        if (gpu)
            TU_CHECK(launches == want_launches, "%s: %llu launches, expected %llu", what,
                     (unsigned long long)launches, (unsigned long long)want_launches);
        void *bits[4];
        snapshot(op, &A, bits);
        expect_state(what, op, &B, bits);
        free_bits(bits);
        const sg_tensor *pairs[5][2] = {{pla, plb}, {sa, sb}, {fa, fb}, {na, nb}, {nfa, nfb}};
        for (int i = 0; i < (clip ? 5 : 3); i++) {
            void *x = tu_raw(pairs[i][0]);
            expect_bits(what, pairs[i][1], x);
            free(x);
        }
        double *f = tu_get(fb), *iv = tu_get(inv);
        TU_CHECK(f[0] == (t == 3), "%s: found is %g", what, f[0]);
        TU_CHECK(iv[0] == (double)want_inv, "%s: inv is %.9g, expected 1 / scale = %.9g", what, iv[0], (double)want_inv);
        free(f), free(iv);
        if (clip) {
            double *c = tu_get(fac);
            TU_CHECK(t == 3 ? c[0] == 1 : c[0] < 1, "%s: the clipping factor is %.9g: expected %s", what, c[0],
                     t == 3 ? "1 (not finite)" : "below 1 (max_norm is below the norm)");
            free(c);
        }
    }
    double *h = tu_get(B.hp);
    TU_CHECK(h[SG_HP_STEP] == 3, "%s: hp.step is %g after 3 steps and a skip", what, h[SG_HP_STEP]);
    free(h);
    for (int j = 0; j < 4; j++) sg_tensor_destroy(A.t[j]), sg_tensor_destroy(B.t[j]);
    if (clip) sg_tensor_destroy(inv), sg_tensor_destroy(fac);
    sg_tensor *ts[] = {A.hp, B.hp, glo, glo_base, sa, sb, fa, fb, muls, na, nb, nfa, nfb, sums, pla, plb, ss, sd};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
    free(start), free(decay);
}

static void amp_case(sg_ctx *ctx, int op, sg_dtype state, int64_t P, int n_seg, double momentum, int misaligned)
{
    amp_case_clip(ctx, op, state, SG_DTYPE_BF16, P, n_seg, momentum, misaligned, false);
}

/* sg_adamw_step_amp's own refusals: grad_lo's dtype and element count, inv's (1 or 2). */
static void amp_errors(sg_ctx *ctx)
{
    const int64_t P = 10;
    sg_tensor *p = tu_tensor1(ctx, SG_DTYPE_F32, P, "param"), *m = tu_tensor1(ctx, SG_DTYPE_F32, P, "m");
    sg_tensor *v = tu_tensor1(ctx, SG_DTYPE_F32, P, "v"), *hp = tu_tensor1(ctx, SG_DTYPE_F32, 8, "hp");
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_BF16, P, "grad_lo"), *g9 = tu_tensor1(ctx, SG_DTYPE_BF16, 9, "grad_lo9");
    sg_tensor *gi = tu_tensor1(ctx, SG_DTYPE_I32, P, "grad_i32"), *inv = tu_tensor1(ctx, SG_DTYPE_F32, 1, "inv");
    sg_tensor *inv3 = tu_tensor1(ctx, SG_DTYPE_F32, 3, "inv3"), *invb = tu_tensor1(ctx, SG_DTYPE_BF16, 1, "invb");
    int32_t st[2] = {0, (int32_t)P}, dc[1] = {1};
    sg_tensor *ss = int_tensor(ctx, st, 2, "seg_start"), *sd = int_tensor(ctx, dc, 1, "seg_decay");
    double hv[8];
    hp_values(OPT_ADAMW, 0, hv);
    tu_set(hp, hv);
    free(tu_random(g, -1, 1)), free(tu_random(p, -1, 1));
    TU_OK(ctx, sg_tensor_fill(m, 0));
    TU_OK(ctx, sg_tensor_fill(v, 0));
    TU_OK(ctx, sg_tensor_fill(inv, 0.5));
    TU_FAILS(ctx, sg_adamw_step_amp(ctx, p, g, NULL, m, v, hp, ss, sd, 1, NULL, NULL), SG_ERR_NULL, "'inv'");
    TU_FAILS(ctx, sg_adamw_step_amp(ctx, p, gi, inv, m, v, hp, ss, sd, 1, NULL, NULL), SG_ERR_DTYPE,
             "'grad_lo' is i32");
    TU_FAILS(ctx, sg_adamw_step_amp(ctx, p, g9, inv, m, v, hp, ss, sd, 1, NULL, NULL), SG_ERR_SHAPE, "grad_lo");
    TU_FAILS(ctx, sg_adamw_step_amp(ctx, p, g, inv3, m, v, hp, ss, sd, 1, NULL, NULL), SG_ERR_SHAPE, "'inv'");
    TU_FAILS(ctx, sg_adamw_step_amp(ctx, p, g, invb, m, v, hp, ss, sd, 1, NULL, NULL), SG_ERR_DTYPE, "inv");
    TU_FAILS(ctx, sg_sgd_step_amp(ctx, p, g, inv, m, hp, ss, sd, 1, NULL, hp), SG_ERR_DTYPE, "param_lo");
    /* inv inside the parameters the step writes */
    sg_tensor *inside = NULL;
    TU_OK(ctx, sg_tensor_view(p, 3, 1, (int64_t[]){1}, "inv_in_param", &inside));
    TU_FAILS(ctx, sg_adamw_step_amp(ctx, p, g, inside, m, v, hp, ss, sd, 1, NULL, NULL), SG_ERR_INVALID, "inv");
    TU_OK(ctx, sg_adamw_step_amp(ctx, p, g, inv, m, v, hp, ss, sd, 1, NULL, NULL)); /* still usable */
    sg_tensor *ts[] = {p, m, v, hp, g, g9, gi, inv, inv3, invb, ss, sd, inside};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

/* ---- cpu ---- */


/* N_STEPS steps of the library's reference (dtype dt) against ref_adamw / ref_sgd on a few
 * tensors of random lengths (one of a single element, one empty), lr changed every step. */
static void cpu_run(int op, sg_dtype dt, double momentum)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const char *opname = op == OPT_ADAMW ? "adamw" : "sgd";
    int nt = tu_randint(3, 8), parity = tu_randint(0, 1);
    int32_t start[9], decay[8];
    ref_param ps[8];
    start[0] = 0;
    for (int k = 0; k < nt; k++) {
        int64_t n = k == 1 ? 1 : k == 2 ? 0 : tu_randint(2, 40);
        decay[k] = (k + parity) % 2; /* tensors 0 and 1 (non-empty) differ */
        start[k + 1] = start[k] + (int32_t)n;
        ps[k] = (ref_param){n, decay[k], NULL, NULL, NULL, 0};
    }
    int64_t P = start[nt];
    sg_tensor *p = tu_tensor1(ctx, dt, P, "param"), *g = tu_tensor1(ctx, dt, P, "grad");
    sg_tensor *m = tu_tensor1(ctx, dt, P, "m"), *v = tu_tensor1(ctx, dt, P, "v");
    sg_tensor *hp = tu_tensor1(ctx, dt, 8, "hp");
    sg_tensor *ss = int_tensor(ctx, start, nt + 1, "seg_start"), *sd = int_tensor(ctx, decay, nt, "seg_decay");
    /* Random state, never zeros: PyTorch starts m, v (buf) at zero, but the update rule holds
     * for any state, and a random one catches a kernel that ignores it. v > 0. */
    free(tu_random(p, -1, 1));
    free(tu_random(m, -0.1, 0.1));
    free(tu_random(v, 1e-4, 1e-2));
    double hv[8];
    hp_values(op, momentum, hv);
    tu_set(hp, hv);
    /* The reference starts from the values as stored (rounded to f32 when dt is). */
    double *p0 = tu_get(p), *m0 = tu_get(m), *v0 = tu_get(v), *h0 = tu_get(hp);
    ref_hp h = {h0[SG_HP_LR], h0[SG_HP_BETA1], h0[SG_HP_BETA2], h0[SG_HP_EPS],
                h0[SG_HP_WEIGHT_DECAY], h0[SG_HP_MOMENTUM], h0[SG_HP_DAMPENING], 0};
    for (int k = 0; k < nt; k++) {
        size_t bytes = (size_t)(ps[k].n ? ps[k].n : 1) * sizeof(double);
        ps[k].p = malloc(bytes), ps[k].m = malloc(bytes), ps[k].v = malloc(bytes);
        for (int64_t i = 0; i < ps[k].n; i++) {
            ps[k].p[i] = p0[start[k] + i];
            ps[k].m[i] = m0[start[k] + i];
            ps[k].v[i] = v0[start[k] + i];
        }
    }
    tu_tol tol = tu_tol_for(dt);
    double *flat = malloc((size_t)P * sizeof *flat);
    for (int st = 0; st < N_STEPS; st++) {
        if (st > 0) { /* a new lr in hp must take effect with no other change */
            hp_write(hp, SG_HP_LR, tu_uniform(0.005, 0.05));
            double *hn = tu_get(hp);
            h.lr = hn[SG_HP_LR];
            free(hn);
        }
        free(tu_random(g, -1, 1));
        double *gv = tu_get(g), *grads[8];
        for (int k = 0; k < nt; k++) grads[k] = gv + start[k];
        if (op == OPT_ADAMW) {
            TU_OK(ctx, sg_adamw_step(ctx, p, g, m, v, hp, ss, sd, nt, NULL, NULL));
            ref_adamw(ps, nt, grads, &h);
        } else {
            TU_OK(ctx, sg_sgd_step(ctx, p, g, m, hp, ss, sd, nt, NULL, NULL));
            ref_sgd(ps, nt, grads, &h);
        }
        free(gv);
        char what[128];
        const char *names[3] = {"param", op == OPT_ADAMW ? "m" : "buf", "v"};
        sg_tensor *got[3] = {p, m, v};
        for (int j = 0; j < (op == OPT_ADAMW ? 3 : 2); j++) {
            for (int k = 0; k < nt; k++)
                for (int64_t i = 0; i < ps[k].n; i++)
                    flat[start[k] + i] = j == 0 ? ps[k].p[i] : j == 1 ? ps[k].m[i] : ps[k].v[i];
            double *gt = tu_get(got[j]);
            snprintf(what, sizeof what, "cpu %s %s momentum %g: %s after step %d", opname,
                     sg_dtype_name(dt), momentum, names[j], st + 1);
            tu_close(what, gt, flat, P, tol);
            free(gt);
        }
        /* hp.step counts the steps; nothing else in hp moves. */
        double *hn = tu_get(hp);
        TU_CHECK(hn[SG_HP_STEP] == st + 1, "cpu %s: hp.step is %g after %d steps", opname,
                 hn[SG_HP_STEP], st + 1);
        for (int i = 1; i < SG_HP_STEP; i++)
            TU_CHECK(hn[i] == h0[i], "cpu %s: hp[%d] changed from %g to %g", opname, i, h0[i], hn[i]);
        free(hn);
    }
    for (int k = 0; k < nt; k++) free(ps[k].p), free(ps[k].m), free(ps[k].v);
    free(flat), free(p0), free(m0), free(v0), free(h0);
    sg_tensor *ts[] = {p, g, m, v, hp, ss, sd};
    for (int i = 0; i < 7; i++) sg_tensor_destroy(ts[i]);
    sg_ctx_destroy(ctx);
}

/* Every argument check, each failing before anything is written; the context stays usable. */
static void cpu_errors(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU), *other = tu_ctx(SG_BACKEND_CPU);
    const int64_t P = 10;
    sg_tensor *p = tu_tensor1(ctx, SG_DTYPE_F64, P, "param"), *g = tu_tensor1(ctx, SG_DTYPE_F64, P, "grad");
    sg_tensor *m = tu_tensor1(ctx, SG_DTYPE_F64, P, "m"), *v = tu_tensor1(ctx, SG_DTYPE_F64, P, "v");
    sg_tensor *hp = tu_tensor1(ctx, SG_DTYPE_F64, 8, "hp");
    int32_t st_ok[3] = {0, 4, 10}, dc[3] = {1, 0, 1};
    int32_t st_end[3] = {0, 4, 9}, st_down[3] = {0, 11, 10}, st_first[3] = {1, 4, 10};
    sg_tensor *ss = int_tensor(ctx, st_ok, 3, "seg_start"), *sd = int_tensor(ctx, dc, 2, "seg_decay");
    sg_tensor *ss_end = int_tensor(ctx, st_end, 3, "ss_end"), *ss_down = int_tensor(ctx, st_down, 3, "ss_down");
    sg_tensor *ss_first = int_tensor(ctx, st_first, 3, "ss_first"), *sd3 = int_tensor(ctx, dc, 3, "sd3");
    sg_tensor *g_i32 = tu_tensor1(ctx, SG_DTYPE_I32, P, "g_i32"), *g_f32 = tu_tensor1(ctx, SG_DTYPE_F32, P, "g_f32");
    sg_tensor *m9 = tu_tensor1(ctx, SG_DTYPE_F64, P - 1, "m9"), *hp7 = tu_tensor1(ctx, SG_DTYPE_F64, 7, "hp7");
    sg_tensor *hp_i32 = tu_tensor1(ctx, SG_DTYPE_I32, 8, "hp_i32"), *ss_f32 = tu_tensor1(ctx, SG_DTYPE_F32, 3, "ss_f32");
    sg_tensor *g_other = tu_tensor1(other, SG_DTYPE_F64, P, "g_other");
    free(tu_random(p, -1, 1));
    free(tu_random(g, -1, 1));
    free(tu_random(m, -1, 1));
    free(tu_random(v, 0.1, 1));
    free(tu_random(g_f32, -1, 1));
    free(tu_random(ss_f32, 0, 1));
    double hv[8];
    hp_values(OPT_ADAMW, 0, hv);
    tu_set(hp, hv);
    double *before[4] = {tu_get(p), tu_get(m), tu_get(v), tu_get(hp)};

    TU_FAILS(ctx, sg_adamw_step(ctx, NULL, g, m, v, hp, ss, sd, 2, NULL, NULL), SG_ERR_NULL, "'param'");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, NULL, hp, ss, sd, 2, NULL, NULL), SG_ERR_NULL, "'v'");
    TU_FAILS(ctx, sg_sgd_step(ctx, p, g, NULL, hp, ss, sd, 2, NULL, NULL), SG_ERR_NULL, "'buf'");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g_i32, m, v, hp, ss, sd, 2, NULL, NULL), SG_ERR_DTYPE, "'grad'");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g_f32, m, v, hp, ss, sd, 2, NULL, NULL), SG_ERR_DTYPE, "'grad'");
    TU_FAILS(ctx, sg_adamw_step(ctx, g_i32, g_i32, m, v, hp, ss, sd, 2, NULL, NULL), SG_ERR_DTYPE, "'param'");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m9, v, hp, ss, sd, 2, NULL, NULL), SG_ERR_SHAPE, "'m'");
    TU_FAILS(ctx, sg_sgd_step(ctx, p, g, m9, hp, ss, sd, 2, NULL, NULL), SG_ERR_SHAPE, "'buf'");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, m, hp, ss, sd, 2, NULL, NULL), SG_ERR_INVALID, "share");
    TU_FAILS(ctx, sg_sgd_step(ctx, p, g, p, hp, ss, sd, 2, NULL, NULL), SG_ERR_INVALID, "'buf'");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g_other, m, v, hp, ss, sd, 2, NULL, NULL), SG_ERR_BACKEND, "another context");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v, hp7, ss, sd, 2, NULL, NULL), SG_ERR_SHAPE, "'hp'");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v, hp_i32, ss, sd, 2, NULL, NULL), SG_ERR_DTYPE, "'hp'");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v, hp, ss_f32, sd, 2, NULL, NULL), SG_ERR_DTYPE, "'seg_start'");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v, hp, ss, g_i32, 2, NULL, NULL), SG_ERR_SHAPE, "'seg_decay'");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v, hp, ss, sd3, 3, NULL, NULL), SG_ERR_SHAPE, "'seg_start'");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v, hp, ss, sd, 0, NULL, NULL), SG_ERR_INVALID, "n_seg");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v, hp, ss_end, sd, 2, NULL, NULL), SG_ERR_INVALID, "seg_start[2]");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v, hp, ss_down, sd, 2, NULL, NULL), SG_ERR_INVALID, "non-decreasing");
    TU_FAILS(ctx, sg_sgd_step(ctx, p, g, m, hp, ss_first, sd, 2, NULL, NULL), SG_ERR_INVALID, "seg_start[0]");

    /* Mixed precision: skip (1 I32) and param_lo (P BF16). */
    sg_tensor *skip = tu_tensor1(ctx, SG_DTYPE_I32, 1, "skip"), *skip_f32 = tu_tensor1(ctx, SG_DTYPE_F32, 1, "skip_f32");
    sg_tensor *skip2 = tu_tensor1(ctx, SG_DTYPE_I32, 2, "skip2"), *skip_other = tu_tensor1(other, SG_DTYPE_I32, 1, "skip_other");
    sg_tensor *plo = tu_tensor1(ctx, SG_DTYPE_BF16, P, "param_lo"), *plo_f32 = tu_tensor1(ctx, SG_DTYPE_F32, P, "plo_f32");
    sg_tensor *plo9 = tu_tensor1(ctx, SG_DTYPE_BF16, P - 1, "plo9");
    TU_OK(ctx, sg_tensor_fill(skip, 0));
    TU_OK(ctx, sg_tensor_fill(plo, 5.0));
    void *plo_before = tu_raw(plo);
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v, hp, ss, sd, 2, skip_f32, NULL), SG_ERR_DTYPE,
             "sg_adamw_step: tensor 'skip' is f32, expected i32");
    TU_FAILS(ctx, sg_sgd_step(ctx, p, g, m, hp, ss, sd, 2, skip2, NULL), SG_ERR_SHAPE,
             "sg_sgd_step: 'skip' (skip2) is (2) i32, expected 1 element (a flag, as sg_amp_unscale's found)");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v, hp, ss, sd, 2, skip_other, NULL), SG_ERR_BACKEND,
             "another context");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v, hp, ss, sd, 2, skip, plo_f32), SG_ERR_DTYPE,
             "tensor 'param_lo' is f32, expected bf16");
    TU_FAILS(ctx, sg_sgd_step(ctx, p, g, m, hp, ss, sd, 2, NULL, plo9), SG_ERR_SHAPE,
             "'param_lo' is (9) bf16 but 'param' is (10) f64");
    /* A view takes its base's dtype, and skip (i32) and param_lo (bf16) differ in dtype from
     * every tensor they could overlap, so the overlap checks are reached with forged tensors:
     * the same tensor pointing at another one's bytes. */
    sg_tensor lo_in_grad = *plo, skip_in_hp = *skip;
    lo_in_grad.data = g->data;
    skip_in_hp.data = hp->data;
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v, hp, ss, sd, 2, skip, &lo_in_grad), SG_ERR_INVALID,
             "output 'param_lo' overlaps 'grad'");
    TU_FAILS(ctx, sg_sgd_step(ctx, p, g, m, hp, ss, sd, 2, &skip_in_hp, plo), SG_ERR_INVALID,
             "output 'hp' overlaps 'skip'");
    expect_bits("param_lo after rejected calls", plo, plo_before);
    free(plo_before);

    /* Nothing was written by the failed calls, hp.step included. */
    sg_tensor *chk[4] = {p, m, v, hp};
    const char *names[4] = {"param", "m", "v", "hp"};
    for (int i = 0; i < 4; i++) {
        double *now = tu_get(chk[i]);
        char what[96];
        snprintf(what, sizeof what, "%s after rejected calls", names[i]);
        tu_close(what, now, before[i], chk[i]->numel, (tu_tol){0, 0});
        free(now);
        free(before[i]);
    }
    /* The context is usable afterwards: a valid step runs, counts itself and writes param_lo
     * (f64 params: through f32, then bf16). */
    TU_OK(ctx, sg_adamw_step(ctx, p, g, m, v, hp, ss, sd, 2, skip, plo));
    double *hn = tu_get(hp);
    TU_CHECK(hn[SG_HP_STEP] == 1, "hp.step is %g after one valid step", hn[SG_HP_STEP]);
    free(hn);
    expect_lo("cpu f64 param_lo after the errors", plo, p);
    sg_tensor *ts[] = {p, g, m, v, hp, ss, sd, ss_end, ss_down, ss_first, sd3, g_i32, g_f32,
                       m9, hp7, hp_i32, ss_f32, g_other, skip, skip_f32, skip2, skip_other, plo,
                       plo_f32, plo9};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
    sg_ctx_destroy(other);
    sg_ctx_destroy(ctx);
}

/* ---- bf16 state: stochastic rounding ---- */

/* The rounding itself on chosen values, against the rule written out here: the f32's low 16
 * bits plus r carry into the kept top half. A bf16 value is exact for every r; a value half a
 * unit above one rounds up iff r >= 0x8000 (either sign: the magnitude); the carry moves the
 * exponent at the top of a binade; inf and NaN keep their class. */
static void sr_rule(void)
{
    const float exact = 1.5f, half_up = 1.5f + 0x1p-8f, neg_half = -(1.5f + 0x1p-8f);
    uint32_t rs[4] = {0, 0x7fff, 0x8000, 0xffff};
    for (int k = 0; k < 4; k++) {
        uint32_t r = rs[k] | ((uint32_t)tu_randint(0, 0xffff) << 16); /* the high half is ignored */
        TU_CHECK(sg_bf16_round_stochastic(exact, r) == 0x3fc0, "sr: 1.5 with r 0x%x gave 0x%04x", r,
                 sg_bf16_round_stochastic(exact, r));
        uint16_t up = sg_bf16_round_stochastic(half_up, r), want = (rs[k] >= 0x8000) ? 0x3fc1 : 0x3fc0;
        TU_CHECK(up == want, "sr: 1.5 + 2^-8 with r 0x%x gave 0x%04x, expected 0x%04x", r, up, want);
        uint16_t dn = sg_bf16_round_stochastic(neg_half, r);
        TU_CHECK(dn == (uint16_t)(want | 0x8000), "sr: -(1.5 + 2^-8) with r 0x%x gave 0x%04x", r, dn);
    }
    /* Just under 2: 1.9921875 (0x3fff) + almost a unit: r = 0xffff carries into 2.0 (0x4000). */
    float top = 1.9921875f + 0x1p-7f * 0.99f;
    TU_CHECK(sg_bf16_round_stochastic(top, 0xffff) == 0x4000, "sr: carry across the binade");
    TU_CHECK(sg_bf16_round_stochastic(INFINITY, 0xffff) == 0x7f80, "sr: inf");
    TU_CHECK((sg_bf16_round_stochastic(NAN, 0xffff) & 0x7fff) > 0x7f80, "sr: NaN stayed a NaN");
}

/* One step from the same bf16-representable state, once with f32 state (A) and once with bf16
 * state (B), on ctx: the parameters must agree bit for bit (the update reads the new moments
 * before they are stored), and each bf16 state element must be the stochastic rounding of A's
 * f32 value with the documented bits (Philox at (i / 4, t), word i % 4, low half m or buf,
 * high half v), so the bits are neither always down nor always up. Then a second step on the
 * new state (B's rounded values copied into A) checks t = 2's bits. */
static void lowp_case(sg_ctx *ctx, int op, int64_t P, int n_seg, double momentum)
{
    const char *opname = op == OPT_ADAMW ? "adamw" : "sgd";
    int32_t *start = malloc((size_t)(n_seg + 1) * sizeof *start), *decay = malloc((size_t)n_seg * sizeof *decay);
    make_segments(P, n_seg, start, decay);
    sg_tensor *ss = int_tensor(ctx, start, n_seg + 1, "seg_start"), *sd = int_tensor(ctx, decay, n_seg, "seg_decay");
    opt_state a, b;
    const char *names[4] = {"param", "grad", op == OPT_ADAMW ? "m" : "buf", "v"};
    double lo[4] = {-1, -1, -0.1, 1e-3}, hi[4] = {1, 1, 0.1, 1e-2};
    for (int j = 0; j < 4; j++) {
        sg_dtype bdt = j >= 2 ? SG_DTYPE_BF16 : SG_DTYPE_F32;
        a.t[j] = tu_tensor1(ctx, SG_DTYPE_F32, P, names[j]);
        b.t[j] = tu_tensor1(ctx, bdt, P, names[j]);
        double *x = tu_random(b.t[j], lo[j], hi[j]); /* bf16 state: the values as rounded */
        free(x);
        x = tu_get(b.t[j]);
        tu_set(a.t[j], x);
        free(x);
    }
    double hv[8];
    hp_values(op, momentum, hv);
    a.hp = tu_tensor1(ctx, SG_DTYPE_F32, 8, "hp");
    b.hp = tu_tensor1(ctx, SG_DTYPE_F32, 8, "hp");
    tu_set(a.hp, hv);
    tu_set(b.hp, hv);
    int nstate = op == OPT_ADAMW ? 2 : 1;
    for (int t = 1; t <= 2; t++) {
        one_step(op, &a, ss, sd, n_seg, NULL, NULL);
        one_step(op, &b, ss, sd, n_seg, NULL, NULL);
        char what[160];
        snprintf(what, sizeof what, "%s bf16 state %s P=%lld step %d: param", ctx->backend == SG_BACKEND_CPU ? "cpu" : "gpu",
                 opname, (long long)P, t);
        void *pa = tu_raw(a.t[0]);
        expect_bits(what, b.t[0], pa);
        free(pa);
        int64_t ups = 0, downs = 0;
        for (int j = 0; j < nstate && (op == OPT_ADAMW || momentum != 0); j++) {
            float *x = tu_raw(a.t[2 + j]);
            uint16_t *y = tu_raw(b.t[2 + j]);
            int64_t bad = 0, first = -1;
            for (int64_t i = 0; i < P; i++) {
                uint32_t w = sg_optim_sr_bits((uint64_t)i / 4, (uint32_t)t).v[i % 4];
                uint16_t want = sg_bf16_round_stochastic(x[i], j ? w >> 16 : w & 0xffffu);
                if (y[i] != want && bad++ == 0) first = i;
                uint32_t xb;
                memcpy(&xb, &x[i], 4);
                if (xb & 0xffffu) {
                    if (y[i] == (uint16_t)(xb >> 16)) downs++;
                    else ups++;
                }
            }
            TU_CHECK(bad == 0, "%s bf16 state %s P=%lld step %d: %lld of %lld %s elements are not the "
                     "stochastic rounding of the f32 state; first [%lld]: 0x%04x for %.9g", ctx->backend == SG_BACKEND_CPU ? "cpu" : "gpu",
                     opname, (long long)P, t, (long long)bad, (long long)P, names[2 + j], (long long)first,
                     first >= 0 ? y[first] : 0, first >= 0 ? x[first] : 0.0);
            free(x);
            free(y);
            double *bv = tu_get(b.t[2 + j]); /* the next step starts from the same state */
            tu_set(a.t[2 + j], bv);
            free(bv);
        }
        /* Some inexact values went each way (at P >= 1000 the chance that all of more than
         * 500 fair-ish draws land one way is below 2^-500). */
        if (P >= 1000 && (op == OPT_ADAMW || momentum != 0))
            TU_CHECK(ups > 0 && downs > 0, "%s bf16 state %s: %lld rounded up, %lld down",
                     ctx->backend == SG_BACKEND_CPU ? "cpu" : "gpu", opname,
                     (long long)ups, (long long)downs);
        double *g = tu_random(a.t[1], -1, 1);
        tu_set(b.t[1], g);
        free(g);
    }
    for (int j = 0; j < 4; j++) sg_tensor_destroy(a.t[j]), sg_tensor_destroy(b.t[j]);
    sg_tensor *ts[] = {a.hp, b.hp, ss, sd};
    for (int i = 0; i < 4; i++) sg_tensor_destroy(ts[i]);
    free(start);
    free(decay);
}

/* The point of stochastic rounding: AdamW's v with beta2 = 0.999 under a constant gradient,
 * from v0 = g^2 / 2, for K steps (lr 0: the parameters stay). Exactly v_K = g^2 + (v0 - g^2)
 * b2^K. Rounding to nearest would never move v: each step's change, 0.001 (g^2 - v) <= 0.0005
 * g^2 = 0.001 v, is below half a bf16 unit (at least 2^-9 v = 0.00195 v), so v_K = v0 = 0.5 g^2
 * against 0.816 g^2 (K = 1000). With stochastic rounding each stored value is unbiased: its
 * error e has mean 0 and variance at most u^2 / 4 (u: one bf16 unit, at most 2^-7 of the value)
 * and is damped by b2 each later step, so an element's accumulated relative error has standard
 * deviation at most 2^-7 sqrt(1 / (4 (1 - b2^2))) = 0.087, and the mean over P = 2048 elements
 * 0.087 / sqrt(2048) = 0.0019. The bound 0.012 is 6 of those; the f32 arithmetic adds ~1e-7. */
static void sr_unbiased(sg_ctx *ctx)
{
    const int64_t P = 2048;
    const int K = 1000;
    int32_t start[2] = {0, (int32_t)P}, decay[1] = {0};
    sg_tensor *ss = int_tensor(ctx, start, 2, "seg_start"), *sd = int_tensor(ctx, decay, 1, "seg_decay");
    opt_state s;
    s.t[0] = tu_tensor1(ctx, SG_DTYPE_F32, P, "param");
    s.t[1] = tu_tensor1(ctx, SG_DTYPE_F32, P, "grad");
    s.t[2] = tu_tensor1(ctx, SG_DTYPE_BF16, P, "m");
    s.t[3] = tu_tensor1(ctx, SG_DTYPE_BF16, P, "v");
    double *p = tu_random(s.t[0], -1, 1);
    p = (free(p), tu_get(s.t[0])); /* as stored */
    double *g = malloc((size_t)P * sizeof *g), *v0 = malloc((size_t)P * sizeof *v0);
    for (int64_t i = 0; i < P; i++) {
        g[i] = tu_uniform(0.5, 2) * (tu_randint(0, 1) ? 1 : -1);
        v0[i] = g[i] * g[i] / 2;
    }
    tu_set(s.t[1], g);
    g = (free(g), tu_get(s.t[1])); /* as stored */
    tu_set(s.t[3], v0);
    free(v0);
    v0 = tu_get(s.t[3]);
    TU_OK(ctx, sg_tensor_fill(s.t[2], 0.0));
    double hv[8] = {0, 0.9, 0.999, 1e-8, 0, 0, 0, 0};
    s.hp = tu_tensor1(ctx, SG_DTYPE_F32, 8, "hp");
    tu_set(s.hp, hv);
    for (int k = 0; k < K; k++) one_step(OPT_ADAMW, &s, ss, sd, 1, NULL, NULL);
    double *v = tu_get(s.t[3]), mean = 0, b2k = pow(0.999, K);
    for (int64_t i = 0; i < P; i++) {
        double g2 = g[i] * g[i];
        mean += (v[i] / (g2 + (v0[i] - g2) * b2k) - 1) / (double)P;
    }
    TU_CHECK(fabs(mean) <= 0.012, "%s bf16 state: after %d steps v's mean relative error is %.5f (bound "
             "0.012; rounding to nearest would give about -0.39)", ctx->backend == SG_BACKEND_CPU ? "cpu" : "gpu",
             K, mean);
    double *pn = tu_get(s.t[0]);
    int64_t moved = 0;
    for (int64_t i = 0; i < P; i++) moved += pn[i] != p[i];
    TU_CHECK(moved == 0, "%s bf16 state: lr 0 moved %lld parameters", ctx->backend == SG_BACKEND_CPU ? "cpu" : "gpu",
             (long long)moved);
    free(p), free(pn), free(g), free(v0), free(v);
    for (int j = 0; j < 4; j++) sg_tensor_destroy(s.t[j]);
    sg_tensor_destroy(s.hp), sg_tensor_destroy(ss), sg_tensor_destroy(sd);
}

/* bf16 state against what it needs: one dtype for m and v, f32 parameters. */
static void lowp_errors(sg_ctx *ctx)
{
    const int64_t P = 8;
    int32_t st[2] = {0, 8}, dc[1] = {1};
    sg_tensor *ss = int_tensor(ctx, st, 2, "seg_start"), *sd = int_tensor(ctx, dc, 1, "seg_decay");
    sg_tensor *p = tu_tensor1(ctx, SG_DTYPE_F32, P, "param"), *g = tu_tensor1(ctx, SG_DTYPE_F32, P, "grad");
    sg_tensor *m = tu_tensor1(ctx, SG_DTYPE_BF16, P, "m"), *v32 = tu_tensor1(ctx, SG_DTYPE_F32, P, "v");
    sg_tensor *m7 = tu_tensor1(ctx, SG_DTYPE_BF16, P - 1, "m7"), *hp = tu_tensor1(ctx, SG_DTYPE_F32, 8, "hp");
    double hv[8];
    hp_values(OPT_ADAMW, 0, hv);
    tu_set(hp, hv);
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m, v32, hp, ss, sd, 1, NULL, NULL), SG_ERR_DTYPE, "one state dtype");
    TU_FAILS(ctx, sg_adamw_step(ctx, p, g, m7, m, hp, ss, sd, 1, NULL, NULL), SG_ERR_SHAPE, "'m'");
    if (ctx->backend == SG_BACKEND_CPU) {
        sg_tensor *p64 = tu_tensor1(ctx, SG_DTYPE_F64, P, "p64"), *g64 = tu_tensor1(ctx, SG_DTYPE_F64, P, "g64");
        TU_FAILS(ctx, sg_sgd_step(ctx, p64, g64, m, hp, ss, sd, 1, NULL, NULL), SG_ERR_DTYPE, "'buf'");
        sg_tensor_destroy(p64), sg_tensor_destroy(g64);
    }
    double *hn = tu_get(hp);
    TU_CHECK(hn[SG_HP_STEP] == 0, "bf16 state: hp.step is %g after rejected calls", hn[SG_HP_STEP]);
    free(hn);
    sg_tensor *ts[] = {ss, sd, p, g, m, v32, m7, hp};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

/* Every bf16-state check on ctx. */
static void lowp_tests(sg_ctx *ctx)
{
    lowp_case(ctx, OPT_ADAMW, 1000, 37, 0);
    lowp_case(ctx, OPT_ADAMW, 4099, 600, 0);
    lowp_case(ctx, OPT_SGD, 1000, 5, 0.9);
    lowp_case(ctx, OPT_SGD, 77, 3, 0); /* momentum 0: buf untouched (the rounding check skips) */
    lowp_case(ctx, OPT_ADAMW, 3, 2, 0);
    if (ctx->backend == SG_BACKEND_CUDA) lowp_case(ctx, OPT_ADAMW, (1 << 20) + 3, 9, 0);
    sr_unbiased(ctx);
    lowp_errors(ctx);
}

static void cpu_tests(void)
{
    for (int rep = 0; rep < 3; rep++) {
        cpu_run(OPT_ADAMW, SG_DTYPE_F64, 0);
        cpu_run(OPT_SGD, SG_DTYPE_F64, 0.9);
        cpu_run(OPT_SGD, SG_DTYPE_F64, 0); /* plain SGD: buf is left alone */
    }
    cpu_run(OPT_ADAMW, SG_DTYPE_F32, 0);
    cpu_run(OPT_SGD, SG_DTYPE_F32, 0.9);
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    mixed_case(ctx, OPT_ADAMW, SG_DTYPE_F32, 1000, 37, 0, 0);
    mixed_case(ctx, OPT_SGD, SG_DTYPE_F32, 1000, 37, 0.9, 0);
    mixed_case(ctx, OPT_SGD, SG_DTYPE_F32, 77, 3, 0, 1);
    mixed_case(ctx, OPT_ADAMW, SG_DTYPE_F64, 513, 5, 0, 2);
    mixed_case(ctx, OPT_SGD, SG_DTYPE_F64, 1, 1, 0.9, 0);
    sr_rule();
    lowp_tests(ctx);
    amp_case(ctx, OPT_ADAMW, SG_DTYPE_F32, 1000, 37, 0, 0);
    amp_case(ctx, OPT_ADAMW, SG_DTYPE_BF16, 513, 5, 0, 1);
    amp_case(ctx, OPT_SGD, SG_DTYPE_F32, 77, 3, 0.9, 0);
    amp_case_clip(ctx, OPT_ADAMW, SG_DTYPE_F32, SG_DTYPE_BF16, 1000, 37, 0, 0, true);
    amp_case_clip(ctx, OPT_SGD, SG_DTYPE_BF16, SG_DTYPE_BF16, 77, 3, 0.9, 1, true);
    amp_case_clip(ctx, OPT_ADAMW, SG_DTYPE_F32, SG_DTYPE_F32, 513, 5, 0, 1, true); /* f32 scaled gradients */
    amp_errors(ctx);
    sg_ctx_destroy(ctx);
    cpu_errors();
}

/* ---- gpu ---- */

/* N_STEPS steps of the CUDA kernel and of the CPU reference (both f32) from the same state,
 * compared after every step. misaligned: the GPU buffers are views at element 1 of larger
 * tensors, so the kernel takes its scalar path. */
static void gpu_run(sg_ctx *gpu, sg_ctx *cpu, int op, int64_t P, int n_seg, double momentum,
                    int misaligned)
{
    const char *opname = op == OPT_ADAMW ? "adamw" : "sgd";
    int32_t *start = malloc((size_t)(n_seg + 1) * sizeof *start), *decay = malloc((size_t)n_seg * sizeof *decay);
    make_segments(P, n_seg, start, decay);
    sg_tensor *ssc = int_tensor(cpu, start, n_seg + 1, "seg_start"), *sdc = int_tensor(cpu, decay, n_seg, "seg_decay");
    sg_tensor *ssg = tu_clone_to(gpu, ssc, SG_DTYPE_I32), *sdg = tu_clone_to(gpu, sdc, SG_DTYPE_I32);
    const char *names[4] = {"param", "grad", op == OPT_ADAMW ? "m" : "buf", "v"};
    sg_tensor *base[4] = {NULL}, *tg[4], *tc[4];
    for (int j = 0; j < 4; j++) {
        if (misaligned) {
            int64_t n1 = P + 1;
            base[j] = tu_tensor1(gpu, SG_DTYPE_F32, n1, "base");
            TU_OK(gpu, sg_tensor_view(base[j], 1, 1, &P, names[j], &tg[j]));
        } else {
            tg[j] = tu_tensor1(gpu, SG_DTYPE_F32, P, names[j]);
        }
        tc[j] = tu_tensor1(cpu, SG_DTYPE_F32, P, names[j]);
    }
    /* v >= 1e-3 bounds |mhat| / sqrt(vhat) by about 1.9 over these steps, so AdamW's update
     * is at most 0.038 (its lr <= 0.02). The kernel's powf bias corrections (fp32, as
     * PyTorch's fused path; CUDA documents up to 4 ulp) can make 1 - b2^t off by 2.4e-4
     * relative at worst (t = 1, where it is 1e-3), which moves the update by at most
     * 0.038 * 1.2e-4 = 4.6e-6: inside the f32 rule's atol even for a parameter near 0, so
     * no override is needed. */
    double lo[4] = {-1, -1, -0.1, 1e-3}, hi[4] = {1, 1, 0.1, 1e-2};
    for (int j = 0; j < 4; j++) {
        double *x = tu_random(tg[j], lo[j], hi[j]);
        tu_set(tc[j], x); /* the same f32 values on both sides */
        free(x);
    }
    double hv[8];
    hp_values(op, momentum, hv);
    sg_tensor *hpg = tu_tensor1(gpu, SG_DTYPE_F32, 8, "hp"), *hpc = tu_tensor1(cpu, SG_DTYPE_F32, 8, "hp");
    tu_set(hpg, hv);
    tu_set(hpc, hv);
    for (int st = 0; st < N_STEPS; st++) {
        if (st > 0) { /* lr changes between steps by a device write: no new launch setup */
            double lr = op == OPT_ADAMW ? tu_uniform(0.001, 0.02) : tu_uniform(0.005, 0.05);
            hp_write(hpg, SG_HP_LR, lr);
            hp_write(hpc, SG_HP_LR, lr);
        }
        double *gv = tu_random(tg[1], -1, 1);
        tu_set(tc[1], gv);
        free(gv);
        uint64_t before = sg_ctx_launch_count(gpu);
        if (op == OPT_ADAMW) {
            TU_OK(gpu, sg_adamw_step(gpu, tg[0], tg[1], tg[2], tg[3], hpg, ssg, sdg, n_seg, NULL,
                                     NULL));
            TU_OK(cpu, sg_adamw_step(cpu, tc[0], tc[1], tc[2], tc[3], hpc, ssc, sdc, n_seg, NULL,
                                     NULL));
        } else {
            TU_OK(gpu, sg_sgd_step(gpu, tg[0], tg[1], tg[2], hpg, ssg, sdg, n_seg, NULL, NULL));
            TU_OK(cpu, sg_sgd_step(cpu, tc[0], tc[1], tc[2], hpc, ssc, sdc, n_seg, NULL, NULL));
        }
        uint64_t launches = sg_ctx_launch_count(gpu) - before;
        TU_CHECK(launches == 1, "gpu %s P=%lld: %llu launches for one step, expected 1", opname,
                 (long long)P, (unsigned long long)launches);
        char what[160];
        for (int j = 0; j < 4; j++) {
            if (j == 1 || (j == 3 && op != OPT_ADAMW)) continue;
            snprintf(what, sizeof what, "gpu %s P=%lld n_seg=%d momentum %g%s: %s after step %d",
                     opname, (long long)P, n_seg, momentum, misaligned ? " misaligned" : "",
                     names[j], st + 1);
            /* fp32 kernel against the double-computed reference stored in f32: the default
             * f32 rule (see the bound on AdamW's powf above; SGD has no transcendental). */
            tu_close_tensors(what, tg[j], tc[j], tu_tol_for(SG_DTYPE_F32));
        }
        /* hp: step incremented once, nothing else touched; bit-exact. */
        snprintf(what, sizeof what, "gpu %s P=%lld: hp after step %d", opname, (long long)P, st + 1);
        tu_close_tensors(what, hpg, hpc, (tu_tol){0, 0});
        double *hn = tu_get(hpg);
        TU_CHECK(hn[SG_HP_STEP] == st + 1, "gpu %s P=%lld: hp.step is %g after %d steps", opname,
                 (long long)P, hn[SG_HP_STEP], st + 1);
        free(hn);
        /* The "last block done" counter is back at 0 for the next launch or replay. */
        double *cnt = tu_get(gpu->scratch[SG_SLOT_OPTIM]);
        TU_CHECK(cnt[0] == 0, "gpu %s P=%lld: the block counter is %g after step %d, expected 0",
                 opname, (long long)P, cnt[0], st + 1);
        free(cnt);
    }
    for (int j = 0; j < 4; j++) {
        sg_tensor_destroy(tg[j]);
        sg_tensor_destroy(base[j]);
        sg_tensor_destroy(tc[j]);
    }
    sg_tensor *ts[] = {ssc, sdc, ssg, sdg, hpg, hpc};
    for (int i = 0; i < 6; i++) sg_tensor_destroy(ts[i]);
    free(start);
    free(decay);
}

/* The checks CUDA can make without reading device memory: dtypes, sizes, contexts. */
static void gpu_errors(sg_ctx *gpu, sg_ctx *cpu)
{
    const int64_t P = 8;
    int32_t st[3] = {0, 3, 8}, dc[2] = {1, 0};
    sg_tensor *p = tu_tensor1(gpu, SG_DTYPE_F32, P, "param"), *g = tu_tensor1(gpu, SG_DTYPE_F32, P, "grad");
    sg_tensor *m = tu_tensor1(gpu, SG_DTYPE_F32, P, "m"), *v = tu_tensor1(gpu, SG_DTYPE_F32, P, "v");
    sg_tensor *hp = tu_tensor1(gpu, SG_DTYPE_F32, 8, "hp"), *g_bf16 = tu_tensor1(gpu, SG_DTYPE_BF16, P, "g_bf16");
    sg_tensor *ssc = int_tensor(cpu, st, 3, "seg_start_host"), *sdc = int_tensor(cpu, dc, 2, "seg_decay_host");
    sg_tensor *ss = tu_clone_to(gpu, ssc, SG_DTYPE_I32), *sd = tu_clone_to(gpu, sdc, SG_DTYPE_I32);
    sg_tensor *ss_f32 = tu_tensor1(gpu, SG_DTYPE_F32, 3, "ss_f32");
    double hv[8];
    hp_values(OPT_ADAMW, 0, hv);
    tu_set(hp, hv);
    TU_FAILS(gpu, sg_adamw_step(gpu, p, g_bf16, m, v, hp, ss, sd, 2, NULL, NULL), SG_ERR_DTYPE, "'grad'");
    TU_FAILS(gpu, sg_adamw_step(gpu, p, g, m, v, hp, ss_f32, sd, 2, NULL, NULL), SG_ERR_DTYPE, "'seg_start'");
    TU_FAILS(gpu, sg_adamw_step(gpu, p, g, m, v, hp, ssc, sdc, 2, NULL, NULL), SG_ERR_BACKEND, "another context");
    TU_FAILS(gpu, sg_sgd_step(gpu, p, g, m, hp, ss, sd, 3, NULL, NULL), SG_ERR_SHAPE, "'seg_start'");
    sg_tensor *skip_f32 = tu_tensor1(gpu, SG_DTYPE_F32, 1, "skip_f32");
    sg_tensor *plo_cpu = tu_tensor1(cpu, SG_DTYPE_BF16, P, "plo_cpu");
    TU_FAILS(gpu, sg_adamw_step(gpu, p, g, m, v, hp, ss, sd, 2, skip_f32, g_bf16), SG_ERR_DTYPE,
             "'skip'");
    TU_FAILS(gpu, sg_sgd_step(gpu, p, g, m, hp, ss, sd, 2, NULL, plo_cpu), SG_ERR_BACKEND,
             "another context");
    TU_FAILS(gpu, sg_adamw_step(gpu, p, g, m, v, hp, ss, sd, 2, NULL, v), SG_ERR_DTYPE,
             "tensor 'param_lo' is f32, expected bf16");
    double *hn = tu_get(hp);
    TU_CHECK(hn[SG_HP_STEP] == 0, "gpu: hp.step is %g after rejected calls", hn[SG_HP_STEP]);
    free(hn);
    sg_tensor *ts[] = {p, g, m, v, hp, g_bf16, ssc, sdc, ss, sd, ss_f32, skip_f32, plo_cpu};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

static void gpu_tests(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    /* The first step of a context allocates and zero-fills the block counter (one more
     * launch); an optimizer reserves it up front, as here, so that every step is one launch. */
    void *counter;
    TU_OK(gpu, sg_ctx_scratch(gpu, SG_SLOT_OPTIM, SG_OPTIM_SCRATCH_BYTES, &counter));
    /* (P, n_seg): single elements, the float4 tail (in a chunk's first float4s, and 7170: in
     * its second, the kernel's loop trip taking two float4s a thread), many tiny segments per
     * block chunk, one block per chunk, and more chunks than blocks (the grid-stride loop: a block's next chunk
     * in the segment it left, or many segments on, which the kernel searches from where it
     * was). */
    struct { int64_t P; int n_seg; } cases[] = {
        {1, 1}, {3, 2}, {1000, 37}, {4099, 600}, {7170, 50}, {(1 << 20) + 3, 9}, {(1 << 22) + 5, 17}, {(3 << 20) + 1, 1500}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        gpu_run(gpu, cpu, OPT_ADAMW, cases[c].P, cases[c].n_seg, 0, 0);
        gpu_run(gpu, cpu, OPT_SGD, cases[c].P, cases[c].n_seg, 0.9, 0);
    }
    gpu_run(gpu, cpu, OPT_SGD, 1000, 5, 0, 0); /* momentum 0: buf must stay untouched */
    gpu_run(gpu, cpu, OPT_ADAMW, 1001, 7, 0, 1);
    gpu_run(gpu, cpu, OPT_SGD, 1001, 7, 0.9, 1);
    /* skip and param_lo: the same sizes up to a million (the float4 path and its tail), plain
     * SGD, param_lo alone misaligned, everything misaligned. */
    for (size_t c = 0; c < 5; c++) {
        mixed_case(gpu, OPT_ADAMW, SG_DTYPE_F32, cases[c].P, cases[c].n_seg, 0, 0);
        mixed_case(gpu, OPT_SGD, SG_DTYPE_F32, cases[c].P, cases[c].n_seg, 0.9, 0);
    }
    mixed_case(gpu, OPT_SGD, SG_DTYPE_F32, 1000, 5, 0, 0);
    mixed_case(gpu, OPT_ADAMW, SG_DTYPE_F32, 1001, 7, 0, 1);
    mixed_case(gpu, OPT_SGD, SG_DTYPE_F32, 1001, 7, 0.9, 2);
    gpu_errors(gpu, cpu);
    lowp_tests(gpu);
    /* the unscale folded into the step: the float4 path and its tail, the scalar path, many
     * blocks */
    amp_case(gpu, OPT_ADAMW, SG_DTYPE_F32, 1000, 37, 0, 0);
    amp_case(gpu, OPT_ADAMW, SG_DTYPE_BF16, 4099, 600, 0, 0);
    amp_case(gpu, OPT_ADAMW, SG_DTYPE_F32, 1001, 7, 0, 1);
    amp_case(gpu, OPT_SGD, SG_DTYPE_BF16, (1 << 20) + 3, 9, 0.9, 0);
    amp_case(gpu, OPT_ADAMW, SG_DTYPE_F32, (1 << 22) + 5, 17, 0, 0);
    /* and clipping folded with it: the float4 paths, the scalar ones, a grid of many blocks */
    amp_case_clip(gpu, OPT_ADAMW, SG_DTYPE_F32, SG_DTYPE_BF16, 1000, 37, 0, 0, true);
    amp_case_clip(gpu, OPT_SGD, SG_DTYPE_BF16, SG_DTYPE_BF16, 1001, 7, 0.9, 1, true);
    amp_case_clip(gpu, OPT_ADAMW, SG_DTYPE_BF16, SG_DTYPE_BF16, (1 << 22) + 5, 17, 0, 0, true);
    amp_case_clip(gpu, OPT_ADAMW, SG_DTYPE_F32, SG_DTYPE_F32, 4099, 9, 0, 0, true); /* f32 scaled gradients */
    amp_case_clip(gpu, OPT_SGD, SG_DTYPE_F32, SG_DTYPE_F32, 1001, 7, 0.9, 1, true);
    amp_errors(gpu);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_optim");
    if (!strcmp(mode, "gpu")) gpu_tests();
    else cpu_tests();
    return tu_finish("test_optim");
}
