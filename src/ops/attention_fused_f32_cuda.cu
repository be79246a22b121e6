/* attention_fused_f32_cuda.cu: fused causal attention on the GPU in fp32, forward and
 * backward: the f32 twin of attention_fused_cuda.cu (same scheme, same layouts: q, k, v read
 * from the qkv projection's (B*T, 3C) rows, out written as (B*T, C) rows, lse (B, H, T), a
 * deterministic two-kernel backward without atomics), for head sizes that are multiples of 4
 * up to 128. Every product and sum is f32 FMA on the CUDA cores: no TF32, no tensor cores.
 *
 * A block owns R = 64 rows (256 threads) or, where 64-row blocks would leave SMs idle, R = 32
 * (128 threads) of one (batch, head): queries in the forward and dq kernels, keys in the dk/dv
 * kernel; it loops over the 64-wide tiles of the other side (keys, or queries) up to or from
 * the diagonal, skipping the tiles wholly above it, the heaviest blocks first. Thread (ty, tx),
 * 16 to a row group, owns rows ty, ty + R/4, ty + R/2, ty + 3R/4 and keys tx, tx+16, tx+32,
 * tx+48 of each tile: a 4x4 micro-tile of the scores, so each pair of 16-byte shared-memory
 * loads feeds 16 FMAs; in the products that sum over the tile (P v, dS k, P^T dout, dS^T q) the
 * same rows by HSP/16 columns (V-wide vectors at 16 V g + V tx). A row's 16 threads are half a
 * warp: its max and sums reduce with 4 xor shuffles. Each tile of q, k, v or dout rows is
 * copied once, row-major, into shared memory (16-byte loads; rows HSP + 4 floats apart, an
 * odd number of 16-byte units, so the 16 rows a half-warp reads at one column lie in distinct
 * banks), zero past T and past hs: HSP is the head size rounded up to 32, 64 or 128 (the
 * template parameter), and the zero columns add nothing to the sums. P (and d(scores) in the
 * backward) goes through shared memory, row-major, to the products that read it; the outputs
 * stay in registers until the one store. Shared memory at head size 64, R = 64: forward 70 KB,
 * dq 90 KB, dk/dv 111 KB (two blocks an SM, as the 128 registers a thread allow).
 *
 * The forward keeps each row's running max (log2 units) and its thread's part of the sum, and
 * saves lse = max + log(sum). The backward: one kernel per query tile (dq, and delta = dout .
 * out of each row, written for the next kernel), one per key tile (dk and dv over the query
 * tiles at and after it), each recomputing P from lse in the same order of operations, so
 * both see the same bits of P and d(scores).
 *
 * H200, graph-replayed (f32 fused vs unfused, microseconds): B 8, T 256, heads 12, hs 64:
 * forward 39 vs 97, backward 131 vs 157; B 8, T 128, heads 4, hs 64: 9.5 vs 22.6, 27 vs 35. */
#include "ops/attention.h"
#include "ops/dtype_cuda.cuh"

#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>

#define FF_KEYS 64 /* keys (forward, dq) or queries (dk, dv) per tile of the loop */
#define FF_LDP 80  /* row stride of the (R x 64) P and d(scores) tiles: adjacent rows 16 banks apart */
#define FF_MAX_HS 128
#define FF_LOG2E 1.4426950408889634f

#define FF_RT 4 /* rows of the block's tile a thread owns (8, 128 threads a 64-row block, measured
                 * no faster) */

/* A block's shape: R rows of its own tile (queries, or keys for dk and dv), FF_RT of them a
 * thread, 16 threads a row group: NT = 16 R / FF_RT threads; thread (ty, tx) owns rows ty + RS i
 * (i < FF_RT, RS = R / FF_RT) and, in each 64-wide tile of the loop, keys (or queries) tx + 16 j
 * (j < 4); in the products that sum over that tile, its rows by HSP / 16 columns, G groups of
 * V at 16 V g + V tx. LD: the row stride of a tile of HSP columns in shared memory, an odd
 * number of 16-byte units. */
