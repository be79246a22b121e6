/* dataset.c: the public sg_dataset calls: samples from tensors or .npy files, batches fed from
 * a host loader, and the batch gather every step runs (the CPU version here; the CUDA kernel
 * and the feed's copy stream in dataset_cuda.cu). */
#include "nn/dataset.h"
#include "nn/npy.h"
#include "nn/text.h"

#include <stdlib.h>
#include <string.h>

static int64_t row_elems(const sg_tensor *t)
{
    int64_t e = 1;
    for (int i = 1; i < t->ndim; i++) e *= t->shape[i];
    return e;
}

static bool dtype_ok(sg_dtype dt) { return dt == SG_DTYPE_F32 || dt == SG_DTYPE_I32; }

/* x and y: device tensors of ctx, equal first dims, 4-byte elements. */
static sg_status check_pair(sg_ctx *ctx, const char *fn, const sg_tensor *x, const sg_tensor *y)
{
    if (!x || !y) return sg_fail(ctx, SG_ERR_NULL, "%s: x or y is NULL", fn);
    if (x->ctx != ctx || y->ctx != ctx)
        return sg_fail(ctx, SG_ERR_BACKEND, "%s: x or y belongs to another context", fn);
    if (!dtype_ok(x->dtype) || !dtype_ok(y->dtype))
        return sg_fail(ctx, SG_ERR_DTYPE, "%s: x is %s and y %s: expected f32 or i32 each", fn,
                       sg_dtype_name(x->dtype), sg_dtype_name(y->dtype));
    if (x->ndim < 1 || y->ndim < 1 || x->shape[0] != y->shape[0] || x->shape[0] < 1)
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: x has %lld samples and y %lld: expected the same number, at "
                       "least 1", fn, (long long)(x->ndim ? x->shape[0] : 0), (long long)(y->ndim ? y->shape[0] : 0));
    if (x->numel > INT32_MAX || y->numel > INT32_MAX) /* the gather's index arithmetic is 64-bit, this is headroom */
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: more than 2^31 - 1 elements in x or y", fn);
    return SG_OK;
}

static sg_status dataset_new(sg_ctx *ctx, sg_dataset_kind kind, sg_tensor *x, sg_tensor *y, sg_dataset **out)
{
    sg_dataset *d = calloc(1, sizeof *d);
    if (!d) {
        sg_tensor_destroy(x), sg_tensor_destroy(y);
        return sg_fail(ctx, SG_ERR_OOM, "sg_dataset_create: out of host memory");
    }
    d->ctx = ctx, d->kind = kind, d->x = x, d->y = y;
    if (x) d->n = x->shape[0], d->x_row = row_elems(x), d->y_row = row_elems(y);
    d->slot_batch[0] = d->slot_batch[1] = d->last_begun = -1;
    *out = d;
    return SG_OK;
}

sg_status sg_dataset_create(sg_ctx *ctx, sg_tensor *x, sg_tensor *y, sg_dataset **out)
{
    if (!ctx) return SG_ERR_NULL;
    sg_status st = out ? check_pair(ctx, "sg_dataset_create", x, y) : sg_fail(ctx, SG_ERR_NULL, "sg_dataset_create: out is NULL");
    if (out) *out = NULL;
    if (st != SG_OK) {
        if (x != y) sg_tensor_destroy(y);
        sg_tensor_destroy(x);
        return st;
    }
    return dataset_new(ctx, SG_DATASET_SAMPLES, x, y, out);
}

/* x and y hold samples shaped as d's (every dim but the first) and typed as d's. */
static bool same_samples(const sg_dataset *d, const sg_tensor *x, const sg_tensor *y)
{
    if (x->ndim != d->x->ndim || y->ndim != d->y->ndim || x->dtype != d->x->dtype || y->dtype != d->y->dtype)
        return false;
    for (int i = 1; i < x->ndim; i++)
        if (x->shape[i] != d->x->shape[i]) return false;
    for (int i = 1; i < y->ndim; i++)
        if (y->shape[i] != d->y->shape[i]) return false;
    return true;
}

