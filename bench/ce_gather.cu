/* ce_gather.cu: what an all-gather beside GEMMs costs them, by NCCL's CTA policy. Two ranks (a
 * thread per GPU, one communicator each), every rank all-gathering MIB MiB of bf16 into one
 * buffer (in place, as a sharded optimizer's parameters are gathered) on a second stream while
 * its first stream runs a chain of cuBLAS bf16 GEMMs of a GPT block's shapes (2048 x 3072 x 768,
 * the MLP's up projection of gpt-768 at batch 8 x 256). Times, on rank 0, eagerly and as one
 * captured graph (fork, the gather beside the chain, join): the chain alone, the gather alone,
 * both, and the chain's own time when beside the gather. POLICY: 0 default, 1 efficiency
 * (fewest CTAs), 2 zero (copy engines where NCCL can: all-gathers into symmetric windows); SYM 1:
 * the buffer from ncclMemAlloc, registered as a symmetric window (ncclCommWindowRegister);
 * 0: cudaMalloc. A measurement tool for issue 15 (a zero-SM gather would let a sharded step
 * gather ahead of its forward without slowing the GEMMs: bench/RESULTS.md, session 31), not
 * part of the library.
 *
 *   nvcc -O2 -arch=sm_90 bench/ce_gather.cu -o ce_gather -lnccl -lcublas -lpthread
 *   NCCL_NVLS_ENABLE=0 ./ce_gather POLICY SYM [MIB=128] [GEMMS=60]
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "rank %d: %s:%d: %s: %s\n", r->rank, __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define NK(x) do { ncclResult_t n_ = (x); if (n_ != ncclSuccess) { \
    fprintf(stderr, "rank %d: %s:%d: %s: %s (%s)\n", r->rank, __FILE__, __LINE__, #x, ncclGetErrorString(n_), \
            ncclGetLastError(NULL)); exit(1); } } while (0)
#define BK(x) do { cublasStatus_t b_ = (x); if (b_ != CUBLAS_STATUS_SUCCESS) { \
    fprintf(stderr, "rank %d: %s:%d: %s: cuBLAS status %d\n", r->rank, __FILE__, __LINE__, #x, (int)b_); exit(1); } } while (0)

static int policy, sym, gemms;
static size_t bytes; /* the whole gathered buffer */
static ncclUniqueId id;
static pthread_barrier_t bar;

typedef struct rank_t {
    int rank;
    ncclComm_t comm;
    cudaStream_t comp, comm_s;
    cublasHandle_t blas;
    void *buf, *a, *b, *c;
    cudaEvent_t e0, e1, eg, fork, join;
} rank_t;

static const int M = 2048, N = 3072, K = 768;

