/* transformer.c: the transformer's modules, made from a builder: LayerNorm, token + position
 * embedding (with dropout), causal self-attention, and the GPT-2 block (pre-LayerNorm
 * attention and 4x GELU MLP branches added to the residual stream, dropout after each).
 * Shapes: rows M = B*T; x (M, C). A shorter running length Tb <= T (set_rows with B*Tb) uses
 * the first B*Tb rows of every buffer. Under bf16 mixed precision activations, their
 * gradients and the parameters the modules read are bf16; LayerNorm statistics and attention
 * scratch stay f32. */
#include "nn/nn.h"

#include <stdlib.h>

#define SG_LN_EPS_GPT 1e-5f

/* The batch a module's rows hold: B (rows = B*T). */
static int64_t batch_of(const sg_module *m) { return m->b->batch; }

/* Variable sequence length: rows must be whole sequences of the batch. */
static sg_status check_seq_rows(sg_module *m, int64_t rows)
{
    int64_t B = batch_of(m);
    if (rows % B)
        return sg_fail(m->ctx, SG_ERR_SHAPE, "'%s': %lld rows are not a whole number of sequences of the batch "
                       "%lld", sg_module_label(m), (long long)rows, (long long)B);
    return SG_OK;
}

static sg_status need_seq(sg_builder *b, const char *fn, const char *name)
{
    if (b->opts.seq > 0) return SG_OK;
    return sg_fail(b->ctx, SG_ERR_INVALID, "%s: '%s': a sequence module needs a builder with seq > 0", fn,
                   name ? name : "");
}

/* ---- LayerNorm ---- */

typedef struct ln_module {
    sg_module base;
    int iw, ib;
    float eps;
    const sg_tensor *x;
    sg_tensor *y, *mean, *rstd, *dx;
} ln_module;

static sg_status ln_forward(sg_module *mod, const sg_tensor *x, const sg_tensor **y)
{
    ln_module *l = (ln_module *)mod;
    l->x = x;
    SG_TRY(sg_layernorm_forward(mod->ctx, x, sg_module_w(mod, l->iw), sg_module_w(mod, l->ib), l->eps, l->y,
                                l->mean, l->rstd));
    *y = l->y;
    return SG_OK;
}

static sg_status ln_backward(sg_module *mod, sg_tensor *dy, sg_tensor **dx)
{
    ln_module *l = (ln_module *)mod;
    if (!l->x) return sg_module_no_forward(mod);
    SG_TRY(sg_layernorm_backward(mod->ctx, l->x, sg_module_w(mod, l->iw), l->mean, l->rstd, dy, l->dx,
                                 sg_module_g(mod, l->iw), sg_module_g(mod, l->ib)));
    *dx = l->dx;
    return SG_OK;
}

static void ln_destroy(sg_module *mod)
{
    ln_module *l = (ln_module *)mod;
    sg_tensor_destroy(l->y), sg_tensor_destroy(l->mean), sg_tensor_destroy(l->rstd), sg_tensor_destroy(l->dx);
    free(l);
}

static sg_status ln_set_rows(sg_module *mod, int64_t rows)
{
    ln_module *l = (ln_module *)mod;
    SG_TRY(sg_tensor_set_rows(l->y, rows));
    SG_TRY(sg_tensor_set_rows(l->dx, rows));
    SG_TRY(sg_tensor_set_rows(l->mean, rows));
    return sg_tensor_set_rows(l->rstd, rows);
}

static const sg_module_i ln_i = {"layernorm", ln_forward, ln_backward, ln_destroy, ln_set_rows, NULL};

sg_status sg_module_layernorm(sg_builder *b, const char *name, int64_t C, float eps, sg_module **m)
{
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "sg_module_layernorm: m is NULL");
    *m = NULL;
    if (C < 1 || !(eps > 0.f))
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_module_layernorm: '%s': C %lld, eps %g: expected C >= 1 and "
                       "eps > 0", name ? name : "", (long long)C, eps);
    ln_module *l = calloc(1, sizeof *l);
    if (!l) return sg_fail(b->ctx, SG_ERR_OOM, "sg_module_layernorm: out of host memory");
    SG_TRY(sg_module_init(b, &l->base, &ln_i, name));
    l->eps = eps;
    l->iw = sg_module_declare(&l->base, "weight", 1, &C, SG_INIT_ONES, C, 0);
    l->ib = sg_module_declare(&l->base, "bias", 1, &C, SG_INIT_ZEROS, C, 0);
    if (l->iw < 0 || l->ib < 0) return SG_ERR_INVALID;
    int64_t M = b->rows;
    SG_TRY(sg_module_buffer(&l->base, b->opts.precision, "y", 2, (int64_t[]){M, C}, &l->y));
    SG_TRY(sg_module_buffer(&l->base, b->opts.precision, "dx", 2, (int64_t[]){M, C}, &l->dx));
    SG_TRY(sg_module_buffer(&l->base, SG_DTYPE_F32, "mean", 1, &M, &l->mean));
    SG_TRY(sg_module_buffer(&l->base, SG_DTYPE_F32, "rstd", 1, &M, &l->rstd));
    *m = &l->base;
    return SG_OK;
}

