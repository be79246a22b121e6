/* test_digits.c: scikit-learn's 8 x 8 digits as the image kinds' data (src/models/digits.c).
 * The reader on files of fresh random gray levels and labels written here: every image read
 * back equals its scaled, normalised value computed here another way (a tent kernel), the
 * validation split is the file's last fifth in order and the training set the rest in a
 * seeded order; corrupt files are refused naming the file, the line and the column, the
 * context usable after; the image kinds take the file (10 classes by default, fewer refused,
 * the estimate's data, the validation split through sg_trainer_eval, which leaves a step
 * graph's batches as they were; sg_dataset_set_validation's refusals); and a small ResNet on the real digits (argv[2], fetched by the
 * digits_data fixture) brings the held-out loss from chance to under half of it. Modes: cpu,
 * gpu (skipped without a GPU). */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include "models/model.h"
#include "train/model.h"

#include <unistd.h>

#define SIDE 8
#define FIELDS 65

static char dir[64];
static int n_files;

/* A new file of the temporary directory holding text[0..len). */
static const char *write_file(const char *text, size_t len)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/digits%d.csv", dir, n_files++);
    tu_file_write(path, (const unsigned char *)text, len);
    return path;
}

/* n lines of fresh random gray levels 0..16 and labels 0..classes-1 (px (n, 64), y (n)), as a
 * digits file's text: LF or CRLF endings, the last newline there or not (caller frees). */
static char *random_csv(int64_t n, int64_t classes, uint8_t *px, int32_t *y, size_t *len)
{
    char *t = malloc((size_t)n * FIELDS * 4 + 4), *p = t;
    const char *eol = tu_randint(0, 1) ? "\r\n" : "\n";
    for (int64_t i = 0; i < n; i++) {
        for (int k = 0; k < SIDE * SIDE; k++) {
            px[i * SIDE * SIDE + k] = (uint8_t)tu_randint(0, 16);
            p += sprintf(p, "%d,", px[i * SIDE * SIDE + k]);
        }
        y[i] = (int32_t)tu_randint(0, (int)classes - 1);
        p += sprintf(p, "%d%s", y[i], i < n - 1 || tu_randint(0, 1) ? eol : "");
    }
    *len = (size_t)(p - t);
    return t;
}

/* The weight of source pixel i in output pixel o of R: a tent of width 1 around the source
 * position of o's centre, clamped to the image (bilinear with half-pixel centres). */
static double tent(int64_t o, int i, int64_t R)
{
    double s = fmin(fmax((o + 0.5) * SIDE / R - 0.5, 0.0), SIDE - 1.0);
    return fmax(0.0, 1.0 - fabs(s - i));
}

/* The expected image (R, R, 3) of gray levels g: sum_ij tent(h,i) tent(w,j) g[i][j] / 16,
 * normalised by mean and std. */
static void expected_image(const uint8_t *g, int64_t R, double mean, double std, double *out)
{
    for (int64_t h = 0; h < R; h++)
        for (int64_t w = 0; w < R; w++) {
            double v = 0;
            for (int i = 0; i < SIDE; i++)
                for (int j = 0; j < SIDE; j++) v += tent(h, i, R) * tent(w, j, R) * g[i * SIDE + j];
            for (int c = 0; c < 3; c++) out[(h * R + w) * 3 + c] = (v / 16 - mean) / std;
        }
}

