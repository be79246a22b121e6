/* test_json.c: sg_json, the one JSON writer (core/json.c). `cpu`: every control character, quote
 * and backslash escaped as serde_json escapes them, UTF-8 kept and every other byte written as
 * U+FFFD; nested objects and arrays in both styles, byte for byte; numbers (integers exact at
 * their limits, shortest round-trip doubles, fixed decimals, null for NaN and infinities);
 * misuse refused with SG_ERR_INVALID and the error sticking; file writers (a failed write is
 * SG_ERR_IO); then random strings written and read back by a decoder here and, where python3
 * is installed, by Python's json module. `gpu`: nothing on the device; skipped. */
#include "testutil.h"

#include <float.h>
#include <stdint.h>
#include <unistd.h>

/* The text a buffer writer holds; "" if none. */
static const char *text_of(const sg_json *w)
{
    const char *t = sg_json_text(w, NULL);
    return t ? t : "";
}

static sg_json *buffer(sg_json_style style)
{
    sg_json *w = NULL;
    TU_CHECK(sg_json_create_buffer(style, &w) == SG_OK && w, "sg_json_create_buffer");
    if (!w) exit(1);
    return w;
}

/* One value written by fn into a compact buffer writer must read exactly `want`. */
static void expect_text(const char *what, sg_json *w, const char *want)
{
    sg_status st = sg_json_finish(w);
    TU_CHECK(st == SG_OK, "%s: finish %s: %s", what, sg_status_name(st), sg_json_error(w));
    TU_CHECK(!strcmp(text_of(w), want), "%s:\n  got  %s\n  want %s", what, text_of(w), want);
    sg_json_destroy(w);
}

static void string_is(const char *what, const char *s, const char *want)
{
    sg_json *w = buffer(SG_JSON_COMPACT);
    sg_json_string(w, s);
    expect_text(what, w, want);
}

