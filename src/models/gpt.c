/* gpt.c: gpt-WIDTH-DEPTH-BATCH-SEQ, a decoder-only transformer over bytes (vocabulary 256):
 * token + position embedding, DEPTH pre-LayerNorm blocks (causal multi-head self-attention with
 * heads = WIDTH/64, then a 4x GELU MLP, each added back to the residual stream, with optional
 * dropout after each), a final LayerNorm and a linear head (not tied to the embedding), trained
 * with the fused softmax cross-entropy on the next byte. Every module keeps its own forward
 * activations; the blocks share one set of backward scratch and attention work, owned by the
 * model. All of it is allocated at build with fixed addresses, so a step allocates nothing and
 * any module can be captured. Shapes: M = B*T rows; x (M, C); a shorter running length Tb <= T (sg_model_set_seq,
 * through the modules' set_rows) uses the first B*Tb rows of each buffer. Under bf16 mixed
 * precision (m->precision) the activations, their gradients and the parameters the modules see
 * are bf16 (the parameter set's compute copies); LayerNorm statistics and attention scratch
 * stay f32. */
#include "models/model.h"
#include "models/text.h"

#include <math.h>
#include <stdlib.h>

#define GPT_VOCAB 256
#define GPT_HEAD_DIM 64

/* ---- embedding: tokens (B, T) -> x (M, C), with dropout ---- */

typedef struct embed_module {
    sg_module base;
    sg_model *m;
    sg_tensor *wte, *wpe, *dwte, *dwpe;
    const sg_tensor *tokens;
    sg_tensor *y, *yd;          /* y: the sum; yd: after dropout (y itself when p = 0) */
    sg_tensor *dyd;             /* the gradient before dropout's backward */
} embed_module;

static sg_status embed_forward(sg_module *mod, const sg_tensor *tokens, const sg_tensor **y)
{
    embed_module *e = (embed_module *)mod;
    e->tokens = tokens;
    SG_TRY(sg_embedding_forward(mod->ctx, tokens, e->wte, e->wpe, e->y));
    bool drop = e->yd != e->y && !e->m->eval;
    if (drop) SG_TRY(sg_dropout_forward(mod->ctx, e->y, e->m->dropout, e->m->rng, 0, e->yd));
    *y = drop ? e->yd : e->y;
    return SG_OK;
}