sg_status sg_dataset_set_validation(sg_dataset *d, sg_tensor *x, sg_tensor *y)
{
    const char *fn = "sg_dataset_set_validation";
    sg_status st = d ? check_pair(d->ctx, fn, x, y) : SG_ERR_NULL;
    if (st == SG_OK && (d->kind != SG_DATASET_SAMPLES || d->owned))
        st = sg_fail(d->ctx, SG_ERR_INVALID, "%s: %s", fn, d->owned ? "the data set belongs to a model"
                     : "a validation split is for data sets of samples (sg_dataset_create, sg_dataset_from_npy)");
    if (st == SG_OK && !same_samples(d, x, y))
        st = sg_fail(d->ctx, SG_ERR_SHAPE, "%s: validation samples x %s of %lld elements, y %s of %lld: expected "
                     "the training samples' shape and dtype (x %s of %lld elements, y %s of %lld)", fn,
                     sg_dtype_name(x->dtype), (long long)row_elems(x), sg_dtype_name(y->dtype), (long long)row_elems(y),
                     sg_dtype_name(d->x->dtype), (long long)d->x_row, sg_dtype_name(d->y->dtype), (long long)d->y_row);
    if (st != SG_OK) {
        if (x != y) sg_tensor_destroy(y);
        sg_tensor_destroy(x);
        return st;
    }
    sg_dataset *v = NULL;
    SG_TRY(dataset_new(d->ctx, SG_DATASET_SAMPLES, x, y, &v)); /* (takes x and y either way) */
    sg_dataset_destroy(d->val);
    d->val = v;
    return SG_OK;
}

/* One .npy file into a new device tensor. */
static sg_status npy_tensor(sg_ctx *ctx, const char *path, const char *what, sg_tensor **out)
{
    sg_npy a;
    SG_TRY(sg_npy_read(ctx, path, &a));
    sg_status st = SG_OK;
    if (a.dtype != SG_DTYPE_F32 && a.dtype != SG_DTYPE_I32)
        st = sg_fail(ctx, SG_ERR_DTYPE, "sg_dataset_from_npy: %s '%s' holds %s: expected float32 or int32",
                     what, path, sg_dtype_name(a.dtype));
    else if (a.ndim < 1)
        st = sg_fail(ctx, SG_ERR_SHAPE, "sg_dataset_from_npy: %s '%s' is a scalar: expected an array of samples",
                     what, path);
    if (st == SG_OK) st = sg_tensor_create(ctx, a.dtype, a.ndim, a.shape, what, out);
    if (st == SG_OK) st = sg_tensor_copy_from_host(*out, a.data, a.nbytes);
    sg_npy_free(&a);
    return st;
}

sg_status sg_dataset_from_npy(sg_ctx *ctx, const char *x_path, const char *y_path, sg_dataset **out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!out || !x_path || !y_path)
        return sg_fail(ctx, SG_ERR_NULL, "sg_dataset_from_npy: x_path, y_path and out are required");
    *out = NULL;
    sg_tensor *x = NULL, *y = NULL;
    sg_status st = npy_tensor(ctx, x_path, "data.x", &x);
    if (st == SG_OK) st = npy_tensor(ctx, y_path, "data.y", &y);
    if (st == SG_OK && x->shape[0] != y->shape[0])
        st = sg_fail(ctx, SG_ERR_SHAPE, "sg_dataset_from_npy: '%s' has %lld samples and '%s' %lld: expected the "
                     "same number", x_path, (long long)x->shape[0], y_path, (long long)y->shape[0]);
    if (st != SG_OK) {
        sg_tensor_destroy(x), sg_tensor_destroy(y);
        return st;
    }
    return sg_dataset_create(ctx, x, y, out);
}

