/* optim.c: public entry points of the optimizer steps: check the flat buffers, the
 * hyperparameter tensor, the segment tables and mixed precision's skip flag and bf16 copy,
 * then run the CPU reference or the CUDA kernel. Nothing is written before every check has
 * passed. */
#include "ops/amp.h"
#include "ops/optim.h"

#include <stddef.h>

_Static_assert(sizeof(sg_optim_hparams) == SG_HP_COUNT * sizeof(float),
               "sg_optim_hparams must be 8 packed floats: the kernels index it");
_Static_assert(offsetof(sg_optim_hparams, step) == SG_HP_STEP * sizeof(float),
               "sg_optim_hparams.step must be element SG_HP_STEP");
_Static_assert(offsetof(sg_optim_hparams, momentum) == SG_HP_MOMENTUM * sizeof(float),
               "sg_optim_hparams.momentum must be element SG_HP_MOMENTUM");

/* A state tensor (grad, m, v, buf) laid out as param, and not param's own storage. */
static sg_status check_like_param(sg_ctx *ctx, const char *fn, const sg_tensor *param,
                                  const char *what, const sg_tensor *t)
{
    SG_TRY(sg_check_same_shape(ctx, fn, "param", param, what, t));
    if (t->data == param->data)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: '%s' (%s) shares param's storage; expected a "
                       "buffer of its own", fn, what, t->name);
    return SG_OK;
}

/* A state tensor (m, v, buf): as param, or BF16 beside an F32 param (bf16 state, rounded
 * stochastically by the step; optim.h). */
static sg_status check_state(sg_ctx *ctx, const char *fn, const sg_tensor *param, const char *what,
                             const sg_tensor *t)
{
    SG_TRY(sg_check_tensor(ctx, fn, what, t));
    if (t->dtype != SG_DTYPE_BF16 || param->dtype != SG_DTYPE_F32)
        return check_like_param(ctx, fn, param, what, t);
    return sg_check_same_dims(ctx, fn, what, t, "param", param);
}

/* hp: 8 floats (sg_optim_hparams). */
static sg_status check_hp(sg_ctx *ctx, const char *fn, const sg_tensor *hp)
{
    SG_TRY(sg_check_float(ctx, fn, "hp", hp));
    if (hp->numel != SG_HP_COUNT) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'hp' is %s, expected %d elements "
                       "(sg_optim_hparams: lr, beta1, beta2, eps, weight_decay, momentum, "
                       "dampening, step)", fn, sg_shape_str(hp, s, sizeof s), SG_HP_COUNT);
    }
    return SG_OK;
}

/* seg_start (n_seg+1, I32) and seg_decay (n_seg, I32). Their contents are checked on the CPU
 * backend only, where they are host memory: seg_start[0] == 0, non-decreasing (an empty
 * segment is allowed), seg_start[n_seg] == P. On CUDA reading them would be a host sync; the
 * kernel stays in bounds whatever they hold. */
static sg_status check_segments(sg_ctx *ctx, const char *fn, int64_t P, const sg_tensor *seg_start,
                                const sg_tensor *seg_decay, int n_seg)
{
    if (n_seg < 1)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: n_seg is %d, expected at least 1", fn, n_seg);
    if (P > INT32_MAX)
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: param has %lld elements; the segment tables are "
                       "i32, so at most %d", fn, (long long)P, INT32_MAX);
    SG_TRY(sg_check_dtype(ctx, fn, "seg_start", seg_start, SG_DTYPE_I32));
    SG_TRY(sg_check_dtype(ctx, fn, "seg_decay", seg_decay, SG_DTYPE_I32));
    if (seg_start->numel != (int64_t)n_seg + 1)
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'seg_start' has %lld elements, expected n_seg+1 = %d",
                       fn, (long long)seg_start->numel, n_seg + 1);
    if (seg_decay->numel != n_seg)
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'seg_decay' has %lld elements, expected n_seg = %d",
                       fn, (long long)seg_decay->numel, n_seg);
    if (ctx->backend != SG_BACKEND_CPU) return SG_OK;
    const int32_t *s = seg_start->data;
    if (s[0] != 0)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: seg_start[0] is %d, expected 0", fn, (int)s[0]);
    for (int i = 0; i < n_seg; i++)
        if (s[i + 1] < s[i])
            return sg_fail(ctx, SG_ERR_INVALID, "%s: seg_start[%d] = %d is below seg_start[%d] = "
                           "%d; expected a non-decreasing table", fn, i + 1, (int)s[i + 1], i,
                           (int)s[i]);
    if (s[n_seg] != P)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: seg_start[%d] (the last entry) is %d, expected "
                       "P = %lld, the number of elements of param", fn, n_seg, (int)s[n_seg],
                       (long long)P);
    return SG_OK;
}

