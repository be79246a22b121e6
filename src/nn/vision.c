/* vision.c: the vision modules, made from a builder: 2-D convolution (one plan, made for the
 * builder's rows), batch norm with its activation (ReLU fused into the op) and running
 * statistics in buffers, max and global average pooling, and ResNet's residual block (which
 * hands its sum and ReLU to main's last batch norm when it has one). Images are NHWC,
 * (rows, H, W, C). Each module allocates its outputs when it is made and its input gradient by
 * sg_builder_finish (none where the model does not need it), so a step allocates nothing.
 * Activations in the builder's precision: f32, or bf16 under mixed precision (convolutions on
 * bf16 tensor cores; batch norm's statistics, weight and bias in f32: it reads the f32 master
 * weight and bias, and converts its f32 gradients into the bf16 gradient buffer). A bf16 model's
 * first convolution takes the data set's f32 images and converts them. */
#include "nn/nn.h"

#include <stdlib.h>
#include <string.h>

#define SG_BN_MOMENTUM 0.1f /* PyTorch's */
#define SG_BN_EPS 1e-5f

sg_status sg_vision_precision(sg_builder *b, const char *fn, const char *name)
{
    if (b->opts.precision == SG_DTYPE_F32 || b->opts.precision == SG_DTYPE_BF16) return SG_OK;
    return sg_fail(b->ctx, SG_ERR_UNSUPPORTED, "%s: '%s': the vision modules run f32 or bf16 activations; the "
                   "builder's precision is %s", fn, name ? name : "", sg_dtype_name(b->opts.precision));
}

/* Image sizes (H, W, C) of a module's input or output: every one at least 1. */
sg_status sg_vision_check_hwc(sg_builder *b, const char *fn, const char *name, const char *what, int64_t H,
                              int64_t W, int64_t C)
{
    if (H >= 1 && W >= 1 && C >= 1) return SG_OK;
    return sg_fail(b->ctx, SG_ERR_SHAPE, "%s: '%s': %s (H, W, C) = (%lld, %lld, %lld): expected every size >= 1",
                   fn, name ? name : "", what, (long long)H, (long long)W, (long long)C);
}

sg_status sg_vision_check_image(sg_module *m, const char *what, const sg_tensor *t, int64_t rows,
                                const int64_t hwc[3], bool f32_ok)
{
    if (!t)
        return sg_fail(m->ctx, SG_ERR_NULL, "sg_module_forward: '%s' (%s): its %s is NULL", sg_module_label(m),
                       m->vt->kind, what);
    sg_dtype dt = m->b->opts.precision;
    bool ok = t->ndim == 4 && (t->dtype == dt || (f32_ok && t->dtype == SG_DTYPE_F32)) && t->shape[0] == rows;
    for (int i = 0; ok && i < 3; i++) ok = t->shape[i + 1] == hwc[i];
    if (ok) return SG_OK;
    char s[96];
    return sg_fail(m->ctx, SG_ERR_SHAPE, "sg_module_forward: '%s' (%s) takes an image batch (%lld, %lld, %lld, %lld) "
                   "%s as its %s (NHWC: rows, H, W, C); '%s' is %s %s", sg_module_label(m), m->vt->kind,
                   (long long)rows, (long long)hwc[0], (long long)hwc[1], (long long)hwc[2], sg_dtype_name(dt), what,
                   t->name, sg_shape_str(t, s, sizeof s), sg_dtype_name(t->dtype));
}

static sg_status check_image(sg_module *m, const char *what, const sg_tensor *t, int64_t rows, const int64_t hwc[3])
{
    return sg_vision_check_image(m, what, t, rows, hwc, false);
}


/* An image batch (rows, hwc) of the module's own, in the model's precision. */
static sg_status image_buffer(sg_module *m, const char *what, int64_t rows, const int64_t hwc[3], sg_tensor **out)
{
    return sg_module_buffer(m, m->b->opts.precision, what, 4, (int64_t[]){rows, hwc[0], hwc[1], hwc[2]}, out);
}

/* ---- 2-D convolution ---- */

