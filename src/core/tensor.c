/* tensor.c: contiguous tensors (up to 4-D) allocated from the context's current pool, views
 * into another tensor's storage (how all parameters share one allocation), copies, fills,
 * dtype conversion, and the argument checks that op entry points share. */
#include "core/core.h"

#include <math.h>
#include <stdlib.h>

size_t sg_dtype_size(sg_dtype dt)
{
    switch (dt) {
    case SG_DTYPE_F32: return 4;
    case SG_DTYPE_BF16: return 2;
    case SG_DTYPE_F64: return 8;
    case SG_DTYPE_I32: return 4;
    }
    return 0;
}

const char *sg_dtype_name(sg_dtype dt)
{
    switch (dt) {
    case SG_DTYPE_F32: return "f32";
    case SG_DTYPE_BF16: return "bf16";
    case SG_DTYPE_F64: return "f64";
    case SG_DTYPE_I32: return "i32";
    }
    return "?";
}

double sg_bf16_to_double(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t sg_double_to_bf16(double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);  /* round to nearest even */
    return (uint16_t)(u >> 16);
}

/* Validates dtype and shape; fills t's shape fields. */
static sg_status set_shape(sg_ctx *ctx, const char *fn, sg_tensor *t, sg_dtype dt, int ndim,
                           const int64_t *shape)
{
    if (sg_dtype_size(dt) == 0) return sg_fail(ctx, SG_ERR_DTYPE, "%s: unknown dtype %d", fn, (int)dt);
    if (dt == SG_DTYPE_F64 && ctx->backend != SG_BACKEND_CPU)
        return sg_fail(ctx, SG_ERR_DTYPE, "%s: f64 tensors exist on the CPU backend only", fn);
    if (ndim < 1 || ndim > SG_MAX_DIMS)
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: ndim %d, expected 1 to %d", fn, ndim, SG_MAX_DIMS);
    if (!shape) return sg_fail(ctx, SG_ERR_NULL, "%s: shape is NULL", fn);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0)
            return sg_fail(ctx, SG_ERR_SHAPE, "%s: dimension %d is %lld, expected > 0", fn, i,
                           (long long)shape[i]);
        if (n > INT64_MAX / shape[i]) return sg_fail(ctx, SG_ERR_SHAPE, "%s: shape overflows", fn);
        n *= shape[i];
        t->shape[i] = shape[i];
    }
    t->dtype = dt;
    t->ndim = ndim;
    t->numel = n;
    t->cap_rows = shape[0];
    t->cap_numel = n;
    return SG_OK;
}

sg_status sg_tensor_create(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape,
                           const char *name, sg_tensor **out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "sg_tensor_create: out is NULL");
    *out = NULL;
    sg_tensor *t = calloc(1, sizeof *t);
    if (!t) return sg_fail(ctx, SG_ERR_OOM, "sg_tensor_create: out of host memory");
    t->ctx = ctx;
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
    sg_status st = set_shape(ctx, "sg_tensor_create", t, dt, ndim, shape);
    if (st == SG_OK) st = sg_pool_alloc(ctx->cur_pool, (size_t)t->numel * sg_dtype_size(dt), &t->block);
    if (st != SG_OK) {
        free(t);
        return st;
    }
    t->pool = ctx->cur_pool;
    t->data = t->block->ptr;
    *out = t;
    return SG_OK;
}

sg_status sg_tensor_view(sg_tensor *base, int64_t elem_offset, int ndim, const int64_t *shape,
                         const char *name, sg_tensor **out)
{
    if (!base || !out) return SG_ERR_NULL;
    sg_ctx *ctx = base->ctx;
    *out = NULL;
    sg_tensor *t = calloc(1, sizeof *t);
    if (!t) return sg_fail(ctx, SG_ERR_OOM, "sg_tensor_view: out of host memory");
    t->ctx = ctx;
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
    sg_status st = set_shape(ctx, "sg_tensor_view", t, base->dtype, ndim, shape);
    if (st == SG_OK && (elem_offset < 0 || elem_offset + t->numel > base->numel))
        st = sg_fail(ctx, SG_ERR_SHAPE,
                     "sg_tensor_view: view '%s' of %lld elements at offset %lld runs past '%s' "
                     "(%lld elements)",
                     t->name, (long long)t->numel, (long long)elem_offset, base->name,
                     (long long)base->numel);
    if (st != SG_OK) {
        free(t);
        return st;
    }
    t->base = base;
    t->data = (char *)base->data + (size_t)elem_offset * sg_dtype_size(base->dtype);
    *out = t;
    return SG_OK;
}

