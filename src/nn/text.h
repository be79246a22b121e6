/* text.h: the GPT's data set: a token stream from a file (its bytes as tokens 0..255, or a
 * token file: nanoGPT's raw uint16 train.bin / val.bin, or an llm.c shard with its 1024-byte
 * header, uint16 or uint32 tokens), split into train and validation parts (the last share of
 * one file held out, or a second file) and kept on the device in its storage width (1, 2 or 4
 * bytes a token). A batch gather writes B windows of T+1 consecutive tokens as I32 tokens and
 * next-token targets (or of len+1 tokens padded up to T, for a variable sequence length, len
 * given or drawn from the step on the device together with its shape bucket).
 * Window starts are a counter-based hash of (seed, step, row), the same on the CPU and on
 * CUDA, so a step's batch depends on nothing but its number, and a captured step can gather
 * its own batch by reading the step from device memory (sg_text_batch_device). text.c holds
 * the host side (formats, checks, loading) and the CPU gather, text_cuda.cu the kernel. */
#ifndef SG_NN_TEXT_H
#define SG_NN_TEXT_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sg_text sg_text;

/* Reads the file as bytes and splits its n bytes: the first n - floor(val_fraction * n) are
 * the train split, the rest the validation split (empty when val_fraction is 0). Both are
 * uploaded as they are (1 byte of device memory a byte of text). val_fraction in [0, 1).
 * Before reading or allocating anything: SG_ERR_INVALID (naming the file and what it is) for
 * anything but a regular file (a FIFO, /dev/zero, a directory: opened without blocking), for
 * an empty file or a split asked for that would be empty; SG_ERR_OOM, with both figures, when
 * the tokens exceed the context's free memory (sg_ctx_mem_info). The file is read in chunks of
 * SG_TEXT_CHUNK_BYTES straight onto the device: host memory O(chunk), not O(file). SG_ERR_IO
 * (naming the file, and the offset) when it cannot be opened or read, or ends before its size.
 * Not during capture (it copies from the host). */
sg_status sg_text_open(sg_ctx *ctx, const char *path, double val_fraction, sg_text **out);
/* The same, with each split asked for at least window bytes (T + 1 for windows of T tokens;
 * window >= 1; sg_text_open is window 1), also checked from the size before reading. */
sg_status sg_text_open_window(sg_ctx *ctx, const char *path, double val_fraction, int64_t window,
                              sg_text **out);

/* The llm.c shard header: 256 little-endian int32, [0] the magic, [1] the version (1: uint16
 * tokens, 2: uint32 tokens), [2] the number of tokens that follow it. */
#define SG_TEXT_LLMC_MAGIC 20240520
#define SG_TEXT_LLMC_HEADER_BYTES 1024

typedef struct sg_text_options {
    /* The share of path's tokens held out as the validation split, [0, 1); 0 with val_path. */
    double val_fraction;
    /* Tokens each split must hold: T + 1 for windows of T tokens (>= 1; 0 means 1). */
    int64_t window;
    /* 0: path is read as bytes (vocabulary 256). N > 0: path (and val_path) are token files,
     * their format detected: an llm.c shard when the first int32 is SG_TEXT_LLMC_MAGIC, raw
     * little-endian uint16 tokens otherwise; every token must be below N. */
    int64_t vocab;
    /* A separate validation file, read as path is (NULL: hold out val_fraction of path). */
    const char *val_path;
} sg_text_options;

/* sg_text_open with options (NULL: val_fraction 0, window 1, bytes). Everything is checked
 * before anything is allocated on the device, each error naming the file and the byte offset:
 * SG_ERR_INVALID for a truncated token file (an odd byte count of raw uint16, a file shorter
 * than the llm.c header it begins with, or shorter or longer than the tokens its header
 * counts), an llm.c version other than 1 or 2, a token >= vocab (its index, offset and value:
 * a first pass reads every token before the upload), a split shorter than window tokens;
 * SG_ERR_OOM when the tokens exceed free memory; the errors of sg_text_open otherwise. */
sg_status sg_text_open_ex(sg_ctx *ctx, const char *path, const sg_text_options *o, sg_text **out);
/* Bytes read (and uploaded) at a time; host staging is two chunks. */
#define SG_TEXT_CHUNK_BYTES ((int64_t)4 << 20)
void sg_text_close(sg_text *t);

/* The first of these that is readable, or NULL: /usr/share/common-licenses/GPL-3, GPL-2,
 * Apache-2.0, /usr/share/dict/words. Plain English text found on most Linux machines. */
const char *sg_text_default_path(void);

/* Data parallelism: row b of every batch gathered from now on is the window of row row0 + b
 * (a model training on rows row0.. of each batch; 0 by default). */
