/* cond_cuda.cu: the one-thread kernel that copies a conditional region's int32 device value
 * into its conditional node's handle (graph_cuda.c launches it before the node and, for WHILE,
 * at the end of the body). IF and WHILE take value != 0; SWITCH the index, a negative one
 * mapped past every branch, so that nothing runs. */
#include "core/core.h"

#include <cuda_runtime.h>

static __global__ void cond_set_kernel(cudaGraphConditionalHandle h, const int32_t *v, int kind)
{
    int32_t x = *v;
    unsigned value = kind == SG_COND_SWITCH ? (x < 0 ? 0xffffffffu : (unsigned)x) : (x != 0);
    cudaGraphSetConditional(h, value);
}

extern "C" sg_status sg_cond_set_cuda(sg_ctx *ctx, unsigned long long handle, const sg_tensor *v, int kind)
{
    cond_set_kernel<<<1, 1, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>((cudaGraphConditionalHandle)handle,
                                                                    (const int32_t *)v->data, kind);
    SG_CUDA_CHECK_LAUNCH(ctx, "cond_set_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}
