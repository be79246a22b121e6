/* linear_cuda.cu: the linear layer on the GPU, f32, or bf16 for mixed precision (every tensor
 * of a call bf16, as PyTorch's autocast: bf16 operands, f32 accumulation and compute type
 * CUBLAS_COMPUTE_32F, f32 alpha/beta, each output rounded once to bf16). Forward: one
 * cublasLtMatmul whose epilogue adds the bias and applies ReLU or GELU (keeping pre in the aux
 * buffer); where that epilogue cannot run (see sg_linear_forward_cuda), a plain matmul and one
 * bias+act kernel. Backward: one kernel (d(pre) = dy * act'(act_in) in place, and db as a
 * deterministic column sum in f32), then cublasLtMatmul for dw and for dx (STEPGRAPH_BGRAD=1:
 * cuBLASLt's BGRADB and DGELU_BGRAD epilogues instead, measured slower; see below). Matmul plans
 * (descriptor, layouts, algorithm) are cached per shape and dtype in the context (ext slot
 * SG_EXT_LINEAR), so a call costs a lookup, at most two pointer attributes and the launch.
 * With sg_ctx_gemm_tune (opt-in), a plan's first call outside a capture times the heuristic's
 * candidates first and keeps the fastest (see plan_tune).
 *
 * A forward of one row (a batch-1 decode step's) runs stepgraph's own GEMV kernel
 * instead, with the bias and activation in it (see "skinny forward" below).
 *
 * Row-major tensors are column-major transposes: a row-major (R,C) matrix is, to cuBLASLt,
 * a column-major C x R matrix with leading dimension C. Every matmul below is written in
 * column-major terms D(m x n) = op(A)(m x k) op(B)(k x n), all layouts packed. */
#include "ops/act.h"
#include "ops/decode.h"
#include "ops/linear.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include "ops/dtype_cuda.cuh"

/* ---- plan cache ---- */

/* What a plan depends on. Alignments (of A, B, D, bias, aux, and C where it is not D; lowest
 * set bit of the address, capped at 256; 0 for an operand not there) are part of the key: the
 * heuristic picks algorithms that need them. dtype: the sg_dtype of every operand (F32 or
 * BF16). */
typedef struct lin_key {
    uint64_t m, n, k;
    int32_t transa, transb, epilogue, dtype;
    uint32_t align[6];
} lin_key;

typedef struct lin_plan {
    lin_key key;
    bool ok;        /* false: the heuristic has no algorithm for this key (remembered) */
    int heuristic;  /* the heuristic's cuBLAS status, for the message when !ok */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d; /* C has D's layout (D itself with beta 0) */
    cublasLtMatmulAlgo_t algo;
    /* sg_ctx_gemm_tune: the heuristic's candidates (cand[0] is algo as the heuristic chose it),
     * until the plan's first call times them; freed then, so NULL once algo is final. */
    cublasLtMatmulAlgo_t *cand;
    int ncand;
} lin_plan;

typedef struct lin_cache {
    lin_plan *plans;
    int n, cap;
    int timed, switched; /* plans whose candidates were timed, and of those, those that changed */
} lin_cache;

/* Makes p's algorithm final: the candidates, if any are left, are dropped. */
static void plan_settle(lin_plan *p)
{
    free(p->cand);
    p->cand = NULL;
    p->ncand = 0;
}

static void plan_release(lin_plan *p)
{
    /* Destroy calls on a teardown path: nothing useful to do with a failure. */
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->d) cublasLtMatrixLayoutDestroy(p->d);
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    p->a = p->b = p->d = NULL;
    p->desc = NULL;
    plan_settle(p);
}

static void cache_free(sg_ctx *ctx, void *ext)
{
    lin_cache *c = (lin_cache *)ext;
    for (int i = 0; i < c->n; i++) plan_release(&c->plans[i]);
    free(c->plans);
    free(c);
}

static uint32_t align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t r = 256;
    while (r > 2 && (a & (r - 1))) r >>= 1; /* 2: a bf16 view may start at any element */
    return r;
}

static const char *epilogue_name(int e)
{
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_RELU: return "RELU";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
    }
    return "?";
}

/* The CUDA type of an operand of dtype dt (F32 or BF16: linear.c admits nothing else). */
static cudaDataType_t cuda_type(int32_t dt)
{
    return dt == SG_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* Creates p's descriptor and layouts for p->key and asks the heuristic for one algorithm
 * that fits the context's workspace. bias and aux are this call's pointers: the heuristic
 * reads their alignment from them. On error the caller releases p. */
static sg_status plan_build(sg_ctx *ctx, lin_plan *p, const void *bias, const void *aux)
{
    const lin_key *k = &p->key;
    cublasLtHandle_t lt = (cublasLtHandle_t)sg_ctx_cublaslt(ctx);
    cublasOperation_t ta = (cublasOperation_t)k->transa, tb = (cublasOperation_t)k->transb;
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)k->epilogue;
    const cudaDataType_t type = cuda_type(k->dtype);

    /* fp32 accumulation (CUBLAS_COMPUTE_32F) and f32 alpha/beta for both dtypes; not TF32
     * unless the context asks (sg_ctx_tf32: f32 inputs rounded to TF32 on the tensor cores):
     * f32 results match PyTorch with TF32 off (or on), bf16 ones PyTorch's autocast. */
    const cublasComputeType_t compute =
        k->dtype == SG_DTYPE_F32 && sg_ctx_tf32(ctx) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    SG_CUBLAS_CHECK(ctx, cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
    SG_CUBLAS_CHECK(ctx, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &ta, sizeof ta));
    SG_CUBLAS_CHECK(ctx, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &tb, sizeof tb));
    SG_CUBLAS_CHECK(ctx, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                        &epi, sizeof epi));
    /* bf16 with a bias epilogue: the bias is bf16 too (said explicitly; it is also the
     * default, D's type). The GELU aux (pre) keeps the default type, D's (bf16): cuBLASLt
     * takes another aux type only for fp8 kernels. f32 plans set neither, as before. */
    if (k->dtype == SG_DTYPE_BF16 && bias) {
        int32_t bias_type = CUDA_R_16BF;
        SG_CUBLAS_CHECK(ctx, cublasLtMatmulDescSetAttribute(
                                 p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                 sizeof bias_type));
    }
    if (bias)
        SG_CUBLAS_CHECK(ctx, cublasLtMatmulDescSetAttribute(
                                 p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux) {
        int64_t ld = (int64_t)k->m; /* aux is D-shaped: m x n, packed */
        SG_CUBLAS_CHECK(ctx, cublasLtMatmulDescSetAttribute(
                                 p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                 sizeof aux));
        SG_CUBLAS_CHECK(ctx, cublasLtMatmulDescSetAttribute(
                                 p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    /* Stored shapes (before op): A is m x k, or k x m when transposed; B is k x n, or n x k. */
    uint64_t ar = ta == CUBLAS_OP_N ? k->m : k->k, ac = ta == CUBLAS_OP_N ? k->k : k->m;
    uint64_t br = tb == CUBLAS_OP_N ? k->k : k->n, bc = tb == CUBLAS_OP_N ? k->n : k->k;
    SG_CUBLAS_CHECK(ctx, cublasLtMatrixLayoutCreate(&p->a, type, ar, ac, (int64_t)ar));
    SG_CUBLAS_CHECK(ctx, cublasLtMatrixLayoutCreate(&p->b, type, br, bc, (int64_t)br));
    SG_CUBLAS_CHECK(ctx, cublasLtMatrixLayoutCreate(&p->d, type, k->m, k->n, (int64_t)k->m));

    /* The preference lives only here; its status is checked after it is destroyed. */
    size_t ws_bytes = 0;
    sg_ctx_workspace(ctx, &ws_bytes);
    uint64_t ws = ws_bytes;
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t align_val[4] = {k->align[0], k->align[1], k->align[5] ? k->align[5] : k->align[2], k->align[2]};
    cublasLtMatmulPreference_t pref;
    SG_CUBLAS_CHECK(ctx, cublasLtMatmulPreferenceCreate(&pref));
    const char *what = "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)";
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++) {
        what = "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_*_BYTES)";
        s = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align_val[i],
                                                 sizeof align_val[i]);
    }
    /* One result, or with sg_ctx_gemm_tune that many (the first is the same either way: the
     * heuristic's ranking). */
    const int want = sg_ctx_gemm_tune(ctx) > 1 ? sg_ctx_gemm_tune(ctx) : 1;
    cublasLtMatmulHeuristicResult_t rs[SG_GEMM_TUNE_MAX];
    memset(rs, 0, sizeof rs);
    const cublasLtMatmulHeuristicResult_t &r = rs[0];
    int found = 0;
    cublasStatus_t hs = CUBLAS_STATUS_SUCCESS;
    if (s == CUBLAS_STATUS_SUCCESS)
        hs = cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->a, p->b, p->d, p->d, pref, want, rs,
                                            &found);
    SG_CUBLAS_CHECK(ctx, cublasLtMatmulPreferenceDestroy(pref));
    if (s != CUBLAS_STATUS_SUCCESS) return sg_cublas_status(ctx, (int)s, what, __FILE__, __LINE__);
    /* Any refusal of the heuristic (NOT_SUPPORTED, or INVALID_VALUE for an epilogue this shape
     * cannot take) means "no algorithm": the caller falls back to an unfused epilogue or
     * fails naming the shape. It is remembered, so the heuristic is not asked again. */
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0 || r.state != CUBLAS_STATUS_SUCCESS) {
        p->ok = false;
        p->heuristic = hs != CUBLAS_STATUS_SUCCESS ? (int)hs : (int)r.state;
        plan_release(p);
        return SG_OK;
    }
    p->algo = r.algo;
    p->ok = true;
    /* Candidates to time: the heuristic's first, then every other it offered. Without host
     * memory for them the plan just keeps the first. */
    if (want > 1 && found > 1 && (p->cand = (cublasLtMatmulAlgo_t *)malloc((size_t)found * sizeof *p->cand)))
        for (int i = 0; i < found; i++)
            if (rs[i].state == CUBLAS_STATUS_SUCCESS) p->cand[p->ncand++] = rs[i].algo;
    if (p->ncand < 2) plan_settle(p); /* nothing to choose between */
    return SG_OK;
}

