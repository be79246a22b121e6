/* batchnorm_cuda.cu: batch normalisation kernels and their launchers. Storage type T of x, y,
 * dy, dx: f32, or bf16 for mixed precision; every per-channel tensor f32. Deterministic: every
 * sum runs in a fixed order for a given shape and GPU (grids depend on M, C and the SM count
 * only); no float atomics.
 *
 * Channels last, so a channel's M values are a strided column. The per-channel sums are cut
 * into parts of rows: kernel 1 (bn_partial_kernel) gives a block 32 channels (a warp reads 32
 * consecutive channels of a row: coalesced) and one part; its 8 warps take every 8th row of the
 * part, each thread summing its column in double, then the warps' sums are added in order and
 * written to scratch (slot SG_SLOT_BATCHNORM, double [nparts][2C]). Kernel 2 (bn_reduce_kernel)
 * adds a channel's parts in a fixed order.
 *
 * Forward, training (three launches): kernel 1 sums x - x[0, c] and its square (shifted by the
 * channel's first value, so the one-pass variance does not cancel when |mean| >> std; in double
 * besides); kernel 2 turns the sums into mean and rstd and updates the running statistics;
 * bn_apply_kernel writes y. Eval (one launch): bn_apply_kernel reads the running statistics
 * and writes mean and rstd from them (row 0's threads).
 * Backward (three launches): kernel 1 sums dy and dy xhat; kernel 2 writes them as dbeta and
 * dgamma; bn_dx_kernel writes dx = gamma rstd (dy - dbeta / M - xhat dgamma / M). */
#include "ops/batchnorm.h"

#include "ops/dtype_cuda.cuh"
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define BN_THREADS 256
#define BN_COLS 32                       /* channels per block of kernels 1 and 2 ... */
#define BN_SLICES (BN_THREADS / BN_COLS) /* ... and row (or part) slices per channel */
#define BN_PART_BLOCKS_PER_SM 4          /* kernel 1's grid: about this many blocks per SM */
#define BN_MIN_ROWS_PER_PART 64          /* fewer rows per part would be mostly overhead */
#define BN_ELT_BLOCKS_PER_SM 8           /* elementwise grid cap (grid-stride beyond it) */
#define BN_SCRATCH_BYTES ((size_t)2 * SG_BATCHNORM_CUDA_MAX_C * sizeof(double))

/* ---- kernel 1: per-part channel sums ---- */

/* x, dy (M, C); partials (nparts, 2C): part p's sums over rows [p rpp, (p+1) rpp) of
 * forward: x - x[0, c] (columns 0..C-1) and its square (C..2C-1);
 * backward: dy (0..C-1) and dy xhat, xhat = (x - mean) rstd (C..2C-1). */
template <typename T, bool BWD>
__global__ void __launch_bounds__(BN_THREADS)
    bn_partial_kernel(const T *__restrict__ x, const T *__restrict__ dy,
                      const float *__restrict__ mean, const float *__restrict__ rstd,
                      double *__restrict__ partials, int64_t M, int64_t C, int64_t rpp)
{
    __shared__ double sh[2][BN_SLICES][BN_COLS];
    const int cx = threadIdx.x % BN_COLS, sy = threadIdx.x / BN_COLS;
    const int64_t c = (int64_t)blockIdx.x * BN_COLS + cx;
    const int64_t r0 = (int64_t)blockIdx.y * rpp, r1 = r0 + rpp < M ? r0 + rpp : M;
    double a = 0, b = 0;
    if (c < C) {
        if (BWD) {
            const double m = mean[c], s = rstd[c];
#pragma unroll 4
            for (int64_t r = r0 + sy; r < r1; r += BN_SLICES) {
                const double g = to_f(dy[r * C + c]);
                a += g;
                b += g * (((double)to_f(x[r * C + c]) - m) * s);
            }
        } else {
            const double k = to_f(x[c]);
#pragma unroll 4
            for (int64_t r = r0 + sy; r < r1; r += BN_SLICES) {
                const double d = (double)to_f(x[r * C + c]) - k;
                a += d;
                b += d * d;
            }
        }
    }
    sh[0][sy][cx] = a;
    sh[1][sy][cx] = b;
    __syncthreads();
    if (sy == 0 && c < C) {
        for (int k = 1; k < BN_SLICES; k++) a += sh[0][k][cx], b += sh[1][k][cx];
        double *pp = partials + (int64_t)blockIdx.y * 2 * C;
        pp[c] = a;
        pp[C + c] = b;
    }
}

/* ---- kernel 2: the parts of each channel, in a fixed order ---- */

