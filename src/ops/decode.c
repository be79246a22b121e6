/* decode.c: entry points of the decode ops (decode.h): every argument checked (dtypes, shapes,
 * outputs that overlap inputs), then the CPU reference through sg_cpu_run (so a CPU capture
 * records it and reads the device values when its plan runs) or the CUDA kernel. Nothing is
 * written before every check has passed. */
#include "ops/decode.h"

#include <math.h>
#include <stdlib.h>

static sg_status shape_fail(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t, const char *want)
{
    char s[96];
    return sg_fail(ctx, SG_ERR_SHAPE, "%s: '%s' (%s) is %s, expected %s", fn, what, t->name,
                   sg_shape_str(t, s, sizeof s), want);
}

/* A 2-D tensor of dtype dt with `cols` columns and at least min_rows rows (exactly, when exact). */
static sg_status check_mat(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t, sg_dtype dt,
                           int64_t rows, int64_t cols, bool exact)
{
    SG_TRY(sg_check_dtype(ctx, fn, what, t, dt));
    if (t->ndim != 2 || t->shape[1] != cols || (exact ? t->shape[0] != rows : t->shape[0] < rows)) {
        char want[96];
        snprintf(want, sizeof want, "(%s%lld, %lld) %s", exact ? "" : ">= ", (long long)rows, (long long)cols,
                 sg_dtype_name(dt));
        return shape_fail(ctx, fn, what, t, want);
    }
    return SG_OK;
}

/* A 1-D tensor of dtype dt and n elements. */
static sg_status check_vec(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t, sg_dtype dt, int64_t n)
{
    SG_TRY(sg_check_dtype(ctx, fn, what, t, dt));
    if (t->ndim != 1 || t->shape[0] != n) {
        char want[64];
        snprintf(want, sizeof want, "(%lld) %s", (long long)n, sg_dtype_name(dt));
        return shape_fail(ctx, fn, what, t, want);
    }
    return SG_OK;
}

/* ---- the cache attention ---- */

typedef struct kv_args {
    const sg_tensor *qkv, *start;
    sg_tensor *kc, *vc, *out;
    int heads;
} kv_args;

static sg_status kv_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    const kv_args *a = p;
    sg_kv_attention_cpu(a->qkv, a->heads, a->start, a->kc, a->vc, a->out);
    return SG_OK;
}

sg_status sg_kv_attention(sg_ctx *ctx, const sg_tensor *qkv, int heads, const sg_tensor *start,
                          sg_tensor *kcache, sg_tensor *vcache, sg_tensor *out)
{
    const char *fn = "sg_kv_attention";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "qkv", qkv));
    SG_TRY(sg_check_dtype(ctx, fn, "start", start, SG_DTYPE_I32));
    SG_TRY(sg_check_tensor(ctx, fn, "out", out));
    const int64_t B = start->numel, C = out->ndim == 2 ? out->shape[1] : 0;
    if (start->ndim != 1 || B < 1) return shape_fail(ctx, fn, "start", start, "(B) i32, B >= 1");
    if (heads < 1 || C < 1 || C % heads)
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: C %lld over %d heads: expected heads >= 1 dividing C", fn,
                       (long long)C, heads);
    if (qkv->ndim != 2 || qkv->shape[1] != 3 * C || qkv->shape[0] % B || qkv->shape[0] < B) {
        char want[96];
        snprintf(want, sizeof want, "(B*Tq, %lld) with B = %lld sequences (start's length)", (long long)(3 * C),
                 (long long)B);
        return shape_fail(ctx, fn, "qkv", qkv, want);
    }
    SG_TRY(check_mat(ctx, fn, "out", out, qkv->dtype, qkv->shape[0], C, true));
    const int64_t H = heads, hs = C / H;
    if (hs > SG_KV_MAX_HS)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: head size %lld (C %lld over %d heads): at most %d is "
                       "supported", fn, (long long)hs, (long long)C, heads, SG_KV_MAX_HS);
    for (int k = 0; k < 2; k++) {
        const sg_tensor *c = k ? vcache : kcache;
        const char *w = k ? "vcache" : "kcache";
        SG_TRY(sg_check_dtype(ctx, fn, w, c, qkv->dtype));
        if (c->ndim != 4 || c->shape[0] < B || c->shape[1] != H || c->shape[3] != hs || c->shape[2] < 1 ||
            c->shape[2] > SG_KV_MAX_T) {
            char want[128];
            snprintf(want, sizeof want, "(Bc >= %lld, %lld, Tc, %lld) with Tc 1..%d", (long long)B, (long long)H,
                     (long long)hs, SG_KV_MAX_T);
            return shape_fail(ctx, fn, w, c, want);
        }
    }
    if (kcache->shape[2] != vcache->shape[2] || kcache->shape[0] != vcache->shape[0])
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'kcache' and 'vcache' differ in shape; expected one layout", fn);
    const char *names[] = {"kcache", "vcache", "out", "qkv", "start"};
    const sg_tensor *ts[] = {kcache, vcache, out, qkv, start};
    SG_TRY(sg_check_disjoint(ctx, fn, 3, 5, names, ts));
    if (ctx->backend == SG_BACKEND_CPU) {
        kv_args a = {qkv, start, kcache, vcache, out, heads};
        return sg_cpu_run(ctx, kv_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_kv_attention_cuda(ctx, qkv, heads, start, kcache, vcache, out));
}

