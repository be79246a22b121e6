/* test_npy.c: the .npy reader (src/nn/npy.h). Files written here as NumPy writes them (format
 * 1.0, 2.0 and 3.0, every dtype taken, random shapes of 0 to 4 dimensions, fresh random values)
 * read back exactly, converted to F32 or I32; header spellings Python accepts (quotes, key
 * order, spaces, trailing commas) read the same; and malformed files are refused, the message
 * naming the file and the byte offset: bad magic, bad version, header length past the end,
 * unterminated dict, a missing newline, unknown, float64 and big-endian dtypes, Fortran order,
 * negative, oversized and too many dimensions, a tuple of one without its comma, duplicate,
 * unknown or missing keys, truncated data, trailing bytes, int64 and uint32 values outside
 * int32, a FIFO, a missing file. Where python3 has NumPy, files np.save writes read back as
 * NumPy's own bytes say. `cpu` runs it all (the reader is host code); `gpu` has nothing
 * GPU-specific and exits 77. */
#define _POSIX_C_SOURCE 200809L

#include "testutil.h"

#include "nn/npy.h"

#include <sys/stat.h>
#include <unistd.h>

typedef struct dt {
    const char *descr;
    int size;
    sg_dtype dtype;
    int64_t lo, hi;       /* the values drawn (integers) */
} dt;

static const dt dts[] = {
    {"<f4", 4, SG_DTYPE_F32, 0, 0},
    {"<i4", 4, SG_DTYPE_I32, INT32_MIN, INT32_MAX},
    {"<i8", 8, SG_DTYPE_I32, INT32_MIN, INT32_MAX},
    {"<u4", 4, SG_DTYPE_I32, 0, INT32_MAX},
    {"<u2", 2, SG_DTYPE_I32, 0, 65535},
    {"<i2", 2, SG_DTYPE_I32, -32768, 32767},
    {"|u1", 1, SG_DTYPE_I32, 0, 255},
    {"|i1", 1, SG_DTYPE_I32, -128, 127},
};
#define N_DTS ((int)(sizeof dts / sizeof dts[0]))

static char dir[64];
static int n_files;

static const char *path_new(char *buf, size_t cap, const char *stem)
{
    snprintf(buf, cap, "%s/%s_%d.npy", dir, stem, n_files++);
    return buf;
}

/* ---- building files ---- */

/* An array as the test knows it: shape, the values as they should read back (int64 or float
 * bits), and the file's bytes. */
typedef struct arr {
    const dt *t;
    int ndim, major;
    int64_t shape[SG_MAX_DIMS], numel;
    int64_t *ival;        /* integers */
    float *fval;          /* floats */
} arr;

static arr arr_random(int major)
{
    arr a = {.t = &dts[tu_randint(0, N_DTS - 1)], .ndim = tu_randint(0, SG_MAX_DIMS), .major = major, .numel = 1};
    for (int d = 0; d < a.ndim; d++) a.numel *= a.shape[d] = tu_randint(a.ndim > 2 ? 1 : 0, 7);
    a.ival = malloc((size_t)(a.numel + 1) * sizeof *a.ival);
    a.fval = malloc((size_t)(a.numel + 1) * sizeof *a.fval);
    for (int64_t i = 0; i < a.numel; i++) {
        a.fval[i] = (float)tu_uniform(-1e6, 1e6) * (tu_randint(0, 3) ? 1e-6f : 1.f);
        /* the ends of the range now and then */
        int r = tu_randint(0, 9);
        a.ival[i] = r == 0 ? a.t->lo : r == 1 ? a.t->hi : a.t->lo + (int64_t)(tu_next() % (uint64_t)(a.t->hi - a.t->lo + 1));
    }
    return a;
}

static void arr_free(arr *a) { free(a->ival), free(a->fval); }

static void put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* The dict as NumPy writes it (dict: NULL), or as given. */
static void dict_of(const arr *a, char *out, size_t cap)
{
    char shape[128] = "(";
    for (int d = 0; d < a->ndim; d++)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), d ? ", %lld" : "%lld", (long long)a->shape[d]);
    strcat(shape, a->ndim == 1 ? ",)" : ")");
    snprintf(out, cap, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", a->t->descr, shape);
}

/* The file's bytes: preamble, the dict padded with spaces and ended by a newline (to a
 * multiple of 64, as NumPy pads), the data. *len: its length (room for 16 more bytes). */
