/* accum_cuda.cu: y = beta * y + alpha * x (accum.h) in one grid-stride launch, y f32 and x f32
 * or bf16, with the reference's rounding: __fmul_rn and __fadd_rn, so that the compiler cannot
 * fuse them into a multiply-add the CPU does not do. Then the launcher. */
#include "ops/accum.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "ops/dtype_cuda.cuh"

#define ACCUM_THREADS 256
#define ACCUM_BLOCKS_PER_SM 8

__device__ __forceinline__ float accum1(float y, float beta, float x, float alpha)
{
    float q = beta == 0.f ? 0.f : __fmul_rn(beta, y); /* beta 0: y is not read */
    return __fadd_rn(q, __fmul_rn(alpha, x));
}

/* y (n) = beta y + alpha x; by 4 elements (16 bytes of y) over the first n/4*4 when vec (y and
 * x aligned to 4 elements), then one at a time. */
template <typename T>
__global__ void __launch_bounds__(ACCUM_THREADS)
    accum_kernel(float *__restrict__ y, float beta, const T *__restrict__ x, float alpha, int64_t n, bool vec)
{
    const int64_t stride = (int64_t)gridDim.x * ACCUM_THREADS;
    const int64_t tid = blockIdx.x * (int64_t)ACCUM_THREADS + threadIdx.x;
    const int64_t n4 = vec ? n / 4 : 0;
    for (int64_t i = tid; i < n4; i += stride) {
        vec_t<float, 4> vy = beta == 0.f ? vec_t<float, 4>{} : ldv<float, 4>(y, i);
        vec_t<T, 4> vx = ldv<T, 4>(x, i);
#pragma unroll
        for (int k = 0; k < 4; k++) vy.e[k] = accum1(vy.e[k], beta, to_f(vx.e[k]), alpha);
        stv<float, 4>(y, i, vy);
    }
    for (int64_t i = n4 * 4 + tid; i < n; i += stride) y[i] = accum1(beta == 0.f ? 0.f : y[i], beta, to_f(x[i]), alpha);
}

template <typename T>
static void launch(const sg_ctx *ctx, sg_tensor *y, float beta, const sg_tensor *x, float alpha)
{
    int64_t n = y->numel;
    int64_t want = (n / 4 + ACCUM_THREADS - 1) / ACCUM_THREADS;
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * ACCUM_BLOCKS_PER_SM;
    if (cap < 1) cap = 1;
    int blocks = (int)(want < 1 ? 1 : (want < cap ? want : cap));
    bool vec = (uintptr_t)y->data % 16 == 0 && (uintptr_t)x->data % (4 * sizeof(T)) == 0;
    accum_kernel<T><<<blocks, ACCUM_THREADS, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (float *)y->data, beta, (const T *)x->data, alpha, n, vec);
}

extern "C" sg_status sg_accumulate_cuda(sg_ctx *ctx, sg_tensor *y, float beta, const sg_tensor *x, float alpha)
{
    if (x->dtype == SG_DTYPE_BF16) launch<__nv_bfloat16>(ctx, y, beta, x, alpha);
    else launch<float>(ctx, y, beta, x, alpha);
    SG_CUDA_CHECK_LAUNCH(ctx, "accum_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}
