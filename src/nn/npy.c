/* npy.c: the .npy reader (npy.h). The preamble (magic, version, header length) is checked
 * byte by byte, the header parsed as the one Python dict literal NumPy writes, the data's size
 * checked against the file's before any of it is read, then the data read in chunks and
 * converted to F32 or I32. */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64

#include "nn/npy.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c reads little-endian data unconverted: a big-endian host needs a byte swap"
#endif

#define NPY_MAX_HEADER (1 << 20)   /* NumPy's own headers are a few hundred bytes */
#define NPY_CHUNK ((size_t)1 << 20) /* elements converted at a time */

/* The dtypes taken: the file's descr, its item size, what it becomes, and whether a value may
 * fall outside int32 (checked one by one). */
typedef struct npy_type {
    const char *descr;
    int size;
    sg_dtype dtype;
    const char *what;
} npy_type;

static const npy_type types[] = {
    {"<f4", 4, SG_DTYPE_F32, "float32"}, {"<i4", 4, SG_DTYPE_I32, "int32"},
    {"<i8", 8, SG_DTYPE_I32, "int64"},   {"<u4", 4, SG_DTYPE_I32, "uint32"},
    {"<u2", 2, SG_DTYPE_I32, "uint16"},  {"<i2", 2, SG_DTYPE_I32, "int16"},
    {"|u1", 1, SG_DTYPE_I32, "uint8"},   {"|i1", 1, SG_DTYPE_I32, "int8"},
};

/* ---- the header: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } ---- */

typedef struct hdr {
    sg_ctx *ctx;
    const char *path;
    const char *s;              /* the header's text */
    size_t n, i;                /* its length; the parse position */
    int64_t base;               /* its offset in the file */
    sg_status st;
} hdr;

/* The character at the position, for messages: 'x', "byte 0xNN" or "the end of the header". */
static const char *found(const hdr *h, char *buf, size_t cap)
{
    if (h->i >= h->n) return "the end of the header";
    unsigned char c = (unsigned char)h->s[h->i];
    if (c == '\n') snprintf(buf, cap, "a newline");
    else if (c >= 0x20 && c < 0x7f) snprintf(buf, cap, "'%c'", c);
    else snprintf(buf, cap, "byte 0x%02x", c);
    return buf;
}

/* Fails at the position: "expected <what>, found <...>". */
static bool expected(hdr *h, const char *what)
{
    char b[32];
    if (h->st == SG_OK)
        h->st = sg_fail(h->ctx, SG_ERR_INVALID,
                        "sg_npy_read: '%s': header byte %lld (file byte %lld): expected %s, found %s",
                        h->path, (long long)h->i, (long long)(h->base + (int64_t)h->i), what,
                        found(h, b, sizeof b));
    return false;
}

/* The same, as the status parse_header returns. */
static sg_status fail_at(hdr *h, const char *what)
{
    expected(h, what);
    return h->st;
}

static void skip_ws(hdr *h)
{
    while (h->i < h->n && (h->s[h->i] == ' ' || h->s[h->i] == '\t')) h->i++;
}

static bool eat(hdr *h, char c)
{
    skip_ws(h);
    if (h->i < h->n && h->s[h->i] == c) {
        h->i++;
        return true;
    }
    return false;
}

/* A quoted string without escapes, at most cap - 1 characters, into out. */
static bool parse_string(hdr *h, char *out, size_t cap, const char *what)
{
    skip_ws(h);
    if (h->i >= h->n || (h->s[h->i] != '\'' && h->s[h->i] != '"')) return expected(h, what);
    char q = h->s[h->i++];
    size_t k = 0;
    while (h->i < h->n && h->s[h->i] != q) {
        unsigned char c = (unsigned char)h->s[h->i];
        if (c == '\\' || c < 0x20 || c >= 0x7f || k + 1 >= cap)
            return expected(h, k + 1 >= cap ? "a shorter string" : "a plain ASCII string (no escape)");
        out[k++] = (char)c;
        h->i++;
    }
    if (h->i >= h->n) return expected(h, "the closing quote of a string");
    h->i++;
    out[k] = '\0';
    return true;
}

static bool parse_bool(hdr *h, bool *out)
{
    skip_ws(h);
    if (h->n - h->i >= 4 && !memcmp(h->s + h->i, "True", 4)) *out = true, h->i += 4;
    else if (h->n - h->i >= 5 && !memcmp(h->s + h->i, "False", 5)) *out = false, h->i += 5;
    else return expected(h, "True or False");
    return true;
}

