/* effnet.c: EfficientNet's two modules of its own, made from a builder on NHWC image batches
 * (rows, H, W, C): squeeze-excitation (x scaled per channel by a gate computed from x's
 * average) and stochastic depth (a residual branch dropped per image). Built from the existing
 * ops only; outputs allocated when a module is made, input gradients at sg_builder_finish, so a
 * step allocates nothing. f32 or bf16 activations, as the other vision modules (vision.c, whose
 * argument checks these share). */
#include "nn/nn.h"

#include <stdio.h>
#include <stdlib.h>

static sg_status set_rows_all(sg_tensor **t, int n, int64_t rows)
{
    for (int i = 0; i < n; i++)
        if (t[i]) SG_TRY(sg_tensor_set_rows(t[i], rows));
    return SG_OK;
}

/* ---- squeeze-excitation: y = x * sigmoid(fc2(silu(fc1(avgpool(x))))) per (image, channel) ---- */

typedef struct se_module {
    sg_module base;
    int iw1, ib1, iw2, ib2;       /* fc1 (Csq, C) + (Csq), fc2 (C, Csq) + (C) */
    int64_t hwc[3], csq, rows;
    const sg_tensor *x;
    /* forward: pooled (rows, C), h1 = fc1 (rows, Csq), a1 = silu(h1), h2 = fc2 (rows, C),
     * s = sigmoid(h2), y (rows, H, W, C) */
    sg_tensor *pooled, *h1, *a1, *h2, *s, *y;
    /* backward: ds, dh2 (rows, C); da1, dh1 (rows, Csq); dpooled (rows, C); dxs (rows, H, W, C)
     * the scale path's dx, shared by every SE of this size; dx made at finish when needed */
    sg_tensor *ds, *dh2, *da1, *dh1, *dpooled, *dxs, *dx;
} se_module;

enum { SE_ROW_TENSORS = 12 }; /* the tensors above but dxs (shared) and dx (set apart) */

static sg_status se_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    se_module *e = (se_module *)m;
    SG_TRY(sg_vision_check_image(m, "input", x, e->rows, e->hwc, false));
    e->x = x;
    SG_TRY(sg_avgpool_forward(m->ctx, x, e->pooled));
    SG_TRY(sg_linear_forward(m->ctx, e->pooled, sg_module_w(m, e->iw1), sg_module_w(m, e->ib1), SG_ACT_NONE, e->h1,
                             NULL));
    SG_TRY(sg_silu_forward(m->ctx, e->h1, e->a1));
    SG_TRY(sg_linear_forward(m->ctx, e->a1, sg_module_w(m, e->iw2), sg_module_w(m, e->ib2), SG_ACT_NONE, e->h2,
                             NULL));
    SG_TRY(sg_sigmoid_forward(m->ctx, e->h2, e->s));
    SG_TRY(sg_channel_scale_forward(m->ctx, x, e->s, e->y));
    *y = e->y;
    return SG_OK;
}

/* x reaches y twice, scaled directly and through the gate: dx = dy s (the scale path) + the
 * average pool's backward of d(pooled) (the gate path). dy is scratch: the pool's backward
 * writes into it once the scale path has read it. */
static sg_status se_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    se_module *e = (se_module *)m;
    if (!e->x) return sg_module_no_forward(m);
    if (!m->no_input_grad && !e->dx) return sg_module_no_dx(m);
    SG_TRY(sg_channel_scale_backward(m->ctx, e->x, e->s, dy, e->dxs, e->ds));
    SG_TRY(sg_sigmoid_backward(m->ctx, e->s, e->ds, e->dh2));
    SG_TRY(sg_linear_backward(m->ctx, e->a1, sg_module_w(m, e->iw2), e->dh2, SG_ACT_NONE, NULL, e->da1,
                              sg_module_g(m, e->iw2), sg_module_g(m, e->ib2)));
    SG_TRY(sg_silu_backward(m->ctx, e->h1, e->da1, e->dh1));
    sg_tensor *dp = m->no_input_grad ? NULL : e->dpooled;
    SG_TRY(sg_linear_backward(m->ctx, e->pooled, sg_module_w(m, e->iw1), e->dh1, SG_ACT_NONE, NULL, dp,
                              sg_module_g(m, e->iw1), sg_module_g(m, e->ib1)));
    *dx = NULL;
    if (m->no_input_grad) return SG_OK;
    SG_TRY(sg_avgpool_backward(m->ctx, e->dpooled, dy));
    SG_TRY(sg_add_forward(m->ctx, e->dxs, dy, e->dx));
    *dx = e->dx;
    return SG_OK;
}

