/* graph_gap.cu: what a CUDA graph's shape costs between its kernels. Captures a chain of N
 * short kernels on one stream (each block spins for about 2 us); the same chain with a second
 * stream forked from it and joined back, BRANCHES times, a short kernel on each branch; and the
 * same fork/join with an NCCL all-reduce on each branch instead, as data parallelism's buckets
 * are: in place, 1024 bf16; and out of place, 1 MiB, from a high-priority stream into a graph
 * instantiated with node priorities, as stepgraph's (a communicator of one rank, non-blocking,
 * as stepgraph makes it). Prints each graph's kernel nodes. Each for seven chains: plain kernels,
 * kernels in thread-block clusters of 2, kernels alternating between no shared memory and
 * 160 KiB, the same alternation with every kernel asking for the largest shared-memory
 * carveout (so that the SM need not be reconfigured between them), 16 distinct kernels in
 * turn, kernels that each store 4 MiB before they spin, and cuBLAS bf16 GEMMs (1024 cubed)
 * alternating with the plain spin. Replays each graph 200 times and
 * prints us a replay and the difference a kernel of the chain against the linear graph of the
 * same chain. Standalone:
 *
 *   nvcc -O2 -arch=sm_90 bench/graph_gap.cu -o graph_gap -lnccl -lcublas
 *   ./graph_gap [N] [BRANCHES] [BLOCKS] [FIRST]   (default 120 kernels, 4 branches, 2 blocks of
 *   128; FIRST: the first chain run, 0 to 6, default 0)
 *
 * A measurement tool for issue 15, not part of the library; what it showed is in
 * bench/RESULTS.md (session 29). */
#include <cublas_v2.h>
#include <cuda_bf16.h>
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

/* The same, holding SMEM_BIG bytes of dynamic shared memory: alternated with spin, each kernel
 * asks the SM for another shared-memory carveout, as a GEMM after an elementwise kernel does. */
#define SMEM_BIG (160 << 10)
__global__ void spin_smem(long long cycles, int *sink)
{
    extern __shared__ int sm[];
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    if (threadIdx.x == 0 && cycles < 0) *sink = sm[0];
}

/* The same spin as 16 distinct kernels (the real step's chain has about 40 different ones). */
template <int K>
__global__ void spin_k(long long cycles, int *sink)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    if (threadIdx.x == 0 && cycles < 0) *sink = K;
}
typedef void (*spin_fn)(long long, int *);
static const spin_fn distinct[16] = {spin_k<0>, spin_k<1>, spin_k<2>,  spin_k<3>,  spin_k<4>,  spin_k<5>,
                                     spin_k<6>, spin_k<7>, spin_k<8>,  spin_k<9>,  spin_k<10>, spin_k<11>,
                                     spin_k<12>, spin_k<13>, spin_k<14>, spin_k<15>};

/* Each kernel stores WRITE_BYTES (the whole grid, int4 stores) before it spins: the real step's
 * kernels write megabytes, which a kernel's completion must make visible to the next (across
 * streams, perhaps at more cost than within one). */
#define WRITE_BYTES (4 << 20)
__global__ void spin_write(long long cycles, int4 *out)
{
    size_t n = WRITE_BYTES / sizeof(int4);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = make_int4((int)i, 1, 2, 3);
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}

/* How the chain's kernels are launched. */
enum chain { PLAIN, CLUSTER, SMEM_MIX, SMEM_FIXED, DISTINCT, WRITES, GEMMS };

/* The GEMMS chain: cuBLAS bf16 GEMMs (GEMM_N cubed, f32 accumulation) alternating with the
 * plain spin, as the real step's chain alternates cuBLAS's kernels with its own. */
#define GEMM_N 1024
static cublasHandle_t blas;
static __nv_bfloat16 *ga, *gb, *gc;

static void *wbuf; /* WRITE_BYTES, for the WRITES chain */

