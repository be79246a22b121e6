/* test_attention_fused.c: fused causal attention (sg_attention_fused_forward / _backward).
 * `cpu`: the reference in f64 against the unfused op (out, and dqkv from the same dout), lse
 * against the log-sum-exp of the unfused probabilities' scores, delta = dout . out, float64
 * finite differences of the whole (forward, backward) pair at T = 1 and T > 1, one and two
 * heads; argument errors. `gpu`: the bf16 tensor-core kernels against the CPU reference on
 * the same bf16 values, and the f32 kernels against it in f64 on the same f32 values (T = 1,
 * T not a multiple of the 64-row tile, exactly one and several tiles, heads 1, 2 and 12; f32
 * also head sizes 32, 128 and, padded inside the kernels, 48, 4 and 100, and a problem with
 * enough tiles for the 64-row blocks, the others running the 32-row ones), outputs poisoned
 * first, within the bounds derived below; the same problem twice gives the same bits
 * (deterministic backward); fused against the unfused CUDA path of the same dtype; a captured
 * forward + backward replayed bit-exact against eager (bf16, f32); what CUDA refuses (bf16
 * head size 32, f32 head sizes 132 and 6, views that are not 16-byte aligned).
 *
 * The bf16 bound. The CPU reference computes in double from the bf16 inputs and rounds each
 * output once; the forward is compared with its forward, the backward with its backward given
 * the kernels' own out and lse (the backward's inputs). The kernels differ from it by: the
 * probabilities P rounded to bf16 before P v (relative e = 2^-9 each, plus exp2f's error on
 * arguments up to |score| + |lse|), d(scores) dS rounded to bf16 before dS k and dS^T q
 * (relative e each), the f32 sums dout . v and dout . out inside dS (hs terms of at most
 * max|dout| max|v| each: a32 = 2 hs 2^-24 hs max|dout| max|v| absolute), and their own
 * rounding of each output (one bf16 ulp where the two land on either side of a rounding
 * boundary: 2^-8 |ref|). So
 *   out:  e max|v|                               (sum_s P = 1)
 *   dv_s: e max_s sum_t P[t,s] max|dout|
 *   dq_t: (e max_t sum_s |dS[t,s]| + a32) max|k| / sqrt(hs);  dk_s: the same with columns
 *         (a32 times the column sums of P), max|q|
 * each doubled for the second-order terms, plus rtol 2^-8 (the output rounding), and lse
 * within 4 hs 2^-24 max|score| + 2^-20 (1 + |lse|) (f32 scores, exp2f and log2f). The sums of
 * P and |dS| are taken from an f64 run of the unfused reference on the same values.
 *
 * The f32 bound: the same formulas (derive()), with e the relative error of each P the f32
 * kernels compute and hold, u = 2^-24, worst cases of recursive f32 sums (n terms: (n-1) u
 * times the sum of their magnitudes, whatever the order):
 *   - the score q . k, a sequential FMA sum of hs terms: hs u sum_i |q_i k_i|, at most
 *     hs u A with A = max over causal pairs of sum_i |q_i k_i| / sqrt(hs) (after the scale);
 *   - the roundings of score * log2(e)/sqrt(hs) (constant and product), of lse log2(e) in the
 *     backward (constant and product), and of the exponent's subtraction: at most
 *     4 u max|score| + 3 u max|lse| in natural units, max|score| <= A;
 *   - exp2f: 2 ulp, 2^-22 relative;
 *   - the sums over keys (P v, dS k) or queries (P^T dout, dS^T q): one FMA chain of up to T
 *     terms per output, T u relative to the sum of magnitudes (which the formulas above
 *     already bound by e times it), the forward's rescaling by alpha once per 64-key tile (nk
 *     roundings on o, nk on l: an error common to a row's P cancels in o / l, only these
 *     roundings stay), l's sum (at most T / 16 + 4 + nk terms in a chain and a 16-lane
 *     tree), 1 / l and o / l, d(scores)' subtraction and product, and dq, dk's scale: 4 u.
 * So e = u (hs A + 4 A + 3 max|lse| + T + nk + 4) + 2^-22 (f32_e), with a32 as for bf16
 * (delta and dout . v are hs-term f32 sums in both); out, dq, dk, dv then as above (the
 * doubling covers out's two-sided P error, Sum p' v / Sum p' within 2 e max|v|); lse within
 * 2 e (the scores' and l's errors, log2f's ulp on log2(l) <= log2(T), the roundings of
 * m + log2(l) and of the division by log2(e)). rtol 2^-23: the reference's F32 lse and
 * delta are rounded once. These are worst cases, far above the errors seen (about 1e-7 on
 * O(1) values, the bound about 1e-5 at hs 64): an indexing or masking slip costs 1e-2 or more. */
#include "testutil.h"

typedef struct {
    int64_t B, T, C;
    int H;
} dims;

typedef struct {
    sg_tensor *qkv, *out, *lse, *dout, *dqkv, *delta;
} fused_set;

static fused_set make_set(sg_ctx *ctx, sg_dtype dt, dims d)
{
    const int64_t q[2] = {d.B * d.T, 3 * d.C}, o[2] = {d.B * d.T, d.C}, l[3] = {d.B, d.H, d.T};
    fused_set s = {tu_keep(tu_tensor(ctx, dt, 2, q, "qkv")),  tu_keep(tu_tensor(ctx, dt, 2, o, "out")),
                   tu_keep(tu_tensor(ctx, SG_DTYPE_F32, 3, l, "lse")), tu_keep(tu_tensor(ctx, dt, 2, o, "dout")),
                   tu_keep(tu_tensor(ctx, dt, 2, q, "dqkv")), tu_keep(tu_tensor(ctx, SG_DTYPE_F32, 3, l, "delta"))};
    return s;
}

