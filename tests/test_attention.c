/* test_attention.c: causal multi-head self-attention. `cpu`: the reference's forward (out and
 * att) against a naive float64 loop written here, att's rows (sum to 1, zero above the
 * diagonal), float64 finite differences of dqkv (T = 1 and T > 1), f32 against f64, bf16
 * against f64 on the same (bf16) values, a CPU capture replayed against eager, and argument
 * errors (mixed dtypes included). `gpu`: the CUDA path against the CPU reference (f32 both,
 * then bf16 both) on the shapes a GPT uses and a random one, outputs and work poisoned first;
 * launch counts; bitwise repeatability without allocation; captured forward+backward (f32 and
 * bf16) replayed against eager; the capture refusal when the cuBLAS handle would be created. */
#include "testutil.h"

typedef struct {
    int64_t B, T, C;
    int H;
} dims;

/* The tensors of one attention call: inputs, outputs, scratch. */
typedef struct {
    sg_tensor *qkv, *out, *att, *work, *dout, *dqkv;
} att_set;

/* A tensor of ctx; with mis, a view one element into a larger buffer (4-byte aligned only). */
static sg_tensor *mk(sg_ctx *ctx, sg_dtype dt, int nd, const int64_t *shape, const char *name,
                     int mis)
{
    if (!mis) return tu_keep(tu_tensor(ctx, dt, nd, shape, name));
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    sg_tensor *base = tu_keep(tu_tensor1(ctx, dt, n + 1, "base")), *v;
    TU_OK(ctx, sg_tensor_view(base, 1, nd, shape, name, &v));
    return tu_keep(v);
}

/* flat: qkv, out, dout, dqkv 2-D with B*T rows, as a model's linear layers hold them. */
static att_set make_set(sg_ctx *ctx, sg_dtype dt, dims d, int mis, int flat)
{
    const int64_t qs[3] = {d.B, d.T, 3 * d.C}, os[3] = {d.B, d.T, d.C};
    const int64_t qf[2] = {d.B * d.T, 3 * d.C}, of[2] = {d.B * d.T, d.C};
    const int64_t as[4] = {d.B, d.H, d.T, d.T};
    const int64_t wn = sg_attention_work_elems(d.B, d.T, d.C, d.H);
    SG_ASSERT(wn > 0);
    const int nd = flat ? 2 : 3;
    const int64_t *q = flat ? qf : qs, *o = flat ? of : os;
    att_set s = {mk(ctx, dt, nd, q, "qkv", mis), mk(ctx, dt, nd, o, "out", mis),
                 mk(ctx, dt, 4, as, "att", mis), mk(ctx, SG_DTYPE_F32, 1, &wn, "work", mis),
                 mk(ctx, dt, nd, o, "dout", mis), mk(ctx, dt, nd, q, "dqkv", mis)};
    return s;
}

static void dims_str(char *buf, size_t n, const char *pre, dims d, sg_dtype dt, int flat)
{
    snprintf(buf, n, "%s B=%lld T=%lld C=%lld heads=%d %s%s", pre, (long long)d.B, (long long)d.T,
             (long long)d.C, d.H, sg_dtype_name(dt), flat ? " 2-D" : "");
}

/* ---- the naive reference: straight from the definition, in double ----
 * att[b,h,t,s] = exp(q_t . k_s / sqrt(hs)) / sum_{r<=t} exp(q_t . k_r / sqrt(hs)) for s <= t,
 * 0 for s > t (no max subtraction: the inputs here keep exp's argument small);
 * out[b,t,h*hs+i] = sum_s att[b,h,t,s] v[b,s,h*hs+i]. */
static void naive_attention(const double *x, dims d, double *out, double *att)
{
    const int64_t T = d.T, C = d.C, H = d.H, hs = C / H;
    for (int64_t b = 0; b < d.B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                double *a = att + ((b * H + h) * T + t) * T, z = 0;
                for (int64_t s = 0; s < T; s++) {
                    a[s] = 0;
                    if (s > t) continue;
                    double sc = 0;
                    for (int64_t i = 0; i < hs; i++)
                        sc += x[(b * T + t) * 3 * C + h * hs + i] *
                              x[(b * T + s) * 3 * C + C + h * hs + i];
                    a[s] = exp(sc / sqrt((double)hs));
                    z += a[s];
                }
                for (int64_t s = 0; s < T; s++) a[s] /= z;
                for (int64_t i = 0; i < hs; i++) {
                    double o = 0;
                    for (int64_t s = 0; s < T; s++)
                        o += a[s] * x[(b * T + s) * 3 * C + 2 * C + h * hs + i];
                    out[(b * T + t) * C + h * hs + i] = o;
                }
            }
}

/* att's rows: entries above the diagonal exactly 0, the rest in [0, 1], each row summing to 1
 * within sum_tol. */
static void check_att_rows(const char *what, const sg_tensor *att, double sum_tol)
{
    const int64_t T = att->shape[3], rows = att->numel / T;
    double *a = tu_get(att);
    int64_t bad_upper = 0, bad_range = 0, bad_sum = 0, worst = 0;
    double worst_err = 0;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = r % T;
        double sum = 0;
        for (int64_t s = 0; s < T; s++) {
            const double v = a[r * T + s];
            if (s > t) bad_upper += v != 0.0;
            else bad_range += !(v >= 0 && v <= 1);
            sum += v;
        }
        const double err = fabs(sum - 1);
        bad_sum += !(err <= sum_tol);
        if (!(err <= worst_err)) worst_err = err, worst = r;
    }
    TU_CHECK(bad_upper == 0, "%s: %lld entries of att above the diagonal are not 0", what,
             (long long)bad_upper);
    TU_CHECK(bad_range == 0, "%s: %lld entries of att outside [0, 1]", what, (long long)bad_range);
    TU_CHECK(bad_sum == 0, "%s: %lld rows of att do not sum to 1 (worst row %lld off by %.3g, tol %.1e)",
             what, (long long)bad_sum, (long long)worst, worst_err, sum_tol);
    free(a);
}

