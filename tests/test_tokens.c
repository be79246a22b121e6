/* test_tokens.c: token files for the GPT (sg_text_open_ex with a vocab, sg_model_options.vocab).
 * Files in each format (nanoGPT's raw uint16 .bin; llm.c shards, header version 1 with uint16
 * tokens and version 2 with uint32) are written to a temporary directory with fresh random
 * tokens; every window gathered is the generated tokens at the window's start, a whole split
 * read back in one window is the split, every format of the same tokens gives the same batches,
 * and a separate validation file is its own split. Every bad file is refused before anything is
 * allocated on the device, the message naming the file and the byte offset. A GPT of a
 * vocabulary of 300 trains a few steps on a shard. `cpu` runs on the CPU backend; `gpu` runs
 * the same checks on CUDA, compares the device gather of every storage width with the CPU's,
 * and the GPT's losses with the CPU's. */
#define _POSIX_C_SOURCE 200809L

#include "testutil.h"

#include "nn/text.h"

#include <sys/stat.h>
#include <unistd.h>

enum { FMT_RAW16, FMT_LLMC1, FMT_LLMC2, FMT_COUNT };
static const char *const fmt_name[FMT_COUNT] = {"raw uint16", "llm.c v1 (uint16)", "llm.c v2 (uint32)"};
static const int fmt_width[FMT_COUNT] = {2, 2, 4};
static const int fmt_header[FMT_COUNT] = {0, 1024, 1024};

static char dir[64];
static char made[64][128];  /* every file written, removed at the end */
static int n_made;

/* ---- files ---- */

/* A new path in the temporary directory. */
static const char *path_new(const char *stem)
{
    if (n_made == (int)(sizeof made / sizeof made[0])) {
        fprintf(stderr, "FAIL: too many test files\n");
        exit(1);
    }
    snprintf(made[n_made], sizeof made[0], "%s/%s_%d.bin", dir, stem, n_made);
    return made[n_made++];
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* The file's bytes for n tokens in format fmt (little-endian; llm.c: the 256 x int32 header,
 * magic, version, count, zeros); its length into *len (room for 8 more bytes). */
static unsigned char *encode(int fmt, const uint32_t *tok, int64_t n, size_t *len)
{
    size_t h = (size_t)fmt_header[fmt], w = (size_t)fmt_width[fmt];
    *len = h + (size_t)n * w;
    unsigned char *b = calloc(*len + 8, 1);
    if (h) {
        put32(b, 20240520);
        put32(b + 4, fmt == FMT_LLMC1 ? 1 : 2);
        put32(b + 8, (uint32_t)n);
    }
    for (int64_t i = 0; i < n; i++) {
        unsigned char *p = b + h + (size_t)i * w;
        p[0] = (unsigned char)tok[i], p[1] = (unsigned char)(tok[i] >> 8);
        if (w == 4) p[2] = (unsigned char)(tok[i] >> 16), p[3] = (unsigned char)(tok[i] >> 24);
    }
    return b;
}

/* n fresh random tokens below vocab. */
static uint32_t *tokens_new(int64_t n, int64_t vocab)
{
    uint32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = (uint32_t)(tu_next() % (uint64_t)vocab);
    return t;
}

/* A file of the tokens in format fmt; its path. */
static const char *tokens_file(int fmt, const uint32_t *tok, int64_t n)
{
    size_t len;
    unsigned char *b = encode(fmt, tok, n, &len);
    const char *p = path_new(fmt == FMT_RAW16 ? "raw" : fmt == FMT_LLMC1 ? "llmc1" : "llmc2");
    tu_file_write(p, b, len);
    free(b);
    return p;
}

/* A vocabulary for format fmt: uint16 tokens below 65536 (and room above it for a token that
 * is out of range), uint32 tokens up to 2^24 (random data larger than uint16 holds). */
static int64_t vocab_for(int fmt)
{
    return fmt_width[fmt] == 2 ? tu_randint(2, 60000) : tu_randint(70000, 1 << 24);
}

static int32_t *get_i32(const sg_tensor *t)
{
    int32_t *v = malloc(sg_tensor_nbytes(t));
    TU_OK(t->ctx, sg_tensor_copy_to_host(t, v, sg_tensor_nbytes(t)));
    return v;
}

static sg_status open_tokens(sg_ctx *ctx, const char *path, const char *val_path, double vf,
                             int64_t window, int64_t vocab, sg_text **out)
{
    sg_text_options o = {.val_fraction = vf, .window = window, .vocab = vocab, .val_path = val_path};
    return sg_text_open_ex(ctx, path, &o, out);
}

/* ---- windows against the generated tokens ---- */

/* Batches of split `split` (n tokens, ref) at random (B, T) and steps: row b of the tokens is
 * ref[s, s + T), of the targets ref[s + 1, s + T + 1), s the window's hashed start; the same
 * batch with the step read from device memory, and padded to a longer T. */
