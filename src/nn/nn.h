/* nn.h: modules with explicit forward and backward, the parameter set (every parameter and
 * every gradient in one allocation each, so addresses never move), initialisation, and the
 * host RNG models draw their initial state from. Used by src/models/. */
#ifndef SG_NN_H
#define SG_NN_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- host RNG (splitmix64): the same seed gives the same parameters on every backend ---- */

typedef struct sg_rng {
    uint64_t state;
} sg_rng;

uint64_t sg_rng_next(sg_rng *r);
double sg_rng_uniform(sg_rng *r);            /* [0, 1) */
double sg_rng_normal(sg_rng *r);             /* N(0, 1), Box-Muller */

/* ---- parameter set ---- */

/* The largest model a name can give: gpt depth 64 declares 12 * 64 + 5 = 773 tensors (256
 * refused gpt-64-21-1-8 after the name was accepted). test_model builds it. */
#define SG_MAX_PARAMS 1024

typedef enum sg_init {
    SG_INIT_UNIFORM_FAN_IN = 0,  /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's Linear default */
    SG_INIT_ZEROS,
    SG_INIT_ONES,
    SG_INIT_NORMAL_002           /* N(0, 0.02): GPT-2 */
} sg_init;

typedef struct sg_param_info {
    char name[64];
    int ndim;
    int64_t shape[SG_MAX_DIMS];
    int64_t offset, numel;       /* in elements of the flat buffer */
    int decay;                   /* weight decay applies */
    sg_init init;
    int64_t fan_in;
} sg_param_info;

typedef struct sg_param_set {
    sg_ctx *ctx;
    int count;
    int64_t total;                        /* elements */
    sg_param_info info[SG_MAX_PARAMS];
    sg_tensor *flat, *grad_flat;          /* (total) F32 each: one allocation apiece */
    sg_tensor *param[SG_MAX_PARAMS];      /* views into flat */
    sg_tensor *grad[SG_MAX_PARAMS];       /* views into grad_flat */
    sg_tensor *seg_start, *seg_decay;     /* (count+1), (count) I32: for the fused optimizers */
    /* Mixed precision (sg_params_allocate_lowp): bf16 compute copies of the parameters, which
     * the forward and backward read, and bf16 gradients, which the backward writes (scaled by
     * the loss scale), each one allocation of the same layout with views by parameter. The
     * fp32 buffers above stay the master weights and the unscaled gradients the optimizer reads. */
    sg_tensor *flat_lo, *grad_flat_lo;
    sg_tensor *param_lo[SG_MAX_PARAMS], *grad_lo[SG_MAX_PARAMS];
} sg_param_set;

/* Declares a parameter before allocation; returns its index (or -1 with ctx's error set). */
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
void sg_params_release(sg_param_set *ps);

/* ---- modules ---- */

typedef struct sg_module sg_module;

typedef struct sg_module_i {
    const char *kind;
    /* Reads x, writes the module's own output tensor and returns it through *y. */
    sg_status (*forward)(sg_module *m, const sg_tensor *x, const sg_tensor **y);
    /* Given dy (which it may overwrite), writes parameter gradients and, unless this is the
     * first module of the model, the input gradient into the module's own dx (*dx). */
    sg_status (*backward)(sg_module *m, sg_tensor *dy, sg_tensor **dx);
    void (*destroy)(sg_module *m);
    /* Optional: run the next passes on the first `rows` rows of the module's buffers. */
    sg_status (*set_rows)(sg_module *m, int64_t rows);
} sg_module_i;

struct sg_module {
    const sg_module_i *vt;
    sg_ctx *ctx;
    char name[64];
    char range[2][80];       /* "<name>.forward", "<name>.backward": made on first use */
};

/* Linear with an optional fused activation (cuBLASLt epilogue): y(M,N) = act(x W^T + b).
 * w, b, dw, db are views from a parameter set (b, db may be NULL). rows = M. need_dx: compute
 * the input gradient (false for the first layer). Activations are allocated now. */
sg_status sg_linear_create(sg_ctx *ctx, const char *name, int64_t rows, sg_tensor *w,
                           sg_tensor *b, sg_tensor *dw, sg_tensor *db, sg_activation act,
                           bool need_dx, sg_module **out);
/* Standalone activation (for models that do not fuse it into a linear). */
sg_status sg_activation_create(sg_ctx *ctx, const char *name, sg_activation act, int ndim,
                               const int64_t *shape, sg_module **out);
/* Runs children in order forward and in reverse backward. Takes ownership of them. */
sg_status sg_sequential_create(sg_ctx *ctx, const char *name, sg_module **children, int n,
                               sg_module **out);
void sg_module_destroy(sg_module *m);

/* Forward and backward name the module on the context while they queue work, so that an
 * error during capture says which module made the forbidden call, and run inside a named
 * range ("blocks.3.forward"): NVTX for Nsight Systems, and the profiler's traces. */
/* The module's range name for pass 0 (forward) or 1 (backward), formatted once, not per step. */
static inline const char *sg_module_range(sg_module *m, int pass)
{
    if (!m->range[pass][0])
        snprintf(m->range[pass], sizeof m->range[pass], "%s.%s", m->name, pass ? "backward" : "forward");
    return m->range[pass];
}
static inline sg_status sg_module_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    const char *range = sg_module_range(m, 0);
    sg_range_push(m->ctx, range);
    const char *prev = sg_ctx_set_module(m->ctx, m->name);
    sg_status st = m->vt->forward(m, x, y);
    sg_ctx_set_module(m->ctx, prev);
    sg_range_pop(m->ctx, range);
    return st;
}
static inline sg_status sg_module_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    const char *range = sg_module_range(m, 1);
    sg_range_push(m->ctx, range);
    const char *prev = sg_ctx_set_module(m->ctx, m->name);
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
typedef sg_status (*sg_backward_hook)(void *user, int child);
void sg_sequential_set_backward_hook(sg_module *seq, sg_backward_hook fn, void *user);

/* ---- optimizers (the public sg_optim_* calls live in optim.c; creation takes a model,
 * so the public sg_optim_create is in models/, which calls this) ---- */
sg_status sg_optim_create_for(sg_ctx *ctx, sg_param_set *ps, sg_optim_kind kind, sg_optim **out);
/* The optimizer's device state, for checkpoints: m, v (NULL for SGD) and the hyperparameters. */
void sg_optim_state(sg_optim *o, sg_tensor **m, sg_tensor **v, sg_tensor **hp);
/* Mixed precision: the backward writes bf16 gradients (grad_lo, (P) BF16, scaled by the loss
 * scale in scaler); sg_optim_unscale turns them into the f32 ones (divided by the scale) and
 * sets found (1 I32) when they are not finite, updating the scale; sg_optim_update then skips
 * on found and writes the new parameters' bf16 copy into param_lo ((P) BF16). Reserves the
 * unscale kernel's scratch now, so steps and captures allocate nothing. Not owned: they must
 * outlive the optimizer's use of them. */
sg_status sg_optim_set_mixed(sg_optim *o, const sg_tensor *grad_lo, sg_tensor *scaler,
                             sg_tensor *found, sg_tensor *param_lo);
/* The two halves of sg_optim_step, for callers that act in between (clipping): unscale (a
 * no-op without mixed precision), then the fused update. */
sg_status sg_optim_unscale(sg_optim *o);
sg_status sg_optim_update(sg_optim *o);

#ifdef __cplusplus
}
#endif
#endif
