/* digits.c: a real small image set for the image kinds (resnet, efficientnet): scikit-learn's
 * 8 x 8 handwritten digits (digits.csv, scripts/fetch-digits.sh), read strictly, scaled up to
 * R x R (bilinear), normalised with the training split's mean and std, three equal channels
 * (NHWC, as sg_image_data's), the last fifth of the file held out as the validation split and
 * the rest shuffled once by the seed. Public API only; docs/data.md describes the format. */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64

#include "models/model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIGITS_SIDE 8                              /* the images are 8 x 8 */
#define DIGITS_PIXELS (DIGITS_SIDE * DIGITS_SIDE)
#define DIGITS_FIELDS (DIGITS_PIXELS + 1)          /* the gray levels, then the label */
#define DIGITS_LEVEL_MAX 16                        /* gray levels 0..16 */
#define DIGITS_FORMAT "65 comma-separated whole numbers a line: 64 gray levels 0..16, then the label"

/* A file's images as read: n of them, gray levels (n, 64) and labels (n). */
typedef struct digits_raw {
    int64_t n;
    uint8_t *px;
    int32_t *y;
} digits_raw;

/* The whole regular file at path into a new NUL-terminated buffer (opened without blocking, so
 * a FIFO is refused rather than waited on). */
static sg_status read_file(sg_ctx *ctx, const char *path, char **buf, size_t *len)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return sg_ctx_fail(ctx, SG_ERR_IO, "sg_model_create: digits file '%s': %s", path, strerror(errno));
    struct stat sb;
    sg_status st = SG_OK;
    if (fstat(fd, &sb) != 0)
        st = sg_ctx_fail(ctx, SG_ERR_IO, "sg_model_create: digits file '%s': %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: digits file '%s' is not a regular file", path);
    *len = st == SG_OK ? (size_t)sb.st_size : 0;
    *buf = st == SG_OK ? malloc(*len + 1) : NULL;
    if (st == SG_OK && !*buf) st = sg_ctx_fail(ctx, SG_ERR_OOM, "sg_model_create: out of host memory for '%s'", path);
    size_t got = 0;
    while (st == SG_OK && got < *len) {
        ssize_t r = read(fd, *buf + got, *len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            st = sg_ctx_fail(ctx, SG_ERR_IO, "sg_model_create: digits file '%s': read %zu of %zu bytes: %s", path,
                             got, *len, r < 0 ? strerror(errno) : "it shrank while read");
        else got += (size_t)r;
    }
    close(fd);
    if (st != SG_OK) {
        free(*buf);
        *buf = NULL;
        return st;
    }
    (*buf)[*len] = '\0';
    return SG_OK;
}

/* The field s[0..n) for a message: at most 12 characters, unprintable ones as '?'. */
static const char *shown(const char *s, size_t n, char out[16])
{
    size_t k = 0;
    for (; k < n && k < 12; k++) out[k] = s[k] >= 0x20 && s[k] < 0x7f ? s[k] : '?';
    if (n > 12) out[k++] = '.', out[k++] = '.', out[k++] = '.';
    out[k] = '\0';
    return out;
}

/* Line `line` (text[0..n), no newline) into px (64) and *label: every field a whole number in
 * range, 65 of them; else the error names the file, the line and the column (1-based bytes). */
static sg_status parse_line(sg_ctx *ctx, const char *path, long long line, const char *text, size_t n,
                            int64_t classes, uint8_t *px, int32_t *label)
{
    if (n == 0)
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: digits file '%s': line %lld, column 1: an empty "
                           "line: expected " DIGITS_FORMAT, path, line);
    size_t at = 0;
    for (int f = 0; f < DIGITS_FIELDS; f++) {
        size_t end = at;
        while (end < n && text[end] != ',') end++;
        bool is_label = f == DIGITS_PIXELS;
        int64_t max = is_label ? classes - 1 : DIGITS_LEVEL_MAX, v = 0;
        bool digits = end > at;
        for (size_t i = at; i < end && digits; i++) {
            digits = text[i] >= '0' && text[i] <= '9';
            if (v <= max) v = v * 10 + (text[i] - '0'); /* stops growing once out of range */
        }
        char s[16];
        if (!digits)
            return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: digits file '%s': line %lld, column %zu (field "
                               "%d): '%s' is not a whole number: expected %s 0..%lld", path, line, at + 1, f + 1,
                               shown(text + at, end - at, s), is_label ? "a label" : "a gray level", (long long)max);
        if (v > max)
            return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: digits file '%s': line %lld, column %zu (field "
                               "%d): %s %s is out of range: expected 0..%lld%s", path, line, at + 1, f + 1,
                               is_label ? "label" : "gray level", shown(text + at, end - at, s), (long long)max,
                               is_label ? " (the model's classes)" : "");
        if (is_label) *label = (int32_t)v;
        else px[f] = (uint8_t)v;
        if (end == n && f < DIGITS_FIELDS - 1)
            return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: digits file '%s': line %lld, column %zu: the "
                               "line ends after %d fields: expected " DIGITS_FORMAT, path, line, n + 1, f + 1);
        at = end + 1;
    }
    if (at <= n)
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: digits file '%s': line %lld, column %zu (field %d): "
                           "more than %d fields: expected " DIGITS_FORMAT, path, line, at + 1, DIGITS_FIELDS + 1,
                           DIGITS_FIELDS);
    return SG_OK;
}

