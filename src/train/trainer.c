/* trainer.c: training steps under a capture scope, one code path with the scope as a run-time
 * switch. eager: everything launched from the host. layer: chosen modules of the model's
 * Sequential are wrapped so that their forward and backward replay two graphs (graphed
 * callables), the rest eager. model: the whole net's forward and backward as two graphs, loss
 * and optimizer eager. step: forward, loss, backward and optimizer as one graph; only the batch
 * copy-in stays outside. The first `warmup` steps run eagerly (lazy set-up happens there), the
 * next step captures, later steps replay. Variable shapes (batch rows of an mlp, sequence
 * lengths of a gpt) run padded up to a bucket, with a step graph per bucket under step scope.
 * Gradient accumulation: an optimizer step of `accum` micro-batches (forward, loss, backward
 * each, their gradients summed in f32), then one update; under step scope the graph holds them
 * all, unrolled or (loop) as a WHILE node. Control flow on the device (conditional nodes): the
 * overflow skip as a node around the update (skip_if), every sequence bucket as a branch of a
 * SWITCH node chosen by the device's gather (vary_seq), a multi-step call as a WHILE node that
 * stops early on a device rule. (train/ sits above graph/ and dist/: it captures and replays
 * through them.) */
#include "train/model.h"
#include "dist/dist.h"
#include "nn/text.h"
#include "nn/checkpoint.h"
#include "ops/accum.h"
#include "ops/stop.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct graphed_module graphed_module;

struct sg_trainer {
    sg_ctx *ctx;
    sg_model *m;
    sg_optim *o;
    sg_trainer_options opts;
    char modules[256];           /* opts.graph_modules, copied */
    int64_t steps;               /* steps run */
    bool armed;                  /* warm-up done: capture or replay */
    bool fallback;               /* a capture failed and on_capture_fail is eager */
    char reason[512];
    sg_work work;                /* one optimizer step's (sg_trainer_stats.work) */
    bool work_counted;
    sg_graph *g_step, *g_fwd, *g_bwd;
    sg_pool *pool;               /* shared by the trainer's graphs (they never run at once) */
    graphed_module **wrapped;    /* layer scope: the modules wrapped (one a child at most) */
    int n_wrapped;
    int64_t buckets[32];         /* batch sizes (mlp) or sequence lengths (gpt), increasing */
    int n_buckets;
    bool seq_buckets;            /* the buckets are sequence lengths (sg_trainer_step_seq) */
    bool bucket_warm[32];        /* the bucket ran one eager step: its lazy set-up is done */
    sg_graph_cache *cache;       /* buckets under step scope: a graph per bucket */
    int64_t next_index;          /* step scope: the batch index the graph's counter holds */
    sg_dist *dist;               /* data parallelism: gradients averaged over its ranks */
    /* A sharded optimizer (opts.shard_optimizer): this rank's share of every bucket
     * (sg_dist_shard_layout), compact, in the order the backward sends the buckets, the tail
     * (updated by every rank) last. sps: the optimizer's parameters: flat (F32 masters),
     * grad_flat (F32 gradients; not allocated where nothing reads them: mixed precision whose
     * update unscales as it reads; with accum > 1 what the reduce-scatters write: the step's
     * f32 sums), the segment tables; under mixed precision sh_param_lo (BF16, the update's
     * copy, gathered into the model's) and, without accumulation, sh_grad_lo (BF16, what the
     * backward's collectives write). */
    bool shard, optim_moved;     /* optim_moved: the optimizer updates sps (sg_optim_use_params) */
    bool ahead;                  /* sharded, with copy-engine windows (win below) or
                                  * STEPGRAPH_SHARD_GATHER=ahead: each step gathers the last
                                  * update's shares ahead of its forward (gather_forward) instead
                                  * of after the update */
    bool stale;                  /* ahead: steps updated shares the model has not gathered */
    bool masters_stale;          /* the same for its f32 masters under mixed precision */
    sg_param_set sps;
    sg_tensor *sh_grad_lo, *sh_param_lo;
    /* Sharded with clipping: the compact gradients this rank counts in the norm (all but the
     * tail on ranks other than 0: every rank holds the tail), and every rank's f64 sum of
     * squares of them (clip_sums), gathered (I32 2 x world). */
    sg_tensor *sh_norm_part, *sh_sums;
    /* Experimental (STEPGRAPH_NCCL_CE=1 with NCCL, mixed precision): the model's bf16 weights and
     * the shares' bf16 copies moved into NCCL windows (their views with them) for the sharded
     * run's life, so its gathers run on the copy engines; moved back before the trainer goes. */
    struct shwin {
        sg_tensor *base, **views;
        int n_views;
        void *old, *ptr, *win;
    } win[2];
    int n_win;
    /* gradient accumulation (opts.accum > 1) */
    float grad_scale;            /* 1 / accum: each micro-batch's share of the mean loss */
    sg_tensor *grad_sum;         /* (P) F32, fp32 models: the micro-batches' gradients so far */
    sg_tensor *loss_sum;         /* (1) F32: their losses / accum so far */
    /* control flow on the device: what the step graph is built with (the options, where the
     * context's capture makes conditional nodes) */
    bool use_loop, use_skip_if, use_switch;
    bool fold_unscale;           /* sg_optim_check + sg_optim_update_amp (sg_trainer_create) */
    sg_tensor *clip_factor;      /* (1) F32, with clipping of f32 gradients: sg_clip_factor's,
                                  * which the optimizer multiplies the gradients by as it reads
                                  * them (NULL with STEPGRAPH_CLIP=separate: sg_clip_grad_norm
                                  * scales them, and with fold_unscale: the optimizer's slot) */
    sg_tensor *clip_sums;        /* (2) I32, with clipping: the f64 sum of squares as raw bytes
                                  * (sg_clip_sumsq, sg_clip_sumsq_amp) where it is measured apart
                                  * from the factor: sharded (this rank's), or with fold_unscale */
    bool in_step_graph;          /* the step graph is being captured (the forms apply) */
    char cond_note[512];
    sg_tensor *micro_left;       /* (1) I32: loop turns left, micro-batches */
    sg_tensor *steps_left;       /* (1) I32: loop turns left, steps (no stop rule) */
    sg_tensor *stop;             /* (SG_STOP_STATE) I32: the early-stop state (NULL: no rule) */
    sg_tensor *stop_go;          /* its element 0: the steps loop's condition */
    sg_stop_rule rule;
    sg_tensor *bucket;           /* (1) I32: the bucket the device drew (vary_seq, vary_batch) */
    sg_tensor *vary_step;        /* (1) I32: vary_batch's step number on the device (the batch index
                                  * wraps around the data set) */
    struct bucket_branch { sg_trainer *t; int k; } branch[32];
    int64_t host_steps;          /* steps run, counted on the host (no stop rule) */
    int last_call_steps;
};

sg_trainer_options sg_trainer_options_default(void)
{
    sg_trainer_options o;
    memset(&o, 0, sizeof o);
    o.scope = SG_SCOPE_EAGER;
    o.warmup = 3;
    o.steps_per_call = 1;
    o.accum = 1;
    return o;
}

const char *sg_scope_name(sg_scope s)
{
    switch (s) {
    case SG_SCOPE_EAGER: return "eager";
    case SG_SCOPE_LAYER: return "layer";
    case SG_SCOPE_MODEL: return "model";
    case SG_SCOPE_STEP: return "step";
    }
    return "?";
}

sg_status sg_scope_parse(const char *s, sg_scope *out)
{
    for (int i = SG_SCOPE_EAGER; i <= SG_SCOPE_STEP; i++)
        if (s && !strcmp(s, sg_scope_name((sg_scope)i))) {
            *out = (sg_scope)i;
            return SG_OK;
        }
    return SG_ERR_INVALID;
}

/* A capture failed: with on_capture_fail = eager, note why and carry on eagerly (the whole
 * step, or with `whole` false only the module that failed); else fail the step. */
static sg_status capture_failed(sg_trainer *t, sg_status st, const char *region, bool whole)
{
    if (t->opts.on_capture_fail != SG_CAPTURE_FAIL_EAGER) return st;
    if (!t->reason[0])
        snprintf(t->reason, sizeof t->reason, "%s runs eagerly: %s", region, sg_ctx_last_error(t->ctx));
    if (whole) t->fallback = true;
    return SG_OK;
}

static sg_status capture(sg_trainer *t, const char *name, sg_step_fn fn, void *user,
                         const sg_tensor *const *inputs, int n_inputs, sg_graph **out)
{
    sg_graph_options o = sg_graph_options_default();
    o.name = name;
    o.warmup = 0; /* the trainer's eager warm-up steps did it */
    o.pool = t->pool;
    o.static_inputs = inputs;
    o.n_static_inputs = n_inputs;
    if (t->dist) sg_dist_capture_begin(t->dist);
    sg_status st = sg_graph_capture(t->ctx, fn, user, &o, out);
    /* Data parallelism: no rank replays a graph unless every rank captured one, with the same
     * collectives (a replay that waits for a collective a peer never launches hangs). */
    if (t->dist) st = sg_dist_capture_check(t->dist, name, st);
    if (st != SG_OK) {
        sg_graph_destroy(*out);
        *out = NULL;
        return st;
    }
    if (!t->pool) t->pool = sg_graph_pool(*out);
    return SG_OK;
}

/* ---- layer scope: a module whose forward and backward replay graphs ---- */

struct graphed_module {
    sg_module base;
    sg_module *inner;
    sg_trainer *t;
    sg_graph *fwd, *bwd;
    const sg_tensor *x;          /* the forward's static input */
    const sg_tensor *y;
    sg_tensor *dy, *dx;
    bool failed;                 /* capture failed: this module runs eagerly */
};

static sg_status inner_forward(void *u)
{
    graphed_module *g = u;
    return sg_module_forward(g->inner, g->x, &g->y);
}

static sg_status inner_backward(void *u)
{
    graphed_module *g = u;
    return sg_module_backward(g->inner, g->dy, &g->dx);
}

static sg_status graphed_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    graphed_module *g = (graphed_module *)m;
    if (!g->t->armed || g->failed) return sg_module_forward(g->inner, x, y);
    if (!g->fwd) {
        g->x = x;
        char n[SG_MODULE_NAME_MAX + 16];
        snprintf(n, sizeof n, "%s.forward", sg_module_label(g->inner));
        sg_status st = capture(g->t, n, inner_forward, g, &g->x, 1, &g->fwd);
        if (st != SG_OK) {
            SG_TRY(capture_failed(g->t, st, n, false));
            g->failed = true;
            return sg_module_forward(g->inner, x, y);
        }
    } else if (x != g->x) {
        return sg_fail(m->ctx, SG_ERR_INVALID,
                       "graphed module '%s': forward input '%s' is not the tensor it was captured "
                       "with ('%s')", sg_module_label(g->inner), x->name, g->x->name);
    }
    SG_TRY(sg_graph_replay(g->fwd));
    *y = g->y;
    return SG_OK;
}

static sg_status graphed_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    graphed_module *g = (graphed_module *)m;
    if (!g->t->armed || g->failed || !g->fwd) return sg_module_backward(g->inner, dy, dx);
    if (!g->bwd) {
        g->dy = dy;
        char n[SG_MODULE_NAME_MAX + 16];
        snprintf(n, sizeof n, "%s.backward", sg_module_label(g->inner));
        const sg_tensor *in = dy;
        sg_status st = capture(g->t, n, inner_backward, g, &in, 1, &g->bwd);
        if (st != SG_OK) {
            SG_TRY(capture_failed(g->t, st, n, false));
            g->failed = true;
            return sg_module_backward(g->inner, dy, dx);
        }
    } else if (dy != g->dy) {
        return sg_fail(m->ctx, SG_ERR_INVALID,
                       "graphed module '%s': backward input '%s' is not the tensor it was captured "
                       "with ('%s')", sg_module_label(g->inner), dy->name, g->dy->name);
    }
    SG_TRY(sg_graph_replay(g->bwd));
    *dx = g->dx;
    return SG_OK;
}

