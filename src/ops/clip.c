/* clip.c: public entry point of global-norm gradient clipping: check grad, norm, nonfinite and
 * max_norm, then run the CPU reference (through sg_cpu_run, so a CPU capture records it) or
 * the CUDA kernels. Nothing is written before every check has passed. */
#include "ops/clip.h"
#include "ops/amp.h"

#include <stdint.h>

/* An output inside grad's storage would be overwritten by the scaling (or feed it). */
static sg_status check_apart(sg_ctx *ctx, const char *fn, const sg_tensor *grad,
                             const char *what, const sg_tensor *t)
{
    uintptr_t g0 = (uintptr_t)grad->data, g1 = g0 + sg_tensor_nbytes(grad);
    uintptr_t t0 = (uintptr_t)t->data, t1 = t0 + sg_tensor_nbytes(t);
    if (t0 < g1 && g0 < t1)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: '%s' (%s) overlaps grad's storage; expected a "
                       "buffer of its own", fn, what, t->name);
    return SG_OK;
}

typedef struct clip_args {
    sg_tensor *grad, *norm, *nonfinite, *factor;
    float max_norm;
} clip_args;

static sg_status clip_cpu(sg_ctx *ctx, const void *p)
{
    const clip_args *a = p;
    sg_clip_grad_norm_cpu(a->grad, a->max_norm, a->norm, a->nonfinite, a->factor);
    return SG_OK;
}

/* The outputs every form writes: norm (1 F32), nonfinite (1 I32) and, for the factor forms,
 * factor (1 F32), none inside grad's storage (when there is a grad), nor one in another;
 * max_norm a number. */
static sg_status check_outputs(sg_ctx *ctx, const char *fn, const sg_tensor *grad, float max_norm,
                               const sg_tensor *norm, const sg_tensor *nonfinite, const sg_tensor *factor,
                               bool want_factor)
{
    SG_TRY(sg_check_count(ctx, fn, "norm", norm, SG_DTYPE_F32, 1, "the norm"));
    SG_TRY(sg_check_count(ctx, fn, "nonfinite", nonfinite, SG_DTYPE_I32, 1, "a flag"));
    if (want_factor) {
        SG_TRY(sg_check_count(ctx, fn, "factor", factor, SG_DTYPE_F32, 1, "the clipping factor"));
        SG_TRY(sg_check_not_overlapping(ctx, fn, "factor", factor, "norm", norm));
        SG_TRY(sg_check_not_overlapping(ctx, fn, "factor", factor, "nonfinite", nonfinite));
        if (grad) SG_TRY(check_apart(ctx, fn, grad, "factor", factor));
    }
    if (grad) {
        SG_TRY(check_apart(ctx, fn, grad, "norm", norm));
        SG_TRY(check_apart(ctx, fn, grad, "nonfinite", nonfinite));
    }
    if (max_norm != max_norm)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: max_norm is NaN; expected a number (<= 0: measure only)", fn);
    return SG_OK;
}

/* sg_clip_grad_norm, and sg_clip_factor (factor given: grad only read). */
static sg_status clip_whole(sg_ctx *ctx, const char *fn, sg_tensor *grad, float max_norm, sg_tensor *norm,
                            sg_tensor *nonfinite, sg_tensor *factor, bool want_factor)
{
    if (!ctx) return SG_ERR_NULL;
    /* the factor is for f32 gradients (g * factor in f32); f64 ones are scaled in f64 */
    SG_TRY(want_factor ? sg_check_dtype(ctx, fn, "grad", grad, SG_DTYPE_F32) : sg_check_float(ctx, fn, "grad", grad));
    SG_TRY(check_outputs(ctx, fn, grad, max_norm, norm, nonfinite, factor, want_factor));
    /* the norm reads the gradients; scaling them reads and writes them again */
    const bool scale = !want_factor && max_norm > 0;
    sg_ctx_count_work(ctx, SG_WORK_OPTIMIZER, 0,
                      (scale ? 3 : 1) * sg_tensors_bytes(grad, NULL, NULL, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        clip_args a = {grad, norm, nonfinite, factor, max_norm};
        return sg_cpu_run(ctx, clip_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_clip_grad_norm_cuda(ctx, grad, max_norm, norm, nonfinite, factor));
}

/* grad: any shape, read as flat (P). max_norm NaN is refused (it would silently measure
 * only); +inf is allowed and never scales. */
sg_status sg_clip_grad_norm(sg_ctx *ctx, sg_tensor *grad, float max_norm, sg_tensor *norm,
                            sg_tensor *nonfinite)
{
    return clip_whole(ctx, "sg_clip_grad_norm", grad, max_norm, norm, nonfinite, NULL, false);
}

sg_status sg_clip_factor(sg_ctx *ctx, const sg_tensor *grad, float max_norm, sg_tensor *norm, sg_tensor *nonfinite,
                         sg_tensor *factor)
{
    return clip_whole(ctx, "sg_clip_factor", (sg_tensor *)grad, max_norm, norm, nonfinite, factor, true);
}

typedef struct split_args {
    sg_tensor *grad, *inv, *sums, *norm, *nonfinite, *factor;
    float max_norm;
    int part;
} split_args;

static sg_status sumsq_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    const split_args *a = p;
    sg_clip_sumsq_cpu(a->grad, a->inv, a->sums, a->part);
    return SG_OK;
}

static sg_status apply_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    const split_args *a = p;
    sg_clip_apply_cpu(a->grad, a->max_norm, a->sums, a->norm, a->nonfinite, a->factor);
    return SG_OK;
}

