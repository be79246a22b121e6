/* text.c: the GPT's data set: sizing a regular file up front (bytes, or a token file whose
 * format is read from its first bytes), checking every token against the vocabulary, then
 * streaming the tokens onto the device chunk by chunk in their storage width as both splits;
 * and the batch gather's entry points with the CPU reference (the CUDA kernel is in
 * text_cuda.cu). */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64

#include "nn/text.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* Token files are little-endian, and are copied to the device as they are. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "text.c uploads little-endian token files unconverted: a big-endian host needs a byte swap"
#endif

/* One split's tokens: the file they come from and where they live on the device. */
typedef struct text_split {
    char path[512];
    const char *format;     /* "bytes", "raw uint16", "llm.c v1 (uint16)", "llm.c v2 (uint32)" */
    int width;              /* bytes a token: 1, 2 or 4 */
    int64_t off;            /* byte offset of its first token in the file */
    int64_t n;              /* tokens */
    sg_tensor *data;        /* (ceil(n * width / 4)) I32 storage holding the n tokens as they
                             * are in the file (unsigned, little-endian); NULL when n is 0 */
} text_split;

struct sg_text {
    sg_ctx *ctx;
    int64_t vocab;          /* 256 for bytes */
    bool tokens;            /* a token file (the vocab option), not bytes */
    text_split split[2];    /* train, validation */
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

/* ---- reading a file: a regular file of known size, its format, its tokens ---- */

/* bytes as "512 B", "3.5 MiB", "50.0 GiB", for size messages. */
static const char *human_bytes(double bytes, char *buf, size_t cap)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (bytes >= 1024 && u < 6) bytes /= 1024, u++;
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
    return buf;
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

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* An open file and where its tokens are. */
typedef struct text_file {
    const char *path;
    int fd;
    int64_t size;           /* bytes */
    const char *format;
    int width;              /* bytes a token */
    int64_t off, n;         /* first token's byte offset; tokens */
} text_file;

/* A token file's format, from its size and first bytes: an llm.c shard (the magic, a version
 * of 1 or 2, exactly the tokens its header counts after it), else raw uint16 (an even size). */
static sg_status token_format(sg_ctx *ctx, text_file *f)
{
    const char *p = f->path;
    unsigned char h[SG_TEXT_LLMC_HEADER_BYTES];
    int64_t got = f->size < (int64_t)sizeof h ? f->size : (int64_t)sizeof h;
    if (got >= 4) SG_TRY(read_at(ctx, p, f->fd, h, got, 0, f->size));
    if (got >= 4 && le32(h) == SG_TEXT_LLMC_MAGIC) {
        if (f->size < SG_TEXT_LLMC_HEADER_BYTES)
            return sg_fail(ctx, SG_ERR_INVALID,
                           "sg_text_open: '%s' begins with llm.c's magic number %d but holds "
                           "%lld bytes, fewer than its %d-byte header: it is cut short at byte "
                           "%lld",
                           p, SG_TEXT_LLMC_MAGIC, (long long)f->size, SG_TEXT_LLMC_HEADER_BYTES,
                           (long long)f->size);
        int32_t version = (int32_t)le32(h + 4), count = (int32_t)le32(h + 8);
        if (version != 1 && version != 2)
            return sg_fail(ctx, SG_ERR_INVALID,
                           "sg_text_open: '%s': llm.c header version %d (int32 at byte 4): "
                           "expected 1 (uint16 tokens) or 2 (uint32 tokens)",
                           p, (int)version);
        if (count < 0)
            return sg_fail(ctx, SG_ERR_INVALID,
                           "sg_text_open: '%s': llm.c header token count %d (int32 at byte 8) "
                           "is negative",
                           p, (int)count);
        f->width = version == 1 ? 2 : 4;
        f->format = version == 1 ? "llm.c v1 (uint16)" : "llm.c v2 (uint32)";
        f->off = SG_TEXT_LLMC_HEADER_BYTES;
        f->n = count;
        int64_t end = f->off + f->n * f->width;
        if (f->size != end)
            return sg_fail(ctx, SG_ERR_INVALID,
                           "sg_text_open: '%s': its llm.c header (version %d, int32 count at "
                           "byte 8) counts %lld tokens of %d bytes from byte %d, which end at "
                           "byte %lld, but the file %s at byte %lld%s",
                           p, (int)version, (long long)f->n, f->width, SG_TEXT_LLMC_HEADER_BYTES,
                           (long long)end, f->size < end ? "ends" : "goes on to its end",
                           (long long)f->size,
                           f->size < end ? ": it is truncated" : ": trailing bytes after the tokens");
        return SG_OK;
    }
    if (f->size % 2)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_text_open: '%s' holds %lld bytes, an odd number: read as raw uint16 "
                       "tokens (nanoGPT's .bin; no llm.c header, whose first int32 would be %d) "
                       "its last token, at byte %lld, is cut short",
                       p, (long long)f->size, SG_TEXT_LLMC_MAGIC, (long long)(f->size - 1));
    f->width = 2, f->format = "raw uint16", f->off = 0, f->n = f->size / 2;
    return SG_OK;
}

