/* test_text.c: the byte-level text data set. Windows are real substrings of the file, from the
 * right split; targets are the tokens shifted by one; batches are a pure function of (seed,
 * step), differ between steps and spread over the whole split; a captured step gathers the
 * batch of the step held in device memory; windows of len tokens padded to T are the windows
 * of an unpadded batch of length len, then padding; errors name the file. `cpu` runs on the CPU
 * backend; `gpu` runs the same checks on CUDA, and compares CUDA windows with the CPU's. */
#define _POSIX_C_SOURCE 200809L

#include "testutil.h"

#include "models/text.h"

#include <errno.h>
#include <unistd.h>

static char tmp_random[64], tmp_short[64], tmp_empty[64];

/* ---- files ---- */

/* A new temporary file of n bytes (random when bytes is NULL); its name into path. */
static void file_make(char *path, size_t cap, const unsigned char *bytes, size_t n)
{
    snprintf(path, cap, "/tmp/sg_text_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) {
        fprintf(stderr, "FAIL: mkstemp: %s\n", strerror(errno));
        exit(1);
    }
    unsigned char *b = malloc(n + 1);
    for (size_t i = 0; i < n; i++) b[i] = bytes ? bytes[i] : (unsigned char)tu_next();
    if (write(fd, b, n) != (ssize_t)n) exit(1);
    close(fd);
    free(b);
}

static int32_t *get_i32(const sg_tensor *t)
{
    int32_t *v = malloc(sg_tensor_nbytes(t));
    TU_OK(t->ctx, sg_tensor_copy_to_host(t, v, sg_tensor_nbytes(t)));
    return v;
}

static void set_step(sg_tensor *step_t, int32_t step)
{
    TU_OK(step_t->ctx, sg_tensor_copy_from_host(step_t, &step, sizeof step));
}

/* ---- one batch against the file ---- */

/* Row b of tok/tgt must be bytes [s, s+T) and [s+1, s+T+1) of the split (split points at its
 * first byte in the file, n bytes), s the hash's start; and (when search), found without the
 * hash, a substring of the split. Returns the number of bad rows. */
static int check_rows(const char *what, const int32_t *tok, const int32_t *tgt, int64_t B,
                      int64_t T, const unsigned char *split, int64_t n, uint64_t seed, int64_t step,
                      int64_t *starts, int search)
{
    int bad = 0;
    unsigned char *w = malloc((size_t)T + 1);
    for (int64_t b = 0; b < B; b++) {
        int in_range = 1, shifted = 1;
        for (int64_t t = 0; t < T; t++) {
            in_range &= tok[b * T + t] >= 0 && tok[b * T + t] <= 255 && tgt[b * T + t] >= 0 &&
                        tgt[b * T + t] <= 255;
            if (t + 1 < T) shifted &= tgt[b * T + t] == tok[b * T + t + 1];
            w[t] = (unsigned char)tok[b * T + t];
        }
        w[T] = (unsigned char)tgt[b * T + T - 1];
        TU_CHECK(in_range, "%s: row %lld holds a value outside 0..255", what, (long long)b);
        TU_CHECK(shifted, "%s: row %lld: targets are not the tokens shifted by one", what,
                 (long long)b);
        /* a real substring of the split (searched for, not computed) */
        int found = !search;
        for (int64_t s = 0; s + T + 1 <= n && !found; s++)
            found = !memcmp(split + s, w, (size_t)T + 1);
        TU_CHECK(found, "%s: row %lld is not a substring of the split", what, (long long)b);
        /* exactly the hash's window */
        int64_t s = sg_text_window_start(seed, step, b, n - T);
        if (starts) starts[b] = s;
        int exact = s >= 0 && s + T < n && !memcmp(split + s, w, (size_t)T + 1);
        TU_CHECK(exact, "%s: row %lld is not the window at %lld", what, (long long)b, (long long)s);
        bad += !(in_range && shifted && found && exact);
    }
    free(w);
    return bad;
}