static void graphed_destroy(sg_module *m)
{
    graphed_module *g = (graphed_module *)m;
    sg_graph_destroy(g->fwd);
    sg_graph_destroy(g->bwd);
    sg_module_free(g->inner);
    free(g);
}

static sg_status graphed_set_rows(sg_module *m, int64_t rows)
{
    return sg_module_set_rows(((graphed_module *)m)->inner, rows);
}

static const sg_module_i graphed_i = {"graphed", graphed_forward, graphed_backward, graphed_destroy,
                                      graphed_set_rows, NULL};

/* The child of seq that token names (a module name or an index), or -1. */
static int module_index(sg_module *seq, const char *tok)
{
    int n = sg_sequential_count(seq);
    char *end;
    long v = strtol(tok, &end, 10);
    if (end != tok && *end == '\0') return v >= 0 && v < n ? (int)v : -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(sg_module_label(sg_sequential_child(seq, i)), tok)) return i;
    return -1;
}

/* The modules a --graph-modules list chooses, into chosen[] (n children). The list is taken
 * strictly: every item names one module, none twice (by name or by index), and an empty item
 * is an error, so a typo is refused instead of ignored. "" and "all" choose every module. */
static sg_status choose_modules(sg_trainer *t, const char *list, bool *chosen, int n)
{
    sg_module *seq = t->m->net;
    bool all = !*list || !strcmp(list, "all");
    for (int i = 0; i < n; i++) chosen[i] = all;
    if (all) return SG_OK;
    char buf[sizeof t->modules];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *p = buf, *tok; (tok = p) != NULL;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        p = comma ? comma + 1 : NULL;
        int i = module_index(seq, tok);
        if (!*tok)
            return sg_fail(t->ctx, SG_ERR_INVALID, "sg_trainer_create: --graph-modules '%s' has an empty item",
                           list);
        if (i < 0)
            return sg_fail(t->ctx, SG_ERR_INVALID,
                           "sg_trainer_create: --graph-modules '%s': '%s' names no module of '%s' (modules are "
                           "%s..%s, or their indices 0..%d)", list, tok, t->m->name,
                           n ? sg_module_label(sg_sequential_child(seq, 0)) : "?",
                           n ? sg_module_label(sg_sequential_child(seq, n - 1)) : "?", n - 1);
        if (chosen[i])
            return sg_fail(t->ctx, SG_ERR_INVALID, "sg_trainer_create: --graph-modules '%s' names module %d (%s) "
                           "twice", list, i, sg_module_label(sg_sequential_child(seq, i)));
        chosen[i] = true;
    }
    return SG_OK;
}

static sg_status wrap_modules(sg_trainer *t)
{
    sg_module *seq = t->m->net;
    int n = sg_sequential_count(seq);
    bool *chosen = calloc((size_t)(n > 0 ? n : 1), sizeof *chosen);
    t->wrapped = calloc((size_t)(n > 0 ? n : 1), sizeof *t->wrapped);
    if (!chosen || !t->wrapped) {
        free(chosen);
        return sg_fail(t->ctx, SG_ERR_OOM, "sg_trainer_create: out of host memory");
    }
    sg_status st = choose_modules(t, t->modules, chosen, n);
    for (int i = 0; i < n && st == SG_OK; i++) {
        if (!chosen[i]) continue;
        graphed_module *g = calloc(1, sizeof *g);
        if (!g) {
            st = sg_fail(t->ctx, SG_ERR_OOM, "sg_trainer_create: out of host memory");
            break;
        }
        sg_module *c = sg_sequential_child(seq, i);
        g->base.vt = &graphed_i;
        g->base.ctx = t->ctx;
        snprintf(g->base.name, sizeof g->base.name, "%s", sg_module_label(c));
        g->inner = c;
        g->t = t;
        sg_sequential_replace(seq, i, &g->base);
        t->wrapped[t->n_wrapped++] = g;
    }
    free(chosen);
    return st;
}

/* Puts the original modules back (the model outlives the trainer). */
static void unwrap_modules(sg_trainer *t)
{
    sg_module *seq = t->m->net;
    int n = sg_sequential_count(seq);
    for (int w = 0; w < t->n_wrapped; w++) {
        graphed_module *g = t->wrapped[w];
        for (int i = 0; i < n; i++)
            if (sg_sequential_child(seq, i) == &g->base) sg_sequential_replace(seq, i, g->inner);
        g->inner = NULL;
        sg_graph_destroy(g->fwd);
        sg_graph_destroy(g->bwd);
        free(g);
    }
    t->n_wrapped = 0;
    free(t->wrapped);
    t->wrapped = NULL;
}

/* ---- the regions ---- */

static sg_status run_forward(void *u)
{
    sg_model *m = u;
    return sg_module_forward(m->net, m->x, &m->logits);
}

/* The sources and targets of a sharded run's gathers: the shares' bf16 copies into the model's
 * (what its forward reads) under mixed precision, else the f32 masters. */
static sg_tensor *gather_src(sg_trainer *t) { return t->sh_param_lo ? t->sh_param_lo : t->sps.flat; }
static sg_tensor *gather_dst(sg_trainer *t)
{
    return t->sh_param_lo ? t->m->params->flat_lo : t->m->params->flat;
}

/* The forward, which a sharded run's step begins with the gather of every rank's updated
 * shares: each bucket's all-gather is queued ahead, and the forward of each child waits only
 * for the buckets holding its parameters (sg_dist_forward_hook), so the gathers of later layers
 * overlap the forward of earlier ones instead of following the update. */
static sg_status gather_forward(void *u)
{
    sg_trainer *t = u;
    if (!t->ahead) return run_forward(t->m);
    SG_TRY(sg_dist_gather_begin(t->dist, gather_src(t), gather_dst(t)));
    sg_status st = run_forward(t->m), end = sg_dist_gather_end(t->dist);
    return st != SG_OK ? st : end;
}

/* The shares the steps updated gathered into the model's parameters (what the forward reads),
 * once after steps: what reads the model between steps needs them. */
static sg_status flush_shares(sg_trainer *t)
{
    if (!t->shard || !t->stale) return SG_OK;
    SG_TRY(sg_dist_gather_shards(t->dist, gather_src(t), gather_dst(t)));
    t->stale = false;
    return SG_OK;
}

/* The loss and its gradient, scaled by 1/accum: the micro-batches' gradients then sum to the
 * gradient of the mean loss over all their rows. */
static sg_status run_loss(sg_trainer *t) { return sg_model_loss_pass(t->m, t->grad_scale); }

/* With data parallelism and one micro-batch a step, buckets of final gradients are averaged
 * over the ranks while the backward goes on (the Sequential's hook after each child), the rest
 * and the loss at its end, and the context's stream waits for them before the optimizer. With
 * several, the backward runs alone (the hook does nothing outside sg_dist_backward_begin/end)
 * and run_update averages the step's sum after the last micro-batch. */
static sg_status run_backward(void *u)
{
    sg_trainer *t = u;
    sg_model *m = t->m;
    sg_tensor *dx = NULL;
    if (!t->dist || t->opts.accum > 1) return sg_module_backward(m->net, m->dlogits, &dx);
    SG_TRY(sg_dist_backward_begin(t->dist));
    SG_TRY(sg_module_backward(m->net, m->dlogits, &dx));
    return sg_dist_backward_end(t->dist);
}

/* Micro-batch j of accum > 1: its gradients and loss into the step's sums, in f32 and in
 * micro-batch order, (((g0 + g1) + g2) + ...), under every scope alike. fp32: the backward
 * wrote grad_flat; micro-batch 0 copies it into grad_sum, the next ones add it there, the last
 * adds grad_sum into grad_flat, where clipping and the optimizer read the step's gradients.
 * bf16: the backward wrote the scaled bf16 gradients; micro-batch 0 widens them into the f32
 * grad_flat, the next ones add them; run_optim unscales the sum in place (the scale is a power
 * of two, so unscaling the sum is unscaling each term, bit for bit). The loss: loss_sum holds
 * l0/K + l1/K + ..., the last micro-batch writes the mean into the model's loss. */
static sg_status accumulate(sg_trainer *t, int j)
{
    sg_model *m = t->m;
    sg_param_set *ps = m->params;
    float inv = t->grad_scale, keep = j == 0 ? 0.f : 1.f;
    bool last = j == t->opts.accum - 1;
    if (ps->grad_flat_lo) SG_TRY(sg_accumulate(t->ctx, ps->grad_flat, keep, ps->grad_flat_lo, 1.f));
    else if (!last) SG_TRY(sg_accumulate(t->ctx, t->grad_sum, keep, ps->grad_flat, 1.f));
    else SG_TRY(sg_accumulate(t->ctx, ps->grad_flat, 1.f, t->grad_sum, 1.f));
    if (last) return sg_accumulate(t->ctx, m->loss, inv, t->loss_sum, 1.f);
    return sg_accumulate(t->ctx, t->loss_sum, keep, m->loss, inv);
}

/* The end of micro-batch j: the sums (with accum > 1), and the dropout offset moves on, so the
 * next micro-batch (or step, or replay) draws fresh masks. */
static sg_status micro_end(sg_trainer *t, int j)
{
    sg_model *m = t->m;
    const char *prev = sg_ctx_set_module(t->ctx, "accumulate");
    sg_status st = t->opts.accum > 1 ? accumulate(t, j) : SG_OK;
    if (st == SG_OK && m->rng && m->dropout > 0) st = sg_rng_advance(t->ctx, m->rng);
    sg_ctx_set_module(t->ctx, prev);
    return st;
}

/* Micro-batch j on the batch in the model's inputs, every part launched from the host (under
 * layer scope the wrapped modules replay their graphs). */
static sg_status run_micro(sg_trainer *t, int j)
{
    SG_TRY(j == 0 ? gather_forward(t) : run_forward(t->m)); /* a step's later micro-batches: the same weights */
    SG_TRY(run_loss(t));
    SG_TRY(run_backward(t));
    return micro_end(t, j);
}

/* The update: reading the f32 gradients (times the clipping factor), or unscaling the bf16
 * ones as it reads them (and then clipping them). */
static sg_status optim_update(sg_trainer *t)
{
    if (t->fold_unscale) return t->opts.clip > 0 ? sg_optim_update_amp_clipped(t->o) : sg_optim_update_amp(t->o);
    return t->clip_factor ? sg_optim_update_by(t->o, t->clip_factor) : sg_optim_update(t->o);
}

static sg_status update_body(void *u) { return optim_update(u); }

/* Clipping: the norm of the step's f32 gradients, and the factor the optimizer multiplies them
 * by as it reads them (clip_factor), or, with STEPGRAPH_CLIP=separate, a pass scaling them (bit
 * for bit the same update). With fold_unscale the norm is of the bf16 gradients times 1 / scale
 * (sg_clip_sumsq_amp: the f32 ones the unscale pass would write, bit for bit), the factor
 * written into the optimizer's slot beside 1 / scale. Sharded, each rank's f64 sum of squares
 * of its shares (the tail once) is gathered from every rank and the sums added in rank order:
 * the same norm as an unsharded run's up to the order of its f64 sum (within an f32 ulp), the
 * same bits on every rank. */