void sg_text_set_row0(sg_text *t, int64_t row0);

/* Tokens (bytes, for a byte file) in split 0 (train) or 1 (validation); -1 for another split
 * number. */
int64_t sg_text_size(const sg_text *t, int split);
/* The train file's path; sg_text_split_path: the file split 0 or 1 comes from (NULL for
 * another split number). */
const char *sg_text_path(const sg_text *t);
const char *sg_text_split_path(const sg_text *t, int split);
/* 256 for bytes, else the vocab option: every token is below it. */
int64_t sg_text_vocab(const sg_text *t);
/* Bytes a token of split 0 or 1 takes on the device (1 bytes, 2 uint16, 4 uint32; 0 for
 * another split number), and its format: "bytes", "raw uint16", "llm.c v1 (uint16)" or
 * "llm.c v2 (uint32)" (NULL for another split number). */
int sg_text_token_bytes(const sg_text *t, int split);
const char *sg_text_format(const sg_text *t, int split);
/* Device bytes the two splits take (whole allocator blocks, as sg_alloc_stats counts them). */
size_t sg_text_bytes(const sg_text *t);

/* Batch of step `step`: row b of tokens (B, T) I32 holds tokens [s, s + T) of the split, row b
 * of targets the tokens [s + 1, s + T + 1) (targets: I32, (B, T) or (B*T)), where
 * s = sg_text_window_start(seed, step, b, size - T). SG_ERR_INVALID (naming the file and the
 * split) when the split is shorter than T + 1 tokens. Device work (a kernel on CUDA, a thunk
 * queued through sg_cpu_run on the CPU): no host sync, no allocation, capturable. A captured
 * sg_text_batch_host replays its step as recorded. */
sg_status sg_text_batch_host(sg_text *t, int split, uint64_t seed, int64_t step, sg_tensor *tokens,
                             sg_tensor *targets);
/* The same, with the step read when the work runs from step_tensor: one I32 element in device
 * memory (read as a signed 32-bit step). Each replay of a captured step gathers the batch of
 * the step the tensor holds then: sg_text_batch_host with that step gives the same batch. */
sg_status sg_text_batch_device(sg_text *t, int split, uint64_t seed, const sg_tensor *step_tensor,
                               sg_tensor *tokens, sg_tensor *targets);
/* Windows of len <= T real tokens, padded to the T of tokens (B, T) (variable sequence length):
 * row b holds tokens [s, s + len) then T - len tokens 0, its targets [s + 1, s + len + 1)
 * then T - len targets -1, which the fused cross-entropy masks out, with
 * s = sg_text_window_start(seed, step, b, size - len): the windows of a batch gathered at T = len,
 * so a padded step sees the same tokens as an unpadded one of length len. len = T is
 * sg_text_batch_host. SG_ERR_SHAPE when len is not in 1..T. */
sg_status sg_text_batch_padded(sg_text *t, int split, uint64_t seed, int64_t step, int64_t len,
                               sg_tensor *tokens, sg_tensor *targets);

/* At most this many sequence buckets for sg_text_batch_vary. */
#define SG_TEXT_MAX_BUCKETS 32
/* A bucket list held by value (in a CPU thunk's arguments, in a kernel's parameters), so that
 * a captured gather never reads the caller's array, which need not outlive the call. */
typedef struct sg_text_buckets {
    int n;                                  /* 1..SG_TEXT_MAX_BUCKETS */
    int64_t size[SG_TEXT_MAX_BUCKETS];      /* increasing, from 1; size[n - 1] the largest */
} sg_text_buckets;

/* Checks a bucket list and copies it into *out: 1..SG_TEXT_MAX_BUCKETS sizes increasing from
 * 1, the largest at most cap (cap_what names it in the message). Errors name fn. Shared by the
 * gathers that draw a shape on the device (sg_text_batch_vary, sg_dataset_pad_vary). */
sg_status sg_text_buckets_make(sg_ctx *ctx, const char *fn, const int64_t *buckets, int n, int64_t cap,
                               const char *cap_what, sg_text_buckets *out);
/* SG_ERR_DTYPE / SG_ERR_SHAPE, naming `what`, unless v is one I32 element (a device step or
 * bucket number). */
sg_status sg_check_i32_value(sg_ctx *ctx, const char *fn, const char *what, const sg_tensor *v);

