/* efficientnet.c: efficientnet_b0-B-R: torchvision's EfficientNet-B0 (B images of R x R pixels,
 * 3 channels, NHWC) with torchvision's parameter names (features.0.0.weight, features.1.0.block.1.
 * fc1.weight, features.2.0.block.0.1.running_mean, classifier.1.weight, ...; convolution weights
 * channels last, see sg_module_conv2d), 5,288,548 parameters at 1000 classes as torchvision's.
 * Stem conv 3x3/2 (32) -> BN + SiLU; 16 MBConv blocks in 7 stages (below): expand 1x1 -> BN +
 * SiLU (when the ratio is not 1), depthwise k x k -> BN + SiLU, squeeze-excitation (squeeze to
 * max(1, block input / 4), SiLU, sigmoid gate), project 1x1 -> BN, and where stride is 1 and the
 * channels stay, stochastic depth ("row" mode, p = 0.2 x block index / 16) then the residual
 * add; head conv 1x1 (1280) -> BN + SiLU; global average pool; Dropout(0.2) and the Linear
 * classifier. BN: torchvision's B0 keeps PyTorch's defaults, eps 1e-5, momentum 0.1, which
 * sg_module_batchnorm2d uses. Both dropouts are torchvision's fixed defaults (the model option
 * `dropout` stays a gpt option) and draw from the dropout generator, reproducibly under every
 * scope. Initialisation is the library's (PyTorch's layer defaults, U(+-1/sqrt(fan_in))), not
 * torchvision's kaiming_normal(fan_out) convolutions and U(+-1/sqrt(out)) classifier. Trained
 * on sg_image_data's synthetic images, or on a digits file (data_path: digits.c). Made from the
 * public builder and modules only. */
#include "models/model.h"

#include <stdbool.h>
#include <stdio.h>

#define EFFNET_BATCHES 8       /* distinct batches in the synthetic data set */
#define EFFNET_STEM 32         /* the stem's channels: stage 1's input */
#define EFFNET_HEAD 1280       /* the head conv's channels: the classifier's input */
#define EFFNET_DROPOUT 0.2f    /* the classifier's dropout (torchvision's B0) */
#define EFFNET_DEPTH_DROP 0.2f /* stochastic depth of the last block (torchvision's default) */

/* One stage of MBConv blocks: torchvision's MBConvConfig for B0 (width and depth 1.0). */
typedef struct stage {
    int expand, k, stride;     /* the stride of the stage's first block; the others 1 */
    int64_t in, out;
    int blocks;
} stage;

static const stage b0[] = {
    {1, 3, 1, 32, 16, 1},  {6, 3, 2, 16, 24, 2},   {6, 5, 2, 24, 40, 2},  {6, 3, 2, 40, 80, 3},
    {6, 5, 1, 80, 112, 3}, {6, 5, 2, 112, 192, 4}, {6, 3, 1, 192, 320, 1},
};
#define EFFNET_STAGES ((int)(sizeof b0 / sizeof *b0))
#define EFFNET_BLOCKS 16 /* the sum of b0[].blocks */

static int64_t out_size(int64_t n, int k, int stride) { return (n + 2 * (k / 2) - k) / stride + 1; }

/* Parameters (weights, BN weight and bias) and activation elements, walking the network as
 * sg_efficientnet_build builds it (a BN with SiLU keeps y, dx, z and dz). */