sg_status sg_dataset_create_fed(sg_ctx *ctx, sg_dtype x_dtype, int x_ndim, const int64_t *x_shape,
                                sg_dtype y_dtype, int y_ndim, const int64_t *y_shape, sg_dataset **out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!out || !x_shape || !y_shape)
        return sg_fail(ctx, SG_ERR_NULL, "sg_dataset_create_fed: shapes and out are required");
    *out = NULL;
    if (x_ndim < 1 || x_ndim > SG_MAX_DIMS || y_ndim < 1 || y_ndim > SG_MAX_DIMS || x_shape[0] != y_shape[0] ||
        x_shape[0] < 1)
        return sg_fail(ctx, SG_ERR_SHAPE, "sg_dataset_create_fed: a batch's x and y: expected 1 to %d dims each "
                       "and the same batch (first dim) >= 1", SG_MAX_DIMS);
    /* Two slots: (2B, ...) each. */
    int64_t xs[SG_MAX_DIMS], ys[SG_MAX_DIMS];
    memcpy(xs, x_shape, (size_t)x_ndim * sizeof *xs), memcpy(ys, y_shape, (size_t)y_ndim * sizeof *ys);
    xs[0] *= 2, ys[0] *= 2;
    sg_tensor *x = NULL, *y = NULL;
    sg_status st = dtype_ok(x_dtype) && dtype_ok(y_dtype)
                       ? SG_OK
                       : sg_fail(ctx, SG_ERR_DTYPE, "sg_dataset_create_fed: x %s, y %s: expected f32 or i32 each",
                                 sg_dtype_name(x_dtype), sg_dtype_name(y_dtype));
    if (st == SG_OK) st = sg_tensor_create(ctx, x_dtype, x_ndim, xs, "feed.x", &x);
    if (st == SG_OK) st = sg_tensor_create(ctx, y_dtype, y_ndim, ys, "feed.y", &y);
    if (st == SG_OK) st = check_pair(ctx, "sg_dataset_create_fed", x, y);
    if (st == SG_OK) st = sg_tensor_fill(x, 0.0); /* defined before the first feed */
    if (st == SG_OK) st = sg_tensor_fill(y, 0.0);
    sg_dataset *d = NULL;
    if (st == SG_OK) st = dataset_new(ctx, SG_DATASET_FED, x, y, &d);
    else sg_tensor_destroy(x), sg_tensor_destroy(y);
    if (st != SG_OK) return st;
    d->batch = x_shape[0];
#ifdef SG_HAVE_CUDA
    if (ctx->backend == SG_BACKEND_CUDA) {
        size_t xb = (size_t)(d->batch * d->x_row) * 4, yb = (size_t)(d->batch * d->y_row) * 4;
        st = sg_feed_cuda_create(ctx, xb, yb, &d->feed);
        if (st != SG_OK) {
            sg_dataset_destroy(d);
            return st;
        }
    }
#endif
    *out = d;
    return SG_OK;
}

sg_status sg_dataset_feed(sg_dataset *d, int64_t index, const void *x, size_t x_bytes, const void *y,
                          size_t y_bytes)
{
    if (!d) return SG_ERR_NULL;
    sg_ctx *ctx = d->ctx;
    if (d->kind != SG_DATASET_FED)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_dataset_feed: the data set was not made by sg_dataset_create_fed");
    if (sg_ctx_capturing(ctx))
        return sg_fail(ctx, SG_ERR_CAPTURE, "sg_dataset_feed: called during capture; feed batches between steps");
    if (!x || !y) return sg_fail(ctx, SG_ERR_NULL, "sg_dataset_feed: x or y is NULL");
    if (index < 0) return sg_fail(ctx, SG_ERR_INVALID, "sg_dataset_feed: batch index %lld < 0", (long long)index);
    size_t xb = (size_t)(d->batch * d->x_row) * 4, yb = (size_t)(d->batch * d->y_row) * 4;
    if (x_bytes != xb || y_bytes != yb)
        return sg_fail(ctx, SG_ERR_SHAPE, "sg_dataset_feed: batch %lld of %zu and %zu bytes: a batch is %zu bytes "
                       "of x and %zu of y", (long long)index, x_bytes, y_bytes, xb, yb);
    int slot = (int)(index % 2);
    /* The slot is free when no queued step reads it: never filled, filled but not yet read,
     * or read by a step before the last one queued (whose start marked it free). */
    int64_t held = d->slot_batch[slot];
    if (held >= 0 && held == d->last_begun)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_dataset_feed: batch %lld: its slot holds batch %lld, which the step "
                       "queued last reads; feed at most one batch ahead (batch i after queuing the step of batch "
                       "i-1)", (long long)index, (long long)held);
    char *dx = (char *)d->x->data + (size_t)slot * xb, *dy = (char *)d->y->data + (size_t)slot * yb;
#ifdef SG_HAVE_CUDA
    if (d->feed) SG_TRY(sg_feed_cuda_copy(ctx, d->feed, slot, x, xb, y, yb, dx, dy));
#endif
    if (!d->feed) { /* CPU: work runs in order on the host, the previous step is done */
        memcpy(dx, x, xb);
        memcpy(dy, y, yb);
    }
    d->slot_batch[slot] = index;
    return SG_OK;
}

