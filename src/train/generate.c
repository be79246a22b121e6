/* generate.c: sg_generator, KV-cache generation for a GPT (stepgraph.h, "generation"). The
 * generator finds the model's parameters by name, owns a key/value cache per layer and the
 * buffers of one forward of max_batch x max_len rows, and runs a call's work three ways: eager,
 * a captured graph per step (prefill per (batch, prompt) bucket, decode per batch bucket), or
 * one graph holding the prefill and a WHILE node over decode steps. Everything a call varies
 * (prompts, lengths, temperature, top-k, seed, stop sequence) is copied into device tensors
 * before the launch, so each graph is captured once per bucket.
 *
 * A graph is captured the first time its bucket is met, with one eager warm-up that does this
 * call's work (its lazy set-up included); the capture itself runs nothing, so that call does
 * not replay it. Later calls replay. */
#include "train/model.h"

#include "graph/graph.h"
#include "ops/decode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define GEN_LN_EPS 1e-5f
#define GEN_HEAD_DIM 64
#define GEN_MAX_BUCKETS 32
#define GEN_MAX_VIEWS 128
/* The fused one-row kernel keeps a normalized row in 48 KiB of shared memory. */
#define GEN_FUSED_MAX_BYTES (48 * 1024)

enum { BLK_LN1W, BLK_LN1B, BLK_QKVW, BLK_QKVB, BLK_PROJW, BLK_PROJB, BLK_LN2W, BLK_LN2B, BLK_FCW, BLK_FCB,
       BLK_MPW, BLK_MPB, BLK_N };
static const char *const blk_names[BLK_N] = {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias",
                                             "attn.proj.weight", "attn.proj.bias", "ln2.weight", "ln2.bias",
                                             "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"};

/* The buffers seen as one shape: nb sequences of Tq rows each (R = nb*Tq). */
typedef struct gen_views {
    int64_t nb, Tq;
    sg_tensor *x, *h, *qkv, *a, *p, *f, *pre, *mean, *rstd;   /* (R, .) */
    sg_tensor *ptok;                                           /* (nb, Tq): prefill's tokens */
    sg_tensor *xl, *hl, *meanl, *rstdl, *logits;               /* (nb, .): the head's rows */
    sg_tensor *tok, *pos, *zeros, *info, *out;                 /* (nb), (nb, 4), (nb, N) */
    bool captured[3];          /* the graph of each kind over these views is in the cache */
} gen_views;

struct sg_generator {
    sg_ctx *ctx;
    sg_model *m;
    sg_dtype dt;
    int64_t C, L, H, V, T, B;      /* width, layers, heads, vocabulary, max_len, max_batch */
    int64_t buckets[GEN_MAX_BUCKETS];
    int n_buckets;
    sg_tensor *wte, *wpe, *lnf_w, *lnf_b, *head_w;
    sg_tensor *(*blk)[BLK_N];      /* (L) */
    sg_tensor **kc, **vc;          /* (L) caches, (B, H, T, hs) */
    /* buffers at their largest */
    sg_tensor *x, *h, *qkv, *a, *p, *f, *pre, *mean, *rstd, *ptok;
    sg_tensor *xl, *hl, *meanl, *rstdl, *logits;
    sg_tensor *tok, *pos, *zeros, *info, *out, *ctl, *temp, *go;
    gen_views *views[GEN_MAX_VIEWS];
    int n_views;
    sg_graph_cache *cache;
    /* the work being captured or run: which views */
    gen_views *pv, *dv;
    bool counted[3];               /* this call's graph of each kind is in its stats' nodes */
};


const char *sg_gen_mode_name(sg_gen_mode m)
{
    switch (m) {
    case SG_GEN_EAGER: return "eager";
    case SG_GEN_STEP: return "step";
    case SG_GEN_LOOP: return "loop";
    }
    return "?";
}

sg_status sg_gen_mode_parse(const char *s, sg_gen_mode *out)
{
    if (!s || !out) return SG_ERR_NULL;
    for (int k = SG_GEN_EAGER; k <= SG_GEN_LOOP; k++)
        if (!strcmp(s, sg_gen_mode_name((sg_gen_mode)k))) {
            *out = (sg_gen_mode)k;
            return SG_OK;
        }
    return SG_ERR_INVALID;
}

sg_generator_options sg_generator_options_default(void)
{
    sg_generator_options o = {0};
    o.max_batch = 1;
    return o;
}

/* ---- the model's parameters, by name ---- */

/* The index of the model's parameter `name`, or -1. */
static int param_index(const sg_model *m, const char *name)
{
    for (int i = 0; i < m->params->count; i++)
        if (!strcmp(m->params->info[i].name, name)) return i;
    return -1;
}