/* Lines of buf[0..len): newline-terminated ones, and a last one without its newline. */
static int64_t count_lines(const char *buf, size_t len)
{
    int64_t n = 0;
    for (size_t i = 0; i < len; i++) n += buf[i] == '\n';
    return n + (len > 0 && buf[len - 1] != '\n');
}

/* Every line of the file (LF or CRLF endings, the last newline optional). */
static sg_status parse(sg_ctx *ctx, const char *path, const char *buf, size_t len, int64_t classes, digits_raw *out)
{
    memset(out, 0, sizeof *out);
    if (len == 0)
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: digits file '%s': line 1, column 1: the file is "
                           "empty: expected " DIGITS_FORMAT, path);
    if (len >= 2 && (unsigned char)buf[0] == 0x1f && (unsigned char)buf[1] == 0x8b)
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: digits file '%s' is gzip-compressed: gunzip it "
                           "(scripts/fetch-digits.sh writes digits.csv)", path);
    int64_t n = count_lines(buf, len);
    out->px = malloc((size_t)n * DIGITS_PIXELS);
    out->y = malloc((size_t)n * sizeof *out->y);
    sg_status st = out->px && out->y ? SG_OK : sg_ctx_fail(ctx, SG_ERR_OOM, "sg_model_create: out of host memory "
                                                           "for '%s'", path);
    const char *p = buf, *end = buf + len;
    for (int64_t i = 0; st == SG_OK && i < n; i++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        size_t w = (size_t)(e - p) - (e > p && e[-1] == '\r');
        st = parse_line(ctx, path, (long long)i + 1, p, w, classes, out->px + i * DIGITS_PIXELS, &out->y[i]);
        p = e + 1;
    }
    out->n = n;
    if (st != SG_OK) free(out->px), free(out->y), memset(out, 0, sizeof *out);
    return st;
}

int64_t sg_digits_count(const char *path)
{
    int fd = path ? open(path, O_RDONLY | O_NONBLOCK) : -1;
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (fd >= 0) close(fd);
        return 0;
    }
    char chunk[1 << 16];
    int64_t n = 0;
    ssize_t r;
    char last = '\n';
    while ((r = read(fd, chunk, sizeof chunk)) > 0 || (r < 0 && errno == EINTR))
        for (ssize_t i = 0; i < r; i++) n += chunk[i] == '\n', last = chunk[i];
    close(fd);
    return n + (last != '\n');
}

/* How the 8 x 8 gray levels become R x R inputs: bilinear taps of each output row and column
 * (half-pixel centres, edges clamped: PyTorch's interpolate(mode="bilinear",
 * align_corners=False)), output o reading i0[o] and i1[o] (i0[o] + 1, or i0[o] again at the
 * edge) with weight w[o] on i1; then (level / 16 - mean) / std. */
typedef struct digits_scale {
    int64_t R;
    int *i0, *i1;
    double *w;
    double mean, std;
} digits_scale;

static bool scale_init(digits_scale *sc, int64_t R)
{
    sc->R = R, sc->mean = 0, sc->std = 1;
    sc->i0 = malloc((size_t)R * sizeof *sc->i0), sc->i1 = malloc((size_t)R * sizeof *sc->i1);
    sc->w = malloc((size_t)R * sizeof *sc->w);
    if (!sc->i0 || !sc->i1 || !sc->w) return false;
    for (int64_t o = 0; o < R; o++) {
        double s = ((double)o + 0.5) * DIGITS_SIDE / (double)R - 0.5;
        if (s < 0) s = 0;
        if (s > DIGITS_SIDE - 1) s = DIGITS_SIDE - 1;
        sc->i0[o] = (int)s;
        sc->i1[o] = sc->i0[o] + 1 < DIGITS_SIDE ? sc->i0[o] + 1 : sc->i0[o];
        sc->w[o] = s - sc->i0[o];
    }
    return true;
}

static void scale_free(digits_scale *sc) { free(sc->i0), free(sc->i1), free(sc->w); }

/* The mean and (population) std of the first n images' gray levels / 16; a std of 0 (every
 * level equal) is taken as 1. */
static void moments(const digits_raw *raw, int64_t n, digits_scale *sc)
{
    double s = 0, q = 0, k = (double)n * DIGITS_PIXELS;
    for (int64_t i = 0; i < n * DIGITS_PIXELS; i++) s += raw->px[i] / (double)DIGITS_LEVEL_MAX;
    sc->mean = s / k;
    for (int64_t i = 0; i < n * DIGITS_PIXELS; i++) {
        double d = raw->px[i] / (double)DIGITS_LEVEL_MAX - sc->mean;
        q += d * d;
    }
    sc->std = q > 0 ? sqrt(q / k) : 1.0;
}

