/* conv.h: 2-D convolution, channels last: the plan (struct sg_conv2d), the CPU reference
 * (conv_cpu.c), the cuDNN path (conv_cuda.cu), stepgraph's own depthwise kernels
 * (dwconv_cuda.cu), and the public entry points that check arguments (conv.c). Shapes: x (N, H,
 * W, Cin), w (Cout, KH, KW, Cin/groups), b (Cout), y (N, OH, OW, Cout).
 *
 * Depthwise convolutions (groups = Cin = Cout, w (C, KH, KW, 1)) on CUDA: each pass (forward,
 * input gradient, weight gradient) runs cuDNN's chosen deterministic algorithm or stepgraph's
 * kernels, as the environment variable STEPGRAPH_DEPTHWISE says when the plan is made:
 *   auto (the default, or unset): both timed on scratch tensors of the plan's shapes, the
 *        faster kept, pass by pass (a pass cuDNN has no deterministic algorithm for: ours);
 *   own: stepgraph's kernels for all three passes;
 *   cudnn: cuDNN for all three, as before these kernels existed.
 * Any other value fails the plan (SG_ERR_INVALID). The choice is remembered per context with
 * the shape and the mode, so every plan of one shape in a context (an eager model and its
 * graphed twin) runs the same kernels. Shapes the kernels do not take (more than 1024 taps)
 * stay on cuDNN whatever the mode; the bias runs either way (fused into our forward; the bias
 * gradient is conv_cuda.cu's, as with cuDNN). */
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
    /* CUDA: a 1x1 convolution of stride 1 without padding or groups is a matrix product over
     * the N OH OW positions, y (M, Cout) = x (M, Cin) w (Cout, Cin)^T: the linear op's
     * cuBLASLt path runs it (deterministic; cuDNN's deterministic bf16 algorithms took ~3 ms a
     * call on EfficientNet's 1x1 convolutions, H100), no cuDNN plan. STEPGRAPH_CONV_1X1=cudnn
     * keeps cuDNN. */
    bool gemm;
    size_t ws_bytes;           /* device workspace the plan's passes use (0 on the CPU): of the
                                * context's one workspace, shared by its plans (conv_cuda.cu) */
    unsigned own;              /* SG_CONV_OWN_* bits: passes run by dwconv_cuda.cu, not cuDNN */
    void *cuda;                /* conv_cuda.cu's state: descriptors, algorithms, workspace */
};

/* The passes of a plan, as bits of sg_conv2d.own. */
enum {
    SG_CONV_OWN_FWD = 1,    /* y = x (*) w + b */
    SG_CONV_OWN_DATA = 2,   /* dx */
    SG_CONV_OWN_FILTER = 4, /* dw */
    SG_CONV_OWN_ALL = 7
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
 * the three algorithms, the workspace bytes); free releases them (c->cuda may be NULL). The
 * runs queue work on the context's stream; the first run after a plan that needs more grows
 * the context's shared workspace (from the default pool, never during a capture that has no
 * cached block for it), later runs never allocate. */
sg_status sg_conv2d_plan_cuda(sg_ctx *ctx, sg_conv2d *c);
void sg_conv2d_free_cuda(sg_conv2d *c);
sg_status sg_conv2d_forward_cuda(sg_ctx *ctx, sg_conv2d *c, const sg_tensor *x,
                                 const sg_tensor *w, const sg_tensor *b, sg_tensor *y);
sg_status sg_conv2d_backward_cuda(sg_ctx *ctx, sg_conv2d *c, const sg_tensor *x,
                                  const sg_tensor *w, const sg_tensor *dy, sg_tensor *dx,
                                  sg_tensor *dw, sg_tensor *db);

/* stepgraph's depthwise kernels (dwconv_cuda.cu, CUDA builds): f32 or bf16, f32 math, each
 * output rounded once, deterministic (no atomics: the same bits every run, eager or replayed).
 * supported: c is depthwise (groups = Cin = Cout, w (C, KH, KW, 1)) with at most 1024 taps,
 * f32 or bf16. workspace_bytes: what the weight gradient needs, (runs of rows, KH KW, C) f32
 * partial sums (see dwconv_cuda.cu). The runs take device pointers of the plan's shapes, queue
 * on the context's stream, never allocate and count no launches (the caller counts: forward 1,
 * data 1, filter 2). b may be NULL. */
bool sg_dwconv_supported(const sg_conv2d *c);
size_t sg_dwconv_workspace_bytes(const sg_conv2d *c);
sg_status sg_dwconv_forward_cuda(sg_ctx *ctx, const sg_conv2d *c, const void *x, const void *w,
                                 const void *b, void *y);
sg_status sg_dwconv_backward_data_cuda(sg_ctx *ctx, const sg_conv2d *c, const void *w,
                                       const void *dy, void *dx);
sg_status sg_dwconv_backward_filter_cuda(sg_ctx *ctx, const sg_conv2d *c, const void *x,
                                         const void *dy, void *dw, void *ws, size_t ws_bytes);

#ifdef __cplusplus
}
#endif
#endif