static sg_tensor *param(sg_generator *g, const char *name, int64_t d0, int64_t d1, sg_status *st)
{
    if (*st != SG_OK) return NULL;
    sg_param_set *ps = g->m->params;
    int i = param_index(g->m, name);
    if (i >= 0) {
        const sg_param_info *pi = &ps->info[i];
        bool ok = d1 ? pi->ndim == 2 && pi->shape[0] == d0 && pi->shape[1] == d1 : pi->ndim == 1 && pi->shape[0] == d0;
        if (!ok) {
            *st = sg_fail(g->ctx, SG_ERR_INVALID, "sg_generator_create: model '%s': parameter '%s' has %d dims "
                          "(%lld, ...), expected (%lld%s%lld)", g->m->name, name, pi->ndim,
                          (long long)pi->shape[0], (long long)d0, d1 ? ", " : "", (long long)(d1 ? d1 : 0));
            return NULL;
        }
        return sg_params_compute(ps, i);
    }
    *st = sg_fail(g->ctx, SG_ERR_INVALID, "sg_generator_create: model '%s' has no parameter '%s': a generator "
                  "reads a GPT's (wte, wpe, blocks.N.*, ln_f, head; see stepgraph.h)", g->m->name, name);
    return NULL;
}

static sg_status find_params(sg_generator *g, int heads)
{
    sg_status st = SG_OK;
    sg_param_set *ps = g->m->params;
    int iw = param_index(g->m, "wte.weight");
    if (iw < 0 || ps->info[iw].ndim != 2)
        return sg_fail(g->ctx, SG_ERR_INVALID, "sg_generator_create: model '%s' has no (V, C) parameter "
                       "'wte.weight': a generator reads a GPT's parameters (see stepgraph.h)", g->m->name);
    g->V = ps->info[iw].shape[0], g->C = ps->info[iw].shape[1];
    g->H = heads > 0 ? heads : g->C / GEN_HEAD_DIM;
    if (g->H < 1 || g->C % g->H)
        return sg_fail(g->ctx, SG_ERR_INVALID, "sg_generator_create: width %lld over %lld heads: expected heads "
                       "dividing the width", (long long)g->C, (long long)g->H);
    char n[96];
    for (g->L = 0;; g->L++) {
        snprintf(n, sizeof n, "blocks.%lld.ln1.weight", (long long)g->L);
        if (param_index(g->m, n) < 0) break;
    }
    if (g->L < 1)
        return sg_fail(g->ctx, SG_ERR_INVALID, "sg_generator_create: model '%s' has no parameter "
                       "'blocks.0.ln1.weight': no GPT block to run", g->m->name);
    g->blk = calloc((size_t)g->L, sizeof *g->blk);
    if (!g->blk) return sg_fail(g->ctx, SG_ERR_OOM, "sg_generator_create: out of host memory");
    const int64_t C = g->C;
    const int64_t d0[BLK_N] = {C, C, 3 * C, 3 * C, C, C, C, C, 4 * C, 4 * C, C, C};
    const int64_t d1[BLK_N] = {0, 0, C, 0, C, 0, 0, 0, C, 0, 4 * C, 0};
    for (int64_t l = 0; l < g->L; l++)
        for (int k = 0; k < BLK_N; k++) {
            snprintf(n, sizeof n, "blocks.%lld.%s", (long long)l, blk_names[k]);
            g->blk[l][k] = param(g, n, d0[k], d1[k], &st);
        }
    g->wte = param(g, "wte.weight", g->V, C, &st);
    g->wpe = param(g, "wpe.weight", g->m->spec.seq, C, &st);
    g->lnf_w = param(g, "ln_f.weight", C, 0, &st);
    g->lnf_b = param(g, "ln_f.bias", C, 0, &st);
    g->head_w = param(g, "head.weight", g->V, C, &st);
    if (st == SG_OK && param_index(g->m, "head.bias") >= 0)
        st = sg_fail(g->ctx, SG_ERR_INVALID, "sg_generator_create: model '%s' has 'head.bias'; the generator "
                     "runs the gpt kind's bias-free head", g->m->name);
    return st;
}

/* ---- buffers and their views ---- */

static sg_tensor *buf(sg_generator *g, sg_status *st, sg_dtype dt, const char *name, int nd, int64_t d0, int64_t d1)
{
    if (*st != SG_OK) return NULL;
    sg_tensor *t = NULL;
    int64_t shape[2] = {d0, d1};
    *st = sg_tensor_create(g->ctx, dt, nd, shape, name, &t);
    return t;
}

static sg_tensor *view(sg_tensor *base, sg_status *st, int nd, int64_t d0, int64_t d1)
{
    if (*st != SG_OK) return NULL;
    sg_tensor *t = NULL;
    int64_t shape[2] = {d0, d1};
    *st = sg_tensor_view(base, 0, nd, shape, base->name, &t);
    return t;
}

static void views_destroy(gen_views *v)
{
    if (!v) return;
    sg_tensor *ts[] = {v->x, v->h, v->qkv, v->a, v->p, v->f, v->pre, v->mean, v->rstd, v->ptok, v->xl, v->hl,
                       v->meanl, v->rstdl, v->logits, v->tok, v->pos, v->zeros, v->info, v->out};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
    free(v);
}