static void cpu_escapes(void)
{
    /* Every control character: the short forms serde_json uses, \u00xx (lowercase) for the rest. */
    char s[32];
    for (int c = 1; c < 32; c++) s[c - 1] = (char)c;
    s[31] = '\0';
    string_is("control characters", s,
              "\"\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e\\u000f"
              "\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019\\u001a\\u001b\\u001c"
              "\\u001d\\u001e\\u001f\"");
    string_is("quote, backslash, slash, DEL", "a\"b\\c/d\x7f", "\"a\\\"b\\\\c/d\x7f\"");
    string_is("empty", "", "\"\"");
    string_is("NULL is null", NULL, "null");
    /* UTF-8 as it is: 2, 3 and 4 bytes. */
    string_is("UTF-8", "\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf",
              "\"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf\"");
    /* Not UTF-8: each byte of a bad sequence becomes U+FFFD (what follows is read afresh). */
    string_is("stray continuation and 0xff", "\x80x\xff", "\"\\ufffdx\\ufffd\"");
    string_is("truncated sequence", "\xe2\x82", "\"\\ufffd\\ufffd\"");
    string_is("overlong", "\xc0\xaf", "\"\\ufffd\\ufffd\"");
    string_is("surrogate", "\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\"");
    string_is("past U+10FFFF", "\xf4\x90\x80\x80", "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
    string_is("lead then ASCII", "\xc3(", "\"\\ufffd(\"");

    /* Keys are escaped the same way. */
    sg_json *w = buffer(SG_JSON_COMPACT);
    sg_json_object_begin(w);
    sg_json_key(w, "k\"\n\x01");
    sg_json_int(w, 1);
    sg_json_object_end(w);
    expect_text("escaped key", w, "{\"k\\\"\\n\\u0001\":1}");
}

/* The same document in both styles. */
static void write_nested(sg_json *w)
{
    sg_json_object_begin(w);
    sg_json_key(w, "a");
    sg_json_array_begin(w);
    sg_json_int(w, 1);
    sg_json_object_begin(w);
    sg_json_key(w, "b");
    sg_json_null(w);
    sg_json_key(w, "c");
    sg_json_array_begin(w);
    sg_json_array_end(w);
    sg_json_key(w, "d");
    sg_json_object_begin(w);
    sg_json_object_end(w);
    sg_json_object_end(w);
    sg_json_bool(w, 1);
    sg_json_bool(w, 0);
    sg_json_array_begin(w);
    sg_json_array_begin(w);
    sg_json_string(w, "x");
    sg_json_array_end(w);
    sg_json_array_end(w);
    sg_json_array_end(w);
    sg_json_key(w, "e");
    sg_json_string(w, "f");
    sg_json_object_end(w);
}

static void cpu_nesting(void)
{
    sg_json *w = buffer(SG_JSON_COMPACT);
    write_nested(w);
    expect_text("nested, compact", w, "{\"a\":[1,{\"b\":null,\"c\":[],\"d\":{}},true,false,[[\"x\"]]],\"e\":\"f\"}");
    w = buffer(SG_JSON_SPACED);
    write_nested(w);
    expect_text("nested, spaced", w,
                "{\"a\": [1, {\"b\": null, \"c\": [], \"d\": {}}, true, false, [[\"x\"]]], \"e\": \"f\"}");

    /* Line breaks go after a comma, before the token: one element a line. */
    w = buffer(SG_JSON_COMPACT);
    sg_json_array_begin(w);
    for (int i = 1; i <= 2; i++) {
        sg_json_newline(w);
        sg_json_int(w, i);
    }
    sg_json_newline(w);
    sg_json_array_end(w);
    sg_json_newline(w);
    expect_text("newlines", w, "[\n1,\n2\n]\n");
    w = buffer(SG_JSON_SPACED); /* no space before a line break */
    sg_json_object_begin(w);
    sg_json_key(w, "a");
    sg_json_int(w, 1);
    sg_json_newline(w);
    sg_json_key(w, "b");
    sg_json_int(w, 2);
    sg_json_object_end(w);
    expect_text("newlines, spaced", w, "{\"a\": 1,\n\"b\": 2}");

    /* SG_JSON_MAX_DEPTH levels fit; one more is refused. */
    w = buffer(SG_JSON_COMPACT);
    for (int i = 0; i < SG_JSON_MAX_DEPTH; i++) sg_json_array_begin(w);
    for (int i = 0; i < SG_JSON_MAX_DEPTH; i++) sg_json_array_end(w);
    TU_CHECK(sg_json_finish(w) == SG_OK, "%d levels: %s", SG_JSON_MAX_DEPTH, sg_json_error(w));
    sg_json_destroy(w);
    w = buffer(SG_JSON_COMPACT);
    for (int i = 0; i < SG_JSON_MAX_DEPTH; i++) sg_json_array_begin(w);
    TU_CHECK(sg_json_array_begin(w) == SG_ERR_INVALID && strstr(sg_json_error(w), "levels of nesting"),
             "level %d: %s", SG_JSON_MAX_DEPTH + 1, sg_json_error(w));
    sg_json_destroy(w);
}

static void number_is(const char *what, double v, const char *want)
{
    sg_json *w = buffer(SG_JSON_COMPACT);
    sg_json_double(w, v);
    expect_text(what, w, want);
}

static void cpu_numbers(void)
{
    sg_json *w = buffer(SG_JSON_COMPACT);
    sg_json_array_begin(w);
    sg_json_int(w, INT64_MIN);
    sg_json_int(w, INT64_MAX);
    sg_json_int(w, 0);
    sg_json_uint(w, UINT64_MAX);
    sg_json_uint(w, (uint64_t)1 << 53 | 1); /* not a double: written exactly */
    sg_json_array_end(w);
    expect_text("integers", w, "[-9223372036854775808,9223372036854775807,0,18446744073709551615,9007199254740993]");

    number_is("0.1", 0.1, "0.1");
    number_is("3", 3.0, "3");
    number_is("-2.5", -2.5, "-2.5");
    number_is("100", 100, "100");
    number_is("1234.5", 1234.5, "1234.5");
    number_is("0.00025", 0.00025, "0.00025");
    number_is("1e-5", 1e-5, "0.00001");
    number_is("1e-6", 1e-6, "1e-06");
    number_is("1e-7", 1e-7, "1e-07");
    number_is("1e16", 1e16, "10000000000000000");
    number_is("1e17", 1e17, "1e+17");
    number_is("1.5e300", 1.5e300, "1.5e+300");
    number_is("1e21", 1e21, "1e+21");
    number_is("-0", -0.0, "-0");
    number_is("NaN", NAN, "null");
    number_is("inf", INFINITY, "null");
    number_is("-inf", -INFINITY, "null");
    /* Shortest round trip: whatever is written reads back as the same double. */
    const double round[] = {1.0 / 3, 2.0 / 3, M_PI, DBL_MAX, DBL_MIN, 5e-324, 0.30000000000000004, 1e100, 123456789.125};
    for (size_t i = 0; i < sizeof round / sizeof *round; i++) {
        w = buffer(SG_JSON_COMPACT);
        sg_json_double(w, round[i]);
        TU_CHECK(sg_json_finish(w) == SG_OK && strtod(text_of(w), NULL) == round[i], "%.17g written as %s",
                 round[i], text_of(w));
        TU_CHECK(strlen(text_of(w)) <= 24, "%.17g written as %s: longer than needed", round[i], text_of(w));
        sg_json_destroy(w);
    }
    for (int i = 0; i < 2000; i++) { /* random doubles of every magnitude */
        uint64_t bits = tu_next();
        double v;
        memcpy(&v, &bits, sizeof v);
        if (!isfinite(v)) continue;
        w = buffer(SG_JSON_COMPACT);
        sg_json_double(w, v);
        bool ok = sg_json_finish(w) == SG_OK && strtod(text_of(w), NULL) == v;
        TU_CHECK(ok, "%.17g written as %s", v, text_of(w));
        sg_json_destroy(w);
        if (!ok) break;
    }

    w = buffer(SG_JSON_SPACED);
    sg_json_array_begin(w);
    sg_json_fixed(w, 2.5, 3);
    sg_json_fixed(w, 2.0 / 3, 5);
    sg_json_fixed(w, -1.25, 1);
    sg_json_fixed(w, 7, 0);
    sg_json_fixed(w, NAN, 2);
    sg_json_fixed(w, DBL_MAX, 0);
    sg_json_array_end(w);
    TU_CHECK(sg_json_finish(w) == SG_OK, "fixed: %s", sg_json_error(w));
    TU_CHECK(!strncmp(text_of(w), "[2.500, 0.66667, -1.2, 7, null, 1797693134862315708", 50), "fixed: %s",
             text_of(w));
    sg_json_destroy(w);
    w = buffer(SG_JSON_COMPACT);
    TU_CHECK(sg_json_fixed(w, 1, 18) == SG_ERR_INVALID && strstr(sg_json_error(w), "0 to 17"), "18 decimals: %s",
             sg_json_error(w));
    sg_json_destroy(w);
}

/* A writer that failed stays failed: later calls write nothing and return the first error. */
static void expect_misuse(const char *what, sg_json *w, sg_status got, const char *needle)
{
    TU_CHECK(got == SG_ERR_INVALID, "%s: %s, expected SG_ERR_INVALID", what, sg_status_name(got));
    TU_CHECK(strstr(sg_json_error(w), needle) != NULL, "%s: error '%s' lacks '%s'", what, sg_json_error(w), needle);
    size_t len = 0;
    sg_json_text(w, &len);
    TU_CHECK(sg_json_string(w, "more") == SG_ERR_INVALID && sg_json_status(w) == SG_ERR_INVALID &&
             sg_json_finish(w) == SG_ERR_INVALID, "%s: the error did not stick", what);
    size_t after = 0;
    sg_json_text(w, &after);
    TU_CHECK(after == len, "%s: %zu bytes written after the error", what, after - len);
    sg_json_destroy(w);
}

static void cpu_misuse(void)
{
    sg_json *w = buffer(SG_JSON_COMPACT);
    sg_json_object_begin(w);
    expect_misuse("a value without a key", w, sg_json_int(w, 1), "needs its key first");
    w = buffer(SG_JSON_COMPACT);
    sg_json_array_begin(w);
    expect_misuse("a key in an array", w, sg_json_key(w, "k"), "outside an object");
    w = buffer(SG_JSON_COMPACT);
    expect_misuse("a key at the top", w, sg_json_key(w, "k"), "outside an object");
    w = buffer(SG_JSON_COMPACT);
    sg_json_object_begin(w);
    sg_json_key(w, "k");
    expect_misuse("two keys in a row", w, sg_json_key(w, "l"), "has no value");
    w = buffer(SG_JSON_COMPACT);
    sg_json_object_begin(w);
    sg_json_key(w, "k");
    expect_misuse("an object closed after a key", w, sg_json_object_end(w), "has no value");
    w = buffer(SG_JSON_COMPACT);
    sg_json_array_begin(w);
    expect_misuse("an array closed as an object", w, sg_json_object_end(w), "no object is open");
    w = buffer(SG_JSON_COMPACT);
    expect_misuse("an end with nothing open", w, sg_json_array_end(w), "no array is open");
    w = buffer(SG_JSON_COMPACT);
    sg_json_int(w, 1);
    expect_misuse("a second top-level value", w, sg_json_int(w, 2), "one writer writes one value");
    w = buffer(SG_JSON_COMPACT);
    sg_json_array_begin(w);
    expect_misuse("finish with an array open", w, sg_json_finish(w), "still open");
    w = buffer(SG_JSON_COMPACT);
    expect_misuse("finish with nothing written", w, sg_json_finish(w), "nothing was written");

    /* NULLs. */
    TU_CHECK(sg_json_create_buffer(SG_JSON_COMPACT, NULL) == SG_ERR_NULL, "create NULL out");
    w = (sg_json *)&w;
    TU_CHECK(sg_json_create_file(NULL, SG_JSON_COMPACT, &w) == SG_ERR_NULL && w == NULL, "create NULL file");
    TU_CHECK(sg_json_create_buffer((sg_json_style)7, &w) == SG_ERR_INVALID && w == NULL, "create style 7");
    TU_CHECK(sg_json_int(NULL, 1) == SG_ERR_NULL && sg_json_status(NULL) == SG_ERR_NULL && !sg_json_text(NULL, NULL),
             "NULL writer");
    sg_json_destroy(NULL);
    w = buffer(SG_JSON_COMPACT);
    sg_json_object_begin(w);
    TU_CHECK(sg_json_key(w, NULL) == SG_ERR_NULL, "NULL key");
    sg_json_destroy(w);
}

/* Reads a whole FILE from its start. */
static char *slurp(FILE *f)
{
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = '\0';
    return s;
}

static void cpu_files(void)
{
    FILE *f = tmpfile();
    TU_CHECK(f != NULL, "tmpfile: %s", strerror(errno));
    if (!f) return;
    sg_json *w = NULL;
    TU_CHECK(sg_json_create_file(f, SG_JSON_SPACED, &w) == SG_OK, "create file writer");
    TU_CHECK(sg_json_text(w, NULL) == NULL, "a file writer has no text");
    sg_json_object_begin(w);
    sg_json_key(w, "s");
    sg_json_string(w, "a\tb");
    sg_json_key(w, "n");
    sg_json_double(w, 0.25);
    sg_json_object_end(w);
    TU_CHECK(sg_json_finish(w) == SG_OK, "file writer: %s", sg_json_error(w));
    sg_json_destroy(w);
    fputc('\n', f);
    TU_CHECK(sg_json_write_string(f, "q\"\x02") == SG_OK && sg_json_write_string(f, NULL) == SG_OK, "write_string");
    char *s = slurp(f);
    TU_CHECK(s && !strcmp(s, "{\"s\": \"a\\tb\", \"n\": 0.25}\n\"q\\\"\\u0002\"null"), "file: '%s'", s ? s : "");
    free(s);
    fclose(f);
    TU_CHECK(sg_json_write_string(NULL, "x") == SG_ERR_NULL, "write_string to NULL");

    /* A write that fails: /dev/full, unbuffered, so the first write fails (ENOSPC). */
    f = fopen("/dev/full", "w");
    if (!f) {
        printf("SKIP: no /dev/full: the failed-write check\n");
        return;
    }
    setvbuf(f, NULL, _IONBF, 0);
    TU_CHECK(sg_json_create_file(f, SG_JSON_COMPACT, &w) == SG_OK, "create on /dev/full");
    TU_CHECK(sg_json_string(w, "lost") == SG_ERR_IO && strstr(sg_json_error(w), "write failed"),
             "a failed write: %s, '%s'", sg_status_name(sg_json_status(w)), sg_json_error(w));
    TU_CHECK(sg_json_finish(w) == SG_ERR_IO, "the write error sticks");
    sg_json_destroy(w);
    TU_CHECK(sg_json_write_string(f, "lost") == SG_ERR_IO, "write_string to /dev/full");
    fclose(f);
}

/* ---- random strings, read back ---- */

/* Appends code point cp as UTF-8. */
static size_t put_utf8(char *s, uint32_t cp)
{
    if (cp < 0x80) return s[0] = (char)cp, 1;
    if (cp < 0x800) return s[0] = (char)(0xc0 | cp >> 6), s[1] = (char)(0x80 | (cp & 0x3f)), 2;
    if (cp < 0x10000) {
        s[0] = (char)(0xe0 | cp >> 12), s[1] = (char)(0x80 | (cp >> 6 & 0x3f)), s[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    s[0] = (char)(0xf0 | cp >> 18), s[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    s[2] = (char)(0x80 | (cp >> 6 & 0x3f)), s[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* A random valid UTF-8 string: control characters, quotes and backslashes often, every plane. */
static void random_utf8(char *s, size_t cap)
{
    size_t n = 0, len = tu_next() % 40;
    for (size_t i = 0; i < len && n + 5 < cap; i++) {
        uint32_t cp;
        switch (tu_next() % 6) {
        case 0: cp = 1 + (uint32_t)(tu_next() % 31); break;
        case 1: cp = "\"\\/\x7f"[tu_next() % 4]; break;
        case 2: cp = 0x20 + (uint32_t)(tu_next() % 0x5f); break;
        case 3: cp = 0x80 + (uint32_t)(tu_next() % (0x800 - 0x80)); break;
        case 4: cp = 0x800 + (uint32_t)(tu_next() % (0x10000 - 0x800)); break;
        default: cp = 0x10000 + (uint32_t)(tu_next() % (0x110000 - 0x10000)); break;
        }
        if (cp >= 0xd800 && cp <= 0xdfff) cp = 0xfffd; /* surrogates are not characters */
        n += put_utf8(s + n, cp);
    }
    s[n] = '\0';
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Decodes the JSON string at j (what the writer emits: no surrogate pairs) into out; false when
 * it is not one. */
static bool decode_string(const char *j, char *out, size_t cap)
{
    size_t n = 0;
    if (*j++ != '"') return false;
    while (*j != '"') {
        if (!*j || (unsigned char)*j < 0x20 || n + 5 > cap) return false;
        if (*j != '\\') {
            out[n++] = *j++;
            continue;
        }
        j++;
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *k = *j ? strchr(from, *j) : NULL;
        if (k) {
            out[n++] = to[k - from], j++;
            continue;
        }
        if (*j++ != 'u') return false;
        uint32_t cp = 0;
        for (int i = 0; i < 4; i++) {
            int h = hexval(*j++);
            if (h < 0) return false;
            cp = cp << 4 | (uint32_t)h;
        }
        n += put_utf8(out + n, cp);
    }
    out[n] = '\0';
    return j[1] == '\0';
}

#define RANDOM_STRINGS 300

static void cpu_random_strings(void)
{
    /* Valid UTF-8 comes back exactly; random bytes always make a valid document. */
    char path[512];
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path, sizeof path, "%s/sg_test_json_%ld.json", dir, (long)getpid());
    FILE *f = fopen(path, "w");
    TU_CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    sg_json *doc = NULL;
    TU_CHECK(sg_json_create_file(f, SG_JSON_COMPACT, &doc) == SG_OK, "file writer");
    sg_json_array_begin(doc);
    for (int i = 0; i < RANDOM_STRINGS; i++) {
        char s[256], back[256];
        random_utf8(s, sizeof s);
        sg_json *w = buffer(SG_JSON_COMPACT);
        sg_json_string(w, s);
        TU_CHECK(sg_json_finish(w) == SG_OK, "random string: %s", sg_json_error(w));
        TU_CHECK(decode_string(text_of(w), back, sizeof back) && !strcmp(back, s), "'%s' read back as '%s'",
                 text_of(w), back);
        sg_json_destroy(w);
        /* For Python: the string, and its bytes as hex to compare with. */
        char hex[512];
        for (size_t k = 0; s[k]; k++) snprintf(hex + 2 * k, 3, "%02x", (unsigned char)s[k]);
        hex[2 * strlen(s)] = '\0';
        sg_json_newline(doc);
        sg_json_array_begin(doc);
        sg_json_string(doc, s);
        sg_json_string(doc, hex);
        sg_json_array_end(doc);
    }
    for (int i = 0; i < RANDOM_STRINGS; i++) { /* random bytes: not UTF-8, mostly */
        char s[64];
        size_t len = tu_next() % 63;
        for (size_t k = 0; k < len; k++) s[k] = (char)(1 + tu_next() % 255);
        s[len] = '\0';
        sg_json_newline(doc);
        sg_json_array_begin(doc);
        sg_json_string(doc, s);
        sg_json_null(doc);
        sg_json_array_end(doc);
    }
    sg_json_newline(doc);
    sg_json_array_end(doc);
    TU_CHECK(sg_json_finish(doc) == SG_OK, "document: %s", sg_json_error(doc));
    sg_json_destroy(doc);
    fclose(f);

    fflush(stdout); /* before the child's output */
    if (system("python3 -c 'import json' >/dev/null 2>&1") != 0) {
        printf("SKIP: no python3: the random strings were read back by this test's decoder only\n");
        remove(path);
        return;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "python3 -c '\n"
             "import json, sys\n"
             "rows = json.load(open(sys.argv[1], encoding=\"utf-8\"))\n"
             "assert len(rows) == %d, len(rows)\n"
             "for s, h in rows:\n"
             "    if h is not None:\n"
             "        assert s.encode(\"utf-8\") == bytes.fromhex(h), (s, h)\n"
             "    else:\n"
             "        s.encode(\"utf-8\")  # no lone surrogates: every escape was a character\n"
             "print(\"python3 json: %d strings read back\")\n"
             "' %s",
             2 * RANDOM_STRINGS, 2 * RANDOM_STRINGS, path);
    int rc = system(cmd);
    TU_CHECK(rc == 0, "python3's json module rejected %s (kept for a look)", path);
    if (rc == 0) remove(path);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    if (strcmp(mode, "gpu") == 0) {
        printf("test_json: the writer has no device part\n");
        return TU_SKIP;
    }
    if (strcmp(mode, "cpu") != 0) {
        fprintf(stderr, "usage: test_json cpu|gpu\n");
        return 2;
    }
    tu_seed("test_json");
    cpu_escapes();
    cpu_nesting();
    cpu_numbers();
    cpu_misuse();
    cpu_files();
    cpu_random_strings();
    return tu_finish("test_json");
}
