/* module.c: the general built-in modules, made from a builder: Linear (with its activation
 * fused into the matmul's epilogue), standalone activations, dropout, residual and
 * Sequential. Each module allocates its outputs when it is made (shapes are static) and binds
 * its parameters when the model is built (sg_builder_finish), so a training step allocates
 * nothing. Forward keeps a pointer to its input for the backward. The transformer's modules
 * are in transformer.c. */
#include "nn/nn.h"

#include <stdlib.h>

/* ---- the errors every module's backward shares ---- */

sg_status sg_module_no_forward(sg_module *m)
{
    return sg_fail(m->ctx, SG_ERR_INVALID, "sg_module_backward: '%s' ran no forward", sg_module_label(m));
}

sg_status sg_module_no_dx(sg_module *m)
{
    return sg_fail(m->ctx, SG_ERR_INVALID, "sg_module_backward: '%s' has no input gradient buffer: its model was "
                   "not finished (sg_builder_finish)", sg_module_label(m));
}

/* ---- Linear ---- */

typedef struct linear_module {
    sg_module base;
    int iw, ib;                   /* parameter handles (ib -1: no bias) */
    sg_tensor *w, *b, *dw, *db;   /* bound at finish: views of the parameter set */
    sg_activation act;
    int64_t in, out;
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
    if (!l->x) return sg_module_no_forward(m);
    const sg_tensor *act_in = l->act == SG_ACT_GELU ? l->pre : l->act == SG_ACT_RELU ? l->y : NULL;
    /* A region of the context's second stream (sg_ctx_side_enter): its dw matmul beside dx. */
    sg_ctx_side_enter(m->ctx);
    sg_status st = sg_linear_backward(m->ctx, l->x, l->w, dy, l->act, act_in, l->dx, l->dw, l->db);
    sg_status joined = sg_ctx_side_leave(m->ctx);
    SG_TRY(st != SG_OK ? st : joined);
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

/* The first module of a model computes no input gradient (no dx buffer, no dgrad matmul). */
static sg_status linear_finish(sg_module *m)
{
    linear_module *l = (linear_module *)m;
    l->w = sg_module_w(m, l->iw), l->dw = sg_module_g(m, l->iw);
    l->b = sg_module_w(m, l->ib), l->db = sg_module_g(m, l->ib);
    if (!m->no_input_grad && !l->dx)
        SG_TRY(sg_module_buffer(m, m->b->opts.precision, "dx", 2, (int64_t[]){m->b->rows, l->in}, &l->dx));
    return SG_OK;
}

static const sg_module_i linear_i = {"linear", linear_forward, linear_backward, linear_destroy, linear_set_rows,
                                     linear_finish};

sg_status sg_module_linear_init(sg_builder *b, const char *name, int64_t in, int64_t out, int bias,
                                sg_activation act, sg_init init, sg_module **m)
{
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "sg_module_linear: '%s': m is NULL", name ? name : "");
    *m = NULL;
    if (in < 1 || out < 1)
        return sg_fail(b->ctx, SG_ERR_SHAPE, "sg_module_linear: '%s': %lld inputs and %lld outputs: expected "
                       "at least 1 of each", name ? name : "", (long long)in, (long long)out);
    if (act != SG_ACT_NONE && act != SG_ACT_RELU && act != SG_ACT_GELU)
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_module_linear: '%s': unknown activation %d", name ? name : "",
                       (int)act);
    linear_module *l = calloc(1, sizeof *l);
    if (!l) return sg_fail(b->ctx, SG_ERR_OOM, "sg_module_linear: out of host memory");
    SG_TRY(sg_module_init(b, &l->base, &linear_i, name));
    l->act = act, l->in = in, l->out = out, l->ib = -1;
    /* weight (out, in) with decay; bias (out) without; PyTorch's names and default bounds. */
    l->iw = sg_module_declare(&l->base, "weight", 2, (int64_t[]){out, in}, init, in, 1);
    if (l->iw < 0) return SG_ERR_INVALID; /* the module stays with the builder, which frees it */
    if (bias) {
        l->ib = sg_module_declare(&l->base, "bias", 1, &out, init == SG_INIT_NORMAL_002 ? SG_INIT_ZEROS : init,
                                  in, 0);
        if (l->ib < 0) return SG_ERR_INVALID;
    }
    sg_dtype dt = b->opts.precision; /* activations take the compute dtype: bf16 under mixed precision */
    SG_TRY(sg_module_buffer(&l->base, dt, "y", 2, (int64_t[]){b->rows, out}, &l->y));
    if (act == SG_ACT_GELU) SG_TRY(sg_module_buffer(&l->base, dt, "pre", 2, (int64_t[]){b->rows, out}, &l->pre));
    *m = &l->base;
    return SG_OK;
}

