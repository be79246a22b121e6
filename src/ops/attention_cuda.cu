/* attention_cuda.cu: causal self-attention on the GPU, f32, in the manner of llm.c's cuBLAS
 * attention: a permute kernel splits heads out of qkv, cuBLAS strided-batched GEMMs (one batch
 * per (b, h)) do the products, one warp per row does the masked softmax, and an unpermute
 * kernel merges heads back. Forward: 5 launches; backward: 7. No atomics: deterministic.
 *
 * The work buffer (F32, sg_attention_work_elems elements), with N = B*T*C = B*H*T*hs:
 *     elements  shape        forward               backward
 *     [0N, 1N)  (B,H,T,hs)   q                     q
 *     [1N, 2N)  (B,H,T,hs)   k                     k, then dk (k is dead once dq is done)
 *     [2N, 3N)  (B,H,T,hs)   v                     v, then dv (v is dead once datt is done)
 *     [3N, 4N)  (B,H,T,hs)   y = att v (pre-merge) dout's heads, then dq (once dv is done)
 *     [4N, ..)  (B,H,T,T)    scores q k^T          datt, then d(scores) in place
 * Every region is written before it is read in the same call: nothing carries over between
 * calls, so one work buffer serves every layer.
 *
 * cuBLAS: one handle per context, created on first use (outside capture), kept in ext slot
 * SG_SLOT_COUNT - 1, bound once to the context's stream and then to its workspace (in that
 * order: cublasSetStream resets the workspace), default math mode: fp32 FMA, no TF32, as the
 * linear layer's cuBLASLt matmuls. GEMMs are written in column-major terms: a row-major (R,C)
 * matrix is a column-major C x R one with leading dimension C.
 *
 * The elementwise kernels take the I/O tensors' element type as a template parameter (float
 * now); a bf16 variant adds load/store overloads and swaps the two GEMMs that read att for
 * cublasGemmStridedBatchedEx. */
#include "ops/attention.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#define ATTN_SLOT (SG_SLOT_COUNT - 1)
#define ATTN_THREADS 256
#define ATTN_WARPS (ATTN_THREADS / 32) /* softmax rows per block */

/* ---- the cuBLAS handle ---- */

typedef struct attn_blas {
    cublasHandle_t handle;
} attn_blas;

static void blas_free(sg_ctx *ctx, void *ext)
{
    attn_blas *b = (attn_blas *)ext;
    if (b->handle) cublasDestroy(b->handle); /* teardown: a failure cannot be acted on */
    free(b);
}

/* The context's attention handle: created, bound and cached on the first call. Creating it
 * may allocate device memory, so it must not happen inside a capture. */
static sg_status blas_get(sg_ctx *ctx, const char *fn, cublasHandle_t *out)
{
    attn_blas *b = (attn_blas *)sg_ctx_ext(ctx, ATTN_SLOT);
    if (b) {
        *out = b->handle;
        return SG_OK;
    }
    SG_TRY(sg_capture_forbid(ctx, fn, "created the attention cuBLAS handle",
                             "run the step eagerly once before capturing it (warm-up >= 1)"));
    b = (attn_blas *)calloc(1, sizeof *b);
    if (!b) return sg_fail(ctx, SG_ERR_OOM, "%s: out of host memory for the cuBLAS handle", fn);
    size_t ws_bytes = 0;
    void *ws = sg_ctx_workspace(ctx, &ws_bytes);
    const char *call = "cublasCreate";
    cublasStatus_t s = cublasCreate(&b->handle);
    if (s == CUBLAS_STATUS_SUCCESS) {
        call = "cublasSetStream";
        s = cublasSetStream(b->handle, (cudaStream_t)sg_ctx_stream(ctx));
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        call = "cublasSetWorkspace"; /* after SetStream, which resets it */
        s = cublasSetWorkspace(b->handle, ws, ws ? ws_bytes : 0);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        call = "cublasSetMathMode(CUBLAS_DEFAULT_MATH)";
        s = cublasSetMathMode(b->handle, CUBLAS_DEFAULT_MATH);
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        blas_free(ctx, b);
        return sg_cublas_status(ctx, (int)s, call, __FILE__, __LINE__);
    }
    sg_ctx_set_ext(ctx, ATTN_SLOT, b, blas_free);
    *out = b->handle;
    return SG_OK;
}