sg_status sg_tensor_unbound(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape, const char *name,
                            sg_tensor **out)
{
    if (!ctx) return SG_ERR_NULL;
    *out = NULL;
    sg_tensor *t = calloc(1, sizeof *t);
    if (!t) return sg_fail(ctx, SG_ERR_OOM, "sg_tensor_unbound: out of host memory");
    t->ctx = ctx;
    snprintf(t->name, sizeof t->name, "%s", name ? name : "");
    sg_status st = set_shape(ctx, "sg_tensor_create", t, dt, ndim, shape);
    if (st != SG_OK) {
        free(t);
        return st;
    }
    *out = t;
    return SG_OK;
}

void sg_tensor_bind(sg_tensor *t, const sg_tensor *base, size_t byte_offset)
{
    t->base = base;
    t->data = (char *)base->data + byte_offset;
}

/* Freed during capture, a block of another pool may still be read by the graph being
 * recorded: it is handed to the capture, and the graph frees it when it is destroyed. */
static void defer_free(sg_ctx *ctx, sg_pool *pool, sg_block *b)
{
    sg_capture *c = &ctx->cap;
    if (c->n_deferred == c->cap_deferred) {
        int cap = c->cap_deferred ? 2 * c->cap_deferred : 16;
        sg_block **nb = realloc(c->deferred, (size_t)cap * sizeof *nb);
        sg_pool **np = realloc(c->deferred_pool, (size_t)cap * sizeof *np);
        if (nb) c->deferred = nb;
        if (np) c->deferred_pool = np;
        if (!nb || !np) return; /* out of host memory: leak the block rather than reuse it */
        c->cap_deferred = cap;
    }
    c->deferred[c->n_deferred] = b;
    c->deferred_pool[c->n_deferred++] = pool;
}

void sg_tensor_destroy(sg_tensor *t)
{
    if (!t) return;
    sg_ctx *ctx = t->ctx;
    if (ctx->tensor_hook) ctx->tensor_hook(ctx->tensor_user, t);
    if (t->block) {
        if (ctx->cap.active && t->pool != ctx->cap.pool) defer_free(ctx, t->pool, t->block);
        else sg_pool_free(t->pool, t->block);
    }
    /* A CPU plan refers to tensors by their structs: one recorded and destroyed during capture
     * stays allocated (its block already returned) until the graph goes. */
    if (ctx->cap.active && ctx->cap.plan) {
        sg_tensor **d = realloc(ctx->cap.dead, (size_t)(ctx->cap.n_dead + 1) * sizeof *d);
        if (d) {
            ctx->cap.dead = d;
            d[ctx->cap.n_dead++] = t;
            t->block = NULL;
            return;
        }
    }
    free(t);
}

sg_dtype sg_tensor_dtype(const sg_tensor *t) { return t->dtype; }
int sg_tensor_ndim(const sg_tensor *t) { return t->ndim; }
int64_t sg_tensor_dim(const sg_tensor *t, int i)
{
    if (i < 0) i += t->ndim;
    return (i >= 0 && i < t->ndim) ? t->shape[i] : 0;
}
int64_t sg_tensor_numel(const sg_tensor *t) { return t->numel; }
size_t sg_tensor_nbytes(const sg_tensor *t) { return (size_t)t->numel * sg_dtype_size(t->dtype); }
const char *sg_tensor_name(const sg_tensor *t) { return t->name; }
void *sg_tensor_data(const sg_tensor *t) { return t->data; }

const char *sg_shape_str(const sg_tensor *t, char *buf, size_t n)
{
    int k = snprintf(buf, n, "(");
    for (int i = 0; i < t->ndim && k < (int)n; i++)
        k += snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < (int)n) snprintf(buf + k, n - k, ") %s", sg_dtype_name(t->dtype));
    return buf;
}