/* The reader on random files: shapes, the validation split, the training set's order, values. */
static void check_reader(sg_ctx *ctx)
{
    for (int rep = 0; rep < 3; rep++) {
        int64_t n = rep == 0 ? 40 : tu_randint(5, 40), classes = tu_randint(10, 13);
        int64_t R = rep == 1 ? SIDE : tu_randint(SIDE, 20), n_val = n / 5, n_train = n - n_val;
        uint8_t *px = malloc((size_t)n * SIDE * SIDE);
        int32_t *y = malloc((size_t)n * sizeof *y);
        size_t len;
        char *text = random_csv(n, classes, px, y, &len);
        const char *path = write_file(text, len);
        uint64_t seed = tu_next();
        sg_dataset *d = NULL;
        TU_OK(ctx, sg_digits_data(ctx, path, R, classes, seed, &d));
        TU_CHECK(d->n == n_train && d->val && d->val->n == n_val, "%lld lines: %lld training and %lld validation "
                 "images, expected %lld and %lld", (long long)n, (long long)d->n, (long long)(d->val ? d->val->n : -1),
                 (long long)n_train, (long long)n_val);
        if (d->n != n_train || !d->val || d->val->n != n_val) return;
        TU_CHECK(d->x->ndim == 4 && d->x->shape[1] == R && d->x->shape[2] == R && d->x->shape[3] == 3,
                 "images are not (n, %lld, %lld, 3)", (long long)R, (long long)R);
        /* The training images' gray levels / 16: their mean and population std. */
        double mean = 0, var = 0, m = (double)n_train * SIDE * SIDE;
        for (int64_t i = 0; i < n_train * SIDE * SIDE; i++) mean += px[i] / 16.0 / m;
        for (int64_t i = 0; i < n_train * SIDE * SIDE; i++) var += (px[i] / 16.0 - mean) * (px[i] / 16.0 - mean) / m;
        int64_t img = R * R * 3;
        double *ref = malloc((size_t)(n * img) * sizeof *ref);
        for (int64_t i = 0; i < n; i++) expected_image(px + i * SIDE * SIDE, R, mean, sqrt(var), ref + i * img);
        double *xt = tu_get(d->x), *yt = tu_get(d->y), *xv = tu_get(d->val->x), *yv = tu_get(d->val->y);
        /* The library rounds a double to f32 once: half an ulp, 2^-24 |ref|; the two double
         * computations (sums in other orders) differ by ~1e-16 of values below 10: atol 1e-12. */
        tu_tol tol = {1e-12, 0x1p-24};
        char what[96];
        for (int64_t k = 0; k < n_val; k++) { /* validation: the last fifth, in file order */
            snprintf(what, sizeof what, "validation image %lld (R %lld)", (long long)k, (long long)R);
            tu_close(what, xv + k * img, ref + (n_train + k) * img, img, tol);
            TU_CHECK(yv[k] == y[n_train + k], "validation label %lld: %g, the file's %d", (long long)k, yv[k],
                     y[n_train + k]);
        }
        /* Training: each image is one of the first n_train lines (found by its pixels), each
         * line once; the order is the seed's. */
        int *used = calloc((size_t)n_train, sizeof *used), moved = 0;
        for (int64_t k = 0; k < n_train; k++) {
            int64_t src = -1;
            for (int64_t i = 0; i < n_train && src < 0; i++) {
                const double *got = xt + k * img, *want = ref + i * img;
                int64_t e = 0;
                while (e < img && fabs(got[e] - want[e]) <= tol.atol + tol.rtol * fabs(want[e])) e++;
                if (e == img && !used[i] && yt[k] == y[i]) src = i;
            }
            TU_CHECK(src >= 0, "training image %lld (R %lld) is no unused line of the file's first %lld", (long long)k,
                     (long long)R, (long long)n_train);
            if (src >= 0) used[src] = 1, moved += src != k;
        }
        /* 32 training images left in file order by a shuffle: 1 in 32!, never. */
        if (n == 40) TU_CHECK(moved > 0, "the training images are in file order: not shuffled by the seed");
        sg_dataset *d2 = NULL;
        TU_OK(ctx, sg_digits_data(ctx, path, R, classes, seed, &d2));
        double *x2 = tu_get(d2->x);
        TU_CHECK(!memcmp(x2, xt, (size_t)(n_train * img) * sizeof *x2), "the same seed gave another training set");
        free(x2), free(used), free(xt), free(yt), free(xv), free(yv), free(ref), free(text), free(px), free(y);
        sg_dataset_destroy(d2), sg_dataset_destroy(d);
    }
}

/* A file whose line `line` (1-based) of n random ones is replaced by bad[0..): refused
 * (SG_ERR_INVALID, nothing left allocated) with a message holding "'<path>': line <line>,
 * column <column>" and `needle`. */