static void check_windows(sg_ctx *ctx, sg_text *txt, int split, const uint32_t *ref, int64_t n,
                          const char *what)
{
    TU_CHECK(sg_text_size(txt, split) == n, "%s: split %d holds %lld tokens, expected %lld", what,
             split, (long long)sg_text_size(txt, split), (long long)n);
    if (sg_text_size(txt, split) != n) return;
    uint64_t seed = tu_next();
    sg_tensor *step_t = tu_tensor1(ctx, SG_DTYPE_I32, 1, "step");
    for (int k = 0; k < 4; k++) {
        int64_t B = tu_randint(1, 8), T = tu_randint(1, (int)(n - 1 < 64 ? n - 1 : 64));
        int64_t step = k == 3 ? -tu_randint(1, 1000) : tu_randint(0, 1 << 24);
        int64_t Tp = T + tu_randint(0, (int)(n - 1 - T < 8 ? n - 1 - T : 8)); /* padded (Tp + 1 <= n) */
        sg_tensor *tok = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens"),
                  *tgt = tu_tensor1(ctx, SG_DTYPE_I32, B * T, "targets"),
                  *tok2 = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens2"),
                  *tgt2 = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "targets2"),
                  *ptok = tu_tensor2(ctx, SG_DTYPE_I32, B, Tp, "padded_tokens"),
                  *ptgt = tu_tensor2(ctx, SG_DTYPE_I32, B, Tp, "padded_targets");
        tu_poison(tok), tu_poison(tgt), tu_poison(tok2), tu_poison(tgt2), tu_poison(ptok), tu_poison(ptgt);
        TU_OK(ctx, sg_text_batch_host(txt, split, seed, step, tok, tgt));
        int32_t s32 = (int32_t)step;
        TU_OK(ctx, sg_tensor_copy_from_host(step_t, &s32, sizeof s32));
        TU_OK(ctx, sg_text_batch_device(txt, split, seed, step_t, tok2, tgt2));
        TU_OK(ctx, sg_text_batch_padded(txt, split, seed, step, T, ptok, ptgt));
        int32_t *a = get_i32(tok), *b = get_i32(tgt), *a2 = get_i32(tok2), *b2 = get_i32(tgt2),
                *pa = get_i32(ptok), *pb = get_i32(ptgt);
        int64_t bad = 0, bad_dev = 0, bad_pad = 0, first = -1;
        for (int64_t r = 0; r < B; r++) {
            int64_t s = sg_text_window_start(seed, step, r, n - T);
            for (int64_t t = 0; t < T; t++) {
                int64_t i = r * T + t;
                bool ok = s + t + 1 < n && a[i] == (int32_t)ref[s + t] && b[i] == (int32_t)ref[s + t + 1];
                if (!ok && first < 0) first = i;
                bad += !ok;
                bad_dev += a2[i] != a[i] || b2[i] != b[i];
            }
            for (int64_t t = 0; t < Tp; t++) {
                int32_t wa = t < T ? a[r * T + t] : 0, wb = t < T ? b[r * T + t] : -1;
                bad_pad += pa[r * Tp + t] != wa || pb[r * Tp + t] != wb;
            }
        }
        TU_CHECK(bad == 0, "%s split %d step %lld (B %lld, T %lld): %lld positions differ from the "
                 "file's tokens, the first at %lld (got %d, %d)", what, split, (long long)step,
                 (long long)B, (long long)T, (long long)bad, (long long)first,
                 first >= 0 ? a[first] : 0, first >= 0 ? b[first] : 0);
        TU_CHECK(bad_dev == 0, "%s split %d step %lld: the device-step batch differs in %lld positions",
                 what, split, (long long)step, (long long)bad_dev);
        TU_CHECK(bad_pad == 0, "%s split %d step %lld: padded to %lld, %lld positions differ from the "
                 "windows then padding", what, split, (long long)step, (long long)Tp, (long long)bad_pad);
        free(a), free(b), free(a2), free(b2), free(pa), free(pb);
        sg_tensor_destroy(tok), sg_tensor_destroy(tgt), sg_tensor_destroy(tok2);
        sg_tensor_destroy(tgt2), sg_tensor_destroy(ptok), sg_tensor_destroy(ptgt);
    }
    sg_tensor_destroy(step_t);
}

/* One window of T = n - 1 is the whole split: every token in place, across chunks. */
static void check_whole(sg_ctx *ctx, sg_text *txt, int split, const uint32_t *ref, int64_t n,
                        const char *what)
{
    sg_tensor *tok = tu_tensor2(ctx, SG_DTYPE_I32, 1, n - 1, "tokens"),
              *tgt = tu_tensor2(ctx, SG_DTYPE_I32, 1, n - 1, "targets");
    TU_OK(ctx, sg_text_batch_host(txt, split, tu_next(), tu_randint(0, 1000), tok, tgt));
    int32_t *a = get_i32(tok), *b = get_i32(tgt);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        int32_t got = i < n - 1 ? a[i] : b[n - 2];
        if (got != (int32_t)ref[i] && !bad++) first = i;
    }
    TU_CHECK(bad == 0, "%s split %d (%lld tokens): %lld tokens differ from the file, the first at %lld",
             what, split, (long long)n, (long long)bad, (long long)first);
    free(a), free(b);
    sg_tensor_destroy(tok), sg_tensor_destroy(tgt);
}