static void run(sg_ctx *ctx, const fused_set *s, dims d)
{
    TU_OK(ctx, sg_attention_fused_forward(ctx, s->qkv, d.H, s->out, s->lse));
    TU_OK(ctx, sg_attention_fused_backward(ctx, s->qkv, s->out, s->lse, s->dout, d.H, s->dqkv, s->delta));
}

/* ---- cpu ---- */

/* The unfused f64 reference on the same values: out, att and dqkv. */
typedef struct {
    sg_tensor *out, *att, *work, *dqkv;
} unfused;

static unfused unfused_run(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *dout, dims d)
{
    const int64_t o[2] = {d.B * d.T, d.C}, a[4] = {d.B, d.H, d.T, d.T};
    const int64_t wn = sg_attention_work_elems(d.B, d.T, d.C, d.H);
    unfused u = {tu_keep(tu_tensor(ctx, SG_DTYPE_F64, 2, o, "u.out")),
                 tu_keep(tu_tensor(ctx, SG_DTYPE_F64, 4, a, "u.att")),
                 tu_keep(tu_tensor1(ctx, SG_DTYPE_F32, wn, "u.work")),
                 tu_keep(tu_tensor(ctx, SG_DTYPE_F64, 2, qkv->shape, "u.dqkv"))};
    TU_OK(ctx, sg_attention_forward(ctx, qkv, d.H, u.out, u.att, u.work));
    TU_OK(ctx, sg_attention_backward(ctx, qkv, u.att, dout, d.H, u.dqkv, u.work));
    return u;
}

/* The bound of the header comment, from the unfused f64 reference on the values x (qkv) and g
 * (dout), for a relative error e of each P and dS the products read; f32: the kernels' f32
 * sums of dout . v and dout . out too. */
typedef struct {
    double out, dq, dk, dv, lse;
    double dq_o, dk_o; /* what an out off by its bound and one bf16 rounding moves dq, dk by
                        * (through delta = dout . out): for comparisons with other paths */
    double dq_u, dk_u; /* the same per unit of error in every element of out */
} bounds;

static bounds derive(sg_ctx *cpu, const double *x, const double *g, dims d, double e, double au)
{
    const int64_t T = d.T, C = d.C, H = d.H, hs = C / H, n = d.B * T;
    const int64_t q[2] = {n, 3 * C}, o[2] = {n, C};
    sg_tensor *xq = tu_keep(tu_tensor(cpu, SG_DTYPE_F64, 2, q, "x")), *go = tu_keep(tu_tensor(cpu, SG_DTYPE_F64, 2, o, "g"));
    tu_set(xq, x), tu_set(go, g);
    unfused u = unfused_run(cpu, xq, go, d);
    double *att = tu_get(u.att), *out = tu_get(u.out);
    double mq = 0, mk = 0, mv = 0, mg = 0, ms = 0, colP = 0, rowS = 0, colS = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < C; c++) {
            mq = fmax(mq, fabs(x[i * 3 * C + c])), mk = fmax(mk, fabs(x[i * 3 * C + C + c]));
            mv = fmax(mv, fabs(x[i * 3 * C + 2 * C + c])), mg = fmax(mg, fabs(g[i * C + c]));
        }
    double *cs = calloc((size_t)T, sizeof *cs), *cd = calloc((size_t)T, sizeof *cd);
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < H; h++) {
            for (int64_t s = 0; s < T; s++) cs[s] = cd[s] = 0;
            for (int64_t t = 0; t < T; t++) {
                const double *p = att + ((b * H + h) * T + t) * T, *gt = g + (b * T + t) * C + h * hs;
                double dl = 0, rs = 0;
                for (int64_t i = 0; i < hs; i++) dl += gt[i] * out[(b * T + t) * C + h * hs + i];
                for (int64_t s = 0; s <= t; s++) {
                    double dp = 0, sc = 0;
                    for (int64_t i = 0; i < hs; i++) {
                        dp += gt[i] * x[(b * T + s) * 3 * C + 2 * C + h * hs + i];
                        sc += x[(b * T + t) * 3 * C + h * hs + i] * x[(b * T + s) * 3 * C + C + h * hs + i];
                    }
                    ms = fmax(ms, fabs(sc) / sqrt((double)hs));
                    double ds = fabs(p[s] * (dp - dl));
                    rs += ds, cd[s] += ds, cs[s] += p[s];
                }
                rowS = fmax(rowS, rs);
            }
            for (int64_t s = 0; s < T; s++) colP = fmax(colP, cs[s]), colS = fmax(colS, cd[s]);
        }
    const double sc = 1 / sqrt((double)hs);
    /* a32: the sums of dout . v and dout . out (hs terms, each at most mg mv) in d(scores), each
     * term within au of itself (f32: hs 2^-24, the chain's worst case; TF32 adds its operands'
     * two roundings, 2^-10) */
    const double a32 = 2 * hs * au * mg * mv;
    const double od = 2 * e * mv + 0x1p-8 * mv, du = sc * hs * mg;
    bounds r = {2 * e * mv, 2 * e * rowS * mk * sc + 2 * sc * a32 * mk, 2 * e * colS * mq * sc + 2 * sc * a32 * colP * mq,
                2 * e * colP * mg, 4 * (double)hs * 0x1p-24 * ms, du * od * mk, du * od * colP * mq,
                du * mk, du * colP * mq};
    free(att), free(out), free(cs), free(cd);
    return r;
}