static void refused(sg_ctx *ctx, int64_t n, int64_t line, const char *bad, int64_t column, int64_t classes,
                    const char *needle)
{
    uint8_t *px = malloc((size_t)n * SIDE * SIDE);
    int32_t *y = malloc((size_t)n * sizeof *y);
    size_t len;
    char *text = random_csv(n, 10, px, y, &len), *out = malloc(len + strlen(bad) + 8), *o = out;
    const char *p = text;
    for (int64_t i = 1; i <= n; i++) {
        const char *e = strchr(p, '\n');
        size_t w = e ? (size_t)(e - p + 1) : strlen(p);
        if (i == line) o += sprintf(o, "%s%s", bad, e ? "\n" : "");
        else memcpy(o, p, w), o += w;
        p += w;
    }
    const char *path = write_file(out, (size_t)(o - out));
    sg_alloc_stats a0, a1;
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a0));
    sg_dataset *d = NULL;
    char want[200];
    snprintf(want, sizeof want, "'%s': line %lld, column %lld", path, (long long)line, (long long)column);
    TU_FAILS(ctx, sg_digits_data(ctx, path, 16, classes, tu_next(), &d), SG_ERR_INVALID, want);
    TU_CHECK(strstr(sg_ctx_last_error(ctx), needle) != NULL, "the message lacks '%s': %s", needle,
             sg_ctx_last_error(ctx));
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a1));
    TU_CHECK(!d && a1.bytes_in_use == a0.bytes_in_use, "a refused file left a data set or %lld bytes",
             (long long)(a1.bytes_in_use - a0.bytes_in_use));
    free(text), free(out), free(px), free(y);
}

/* A valid line of random fields with field f (1-based) replaced by s: its text into buf, and
 * the column (1-based) where field f begins. */
static int64_t line_with(char *buf, int f, const char *s)
{
    char *p = buf;
    int64_t col = 0;
    for (int k = 1; k <= FIELDS; k++) {
        if (k == f) col = p - buf + 1;
        p += k == f ? sprintf(p, "%s", s) : sprintf(p, "%d", tu_randint(0, k == FIELDS ? 9 : 16));
        if (k < FIELDS) *p++ = ',';
    }
    *p = '\0';
    return col;
}

static void check_refusals(sg_ctx *ctx)
{
    char buf[400], needle[64];
    int64_t n = tu_randint(6, 30), line = tu_randint(1, (int)n);
    /* too few fields: the line cut after k fields; the column is its end */
    int k = tu_randint(1, FIELDS - 1);
    line_with(buf, 0, "");
    char *cut = buf;
    for (int c = 0; c < k; c++) cut = strchr(cut, ',') + 1;
    cut[-1] = '\0';
    snprintf(needle, sizeof needle, "the line ends after %d fields", k);
    refused(ctx, n, line, buf, (int64_t)strlen(buf) + 1, 10, needle);
    /* too many fields */
    line_with(buf, 0, "");
    size_t at = strlen(buf);
    strcat(buf, ",3");
    refused(ctx, n, line, buf, (int64_t)at + 2, 10, "more than 65 fields");
    /* not whole numbers, anywhere */
    const char *junk[] = {"1.5", "x", "-3", " 4", "", "0x1", "7 "};
    for (size_t j = 0; j < sizeof junk / sizeof *junk; j++) {
        int f = tu_randint(1, FIELDS);
        int64_t col = line_with(buf, f, junk[j]);
        refused(ctx, n, tu_randint(1, (int)n), buf, col, 10, "is not a whole number");
    }
    /* a gray level of 17, a label of 10 with 10 classes (and of 12 with 12) */
    int f = tu_randint(1, FIELDS - 1);
    refused(ctx, n, line, buf, line_with(buf, f, "17"), 10, "gray level 17 is out of range: expected 0..16");
    refused(ctx, n, line, buf, line_with(buf, FIELDS, "10"), 10, "label 10 is out of range: expected 0..9");
    refused(ctx, n, line, buf, line_with(buf, FIELDS, "12"), 12, "label 12 is out of range: expected 0..11");
    refused(ctx, n, line, buf, line_with(buf, f, "99999999999999999999"), 10, "is out of range");
    /* an empty line (not the last: an empty last line is the file's final newline) */
    refused(ctx, n, tu_randint(1, (int)n - 1), "", 1, 10, "an empty line");
    /* whole files: empty, too few images, gzip, missing; classes below 10, R below 8 */
    sg_dataset *d = NULL;
    const char *path = write_file("", 0);
    char want[160];
    snprintf(want, sizeof want, "'%s': line 1, column 1: the file is empty", path);
    TU_FAILS(ctx, sg_digits_data(ctx, path, 8, 10, 1, &d), SG_ERR_INVALID, want);
    uint8_t px[10 * 64];
    int32_t y[10];
    size_t len;
    char *text = random_csv(4, 10, px, y, &len);
    path = write_file(text, len);
    TU_FAILS(ctx, sg_digits_data(ctx, path, 8, 10, 1, &d), SG_ERR_INVALID, "holds 4 images: expected at least 5");
    free(text);
    path = write_file("\x1f\x8b\x08\x00", 4);
    TU_FAILS(ctx, sg_digits_data(ctx, path, 8, 10, 1, &d), SG_ERR_INVALID, "is gzip-compressed");
    snprintf(want, sizeof want, "%s/none.csv", dir);
    TU_FAILS(ctx, sg_digits_data(ctx, want, 8, 10, 1, &d), SG_ERR_IO, want);
    TU_FAILS(ctx, sg_digits_data(ctx, dir, 8, 10, 1, &d), SG_ERR_INVALID, "is not a regular file");
    text = random_csv(10, 10, px, y, &len);
    path = write_file(text, len);
    free(text);
    TU_FAILS(ctx, sg_digits_data(ctx, path, 8, 9, 1, &d), SG_ERR_INVALID, "the digits have 10 classes, the model 9");
    TU_FAILS(ctx, sg_digits_data(ctx, path, 7, 10, 1, &d), SG_ERR_SHAPE, "images of 7 x 7: expected R >= 8");
    TU_CHECK(d == NULL, "a refused file left a data set");
    /* the context is still usable: the same file read, a model trains on it */
    sg_model_options mo = {.data_path = path};
    sg_model *m = NULL;
    TU_OK(ctx, sg_model_create_ex(ctx, "resnet18-2-32", tu_next(), &mo, &m));
    tu_trains_a_step(ctx, m, "after the refused digits files");
}