sg_status sg_module_linear(sg_builder *b, const char *name, int64_t in, int64_t out, int bias,
                           sg_activation act, sg_module **m)
{
    return sg_module_linear_init(b, name, in, out, bias, act, SG_INIT_UNIFORM_FAN_IN, m);
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
    else if (a->act == SG_ACT_SILU) SG_TRY(sg_silu_forward(m->ctx, x, a->y));
    else if (a->act == SG_ACT_SIGMOID) SG_TRY(sg_sigmoid_forward(m->ctx, x, a->y));
    else SG_TRY(sg_tensor_copy(a->y, x));
    *y = a->y;
    return SG_OK;
}

static sg_status act_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    act_module *a = (act_module *)m;
    if (!a->x) return sg_module_no_forward(m);
    if (a->act == SG_ACT_RELU) SG_TRY(sg_relu_backward(m->ctx, a->x, dy, a->dx));
    else if (a->act == SG_ACT_GELU) SG_TRY(sg_gelu_backward(m->ctx, a->x, dy, a->dx));
    else if (a->act == SG_ACT_SILU) SG_TRY(sg_silu_backward(m->ctx, a->x, dy, a->dx));
    else if (a->act == SG_ACT_SIGMOID) SG_TRY(sg_sigmoid_backward(m->ctx, a->y, dy, a->dx));
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

static const sg_module_i act_i = {"activation", act_forward, act_backward, act_destroy, act_set_rows, NULL};

sg_status sg_module_activation(sg_builder *b, const char *name, sg_activation act, int64_t features,
                               sg_module **m)
{
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "sg_module_activation: m is NULL");
    *m = NULL;
    if (features < 1 || act < SG_ACT_NONE || act > SG_ACT_SIGMOID)
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_module_activation: '%s': %lld features, activation %d: "
                       "expected at least 1 feature and NONE, RELU, GELU, SILU or SIGMOID", name ? name : "",
                       (long long)features, (int)act);
    act_module *a = calloc(1, sizeof *a);
    if (!a) return sg_fail(b->ctx, SG_ERR_OOM, "sg_module_activation: out of host memory");
    SG_TRY(sg_module_init(b, &a->base, &act_i, name));
    a->act = act;
    int64_t shape[2] = {b->rows, features};
    SG_TRY(sg_module_buffer(&a->base, b->opts.precision, "y", 2, shape, &a->y));
    SG_TRY(sg_module_buffer(&a->base, b->opts.precision, "dx", 2, shape, &a->dx));
    *m = &a->base;
    return SG_OK;
}

/* ---- dropout ---- */

typedef struct dropout_module {
    sg_module base;
    sg_tensor *rng;
    uint32_t site;
    sg_tensor *y, *dx;            /* NULL when the builder's probability is 0 */
} dropout_module;

static sg_status dropout_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    dropout_module *d = (dropout_module *)m;
    if (!d->y || m->b->eval) { /* identity: the input passes through */
        *y = x;
        return SG_OK;
    }
    SG_TRY(sg_dropout_forward(m->ctx, x, m->b->opts.dropout, d->rng, d->site, d->y));
    *y = d->y;
    return SG_OK;
}

static sg_status dropout_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    dropout_module *d = (dropout_module *)m;
    if (!d->y) {
        *dx = dy;
        return SG_OK;
    }
    SG_TRY(sg_dropout_backward(m->ctx, dy, m->b->opts.dropout, d->rng, d->site, d->dx));
    *dx = d->dx;
    return SG_OK;
}

static void dropout_destroy(sg_module *m)
{
    dropout_module *d = (dropout_module *)m;
    sg_tensor_destroy(d->y);
    sg_tensor_destroy(d->dx);
    free(d);
}

