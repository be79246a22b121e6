/* model.h: the built-in model kinds, made from the public builder and modules only (this
 * folder includes nothing but the public header): one table (model.c) of kinds with how each
 * parses its name, estimates its size, builds, and what it supports. */
#ifndef SG_MODELS_MODEL_H
#define SG_MODELS_MODEL_H

#include "stepgraph.h"

#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SG_KIND_TRY(expr)                                                                            \
    do {                                                                                           \
        sg_status st_ = (expr);                                                                    \
        if (st_ != SG_OK) return st_;                                                              \
    } while (0)

/* A canonical name's fields: kind-WIDTH-DEPTH-BATCH[-SEQ]; images (resnetD-BATCH-R,
 * efficientnet_b0-BATCH-R): width = R, the image's side, depth = D (0 for efficientnet_b0). */
typedef struct sg_kind_spec {
    int64_t width, depth, batch, seq;
    int recompute;              /* estimates: activation recompute (sg_model_options) */
} sg_kind_spec;

/* The builder options every kind starts from: the batch, and from o (NULL: the defaults) the
 * precision, loss scaling and shard; a kind sets the rest (seq, dropout) itself. */
sg_builder_options sg_kind_builder_options(const sg_model_options *o, int64_t batch);

/* The kinds' builds and size estimates (spec.batch: this shard's in estimates). */
sg_status sg_mlp_build(sg_ctx *ctx, const char *name, const sg_kind_spec *s, const sg_model_options *o,
                       uint64_t seed, sg_model **out);
sg_status sg_gpt_build(sg_ctx *ctx, const char *name, const sg_kind_spec *s, const sg_model_options *o,
                       uint64_t seed, sg_model **out);
sg_status sg_resnet_build(sg_ctx *ctx, const char *name, const sg_kind_spec *s, const sg_model_options *o,
                          uint64_t seed, sg_model **out);
sg_status sg_efficientnet_build(sg_ctx *ctx, const char *name, const sg_kind_spec *s, const sg_model_options *o,
                                uint64_t seed, sg_model **out);
void sg_mlp_estimate(const sg_kind_spec *s, int shards, sg_model_size *out);
/* classes: the head's (0 taken as 1000 by the caller). */
void sg_resnet_estimate(const sg_kind_spec *s, int64_t classes, sg_model_size *out);
void sg_efficientnet_estimate(const sg_kind_spec *s, int64_t classes, sg_model_size *out);
/* The image kinds' synthetic data set (images.c): n images R x R x 3 (NHWC), N(0,1) pixels,
 * labelled 0..classes-1 by a fixed random linear teacher of their 4 x 4 average-pooled
 * thumbnails; the same seed gives the same set. */
sg_status sg_image_data(sg_ctx *ctx, int64_t n, int64_t R, int64_t classes, uint64_t seed, sg_dataset **out);
/* The class a fixed linear teacher (classes, F) gives features f (F): the argmax of teacher f
 * (the first on ties). */
int sg_teacher_label(const double *teacher, int64_t classes, const double *f, int64_t F);
/* Host arrays x (x_shape, F32) and y (x_shape[0] labels, I32) copied into new device tensors
 * (both NULL on failure), or into a new device data set. */
sg_status sg_host_tensors(sg_ctx *ctx, const float *x, int ndim, const int64_t *x_shape, const int32_t *y,
                          sg_tensor **tx, sg_tensor **ty);
sg_status sg_host_dataset(sg_ctx *ctx, const float *x, int ndim, const int64_t *x_shape, const int32_t *y,
                          sg_dataset **out);
/* The image kinds' data: the digits of o->data_path when given (sg_digits_data), else n
 * synthetic images (sg_image_data); R x R, sg_image_classes(o) classes. */
sg_status sg_image_set(sg_ctx *ctx, const sg_model_options *o, int64_t n, int64_t R, uint64_t seed, sg_dataset **out);
/* An image kind's classes: o->classes, else 10 with a digits file, else 1000 (ImageNet's). */
int64_t sg_image_classes(const sg_model_options *o);
/* Activation recompute of a stage (resnet, efficientnet): mods[first..*n), the stage's blocks
 * made since sg_builder_begin_recompute, become one Sequential `name` in a recompute wrapper
 * at mods[first]; *n becomes first + 1. */
sg_status sg_stage_recompute(sg_builder *b, const char *name, sg_module **mods, int first, int *n);
/* scikit-learn's 8 x 8 digits (digits.c): the file at path (65 whole numbers a line: 64 gray
 * levels 0..16, the label 0..classes-1; refused naming the line and the column), the last
 * fifth the validation split (file order), the rest the training set (an order drawn from
 * seed); each image scaled up to R x R (bilinear, half-pixel centres), (level / 16 - mean) /
 * std by the training images' mean and std, three equal channels, NHWC. classes >= 10, R >= 8. */
#define SG_DIGITS_CLASSES 10
sg_status sg_digits_data(sg_ctx *ctx, const char *path, int64_t R, int64_t classes, uint64_t seed, sg_dataset **out);
/* The lines (images) of the file at path, 0 where it cannot be read: the estimates' data. */
int64_t sg_digits_count(const char *path);
/* vocab: the GPT's vocabulary (0: bytes, 256). */
void sg_gpt_estimate(const sg_kind_spec *s, sg_dtype precision, float dropout, int64_t vocab,
                     sg_model_size *out);

#ifdef __cplusplus
}
#endif
#endif