sg_status sg_check_not_overlapping(const sg_ctx *ctx, const char *fn, const char *wout,
                                   const sg_tensor *out, const char *wother, const sg_tensor *other)
{
    if (!out || !other) return SG_OK;
    const char *pa = out->data, *pb = other->data;
    if (pa < pb + sg_tensor_nbytes(other) && pb < pa + sg_tensor_nbytes(out))
        return sg_fail(ctx, SG_ERR_INVALID,
                       "%s: output '%s' overlaps '%s' in memory; expected separate buffers", fn, wout,
                       wother);
    return SG_OK;
}

sg_status sg_check_disjoint(const sg_ctx *ctx, const char *fn, int nout, int n,
                            const char *const *names, const sg_tensor *const *ts)
{
    for (int i = 0; i < nout; i++)
        for (int j = 0; j < n; j++)
            if (j != i) SG_TRY(sg_check_not_overlapping(ctx, fn, names[i], ts[i], names[j], ts[j]));
    return SG_OK;
}

const double *sg_cpu_as_f64(const sg_tensor *t, double **owned)
{
    *owned = NULL;
    if (t->dtype == SG_DTYPE_F64) return t->data;
    double *d = malloc((size_t)t->numel * sizeof *d);
    if (!d) return NULL;
    if (t->dtype == SG_DTYPE_F32) {
        const float *f = t->data;
        for (int64_t i = 0; i < t->numel; i++) d[i] = f[i];
    } else {
        for (int64_t i = 0; i < t->numel; i++) d[i] = sg_ld(t, i);
    }
    *owned = d;
    return d;
}

void sg_cpu_store(sg_tensor *t, int64_t off, const double *v, int64_t n)
{
    switch (t->dtype) {
    case SG_DTYPE_F64: memcpy((double *)t->data + off, v, (size_t)n * sizeof *v); break;
    case SG_DTYPE_F32: {
        float *f = (float *)t->data + off;
        for (int64_t i = 0; i < n; i++) f[i] = (float)v[i];
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++) sg_st(t, off + i, v[i]);
    }
}

sg_status sg_check_tensor(const sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t)
{
    if (!t) return sg_fail(ctx, SG_ERR_NULL, "%s: tensor '%s' is NULL", fn, what);
    if (t->ctx != ctx)
        return sg_fail(ctx, SG_ERR_BACKEND, "%s: tensor '%s' (%s) belongs to another context", fn,
                       what, t->name);
    return SG_OK;
}

sg_status sg_check_dtype(const sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                         sg_dtype want)
{
    SG_TRY(sg_check_tensor(ctx, fn, what, t));
    if (t->dtype != want)
        return sg_fail(ctx, SG_ERR_DTYPE, "%s: tensor '%s' is %s, expected %s", fn, what,
                       sg_dtype_name(t->dtype), sg_dtype_name(want));
    return SG_OK;
}

sg_status sg_check_count(const sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                         sg_dtype want, int64_t n, const char *note)
{
    SG_TRY(sg_check_dtype(ctx, fn, what, t, want));
    if (t->numel == n) return SG_OK;
    char s[96];
    return sg_fail(ctx, SG_ERR_SHAPE, "%s: '%s' (%s) is %s, expected %lld element%s%s%s%s", fn, what, t->name,
                   sg_shape_str(t, s, sizeof s), (long long)n, n == 1 ? "" : "s", note ? " (" : "",
                   note ? note : "", note ? ")" : "");
}

sg_status sg_check_float(const sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t)
{
    SG_TRY(sg_check_tensor(ctx, fn, what, t));
    if (t->dtype == SG_DTYPE_F32 || (t->dtype == SG_DTYPE_F64 && ctx->backend == SG_BACKEND_CPU))
        return SG_OK;
    return sg_fail(ctx, SG_ERR_DTYPE, "%s: tensor '%s' is %s, expected f32%s", fn, what,
                   sg_dtype_name(t->dtype), ctx->backend == SG_BACKEND_CPU ? " or f64" : "");
}

