/* layernorm_cuda.cu: LayerNorm kernels and their launchers, with the residual add fused in
 * where a pre-LayerNorm block has one. Storage type T: f32, or bf16 for mixed precision (x, y,
 * gamma, beta, dy, dx, dgamma, dbeta, and the residual's a, b, s, dres all bf16, as autocast
 * keeps them); math in f32, the saved mean and rstd in f32 for both. Deterministic: every sum
 * runs in a fixed order for a given shape and GPU (grids depend on M, C and the SM count only,
 * the access width on C and the pointers' alignment); no float atomics.
 *
 * Forward (one launch): a group of G threads per row, G = 32 (a warp; 8 rows per block) or, for
 * C >= LN_BLOCK_ROW_MIN_C, G = the block. Two passes over the row (mean, then the variance of
 * x - mean, as the reference does), then a third that writes y. Rows are re-read from L1/L2,
 * not kept in registers, so any C works; 16-byte loads (4 f32 or 8 bf16) where C and the
 * pointers allow. Fused residual (ADD): the first pass reads a and b and writes s = a + b
 * rounded to T, and sums s as rounded; the later passes read s back (the thread's own stores).
 * The access width is chosen from s, y, gamma and beta as the plain kernel chooses it from x,
 * y, gamma and beta (a and b, when not 16-byte aligned, are read element by element at that
 * width), so s, y, mean and rstd are bit for bit those of sg_add_forward then the plain kernel.
 *
 * Backward (two launches). Kernel 1: block b owns rows [b*rpb, (b+1)*rpb) and takes them
 * LN_TILE_ROWS at a time. Phase A: a group per row (as in the forward) sums g and g*xhat
 * (g = dy*gamma, xhat = (x - mean)*rstd) into the tile's row statistics in shared memory.
 * Phase B, by column: a thread owns a vector column (V columns) for every S-th row of the tile
 * (S adjacent lanes share a column; S a power of two up to 32, larger when C has few vector
 * columns, so that the block stays busy); it reads x and dy (and dres) once, writes
 * dx = rstd*(g - mean(g) - xhat*mean(g*xhat)) (+ dres), and adds dy*xhat and dy into double
 * registers in row order. The S lanes' sums are combined by an xor butterfly (a fixed order)
 * and added to the block's partial in scratch (slot SG_SLOT_LAYERNORM, double [nparts][2C],
 * dgamma's columns then dbeta's; a block of more than one tile reads its partial back and adds
 * to it, tile by tile), 16 bytes (two columns) a store, the pairs shared among the S lanes:
 * stored 8 bytes at a time by one lane, the partials took 3 of the kernel's 13 us on gpt-768's
 * rows (the H200, bench/RESULTS.md). So x and dy are read twice, the second time from L1/L2
 * right after the first, and the column sums come from registers phase B holds anyway (the
 * kernel this one replaced read every element a third time, by column, for them). Kernel 2:
 * dgamma and dbeta, each column the sum of the partials in a fixed order (LN_RED_SLICES threads
 * per column, each with all its loads in flight, staged in shared memory by cp.async, then the
 * slices in order), rounded once to T.
 *
 * Why the column sums stay in double: dgamma = sum over rows of dy*xhat has terms of both
 * signs, so over M rows it is near sqrt(M) terms in size while the sum of the terms' magnitudes
 * is near M: f32 partials would add an error near u_f32 * sum|dy*xhat| (u_f32 = 2^-24), about
 * sqrt(M) times the f32 rounding of the result. In double, dgamma and dbeta stay within one
 * rounding to T of the exact sum of the terms. The double adds cost little beside the loads
 * (H100: f64 at half the f32 rate), and the partials (2C doubles per block, 4C with the column
 * sums, at most LN_BWD_BLOCKS_PER_SM blocks per SM) stay in L2. nparts <= MAX_C / C, so the
 * scratch has one fixed size (8 MiB: four sets) and is allocated once per context.
 *
 * Residual gradient (ADD): dx = dres + LayerNorm's dx, the latter rounded to T first and the
 * sum rounded again, bit for bit what the plain kernel then sg_add_forward write.
 *
 * Column sums (NS = 4, sg_layernorm_backward_add_sums): phase B also adds dres and dx as stored
 * into two more double registers per column, in the same row order, and the partials have four
 * sets of C columns (dgamma, dbeta, dres's sums, dx's sums); the reduce kernel takes all 4C. The
 * first two sets are computed as without them, so dgamma and dbeta keep their bits.
 *
 * The arithmetic of the rows is written with rounding intrinsics (__fadd_rn, __fmul_rn,
 * __fmaf_rn, and their double forms): the compiler may fuse a plain a*b + c into an FMA or not,
 * case by case, and the kernels with and without the residual must round every element, and
 * every column sum, the same way. */
#include "ops/layernorm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "ops/dtype_cuda.cuh"

#define LN_THREADS 256
#define LN_WARPS (LN_THREADS / 32)
#define LN_BLOCK_ROW_MIN_C 2048 /* from this many columns a whole block takes one row */
#define LN_FWD_BLOCKS_PER_SM 16 /* forward grid cap (grid-stride beyond it) */
#define LN_BWD_BLOCKS_PER_SM 2  /* backward: at most this many partials per SM */
#define LN_TILE_ROWS 32         /* backward: rows whose statistics a block holds at a time */
#define LN_ROWS_IN_FLIGHT 2     /* backward phase B: rows a thread loads before computing (4
                                 * spilled at 2 blocks per SM in bf16, 128 registers; so did 2
                                 * with the column sums and 8 bf16 a thread, which take 1) */
#define LN_RED_COLS 16          /* reduce kernel: columns per block (128 bytes of a partial) ... */
#define LN_RED_SLICES (LN_THREADS / LN_RED_COLS) /* ... and partial slices per column */
#define LN_RED_CHUNK 256        /* reduce kernel: partials staged at a time (32 KiB a block) */
#define LN_SCRATCH_BYTES ((size_t)4 * SG_LAYERNORM_CUDA_MAX_C * sizeof(double))
#define FULL_MASK 0xffffffffu