static void cpu_against_unfused(sg_ctx *ctx, dims d)
{
    char w[160];
    snprintf(w, sizeof w, "f64 B=%lld T=%lld C=%lld heads=%d", (long long)d.B, (long long)d.T, (long long)d.C, d.H);
    fused_set s = make_set(ctx, SG_DTYPE_F64, d);
    double *x = tu_random(s.qkv, -1, 1), *g = tu_random(s.dout, -1, 1);
    tu_poison(s.out), tu_poison(s.lse), tu_poison(s.dqkv), tu_poison(s.delta);
    run(ctx, &s, d);
    unfused u = unfused_run(ctx, s.qkv, s.dout, d);
    const tu_tol t64 = tu_tol_for(SG_DTYPE_F64);
    char l[200];
    snprintf(l, sizeof l, "%s: out vs unfused", w);
    tu_close_tensors(l, s.out, u.out, t64);
    /* The backward recomputes P from lse, which is F32: each P off by a relative
     * 2^-24 |lse| at most, so the bound of the header comment with e = 2^-24 (max|lse| + 1). */
    double *lv = tu_get(s.lse), ml = 0;
    for (int64_t i = 0; i < s.lse->numel; i++) ml = fmax(ml, fabs(lv[i]));
    free(lv);
    bounds bd = derive(ctx, x, g, d, 0x1p-24 * (ml + 1), 0);
    snprintf(l, sizeof l, "%s: dqkv vs unfused", w);
    tu_close_tensors(l, s.dqkv, u.dqkv, (tu_tol){fmax(bd.dq, fmax(bd.dk, bd.dv)) + t64.atol, t64.rtol});
    /* lse: log sum_s exp(score) from the scores themselves; delta: dout . out. */
    const int64_t T = d.T, C = d.C, H = d.H, hs = C / H;
    double *lse = tu_get(s.lse), *dl = tu_get(s.delta), *out = tu_get(s.out);
    double *rl = malloc((size_t)(d.B * H * T) * sizeof *rl), *rd = malloc((size_t)(d.B * H * T) * sizeof *rd);
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                double z = 0, dd = 0;
                for (int64_t r = 0; r <= t; r++) {
                    double sc = 0;
                    for (int64_t i = 0; i < hs; i++)
                        sc += x[(b * T + t) * 3 * C + h * hs + i] * x[(b * T + r) * 3 * C + C + h * hs + i];
                    z += exp(sc / sqrt((double)hs));
                }
                for (int64_t i = 0; i < hs; i++) dd += g[(b * T + t) * C + h * hs + i] * out[(b * T + t) * C + h * hs + i];
                rl[(b * H + h) * T + t] = log(z), rd[(b * H + h) * T + t] = dd;
            }
    /* lse and delta are F32: one rounding of the double. */
    const tu_tol t32 = {1e-12, 0x1p-23};
    snprintf(l, sizeof l, "%s: lse", w);
    tu_close(l, lse, rl, d.B * H * T, t32);
    snprintf(l, sizeof l, "%s: delta", w);
    tu_close(l, dl, rd, d.B * H * T, (tu_tol){1e-300, 0x1p-23});
    free(x), free(g), free(lse), free(dl), free(out), free(rl), free(rd);
    tu_free_live();
}

/* Finite differences: loss = sum(r * out(qkv)); the backward with dout = r is dloss/dqkv. */
typedef struct {
    sg_ctx *ctx;
    fused_set s;
    dims d;
} fd_state;

static double fd_loss(void *u)
{
    fd_state *f = u;
    TU_OK(f->ctx, sg_attention_fused_forward(f->ctx, f->s.qkv, f->d.H, f->s.out, f->s.lse));
    return tu_dot(f->s.out, f->s.dout);
}

static void cpu_gradcheck(sg_ctx *ctx, dims d)
{
    fd_state f = {ctx, make_set(ctx, SG_DTYPE_F64, d), d};
    double *x = tu_random(f.s.qkv, -1, 1), *g = tu_random(f.s.dout, -1, 1);
    run(ctx, &f.s, d);
    /* The analytic side recomputes P from the F32 lse (cpu_against_unfused): its bound, with
     * e = 2^-24 (max|lse| + 1), on top of the differences' truncation (h^2) and rounding
     * (2^-52 / h), far under 1e-8. */
    double *lv = tu_get(f.s.lse), ml = 0;
    for (int64_t i = 0; i < f.s.lse->numel; i++) ml = fmax(ml, fabs(lv[i]));
    bounds bd = derive(ctx, x, g, d, 0x1p-24 * (ml + 1), 0);
    free(lv), free(x), free(g);
    char w[96];
    snprintf(w, sizeof w, "fused attention B=%lld T=%lld C=%lld heads=%d", (long long)d.B, (long long)d.T,
             (long long)d.C, d.H);
    /* Central differences with h = 1e-5 on O(1) values: truncation ~h^2, rounding ~1e-16/h. */
    tu_gradcheck(w, fd_loss, &f, f.s.qkv, f.s.dqkv, 60, 1e-5, (tu_tol){1e-8 + fmax(bd.dq, fmax(bd.dk, bd.dv)), 1e-6});
    tu_free_live();
}

static void cpu_errors(sg_ctx *ctx)
{
    dims d = {2, 5, 8, 2};
    fused_set s = make_set(ctx, SG_DTYPE_F32, d);
    free(tu_random(s.qkv, -1, 1));
    free(tu_random(s.dout, -1, 1));
    TU_FAILS(ctx, sg_attention_fused_forward(ctx, s.qkv, 3, s.out, s.lse), SG_ERR_SHAPE, "does not divide");
    TU_FAILS(ctx, sg_attention_fused_forward(ctx, s.qkv, 0, s.out, s.lse), SG_ERR_INVALID, "heads is 0");
    sg_tensor *bad = tu_keep(tu_tensor(ctx, SG_DTYPE_F32, 3, (int64_t[]){2, 2, 6}, "lse6"));
    TU_FAILS(ctx, sg_attention_fused_forward(ctx, s.qkv, 2, s.out, bad), SG_ERR_SHAPE, "'lse'");
    sg_tensor *lse64 = tu_keep(tu_tensor(ctx, SG_DTYPE_F64, 3, (int64_t[]){2, 2, 5}, "lse64"));
    TU_FAILS(ctx, sg_attention_fused_forward(ctx, s.qkv, 2, s.out, lse64), SG_ERR_DTYPE, "lse");
    TU_FAILS(ctx, sg_attention_fused_forward(ctx, s.qkv, 2, s.qkv, s.lse), SG_ERR_SHAPE, "'out'");
    TU_FAILS(ctx, sg_attention_fused_backward(ctx, s.qkv, s.out, s.lse, s.dout, 2, s.dqkv, bad), SG_ERR_SHAPE,
             "'delta'");
    TU_FAILS(ctx, sg_attention_fused_backward(ctx, s.qkv, s.out, s.lse, s.dout, 2, s.qkv, s.delta), SG_ERR_INVALID,
             "overlap");
    TU_CHECK(sg_attention_fused_supported(ctx, SG_DTYPE_F32, 8, 2) && !sg_attention_fused_supported(ctx, SG_DTYPE_F32, 8, 3),
             "supported on the CPU: any head size dividing C");
    /* Still usable: a call that is right runs. */
    run(ctx, &s, d);
    tu_free_live();
}