/* ---- embedding: tokens (B, T) -> x (M, C), with dropout ---- */

typedef struct embed_module {
    sg_module base;
    int iwte, iwpe;
    sg_tensor *rng;
    uint32_t site;
    const sg_tensor *tokens;
    sg_tensor *y, *yd;          /* y: the sum; yd: after dropout (y itself when p = 0) */
    sg_tensor *dyd;             /* the gradient before dropout's backward */
} embed_module;

static sg_status embed_forward(sg_module *mod, const sg_tensor *tokens, const sg_tensor **y)
{
    embed_module *e = (embed_module *)mod;
    e->tokens = tokens;
    SG_TRY(sg_embedding_forward(mod->ctx, tokens, sg_module_w(mod, e->iwte), sg_module_w(mod, e->iwpe), e->y));
    bool drop = e->yd != e->y && !mod->b->eval;
    if (drop) SG_TRY(sg_dropout_forward(mod->ctx, e->y, mod->b->opts.dropout, e->rng, e->site, e->yd));
    *y = drop ? e->yd : e->y;
    return SG_OK;
}

static sg_status embed_backward(sg_module *mod, sg_tensor *dy, sg_tensor **dx)
{
    embed_module *e = (embed_module *)mod;
    if (!e->tokens) return sg_module_no_forward(mod);
    sg_tensor *g = dy;
    if (e->yd != e->y) {
        SG_TRY(sg_dropout_backward(mod->ctx, dy, mod->b->opts.dropout, e->rng, e->site, e->dyd));
        g = e->dyd;
    }
    SG_TRY(sg_embedding_backward(mod->ctx, e->tokens, g, sg_module_g(mod, e->iwte), sg_module_g(mod, e->iwpe)));
    *dx = NULL; /* tokens have no gradient */
    return SG_OK;
}

static void embed_destroy(sg_module *mod)
{
    embed_module *e = (embed_module *)mod;
    if (e->yd != e->y) sg_tensor_destroy(e->yd);
    sg_tensor_destroy(e->y);
    sg_tensor_destroy(e->dyd);
    free(e);
}

static sg_status embed_set_rows(sg_module *mod, int64_t rows)
{
    embed_module *e = (embed_module *)mod;
    SG_TRY(check_seq_rows(mod, rows));
    SG_TRY(sg_tensor_set_rows(e->y, rows));
    if (e->yd != e->y) SG_TRY(sg_tensor_set_rows(e->yd, rows));
    return e->dyd ? sg_tensor_set_rows(e->dyd, rows) : SG_OK;
}

/* The embedding is a model's first module: nothing comes before tokens. */
static sg_status embed_finish(sg_module *mod)
{
    if (mod->no_input_grad) return SG_OK;
    return sg_fail(mod->ctx, SG_ERR_INVALID, "sg_builder_finish: embedding '%s' must be the model's first "
                   "module: tokens have no gradient to give back", sg_module_label(mod));
}

static const sg_module_i embed_i = {"embedding", embed_forward, embed_backward, embed_destroy, embed_set_rows,
                                    embed_finish};

sg_status sg_module_embedding(sg_builder *b, const char *name, int64_t vocab, int64_t C, sg_module **m)
{
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "sg_module_embedding: m is NULL");
    *m = NULL;
    SG_TRY(need_seq(b, "sg_module_embedding", name));
    if (vocab < 1 || C < 1)
        return sg_fail(b->ctx, SG_ERR_SHAPE, "sg_module_embedding: '%s': vocab %lld, C %lld: expected both >= 1",
                       name ? name : "", (long long)vocab, (long long)C);
    embed_module *e = calloc(1, sizeof *e);
    if (!e) return sg_fail(b->ctx, SG_ERR_OOM, "sg_module_embedding: out of host memory");
    SG_TRY(sg_module_init(b, &e->base, &embed_i, name));
    int64_t T = b->opts.seq, M = b->rows;
    e->iwte = sg_module_declare(&e->base, "wte.weight", 2, (int64_t[]){vocab, C}, SG_INIT_NORMAL_002, C, 1);
    e->iwpe = sg_module_declare(&e->base, "wpe.weight", 2, (int64_t[]){T, C}, SG_INIT_NORMAL_002, C, 1);
    if (e->iwte < 0 || e->iwpe < 0) return SG_ERR_INVALID;
    SG_TRY(sg_builder_rng(b, 1, &e->rng, &e->site));
    sg_dtype dt = b->opts.precision;
    SG_TRY(sg_module_buffer(&e->base, dt, "y", 2, (int64_t[]){M, C}, &e->y));
    e->yd = e->y;
    if (b->opts.dropout > 0) {
        SG_TRY(sg_module_buffer(&e->base, dt, "y_dropped", 2, (int64_t[]){M, C}, &e->yd));
        SG_TRY(sg_module_buffer(&e->base, dt, "dy", 2, (int64_t[]){M, C}, &e->dyd));
    }
    *m = &e->base;
    return SG_OK;
}