/* ---- group sums, fixed order ---- */

/* Sum over the G threads of a row's group, the same value in every one of them (an xor
 * butterfly adds the same two numbers in every lane, so lanes agree bit for bit). G is 32 or
 * LN_THREADS (sh: LN_WARPS floats per value; every thread of the block calls it). */
template <int G> __device__ __forceinline__ float2 group_sum2(float2 v, float2 *sh)
{
    for (int o = 16; o > 0; o >>= 1) {
        v.x += __shfl_xor_sync(FULL_MASK, v.x, o);
        v.y += __shfl_xor_sync(FULL_MASK, v.y, o);
    }
    if (G == 32) return v;
    __syncthreads(); /* the previous readers of sh are done */
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float2 r = sh[0];
    for (int k = 1; k < LN_WARPS; k++) r.x += sh[k].x, r.y += sh[k].y;
    return r;
}

/* V elements at vector index j of p: one access when vec (p 16-byte aligned), else V scalar
 * loads: a fused operand that is not aligned, read at the width the other tensors chose. */
template <typename T, int V> __device__ __forceinline__ vec_t<T, V> ldv_any(const T *p, int64_t j, bool vec)
{
    if (vec) return ldv<T, V>(p, j);
    vec_t<T, V> v;
#pragma unroll
    for (int k = 0; k < V; k++) v.e[k] = p[j * V + k];
    return v;
}

/* LayerNorm's dx of one element, rounded to T: rstd*(g - mean(g) - xhat*mean(g*xhat)) with
 * g = dy*gamma, xhat = (x - mean)*rstd; q = (mean, rstd, mean(g), mean(g*xhat)). */
template <typename T> __device__ __forceinline__ T ln_dx(float dy, float gamma, float x, float4 q)
{
    const float g = __fmul_rn(dy, gamma), xhat = __fmul_rn(__fsub_rn(x, q.x), q.y);
    return from_f<T>(__fmul_rn(q.y, __fmaf_rn(-xhat, q.w, __fsub_rn(g, q.z))));
}

/* ---- forward ---- */

/* x, y (M, C); gamma, beta (C); mean, rstd (M). Group `group` of block b takes rows
 * b*R + group, stepping by gridDim.x*R. V: elements per access (C % V == 0). ADD: x and x2 are
 * a and b (both read by 16-byte accesses only when ab_vec), s = a + b is written and
 * normalised. (No __launch_bounds__ here: with it ptxas held the kernel to 48 registers and
 * spilled.) */
template <typename T, int G, int V, bool ADD>
__global__ void ln_forward_kernel(const T *__restrict__ x, const T *__restrict__ x2,
                                  T *__restrict__ s, bool ab_vec, const T *__restrict__ gamma,
                                  const T *__restrict__ beta, T *__restrict__ y,
                                  float *__restrict__ mean, float *__restrict__ rstd, int64_t M,
                                  int64_t C, float eps)
{
    constexpr int R = LN_THREADS / G;
    __shared__ float2 sh[LN_WARPS];
    sg_pdl_wait(); /* launched programmatically (sg_ctx_pdl): the kernel before it is done */
    const int group = threadIdx.x / G, gt = threadIdx.x % G;
    const int64_t nv = C / V;
    const float inv_c = 1.f / (float)C;
    for (int64_t r = (int64_t)blockIdx.x * R + group; r < M; r += (int64_t)gridDim.x * R) {
        /* What the later passes read: x, or s as this thread stored it in the first. */
        const T *xr = ADD ? s + r * C : x + r * C;
        float2 q = {0.f, 0.f};
        for (int64_t j = gt; j < nv; j += G) {
            vec_t<T, V> xv;
            if (ADD) {
                const vec_t<T, V> av = ldv_any<T, V>(x + r * C, j, ab_vec),
                                  bv = ldv_any<T, V>(x2 + r * C, j, ab_vec);
#pragma unroll
                for (int k = 0; k < V; k++)
                    xv.e[k] = from_f<T>(__fadd_rn(to_f(av.e[k]), to_f(bv.e[k])));
                stv<T, V>(s + r * C, j, xv);
            } else {
                xv = ldv<T, V>(xr, j);
            }
#pragma unroll
            for (int k = 0; k < V; k++) q.x = __fadd_rn(q.x, to_f(xv.e[k]));
        }
        const float m = __fmul_rn(group_sum2<G>(q, sh).x, inv_c);
        q = make_float2(0.f, 0.f);
        for (int64_t j = gt; j < nv; j += G) {
            vec_t<T, V> xv = ldv<T, V>(xr, j);
#pragma unroll
            for (int k = 0; k < V; k++) {
                const float d = __fsub_rn(to_f(xv.e[k]), m);
                q.x = __fmaf_rn(d, d, q.x);
            }
        }
        const float rs = rsqrtf(__fmaf_rn(group_sum2<G>(q, sh).x, inv_c, eps));
        T *yr = y + r * C;
        for (int64_t j = gt; j < nv; j += G) {
            vec_t<T, V> xv = ldv<T, V>(xr, j), gv = ldv<T, V>(gamma, j), bv = ldv<T, V>(beta, j);
            vec_t<T, V> yv;
#pragma unroll
            for (int k = 0; k < V; k++)
                yv.e[k] = from_f<T>(__fmaf_rn(__fmul_rn(__fsub_rn(to_f(xv.e[k]), m), rs),
                                              to_f(gv.e[k]), to_f(bv.e[k])));
            stv<T, V>(yr, j, yv);
        }
        if (gt == 0) {
            mean[r] = m;
            rstd[r] = rs;
        }
    }
}

/* ---- backward ---- */

