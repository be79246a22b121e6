/* act.c: public entry points of the elementwise ops: check arguments, then run the CPU
 * reference or the CUDA kernel. */
#include "ops/act.h"

/* Two tensors of one shape, a float dtype the backend computes in. */
static sg_status check_pair(sg_ctx *ctx, const char *fn, const char *wa, const sg_tensor *a,
                            const char *wb, const sg_tensor *b)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float(ctx, fn, wa, a));
    return sg_check_same_shape(ctx, fn, wa, a, wb, b);
}

sg_status sg_relu_forward(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    SG_TRY(check_pair(ctx, "sg_relu_forward", "x", x, "y", y));
    if (ctx->backend == SG_BACKEND_CPU) return sg_relu_forward_cpu(x, y), SG_OK;
    return SG_CUDA_DISPATCH(ctx, sg_relu_forward_cuda(ctx, x, y));
}

sg_status sg_relu_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    SG_TRY(check_pair(ctx, "sg_relu_backward", "x", x, "dy", dy));
    SG_TRY(check_pair(ctx, "sg_relu_backward", "x", x, "dx", dx));
    if (ctx->backend == SG_BACKEND_CPU) return sg_relu_backward_cpu(x, dy, dx), SG_OK;
    return SG_CUDA_DISPATCH(ctx, sg_relu_backward_cuda(ctx, x, dy, dx));
}

sg_status sg_gelu_forward(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    SG_TRY(check_pair(ctx, "sg_gelu_forward", "x", x, "y", y));
    if (ctx->backend == SG_BACKEND_CPU) return sg_gelu_forward_cpu(x, y), SG_OK;
    return SG_CUDA_DISPATCH(ctx, sg_gelu_forward_cuda(ctx, x, y));
}

sg_status sg_gelu_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    SG_TRY(check_pair(ctx, "sg_gelu_backward", "x", x, "dy", dy));
    SG_TRY(check_pair(ctx, "sg_gelu_backward", "x", x, "dx", dx));
    if (ctx->backend == SG_BACKEND_CPU) return sg_gelu_backward_cpu(x, dy, dx), SG_OK;
    return SG_CUDA_DISPATCH(ctx, sg_gelu_backward_cuda(ctx, x, dy, dx));
}

sg_status sg_add_forward(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b, sg_tensor *y)
{
    SG_TRY(check_pair(ctx, "sg_add_forward", "a", a, "b", b));
    SG_TRY(check_pair(ctx, "sg_add_forward", "a", a, "y", y));
    if (ctx->backend == SG_BACKEND_CPU) return sg_add_forward_cpu(a, b, y), SG_OK;
    return SG_CUDA_DISPATCH(ctx, sg_add_forward_cuda(ctx, a, b, y));
}
