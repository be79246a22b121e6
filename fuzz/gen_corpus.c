/* gen_corpus.c: writes the seed corpus of fuzz/corpus/ with the library itself, so the seeds are
 * what the saver writes today: valid checkpoints of fuzz_safetensors.c's table (with and
 * without metadata) and of an mlp-4-1-2 trainer, plus truncated and edited variants, a few
 * text inputs for fuzz_text.c, and .npy files for fuzz_npy.c (as NumPy writes them, and some it
 * refuses). Run by `make fuzz-corpus` (it rewrites the checked-in files):
 *   build/fuzz/fuzz_gen_corpus fuzz/corpus */
#define _GNU_SOURCE /* memmem */

#include "fuzz.h"

#include "nn/checkpoint.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>

int fz_ckpt_table(const sg_ckpt_entry **out);
sg_trainer *fz_trainer(void);

static const char *root;

static void put(const char *target, const char *name, const void *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "gen_corpus: cannot write %s\n", path);
        exit(1);
    }
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    if (fread(b, 1, *n, f) != *n) *n = 0;
    fclose(f);
    return b;
}

/* A saved file's bytes, then removed. */
static unsigned char *saved(sg_status st, const char *path, size_t *n)
{
    if (st != SG_OK) {
        fprintf(stderr, "gen_corpus: saving %s: %s\n", path, sg_status_name(st));
        exit(1);
    }
    unsigned char *b = slurp(path, n);
    unlink(path);
    return b;
}

static uint64_t get_u64le(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

/* The file b (n bytes) with the header's first `from` replaced by `to`, the header's padding
 * (trailing spaces, to a multiple of 8) and length redone, so only the edit is wrong. */
static void edit(const char *name, const unsigned char *b, size_t n, const char *from,
                 const char *to)
{
    size_t hl = (size_t)get_u64le(b), lf = strlen(from), lt = strlen(to);
    const char *h = (const char *)b + 8;
    const char *at = memmem(h, hl, from, lf);
    if (!at) {
        fprintf(stderr, "gen_corpus: %s: '%s' not in the header\n", name, from);
        exit(1);
    }
    size_t nh = hl - lf + lt;
    char *c = malloc(8 + nh + 8 + (n - 8 - hl));
    memcpy(c + 8, h, (size_t)(at - h));
    memcpy(c + 8 + (at - h), to, lt);
    memcpy(c + 8 + (at - h) + lt, at + lf, hl - (size_t)(at - h) - lf);
    while (nh && c[8 + nh - 1] == ' ') nh--;
    while ((8 + nh) % 8) c[8 + nh++] = ' ';
    for (int i = 0; i < 8; i++) c[i] = (char)((uint64_t)nh >> (8 * i));
    memcpy(c + 8 + nh, b + 8 + hl, n - 8 - hl);
    put("safetensors", name, c, 8 + nh + (n - 8 - hl));
    free(c);
}

/* The file b with the first element of F32 tensor `tensor` set to v (NaN, Inf). */
static void poke_f32(const char *name, const unsigned char *b, size_t n, const char *tensor,
                     float v)
{
    size_t hl = (size_t)get_u64le(b);
    char key[128];
    snprintf(key, sizeof key, "\"%s\":{", tensor);
    const char *h = (const char *)b + 8, *at = memmem(h, hl, key, strlen(key));
    const char *off = at ? memmem(at, hl - (size_t)(at - h), "\"data_offsets\":[", 16) : NULL;
    if (!off) {
        fprintf(stderr, "gen_corpus: %s: tensor '%s' not in the header\n", name, tensor);
        exit(1);
    }
    size_t pos = 8 + hl + (size_t)strtoull(off + 16, NULL, 10);
    unsigned char *c = malloc(n);
    memcpy(c, b, n);
    memcpy(c + pos, &v, 4); /* little-endian hosts: as the file stores it */
    put("safetensors", name, c, n);
    free(c);
}

/* A file made of a hand-written header and `data` bytes of tensor data (all 0x3f). */
static void put_header(const char *name, const char *json, size_t data)
{
    size_t nj = strlen(json), n = 8 + nj + data;
    unsigned char *b = malloc(n);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)nj >> (8 * i));
    memcpy(b + 8, json, nj);
    memset(b + 8 + nj, 0x3f, data);
    put("safetensors", name, b, n);
    free(b);
}