typedef struct conv_module {
    sg_module base;
    sg_conv2d *plan;              /* for (b->rows, in) -> (b->rows, out) */
    int iw, ib;                   /* ib -1: no bias */
    int64_t in[3], out[3];        /* (H, W, C) */
    const sg_tensor *x;
    sg_tensor *y, *dx;            /* dx made at finish, when the input gradient is needed */
    sg_tensor *xc;                /* a bf16 model's first conv: its f32 input converted (finish) */
} conv_module;

static sg_status conv_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    conv_module *c = (conv_module *)m;
    SG_TRY(sg_vision_check_image(m, "input", x, m->b->rows, c->in, c->xc != NULL));
    if (x->dtype != c->y->dtype) { /* f32 images into a bf16 model */
        SG_TRY(sg_tensor_convert(c->xc, x));
        x = c->xc;
    }
    c->x = x;
    SG_TRY(sg_conv2d_forward(m->ctx, c->plan, x, sg_module_w(m, c->iw), sg_module_w(m, c->ib), c->y));
    *y = c->y;
    return SG_OK;
}

static sg_status conv_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    conv_module *c = (conv_module *)m;
    if (!c->x) return sg_module_no_forward(m);
    sg_tensor *d = m->no_input_grad ? NULL : c->dx; /* the first module: no dgrad at all */
    if (!m->no_input_grad && !d) return sg_module_no_dx(m);
    SG_TRY(sg_conv2d_backward(m->ctx, c->plan, c->x, sg_module_w(m, c->iw), dy, d, sg_module_g(m, c->iw),
                              sg_module_g(m, c->ib)));
    *dx = d;
    return SG_OK;
}

static void conv_destroy(sg_module *m)
{
    conv_module *c = (conv_module *)m;
    sg_conv2d_destroy(c->plan);
    sg_tensor_destroy(c->y), sg_tensor_destroy(c->dx), sg_tensor_destroy(c->xc);
    free(c);
}

/* The plan (cuDNN's descriptors, algorithms and workspace) is made for one batch: the rows
 * the model was built with run, others are refused rather than computed on a stale plan. */
static sg_status conv_set_rows(sg_module *m, int64_t rows)
{
    if (rows == m->b->rows) return SG_OK;
    return sg_fail(m->ctx, SG_ERR_UNSUPPORTED, "'%s' (conv2d): its convolution plan is made for %lld rows; a "
                   "variable batch (%lld rows) is not supported by the convolution module yet", sg_module_label(m),
                   (long long)m->b->rows, (long long)rows);
}

static sg_status conv_finish(sg_module *m)
{
    conv_module *c = (conv_module *)m;
    if (!m->no_input_grad && !c->dx) SG_TRY(image_buffer(m, "dx", m->b->rows, c->in, &c->dx));
    /* The model's first module in bf16 takes the data set's f32 images. */
    if (m->no_input_grad && m->b->opts.precision != SG_DTYPE_F32 && !c->xc)
        SG_TRY(image_buffer(m, "x", m->b->rows, c->in, &c->xc));
    return SG_OK;
}

static const sg_module_i conv_i = {"conv2d", conv_forward, conv_backward, conv_destroy, conv_set_rows,
                                   conv_finish};