sg_status sg_dataset_step_begin(sg_dataset *d, int64_t index)
{
    if (!d || d->kind != SG_DATASET_FED) return SG_OK;
    int slot = (int)(index % 2);
    if (d->slot_batch[slot] != index) {
        if (d->slot_batch[slot] < 0)
            return sg_fail(d->ctx, SG_ERR_INVALID, "fed data set: batch %lld was not fed (sg_dataset_feed it before "
                           "its step)", (long long)index);
        return sg_fail(d->ctx, SG_ERR_INVALID, "fed data set: batch %lld was not fed: its slot holds batch %lld "
                       "(feed batch i before the step of batch i)", (long long)index, (long long)d->slot_batch[slot]);
    }
#ifdef SG_HAVE_CUDA
    if (d->feed) SG_TRY(sg_feed_cuda_begin(d->ctx, d->feed, slot, 1 - slot));
#endif
    if (index > d->last_begun) d->last_begun = index;
    return SG_OK;
}

void sg_dataset_destroy(sg_dataset *d)
{
    if (!d || d->owned) return;
#ifdef SG_HAVE_CUDA
    if (d->feed) sg_feed_cuda_destroy(d->ctx, d->feed);
#endif
    if (d->text && d->text_close) d->text_close(d->text);
    sg_dataset_destroy(d->val);
    sg_tensor_destroy(d->x);
    sg_tensor_destroy(d->y);
    free(d);
}

int64_t sg_dataset_samples(const sg_dataset *d) { return d ? d->n : 0; }

/* ---- the batch gather ---- */

static int64_t first_sample(const sg_dataset *d, int64_t index, int64_t stride, int64_t offset)
{
    int64_t n = d->n;
    return ((index % n) * (stride % n) % n + offset % n) % n; /* no overflow for n < 2^31 */
}

int64_t sg_dataset_contiguous(const sg_dataset *d, int64_t index, int64_t stride, int64_t offset, int64_t rows)
{
    int64_t s0 = first_sample(d, index, stride, offset);
    return s0 + rows <= d->n ? s0 : -1;
}

typedef struct gather_args {
    sg_dataset *d;
    const int32_t *idx;
    int64_t stride, offset;
    void *x_out, *y_out;
    int64_t rows;
} gather_args;

static sg_status gather_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    const gather_args *a = p;
    const sg_dataset *d = a->d;
    int64_t i = *a->idx;
    if (i < 0) i = i % d->n + d->n;
    int64_t s0 = first_sample(d, i, a->stride, a->offset);
    for (int64_t r = 0; r < a->rows; r++) {
        int64_t s = (s0 + r) % d->n;
        memcpy((char *)a->x_out + (size_t)(r * d->x_row) * 4, (const char *)d->x->data + (size_t)(s * d->x_row) * 4,
               (size_t)d->x_row * 4);
        memcpy((char *)a->y_out + (size_t)(r * d->y_row) * 4, (const char *)d->y->data + (size_t)(s * d->y_row) * 4,
               (size_t)d->y_row * 4);
    }
    return SG_OK;
}