/* Batches of a data set against the bytes of its file. */
static void check_windows(sg_ctx *ctx, const char *path, double val_fraction, int64_t T_max)
{
    size_t nb;
    unsigned char *bytes = tu_file_read(path, &nb);
    int64_t n = (int64_t)nb;
    sg_text *txt;
    TU_OK(ctx, sg_text_open(ctx, path, val_fraction, &txt));
    int64_t n_val = (int64_t)floor(val_fraction * (double)n);
    TU_CHECK(sg_text_size(txt, 0) == n - n_val && sg_text_size(txt, 1) == n_val,
             "splits of %lld and %lld bytes, expected %lld and %lld",
             (long long)sg_text_size(txt, 0), (long long)sg_text_size(txt, 1),
             (long long)(n - n_val), (long long)n_val);
    TU_CHECK(sg_text_size(txt, 2) == -1, "split 2 has a size");
    int64_t B = tu_randint(1, 8), T = tu_randint(1, (int)T_max);
    sg_tensor *tok = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens"),
              *tgt = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "targets");
    sg_tensor *tok2 = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens2"),
              *tgt2 = tu_tensor1(ctx, SG_DTYPE_I32, B * T, "targets2");
    sg_tensor *step_t = tu_tensor1(ctx, SG_DTYPE_I32, 1, "step");
    uint64_t seed = tu_next();
    char what[160];
    for (int split = 0; split < 2; split++) {
        if (sg_text_size(txt, split) < T + 1) continue;
        const unsigned char *base = bytes + (split ? n - n_val : 0);
        int32_t *prev = NULL;
        for (int k = 0; k < 6; k++) {
            int64_t step = k < 5 ? tu_randint(0, 1 << 20) : -tu_randint(1, 1000);
            tu_poison(tok), tu_poison(tgt);
            TU_OK(ctx, sg_text_batch_host(txt, split, seed, step, tok, tgt));
            int32_t *a = get_i32(tok), *b = get_i32(tgt);
            snprintf(what, sizeof what, "%s split %d step %lld (B %lld, T %lld)", path, split,
                     (long long)step, (long long)B, (long long)T);
            check_rows(what, a, b, B, T, base, sg_text_size(txt, split), seed, step, NULL, 1);
            /* Deterministic: the same (seed, step) again, and read from device memory. */
            tu_poison(tok2), tu_poison(tgt2);
            set_step(step_t, (int32_t)step);
            TU_OK(ctx, sg_text_batch_device(txt, split, seed, step_t, tok2, tgt2));
            int32_t *a2 = get_i32(tok2), *b2 = get_i32(tgt2);
            TU_CHECK(!memcmp(a, a2, (size_t)(B * T) * 4) && !memcmp(b, b2, (size_t)(B * T) * 4),
                     "%s: the device-step batch differs from the host-step one", what);
            /* Different steps give different batches (the windows are T+1 of many bytes). */
            if (prev && sg_text_size(txt, split) - T > 1000 && T >= 4)
                TU_CHECK(memcmp(prev, a, (size_t)(B * T) * 4),
                         "%s: the same batch as the step before", what);
            free(prev);
            prev = a;
            free(b), free(a2), free(b2);
        }
        free(prev);
    }
    sg_tensor_destroy(tok), sg_tensor_destroy(tgt), sg_tensor_destroy(tok2),
        sg_tensor_destroy(tgt2);
    sg_tensor_destroy(step_t);
    sg_text_close(txt);
    free(bytes);
}

/* Window starts spread over the whole split: over many steps each tenth of the range gets
 * its share (within +-50%), and the ends are reached. */
static void check_spread(sg_ctx *ctx, const char *path)
{
    sg_text *txt;
    TU_OK(ctx, sg_text_open(ctx, path, 0.0, &txt));
    int64_t B = 8, T = 16, steps = 250;
    size_t nb;
    unsigned char *bytes = tu_file_read(path, &nb);
    int64_t n = (int64_t)nb;
    TU_CHECK(sg_text_size(txt, 1) == 0, "val_fraction 0 gave a validation split");
    sg_tensor *tok = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens"),
              *tgt = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "targets");
    int64_t bins[10] = {0}, starts[8], lo = n, hi = -1;
    uint64_t seed = tu_next();
    for (int64_t s = 0; s < steps; s++) {
        TU_OK(ctx, sg_text_batch_host(txt, 0, seed, s, tok, tgt));
        int32_t *a = get_i32(tok), *b = get_i32(tgt);
        char what[64];
        snprintf(what, sizeof what, "spread step %lld", (long long)s);
        check_rows(what, a, b, B, T, bytes, n, seed, s, starts, 0); /* searched above */
        for (int r = 0; r < B; r++) {
            bins[starts[r] * 10 / (n - T)]++;
            if (starts[r] < lo) lo = starts[r];
            if (starts[r] > hi) hi = starts[r];
        }
        free(a), free(b);
    }
    double expect = (double)(B * steps) / 10;
    for (int i = 0; i < 10; i++)
        TU_CHECK(bins[i] > expect * 0.5 && bins[i] < expect * 1.5,
                 "tenth %d of the file got %lld of %lld windows", i, (long long)bins[i],
                 (long long)(B * steps));
    TU_CHECK(lo < (n - T) / 50 && hi > (n - T) * 49 / 50, "starts span only [%lld, %lld] of %lld",
             (long long)lo, (long long)hi, (long long)(n - T));
    sg_tensor_destroy(tok), sg_tensor_destroy(tgt);
    sg_text_close(txt);
    free(bytes);
}

