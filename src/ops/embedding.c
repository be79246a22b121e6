/* embedding.c: public entry points of the token + position embedding (sg_embedding_forward,
 * sg_embedding_backward): check every argument, then run the CPU reference through sg_cpu_run
 * or the CUDA kernel. On the CPU the tokens are range-checked when the work runs (a replayed
 * plan sees the tokens of its own step); on CUDA they live on the device and are not read by
 * the host. wte (forward) or dy (backward) sets the float dtype (f32, bf16, or f64 on the
 * CPU) of every other float tensor: one of another dtype is SG_ERR_DTYPE, by name. */
#include "ops/embedding.h"

#include <stdio.h>

/* tokens: (B, T) I32. */
static sg_status check_tokens(sg_ctx *ctx, const char *fn, const sg_tensor *tokens)
{
    SG_TRY(sg_check_dtype(ctx, fn, "tokens", tokens, SG_DTYPE_I32));
    if (tokens->ndim != 2) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'tokens' is %s, expected (B, T) i32", fn,
                       sg_shape_str(tokens, s, sizeof s));
    }
    return SG_OK;
}

/* A table (rows, C) of dtype dt with at least min_rows rows; rows_label names the rows in
 * the message ("V", "Tmax >= 16"). */
static sg_status check_table(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                             int64_t min_rows, const char *rows_label, int64_t C, sg_dtype dt)
{
    SG_TRY(sg_check_tensor(ctx, fn, what, t));
    if (t->dtype != dt)
        return sg_fail(ctx, SG_ERR_DTYPE, "%s: tensor '%s' is %s, expected %s", fn, what,
                       sg_dtype_name(t->dtype), sg_dtype_name(dt));
    if (t->ndim != 2 || t->shape[1] != C || t->shape[0] < min_rows) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: '%s' is %s, expected (%s, %lld) %s", fn, what,
                       sg_shape_str(t, s, sizeof s), rows_label, (long long)C, sg_dtype_name(dt));
    }
    return SG_OK;
}

/* y or dy: (B, T, C) or (B*T, C), float or bf16. */
static sg_status check_act(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                           int64_t B, int64_t T)
{
    SG_TRY(sg_check_float_or_bf16(ctx, fn, what, t));
    bool ok = (t->ndim == 3 && t->shape[0] == B && t->shape[1] == T) ||
              (t->ndim == 2 && t->shape[0] == B * T);
    if (!ok) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: '%s' is %s, expected (%lld, %lld, C) or "
                       "(%lld, C) for tokens (%lld, %lld)",
                       fn, what, sg_shape_str(t, s, sizeof s), (long long)B, (long long)T,
                       (long long)(B * T), (long long)B, (long long)T);
    }
    return SG_OK;
}

/* CPU only (the tokens are host memory): every token is in 0..V-1. */
static sg_status check_token_range(sg_ctx *ctx, const char *fn, const sg_tensor *tokens, int64_t V)
{
    const int32_t *tk = tokens->data;
    int64_t T = tokens->shape[1];
    for (int64_t i = 0; i < tokens->numel; i++)
        if (tk[i] < 0 || tk[i] >= V)
            return sg_fail(ctx, SG_ERR_INVALID,
                           "%s: tokens[%lld][%lld] is %d, but 'wte' has %lld rows; expected 0 "
                           "to %lld",
                           fn, (long long)(i / T), (long long)(i % T), (int)tk[i], (long long)V,
                           (long long)V - 1);
    return SG_OK;
}

/* The CPU references run through sg_cpu_run, so that a CPU capture records them. */
typedef struct emb_args {
    const sg_tensor *tokens, *wte, *wpe, *dy;
    sg_tensor *y, *dwte, *dwpe;
} emb_args;