/* out and att of s against the naive loop on s->qkv's values. */
static void check_forward_naive(const char *what, const att_set *s, dims d, tu_tol tol)
{
    double *x = tu_get(s->qkv);
    double *ro = malloc((size_t)s->out->numel * sizeof *ro), *ra = malloc((size_t)s->att->numel * sizeof *ra);
    naive_attention(x, d, ro, ra);
    double *go = tu_get(s->out), *ga = tu_get(s->att);
    char label[200];
    snprintf(label, sizeof label, "%s: out vs naive", what);
    tu_close(label, go, ro, s->out->numel, tol);
    snprintf(label, sizeof label, "%s: att vs naive", what);
    tu_close(label, ga, ra, s->att->numel, tol);
    free(x);
    free(ro);
    free(ra);
    free(go);
    free(ga);
}

static int same_values(const sg_tensor *t, const double *ref)
{
    double *v = tu_get(t);
    int same = !memcmp(v, ref, (size_t)t->numel * sizeof *v);
    free(v);
    return same;
}

/* ---- bf16: the dtype rule, and a relative Frobenius error over the whole tensor ---- */

/* ||got - ref|| / ||ref|| (Frobenius); 0 when both are 0. */
static double rel_frobenius(const sg_tensor *got, const sg_tensor *ref)
{
    double *g = tu_get(got), *r = tu_get(ref), num = 0, den = 0;
    for (int64_t i = 0; i < ref->numel; i++) {
        num += (g[i] - r[i]) * (g[i] - r[i]);
        den += r[i] * r[i];
    }
    free(g);
    free(r);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* A bf16 result against its reference: every element under the bf16 rule (tu_tol_for: 4 bf16
 * units of roundoff relative, plus 1e-2 absolute for entries that cancel), and the whole
 * tensor within 2e-2 relative Frobenius error (about 5 units of roundoff, 2^-8 each: a
 * systematic error the elementwise rule would let through on small entries). NaN fails. */
static void check_bf16(const char *label, const sg_tensor *got, const sg_tensor *ref)
{
    tu_close_tensors(label, got, ref, tu_tol_for(SG_DTYPE_BF16));
    const double e = rel_frobenius(got, ref);
    TU_CHECK(e < 2e-2, "%s: relative Frobenius error %.3g, expected < 2e-2", label, e);
    printf("%s: relative Frobenius error %.3g\n", label, e);
}

/* Row sums of a bf16 att: each entry is rounded once (through f32) to bf16, within 2^-8
 * relative (plus 2^-24), so a row summing to 1 before rounding is off by at most about 2^-8. */
#define BF16_ROW_SUM_TOL (0x1p-8 * 1.001)

/* ---- cpu ---- */

static void cpu_forward_naive(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const sg_dtype dts[2] = {SG_DTYPE_F64, SG_DTYPE_F32};
    for (int k = 0; k < 2; k++)
        for (int rep = 0; rep < 6; rep++) {
            const int H = tu_randint(1, 4);
            dims d = {tu_randint(1, 3), rep == 0 ? 1 : tu_randint(2, 17), (int64_t)H * tu_randint(1, 8), H};
            const int flat = rep % 2;
            att_set s = make_set(ctx, dts[k], d, 0, flat);
            free(tu_random(s.qkv, -1, 1));
            tu_poison(s.out);
            tu_poison(s.att);
            tu_poison(s.work);
            TU_OK(ctx, sg_attention_forward(ctx, s.qkv, d.H, s.out, s.att, s.work));
            char what[128];
            dims_str(what, sizeof what, "cpu forward", d, dts[k], flat);
            check_forward_naive(what, &s, d, tu_tol_for(dts[k]));
            /* f32: each entry rounded once (2^-24 relative), so a row sum is off by <= T ulp. */
            check_att_rows(what, s.att, dts[k] == SG_DTYPE_F64 ? 1e-13 : 1.2e-7 * (double)d.T);
            tu_free_live();
        }
    sg_ctx_destroy(ctx);
}

typedef struct {
    sg_ctx *ctx;
    att_set s;
    dims d;
    sg_tensor *r;
} fd_case;

/* L = sum(out * r), recomputed from the current qkv. */
static double fd_loss(void *u)
{
    fd_case *c = u;
    TU_OK(c->ctx, sg_attention_forward(c->ctx, c->s.qkv, c->d.H, c->s.out, c->s.att, c->s.work));
    return tu_dot(c->s.out, c->r);
}

static void cpu_gradcheck_case(sg_ctx *ctx, dims d, int flat)
{
    const sg_dtype f64 = SG_DTYPE_F64;
    char what[80], label[112]; /* tu_gradcheck appends to label in a buffer of 160 */
    dims_str(what, sizeof what, "cpu gradcheck", d, f64, flat);
    fd_case c = {ctx, make_set(ctx, f64, d, 0, flat), d, NULL};
    c.r = tu_keep(tu_tensor(ctx, f64, c.s.out->ndim, c.s.out->shape, "r"));
    free(tu_random(c.s.qkv, -1, 1));
    double *rv = tu_random(c.r, -1, 1);

    TU_OK(ctx, sg_attention_forward(ctx, c.s.qkv, d.H, c.s.out, c.s.att, c.s.work));
    /* Backward of L: dout = r, which the call must leave as it is; dqkv poisoned. */
    tu_set(c.s.dout, rv);
    tu_poison(c.s.dqkv);
    TU_OK(ctx, sg_attention_backward(ctx, c.s.qkv, c.s.att, c.s.dout, d.H, c.s.dqkv, c.s.work));
    TU_CHECK(same_values(c.s.dout, rv), "%s: the backward modified dout", what);

    if (d.T == 1) {
        /* One key: att = 1 whatever q and k are, so dq = dk = 0 exactly and dv = dout. */
        double *g = tu_get(c.s.dqkv);
        int64_t nonzero = 0, bad_dv = 0;
        for (int64_t bt = 0; bt < d.B; bt++)
            for (int64_t j = 0; j < 3 * d.C; j++) {
                const double v = g[bt * 3 * d.C + j];
                if (j < 2 * d.C) nonzero += v != 0.0;
                else bad_dv += v != rv[bt * d.C + j - 2 * d.C];
            }
        TU_CHECK(nonzero == 0 && bad_dv == 0, "%s: T = 1: %lld nonzero dq/dk, %lld dv != dout", what,
                 (long long)nonzero, (long long)bad_dv);
        free(g);
    }
    /* Central differences in f64: truncation ~h^2, rounding ~1e-16 * |L| / h ~ 1e-9. */
    snprintf(label, sizeof label, "%s: dqkv", what);
    tu_gradcheck(label, fd_loss, &c, c.s.qkv, c.s.dqkv, 0, 1e-6, (tu_tol){1e-8, 1e-6});
    free(rv);
    tu_free_live();
}

static void cpu_gradchecks(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    cpu_gradcheck_case(ctx, (dims){1, 1, 1, 1}, 0);
    cpu_gradcheck_case(ctx, (dims){2, 1, 6, 2}, 1);
    cpu_gradcheck_case(ctx, (dims){1, 2, 2, 1}, 0);
    for (int rep = 0; rep < 6; rep++) {
        const int H = tu_randint(1, 3);
        dims d = {tu_randint(1, 2), tu_randint(rep < 2 ? 1 : 2, 6), (int64_t)H * tu_randint(1, 4), H};
        cpu_gradcheck_case(ctx, d, rep == 3);
    }
    sg_ctx_destroy(ctx);
}

/* The f32 path of the reference agrees with its f64 path on the same (f32) values. */
static void cpu_f32_vs_f64(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const int H = tu_randint(1, 4);
    dims d = {tu_randint(1, 3), tu_randint(1, 24), (int64_t)H * tu_randint(1, 12), H};
    att_set s32 = make_set(ctx, SG_DTYPE_F32, d, 0, 0), s64 = make_set(ctx, SG_DTYPE_F64, d, 0, 1);
    free(tu_random(s32.qkv, -1, 1));
    free(tu_random(s32.dout, -1, 1));
    double *v = tu_get(s32.qkv);
    tu_set(s64.qkv, v);
    free(v);
    v = tu_get(s32.dout);
    tu_set(s64.dout, v);
    free(v);
    att_set *sets[2] = {&s32, &s64};
    for (int k = 0; k < 2; k++) {
        att_set *s = sets[k];
        TU_OK(ctx, sg_attention_forward(ctx, s->qkv, d.H, s->out, s->att, s->work));
        TU_OK(ctx, sg_attention_backward(ctx, s->qkv, s->att, s->dout, d.H, s->dqkv, s->work));
    }
    char what[128], label[200];
    dims_str(what, sizeof what, "cpu f32 vs f64", d, SG_DTYPE_F32, 0);
    snprintf(label, sizeof label, "%s: out", what);
    tu_close_tensors(label, s32.out, s64.out, tu_tol_for(SG_DTYPE_F32));
    snprintf(label, sizeof label, "%s: att", what);
    tu_close_tensors(label, s32.att, s64.att, tu_tol_for(SG_DTYPE_F32));
    /* The f32 backward reads the f32-rounded att: an extra 2^-24 relative per entry. */
    snprintf(label, sizeof label, "%s: dqkv", what);
    tu_close_tensors(label, s32.dqkv, s64.dqkv, tu_tol_for(SG_DTYPE_F32));
    tu_free_live();
    sg_ctx_destroy(ctx);
}

/* The bf16 path of the reference (bf16 tensors, F32 work) against its f64 path on the same
 * values: qkv and dout rounded to bf16 first, so only what the bf16 call rounds is measured
 * (out, att and dqkv, once each, and the backward reading the rounded att as saved). */
static void cpu_bf16_vs_f64(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    for (int rep = 0; rep < 4; rep++) {
        const int H = tu_randint(1, 4);
        dims d = {tu_randint(1, 3), rep == 0 ? 1 : tu_randint(2, 24),
                  (int64_t)H * tu_randint(1, 12), H};
        const int flat = rep % 2;
        att_set sb = make_set(ctx, SG_DTYPE_BF16, d, 0, flat);
        att_set s64 = make_set(ctx, SG_DTYPE_F64, d, 0, !flat);
        free(tu_random(sb.qkv, -2, 2));
        free(tu_random(sb.dout, -1, 1));
        double *v = tu_get(sb.qkv); /* the bf16 values */
        tu_set(s64.qkv, v);
        free(v);
        v = tu_get(sb.dout);
        tu_set(s64.dout, v);
        free(v);
        tu_poison(sb.out);
        tu_poison(sb.att);
        tu_poison(sb.dqkv);
        att_set *sets[2] = {&sb, &s64};
        for (int k = 0; k < 2; k++) {
            att_set *s = sets[k];
            TU_OK(ctx, sg_attention_forward(ctx, s->qkv, d.H, s->out, s->att, s->work));
            TU_OK(ctx, sg_attention_backward(ctx, s->qkv, s->att, s->dout, d.H, s->dqkv, s->work));
        }
        char what[128], label[200];
        dims_str(what, sizeof what, "cpu bf16 vs f64", d, SG_DTYPE_BF16, flat);
        snprintf(label, sizeof label, "%s: out", what);
        check_bf16(label, sb.out, s64.out);
        snprintf(label, sizeof label, "%s: att", what);
        check_bf16(label, sb.att, s64.att);
        check_att_rows(what, sb.att, BF16_ROW_SUM_TOL);
        snprintf(label, sizeof label, "%s: dqkv", what);
        check_bf16(label, sb.dqkv, s64.dqkv);
        tu_free_live();
    }
    sg_ctx_destroy(ctx);
}

/* sg_attention_work_elems: the documented size; -1 for arguments that make no problem. */
static void cpu_work_elems(void)
{
    TU_CHECK(sg_attention_work_elems(2, 3, 8, 2) == 4 * 2 * 3 * 8 + 2 * 2 * 3 * 3,
             "work_elems(2,3,8,2) = %lld", (long long)sg_attention_work_elems(2, 3, 8, 2));
    TU_CHECK(sg_attention_work_elems(2, 3, 8, 3) == -1, "work_elems with C %% heads != 0");
    TU_CHECK(sg_attention_work_elems(2, 3, 8, 0) == -1, "work_elems with heads 0");
    TU_CHECK(sg_attention_work_elems(0, 3, 8, 2) == -1, "work_elems with B 0");
    TU_CHECK(sg_attention_work_elems(1, (int64_t)1 << 40, 1 << 20, 1) == -1, "work_elems overflow");
}

/* Wrong shapes, dtypes, NULLs, overlaps, small work: the right status and a message naming
 * the tensor; the context works afterwards. */
static void cpu_errors(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU), *other = tu_ctx(SG_BACKEND_CPU);
    const sg_dtype f = SG_DTYPE_F32;
    dims d = {2, 3, 8, 2};
    att_set s = make_set(ctx, f, d, 0, 0);
    const int64_t wn = sg_attention_work_elems(2, 3, 8, 2), wsmall = wn - 1;
    const int64_t q25[3] = {2, 3, 25}, q2d[2] = {5, 24}, o9[3] = {2, 3, 9}, a1[4] = {2, 1, 3, 3};
    const int64_t q1d = 144, qf[2] = {6, 24}, of[2] = {6, 8}, of9[2] = {6, 9};
    const int64_t o24[3] = {2, 3, 24}, q8[3] = {2, 3, 8}, a33[4] = {2, 2, 3, 4};
    sg_tensor *qkv25 = tu_keep(tu_tensor(ctx, f, 3, q25, "qkv25"));
    sg_tensor *qkv2d = tu_keep(tu_tensor(ctx, f, 2, q2d, "qkv2d"));
    sg_tensor *qkv1d = tu_keep(tu_tensor(ctx, f, 1, &q1d, "qkv1d"));
    sg_tensor *qkvf = tu_keep(tu_tensor(ctx, f, 2, qf, "qkv_flat"));
    sg_tensor *outf = tu_keep(tu_tensor(ctx, f, 2, of, "out_flat"));
    sg_tensor *outf9 = tu_keep(tu_tensor(ctx, f, 2, of9, "out_flat9"));
    sg_tensor *qkvi = tu_keep(tu_tensor(ctx, SG_DTYPE_I32, 3, s.qkv->shape, "qkvi"));
    sg_tensor *out9 = tu_keep(tu_tensor(ctx, f, 3, o9, "out9"));
    sg_tensor *out64 = tu_keep(tu_tensor(ctx, SG_DTYPE_F64, 3, s.out->shape, "out64"));
    sg_tensor *att1 = tu_keep(tu_tensor(ctx, f, 4, a1, "att1"));
    sg_tensor *att34 = tu_keep(tu_tensor(ctx, f, 4, a33, "att34"));
    sg_tensor *ws = tu_keep(tu_tensor1(ctx, f, wsmall, "work_small"));
    sg_tensor *w64 = tu_keep(tu_tensor1(ctx, SG_DTYPE_F64, wn, "work64"));
    sg_tensor *dout24 = tu_keep(tu_tensor(ctx, f, 3, o24, "dout24"));
    sg_tensor *dqkv8 = tu_keep(tu_tensor(ctx, f, 3, q8, "dqkv8"));
    sg_tensor *dqkv64 = tu_keep(tu_tensor(ctx, SG_DTYPE_F64, 3, s.qkv->shape, "dqkv64"));
    sg_tensor *wo = tu_tensor1(other, f, wn, "work_other");
    sg_tensor *outv; /* 'out' inside work */
    TU_OK(ctx, sg_tensor_view(s.work, 0, 3, s.out->shape, "out_in_work", &outv));
    tu_keep(outv);
    free(tu_random(s.qkv, -1, 1));
    free(tu_random(s.dout, -1, 1));
    free(tu_random(qkvf, -1, 1));

    TU_FAILS(ctx, sg_attention_forward(ctx, qkv25, 2, s.out, s.att, s.work), SG_ERR_SHAPE,
             "sg_attention_forward: 'qkv' is (2, 3, 25) f32, expected (B, T, 3C)");
    TU_FAILS(ctx, sg_attention_forward(ctx, qkv2d, 2, s.out, s.att, s.work), SG_ERR_SHAPE,
             "'qkv' is (5, 24) f32, expected (2, 3, 24) (B, T, 3C) or (6, 24) with B*T rows");
    TU_FAILS(ctx, sg_attention_forward(ctx, qkv1d, 2, s.out, s.att, s.work), SG_ERR_SHAPE,
             "'qkv' is (144) f32, expected (B, T, 3C) or (B*T, 3C)");
    TU_FAILS(ctx, sg_attention_forward(ctx, qkvf, 2, s.out, att1, s.work), SG_ERR_SHAPE,
             "'att' is (2, 1, 3, 3) f32, expected (B, 2, T, T)");
    TU_FAILS(ctx, sg_attention_forward(ctx, qkvf, 2, s.out, att34, s.work), SG_ERR_SHAPE,
             "'att' is (2, 2, 3, 4) f32, expected (B, 2, T, T)");
    TU_FAILS(ctx, sg_attention_forward(ctx, qkvf, 2, outf9, s.att, s.work), SG_ERR_SHAPE,
             "'out' is (6, 9) f32, expected (2, 3, 8) (B, T, C) or (6, 8) with B*T rows");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 3, s.out, s.att, s.work), SG_ERR_SHAPE,
             "C = 8, which heads = 3 does not divide");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 0, s.out, s.att, s.work), SG_ERR_INVALID,
             "heads is 0");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, -2, s.out, s.att, s.work), SG_ERR_INVALID,
             "heads is -2");
    TU_FAILS(ctx, sg_attention_forward(ctx, qkvi, 2, s.out, s.att, s.work), SG_ERR_DTYPE,
             "'qkv' is i32");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 2, out9, s.att, s.work), SG_ERR_SHAPE,
             "'out' is (2, 3, 9) f32, expected (2, 3, 8) (B, T, C)");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 2, out64, s.att, s.work), SG_ERR_DTYPE,
             "'out' is f64, expected f32");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 2, s.out, att1, s.work), SG_ERR_SHAPE,
             "'att' is (2, 1, 3, 3) f32, expected (2, 2, 3, 3) (B, heads, T, T)");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 2, s.out, att34, s.work), SG_ERR_SHAPE,
             "'att' is (2, 2, 3, 4) f32");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 2, s.out, s.att, ws), SG_ERR_SHAPE,
             "'work' has 227 elements, expected at least 228");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 2, s.out, s.att, w64), SG_ERR_DTYPE,
             "'work' is f64, expected f32");
    TU_FAILS(ctx, sg_attention_forward(ctx, NULL, 2, s.out, s.att, s.work), SG_ERR_NULL,
             "'qkv' is NULL");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 2, NULL, s.att, s.work), SG_ERR_NULL,
             "'out' is NULL");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 2, s.out, NULL, s.work), SG_ERR_NULL,
             "'att' is NULL");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 2, s.out, s.att, NULL), SG_ERR_NULL,
             "'work' is NULL");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 2, s.out, s.att, wo), SG_ERR_BACKEND, "'work'");
    TU_FAILS(ctx, sg_attention_forward(ctx, s.qkv, 2, outv, s.att, s.work), SG_ERR_INVALID,
             "output 'out' overlaps 'work'");
    TU_CHECK(sg_attention_forward(NULL, s.qkv, 2, s.out, s.att, s.work) == SG_ERR_NULL, "NULL ctx");

    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, s.att, s.dout, 3, s.dqkv, s.work),
             SG_ERR_SHAPE, "sg_attention_backward: 'qkv' is (2, 3, 24) f32, so C = 8");
    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, att1, s.dout, 2, s.dqkv, s.work),
             SG_ERR_SHAPE, "'att' is (2, 1, 3, 3) f32");
    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, s.att, dout24, 2, s.dqkv, s.work),
             SG_ERR_SHAPE, "'dout' is (2, 3, 24) f32, expected (2, 3, 8) (B, T, C)");
    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, s.att, s.dout, 2, dqkv8, s.work),
             SG_ERR_SHAPE, "'dqkv' is (2, 3, 8) f32, expected (2, 3, 24) (B, T, 3C)");
    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, s.att, s.dout, 2, dqkv64, s.work),
             SG_ERR_DTYPE, "'dqkv' is f64, expected f32");
    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, s.att, s.dout, 2, s.dqkv, ws), SG_ERR_SHAPE,
             "'work' has 227 elements");
    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, s.att, s.dout, 0, s.dqkv, s.work),
             SG_ERR_INVALID, "heads is 0");
    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, NULL, s.dout, 2, s.dqkv, s.work), SG_ERR_NULL,
             "'att' is NULL");
    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, s.att, NULL, 2, s.dqkv, s.work), SG_ERR_NULL,
             "'dout' is NULL");
    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, s.att, s.dout, 2, NULL, s.work), SG_ERR_NULL,
             "'dqkv' is NULL");
    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, s.att, s.dout, 2, s.dqkv, NULL), SG_ERR_NULL,
             "'work' is NULL");
    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, s.att, s.dout, 2, s.qkv, s.work),
             SG_ERR_INVALID, "output 'dqkv' overlaps 'qkv'");
    TU_FAILS(ctx, sg_attention_backward(ctx, s.qkv, s.att, outv, 2, s.dqkv, s.work),
             SG_ERR_INVALID, "output 'work' overlaps 'dout'");
    TU_CHECK(sg_attention_backward(NULL, s.qkv, s.att, s.dout, 2, s.dqkv, s.work) == SG_ERR_NULL,
             "NULL ctx");

    /* 3-D and 2-D activations mix: a flat out with a 3-D qkv is the same memory. */
    TU_OK(ctx, sg_attention_forward(ctx, s.qkv, 2, outf, s.att, s.work));
    TU_OK(ctx, sg_attention_forward(ctx, qkvf, 2, s.out, s.att, s.work));

    /* The context still works: a forward agrees with the naive loop, a backward runs. */
    tu_poison(s.out);
    tu_poison(s.att);
    TU_OK(ctx, sg_attention_forward(ctx, s.qkv, 2, s.out, s.att, s.work));
    check_forward_naive("cpu f32 after errors", &s, d, tu_tol_for(f));
    tu_poison(s.dqkv);
    TU_OK(ctx, sg_attention_backward(ctx, s.qkv, s.att, s.dout, 2, s.dqkv, s.work));
    double *g = tu_get(s.dqkv);
    int64_t nan = 0;
    for (int64_t i = 0; i < s.dqkv->numel; i++) nan += isnan(g[i]);
    TU_CHECK(nan == 0, "cpu after errors: %lld elements of dqkv unwritten", (long long)nan);
    free(g);
    sg_tensor_destroy(wo);
    tu_free_live();
    sg_ctx_destroy(other);
    sg_ctx_destroy(ctx);
}

