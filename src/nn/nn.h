/* nn.h: modules with explicit forward and backward, the parameter set (every parameter and
 * every gradient in one allocation each, so addresses never move), initialisation, and the
 * host RNG models draw their initial state from. Used by src/models/. */
#ifndef SG_NN_H
#define SG_NN_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- parameter set ---- */

/* Names are hierarchical ("blocks.3.attn.qkv.weight"): the checkpoint's. */
#define SG_PARAM_NAME_MAX 128

typedef struct sg_param_info {
    char name[SG_PARAM_NAME_MAX];
    int ndim;
    int64_t shape[SG_MAX_DIMS];
    int64_t offset, numel;       /* in elements of the flat buffer */
    int decay;                   /* weight decay applies */
    sg_init init;
    int64_t fan_in;
} sg_param_info;

typedef struct sg_param_set {
    sg_ctx *ctx;
    int count, cap;                       /* the arrays below hold cap entries (grown as declared) */
    int64_t total;                        /* elements */
    sg_param_info *info;
    sg_tensor *flat, *grad_flat;          /* (total) F32 each: one allocation apiece */
    sg_tensor **param;                    /* views into flat */
    sg_tensor **grad;                     /* views into grad_flat */
    sg_tensor *seg_start, *seg_decay;     /* (count+1), (count) I32: for the fused optimizers */
    /* Mixed precision (sg_params_allocate_lowp): bf16 compute copies of the parameters, which
     * the forward and backward read, and bf16 gradients, which the backward writes (scaled by
     * the loss scale), each one allocation of the same layout with views by parameter. The
     * fp32 buffers above stay the master weights and the unscaled gradients the optimizer reads. */
    sg_tensor *flat_lo, *grad_flat_lo;
    sg_tensor **param_lo, **grad_lo;
} sg_param_set;

/* Declares a parameter before allocation; returns its index (or -1 with ctx's error set: a
 * name too long or already declared, a bad shape, out of memory). */
int sg_params_declare(sg_param_set *ps, const char *name, int ndim, const int64_t *shape,
                      int decay, sg_init init, int64_t fan_in);
/* Allocates the flat buffers and views, and initialises every parameter from seed. */
sg_status sg_params_allocate(sg_param_set *ps, uint64_t seed);
/* After sg_params_allocate: the bf16 copies and gradients above, the copies filled from the
 * master weights. */
sg_status sg_params_allocate_lowp(sg_param_set *ps);
/* Refreshes the bf16 copies from the master weights (after a checkpoint load); no-op without
 * them. The optimizer keeps them current during training (it writes both in one pass). */
sg_status sg_params_sync_lowp(sg_param_set *ps);
/* The tensors the modules read and write: the bf16 copies when allocated, else the masters. */
static inline sg_tensor *sg_params_compute(sg_param_set *ps, int i)
{
    return ps->flat_lo ? ps->param_lo[i] : ps->param[i];
}
static inline sg_tensor *sg_params_compute_grad(sg_param_set *ps, int i)
{
    return ps->grad_flat_lo ? ps->grad_lo[i] : ps->grad[i];
}
/* Frees the buffers, the views and the arrays. */
void sg_params_release(sg_param_set *ps);

/* ---- modules ---- */

/* The passes every module implements; built-in modules fill it directly, a user's module
 * (sg_module_create) through its public sg_module_ops. */
typedef struct sg_module_i {
    const char *kind;
    /* Reads x, writes the module's own output tensor and returns it through *y. */
    sg_status (*forward)(sg_module *m, const sg_tensor *x, const sg_tensor **y);
    /* Given dy (which it may overwrite), writes parameter gradients and, unless
     * m->no_input_grad, the input gradient into the module's own dx (*dx). */
    sg_status (*backward)(sg_module *m, sg_tensor *dy, sg_tensor **dx);
    /* Frees the module (and, for containers, its children). */
    void (*destroy)(sg_module *m);
    /* Optional: run the next passes on the first `rows` rows of the module's buffers. */
    sg_status (*set_rows)(sg_module *m, int64_t rows);
    /* Optional: once the parameters are allocated, before any pass (sg_builder_finish): bind
     * parameter tensors, allocate what depends on no_input_grad; containers pass it on. */
    sg_status (*finish)(sg_module *m);
} sg_module_i;

#define SG_MODULE_NAME_MAX 96