/* ---- gpu ---- */

/* e for the f32 kernels (header comment): the relative error of each P they compute, from the
 * largest sum_i |q_i k_i| / sqrt(hs) over the causal (query, key) pairs of x and max|lse|. su:
 * the relative rounding of each product operand (0 in f32; TF32 2^-11): the scores then move by
 * 2 su A, and P's with lse's as much again (4 su A), and each term of a product that reads P or
 * dS carries that operand's rounding and the other's (2 su). */
static double f32_e(const double *x, dims d, double ml, double su)
{
    const int64_t T = d.T, C = d.C, H = d.H, hs = C / H;
    double ma = 0;
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t s = 0; s <= t; s++) {
                    const double *q = x + (b * T + t) * 3 * C + h * hs, *k = x + (b * T + s) * 3 * C + C + h * hs;
                    double a = 0;
                    for (int64_t i = 0; i < hs; i++) a += fabs(q[i] * k[i]);
                    ma = fmax(ma, a);
                }
    ma /= sqrt((double)hs);
    const double u = 0x1p-24, nk = (double)((T + 63) / 64);
    return u * ((double)hs * ma + 4 * ma + 3 * ml + (double)T + nk + 4) + 0x1p-22 + 4 * su * ma + 2 * su;
}

static double max_abs(const sg_tensor *t)
{
    double *v = tu_get(t), m = 0;
    for (int64_t i = 0; i < t->numel; i++) m = fmax(m, fabs(v[i]));
    free(v);
    return m;
}

/* The kernels of dtype dt against the CPU reference on the same values (bf16: the reference
 * in bf16, which computes in double and rounds its outputs; f32: the reference in f64). */
static void gpu_against_cpu(sg_ctx *gpu, sg_ctx *cpu, sg_dtype dt, dims d, bool tf32)
{
    const bool bf = dt == SG_DTYPE_BF16;
    char w[160];
    snprintf(w, sizeof w, "%s%s B=%lld T=%lld C=%lld heads=%d", sg_dtype_name(dt), tf32 ? " (TF32)" : "",
             (long long)d.B, (long long)d.T, (long long)d.C, d.H);
    fused_set gs = make_set(gpu, dt, d);
    double *x = tu_random(gs.qkv, -1, 1), *g = tu_random(gs.dout, -1, 1);
    /* the values as the GPU holds them (rounded to bf16 or f32) */
    free(x), free(g);
    x = tu_get(gs.qkv), g = tu_get(gs.dout);
    tu_poison(gs.out), tu_poison(gs.lse), tu_poison(gs.dqkv), tu_poison(gs.delta);
    run(gpu, &gs, d);
    /* The forward against the reference's; the backward against the reference's backward
     * given the kernels' own out and lse (its inputs), so that each is held to its own errors. */
    fused_set cs = make_set(cpu, bf ? SG_DTYPE_BF16 : SG_DTYPE_F64, d);
    tu_set(cs.qkv, x), tu_set(cs.dout, g);
    TU_OK(cpu, sg_attention_fused_forward(cpu, cs.qkv, d.H, cs.out, cs.lse));
    char l[220];
    const double ml = max_abs(gs.lse);
    /* e, bf16: the rounding of P and dS to bf16, and exp2f's error on f32 arguments up to
     * |score| + |lse|; f32: f32_e, with TF32's operand rounding where the context asks for it. */
    const double su = tf32 ? 0x1p-11 : 0, hs0 = (double)(d.C / d.H);
    const double e = bf ? 0x1p-9 + 0x1p-22 * (1 + 2 * ml) : f32_e(x, d, ml, su);
    bounds bd = derive(cpu, x, g, d, e, hs0 * 0x1p-24 + 2 * su);
    /* rtol, bf16: the outputs' rounding (one bf16 ulp where the two sides round apart); f32:
     * one f32 rounding, the reference's F32 lse and delta (the kernels' own are in e). */
    const double r = bf ? 0x1p-8 : 0x1p-23;
    snprintf(l, sizeof l, "%s: out", w);
    tu_close_tensors(l, gs.out, cs.out, (tu_tol){bd.out, r});
    snprintf(l, sizeof l, "%s: lse", w);
    tu_close_tensors(l, gs.lse, cs.lse, bf ? (tu_tol){bd.lse + 0x1p-20, 0x1p-20} : (tu_tol){2 * e, r});
    double *ov = tu_get(gs.out), *lv = tu_get(gs.lse);
    tu_set(cs.out, ov), tu_set(cs.lse, lv);
    TU_OK(cpu, sg_attention_fused_backward(cpu, cs.qkv, cs.out, cs.lse, cs.dout, d.H, cs.dqkv, cs.delta));
    free(ov), free(lv);
    /* dqkv by section: q, k and v columns have their own bounds. */
    const int64_t n = d.B * d.T, C = d.C;
    double *gd = tu_get(gs.dqkv), *cd = tu_get(cs.dqkv);
    const double atol[3] = {bd.dq, bd.dk, bd.dv};
    const char *sec[3] = {"dq", "dk", "dv"};
    double *a = malloc((size_t)(n * C) * sizeof *a), *b = malloc((size_t)(n * C) * sizeof *b);
    for (int k = 0; k < 3; k++) {
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = 0; c < C; c++) a[i * C + c] = gd[i * 3 * C + k * C + c], b[i * C + c] = cd[i * 3 * C + k * C + c];
        snprintf(l, sizeof l, "%s: %s", w, sec[k]);
        tu_close(l, a, b, n * C, (tu_tol){atol[k], r});
    }
    /* delta = dout . out from the same out: the f32 sum's rounding, hs terms of at most
     * max|dout| max|out|, and the store's. */
    const double mg = max_abs(cs.dout), mo = max_abs(cs.out);
    const double hs = (double)(C / d.H);
    snprintf(l, sizeof l, "%s: delta", w);
    tu_close_tensors(l, gs.delta, cs.delta, (tu_tol){2 * hs * hs * 0x1p-24 * mg * mo, 0x1p-23});
    /* Deterministic: a second run gives the same bits everywhere. */
    void *o1 = tu_raw(gs.out), *q1 = tu_raw(gs.dqkv), *l1 = tu_raw(gs.lse), *d1 = tu_raw(gs.delta);
    tu_poison(gs.out), tu_poison(gs.dqkv), tu_poison(gs.lse), tu_poison(gs.delta);
    run(gpu, &gs, d);
    TU_CHECK(tu_same_bytes(gs.out, o1) && tu_same_bytes(gs.dqkv, q1) && tu_same_bytes(gs.lse, l1) &&
                 tu_same_bytes(gs.delta, d1),
             "%s: a second run differs (the kernels must be deterministic)", w);
    free(o1), free(q1), free(l1), free(d1), free(a), free(b), free(gd), free(cd), free(x), free(g);
    tu_free_live();
}

