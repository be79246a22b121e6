/* layernorm_cuda.cu: LayerNorm kernels and their launchers. Storage type T: f32, or bf16 for
 * mixed precision (x, y, gamma, beta, dy, dx, dgamma, dbeta all bf16, as autocast keeps them);
 * math in f32, the saved mean and rstd in f32 for both. Deterministic: every sum runs in a fixed
 * order for a given shape and GPU (grids depend on M, C and the SM count only); no float atomics.
 *
 * Forward (one launch): a group of G threads per row, G = 32 (a warp; 8 rows per block) or, for
 * C >= LN_BLOCK_ROW_MIN_C, G = the block. Two passes over the row (mean, then the variance of
 * x - mean, as the reference does), then a third that writes y. Rows are re-read from L1/L2,
 * not kept in registers, so any C works; 16-byte loads (4 f32 or 8 bf16) where C and the
 * pointers allow.
 *
 * Backward (two launches). Kernel 1: block b owns rows [b*rpb, (b+1)*rpb): its groups write dx
 * row by row (two row sums: mean(g) and mean(g*xhat), g = dy*gamma); then its threads take one
 * column each and sum dy*xhat and dy over the block's rows in row order, in double, into a
 * per-block partial in scratch (slot SG_SLOT_LAYERNORM). Kernel 2: dgamma and dbeta, each
 * column the sum of the partials in a fixed order, rounded once to T. Partials: double [nparts][2C],
 * nparts <= MAX_C / C, so the scratch has one fixed size (4 MiB) and is allocated once per
 * context. */
#include "ops/layernorm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "ops/dtype_cuda.cuh"

#define LN_THREADS 256
#define LN_WARPS (LN_THREADS / 32)
#define LN_BLOCK_ROW_MIN_C 2048 /* from this many columns a whole block takes one row */
#define LN_FWD_BLOCKS_PER_SM 16 /* forward grid cap (grid-stride beyond it) */
#define LN_BWD_BLOCKS_PER_SM 2  /* backward: at most this many partials per SM */
#define LN_RED_COLS 32          /* reduce kernel: columns per block ... */
#define LN_RED_SLICES (LN_THREADS / LN_RED_COLS) /* ... and partial slices per column */
#define LN_SCRATCH_BYTES ((size_t)2 * SG_LAYERNORM_CUDA_MAX_C * sizeof(double))
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

/* ---- forward ---- */

/* x, y (M, C); gamma, beta (C); mean, rstd (M). Group `group` of block b takes rows
 * b*R + group, stepping by gridDim.x*R. V: elements per access (C % V == 0). (No
 * __launch_bounds__ on the row kernels: with it ptxas held them to 48 registers and spilled.) */
template <typename T, int G, int V>
__global__ void ln_forward_kernel(const T *__restrict__ x, const T *__restrict__ gamma,
                                  const T *__restrict__ beta, T *__restrict__ y,
                                  float *__restrict__ mean, float *__restrict__ rstd, int64_t M,
                                  int64_t C, float eps)
{
    constexpr int R = LN_THREADS / G;
    __shared__ float2 sh[LN_WARPS];
    const int group = threadIdx.x / G, gt = threadIdx.x % G;
    const int64_t nv = C / V;
    const float inv_c = 1.f / (float)C;
    for (int64_t r = (int64_t)blockIdx.x * R + group; r < M; r += (int64_t)gridDim.x * R) {
        const T *xr = x + r * C;
        float2 s = {0.f, 0.f};
        for (int64_t j = gt; j < nv; j += G) {
            vec_t<T, V> xv = ldv<T, V>(xr, j);
#pragma unroll
            for (int k = 0; k < V; k++) s.x += to_f(xv.e[k]);
        }
        const float m = group_sum2<G>(s, sh).x * inv_c;
        s = make_float2(0.f, 0.f);
        for (int64_t j = gt; j < nv; j += G) {
            vec_t<T, V> xv = ldv<T, V>(xr, j);
#pragma unroll
            for (int k = 0; k < V; k++) {
                float d = to_f(xv.e[k]) - m;
                s.x += d * d;
            }
        }
        const float rs = rsqrtf(group_sum2<G>(s, sh).x * inv_c + eps);
        T *yr = y + r * C;
        for (int64_t j = gt; j < nv; j += G) {
            vec_t<T, V> xv = ldv<T, V>(xr, j), gv = ldv<T, V>(gamma, j), bv = ldv<T, V>(beta, j);
            vec_t<T, V> yv;
#pragma unroll
            for (int k = 0; k < V; k++)
                yv.e[k] = from_f<T>((to_f(xv.e[k]) - m) * rs * to_f(gv.e[k]) + to_f(bv.e[k]));
            stv<T, V>(yr, j, yv);
        }
        if (gt == 0) {
            mean[r] = m;
            rstd[r] = rs;
        }
    }
}

