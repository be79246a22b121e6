/* test_checkpoint.c: safetensors checkpoints. Round trips of random tensors and metadata; the
 * byte layout checked against the format's specification; a file written by the reference
 * implementation (Python safetensors 0.8) loaded, and written again byte for byte; truncated,
 * corrupt and mismatched files refused with the file (and tensor) named and the destination
 * left unchanged; atomic saves. `cpu` runs on the CPU backend; `gpu` runs the same checks on
 * CUDA tensors, and moves a checkpoint between the GPU and the CPU. */
#define _POSIX_C_SOURCE 200809L

#include "testutil.h"

#include "nn/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
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

/* Fresh random bits in every byte (NaN patterns included: the round trip must be bit-exact). */
static void fill_random_bits(sg_tensor *t)
{
    size_t n = sg_tensor_nbytes(t);
    unsigned char *b = malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)tu_next();
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
    for (int i = 0; i < 64; i++) data[i] = (unsigned char)tu_next();

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
    TU_FAILS(ctx, sg_checkpoint_load(ctx, tdir, a.e, a.n, NULL, 0), SG_ERR_IO, tdir);

    /* An existing checkpoint survives a save that fails while writing: the file size limit
     * makes the write itself fail (EFBIG), as a full disk would. */
    TU_OK(ctx, sg_checkpoint_save(ctx, path, a.e, a.n, NULL));
    size_t len0, len1;
    unsigned char *before = tu_file_read(path, &len0);
    sg_tensor *big = tu_tensor1(ctx, SG_DTYPE_F32, 1 << 18, "big"); /* 1 MiB */
    fill_random_bits(big);
    sg_ckpt_entry with_big[NSET + 1];
    memcpy(with_big, c.e, sizeof c.e);
    with_big[NSET] = (sg_ckpt_entry){"big", big};
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 256 << 10;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
        sg_status st = sg_checkpoint_save(ctx, path, with_big, NSET + 1, NULL);
        setrlimit(RLIMIT_FSIZE, &old);
        TU_CHECK(st == SG_ERR_IO, "save past the file size limit: %s (%s)", sg_status_name(st),
                 sg_ctx_last_error(ctx));
        TU_CHECK(strstr(sg_ctx_last_error(ctx), path) != NULL, "message lacks the path: %s",
                 sg_ctx_last_error(ctx));
        unsigned char *after = tu_file_read(path, &len1);
        TU_CHECK(len1 == len0 && !memcmp(before, after, len0),
                 "a failed save changed the existing file");
        free(after);
        TU_CHECK(count_temporaries(tdir) == 0, "the failed save left its temporary");
    } else {
        printf("note: setrlimit(RLIMIT_FSIZE) refused (%s): the write-failure case is skipped\n",
               strerror(errno));
    }
    signal(SIGXFSZ, prev);

    /* A path that is a directory: the rename fails, the temporary goes. */
    char dirpath[256];
    tpath(dirpath, sizeof dirpath, "a-directory");
    mkdir(dirpath, 0700);
    TU_FAILS(ctx, sg_checkpoint_save(ctx, dirpath, a.e, a.n, NULL), SG_ERR_IO, dirpath);
    TU_CHECK(count_temporaries(tdir) == 0, "the failed rename left its temporary");
    rmdir(dirpath);

    /* Success replaces the file: it now loads c's contents. */
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
    free(bb), free(big_bytes), free(before);
    /* Loading the new file with the old entry list: the extra tensor is named. */
    TU_FAILS(ctx, sg_checkpoint_load(ctx, path, c.e, NSET, NULL, 0), SG_ERR_INVALID, "'big'");
    free_snapshot(&c, sc);
    sg_tensor_destroy(big);
    free_set(&a);
    free_set(&c);
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
    check_capture(ctx);
    if (be == SG_BACKEND_CUDA) check_cross_backend(ctx);
    sg_ctx_destroy(ctx);
    if (!tu_failures) remove_tdir();
    else fprintf(stderr, "files kept in %s\n", tdir);
    return tu_finish("test_checkpoint");
}
