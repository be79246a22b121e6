/* checkpoint.c: safetensors files (see checkpoint.h for the layout): an atomic writer, and a
 * loader that reads and validates the whole file before it writes any tensor. The header is
 * parsed by a small strict JSON reader that takes exactly what the format needs: objects,
 * arrays of non-negative integers, and strings with escapes. Nothing else (numbers with a sign,
 * fraction or exponent, true/false/null, trailing commas, duplicate keys) is accepted. */
#define _POSIX_C_SOURCE 200809L

#include "nn/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define CK_MAX_HEADER ((uint64_t)100 << 20) /* the reference refuses larger headers as well */
#define CK_MAX_DIMS 8                       /* more than any stepgraph tensor has */
#define CK_META "__metadata__"

/* ---- dtypes: the format's names, and the order the reference writes tensors in ---- */

static const char *ck_dtype_str(sg_dtype dt)
{
    switch (dt) {
    case SG_DTYPE_F32: return "F32";
    case SG_DTYPE_BF16: return "BF16";
    case SG_DTYPE_F64: return "F64";
    case SG_DTYPE_I32: return "I32";
    }
    return "?";
}

static bool ck_dtype_parse(const char *s, sg_dtype *out)
{
    static const sg_dtype all[] = {SG_DTYPE_F32, SG_DTYPE_BF16, SG_DTYPE_F64, SG_DTYPE_I32};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(s, ck_dtype_str(all[i]))) {
            *out = all[i];
            return true;
        }
    return false;
}

/* The reference sorts by its dtype enum, descending: F64, F32, I32, BF16 among ours. */
static int ck_dtype_rank(sg_dtype dt)
{
    switch (dt) {
    case SG_DTYPE_F64: return 0;
    case SG_DTYPE_F32: return 1;
    case SG_DTYPE_I32: return 2;
    case SG_DTYPE_BF16: return 3;
    }
    return 4;
}

/* ---- byte order: the file is little-endian; a no-op on little-endian hosts ---- */

static bool ck_host_le(void)
{
    uint16_t x = 1;
    unsigned char c;
    memcpy(&c, &x, 1);
    return c == 1;
}

static void ck_swap_le(void *p, size_t nbytes, size_t es)
{
    if (ck_host_le() || es == 1) return;
    unsigned char *b = p;
    for (size_t i = 0; i + es <= nbytes; i += es)
        for (size_t k = 0; k < es / 2; k++) {
            unsigned char t = b[i + k];
            b[i + k] = b[i + es - 1 - k];
            b[i + es - 1 - k] = t;
        }
}

static void ck_put_u64le(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t ck_get_u64le(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}

/* The header must be UTF-8 (the reference reads it as a Rust str): well-formed sequences,
 * no overlong forms, no surrogates, nothing above U+10FFFF. */
static bool ck_utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f, min = 0x80;
        else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f, min = 0x800;
        else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07, min = 0x10000;
        else return false;
        if (i + len > n) return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += len;
    }
    return true;
}

/* ---- JSON writing: a growing buffer ---- */

typedef struct ck_buf {
    char *p;
    size_t n, cap;
    bool oom;
} ck_buf;

static void ck_put(ck_buf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void ck_puts(ck_buf *b, const char *s) { ck_put(b, s, strlen(s)); }

static void ck_put_u64(ck_buf *b, uint64_t v)
{
    char s[24];
    snprintf(s, sizeof s, "%llu", (unsigned long long)v);
    ck_puts(b, s);
}

/* A JSON string, escaped as serde_json (the reference) escapes it. */
static void ck_put_str(ck_buf *b, const char *s)
{
    ck_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[8];
        switch (*p) {
        case '"': ck_puts(b, "\\\""); break;
        case '\\': ck_puts(b, "\\\\"); break;
        case '\b': ck_puts(b, "\\b"); break;
        case '\f': ck_puts(b, "\\f"); break;
        case '\n': ck_puts(b, "\\n"); break;
        case '\r': ck_puts(b, "\\r"); break;
        case '\t': ck_puts(b, "\\t"); break;
        default:
            if (*p < 0x20) {
                snprintf(e, sizeof e, "\\u%04x", *p);
                ck_puts(b, e);
            } else {
                ck_put(b, (const char *)p, 1);
            }
        }
    }
    ck_put(b, "\"", 1);
}

/* ---- JSON reading: strict, for exactly what the header holds ---- */

typedef struct ck_json {
    const char *s;
    size_t n, i;
    char err[192];
} ck_json;

