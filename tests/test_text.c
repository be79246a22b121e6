/* test_text.c: the byte-level text data set. Windows are real substrings of the file, from the
 * right split; targets are the tokens shifted by one; batches are a pure function of (seed,
 * step), differ between steps and spread over the whole split; a captured step gathers the
 * batch of the step held in device memory; windows of len tokens padded to T are the windows
 * of an unpadded batch of length len, then padding; a varying batch draws its length and
 * shape bucket from the step on the device (sg_vary_len: the CLI's draw) and is the padded
 * batch of that length at the bucket's T; errors name the file. Files are sized before
 * they are read: streams, devices, FIFOs, directories and sockets are refused at once, files too
 * large for memory before reading, and a large file loads with host memory O(chunk) and every
 * byte in place. `cpu` runs on the CPU backend; `gpu` runs the same checks on CUDA, and compares CUDA windows with the CPU's. */
#define _POSIX_C_SOURCE 200809L

#include "testutil.h"

#include "nn/text.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* Under AddressSanitizer (make test's sanitizer build) resident memory has a shadow. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static char tmp_random[64], tmp_short[64], tmp_empty[64];

/* ---- files ---- */

/* A new temporary file of n bytes (random when bytes is NULL); its name into path. Given
 * bytes are written from where they are (no copy that would raise the peak RSS). */
static void file_make(char *path, size_t cap, const unsigned char *bytes, size_t n)
{
    snprintf(path, cap, "/tmp/sg_text_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) {
        fprintf(stderr, "FAIL: mkstemp: %s\n", strerror(errno));
        exit(1);
    }
    unsigned char *b = bytes ? NULL : malloc(n + 1);
    for (size_t i = 0; b && i < n; i++) b[i] = (unsigned char)tu_next();
    if (write(fd, bytes ? bytes : b, n) != (ssize_t)n) exit(1);
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

/* ---- files that must be refused before reading ---- */

/* A refusal that blocks or reads on forever ends the test here, naming the call. */
static const char *volatile hang_what = "";

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "FAIL: sg_text_open did not return within its alarm (blocked, or "
                            "reading a stream): ";
    ssize_t r = write(2, m, sizeof m - 1);
    r = write(2, (const char *)hang_what, strlen((const char *)hang_what));
    r = write(2, "\n", 1);
    (void)r;
    _exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The process's peak resident set so far, in bytes. */
static int64_t peak_rss(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (int64_t)ru.ru_maxrss * 1024;
}

/* sg_text_open(path) must fail with `want` and a message holding path and needle, within a
 * few seconds, without raising the peak RSS by more than 16 MiB, and leave *out NULL. */
static void check_refused(sg_ctx *ctx, const char *path, sg_status want, const char *needle)
{
    sg_text *txt = (sg_text *)&txt;
    int64_t rss0 = peak_rss();
    hang_what = path;
    alarm(20);
    double t0 = now_s();
    TU_FAILS(ctx, sg_text_open(ctx, path, 0.1, &txt), want, needle);
    double dt = now_s() - t0;
    alarm(0);
    TU_CHECK(strstr(sg_ctx_last_error(ctx), path) != NULL, "the message does not name '%s': %s",
             path, sg_ctx_last_error(ctx));
    TU_CHECK(txt == NULL, "'%s': out set on failure", path);
    TU_CHECK(dt < 5.0, "'%s' refused after %.1f s, expected at once", path, dt);
    int64_t grew = peak_rss() - rss0;
    TU_CHECK(grew < (16 << 20), "'%s': the peak RSS grew by %lld MiB before the refusal", path,
             (long long)(grew >> 20));
}

/* Streams and non-files: /dev/zero, /dev/urandom (endless), a FIFO with no writer (a plain
 * open blocks), a directory, a socket, a /proc file (no size) and a /sys file (claims 4096
 * bytes and holds fewer: a read that ends early). */
static void check_not_files(sg_ctx *ctx)
{
    static const char *const devs[] = {"/dev/zero", "/dev/urandom"};
    for (int i = 0; i < 2; i++)
        check_refused(ctx, devs[i], SG_ERR_INVALID,
                      "is a character device, not a regular file: give a file");
    char dir[64], fifo[96], sock[96];
    snprintf(dir, sizeof dir, "/tmp/sg_text_dir_XXXXXX");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "FAIL: mkdtemp: %s\n", strerror(errno));
        exit(1);
    }
    check_refused(ctx, dir, SG_ERR_INVALID, "is a directory, not a regular file");
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    TU_CHECK(mkfifo(fifo, 0600) == 0, "mkfifo %s: %s", fifo, strerror(errno));
    check_refused(ctx, fifo, SG_ERR_INVALID, "is a FIFO (named pipe), not a regular file");
    snprintf(sock, sizeof sock, "%s/sock", dir);
    int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    TU_CHECK(sfd >= 0 && bind(sfd, (struct sockaddr *)&sa, sizeof sa) == 0, "bind %s: %s", sock,
             strerror(errno));
    check_refused(ctx, sock, SG_ERR_INVALID, "is a socket, not a regular file");
    close(sfd);
    remove(sock), remove(fifo), rmdir(dir);
    check_refused(ctx, "/proc/self/status", SG_ERR_INVALID, "is empty");
    /* Every Linux has this one; its size says 4096 and it holds a few bytes ("0-15\n"). */
    const char *sys = "/sys/devices/system/cpu/online";
    struct stat sb;
    if (stat(sys, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 64)
        check_refused(ctx, sys, SG_ERR_IO, "ended at byte");
    else
        printf("note: %s is missing or not 4096 bytes by stat: the short-read check did not run\n",
               sys);
}