/* The views of shape (nb, Tq), made once and kept (graphs and CPU plans hold them). */
static sg_status get_views(sg_generator *g, int64_t nb, int64_t Tq, gen_views **out)
{
    for (int i = 0; i < g->n_views; i++)
        if (g->views[i]->nb == nb && g->views[i]->Tq == Tq) {
            *out = g->views[i];
            return SG_OK;
        }
    if (g->n_views == GEN_MAX_VIEWS)
        return sg_fail(g->ctx, SG_ERR_INVALID, "sg_generate: more than %d shapes; use fewer batch buckets",
                       GEN_MAX_VIEWS);
    gen_views *v = calloc(1, sizeof *v);
    if (!v) return sg_fail(g->ctx, SG_ERR_OOM, "sg_generate: out of host memory");
    sg_status st = SG_OK;
    const int64_t R = nb * Tq, C = g->C;
    v->nb = nb, v->Tq = Tq;
    v->x = view(g->x, &st, 2, R, C), v->h = view(g->h, &st, 2, R, C), v->qkv = view(g->qkv, &st, 2, R, 3 * C);
    v->a = view(g->a, &st, 2, R, C), v->p = view(g->p, &st, 2, R, C), v->f = view(g->f, &st, 2, R, 4 * C);
    v->pre = view(g->pre, &st, 2, R, 4 * C), v->mean = view(g->mean, &st, 1, R, 0);
    v->rstd = view(g->rstd, &st, 1, R, 0), v->ptok = view(g->ptok, &st, 2, nb, Tq);
    v->xl = view(g->xl, &st, 2, nb, C), v->hl = view(g->hl, &st, 2, nb, C);
    v->meanl = view(g->meanl, &st, 1, nb, 0), v->rstdl = view(g->rstdl, &st, 1, nb, 0);
    v->logits = view(g->logits, &st, 2, nb, g->V), v->tok = view(g->tok, &st, 1, nb, 0);
    v->pos = view(g->pos, &st, 1, nb, 0), v->zeros = view(g->zeros, &st, 1, nb, 0);
    v->info = view(g->info, &st, 2, nb, SG_GEN_INFO), v->out = view(g->out, &st, 2, nb, g->T);
    if (st != SG_OK) {
        views_destroy(v);
        return st;
    }
    g->views[g->n_views++] = v;
    *out = v;
    return SG_OK;
}

void sg_generator_destroy(sg_generator *g)
{
    if (!g) return;
    sg_graph_cache_destroy(g->cache);
    for (int i = 0; i < g->n_views; i++) views_destroy(g->views[i]);
    for (int64_t l = 0; g->kc && l < g->L; l++) sg_tensor_destroy(g->kc[l]), sg_tensor_destroy(g->vc[l]);
    sg_tensor *ts[] = {g->x, g->h, g->qkv, g->a, g->p, g->f, g->pre, g->mean, g->rstd, g->ptok, g->xl, g->hl,
                       g->meanl, g->rstdl, g->logits, g->tok, g->pos, g->zeros, g->info, g->out, g->go, g->ctl,
                       g->temp};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
    free(g->kc), free(g->vc), free(g->blk);
    free(g);
}

static sg_status check_buckets(sg_generator *g, const sg_generator_options *o)
{
    if (!o->batch_buckets) {
        for (int64_t b = 1; b < g->B; b *= 2) g->buckets[g->n_buckets++] = b;
        g->buckets[g->n_buckets++] = g->B;
        return SG_OK;
    }
    if (o->n_batch_buckets < 1 || o->n_batch_buckets > GEN_MAX_BUCKETS)
        return sg_fail(g->ctx, SG_ERR_INVALID, "sg_generator_create: %d batch buckets: expected 1 to %d",
                       o->n_batch_buckets, GEN_MAX_BUCKETS);
    for (int i = 0; i < o->n_batch_buckets; i++) {
        int64_t b = o->batch_buckets[i];
        if (b < 1 || b > g->B || (i && b <= o->batch_buckets[i - 1]))
            return sg_fail(g->ctx, SG_ERR_INVALID, "sg_generator_create: batch bucket %lld (number %d): expected "
                           "rising sizes from 1 to max_batch %lld", (long long)b, i, (long long)g->B);
        g->buckets[g->n_buckets++] = b;
    }
    if (g->buckets[g->n_buckets - 1] != g->B)
        return sg_fail(g->ctx, SG_ERR_INVALID, "sg_generator_create: the largest batch bucket is %lld; expected "
                       "max_batch %lld", (long long)g->buckets[g->n_buckets - 1], (long long)g->B);
    return SG_OK;
}