/* Each format: a file held out in two splits (n large enough, now and then, to span several
 * staging chunks, and a split boundary that is not a whole I32), its windows and whole splits;
 * the same tokens in every format give the same batches. */
static void check_formats(sg_ctx *ctx)
{
    for (int round = 0; round < 2; round++) {
        /* round 1: more than two chunks of uint16 (SG_TEXT_CHUNK_BYTES / 2 tokens a chunk) */
        int64_t n = round ? tu_randint((int)SG_TEXT_CHUNK_BYTES, 3 * (int)SG_TEXT_CHUNK_BYTES / 2)
                          : tu_randint(2, 5000);
        int64_t vocab = tu_randint(2, 65535);
        double vf = round ? tu_uniform(0.05, 0.3) : 0;
        uint32_t *ref = tokens_new(n, vocab);
        int64_t n_val = (int64_t)floor(vf * (double)n), n_train = n - n_val;
        int32_t *first_batch = NULL;
        uint64_t seed = tu_next();
        int64_t step = tu_randint(0, 1 << 20), B = 4, T = n_train - 1 < 16 ? n_train - 1 : 16;
        for (int fmt = 0; fmt < FMT_COUNT; fmt++) {
            const char *p = tokens_file(fmt, ref, n);
            sg_text *txt;
            TU_OK(ctx, open_tokens(ctx, p, NULL, vf, 2, vocab, &txt));
            char what[160];
            snprintf(what, sizeof what, "%s (%s, %lld tokens, vocab %lld, val_fraction %.3f)", p,
                     fmt_name[fmt], (long long)n, (long long)vocab, vf);
            TU_CHECK(!strcmp(sg_text_format(txt, 0), fmt_name[fmt]) && sg_text_token_bytes(txt, 0) == fmt_width[fmt],
                     "%s: read as %s, %d bytes a token", what, sg_text_format(txt, 0), sg_text_token_bytes(txt, 0));
            TU_CHECK(sg_text_vocab(txt) == vocab, "%s: vocab %lld", what, (long long)sg_text_vocab(txt));
            check_windows(ctx, txt, 0, ref, n_train, what);
            check_whole(ctx, txt, 0, ref, n_train, what);
            if (n_val) {
                check_windows(ctx, txt, 1, ref + n_train, n_val, what);
                check_whole(ctx, txt, 1, ref + n_train, n_val, what);
            }
            TU_CHECK(sg_text_size(txt, 1) == n_val, "%s: validation split of %lld tokens, expected %lld",
                     what, (long long)sg_text_size(txt, 1), (long long)n_val);
            /* The same tokens, another format: the same batch. */
            sg_tensor *tok = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens"), *tgt = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "targets");
            TU_OK(ctx, sg_text_batch_host(txt, 0, seed, step, tok, tgt));
            int32_t *a = get_i32(tok);
            if (first_batch)
                TU_CHECK(!memcmp(a, first_batch, (size_t)(B * T) * 4), "%s: another batch than %s gives",
                         what, fmt_name[0]);
            if (!first_batch) first_batch = a;
            else free(a);
            sg_tensor_destroy(tok), sg_tensor_destroy(tgt);
            /* Device memory: the tokens in their storage width, not widened to I32. */
            size_t want = (size_t)(n * fmt_width[fmt]);
            TU_CHECK(sg_text_bytes(txt) >= want && sg_text_bytes(txt) < want + want / 4 + 2048,
                     "%s: %zu device bytes for %zu bytes of tokens", what, sg_text_bytes(txt), want);
            sg_text_close(txt);
            remove(p);
        }
        free(first_batch);
        free(ref);
    }
}

/* A separate validation file is split 1, in its own format (train and validation files of
 * different formats), and in byte mode (vocab 0) a second text file is the validation bytes. */