sg_status sg_module_conv2d(sg_builder *b, const char *name, int64_t H, int64_t W, int64_t Cin, int64_t Cout,
                           int k, int stride, int pad, int groups, int bias, sg_module **m)
{
    const char *fn = "sg_module_conv2d";
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "%s: '%s': m is NULL", fn, name ? name : "");
    *m = NULL;
    SG_TRY(sg_vision_precision(b, fn, name));
    SG_TRY(sg_vision_check_hwc(b, fn, name, "input", H, W, Cin));
    if (Cout < 1 || k < 1 || stride < 1 || pad < 0 || groups < 1 || Cin % groups || Cout % groups)
        return sg_fail(b->ctx, SG_ERR_INVALID, "%s: '%s': Cin %lld, Cout %lld, k %d, stride %d, pad %d, groups %d: "
                       "expected Cout, k, stride, groups >= 1, pad >= 0, and groups dividing Cin and Cout", fn,
                       name ? name : "", (long long)Cin, (long long)Cout, k, stride, pad, groups);
    conv_module *c = calloc(1, sizeof *c);
    if (!c) return sg_fail(b->ctx, SG_ERR_OOM, "%s: out of host memory", fn);
    SG_TRY(sg_module_init(b, &c->base, &conv_i, name));
    c->ib = -1;
    c->in[0] = H, c->in[1] = W, c->in[2] = Cin;
    int64_t wshape[4] = {Cout, k, k, Cin / groups};
    sg_conv2d_params p = {stride, stride, pad, pad, 1, 1, groups};
    /* The plan checks that the kernel fits the padded image, and gives the output's size. */
    SG_TRY(sg_conv2d_create(b->ctx, (int64_t[]){b->rows, H, W, Cin}, wshape, &p, b->opts.precision, &c->plan));
    int64_t ys[4];
    sg_conv2d_out_shape(c->plan, ys);
    c->out[0] = ys[1], c->out[1] = ys[2], c->out[2] = ys[3];
    /* weight (Cout, k, k, Cin / groups) with decay, bias (Cout) without: PyTorch's bound. */
    int64_t fan_in = Cin / groups * k * k;
    c->iw = sg_module_declare(&c->base, "weight", 4, wshape, SG_INIT_UNIFORM_FAN_IN, fan_in, 1);
    if (c->iw < 0) return SG_ERR_INVALID; /* the module stays with the builder, which frees it */
    if (bias) {
        c->ib = sg_module_declare(&c->base, "bias", 1, &Cout, SG_INIT_UNIFORM_FAN_IN, fan_in, 0);
        if (c->ib < 0) return SG_ERR_INVALID;
    }
    SG_TRY(image_buffer(&c->base, "y", b->rows, c->out, &c->y));
    *m = &c->base;
    return SG_OK;
}

/* ---- batch norm, then its activation in place ---- */

typedef struct bn_module {
    sg_module base;
    int iw, ib, irm, irv;         /* parameters weight, bias; buffers running_mean, running_var */
    sg_activation act;            /* NONE, RELU (fused into the op) or SILU (z -> y) */
    /* The last module of a residual block's main branch (act NONE) takes the block's sum and
     * activation (block_fuse): y = out_act(bn(x) + res), res the shortcut's output, set by the
     * block before each forward; the backward writes the sum's gradient into dres (the
     * block's). out_act is act when not fused. */
    bool fused;
    sg_activation out_act;
    const sg_tensor *res;
    sg_tensor *dres;
    int64_t hwc[3], rows;
    const sg_tensor *x;
    sg_tensor *y, *dx, *mean, *rstd; /* mean, rstd (C) F32: the last forward's, for the backward */
    sg_tensor *z, *dz;            /* SILU: the normalised values (its backward reads them), their gradient */
    sg_tensor *dw, *db;           /* bf16 models: f32 gradients of weight and bias, converted into bf16 */
} bn_module;

/* Batch norm's weight and bias are f32 in the op: the master copy (the bf16 copy is not used). */
static sg_tensor *master(const sg_module *m, int p)
{
    return m->b->params.param[p];
}

static sg_status bn_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    bn_module *n = (bn_module *)m;
    SG_TRY(check_image(m, "input", x, n->rows, n->hwc));
    sg_tensor *rm = sg_module_buffer_tensor(m, n->irm), *rv = sg_module_buffer_tensor(m, n->irv);
    if (!rm || !rv) return SG_ERR_INVALID; /* not finished: the message is set */
    int training = sg_module_training(m);
    n->x = x;
    if (training && !sg_module_updates_buffers(m)) rm = rv = NULL; /* batch statistics, running ones kept */
    const sg_activation act = n->out_act == SG_ACT_RELU ? SG_ACT_RELU : SG_ACT_NONE;
    SG_TRY(sg_batchnorm_act_forward(m->ctx, x, master(m, n->iw), master(m, n->ib), n->fused ? n->res : NULL, act,
                                    rm, rv, SG_BN_MOMENTUM, SG_BN_EPS, training, n->z ? n->z : n->y, n->mean,
                                    n->rstd));
    if (n->act == SG_ACT_SILU) SG_TRY(sg_silu_forward(m->ctx, n->z, n->y));
    *y = n->y;
    return SG_OK;
}