/* A sparse file of `size` bytes (nothing written: it reads as zeros); its name into path.
 * False when the file system cannot hold that size. */
static bool sparse_make(char *path, size_t cap, int64_t size)
{
    snprintf(path, cap, "/tmp/sg_text_sparse_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) {
        fprintf(stderr, "FAIL: mkstemp: %s\n", strerror(errno));
        exit(1);
    }
    bool ok = ftruncate(fd, (off_t)size) == 0;
    close(fd);
    if (!ok) remove(path);
    return ok;
}

/* Files too large for memory are refused from their size, naming both figures, before a byte
 * is read: a 4 TiB sparse file against the host's memory, and a 64 MiB one against a context
 * limited to 16 MiB, where a 2 MiB file (2 MiB of tokens: bytes stay bytes) still opens. */
static void check_too_large(sg_ctx *ctx)
{
    char big[64];
    if (sparse_make(big, sizeof big, (int64_t)1 << 42)) {
        check_refused(ctx, big, SG_ERR_OOM, "is 4.0 TiB; its tokens (1 byte a token) "
                                            "need 4.0 TiB on ");
        TU_CHECK(strstr(sg_ctx_last_error(ctx), " free of "), "no free memory figure: %s",
                 sg_ctx_last_error(ctx));
        remove(big);
    } else {
        printf("note: /tmp cannot hold a 4 TiB sparse file; the limited context below checks "
               "the size refusal\n");
    }
    sg_ctx_options o = sg_ctx_options_default();
    o.backend = SG_BACKEND_CPU;
    o.alloc_limit_bytes = (size_t)16 << 20;
    sg_ctx *small;
    TU_OK(NULL, sg_ctx_create(&o, &small));
    char mid[64];
    TU_CHECK(sparse_make(mid, sizeof mid, (int64_t)64 << 20), "no 64 MiB sparse file in /tmp");
    check_refused(small, mid, SG_ERR_OOM,
                  "is 64.0 MiB; its tokens (1 byte a token) need 64.0 MiB on CPU");
    TU_CHECK(strstr(sg_ctx_last_error(small), "which has 16.0 MiB free of 16.0 MiB"),
             "the free figure is not the context's 16 MiB limit: %s", sg_ctx_last_error(small));
    remove(mid);
    char fits[64];
    file_make(fits, sizeof fits, NULL, (size_t)2 << 20);
    sg_text *txt;
    TU_OK(small, sg_text_open(small, fits, 0.1, &txt));
    sg_text_close(txt);
    remove(fits);
    sg_ctx_destroy(small);
}

/* A file of 3 to 4 chunks loads with host memory of its tokens (1 byte a byte, the CPU
 * backend's "device" copy) and two chunks of staging, not a copy of the file or of its tokens
 * widened; and every byte lands in place across chunk and split boundaries: a batch of one
 * window of T = size - 1 is the whole split. */
