/* linear.c: public entry points of the linear layer: check every argument (dtypes, shapes,
 * the act / pre / act_in contract, outputs that overlap inputs), then run the CPU reference
 * or the CUDA path. Messages name the call and the tensor. One dtype per call (x's): f32,
 * f64 on the CPU, or bf16 on both backends. */
#include "ops/linear.h"

/* A matrix argument of rows x cols: any shape whose last dim is cols and whose leading dims
 * multiply to rows (so (B,T,C) activations pass as (B*T, C)), of x's dtype. */
static sg_status check_rows(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                            int64_t rows, int64_t cols, sg_dtype dt)
{
    SG_TRY(sg_check_dtype(ctx, fn, what, t, dt));
    if (t->shape[t->ndim - 1] != cols || t->numel / cols != rows) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: '%s' is %s, expected (%lld, %lld) (or leading dims whose product "
                       "is %lld)",
                       fn, what, sg_shape_str(t, s, sizeof s), (long long)rows, (long long)cols,
                       (long long)rows);
    }
    return SG_OK;
}

/* A bias (or bias gradient) of n elements. */
static sg_status check_vec(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                           int64_t n, sg_dtype dt)
{
    SG_TRY(sg_check_dtype(ctx, fn, what, t, dt));
    if (t->ndim != 1 || t->shape[0] != n) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: '%s' is %s, expected (%lld)", fn, what,
                       sg_shape_str(t, s, sizeof s), (long long)n);
    }
    return SG_OK;
}

/* x (..., K) and w (N, K): sets m, n, k. x sets the call's dtype: f32, f64 (CPU) or bf16
 * (mixed precision, both backends); every other tensor must have it, or the call fails with
 * SG_ERR_DTYPE naming that tensor. */
static sg_status check_x_w(sg_ctx *ctx, const char *fn, const sg_tensor *x, const sg_tensor *w,
                           int64_t *m, int64_t *n, int64_t *k)
{
    SG_TRY(sg_check_float_or_bf16(ctx, fn, "x", x));
    *k = x->shape[x->ndim - 1];
    *m = x->numel / *k;
    SG_TRY(sg_check_dtype(ctx, fn, "w", w, x->dtype));
    if (w->ndim != 2) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: 'w' is %s, expected 2-D (out, %lld)", fn,
                       sg_shape_str(w, s, sizeof s), (long long)*k);
    }
    *n = w->shape[0];
    return sg_check_shape2(ctx, fn, "w", w, *n, *k);
}

static sg_status check_act(sg_ctx *ctx, const char *fn, sg_activation act)
{
    if (act == SG_ACT_NONE || act == SG_ACT_RELU || act == SG_ACT_GELU) return SG_OK;
    return sg_fail(ctx, SG_ERR_INVALID, "%s: act %d is not SG_ACT_NONE, SG_ACT_RELU or SG_ACT_GELU",
                   fn, (int)act);
}

/* The CPU reference runs through sg_cpu_run, so a CPU capture records it. */
typedef struct lin_args {
    const sg_tensor *x, *w, *b, *act_in, *r; /* r: the forward's residual, or NULL */
    sg_activation act;
    sg_tensor *dy, *out, *pre, *dw, *db; /* out: y (forward) or dx (backward) */
    int64_t m, n, k;
    sg_linear_through th;                /* backward: x_act NONE, or through it */
} lin_args;

static sg_status lin_fwd_cpu(sg_ctx *ctx, const void *p)
{
    const lin_args *a = p;
    return sg_linear_forward_cpu(ctx, a->x, a->w, a->b, a->act, a->r, a->out, a->pre, a->m, a->n, a->k);
}

static sg_status lin_bwd_cpu(sg_ctx *ctx, const void *p)
{
    const lin_args *a = p;
    return sg_linear_backward_cpu(ctx, a->x, a->w, a->dy, a->act, a->act_in, a->out, a->dw, a->db, &a->th,
                                  a->m, a->n, a->k);
}

