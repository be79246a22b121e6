/* loss_cuda.cu: fused softmax cross-entropy and mean squared error, each ONE launch that
 * writes the gradient and the mean loss. Deterministic: no float atomics; every sum runs in a
 * fixed order for a given shape and GPU (the grid depends on M and the SM count only).
 * Cross-entropy's logits and dlogits are f32, or bf16 (mixed precision: read as f32, the same
 * f32 arithmetic, dlogits rounded once to bf16); its loss is f32 either way. MSE is f32.
 * With a loss scaler (sg_softmax_xent_scaled), every block reads the scale from scaler[0] at
 * entry and multiplies dlogits' unit grad_scale / count by it (exact: a power of two); the loss
 * is not scaled. Nothing in this launch writes the scaler.
 *
 * How one launch yields a mean: each block adds its rows (elements) into a double partial in
 * scratch (sg_ctx_scratch slot SG_SLOT_LOSS, allocated once per context); the last block to
 * finish (a __threadfence + atomicAdd ticket on an unsigned counter in the same scratch) sums
 * the partials in index order, writes loss, and sets the counter back to 0 for the next call
 * or graph replay. Cross-entropy's divisor (rows with target >= 0) must be known before any
 * dlogits is scaled, so every block first counts the targets itself: O(M) int reads per block,
 * small next to the O(M*C) logits work.
 *
 * A target >= C cannot be reported from the kernel without a host sync. Such a row reads no
 * logit out of bounds; it counts in the divisor, its loss term is NaN and its dlogits row is
 * NaN, so the loss the host reads back is NaN. (The CPU backend reports SG_ERR_INVALID.) */
#include "ops/loss.h"
#include "ops/reduce_cuda.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math_constants.h>
#include "ops/dtype_cuda.cuh"

#define LOSS_THREADS 256
#define LOSS_WARPS (LOSS_THREADS / 32)
#define LOSS_BLOCKS_PER_SM 4      /* grid cap, and so the number of partials in scratch */
#define XENT_BLOCK_ROW_MIN_C 2048 /* from this many classes a whole block takes one row */
#define SCRATCH_PARTIALS_OFF 256  /* scratch: counter at 0, double partials from here */
#define FULL_MASK 0xffffffffu

/* ---- scratch ---- */

static int max_blocks(const sg_ctx *ctx) { return sg_ctx_sm_count(ctx) * LOSS_BLOCKS_PER_SM; }

/* The same size on every call (it depends on the GPU only), so the buffer is allocated once
 * and its address never changes: a captured graph keeps pointing at it. */
static sg_status loss_scratch(sg_ctx *ctx, unsigned **counter, double **partials)
{
    void *p;
    size_t bytes = SCRATCH_PARTIALS_OFF + sizeof(double) * (size_t)max_blocks(ctx);
    SG_TRY(sg_ctx_scratch(ctx, SG_SLOT_LOSS, bytes, &p));
    *counter = (unsigned *)p;
    *partials = (double *)((char *)p + SCRATCH_PARTIALS_OFF);
    return SG_OK;
}

static int grid_for(const sg_ctx *ctx, int64_t want)
{
    int64_t cap = max_blocks(ctx);
    return (int)(want < 1 ? 1 : (want < cap ? want : cap));
}

/* ---- block reductions, fixed order ---- */

/* Every block calls this once with its partial (valid in thread 0). The last block to arrive
 * sums all partials in index order, writes loss = total / divisor (0 when divisor is 0) and
 * resets the counter. */
__device__ void finish_mean(double block_sum, double divisor, double *partials,
                            unsigned *counter, float *loss, double *sh)
{
    double a = 0;
    if (!sg_grid_sum_last<LOSS_THREADS>(block_sum, partials, counter, sh, &a)) return;
    if (threadIdx.x == 0) *loss = divisor > 0 ? (float)(a / divisor) : 0.f;
}

/* Rows with a target >= 0, counted by the whole block (integer: order does not matter). */
__device__ int block_count_targets(const int *__restrict__ targets, int M, int *sh)
{
    int c = 0;
    for (int64_t i = threadIdx.x; i < M; i += LOSS_THREADS) c += targets[i] >= 0;
    c = __reduce_add_sync(FULL_MASK, c);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = c;
    __syncthreads();
    int total = 0;
    for (int k = 0; k < LOSS_WARPS; k++) total += sh[k];
    return total;
}

/* ---- softmax cross-entropy ---- */

/* Running max m and sum s of exp(x - m). m starts at -FLT_MAX, not -inf, so that a -inf
 * logit adds exp(-inf) = 0 instead of exp(-inf - -inf) = NaN. */