static void check_large(sg_ctx *ctx)
{
    int64_t n = tu_randint(3 * (int)SG_TEXT_CHUNK_BYTES, 4 * (int)SG_TEXT_CHUNK_BYTES);
    double val_fraction = tu_uniform(0.05, 0.25);
    char path[64];
    unsigned char *bytes = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) bytes[i] = (unsigned char)tu_next();
    file_make(path, sizeof path, bytes, (size_t)n);
    int64_t rss0 = peak_rss();
    sg_text *txt;
    TU_OK(ctx, sg_text_open(ctx, path, val_fraction, &txt));
    int64_t grew = peak_rss() - rss0, bound = n + 2 * SG_TEXT_CHUNK_BYTES + (8 << 20);
    if (UNDER_ASAN) bound += bound / 4; /* ASan's shadow adds an eighth of what is touched */
    printf("%lld-byte file: peak RSS grew by %.1f MiB (tokens %.1f MiB; bound %.1f MiB)\n",
           (long long)n, grew / 1048576.0, n / 1048576.0, bound / 1048576.0);
    TU_CHECK(grew <= bound, "loading %lld bytes raised the peak RSS by %lld bytes, more than its "
             "tokens and the staging (%lld)", (long long)n, (long long)grew, (long long)bound);
    int64_t n_val = (int64_t)floor(val_fraction * (double)n), off[2] = {0, n - n_val};
    for (int split = 0; split < 2; split++) {
        int64_t size = sg_text_size(txt, split), T = size - 1, bad = 0, first = -1;
        TU_CHECK(size == (split ? n_val : n - n_val), "split %d holds %lld bytes", split,
                 (long long)size);
        sg_tensor *tok = tu_tensor2(ctx, SG_DTYPE_I32, 1, T, "tokens"),
                  *tgt = tu_tensor2(ctx, SG_DTYPE_I32, 1, T, "targets");
        tu_poison(tok), tu_poison(tgt);
        TU_OK(ctx, sg_text_batch_host(txt, split, tu_next(), tu_randint(0, 1000), tok, tgt));
        int32_t *a = get_i32(tok), *b = get_i32(tgt);
        for (int64_t i = 0; i < size; i++) {
            int32_t got = i < T ? a[i] : b[T - 1];
            if (got != bytes[off[split] + i] && !bad++) first = i;
        }
        TU_CHECK(bad == 0, "split %d of %lld bytes (val_fraction %g): %lld bytes differ from the "
                 "file, the first at %lld", split, (long long)size, val_fraction, (long long)bad,
                 (long long)first);
        free(a), free(b);
        sg_tensor_destroy(tok), sg_tensor_destroy(tgt);
    }
    sg_text_close(txt);
    free(bytes);
    remove(path);
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
        int32_t *first = NULL;
        bool differs = false;
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
            if (first) differs |= memcmp(first, a, (size_t)(B * T) * 4) != 0;
            if (!first) first = a;
            else free(a);
            free(b), free(a2), free(b2);
        }
        /* Different steps give different batches: not all six alike (two alike by chance, with
         * one window of a few thousand starts, happens; six, about never). */
        if (sg_text_size(txt, split) - T > 1000 && T >= 4)
            TU_CHECK(differs, "%s split %d: six steps gave the same batch", path, split);
        free(first);
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

/* ---- a varying batch: its length and shape bucket drawn from the step on the device ---- */

/* The CLI's --vary-seq / --vary-batch draw as it was written in src/cli/main.c (sg_cli_vary_rows),
 * spelt out again here: splitmix64 of the step, 1 + it modulo max. */
static int64_t vary_len_ref(int64_t step, int64_t max)
{
    uint64_t z = (uint64_t)step * 0x9e3779b97f4a7c15ull + 0x243f6a8885a308d3ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return 1 + (int64_t)((z ^ (z >> 31)) % (uint64_t)max);
}

/* sg_vary_len is the old CLI formula for every step and max, 0 for max < 1, and covers 1..max
 * over a run (each of 1..7 about 2000 / 7 times; none outside). */
static void check_vary_len(void)
{
    static const int64_t maxes[] = {1, 2, 3, 7, 64, 128, 1000, 1 << 20, INT64_MAX};
    int64_t bad = 0;
    for (size_t m = 0; m < sizeof maxes / sizeof maxes[0] + 4; m++) {
        int64_t max = m < sizeof maxes / sizeof maxes[0] ? maxes[m] : tu_randint(1, 1 << 30);
        for (int64_t i = 0; i < 3000; i++) {
            /* steps 0.., negative steps, and any 64-bit step */
            int64_t step = i < 1000 ? i : i < 2000 ? -i : (int64_t)tu_next();
            int64_t got = sg_vary_len(step, max), want = vary_len_ref(step, max);
            if (got != want && bad++ < 5)
                fprintf(stderr, "sg_vary_len(%lld, %lld) = %lld, expected %lld\n",
                        (long long)step, (long long)max, (long long)got, (long long)want);
        }
    }
    TU_CHECK(bad == 0, "sg_vary_len differs from the CLI's formula %lld times", (long long)bad);
    TU_CHECK(sg_vary_len(5, 0) == 0 && sg_vary_len(5, -3) == 0 && sg_vary_len(0, 1) == 1,
             "sg_vary_len(5, 0) = %lld, (5, -3) = %lld, (0, 1) = %lld; expected 0, 0, 1",
             (long long)sg_vary_len(5, 0), (long long)sg_vary_len(5, -3),
             (long long)sg_vary_len(0, 1));
    int64_t seen[8] = {0}, outside = 0;
    for (int64_t s = 0; s < 2000; s++) {
        int64_t v = sg_vary_len(s, 7);
        if (v < 1 || v > 7) outside++;
        else seen[v]++;
    }
    TU_CHECK(outside == 0, "%lld lengths outside 1..7", (long long)outside);
    for (int v = 1; v <= 7; v++)
        TU_CHECK(seen[v] > 2000 / 7 / 2, "length %d drawn %lld times in 2000 steps, expected about "
                 "%d", v, (long long)seen[v], 2000 / 7);
}

/* A value no gather writes (tokens 0..255, targets -1..255, buckets 0..31), written exactly
 * on every backend. */
#define VARY_POISON 0x7fffabcd

