/* attention_fused_cuda.cu: fused causal attention on the GPU for bf16 and head size 64 (the
 * flash-attention scheme: online softmax over key tiles, no (T, T) matrix in memory), forward
 * and backward, on the tensor cores through mma.sync m16n8k16 (bf16 operands, f32
 * accumulation). q, k and v are read straight from the qkv projection's (B*T, 3C) rows and
 * the output written in the (B*T, C) rows the next projection reads: no split or merge kernel.
 *
 * Tiles of 64 query rows by 64 keys; a block of 4 warps, each warp 16 rows of the tile. Each
 * tile is read once into shared memory, row-major, by cp.async (16 bytes a copy; rows at or
 * past T are zero-filled and not read), and the B fragments of the products are taken from it
 * with ldmatrix (.trans where the tile's rows are the product's sum index); a product's f32
 * result becomes the next product's A fragment in registers. The tiles a block walks through
 * (k and v for the forward and dq, q and dout for dk and dv) are double-buffered: tile i + 1 is
 * copied while tile i is computed, one __syncthreads a tile (two in dk and dv: the tile's delta
 * from its out rows, whose one buffer then takes the next tile's). The forward keeps each row's
 * running max and sum in registers (a row's 64 scores are spread over the 4 threads of a quad)
 * and saves lse = max + log(sum) for the backward. The backward is two kernels and no atomics,
 * so it is deterministic: one kernel per query tile (dq) and one per key tile (dk and dv), each
 * recomputing the probabilities from lse and taking delta = dout . out of each query row from
 * the tile's dout and out rows in shared memory (tile_delta: the same sums in both, so the
 * same bits; the dq kernel also stores them, as the backward's delta). Neither reads what the
 * other writes (different columns of dqkv), so where the device has programmatic dependent
 * launch the key-tile kernel starts beside the dq kernel and fills the SMs its short tiles
 * leave (it waits for the dq kernel before it completes). A pass of its own for delta, before
 * both, cost 6.9 us of each layer's backward on gpt-768-12-8-256 (bench/RESULTS.md). P
 * and d(scores) are rounded to bf16 before the products that read them, as flash attention and
 * PyTorch's autocast do.
 *
 * Causal skipping: on the diagonal tile, a warp whose 16 rows (keys, for dk and dv) leave a
 * half of the tile all masked skips that half's products. Their scores would be masked anyway,
 * and their P and dS are exactly 0, so the P v, dS k and dS^T q steps skipped would add only
 * zeros to the f32 accumulators (0 times a finite value is +-0, and x + +-0 == x unless x is
 * -0, which an accumulator starting at +0 reaches only through an f32 underflow); the steps
 * kept run in the same order. So for finite inputs every output has the bits of the full
 * computation. Blocks start longest first (block_tile). */
#include "ops/attention.h"
#include "ops/dtype_cuda.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

#define FA_TILE 64     /* query rows and keys per tile */
#define FA_HS 64       /* the head size these kernels take */
#define FA_LD 72       /* shared-memory row stride, bf16 elements: 144 bytes, conflict-free frags */
#define FA_THREADS 128 /* 4 warps, 16 rows of the tile each */
#ifndef FA_FWD_WARPS
#define FA_FWD_WARPS 4 /* the forward's warps a block: 4 (64 query rows) or 8 (128: to measure) */
#endif
#define FA_LOG2E 1.4426950408889634f

/* The element types the kernels take: bf16 (mma m16n8k16, two elements a register) and, for
 * STEPGRAPH_TF32 (the context's matmuls in TF32), f32 rounded to TF32 (mma m16n8k8, one a
 * register). LD: the shared-memory row stride in elements (bf16: 144 bytes; f32: 272, so the
 * 8 rows x 4 columns a fragment load touches lie in distinct banks); K: an mma's sum length;
 * CH: elements a 16-byte copy; DQ_BLOCKS: the dq kernel's blocks an SM (f32: its 87 KB of
 * tiles leave room for 2). */
template <typename E> struct fa_t;
template <> struct fa_t<bf16> {
    static constexpr int LD = FA_LD, K = 16, CH = 8, DQ_BLOCKS = 3;
};
template <> struct fa_t<float> {
    static constexpr int LD = 68, K = 8, CH = 4, DQ_BLOCKS = 2;
};
#define FA_KSTEPS(E) (FA_HS / fa_t<E>::K)           /* mma steps over the head */
#define FA_TILE_ELEMS(E) (FA_TILE * fa_t<E>::LD)   /* one 64-row tile in shared memory */

/* c (16x8, f32) += a (16x16, bf16, row) b (16x8, bf16, col). */
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* c (16x8, f32) += a (16x8, tf32, row) b (8x8, tf32, col). */
__device__ __forceinline__ void mma_tf32(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* f32 rounded to TF32, to nearest (ties away), as cuBLAS rounds its TF32 operands. */
__device__ __forceinline__ uint32_t to_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ uint32_t ld32(const bf16 *p) { return *reinterpret_cast<const uint32_t *>(p); }
__device__ __forceinline__ uint32_t ld32(const float *p) { return __float_as_uint(*p); }

__device__ __forceinline__ uint32_t pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* cp.async (sm_80 on): 16 bytes from global to shared memory, asynchronously and not through
 * L1; src_size 0 reads nothing and writes zeros. Completed by commit_group and wait_group,
 * visible to the other threads after a __syncthreads. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_size)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(__cvta_generic_to_global(src)), "r"(src_size)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* Waits until at most `pending` (a constant) of this thread's newest groups are in flight. */
#define CP_ASYNC_WAIT(pending) asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory")

/* Starts copying rows r0..r0+63 of a (rows, ld) matrix, columns 0..63, from src into s
 * (64 x LD), row-major, 16 bytes a copy over nthr threads (a constant); rows at or past n
 * read nothing (the dummy address is row 0, which exists) and land as zeros. */