/* Opens path (a regular file, sg_file_open_regular) and finds its tokens: the bytes, or a
 * token file's (token_format). f->fd is -1 on failure. */
static sg_status file_open(sg_ctx *ctx, const char *path, bool tokens, text_file *f)
{
    *f = (text_file){.path = path, .fd = -1};
    SG_TRY(sg_file_open_regular(ctx, "sg_text_open", path, &f->fd, &f->size));
    if (!tokens) {
        f->format = "bytes", f->width = 1, f->off = 0, f->n = f->size;
        return SG_OK;
    }
    if (f->size == 0)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_text_open: '%s' is empty (0 bytes): a token file holds uint16 tokens "
                       "(raw, or after an llm.c header)",
                       path);
    return token_format(ctx, f);
}

/* The checks of one file held out in two splits (as sg_text_open has always made them), from
 * the file's tokens alone: an empty file, a split shorter than window tokens. */
static sg_status check_holdout(sg_ctx *ctx, const text_file *f, double val_fraction,
                               int64_t window, const char *unit, int64_t *n_train, int64_t *n_val)
{
    int64_t n = f->n;
    *n_val = (int64_t)floor(val_fraction * (double)n);
    *n_train = n - *n_val;
    if (n == 0)
        return sg_fail(ctx, SG_ERR_INVALID,
                       f->width == 1 ? "sg_text_open: '%s' is empty (0 bytes; a generated file, "
                                       "as under /proc, has no size and is not read either)"
                                     : "sg_text_open: '%s' holds no tokens (its llm.c header "
                                       "counts 0)",
                       f->path);
    if (*n_train < window || (val_fraction > 0 && *n_val < window))
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_text_open: '%s' (%lld %s) is too short for a %s split of at least "
                       "%lld %s with val_fraction %g (train %lld, validation %lld)",
                       f->path, (long long)n, unit, *n_train < window ? "train" : "validation",
                       (long long)window, unit, val_fraction, (long long)*n_train,
                       (long long)*n_val);
    return SG_OK;
}

/* A file that is one split by itself must hold a window of tokens. */
static sg_status check_whole(sg_ctx *ctx, const text_file *f, int split, int64_t window,
                             const char *unit)
{
    if (f->n >= window && f->n > 0) return SG_OK;
    if (f->n == 0 && f->width == 1)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_text_open: '%s' (the %s split) is empty (0 bytes)",
                       f->path, split_name(split));
    return sg_fail(ctx, SG_ERR_INVALID,
                   "sg_text_open: '%s' (the %s split) holds %lld %s, too few for one window of "
                   "%lld %s (T + 1)",
                   f->path, split_name(split), (long long)f->n, unit, (long long)window, unit);
}

/* The splits' tokens against the context's free memory, before anything is read. */
static sg_status check_memory(sg_ctx *ctx, const text_file *files, int nfiles)
{
    double need = 0, file_bytes = 0;
    for (int i = 0; i < nfiles; i++) need += (double)files[i].n * files[i].width,
                                     file_bytes += (double)files[i].size;
    size_t free_b = 0, total_b = 0;
    SG_TRY(sg_ctx_mem_info(ctx, &free_b, &total_b));
    if (need <= (double)free_b) return SG_OK;
    char a[32], b[32], c[32], d[32], with[600] = "";
    if (nfiles > 1) snprintf(with, sizeof with, " with '%s'", files[1].path);
    int w = files[0].width;
    return sg_fail(ctx, SG_ERR_OOM,
                   "sg_text_open: '%s'%s is %s; its tokens (%d byte%s a token) need %s on %s, "
                   "which has %s free of %s: give a smaller file",
                   files[0].path, with, human_bytes(file_bytes, a, sizeof a), w, w > 1 ? "s" : "",
                   human_bytes(need, b, sizeof b), sg_ctx_device_name(ctx),
                   human_bytes((double)free_b, c, sizeof c),
                   human_bytes((double)total_b, d, sizeof d));
}