/* The table's tensors, in the saver's order, as header text. */
#define TABLE_JSON                                                                            \
    "\"stats\":{\"dtype\":\"F64\",\"shape\":[2,1,2],\"data_offsets\":[0,32]},"                \
    "\"layer.w\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[32,56]},"              \
    "\"count\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[56,60]},"                  \
    "\"layer.b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[60,66]}"

/* Headers the saver never writes: escapes, duplicates, odd numbers and nesting. */
static void hand_written(void)
{
    put_header("escaped-names.safetensors",
               "{\"__metadata__\":{\"k\\u00e9y\":\"\\ud83d\\ude00\\n\\t\\/\"},"
               "\"st\\u0061ts\":{\"dtype\":\"F64\",\"shape\":[2,1,2],\"data_offsets\":[0,32]},"
               "\"layer.w\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[32,56]},"
               "\"count\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[56,60]},"
               "\"layer.b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[60,66]}}",
               66);
    put_header("dup-key.safetensors",
               "{" TABLE_JSON ",\"count\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[56,60]}}", 66);
    put_header("spaces.safetensors", " { " TABLE_JSON " }      ", 66);
    put_header("huge-shape.safetensors",
               "{\"count\":{\"dtype\":\"I32\",\"shape\":[18446744073709551615,4],"
               "\"data_offsets\":[0,18446744073709551612]}}",
               8);
    put_header("neg-float.safetensors",
               "{\"count\":{\"dtype\":\"I32\",\"shape\":[-1.5e3],\"data_offsets\":[0,4]}}", 4);
    put_header("nested-meta.safetensors",
               "{\"__metadata__\":{\"a\":{\"b\":[[[[[[[[1]]]]]]]]}}," TABLE_JSON "}", 66);
    put_header("meta-null.safetensors", "{\"__metadata__\":null," TABLE_JSON "}", 66);
    put_header("nul-in-name.safetensors",
               "{\"co\\u0000unt\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
}

static void checkpoints(void)
{
    const sg_ckpt_entry *e;
    int n = fz_ckpt_table(&e);
    sg_ctx *ctx = e[0].t->ctx; /* the table's context (each file has its own fz_ctx) */
    for (int i = 0; i < n; i++) FZ_OK(ctx, sg_tensor_fill(e[i].t, 0.5 + i));
    const char *tmp = fz_write_file("gen.safetensors", NULL, 0);
    char path[256];
    snprintf(path, sizeof path, "%s", tmp);

    size_t nb;
    const char *meta[] = {"step", "12", "model", "table", "note", "a \"quoted\"\\ value", NULL};
    unsigned char *b = saved(sg_checkpoint_save(ctx, path, e, n, meta), path, &nb);
    put("safetensors", "table-meta.safetensors", b, nb);
    put("safetensors", "trunc-header.safetensors", b, 24);
    put("safetensors", "trunc-data.safetensors", b, nb - 3);
    put("safetensors", "len-only.safetensors", b, 8);
    edit("bad-dtype.safetensors", b, nb, "\"F32\"", "\"F16\"");
    edit("bad-shape.safetensors", b, nb, "[3,2]", "[2,3]");
    edit("bad-offsets.safetensors", b, nb, "[0,", "[8,");
    edit("bad-name.safetensors", b, nb, "stats", "stat_");
    edit("meta-step-neg.safetensors", b, nb, "\"12\"", "\"-1\"");
    free(b);

    b = saved(sg_checkpoint_save(ctx, path, e, n, NULL), path, &nb);
    put("safetensors", "table.safetensors", b, nb);
    free(b);

    /* The tiny model's checkpoint, as `stepgraph train --model mlp-4-1-2 --save` writes it. */
    b = saved(sg_trainer_save(fz_trainer(), 3, path), path, &nb);
    put("safetensors", "mlp-4-1-2.safetensors", b, nb);
    /* The metadata and values that issue 10 found resumed silently. */
    edit("mlp-step-abc.safetensors", b, nb, "\"step\":\"3\"", "\"step\":\"abc\"");
    edit("mlp-step-neg.safetensors", b, nb, "\"step\":\"3\"", "\"step\":\"-5\"");
    edit("mlp-step-frac.safetensors", b, nb, "\"step\":\"3\"", "\"step\":\"1.5\"");
    edit("mlp-step-empty.safetensors", b, nb, "\"step\":\"3\"", "\"step\":\"\"");
    edit("mlp-step-huge.safetensors", b, nb, "\"step\":\"3\"",
         "\"step\":\"99999999999999999999\"");
    edit("mlp-precision.safetensors", b, nb, "\"f32\"", "\"f16\"");
    edit("mlp-other-model.safetensors", b, nb, "mlp-4-1-2", "mlp-4-1-3");
    edit("mlp-no-step.safetensors", b, nb, ",\"step\":\"3\"", "");
    poke_f32("mlp-nan.safetensors", b, nb, "layers.0.weight", NAN);
    poke_f32("mlp-inf.safetensors", b, nb, "layers.0.bias", -INFINITY);
    free(b);
}

static void text(void)
{
    /* byte 0: reader (0 text); byte 1: options (val_fraction index | (T - 1) << 2) */
    static const char prose[] = "\x00\x21It is a truth universally acknowledged, that a single "
                                "man in possession of a good fortune, must be in want of a wife.\n";
    put("text", "prose.txt", prose, sizeof prose - 1);
    static const char shortfile[] = "\x00\x3d" "abc";
    put("text", "short.txt", shortfile, sizeof shortfile - 1);
    static const char one[] = "\x00\x00" "x";
    put("text", "one-byte.txt", one, sizeof one - 1);
    unsigned char bin[2 + 256];
    bin[0] = 0, bin[1] = 0x1e;
    for (int i = 0; i < 256; i++) bin[2 + i] = (unsigned char)(255 - i);
    put("text", "all-bytes.bin", bin, sizeof bin);
    static const char windowed[] = "\x00\x4e" "0123456789abcdefghij";
    put("text", "windowed.txt", windowed, sizeof windowed - 1);
    static const char empty[] = "\x00\x01";
    put("text", "empty.txt", empty, 2);
    /* Token files, reader 1; byte 1: vocabulary index | (T - 1) << 3 | separate validation << 7. */
    unsigned char raw[2 + 2 * 64];
    raw[0] = 1, raw[1] = 4 | 3 << 3; /* vocabulary 300, T 4 */
    for (int i = 0; i < 64; i++) raw[2 + 2 * i] = (unsigned char)(i * 37 % 300), raw[3 + 2 * i] = (unsigned char)(i * 37 % 300 >> 8);
    put("text", "tokens-raw.bin", raw, sizeof raw);
    static unsigned char shard[2 + 1024 + 4 * 48];
    memset(shard, 0, sizeof shard);
    for (int v = 1; v <= 2; v++) {
        int w = v == 1 ? 2 : 4, n = v == 1 ? 96 : 48; /* the same bytes; v1 holds out 9 tokens */
        shard[0] = 1, shard[1] = (unsigned char)(5 | 5 << 3 | (v == 2 ? 0x80 : 0)); /* 50304, T 6 */
        int32_t head[3] = {20240520, v, n};
        memcpy(shard + 2, head, sizeof head); /* little-endian machines only, as the reader's tests */
        for (int i = 0; i < n; i++) {
            uint32_t tok = (uint32_t)(i * 1009 % 50257);
            memcpy(shard + 2 + 1024 + w * i, &tok, (size_t)w);
        }
        put("text", v == 1 ? "tokens-llmc-v1.bin" : "tokens-llmc-v2.bin", shard, (size_t)(2 + 1024 + w * n));
    }
    put("text", "tokens-llmc-cut.bin", shard, 2 + 1000); /* the header cut short */
    /* Digits files, reader 2; byte 1: classes 10 + bits 0-1 | (R - 8) << 2. Six lines of 64
     * gray levels and a label (LF; then CRLF and no last newline), then one with a level of 17. */
    char csv[2 + 6 * 200], *p = csv;
    *p++ = 2, *p++ = 1 | 4 << 2; /* classes 11, R 12 */
    for (int i = 0; i < 6; i++) {
        for (int k = 0; k < 64; k++) p += sprintf(p, "%d,", (i * 7 + k * 5) % 17);
        p += sprintf(p, "%d\n", i % 10);
    }
    put("text", "digits.csv", csv, (size_t)(p - csv));
    for (char *q = strchr(csv + 2, '\n'); q; q = strchr(q + 2, '\n')) { /* to CRLF */
        memmove(q + 1, q, (size_t)(p++ - q));
        *q = '\r';
    }
    put("text", "digits-crlf.csv", csv, (size_t)(p - csv) - 2);
    char *lv = strstr(csv + 2, ",1,") + 2; /* ",1," becomes ",17,": a gray level of 17 */
    memmove(lv + 1, lv, (size_t)(p++ - lv));
    *lv = '7';
    put("text", "digits-bad-level.csv", csv, (size_t)(p - csv));
}

/* A .npy file as NumPy writes it: magic, version major.0, the header length (2 bytes in 1.0, 4
 * after), the dict padded with spaces to a multiple of 64 bytes and ended by a newline, the
 * data (cut to keep bytes when keep < n). */
static void npy(const char *name, int major, const char *dict, const void *data, size_t n, size_t keep)
{
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict), hlen = dl + 1;
    hlen += (64 - (pre + hlen) % 64) % 64;
    unsigned char b[1024];
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major, b[7] = 0;
    for (size_t i = 0; i < pre - 8; i++) b[8 + i] = (unsigned char)(hlen >> (8 * i));
    memset(b + pre, ' ', hlen);
    memcpy(b + pre, dict, dl);
    b[pre + hlen - 1] = '\n';
    if (n) memcpy(b + pre + hlen, data, n);
    put("npy", name, b, pre + hlen + (keep < n ? keep : n));
}

