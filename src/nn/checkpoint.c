/* checkpoint.c: safetensors files (see checkpoint.h for the layout): an atomic writer that
 * checks its target first (a regular file or none, in a writable directory; links written
 * through; mode kept; stale temporaries removed) and never writes NaN or Inf, and a loader that
 * opens only regular files and reads and validates the whole file (values finite included)
 * before it writes any tensor. The header is parsed, in n log n of its size, by a small strict
 * JSON reader that takes exactly what the format needs: objects, arrays of non-negative
 * integers, and strings with escapes. Nothing else (numbers with a sign, fraction or exponent,
 * true/false/null, trailing commas, duplicate keys) is accepted. */
#define _XOPEN_SOURCE 700 /* POSIX 2008 with realpath */

#include "nn/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
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

/* The first NaN or infinity among the nbytes of dt values at p (host order): true, with its
 * index and what it is; false when every value is finite or dt is not a floating type. The
 * values are read by memcpy: a file may put an F64 at any offset. */
static bool ck_find_nonfinite(const unsigned char *p, size_t nbytes, sg_dtype dt, size_t *at,
                              const char **what)
{
    uint64_t expo, frac, sign;
    switch (dt) {
    case SG_DTYPE_F32: expo = 0x7f800000u, frac = 0x007fffffu, sign = 0x80000000u; break;
    case SG_DTYPE_BF16: expo = 0x7f80u, frac = 0x007fu, sign = 0x8000u; break;
    case SG_DTYPE_F64:
        expo = 0x7ff0000000000000u, frac = 0x000fffffffffffffu, sign = 0x8000000000000000u;
        break;
    default: return false;
    }
    size_t es = sg_dtype_size(dt);
    for (size_t i = 0; i + es <= nbytes; i += es) {
        uint64_t v = 0;
        if (es == 2) { uint16_t u; memcpy(&u, p + i, 2); v = u; }
        else if (es == 4) { uint32_t u; memcpy(&u, p + i, 4); v = u; }
        else memcpy(&v, p + i, 8);
        if ((v & expo) != expo) continue;
        *at = i / es;
        *what = (v & frac) ? "NaN" : (v & sign) ? "-Inf" : "Inf";
        return true;
    }
    return false;
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

/* ---- the header's bytes: a growing buffer ---- */

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
 * duplicate keys. The keys are kept with where they began, sorted once the object is read, and
 * compared neighbour to neighbour: n log n, where comparing each new key with every earlier
 * one took 65 s to refuse a header of 200,000 keys. */
typedef bool (*js_member_fn)(ck_json *j, const char *key, void *user);

typedef struct js_key {
    char *s;
    size_t at; /* byte of the header where the key began */
} js_key;

static int js_key_cmp(const void *a, const void *b)
{
    const js_key *x = a, *y = b;
    int c = strcmp(x->s, y->s);
    return c ? c : (x->at > y->at) - (x->at < y->at);
}

/* The first key (in header order) that repeats an earlier one: a failure at its byte. */
static bool js_keys_unique(ck_json *j, js_key *keys, size_t nk)
{
    qsort(keys, nk, sizeof *keys, js_key_cmp);
    size_t first = SIZE_MAX, which = 0;
    for (size_t k = 1; k < nk; k++)
        if (!strcmp(keys[k - 1].s, keys[k].s) && keys[k].at < first) first = keys[k].at, which = k;
    if (first == SIZE_MAX) return true;
    j->i = first;
    return js_fail(j, "duplicate key \"%.64s\"", keys[which].s);
}

static bool js_object(ck_json *j, js_member_fn member, void *user)
{
    if (!js_expect(j, '{', "to open an object")) return false;
    js_ws(j);
    if (js_peek(j) == '}') {
        j->i++;
        return true;
    }
    js_key *keys = NULL;
    size_t nk = 0, cap = 0;
    bool ok = false;
    for (;;) {
        char *key;
        js_ws(j);
        size_t at = j->i;
        if (!js_string(j, &key)) break;
        if (nk == cap) {
            size_t ncap = cap ? 2 * cap : 8;
            js_key *nkeys = realloc(keys, ncap * sizeof *keys);
            if (!nkeys) {
                free(key);
                js_fail(j, "out of host memory");
                break;
            }
            keys = nkeys, cap = ncap;
        }
        keys[nk++] = (js_key){key, at};
        if (!js_expect(j, ':', "after a key")) break;
        js_ws(j);
        if (!member(j, key, user)) break;
        js_ws(j);
        if (js_peek(j) == ',') {
            j->i++;
            continue;
        }
        ok = js_expect(j, '}', "or ',' after a member") && js_keys_unique(j, keys, nk);
        break;
    }
    for (size_t k = 0; k < nk; k++) free(keys[k].s);
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
    int n, cap;
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
    if (h->n == h->cap) { /* grown by doubling: a record at a time copied them all again */
        if (h->cap > INT_MAX / 2) return js_fail(j, "more than %d tensors", h->cap);
        int cap = h->cap ? 2 * h->cap : 16;
        ck_rec *nr = realloc(h->r, (size_t)cap * sizeof *nr);
        if (!nr) return js_fail(j, "out of host memory");
        h->r = nr, h->cap = cap;
    }
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

/* The header's metadata pairs: valid UTF-8, no key twice. */
static sg_status check_meta(sg_ctx *ctx, const char *path, const char *const *kv)
{
    for (int k = 0; kv && kv[k]; k += 2) {
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
    }
    return SG_OK;
}

/* The header JSON, compact as the reference writes it (sg_json; names and values are valid
 * UTF-8, so escaping matches serde_json's byte for byte), padded with spaces so that 8 + its
 * length is a multiple of 8. */
static sg_status build_header(sg_ctx *ctx, const char *path, const sg_ckpt_entry *e,
                              const int *order, int n, const char *const *kv, ck_buf *b)
{
    SG_TRY(check_meta(ctx, path, kv));
    sg_json *w = NULL;
    sg_status st = sg_json_create_buffer(SG_JSON_COMPACT, &w);
    if (st != SG_OK)
        return sg_fail(ctx, st, "sg_checkpoint_save: '%s': out of host memory for the header", path);
    sg_json_object_begin(w);
    if (kv && kv[0]) {
        sg_json_key(w, CK_META);
        sg_json_object_begin(w);
        for (int k = 0; kv[k]; k += 2) {
            sg_json_key(w, kv[k]);
            sg_json_string(w, kv[k + 1]);
        }
        sg_json_object_end(w);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const sg_tensor *t = e[order[i]].t;
        sg_json_key(w, e[order[i]].name);
        sg_json_object_begin(w);
        sg_json_key(w, "dtype");
        sg_json_string(w, ck_dtype_str(t->dtype));
        sg_json_key(w, "shape");
        sg_json_array_begin(w);
        for (int d = 0; d < t->ndim; d++) sg_json_uint(w, (uint64_t)t->shape[d]);
        sg_json_array_end(w);
        sg_json_key(w, "data_offsets");
        sg_json_array_begin(w);
        sg_json_uint(w, off);
        off += sg_tensor_nbytes(t);
        sg_json_uint(w, off);
        sg_json_array_end(w);
        sg_json_object_end(w);
    }
    sg_json_object_end(w);
    st = sg_json_finish(w);
    size_t len = 0;
    const char *text = sg_json_text(w, &len);
    if (st == SG_OK) ck_put(b, text, len);
    while (st == SG_OK && !b->oom && b->n % 8) ck_put(b, " ", 1);
    if (st == SG_ERR_OOM || b->oom)
        st = sg_fail(ctx, SG_ERR_OOM, "sg_checkpoint_save: '%s': out of host memory for the header",
                     path);
    else if (st != SG_OK) /* a bug here: the writer's structure checks failed */
        st = sg_fail(ctx, st, "sg_checkpoint_save: '%s': the header: %s", path, sg_json_error(w));
    sg_json_destroy(w);
    return st;
}

/* ---- the save target: checked before anything is written ---- */


/* Where a save goes. file: the path the temporary is renamed over: path itself, or the file
 * a symbolic link at path names (realpath); dir and base: its directory and last component;
 * st: its status when it exists. */
typedef struct ck_target {
    char *file, *dir;
    const char *base; /* within file */
    bool exists;
    struct stat st;
} ck_target;

static void target_free(ck_target *t)
{
    free(t->file), free(t->dir);
    memset(t, 0, sizeof *t);
}

/* t->dir and t->base from t->file: "ck" is in ".", "/ck" in "/". */
static bool target_split(ck_target *t)
{
    const char *slash = strrchr(t->file, '/');
    size_t dl = !slash ? 1 : slash == t->file ? 1 : (size_t)(slash - t->file);
    t->base = slash ? slash + 1 : t->file;
    if (!(t->dir = malloc(dl + 1))) return false;
    memcpy(t->dir, slash ? t->file : ".", dl);
    t->dir[dl] = '\0';
    return true;
}

/* The directory a save writes in exists, is a directory, and is writable and searchable. */
static sg_status target_check_dir(sg_ctx *ctx, const char *fn, const char *path, const char *dir)
{
    struct stat ds;
    if (stat(dir, &ds) != 0)
        return sg_fail(ctx, SG_ERR_IO, "%s: '%s': the directory '%s' %s", fn, path, dir,
                       errno == ENOENT ? "does not exist" : strerror(errno));
    if (!S_ISDIR(ds.st_mode))
        return sg_fail(ctx, SG_ERR_IO, "%s: '%s': '%s' is %s, not a directory", fn, path, dir,
                       sg_file_kind(ds.st_mode));
    if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) != 0)
        return sg_fail(ctx, SG_ERR_IO, "%s: '%s': the directory '%s' is not writable: %s", fn,
                       path, dir, strerror(errno));
    return SG_OK;
}

