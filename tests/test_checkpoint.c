/* test_checkpoint.c: safetensors checkpoints. Round trips of random tensors and metadata; the
 * byte layout checked against the format's specification; a file written by the reference
 * implementation (Python safetensors 0.8) loaded, and written again byte for byte; truncated,
 * corrupt and mismatched files refused with the file (and tensor) named and the destination
 * left unchanged; atomic saves; NaN and Inf refused on load and save; FIFOs and devices refused
 * without blocking; a 200,000-key header refused in well under a second; save targets checked,
 * their mode and symbolic links kept, stale temporaries removed; a trainer's metadata validated
 * before anything changes. `cpu` runs on the CPU backend; `gpu` runs the same checks on CUDA
 * tensors, and moves a checkpoint between the GPU and the CPU. */
#define _XOPEN_SOURCE 700 /* POSIX 2008 with mknod and symlink */

#include "testutil.h"

#include "nn/checkpoint.h"
#include "nn/nn.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static char tdir[64]; /* this run's scratch directory */

/* ---- files and bytes ---- */

static const char *tpath(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tdir, name);
    return buf;
}

static void file_write(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "FAIL: cannot write %s\n", path);
        exit(1);
    }
}

/* Entries of tdir (or of dir) whose name holds ".tmp.": leftover temporaries. */
static int count_temporaries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static unsigned char *tensor_bytes(const sg_tensor *t)
{
    size_t n = sg_tensor_nbytes(t);
    unsigned char *b = malloc(n);
    TU_OK(t->ctx, sg_tensor_copy_to_host(t, b, n));
    return b;
}

/* The exponent mask of a floating dtype (0: not floating), as the element's bits. */
static uint64_t exponent_mask(sg_dtype dt)
{
    return dt == SG_DTYPE_F32    ? 0x7f800000u
           : dt == SG_DTYPE_BF16 ? 0x7f80u
           : dt == SG_DTYPE_F64  ? 0x7ff0000000000000u
                                 : 0;
}

/* Fresh random bits in every byte: the round trip must be bit-exact for every pattern
 * (subnormals, -0, any sign) except NaN and Inf, which a checkpoint never holds: an element
 * whose exponent is all ones loses its top exponent bit (bit 6 of its last byte, little-endian
 * host). */
static void fill_random_bits(sg_tensor *t)
{
    size_t n = sg_tensor_nbytes(t), es = sg_dtype_size(t->dtype);
    uint64_t mask = exponent_mask(t->dtype);
    unsigned char *b = malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)tu_next();
    for (size_t i = 0; mask && i < n; i += es) {
        uint64_t v = 0;
        memcpy(&v, b + i, es);
        if ((v & mask) == mask) b[i + es - 1] &= 0xbf;
    }
    TU_OK(t->ctx, sg_tensor_copy_from_host(t, b, n));
    TU_OK(t->ctx, sg_ctx_sync(t->ctx));
    free(b);
}

/* ---- a set of named tensors of random dtypes and shapes ---- */

#define NSET 7

typedef struct tset {
    sg_ctx *ctx;
    sg_ckpt_entry e[NSET];
    int n;
} tset;

/* Names: plain, dotted, and one needing JSON escapes and UTF-8 (as the file must hold them). */
static const char *const set_names[NSET] = {"wte", "blocks.0.attn.w", "blocks.0.ln.b", "step",
                                            "opt.m", "z\"quoted\\ caf\xc3\xa9", "a"};

static tset make_set(sg_ctx *ctx, const tset *like)
{
    tset s = {ctx, {{0}}, NSET};
    sg_dtype dts[4] = {SG_DTYPE_F32, SG_DTYPE_I32, SG_DTYPE_BF16, SG_DTYPE_F64};
    int ndt = ctx->backend == SG_BACKEND_CPU ? 4 : 3; /* f64 exists on the CPU only */
    for (int i = 0; i < NSET; i++) {
        sg_tensor *t;
        if (like) {
            const sg_tensor *o = like->e[i].t;
            t = tu_tensor(ctx, o->dtype, o->ndim, o->shape, set_names[i]);
        } else {
            int64_t shape[SG_MAX_DIMS];
            int nd = tu_randint(1, SG_MAX_DIMS);
            for (int d = 0; d < nd; d++) shape[d] = tu_randint(1, d == 0 ? 40 : 7);
            /* one of each dtype first, then random ones */
            sg_dtype dt = i < ndt ? dts[i] : dts[tu_randint(0, ndt - 1)];
            t = tu_tensor(ctx, dt, nd, shape, set_names[i]);
        }
        fill_random_bits(t);
        s.e[i] = (sg_ckpt_entry){set_names[i], t};
    }
    return s;
}

static void free_set(tset *s)
{
    for (int i = 0; i < s->n; i++) sg_tensor_destroy(s->e[i].t);
}

/* Host copies of every tensor of a set. */
static void snapshot(const tset *s, unsigned char **snap)
{
    for (int i = 0; i < s->n; i++) snap[i] = tensor_bytes(s->e[i].t);
}

static int same_as(const tset *s, unsigned char *const *snap)
{
    int same = 1;
    for (int i = 0; i < s->n; i++) {
        unsigned char *b = tensor_bytes(s->e[i].t);
        same &= !memcmp(b, snap[i], sg_tensor_nbytes(s->e[i].t));
        free(b);
    }
    return same;
}

static void free_snapshot(const tset *s, unsigned char **snap)
{
    for (int i = 0; i < s->n; i++) free(snap[i]);
}

/* ---- the byte layout, read with the specification in hand (not with the loader) ---- */

static const char *spec_dtype(sg_dtype dt)
{
    return dt == SG_DTYPE_F32    ? "F32"
           : dt == SG_DTYPE_I32  ? "I32"
           : dt == SG_DTYPE_BF16 ? "BF16"
                                 : "F64";
}

/* The name as the JSON header holds it (only the escapes this test's names need). */
static void json_name(const char *name, char *out, size_t cap)
{
    size_t w = 0;
    out[w++] = '"';
    for (const char *p = name; *p && w + 3 < cap; p++) {
        if (*p == '"' || *p == '\\') out[w++] = '\\';
        out[w++] = *p;
    }
    out[w++] = '"';
    out[w] = '\0';
}