/* ---- causal self-attention: qkv Linear, attention, proj Linear, dropout ---- */

/* The fused attention (no (B, H, T, T) probabilities; sg_attention_fused_forward) serves bf16
 * and f32 with head size 64, on either backend so that both run the same function, unless
 * STEPGRAPH_ATTENTION=unfused asks for the unfused op (to measure what fusing gives). f32 on
 * the H100, gpt-768-12-8-256 step: 29.61 ms fused against 30.81 unfused, 335 MiB less. */
int sg_module_attention_fused(sg_dtype dt, int64_t C, int heads)
{
    const char *e = getenv("STEPGRAPH_ATTENTION");
    if (heads <= 0 || C != 64 * (int64_t)heads || (e && !strcmp(e, "unfused"))) return 0;
    return dt == SG_DTYPE_BF16 || dt == SG_DTYPE_F32;
}


/* Attention forward and backward with the module's saved tensors: att and work (unfused), or
 * lse and delta (fused: then `att` holds lse and `work` delta). */
static sg_status attention_fwd(sg_ctx *ctx, bool fused, const sg_tensor *qkv, int heads, sg_tensor *a, sg_tensor *att,
                               sg_tensor *work)
{
    if (fused) return sg_attention_fused_forward(ctx, qkv, heads, a, att);
    return sg_attention_forward(ctx, qkv, heads, a, att, work);
}

static sg_status attention_bwd(sg_ctx *ctx, bool fused, const sg_tensor *qkv, const sg_tensor *a, const sg_tensor *att,
                               const sg_tensor *da, int heads, sg_tensor *dqkv, sg_tensor *work)
{
    if (fused) return sg_attention_fused_backward(ctx, qkv, a, att, da, heads, dqkv, work);
    return sg_attention_backward(ctx, qkv, att, da, heads, dqkv, work);
}

/* The saved attention tensors for B sequences of Tb: att (B, H, Tb, Tb), the work buffer
 * staying as built (sized for T, it serves any Tb); or, fused, lse in att and delta in work,
 * both (B, H, Tb). */
static sg_status att_set_shape(sg_tensor *att, sg_tensor *work, bool fused, int64_t B, int heads, int64_t Tb)
{
    if (!fused) return sg_tensor_set_shape(att, 4, (int64_t[]){B, heads, Tb, Tb});
    SG_TRY(sg_tensor_set_shape(work, 3, (int64_t[]){B, heads, Tb}));
    return sg_tensor_set_shape(att, 3, (int64_t[]){B, heads, Tb});
}

typedef struct attn_module {
    sg_module base;
    int heads;
    bool fused;                                 /* att holds lse, work delta */
    int iqw, iqb, ipw, ipb;
    sg_tensor *rng;
    uint32_t site;
    const sg_tensor *x;
    sg_tensor *qkv, *att, *work, *a, *p, *pd;   /* forward */
    sg_tensor *gp, *da, *dqkv, *dx;             /* backward */
} attn_module;

static sg_status attn_forward(sg_module *mod, const sg_tensor *x, const sg_tensor **y)
{
    attn_module *t = (attn_module *)mod;
    sg_ctx *ctx = mod->ctx;
    t->x = x;
    SG_TRY(sg_linear_forward(ctx, x, sg_module_w(mod, t->iqw), sg_module_w(mod, t->iqb), SG_ACT_NONE, t->qkv, NULL));
    SG_TRY(attention_fwd(ctx, t->fused, t->qkv, t->heads, t->a, t->att, t->work));
    SG_TRY(sg_linear_forward(ctx, t->a, sg_module_w(mod, t->ipw), sg_module_w(mod, t->ipb), SG_ACT_NONE, t->p, NULL));
    bool drop = t->pd && !mod->b->eval;
    if (drop) SG_TRY(sg_dropout_forward(ctx, t->p, mod->b->opts.dropout, t->rng, t->site, t->pd));
    *y = drop ? t->pd : t->p;
    return SG_OK;
}