sg_status sg_check_float_or_bf16(const sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t)
{
    SG_TRY(sg_check_tensor(ctx, fn, what, t));
    if (t->dtype == SG_DTYPE_BF16) return SG_OK;
    return sg_check_float(ctx, fn, what, t);
}

static bool same_dims(const sg_tensor *a, const sg_tensor *b)
{
    bool same = a->ndim == b->ndim;
    for (int i = 0; same && i < a->ndim; i++) same = a->shape[i] == b->shape[i];
    return same;
}

sg_status sg_check_same_dims(const sg_ctx *ctx, const char *fn, const char *wa,
                             const sg_tensor *a, const char *wb, const sg_tensor *b)
{
    SG_TRY(sg_check_tensor(ctx, fn, wa, a));
    SG_TRY(sg_check_tensor(ctx, fn, wb, b));
    if (same_dims(a, b)) return SG_OK;
    char sa[96], sb[96];
    return sg_fail(ctx, SG_ERR_SHAPE, "%s: '%s' is %s but '%s' is %s; expected the same shape", fn, wa,
                   sg_shape_str(a, sa, sizeof sa), wb, sg_shape_str(b, sb, sizeof sb));
}

sg_status sg_check_same_shape(const sg_ctx *ctx, const char *fn, const char *wa,
                              const sg_tensor *a, const char *wb, const sg_tensor *b)
{
    SG_TRY(sg_check_tensor(ctx, fn, wa, a));
    SG_TRY(sg_check_tensor(ctx, fn, wb, b));
    if (!same_dims(a, b) || a->dtype != b->dtype) {
        char sa[96], sb[96];
        return sg_fail(ctx, a->dtype == b->dtype ? SG_ERR_SHAPE : SG_ERR_DTYPE,
                       "%s: '%s' is %s but '%s' is %s; expected the same shape and dtype", fn, wa,
                       sg_shape_str(a, sa, sizeof sa), wb, sg_shape_str(b, sb, sizeof sb));
    }
    return SG_OK;
}

sg_status sg_check_shape2(const sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *t,
                          int64_t rows, int64_t cols)
{
    SG_TRY(sg_check_tensor(ctx, fn, what, t));
    bool ok = (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols) ||
              (t->ndim == 1 && rows == 1 && t->shape[0] == cols);
    if (!ok) {
        char s[96];
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: '%s' is %s, expected (%lld, %lld)", fn, what,
                       sg_shape_str(t, s, sizeof s), (long long)rows, (long long)cols);
    }
    return SG_OK;
}

/* ---- copies, fill, convert ---- */

static sg_status check_nbytes(const sg_tensor *t, const char *fn, size_t nbytes, const void *p)
{
    if (!p) return sg_fail(t->ctx, SG_ERR_NULL, "%s: host pointer is NULL", fn);
    if (nbytes != sg_tensor_nbytes(t))
        return sg_fail(t->ctx, SG_ERR_SHAPE, "%s: %zu bytes given, tensor '%s' holds %zu", fn,
                       nbytes, t->name, sg_tensor_nbytes(t));
    return SG_OK;
}

sg_status sg_tensor_set_rows(sg_tensor *t, int64_t rows)
{
    if (!t) return SG_ERR_NULL;
    /* Rows of the shape it has now (sg_tensor_set_shape may have changed a row's size). */
    int64_t row = t->numel / t->shape[0], most = t->cap_numel / row;
    if (most > t->cap_rows) most = t->cap_rows;
    if (rows < 1 || rows > most)
        return sg_fail(t->ctx, SG_ERR_SHAPE, "sg_tensor_set_rows: '%s' holds 1 to %lld rows, %lld asked for",
                       t->name, (long long)most, (long long)rows);
    t->numel = row * rows;
    t->shape[0] = rows;
    return SG_OK;
}