/* A block's partial of column c (of pair c2: columns 2 c2, 2 c2 + 1, one 16-byte access):
 * stored on the block's first tile, added to after. */
__device__ __forceinline__ void pb_add(double *p, int64_t c, bool first, double v)
{
    p[c] = first ? v : p[c] + v;
}
__device__ __forceinline__ void pb_add2(double *p, int64_t c2, bool first, double a, double b)
{
    double2 *q = reinterpret_cast<double2 *>(p) + c2;
    if (first) {
        *q = make_double2(a, b);
    } else {
        const double2 o = *q;
        *q = make_double2(o.x + a, o.y + b);
    }
}

/* Kernel 1. x, dy, dres, dx (M, C); gamma (C); mean, rstd (M); partials (gridDim.x, NS*C):
 * block b's sum over its rows of dy*xhat (columns 0..C-1) and of dy (C..2C-1), and with NS = 4
 * (launched with ADD only) of dres (2C..3C-1) and of dx as stored (3C..4C-1). ADD: dres is
 * added to dx (read by 16-byte accesses only when dres_vec). The launch bounds keep the grid's
 * LN_BWD_BLOCKS_PER_SM blocks resident at once (at most 128 registers; no spills, by ptxas -v,
 * CUDA 13, sm_90). */
template <typename T, int G, int V, bool ADD, int NS>
__global__ void __launch_bounds__(LN_THREADS, LN_BWD_BLOCKS_PER_SM)
    ln_backward_rows_kernel(const T *__restrict__ x, const T *__restrict__ gamma,
                            const float *__restrict__ mean, const float *__restrict__ rstd,
                            const T *__restrict__ dy, const T *__restrict__ dres, bool dres_vec,
                            T *__restrict__ dx, double *__restrict__ partials, int64_t M,
                            int64_t C, int64_t rpb)
{
    static_assert(NS == 2 || (NS == 4 && ADD), "the dres and dx sums (NS = 4) come with ADD");
    constexpr int R = LN_THREADS / G, U = NS == 4 && V == 8 ? 1 : LN_ROWS_IN_FLIGHT;
    __shared__ float2 sh[LN_WARPS];
    __shared__ float4 st[LN_TILE_ROWS]; /* per tile row: mean, rstd, mean(g), mean(g*xhat) */
    sg_pdl_wait(); /* launched programmatically (sg_ctx_pdl): the kernel before it is done */
    const int group = threadIdx.x / G, gt = threadIdx.x % G;
    const int64_t nv = C / V;
    const float inv_c = 1.f / (float)C;
    const int64_t r0 = (int64_t)blockIdx.x * rpb, r1 = r0 + rpb < M ? r0 + rpb : M;
    /* Phase B's layout: S lanes per vector column, cpp columns per pass of the block. */
    int S = 1;
    while (S < 32 && 2 * S * nv <= LN_THREADS) S *= 2;
    const int sl = threadIdx.x % S, cpp = LN_THREADS / S;
    double *pb = partials + (int64_t)blockIdx.x * NS * C;

    for (int64_t t0 = r0; t0 < r1; t0 += LN_TILE_ROWS) {
        const int nt = (int)(r1 - t0 < LN_TILE_ROWS ? r1 - t0 : LN_TILE_ROWS);

        /* Phase A: the tile's row sums, a group per row (the loop is uniform over the group,
         * so over the block when G is). */
        for (int i = group; i < nt; i += R) {
            const int64_t r = t0 + i;
            const T *xr = x + r * C, *dyr = dy + r * C;
            const float m = mean[r], s = rstd[r];
            float2 a = {0.f, 0.f}; /* sum g, sum g * xhat */
            for (int64_t j = gt; j < nv; j += G) {
                vec_t<T, V> xv = ldv<T, V>(xr, j), dv = ldv<T, V>(dyr, j), gv = ldv<T, V>(gamma, j);
#pragma unroll
                for (int k = 0; k < V; k++) {
                    const float g = __fmul_rn(to_f(dv.e[k]), to_f(gv.e[k]));
                    a.x = __fadd_rn(a.x, g);
                    a.y = __fmaf_rn(g, __fmul_rn(__fsub_rn(to_f(xv.e[k]), m), s), a.y);
                }
            }
            a = group_sum2<G>(a, sh);
            if (gt == 0) st[i] = make_float4(m, s, __fmul_rn(a.x, inv_c), __fmul_rn(a.y, inv_c));
        }
        __syncthreads();

        /* Phase B: dx and the column sums, a vector column and every S-th row of the tile per
         * thread (rows sl, sl + S, ...: U of them loaded before any is used). Every thread runs
         * every pass, so the whole warp reaches the butterfly. */
        for (int64_t jb = 0; jb < nv; jb += cpp) {
            const int64_t j = jb + threadIdx.x / S;
            const bool on = j < nv;
            double dg[V], db[V], sr[NS == 4 ? V : 1], sx[NS == 4 ? V : 1];
#pragma unroll
            for (int k = 0; k < V; k++) dg[k] = db[k] = 0;
#pragma unroll
            for (int k = 0; k < (NS == 4 ? V : 1); k++) sr[k] = sx[k] = 0;
            if (on) {
                const vec_t<T, V> gv = ldv<T, V>(gamma, j);
                for (int i0 = sl; i0 < nt; i0 += U * S) {
                    vec_t<T, V> xs[U], ds[U], res[U];
#pragma unroll
                    for (int u = 0; u < U; u++)
                        if (i0 + u * S < nt) {
                            const int64_t o = (t0 + i0 + u * S) * nv + j;
                            xs[u] = ldv<T, V>(x, o), ds[u] = ldv<T, V>(dy, o);
                            if (ADD) res[u] = ldv_any<T, V>(dres, o, dres_vec);
                        }
#pragma unroll
                    for (int u = 0; u < U; u++)
                        if (i0 + u * S < nt) {
                            const float4 q = st[i0 + u * S]; /* mean, rstd, mean(g), mean(g xhat) */
                            vec_t<T, V> out;
#pragma unroll
                            for (int k = 0; k < V; k++) {
                                const float d = to_f(ds[u].e[k]), xk = to_f(xs[u].e[k]);
                                const T v = ln_dx<T>(d, to_f(gv.e[k]), xk, q);
                                out.e[k] = ADD ? from_f<T>(__fadd_rn(to_f(res[u].e[k]), to_f(v))) : v;
                                const double xh = __dmul_rn(__dsub_rn(xk, q.x), q.y);
                                dg[k] = __fma_rn(d, xh, dg[k]);
                                db[k] = __dadd_rn(db[k], d);
                                if (NS == 4) {
                                    sr[k] = __dadd_rn(sr[k], to_f(res[u].e[k]));
                                    sx[k] = __dadd_rn(sx[k], to_f(out.e[k]));
                                }
                            }
                            stv<T, V>(dx, (t0 + i0 + u * S) * nv + j, out);
                        }
                }
            }
            /* The S lanes of a column (adjacent, S-aligned) combine their rows' sums. */
            for (int o = 1; o < S; o <<= 1)
#pragma unroll
                for (int k = 0; k < V; k++) {
                    dg[k] += __shfl_xor_sync(FULL_MASK, dg[k], o);
                    db[k] += __shfl_xor_sync(FULL_MASK, db[k], o);
                    if (NS == 4) {
                        sr[k] += __shfl_xor_sync(FULL_MASK, sr[k], o);
                        sx[k] += __shfl_xor_sync(FULL_MASK, sx[k], o);
                    }
                }
            /* Every lane of the S has the sums; column pair p (16 bytes of a set) is stored by
             * lane p % S. */
            if (on && V == 1 && sl == 0) {
                pb_add(pb, j, t0 == r0, dg[0]);
                pb_add(pb + C, j, t0 == r0, db[0]);
                if (NS == 4) {
                    pb_add(pb + 2 * C, j, t0 == r0, sr[0]);
                    pb_add(pb + 3 * C, j, t0 == r0, sx[0]);
                }
            }
            if (on && V > 1) {
                const int64_t c0 = j * V / 2; /* the thread's first pair */
                const bool first = t0 == r0;
#pragma unroll
                for (int p = 0; p < V / 2; p++)
                    if (p % S == sl) pb_add2(pb, c0 + p, first, dg[2 * p], dg[2 * p + 1]);
#pragma unroll
                for (int p = 0; p < V / 2; p++)
                    if (p % S == sl) pb_add2(pb + C, c0 + p, first, db[2 * p], db[2 * p + 1]);
                if (NS == 4) {
#pragma unroll
                    for (int p = 0; p < V / 2; p++)
                        if (p % S == sl)
                            pb_add2(pb + 2 * C, c0 + p, first, sr[2 * p], sr[2 * p + 1]);
#pragma unroll
                    for (int p = 0; p < V / 2; p++)
                        if (p % S == sl)
                            pb_add2(pb + 3 * C, c0 + p, first, sx[2 * p], sx[2 * p + 1]);
                }
            }
        }
        __syncthreads(); /* st is rewritten by the next tile */
    }
}

