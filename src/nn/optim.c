/* optim.c: the optimizer object. Its hyperparameters (lr, betas, eps, weight decay,
 * momentum, dampening, step count) live in one small device tensor that the fused kernels
 * read; setters rewrite it with a stream-ordered kernel, so a schedule needs no host sync
 * and a captured step would see the new values on replay. One launch updates all parameters
 * (and, for mixed precision, skips on a device flag and writes the bf16 copy). */
#include "nn/nn.h"
#include "ops/accum.h"
#include "ops/amp.h"
#include "ops/optim.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

struct sg_optim {
    sg_ctx *ctx;
    sg_optim_kind kind;
    sg_param_set *ps;        /* not owned */
    sg_tensor *hp;           /* (8) F32: sg_optim_hparams */
    sg_tensor *m, *v;        /* AdamW moments; SGD uses m as the momentum buffer: allocated in
                              * state_dtype on first need (sg_optim_alloc_state), so a state
                              * dtype set before then never holds f32 state at all */
    sg_dtype state_dtype;
    /* mixed precision (all NULL without it; not owned) */
    const sg_tensor *grad_lo;/* (P) BF16: the gradients the backward wrote, scaled */
    sg_tensor *scaler;       /* (SG_SCALER_COUNT) F32: sg_loss_scaler */
    sg_tensor *skip;         /* (1) I32: sg_amp_unscale's found; nonzero skips the step */
    sg_tensor *param_lo;     /* (P) BF16: bf16 of the parameters */
    sg_tensor *muls;         /* (2) F32, owned: sg_amp_check's 1 / scale, then the clipping factor */
    sg_tensor *inv, *factor; /* views of muls' elements (sg_optim_amp_slots) */
    bool stepped;            /* an update was queued or captured: the state buffers are fixed */
};

_Static_assert(sizeof(sg_optim_hparams) == 8 * sizeof(float), "hparams are 8 floats");

static sg_optim_hparams defaults(sg_optim_kind kind)
{
    sg_optim_hparams h = {0};
    h.lr = kind == SG_OPTIM_SGD ? 1e-2f : 1e-3f;
    h.beta1 = 0.9f, h.beta2 = 0.999f, h.eps = 1e-8f;
    h.momentum = 0.9f;
    return h;
}

void sg_optim_destroy(sg_optim *o)
{
    if (!o) return;
    sg_tensor_destroy(o->hp);
    sg_tensor_destroy(o->m);
    sg_tensor_destroy(o->v);
    sg_tensor_destroy(o->inv);
    sg_tensor_destroy(o->factor);
    sg_tensor_destroy(o->muls);
    free(o);
}

sg_status sg_optim_create_for(sg_ctx *ctx, sg_param_set *ps, sg_optim_kind kind, sg_optim **out)
{
    *out = NULL;
    if (kind != SG_OPTIM_ADAMW && kind != SG_OPTIM_SGD)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_optim_create: unknown optimizer kind %d", (int)kind);
    sg_optim *o = calloc(1, sizeof *o);
    if (!o) return sg_fail(ctx, SG_ERR_OOM, "sg_optim_create: out of host memory");
    o->ctx = ctx, o->kind = kind, o->ps = ps;
    o->state_dtype = SG_DTYPE_F32;
    int64_t n8 = 8;
    sg_status st = sg_tensor_create(ctx, SG_DTYPE_F32, 1, &n8, "optim.hparams", &o->hp);
    sg_optim_hparams h = defaults(kind);
    if (st == SG_OK) st = sg_tensor_copy_from_host(o->hp, &h, sizeof h);
    /* The kernel's "last block done" counter: reserved now, so steps allocate nothing. */
    void *scratch;
    if (st == SG_OK) st = sg_ctx_scratch(ctx, SG_SLOT_OPTIM, SG_OPTIM_SCRATCH_BYTES, &scratch);
    if (st != SG_OK) {
        sg_optim_destroy(o);
        return st;
    }
    *out = o;
    return SG_OK;
}

sg_dtype sg_optim_state_dtype(const sg_optim *o) { return o ? o->state_dtype : SG_DTYPE_F32; }