/* sg_linear_forward, and with r sg_linear_forward_residual (act NONE, pre NULL). */
static sg_status forward(sg_ctx *ctx, const char *fn, const sg_tensor *x, const sg_tensor *w, const sg_tensor *b,
                         sg_activation act, const sg_tensor *r, sg_tensor *y, sg_tensor *pre)
{
    int64_t m = 0, n = 0, k = 0; /* set by check_x_w (0: quiets -Wmaybe-uninitialized) */
    SG_TRY(check_act(ctx, fn, act));
    SG_TRY(check_x_w(ctx, fn, x, w, &m, &n, &k));
    if (b) SG_TRY(check_vec(ctx, fn, "b", b, n, x->dtype));
    SG_TRY(check_rows(ctx, fn, "y", y, m, n, x->dtype));
    if (act == SG_ACT_GELU) {
        if (!pre)
            return sg_fail(ctx, SG_ERR_NULL,
                           "%s: tensor 'pre' is NULL; act GELU needs it (the backward reads the "
                           "pre-activation)", fn);
        SG_TRY(check_rows(ctx, fn, "pre", pre, m, n, x->dtype));
    } else if (pre) {
        return sg_fail(ctx, SG_ERR_INVALID,
                       "%s: tensor 'pre' must be NULL unless act is GELU (it is only written for "
                       "GELU; the ReLU backward reads y)", fn);
    }
    const char *in_names[] = {"x", "w", "b"};
    const sg_tensor *ins[] = {x, w, b};
    for (int i = 0; i < 3; i++) {
        SG_TRY(sg_check_not_overlapping(ctx, fn, "y", y, in_names[i], ins[i]));
        SG_TRY(sg_check_not_overlapping(ctx, fn, "pre", pre, in_names[i], ins[i]));
    }
    SG_TRY(sg_check_not_overlapping(ctx, fn, "y", y, "pre", pre));
    if (r) { /* y may be r itself (each element is read before it is written), or apart from it */
        SG_TRY(check_rows(ctx, fn, "r", r, m, n, x->dtype));
        if (r->data != y->data) SG_TRY(sg_check_not_overlapping(ctx, fn, "y", y, "r", r));
    }

    sg_ctx_count_work(ctx, SG_WORK_MATMUL, 2.0 * (double)m * (double)n * (double)k,
                      sg_tensors_bytes(x, w, b, y, pre, r, NULL, NULL));
    if (ctx->backend == SG_BACKEND_CPU) {
        lin_args a = {x, w, b, NULL, r, act, NULL, y, pre, NULL, NULL, m, n, k, {SG_ACT_NONE, NULL, NULL}};
        return sg_cpu_run(ctx, lin_fwd_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_linear_forward_cuda(ctx, x, w, b, act, r, y, pre, m, n, k));
}

sg_status sg_linear_forward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                            const sg_tensor *b, sg_activation act, sg_tensor *y, sg_tensor *pre)
{
    if (!ctx) return SG_ERR_NULL;
    return forward(ctx, "sg_linear_forward", x, w, b, act, NULL, y, pre);
}

sg_status sg_linear_forward_residual(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w, const sg_tensor *b,
                                     const sg_tensor *r, sg_tensor *y)
{
    static const char fn[] = "sg_linear_forward_residual";
    if (!ctx) return SG_ERR_NULL;
    if (!r) return sg_fail(ctx, SG_ERR_NULL, "%s: tensor 'r' (the residual) is NULL", fn);
    return forward(ctx, fn, x, w, b, SG_ACT_NONE, r, y, NULL);
}

