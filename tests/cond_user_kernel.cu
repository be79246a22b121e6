/* cond_user_kernel.cu: CUDA code of test_cond that lives outside the library: a user's kernel
 * that writes a conditional region's value from data (c = x[0] > 0), as a user's own kernel
 * would decide a branch. Plain C entry point; built into test_cond in CUDA builds only. */
#include <cuda_runtime.h>

__global__ void tc_positive_kernel(const float *x, int *c) { *c = x[0] > 0.f; }

/* Returns the launch's cudaError_t. */
extern "C" int tc_positive_launch(void *stream, const float *x, int *c)
{
    tc_positive_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(x, c);
    return (int)cudaPeekAtLastError();
}