template <int HSP, int R> struct ff_cfg {
    static constexpr int NT = 16 * R / FF_RT, RS = R / FF_RT;
    static constexpr int LD = HSP + 4;
    static constexpr int NC = HSP / 16;
    static constexpr int V = NC < 4 ? NC : 4;
    static constexpr int G = NC / V;
};

/* Blocks an SM the registers must leave room for: 128 registers a thread up to head size 64
 * (512 threads an SM: two 256-thread blocks or four 128-thread ones); up to 255 for 128, whose
 * tiles fill most of an SM's shared memory anyway. */
#define FF_MIN_BLOCKS(HSP, R) ((HSP) <= 64 ? 512 / ff_cfg<HSP, R>::NT : 256 / ff_cfg<HSP, R>::NT)

__device__ __forceinline__ float comp(const float4 &v, int u)
{
    return u == 0 ? v.x : u == 1 ? v.y : u == 2 ? v.z : v.w;
}

/* V consecutive floats from p (shared or global, 4V-byte aligned) into r. */
template <int V> __device__ __forceinline__ void ld_vec(float *r, const float *p)
{
    if constexpr (V == 4) {
        const float4 t = *reinterpret_cast<const float4 *>(p);
        r[0] = t.x, r[1] = t.y, r[2] = t.z, r[3] = t.w;
    } else {
        const float2 t = *reinterpret_cast<const float2 *>(p);
        r[0] = t.x, r[1] = t.y;
    }
}

/* Sum over the 16 threads of a row group (a half-warp). Every thread gets the same bits: each
 * xor step adds the same two values on both sides. All 32 lanes must call it. */