static unsigned char *file_bytes(const arr *a, const char *dict, size_t *len, size_t *data_off)
{
    size_t dl = strlen(dict), lw = a->major == 1 ? 2 : 4, pre = 8 + lw;
    size_t hlen = dl + 1;
    hlen += (64 - (pre + hlen) % 64) % 64;
    *data_off = pre + hlen;
    *len = *data_off + (size_t)a->numel * (size_t)a->t->size;
    unsigned char *b = calloc(*len + 16, 1);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)a->major, b[7] = 0;
    put_le(b + 8, hlen, (int)lw);
    memset(b + pre, ' ', hlen);
    memcpy(b + pre, dict, dl);
    b[pre + hlen - 1] = '\n';
    for (int64_t i = 0; i < a->numel; i++) {
        unsigned char *p = b + *data_off + (size_t)i * (size_t)a->t->size;
        if (a->t->dtype == SG_DTYPE_F32) {
            uint32_t u;
            memcpy(&u, &a->fval[i], 4);
            put_le(p, u, 4);
        } else {
            put_le(p, (uint64_t)a->ival[i], a->t->size);
        }
    }
    return b;
}

/* ---- reading back ---- */

/* path must read as a: dtype, shape, every value. */
static void check_reads(sg_ctx *ctx, const char *path, const arr *a, const char *what)
{
    sg_npy r;
    sg_status st = sg_npy_read(ctx, path, &r);
    TU_CHECK(st == SG_OK, "%s: %s: %s", what, sg_status_name(st), sg_ctx_last_error(ctx));
    if (st != SG_OK) return;
    bool shape_ok = r.ndim == a->ndim && r.numel == a->numel && r.dtype == a->t->dtype &&
                    !strcmp(r.descr, a->t->descr) && r.major == a->major && r.nbytes == (size_t)a->numel * 4;
    for (int d = 0; d < a->ndim && shape_ok; d++) shape_ok = r.shape[d] == a->shape[d];
    TU_CHECK(shape_ok, "%s: read as ndim %d, %lld elements, %s '%s', version %d", what, r.ndim,
             (long long)r.numel, sg_dtype_name(r.dtype), r.descr, r.major);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; shape_ok && i < a->numel; i++) {
        bool ok = a->t->dtype == SG_DTYPE_F32 ? !memcmp(&((float *)r.data)[i], &a->fval[i], 4)
                                              : ((int32_t *)r.data)[i] == a->ival[i];
        if (!ok && !bad++) first = i;
    }
    TU_CHECK(bad == 0, "%s: %lld of %lld values differ, the first at %lld", what, (long long)bad,
             (long long)a->numel, (long long)first);
    sg_npy_free(&r);
}

/* path must be refused with `want`, the message naming the path and holding each needle. */
static void refused(sg_ctx *ctx, const char *path, sg_status want, const char *n1, const char *n2)
{
    sg_npy r;
    memset(&r, 0xab, sizeof r);
    TU_FAILS(ctx, sg_npy_read(ctx, path, &r), want, n1);
    const char *msg = sg_ctx_last_error(ctx);
    TU_CHECK(strstr(msg, path) != NULL, "the message does not name '%s': %s", path, msg);
    if (n2) TU_CHECK(strstr(msg, n2) != NULL, "the message lacks '%s': %s", n2, msg);
    TU_CHECK(r.data == NULL && r.numel == 0, "'%s': out not cleared on failure", path);
}

/* ---- valid files ---- */

static void check_valid(sg_ctx *ctx)
{
    char p[128], what[512], dict[256];
    for (int k = 0; k < 60; k++) {
        arr a = arr_random(1 + k % 3);
        dict_of(&a, dict, sizeof dict);
        size_t len, off;
        unsigned char *b = file_bytes(&a, dict, &len, &off);
        path_new(p, sizeof p, "valid");
        tu_file_write(p, b, len);
        snprintf(what, sizeof what, "%s (version %d.0, %s)", p, a.major, dict);
        check_reads(ctx, p, &a, what);
        free(b);
        remove(p);
        arr_free(&a);
    }
    /* Spellings Python reads as the same dict. */
    arr a = arr_random(1);
    a.t = &dts[0];
    a.ndim = 2, a.shape[0] = 3, a.shape[1] = 2, a.numel = 6;
    free(a.ival), free(a.fval);
    a.ival = calloc(6, sizeof *a.ival), a.fval = malloc(6 * sizeof *a.fval);
    for (int i = 0; i < 6; i++) a.fval[i] = (float)tu_uniform(-10, 10);
    static const char *const spellings[] = {
        "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (3, 2)}",
        "{'shape':(3,2,),'descr':'<f4','fortran_order':False}",
        "  {  'fortran_order' :  False ,\t'shape' : ( 3 , 2 ) , 'descr' : '<f4' , }  ",
    };
    for (int k = 0; k < 3; k++) {
        size_t len, off;
        unsigned char *b = file_bytes(&a, spellings[k], &len, &off);
        path_new(p, sizeof p, "spelling");
        tu_file_write(p, b, len);
        snprintf(what, sizeof what, "%s (%s)", p, spellings[k]);
        check_reads(ctx, p, &a, what);
        free(b);
        remove(p);
    }
    arr_free(&a);
}