/* A zeroed state tensor of P elements in the state dtype. */
static sg_status new_state(sg_optim *o, const char *name, sg_tensor **out)
{
    int64_t P = o->ps->flat->numel;
    SG_TRY(sg_tensor_create(o->ctx, o->state_dtype, 1, &P, name, out));
    return sg_tensor_fill(*out, 0.0);
}

/* SG_OK, or the error of an optimizer whose sharded trainer is gone (sg_optim_use_params(o, NULL)). */
static sg_status have_params(const sg_optim *o, const char *fn)
{
    if (o->ps) return SG_OK;
    return sg_fail(o->ctx, SG_ERR_INVALID, "%s: this optimizer was sharded by a trainer that has been destroyed, and "
                   "its state was that trainer's shares: create a new optimizer", fn);
}

sg_status sg_optim_use_params(sg_optim *o, sg_param_set *ps)
{
    if (!o) return SG_ERR_NULL;
    if (!ps) { /* detached: the trainer that sharded it is going */
        sg_tensor_destroy(o->m);
        sg_tensor_destroy(o->v);
        o->m = o->v = NULL, o->ps = NULL;
        return SG_OK;
    }
    SG_TRY(have_params(o, "sg_optim_use_params"));
    if (o->stepped)
        return sg_fail(o->ctx, SG_ERR_INVALID, "sg_optim_use_params: the optimizer has already stepped or been "
                       "captured; shard it before its first update");
    sg_tensor_destroy(o->m);
    sg_tensor_destroy(o->v);
    o->m = o->v = NULL;
    o->ps = ps;
    return sg_optim_alloc_state(o);
}

sg_status sg_optim_alloc_state(sg_optim *o)
{
    if (!o) return SG_ERR_NULL;
    SG_TRY(have_params(o, "sg_optim_alloc_state"));
    if (!o->m) SG_TRY(new_state(o, "optim.m", &o->m));
    if (!o->v && o->kind == SG_OPTIM_ADAMW) SG_TRY(new_state(o, "optim.v", &o->v));
    return SG_OK;
}

/* A new state tensor of dtype dt holding t's values (NULL for a NULL t). */
static sg_status restate(sg_optim *o, const sg_tensor *t, sg_dtype dt, sg_tensor **out)
{
    *out = NULL;
    if (!t) return SG_OK;
    sg_status st = sg_tensor_create(o->ctx, dt, t->ndim, t->shape, t->name, out);
    if (st == SG_OK) st = sg_tensor_convert(*out, t);
    return st;
}

sg_status sg_optim_set_state_dtype(sg_optim *o, sg_dtype dtype)
{
    if (!o) return SG_ERR_NULL;
    const char *fn = "sg_optim_set_state_dtype";
    if (dtype != SG_DTYPE_F32 && dtype != SG_DTYPE_BF16)
        return sg_fail(o->ctx, SG_ERR_DTYPE, "%s: %s: expected F32 or BF16", fn, sg_dtype_name(dtype));
    SG_TRY(have_params(o, fn));
    if (dtype == SG_DTYPE_BF16 && o->ps->flat->dtype != SG_DTYPE_F32)
        return sg_fail(o->ctx, SG_ERR_DTYPE, "%s: BF16 state needs F32 parameters; these are %s", fn,
                       sg_dtype_name(o->ps->flat->dtype));
    if (dtype == o->state_dtype) return SG_OK;
    if (o->stepped)
        return sg_fail(o->ctx, SG_ERR_INVALID, "%s: the optimizer has already stepped or been captured; "
                       "set the state dtype right after sg_optim_create", fn);
    if (sg_ctx_capturing(o->ctx))
        return sg_fail(o->ctx, SG_ERR_CAPTURE, "%s: called during a capture (it allocates)", fn);
    /* Not allocated yet (no trainer, no step): it will be, in this dtype. Allocated: both
     * converted before either replaces its old tensor, so a failure changes nothing. */
    sg_tensor *m = NULL, *v = NULL;
    sg_status st = restate(o, o->m, dtype, &m);
    if (st == SG_OK) st = restate(o, o->v, dtype, &v);
    if (st != SG_OK) {
        sg_tensor_destroy(m);
        sg_tensor_destroy(v);
        return st;
    }
    if (o->m) sg_tensor_destroy(o->m), o->m = m;
    if (o->v) sg_tensor_destroy(o->v), o->v = v;
    o->state_dtype = dtype;
    return SG_OK;
}

