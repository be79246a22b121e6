/* pool.h: the channels-last image ops that move data between positions of an image: max
 * pooling (k x k window, stride, padding), global average pooling, and squeeze-excitation's
 * per-(image, channel) scaling, forward and backward: CPU references (pool_cpu.c), CUDA kernels
 * (pool_cuda.cu), and the public entry points that check arguments (pool.c).
 * Shapes: x, dx (N, H, W, C); max pooling's y, dy, argmax (N, OH, OW, C); average pooling's y,
 * dy and channel scaling's s, ds (N, C). */
#ifndef SG_OPS_POOL_H
#define SG_OPS_POOL_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Output size of a pooling window along one dim (floor mode, as PyTorch's default). */
static inline int64_t sg_maxpool2d_out_size(int64_t in, int k, int stride, int pad)
{
    return (in + 2 * (int64_t)pad - k) / stride + 1;
}

/* Every reference computes in double (bf16 outputs rounded only on the store). The max
 * pooling backward gathers: each dx element sums, in window (row-major) order, the dy of the
 * windows that contain it and whose argmax names it; the CUDA kernel sums in the same order. */
void sg_maxpool2d_forward_cpu(const sg_tensor *x, int k, int stride, int pad, sg_tensor *y,
                              sg_tensor *argmax);
void sg_maxpool2d_backward_cpu(const sg_tensor *dy, const sg_tensor *argmax, int k, int stride,
                               int pad, sg_tensor *dx);
void sg_avgpool_forward_cpu(const sg_tensor *x, sg_tensor *y);
void sg_avgpool_backward_cpu(const sg_tensor *dy, sg_tensor *dx);
void sg_channel_scale_forward_cpu(const sg_tensor *x, const sg_tensor *s, sg_tensor *y);
void sg_channel_scale_backward_cpu(const sg_tensor *x, const sg_tensor *s, const sg_tensor *dy,
                                   sg_tensor *dx, sg_tensor *ds);

/* f32 or bf16 (one dtype per call; argmax I32), math in f32, sums over H W in double. One
 * launch each. */
sg_status sg_maxpool2d_forward_cuda(sg_ctx *ctx, const sg_tensor *x, int k, int stride, int pad,
                                    sg_tensor *y, sg_tensor *argmax);
sg_status sg_maxpool2d_backward_cuda(sg_ctx *ctx, const sg_tensor *dy, const sg_tensor *argmax,
                                     int k, int stride, int pad, sg_tensor *dx);
sg_status sg_avgpool_forward_cuda(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y);
sg_status sg_avgpool_backward_cuda(sg_ctx *ctx, const sg_tensor *dy, sg_tensor *dx);
sg_status sg_channel_scale_forward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *s,
                                        sg_tensor *y);
sg_status sg_channel_scale_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *s,
                                         const sg_tensor *dy, sg_tensor *dx, sg_tensor *ds);

#ifdef __cplusplus
}
#endif
#endif