void sg_efficientnet_estimate(const sg_kind_spec *s, int64_t classes, sg_model_size *out)
{
    double P = 0, A = 0, B = (double)s->batch;
    int64_t H = out_size(s->width, 3, 2);
    P += EFFNET_STEM * 27.0 + 2 * EFFNET_STEM, A += 5 * B * H * H * EFFNET_STEM;
    double most = 0; /* recompute: the largest stage's buffers (the arena) */
    for (int st = 0; st < EFFNET_STAGES; st++) {
        double A0 = A, xin = B * (double)H * H * b0[st].in;
        for (int i = 0; i < b0[st].blocks; i++) {
            const stage *g = &b0[st];
            int64_t in = i ? g->out : g->in, ex = in * g->expand, sq = in / 4 > 1 ? in / 4 : 1;
            int64_t OH = out_size(H, g->k, i ? 1 : g->stride);
            double hw = (double)H * H, ohw = (double)OH * OH;
            if (ex != in) P += (double)in * ex + 2.0 * ex, A += B * hw * (in + 5.0 * ex);
            P += (double)ex * g->k * g->k + 2.0 * ex, A += B * (hw * ex + 5.0 * ohw * ex);
            P += 2.0 * ex * sq + sq + ex, A += 3 * B * ohw * ex;   /* squeeze-excitation */
            P += (double)ex * g->out + 2.0 * g->out, A += B * ohw * (ex + 3.0 * g->out);
            if (OH == H && in == g->out) A += 5 * B * ohw * g->out; /* stochastic depth, the add */
            H = OH;
        }
        if (s->recompute) { /* the stage in the arena; its output and an input gradient out of it */
            if (A - A0 > most) most = A - A0;
            A = A0 + B * (double)H * H * b0[st].out + xin;
        }
    }
    A += most;
    P += (double)b0[EFFNET_STAGES - 1].out * EFFNET_HEAD + 2.0 * EFFNET_HEAD;
    A += B * (double)H * H * (b0[EFFNET_STAGES - 1].out + 6.0 * EFFNET_HEAD);
    P += (double)EFFNET_HEAD * classes + classes, A += 4 * B * EFFNET_HEAD + 2 * B * classes;
    out->params = (int64_t)P;
    out->param_bytes = (size_t)(2 * P * 4);
    out->optim_bytes = (size_t)(2 * P * 4);
    out->activation_bytes = (size_t)(A * 4);
    out->data_bytes = (size_t)(EFFNET_BATCHES * B * ((double)s->width * s->width * 3 + 1) * 4);
}

/* torchvision's Conv2dNormActivation: conv k x k (no bias, padding k / 2) then BN (+ act),
 * named "<i>.0" and "<i>.1" in the current scope; m[0], m[1]. */
static sg_status conv_bn(sg_builder *b, int i, const int64_t in[3], int64_t Cout, int k, int stride, int groups,
                         sg_activation act, int64_t out[3], sg_module **m)
{
    char conv[16], bn[16];
    snprintf(conv, sizeof conv, "%d.0", i), snprintf(bn, sizeof bn, "%d.1", i);
    out[0] = out_size(in[0], k, stride), out[1] = out_size(in[1], k, stride), out[2] = Cout;
    SG_KIND_TRY(sg_module_conv2d(b, conv, in[0], in[1], in[2], Cout, k, stride, k / 2, groups, 0, &m[0]));
    return sg_module_batchnorm2d(b, bn, out[0], out[1], Cout, act, &m[1]);
}

/* The layers of an MBConv's "block" (scope "block" pushed): expand, depthwise, SE, project. */
static sg_status mbconv_layers(sg_builder *b, const stage *g, const int64_t in[3], int stride, int64_t out[3],
                               sg_module **m, int *n)
{
    int64_t ex = in[2] * g->expand, sq = in[2] / 4 > 1 ? in[2] / 4 : 1, a[3], d[3];
    int i = 0;
    memcpy(a, in, sizeof a);
    if (ex != in[2]) {
        SG_KIND_TRY(conv_bn(b, i++, in, ex, 1, 1, 1, SG_ACT_SILU, a, &m[*n]));
        *n += 2;
    }
    SG_KIND_TRY(conv_bn(b, i++, a, ex, g->k, stride, (int)ex, SG_ACT_SILU, d, &m[*n]));
    *n += 2;
    char se[16];
    snprintf(se, sizeof se, "%d", i++);
    SG_KIND_TRY(sg_module_squeeze_excitation(b, se, d[0], d[1], ex, sq, &m[(*n)++]));
    SG_KIND_TRY(conv_bn(b, i, d, g->out, 1, 1, 1, SG_ACT_NONE, out, &m[*n]));
    *n += 2;
    return SG_OK;
}

/* Block `id` (0..15) of the network, in scope "features.S.I": torchvision's MBConv. Where it
 * keeps the shape, y = x + stochastic_depth(block(x)); else y = block(x). */