/* path's target resolved and checked (fn names the caller in messages): not empty; a symbolic
 * link is followed to an existing file (a dangling link is refused: the file it would create
 * is not where the user looks); the file absent or a regular file (never a device, FIFO,
 * directory or socket, which a rename would replace); its directory existing, a directory,
 * writable and searchable. */
static sg_status target_resolve(sg_ctx *ctx, const char *fn, const char *path, ck_target *t)
{
    memset(t, 0, sizeof *t);
    if (!path) return sg_fail(ctx, SG_ERR_NULL, "%s: path is NULL", fn);
    if (!path[0])
        return sg_fail(ctx, SG_ERR_INVALID, "%s: '': the path is empty; expected a file name", fn);
    struct stat ls;
    bool link = lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode);
    if (link && !(t->file = realpath(path, NULL))) {
        int err = errno;
        char to[512];
        ssize_t k = readlink(path, to, sizeof to - 1);
        to[k > 0 ? k : 0] = '\0';
        return sg_fail(ctx, SG_ERR_IO, "%s: '%s' is a symbolic link to '%s', which %s%s: a "
                       "save writes through a link only to an existing file",
                       fn, path, to, err == ENOENT ? "does not exist" : "cannot be resolved: ",
                       err == ENOENT ? "" : strerror(err));
    }
    if (!link && !(t->file = strdup(path)))
        return sg_fail(ctx, SG_ERR_OOM, "%s: '%s': out of host memory", fn, path);
    sg_status st = SG_OK;
    if (!target_split(t)) {
        st = sg_fail(ctx, SG_ERR_OOM, "%s: '%s': out of host memory", fn, path);
    } else if (lstat(t->file, &t->st) == 0) {
        t->exists = true;
        if (!S_ISREG(t->st.st_mode))
            st = sg_fail(ctx, SG_ERR_IO, "%s: '%s'%s%s%s is %s, not a regular file: a checkpoint "
                         "is written only to a new file or over a regular file",
                         fn, path, link ? " (a link to '" : "", link ? t->file : "",
                         link ? "')" : "", sg_file_kind(t->st.st_mode));
    } else if (errno != ENOENT) {
        st = sg_fail(ctx, SG_ERR_IO, "%s: '%s': %s", fn, path, strerror(errno));
    } else if (!t->base[0]) {
        st = sg_fail(ctx, SG_ERR_INVALID, "%s: '%s' ends in '/': expected a file name", fn, path);
    }
    if (st == SG_OK) st = target_check_dir(ctx, fn, path, t->dir);
    if (st != SG_OK) target_free(t);
    return st;
}