/* skip (NULL, or 1 I32) is read by every block while the step writes param, m, v, hp and
 * param_lo: it must not share bytes with them. param_lo (NULL, or BF16 with param's element
 * count) is written while everything else is read: it must share bytes with nothing. */
static sg_status check_mixed(sg_ctx *ctx, const char *fn, const sg_tensor *param,
                             const sg_tensor *grad, const char *mname, const sg_tensor *m,
                             const sg_tensor *v, const sg_tensor *hp, const sg_tensor *seg_start,
                             const sg_tensor *seg_decay, const sg_tensor *skip,
                             const sg_tensor *param_lo)
{
    char s[96];
    if (skip) SG_TRY(sg_check_count(ctx, fn, "skip", skip, SG_DTYPE_I32, 1, "a flag, as sg_amp_unscale's found"));
    if (param_lo) {
        SG_TRY(sg_check_dtype(ctx, fn, "param_lo", param_lo, SG_DTYPE_BF16));
        if (param_lo->numel != param->numel) {
            char sp[96];
            return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'param_lo' is %s but 'param' is %s; expected "
                           "as many elements", fn, sg_shape_str(param_lo, s, sizeof s),
                           sg_shape_str(param, sp, sizeof sp));
        }
    }
    const char *names[9] = {"param_lo", "param", mname, "v", "hp", "grad", "seg_start",
                            "seg_decay", "skip"};
    const sg_tensor *ts[9] = {param_lo, param, m, v, hp, grad, seg_start, seg_decay, skip};
    SG_TRY(sg_check_disjoint(ctx, fn, 1, 9, names, ts)); /* param_lo against all */
    for (int i = 1; i < 5; i++) /* the step's other outputs against skip */
        SG_TRY(sg_check_not_overlapping(ctx, fn, names[i], ts[i], "skip", skip));
    return SG_OK;
}

/* The scaled gradients of the _amp steps: BF16 or F32 (F64 too on the CPU) with param's
 * dims, and inv, 1 or 2 F32 (the second a clipping factor); neither shares bytes with what the
 * step writes (check_mixed). */
static sg_status check_scaled(sg_ctx *ctx, const char *fn, const sg_tensor *param, const sg_tensor *grad,
                              const sg_tensor *inv)
{
    SG_TRY(sg_amp_check_grad_lo(ctx, fn, grad));
    SG_TRY(sg_check_same_dims(ctx, fn, "grad_lo", grad, "param", param));
    SG_TRY(sg_check_dtype(ctx, fn, "inv", inv, SG_DTYPE_F32));
    if (inv->numel == 2) return SG_OK;
    return sg_check_count(ctx, fn, "inv", inv, SG_DTYPE_F32, 1,
                          "sg_amp_check's 1 / scale; or 2: that, then a clipping factor");
}