/* Against the unfused CUDA path of the same dtype: both approximate the same function. */
static void gpu_against_unfused(sg_ctx *gpu, sg_ctx *cpu, sg_dtype dt, dims d)
{
    char w[160];
    snprintf(w, sizeof w, "%s fused vs unfused CUDA", sg_dtype_name(dt));
    fused_set gs = make_set(gpu, dt, d);
    free(tu_random(gs.qkv, -1, 1));
    free(tu_random(gs.dout, -1, 1));
    run(gpu, &gs, d);
    const int64_t a[4] = {d.B, d.H, d.T, d.T}, wn = sg_attention_work_elems(d.B, d.T, d.C, d.H);
    sg_tensor *out = tu_keep(tu_tensor(gpu, dt, 2, gs.out->shape, "u.out"));
    sg_tensor *att = tu_keep(tu_tensor(gpu, dt, 4, a, "u.att"));
    sg_tensor *work = tu_keep(tu_tensor1(gpu, SG_DTYPE_F32, wn, "u.work"));
    sg_tensor *dqkv = tu_keep(tu_tensor(gpu, dt, 2, gs.dqkv->shape, "u.dqkv"));
    TU_OK(gpu, sg_attention_forward(gpu, gs.qkv, d.H, out, att, work));
    TU_OK(gpu, sg_attention_backward(gpu, gs.qkv, att, gs.dout, d.H, dqkv, work));
    double *x = tu_get(gs.qkv), *g = tu_get(gs.dout);
    tu_tol to, tq;
    char l[200];
    if (dt == SG_DTYPE_BF16) {
        /* Each within the derived bound of the exact result: twice the bound between them. */
        bounds bd = derive(cpu, x, g, d, 0x1p-9 + 0x1p-20, (double)(d.C / d.H) * 0x1p-24);
        to = (tu_tol){2 * bd.out, 0x1p-7};
        tq = (tu_tol){2 * fmax(bd.dq, fmax(bd.dk, bd.dv)) + fmax(bd.dq_o, bd.dk_o), 0x1p-7};
    } else {
        /* Each within its bound (e = f32_e) of the exact result given its own forward: twice the
         * bound; plus what the fused forward's errors move its backward by, through delta
         * (out off by bd.out: dq_u, dk_u) and through P (lse off by 2e: one more bound). The
         * unfused path's sums (cuBLAS SGEMM, FMA, no TF32) have the same worst cases, but for
         * its softmax backward's sum over T keys, which the doubled a32 term covers for T <=
         * 3 hs (here 96 <= 192). */
        bounds bd = derive(cpu, x, g, d, f32_e(x, d, max_abs(gs.lse), 0), (double)(d.C / d.H) * 0x1p-24);
        to = (tu_tol){2 * bd.out, 0x1p-22};
        tq = (tu_tol){3 * fmax(bd.dq, fmax(bd.dk, bd.dv)) + fmax(bd.dq_u, bd.dk_u) * bd.out, 0x1p-22};
    }
    snprintf(l, sizeof l, "%s: out", w);
    tu_close_tensors(l, gs.out, out, to);
    snprintf(l, sizeof l, "%s: dqkv", w);
    tu_close_tensors(l, gs.dqkv, dqkv, tq);
    free(x), free(g);
    tu_free_live();
}

typedef struct {
    sg_ctx *ctx;
    fused_set *s;
    dims d;
} cap_args;

static sg_status cap_step(void *u)
{
    cap_args *c = u;
    SG_TRY(sg_attention_fused_forward(c->ctx, c->s->qkv, c->d.H, c->s->out, c->s->lse));
    return sg_attention_fused_backward(c->ctx, c->s->qkv, c->s->out, c->s->lse, c->s->dout, c->d.H, c->s->dqkv,
                                       c->s->delta);
}

static void gpu_capture(sg_ctx *gpu, sg_dtype dt, dims d)
{
    fused_set s = make_set(gpu, dt, d);
    free(tu_random(s.qkv, -1, 1));
    free(tu_random(s.dout, -1, 1));
    cap_args c = {gpu, &s, d};
    sg_graph *gr = NULL;
    TU_OK(gpu, sg_graph_capture(gpu, cap_step, &c, NULL, &gr));
    free(tu_random(s.qkv, -1, 1)); /* fresh inputs: the replay must read them */
    run(gpu, &s, d);
    void *o1 = tu_raw(s.out), *q1 = tu_raw(s.dqkv);
    tu_poison(s.out), tu_poison(s.dqkv);
    TU_OK(gpu, sg_graph_replay(gr));
    TU_CHECK(tu_same_bytes(s.out, o1) && tu_same_bytes(s.dqkv, q1), "captured %s fused attention differs from eager",
             sg_dtype_name(dt));
    sg_graph_destroy(gr);
    free(o1), free(q1);
    tu_free_live();
}