static bool js_fail(ck_json *j, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static bool js_fail(ck_json *j, const char *fmt, ...)
{
    if (!j->err[0]) {
        int k = snprintf(j->err, sizeof j->err, "at byte %zu of the header: ", j->i);
        va_list ap;
        va_start(ap, fmt);
        if (k > 0 && (size_t)k < sizeof j->err) vsnprintf(j->err + k, sizeof j->err - k, fmt, ap);
        va_end(ap);
    }
    return false;
}

static void js_ws(ck_json *j)
{
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' ||
                           j->s[j->i] == '\r'))
        j->i++;
}

static int js_peek(ck_json *j) { return j->i < j->n ? (unsigned char)j->s[j->i] : -1; }

static bool js_expect(ck_json *j, char c, const char *where)
{
    js_ws(j);
    if (js_peek(j) != (unsigned char)c) {
        if (js_peek(j) < 0) return js_fail(j, "expected '%c' %s, found the end", c, where);
        return js_fail(j, "expected '%c' %s, found '%c'", c, where, js_peek(j));
    }
    j->i++;
    return true;
}

static int js_hex4(ck_json *j)
{
    if (j->i + 4 > j->n) return -1;
    int v = 0;
    for (int k = 0; k < 4; k++) {
        int c = (unsigned char)j->s[j->i + k], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    j->i += 4;
    return v;
}

/* A string, unescaped into *out (malloc'd, NUL-terminated; caller frees). \u0000 is refused:
 * names and values are C strings. */
static bool js_string(ck_json *j, char **out)
{
    *out = NULL;
    if (!js_expect(j, '"', "to open a string")) return false;
    /* Every escape decodes to fewer bytes than it takes (\uXXXX: 6 -> at most 3; a pair:
     * 12 -> 4), so the raw length up to the closing quote bounds the decoded one. */
    size_t k = j->i;
    while (k < j->n && j->s[k] != '"') k += j->s[k] == '\\' ? 2 : 1;
    char *o = malloc(k - j->i + 1);
    if (!o) return js_fail(j, "out of host memory");
    size_t w = 0;
    for (;;) {
        int c = js_peek(j);
        if (c < 0) {
            free(o);
            return js_fail(j, "unterminated string");
        }
        j->i++;
        if (c == '"') break;
        if (c < 0x20) {
            free(o);
            j->i--;
            return js_fail(j, "control character 0x%02x inside a string", c);
        }
        if (c != '\\') {
            o[w++] = (char)c;
            continue;
        }
        int e = js_peek(j);
        j->i++;
        switch (e) {
        case '"': o[w++] = '"'; break;
        case '\\': o[w++] = '\\'; break;
        case '/': o[w++] = '/'; break;
        case 'b': o[w++] = '\b'; break;
        case 'f': o[w++] = '\f'; break;
        case 'n': o[w++] = '\n'; break;
        case 'r': o[w++] = '\r'; break;
        case 't': o[w++] = '\t'; break;
        case 'u': {
            long cp = js_hex4(j);
            if (cp >= 0xd800 && cp <= 0xdbff) { /* a surrogate pair */
                long lo = -1;
                if (j->i + 2 <= j->n && j->s[j->i] == '\\' && j->s[j->i + 1] == 'u') {
                    j->i += 2;
                    lo = js_hex4(j);
                }
                cp = (lo >= 0xdc00 && lo <= 0xdfff)
                         ? 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00)
                         : -2;
            } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                cp = -2;
            }
            if (cp < 0 || cp == 0) {
                free(o);
                return js_fail(j, cp == -1 ? "bad \\u escape (four hex digits expected)"
                                  : cp == -2 ? "unpaired UTF-16 surrogate in a \\u escape"
                                             : "\\u0000 inside a string");
            }
            if (cp < 0x80) {
                o[w++] = (char)cp;
            } else if (cp < 0x800) {
                o[w++] = (char)(0xc0 | (cp >> 6));
                o[w++] = (char)(0x80 | (cp & 0x3f));
            } else if (cp < 0x10000) {
                o[w++] = (char)(0xe0 | (cp >> 12));
                o[w++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                o[w++] = (char)(0x80 | (cp & 0x3f));
            } else {
                o[w++] = (char)(0xf0 | (cp >> 18));
                o[w++] = (char)(0x80 | ((cp >> 12) & 0x3f));
                o[w++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                o[w++] = (char)(0x80 | (cp & 0x3f));
            }
            break;
        }
        default:
            free(o);
            j->i--;
            return js_fail(j, "bad escape in a string");
        }
    }
    o[w] = '\0';
    *out = o;
    return true;
}

/* A non-negative integer: digits only, no leading zero, at most 2^64 - 1. */
static bool js_uint(ck_json *j, uint64_t *out)
{
    js_ws(j);
    int c = js_peek(j);
    if (c < '0' || c > '9') return js_fail(j, "expected a non-negative integer");
    uint64_t v = 0;
    size_t start = j->i;
    while ((c = js_peek(j)) >= '0' && c <= '9') {
        if (v > (UINT64_MAX - (uint64_t)(c - '0')) / 10)
            return js_fail(j, "integer overflows 64 bits");
        v = v * 10 + (uint64_t)(c - '0');
        j->i++;
    }
    if (j->i - start > 1 && j->s[start] == '0') return js_fail(j, "integer with a leading zero");
    if (c == '.' || c == 'e' || c == 'E')
        return js_fail(j, "expected an integer, found a fraction or exponent");
    *out = v;
    return true;
}

/* [u, u, ...] with at most max elements; *count is how many. */
static bool js_uint_array(ck_json *j, uint64_t *v, int max, int *count)
{
    *count = 0;
    if (!js_expect(j, '[', "to open an array")) return false;
    js_ws(j);
    if (js_peek(j) == ']') {
        j->i++;
        return true;
    }
    for (;;) {
        if (*count == max) return js_fail(j, "array longer than %d elements", max);
        if (!js_uint(j, &v[(*count)++])) return false;
        js_ws(j);
        if (js_peek(j) == ',') {
            j->i++;
            continue;
        }
        return js_expect(j, ']', "to close an array");
    }
}

/* Walks an object: calls member(j, key, user) with j positioned at each value; refuses
 * duplicate keys (keys are kept only for that check). */
typedef bool (*js_member_fn)(ck_json *j, const char *key, void *user);

static bool js_object(ck_json *j, js_member_fn member, void *user)
{
    if (!js_expect(j, '{', "to open an object")) return false;
    js_ws(j);
    if (js_peek(j) == '}') {
        j->i++;
        return true;
    }
    char **keys = NULL;
    int nk = 0;
    bool ok = false;
    for (;;) {
        char *key;
        js_ws(j);
        size_t at = j->i;
        if (!js_string(j, &key)) break;
        char **nkeys = realloc(keys, (size_t)(nk + 1) * sizeof *keys);
        if (!nkeys) {
            free(key);
            js_fail(j, "out of host memory");
            break;
        }
        keys = nkeys;
        keys[nk++] = key;
        bool dup = false;
        for (int k = 0; k < nk - 1 && !dup; k++) dup = !strcmp(keys[k], key);
        if (dup) {
            j->i = at;
            js_fail(j, "duplicate key \"%.64s\"", key);
            break;
        }
        if (!js_expect(j, ':', "after a key")) break;
        js_ws(j);
        if (!member(j, key, user)) break;
        js_ws(j);
        if (js_peek(j) == ',') {
            j->i++;
            continue;
        }
        ok = js_expect(j, '}', "or ',' after a member");
        break;
    }
    for (int k = 0; k < nk; k++) free(keys[k]);
    free(keys);
    return ok;
}

/* ---- the header: tensor records and the metadata object ---- */

typedef struct ck_rec {
    char *name;
    char dtype_s[16];  /* as written in the file */
    bool known;        /* dtype_s is one of ours */
    sg_dtype dtype;
    int ndim;
    uint64_t shape[CK_MAX_DIMS];
    uint64_t begin, end;
    bool has_dtype, has_shape, has_offsets;
} ck_rec;

typedef struct ck_header {
    ck_rec *r;
    int n;
    size_t meta_begin, meta_end; /* the metadata object's span in the header text (0, 0: none) */
} ck_header;

static void ck_header_free(ck_header *h)
{
    for (int i = 0; i < h->n; i++) free(h->r[i].name);
    free(h->r);
    memset(h, 0, sizeof *h);
}

static bool tensor_member(ck_json *j, const char *key, void *user)
{
    ck_rec *r = user;
    if (!strcmp(key, "dtype")) {
        char *s;
        if (!js_string(j, &s)) return false;
        bool fits = strlen(s) < sizeof r->dtype_s;
        if (fits) strcpy(r->dtype_s, s);
        free(s);
        if (!fits) return js_fail(j, "tensor \"%.64s\": dtype string too long", r->name);
        r->known = ck_dtype_parse(r->dtype_s, &r->dtype);
        r->has_dtype = true;
        return true;
    }
    if (!strcmp(key, "shape")) {
        r->has_shape = true;
        return js_uint_array(j, r->shape, CK_MAX_DIMS, &r->ndim);
    }
    if (!strcmp(key, "data_offsets")) {
        uint64_t v[2];
        int k;
        if (!js_uint_array(j, v, 2, &k)) return false;
        if (k != 2)
            return js_fail(j, "tensor \"%.64s\": data_offsets needs 2 integers, has %d", r->name,
                           k);
        r->begin = v[0], r->end = v[1];
        r->has_offsets = true;
        return true;
    }
    return js_fail(
        j, "tensor \"%.64s\": unknown field \"%.32s\" (dtype, shape and data_offsets are allowed)",
        r->name, key);
}

static bool meta_member(ck_json *j, const char *key, void *user)
{
    char *v;
    if (!js_string(j, &v)) return false;
    free(v);
    return true;
}

static bool header_member(ck_json *j, const char *key, void *user)
{
    ck_header *h = user;
    if (!strcmp(key, CK_META)) {
        h->meta_begin = j->i;
        if (!js_object(j, meta_member, NULL)) return false;
        h->meta_end = j->i;
        return true;
    }
    ck_rec *nr = realloc(h->r, (size_t)(h->n + 1) * sizeof *nr);
    if (!nr) return js_fail(j, "out of host memory");
    h->r = nr;
    ck_rec *r = &h->r[h->n];
    memset(r, 0, sizeof *r);
    r->name = malloc(strlen(key) + 1);
    if (!r->name) return js_fail(j, "out of host memory");
    strcpy(r->name, key);
    h->n++;
    if (!js_object(j, tensor_member, r)) return false;
    if (!r->has_dtype || !r->has_shape || !r->has_offsets)
        return js_fail(j, "tensor \"%.64s\" lacks %s", r->name,
                       !r->has_dtype ? "dtype" : !r->has_shape ? "shape" : "data_offsets");
    return true;
}

/* Parses the header text (n bytes); on failure h is freed and err says where and why. */
static bool ck_parse_header(const char *text, size_t n, ck_header *h, char *err, size_t cap)
{
    ck_json j = {text, n, 0, {0}};
    memset(h, 0, sizeof *h);
    bool ok = ck_utf8_valid((const unsigned char *)text, n);
    if (!ok) snprintf(j.err, sizeof j.err, "the header is not valid UTF-8");
    if (ok && (n == 0 || text[0] != '{')) ok = js_fail(&j, "the header must begin with '{'");
    if (ok) ok = js_object(&j, header_member, h);
    if (ok) {
        js_ws(&j);
        if (j.i != n) ok = js_fail(&j, "unexpected '%c' after the header object", text[j.i]);
    }
    if (!ok) {
        snprintf(err, cap, "%s", j.err);
        ck_header_free(h);
    }
    return ok;
}

/* ---- shared argument checks ---- */

static sg_status check_entries(sg_ctx *ctx, const char *fn, const char *path,
                               const sg_ckpt_entry *e, int n)
{
    if (!path) return sg_fail(ctx, SG_ERR_NULL, "%s: path is NULL", fn);
    if (n < 0 || (n > 0 && !e))
        return sg_fail(ctx, SG_ERR_INVALID, "%s: '%s': %d entries at %p", fn, path, n,
                       (const void *)e);
    for (int i = 0; i < n; i++) {
        const char *nm = e[i].name;
        if (!nm || !nm[0])
            return sg_fail(ctx, SG_ERR_INVALID, "%s: '%s': entry %d has no name", fn, path, i);
        if (!strcmp(nm, CK_META) || !ck_utf8_valid((const unsigned char *)nm, strlen(nm)))
            return sg_fail(ctx, SG_ERR_INVALID, "%s: '%s': entry %d: tensor name '%s' is %s", fn,
                           path, i, nm, strcmp(nm, CK_META) ? "not valid UTF-8" : "reserved");
        if (!e[i].t)
            return sg_fail(ctx, SG_ERR_NULL, "%s: '%s': tensor '%s' is NULL", fn, path, nm);
        if (e[i].t->ctx != ctx)
            return sg_fail(ctx, SG_ERR_BACKEND, "%s: '%s': tensor '%s' belongs to another context",
                           fn, path, nm);
        for (int k = 0; k < i; k++)
            if (!strcmp(e[k].name, nm))
                return sg_fail(ctx, SG_ERR_INVALID, "%s: '%s': tensor name '%s' appears twice", fn,
                               path, nm);
    }
    return SG_OK;
}

/* ---- save ---- */

typedef struct ck_order {
    int rank, index;
    const char *name;
} ck_order;

static int by_reference_order(const void *a, const void *b)
{
    const ck_order *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The header JSON, padded with spaces so that 8 + its length is a multiple of 8. */
static sg_status build_header(sg_ctx *ctx, const char *path, const sg_ckpt_entry *e,
                              const int *order, int n, const char *const *kv, ck_buf *b)
{
    ck_puts(b, "{");
    bool first = true;
    if (kv && kv[0]) {
        ck_puts(b, "\"" CK_META "\":{");
        for (int k = 0; kv[k]; k += 2) {
            const char *key = kv[k], *val = kv[k + 1];
            if (!val || !ck_utf8_valid((const unsigned char *)key, strlen(key)) ||
                !ck_utf8_valid((const unsigned char *)val, strlen(val)))
                return sg_fail(ctx, SG_ERR_INVALID,
                               "sg_checkpoint_save: '%s': metadata key '%s' has %s", path, key,
                               val ? "a key or value that is not valid UTF-8" : "no value (NULL)");
            for (int p = 0; p < k; p += 2)
                if (!strcmp(kv[p], key))
                    return sg_fail(ctx, SG_ERR_INVALID,
                                   "sg_checkpoint_save: '%s': metadata key '%s' appears twice",
                                   path, key);
            if (k) ck_puts(b, ",");
            ck_put_str(b, key);
            ck_puts(b, ":");
            ck_put_str(b, val);
        }
        ck_puts(b, "}");
        first = false;
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const sg_tensor *t = e[order[i]].t;
        if (!first) ck_puts(b, ",");
        first = false;
        ck_put_str(b, e[order[i]].name);
        ck_puts(b, ":{\"dtype\":\"");
        ck_puts(b, ck_dtype_str(t->dtype));
        ck_puts(b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) ck_puts(b, ",");
            ck_put_u64(b, (uint64_t)t->shape[d]);
        }
        ck_puts(b, "],\"data_offsets\":[");
        ck_put_u64(b, off);
        ck_puts(b, ",");
        off += sg_tensor_nbytes(t);
        ck_put_u64(b, off);
        ck_puts(b, "]}");
    }
    ck_puts(b, "}");
    while (b->n % 8) ck_puts(b, " ");
    if (b->oom)
        return sg_fail(ctx, SG_ERR_OOM,
                       "sg_checkpoint_save: '%s': out of host memory for the header", path);
    return SG_OK;
}

/* fsync of the directory makes the rename itself durable. Best effort: some file systems
 * refuse fsync on a directory, and the data is already safe in the file. */
static void sync_parent_dir(const char *path)
{
    size_t n = strlen(path);
    char *dir = malloc(n + 2);
    if (!dir) return;
    memcpy(dir, path, n + 1);
    char *slash = strrchr(dir, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

static sg_status io_fail(sg_ctx *ctx, const char *what, const char *tmp, const char *path, int err)
{
    return sg_fail(ctx, SG_ERR_IO, "sg_checkpoint_save: '%s': %s '%s': %s", path, what, tmp,
                   strerror(err));
}

/* Writes the header and the tensors to f; tensors pass through one host buffer. */
static sg_status write_body(sg_ctx *ctx, FILE *f, const char *tmp, const char *path,
                            const sg_ckpt_entry *e, const int *order, int n, const ck_buf *hdr)
{
    unsigned char len[8];
    ck_put_u64le(len, (uint64_t)hdr->n);
    if (fwrite(len, 1, 8, f) != 8 || fwrite(hdr->p, 1, hdr->n, f) != hdr->n)
        return io_fail(ctx, "cannot write", tmp, path, errno);
    size_t most = 0;
    for (int i = 0; i < n; i++)
        if (sg_tensor_nbytes(e[i].t) > most) most = sg_tensor_nbytes(e[i].t);
    void *buf = most ? malloc(most) : NULL;
    if (most && !buf)
        return sg_fail(ctx, SG_ERR_OOM, "sg_checkpoint_save: '%s': out of host memory (%zu bytes)",
                       path, most);
    sg_status st = SG_OK;
    for (int i = 0; i < n && st == SG_OK; i++) {
        const sg_tensor *t = e[order[i]].t;
        size_t nb = sg_tensor_nbytes(t);
        st = sg_tensor_copy_to_host(t, buf, nb);
        if (st != SG_OK) break;
        ck_swap_le(buf, nb, sg_dtype_size(t->dtype));
        if (fwrite(buf, 1, nb, f) != nb) st = io_fail(ctx, "cannot write", tmp, path, errno);
    }
    free(buf);
    return st;
}

sg_status sg_checkpoint_save(sg_ctx *ctx, const char *path, const sg_ckpt_entry *e, int n,
                             const char *const *meta_kv)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_entries(ctx, "sg_checkpoint_save", path, e, n));
    SG_TRY(sg_capture_forbid(ctx, "sg_checkpoint_save", "read tensors to the host to save them",
                             "save between steps, after replay"));
    ck_order *by = malloc((size_t)(n ? n : 1) * sizeof *by);
    int *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    char *tmp = malloc(strlen(path) + 32);
    ck_buf hdr = {0};
    if (!by || !order || !tmp) {
        free(by), free(order), free(tmp);
        return sg_fail(ctx, SG_ERR_OOM, "sg_checkpoint_save: '%s': out of host memory", path);
    }
    for (int i = 0; i < n; i++) by[i] = (ck_order){ck_dtype_rank(e[i].t->dtype), i, e[i].name};
    qsort(by, (size_t)n, sizeof *by, by_reference_order);
    for (int i = 0; i < n; i++) order[i] = by[i].index;
    sg_status st = build_header(ctx, path, e, order, n, meta_kv, &hdr);
    FILE *f = NULL;
    bool created = false;
    if (st == SG_OK) {
        snprintf(tmp, strlen(path) + 32, "%s.tmp.%ld", path, (long)getpid());
        f = fopen(tmp, "wb");
        created = f != NULL;
        if (!f) st = io_fail(ctx, "cannot create the temporary", tmp, path, errno);
    }
    if (st == SG_OK) st = write_body(ctx, f, tmp, path, e, order, n, &hdr);
    if (st == SG_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        st = io_fail(ctx, "cannot flush", tmp, path, errno);
    if (f) {
        int rc = fclose(f);
        if (st == SG_OK && rc != 0) st = io_fail(ctx, "cannot close", tmp, path, errno);
    }
    if (st == SG_OK && rename(tmp, path) != 0)
        st = io_fail(ctx, "cannot rename over it the temporary", tmp, path, errno);
    if (created && st != SG_OK) remove(tmp);
    if (st == SG_OK) sync_parent_dir(path);
    free(by), free(order), free(tmp), free(hdr.p);
    return st;
}

/* ---- load ---- */

#define LOAD_FAIL(st, ...) sg_fail(ctx, st, "sg_checkpoint_load: '%s': " __VA_ARGS__)

static int cmp_by_offset(const void *a, const void *b)
{
    const ck_rec *x = *(ck_rec *const *)a, *y = *(ck_rec *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* "[2, 3]" into buf. */
static const char *rec_shape_str(const ck_rec *r, char *buf, size_t cap)
{
    int k = snprintf(buf, cap, "[");
    for (int d = 0; d < r->ndim && k > 0 && (size_t)k < cap; d++)
        k += snprintf(buf + k, cap - k, "%s%llu", d ? ", " : "", (unsigned long long)r->shape[d]);
    if (k > 0 && (size_t)k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

/* Offsets: each record's span matches its dtype and shape, and sorted by offset the spans tile
 * [0, data_len) exactly, as the format requires. */
static sg_status check_offsets(sg_ctx *ctx, const char *path, const ck_header *h, uint64_t data_len)
{
    for (int i = 0; i < h->n; i++) {
        const ck_rec *r = &h->r[i];
        if (r->begin > r->end)
            return LOAD_FAIL(SG_ERR_INVALID,
                             "tensor '%s': data_offsets [%llu, %llu] end before they begin", path,
                             r->name, (unsigned long long)r->begin, (unsigned long long)r->end);
        if (r->end > data_len)
            return LOAD_FAIL(SG_ERR_INVALID,
                             "tensor '%s': data_offsets end at %llu, past the end of the data "
                             "(%llu bytes): the file is truncated or corrupt",
                             path, r->name, (unsigned long long)r->end,
                             (unsigned long long)data_len);
        if (!r->known) continue; /* its size cannot be checked; it fails as a dtype later */
        uint64_t numel = 1;
        for (int d = 0; d < r->ndim; d++) {
            if (r->shape[d] && numel > UINT64_MAX / r->shape[d])
                return LOAD_FAIL(SG_ERR_INVALID, "tensor '%s': shape overflows", path, r->name);
            numel *= r->shape[d];
        }
        uint64_t es = sg_dtype_size(r->dtype);
        if (numel > UINT64_MAX / es || numel * es != r->end - r->begin) {
            char s[160];
            return LOAD_FAIL(SG_ERR_INVALID,
                             "tensor '%s': %s %s needs %llu bytes, its data_offsets [%llu, %llu] "
                             "hold %llu",
                             path, r->name, r->dtype_s, rec_shape_str(r, s, sizeof s),
                             (unsigned long long)(numel * es), (unsigned long long)r->begin,
                             (unsigned long long)r->end, (unsigned long long)(r->end - r->begin));
        }
    }
    const ck_rec **by = malloc((size_t)(h->n ? h->n : 1) * sizeof *by);
    if (!by) return LOAD_FAIL(SG_ERR_OOM, "out of host memory", path);
    for (int i = 0; i < h->n; i++) by[i] = &h->r[i];
    qsort(by, (size_t)h->n, sizeof *by, cmp_by_offset);
    uint64_t at = 0;
    sg_status st = SG_OK;
    for (int i = 0; i < h->n && st == SG_OK; i++) {
        if (by[i]->begin != at)
            st = LOAD_FAIL(SG_ERR_INVALID,
                           "tensor '%s' begins at byte %llu of the data, but %s ends at %llu: "
                           "tensors must be contiguous, without gap or overlap",
                           path, by[i]->name, (unsigned long long)by[i]->begin,
                           i ? "the tensor before it" : "the start of the data section",
                           (unsigned long long)at);
        at = by[i]->end;
    }
    if (st == SG_OK && at != data_len)
        st = LOAD_FAIL(SG_ERR_INVALID,
                       "%llu bytes of data follow the last tensor (which ends at %llu)", path,
                       (unsigned long long)(data_len - at), (unsigned long long)at);
    free(by);
    return st;
}

/* Every caller tensor is in the file with its dtype and shape; the file holds nothing else.
 * match[i] gets the record of entry i. */
static sg_status match_entries(sg_ctx *ctx, const char *path, const ck_header *h,
                               const sg_ckpt_entry *e, int n, const ck_rec **match)
{
    for (int i = 0; i < n; i++) {
        const ck_rec *r = NULL;
        for (int k = 0; k < h->n && !r; k++)
            if (!strcmp(h->r[k].name, e[i].name)) r = &h->r[k];
        if (!r) return LOAD_FAIL(SG_ERR_INVALID, "tensor '%s' is not in the file", path, e[i].name);
        const sg_tensor *t = e[i].t;
        char fs[160], ts[160];
        if (!r->known || r->dtype != t->dtype)
            return LOAD_FAIL(SG_ERR_DTYPE,
                             "tensor '%s' is %s in the file, but the destination is %s", path,
                             e[i].name, r->dtype_s, sg_shape_str(t, ts, sizeof ts));
        bool same = r->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = r->shape[d] == (uint64_t)t->shape[d];
        if (!same)
            return LOAD_FAIL(
                SG_ERR_SHAPE, "tensor '%s' has shape %s in the file, but the destination is %s",
                path, e[i].name, rec_shape_str(r, fs, sizeof fs), sg_shape_str(t, ts, sizeof ts));
        match[i] = r;
    }
    for (int k = 0; k < h->n; k++) {
        bool asked = false;
        for (int i = 0; i < n && !asked; i++) asked = match[i] == &h->r[k];
        if (!asked)
            return LOAD_FAIL(SG_ERR_INVALID,
                             "the file holds tensor '%s', which was not asked for (extra tensors "
                             "are refused: the file is not the state being restored)",
                             path, h->r[k].name);
    }
    return SG_OK;
}

/* Reads exactly n bytes. */
static bool read_all(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

sg_status sg_checkpoint_load(sg_ctx *ctx, const char *path, const sg_ckpt_entry *e, int n,
                             char *meta_json_out, size_t meta_cap)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_entries(ctx, "sg_checkpoint_load", path, e, n));
    SG_TRY(sg_capture_forbid(ctx, "sg_checkpoint_load", "copied a checkpoint into tensors",
                             "load before capture, or between replays"));
    FILE *f = fopen(path, "rb");
    if (!f) return LOAD_FAIL(SG_ERR_IO, "cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        int err = errno;
        fclose(f);
        return LOAD_FAIL(SG_ERR_IO, "cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        fclose(f);
        return LOAD_FAIL(SG_ERR_IO, "not a regular file", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    unsigned char len8[8];
    char *text = NULL, err[256];
    unsigned char *data = NULL;
    const ck_rec **match = NULL;
    ck_header h = {0};
    sg_status st = SG_OK;
    uint64_t hlen = 0, data_len = 0;
    if (size < 8) {
        st = LOAD_FAIL(SG_ERR_INVALID,
                       "the file is %llu bytes, too short for the 8-byte header length "
                       "(truncated, or not a safetensors file)",
                       path, (unsigned long long)size);
    } else if (!read_all(f, len8, 8)) {
        st = LOAD_FAIL(SG_ERR_IO, "cannot read the header length: %s", path, strerror(errno));
    } else {
        hlen = ck_get_u64le(len8);
        if (hlen > size - 8)
            st = LOAD_FAIL(SG_ERR_INVALID, "header length %llu runs past the end of the file (%llu "
                           "bytes): truncated, or not a safetensors file",
                           path, (unsigned long long)hlen, (unsigned long long)size);
        else if (hlen > CK_MAX_HEADER)
            st = LOAD_FAIL(SG_ERR_INVALID, "header length %llu is above the format's limit of %llu",
                           path, (unsigned long long)hlen, (unsigned long long)CK_MAX_HEADER);
        else
            data_len = size - 8 - hlen;
    }
    if (st == SG_OK && !(text = malloc(hlen + 1)))
        st = LOAD_FAIL(SG_ERR_OOM, "out of host memory", path);
    if (st == SG_OK && !read_all(f, text, hlen))
        st = LOAD_FAIL(SG_ERR_IO, "cannot read the %llu-byte header: %s", path,
                       (unsigned long long)hlen, ferror(f) ? strerror(errno) : "the file shrank");
    if (st == SG_OK) {
        text[hlen] = '\0';
        if (!ck_parse_header(text, hlen, &h, err, sizeof err))
            st = LOAD_FAIL(SG_ERR_INVALID, "the header is not valid safetensors JSON: %s", path,
                           err);
    }
    if (st == SG_OK) st = check_offsets(ctx, path, &h, data_len);
    if (st == SG_OK && !(match = calloc((size_t)(n ? n : 1), sizeof *match)))
        st = LOAD_FAIL(SG_ERR_OOM, "out of host memory", path);
    if (st == SG_OK) st = match_entries(ctx, path, &h, e, n, match);
    size_t meta_len = h.meta_end > h.meta_begin ? h.meta_end - h.meta_begin : 2;
    if (st == SG_OK && meta_json_out && meta_len + 1 > meta_cap)
        st = LOAD_FAIL(SG_ERR_INVALID, "the metadata is %zu bytes, the buffer for it holds %zu",
                       path, meta_len + 1, meta_cap);
    if (st == SG_OK && data_len > SIZE_MAX)
        st = LOAD_FAIL(SG_ERR_OOM, "data too large for this host", path);
    if (st == SG_OK && data_len && !(data = malloc((size_t)data_len)))
        st = LOAD_FAIL(SG_ERR_OOM, "out of host memory for %llu bytes of data", path,
                       (unsigned long long)data_len);
    if (st == SG_OK && !read_all(f, data, (size_t)data_len))
        st = LOAD_FAIL(SG_ERR_IO, "cannot read the %llu bytes of data: %s", path,
                       (unsigned long long)data_len,
                       ferror(f) ? strerror(errno) : "the file shrank");
    fclose(f);
    /* Everything validated and in host memory: only now are the tensors written. */
    for (int i = 0; i < n && st == SG_OK; i++) {
        unsigned char *p = data + match[i]->begin;
        size_t nb = (size_t)(match[i]->end - match[i]->begin);
        ck_swap_le(p, nb, sg_dtype_size(e[i].t->dtype));
        st = sg_tensor_copy_from_host(e[i].t, p, nb);
    }
    if (st == SG_OK && meta_json_out) {
        if (h.meta_end > h.meta_begin) {
            memcpy(meta_json_out, text + h.meta_begin, meta_len);
            meta_json_out[meta_len] = '\0';
        } else {
            strcpy(meta_json_out, "{}");
        }
    }
    ck_header_free(&h);
    free(text), free(data), free(match);
    return st;
}

/* ---- metadata values ---- */

typedef struct meta_find {
    const char *key;
    char *out;
    size_t cap;
    int found; /* 1 found and fits, -1 found and too long */
} meta_find;

static bool meta_find_member(ck_json *j, const char *key, void *user)
{
    meta_find *m = user;
    char *v;
    if (!js_string(j, &v)) return false;
    if (!strcmp(key, m->key)) {
        size_t len = strlen(v);
        m->found = len < m->cap ? 1 : -1;
        if (m->found == 1) memcpy(m->out, v, len + 1);
    }
    free(v);
    return true;
}

sg_status sg_checkpoint_meta_get(const char *meta_json, const char *key, char *out, size_t cap)
{
    if (!meta_json || !key || !out) return SG_ERR_NULL;
    if (cap == 0) return SG_ERR_INVALID;
    out[0] = '\0';
    meta_find m = {key, out, cap, 0};
    ck_json j = {meta_json, strlen(meta_json), 0, {0}};
    bool ok = js_object(&j, meta_find_member, &m);
    if (ok) js_ws(&j);
    if (!ok || j.i != j.n || m.found != 1) {
        out[0] = '\0';
        return SG_ERR_INVALID;
    }
    return SG_OK;
}