sg_status sg_checkpoint_check_path(sg_ctx *ctx, const char *path)
{
    if (!ctx) return SG_ERR_NULL;
    ck_target t;
    SG_TRY(target_resolve(ctx, "sg_checkpoint_check_path", path, &t));
    target_free(&t);
    return SG_OK;
}

/* Removes "<base>.tmp.<pid>" files in the target's directory left by saves that never
 * finished: their pid no longer exists (kill says ESRCH), or it is this process's own (a
 * leftover of an earlier process that had the pid: this one has no save of the file in
 * flight). Only regular files named exactly so; nothing else is touched. */
static void remove_stale_temporaries(const ck_target *t)
{
    DIR *d = opendir(t->dir);
    if (!d) return;
    size_t bl = strlen(t->base);
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *nm = de->d_name, *dg = nm + bl + 5;
        if (strncmp(nm, t->base, bl) || strncmp(nm + bl, ".tmp.", 5)) continue;
        size_t nd = strspn(dg, "0123456789");
        if (nd == 0 || nd > 9 || dg[nd] || dg[0] == '0') continue; /* as "%ld" writes a pid */
        pid_t pid = (pid_t)strtol(dg, NULL, 10);
        if (pid != getpid() && !(kill(pid, 0) != 0 && errno == ESRCH)) continue;
        struct stat sb;
        if (fstatat(dirfd(d), nm, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode))
            (void)unlinkat(dirfd(d), nm, 0);
    }
    closedir(d);
}