template <typename E>
__device__ __forceinline__ void load_tile_async(E *s, const E *src, int64_t ld, int r0, int n, int nthr)
{
    constexpr int CH = fa_t<E>::CH, RC = FA_HS / CH; /* copies a row */
#pragma unroll
    for (int j = 0; j < FA_TILE * RC / nthr; j++) {
        const int i = threadIdx.x + j * nthr, r = i / RC, c = (i % RC) * CH;
        const bool in = r0 + r < n;
        cp_async16(s + r * fa_t<E>::LD + c, src + (in ? (int64_t)(r0 + r) * ld : 0) + c, in ? 16 : 0);
    }
}

/* f32: rounds to TF32, in place, the 16-byte pieces this thread copied into s with
 * load_tile_async (the same nthr), once its copies are complete (after its cp.async wait, before
 * the __syncthreads that shows them to the block): the products then read TF32 operands as
 * they lie. bf16: nothing. */
template <typename E> __device__ __forceinline__ void round_own(E *s, int nthr)
{
    if constexpr (sizeof(E) == 4) {
        constexpr int RC = FA_HS / 4;
#pragma unroll
        for (int j = 0; j < FA_TILE * RC / nthr; j++) {
            const int i = threadIdx.x + j * nthr, r = i / RC, c = (i % RC) * 4;
            float4 *p = reinterpret_cast<float4 *>(s + r * fa_t<E>::LD + c), v = *p;
            *p = make_float4(__uint_as_float(to_tf32(v.x)), __uint_as_float(to_tf32(v.y)),
                             __uint_as_float(to_tf32(v.z)), __uint_as_float(to_tf32(v.w)));
        }
    }
}

/* The block's (tile, bh) of a (tiles, B*H) grid from its place in the launch order, bh running
 * fastest: the tiles with the most work (the last query tile, the first key tile) start first
 * and spread over the SMs, where the plain order gives an SM blocks of one tile index only (384
 * blocks on 132 SMs: some SMs all fourth tiles, some all first). Which block does which tile
 * changes no result. 32 bits: tiles x B*H <= B*T*H, which is under 2^32 for any qkv (B*T,
 * 3*64*H) that fits in memory. */
__device__ __forceinline__ void block_tile(int *tile, int *bh, bool last_first)
{
    const unsigned lin = blockIdx.y * gridDim.x + blockIdx.x, t = lin / gridDim.y;
    *tile = (int)(last_first ? gridDim.x - 1 - t : t);
    *bh = (int)(lin - t * gridDim.y);
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

/* The same from an f32 tile already rounded to TF32 (round_own): 8 steps of 8 columns. */
__device__ __forceinline__ void load_a(uint32_t a[8][4], const float *s, int r0, int g, int t4)
{
    constexpr int LD = fa_t<float>::LD;
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        const float *p = s + (r0 + g) * LD + kk * 8 + t4;
        a[kk][0] = ld32(p), a[kk][1] = ld32(p + 8 * LD), a[kk][2] = ld32(p + 4), a[kk][3] = ld32(p + 8 * LD + 4);
    }
}

/* acc (16 x 64: 8 tiles of 8 columns) = a (16 x 64) times b^T, b a row-major (64 x 64) tile
 * whose rows are acc's columns: b's 8x8 blocks are the B fragments as they lie. Only acc's
 * 16-column groups LO..HI are computed, the others left 0 (the caller masks them all). The
 * range is a template argument so that each range is one unrolled block: a runtime test
 * between the groups would split the 8 independent mma chains into blocks run one after the
 * other, and these kernels are bound by the mma latency, not its throughput. */
template <int LO, int HI>
__device__ __forceinline__ void mm_abt(float acc[8][4], const uint32_t a[4][4], const bf16 *b, int lane)
{
    const int i = lane >> 3, r = lane & 7;
#pragma unroll
    for (int n = 0; n < 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
    for (int np = LO; np <= HI; np++)
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t f[4];
            ldsm4(f, b + (np * 16 + r + 8 * (i >> 1)) * FA_LD + kk * 16 + 8 * (i & 1));
            mma_bf16(acc[2 * np], a[kk], f[0], f[1]);
            mma_bf16(acc[2 * np + 1], a[kk], f[2], f[3]);
        }
}

/* The same in TF32: b an f32 tile already rounded (round_own); B fragment (k t4 and t4 + 4,
 * n g) of keys 8 n.. is b's row 8 n + g, columns 8 kk + t4 and + 4. */
template <int LO, int HI>
__device__ __forceinline__ void mm_abt(float acc[8][4], const uint32_t a[8][4], const float *b, int lane)
{
    constexpr int LD = fa_t<float>::LD;
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int n = 0; n < 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
    for (int np = LO; np <= HI; np++)
#pragma unroll
        for (int kk = 0; kk < 8; kk++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const float *p = b + (np * 16 + j * 8 + g) * LD + kk * 8 + t4;
                mma_tf32(acc[2 * np + j], a[kk], ld32(p), ld32(p + 4));
            }
}

/* acc (16 x 64) += x (16 x 64 f32 in C-fragment layout, rounded to bf16 as the A operand)
 * times b, a row-major (64 x 64) tile whose rows are the sum's index: b's 8x8 blocks
 * transposed (ldmatrix .trans) are the B fragments. Only the sum's 16-row steps LO..HI are
 * taken: the caller's x is zero in the others, which would add exact zeros; the steps taken
 * keep their order. */