/* ---- a captured step gathers its own batch ---- */

typedef struct step_user {
    sg_text *txt;
    uint64_t seed;
    sg_tensor *step_t, *tok, *tgt;
} step_user;

static sg_status gather_step(void *p)
{
    step_user *u = p;
    return sg_text_batch_device(u->txt, 0, u->seed, u->step_t, u->tok, u->tgt);
}

static void check_captured(sg_ctx *ctx, const char *path)
{
    sg_text *txt;
    TU_OK(ctx, sg_text_open(ctx, path, 0.1, &txt));
    int64_t B = 4, T = 32;
    step_user u = { txt, tu_next(), tu_tensor1(ctx, SG_DTYPE_I32, 1, "step"),
                    tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens"),
                    tu_tensor2(ctx, SG_DTYPE_I32, B, T, "targets") };
    sg_tensor *ref_tok = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "ref_tokens"),
              *ref_tgt = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "ref_targets");
    set_step(u.step_t, 0);
    const sg_tensor *statics[1] = {u.step_t};
    sg_graph_options o = sg_graph_options_default();
    o.name = "text-gather";
    o.warmup = 1;
    o.static_inputs = statics;
    o.n_static_inputs = 1;
    sg_graph *g;
    TU_OK(ctx, sg_graph_capture(ctx, gather_step, &u, &o, &g));
    for (int k = 0; k < 5; k++) {
        int32_t step = tu_randint(0, 1 << 24);
        set_step(u.step_t, step);
        tu_poison(u.tok), tu_poison(u.tgt);
        TU_OK(ctx, sg_graph_replay(g));
        TU_OK(ctx, sg_text_batch_host(txt, 0, u.seed, step, ref_tok, ref_tgt));
        int32_t *a = get_i32(u.tok), *b = get_i32(u.tgt), *ra = get_i32(ref_tok),
                *rb = get_i32(ref_tgt);
        TU_CHECK(!memcmp(a, ra, (size_t)(B * T) * 4) && !memcmp(b, rb, (size_t)(B * T) * 4),
                 "replay %d (step %d) did not gather that step's batch", k, step);
        free(a), free(b), free(ra), free(rb);
    }
    sg_graph_destroy(g);
    sg_tensor_destroy(u.step_t), sg_tensor_destroy(u.tok), sg_tensor_destroy(u.tgt);
    sg_tensor_destroy(ref_tok), sg_tensor_destroy(ref_tgt);
    sg_text_close(txt);
}

/* ---- CUDA windows are the CPU's ---- */

static void check_cpu_vs_cuda(sg_ctx *gpu, const char *path)
{
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    sg_text *tg, *tc;
    TU_OK(gpu, sg_text_open(gpu, path, 0.2, &tg));
    TU_OK(cpu, sg_text_open(cpu, path, 0.2, &tc));
    int64_t B = tu_randint(1, 64), T = tu_randint(1, 128);
    sg_tensor *gt = tu_tensor2(gpu, SG_DTYPE_I32, B, T, "tokens"),
              *gy = tu_tensor2(gpu, SG_DTYPE_I32, B, T, "targets");
    sg_tensor *ct = tu_tensor2(cpu, SG_DTYPE_I32, B, T, "tokens"),
              *cy = tu_tensor2(cpu, SG_DTYPE_I32, B, T, "targets");
    uint64_t seed = tu_next();
    for (int split = 0; split < 2; split++)
        for (int k = 0; k < 8; k++) {
            int64_t step = k == 0 ? 0 : tu_randint(-1000, 1 << 30);
            tu_poison(gt), tu_poison(gy);
            TU_OK(gpu, sg_text_batch_host(tg, split, seed, step, gt, gy));
            TU_OK(cpu, sg_text_batch_host(tc, split, seed, step, ct, cy));
            int32_t *a = get_i32(gt), *b = get_i32(gy), *ra = get_i32(ct), *rb = get_i32(cy);
            TU_CHECK(!memcmp(a, ra, (size_t)(B * T) * 4) && !memcmp(b, rb, (size_t)(B * T) * 4),
                     "split %d step %lld: CUDA windows differ from the CPU's", split,
                     (long long)step);
            free(a), free(b), free(ra), free(rb);
        }
    sg_tensor_destroy(gt), sg_tensor_destroy(gy), sg_tensor_destroy(ct), sg_tensor_destroy(cy);
    sg_text_close(tg);
    sg_text_close(tc);
    sg_ctx_destroy(cpu);
}

