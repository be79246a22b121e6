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

/* A user's side stream, forked from the capturing stream by an event and never joined back:
 * CUDA must refuse to end such a capture (cudaErrorStreamCaptureUnjoined). The stream and the
 * event are made before any capture (tg_fork_setup) and kept for the process. */
static cudaStream_t fork_stream;
static cudaEvent_t fork_event;

extern "C" int tg_fork_setup(void)
{
    cudaError_t e = cudaStreamCreateWithFlags(&fork_stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&fork_event, cudaEventDisableTiming);
    return (int)e;
}

extern "C" int tg_fork_launch(void *capturing, const float *x, float *y, long long n)
{
    cudaError_t e = cudaEventRecord(fork_event, (cudaStream_t)capturing);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(fork_stream, fork_event, 0);
    if (e != cudaSuccess) return (int)e;
    return tg_axpb_launch(fork_stream, x, y, n, 2.f, 1.f);
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

/* The thread's pending CUDA error, left in place. */
extern "C" int tg_cuda_peek_error(void) { return (int)cudaPeekAtLastError(); }
