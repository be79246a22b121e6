/* conv.h: 2-D convolution, channels last: the plan (struct sg_conv2d), the CPU reference
 * (conv_cpu.c), the cuDNN path (conv_cuda.cu), and the public entry points that check
 * arguments (conv.c). Shapes: x (N, H, W, Cin), w (Cout, KH, KW, Cin/groups), b (Cout),
 * y (N, OH, OW, Cout). */
#ifndef SG_OPS_CONV_H
#define SG_OPS_CONV_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most bytes of device workspace a plan takes: algorithms that want more are passed over
 * (cuDNN's FFT algorithms can ask for gigabytes at ResNet sizes). */
#define SG_CONV_WORKSPACE_MAX ((size_t)256 << 20)

struct sg_conv2d {
    sg_ctx *ctx;
    sg_dtype dtype;            /* of x, w, b, y and the gradients */
    sg_conv2d_params p;
    int64_t x_shape[4];        /* (N, H, W, Cin) */
    int64_t w_shape[4];        /* (Cout, KH, KW, Cin/groups) */
    int64_t y_shape[4];        /* (N, OH, OW, Cout) */
    size_t ws_bytes;           /* device workspace the plan holds (0 on the CPU) */
    void *cuda;                /* conv_cuda.cu's state: descriptors, algorithms, workspace */
};

/* References, in double for every dtype (each output rounded once to its dtype); sums in a
 * fixed order. b and db may be NULL, dx too. SG_ERR_OOM (naming fn) when the double copies of
 * the operands cannot be allocated. */
sg_status sg_conv2d_forward_cpu(sg_ctx *ctx, const sg_conv2d *c, const sg_tensor *x,
                                const sg_tensor *w, const sg_tensor *b, sg_tensor *y);
sg_status sg_conv2d_backward_cpu(sg_ctx *ctx, const sg_conv2d *c, const sg_tensor *x,
                                 const sg_tensor *w, const sg_tensor *dy, sg_tensor *dx,
                                 sg_tensor *dw, sg_tensor *db);

/* cuDNN (built when SG_HAVE_CUDNN): plan set-up fills c->cuda and c->ws_bytes (descriptors,
 * the three algorithms, the workspace); free releases them (c->cuda may be NULL). The runs
 * queue work on the context's stream and never allocate. */
sg_status sg_conv2d_plan_cuda(sg_ctx *ctx, sg_conv2d *c);
void sg_conv2d_free_cuda(sg_conv2d *c);
sg_status sg_conv2d_forward_cuda(sg_ctx *ctx, sg_conv2d *c, const sg_tensor *x,
                                 const sg_tensor *w, const sg_tensor *b, sg_tensor *y);
sg_status sg_conv2d_backward_cuda(sg_ctx *ctx, sg_conv2d *c, const sg_tensor *x,
                                  const sg_tensor *w, const sg_tensor *dy, sg_tensor *dx,
                                  sg_tensor *dw, sg_tensor *db);

#ifdef __cplusplus
}
#endif
#endif
