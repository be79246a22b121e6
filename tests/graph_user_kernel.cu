/* graph_user_kernel.cu: CUDA code of test_graph that lives outside the library: a user kernel
 * y = a*x + b whose scalars sg_graph_kernel_set_args changes in a captured graph, and the raw
 * CUDA calls a careless step makes during capture (a legacy-stream launch, cudaMalloc,
 * cudaDeviceSynchronize). Plain C entry points; built into test_graph in CUDA builds only. */
#include <cuda_runtime.h>

/* y(n) = a * x(n) + b. The parameter list is what test_graph passes to
 * sg_graph_kernel_set_args: (const float *, float *, long long, float, float). */
__global__ void tg_axpb_kernel(const float *x, float *y, long long n, float a, float b)
{
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

/* Never launched: a graph holds no node of it. */
__global__ void tg_unused_kernel(float *y)
{
    if (y) y[0] = 0.f;
}

extern "C" const void *tg_axpb_func(void) { return (const void *)tg_axpb_kernel; }
extern "C" const void *tg_unused_func(void) { return (const void *)tg_unused_kernel; }

/* Launches y = a*x + b on stream (NULL: the legacy default stream, cudaStreamLegacy).
 * Returns the launch's cudaError_t; like most user code, it leaves the error state alone. */
extern "C" int tg_axpb_launch(void *stream, const float *x, float *y, long long n, float a,
                              float b)
{
    cudaStream_t s = stream ? (cudaStream_t)stream : cudaStreamLegacy;
    unsigned blocks = (unsigned)((n + 255) / 256);
    tg_axpb_kernel<<<blocks, 256, 0, s>>>(x, y, n, a, b);
    return (int)cudaPeekAtLastError();
}

/* cudaMalloc as a step might call it; *out is NULL unless it succeeded. */
extern "C" int tg_cuda_malloc(size_t bytes, void **out)
{
    *out = NULL;
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) *out = NULL;
    return (int)e;
}

extern "C" void tg_cuda_free(void *p)
{
    if (p && cudaFree(p) != cudaSuccess) cudaGetLastError();
}

/* Waits for the whole device (every stream, the legacy one included). */
extern "C" int tg_device_sync(void) { return (int)cudaDeviceSynchronize(); }

/* The thread's pending CUDA error, cleared. */
extern "C" int tg_cuda_take_error(void) { return (int)cudaGetLastError(); }