static sg_status bn_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    bn_module *n = (bn_module *)m;
    if (!n->x) return sg_module_no_forward(m);
    if (n->act == SG_ACT_SILU) {
        SG_TRY(sg_silu_backward(m->ctx, n->z, dy, n->dz));
        dy = n->dz;
    }
    /* ReLU's mask from the output, as the op documents; dy is read only. The op writes dx whether
     * or not it is needed (the model's first module rarely is one). */
    const sg_activation act = n->out_act == SG_ACT_RELU ? SG_ACT_RELU : SG_ACT_NONE;
    SG_TRY(sg_batchnorm_act_backward(m->ctx, n->x, master(m, n->iw), n->mean, n->rstd, act,
                                     act == SG_ACT_RELU ? n->y : NULL, dy, n->dx, n->fused ? n->dres : NULL,
                                     n->dw ? n->dw : sg_module_g(m, n->iw), n->db ? n->db : sg_module_g(m, n->ib)));
    if (n->dw) {
        SG_TRY(sg_tensor_convert(sg_module_g(m, n->iw), n->dw));
        SG_TRY(sg_tensor_convert(sg_module_g(m, n->ib), n->db));
    }
    *dx = m->no_input_grad ? NULL : n->dx;
    return SG_OK;
}

static void bn_destroy(sg_module *m)
{
    bn_module *n = (bn_module *)m;
    sg_tensor_destroy(n->y), sg_tensor_destroy(n->dx), sg_tensor_destroy(n->mean), sg_tensor_destroy(n->rstd);
    sg_tensor_destroy(n->z), sg_tensor_destroy(n->dz), sg_tensor_destroy(n->dw), sg_tensor_destroy(n->db);
    free(n);
}

/* Statistics over the first `rows` images only (the channel tensors keep their size). */
static sg_status bn_set_rows(sg_module *m, int64_t rows)
{
    bn_module *n = (bn_module *)m;
    SG_TRY(sg_tensor_set_rows(n->y, rows));
    SG_TRY(sg_tensor_set_rows(n->dx, rows));
    if (n->z) {
        SG_TRY(sg_tensor_set_rows(n->z, rows));
        SG_TRY(sg_tensor_set_rows(n->dz, rows));
    }
    n->rows = rows;
    return SG_OK;
}

static const sg_module_i bn_i = {"batchnorm2d", bn_forward, bn_backward, bn_destroy, bn_set_rows, NULL};