static void chain(rank_t *r)
{
    const float one = 1.f, zero = 0.f;
    for (int i = 0; i < gemms; i++)
        BK(cublasGemmEx(r->blas, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, r->b, CUDA_R_16BF, N, r->a, CUDA_R_16BF, K,
                        &zero, r->c, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void gather(rank_t *r)
{
    size_t count = bytes / 2 / 2; /* bf16 elements a rank sends */
    char *recv = (char *)r->buf;
    NK(ncclAllGather(recv + (size_t)r->rank * count * 2, recv, count, ncclBfloat16, r->comm, r->comm_s));
}

/* what: 0 the chain alone, 1 the gather alone, 2 both. Returns ms of the whole, and in *chain_ms
 * the chain's own span (its stream's events) when it ran. */
static void run_eager(rank_t *r, int what, double *all_ms, double *chain_ms)
{
    CK(cudaEventRecord(r->e0, r->comp));
    CK(cudaStreamWaitEvent(r->comm_s, r->e0, 0));
    if (what != 0) gather(r);
    if (what != 1) chain(r);
    CK(cudaEventRecord(r->eg, r->comp));
    CK(cudaEventRecord(r->join, r->comm_s));
    CK(cudaStreamWaitEvent(r->comp, r->join, 0));
    CK(cudaEventRecord(r->e1, r->comp));
    CK(cudaEventSynchronize(r->e1));
    float a = 0, g = 0;
    CK(cudaEventElapsedTime(&a, r->e0, r->e1));
    CK(cudaEventElapsedTime(&g, r->e0, r->eg));
    *all_ms = a, *chain_ms = g;
}

static void *worker(void *p)
{
    rank_t *r = (rank_t *)p;
    CK(cudaSetDevice(r->rank));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.CTAPolicy = policy;
    NK(ncclCommInitRankConfig(&r->comm, 2, id, r->rank, &cfg));
    CK(cudaStreamCreateWithFlags(&r->comp, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&r->comm_s, cudaStreamNonBlocking));
    ncclWindow_t win = NULL;
    if (sym) {
        NK(ncclMemAlloc(&r->buf, bytes));
        NK(ncclCommWindowRegister(r->comm, r->buf, bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
    } else {
        CK(cudaMalloc(&r->buf, bytes));
    }
    CK(cudaMemset(r->buf, 1, bytes));
    CK(cudaMalloc(&r->a, (size_t)M * K * 2));
    CK(cudaMalloc(&r->b, (size_t)K * N * 2));
    CK(cudaMalloc(&r->c, (size_t)M * N * 2));
    CK(cudaMemset(r->a, 0, (size_t)M * K * 2));
    CK(cudaMemset(r->b, 0, (size_t)K * N * 2));
    BK(cublasCreate(&r->blas));
    BK(cublasSetStream(r->blas, r->comp));
    cudaEvent_t *evs[] = {&r->e0, &r->e1, &r->eg, &r->fork, &r->join};
    for (int i = 0; i < 5; i++) CK(cudaEventCreate(evs[i]));
    CK(cudaDeviceSynchronize());

    const char *names[3] = {"GEMM chain alone", "all-gather alone", "both"};
    double eager[3] = {0, 0, 0}, eager_chain = 0;
    for (int what = 0; what < 3; what++) {
        double a, g, sum = 0, sumg = 0;
        for (int it = 0; it < 13; it++) {
            pthread_barrier_wait(&bar);
            run_eager(r, what, &a, &g);
            if (it >= 3) sum += a, sumg += g;
        }
        eager[what] = sum / 10;
        if (what == 2) eager_chain = sumg / 10;
    }

    /* Captured: the same three, each one graph, replayed 10 times after 3. */
    double graph[3] = {0, 0, 0};
    for (int what = 0; what < 3; what++) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        pthread_barrier_wait(&bar);
        CK(cudaStreamBeginCapture(r->comp, cudaStreamCaptureModeThreadLocal));
        CK(cudaEventRecord(r->fork, r->comp));
        CK(cudaStreamWaitEvent(r->comm_s, r->fork, 0));
        if (what != 0) gather(r);
        if (what != 1) chain(r);
        CK(cudaEventRecord(r->join, r->comm_s));
        CK(cudaStreamWaitEvent(r->comp, r->join, 0));
        CK(cudaStreamEndCapture(r->comp, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        double sum = 0;
        for (int it = 0; it < 13; it++) {
            pthread_barrier_wait(&bar);
            CK(cudaEventRecord(r->e0, r->comp));
            CK(cudaGraphLaunch(ge, r->comp));
            CK(cudaEventRecord(r->e1, r->comp));
            CK(cudaEventSynchronize(r->e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, r->e0, r->e1));
            if (it >= 3) sum += ms;
        }
        graph[what] = sum / 10;
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    if (r->rank == 0) {
        printf("policy %d, %s buffer, %.0f MiB gathered, %d GEMMs of %dx%dx%d\n", policy,
               sym ? "ncclMemAlloc symmetric-window" : "cudaMalloc", bytes / 1048576.0, gemms, M, N, K);
        for (int w = 0; w < 3; w++) printf("  %-18s eager %8.3f ms   graph %8.3f ms\n", names[w], eager[w], graph[w]);
        printf("  chain beside the gather (eager): %.3f ms, %.1f%% slower than alone; both in %.3f ms against "
               "%.3f if they overlapped perfectly\n", eager_chain, 100.0 * (eager_chain / eager[0] - 1), eager[2],
               eager[0] > eager[1] ? eager[0] : eager[1]);
    }
    CK(cudaDeviceSynchronize());
    pthread_barrier_wait(&bar);
    if (sym) {
        NK(ncclCommWindowDeregister(r->comm, win));
        NK(ncclMemFree(r->buf));
    } else {
        CK(cudaFree(r->buf));
    }
    NK(ncclCommDestroy(r->comm));
    return NULL;
}

int main(int argc, char **argv)
{
    policy = argc > 1 ? atoi(argv[1]) : 0;
    sym = argc > 2 ? atoi(argv[2]) : 0;
    bytes = (size_t)(argc > 3 ? atof(argv[3]) : 128) * 1048576;
    bytes -= bytes % (2 * 4096); /* whole pages a rank */
    gemms = argc > 4 ? atoi(argv[4]) : 60;
    rank_t ranks[2] = {{0}, {0}};
    rank_t *r = &ranks[0];
    NK(ncclGetUniqueId(&id));
    pthread_barrier_init(&bar, NULL, 2);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        ranks[i].rank = i;
        pthread_create(&th[i], NULL, worker, &ranks[i]);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    return 0;
}
