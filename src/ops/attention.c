/* attention.c: public entry points of causal self-attention: check every argument (dtypes,
 * shapes, heads dividing C, the work size, outputs that overlap inputs), then run the CPU
 * reference or the CUDA path. Messages name the call and the tensor. Activations are
 * (B,T,cols) or (B*T,cols); B and T come from qkv when it is 3-D, else from att. Dtypes: qkv's
 * (f32, f64 on the CPU, or bf16) for every tensor but work, which is F32. */
#include "ops/attention.h"

/* The products of one causal pass (q k^T and p v over the lower triangle, T (T + 1) / 2 pairs
 * of hs-long rows a head): the forward's flops; the backward does twice as many. */
static double causal_flops(sg_attn_dims d)
{
    return 2.0 * 2.0 * (double)d.B * (double)d.H * ((double)d.T * (double)(d.T + 1) / 2) * (double)d.hs;
}

int64_t sg_attention_work_elems(int64_t B, int64_t T, int64_t C, int heads)
{
    if (B < 1 || T < 1 || C < 1 || heads < 1 || C % heads) return -1;
    /* 4 (B,H,T,hs) regions and one (B,H,T,T); -1 where that overflows int64. */
    const int64_t lim = INT64_MAX / 8;
    if (B > lim / T || B * T > lim / C || B * T > lim / heads || B * T * heads > lim / T)
        return -1;
    return 4 * B * T * C + B * heads * T * T;
}

/* t is exactly (d0, .., d{n-1}) of dtype dt. */
static sg_status check_dims(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                            sg_dtype dt, int n, const int64_t *dims, const char *layout)
{
    SG_TRY(sg_check_dtype(ctx, fn, what, t, dt));
    bool ok = t->ndim == n;
    for (int i = 0; ok && i < n; i++) ok = t->shape[i] == dims[i];
    if (!ok) {
        char s[96], want[96];
        int k = snprintf(want, sizeof want, "(");
        for (int i = 0; i < n && k < (int)sizeof want; i++)
            k += snprintf(want + k, sizeof want - k, "%s%lld", i ? ", " : "", (long long)dims[i]);
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: '%s' is %s, expected %s) %s", fn, what,
                       sg_shape_str(t, s, sizeof s), want, layout);
    }
    return SG_OK;
}

/* An activation of B*T rows: (B, T, cols), or (B*T, cols) with the rows flattened as the
 * linear layer takes them. */
static sg_status check_act(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                           sg_dtype dt, sg_attn_dims d, int64_t cols, const char *layout)
{
    SG_TRY(sg_check_dtype(ctx, fn, what, t, dt));
    bool ok = (t->ndim == 3 && t->shape[0] == d.B && t->shape[1] == d.T && t->shape[2] == cols) ||
              (t->ndim == 2 && t->shape[0] == d.B * d.T && t->shape[1] == cols);
    if (!ok) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: '%s' is %s, expected (%lld, %lld, %lld) %s or "
                       "(%lld, %lld) with B*T rows",
                       fn, what, sg_shape_str(t, s, sizeof s), (long long)d.B, (long long)d.T,
                       (long long)cols, layout, (long long)(d.B * d.T), (long long)cols);
    }
    return SG_OK;
}

/* qkv (B,T,3C) or (B*T,3C) of a float dtype (bf16 included), heads dividing C, and att
 * (B,heads,T,T) of qkv's dtype (bf16 att with bf16 qkv: attention.h says why): fills d. B and
 * T come from qkv when it is 3-D, else from att. */