/* A tuple of whole numbers: "()", "(5,)", "(3, 4)", "(3, 4,)". */
static bool parse_shape(hdr *h, int *ndim, int64_t *shape)
{
    if (!eat(h, '(')) return expected(h, "'(' opening the shape tuple");
    *ndim = 0;
    if (eat(h, ')')) return true;
    for (;;) {
        skip_ws(h);
        size_t s = h->i;
        if (h->i < h->n && h->s[h->i] == '-') {
            h->i++;
            while (h->i < h->n && h->s[h->i] >= '0' && h->s[h->i] <= '9') h->i++;
            h->i = s;
            return expected(h, "a dimension >= 0 (a negative dimension)");
        }
        while (h->i < h->n && h->s[h->i] >= '0' && h->s[h->i] <= '9') h->i++;
        int64_t v = 0;
        if (h->i == s) return expected(h, "a dimension (a whole number)");
        if (!sg_parse_decimal(h->s + s, h->i - s, INT64_MAX, &v)) {
            h->i = s;
            return expected(h, "a dimension without leading zeros that fits in int64");
        }
        if (*ndim == SG_MAX_DIMS) {
            h->i = s;
            return expected(h, "at most 4 dimensions");
        }
        shape[(*ndim)++] = v;
        if (eat(h, ')')) {
            /* Python: (5) is the number 5, not a tuple; NumPy writes (5,). */
            if (*ndim == 1) return expected(h, "',' after the only dimension (a tuple of one is (5,))");
            return true;
        }
        if (!eat(h, ',')) return expected(h, "',' or ')' in the shape tuple");
        if (eat(h, ')')) return true;
    }
}

/* The whole header: the dict, then spaces, then the newline that is its last byte. at[k]: where
 * the value of key k (descr, fortran_order, shape) begins in the header. */
static sg_status parse_header(hdr *h, char *descr, size_t descr_cap, bool *fortran, int *ndim,
                              int64_t *shape, size_t *at_value)
{
    static const char *const keys[3] = {"descr", "fortran_order", "shape"};
    bool seen[3] = {false, false, false};
    if (!eat(h, '{')) return fail_at(h, "'{' opening the header's dict");
    for (;;) {
        if (eat(h, '}')) break;
        char key[32];
        skip_ws(h);
        size_t at = h->i;
        if (!parse_string(h, key, sizeof key, "a key ('descr', 'fortran_order' or 'shape') or '}'"))
            return h->st;
        int k = 0;
        while (k < 3 && strcmp(key, keys[k])) k++;
        if (k == 3 || seen[k]) {
            h->i = at;
            return fail_at(h, k == 3 ? "the key 'descr', 'fortran_order' or 'shape'" : "each key once");
        }
        seen[k] = true;
        if (!eat(h, ':')) return fail_at(h, "':' after the key");
        skip_ws(h);
        at_value[k] = h->i;
        bool ok = k == 0 ? parse_string(h, descr, descr_cap, "the dtype string")
                  : k == 1 ? parse_bool(h, fortran)
                           : parse_shape(h, ndim, shape);
        if (!ok) return h->st;
        if (eat(h, '}')) break;
        if (!eat(h, ',')) return fail_at(h, "',' or '}' in the dict");
    }
    for (int k = 0; k < 3; k++)
        if (!seen[k]) {
            h->i--; /* at the '}' */
            char w[64];
            snprintf(w, sizeof w, "the key '%s' before '}'", keys[k]);
            return fail_at(h, w);
        }
    while (h->i < h->n && h->s[h->i] == ' ') h->i++;
    if (h->i + 1 != h->n || h->s[h->i] != '\n')
        return fail_at(h, h->i >= h->n ? "a newline ending the header" : "spaces, then a newline ending the header");
    return SG_OK;
}

/* ---- the file ---- */

static sg_status read_at(sg_ctx *ctx, const char *path, int fd, void *buf, size_t len, int64_t off)
{
    for (size_t got = 0; got < len;) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + (int64_t)got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return sg_fail(ctx, SG_ERR_IO, "sg_npy_read: cannot read '%s' at byte %lld: %s", path,
                           (long long)(off + (int64_t)got), strerror(errno));
        if (r == 0)
            return sg_fail(ctx, SG_ERR_IO, "sg_npy_read: '%s' ended at byte %lld, before its size when opened: "
                           "it shrank while being read", path, (long long)(off + (int64_t)got));
        got += (size_t)r;
    }
    return SG_OK;
}