/* The image kinds with a digits file: classes, the estimate, the splits, sg_trainer_eval. */
static void check_models(sg_ctx *ctx)
{
    int64_t n = tu_randint(10, 30), R = 32;
    uint8_t *px = malloc((size_t)n * SIDE * SIDE);
    int32_t *y = malloc((size_t)n * sizeof *y);
    size_t len;
    char *text = random_csv(n, 10, px, y, &len);
    const char *path = write_file(text, len);
    free(text);
    const char *names[] = {"resnet18-3-32", "efficientnet_b0-3-32"};
    for (int i = 0; i < 2; i++) {
        sg_model_options mo = {.data_path = path}, ten = {.classes = 10}, nine = {.data_path = path, .classes = 9};
        sg_model_size z, z10;
        TU_OK(NULL, sg_model_estimate(names[i], &mo, &z));
        TU_OK(NULL, sg_model_estimate(names[i], &ten, &z10));
        TU_CHECK(z.params == z10.params, "%s with digits: %lld parameters estimated, with 10 classes %lld", names[i],
                 (long long)z.params, (long long)z10.params);
        TU_CHECK(z.data_bytes == (size_t)(n * (R * R * 3 + 1) * 4), "%s: data estimated at %zu bytes, the file's "
                 "%lld images %lld", names[i], z.data_bytes, (long long)n, (long long)(n * (R * R * 3 + 1) * 4));
        sg_model *m = NULL;
        TU_FAILS(ctx, sg_model_create_ex(ctx, names[i], 1, &nine, &m), SG_ERR_INVALID,
                 "the digits have 10 classes, the model 9");
        TU_OK(ctx, sg_model_create_ex(ctx, names[i], tu_next(), &mo, &m));
        TU_CHECK(sg_model_param_count(m) == z.params, "%s: %lld parameters, estimated %lld", names[i],
                 (long long)sg_model_param_count(m), (long long)z.params);
        TU_CHECK(sg_model_split_size(m, 0) == n - n / 5 && sg_model_split_size(m, 1) == n / 5,
                 "%s: splits of %lld and %lld images, expected %lld and %lld", names[i],
                 (long long)sg_model_split_size(m, 0), (long long)sg_model_split_size(m, 1), (long long)(n - n / 5),
                 (long long)(n / 5));
        sg_model_destroy(m);
    }
    sg_model_options mlp = {.data_path = path};
    sg_model *m = NULL;
    TU_FAILS(ctx, sg_model_create_ex(ctx, "mlp-32-2-8", 1, &mlp, &m), SG_ERR_INVALID, "are for gpt models");
    free(px), free(y);
}