/* bf16 is taken for every activation but work; mixing it with f32 or f64 fails naming the
 * tensor that differs from qkv (att included: it has qkv's dtype), before anything runs. */
static void cpu_mixed_dtypes(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    dims d = {2, 3, 8, 2};
    att_set b = make_set(ctx, SG_DTYPE_BF16, d, 0, 0), f = make_set(ctx, SG_DTYPE_F32, d, 0, 0);
    att_set w = make_set(ctx, SG_DTYPE_F64, d, 0, 0);
    const int64_t wn = sg_attention_work_elems(2, 3, 8, 2);
    sg_tensor *wb = tu_keep(tu_tensor1(ctx, SG_DTYPE_BF16, wn, "work_bf16"));
    sg_tensor *w64 = tu_keep(tu_tensor1(ctx, SG_DTYPE_F64, wn, "work_f64"));
    free(tu_random(b.qkv, -1, 1));
    free(tu_random(b.dout, -1, 1));
    tu_poison(b.out);
    tu_poison(b.dqkv);
    TU_FAILS(ctx, sg_attention_forward(ctx, b.qkv, 2, b.out, f.att, b.work), SG_ERR_DTYPE,
             "sg_attention_forward: tensor 'att' is f32, expected bf16");
    TU_FAILS(ctx, sg_attention_forward(ctx, b.qkv, 2, f.out, b.att, b.work), SG_ERR_DTYPE,
             "tensor 'out' is f32, expected bf16");
    TU_FAILS(ctx, sg_attention_forward(ctx, f.qkv, 2, f.out, b.att, f.work), SG_ERR_DTYPE,
             "tensor 'att' is bf16, expected f32");
    TU_FAILS(ctx, sg_attention_forward(ctx, f.qkv, 2, b.out, f.att, f.work), SG_ERR_DTYPE,
             "tensor 'out' is bf16, expected f32");
    TU_FAILS(ctx, sg_attention_forward(ctx, w.qkv, 2, w.out, b.att, w.work), SG_ERR_DTYPE,
             "tensor 'att' is bf16, expected f64");
    TU_FAILS(ctx, sg_attention_forward(ctx, b.qkv, 2, b.out, b.att, wb), SG_ERR_DTYPE,
             "tensor 'work' is bf16, expected f32");
    TU_FAILS(ctx, sg_attention_forward(ctx, b.qkv, 2, b.out, b.att, w64), SG_ERR_DTYPE,
             "tensor 'work' is f64, expected f32");
    TU_FAILS(ctx, sg_attention_backward(ctx, b.qkv, f.att, b.dout, 2, b.dqkv, b.work),
             SG_ERR_DTYPE, "sg_attention_backward: tensor 'att' is f32, expected bf16");
    TU_FAILS(ctx, sg_attention_backward(ctx, b.qkv, b.att, f.dout, 2, b.dqkv, b.work),
             SG_ERR_DTYPE, "tensor 'dout' is f32, expected bf16");
    TU_FAILS(ctx, sg_attention_backward(ctx, b.qkv, b.att, b.dout, 2, f.dqkv, b.work),
             SG_ERR_DTYPE, "tensor 'dqkv' is f32, expected bf16");
    TU_FAILS(ctx, sg_attention_backward(ctx, f.qkv, f.att, b.dout, 2, f.dqkv, f.work),
             SG_ERR_DTYPE, "tensor 'dout' is bf16, expected f32");
    TU_FAILS(ctx, sg_attention_backward(ctx, w.qkv, w.att, w.dout, 2, b.dqkv, w.work),
             SG_ERR_DTYPE, "tensor 'dqkv' is bf16, expected f64");
    TU_FAILS(ctx, sg_attention_backward(ctx, b.qkv, b.att, b.dout, 2, b.dqkv, wb), SG_ERR_DTYPE,
             "tensor 'work' is bf16, expected f32");

    /* Rejected calls wrote nothing; the all-bf16 calls (F32 work) then run. */
    double *o = tu_get(b.out), *g = tu_get(b.dqkv);
    int64_t written = 0;
    for (int64_t i = 0; i < b.out->numel; i++) written += !isnan(o[i]);
    for (int64_t i = 0; i < b.dqkv->numel; i++) written += !isnan(g[i]);
    TU_CHECK(written == 0, "cpu mixed dtypes: rejected calls wrote %lld elements",
             (long long)written);
    free(o);
    free(g);
    TU_OK(ctx, sg_attention_forward(ctx, b.qkv, 2, b.out, b.att, b.work));
    TU_OK(ctx, sg_attention_backward(ctx, b.qkv, b.att, b.dout, 2, b.dqkv, b.work));
    check_forward_naive("cpu bf16 after mixed-dtype errors", &b, d, tu_tol_for(SG_DTYPE_BF16));
    tu_free_live();
    sg_ctx_destroy(ctx);
}

