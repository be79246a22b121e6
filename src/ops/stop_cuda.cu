/* stop_cuda.cu: the early-stop rule (stop.h) as two one-thread kernels, the reference's
 * arithmetic on the state's int32 elements (integer counters and one float comparison, so the
 * two backends agree bit for bit). Tiny launches on purpose: they sit between steps of a
 * captured WHILE loop, where the next step waits on GO anyway. Then the launchers. */
#include "ops/stop.h"

#include <cuda_runtime.h>

__device__ __forceinline__ int32_t stop_add1(int32_t v) { return v == INT32_MAX ? v : v + 1; }

__global__ void stop_begin_kernel(int32_t *s, int32_t limit)
{
    s[SG_STOP_STEPS] = 0;
    s[SG_STOP_GO] = s[SG_STOP_REASON] == SG_STOP_NONE && limit > 0;
}

/* s (SG_STOP_STATE), loss (1); the rule arrives by value in the launch's parameters. */
__global__ void stop_check_kernel(int32_t *s, const float *loss, int32_t limit, sg_stop_rule rule)
{
    const float l = *loss;
    s[SG_STOP_STEPS] = stop_add1(s[SG_STOP_STEPS]);
    s[SG_STOP_TOTAL] = stop_add1(s[SG_STOP_TOTAL]);
    s[SG_STOP_STREAK] = isfinite(l) ? 0 : stop_add1(s[SG_STOP_STREAK]);
    if (s[SG_STOP_REASON] == SG_STOP_NONE) {
        if (rule.nonfinite_steps > 0 && s[SG_STOP_STREAK] >= rule.nonfinite_steps)
            s[SG_STOP_REASON] = SG_STOP_NONFINITE;
        else if (rule.use_target && l <= rule.target_loss) /* false for NaN */
            s[SG_STOP_REASON] = SG_STOP_TARGET;
    }
    s[SG_STOP_GO] = s[SG_STOP_REASON] == SG_STOP_NONE && s[SG_STOP_STEPS] < limit;
}

extern "C" sg_status sg_stop_begin_cuda(sg_ctx *ctx, sg_tensor *state, int32_t limit)
{
    stop_begin_kernel<<<1, 1, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>((int32_t *)state->data, limit);
    SG_CUDA_CHECK_LAUNCH(ctx, "stop_begin_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

extern "C" sg_status sg_stop_check_cuda(sg_ctx *ctx, sg_tensor *state, const sg_tensor *loss, int32_t limit,
                                        sg_stop_rule rule)
{
    stop_check_kernel<<<1, 1, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (int32_t *)state->data, (const float *)loss->data, limit, rule);
    SG_CUDA_CHECK_LAUNCH(ctx, "stop_check_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}