sg_status sg_generator_create(sg_model *m, const sg_generator_options *opts, sg_generator **out)
{
    if (!m) return SG_ERR_NULL;
    sg_ctx *ctx = m->ctx;
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "sg_generator_create: out is NULL");
    *out = NULL;
    sg_generator_options o = opts ? *opts : sg_generator_options_default();
    if (m->spec.seq < 1)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_generator_create: model '%s' is not a sequence model", m->name);
    if (o.max_batch < 1 || o.max_batch > 4096)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_generator_create: max_batch %d: expected 1 to 4096", o.max_batch);
    if (o.max_len < 0 || o.max_len > m->spec.seq || o.max_len == 1 || o.max_len > SG_KV_MAX_T)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_generator_create: max_len %lld: expected 0 (the model's %lld) or "
                       "2 to %lld (a learnt position embedding holds no more)", (long long)o.max_len,
                       (long long)m->spec.seq, (long long)(m->spec.seq < SG_KV_MAX_T ? m->spec.seq : SG_KV_MAX_T));
    if (o.heads < 0)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_generator_create: heads %d: expected 0 (width / 64) or more",
                       o.heads);
    sg_generator *g = calloc(1, sizeof *g);
    if (!g) return sg_fail(ctx, SG_ERR_OOM, "sg_generator_create: out of host memory");
    g->ctx = ctx, g->m = m, g->dt = m->precision;
    g->T = o.max_len ? o.max_len : m->spec.seq, g->B = o.max_batch;
    sg_status st = check_buckets(g, &o);
    if (st == SG_OK) st = find_params(g, o.heads);
    if (st == SG_OK && g->T > SG_KV_MAX_T)
        st = sg_fail(ctx, SG_ERR_INVALID, "sg_generator_create: max_len %lld: at most %d", (long long)g->T,
                     SG_KV_MAX_T);
    if (st == SG_OK && g->C / g->H > SG_KV_MAX_HS)
        st = sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_generator_create: head size %lld: at most %d", (long long)(g->C / g->H),
                     SG_KV_MAX_HS);
    if (st != SG_OK) {
        sg_generator_destroy(g);
        return st;
    }
    const int64_t R = g->B * g->T, C = g->C, Bn = g->B, hs = C / g->H;
    const sg_dtype dt = g->dt, f32 = SG_DTYPE_F32, i32 = SG_DTYPE_I32;
    g->kc = calloc((size_t)g->L, sizeof *g->kc), g->vc = calloc((size_t)g->L, sizeof *g->vc);
    if (!g->kc || !g->vc) st = sg_fail(ctx, SG_ERR_OOM, "sg_generator_create: out of host memory");
    const int64_t cshape[4] = {Bn, g->H, g->T, hs};
    for (int64_t l = 0; st == SG_OK && l < g->L; l++) {
        st = sg_tensor_create(ctx, dt, 4, cshape, "gen.kcache", &g->kc[l]);
        if (st == SG_OK) st = sg_tensor_create(ctx, dt, 4, cshape, "gen.vcache", &g->vc[l]);
    }
    g->x = buf(g, &st, dt, "gen.x", 2, R, C), g->h = buf(g, &st, dt, "gen.h", 2, R, C);
    g->qkv = buf(g, &st, dt, "gen.qkv", 2, R, 3 * C), g->a = buf(g, &st, dt, "gen.attn", 2, R, C);
    g->p = buf(g, &st, dt, "gen.proj", 2, R, C), g->f = buf(g, &st, dt, "gen.fc", 2, R, 4 * C);
    g->pre = buf(g, &st, dt, "gen.fc.pre", 2, R, 4 * C), g->mean = buf(g, &st, f32, "gen.mean", 1, R, 0);
    g->rstd = buf(g, &st, f32, "gen.rstd", 1, R, 0), g->ptok = buf(g, &st, i32, "gen.prompts", 1, R, 0);
    g->xl = buf(g, &st, dt, "gen.last", 2, Bn, C), g->hl = buf(g, &st, dt, "gen.ln_f", 2, Bn, C);
    g->meanl = buf(g, &st, f32, "gen.ln_f.mean", 1, Bn, 0), g->rstdl = buf(g, &st, f32, "gen.ln_f.rstd", 1, Bn, 0);
    g->logits = buf(g, &st, dt, "gen.logits", 2, Bn, g->V);
    g->tok = buf(g, &st, i32, "gen.tok", 1, Bn, 0), g->pos = buf(g, &st, i32, "gen.pos", 1, Bn, 0);
    g->zeros = buf(g, &st, i32, "gen.zeros", 1, Bn, 0), g->info = buf(g, &st, i32, "gen.info", 2, Bn, SG_GEN_INFO);
    g->out = buf(g, &st, i32, "gen.out", 2, Bn, g->T), g->ctl = buf(g, &st, i32, "gen.ctl", 1, SG_GEN_CTL, 0);
    g->temp = buf(g, &st, f32, "gen.temperature", 1, 1, 0);
    if (st == SG_OK) st = sg_tensor_view(g->ctl, SG_GEN_GO, 1, (int64_t[]){1}, "gen.go", &g->go);
    if (st == SG_OK) st = sg_tensor_fill(g->zeros, 0);
    if (st == SG_OK) st = sg_graph_cache_create(ctx, 0, 0, &g->cache);
    if (st != SG_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", sg_ctx_last_error(ctx));
        sg_generator_destroy(g);
        return sg_fail(ctx, st, "sg_generator_create: %s", msg);
    }
    *out = g;
    return SG_OK;
}