/* Everything both optimizers share; v is NULL for SGD, inv NULL for the f32-gradient steps. */
static sg_status check_step(sg_ctx *ctx, const char *fn, const sg_tensor *param,
                            const sg_tensor *grad, const sg_tensor *inv, const char *mname, const sg_tensor *m,
                            const sg_tensor *v, const sg_tensor *hp, const sg_tensor *seg_start,
                            const sg_tensor *seg_decay, int n_seg, const sg_tensor *skip,
                            const sg_tensor *param_lo)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float(ctx, fn, "param", param));
    if (inv) SG_TRY(check_scaled(ctx, fn, param, grad, inv));
    else SG_TRY(check_like_param(ctx, fn, param, "grad", grad));
    SG_TRY(check_state(ctx, fn, param, mname, m));
    if (v) {
        SG_TRY(check_state(ctx, fn, param, "v", v));
        if (v->dtype != m->dtype)
            return sg_fail(ctx, SG_ERR_DTYPE, "%s: 'm' is %s but 'v' is %s; expected one state dtype", fn,
                           sg_dtype_name(m->dtype), sg_dtype_name(v->dtype));
        if (v->data == m->data)
            return sg_fail(ctx, SG_ERR_INVALID, "%s: 'm' and 'v' share storage; expected two "
                           "buffers", fn);
    }
    SG_TRY(check_hp(ctx, fn, hp));
    SG_TRY(check_segments(ctx, fn, param->numel, seg_start, seg_decay, n_seg));
    SG_TRY(check_mixed(ctx, fn, param, grad, mname, m, v, hp, seg_start, seg_decay, skip, param_lo));
    if (!inv) return SG_OK;
    /* inv is read by every block while the step writes: apart from every output. */
    const char *names[5] = {"param", mname, "v", "hp", "param_lo"};
    const sg_tensor *ts[5] = {param, m, v, hp, param_lo};
    for (int i = 0; i < 5; i++) SG_TRY(sg_check_not_overlapping(ctx, fn, names[i], ts[i], "inv", inv));
    return SG_OK;
}

/* The CPU references run through sg_cpu_run, so a CPU capture records them. */
typedef struct optim_args {
    sg_tensor *param;
    const sg_tensor *grad, *inv;
    sg_tensor *m, *v, *hp;
    const sg_tensor *seg_start, *seg_decay;
    int n_seg;
    const sg_tensor *skip;
    sg_tensor *param_lo;
} optim_args;

static sg_status adamw_cpu(sg_ctx *ctx, const void *p)
{
    const optim_args *a = p;
    sg_adamw_step_cpu(a->param, a->grad, a->inv, a->m, a->v, a->hp, a->seg_start, a->seg_decay, a->n_seg,
                      a->skip, a->param_lo);
    return SG_OK;
}

static sg_status sgd_cpu(sg_ctx *ctx, const void *p)
{
    const optim_args *a = p;
    sg_sgd_step_cpu(a->param, a->grad, a->inv, a->m, a->hp, a->seg_start, a->seg_decay, a->n_seg,
                    a->skip, a->param_lo);
    return SG_OK;
}