static sg_status clip(sg_trainer *t)
{
    sg_model *m = t->m;
    const float c = t->opts.clip;
    sg_tensor *inv = NULL, *factor = t->clip_factor;
    if (t->fold_unscale) sg_optim_amp_slots(t->o, &inv, &factor);
    if (!t->shard && !t->fold_unscale) /* one launch: the f32 gradients measured whole */
        return factor ? sg_clip_factor(t->ctx, sg_model_grads(m), c, m->gnorm, m->nonfinite, factor)
                      : sg_clip_grad_norm(t->ctx, sg_model_grads(m), c, m->gnorm, m->nonfinite);
    /* The split form: the sum of squares (of this rank's shares when sharded), then the factor
     * from the sums (every rank's, gathered), or the shares scaled by it. */
    const sg_tensor *g = t->shard ? t->sh_norm_part : sg_model_grads_lo(m);
    SG_TRY(t->fold_unscale ? sg_clip_sumsq_amp(t->ctx, g, inv, t->clip_sums, 0)
                           : sg_clip_sumsq(t->ctx, g, t->clip_sums, 0));
    const sg_tensor *sums = t->clip_sums;
    if (t->shard) {
        SG_TRY(sg_dist_gather_bits(t->dist, t->clip_sums, t->sh_sums));
        sums = t->sh_sums;
    }
    return factor ? sg_clip_factor_sums(t->ctx, c, sums, m->gnorm, m->nonfinite, factor)
                  : sg_clip_apply(t->ctx, t->sps.grad_flat, c, sums, m->gnorm, m->nonfinite);
}

/* Unscaling (mixed precision: the bf16 gradients, or with accum > 1 their f32 sum, divided by
 * the loss scale into the f32 ones, the skip flag set when they are not finite, the scale
 * updated; with fold_unscale only the check and the scale, the optimizer dividing as it
 * reads), clipping and the optimizer (which does nothing on a skip). All device work: no
 * host sync. skip_if in the step graph: the update is the one branch of a SWITCH on the skip
 * flag, so it runs only when the flag is 0 (an IF on "finite"); its kernels still read the
 * flag, so the node changes what launches, not what is computed. Clipping stays outside: on
 * a skipped step it writes what it writes eagerly (the norm and the factor, or with
 * STEPGRAPH_CLIP=separate the scaled gradients, which verify compares). */
static sg_status run_optim(sg_trainer *t)
{
    sg_model *m = t->m;
    const char *prev = sg_ctx_set_module(t->ctx, "optimizer");
    sg_status st = t->fold_unscale ? sg_optim_check(t->o)
                   : t->opts.accum > 1 ? sg_optim_unscale_sum(t->o) : sg_optim_unscale(t->o);
    /* Sharded, each rank checked its shares only: the flag and the scaler every rank keeps are
     * those of a step some rank found not finite (the least scale and good-step count, the most
     * skips), which is what every rank would have computed from all the gradients. */
    if (st == SG_OK && t->shard && t->sh_param_lo && !m->unscaled)
        st = sg_dist_agree_scaler(t->dist, m->found, m->scaler);
    if (st == SG_OK && t->opts.clip > 0) st = clip(t);
    if (st == SG_OK && t->use_skip_if && t->in_step_graph)
        st = sg_graph_switch(t->ctx, m->found, 1, (sg_step_fn[]){update_body}, (void *[]){t});
    else if (st == SG_OK)
        st = optim_update(t);
    /* Sharded: every bucket's updated shares gathered into the model (the bf16 copies the
     * steps read, or the f32 masters), in one group; with copy-engine windows by the next
     * step's forward instead (gather_forward), or by flush_shares when something else reads
     * the model first. */
    if (st == SG_OK && t->shard && !t->ahead) st = sg_dist_gather_shards(t->dist, gather_src(t), gather_dst(t));
    sg_ctx_set_module(t->ctx, prev);
    return st;
}

/* After the last micro-batch: with data parallelism and accum > 1, the step's f32 gradient sum
 * and mean loss averaged over the ranks (one all-reduce: no backward is left to overlap), then
 * the optimizer. */
static sg_status run_update(sg_trainer *t)
{
    if (t->dist && t->opts.accum > 1) {
        SG_TRY(sg_dist_backward_begin(t->dist));
        SG_TRY(sg_dist_backward_end(t->dist));
    }
    return run_optim(t);
}

/* A step of one micro-batch on the batch in the inputs (buckets: accum is 1 there). */
static sg_status run_step(void *u)
{
    sg_trainer *t = u;
    SG_TRY(run_micro(t, 0));
    return run_update(t);
}

/* Variable shapes (eager and step scopes): the sorted bucket sizes (batch rows of an mlp, or
 * sequence lengths of a gpt), static inputs to pad, and under step scope the cache of a graph
 * per bucket. */
static sg_status set_buckets(sg_trainer *t, const sg_trainer_options *op)
{
    sg_model *m = t->m;
    bool seq = op->n_seq_buckets > 0;
    const int64_t *b = seq ? op->seq_buckets : op->batch_buckets;
    int n = seq ? op->n_seq_buckets : op->n_buckets;
    int64_t max = seq ? m->spec.seq : m->spec.batch;
    bool ok = b && n > 0 && n <= 32 && (op->scope == SG_SCOPE_EAGER || op->scope == SG_SCOPE_STEP);
    for (int i = 0; ok && i < n; i++) {
        t->buckets[i] = b[i];
        ok = b[i] >= 1 && b[i] <= max && (i == 0 || b[i] > b[i - 1]);
    }
    if (!ok)
        return sg_fail(m->ctx, SG_ERR_INVALID,
                       "sg_trainer_create: %s buckets must be 1 to 32 increasing %s from 1 to the model's %s "
                       "%lld, under eager or step scope (%d given, scope %s)", seq ? "sequence" : "batch",
                       seq ? "lengths" : "sizes", seq ? "sequence length T =" : "batch", (long long)max, n,
                       sg_scope_name(op->scope));
    t->n_buckets = n, t->seq_buckets = seq;
    t->opts.batch_buckets = seq ? NULL : t->buckets;
    t->opts.seq_buckets = seq ? t->buckets : NULL;
    SG_TRY(sg_model_use_static_inputs(m)); /* padding needs static inputs to pad, even eagerly */
    if (op->scope == SG_SCOPE_STEP) SG_TRY(sg_graph_cache_create(m->ctx, op->cache_budget, 0, &t->cache));
    return SG_OK;
}

/* ---- a sharded optimizer ---- */

/* One of this rank's ranges: flat[a, a + n) kept at compact[c, c + n). */
typedef struct owned { int64_t a, n, c; } owned;

/* This rank's ranges in compact order: its share of each bucket, then the tail. *out is
 * malloc'ed (n_plan + 1 entries). */
static sg_status owned_ranges(sg_trainer *t, owned **out, int *n_out)
{
    const sg_dist_layout L = sg_dist_shard_layout(t->dist);
    owned *o = malloc((size_t)(L.n_plan + 1) * sizeof *o);
    if (!o) return sg_fail(t->ctx, SG_ERR_OOM, "sg_trainer_create: out of host memory");
    int k = 0, W = sg_dist_world(t->dist), r = sg_dist_rank(t->dist);
    for (int i = 0; i < L.n_plan; i++) {
        int64_t share = (L.plan[i].hi - L.plan[i].lo) / W;
        o[k++] = (owned){L.plan[i].lo + r * share, share, L.plan[i].shard_off};
    }
    if (L.tail_n > 0) o[k++] = (owned){L.tail_lo, L.tail_n, L.tail_off};
    *out = o, *n_out = k;
    return SG_OK;
}

/* Copies each of this rank's ranges between a flat tensor and a compact one (to_compact: flat
 * into compact), queued on the context's stream. */
static sg_status copy_owned(sg_trainer *t, sg_tensor *flat, sg_tensor *compact, bool to_compact)
{
    owned *o;
    int n;
    SG_TRY(owned_ranges(t, &o, &n));
    sg_status st = SG_OK;
    for (int i = 0; i < n && st == SG_OK; i++) {
        sg_tensor *f = NULL, *c = NULL;
        st = sg_tensor_view(flat, o[i].a, 1, &o[i].n, "owned.flat", &f);
        if (st == SG_OK) st = sg_tensor_view(compact, o[i].c, 1, &o[i].n, "owned.compact", &c);
        if (st == SG_OK) st = to_compact ? sg_tensor_copy(c, f) : sg_tensor_copy(f, c);
        sg_tensor_destroy(f);
        sg_tensor_destroy(c);
    }
    free(o);
    return st;
}

/* The optimizer's segment tables over the compact buffers: every piece of a parameter tensor
 * inside one of this rank's ranges starts a segment, with that tensor's weight decay. A piece
 * starts at a range's start or at a tensor's, so there are at most n + count of them. */
static sg_status shard_segments(sg_trainer *t, const owned *o, int n, int64_t S)
{
    sg_param_set *ps = t->m->params;
    int64_t total = ps->flat->numel;
    int cap = n + ps->count, k = 0;
    int32_t *start = malloc((size_t)(cap + 1) * sizeof *start), *decay = malloc((size_t)cap * sizeof *decay);
    sg_status st = start && decay ? SG_OK : sg_fail(t->ctx, SG_ERR_OOM, "sg_trainer_create: out of host memory");
    for (int i = 0; i < n && st == SG_OK; i++) {
        /* Segments tile the flat buffer as the optimizer's do: alignment padding belongs to the
         * tensor before it. */
        for (int p = 0; p < ps->count; p++) {
            int64_t s0 = p == 0 ? 0 : ps->info[p].offset, s1 = p + 1 < ps->count ? ps->info[p + 1].offset : total;
            int64_t a = o[i].a > s0 ? o[i].a : s0, b = o[i].a + o[i].n < s1 ? o[i].a + o[i].n : s1;
            if (a >= b) continue;
            start[k] = (int32_t)(o[i].c + (a - o[i].a));
            decay[k++] = ps->info[p].decay;
        }
    }
    int64_t ns = k + 1, nd = k > 0 ? k : 1;
    if (st == SG_OK) {
        start[k] = (int32_t)S;
        t->sps.ctx = t->ctx, t->sps.count = k, t->sps.total = S;
        st = sg_tensor_create(t->ctx, SG_DTYPE_I32, 1, &ns, "shard.seg_start", &t->sps.seg_start);
    }
    if (st == SG_OK) st = sg_tensor_create(t->ctx, SG_DTYPE_I32, 1, &nd, "shard.seg_decay", &t->sps.seg_decay);
    if (st == SG_OK) st = sg_tensor_copy_from_host(t->sps.seg_start, start, (size_t)ns * 4);
    if (st == SG_OK && k > 0) st = sg_tensor_copy_from_host(t->sps.seg_decay, decay, (size_t)k * 4);
    if (st == SG_OK) st = sg_ctx_sync(t->ctx); /* the host tables are freed next */
    free(start), free(decay);
    return st;
}

/* base's bytes copied between its storage and another place (to: from base to `to`). */
static sg_status copy_bytes(sg_trainer *t, sg_tensor *base, void *to, void *from)
{
    sg_tensor a = *base, b = *base;
    a.data = to, b.data = from;
    a.block = b.block = NULL, a.pool = b.pool = NULL;
    SG_TRY(sg_tensor_copy(&a, &b));
    return sg_ctx_sync(t->ctx);
}

/* base (and its views) moved into a new NCCL window. */
static sg_status to_window(sg_trainer *t, sg_tensor *base, sg_tensor **views, int n_views)
{
    struct shwin *w = &t->win[t->n_win];
    SG_TRY(sg_dist_window_alloc(t->dist, sg_tensor_nbytes(base), &w->ptr, &w->win));
    w->base = base, w->views = views, w->n_views = n_views, w->old = base->data;
    t->n_win++;
    SG_TRY(copy_bytes(t, base, w->ptr, w->old));
    for (int i = 0; i < n_views; i++) views[i]->data = (char *)w->ptr + ((char *)views[i]->data - (char *)w->old);
    base->data = w->ptr;
    return SG_OK;
}