static void poison_i32(sg_tensor *t)
{
    int32_t *v = malloc(sg_tensor_nbytes(t));
    for (int64_t i = 0; i < t->numel; i++) v[i] = VARY_POISON;
    TU_OK(t->ctx, sg_tensor_copy_from_host(t, v, sg_tensor_nbytes(t)));
    TU_OK(t->ctx, sg_ctx_sync(t->ctx)); /* the copy may read v after the call on CUDA */
    free(v);
}

/* n random increasing sizes from 1..T (a random subset of them, sorted); the largest forced to
 * T when top is 1, kept below T when top is -1 (T > 1). */
static int random_buckets(int64_t *out, int n, int64_t T, int top)
{
    int64_t *all = malloc((size_t)T * sizeof *all);
    for (int64_t i = 0; i < T; i++) all[i] = i + 1;
    int64_t hi = top < 0 ? T - 1 : T; /* draw from 1..hi */
    if (n > hi) n = (int)hi;
    for (int i = 0; i < n; i++) { /* partial Fisher-Yates */
        int64_t j = i + (int64_t)(tu_next() % (uint64_t)(hi - i)), tmp = all[i];
        all[i] = all[j], all[j] = tmp;
    }
    for (int i = 1; i < n; i++) /* insertion sort: n <= 32 */
        for (int j = i; j > 0 && all[j - 1] > all[j]; j--) {
            int64_t tmp = all[j];
            all[j] = all[j - 1], all[j - 1] = tmp;
        }
    if (top > 0 && all[n - 1] != T) all[n - 1] = T;
    memcpy(out, all, (size_t)n * sizeof *out);
    free(all);
    return n;
}

/* What sg_text_batch_vary must have written for `step`, checked from its output (a, b: B*T
 * each, read back; bucket: *bucket_out) against a padded gather into (B, Tb) (ref_a, ref_b)
 * bit for bit, against the file's bytes (split: the split's n bytes) at the hash's windows of
 * rows row0 + b, and the elements after B*Tb still poisoned. Returns the number of bad ones. */
static int64_t check_vary_out(const char *what, const int32_t *a, const int32_t *b, int32_t bucket,
                              const int32_t *ref_a, const int32_t *ref_b, int64_t B, int64_t T,
                              const int64_t *buckets, int nb, const unsigned char *split,
                              int64_t n, uint64_t seed, int64_t step, int64_t row0)
{
    int64_t len = vary_len_ref(step, buckets[nb - 1]);
    int k = 0;
    while (buckets[k] < len) k++;
    int64_t Tb = buckets[k], bad = 0, first = -1;
    TU_CHECK(bucket == k, "%s: bucket_out %d, expected %d (len %lld of buckets up to %lld)", what,
             bucket, k, (long long)len, (long long)buckets[nb - 1]);
    for (int64_t i = 0; i < B * T; i++) {
        int ok;
        if (i < B * Tb) {
            int64_t r = i / Tb, t = i % Tb;
            int64_t s = sg_text_window_start(seed, step, row0 + r, n - len);
            int32_t want_a = t < len ? split[s + t] : 0, want_b = t < len ? split[s + t + 1] : -1;
            ok = a[i] == ref_a[i] && b[i] == ref_b[i] && a[i] == want_a && b[i] == want_b;
        } else {
            ok = a[i] == VARY_POISON && b[i] == VARY_POISON;
        }
        if (!ok && !bad++) first = i;
    }
    TU_CHECK(bad == 0, "%s: step %lld, len %lld, bucket %d (Tb %lld), B %lld, T %lld: %lld of "
             "%lld elements wrong, the first %lld (%s): tokens %d, targets %d",
             what, (long long)step, (long long)len, k, (long long)Tb, (long long)B, (long long)T,
             (long long)bad, (long long)(B * T), (long long)first,
             first < B * Tb ? "against the padded gather and the file" : "expected untouched",
             first >= 0 ? a[first] : 0, first >= 0 ? b[first] : 0);
    return bad;
}

/* One sg_text_batch_vary of `step` into poisoned tok (B, T) / tgt / bucket_out, checked. */
static void vary_once(sg_ctx *ctx, sg_text *txt, int split, const unsigned char *base,
                      uint64_t seed, int64_t step, const int64_t *buckets, int nb,
                      sg_tensor *step_t, sg_tensor *tok, sg_tensor *tgt, sg_tensor *bucket_t,
                      int64_t row0, const char *what)
{
    int64_t B = tok->shape[0], T = tok->shape[1], n = sg_text_size(txt, split);
    int64_t len = vary_len_ref(step, buckets[nb - 1]), k = 0;
    while (buckets[k] < len) k++;
    poison_i32(tok), poison_i32(tgt), poison_i32(bucket_t);
    set_step(step_t, (int32_t)step);
    TU_OK(ctx, sg_text_batch_vary(txt, split, seed, step_t, buckets, nb, tok, tgt, bucket_t));
    sg_tensor *rt = tu_tensor2(ctx, SG_DTYPE_I32, B, buckets[k], "ref_tokens"),
              *ry = tu_tensor2(ctx, SG_DTYPE_I32, B, buckets[k], "ref_targets");
    TU_OK(ctx, sg_text_batch_padded(txt, split, seed, step, len, rt, ry));
    int32_t *a = get_i32(tok), *b = get_i32(tgt), *ra = get_i32(rt), *rb = get_i32(ry),
            *kb = get_i32(bucket_t);
    check_vary_out(what, a, b, kb[0], ra, rb, B, T, buckets, nb, base, n, seed, step, row0);
    free(a), free(b), free(ra), free(rb), free(kb);
    sg_tensor_destroy(rt), sg_tensor_destroy(ry);
}