/* ---- capture: forward + backward recorded once, replayed on new inputs ---- */

typedef struct {
    sg_ctx *ctx;
    att_set s;
    int heads;
} att_step;

static sg_status att_step_fn(void *u)
{
    att_step *a = u;
    SG_TRY(sg_attention_forward(a->ctx, a->s.qkv, a->heads, a->s.out, a->s.att, a->s.work));
    return sg_attention_backward(a->ctx, a->s.qkv, a->s.att, a->s.dout, a->heads, a->s.dqkv,
                                 a->s.work);
}

/* Captures the step (warm-up `warmup`), then replays it on fresh inputs: out, att and dqkv
 * (of dtype dt) must equal an eager run of the same calls bit for bit. */
static void check_capture(sg_ctx *ctx, dims d, int warmup, int flat, sg_dtype dt, const char *what)
{
    if (sg_graphs_disabled()) {
        printf("%s: skipped (STEPGRAPH_DISABLE_GRAPHS=1)\n", what);
        return;
    }
    att_step st = {ctx, make_set(ctx, dt, d, 0, flat), d.H};
    att_set ref = make_set(ctx, dt, d, 0, flat);
    free(tu_random(st.s.qkv, -1, 1));
    free(tu_random(st.s.dout, -1, 1));
    const sg_tensor *ins[2] = {st.s.qkv, st.s.dout};
    sg_graph_options o = sg_graph_options_default();
    o.name = "attention";
    o.warmup = warmup;
    o.static_inputs = ins;
    o.n_static_inputs = 2;
    sg_graph *g = NULL;
    TU_OK(ctx, sg_graph_capture(ctx, att_step_fn, &st, &o, &g));
    for (int rep = 0; rep < 2; rep++) {
        double *x = tu_random(st.s.qkv, -1, 1), *dy = tu_random(st.s.dout, -1, 1);
        tu_poison(st.s.out);
        tu_poison(st.s.att);
        tu_poison(st.s.dqkv);
        tu_poison(st.s.work);
        TU_OK(ctx, sg_graph_replay(g));
        tu_set(ref.qkv, x);
        tu_set(ref.dout, dy);
        TU_OK(ctx, sg_attention_forward(ctx, ref.qkv, d.H, ref.out, ref.att, st.s.work));
        TU_OK(ctx, sg_attention_backward(ctx, ref.qkv, ref.att, ref.dout, d.H, ref.dqkv, st.s.work));
        char label[160];
        const sg_tensor *got[3] = {st.s.out, st.s.att, st.s.dqkv}, *want[3] = {ref.out, ref.att, ref.dqkv};
        for (int i = 0; i < 3; i++) {
            snprintf(label, sizeof label, "%s: replay %d: %s", what, rep, want[i]->name);
            tu_close_tensors(label, got[i], want[i], (tu_tol){0, 0});
        }
        free(x);
        free(dy);
    }
    sg_graph_destroy(g);
    tu_free_live();
}