/* ---- malformed files ---- */

/* A fresh random array's file, with dict (NULL: NumPy's); its bytes, length and data offset. */
typedef struct made {
    arr a;
    unsigned char *b;
    size_t len, off;
    char dict[256];
} made;

static made make(int major, const char *dict)
{
    made m = {.a = arr_random(major)};
    while (m.a.numel == 0) { /* data to truncate */
        arr_free(&m.a);
        m.a = arr_random(major);
    }
    if (dict) snprintf(m.dict, sizeof m.dict, "%s", dict);
    else dict_of(&m.a, m.dict, sizeof m.dict);
    m.b = file_bytes(&m.a, m.dict, &m.len, &m.off);
    return m;
}

static void made_free(made *m)
{
    free(m->b);
    arr_free(&m->a);
}

/* A file of m's array under the header dict `dict` (re-padded); its path, into p. */
static const char *write_dict(made *m, const char *dict, const char *stem, char *p, size_t cap)
{
    size_t len, off;
    unsigned char *b = file_bytes(&m->a, dict, &len, &off);
    path_new(p, cap, stem);
    tu_file_write(p, b, len);
    free(b);
    return p;
}

static void check_malformed(sg_ctx *ctx)
{
    char p[128], n1[256], n2[256];
    int major = tu_randint(1, 3);
    made m = make(major, NULL);
    size_t pre = major == 1 ? 10 : 12;

    /* magic: one of its 6 bytes changed; a file of fewer than 6 bytes */
    unsigned char *b = malloc(m.len);
    memcpy(b, m.b, m.len);
    int at = tu_randint(0, 5);
    b[at] ^= (unsigned char)tu_randint(1, 255);
    tu_file_write(path_new(p, sizeof p, "magic"), b, m.len);
    refused(ctx, p, SG_ERR_INVALID, "does not begin with the .npy magic string", "(bytes 0-5)");
    tu_file_write(path_new(p, sizeof p, "tiny"), m.b, (size_t)tu_randint(0, 5));
    refused(ctx, p, SG_ERR_INVALID, "does not begin with the .npy magic string", NULL);
    /* version */
    static const unsigned char versions[][2] = {{0, 0}, {4, 0}, {1, 1}, {2, 5}, {255, 0}};
    memcpy(b, m.b, m.len);
    int v = tu_randint(0, 4);
    b[6] = versions[v][0], b[7] = versions[v][1];
    tu_file_write(path_new(p, sizeof p, "version"), b, m.len);
    snprintf(n1, sizeof n1, "format version %d.%d (bytes 6-7): expected 1.0, 2.0 or 3.0", versions[v][0], versions[v][1]);
    refused(ctx, p, SG_ERR_INVALID, n1, NULL);
    /* the header length past the end of the file; above the limit (2.0 and 3.0) */
    memcpy(b, m.b, m.len);
    size_t hl = m.len - pre + (size_t)tu_randint(1, 100);
    if (major == 1 && hl > 65535) hl = 65535;
    put_le(b + 8, hl, major == 1 ? 2 : 4);
    tu_file_write(path_new(p, sizeof p, "hlen"), b, m.len);
    snprintf(n1, sizeof n1, "header length %zu (bytes 8-%d) runs to byte %zu, past the end of the file at byte %zu",
             hl, major == 1 ? 9 : 11, pre + hl, m.len);
    refused(ctx, p, SG_ERR_INVALID, n1, "truncated");
    if (major > 1) {
        put_le(b + 8, 0xffffffffu, 4);
        tu_file_write(path_new(p, sizeof p, "hlen_huge"), b, m.len);
        refused(ctx, p, SG_ERR_INVALID, "header length 4294967295 (bytes 8-11) is above this reader's limit", NULL);
    }
    /* a file that ends inside the preamble */
    size_t cut = (size_t)tu_randint(6, (int)pre - 1);
    tu_file_write(path_new(p, sizeof p, "preamble"), m.b, cut);
    snprintf(n1, sizeof n1, "ends at byte %zu, inside the", cut);
    refused(ctx, p, SG_ERR_INVALID, n1, NULL);

    /* unterminated dict: the closing brace gone (the newline is where it was expected) */
    char d[320];
    snprintf(d, sizeof d, "%s", m.dict);
    d[strlen(d) - 1] = ' ';
    write_dict(&m, d, "unterminated", p, sizeof p);
    refused(ctx, p, SG_ERR_INVALID, "expected a key ('descr', 'fortran_order' or 'shape') or '}', found a newline", "file byte");
    /* no newline at the end of the header */
    memcpy(b, m.b, m.len);
    b[m.off - 1] = ' ';
    tu_file_write(path_new(p, sizeof p, "no_newline"), b, m.len);
    snprintf(n1, sizeof n1, "file byte %zu): expected a newline ending the header, found the end of the header", m.off);
    refused(ctx, p, SG_ERR_INVALID, n1, NULL);
    /* something after the dict other than spaces */
    snprintf(d, sizeof d, "%s x", m.dict);
    write_dict(&m, d, "after_dict", p, sizeof p);
    refused(ctx, p, SG_ERR_INVALID, "expected spaces, then a newline ending the header, found 'x'", NULL);
    free(b);

    /* dtypes: unknown, float64, big-endian */
    static const struct { const char *descr, *needle; } bad_types[] = {
        {"<c8", "a dtype this reader does not take"}, {"|b1", "a dtype this reader does not take"},
        {"<f8", "float64 (save x.astype(np.float32))"}, {">f4", "big-endian data"},
        {">i4", "big-endian data"}, {"<f2", "a dtype this reader does not take"}, {"O", "a dtype this reader does not take"}};
    int k = tu_randint(0, 6);
    snprintf(d, sizeof d, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }", bad_types[k].descr,
             (long long)m.a.numel);
    write_dict(&m, d, "dtype", p, sizeof p);
    snprintf(n1, sizeof n1, "dtype '%s' (file byte %zu)", bad_types[k].descr, pre + (size_t)(strstr(d, ": '") + 2 - d));
    refused(ctx, p, SG_ERR_INVALID, n1, bad_types[k].needle);
    write_dict(&m, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", "structured", p, sizeof p);
    refused(ctx, p, SG_ERR_INVALID, "expected the dtype string, found '['", NULL);
    /* Fortran order */
    snprintf(d, sizeof d, "%s", m.dict);
    char *f = strstr(d, "False");
    memcpy(f, "True ", 5);
    write_dict(&m, d, "fortran", p, sizeof p);
    snprintf(n1, sizeof n1, "fortran_order is True (file byte %zu)", pre + (size_t)(f - d));
    refused(ctx, p, SG_ERR_INVALID, n1, "C order");

    /* shapes: negative, overflowing, too many dimensions, a tuple of one without its comma,
     * leading zeros, not a tuple */
    int64_t neg = -tu_randint(1, 1000);
    snprintf(d, sizeof d, "{'descr': '%s', 'fortran_order': False, 'shape': (%d, %lld), }", m.a.t->descr,
             tu_randint(1, 9), (long long)neg);
    write_dict(&m, d, "negative", p, sizeof p);
    size_t col = (size_t)(strstr(d, "-") - d);
    snprintf(n1, sizeof n1, "header byte %zu (file byte %zu): expected a dimension >= 0", col, pre + col);
    refused(ctx, p, SG_ERR_INVALID, n1, NULL);
    snprintf(d, sizeof d, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld, %lld), }", m.a.t->descr,
             (long long)1 << 40, ((long long)1 << 30) + tu_randint(0, 1000));
    write_dict(&m, d, "overflow", p, sizeof p);
    refused(ctx, p, SG_ERR_INVALID, "holds more elements than a file can", NULL);
    snprintf(d, sizeof d, "{'descr': '%s', 'fortran_order': False, 'shape': (1, 1, 1, 1, %lld), }", m.a.t->descr,
             (long long)m.a.numel);
    write_dict(&m, d, "five_dims", p, sizeof p);
    refused(ctx, p, SG_ERR_INVALID, "expected at most 4 dimensions", NULL);
    snprintf(d, sizeof d, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld), }", m.a.t->descr, (long long)m.a.numel);
    write_dict(&m, d, "one_tuple", p, sizeof p);
    refused(ctx, p, SG_ERR_INVALID, "expected ',' after the only dimension", NULL);
    snprintf(d, sizeof d, "{'descr': '%s', 'fortran_order': False, 'shape': (0%lld,), }", m.a.t->descr, (long long)m.a.numel);
    write_dict(&m, d, "leading_zero", p, sizeof p);
    refused(ctx, p, SG_ERR_INVALID, "expected a dimension without leading zeros", NULL);
    snprintf(d, sizeof d, "{'descr': '%s', 'fortran_order': False, 'shape': [%lld], }", m.a.t->descr, (long long)m.a.numel);
    write_dict(&m, d, "list_shape", p, sizeof p);
    refused(ctx, p, SG_ERR_INVALID, "expected '(' opening the shape tuple, found '['", NULL);
    /* keys: duplicate, unknown, missing */
    snprintf(d, sizeof d, "{'descr': '%s', 'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }", m.a.t->descr,
             m.a.t->descr, (long long)m.a.numel);
    write_dict(&m, d, "dup_key", p, sizeof p);
    refused(ctx, p, SG_ERR_INVALID, "expected each key once", NULL);
    snprintf(d, sizeof d, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), 'extra': 1, }", m.a.t->descr,
             (long long)m.a.numel);
    write_dict(&m, d, "extra_key", p, sizeof p);
    refused(ctx, p, SG_ERR_INVALID, "expected the key 'descr', 'fortran_order' or 'shape'", NULL);
    snprintf(d, sizeof d, "{'descr': '%s', 'shape': (%lld,), }", m.a.t->descr, (long long)m.a.numel);
    write_dict(&m, d, "missing_key", p, sizeof p);
    refused(ctx, p, SG_ERR_INVALID, "expected the key 'fortran_order' before '}'", NULL);
    write_dict(&m, "['descr', '<f4']", "not_dict", p, sizeof p);
    refused(ctx, p, SG_ERR_INVALID, "expected '{' opening the header's dict, found '['", NULL);

    /* data: truncated by 1 byte to all of it, trailing bytes */
    size_t data = m.len - m.off, keep = (size_t)tu_randint(0, (int)data - 1);
    tu_file_write(path_new(p, sizeof p, "truncated"), m.b, m.off + keep);
    snprintf(n1, sizeof n1, "needs %zu bytes of data from byte %zu to byte %zu, but the file ends at byte %zu", data,
             m.off, m.len, m.off + keep);
    refused(ctx, p, SG_ERR_INVALID, n1, "truncated");
    size_t extra = (size_t)tu_randint(1, 16);
    tu_file_write(path_new(p, sizeof p, "trailing"), m.b, m.len + extra);
    snprintf(n2, sizeof n2, "but the file goes on to its end at byte %zu: trailing bytes", m.len + extra);
    refused(ctx, p, SG_ERR_INVALID, n2, NULL);
    made_free(&m);

    /* int64 and uint32 values outside int32: the element's index and byte offset */
    for (int w = 0; w < 2; w++) {
        made o = make(major, NULL);
        while (strcmp(o.a.t->descr, w ? "<u4" : "<i8")) {
            made_free(&o);
            o = make(major, NULL);
        }
        int64_t i = (int64_t)(tu_next() % (uint64_t)o.a.numel);
        int64_t above = 1 + (int64_t)(tu_next() % ((uint64_t)1 << 31)); /* 1 .. 2^31 */
        int64_t val = w ? (int64_t)INT32_MAX + above /* up to 2^32 - 1 */
                        : (tu_randint(0, 1) ? INT32_MAX + above : INT32_MIN - above);
        put_le(o.b + o.off + (size_t)i * (size_t)o.a.t->size, (uint64_t)val, o.a.t->size);
        tu_file_write(path_new(p, sizeof p, "range"), o.b, o.len);
        snprintf(n1, sizeof n1, "element %lld (at byte %lld) is %lld, outside int32", (long long)i,
                 (long long)(o.off + (size_t)i * (size_t)o.a.t->size), (long long)val);
        refused(ctx, p, SG_ERR_INVALID, n1, o.a.t->descr);
        made_free(&o);
    }

    /* not a file; no file */
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/fifo.npy", dir);
    TU_CHECK(mkfifo(fifo, 0600) == 0, "mkfifo %s: %s", fifo, strerror(errno));
    refused(ctx, fifo, SG_ERR_INVALID, "is a FIFO (named pipe), not a regular file", NULL);
    remove(fifo);
    snprintf(p, sizeof p, "%s/missing.npy", dir);
    refused(ctx, p, SG_ERR_IO, "cannot open", NULL);
    refused(ctx, "/dev/zero", SG_ERR_INVALID, "is a character device", NULL);
}