/* Every window's contents back in its tensor's own storage, the window freed. */
static void from_windows(sg_trainer *t)
{
    for (int k = t->n_win - 1; k >= 0; k--) {
        struct shwin *w = &t->win[k];
        if (w->base->data == w->ptr) {
            if (copy_bytes(t, w->base, w->old, w->ptr) != SG_OK) { /* the run failed: the model keeps its old bytes */ }
            for (int i = 0; i < w->n_views; i++)
                w->views[i]->data = (char *)w->old + ((char *)w->views[i]->data - (char *)w->ptr);
            w->base->data = w->old;
        }
        sg_dist_window_free(t->dist, w->ptr, w->win);
    }
    t->n_win = 0;
}

/* The compact buffers, the masters copied in, the optimizer moved onto them. */
static sg_status make_shards(sg_trainer *t)
{
    sg_model *m = t->m;
    sg_param_set *ps = m->params;
    const sg_dist_layout L = sg_dist_shard_layout(t->dist);
    const int64_t S = L.numel;
    owned *o;
    int n;
    SG_TRY(owned_ranges(t, &o, &n));
    sg_status st = shard_segments(t, o, n, S);
    free(o);
    SG_TRY(st);
    bool amp = ps->grad_flat_lo != NULL;
    SG_TRY(sg_tensor_create(t->ctx, SG_DTYPE_F32, 1, &S, "shard.params", &t->sps.flat));
    if (!amp || !t->fold_unscale) /* what the reduce-scatters write, or the unscale pass */
        SG_TRY(sg_tensor_create(t->ctx, SG_DTYPE_F32, 1, &S, "shard.grads", &t->sps.grad_flat));
    SG_TRY(copy_owned(t, ps->flat, t->sps.flat, true));
    if (amp) {
        if (t->opts.accum == 1) /* with accumulation the step's f32 sums are reduce-scattered */
            SG_TRY(sg_tensor_create(t->ctx, SG_DTYPE_BF16, 1, &S, "shard.grads.bf16", &t->sh_grad_lo));
        SG_TRY(sg_tensor_create(t->ctx, SG_DTYPE_BF16, 1, &S, "shard.params.bf16", &t->sh_param_lo));
        /* Gathered after every update, a skipped one too, or ahead of every forward, the first
         * step's too: it must hold the masters' copy. */
        SG_TRY(sg_tensor_convert(t->sh_param_lo, t->sps.flat));
        const char *ce = getenv("STEPGRAPH_NCCL_CE");
        if (ce && !strcmp(ce, "1") && sg_dist_has_windows(t->dist)) {
            SG_TRY(to_window(t, ps->flat_lo, ps->param_lo, ps->count));
            SG_TRY(to_window(t, t->sh_param_lo, NULL, 0));
        }
    }
    /* The gather ahead of the forward: with the windows (where it pays: copy engines beside the
     * forward's GEMMs), or asked for (STEPGRAPH_SHARD_GATHER=ahead: SM-based gathers beside
     * them, about even with gathering after the update; bench/RESULTS.md, sessions 31, 32). */
    const char *g = getenv("STEPGRAPH_SHARD_GATHER");
    t->ahead = t->n_win > 0 || (g && !strcmp(g, "ahead"));
    if (t->opts.clip > 0) { /* the f32 gradients, or with fold_unscale the bf16 ones the update reads */
        int64_t part = sg_dist_rank(t->dist) == 0 ? S : L.tail_off;
        int64_t all = 2 * (int64_t)sg_dist_world(t->dist);
        SG_TRY(sg_tensor_view(t->fold_unscale ? t->sh_grad_lo : t->sps.grad_flat, 0, 1, &part,
                              "shard.grads.norm_part", &t->sh_norm_part));
        SG_TRY(sg_tensor_create(t->ctx, SG_DTYPE_I32, 1, &all, "shard.grads.sums", &t->sh_sums));
    }
    SG_TRY(sg_dist_set_shard_out(t->dist, t->sh_grad_lo ? t->sh_grad_lo : t->sps.grad_flat));
    SG_TRY(sg_optim_use_params(t->o, &t->sps));
    t->optim_moved = true;
    /* With accumulation the optimizer reads only the f32 sums (sg_optim_unscale_sum, then the
     * update), so its bf16 gradients only mark mixed precision: the compact sums stand in. */
    if (amp)
        SG_TRY(sg_model_set_mixed(m, t->o, t->sh_grad_lo ? t->sh_grad_lo : t->sps.grad_flat, t->sh_param_lo));
    return sg_ctx_sync(t->ctx);
}

static void free_shards(sg_trainer *t)
{
    from_windows(t);
    if (t->optim_moved) sg_optim_use_params(t->o, NULL); /* the optimizer's parameters are freed next */
    sg_tensor *ts[] = {t->sh_norm_part, t->sh_sums, t->sps.flat, t->sps.grad_flat, t->sps.seg_start,
                       t->sps.seg_decay, t->sh_grad_lo, t->sh_param_lo};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) sg_tensor_destroy(ts[i]);
    memset(&t->sps, 0, sizeof t->sps);
}

/* Data parallelism: the model must be the run's shard; captured scopes warm up long enough for
 * NCCL to connect before a capture; the gradient buckets hook into the net's backward. */
static sg_status attach_dist(sg_trainer *t)
{
    sg_model *m = t->m;
    sg_dist *d = t->opts.dist;
    if (d->ctx != t->ctx)
        return sg_fail(t->ctx, SG_ERR_BACKEND, "sg_trainer_create: the data-parallel run belongs to another context");
    if (m->shards != sg_dist_world(d) || m->shard != sg_dist_rank(d))
        return sg_fail(t->ctx, SG_ERR_INVALID, "sg_trainer_create: model '%s' trains on shard %d of %d of each "
                       "batch, but this process is rank %d of %d: build it with sg_model_options.shard = the "
                       "rank and shards = the world size", m->name, m->shard, m->shards, sg_dist_rank(d),
                       sg_dist_world(d));
    if (t->n_buckets)
        return sg_fail(t->ctx, SG_ERR_UNSUPPORTED, "sg_trainer_create: batch or sequence buckets with data "
                       "parallelism are not implemented; train at the model's full shape");
    if (t->opts.scope != SG_SCOPE_EAGER && t->opts.warmup < SG_DIST_MIN_WARMUP) t->opts.warmup = SG_DIST_MIN_WARMUP;
    /* What the backward wrote (bf16 under mixed precision), or with accum > 1 the step's f32
     * sum, averaged once after the last micro-batch (run_update). */
    sg_tensor *g = m->params->grad_flat_lo && t->opts.accum == 1 ? m->params->grad_flat_lo : m->params->grad_flat;
    bool shard = t->opts.shard_optimizer != 0;
    SG_TRY(sg_dist_attach(d, g, m->loss, m->grad_ready, m->n_grad_ready, shard));
    sg_sequential_set_backward_hook(m->net, sg_dist_backward_hook, d);
    if (shard) sg_sequential_set_forward_hook(m->net, sg_dist_forward_hook, d);
    t->dist = d;
    t->shard = shard;
    return shard ? make_shards(t) : SG_OK;
}

/* Gradient accumulation's sums, allocated now so that steps (and captures) allocate nothing:
 * the loss's, and for fp32 models the gradients' (bf16 models sum into their f32 gradients,
 * which the backward does not write). */
static sg_status make_sums(sg_trainer *t)
{
    sg_param_set *ps = t->m->params;
    SG_TRY(sg_tensor_create(t->ctx, SG_DTYPE_F32, 1, (int64_t[]){1}, "loss.sum", &t->loss_sum));
    if (ps->grad_flat_lo) return SG_OK;
    return sg_tensor_create(t->ctx, SG_DTYPE_F32, 1, &ps->grad_flat->numel, "grad.sum", &t->grad_sum);
}

/* The control-flow forms: their device state, made now (steps allocate nothing), and what
 * the step graph can be built with. Where capture makes no conditional nodes of a kind a form
 * needs, the graph is built without it (unrolled, predicated, a graph per bucket; an early
 * stop: eager steps) and cond_note says so. */
static sg_status setup_cond(sg_trainer *t)
{
    const sg_trainer_options *o = &t->opts;
    sg_ctx *ctx = t->ctx;
    bool stop = o->stop_nonfinite > 0 || o->stop_on_loss, step = o->scope == SG_SCOPE_STEP;
    if (stop) {
        SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){SG_STOP_STATE}, "stop.state", &t->stop));
        SG_TRY(sg_tensor_fill(t->stop, 0));
        SG_TRY(sg_tensor_view(t->stop, 0, 1, (int64_t[]){1}, "stop.go", &t->stop_go));
        t->rule = (sg_stop_rule){o->stop_nonfinite, o->stop_on_loss, o->stop_loss};
    }
    if (!step) return SG_OK;
    if (o->loop) {
        SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "loop.micro", &t->micro_left));
        SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "loop.steps", &t->steps_left));
    }
    if (o->vary_seq || o->vary_batch) {
        SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "bucket", &t->bucket));
        for (int k = 0; k < t->n_buckets; k++) t->branch[k] = (struct bucket_branch){t, k};
    }
    if (o->vary_batch) SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "vary.step", &t->vary_step));
    int have = sg_graph_conditionals(ctx), w = 1 << SG_COND_WHILE, sw = 1 << SG_COND_SWITCH;
    t->use_loop = o->loop && (have & w);
    t->use_skip_if = o->skip_if && (have & sw) && t->m->precision == SG_DTYPE_BF16;
    t->use_switch = (o->vary_seq || o->vary_batch) && (have & sw);
    /* What was asked for and lost, one clause each, then why. */
    const struct { bool lost; const char *what; } forms[] = {
        {o->loop && !t->use_loop, "loop (unrolled instead)"},
        {o->skip_if && !(have & sw), "skip_if (predicated instead)"},
        {o->vary_seq && !t->use_switch, "vary_seq's SWITCH (a graph per bucket instead)"},
        {o->vary_batch && !t->use_switch, "vary_batch's SWITCH (a graph per bucket instead)"},
        {stop && !(have & w), "early stop (every step eager instead)"},
    };
    size_t len = 0;
    for (size_t i = 0; i < sizeof forms / sizeof *forms; i++)
        if (forms[i].lost && len < sizeof t->cond_note)
            len += (size_t)snprintf(t->cond_note + len, sizeof t->cond_note - len, "%s%s", len ? ", " : "",
                                    forms[i].what);
    if (len && len < sizeof t->cond_note)
        snprintf(t->cond_note + len, sizeof t->cond_note - len, ": capture on this context makes no %s nodes (IF "
                 "and WHILE need CUDA 12.4, SWITCH 12.8, driver and toolkit; or STEPGRAPH_DISABLE_CONDITIONALS=1)",
                 !(have & w) ? "WHILE or SWITCH" : "SWITCH");
    if (stop && !(have & w)) {
        t->fallback = true;
        snprintf(t->reason, sizeof t->reason, "early stop runs eagerly: %.480s", t->cond_note);
    }
    return SG_OK;
}

/* The options of the control-flow forms: flags 0 or 1, a rule that can hold. */
static sg_status check_cond_options(sg_ctx *ctx, const sg_trainer_options *op)
{
    bool buckets = op->n_buckets || op->n_seq_buckets;
    if ((op->loop | op->skip_if | op->vary_seq | op->vary_batch | op->stop_on_loss) & ~1)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_trainer_create: loop %d, skip_if %d, vary_seq %d, vary_batch %d, "
                       "stop_on_loss %d: expected 0 or 1", op->loop, op->skip_if, op->vary_seq, op->vary_batch,
                       op->stop_on_loss);
    if (op->stop_nonfinite < 0 || op->stop_nonfinite > (1 << 30) || (op->stop_on_loss && !isfinite(op->stop_loss)))
        return sg_fail(ctx, SG_ERR_INVALID, "sg_trainer_create: stop_nonfinite %d, stop_loss %g: expected 0 to 2^30 "
                       "steps, and a finite loss with stop_on_loss", op->stop_nonfinite, (double)op->stop_loss);
    if (op->vary_seq && !op->n_seq_buckets)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_trainer_create: vary_seq draws a length a step from the sequence "
                       "buckets: set seq_buckets");
    if (op->vary_batch && !op->n_buckets)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_trainer_create: vary_batch draws a row count a step from the batch "
                       "buckets: set batch_buckets");
    if (op->steps_per_call > 1 && buckets && !op->vary_seq && !op->vary_batch)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_trainer_create: %d steps per call: expected 1 with batch or sequence "
                       "buckets (a call of sg_trainer_step_rows or _seq is one step; vary_seq draws the lengths "
                       "of several)", op->steps_per_call);
    if (op->dist && (op->stop_nonfinite > 0 || op->stop_on_loss))
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_trainer_create: early stop with data parallelism is not "
                       "implemented (a step's all-reduce cannot sit in the loop's body)");
    return SG_OK;
}

