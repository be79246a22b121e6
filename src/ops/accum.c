/* accum.c: entry point of the accumulation y = beta * y + alpha * x (accum.h): checks y, x
 * and the factors, then runs the CPU reference (through sg_cpu_run, so a CPU capture records
 * it) or the CUDA kernel. Nothing is written before every check has passed. */
#include "ops/accum.h"

#include <math.h>

typedef struct accum_args {
    sg_tensor *y;
    const sg_tensor *x;
    float beta, alpha;
} accum_args;

static sg_status accum_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    const accum_args *a = p;
    sg_accumulate_cpu(a->y, a->beta, a->x, a->alpha);
    return SG_OK;
}

sg_status sg_accumulate(sg_ctx *ctx, sg_tensor *y, float beta, const sg_tensor *x, float alpha)
{
    const char *fn = "sg_accumulate";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_dtype(ctx, fn, "y", y, SG_DTYPE_F32));
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "x", x));
    if (x->numel != y->numel) {
        char sx[96], sy[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'y' is %s but 'x' is %s; expected the same number of "
                       "elements", fn, sg_shape_str(y, sy, sizeof sy), sg_shape_str(x, sx, sizeof sx));
    }
    if (!isfinite(beta) || !isfinite(alpha))
        return sg_fail(ctx, SG_ERR_INVALID, "%s: beta %g, alpha %g: expected finite factors", fn, beta, alpha);
    SG_TRY(sg_check_not_overlapping(ctx, fn, "y", y, "x", x));
    sg_ctx_count_work(ctx, SG_WORK_OPTIMIZER, 0, sg_tensors_bytes(y, y, x, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        accum_args a = {y, x, beta, alpha};
        return sg_cpu_run(ctx, accum_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_accumulate_cuda(ctx, y, beta, x, alpha));
}