/* C(m x n) = op(A) op(B) per batch, column-major, fp32, one launch counted. */
static sg_status gemm(sg_ctx *ctx, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                      int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, int64_t sa,
                      const float *B, int64_t ldb, int64_t sb, float *C, int64_t ldc, int64_t sc,
                      int64_t batch)
{
    const float one = 1.f, zero = 0.f; /* beta 0: C is not read (the poison stays out) */
    SG_CUBLAS_CHECK(ctx, cublasSgemmStridedBatched(h, ta, tb, (int)m, (int)n, (int)k, &one, A,
                                                   (int)lda, (long long)sa, B, (int)ldb,
                                                   (long long)sb, &zero, C, (int)ldc,
                                                   (long long)sc, (int)batch));
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* ---- element access: float now, bf16 overloads later ---- */

__device__ __forceinline__ float ld_f32(const float *p) { return *p; }
__device__ __forceinline__ void st_f32(float *p, float v) { *p = v; }

/* ---- permutes ---- */

/* Index math in I: 32-bit unsigned where every index fits (integer division is several
 * times cheaper than 64-bit), int64_t otherwise. */

/* dst: nmat regions of (B,H,T,hs), one after another. Regions 0..2 come from q, k, v of
 * qkv (B,T,3C); region 3 (nmat = 4) from dout (B,T,C). Writes are contiguous, reads contiguous
 * along each head's hs columns. */
template <typename Tio, typename I>
__global__ void split_heads_kernel(const Tio *__restrict__ qkv, const Tio *__restrict__ dout,
                                   float *__restrict__ dst, I B, I T, I C, I H, I hs, I nmat)
{
    const I n1 = B * T * C, total = n1 * nmat, stride = (I)gridDim.x * blockDim.x;
    for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const I mat = idx / n1;
        I r = idx - mat * n1;
        const I i = r % hs;
        r /= hs;
        const I t = r % T;
        r /= T;
        const I h = r % H, b = r / H;
        const I col = h * hs + i;
        dst[idx] = mat < 3 ? ld_f32(&qkv[(b * T + t) * 3 * C + mat * C + col])
                           : ld_f32(&dout[(b * T + t) * C + col]);
    }
}

/* dst (B,T,nmat*C): column block j (of C columns) from m_j (B,H,T,hs), j < nmat <= 3. The
 * forward's out (nmat = 1), and the backward's dqkv from dq, dk, dv (nmat = 3). */
template <typename Tio, typename I>
__global__ void merge_heads_kernel(const float *__restrict__ m0, const float *__restrict__ m1,
                                   const float *__restrict__ m2, Tio *__restrict__ dst, I B, I T,
                                   I C, I H, I hs, I nmat)
{
    const I width = C * nmat, total = B * T * width, stride = (I)gridDim.x * blockDim.x;
    for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const I bt = idx / width, c3 = idx - bt * width;
        const I mat = c3 / C, c = c3 - mat * C;
        const I h = c / hs, i = c - h * hs, b = bt / T, t = bt - b * T;
        const float *src = mat == 0 ? m0 : mat == 1 ? m1 : m2;
        st_f32(&dst[idx], src[((b * H + h) * T + t) * hs + i]);
    }
}

/* ---- softmax, one warp per row (b, h, t) of T entries; row t keeps s <= t ---- */

/* Online (max, sum) pairs merge symmetrically (fmaxf, and a sum of two rounded products, are
 * commutative; the _rn intrinsics keep the compiler from contracting one product into an
 * fma, which would not be), so after the xor butterfly every lane holds the same bits. Empty
 * lanes carry (-FLT_MAX, 0), which merges to a zero contribution without inf - inf. */