/* fsync of the directory makes the rename itself durable. Best effort: some file systems
 * refuse fsync on a directory, and the data is already safe in the file. */
static void sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

static sg_status io_fail(sg_ctx *ctx, const char *what, const char *tmp, const char *path, int err)
{
    return sg_fail(ctx, SG_ERR_IO, "sg_checkpoint_save: '%s': %s '%s': %s", path, what, tmp,
                   strerror(err));
}

/* Writes the header and the tensors to f; tensors pass through one host buffer, and one
 * holding NaN or Inf stops the save. */
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
        size_t nb = sg_tensor_nbytes(t), at;
        const char *what;
        st = sg_tensor_copy_to_host(t, buf, nb);
        if (st != SG_OK) break;
        if (ck_find_nonfinite(buf, nb, t->dtype, &at, &what)) {
            st = sg_fail(ctx, SG_ERR_INVALID, "sg_checkpoint_save: '%s': tensor '%s' holds a "
                         "non-finite value (%s) at element %zu: a checkpoint with NaN or Inf is "
                         "never written (an existing file is left as it was)",
                         path, e[order[i]].name, what, at);
            break;
        }
        ck_swap_le(buf, nb, sg_dtype_size(t->dtype));
        if (fwrite(buf, 1, nb, f) != nb) st = io_fail(ctx, "cannot write", tmp, path, errno);
    }
    free(buf);
    return st;
}

/* Creates the temporary (exclusively: a stale one was removed) with the target's permission
 * bits, and its owner when root can keep it. */
static sg_status create_temporary(sg_ctx *ctx, const ck_target *t, const char *tmp,
                                  const char *path, FILE **out)
{
    *out = NULL;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) return io_fail(ctx, "cannot create the temporary", tmp, path, errno);
    int err = 0;
    if (t->exists) {
        /* Before fchmod. Not fatal: failing, the file keeps root as its owner, as a new one would. */
        if (geteuid() == 0 && fchown(fd, t->st.st_uid, t->st.st_gid) != 0) err = 0;
        if (fchmod(fd, t->st.st_mode & 0777) != 0) err = errno;
    }
    if (!err && !(*out = fdopen(fd, "wb"))) err = errno;
    if (!err) return SG_OK;
    close(fd);
    remove(tmp);
    return io_fail(ctx, "cannot set up the temporary", tmp, path, err);
}