/* ---- backward ---- */

/* Kernel 1. x, dy, dx (M, C); gamma (C); mean, rstd (M); partials (gridDim.x, 2C): block b's
 * sum over its rows of dy*xhat (columns 0..C-1) and of dy (C..2C-1). */
template <typename T, int G, int V>
__global__ void ln_backward_rows_kernel(const T *__restrict__ x, const T *__restrict__ gamma,
                                        const float *__restrict__ mean,
                                        const float *__restrict__ rstd, const T *__restrict__ dy,
                                        T *__restrict__ dx, double *__restrict__ partials,
                                        int64_t M, int64_t C, int64_t rpb)
{
    constexpr int R = LN_THREADS / G;
    __shared__ float2 sh[LN_WARPS];
    const int group = threadIdx.x / G, gt = threadIdx.x % G;
    const int64_t nv = C / V;
    const float inv_c = 1.f / (float)C;
    const int64_t r0 = (int64_t)blockIdx.x * rpb, r1 = r0 + rpb < M ? r0 + rpb : M;

    /* dx, a group per row (the loop is uniform over the group, so over the block when G is). */
    for (int64_t r = r0 + group; r < r1; r += R) {
        const T *xr = x + r * C, *dyr = dy + r * C;
        const float m = mean[r], s = rstd[r];
        float2 a = {0.f, 0.f}; /* sum g, sum g * xhat */
        for (int64_t j = gt; j < nv; j += G) {
            vec_t<T, V> xv = ldv<T, V>(xr, j), dv = ldv<T, V>(dyr, j), gv = ldv<T, V>(gamma, j);
#pragma unroll
            for (int k = 0; k < V; k++) {
                float g = to_f(dv.e[k]) * to_f(gv.e[k]);
                a.x += g;
                a.y += g * ((to_f(xv.e[k]) - m) * s);
            }
        }
        a = group_sum2<G>(a, sh);
        const float g_mean = a.x * inv_c, gx_mean = a.y * inv_c;
        T *dxr = dx + r * C;
        for (int64_t j = gt; j < nv; j += G) {
            vec_t<T, V> xv = ldv<T, V>(xr, j), dv = ldv<T, V>(dyr, j), gv = ldv<T, V>(gamma, j);
            vec_t<T, V> out;
#pragma unroll
            for (int k = 0; k < V; k++) {
                float g = to_f(dv.e[k]) * to_f(gv.e[k]);
                float xhat = (to_f(xv.e[k]) - m) * s;
                out.e[k] = from_f<T>(s * (g - g_mean - xhat * gx_mean));
            }
            stv<T, V>(dxr, j, out);
        }
    }

    /* This block's dgamma and dbeta partials: a thread per column (coalesced across the
     * block), rows in order, all in double (xhat too: H100 runs f64 at half the f32 rate, and
     * these sums over up to thousands of rows then match the reference to f32 rounding). */
    double *pb = partials + (int64_t)blockIdx.x * 2 * C;
    for (int64_t c = threadIdx.x; c < C; c += LN_THREADS) {
        double dg = 0, db = 0;
        for (int64_t r = r0; r < r1; r++) {
            const double d = to_f(dy[r * C + c]);
            dg += d * (((double)to_f(x[r * C + c]) - mean[r]) * rstd[r]);
            db += d;
        }
        pb[c] = dg;
        pb[C + c] = db;
    }
}