/* stem conv 3x3 (3 -> C) + BN + ReLU; a residual block (conv, BN + ReLU, conv, BN; identity);
 * two convs 3x3 stride 2 (C -> 2C -> 4C) + BN + ReLU; global average pool; fc to 10. */
static sg_model *small_resnet(sg_ctx *ctx, sg_dataset *d, int64_t B, int64_t R, int64_t C, uint64_t seed)
{
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = B;
    sg_builder *b;
    TU_OK(ctx, sg_builder_create(ctx, "digits-resnet", &bo, &b));
    sg_module *l[10], *blk[4], *seq;
    int64_t H = R, in[3] = {R, R, C};
    TU_OK(ctx, sg_module_conv2d(b, "stem", R, R, 3, C, 3, 1, 1, 1, 0, &l[0]));
    TU_OK(ctx, sg_module_batchnorm2d(b, "stem_bn", H, H, C, SG_ACT_RELU, &l[1]));
    TU_OK(ctx, sg_builder_push_scope(b, "block"));
    TU_OK(ctx, sg_module_conv2d(b, "a", H, H, C, C, 3, 1, 1, 1, 0, &blk[0]));
    TU_OK(ctx, sg_module_batchnorm2d(b, "a_bn", H, H, C, SG_ACT_RELU, &blk[1]));
    TU_OK(ctx, sg_module_conv2d(b, "b", H, H, C, C, 3, 1, 1, 1, 0, &blk[2]));
    TU_OK(ctx, sg_module_batchnorm2d(b, "b_bn", H, H, C, SG_ACT_NONE, &blk[3]));
    TU_OK(ctx, sg_module_sequential(b, "main", blk, 4, &seq));
    TU_OK(ctx, sg_module_residual_block(b, "", seq, NULL, in, in, SG_ACT_RELU, &l[2]));
    sg_builder_pop_scope(b);
    int n = 3;
    int64_t c = C;
    for (int k = 0; k < 2; k++, c *= 2) {
        char conv[16], bn[16];
        snprintf(conv, sizeof conv, "down%d", k), snprintf(bn, sizeof bn, "down%d_bn", k);
        int64_t H2 = (H - 1) / 2 + 1;
        TU_OK(ctx, sg_module_conv2d(b, conv, H, H, c, 2 * c, 3, 2, 1, 1, 0, &l[n++]));
        TU_OK(ctx, sg_module_batchnorm2d(b, bn, H2, H2, 2 * c, SG_ACT_RELU, &l[n++]));
        H = H2;
    }
    TU_OK(ctx, sg_module_avgpool(b, "pool", H, H, c, &l[n++]));
    TU_OK(ctx, sg_module_linear(b, "fc", c, 10, 1, SG_ACT_NONE, &l[n++]));
    sg_module *root;
    TU_OK(ctx, sg_module_sequential(b, "net", l, n, &root));
    sg_model *m;
    TU_OK(ctx, sg_builder_finish(b, root, SG_LOSS_SOFTMAX_XENT, d, seed, &m));
    return m;
}

/* sg_trainer_eval of the validation split reads the validation images (the input after one
 * batch is its first B), and under step scope an evaluation between steps leaves the steps'
 * batches (and so their losses) as they are. */