sg_status sg_checkpoint_save(sg_ctx *ctx, const char *path, const sg_ckpt_entry *e, int n,
                             const char *const *meta_kv)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_entries(ctx, "sg_checkpoint_save", path, e, n));
    SG_TRY(sg_capture_forbid(ctx, "sg_checkpoint_save", "read tensors to the host to save them",
                             "save between steps, after replay"));
    ck_target tg;
    SG_TRY(target_resolve(ctx, "sg_checkpoint_save", path, &tg));
    ck_order *by = malloc((size_t)(n ? n : 1) * sizeof *by);
    int *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    size_t tcap = strlen(tg.file) + 32;
    char *tmp = malloc(tcap);
    ck_buf hdr = {0};
    if (!by || !order || !tmp) {
        free(by), free(order), free(tmp);
        target_free(&tg);
        return sg_fail(ctx, SG_ERR_OOM, "sg_checkpoint_save: '%s': out of host memory", path);
    }
    for (int i = 0; i < n; i++) by[i] = (ck_order){ck_dtype_rank(e[i].t->dtype), i, e[i].name};
    qsort(by, (size_t)n, sizeof *by, by_reference_order);
    for (int i = 0; i < n; i++) order[i] = by[i].index;
    sg_status st = build_header(ctx, path, e, order, n, meta_kv, &hdr);
    FILE *f = NULL;
    if (st == SG_OK) {
        remove_stale_temporaries(&tg);
        snprintf(tmp, tcap, "%s.tmp.%ld", tg.file, (long)getpid());
        st = create_temporary(ctx, &tg, tmp, path, &f);
    }
    bool created = f != NULL;
    if (st == SG_OK) st = write_body(ctx, f, tmp, path, e, order, n, &hdr);
    if (st == SG_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        st = io_fail(ctx, "cannot flush", tmp, path, errno);
    if (f) {
        int rc = fclose(f);
        if (st == SG_OK && rc != 0) st = io_fail(ctx, "cannot close", tmp, path, errno);
    }
    struct stat now; /* what the target became while the file was written */
    if (st == SG_OK && lstat(tg.file, &now) == 0 && !S_ISREG(now.st_mode))
        st = sg_fail(ctx, SG_ERR_IO, "sg_checkpoint_save: '%s' became %s while it was written",
                     tg.file, sg_file_kind(now.st_mode));
    if (st == SG_OK && rename(tmp, tg.file) != 0)
        st = io_fail(ctx, "cannot rename over it the temporary", tmp, path, errno);
    if (created && st != SG_OK) remove(tmp);
    if (st == SG_OK) sync_dir(tg.dir);
    free(by), free(order), free(tmp), free(hdr.p);
    target_free(&tg);
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

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp((*(ck_rec *const *)a)->name, (*(ck_rec *const *)b)->name);
}

/* The record named name among the n sorted by name, or NULL. */
static const ck_rec *find_rec(const ck_rec *const *by_name, int n, const char *name)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(by_name[mid]->name, name);
        if (!c) return by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* Every caller tensor is in the file with its dtype and shape; the file holds nothing else.
 * match[i] gets the record of entry i. Names are looked up in the records sorted by name:
 * (n + records) log records, however many tensors a file lists. */