/* Kernel 2. Column j of the 2C partial columns (dgamma then dbeta): LN_RED_SLICES threads each
 * sum every LN_RED_SLICES-th partial in order, then one adds the slices in order. */
template <typename T>
__global__ void __launch_bounds__(LN_THREADS)
    ln_backward_reduce_kernel(const double *__restrict__ partials, int nparts, int64_t C,
                              T *__restrict__ dgamma, T *__restrict__ dbeta)
{
    __shared__ double sh[LN_RED_SLICES][LN_RED_COLS];
    const int cx = threadIdx.x % LN_RED_COLS, sy = threadIdx.x / LN_RED_COLS;
    const int64_t j = (int64_t)blockIdx.x * LN_RED_COLS + cx;
    double a = 0;
    if (j < 2 * C)
        for (int p = sy; p < nparts; p += LN_RED_SLICES) a += partials[(int64_t)p * 2 * C + j];
    sh[sy][cx] = a;
    __syncthreads();
    if (sy == 0 && j < 2 * C) {
        for (int k = 1; k < LN_RED_SLICES; k++) a += sh[k][cx];
        if (j < C)
            dgamma[j] = from_d<T>(a);
        else
            dbeta[j - C] = from_d<T>(a);
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

template <typename T, int G, int V>
static void launch_forward(int blocks, cudaStream_t st, const sg_tensor *x, const sg_tensor *gamma,
                           const sg_tensor *beta, float eps, sg_tensor *y, sg_tensor *mean,
                           sg_tensor *rstd, int64_t M, int64_t C)
{
    ln_forward_kernel<T, G, V><<<blocks, LN_THREADS, 0, st>>>(
        (const T *)x->data, (const T *)gamma->data, (const T *)beta->data, (T *)y->data,
        (float *)mean->data, (float *)rstd->data, M, C, eps);
}

template <typename T>
static sg_status forward_t(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                           const sg_tensor *beta, float eps, sg_tensor *y, sg_tensor *mean,
                           sg_tensor *rstd)
{
    constexpr int VEC = 16 / sizeof(T);
    const int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    const bool vec = C % VEC == 0 && aligned16(x->data) && aligned16(y->data) &&
                     aligned16(gamma->data) && aligned16(beta->data);
    const bool block_row = C >= LN_BLOCK_ROW_MIN_C;
    const int64_t rows_per_block = block_row ? 1 : LN_WARPS;
    const int blocks = cap_blocks((M + rows_per_block - 1) / rows_per_block,
                                  (int64_t)sg_ctx_sm_count(ctx) * LN_FWD_BLOCKS_PER_SM);
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    if (block_row && vec)
        launch_forward<T, LN_THREADS, VEC>(blocks, st, x, gamma, beta, eps, y, mean, rstd, M, C);
    else if (block_row)
        launch_forward<T, LN_THREADS, 1>(blocks, st, x, gamma, beta, eps, y, mean, rstd, M, C);
    else if (vec)
        launch_forward<T, 32, VEC>(blocks, st, x, gamma, beta, eps, y, mean, rstd, M, C);
    else
        launch_forward<T, 32, 1>(blocks, st, x, gamma, beta, eps, y, mean, rstd, M, C);
    SG_CUDA_CHECK_LAUNCH(ctx, "ln_forward_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <typename T, int G, int V>
static void launch_backward_rows(int blocks, cudaStream_t st, const sg_tensor *x,
                                 const sg_tensor *gamma, const sg_tensor *mean,
                                 const sg_tensor *rstd, const sg_tensor *dy, sg_tensor *dx,
                                 double *partials, int64_t M, int64_t C, int64_t rpb)
{
    ln_backward_rows_kernel<T, G, V><<<blocks, LN_THREADS, 0, st>>>(
        (const T *)x->data, (const T *)gamma->data, (const float *)mean->data,
        (const float *)rstd->data, (const T *)dy->data, (T *)dx->data, partials, M, C, rpb);
}

template <typename T>
static sg_status backward_t(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                            const sg_tensor *mean, const sg_tensor *rstd, const sg_tensor *dy,
                            sg_tensor *dx, sg_tensor *dgamma, sg_tensor *dbeta)
{
    constexpr int VEC = 16 / sizeof(T);
    const int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    /* Always the same size (the entry point caps C), so the buffer is allocated once and its
     * address never changes: a captured graph keeps pointing at it. */
    void *scratch;
    SG_TRY(sg_ctx_scratch(ctx, SG_SLOT_LAYERNORM, LN_SCRATCH_BYTES, &scratch));
    double *partials = (double *)scratch;

    /* Partials: at most LN_BWD_BLOCKS_PER_SM per SM, and as many as the scratch holds. Rows
     * are split evenly; grid = the blocks that get rows. */
    int64_t want = M;
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * LN_BWD_BLOCKS_PER_SM;
    if (want > cap) want = cap;
    if (want > SG_LAYERNORM_CUDA_MAX_C / C) want = SG_LAYERNORM_CUDA_MAX_C / C;
    if (want < 1) want = 1;
    const int64_t rpb = (M + want - 1) / want;
    const int blocks = (int)((M + rpb - 1) / rpb);

    const bool vec = C % VEC == 0 && aligned16(x->data) && aligned16(dy->data) &&
                     aligned16(dx->data) && aligned16(gamma->data);
    const bool block_row = C >= LN_BLOCK_ROW_MIN_C;
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    if (block_row && vec)
        launch_backward_rows<T, LN_THREADS, VEC>(blocks, st, x, gamma, mean, rstd, dy, dx, partials,
                                                 M, C, rpb);
    else if (block_row)
        launch_backward_rows<T, LN_THREADS, 1>(blocks, st, x, gamma, mean, rstd, dy, dx, partials,
                                               M, C, rpb);
    else if (vec)
        launch_backward_rows<T, 32, VEC>(blocks, st, x, gamma, mean, rstd, dy, dx, partials, M, C,
                                         rpb);
    else
        launch_backward_rows<T, 32, 1>(blocks, st, x, gamma, mean, rstd, dy, dx, partials, M, C,
                                       rpb);
    SG_CUDA_CHECK_LAUNCH(ctx, "ln_backward_rows_kernel");
    sg_ctx_count_launches(ctx, 1);

    const int red_blocks = (int)((2 * C + LN_RED_COLS - 1) / LN_RED_COLS);
    ln_backward_reduce_kernel<T><<<red_blocks, LN_THREADS, 0, st>>>(
        partials, blocks, C, (T *)dgamma->data, (T *)dbeta->data);
    SG_CUDA_CHECK_LAUNCH(ctx, "ln_backward_reduce_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

extern "C" sg_status sg_layernorm_forward_cuda(sg_ctx *ctx, const sg_tensor *x,
                                               const sg_tensor *gamma, const sg_tensor *beta,
                                               float eps, sg_tensor *y, sg_tensor *mean,
                                               sg_tensor *rstd)
{
    switch (x->dtype) {
    case SG_DTYPE_F32:
        return forward_t<float>(ctx, x, gamma, beta, eps, y, mean, rstd);
    case SG_DTYPE_BF16:
        return forward_t<__nv_bfloat16>(ctx, x, gamma, beta, eps, y, mean, rstd);
    default:
        return sg_fail(ctx, SG_ERR_DTYPE,
                       "sg_layernorm_forward: 'x' is %s; the CUDA kernels "
                       "take f32 or bf16",
                       sg_dtype_name(x->dtype));
    }
}

extern "C" sg_status sg_layernorm_backward_cuda(sg_ctx *ctx, const sg_tensor *x,
                                                const sg_tensor *gamma, const sg_tensor *mean,
                                                const sg_tensor *rstd, const sg_tensor *dy,
                                                sg_tensor *dx, sg_tensor *dgamma, sg_tensor *dbeta)
{
    switch (x->dtype) {
    case SG_DTYPE_F32:
        return backward_t<float>(ctx, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
    case SG_DTYPE_BF16:
        return backward_t<__nv_bfloat16>(ctx, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
    default:
        return sg_fail(ctx, SG_ERR_DTYPE,
                       "sg_layernorm_backward: 'x' is %s; the CUDA kernels "
                       "take f32 or bf16",
                       sg_dtype_name(x->dtype));
    }
}