static void check_val_file(sg_ctx *ctx)
{
    int ft = tu_randint(0, FMT_COUNT - 1), fv = tu_randint(0, FMT_COUNT - 1);
    /* uint32 tokens above 65535 only when neither file holds uint16 */
    int64_t vocab = fmt_width[ft] == 4 && fmt_width[fv] == 4 ? vocab_for(FMT_LLMC2) : vocab_for(FMT_RAW16);
    int64_t nt = tu_randint(100, 20000), nv = tu_randint(2, 3000);
    uint32_t *rt = tokens_new(nt, vocab), *rv = tokens_new(nv, vocab);
    const char *pt = tokens_file(ft, rt, nt), *pv = tokens_file(fv, rv, nv);
    sg_text *txt;
    TU_OK(ctx, open_tokens(ctx, pt, pv, 0, 2, vocab, &txt));
    char what[300];
    snprintf(what, sizeof what, "train %s (%s), validation %s (%s)", pt, fmt_name[ft], pv, fmt_name[fv]);
    TU_CHECK(!strcmp(sg_text_split_path(txt, 1), pv) && !strcmp(sg_text_format(txt, 1), fmt_name[fv]),
             "%s: split 1 is %s (%s)", what, sg_text_split_path(txt, 1), sg_text_format(txt, 1));
    check_windows(ctx, txt, 0, rt, nt, what);
    check_windows(ctx, txt, 1, rv, nv, what);
    check_whole(ctx, txt, 1, rv, nv, what);
    /* A window longer than the validation file names that file. */
    sg_tensor *tok = tu_tensor2(ctx, SG_DTYPE_I32, 1, nv, "tokens"), *tgt = tu_tensor2(ctx, SG_DTYPE_I32, 1, nv, "targets");
    TU_FAILS(ctx, sg_text_batch_host(txt, 1, 1, 0, tok, tgt), SG_ERR_INVALID, pv);
    sg_tensor_destroy(tok), sg_tensor_destroy(tgt);
    sg_text_close(txt);
    free(rt), free(rv);

    /* Bytes: vocab 0, two files. */
    int64_t bt = tu_randint(10, 5000), bv = tu_randint(2, 500);
    uint32_t *ra = tokens_new(bt, 256), *rb = tokens_new(bv, 256);
    unsigned char *ba = malloc((size_t)bt), *bb = malloc((size_t)bv);
    for (int64_t i = 0; i < bt; i++) ba[i] = (unsigned char)ra[i];
    for (int64_t i = 0; i < bv; i++) bb[i] = (unsigned char)rb[i];
    const char *qa = path_new("bytes"), *qb = path_new("bytes_val");
    tu_file_write(qa, ba, (size_t)bt), tu_file_write(qb, bb, (size_t)bv);
    TU_OK(ctx, open_tokens(ctx, qa, qb, 0, 1, 0, &txt));
    TU_CHECK(sg_text_vocab(txt) == 256 && sg_text_token_bytes(txt, 0) == 1 && !strcmp(sg_text_format(txt, 1), "bytes"),
             "bytes: vocab %lld, %d bytes a token, %s", (long long)sg_text_vocab(txt), sg_text_token_bytes(txt, 0),
             sg_text_format(txt, 1));
    check_windows(ctx, txt, 0, ra, bt, qa);
    check_windows(ctx, txt, 1, rb, bv, qb);
    sg_text_close(txt);
    free(ra), free(rb), free(ba), free(bb);
}

/* ---- bad files ---- */

/* open_tokens must fail with `want`, a message naming path (the file at fault) and holding
 * each needle, *out left NULL, and nothing allocated on the device (no allocation made, none
 * served from the cache). */
static void refuse(sg_ctx *ctx, const char *open_path, const char *val_path, double vf, int64_t window,
                   int64_t vocab, sg_status want, const char *path, const char *n1, const char *n2)
{
    sg_alloc_stats a0, a1;
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a0));
    sg_text *txt = (sg_text *)&txt;
    TU_FAILS(ctx, open_tokens(ctx, open_path, val_path, vf, window, vocab, &txt), want, n1);
    const char *msg = sg_ctx_last_error(ctx);
    TU_CHECK(strstr(msg, path) != NULL, "the message does not name '%s': %s", path, msg);
    if (n2) TU_CHECK(strstr(msg, n2) != NULL, "the message lacks '%s': %s", n2, msg);
    TU_CHECK(txt == NULL, "'%s': out set on failure", path);
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a1));
    TU_CHECK(a1.device_allocs == a0.device_allocs && a1.cache_hits == a0.cache_hits &&
             a1.bytes_in_use == a0.bytes_in_use,
             "'%s' was refused after allocating on the device (%llu allocations, %llu from the cache)",
             path, (unsigned long long)(a1.device_allocs - a0.device_allocs),
             (unsigned long long)(a1.cache_hits - a0.cache_hits));
}

/* Writes b (len bytes) to a new file; its path. */
static const char *bad_file(const char *stem, const unsigned char *b, size_t len)
{
    const char *p = path_new(stem);
    tu_file_write(p, b, len);
    return p;
}