sg_status sg_dataset_gather(sg_dataset *d, const sg_tensor *idx, int64_t stride, int64_t offset,
                            sg_tensor *x_out, sg_tensor *y_out)
{
    int64_t rows = x_out->numel / d->x_row;
    if (x_out->numel != rows * d->x_row || y_out->numel != rows * d->y_row || x_out->dtype != d->x->dtype ||
        y_out->dtype != d->y->dtype)
        return sg_fail(d->ctx, SG_ERR_SHAPE, "sg_dataset_gather: the model's inputs (%lld and %lld elements) are "
                       "not whole samples of the data set's (%lld and %lld a sample)", (long long)x_out->numel,
                       (long long)y_out->numel, (long long)d->x_row, (long long)d->y_row);
    if (d->ctx->backend == SG_BACKEND_CPU) {
        gather_args a = {d, idx->data, stride, offset, x_out->data, y_out->data, rows};
        return sg_cpu_run(d->ctx, gather_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(d->ctx, sg_dataset_gather_cuda(d, idx, stride, offset, x_out, y_out));
}

typedef struct pad_vary_args {
    const int32_t *step;
    sg_text_buckets bk;
    int64_t x_row, y_row;
    uint32_t *x, *y, y_pad;
    int32_t *bucket_out;
} pad_vary_args;

static sg_status pad_vary_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    const pad_vary_args *a = p;
    int64_t rows = sg_text_vary_len(*a->step, a->bk.size[a->bk.n - 1]);
    int k = sg_text_bucket_of(&a->bk, rows);
    for (int64_t e = rows * a->x_row; e < a->bk.size[k] * a->x_row; e++) a->x[e] = 0;
    for (int64_t e = rows * a->y_row; e < a->bk.size[k] * a->y_row; e++) a->y[e] = a->y_pad;
    *a->bucket_out = k;
    return SG_OK;
}

sg_status sg_dataset_pad_vary(sg_ctx *ctx, const sg_tensor *step, const int64_t *buckets, int n_buckets,
                              int64_t x_row, int64_t y_row, sg_tensor *x_out, sg_tensor *y_out, double y_pad,
                              sg_tensor *bucket_out)
{
    const char *fn = "sg_dataset_pad_vary";
    if (!ctx) return SG_ERR_NULL;
    if (!step || !x_out || !y_out || !bucket_out)
        return sg_fail(ctx, SG_ERR_NULL, "%s: step, x_out, y_out and bucket_out are required", fn);
    SG_TRY(sg_check_i32_value(ctx, fn, "step", step));
    SG_TRY(sg_check_i32_value(ctx, fn, "bucket_out", bucket_out));
    if (x_row < 1 || y_row < 1 || sg_dtype_size(x_out->dtype) != 4 ||
        (y_out->dtype != SG_DTYPE_F32 && y_out->dtype != SG_DTYPE_I32))
        return sg_fail(ctx, SG_ERR_INVALID, "%s: rows of %lld and %lld elements, x_out %s, y_out %s: expected rows "
                       "of >= 1 elements, 4-byte x and F32 or I32 y", fn, (long long)x_row, (long long)y_row,
                       sg_dtype_name(x_out->dtype), sg_dtype_name(y_out->dtype));
    sg_text_buckets bk;
    int64_t cap = x_out->numel / x_row < y_out->numel / y_row ? x_out->numel / x_row : y_out->numel / y_row;
    SG_TRY(sg_text_buckets_make(ctx, fn, buckets, n_buckets, cap, "the rows x_out and y_out hold", &bk));
    uint32_t pad;
    if (y_out->dtype == SG_DTYPE_F32) {
        float f = (float)y_pad;
        memcpy(&pad, &f, 4);
    } else {
        int32_t i = (int32_t)y_pad;
        memcpy(&pad, &i, 4);
    }
    pad_vary_args a = {step->data, bk, x_row, y_row, x_out->data, y_out->data, pad, bucket_out->data};
    if (ctx->backend == SG_BACKEND_CPU) return sg_cpu_run(ctx, pad_vary_cpu, &a, sizeof a);
    return SG_CUDA_DISPATCH(ctx, sg_dataset_pad_vary_cuda(ctx, a.step, bk, x_row, y_row, a.x, a.y, pad,
                                                          a.bucket_out));
}

/* ---- token text ---- */

static void text_close(struct sg_text *t) { sg_text_close(t); }

sg_status sg_dataset_from_text(sg_ctx *ctx, const char *path, const char *val_path, int64_t vocab,
                               int64_t seq, sg_dataset **out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "sg_dataset_from_text: out is NULL");
    *out = NULL;
    if (seq < 1) return sg_fail(ctx, SG_ERR_SHAPE, "sg_dataset_from_text: seq %lld: expected >= 1", (long long)seq);
    const char *p = path && path[0] ? path : sg_text_default_path();
    if (!p)
        return sg_fail(ctx, SG_ERR_IO, "sg_dataset_from_text: no path given and none of the default texts "
                       "(/usr/share/common-licenses/...) exists");
    bool val = val_path && val_path[0];
    /* Each split must hold a window of seq + 1 tokens: checked from the files' sizes first. */
    sg_text_options o = {.val_fraction = val ? 0.0 : 0.1, .window = seq + 1, .vocab = vocab,
                         .val_path = val ? val_path : NULL};
    sg_text *t = NULL;
    SG_TRY(sg_text_open_ex(ctx, p, &o, &t));
    sg_dataset *d = NULL;
    sg_status st = dataset_new(ctx, SG_DATASET_TEXT, NULL, NULL, &d);
    if (st != SG_OK) {
        sg_text_close(t);
        return st;
    }
    d->text = t, d->text_close = text_close;
    d->n = sg_text_size(t, 0);
    *out = d;
    return SG_OK;
}