/* Kernel 1, one warp a row (bf16, C a multiple of 8 up to LN_WARP_MAX_C, 16-byte aligned x,
 * dy, dx, gamma; the rows kernel below otherwise). Warp w of block b takes rows r0 + w,
 * r0 + w + LN_WARPS, ... of its rows [r0, r1) and holds each row in registers: x, dy, dres
 * and gamma read once (no second pass from L1/L2, no barrier between the row sums and dx),
 * the row sums in phase A's order (lane j's vectors j, j + 32, ..., then the butterfly), so
 * that mean(g), mean(g xhat) and dx are the rows kernel's bits. The column terms (dy*xhat
 * and dy, with NS = 4 dres and dx as stored) go to shared memory in f32, a slice per warp
 * (added to, row by row, when a warp takes more than one); after one barrier each thread
 * sums a column's slices in warp order, in f32, and stores the block's partial as a double,
 * in the rows kernel's layout, for the same reduction. dgamma's terms are rounded to f32 (the
 * rows kernel keeps them in double): each term within 2^-24 of itself, the 8 slices' f32 sum
 * within 8 * 2^-24 of the terms' magnitudes, far below bf16's rounding of the result. */
#define LN_WARP_MAX_C 768
#define LN_WARP_NVL (LN_WARP_MAX_C / 8 / 32) /* 16-byte vectors a lane holds of a row */
template <int NS, bool ADD>
__global__ void __launch_bounds__(LN_THREADS, 2)
    ln_backward_warp_kernel(const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ gamma,
                            const float *__restrict__ mean, const float *__restrict__ rstd,
                            const __nv_bfloat16 *__restrict__ dy, const __nv_bfloat16 *__restrict__ dres,
                            bool dres_vec, __nv_bfloat16 *__restrict__ dx, double *__restrict__ partials,
                            int64_t M, int64_t C, int64_t rpb)
{
    typedef __nv_bfloat16 T;
    constexpr int V = 8;
    extern __shared__ float cs[]; /* [NS][LN_WARPS][C] */
    sg_pdl_wait(); /* launched programmatically (sg_ctx_pdl): the kernel before it is done */
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t nv = C / V;
    const float inv_c = 1.f / (float)C;
    const int64_t r0 = (int64_t)blockIdx.x * rpb, r1 = r0 + rpb < M ? r0 + rpb : M;
    for (int64_t r = r0 + w; r < r1; r += LN_WARPS) {
        vec_t<T, V> xv[LN_WARP_NVL], dv[LN_WARP_NVL], gv[LN_WARP_NVL];
#pragma unroll
        for (int u = 0; u < LN_WARP_NVL; u++) {
            const int64_t j = lane + 32 * u;
            if (j < nv) {
                xv[u] = ldv<T, V>(x + r * C, j), dv[u] = ldv<T, V>(dy + r * C, j);
                gv[u] = ldv<T, V>(gamma, j);
            }
        }
        const float m = mean[r], sd = rstd[r];
        float2 a = {0.f, 0.f}; /* sum g, sum g * xhat: phase A's order */
#pragma unroll
        for (int u = 0; u < LN_WARP_NVL; u++)
            if (lane + 32 * u < nv)
#pragma unroll
                for (int k = 0; k < V; k++) {
                    const float g = __fmul_rn(to_f(dv[u].e[k]), to_f(gv[u].e[k]));
                    a.x = __fadd_rn(a.x, g);
                    a.y = __fmaf_rn(g, __fmul_rn(__fsub_rn(to_f(xv[u].e[k]), m), sd), a.y);
                }
        a = group_sum2<32>(a, nullptr);
        const float4 q = make_float4(m, sd, __fmul_rn(a.x, inv_c), __fmul_rn(a.y, inv_c));
        const bool first = r == r0 + w;
#pragma unroll
        for (int u = 0; u < LN_WARP_NVL; u++) {
            const int64_t j = lane + 32 * u;
            if (j >= nv) continue;
            vec_t<T, V> out, rv;
            if (ADD) rv = ldv_any<T, V>(dres + r * C, j, dres_vec); /* read here: fewer registers */
#pragma unroll
            for (int k = 0; k < V; k++) {
                const T v = ln_dx<T>(to_f(dv[u].e[k]), to_f(gv[u].e[k]), to_f(xv[u].e[k]), q);
                out.e[k] = ADD ? from_f<T>(__fadd_rn(to_f(rv.e[k]), to_f(v))) : v;
            }
            stv<T, V>(dx + r * C, j, out);
            /* The column terms, a set at a time (8 floats live, not 8 NS). */
#pragma unroll
            for (int set = 0; set < NS; set++) {
                float t[V];
#pragma unroll
                for (int k = 0; k < V; k++) {
                    const float d = to_f(dv[u].e[k]);
                    t[k] = set == 0   ? __fmul_rn(d, __fmul_rn(__fsub_rn(to_f(xv[u].e[k]), q.x), q.y))
                           : set == 1 ? d
                           : set == 2 ? to_f(rv.e[k])
                                      : to_f(out.e[k]);
                }
                float4 *c4 = reinterpret_cast<float4 *>(cs + ((int64_t)set * LN_WARPS + w) * C + j * V);
                float4 lo = make_float4(t[0], t[1], t[2], t[3]), hi = make_float4(t[4], t[5], t[6], t[7]);
                if (!first) {
                    const float4 a0 = c4[0], a1 = c4[1];
                    lo = make_float4(__fadd_rn(a0.x, lo.x), __fadd_rn(a0.y, lo.y), __fadd_rn(a0.z, lo.z),
                                     __fadd_rn(a0.w, lo.w));
                    hi = make_float4(__fadd_rn(a1.x, hi.x), __fadd_rn(a1.y, hi.y), __fadd_rn(a1.z, hi.z),
                                     __fadd_rn(a1.w, hi.w));
                }
                c4[0] = lo, c4[1] = hi;
            }
        }
    }
    __syncthreads();
    /* Column c of set s: the warps' slices in warp order (only warps that had a row). */
    const int wn = r1 - r0 < LN_WARPS ? (int)(r1 - r0) : LN_WARPS;
    double *pb = partials + (int64_t)blockIdx.x * NS * C;
    for (int64_t i = threadIdx.x; i < NS * C; i += LN_THREADS) {
        const int64_t set = i / C, c = i - set * C;
        float v = cs[(set * LN_WARPS) * C + c];
        for (int k = 1; k < wn; k++) v = __fadd_rn(v, cs[(set * LN_WARPS + k) * C + c]);
        pb[i] = (double)v;
    }
}

