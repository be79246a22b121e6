/* attention_fused_cuda.cu: fused causal attention on the GPU for bf16 and head size 64 (the
 * flash-attention scheme: online softmax over key tiles, no (T, T) matrix in memory), forward
 * and backward, on the tensor cores through mma.sync m16n8k16 (bf16 operands, f32
 * accumulation). q, k and v are read straight from the qkv projection's (B*T, 3C) rows and
 * the output written in the (B*T, C) rows the next projection reads: no split or merge kernel.
 *
 * Tiles of 64 query rows by 64 keys; a block of 4 warps, each warp 16 rows of the tile. Each
 * tile is read once into shared memory, row-major (16-byte loads), and the B fragments of the
 * products are taken from it with ldmatrix (.trans where the tile's rows are the product's sum
 * index); a product's f32 result becomes the next product's A fragment in registers. The
 * forward keeps each row's running max and sum in registers (a row's 64 scores are spread over
 * the 4 threads of a quad) and saves lse = max + log(sum) for the backward. The backward is two
 * kernels and no atomics, so it is deterministic: one per query tile (dq, and delta = dout .
 * out for each row, written for the next kernel), one per key tile (dk and dv), each
 * recomputing the probabilities from lse. P and d(scores) are rounded to bf16 before the
 * products that read them, as flash attention and PyTorch's autocast do. */
#include "ops/attention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

#define FA_TILE 64   /* query rows and keys per tile */
#define FA_HS 64     /* the head size these kernels take */
#define FA_LD 72     /* shared-memory row stride, bf16 elements: 144 bytes, conflict-free frags */
#define FA_THREADS 128
#define FA_LOG2E 1.4426950408889634f

/* c (16x8, f32) += a (16x16, bf16, row) b (16x8, bf16, col). */
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t ld32(const bf16 *p) { return *reinterpret_cast<const uint32_t *>(p); }

__device__ __forceinline__ uint32_t pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Rows r0..r0+63 of a (rows, ld) bf16 matrix, columns 0..63 from src, into s (64 x FA_LD),
 * row-major; rows at or past n are zero. 16-byte loads. */
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *src, int64_t ld, int r0, int n)
{
    for (int i = threadIdx.x; i < FA_TILE * 8; i += FA_THREADS) {
        int r = i >> 3, c = (i & 7) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r0 + r < n) v = *reinterpret_cast<const uint4 *>(src + (int64_t)(r0 + r) * ld + c);
        *reinterpret_cast<uint4 *>(s + r * FA_LD + c) = v;
    }
}

/* Four 8x8 b16 matrices from shared memory (ldmatrix): lane l gives the address of row l % 8
 * of matrix l / 8; r[i] is matrix i's fragment (trans: of its transpose). */
__device__ __forceinline__ void ldsm4(uint32_t r[4], const bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldsm4_t(uint32_t r[4], const bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* A fragments of the warp's 16 rows (from row r0 of a row-major tile s), 4 steps of 16 columns. */
__device__ __forceinline__ void load_a(uint32_t a[4][4], const bf16 *s, int r0, int g, int t4)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const bf16 *p = s + (r0 + g) * FA_LD + kk * 16 + 2 * t4;
        a[kk][0] = ld32(p), a[kk][1] = ld32(p + 8 * FA_LD), a[kk][2] = ld32(p + 8), a[kk][3] = ld32(p + 8 * FA_LD + 8);
    }
}

/* acc (16 x 64: 8 tiles of 8 columns) = a (16 x 64) times b^T, b a row-major (64 x 64) tile
 * whose rows are acc's columns: b's 8x8 blocks are the B fragments as they lie. */
__device__ __forceinline__ void mm_abt(float acc[8][4], const uint32_t a[4][4], const bf16 *b, int lane)
{
    const int i = lane >> 3, r = lane & 7;
#pragma unroll
    for (int n = 0; n < 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
    for (int np = 0; np < 4; np++)
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t f[4];
            ldsm4(f, b + (np * 16 + r + 8 * (i >> 1)) * FA_LD + kk * 16 + 8 * (i & 1));
            mma_bf16(acc[2 * np], a[kk], f[0], f[1]);
            mma_bf16(acc[2 * np + 1], a[kk], f[2], f[3]);
        }
}

/* acc (16 x 64) += x (16 x 64 f32 in C-fragment layout, rounded to bf16 as the A operand)
 * times b, a row-major (64 x 64) tile whose rows are the sum's index: b's 8x8 blocks
 * transposed (ldmatrix .trans) are the B fragments. */