static void cpu_capture(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    /* No warm-up: the CPU path needs no lazy set-up, and the plan must hold both calls. */
    check_capture(ctx, (dims){2, 5, 12, 3}, 0, 1, SG_DTYPE_F32, "cpu capture");
    check_capture(ctx, (dims){2, 5, 12, 3}, 0, 0, SG_DTYPE_BF16, "cpu capture bf16");
    sg_ctx_destroy(ctx);
}

/* ---- gpu: CUDA against the CPU reference ---- */

/* cuBLAS sums `len` products in f32 in an order of its choosing, the reference in double:
 * the f32 rule's atol (1e-5, set for elementwise ops) is scaled by sqrt(len), the growth of a
 * random walk of rounding errors. att comes from hs-long dot products (the softmax is
 * elementwise and normalized); out and dqkv add sums over T (att v; dv, and through the
 * softmax backward dq and dk) to those: len = T + hs. */
static tu_tol gemm_tol(int64_t len)
{
    tu_tol t = tu_tol_for(SG_DTYPE_F32);
    t.atol *= sqrt((double)(len > 1 ? len : 1));
    return t;
}

static double max_abs_diff(const sg_tensor *a, const sg_tensor *b)
{
    double *u = tu_get(a), *v = tu_get(b), mx = 0;
    for (int64_t i = 0; i < a->numel; i++) mx = fmax(mx, fabs(u[i] - v[i]));
    free(u);
    free(v);
    return mx;
}