static void check_bad_files(sg_ctx *ctx)
{
    char n1[160], n2[160];
    int64_t n = tu_randint(8, 4000), vocab = vocab_for(FMT_RAW16);
    uint32_t *tok = tokens_new(n, vocab);
    size_t len;

    /* raw uint16 with an odd byte count: the last token is cut short */
    unsigned char *b = encode(FMT_RAW16, tok, n, &len);
    b[len] = (unsigned char)tu_next();
    const char *p = bad_file("odd", b, len + 1);
    snprintf(n1, sizeof n1, "holds %zu bytes, an odd number", len + 1);
    snprintf(n2, sizeof n2, "at byte %zu, is cut short", len);
    refuse(ctx, p, NULL, 0.1, 1, vocab, SG_ERR_INVALID, p, n1, n2);
    /* ... also as the validation file */
    const char *good = tokens_file(FMT_LLMC1, tok, n);
    refuse(ctx, good, p, 0, 1, vocab, SG_ERR_INVALID, p, n1, n2);
    free(b);

    /* llm.c's magic in a file shorter than the header */
    for (int fmt = FMT_LLMC1; fmt <= FMT_LLMC2; fmt++) {
        b = encode(fmt, tok, n, &len);
        size_t cut = (size_t)tu_randint(4, 1023);
        p = bad_file("short_header", b, cut);
        snprintf(n1, sizeof n1, "holds %zu bytes, fewer than its 1024-byte header", cut);
        snprintf(n2, sizeof n2, "cut short at byte %zu", cut);
        refuse(ctx, p, NULL, 0, 1, vocab, SG_ERR_INVALID, p, n1, n2);

        /* a version other than 1 or 2 */
        static const int32_t versions[] = {0, 3, -1, 20240520, 256};
        int32_t v = versions[tu_randint(0, 4)];
        put32(b + 4, (uint32_t)v);
        p = bad_file("version", b, len);
        snprintf(n1, sizeof n1, "llm.c header version %d (int32 at byte 4): expected 1 (uint16 tokens) "
                 "or 2 (uint32 tokens)", (int)v);
        refuse(ctx, p, NULL, 0, 1, vocab, SG_ERR_INVALID, p, n1, NULL);
        put32(b + 4, fmt == FMT_LLMC1 ? 1 : 2);

        /* a header counting more tokens than the file holds (a truncated file), and fewer
         * (trailing bytes); a negative count */
        int w = fmt_width[fmt];
        int64_t more = n + tu_randint(1, 1000);
        put32(b + 8, (uint32_t)more);
        p = bad_file("truncated", b, len);
        snprintf(n1, sizeof n1, "counts %lld tokens of %d bytes from byte 1024, which end at byte %lld, "
                 "but the file ends at byte %zu", (long long)more, w, (long long)(1024 + more * w), len);
        refuse(ctx, p, NULL, 0, 1, vocab, SG_ERR_INVALID, p, n1, "truncated");
        put32(b + 8, (uint32_t)n);
        size_t cut_tok = len - (size_t)tu_randint(1, w); /* mid-token or a whole token short */
        p = bad_file("cut_tokens", b, cut_tok);
        snprintf(n1, sizeof n1, "which end at byte %zu, but the file ends at byte %zu", len, cut_tok);
        refuse(ctx, p, NULL, 0, 1, vocab, SG_ERR_INVALID, p, n1, "truncated");
        int64_t fewer = tu_randint(0, (int)n - 1);
        put32(b + 8, (uint32_t)fewer);
        p = bad_file("trailing", b, len);
        snprintf(n1, sizeof n1, "counts %lld tokens of %d bytes from byte 1024, which end at byte %lld, "
                 "but the file goes on to its end at byte %zu", (long long)fewer, w,
                 (long long)(1024 + fewer * w), len);
        refuse(ctx, p, NULL, 0, 1, vocab, SG_ERR_INVALID, p, n1, "trailing bytes");
        int32_t neg = -tu_randint(1, 1 << 30);
        put32(b + 8, (uint32_t)neg);
        p = bad_file("negative", b, len);
        snprintf(n1, sizeof n1, "token count %d (int32 at byte 8) is negative", (int)neg);
        refuse(ctx, p, NULL, 0, 1, vocab, SG_ERR_INVALID, p, n1, NULL);
        /* a count of 0 */
        put32(b + 8, 0);
        p = bad_file("no_tokens", b, 1024);
        refuse(ctx, p, NULL, 0, 1, vocab, SG_ERR_INVALID, p, "holds no tokens", NULL);
        free(b);
    }

    /* a token >= vocab in every format, at a random index: named with its index, byte offset
     * and value; the token equal to the vocabulary (the boundary), and the largest the width
     * holds (uint32: above INT32_MAX, negative as an int32); in the validation file too */
    for (int fmt = 0; fmt < FMT_COUNT; fmt++)
        for (int largest = 0; largest < 2; largest++) {
            int64_t v = vocab_for(fmt), i = tu_randint(0, (int)n - 1);
            uint32_t *t2 = tokens_new(n, v);
            int64_t over = !largest ? v : fmt_width[fmt] == 2 ? 65535 : (int64_t)UINT32_MAX;
            t2[i] = (uint32_t)over;
            p = tokens_file(fmt, t2, n);
            snprintf(n1, sizeof n1, "token %lld (at byte %lld) is %lld, not below the vocabulary size %lld",
                     (long long)i, (long long)(fmt_header[fmt] + i * fmt_width[fmt]), (long long)over, (long long)v);
            refuse(ctx, p, NULL, 0.2, 1, v, SG_ERR_INVALID, p, n1, fmt_name[fmt]);
            uint32_t *t3 = tokens_new(n, v);
            const char *ok = tokens_file(fmt, t3, n);
            refuse(ctx, ok, p, 0, 1, v, SG_ERR_INVALID, p, n1, NULL);
            /* and a vocabulary of one more than that token takes the file (within I32) */
            if (over < INT32_MAX) {
                sg_text *txt;
                TU_OK(ctx, open_tokens(ctx, p, NULL, 0, 1, over + 1, &txt));
                check_windows(ctx, txt, 0, t2, n, p);
                sg_text_close(txt);
            }
            free(t2), free(t3);
        }

    /* a token >= vocab past the first staging chunk of a file of several */
    {
        int64_t big = tu_randint((int)SG_TEXT_CHUNK_BYTES / 2 + 1, (int)SG_TEXT_CHUNK_BYTES);
        int64_t v = vocab_for(FMT_RAW16), i = tu_randint((int)SG_TEXT_CHUNK_BYTES / 2, (int)big - 1);
        uint32_t *t2 = tokens_new(big, v);
        t2[i] = (uint32_t)tu_randint((int)v, 65535);
        p = tokens_file(FMT_LLMC1, t2, big);
        snprintf(n1, sizeof n1, "token %lld (at byte %lld) is %u, not below the vocabulary size %lld",
                 (long long)i, (long long)(1024 + 2 * i), t2[i], (long long)v);
        refuse(ctx, p, NULL, 0.1, 1, v, SG_ERR_INVALID, p, n1, NULL);
        remove(p);
        free(t2);
    }

    /* too short for one window of T + 1 tokens: a file held out, and a validation file */
    p = tokens_file(FMT_RAW16, tok, n);
    snprintf(n1, sizeof n1, "is too short for a train split of at least %lld tokens", (long long)(n + 1));
    refuse(ctx, p, NULL, 0, n + 1, vocab, SG_ERR_INVALID, p, n1, NULL);
    int64_t nv = tu_randint(1, (int)(n - 1 < 50 ? n - 1 : 50)); /* the train file holds the window */
    const char *short_val = tokens_file(FMT_LLMC1, tok, nv);
    snprintf(n1, sizeof n1, "(the validation split) holds %lld tokens, too few for one window of %lld tokens",
             (long long)nv, (long long)(nv + 1));
    refuse(ctx, p, short_val, 0, nv + 1, vocab, SG_ERR_INVALID, short_val, n1, NULL);

    /* an empty token file; a missing one; a FIFO; contradictory or out-of-range options */
    p = bad_file("empty", (const unsigned char *)"", 0);
    refuse(ctx, p, NULL, 0, 1, vocab, SG_ERR_INVALID, p, "is empty (0 bytes)", NULL);
    char missing[128];
    snprintf(missing, sizeof missing, "%s/no_such_val.bin", dir);
    refuse(ctx, good, missing, 0, 1, vocab, SG_ERR_IO, missing, "cannot open", NULL);
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    TU_CHECK(mkfifo(fifo, 0600) == 0, "mkfifo %s: %s", fifo, strerror(errno));
    refuse(ctx, fifo, NULL, 0, 1, vocab, SG_ERR_INVALID, fifo, "is a FIFO (named pipe), not a regular file", NULL);
    refuse(ctx, good, fifo, 0, 1, vocab, SG_ERR_INVALID, fifo, "is a FIFO (named pipe), not a regular file", NULL);
    remove(fifo);
    refuse(ctx, good, p, 0.1, 1, vocab, SG_ERR_INVALID, good, "hold out a share of one file, or give a second, not both", p);
    refuse(ctx, good, NULL, 0, 1, -1, SG_ERR_INVALID, good, "vocab -1, expected 0 (bytes) or 1 to", NULL);
    refuse(ctx, good, NULL, 0, 1, (int64_t)1 << 31, SG_ERR_INVALID, good, "vocab 2147483648", NULL);
    free(tok);
}