static void npy_files(void)
{
    static const float f[6] = {0.5f, -1.25f, 3.0f, 1e-3f, -7.5f, 2.0f};
    static const int64_t i8[3] = {-5, 1 << 30, -((int64_t)1 << 31)};
    static const int64_t i8_big[2] = {1, (int64_t)1 << 40};
    static const unsigned char u1[1] = {200};
    static const uint16_t u2[4] = {0, 1, 65535, 50256};
    static const double f8[2] = {1.0, 2.0};
    static const char *const f4_23 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    npy("v1-f4.npy", 1, f4_23, f, sizeof f, SIZE_MAX);
    npy("v2-i8.npy", 2, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", i8, sizeof i8, SIZE_MAX);
    npy("v3-u1-scalar.npy", 3, "{'descr': '|u1', 'fortran_order': False, 'shape': (), }", u1, 1, SIZE_MAX);
    npy("v1-u2.npy", 1, "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 2), }", u2, sizeof u2, SIZE_MAX);
    npy("v1-i4-empty.npy", 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (0, 4), }", NULL, 0, SIZE_MAX);
    npy("spelling.npy", 1, "{\"shape\":(3,2,),'fortran_order':False,'descr':'<f4'}", f, sizeof f, SIZE_MAX);
    npy("refused-f8.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", f8, sizeof f8, SIZE_MAX);
    npy("refused-fortran.npy", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 2), }", f, sizeof f,
        SIZE_MAX);
    npy("refused-big-endian.npy", 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }", f, sizeof f,
        SIZE_MAX);
    npy("refused-i8-range.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", i8_big,
        sizeof i8_big, SIZE_MAX);
    npy("refused-truncated.npy", 1, f4_23, f, sizeof f, sizeof f - 3);
    npy("refused-unterminated.npy", 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), ", f, sizeof f,
        SIZE_MAX);
    npy("refused-five-dims.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 6), }", f,
        sizeof f, SIZE_MAX);
    npy("refused-version.npy", 4, f4_23, f, sizeof f, SIZE_MAX);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR (writes CORPUS_DIR/safetensors, CORPUS_DIR/text, CORPUS_DIR/npy)\n",
                argv[0]);
        return 2;
    }
    root = argv[1];
    char dir[4096];
    static const char *const targets[] = {"safetensors", "text", "npy"};
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "%s/%s", root, targets[i]);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "gen_corpus: cannot make %s\n", dir);
            return 1;
        }
    }
    checkpoints();
    hand_written();
    text();
    npy_files();
    printf("gen_corpus: wrote %s/safetensors, %s/text and %s/npy\n", root, root, root);
    return 0;
}