/* sg_text_batch_vary against sg_text_batch_padded of the drawn length, for random B, T, bucket
 * lists (one bucket, 32, the largest = T or below it), steps and row0; on CUDA the kernel's
 * result is held to the CPU's semantics through the file's bytes as well. */
static void check_vary(sg_ctx *ctx, const char *path)
{
    size_t nbytes;
    unsigned char *bytes = tu_file_read(path, &nbytes);
    sg_text *txt;
    TU_OK(ctx, sg_text_open(ctx, path, 0.1, &txt));
    int64_t n_train = sg_text_size(txt, 0);
    sg_tensor *step_t = tu_tensor1(ctx, SG_DTYPE_I32, 1, "step"),
              *bucket_t = tu_tensor1(ctx, SG_DTYPE_I32, 1, "bucket");
    uint64_t seed = tu_next();
    char what[96];
    for (int c = 0; c < 24; c++) {
        int64_t B = tu_randint(1, 6), T = c == 1 ? tu_randint(32, 96) : tu_randint(1, 96);
        int64_t buckets[SG_TEXT_MAX_BUCKETS];
        /* cases 0, 2: one bucket (T; below T); 1: 32 of them; then 1..8; the largest T, or
         * (T > 1) below it, or either */
        int want = c == 0 || c == 2 ? 1 : c == 1 ? SG_TEXT_MAX_BUCKETS : tu_randint(1, 8);
        int nb = random_buckets(buckets, want, T, T > 1 && c % 3 == 2 ? -1 : c % 3 == 0 ? 1 : 0);
        int split = c % 2;
        int64_t row0 = c % 4 == 3 ? tu_randint(1, 100) : 0;
        sg_text_set_row0(txt, row0);
        const unsigned char *base = bytes + (split ? n_train : 0);
        sg_tensor *tok = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens"),
                  *tgt = tu_tensor1(ctx, SG_DTYPE_I32, B * T, "targets");
        for (int s = 0; s < 4; s++) {
            int64_t step = s == 3 ? -tu_randint(1, 1000) : tu_randint(0, 1 << 24);
            snprintf(what, sizeof what, "case %d (%d buckets, split %d, row0 %lld)", c, nb, split,
                     (long long)row0);
            vary_once(ctx, txt, split, base, seed, step, buckets, nb, step_t, tok, tgt, bucket_t,
                      row0, what);
        }
        sg_tensor_destroy(tok), sg_tensor_destroy(tgt);
    }
    sg_text_set_row0(txt, 0);

    /* The step is read when the work runs: two gathers queued back to back, the step tensor
     * rewritten between them by a stream-ordered device write (no sync), gather the batches of
     * two steps whose buckets differ. */
    int64_t B = 3, T = 40, buckets[3] = {8, 20, 40};
    int64_t s1 = 0, s2 = 1;
    while (vary_len_ref(s1, 40) > 8) s1++;
    while (vary_len_ref(s2, 40) <= 20) s2++;
    sg_tensor *tok = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens"),
              *tgt = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "targets");
    sg_tensor *tok2 = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens2"),
              *tgt2 = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "targets2"),
              *bucket2 = tu_tensor1(ctx, SG_DTYPE_I32, 1, "bucket2");
    poison_i32(tok), poison_i32(tgt), poison_i32(bucket_t);
    poison_i32(tok2), poison_i32(tgt2), poison_i32(bucket2);
    int32_t v1 = (int32_t)s1, v2 = (int32_t)s2;
    TU_OK(ctx, sg_tensor_write_small(step_t, 0, &v1, sizeof v1));
    TU_OK(ctx, sg_text_batch_vary(txt, 0, seed, step_t, buckets, 3, tok, tgt, bucket_t));
    TU_OK(ctx, sg_tensor_write_small(step_t, 0, &v2, sizeof v2));
    TU_OK(ctx, sg_text_batch_vary(txt, 0, seed, step_t, buckets, 3, tok2, tgt2, bucket2));
    for (int i = 0; i < 2; i++) {
        int64_t step = i ? s2 : s1, len = vary_len_ref(step, 40);
        int64_t Tb = len <= 8 ? 8 : len <= 20 ? 20 : 40;
        sg_tensor *rt = tu_tensor2(ctx, SG_DTYPE_I32, B, Tb, "ref_tokens"),
                  *ry = tu_tensor2(ctx, SG_DTYPE_I32, B, Tb, "ref_targets");
        TU_OK(ctx, sg_text_batch_padded(txt, 0, seed, step, len, rt, ry));
        int32_t *a = get_i32(i ? tok2 : tok), *b = get_i32(i ? tgt2 : tgt), *ra = get_i32(rt),
                *rb = get_i32(ry), *kb = get_i32(i ? bucket2 : bucket_t);
        snprintf(what, sizeof what, "step rewritten between gathers, gather %d", i + 1);
        check_vary_out(what, a, b, kb[0], ra, rb, B, T, buckets, 3, bytes, n_train, seed, step, 0);
        free(a), free(b), free(ra), free(rb), free(kb);
        sg_tensor_destroy(rt), sg_tensor_destroy(ry);
    }
    sg_tensor_destroy(tok), sg_tensor_destroy(tgt), sg_tensor_destroy(tok2),
        sg_tensor_destroy(tgt2), sg_tensor_destroy(bucket2);
    sg_tensor_destroy(step_t), sg_tensor_destroy(bucket_t);
    sg_text_close(txt);
    free(bytes);
}

