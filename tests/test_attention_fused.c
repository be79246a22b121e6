/* test_attention_fused.c: fused causal attention (sg_attention_fused_forward / _backward).
 * `cpu`: the reference in f64 against the unfused op (out, and dqkv from the same dout), lse
 * against the log-sum-exp of the unfused probabilities' scores, delta = dout . out, float64
 * finite differences of the whole (forward, backward) pair at T = 1 and T > 1, one and two
 * heads; argument errors. `gpu`: the bf16 tensor-core kernels against the CPU reference on
 * the same bf16 values (T = 1, T not a multiple of the 64-row tile, exactly one and several
 * tiles, heads 1, 2 and 12), outputs poisoned first, within a bound derived below; the same
 * problem twice gives the same bits (deterministic backward); fused against the unfused CUDA
 * path; a captured forward + backward replayed bit-exact against eager; what CUDA refuses
 * (f32, head size 32, a view that is not 16-byte aligned).
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
 * P and |dS| are taken from an f64 run of the unfused reference on the same values. */
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
} bounds;

static bounds derive(sg_ctx *cpu, const double *x, const double *g, dims d, double e, bool f32)
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
    /* a32: f32 sums of dout . v and dout . out (hs terms, each at most mg mv) in d(scores) */
    const double a32 = f32 ? 2 * hs * 0x1p-24 * hs * mg * mv : 0;
    const double od = hs * mg * (2 * e * mv + 0x1p-8 * mv);
    bounds r = {2 * e * mv, 2 * e * rowS * mk * sc + 2 * sc * a32 * mk, 2 * e * colS * mq * sc + 2 * sc * a32 * colP * mq,
                2 * e * colP * mg, 4 * (double)hs * 0x1p-24 * ms, sc * od * mk, sc * od * colP * mq};
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
    bounds bd = derive(ctx, x, g, d, 0x1p-24 * (ml + 1), false);
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
    bounds bd = derive(ctx, x, g, d, 0x1p-24 * (ml + 1), false);
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

static void gpu_against_cpu(sg_ctx *gpu, sg_ctx *cpu, dims d)
{
    char w[160];
    snprintf(w, sizeof w, "bf16 B=%lld T=%lld C=%lld heads=%d", (long long)d.B, (long long)d.T, (long long)d.C, d.H);
    fused_set gs = make_set(gpu, SG_DTYPE_BF16, d);
    double *x = tu_random(gs.qkv, -1, 1), *g = tu_random(gs.dout, -1, 1);
    /* the values as the GPU holds them (rounded to bf16) */
    free(x), free(g);
    x = tu_get(gs.qkv), g = tu_get(gs.dout);
    tu_poison(gs.out), tu_poison(gs.lse), tu_poison(gs.dqkv), tu_poison(gs.delta);
    run(gpu, &gs, d);
    /* The forward against the reference's; the backward against the reference's backward
     * given the kernels' own out and lse (its inputs), so that each is held to its own errors. */
    fused_set cs = make_set(cpu, SG_DTYPE_BF16, d);
    tu_set(cs.qkv, x), tu_set(cs.dout, g);
    TU_OK(cpu, sg_attention_fused_forward(cpu, cs.qkv, d.H, cs.out, cs.lse));
    char l[220];
    double *lv = tu_get(gs.lse), ml = 0;
    for (int64_t i = 0; i < gs.lse->numel; i++) ml = fmax(ml, fabs(lv[i]));
    /* e: bf16 rounding of P and dS, and exp2f's error on f32 arguments up to |score| + |lse|. */
    const double e = 0x1p-9 + 0x1p-22 * (1 + 2 * ml);
    bounds bd = derive(cpu, x, g, d, e, true);
    const double r8 = 0x1p-8;
    snprintf(l, sizeof l, "%s: out", w);
    tu_close_tensors(l, gs.out, cs.out, (tu_tol){bd.out, r8});
    snprintf(l, sizeof l, "%s: lse", w);
    tu_close_tensors(l, gs.lse, cs.lse, (tu_tol){bd.lse + 0x1p-20, 0x1p-20});
    double *ov = tu_get(gs.out);
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
        tu_close(l, a, b, n * C, (tu_tol){atol[k], r8});
    }
    /* delta = dout . out from the same out: the f32 sum's rounding, hs terms of at most
     * max|dout| max|out|, and the store's. */
    double mg = 0, mo = 0, *co = tu_get(cs.out);
    for (int64_t i = 0; i < n * C; i++) mg = fmax(mg, fabs(g[i])), mo = fmax(mo, fabs(co[i]));
    const double hs = (double)(C / d.H);
    snprintf(l, sizeof l, "%s: delta", w);
    tu_close_tensors(l, gs.delta, cs.delta, (tu_tol){2 * hs * hs * 0x1p-24 * mg * mo, 0x1p-23});
    free(co);
    /* Deterministic: a second run gives the same bits everywhere. */
    void *o1 = tu_raw(gs.out), *q1 = tu_raw(gs.dqkv), *l1 = tu_raw(gs.lse);
    tu_poison(gs.out), tu_poison(gs.dqkv), tu_poison(gs.lse);
    run(gpu, &gs, d);
    TU_CHECK(tu_same_bytes(gs.out, o1) && tu_same_bytes(gs.dqkv, q1) && tu_same_bytes(gs.lse, l1),
             "%s: a second run differs (the kernels must be deterministic)", w);
    free(o1), free(q1), free(l1), free(a), free(b), free(gd), free(cd), free(x), free(g);
    tu_free_live();
}