__device__ __forceinline__ float row_sum(float v)
{
#pragma unroll
    for (int off = 1; off < 16; off <<= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float row_max(float v)
{
#pragma unroll
    for (int off = 1; off < 16; off <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* Rows r0..r0+NR-1 of a row-major f32 matrix (rows ld floats apart), columns 0..hs-1, into s
 * (NR x LD), by the block's NT threads; zero for rows at or past n and columns at or past hs
 * (up to HSP). 16-byte loads. */
template <int HSP, int NR, int NT>
__device__ __forceinline__ void load_tile(float *s, const float *__restrict__ src, int64_t ld, int r0, int n, int hs)
{
    constexpr int C4 = HSP / 4, LD = HSP + 4;
    static_assert(NR * C4 % NT == 0, "whole passes");
#pragma unroll 4 /* more loads in flight cost registers the products need */
    for (int it = 0; it < NR * C4 / NT; it++) {
        const int i = it * NT + threadIdx.x, r = i / C4, c = (i % C4) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r0 + r < n && c < hs) v = __ldg(reinterpret_cast<const float4 *>(src + (int64_t)(r0 + r) * ld + c));
        *reinterpret_cast<float4 *>(s + r * LD + c) = v;
    }
}

/* acc[i][j] = sum_d a[ty + RS i][d] b[tx + 16 j][d], d < HSP ascending: the thread's rows of
 * one tile against 4 of the 64 rows of another (q k^T, dout v^T and their transposes). */
template <int HSP, int RS>
__device__ __forceinline__ void mm_abt(float acc[FF_RT][4], const float *a, const float *b, int ty, int tx)
{
    constexpr int LD = HSP + 4;
    const float *ar = a + ty * LD, *br = b + tx * LD;
#pragma unroll
    for (int i = 0; i < FF_RT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
#pragma unroll 2 /* the next step's loads issue under this step's FMAs */
    for (int d = 0; d < HSP; d += 4) {
        float4 x[FF_RT], y[4];
#pragma unroll
        for (int i = 0; i < FF_RT; i++) x[i] = *reinterpret_cast<const float4 *>(ar + RS * i * LD + d);
#pragma unroll
        for (int j = 0; j < 4; j++) y[j] = *reinterpret_cast<const float4 *>(br + 16 * j * LD + d);
#pragma unroll
        for (int i = 0; i < FF_RT; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                acc[i][j] = fmaf(x[i].x, y[j].x, acc[i][j]);
                acc[i][j] = fmaf(x[i].y, y[j].y, acc[i][j]);
                acc[i][j] = fmaf(x[i].z, y[j].z, acc[i][j]);
                acc[i][j] = fmaf(x[i].w, y[j].w, acc[i][j]);
            }
    }
}

/* o[i][c] += sum_k p[ty + RS i][k] b[k][col c], k < 64 ascending: p an (R x FF_LDP) tile (P
 * or d(scores)), b a (64 x LD) tile whose rows are the sum's index (v, k, dout or q). */
template <int HSP, int RS>
__device__ __forceinline__ void mm_add(float o[FF_RT][HSP / 16], const float *p, const float *b, int ty, int tx)
{
    constexpr int LD = HSP + 4, NC = HSP / 16, V = NC < 4 ? NC : 4, G = NC / V;
    const float *pr = p + ty * FF_LDP, *bc = b + tx * V;
#pragma unroll 2
    for (int k = 0; k < FF_KEYS; k += 4) {
        float4 x[FF_RT];
#pragma unroll
        for (int i = 0; i < FF_RT; i++) x[i] = *reinterpret_cast<const float4 *>(pr + RS * i * FF_LDP + k);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float y[NC];
#pragma unroll
            for (int g = 0; g < G; g++) ld_vec<V>(y + g * V, bc + (k + u) * LD + 16 * V * g);
#pragma unroll
            for (int i = 0; i < FF_RT; i++)
#pragma unroll
                for (int c = 0; c < NC; c++) o[i][c] = fmaf(comp(x[i], u), y[c], o[i][c]);
        }
    }
}

/* The thread's rows of a result in registers, times scale, into rows row0.. of dst (ld floats
 * apart); rows at or past n and columns at or past hs are skipped. */
template <int HSP, int RS>
__device__ __forceinline__ void store_rows(float *dst, int64_t ld, const float o[FF_RT][HSP / 16], float scale, int row0,
                                           int n, int hs, int ty, int tx)
{
    constexpr int NC = HSP / 16, V = NC < 4 ? NC : 4, G = NC / V;
#pragma unroll
    for (int i = 0; i < FF_RT; i++) {
        const int row = row0 + ty + RS * i;
        if (row >= n) continue;
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int col = 16 * V * g + V * tx;
            if (col >= hs) continue; /* hs is a multiple of 4 and of V: the vector is whole */
            float *p = dst + (int64_t)row * ld + col;
            const float *r = o[i] + g * V;
            if constexpr (V == 4)
                *reinterpret_cast<float4 *>(p) = make_float4(r[0] * scale, r[1] * scale, r[2] * scale, r[3] * scale);
            else
                *reinterpret_cast<float2 *>(p) = make_float2(r[0] * scale, r[1] * scale);
        }
    }
}

/* ---- kernels: grid (B*H, ceil(T / R)), the tile index in y so that the heaviest start first ---- */

/* Shared memory: the q tile (R rows), k and v tiles (64 rows), P (R x 64). out (B*T, C);
 * lse (B, H, T). sl2 = log2(e) / sqrt(hs). */
template <int HSP, int R> constexpr size_t fwd_smem()
{
    return ((R + 2 * FF_KEYS) * (HSP + 4) + R * FF_LDP) * sizeof(float);
}

template <int HSP, int R>
__global__ void __launch_bounds__(ff_cfg<HSP, R>::NT, FF_MIN_BLOCKS(HSP, R))
    ff_fwd_kernel(const float *__restrict__ qkv, float *__restrict__ out, float *__restrict__ lse, int T, int H, int C,
                  int hs, float sl2)
{
    typedef ff_cfg<HSP, R> F;
    constexpr int NC = F::NC, LD = F::LD, RS = F::RS;
    extern __shared__ float4 ff_smem[];
    float *qs = reinterpret_cast<float *>(ff_smem), *ks = qs + R * LD, *vs = ks + FF_KEYS * LD,
          *ps = vs + FF_KEYS * LD;
    const int bh = blockIdx.x, b = bh / H, h = bh % H, q0 = (gridDim.y - 1 - blockIdx.y) * R;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int64_t ld = 3 * (int64_t)C;
    const float *base = qkv + (int64_t)b * T * ld + h * hs;

    load_tile<HSP, R, F::NT>(qs, base, ld, q0, T, hs);
    float o[FF_RT][NC], m[FF_RT], l[FF_RT];
#pragma unroll
    for (int i = 0; i < FF_RT; i++) {
        m[i] = -INFINITY, l[i] = 0.f;
#pragma unroll
        for (int c = 0; c < NC; c++) o[i][c] = 0.f;
    }
    /* key tiles up to the one holding the tile's last row (R divides 64: the same as its first) */
    for (int k0 = 0; k0 < q0 + R; k0 += FF_KEYS) {
        __syncthreads(); /* the last tile's readers of ks, vs and ps are done */
        load_tile<HSP, FF_KEYS, F::NT>(ks, base + C, ld, k0, T, hs);
        load_tile<HSP, FF_KEYS, F::NT>(vs, base + 2 * C, ld, k0, T, hs);
        __syncthreads();
        float s[FF_RT][4];
        mm_abt<HSP, RS>(s, qs, ks, ty, tx);
#pragma unroll
        for (int i = 0; i < FF_RT; i++) {
            /* Each row has a key in every tile it visits (key k0 <= q0 <= its row), so mx is
             * finite. Rows past T compute on zero rows and are not stored. */
            const int row = q0 + ty + RS * i;
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                s[i][j] = k0 + tx + 16 * j <= row ? s[i][j] * sl2 : -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
            const float mn = fmaxf(m[i], row_max(mx)), alpha = exp2f(m[i] - mn);
            m[i] = mn, l[i] *= alpha;
#pragma unroll
            for (int c = 0; c < NC; c++) o[i][c] *= alpha;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float p = exp2f(s[i][j] - mn);
                l[i] += p;
                ps[(ty + RS * i) * FF_LDP + tx + 16 * j] = p;
            }
        }
        __syncthreads();
        mm_add<HSP, RS>(o, ps, vs, ty, tx);
    }
#pragma unroll
    for (int i = 0; i < FF_RT; i++) {
        l[i] = row_sum(l[i]);
        const float inv = 1.f / l[i];
#pragma unroll
        for (int c = 0; c < NC; c++) o[i][c] *= inv;
    }
    store_rows<HSP, RS>(out + (int64_t)b * T * C + h * hs, C, o, 1.f, q0, T, hs, ty, tx);
    if (tx == 0)
#pragma unroll
        for (int i = 0; i < FF_RT; i++) {
            const int row = q0 + ty + RS * i;
            if (row < T) lse[(int64_t)bh * T + row] = (m[i] + log2f(l[i])) / FF_LOG2E;
        }
}

/* dq of a query tile, and delta = dout . out of its rows (for the key-tile kernel). Shared
 * memory: q and dout tiles (R rows), k and v tiles (64 rows), d(scores) (R x 64). */
template <int HSP, int R> constexpr size_t dq_smem()
{
    return ((2 * R + 2 * FF_KEYS) * (HSP + 4) + R * FF_LDP) * sizeof(float);
}

template <int HSP, int R>
__global__ void __launch_bounds__(ff_cfg<HSP, R>::NT, FF_MIN_BLOCKS(HSP, R))
    ff_bwd_dq_kernel(const float *__restrict__ qkv, const float *__restrict__ out, const float *__restrict__ lse,
                     const float *__restrict__ dout, float *__restrict__ dqkv, float *__restrict__ delta, int T,
                     int H, int C, int hs, float sl2, float scale)
{
    typedef ff_cfg<HSP, R> F;
    constexpr int NC = F::NC, V = F::V, G = F::G, LD = F::LD, RS = F::RS;
    extern __shared__ float4 ff_smem[];
    float *qs = reinterpret_cast<float *>(ff_smem), *gs = qs + R * LD, *ks = gs + R * LD, *vs = ks + FF_KEYS * LD,
          *dss = vs + FF_KEYS * LD;
    const int bh = blockIdx.x, b = bh / H, h = bh % H, q0 = (gridDim.y - 1 - blockIdx.y) * R;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int64_t ld = 3 * (int64_t)C;
    const float *base = qkv + (int64_t)b * T * ld + h * hs;
    const float *gbase = dout + (int64_t)b * T * C + h * hs, *obase = out + (int64_t)b * T * C + h * hs;

    load_tile<HSP, R, F::NT>(qs, base, ld, q0, T, hs);
    load_tile<HSP, R, F::NT>(gs, gbase, C, q0, T, hs);
    __syncthreads();
    /* delta of each row from the thread's columns of dout (the tile) and out, then the row's
     * 16 threads summed; lse in log2 units. Rows past T get 0 (their P is masked to 0). */
    float dl[FF_RT], lr[FF_RT];
#pragma unroll
    for (int i = 0; i < FF_RT; i++) {
        const int row = q0 + ty + RS * i;
        float acc = 0.f;
        if (row < T)
#pragma unroll
            for (int g = 0; g < G; g++) {
                const int col = 16 * V * g + V * tx;
                if (col >= hs) continue;
                float ov[V], gv[V];
                ld_vec<V>(ov, obase + (int64_t)row * C + col);
                ld_vec<V>(gv, gs + (ty + RS * i) * LD + col);
#pragma unroll
                for (int e = 0; e < V; e++) acc = fmaf(gv[e], ov[e], acc);
            }
        dl[i] = row_sum(acc);
        lr[i] = row < T ? lse[(int64_t)bh * T + row] * FF_LOG2E : 0.f;
        if (tx == 0 && row < T) delta[(int64_t)bh * T + row] = dl[i];
    }
    float dq[FF_RT][NC];
#pragma unroll
    for (int i = 0; i < FF_RT; i++)
#pragma unroll
        for (int c = 0; c < NC; c++) dq[i][c] = 0.f;
    for (int k0 = 0; k0 < q0 + R; k0 += FF_KEYS) {
        __syncthreads(); /* the last tile's readers of ks, vs and dss are done */
        load_tile<HSP, FF_KEYS, F::NT>(ks, base + C, ld, k0, T, hs);
        load_tile<HSP, FF_KEYS, F::NT>(vs, base + 2 * C, ld, k0, T, hs);
        __syncthreads();
        float t[FF_RT][4]; /* the scores, then P, then d(scores) */
        mm_abt<HSP, RS>(t, qs, ks, ty, tx);
#pragma unroll
        for (int i = 0; i < FF_RT; i++) {
            const int row = q0 + ty + RS * i;
#pragma unroll
            for (int j = 0; j < 4; j++)
                dss[(ty + RS * i) * FF_LDP + tx + 16 * j] =
                    k0 + tx + 16 * j <= row && row < T ? exp2f(t[i][j] * sl2 - lr[i]) : 0.f;
        }
        mm_abt<HSP, RS>(t, gs, vs, ty, tx); /* dout v^T */
#pragma unroll
        for (int i = 0; i < FF_RT; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float *p = dss + (ty + RS * i) * FF_LDP + tx + 16 * j; /* this thread's own P */
                *p = *p * (t[i][j] - dl[i]);
            }
        __syncthreads();
        mm_add<HSP, RS>(dq, dss, ks, ty, tx);
    }
    store_rows<HSP, RS>(dqkv + (int64_t)b * T * ld + h * hs, ld, dq, scale, q0, T, hs, ty, tx);
}

/* dk and dv of a key tile (R keys), over the 64-query tiles from the one holding its first
 * key. Shared memory: k and v tiles (R rows), q and dout tiles (64 rows), P^T and
 * d(scores)^T (R x 64). */
template <int HSP, int R> constexpr size_t dkv_smem()
{
    return ((2 * R + 2 * FF_KEYS) * (HSP + 4) + 2 * R * FF_LDP) * sizeof(float);
}

template <int HSP, int R>
__global__ void __launch_bounds__(ff_cfg<HSP, R>::NT, FF_MIN_BLOCKS(HSP, R))
    ff_bwd_dkv_kernel(const float *__restrict__ qkv, const float *__restrict__ lse, const float *__restrict__ dout,
                      const float *__restrict__ delta, float *__restrict__ dqkv, int T, int H, int C, int hs,
                      float sl2, float scale)
{
    typedef ff_cfg<HSP, R> F;
    constexpr int NC = F::NC, LD = F::LD, RS = F::RS;
    extern __shared__ float4 ff_smem[];
    __shared__ float lsh[FF_KEYS], dsh[FF_KEYS];
    float *ks = reinterpret_cast<float *>(ff_smem), *vs = ks + R * LD, *qs = vs + R * LD, *gs = qs + FF_KEYS * LD,
          *ps = gs + FF_KEYS * LD, *dss = ps + R * FF_LDP;
    const int bh = blockIdx.x, b = bh / H, h = bh % H, k0 = blockIdx.y * R;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int64_t ld = 3 * (int64_t)C;
    const float *base = qkv + (int64_t)b * T * ld + h * hs, *gbase = dout + (int64_t)b * T * C + h * hs;

    load_tile<HSP, R, F::NT>(ks, base + C, ld, k0, T, hs);
    load_tile<HSP, R, F::NT>(vs, base + 2 * C, ld, k0, T, hs);
    float dk[FF_RT][NC], dv[FF_RT][NC];
#pragma unroll
    for (int i = 0; i < FF_RT; i++)
#pragma unroll
        for (int c = 0; c < NC; c++) dk[i][c] = dv[i][c] = 0.f;
    for (int q0 = k0 / FF_KEYS * FF_KEYS; q0 < T; q0 += FF_KEYS) {
        __syncthreads(); /* the last tile's readers of qs, gs, ps, dss, lsh and dsh are done */
        load_tile<HSP, FF_KEYS, F::NT>(qs, base, ld, q0, T, hs);
        load_tile<HSP, FF_KEYS, F::NT>(gs, gbase, C, q0, T, hs);
        if (threadIdx.x < FF_KEYS) {
            const bool in = q0 + (int)threadIdx.x < T;
            lsh[threadIdx.x] = in ? lse[(int64_t)bh * T + q0 + threadIdx.x] * FF_LOG2E : 0.f;
            dsh[threadIdx.x] = in ? delta[(int64_t)bh * T + q0 + threadIdx.x] : 0.f;
        }
        __syncthreads();
        float t[FF_RT][4]; /* keys ty + RS i by queries tx + 16 j: the scores, then dout v^T */
        mm_abt<HSP, RS>(t, ks, qs, ty, tx);
#pragma unroll
        for (int i = 0; i < FF_RT; i++) {
            const int key = k0 + ty + RS * i;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = tx + 16 * j, q = q0 + c;
                ps[(ty + RS * i) * FF_LDP + c] = q >= key && q < T ? exp2f(t[i][j] * sl2 - lsh[c]) : 0.f;
            }
        }
        mm_abt<HSP, RS>(t, vs, gs, ty, tx);
#pragma unroll
        for (int i = 0; i < FF_RT; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = tx + 16 * j, e = (ty + RS * i) * FF_LDP + c; /* this thread's own P */
                dss[e] = ps[e] * (t[i][j] - dsh[c]);
            }
        __syncthreads();
        mm_add<HSP, RS>(dv, ps, gs, ty, tx);
        mm_add<HSP, RS>(dk, dss, qs, ty, tx);
    }
    float *dbase = dqkv + (int64_t)b * T * ld + h * hs;
    store_rows<HSP, RS>(dbase + C, ld, dk, scale, k0, T, hs, ty, tx);
    store_rows<HSP, RS>(dbase + 2 * C, ld, dv, 1.f, k0, T, hs, ty, tx);
}

