/* conv.c: public entry points of the 2-D convolution (sg_conv2d_create, _forward, _backward
 * and the plan's accessors): check every argument against the plan (dtypes, shapes, outputs
 * that overlap anything else the call touches), then run the CPU reference through sg_cpu_run
 * or the CUDA path (cuDNN, or stepgraph's depthwise kernels where the plan chose them). The plan fixes the shapes and the dtype (f32, bf16, or f64 on the CPU) of x, w, b,
 * y and their gradients: a tensor of another shape or dtype is refused by name. */
#include "ops/conv.h"
#include "ops/linear.h"

#include <limits.h>
#include <stdlib.h>

/* ---- checks ---- */

static const char *shape4_str(const int64_t s[4], sg_dtype dt, char *buf, size_t n)
{
    snprintf(buf, n, "(%lld, %lld, %lld, %lld) %s", (long long)s[0], (long long)s[1],
             (long long)s[2], (long long)s[3], sg_dtype_name(dt));
    return buf;
}

/* t is the plan's dtype and has shape want[0..ndim). */
static sg_status check_as_plan(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                               const sg_conv2d *c, int ndim, const int64_t *want)
{
    SG_TRY(sg_check_tensor(ctx, fn, what, t));
    bool same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == want[i];
    if (same && t->dtype == c->dtype) return SG_OK;
    char s[96], e[96];
    if (ndim == 4)
        shape4_str(want, c->dtype, e, sizeof e);
    else
        snprintf(e, sizeof e, "(%lld) %s", (long long)want[0], sg_dtype_name(c->dtype));
    return sg_fail(ctx, same ? SG_ERR_DTYPE : SG_ERR_SHAPE,
                   "%s: '%s' is %s, expected %s (the plan's)", fn, what,
                   sg_shape_str(t, s, sizeof s), e);
}

/* The plan is there and belongs to ctx. */
static sg_status check_plan(sg_ctx *ctx, const char *fn, const sg_conv2d *c)
{
    if (!c)
        return sg_fail(ctx, SG_ERR_NULL, "%s: the plan is NULL (make one with sg_conv2d_create)",
                       fn);
    if (c->ctx != ctx)
        return sg_fail(ctx, SG_ERR_BACKEND, "%s: the plan belongs to another context", fn);
    return SG_OK;
}

/* ---- the plan ---- */

sg_status sg_conv2d_create(sg_ctx *ctx, const int64_t x_shape[4], const int64_t w_shape[4],
                           const sg_conv2d_params *p, sg_dtype dtype, sg_conv2d **out)
{
    const char *fn = "sg_conv2d_create";
    if (!ctx) return SG_ERR_NULL;
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "%s: out is NULL", fn);
    *out = NULL;
    if (!x_shape || !w_shape || !p)
        return sg_fail(ctx, SG_ERR_NULL, "%s: %s is NULL", fn,
                       !x_shape ? "x_shape" : !w_shape ? "w_shape" : "params");
    bool cpu = ctx->backend == SG_BACKEND_CPU;
    if (!(dtype == SG_DTYPE_F32 || dtype == SG_DTYPE_BF16 || (cpu && dtype == SG_DTYPE_F64)))
        return sg_fail(ctx, SG_ERR_DTYPE, "%s: dtype %s, expected f32 or bf16%s", fn,
                       sg_dtype_name(dtype), cpu ? " or f64" : " (f64: CPU backend only)");
    if (p->stride_h < 1 || p->stride_w < 1 || p->pad_h < 0 || p->pad_w < 0 || p->dil_h < 1 ||
        p->dil_w < 1 || p->groups < 1)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "%s: stride %dx%d, padding %dx%d, dilation %dx%d, groups %d; expected "
                       "stride, dilation and groups >= 1 and padding >= 0",
                       fn, p->stride_h, p->stride_w, p->pad_h, p->pad_w, p->dil_h, p->dil_w,
                       p->groups);
    char sx[96], sw[96];
    shape4_str(x_shape, dtype, sx, sizeof sx);
    shape4_str(w_shape, dtype, sw, sizeof sw);
    for (int i = 0; i < 4; i++)
        if (x_shape[i] < 1 || w_shape[i] < 1)
            return sg_fail(ctx, SG_ERR_SHAPE, "%s: x %s, w %s: every dimension must be >= 1", fn,
                           sx, sw);
    const int64_t G = p->groups, Cin = x_shape[3], Cout = w_shape[0];
    if (Cin % G || Cout % G)
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: groups %lld must divide Cin %lld (x's last dim) and Cout %lld (w's "
                       "first dim)",
                       fn, (long long)G, (long long)Cin, (long long)Cout);
    if (w_shape[3] * G != Cin)
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: w is %s but x is %s with %lld group(s): w's last dim must be Cin / "
                       "groups = %lld",
                       fn, sw, sx, (long long)G, (long long)(Cin / G));
    /* (OH - 1) stride_h, before the division: negative when the kernel overhangs. */
    int64_t oh_span = x_shape[1] + 2 * (int64_t)p->pad_h - p->dil_h * (w_shape[1] - 1) - 1;
    int64_t ow_span = x_shape[2] + 2 * (int64_t)p->pad_w - p->dil_w * (w_shape[2] - 1) - 1;
    if (oh_span < 0 || ow_span < 0)
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: the %lldx%lld kernel (dilation %dx%d) spans more than x's padded "
                       "%lldx%lld image: no output",
                       fn, (long long)w_shape[1], (long long)w_shape[2], p->dil_h, p->dil_w,
                       (long long)(x_shape[1] + 2 * p->pad_h),
                       (long long)(x_shape[2] + 2 * p->pad_w));

    sg_conv2d *c = calloc(1, sizeof *c);
    if (!c) return sg_fail(ctx, SG_ERR_OOM, "%s: out of host memory for the plan", fn);
    c->ctx = ctx;
    c->dtype = dtype;
    c->p = *p;
    memcpy(c->x_shape, x_shape, sizeof c->x_shape);
    memcpy(c->w_shape, w_shape, sizeof c->w_shape);
    c->y_shape[0] = x_shape[0];
    c->y_shape[1] = oh_span / p->stride_h + 1;
    c->y_shape[2] = ow_span / p->stride_w + 1;
    c->y_shape[3] = Cout;
    if (cpu) {
        *out = c;
        return SG_OK;
    }

