/* text.c: the byte-level text data set: sizing a regular file up front, streaming it onto the
 * device chunk by chunk as both splits, and the batch gather's entry points with the CPU
 * reference (the CUDA kernel is in text_cuda.cu). */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64

#include "models/text.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
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

/* ---- reading the file: a regular file of known size, chunk by chunk onto the device ---- */

/* bytes as "512 B", "3.5 MiB", "50.0 GiB", for size messages. */
static const char *human_bytes(double bytes, char *buf, size_t cap)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (bytes >= 1024 && u < 6) bytes /= 1024, u++;
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
    return buf;
}

/* The checks that need only the file's size, before anything is read or allocated: a split
 * asked for shorter than window bytes, and tokens (I32: 4 bytes a byte of text) larger than
 * the context's free memory. */
static sg_status check_size(sg_ctx *ctx, const char *path, int64_t n, double val_fraction,
                            int64_t window, int64_t *n_train, int64_t *n_val)
{
    *n_val = (int64_t)floor(val_fraction * (double)n);
    *n_train = n - *n_val;
    if (n == 0)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_text_open: '%s' is empty (0 bytes; a generated file, as under /proc, "
                       "has no size and is not read either)",
                       path);
    if (*n_train < window || (val_fraction > 0 && *n_val < window))
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_text_open: '%s' (%lld bytes) is too short for a %s split of at least "
                       "%lld bytes with val_fraction %g (train %lld, validation %lld)",
                       path, (long long)n, *n_train < window ? "train" : "validation",
                       (long long)window, val_fraction, (long long)*n_train, (long long)*n_val);
    size_t free_b = 0, total_b = 0;
    SG_TRY(sg_ctx_mem_info(ctx, &free_b, &total_b));
    if ((uint64_t)n > free_b / sizeof(int32_t)) { /* n * 4 > free_b, without overflow */
        char a[32], b[32], c[32], d[32];
        return sg_fail(ctx, SG_ERR_OOM,
                       "sg_text_open: '%s' is %s; its tokens (4 bytes a byte of text) need %s "
                       "on %s, which has %s free of %s: give a smaller file",
                       path, human_bytes((double)n, a, sizeof a),
                       human_bytes(4.0 * (double)n, b, sizeof b), sg_ctx_device_name(ctx),
                       human_bytes((double)free_b, c, sizeof c),
                       human_bytes((double)total_b, d, sizeof d));
    }
    return SG_OK;
}

/* Exactly len bytes at offset off of the file (size bytes when opened) into buf. A read that
 * ends early means the file shrank after it was sized (or claims a size it does not hold). */
