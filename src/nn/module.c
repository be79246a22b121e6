/* module.c: the modules: Linear (with a fused activation), standalone activations, and
 * Sequential. Each module allocates its outputs when it is created (shapes are static), so
 * a training step allocates nothing. Forward keeps a pointer to its input for the backward. */
#include "nn/nn.h"

#include <stdlib.h>

void sg_module_destroy(sg_module *m)
{
    if (m) m->vt->destroy(m);
}

/* ---- Linear ---- */

typedef struct linear_module {
    sg_module base;
    sg_tensor *w, *b, *dw, *db;   /* views, not owned */
    sg_activation act;
    const sg_tensor *x;           /* the last forward's input */
    sg_tensor *y, *pre, *dx;      /* owned; pre only for GELU, dx only when needed */
} linear_module;

static sg_status linear_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    linear_module *l = (linear_module *)m;
    l->x = x;
    SG_TRY(sg_linear_forward(m->ctx, x, l->w, l->b, l->act, l->y, l->pre));
    *y = l->y;
    return SG_OK;
}

static sg_status linear_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    linear_module *l = (linear_module *)m;
    if (!l->x)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_module_backward: '%s' ran no forward", m->name);
    const sg_tensor *act_in = l->act == SG_ACT_GELU ? l->pre : l->act == SG_ACT_RELU ? l->y : NULL;
    SG_TRY(sg_linear_backward(m->ctx, l->x, l->w, dy, l->act, act_in, l->dx, l->dw, l->db));
    *dx = l->dx;
    return SG_OK;
}

static void linear_destroy(sg_module *m)
{
    linear_module *l = (linear_module *)m;
    sg_tensor_destroy(l->y);
    sg_tensor_destroy(l->pre);
    sg_tensor_destroy(l->dx);
    free(l);
}

static sg_status linear_set_rows(sg_module *m, int64_t rows)
{
    linear_module *l = (linear_module *)m;
    SG_TRY(sg_tensor_set_rows(l->y, rows));
    if (l->pre) SG_TRY(sg_tensor_set_rows(l->pre, rows));
    if (l->dx) SG_TRY(sg_tensor_set_rows(l->dx, rows));
    return SG_OK;
}

static const sg_module_i linear_i = {"linear", linear_forward, linear_backward, linear_destroy,
                                     linear_set_rows};

sg_status sg_linear_create(sg_ctx *ctx, const char *name, int64_t rows, sg_tensor *w,
                           sg_tensor *b, sg_tensor *dw, sg_tensor *db, sg_activation act,
                           bool need_dx, sg_module **out)
{
    *out = NULL;
    if (!w || !dw || w->ndim != 2)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_linear_create: '%s' needs a 2-D weight and its gradient",
                       name);
    linear_module *l = calloc(1, sizeof *l);
    if (!l) return sg_fail(ctx, SG_ERR_OOM, "sg_linear_create: out of host memory");
    l->base.vt = &linear_i;
    l->base.ctx = ctx;
    snprintf(l->base.name, sizeof l->base.name, "%s", name);
    l->w = w, l->b = b, l->dw = dw, l->db = db, l->act = act;
    char n[96]; /* activations take the weight's dtype: bf16 under mixed precision */
    int64_t N = w->shape[0], K = w->shape[1];
    sg_status st;
    snprintf(n, sizeof n, "%s.y", name);
    st = sg_tensor_create(ctx, w->dtype, 2, (int64_t[]){rows, N}, n, &l->y);
    if (st == SG_OK && act == SG_ACT_GELU) {
        snprintf(n, sizeof n, "%s.pre", name);
        st = sg_tensor_create(ctx, w->dtype, 2, (int64_t[]){rows, N}, n, &l->pre);
    }
    if (st == SG_OK && need_dx) {
        snprintf(n, sizeof n, "%s.dx", name);
        st = sg_tensor_create(ctx, w->dtype, 2, (int64_t[]){rows, K}, n, &l->dx);
    }
    if (st != SG_OK) {
        linear_destroy(&l->base);
        return st;
    }
    *out = &l->base;
    return SG_OK;
}

/* ---- activations ---- */

typedef struct act_module {
    sg_module base;
    sg_activation act;
    const sg_tensor *x;
    sg_tensor *y, *dx;
} act_module;

static sg_status act_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    act_module *a = (act_module *)m;
    a->x = x;
    if (a->act == SG_ACT_RELU) SG_TRY(sg_relu_forward(m->ctx, x, a->y));
    else if (a->act == SG_ACT_GELU) SG_TRY(sg_gelu_forward(m->ctx, x, a->y));
    else SG_TRY(sg_tensor_copy(a->y, x));
    *y = a->y;
    return SG_OK;
}

static sg_status act_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    act_module *a = (act_module *)m;
    if (!a->x)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_module_backward: '%s' ran no forward", m->name);
    if (a->act == SG_ACT_RELU) SG_TRY(sg_relu_backward(m->ctx, a->x, dy, a->dx));
    else if (a->act == SG_ACT_GELU) SG_TRY(sg_gelu_backward(m->ctx, a->x, dy, a->dx));
    else SG_TRY(sg_tensor_copy(a->dx, dy));
    *dx = a->dx;
    return SG_OK;
}