static sg_status match_entries(sg_ctx *ctx, const char *path, const ck_header *h,
                               const sg_ckpt_entry *e, int n, const ck_rec **match)
{
    const ck_rec **by = malloc((size_t)(h->n ? h->n : 1) * sizeof *by);
    bool *asked = calloc((size_t)(h->n ? h->n : 1), sizeof *asked);
    sg_status st = SG_OK;
    if (!by || !asked) st = LOAD_FAIL(SG_ERR_OOM, "out of host memory", path);
    for (int k = 0; k < h->n && st == SG_OK; k++) by[k] = &h->r[k];
    if (st == SG_OK) qsort(by, (size_t)h->n, sizeof *by, cmp_by_name);
    for (int i = 0; i < n && st == SG_OK; i++) {
        const ck_rec *r = find_rec(by, h->n, e[i].name);
        const sg_tensor *t = e[i].t;
        char fs[160], ts[160];
        bool same = r && r->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = r->shape[d] == (uint64_t)t->shape[d];
        if (!r)
            st = LOAD_FAIL(SG_ERR_INVALID, "tensor '%s' is not in the file", path, e[i].name);
        else if (!r->known || r->dtype != t->dtype)
            st = LOAD_FAIL(SG_ERR_DTYPE, "tensor '%s' is %s in the file, but the destination is %s",
                           path, e[i].name, r->dtype_s, sg_shape_str(t, ts, sizeof ts));
        else if (!same)
            st = LOAD_FAIL(SG_ERR_SHAPE,
                           "tensor '%s' has shape %s in the file, but the destination is %s", path,
                           e[i].name, rec_shape_str(r, fs, sizeof fs),
                           sg_shape_str(t, ts, sizeof ts));
        if (st != SG_OK) break;
        match[i] = r;
        asked[r - h->r] = true;
    }
    for (int k = 0; k < h->n && st == SG_OK; k++)
        if (!asked[k])
            st = LOAD_FAIL(SG_ERR_INVALID,
                           "the file holds tensor '%s', which was not asked for (extra tensors "
                           "are refused: the file is not the state being restored)",
                           path, h->r[k].name);
    free(by), free(asked);
    return st;
}

/* Reads exactly n bytes. */
static bool read_all(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

/* A regular file, opened without ever blocking on it (sg_file_open_regular), as a stream;
 * *size: the file's size. */
static sg_status open_regular(sg_ctx *ctx, const char *path, FILE **out, uint64_t *size)
{
    *out = NULL;
    int fd;
    int64_t n;
    SG_TRY(sg_file_open_regular(ctx, "sg_checkpoint_load", path, &fd, &n));
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return LOAD_FAIL(SG_ERR_IO, "cannot open: %s", path, strerror(errno));
    }
    *out = f;
    *size = (uint64_t)n;
    return SG_OK;
}

/* The header length, the header text (*text, NUL-terminated; caller frees) parsed into h with
 * its offsets checked against the data that follows (*data_len bytes). */
static sg_status read_header(sg_ctx *ctx, const char *path, FILE *f, uint64_t size, char **text,
                             ck_header *h, uint64_t *data_len)
{
    unsigned char len8[8];
    char err[256];
    if (size < 8)
        return LOAD_FAIL(SG_ERR_INVALID,
                         "the file is %llu bytes, too short for the 8-byte header length "
                         "(truncated, or not a safetensors file)",
                         path, (unsigned long long)size);
    if (!read_all(f, len8, 8))
        return LOAD_FAIL(SG_ERR_IO, "cannot read the header length: %s", path, strerror(errno));
    uint64_t hlen = ck_get_u64le(len8);
    if (hlen > size - 8)
        return LOAD_FAIL(SG_ERR_INVALID, "header length %llu runs past the end of the file (%llu "
                         "bytes): truncated, or not a safetensors file",
                         path, (unsigned long long)hlen, (unsigned long long)size);
    if (hlen > CK_MAX_HEADER)
        return LOAD_FAIL(SG_ERR_INVALID, "header length %llu is above the format's limit of %llu",
                         path, (unsigned long long)hlen, (unsigned long long)CK_MAX_HEADER);
    *data_len = size - 8 - hlen;
    if (!(*text = malloc(hlen + 1))) return LOAD_FAIL(SG_ERR_OOM, "out of host memory", path);
    if (!read_all(f, *text, hlen))
        return LOAD_FAIL(SG_ERR_IO, "cannot read the %llu-byte header: %s", path,
                         (unsigned long long)hlen, ferror(f) ? strerror(errno) : "the file shrank");
    (*text)[hlen] = '\0';
    if (!ck_parse_header(*text, hlen, h, err, sizeof err))
        return LOAD_FAIL(SG_ERR_INVALID, "the header is not valid safetensors JSON: %s", path, err);
    return check_offsets(ctx, path, h, *data_len);
}