/* A captured varying gather: each replay gathers the batch of the step in device memory at its
 * length and writes its bucket. The caller's bucket list is overwritten after capture: the
 * gather holds a copy. */
typedef struct vary_user {
    sg_text *txt;
    uint64_t seed;
    int64_t buckets[4];
    sg_tensor *step_t, *tok, *tgt, *bucket_t;
} vary_user;

static sg_status gather_vary(void *p)
{
    vary_user *u = p;
    return sg_text_batch_vary(u->txt, 0, u->seed, u->step_t, u->buckets, 4, u->tok, u->tgt,
                              u->bucket_t);
}

static void check_vary_captured(sg_ctx *ctx, const char *path)
{
    size_t nbytes;
    unsigned char *bytes = tu_file_read(path, &nbytes);
    sg_text *txt;
    TU_OK(ctx, sg_text_open(ctx, path, 0.1, &txt));
    int64_t B = 4, T = 48, buckets[4] = {6, 16, 30, 48};
    vary_user u = {txt, tu_next(), {6, 16, 30, 48}, tu_tensor1(ctx, SG_DTYPE_I32, 1, "step"),
                   tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens"),
                   tu_tensor2(ctx, SG_DTYPE_I32, B, T, "targets"),
                   tu_tensor1(ctx, SG_DTYPE_I32, 1, "bucket")};
    set_step(u.step_t, 0);
    const sg_tensor *statics[1] = {u.step_t};
    sg_graph_options o = sg_graph_options_default();
    o.name = "text-vary-gather";
    o.warmup = 1;
    o.static_inputs = statics;
    o.n_static_inputs = 1;
    sg_graph *g;
    TU_OK(ctx, sg_graph_capture(ctx, gather_vary, &u, &o, &g));
    for (int i = 0; i < 4; i++) u.buckets[i] = 1000 + i; /* a capture must not read them */
    int seen[4] = {0};
    for (int k = 0; k < 12; k++) {
        int32_t step = tu_randint(0, 1 << 24);
        set_step(u.step_t, step);
        poison_i32(u.tok), poison_i32(u.tgt), poison_i32(u.bucket_t);
        TU_OK(ctx, sg_graph_replay(g));
        int64_t len = vary_len_ref(step, 48), j = 0;
        while (buckets[j] < len) j++;
        seen[j]++;
        sg_tensor *rt = tu_tensor2(ctx, SG_DTYPE_I32, B, buckets[j], "ref_tokens"),
                  *ry = tu_tensor2(ctx, SG_DTYPE_I32, B, buckets[j], "ref_targets");
        TU_OK(ctx, sg_text_batch_padded(txt, 0, u.seed, step, len, rt, ry));
        int32_t *a = get_i32(u.tok), *b = get_i32(u.tgt), *ra = get_i32(rt), *rb = get_i32(ry),
                *kb = get_i32(u.bucket_t);
        char what[64];
        snprintf(what, sizeof what, "replay %d", k);
        check_vary_out(what, a, b, kb[0], ra, rb, B, T, buckets, 4, bytes, sg_text_size(txt, 0),
                       u.seed, step, 0);
        free(a), free(b), free(ra), free(rb), free(kb);
        sg_tensor_destroy(rt), sg_tensor_destroy(ry);
    }
    printf("captured varying gather: 12 replays took buckets %d, %d, %d, %d times\n", seen[0],
           seen[1], seen[2], seen[3]);
    sg_graph_destroy(g);
    sg_tensor_destroy(u.step_t), sg_tensor_destroy(u.tok), sg_tensor_destroy(u.tgt),
        sg_tensor_destroy(u.bucket_t);
    sg_text_close(txt);
    free(bytes);
}