/* ---- the positioned embedding ---- */

typedef struct emb_args {
    const sg_tensor *tok, *pos, *wte, *wpe;
    sg_tensor *y;
} emb_args;

static sg_status emb_cpu(sg_ctx *ctx, const void *p)
{
    const emb_args *a = p;
    const int32_t *tk = a->tok->data, *ps = a->pos->data;
    for (int64_t b = 0; b < a->tok->numel; b++) {
        if (tk[b] < 0 || tk[b] >= a->wte->shape[0] || ps[b] < 0 || ps[b] >= a->wpe->shape[0])
            return sg_fail(ctx, SG_ERR_INVALID, "sg_embed_at: sequence %lld: token %d at position %d; expected "
                           "a token below %lld at a position below %lld", (long long)b, (int)tk[b], (int)ps[b],
                           (long long)a->wte->shape[0], (long long)a->wpe->shape[0]);
    }
    sg_embed_at_cpu(a->tok, a->pos, a->wte, a->wpe, a->y);
    return SG_OK;
}

sg_status sg_embed_at(sg_ctx *ctx, const sg_tensor *tok, const sg_tensor *pos, const sg_tensor *wte,
                      const sg_tensor *wpe, sg_tensor *y)
{
    const char *fn = "sg_embed_at";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "wte", wte));
    SG_TRY(sg_check_tensor(ctx, fn, "tok", tok));
    const int64_t B = tok->numel, C = wte->ndim == 2 ? wte->shape[1] : 0;
    if (wte->ndim != 2 || C < 1) return shape_fail(ctx, fn, "wte", wte, "(V, C)");
    SG_TRY(sg_check_count(ctx, fn, "tok", tok, SG_DTYPE_I32, B, NULL));
    SG_TRY(sg_check_count(ctx, fn, "pos", pos, SG_DTYPE_I32, B, NULL));
    SG_TRY(check_mat(ctx, fn, "wpe", wpe, wte->dtype, 1, C, false));
    SG_TRY(check_mat(ctx, fn, "y", y, wte->dtype, B, C, true));
    const char *names[] = {"y", "tok", "pos", "wte", "wpe"};
    const sg_tensor *ts[] = {y, tok, pos, wte, wpe};
    SG_TRY(sg_check_disjoint(ctx, fn, 1, 5, names, ts));
    if (ctx->backend == SG_BACKEND_CPU) {
        emb_args a = {tok, pos, wte, wpe, y};
        return sg_cpu_run(ctx, emb_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_embed_at_cuda(ctx, tok, pos, wte, wpe, y));
}

/* ---- each prompt's last row ---- */

typedef struct last_args {
    const sg_tensor *x, *info;
    sg_tensor *y;
} last_args;

static sg_status last_cpu(sg_ctx *ctx, const void *p)
{
    const last_args *a = p;
    const int64_t B = a->y->shape[0], Tp = a->x->shape[0] / B;
    const int32_t *in = a->info->data;
    for (int64_t b = 0; b < B; b++) {
        int32_t n = in[b * SG_GEN_INFO + SG_GEN_PLEN];
        if (n < 1 || n > Tp)
            return sg_fail(ctx, SG_ERR_INVALID, "sg_gen_last_rows: sequence %lld: prompt length %d; expected 1 "
                           "to %lld (the padded length)", (long long)b, (int)n, (long long)Tp);
    }
    sg_gen_last_rows_cpu(a->x, a->info, a->y);
    return SG_OK;
}