static sg_status embed_backward(sg_module *mod, sg_tensor *dy, sg_tensor **dx)
{
    embed_module *e = (embed_module *)mod;
    sg_tensor *g = dy;
    if (e->yd != e->y) {
        SG_TRY(sg_dropout_backward(mod->ctx, dy, e->m->dropout, e->m->rng, 0, e->dyd));
        g = e->dyd;
    }
    SG_TRY(sg_embedding_backward(mod->ctx, e->tokens, g, e->dwte, e->dwpe));
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

/* Variable sequence length: rows = B*Tb of every buffer (the tokens say B and Tb). */
static sg_status embed_set_rows(sg_module *mod, int64_t rows)
{
    embed_module *e = (embed_module *)mod;
    SG_TRY(sg_tensor_set_rows(e->y, rows));
    if (e->yd != e->y) SG_TRY(sg_tensor_set_rows(e->yd, rows));
    return e->dyd ? sg_tensor_set_rows(e->dyd, rows) : SG_OK;
}

static const sg_module_i embed_i = {"embedding", embed_forward, embed_backward, embed_destroy, embed_set_rows};

/* ---- LayerNorm module ---- */

typedef struct ln_module {
    sg_module base;
    sg_tensor *w, *b, *dw, *db;
    const sg_tensor *x;
    sg_tensor *y, *mean, *rstd, *dx;
} ln_module;

static sg_status ln_forward(sg_module *mod, const sg_tensor *x, const sg_tensor **y)
{
    ln_module *l = (ln_module *)mod;
    l->x = x;
    SG_TRY(sg_layernorm_forward(mod->ctx, x, l->w, l->b, 1e-5f, l->y, l->mean, l->rstd));
    *y = l->y;
    return SG_OK;
}

static sg_status ln_backward(sg_module *mod, sg_tensor *dy, sg_tensor **dx)
{
    ln_module *l = (ln_module *)mod;
    SG_TRY(sg_layernorm_backward(mod->ctx, l->x, l->w, l->mean, l->rstd, dy, l->dx, l->dw, l->db));
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

static const sg_module_i ln_i = {"layernorm", ln_forward, ln_backward, ln_destroy, ln_set_rows};

/* ---- transformer block ---- */

typedef struct block_module {
    sg_module base;
    sg_model *m;
    int index, heads;
    uint32_t site;              /* dropout call sites: site (attention), site + 1 (MLP) */
    sg_tensor *ln1w, *ln1b, *wqkv, *bqkv, *wo, *bo, *ln2w, *ln2b, *wfc, *bfc, *wp, *bp;
    sg_tensor *dln1w, *dln1b, *dwqkv, *dbqkv, *dwo, *dbo, *dln2w, *dln2b, *dwfc, *dbfc, *dwp, *dbp;
    const sg_tensor *x;
    /* forward activations (M rows) */
    sg_tensor *h1, *mean1, *rstd1, *qkv, *att, *work, *a, *p, *pd, *x2, *h2, *mean2, *rstd2, *f,
        *pre_f, *q, *qd, *y;
    /* backward buffers */
    sg_tensor *g, *gq, *df, *dh2, *dx2, *dp, *da, *dqkv, *dh1, *dx;
} block_module;

static sg_status block_forward(sg_module *mod, const sg_tensor *x, const sg_tensor **y)
{
    block_module *b = (block_module *)mod;
    sg_ctx *ctx = mod->ctx;
    float p = b->m->eval ? 0.f : b->m->dropout;
    b->x = x;
    SG_TRY(sg_layernorm_forward(ctx, x, b->ln1w, b->ln1b, 1e-5f, b->h1, b->mean1, b->rstd1));
    SG_TRY(sg_linear_forward(ctx, b->h1, b->wqkv, b->bqkv, SG_ACT_NONE, b->qkv, NULL));
    SG_TRY(sg_attention_forward(ctx, b->qkv, b->heads, b->a, b->att, b->work));
    SG_TRY(sg_linear_forward(ctx, b->a, b->wo, b->bo, SG_ACT_NONE, b->p, NULL));
    if (p > 0) SG_TRY(sg_dropout_forward(ctx, b->p, p, b->m->rng, b->site, b->pd));
    SG_TRY(sg_add_forward(ctx, x, p > 0 ? b->pd : b->p, b->x2));
    SG_TRY(sg_layernorm_forward(ctx, b->x2, b->ln2w, b->ln2b, 1e-5f, b->h2, b->mean2, b->rstd2));
    SG_TRY(sg_linear_forward(ctx, b->h2, b->wfc, b->bfc, SG_ACT_GELU, b->f, b->pre_f));
    SG_TRY(sg_linear_forward(ctx, b->f, b->wp, b->bp, SG_ACT_NONE, b->q, NULL));
    if (p > 0) SG_TRY(sg_dropout_forward(ctx, b->q, p, b->m->rng, b->site + 1, b->qd));
    SG_TRY(sg_add_forward(ctx, b->x2, p > 0 ? b->qd : b->q, b->y));
    *y = b->y;
    return SG_OK;
}

static sg_status block_backward(sg_module *mod, sg_tensor *dy, sg_tensor **dx)
{
    block_module *b = (block_module *)mod;
    sg_ctx *ctx = mod->ctx;
    float p = b->m->dropout;
    /* MLP branch: y = x2 + drop(proj(gelu(fc(ln2(x2))))) */
    sg_tensor *gq = dy;
    if (p > 0) {
        SG_TRY(sg_dropout_backward(ctx, dy, p, b->m->rng, b->site + 1, b->gq));
        gq = b->gq;
    }
    SG_TRY(sg_linear_backward(ctx, b->f, b->wp, gq, SG_ACT_NONE, NULL, b->df, b->dwp, b->dbp));
    SG_TRY(sg_linear_backward(ctx, b->h2, b->wfc, b->df, SG_ACT_GELU, b->pre_f, b->dh2, b->dwfc, b->dbfc));
    SG_TRY(sg_layernorm_backward(ctx, b->x2, b->ln2w, b->mean2, b->rstd2, b->dh2, b->g, b->dln2w, b->dln2b));
    SG_TRY(sg_add_forward(ctx, dy, b->g, b->dx2)); /* the residual carries dy through */
    /* attention branch: x2 = x + drop(proj(attn(qkv(ln1(x))))) */
    sg_tensor *gp = b->dx2;
    if (p > 0) {
        SG_TRY(sg_dropout_backward(ctx, b->dx2, p, b->m->rng, b->site, b->dp));
        gp = b->dp;
    }
    SG_TRY(sg_linear_backward(ctx, b->a, b->wo, gp, SG_ACT_NONE, NULL, b->da, b->dwo, b->dbo));
    SG_TRY(sg_attention_backward(ctx, b->qkv, b->att, b->da, b->heads, b->dqkv, b->work));
    SG_TRY(sg_linear_backward(ctx, b->h1, b->wqkv, b->dqkv, SG_ACT_NONE, NULL, b->dh1, b->dwqkv, b->dbqkv));
    SG_TRY(sg_layernorm_backward(ctx, b->x, b->ln1w, b->mean1, b->rstd1, b->dh1, b->g, b->dln1w, b->dln1b));
    SG_TRY(sg_add_forward(ctx, b->dx2, b->g, b->dx));
    *dx = b->dx;
    return SG_OK;
}

static void block_destroy(sg_module *mod)
{
    block_module *b = (block_module *)mod;
    /* The forward activations are the block's own; the backward scratch and work are the
     * model's (shared by every block). */
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
    int64_t B = b->m->spec.batch;
    if (rows % B)
        return sg_fail(mod->ctx, SG_ERR_SHAPE, "block '%s': %lld rows are not a whole number of sequences "
                       "of the batch %lld", mod->name, (long long)rows, (long long)B);
    sg_tensor *ts[] = {b->h1, b->mean1, b->rstd1, b->qkv, b->a, b->p, b->pd, b->x2, b->h2, b->mean2,
                       b->rstd2, b->f, b->pre_f, b->q, b->qd, b->y, b->g, b->gq, b->df, b->dh2, b->dx2,
                       b->dp, b->da, b->dqkv, b->dh1, b->dx};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        if (ts[i]) SG_TRY(sg_tensor_set_rows(ts[i], rows)); /* the dropout buffers may be absent */
    int64_t Tb = rows / B;
    return sg_tensor_set_shape(b->att, 4, (int64_t[]){B, b->heads, Tb, Tb});
}

static const sg_module_i block_i = {"block", block_forward, block_backward, block_destroy, block_set_rows};

/* ---- building ---- */

typedef struct gpt_builder {
    sg_model *m;
    sg_status st;
} gpt_builder;

static sg_tensor *buf_of(gpt_builder *g, sg_dtype dt, const char *owner, const char *what, int ndim,
                         const int64_t *shape)
{
    if (g->st != SG_OK) return NULL;
    char n[96];
    snprintf(n, sizeof n, "%s.%s", owner, what);
    sg_tensor *t = NULL;
    g->st = sg_tensor_create(g->m->ctx, dt, ndim, shape, n, &t);
    return t;
}

/* Hands t to the model (m->shared), which destroys it after the modules that use it. */
static sg_tensor *share(gpt_builder *g, sg_tensor *t)
{
    if (!t) return NULL;
    sg_model *m = g->m;
    if (m->n_shared == (int)(sizeof m->shared / sizeof *m->shared)) {
        sg_tensor_destroy(t);
        if (g->st == SG_OK) g->st = sg_fail(m->ctx, SG_ERR_INVALID, "sg_model_create: too many shared buffers");
        return NULL;
    }
    return m->shared[m->n_shared++] = t;
}

/* F32 whatever the precision: LayerNorm statistics and attention scratch. */
static sg_tensor *buf(gpt_builder *g, const char *owner, const char *what, int ndim, const int64_t *shape)
{
    return buf_of(g, SG_DTYPE_F32, owner, what, ndim, shape);
}

/* Activations and their gradients, (M, cols) in the model's precision (f32 or bf16). */
static sg_tensor *rows(gpt_builder *g, const char *owner, const char *what, int64_t M, int64_t cols)
{
    return buf_of(g, g->m->precision, owner, what, 2, (int64_t[]){M, cols});
}

static int declare(gpt_builder *g, const char *owner, const char *what, int ndim, const int64_t *shape,
                   sg_init init, int decay)
{
    char n[96];
    snprintf(n, sizeof n, "%s.%s", owner, what);
    int i = sg_params_declare(&g->m->params, n, ndim, shape, decay, init, shape[ndim - 1]);
    if (i < 0 && g->st == SG_OK) g->st = SG_ERR_INVALID;
    return i;
}

/* Mirrors sg_gpt_build's allocations: parameters and gradients (and their bf16 copies), the
 * embedding's, each block's, the shared backward scratch's, ln_f's and the head's buffers,
 * and the inputs. The text data set is counted when it is read (sg_text_open). */
void sg_gpt_estimate(const sg_model_spec *s, sg_dtype precision, float dropout, sg_model_size *out)
{
    double C = (double)s->width, L = (double)s->depth, B = (double)s->batch, T = (double)s->seq;
    double M = B * T, V = GPT_VOCAB, H = floor(C / GPT_HEAD_DIM), a = precision == SG_DTYPE_BF16 ? 2 : 4;
    double drop = dropout > 0 ? 1 : 0;
    double P = 2 * V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    out->params = (int64_t)P;
    out->param_bytes = (size_t)(2 * P * 4 + (a == 2 ? 2 * P * 2 : 0));
    out->optim_bytes = (size_t)(2 * P * 4);
    double embed = (1 + 2 * drop) * M * C * a;
    double shared = (4 * M * C + B * H * T * T) * 4 + (7 + 4 + 3 + 2 * drop) * M * C * a;
    double block = (18 + 2 * drop) * M * C * a + 4 * M * 4 + B * H * T * T * a;
    double tail = 2 * M * C * a + 2 * M * 4 + M * V * a + M * C * a + M * V * a;
    out->activation_bytes = (size_t)(embed + shared + L * block + tail);
    out->data_bytes = (size_t)(2 * M * 4);
}

sg_status sg_gpt_build(sg_model *m, uint64_t seed)
{
    sg_ctx *ctx = m->ctx;
    int64_t C = m->spec.width, L = m->spec.depth, B = m->spec.batch, T = m->spec.seq, M = B * T;
    int64_t V = GPT_VOCAB, H = C / GPT_HEAD_DIM;
    if (C % GPT_HEAD_DIM || H < 1)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_model_create: '%s': width %lld is not a multiple of the "
                       "head size %d", m->name, (long long)C, GPT_HEAD_DIM);
    m->in_dim = T, m->classes = V, m->seq_len = T;
    gpt_builder g = {m, SG_OK};

    /* Parameters, in the order the blocks use them. */
    int iwte = declare(&g, "wte", "weight", 2, (int64_t[]){V, C}, SG_INIT_NORMAL_002, 1);
    int iwpe = declare(&g, "wpe", "weight", 2, (int64_t[]){T, C}, SG_INIT_NORMAL_002, 1);
    int ib[64][12];
    for (int l = 0; l < L; l++) {
        char o[32];
        snprintf(o, sizeof o, "blocks.%d", l);
        ib[l][0] = declare(&g, o, "ln1.weight", 1, &C, SG_INIT_ONES, 0);
        ib[l][1] = declare(&g, o, "ln1.bias", 1, &C, SG_INIT_ZEROS, 0);
        ib[l][2] = declare(&g, o, "attn.qkv.weight", 2, (int64_t[]){3 * C, C}, SG_INIT_NORMAL_002, 1);
        ib[l][3] = declare(&g, o, "attn.qkv.bias", 1, (int64_t[]){3 * C}, SG_INIT_ZEROS, 0);
        ib[l][4] = declare(&g, o, "attn.proj.weight", 2, (int64_t[]){C, C}, SG_INIT_NORMAL_002, 1);
        ib[l][5] = declare(&g, o, "attn.proj.bias", 1, &C, SG_INIT_ZEROS, 0);
        ib[l][6] = declare(&g, o, "ln2.weight", 1, &C, SG_INIT_ONES, 0);
        ib[l][7] = declare(&g, o, "ln2.bias", 1, &C, SG_INIT_ZEROS, 0);
        ib[l][8] = declare(&g, o, "mlp.fc.weight", 2, (int64_t[]){4 * C, C}, SG_INIT_NORMAL_002, 1);
        ib[l][9] = declare(&g, o, "mlp.fc.bias", 1, (int64_t[]){4 * C}, SG_INIT_ZEROS, 0);
        ib[l][10] = declare(&g, o, "mlp.proj.weight", 2, (int64_t[]){C, 4 * C}, SG_INIT_NORMAL_002, 1);
        ib[l][11] = declare(&g, o, "mlp.proj.bias", 1, &C, SG_INIT_ZEROS, 0);
    }
    int ilnw = declare(&g, "ln_f", "weight", 1, &C, SG_INIT_ONES, 0);
    int ilnb = declare(&g, "ln_f", "bias", 1, &C, SG_INIT_ZEROS, 0);
    int ihead = declare(&g, "head", "weight", 2, (int64_t[]){V, C}, SG_INIT_NORMAL_002, 1);
    SG_TRY(g.st);
    SG_TRY(sg_params_allocate(&m->params, seed));
    if (m->precision == SG_DTYPE_BF16) SG_TRY(sg_params_allocate_lowp(&m->params));
    sg_param_set *ps = &m->params;
    /* The modules read the compute copies (bf16 under mixed precision) and write gradients of
     * the same dtype. */
#define P(i) sg_params_compute(ps, i)
#define G(i) sg_params_compute_grad(ps, i)

    /* Randomness for dropout: seed and offset on the device. */
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){4}, "rng", &m->rng));
    /* (Data parallelism: each shard draws its own masks; element indices restart on each.) */
    uint64_t ds = seed + (uint64_t)m->shard * 0x9e3779b97f4a7c15ull;
    int32_t rs[4] = {(int32_t)(ds & 0x7fffffff), (int32_t)(ds >> 32), 0, 0};
    SG_TRY(sg_tensor_copy_from_host(m->rng, rs, sizeof rs));

    int nmod = (int)L + 3;
    sg_module **mods = calloc((size_t)nmod, sizeof *mods);
    if (!mods) return sg_fail(ctx, SG_ERR_OOM, "sg_model_create: out of host memory");
    int k = 0;

    embed_module *e = calloc(1, sizeof *e);
    if (!e) g.st = sg_fail(ctx, SG_ERR_OOM, "sg_model_create: out of host memory");
    else {
        e->base = (sg_module){.vt = &embed_i, .ctx = ctx, .name = "embedding"};
        e->m = m;
        e->wte = P(iwte), e->wpe = P(iwpe), e->dwte = G(iwte), e->dwpe = G(iwpe);
        e->y = rows(&g, "embedding", "y", M, C);
        e->yd = m->dropout > 0 ? rows(&g, "embedding", "y_dropped", M, C) : e->y;
        e->dyd = m->dropout > 0 ? rows(&g, "embedding", "dy", M, C) : NULL;
        mods[k++] = &e->base;
    }
    /* The blocks' backward scratch and attention work are used only while one block's pass
     * runs, and blocks run one at a time on one stream (captured or not): every block shares
     * one set, owned by the model. Only dx alternates between two buffers, since block l's dx
     * is block l-1's dy. (Per-block scratch made gpt-768-12-8-256's peak 1.4x PyTorch's.) */
    int64_t we = sg_attention_work_elems(B, T, C, (int)H);
    sg_tensor *work = share(&g, buf(&g, "blocks", "attn.work", 1, &we));
    sg_tensor *dln = share(&g, rows(&g, "blocks", "d.ln", M, C));
    sg_tensor *dfc = share(&g, rows(&g, "blocks", "d.fc", M, 4 * C));
    sg_tensor *dh2 = share(&g, rows(&g, "blocks", "d.h2", M, C));
    sg_tensor *dx2 = share(&g, rows(&g, "blocks", "d.x2", M, C));
    sg_tensor *dattn = share(&g, rows(&g, "blocks", "d.attn", M, C));
    sg_tensor *dqkv = share(&g, rows(&g, "blocks", "d.qkv", M, 3 * C));
    sg_tensor *dh1 = share(&g, rows(&g, "blocks", "d.h1", M, C));
    sg_tensor *dxs[2] = {share(&g, rows(&g, "blocks", "dx.even", M, C)), share(&g, rows(&g, "blocks", "dx.odd", M, C))};
    sg_tensor *dq = NULL, *dproj = NULL;
    if (m->dropout > 0) {
        dq = share(&g, rows(&g, "blocks", "d.mlp.proj", M, C));
        dproj = share(&g, rows(&g, "blocks", "d.proj", M, C));
    }
    for (int l = 0; l < L && g.st == SG_OK; l++) {
        block_module *b = calloc(1, sizeof *b);
        if (!b) {
            g.st = sg_fail(ctx, SG_ERR_OOM, "sg_model_create: out of host memory");
            break;
        }
        b->base = (sg_module){.vt = &block_i, .ctx = ctx};
        snprintf(b->base.name, sizeof b->base.name, "blocks.%d", l);
        mods[k++] = &b->base;
        b->m = m, b->index = l, b->heads = (int)H, b->site = 1 + 2 * (uint32_t)l;
        int *i = ib[l];
        b->ln1w = P(i[0]), b->ln1b = P(i[1]), b->wqkv = P(i[2]), b->bqkv = P(i[3]), b->wo = P(i[4]);
        b->bo = P(i[5]), b->ln2w = P(i[6]), b->ln2b = P(i[7]), b->wfc = P(i[8]), b->bfc = P(i[9]);
        b->wp = P(i[10]), b->bp = P(i[11]);
        b->dln1w = G(i[0]), b->dln1b = G(i[1]), b->dwqkv = G(i[2]), b->dbqkv = G(i[3]), b->dwo = G(i[4]);
        b->dbo = G(i[5]), b->dln2w = G(i[6]), b->dln2b = G(i[7]), b->dwfc = G(i[8]), b->dbfc = G(i[9]);
        b->dwp = G(i[10]), b->dbp = G(i[11]);
        const char *o = b->base.name;
        b->h1 = rows(&g, o, "h1", M, C), b->x2 = rows(&g, o, "x2", M, C), b->h2 = rows(&g, o, "h2", M, C);
        b->mean1 = buf(&g, o, "mean1", 1, &M), b->rstd1 = buf(&g, o, "rstd1", 1, &M);
        b->mean2 = buf(&g, o, "mean2", 1, &M), b->rstd2 = buf(&g, o, "rstd2", 1, &M);
        b->qkv = rows(&g, o, "qkv", M, 3 * C), b->a = rows(&g, o, "attn", M, C), b->p = rows(&g, o, "proj", M, C);
        b->att = buf_of(&g, m->precision, o, "att", 4, (int64_t[]){B, H, T, T}); /* qkv's dtype */
        b->work = work;
        b->f = rows(&g, o, "fc", M, 4 * C), b->pre_f = rows(&g, o, "fc.pre", M, 4 * C);
        b->q = rows(&g, o, "mlp.proj", M, C), b->y = rows(&g, o, "y", M, C);
        if (m->dropout > 0) {
            b->pd = rows(&g, o, "proj.dropped", M, C), b->qd = rows(&g, o, "mlp.proj.dropped", M, C);
            b->gq = dq, b->dp = dproj;
        }
        b->g = dln, b->df = dfc, b->dh2 = dh2, b->dx2 = dx2, b->da = dattn, b->dqkv = dqkv;
        b->dh1 = dh1, b->dx = dxs[l % 2];
    }
    if (g.st == SG_OK) {
        ln_module *l = calloc(1, sizeof *l);
        if (!l) g.st = sg_fail(ctx, SG_ERR_OOM, "sg_model_create: out of host memory");
        else {
            l->base = (sg_module){.vt = &ln_i, .ctx = ctx, .name = "ln_f"};
            mods[k++] = &l->base;
            l->w = P(ilnw), l->b = P(ilnb), l->dw = G(ilnw), l->db = G(ilnb);
            l->y = rows(&g, "ln_f", "y", M, C), l->dx = rows(&g, "ln_f", "dx", M, C);
            l->mean = buf(&g, "ln_f", "mean", 1, &M), l->rstd = buf(&g, "ln_f", "rstd", 1, &M);
        }
    }
    if (g.st == SG_OK) {
        sg_module *head = NULL;
        g.st = sg_linear_create(ctx, "head", M, P(ihead), NULL, G(ihead), NULL, SG_ACT_NONE, true, &head);
        if (head) mods[k++] = head;
    }
    sg_status st = g.st;
    if (st == SG_OK) st = sg_sequential_create(ctx, "gpt", mods, k, &m->net);
    else
        for (int i = 0; i < k; i++) sg_module_destroy(mods[i]);
    free(mods);