/* A (rows, cols) view one element into a buffer: 2 (bf16) or 4 (f32) bytes past 16-byte
 * alignment. */
static sg_tensor *odd_view(sg_ctx *ctx, sg_dtype dt, int64_t rows, int64_t cols, const char *name)
{
    sg_tensor *base = tu_keep(tu_tensor1(ctx, dt, rows * cols + 1, "base")), *v = NULL;
    TU_OK(ctx, sg_tensor_view(base, 1, 2, (int64_t[]){rows, cols}, name, &v));
    return tu_keep(v);
}

static void gpu_refusals(sg_ctx *gpu)
{
    TU_CHECK(!sg_attention_fused_supported(gpu, SG_DTYPE_BF16, 64, 2) &&
                 sg_attention_fused_supported(gpu, SG_DTYPE_BF16, 128, 2) &&
                 sg_attention_fused_supported(gpu, SG_DTYPE_F32, 128, 2) &&
                 sg_attention_fused_supported(gpu, SG_DTYPE_F32, 8, 2) &&
                 sg_attention_fused_supported(gpu, SG_DTYPE_F32, 256, 2) &&
                 !sg_attention_fused_supported(gpu, SG_DTYPE_F32, 264, 2) &&
                 !sg_attention_fused_supported(gpu, SG_DTYPE_F32, 12, 2) &&
                 !sg_attention_fused_supported(gpu, SG_DTYPE_F64, 128, 2),
             "sg_attention_fused_supported on CUDA: bf16 with head size 64, f32 with a multiple of 4 up to 128");
    /* bf16: head size 32 */
    fused_set s = make_set(gpu, SG_DTYPE_BF16, (dims){1, 16, 64, 2});
    TU_FAILS(gpu, sg_attention_fused_forward(gpu, s.qkv, 2, s.out, s.lse), SG_ERR_UNSUPPORTED, "head size 64");
    /* f32: head sizes past 128 or not a multiple of 4 */
    fused_set f = make_set(gpu, SG_DTYPE_F32, (dims){1, 16, 132, 1});
    TU_FAILS(gpu, sg_attention_fused_forward(gpu, f.qkv, 1, f.out, f.lse), SG_ERR_UNSUPPORTED, "head size 132");
    TU_FAILS(gpu, sg_attention_fused_backward(gpu, f.qkv, f.out, f.lse, f.dout, 1, f.dqkv, f.delta),
             SG_ERR_UNSUPPORTED, "head size 132");
    fused_set f6 = make_set(gpu, SG_DTYPE_F32, (dims){1, 16, 12, 2});
    TU_FAILS(gpu, sg_attention_fused_forward(gpu, f6.qkv, 2, f6.out, f6.lse), SG_ERR_UNSUPPORTED, "head size 6");
    /* views not 16-byte aligned: bf16 qkv; f32 qkv in the forward, dout in the backward */
    fused_set a = make_set(gpu, SG_DTYPE_BF16, (dims){1, 16, 64, 1});
    sg_tensor *v = odd_view(gpu, SG_DTYPE_BF16, 16, 192, "qkv.view");
    TU_FAILS(gpu, sg_attention_fused_forward(gpu, v, 1, a.out, a.lse), SG_ERR_UNSUPPORTED, "16-byte aligned");
    fused_set a32 = make_set(gpu, SG_DTYPE_F32, (dims){1, 16, 64, 1});
    free(tu_random(a32.qkv, -1, 1));
    free(tu_random(a32.dout, -1, 1));
    sg_tensor *v32 = odd_view(gpu, SG_DTYPE_F32, 16, 192, "qkv.view32");
    TU_FAILS(gpu, sg_attention_fused_forward(gpu, v32, 1, a32.out, a32.lse), SG_ERR_UNSUPPORTED, "'qkv.view32' is not 16-byte aligned");
    TU_OK(gpu, sg_attention_fused_forward(gpu, a32.qkv, 1, a32.out, a32.lse));
    sg_tensor *g32 = odd_view(gpu, SG_DTYPE_F32, 16, 64, "dout.view32");
    TU_FAILS(gpu, sg_attention_fused_backward(gpu, a32.qkv, a32.out, a32.lse, g32, 1, a32.dqkv, a32.delta),
             SG_ERR_UNSUPPORTED, "'dout.view32' is not 16-byte aligned");
    /* usable after */
    run(gpu, &a, (dims){1, 16, 64, 1});
    run(gpu, &a32, (dims){1, 16, 64, 1});
    tu_free_live();
}

/* sg_attention_fused_backward_sums on ctx against sg_attention_fused_backward on the same
 * inputs: dqkv and delta bit for bit (the sums change neither), and dbias against the column
 * sums of that dqkv as stored, added on the host in double. On the CPU the reference sums in
 * double too, rounded once: equal to the host's sum rounded once. On CUDA the kernels add in
 * f32, by 64-row tile and then the tiles in order: an f32 sum of M = B*T terms in any order
 * is within (M - 1) 2^-24 sum|x| of the exact one; it and the host's sum are each rounded
 * once to the dtype, so they may land one bf16 ulp apart (2^-7 of the value at most). dbias
 * is poisoned before, the parts too. */