/* ---- a GPT on a token file ---- */

/* Index of the parameter tensor named name, or -1. */
static int param_index(sg_model *m, const char *name)
{
    for (int i = 0; i < sg_model_param_tensors(m); i++) {
        const char *nm;
        TU_OK(NULL, sg_model_param_info(m, i, &nm, NULL, NULL));
        if (!strcmp(nm, name)) return i;
    }
    return -1;
}

/* gpt-64-1-4-32 with vocab V: an llm.c train shard and a raw uint16 validation file; its
 * embedding and head have V rows, sg_model_estimate counts them, and a few AdamW steps give
 * finite losses starting near ln V. Returns the losses of `steps` steps (into loss). */
static void gpt_losses(sg_ctx *ctx, const char *train, const char *val, int64_t V, uint64_t seed, int steps,
                       double *loss)
{
    const char *name = "gpt-64-1-4-32";
    int64_t C = 64;
    sg_model_options mo = {.data_path = train, .val_data_path = val, .vocab = V};
    sg_model *m;
    TU_OK(ctx, sg_model_create_ex(ctx, name, seed, &mo, &m));
    sg_model_size z, z0;
    TU_OK(NULL, sg_model_estimate(name, &mo, &z));
    mo.vocab = 0;
    TU_OK(NULL, sg_model_estimate(name, &mo, &z0));
    TU_CHECK(z.params == sg_model_param_count(m), "estimate: %lld parameters, the model has %lld",
             (long long)z.params, (long long)sg_model_param_count(m));
    TU_CHECK(z.params - z0.params == 2 * (V - 256) * C,
             "vocab %lld adds %lld parameters to the byte model's, expected 2 (V - 256) C = %lld", (long long)V,
             (long long)(z.params - z0.params), (long long)(2 * (V - 256) * C));
    static const char *const vocab_rows[] = {"wte.weight", "head.weight"};
    for (int k = 0; k < 2; k++) {
        int i = param_index(m, vocab_rows[k]);
        int64_t numel = 0;
        if (i >= 0) TU_OK(ctx, sg_model_param_info(m, i, NULL, NULL, &numel));
        TU_CHECK(i >= 0 && numel == V * C, "%s: %lld elements, expected V x C = %lld", vocab_rows[k],
                 (long long)numel, (long long)(V * C));
    }
    sg_optim *o;
    sg_trainer *t;
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    TU_OK(ctx, sg_optim_set_lr(o, 1e-3f));
    TU_OK(ctx, sg_trainer_create(m, o, NULL, &t));
    for (int i = 0; i < steps; i++) {
        float l;
        TU_OK(ctx, sg_trainer_step(t, i));
        TU_OK(ctx, sg_model_loss_read(m, &l));
        loss[i] = l;
        TU_CHECK(isfinite(l), "step %d: loss %g", i, l);
    }
    /* At initialisation the head's logits are N(0, 0.02^2 C) (unit-variance LayerNorm output,
     * N(0, 0.02) weights): the expected loss is ln V + 0.02^2 C / 2 = ln V + 0.013; 0.1 leaves
     * room for the batch's sampling noise. */
    TU_CHECK(fabs(loss[0] - log((double)V)) < 0.1, "first loss %.4f, expected near ln %lld = %.4f", loss[0],
             (long long)V, log((double)V));
    float vl = 0;
    TU_OK(ctx, sg_trainer_eval(t, 1, 2, &vl));
    TU_CHECK(isfinite(vl) && fabs(vl - log((double)V)) < 0.5, "validation loss %g after %d steps (ln V = %.4f)",
             vl, steps, log((double)V));
    printf("gpt vocab %lld on %s: loss %.4f -> %.4f in %d steps, validation %.4f (ln V = %.4f)\n", (long long)V,
           sg_ctx_device_name(ctx), loss[0], loss[steps - 1], steps, vl, log((double)V));
    sg_trainer_destroy(t);
    sg_optim_destroy(o);
    sg_model_destroy(m);
}

