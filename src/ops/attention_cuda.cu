/* attention_cuda.cu: causal self-attention on the GPU, f32 or bf16, in the manner of llm.c's
 * cuBLAS attention: a permute kernel splits heads out of qkv, cuBLAS strided-batched GEMMs (one
 * batch per (b, h)) do the products, one warp per row does the masked softmax, and an unpermute
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
 * bf16 (Tio = __nv_bfloat16) keeps the same regions. What the GEMMs read (q, k, v, dout's
 * heads, and d(scores)) is bf16, in the first half of its region's bytes; what they write
 * (scores, y, datt, dv, dq, dk) is f32 over the whole region, as in the f32 path, so the
 * softmax works in fp32 and each output is rounded to bf16 once, by the kernel that stores
 * it. d(scores) is written in bf16 over the f32 datt it comes from, row r of it in the first
 * half of row r's bytes (leading dimension 2T bf16), which the softmax backward makes safe.
 * att is bf16 (attention.h says why), so both GEMMs that read it are bf16 x bf16.
 *
 * cuBLAS: one handle per context, created on first use (outside capture), kept in ext slot
 * SG_EXT_ATTENTION, bound once to the context's stream and then to its workspace (in that
 * order: cublasSetStream resets the workspace), default math mode: fp32 FMA, no TF32, as the
 * linear layer's cuBLASLt matmuls (TF32 where the context asks: sg_ctx_tf32). GEMMs are written
 * in column-major terms: a row-major (R,C) matrix is a column-major C x R one with leading
 * dimension C.
 *
 * f32 GEMMs are cublasSgemmStridedBatched; bf16 ones cublasGemmStridedBatchedEx with bf16 A and
 * B, f32 C, CUBLAS_COMPUTE_32F (fp32 accumulation; tensor cores). */