sg_status sg_module_batchnorm2d(sg_builder *b, const char *name, int64_t H, int64_t W, int64_t C,
                                sg_activation act, sg_module **m)
{
    const char *fn = "sg_module_batchnorm2d";
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "%s: '%s': m is NULL", fn, name ? name : "");
    *m = NULL;
    SG_TRY(sg_vision_precision(b, fn, name));
    SG_TRY(sg_vision_check_hwc(b, fn, name, "input", H, W, C));
    if (act != SG_ACT_NONE && act != SG_ACT_RELU && act != SG_ACT_SILU)
        return sg_fail(b->ctx, SG_ERR_INVALID, "%s: '%s': activation %d: expected SG_ACT_NONE, SG_ACT_RELU or "
                       "SG_ACT_SILU", fn, name ? name : "", (int)act);
    bn_module *n = calloc(1, sizeof *n);
    if (!n) return sg_fail(b->ctx, SG_ERR_OOM, "%s: out of host memory", fn);
    SG_TRY(sg_module_init(b, &n->base, &bn_i, name));
    n->act = n->out_act = act;
    n->hwc[0] = H, n->hwc[1] = W, n->hwc[2] = C;
    n->rows = b->rows;
    n->iw = sg_module_declare(&n->base, "weight", 1, &C, SG_INIT_ONES, C, 0);
    n->ib = sg_module_declare(&n->base, "bias", 1, &C, SG_INIT_ZEROS, C, 0);
    if (n->iw < 0 || n->ib < 0) return SG_ERR_INVALID;
    n->irm = sg_module_declare_buffer(&n->base, "running_mean", 1, &C, SG_INIT_ZEROS);
    n->irv = sg_module_declare_buffer(&n->base, "running_var", 1, &C, SG_INIT_ONES);
    if (n->irm < 0 || n->irv < 0) return SG_ERR_INVALID;
    SG_TRY(image_buffer(&n->base, "y", b->rows, n->hwc, &n->y));
    SG_TRY(image_buffer(&n->base, "dx", b->rows, n->hwc, &n->dx));
    if (act == SG_ACT_SILU) {
        SG_TRY(image_buffer(&n->base, "z", b->rows, n->hwc, &n->z));
        SG_TRY(image_buffer(&n->base, "dz", b->rows, n->hwc, &n->dz));
    }
    SG_TRY(sg_module_buffer(&n->base, SG_DTYPE_F32, "mean", 1, &C, &n->mean));
    SG_TRY(sg_module_buffer(&n->base, SG_DTYPE_F32, "rstd", 1, &C, &n->rstd));
    if (b->opts.precision != SG_DTYPE_F32) {
        SG_TRY(sg_module_buffer(&n->base, SG_DTYPE_F32, "dweight", 1, &C, &n->dw));
        SG_TRY(sg_module_buffer(&n->base, SG_DTYPE_F32, "dbias", 1, &C, &n->db));
    }
    *m = &n->base;
    return SG_OK;
}

/* ---- pooling: max over k x k windows, and the global average ---- */

typedef struct pool_module {
    sg_module base;
    bool max;                     /* max pooling; else the global average, y (rows, C) */
    int k, stride, pad;
    int64_t in[3], out[3], rows;
    bool ran;
    sg_tensor *y, *argmax, *dx;   /* argmax (rows, OH, OW, C) I32: max only; dx made at finish */
} pool_module;

static sg_status pool_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    pool_module *p = (pool_module *)m;
    SG_TRY(check_image(m, "input", x, p->rows, p->in));
    if (p->max) SG_TRY(sg_maxpool2d_forward(m->ctx, x, p->k, p->stride, p->pad, p->y, p->argmax));
    else SG_TRY(sg_avgpool_forward(m->ctx, x, p->y));
    p->ran = true;
    *y = p->y;
    return SG_OK;
}

static sg_status pool_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    pool_module *p = (pool_module *)m;
    if (!p->ran) return sg_module_no_forward(m);
    *dx = NULL;
    if (m->no_input_grad) return SG_OK; /* no parameters: nothing else to compute */
    if (!p->dx) return sg_module_no_dx(m);
    if (p->max) SG_TRY(sg_maxpool2d_backward(m->ctx, dy, p->argmax, p->k, p->stride, p->pad, p->dx));
    else SG_TRY(sg_avgpool_backward(m->ctx, dy, p->dx));
    *dx = p->dx;
    return SG_OK;
}

static void pool_destroy(sg_module *m)
{
    pool_module *p = (pool_module *)m;
    sg_tensor_destroy(p->y), sg_tensor_destroy(p->argmax), sg_tensor_destroy(p->dx);
    free(p);
}

static sg_status pool_set_rows(sg_module *m, int64_t rows)
{
    pool_module *p = (pool_module *)m;
    SG_TRY(sg_tensor_set_rows(p->y, rows));
    if (p->argmax) SG_TRY(sg_tensor_set_rows(p->argmax, rows));
    if (p->dx) SG_TRY(sg_tensor_set_rows(p->dx, rows));
    p->rows = rows;
    return SG_OK;
}

/* dx takes the rows the module runs now (set_rows may have come first). */
static sg_status pool_finish(sg_module *m)
{
    pool_module *p = (pool_module *)m;
    if (m->no_input_grad || p->dx) return SG_OK;
    SG_TRY(image_buffer(m, "dx", m->b->rows, p->in, &p->dx));
    return p->rows == m->b->rows ? SG_OK : sg_tensor_set_rows(p->dx, p->rows);
}