/* A token >= V in the shard (rt, nt tokens below V, changed here): sg_model_create_ex refuses
 * it naming the file, before the model's parameters are allocated (the peak of a fresh
 * context stays below them); vocab without a data file, or on an mlp, is refused. */
static void check_gpt_refused(sg_backend be, uint32_t *rt, int64_t nt, int64_t V)
{
    sg_ctx *ctx = tu_ctx(be);
    int64_t i = tu_randint(0, (int)nt - 1);
    rt[i] = (uint32_t)tu_randint((int)V, 65535);
    const char *bad = tokens_file(FMT_LLMC1, rt, nt);
    sg_model_options mo = {.data_path = bad, .vocab = V};
    sg_model_size z;
    TU_OK(NULL, sg_model_estimate("gpt-64-1-4-32", &mo, &z));
    sg_alloc_stats a0, a1;
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a0));
    sg_model *m = NULL;
    char needle[160];
    snprintf(needle, sizeof needle, "token %lld (at byte %lld) is %u, not below the vocabulary size 300",
             (long long)i, (long long)(1024 + 2 * i), rt[i]);
    TU_FAILS(ctx, sg_model_create_ex(ctx, "gpt-64-1-4-32", 1, &mo, &m), SG_ERR_INVALID, needle);
    TU_CHECK(strstr(sg_ctx_last_error(ctx), bad) != NULL, "the message does not name '%s': %s", bad,
             sg_ctx_last_error(ctx));
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a1));
    TU_CHECK(m == NULL && a1.bytes_in_use == a0.bytes_in_use, "a refused model left %lld bytes in use",
             (long long)(a1.bytes_in_use - a0.bytes_in_use));
    TU_CHECK(a1.peak_bytes_in_use < a0.bytes_in_use + z.param_bytes / 2,
             "the refused model's parameters were allocated (peak %zu, in use before %zu, parameters %zu)",
             a1.peak_bytes_in_use, a0.bytes_in_use, z.param_bytes);
    /* vocab without a data file; vocab on an mlp */
    mo = (sg_model_options){.vocab = V};
    TU_FAILS(ctx, sg_model_create_ex(ctx, "gpt-64-1-4-32", 1, &mo, &m), SG_ERR_INVALID, "give data_path");
    mo = (sg_model_options){.vocab = V};
    TU_FAILS(ctx, sg_model_create_ex(ctx, "mlp-32-2-8", 1, &mo, &m), SG_ERR_INVALID, "are for gpt models");
    sg_ctx_destroy(ctx);
}