enum { FWD_LAUNCHES = 5, BWD_LAUNCHES = 7 };

/* One result of dtype f against the CPU's: f32 under gemm_tol(len), bf16 under check_bf16.
 * bf16 needs no wider rule than its own: the CPU rounds each output once from double, the
 * GPU once from fp32 sums of exact bf16 products, and the GPU's extra roundings (att before
 * att v; d(scores) before dq and dk) are 2^-8 relative per term, summed over terms whose
 * total is O(1) here, far below the rule's 1e-2 absolute. */
static void check_result(const char *label, const sg_tensor *got, const sg_tensor *ref,
                         sg_dtype f, int64_t len)
{
    if (f == SG_DTYPE_BF16) check_bf16(label, got, ref);
    else tu_close_tensors(label, got, ref, gemm_tol(len));
}

static void gpu_case(sg_ctx *gpu, sg_ctx *cpu, dims d, int mis, int flat, sg_dtype f)
{
    if (f == SG_DTYPE_BF16 && tu_racecheck()) return; /* see tu_racecheck in testutil.h */
    const int64_t hs = d.C / d.H;
    char what[160], label[224];
    dims_str(what, sizeof what, mis ? "gpu (misaligned views)" : "gpu", d, f, flat);
    att_set g = make_set(gpu, f, d, mis, flat), c = make_set(cpu, f, d, 0, flat);
    /* |q.k|/sqrt(hs) of a few units: softmax rows far from uniform. x and dy: the values as
     * stored (f32 or bf16), to check later that the calls left qkv and dout alone; the CPU
     * reference gets the same values in the same dtype. */
    free(tu_random(g.qkv, -2, 2));
    free(tu_random(g.dout, -1, 1));
    double *x = tu_get(g.qkv), *dy = tu_get(g.dout);
    tu_set(c.qkv, x);
    tu_set(c.dout, dy);

    /* ---- forward ---- */
    tu_poison(g.out);
    tu_poison(g.att);
    tu_poison(g.work);
    uint64_t l0 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_attention_forward(gpu, g.qkv, d.H, g.out, g.att, g.work));
    TU_CHECK(sg_ctx_launch_count(gpu) - l0 == FWD_LAUNCHES, "%s: forward took %llu launches, expected %d",
             what, (unsigned long long)(sg_ctx_launch_count(gpu) - l0), FWD_LAUNCHES);
    TU_OK(cpu, sg_attention_forward(cpu, c.qkv, d.H, c.out, c.att, c.work));
    snprintf(label, sizeof label, "%s: out", what);
    check_result(label, g.out, c.out, f, d.T + hs);
    snprintf(label, sizeof label, "%s: att", what);
    check_result(label, g.att, c.att, f, hs);
    check_att_rows(what, g.att,
                   1e-6 + 1.2e-7 * (double)d.T + (f == SG_DTYPE_BF16 ? BF16_ROW_SUM_TOL : 0));
    printf("%s: max |out - ref| %.3g, max |att - ref| %.3g\n", what, max_abs_diff(g.out, c.out),
           max_abs_diff(g.att, c.att));

    /* ---- backward, from the GPU's att (so only the backward's error is measured), with the
     * work poisoned again: nothing may carry over from the forward. */
    sg_tensor *catt = tu_keep(tu_clone_to(cpu, g.att, f));
    tu_poison(g.dqkv);
    tu_poison(g.work);
    l0 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_attention_backward(gpu, g.qkv, g.att, g.dout, d.H, g.dqkv, g.work));
    TU_CHECK(sg_ctx_launch_count(gpu) - l0 == BWD_LAUNCHES, "%s: backward took %llu launches, expected %d",
             what, (unsigned long long)(sg_ctx_launch_count(gpu) - l0), BWD_LAUNCHES);
    TU_OK(cpu, sg_attention_backward(cpu, c.qkv, catt, c.dout, d.H, c.dqkv, c.work));
    snprintf(label, sizeof label, "%s: dqkv", what);
    check_result(label, g.dqkv, c.dqkv, f, d.T + hs);
    printf("%s: max |dqkv - ref| %.3g\n", what, max_abs_diff(g.dqkv, c.dqkv));
    TU_CHECK(same_values(g.dout, dy), "%s: the backward modified dout", what);
    TU_CHECK(same_values(g.qkv, x), "%s: qkv was modified", what);

    /* ---- again: bit-identical, same launches, no device allocation ---- */
    double *out1 = tu_get(g.out), *att1 = tu_get(g.att), *dqkv1 = tu_get(g.dqkv);
    tu_poison(g.out);
    tu_poison(g.att);
    tu_poison(g.dqkv);
    tu_poison(g.work);
    sg_alloc_stats a0, a1;
    TU_OK(gpu, sg_ctx_alloc_stats(gpu, &a0));
    l0 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_attention_forward(gpu, g.qkv, d.H, g.out, g.att, g.work));
    TU_OK(gpu, sg_attention_backward(gpu, g.qkv, g.att, g.dout, d.H, g.dqkv, g.work));
    TU_CHECK(sg_ctx_launch_count(gpu) - l0 == FWD_LAUNCHES + BWD_LAUNCHES,
             "%s: repeated calls took %llu launches", what,
             (unsigned long long)(sg_ctx_launch_count(gpu) - l0));
    TU_OK(gpu, sg_ctx_alloc_stats(gpu, &a1));
    TU_CHECK(a1.device_allocs == a0.device_allocs, "%s: repeated calls allocated device memory", what);
    TU_CHECK(same_values(g.out, out1), "%s: a repeated forward's out differs", what);
    TU_CHECK(same_values(g.att, att1), "%s: a repeated forward's att differs", what);
    TU_CHECK(same_values(g.dqkv, dqkv1), "%s: a repeated backward's dqkv differs", what);
    free(out1);
    free(att1);
    free(dqkv1);
    free(x);
    free(dy);
    tu_free_live();
}

