/* amp_cuda.cu: the unscale of dynamic loss scaling in ONE launch with no host sync, so a
 * captured step can hold it. Every block reads the scale from the scaler at entry, unscales its
 * share of grad_lo (f32 or bf16) into grad (f32) in a grid-stride loop (or, for sg_amp_check,
 * only computes the unscaled values), and flags a non-finite result; thread 0 ORs the block's
 * flag into a word in scratch (sg_ctx_scratch slot SG_SLOT_AMP; an integer OR, so the outcome
 * does not depend on the order), then takes a ticket (__threadfence + atomicAdd, as
 * clip_cuda.cu). The last block to finish writes found, updates the scaler (see amp.h) and sets
 * both scratch words back to 0 for the next call or replay. The scaler is written only after
 * every block has taken its ticket, that is after every thread has read the scale. Then the
 * launcher. */
#include "ops/amp.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "ops/dtype_cuda.cuh"

#define AMP_THREADS 256
#define AMP_BLOCKS_PER_SM 4 /* a streaming kernel: one wave of 4 blocks an SM keeps it busy */

/* grad (n) = grad_lo (n) * (1 / scale) in f32; found = some result is inf or NaN; then the
 * scaler update (amp.h). lo and g may be the same f32 buffer (in place: no __restrict__; each
 * element is read, then written, by one thread); g NULL: nothing written but the flag (the
 * check of sg_amp_check). vec: lo and g aligned to 4 elements. scaler is not const: the last
 * block writes it. word, counter: the scratch words, 0 on entry and on exit. inv_out (NULL or
 * 1 float): the last block writes this step's factor. */
template <typename T>
__global__ void __launch_bounds__(AMP_THREADS)
    amp_unscale_kernel(const T *lo, float *g, int64_t n, bool vec, float *scaler,
                       unsigned *counter, unsigned *word, int *found, float *inv_out)
{
    __shared__ bool last;
    /* IEEE division (no fast math): the same f32 factor as the reference's 1.0f / scale. */
    const float inv = 1.f / scaler[SG_SCALER_SCALE];
    const int64_t stride = (int64_t)gridDim.x * AMP_THREADS;
    const int64_t tid = blockIdx.x * (int64_t)AMP_THREADS + threadIdx.x;
    const int64_t n4 = vec ? n / 4 : 0;
    bool bad = false;
    for (int64_t i = tid; i < n4; i += stride) {
        const float4 v = sg_times4(sg_load4(lo, i), inv);
        bad |= !isfinite(v.x) | !isfinite(v.y) | !isfinite(v.z) | !isfinite(v.w);
        if (g) reinterpret_cast<float4 *>(g)[i] = v;
    }
    for (int64_t i = n4 * 4 + tid; i < n; i += stride) {
        const float v = sg_times(to_f(lo[i]), inv);
        bad |= !isfinite(v);
        if (g) g[i] = v;
    }
    bad = __syncthreads_or(bad); /* also: every thread of the block has read the scale */
    if (threadIdx.x == 0) {
        if (bad) atomicOr(word, 1u);
        __threadfence(); /* the flag is visible before the ticket is taken */
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    __threadfence();
    const bool f = atomicExch(word, 0u) != 0;
    *counter = 0;
    *found = f ? 1 : 0;
    if (inv_out) *inv_out = inv;
    float scale = scaler[SG_SCALER_SCALE], good = scaler[SG_SCALER_GOOD_STEPS];
    float skipped = scaler[SG_SCALER_SKIPPED];
    if (f) {
        scale *= 0.5f;
        good = 0.f;
        skipped += 1.f;
    } else {
        good += 1.f;
        if (good >= scaler[SG_SCALER_GROWTH_INTERVAL]) {
            scale *= 2.f;
            good = 0.f;
        }
    }
    /* fmaxf(NaN, MIN) is MIN and fminf(inf, MAX) is MAX: a broken scale comes back usable. */
    scaler[SG_SCALER_SCALE] = fminf(fmaxf(scale, SG_LOSS_SCALE_MIN), SG_LOSS_SCALE_MAX);
    scaler[SG_SCALER_GOOD_STEPS] = good;
    scaler[SG_SCALER_SKIPPED] = skipped;
}

static bool aligned(const void *q, unsigned bytes) { return ((uintptr_t)q & (bytes - 1u)) == 0; }

template <typename T>
static void launch(const sg_ctx *ctx, cudaStream_t stream, const void *lo, float *g, int64_t n,
                   float *scaler, unsigned *counter, unsigned *word, int *found, float *inv_out)
{
    /* One float4 a thread a trip; at most one wave, the rest by the grid-stride loop. */
    int64_t want = (n + 4 * AMP_THREADS - 1) / (4 * AMP_THREADS);
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * AMP_BLOCKS_PER_SM;
    if (cap < 1) cap = 1;
    int blocks = (int)(want < 1 ? 1 : (want < cap ? want : cap));
    bool vec = aligned(lo, 4 * sizeof(T)) && (!g || aligned(g, 16));
    amp_unscale_kernel<T><<<blocks, AMP_THREADS, 0, stream>>>((const T *)lo, g, n, vec, scaler,
                                                             counter, word, found, inv_out);
}

extern "C" sg_status sg_amp_unscale_cuda(sg_ctx *ctx, const sg_tensor *grad_lo, sg_tensor *grad,
                                         sg_tensor *scaler, sg_tensor *found, sg_tensor *inv_out)
{
    /* Always the same size, so the buffer is allocated once and a captured graph keeps
     * pointing at it. */
    void *s = NULL;
    SG_TRY(sg_ctx_scratch(ctx, SG_SLOT_AMP, SG_AMP_SCRATCH_BYTES, &s));
    unsigned *counter = (unsigned *)s, *word = counter + 1;
    cudaStream_t stream = (cudaStream_t)sg_ctx_stream(ctx);
    float *g = grad ? (float *)grad->data : NULL, *sc = (float *)scaler->data;
    float *io = inv_out ? (float *)inv_out->data : NULL;
    int *f = (int *)found->data;
    if (grad_lo->dtype == SG_DTYPE_BF16)
        launch<__nv_bfloat16>(ctx, stream, grad_lo->data, g, grad_lo->numel, sc, counter, word, f, io);
    else
        launch<float>(ctx, stream, grad_lo->data, g, grad_lo->numel, sc, counter, word, f, io);
    SG_CUDA_CHECK_LAUNCH(ctx, "amp_unscale_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}
