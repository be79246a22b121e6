/* reduce_cuda.cuh: deterministic block and grid sums in double, shared by the kernels that
 * reduce a whole buffer to a scalar in one launch (the losses, the clipping norm). The order of
 * every addition is fixed by the launch shape alone, so a run and its replay give the same
 * bits. Device code only. */
#ifndef SG_OPS_REDUCE_CUDA_CUH
#define SG_OPS_REDUCE_CUDA_CUH

#include <cuda_runtime.h>

/* Sum of v over the block's THREADS threads (a multiple of 32) in a fixed tree: each warp by
 * shuffles, then the warps in index order. The result is valid in thread 0. sh: THREADS / 32
 * doubles of shared memory; every thread of the block calls it. */
template <int THREADS> __device__ __forceinline__ double sg_block_sum(double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    __syncthreads(); /* earlier readers of sh are done */
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double r = 0;
    if (threadIdx.x == 0)
        for (int k = 0; k < THREADS / 32; k++) r += sh[k];
    return r;
}

/* The "last block done" grid sum. Every block calls it once with its partial (valid in thread
 * 0): the partial goes to partials[blockIdx.x] and the block takes a ticket from *counter. The
 * block that arrives last sums all partials in index order, leaves *counter at zero for the
 * next launch, and returns true with the total in thread 0's *total; every other block returns
 * false (and should return from the kernel). */
template <int THREADS>
__device__ bool sg_grid_sum_last(double block_sum, double *partials, unsigned *counter, double *sh,
                                 double *total)
{
    __shared__ bool last;
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = block_sum;
        __threadfence(); /* the partial is visible before the ticket is taken */
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    double a = 0;
    for (unsigned k = threadIdx.x; k < gridDim.x; k += THREADS) a += __ldcg(&partials[k]);
    a = sg_block_sum<THREADS>(a, sh);
    if (threadIdx.x == 0) {
        *total = a;
        *counter = 0;
    }
    return true;
}

#endif