/* Two staging buffers, used in turn: a chunk is read into one while the copy of the chunk
 * before it, from the other, may still run (copies are asynchronous on CUDA). */
typedef struct stage {
    unsigned char *buf[2];      /* (cap) each */
    int64_t cap;                /* a multiple of 4 */
    int next;                   /* the buffer the next chunk goes to */
    bool pending;               /* a copy may still be running */
} stage;

/* The first token >= vocab among the n tokens of `width` bytes at buf, or -1. */
static int64_t first_bad(const unsigned char *buf, int width, int64_t n, int64_t vocab)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = width == 2 ? (uint32_t)buf[2 * i] | (uint32_t)buf[2 * i + 1] << 8
                                : le32(buf + 4 * i);
        if ((int64_t)v >= vocab) return i;
    }
    return -1;
}

/* Reads every token of the file and refuses the first that is not below the vocabulary,
 * naming its index, byte offset and value. Nothing to read when no token of this width can
 * reach the vocabulary. */
static sg_status check_tokens(sg_ctx *ctx, const text_file *f, int64_t vocab, stage *s)
{
    if (f->width == 1 || (f->width == 2 && vocab >= 65536)) return SG_OK;
    int64_t per = s->cap / f->width;    /* whole tokens a chunk */
    for (int64_t done = 0; done < f->n;) {
        int64_t k = f->n - done < per ? f->n - done : per;
        SG_TRY(read_at(ctx, f->path, f->fd, s->buf[0], k * f->width, f->off + done * f->width,
                       f->size));
        int64_t i = first_bad(s->buf[0], f->width, k, vocab);
        if (i >= 0) {
            int64_t at = f->off + (done + i) * f->width;
            uint32_t v = f->width == 2 ? (uint32_t)s->buf[0][2 * i] | (uint32_t)s->buf[0][2 * i + 1] << 8
                                       : le32(s->buf[0] + 4 * i);
            return sg_fail(ctx, SG_ERR_INVALID,
                           "sg_text_open: '%s' (%s): token %lld (at byte %lld) is %lu, not below "
                           "the vocabulary size %lld: give the tokenizer's vocabulary (or more)",
                           f->path, f->format, (long long)(done + i), (long long)at,
                           (unsigned long)v, (long long)vocab);
        }
        done += k;
    }
    return SG_OK;
}

/* The split's tokens, from byte offset off of file f, into its I32 storage chunk by chunk:
 * host memory stays O(SG_TEXT_CHUNK_BYTES) whatever the file's size. Chunks start at
 * multiples of cap bytes (a multiple of 4: whole I32 elements); the last is padded with zeros
 * to a whole element. */
static sg_status load_split(sg_ctx *ctx, text_split *sp, const text_file *f, stage *s)
{
    int64_t off = sp->off;
    int64_t total = sp->n * sp->width;
    for (int64_t done = 0; done < total;) {
        int64_t len = total - done < s->cap ? total - done : s->cap, padded = (len + 3) / 4 * 4;
        unsigned char *buf = s->buf[s->next];
        SG_TRY(read_at(ctx, f->path, f->fd, buf, len, off + done, f->size));
        memset(buf + len, 0, (size_t)(padded - len));
        /* The copy from the other buffer overlapped the read; this one's last copy is done. */
        if (s->pending) SG_TRY(sg_ctx_sync(ctx));
        s->pending = false;
        sg_tensor *chunk;
        int64_t elems = padded / 4;
        SG_TRY(sg_tensor_view(sp->data, done / 4, 1, &elems, "text.chunk", &chunk));
        sg_status st = sg_tensor_copy_from_host(chunk, buf, (size_t)padded);
        sg_tensor_destroy(chunk);
        SG_TRY(st);
        s->pending = true;
        s->next ^= 1;
        done += len;
    }
    return SG_OK;
}