__device__ __forceinline__ void mm_add(float acc[8][4], const float x[8][4], const bf16 *b, int lane)
{
    const int i = lane >> 3, r = lane & 7;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4] = {pack(x[2 * kk][0], x[2 * kk][1]), pack(x[2 * kk][2], x[2 * kk][3]),
                         pack(x[2 * kk + 1][0], x[2 * kk + 1][1]), pack(x[2 * kk + 1][2], x[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < 4; np++) {
            uint32_t f[4];
            ldsm4_t(f, b + (kk * 16 + r + 8 * (i & 1)) * FA_LD + np * 16 + 8 * (i >> 1));
            mma_bf16(acc[2 * np], a, f[0], f[1]);
            mma_bf16(acc[2 * np + 1], a, f[2], f[3]);
        }
    }
}

/* Writes the warp's (16 x 64) f32 fragment times scale as bf16 into rows row0.. of dst (ld
 * columns apart; rows at or past n skipped). */
__device__ __forceinline__ void store_rows(bf16 *dst, int64_t ld, const float acc[8][4], float scale, int row0,
                                           int n, int g, int t4)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + g + 8 * r;
        if (row >= n) continue;
#pragma unroll
        for (int c = 0; c < 8; c++)
            *reinterpret_cast<__nv_bfloat162 *>(dst + (int64_t)row * ld + c * 8 + 2 * t4) =
                __floats2bfloat162_rn(acc[c][2 * r] * scale, acc[c][2 * r + 1] * scale);
    }
}

/* grid (query tiles, B*H). out (B*T, C); lse (B, H, T). sl2 = log2(e) / sqrt(hs). */
__global__ void __launch_bounds__(FA_THREADS) fused_fwd_kernel(const bf16 *__restrict__ qkv, bf16 *__restrict__ out,
                                                               float *__restrict__ lse, int T, int H, int C, float sl2)
{
    __shared__ __align__(16) bf16 ks[FA_TILE * FA_LD], vs[FA_TILE * FA_LD];
    const int qt = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t ld = 3 * (int64_t)C;
    const bf16 *base = qkv + (int64_t)b * T * ld + h * FA_HS;
    const int q0 = qt * FA_TILE, r0 = warp * 16;
    const int qrow[2] = {q0 + r0 + g, q0 + r0 + g + 8};

    uint32_t qa[4][4];
    load_tile(ks, base, ld, q0, T);
    __syncthreads();
    load_a(qa, ks, r0, g, t4);
    float o[8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, s[8][4];
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads(); /* the last tile's readers are done */
        load_tile(ks, base + C, ld, kt * FA_TILE, T);
        load_tile(vs, base + 2 * C, ld, kt * FA_TILE, T);
        __syncthreads();
        mm_abt(s, qa, ks, lane);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = kt * FA_TILE + n * 8 + 2 * t4 + (e & 1), r = e >> 1;
                s[n][e] = key <= qrow[r] && key < T ? s[n][e] * sl2 : -INFINITY;
                mx[r] = fmaxf(mx[r], s[n][e]);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mn = fmaxf(m[r], mx[r]), alpha = exp2f(m[r] - mn);
            m[r] = mn, l[r] *= alpha;
#pragma unroll
            for (int n = 0; n < 8; n++) o[n][2 * r] *= alpha, o[n][2 * r + 1] *= alpha;
        }
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[n][e] = exp2f(s[n][e] - m[e >> 1]);
                l[e >> 1] += s[n][e];
            }
        mm_add(o, s, vs, lane);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    const float inv[2] = {1.f / l[0], 1.f / l[1]};
#pragma unroll
    for (int n = 0; n < 8; n++) o[n][0] *= inv[0], o[n][1] *= inv[0], o[n][2] *= inv[1], o[n][3] *= inv[1];
    store_rows(out + (int64_t)b * T * C + h * FA_HS, C, o, 1.f, q0 + r0, T, g, t4);
    if (t4 == 0)
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (qrow[r] < T) lse[(int64_t)bh * T + qrow[r]] = (m[r] + log2f(l[r])) / FA_LOG2E;
}

/* dq for a query tile, and delta = dout . out of its rows (for the key-tile kernel).
 * grid (query tiles, B*H). */