static void check_sums(sg_ctx *ctx, sg_dtype dt, dims d)
{
    char w[160];
    snprintf(w, sizeof w, "%s %s sums B=%lld T=%lld C=%lld heads=%d", ctx->backend == SG_BACKEND_CUDA ? "gpu" : "cpu",
             sg_dtype_name(dt), (long long)d.B, (long long)d.T, (long long)d.C, d.H);
    fused_set a = make_set(ctx, dt, d), b = make_set(ctx, dt, d);
    double *x = tu_random(a.qkv, -1, 1), *g = tu_random(a.dout, -1, 1);
    tu_set(b.qkv, x), tu_set(b.dout, g);
    free(x), free(g);
    const int64_t np = sg_attention_fused_parts(d.B, d.T, d.C);
    TU_CHECK(np == d.B * ((d.T + 63) / 64) * 3 * d.C, "%s: sg_attention_fused_parts gave %lld", w, (long long)np);
    sg_tensor *db = tu_keep(tu_tensor1(ctx, dt, 3 * d.C, "dbias"));
    sg_tensor *parts = tu_keep(tu_tensor1(ctx, SG_DTYPE_F32, np, "parts"));
    tu_poison(db), tu_poison(parts), tu_poison(a.dqkv), tu_poison(b.dqkv);
    run(ctx, &a, d);
    TU_OK(ctx, sg_attention_fused_forward(ctx, b.qkv, d.H, b.out, b.lse));
    TU_OK(ctx, sg_attention_fused_backward_sums(ctx, b.qkv, b.out, b.lse, b.dout, d.H, b.dqkv, b.delta, db, parts));
    void *ra = tu_raw(a.dqkv), *rd = tu_raw(a.delta);
    TU_CHECK(tu_same_bytes(b.dqkv, ra) && tu_same_bytes(b.delta, rd),
             "%s: dqkv or delta differ from sg_attention_fused_backward's", w);
    free(ra), free(rd);
    const int64_t M = d.B * d.T, cols = 3 * d.C;
    double *dq = tu_get(b.dqkv), *got = tu_get(db), *want = malloc((size_t)cols * sizeof *want);
    double amax = 0;
    for (int64_t c = 0; c < cols; c++) {
        double v = 0, av = 0;
        for (int64_t r = 0; r < M; r++) v += dq[r * cols + c], av += fabs(dq[r * cols + c]);
        want[c] = v;
        amax = fmax(amax, av);
    }
    sg_tensor *wt = tu_keep(tu_tensor1(ctx, dt, cols, "want"));
    tu_set(wt, want); /* rounded once to dt, as the reference */
    double *wr = tu_get(wt);
    if (ctx->backend == SG_BACKEND_CPU)
        tu_close(w, got, wr, cols, (tu_tol){0, 0});
    else
        tu_close(w, got, wr, cols, (tu_tol){(double)(M - 1) * 0x1p-24 * amax + 1e-30, dt == SG_DTYPE_BF16 ? 0x1p-7 : 0x1p-23});
    free(dq), free(got), free(want), free(wr);
    tu_free_live();
}

/* The sums call's refusals: NULL dbias or parts, dbias of the wrong size or dtype, parts too
 * small or not F32, dbias overlapping dqkv; nothing written; then a call that works. */
static void sums_errors(sg_ctx *ctx)
{
    const dims d = {1, 9, 64, 1};
    fused_set s = make_set(ctx, SG_DTYPE_F32, d);
    free(tu_random(s.qkv, -1, 1)), free(tu_random(s.dout, -1, 1));
    TU_OK(ctx, sg_attention_fused_forward(ctx, s.qkv, d.H, s.out, s.lse));
    const int64_t np = sg_attention_fused_parts(d.B, d.T, d.C);
    sg_tensor *db = tu_keep(tu_tensor1(ctx, SG_DTYPE_F32, 192, "dbias")), *db2 = tu_keep(tu_tensor1(ctx, SG_DTYPE_F32, 191, "dbias191"));
    sg_tensor *dbh = tu_keep(tu_tensor1(ctx, SG_DTYPE_BF16, 192, "dbias_bf16"));
    sg_tensor *pa = tu_keep(tu_tensor1(ctx, SG_DTYPE_F32, np, "parts")), *pa2 = tu_keep(tu_tensor1(ctx, SG_DTYPE_F32, np - 1, "parts_small"));
    sg_tensor *pai = tu_keep(tu_tensor1(ctx, SG_DTYPE_I32, np, "parts_i32")), *in_dq = NULL;
    TU_OK(ctx, sg_tensor_view(s.dqkv, 5, 1, (int64_t[]){192}, "dbias_in_dqkv", &in_dq));
    tu_keep(in_dq);
    tu_poison(db), tu_poison(s.dqkv);
#define SUMS(dbias, parts) sg_attention_fused_backward_sums(ctx, s.qkv, s.out, s.lse, s.dout, d.H, s.dqkv, s.delta, dbias, parts)
    TU_FAILS(ctx, SUMS(NULL, pa), SG_ERR_NULL, "sg_attention_fused_backward_sums: tensor 'dbias' is NULL");
    TU_FAILS(ctx, SUMS(db, NULL), SG_ERR_NULL, "tensor 'parts' is NULL");
    TU_FAILS(ctx, SUMS(db2, pa), SG_ERR_SHAPE, "'dbias' (dbias191) is (191) f32, expected 192 elements");
    TU_FAILS(ctx, SUMS(dbh, pa), SG_ERR_DTYPE, "'dbias' is bf16, expected f32");
    TU_FAILS(ctx, SUMS(db, pa2), SG_ERR_SHAPE, "'parts' has 191 elements, expected at least 192 (sg_attention_fused_parts(B=1, T=9, C=64))");
    TU_FAILS(ctx, SUMS(db, pai), SG_ERR_DTYPE, "'parts' is i32");
    TU_FAILS(ctx, SUMS(in_dq, pa), SG_ERR_INVALID, "overlaps");
    double *dv = tu_get(db), *qv = tu_get(s.dqkv);
    int64_t written = 0;
    for (int64_t i = 0; i < 192; i++) written += !isnan(dv[i]);
    for (int64_t i = 0; i < sg_tensor_numel(s.dqkv); i++) written += !isnan(qv[i]);
    TU_CHECK(written == 0, "%lld elements written by rejected sums calls", (long long)written);
    free(dv), free(qv);
    TU_OK(ctx, SUMS(db, pa)); /* usable after */
#undef SUMS
    TU_CHECK(sg_attention_fused_parts(0, 9, 64) == -1 && sg_attention_fused_parts(1, 9, 0) == -1,
             "sg_attention_fused_parts takes positive sizes only");
    tu_free_live();
}