sg_status sg_tensor_set_shape(sg_tensor *t, int ndim, const int64_t *shape)
{
    if (!t) return SG_ERR_NULL;
    if (!shape) return sg_fail(t->ctx, SG_ERR_NULL, "sg_tensor_set_shape: '%s': shape is NULL", t->name);
    if (ndim < 1 || ndim > SG_MAX_DIMS)
        return sg_fail(t->ctx, SG_ERR_SHAPE, "sg_tensor_set_shape: '%s': ndim %d, expected 1 to %d", t->name,
                       ndim, SG_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0 || n > t->cap_numel / shape[i]) {
            char want[96];
            int k = snprintf(want, sizeof want, "(");
            for (int j = 0; j < ndim && k < (int)sizeof want; j++)
                k += snprintf(want + k, sizeof want - k, "%s%lld", j ? ", " : "", (long long)shape[j]);
            return sg_fail(t->ctx, SG_ERR_SHAPE, "sg_tensor_set_shape: '%s' holds %lld elements; shape %s) "
                           "has a dimension < 1 or does not fit", t->name, (long long)t->cap_numel, want);
        }
        n *= shape[i];
    }
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->ndim = ndim;
    t->numel = n;
    return SG_OK;
}

sg_status sg_tensor_copy_from_host(sg_tensor *t, const void *src, size_t nbytes)
{
    if (!t) return SG_ERR_NULL;
    SG_TRY(check_nbytes(t, "sg_tensor_copy_from_host", nbytes, src));
    SG_TRY(sg_capture_forbid(t->ctx, "sg_tensor_copy_from_host", "copied host memory into a tensor",
                             "copy new data into the graph's static inputs before replay"));
    return t->ctx->dev->copy_h2d(t->ctx, t->data, src, nbytes);
}

sg_status sg_tensor_copy_to_host(const sg_tensor *t, void *dst, size_t nbytes)
{
    if (!t) return SG_ERR_NULL;
    SG_TRY(sg_capture_forbid(t->ctx, "sg_tensor_copy_to_host", "read a device value to the host",
                             "move the read after replay (sg_readback for no sync)"));
    SG_TRY(check_nbytes(t, "sg_tensor_copy_to_host", nbytes, dst));
    return t->ctx->dev->copy_d2h(t->ctx, dst, t->data, nbytes);
}

sg_status sg_tensor_copy(sg_tensor *dst, const sg_tensor *src)
{
    if (!dst || !src) return SG_ERR_NULL;
    sg_ctx *ctx = dst->ctx;
    SG_TRY(sg_check_tensor(ctx, "sg_tensor_copy", "src", src));
    if (sg_tensor_nbytes(dst) != sg_tensor_nbytes(src) || dst->dtype != src->dtype)
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "sg_tensor_copy: '%s' (%zu bytes %s) and '%s' (%zu bytes %s) differ",
                       dst->name, sg_tensor_nbytes(dst), sg_dtype_name(dst->dtype), src->name,
                       sg_tensor_nbytes(src), sg_dtype_name(src->dtype));
    return ctx->dev->copy_d2d(ctx, dst->data, src->data, sg_tensor_nbytes(src));
}

typedef struct fill_args {
    sg_tensor *t;
    double value;
} fill_args;

static sg_status fill_cpu(sg_ctx *ctx, const void *a)
{
    const fill_args *f = a;
    for (int64_t i = 0; i < f->t->numel; i++) sg_st(f->t, i, f->value);
    return SG_OK;
}

sg_status sg_tensor_fill(sg_tensor *t, double value)
{
    if (!t) return SG_ERR_NULL;
    if (t->ctx->backend == SG_BACKEND_CPU) return sg_cpu_run(t->ctx, fill_cpu, &(fill_args){t, value}, sizeof(fill_args));
    return SG_CUDA_DISPATCH(t->ctx, sg_fill_cuda(t->ctx, t, value));
}

/* t += value: value in t's dtype first, the sum in float (f32, bf16), double (f64) or int32
 * (wrapping), rounded to the dtype: what the CUDA kernel computes. */
static sg_status add_scalar_cpu(sg_ctx *ctx, const void *a)
{
    (void)ctx;
    const fill_args *f = a;
    sg_tensor *t = f->t;
    for (int64_t i = 0; i < t->numel; i++) {
        switch (t->dtype) {
        case SG_DTYPE_F32: ((float *)t->data)[i] += (float)f->value; break;
        case SG_DTYPE_F64: ((double *)t->data)[i] += f->value; break;
        case SG_DTYPE_BF16: {
            float v = (float)sg_bf16_to_double(sg_double_to_bf16(f->value));
            sg_st(t, i, (float)sg_ld(t, i) + v);
            break;
        }
        case SG_DTYPE_I32: {
            int32_t *p = (int32_t *)t->data + i;
            *p = (int32_t)(uint32_t)((uint32_t)*p + (uint32_t)(int32_t)f->value);
            break;
        }
        }
    }
    return SG_OK;
}