static void launch(enum chain c, int i, int blocks, cudaStream_t s, long long cyc, int *sink)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3((unsigned)blocks);
    cfg.blockDim = dim3(128);
    cfg.stream = s;
    if (c == CLUSTER) { /* thread-block clusters of 2, as cuBLASLt's sm_90 kernels launch */
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 2, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr, cfg.numAttrs = 1;
    }
    if (c == SMEM_FIXED) { /* the same alternation, every kernel asking for the most shared memory */
        attr[0].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
        attr[0].val.sharedMemCarveout = 100;
        cfg.attrs = attr, cfg.numAttrs = 1;
    }
    if ((c == SMEM_MIX || c == SMEM_FIXED) && i % 2) {
        cfg.dynamicSmemBytes = SMEM_BIG;
        CK(cudaLaunchKernelEx(&cfg, spin_smem, cyc, sink));
    } else if (c == DISTINCT) {
        CK(cudaLaunchKernelEx(&cfg, distinct[i % 16], cyc, sink));
    } else if (c == WRITES) {
        CK(cudaLaunchKernelEx(&cfg, spin_write, cyc, (int4 *)wbuf));
    } else if (c == GEMMS && i % 2) {
        const float one = 1, zero = 0;
        if (cublasSetStream(blas, s) != CUBLAS_STATUS_SUCCESS ||
            cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, GEMM_N, GEMM_N, GEMM_N, &one, ga, CUDA_R_16BF, GEMM_N, gb,
                         CUDA_R_16BF, GEMM_N, &zero, gc, CUDA_R_16BF, GEMM_N, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cublasGemmEx failed\n");
            exit(1);
        }
    } else {
        CK(cudaLaunchKernelEx(&cfg, spin, cyc, sink));
    }
}

#define BIG_ELEMS (512 << 10) /* bf16: 1 MiB, out of place */
#define NK(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r_)); exit(1); } } while (0)

enum shape { LINEAR, FORK, FORK_NCCL, FORK_NCCL_OUT };

static int kernel_nodes; /* in the last graph captured */