static const sg_module_i maxpool_i = {"maxpool2d", pool_forward, pool_backward, pool_destroy, pool_set_rows,
                                      pool_finish};
static const sg_module_i avgpool_i = {"avgpool", pool_forward, pool_backward, pool_destroy, pool_set_rows,
                                      pool_finish};

sg_status sg_module_maxpool2d(sg_builder *b, const char *name, int64_t H, int64_t W, int64_t C, int k, int stride,
                              int pad, sg_module **m)
{
    const char *fn = "sg_module_maxpool2d";
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "%s: '%s': m is NULL", fn, name ? name : "");
    *m = NULL;
    SG_TRY(sg_vision_precision(b, fn, name));
    SG_TRY(sg_vision_check_hwc(b, fn, name, "input", H, W, C));
    if (k < 1 || stride < 1 || pad < 0 || pad > k / 2)
        return sg_fail(b->ctx, SG_ERR_INVALID, "%s: '%s': k %d, stride %d, pad %d: expected k >= 1, stride >= 1 "
                       "and 0 <= pad <= k / 2", fn, name ? name : "", k, stride, pad);
    if (H + 2 * (int64_t)pad < k || W + 2 * (int64_t)pad < k)
        return sg_fail(b->ctx, SG_ERR_SHAPE, "%s: '%s': the %lldx%lld image padded by %d is smaller than the %dx%d "
                       "window", fn, name ? name : "", (long long)H, (long long)W, pad, k, k);
    pool_module *p = calloc(1, sizeof *p);
    if (!p) return sg_fail(b->ctx, SG_ERR_OOM, "%s: out of host memory", fn);
    SG_TRY(sg_module_init(b, &p->base, &maxpool_i, name));
    p->max = true, p->k = k, p->stride = stride, p->pad = pad, p->rows = b->rows;
    p->in[0] = H, p->in[1] = W, p->in[2] = C;
    p->out[0] = (H + 2 * pad - k) / stride + 1, p->out[1] = (W + 2 * pad - k) / stride + 1, p->out[2] = C;
    SG_TRY(image_buffer(&p->base, "y", b->rows, p->out, &p->y));
    SG_TRY(sg_module_buffer(&p->base, SG_DTYPE_I32, "argmax", 4, (int64_t[]){b->rows, p->out[0], p->out[1], C},
                            &p->argmax));
    *m = &p->base;
    return SG_OK;
}

sg_status sg_module_avgpool(sg_builder *b, const char *name, int64_t H, int64_t W, int64_t C, sg_module **m)
{
    const char *fn = "sg_module_avgpool";
    if (!b) return SG_ERR_NULL;
    if (!m) return sg_fail(b->ctx, SG_ERR_NULL, "%s: '%s': m is NULL", fn, name ? name : "");
    *m = NULL;
    SG_TRY(sg_vision_precision(b, fn, name));
    SG_TRY(sg_vision_check_hwc(b, fn, name, "input", H, W, C));
    pool_module *p = calloc(1, sizeof *p);
    if (!p) return sg_fail(b->ctx, SG_ERR_OOM, "%s: out of host memory", fn);
    SG_TRY(sg_module_init(b, &p->base, &avgpool_i, name));
    p->rows = b->rows;
    p->in[0] = H, p->in[1] = W, p->in[2] = C;
    p->out[0] = 1, p->out[1] = 1, p->out[2] = C;
    SG_TRY(sg_module_buffer(&p->base, b->opts.precision, "y", 2, (int64_t[]){b->rows, C}, &p->y));
    *m = &p->base;
    return SG_OK;
}

/* ---- ResNet's block: y = act(main(x) + shortcut(x)) ---- */

typedef struct block_module {
    sg_module base;
    sg_module *main, *shortcut;   /* shortcut NULL: the identity */
    sg_activation act;
    bn_module *tail;              /* main's last batch norm when it does the sum and act, or NULL */
    int64_t in[3], out[3], rows;
    const sg_tensor *x;
    sg_tensor *y, *g, *dx;        /* y: NULL when fused (tail's y is the output); g: d(sum) */
} block_module;

