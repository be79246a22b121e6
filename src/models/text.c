/* text.c: the byte-level text data set: reading and splitting the file, uploading both splits,
 * and the batch gather's entry points with the CPU reference (the CUDA kernel is in
 * text_cuda.cu). */
#define _POSIX_C_SOURCE 200809L

#include "models/text.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

struct sg_text {
    sg_ctx *ctx;
    char path[512];
    int64_t size[2];        /* bytes in train, validation */
    sg_tensor *data[2];     /* (size) I32, values 0..255; NULL for an empty split */
    int64_t row0;           /* data parallelism: the batch row this model's row 0 is */
};

static const char *split_name(int split) { return split == 0 ? "train" : "validation"; }

const char *sg_text_default_path(void)
{
    static const char *const candidates[] = {
        "/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2",
        "/usr/share/common-licenses/Apache-2.0", "/usr/share/dict/words"};
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++)
        if (access(candidates[i], R_OK) == 0) return candidates[i];
    return NULL;
}

/* The whole file into a malloc'd buffer; read in chunks, so pipes and /proc files work too. */
static sg_status read_file(sg_ctx *ctx, const char *path, unsigned char **out, int64_t *n)
{
    *out = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return sg_fail(ctx, SG_ERR_IO, "sg_text_open: cannot open '%s': %s", path, strerror(errno));
    size_t len = 0, cap = 0;
    unsigned char *buf = NULL;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            unsigned char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return sg_fail(ctx, SG_ERR_OOM, "sg_text_open: out of host memory reading '%s'",
                               path);
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (err) {
        free(buf);
        return sg_fail(ctx, SG_ERR_IO, "sg_text_open: cannot read '%s': %s", path, strerror(err));
    }
    *out = buf;
    *n = (int64_t)len;
    return SG_OK;
}

/* bytes[0, n) as an I32 tensor on the device. */
static sg_status upload(sg_ctx *ctx, const char *path, int split, const unsigned char *bytes,
                        int64_t n, sg_tensor **out)
{
    int32_t *v = malloc((size_t)n * sizeof *v);
    if (!v) return sg_fail(ctx, SG_ERR_OOM, "sg_text_open: out of host memory for '%s'", path);
    for (int64_t i = 0; i < n; i++) v[i] = bytes[i];
    sg_status st =
        sg_tensor_create(ctx, SG_DTYPE_I32, 1, &n, split ? "text.val" : "text.train", out);
    if (st == SG_OK) st = sg_tensor_copy_from_host(*out, v, (size_t)n * sizeof *v);
    free(v);
    return st;
}

sg_status sg_text_open(sg_ctx *ctx, const char *path, double val_fraction, sg_text **out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!path || !out)
        return sg_fail(ctx, SG_ERR_NULL, "sg_text_open: %s is NULL", path ? "out" : "path");
    *out = NULL;
    if (!(val_fraction >= 0 && val_fraction < 1))
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_text_open: '%s': val_fraction %g, expected 0 <= it < 1", path,
                       val_fraction);
    SG_TRY(sg_capture_forbid(ctx, "sg_text_open", "read a data set from a file",
                             "open the data set before capture"));
    unsigned char *bytes;
    int64_t n;
    SG_TRY(read_file(ctx, path, &bytes, &n));
    int64_t n_val = (int64_t)floor(val_fraction * (double)n), n_train = n - n_val;
    sg_status st = SG_OK;
    if (n == 0)
        st = sg_fail(ctx, SG_ERR_INVALID, "sg_text_open: '%s' is empty", path);
    else if (n_train < 1 || (val_fraction > 0 && n_val < 1))
        st = sg_fail(
            ctx, SG_ERR_INVALID,
            "sg_text_open: '%s' (%lld bytes) is too short for a %s split with val_fraction %g",
            path, (long long)n, n_train < 1 ? "train" : "validation", val_fraction);
    sg_text *t = st == SG_OK ? calloc(1, sizeof *t) : NULL;
    if (st == SG_OK && !t) st = sg_fail(ctx, SG_ERR_OOM, "sg_text_open: out of host memory");
    if (st == SG_OK) {
        t->ctx = ctx;
        snprintf(t->path, sizeof t->path, "%s", path);
        t->size[0] = n_train;
        t->size[1] = n_val;
        st = upload(ctx, path, 0, bytes, n_train, &t->data[0]);
        if (st == SG_OK && n_val) st = upload(ctx, path, 1, bytes + n_train, n_val, &t->data[1]);
    }
    free(bytes);
    if (st != SG_OK) {
        sg_text_close(t);
        return st;
    }
    *out = t;
    return SG_OK;
}

void sg_text_close(sg_text *t)
{
    if (!t) return;
    sg_tensor_destroy(t->data[0]);
    sg_tensor_destroy(t->data[1]);
    free(t);
}

int64_t sg_text_size(const sg_text *t, int split)
{
    return (t && (split == 0 || split == 1)) ? t->size[split] : -1;
}

const char *sg_text_path(const sg_text *t) { return t ? t->path : NULL; }

void sg_text_set_row0(sg_text *t, int64_t row0)
{
    if (t) t->row0 = row0;
}

size_t sg_text_bytes(const sg_text *t)
{
    size_t n = 0;
    for (int i = 0; t && i < 2; i++)
        if (t->data[i]) n += t->data[i]->block->size;
    return n;
}

/* ---- the batch gather ---- */

typedef struct batch_args {
    const sg_tensor *data;      /* the split, (n) I32 */
    uint64_t seed;
    int64_t step;               /* used when step_t is NULL */
    const sg_tensor *step_t;    /* (1) I32, read when the thunk runs */
    sg_tensor *tokens, *targets;
    int64_t len;                /* real tokens a row (<= T); the rest is padding */
    int64_t row0;               /* row b is the window of row row0 + b (data parallelism) */
} batch_args;