/* "(3, 4)" for messages. */
static const char *shape_str(int ndim, const int64_t *shape, char *buf, size_t cap)
{
    size_t k = (size_t)snprintf(buf, cap, "(");
    for (int d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, ndim == 1 ? ",)" : ")");
    return buf;
}

/* Preamble: magic (bytes 0-5), version (6-7), header length (8-9 in 1.0, 8-11 after). */
static sg_status read_preamble(sg_ctx *ctx, const char *path, int fd, int64_t size, sg_npy *a,
                               int64_t *hoff, int64_t *hlen)
{
    unsigned char p[12];
    int64_t got = size < 12 ? size : 12;
    SG_TRY(read_at(ctx, path, fd, p, (size_t)got, 0));
    if (got < 6 || memcmp(p, "\x93NUMPY", 6))
        return sg_fail(ctx, SG_ERR_INVALID, "sg_npy_read: '%s' does not begin with the .npy magic string "
                       "\\x93NUMPY (bytes 0-5)%s: not a .npy file", path,
                       got < 6 ? " (it holds fewer than 6 bytes)" : "");
    if (got < 8)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_npy_read: '%s' ends at byte %lld, inside the format version "
                       "(bytes 6-7)", path, (long long)got);
    a->major = p[6], a->minor = p[7];
    if (!((a->major == 1 || a->major == 2 || a->major == 3) && a->minor == 0))
        return sg_fail(ctx, SG_ERR_INVALID, "sg_npy_read: '%s': format version %d.%d (bytes 6-7): expected 1.0, "
                       "2.0 or 3.0", path, a->major, a->minor);
    int lw = a->major == 1 ? 2 : 4;
    if (got < 8 + lw)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_npy_read: '%s' ends at byte %lld, inside the %d-byte header "
                       "length (bytes 8-%d)", path, (long long)got, lw, 7 + lw);
    *hlen = lw == 2 ? (int64_t)(p[8] | p[9] << 8)
                    : (int64_t)((uint32_t)p[8] | (uint32_t)p[9] << 8 | (uint32_t)p[10] << 16 | (uint32_t)p[11] << 24);
    *hoff = 8 + lw;
    if (*hlen > NPY_MAX_HEADER)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_npy_read: '%s': header length %lld (bytes 8-%d) is above this "
                       "reader's limit of %d bytes", path, (long long)*hlen, 7 + lw, NPY_MAX_HEADER);
    if (*hoff + *hlen > size)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_npy_read: '%s': header length %lld (bytes 8-%d) runs to byte "
                       "%lld, past the end of the file at byte %lld (truncated)", path, (long long)*hlen,
                       7 + lw, (long long)(*hoff + *hlen), (long long)size);
    return SG_OK;
}

/* The header's dict into a: descr, shape, numel; the dtype it is read as into *type. */
static sg_status read_header(sg_ctx *ctx, const char *path, int fd, int64_t hoff, int64_t hlen,
                             sg_npy *a, const npy_type **type)
{
    char *text = malloc((size_t)hlen + 1);
    if (!text) return sg_fail(ctx, SG_ERR_OOM, "sg_npy_read: '%s': out of host memory", path);
    sg_status st = read_at(ctx, path, fd, text, (size_t)hlen, hoff);
    hdr h = {ctx, path, text, (size_t)hlen, 0, hoff, SG_OK};
    bool fortran = false;
    size_t at[3] = {0, 0, 0};
    if (st == SG_OK) st = parse_header(&h, a->descr, sizeof a->descr, &fortran, &a->ndim, a->shape, at);
    free(text);
    SG_TRY(st);
    *type = NULL;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(a->descr, types[i].descr)) *type = &types[i];
    if (!*type) {
        const char *why = (a->descr[0] == '>' && a->descr[1]) ? "big-endian data (byteswap it: x.astype(x.dtype.newbyteorder('<')))"
                          : !strcmp(a->descr, "<f8") ? "float64 (save x.astype(np.float32))"
                                                     : "a dtype this reader does not take";
        return sg_fail(ctx, SG_ERR_INVALID, "sg_npy_read: '%s': dtype '%s' (file byte %lld) is %s: expected "
                       "'<f4', '<i4', '<i8', '<u4', '<u2', '<i2', '|u1' or '|i1'", path, a->descr,
                       (long long)(hoff + (int64_t)at[0]), why);
    }
    if (fortran)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_npy_read: '%s': fortran_order is True (file byte %lld): this "
                       "reader takes C order; save np.ascontiguousarray(x)", path, (long long)(hoff + (int64_t)at[1]));
    a->numel = 1;
    for (int d = 0; d < a->ndim; d++) {
        if (a->shape[d] && a->numel > INT64_MAX / 8 / a->shape[d]) {
            char s[160];
            return sg_fail(ctx, SG_ERR_INVALID, "sg_npy_read: '%s': shape %s (file byte %lld) holds more "
                           "elements than a file can", path, shape_str(a->ndim, a->shape, s, sizeof s),
                           (long long)(hoff + (int64_t)at[2]));
        }
        a->numel *= a->shape[d];
    }
    return SG_OK;
}