/* qkv's dtype and columns, and heads dividing C: fills d's C, H and hs. */
static sg_status check_qkv(sg_ctx *ctx, const char *fn, const sg_tensor *qkv, int heads, sg_attn_dims *d)
{
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "qkv", qkv));
    char s[96];
    if ((qkv->ndim != 2 && qkv->ndim != 3) || qkv->shape[qkv->ndim - 1] % 3)
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: 'qkv' is %s, expected (B, T, 3C) or (B*T, 3C): q, k, v side by side",
                       fn, sg_shape_str(qkv, s, sizeof s));
    if (heads < 1)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: heads is %d, expected >= 1", fn, heads);
    d->C = qkv->shape[qkv->ndim - 1] / 3;
    d->H = heads;
    if (d->C % heads)
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: 'qkv' is %s, so C = %lld, which heads = %d does not divide (head size "
                       "C / heads must be whole)",
                       fn, sg_shape_str(qkv, s, sizeof s), (long long)d->C, heads);
    d->hs = d->C / heads;
    return SG_OK;
}

static sg_status check_problem(sg_ctx *ctx, const char *fn, const sg_tensor *qkv,
                               const sg_tensor *att, int heads, sg_attn_dims *d)
{
    char s[96];
    SG_TRY(check_qkv(ctx, fn, qkv, heads, d));
    SG_TRY(sg_check_dtype(ctx, fn, "att", att, qkv->dtype));
    if (qkv->ndim == 3) {
        d->B = qkv->shape[0];
        d->T = qkv->shape[1];
        const int64_t att_dims[4] = {d->B, d->H, d->T, d->T};
        return check_dims(ctx, fn, "att", att, qkv->dtype, 4, att_dims, "(B, heads, T, T)");
    }
    if (att->ndim != 4 || att->shape[1] != heads || att->shape[2] != att->shape[3])
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'att' is %s, expected (B, %d, T, T) (B, heads, T, T)",
                       fn, sg_shape_str(att, s, sizeof s), heads);
    d->B = att->shape[0];
    d->T = att->shape[2];
    return check_act(ctx, fn, "qkv", qkv, qkv->dtype, *d, 3 * d->C, "(B, T, 3C)");
}

/* work is F32 whatever the activations' dtype: the bf16 path fits in the same bytes. */
static sg_status check_work(sg_ctx *ctx, const char *fn, const sg_tensor *work, sg_attn_dims d)
{
    SG_TRY(sg_check_dtype(ctx, fn, "work", work, SG_DTYPE_F32));
    int64_t need = sg_attention_work_elems(d.B, d.T, d.C, (int)d.H);
    if (need < 0 || work->numel < need)
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: 'work' has %lld elements, expected at least %lld "
                       "(sg_attention_work_elems(B=%lld, T=%lld, C=%lld, heads=%lld))",
                       fn, (long long)work->numel, (long long)need, (long long)d.B, (long long)d.T,
                       (long long)d.C, (long long)d.H);
    return SG_OK;
}

/* The CPU reference runs through sg_cpu_run, so a CPU capture records it. */
typedef struct attn_args {
    const sg_tensor *qkv, *att_in, *dout;
    sg_tensor *out, *att; /* forward: out, att; backward: out is dqkv */
    sg_attn_dims d;
} attn_args;

static sg_status attn_fwd_cpu(sg_ctx *ctx, const void *p)
{
    const attn_args *a = p;
    return sg_attention_forward_cpu(ctx, a->qkv, a->out, a->att, a->d);
}

static sg_status attn_bwd_cpu(sg_ctx *ctx, const void *p)
{
    const attn_args *a = p;
    return sg_attention_backward_cpu(ctx, a->qkv, a->att_in, a->dout, a->out, a->d);
}

