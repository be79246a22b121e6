/* range.c: named host ranges (a step, a module's forward or backward). Each is an NVTX range
 * in CUDA builds, which Nsight Systems shows by name on the thread's timeline, and is passed to
 * the context's range hook (the profiler's, while it records), which timestamps it on CUPTI's
 * clock so that traces and per-step analysis line ranges up with device activity. */
#include "core/core.h"

#ifdef SG_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

void sg_range_push(sg_ctx *ctx, const char *name)
{
#ifdef SG_HAVE_CUDA
    nvtxRangePushA(name);
#endif
    if (ctx && ctx->range_hook) ctx->range_hook(ctx->range_user, name, true);
}

void sg_range_pop(sg_ctx *ctx, const char *name)
{
    if (ctx && ctx->range_hook) ctx->range_hook(ctx->range_user, name, false);
#ifdef SG_HAVE_CUDA
    nvtxRangePop();
#endif
}