#define TUNE_ROUNDS 5     /* timed rounds, every candidate once a round (drift hits them alike) */
#define TUNE_CALLS 4      /* calls a timing */
#define TUNE_MARGIN 0.97 /* a candidate replaces the heuristic's first from 3% faster */

/* sg_ctx_gemm_tune: times p's candidates on this call's operands, on stream st, and settles
 * p->algo. Each candidate runs twice to warm up (one cuBLASLt refuses is dropped), then
 * TUNE_ROUNDS rounds time TUNE_CALLS calls of each in turn; a candidate's time is the median of
 * its rounds. The fastest replaces the heuristic's first only when at most TUNE_MARGIN of it,
 * so that noise between near-equal kernels does not decide. The calls write D (and the aux
 * output), which the call that follows writes again; C is read, so C may not be D (the caller
 * settles such a plan untimed). Waits for the stream (outside a capture only). */
static sg_status plan_tune(sg_ctx *ctx, lin_plan *p, const void *A, const void *B, const void *C, void *D,
                           void *ws, size_t ws_bytes, cudaStream_t st)
{
    cublasLtHandle_t lt = (cublasLtHandle_t)sg_ctx_cublaslt(ctx);
    const float one = 1.f, beta = C ? 1.f : 0.f;
    const int nc = p->ncand;
    bool ok[SG_GEMM_TUNE_MAX];
    double t[SG_GEMM_TUNE_MAX][TUNE_ROUNDS];
    for (int c = 0; c < nc; c++) {
        ok[c] = true;
        for (int w = 0; w < 2 && ok[c]; w++)
            ok[c] = cublasLtMatmul(lt, p->desc, &one, A, p->a, B, p->b, &beta, C ? C : D, p->d, D, p->d,
                                   &p->cand[c], ws, ws_bytes, st) == CUBLAS_STATUS_SUCCESS;
    }
    cudaEvent_t e0 = NULL, e1 = NULL;
    sg_status s = SG_OK;
    int best = 0;
#define TUNE_CHECK(call)                                                                      \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            s = sg_cuda_status(ctx, (int)e_, #call, __FILE__, __LINE__);                      \
            goto out;                                                                         \
        }                                                                                     \
    } while (0)
    TUNE_CHECK(cudaEventCreate(&e0));
    TUNE_CHECK(cudaEventCreate(&e1));
    for (int r = 0; r < TUNE_ROUNDS; r++)
        for (int c = 0; c < nc; c++) {
            if (!ok[c]) continue;
            TUNE_CHECK(cudaEventRecord(e0, st));
            for (int i = 0; i < TUNE_CALLS && ok[c]; i++)
                ok[c] = cublasLtMatmul(lt, p->desc, &one, A, p->a, B, p->b, &beta, C ? C : D, p->d, D, p->d,
                                       &p->cand[c], ws, ws_bytes, st) == CUBLAS_STATUS_SUCCESS;
            TUNE_CHECK(cudaEventRecord(e1, st));
            TUNE_CHECK(cudaEventSynchronize(e1));
            float ms = 0.f;
            TUNE_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            t[c][r] = ms / TUNE_CALLS;
        }
    {
        double med[SG_GEMM_TUNE_MAX];
        for (int c = 0; c < nc; c++)
            if (ok[c]) med[c] = sg_median(t[c], TUNE_ROUNDS);
        if (ok[0])
            for (int c = 1; c < nc; c++)
                if (ok[c] && med[c] <= TUNE_MARGIN * med[0] && med[c] < med[best]) best = c;
    }
#undef TUNE_CHECK
out:
    /* Destroy calls on a cleanup path: their failure changes nothing above. */
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s == SG_OK) {
        p->algo = p->cand[best];
        lin_cache *cache = (lin_cache *)sg_ctx_ext(ctx, SG_EXT_LINEAR);
        cache->timed++;
        cache->switched += best != 0;
    }
    plan_settle(p);
    return s;
}

extern "C" void sg_linear_tune_counts(sg_ctx *ctx, int *timed, int *switched)
{
    const lin_cache *c = (const lin_cache *)sg_ctx_ext(ctx, SG_EXT_LINEAR);
    *timed = c ? c->timed : 0;
    *switched = c ? c->switched : 0;
}