/* Main's last module when it is a batch norm without an activation of its own (the ResNets'
 * bn2 and bn3): the block hands it the sum and the activation, one pass where an add, a ReLU
 * and their backward would take five. NULL: the block adds and activates itself. */
static bn_module *fusable_tail(sg_module *main)
{
    sg_module *t = main;
    while (sg_sequential_count(t) > 0) t = sg_sequential_child(t, sg_sequential_count(t) - 1);
    if (!t || t->vt != &bn_i) return NULL;
    bn_module *n = (bn_module *)t;
    return n->act == SG_ACT_NONE && !n->fused ? n : NULL;
}

static sg_status block_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    block_module *r = (block_module *)m;
    SG_TRY(check_image(m, "input", x, r->rows, r->in));
    r->x = x;
    const sg_tensor *hm = NULL, *hs = x;
    if (r->tail) { /* the shortcut first: main's last batch norm adds its output */
        if (r->shortcut) {
            SG_TRY(sg_module_forward(r->shortcut, x, &hs));
            SG_TRY(check_image(m, "shortcut's output", hs, r->rows, r->out));
        }
        r->tail->res = hs;
        SG_TRY(sg_module_forward(r->main, x, &hm));
        SG_TRY(check_image(m, "main branch's output", hm, r->rows, r->out));
        *y = hm;
        return SG_OK;
    }
    SG_TRY(sg_module_forward(r->main, x, &hm));
    SG_TRY(check_image(m, "main branch's output", hm, r->rows, r->out));
    if (r->shortcut) {
        SG_TRY(sg_module_forward(r->shortcut, x, &hs));
        SG_TRY(check_image(m, "shortcut's output", hs, r->rows, r->out));
    }
    SG_TRY(sg_add_forward(m->ctx, hm, hs, r->y));
    if (r->act == SG_ACT_RELU) SG_TRY(sg_relu_forward(m->ctx, r->y, r->y));
    *y = r->y;
    return SG_OK;
}

/* d(sum) = act'(y) dy goes to both branches; their input gradients add up into dx. Fused: main's
 * last batch norm writes d(sum) into g from dy; else it is made in dy's place and main gets a
 * copy it may overwrite, the shortcut (or the identity) dy itself. */
static sg_status block_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    block_module *r = (block_module *)m;
    if (!r->x) return sg_module_no_forward(m);
    sg_tensor *dm = NULL, *ds = dy;
    if (r->tail) {
        SG_TRY(sg_module_backward(r->main, dy, &dm));
        ds = r->g;
        if (r->shortcut) SG_TRY(sg_module_backward(r->shortcut, r->g, &ds));
    } else {
        if (r->act == SG_ACT_RELU) SG_TRY(sg_relu_backward(m->ctx, r->y, dy, dy));
        SG_TRY(sg_tensor_copy(r->g, dy));
        SG_TRY(sg_module_backward(r->main, r->g, &dm));
        if (r->shortcut) SG_TRY(sg_module_backward(r->shortcut, dy, &ds));
    }
    *dx = NULL;
    if (m->no_input_grad) return SG_OK; /* the model's first module: the branches skipped theirs too */
    if (!dm || !ds || !r->dx)
        return sg_fail(m->ctx, SG_ERR_INVALID, "sg_module_backward: '%s' (residual_block): %s", sg_module_label(m),
                       !r->dx ? "no input gradient buffer: its model was not finished (sg_builder_finish)"
                       : !dm ? "the main branch gave no input gradient" : "the shortcut gave no input gradient");
    SG_TRY(sg_add_forward(m->ctx, dm, ds, r->dx));
    *dx = r->dx;
    return SG_OK;
}

static void block_destroy(sg_module *m)
{
    block_module *r = (block_module *)m;
    sg_module_free(r->main);
    sg_module_free(r->shortcut);
    sg_tensor_destroy(r->y), sg_tensor_destroy(r->g), sg_tensor_destroy(r->dx);
    free(r);
}

