/* act_cuda.cu: elementwise ReLU, GELU (tanh), SiLU, sigmoid and residual add kernels and their
 * launchers.
 * Storage type T: f32, or bf16 for mixed precision (every tensor of a call bf16); math in f32,
 * each output rounded once to T. 16 bytes per access where the tensors allow it: 4 f32 or 8
 * bf16 per thread. */
#include "ops/act.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "ops/dtype_cuda.cuh"

#define SG_GELU_K0F 0.7978845608028654f
#define SG_GELU_K1F 0.044715f

enum act_op {
    OP_RELU_FWD,
    OP_RELU_BWD,
    OP_GELU_FWD,
    OP_GELU_BWD,
    OP_ADD,
    OP_SILU_FWD,
    OP_SILU_BWD,
    OP_SIGMOID_FWD,
    OP_SIGMOID_BWD
};

/* 1 / (1 + e^-v) with expf (not __expf: a few ulp closer to the double reference); e^-v
 * overflows to inf for v < -88, giving 0. */
__device__ __forceinline__ float sigmoidf(float v)
{
    return 1.f / (1.f + expf(-v));
}

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
    if (OP == OP_SILU_FWD) return a * sigmoidf(a);
    if (OP == OP_SILU_BWD) { /* a = x, b = dy */
        float s = sigmoidf(a);
        return b * (s + a * s * (1.f - s));
    }
    if (OP == OP_SIGMOID_FWD) return sigmoidf(a);
    if (OP == OP_SIGMOID_BWD) return b * a * (1.f - a); /* a = y (the forward's output), b = dy */
    return a + b; /* OP_ADD */
}

/* y[i] = apply(a[i], b[i]) (b NULL: a alone); by V = 16 / sizeof(T) elements over the first
 * n/V*V elements when vec (all pointers 16-byte aligned: pool blocks are, views may not be),
 * then element by element. */
template <typename T, int OP>
__global__ void eltwise_kernel(const T *__restrict__ a, const T *__restrict__ b,
                               T *__restrict__ y, int64_t n, bool vec)
{
    constexpr int V = 16 / sizeof(T);
    typedef vec_t<T, V> pack;
    int64_t nv = vec ? n / V : 0;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t tid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    for (int64_t i = tid; i < nv; i += stride) {
        pack va = reinterpret_cast<const pack *>(a)[i];
        pack vb = b ? reinterpret_cast<const pack *>(b)[i] : va;
        pack r;
#pragma unroll
        for (int k = 0; k < V; k++) r.e[k] = from_f<T>(apply<OP>(to_f(va.e[k]), to_f(vb.e[k])));
        reinterpret_cast<pack *>(y)[i] = r;
    }
    for (int64_t i = nv * V + tid; i < n; i += stride)
        y[i] = from_f<T>(apply<OP>(to_f(a[i]), b ? to_f(b[i]) : 0.f));
}

/* Grid: one thread per 16-byte access, at most 8 blocks per SM (grid-stride beyond). */
template <typename T, int OP>
static sg_status launch_t(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b, sg_tensor *y)
{
    constexpr int V = 16 / sizeof(T);
    int64_t n = a->numel;
    int threads = 256;
    int64_t want = (n / V + threads - 1) / threads;
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * 8;
    int blocks = (int)(want < 1 ? 1 : (want < cap ? want : cap));
    bool vec = ((uintptr_t)a->data | (uintptr_t)y->data | (uintptr_t)(b ? b->data : 0)) % 16 == 0;
    eltwise_kernel<T, OP><<<blocks, threads, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (const T *)a->data, b ? (const T *)b->data : nullptr, (T *)y->data, n, vec);
    SG_CUDA_CHECK_LAUNCH(ctx, "eltwise_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* By a's dtype: the entry point (fn) has checked that every tensor of the call has it. */
template <int OP>
static sg_status launch(sg_ctx *ctx, const char *fn, const sg_tensor *a, const sg_tensor *b,
                        sg_tensor *y)
{
    switch (a->dtype) {
    case SG_DTYPE_F32: return launch_t<float, OP>(ctx, a, b, y);
    case SG_DTYPE_BF16: return launch_t<__nv_bfloat16, OP>(ctx, a, b, y);
    default:
        return sg_fail(ctx, SG_ERR_DTYPE, "%s: '%s' is %s; the CUDA kernels take f32 or bf16", fn,
                       a->name, sg_dtype_name(a->dtype));
    }
}

extern "C" sg_status sg_relu_forward_cuda(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    return launch<OP_RELU_FWD>(ctx, "sg_relu_forward", x, nullptr, y);
}
extern "C" sg_status sg_relu_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    return launch<OP_RELU_BWD>(ctx, "sg_relu_backward", x, dy, dx);
}
extern "C" sg_status sg_gelu_forward_cuda(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    return launch<OP_GELU_FWD>(ctx, "sg_gelu_forward", x, nullptr, y);
}
extern "C" sg_status sg_gelu_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    return launch<OP_GELU_BWD>(ctx, "sg_gelu_backward", x, dy, dx);
}
extern "C" sg_status sg_add_forward_cuda(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b, sg_tensor *y)
{
    return launch<OP_ADD>(ctx, "sg_add_forward", a, b, y);
}
extern "C" sg_status sg_silu_forward_cuda(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    return launch<OP_SILU_FWD>(ctx, "sg_silu_forward", x, nullptr, y);
}
extern "C" sg_status sg_silu_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy, sg_tensor *dx)
{
    return launch<OP_SILU_BWD>(ctx, "sg_silu_backward", x, dy, dx);
}
extern "C" sg_status sg_sigmoid_forward_cuda(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    return launch<OP_SIGMOID_FWD>(ctx, "sg_sigmoid_forward", x, nullptr, y);
}
extern "C" sg_status sg_sigmoid_backward_cuda(sg_ctx *ctx, const sg_tensor *y, const sg_tensor *dy, sg_tensor *dx)
{
    return launch<OP_SIGMOID_BWD>(ctx, "sg_sigmoid_backward", y, dy, dx);
}