sg_status sg_tensor_add_scalar(sg_tensor *t, double value)
{
    if (!t) return SG_ERR_NULL;
    SG_TRY(sg_check_tensor(t->ctx, "sg_tensor_add_scalar", "t", t));
    if (t->dtype == SG_DTYPE_I32 && (value != (double)(int32_t)value))
        return sg_fail(t->ctx, SG_ERR_INVALID, "sg_tensor_add_scalar: %g added to int32 tensor '%s': expected an "
                       "int32 value", value, t->name);
    if (t->ctx->backend == SG_BACKEND_CPU)
        return sg_cpu_run(t->ctx, add_scalar_cpu, &(fill_args){t, value}, sizeof(fill_args));
    return SG_CUDA_DISPATCH(t->ctx, sg_add_scalar_cuda(t->ctx, t, value));
}

typedef struct convert_args {
    sg_tensor *dst;
    const sg_tensor *src;
} convert_args;

static sg_status convert_cpu(sg_ctx *ctx, const void *a)
{
    const convert_args *c = a;
    for (int64_t i = 0; i < c->src->numel; i++) sg_st(c->dst, i, sg_ld(c->src, i));
    return SG_OK;
}

sg_status sg_tensor_convert(sg_tensor *dst, const sg_tensor *src)
{
    if (!dst || !src) return SG_ERR_NULL;
    sg_ctx *ctx = dst->ctx;
    SG_TRY(sg_check_tensor(ctx, "sg_tensor_convert", "src", src));
    if (dst->numel != src->numel)
        return sg_fail(ctx, SG_ERR_SHAPE, "sg_tensor_convert: '%s' has %lld elements, '%s' %lld",
                       dst->name, (long long)dst->numel, src->name, (long long)src->numel);
    if (dst->dtype == src->dtype) return sg_tensor_copy(dst, src);
    if (ctx->backend == SG_BACKEND_CPU)
        return sg_cpu_run(ctx, convert_cpu, &(convert_args){dst, src}, sizeof(convert_args));
    bool ok = (dst->dtype == SG_DTYPE_F32 || dst->dtype == SG_DTYPE_BF16) &&
              (src->dtype == SG_DTYPE_F32 || src->dtype == SG_DTYPE_BF16);
    if (!ok)
        return sg_fail(ctx, SG_ERR_DTYPE, "sg_tensor_convert: %s to %s is not supported on CUDA",
                       sg_dtype_name(src->dtype), sg_dtype_name(dst->dtype));
    return SG_CUDA_DISPATCH(ctx, sg_convert_cuda(ctx, dst, src));
}

typedef struct small_args {
    void *dst;
    size_t n;
    unsigned char bytes[64];
} small_args;

static sg_status small_cpu(sg_ctx *ctx, const void *a)
{
    const small_args *w = a;
    memcpy(w->dst, w->bytes, w->n);
    return SG_OK;
}

sg_status sg_tensor_write_small(sg_tensor *t, size_t off, const void *src, size_t nbytes)
{
    if (!t || !src) return SG_ERR_NULL;
    if (nbytes > 64 || off + nbytes > sg_tensor_nbytes(t))
        return sg_fail(t->ctx, SG_ERR_INVALID,
                       "sg_tensor_write_small: %zu bytes at offset %zu do not fit '%s' (%zu bytes, "
                       "at most 64 a write)",
                       nbytes, off, t->name, sg_tensor_nbytes(t));
    char *dst = (char *)t->data + off;
    if (t->ctx->backend == SG_BACKEND_CPU) {
        small_args a = {dst, nbytes, {0}};
        memcpy(a.bytes, src, nbytes);
        return sg_cpu_run(t->ctx, small_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(t->ctx, sg_write_small_cuda(t->ctx, dst, src, nbytes));
}
