/* rmsnorm_cuda.cu: the user's RMSNorm kernels, launched on the stream stepgraph gives
 * (sg_ctx_stream). One block a row for the forward and the input gradient (a fixed-order tree
 * reduction in shared memory: deterministic, so replays match eager runs bit for bit), one
 * thread a column for the weight gradient (rows summed in order). */
#include <cuda_runtime.h>

#define RMS_THREADS 256

__device__ float block_sum(float v, float *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

__global__ void rms_forward_kernel(const float *x, const float *w, float *y, float *rstd, long long C, float eps)
{
    __shared__ float sh[RMS_THREADS];
    const float *xi = x + blockIdx.x * C;
    float ss = 0.f;
    for (long long j = threadIdx.x; j < C; j += blockDim.x) ss += xi[j] * xi[j];
    float r = rsqrtf(block_sum(ss, sh) / (float)C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (long long j = threadIdx.x; j < C; j += blockDim.x) y[blockIdx.x * C + j] = xi[j] * r * w[j];
}

__global__ void rms_dx_kernel(const float *x, const float *w, const float *rstd, const float *dy, float *dx,
                              long long C)
{
    __shared__ float sh[RMS_THREADS];
    const float *xi = x + blockIdx.x * C, *gi = dy + blockIdx.x * C;
    float dot = 0.f;
    for (long long j = threadIdx.x; j < C; j += blockDim.x) dot += gi[j] * w[j] * xi[j];
    float r = rstd[blockIdx.x], k = block_sum(dot, sh) / (float)C * r * r * r;
    for (long long j = threadIdx.x; j < C; j += blockDim.x) dx[blockIdx.x * C + j] = r * w[j] * gi[j] - xi[j] * k;
}

__global__ void rms_dw_kernel(const float *x, const float *rstd, const float *dy, float *dw, long long rows,
                              long long C)
{
    long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (j >= C) return;
    float s = 0.f;
    for (long long i = 0; i < rows; i++) s += dy[i * C + j] * x[i * C + j] * rstd[i];
    dw[j] = s;
}

extern "C" int rmsnorm_forward_cuda(void *stream, const float *x, const float *w, float *y, float *rstd,
                                    long long rows, long long C, float eps)
{
    rms_forward_kernel<<<(unsigned)rows, RMS_THREADS, 0, (cudaStream_t)stream>>>(x, w, y, rstd, C, eps);
    return (int)cudaGetLastError();
}

extern "C" int rmsnorm_backward_cuda(void *stream, const float *x, const float *w, const float *rstd,
                                     const float *dy, float *dx, float *dw, long long rows, long long C)
{
    cudaStream_t s = (cudaStream_t)stream;
    rms_dw_kernel<<<(unsigned)((C + 127) / 128), 128, 0, s>>>(x, rstd, dy, dw, rows, C);
    rms_dx_kernel<<<(unsigned)rows, RMS_THREADS, 0, s>>>(x, w, rstd, dy, dx, C);
    return (int)cudaGetLastError();
}

extern "C" const char *rmsnorm_cuda_error(int err) { return cudaGetErrorString((cudaError_t)err); }