static void check_layout(const char *path, const tset *s, const char *step_value)
{
    size_t len;
    unsigned char *f = tu_file_read(path, &len);
    TU_CHECK(len >= 8, "file of %zu bytes", len);
    uint64_t N = 0;
    for (int i = 0; i < 8; i++) N |= (uint64_t)f[i] << (8 * i);
    TU_CHECK(8 + N <= len, "header length %llu past the end (%zu)", (unsigned long long)N, len);
    TU_CHECK((8 + N) % 8 == 0, "data starts at %llu, not a multiple of 8",
             (unsigned long long)(8 + N));
    char *h = malloc(N + 1);
    memcpy(h, f + 8, N);
    h[N] = '\0';
    TU_CHECK(h[0] == '{', "header begins with '%c'", h[0]);
    size_t last = N;
    while (last > 0 && h[last - 1] == ' ') last--;
    TU_CHECK(last > 0 && h[last - 1] == '}' && N - last < 8,
             "header must end in '}' and < 8 spaces");
    char want[256];
    snprintf(want, sizeof want, "{\"__metadata__\":{\"step\":\"%s\",", step_value);
    TU_CHECK(!strncmp(h, want, strlen(want)), "header does not open with %s: %.80s", want, h);
    uint64_t data_len = len - 8 - N, covered = 0;
    uint64_t begin[NSET], end[NSET];
    for (int i = 0; i < s->n; i++) {
        const sg_tensor *t = s->e[i].t;
        char key[128], frag[512];
        json_name(s->e[i].name, key, sizeof key);
        int k = snprintf(frag, sizeof frag, "%s:{\"dtype\":\"%s\",\"shape\":[", key,
                         spec_dtype(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            k +=
                snprintf(frag + k, sizeof frag - k, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        snprintf(frag + k, sizeof frag - k, "],\"data_offsets\":[");
        char *at = strstr(h, frag);
        TU_CHECK(at != NULL, "header lacks %s", frag);
        if (!at) continue;
        char *p = at + strlen(frag), *q;
        begin[i] = strtoull(p, &q, 10);
        TU_CHECK(*q == ',', "bad data_offsets for %s", key);
        end[i] = strtoull(q + 1, &q, 10);
        TU_CHECK(*q == ']', "bad data_offsets for %s", key);
        size_t nb = sg_tensor_nbytes(t), es = sg_dtype_size(t->dtype);
        TU_CHECK(end[i] - begin[i] == nb, "%s spans %llu bytes, holds %zu", key,
                 (unsigned long long)(end[i] - begin[i]), nb);
        TU_CHECK(begin[i] % es == 0,
                 "%s at data offset %llu is not aligned to its %zu-byte elements", key,
                 (unsigned long long)begin[i], es);
        TU_CHECK(end[i] <= data_len, "%s ends past the data", key);
        if (end[i] > data_len || end[i] - begin[i] != nb) continue;
        unsigned char *b = tensor_bytes(t); /* little-endian host: the bytes as stored */
        TU_CHECK(!memcmp(f + 8 + N + begin[i], b, nb), "%s: data bytes differ from the tensor",
                 key);
        free(b);
        covered += nb;
        for (int j = 0; j < i; j++)
            TU_CHECK(end[i] <= begin[j] || end[j] <= begin[i], "tensors %d and %d overlap", i, j);
    }
    TU_CHECK(covered == data_len, "tensors cover %llu of %llu data bytes",
             (unsigned long long)covered, (unsigned long long)data_len);
    free(h);
    free(f);
}

/* ---- round trip ---- */

static void check_round_trip(sg_ctx *ctx)
{
    char path[256], meta[512], v[64], step[32];
    tpath(path, sizeof path, "rt.safetensors");
    tset a = make_set(ctx, NULL), b = make_set(ctx, &a);
    snprintf(step, sizeof step, "%d", tu_randint(0, 1 << 30));
    const char *kv[] = {"step", step, "note", "line\n\"two\"\t\x01 caf\xc3\xa9", "empty", "", NULL};
    TU_OK(ctx, sg_checkpoint_save(ctx, path, a.e, a.n, kv));
    TU_CHECK(count_temporaries(tdir) == 0, "a temporary was left behind");
    check_layout(path, &a, step);

    unsigned char *snap[NSET];
    snapshot(&a, snap);
    TU_CHECK(!same_as(&b, snap), "destination already equal to the source");
    TU_OK(ctx, sg_checkpoint_load(ctx, path, b.e, b.n, meta, sizeof meta));
    TU_CHECK(same_as(&b, snap), "loaded tensors differ from the saved ones");
    TU_OK(ctx, sg_checkpoint_meta_get(meta, "step", v, sizeof v));
    TU_CHECK(!strcmp(v, step), "step '%s', saved '%s'", v, step);
    TU_OK(ctx, sg_checkpoint_meta_get(meta, "note", v, sizeof v));
    TU_CHECK(!strcmp(v, kv[3]), "note '%s' did not round-trip", v);
    TU_OK(ctx, sg_checkpoint_meta_get(meta, "empty", v, sizeof v));
    TU_CHECK(v[0] == '\0', "empty value read as '%s'", v);
    TU_CHECK(sg_checkpoint_meta_get(meta, "absent", v, sizeof v) == SG_ERR_INVALID,
             "absent key found");
    TU_CHECK(sg_checkpoint_meta_get(meta, "note", v, 4) == SG_ERR_INVALID,
             "a value too long for out fit");
    TU_FAILS(ctx, sg_checkpoint_load(ctx, path, b.e, b.n, meta, 8), SG_ERR_INVALID, "metadata");

    /* Order of the caller's entries does not matter; no metadata reads back as {}. */
    sg_ckpt_entry rev[NSET];
    for (int i = 0; i < a.n; i++) rev[i] = b.e[a.n - 1 - i];
    TU_OK(ctx, sg_checkpoint_save(ctx, path, rev, a.n, NULL));
    fill_random_bits(a.e[2].t);
    TU_OK(ctx, sg_checkpoint_load(ctx, path, a.e, a.n, meta, sizeof meta));
    TU_CHECK(same_as(&a, snap), "reversed entries did not round-trip");
    TU_CHECK(!strcmp(meta, "{}"), "no metadata read back as '%s'", meta);

    /* Bad entries are refused before any file is touched. */
    sg_ckpt_entry dup[2] = {a.e[0], {a.e[0].name, a.e[1].t}};
    TU_FAILS(ctx, sg_checkpoint_save(ctx, path, dup, 2, NULL), SG_ERR_INVALID, "twice");
    sg_ckpt_entry reserved[1] = {{"__metadata__", a.e[0].t}};
    TU_FAILS(ctx, sg_checkpoint_save(ctx, path, reserved, 1, NULL), SG_ERR_INVALID, "reserved");
    const char *odd_kv[] = {"k", NULL};
    TU_FAILS(ctx, sg_checkpoint_save(ctx, path, a.e, a.n, odd_kv), SG_ERR_INVALID, "no value");
    TU_OK(ctx, sg_checkpoint_load(ctx, path, b.e, b.n, NULL, 0)); /* the file is still intact */
    free_snapshot(&a, snap);
    free_set(&a);
    free_set(&b);
}

/* ---- a file the reference implementation wrote ---- */

/* safetensors 0.8.0: save({'w': [[1.5,-2],[0.25,3]] f32, 'idx': [7,-1,65536] i32,
 * 'bias': [0.1,-0.5,1e-3] f32}, metadata={'note': 'a"b\\c\n\t\x01 café', 'step': '12'}). */
static const unsigned char reference_file[288] = {
    0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7b, 0x22, 0x5f, 0x5f, 0x6d, 0x65, 0x74, 0x61,
    0x64, 0x61, 0x74, 0x61, 0x5f, 0x5f, 0x22, 0x3a, 0x7b, 0x22, 0x6e, 0x6f, 0x74, 0x65, 0x22, 0x3a,
    0x22, 0x61, 0x5c, 0x22, 0x62, 0x5c, 0x5c, 0x63, 0x5c, 0x6e, 0x5c, 0x74, 0x5c, 0x75, 0x30, 0x30,
    0x30, 0x31, 0x20, 0x63, 0x61, 0x66, 0xc3, 0xa9, 0x22, 0x2c, 0x22, 0x73, 0x74, 0x65, 0x70, 0x22,
    0x3a, 0x22, 0x31, 0x32, 0x22, 0x7d, 0x2c, 0x22, 0x62, 0x69, 0x61, 0x73, 0x22, 0x3a, 0x7b, 0x22,
    0x64, 0x74, 0x79, 0x70, 0x65, 0x22, 0x3a, 0x22, 0x46, 0x33, 0x32, 0x22, 0x2c, 0x22, 0x73, 0x68,
    0x61, 0x70, 0x65, 0x22, 0x3a, 0x5b, 0x33, 0x5d, 0x2c, 0x22, 0x64, 0x61, 0x74, 0x61, 0x5f, 0x6f,
    0x66, 0x66, 0x73, 0x65, 0x74, 0x73, 0x22, 0x3a, 0x5b, 0x30, 0x2c, 0x31, 0x32, 0x5d, 0x7d, 0x2c,
    0x22, 0x77, 0x22, 0x3a, 0x7b, 0x22, 0x64, 0x74, 0x79, 0x70, 0x65, 0x22, 0x3a, 0x22, 0x46, 0x33,
    0x32, 0x22, 0x2c, 0x22, 0x73, 0x68, 0x61, 0x70, 0x65, 0x22, 0x3a, 0x5b, 0x32, 0x2c, 0x32, 0x5d,
    0x2c, 0x22, 0x64, 0x61, 0x74, 0x61, 0x5f, 0x6f, 0x66, 0x66, 0x73, 0x65, 0x74, 0x73, 0x22, 0x3a,
    0x5b, 0x31, 0x32, 0x2c, 0x32, 0x38, 0x5d, 0x7d, 0x2c, 0x22, 0x69, 0x64, 0x78, 0x22, 0x3a, 0x7b,
    0x22, 0x64, 0x74, 0x79, 0x70, 0x65, 0x22, 0x3a, 0x22, 0x49, 0x33, 0x32, 0x22, 0x2c, 0x22, 0x73,
    0x68, 0x61, 0x70, 0x65, 0x22, 0x3a, 0x5b, 0x33, 0x5d, 0x2c, 0x22, 0x64, 0x61, 0x74, 0x61, 0x5f,
    0x6f, 0x66, 0x66, 0x73, 0x65, 0x74, 0x73, 0x22, 0x3a, 0x5b, 0x32, 0x38, 0x2c, 0x34, 0x30, 0x5d,
    0x7d, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0xcd, 0xcc, 0xcc, 0x3d, 0x00, 0x00, 0x00, 0xbf,
    0x6f, 0x12, 0x83, 0x3a, 0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0, 0x00, 0x00, 0x80, 0x3e,
    0x00, 0x00, 0x40, 0x40, 0x07, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x01, 0x00,
};

static void check_reference_file(sg_ctx *ctx)
{
    char path[256], meta[256], v[64];
    tpath(path, sizeof path, "reference.safetensors");
    file_write(path, reference_file, sizeof reference_file);
    sg_tensor *w = tu_tensor2(ctx, SG_DTYPE_F32, 2, 2, "w"),
              *idx = tu_tensor1(ctx, SG_DTYPE_I32, 3, "idx"),
              *bias = tu_tensor1(ctx, SG_DTYPE_F32, 3, "bias");
    sg_ckpt_entry e[3] = {{"w", w}, {"idx", idx}, {"bias", bias}};
    TU_OK(ctx, sg_checkpoint_load(ctx, path, e, 3, meta, sizeof meta));
    double *gw = tu_get(w), *gi = tu_get(idx), *gb = tu_get(bias);
    double rw[4] = { 1.5, -2, 0.25, 3 }, ri[3] = { 7, -1, 65536 },
           rb[3] = { (float)0.1, -0.5, (float)1e-3 };
    tu_close("reference w", gw, rw, 4, (tu_tol){0, 0});
    tu_close("reference idx", gi, ri, 3, (tu_tol){0, 0});
    tu_close("reference bias", gb, rb, 3, (tu_tol){0, 0});
    free(gw), free(gi), free(gb);
    TU_OK(ctx, sg_checkpoint_meta_get(meta, "note", v, sizeof v));
    TU_CHECK(!strcmp(v, "a\"b\\c\n\t\x01 caf\xc3\xa9"), "note read as '%s'", v);
    TU_OK(ctx, sg_checkpoint_meta_get(meta, "step", v, sizeof v));
    TU_CHECK(!strcmp(v, "12"), "step read as '%s'", v);

    /* Saved again, with the metadata in the reference's order: the same bytes. */
    char again[256];
    tpath(again, sizeof again, "again.safetensors");
    const char *kv[] = {"note", "a\"b\\c\n\t\x01 caf\xc3\xa9", "step", "12", NULL};
    TU_OK(ctx, sg_checkpoint_save(ctx, again, e, 3, kv));
    size_t len;
    unsigned char *b = tu_file_read(again, &len);
    TU_CHECK(len == sizeof reference_file && !memcmp(b, reference_file, len),
             "the saved file differs from the reference implementation's (%zu vs %zu bytes)", len,
             sizeof reference_file);
    free(b);
    sg_tensor_destroy(w), sg_tensor_destroy(idx), sg_tensor_destroy(bias);
}

/* ---- truncated files ---- */

static void check_truncated(sg_ctx *ctx)
{
    char path[256], cut[256];
    tpath(path, sizeof path, "full.safetensors");
    tpath(cut, sizeof cut, "cut.safetensors");
    tset a = make_set(ctx, NULL), b = make_set(ctx, &a);
    const char *kv[] = {"step", "7", NULL};
    TU_OK(ctx, sg_checkpoint_save(ctx, path, a.e, a.n, kv));
    size_t len;
    unsigned char *f = tu_file_read(path, &len);
    uint64_t N = 0;
    for (int i = 0; i < 8; i++) N |= (uint64_t)f[i] << (8 * i);
    size_t data = len - 8 - (size_t)N;
    size_t cuts[] = { 0,
                      3,
                      7,
                      8,
                      9,
                      8 + (size_t)N / 2,
                      8 + (size_t)N - 1,
                      8 + (size_t)N,
                      8 + (size_t)N + 1,
                      8 + (size_t)N + data / 2,
                      len - 1,
                      (size_t)tu_randint(1, (int)len - 1) };
    unsigned char *snap[NSET];
    snapshot(&b, snap);
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        file_write(cut, f, cuts[c]);
        sg_status st = sg_checkpoint_load(ctx, cut, b.e, b.n, NULL, 0);
        TU_CHECK(st == SG_ERR_INVALID, "cut at %zu of %zu bytes: %s (%s)", cuts[c], len,
                 sg_status_name(st), sg_ctx_last_error(ctx));
        TU_CHECK(strstr(sg_ctx_last_error(ctx), cut) != NULL,
                 "cut at %zu: message lacks the file: %s", cuts[c], sg_ctx_last_error(ctx));
        TU_CHECK(same_as(&b, snap), "cut at %zu: a failed load wrote a tensor", cuts[c]);
    }
    /* One byte too many is corrupt too. */
    unsigned char *longer = malloc(len + 1);
    memcpy(longer, f, len);
    longer[len] = 0;
    file_write(cut, longer, len + 1);
    TU_FAILS(ctx, sg_checkpoint_load(ctx, cut, b.e, b.n, NULL, 0), SG_ERR_INVALID,
             "follow the last tensor");
    TU_CHECK(same_as(&b, snap), "a failed load wrote a tensor");
    /* The header length field itself damaged. */
    uint64_t lens[] = {0, N - 8, N + 8, N + data, (uint64_t)1 << 40, UINT64_MAX};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        memcpy(longer, f, len);
        for (int i = 0; i < 8; i++) longer[i] = (unsigned char)(lens[k] >> (8 * i));
        file_write(cut, longer, len);
        sg_status st = sg_checkpoint_load(ctx, cut, b.e, b.n, NULL, 0);
        TU_CHECK(st == SG_ERR_INVALID, "header length %llu: %s (%s)", (unsigned long long)lens[k],
                 sg_status_name(st), sg_ctx_last_error(ctx));
        TU_CHECK(strstr(sg_ctx_last_error(ctx), cut) != NULL, "message lacks the file: %s",
                 sg_ctx_last_error(ctx));
        TU_CHECK(same_as(&b, snap), "header length %llu: a failed load wrote a tensor",
                 (unsigned long long)lens[k]);
    }
    free(longer);
    free_snapshot(&b, snap);
    free(f);
    free_set(&a);
    free_set(&b);
}

/* ---- corrupt headers, written by hand ---- */

/* A file with the given header text (padded to 8) and data bytes. */
static void write_st(const char *path, const char *header, const unsigned char *data, size_t n)
{
    size_t hl = strlen(header), padded = (hl + 7) / 8 * 8;
    unsigned char *f = malloc(8 + padded + n);
    for (int i = 0; i < 8; i++) f[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(f + 8, header, hl);
    memset(f + 8 + hl, ' ', padded - hl);
    if (n) memcpy(f + 8 + padded, data, n);
    file_write(path, f, 8 + padded + n);
    free(f);
}

typedef struct bad_case {
    const char *header;
    size_t data;          /* data bytes after the header */
    sg_status want;
    const char *needle;   /* besides the path */
} bad_case;

#define A_OK "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"
#define B_OK "\"b\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[24,40]}"

static void check_corrupt(sg_ctx *ctx)
{
    char path[256];
    tpath(path, sizeof path, "hand.safetensors");
    sg_tensor *a = tu_tensor2(ctx, SG_DTYPE_F32, 2, 3, "a"),
              *b = tu_tensor1(ctx, SG_DTYPE_I32, 4, "b");
    sg_ckpt_entry e[2] = {{"a", a}, {"b", b}};
    unsigned char data[64];
    /* Bytes below 0x80: every float read from them, at any offset, has a clear top exponent
     * bit, so is finite (NaN or Inf would be refused, whatever the header). */
    for (int i = 0; i < 64; i++) data[i] = (unsigned char)(tu_next() & 0x7f);

    /* The harness makes valid files: these load (offsets need not follow the key order). */
    const char *good[] = {
        "{" A_OK "," B_OK "}",
        "{" B_OK "," A_OK "}",
        "{\"b\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[0,16]},"
        "\"a\":{\"shape\":[2,3],\"data_offsets\":[16,40],\"dtype\":\"F32\"}}",
        "{\"__metadata__\":{\"k\":\"\\u00e9\\ud83d\\ude00\"}," A_OK "," B_OK "}",
        "{\"__metadata__\":{},\n " A_OK " , " B_OK "\t}\r\n",
        "{\"\\u0061\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}," B_OK "}",
    };
    for (size_t g = 0; g < sizeof good / sizeof good[0]; g++) {
        write_st(path, good[g], data, 40);
        fill_random_bits(a), fill_random_bits(b);
        TU_OK(ctx, sg_checkpoint_load(ctx, path, e, 2, NULL, 0));
        unsigned char *ga = tensor_bytes(a), *gb = tensor_bytes(b);
        size_t ao = g == 2 ? 16 : 0, bo = g == 2 ? 0 : 24;
        TU_CHECK(!memcmp(ga, data + ao, 24) && !memcmp(gb, data + bo, 16),
                 "good header %zu loaded wrong bytes", g);
        free(ga), free(gb);
    }

    const bad_case bad[] = {
        { "[" A_OK "]", 40, SG_ERR_INVALID, "begin with '{'" },
        { "{" A_OK "," B_OK, 40, SG_ERR_INVALID, "JSON" },
        { "{" A_OK "," B_OK ",}", 40, SG_ERR_INVALID, "JSON" },
        { "{" A_OK "," B_OK "} x", 40, SG_ERR_INVALID, "after the header" },
        { "{" A_OK "," B_OK "}{}", 40, SG_ERR_INVALID, "after the header" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_INVALID, "integer" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3.0],\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_INVALID, "fraction" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,03],\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_INVALID, "leading zero" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3e0],\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_INVALID, "JSON" },
        { "{\"a\":{\"dtype\":true,\"shape\":[2,3],\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_INVALID, "JSON" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":null,\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_INVALID, "JSON" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,99999999999999999999]}," B_OK
          "}",
          40, SG_ERR_INVALID, "overflow" },
        { "{" A_OK "," A_OK "," B_OK "}", 40, SG_ERR_INVALID, "duplicate key" },
        { "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}," B_OK
          "}",
          40, SG_ERR_INVALID, "duplicate key" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],\"x\":[]}," B_OK "}",
          40, SG_ERR_INVALID, "unknown field" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3]}," B_OK "}", 40, SG_ERR_INVALID,
          "lacks data_offsets" },
        { "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,24]}," B_OK "}", 40, SG_ERR_INVALID,
          "lacks shape" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0]}," B_OK "}", 40,
          SG_ERR_INVALID, "2 integers" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24,40]}," B_OK "}", 40,
          SG_ERR_INVALID, "longer than" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]},"
          "\"b\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[20,36]}}",
          36, SG_ERR_INVALID, "needs 24 bytes" },
        { "{" A_OK ",\"b\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[20,36]}}", 40,
          SG_ERR_INVALID, "contiguous" },
        { "{" A_OK ",\"b\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[28,44]}}", 44,
          SG_ERR_INVALID, "contiguous" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[16,40]},"
          "\"b\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[16,0]}}",
          40, SG_ERR_INVALID, "end before" },
        { "{" A_OK "," B_OK "}", 48, SG_ERR_INVALID, "follow the last tensor" },
        { "{" A_OK "," B_OK "}", 39, SG_ERR_INVALID, "truncated" },
        { "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_INVALID, "UTF-8" },
        { "{\"a\\q\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_INVALID, "escape" },
        { "{\"a\\ud800\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_INVALID, "surrogate" },
        { "{\"a\n\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_INVALID, "control character" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}," B_OK, 40,
          SG_ERR_INVALID, "JSON" },
        { "{\"__metadata__\":null," A_OK "," B_OK "}", 40, SG_ERR_INVALID, "JSON" },
        { "{\"__metadata__\":{\"k\":1}," A_OK "," B_OK "}", 40, SG_ERR_INVALID, "JSON" },
        { "{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}," A_OK "," B_OK "}", 40, SG_ERR_INVALID,
          "duplicate key" },
        { "{\"a\":[2,3]," B_OK "}", 40, SG_ERR_INVALID, "JSON" },
        { "", 0, SG_ERR_INVALID, "begin with '{'" },
        /* mismatches, named by tensor */
        { "{\"a\":{\"dtype\":\"I32\",\"shape\":[2,3],\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_DTYPE, "'a'" },
        { "{\"a\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
          "\"b\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[12,28]}}",
          28, SG_ERR_DTYPE, "'a'" },
        { "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
          "\"b\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[12,28]}}",
          28, SG_ERR_DTYPE, "'a'" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_SHAPE, "'a'" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]}," B_OK "}", 40,
          SG_ERR_SHAPE, "'a'" },
        { "{" A_OK ",\"b\":{\"dtype\":\"I32\",\"shape\":[1,4],\"data_offsets\":[24,40]}}", 40,
          SG_ERR_SHAPE, "'b'" },
        { "{" A_OK "}", 24, SG_ERR_INVALID, "'b' is not in the file" },
        { "{" A_OK ",\"B\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[24,40]}}", 40,
          SG_ERR_INVALID, "'b' is not in the file" },
        { "{" A_OK "," B_OK ",\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[40,44]}}",
          44, SG_ERR_INVALID, "'c'" },
    };
    fill_random_bits(a), fill_random_bits(b);
    unsigned char *sa = tensor_bytes(a), *sb = tensor_bytes(b);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        write_st(path, bad[k].header, data, bad[k].data);
        sg_status st = sg_checkpoint_load(ctx, path, e, 2, NULL, 0);
        const char *msg = sg_ctx_last_error(ctx);
        TU_CHECK(st == bad[k].want, "case %zu: %s, expected %s (%s)", k, sg_status_name(st),
                 sg_status_name(bad[k].want), msg);
        TU_CHECK(strstr(msg, path) && strstr(msg, bad[k].needle),
                 "case %zu: message lacks the file or '%s': %s", k, bad[k].needle, msg);
        unsigned char *ga = tensor_bytes(a), *gb = tensor_bytes(b);
        TU_CHECK(!memcmp(ga, sa, 24) && !memcmp(gb, sb, 16),
                 "case %zu: a failed load wrote a tensor", k);
        free(ga), free(gb);
    }
    free(sa), free(sb);
    sg_tensor_destroy(a), sg_tensor_destroy(b);
}