static sg_status attn_backward(sg_module *mod, sg_tensor *dy, sg_tensor **dx)
{
    attn_module *t = (attn_module *)mod;
    sg_ctx *ctx = mod->ctx;
    if (!t->x) return sg_module_no_forward(mod);
    sg_tensor *g = dy;
    if (t->pd) {
        SG_TRY(sg_dropout_backward(ctx, dy, mod->b->opts.dropout, t->rng, t->site, t->gp));
        g = t->gp;
    }
    SG_TRY(sg_linear_backward(ctx, t->a, sg_module_w(mod, t->ipw), g, SG_ACT_NONE, NULL, t->da,
                              sg_module_g(mod, t->ipw), sg_module_g(mod, t->ipb)));
    SG_TRY(attention_bwd(ctx, t->fused, t->qkv, t->a, t->att, t->da, t->heads, t->dqkv, t->work));
    sg_tensor *dxx = mod->no_input_grad ? NULL : t->dx;
    SG_TRY(sg_linear_backward(ctx, t->x, sg_module_w(mod, t->iqw), t->dqkv, SG_ACT_NONE, NULL, dxx,
                              sg_module_g(mod, t->iqw), sg_module_g(mod, t->iqb)));
    *dx = dxx;
    return SG_OK;
}

static void attn_destroy(sg_module *mod)
{
    attn_module *t = (attn_module *)mod;
    sg_tensor *ts[] = {t->qkv, t->att, t->work, t->a, t->p, t->pd, t->gp, t->da, t->dqkv, t->dx};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
    free(t);
}

static sg_status attn_set_rows(sg_module *mod, int64_t rows)
{
    attn_module *t = (attn_module *)mod;
    SG_TRY(check_seq_rows(mod, rows));
    sg_tensor *ts[] = {t->qkv, t->a, t->p, t->pd, t->gp, t->da, t->dqkv, t->dx};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        if (ts[i]) SG_TRY(sg_tensor_set_rows(ts[i], rows));
    int64_t B = batch_of(mod), Tb = rows / B;
    return att_set_shape(t->att, t->work, t->fused, B, t->heads, Tb);
}

static const sg_module_i attn_i = {"attention", attn_forward, attn_backward, attn_destroy, attn_set_rows, NULL};

static sg_status check_heads(sg_builder *b, const char *fn, const char *name, int64_t C, int heads)
{
    if (C >= 1 && heads >= 1 && C % heads == 0) return SG_OK;
    return sg_fail(b->ctx, SG_ERR_SHAPE, "%s: '%s': C %lld over %d heads: expected heads >= 1 dividing C", fn,
                   name ? name : "", (long long)C, heads);
}

sg_status sg_module_attention(sg_builder *b, const char *name, int64_t C, int heads, sg_module **m)
{
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "sg_module_attention: m is NULL");
    *m = NULL;
    SG_TRY(need_seq(b, "sg_module_attention", name));
    SG_TRY(check_heads(b, "sg_module_attention", name, C, heads));
    attn_module *t = calloc(1, sizeof *t);
    if (!t) return sg_fail(b->ctx, SG_ERR_OOM, "sg_module_attention: out of host memory");
    SG_TRY(sg_module_init(b, &t->base, &attn_i, name));
    t->heads = heads;
    sg_module *mod = &t->base;
    t->iqw = sg_module_declare(mod, "qkv.weight", 2, (int64_t[]){3 * C, C}, SG_INIT_NORMAL_002, C, 1);
    t->iqb = sg_module_declare(mod, "qkv.bias", 1, (int64_t[]){3 * C}, SG_INIT_ZEROS, C, 0);
    t->ipw = sg_module_declare(mod, "proj.weight", 2, (int64_t[]){C, C}, SG_INIT_NORMAL_002, C, 1);
    t->ipb = sg_module_declare(mod, "proj.bias", 1, &C, SG_INIT_ZEROS, C, 0);
    if (t->iqw < 0 || t->iqb < 0 || t->ipw < 0 || t->ipb < 0) return SG_ERR_INVALID;
    SG_TRY(sg_builder_rng(b, 1, &t->rng, &t->site));
    int64_t B = b->batch, T = b->opts.seq, M = b->rows;
    sg_dtype dt = b->opts.precision;
    int64_t we = sg_attention_work_elems(B, T, C, heads);
    t->fused = sg_module_attention_fused(dt, C, heads);
    SG_TRY(sg_module_buffer(mod, dt, "qkv", 2, (int64_t[]){M, 3 * C}, &t->qkv));
    if (t->fused) {
        SG_TRY(sg_module_buffer(mod, SG_DTYPE_F32, "lse", 3, (int64_t[]){B, heads, T}, &t->att));
        SG_TRY(sg_module_buffer(mod, SG_DTYPE_F32, "delta", 3, (int64_t[]){B, heads, T}, &t->work));
    } else {
        SG_TRY(sg_module_buffer(mod, dt, "att", 4, (int64_t[]){B, heads, T, T}, &t->att));
        SG_TRY(sg_module_buffer(mod, SG_DTYPE_F32, "work", 1, &we, &t->work));
    }
    SG_TRY(sg_module_buffer(mod, dt, "attn", 2, (int64_t[]){M, C}, &t->a));
    SG_TRY(sg_module_buffer(mod, dt, "proj", 2, (int64_t[]){M, C}, &t->p));
    SG_TRY(sg_module_buffer(mod, dt, "d.attn", 2, (int64_t[]){M, C}, &t->da));
    SG_TRY(sg_module_buffer(mod, dt, "d.qkv", 2, (int64_t[]){M, 3 * C}, &t->dqkv));
    SG_TRY(sg_module_buffer(mod, dt, "dx", 2, (int64_t[]){M, C}, &t->dx));
    if (b->opts.dropout > 0) {
        SG_TRY(sg_module_buffer(mod, dt, "proj.dropped", 2, (int64_t[]){M, C}, &t->pd));
        SG_TRY(sg_module_buffer(mod, dt, "d.proj", 2, (int64_t[]){M, C}, &t->gp));
    }
    *m = mod;
    return SG_OK;
}