/* Frees the staging after the last copy from it has finished. */
static sg_status stage_free(sg_ctx *ctx, stage *s, sg_status st)
{
    if (s->pending) {
        sg_status sync = sg_ctx_sync(ctx);
        if (st == SG_OK) st = sync;
    }
    free(s->buf[0]);
    free(s->buf[1]);
    return st;
}

/* Checks the tokens of every file, then allocates both splits and fills them through the
 * staging buffers: split 0 from files[0], split 1 from files[nfiles - 1] (after split 0's
 * tokens when there is one file). */
static sg_status load(sg_text *t, const text_file *files, int nfiles)
{
    sg_ctx *ctx = t->ctx;
    int64_t most = 0;
    for (int i = 0; i < 2; i++)
        if (t->split[i].n * t->split[i].width > most) most = t->split[i].n * t->split[i].width;
    stage s = {0};
    s.cap = most < SG_TEXT_CHUNK_BYTES ? (most + 3) / 4 * 4 : SG_TEXT_CHUNK_BYTES;
    s.buf[0] = malloc((size_t)s.cap);
    s.buf[1] = malloc((size_t)s.cap);
    if (!s.buf[0] || !s.buf[1]) {
        char a[32];
        return stage_free(ctx, &s, sg_fail(ctx, SG_ERR_OOM, "sg_text_open: out of host memory "
                                           "for a %s staging buffer reading '%s'",
                                           human_bytes(2.0 * (double)s.cap, a, sizeof a),
                                           files[0].path));
    }
    sg_status st = SG_OK;
    for (int i = 0; i < nfiles && st == SG_OK && t->tokens; i++)
        st = check_tokens(ctx, &files[i], t->vocab, &s);
    for (int i = 0; i < 2 && st == SG_OK; i++) {
        text_split *sp = &t->split[i];
        int64_t elems = (sp->n * sp->width + 3) / 4;
        if (sp->n)
            st = sg_tensor_create(ctx, SG_DTYPE_I32, 1, &elems, i ? "text.val" : "text.train",
                                  &sp->data);
    }
    for (int i = 0; i < 2 && st == SG_OK; i++)
        if (t->split[i].n)
            st = load_split(ctx, &t->split[i], &files[i < nfiles ? i : 0], &s);
    return stage_free(ctx, &s, st);
}

/* Split i of t: n tokens of file f from its token off_tokens on. */
static void split_set(text_split *sp, const text_file *f, int64_t off_tokens, int64_t n)
{
    snprintf(sp->path, sizeof sp->path, "%s", f->path);
    sp->format = f->format;
    sp->width = f->width;
    sp->off = f->off + off_tokens * f->width;
    sp->n = n;
}

sg_status sg_text_open_ex(sg_ctx *ctx, const char *path, const sg_text_options *o, sg_text **out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!path || !out)
        return sg_fail(ctx, SG_ERR_NULL, "sg_text_open: %s is NULL", path ? "out" : "path");
    *out = NULL;
    sg_text_options opt = o ? *o : (sg_text_options){0};
    if (opt.window == 0) opt.window = 1;
    if (!(opt.val_fraction >= 0 && opt.val_fraction < 1))
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_text_open: '%s': val_fraction %g, expected 0 <= it < 1", path,
                       opt.val_fraction);
    if (opt.window < 1)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_text_open: '%s': window %lld, expected >= 1",
                       path, (long long)opt.window);
    if (opt.vocab < 0 || opt.vocab > INT32_MAX)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_text_open: '%s': vocab %lld, expected 0 (bytes) or 1 to %d (tokens "
                       "are I32)",
                       path, (long long)opt.vocab, INT32_MAX);
    if (opt.val_path && opt.val_fraction > 0)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_text_open: '%s': val_fraction %g and a validation file '%s': hold "
                       "out a share of one file, or give a second, not both",
                       path, opt.val_fraction, opt.val_path);
    SG_TRY(sg_capture_forbid(ctx, "sg_text_open", "read a data set from a file",
                             "open the data set before capture"));
    bool tokens = opt.vocab > 0;
    const char *unit = tokens ? "tokens" : "bytes";
    text_file files[2] = {{.fd = -1}, {.fd = -1}};
    int nfiles = opt.val_path ? 2 : 1;
    int64_t n_train = 0, n_val = 0;
    sg_status st = file_open(ctx, path, tokens, &files[0]);
    if (st == SG_OK && nfiles == 2) st = file_open(ctx, opt.val_path, tokens, &files[1]);
    if (st == SG_OK && nfiles == 1)
        st = check_holdout(ctx, &files[0], opt.val_fraction, opt.window, unit, &n_train, &n_val);
    for (int i = 0; i < nfiles && nfiles == 2 && st == SG_OK; i++)
        st = check_whole(ctx, &files[i], i, opt.window, unit);
    if (st == SG_OK) st = check_memory(ctx, files, nfiles);
    sg_text *t = st == SG_OK ? calloc(1, sizeof *t) : NULL;
    if (st == SG_OK && !t) st = sg_fail(ctx, SG_ERR_OOM, "sg_text_open: out of host memory");
    if (st == SG_OK) {
        t->ctx = ctx;
        t->tokens = tokens;
        t->vocab = tokens ? opt.vocab : 256;
        if (nfiles == 1) {
            split_set(&t->split[0], &files[0], 0, n_train);
            split_set(&t->split[1], &files[0], n_train, n_val);
        } else {
            split_set(&t->split[0], &files[0], 0, files[0].n);
            split_set(&t->split[1], &files[1], 0, files[1].n);
        }
        st = load(t, files, nfiles);
    }
    for (int i = 0; i < 2; i++)
        if (files[i].fd >= 0) close(files[i].fd);
    if (st != SG_OK) {
        sg_text_close(t);
        return st;
    }
    *out = t;
    return SG_OK;
}