sg_status sg_trainer_create(sg_model *m, sg_optim *o, const sg_trainer_options *opts,
                            sg_trainer **out)
{
    if (!m || !o || !out) return SG_ERR_NULL;
    *out = NULL;
    sg_trainer_options op = opts ? *opts : sg_trainer_options_default();
    if (op.steps_per_call == 0) op.steps_per_call = 1;
    if (!(op.clip >= 0.f) || op.scope < SG_SCOPE_EAGER || op.scope > SG_SCOPE_STEP || op.warmup < 0 ||
        op.steps_per_call < 1 || op.steps_per_call > 1024)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_trainer_create: scope %d, warmup %d, %d steps per "
                       "call: expected a scope of sg_scope, warmup >= 0 and 1 to 1024 steps per call",
                       (int)op.scope, op.warmup, op.steps_per_call);
    SG_TRY(check_cond_options(m->ctx, &op));
    if (op.accum < 1 || op.accum > 1024 || (op.accum > 1 && (op.n_buckets || op.n_seq_buckets)))
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_trainer_create: sg_trainer_options.accum %d: expected 1 to 1024 "
                       "micro-batches per optimizer step%s", op.accum,
                       op.accum > 1 && (op.n_buckets || op.n_seq_buckets)
                           ? ", and 1 with batch or sequence buckets (a step of padded rows or tokens is one batch)"
                           : "");
    /* The optimizer's state now, in its dtype: before any capture, and counted in the stats. */
    SG_TRY(sg_optim_alloc_state(o));
    sg_trainer *t = calloc(1, sizeof *t);
    if (!t) return sg_fail(m->ctx, SG_ERR_OOM, "sg_trainer_create: out of host memory");
    t->ctx = m->ctx, t->m = m, t->o = o, t->opts = op;
    t->grad_scale = 1.0f / (float)op.accum;
    /* Clipping: the norm measured, and the optimizer multiplying the gradients by the factor
     * as it reads them (sg_clip_factor, sg_optim_update_by) instead of a pass scaling them
     * first; bit for bit the same update, the f32 gradients left unclipped.
     * STEPGRAPH_CLIP=separate keeps the pass. Mixed precision with one micro-batch (no sums
     * between the backward and the update): the optimizer unscales the bf16 gradients as it
     * reads them too, after a check pass, instead of a pass writing the f32 ones (bit for bit
     * the same step; the f32 gradients are then not written, sg_model_grads says so), and
     * clipping measures the norm of the bf16 ones times 1 / scale (sg_clip_sumsq_amp).
     * STEPGRAPH_UNSCALE=separate keeps the separate unscale pass, to measure the difference. */
    const char *us = getenv("STEPGRAPH_UNSCALE"), *cs = getenv("STEPGRAPH_CLIP");
    const bool clip_separate = op.clip > 0 && cs && !strcmp(cs, "separate");
    t->fold_unscale = sg_model_grads_lo(m) && op.accum == 1 && !clip_separate && !(us && !strcmp(us, "separate"));
    snprintf(t->modules, sizeof t->modules, "%s", op.graph_modules ? op.graph_modules : "");
    t->opts.graph_modules = t->modules;
    sg_status st = SG_OK;
    if (op.graph_modules && strlen(op.graph_modules) >= sizeof t->modules)
        st = sg_fail(m->ctx, SG_ERR_INVALID, "sg_trainer_create: --graph-modules list longer than %zu characters: "
                     "name fewer modules, or 'all'", sizeof t->modules - 1);
    else if (op.n_buckets && op.n_seq_buckets)
        st = sg_fail(m->ctx, SG_ERR_INVALID, "sg_trainer_create: batch buckets and sequence buckets together; "
                     "a trainer varies one shape");
    else if (op.n_buckets && m->text)
        st = sg_fail(m->ctx, SG_ERR_UNSUPPORTED, "sg_trainer_create: batch buckets are for models of samples; '%s' "
                     "reads token text: vary its sequence length (seq_buckets)", m->name);
    else if ((op.steps_per_call > 1 || op.accum > 1) && m->data && m->data->kind == SG_DATASET_FED)
        st = sg_fail(m->ctx, SG_ERR_UNSUPPORTED, "sg_trainer_create: '%s' is fed from the host, a batch a step: "
                     "steps_per_call and accum must be 1", m->name);
    else if (op.n_seq_buckets && !m->text)
        st = sg_fail(m->ctx, SG_ERR_UNSUPPORTED, "sg_trainer_create: sequence buckets are for gpt models; '%s' "
                     "has no sequence length", m->name);
    else if (op.n_buckets || op.n_seq_buckets)
        st = set_buckets(t, &op);
    if (st == SG_OK && op.scope != SG_SCOPE_EAGER) st = sg_model_use_static_inputs(m);
    if (st == SG_OK && op.clip > 0 && !clip_separate && !t->fold_unscale)
        st = sg_tensor_create(m->ctx, SG_DTYPE_F32, 1, (int64_t[]){1}, "trainer.clip_factor", &t->clip_factor);
    if (st == SG_OK && op.clip > 0) /* 8 bytes: not worth waiting to know whether it is sharded */
        st = sg_tensor_create(m->ctx, SG_DTYPE_I32, 1, (int64_t[]){2}, "trainer.clip_sums", &t->clip_sums);
    if (st == SG_OK && op.accum > 1) st = make_sums(t);
    if (st == SG_OK && op.scope == SG_SCOPE_LAYER) st = wrap_modules(t);
    if (st == SG_OK && op.dist) st = attach_dist(t);
    if (st == SG_OK) st = setup_cond(t);
    if (st != SG_OK) {
        sg_trainer_destroy(t);
        return st;
    }
    *out = t;
    return SG_OK;
}

void sg_trainer_destroy(sg_trainer *t)
{
    if (!t) return;
    /* The model outlives the trainer: its parameters whole again, unless the run failed (its
     * collectives would fail too). */
    if ((t->stale || t->masters_stale) && !t->dist->failed && sg_trainer_gather_params(t) != SG_OK) {
        /* the model keeps what was gathered last */
    }
    if (t->dist) {
        sg_sequential_set_backward_hook(t->m->net, NULL, NULL);
        sg_sequential_set_forward_hook(t->m->net, NULL, NULL);
        sg_dist_detach(t->dist);
    }
    free_shards(t);
    unwrap_modules(t);
    sg_graph_destroy(t->g_step);
    sg_graph_destroy(t->g_fwd);
    sg_graph_destroy(t->g_bwd);
    sg_graph_cache_destroy(t->cache);
    sg_tensor_destroy(t->grad_sum);
    sg_tensor_destroy(t->loss_sum);
    sg_tensor_destroy(t->micro_left);
    sg_tensor_destroy(t->steps_left);
    sg_tensor_destroy(t->stop_go);
    sg_tensor_destroy(t->stop);
    sg_tensor_destroy(t->bucket);
    sg_tensor_destroy(t->vary_step);
    sg_tensor_destroy(t->clip_factor);
    sg_tensor_destroy(t->clip_sums);
    free(t);
}

static sg_status eager_step(sg_trainer *t) { return run_step(t); }

/* ---- the step graph: it loads its own batches (the index in device memory) ---- */

/* Micro-batch j: a gather, the micro-batch, an advance of the index. */
static sg_status indexed_micro(sg_trainer *t, int j)
{
    SG_TRY(sg_model_gather_batch(t->m));
    SG_TRY(run_micro(t, j));
    return sg_model_advance_batch(t->m);
}

/* One turn of the micro-batch loop: a middle micro-batch (its sums are those of every middle
 * one: added to the sums so far, not the last), then the count of turns left goes down. */
static sg_status micro_turn(void *u)
{
    sg_trainer *t = u;
    SG_TRY(indexed_micro(t, 1));
    return sg_tensor_add_scalar(t->micro_left, -1);
}

static bool varies(const sg_trainer *t) { return t->opts.vary_seq || t->opts.vary_batch; }

typedef struct size_args {
    sg_model *m;
    int64_t size;
    bool seq;
} size_args;

static sg_status size_set(const size_args *a)
{
    return a->seq ? sg_model_set_seq(a->m, a->size) : sg_model_set_rows(a->m, a->size);
}

static sg_status size_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    return size_set(p);
}

/* The model's sequence length (seq buckets) or rows (batch buckets), now and, on the CPU,
 * again when a plan recorded now runs: the CPU plan's ops read their tensors' shapes when they
 * run (a CUDA kernel's are fixed at its launch), so a captured region that changes the shape
 * records the change. */
static sg_status set_size_recorded(sg_trainer *t, int64_t size)
{
    size_args a = {t->m, size, t->seq_buckets};
    SG_TRY(size_set(&a));
    if (t->ctx->backend != SG_BACKEND_CPU) return SG_OK;
    return sg_cpu_run(t->ctx, size_cpu, &a, sizeof a);
}

static int64_t full_size(const sg_trainer *t) { return t->seq_buckets ? t->m->spec.seq : t->m->spec.batch; }

/* Shape drawn on the device (vary_seq, vary_batch): branch k runs the step at bucket k. */
static sg_status bucket_branch_step(void *u)
{
    struct bucket_branch *b = u;
    SG_TRY(set_size_recorded(b->t, b->t->buckets[b->k]));
    return run_step(b->t);
}

/* The step's shape drawn on the device: the text gather draws the length and writes the batch
 * at its bucket's shape (vary_seq); or the full batch is gathered and the rows past the drawn
 * count padded (vary_batch). Either writes the bucket's number, which picks the branch. The
 * gather sees the full shape (its capacity). */
static sg_status switch_step(sg_trainer *t)
{
    sg_model *m = t->m;
    sg_step_fn fn[32];
    void *user[32];
    for (int k = 0; k < t->n_buckets; k++) fn[k] = bucket_branch_step, user[k] = &t->branch[k];
    SG_TRY(set_size_recorded(t, full_size(t)));
    if (t->seq_buckets) {
        SG_TRY(sg_text_batch_vary(m->text, 0, m->data_seed, m->batch_idx, t->buckets, t->n_buckets, m->x_static,
                                  m->t_view, t->bucket));
    } else {
        SG_TRY(sg_model_gather_batch(m));
        SG_TRY(sg_model_pad_vary(m, t->vary_step, t->buckets, t->n_buckets, t->bucket));
    }
    sg_status st = sg_graph_switch(t->ctx, t->bucket, t->n_buckets, fn, user);
    SG_TRY(set_size_recorded(t, full_size(t)));
    SG_TRY(st);
    if (t->vary_step) SG_TRY(sg_tensor_add_scalar(t->vary_step, 1));
    return sg_model_advance_batch(m);
}

/* One optimizer step: its accum micro-batches, unrolled or (loop, accum > 2) the first, a
 * WHILE node over the accum - 2 middle ones and the last, then the update. The same kernels
 * in the same order either way. */