struct sg_module {
    const sg_module_i *vt;
    sg_ctx *ctx;
    char name[SG_MODULE_NAME_MAX];   /* with the builder's scope: "blocks.3.attn" */
    char range[2][SG_MODULE_NAME_MAX + 16]; /* "<name>.forward", "<name>.backward": on first use */
    sg_builder *b;                   /* the builder that made it (its parameters live there) */
    int first_param;                 /* the first parameter it or its children declared (-1) */
    bool no_input_grad;              /* the model's first module: dx is not needed */
    bool owned;                      /* handed to a container or a model */
    int region;                      /* the recompute region it was made in (-1: none) */
};

/* What the modules of one model share, from sg_builder_create to the model's end: the
 * parameters they declare, the options, dropout's generator, shared scratch. The public
 * sg_builder; the model (models/) keeps it after sg_builder_finish. */
typedef struct sg_shared_buf {
    char name[SG_MODULE_NAME_MAX];
    sg_tensor *t;
} sg_shared_buf;

struct sg_builder {
    sg_ctx *ctx;
    char name[64];                   /* the model's */
    sg_builder_options opts;
    int64_t batch, rows;             /* this shard's batch; rows = batch (x seq) */
    sg_param_set params;
    sg_param_set bufs;               /* buffers (sg_module_declare_buffer): state not trained */
    bool eval;                       /* passes for evaluation: dropout off */
    sg_tensor *rng;                  /* (4) I32: dropout's seed and offset (made on demand) */
    uint32_t sites;                  /* dropout call sites handed out so far */
    sg_shared_buf *shared;
    int n_shared, cap_shared;
    sg_module **made;                /* every module made, for sg_builder_destroy */
    int n_made, cap_made;
    char scope[160];
    unsigned short scope_at[80]; /* where each pushed scope begins in `scope` (a pop ends it there) */
    int scope_depth;
    int blocks;                      /* GPT blocks made so far (their dx buffers alternate) */
    /* Activation recompute (recompute.c): the region being made (-1: none) and where in
     * `made` it began; each region's buffer bytes; the buffers to place (bound when the model
     * is built, in one arena every region shares); a module of a region destroyed before then. */
    int rc_open, rc_first_made;
    int n_regions;
    size_t *rc_bytes;
    struct sg_rc_buffer *rc;
    int n_rc, cap_rc;
    bool rc_broken;
    sg_tensor *arena;                /* (bytes of the largest region) U8-like: F32 elements */
    bool recomputing;                /* a recompute wrapper is running its region's forward again
                                      * (sg_module_updates_buffers is 0) */
    size_t bytes0;                   /* the context's bytes in use when the builder was made */
    bool finished;
};

/* Common set-up of a module made by b: vt, ctx, name (scope applied; an empty name shows as
 * the kind), registration for clean-up. mod points at a zeroed struct that starts with
 * sg_module; on failure it is freed. */
sg_status sg_module_init(sg_builder *b, sg_module *mod, const sg_module_i *vt, const char *name);
/* Declares a parameter named "<module>.<what>" (just "<what>" for an empty module name). */
int sg_module_declare(sg_module *mod, const char *what, int ndim, const int64_t *shape, sg_init init,
                      int64_t fan_in, int decay);
/* Marks children as owned by a container; fails for one already owned or from another builder. */
sg_status sg_module_adopt(sg_module *parent, sg_module **children, int n);
/* Frees m whoever owns it (containers free their children with it). */
static inline void sg_module_free(sg_module *m)
{
    if (m) m->vt->destroy(m);
}
/* Calls m's finish (and its children's, through the containers' own finish). */
static inline sg_status sg_module_finish(sg_module *m)
{
    return m->vt->finish ? m->vt->finish(m) : SG_OK;
}
/* The module's compute tensor (bf16 copy or master) and gradient for parameter p. */
static inline sg_tensor *sg_module_w(const sg_module *m, int p)
{
    return p < 0 ? NULL : sg_params_compute(&m->b->params, p);
}
static inline sg_tensor *sg_module_g(const sg_module *m, int p)
{
    return p < 0 ? NULL : sg_params_compute_grad(&m->b->params, p);
}
/* A buffer of the module's own, (dims) in dt, named "<module>.<what>". */
sg_status sg_module_buffer(sg_module *mod, sg_dtype dt, const char *what, int ndim, const int64_t *shape,
                           sg_tensor **out);
/* A buffer never placed in a recompute region's arena: its contents are set when the module
 * is made (constants), or it must outlive the region's passes. */
sg_status sg_module_buffer_kept(sg_module *mod, sg_dtype dt, const char *what, int ndim, const int64_t *shape,
                                sg_tensor **out);