sg_status sg_text_open_window(sg_ctx *ctx, const char *path, double val_fraction, int64_t window,
                              sg_text **out)
{
    if (ctx && window < 1 && path && out) {
        *out = NULL;
        return sg_fail(ctx, SG_ERR_INVALID, "sg_text_open: '%s': window %lld, expected >= 1",
                       path, (long long)window);
    }
    sg_text_options o = {.val_fraction = val_fraction, .window = window};
    return sg_text_open_ex(ctx, path, &o, out);
}

sg_status sg_text_open(sg_ctx *ctx, const char *path, double val_fraction, sg_text **out)
{
    return sg_text_open_window(ctx, path, val_fraction, 1, out);
}

void sg_text_close(sg_text *t)
{
    if (!t) return;
    sg_tensor_destroy(t->split[0].data);
    sg_tensor_destroy(t->split[1].data);
    free(t);
}

static bool split_ok(const sg_text *t, int split) { return t && (split == 0 || split == 1); }

int64_t sg_text_size(const sg_text *t, int split) { return split_ok(t, split) ? t->split[split].n : -1; }
const char *sg_text_path(const sg_text *t) { return t ? t->split[0].path : NULL; }
const char *sg_text_split_path(const sg_text *t, int split)
{
    return split_ok(t, split) ? t->split[split].path : NULL;
}
int64_t sg_text_vocab(const sg_text *t) { return t ? t->vocab : 0; }
int sg_text_token_bytes(const sg_text *t, int split) { return split_ok(t, split) ? t->split[split].width : 0; }
const char *sg_text_format(const sg_text *t, int split)
{
    return split_ok(t, split) ? t->split[split].format : NULL;
}

void sg_text_set_row0(sg_text *t, int64_t row0)
{
    if (t) t->row0 = row0;
}

size_t sg_text_bytes(const sg_text *t)
{
    size_t n = 0;
    for (int i = 0; t && i < 2; i++)
        if (t->split[i].data) n += t->split[i].data->block->size;
    return n;
}

/* ---- the batch gather ---- */

typedef struct batch_args {
    const void *data;           /* the split's n tokens of `width` bytes */
    int64_t n;
    int width;
    uint64_t seed;
    int64_t step;               /* used when step_t is NULL */
    const sg_tensor *step_t;    /* (1) I32, read when the thunk runs */
    sg_tensor *tokens, *targets;
    int64_t len;                /* real tokens a row (<= T); the rest is padding */
    int64_t row0;               /* row b is the window of row row0 + b (data parallelism) */
    /* sg_text_batch_vary (buckets.n > 0): len drawn from the step, rows of the bucket's Tb
     * written from the start of tokens/targets, the bucket's index into bucket_out (1) I32. */
    sg_text_buckets buckets;
    sg_tensor *bucket_out;
} batch_args;