/* ---- NumPy's own files ---- */

/* np.save (and write_array at each version) of random arrays of every dtype; next to each
 * file, its values as little-endian int64 (or float32) bytes from NumPy; both must agree. */
static void check_numpy(sg_ctx *ctx)
{
    if (system("python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        printf("note: python3 with numpy is not here: files written by NumPy itself were not read\n");
        return;
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "python3 - '%s' %llu <<'PY'\n"
             "import sys, numpy as np\n"
             "d, seed = sys.argv[1], int(sys.argv[2])\n"
             "rng = np.random.default_rng(seed)\n"
             "types = ['<f4', '<i4', '<i8', '<u4', '<u2', '<i2', '|u1', '|i1']\n"
             "for k, t in enumerate(types * 2):\n"
             "    shape = tuple(int(x) for x in rng.integers(1, 6, size=int(rng.integers(0, 5))))\n"
             "    dt = np.dtype(t)\n"
             "    if dt.kind == 'f': x = rng.standard_normal(shape).astype(dt)\n"
             "    else:\n"
             "        lo, hi = max(np.iinfo(dt).min, -2**31), min(np.iinfo(dt).max, 2**31 - 1)\n"
             "        x = rng.integers(lo, hi, size=shape, endpoint=True).astype(dt)\n"
             "    p = '%%s/np_%%d.npy' %% (d, k)\n"
             "    with open(p, 'wb') as f: np.lib.format.write_array(f, x, version=(1 + k %% 3, 0))\n"
             "    with open(p + '.ref', 'wb') as f:\n"
             "        f.write(np.array(x.ndim, '<i8').tobytes() + np.array(x.shape, '<i8').tobytes())\n"
             "        f.write((x.astype('<f4') if dt.kind == 'f' else x.astype('<i8')).tobytes())\n"
             "PY",
             dir, (unsigned long long)tu_next());
    if (system(cmd) != 0) {
        TU_CHECK(0, "python3 with numpy could not write the files");
        return;
    }
    for (int k = 0; k < 2 * N_DTS; k++) {
        char p[160], r[200];
        snprintf(p, sizeof p, "%s/np_%d.npy", dir, k);
        snprintf(r, sizeof r, "%s.ref", p);
        size_t rl;
        unsigned char *ref = tu_file_read(r, &rl);
        int64_t nd, sh[SG_MAX_DIMS], numel = 1;
        memcpy(&nd, ref, 8);
        memcpy(sh, ref + 8, (size_t)nd * 8);
        for (int d = 0; d < nd; d++) numel *= sh[d];
        arr a = {.t = &dts[k % N_DTS], .ndim = (int)nd, .major = 1 + k % 3, .numel = numel};
        memcpy(a.shape, sh, (size_t)nd * 8);
        a.ival = malloc((size_t)numel * 8 + 8), a.fval = malloc((size_t)numel * 4 + 4);
        const unsigned char *vals = ref + 8 + nd * 8;
        if (a.t->dtype == SG_DTYPE_F32) memcpy(a.fval, vals, (size_t)numel * 4);
        else memcpy(a.ival, vals, (size_t)numel * 8);
        char what[256];
        snprintf(what, sizeof what, "%s (np.save of %s, version %d.0)", p, a.t->descr, a.major);
        check_reads(ctx, p, &a, what);
        arr_free(&a);
        free(ref);
        remove(p), remove(r);
    }
    printf("read %d files written by NumPy\n", 2 * N_DTS);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    if (!strcmp(mode, "gpu")) {
        printf("SKIP: the .npy reader is host code; test_npy cpu covers it\n");
        return TU_SKIP;
    }
    tu_seed("test_npy");
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    snprintf(dir, sizeof dir, "/tmp/sg_npy_XXXXXX");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "FAIL: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    check_valid(ctx);
    check_malformed(ctx);
    check_numpy(ctx);
    sg_ctx_destroy(ctx);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
    return tu_finish("test_npy");
}