static void se_destroy(sg_module *m)
{
    se_module *e = (se_module *)m;
    sg_tensor *t[SE_ROW_TENSORS] = {e->pooled, e->h1, e->a1, e->h2, e->s, e->y,
                                    e->ds, e->dh2, e->da1, e->dh1, e->dpooled, e->dx};
    for (int i = 0; i < SE_ROW_TENSORS; i++) sg_tensor_destroy(t[i]);
    free(e); /* dxs is the builder's */
}

static sg_status se_set_rows(sg_module *m, int64_t rows)
{
    se_module *e = (se_module *)m;
    sg_tensor *t[SE_ROW_TENSORS + 1] = {e->pooled, e->h1, e->a1, e->h2, e->s, e->y, e->ds,
                                        e->dh2, e->da1, e->dh1, e->dpooled, e->dxs, e->dx};
    SG_TRY(set_rows_all(t, SE_ROW_TENSORS + 1, rows));
    e->rows = rows;
    return SG_OK;
}

static sg_status se_finish(sg_module *m)
{
    se_module *e = (se_module *)m;
    if (m->no_input_grad || e->dx) return SG_OK;
    SG_TRY(sg_module_buffer(m, m->b->opts.precision, "dx", 4, (int64_t[]){m->b->rows, e->hwc[0], e->hwc[1], e->hwc[2]},
                            &e->dx));
    return e->rows == m->b->rows ? SG_OK : sg_tensor_set_rows(e->dx, e->rows);
}

static const sg_module_i se_i = {"squeeze_excitation", se_forward, se_backward, se_destroy, se_set_rows, se_finish};

