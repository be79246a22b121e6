/* fuzz_text.c: the data-file readers on arbitrary bytes. Input layout:
 *   byte 0    the reader, byte % (number of readers): 0 = byte-level text (src/nn/text.c),
 *             1 = token files (the same reader with a vocabulary: llm.c shards or raw uint16)
 *   byte 1    the reader's options (text: val_fraction from bits 0-1, T = 1 + bits 2-5, bit 6
 *             sg_text_open_window with a window of T + 1 instead of sg_text_open; tokens: the
 *             vocabulary from bits 0-2, T = 1 + bits 3-6, bit 7 a separate validation file
 *             (the same bytes) instead of 10% held out), 2 = a digits file for the image
 *             models (src/models/digits.c)
 *   byte 1    (digits: classes 10 + bits 0-1, images R = 8 + bits 2-4)
 *   the rest  the file's contents, written to a file and opened by path
 * Seeds start with byte 0 so that they stay text inputs when a reader is added: a new reader
 * (token shards, .npy) is one more function and one more row of `readers`, with seeds in
 * fuzz/corpus/text/ whose first byte is its index. Invariants: no crash, leak or UB; a batch
 * holds tokens below the vocabulary (256 for bytes) and each row's targets are its tokens
 * shifted by one. */
#include "fuzz.h"

#include "models/model.h"
#include "nn/dataset.h"
#include "nn/text.h"

#include <math.h>

#define FZ_B 2
#define FZ_TMAX 16

/* A gathered batch, tokens (B, T) and targets (B*T), with len real tokens a row, each below
 * vocab. */
static void text_check_batch(sg_ctx *ctx, const sg_tensor *tok, const sg_tensor *tgt,
                             int64_t T, int64_t len, int64_t vocab)
{
    int32_t a[FZ_B * FZ_TMAX], b[FZ_B * FZ_TMAX];
    size_t nb = (size_t)(FZ_B * T) * sizeof(int32_t);
    FZ_OK(ctx, sg_tensor_copy_to_host(tok, a, nb));
    FZ_OK(ctx, sg_tensor_copy_to_host(tgt, b, nb));
    for (int64_t r = 0; r < FZ_B; r++)
        for (int64_t i = 0; i < T; i++) {
            int32_t x = a[r * T + i], y = b[r * T + i];
            if (i < len) {
                FZ_CHECK(x >= 0 && x < vocab && y >= 0 && y < vocab, "row %lld pos %lld: %d, %d "
                         "(vocabulary %lld)", (long long)r, (long long)i, x, y, (long long)vocab);
                if (i + 1 < len)
                    FZ_CHECK(y == a[r * T + i + 1], "row %lld pos %lld: target %d, next token %d",
                             (long long)r, (long long)i, y, a[r * T + i + 1]);
            } else {
                FZ_CHECK(x == 0 && y == -1, "row %lld pos %lld: padding %d, %d", (long long)r,
                         (long long)i, x, y);
            }
        }
}

static void read_text(const uint8_t *data, size_t size, uint8_t opt)
{
    static const double val_fractions[4] = {0, 0.1, 0.5, 0.9};
    sg_ctx *ctx = fz_ctx();
    const char *path = fz_write_file("in.txt", data, size);
    sg_text *t = NULL;
    double vf = val_fractions[opt & 3];
    int64_t T = 1 + (opt >> 2) % FZ_TMAX, shape[2] = {FZ_B, T}, flat = FZ_B * T;
    /* bit 6: open asking each split for a window of T + 1 bytes, as training does */
    int windowed = (opt >> 6) & 1;
    sg_status st = windowed ? sg_text_open_window(ctx, path, vf, T + 1, &t)
                            : sg_text_open(ctx, path, vf, &t);
    fz_say(ctx, windowed ? "sg_text_open_window" : "sg_text_open", st);
    if (st != SG_OK) return;
    FZ_CHECK(sg_text_size(t, 0) + sg_text_size(t, 1) == (int64_t)size,
             "splits of %lld + %lld bytes from a %zu-byte file", (long long)sg_text_size(t, 0),
             (long long)sg_text_size(t, 1), size);
    for (int split = 0; windowed && split < (vf > 0 ? 2 : 1); split++)
        FZ_CHECK(sg_text_size(t, split) >= T + 1, "open_window(%lld) gave split %d %lld bytes",
                 (long long)(T + 1), split, (long long)sg_text_size(t, split));

    sg_tensor *tok, *tgt;
    FZ_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_I32, 2, shape, "tokens", &tok));
    FZ_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_I32, 1, &flat, "targets", &tgt));
    for (int split = 0; split < 2; split++) {
        int64_t steps[2] = {(int64_t)size, INT64_MAX};
        for (int s = 0; s < 2; s++) {
            st = sg_text_batch_host(t, split, 1234, steps[s], tok, tgt);
            fz_say(ctx, "sg_text_batch_host", st);
            if (st == SG_OK) {
                FZ_OK(ctx, sg_ctx_sync(ctx));
                text_check_batch(ctx, tok, tgt, T, T, 256);
            }
            int64_t len = 1 + (int64_t)(size % (size_t)T);
            st = sg_text_batch_padded(t, split, 99, steps[s], len, tok, tgt);
            fz_say(ctx, "sg_text_batch_padded", st);
            if (st == SG_OK) {
                FZ_OK(ctx, sg_ctx_sync(ctx));
                text_check_batch(ctx, tok, tgt, T, len, 256);
            }
        }
    }
    sg_tensor_destroy(tok);
    sg_tensor_destroy(tgt);
    sg_text_close(t);
}