#include "ops/attention.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>

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
    attn_blas *b = (attn_blas *)sg_ctx_ext(ctx, SG_EXT_ATTENTION);
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
    if (s == CUBLAS_STATUS_SUCCESS) { /* the f32 GEMMs in TF32 where the context asks (sg_ctx_tf32) */
        const bool tf32 = sg_ctx_tf32(ctx);
        call = tf32 ? "cublasSetMathMode(CUBLAS_TF32_TENSOR_OP_MATH)" : "cublasSetMathMode(CUBLAS_DEFAULT_MATH)";
        s = cublasSetMathMode(b->handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        blas_free(ctx, b);
        return sg_cublas_status(ctx, (int)s, call, __FILE__, __LINE__);
    }
    sg_ctx_set_ext(ctx, SG_EXT_ATTENTION, b, blas_free);
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

/* The same with bf16 A and B: products exact in fp32, fp32 accumulation, C in f32. */
static sg_status gemm(sg_ctx *ctx, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                      int64_t m, int64_t n, int64_t k, const __nv_bfloat16 *A, int64_t lda,
                      int64_t sa, const __nv_bfloat16 *B, int64_t ldb, int64_t sb, float *C,
                      int64_t ldc, int64_t sc, int64_t batch)
{
    const float one = 1.f, zero = 0.f;
    SG_CUBLAS_CHECK(ctx, cublasGemmStridedBatchedEx(
                             h, ta, tb, (int)m, (int)n, (int)k, &one, A, CUDA_R_16BF, (int)lda,
                             (long long)sa, B, CUDA_R_16BF, (int)ldb, (long long)sb, &zero, C,
                             CUDA_R_32F, (int)ldc, (long long)sc, (int)batch, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT));
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* ---- element access: f32 or bf16 storage, f32 math; stores round to nearest even ---- */

__device__ __forceinline__ float ld_f32(const float *p) { return *p; }
__device__ __forceinline__ float ld_f32(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st_f32(float *p, float v) { *p = v; }
__device__ __forceinline__ void st_f32(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* ---- permutes ---- */

/* Index math in I: 32-bit unsigned where every index fits (integer division is several
 * times cheaper than 64-bit), int64_t otherwise. */

/* dst: nmat matrices (B,H,T,hs), matrix m at dst + m * mstride (f32: mstride = B*T*C, one
 * after another; bf16: the start of each work region). Matrices 0..2 come from q, k, v of
 * qkv (B,T,3C); matrix 3 (nmat = 4) from dout (B,T,C). A copy in the I/O type (no rounding).
 * Writes are contiguous, reads contiguous along each head's hs columns. */
template <typename Tio, typename I>
__global__ void split_heads_kernel(const Tio *__restrict__ qkv, const Tio *__restrict__ dout,
                                   Tio *__restrict__ dst, I B, I T, I C, I H, I hs, I nmat,
                                   I mstride)
{
    const I n1 = B * T * C, total = n1 * nmat, stride = (I)gridDim.x * blockDim.x;
    for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const I mat = idx / n1;
        I r = idx - mat * n1;
        Tio *out = dst + (mat * mstride + r);
        const I i = r % hs;
        r /= hs;
        const I t = r % T;
        r /= T;
        const I h = r % H, b = r / H;
        const I col = h * hs + i;
        *out = mat < 3 ? qkv[(b * T + t) * 3 * C + mat * C + col] : dout[(b * T + t) * C + col];
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

/* In place on d: datt (f32) in, d(scores) out: ds[s] = scale * att[s] * (d[s] - sum_r att[r]
 * d[r]) for s <= t, 0 above the diagonal (the mask passes no gradient). ds is stored in Tio,
 * row `row` at the start of d's row `row`: f32 over the same elements; bf16 in the first half
 * of the row's bytes (leading dimension 2T bf16), so ds[s] overwrites f32 d[s/2]. The row is
 * swept in chunks of 32 with a __syncwarp between a chunk's reads and its writes: chunk j
 * writes over f32 elements below 16j + 16, which chunks <= j have read, and no later chunk
 * reads. The sum is complete (after the shuffles) before any write. */
template <typename Tio>
__global__ void __launch_bounds__(ATTN_THREADS)
softmax_backward_kernel(const Tio *__restrict__ att, float *d, int64_t rows, int T, float scale)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * ATTN_WARPS + (threadIdx.x >> 5);
    if (row >= rows) return; /* the whole warp: every lane below runs the same chunks */
    const int t = (int)(row % T);
    const Tio *p = att + row * T;
    const float *g = d + row * T;
    Tio *ds = reinterpret_cast<Tio *>(d + row * T);
    float acc = 0.f;
    for (int s = lane; s <= t; s += 32) acc += ld_f32(&p[s]) * g[s];
    const float sum = warp_sum(acc);
    for (int s0 = 0; s0 < T; s0 += 32) {
        const int s = s0 + lane;
        float v = 0.f;
        if (s < T) v = s <= t ? scale * ld_f32(&p[s]) * (g[s] - sum) : 0.f;
        if (sizeof(Tio) < sizeof(float)) __syncwarp(); /* f32 writes only what this lane read */
        if (s < T) st_f32(&ds[s], v);
    }
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

/* The work regions' bf16 copies: one region apart (N f32 = 2N bf16); f32 ones: N apart. */
template <typename Tio>
static sg_status launch_split(sg_ctx *ctx, const Tio *qkv, const Tio *dout, Tio *dst,
                              sg_attn_dims d, int nmat)
{
    const int64_t n1 = d.B * d.T * d.C, total = nmat * n1;
    const int64_t mstride = n1 * (int64_t)(sizeof(float) / sizeof(Tio));
    const int64_t reach = (nmat - 1) * mstride + n1; /* one past the last element written */
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    if (small_index(ctx, total > reach ? total : reach))
        split_heads_kernel<Tio, uint32_t><<<grid_for(ctx, total), ATTN_THREADS, 0, st>>>(
            qkv, dout, dst, (uint32_t)d.B, (uint32_t)d.T, (uint32_t)d.C, (uint32_t)d.H,
            (uint32_t)d.hs, (uint32_t)nmat, (uint32_t)mstride);
    else
        split_heads_kernel<Tio, int64_t><<<grid_for(ctx, total), ATTN_THREADS, 0, st>>>(
            qkv, dout, dst, d.B, d.T, d.C, d.H, d.hs, (int64_t)nmat, mstride);
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

/* cuBLAS takes int sizes (bf16 d(scores) has leading dimension 2T), and the softmax grid
 * counts rows in blocks of ATTN_WARPS. */
static sg_status check_limits(sg_ctx *ctx, const char *fn, sg_attn_dims d, sg_dtype dt)
{
    const int64_t ld = dt == SG_DTYPE_BF16 ? 2 * d.T : d.T;
    if (ld > INT_MAX || d.hs > INT_MAX || d.B * d.H > INT_MAX || d.B * d.H * d.T > INT_MAX)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "%s: B=%lld T=%lld heads=%lld hs=%lld exceed the CUDA path's limits (T "
                       "(2T for bf16), hs, B*heads and B*heads*T must each fit in an int)",
                       fn, (long long)d.B, (long long)d.T, (long long)d.H, (long long)d.hs);
    return SG_OK;
}

/* The work regions (see the file comment), as f32. */
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

/* A region's first bytes as Tio: where the GEMMs' inputs (q, k, v, dout's heads) live. */
template <typename Tio> static Tio *as_io(float *region)
{
    return reinterpret_cast<Tio *>(region);
}

template <typename Tio>
static sg_status forward(sg_ctx *ctx, const Tio *qkv, Tio *out, Tio *att, sg_tensor *work,
                         sg_attn_dims d)
{
    static const char fn[] = "sg_attention_forward";
    cublasHandle_t h;
    SG_TRY(blas_get(ctx, fn, &h));
    const attn_regions r = regions(work, d);
    const Tio *q = as_io<Tio>(r.q), *k = as_io<Tio>(r.k), *v = as_io<Tio>(r.v);
    const int64_t T = d.T, hs = d.hs, BH = d.B * d.H, Thd = T * hs, TT = T * T;
    const float scale = (float)(1.0 / sqrt((double)hs));

    SG_TRY(launch_split<Tio>(ctx, qkv, (const Tio *)NULL, as_io<Tio>(r.q), d, 3));
    /* scores (T,T) = q k^T: column-major S^T (T x T) = op_T(k^T) q^T, i.e. A = k (hs x T
     * column-major, transposed), B = q (hs x T, as is). */
    SG_TRY(gemm(ctx, h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, k, hs, Thd, q, hs, Thd, r.s, T, TT,
                BH));
    softmax_forward_kernel<Tio><<<softmax_blocks(d), ATTN_THREADS, 0,
                                  (cudaStream_t)sg_ctx_stream(ctx)>>>(r.s, att, BH * T, (int)T,
                                                                      scale);
    SG_CUDA_CHECK_LAUNCH(ctx, "softmax_forward_kernel");
    sg_ctx_count_launches(ctx, 1);
    /* y (T,hs) = att v: column-major y^T (hs x T) = v^T att^T, both stored that way. */
    SG_TRY(gemm(ctx, h, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, v, hs, Thd, (const Tio *)att, T, TT,
                r.y, hs, Thd, BH));
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
    const Tio *q = as_io<Tio>(r.q), *k = as_io<Tio>(r.k), *v = as_io<Tio>(r.v);
    const Tio *dh = as_io<Tio>(r.y), *ds = as_io<Tio>(r.s);
    const int64_t T = d.T, hs = d.hs, BH = d.B * d.H, Thd = T * hs, TT = T * T;
    /* d(scores) as the softmax backward leaves it: f32 in place; bf16 rows 2T apart. */
    const int64_t per = (int64_t)(sizeof(float) / sizeof(Tio)), lds = per * T, sds = per * TT;
    const float scale = (float)(1.0 / sqrt((double)hs));

    /* q, k, v and dout's heads (into y) in one launch. */
    SG_TRY(launch_split<Tio>(ctx, qkv, dout, as_io<Tio>(r.q), d, 4));
    /* datt (T,T) = dh v^T: as the forward's scores, with k -> v, q -> dh. */
    SG_TRY(gemm(ctx, h, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, v, hs, Thd, dh, hs, Thd, r.s, T, TT,
                BH));
    /* dv (T,hs) = att^T dh: column-major dv^T (hs x T) = dh^T att, att stored as att^T so
     * op T. v was last read by the GEMM above: dv takes its place. */
    SG_TRY(gemm(ctx, h, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, dh, hs, Thd, att, T, TT, r.v, hs, Thd,
                BH));
    softmax_backward_kernel<Tio><<<softmax_blocks(d), ATTN_THREADS, 0,
                                   (cudaStream_t)sg_ctx_stream(ctx)>>>(att, r.s, BH * T, (int)T,
                                                                       scale);
    SG_CUDA_CHECK_LAUNCH(ctx, "softmax_backward_kernel");
    sg_ctx_count_launches(ctx, 1);
    /* dq (T,hs) = dpre k: as the forward's att v. dh is dead: dq takes y. */
    SG_TRY(gemm(ctx, h, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, k, hs, Thd, ds, lds, sds, r.y, hs, Thd,
                BH));
    /* dk (T,hs) = dpre^T q: as dv. k is dead once dq is done: dk takes its place. */
    SG_TRY(gemm(ctx, h, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, q, hs, Thd, ds, lds, sds, r.k, hs, Thd,
                BH));
    return launch_merge<Tio>(ctx, r.y, r.k, r.v, dqkv, d, 3);
}

/* ---- entry points (arguments checked by attention.c) ---- */

extern "C" sg_status sg_attention_forward_cuda(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                               sg_tensor *att, sg_tensor *work, sg_attn_dims d)
{
    SG_TRY(check_limits(ctx, "sg_attention_forward", d, qkv->dtype));
    switch (qkv->dtype) {
    case SG_DTYPE_F32:
        return forward<float>(ctx, (const float *)qkv->data, (float *)out->data,
                              (float *)att->data, work, d);
    case SG_DTYPE_BF16:
        return forward<__nv_bfloat16>(ctx, (const __nv_bfloat16 *)qkv->data,
                                      (__nv_bfloat16 *)out->data, (__nv_bfloat16 *)att->data,
                                      work, d);
    default:
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "sg_attention_forward: 'qkv' is %s; CUDA takes f32 or bf16",
                       sg_dtype_name(qkv->dtype));
    }
}

extern "C" sg_status sg_attention_backward_cuda(sg_ctx *ctx, const sg_tensor *qkv,
                                                const sg_tensor *att, const sg_tensor *dout,
                                                sg_tensor *dqkv, sg_tensor *work, sg_attn_dims d)
{
    SG_TRY(check_limits(ctx, "sg_attention_backward", d, qkv->dtype));
    switch (qkv->dtype) {
    case SG_DTYPE_F32:
        return backward<float>(ctx, (const float *)qkv->data, (const float *)att->data,
                               (const float *)dout->data, (float *)dqkv->data, work, d);
    case SG_DTYPE_BF16:
        return backward<__nv_bfloat16>(ctx, (const __nv_bfloat16 *)qkv->data,
                                       (const __nv_bfloat16 *)att->data,
                                       (const __nv_bfloat16 *)dout->data,
                                       (__nv_bfloat16 *)dqkv->data, work, d);
    default:
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "sg_attention_backward: 'qkv' is %s; CUDA takes f32 or bf16",
                       sg_dtype_name(qkv->dtype));
    }
}
