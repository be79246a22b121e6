/* tensor_cuda.cu: the core's own kernels: fill, f32<->bf16 conversion, and small
 * stream-ordered writes of host values (optimizer hyperparameters) passed as kernel
 * parameters, so they need no host sync and can be captured into a graph. */
#include "core/core.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

static cudaStream_t stream_of(sg_ctx *ctx) { return (cudaStream_t)sg_ctx_stream(ctx); }

static int blocks_for(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (int)(b < 65535 * 16 ? b : 65535 * 16);
}

template <typename T> __device__ T from_double(double v);
template <> __device__ float from_double<float>(double v) { return (float)v; }
template <> __device__ __nv_bfloat16 from_double<__nv_bfloat16>(double v) { return __double2bfloat16(v); }
template <> __device__ int32_t from_double<int32_t>(double v) { return (int32_t)v; }

template <typename T> __global__ void fill_kernel(T *p, int64_t n, double v)
{
    T x = from_double<T>(v);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        p[i] = x;
}

extern "C" sg_status sg_fill_cuda(sg_ctx *ctx, sg_tensor *t, double value)
{
    int g = blocks_for(t->numel, 256);
    switch (t->dtype) {
    case SG_DTYPE_F32: fill_kernel<float><<<g, 256, 0, stream_of(ctx)>>>((float *)t->data, t->numel, value); break;
    case SG_DTYPE_BF16: fill_kernel<__nv_bfloat16><<<g, 256, 0, stream_of(ctx)>>>((__nv_bfloat16 *)t->data, t->numel, value); break;
    case SG_DTYPE_I32: fill_kernel<int32_t><<<g, 256, 0, stream_of(ctx)>>>((int32_t *)t->data, t->numel, value); break;
    default: return sg_fail(ctx, SG_ERR_DTYPE, "sg_tensor_fill: %s is not supported on CUDA", sg_dtype_name(t->dtype));
    }
    SG_CUDA_CHECK_LAUNCH(ctx, "fill_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <typename T> __device__ T add_to(T x, T v) { return x + v; }
template <> __device__ __nv_bfloat16 add_to<__nv_bfloat16>(__nv_bfloat16 x, __nv_bfloat16 v)
{
    return __float2bfloat16(__bfloat162float(x) + __bfloat162float(v));
}
template <> __device__ int32_t add_to<int32_t>(int32_t x, int32_t v) { return (int32_t)((uint32_t)x + (uint32_t)v); }

template <typename T> __global__ void add_scalar_kernel(T *p, int64_t n, double v)
{
    T x = from_double<T>(v);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        p[i] = add_to<T>(p[i], x);
}

extern "C" sg_status sg_add_scalar_cuda(sg_ctx *ctx, sg_tensor *t, double value)
{
    int g = blocks_for(t->numel, 256);
    switch (t->dtype) {
    case SG_DTYPE_F32: add_scalar_kernel<float><<<g, 256, 0, stream_of(ctx)>>>((float *)t->data, t->numel, value); break;
    case SG_DTYPE_BF16:
        add_scalar_kernel<__nv_bfloat16><<<g, 256, 0, stream_of(ctx)>>>((__nv_bfloat16 *)t->data, t->numel, value);
        break;
    case SG_DTYPE_I32: add_scalar_kernel<int32_t><<<g, 256, 0, stream_of(ctx)>>>((int32_t *)t->data, t->numel, value); break;
    default:
        return sg_fail(ctx, SG_ERR_DTYPE, "sg_tensor_add_scalar: %s is not supported on CUDA", sg_dtype_name(t->dtype));
    }
    SG_CUDA_CHECK_LAUNCH(ctx, "add_scalar_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void bf16_to_f32_kernel(float *dst, const __nv_bfloat16 *src, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

extern "C" sg_status sg_convert_cuda(sg_ctx *ctx, sg_tensor *dst, const sg_tensor *src)
{
    int g = blocks_for(src->numel, 256);
    if (dst->dtype == SG_DTYPE_BF16)
        f32_to_bf16_kernel<<<g, 256, 0, stream_of(ctx)>>>((__nv_bfloat16 *)dst->data, (const float *)src->data, src->numel);
    else
        bf16_to_f32_kernel<<<g, 256, 0, stream_of(ctx)>>>((float *)dst->data, (const __nv_bfloat16 *)src->data, src->numel);
    SG_CUDA_CHECK_LAUNCH(ctx, "convert_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

struct small_payload {
    unsigned char bytes[64];
};

__global__ void write_small_kernel(unsigned char *dst, small_payload p, int n)
{
    int i = threadIdx.x;
    if (i < n) dst[i] = p.bytes[i];
}

extern "C" sg_status sg_write_small_cuda(sg_ctx *ctx, void *dst, const void *src, size_t nbytes)
{
    small_payload p;
    memcpy(p.bytes, src, nbytes);
    write_small_kernel<<<1, 64, 0, stream_of(ctx)>>>((unsigned char *)dst, p, (int)nbytes);
    SG_CUDA_CHECK_LAUNCH(ctx, "write_small_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}