/* A capture whose first attention call would create the cuBLAS handle is refused, naming
 * the reason; the context then works eagerly. */
static void gpu_capture_refused(void)
{
    if (sg_graphs_disabled()) return;
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    dims d = {1, 4, 8, 2};
    att_step st = {gpu, make_set(gpu, SG_DTYPE_F32, d, 0, 0), d.H};
    free(tu_random(st.s.qkv, -1, 1));
    free(tu_random(st.s.dout, -1, 1));
    sg_graph_options o = sg_graph_options_default();
    o.name = "attention-cold";
    o.warmup = 0;
    sg_graph *g = NULL;
    TU_FAILS(gpu, sg_graph_capture(gpu, att_step_fn, &st, &o, &g), SG_ERR_CAPTURE,
             "created the attention cuBLAS handle");
    TU_CHECK(g == NULL, "a refused capture returned a graph");
    tu_poison(st.s.out);
    TU_OK(gpu, att_step_fn(&st));
    check_forward_naive("gpu after a refused capture", &st.s, d, gemm_tol(d.T + d.C / d.H));
    tu_free_live();
    sg_ctx_destroy(gpu);
}

static void gpu_vs_cpu(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    const int H = tu_randint(1, 4);
    const dims shapes[] = {
        {1, 1, 64, 1},
        {2, 7, 64, 2},
        {8, 128, 256, 4},
        {8, 256, 768, 12},
        {tu_randint(1, 4), tu_randint(1, 40), (int64_t)H * tu_randint(1, 20), H},
    };
    const size_t n_shapes = sizeof shapes / sizeof *shapes;
    const sg_dtype dts[2] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < n_shapes; i++)
            gpu_case(gpu, cpu, shapes[i], 0, i == n_shapes - 1, dts[k]);
        /* Views one element into their buffers: every pointer only 4-byte (f32, and bf16's
         * work) or 2-byte (bf16 activations) aligned; hs = 5. */
        gpu_case(gpu, cpu, (dims){2, 9, 15, 3}, 1, 0, dts[k]);
    }

    /* f32 and bf16 do not mix: the tensor that differs from qkv is named. */
    dims d = {1, 4, 8, 2};
    att_set s = make_set(gpu, SG_DTYPE_F32, d, 0, 0);
    sg_tensor *qh = tu_keep(tu_tensor(gpu, SG_DTYPE_BF16, 3, s.qkv->shape, "qkv_bf16"));
    sg_tensor *oh = tu_keep(tu_tensor(gpu, SG_DTYPE_BF16, 3, s.out->shape, "out_bf16"));
    sg_tensor *wh = tu_keep(tu_tensor1(gpu, SG_DTYPE_BF16, sg_attention_work_elems(1, 4, 8, 2), "work_bf16"));
    TU_FAILS(gpu, sg_attention_forward(gpu, qh, 2, s.out, s.att, s.work), SG_ERR_DTYPE,
             "'att' is f32, expected bf16");
    TU_FAILS(gpu, sg_attention_forward(gpu, s.qkv, 2, oh, s.att, s.work), SG_ERR_DTYPE,
             "'out' is bf16, expected f32");
    TU_FAILS(gpu, sg_attention_backward(gpu, s.qkv, s.att, s.dout, 2, s.dqkv, wh), SG_ERR_DTYPE,
             "'work' is bf16, expected f32");
    tu_free_live();

    /* Captured forward + backward (the handle exists by now) replays as eager runs. */
    check_capture(gpu, (dims){2, 33, 48, 3}, 1, 1, SG_DTYPE_F32, "gpu capture");
    check_capture(gpu, (dims){2, 33, 48, 3}, 1, 0, SG_DTYPE_BF16, "gpu capture bf16");
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
    gpu_capture_refused();
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_attention");
    if (!strcmp(mode, "gpu")) {
        gpu_vs_cpu();
    } else {
        cpu_work_elems();
        cpu_forward_naive();
        cpu_gradchecks();
        cpu_f32_vs_f64();
        cpu_bf16_vs_f64();
        cpu_capture();
        cpu_errors();
        cpu_mixed_dtypes();
    }
    return tu_finish("test_attention");
}