static void check_gpt(sg_ctx *ctx, sg_backend be)
{
    int64_t V = 300, nt = tu_randint(5000, 20000), nv = tu_randint(200, 2000);
    uint32_t *rt = tokens_new(nt, V), *rv = tokens_new(nv, V);
    const char *train = tokens_file(FMT_LLMC1, rt, nt), *val = tokens_file(FMT_RAW16, rv, nv);
    uint64_t seed = tu_next();
    double loss[5], ref[5];
    gpt_losses(ctx, train, val, V, seed, 5, loss);
    if (be == SG_BACKEND_CUDA) {
        /* The same steps on the CPU: same data, same initialisation; f32 sums in other orders
         * (the tolerance of test_gpt's GPU-vs-CPU losses). */
        sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
        gpt_losses(cpu, train, val, V, seed, 5, ref);
        tu_close("gpt vocab 300 loss per step, GPU vs CPU", loss, ref, 5, (tu_tol){1e-4, 1e-3});
        sg_ctx_destroy(cpu);
    }
    free(rv);
    check_gpt_refused(be, rt, nt, V);
    free(rt);
}

/* ---- CUDA gathers what the CPU gathers, for every storage width ---- */

static void check_cpu_vs_cuda(sg_ctx *gpu)
{
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    for (int fmt = -1; fmt < FMT_COUNT; fmt++) { /* -1: bytes */
        /* n >= 1000: the validation fifth holds a window of T + 1 <= 129 */
        int64_t n = tu_randint(1000, 100000), vocab = fmt < 0 ? 256 : vocab_for(fmt);
        uint32_t *ref = tokens_new(n, vocab);
        const char *p;
        if (fmt >= 0) {
            p = tokens_file(fmt, ref, n);
        } else {
            unsigned char *b = malloc((size_t)n);
            for (int64_t i = 0; i < n; i++) b[i] = (unsigned char)ref[i];
            p = bad_file("bytes", b, (size_t)n);
            free(b);
        }
        sg_text *tg, *tc;
        TU_OK(gpu, open_tokens(gpu, p, NULL, 0.2, 2, fmt < 0 ? 0 : vocab, &tg));
        TU_OK(cpu, open_tokens(cpu, p, NULL, 0.2, 2, fmt < 0 ? 0 : vocab, &tc));
        check_windows(gpu, tg, 0, ref, sg_text_size(tc, 0), p);
        int64_t B = tu_randint(1, 64), T = tu_randint(1, 128), len = tu_randint(1, (int)T);
        sg_tensor *gt = tu_tensor2(gpu, SG_DTYPE_I32, B, T, "tokens"), *gy = tu_tensor2(gpu, SG_DTYPE_I32, B, T, "targets");
        sg_tensor *ct = tu_tensor2(cpu, SG_DTYPE_I32, B, T, "tokens"), *cy = tu_tensor2(cpu, SG_DTYPE_I32, B, T, "targets");
        uint64_t seed = tu_next();
        for (int split = 0; split < 2; split++)
            for (int k = 0; k < 6; k++) {
                int64_t step = tu_randint(-1000, 1 << 30);
                bool padded = k % 2;
                tu_poison(gt), tu_poison(gy);
                if (padded) {
                    TU_OK(gpu, sg_text_batch_padded(tg, split, seed, step, len, gt, gy));
                    TU_OK(cpu, sg_text_batch_padded(tc, split, seed, step, len, ct, cy));
                } else {
                    TU_OK(gpu, sg_text_batch_host(tg, split, seed, step, gt, gy));
                    TU_OK(cpu, sg_text_batch_host(tc, split, seed, step, ct, cy));
                }
                int32_t *a = get_i32(gt), *b = get_i32(gy), *ra = get_i32(ct), *rb = get_i32(cy);
                TU_CHECK(!memcmp(a, ra, (size_t)(B * T) * 4) && !memcmp(b, rb, (size_t)(B * T) * 4),
                         "%s (%s) split %d step %lld%s: CUDA windows differ from the CPU's", p,
                         fmt < 0 ? "bytes" : fmt_name[fmt], split, (long long)step, padded ? " padded" : "");
                free(a), free(b), free(ra), free(rb);
            }
        sg_tensor_destroy(gt), sg_tensor_destroy(gy), sg_tensor_destroy(ct), sg_tensor_destroy(cy);
        sg_text_close(tg), sg_text_close(tc);
        free(ref);
    }
    sg_ctx_destroy(cpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_tokens");
    sg_backend be = strcmp(mode, "gpu") ? SG_BACKEND_CPU : SG_BACKEND_CUDA;
    sg_ctx *ctx = tu_ctx(be);
    snprintf(dir, sizeof dir, "/tmp/sg_tokens_XXXXXX");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "FAIL: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    check_formats(ctx);
    check_val_file(ctx);
    check_bad_files(ctx);
    check_gpt(ctx, be);
    if (be == SG_BACKEND_CUDA) check_cpu_vs_cuda(ctx);
    sg_ctx_destroy(ctx);
    for (int i = 0; i < n_made; i++) remove(made[i]);
    rmdir(dir);
    return tu_finish("test_tokens");
}