/* ---- the passes ---- */

/* One row (a batch-1 decode step's, or a one-token prompt's) takes the fused path: each linear
 * layer one kernel with the LayerNorm before it or the residual after it (4 launches and the
 * attention per block instead of 9); the unfused ops otherwise. Eager, step and loop run the same
 * path for a bucket, so they stay bit-identical. */
static bool fused_rows(const sg_generator *g, const sg_tensor *x)
{
    return x->shape[0] == 1 && g->C * (int64_t)sg_dtype_size(x->dtype) <= GEN_FUSED_MAX_BYTES;
}

/* One GPT block over v's rows, attending through layer l's cache from positions `start`. */
static sg_status block(sg_generator *g, int64_t l, gen_views *v, const sg_tensor *start)
{
    sg_ctx *ctx = g->ctx;
    sg_tensor **w = g->blk[l];
    if (fused_rows(g, v->x)) {
        SG_TRY(sg_gen_row_linear(ctx, v->x, w[BLK_LN1W], w[BLK_LN1B], GEN_LN_EPS, w[BLK_QKVW], w[BLK_QKVB],
                                 SG_ACT_NONE, NULL, v->qkv));
        SG_TRY(sg_kv_attention(ctx, v->qkv, (int)g->H, start, g->kc[l], g->vc[l], v->a));
        SG_TRY(sg_gen_row_linear(ctx, v->a, NULL, NULL, 0.f, w[BLK_PROJW], w[BLK_PROJB], SG_ACT_NONE, v->x, v->x));
        SG_TRY(sg_gen_row_linear(ctx, v->x, w[BLK_LN2W], w[BLK_LN2B], GEN_LN_EPS, w[BLK_FCW], w[BLK_FCB],
                                 SG_ACT_GELU, NULL, v->f));
        return sg_gen_row_linear(ctx, v->f, NULL, NULL, 0.f, w[BLK_MPW], w[BLK_MPB], SG_ACT_NONE, v->x, v->x);
    }
    SG_TRY(sg_layernorm_forward(ctx, v->x, w[BLK_LN1W], w[BLK_LN1B], GEN_LN_EPS, v->h, v->mean, v->rstd));
    SG_TRY(sg_linear_forward(ctx, v->h, w[BLK_QKVW], w[BLK_QKVB], SG_ACT_NONE, v->qkv, NULL));
    SG_TRY(sg_kv_attention(ctx, v->qkv, (int)g->H, start, g->kc[l], g->vc[l], v->a));
    SG_TRY(sg_linear_forward(ctx, v->a, w[BLK_PROJW], w[BLK_PROJB], SG_ACT_NONE, v->p, NULL));
    SG_TRY(sg_add_forward(ctx, v->x, v->p, v->x));
    SG_TRY(sg_layernorm_forward(ctx, v->x, w[BLK_LN2W], w[BLK_LN2B], GEN_LN_EPS, v->h, v->mean, v->rstd));
    SG_TRY(sg_linear_forward(ctx, v->h, w[BLK_FCW], w[BLK_FCB], SG_ACT_GELU, v->f, v->pre));
    SG_TRY(sg_linear_forward(ctx, v->f, w[BLK_MPW], w[BLK_MPB], SG_ACT_NONE, v->p, NULL));
    return sg_add_forward(ctx, v->x, v->p, v->x);
}

/* ln_f, the head and the sampler over the rows x (nb, C) of v. */
static sg_status head_sample(sg_generator *g, gen_views *v, const sg_tensor *x)
{
    sg_ctx *ctx = g->ctx;
    if (fused_rows(g, x)) {
        SG_TRY(sg_gen_row_linear(ctx, x, g->lnf_w, g->lnf_b, GEN_LN_EPS, g->head_w, NULL, SG_ACT_NONE, NULL,
                                 v->logits));
    } else {
        SG_TRY(sg_layernorm_forward(ctx, x, g->lnf_w, g->lnf_b, GEN_LN_EPS, v->hl, v->meanl, v->rstdl));
        SG_TRY(sg_linear_forward(ctx, v->hl, g->head_w, NULL, SG_ACT_NONE, v->logits, NULL));
    }
    return sg_gen_sample(ctx, v->logits, v->tok, v->pos, v->info, v->out, g->ctl, g->temp);
}

/* The prefill over g->pv: the state reset, the prompts through every block (writing the
 * caches), each prompt's last row through the head, the first new tokens drawn. */
static sg_status prefill_fn(void *user)
{
    sg_generator *g = user;
    gen_views *v = g->pv;
    SG_TRY(sg_gen_begin(g->ctx, v->tok, v->pos, v->info, g->ctl));
    SG_TRY(sg_embedding_forward(g->ctx, v->ptok, g->wte, g->wpe, v->x));
    for (int64_t l = 0; l < g->L; l++) SG_TRY(block(g, l, v, v->zeros));
    SG_TRY(sg_gen_last_rows(g->ctx, v->x, v->info, v->xl));
    return head_sample(g, v, v->xl);
}