__device__ __forceinline__ void warp_max_sum(float &m, float &l)
{
    for (int off = 16; off > 0; off >>= 1) {
        const float mo = __shfl_xor_sync(0xffffffffu, m, off);
        const float lo = __shfl_xor_sync(0xffffffffu, l, off);
        const float mn = fmaxf(m, mo);
        l = __fadd_rn(__fmul_rn(l, expf(m - mn)), __fmul_rn(lo, expf(mo - mn)));
        m = mn;
    }
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* att[row, s] = exp(scale*pre[row, s] - max) / sum for s <= t, 0 above the diagonal. The
 * scaled score is rounded (__fmul_rn) the same way in both passes, so the row's maximum
 * gives exp(0) = 1 exactly. */
template <typename Tio>
__global__ void __launch_bounds__(ATTN_THREADS)
softmax_forward_kernel(const float *__restrict__ pre, Tio *__restrict__ att, int64_t rows, int T,
                       float scale)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * ATTN_WARPS + (threadIdx.x >> 5);
    if (row >= rows) return; /* the whole warp: the shuffles below see full warps */
    const int t = (int)(row % T);
    const float *x = pre + row * T;
    Tio *y = att + row * T;
    float m = -FLT_MAX, l = 0.f;
    for (int s = lane; s <= t; s += 32) {
        const float v = __fmul_rn(scale, x[s]);
        if (v > m) {
            l = l * expf(m - v) + 1.f;
            m = v;
        } else {
            l += expf(v - m);
        }
    }
    warp_max_sum(m, l);
    const float inv = 1.f / l; /* l >= 1: s = 0 is always in the row */
    for (int s = lane; s < T; s += 32)
        st_f32(&y[s], s <= t ? expf(__fmul_rn(scale, x[s]) - m) * inv : 0.f);
}

/* In place on d: datt in, d(scores) out: d[s] = scale * att[s] * (d[s] - sum_r att[r] d[r])
 * for s <= t, 0 above the diagonal (the mask passes no gradient). Each lane reads its own
 * entries before it writes them, and the sum is complete before any write. */
template <typename Tio>
__global__ void __launch_bounds__(ATTN_THREADS)
softmax_backward_kernel(const Tio *__restrict__ att, float *__restrict__ d, int64_t rows, int T,
                        float scale)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * ATTN_WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int t = (int)(row % T);
    const Tio *p = att + row * T;
    float *g = d + row * T;
    float acc = 0.f;
    for (int s = lane; s <= t; s += 32) acc += ld_f32(&p[s]) * g[s];
    const float sum = warp_sum(acc);
    for (int s = lane; s < T; s += 32) g[s] = s <= t ? scale * ld_f32(&p[s]) * (g[s] - sum) : 0.f;
}

/* ---- launchers ---- */

static unsigned grid_for(sg_ctx *ctx, int64_t n)
{
    const int64_t want = (n + ATTN_THREADS - 1) / ATTN_THREADS;
    const int sms = sg_ctx_sm_count(ctx);
    const int64_t cap = (int64_t)(sms > 0 ? sms : 1) * 16; /* grid-stride beyond that */
    return (unsigned)(want < 1 ? 1 : want < cap ? want : cap);
}

/* 32-bit indices when the largest index, plus one grid stride, stays below 2^32. */
static bool small_index(sg_ctx *ctx, int64_t total)
{
    return total + (int64_t)grid_for(ctx, total) * ATTN_THREADS < ((int64_t)1 << 32);
}