/* ---- launchers ---- */

static dim3 grid_of(sg_attn_dims d, int R)
{
    return dim3((unsigned)(d.B * d.H), (unsigned)((d.T + R - 1) / R));
}

template <int HSP, int R>
static sg_status forward(sg_ctx *ctx, const float *qkv, float *out, float *lse, sg_attn_dims d)
{
    const float sl2 = (float)(FF_LOG2E / sqrt((double)d.hs));
    const size_t smem = fwd_smem<HSP, R>();
    SG_CUDA_CHECK(ctx, (sg_smem_optin<ff_fwd_kernel<HSP, R>>(smem, ctx->opts.device)));
    ff_fwd_kernel<HSP, R><<<grid_of(d, R), ff_cfg<HSP, R>::NT, smem, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        qkv, out, lse, (int)d.T, (int)d.H, (int)d.C, (int)d.hs, sl2);
    SG_CUDA_CHECK_LAUNCH(ctx, "ff_fwd_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <int HSP, int R>
static sg_status backward(sg_ctx *ctx, const float *qkv, const float *out, const float *lse, const float *dout,
                          float *dqkv, float *delta, sg_attn_dims d)
{
    const double sc = 1.0 / sqrt((double)d.hs);
    const float sl2 = (float)(FF_LOG2E * sc), scale = (float)sc;
    const size_t s1 = dq_smem<HSP, R>(), s2 = dkv_smem<HSP, R>();
    constexpr int NT = ff_cfg<HSP, R>::NT;
    SG_CUDA_CHECK(ctx, (sg_smem_optin<ff_bwd_dq_kernel<HSP, R>>(s1, ctx->opts.device)));
    SG_CUDA_CHECK(ctx, (sg_smem_optin<ff_bwd_dkv_kernel<HSP, R>>(s2, ctx->opts.device)));
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    ff_bwd_dq_kernel<HSP, R><<<grid_of(d, R), NT, s1, st>>>(qkv, out, lse, dout, dqkv, delta, (int)d.T, (int)d.H,
                                                                (int)d.C, (int)d.hs, sl2, scale);
    SG_CUDA_CHECK_LAUNCH(ctx, "ff_bwd_dq_kernel");
    ff_bwd_dkv_kernel<HSP, R><<<grid_of(d, R), NT, s2, st>>>(qkv, lse, dout, delta, dqkv, (int)d.T, (int)d.H,
                                                                 (int)d.C, (int)d.hs, sl2, scale);
    SG_CUDA_CHECK_LAUNCH(ctx, "ff_bwd_dkv_kernel");
    sg_ctx_count_launches(ctx, 2);
    return SG_OK;
}

/* 64-row blocks, or 32-row ones where 64-row blocks would leave SMs idle (gpt-256-4-8-128:
 * B = 8, T = 128, heads 4). 8 rows a thread (128 threads of 64 rows) measured no faster. */
static bool rows64(sg_ctx *ctx, sg_attn_dims d)
{
    return d.B * d.H * ((d.T + 63) / 64) >= (int64_t)sg_ctx_sm_count(ctx);
}

/* ---- entry points (arguments checked by attention.c, which sends every dtype but bf16 here) ---- */

/* The dtype, head sizes, shapes and alignment these kernels take; SG_ERR_UNSUPPORTED naming
 * what differs. */
static sg_status check_f32(sg_ctx *ctx, const char *fn, const sg_tensor *qkv, sg_attn_dims d,
                           const sg_tensor *const *ts, int n)
{
    if (qkv->dtype != SG_DTYPE_F32 || d.hs % 4 || d.hs > FF_MAX_HS)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: CUDA runs the fused attention in f32 for head sizes that are "
                       "multiples of 4 up to %d, and in bf16 for head size 64; this is %s with head size %lld "
                       "(use sg_attention_forward)", fn, FF_MAX_HS, sg_dtype_name(qkv->dtype), (long long)d.hs);
    if (d.T > INT32_MAX / 2 || d.C > INT32_MAX / 4 || d.B * d.H > INT32_MAX || (d.T + 31) / 32 > 65535)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: B %lld x heads %lld, T %lld, C %lld: past the kernels' "
                       "limits (T <= %d)", fn, (long long)d.B, (long long)d.H, (long long)d.T, (long long)d.C,
                       65535 * 32);
    return sg_attention_check_aligned(ctx, fn, ts, n);
}