/* One decode step over g->dv (Tq = 1): every sequence's last token at its position. */
static sg_status decode_fn(void *user)
{
    sg_generator *g = user;
    gen_views *v = g->dv;
    SG_TRY(sg_embed_at(g->ctx, v->tok, v->pos, g->wte, g->wpe, v->x));
    for (int64_t l = 0; l < g->L; l++) SG_TRY(block(g, l, v, v->pos));
    return head_sample(g, v, v->x);
}

/* The whole generation: the prefill, then decode steps while some sequence runs. */
static sg_status loop_fn(void *user)
{
    sg_generator *g = user;
    SG_TRY(prefill_fn(g));
    return sg_graph_while(g->ctx, g->go, decode_fn, g);
}

/* ---- a call ---- */

static sg_status check_request(sg_generator *g, const sg_generate_request *r, const int32_t *tokens,
                               const int64_t *lens)
{
    sg_ctx *ctx = g->ctx;
    const char *fn = "sg_generate";
    if (!r || !tokens || !lens) return sg_fail(ctx, SG_ERR_NULL, "%s: r, tokens or lens is NULL", fn);
    if (r->n < 1 || r->n > g->B)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: n %d sequences: expected 1 to max_batch %lld", fn, r->n,
                       (long long)g->B);
    if (!r->prompts || !r->prompt_lens) return sg_fail(ctx, SG_ERR_NULL, "%s: prompts or prompt_lens is NULL", fn);
    if (r->max_new < 1 || r->max_new >= g->T)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: max_new %lld: expected 1 to %lld (max_len %lld less a prompt "
                       "token)", fn, (long long)r->max_new, (long long)(g->T - 1), (long long)g->T);
    for (int i = 0; i < r->n; i++) {
        int64_t n = r->prompt_lens[i], mn = r->max_new_each ? r->max_new_each[i] : r->max_new;
        if (n < 1 || !r->prompts[i])
            return sg_fail(ctx, SG_ERR_INVALID, "%s: prompt %d has %lld tokens%s: expected at least 1", fn, i,
                           (long long)n, r->prompts[i] ? "" : " (NULL)");
        if (mn < 1 || mn > r->max_new)
            return sg_fail(ctx, SG_ERR_INVALID, "%s: max_new_each[%d] %lld: expected 1 to max_new %lld", fn, i,
                           (long long)mn, (long long)r->max_new);
        if (n + mn > g->T)
            return sg_fail(ctx, SG_ERR_INVALID, "%s: prompt %d: %lld tokens and %lld new exceed max_len %lld (the "
                           "cache, at most the model's positions); shorten the prompt or ask for fewer tokens", fn, i,
                           (long long)n, (long long)mn, (long long)g->T);
        for (int64_t k = 0; k < n; k++)
            if (r->prompts[i][k] < 0 || r->prompts[i][k] >= g->V)
                return sg_fail(ctx, SG_ERR_INVALID, "%s: prompt %d token %lld is %d: expected 0 to %lld (the "
                               "vocabulary)", fn, i, (long long)k, (int)r->prompts[i][k], (long long)(g->V - 1));
    }
    if (!(r->temperature >= 0.f) || !isfinite(r->temperature))
        return sg_fail(ctx, SG_ERR_INVALID, "%s: temperature %g: expected a finite value >= 0 (0: greedy)", fn,
                       r->temperature);
    if (r->top_k < 0) return sg_fail(ctx, SG_ERR_INVALID, "%s: top_k %d: expected >= 0 (0: every token)", fn, r->top_k);
    if (r->n_stop < 0 || r->n_stop > SG_GEN_MAX_STOP_TOKENS || (r->n_stop && !r->stop))
        return sg_fail(ctx, SG_ERR_INVALID, "%s: a stop sequence of %d tokens%s: expected 0 to %d", fn, r->n_stop,
                       r->n_stop && !r->stop ? " at NULL" : "", SG_GEN_MAX_STOP_TOKENS);
    for (int k = 0; k < r->n_stop; k++)
        if (r->stop[k] < 0 || r->stop[k] >= g->V)
            return sg_fail(ctx, SG_ERR_INVALID, "%s: stop token %d is %d: expected 0 to %lld", fn, k, (int)r->stop[k],
                           (long long)(g->V - 1));
    if (r->mode < SG_GEN_EAGER || r->mode > SG_GEN_LOOP)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: mode %d: expected SG_GEN_EAGER, _STEP or _LOOP", fn, (int)r->mode);
    if (r->mode == SG_GEN_LOOP && !(sg_graph_conditionals(ctx) & (1 << SG_COND_WHILE)) && !sg_graphs_disabled())
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: mode loop needs a WHILE conditional node, which capture on this "
                       "context cannot make (CUDA 12.4 driver and runtime, and STEPGRAPH_DISABLE_CONDITIONALS unset); "
                       "use mode step", fn);
    return SG_OK;
}