/* Every bad argument of sg_text_batch_vary is refused with its own message before anything
 * is written (tokens, targets and the bucket stay poisoned), and the context still gathers. */
static void check_vary_errors(sg_ctx *ctx)
{
    sg_text *txt, *tiny;
    TU_OK(ctx, sg_text_open(ctx, tmp_random, 0.1, &txt));
    TU_OK(ctx, sg_text_open(ctx, tmp_short, 0.0, &tiny)); /* 10 bytes: T = 9 at most */
    int64_t B = 2, T = 16;
    sg_tensor *tok = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens"),
              *tgt = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "targets"),
              *step_t = tu_tensor1(ctx, SG_DTYPE_I32, 1, "step"),
              *bucket_t = tu_tensor1(ctx, SG_DTYPE_I32, 1, "bucket"),
              *f_step = tu_tensor1(ctx, SG_DTYPE_F32, 1, "float_step"),
              *two = tu_tensor1(ctx, SG_DTYPE_I32, 2, "two_values"),
              *f_tok = tu_tensor2(ctx, SG_DTYPE_F32, B, T, "float_tokens");
    set_step(step_t, 7);
    int64_t ok[3] = {4, 8, 16}, big[2] = {4, 17}, same[2] = {4, 4}, down[3] = {2, 8, 5},
            zero[2] = {0, 4}, neg[1] = {-3}, many[SG_TEXT_MAX_BUCKETS + 1];
    for (int i = 0; i <= SG_TEXT_MAX_BUCKETS; i++) many[i] = i + 1;
    uint64_t seed = tu_next();
    poison_i32(tok), poison_i32(tgt), poison_i32(bucket_t);
#define VARY(t_, split_, st_, bk_, nb_, tok_, tgt_, out_)                                        \
    sg_text_batch_vary((t_), (split_), seed, (st_), (bk_), (nb_), (tok_), (tgt_), (out_))
    TU_FAILS(ctx, VARY(txt, 0, step_t, NULL, 3, tok, tgt, bucket_t), SG_ERR_NULL,
             "buckets is NULL");
    TU_FAILS(ctx, VARY(txt, 0, step_t, ok, 0, tok, tgt, bucket_t), SG_ERR_INVALID,
             "0 buckets, expected 1 to 32");
    TU_FAILS(ctx, VARY(txt, 0, step_t, many, SG_TEXT_MAX_BUCKETS + 1, tok, tgt, bucket_t),
             SG_ERR_INVALID, "33 buckets, expected 1 to 32");
    TU_FAILS(ctx, VARY(txt, 0, step_t, same, 2, tok, tgt, bucket_t), SG_ERR_INVALID,
             "buckets[1] is 4, not above buckets[0] = 4");
    TU_FAILS(ctx, VARY(txt, 0, step_t, down, 3, tok, tgt, bucket_t), SG_ERR_INVALID,
             "buckets[2] is 5, not above buckets[1] = 8");
    TU_FAILS(ctx, VARY(txt, 0, step_t, zero, 2, tok, tgt, bucket_t), SG_ERR_INVALID,
             "buckets[0] is 0, expected >= 1");
    TU_FAILS(ctx, VARY(txt, 0, step_t, neg, 1, tok, tgt, bucket_t), SG_ERR_INVALID,
             "buckets[0] is -3");
    TU_FAILS(ctx, VARY(txt, 0, step_t, big, 2, tok, tgt, bucket_t), SG_ERR_SHAPE,
             "the largest bucket 17 exceeds the T of tokens 'tokens' (16)");
    TU_FAILS(ctx, VARY(txt, 0, NULL, ok, 3, tok, tgt, bucket_t), SG_ERR_NULL, "step_tensor");
    TU_FAILS(ctx, VARY(txt, 0, f_step, ok, 3, tok, tgt, bucket_t), SG_ERR_DTYPE, "step_tensor");
    TU_FAILS(ctx, VARY(txt, 0, two, ok, 3, tok, tgt, bucket_t), SG_ERR_SHAPE,
             "step_tensor 'two_values' has 2 elements, expected 1");
    TU_FAILS(ctx, VARY(txt, 0, step_t, ok, 3, tok, tgt, NULL), SG_ERR_NULL, "bucket_out");
    TU_FAILS(ctx, VARY(txt, 0, step_t, ok, 3, tok, tgt, f_step), SG_ERR_DTYPE, "bucket_out");
    TU_FAILS(ctx, VARY(txt, 0, step_t, ok, 3, tok, tgt, two), SG_ERR_SHAPE,
             "bucket_out 'two_values' has 2 elements, expected 1");
    TU_FAILS(ctx, VARY(txt, 2, step_t, ok, 3, tok, tgt, bucket_t), SG_ERR_INVALID,
             "sg_text_batch_vary: split 2, expected 0 (train) or 1 (validation)");
    TU_FAILS(ctx, VARY(txt, -1, step_t, ok, 3, tok, tgt, bucket_t), SG_ERR_INVALID, "split -1");
    TU_FAILS(ctx, VARY(txt, 0, step_t, ok, 3, f_tok, tgt, bucket_t), SG_ERR_DTYPE, "tokens");
    TU_FAILS(ctx, VARY(txt, 0, step_t, ok, 3, tok, two, bucket_t), SG_ERR_SHAPE, "targets");
    /* the split must hold a window of T + 1: 10 bytes do not hold 17 */
    TU_FAILS(ctx, VARY(tiny, 0, step_t, ok, 3, tok, tgt, bucket_t), SG_ERR_INVALID, tmp_short);
    int32_t *a = get_i32(tok), *b = get_i32(tgt), *kb = get_i32(bucket_t);
    int64_t written = kb[0] != VARY_POISON;
    for (int64_t i = 0; i < B * T; i++) written += a[i] != VARY_POISON || b[i] != VARY_POISON;
    TU_CHECK(written == 0, "%lld elements written by refused calls", (long long)written);
    free(a), free(b), free(kb);
