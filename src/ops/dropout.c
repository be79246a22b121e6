/* dropout.c: public entry points of dropout (forward, backward) and sg_rng_advance: check the
 * tensors, p and the rng state, then run the CPU reference (through sg_cpu_run, so a CPU
 * capture records it) or the CUDA kernel. Nothing is written before every check has passed. */
#include "ops/dropout.h"

/* rng: 4 I32 (seed lo, seed hi, offset lo, offset hi). Its values are never read here: on
 * CUDA that would be a host sync, and the kernel must see the value current when it runs. */
static sg_status check_rng(sg_ctx *ctx, const char *fn, const sg_tensor *rng)
{
    SG_TRY(sg_check_dtype(ctx, fn, "rng", rng, SG_DTYPE_I32));
    if (rng->numel != SG_RNG_COUNT) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'rng' is %s, expected %d elements (seed lo, seed "
                       "hi, offset lo, offset hi)", fn, sg_shape_str(rng, s, sizeof s),
                       SG_RNG_COUNT);
    }
    return SG_OK;
}

/* in, out: one shape and one dtype, a float dtype of the backend or bf16 (another dtype on
 * out is SG_ERR_DTYPE naming both); 0 <= p < 1 (p = 1 would divide by 0). */
static sg_status check_args(sg_ctx *ctx, const char *fn, const char *win, const sg_tensor *in,
                            float p, const sg_tensor *rng, const char *wout, const sg_tensor *out)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float_or_bf16(ctx, fn, win, in));
    SG_TRY(sg_check_same_shape(ctx, fn, win, in, wout, out));
    if (!(p >= 0.f && p < 1.f))
        return sg_fail(ctx, SG_ERR_INVALID, "%s: p is %g, expected 0 <= p < 1", fn, (double)p);
    return check_rng(ctx, fn, rng);
}

typedef struct dropout_args {
    const sg_tensor *x, *rng;
    sg_tensor *y;
    float p;
    double scale;
    uint32_t site;
} dropout_args;

static sg_status dropout_cpu(sg_ctx *ctx, const void *a)
{
    const dropout_args *d = a;
    sg_dropout_cpu(d->x, d->p, d->scale, d->rng, d->site, d->y);
    return SG_OK;
}

/* Forward and backward are the same map (out = in * mask / (1 - p)) with the same mask. */
static sg_status dropout(sg_ctx *ctx, const char *fn, const char *win, const sg_tensor *in,
                         float p, const sg_tensor *rng, uint32_t site, const char *wout,
                         sg_tensor *out)
{
    SG_TRY(check_args(ctx, fn, win, in, p, rng, wout, out));
    double scale = 1.0 / (1.0 - (double)p);
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(in, out, NULL, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        dropout_args a = {in, rng, out, p, scale, site};
        return sg_cpu_run(ctx, dropout_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_dropout_cuda(ctx, in, p, scale, rng, site, out));
}

sg_status sg_dropout_forward(sg_ctx *ctx, const sg_tensor *x, float p, const sg_tensor *rng,
                             uint32_t site, sg_tensor *y)
{
    return dropout(ctx, "sg_dropout_forward", "x", x, p, rng, site, "y", y);
}

sg_status sg_dropout_backward(sg_ctx *ctx, const sg_tensor *dy, float p, const sg_tensor *rng,
                              uint32_t site, sg_tensor *dx)
{
    return dropout(ctx, "sg_dropout_backward", "dy", dy, p, rng, site, "dx", dx);
}

typedef struct advance_args {
    sg_tensor *rng;
} advance_args;

static sg_status advance_cpu(sg_ctx *ctx, const void *a)
{
    sg_rng_advance_cpu(((const advance_args *)a)->rng);
    return SG_OK;
}

sg_status sg_rng_advance(sg_ctx *ctx, sg_tensor *rng)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_rng(ctx, "sg_rng_advance", rng));
    if (ctx->backend == SG_BACKEND_CPU) {
        advance_args a = {rng};
        return sg_cpu_run(ctx, advance_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_rng_advance_cuda(ctx, rng));
}