/* sums: I32, an even count (2 elements a part), apart from grad (when there is one). */
static sg_status check_sums(sg_ctx *ctx, const char *fn, const sg_tensor *grad, const sg_tensor *sums)
{
    SG_TRY(sg_check_dtype(ctx, fn, "sums", sums, SG_DTYPE_I32));
    if (sums->numel < 2 || sums->numel % 2)
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'sums' (%s) has %lld elements; expected 2 per part (each part's "
                       "f64 sum of squares as raw bytes)", fn, sums->name, (long long)sums->numel);
    return grad ? check_apart(ctx, fn, grad, "sums", sums) : SG_OK;
}

/* sg_clip_sumsq (f32 gradients), and sg_clip_sumsq_amp (inv given: scaled gradients, BF16 or
 * F32, F64 too on the CPU, times inv as they are read). */
static sg_status sumsq(sg_ctx *ctx, const char *fn, const sg_tensor *grad, const sg_tensor *inv, sg_tensor *sums,
                       int part, bool scaled)
{
    if (!ctx) return SG_ERR_NULL;
    if (scaled) {
        SG_TRY(sg_amp_check_grad_lo(ctx, fn, grad));
        SG_TRY(sg_check_count(ctx, fn, "inv", inv, SG_DTYPE_F32, 1, "sg_amp_check's 1 / scale"));
        SG_TRY(sg_check_not_overlapping(ctx, fn, "sums", sums, "inv", inv));
    } else {
        SG_TRY(sg_check_dtype(ctx, fn, "grad", grad, SG_DTYPE_F32));
    }
    SG_TRY(check_sums(ctx, fn, grad, sums));
    if (part < 0 || part >= sums->numel / 2)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: part %d of 'sums' (%s), which holds %lld parts", fn, part,
                       sums->name, (long long)(sums->numel / 2));
    sg_ctx_count_work(ctx, SG_WORK_OPTIMIZER, 0, sg_tensors_bytes(grad, NULL, NULL, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        split_args a = {(sg_tensor *)grad, (sg_tensor *)inv, sums, NULL, NULL, NULL, 0.f, part};
        return sg_cpu_run(ctx, sumsq_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_clip_sumsq_cuda(ctx, grad, inv, sums, part));
}

sg_status sg_clip_sumsq(sg_ctx *ctx, const sg_tensor *grad, sg_tensor *sums, int part)
{
    return sumsq(ctx, "sg_clip_sumsq", grad, NULL, sums, part, false);
}

sg_status sg_clip_sumsq_amp(sg_ctx *ctx, const sg_tensor *grad_lo, const sg_tensor *inv, sg_tensor *sums, int part)
{
    return sumsq(ctx, "sg_clip_sumsq_amp", grad_lo, inv, sums, part, true);
}

/* sg_clip_apply (grad scaled), and sg_clip_factor_sums (grad NULL: factor written). */
static sg_status apply(sg_ctx *ctx, const char *fn, sg_tensor *grad, float max_norm, const sg_tensor *sums,
                       sg_tensor *norm, sg_tensor *nonfinite, sg_tensor *factor, bool want_factor)
{
    if (!ctx) return SG_ERR_NULL;
    if (!want_factor) SG_TRY(sg_check_dtype(ctx, fn, "grad", grad, SG_DTYPE_F32));
    SG_TRY(check_sums(ctx, fn, grad, sums));
    SG_TRY(check_outputs(ctx, fn, grad, max_norm, norm, nonfinite, factor, want_factor));
    if (want_factor) SG_TRY(sg_check_not_overlapping(ctx, fn, "factor", factor, "sums", sums));
    if (grad && max_norm > 0)
        sg_ctx_count_work(ctx, SG_WORK_OPTIMIZER, 0,
                          2 * sg_tensors_bytes(grad, NULL, NULL, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        split_args a = {grad, NULL, (sg_tensor *)sums, norm, nonfinite, factor, max_norm, 0};
        return sg_cpu_run(ctx, apply_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_clip_apply_cuda(ctx, grad, max_norm, sums, norm, nonfinite, factor));
}

sg_status sg_clip_apply(sg_ctx *ctx, sg_tensor *grad, float max_norm, const sg_tensor *sums, sg_tensor *norm,
                        sg_tensor *nonfinite)
{
    return apply(ctx, "sg_clip_apply", grad, max_norm, sums, norm, nonfinite, NULL, false);
}

sg_status sg_clip_factor_sums(sg_ctx *ctx, float max_norm, const sg_tensor *sums, sg_tensor *norm,
                              sg_tensor *nonfinite, sg_tensor *factor)
{
    return apply(ctx, "sg_clip_factor_sums", NULL, max_norm, sums, norm, nonfinite, factor, true);
}