/* Random single-byte damage to a saved header: every load either fails, naming the file and
 * writing nothing, or (the damage was harmless, e.g. a padding space turned into a newline)
 * loads exactly what was saved. Never wrong data. */
static void check_random_damage(sg_ctx *ctx)
{
    char path[256], bad[256];
    tpath(path, sizeof path, "src.safetensors");
    tpath(bad, sizeof bad, "damaged.safetensors");
    tset a = make_set(ctx, NULL), b = make_set(ctx, &a);
    TU_OK(ctx, sg_checkpoint_save(ctx, path, a.e, a.n, NULL));
    size_t len;
    unsigned char *f = tu_file_read(path, &len);
    uint64_t N = 0;
    for (int i = 0; i < 8; i++) N |= (uint64_t)f[i] << (8 * i);
    unsigned char *sa[NSET], *sb[NSET];
    snapshot(&a, sa);
    snapshot(&b, sb);
    int trials = 150, refused = 0;
    for (int k = 0; k < trials; k++) {
        size_t at = 8 + (size_t)(tu_next() % N);
        unsigned char old = f[at];
        f[at] = (unsigned char)(old ^ (unsigned char)tu_randint(1, 255));
        file_write(bad, f, len);
        sg_status st = sg_checkpoint_load(ctx, bad, b.e, b.n, NULL, 0);
        if (st != SG_OK) {
            refused++;
            TU_CHECK(strstr(sg_ctx_last_error(ctx), bad) != NULL, "message lacks the file: %s",
                     sg_ctx_last_error(ctx));
            TU_CHECK(same_as(&b, sb),
                     "damage at byte %zu ('%c' -> 0x%02x): a failed load wrote a tensor", at, old,
                     f[at]);
        } else {
            TU_CHECK(same_as(&b, sa), "damage at byte %zu ('%c' -> 0x%02x) loaded wrong data", at,
                     old, f[at]);
            for (int i = 0; i < b.n; i++)
                TU_OK(ctx, sg_tensor_copy_from_host(b.e[i].t, sb[i], sg_tensor_nbytes(b.e[i].t)));
        }
        f[at] = old;
    }
    TU_CHECK(refused >= trials * 9 / 10, "only %d of %d damaged headers refused", refused, trials);
    free_snapshot(&a, sa);
    free_snapshot(&b, sb);
    free(f);
    free_set(&a);
    free_set(&b);
}