/* recompute.c: inside an open region, the buffer sg_module_buffer makes for mod (no storage
 * until sg_builder_bind_recompute); the arena's placement at sg_builder_finish (after the
 * modules' finish, before any pass): refuses a region left open or one whose module was
 * destroyed. */
sg_status sg_recompute_buffer(sg_module *mod, sg_dtype dt, const char *name, int ndim, const int64_t *shape,
                              sg_tensor **out);
sg_status sg_builder_bind_recompute(sg_builder *b);
/* Checks the vision modules share (vision.c, effnet.c). The builder's precision is one the
 * vision modules run (f32 or bf16); fn and name go in the message. */
sg_status sg_vision_precision(sg_builder *b, const char *fn, const char *name);
/* Every size of an image shape (H, W, C) is at least 1; `what` names the shape in the message. */
sg_status sg_vision_check_hwc(sg_builder *b, const char *fn, const char *name, const char *what, int64_t H,
                              int64_t W, int64_t C);
/* t is (rows, hwc[0], hwc[1], hwc[2]) in the model's precision (f32 too when f32_ok: a bf16
 * model's first convolution): the image batch m was made for (`what`: "input", or a branch's
 * output in a residual block). */
sg_status sg_vision_check_image(sg_module *m, const char *what, const sg_tensor *t, int64_t rows,
                                const int64_t hwc[3], bool f32_ok);
/* The errors of a backward before its forward, and of one with no input gradient buffer (the
 * model not finished); module.c. */
sg_status sg_module_no_forward(sg_module *m);
sg_status sg_module_no_dx(sg_module *m);
/* Dropout's generator (made on first use) and n consecutive call sites for this module. */
sg_status sg_builder_rng(sg_builder *b, uint32_t n_sites, sg_tensor **rng, uint32_t *first_site);
/* Frees what the builder holds beyond the modules (after them): shared buffers, the generator,
 * the parameters, the builder. */
void sg_builder_release(sg_builder *b);

/* The module's name in errors and ranges: its kind when its name is empty. */
static inline const char *sg_module_label(const sg_module *m)
{
    return m->name[0] ? m->name : m->vt->kind;
}

/* Forward and backward name the module on the context while they queue work, so that an
 * error during capture says which module made the forbidden call, and run inside a named
 * range ("blocks.3.forward"): NVTX for Nsight Systems, and the profiler's traces. */
/* The module's range name for pass 0 (forward) or 1 (backward), formatted once, not per step. */
static inline const char *sg_module_range(sg_module *m, int pass)
{
    if (!m->range[pass][0])
        snprintf(m->range[pass], sizeof m->range[pass], "%s.%s", sg_module_label(m), pass ? "backward" : "forward");
    return m->range[pass];
}
static inline sg_status sg_module_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    const char *range = sg_module_range(m, 0);
    sg_range_push(m->ctx, range);
    const char *prev = sg_ctx_set_module(m->ctx, sg_module_label(m));
    sg_status st = m->vt->forward(m, x, y);
    sg_ctx_set_module(m->ctx, prev);
    sg_range_pop(m->ctx, range);
    return st;
}
static inline sg_status sg_module_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    const char *range = sg_module_range(m, 1);
    sg_range_push(m->ctx, range);
    const char *prev = sg_ctx_set_module(m->ctx, sg_module_label(m));
    sg_status st = m->vt->backward(m, dy, dx);
    sg_ctx_set_module(m->ctx, prev);
    sg_range_pop(m->ctx, range);
    return st;
}

/* Sets the batch rows of m (and its children); a module without the slot keeps its rows. */
static inline sg_status sg_module_set_rows(sg_module *m, int64_t rows)
{
    return m->vt->set_rows ? m->vt->set_rows(m, rows) : SG_OK;
}

/* A Sequential's children, for wrappers that replace one (graphed modules). */
int sg_sequential_count(const sg_module *seq);
sg_module *sg_sequential_child(const sg_module *seq, int i);
/* Puts m in place of child i and returns the child it replaced (now owned by the caller). */
sg_module *sg_sequential_replace(sg_module *seq, int i, sg_module *m);
/* fn(user, i) runs after child i's backward has been queued (children go from the last to
 * the first), so a caller can act on the gradients that are final from then on (data
 * parallelism starts their all-reduce); its error fails the backward. fn NULL: none. */
typedef sg_status (*sg_child_hook)(void *user, int child);
void sg_sequential_set_backward_hook(sg_module *seq, sg_child_hook fn, void *user);
/* The same before each child's forward (fn(user, i), then child i's forward). */
void sg_sequential_set_forward_hook(sg_module *seq, sg_child_hook fn, void *user);