static sg_status indexed_step(sg_trainer *t)
{
    int K = t->opts.accum;
    if (varies(t)) return switch_step(t);
    if (t->use_loop && K > 2) {
        SG_TRY(indexed_micro(t, 0));
        SG_TRY(sg_tensor_fill(t->micro_left, K - 2));
        SG_TRY(sg_graph_while(t->ctx, t->micro_left, micro_turn, t));
        SG_TRY(indexed_micro(t, K - 1));
    } else {
        for (int j = 0; j < K; j++) SG_TRY(indexed_micro(t, j));
    }
    return run_update(t);
}

/* One turn of the steps loop: a step, then the early-stop rule writes the loop's condition
 * (or, without a rule, the count of turns left goes down). */
static sg_status step_turn(void *u)
{
    sg_trainer *t = u;
    SG_TRY(indexed_step(t));
    if (t->stop) return sg_stop_check(t->ctx, t->stop, t->m->loss, t->opts.steps_per_call, &t->rule);
    return sg_tensor_add_scalar(t->steps_left, -1);
}

/* The captured step: steps_per_call steps, unrolled or as a WHILE node (loop, or an early-stop
 * rule), so consecutive steps need nothing from the host but the launch. */
static sg_status indexed_steps(sg_trainer *t)
{
    int K = t->opts.steps_per_call;
    if (t->stop) {
        SG_TRY(sg_stop_begin(t->ctx, t->stop, K));
        return sg_graph_while(t->ctx, t->stop_go, step_turn, t);
    }
    if (t->use_loop && K > 1 && !t->dist) { /* (a step's all-reduce cannot sit in a loop body) */
        SG_TRY(sg_tensor_fill(t->steps_left, K));
        return sg_graph_while(t->ctx, t->steps_left, step_turn, t);
    }
    for (int k = 0; k < K; k++) SG_TRY(indexed_step(t));
    return SG_OK;
}

static sg_status run_indexed_steps(void *u)
{
    sg_trainer *t = u;
    t->in_step_graph = true;
    sg_status st = indexed_steps(t);
    t->in_step_graph = false;
    return st;
}

static sg_status host_steps(sg_trainer *t, int64_t index);

/* Before the SWITCH graph's capture, each bucket's lazy set-up (plans, workspaces: what a
 * capture cannot do) by a forward, loss and backward at its length on batch `index`, the
 * results dropped: the next step writes every buffer they wrote (gradients, loss,
 * activations), and the parameters, optimizer, scaler and generator are not touched. */
static sg_status warm_buckets(sg_trainer *t, int64_t index)
{
    for (int k = 0; k < t->n_buckets; k++) {
        if (t->bucket_warm[k]) continue;
        int64_t b = t->buckets[k];
        SG_TRY(t->seq_buckets ? sg_model_load_seq(t->m, index, b, b) : sg_model_load_padded(t->m, index, b, b));
        SG_TRY(run_forward(t->m));
        SG_TRY(run_loss(t));
        SG_TRY(run_backward(t));
        t->bucket_warm[k] = true;
    }
    return sg_model_full_shape(t->m);
}

static sg_status step_scope(sg_trainer *t, int64_t index)
{
    if (!t->g_step) {
        const sg_tensor *in[] = {t->m->batch_idx};
        if (varies(t)) SG_TRY(warm_buckets(t, index));
        sg_status st = capture(t, varies(t) ? "step.switch" : "step", run_indexed_steps, t, in, 1, &t->g_step);
        if (st != SG_OK) {
            SG_TRY(capture_failed(t, st, "step", true));
            t->armed = false;
            return host_steps(t, index);
        }
        t->next_index = -1;
    }
    int64_t batch = index * t->opts.accum; /* the step's first micro-batch */
    if (batch != t->next_index) {
        SG_TRY(sg_model_set_batch_index(t->m, batch));
        int32_t v = (int32_t)index; /* (vary_batch: the step that draws the rows, in step with the batch) */
        if (t->vary_step) SG_TRY(sg_tensor_write_small(t->vary_step, 0, &v, sizeof v));
    }
    SG_TRY(sg_model_step_begin(t->m, batch)); /* a fed batch: the stream waits for its copy */
    SG_TRY(sg_graph_replay(t->g_step));
    t->next_index = batch + (int64_t)t->opts.steps_per_call * t->opts.accum;
    return SG_OK;
}

/* Micro-batch j under model scope: the net's forward and backward replay their graphs (the
 * first armed micro-batch captures them), the loss and the sums stay eager. */
static sg_status model_micro(sg_trainer *t, int j)
{
    sg_model *m = t->m;
    if (!t->g_fwd) {
        const sg_tensor *in[] = {m->x};
        sg_status st = capture(t, "model.forward", gather_forward, t, in, 1, &t->g_fwd);
        if (st != SG_OK) {
            SG_TRY(capture_failed(t, st, "model.forward", true));
            return run_micro(t, j);
        }
    }
    SG_TRY(sg_graph_replay(t->g_fwd));
    SG_TRY(run_loss(t));
    if (!t->g_bwd) {
        const sg_tensor *in[] = {m->dlogits};
        sg_status st = capture(t, "model.backward", run_backward, t, in, 1, &t->g_bwd);
        if (st != SG_OK) {
            SG_TRY(capture_failed(t, st, "model.backward", true));
            SG_TRY(run_backward(t));
            return micro_end(t, j);
        }
    }
    SG_TRY(sg_graph_replay(t->g_bwd));
    return micro_end(t, j);
}

/* One optimizer step (of a call of several, outside a step graph): its accum micro-batches on
 * batches index*accum .. index*accum + accum-1, each loaded, then the update. Layer scope runs
 * them eagerly with the wrapped modules replaying their graphs; step scope gets here only when
 * it fell back (or before it is armed). */
static sg_status one_step(sg_trainer *t, int64_t index)
{
    int K = t->opts.accum;
    for (int j = 0; j < K; j++) {
        SG_TRY(sg_model_load_batch(t->m, index * K + j));
        if (t->armed && !t->fallback && t->opts.scope == SG_SCOPE_MODEL) SG_TRY(model_micro(t, j));
        else SG_TRY(run_micro(t, j));
    }
    return run_update(t);
}

static sg_status bucket_step(sg_trainer *t, int k);
static sg_status find_bucket(sg_trainer *t, const char *fn, bool seq, int64_t n, int *k);

/* One step outside a step graph: vary_seq draws its length and runs it padded to its bucket
 * (under step scope its bucket's graph, from the cache), else one_step. */
static sg_status host_step(sg_trainer *t, int64_t index)
{
    if (!varies(t)) return one_step(t, index);
    int k = 0;
    int64_t n = sg_vary_len(index, t->buckets[t->n_buckets - 1]);
    SG_TRY(find_bucket(t, "sg_trainer_step", t->seq_buckets, n, &k));
    SG_TRY(t->seq_buckets ? sg_model_load_seq(t->m, index, n, t->buckets[k])
                          : sg_model_load_padded(t->m, index, n, t->buckets[k]));
    return bucket_step(t, k);
}

/* The call's steps launched from the host. With an early-stop rule the rule runs on the
 * device after each step as in the step graph, and the host reads its flag before each step
 * (a sync a step). */
static sg_status host_steps(sg_trainer *t, int64_t index)
{
    int K = t->opts.steps_per_call;
    if (t->stop) SG_TRY(sg_stop_begin(t->ctx, t->stop, K));
    for (int k = 0; k < K; k++) {
        if (t->stop) {
            int32_t go = 0;
            SG_TRY(sg_tensor_copy_to_host(t->stop_go, &go, sizeof go));
            if (!go) break;
        }
        SG_TRY(host_step(t, index + k));
        if (t->stop) SG_TRY(sg_stop_check(t->ctx, t->stop, t->m->loss, K, &t->rule));
    }
    return SG_OK;
}

static sg_status trainer_step(sg_trainer *t, int64_t index);

/* Each call is one "step" range (NVTX, and the profiler's step boundaries). */
sg_status sg_trainer_step(sg_trainer *t, int64_t index)
{
    if (!t) return SG_ERR_NULL;
    int64_t per = t->opts.accum, max = INT64_MAX / per - t->opts.steps_per_call;
    if (index < 0 || index > max)
        return sg_fail(t->ctx, SG_ERR_INVALID, "sg_trainer_step: step %lld: expected 0 to %lld (optimizer steps; "
                       "step i trains on batches i*accum .. i*accum + accum-1, accum %d)", (long long)index,
                       (long long)max, t->opts.accum);
    sg_range_push(t->ctx, "step");
    sg_status st = trainer_step(t, index);
    sg_range_pop(t->ctx, "step");
    return st;
}

static sg_status trainer_step(sg_trainer *t, int64_t index)
{
    if (t->dist) SG_TRY(sg_dist_poll(t->dist)); /* a failed run fails every step, at once */
    t->armed = t->steps >= t->opts.warmup && !t->fallback && t->opts.scope != SG_SCOPE_EAGER;
    /* An eager call's ops count their work (replays count none): the first one's, per step. */
    const bool count = !t->armed && !t->work_counted;
    sg_work w0;
    if (count) sg_ctx_work(t->ctx, &w0);
    sg_status st = SG_OK;
    if (t->armed && t->opts.scope == SG_SCOPE_STEP && (!varies(t) || t->use_switch)) {
        /* The graph gathers its own batches, at the full shape (a bucket may have left less). */
        if (t->n_buckets) SG_TRY(sg_model_full_shape(t->m));
        st = step_scope(t, index);
    } else {
        st = host_steps(t, index);
    }
    if (st == SG_OK && t->dist) st = sg_dist_step_end(t->dist); /* the watchdog's progress mark */
    if (st == SG_OK && count) {
        sg_work w1;
        sg_ctx_work(t->ctx, &w1);
        double any = 0;
        for (int f = 0; f < SG_WORK_FAMILIES; f++) {
            t->work.flops[f] = (w1.flops[f] - w0.flops[f]) / t->opts.steps_per_call;
            t->work.bytes[f] = (w1.bytes[f] - w0.bytes[f]) / t->opts.steps_per_call;
            any += t->work.flops[f] + t->work.bytes[f];
        }
        t->work_counted = any > 0; /* a call that replayed a bucket's graph counted nothing */
    }
    if (t->ahead) t->stale = t->masters_stale = true; /* the update may have run, before a failure too */
    if (st == SG_OK) {
        t->steps++;
        t->host_steps += t->opts.steps_per_call;
        t->last_call_steps = t->opts.steps_per_call;
    }
    return st;
}

/* *k: the bucket that holds n, of the trainer's kind (sequence lengths when seq, else batch
 * sizes). Errors name fn: no buckets of that kind, or n outside 1..the largest. */
static sg_status find_bucket(sg_trainer *t, const char *fn, bool seq, int64_t n, int *k)
{
    const char *kind = seq ? "sequence" : "batch";
    if (!t->n_buckets || t->seq_buckets != seq)
        return sg_fail(t->ctx, SG_ERR_INVALID, "%s: the trainer has no %s buckets (sg_trainer_options.%s)", fn,
                       kind, seq ? "seq_buckets" : "batch_buckets");
    int64_t b = sg_bucket_for(t->buckets, t->n_buckets, n);
    if (n < 1 || b < 0)
        return sg_fail(t->ctx, SG_ERR_SHAPE, "%s: %lld %s: expected 1 to %lld (the largest %s bucket)", fn,
                       (long long)n, seq ? "tokens" : "rows", (long long)t->buckets[t->n_buckets - 1], kind);
    *k = 0;
    while (t->buckets[*k] != b) ++*k;
    return SG_OK;
}

/* One step on bucket k, its batch loaded and padded up to the bucket. Under step scope each
 * bucket has its own graph in the cache, keyed by its size (a trainer has one kind of bucket);
 * the bucket's first step after the trainer's warm-up runs eagerly, as the warm-up of its
 * graph: a real step, so training is the same as eager's. The batch copy-in stays outside. */