/* ---- atomic saves ---- */

static void check_atomic(sg_ctx *ctx)
{
    char path[256], nodir[256], missing[256];
    tpath(path, sizeof path, "atomic.safetensors");
    tpath(missing, sizeof missing, "no-such.safetensors");
    snprintf(nodir, sizeof nodir, "%s/no-such-dir/sub/ck.safetensors", tdir);
    tset a = make_set(ctx, NULL), c = make_set(ctx, &a);

    /* A directory that does not exist: SG_ERR_IO naming the path, nothing created. */
    TU_FAILS(ctx, sg_checkpoint_save(ctx, nodir, a.e, a.n, NULL), SG_ERR_IO, nodir);
    struct stat sb;
    char parent[256];
    snprintf(parent, sizeof parent, "%s/no-such-dir", tdir);
    TU_CHECK(stat(parent, &sb) != 0, "the failed save created %s", parent);
    TU_CHECK(count_temporaries(tdir) == 0, "a temporary was left behind");
    TU_FAILS(ctx, sg_checkpoint_load(ctx, missing, a.e, a.n, NULL, 0), SG_ERR_IO, missing);
    TU_FAILS(ctx, sg_checkpoint_load(ctx, tdir, a.e, a.n, NULL, 0), SG_ERR_INVALID, tdir); /* not a regular file */

    /* A path that is a directory: refused before a temporary is made. */
    char dirpath[256];
    tpath(dirpath, sizeof dirpath, "a-directory");
    mkdir(dirpath, 0700);
    TU_FAILS(ctx, sg_checkpoint_save(ctx, dirpath, a.e, a.n, NULL), SG_ERR_IO, dirpath);
    TU_CHECK(count_temporaries(tdir) == 0, "the failed rename left its temporary");
    rmdir(dirpath);

    /* Success replaces the file: it now loads c's contents. */
    TU_OK(ctx, sg_checkpoint_save(ctx, path, a.e, a.n, NULL));
    sg_tensor *big = tu_tensor1(ctx, SG_DTYPE_F32, 1 << 18, "big"); /* 1 MiB */
    fill_random_bits(big);
    sg_ckpt_entry with_big[NSET + 1];
    memcpy(with_big, c.e, sizeof c.e);
    with_big[NSET] = (sg_ckpt_entry){"big", big};
    TU_OK(ctx, sg_checkpoint_save(ctx, path, with_big, NSET + 1, NULL));
    unsigned char *sc[NSET];
    snapshot(&c, sc);
    unsigned char *big_bytes = tensor_bytes(big);
    fill_random_bits(big);
    for (int i = 0; i < NSET; i++) fill_random_bits(c.e[i].t);
    TU_OK(ctx, sg_checkpoint_load(ctx, path, with_big, NSET + 1, NULL, 0));
    TU_CHECK(same_as(&c, sc), "the replaced file does not hold the new tensors");
    unsigned char *bb = tensor_bytes(big);
    TU_CHECK(!memcmp(bb, big_bytes, sg_tensor_nbytes(big)), "big tensor did not round-trip");
    free(bb), free(big_bytes);
    /* Loading the new file with the old entry list: the extra tensor is named. */
    TU_FAILS(ctx, sg_checkpoint_load(ctx, path, c.e, NSET, NULL, 0), SG_ERR_INVALID, "'big'");
    free_snapshot(&c, sc);
    sg_tensor_destroy(big);
    free_set(&a);
    free_set(&c);
}

/* ---- editing saved files: a metadata value, one tensor element ---- */

/* The bytes of path and its header length N. */
static unsigned char *file_with_header(const char *path, size_t *len, uint64_t *N)
{
    unsigned char *f = tu_file_read(path, len);
    *N = 0;
    for (int i = 0; i < 8; i++) *N |= (uint64_t)f[i] << (8 * i);
    return f;
}

/* src copied to dst with metadata key set to value (NULL: the key removed) and the header
 * padded again; the data as it was. The saver writes compact JSON with plain values, so the
 * metadata opens the header and the pair reads "key":"old". */
static void meta_rewrite(const char *src, const char *dst, const char *key, const char *value)
{
    size_t len;
    uint64_t N;
    unsigned char *f = file_with_header(src, &len, &N);
    char *h = calloc(N + 1, 1), *out = calloc(N + strlen(value ? value : "") + 64, 1), pat[64];
    memcpy(h, f + 8, N);
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    char *at = strstr(h, pat), *meta_end = strchr(h, '}');
    TU_CHECK(at && at < meta_end, "no metadata %s in %s", key, src);
    if (at && at < meta_end) {
        char *rest = strchr(at + strlen(pat), '"') + 1;
        if (!value && *rest == ',') rest++;
        else if (!value && at[-1] == ',') at--; /* the last pair: drop the comma before it */
        while (N && h[N - 1] == ' ') h[--N] = '\0';
        sprintf(out, "%.*s%s%s%s%s", (int)(at - h), h, value ? pat : "", value ? value : "",
                value ? "\"" : "", rest);
        uint64_t N0 = 0;
        for (int i = 0; i < 8; i++) N0 |= (uint64_t)f[i] << (8 * i);
        write_st(dst, out, f + 8 + N0, len - 8 - (size_t)N0);
    }
    free(h), free(out), free(f);
}

