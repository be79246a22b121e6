/* images.c: the built-ins' synthetic data: the image kinds' set (resnet, efficientnet): N(0,1)
 * images, NHWC, each labelled by a fixed random linear teacher of its 4 x 4 average-pooled
 * thumbnail, so a network can learn the labels from the pixels; which set an image kind trains
 * on (these, or a digits file: digits.c); and what the MLP's teacher data and the digits share
 * with it (the teacher's label, host arrays into tensors and a data set). Public API only. */
#include "models/model.h"

#include <stdlib.h>

#define IMAGES_THUMB 4 /* the teacher sees 4 x 4 average-pooled images */

/* n images R x R x 3, N(0,1), labelled by the argmax over classes of a fixed random linear map
 * of their 4 x 4 x 3 average-pooled thumbnails. */
sg_status sg_image_data(sg_ctx *ctx, int64_t n, int64_t R, int64_t classes, uint64_t seed, sg_dataset **out)
{
    const int64_t px = R * R * 3, T = IMAGES_THUMB, F = T * T * 3;
    float *x = malloc((size_t)(n * px) * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    double *teacher = malloc((size_t)(classes * F) * sizeof *teacher), thumb[IMAGES_THUMB * IMAGES_THUMB * 3];
    sg_status st = x && y && teacher
                       ? SG_OK
                       : sg_ctx_fail(ctx, SG_ERR_OOM, "sg_model_create: out of host memory for the images");
    sg_rng r = {seed};
    for (int64_t i = 0; st == SG_OK && i < classes * F; i++) teacher[i] = sg_rng_normal(&r);
    for (int64_t g = 0; st == SG_OK && g < n; g++) {
        float *img = x + g * px;
        for (int64_t k = 0; k < px; k++) img[k] = (float)sg_rng_normal(&r);
        memset(thumb, 0, sizeof thumb);
        for (int64_t h = 0; h < R; h++)
            for (int64_t w = 0; w < R; w++)
                for (int c = 0; c < 3; c++) thumb[((h * T / R) * T + w * T / R) * 3 + c] += img[(h * R + w) * 3 + c];
        y[g] = sg_teacher_label(teacher, classes, thumb, F);
    }
    if (st == SG_OK) st = sg_host_dataset(ctx, x, 4, (int64_t[]){n, R, R, 3}, y, out);
    free(x), free(y), free(teacher);
    return st;
}

int sg_teacher_label(const double *teacher, int64_t classes, const double *f, int64_t F)
{
    int best = 0;
    double best_v = -1e300;
    for (int64_t c = 0; c < classes; c++) {
        double v = 0;
        for (int64_t k = 0; k < F; k++) v += teacher[c * F + k] * f[k];
        if (v > best_v) best_v = v, best = (int)c;
    }
    return best;
}

sg_status sg_host_tensors(sg_ctx *ctx, const float *x, int ndim, const int64_t *x_shape, const int32_t *y,
                          sg_tensor **tx, sg_tensor **ty)
{
    int64_t n = x_shape[0], numel = 1;
    for (int i = 0; i < ndim; i++) numel *= x_shape[i];
    *tx = *ty = NULL;
    sg_status st = sg_tensor_create(ctx, SG_DTYPE_F32, ndim, x_shape, "data.x", tx);
    if (st == SG_OK) st = sg_tensor_create(ctx, SG_DTYPE_I32, 1, &n, "data.y", ty);
    if (st == SG_OK) st = sg_tensor_copy_from_host(*tx, x, (size_t)numel * sizeof *x);
    if (st == SG_OK) st = sg_tensor_copy_from_host(*ty, y, (size_t)n * sizeof *y);
    if (st != SG_OK) sg_tensor_destroy(*tx), sg_tensor_destroy(*ty), *tx = *ty = NULL;
    return st;
}

sg_status sg_host_dataset(sg_ctx *ctx, const float *x, int ndim, const int64_t *x_shape, const int32_t *y,
                          sg_dataset **out)
{
    sg_tensor *tx, *ty;
    SG_KIND_TRY(sg_host_tensors(ctx, x, ndim, x_shape, y, &tx, &ty));
    return sg_dataset_create(ctx, tx, ty, out);
}

int64_t sg_image_classes(const sg_model_options *o)
{
    if (o && o->classes) return o->classes;
    return o && o->data_path && o->data_path[0] ? SG_DIGITS_CLASSES : 1000;
}

sg_status sg_image_set(sg_ctx *ctx, const sg_model_options *o, int64_t n, int64_t R, uint64_t seed, sg_dataset **out)
{
    int64_t classes = sg_image_classes(o);
    if (o && o->data_path && o->data_path[0]) return sg_digits_data(ctx, o->data_path, R, classes, seed, out);
    return sg_image_data(ctx, n, R, classes, seed, out);
}

sg_status sg_stage_recompute(sg_builder *b, const char *name, sg_module **mods, int first, int *n)
{
    sg_module *seq = NULL;
    SG_KIND_TRY(sg_module_sequential(b, name, mods + first, *n - first, &seq));
    *n = first + 1; /* the blocks belong to seq now, whatever follows */
    return sg_module_recompute(b, name, seq, &mods[first]);
}