/* ---- windows of len real tokens, padded (variable sequence length) ---- */

/* sg_text_batch_padded into (B, T) holds, in each row's first len positions, the batch that
 * sg_text_batch_host gathers into (B, len) for the same step, then tokens 0 and targets -1;
 * len = T is the unpadded batch. On CUDA this runs the kernel's padded path (its unpadded
 * windows are compared with the CPU's above). */
static void check_padded(sg_ctx *ctx, const char *path)
{
    sg_text *txt;
    TU_OK(ctx, sg_text_open(ctx, path, 0.1, &txt));
    uint64_t seed = tu_next();
    for (int k = 0; k < 6; k++) {
        int64_t B = tu_randint(1, 8), T = tu_randint(1, 96), len = k == 0 ? T : tu_randint(1, (int)T);
        int64_t step = tu_randint(0, 1 << 20);
        int split = k % 2;
        sg_tensor *tok = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens"),
                  *tgt = tu_tensor1(ctx, SG_DTYPE_I32, B * T, "targets");
        sg_tensor *rt = tu_tensor2(ctx, SG_DTYPE_I32, B, len, "ref_tokens"),
                  *ry = tu_tensor2(ctx, SG_DTYPE_I32, B, len, "ref_targets");
        tu_poison(tok), tu_poison(tgt);
        TU_OK(ctx, sg_text_batch_padded(txt, split, seed, step, len, tok, tgt));
        TU_OK(ctx, sg_text_batch_host(txt, split, seed, step, rt, ry));
        int32_t *a = get_i32(tok), *b = get_i32(tgt), *ra = get_i32(rt), *rb = get_i32(ry);
        int64_t bad = 0;
        for (int64_t r = 0; r < B; r++)
            for (int64_t t = 0; t < T; t++) {
                int32_t want_tok = t < len ? ra[r * len + t] : 0, want_tgt = t < len ? rb[r * len + t] : -1;
                bad += a[r * T + t] != want_tok || b[r * T + t] != want_tgt;
            }
        TU_CHECK(bad == 0, "split %d step %lld, B %lld, T %lld, len %lld: %lld positions differ from the "
                 "unpadded windows and padding", split, (long long)step, (long long)B, (long long)T,
                 (long long)len, (long long)bad);
        free(a), free(b), free(ra), free(rb);
        sg_tensor_destroy(tok), sg_tensor_destroy(tgt), sg_tensor_destroy(rt), sg_tensor_destroy(ry);
    }
    sg_tensor *t8 = tu_tensor2(ctx, SG_DTYPE_I32, 2, 8, "tokens"), *y8 = tu_tensor2(ctx, SG_DTYPE_I32, 2, 8, "targets");
    TU_FAILS(ctx, sg_text_batch_padded(txt, 0, 1, 0, 0, t8, y8), SG_ERR_SHAPE, "len 0: expected 1 to 8");
    TU_FAILS(ctx, sg_text_batch_padded(txt, 0, 1, 0, 9, t8, y8), SG_ERR_SHAPE, "len 9");
    sg_tensor_destroy(t8), sg_tensor_destroy(y8);
    sg_text_close(txt);
}

/* ---- errors ---- */

