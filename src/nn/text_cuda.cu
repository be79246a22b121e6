/* text_cuda.cu: the text batch gather on the device. One thread per token: row b's window
 * start is recomputed from the shared hash (three multiplies a row, cheaper than a second
 * pass), the step comes from device memory when a captured step gathers its own batch, and
 * positions past a row's len real tokens get padding. A varying batch draws its len and shape
 * bucket from that step in every thread (a hash and a scan of a few buckets, cheaper than a
 * second kernel). Tokens stay in their storage width on the device (uint8 bytes, uint16 or
 * uint32 token files) and are widened to I32 here. */
#include "nn/text.h"

#include <cuda_runtime.h>

/* Element i of a (B, T) batch: tokens[b, t] = data[s + t], targets[b, t] = data[s + t + 1],
 * s = start of row row0 + b, for t < len; padding (token 0, target -1) for len <= t < T. */
template <typename W>
__device__ __forceinline__ void gather_one(const W *__restrict__ data, int64_t n_starts,
                                           uint64_t seed, int64_t step, int64_t row0, int64_t T,
                                           int64_t len, int64_t i, int32_t *__restrict__ tokens,
                                           int32_t *__restrict__ targets)
{
    int64_t b = i / T, t = i - b * T;
    if (t >= len) {
        tokens[i] = 0;
        targets[i] = -1;
        return;
    }
    int64_t start = sg_text_window_start(seed, step, row0 + b, n_starts);
    tokens[i] = (int32_t)data[start + t];
    targets[i] = (int32_t)data[start + t + 1];
}

/* tokens/targets (B*T), len real tokens a row. W: the storage type. */
template <typename W>
__global__ void text_batch_kernel(const W *__restrict__ data, int64_t n_starts, uint64_t seed,
                                  int64_t step, const int32_t *__restrict__ step_dev,
                                  int32_t *__restrict__ tokens, int32_t *__restrict__ targets,
                                  int64_t B, int64_t T, int64_t len, int64_t row0)
{
    int64_t s = step_dev ? (int64_t)*step_dev : step;
    int64_t n = B * T, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride)
        gather_one(data, n_starts, seed, s, row0, T, len, i, tokens, targets);
}

/* The varying batch: len and bucket k from *step_dev, tokens/targets (B*Tb) from their start
 * (the grid covers B * the largest bucket; threads past B*Tb do nothing), *bucket_out = k. */
template <typename W>
__global__ void text_batch_vary_kernel(const W *__restrict__ data, int64_t n, uint64_t seed,
                                       const int32_t *__restrict__ step_dev,
                                       sg_text_buckets buckets, int32_t *__restrict__ tokens,
                                       int32_t *__restrict__ targets,
                                       int32_t *__restrict__ bucket_out, int64_t B, int64_t row0)
{
    int64_t s = (int64_t)*step_dev;
    int64_t len = sg_text_vary_len(s, buckets.size[buckets.n - 1]);
    int k = sg_text_bucket_of(&buckets, len);
    int64_t Tb = buckets.size[k], stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i0 == 0) *bucket_out = k;
    for (int64_t i = i0; i < B * Tb; i += stride)
        gather_one(data, n - len, seed, s, row0, Tb, len, i, tokens, targets);
}

/* Blocks for `work` threads of 256: no more than 8 a multiprocessor (grid-stride beyond). */
static int grid_for(sg_ctx *ctx, int64_t work, int threads)
{
    int64_t want = (work + threads - 1) / threads;
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * 8;
    return (int)(want < 1 ? 1 : want < cap ? want : cap);
}

template <typename W>
static void launch(int blocks, int threads, cudaStream_t st, const void *data, int64_t n_starts,
                   uint64_t seed, int64_t step, const int32_t *step_dev, int32_t *tokens,
                   int32_t *targets, int64_t B, int64_t T, int64_t len, int64_t row0)
{
    text_batch_kernel<W><<<blocks, threads, 0, st>>>((const W *)data, n_starts, seed, step,
                                                      step_dev, tokens, targets, B, T, len, row0);
}

extern "C" sg_status sg_text_batch_cuda(sg_ctx *ctx, const void *data, int width, int64_t n_starts,
                                        uint64_t seed, int64_t step, const int32_t *step_dev,
                                        int32_t *tokens, int32_t *targets, int64_t B, int64_t T,
                                        int64_t len, int64_t row0)
{
    SG_ASSERT(n_starts >= 1 && B >= 1 && T >= 1 && len >= 1 && len <= T);
    SG_ASSERT(width == 1 || width == 2 || width == 4);
    int threads = 256, blocks = grid_for(ctx, B * T, threads);
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    if (width == 1)
        launch<uint8_t>(blocks, threads, st, data, n_starts, seed, step, step_dev, tokens, targets,
                        B, T, len, row0);
    else if (width == 2)
        launch<uint16_t>(blocks, threads, st, data, n_starts, seed, step, step_dev, tokens,
                         targets, B, T, len, row0);
    else
        launch<uint32_t>(blocks, threads, st, data, n_starts, seed, step, step_dev, tokens,
                         targets, B, T, len, row0);
    SG_CUDA_CHECK_LAUNCH(ctx, "text_batch_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <typename W>
static void launch_vary(int blocks, int threads, cudaStream_t st, const void *data, int64_t n,
                        uint64_t seed, const int32_t *step_dev, const sg_text_buckets &buckets,
                        int32_t *tokens, int32_t *targets, int32_t *bucket_out, int64_t B,
                        int64_t row0)
{
    text_batch_vary_kernel<W><<<blocks, threads, 0, st>>>(
        (const W *)data, n, seed, step_dev, buckets, tokens, targets, bucket_out, B, row0);
}

extern "C" sg_status sg_text_batch_vary_cuda(sg_ctx *ctx, const void *data, int width, int64_t n,
                                             uint64_t seed, const int32_t *step_dev,
                                             sg_text_buckets buckets, int32_t *tokens,
                                             int32_t *targets, int32_t *bucket_out, int64_t B,
                                             int64_t row0)
{
    SG_ASSERT(buckets.n >= 1 && buckets.n <= SG_TEXT_MAX_BUCKETS && buckets.size[0] >= 1);
    SG_ASSERT(n > buckets.size[buckets.n - 1] && B >= 1 && step_dev && bucket_out);
    SG_ASSERT(width == 1 || width == 2 || width == 4);
    /* Enough threads for the largest bucket; the kernel learns which bucket this step takes. */
    int threads = 256, blocks = grid_for(ctx, B * buckets.size[buckets.n - 1], threads);
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    if (width == 1)
        launch_vary<uint8_t>(blocks, threads, st, data, n, seed, step_dev, buckets, tokens,
                             targets, bucket_out, B, row0);
    else if (width == 2)
        launch_vary<uint16_t>(blocks, threads, st, data, n, seed, step_dev, buckets, tokens,
                              targets, bucket_out, B, row0);
    else
        launch_vary<uint32_t>(blocks, threads, st, data, n, seed, step_dev, buckets, tokens,
                              targets, bucket_out, B, row0);
    SG_CUDA_CHECK_LAUNCH(ctx, "text_batch_vary_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}