static void act_destroy(sg_module *m)
{
    act_module *a = (act_module *)m;
    sg_tensor_destroy(a->y);
    sg_tensor_destroy(a->dx);
    free(a);
}

static sg_status act_set_rows(sg_module *m, int64_t rows)
{
    act_module *a = (act_module *)m;
    SG_TRY(sg_tensor_set_rows(a->y, rows));
    return sg_tensor_set_rows(a->dx, rows);
}

static const sg_module_i act_i = {"activation", act_forward, act_backward, act_destroy, act_set_rows};

sg_status sg_activation_create(sg_ctx *ctx, const char *name, sg_activation act, int ndim,
                               const int64_t *shape, sg_module **out)
{
    *out = NULL;
    act_module *a = calloc(1, sizeof *a);
    if (!a) return sg_fail(ctx, SG_ERR_OOM, "sg_activation_create: out of host memory");
    a->base.vt = &act_i;
    a->base.ctx = ctx;
    a->act = act;
    snprintf(a->base.name, sizeof a->base.name, "%s", name);
    sg_status st = sg_tensor_create(ctx, SG_DTYPE_F32, ndim, shape, name, &a->y);
    if (st == SG_OK) st = sg_tensor_create(ctx, SG_DTYPE_F32, ndim, shape, name, &a->dx);
    if (st != SG_OK) {
        act_destroy(&a->base);
        return st;
    }
    *out = &a->base;
    return SG_OK;
}

/* ---- Sequential ---- */

typedef struct seq_module {
    sg_module base;
    int n;
    sg_module **child;
    sg_backward_hook hook;        /* after each child's backward (data parallelism) */
    void *hook_user;
} seq_module;

static sg_status seq_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    seq_module *s = (seq_module *)m;
    const sg_tensor *h = x;
    for (int i = 0; i < s->n; i++) SG_TRY(sg_module_forward(s->child[i], h, &h));
    *y = h;
    return SG_OK;
}

static sg_status seq_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    seq_module *s = (seq_module *)m;
    sg_tensor *g = dy;
    for (int i = s->n - 1; i >= 0; i--) {
        SG_TRY(sg_module_backward(s->child[i], g, &g));
        if (s->hook) SG_TRY(s->hook(s->hook_user, i));
        if (!g && i > 0)
            return sg_fail(m->ctx, SG_ERR_INVALID,
                           "sg_module_backward: '%s' gives no input gradient, but '%s' comes before it",
                           s->child[i]->name, s->child[i - 1]->name);
    }
    *dx = g;
    return SG_OK;
}

static void seq_destroy(sg_module *m)
{
    seq_module *s = (seq_module *)m;
    for (int i = 0; i < s->n; i++) sg_module_destroy(s->child[i]);
    free(s->child);
    free(s);
}

static sg_status seq_set_rows(sg_module *m, int64_t rows)
{
    seq_module *s = (seq_module *)m;
    for (int i = 0; i < s->n; i++) SG_TRY(sg_module_set_rows(s->child[i], rows));
    return SG_OK;
}

static const sg_module_i seq_i = {"sequential", seq_forward, seq_backward, seq_destroy, seq_set_rows};

int sg_sequential_count(const sg_module *seq)
{
    return seq && seq->vt == &seq_i ? ((const seq_module *)seq)->n : 0;
}

sg_module *sg_sequential_child(const sg_module *seq, int i)
{
    if (i < 0 || i >= sg_sequential_count(seq)) return NULL;
    return ((const seq_module *)seq)->child[i];
}

sg_module *sg_sequential_replace(sg_module *seq, int i, sg_module *m)
{
    if (i < 0 || i >= sg_sequential_count(seq)) return NULL;
    seq_module *s = (seq_module *)seq;
    sg_module *old = s->child[i];
    s->child[i] = m;
    return old;
}

void sg_sequential_set_backward_hook(sg_module *seq, sg_backward_hook fn, void *user)
{
    if (!seq || seq->vt != &seq_i) return;
    seq_module *s = (seq_module *)seq;
    s->hook = fn;
    s->hook_user = user;
}

sg_status sg_sequential_create(sg_ctx *ctx, const char *name, sg_module **children, int n,
                               sg_module **out)
{
    *out = NULL;
    seq_module *s = calloc(1, sizeof *s);
    sg_module **c = calloc((size_t)(n > 0 ? n : 1), sizeof *c);
    if (!s || !c) {
        free(s), free(c);
        for (int i = 0; i < n; i++) sg_module_destroy(children[i]);
        return sg_fail(ctx, SG_ERR_OOM, "sg_sequential_create: out of host memory");
    }
    memcpy(c, children, (size_t)n * sizeof *c);
    s->base.vt = &seq_i;
    s->base.ctx = ctx;
    snprintf(s->base.name, sizeof s->base.name, "%s", name);
    s->n = n;
    s->child = c;
    *out = &s->base;
    return SG_OK;
}