sg_status sg_gen_last_rows(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *info, sg_tensor *y)
{
    const char *fn = "sg_gen_last_rows";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "y", y));
    if (y->ndim != 2) return shape_fail(ctx, fn, "y", y, "(B, C)");
    const int64_t B = y->shape[0], C = y->shape[1];
    SG_TRY(sg_check_dtype(ctx, fn, "x", x, y->dtype));
    if (x->ndim != 2 || x->shape[1] != C || x->shape[0] % B || x->shape[0] < B) {
        char want[96];
        snprintf(want, sizeof want, "(B*Tp, %lld) with B = %lld", (long long)C, (long long)B);
        return shape_fail(ctx, fn, "x", x, want);
    }
    SG_TRY(check_mat(ctx, fn, "info", info, SG_DTYPE_I32, B, SG_GEN_INFO, true));
    const char *names[] = {"y", "x", "info"};
    const sg_tensor *ts[] = {y, x, info};
    SG_TRY(sg_check_disjoint(ctx, fn, 1, 3, names, ts));
    if (ctx->backend == SG_BACKEND_CPU) {
        last_args a = {x, info, y};
        return sg_cpu_run(ctx, last_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_gen_last_rows_cuda(ctx, x, info, y));
}

/* ---- the state: begin, sample ---- */

typedef struct gen_args {
    const sg_tensor *logits, *temp;
    sg_tensor *tok, *pos, *info, *out, *ctl;
} gen_args;

static sg_status begin_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    const gen_args *a = p;
    sg_gen_begin_cpu(a->tok, a->pos, a->info, a->ctl);
    return SG_OK;
}

sg_status sg_gen_begin(sg_ctx *ctx, sg_tensor *tok, sg_tensor *pos, sg_tensor *info, sg_tensor *ctl)
{
    const char *fn = "sg_gen_begin";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_dtype(ctx, fn, "info", info, SG_DTYPE_I32));
    if (info->ndim != 2 || info->shape[1] != SG_GEN_INFO) return shape_fail(ctx, fn, "info", info, "(B, 4) i32");
    SG_TRY(sg_check_count(ctx, fn, "tok", tok, SG_DTYPE_I32, info->shape[0], NULL));
    SG_TRY(sg_check_count(ctx, fn, "pos", pos, SG_DTYPE_I32, info->shape[0], NULL));
    SG_TRY(sg_check_count(ctx, fn, "ctl", ctl, SG_DTYPE_I32, SG_GEN_CTL, NULL));
    const char *names[] = {"tok", "pos", "info", "ctl"};
    const sg_tensor *ts[] = {tok, pos, info, ctl};
    SG_TRY(sg_check_disjoint(ctx, fn, 4, 4, names, ts));
    if (ctx->backend == SG_BACKEND_CPU) {
        gen_args a = {.tok = tok, .pos = pos, .info = info, .ctl = ctl};
        return sg_cpu_run(ctx, begin_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_gen_begin_cuda(ctx, tok, pos, info, ctl));
}

static sg_status sample_cpu(sg_ctx *ctx, const void *p)
{
    const gen_args *a = p;
    const int64_t B = a->logits->shape[0], N = a->out->shape[1];
    const int32_t *in = a->info->data;
    for (int64_t b = 0; b < B; b++) {
        const int32_t *r = in + b * SG_GEN_INFO;
        if (r[SG_GEN_DONE] == SG_GEN_RUNNING && (r[SG_GEN_LEN] < 0 || r[SG_GEN_LEN] >= N))
            return sg_fail(ctx, SG_ERR_INVALID, "sg_gen_sample: sequence %lld runs with %d new tokens; 'out' "
                           "holds %lld a sequence", (long long)b, (int)r[SG_GEN_LEN], (long long)N);
    }
    float *w = malloc((size_t)a->logits->shape[1] * sizeof *w);
    if (!w) return sg_fail(ctx, SG_ERR_OOM, "sg_gen_sample: out of host memory");
    sg_gen_sample_cpu(a->logits, a->tok, a->pos, a->info, a->out, a->ctl, *(const float *)a->temp->data, w);
    free(w);
    return SG_OK;
}