static sg_status dropout_set_rows(sg_module *m, int64_t rows)
{
    dropout_module *d = (dropout_module *)m;
    if (!d->y) return SG_OK;
    SG_TRY(sg_tensor_set_rows(d->y, rows));
    return sg_tensor_set_rows(d->dx, rows);
}

static const sg_module_i dropout_i = {"dropout", dropout_forward, dropout_backward, dropout_destroy,
                                      dropout_set_rows, NULL};

sg_status sg_module_dropout(sg_builder *b, const char *name, int64_t features, sg_module **m)
{
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "sg_module_dropout: m is NULL");
    *m = NULL;
    if (features < 1)
        return sg_fail(b->ctx, SG_ERR_SHAPE, "sg_module_dropout: '%s': %lld features: expected at least 1",
                       name ? name : "", (long long)features);
    dropout_module *d = calloc(1, sizeof *d);
    if (!d) return sg_fail(b->ctx, SG_ERR_OOM, "sg_module_dropout: out of host memory");
    SG_TRY(sg_module_init(b, &d->base, &dropout_i, name));
    SG_TRY(sg_builder_rng(b, 1, &d->rng, &d->site));
    if (b->opts.dropout > 0) {
        int64_t shape[2] = {b->rows, features};
        SG_TRY(sg_module_buffer(&d->base, b->opts.precision, "y", 2, shape, &d->y));
        SG_TRY(sg_module_buffer(&d->base, b->opts.precision, "dx", 2, shape, &d->dx));
    }
    *m = &d->base;
    return SG_OK;
}

/* ---- residual: y = x + inner(x) ---- */

typedef struct residual_module {
    sg_module base;
    sg_module *inner;
    sg_tensor *y, *g, *dx;        /* g: dy's copy for the inner backward, which may overwrite it */
} residual_module;

static sg_status residual_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    residual_module *r = (residual_module *)m;
    const sg_tensor *h = NULL;
    SG_TRY(sg_module_forward(r->inner, x, &h));
    SG_TRY(sg_add_forward(m->ctx, x, h, r->y));
    *y = r->y;
    return SG_OK;
}

static sg_status residual_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    residual_module *r = (residual_module *)m;
    sg_tensor *di = NULL;
    SG_TRY(sg_tensor_copy(r->g, dy));
    SG_TRY(sg_module_backward(r->inner, r->g, &di));
    if (!di)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_module_backward: '%s' inside residual '%s' gave no input "
                       "gradient", sg_module_label(r->inner), sg_module_label(m));
    SG_TRY(sg_add_forward(m->ctx, dy, di, r->dx)); /* the identity path carries dy through */
    *dx = r->dx;
    return SG_OK;
}

static void residual_destroy(sg_module *m)
{
    residual_module *r = (residual_module *)m;
    sg_module_free(r->inner);
    sg_tensor_destroy(r->y), sg_tensor_destroy(r->g), sg_tensor_destroy(r->dx);
    free(r);
}

static sg_status residual_set_rows(sg_module *m, int64_t rows)
{
    residual_module *r = (residual_module *)m;
    SG_TRY(sg_tensor_set_rows(r->y, rows));
    SG_TRY(sg_tensor_set_rows(r->g, rows));
    SG_TRY(sg_tensor_set_rows(r->dx, rows));
    return sg_module_set_rows(r->inner, rows);
}

static sg_status residual_finish(sg_module *m)
{
    residual_module *r = (residual_module *)m;
    r->inner->no_input_grad = false; /* the branch's input gradient is added to dy */
    return sg_module_finish(r->inner);
}

static const sg_module_i residual_i = {"residual", residual_forward, residual_backward, residual_destroy,
                                       residual_set_rows, residual_finish};

sg_status sg_module_residual(sg_builder *b, const char *name, sg_module *inner, int64_t features,
                             sg_module **m)
{
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "sg_module_residual: m is NULL");
    *m = NULL;
    if (features < 1)
        return sg_fail(b->ctx, SG_ERR_SHAPE, "sg_module_residual: '%s': %lld features: expected at least 1",
                       name ? name : "", (long long)features);
    residual_module *r = calloc(1, sizeof *r);
    if (!r) return sg_fail(b->ctx, SG_ERR_OOM, "sg_module_residual: out of host memory");
    SG_TRY(sg_module_init(b, &r->base, &residual_i, name));
    SG_TRY(sg_module_adopt(&r->base, &inner, 1));
    r->inner = inner;
    int64_t shape[2] = {b->rows, features};
    SG_TRY(sg_module_buffer(&r->base, b->opts.precision, "y", 2, shape, &r->y));
    SG_TRY(sg_module_buffer(&r->base, b->opts.precision, "dy", 2, shape, &r->g));
    SG_TRY(sg_module_buffer(&r->base, b->opts.precision, "dx", 2, shape, &r->dx));
    *m = &r->base;
    return SG_OK;
}