/* Gray levels g (8, 8) as an input (R, R, 3), the channels equal. */
static void image(const uint8_t *g, const digits_scale *sc, float *out)
{
    const int *i0 = sc->i0, *i1 = sc->i1;
    const double *w = sc->w;
    for (int64_t h = 0; h < sc->R; h++)
        for (int64_t x = 0; x < sc->R; x++) {
            const uint8_t *r0 = g + i0[h] * DIGITS_SIDE, *r1 = g + i1[h] * DIGITS_SIDE;
            double top = (1 - w[x]) * r0[i0[x]] + w[x] * r0[i1[x]];
            double bot = (1 - w[x]) * r1[i0[x]] + w[x] * r1[i1[x]];
            double v = ((1 - w[h]) * top + w[h] * bot) / DIGITS_LEVEL_MAX;
            float f = (float)((v - sc->mean) / sc->std);
            for (int c = 0; c < 3; c++) out[(h * sc->R + x) * 3 + c] = f;
        }
}

/* Images order[0..n) of raw onto the device: the training set (a new data set, *d NULL) or the
 * validation split (given to *d). */
static sg_status upload(sg_ctx *ctx, const digits_raw *raw, const int64_t *order, int64_t n, const digits_scale *sc,
                        sg_dataset **d)
{
    int64_t R = sc->R;
    float *x = malloc((size_t)(n * R * R * 3) * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    sg_status st = x && y ? SG_OK : sg_ctx_fail(ctx, SG_ERR_OOM, "sg_model_create: out of host memory for %lld "
                                                "digits of %lld x %lld", (long long)n, (long long)R, (long long)R);
    for (int64_t k = 0; st == SG_OK && k < n; k++) {
        image(raw->px + order[k] * DIGITS_PIXELS, sc, x + k * R * R * 3);
        y[k] = raw->y[order[k]];
    }
    const int64_t shape[4] = {n, R, R, 3};
    if (st == SG_OK && !*d) {
        st = sg_host_dataset(ctx, x, 4, shape, y, d);
    } else if (st == SG_OK) {
        sg_tensor *tx = NULL, *ty = NULL;
        st = sg_host_tensors(ctx, x, 4, shape, y, &tx, &ty);
        if (st == SG_OK) st = sg_dataset_set_validation(*d, tx, ty);
    }
    free(x), free(y);
    return st;
}

sg_status sg_digits_data(sg_ctx *ctx, const char *path, int64_t R, int64_t classes, uint64_t seed, sg_dataset **out)
{
    *out = NULL;
    if (classes < SG_DIGITS_CLASSES)
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: digits file '%s': the digits have %d classes, the "
                           "model %lld: expected classes >= %d (0: %d)", path, SG_DIGITS_CLASSES, (long long)classes,
                           SG_DIGITS_CLASSES, SG_DIGITS_CLASSES);
    if (R < DIGITS_SIDE)
        return sg_ctx_fail(ctx, SG_ERR_SHAPE, "sg_model_create: digits file '%s': images of %lld x %lld: expected R "
                           ">= %d (the 8 x 8 digits are scaled up, never down)", path, (long long)R, (long long)R,
                           DIGITS_SIDE);
    char *buf = NULL;
    size_t len = 0;
    SG_KIND_TRY(read_file(ctx, path, &buf, &len));
    digits_raw raw;
    sg_status st = parse(ctx, path, buf, len, classes, &raw);
    free(buf);
    SG_KIND_TRY(st);
    /* The last fifth held out, in file order; the rest in an order drawn from the seed. */
    int64_t n_val = raw.n / 5, n_train = raw.n - n_val;
    if (n_val < 1)
        st = sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_model_create: digits file '%s' holds %lld images: expected at least "
                         "5 (the last fifth is held out for validation)", path, (long long)raw.n);
    int64_t *order = st == SG_OK ? malloc((size_t)raw.n * sizeof *order) : NULL;
    digits_scale sc;
    bool scaled = scale_init(&sc, R);
    if (st == SG_OK && !(order && scaled))
        st = sg_ctx_fail(ctx, SG_ERR_OOM, "sg_model_create: out of host memory for '%s'", path);
    if (st == SG_OK) {
        sg_rng r = {seed};
        for (int64_t i = 0; i < raw.n; i++) order[i] = i;
        for (int64_t i = n_train - 1; i > 0; i--) { /* Fisher-Yates over the training images */
            int64_t j = (int64_t)(sg_rng_next(&r) % (uint64_t)(i + 1)), t = order[i];
            order[i] = order[j], order[j] = t;
        }
        moments(&raw, n_train, &sc); /* the training images: the file's first n_train */
        st = upload(ctx, &raw, order, n_train, &sc, out);
    }
    if (st == SG_OK) st = upload(ctx, &raw, order + n_train, n_val, &sc, out);
    if (st != SG_OK) sg_dataset_destroy(*out), *out = NULL;
    scale_free(&sc);
    free(order), free(raw.px), free(raw.y);
    return st;
}