/* Where tensor name's data lies in a file the saver wrote (bytes from the file's start), and
 * its element size: "name":{"dtype":"F32","shape":[...],"data_offsets":[b,e]}. */
static size_t tensor_at(const unsigned char *f, uint64_t N, const char *name, size_t *es,
                        size_t *numel)
{
    char *h = calloc(N + 1, 1), key[160];
    memcpy(h, f + 8, N);
    json_name(name, key, sizeof key - 16);
    strcat(key, ":{\"dtype\":\"");
    char *at = strstr(h, key), *q;
    TU_CHECK(at != NULL, "the header lacks tensor %s", key);
    if (!at) exit(1);
    at += strlen(key);
    *es = !strncmp(at, "F64", 3) ? 8 : !strncmp(at, "BF16", 4) ? 2 : 4;
    at = strstr(at, "\"data_offsets\":[") + strlen("\"data_offsets\":[");
    size_t b = strtoull(at, &q, 10), e = strtoull(q + 1, NULL, 10);
    *numel = (e - b) / *es;
    free(h);
    return 8 + (size_t)N + b;
}

/* Element elem of tensor name in the file at path set to NaN, Inf or -Inf (which 0, 1, 2). */
static void poke_nonfinite(const char *path, const char *name, size_t elem, int which)
{
    size_t len, es, numel;
    uint64_t N;
    unsigned char *f = file_with_header(path, &len, &N);
    size_t at = tensor_at(f, N, name, &es, &numel) + elem * es;
    uint64_t mask = exponent_mask(es == 8 ? SG_DTYPE_F64 : es == 2 ? SG_DTYPE_BF16 : SG_DTYPE_F32);
    uint64_t v = mask | (which == 0 ? mask >> 1 & ~mask : 0) | (which == 2 ? mask << 1 : 0);
    memcpy(f + at, &v, es); /* little-endian host */
    file_write(path, f, len);
    free(f);
}

static const char *const nonfinite_names[3] = {"NaN", "Inf", "-Inf"};

/* ---- non-finite values: never loaded, never saved ---- */

static void check_nonfinite(sg_ctx *ctx)
{
    char path[256], bad[256], needle[128];
    tpath(path, sizeof path, "finite.safetensors");
    tpath(bad, sizeof bad, "nonfinite.safetensors");
    tset a = make_set(ctx, NULL), b = make_set(ctx, &a);
    TU_OK(ctx, sg_checkpoint_save(ctx, path, a.e, a.n, NULL));
    size_t len;
    unsigned char *good = tu_file_read(path, &len), *snap[NSET];
    snapshot(&b, snap);
    int tried = 0;
    for (int i = 0; i < a.n; i++) {
        const sg_tensor *t = a.e[i].t;
        if (!exponent_mask(t->dtype)) continue;
        size_t elem = (size_t)tu_randint(0, (int)sg_tensor_numel(t) - 1);
        int which = tu_randint(0, 2);
        file_write(bad, good, len);
        poke_nonfinite(bad, a.e[i].name, elem, which);
        snprintf(needle, sizeof needle, "(%s) at element %zu:", nonfinite_names[which], elem);
        TU_FAILS(ctx, sg_checkpoint_load(ctx, bad, b.e, b.n, NULL, 0), SG_ERR_INVALID, needle);
        TU_CHECK(strstr(sg_ctx_last_error(ctx), a.e[i].name) && strstr(sg_ctx_last_error(ctx), bad),
                 "message lacks tensor '%s' or the file: %s", a.e[i].name, sg_ctx_last_error(ctx));
        TU_CHECK(same_as(&b, snap), "%s %s in '%s': a refused load wrote a tensor",
                 sg_dtype_name(t->dtype), nonfinite_names[which], a.e[i].name);
        tried++;
    }
    TU_CHECK(tried >= (ctx->backend == SG_BACKEND_CPU ? 3 : 2), "only %d floating tensors", tried);

    /* Saving one: refused naming it, the existing file untouched, no temporary left. */
    for (int i = 0; i < a.n; i++) {
        sg_tensor *t = a.e[i].t;
        if (!exponent_mask(t->dtype)) continue;
        size_t es = sg_dtype_size(t->dtype), elem = (size_t)tu_randint(0, (int)sg_tensor_numel(t) - 1);
        unsigned char *h = tensor_bytes(t);
        int which = tu_randint(0, 2);
        uint64_t mask = exponent_mask(t->dtype);
        uint64_t v = mask | (which == 0 ? mask >> 1 & ~mask : 0) | (which == 2 ? mask << 1 : 0);
        memcpy(h + elem * es, &v, es);
        TU_OK(ctx, sg_tensor_copy_from_host(t, h, sg_tensor_nbytes(t)));
        snprintf(needle, sizeof needle, "tensor '%s' holds a non-finite value (%s) at element %zu:",
                 a.e[i].name, nonfinite_names[which], elem);
        TU_FAILS(ctx, sg_checkpoint_save(ctx, path, a.e, a.n, NULL), SG_ERR_INVALID, needle);
        size_t len1;
        unsigned char *now = tu_file_read(path, &len1);
        TU_CHECK(len1 == len && !memcmp(now, good, len), "a refused save changed the file");
        TU_CHECK(count_temporaries(tdir) == 0, "a refused save left its temporary");
        free(now), free(h);
        fill_random_bits(t);
    }
    free_snapshot(&b, snap);
    free(good);
    free_set(&a);
    free_set(&b);
}

/* ---- files that are not regular files: refused at once, never read ---- */

static void check_not_regular(sg_ctx *ctx)
{
    char fifo[256], sock[256];
    tpath(fifo, sizeof fifo, "fifo.safetensors");
    tpath(sock, sizeof sock, "sock.safetensors");
    sg_tensor *x = tu_tensor1(ctx, SG_DTYPE_F32, 4, "x");
    sg_ckpt_entry e[1] = {{"x", x}};
    TU_CHECK(mkfifo(fifo, 0600) == 0, "mkfifo %s: %s", fifo, strerror(errno));
    /* Opening a FIFO without a writer blocks for good: the alarm ends the test if it does. */
    alarm(20);
    TU_FAILS(ctx, sg_checkpoint_load(ctx, fifo, e, 1, NULL, 0), SG_ERR_INVALID, "is a FIFO");
    TU_FAILS(ctx, sg_checkpoint_load(ctx, "/dev/zero", e, 1, NULL, 0), SG_ERR_INVALID,
             "'/dev/zero' is a character device");
    TU_FAILS(ctx, sg_checkpoint_load(ctx, tdir, e, 1, NULL, 0), SG_ERR_INVALID, "is a directory");
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, sock, strlen(sock) + 1); /* tdir is short: it fits */
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
        TU_FAILS(ctx, sg_checkpoint_load(ctx, sock, e, 1, NULL, 0), SG_ERR_INVALID, "is a socket");
    else
        printf("note: cannot bind a socket at %s (%s): the socket case is skipped\n", sock,
               strerror(errno));
    alarm(0);
    if (fd >= 0) close(fd);
    remove(sock);
    /* Saving over the FIFO is refused too, and the FIFO stays a FIFO. */
    TU_FAILS(ctx, sg_checkpoint_save(ctx, fifo, e, 1, NULL), SG_ERR_IO, "is a FIFO");
    struct stat sb;
    TU_CHECK(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO was replaced");
    remove(fifo);
    sg_tensor_destroy(x);
}