/* BN_SLICES threads per channel each add every BN_SLICES-th part in order; one adds the
 * slices in order. Forward: mean = x[0, c] + A / M, biased var = B / M - (A / M)^2 (A, B the
 * shifted sums), rstd; the running statistics (when rm is not NULL) move toward the batch
 * mean and the unbiased variance, all in double. Backward: dbeta = A, dgamma = B. */
template <typename T, bool BWD>
__global__ void __launch_bounds__(BN_THREADS)
    bn_reduce_kernel(const double *__restrict__ partials, int nparts, const T *__restrict__ x,
                     int64_t M, int64_t C, float momentum, float eps, float *__restrict__ out0,
                     float *__restrict__ out1, float *__restrict__ rm, float *__restrict__ rv)
{
    __shared__ double sh[2][BN_SLICES][BN_COLS];
    const int cx = threadIdx.x % BN_COLS, sy = threadIdx.x / BN_COLS;
    const int64_t c = (int64_t)blockIdx.x * BN_COLS + cx;
    double a = 0, b = 0;
    if (c < C)
        for (int p = sy; p < nparts; p += BN_SLICES) {
            a += partials[(int64_t)p * 2 * C + c];
            b += partials[(int64_t)p * 2 * C + C + c];
        }
    sh[0][sy][cx] = a;
    sh[1][sy][cx] = b;
    __syncthreads();
    if (sy != 0 || c >= C) return;
    for (int k = 1; k < BN_SLICES; k++) a += sh[0][k][cx], b += sh[1][k][cx];
    if (BWD) { /* out0 = dgamma, out1 = dbeta */
        out0[c] = (float)b;
        out1[c] = (float)a;
        return;
    }
    /* out0 = mean, out1 = rstd */
    const double d = a / (double)M, var_s = b / (double)M - d * d;
    const double var = var_s < 0 ? 0 : var_s; /* rounding; a NaN stays */
    const double m = (double)to_f(x[c]) + d;
    out0[c] = (float)m;
    out1[c] = (float)(1.0 / sqrt(var + (double)eps));
    if (rm) {
        const double mo = momentum;
        rm[c] = (float)((1 - mo) * (double)rm[c] + mo * m);
        if (M > 1)
            rv[c] = (float)((1 - mo) * (double)rv[c] + mo * var * (double)M / (double)(M - 1));
    }
}

/* ---- normalisation and dx: elementwise, V channels per access ---- */

/* y = (x - mean) rstd gamma + beta. Training: mean, rstd from kernel 2 (sd = rstd). EVAL: the
 * running statistics (m = running_mean, sd = running_var), rstd = 1 / sqrt(var + eps) computed
 * here, and the threads of row 0 write mean_out and rstd_out. */
template <typename T, int V, bool EVAL>
__global__ void bn_apply_kernel(const T *__restrict__ x, const float *__restrict__ gamma,
                                const float *__restrict__ beta, const float *__restrict__ m,
                                const float *__restrict__ sd, float eps, T *__restrict__ y,
                                float *__restrict__ mean_out, float *__restrict__ rstd_out,
                                int64_t M, int64_t C)
{
    const int64_t nrow = C / V, n = M * nrow;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int64_t c0 = (i % nrow) * V;
        vec_t<T, V> xv = ldv<T, V>(x, i), yv;
#pragma unroll
        for (int k = 0; k < V; k++) {
            const int64_t c = c0 + k;
            const float mk = m[c];
            const float rs = EVAL ? 1.f / sqrtf(sd[c] + eps) : sd[c];
            yv.e[k] = from_f<T>((to_f(xv.e[k]) - mk) * rs * gamma[c] + beta[c]);
            if (EVAL && i < nrow) {
                mean_out[c] = mk;
                rstd_out[c] = rs;
            }
        }
        stv<T, V>(y, i, yv);
    }
}

/* dx = gamma rstd (dy - dbeta / M - xhat dgamma / M), xhat = (x - mean) rstd. */
template <typename T, int V>
__global__ void bn_dx_kernel(const T *__restrict__ x, const T *__restrict__ dy,
                             const float *__restrict__ gamma, const float *__restrict__ mean,
                             const float *__restrict__ rstd, const float *__restrict__ dgamma,
                             const float *__restrict__ dbeta, T *__restrict__ dx, int64_t M,
                             int64_t C)
{
    const int64_t nrow = C / V, n = M * nrow;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const float inv_m = 1.f / (float)M;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int64_t c0 = (i % nrow) * V;
        vec_t<T, V> xv = ldv<T, V>(x, i), dv = ldv<T, V>(dy, i), out;
#pragma unroll
        for (int k = 0; k < V; k++) {
            const int64_t c = c0 + k;
            const float rs = rstd[c], xhat = (to_f(xv.e[k]) - mean[c]) * rs;
            out.e[k] = from_f<T>(gamma[c] * rs *
                                 (to_f(dv.e[k]) - dbeta[c] * inv_m - xhat * (dgamma[c] * inv_m)));
        }
        stv<T, V>(dx, i, out);
    }
}