template <int LO, int HI>
__device__ __forceinline__ void mm_add(float acc[8][4], const float x[8][4], const bf16 *b, int lane)
{
    const int i = lane >> 3, r = lane & 7;
#pragma unroll
    for (int kk = LO; kk <= HI; kk++) {
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

/* The same in TF32 (x rounded to TF32; b already rounded). An 8-row step nt of the sum takes
 * x's C fragment (rows g, g + 8; sum index 2 t4, 2 t4 + 1) as the A fragment with its sum
 * index relabelled (k t4 is row 2 t4 of the step, k t4 + 4 row 2 t4 + 1), and b's rows in the
 * same order as the B fragment: the sum is over the same 8 rows, in the mma's own order. */
template <int LO, int HI>
__device__ __forceinline__ void mm_add(float acc[8][4], const float x[8][4], const float *b, int lane)
{
    constexpr int LD = fa_t<float>::LD;
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int nt = 2 * LO; nt <= 2 * HI + 1; nt++) {
        const uint32_t a[4] = {to_tf32(x[nt][0]), to_tf32(x[nt][2]), to_tf32(x[nt][1]), to_tf32(x[nt][3])};
        const float *p = b + (nt * 8 + 2 * t4) * LD + g;
#pragma unroll
        for (int n = 0; n < 8; n++) mma_tf32(acc[n], a, ld32(p + n * 8), ld32(p + LD + n * 8));
    }
}

/* Two adjacent outputs stored: as bf16 (rounded), or as they are. */
__device__ __forceinline__ void st2(bf16 *p, float a, float b)
{
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void st2(float *p, float a, float b) { *reinterpret_cast<float2 *>(p) = make_float2(a, b); }

/* Writes the warp's (16 x 64) f32 fragment times scale into rows row0.. of dst (E: bf16 or f32;
 * ld columns apart; rows at or past n skipped). */
template <typename E>
__device__ __forceinline__ void store_rows(E *dst, int64_t ld, const float acc[8][4], float scale, int row0, int n,
                                           int g, int t4)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + g + 8 * r;
        if (row >= n) continue;
#pragma unroll
        for (int c = 0; c < 8; c++)
            st2(dst + (int64_t)row * ld + c * 8 + 2 * t4, acc[c][2 * r] * scale, acc[c][2 * r + 1] * scale);
    }
}

/* The column sums of a 64-row tile the block's 4 warps just stored with store_rows (acc times
 * scale, rounded to bf16: the values as stored, rows at or past n left out), in f32: each
 * thread adds its two rows (g, then g + 8), the 8 threads of a column (lanes of one t4) add
 * theirs by an xor butterfly (each step's two lanes add the same two values: all 8 end with
 * the same bits), then thread c of the block adds the 4 warps' sums of column c in warp order
 * and stores it to part[c]. csum: 4 x 64 floats of shared memory no warp reads or writes
 * until every thread has passed the __syncthreads this starts with. Every thread of the block
 * calls it. */
__device__ __forceinline__ void tile_col_sums(float *part, float *csum, const float acc[8][4], float scale,
                                              int row0, int n, int warp, int lane)
{
    const int g = lane >> 2, t4 = lane & 3;
    float cs[8][2];
#pragma unroll
    for (int c = 0; c < 8; c++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float v = 0.f;
#pragma unroll
            for (int r = 0; r < 2; r++)
                if (row0 + g + 8 * r < n) v += __bfloat162float(__float2bfloat16_rn(acc[c][2 * r + j] * scale));
#pragma unroll
            for (int x = 4; x < 32; x <<= 1) v += __shfl_xor_sync(0xffffffffu, v, x);
            cs[c][j] = v;
        }
    __syncthreads();
    if (g == 0)
#pragma unroll
        for (int c = 0; c < 8; c++) csum[warp * FA_HS + c * 8 + 2 * t4] = cs[c][0], csum[warp * FA_HS + c * 8 + 2 * t4 + 1] = cs[c][1];
    __syncthreads();
    if (threadIdx.x < FA_HS) {
        const int c = (int)threadIdx.x;
        part[c] = ((csum[c] + csum[FA_HS + c]) + csum[2 * FA_HS + c]) + csum[3 * FA_HS + c];
    }
}

/* dbias (3C, bf16) = the parts' column sums (nparts, 3C) added in part order, in f32, rounded
 * once: a thread a column. */
__global__ void fused_bias_reduce_kernel(const float *__restrict__ parts, int nparts, int cols, bf16 *__restrict__ db)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float v = 0.f;
    for (int p = 0; p < nparts; p++) v += parts[(int64_t)p * cols + c];
    db[c] = __float2bfloat16_rn(v);
}

/* One key tile of the forward for the warp's 16 rows (qrow; a quad's 4 threads share a row):
 * scores, the online softmax (running max m and sum l), o += P v. Only the 16-key groups
 * 0..HI are taken: past HI every key is masked for the warp's rows (causal, or at or past T),
 * so their scores would be -inf, P 0, and l += 0 and the P v steps exact no-ops. */