#undef VARY
    /* still usable: a correct call gathers */
    size_t nbytes;
    unsigned char *bytes = tu_file_read(tmp_random, &nbytes);
    vary_once(ctx, txt, 0, bytes, seed, 7, ok, 3, step_t, tok, tgt, bucket_t, 0,
              "after the refusals");
    free(bytes);
    sg_tensor_destroy(tok), sg_tensor_destroy(tgt), sg_tensor_destroy(step_t);
    sg_tensor_destroy(bucket_t), sg_tensor_destroy(f_step), sg_tensor_destroy(two);
    sg_tensor_destroy(f_tok);
    sg_text_close(txt), sg_text_close(tiny);
}

/* ---- errors ---- */

static void check_errors(sg_ctx *ctx)
{
    sg_text *txt = (sg_text *)&txt;
    const char *missing = "/tmp/sg_text_no_such_file/really.txt";
    TU_FAILS(ctx, sg_text_open(ctx, missing, 0.1, &txt), SG_ERR_IO, missing);
    TU_CHECK(txt == NULL, "out set on failure");
    TU_FAILS(ctx, sg_text_open(ctx, tmp_empty, 0.0, &txt), SG_ERR_INVALID, tmp_empty);
    TU_CHECK(strstr(sg_ctx_last_error(ctx), "is empty"), "empty: %s", sg_ctx_last_error(ctx));
    TU_FAILS(ctx, sg_text_open(ctx, tmp_random, 1.0, &txt), SG_ERR_INVALID, "val_fraction");
    TU_FAILS(ctx, sg_text_open(ctx, tmp_random, -0.1, &txt), SG_ERR_INVALID, "val_fraction");
    TU_FAILS(ctx, sg_text_open(ctx, tmp_short, 0.01, &txt), SG_ERR_INVALID, "validation");
    /* A model's windows of T + 1 bytes, checked from the size: 10 bytes hold one of 10. */
    TU_FAILS(ctx, sg_text_open_window(ctx, tmp_short, 0.0, 11, &txt), SG_ERR_INVALID,
             "too short for a train split of at least 11 bytes");
    TU_FAILS(ctx, sg_text_open_window(ctx, tmp_short, 0.5, 6, &txt), SG_ERR_INVALID,
             "train 5, validation 5");
    TU_FAILS(ctx, sg_text_open_window(ctx, tmp_short, 0.0, 0, &txt), SG_ERR_INVALID, "window 0");
    TU_OK(ctx, sg_text_open_window(ctx, tmp_short, 0.5, 5, &txt));
    TU_CHECK(sg_text_size(txt, 0) == 5 && sg_text_size(txt, 1) == 5, "splits of %lld and %lld",
             (long long)sg_text_size(txt, 0), (long long)sg_text_size(txt, 1));
    sg_text_close(txt);

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
    struct sigaction sa = {.sa_handler = on_alarm};
    sigaction(SIGALRM, &sa, NULL);

    /* First, while the peak RSS is low (each measures how far it raises the peak): refusals of
     * non-files, a file of several chunks, files too large. */
    check_not_files(ctx);
    check_large(ctx);
    check_too_large(ctx);

    file_make(tmp_random, sizeof tmp_random, NULL, (size_t)tu_randint(20000, 60000));
    file_make(tmp_short, sizeof tmp_short, NULL, 10);
    file_make(tmp_empty, sizeof tmp_empty, (const unsigned char *)"", 0);

    /* Random bytes: every value 0..255 occurs, and substrings are unambiguous. */
    check_windows(ctx, tmp_random, 0.1, 64);
    check_windows(ctx, tmp_random, 0.0, 200);
    check_spread(ctx, tmp_random);
    check_captured(ctx, tmp_random);
    check_padded(ctx, tmp_random);
    check_vary_len();
    check_vary(ctx, tmp_random);
    check_vary_captured(ctx, tmp_random);
    check_errors(ctx);
    check_vary_errors(ctx);

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
