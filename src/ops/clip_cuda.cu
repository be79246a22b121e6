/* clip_cuda.cu: global-norm gradient clipping, f32 (the sum of squares also of mixed
 * precision's scaled bf16 gradients times 1 / scale), in two launches and no host sync, so a
 * captured step can hold it:
 *
 * 1. clip_sumsq_kernel: each thread sums the squares of its elements in double, in a fixed
 *    order; blocks reduce in a fixed tree into per-block partials in scratch (sg_ctx_scratch slot
 *    SG_SLOT_CLIP); the last block to finish (__threadfence + atomicAdd ticket) sums the
 *    partials in index order, writes norm (f32), nonfinite (i32) and the norm in double to
 *    scratch, and sets the counter back to 0 for the next call or replay. The grid depends on
 *    P and the SM count only, so the sum is bitwise reproducible on a given GPU.
 * 2. clip_scale_kernel (max_norm > 0 only): reads the double norm from scratch and multiplies
 *    g by coef = max_norm / (norm + 1e-6), computed in double and rounded once to f32, when that
 *    is below 1 and the norm is finite. With a factor tensor instead (sg_clip_factor), step 1
 *    writes that coefficient (1 when it would not scale) and there is no step 2: an optimizer
 *    multiplies as it reads, g * coef in f32 being the scaled value bit for bit.
 *
 * Why double: squares of finite f32 values summed in double cannot overflow (each is below
 * 2^256, there are fewer than 2^63), so the sum is finite exactly when every element is, and
 * nonfinite needs no per-element test. Against the CPU's index-order double sum the relative
 * difference is at most about P * 2^-53 (3e-9 at 25M elements), far below f32's 2^-24: the
 * norm written as f32 agrees with the reference to 1 ulp. */
#include "ops/clip.h"
#include "ops/dtype_cuda.cuh"
#include "ops/reduce_cuda.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define CLIP_THREADS 256
#define CLIP_WARPS (CLIP_THREADS / 32)
#define CLIP_BLOCKS_PER_SM 4  /* each thread keeps two float4 loads in flight */
#define CLIP_SCALE_BLOCKS_PER_SM 8
#define SCRATCH_NORM_OFF 8
#define SCRATCH_PARTIALS_OFF 256
#define FULL_MASK 0xffffffffu

static_assert(SCRATCH_PARTIALS_OFF + 8 * SG_CLIP_MAX_BLOCKS == SG_CLIP_SCRATCH_BYTES,
              "clip.h's scratch size must match the layout here");

__device__ __forceinline__ double clip_add_squares(double acc, float4 v)
{
    acc += (double)v.x * v.x;
    acc += (double)v.y * v.y;
    acc += (double)v.z * v.z;
    acc += (double)v.w * v.w;
    return acc;
}

/* The factor clipping multiplies g by, from the norm nd: max_norm / (nd + 1e-6) in double,
 * rounded once to f32, when nd is finite, max_norm > 0 and that is below 1; else 1. */
__device__ __forceinline__ float clip_coef(float max_norm, double nd)
{
    if (!isfinite(nd) || !(max_norm > 0)) return 1.f;
    const float coef = (float)((double)max_norm / (nd + 1e-6));
    return coef < 1.f ? coef : 1.f;
}

/* Elements 4 i4 to 4 i4 + 3 of g as f32: one load when vec (g 16-byte aligned for f32, 8-byte
 * for bf16), else four. */
__device__ __forceinline__ float4 ld4(const float *g, int64_t i4, bool vec)
{
    if (vec) return sg_load4(g, i4);
    return make_float4(g[4 * i4], g[4 * i4 + 1], g[4 * i4 + 2], g[4 * i4 + 3]);
}
__device__ __forceinline__ float4 ld4(const __nv_bfloat16 *g, int64_t i4, bool vec)
{
    if (vec) return sg_load4(g, i4);
    return make_float4(to_f(g[4 * i4]), to_f(g[4 * i4 + 1]), to_f(g[4 * i4 + 2]), to_f(g[4 * i4 + 3]));
}

/* g (n), or with inv_p (sg_clip_sumsq_amp) each element times *inv_p rounded to f32 first. The
 * order of the sum depends on n and the grid only, not on g's dtype or alignment (vec picks the
 * loads): group i of 4 elements of a thread is followed by group i + stride in the same trip
 * (two loads in flight), then the last n % 4 elements one by one. So scaled bf16 gradients sum
 * to the bits their unscaled f32 copy sums to. */