/* ---- a header with very many keys: refused in n log n, not n^2 ---- */

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void check_many_keys(sg_ctx *ctx)
{
    enum { KEYS = 200000 };
    char path[256];
    tpath(path, sizeof path, "many.safetensors");
    sg_tensor *x = tu_tensor1(ctx, SG_DTYPE_F32, 1, "t0");
    sg_ckpt_entry e[1] = {{"t0", x}};
    size_t cap = (size_t)KEYS * 80 + 256, n;
    char *h = malloc(cap);
    unsigned char *data = calloc((size_t)KEYS, 4);
    /* (a) KEYS one-element tensors: the first asked for, every other one an extra. */
    n = (size_t)sprintf(h, "{");
    for (int i = 0; i < KEYS; i++)
        n += (size_t)sprintf(h + n, "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                             i ? "," : "", i, 4 * i, 4 * i + 4);
    sprintf(h + n, "}");
    write_st(path, h, data, (size_t)KEYS * 4);
    double t0 = cpu_seconds();
    TU_FAILS(ctx, sg_checkpoint_load(ctx, path, e, 1, NULL, 0), SG_ERR_INVALID, "not asked for");
    double t_tensors = cpu_seconds() - t0;
    /* (b) KEYS metadata keys, the last a duplicate of one in the middle. */
    n = (size_t)sprintf(h, "{\"__metadata__\":{");
    for (int i = 0; i < KEYS; i++) n += (size_t)sprintf(h + n, "%s\"k%d\":\"v\"", i ? "," : "", i);
    sprintf(h + n, ",\"k%d\":\"w\"},\"t0\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
            KEYS / 2);
    write_st(path, h, data, 4);
    char needle[64];
    snprintf(needle, sizeof needle, "duplicate key \"k%d\"", KEYS / 2);
    t0 = cpu_seconds();
    TU_FAILS(ctx, sg_checkpoint_load(ctx, path, e, 1, NULL, 0), SG_ERR_INVALID, needle);
    double t_meta = cpu_seconds() - t0;
    /* Generous: the quadratic parser took over 60 s for each; this one about 0.2-0.8 s. */
    TU_CHECK(t_tensors < 5 && t_meta < 5, "a %d-key header took %.2f s (tensors) and %.2f s "
             "(metadata) of CPU to refuse", KEYS, t_tensors, t_meta);
    printf("test_checkpoint: %d-key headers refused in %.2f s (tensors), %.2f s (metadata)\n", KEYS,
           t_tensors, t_meta);
    remove(path);
    free(h), free(data);
    sg_tensor_destroy(x);
}

/* ---- the save target: checked up front, its mode kept, links written through, stale
 * temporaries removed ---- */

static mode_t mode_of(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_mode & 07777 : (mode_t)-1;
}

static void check_save_target(sg_ctx *ctx)
{
    char p[256], q[320], sub[128], link[256];
    tset a = make_set(ctx, NULL), b = make_set(ctx, &a);

    /* Refused before anything is written, by sg_checkpoint_check_path and by the save. */
    snprintf(p, sizeof p, "%s/missing-dir/ck.safetensors", tdir);
    TU_FAILS(ctx, sg_checkpoint_check_path(ctx, p), SG_ERR_IO, "does not exist");
    TU_FAILS(ctx, sg_checkpoint_check_path(ctx, ""), SG_ERR_INVALID, "empty");
    TU_FAILS(ctx, sg_checkpoint_save(ctx, "", a.e, a.n, NULL), SG_ERR_INVALID, "empty");
    TU_FAILS(ctx, sg_checkpoint_check_path(ctx, tdir), SG_ERR_IO, "is a directory");
    TU_FAILS(ctx, sg_checkpoint_check_path(ctx, "/dev/null"), SG_ERR_IO,
             "'/dev/null' is a character device");
    tpath(p, sizeof p, "plain.safetensors");
    file_write(p, "x", 1);
    snprintf(q, sizeof q, "%s/under-a-file.safetensors", p);
    TU_FAILS(ctx, sg_checkpoint_check_path(ctx, q), SG_ERR_IO, q);
    TU_OK(ctx, sg_checkpoint_check_path(ctx, p)); /* a regular file */
    remove(p);
    TU_OK(ctx, sg_checkpoint_check_path(ctx, p)); /* absent, in a writable directory */
    if (geteuid() != 0) { /* root may write anywhere */
        tpath(sub, sizeof sub, "read-only");
        mkdir(sub, 0500);
        snprintf(q, sizeof q, "%s/ck.safetensors", sub);
        TU_FAILS(ctx, sg_checkpoint_check_path(ctx, q), SG_ERR_IO, "not writable");
        rmdir(sub);
    }
    /* A device node of our own (not /dev/null: a broken check would replace it): the save is
     * refused and the node stays. mknod needs root and a container that allows it. */
    struct stat dn;
    tpath(q, sizeof q, "null-device");
    if (stat("/dev/null", &dn) == 0 && mknod(q, S_IFCHR | 0666, dn.st_rdev) == 0) {
        TU_FAILS(ctx, sg_checkpoint_save(ctx, q, a.e, a.n, NULL), SG_ERR_IO, "character device");
        struct stat sb;
        TU_CHECK(lstat(q, &sb) == 0 && S_ISCHR(sb.st_mode), "the device node was replaced");
        remove(q);
    } else {
        printf("note: mknod refused (%s): the device-node save case is skipped\n", strerror(errno));
    }
    TU_CHECK(count_temporaries(tdir) == 0, "a refused save left a temporary");

    /* The mode of an existing file is kept; a new file gets 0666 & ~umask. */
    mode_t um = umask(022);
    umask(um);
    tpath(p, sizeof p, "mode.safetensors");
    TU_OK(ctx, sg_checkpoint_save(ctx, p, a.e, a.n, NULL));
    TU_CHECK(mode_of(p) == (0666 & ~um), "a new file has mode %04o, expected %04o",
             (unsigned)mode_of(p), (unsigned)(0666 & ~um));
    static const mode_t modes[] = {0600, 0640, 0604, 0400, 0660};
    mode_t want = modes[tu_randint(0, 4)];
    chmod(p, want);
    TU_OK(ctx, sg_checkpoint_save(ctx, p, b.e, b.n, NULL));
    TU_CHECK(mode_of(p) == want, "saving over a %04o file left it %04o", (unsigned)want,
             (unsigned)mode_of(p));
    remove(p);

    /* A symbolic link (into a subdirectory) is written through: the file it names gets the new
     * data, with its temporary beside it; the link stays a link. */
    unsigned char *sa[NSET], *sb[NSET];
    snapshot(&a, sa);
    snapshot(&b, sb);
    tpath(sub, sizeof sub, "real");
    mkdir(sub, 0700);
    snprintf(p, sizeof p, "%s/target.safetensors", sub);
    tpath(link, sizeof link, "link.safetensors");
    TU_OK(ctx, sg_checkpoint_save(ctx, p, b.e, b.n, NULL));
    chmod(p, 0600);
    TU_CHECK(symlink("real/target.safetensors", link) == 0, "symlink: %s", strerror(errno));
    TU_OK(ctx, sg_checkpoint_check_path(ctx, link));
    TU_OK(ctx, sg_checkpoint_save(ctx, link, a.e, a.n, NULL));
    struct stat ls;
    char to[256] = "";
    ssize_t k = readlink(link, to, sizeof to - 1);
    to[k > 0 ? k : 0] = '\0';
    TU_CHECK(lstat(link, &ls) == 0 && S_ISLNK(ls.st_mode) && !strcmp(to, "real/target.safetensors"),
             "the link was replaced (now '%s')", to);
    TU_CHECK(mode_of(p) == 0600, "the linked file's mode became %04o", (unsigned)mode_of(p));
    TU_OK(ctx, sg_checkpoint_load(ctx, p, b.e, b.n, NULL, 0));
    TU_CHECK(same_as(&b, sa), "the file the link names does not hold the new data");
    TU_CHECK(count_temporaries(tdir) == 0 && count_temporaries(sub) == 0,
             "a save through a link left a temporary");
    /* A dangling link is refused, and stays dangling. */
    remove(p);
    TU_FAILS(ctx, sg_checkpoint_check_path(ctx, link), SG_ERR_IO, "does not exist");
    TU_FAILS(ctx, sg_checkpoint_save(ctx, link, a.e, a.n, NULL), SG_ERR_IO, "does not exist");
    TU_CHECK(lstat(p, &ls) != 0 && lstat(link, &ls) == 0 && S_ISLNK(ls.st_mode),
             "a save through a dangling link created a file");
    remove(link);
    rmdir(sub);

    /* Stale temporaries: one of a process that has exited (a reaped child) and one of this
     * process's own pid (an earlier process had it) are removed; one of a live process (the
     * parent) and names that only look alike stay. */
    pid_t child = fork();
    if (child == 0) _exit(0);
    TU_CHECK(child > 0 && waitpid(child, NULL, 0) == child, "fork/waitpid: %s", strerror(errno));
    tpath(p, sizeof p, "stale.safetensors");
    char dead[320], own[320], live[320], keep[4][320];
    snprintf(dead, sizeof dead, "%s.tmp.%ld", p, (long)child);
    snprintf(own, sizeof own, "%s.tmp.%ld", p, (long)getpid());
    snprintf(live, sizeof live, "%s.tmp.%ld", p, (long)getppid());
    snprintf(keep[0], sizeof keep[0], "%s.tmp.%ldx", p, (long)child);
    snprintf(keep[1], sizeof keep[1], "%s.tmp.0%ld", p, (long)child);
    snprintf(keep[2], sizeof keep[2], "%s/other.safetensors.tmp.%ld", tdir, (long)child);
    snprintf(keep[3], sizeof keep[3], "%s.tmp.", p);
    file_write(dead, "stale", 5), file_write(own, "stale", 5), file_write(live, "live", 4);
    for (int i = 0; i < 4; i++) file_write(keep[i], "other", 5);
    TU_OK(ctx, sg_checkpoint_save(ctx, p, a.e, a.n, NULL));
    struct stat st;
    TU_CHECK(stat(dead, &st) != 0, "the temporary of exited pid %ld stayed", (long)child);
    TU_CHECK(stat(own, &st) != 0, "the stale temporary of this pid stayed");
    TU_CHECK(stat(live, &st) == 0, "the temporary of live pid %ld was removed", (long)getppid());
    for (int i = 0; i < 4; i++) TU_CHECK(stat(keep[i], &st) == 0, "%s was removed", keep[i]);
    TU_OK(ctx, sg_checkpoint_load(ctx, p, b.e, b.n, NULL, 0));
    TU_CHECK(same_as(&b, sa), "the save among stale temporaries wrote wrong data");
    remove(live), remove(p);
    for (int i = 0; i < 4; i++) remove(keep[i]);
    free_snapshot(&a, sa);
    free_snapshot(&b, sb);
    free_set(&a);
    free_set(&b);
}

/* ---- a full disk: the old checkpoint intact, no temporary left ---- */

/* In a child, so that the file size limit and the ignored SIGXFSZ end with it: the write of
 * a 1 MiB tensor fails with EFBIG, as on a full disk. */
static void check_disk_full(sg_ctx *ctx)
{
    if (ctx->backend != SG_BACKEND_CPU) return; /* a forked child cannot use the parent's CUDA */
    char path[256];
    tpath(path, sizeof path, "full-disk.safetensors");
    tset a = make_set(ctx, NULL);
    TU_OK(ctx, sg_checkpoint_save(ctx, path, a.e, a.n, NULL));
    chmod(path, 0600);
    size_t len0, len1;
    unsigned char *before = tu_file_read(path, &len0);
    sg_tensor *big = tu_tensor1(ctx, SG_DTYPE_F32, 1 << 18, "big");
    fill_random_bits(big);
    sg_ckpt_entry e[NSET + 1];
    memcpy(e, a.e, sizeof a.e);
    e[NSET] = (sg_ckpt_entry){"big", big};
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit lim = {256 << 10, 256 << 10};
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(77);
        sg_status st = sg_checkpoint_save(ctx, path, e, NSET + 1, NULL);
        bool named = strstr(sg_ctx_last_error(ctx), path) && strstr(sg_ctx_last_error(ctx), "too large");
        _exit(st == SG_ERR_IO && named ? 0 : 1);
    }
    int ws = 0;
    TU_CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid, "fork: %s", strerror(errno));
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 77) {
        printf("note: setrlimit(RLIMIT_FSIZE) refused: the full-disk case is skipped\n");
    } else {
        TU_CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
                 "the save past the file size limit did not fail with EFBIG named (status %d)", ws);
        unsigned char *after = tu_file_read(path, &len1);
        TU_CHECK(len1 == len0 && !memcmp(before, after, len0), "a failed save changed the file");
        TU_CHECK(mode_of(path) == 0600, "a failed save changed the mode to %04o",
                 (unsigned)mode_of(path));
        TU_CHECK(count_temporaries(tdir) == 0, "the failed save left its temporary");
        free(after);
    }
    remove(path);
    free(before);
    sg_tensor_destroy(big);
    free_set(&a);
}