/* cp.async (sm_80 on): 8 bytes from global to shared memory, not through registers, so a
 * thread has all its copies in flight at once; src_size 0 reads nothing and writes zeros. */
__device__ __forceinline__ void ln_cp_async8(void *dst, const void *src, int src_size)
{
    const uint32_t sdst = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(sdst),
                 "l"(__cvta_generic_to_global(src)), "r"(src_size)
                 : "memory");
}

/* Kernel 2. Column j of the NS*C partial columns (dgamma, dbeta, and with NS = 4 dres's and
 * dx's sums; out[k] receives set k, NULL: not written): LN_RED_SLICES threads each
 * sum every LN_RED_SLICES-th partial in order, then one adds the slices in order. A thread
 * copies the partials it sums into shared memory first, LN_RED_CHUNK partials of its column
 * (LN_RED_CHUNK / LN_RED_SLICES copies) at a time, all in flight together: loaded straight
 * into registers, ptxas paced the loads a few ahead of the serial adds, and the kernel waited
 * out one load latency after another. Each thread reads back only its own copies, so a chunk
 * needs no barrier before its reads, only one before the next chunk's copies go over them. */
template <typename T>
__global__ void __launch_bounds__(LN_THREADS)
    ln_backward_reduce_kernel(const double *__restrict__ partials, int nparts, int64_t C, int ns,
                              T *out0, T *out1, T *out2, T *out3)
{
    __shared__ double tile[LN_RED_CHUNK][LN_RED_COLS];
    __shared__ double sh[LN_RED_SLICES][LN_RED_COLS];
    const int cx = threadIdx.x % LN_RED_COLS, sy = threadIdx.x / LN_RED_COLS;
    const int64_t j = (int64_t)blockIdx.x * LN_RED_COLS + cx;
    const bool in = j < ns * C;
    double a = 0;
    for (int p0 = 0; p0 < nparts; p0 += LN_RED_CHUNK) {
        const int np = nparts - p0 < LN_RED_CHUNK ? nparts - p0 : LN_RED_CHUNK;
        for (int pr = sy; pr < np; pr += LN_RED_SLICES)
            ln_cp_async8(&tile[pr][cx], in ? partials + (int64_t)(p0 + pr) * ns * C + j : partials,
                         in ? 8 : 0);
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        for (int pr = sy; pr < np; pr += LN_RED_SLICES) a += tile[pr][cx];
        if (p0 + LN_RED_CHUNK < nparts) __syncthreads(); /* reads done before copies over them */
    }
    sh[sy][cx] = a;
    __syncthreads();
    if (sy == 0 && in) {
        for (int k = 1; k < LN_RED_SLICES; k++) a += sh[k][cx];
        const int set = (int)(j / C);
        T *o = set == 0 ? out0 : set == 1 ? out1 : set == 2 ? out2 : out3;
        if (o) o[j - set * C] = from_d<T>(a);
    }
}