static sg_status mbconv(sg_builder *b, const stage *g, int id, const int64_t in[3], int stride, int64_t out[3],
                        sg_module **m)
{
    sg_module *layers[8], *seq = NULL;
    int n = 0;
    SG_KIND_TRY(sg_builder_push_scope(b, "block"));
    sg_status st = mbconv_layers(b, g, in, stride, out, layers, &n);
    sg_builder_pop_scope(b);
    SG_KIND_TRY(st);
    bool residual = stride == 1 && in[2] == out[2];
    if (residual) {
        float p = EFFNET_DEPTH_DROP * (float)id / EFFNET_BLOCKS;
        SG_KIND_TRY(sg_module_stochastic_depth(b, "stochastic_depth", out[0], out[1], out[2], p, &layers[n++]));
    }
    SG_KIND_TRY(sg_module_sequential(b, "block", layers, n, &seq));
    if (!residual) {
        *m = seq;
        return SG_OK;
    }
    return sg_module_residual_block(b, "", seq, NULL, in, out, SG_ACT_NONE, m);
}

/* A scope, one call that makes modules in it, the scope popped whatever the call returned. */
#define IN_SCOPE(st, b, scope, call)                                                               \
    do {                                                                                           \
        if ((st) == SG_OK) (st) = sg_builder_push_scope((b), (scope));                             \
        if ((st) == SG_OK) {                                                                       \
            (st) = (call);                                                                         \
            sg_builder_pop_scope(b);                                                               \
        }                                                                                          \
    } while (0)

sg_status sg_efficientnet_build(sg_ctx *ctx, const char *name, const sg_kind_spec *s, const sg_model_options *o,
                                uint64_t seed, sg_model **out)
{
    int64_t R = s->width, B = s->batch, classes = sg_image_classes(o);
    sg_builder_options bo = sg_kind_builder_options(o, B);
    bo.dropout = EFFNET_DROPOUT; /* also moves the generator stochastic depth draws from */
    sg_builder *b = NULL;
    SG_KIND_TRY(sg_builder_create(ctx, name, &bo, &b));
    sg_module *mods[2 + EFFNET_BLOCKS + 2 + 3];
    int n = 0, id = 0;
    int64_t shape[3] = {R, R, 3}, next[3];
    sg_status st = SG_OK;
    IN_SCOPE(st, b, "features", conv_bn(b, 0, shape, EFFNET_STEM, 3, 2, 1, SG_ACT_SILU, next, &mods[n]));
    if (st == SG_OK) n += 2, memcpy(shape, next, sizeof next);
    /* With recompute, each stage is a region: its blocks in a Sequential "features.S", wrapped. */
    int rc = o && o->recompute;
    for (int g = 0; g < EFFNET_STAGES && st == SG_OK; g++) {
        int first = n;
        if (rc) st = sg_builder_begin_recompute(b);
        for (int i = 0; i < b0[g].blocks && st == SG_OK; i++, id++) {
            char scope[32];
            snprintf(scope, sizeof scope, "features.%d.%d", g + 1, i);
            IN_SCOPE(st, b, scope, mbconv(b, &b0[g], id, shape, i ? 1 : b0[g].stride, next, &mods[n]));
            if (st == SG_OK) n++, memcpy(shape, next, sizeof next);
        }
        if (st == SG_OK && rc) {
            char stage_name[16];
            snprintf(stage_name, sizeof stage_name, "features.%d", g + 1);
            st = sg_stage_recompute(b, stage_name, mods, first, &n);
        }
    }
    IN_SCOPE(st, b, "features",
             conv_bn(b, EFFNET_STAGES + 1, shape, EFFNET_HEAD, 1, 1, 1, SG_ACT_SILU, next, &mods[n]));
    if (st == SG_OK) n += 2, memcpy(shape, next, sizeof next);
    if (st == SG_OK) st = sg_module_avgpool(b, "avgpool", shape[0], shape[1], shape[2], &mods[n++]);
    IN_SCOPE(st, b, "classifier", sg_module_dropout(b, "0", EFFNET_HEAD, &mods[n]));
    if (st == SG_OK) n++;
    IN_SCOPE(st, b, "classifier", sg_module_linear(b, "1", EFFNET_HEAD, classes, 1, SG_ACT_NONE, &mods[n]));
    if (st == SG_OK) n++;
    sg_module *net = NULL;
    if (st == SG_OK) st = sg_module_sequential(b, "efficientnet", mods, n, &net);
    sg_dataset *d = NULL;
    if (st == SG_OK) st = sg_image_set(ctx, o, EFFNET_BATCHES * B, R, seed ^ 0x5eedda7aull, &d);
    if (st != SG_OK) {
        sg_builder_destroy(b);
        return st;
    }
    return sg_builder_finish(b, net, SG_LOSS_SOFTMAX_XENT, d, seed, out);
}
