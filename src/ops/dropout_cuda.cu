/* dropout_cuda.cu: the dropout kernel (forward and backward alike: out = in * mask * scale),
 * f32 or bf16, and the RNG offset advance, a one-thread kernel. Each thread takes groups of
 * four elements, one Philox call per group (dropout.h, the code the CPU reference runs),
 * through one 16-byte (f32) or 8-byte (bf16) access where the tensors allow it. The mask does
 * not depend on the dtype. Seed and offset are read from rng in device memory when the kernel
 * runs, so a graph replayed after sg_rng_advance draws a fresh mask. */
#include "ops/dropout.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "ops/dtype_cuda.cuh"

#define DROP_THREADS 256
/* 2048 threads: a full SM (the launch bounds hold the kernel to 32 registers, no spills);
 * the grid strides beyond that. */
#define DROP_BLOCKS_PER_SM 8

/* Four consecutive elements, loaded and stored as one access. */
template <typename T> struct alignas(4 * sizeof(T)) drop_quad {
    T e[4];
};

/* One element: in * (keep ? scale : 0) in double, rounded to f32: the reference's arithmetic
 * (sg_ld, a double product, sg_st), so kept values match it bit for bit (and a dropped inf or
 * NaN gives NaN, as in * 0 does in PyTorch). bf16 then rounds that f32 value to nearest even,
 * as sg_st does for a bf16 tensor: the f32 output's value, rounded to bf16. DROP false
 * (p = 0) copies the element's bits. */
template <typename T, bool DROP>
__device__ __forceinline__ T drop_apply(T v, uint32_t word, float p, double scale)
{
    if (!DROP) return v;
    return from_f<T>((float)((double)to_f(v) * (sg_dropout_keep(word, p) ? scale : 0.0)));
}

/* in, out (n) may alias (each element is read, then written, by one thread). Group g is
 * elements 4g .. 4g+3; vec: both pointers aligned to 4 elements, so group g is quad g. */
template <typename T, bool DROP>
__global__ void __launch_bounds__(DROP_THREADS, DROP_BLOCKS_PER_SM)
    dropout_kernel(const T *in, T *out, int64_t n, const uint32_t *rng, uint32_t site, float p,
                   double scale, bool vec)
{
    uint32_t w[SG_RNG_COUNT] = {0, 0, 0, 0};
    if (DROP)
        for (int k = 0; k < SG_RNG_COUNT; k++) w[k] = rng[k]; /* the same 16 bytes: broadcast */
    int64_t groups = (n + 3) / 4;
    int64_t stride = (int64_t)gridDim.x * DROP_THREADS;
    for (int64_t g = blockIdx.x * (int64_t)DROP_THREADS + threadIdx.x; g < groups; g += stride) {
        sg_philox_out r = {{0, 0, 0, 0}};
        if (DROP) r = sg_dropout_bits(w, site, (uint64_t)g);
        int64_t i = 4 * g;
        if (vec && i + 4 <= n) {
            drop_quad<T> v = reinterpret_cast<const drop_quad<T> *>(in)[g];
            for (int k = 0; k < 4; k++)
                v.e[k] = drop_apply<T, DROP>(v.e[k], r.v[k], p, scale);
            reinterpret_cast<drop_quad<T> *>(out)[g] = v;
        } else {
            for (int k = 0; k < 4 && i + k < n; k++)
                out[i + k] = drop_apply<T, DROP>(in[i + k], r.v[k], p, scale);
        }
    }
}

template <typename T>
static void launch(int blocks, cudaStream_t stream, const void *x, void *y, int64_t n,
                   const uint32_t *r, uint32_t site, float p, double scale)
{
    const T *in = (const T *)x;
    T *out = (T *)y;
    bool vec = (((uintptr_t)x | (uintptr_t)y) & (4 * sizeof(T) - 1)) == 0;
    if (p == 0.f) /* nothing drops: a copy, still one launch */
        dropout_kernel<T, false><<<blocks, DROP_THREADS, 0, stream>>>(in, out, n, r, site, p,
                                                                      scale, vec);
    else
        dropout_kernel<T, true><<<blocks, DROP_THREADS, 0, stream>>>(in, out, n, r, site, p,
                                                                     scale, vec);
}

extern "C" sg_status sg_dropout_cuda(sg_ctx *ctx, const sg_tensor *x, float p, double scale,
                                     const sg_tensor *rng, uint32_t site, sg_tensor *y)
{
    int64_t n = x->numel;
    int64_t want = ((n + 3) / 4 + DROP_THREADS - 1) / DROP_THREADS;
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * DROP_BLOCKS_PER_SM;
    if (cap < 1) cap = 1;
    int blocks = (int)(want < 1 ? 1 : (want < cap ? want : cap));
    cudaStream_t stream = (cudaStream_t)sg_ctx_stream(ctx);
    const uint32_t *r = (const uint32_t *)rng->data;
    switch (x->dtype) {
    case SG_DTYPE_F32: launch<float>(blocks, stream, x->data, y->data, n, r, site, p, scale); break;
    case SG_DTYPE_BF16:
        launch<__nv_bfloat16>(blocks, stream, x->data, y->data, n, r, site, p, scale);
        break;
    default:
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "sg_dropout_cuda: '%s' is %s; CUDA takes f32 or bf16", x->name,
                       sg_dtype_name(x->dtype));
    }
    SG_CUDA_CHECK_LAUNCH(ctx, "dropout_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* offset (rng[2] lo, rng[3] hi) += 1, carrying into hi. */
__global__ void rng_advance_kernel(uint32_t *rng)
{
    uint64_t off = ((uint64_t)rng[SG_RNG_OFFSET_HI] << 32 | rng[SG_RNG_OFFSET_LO]) + 1;
    rng[SG_RNG_OFFSET_LO] = (uint32_t)off;
    rng[SG_RNG_OFFSET_HI] = (uint32_t)(off >> 32);
}

extern "C" sg_status sg_rng_advance_cuda(sg_ctx *ctx, sg_tensor *rng)
{
    rng_advance_kernel<<<1, 1, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>((uint32_t *)rng->data);
    SG_CUDA_CHECK_LAUNCH(ctx, "rng_advance_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}