/* ---- launchers ---- */

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

static int cap_blocks(int64_t want, int64_t cap)
{
    return (int)(want < 1 ? 1 : (want < cap ? want : cap));
}

/* One forward launch: b NULL, the plain kernel on a; else the fused one. */
template <typename T, int G, int V>
static cudaError_t launch_forward(int blocks, cudaStream_t st, bool pdl, const sg_tensor *a, const sg_tensor *b,
                           bool ab_vec, const sg_tensor *gamma, const sg_tensor *beta, float eps,
                           sg_tensor *s, sg_tensor *y, sg_tensor *mean, sg_tensor *rstd, int64_t M,
                           int64_t C)
{
    const T *pa = (const T *)a->data, *pg = (const T *)gamma->data, *pbeta = (const T *)beta->data;
    T *py = (T *)y->data;
    float *pm = (float *)mean->data, *pr = (float *)rstd->data;
    const sg_pdl_launch l(dim3(blocks), dim3(LN_THREADS), 0, st, pdl);
    if (b)
        return cudaLaunchKernelEx(&l.cfg, ln_forward_kernel<T, G, V, true>, pa, (const T *)b->data, (T *)s->data,
                                  ab_vec, pg, pbeta, py, pm, pr, M, C, eps);
    return cudaLaunchKernelEx(&l.cfg, ln_forward_kernel<T, G, V, false>, pa, (const T *)nullptr, (T *)nullptr,
                              false, pg, pbeta, py, pm, pr, M, C, eps);
}