sg_status sg_attention_forward(sg_ctx *ctx, const sg_tensor *qkv, int heads, sg_tensor *out,
                               sg_tensor *att, sg_tensor *work)
{
    static const char fn[] = "sg_attention_forward";
    if (!ctx) return SG_ERR_NULL;
    sg_attn_dims d;
    SG_TRY(check_problem(ctx, fn, qkv, att, heads, &d));
    SG_TRY(check_act(ctx, fn, "out", out, qkv->dtype, d, d.C, "(B, T, C)"));
    SG_TRY(check_work(ctx, fn, work, d));
    const char *names[] = {"out", "att", "work", "qkv"};
    const sg_tensor *ts[] = {out, att, work, qkv};
    SG_TRY(sg_check_disjoint(ctx, fn, 3, 4, names, ts));

    sg_ctx_count_work(ctx, SG_WORK_ATTENTION, causal_flops(d), sg_tensors_bytes(qkv, out, att, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        attn_args a = {qkv, NULL, NULL, out, att, d};
        return sg_cpu_run(ctx, attn_fwd_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_attention_forward_cuda(ctx, qkv, out, att, work, d));
}

sg_status sg_attention_backward(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *att,
                                const sg_tensor *dout, int heads, sg_tensor *dqkv,
                                sg_tensor *work)
{
    static const char fn[] = "sg_attention_backward";
    if (!ctx) return SG_ERR_NULL;
    sg_attn_dims d;
    SG_TRY(check_problem(ctx, fn, qkv, att, heads, &d));
    SG_TRY(check_act(ctx, fn, "dout", dout, qkv->dtype, d, d.C, "(B, T, C)"));
    SG_TRY(check_act(ctx, fn, "dqkv", dqkv, qkv->dtype, d, 3 * d.C, "(B, T, 3C)"));
    SG_TRY(check_work(ctx, fn, work, d));
    const char *names[] = {"dqkv", "work", "qkv", "att", "dout"};
    const sg_tensor *ts[] = {dqkv, work, qkv, att, dout};
    SG_TRY(sg_check_disjoint(ctx, fn, 2, 5, names, ts));

    sg_ctx_count_work(ctx, SG_WORK_ATTENTION, 2 * causal_flops(d),
                      sg_tensors_bytes(qkv, att, dout, dqkv, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        attn_args a = {qkv, att, dout, dqkv, NULL, d};
        return sg_cpu_run(ctx, attn_bwd_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_attention_backward_cuda(ctx, qkv, att, dout, dqkv, work, d));
}

/* ---- the fused form ---- */

sg_status sg_attention_check_aligned(sg_ctx *ctx, const char *fn, const sg_tensor *const *ts, int n)
{
    for (int i = 0; i < n; i++)
        if ((uintptr_t)ts[i]->data % 16)
            return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: '%s' is not 16-byte aligned (the kernels read 16 "
                           "bytes at a time)", fn, ts[i]->name);
    return SG_OK;
}

int sg_attention_fused_supported(const sg_ctx *ctx, sg_dtype dtype, int64_t C, int heads)
{
    if (!ctx || heads < 1 || C < 1 || C % heads) return 0;
    if (ctx->backend == SG_BACKEND_CPU)
        return dtype == SG_DTYPE_F32 || dtype == SG_DTYPE_F64 || dtype == SG_DTYPE_BF16;
    const int64_t hs = C / heads;
    return (dtype == SG_DTYPE_BF16 && hs == 64) || (dtype == SG_DTYPE_F32 && hs % 4 == 0 && hs <= 128);
}

/* qkv as check_problem takes it, B and T from qkv (3-D) or from lse (B, heads, T) F32. */
static sg_status check_fused_problem(sg_ctx *ctx, const char *fn, const sg_tensor *qkv, const sg_tensor *lse,
                                     int heads, sg_attn_dims *d)
{
    char s[96];
    SG_TRY(check_qkv(ctx, fn, qkv, heads, d));
    SG_TRY(sg_check_dtype(ctx, fn, "lse", lse, SG_DTYPE_F32));
    if (lse->ndim != 3 || lse->shape[1] != heads)
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'lse' is %s, expected (B, %d, T) (B, heads, T)", fn,
                       sg_shape_str(lse, s, sizeof s), heads);
    d->B = qkv->ndim == 3 ? qkv->shape[0] : lse->shape[0];
    d->T = qkv->ndim == 3 ? qkv->shape[1] : lse->shape[2];
    if (qkv->ndim == 2 && qkv->shape[0] != d->B * d->T)
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'qkv' has %lld rows but 'lse' is %s: (B, heads, T) with B*T = %lld "
                       "rows expected", fn, (long long)qkv->shape[0], sg_shape_str(lse, s, sizeof s),
                       (long long)(d->B * d->T));
    const int64_t dims[3] = {d->B, d->H, d->T};
    SG_TRY(check_dims(ctx, fn, "lse", lse, SG_DTYPE_F32, 3, dims, "(B, heads, T)"));
    return check_act(ctx, fn, "qkv", qkv, qkv->dtype, *d, 3 * d->C, "(B, T, 3C)");
}

typedef struct fused_args {
    const sg_tensor *qkv, *out_in, *lse_in, *dout;
    sg_tensor *out, *lse; /* forward: out, lse; backward: dqkv, delta */
    sg_attn_dims d;
    sg_tensor *dbias;     /* backward with sums: dqkv's column sums (NULL: none) */
} fused_args;

static sg_status fused_fwd_cpu(sg_ctx *ctx, const void *p)
{
    const fused_args *a = p;
    return sg_attention_fused_forward_cpu(ctx, a->qkv, a->out, a->lse, a->d);
}

static sg_status fused_bwd_cpu(sg_ctx *ctx, const void *p)
{
    const fused_args *a = p;
    SG_TRY(sg_attention_fused_backward_cpu(ctx, a->qkv, a->out_in, a->lse_in, a->dout, a->out, a->lse, a->d));
    if (a->dbias) sg_attention_col_sums_cpu(a->out, a->dbias);
    return SG_OK;
}

sg_status sg_attention_fused_forward(sg_ctx *ctx, const sg_tensor *qkv, int heads, sg_tensor *out, sg_tensor *lse)
{
    static const char fn[] = "sg_attention_fused_forward";
    if (!ctx) return SG_ERR_NULL;
    sg_attn_dims d;
    SG_TRY(check_fused_problem(ctx, fn, qkv, lse, heads, &d));
    SG_TRY(check_act(ctx, fn, "out", out, qkv->dtype, d, d.C, "(B, T, C)"));
    const char *names[] = {"out", "lse", "qkv"};
    const sg_tensor *ts[] = {out, lse, qkv};
    SG_TRY(sg_check_disjoint(ctx, fn, 2, 3, names, ts));
    sg_ctx_count_work(ctx, SG_WORK_ATTENTION, causal_flops(d), sg_tensors_bytes(qkv, out, lse, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        fused_args a = {qkv, NULL, NULL, NULL, out, lse, d, NULL};
        return sg_cpu_run(ctx, fused_fwd_cpu, &a, sizeof a);
    }
    /* bf16 on the tensor cores; every other dtype to the f32 kernels, which refuse what they
     * do not take */
    if (qkv->dtype == SG_DTYPE_BF16)
        return SG_CUDA_DISPATCH(ctx, sg_attention_fused_forward_cuda(ctx, qkv, out, lse, d));
    return SG_CUDA_DISPATCH(ctx, sg_attention_fused_forward_f32_cuda(ctx, qkv, out, lse, d));
}

int64_t sg_attention_fused_parts(int64_t B, int64_t T, int64_t C)
{
    if (B < 1 || T < 1 || C < 1 || B > INT64_MAX / 3 / C / ((T + 63) / 64)) return -1;
    return B * ((T + 63) / 64) * 3 * C;
}

/* sg_attention_fused_backward, and with dbias the column sums (parts: their scratch). */
static sg_status fused_backward(sg_ctx *ctx, const char *fn, const sg_tensor *qkv, const sg_tensor *out,
                                const sg_tensor *lse, const sg_tensor *dout, int heads, sg_tensor *dqkv,
                                sg_tensor *delta, sg_tensor *dbias, sg_tensor *parts)
{
    if (!ctx) return SG_ERR_NULL;
    sg_attn_dims d;
    SG_TRY(check_fused_problem(ctx, fn, qkv, lse, heads, &d));
    SG_TRY(check_act(ctx, fn, "out", out, qkv->dtype, d, d.C, "(B, T, C)"));
    SG_TRY(check_act(ctx, fn, "dout", dout, qkv->dtype, d, d.C, "(B, T, C)"));
    SG_TRY(check_act(ctx, fn, "dqkv", dqkv, qkv->dtype, d, 3 * d.C, "(B, T, 3C)"));
    const int64_t dims[3] = {d.B, d.H, d.T};
    SG_TRY(check_dims(ctx, fn, "delta", delta, SG_DTYPE_F32, 3, dims, "(B, heads, T)"));
    const char *names[] = {"dqkv", "delta", "dbias", "parts", "qkv", "out", "lse", "dout"};
    const sg_tensor *ts[] = {dqkv, delta, dbias, parts, qkv, out, lse, dout};
    if (dbias) {
        SG_TRY(sg_check_count(ctx, fn, "dbias", dbias, qkv->dtype, 3 * d.C, "3C: the qkv projection's bias"));
        SG_TRY(sg_check_dtype(ctx, fn, "parts", parts, SG_DTYPE_F32));
        const int64_t need = sg_attention_fused_parts(d.B, d.T, d.C);
        if (parts->numel < need)
            return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'parts' has %lld elements, expected at least %lld "
                           "(sg_attention_fused_parts(B=%lld, T=%lld, C=%lld))", fn, (long long)parts->numel,
                           (long long)need, (long long)d.B, (long long)d.T, (long long)d.C);
        if (ctx->backend == SG_BACKEND_CUDA && qkv->dtype != SG_DTYPE_BF16)
            return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: CUDA sums the columns for bf16; this is %s (use "
                           "sg_attention_fused_backward and the projection's own bias sum)", fn,
                           sg_dtype_name(qkv->dtype));
    }
    SG_TRY(sg_check_disjoint(ctx, fn, 4, 8, names, ts)); /* dbias and parts NULL: skipped */
    sg_ctx_count_work(ctx, SG_WORK_ATTENTION, 2 * causal_flops(d),
                      sg_tensors_bytes(qkv, out, lse, dout, dqkv, delta, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        fused_args a = {qkv, out, lse, dout, dqkv, delta, d, dbias};
        return sg_cpu_run(ctx, fused_bwd_cpu, &a, sizeof a);
    }
    if (qkv->dtype == SG_DTYPE_BF16)
        return SG_CUDA_DISPATCH(ctx, sg_attention_fused_backward_cuda(ctx, qkv, out, lse, dout, dqkv, delta, dbias,
                                                                      parts, d));
    return SG_CUDA_DISPATCH(ctx, sg_attention_fused_backward_f32_cuda(ctx, qkv, out, lse, dout, dqkv, delta, d));
}

sg_status sg_attention_fused_backward(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out, const sg_tensor *lse,
                                      const sg_tensor *dout, int heads, sg_tensor *dqkv, sg_tensor *delta)
{
    return fused_backward(ctx, "sg_attention_fused_backward", qkv, out, lse, dout, heads, dqkv, delta, NULL, NULL);
}

sg_status sg_attention_fused_backward_sums(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out,
                                           const sg_tensor *lse, const sg_tensor *dout, int heads, sg_tensor *dqkv,
                                           sg_tensor *delta, sg_tensor *dbias, sg_tensor *parts)
{
    static const char fn[] = "sg_attention_fused_backward_sums";
    if (ctx && !dbias) return sg_fail(ctx, SG_ERR_NULL, "%s: tensor 'dbias' is NULL", fn);
    if (ctx && !parts) return sg_fail(ctx, SG_ERR_NULL, "%s: tensor 'parts' is NULL", fn);
    return fused_backward(ctx, fn, qkv, out, lse, dout, heads, dqkv, delta, dbias, parts);
}
