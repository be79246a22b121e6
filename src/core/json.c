/* json.c: sg_json, the library's one JSON writer (stepgraph.h): a streaming writer into a FILE
 * or a growing buffer that checks the structure as it goes (keys only inside objects, one value
 * after each key, ends that match their begins) and escapes every string fully. Checkpoint
 * headers, traces and the command's --json and --metrics output are written through it. */
#include "core/core.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>

/* One open object or array. */
typedef struct json_level {
    bool object;
    bool key_done;     /* object: a key was written, its value is due */
    uint64_t count;    /* values (arrays) or members (objects) written so far */
} json_level;

struct sg_json {
    FILE *f;                     /* file writer; NULL: buffer writer */
    char *buf;                   /* buffer writer: the text, NUL-terminated */
    size_t len, cap;
    sg_json_style style;
    bool newline;                /* sg_json_newline: a line break before the next token */
    sg_status st;                /* the first error; sticky */
    char err[200];
    int depth;
    json_level level[SG_JSON_MAX_DEPTH];
    uint64_t top;                /* top-level values begun */
};

static sg_status json_fail(sg_json *w, sg_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static sg_status json_fail(sg_json *w, sg_status st, const char *fmt, ...)
{
    if (w->st != SG_OK) return w->st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
    return w->st = st;
}

/* Appends n bytes to the file or the buffer. */
static void put(sg_json *w, const char *s, size_t n)
{
    if (w->st != SG_OK || n == 0) return;
    if (w->f) {
        if (fwrite(s, 1, n, w->f) != n) json_fail(w, SG_ERR_IO, "sg_json: write failed: %s", strerror(errno));
        return;
    }
    if (w->len + n + 1 > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (w->len + n + 1 > cap) cap *= 2;
        char *p = realloc(w->buf, cap);
        if (!p) {
            json_fail(w, SG_ERR_OOM, "sg_json: out of host memory (%zu bytes of text)", w->len + n + 1);
            return;
        }
        w->buf = p, w->cap = cap;
    }
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

static void puts_(sg_json *w, const char *s) { put(w, s, strlen(s)); }

static void flush_newline(sg_json *w)
{
    if (w->newline) put(w, "\n", 1);
    w->newline = false;
}

/* Length of the valid UTF-8 sequence at u, or 0 (Unicode's table 3-7: no overlong forms, no
 * surrogates, nothing past U+10FFFF). */
static size_t utf8_len(const unsigned char *u)
{
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
    size_t n;
    if (u[0] >= 0xC2 && u[0] <= 0xDF) {
        n = 2;
    } else if (u[0] >= 0xE0 && u[0] <= 0xEF) {
        n = 3;
        if (u[0] == 0xE0) lo = 0xA0; /* not overlong */
        if (u[0] == 0xED) hi = 0x9F; /* not a surrogate */
    } else if (u[0] >= 0xF0 && u[0] <= 0xF4) {
        n = 4;
        if (u[0] == 0xF0) lo = 0x90; /* not overlong */
        if (u[0] == 0xF4) hi = 0x8F; /* not past U+10FFFF */
    } else {
        return 0;
    }
    if (u[1] < lo || u[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (u[i] < 0x80 || u[i] > 0xBF) return 0;
    return n;
}

/* s as a JSON string, escaped as serde_json escapes (the safetensors reference, so checkpoint
 * headers match it byte for byte): quote, backslash, \b \f \n \r \t, other control characters
 * as \u00xx; valid UTF-8 as it is, any other byte as \ufffd (U+FFFD). */
static void put_string(sg_json *w, const char *s)
{
    put(w, "\"", 1);
    const unsigned char *u = (const unsigned char *)s, *run = u; /* run: bytes not yet written */
    while (*u) {
        const char *esc = NULL;
        char hex[8];
        size_t n = 1;
        switch (*u) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (*u < 0x20) {
                snprintf(hex, sizeof hex, "\\u%04x", *u);
                esc = hex;
            } else if (*u >= 0x80) {
                n = utf8_len(u);
                if (n == 0) esc = "\\ufffd", n = 1;
            }
        }
        if (esc) {
            put(w, (const char *)run, (size_t)(u - run));
            puts_(w, esc);
            run = u + n;
        }
        u += n;
    }
    put(w, (const char *)run, (size_t)(u - run));
    put(w, "\"", 1);
}

/* Checks that a value may come now and writes what goes before it (a comma, a pending line
 * break). what names the call in errors. */
static bool begin_value(sg_json *w, const char *what)
{
    if (w->st != SG_OK) return false;
    if (w->depth == 0) {
        if (w->top > 0) {
            json_fail(w, SG_ERR_INVALID, "%s: the document already holds its value; one writer writes one "
                      "value (create another for the next line)", what);
            return false;
        }
        w->top++;
        flush_newline(w);
        return true;
    }
    json_level *l = &w->level[w->depth - 1];
    if (l->object) {
        if (!l->key_done) {
            json_fail(w, SG_ERR_INVALID, "%s: a value inside an object needs its key first (sg_json_key)", what);
            return false;
        }
        l->key_done = false;
        l->count++;
        flush_newline(w);
        return true;
    }
    if (l->count++ > 0) puts_(w, w->style == SG_JSON_SPACED && !w->newline ? ", " : ",");
    flush_newline(w);
    return true;
}

static sg_status check_writer(sg_json *w) { return w ? w->st : SG_ERR_NULL; }

sg_status sg_json_create_file(FILE *f, sg_json_style style, sg_json **out)
{
    if (!out) return SG_ERR_NULL;
    *out = NULL;
    if (!f) return SG_ERR_NULL;
    if (style != SG_JSON_COMPACT && style != SG_JSON_SPACED) return SG_ERR_INVALID;
    sg_json *w = calloc(1, sizeof *w);
    if (!w) return SG_ERR_OOM;
    w->f = f, w->style = style;
    *out = w;
    return SG_OK;
}

sg_status sg_json_create_buffer(sg_json_style style, sg_json **out)
{
    if (!out) return SG_ERR_NULL;
    *out = NULL;
    if (style != SG_JSON_COMPACT && style != SG_JSON_SPACED) return SG_ERR_INVALID;
    sg_json *w = calloc(1, sizeof *w);
    if (!w) return SG_ERR_OOM;
    w->style = style;
    *out = w;
    return SG_OK;
}

void sg_json_destroy(sg_json *w)
{
    if (!w) return;
    free(w->buf);
    free(w);
}

sg_status sg_json_status(const sg_json *w) { return w ? w->st : SG_ERR_NULL; }

const char *sg_json_error(const sg_json *w)
{
    if (!w) return "sg_json: the writer is NULL";
    return w->st == SG_OK ? "" : w->err;
}

const char *sg_json_text(const sg_json *w, size_t *len)
{
    if (len) *len = w && !w->f ? w->len : 0;
    if (!w || w->f) return NULL;
    return w->buf ? w->buf : "";
}

sg_status sg_json_finish(sg_json *w)
{
    SG_TRY(check_writer(w));
    if (w->depth > 0)
        return json_fail(w, SG_ERR_INVALID, "sg_json_finish: %d object(s) or array(s) still open (the "
                         "innermost an %s)", w->depth, w->level[w->depth - 1].object ? "object" : "array");
    if (w->top == 0) return json_fail(w, SG_ERR_INVALID, "sg_json_finish: nothing was written");
    flush_newline(w);
    return w->st;
}

static sg_status open_container(sg_json *w, bool object, const char *what)
{
    SG_TRY(check_writer(w));
    if (w->depth == SG_JSON_MAX_DEPTH)
        return json_fail(w, SG_ERR_INVALID, "%s: more than %d levels of nesting", what, SG_JSON_MAX_DEPTH);
    if (!begin_value(w, what)) return w->st;
    w->level[w->depth++] = (json_level){object, false, 0};
    put(w, object ? "{" : "[", 1);
    return w->st;
}

static sg_status close_container(sg_json *w, bool object, const char *what)
{
    SG_TRY(check_writer(w));
    if (w->depth == 0 || w->level[w->depth - 1].object != object)
        return json_fail(w, SG_ERR_INVALID, "%s: no %s is open here", what, object ? "object" : "array");
    if (object && w->level[w->depth - 1].key_done)
        return json_fail(w, SG_ERR_INVALID, "%s: the last key has no value", what);
    w->depth--;
    flush_newline(w);
    put(w, object ? "}" : "]", 1);
    return w->st;
}

sg_status sg_json_object_begin(sg_json *w) { return open_container(w, true, "sg_json_object_begin"); }
sg_status sg_json_object_end(sg_json *w) { return close_container(w, true, "sg_json_object_end"); }
sg_status sg_json_array_begin(sg_json *w) { return open_container(w, false, "sg_json_array_begin"); }
sg_status sg_json_array_end(sg_json *w) { return close_container(w, false, "sg_json_array_end"); }

sg_status sg_json_key(sg_json *w, const char *key)
{
    SG_TRY(check_writer(w));
    if (!key) return json_fail(w, SG_ERR_NULL, "sg_json_key: key is NULL");
    json_level *l = w->depth ? &w->level[w->depth - 1] : NULL;
    if (!l || !l->object)
        return json_fail(w, SG_ERR_INVALID, "sg_json_key: '%.64s' outside an object", key);
    if (l->key_done)
        return json_fail(w, SG_ERR_INVALID, "sg_json_key: '%.64s' follows a key that has no value", key);
    bool spaced = w->style == SG_JSON_SPACED;
    if (l->count > 0) puts_(w, spaced && !w->newline ? ", " : ",");
    flush_newline(w);
    put_string(w, key);
    puts_(w, spaced ? ": " : ":");
    l->key_done = true;
    return w->st;
}

sg_status sg_json_string(sg_json *w, const char *s)
{
    SG_TRY(check_writer(w));
    if (!begin_value(w, "sg_json_string")) return w->st;
    if (s) put_string(w, s);
    else puts_(w, "null");
    return w->st;
}

sg_status sg_json_int(sg_json *w, int64_t v)
{
    SG_TRY(check_writer(w));
    char s[24];
    snprintf(s, sizeof s, "%lld", (long long)v);
    if (begin_value(w, "sg_json_int")) puts_(w, s);
    return w->st;
}

sg_status sg_json_uint(sg_json *w, uint64_t v)
{
    SG_TRY(check_writer(w));
    char s[24];
    snprintf(s, sizeof s, "%llu", (unsigned long long)v);
    if (begin_value(w, "sg_json_uint")) puts_(w, s);
    return w->st;
}

/* printf writes the locale's decimal separator; JSON has only '.'. */
static void decimal_point(char *s)
{
    for (; *s; s++)
        if (*s == ',') *s = '.';
}

sg_status sg_json_double(sg_json *w, double v)
{
    SG_TRY(check_writer(w));
    if (!begin_value(w, "sg_json_double")) return w->st;
    if (!isfinite(v)) {
        puts_(w, "null");
        return w->st;
    }
    /* The fewest significant digits that read back as v (17 always do), written plainly
     * ("100", "0.00025") for exponents -5 to 16 and with an exponent ("1e-07") beyond. */
    char s[48], f[48];
    int p = 1;
    for (; p <= 17; p++) {
        snprintf(s, sizeof s, "%.*e", p - 1, v);
        if (strtod(s, NULL) == v) break;
    }
    const char *e = strchr(s, 'e');
    int exp10 = e ? atoi(e + 1) : 0;
    if (exp10 >= -5 && exp10 < 17) {
        snprintf(f, sizeof f, "%.*f", p - 1 - exp10 > 0 ? p - 1 - exp10 : 0, v);
        if (strtod(f, NULL) == v) memcpy(s, f, sizeof s);
    }
    decimal_point(s);
    puts_(w, s);
    return w->st;
}

sg_status sg_json_fixed(sg_json *w, double v, int decimals)
{
    SG_TRY(check_writer(w));
    if (decimals < 0 || decimals > 17)
        return json_fail(w, SG_ERR_INVALID, "sg_json_fixed: %d decimals: expected 0 to 17", decimals);
    if (!begin_value(w, "sg_json_fixed")) return w->st;
    if (!isfinite(v)) {
        puts_(w, "null");
        return w->st;
    }
    char s[352]; /* DBL_MAX has 309 digits before the point */
    snprintf(s, sizeof s, "%.*f", decimals, v);
    decimal_point(s);
    puts_(w, s);
    return w->st;
}

sg_status sg_json_bool(sg_json *w, int v)
{
    SG_TRY(check_writer(w));
    if (begin_value(w, "sg_json_bool")) puts_(w, v ? "true" : "false");
    return w->st;
}

sg_status sg_json_null(sg_json *w)
{
    SG_TRY(check_writer(w));
    if (begin_value(w, "sg_json_null")) puts_(w, "null");
    return w->st;
}

sg_status sg_json_newline(sg_json *w)
{
    SG_TRY(check_writer(w));
    w->newline = true;
    return SG_OK;
}

sg_status sg_json_write_string(FILE *f, const char *s)
{
    if (!f) return SG_ERR_NULL;
    sg_json w = {.f = f, .style = SG_JSON_COMPACT};
    SG_TRY(sg_json_string(&w, s));
    return SG_OK;
}