/* ---- a trainer's checkpoint: metadata and values validated before anything changes ---- */

typedef struct trn {
    sg_ctx *ctx;
    sg_model *m;
    sg_optim *o;
    sg_trainer *t;
} trn;

static trn trn_make_state(sg_ctx *ctx, sg_dtype state)
{
    trn r = {.ctx = ctx};
    TU_OK(ctx, sg_model_create(ctx, "mlp-32-2-8", tu_next(), &r.m));
    TU_OK(ctx, sg_optim_create(ctx, r.m, SG_OPTIM_ADAMW, &r.o));
    TU_OK(ctx, sg_optim_set_state_dtype(r.o, state));
    sg_trainer_options to = sg_trainer_options_default();
    TU_OK(ctx, sg_trainer_create(r.m, r.o, &to, &r.t));
    return r;
}

static trn trn_make(sg_ctx *ctx) { return trn_make_state(ctx, SG_DTYPE_F32); }

static void trn_drop(trn *r)
{
    sg_trainer_destroy(r->t);
    sg_optim_destroy(r->o);
    sg_model_destroy(r->m);
}

/* The trainer's whole state as bytes: parameters, moments, hyperparameters, loss scaler. */
static size_t trn_state(trn *r, unsigned char *out, size_t cap)
{
    sg_tensor *ts[4] = {sg_model_params(r->m)};
    sg_optim_state(r->o, &ts[1], &ts[2], &ts[3]);
    size_t n = 0;
    for (int i = 0; i < 4; i++) {
        size_t nb = sg_tensor_nbytes(ts[i]);
        TU_CHECK(n + nb <= cap, "state buffer too small");
        if (n + nb > cap) exit(1);
        TU_OK(r->ctx, sg_tensor_copy_to_host(ts[i], out + n, nb));
        n += nb;
    }
    sg_loss_scaler ls;
    TU_OK(r->ctx, sg_trainer_get_scaler(r->t, &ls));
    memcpy(out + n, &ls, sizeof ls);
    return n + sizeof ls;
}

#define STATE_CAP (1 << 20)

/* A trainer, its checkpoint at path (step 7) and two more steps: the trainer no longer equals
 * the file, so a load that wrote anything would show. saved/now: the two states (n bytes);
 * got: room for another; bad: where a test writes an edited copy. */
typedef struct trn_case {
    trn r;
    char path[256], bad[256];
    unsigned char *saved, *now, *got;
    size_t n;
} trn_case;

static trn_case trn_case_make(sg_ctx *ctx, const char *name)
{
    trn_case c = {.r = trn_make(ctx)};
    char file[64];
    snprintf(file, sizeof file, "%s.safetensors", name);
    tpath(c.path, sizeof c.path, file);
    snprintf(file, sizeof file, "%s-bad.safetensors", name);
    tpath(c.bad, sizeof c.bad, file);
    c.saved = malloc(STATE_CAP), c.now = malloc(STATE_CAP), c.got = malloc(STATE_CAP);
    TU_OK(ctx, sg_trainer_step(c.r.t, 0));
    TU_OK(ctx, sg_trainer_save(c.r.t, 7, c.path));
    c.n = trn_state(&c.r, c.saved, STATE_CAP);
    TU_OK(ctx, sg_trainer_step(c.r.t, 1));
    TU_OK(ctx, sg_trainer_step(c.r.t, 2));
    trn_state(&c.r, c.now, STATE_CAP);
    TU_CHECK(memcmp(c.saved, c.now, c.n), "two steps changed nothing");
    return c;
}

/* The trainer's state equals want (saved or now). */
static bool trn_case_is(trn_case *c, const unsigned char *want)
{
    return trn_state(&c->r, c->got, STATE_CAP) == c->n && !memcmp(c->got, want, c->n);
}

static void trn_case_drop(trn_case *c)
{
    remove(c->bad);
    free(c->saved), free(c->now), free(c->got);
    trn_drop(&c->r);
}

static void check_trainer_metadata(sg_ctx *ctx)
{
    char needle[256];
    trn_case tc = trn_case_make(ctx, "trainer");
    const char *path = tc.path, *bad = tc.bad;
    static const struct { const char *key, *value; } cases[] = {
        {"step", "abc"}, {"step", ""}, {"step", "1.5"}, {"step", "-5"}, {"step", "+5"},
        {"step", " 5"}, {"step", "5 "}, {"step", "05"}, {"step", "1e3"}, {"step", "0x10"},
        {"step", "9007199254740993"}, {"step", "9223372036854775807"},
        {"step", "99999999999999999999"}, {"precision", "f16"}, {"precision", "F32"},
        {"precision", ""}, {"precision", "i32"}, {"format", "stepgraph-2"}, {"format", ""},
        {"format", NULL}, {"step", NULL}, {"precision", NULL}, {"model", "mlp-32-2-9"},
    };
    int64_t step = -1;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *key = cases[c].key, *v = cases[c].value;
        meta_rewrite(path, bad, key, v);
        if (!v) snprintf(needle, sizeof needle, "metadata %s is missing", key);
        else if (!strcmp(key, "model")) snprintf(needle, sizeof needle, "holds model '%s'", v);
        else snprintf(needle, sizeof needle, "metadata %s '%s'", key, v);
        TU_FAILS(ctx, sg_trainer_load(tc.r.t, bad, &step), SG_ERR_INVALID, needle);
        TU_CHECK(strstr(sg_ctx_last_error(ctx), bad) != NULL, "message lacks the file: %s",
                 sg_ctx_last_error(ctx));
        TU_CHECK(trn_case_is(&tc, tc.now), "metadata %s '%s': a refused load changed the trainer",
                 key, v ? v : "(none)");
    }
    TU_CHECK(step == -1, "a refused load set the step to %lld", (long long)step);
    /* The bounds and the other precision load. */
    static const struct { const char *key, *value; int64_t step; } good[] = {
        {"step", "0", 0}, {"step", "9007199254740992", SG_TRAINER_MAX_STEP},
        {"precision", "bf16", 7}, {"step", "7", 7},
    };
    for (size_t c = 0; c < sizeof good / sizeof good[0]; c++) {
        meta_rewrite(path, bad, good[c].key, good[c].value);
        TU_OK(ctx, sg_trainer_load(tc.r.t, bad, &step));
        TU_CHECK(step == good[c].step, "metadata %s '%s' loaded step %lld", good[c].key,
                 good[c].value, (long long)step);
        TU_CHECK(trn_case_is(&tc, tc.saved),
                 "metadata %s '%s': the load did not restore the saved state", good[c].key,
                 good[c].value);
    }
    /* A step a load would refuse is not saved either. */
    remove(bad);
    TU_FAILS(ctx, sg_trainer_save(tc.r.t, -1, bad), SG_ERR_INVALID, "step -1");
    TU_FAILS(ctx, sg_trainer_save(tc.r.t, SG_TRAINER_MAX_STEP + 1, bad), SG_ERR_INVALID,
             "step 9007199254740993");
    struct stat sb;
    TU_CHECK(stat(bad, &sb) != 0, "a refused save wrote %s", bad);
    trn_case_drop(&tc);
}

/* bf16 optimizer state (sg_optim_set_state_dtype): saved as bf16 with metadata optim_state,
 * restored bit for bit by a trainer that keeps bf16 state, refused (naming both dtypes and the
 * call that sets it, the trainer unchanged) by one that keeps f32, and an f32 checkpoint
 * refused by a bf16 trainer. The dtype is fixed once the optimizer has stepped. */
