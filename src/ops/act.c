/* act.c: public entry points of the elementwise ops: check arguments, then run the CPU
 * reference or the CUDA kernel. Every tensor of a call has one dtype: f32, bf16 (mixed
 * precision: f32 math, bf16 storage), or f64 on the CPU; a tensor of another is SG_ERR_DTYPE,
 * by name. */
#include "ops/act.h"

/* CPU work goes through sg_cpu_run (so a CPU capture records it): one argument block and one
 * thunk per op. */
typedef struct act_args {
    int op; /* 0 relu fwd, 1 relu bwd, 2 gelu fwd, 3 gelu bwd, 4 add, 5 silu fwd, 6 silu bwd,
             * 7 sigmoid fwd, 8 sigmoid bwd */
    const sg_tensor *a, *b;
    sg_tensor *y;
} act_args;

static sg_status act_cpu(sg_ctx *ctx, const void *p)
{
    const act_args *g = p;
    switch (g->op) {
    case 0: sg_relu_forward_cpu(g->a, g->y); break;
    case 1: sg_relu_backward_cpu(g->a, g->b, g->y); break;
    case 2: sg_gelu_forward_cpu(g->a, g->y); break;
    case 3: sg_gelu_backward_cpu(g->a, g->b, g->y); break;
    case 4: sg_add_forward_cpu(g->a, g->b, g->y); break;
    case 5: sg_silu_forward_cpu(g->a, g->y); break;
    case 6: sg_silu_backward_cpu(g->a, g->b, g->y); break;
    case 7: sg_sigmoid_forward_cpu(g->a, g->y); break;
    case 8: sg_sigmoid_backward_cpu(g->a, g->b, g->y); break;
    }
    return SG_OK;
}

static sg_status run_cpu(sg_ctx *ctx, int op, const sg_tensor *a, const sg_tensor *b, sg_tensor *y)
{
    act_args g = {op, a, b, y};
    return sg_cpu_run(ctx, act_cpu, &g, sizeof g);
}

/* Two tensors of one shape and one dtype: a float dtype the backend computes in, or bf16. */
static sg_status check_pair(sg_ctx *ctx, const char *fn, const char *wa, const sg_tensor *a,
                            const char *wb, const sg_tensor *b)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_check_float_or_bf16(ctx, fn, wa, a));
    return sg_check_same_shape(ctx, fn, wa, a, wb, b);
}

sg_status sg_relu_forward(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    SG_TRY(check_pair(ctx, "sg_relu_forward", "x", x, "y", y));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(x, NULL, y, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) return run_cpu(ctx, 0, x, NULL, y);
    return SG_CUDA_DISPATCH(ctx, sg_relu_forward_cuda(ctx, x, y));
}

sg_status sg_relu_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    SG_TRY(check_pair(ctx, "sg_relu_backward", "x", x, "dy", dy));
    SG_TRY(check_pair(ctx, "sg_relu_backward", "x", x, "dx", dx));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(x, dy, dx, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) return run_cpu(ctx, 1, x, dy, dx);
    return SG_CUDA_DISPATCH(ctx, sg_relu_backward_cuda(ctx, x, dy, dx));
}

sg_status sg_gelu_forward(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    SG_TRY(check_pair(ctx, "sg_gelu_forward", "x", x, "y", y));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(x, NULL, y, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) return run_cpu(ctx, 2, x, NULL, y);
    return SG_CUDA_DISPATCH(ctx, sg_gelu_forward_cuda(ctx, x, y));
}

sg_status sg_gelu_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    SG_TRY(check_pair(ctx, "sg_gelu_backward", "x", x, "dy", dy));
    SG_TRY(check_pair(ctx, "sg_gelu_backward", "x", x, "dx", dx));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(x, dy, dx, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) return run_cpu(ctx, 3, x, dy, dx);
    return SG_CUDA_DISPATCH(ctx, sg_gelu_backward_cuda(ctx, x, dy, dx));
}

sg_status sg_add_forward(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b, sg_tensor *y)
{
    SG_TRY(check_pair(ctx, "sg_add_forward", "a", a, "b", b));
    SG_TRY(check_pair(ctx, "sg_add_forward", "a", a, "y", y));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(a, b, y, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) return run_cpu(ctx, 4, a, b, y);
    return SG_CUDA_DISPATCH(ctx, sg_add_forward_cuda(ctx, a, b, y));
}

sg_status sg_silu_forward(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    SG_TRY(check_pair(ctx, "sg_silu_forward", "x", x, "y", y));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(x, NULL, y, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) return run_cpu(ctx, 5, x, NULL, y);
    return SG_CUDA_DISPATCH(ctx, sg_silu_forward_cuda(ctx, x, y));
}

sg_status sg_silu_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    SG_TRY(check_pair(ctx, "sg_silu_backward", "x", x, "dy", dy));
    SG_TRY(check_pair(ctx, "sg_silu_backward", "x", x, "dx", dx));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(x, dy, dx, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) return run_cpu(ctx, 6, x, dy, dx);
    return SG_CUDA_DISPATCH(ctx, sg_silu_backward_cuda(ctx, x, dy, dx));
}

sg_status sg_sigmoid_forward(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    SG_TRY(check_pair(ctx, "sg_sigmoid_forward", "x", x, "y", y));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(x, NULL, y, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) return run_cpu(ctx, 7, x, NULL, y);
    return SG_CUDA_DISPATCH(ctx, sg_sigmoid_forward_cuda(ctx, x, y));
}

/* Reads the forward's output y, not x. */
sg_status sg_sigmoid_backward(sg_ctx *ctx, const sg_tensor *y, const sg_tensor *dy, sg_tensor *dx)
{
    SG_TRY(check_pair(ctx, "sg_sigmoid_backward", "y", y, "dy", dy));
    SG_TRY(check_pair(ctx, "sg_sigmoid_backward", "y", y, "dx", dx));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(y, dy, dx, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) return run_cpu(ctx, 8, y, dy, dx);
    return SG_CUDA_DISPATCH(ctx, sg_sigmoid_backward_cuda(ctx, y, dy, dx));
}