/* Under sg_ctx_tf32 (the context's matmuls in TF32), f32 with head size 64 goes to the
 * tensor-core kernels in TF32 (attention_fused_cuda.cu); these FMA kernels take the rest. */
static bool tf32_kernels(sg_ctx *ctx, const sg_tensor *qkv, sg_attn_dims d)
{
    return sg_ctx_tf32(ctx) && qkv->dtype == SG_DTYPE_F32 && d.hs == 64;
}

extern "C" sg_status sg_attention_fused_forward_f32_cuda(sg_ctx *ctx, const sg_tensor *qkv, sg_tensor *out,
                                                         sg_tensor *lse, sg_attn_dims d)
{
    if (tf32_kernels(ctx, qkv, d)) return sg_attention_fused_forward_tf32_cuda(ctx, qkv, out, lse, d);
    const sg_tensor *ts[] = {qkv, out};
    SG_TRY(check_f32(ctx, "sg_attention_fused_forward", qkv, d, ts, 2));
    const float *x = (const float *)qkv->data;
    float *o = (float *)out->data, *l = (float *)lse->data;
    if (rows64(ctx, d)) {
        if (d.hs <= 32) return forward<32, 64>(ctx, x, o, l, d);
        if (d.hs <= 64) return forward<64, 64>(ctx, x, o, l, d);
        return forward<128, 64>(ctx, x, o, l, d);
    }
    if (d.hs <= 32) return forward<32, 32>(ctx, x, o, l, d);
    if (d.hs <= 64) return forward<64, 32>(ctx, x, o, l, d);
    return forward<128, 32>(ctx, x, o, l, d);
}