/* sg_linear_backward, and with th->x_act not NONE sg_linear_backward_through (dx is dx_pre). */
static sg_status backward(sg_ctx *ctx, const char *fn, const sg_tensor *x, const sg_tensor *w, sg_tensor *dy,
                          sg_activation act, const sg_tensor *act_in, sg_tensor *dx, sg_tensor *dw, sg_tensor *db,
                          const sg_linear_through *th)
{
    if (!ctx) return SG_ERR_NULL;
    int64_t m = 0, n = 0, k = 0; /* set by check_x_w (0: quiets -Wmaybe-uninitialized) */
    SG_TRY(check_act(ctx, fn, act));
    SG_TRY(check_x_w(ctx, fn, x, w, &m, &n, &k));
    SG_TRY(check_rows(ctx, fn, "dy", dy, m, n, x->dtype));
    if (act != SG_ACT_NONE) {
        if (!act_in)
            return sg_fail(ctx, SG_ERR_NULL,
                           "%s: tensor 'act_in' is NULL; act %s needs it (the forward's %s)", fn,
                           act == SG_ACT_RELU ? "RELU" : "GELU",
                           act == SG_ACT_RELU ? "output y" : "pre");
        SG_TRY(check_rows(ctx, fn, "act_in", act_in, m, n, x->dtype));
    } else {
        act_in = NULL; /* ignored */
    }
    const bool through = th->x_act != SG_ACT_NONE;
    const char *dxn = through ? "dx_pre" : "dx";
    if (through) {
        if (th->x_act != SG_ACT_RELU && th->x_act != SG_ACT_GELU)
            return sg_fail(ctx, SG_ERR_INVALID, "%s: x_act %d: expected RELU or GELU (the activation x came from)",
                           fn, (int)th->x_act);
        if (!th->x_pre || !dx)
            return sg_fail(ctx, SG_ERR_NULL, "%s: tensor '%s' is NULL", fn, !th->x_pre ? "x_pre" : "dx_pre");
        SG_TRY(check_rows(ctx, fn, "x_pre", th->x_pre, m, k, x->dtype));
        if (th->x_db) SG_TRY(check_vec(ctx, fn, "x_db", th->x_db, k, x->dtype));
    }
    if (dx) SG_TRY(check_rows(ctx, fn, dxn, dx, m, k, x->dtype));
    SG_TRY(sg_check_dtype(ctx, fn, "dw", dw, x->dtype));
    SG_TRY(sg_check_shape2(ctx, fn, "dw", dw, n, k));
    if (db) SG_TRY(check_vec(ctx, fn, "db", db, n, x->dtype));

    /* Outputs (dy too: it receives d(pre)) must not overlap any other argument, except
     * act_in may be dy itself: that update is elementwise. */
    const char *names[] = {"dy", dxn, "dw", "db", "x_db", "x", "w", "act_in", "x_pre"};
    const sg_tensor *ts[] = {dy, dx, dw, db, through ? th->x_db : NULL, x, w, act_in, through ? th->x_pre : NULL};
    for (int o = 0; o < 5; o++)
        for (int i = 0; i < 9; i++)
            if (i != o && !(o == 0 && i == 7))
                SG_TRY(sg_check_not_overlapping(ctx, fn, names[o], ts[o], names[i], ts[i]));

    /* dw, and dx when asked; dy read (and, with an activation, written back as d(pre)); through
     * an activation x_pre read and x_db written. */
    sg_ctx_count_work(ctx, SG_WORK_MATMUL, (dx ? 4.0 : 2.0) * (double)m * (double)n * (double)k,
                      sg_tensors_bytes(x, w, dy, act_in, dx, dw, db, act != SG_ACT_NONE ? dy : NULL) +
                          (through ? sg_tensors_bytes(th->x_pre, th->x_db, NULL, NULL, NULL, NULL, NULL, NULL) : 0));
    if (ctx->backend == SG_BACKEND_CPU) {
        lin_args a = {x, w, NULL, act_in, NULL, act, dy, dx, NULL, dw, db, m, n, k, *th};
        return sg_cpu_run(ctx, lin_bwd_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_linear_backward_cuda(ctx, x, w, dy, act, act_in, dx, dw, db, th, m, n, k));
}

sg_status sg_linear_backward(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                             sg_tensor *dy, sg_activation act, const sg_tensor *act_in,
                             sg_tensor *dx, sg_tensor *dw, sg_tensor *db)
{
    const sg_linear_through none = {SG_ACT_NONE, NULL, NULL};
    return backward(ctx, "sg_linear_backward", x, w, dy, act, act_in, dx, dw, db, &none);
}

sg_status sg_linear_backward_through(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w, sg_tensor *dy,
                                     sg_activation act, const sg_tensor *act_in, sg_tensor *dw, sg_tensor *db,
                                     sg_activation x_act, const sg_tensor *x_pre, sg_tensor *dx_pre,
                                     sg_tensor *x_db)
{
    const sg_linear_through th = {x_act, x_pre, x_db};
    if (x_act == SG_ACT_NONE)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_linear_backward_through: x_act NONE: expected RELU or GELU "
                       "(without one, sg_linear_backward)");
    return backward(ctx, "sg_linear_backward_through", x, w, dy, act, act_in, dx_pre, dw, db, &th);
}

#ifndef SG_HAVE_CUDA
void sg_linear_tune_counts(sg_ctx *ctx, int *timed, int *switched)
{
    (void)ctx;
    *timed = *switched = 0;
}
#endif