#undef P
#undef G
    SG_TRY(st);
    /* Each child's first parameter: the embedding's, each block's, ln_f's, the head's. */
    int first[67];
    first[0] = iwte;
    for (int l = 0; l < L; l++) first[1 + l] = ib[l][0];
    first[L + 1] = ilnw, first[L + 2] = ihead;
    SG_TRY(sg_model_set_grad_ready(m, first, (int)L + 3));

    /* Inputs: tokens (B, T) and next-byte targets, static; the loss sees targets as (M). */
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 2, (int64_t[]){B, T}, "tokens", &m->x_static));
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, &M, "targets", &m->t_static));
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "batch.index", &m->batch_idx));
    SG_TRY(sg_tensor_view(m->t_static, 0, 2, (int64_t[]){B, T}, "targets.bt", &m->t_view));
    m->x = m->x_static, m->targets = m->t_static;
    SG_TRY(sg_tensor_create(ctx, SG_DTYPE_F32, 1, (int64_t[]){1}, "loss", &m->loss));
    SG_TRY(sg_tensor_create(ctx, m->precision, 2, (int64_t[]){M, V}, "dlogits", &m->dlogits));
    const char *path = m->data_path[0] ? m->data_path : sg_text_default_path();
    if (!path)
        return sg_fail(ctx, SG_ERR_IO, "sg_model_create: '%s' needs text: no --data path and none of the "
                       "default texts (/usr/share/common-licenses/...) exists", m->name);
    /* Each split must hold a window of T + 1 bytes: checked from the file's size, before reading. */
    SG_TRY(sg_text_open_window(ctx, path, 0.1, T + 1, &m->text));
    m->data_seed = seed ^ 0xda7a5eedull;
    sg_text_set_row0(m->text, (int64_t)m->shard * B); /* data parallelism: this shard's rows */
    return SG_OK;
}