int main(int argc, char **argv)
{
    sg_backend be;
    if (!tu_start("attention_fused", argc, argv, &be)) return TU_SKIP;
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    if (be == SG_BACKEND_CPU) {
        const dims cases[] = {{1, 1, 8, 1}, {2, 5, 8, 2}, {1, 9, 12, 3}, {2, 7, 16, 1}};
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) cpu_against_unfused(cpu, cases[i]);
        cpu_gradcheck(cpu, (dims){1, 1, 4, 1});
        cpu_gradcheck(cpu, (dims){2, 5, 8, 2});
        cpu_errors(cpu);
        check_sums(cpu, SG_DTYPE_F32, (dims){2, 5, 8, 2});
        check_sums(cpu, SG_DTYPE_BF16, (dims){2, 70, 128, 2});
        check_sums(cpu, SG_DTYPE_F64, (dims){1, 1, 4, 1});
        sums_errors(cpu);
    } else {
        sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
        const dims cases[] = {{2, 1, 64, 1}, {1, 77, 128, 2}, {3, 64, 64, 1}, {1, 65, 64, 1}, {2, 128, 768, 12},
                              {1, 200, 128, 2}};
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            gpu_against_cpu(gpu, cpu, SG_DTYPE_BF16, cases[i], false);
        /* f32: the same shapes, then head sizes 32, 128, 48 (padded to 64), 4 and 100 (to 128);
         * these run the 32-row blocks, which the kernels take where 64-row ones would leave
         * SMs idle; the last, 6 x 12 x 3 = 216 blocks of 64 rows, runs the 64-row ones on GPUs
         * of up to 216 SMs. */
        const dims f32_cases[] = {{2, 1, 64, 1},    {1, 77, 128, 2}, {3, 64, 64, 1},   {1, 65, 64, 1},
                                  {2, 128, 768, 12}, {1, 200, 128, 2}, {2, 100, 64, 2}, {1, 130, 128, 1},
                                  {2, 70, 96, 2},    {1, 33, 8, 2},    {1, 66, 200, 2}, {6, 130, 768, 12}};
        for (size_t i = 0; i < sizeof f32_cases / sizeof *f32_cases; i++)
            gpu_against_cpu(gpu, cpu, SG_DTYPE_F32, f32_cases[i], false);
        gpu_against_unfused(gpu, cpu, SG_DTYPE_BF16, (dims){2, 96, 128, 2});
        gpu_against_unfused(gpu, cpu, SG_DTYPE_F32, (dims){2, 96, 128, 2});
        gpu_capture(gpu, SG_DTYPE_BF16, (dims){2, 130, 128, 2});
        gpu_capture(gpu, SG_DTYPE_F32, (dims){2, 130, 128, 2});
        gpu_capture(gpu, SG_DTYPE_F32, (dims){1, 70, 64, 2});
        gpu_refusals(gpu);
        /* Under STEPGRAPH_TF32, f32 with head size 64 on the tensor cores, held to the f32
         * bound with TF32's roundings; T = 1, a partial tile, one and several tiles, 12 heads;
         * then eager against a captured replay. */
        sg_ctx *gt = tu_ctx_env("STEPGRAPH_TF32", "1");
        const dims tf32_cases[] = {{2, 1, 64, 1}, {1, 77, 128, 2}, {3, 64, 64, 1}, {2, 130, 768, 12}};
        for (size_t i = 0; i < sizeof tf32_cases / sizeof *tf32_cases; i++)
            gpu_against_cpu(gt, cpu, SG_DTYPE_F32, tf32_cases[i], true);
        gpu_capture(gt, SG_DTYPE_F32, (dims){2, 130, 128, 2});
        sg_ctx_destroy(gt);
        /* the qkv bias gradient beside the backward: one tile, T not a multiple of 64, gpt-768's
         * layer (B 8 x 12 heads, T 256), and 1 head */
        const dims sums_cases[] = {{1, 1, 64, 1}, {2, 77, 128, 2}, {8, 256, 768, 12}, {3, 130, 64, 1}};
        for (size_t i = 0; i < sizeof sums_cases / sizeof *sums_cases; i++)
            check_sums(gpu, SG_DTYPE_BF16, sums_cases[i]);
        /* STEPGRAPH_WGRAD=side: the tiles' sum on the second stream, joined before the call
         * returns (the reads after it see dbias) */
        sg_ctx *gside = tu_ctx_env("STEPGRAPH_WGRAD", "side");
        check_sums(gside, SG_DTYPE_BF16, (dims){8, 256, 768, 12});
        sg_ctx_destroy(gside);
        fused_set f = make_set(gpu, SG_DTYPE_F32, (dims){1, 16, 64, 1});
        sg_tensor *fdb = tu_keep(tu_tensor1(gpu, SG_DTYPE_F32, 192, "dbias_f32"));
        sg_tensor *fpa = tu_keep(tu_tensor1(gpu, SG_DTYPE_F32, sg_attention_fused_parts(1, 16, 64), "parts_f32"));
        TU_FAILS(gpu, sg_attention_fused_backward_sums(gpu, f.qkv, f.out, f.lse, f.dout, 1, f.dqkv, f.delta, fdb, fpa),
                 SG_ERR_UNSUPPORTED, "CUDA sums the columns for bf16; this is f32");
        tu_free_live();
        sg_ctx_destroy(gpu);
    }
    sg_ctx_destroy(cpu);
    return tu_finish("attention_fused");
}