template <typename Tio>
static sg_status launch_split(sg_ctx *ctx, const Tio *qkv, const Tio *dout, float *dst,
                              sg_attn_dims d, int nmat)
{
    const int64_t total = nmat * d.B * d.T * d.C;
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    if (small_index(ctx, total))
        split_heads_kernel<Tio, uint32_t><<<grid_for(ctx, total), ATTN_THREADS, 0, st>>>(
            qkv, dout, dst, (uint32_t)d.B, (uint32_t)d.T, (uint32_t)d.C, (uint32_t)d.H,
            (uint32_t)d.hs, (uint32_t)nmat);
    else
        split_heads_kernel<Tio, int64_t><<<grid_for(ctx, total), ATTN_THREADS, 0, st>>>(
            qkv, dout, dst, d.B, d.T, d.C, d.H, d.hs, (int64_t)nmat);
    SG_CUDA_CHECK_LAUNCH(ctx, "split_heads_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <typename Tio>
static sg_status launch_merge(sg_ctx *ctx, const float *m0, const float *m1, const float *m2,
                              Tio *dst, sg_attn_dims d, int nmat)
{
    const int64_t total = nmat * d.B * d.T * d.C;
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    if (small_index(ctx, total))
        merge_heads_kernel<Tio, uint32_t><<<grid_for(ctx, total), ATTN_THREADS, 0, st>>>(
            m0, m1, m2, dst, (uint32_t)d.B, (uint32_t)d.T, (uint32_t)d.C, (uint32_t)d.H,
            (uint32_t)d.hs, (uint32_t)nmat);
    else
        merge_heads_kernel<Tio, int64_t><<<grid_for(ctx, total), ATTN_THREADS, 0, st>>>(
            m0, m1, m2, dst, d.B, d.T, d.C, d.H, d.hs, (int64_t)nmat);
    SG_CUDA_CHECK_LAUNCH(ctx, "merge_heads_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

static unsigned softmax_blocks(sg_attn_dims d)
{
    return (unsigned)((d.B * d.H * d.T + ATTN_WARPS - 1) / ATTN_WARPS);
}

/* cuBLAS takes int sizes, and the softmax grid counts rows in blocks of ATTN_WARPS. */
static sg_status check_limits(sg_ctx *ctx, const char *fn, sg_attn_dims d)
{
    if (d.T > INT_MAX || d.hs > INT_MAX || d.B * d.H > INT_MAX || d.B * d.H * d.T > INT_MAX)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "%s: B=%lld T=%lld heads=%lld hs=%lld exceed the CUDA path's limits (T, hs, "
                       "B*heads and B*heads*T must each fit in an int)",
                       fn, (long long)d.B, (long long)d.T, (long long)d.H, (long long)d.hs);
    return SG_OK;
}

/* The work regions (see the file comment). */
typedef struct attn_regions {
    float *q, *k, *v, *y, *s;
} attn_regions;

static attn_regions regions(sg_tensor *work, sg_attn_dims d)
{
    float *w = (float *)work->data;
    const int64_t n = d.B * d.T * d.C;
    attn_regions r = {w, w + n, w + 2 * n, w + 3 * n, w + 4 * n};
    return r;
}

template <typename Tio>
static sg_status forward(sg_ctx *ctx, const Tio *qkv, Tio *out, Tio *att, sg_tensor *work,
                         sg_attn_dims d)
{
    static const char fn[] = "sg_attention_forward";
    cublasHandle_t h;
    SG_TRY(blas_get(ctx, fn, &h));
    const attn_regions r = regions(work, d);
    const int64_t T = d.T, hs = d.hs, BH = d.B * d.H, Thd = T * hs, TT = T * T;
    const float scale = (float)(1.0 / sqrt((double)hs));
    static_assert(sizeof(Tio) == sizeof(float), "bf16: the GEMMs that read att need GemmEx");

    SG_TRY(launch_split<Tio>(ctx, qkv, (const Tio *)NULL, r.q, d, 3));
    /* scores (T,T) = q k^T: column-major S^T (T x T) = op_T(k^T) q^T, i.e. A = k (hs x T
     * column-major, transposed), B = q (hs x T, as is). */
    SG_TRY(gemm(ctx, h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, r.k, hs, Thd, r.q, hs, Thd, r.s, T,
                TT, BH));
    softmax_forward_kernel<Tio><<<softmax_blocks(d), ATTN_THREADS, 0,
                                  (cudaStream_t)sg_ctx_stream(ctx)>>>(r.s, att, BH * T, (int)T,
                                                                      scale);
    SG_CUDA_CHECK_LAUNCH(ctx, "softmax_forward_kernel");
    sg_ctx_count_launches(ctx, 1);
    /* y (T,hs) = att v: column-major y^T (hs x T) = v^T att^T, both stored that way. */
    SG_TRY(gemm(ctx, h, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, r.v, hs, Thd, (const float *)att, T,
                TT, r.y, hs, Thd, BH));
    return launch_merge<Tio>(ctx, r.y, NULL, NULL, out, d, 1);
}

template <typename Tio>
static sg_status backward(sg_ctx *ctx, const Tio *qkv, const Tio *att, const Tio *dout, Tio *dqkv,
                          sg_tensor *work, sg_attn_dims d)
{
    static const char fn[] = "sg_attention_backward";
    cublasHandle_t h;
    SG_TRY(blas_get(ctx, fn, &h));
    const attn_regions r = regions(work, d);
    const int64_t T = d.T, hs = d.hs, BH = d.B * d.H, Thd = T * hs, TT = T * T;
    const float scale = (float)(1.0 / sqrt((double)hs));
    static_assert(sizeof(Tio) == sizeof(float), "bf16: the GEMMs that read att need GemmEx");
    const float *p = (const float *)att;

    /* q, k, v and dout's heads (into y) in one launch. */
    SG_TRY(launch_split<Tio>(ctx, qkv, dout, r.q, d, 4));
    /* datt (T,T) = dh v^T: as the forward's scores, with k -> v, q -> dh. */
    SG_TRY(gemm(ctx, h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, r.v, hs, Thd, r.y, hs, Thd, r.s, T,
                TT, BH));
    /* dv (T,hs) = att^T dh: column-major dv^T (hs x T) = dh^T att, att stored as att^T so
     * op T. v was last read by the GEMM above: dv takes its place. */
    SG_TRY(gemm(ctx, h, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, r.y, hs, Thd, p, T, TT, r.v, hs, Thd,
                BH));
    softmax_backward_kernel<Tio><<<softmax_blocks(d), ATTN_THREADS, 0,
                                   (cudaStream_t)sg_ctx_stream(ctx)>>>(att, r.s, BH * T, (int)T,
                                                                       scale);
    SG_CUDA_CHECK_LAUNCH(ctx, "softmax_backward_kernel");
    sg_ctx_count_launches(ctx, 1);
    /* dq (T,hs) = dpre k: as the forward's att v. dh is dead: dq takes y. */
    SG_TRY(gemm(ctx, h, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, r.k, hs, Thd, r.s, T, TT, r.y, hs, Thd,
                BH));
    /* dk (T,hs) = dpre^T q: as dv. k is dead once dq is done: dk takes its place. */
    SG_TRY(gemm(ctx, h, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, r.q, hs, Thd, r.s, T, TT, r.k, hs, Thd,
                BH));
    return launch_merge<Tio>(ctx, r.y, r.k, r.v, dqkv, d, 3);
}

/* ---- entry points (arguments checked by attention.c) ---- */

extern "C" sg_status sg_attention_forward_cuda(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                               sg_tensor *att, sg_tensor *work, sg_attn_dims d)
{
    SG_TRY(check_limits(ctx, "sg_attention_forward", d));
    switch (qkv->dtype) {
    case SG_DTYPE_F32:
        return forward<float>(ctx, (const float *)qkv->data, (float *)out->data,
                              (float *)att->data, work, d);
    default:
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_attention_forward: 'qkv' is %s; CUDA takes f32",
                       sg_dtype_name(qkv->dtype));
    }
}

extern "C" sg_status sg_attention_backward_cuda(sg_ctx *ctx, const sg_tensor *qkv,
                                                const sg_tensor *att, const sg_tensor *dout,
                                                sg_tensor *dqkv, sg_tensor *work, sg_attn_dims d)
{
    SG_TRY(check_limits(ctx, "sg_attention_backward", d));
    switch (qkv->dtype) {
    case SG_DTYPE_F32:
        return backward<float>(ctx, (const float *)qkv->data, (const float *)att->data,
                               (const float *)dout->data, (float *)dqkv->data, work, d);
    default:
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "sg_attention_backward: 'qkv' is %s; CUDA takes f32",
                       sg_dtype_name(qkv->dtype));
    }
}