static cudaGraphExec_t capture(enum chain c, enum shape sh, int n, int branches, cudaStream_t s,
                               cudaStream_t b, long long cyc, int blocks, int *sink, cudaEvent_t *ev,
                               ncclComm_t comm, void *buf, cudaStream_t hb, void *big, void *big_out)
{
    if (sh == FORK_NCCL_OUT) b = hb;
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    int every = n / (branches + 1);
    for (int i = 0; i < n; i++) {
        launch(c, i, blocks, s, cyc, sink);
        if (sh != LINEAR && i > 0 && i % every == 0 && i / every <= branches) {
            int k = i / every - 1;
            CK(cudaEventRecord(ev[k], s));
            CK(cudaStreamWaitEvent(b, ev[k], 0));
            if (sh == FORK) spin<<<blocks, 128, 0, b>>>(cyc, sink);
            else {
                ncclResult_t r = sh == FORK_NCCL ? ncclAllReduce(buf, buf, 1024, ncclBfloat16, ncclAvg, comm, b)
                                                 : ncclAllReduce(big, big_out, BIG_ELEMS, ncclBfloat16, ncclAvg,
                                                                 comm, b);
                while (r == ncclInProgress) NK(ncclCommGetAsyncError(comm, &r)); /* a non-blocking comm */
                NK(r);
            }
        }
    }
    if (sh != LINEAR) {
        CK(cudaEventRecord(ev[branches], b));
        CK(cudaStreamWaitEvent(s, ev[branches], 0));
    }
    CK(cudaStreamEndCapture(s, &g));
    size_t nn = 0;
    CK(cudaGraphGetNodes(g, NULL, &nn));
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(nn * sizeof *nodes);
    CK(cudaGraphGetNodes(g, nodes, &nn));
    kernel_nodes = 0;
    for (size_t i = 0; i < nn; i++) {
        cudaGraphNodeType t;
        CK(cudaGraphNodeGetType(nodes[i], &t));
        kernel_nodes += t == cudaGraphNodeTypeKernel;
    }
    free(nodes);
    cudaGraphExec_t x;
    /* As stepgraph instantiates: kernel nodes keep their stream's priority. */
    CK(cudaGraphInstantiate(&x, g, sh == FORK_NCCL_OUT ? cudaGraphInstantiateFlagUseNodePriority : 0));
    CK(cudaGraphDestroy(g));
    return x;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 120, branches = argc > 2 ? atoi(argv[2]) : 4;
    int blocks = argc > 3 ? atoi(argv[3]) : 2;
    if (n < 2 || branches < 1 || branches > 15 || n < 2 * (branches + 1) || blocks < 2 || blocks > 65534 ||
        blocks % 2) {
        fprintf(stderr, "usage: graph_gap [N >= 2 (BRANCHES + 1)] [BRANCHES 1..15] [BLOCKS, even]\n");
        return 2;
    }
    int clk;
    CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0)); /* kHz */
    long long cyc = (long long)clk * 2 / 1000;                 /* about 2 us */
    cudaStream_t s, b;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t hb; /* as stepgraph's collectives: a high-priority stream */
    CK(cudaStreamCreateWithPriority(&hb, cudaStreamNonBlocking, hi));
    void *big, *big_out;
    CK(cudaMalloc(&big, BIG_ELEMS * 2));
    CK(cudaMalloc(&big_out, BIG_ELEMS * 2));
    CK(cudaMemset(big, 0, BIG_ELEMS * 2));
    int *sink;
    CK(cudaMalloc(&sink, sizeof *sink));
    cudaEvent_t ev[16], t0, t1;
    for (int i = 0; i < 16; i++) CK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    /* A communicator of one rank made as stepgraph makes its own: non-blocking, polled. */
    ncclComm_t comm;
    ncclUniqueId id;
    NK(ncclGetUniqueId(&id));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t ir = ncclCommInitRankConfig(&comm, 1, id, 0, &cfg);
    if (ir != ncclInProgress) NK(ir);
    do NK(ncclCommGetAsyncError(comm, &ir)); while (ir == ncclInProgress);
    NK(ir);
    void *buf;
    CK(cudaMalloc(&buf, 4096));
    CK(cudaMemset(buf, 0, 4096));
    CK(cudaFuncSetAttribute(spin_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BIG));
    const char *names[4] = {"linear", "fork/join", "fork/NCCL", "NCCL 1 MiB"};
    CK(cudaMalloc(&wbuf, WRITE_BYTES));
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    void *ws;
    CK(cudaMalloc(&ws, 32 << 20));
    CK(cudaMalloc(&ga, 2 * GEMM_N * GEMM_N));
    CK(cudaMalloc(&gb, 2 * GEMM_N * GEMM_N));
    CK(cudaMalloc(&gc, 2 * GEMM_N * GEMM_N));
    CK(cudaMemset(ga, 0, 2 * GEMM_N * GEMM_N));
    CK(cudaMemset(gb, 0, 2 * GEMM_N * GEMM_N));
    if (cublasSetWorkspace(blas, ws, 32 << 20) != CUBLAS_STATUS_SUCCESS) { /* capture needs its own workspace */
        fprintf(stderr, "cublasSetWorkspace failed\n");
        return 1;
    }
    const char *chains[7] = {"plain", "clusters of 2", "smem carveouts", "carveout fixed", "16 kernels", "4 MiB writes",
                             "cuBLAS GEMMs"};
    int first = argc > 4 ? atoi(argv[4]) : PLAIN;
    for (int c = first; c <= GEMMS; c++) {
        double base = 0;
        for (int sh = LINEAR; sh <= FORK_NCCL_OUT; sh++) {
            cudaGraphExec_t x = capture((enum chain)c, (enum shape)sh, n, branches, s, b, cyc, blocks, sink, ev,
                                        comm, buf, hb, big, big_out);
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
            printf("%-15s %-10s %d kernels in the chain, %3d kernel nodes: %8.2f us a replay, %+7.3f us a kernel "
                   "against linear\n", chains[c], names[sh], n, kernel_nodes, us, (us - base) / n);
            CK(cudaGraphExecDestroy(x));
        }
    }
    NK(ncclCommDestroy(comm));
    CK(cudaFree(wbuf));
    cublasDestroy(blas);
    return 0;
}