/* Each tensor's bytes put in host order, and every floating value finite: a NaN or an
 * infinity would train on as NaN (and be saved again), so the file is refused naming the
 * tensor and the element. */
static sg_status check_finite(sg_ctx *ctx, const char *path, const sg_ckpt_entry *e, int n,
                              const ck_rec *const *match, unsigned char *data)
{
    for (int i = 0; i < n; i++) {
        size_t nb = (size_t)(match[i]->end - match[i]->begin), at;
        const char *what;
        if (!nb) continue;
        unsigned char *p = data + match[i]->begin;
        ck_swap_le(p, nb, sg_dtype_size(e[i].t->dtype));
        if (ck_find_nonfinite(p, nb, e[i].t->dtype, &at, &what))
            return LOAD_FAIL(SG_ERR_INVALID,
                             "tensor '%s' holds a non-finite value (%s) at element %zu: a "
                             "checkpoint with NaN or Inf is refused",
                             path, e[i].name, what, at);
    }
    return SG_OK;
}

/* The metadata object's text ("{}" when the header has none), malloc'd. */
static char *meta_text(const char *text, const ck_header *h)
{
    size_t len = h->meta_end > h->meta_begin ? h->meta_end - h->meta_begin : 2;
    char *m = malloc(len + 1);
    if (!m) return NULL;
    memcpy(m, h->meta_end > h->meta_begin ? text + h->meta_begin : "{}", len);
    m[len] = '\0';
    return m;
}

sg_status sg_checkpoint_load_ex(sg_ctx *ctx, const char *path, const sg_ckpt_entry *e, int n,
                                char *meta_json_out, size_t meta_cap, sg_ckpt_meta_check check,
                                void *user)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_entries(ctx, "sg_checkpoint_load", path, e, n));
    SG_TRY(sg_capture_forbid(ctx, "sg_checkpoint_load", "copied a checkpoint into tensors",
                             "load before capture, or between replays"));
    FILE *f;
    uint64_t size = 0, data_len = 0;
    SG_TRY(open_regular(ctx, path, &f, &size));
    char *text = NULL, *meta = NULL;
    unsigned char *data = NULL;
    const ck_rec **match = NULL;
    ck_header h = {0};
    sg_status st = read_header(ctx, path, f, size, &text, &h, &data_len);
    if (st == SG_OK && !(match = calloc((size_t)(n ? n : 1), sizeof *match)))
        st = LOAD_FAIL(SG_ERR_OOM, "out of host memory", path);
    if (st == SG_OK && !(meta = meta_text(text, &h)))
        st = LOAD_FAIL(SG_ERR_OOM, "out of host memory", path);
    if (st == SG_OK && meta_json_out && strlen(meta) + 1 > meta_cap)
        st = LOAD_FAIL(SG_ERR_INVALID, "the metadata is %zu bytes, the buffer for it holds %zu",
                       path, strlen(meta) + 1, meta_cap);
    /* The caller's metadata check first: it names what differs between the runs (a model, an
     * optimizer state's dtype) where a tensor's mismatch would only show its effect. */
    if (st == SG_OK && check) st = check(ctx, path, meta, user);
    if (st == SG_OK) st = match_entries(ctx, path, &h, e, n, match);
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
    if (st == SG_OK) st = check_finite(ctx, path, e, n, match, data);
    /* Everything validated and in host memory: only now are the tensors written. */
    for (int i = 0; i < n && st == SG_OK; i++)
        st = sg_tensor_copy_from_host(e[i].t, data ? data + match[i]->begin : NULL,
                                      (size_t)(match[i]->end - match[i]->begin));
    if (st == SG_OK && meta_json_out) strcpy(meta_json_out, meta);
    ck_header_free(&h);
    free(text), free(meta), free(data), free(match);
    return st;
}

sg_status sg_checkpoint_load(sg_ctx *ctx, const char *path, const sg_ckpt_entry *e, int n,
                             char *meta_json_out, size_t meta_cap)
{
    return sg_checkpoint_load_ex(ctx, path, e, n, meta_json_out, meta_cap, NULL, NULL);
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