static void check_eval(sg_ctx *ctx)
{
    int64_t n = tu_randint(20, 60), B = tu_randint(2, 5), R = tu_randint(8, 12);
    uint8_t *px = malloc((size_t)n * SIDE * SIDE);
    int32_t *y = malloc((size_t)n * sizeof *y);
    size_t len;
    char *text = random_csv(n, 10, px, y, &len);
    const char *path = write_file(text, len);
    uint64_t seed = tu_next(), dseed = tu_next();
    float loss[2][8];
    for (int with_eval = 0; with_eval < 2; with_eval++) {
        sg_dataset *d = NULL;
        TU_OK(ctx, sg_digits_data(ctx, path, R, 10, dseed, &d));
        double *xv = tu_get(d->val->x);
        int64_t n_val = d->val->n, img = R * R * 3;
        sg_model *m = small_resnet(ctx, d, B, R, 4, seed);
        sg_optim *o;
        sg_trainer *t;
        sg_trainer_options to = sg_trainer_options_default();
        to.scope = SG_SCOPE_STEP;
        TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
        TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
        for (int s = 0; s < 8; s++) {
            TU_OK(ctx, sg_trainer_step(t, s));
            TU_OK(ctx, sg_model_loss_read(m, &loss[with_eval][s]));
            if (with_eval && s == 5) { /* after the capture (warm-up 3, capture at 4), between replays */
                float l;
                TU_OK(ctx, sg_trainer_eval(t, 1, 1, &l));
                TU_CHECK(isfinite(l), "validation loss %g", l);
                double *in = tu_get(sg_model_input(m)), *ref = malloc((size_t)(B * img) * sizeof *ref);
                for (int64_t r = 0; r < B; r++)
                    memcpy(ref + r * img, xv + (r % n_val) * img, (size_t)img * sizeof *ref);
                tu_close("the input after evaluating the validation split's batch 0", in, ref, B * img,
                         (tu_tol){0, 0});
                free(in), free(ref);
            }
        }
        free(xv);
        sg_trainer_destroy(t), sg_optim_destroy(o), sg_model_destroy(m);
    }
    TU_CHECK(!memcmp(loss[0], loss[1], sizeof loss[0]), "an evaluation between step-scope steps changed their losses "
             "(step 7: %.9g without, %.9g with)", loss[0][7], loss[1][7]);
    free(text), free(px), free(y);
}

/* sg_dataset_set_validation's refusals (each takes the tensors: LeakSanitizer sees a leak), and
 * sg_trainer_eval refusing split 1 of a model without one. */
static void check_set_validation(sg_ctx *ctx)
{
    int64_t n = tu_randint(4, 9), F = tu_randint(2, 5);
    sg_tensor *x = tu_tensor2(ctx, SG_DTYPE_F32, n, F, "x"), *y = tu_tensor1(ctx, SG_DTYPE_I32, n, "y");
    free(tu_random(x, -1, 1));
    TU_OK(ctx, sg_tensor_fill(y, 1.0));
    sg_dataset *d = NULL;
    TU_OK(ctx, sg_dataset_create(ctx, x, y, &d));
    TU_FAILS(ctx, sg_dataset_set_validation(d, tu_tensor2(ctx, SG_DTYPE_F32, 2, F + 1, "vx"),
                                            tu_tensor1(ctx, SG_DTYPE_I32, 2, "vy")), SG_ERR_SHAPE,
             "expected the training samples' shape and dtype");
    TU_FAILS(ctx, sg_dataset_set_validation(d, tu_tensor2(ctx, SG_DTYPE_F32, 2, F, "vx"),
                                            tu_tensor1(ctx, SG_DTYPE_I32, 3, "vy")), SG_ERR_SHAPE, "the same number");
    TU_CHECK(sg_dataset_set_validation(NULL, tu_tensor2(ctx, SG_DTYPE_F32, 2, F, "vx"),
                                       tu_tensor1(ctx, SG_DTYPE_I32, 2, "vy")) == SG_ERR_NULL, "a NULL data set");
    sg_dataset *fed = NULL;
    TU_OK(ctx, sg_dataset_create_fed(ctx, SG_DTYPE_F32, 2, (int64_t[]){2, F}, SG_DTYPE_I32, 1, (int64_t[]){2}, &fed));
    TU_FAILS(ctx, sg_dataset_set_validation(fed, tu_tensor2(ctx, SG_DTYPE_F32, 2, F, "vx"),
                                            tu_tensor1(ctx, SG_DTYPE_I32, 2, "vy")), SG_ERR_INVALID,
             "a validation split is for data sets of samples");
    sg_dataset_destroy(fed);
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = 2;
    sg_builder *b;
    sg_module *fc;
    TU_OK(ctx, sg_builder_create(ctx, "fc", &bo, &b));
    TU_OK(ctx, sg_module_linear(b, "fc", F, 3, 1, SG_ACT_NONE, &fc));
    sg_model *m;
    TU_OK(ctx, sg_builder_finish(b, fc, SG_LOSS_SOFTMAX_XENT, d, tu_next(), &m));
    TU_FAILS(ctx, sg_dataset_set_validation(d, tu_tensor2(ctx, SG_DTYPE_F32, 2, F, "vx"),
                                            tu_tensor1(ctx, SG_DTYPE_I32, 2, "vy")), SG_ERR_INVALID,
             "belongs to a model");
    TU_CHECK(sg_model_split_size(m, 0) == n && sg_model_split_size(m, 1) == 0, "splits %lld and %lld, expected %lld "
             "and 0", (long long)sg_model_split_size(m, 0), (long long)sg_model_split_size(m, 1), (long long)n);
    sg_optim *o;
    sg_trainer *t;
    sg_trainer_options to = sg_trainer_options_default();
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
    float l;
    TU_FAILS(ctx, sg_trainer_eval(t, 1, 1, &l), SG_ERR_INVALID, "for models with a validation split");
    TU_OK(ctx, sg_trainer_eval(t, 0, 1, &l));
    sg_trainer_destroy(t), sg_optim_destroy(o), sg_model_destroy(m);
}