/* The CPU reference: row b is the window at sg_text_window_start(seed, step, row0 + b, n - len),
 * then padding (token 0, target -1) up to T. */
static sg_status batch_cpu(sg_ctx *ctx, const void *p)
{
    const batch_args *a = p;
    int64_t step = a->step_t ? ((const int32_t *)a->step_t->data)[0] : a->step;
    int64_t B = a->tokens->shape[0], T = a->tokens->shape[1], L = a->len, n_starts = a->data->numel - L;
    const int32_t *d = a->data->data;
    int32_t *tok = a->tokens->data, *tgt = a->targets->data;
    for (int64_t b = 0; b < B; b++) {
        const int32_t *w = d + sg_text_window_start(a->seed, step, a->row0 + b, n_starts);
        memcpy(tok + b * T, w, (size_t)L * sizeof *tok);
        memcpy(tgt + b * T, w + 1, (size_t)L * sizeof *tgt);
        for (int64_t t = L; t < T; t++) tok[b * T + t] = 0, tgt[b * T + t] = -1;
    }
    return SG_OK;
}

/* Checks shared by both entry points; the split's tensor into *data. */
static sg_status check_batch(sg_text *t, const char *fn, int split, const sg_tensor *tokens,
                             const sg_tensor *targets, const sg_tensor **data)
{
    if (!t) return SG_ERR_NULL;
    sg_ctx *ctx = t->ctx;
    if (split != 0 && split != 1)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: split %d, expected 0 (train) or 1 (validation)",
                       fn, split);
    SG_TRY(sg_check_dtype(ctx, fn, "tokens", tokens, SG_DTYPE_I32));
    SG_TRY(sg_check_dtype(ctx, fn, "targets", targets, SG_DTYPE_I32));
    char s[96];
    if (tokens->ndim != 2)
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: tokens '%s' is %s, expected (B, T)", fn,
                       tokens->name, sg_shape_str(tokens, s, sizeof s));
    if (targets->numel != tokens->numel)
        return sg_fail(ctx, SG_ERR_SHAPE,
                       "%s: targets '%s' is %s, expected (%lld, %lld) as the tokens", fn,
                       targets->name, sg_shape_str(targets, s, sizeof s),
                       (long long)tokens->shape[0], (long long)tokens->shape[1]);
    int64_t T = tokens->shape[1];
    if (t->size[split] < T + 1)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "%s: the %s split of '%s' holds %lld bytes; a window of T + 1 = %lld bytes "
                       "does not fit (a longer file, a smaller T or another val_fraction)",
                       fn, split_name(split), t->path, (long long)t->size[split],
                       (long long)(T + 1));
    *data = t->data[split];
    return SG_OK;
}

static sg_status run_batch(sg_text *t, const batch_args *a)
{
    sg_ctx *ctx = t->ctx;
    if (ctx->backend == SG_BACKEND_CPU) return sg_cpu_run(ctx, batch_cpu, a, sizeof *a);
    /* tokens (B, T): shape[0] is B, shape[1] is T */
    return SG_CUDA_DISPATCH(
        ctx, sg_text_batch_cuda(ctx, (const int32_t *)a->data->data, a->data->numel - a->len,
                                a->seed, a->step,
                                a->step_t ? (const int32_t *)a->step_t->data : NULL,
                                (int32_t *)a->tokens->data, (int32_t *)a->targets->data,
                                a->tokens->shape[0], a->tokens->shape[1], a->len, a->row0));
}

sg_status sg_text_batch_host(sg_text *t, int split, uint64_t seed, int64_t step, sg_tensor *tokens,
                             sg_tensor *targets)
{
    const sg_tensor *data = NULL;
    SG_TRY(check_batch(t, "sg_text_batch_host", split, tokens, targets, &data));
    batch_args a = {data, seed, step, NULL, tokens, targets, tokens->shape[1], t->row0};
    return run_batch(t, &a);
}

sg_status sg_text_batch_padded(sg_text *t, int split, uint64_t seed, int64_t step, int64_t len,
                               sg_tensor *tokens, sg_tensor *targets)
{
    const sg_tensor *data = NULL;
    SG_TRY(check_batch(t, "sg_text_batch_padded", split, tokens, targets, &data));
    if (len < 1 || len > tokens->shape[1])
        return sg_fail(t->ctx, SG_ERR_SHAPE,
                       "sg_text_batch_padded: len %lld: expected 1 to %lld (the T of tokens '%s')",
                       (long long)len, (long long)tokens->shape[1], tokens->name);
    batch_args a = {data, seed, step, NULL, tokens, targets, len, t->row0};
    return run_batch(t, &a);
}

sg_status sg_text_batch_device(sg_text *t, int split, uint64_t seed, const sg_tensor *step_tensor,
                               sg_tensor *tokens, sg_tensor *targets)
{
    const sg_tensor *data = NULL;
    SG_TRY(check_batch(t, "sg_text_batch_device", split, tokens, targets, &data));
    SG_TRY(
        sg_check_dtype(t->ctx, "sg_text_batch_device", "step_tensor", step_tensor, SG_DTYPE_I32));
    if (step_tensor->numel != 1)
        return sg_fail(t->ctx, SG_ERR_SHAPE,
                       "sg_text_batch_device: step_tensor '%s' has %lld elements, expected 1",
                       step_tensor->name, (long long)step_tensor->numel);
    batch_args a = {data, seed, 0, step_tensor, tokens, targets, tokens->shape[1], t->row0};
    return run_batch(t, &a);
}
