/* pool.c: public entry points of max pooling, global average pooling and channel scaling
 * (sg_maxpool2d_*, sg_avgpool_*, sg_channel_scale_*): check every argument (4-D channels-last
 * images, the window, shapes that follow from them, dtypes, outputs that overlap anything else
 * the call touches), then run the CPU reference through sg_cpu_run or the CUDA kernels. x (or
 * dy) sets the dtype of every float tensor of a call: f32, bf16, or f64 on the CPU. */
#include "ops/pool.h"

#include <stdio.h>

/* t is 4-D (N, H, W, C) of a float dtype the backend takes. */
static sg_status check_image(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t)
{
    SG_TRY(sg_check_float_or_bf16(ctx, fn, what, t));
    if (t->ndim != 4) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: '%s' is %s, expected an image batch (N, H, W, C)",
                       fn, what, sg_shape_str(t, s, sizeof s));
    }
    return SG_OK;
}

/* t has dtype dt and shape (want[0..nd-1]); why: what the shape follows from, for the message. */
static sg_status check_shape(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                             sg_dtype dt, int nd, const int64_t *want, const char *why)
{
    SG_TRY(sg_check_dtype(ctx, fn, what, t, dt));
    bool ok = t->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        char s[96], w[96];
        int k = snprintf(w, sizeof w, "(");
        for (int i = 0; i < nd; i++)
            k += snprintf(w + k, sizeof w - (size_t)k, "%s%lld", i ? ", " : "", (long long)want[i]);
        snprintf(w + k, sizeof w - (size_t)k, ")");
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: '%s' is %s, expected %s %s (%s)", fn, what,
                       sg_shape_str(t, s, sizeof s), w, sg_dtype_name(dt), why);
    }
    return SG_OK;
}

/* The window: k >= 1, stride >= 1, 0 <= pad <= k / 2 (so every window holds an element of the
 * image), and H, W big enough for one window. */
static sg_status check_window(sg_ctx *ctx, const char *fn, const sg_tensor *img, const char *what,
                              int k, int stride, int pad)
{
    if (k < 1 || stride < 1 || pad < 0 || pad > k / 2)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "%s: k %d, stride %d, pad %d; expected k >= 1, stride >= 1 and "
                       "0 <= pad <= k / 2",
                       fn, k, stride, pad);
    if (img->shape[1] + 2 * (int64_t)pad < k || img->shape[2] + 2 * (int64_t)pad < k) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: '%s' is %s: its padded image is smaller than the "
                       "%d x %d window",
                       fn, what, sg_shape_str(img, s, sizeof s), k, k);
    }
    if (img->shape[1] * img->shape[2] > INT32_MAX) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: '%s' is %s: H W exceeds the I32 argmax", fn, what,
                       sg_shape_str(img, s, sizeof s));
    }
    return SG_OK;
}

/* ---- CPU thunks (sg_cpu_run, so that a CPU capture records them) ---- */

typedef struct pool_args {
    int op; /* 0 maxpool fwd, 1 maxpool bwd, 2 avgpool fwd, 3 avgpool bwd, 4 scale fwd,
             * 5 scale bwd */
    int k, stride, pad;
    const sg_tensor *a, *b, *c;
    sg_tensor *y, *z;
} pool_args;

static sg_status pool_cpu(sg_ctx *ctx, const void *p)
{
    const pool_args *g = p;
    switch (g->op) {
    case 0: sg_maxpool2d_forward_cpu(g->a, g->k, g->stride, g->pad, g->y, g->z); break;
    case 1: sg_maxpool2d_backward_cpu(g->a, g->b, g->k, g->stride, g->pad, g->y); break;
    case 2: sg_avgpool_forward_cpu(g->a, g->y); break;
    case 3: sg_avgpool_backward_cpu(g->a, g->y); break;
    case 4: sg_channel_scale_forward_cpu(g->a, g->b, g->y); break;
    case 5: sg_channel_scale_backward_cpu(g->a, g->b, g->c, g->y, g->z); break;
    }
    return SG_OK;
}

static sg_status run_cpu(sg_ctx *ctx, pool_args g)
{
    return sg_cpu_run(ctx, pool_cpu, &g, sizeof g);
}

/* ---- max pooling ---- */

sg_status sg_maxpool2d_forward(sg_ctx *ctx, const sg_tensor *x, int k, int stride, int pad,
                               sg_tensor *y, sg_tensor *argmax)
{
    const char *fn = "sg_maxpool2d_forward";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_image(ctx, fn, "x", x));
    SG_TRY(check_window(ctx, fn, x, "x", k, stride, pad));
    const int64_t want[4] = {x->shape[0], sg_maxpool2d_out_size(x->shape[1], k, stride, pad),
                             sg_maxpool2d_out_size(x->shape[2], k, stride, pad), x->shape[3]};
    char why[96];
    snprintf(why, sizeof why, "k %d, stride %d, pad %d over x", k, stride, pad);
    SG_TRY(check_shape(ctx, fn, "y", y, x->dtype, 4, want, why));
    SG_TRY(check_shape(ctx, fn, "argmax", argmax, SG_DTYPE_I32, 4, want, why));
    const char *names[] = {"y", "argmax", "x"};
    const sg_tensor *ts[] = {y, argmax, x};
    SG_TRY(sg_check_disjoint(ctx, fn, 2, 3, names, ts));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(x, y, argmax, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU)
        return run_cpu(
            ctx, (pool_args){
                     .op = 0, .k = k, .stride = stride, .pad = pad, .a = x, .y = y, .z = argmax});
    return SG_CUDA_DISPATCH(ctx, sg_maxpool2d_forward_cuda(ctx, x, k, stride, pad, y, argmax));
}