static sg_status block_set_rows(sg_module *m, int64_t rows)
{
    block_module *r = (block_module *)m;
    SG_TRY(sg_module_set_rows(r->main, rows));
    if (r->shortcut) SG_TRY(sg_module_set_rows(r->shortcut, rows));
    if (r->y) SG_TRY(sg_tensor_set_rows(r->y, rows));
    SG_TRY(sg_tensor_set_rows(r->g, rows));
    if (r->dx) SG_TRY(sg_tensor_set_rows(r->dx, rows));
    r->rows = rows;
    return SG_OK;
}

/* Both branches read the block's input: they need its gradient exactly when the block does. */
static sg_status block_finish(sg_module *m)
{
    block_module *r = (block_module *)m;
    r->main->no_input_grad = m->no_input_grad;
    SG_TRY(sg_module_finish(r->main));
    if (r->shortcut) {
        r->shortcut->no_input_grad = m->no_input_grad;
        SG_TRY(sg_module_finish(r->shortcut));
    }
    if (m->no_input_grad || r->dx) return SG_OK;
    SG_TRY(image_buffer(m, "dx", m->b->rows, r->in, &r->dx));
    return r->rows == m->b->rows ? SG_OK : sg_tensor_set_rows(r->dx, r->rows);
}

static const sg_module_i block_i = {"residual_block", block_forward, block_backward, block_destroy, block_set_rows,
                                    block_finish};

sg_status sg_module_residual_block(sg_builder *b, const char *name, sg_module *main, sg_module *shortcut,
                                   const int64_t in_shape[3], const int64_t out_shape[3], sg_activation act,
                                   sg_module **m)
{
    const char *fn = "sg_module_residual_block";
    if (!b) return SG_ERR_NULL;
    if (!m || !main || !in_shape || !out_shape)
        return sg_fail(b->ctx, SG_ERR_NULL, "%s: '%s': m, main, in_shape or out_shape is NULL", fn,
                       name ? name : "");
    *m = NULL;
    SG_TRY(sg_vision_precision(b, fn, name));
    SG_TRY(sg_vision_check_hwc(b, fn, name, "in_shape", in_shape[0], in_shape[1], in_shape[2]));
    SG_TRY(sg_vision_check_hwc(b, fn, name, "out_shape", out_shape[0], out_shape[1], out_shape[2]));
    if (!shortcut && memcmp(in_shape, out_shape, 3 * sizeof *in_shape))
        return sg_fail(b->ctx, SG_ERR_SHAPE, "%s: '%s': an identity shortcut needs main to keep x's shape; in "
                       "(%lld, %lld, %lld), out (%lld, %lld, %lld): give a shortcut (a strided 1x1 conv and a batch "
                       "norm)", fn, name ? name : "", (long long)in_shape[0], (long long)in_shape[1],
                       (long long)in_shape[2], (long long)out_shape[0], (long long)out_shape[1],
                       (long long)out_shape[2]);
    if (act != SG_ACT_NONE && act != SG_ACT_RELU)
        return sg_fail(b->ctx, SG_ERR_INVALID, "%s: '%s': activation %d: expected SG_ACT_NONE or SG_ACT_RELU", fn,
                       name ? name : "", (int)act);
    block_module *r = calloc(1, sizeof *r);
    if (!r) return sg_fail(b->ctx, SG_ERR_OOM, "%s: out of host memory", fn);
    SG_TRY(sg_module_init(b, &r->base, &block_i, name));
    sg_module *children[2] = {main, shortcut};
    SG_TRY(sg_module_adopt(&r->base, children, shortcut ? 2 : 1));
    r->main = main, r->shortcut = shortcut, r->act = act, r->rows = b->rows;
    memcpy(r->in, in_shape, sizeof r->in);
    memcpy(r->out, out_shape, sizeof r->out);
    r->tail = fusable_tail(main);
    if (!r->tail) SG_TRY(image_buffer(&r->base, "y", b->rows, r->out, &r->y));
    SG_TRY(image_buffer(&r->base, "dy", b->rows, r->out, &r->g));
    if (r->tail) {
        r->tail->fused = true;
        r->tail->out_act = act;
        r->tail->dres = r->g;
    }
    *m = &r->base;
    return SG_OK;
}