static sg_status bucket_step(sg_trainer *t, int k)
{
    int64_t b = t->buckets[k];
    t->armed = t->steps >= t->opts.warmup && !t->fallback && t->opts.scope == SG_SCOPE_STEP &&
               t->bucket_warm[k];
    sg_status st;
    if (!t->armed) {
        st = eager_step(t);
        if (st == SG_OK && t->steps >= t->opts.warmup) t->bucket_warm[k] = true;
        return st;
    } else {
        const sg_tensor *in[] = {t->m->x, t->m->targets};
        sg_graph_options o = sg_graph_options_default();
        char name[32];
        snprintf(name, sizeof name, "step.%s%lld", t->seq_buckets ? "t" : "b", (long long)b);
        o.name = name;
        o.warmup = 0;
        o.static_inputs = in;
        o.n_static_inputs = 2;
        sg_graph *g;
        st = sg_graph_cache_get(t->cache, b, run_step, t, &o, &g);
        if (st != SG_OK) {
            SG_TRY(capture_failed(t, st, name, true));
            st = eager_step(t);
        } else {
            st = sg_graph_replay(g);
        }
    }
    return st;
}

/* A step of n rows (seq false) or n tokens per row (seq true), in a "step" range. */
static sg_status bucketed(sg_trainer *t, const char *fn, bool seq, int64_t index, int64_t n)
{
    if (!t) return SG_ERR_NULL;
    int k = 0;
    SG_TRY(find_bucket(t, fn, seq, n, &k));
    sg_range_push(t->ctx, "step");
    sg_status st = seq ? sg_model_load_seq(t->m, index, n, t->buckets[k])
                       : sg_model_load_padded(t->m, index, n, t->buckets[k]);
    if (st == SG_OK) st = bucket_step(t, k);
    if (st == SG_OK) t->steps++, t->host_steps++, t->last_call_steps = 1;
    sg_range_pop(t->ctx, "step");
    return st;
}

sg_status sg_trainer_step_rows(sg_trainer *t, int64_t index, int64_t rows)
{
    return bucketed(t, "sg_trainer_step_rows", false, index, rows);
}

sg_status sg_trainer_step_seq(sg_trainer *t, int64_t index, int64_t len)
{
    return bucketed(t, "sg_trainer_step_seq", true, index, len);
}

static void add_graph(sg_trainer_stats *s, const sg_graph *g)
{
    sg_graph_stats gs;
    if (!g || sg_graph_get_stats(g, &gs) != SG_OK) return;
    s->graphs++;
    s->nodes += gs.nodes;
    s->replays += gs.replays;
    s->capture_ms += gs.capture_ms;
    s->instantiate_ms += gs.instantiate_ms;
    s->exec_bytes += gs.exec_bytes;
}

/* Bytes of the allocator block a tensor owns (0 for a view or no tensor). */
static size_t block_bytes(const sg_tensor *x) { return x && x->block ? x->block->size : 0; }

/* The static buffers by kind; the model's bytes not otherwise named are its activations. */
static void add_memory(const sg_trainer *t, sg_trainer_stats *s)
{
    const sg_model *m = t->m;
    const sg_param_set *ps = m->params;
    s->param_bytes = block_bytes(ps->flat) + block_bytes(ps->flat_lo) + block_bytes(ps->seg_start) +
                     block_bytes(ps->seg_decay);
    s->grad_bytes = block_bytes(ps->grad_flat) + block_bytes(ps->grad_flat_lo) + block_bytes(t->grad_sum) +
                    block_bytes(t->loss_sum);
    sg_tensor *om, *ov, *hp;
    sg_optim_state(t->o, &om, &ov, &hp);
    s->optim_bytes = block_bytes(om) + block_bytes(ov) + block_bytes(hp);
    s->data_bytes = m->text ? sg_text_bytes(m->text) : block_bytes(m->data->x) + block_bytes(m->data->y);
    size_t named = s->param_bytes + s->grad_bytes + s->data_bytes;
    s->activation_bytes = m->bytes > named ? m->bytes - named : 0;
    sg_pool *p = t->cache ? sg_graph_cache_pool(t->cache) : t->pool;
    if (p) sg_pool_stats(t->ctx, p, &s->graph_pool);
}

sg_status sg_trainer_get_stats(const sg_trainer *t, sg_trainer_stats *out)
{
    if (!t || !out) return SG_ERR_NULL;
    memset(out, 0, sizeof *out);
    out->scope = t->opts.scope;
    add_graph(out, t->g_step);
    add_graph(out, t->g_fwd);
    add_graph(out, t->g_bwd);
    for (int i = 0; i < t->n_wrapped; i++) {
        add_graph(out, t->wrapped[i]->fwd);
        add_graph(out, t->wrapped[i]->bwd);
        if (t->wrapped[i]->failed) out->fell_back = 1;
    }
    out->fell_back |= t->fallback;
    if (t->cache) {
        sg_graph_cache_get_stats(t->cache, &out->cache);
        out->graphs += out->cache.cached;
        out->nodes += out->cache.nodes;
        out->replays += out->cache.replays;
        out->capture_ms += out->cache.capture_ms;
        out->instantiate_ms += out->cache.instantiate_ms;
        out->exec_bytes += out->cache.exec_bytes;
    }
    snprintf(out->fallback_reason, sizeof out->fallback_reason, "%s", t->reason);
    snprintf(out->cond_note, sizeof out->cond_note, "%s", t->cond_note);
    out->work = t->work;
    out->work_counted = t->work_counted;
    add_memory(t, out);
    return SG_OK;
}

sg_status sg_trainer_get_stop(sg_trainer *t, sg_trainer_stop *out)
{
    if (!t || !out) return SG_ERR_NULL;
    memset(out, 0, sizeof *out);
    if (!t->stop) {
        out->steps_run = t->host_steps;
        out->last_call_steps = t->last_call_steps;
        return SG_OK;
    }
    int32_t s[SG_STOP_STATE];
    SG_TRY(sg_tensor_copy_to_host(t->stop, s, sizeof s));
    out->steps_run = s[SG_STOP_TOTAL];
    out->last_call_steps = s[SG_STOP_STEPS];
    out->stopped = (sg_stop_reason)s[SG_STOP_REASON];
    return SG_OK;
}

/* ---- evaluation and checkpoints ---- */

sg_status sg_trainer_eval(sg_trainer *t, int split, int n_batches, float *out)
{
    if (!t || !out) return SG_ERR_NULL;
    sg_model *m = t->m;
    if (n_batches < 1 || (split != 0 && split != 1) || (split == 1 && sg_model_split_size(m, 1) <= 0))
        return sg_fail(t->ctx, SG_ERR_INVALID, "sg_trainer_eval: split %d, %d batches: expected split 0, or 1 "
                       "for models with a validation split, and at least one batch", split, n_batches);
    SG_TRY(flush_shares(t));
    /* Eagerly (graphed modules would replay their training graphs), dropout off. */
    bool armed = t->armed;
    t->armed = false;
    sg_model_set_eval(m, true);
    m->split = split;
    double sum = 0;
    sg_status st = SG_OK;
    for (int b = 0; b < n_batches && st == SG_OK; b++) {
        float l = 0;
        st = sg_model_load_batch(m, b);
        if (st == SG_OK) st = sg_module_forward(m->net, m->x, &m->logits);
        if (st == SG_OK) st = m->loss_kind == SG_LOSS_MSE ? sg_mse(t->ctx, m->logits, m->targets, 1.0f, m->loss, NULL)
                                                          : sg_softmax_xent(t->ctx, m->logits, m->targets, 1.0f, m->loss, NULL);
        if (st == SG_OK) st = sg_model_loss_read(m, &l);
        sum += l;
    }
    sg_model_set_eval(m, false);
    m->split = 0;
    t->armed = armed;
    t->next_index = -1; /* the loads moved the step graph's batch counter: the next step resets it */
    double mean = sum / n_batches;
    if (st == SG_OK && t->dist) st = sg_dist_average_host(t->dist, &mean, 1); /* each rank saw its rows */
    if (st == SG_OK) *out = (float)mean;
    return st;
}

/* ---- checkpoints of a sharded optimizer: the state whole, gathered from every rank's shares ---- */

sg_status sg_trainer_gather_params(sg_trainer *t)
{
    if (!t) return SG_ERR_NULL;
    if (!t->shard) return SG_OK;
    SG_TRY(flush_shares(t));
    if (t->sh_param_lo) SG_TRY(sg_dist_gather_shards(t->dist, t->sps.flat, t->m->params->flat)); /* the masters */
    t->masters_stale = false;
    return sg_ctx_sync(t->ctx);
}

/* Whole-model tensors for the optimizer's moments (NULL where it has none), unset: a save
 * gathers into every element, a load reads every element. */
static sg_status whole_state(sg_trainer *t, sg_tensor **wm, sg_tensor **wv)
{
    sg_tensor *m, *v, *hp;
    sg_optim_state(t->o, &m, &v, &hp);
    int64_t P = t->m->params->flat->numel;
    *wm = *wv = NULL;
    SG_TRY(sg_tensor_create(t->ctx, m->dtype, 1, &P, "optim.m", wm));
    return v ? sg_tensor_create(t->ctx, v->dtype, 1, &P, "optim.v", wv) : SG_OK;
}

/* Every parameter and buffer by name, the optimizer state (wm, wv when not NULL: whole copies
 * of a sharded optimizer's), the generator. */
static int ckpt_entries(sg_trainer *t, sg_ckpt_entry *e, int cap, sg_tensor *wm, sg_tensor *wv)
{
    sg_param_set *ps = t->m->params;
    int n = 0;
    for (int i = 0; i < ps->count && n < cap; i++) e[n++] = (sg_ckpt_entry){ps->info[i].name, ps->param[i]};
    const sg_param_set *bs = &t->m->b->bufs;
    for (int i = 0; i < bs->count && n < cap; i++) e[n++] = (sg_ckpt_entry){bs->info[i].name, bs->param[i]};
    sg_tensor *om, *ov, *hp;
    sg_optim_state(t->o, &om, &ov, &hp);
    if (wm) om = wm, ov = wv;
    if (n < cap) e[n++] = (sg_ckpt_entry){"optim.m", om};
    if (ov && n < cap) e[n++] = (sg_ckpt_entry){"optim.v", ov};
    if (n < cap) e[n++] = (sg_ckpt_entry){"optim.hparams", hp};
    if (t->m->rng && n < cap) e[n++] = (sg_ckpt_entry){"rng", t->m->rng};
    if (n < cap) e[n++] = (sg_ckpt_entry){"amp.scaler", t->m->scaler};
    return n;
}

/* The checkpoint written: the model's tensors and the optimizer's state, its moments from wm
 * and wv when they are the whole of a sharded run's (NULL: the optimizer's own). */
static sg_status write_checkpoint(sg_trainer *t, int64_t step, const char *path, sg_tensor *wm, sg_tensor *wv)
{
    int cap = t->m->params->count + t->m->b->bufs.count + 8;
    sg_ckpt_entry *e = malloc((size_t)cap * sizeof *e);
    if (!e) return sg_fail(t->ctx, SG_ERR_OOM, "sg_trainer_save: out of host memory");
    int n = ckpt_entries(t, e, cap, wm, wv);
    char steps[32], accum[16];
    snprintf(steps, sizeof steps, "%lld", (long long)step);
    snprintf(accum, sizeof accum, "%d", t->opts.accum);
    /* "accum" only when it is not 1, "optim_state" only when it is not F32: checkpoints of
     * other runs stay as they were. */
    sg_dtype sdt = sg_optim_state_dtype(t->o);
    const char *meta[14] = {"format", "stepgraph-1", "model", t->m->name, "step", steps,
                            "precision", sg_dtype_name(t->m->precision)};
    int k = 8;
    if (t->opts.accum > 1) meta[k++] = "accum", meta[k++] = accum;
    if (sdt != SG_DTYPE_F32) meta[k++] = "optim_state", meta[k++] = sg_dtype_name(sdt);
    meta[k] = NULL;
    sg_status st = sg_checkpoint_save(t->ctx, path, e, n, meta);
    free(e);
    return st;
}