template <typename G>
__global__ void __launch_bounds__(CLIP_THREADS)
    clip_sumsq_kernel(const G *__restrict__ g, const float *__restrict__ inv_p, int64_t n, bool vec,
                      double *partials, unsigned *counter, int *sum_out, double *norm_d, float *norm,
                      int *nonfinite, float max_norm, float *factor)
{
    __shared__ double sh[CLIP_WARPS];
    const int64_t stride = (int64_t)gridDim.x * CLIP_THREADS;
    const int64_t tid = blockIdx.x * (int64_t)CLIP_THREADS + threadIdx.x;
    const int64_t n4 = n / 4;
    const bool scaled = inv_p != nullptr;
    const float inv = scaled ? *inv_p : 1.f;
    double acc = 0;
    for (int64_t i = tid; i < n4; i += 2 * stride) {
        float4 a = ld4(g, i, vec), b = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i + stride < n4) b = ld4(g, i + stride, vec);
        if (scaled) a = sg_times4(a, inv), b = sg_times4(b, inv); /* sg_amp_unscale's values */
        acc = clip_add_squares(acc, a);
        acc = clip_add_squares(acc, b);
    }
    for (int64_t i = n4 * 4 + tid; i < n; i += stride) {
        double v = scaled ? sg_times(to_f(g[i]), inv) : to_f(g[i]);
        acc += v * v;
    }
    double a = 0;
    if (!sg_grid_sum_last<CLIP_THREADS>(sg_block_sum<CLIP_THREADS>(acc, sh), partials, counter, sh, &a))
        return;
    if (threadIdx.x == 0 && sum_out) { /* sg_clip_sumsq: the sum alone, as raw bytes (see clip.h) */
        const long long b = __double_as_longlong(a);
        sum_out[0] = (int)(unsigned)(b & 0xffffffffll);
        sum_out[1] = (int)(unsigned)((unsigned long long)b >> 32);
    } else if (threadIdx.x == 0) {
        double nd = sqrt(a); /* inf or NaN when an element is */
        *norm_d = nd;
        *norm = (float)nd;
        *nonfinite = isfinite(a) ? 0 : 1;
        if (factor) *factor = clip_coef(max_norm, nd);
    }
}

/* g (n) *= clip_coef(max_norm, nd) in f32, when that is below 1; otherwise the thread returns
 * at once. */
__device__ __forceinline__ void clip_scale(float *__restrict__ g, int64_t n, bool vec, float max_norm, double nd)
{
    const float coef = clip_coef(max_norm, nd);
    if (!(coef < 1.f)) return;
    const int64_t stride = (int64_t)gridDim.x * CLIP_THREADS;
    const int64_t tid = blockIdx.x * (int64_t)CLIP_THREADS + threadIdx.x;
    const int64_t n4 = vec ? n / 4 : 0;
    float4 *g4 = reinterpret_cast<float4 *>(g);
    for (int64_t i = tid; i < n4; i += stride) g4[i] = sg_times4(g4[i], coef);
    for (int64_t i = n4 * 4 + tid; i < n; i += stride) g[i] = sg_times(g[i], coef);
}

/* clip_scale over the norm the sum of squares left in scratch. */
__global__ void __launch_bounds__(CLIP_THREADS)
    clip_scale_kernel(float *__restrict__ g, int64_t n, bool vec, float max_norm,
                      const double *norm_d)
{
    clip_scale(g, n, vec, max_norm, *norm_d);
}

/* sg_clip_apply: the parts' sums (raw f64 bytes, two ints each) added in order, norm = sqrt of
 * that, nonfinite, and g *= the factor as clip_scale_kernel does (or, given factor, the factor
 * written instead): the same arithmetic, so that one part measured by clip_sumsq_kernel and
 * applied here is sg_clip_grad_norm bit for bit (0 + x is x). Block 0's thread 0 writes norm,
 * nonfinite and factor; max_norm <= 0 only measures. */
__global__ void __launch_bounds__(CLIP_THREADS)
    clip_apply_kernel(float *__restrict__ g, int64_t n, bool vec, float max_norm, const int *sums,
                      int64_t parts, float *norm, int *nonfinite, float *factor)
{
    double a = 0;
    for (int64_t i = 0; i < parts; i++)
        a += __longlong_as_double((long long)(((unsigned long long)(unsigned)sums[2 * i + 1] << 32) |
                                              (unsigned)sums[2 * i]));
    const double nd = sqrt(a);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *norm = (float)nd;
        *nonfinite = isfinite(a) ? 0 : 1;
        if (factor) *factor = clip_coef(max_norm, nd);
    }
    if (!factor && max_norm > 0) clip_scale(g, n, vec, max_norm, nd);
}

static int grid_for(const sg_ctx *ctx, int64_t want, int per_sm)
{
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * per_sm;
    if (cap > SG_CLIP_MAX_BLOCKS) cap = SG_CLIP_MAX_BLOCKS;
    if (cap < 1) cap = 1;
    return (int)(want < 1 ? 1 : (want < cap ? want : cap));
}