/* ---- the GPT-2 block ---- */

typedef struct block_module {
    sg_module base;
    int heads;
    bool fused;                 /* fused attention: att holds lse, work delta */
    bool ln_sums;               /* without dropout, LN2's backward sums the projections' biases */
    bool qkv_sums;              /* the fused attention's backward sums qkv's bias gradient */
    uint32_t site;              /* dropout call sites: site (attention), site + 1 (MLP) */
    sg_tensor *rng;
    int ip[12];                 /* ln1 w b, qkv w b, proj w b, ln2 w b, fc w b, mlp.proj w b */
    const sg_tensor *x;
    /* forward activations (M rows), the block's own */
    sg_tensor *h1, *mean1, *rstd1, *qkv, *att, *a, *p, *pd, *x2, *h2, *mean2, *rstd2, *f, *pre_f, *q, *qd, *y;
    /* backward scratch and attention work: shared by every block (sg_builder_shared) */
    sg_tensor *work, *gq, *df, *dh2, *dx2, *dp, *da, *dqkv, *dh1, *dx, *parts;
} block_module;

#define W(i) sg_module_w(mod, b->ip[i])
#define G(i) sg_module_g(mod, b->ip[i])

static sg_status block_forward(sg_module *mod, const sg_tensor *x, const sg_tensor **y)
{
    block_module *b = (block_module *)mod;
    sg_ctx *ctx = mod->ctx;
    float p = mod->b->eval ? 0.f : mod->b->opts.dropout;
    b->x = x;
    SG_TRY(sg_layernorm_forward(ctx, x, W(0), W(1), SG_LN_EPS_GPT, b->h1, b->mean1, b->rstd1));
    SG_TRY(sg_linear_forward(ctx, b->h1, W(2), W(3), SG_ACT_NONE, b->qkv, NULL));
    SG_TRY(attention_fwd(ctx, b->fused, b->qkv, b->heads, b->a, b->att, b->work));
    SG_TRY(sg_linear_forward(ctx, b->a, W(4), W(5), SG_ACT_NONE, b->p, NULL));
    if (p > 0) SG_TRY(sg_dropout_forward(ctx, b->p, p, b->rng, b->site, b->pd));
    /* x2 = x + branch, and h2 = LN2(x2), in one pass (x2 is saved: the residual and LN2's
     * backward read it) */
    SG_TRY(sg_add_layernorm_forward(ctx, x, p > 0 ? b->pd : b->p, W(6), W(7), SG_LN_EPS_GPT, b->x2, b->h2,
                                    b->mean2, b->rstd2));
    SG_TRY(sg_linear_forward(ctx, b->h2, W(8), W(9), SG_ACT_GELU, b->f, b->pre_f));
    if (p > 0) {
        SG_TRY(sg_linear_forward(ctx, b->f, W(10), W(11), SG_ACT_NONE, b->q, NULL));
        SG_TRY(sg_dropout_forward(ctx, b->q, p, b->rng, b->site + 1, b->qd));
        SG_TRY(sg_add_forward(ctx, b->x2, b->qd, b->y));
    } else { /* y = x2 + proj(f) in the projection's pass (q is not written) */
        SG_TRY(sg_linear_forward_residual(ctx, b->f, W(10), W(11), b->x2, b->y));
    }
    *y = b->y;
    return SG_OK;
}