typedef struct {
    float m, s;
} ms_t;

__device__ __forceinline__ ms_t ms_combine(ms_t a, ms_t b)
{
    float m = fmaxf(a.m, b.m);
    ms_t r = {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
    return r;
}

/* (m, s) over the G threads of a row's group, the same value in all of them. G is 32 (a warp
 * per row) or LOSS_THREADS (the block per row; sh: LOSS_WARPS). */
template <int G> __device__ __forceinline__ ms_t group_reduce(ms_t v, ms_t *sh)
{
    for (int o = 16; o > 0; o >>= 1) {
        ms_t w = {__shfl_xor_sync(FULL_MASK, v.m, o), __shfl_xor_sync(FULL_MASK, v.s, o)};
        v = ms_combine(v, w);
    }
    /* Partners may differ in the last bit (a*b + c*d contracts to an fma either way round):
     * every lane takes lane 0's value. */
    v.m = __shfl_sync(FULL_MASK, v.m, 0);
    v.s = __shfl_sync(FULL_MASK, v.s, 0);
    if (G == 32) return v;
    __syncthreads(); /* the previous row's readers of sh are done */
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    ms_t r = sh[0];
    for (int k = 1; k < LOSS_WARPS; k++) r = ms_combine(r, sh[k]);
    return r;
}

/* logits (M,C), targets (M), dlogits (M,C) or NULL (may be logits itself: no __restrict__),
 * logits and dlogits of storage type T (f32 or bf16); loss_scale: the scaler's scale (its
 * element 0) or NULL. A group of G threads takes rows blockIdx.x*R + group, stepping by
 * gridDim.x*R. Pass 1 reads the row once for (m, s) online; pass 2 reads it again and writes
 * dlogits. All arithmetic is f32 for both T. */
template <typename T, int G>
__global__ void __launch_bounds__(LOSS_THREADS)
    xent_kernel(const T *logits, const int *__restrict__ targets, T *dlogits, int M, int64_t C,
                float grad_scale, const float *__restrict__ loss_scale, double *partials,
                unsigned *counter, float *loss)
{
    constexpr int R = LOSS_THREADS / G; /* rows in flight per block */
    __shared__ ms_t sh_ms[LOSS_WARPS];
    __shared__ double sh_d[LOSS_WARPS];
    __shared__ int sh_i[LOSS_WARPS];
    const int group = threadIdx.x / G, gt = threadIdx.x % G;

    int count = block_count_targets(targets, M, sh_i);
    /* The unit of dlogits as without a scaler, then times the loss scale (a power of two: the
     * product is exact, so scaled dlogits are exactly scale times unscaled ones). */
    float scale = count > 0 ? grad_scale / (float)count : 0.f;
    if (loss_scale) scale *= *loss_scale;

    double acc = 0; /* this group's row losses in row order, kept by its thread 0 */
    for (int64_t r = (int64_t)blockIdx.x * R + group; r < M; r += (int64_t)gridDim.x * R) {
        const T *x = logits + r * C;
        T *d = dlogits ? dlogits + r * C : nullptr;
        int t = targets[r]; /* the same in the whole group: branches below are uniform */
        if (t < 0) {
            if (d)
                for (int64_t j = gt; j < C; j += G) d[j] = from_f<T>(0.f);
            continue;
        }
        bool bad = t >= C;
        float xt = bad ? 0.f : to_f(x[t]);
        ms_t v = {-FLT_MAX, 0.f};
#pragma unroll 4
        for (int64_t j = gt; j < C; j += G) {
            float xj = to_f(x[j]);
            if (xj > v.m) {
                v.s = v.s * expf(v.m - xj) + 1.f;
                v.m = xj;
            } else {
                v.s += expf(xj - v.m); /* a NaN logit lands here and makes s NaN */
            }
        }
        v = group_reduce<G>(v, sh_ms);
        if (G == 32) __syncwarp(); /* x[t] is read before an in-place dlogits overwrites it */
        if (gt == 0) acc += bad ? (double)CUDART_NAN_F : (double)logf(v.s) + v.m - xt;
        if (!d) continue;
        float inv_s = 1.f / v.s;
#pragma unroll 4
        for (int64_t j = gt; j < C; j += G) {
            float p = expf(to_f(x[j]) - v.m) * inv_s;
            d[j] = from_f<T>(bad ? CUDART_NAN_F : (p - (j == t ? 1.f : 0.f)) * scale);
        }
    }

    if (gt == 0) sh_d[group] = acc;
    __syncthreads();
    double bsum = 0;
    if (threadIdx.x == 0)
        for (int k = 0; k < R; k++) bsum += sh_d[k];
    finish_mean(bsum, (double)count, partials, counter, loss, sh_d);
}

/* Few classes: a warp per row, 8 rows per block. Many (a vocabulary): a block per row, so
 * that a row of 50k logits is read by 256 threads. */
template <typename T>
static void launch_xent(const sg_ctx *ctx, cudaStream_t stream, const void *logits,
                        const int *targets, void *dlogits, int64_t M, int64_t C,
                        float grad_scale, const float *loss_scale, double *partials,
                        unsigned *counter, float *loss)
{
    const T *x = (const T *)logits;
    T *d = (T *)dlogits;
    if (C >= XENT_BLOCK_ROW_MIN_C) {
        int blocks = grid_for(ctx, M);
        xent_kernel<T, LOSS_THREADS><<<blocks, LOSS_THREADS, 0, stream>>>(
            x, targets, d, (int)M, C, grad_scale, loss_scale, partials, counter, loss);
    } else {
        int blocks = grid_for(ctx, (M + LOSS_WARPS - 1) / LOSS_WARPS);
        xent_kernel<T, 32><<<blocks, LOSS_THREADS, 0, stream>>>(
            x, targets, d, (int)M, C, grad_scale, loss_scale, partials, counter, loss);
    }
}

/* scaler: NULL or SG_SCALER_COUNT F32 (loss.c checked it); only its scale is read. */
extern "C" sg_status sg_softmax_xent_cuda(sg_ctx *ctx, const sg_tensor *logits,
                                          const sg_tensor *targets, float grad_scale,
                                          const sg_tensor *scaler, sg_tensor *loss,
                                          sg_tensor *dlogits)
{
    int64_t C = logits->shape[logits->ndim - 1], M = logits->numel / C;
    unsigned *counter;
    double *partials;
    SG_TRY(loss_scratch(ctx, &counter, &partials));
    cudaStream_t stream = (cudaStream_t)sg_ctx_stream(ctx);
    const int *t = (const int *)targets->data;
    float *l = (float *)loss->data; /* f32 for f32 and bf16 logits (loss.c checked it) */
    const float *ls = scaler ? (const float *)scaler->data : nullptr;
    void *d = dlogits ? dlogits->data : nullptr;
    if (logits->dtype == SG_DTYPE_BF16)
        launch_xent<__nv_bfloat16>(ctx, stream, logits->data, t, d, M, C, grad_scale, ls,
                                   partials, counter, l);
    else
        launch_xent<float>(ctx, stream, logits->data, t, d, M, C, grad_scale, ls, partials,
                           counter, l);
    SG_CUDA_CHECK_LAUNCH(ctx, "xent_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* ---- mean squared error ---- */

/* x, t, dx (n) (dx NULL: loss only); k = 2 grad_scale / n. Grid-stride; each thread sums its
 * elements in double in index order. */
__global__ void __launch_bounds__(LOSS_THREADS)
    mse_kernel(const float *x, const float *t, float *dx, int64_t n, float k, double *partials,
               unsigned *counter, float *loss)
{
    __shared__ double sh_d[LOSS_WARPS];
    double acc = 0;
    int64_t stride = (int64_t)gridDim.x * LOSS_THREADS;
    for (int64_t i = (int64_t)blockIdx.x * LOSS_THREADS + threadIdx.x; i < n; i += stride) {
        float d = x[i] - t[i];
        acc += (double)d * d;
        if (dx) dx[i] = d * k;
    }
    double bsum = sg_block_sum<LOSS_THREADS>(acc, sh_d);
    finish_mean(bsum, (double)n, partials, counter, loss, sh_d);
}

extern "C" sg_status sg_mse_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *target,
                                 float grad_scale, sg_tensor *loss, sg_tensor *dx)
{
    int64_t n = x->numel;
    unsigned *counter;
    double *partials;
    SG_TRY(loss_scratch(ctx, &counter, &partials));
    int blocks = grid_for(ctx, (n + LOSS_THREADS * 4 - 1) / (LOSS_THREADS * 4));
    float k = (float)(2.0 * grad_scale / (double)n);
    mse_kernel<<<blocks, LOSS_THREADS, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (const float *)x->data, (const float *)target->data, dx ? (float *)dx->data : nullptr, n,
        k, partials, counter, (float *)loss->data);
    SG_CUDA_CHECK_LAUNCH(ctx, "mse_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}
