/* act_cuda.cu: elementwise ReLU, GELU (tanh) and residual add kernels, f32, four elements
 * per thread through 16-byte loads where the tensor allows it, and their launchers. */
#include "ops/act.h"

#include <cuda_runtime.h>

#define SG_GELU_K0F 0.7978845608028654f
#define SG_GELU_K1F 0.044715f

enum act_op { OP_RELU_FWD, OP_RELU_BWD, OP_GELU_FWD, OP_GELU_BWD, OP_ADD };

template <int OP> __device__ __forceinline__ float apply(float a, float b)
{
    if (OP == OP_RELU_FWD) return a > 0.f ? a : 0.f;
    if (OP == OP_RELU_BWD) return a > 0.f ? b : 0.f; /* a = x, b = dy */
    if (OP == OP_GELU_FWD) {
        float u = SG_GELU_K0F * (a + SG_GELU_K1F * a * a * a);
        return 0.5f * a * (1.f + tanhf(u));
    }
    if (OP == OP_GELU_BWD) {
        float u = SG_GELU_K0F * (a + SG_GELU_K1F * a * a * a);
        float t = tanhf(u);
        float du = SG_GELU_K0F * (1.f + 3.f * SG_GELU_K1F * a * a);
        return b * (0.5f * (1.f + t) + 0.5f * a * (1.f - t * t) * du);
    }
    return a + b; /* OP_ADD */
}

/* y[i] = apply(a[i], b[i]); by float4 over the first n/4*4 elements when vec (all pointers
 * 16-byte aligned: pool blocks are, views may not be), then element by element. */
template <int OP>
__global__ void eltwise_kernel(const float *__restrict__ a, const float *__restrict__ b,
                               float *__restrict__ y, int64_t n, bool vec)
{
    int64_t n4 = vec ? n / 4 : 0;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t tid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t i = tid; i < n4; i += stride) {
        float4 va = reinterpret_cast<const float4 *>(a)[i];
        float4 vb = b ? reinterpret_cast<const float4 *>(b)[i] : va;
        float4 r;
        r.x = apply<OP>(va.x, vb.x);
        r.y = apply<OP>(va.y, vb.y);
        r.z = apply<OP>(va.z, vb.z);
        r.w = apply<OP>(va.w, vb.w);
        reinterpret_cast<float4 *>(y)[i] = r;
    }
    for (int64_t i = n4 * 4 + tid; i < n; i += stride) y[i] = apply<OP>(a[i], b ? b[i] : 0.f);
}

template <int OP>
static sg_status launch(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b, sg_tensor *y)
{
    int64_t n = a->numel;
    int threads = 256;
    int64_t want = (n / 4 + threads - 1) / threads;
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * 8;
    int blocks = (int)(want < 1 ? 1 : (want < cap ? want : cap));
    bool vec = ((uintptr_t)a->data | (uintptr_t)y->data | (uintptr_t)(b ? b->data : 0)) % 16 == 0;
    eltwise_kernel<OP><<<blocks, threads, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (const float *)a->data, b ? (const float *)b->data : nullptr, (float *)y->data, n, vec);
    SG_CUDA_CHECK_LAUNCH(ctx, "eltwise_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

extern "C" sg_status sg_relu_forward_cuda(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    return launch<OP_RELU_FWD>(ctx, x, nullptr, y);
}
extern "C" sg_status sg_relu_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    return launch<OP_RELU_BWD>(ctx, x, dy, dx);
}
extern "C" sg_status sg_gelu_forward_cuda(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    return launch<OP_GELU_FWD>(ctx, x, nullptr, y);
}
extern "C" sg_status sg_gelu_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    return launch<OP_GELU_BWD>(ctx, x, dy, dx);
}
extern "C" sg_status sg_add_forward_cuda(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b, sg_tensor *y)
{
    return launch<OP_ADD>(ctx, a, b, y);
}