void sg_optim_state(sg_optim *o, sg_tensor **m, sg_tensor **v, sg_tensor **hp)
{
    *m = o->m, *v = o->v, *hp = o->hp;
}

/* The tensors are checked by the calls that use them (sg_amp_unscale, the fused steps), which
 * name the tensor. */
sg_status sg_optim_set_mixed(sg_optim *o, const sg_tensor *grad_lo, sg_tensor *scaler,
                             sg_tensor *found, sg_tensor *param_lo)
{
    if (!o) return SG_ERR_NULL;
    o->grad_lo = grad_lo, o->scaler = scaler, o->skip = found, o->param_lo = param_lo;
    if (grad_lo && !o->muls) {
        int64_t one = 1, two = 2;
        SG_TRY(sg_tensor_create(o->ctx, SG_DTYPE_F32, 1, &two, "optim.inv_scale_factor", &o->muls));
        SG_TRY(sg_tensor_fill(o->muls, 1.0));
        SG_TRY(sg_tensor_view(o->muls, 0, 1, &one, "optim.inv_scale", &o->inv));
        SG_TRY(sg_tensor_view(o->muls, 1, 1, &one, "optim.clip_factor", &o->factor));
    }
    if (!grad_lo || o->ctx->backend == SG_BACKEND_CPU) return SG_OK;
    void *scratch;
    return sg_ctx_scratch(o->ctx, SG_SLOT_AMP, SG_AMP_SCRATCH_BYTES, &scratch);
}

sg_status sg_optim_set_lr(sg_optim *o, float lr)
{
    if (!o) return SG_ERR_NULL;
    if (!(lr >= 0.f)) return sg_fail(o->ctx, SG_ERR_INVALID, "sg_optim_set_lr: lr %g is not >= 0", lr);
    return sg_tensor_write_small(o->hp, offsetof(sg_optim_hparams, lr), &lr, sizeof lr);
}

sg_status sg_optim_set_hparams(sg_optim *o, const sg_optim_hparams *hp)
{
    if (!o || !hp) return SG_ERR_NULL;
    if (!(hp->lr >= 0.f) || !(hp->beta1 >= 0.f && hp->beta1 < 1.f) ||
        !(hp->beta2 >= 0.f && hp->beta2 < 1.f) || !(hp->eps > 0.f) || !(hp->weight_decay >= 0.f))
        return sg_fail(o->ctx, SG_ERR_INVALID,
                       "sg_optim_set_hparams: lr %g beta1 %g beta2 %g eps %g weight_decay %g: "
                       "expected lr >= 0, 0 <= betas < 1, eps > 0, weight_decay >= 0",
                       hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay);
    /* Everything but the step count, which belongs to the kernel. */
    return sg_tensor_write_small(o->hp, 0, hp, offsetof(sg_optim_hparams, step));
}

float sg_lr_warmup_cosine(int64_t step, int64_t warmup, int64_t total, float peak, float floor)
{
    if (step < warmup) return peak * (float)(step + 1) / (float)warmup;
    if (step >= total || total <= warmup) return floor;
    double p = (double)(step - warmup) / (double)(total - warmup);
    return floor + (peak - floor) * (float)(0.5 * (1.0 + cos(3.141592653589793 * p)));
}

sg_status sg_optim_get_hparams(sg_optim *o, sg_optim_hparams *out)
{
    if (!o || !out) return SG_ERR_NULL;
    return sg_tensor_copy_to_host(o->hp, out, sizeof *out);
}

/* Without a scaler (mixed precision without loss scaling) the bf16 gradients are widened into
 * the f32 ones as they are (beta 0: the f32 buffer is not read), the f32 sum is left as it is,
 * and the check does nothing: inv keeps its 1 and nothing is skipped. */