/* Batch of the step read from step_tensor (one I32, read when the work runs) with its length
 * drawn on the device: len = sg_text_vary_len(step, buckets[n_buckets - 1]), k = the first
 * bucket with buckets[k] >= len, Tb = buckets[k]. The first B*Tb elements of tokens and
 * targets receive what sg_text_batch_padded(seed, step, len) writes into tokens of shape
 * (B, Tb) (row b at b*Tb: len real tokens then padding 0 / target -1); the elements after them
 * are left as they were; *bucket_out (one I32) = k. tokens is (B, T) with T >= the largest
 * bucket (its capacity). buckets: 1..32 increasing values from 1 to T. Device work, no host
 * sync, capturable (one kernel on CUDA; a thunk via sg_cpu_run on the CPU): a captured step
 * gathers its batch and learns its shape bucket without the host. The bucket list is copied,
 * so it need not outlive the call. Before anything is written: the errors of
 * sg_text_batch_host; SG_ERR_NULL for a NULL bucket list; SG_ERR_INVALID for an empty list,
 * more than SG_TEXT_MAX_BUCKETS, a size below 1 or one not above the size before it;
 * SG_ERR_SHAPE for a largest bucket above the T of tokens, or a step_tensor or bucket_out
 * that is not one element; SG_ERR_DTYPE for either not I32. */
sg_status sg_text_batch_vary(sg_text *t, int split, uint64_t seed, const sg_tensor *step_tensor,
                             const int64_t *buckets, int n_buckets, sg_tensor *tokens,
                             sg_tensor *targets, sg_tensor *bucket_out);

/* ---- the window hash, shared by the CPU gather and the CUDA kernel (one definition) ---- */

#ifdef __CUDACC__
#define SG_TEXT_HD __host__ __device__
#else
#define SG_TEXT_HD
#endif

/* splitmix64's finaliser: a bijection of 64-bit words that mixes every input bit. */
static inline SG_TEXT_HD uint64_t sg_text_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The start of row b's window at step `step`, uniform over 0..n_starts-1 (n_starts >= 1; the
 * modulo's bias is below n_starts / 2^64). */
static inline SG_TEXT_HD int64_t sg_text_window_start(uint64_t seed, int64_t step, int64_t b,
                                                      int64_t n_starts)
{
    uint64_t h = sg_text_mix(seed + 0x9e3779b97f4a7c15ull);
    h = sg_text_mix(h ^ (uint64_t)step);
    h = sg_text_mix(h + 0x9e3779b97f4a7c15ull * ((uint64_t)b + 1));
    return (int64_t)(h % (uint64_t)n_starts);
}

/* The length (or row count) of step `step` of a varying run, uniform over 1..max (0 for
 * max < 1; the modulo's bias is below max / 2^64): splitmix64 of the step. sg_vary_len on the
 * host, and sg_text_batch_vary on the device, so the CLI and a captured step draw alike. */
static inline SG_TEXT_HD int64_t sg_text_vary_len(int64_t step, int64_t max)
{
    if (max < 1) return 0;
    uint64_t z = sg_text_mix((uint64_t)step * 0x9e3779b97f4a7c15ull + 0x243f6a8885a308d3ull);
    return 1 + (int64_t)(z % (uint64_t)max);
}

/* The first bucket of bk that holds len (len in 1..the largest: found). */
static inline SG_TEXT_HD int sg_text_bucket_of(const sg_text_buckets *bk, int64_t len)
{
    int k = 0;
    while (k < bk->n - 1 && bk->size[k] < len) k++;
    return k;
}

#ifdef SG_HAVE_CUDA
/* text_cuda.cu: tokens/targets (B*T) from data (n_starts + len tokens of `width` bytes: 1, 2
 * or 4, unsigned), len <= T real tokens a row and padding (token 0, target -1) after them; the
 * step is *step_dev when step_dev is not NULL, else `step`; row b holds the window of row
 * row0 + b. */
sg_status sg_text_batch_cuda(sg_ctx *ctx, const void *data, int width, int64_t n_starts,
                             uint64_t seed, int64_t step, const int32_t *step_dev, int32_t *tokens,
                             int32_t *targets, int64_t B, int64_t T, int64_t len, int64_t row0);
/* text_cuda.cu: sg_text_batch_vary's kernel. data holds n tokens of `width` bytes; the step
 * is *step_dev, len, the bucket k and Tb are drawn from it in the kernel, tokens/targets
 * (B*Tb) written from their start, *bucket_out = k; row b holds the window of row row0 + b. */
sg_status sg_text_batch_vary_cuda(sg_ctx *ctx, const void *data, int width, int64_t n,
                                  uint64_t seed, const int32_t *step_dev, sg_text_buckets buckets,
                                  int32_t *tokens, int32_t *targets, int32_t *bucket_out,
                                  int64_t B, int64_t row0);
#endif

#ifdef __cplusplus
}
#endif
#endif /* SG_NN_TEXT_H */