/* AdamW with f32 gradients (inv NULL) or scaled ones (sg_adamw_step_amp). */
static sg_status adamw(sg_ctx *ctx, const char *fn, sg_tensor *param, const sg_tensor *grad, const sg_tensor *inv,
                       sg_tensor *m, sg_tensor *v, sg_tensor *hp, const sg_tensor *seg_start,
                       const sg_tensor *seg_decay, int n_seg, const sg_tensor *skip, sg_tensor *param_lo)
{
    if (!ctx) return SG_ERR_NULL;
    if (!v) return sg_fail(ctx, SG_ERR_NULL, "%s: tensor 'v' is NULL", fn);
    SG_TRY(check_step(ctx, fn, param, grad, inv, "m", m, v, hp, seg_start, seg_decay, n_seg, skip, param_lo));
    sg_ctx_count_work(ctx, SG_WORK_OPTIMIZER, 0, 2 * sg_tensors_bytes(param, m, v, NULL, NULL, NULL, NULL, NULL) + sg_tensors_bytes(grad, param_lo, NULL, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        optim_args a = {param, grad, inv, m, v, hp, seg_start, seg_decay, n_seg, skip, param_lo};
        return sg_cpu_run(ctx, adamw_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_adamw_step_cuda(ctx, param, grad, inv, m, v, hp, seg_start,
                                                    seg_decay, n_seg, skip, param_lo));
}

/* buf is required even when momentum is 0: momentum lives in device memory, unknown here. */
static sg_status sgd(sg_ctx *ctx, const char *fn, sg_tensor *param, const sg_tensor *grad, const sg_tensor *inv,
                     sg_tensor *buf, sg_tensor *hp, const sg_tensor *seg_start, const sg_tensor *seg_decay,
                     int n_seg, const sg_tensor *skip, sg_tensor *param_lo)
{
    SG_TRY(check_step(ctx, fn, param, grad, inv, "buf", buf, NULL, hp, seg_start, seg_decay, n_seg,
                      skip, param_lo));
    sg_ctx_count_work(ctx, SG_WORK_OPTIMIZER, 0, 2 * sg_tensors_bytes(param, buf, NULL, NULL, NULL, NULL, NULL, NULL) + sg_tensors_bytes(grad, param_lo, NULL, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        optim_args a = {param, grad, inv, buf, NULL, hp, seg_start, seg_decay, n_seg, skip, param_lo};
        return sg_cpu_run(ctx, sgd_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_sgd_step_cuda(ctx, param, grad, inv, buf, hp, seg_start,
                                                  seg_decay, n_seg, skip, param_lo));
}

sg_status sg_adamw_step(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, sg_tensor *m,
                        sg_tensor *v, sg_tensor *hp, const sg_tensor *seg_start,
                        const sg_tensor *seg_decay, int n_seg, const sg_tensor *skip,
                        sg_tensor *param_lo)
{
    return adamw(ctx, "sg_adamw_step", param, grad, NULL, m, v, hp, seg_start, seg_decay, n_seg, skip, param_lo);
}

sg_status sg_adamw_step_amp(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad_lo, const sg_tensor *inv,
                            sg_tensor *m, sg_tensor *v, sg_tensor *hp, const sg_tensor *seg_start,
                            const sg_tensor *seg_decay, int n_seg, const sg_tensor *skip, sg_tensor *param_lo)
{
    const char *fn = "sg_adamw_step_amp";
    if (ctx && !inv) return sg_fail(ctx, SG_ERR_NULL, "%s: tensor 'inv' is NULL", fn);
    return adamw(ctx, fn, param, grad_lo, inv, m, v, hp, seg_start, seg_decay, n_seg, skip, param_lo);
}

sg_status sg_sgd_step(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad, sg_tensor *buf,
                      sg_tensor *hp, const sg_tensor *seg_start, const sg_tensor *seg_decay,
                      int n_seg, const sg_tensor *skip, sg_tensor *param_lo)
{
    return sgd(ctx, "sg_sgd_step", param, grad, NULL, buf, hp, seg_start, seg_decay, n_seg, skip, param_lo);
}

sg_status sg_sgd_step_amp(sg_ctx *ctx, sg_tensor *param, const sg_tensor *grad_lo, const sg_tensor *inv,
                          sg_tensor *buf, sg_tensor *hp, const sg_tensor *seg_start, const sg_tensor *seg_decay,
                          int n_seg, const sg_tensor *skip, sg_tensor *param_lo)
{
    const char *fn = "sg_sgd_step_amp";
    if (ctx && !inv) return sg_fail(ctx, SG_ERR_NULL, "%s: tensor 'inv' is NULL", fn);
    return sgd(ctx, fn, param, grad_lo, inv, buf, hp, seg_start, seg_decay, n_seg, skip, param_lo);
}