__global__ void __launch_bounds__(FA_THREADS) fused_bwd_dq_kernel(const bf16 *__restrict__ qkv,
                                                                  const bf16 *__restrict__ out,
                                                                  const float *__restrict__ lse,
                                                                  const bf16 *__restrict__ dout,
                                                                  bf16 *__restrict__ dqkv, float *__restrict__ delta,
                                                                  int T, int H, int C, float sl2, float scale)
{
    __shared__ __align__(16) bf16 ks[FA_TILE * FA_LD], vs[FA_TILE * FA_LD];
    __shared__ float dsh[FA_TILE];
    const int qt = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t ld = 3 * (int64_t)C;
    const bf16 *base = qkv + (int64_t)b * T * ld + h * FA_HS;
    const bf16 *gbase = dout + (int64_t)b * T * C + h * FA_HS, *obase = out + (int64_t)b * T * C + h * FA_HS;
    const int q0 = qt * FA_TILE, r0 = warp * 16;
    const int qrow[2] = {q0 + r0 + g, q0 + r0 + g + 8};

    uint32_t qa[4][4], ga[4][4];
    load_tile(ks, base, ld, q0, T);
    load_tile(vs, gbase, C, q0, T);
    if (threadIdx.x < FA_TILE) { /* delta of row threadIdx.x, from the bf16 values as stored */
        float acc = 0.f;
        const int row = q0 + threadIdx.x;
        if (row < T)
            for (int c = 0; c < FA_HS; c += 8) {
                uint4 gv = *reinterpret_cast<const uint4 *>(gbase + (int64_t)row * C + c);
                uint4 ov = *reinterpret_cast<const uint4 *>(obase + (int64_t)row * C + c);
                const bf16 *ge = reinterpret_cast<const bf16 *>(&gv), *oe = reinterpret_cast<const bf16 *>(&ov);
#pragma unroll
                for (int j = 0; j < 8; j++) acc += __bfloat162float(ge[j]) * __bfloat162float(oe[j]);
            }
        dsh[threadIdx.x] = acc;
        if (row < T) delta[(int64_t)bh * T + row] = acc;
    }
    __syncthreads();
    load_a(qa, ks, r0, g, t4);
    load_a(ga, vs, r0, g, t4);
    float lr[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lr[r] = qrow[r] < T ? lse[(int64_t)bh * T + qrow[r]] * FA_LOG2E : 0.f;
        dl[r] = dsh[r0 + g + 8 * r];
    }
    float dq[8][4] = {}, s[8][4], dp[8][4];
    for (int kt = 0; kt <= qt; kt++) {
        __syncthreads();
        load_tile(ks, base + C, ld, kt * FA_TILE, T);
        load_tile(vs, base + 2 * C, ld, kt * FA_TILE, T);
        __syncthreads();
        mm_abt(s, qa, ks, lane);
        mm_abt(dp, ga, vs, lane);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = kt * FA_TILE + n * 8 + 2 * t4 + (e & 1), r = e >> 1;
                float p = key <= qrow[r] && key < T ? exp2f(s[n][e] * sl2 - lr[r]) : 0.f;
                s[n][e] = p * (dp[n][e] - dl[r]);
            }
        mm_add(dq, s, ks, lane);
    }
    store_rows(dqkv + (int64_t)b * T * ld + h * FA_HS, ld, dq, scale, q0 + r0, T, g, t4);
}

/* dk and dv for a key tile, over the query tiles at and after it. grid (key tiles, B*H). */
__global__ void __launch_bounds__(FA_THREADS) fused_bwd_dkv_kernel(const bf16 *__restrict__ qkv,
                                                                   const float *__restrict__ lse,
                                                                   const bf16 *__restrict__ dout,
                                                                   const float *__restrict__ delta,
                                                                   bf16 *__restrict__ dqkv, int T, int H, int C,
                                                                   float sl2, float scale)
{
    __shared__ __align__(16) bf16 qs[FA_TILE * FA_LD], gs[FA_TILE * FA_LD];
    __shared__ float lsh[FA_TILE], dsh[FA_TILE];
    const int kt = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t ld = 3 * (int64_t)C;
    const bf16 *base = qkv + (int64_t)b * T * ld + h * FA_HS, *gbase = dout + (int64_t)b * T * C + h * FA_HS;
    const int k0 = kt * FA_TILE, r0 = warp * 16;
    const int key[2] = {k0 + r0 + g, k0 + r0 + g + 8};

    uint32_t ka[4][4], va[4][4];
    load_tile(qs, base + C, ld, k0, T);
    load_tile(gs, base + 2 * C, ld, k0, T);
    __syncthreads();
    load_a(ka, qs, r0, g, t4);
    load_a(va, gs, r0, g, t4);
    float dk[8][4] = {}, dv[8][4] = {}, s[8][4], dp[8][4];
    const int nq = (T + FA_TILE - 1) / FA_TILE;
    for (int qt = kt; qt < nq; qt++) {
        const int q0 = qt * FA_TILE;
        __syncthreads();
        load_tile(qs, base, ld, q0, T);
        load_tile(gs, gbase, C, q0, T);
        if (threadIdx.x < FA_TILE) {
            bool in = q0 + (int)threadIdx.x < T;
            lsh[threadIdx.x] = in ? lse[(int64_t)bh * T + q0 + threadIdx.x] * FA_LOG2E : 0.f;
            dsh[threadIdx.x] = in ? delta[(int64_t)bh * T + q0 + threadIdx.x] : 0.f;
        }
        __syncthreads();
        mm_abt(s, ka, qs, lane);  /* scores^T: the warp's keys by the tile's queries */
        mm_abt(dp, va, gs, lane); /* (dout v^T)^T */
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = n * 8 + 2 * t4 + (e & 1), q = q0 + c, r = e >> 1;
                float p = q >= key[r] && q < T ? exp2f(s[n][e] * sl2 - lsh[c]) : 0.f;
                s[n][e] = p;
                dp[n][e] = p * (dp[n][e] - dsh[c]);
            }
        mm_add(dv, s, gs, lane);
        mm_add(dk, dp, qs, lane);
    }
    bf16 *dbase = dqkv + (int64_t)b * T * ld + h * FA_HS;
    store_rows(dbase + C, ld, dk, scale, k0 + r0, T, g, t4);
    store_rows(dbase + 2 * C, ld, dv, 1.f, k0 + r0, T, g, t4);
}

