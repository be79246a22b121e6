/* gemm_algos.cu: how much a measured choice among cuBLASLt's algorithms would gain over the
 * heuristic's first pick, on the matmuls of a GPT step (sg_linear's calls, bf16 operands, f32
 * accumulation, 32 MiB workspace, as src/ops/linear_cuda.cu makes them). For each matmul: the
 * heuristic's candidates (up to 16), each timed over many runs with events; prints the first
 * pick's time, the best one's, and the step's sum of each (weighted by calls per step).
 *
 *   nvcc -O2 -arch=sm_90 bench/gemm_algos.cu -lcublasLt -o gemm_algos
 *   ./gemm_algos [B*T tokens=2048] [width=768] [layers=12] [vocab=256]
 *
 * A measurement tool for issue 15, not part of the library. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#define LK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d cublas %d\n", __FILE__, __LINE__, (int)s_); exit(1); } } while (0)

typedef struct {
    const char *name;
    cublasOperation_t ta, tb;
    long m, n, k;
    cublasLtEpilogue_t epi;
    int calls; /* per step */
} mm;

static float time_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                       cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t *algo, void *A, void *B, void *D, void *ws,
                       size_t wsb, cudaStream_t s, int reps)
{
    const float one = 1.f, zero = 0.f;
    for (int i = 0; i < 5; i++)
        if (cublasLtMatmul(lt, desc, &one, A, a, B, b, &zero, D, d, D, d, algo, ws, wsb, s) != CUBLAS_STATUS_SUCCESS)
            return -1.f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int r = 0; r < 5; r++) { /* best of 5 batches of reps: noise from clocks */
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < reps; i++) LK(cublasLtMatmul(lt, desc, &one, A, a, B, b, &zero, D, d, D, d, algo, ws, wsb, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms / reps < best) best = ms / reps;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return best * 1000.f; /* us */
}

int main(int argc, char **argv)
{
    long M = argc > 1 ? atol(argv[1]) : 2048, C = argc > 2 ? atol(argv[2]) : 768;
    int L = argc > 3 ? atoi(argv[3]) : 12;
    long V = argc > 4 ? atol(argv[4]) : 256;
    /* Row-major y(M,N) = x(M,K) W(N,K)^T: forward (T,N, m=N, n=M, k=K); dw (N,T, m=K, n=N, k=M);
     * dx (N,N, m=K, n=M, k=N). */
    const long N[5] = {3 * C, C, 4 * C, C, V}, K[5] = {C, C, C, 4 * C, C};
    const char *names[5] = {"qkv", "attn.proj", "fc", "mlp.proj", "head"};
    const cublasLtEpilogue_t fwd_epi[5] = {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                                           CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_DEFAULT};
    mm list[15];
    int nl = 0;
    for (int i = 0; i < 5; i++) {
        int calls = i == 4 ? 1 : L;
        list[nl++] = (mm){names[i], CUBLAS_OP_T, CUBLAS_OP_N, N[i], M, K[i], fwd_epi[i], calls};
        list[nl++] = (mm){names[i], CUBLAS_OP_N, CUBLAS_OP_T, K[i], N[i], M, CUBLASLT_EPILOGUE_DEFAULT, calls};
        list[nl++] = (mm){names[i], CUBLAS_OP_N, CUBLAS_OP_N, K[i], M, N[i], CUBLASLT_EPILOGUE_DEFAULT, calls};
    }
    const char *what[3] = {"fwd", "dw", "dx"};
    cublasLtHandle_t lt;
    LK(cublasLtCreate(&lt));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    size_t wsb = (size_t)32 << 20, big = (size_t)64 << 20;
    void *ws, *A, *B, *D, *bias, *aux;
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMalloc(&A, big));
    CK(cudaMalloc(&B, big));
    CK(cudaMalloc(&D, big));
    CK(cudaMalloc(&bias, 1 << 20));
    CK(cudaMalloc(&aux, big));
    CK(cudaMemset(A, 0x3c, big)); /* bf16 ~0.0115: finite values */
    CK(cudaMemset(B, 0x3c, big));
    CK(cudaMemset(bias, 0, 1 << 20));
    double sum_first = 0, sum_best = 0;
    printf("%-10s %-4s %6s %6s %6s %-13s %5s %9s %9s %5s %7s\n", "matmul", "pass", "m", "n", "k", "epilogue", "algos",
           "first_us", "best_us", "best", "TFLOP/s");
    for (int i = 0; i < nl; i++) {
        mm *p = &list[i];
        cublasLtMatmulDesc_t desc;
        LK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &p->ta, sizeof p->ta));
        LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &p->tb, sizeof p->tb));
        LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p->epi, sizeof p->epi));
        if (p->epi != CUBLASLT_EPILOGUE_DEFAULT) {
            int32_t bt = CUDA_R_16BF;
            LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
            LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        }
        if (p->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
            int64_t ld = p->m;
            LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
            LK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
        }
        long ar = p->ta == CUBLAS_OP_N ? p->m : p->k, ac = p->ta == CUBLAS_OP_N ? p->k : p->m;
        long br = p->tb == CUBLAS_OP_N ? p->k : p->n, bc = p->tb == CUBLAS_OP_N ? p->n : p->k;
        cublasLtMatrixLayout_t a, b, d;
        LK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, ar, ac, ar));
        LK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, br, bc, br));
        LK(cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, p->m, p->n, p->m));
        cublasLtMatmulPreference_t pref;
        LK(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t w = wsb;
        LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w, sizeof w));
        cublasLtMatmulHeuristicResult_t r[16];
        int found = 0;
        LK(cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, d, d, pref, 16, r, &found));
        float first = -1, best = 1e30f;
        int bi = -1;
        for (int j = 0; j < found; j++) {
            if (r[j].state != CUBLAS_STATUS_SUCCESS) continue;
            float us = time_algo(lt, desc, a, b, d, &r[j].algo, A, B, D, ws, wsb, s, 50);
            if (us < 0) continue;
            if (j == 0) first = us;
            if (us < best) best = us, bi = j;
        }
        double fl = 2.0 * p->m * p->n * p->k;
        printf("%-10s %-4s %6ld %6ld %6ld %-13d %5d %9.2f %9.2f %5d %7.0f\n", p->name, what[i % 3], p->m, p->n, p->k,
               (int)p->epi, found, first, best, bi, fl / (best * 1e-6) / 1e12);
        sum_first += first * p->calls;
        sum_best += best * p->calls;
        LK(cublasLtMatmulPreferenceDestroy(pref));
        LK(cublasLtMatrixLayoutDestroy(a));
        LK(cublasLtMatrixLayoutDestroy(b));
        LK(cublasLtMatrixLayoutDestroy(d));
        LK(cublasLtMatmulDescDestroy(desc));
    }
    printf("step (M=%ld C=%ld L=%d V=%ld): heuristic first %.3f ms, best measured %.3f ms (%.1f%% less)\n", M, C, L, V,
           sum_first / 1000, sum_best / 1000, 100 * (1 - sum_best / sum_first));
    return 0;
}