static sg_status block_backward_ops(sg_module *mod, sg_tensor *dy, sg_tensor **dx);

/* The block's backward is a region of the context's second stream (sg_ctx_side_enter): the
 * linear backwards' dw matmuls and the LayerNorm backwards' reductions run there beside what
 * follows, joined when the block ends. Safe because nothing in the block writes what they
 * read (f, the MLP's output gradient, h2, d.fc, a, the projection's output gradient, h1,
 * dqkv) once they are queued, and dx alternates between two buffers, so the block before
 * writes its dx into neither this block's dy nor its own. */
static sg_status block_backward(sg_module *mod, sg_tensor *dy, sg_tensor **dx)
{
    sg_ctx_side_enter(mod->ctx);
    sg_status st = block_backward_ops(mod, dy, dx);
    sg_status joined = sg_ctx_side_leave(mod->ctx);
    return st != SG_OK ? st : joined;
}

static sg_status block_backward_ops(sg_module *mod, sg_tensor *dy, sg_tensor **dx)
{
    block_module *b = (block_module *)mod;
    sg_ctx *ctx = mod->ctx;
    float p = mod->b->opts.dropout;
    if (!b->x) return sg_module_no_forward(mod);
    /* MLP branch: y = x2 + drop(proj(gelu(fc(ln2(x2))))) */
    sg_tensor *gq = dy;
    if (p > 0) {
        SG_TRY(sg_dropout_backward(ctx, dy, p, b->rng, b->site + 1, b->gq));
        gq = b->gq;
    }
    /* Without dropout the two projections' bias gradients are column sums of what LN2's
     * backward reads and writes: mlp.proj's (W11) of dy, its dres, and attn.proj's (W5) of dx2,
     * its dx. LN2's backward sums them (sg_layernorm_backward_add_sums), and the projections'
     * backwards skip theirs (one pass over an (M, C) gradient each). With dropout the
     * projections' output gradients are the masked ones, so they sum their own, as they do
     * under STEPGRAPH_BIAS_SUMS=separate (b->ln_sums false). */
    const bool sums = p == 0 && b->ln_sums;
    /* The projection's backward goes on through the GELU: df = gelu'(pre_f) * (dq W10) and the
     * fc's bias gradient in one (on CUDA the dx matmul's DGELU_BGRAD epilogue), so the fc's
     * backward has no activation or bias left to do. */
    SG_TRY(sg_linear_backward_through(ctx, b->f, W(10), gq, SG_ACT_NONE, NULL, G(10), sums ? NULL : G(11),
                                      SG_ACT_GELU, b->pre_f, b->df, G(9)));
    SG_TRY(sg_linear_backward(ctx, b->h2, W(8), b->df, SG_ACT_NONE, NULL, b->dh2, G(8), NULL));
    /* dx2 = dy (the residual carries it through) + LN2's backward of dh2 */
    if (sums)
        SG_TRY(sg_layernorm_backward_add_sums(ctx, b->x2, W(6), b->mean2, b->rstd2, b->dh2, dy, b->dx2, G(6),
                                              G(7), G(11), G(5)));
    else
        SG_TRY(sg_layernorm_backward_add(ctx, b->x2, W(6), b->mean2, b->rstd2, b->dh2, dy, b->dx2, G(6), G(7)));
    /* attention branch: x2 = x + drop(proj(attn(qkv(ln1(x))))) */
    sg_tensor *gp = b->dx2;
    if (p > 0) {
        SG_TRY(sg_dropout_backward(ctx, b->dx2, p, b->rng, b->site, b->dp));
        gp = b->dp;
    }
    SG_TRY(sg_linear_backward(ctx, b->a, W(4), gp, SG_ACT_NONE, NULL, b->da, G(4), sums ? NULL : G(5)));
    /* qkv's bias gradient: the column sums of dqkv, which the fused attention's kernels take as
     * they write it (b->qkv_sums; its last pass goes to the second stream), or the projection's
     * own pass over dqkv */
    if (b->qkv_sums)
        SG_TRY(sg_attention_fused_backward_sums(ctx, b->qkv, b->a, b->att, b->da, b->heads, b->dqkv, b->work, G(3),
                                                b->parts));
    else
        SG_TRY(attention_bwd(ctx, b->fused, b->qkv, b->a, b->att, b->da, b->heads, b->dqkv, b->work));
    SG_TRY(sg_linear_backward(ctx, b->h1, W(2), b->dqkv, SG_ACT_NONE, NULL, b->dh1, G(2),
                              b->qkv_sums ? NULL : G(3)));
    /* dx = dx2 (the residual) + LN1's backward of dh1 */
    SG_TRY(sg_layernorm_backward_add(ctx, b->x, W(0), b->mean1, b->rstd1, b->dh1, b->dx2, b->dx, G(0), G(1)));
    *dx = b->dx;
    return SG_OK;
}