/* A token file: an llm.c shard or raw uint16, with a vocabulary that some tokens may exceed;
 * opened as the GPT opens its data (window T + 1), then batches of both splits. */
static void read_tokens(const uint8_t *data, size_t size, uint8_t opt)
{
    static const int64_t vocabs[8] = {1, 2, 255, 256, 300, 50304, 65535, 65536};
    sg_ctx *ctx = fz_ctx();
    const char *path = fz_write_file("in.bin", data, size);
    int64_t vocab = vocabs[opt & 7], T = 1 + (opt >> 3) % FZ_TMAX, shape[2] = {FZ_B, T}, flat = FZ_B * T;
    sg_text_options o = {.val_fraction = 0.1, .window = T + 1, .vocab = vocab};
    if (opt & 0x80) o.val_fraction = 0, o.val_path = path;
    sg_text *t = NULL;
    sg_status st = sg_text_open_ex(ctx, path, &o, &t);
    fz_say(ctx, "sg_text_open_ex", st);
    if (st != SG_OK) return;
    FZ_CHECK(sg_text_vocab(t) == vocab, "vocabulary %lld, asked %lld", (long long)sg_text_vocab(t),
             (long long)vocab);
    /* The tokens fit the file: two bytes each at most (uint16) or four (an llm.c v2 shard). */
    int64_t n = sg_text_size(t, 0) + (o.val_path ? 0 : sg_text_size(t, 1));
    FZ_CHECK(n >= 1 && (n * 2 == (int64_t)size || n * 2 + SG_TEXT_LLMC_HEADER_BYTES == (int64_t)size ||
                        n * 4 + SG_TEXT_LLMC_HEADER_BYTES == (int64_t)size),
             "%lld tokens from a %zu-byte file", (long long)n, size);
    sg_tensor *tok, *tgt;
    FZ_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_I32, 2, shape, "tokens", &tok));
    FZ_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_I32, 1, &flat, "targets", &tgt));
    for (int split = 0; split < 2; split++) {
        st = sg_text_batch_host(t, split, 77, (int64_t)size, tok, tgt);
        fz_say(ctx, "sg_text_batch_host", st);
        FZ_CHECK(st == SG_OK, "a split opened for windows of %lld tokens gave no batch", (long long)(T + 1));
        if (st == SG_OK) {
            FZ_OK(ctx, sg_ctx_sync(ctx));
            text_check_batch(ctx, tok, tgt, T, T, vocab);
        }
    }
    sg_tensor_destroy(tok);
    sg_tensor_destroy(tgt);
    sg_text_close(t);
}

/* A digits file for the image models (src/models/digits.c): classes 10 + bits 0-1 of opt,
 * images scaled to R = 8 + bits 2-4. Read, the training set and the validation split hold
 * every line (a fifth held out), each value finite, each label below the classes. */
static void read_digits(const uint8_t *data, size_t size, uint8_t opt)
{
    sg_ctx *ctx = fz_ctx();
    const char *path = fz_write_file("in.csv", data, size);
    int64_t classes = 10 + (opt & 3), R = 8 + (opt >> 2) % 8;
    sg_dataset *d = NULL;
    sg_status st = sg_digits_data(ctx, path, R, classes, 7, &d);
    fz_say(ctx, "sg_digits_data", st);
    if (st != SG_OK) {
        FZ_CHECK(d == NULL, "a refused digits file left a data set");
        return;
    }
    int64_t n = d->n + d->val->n;
    FZ_CHECK(d->val->n == n / 5 && n == sg_digits_count(path), "%lld training and %lld validation images "
             "from %lld lines", (long long)d->n, (long long)d->val->n, (long long)sg_digits_count(path));
    for (const sg_dataset *s = d; s; s = s == d ? d->val : NULL) {
        float *x = malloc((size_t)s->x->numel * sizeof *x);
        int32_t *y = malloc((size_t)s->n * sizeof *y);
        FZ_OK(ctx, sg_tensor_copy_to_host(s->x, x, (size_t)s->x->numel * sizeof *x));
        FZ_OK(ctx, sg_tensor_copy_to_host(s->y, y, (size_t)s->n * sizeof *y));
        for (int64_t i = 0; i < s->x->numel; i++) FZ_CHECK(isfinite(x[i]), "image value %lld: %g", (long long)i, x[i]);
        for (int64_t i = 0; i < s->n; i++)
            FZ_CHECK(y[i] >= 0 && y[i] < classes, "label %lld: %d (classes %lld)", (long long)i, y[i],
                     (long long)classes);
        free(x), free(y);
    }
    sg_dataset_destroy(d);
}

/* One row per reader; byte 0 of an input picks it. */
static const struct {
    const char *name;
    void (*read)(const uint8_t *data, size_t size, uint8_t opt);
} readers[] = {
    {"text", read_text},
    {"tokens", read_tokens},
    {"digits", read_digits},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    size_t n = sizeof readers / sizeof readers[0];
    readers[data[0] % n].read(data + 2, size - 2, data[1]);
    return 0;
}