/* ---- Sequential ---- */

typedef struct seq_module {
    sg_module base;
    int n;
    sg_module **child;
    sg_child_hook hook;        /* after each child's backward (data parallelism) */
    void *hook_user;
    sg_child_hook fwd_hook;    /* before each child's forward (a sharded optimizer's gathers) */
    void *fwd_hook_user;
} seq_module;

static sg_status seq_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    seq_module *s = (seq_module *)m;
    const sg_tensor *h = x;
    for (int i = 0; i < s->n; i++) {
        if (s->fwd_hook) SG_TRY(s->fwd_hook(s->fwd_hook_user, i));
        SG_TRY(sg_module_forward(s->child[i], h, &h));
    }
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
                           sg_module_label(s->child[i]), sg_module_label(s->child[i - 1]));
    }
    *dx = g;
    return SG_OK;
}

static void seq_destroy(sg_module *m)
{
    seq_module *s = (seq_module *)m;
    for (int i = 0; i < s->n; i++) sg_module_free(s->child[i]);
    free(s->child);
    free(s);
}

static sg_status seq_set_rows(sg_module *m, int64_t rows)
{
    seq_module *s = (seq_module *)m;
    for (int i = 0; i < s->n; i++) SG_TRY(sg_module_set_rows(s->child[i], rows));
    return SG_OK;
}

/* Only the first child's input is the Sequential's own: the others feed a gradient back. */
static sg_status seq_finish(sg_module *m)
{
    seq_module *s = (seq_module *)m;
    for (int i = 0; i < s->n; i++) {
        s->child[i]->no_input_grad = i == 0 && m->no_input_grad;
        SG_TRY(sg_module_finish(s->child[i]));
    }
    return SG_OK;
}

static const sg_module_i seq_i = {"sequential", seq_forward, seq_backward, seq_destroy, seq_set_rows, seq_finish};

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

void sg_sequential_set_backward_hook(sg_module *seq, sg_child_hook fn, void *user)
{
    if (!seq || seq->vt != &seq_i) return;
    seq_module *s = (seq_module *)seq;
    s->hook = fn;
    s->hook_user = user;
}

void sg_sequential_set_forward_hook(sg_module *seq, sg_child_hook fn, void *user)
{
    if (!seq || seq->vt != &seq_i) return;
    seq_module *s = (seq_module *)seq;
    s->fwd_hook = fn;
    s->fwd_hook_user = user;
}

#define SG_SEQUENTIAL_MAX 4096

sg_status sg_module_sequential(sg_builder *b, const char *name, sg_module **children, int n, sg_module **m)
{
    if (!b) return SG_ERR_NULL;
    if (!m || (!children && n > 0))
        return sg_fail(b->ctx, SG_ERR_NULL, "sg_module_sequential: m or children is NULL");
    *m = NULL;
    if (n < 1 || n > SG_SEQUENTIAL_MAX)
        return sg_fail(b->ctx, SG_ERR_INVALID, "sg_module_sequential: '%s': %d children: expected 1 to %d",
                       name ? name : "", n, SG_SEQUENTIAL_MAX);
    seq_module *s = calloc(1, sizeof *s);
    sg_module **c = calloc((size_t)n, sizeof *c);
    if (!s || !c) {
        free(s), free(c);
        return sg_fail(b->ctx, SG_ERR_OOM, "sg_module_sequential: out of host memory");
    }
    sg_status st = sg_module_init(b, &s->base, &seq_i, name);
    if (st != SG_OK) {
        free(c);
        return st;
    }
    s->child = c; /* from here the builder frees s (and c) if anything fails */
    SG_TRY(sg_module_adopt(&s->base, children, n));
    memcpy(c, children, (size_t)n * sizeof *c);
    s->n = n;
    *m = &s->base;
    return SG_OK;
}