static void check_trainer_optim_state(sg_ctx *ctx)
{
    char path[256];
    tpath(path, sizeof path, "bf16-state.safetensors");
    trn b = trn_make_state(ctx, SG_DTYPE_BF16);
    TU_CHECK(sg_optim_state_dtype(b.o) == SG_DTYPE_BF16, "the state dtype did not change");
    sg_tensor *m, *v, *hp;
    sg_optim_state(b.o, &m, &v, &hp);
    TU_CHECK(m->dtype == SG_DTYPE_BF16 && v->dtype == SG_DTYPE_BF16, "the moments are %s and %s",
             sg_dtype_name(m->dtype), sg_dtype_name(v->dtype));
    TU_OK(ctx, sg_trainer_step(b.t, 0));
    TU_FAILS(ctx, sg_optim_set_state_dtype(b.o, SG_DTYPE_F32), SG_ERR_INVALID, "already stepped");
    TU_FAILS(ctx, sg_optim_set_state_dtype(b.o, SG_DTYPE_I32), SG_ERR_DTYPE, "expected F32 or BF16");
    TU_OK(ctx, sg_optim_set_state_dtype(b.o, SG_DTYPE_BF16)); /* no change: allowed */
    TU_OK(ctx, sg_trainer_save(b.t, 3, path));
    unsigned char *saved = malloc(STATE_CAP), *now = malloc(STATE_CAP), *got = malloc(STATE_CAP);
    size_t n = trn_state(&b, saved, STATE_CAP);
    TU_OK(ctx, sg_trainer_step(b.t, 1));
    trn_state(&b, now, STATE_CAP);
    TU_CHECK(memcmp(saved, now, n), "a step changed nothing");
    int64_t step = -1;
    TU_OK(ctx, sg_trainer_load(b.t, path, &step));
    TU_CHECK(step == 3 && trn_state(&b, got, STATE_CAP) == n && !memcmp(got, saved, n),
             "the bf16-state checkpoint did not restore the state (step %lld)", (long long)step);
    trn f = trn_make(ctx); /* f32 state */
    size_t nf = trn_state(&f, now, STATE_CAP);
    /* The bf16 trainer holds the smaller state (its f32 state was never allocated: the dtype was
     * set before the trainer made it). */
    sg_trainer_stats sb, sf;
    TU_OK(ctx, sg_trainer_get_stats(b.t, &sb));
    TU_OK(ctx, sg_trainer_get_stats(f.t, &sf));
    TU_CHECK(sb.optim_bytes < sf.optim_bytes, "optimizer state: %zu bytes in bf16, %zu in f32", sb.optim_bytes,
             sf.optim_bytes);
    step = -1;
    TU_FAILS(ctx, sg_trainer_load(f.t, path, &step), SG_ERR_DTYPE,
             "holds bf16 optimizer state, this optimizer keeps f32: set the same with sg_optim_set_state_dtype");
    TU_CHECK(step == -1 && trn_state(&f, got, STATE_CAP) == nf && !memcmp(got, now, nf),
             "a refused load changed the f32 trainer");
    char path32[256];
    tpath(path32, sizeof path32, "f32-state.safetensors");
    TU_OK(ctx, sg_trainer_save(f.t, 1, path32));
    TU_FAILS(ctx, sg_trainer_load(b.t, path32, &step), SG_ERR_DTYPE, "holds f32 optimizer state");
    /* A state already allocated (the trainer made it in f32) is converted, before any step. */
    trn c = trn_make(ctx);
    TU_OK(ctx, sg_optim_set_state_dtype(c.o, SG_DTYPE_BF16));
    sg_optim_state(c.o, &m, &v, &hp);
    TU_CHECK(m && v && m->dtype == SG_DTYPE_BF16 && v->dtype == SG_DTYPE_BF16 &&
                 sg_optim_state_dtype(c.o) == SG_DTYPE_BF16,
             "an allocated f32 state was not converted");
    TU_OK(ctx, sg_trainer_step(c.t, 0));
    trn_drop(&c);
    free(saved), free(now), free(got);
    trn_drop(&f);
    trn_drop(&b);
    remove(path), remove(path32);
}

/* NaN or Inf in a parameter, a moment, the hyperparameters or the loss scaler: refused naming
 * the tensor and the element, the trainer unchanged. */
static void check_trainer_nonfinite(sg_ctx *ctx)
{
    char needle[256];
    trn_case tc = trn_case_make(ctx, "trainer-nan");
    const char *path = tc.path, *bad = tc.bad;
    size_t len;
    unsigned char *good = tu_file_read(path, &len);
    /* A parameter's name: the header's first tensor that is not optimizer or scaler state. */
    char param[128] = "", *h = calloc(len, 1);
    const char *at = h;
    memcpy(h, good + 8, len - 8); /* the header and data, NUL-terminated by the calloc */
    while (!param[0] && (at = strstr(at, ":{\"dtype\""))) {
        const char *open = at - 1;
        while (open > h && *(open - 1) != '"') open--;
        snprintf(param, sizeof param, "%.*s", (int)(at - 1 - open), open);
        if (!strncmp(param, "optim.", 6) || !strncmp(param, "amp.", 4)) param[0] = '\0';
        at++;
    }
    TU_CHECK(param[0], "no parameter in the header");
    const char *names[] = {param, "optim.m", "optim.v", "optim.hparams", "amp.scaler"};
    for (int i = 0; i < 5; i++) {
        uint64_t N;
        size_t es, numel, l2;
        unsigned char *f = file_with_header(path, &l2, &N);
        tensor_at(f, N, names[i], &es, &numel);
        free(f);
        size_t elem = (size_t)tu_randint(0, (int)numel - 1);
        int which = tu_randint(0, 2);
        file_write(bad, good, len);
        poke_nonfinite(bad, names[i], elem, which);
        snprintf(needle, sizeof needle, "tensor '%s' holds a non-finite value (%s) at element %zu:",
                 names[i], nonfinite_names[which], elem);
        int64_t step = -1;
        TU_FAILS(ctx, sg_trainer_load(tc.r.t, bad, &step), SG_ERR_INVALID, needle);
        TU_CHECK(step == -1 && trn_case_is(&tc, tc.now), "%s in '%s': a refused load changed "
                 "the trainer", nonfinite_names[which], names[i]);
    }
    free(h), free(good);
    trn_case_drop(&tc);
}

/* ---- not during capture ---- */

typedef struct save_user {
    sg_ctx *ctx;
    const char *path;
    sg_ckpt_entry e;
} save_user;

static sg_status save_in_step(void *p)
{
    save_user *u = p;
    return sg_checkpoint_save(u->ctx, u->path, &u->e, 1, NULL);
}

static void check_capture(sg_ctx *ctx)
{
    char path[256];
    tpath(path, sizeof path, "captured.safetensors");
    save_user u = {ctx, path, {"x", tu_tensor1(ctx, SG_DTYPE_F32, 16, "x")}};
    sg_graph_options o = sg_graph_options_default();
    o.warmup = 0;
    sg_graph *g = NULL;
    TU_FAILS(ctx, sg_graph_capture(ctx, save_in_step, &u, &o, &g), SG_ERR_CAPTURE,
             "sg_checkpoint_save");
    TU_CHECK(g == NULL, "a graph was kept");
    struct stat sb;
    TU_CHECK(stat(path, &sb) != 0, "a save ran during capture");
    TU_CHECK(count_temporaries(tdir) == 0, "a temporary was left behind");
    sg_tensor_destroy(u.e.t);
}

/* ---- between backends: a GPU checkpoint loads on the CPU and back ---- */

static void check_cross_backend(sg_ctx *gpu)
{
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    char path[256];
    tpath(path, sizeof path, "cross.safetensors");
    tset g = make_set(gpu, NULL), c = make_set(cpu, &g);
    unsigned char *sg[NSET];
    snapshot(&g, sg);
    TU_OK(gpu, sg_checkpoint_save(gpu, path, g.e, g.n, NULL));
    TU_OK(cpu, sg_checkpoint_load(cpu, path, c.e, c.n, NULL, 0));
    TU_CHECK(same_as(&c, sg), "a GPU checkpoint loaded on the CPU differs");
    for (int i = 0; i < c.n; i++) fill_random_bits(c.e[i].t);
    unsigned char *sc[NSET];
    snapshot(&c, sc);
    TU_OK(cpu, sg_checkpoint_save(cpu, path, c.e, c.n, NULL));
    TU_OK(gpu, sg_checkpoint_load(gpu, path, g.e, g.n, NULL, 0));
    TU_CHECK(same_as(&g, sc), "a CPU checkpoint loaded on the GPU differs");
    free_snapshot(&g, sg);
    free_snapshot(&c, sc);
    free_set(&g);
    free_set(&c);
    sg_ctx_destroy(cpu);
}

static void remove_tdir(void)
{
    DIR *d = opendir(tdir);
    if (!d) return;
    struct dirent *de;
    char p[512];
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", tdir, de->d_name);
            remove(p);
        }
    closedir(d);
    rmdir(tdir);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_checkpoint");
    sg_backend be = strcmp(mode, "gpu") ? SG_BACKEND_CPU : SG_BACKEND_CUDA;
    sg_ctx *ctx = tu_ctx(be);
    snprintf(tdir, sizeof tdir, "/tmp/sg_ckpt_XXXXXX");
    if (!mkdtemp(tdir)) {
        fprintf(stderr, "FAIL: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    check_round_trip(ctx);
    check_reference_file(ctx);
    check_truncated(ctx);
    check_corrupt(ctx);
    check_random_damage(ctx);
    check_atomic(ctx);
    check_disk_full(ctx);
    check_nonfinite(ctx);
    check_not_regular(ctx);
    check_many_keys(ctx);
    check_save_target(ctx);
    check_trainer_metadata(ctx);
    check_trainer_nonfinite(ctx);
    check_trainer_optim_state(ctx);
    check_capture(ctx);
    if (be == SG_BACKEND_CUDA) check_cross_backend(ctx);
    sg_ctx_destroy(ctx);
    if (!tu_failures) remove_tdir();
    else fprintf(stderr, "files kept in %s\n", tdir);
    return tu_finish("test_checkpoint");
}