/* dst[i] = the token at src[i], i < n, for each storage width. */
static void widen(int32_t *dst, const void *src, int width, int64_t n)
{
    if (width == 1)
        for (int64_t i = 0; i < n; i++) dst[i] = ((const uint8_t *)src)[i];
    else if (width == 2)
        for (int64_t i = 0; i < n; i++) dst[i] = ((const uint16_t *)src)[i];
    else
        for (int64_t i = 0; i < n; i++) dst[i] = (int32_t)((const uint32_t *)src)[i];
}

/* The CPU reference: row b is the window at sg_text_window_start(seed, step, row0 + b, n - len),
 * then padding (token 0, target -1) up to T. A varying batch draws len from the step and
 * takes its bucket's Tb as T: rows of Tb from the start of tokens, the rest untouched. */
static sg_status batch_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    const batch_args *a = p;
    int64_t step = a->step_t ? ((const int32_t *)a->step_t->data)[0] : a->step;
    int64_t B = a->tokens->shape[0], T = a->tokens->shape[1], L = a->len;
    if (a->buckets.n) {
        L = sg_text_vary_len(step, a->buckets.size[a->buckets.n - 1]);
        int k = sg_text_bucket_of(&a->buckets, L);
        T = a->buckets.size[k];
        ((int32_t *)a->bucket_out->data)[0] = k;
    }
    int64_t n_starts = a->n - L;
    const char *d = a->data;
    int32_t *tok = a->tokens->data, *tgt = a->targets->data;
    for (int64_t b = 0; b < B; b++) {
        int64_t s = sg_text_window_start(a->seed, step, a->row0 + b, n_starts);
        widen(tok + b * T, d + s * a->width, a->width, L);
        widen(tgt + b * T, d + (s + 1) * a->width, a->width, L);
        for (int64_t t = L; t < T; t++) tok[b * T + t] = 0, tgt[b * T + t] = -1;
    }
    return SG_OK;
}

/* Checks shared by the entry points; the batch's arguments but the step and len into *a. */
static sg_status check_batch(sg_text *t, const char *fn, int split, sg_tensor *tokens,
                             sg_tensor *targets, batch_args *a)
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
    const text_split *sp = &t->split[split];
    const char *unit = t->tokens ? "tokens" : "bytes";
    if (sp->n < T + 1)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "%s: the %s split of '%s' holds %lld %s; a window of T + 1 = %lld %s "
                       "does not fit (a longer file, a smaller T or another val_fraction)",
                       fn, split_name(split), sp->path, (long long)sp->n, unit,
                       (long long)(T + 1), unit);
    *a = (batch_args){.data = sp->data->data, .n = sp->n, .width = sp->width, .tokens = tokens,
                      .targets = targets, .len = T, .row0 = t->row0};
    return SG_OK;
}

static sg_status run_batch(sg_text *t, const batch_args *a)
{
    sg_ctx *ctx = t->ctx;
    if (ctx->backend == SG_BACKEND_CPU) return sg_cpu_run(ctx, batch_cpu, a, sizeof *a);
    if (a->buckets.n)
        return SG_CUDA_DISPATCH(
            ctx, sg_text_batch_vary_cuda(ctx, a->data, a->width, a->n, a->seed,
                                         (const int32_t *)a->step_t->data, a->buckets,
                                         (int32_t *)a->tokens->data, (int32_t *)a->targets->data,
                                         (int32_t *)a->bucket_out->data, a->tokens->shape[0],
                                         a->row0));
    /* tokens (B, T): shape[0] is B, shape[1] is T */
    return SG_CUDA_DISPATCH(
        ctx, sg_text_batch_cuda(ctx, a->data, a->width, a->n - a->len, a->seed, a->step,
                                a->step_t ? (const int32_t *)a->step_t->data : NULL,
                                (int32_t *)a->tokens->data, (int32_t *)a->targets->data,
                                a->tokens->shape[0], a->tokens->shape[1], a->len, a->row0));
}

sg_status sg_text_batch_host(sg_text *t, int split, uint64_t seed, int64_t step, sg_tensor *tokens,
                             sg_tensor *targets)
{
    batch_args a;
    SG_TRY(check_batch(t, "sg_text_batch_host", split, tokens, targets, &a));
    a.seed = seed, a.step = step;
    return run_batch(t, &a);
}

