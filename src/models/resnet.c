/* resnet.c: resnet18-B-R, resnet34-B-R, resnet50-B-R: torchvision's ResNets (B images of R x R
 * pixels, 3 channels, NHWC) with torchvision's parameter names (conv1, bn1, layer1.0.conv1,
 * layer2.0.downsample.0, fc, ...; convolution weights channels last, see sg_module_conv2d),
 * BatchNorm running statistics as buffers. Stem: conv 7x7/2 (no bias) -> BN + ReLU -> max pool
 * 3/2 pad 1; four stages of basic blocks (18, 34: [2,2,2,2], [3,4,6,3]) or bottlenecks (50:
 * [3,4,6,3], expansion 4, the stride on the 3x3 as torchvision v1.5), each stage after the
 * first halving the size; global average pool; fc to the classes. Trained on synthetic
 * images (N(0,1) pixels) labelled by a fixed random linear teacher of their 4 x 4 average-pooled
 * thumbnails (sg_image_data, images.c), or on a digits file (data_path: digits.c). Made from
 * the public builder and modules only. */
#include "models/model.h"

#include <stdio.h>
#include <stdlib.h>

#define RESNET_BATCHES 8     /* distinct batches in the synthetic data set */

typedef struct arch {
    int blocks[4];
    int bottleneck;
} arch;

static arch arch_of(int64_t depth)
{
    if (depth == 18) return (arch){{2, 2, 2, 2}, 0};
    if (depth == 34) return (arch){{3, 4, 6, 3}, 0};
    return (arch){{3, 4, 6, 3}, 1};
}

static int64_t out_size(int64_t n, int k, int stride, int pad) { return (n + 2 * pad - k) / stride + 1; }

/* Parameters (weights, BN weight and bias) and activation elements, walking the network as
 * sg_resnet_build builds it. */
void sg_resnet_estimate(const sg_kind_spec *s, int64_t classes, sg_model_size *out)
{
    arch a = arch_of(s->depth);
    double P = 0, A = 0, B = (double)s->batch;
    int64_t H = out_size(s->width, 7, 2, 3);
    P += 64.0 * 7 * 7 * 3 + 2 * 64, A += 3 * B * H * H * 64; /* conv1, bn1 (y, dx) */
    H = out_size(H, 3, 2, 1);
    A += 2 * B * H * H * 64;
    int64_t C = 64;
    double most = 0; /* recompute: the largest stage's buffers (the arena) */
    for (int st = 0; st < 4; st++) {
        double A0 = A, xin = B * (double)H * H * C;
        int64_t width = 64 << st, outc = a.bottleneck ? width * 4 : width;
        for (int i = 0; i < a.blocks[st]; i++) {
            int stride = st > 0 && i == 0 ? 2 : 1;
            int64_t OH = out_size(H, 3, stride, 1);
            if (a.bottleneck)
                P += (double)C * width + (double)width * width * 9 + (double)width * outc + 2.0 * (2 * width + outc),
                    A += 4 * B * ((double)H * H * width + (double)OH * OH * (width + outc));
            else
                P += (double)C * width * 9 + (double)width * width * 9 + 4.0 * width,
                    A += 4 * B * (double)OH * OH * 2 * width;
            if (stride != 1 || C != outc) P += (double)C * outc + 2.0 * outc, A += 4 * B * (double)OH * OH * outc;
            A += 2 * B * (double)OH * OH * outc; /* the block's own y and dx */
            H = OH, C = outc;
        }
        if (s->recompute) { /* the stage in the arena; its output and an input gradient out of it */
            if (A - A0 > most) most = A - A0;
            A = A0 + B * (double)H * H * C + xin;
        }
    }
    A += most;
    P += (double)C * classes + classes;
    A += 2 * B * (double)C + 2 * B * classes;
    out->params = (int64_t)P;
    out->param_bytes = (size_t)(2 * P * 4);
    out->optim_bytes = (size_t)(2 * P * 4);
    out->activation_bytes = (size_t)(A * 4);
    out->data_bytes = (size_t)(RESNET_BATCHES * B * ((double)s->width * s->width * 3 + 1) * 4);
}

/* conv (no bias) then BN (+ act), named "<conv>" and "<bn>" in the current scope. */
static sg_status conv_bn(sg_builder *b, const char *conv, const char *bn, const int64_t in[3], int64_t Cout, int k,
                         int stride, int pad, sg_activation act, int64_t out[3], sg_module **m)
{
    out[0] = out_size(in[0], k, stride, pad), out[1] = out_size(in[1], k, stride, pad), out[2] = Cout;
    SG_KIND_TRY(sg_module_conv2d(b, conv, in[0], in[1], in[2], Cout, k, stride, pad, 1, 0, &m[0]));
    return sg_module_batchnorm2d(b, bn, out[0], out[1], Cout, act, &m[1]);
}

