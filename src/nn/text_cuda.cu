/* text_cuda.cu: the text batch gather on the device. One thread per token: row b's window
 * start is recomputed from the shared hash (three multiplies a row, cheaper than a second
 * pass), the step comes from device memory when a captured step gathers its own batch, and
 * positions past a row's len real tokens get padding. Tokens stay in their storage width on
 * the device (uint8 bytes, uint16 or uint32 token files) and are widened to I32 here. */
#include "nn/text.h"

#include <cuda_runtime.h>

/* tokens[b, t] = data[s + t], targets[b, t] = data[s + t + 1], s = start of row row0 + b, for
 * t < len; padding (token 0, target -1) for len <= t < T. W: the storage type. */
template <typename W>
__global__ void text_batch_kernel(const W *__restrict__ data, int64_t n_starts, uint64_t seed,
                                  int64_t step, const int32_t *__restrict__ step_dev,
                                  int32_t *__restrict__ tokens, int32_t *__restrict__ targets,
                                  int64_t B, int64_t T, int64_t len, int64_t row0)
{
    int64_t s = step_dev ? (int64_t)*step_dev : step;
    int64_t n = B * T, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t b = i / T, t = i - b * T;
        if (t >= len) {
            tokens[i] = 0;
            targets[i] = -1;
            continue;
        }
        int64_t start = sg_text_window_start(seed, s, row0 + b, n_starts);
        tokens[i] = (int32_t)data[start + t];
        targets[i] = (int32_t)data[start + t + 1];
    }
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
    int threads = 256;
    int64_t want = (B * T + threads - 1) / threads;
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * 8;
    int blocks = (int)(want < 1 ? 1 : want < cap ? want : cap);
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