/* A sharded save's agreement: every rank learns whether some rank's step failed (local: this
 * rank's outcome), so all go on or all stop together. SG_OK when none failed; else this rank's
 * own error, or on the others `code` with "sg_trainer_save: 'path': <why>". */
static sg_status save_agree(sg_trainer *t, sg_status local, const char *path, sg_status code, const char *why)
{
    double failed = local != SG_OK;
    sg_status st = sg_dist_average_host(t->dist, &failed, 1);
    if (local != SG_OK) return local;
    if (st != SG_OK) return st;
    return failed > 0 ? sg_fail(t->ctx, code, "sg_trainer_save: '%s': %s", path, why) : SG_OK;
}

sg_status sg_trainer_save(sg_trainer *t, int64_t step, const char *path)
{
    if (!t || !path) return SG_ERR_NULL;
    if (step < 0 || step > SG_TRAINER_MAX_STEP)
        return sg_fail(t->ctx, SG_ERR_INVALID, "sg_trainer_save: '%s': step %lld: expected 0 to %lld",
                       path, (long long)step, (long long)SG_TRAINER_MAX_STEP);
    if (!t->shard) return write_checkpoint(t, step, path, NULL, NULL);
    /* Sharded: every rank allocates the whole state, and all learn whether every rank could
     * before any gather (one that could not would leave the others in their gathers until the
     * watchdog's timeout); every rank gathers the masters and the moments whole; rank 0 writes
     * them; then every rank learns rank 0's outcome, so each returns once the file is complete
     * (a rank that resumes from it at once finds it), or with an error when rank 0 could not
     * write it. */
    sg_tensor *wm = NULL, *wv = NULL, *om, *ov, *hp;
    sg_optim_state(t->o, &om, &ov, &hp);
    sg_status st = whole_state(t, &wm, &wv);
    const char *inj = getenv("SG_DIST_INJECT_SAVE"); /* test hook: this rank cannot allocate */
    if (st == SG_OK && inj && atoi(inj) == sg_dist_rank(t->dist))
        st = sg_fail(t->ctx, SG_ERR_OOM, "sg_trainer_save: '%s': the gathered state not allocated (test hook "
                     "SG_DIST_INJECT_SAVE)", path);
    st = save_agree(t, st, path, SG_ERR_OOM, "another rank could not allocate the gathered state (its error "
                    "names why); nothing was written");
    if (st == SG_OK) st = sg_trainer_gather_params(t);
    if (st == SG_OK) st = sg_dist_gather_shards(t->dist, om, wm);
    if (st == SG_OK && ov) st = sg_dist_gather_shards(t->dist, ov, wv);
    if (st == SG_OK) st = sg_ctx_sync(t->ctx);
    sg_status wrote = st == SG_OK && sg_dist_rank(t->dist) == 0 ? write_checkpoint(t, step, path, wm, wv) : SG_OK;
    sg_tensor_destroy(wm);
    sg_tensor_destroy(wv);
    if (st != SG_OK) return st; /* a failed gather fails the run: the others' collectives fail too */
    return save_agree(t, wrote, path, SG_ERR_IO, "rank 0 could not write the checkpoint (its error names why)");
}

typedef struct ckpt_meta {
    const sg_trainer *t;
    int64_t step;
} ckpt_meta;

/* The value of key, or SG_ERR_INVALID naming the key when it is absent or too long. */
static sg_status meta_value(sg_ctx *ctx, const char *path, const char *meta, const char *key,
                            char *v, size_t cap)
{
    if (sg_checkpoint_meta_get(meta, key, v, cap) == SG_OK) return SG_OK;
    return sg_fail(ctx, SG_ERR_INVALID, "sg_trainer_load: '%s': metadata %s is missing or longer "
                   "than %zu bytes", path, key, cap - 1);
}

/* The metadata of a stepgraph checkpoint, checked by sg_checkpoint_load_ex before it writes
 * any tensor: a bad value refuses the file with the trainer unchanged. */
static sg_status ckpt_meta_check(sg_ctx *ctx, const char *path, const char *meta, void *user)
{
    ckpt_meta *cm = user;
    const char *name = cm->t->m->name, *f32 = sg_dtype_name(SG_DTYPE_F32),
               *bf16 = sg_dtype_name(SG_DTYPE_BF16);
    char v[128];
    SG_TRY(meta_value(ctx, path, meta, "format", v, sizeof v));
    if (strcmp(v, "stepgraph-1"))
        return sg_fail(ctx, SG_ERR_INVALID, "sg_trainer_load: '%s': metadata format '%s' is not "
                       "'stepgraph-1'", path, v);
    SG_TRY(meta_value(ctx, path, meta, "model", v, sizeof v));
    if (strcmp(v, name))
        return sg_fail(ctx, SG_ERR_INVALID, "sg_trainer_load: '%s' holds model '%s', this is '%s'",
                       path, v, name);
    SG_TRY(meta_value(ctx, path, meta, "precision", v, sizeof v));
    if (strcmp(v, f32) && strcmp(v, bf16))
        return sg_fail(ctx, SG_ERR_INVALID, "sg_trainer_load: '%s': metadata precision '%s' is not "
                       "'%s' or '%s'", path, v, f32, bf16);
    /* The optimizer state's dtype (absent: F32) must be this optimizer's: the tensors load as
     * they are. */
    const char *state = sg_dtype_name(sg_optim_state_dtype(cm->t->o));
    if (sg_checkpoint_meta_get(meta, "optim_state", v, sizeof v) != SG_OK) strcpy(v, f32);
    if (strcmp(v, state))
        return sg_fail(ctx, SG_ERR_DTYPE, "sg_trainer_load: '%s' holds %s optimizer state, this optimizer keeps %s: "
                       "set the same with sg_optim_set_state_dtype (the CLI: --optim-state %s) before loading",
                       path, v, state, strcmp(v, bf16) ? "f32" : "bf16");
    SG_TRY(meta_value(ctx, path, meta, "step", v, sizeof v));
    if (!sg_parse_decimal(v, strlen(v), SG_TRAINER_MAX_STEP, &cm->step))
        return sg_fail(ctx, SG_ERR_INVALID, "sg_trainer_load: '%s': metadata step '%s' is not a "
                       "whole number from 0 to %lld (decimal digits, no sign or leading zero)",
                       path, v, (long long)SG_TRAINER_MAX_STEP);
    /* Steps count optimizer steps of accum batches (absent: 1): the saving run's next batch is
     * step * accum, and this trainer resumes at the step that starts there, when one does. */
    int64_t accum = 1, mine = cm->t->opts.accum;
    if (sg_checkpoint_meta_get(meta, "accum", v, sizeof v) == SG_OK &&
        (!sg_parse_decimal(v, strlen(v), 1024, &accum) || accum < 1))
        return sg_fail(ctx, SG_ERR_INVALID, "sg_trainer_load: '%s': metadata accum '%s' is not a whole number "
                       "from 1 to 1024", path, v);
    int64_t batch = cm->step <= INT64_MAX / accum ? cm->step * accum : -1;
    if (batch < 0 || batch % mine || batch / mine > SG_TRAINER_MAX_STEP)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_trainer_load: '%s' was saved at step %lld of %lld batch%s each "
                       "(accum %lld): its next batch, %lld, starts no step of this trainer's %lld batches; resume "
                       "with an accum that divides %lld", path, (long long)cm->step, (long long)accum,
                       accum == 1 ? "" : "es", (long long)accum, (long long)batch, (long long)mine, (long long)batch);
    cm->step = batch / mine;
    return SG_OK;
}

sg_status sg_trainer_load(sg_trainer *t, const char *path, int64_t *step)
{
    if (!t || !path || !step) return SG_ERR_NULL;
    /* Sharded: the moments load whole, then each rank keeps its shares of them and of the masters. */
    sg_tensor *wm = NULL, *wv = NULL;
    if (t->shard) {
        sg_status st = whole_state(t, &wm, &wv);
        if (st != SG_OK) {
            sg_tensor_destroy(wm);
            sg_tensor_destroy(wv);
            return st;
        }
    }
    int cap = t->m->params->count + t->m->b->bufs.count + 8;
    sg_ckpt_entry *e = malloc((size_t)cap * sizeof *e);
    sg_status st = e ? SG_OK : sg_fail(t->ctx, SG_ERR_OOM, "sg_trainer_load: out of host memory");
    ckpt_meta cm = {t, 0};
    if (st == SG_OK) st = sg_checkpoint_load_ex(t->ctx, path, e, ckpt_entries(t, e, cap, wm, wv), NULL, 0,
                                                ckpt_meta_check, &cm);
    free(e);
    if (st == SG_OK && t->shard) {
        sg_tensor *om, *ov, *hp;
        sg_optim_state(t->o, &om, &ov, &hp);
        st = copy_owned(t, t->m->params->flat, t->sps.flat, true);
        if (st == SG_OK) st = copy_owned(t, wm, om, true);
        if (st == SG_OK && ov) st = copy_owned(t, wv, ov, true);
        /* The shares' bf16 copies too: a skipped first step gathers them as they are. */
        if (st == SG_OK && t->sh_param_lo) st = sg_tensor_convert(t->sh_param_lo, t->sps.flat);
        if (st == SG_OK) st = sg_ctx_sync(t->ctx);
    }
    sg_tensor_destroy(wm);
    sg_tensor_destroy(wv);
    SG_TRY(st);
    *step = cm.step;
    /* Without loss scaling the scale stays 1, whatever scaler the checkpoint held (a run with
     * dynamic scaling resumes without it); the step and skip counts are kept. */
    const float one = 1.f;
    if (t->m->unscaled) SG_TRY(sg_tensor_write_small(t->m->scaler, offsetof(sg_loss_scaler, scale), &one, sizeof one));
    /* The master weights are f32 in either precision, so a checkpoint resumes in both; the
     * bf16 compute copies are rebuilt from them (whole: nothing left to gather). */
    SG_TRY(sg_params_sync_lowp(t->m->params));
    t->stale = t->masters_stale = false;
    return SG_OK;
}

sg_status sg_trainer_get_scaler(sg_trainer *t, sg_loss_scaler *out)
{
    if (!t || !out) return SG_ERR_NULL;
    return sg_tensor_copy_to_host(t->m->scaler, out, sizeof *out);
}

sg_status sg_trainer_set_scaler(sg_trainer *t, const sg_loss_scaler *in)
{
    if (!t || !in) return SG_ERR_NULL;
    if (!(in->scale > 0) || !(in->growth_interval >= 1) || !(in->good_steps >= 0) || !(in->skipped >= 0) ||
        !isfinite(in->growth_interval) || !isfinite(in->good_steps) || !isfinite(in->skipped))
        return sg_fail(t->ctx, SG_ERR_INVALID, "sg_trainer_set_scaler: scale %g (> 0), growth_interval %g (>= 1), "
                       "good_steps %g, skipped %g (>= 0, finite): a field out of range", (double)in->scale,
                       (double)in->growth_interval, (double)in->good_steps, (double)in->skipped);
    if (t->m->unscaled && in->scale != 1.f)
        return sg_fail(t->ctx, SG_ERR_INVALID, "sg_trainer_set_scaler: scale %g: model '%s' trains without loss "
                       "scaling (SG_LOSS_SCALING_NONE), its scale is 1", (double)in->scale, t->m->name);
    return sg_tensor_copy_from_host(t->m->scaler, in, sizeof *in);
}