/* Against the unfused CUDA path: both approximate the same function in bf16. */
static void gpu_against_unfused(sg_ctx *gpu, sg_ctx *cpu, dims d)
{
    fused_set gs = make_set(gpu, SG_DTYPE_BF16, d);
    free(tu_random(gs.qkv, -1, 1));
    free(tu_random(gs.dout, -1, 1));
    run(gpu, &gs, d);
    const int64_t a[4] = {d.B, d.H, d.T, d.T}, wn = sg_attention_work_elems(d.B, d.T, d.C, d.H);
    sg_tensor *out = tu_keep(tu_tensor(gpu, SG_DTYPE_BF16, 2, gs.out->shape, "u.out"));
    sg_tensor *att = tu_keep(tu_tensor(gpu, SG_DTYPE_BF16, 4, a, "u.att"));
    sg_tensor *work = tu_keep(tu_tensor1(gpu, SG_DTYPE_F32, wn, "u.work"));
    sg_tensor *dqkv = tu_keep(tu_tensor(gpu, SG_DTYPE_BF16, 2, gs.dqkv->shape, "u.dqkv"));
    TU_OK(gpu, sg_attention_forward(gpu, gs.qkv, d.H, out, att, work));
    TU_OK(gpu, sg_attention_backward(gpu, gs.qkv, att, gs.dout, d.H, dqkv, work));
    /* Each within the derived bound of the exact result: twice the bound between them. */
    double *x = tu_get(gs.qkv), *g = tu_get(gs.dout);
    bounds bd = derive(cpu, x, g, d, 0x1p-9 + 0x1p-20, true);
    const double r8 = 0x1p-7;
    tu_close_tensors("fused vs unfused CUDA: out", gs.out, out, (tu_tol){2 * bd.out, r8});
    tu_close_tensors("fused vs unfused CUDA: dqkv", gs.dqkv, dqkv,
                     (tu_tol){2 * fmax(bd.dq, fmax(bd.dk, bd.dv)) + fmax(bd.dq_o, bd.dk_o), r8});
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

static void gpu_capture(sg_ctx *gpu, dims d)
{
    fused_set s = make_set(gpu, SG_DTYPE_BF16, d);
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
    TU_CHECK(tu_same_bytes(s.out, o1) && tu_same_bytes(s.dqkv, q1), "captured fused attention differs from eager");
    sg_graph_destroy(gr);
    free(o1), free(q1);
    tu_free_live();
}

static void gpu_refusals(sg_ctx *gpu)
{
    dims d = {1, 16, 64, 2}; /* head size 32 */
    fused_set s = make_set(gpu, SG_DTYPE_BF16, d);
    TU_CHECK(!sg_attention_fused_supported(gpu, SG_DTYPE_BF16, 64, 2) &&
             sg_attention_fused_supported(gpu, SG_DTYPE_BF16, 128, 2) &&
             !sg_attention_fused_supported(gpu, SG_DTYPE_F32, 128, 2), "sg_attention_fused_supported on CUDA");
    TU_FAILS(gpu, sg_attention_fused_forward(gpu, s.qkv, 2, s.out, s.lse), SG_ERR_UNSUPPORTED, "head size 64");
    fused_set f = make_set(gpu, SG_DTYPE_F32, (dims){1, 16, 64, 1});
    TU_FAILS(gpu, sg_attention_fused_forward(gpu, f.qkv, 1, f.out, f.lse), SG_ERR_UNSUPPORTED, "f32");
    /* a view two bytes into a buffer */
    sg_tensor *base = tu_keep(tu_tensor1(gpu, SG_DTYPE_BF16, 16 * 192 + 1, "base")), *v = NULL;
    TU_OK(gpu, sg_tensor_view(base, 1, 2, (int64_t[]){16, 192}, "qkv.view", &v));
    tu_keep(v);
    fused_set a = make_set(gpu, SG_DTYPE_BF16, (dims){1, 16, 64, 1});
    TU_FAILS(gpu, sg_attention_fused_forward(gpu, v, 1, a.out, a.lse), SG_ERR_UNSUPPORTED, "16-byte aligned");
    run(gpu, &a, (dims){1, 16, 64, 1}); /* usable after */
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
    } else {
        sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
        const dims cases[] = {{2, 1, 64, 1}, {1, 77, 128, 2}, {3, 64, 64, 1}, {1, 65, 64, 1}, {2, 128, 768, 12},
                              {1, 200, 128, 2}};
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) gpu_against_cpu(gpu, cpu, cases[i]);
        gpu_against_unfused(gpu, cpu, (dims){2, 96, 128, 2});
        gpu_capture(gpu, (dims){2, 130, 128, 2});
        gpu_refusals(gpu);
        sg_ctx_destroy(gpu);
    }
    sg_ctx_destroy(cpu);
    return tu_finish("attention_fused");
}