extern "C" sg_status sg_clip_grad_norm_cuda(sg_ctx *ctx, sg_tensor *grad, float max_norm,
                                            sg_tensor *norm, sg_tensor *nonfinite, sg_tensor *factor)
{
    /* Always the same size, so the buffer is allocated once and a captured graph keeps
     * pointing at it. */
    void *s = NULL;
    SG_TRY(sg_ctx_scratch(ctx, SG_SLOT_CLIP, SG_CLIP_SCRATCH_BYTES, &s));
    unsigned *counter = (unsigned *)s;
    double *norm_d = (double *)((char *)s + SCRATCH_NORM_OFF);
    double *partials = (double *)((char *)s + SCRATCH_PARTIALS_OFF);
    int64_t n = grad->numel;
    float *g = (float *)grad->data;
    bool vec = ((uintptr_t)g & 15u) == 0;
    cudaStream_t stream = (cudaStream_t)sg_ctx_stream(ctx);

    /* Sum of squares: 8 elements a thread a trip (two float4s). */
    int blocks = grid_for(ctx, (n + 8 * CLIP_THREADS - 1) / (8 * CLIP_THREADS), CLIP_BLOCKS_PER_SM);
    clip_sumsq_kernel<float><<<blocks, CLIP_THREADS, 0, stream>>>(
        g, nullptr, n, vec, partials, counter, NULL, norm_d, (float *)norm->data, (int *)nonfinite->data, max_norm,
        factor ? (float *)factor->data : NULL);
    SG_CUDA_CHECK_LAUNCH(ctx, "clip_sumsq_kernel");
    sg_ctx_count_launches(ctx, 1);
    if (factor || !(max_norm > 0)) return SG_OK; /* measured (and the factor written) */

    int64_t want = (n + 4 * CLIP_THREADS - 1) / (4 * CLIP_THREADS);
    blocks = grid_for(ctx, want, CLIP_SCALE_BLOCKS_PER_SM);
    clip_scale_kernel<<<blocks, CLIP_THREADS, 0, stream>>>(g, n, vec, max_norm, norm_d);
    SG_CUDA_CHECK_LAUNCH(ctx, "clip_scale_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

extern "C" sg_status sg_clip_sumsq_cuda(sg_ctx *ctx, const sg_tensor *grad, const sg_tensor *inv, sg_tensor *sums,
                                        int part)
{
    void *s = NULL;
    SG_TRY(sg_ctx_scratch(ctx, SG_SLOT_CLIP, SG_CLIP_SCRATCH_BYTES, &s));
    int64_t n = grad->numel;
    const bool lo = grad->dtype == SG_DTYPE_BF16;
    const bool vec = ((uintptr_t)grad->data & (lo ? 7u : 15u)) == 0;
    const float *ip = inv ? (const float *)inv->data : nullptr;
    double *partials = (double *)((char *)s + SCRATCH_PARTIALS_OFF);
    int *out = (int *)sums->data + 2 * (int64_t)part;
    cudaStream_t stream = (cudaStream_t)sg_ctx_stream(ctx);
    int blocks = grid_for(ctx, (n + 8 * CLIP_THREADS - 1) / (8 * CLIP_THREADS), CLIP_BLOCKS_PER_SM);
    if (lo)
        clip_sumsq_kernel<__nv_bfloat16><<<blocks, CLIP_THREADS, 0, stream>>>(
            (const __nv_bfloat16 *)grad->data, ip, n, vec, partials, (unsigned *)s, out, NULL, NULL, NULL, 0.f, NULL);
    else
        clip_sumsq_kernel<float><<<blocks, CLIP_THREADS, 0, stream>>>(
            (const float *)grad->data, ip, n, vec, partials, (unsigned *)s, out, NULL, NULL, NULL, 0.f, NULL);
    SG_CUDA_CHECK_LAUNCH(ctx, "clip_sumsq_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

extern "C" sg_status sg_clip_apply_cuda(sg_ctx *ctx, sg_tensor *grad, float max_norm, const sg_tensor *sums,
                                        sg_tensor *norm, sg_tensor *nonfinite, sg_tensor *factor)
{
    const bool scale = !factor && max_norm > 0;
    int64_t n = scale ? grad->numel : 0;
    float *g = scale ? (float *)grad->data : NULL;
    bool vec = ((uintptr_t)g & 15u) == 0;
    int blocks = scale ? grid_for(ctx, (n + 4 * CLIP_THREADS - 1) / (4 * CLIP_THREADS), CLIP_SCALE_BLOCKS_PER_SM) : 1;
    clip_apply_kernel<<<blocks, CLIP_THREADS, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        g, n, vec, max_norm, (const int *)sums->data, sums->numel / 2, (float *)norm->data, (int *)nonfinite->data,
        factor ? (float *)factor->data : NULL);
    SG_CUDA_CHECK_LAUNCH(ctx, "clip_apply_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}