sg_status sg_gen_sample(sg_ctx *ctx, const sg_tensor *logits, sg_tensor *tok, sg_tensor *pos, sg_tensor *info,
                        sg_tensor *out, sg_tensor *ctl, const sg_tensor *temp)
{
    const char *fn = "sg_gen_sample";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_tensor(ctx, fn, "logits", logits));
    if (logits->dtype != SG_DTYPE_F32 && logits->dtype != SG_DTYPE_BF16)
        return sg_fail(ctx, SG_ERR_DTYPE, "%s: 'logits' is %s, expected f32 or bf16", fn,
                       sg_dtype_name(logits->dtype));
    if (logits->ndim != 2 || logits->shape[1] < 1) return shape_fail(ctx, fn, "logits", logits, "(B, V)");
    const int64_t B = logits->shape[0];
    SG_TRY(sg_check_count(ctx, fn, "tok", tok, SG_DTYPE_I32, B, NULL));
    SG_TRY(sg_check_count(ctx, fn, "pos", pos, SG_DTYPE_I32, B, NULL));
    SG_TRY(check_mat(ctx, fn, "info", info, SG_DTYPE_I32, B, SG_GEN_INFO, true));
    SG_TRY(sg_check_dtype(ctx, fn, "out", out, SG_DTYPE_I32));
    if (out->ndim != 2 || out->shape[0] < B || out->shape[1] < 1)
        return shape_fail(ctx, fn, "out", out, "(Bo >= B, N) i32");
    SG_TRY(sg_check_count(ctx, fn, "ctl", ctl, SG_DTYPE_I32, SG_GEN_CTL, NULL));
    SG_TRY(sg_check_count(ctx, fn, "temp", temp, SG_DTYPE_F32, 1, "the temperature"));
    const char *names[] = {"tok", "pos", "info", "out", "ctl", "logits", "temp"};
    const sg_tensor *ts[] = {tok, pos, info, out, ctl, logits, temp};
    SG_TRY(sg_check_disjoint(ctx, fn, 5, 7, names, ts));
    if (ctx->backend == SG_BACKEND_CPU) {
        gen_args a = {logits, temp, tok, pos, info, out, ctl};
        return sg_cpu_run(ctx, sample_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_gen_sample_cuda(ctx, logits, tok, pos, info, out, ctl, temp));
}

/* ---- one row through a linear layer, LayerNorm and residual fused ---- */

typedef struct row_args {
    const sg_tensor *x, *gamma, *beta, *w, *b, *r;
    sg_tensor *y;
    float eps;
    sg_activation act;
} row_args;

static sg_status row_cpu(sg_ctx *ctx, const void *p)
{
    const row_args *a = p;
    double *work = malloc((size_t)a->x->numel * sizeof *work);
    if (!work) return sg_fail(ctx, SG_ERR_OOM, "sg_gen_row_linear: out of host memory");
    sg_gen_row_linear_cpu(a->x, a->gamma, a->beta, a->eps, a->w, a->b, a->act, a->r, a->y, work);
    free(work);
    return SG_OK;
}

sg_status sg_gen_row_linear(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma, const sg_tensor *beta,
                            float eps, const sg_tensor *w, const sg_tensor *b, sg_activation act,
                            const sg_tensor *r, sg_tensor *y)
{
    const char *fn = "sg_gen_row_linear";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "w", w));
    if (w->ndim != 2 || w->shape[0] < 1 || w->shape[1] < 1) return shape_fail(ctx, fn, "w", w, "(N, K)");
    const sg_dtype dt = w->dtype;
    const int64_t N = w->shape[0], K = w->shape[1];
    SG_TRY(check_mat(ctx, fn, "x", x, dt, 1, K, true));
    SG_TRY(check_mat(ctx, fn, "y", y, dt, 1, N, true));
    if (!gamma != !beta)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: 'gamma' %s and 'beta' %s; expected both (the LayerNorm) or neither",
                       fn, gamma ? "given" : "NULL", beta ? "given" : "NULL");
    if (gamma) {
        SG_TRY(check_vec(ctx, fn, "gamma", gamma, dt, K));
        SG_TRY(check_vec(ctx, fn, "beta", beta, dt, K));
        if (!(eps > 0.f) || !isfinite(eps))
            return sg_fail(ctx, SG_ERR_INVALID, "%s: eps %g; expected a finite number above 0", fn, (double)eps);
    }
    if (b) SG_TRY(check_vec(ctx, fn, "b", b, dt, N));
    if (r) SG_TRY(check_mat(ctx, fn, "r", r, dt, 1, N, true));
    if (act != SG_ACT_NONE && act != SG_ACT_RELU && act != SG_ACT_GELU)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: activation %d; expected NONE, RELU or GELU", fn, (int)act);
    /* y may be r itself (in place); otherwise it shares no byte with any input. */
    const char *names[] = {"y", "x", "w", "b", "gamma", "beta", "r"};
    const sg_tensor *ts[] = {y, x, w, b, gamma, beta, r == y ? NULL : r};
    SG_TRY(sg_check_disjoint(ctx, fn, 1, 7, names, ts));
    if (ctx->backend == SG_BACKEND_CPU) {
        row_args a = {x, gamma, beta, w, b, r, y, eps, act};
        return sg_cpu_run(ctx, row_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_gen_row_linear_cuda(ctx, x, gamma, beta, eps, w, b, act, r, y));
}