/* ---- launchers ---- */

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

static int elt_blocks(sg_ctx *ctx, int64_t n)
{
    int64_t want = (n + BN_THREADS - 1) / BN_THREADS;
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * BN_ELT_BLOCKS_PER_SM;
    return (int)(want < 1 ? 1 : (want < cap ? want : cap));
}

/* Kernel 1's grid: BN_COLS channels per block across, parts of rows down: about
 * BN_PART_BLOCKS_PER_SM blocks per SM, at least BN_MIN_ROWS_PER_PART rows a part, and as many
 * parts as the scratch holds. *rpp: rows per part; returns the number of parts. */
static int plan_parts(sg_ctx *ctx, int64_t M, int64_t C, int64_t *rpp)
{
    const int64_t tiles = (C + BN_COLS - 1) / BN_COLS;
    int64_t want = ((int64_t)sg_ctx_sm_count(ctx) * BN_PART_BLOCKS_PER_SM + tiles - 1) / tiles;
    int64_t by_rows = (M + BN_MIN_ROWS_PER_PART - 1) / BN_MIN_ROWS_PER_PART;
    if (want > by_rows) want = by_rows;
    if (want > SG_BATCHNORM_CUDA_MAX_C / C) want = SG_BATCHNORM_CUDA_MAX_C / C;
    if (want < 1) want = 1;
    *rpp = (M + want - 1) / want;
    return (int)((M + *rpp - 1) / *rpp);
}

/* Kernels 1 and 2. Forward: out0, out1 = mean, rstd (rm, rv: running stats or NULL);
 * backward: dgamma, dbeta. */