#undef W
#undef G

static void block_destroy(sg_module *mod)
{
    block_module *b = (block_module *)mod;
    /* The forward activations are the block's own; the backward scratch and work are the
     * builder's (shared by every block). */
    sg_tensor *ts[] = {b->h1, b->mean1, b->rstd1, b->qkv, b->att, b->a, b->p, b->pd, b->x2,
                       b->h2, b->mean2, b->rstd2, b->f, b->pre_f, b->q, b->qd, b->y};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
    free(b);
}

/* rows = B*Tb: every (M, .) buffer and LayerNorm statistic uses its first rows, and the
 * attention probabilities become (B, H, Tb, Tb) over the first elements of their storage.
 * work stays as built: sized for T, it holds any Tb <= T. */
static sg_status block_set_rows(sg_module *mod, int64_t rows)
{
    block_module *b = (block_module *)mod;
    SG_TRY(check_seq_rows(mod, rows));
    sg_tensor *ts[] = {b->h1, b->mean1, b->rstd1, b->qkv, b->a, b->p, b->pd, b->x2, b->h2, b->mean2,
                       b->rstd2, b->f, b->pre_f, b->q, b->qd, b->y, b->gq, b->df, b->dh2, b->dx2,
                       b->dp, b->da, b->dqkv, b->dh1, b->dx};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        if (ts[i]) SG_TRY(sg_tensor_set_rows(ts[i], rows)); /* the dropout buffers may be absent */
    int64_t B = batch_of(mod), Tb = rows / B;
    return att_set_shape(b->att, b->work, b->fused, B, b->heads, Tb);
}

static const sg_module_i block_i = {"block", block_forward, block_backward, block_destroy, block_set_rows, NULL};

/* A buffer of the block's own (F32 when f32 is set, else the precision), (M, cols) or shape. */
static sg_tensor *own(sg_module *mod, sg_status *st, sg_dtype dt, const char *what, int ndim, const int64_t *shape)
{
    sg_tensor *t = NULL;
    if (*st == SG_OK) *st = sg_module_buffer(mod, dt, what, ndim, shape, &t);
    return t;
}

static sg_tensor *shared(sg_builder *bl, sg_status *st, sg_dtype dt, const char *what, int ndim, const int64_t *shape)
{
    if (*st != SG_OK) return NULL;
    char n[64];
    snprintf(n, sizeof n, "blocks.%s", what);
    sg_tensor *t = sg_builder_shared(bl, n, dt, ndim, shape);
    if (!t) *st = SG_ERR_INVALID; /* the message is set */
    return t;
}