/* The host's inputs into the device tensors: prompts padded to Tp, the per-sequence limits
 * (padding sequences of the bucket: one token, nothing to generate), the sampler's controls. */
static sg_status upload(sg_generator *g, const sg_generate_request *r, int64_t nb, int64_t Tp)
{
    int32_t *pt = calloc((size_t)(nb * Tp), sizeof *pt), *info = calloc((size_t)nb * SG_GEN_INFO, sizeof *info);
    sg_status st = pt && info ? SG_OK : sg_fail(g->ctx, SG_ERR_OOM, "sg_generate: out of host memory");
    for (int64_t b = 0; st == SG_OK && b < nb; b++) {
        int32_t *row = info + b * SG_GEN_INFO;
        if (b < r->n) {
            memcpy(pt + b * Tp, r->prompts[b], (size_t)r->prompt_lens[b] * sizeof *pt);
            row[SG_GEN_PLEN] = (int32_t)r->prompt_lens[b];
            row[SG_GEN_MAXNEW] = (int32_t)(r->max_new_each ? r->max_new_each[b] : r->max_new);
        } else {
            row[SG_GEN_PLEN] = 1, row[SG_GEN_MAXNEW] = 0;
        }
    }
    int32_t ctl[SG_GEN_CTL] = {0};
    ctl[SG_GEN_TOPK] = r->top_k, ctl[SG_GEN_NSTOP] = r->n_stop;
    ctl[SG_GEN_SEED_LO] = (int32_t)(uint32_t)r->seed, ctl[SG_GEN_SEED_HI] = (int32_t)(uint32_t)(r->seed >> 32);
    for (int k = 0; k < r->n_stop; k++) ctl[SG_GEN_STOP + k] = r->stop[k];
    float temp = r->temperature;
    gen_views *pv = g->pv;
    if (st == SG_OK) st = sg_tensor_copy_from_host(pv->ptok, pt, (size_t)(nb * Tp) * sizeof *pt);
    if (st == SG_OK) st = sg_tensor_copy_from_host(pv->info, info, (size_t)nb * SG_GEN_INFO * sizeof *info);
    if (st == SG_OK) st = sg_tensor_copy_from_host(g->ctl, ctl, sizeof ctl);
    if (st == SG_OK) st = sg_tensor_copy_from_host(g->temp, &temp, sizeof temp);
    free(pt), free(info);
    return st;
}

/* The graph of (kind, views) from the cache, captured with one warm-up run when it is new: then
 * *ran is set (the warm-up did this call's work). The cache has no budget, so a graph once
 * captured stays: v->captured says so without asking the cache for its statistics a token. */
static sg_status cached(sg_generator *g, int kind, sg_step_fn fn, gen_views *v, sg_graph **out, bool *ran,
                        sg_generate_stats *s)
{
    sg_graph_options o = sg_graph_options_default();
    static const char *const names[] = {"gen.prefill", "gen.decode", "gen.loop"};
    o.name = names[kind];
    o.warmup = 1;
    int64_t key = ((int64_t)kind << 40) | (v->nb << 20) | v->Tq;
    double t0 = sg_clock_us();
    SG_TRY(sg_graph_cache_get(g->cache, key, fn, g, &o, out));
    *ran = !v->captured[kind];
    v->captured[kind] = true;
    if (*ran) s->captured++, s->capture_ms += (sg_clock_us() - t0) / 1e3;
    sg_graph_stats gs;
    if (!g->counted[kind] && sg_graph_get_stats(*out, &gs) == SG_OK) s->nodes += gs.nodes;
    g->counted[kind] = true;
    return SG_OK;
}

/* Runs one of fn eagerly, or its graph (kind) replayed; host time into *host. */
static sg_status run_part(sg_generator *g, bool graphs, int kind, sg_step_fn fn, gen_views *v,
                          sg_generate_stats *s, double *host)
{
    double t0 = sg_clock_us();
    sg_status st;
    if (!graphs) {
        st = fn(g);
    } else {
        sg_graph *gr = NULL;
        bool ran = false;
        st = cached(g, kind, fn, v, &gr, &ran, s);
        if (st == SG_OK && !ran) st = sg_graph_replay(gr);
    }
    *host += sg_clock_us() - t0;
    return st;
}

/* A checked request's buckets (batch *nb, prompt *Tp: the longest prompt's power of two, at
 * most max_len), their views made current and its inputs uploaded. */
static sg_status prepare(sg_generator *g, const sg_generate_request *r, int64_t *nb, int64_t *Tp)
{
    int64_t maxp = 0;
    for (int i = 0; i < r->n; i++) maxp = r->prompt_lens[i] > maxp ? r->prompt_lens[i] : maxp;
    *nb = sg_bucket_for(g->buckets, g->n_buckets, r->n), *Tp = 1;
    while (*Tp < maxp) *Tp *= 2;
    if (*Tp > g->T) *Tp = g->T;
    SG_TRY(get_views(g, *nb, *Tp, &g->pv));
    SG_TRY(get_views(g, *nb, 1, &g->dv));
    return upload(g, r, *nb, *Tp);
}