template <typename T, bool BWD>
static sg_status channel_sums(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy,
                              const sg_tensor *mean, const sg_tensor *rstd, float momentum,
                              float eps, float *out0, float *out1, float *rm, float *rv)
{
    const int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    /* Always the same size (the entry point caps C), so the buffer is allocated once and its
     * address never changes: a captured graph keeps pointing at it. */
    void *scratch;
    SG_TRY(sg_ctx_scratch(ctx, SG_SLOT_BATCHNORM, BN_SCRATCH_BYTES, &scratch));
    double *partials = (double *)scratch;
    int64_t rpp;
    const int nparts = plan_parts(ctx, M, C, &rpp);
    const unsigned tiles = (unsigned)((C + BN_COLS - 1) / BN_COLS);
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    bn_partial_kernel<T, BWD><<<dim3(tiles, (unsigned)nparts), BN_THREADS, 0, st>>>(
        (const T *)x->data, dy ? (const T *)dy->data : nullptr,
        mean ? (const float *)mean->data : nullptr, rstd ? (const float *)rstd->data : nullptr,
        partials, M, C, rpp);
    SG_CUDA_CHECK_LAUNCH(ctx, "bn_partial_kernel");
    sg_ctx_count_launches(ctx, 1);
    bn_reduce_kernel<T, BWD><<<tiles, BN_THREADS, 0, st>>>(partials, nparts, (const T *)x->data, M,
                                                           C, momentum, eps, out0, out1, rm, rv);
    SG_CUDA_CHECK_LAUNCH(ctx, "bn_reduce_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <typename T, int V, bool EVAL>
static void launch_apply(int blocks, cudaStream_t st, const sg_tensor *x, const sg_tensor *gamma,
                         const sg_tensor *beta, const float *m, const float *sd, float eps,
                         sg_tensor *y, sg_tensor *mean, sg_tensor *rstd, int64_t M, int64_t C)
{
    bn_apply_kernel<T, V, EVAL><<<blocks, BN_THREADS, 0, st>>>(
        (const T *)x->data, (const float *)gamma->data, (const float *)beta->data, m, sd, eps,
        (T *)y->data, (float *)mean->data, (float *)rstd->data, M, C);
}

template <typename T>
static sg_status forward_t(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                           const sg_tensor *beta, sg_tensor *running_mean, sg_tensor *running_var,
                           float momentum, float eps, int training, sg_tensor *y, sg_tensor *mean,
                           sg_tensor *rstd)
{
    constexpr int VEC = 16 / sizeof(T);
    const int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    float *rm = running_mean ? (float *)running_mean->data : nullptr;
    float *rv = running_var ? (float *)running_var->data : nullptr;
    if (training)
        SG_TRY((channel_sums<T, false>(ctx, x, nullptr, nullptr, nullptr, momentum, eps,
                                       (float *)mean->data, (float *)rstd->data, rm, rv)));
    const bool vec = C % VEC == 0 && aligned16(x->data) && aligned16(y->data);
    const int v = vec ? VEC : 1;
    const int blocks = elt_blocks(ctx, M * (C / v));
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    /* Training normalises with the batch statistics just written; eval with the running ones. */
    const float *m = training ? (const float *)mean->data : rm;
    const float *sd = training ? (const float *)rstd->data : rv;
    if (training && vec)
        launch_apply<T, VEC, false>(blocks, st, x, gamma, beta, m, sd, eps, y, mean, rstd, M, C);
    else if (training)
        launch_apply<T, 1, false>(blocks, st, x, gamma, beta, m, sd, eps, y, mean, rstd, M, C);
    else if (vec)
        launch_apply<T, VEC, true>(blocks, st, x, gamma, beta, m, sd, eps, y, mean, rstd, M, C);
    else
        launch_apply<T, 1, true>(blocks, st, x, gamma, beta, m, sd, eps, y, mean, rstd, M, C);
    SG_CUDA_CHECK_LAUNCH(ctx, "bn_apply_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <typename T, int V>
static void launch_dx(int blocks, cudaStream_t st, const sg_tensor *x, const sg_tensor *dy,
                      const sg_tensor *gamma, const sg_tensor *mean, const sg_tensor *rstd,
                      const sg_tensor *dgamma, const sg_tensor *dbeta, sg_tensor *dx, int64_t M,
                      int64_t C)
{
    bn_dx_kernel<T, V><<<blocks, BN_THREADS, 0, st>>>(
        (const T *)x->data, (const T *)dy->data, (const float *)gamma->data,
        (const float *)mean->data, (const float *)rstd->data, (const float *)dgamma->data,
        (const float *)dbeta->data, (T *)dx->data, M, C);
}

template <typename T>
static sg_status backward_t(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                            const sg_tensor *mean, const sg_tensor *rstd, const sg_tensor *dy,
                            sg_tensor *dx, sg_tensor *dgamma, sg_tensor *dbeta)
{
    constexpr int VEC = 16 / sizeof(T);
    const int64_t C = x->shape[x->ndim - 1], M = x->numel / C;
    SG_TRY((channel_sums<T, true>(ctx, x, dy, mean, rstd, 0.f, 0.f, (float *)dgamma->data,
                                  (float *)dbeta->data, nullptr, nullptr)));
    const bool vec =
        C % VEC == 0 && aligned16(x->data) && aligned16(dy->data) && aligned16(dx->data);
    const int blocks = elt_blocks(ctx, M * (C / (vec ? VEC : 1)));
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    if (vec)
        launch_dx<T, VEC>(blocks, st, x, dy, gamma, mean, rstd, dgamma, dbeta, dx, M, C);
    else
        launch_dx<T, 1>(blocks, st, x, dy, gamma, mean, rstd, dgamma, dbeta, dx, M, C);
    SG_CUDA_CHECK_LAUNCH(ctx, "bn_dx_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

extern "C" sg_status sg_batchnorm_forward_cuda(sg_ctx *ctx, const sg_tensor *x,
                                               const sg_tensor *gamma, const sg_tensor *beta,
                                               sg_tensor *running_mean, sg_tensor *running_var,
                                               float momentum, float eps, int training,
                                               sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    switch (x->dtype) {
    case SG_DTYPE_F32:
        return forward_t<float>(ctx, x, gamma, beta, running_mean, running_var, momentum, eps,
                                training, y, mean, rstd);
    case SG_DTYPE_BF16:
        return forward_t<__nv_bfloat16>(ctx, x, gamma, beta, running_mean, running_var, momentum,
                                        eps, training, y, mean, rstd);
    default:
        return sg_fail(ctx, SG_ERR_DTYPE,
                       "sg_batchnorm_forward: 'x' is %s; the CUDA kernels take f32 or bf16",
                       sg_dtype_name(x->dtype));
    }
}

extern "C" sg_status sg_batchnorm_backward_cuda(sg_ctx *ctx, const sg_tensor *x,
                                                const sg_tensor *gamma, const sg_tensor *mean,
                                                const sg_tensor *rstd, const sg_tensor *dy,
                                                sg_tensor *dx, sg_tensor *dgamma, sg_tensor *dbeta)
{
    switch (x->dtype) {
    case SG_DTYPE_F32: return backward_t<float>(ctx, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
    case SG_DTYPE_BF16:
        return backward_t<__nv_bfloat16>(ctx, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
    default:
        return sg_fail(ctx, SG_ERR_DTYPE,
                       "sg_batchnorm_backward: 'x' is %s; the CUDA kernels take f32 or bf16",
                       sg_dtype_name(x->dtype));
    }
}