static void check_errors(sg_ctx *ctx)
{
    sg_text *txt = (sg_text *)&txt;
    const char *missing = "/tmp/sg_text_no_such_file/really.txt";
    TU_FAILS(ctx, sg_text_open(ctx, missing, 0.1, &txt), SG_ERR_IO, missing);
    TU_CHECK(txt == NULL, "out set on failure");
    TU_FAILS(ctx, sg_text_open(ctx, tmp_empty, 0.0, &txt), SG_ERR_INVALID, tmp_empty);
    TU_FAILS(ctx, sg_text_open(ctx, tmp_random, 1.0, &txt), SG_ERR_INVALID, "val_fraction");
    TU_FAILS(ctx, sg_text_open(ctx, tmp_random, -0.1, &txt), SG_ERR_INVALID, "val_fraction");
    TU_FAILS(ctx, sg_text_open(ctx, tmp_short, 0.01, &txt), SG_ERR_INVALID, "validation");

    /* A file of exactly 10 bytes: T = 9 fits (one window: the whole file); T = 10 does not. */
    size_t nb;
    unsigned char *bytes = tu_file_read(tmp_short, &nb);
    TU_OK(ctx, sg_text_open(ctx, tmp_short, 0.0, &txt));
    sg_tensor *t9 = tu_tensor2(ctx, SG_DTYPE_I32, 3, 9, "tokens"),
              *y9 = tu_tensor2(ctx, SG_DTYPE_I32, 3, 9, "targets");
    TU_OK(ctx, sg_text_batch_host(txt, 0, tu_next(), tu_randint(0, 100), t9, y9));
    int32_t *a = get_i32(t9), *b = get_i32(y9);
    for (int r = 0; r < 3; r++)
        for (int t = 0; t < 9; t++)
            TU_CHECK(a[r * 9 + t] == bytes[t] && b[r * 9 + t] == bytes[t + 1],
                     "row %d of the only window wrong", r);
    free(a), free(b);
    sg_tensor *t10 = tu_tensor2(ctx, SG_DTYPE_I32, 2, 10, "tokens"),
              *y10 = tu_tensor2(ctx, SG_DTYPE_I32, 2, 10, "targets");
    TU_FAILS(ctx, sg_text_batch_host(txt, 0, 1, 0, t10, y10), SG_ERR_INVALID, tmp_short);
    TU_FAILS(ctx, sg_text_batch_host(txt, 1, 1, 0, t9, y9), SG_ERR_INVALID, "validation");
    TU_FAILS(ctx, sg_text_batch_host(txt, 2, 1, 0, t9, y9), SG_ERR_INVALID, "split 2");
    sg_tensor *f9 = tu_tensor2(ctx, SG_DTYPE_F32, 3, 9, "float_tokens");
    TU_FAILS(ctx, sg_text_batch_host(txt, 0, 1, 0, f9, y9), SG_ERR_DTYPE, "tokens");
    TU_FAILS(ctx, sg_text_batch_host(txt, 0, 1, 0, t9, y10), SG_ERR_SHAPE, "targets");
    sg_tensor *two = tu_tensor1(ctx, SG_DTYPE_I32, 2, "two_steps");
    TU_FAILS(ctx, sg_text_batch_device(txt, 0, 1, two, t9, y9), SG_ERR_SHAPE, "two_steps");
    TU_FAILS(ctx, sg_text_batch_device(txt, 0, 1, f9, t9, y9), SG_ERR_DTYPE, "step_tensor");
    sg_tensor_destroy(t9), sg_tensor_destroy(y9), sg_tensor_destroy(t10), sg_tensor_destroy(y10);
    sg_tensor_destroy(f9), sg_tensor_destroy(two);
    sg_text_close(txt);
    free(bytes);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_text");
    sg_backend be = strcmp(mode, "gpu") ? SG_BACKEND_CPU : SG_BACKEND_CUDA;
    sg_ctx *ctx = tu_ctx(be);
    file_make(tmp_random, sizeof tmp_random, NULL, (size_t)tu_randint(20000, 60000));
    file_make(tmp_short, sizeof tmp_short, NULL, 10);
    file_make(tmp_empty, sizeof tmp_empty, (const unsigned char *)"", 0);

    /* Random bytes: every value 0..255 occurs, and substrings are unambiguous. */
    check_windows(ctx, tmp_random, 0.1, 64);
    check_windows(ctx, tmp_random, 0.0, 200);
    check_spread(ctx, tmp_random);
    check_captured(ctx, tmp_random);
    check_padded(ctx, tmp_random);
    check_errors(ctx);

    /* The default corpus, where this machine has one. */
    const char *def = sg_text_default_path();
    if (def) {
        printf("default text: %s\n", def);
        check_windows(ctx, def, 0.1, 128);
    } else {
        printf(
            "note: none of the default text files exists here (/usr/share/common-licenses/GPL-3, "
            "GPL-2, Apache-2.0, /usr/share/dict/words); the checks above ran on %s instead\n",
            tmp_random);
    }
    if (be == SG_BACKEND_CUDA) check_cpu_vs_cuda(ctx, def ? def : tmp_random);
    sg_ctx_destroy(ctx);
    remove(tmp_random), remove(tmp_short), remove(tmp_empty);
    return tu_finish("test_text");
}