static sg_status read_at(sg_ctx *ctx, const char *path, int fd, unsigned char *buf, int64_t len,
                         int64_t off, int64_t size)
{
    for (int64_t got = 0; got < len;) {
        ssize_t r = pread(fd, buf + got, (size_t)(len - got), (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return sg_fail(ctx, SG_ERR_IO, "sg_text_open: cannot read '%s' at byte %lld: %s", path,
                           (long long)(off + got), strerror(errno));
        if (r == 0)
            return sg_fail(ctx, SG_ERR_IO,
                           "sg_text_open: '%s' ended at byte %lld, but it was %lld bytes when "
                           "opened: it shrank while being read (or is a generated file whose "
                           "size is not its length)",
                           path, (long long)(off + got), (long long)size);
        got += r;
    }
    return SG_OK;
}

/* One staging buffer, reused for every chunk: the chunk's bytes and the same as I32 tokens. */
typedef struct stage {
    unsigned char *bytes;       /* (cap) */
    int32_t *tokens;            /* (cap) I32, the source of the copy in flight when pending */
    int64_t cap;
    bool pending;               /* a copy from tokens may still be running (async on CUDA) */
} stage;

/* The split's n bytes, from offset off of the file, into its (n) I32 tensor chunk by chunk:
 * host memory stays O(SG_TEXT_CHUNK_BYTES) whatever the file's size. On CUDA a chunk's copy
 * runs while the next chunk is read; the staging tokens are overwritten only after a sync. */
static sg_status load_split(sg_text *t, int fd, int split, int64_t off, int64_t size, stage *s)
{
    sg_ctx *ctx = t->ctx;
    for (int64_t done = 0; done < t->size[split];) {
        int64_t len = t->size[split] - done < s->cap ? t->size[split] - done : s->cap;
        SG_TRY(read_at(ctx, t->path, fd, s->bytes, len, off + done, size));
        if (s->pending) SG_TRY(sg_ctx_sync(ctx));
        s->pending = false;
        for (int64_t i = 0; i < len; i++) s->tokens[i] = s->bytes[i];
        sg_tensor *chunk;
        SG_TRY(sg_tensor_view(t->data[split], done, 1, &len, "text.chunk", &chunk));
        sg_status st = sg_tensor_copy_from_host(chunk, s->tokens, (size_t)len * sizeof *s->tokens);
        sg_tensor_destroy(chunk);
        SG_TRY(st);
        s->pending = true;
        done += len;
    }
    return SG_OK;
}

/* Both splits' tensors, filled from the open file through one staging buffer. */
static sg_status load(sg_text *t, int fd, int64_t size)
{
    sg_ctx *ctx = t->ctx;
    for (int i = 0; i < 2; i++)
        if (t->size[i])
            SG_TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, &t->size[i],
                                    i ? "text.val" : "text.train", &t->data[i]));
    stage s = {0};
    s.cap = size < SG_TEXT_CHUNK_BYTES ? size : SG_TEXT_CHUNK_BYTES;
    s.bytes = malloc((size_t)s.cap);
    s.tokens = malloc((size_t)s.cap * sizeof *s.tokens);
    sg_status st = SG_OK;
    if (!s.bytes || !s.tokens) {
        char a[32];
        st = sg_fail(ctx, SG_ERR_OOM, "sg_text_open: out of host memory for a %s staging buffer "
                     "reading '%s'", human_bytes(5.0 * (double)s.cap, a, sizeof a), t->path);
    }
    if (st == SG_OK) st = load_split(t, fd, 0, 0, size, &s);
    if (st == SG_OK && t->size[1]) st = load_split(t, fd, 1, t->size[0], size, &s);
    /* The last copy may still read the staging buffer: wait for it before freeing it. */
    if (s.pending) {
        sg_status sync = sg_ctx_sync(ctx);
        if (st == SG_OK) st = sync;
    }
    free(s.bytes);
    free(s.tokens);
    return st;
}

sg_status sg_text_open_window(sg_ctx *ctx, const char *path, double val_fraction, int64_t window,
                              sg_text **out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!path || !out)
        return sg_fail(ctx, SG_ERR_NULL, "sg_text_open: %s is NULL", path ? "out" : "path");
    *out = NULL;
    if (!(val_fraction >= 0 && val_fraction < 1))
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_text_open: '%s': val_fraction %g, expected 0 <= it < 1", path,
                       val_fraction);
    if (window < 1)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_text_open: '%s': window %lld, expected >= 1",
                       path, (long long)window);
    SG_TRY(sg_capture_forbid(ctx, "sg_text_open", "read a data set from a file",
                             "open the data set before capture"));
    int fd = -1;
    int64_t n = 0, n_train = 0, n_val = 0;
    SG_TRY(sg_file_open_regular(ctx, "sg_text_open", path, &fd, &n));
    sg_status st = check_size(ctx, path, n, val_fraction, window, &n_train, &n_val);
    sg_text *t = st == SG_OK ? calloc(1, sizeof *t) : NULL;
    if (st == SG_OK && !t) st = sg_fail(ctx, SG_ERR_OOM, "sg_text_open: out of host memory");
    if (st == SG_OK) {
        t->ctx = ctx;
        snprintf(t->path, sizeof t->path, "%s", path);
        t->size[0] = n_train;
        t->size[1] = n_val;
        st = load(t, fd, n);
    }
    close(fd);
    if (st != SG_OK) {
        sg_text_close(t);
        return st;
    }
    *out = t;
    return SG_OK;
}

sg_status sg_text_open(sg_ctx *ctx, const char *path, double val_fraction, sg_text **out)
{
    return sg_text_open_window(ctx, path, val_fraction, 1, out);
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