template <typename T>
static sg_status forward_t(sg_ctx *ctx, const sg_tensor *a, const sg_tensor *b,
                           const sg_tensor *gamma, const sg_tensor *beta, float eps, sg_tensor *s,
                           sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    constexpr int VEC = 16 / sizeof(T);
    const int64_t C = a->shape[a->ndim - 1], M = a->numel / C;
    /* The width follows the tensor LayerNorm reads (s when fused), as the plain call's does;
     * a and b then take it where they are aligned, else element by element. */
    const sg_tensor *xn = b ? s : a;
    const bool vec = C % VEC == 0 && aligned16(xn->data) && aligned16(y->data) &&
                     aligned16(gamma->data) && aligned16(beta->data);
    const bool ab_vec = b && aligned16(a->data) && aligned16(b->data);
    const bool block_row = C >= LN_BLOCK_ROW_MIN_C;
    const int64_t rows_per_block = block_row ? 1 : LN_WARPS;
    const int blocks = cap_blocks((M + rows_per_block - 1) / rows_per_block,
                                  (int64_t)sg_ctx_sm_count(ctx) * LN_FWD_BLOCKS_PER_SM);
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    const bool pdl = sg_ctx_pdl(ctx);
    cudaError_t le;
    if (block_row && vec)
        le = launch_forward<T, LN_THREADS, VEC>(blocks, st, pdl, a, b, ab_vec, gamma, beta, eps, s, y, mean,
                                                rstd, M, C);
    else if (block_row)
        le = launch_forward<T, LN_THREADS, 1>(blocks, st, pdl, a, b, ab_vec, gamma, beta, eps, s, y, mean,
                                              rstd, M, C);
    else if (vec)
        le = launch_forward<T, 32, VEC>(blocks, st, pdl, a, b, ab_vec, gamma, beta, eps, s, y, mean, rstd, M, C);
    else
        le = launch_forward<T, 32, 1>(blocks, st, pdl, a, b, ab_vec, gamma, beta, eps, s, y, mean, rstd, M, C);
    SG_CUDA_CHECK(ctx, le);
    SG_CUDA_CHECK_LAUNCH(ctx, "ln_forward_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* One launch of kernel 1: dres NULL, the plain kernel; else the one that adds it; NS sets of
 * column sums (2, or 4 with dres's and dx's: sg_layernorm_backward_add_sums requires dres, so
 * NS = 4 has only the adding kernel). */
template <typename T, int G, int V, int NS>
static cudaError_t launch_backward_rows_ns(int blocks, cudaStream_t st, bool pdl, const sg_tensor *x,
                                    const sg_tensor *gamma, const sg_tensor *mean,
                                    const sg_tensor *rstd, const sg_tensor *dy,
                                    const sg_tensor *dres, bool dres_vec, sg_tensor *dx,
                                    double *partials, int64_t M, int64_t C, int64_t rpb)
{
    const T *px = (const T *)x->data, *pg = (const T *)gamma->data, *pdy = (const T *)dy->data;
    const float *pm = (const float *)mean->data, *pr = (const float *)rstd->data;
    const sg_pdl_launch l(dim3(blocks), dim3(LN_THREADS), 0, st, pdl);
    if (dres)
        return cudaLaunchKernelEx(&l.cfg, ln_backward_rows_kernel<T, G, V, true, NS>, px, pg, pm, pr, pdy,
                                  (const T *)dres->data, dres_vec, (T *)dx->data, partials, M, C, rpb);
    else if constexpr (NS == 2)
        return cudaLaunchKernelEx(&l.cfg, ln_backward_rows_kernel<T, G, V, false, NS>, px, pg, pm, pr, pdy,
                                  (const T *)nullptr, false, (T *)dx->data, partials, M, C, rpb);
    return cudaSuccess;
}

template <typename T, int G, int V>
static cudaError_t launch_backward_rows(int ns, int blocks, cudaStream_t st, bool pdl, const sg_tensor *x,
                                 const sg_tensor *gamma, const sg_tensor *mean,
                                 const sg_tensor *rstd, const sg_tensor *dy, const sg_tensor *dres,
                                 bool dres_vec, sg_tensor *dx, double *partials, int64_t M,
                                 int64_t C, int64_t rpb)
{
    if (ns == 4)
        return launch_backward_rows_ns<T, G, V, 4>(blocks, st, pdl, x, gamma, mean, rstd, dy, dres, dres_vec,
                                            dx, partials, M, C, rpb);
    return launch_backward_rows_ns<T, G, V, 2>(blocks, st, pdl, x, gamma, mean, rstd, dy, dres, dres_vec,
                                            dx, partials, M, C, rpb);
}

/* One launch of the warp-a-row kernel (bf16 only: the caller chooses it for bf16). Its shared
 * memory: NS slices of LN_WARPS x C floats, above the 48 KiB default at C > 384, so the limit is
 * raised for the launch (each launch, as the fused attention's are: a context may be on any
 * device, and the call is allowed inside a capture). */
template <int NS>
static cudaError_t launch_backward_warp_ns(int blocks, cudaStream_t st, bool pdl, const sg_tensor *x,
                                           const sg_tensor *gamma, const sg_tensor *mean, const sg_tensor *rstd,
                                           const sg_tensor *dy, const sg_tensor *dres, bool dres_vec, sg_tensor *dx,
                                           double *partials, int64_t M, int64_t C, int64_t rpb)
{
    typedef __nv_bfloat16 T;
    const size_t smem = (size_t)NS * LN_WARPS * (size_t)C * sizeof(float);
    const T *px = (const T *)x->data, *pg = (const T *)gamma->data, *pdy = (const T *)dy->data;
    const float *pm = (const float *)mean->data, *pr = (const float *)rstd->data;
    const sg_pdl_launch l(dim3(blocks), dim3(LN_THREADS), smem, st, pdl);
    cudaError_t e;
    if (dres) {
        e = cudaFuncSetAttribute(ln_backward_warp_kernel<NS, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem);
        if (e != cudaSuccess) return e;
        return cudaLaunchKernelEx(&l.cfg, ln_backward_warp_kernel<NS, true>, px, pg, pm, pr, pdy,
                                  (const T *)dres->data, dres_vec, (T *)dx->data, partials, M, C, rpb);
    }
    if constexpr (NS == 2) {
        e = cudaFuncSetAttribute(ln_backward_warp_kernel<NS, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem);
        if (e != cudaSuccess) return e;
        return cudaLaunchKernelEx(&l.cfg, ln_backward_warp_kernel<NS, false>, px, pg, pm, pr, pdy,
                                  (const T *)nullptr, false, (T *)dx->data, partials, M, C, rpb);
    }
    return cudaSuccess;
}

static cudaError_t launch_backward_warp(int ns, int blocks, cudaStream_t st, bool pdl, const sg_tensor *x,
                                        const sg_tensor *gamma, const sg_tensor *mean, const sg_tensor *rstd,
                                        const sg_tensor *dy, const sg_tensor *dres, bool dres_vec, sg_tensor *dx,
                                        double *partials, int64_t M, int64_t C, int64_t rpb)
{
    return ns == 4 ? launch_backward_warp_ns<4>(blocks, st, pdl, x, gamma, mean, rstd, dy, dres, dres_vec, dx,
                                                partials, M, C, rpb)
                   : launch_backward_warp_ns<2>(blocks, st, pdl, x, gamma, mean, rstd, dy, dres, dres_vec, dx,
                                                partials, M, C, rpb);
}

template <typename T>
static sg_status backward_t(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                            const sg_tensor *mean, const sg_tensor *rstd, const sg_tensor *dy,
                            const sg_tensor *dres, sg_tensor *dx, sg_tensor *dgamma,
                            sg_tensor *dbeta, sg_tensor *dres_sum, sg_tensor *dx_sum)
{
    constexpr int VEC = 16 / sizeof(T);
    const int ns = dres_sum || dx_sum ? 4 : 2; /* sets of column sums in the partials */
    SG_ASSERT(ns == 2 || dres); /* the sums come with dres only (no NS = 4 kernel without it) */
    const int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    /* Deferred (sg_ctx_side_deferred: the default STEPGRAPH_WGRAD, inside a module's region):
     * the reduction goes to the second stream, unjoined, reading partials in one of two slots;
     * a third call joins before it writes either (sg_ctx_side_busy). */
    const bool defer = sg_ctx_side_deferred(ctx);
    sg_scratch_slot slot = SG_SLOT_LAYERNORM;
    unsigned bit = SG_SIDE_LN_A;
    if (defer && (sg_ctx_side_busy(ctx) & SG_SIDE_LN_A)) {
        if (sg_ctx_side_busy(ctx) & SG_SIDE_LN_B) SG_TRY(sg_ctx_side_join(ctx));
        else slot = SG_SLOT_LAYERNORM_B, bit = SG_SIDE_LN_B;
    }
    /* Always the same size (the entry point caps C), so each slot's buffer is allocated once
     * and its address never changes: a captured graph keeps pointing at it. */
    void *scratch;
    SG_TRY(sg_ctx_scratch(ctx, slot, LN_SCRATCH_BYTES, &scratch));
    double *partials = (double *)scratch;

    /* Partials: at most LN_BWD_BLOCKS_PER_SM per SM, and as many as the scratch holds with
     * four sets (4C doubles each), whether this call has two sets or four: so the grid, and
     * with it dgamma's and dbeta's order, is the same with and without the column sums. Rows
     * are split evenly; grid = the blocks that get rows. */
    /* bf16 rows of at most LN_WARP_MAX_C, aligned: the warp-a-row kernel, with at least a row
     * for each of a block's warps. */
    const bool warp_rows = sizeof(T) == 2 && C % 8 == 0 && C <= LN_WARP_MAX_C &&
                           aligned16(x->data) && aligned16(dy->data) && aligned16(dx->data) &&
                           aligned16(gamma->data);
    int64_t want = warp_rows ? (M + LN_WARPS - 1) / LN_WARPS : M;
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * LN_BWD_BLOCKS_PER_SM;
    if (want > cap) want = cap;
    if (want > SG_LAYERNORM_CUDA_MAX_C / C) want = SG_LAYERNORM_CUDA_MAX_C / C;
    if (want < 1) want = 1;
    const int64_t rpb = (M + want - 1) / want;
    const int blocks = (int)((M + rpb - 1) / rpb);

    /* The width follows x, dy, dx and gamma (as without dres); dres takes it where aligned. */
    const bool vec = C % VEC == 0 && aligned16(x->data) && aligned16(dy->data) &&
                     aligned16(dx->data) && aligned16(gamma->data);
    const bool dres_vec = dres && aligned16(dres->data);
    const bool block_row = C >= LN_BLOCK_ROW_MIN_C;
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    const bool pdl = sg_ctx_pdl(ctx);
    cudaError_t le = cudaSuccess;
    if (warp_rows)
        le = launch_backward_warp(ns, blocks, st, pdl, x, gamma, mean, rstd, dy, dres, dres_vec, dx, partials, M, C,
                                  rpb);
    else if (block_row && vec)
        le = launch_backward_rows<T, LN_THREADS, VEC>(ns, blocks, st, pdl, x, gamma, mean, rstd, dy, dres,
                                                      dres_vec, dx, partials, M, C, rpb);
    else if (block_row)
        le = launch_backward_rows<T, LN_THREADS, 1>(ns, blocks, st, pdl, x, gamma, mean, rstd, dy, dres,
                                                    dres_vec, dx, partials, M, C, rpb);
    else if (vec)
        le = launch_backward_rows<T, 32, VEC>(ns, blocks, st, pdl, x, gamma, mean, rstd, dy, dres, dres_vec, dx,
                                              partials, M, C, rpb);
    else
        le = launch_backward_rows<T, 32, 1>(ns, blocks, st, pdl, x, gamma, mean, rstd, dy, dres, dres_vec, dx,
                                            partials, M, C, rpb);
    SG_CUDA_CHECK(ctx, le);
    SG_CUDA_CHECK_LAUNCH(ctx, "ln_backward_rows_kernel");
    sg_ctx_count_launches(ctx, 1);

    const int red_blocks = (int)((ns * C + LN_RED_COLS - 1) / LN_RED_COLS);
    if (defer) {
        SG_TRY(sg_ctx_side_fork(ctx));
        sg_ctx_side_mark(ctx, bit);
        st = (cudaStream_t)sg_ctx_side_stream(ctx);
    }
    ln_backward_reduce_kernel<T><<<red_blocks, LN_THREADS, 0, st>>>(
        partials, blocks, C, ns, (T *)dgamma->data, (T *)dbeta->data,
        dres_sum ? (T *)dres_sum->data : nullptr, dx_sum ? (T *)dx_sum->data : nullptr);
    SG_CUDA_CHECK_LAUNCH(ctx, "ln_backward_reduce_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

extern "C" sg_status sg_layernorm_forward_cuda(sg_ctx *ctx, const sg_tensor *a,
                                               const sg_tensor *b, const sg_tensor *gamma,
                                               const sg_tensor *beta, float eps, sg_tensor *s,
                                               sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    switch (a->dtype) {
    case SG_DTYPE_F32:
        return forward_t<float>(ctx, a, b, gamma, beta, eps, s, y, mean, rstd);
    case SG_DTYPE_BF16:
        return forward_t<__nv_bfloat16>(ctx, a, b, gamma, beta, eps, s, y, mean, rstd);
    default:
        return sg_fail(ctx, SG_ERR_DTYPE, "%s: '%s' is %s; the CUDA kernels take f32 or bf16",
                       b ? "sg_add_layernorm_forward" : "sg_layernorm_forward", b ? "a" : "x",
                       sg_dtype_name(a->dtype));
    }
}

extern "C" sg_status sg_layernorm_backward_cuda(sg_ctx *ctx, const sg_tensor *x,
                                                const sg_tensor *gamma, const sg_tensor *mean,
                                                const sg_tensor *rstd, const sg_tensor *dy,
                                                const sg_tensor *dres, sg_tensor *dx,
                                                sg_tensor *dgamma, sg_tensor *dbeta,
                                                sg_tensor *dres_sum, sg_tensor *dx_sum)
{
    switch (x->dtype) {
    case SG_DTYPE_F32:
        return backward_t<float>(ctx, x, gamma, mean, rstd, dy, dres, dx, dgamma, dbeta, dres_sum,
                                 dx_sum);
    case SG_DTYPE_BF16:
        return backward_t<__nv_bfloat16>(ctx, x, gamma, mean, rstd, dy, dres, dx, dgamma, dbeta,
                                         dres_sum, dx_sum);
    default:
        return sg_fail(ctx, SG_ERR_DTYPE,
                       "%s: 'x' is %s; the CUDA kernels take f32 or bf16",
                       dres_sum || dx_sum ? "sg_layernorm_backward_add_sums"
                       : dres            ? "sg_layernorm_backward_add"
                                         : "sg_layernorm_backward",
                       sg_dtype_name(x->dtype));
    }
}
