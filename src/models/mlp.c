/* mlp.c: mlp-WIDTH-DEPTH-BATCH. Input dim WIDTH; DEPTH hidden Linear(WIDTH, WIDTH) layers,
 * each with its ReLU fused into the matmul's epilogue; a Linear(WIDTH, 10) head; fused
 * softmax cross-entropy. Trained on a random linear teacher's labels: N(0,1) inputs labelled
 * by the argmax of a fixed random linear map, a learnable task identical on every backend.
 * Made from the public builder and modules only. */
#include "models/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define SG_MLP_CLASSES 10
#define SG_MLP_BATCHES 32   /* distinct batches in the synthetic data set */

/* Mirrors sg_mlp_build: weights and biases with their gradients; per hidden layer its output
 * and (but the first) its input gradient, the head's output and input gradient; the data set
 * (every shard holds the whole one, of the whole batch). */
void sg_mlp_estimate(const sg_kind_spec *s, int shards, sg_model_size *out)
{
    double W = (double)s->width, L = (double)s->depth, B = (double)s->batch, K = SG_MLP_CLASSES;
    double P = L * (W * W + W) + K * W + K;
    out->params = (int64_t)P;
    out->param_bytes = (size_t)(2 * P * 4);
    out->optim_bytes = (size_t)(2 * P * 4);
    out->activation_bytes = (size_t)(((2 * L) * B * W + 2 * B * K) * 4);
    out->data_bytes = (size_t)(SG_MLP_BATCHES * B * (shards > 1 ? shards : 1) * (W + 1) * 4);
}

/* n rows of W inputs, N(0,1), and their teacher labels, on the host, into a data set. */
static sg_status teacher_data(sg_ctx *ctx, int64_t n, int64_t W, uint64_t seed, sg_dataset **out)
{
    int64_t C = SG_MLP_CLASSES;
    float *x = malloc((size_t)(n * W) * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    double *teacher = malloc((size_t)(C * W) * sizeof *teacher), *f = malloc((size_t)W * sizeof *f);
    sg_status st = x && y && teacher && f
                       ? SG_OK
                       : sg_ctx_fail(ctx, SG_ERR_OOM, "sg_model_create: out of host memory for the data set");
    sg_rng r = {seed};
    for (int64_t i = 0; st == SG_OK && i < C * W; i++) teacher[i] = sg_rng_normal(&r);
    for (int64_t g = 0; st == SG_OK && g < n; g++) {
        float *row = x + g * W;
        for (int64_t k = 0; k < W; k++) row[k] = (float)sg_rng_normal(&r), f[k] = row[k];
        y[g] = sg_teacher_label(teacher, C, f, W);
    }
    if (st == SG_OK) st = sg_host_dataset(ctx, x, 2, (int64_t[]){n, W}, y, out);
    free(x), free(y), free(teacher), free(f);
    return st;
}

sg_status sg_mlp_build(sg_ctx *ctx, const char *name, const sg_kind_spec *s, const sg_model_options *o,
                       uint64_t seed, sg_model **out)
{
    int64_t W = s->width, L = s->depth, B = s->batch;
    sg_builder_options bo = sg_kind_builder_options(o, B); /* f32 only: sg_model_create refuses bf16 */
    sg_builder *b = NULL;
    SG_KIND_TRY(sg_builder_create(ctx, name, &bo, &b));
    /* layers.l: Linear(W, W) + ReLU, the head Linear(W, 10); PyTorch's initialisation. */
    sg_module *layers[65];
    int nl = (int)L + 1;
    sg_status st = SG_OK;
    for (int l = 0; l < nl && st == SG_OK; l++) {
        char n[32];
        snprintf(n, sizeof n, "layers.%d", l);
        st = sg_module_linear(b, n, W, l == L ? SG_MLP_CLASSES : W, 1, l == L ? SG_ACT_NONE : SG_ACT_RELU,
                              &layers[l]);
    }
    sg_module *net = NULL;
    if (st == SG_OK) st = sg_module_sequential(b, "mlp", layers, nl, &net);
    /* The whole data set, of the whole batch: a data-parallel shard gathers its rows of it. */
    sg_dataset *d = NULL;
    if (st == SG_OK) st = teacher_data(ctx, SG_MLP_BATCHES * B, W, seed ^ 0x5eedda7aull, &d);
    if (st != SG_OK) {
        sg_builder_destroy(b);
        return st;
    }
    return sg_builder_finish(b, net, SG_LOSS_SOFTMAX_XENT, d, seed, out);
}