/* The data: numel items of type t from byte off, converted into a->data. */
static sg_status read_data(sg_ctx *ctx, const char *path, int fd, int64_t off, const npy_type *t, sg_npy *a)
{
    a->dtype = t->dtype;
    a->nbytes = (size_t)a->numel * 4;
    a->data = malloc(a->nbytes ? a->nbytes : 1);
    if (!a->data)
        return sg_fail(ctx, SG_ERR_OOM, "sg_npy_read: '%s': out of host memory for %zu bytes of data", path,
                       a->nbytes);
    if (t->size == 4 && strcmp(t->descr, "<u4")) return read_at(ctx, path, fd, a->data, a->nbytes, off);
    unsigned char *buf = malloc(NPY_CHUNK * (size_t)t->size);
    if (!buf) return sg_fail(ctx, SG_ERR_OOM, "sg_npy_read: '%s': out of host memory", path);
    int32_t *out = a->data;
    sg_status st = SG_OK;
    for (int64_t done = 0; done < a->numel && st == SG_OK;) {
        int64_t k = a->numel - done < (int64_t)NPY_CHUNK ? a->numel - done : (int64_t)NPY_CHUNK;
        st = read_at(ctx, path, fd, buf, (size_t)k * (size_t)t->size, off + done * t->size);
        for (int64_t i = 0; i < k && st == SG_OK; i++) {
            const unsigned char *p = buf + i * t->size;
            int64_t v;
            switch (t->descr[1] == 'u' ? t->size : -t->size) {
            case 1: v = p[0]; break;
            case -1: v = (int8_t)p[0]; break;
            case 2: v = (uint16_t)(p[0] | p[1] << 8); break;
            case -2: v = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
            case 4: v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; break;
            default: {
                uint64_t u = 0;
                for (int b = 7; b >= 0; b--) u = u << 8 | p[b];
                v = (int64_t)u;
            }
            }
            if (v < INT32_MIN || v > INT32_MAX)
                st = sg_fail(ctx, SG_ERR_INVALID, "sg_npy_read: '%s': element %lld (at byte %lld) is %lld, outside "
                             "int32: '%s' (%s) is read as I32, which holds %d to %d", path, (long long)(done + i),
                             (long long)(off + (done + i) * t->size), (long long)v, t->descr, t->what, INT32_MIN,
                             INT32_MAX);
            else out[done + i] = (int32_t)v;
        }
        done += k;
    }
    free(buf);
    return st;
}

sg_status sg_npy_read(sg_ctx *ctx, const char *path, sg_npy *out)
{
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "sg_npy_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return sg_fail(ctx, SG_ERR_NULL, "sg_npy_read: path is NULL");
    int fd = -1;
    int64_t size = 0, hoff = 0, hlen = 0;
    SG_TRY(sg_file_open_regular(ctx, "sg_npy_read", path, &fd, &size));
    const npy_type *t = NULL;
    sg_status st = read_preamble(ctx, path, fd, size, out, &hoff, &hlen);
    if (st == SG_OK) st = read_header(ctx, path, fd, hoff, hlen, out, &t);
    if (st == SG_OK) {
        int64_t off = hoff + hlen, need = out->numel * t->size, end = off + need;
        out->data_offset = off;
        if (size != end) {
            char s[160];
            st = sg_fail(ctx, SG_ERR_INVALID, "sg_npy_read: '%s': shape %s of '%s' needs %lld bytes of data from "
                         "byte %lld to byte %lld, but the file %s at byte %lld%s", path,
                         shape_str(out->ndim, out->shape, s, sizeof s), out->descr, (long long)need, (long long)off,
                         (long long)end, size < end ? "ends" : "goes on to its end", (long long)size,
                         size < end ? ": it is truncated" : ": trailing bytes after the data");
        }
    }
    if (st == SG_OK) st = read_data(ctx, path, fd, out->data_offset, t, out);
    close(fd);
    if (st != SG_OK) sg_npy_free(out);
    return st;
}

void sg_npy_free(sg_npy *a)
{
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}
