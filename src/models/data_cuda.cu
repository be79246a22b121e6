/* data_cuda.cu: the batch gather that lets a captured step load its own inputs: batch
 * (*idx mod nb) of the on-device data set is copied into the static inputs, reading the index
 * from device memory, and a one-thread kernel advances the index at the end of the step. So a
 * replayed step needs no copy or launch from the host beyond the graph launch. */
#include "models/model.h"

#include <cuda_runtime.h>

__global__ void gather_batch_kernel(const float *__restrict__ data_x, const int32_t *__restrict__ data_y,
                                    float *__restrict__ x, int32_t *__restrict__ y,
                                    const int32_t *__restrict__ idx, int nb, int64_t nx, int64_t ny)
{
    int64_t b = ((int64_t)*idx % nb + nb) % nb;
    const float *src = data_x + b * nx;
    int64_t tid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    bool vec = nx % 4 == 0 && ((uintptr_t)src | (uintptr_t)x) % 16 == 0;
    if (vec)
        for (int64_t i = tid; i < nx / 4; i += stride)
            reinterpret_cast<float4 *>(x)[i] = reinterpret_cast<const float4 *>(src)[i];
    else
        for (int64_t i = tid; i < nx; i += stride) x[i] = src[i];
    for (int64_t i = tid; i < ny; i += stride) y[i] = data_y[b * ny + i];
}

__global__ void advance_kernel(int32_t *idx) { *idx += 1; }

extern "C" sg_status sg_gather_batch_cuda(sg_model *m)
{
    int64_t nx = m->x_static->numel, ny = m->t_static->numel;
    int threads = 256;
    int64_t want = (nx / 4 + threads - 1) / threads;
    int64_t cap = (int64_t)sg_ctx_sm_count(m->ctx) * 4;
    int blocks = (int)(want < 1 ? 1 : want < cap ? want : cap);
    gather_batch_kernel<<<blocks, threads, 0, (cudaStream_t)sg_ctx_stream(m->ctx)>>>(
        (const float *)m->data_x->data, (const int32_t *)m->data_y->data, (float *)m->x_static->data,
        (int32_t *)m->t_static->data, (const int32_t *)m->batch_idx->data, (int)m->n_batches, nx, ny);
    SG_CUDA_CHECK_LAUNCH(m->ctx, "gather_batch_kernel");
    sg_ctx_count_launches(m->ctx, 1);
    return SG_OK;
}

extern "C" sg_status sg_advance_batch_cuda(sg_model *m)
{
    advance_kernel<<<1, 1, 0, (cudaStream_t)sg_ctx_stream(m->ctx)>>>((int32_t *)m->batch_idx->data);
    SG_CUDA_CHECK_LAUNCH(m->ctx, "advance_kernel");
    sg_ctx_count_launches(m->ctx, 1);
    return SG_OK;
}