#ifndef SG_HAVE_CUDNN
    free(c);
    return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                   "%s: this build of stepgraph has no cuDNN, which the CUDA convolution needs "
                   "(install cuDNN 9 and rebuild, or use the CPU backend)",
                   fn);
#else
    sg_status st = sg_capture_forbid(ctx, fn, "made a convolution plan (cuDNN set-up, workspace)",
                                     "create plans before capturing");
    /* cuDNN's 4-D descriptors take int dimensions and strides. */
    const int64_t *big[3] = {x_shape, w_shape, c->y_shape};
    for (int t = 0; st == SG_OK && t < 3; t++) {
        int64_t n = big[t][0] * big[t][1] * big[t][2] * big[t][3];
        if (n > INT_MAX)
            st = sg_fail(ctx, SG_ERR_UNSUPPORTED,
                         "%s: %s has %lld elements; cuDNN's descriptors take at most %d (split "
                         "the batch)",
                         fn, t == 0 ? "x" : t == 1 ? "w" : "y", (long long)n, INT_MAX);
    }
    const char *one = getenv("STEPGRAPH_CONV_1X1");
    if (st == SG_OK && one && strcmp(one, "gemm") && strcmp(one, "cudnn"))
        st = sg_fail(ctx, SG_ERR_INVALID, "%s: STEPGRAPH_CONV_1X1='%s': expected gemm (the default) or cudnn", fn,
                     one);
    c->gemm = w_shape[1] == 1 && w_shape[2] == 1 && p->stride_h == 1 && p->stride_w == 1 && p->pad_h == 0 &&
              p->pad_w == 0 && G == 1 && !(one && !strcmp(one, "cudnn"));
    if (st == SG_OK && !c->gemm) st = sg_conv2d_plan_cuda(ctx, c);
    if (st != SG_OK) {
        sg_conv2d_free_cuda(c);
        free(c);
        return st;
    }
    *out = c;
    return SG_OK;
#endif
}

void sg_conv2d_destroy(sg_conv2d *c)
{
    if (!c) return;
#ifdef SG_HAVE_CUDNN
    sg_conv2d_free_cuda(c);
#endif
    free(c);
}

void sg_conv2d_out_shape(const sg_conv2d *c, int64_t y_shape[4])
{
    if (!c || !y_shape) return;
    memcpy(y_shape, c->y_shape, sizeof c->y_shape);
}

size_t sg_conv2d_workspace_bytes(const sg_conv2d *c) { return c ? c->ws_bytes : 0; }

/* ---- runs ---- */

/* The output positions N OH OW: the rows of a 1x1 convolution's matrix product. */
static inline int64_t pos(const sg_conv2d *c) { return c->y_shape[0] * c->y_shape[1] * c->y_shape[2]; }

/* The CPU references run through sg_cpu_run, so that a CPU capture records them. */
typedef struct conv_args {
    const sg_conv2d *c;
    const sg_tensor *x, *w, *b, *dy;
    sg_tensor *y, *dx, *dw, *db;
} conv_args;