sg_status sg_optim_unscale(sg_optim *o)
{
    if (!o) return SG_ERR_NULL;
    if (!o->grad_lo) return SG_OK;
    SG_TRY(have_params(o, "sg_optim_unscale"));
    if (!o->scaler) return sg_accumulate(o->ctx, o->ps->grad_flat, 0.f, o->grad_lo, 1.f);
    return sg_amp_unscale(o->ctx, o->grad_lo, o->ps->grad_flat, o->scaler, o->skip);
}

sg_status sg_optim_unscale_sum(sg_optim *o)
{
    if (!o) return SG_ERR_NULL;
    if (!o->grad_lo || !o->scaler) return SG_OK;
    SG_TRY(have_params(o, "sg_optim_unscale_sum"));
    return sg_amp_unscale(o->ctx, o->ps->grad_flat, o->ps->grad_flat, o->scaler, o->skip);
}

sg_status sg_optim_check(sg_optim *o)
{
    if (!o) return SG_ERR_NULL;
    if (!o->grad_lo || !o->scaler) return SG_OK;
    return sg_amp_check(o->ctx, o->grad_lo, o->scaler, o->skip, o->inv);
}

sg_status sg_optim_step(sg_optim *o)
{
    SG_TRY(sg_optim_check(o));
    return sg_optim_update_amp(o);
}

/* The fused update over all parameters, reading grad times inv[0] (then times inv[1] when it
 * has 2 elements; inv NULL: the f32 gradients as stored). */
static sg_status update(sg_optim *o, const sg_tensor *grad, const sg_tensor *inv)
{
    SG_TRY(have_params(o, "sg_optim_update"));
    sg_param_set *ps = o->ps;
    SG_TRY(sg_optim_alloc_state(o));
    o->stepped = true;
    const bool adamw = o->kind == SG_OPTIM_ADAMW;
    if (inv && adamw)
        return sg_adamw_step_amp(o->ctx, ps->flat, grad, inv, o->m, o->v, o->hp, ps->seg_start, ps->seg_decay,
                                 ps->count, o->skip, o->param_lo);
    if (inv)
        return sg_sgd_step_amp(o->ctx, ps->flat, grad, inv, o->m, o->hp, ps->seg_start, ps->seg_decay, ps->count,
                               o->skip, o->param_lo);
    if (adamw)
        return sg_adamw_step(o->ctx, ps->flat, ps->grad_flat, o->m, o->v, o->hp, ps->seg_start, ps->seg_decay,
                             ps->count, o->skip, o->param_lo);
    return sg_sgd_step(o->ctx, ps->flat, ps->grad_flat, o->m, o->hp, ps->seg_start, ps->seg_decay, ps->count,
                       o->skip, o->param_lo);
}

sg_status sg_optim_update_amp(sg_optim *o)
{
    if (!o) return SG_ERR_NULL;
    return o->grad_lo ? update(o, o->grad_lo, o->inv) : update(o, NULL, NULL);
}

void sg_optim_amp_slots(sg_optim *o, sg_tensor **inv, sg_tensor **factor)
{
    *inv = o->inv, *factor = o->factor;
}

sg_status sg_optim_update_amp_clipped(sg_optim *o)
{
    if (!o) return SG_ERR_NULL;
    if (!o->grad_lo)
        return sg_fail(o->ctx, SG_ERR_INVALID, "sg_optim_update_amp_clipped: the optimizer is not mixed precision");
    return update(o, o->grad_lo, o->muls);
}

sg_status sg_optim_update_by(sg_optim *o, const sg_tensor *factor)
{
    if (!o) return SG_ERR_NULL;
    if (!factor) return sg_fail(o->ctx, SG_ERR_NULL, "sg_optim_update_by: tensor 'factor' is NULL");
    SG_TRY(have_params(o, "sg_optim_update_by"));
    return update(o, o->ps->grad_flat, factor);
}

sg_status sg_optim_update(sg_optim *o)
{
    if (!o) return SG_ERR_NULL;
    return update(o, NULL, NULL);
}