sg_status sg_text_batch_padded(sg_text *t, int split, uint64_t seed, int64_t step, int64_t len,
                               sg_tensor *tokens, sg_tensor *targets)
{
    batch_args a;
    SG_TRY(check_batch(t, "sg_text_batch_padded", split, tokens, targets, &a));
    if (len < 1 || len > tokens->shape[1])
        return sg_fail(t->ctx, SG_ERR_SHAPE,
                       "sg_text_batch_padded: len %lld: expected 1 to %lld (the T of tokens '%s')",
                       (long long)len, (long long)tokens->shape[1], tokens->name);
    a.seed = seed, a.step = step, a.len = len;
    return run_batch(t, &a);
}

/* A one-element I32 device value: the step read at run time, or the bucket written. */
sg_status sg_check_i32_value(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *v)
{
    SG_TRY(sg_check_dtype(ctx, fn, what, v, SG_DTYPE_I32));
    if (v->numel != 1)
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: %s '%s' has %lld elements, expected 1", fn, what,
                       v->name, (long long)v->numel);
    return SG_OK;
}

sg_status sg_text_batch_device(sg_text *t, int split, uint64_t seed, const sg_tensor *step_tensor,
                               sg_tensor *tokens, sg_tensor *targets)
{
    batch_args a;
    SG_TRY(check_batch(t, "sg_text_batch_device", split, tokens, targets, &a));
    SG_TRY(sg_check_i32_value(t->ctx, "sg_text_batch_device", "step_tensor", step_tensor));
    a.seed = seed, a.step_t = step_tensor;
    return run_batch(t, &a);
}

/* buckets[0..n) into *out: 1..SG_TEXT_MAX_BUCKETS sizes, increasing from 1 up to the T of
 * tokens (its capacity: Tb rows of every bucket fit). */
sg_status sg_text_buckets_make(sg_ctx *ctx, const char *fn, const int64_t *buckets, int n, int64_t cap,
                               const char *cap_what, sg_text_buckets *out)
{
    if (!buckets) return sg_fail(ctx, SG_ERR_NULL, "%s: buckets is NULL", fn);
    if (n < 1 || n > SG_TEXT_MAX_BUCKETS)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: %d buckets, expected 1 to %d sizes", fn, n, SG_TEXT_MAX_BUCKETS);
    for (int i = 0; i < n; i++) {
        if (buckets[i] < 1)
            return sg_fail(ctx, SG_ERR_INVALID, "%s: buckets[%d] is %lld, expected >= 1", fn, i,
                           (long long)buckets[i]);
        if (i && buckets[i] <= buckets[i - 1])
            return sg_fail(ctx, SG_ERR_INVALID,
                           "%s: buckets[%d] is %lld, not above buckets[%d] = %lld: expected "
                           "increasing sizes",
                           fn, i, (long long)buckets[i], i - 1, (long long)buckets[i - 1]);
    }
    if (buckets[n - 1] > cap)
        return sg_fail(ctx, SG_ERR_SHAPE, "%s: the largest bucket %lld exceeds %s (%lld), which must hold every "
                       "bucket", fn, (long long)buckets[n - 1], cap_what, (long long)cap);
    *out = (sg_text_buckets){.n = n};
    memcpy(out->size, buckets, (size_t)n * sizeof *buckets);
    return SG_OK;
}

sg_status sg_text_batch_vary(sg_text *t, int split, uint64_t seed, const sg_tensor *step_tensor,
                             const int64_t *buckets, int n_buckets, sg_tensor *tokens,
                             sg_tensor *targets, sg_tensor *bucket_out)
{
    const char *fn = "sg_text_batch_vary";
    batch_args a;
    /* The split holds T + 1 tokens, so every window of len <= the largest bucket <= T fits. */
    SG_TRY(check_batch(t, fn, split, tokens, targets, &a));
    SG_TRY(sg_check_i32_value(t->ctx, fn, "step_tensor", step_tensor));
    SG_TRY(sg_check_i32_value(t->ctx, fn, "bucket_out", bucket_out));
    char what[96];
    snprintf(what, sizeof what, "the T of tokens '%s'", tokens->name);
    SG_TRY(sg_text_buckets_make(t->ctx, fn, buckets, n_buckets, tokens->shape[1], what, &a.buckets));
    a.seed = seed, a.step_t = step_tensor, a.bucket_out = bucket_out;
    return run_batch(t, &a);
}

int64_t sg_vary_len(int64_t step, int64_t max) { return sg_text_vary_len(step, max); }