static sg_status emb_forward_cpu(sg_ctx *ctx, const void *p)
{
    const emb_args *a = p;
    SG_TRY(check_token_range(ctx, "sg_embedding_forward", a->tokens, a->wte->shape[0]));
    sg_embedding_forward_cpu(a->tokens, a->wte, a->wpe, a->y);
    return SG_OK;
}

static sg_status emb_backward_cpu(sg_ctx *ctx, const void *p)
{
    const emb_args *a = p;
    SG_TRY(check_token_range(ctx, "sg_embedding_backward", a->tokens, a->dwte->shape[0]));
    return sg_embedding_backward_cpu(ctx, a->tokens, a->dy, a->dwte, a->dwpe);
}

sg_status sg_embedding_forward(sg_ctx *ctx, const sg_tensor *tokens, const sg_tensor *wte,
                               const sg_tensor *wpe, sg_tensor *y)
{
    const char *fn = "sg_embedding_forward";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_tokens(ctx, fn, tokens));
    const int64_t B = tokens->shape[0], T = tokens->shape[1];
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "wte", wte));
    const int64_t C = wte->shape[wte->ndim - 1];
    char tmax[48];
    snprintf(tmax, sizeof tmax, "Tmax >= %lld", (long long)T);
    SG_TRY(check_table(ctx, fn, "wte", wte, 1, "V", C, wte->dtype));
    SG_TRY(check_table(ctx, fn, "wpe", wpe, T, tmax, C, wte->dtype));
    SG_TRY(check_act(ctx, fn, "y", y, B, T));
    if (y->dtype != wte->dtype || y->shape[y->ndim - 1] != C) {
        char s[96], sw[96];
        return sg_fail(ctx, y->dtype != wte->dtype ? SG_ERR_DTYPE : SG_ERR_SHAPE,
                       "%s: 'y' is %s but 'wte' is %s; expected C = %lld and the same dtype", fn,
                       sg_shape_str(y, s, sizeof s), sg_shape_str(wte, sw, sizeof sw),
                       (long long)C);
    }
    const char *names[] = {"y", "tokens", "wte", "wpe"};
    const sg_tensor *ts[] = {y, tokens, wte, wpe};
    SG_TRY(sg_check_disjoint(ctx, fn, 1, 4, names, ts));
    /* each row of y reads a row of wte and one of wpe: y's bytes twice, and the tokens */
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(tokens, y, y, y, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        emb_args a = {.tokens = tokens, .wte = wte, .wpe = wpe, .y = y};
        return sg_cpu_run(ctx, emb_forward_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_embedding_forward_cuda(ctx, tokens, wte, wpe, y));
}

sg_status sg_embedding_backward(sg_ctx *ctx, const sg_tensor *tokens, const sg_tensor *dy,
                                sg_tensor *dwte, sg_tensor *dwpe)
{
    const char *fn = "sg_embedding_backward";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_tokens(ctx, fn, tokens));
    const int64_t B = tokens->shape[0], T = tokens->shape[1];
    SG_TRY(check_act(ctx, fn, "dy", dy, B, T));
    const int64_t C = dy->shape[dy->ndim - 1];
    char tmax[48];
    snprintf(tmax, sizeof tmax, "Tmax >= %lld", (long long)T);
    SG_TRY(check_table(ctx, fn, "dwte", dwte, 1, "V", C, dy->dtype));
    SG_TRY(check_table(ctx, fn, "dwpe", dwpe, T, tmax, C, dy->dtype));
    const char *names[] = {"dwte", "dwpe", "tokens", "dy"};
    const sg_tensor *ts[] = {dwte, dwpe, tokens, dy};
    SG_TRY(sg_check_disjoint(ctx, fn, 2, 4, names, ts));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(tokens, dy, dwte, dwpe, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        emb_args a = {.tokens = tokens, .dy = dy, .dwte = dwte, .dwpe = dwpe};
        return sg_cpu_run(ctx, emb_backward_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_embedding_backward_cuda(ctx, tokens, dy, dwte, dwpe));
}