sg_status sg_maxpool2d_backward(sg_ctx *ctx, const sg_tensor *dy, const sg_tensor *argmax, int k,
                                int stride, int pad, sg_tensor *dx)
{
    const char *fn = "sg_maxpool2d_backward";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_image(ctx, fn, "dy", dy));
    SG_TRY(check_image(ctx, fn, "dx", dx));
    SG_TRY(check_window(ctx, fn, dx, "dx", k, stride, pad));
    const int64_t want[4] = {dx->shape[0], sg_maxpool2d_out_size(dx->shape[1], k, stride, pad),
                             sg_maxpool2d_out_size(dx->shape[2], k, stride, pad), dx->shape[3]};
    char why[96];
    snprintf(why, sizeof why, "k %d, stride %d, pad %d over dx", k, stride, pad);
    SG_TRY(check_shape(ctx, fn, "dy", dy, dx->dtype, 4, want, why));
    SG_TRY(check_shape(ctx, fn, "argmax", argmax, SG_DTYPE_I32, 4, want, why));
    const char *names[] = {"dx", "dy", "argmax"};
    const sg_tensor *ts[] = {dx, dy, argmax};
    SG_TRY(sg_check_disjoint(ctx, fn, 1, 3, names, ts));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(dx, dy, argmax, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU)
        return run_cpu(
            ctx, (pool_args){
                     .op = 1, .k = k, .stride = stride, .pad = pad, .a = dy, .b = argmax, .y = dx});
    return SG_CUDA_DISPATCH(ctx, sg_maxpool2d_backward_cuda(ctx, dy, argmax, k, stride, pad, dx));
}

/* ---- global average pooling ---- */

sg_status sg_avgpool_forward(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    const char *fn = "sg_avgpool_forward";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_image(ctx, fn, "x", x));
    const int64_t want[2] = {x->shape[0], x->shape[3]};
    SG_TRY(check_shape(ctx, fn, "y", y, x->dtype, 2, want, "(N, C) of x"));
    SG_TRY(sg_check_not_overlapping(ctx, fn, "y", y, "x", x));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(x, y, NULL, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) return run_cpu(ctx, (pool_args){.op = 2, .a = x, .y = y});
    return SG_CUDA_DISPATCH(ctx, sg_avgpool_forward_cuda(ctx, x, y));
}

sg_status sg_avgpool_backward(sg_ctx *ctx, const sg_tensor *dy, sg_tensor *dx)
{
    const char *fn = "sg_avgpool_backward";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_image(ctx, fn, "dx", dx));
    const int64_t want[2] = {dx->shape[0], dx->shape[3]};
    SG_TRY(check_shape(ctx, fn, "dy", dy, dx->dtype, 2, want, "(N, C) of dx"));
    SG_TRY(sg_check_not_overlapping(ctx, fn, "dx", dx, "dy", dy));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(dy, dx, NULL, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) return run_cpu(ctx, (pool_args){.op = 3, .a = dy, .y = dx});
    return SG_CUDA_DISPATCH(ctx, sg_avgpool_backward_cuda(ctx, dy, dx));
}

/* ---- channel scaling ---- */

sg_status sg_channel_scale_forward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *s,
                                   sg_tensor *y)
{
    const char *fn = "sg_channel_scale_forward";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_image(ctx, fn, "x", x));
    const int64_t want[2] = {x->shape[0], x->shape[3]};
    SG_TRY(check_shape(ctx, fn, "s", s, x->dtype, 2, want, "(N, C) of x"));
    SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "y", y));
    const char *names[] = {"y", "x", "s"};
    const sg_tensor *ts[] = {y, x, s};
    SG_TRY(sg_check_disjoint(ctx, fn, 1, 3, names, ts));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(x, s, y, NULL, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU)
        return run_cpu(ctx, (pool_args){.op = 4, .a = x, .b = s, .y = y});
    return SG_CUDA_DISPATCH(ctx, sg_channel_scale_forward_cuda(ctx, x, s, y));
}

sg_status sg_channel_scale_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *s,
                                    const sg_tensor *dy, sg_tensor *dx, sg_tensor *ds)
{
    const char *fn = "sg_channel_scale_backward";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_image(ctx, fn, "x", x));
    const int64_t want[2] = {x->shape[0], x->shape[3]};
    SG_TRY(check_shape(ctx, fn, "s", s, x->dtype, 2, want, "(N, C) of x"));
    SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "dy", dy));
    SG_TRY(sg_check_same_shape(ctx, fn, "x", x, "dx", dx));
    SG_TRY(check_shape(ctx, fn, "ds", ds, x->dtype, 2, want, "(N, C) of x"));
    const char *names[] = {"dx", "ds", "x", "s", "dy"};
    const sg_tensor *ts[] = {dx, ds, x, s, dy};
    SG_TRY(sg_check_disjoint(ctx, fn, 2, 5, names, ts));
    sg_ctx_count_work(ctx, SG_WORK_ELEMENTWISE, 0, sg_tensors_bytes(dx, ds, x, s, dy, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU)
        return run_cpu(ctx, (pool_args){.op = 5, .a = x, .b = s, .c = dy, .y = dx, .z = ds});
    return SG_CUDA_DISPATCH(ctx, sg_channel_scale_backward_cuda(ctx, x, s, dy, dx, ds));
}