template <int HI, typename E>
__device__ __forceinline__ void fwd_tile(float o[8][4], float m[2], float l[2], const uint32_t (*qa)[4],
                                         const E *ks, const E *vs, int key0, const int qrow[2], int T,
                                         float sl2, int lane)
{
    const int t4 = lane & 3;
    float s[8][4], mx[2] = {-INFINITY, -INFINITY};
    mm_abt<0, HI>(s, qa, ks, lane);
#pragma unroll
    for (int n = 0; n < 2 * HI + 2; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = key0 + n * 8 + 2 * t4 + (e & 1), r = e >> 1;
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
    for (int n = 0; n < 2 * HI + 2; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[n][e] = exp2f(s[n][e] - m[e >> 1]);
            l[e >> 1] += s[n][e];
        }
    mm_add<0, HI>(o, s, vs, lane);
}

/* The forward. grid (query tiles of 16 NW rows, B*H), 32 NW threads; out (B*T, C); lse (B, H, T);
 * sl2 = log2(e) / sqrt(hs). NW = 4 (64-row tiles) is what runs; NW = 8 (128 rows, built with
 * -DFA_FWD_WARPS=8) reads each key tile once for twice the rows. Either way a warp's 16 rows
 * lie in one 64-row tile wt, whose key tiles 0..wt it takes in order with the same products as
 * the other, so the two give the same bits. NW = 4: 168 registers at most, 3 blocks an SM, so
 * that 384 blocks (B 8 x 12 heads x 4 tiles) run in one wave on 132 SMs (4 blocks at 128
 * registers spilled and ran slower); NW = 8: 128 registers, 2 blocks. */
template <typename E, int NW>
__global__ void __launch_bounds__(32 * NW, NW == 4 ? 3 : 2)
    fused_fwd_kernel(const E *__restrict__ qkv, E *__restrict__ out, float *__restrict__ lse, int T, int H,
                     int C, float sl2)
{
    extern __shared__ __align__(16) unsigned char fa_smem[]; /* ks(2), vs(2): fwd_smem_bytes */
    constexpr int TE = FA_TILE_ELEMS(E);
    E *const sm = reinterpret_cast<E *>(fa_smem);
    const auto ks = [=](int i) { return sm + i * TE; }; /* ks(i), vs(i): buffer i of k, of v */
    const auto vs = [=](int i) { return sm + (2 + i) * TE; };
    int qt, bh;
    block_tile(&qt, &bh, true);
    const int b = bh / H, h = bh % H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t ld = 3 * (int64_t)C;
    const E *base = qkv + (int64_t)b * T * ld + h * FA_HS;
    const int wt = qt * (NW / 4) + warp / 4, q0 = wt * FA_TILE, r0 = (warp % 4) * 16; /* the warp's tile */
    const int qrow[2] = {q0 + r0 + g, q0 + r0 + g + 8};
    const int kt_end = min(qt * (NW / 4) + NW / 4, (T + FA_TILE - 1) / FA_TILE) - 1; /* the block's last */

    /* q's 64-row parts into the buffers tile 1 will take, tile 0 behind them */
    static_assert(sizeof(E) == 2 || NW == 4, "f32: 4 warps");
    uint32_t qa[FA_KSTEPS(E)][4];
    load_tile_async(ks(1), base, ld, qt * NW * 16, T, 32 * NW);
    if (NW == 8) load_tile_async(vs(1), base, ld, qt * NW * 16 + FA_TILE, T, 32 * NW);
    cp_async_commit();
    load_tile_async(ks(0), base + C, ld, 0, T, 32 * NW);
    load_tile_async(vs(0), base + 2 * C, ld, 0, T, 32 * NW);
    cp_async_commit();
    CP_ASYNC_WAIT(1);
    round_own(ks(1), 32 * NW); /* f32: q to TF32 */
    __syncthreads();
    load_a(qa, warp < 4 ? ks(1) : vs(1), r0, g, t4);
    /* a warp with no row before T has nothing to write; on its diagonal tile the keys past its
     * last row or at or past T are masked: if those are all of keys 32..63, it takes only 0..31 */
    const bool active = q0 + r0 < T, half = min(r0 + 15, T - 1 - q0) < 32;
    float o[8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    for (int kt = 0; kt <= kt_end; kt++) {
        const int cur = kt & 1;
        CP_ASYNC_WAIT(0);
        round_own(ks(cur), 32 * NW), round_own(vs(cur), 32 * NW); /* f32: k and v to TF32 */
        __syncthreads(); /* tile kt is in, and every warp is done with the other buffers */
        if (kt < kt_end) {
            load_tile_async(ks(cur ^ 1), base + C, ld, (kt + 1) * FA_TILE, T, 32 * NW);
            load_tile_async(vs(cur ^ 1), base + 2 * C, ld, (kt + 1) * FA_TILE, T, 32 * NW);
            cp_async_commit();
        }
        if (!active || kt > wt) continue;
        if (kt < wt || !half)
            fwd_tile<3>(o, m, l, qa, ks(cur), vs(cur), kt * FA_TILE, qrow, T, sl2, lane);
        else
            fwd_tile<1>(o, m, l, qa, ks(cur), vs(cur), kt * FA_TILE, qrow, T, sl2, lane);
    }
    if (!active) return;
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

/* One key tile of dq for the warp's 16 rows: P from lse (lr, times log2 e), dS = P (dout v^T -
 * delta), dq += dS k. Only the 16-key groups 0..HI are taken, as in fwd_tile: past HI, P and
 * so dS are 0. */
template <int HI, typename E>
__device__ __forceinline__ void dq_tile(float dq[8][4], const uint32_t (*qa)[4], const uint32_t (*ga)[4],
                                        const E *ks, const E *vs, int key0, const int qrow[2],
                                        const float lr[2], const float dl[2], int T, float sl2, int lane)
{
    const int t4 = lane & 3;
    float s[8][4], dp[8][4];
    mm_abt<0, HI>(s, qa, ks, lane);
    mm_abt<0, HI>(dp, ga, vs, lane);
#pragma unroll
    for (int n = 0; n < 2 * HI + 2; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = key0 + n * 8 + 2 * t4 + (e & 1), r = e >> 1;
            float p = key <= qrow[r] && key < T ? exp2f(s[n][e] * sl2 - lr[r]) : 0.f;
            s[n][e] = p * (dp[n][e] - dl[r]);
        }
    mm_add<0, HI>(dq, s, ks, lane);
}

/* delta = dout . out of a tile's 64 rows, from the tiles in shared memory (row-major, FA_LD;
 * rows past T are zeros, so their delta is 0), by the block's 128 threads: thread t takes row
 * t / 2, columns 32 (t % 2) .. 32 (t % 2) + 31 in order, and the pair adds its two sums (a + b
 * == b + a, so both threads hold the same value). The dq and the dk/dv kernels both take a
 * row's delta from here, so they use the same bits. The even thread of a pair stores it to
 * dsh[row] (visible to the block after a __syncthreads); returns it in both threads. */
__device__ __forceinline__ float tile_delta(const bf16 *gs, const bf16 *os, float *dsh)
{
    static_assert(FA_THREADS == 2 * FA_TILE, "tile_delta: two threads a row");
    const int r = (int)threadIdx.x >> 1, c0 = ((int)threadIdx.x & 1) * (FA_HS / 2);
    float acc = 0.f;
#pragma unroll
    for (int c = c0; c < c0 + FA_HS / 2; c += 8) {
        const uint4 gv = *reinterpret_cast<const uint4 *>(gs + r * FA_LD + c);
        const uint4 ov = *reinterpret_cast<const uint4 *>(os + r * FA_LD + c);
        const bf16 *ge = reinterpret_cast<const bf16 *>(&gv), *oe = reinterpret_cast<const bf16 *>(&ov);
#pragma unroll
        for (int j = 0; j < 8; j++) acc = __fmaf_rn(__bfloat162float(ge[j]), __bfloat162float(oe[j]), acc);
    }
    const float d = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
    if ((threadIdx.x & 1) == 0) dsh[r] = d;
    return d;
}

/* The same in f32, from full f32 dout (gs) and out rows; each thread then rounds the dout
 * elements it read to TF32 in place (no other thread reads them here), so that after the
 * block's next __syncthreads the tile is the products' TF32 operand while delta kept f32. */
__device__ __forceinline__ float tile_delta(float *gs, const float *os, float *dsh)
{
    static_assert(FA_THREADS == 2 * FA_TILE, "tile_delta: two threads a row");
    constexpr int LD = fa_t<float>::LD;
    const int r = (int)threadIdx.x >> 1, c0 = ((int)threadIdx.x & 1) * (FA_HS / 2);
    float acc = 0.f;
#pragma unroll
    for (int c = c0; c < c0 + FA_HS / 2; c += 4) {
        float4 *gp = reinterpret_cast<float4 *>(gs + r * LD + c);
        const float4 gv = *gp, ov = *reinterpret_cast<const float4 *>(os + r * LD + c);
        acc = __fmaf_rn(gv.x, ov.x, acc), acc = __fmaf_rn(gv.y, ov.y, acc);
        acc = __fmaf_rn(gv.z, ov.z, acc), acc = __fmaf_rn(gv.w, ov.w, acc);
        *gp = make_float4(__uint_as_float(to_tf32(gv.x)), __uint_as_float(to_tf32(gv.y)),
                          __uint_as_float(to_tf32(gv.z)), __uint_as_float(to_tf32(gv.w)));
    }
    const float d = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
    if ((threadIdx.x & 1) == 0) dsh[r] = d;
    return d;
}

/* dq for a query tile. grid (query tiles, B*H). 168 registers at most: 3 blocks an SM, so that
 * 384 blocks (B 8 x 12 heads x 4 tiles) run in one wave on 132 SMs. It lets the key-tile
 * kernel start at once (sg_pdl_trigger): the two write different columns of dqkv and read
 * only what was written before this kernel, so the key-tile kernel's blocks fill the SMs as
 * this kernel's shorter tiles finish. */
template <typename E>
__global__ void __launch_bounds__(FA_THREADS, fa_t<E>::DQ_BLOCKS)
    fused_bwd_dq_kernel(const E *__restrict__ qkv, const float *__restrict__ lse, const E *__restrict__ dout,
                        const E *__restrict__ out, float *__restrict__ delta, E *__restrict__ dqkv,
                        float *__restrict__ parts, int T, int H, int C, float sl2, float scale)
{
    sg_pdl_trigger();
    extern __shared__ __align__(16) unsigned char fa_smem[]; /* ks(2), vs(2), os, dsh: dq_smem_bytes */
    constexpr int TE = FA_TILE_ELEMS(E);
    E *const sm = reinterpret_cast<E *>(fa_smem);
    const auto ks = [=](int i) { return sm + i * TE; }; /* ks(i), vs(i): buffer i of k, of v */
    const auto vs = [=](int i) { return sm + (2 + i) * TE; };
    E *const os = sm + 4 * TE;
    float *const dsh = reinterpret_cast<float *>(sm + 5 * TE);
    int qt, bh;
    block_tile(&qt, &bh, true);
    const int b = bh / H, h = bh % H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t ld = 3 * (int64_t)C;
    const E *base = qkv + (int64_t)b * T * ld + h * FA_HS;
    const E *gbase = dout + (int64_t)b * T * C + h * FA_HS;
    const int q0 = qt * FA_TILE, r0 = warp * 16;
    const int qrow[2] = {q0 + r0 + g, q0 + r0 + g + 8};

    /* q and dout into the buffers tile 1 will take, tile 0 behind them; the rows' delta */
    uint32_t qa[FA_KSTEPS(E)][4], ga[FA_KSTEPS(E)][4];
    load_tile_async(ks(1), base, ld, q0, T, FA_THREADS);
    load_tile_async(vs(1), gbase, C, q0, T, FA_THREADS);
    load_tile_async(os, out + (int64_t)b * T * C + h * FA_HS, C, q0, T, FA_THREADS);
    cp_async_commit();
    load_tile_async(ks(0), base + C, ld, 0, T, FA_THREADS);
    load_tile_async(vs(0), base + 2 * C, ld, 0, T, FA_THREADS);
    cp_async_commit();
    CP_ASYNC_WAIT(1);
    round_own(ks(1), FA_THREADS); /* f32: q to TF32 (dout after its delta, out never) */
    __syncthreads();
    { /* the rows' delta, also stored for the caller (the key-tile kernel makes its own) */
        const float d = tile_delta(vs(1), os, dsh);
        const int r = (int)threadIdx.x >> 1;
        if ((threadIdx.x & 1) == 0 && q0 + r < T) delta[(int64_t)bh * T + q0 + r] = d;
        __syncthreads();
    }
    load_a(qa, ks(1), r0, g, t4);
    load_a(ga, vs(1), r0, g, t4);
    float lr[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lr[r] = qrow[r] < T ? lse[(int64_t)bh * T + qrow[r]] * FA_LOG2E : 0.f;
        dl[r] = dsh[r0 + g + 8 * r];
    }
    /* as in the forward, keys 0..31 only on the diagonal tile if the others are all masked (a
     * warp with no row before T still computes, as a test of that cost a spilled register) */
    const bool half = min(r0 + 15, T - 1 - q0) < 32;
    float dq[8][4] = {};
    for (int kt = 0; kt <= qt; kt++) {
        const int cur = kt & 1;
        CP_ASYNC_WAIT(0);
        round_own(ks(cur), FA_THREADS), round_own(vs(cur), FA_THREADS); /* f32: k and v to TF32 */
        __syncthreads(); /* tile kt is in, and every warp is done with the other buffers */
        if (kt < qt) {
            load_tile_async(ks(cur ^ 1), base + C, ld, (kt + 1) * FA_TILE, T, FA_THREADS);
            load_tile_async(vs(cur ^ 1), base + 2 * C, ld, (kt + 1) * FA_TILE, T, FA_THREADS);
            cp_async_commit();
        }
        if (kt < qt || !half)
            dq_tile<3>(dq, qa, ga, ks(cur), vs(cur), kt * FA_TILE, qrow, lr, dl, T, sl2, lane);
        else
            dq_tile<1>(dq, qa, ga, ks(cur), vs(cur), kt * FA_TILE, qrow, lr, dl, T, sl2, lane);
    }
    store_rows(dqkv + (int64_t)b * T * ld + h * FA_HS, ld, dq, scale, q0 + r0, T, g, t4);
    if constexpr (sizeof(E) == 2) /* bf16 only: the caller passes no parts for f32 */
        if (parts) /* the q columns' sums of this tile: part (b, qt); ks(0) is free (the loop is over) */
            tile_col_sums(parts + ((int64_t)b * gridDim.x + qt) * 3 * C + h * FA_HS,
                          reinterpret_cast<float *>(ks(0)), dq, scale, q0 + r0, T, warp, lane);
}

/* lse times log2 e of query row q0 + threadIdx.x (0 past T), for lsh: read into registers
 * when the tile's copies start, stored after the current tile's products. */
__device__ __forceinline__ float load_l(const float *lrow, int q0, int T)
{
    const int q = q0 + (int)threadIdx.x;
    return q < T ? lrow[q] * FA_LOG2E : 0.f;
}

/* One query tile of dk and dv for the warp's 16 keys (key): P^T from lse (lsh, times log2 e)
 * and dS^T = P^T (v dout^T - delta), dv += P^T dout, dk += dS^T q. Only the 16-query
 * groups LO..3 are taken: on the diagonal tile the queries before the warp's first key are
 * masked, so P and dS are 0 there. */
template <int LO, typename E>
__device__ __forceinline__ void dkv_tile(float dk[8][4], float dv[8][4], const uint32_t (*ka)[4],
                                         const uint32_t (*va)[4], const E *qs, const E *gs, const float *lsh,
                                         const float *dsh, int q0, const int key[2], int T, float sl2, int lane)
{
    const int t4 = lane & 3;
    float s[8][4], dp[8][4];
    mm_abt<LO, 3>(s, ka, qs, lane);  /* scores^T: the warp's keys by the tile's queries */
    mm_abt<LO, 3>(dp, va, gs, lane); /* (dout v^T)^T */
#pragma unroll
    for (int n = 2 * LO; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int c = n * 8 + 2 * t4 + (e & 1), q = q0 + c, r = e >> 1;
            float p = q >= key[r] && q < T ? exp2f(s[n][e] * sl2 - lsh[c]) : 0.f;
            s[n][e] = p;
            dp[n][e] = p * (dp[n][e] - dsh[c]);
        }
    mm_add<LO, 3>(dv, s, gs, lane);
    mm_add<LO, 3>(dk, dp, qs, lane);
}

/* dk and dv for a key tile, over the query tiles at and after it. grid (key tiles, B*H). 2
 * blocks an SM: dk and dv (64 f32 accumulators), the k and v fragments (32) and a tile's P and
 * dS (64) keep it over the 168 registers of 3 blocks (which spilled). */
template <typename E>
__global__ void __launch_bounds__(FA_THREADS, 2)
    fused_bwd_dkv_kernel(const E *__restrict__ qkv, const float *__restrict__ lse, const E *__restrict__ dout,
                         const E *__restrict__ out, E *__restrict__ dqkv, float *__restrict__ parts, int T, int H,
                         int C, float sl2, float scale)
{
    extern __shared__ __align__(16) unsigned char fa_smem[]; /* qs(2), gs(2), os, lsh(2), dsh: dkv_smem_bytes */
    constexpr int TE = FA_TILE_ELEMS(E);
    E *const sm = reinterpret_cast<E *>(fa_smem);
    const auto qs = [=](int i) { return sm + i * TE; }; /* qs(i), gs(i): buffer i of q, of dout */
    const auto gs = [=](int i) { return sm + (2 + i) * TE; };
    E *const os = sm + 4 * TE;
    float *const lbase = reinterpret_cast<float *>(sm + 5 * TE);
    const auto lsh = [=](int i) { return lbase + i * FA_TILE; }; /* lse times log2 e, double-buffered */
    float *const dsh = lbase + 2 * FA_TILE;                      /* delta */
    int kt, bh;
    block_tile(&kt, &bh, false);
    const int b = bh / H, h = bh % H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int64_t ld = 3 * (int64_t)C;
    const E *base = qkv + (int64_t)b * T * ld + h * FA_HS, *gbase = dout + (int64_t)b * T * C + h * FA_HS;
    const E *obase = out + (int64_t)b * T * C + h * FA_HS;
    const float *lrow = lse + (int64_t)bh * T;
    const int k0 = kt * FA_TILE, r0 = warp * 16;
    const int key[2] = {k0 + r0 + g, k0 + r0 + g + 8};
    const int nq = (T + FA_TILE - 1) / FA_TILE;

    /* k and v into the buffers the second query tile will take, the first (qt = kt) and its
     * out rows behind them */
    uint32_t ka[FA_KSTEPS(E)][4], va[FA_KSTEPS(E)][4];
    load_tile_async(qs(1), base + C, ld, k0, T, FA_THREADS);
    load_tile_async(gs(1), base + 2 * C, ld, k0, T, FA_THREADS);
    cp_async_commit();
    load_tile_async(qs(0), base, ld, k0, T, FA_THREADS);
    load_tile_async(gs(0), gbase, C, k0, T, FA_THREADS);
    load_tile_async(os, obase, C, k0, T, FA_THREADS);
    cp_async_commit();
    float ln = 0.f; /* the next tile's lse, in threads below FA_TILE */
    if (threadIdx.x < FA_TILE) lsh(0)[threadIdx.x] = load_l(lrow, k0, T);
    CP_ASYNC_WAIT(1);
    round_own(qs(1), FA_THREADS), round_own(gs(1), FA_THREADS); /* f32: k and v to TF32 */
    __syncthreads();
    load_a(ka, qs(1), r0, g, t4);
    load_a(va, gs(1), r0, g, t4);
    const bool active = k0 + r0 < T; /* a warp with no key before T has nothing to write */
    float dk[8][4] = {}, dv[8][4] = {};
    for (int qt = kt; qt < nq; qt++) {
        const int cur = (qt - kt) & 1, q0 = qt * FA_TILE;
        CP_ASYNC_WAIT(0);
        round_own(qs(cur), FA_THREADS); /* f32: q to TF32 (dout in tile_delta, after its delta) */
        __syncthreads(); /* tile qt is in, and every warp is done with the other buffers */
        const bool next = qt + 1 < nq;
        if (next) {
            load_tile_async(qs(cur ^ 1), base, ld, q0 + FA_TILE, T, FA_THREADS);
            load_tile_async(gs(cur ^ 1), gbase, C, q0 + FA_TILE, T, FA_THREADS);
            cp_async_commit();
            if (threadIdx.x < FA_TILE) ln = load_l(lrow, q0 + FA_TILE, T);
        }
        /* this tile's delta from its dout and out (the readers of the last tile's were done at
         * the __syncthreads above); then out's one buffer takes the next tile's rows */
        tile_delta(gs(cur), os, dsh);
        __syncthreads();
        if (next) {
            load_tile_async(os, obase, C, q0 + FA_TILE, T, FA_THREADS);
            cp_async_commit();
        }
        if (active && (qt > kt || warp < 2))
            dkv_tile<0>(dk, dv, ka, va, qs(cur), gs(cur), lsh(cur), dsh, q0, key, T, sl2, lane);
        else if (active) /* the diagonal tile, keys 32..63: queries 0..31 are all masked */
            dkv_tile<2>(dk, dv, ka, va, qs(cur), gs(cur), lsh(cur), dsh, q0, key, T, sl2, lane);
        /* the other buffers' readers were done at the __syncthreads above; the next reads follow
         * the next one */
        if (next && threadIdx.x < FA_TILE) lsh(cur ^ 1)[threadIdx.x] = ln;
    }
    E *dbase = dqkv + (int64_t)b * T * ld + h * FA_HS;
    store_rows(dbase + C, ld, dk, scale, k0 + r0, T, g, t4);
    store_rows(dbase + 2 * C, ld, dv, 1.f, k0 + r0, T, g, t4);
    if constexpr (sizeof(E) == 2) /* bf16 only: the caller passes no parts for f32 */
        if (parts) { /* the k and v columns' sums of this tile: part (b, kt); qs is free (the loop is over) */
            float *part = parts + ((int64_t)b * gridDim.x + kt) * 3 * C + h * FA_HS;
            tile_col_sums(part + C, reinterpret_cast<float *>(qs(0)), dk, scale, k0 + r0, T, warp, lane);
            tile_col_sums(part + 2 * C, reinterpret_cast<float *>(qs(1)), dv, 1.f, k0 + r0, T, warp, lane);
        }
    /* Launched beside the dq kernel (programmatic dependent launch): this grid completes only
     * once that one has, so the kernels after it find dq written too. */
    sg_pdl_wait();
}

/* ---- entry points (arguments checked by attention.c) ---- */

/* Dynamic shared memory of each kernel: the forward's k and v tiles (double-buffered); the
 * backward's two double-buffered tiles and out's, with the dq kernel's delta or the key-tile
 * kernel's lse (two) and delta rows. bf16 stays under the 48 KB a launch may take without
 * asking; f32 opts in (sg_smem_optin). */
template <typename E> static constexpr size_t fwd_smem_bytes() { return 4 * FA_TILE_ELEMS(E) * sizeof(E); }
template <typename E> static constexpr size_t dq_smem_bytes()
{
    return 5 * FA_TILE_ELEMS(E) * sizeof(E) + FA_TILE * sizeof(float);
}
template <typename E> static constexpr size_t dkv_smem_bytes()
{
    return 5 * FA_TILE_ELEMS(E) * sizeof(E) + 3 * FA_TILE * sizeof(float);
}
static_assert(dkv_smem_bytes<bf16>() <= 48 * 1024, "bf16: the default shared-memory limit");

/* The shapes and alignment these kernels take; SG_ERR_UNSUPPORTED naming what differs. */
static sg_status check_fused(sg_ctx *ctx, const char *fn, const sg_tensor *qkv, sg_attn_dims d,
                             const sg_tensor *const *ts, int n, sg_dtype dt)
{
    if (qkv->dtype != dt || d.hs != FA_HS)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: CUDA runs these fused attention kernels for %s and head size "
                       "%d; this is %s with head size %lld (use sg_attention_forward)", fn, sg_dtype_name(dt),
                       FA_HS, sg_dtype_name(qkv->dtype), (long long)d.hs);
    if (d.T > INT32_MAX / 2 || d.C > INT32_MAX / 4 || d.B * d.H > 65535)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: B %lld x heads %lld, T %lld, C %lld: past the kernels' "
                       "limits (B x heads <= 65535)", fn, (long long)d.B, (long long)d.H, (long long)d.T,
                       (long long)d.C);
    return sg_attention_check_aligned(ctx, fn, ts, n);
}

template <typename E>
static sg_status forward_t(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out, sg_tensor *lse, sg_attn_dims d)
{
    static const char fn[] = "sg_attention_fused_forward";
    constexpr int NW = sizeof(E) == 2 ? FA_FWD_WARPS : 4;
    const sg_tensor *ts[] = {qkv, out};
    SG_TRY(check_fused(ctx, fn, qkv, d, ts, 2, sizeof(E) == 2 ? SG_DTYPE_BF16 : SG_DTYPE_F32));
    const float sl2 = (float)(FA_LOG2E / sqrt((double)d.hs));
    const int rows = 16 * NW; /* query rows a block */
    dim3 grid((unsigned)((d.T + rows - 1) / rows), (unsigned)(d.B * d.H));
    SG_CUDA_CHECK(ctx, (sg_smem_optin<fused_fwd_kernel<E, NW>>(fwd_smem_bytes<E>(), ctx->opts.device)));
    fused_fwd_kernel<E, NW><<<grid, 32 * NW, fwd_smem_bytes<E>(), (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (const E *)qkv->data, (E *)out->data, (float *)lse->data, (int)d.T, (int)d.H, (int)d.C, sl2);
    SG_CUDA_CHECK_LAUNCH(ctx, "fused_fwd_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* The backward's two kernels; with dbias (bf16 only) the qkv columns' sums too. */
template <typename E>
static sg_status backward_t(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out, const sg_tensor *lse,
                            const sg_tensor *dout, sg_tensor *dqkv, sg_tensor *delta, sg_tensor *dbias,
                            sg_tensor *parts, sg_attn_dims d)
{
    static const char fn[] = "sg_attention_fused_backward";
    const sg_tensor *ts[] = {qkv, out, dout, dqkv};
    SG_TRY(check_fused(ctx, fn, qkv, d, ts, 4, sizeof(E) == 2 ? SG_DTYPE_BF16 : SG_DTYPE_F32));
    const double sc = 1.0 / sqrt((double)d.hs);
    const float sl2 = (float)(FA_LOG2E * sc), scale = (float)sc;
    dim3 grid((unsigned)((d.T + FA_TILE - 1) / FA_TILE), (unsigned)(d.B * d.H));
    cudaStream_t s = (cudaStream_t)sg_ctx_stream(ctx);
    const E *o = (const E *)out->data;
    float *pa = dbias ? (float *)parts->data : NULL;
    SG_CUDA_CHECK(ctx, (sg_smem_optin<fused_bwd_dq_kernel<E>>(dq_smem_bytes<E>(), ctx->opts.device)));
    SG_CUDA_CHECK(ctx, (sg_smem_optin<fused_bwd_dkv_kernel<E>>(dkv_smem_bytes<E>(), ctx->opts.device)));
    fused_bwd_dq_kernel<E><<<grid, FA_THREADS, dq_smem_bytes<E>(), s>>>(
        (const E *)qkv->data, (const float *)lse->data, (const E *)dout->data, o, (float *)delta->data,
        (E *)dqkv->data, pa, (int)d.T, (int)d.H, (int)d.C, sl2, scale);
    SG_CUDA_CHECK_LAUNCH(ctx, "fused_bwd_dq_kernel");
    /* The key-tile kernel may start beside the dq kernel (which triggers at once), where the
     * device has programmatic dependent launch; otherwise after it. */
    const sg_pdl_launch l(grid, dim3(FA_THREADS), dkv_smem_bytes<E>(), s, sg_ctx_pdl(ctx));
    SG_CUDA_CHECK(ctx, cudaLaunchKernelEx(&l.cfg, fused_bwd_dkv_kernel<E>, (const E *)qkv->data,
                                          (const float *)lse->data, (const E *)dout->data, o, (E *)dqkv->data,
                                          pa, (int)d.T, (int)d.H, (int)d.C, sl2, scale));
    SG_CUDA_CHECK_LAUNCH(ctx, "fused_bwd_dkv_kernel");
    sg_ctx_count_launches(ctx, 2);
    if (!dbias) return SG_OK;
    /* The parts' sum: on the second stream inside a module's backward (the qkv projection's dw
     * matmul, queued there next, reads neither), else here. The dk/dv grid completes after the
     * dq grid, so the fork after it finds every part written. */
    const bool side = sg_ctx_side_use(ctx);
    if (side) SG_TRY(sg_ctx_side_fork(ctx));
    const int cols = (int)(3 * d.C), nparts = (int)(d.B * grid.x);
    fused_bias_reduce_kernel<<<(cols + 127) / 128, 128, 0, side ? (cudaStream_t)sg_ctx_side_stream(ctx) : s>>>(
        pa, nparts, cols, (bf16 *)dbias->data);
    const int e = sg_cuda_last_error();
    sg_status st = e ? sg_cuda_status(ctx, e, "fused_bias_reduce_kernel launch", __FILE__, __LINE__) : SG_OK;
    if (st == SG_OK) sg_ctx_count_launches(ctx, 1);
    /* Joined before the call returns unless a module's region defers it (as linear_cuda.cu's
     * dw matmul). */
    return sg_ctx_side_end(ctx, side, st);
}

extern "C" sg_status sg_attention_fused_forward_cuda(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                                     sg_tensor *lse, sg_attn_dims d)
{
    return forward_t<bf16>(ctx, qkv, out, lse, d);
}

extern "C" sg_status sg_attention_fused_backward_cuda(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out,
                                                      const sg_tensor *lse, const sg_tensor *dout, sg_tensor *dqkv,
                                                      sg_tensor *delta, sg_tensor *dbias, sg_tensor *parts,
                                                      sg_attn_dims d)
{
    return backward_t<bf16>(ctx, qkv, out, lse, dout, dqkv, delta, dbias, parts, d);
}

/* f32 with head size 64 on the tensor cores in TF32 (attention_fused_f32_cuda.cu sends it here
 * under STEPGRAPH_TF32, head size 64): the bf16 kernels' scheme with f32 tiles, each
 * operand rounded to TF32 once in shared memory, P and d(scores) as they enter their products. */
extern "C" sg_status sg_attention_fused_forward_tf32_cuda(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                                          sg_tensor *lse, sg_attn_dims d)
{
    return forward_t<float>(ctx, qkv, out, lse, d);
}

extern "C" sg_status sg_attention_fused_backward_tf32_cuda(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out,
                                                           const sg_tensor *lse, const sg_tensor *dout,
                                                           sg_tensor *dqkv, sg_tensor *delta, sg_attn_dims d)
{
    return backward_t<float>(ctx, qkv, out, lse, dout, dqkv, delta, NULL, NULL, d);
}