sg_status sg_module_squeeze_excitation(sg_builder *b, const char *name, int64_t H, int64_t W, int64_t C,
                                       int64_t Csq, sg_module **m)
{
    const char *fn = "sg_module_squeeze_excitation";
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "%s: '%s': m is NULL", fn, name ? name : "");
    *m = NULL;
    SG_TRY(sg_vision_precision(b, fn, name));
    SG_TRY(sg_vision_check_hwc(b, fn, name, "input", H, W, C));
    if (Csq < 1)
        return sg_fail(b->ctx, SG_ERR_SHAPE, "%s: '%s': Csq %lld: expected at least 1", fn, name ? name : "",
                       (long long)Csq);
    se_module *e = calloc(1, sizeof *e);
    if (!e) return sg_fail(b->ctx, SG_ERR_OOM, "%s: out of host memory", fn);
    SG_TRY(sg_module_init(b, &e->base, &se_i, name));
    e->hwc[0] = H, e->hwc[1] = W, e->hwc[2] = C, e->csq = Csq, e->rows = b->rows;
    /* torchvision's fc1 and fc2 are 1x1 convolutions: weight (out, in, 1, 1) is this (out, in),
     * with PyTorch's default bounds 1/sqrt(in) on weight and bias. */
    e->iw1 = sg_module_declare(&e->base, "fc1.weight", 2, (int64_t[]){Csq, C}, SG_INIT_UNIFORM_FAN_IN, C, 1);
    e->ib1 = sg_module_declare(&e->base, "fc1.bias", 1, &Csq, SG_INIT_UNIFORM_FAN_IN, C, 0);
    e->iw2 = sg_module_declare(&e->base, "fc2.weight", 2, (int64_t[]){C, Csq}, SG_INIT_UNIFORM_FAN_IN, Csq, 1);
    e->ib2 = sg_module_declare(&e->base, "fc2.bias", 1, &C, SG_INIT_UNIFORM_FAN_IN, Csq, 0);
    if (e->iw1 < 0 || e->ib1 < 0 || e->iw2 < 0 || e->ib2 < 0) return SG_ERR_INVALID;
    const int64_t R = b->rows, rc[2] = {R, C}, rq[2] = {R, Csq}, img[4] = {R, H, W, C};
    sg_tensor **row_c[] = {&e->pooled, &e->h2, &e->s, &e->ds, &e->dh2, &e->dpooled};
    const char *row_c_names[] = {"pooled", "h2", "s", "ds", "dh2", "dpooled"};
    for (int i = 0; i < 6; i++) SG_TRY(sg_module_buffer(&e->base, b->opts.precision, row_c_names[i], 2, rc, row_c[i]));
    sg_tensor **row_q[] = {&e->h1, &e->a1, &e->da1, &e->dh1};
    const char *row_q_names[] = {"h1", "a1", "da1", "dh1"};
    for (int i = 0; i < 4; i++) SG_TRY(sg_module_buffer(&e->base, b->opts.precision, row_q_names[i], 2, rq, row_q[i]));
    SG_TRY(sg_module_buffer(&e->base, b->opts.precision, "y", 4, img, &e->y));
    /* Backward scratch: one module's backward uses it at a time. */
    char sh[SG_MODULE_NAME_MAX];
    snprintf(sh, sizeof sh, "squeeze_excitation.dxs.%lldx%lldx%lld", (long long)H, (long long)W, (long long)C);
    e->dxs = sg_builder_shared(b, sh, b->opts.precision, 4, img);
    if (!e->dxs) return SG_ERR_OOM; /* the message is set */
    *m = &e->base;
    return SG_OK;
}

/* ---- stochastic depth ("row" mode): y = x keep[row] / (1 - p) while training ---- */

typedef struct sd_module {
    sg_module base;
    float p;
    int64_t hwc[3], rows;
    sg_tensor *rng;
    uint32_t site;
    bool ran;
    /* ones (rows, 1) -> dropout -> keep (rows, 1) -> times ones (rows, C, 1, 1) -> s4 (rows, C,
     * 1, 1), read through s (rows, C): the row's factor broadcast over its channels (exact:
     * 1 x k). All NULL when p is 0. */
    sg_tensor *ones, *keep, *ones4, *s4, *s;
    sg_tensor *y, *dx;
} sd_module;

static bool sd_active(const sd_module *d) { return d->y && !d->base.b->eval; }

static sg_status sd_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    sd_module *d = (sd_module *)m;
    SG_TRY(sg_vision_check_image(m, "input", x, d->rows, d->hwc, false));
    d->ran = true;
    if (!sd_active(d)) { /* p = 0, or evaluating: the identity */
        *y = x;
        return SG_OK;
    }
    SG_TRY(sg_dropout_forward(m->ctx, d->ones, d->p, d->rng, d->site, d->keep));
    SG_TRY(sg_channel_scale_forward(m->ctx, d->ones4, d->keep, d->s4));
    SG_TRY(sg_channel_scale_forward(m->ctx, x, d->s, d->y));
    *y = d->y;
    return SG_OK;
}

/* dx = dy keep[row] / (1 - p): the forward's map again, with the same factors. */
static sg_status sd_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    sd_module *d = (sd_module *)m;
    if (!d->ran) return sg_module_no_forward(m);
    if (!sd_active(d)) {
        *dx = dy;
        return SG_OK;
    }
    SG_TRY(sg_channel_scale_forward(m->ctx, dy, d->s, d->dx));
    *dx = d->dx;
    return SG_OK;
}