/* ---- entry points (arguments checked by attention.c) ---- */

/* The shapes and alignment these kernels take; SG_ERR_UNSUPPORTED naming what differs. */
static sg_status check_fused(sg_ctx *ctx, const char *fn, const sg_tensor *qkv, sg_attn_dims d,
                             const sg_tensor *const *ts, int n)
{
    if (qkv->dtype != SG_DTYPE_BF16 || d.hs != FA_HS)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: CUDA runs the fused attention for bf16 and head size %d; "
                       "this is %s with head size %lld (use sg_attention_forward)", fn, FA_HS,
                       sg_dtype_name(qkv->dtype), (long long)d.hs);
    if (d.T > INT32_MAX / 2 || d.C > INT32_MAX / 4 || d.B * d.H > 65535)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: B %lld x heads %lld, T %lld, C %lld: past the kernels' "
                       "limits (B x heads <= 65535)", fn, (long long)d.B, (long long)d.H, (long long)d.T,
                       (long long)d.C);
    for (int i = 0; i < n; i++)
        if ((uintptr_t)ts[i]->data % 16)
            return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: '%s' is not 16-byte aligned (the kernels read 16 "
                           "bytes at a time)", fn, ts[i]->name);
    return SG_OK;
}

extern "C" sg_status sg_attention_fused_forward_cuda(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                                     sg_tensor *lse, sg_attn_dims d)
{
    static const char fn[] = "sg_attention_fused_forward";
    const sg_tensor *ts[] = {qkv, out};
    SG_TRY(check_fused(ctx, fn, qkv, d, ts, 2));
    const float sl2 = (float)(FA_LOG2E / sqrt((double)d.hs));
    dim3 grid((unsigned)((d.T + FA_TILE - 1) / FA_TILE), (unsigned)(d.B * d.H));
    fused_fwd_kernel<<<grid, FA_THREADS, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (const bf16 *)qkv->data, (bf16 *)out->data, (float *)lse->data, (int)d.T, (int)d.H, (int)d.C, sl2);
    SG_CUDA_CHECK_LAUNCH(ctx, "fused_fwd_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

extern "C" sg_status sg_attention_fused_backward_cuda(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out,
                                                      const sg_tensor *lse, const sg_tensor *dout, sg_tensor *dqkv,
                                                      sg_tensor *delta, sg_attn_dims d)
{
    static const char fn[] = "sg_attention_fused_backward";
    const sg_tensor *ts[] = {qkv, out, dout, dqkv};
    SG_TRY(check_fused(ctx, fn, qkv, d, ts, 4));
    const double sc = 1.0 / sqrt((double)d.hs);
    const float sl2 = (float)(FA_LOG2E * sc), scale = (float)sc;
    dim3 grid((unsigned)((d.T + FA_TILE - 1) / FA_TILE), (unsigned)(d.B * d.H));
    cudaStream_t s = (cudaStream_t)sg_ctx_stream(ctx);
    fused_bwd_dq_kernel<<<grid, FA_THREADS, 0, s>>>((const bf16 *)qkv->data, (const bf16 *)out->data,
                                                    (const float *)lse->data, (const bf16 *)dout->data,
                                                    (bf16 *)dqkv->data, (float *)delta->data, (int)d.T, (int)d.H,
                                                    (int)d.C, sl2, scale);
    SG_CUDA_CHECK_LAUNCH(ctx, "fused_bwd_dq_kernel");
    fused_bwd_dkv_kernel<<<grid, FA_THREADS, 0, s>>>((const bf16 *)qkv->data, (const float *)lse->data,
                                                     (const bf16 *)dout->data, (const float *)delta->data,
                                                     (bf16 *)dqkv->data, (int)d.T, (int)d.H, (int)d.C, sl2, scale);
    SG_CUDA_CHECK_LAUNCH(ctx, "fused_bwd_dkv_kernel");
    sg_ctx_count_launches(ctx, 2);
    return SG_OK;
}