static sg_status conv_forward_cpu(sg_ctx *ctx, const void *p)
{
    const conv_args *a = p;
    return sg_conv2d_forward_cpu(ctx, a->c, a->x, a->w, a->b, a->y);
}

static sg_status conv_backward_cpu(sg_ctx *ctx, const void *p)
{
    const conv_args *a = p;
    return sg_conv2d_backward_cpu(ctx, a->c, a->x, a->w, a->dy, a->dx, a->dw, a->db);
}

sg_status sg_conv2d_forward(sg_ctx *ctx, sg_conv2d *c, const sg_tensor *x, const sg_tensor *w,
                            const sg_tensor *b, sg_tensor *y)
{
    const char *fn = "sg_conv2d_forward";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_plan(ctx, fn, c));
    SG_TRY(check_as_plan(ctx, fn, "x", x, c, 4, c->x_shape));
    SG_TRY(check_as_plan(ctx, fn, "w", w, c, 4, c->w_shape));
    if (b) SG_TRY(check_as_plan(ctx, fn, "b", b, c, 1, &c->w_shape[0]));
    SG_TRY(check_as_plan(ctx, fn, "y", y, c, 4, c->y_shape));
    const char *names[] = {"y", "x", "w", "b"};
    const sg_tensor *ts[] = {y, x, w, b};
    SG_TRY(sg_check_disjoint(ctx, fn, 1, 4, names, ts));
    const double conv_flops = 2.0 * (double)(y->numel / c->y_shape[3]) * (double)w->numel;
    sg_ctx_count_work(ctx, SG_WORK_CONV, conv_flops, sg_tensors_bytes(x, w, b, y, NULL, NULL, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        conv_args a = {.c = c, .x = x, .w = w, .b = b, .y = y};
        return sg_cpu_run(ctx, conv_forward_cpu, &a, sizeof a);
    }
#ifdef SG_HAVE_CUDNN
    if (c->gemm) return sg_linear_forward_cuda(ctx, x, w, b, SG_ACT_NONE, NULL, y, NULL, pos(c), c->y_shape[3], c->x_shape[3]);
    return sg_conv2d_forward_cuda(ctx, c, x, w, b, y);
#else
    return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: this build of stepgraph has no cuDNN", fn);
#endif
}

sg_status sg_conv2d_backward(sg_ctx *ctx, sg_conv2d *c, const sg_tensor *x, const sg_tensor *w,
                             const sg_tensor *dy, sg_tensor *dx, sg_tensor *dw, sg_tensor *db)
{
    const char *fn = "sg_conv2d_backward";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_plan(ctx, fn, c));
    SG_TRY(check_as_plan(ctx, fn, "x", x, c, 4, c->x_shape));
    SG_TRY(check_as_plan(ctx, fn, "w", w, c, 4, c->w_shape));
    SG_TRY(check_as_plan(ctx, fn, "dy", dy, c, 4, c->y_shape));
    if (dx) SG_TRY(check_as_plan(ctx, fn, "dx", dx, c, 4, c->x_shape));
    SG_TRY(check_as_plan(ctx, fn, "dw", dw, c, 4, c->w_shape));
    if (db) SG_TRY(check_as_plan(ctx, fn, "db", db, c, 1, &c->w_shape[0]));
    const char *names[] = {"dx", "dw", "db", "x", "w", "dy"};
    const sg_tensor *ts[] = {dx, dw, db, x, w, dy};
    SG_TRY(sg_check_disjoint(ctx, fn, 3, 6, names, ts));
    /* dw, and dx when asked: each the forward's products */
    const double conv_flops = 2.0 * (double)(dy->numel / c->y_shape[3]) * (double)w->numel;
    sg_ctx_count_work(ctx, SG_WORK_CONV, (dx ? 2 : 1) * conv_flops, sg_tensors_bytes(x, w, dy, dx, dw, db, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        conv_args a = {.c = c, .x = x, .w = w, .dy = dy, .dx = dx, .dw = dw, .db = db};
        return sg_cpu_run(ctx, conv_backward_cpu, &a, sizeof a);
    }
#ifdef SG_HAVE_CUDNN
    if (c->gemm) /* dy is not overwritten: no activation */
        return sg_linear_backward_cuda(ctx, x, w, (sg_tensor *)dy, SG_ACT_NONE, NULL, dx, dw, db, NULL, pos(c),
                                       c->y_shape[3], c->x_shape[3]);
    return sg_conv2d_backward_cuda(ctx, c, x, w, dy, dx, dw, db);
#else
    return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: this build of stepgraph has no cuDNN", fn);
#endif
}