extern "C" sg_status sg_attention_fused_backward_f32_cuda(sg_ctx *ctx, const sg_tensor *qkv, const sg_tensor *out,
                                                          const sg_tensor *lse, const sg_tensor *dout,
                                                          sg_tensor *dqkv, sg_tensor *delta, sg_attn_dims d)
{
    if (tf32_kernels(ctx, qkv, d)) return sg_attention_fused_backward_tf32_cuda(ctx, qkv, out, lse, dout, dqkv, delta, d);
    const sg_tensor *ts[] = {qkv, out, dout, dqkv};
    SG_TRY(check_f32(ctx, "sg_attention_fused_backward", qkv, d, ts, 4));
    const float *x = (const float *)qkv->data, *o = (const float *)out->data, *l = (const float *)lse->data,
                *g = (const float *)dout->data;
    float *dx = (float *)dqkv->data, *dl = (float *)delta->data;
    if (rows64(ctx, d)) {
        if (d.hs <= 32) return backward<32, 64>(ctx, x, o, l, g, dx, dl, d);
        if (d.hs <= 64) return backward<64, 64>(ctx, x, o, l, g, dx, dl, d);
        return backward<128, 64>(ctx, x, o, l, g, dx, dl, d);
    }
    if (d.hs <= 32) return backward<32, 32>(ctx, x, o, l, g, dx, dl, d);
    if (d.hs <= 64) return backward<64, 32>(ctx, x, o, l, g, dx, dl, d);
    return backward<128, 32>(ctx, x, o, l, g, dx, dl, d);
}