/* The real digits: a small ResNet (images scaled up to 12 x 12, 8 channels) trained with AdamW
 * (lr 3e-3) for 150 steps of 32 (about 3 epochs of the 1438 training images), the held-out loss
 * before and after over the whole validation split (359 images). A model that ignores the
 * pixels can do no better than the entropy of the validation labels (the best constant
 * prediction), about ln 10 = 2.30 nats for the nearly balanced digits: the held-out loss must
 * end below half of that entropy and below its start (measured over 8 seeds: 2.31 -> 0.30 to
 * 0.51, 3 s on a 2-core CPU). */
static void check_learning(sg_ctx *ctx, const char *path)
{
    if (!path || access(path, R_OK) != 0) {
        tu_failures++;
        fprintf(stderr, "FAIL: the digits file '%s' is not there: the digits_data fixture fetches it "
                "(scripts/fetch-digits.sh DIR)\n", path ? path : "(none given)");
        return;
    }
    int64_t B = 32, R = 12, steps = 150;
    uint64_t seed = tu_next();
    sg_dataset *d = NULL;
    TU_OK(ctx, sg_digits_data(ctx, path, R, 10, seed ^ 0x5eedda7aull, &d));
    int64_t n_val = d->val->n, counts[10] = {0};
    double *yv = tu_get(d->val->y), chance = 0;
    for (int64_t i = 0; i < n_val; i++) counts[(int)yv[i]]++;
    for (int c = 0; c < 10; c++)
        if (counts[c]) chance -= (double)counts[c] / n_val * log((double)counts[c] / n_val);
    free(yv);
    sg_model *m = small_resnet(ctx, d, B, R, 8, seed);
    sg_optim *o;
    sg_trainer *t;
    sg_trainer_options to = sg_trainer_options_default();
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    TU_OK(ctx, sg_optim_set_lr(o, 3e-3f));
    TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
    int batches = (int)((n_val + B - 1) / B);
    float v0, v1;
    TU_OK(ctx, sg_trainer_eval(t, 1, batches, &v0));
    for (int64_t s = 0; s < steps; s++) TU_OK(ctx, sg_trainer_step(t, s));
    TU_OK(ctx, sg_trainer_eval(t, 1, batches, &v1));
    printf("digits: held-out loss %.4f -> %.4f after %lld steps of %lld (validation labels' entropy %.4f)\n", v0, v1,
           (long long)steps, (long long)B, chance);
    TU_CHECK(v1 < chance / 2 && v1 < v0, "the held-out loss went %.4f -> %.4f: expected to end below half the "
             "validation labels' entropy, %.4f", v0, v1, chance / 2);
    sg_trainer_destroy(t), sg_optim_destroy(o), sg_model_destroy(m);
}

int main(int argc, char **argv)
{
    tu_seed("test_digits");
    bool gpu = argc > 1 && !strcmp(argv[1], "gpu");
    sg_ctx *ctx = tu_ctx(gpu ? SG_BACKEND_CUDA : SG_BACKEND_CPU);
    tu_tempdir(dir, sizeof dir, "digits");
    check_reader(ctx);
    check_refusals(ctx);
    check_models(ctx);
    check_eval(ctx);
    check_set_validation(ctx);
    check_learning(ctx, argc > 2 ? argv[2] : NULL);
    sg_ctx_destroy(ctx);
    for (int i = 0; i < n_files; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/digits%d.csv", dir, i);
        remove(path);
    }
    rmdir(dir);
    return tu_finish("test_digits");
}