/* ---- optimizers (the public sg_optim_* calls live in optim.c; creation takes a model,
 * so the public sg_optim_create is in models/, which calls this) ---- */
sg_status sg_optim_create_for(sg_ctx *ctx, sg_param_set *ps, sg_optim_kind kind, sg_optim **out);
/* The optimizer's device state, for checkpoints: m, v (NULL for SGD) and the hyperparameters.
 * m and v are NULL until allocated: sg_optim_alloc_state (sg_trainer_create calls it; so does
 * the first update) makes them, zeroed, in the state dtype (sg_optim_set_state_dtype). */
void sg_optim_state(sg_optim *o, sg_tensor **m, sg_tensor **v, sg_tensor **hp);
sg_status sg_optim_alloc_state(sg_optim *o);
/* A sharded optimizer (sg_trainer with shard_optimizer): from now on the optimizer updates ps
 * (not owned; the compact buffers of this rank's shares: flat, grad_flat, the segment tables)
 * and keeps its state at ps's size, zeroed. Before the first update only. ps NULL: the trainer
 * that sharded it is going; its state is freed, and every later call that needs parameters
 * fails naming why. */
sg_status sg_optim_use_params(sg_optim *o, sg_param_set *ps);
/* Mixed precision: the backward writes bf16 gradients (grad_lo, (P) BF16, scaled by the loss
 * scale in scaler); sg_optim_unscale turns them into the f32 ones (divided by the scale) and
 * sets found (1 I32) when they are not finite, updating the scale; sg_optim_update then skips
 * on found and writes the new parameters' bf16 copy into param_lo ((P) BF16). Reserves the
 * unscale kernel's scratch now, so steps and captures allocate nothing. Not owned: they must
 * outlive the optimizer's use of them. scaler and found NULL: mixed precision without loss
 * scaling (SG_LOSS_SCALING_NONE): sg_optim_unscale only widens the bf16 gradients into the f32
 * ones, sg_optim_unscale_sum and sg_optim_check do nothing (inv stays 1) and no step is skipped. */
sg_status sg_optim_set_mixed(sg_optim *o, const sg_tensor *grad_lo, sg_tensor *scaler,
                             sg_tensor *found, sg_tensor *param_lo);
/* The two halves of a step for callers that act in between (clipping, accumulation): unscale
 * (a no-op without mixed precision; the f32 gradients written), then the fused update reading
 * them. */
sg_status sg_optim_unscale(sg_optim *o);
sg_status sg_optim_update(sg_optim *o);
/* sg_optim_step's halves: the check of the scaled gradients and the scaler update without the
 * f32 copy (sg_amp_check; a no-op without mixed precision), then the update that unscales the
 * bf16 gradients as it reads them (sg_adamw_step_amp; sg_optim_update without mixed
 * precision). Bit for bit the two halves above, a pass over the gradients fewer. */
sg_status sg_optim_check(sg_optim *o);
sg_status sg_optim_update_amp(sg_optim *o);
/* Clipping with the unscale folded (mixed precision): inv (1 F32: sg_optim_check's 1 / scale,
 * for sg_clip_sumsq_amp) and factor (1 F32: the slot sg_clip_factor_sums writes), views of one
 * 2-element tensor; NULL without mixed precision. sg_optim_update_amp_clipped then multiplies
 * the bf16 gradients by both as it reads them: bit for bit sg_optim_unscale, sg_clip_grad_norm
 * and sg_optim_update, without the f32 gradients. */
void sg_optim_amp_slots(sg_optim *o, sg_tensor **inv, sg_tensor **factor);
sg_status sg_optim_update_amp_clipped(sg_optim *o);
/* sg_optim_update on the f32 gradients times factor (1 F32, device; sg_clip_factor's) as each
 * is read: bit for bit scaling them by it first (sg_clip_grad_norm), without that pass. */
sg_status sg_optim_update_by(sg_optim *o, const sg_tensor *factor);
/* Gradient accumulation under mixed precision: the f32 gradients hold the sum of the
 * micro-batches' bf16 gradients, still scaled (all by the same scale): unscaled in place,
 * found set when the sum is not finite (some micro-batch's gradients were not, or the sum
 * overflowed), the scale updated: once per optimizer step. A no-op without mixed precision. */
sg_status sg_optim_unscale_sum(sg_optim *o);

#ifdef __cplusplus
}
#endif
#endif