/* Block i of a stage, in scope "layerS.i": torchvision's BasicBlock or Bottleneck. */
static sg_status block(sg_builder *b, const arch *a, const int64_t in[3], int64_t width, int stride, int64_t out[3],
                       sg_module **m)
{
    sg_module *main_m[6], *main_seq = NULL, *sc[2], *sc_seq = NULL;
    int64_t s1[3], s2[3], s3[3];
    int n = 0;
    if (a->bottleneck) {
        SG_KIND_TRY(conv_bn(b, "conv1", "bn1", in, width, 1, 1, 0, SG_ACT_RELU, s1, &main_m[0]));
        SG_KIND_TRY(conv_bn(b, "conv2", "bn2", s1, width, 3, stride, 1, SG_ACT_RELU, s2, &main_m[2]));
        SG_KIND_TRY(conv_bn(b, "conv3", "bn3", s2, width * 4, 1, 1, 0, SG_ACT_NONE, s3, &main_m[4]));
        n = 6;
        memcpy(out, s3, sizeof s3);
    } else {
        SG_KIND_TRY(conv_bn(b, "conv1", "bn1", in, width, 3, stride, 1, SG_ACT_RELU, s1, &main_m[0]));
        SG_KIND_TRY(conv_bn(b, "conv2", "bn2", s1, width, 3, 1, 1, SG_ACT_NONE, s2, &main_m[2]));
        n = 4;
        memcpy(out, s2, sizeof s2);
    }
    SG_KIND_TRY(sg_module_sequential(b, "main", main_m, n, &main_seq));
    if (stride != 1 || in[2] != out[2]) { /* downsample.0 (conv 1x1), downsample.1 (BN) */
        int64_t so[3];
        SG_KIND_TRY(sg_builder_push_scope(b, "downsample"));
        sg_status st = conv_bn(b, "0", "1", in, out[2], 1, stride, 0, SG_ACT_NONE, so, sc);
        sg_builder_pop_scope(b);
        SG_KIND_TRY(st);
        SG_KIND_TRY(sg_module_sequential(b, "downsample", sc, 2, &sc_seq));
    }
    return sg_module_residual_block(b, "", main_seq, sc_seq, in, out, SG_ACT_RELU, m);
}

sg_status sg_resnet_build(sg_ctx *ctx, const char *name, const sg_kind_spec *s, const sg_model_options *o,
                          uint64_t seed, sg_model **out)
{
    arch a = arch_of(s->depth);
    int64_t R = s->width, B = s->batch, classes = sg_image_classes(o);
    if (out_size(out_size(R, 7, 2, 3), 3, 2, 1) < 8)
        return sg_ctx_fail(ctx, SG_ERR_SHAPE, "sg_model_create: '%s': images of %lld pixels shrink below 1 pixel "
                           "through the stem and three stride-2 stages: expected R >= 29", name, (long long)R);
    sg_builder_options bo = sg_kind_builder_options(o, B);
    sg_builder *b = NULL;
    SG_KIND_TRY(sg_builder_create(ctx, name, &bo, &b));
    sg_module *mods[2 + 16 + 3];
    int n = 0;
    int64_t shape[3] = {R, R, 3}, next[3];
    sg_status st = conv_bn(b, "conv1", "bn1", shape, 64, 7, 2, 3, SG_ACT_RELU, next, &mods[0]);
    n = 2;
    memcpy(shape, next, sizeof next);
    if (st == SG_OK) {
        next[0] = out_size(shape[0], 3, 2, 1), next[1] = out_size(shape[1], 3, 2, 1), next[2] = shape[2];
        st = sg_module_maxpool2d(b, "maxpool", shape[0], shape[1], shape[2], 3, 2, 1, &mods[n++]);
        memcpy(shape, next, sizeof next);
    }
    /* With recompute, each stage is a region: its blocks in a Sequential "layerS", wrapped. */
    int rc = o && o->recompute;
    for (int stage = 0; stage < 4 && st == SG_OK; stage++) {
        int first = n;
        if (rc) st = sg_builder_begin_recompute(b);
        for (int i = 0; i < a.blocks[stage] && st == SG_OK; i++) {
            char scope[32];
            snprintf(scope, sizeof scope, "layer%d.%d", stage + 1, i);
            st = sg_builder_push_scope(b, scope);
            if (st == SG_OK) {
                st = block(b, &a, shape, 64 << stage, stage > 0 && i == 0 ? 2 : 1, next, &mods[n]);
                sg_builder_pop_scope(b);
            }
            if (st == SG_OK) n++, memcpy(shape, next, sizeof next);
        }
        if (st == SG_OK && rc) {
            char layer[16];
            snprintf(layer, sizeof layer, "layer%d", stage + 1);
            st = sg_stage_recompute(b, layer, mods, first, &n);
        }
    }
    if (st == SG_OK) st = sg_module_avgpool(b, "avgpool", shape[0], shape[1], shape[2], &mods[n++]);
    if (st == SG_OK) st = sg_module_linear(b, "fc", shape[2], classes, 1, SG_ACT_NONE, &mods[n++]);
    sg_module *net = NULL;
    if (st == SG_OK) st = sg_module_sequential(b, "resnet", mods, n, &net);
    sg_dataset *d = NULL;
    if (st == SG_OK) st = sg_image_set(ctx, o, RESNET_BATCHES * B, R, seed ^ 0x5eedda7aull, &d);
    if (st != SG_OK) {
        sg_builder_destroy(b);
        return st;
    }
    return sg_builder_finish(b, net, SG_LOSS_SOFTMAX_XENT, d, seed, out);
}