/* The plan for key: from the cache, or built (and cached) now. */
static sg_status plan_get(sg_ctx *ctx, const lin_key *key, const void *bias, const void *aux,
                          lin_plan **out)
{
    lin_cache *c = (lin_cache *)sg_ctx_ext(ctx, SG_EXT_LINEAR);
    if (!c) {
        c = (lin_cache *)calloc(1, sizeof *c);
        if (!c) return sg_fail(ctx, SG_ERR_OOM, "sg_linear: out of host memory for the plan cache");
        sg_ctx_set_ext(ctx, SG_EXT_LINEAR, c, cache_free);
    }
    for (int i = 0; i < c->n; i++)
        if (!memcmp(&c->plans[i].key, key, sizeof *key)) {
            *out = &c->plans[i];
            return SG_OK;
        }
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        lin_plan *np = (lin_plan *)realloc(c->plans, (size_t)cap * sizeof *np);
        if (!np)
            return sg_fail(ctx, SG_ERR_OOM, "sg_linear: out of host memory for the plan cache");
        c->plans = np;
        c->cap = cap;
    }
    lin_plan p;
    memset(&p, 0, sizeof p);
    p.key = *key;
    sg_status st = plan_build(ctx, &p, bias, aux);
    if (st != SG_OK) {
        plan_release(&p);
        return st;
    }
    c->plans[c->n] = p;
    *out = &c->plans[c->n++];
    return SG_OK;
}

/* D(m x n) = op(A) op(B) (+ C, m x n like D, where C is not NULL: beta 1; C may be D) with
 * epilogue epi (bias: m elements; aux: m x n, packed), all column-major and packed, every
 * operand of dtype dt (F32 or BF16), on the context's stream or (side) its second stream with
 * that stream's workspace. When the heuristic has no algorithm: with `optional`, *ran is false
 * and nothing runs; otherwise it fails with SG_ERR_CUBLAS naming the dtype and shape. */
static sg_status matmul_on(sg_ctx *ctx, bool side, const char *fn, sg_dtype dt, cublasOperation_t transa,
                           cublasOperation_t transb, int64_t m, int64_t n, int64_t k, cublasLtEpilogue_t epi,
                           const void *A, const void *B, const void *C, void *D, const void *bias, void *aux,
                           bool optional, bool *ran)
{
    lin_key key;
    memset(&key, 0, sizeof key); /* keys are compared bytewise */
    key.m = (uint64_t)m;
    key.n = (uint64_t)n;
    key.k = (uint64_t)k;
    key.transa = (int32_t)transa;
    key.transb = (int32_t)transb;
    key.epilogue = (int32_t)epi;
    key.dtype = (int32_t)dt;
    key.align[0] = align_of(A);
    key.align[1] = align_of(B);
    key.align[2] = align_of(D);
    key.align[3] = bias ? align_of(bias) : 0;
    key.align[4] = aux ? align_of(aux) : 0;
    key.align[5] = C ? align_of(C) : 0;
    lin_plan *p;
    SG_TRY(plan_get(ctx, &key, bias, aux, &p));
    *ran = false;
    if (!p->ok) {
        if (optional) return SG_OK;
        size_t ws_bytes = 0;
        sg_ctx_workspace(ctx, &ws_bytes);
        return sg_fail(ctx, SG_ERR_CUBLAS,
                       "%s: cuBLASLt has no %s algorithm for D(%lld x %lld) = op%s(A) op%s(B)%s "
                       "with k = %lld, epilogue %s, alignments A %u B %u D %u bias %u aux %u C %u "
                       "bytes, workspace limit %zu bytes (heuristic status %d)",
                       fn, sg_dtype_name(dt), (long long)m, (long long)n,
                       transa == CUBLAS_OP_T ? "T" : "N", transb == CUBLAS_OP_T ? "T" : "N", C ? " + C" : "",
                       (long long)k, epilogue_name(epi), key.align[0], key.align[1], key.align[2],
                       key.align[3], key.align[4], key.align[5], ws_bytes, p->heuristic);
    }
    if (bias)
        SG_CUBLAS_CHECK(ctx, cublasLtMatmulDescSetAttribute(
                                 p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux)
        SG_CUBLAS_CHECK(ctx, cublasLtMatmulDescSetAttribute(
                                 p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                 sizeof aux));
    size_t ws_bytes = 0;
    void *ws = sg_ctx_workspace(ctx, &ws_bytes);
    if (side) ws = sg_ctx_side_workspace(ctx); /* the same size; NULL when the size is 0 */
    cudaStream_t st = (cudaStream_t)(side ? sg_ctx_side_stream(ctx) : sg_ctx_stream(ctx));
    if (p->cand) {
        /* The first call settles the plan: timed outside a capture (the library's or the
         * caller's own on this stream) unless C is D; the heuristic's first otherwise. */
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        SG_CUDA_CHECK(ctx, cudaStreamIsCapturing(st, &cs));
        if (!sg_ctx_capturing(ctx) && cs == cudaStreamCaptureStatusNone && C != D) {
            SG_TRY(plan_tune(ctx, p, A, B, C, D, ws, ws_bytes, st));
        } else {
            plan_settle(p);
        }
    }
    const float one = 1.f, beta = C ? 1.f : 0.f;
    SG_CUBLAS_CHECK(ctx, cublasLtMatmul((cublasLtHandle_t)sg_ctx_cublaslt(ctx), p->desc, &one, A,
                                        p->a, B, p->b, &beta, C ? C : D, p->d, D, p->d, &p->algo, ws, ws_bytes, st));
    sg_ctx_count_launches(ctx, 1);
    *ran = true;
    return SG_OK;
}

/* matmul_on the context's stream without C (beta 0). */
static sg_status matmul(sg_ctx *ctx, const char *fn, sg_dtype dt, cublasOperation_t transa,
                        cublasOperation_t transb, int64_t m, int64_t n, int64_t k,
                        cublasLtEpilogue_t epi, const void *A, const void *B, void *D,
                        const void *bias, void *aux, bool optional, bool *ran)
{
    return matmul_on(ctx, false, fn, dt, transa, transb, m, n, k, epi, A, B, NULL, D, bias, aux, optional, ran);
}

/* ---- the unfused forward epilogue: one kernel ---- */

#define GELU_K0F ((float)SG_GELU_K0)
#define GELU_K1F ((float)SG_GELU_K1)

/* t(M,N): the plain matmul's output, which is pre for GELU (the bias is added in place) and y
 * otherwise. y = act(t + b) elementwise in f32; the formulas are act_cuda.cu's. In bf16 the
 * matmul has already rounded t once, so pre and y here are rounded a second time (as PyTorch's
 * addmm followed by a separate activation); the fused epilogue rounds once. */
template <typename T, int ACT>
__global__ void bias_act_kernel(T *t, const T *__restrict__ b, T *y, int64_t m, int64_t n)
{
    const int64_t total = m * n, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += stride) {
        float v = to_f(t[i]) + (b ? to_f(b[i % n]) : 0.f);
        if (ACT == SG_ACT_GELU) {
            t[i] = from_f<T>(v);
            v = 0.5f * v * (1.f + tanhf(GELU_K0F * (v + GELU_K1F * v * v * v)));
        } else if (ACT == SG_ACT_RELU) {
            v = v > 0.f ? v : 0.f;
        }
        y[i] = from_f<T>(v);
    }
}