sg_status sg_module_gpt_block(sg_builder *bl, const char *name, int64_t C, int heads, sg_module **m)
{
    if (!bl) return SG_ERR_NULL;
    if (!m) return sg_fail(bl->ctx, SG_ERR_NULL, "sg_module_gpt_block: m is NULL");
    *m = NULL;
    SG_TRY(need_seq(bl, "sg_module_gpt_block", name));
    SG_TRY(check_heads(bl, "sg_module_gpt_block", name, C, heads));
    block_module *b = calloc(1, sizeof *b);
    if (!b) return sg_fail(bl->ctx, SG_ERR_OOM, "sg_module_gpt_block: out of host memory");
    SG_TRY(sg_module_init(bl, &b->base, &block_i, name));
    sg_module *mod = &b->base;
    b->heads = heads;
    /* Parameters, in the order the passes use them (checkpoint names as GPT-2's). */
    static const char *const pn[12] = {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias",
                                       "attn.proj.weight", "attn.proj.bias", "ln2.weight", "ln2.bias",
                                       "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"};
    const int64_t shapes[12][2] = {{C}, {C}, {3 * C, C}, {3 * C}, {C, C}, {C}, {C}, {C}, {4 * C, C}, {4 * C},
                                   {C, 4 * C}, {C}};
    for (int i = 0; i < 12; i++) {
        bool matrix = i == 2 || i == 4 || i == 8 || i == 10, ln = i == 0 || i == 6;
        sg_init init = matrix ? SG_INIT_NORMAL_002 : ln ? SG_INIT_ONES : SG_INIT_ZEROS;
        int nd = matrix ? 2 : 1;
        b->ip[i] = sg_module_declare(mod, pn[i], nd, shapes[i], init, shapes[i][nd - 1], matrix);
        if (b->ip[i] < 0) return SG_ERR_INVALID;
    }
    SG_TRY(sg_builder_rng(bl, 2, &b->rng, &b->site));
    int64_t B = bl->batch, T = bl->opts.seq, M = bl->rows, H = heads;
    sg_dtype dt = bl->opts.precision, f32 = SG_DTYPE_F32;
    bool drop = bl->opts.dropout > 0;
    sg_status st = SG_OK;
    const int64_t MC[2] = {M, C}, M3C[2] = {M, 3 * C}, M4C[2] = {M, 4 * C};
    b->h1 = own(mod, &st, dt, "h1", 2, MC), b->x2 = own(mod, &st, dt, "x2", 2, MC);
    b->h2 = own(mod, &st, dt, "h2", 2, MC);
    b->mean1 = own(mod, &st, f32, "mean1", 1, &M), b->rstd1 = own(mod, &st, f32, "rstd1", 1, &M);
    b->mean2 = own(mod, &st, f32, "mean2", 1, &M), b->rstd2 = own(mod, &st, f32, "rstd2", 1, &M);
    b->qkv = own(mod, &st, dt, "qkv", 2, M3C), b->a = own(mod, &st, dt, "attn", 2, MC);
    b->p = own(mod, &st, dt, "proj", 2, MC);
    b->fused = sg_module_attention_fused(dt, C, heads);
    /* STEPGRAPH_BIAS_SUMS: separate, each projection sums its own bias gradient; ln, LayerNorm
     * 2's backward sums the two projections' and qkv sums its own; else (the default) the fused
     * attention's backward also sums qkv's, where it can (bf16 on CUDA; the CPU) */
    const char *bs = getenv("STEPGRAPH_BIAS_SUMS");
    b->ln_sums = !(bs && !strcmp(bs, "separate"));
    b->qkv_sums = b->fused && b->ln_sums && !(bs && !strcmp(bs, "ln")) &&
                  (bl->ctx->backend == SG_BACKEND_CPU || dt == SG_DTYPE_BF16);
    if (b->fused) b->att = own(mod, &st, f32, "lse", 3, (int64_t[]){B, H, T});
    else b->att = own(mod, &st, dt, "att", 4, (int64_t[]){B, H, T, T}); /* qkv's dtype */
    b->f = own(mod, &st, dt, "fc", 2, M4C), b->pre_f = own(mod, &st, dt, "fc.pre", 2, M4C);
    b->y = own(mod, &st, dt, "y", 2, MC);
    /* Without dropout the MLP's projection writes y = x2 + proj(f) itself: no q. */
    if (drop) {
        b->pd = own(mod, &st, dt, "proj.dropped", 2, MC), b->q = own(mod, &st, dt, "mlp.proj", 2, MC);
        b->qd = own(mod, &st, dt, "mlp.proj.dropped", 2, MC);
    }
    /* The backward scratch and attention work are used only while one block's pass runs, and
     * blocks run one at a time on one stream (captured or not): every block shares one set.
     * Only dx alternates between two buffers, since block l's dx is block l-1's dy. (Per-block
     * scratch made gpt-768-12-8-256's peak 1.4x PyTorch's.) */
    int64_t we = sg_attention_work_elems(B, T, C, heads);
    if (b->fused) b->work = shared(bl, &st, f32, "attn.delta", 3, (int64_t[]){B, H, T});
    else b->work = shared(bl, &st, f32, "attn.work", 1, &we);
    int64_t np = sg_attention_fused_parts(B, T, C);
    if (b->qkv_sums) b->parts = shared(bl, &st, f32, "attn.bias_parts", 1, &np);
    b->df = shared(bl, &st, dt, "d.fc", 2, M4C);
    b->dh2 = shared(bl, &st, dt, "d.h2", 2, MC), b->dx2 = shared(bl, &st, dt, "d.x2", 2, MC);
    b->da = shared(bl, &st, dt, "d.attn", 2, MC), b->dqkv = shared(bl, &st, dt, "d.qkv", 2, M3C);
    b->dh1 = shared(bl, &st, dt, "d.h1", 2, MC);
    b->dx = shared(bl, &st, dt, bl->blocks % 2 ? "dx.odd" : "dx.even", 2, MC);
    if (drop) b->gq = shared(bl, &st, dt, "d.mlp.proj", 2, MC), b->dp = shared(bl, &st, dt, "d.proj", 2, MC);
    SG_TRY(st);
    bl->blocks++;
    *m = mod;
    return SG_OK;
}