static void sd_destroy(sg_module *m)
{
    sd_module *d = (sd_module *)m;
    sg_tensor_destroy(d->s); /* a view of s4: first */
    sg_tensor *t[6] = {d->ones, d->keep, d->ones4, d->s4, d->y, d->dx};
    for (int i = 0; i < 6; i++) sg_tensor_destroy(t[i]);
    free(d);
}

static sg_status sd_set_rows(sg_module *m, int64_t rows)
{
    sd_module *d = (sd_module *)m;
    sg_tensor *t[7] = {d->ones, d->keep, d->ones4, d->s4, d->s, d->y, d->dx};
    SG_TRY(set_rows_all(t, 7, rows));
    d->rows = rows;
    return SG_OK;
}

static const sg_module_i sd_i = {"stochastic_depth", sd_forward, sd_backward, sd_destroy, sd_set_rows, NULL};

sg_status sg_module_stochastic_depth(sg_builder *b, const char *name, int64_t H, int64_t W, int64_t C, float p,
                                     sg_module **m)
{
    const char *fn = "sg_module_stochastic_depth";
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "%s: '%s': m is NULL", fn, name ? name : "");
    *m = NULL;
    SG_TRY(sg_vision_precision(b, fn, name));
    SG_TRY(sg_vision_check_hwc(b, fn, name, "input", H, W, C));
    if (!(p >= 0.f && p < 1.f))
        return sg_fail(b->ctx, SG_ERR_INVALID, "%s: '%s': p %g: expected 0 <= p < 1", fn, name ? name : "",
                       (double)p);
    /* The trainer moves the generator on each step only for a builder that drops (sg_trainer_step):
     * without that every step would drop the same images. */
    if (p > 0.f && !(b->opts.dropout > 0.f))
        return sg_fail(b->ctx, SG_ERR_INVALID, "%s: '%s': p %g needs the builder's dropout above 0 (its generator "
                       "draws fresh masks each step only then); the builder's is %g", fn, name ? name : "",
                       (double)p, (double)b->opts.dropout);
    sd_module *d = calloc(1, sizeof *d);
    if (!d) return sg_fail(b->ctx, SG_ERR_OOM, "%s: out of host memory", fn);
    SG_TRY(sg_module_init(b, &d->base, &sd_i, name));
    d->p = p, d->rows = b->rows;
    d->hwc[0] = H, d->hwc[1] = W, d->hwc[2] = C;
    if (p == 0.f) { /* the identity, always: no generator site, no buffers */
        *m = &d->base;
        return SG_OK;
    }
    SG_TRY(sg_builder_rng(b, 1, &d->rng, &d->site));
    const int64_t R = b->rows, img[4] = {R, H, W, C};
    /* ones and ones4 hold constants and s4 has a view made now: never in a recompute arena */
    SG_TRY(sg_module_buffer_kept(&d->base, b->opts.precision, "ones", 2, (int64_t[]){R, 1}, &d->ones));
    SG_TRY(sg_module_buffer(&d->base, b->opts.precision, "keep", 2, (int64_t[]){R, 1}, &d->keep));
    SG_TRY(sg_module_buffer_kept(&d->base, b->opts.precision, "ones4", 4, (int64_t[]){R, C, 1, 1}, &d->ones4));
    SG_TRY(sg_module_buffer_kept(&d->base, b->opts.precision, "s4", 4, (int64_t[]){R, C, 1, 1}, &d->s4));
    char vn[SG_MODULE_NAME_MAX + 8];
    snprintf(vn, sizeof vn, "%s.s", sg_module_label(&d->base));
    SG_TRY(sg_tensor_view(d->s4, 0, 2, (int64_t[]){R, C}, vn, &d->s));
    SG_TRY(sg_tensor_fill(d->ones, 1.0));
    SG_TRY(sg_tensor_fill(d->ones4, 1.0));
    SG_TRY(sg_module_buffer(&d->base, b->opts.precision, "y", 4, img, &d->y));
    SG_TRY(sg_module_buffer(&d->base, b->opts.precision, "dx", 4, img, &d->dx));
    *m = &d->base;
    return SG_OK;
}