template <typename T>
static void bias_act_launch(sg_activation act, int blocks, int threads, cudaStream_t s, void *t,
                            const void *b, void *y, int64_t m, int64_t n)
{
    T *tt = (T *)t, *yy = (T *)y;
    const T *bb = (const T *)b;
    switch (act) {
    case SG_ACT_NONE:
        bias_act_kernel<T, SG_ACT_NONE><<<blocks, threads, 0, s>>>(tt, bb, yy, m, n);
        break;
    case SG_ACT_RELU:
        bias_act_kernel<T, SG_ACT_RELU><<<blocks, threads, 0, s>>>(tt, bb, yy, m, n);
        break;
    case SG_ACT_GELU:
        bias_act_kernel<T, SG_ACT_GELU><<<blocks, threads, 0, s>>>(tt, bb, yy, m, n);
        break;
    }
}

static sg_status launch_bias_act(sg_ctx *ctx, sg_dtype dt, sg_activation act, void *t,
                                 const void *b, void *y, int64_t m, int64_t n)
{
    const int threads = 256;
    const int64_t want = (m * n + threads - 1) / threads, cap = (int64_t)sg_ctx_sm_count(ctx) * 8;
    int blocks = (int)(want < cap ? want : (cap > 0 ? cap : 1));
    cudaStream_t s = (cudaStream_t)sg_ctx_stream(ctx);
    if (dt == SG_DTYPE_BF16)
        bias_act_launch<__nv_bfloat16>(act, blocks, threads, s, t, b, y, m, n);
    else
        bias_act_launch<float>(act, blocks, threads, s, t, b, y, m, n);
    SG_CUDA_CHECK_LAUNCH(ctx, "bias_act_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* ---- d(pre) and the bias gradient: one kernel ----
 * Blocks of 32 column groups x 8 row lanes; a group is VEC consecutive columns, read and
 * written 16 bytes at a time (VEC = 8 bf16 or 4 f32; 1 where the width or an address does not
 * allow it), so a warp moves 512 contiguous bytes of one row. Rows are cut into gridDim.y
 * chunks; a block sums its chunk per column (each lane its rows in order, then the 8 lanes in
 * order). With one chunk the block writes db; with several, each block writes its partial and
 * the last block of a column tile (a counter per tile, reset to 0 by that block) adds the
 * partials in chunk order. Same order every run: deterministic. Loads go ahead of the adds in
 * batches (DB_UNROLL rows, DB_UNROLL_RED partials), the adds in the same order. Sums and partials are f32 for
 * both storage types; db is rounded once to T at the end. */

#define DB_COLS 32
#define DB_ROWS 8
#define DB_VEC_MAX 8 /* columns a thread takes at most (bf16) */
#define DB_UNROLL 4      /* rows a lane loads before it adds them */
#define DB_UNROLL_RED 16 /* partials the last block loads before it adds them */

template <int ACT> __device__ __forceinline__ float act_grad(float g, float a)
{
    if (ACT == SG_ACT_RELU) return a > 0.f ? g : 0.f; /* a is the forward's output y */
    if (ACT == SG_ACT_GELU) {                          /* a is pre; as act_cuda.cu */
        float u = GELU_K0F * (a + GELU_K1F * a * a * a);
        float t = tanhf(u);
        float du = GELU_K0F * (1.f + 3.f * GELU_K1F * a * a);
        return g * (0.5f * (1.f + t) + 0.5f * a * (1.f - t * t) * du);
    }
    return g;
}

/* g(M,N): dy in, d(pre) out (when ACT is not NONE). act_in(M,N), which may be g itself (no
 * __restrict__ on either: each element is read, then written, by one thread). db(N) or NULL.
 * partials(gridDim.y, N) and counters(gridDim.x): scratch, used when gridDim.y > 1. db sums
 * d(pre) as stored in g (rounded to T), the values the dw and dx matmuls read. N % VEC == 0. */
template <typename T, int ACT, int VEC>
__global__ void __launch_bounds__(DB_COLS * DB_ROWS, 4)
dact_bias_kernel(T *g, const T *act_in, T *__restrict__ db, float *__restrict__ partials,
                 unsigned *__restrict__ counters, int64_t m, int64_t n, int64_t rows_per_chunk)
{
    __shared__ float sh[DB_ROWS][DB_COLS * VEC + 1];
    __shared__ bool last;
    sg_pdl_wait(); /* launched programmatically (sg_ctx_pdl): the kernel before it is done */
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t tile = (int64_t)DB_COLS * VEC, col0 = (int64_t)blockIdx.x * tile + (int64_t)tx * VEC;
    const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < m ? r0 + rows_per_chunk : m;
    float s[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) s[j] = 0.f;
    if (col0 < n) {
        /* DB_UNROLL rows loaded before any is used, so their loads are in flight together (one
         * at a time, each waited for by the adds, left the kernel latency-bound: 5.5 us for
         * 2048 x 768 bf16, 3 MB); then added in row order, as one row at a time would. */
        int64_t r = r0 + ty;
        for (; r + (DB_UNROLL - 1) * DB_ROWS < r1; r += DB_UNROLL * DB_ROWS) {
            vec_t<T, VEC> v[DB_UNROLL];
#pragma unroll
            for (int u = 0; u < DB_UNROLL; u++) v[u] = ldv<T, VEC>(g + (r + u * DB_ROWS) * n + col0, 0);
            if (ACT != SG_ACT_NONE) {
                vec_t<T, VEC> a[DB_UNROLL];
#pragma unroll
                for (int u = 0; u < DB_UNROLL; u++) a[u] = ldv<T, VEC>(act_in + (r + u * DB_ROWS) * n + col0, 0);
#pragma unroll
                for (int u = 0; u < DB_UNROLL; u++) {
#pragma unroll
                    for (int j = 0; j < VEC; j++)
                        v[u].e[j] = from_f<T>(act_grad<ACT>(to_f(v[u].e[j]), to_f(a[u].e[j])));
                    stv<T, VEC>(g + (r + u * DB_ROWS) * n + col0, 0, v[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < DB_UNROLL; u++)
#pragma unroll
                for (int j = 0; j < VEC; j++) s[j] += to_f(v[u].e[j]);
        }
        for (; r < r1; r += DB_ROWS) {
            const int64_t i = r * n + col0;
            vec_t<T, VEC> v = ldv<T, VEC>(g + i, 0);
            if (ACT != SG_ACT_NONE) {
                vec_t<T, VEC> a = ldv<T, VEC>(act_in + i, 0);
#pragma unroll
                for (int j = 0; j < VEC; j++) v.e[j] = from_f<T>(act_grad<ACT>(to_f(v.e[j]), to_f(a.e[j])));
                stv<T, VEC>(g + i, 0, v);
            }
#pragma unroll
            for (int j = 0; j < VEC; j++) s[j] += to_f(v.e[j]);
        }
    }
    if (!db) return; /* the same for the whole grid */

#pragma unroll
    for (int j = 0; j < VEC; j++) sh[ty][tx * VEC + j] = s[j];
    __syncthreads();
    /* One thread a column of the tile: the 8 lanes' sums in order. */
    const int c = ty * DB_COLS + tx;
    const int64_t col = (int64_t)blockIdx.x * tile + c;
    const bool mine = c < tile && col < n;
    float total = 0.f;
    if (mine)
        for (int j = 0; j < DB_ROWS; j++) total += sh[j][c];
    if (gridDim.y == 1) {
        if (mine) db[col] = from_f<T>(total);
        return;
    }
    if (mine) partials[(int64_t)blockIdx.y * n + col] = total;
    __threadfence(); /* partials visible device-wide before the counter moves */
    __syncthreads();
    if (tx == 0 && ty == 0) last = atomicAdd(&counters[blockIdx.x], 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (mine) { /* the partials in chunk order, DB_UNROLL_RED loads in flight at a time */
        float t = 0.f;
        unsigned j = 0;
        for (; j + DB_UNROLL_RED <= gridDim.y; j += DB_UNROLL_RED) {
            float p[DB_UNROLL_RED];
#pragma unroll
            for (int u = 0; u < DB_UNROLL_RED; u++) p[u] = __ldcg(&partials[(int64_t)(j + u) * n + col]);
#pragma unroll
            for (int u = 0; u < DB_UNROLL_RED; u++) t += p[u];
        }
        for (; j < gridDim.y; j++) t += __ldcg(&partials[(int64_t)j * n + col]);
        db[col] = from_f<T>(t);
    }
    if (tx == 0 && ty == 0) counters[blockIdx.x] = 0; /* ready for the next launch */
}

/* Blocks the grid aims for: 8 blocks of 256 threads fill an SM. */
static int64_t target_blocks(sg_ctx *ctx)
{
    int sms = sg_ctx_sm_count(ctx);
    return (int64_t)(sms > 0 ? sms : 1) * 8;
}

/* Scratch of a fixed size per device (so it is allocated once, before any capture, and never
 * moves): counters for up to T column tiles, then partials (f32 for every storage type). More
 * than one chunk happens only when the column tiles gx < T, and then gy <= T/gx + 1, so
 * gy*N <= gy*gx*32*VEC <= 2*T*32*VEC. */
static size_t scratch_bytes(int64_t t, size_t *partials_off)
{
    *partials_off = (((size_t)t * sizeof(unsigned)) + 255) / 256 * 256;
    return *partials_off + (size_t)(2 * t * DB_COLS * DB_VEC_MAX) * sizeof(float);
}

template <typename T, int VEC>
static cudaError_t dact_bias_launch(sg_activation act, dim3 grid, dim3 block, cudaStream_t st, bool pdl, void *g,
                                    const void *act_in, void *db, float *partials, unsigned *counters,
                                    int64_t m, int64_t n, int64_t rows_per_chunk)
{
    T *gg = (T *)g, *dd = (T *)db;
    const T *aa = (const T *)act_in;
    const sg_pdl_launch l(grid, block, 0, st, pdl);
    switch (act) {
    case SG_ACT_NONE:
        return cudaLaunchKernelEx(&l.cfg, dact_bias_kernel<T, SG_ACT_NONE, VEC>, gg, aa, dd, partials, counters, m,
                                  n, rows_per_chunk);
    case SG_ACT_RELU:
        return cudaLaunchKernelEx(&l.cfg, dact_bias_kernel<T, SG_ACT_RELU, VEC>, gg, aa, dd, partials, counters, m,
                                  n, rows_per_chunk);
    case SG_ACT_GELU:
        return cudaLaunchKernelEx(&l.cfg, dact_bias_kernel<T, SG_ACT_GELU, VEC>, gg, aa, dd, partials, counters, m,
                                  n, rows_per_chunk);
    }
    return cudaSuccess;
}

static sg_status launch_dact_bias_on(sg_ctx *ctx, bool side, sg_dtype dt, sg_activation act, void *g,
                                     const void *act_in, void *db, int64_t m, int64_t n)
{
    /* 16-byte groups where the width and the addresses allow them. */
    const int full = dt == SG_DTYPE_BF16 ? 8 : 4;
    const bool aligned = (uintptr_t)g % 16 == 0 && (act == SG_ACT_NONE || (uintptr_t)act_in % 16 == 0);
    const int vec = n % full == 0 && aligned ? full : 1;
    const int64_t t = target_blocks(ctx);
    const int64_t gx = (n + DB_COLS * vec - 1) / (DB_COLS * vec);
    int64_t gy = gx < t ? (t + gx - 1) / gx : 1;
    const int64_t max_gy = (m + 4 * DB_ROWS - 1) / (4 * DB_ROWS); /* >= 4 rows per lane */
    if (gy > max_gy) gy = max_gy;
    if (gy < 1) gy = 1;
    const int64_t rows_per_chunk = (m + gy - 1) / gy;
    gy = (m + rows_per_chunk - 1) / rows_per_chunk;

    if (gx > 0x7fffffff)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_linear_backward: N = %lld is too wide",
                       (long long)n);
    float *partials = NULL;
    unsigned *counters = NULL;
    if (db) {
        size_t off, bytes = scratch_bytes(t, &off);
        void *s;
        SG_TRY(sg_ctx_scratch(ctx, side ? SG_SLOT_LINEAR_SIDE : SG_SLOT_LINEAR, bytes, &s));
        /* A scratch made just now was zeroed on the context's stream, after the fork: the
         * second stream must wait for that too (a fork again; nothing else ran since). */
        if (side) SG_TRY(sg_ctx_side_fork(ctx));
        counters = (unsigned *)s;
        partials = (float *)((char *)s + off);
        SG_ASSERT(gy == 1 || (gx <= t && gy * n <= 2 * t * DB_COLS * DB_VEC_MAX));
    }
    dim3 grid((unsigned)gx, (unsigned)gy), block(DB_COLS, DB_ROWS);
    cudaStream_t st = (cudaStream_t)(side ? sg_ctx_side_stream(ctx) : sg_ctx_stream(ctx));
    const bool pdl = sg_ctx_pdl(ctx);
    cudaError_t le;
    if (dt == SG_DTYPE_BF16 && vec == 8)
        le = dact_bias_launch<__nv_bfloat16, 8>(act, grid, block, st, pdl, g, act_in, db, partials, counters, m, n,
                                                rows_per_chunk);
    else if (dt == SG_DTYPE_BF16)
        le = dact_bias_launch<__nv_bfloat16, 1>(act, grid, block, st, pdl, g, act_in, db, partials, counters, m, n,
                                                rows_per_chunk);
    else if (vec == 4)
        le = dact_bias_launch<float, 4>(act, grid, block, st, pdl, g, act_in, db, partials, counters, m, n,
                                        rows_per_chunk);
    else
        le = dact_bias_launch<float, 1>(act, grid, block, st, pdl, g, act_in, db, partials, counters, m, n,
                                        rows_per_chunk);
    SG_CUDA_CHECK(ctx, le);
    SG_CUDA_CHECK_LAUNCH(ctx, "dact_bias_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* launch_dact_bias_on the context's stream. */
static sg_status launch_dact_bias(sg_ctx *ctx, sg_dtype dt, sg_activation act, void *g, const void *act_in, void *db,
                                  int64_t m, int64_t n)
{
    return launch_dact_bias_on(ctx, false, dt, act, g, act_in, db, m, n);
}

/* ---- entry points (arguments checked by linear.c: every tensor has x's dtype) ---- */

/* Row-major y(M,N) = x(M,K) w(N,K)^T is column-major y^T(N x M) = w^T x^T:
 *   A = w: stored column-major K x N (ld K), op T -> N x K;
 *   B = x: stored column-major K x M (ld K), op N;
 *   D = y: column-major N x M (ld N). m = N, n = M, k = K.
 * The bias has N elements, one per row of D, as the BIAS epilogues want; pre (aux) is
 * D-shaped with ld N. */
/* ---- one-row forward: a batch-1 decode step's ----
 * For one row cuBLASLt's heuristic picks a tile kernel with a handful of blocks. Here one warp
 * computes one output column: its lanes stride along that column's row of W (contiguous,
 * (out, in) layout) with 16-byte loads and a warp butterfly adds their partial dot products, so
 * every SM streams W and the GEMV runs near memory bandwidth. Sums in f32 in a fixed order;
 * bias and activation in the same pass, pre and y each rounded once (as the fused epilogue).
 * Measured on the H100 (gpt-768-12 decode, 2026-11-25): one row 0.505 ms a token against
 * cuBLASLt's 0.542; a version taking up to eight rows (each warp re-reading every row of x) was
 * slower at eight, 0.864 against 0.557, so it takes one row only.
 *
 * The decode step's fused form (sg_gen_row_linear, decode.h) runs the same kernel with more in
 * it: LN, the LayerNorm of x before the product (each block computes the row's mean and
 * variance in one reduction, Welford's update per thread and Chan's merge in a fixed order, and
 * keeps the normalized row in shared memory, rounded to T as sg_layernorm_forward stores it),
 * and r, a residual added last (y may be r). Each warp loads its first SKINNY_PRE vectors of W,
 * and asks L2 for the rest of its row, before anything that depends on earlier kernels: with
 * programmatic dependent launch (pdl) those loads, and the launch itself, overlap the kernels
 * before, which is where a decode step of ~60 small kernels spends its time. */

#define SKINNY_WARPS 8
#define SKINNY_THREADS (SKINNY_WARPS * 32)
#define SKINNY_PRE 4
#define SKINNY_LN_REG 4 /* a thread's row elements kept in registers: rows up to 1024 wholly */

template <typename T> struct skinny_args {
    const T *x, *w, *b, *gamma, *beta, *r;
    T *y, *pre;
    int n, k;
    float eps;
};

/* Chan's merge of two (count, mean, M2) summaries into the first. */
__device__ __forceinline__ void welford_merge(float &n, float &m, float &m2, float nb, float mb, float m2b)
{
    const float nn = n + nb;
    if (nn == 0.f) return;
    const float d = mb - m, f = nb / nn;
    m += d * f;
    m2 += m2b + d * d * n * f;
    n = nn;
}

/* The mean and M2 (sum of squared deviations) of the block's threads' summaries: a warp
 * butterfly, then every thread merges the warps' in order (the same result in every thread). */
__device__ __forceinline__ void skinny_block_welford(float n, float &m, float &m2, float *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        welford_merge(n, m, m2, __shfl_xor_sync(0xffffffffu, n, o), __shfl_xor_sync(0xffffffffu, m, o),
                      __shfl_xor_sync(0xffffffffu, m2, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sh[3 * warp] = n, sh[3 * warp + 1] = m, sh[3 * warp + 2] = m2;
    __syncthreads();
    n = sh[0], m = sh[1], m2 = sh[2];
#pragma unroll
    for (int i = 1; i < SKINNY_WARPS; i++) welford_merge(n, m, m2, sh[3 * i], sh[3 * i + 1], sh[3 * i + 2]);
}

template <typename T, int V, int ACT, bool LN>
__global__ void __launch_bounds__(SKINNY_THREADS) skinny_kernel(skinny_args<T> a)
{
    extern __shared__ __align__(16) unsigned char skinny_sm[];
    __shared__ float red[3 * SKINNY_WARPS];
    sg_pdl_trigger();
    const int col = blockIdx.x * SKINNY_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31, nv = a.k / V;
    const bool live = col < a.n;
    const T *wr = a.w + (size_t)(live ? col : 0) * a.k;
    vec_t<T, V> wp[SKINNY_PRE];
#pragma unroll
    for (int i = 0; i < SKINNY_PRE; i++)
        if (live && lane + 32 * i < nv) wp[i] = ldv<T, V>(wr, lane + 32 * i);
    if (live) /* the rest of the column's row of W, into L2 */
        for (size_t off = (size_t)SKINNY_PRE * 32 * V * sizeof(T) + 128 * lane; off < (size_t)a.k * sizeof(T);
             off += 32 * 128)
            sg_prefetch_l2(reinterpret_cast<const char *>(wr) + off);
    /* The bias and the LayerNorm's first SKINNY_LN_REG elements of gamma and beta a thread
     * (weights too) before the wait; the row's elements stay in registers between the two
     * passes. */
    const float bias = live && lane == 0 && a.b ? to_f(a.b[col]) : 0.f;
    float xr[SKINNY_LN_REG], gr[SKINNY_LN_REG], br[SKINNY_LN_REG];
    if (LN) {
#pragma unroll
        for (int i = 0; i < SKINNY_LN_REG; i++) {
            const int j = threadIdx.x + SKINNY_THREADS * i;
            gr[i] = j < a.k ? to_f(a.gamma[j]) : 0.f;
            br[i] = j < a.k ? to_f(a.beta[j]) : 0.f;
        }
    }
    sg_pdl_wait();
    const float res = live && lane == 0 && a.r ? to_f(a.r[col]) : 0.f;
    const T *x = a.x;
    if (LN) { /* every thread of the block takes part: no early exit above */
        T *h = reinterpret_cast<T *>(skinny_sm);
        float n = 0.f, m = 0.f, m2 = 0.f; /* Welford over this thread's elements */
#pragma unroll
        for (int i = 0; i < SKINNY_LN_REG; i++) {
            const int j = threadIdx.x + SKINNY_THREADS * i;
            xr[i] = j < a.k ? to_f(a.x[j]) : 0.f;
        }
#pragma unroll
        for (int i = 0; i < SKINNY_LN_REG; i++)
            if (threadIdx.x + SKINNY_THREADS * i < a.k) {
                const float d = xr[i] - m;
                n += 1.f;
                m += d / n;
                m2 += d * (xr[i] - m);
            }
        for (int j = threadIdx.x + SKINNY_THREADS * SKINNY_LN_REG; j < a.k; j += SKINNY_THREADS) {
            const float e = to_f(a.x[j]), d = e - m;
            n += 1.f;
            m += d / n;
            m2 += d * (e - m);
        }
        skinny_block_welford(n, m, m2, red);
        const float rs = rsqrtf(m2 / (float)a.k + a.eps);
#pragma unroll
        for (int i = 0; i < SKINNY_LN_REG; i++) {
            const int j = threadIdx.x + SKINNY_THREADS * i;
            if (j < a.k) h[j] = from_f<T>((xr[i] - m) * rs * gr[i] + br[i]);
        }
        for (int j = threadIdx.x + SKINNY_THREADS * SKINNY_LN_REG; j < a.k; j += SKINNY_THREADS)
            h[j] = from_f<T>((to_f(a.x[j]) - m) * rs * to_f(a.gamma[j]) + to_f(a.beta[j]));
        __syncthreads();
        x = h;
    }
    if (!live) return;
    float v = 0.f;
#pragma unroll
    for (int i = 0; i < SKINNY_PRE; i++) {
        const int j = lane + 32 * i;
        if (j < nv) {
            vec_t<T, V> xv = ldv<T, V>(x, j);
#pragma unroll
            for (int e = 0; e < V; e++) v += to_f(wp[i].e[e]) * to_f(xv.e[e]);
        }
    }
#pragma unroll 4
    for (int j = lane + 32 * SKINNY_PRE; j < nv; j += 32) {
        vec_t<T, V> wv = ldv<T, V>(wr, j), xv = ldv<T, V>(x, j);
#pragma unroll
        for (int e = 0; e < V; e++) v += to_f(wv.e[e]) * to_f(xv.e[e]);
    }
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane) return;
    v += bias;
    if (ACT == SG_ACT_GELU) {
        if (a.pre) a.pre[col] = from_f<T>(v);
        v = 0.5f * v * (1.f + tanhf(GELU_K0F * (v + GELU_K1F * v * v * v)));
    } else if (ACT == SG_ACT_RELU) {
        v = v > 0.f ? v : 0.f;
    }
    a.y[col] = from_f<T>(v + res);
}

template <typename T, int V, int ACT>
static cudaError_t skinny_launch_act(const skinny_args<T> &a, bool ln, bool pdl, cudaStream_t s)
{
    const sg_pdl_launch l(dim3((unsigned)((a.n + SKINNY_WARPS - 1) / SKINNY_WARPS)), dim3(SKINNY_THREADS),
                          ln ? (size_t)a.k * sizeof(T) : 0, s, pdl);
    if (ln) return cudaLaunchKernelEx(&l.cfg, skinny_kernel<T, V, ACT, true>, a);
    return cudaLaunchKernelEx(&l.cfg, skinny_kernel<T, V, ACT, false>, a);
}

template <typename T, int V>
static cudaError_t skinny_launch(sg_activation act, const skinny_args<T> &a, bool ln, bool pdl, cudaStream_t s)
{
    if (act == SG_ACT_GELU) return skinny_launch_act<T, V, SG_ACT_GELU>(a, ln, pdl, s);
    if (act == SG_ACT_RELU) return skinny_launch_act<T, V, SG_ACT_RELU>(a, ln, pdl, s);
    return skinny_launch_act<T, V, SG_ACT_NONE>(a, ln, pdl, s);
}

/* The normalized row lives in the default 48 KiB of shared memory. */
#define SKINNY_LN_MAX_BYTES (48 * 1024)

/* 16-byte loads when k and the pointers allow them (rows of x and w then stay aligned; the
 * normalized row in shared memory is 16-byte aligned). */
template <typename T>
static sg_status launch_skinny(sg_ctx *ctx, sg_activation act, skinny_args<T> a, bool ln, bool pdl)
{
    cudaStream_t s = (cudaStream_t)sg_ctx_stream(ctx);
    constexpr int V = 16 / sizeof(T);
    const bool vec = a.k % V == 0 && (ln || align_of(a.x) >= 16) && align_of(a.w) >= 16;
    const cudaError_t e = vec ? skinny_launch<T, V>(act, a, ln, pdl, s) : skinny_launch<T, 1>(act, a, ln, pdl, s);
    SG_CUDA_CHECK(ctx, e);
    SG_CUDA_CHECK_LAUNCH(ctx, "skinny_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

static sg_status skinny(sg_ctx *ctx, sg_dtype dt, sg_activation act, const void *x, const void *w, const void *b,
                        const void *gamma, const void *beta, float eps, const void *r, void *y, void *pre, int64_t n,
                        int64_t k, bool pdl)
{
    const bool ln = gamma != NULL;
    if (dt == SG_DTYPE_BF16) {
        typedef __nv_bfloat16 T;
        skinny_args<T> a = {(const T *)x, (const T *)w,    (const T *)b, (const T *)gamma, (const T *)beta,
                            (const T *)r, (T *)y,          (T *)pre,     (int)n,           (int)k,
                            eps};
        return launch_skinny<T>(ctx, act, a, ln, pdl);
    }
    skinny_args<float> a = {(const float *)x, (const float *)w, (const float *)b, (const float *)gamma,
                            (const float *)beta, (const float *)r, (float *)y, (float *)pre, (int)n, (int)k, eps};
    return launch_skinny<float>(ctx, act, a, ln, pdl);
}

extern "C" sg_status sg_gen_row_linear_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                                            const sg_tensor *beta, float eps, const sg_tensor *w,
                                            const sg_tensor *b, sg_activation act, const sg_tensor *r,
                                            sg_tensor *y)
{
    const int64_t n = w->shape[0], k = w->shape[1];
    if (k > INT32_MAX || n > INT32_MAX || (gamma && k * (int64_t)sg_dtype_size(x->dtype) > SKINNY_LN_MAX_BYTES))
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "sg_gen_row_linear: W is (%lld, %lld); the kernel takes at most 2^31-1 of each, and "
                       "with the LayerNorm at most %d bytes of a row",
                       (long long)n, (long long)k, SKINNY_LN_MAX_BYTES);
    return skinny(ctx, x->dtype, act, x->data, w->data, b ? b->data : NULL, gamma ? gamma->data : NULL,
                  beta ? beta->data : NULL, eps, r ? r->data : NULL, y->data, NULL, n, k, sg_ctx_pdl(ctx));
}

extern "C" sg_status sg_linear_forward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                                            const sg_tensor *b, sg_activation act, const sg_tensor *res,
                                            sg_tensor *y, sg_tensor *pre, int64_t m, int64_t n, int64_t k)
{
    static const char fn[] = "sg_linear_forward";
    const sg_dtype dt = x->dtype;
    const void *xp = x->data, *wp = w->data, *bp = b ? b->data : NULL, *rp = res ? res->data : NULL;
    void *yp = y->data, *pp = pre ? pre->data : NULL;

    if (m == 1 && k <= INT32_MAX && n <= INT32_MAX)
        return skinny(ctx, dt, act, xp, wp, bp, NULL, NULL, 0.f, rp, yp, pp, n, k, false);
    cublasLtEpilogue_t fused;
    switch (act) {
    case SG_ACT_RELU: fused = bp ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU; break;
    /* GELU always keeps pre (the _AUX variants): the backward needs it. */
    case SG_ACT_GELU:
        fused = bp ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        break;
    default: fused = bp ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT; break;
    }
    /* When the fused epilogue may not run: the GELU aux leading dimension (N) must be a
     * multiple of 8; and cuBLASLt's alignment preferences cover A, B, C, D but not the bias or
     * aux pointers, so the heuristic may pick a kernel that assumes 16-byte ones (a bias that
     * is a view into the parameter buffer need not be: PyTorch met "misaligned address"
     * faults there). Those cases, and shapes the heuristic refuses, take the unfused path.
     * A residual (act NONE) is cuBLASLt's C, added with beta 1 before the bias: y rounded once. */
    bool fusable = (!bp || align_of(bp) >= 16) &&
                   (act != SG_ACT_GELU || (n % 8 == 0 && align_of(pp) >= 16));
    bool ran = false;
    if (fusable)
        SG_TRY(matmul_on(ctx, false, fn, dt, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, fused, wp, xp, rp, yp, bp,
                        act == SG_ACT_GELU ? pp : NULL, fused != CUBLASLT_EPILOGUE_DEFAULT, &ran));
    if (ran) return SG_OK;

    /* Unfused: the plain matmul (plus the residual) into pre (GELU) or y, then one kernel adds
     * the bias and applies act (y = act(pre + b), pre += b); with a residual and no bias the
     * matmul is all. */
    void *t = act == SG_ACT_GELU ? pp : yp;
    SG_TRY(matmul_on(ctx, false, fn, dt, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, CUBLASLT_EPILOGUE_DEFAULT, wp,
                    xp, rp, t, NULL, NULL, false, &ran));
    if (rp && !bp) return SG_OK;
    return launch_bias_act(ctx, dt, act, t, bp, yp, m, n);
}

static sg_status backward_dx(sg_ctx *ctx, const char *fn, sg_dtype dt, const sg_tensor *dy, const sg_tensor *w,
                             sg_tensor *dx, const sg_linear_through *th, int64_t m, int64_t n, int64_t k);

extern "C" sg_status sg_linear_backward_cuda(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                                             sg_tensor *dy, sg_activation act,
                                             const sg_tensor *act_in, sg_tensor *dx,
                                             sg_tensor *dw, sg_tensor *db, const sg_linear_through *th,
                                             int64_t m, int64_t n, int64_t k)
{
    static const char fn[] = "sg_linear_backward";
    const sg_dtype dt = x->dtype;
    const void *xp = x->data;
    void *g = dy->data; /* d(pre) once the kernel has run */
    bool ran;

    /* Row-major dw(N,K) = dpre(M,N)^T x(M,K) is column-major dw^T(K x N) = x^T dpre:
     *   A = x:    stored column-major K x M (ld K), op N;
     *   B = dpre: stored column-major N x M (ld N), op T -> M x N;
     *   D = dw:   column-major K x N (ld K). m = K, n = N, k = M.
     * With STEPGRAPH_BGRAD=1 and no activation, db (the column sums of dpre = dy) comes from
     * this matmul's BGRADB epilogue (B summed over the product's k, M, into a vector of D's N
     * columns; 16-byte aligned, which cuBLASLt's alignment preferences do not cover). Off by
     * default: on the H100 (CUDA 13, gpt-768-12-8-256 bf16) cuBLASLt ran it as a kernel of its
     * own after the matmul (globalKernelBgradAB, 4.5 us each) and the DGELU_BGRAD form below as
     * another (35 us each, against about 20 for dact_bias_kernel): the step took 5.225 ms with
     * them, 4.893 without. Otherwise the kernel sums db, and with an activation writes d(pre)
     * in place in the same pass. */
    ran = false;
    const bool lt_bgrad = sg_ctx_lt_bgrad(ctx);
    if (act == SG_ACT_NONE && db && align_of(db->data) >= 16 && lt_bgrad)
        SG_TRY(matmul(ctx, fn, dt, CUBLAS_OP_N, CUBLAS_OP_T, k, n, m, CUBLASLT_EPILOGUE_BGRADB, xp, g, dw->data,
                      db->data, NULL, true, &ran));
    /* On the context's second stream (sg_ctx_side_use: STEPGRAPH_WGRAD=side, or the default
     * inside a module's region), the dw matmul, and a bias sum without an activation, run
     * beside the dx matmul: all read d(pre) (written before the fork), each writes its own
     * output. The main stream waits for them before this call returns, or, deferred, when the
     * region ends. */
    const bool side = !ran && dx && sg_ctx_side_use(ctx);
    if (!ran && act != SG_ACT_NONE)
        SG_TRY(launch_dact_bias(ctx, dt, act, g, act_in ? act_in->data : NULL, db ? db->data : NULL, m, n));
    if (side) SG_TRY(sg_ctx_side_fork(ctx));
    sg_status st = SG_OK;
    if (!ran && act == SG_ACT_NONE && db)
        st = launch_dact_bias_on(ctx, side, dt, act, g, NULL, db->data, m, n);
    if (st == SG_OK && !ran)
        st = matmul_on(ctx, side, fn, dt, CUBLAS_OP_N, CUBLAS_OP_T, k, n, m, CUBLASLT_EPILOGUE_DEFAULT, xp, g, NULL,
                       dw->data, NULL, NULL, false, &ran);
    if (st == SG_OK && dx) st = backward_dx(ctx, fn, dt, dy, w, dx, th, m, n, k);
    return sg_ctx_side_end(ctx, side, st);
}

/* Row-major dx(M,K) = dpre(M,N) w(N,K) is column-major dx^T(K x M) = w^T dpre^T:
 *   A = w:    stored column-major K x N (ld K), op N;
 *   B = dpre: stored column-major N x M (ld N), op N;
 *   D = dx:   column-major K x M (ld K). m = K, n = M, k = N. */
static sg_status backward_dx(sg_ctx *ctx, const char *fn, sg_dtype dt, const sg_tensor *dy, const sg_tensor *w,
                             sg_tensor *dx, const sg_linear_through *th, int64_t m, int64_t n, int64_t k)
{
    const void *wp = w->data, *g = dy->data;
    const bool lt_bgrad = sg_ctx_lt_bgrad(ctx);
    bool ran;
    /* Through the layer before's activation (sg_linear_backward_through): the plain matmul
     * and then the activation kernel on dx, as the layer before's backward would run it. With
     * STEPGRAPH_BGRAD=1 and GELU, the DGELU epilogue instead (gelu'(x_pre) from the aux input,
     * D-shaped: K x M, ld K, so K % 8 == 0 and 16-byte aligned as in the forward) and, with
     * x_db, its BGRAD form summing the result's rows (a vector of D's K rows, 16-byte aligned;
     * cuBLASLt sums the f32 values before they are rounded), where the heuristic has it. */
    const bool through = th && th->x_act != SG_ACT_NONE;
    void *xdb = through && th->x_db ? th->x_db->data : NULL;
    ran = false;
    if (through && th->x_act == SG_ACT_GELU && k % 8 == 0 && align_of(th->x_pre->data) >= 16 &&
        (!xdb || align_of(xdb) >= 16) && lt_bgrad)
        SG_TRY(matmul(ctx, fn, dt, CUBLAS_OP_N, CUBLAS_OP_N, k, m, n,
                      xdb ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU, wp, g, dx->data, xdb,
                      (void *)th->x_pre->data, true, &ran));
    if (ran) return SG_OK;
    SG_TRY(matmul(ctx, fn, dt, CUBLAS_OP_N, CUBLAS_OP_N, k, m, n, CUBLASLT_EPILOGUE_DEFAULT,
                  wp, g, dx->data, NULL, NULL, false, &ran));
    if (through) return launch_dact_bias(ctx, dt, th->x_act, dx->data, th->x_pre->data, xdb, m, k);
    return SG_OK;
}