const sg_tensor *sg_generator_logits(const sg_generator *g) { return g ? g->logits : NULL; }

sg_ctx *sg_generator_ctx(const sg_generator *g) { return g ? g->ctx : NULL; }

static sg_status read_go(sg_generator *g, int32_t *go) { return sg_tensor_copy_to_host(g->go, go, sizeof *go); }

sg_status sg_generate(sg_generator *g, const sg_generate_request *r, int32_t *tokens, int64_t *lens,
                      sg_gen_finish *finish, sg_generate_stats *stats)
{
    if (!g) return SG_ERR_NULL;
    double t_start = sg_clock_us();
    SG_TRY(check_request(g, r, tokens, lens));
    sg_generate_stats s = {0};
    SG_TRY(prepare(g, r, &s.batch_bucket, &s.prompt_bucket));
    const int64_t nb = s.batch_bucket;
    double host = 0;
    sg_status st = SG_OK;
    memset(g->counted, 0, sizeof g->counted);
    if (r->mode == SG_GEN_LOOP) {
        st = run_part(g, true, 2, loop_fn, g->pv, &s, &host);
    } else {
        bool graphs = r->mode == SG_GEN_STEP;
        st = run_part(g, graphs, 0, prefill_fn, g->pv, &s, &host);
        int32_t go = 1;
        if (st == SG_OK) st = read_go(g, &go);
        while (st == SG_OK && go) {
            st = run_part(g, graphs, 1, decode_fn, g->dv, &s, &host);
            if (st == SG_OK) st = read_go(g, &go);
            s.steps++;
        }
    }
    /* The results: the new tokens and each sequence's count and reason. */
    int32_t *out = malloc((size_t)(nb * g->T) * sizeof *out), *info = malloc((size_t)nb * SG_GEN_INFO * sizeof *info);
    if (st == SG_OK && (!out || !info)) st = sg_fail(g->ctx, SG_ERR_OOM, "sg_generate: out of host memory");
    if (st == SG_OK) st = sg_tensor_copy_to_host(g->dv->out, out, (size_t)(nb * g->T) * sizeof *out);
    if (st == SG_OK) st = sg_tensor_copy_to_host(g->dv->info, info, (size_t)nb * SG_GEN_INFO * sizeof *info);
    int64_t longest = 0;
    for (int i = 0; st == SG_OK && i < r->n; i++) {
        const int32_t *row = info + i * SG_GEN_INFO;
        int64_t n = row[SG_GEN_LEN];
        if (n < 1 || n > r->max_new || row[SG_GEN_DONE] == SG_GEN_RUNNING) {
            st = sg_fail(g->ctx, SG_ERR_INVALID, "sg_generate: sequence %d ended with %lld new tokens and state %d; "
                         "expected 1 to %lld and finished (a bug)", i, (long long)n, (int)row[SG_GEN_DONE],
                         (long long)r->max_new);
            break;
        }
        for (int64_t k = 0; k < r->max_new; k++) tokens[i * r->max_new + k] = k < n ? out[i * g->T + k] : -1;
        lens[i] = n;
        if (finish) finish[i] = (sg_gen_finish)row[SG_GEN_DONE];
        s.tokens += n;
        longest = n > longest ? n : longest;
    }
    if (r->mode == SG_GEN_LOOP) s.steps = longest - 1; /* the WHILE ran until the longest finished */
    free(out), free(info);
    sg_graph_cache_stats cs;
    if (sg_graph_cache_get_stats(g->cache, &cs) == SG_OK) s.graphs = cs.cached;
    s.host_us = host;
    s.wall_ms = (sg_clock_us() - t_start) / 1e3;
    if (stats) *stats = s;
    return st;
}

/* ---- for the advisor ---- */

sg_status sg_generator_part(sg_generator *g, const sg_generate_request *r, sg_gen_part part, int *nodes)
{
    if (!g) return SG_ERR_NULL;
    if (part == SG_GEN_PART_PREFILL) {
        int32_t tok;
        int64_t len, nb, Tp;
        SG_TRY(check_request(g, r, &tok, &len));
        SG_TRY(prepare(g, r, &nb, &Tp));
        return prefill_fn(g);
    }
    if (!g->dv) return sg_fail(g->ctx, SG_ERR_INVALID, "sg_generator_part: a decode step before any prefill");
    if (part == SG_GEN_PART_EAGER) return decode_fn(g);
    sg_generate_stats s = {0};
    sg_graph *gr = NULL;
    bool ran = false;
    SG_TRY(cached(g, 1, decode_fn, g->dv, &gr, &ran, &s));
    sg_graph_stats gs;
    if (nodes) {
        SG_TRY(sg_graph_get_stats(gr, &gs));
        *nodes = gs.nodes;
    }
    return ran ? SG_OK : sg_graph_replay(gr);
}
