/* graph_gap.cu: what a CUDA graph's shape costs between its kernels. Captures a chain of N
 * short kernels on one stream (each block spins for about 2 us); the same chain with a second
 * stream forked from it and joined back, BRANCHES times, a short kernel on each branch; and the
 * same fork/join with an NCCL all-reduce (a communicator of one rank, in place, 1024 floats) on
 * each branch instead, as data parallelism's buckets are. Replays each 200 times and prints us
 * a replay and the difference a kernel of the chain against the linear graph. Standalone:
 *
 *   nvcc -O2 -arch=sm_90 bench/graph_gap.cu -o graph_gap -lnccl
 *   ./graph_gap [N] [BRANCHES] [BLOCKS]   (default 120 kernels, 4 branches, 1 block of 128)
 *
 * A measurement tool for issue 15, not part of the library; what it showed is in
 * bench/RESULTS.md (session 29). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

__global__ void spin(long long cycles, int *sink)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    if (threadIdx.x == 0 && cycles < 0) *sink = 1;
}

#define NK(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r_)); exit(1); } } while (0)

enum shape { LINEAR, FORK, FORK_NCCL };

static cudaGraphExec_t capture(enum shape sh, int n, int branches, cudaStream_t s, cudaStream_t b,
                               long long cyc, int blocks, int *sink, cudaEvent_t *ev, ncclComm_t comm,
                               float *buf)
{
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    int every = n / (branches + 1);
    for (int i = 0; i < n; i++) {
        spin<<<blocks, 128, 0, s>>>(cyc, sink);
        if (sh != LINEAR && i > 0 && i % every == 0 && i / every <= branches) {
            int k = i / every - 1;
            CK(cudaEventRecord(ev[k], s));
            CK(cudaStreamWaitEvent(b, ev[k], 0));
            if (sh == FORK) spin<<<blocks, 128, 0, b>>>(cyc, sink);
            else NK(ncclAllReduce(buf, buf, 1024, ncclFloat, ncclAvg, comm, b));
        }
    }
    if (sh != LINEAR) {
        CK(cudaEventRecord(ev[branches], b));
        CK(cudaStreamWaitEvent(s, ev[branches], 0));
    }
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t x;
    CK(cudaGraphInstantiate(&x, g, 0));
    CK(cudaGraphDestroy(g));
    return x;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 120, branches = argc > 2 ? atoi(argv[2]) : 4;
    int blocks = argc > 3 ? atoi(argv[3]) : 1;
    if (n < 2 || branches < 1 || branches > 15 || n < 2 * (branches + 1) || blocks < 1 || blocks > 65535) {
        fprintf(stderr, "usage: graph_gap [N >= 2 (BRANCHES + 1)] [BRANCHES 1..15] [BLOCKS 1..65535]\n");
        return 2;
    }
    int clk;
    CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0)); /* kHz */
    long long cyc = (long long)clk * 2 / 1000;                 /* about 2 us */
    cudaStream_t s, b;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    int *sink;
    CK(cudaMalloc(&sink, sizeof *sink));
    cudaEvent_t ev[16], t0, t1;
    for (int i = 0; i < 16; i++) CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    ncclComm_t comm;
    int dev = 0;
    NK(ncclCommInitAll(&comm, 1, &dev));
    float *buf;
    CK(cudaMalloc(&buf, 1024 * sizeof *buf));
    CK(cudaMemset(buf, 0, 1024 * sizeof *buf));
    const char *names[3] = {"linear", "fork/join", "fork/NCCL"};
    double base = 0;
    for (int sh = LINEAR; sh <= FORK_NCCL; sh++) {
        cudaGraphExec_t x = capture((enum shape)sh, n, branches, s, b, cyc, blocks, sink, ev, comm, buf);
        const int reps = 200;
        float ms = 0;
        for (int pass = 0; pass < 2; pass++) { /* the first pass warms up */
            CK(cudaEventRecord(t0, s));
            for (int r = 0; r < reps; r++) CK(cudaGraphLaunch(x, s));
            CK(cudaEventRecord(t1, s));
            CK(cudaEventSynchronize(t1));
            CK(cudaEventElapsedTime(&ms, t0, t1));
        }
        double us = 1000.0 * ms / reps;
        if (sh == LINEAR) base = us;
        printf("%-12s %d kernels in the chain: %8.2f us a replay, %+7.3f us a kernel against linear\n",
               names[sh], n, us, (us - base) / n);
        CK(cudaGraphExecDestroy(x));
    }
    NK(ncclCommDestroy(comm));
    return 0;
}
