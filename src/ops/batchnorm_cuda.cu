/* batchnorm_cuda.cu: batch normalisation kernels and their launchers, with the residual add and
 * ReLU of a ResNet block fused in. Storage type T of x, y, res, dy, dx, dres: f32, or bf16 for
 * mixed precision; every per-channel tensor f32. Deterministic: every sum runs in a fixed order
 * for a given shape and GPU (grids depend on M, C and the SM count only); no float atomics.
 *
 * Channels last, so a channel's M values are a strided column. Every kernel reads V channels
 * per access (16 bytes: V = 4 f32 or 8 bf16, when C is a multiple of V and the tensors are
 * aligned; else V = 1), so a thread owns a column of vectors.
 *
 * Kernel 1 (bn_sums_kernel), per-channel sums: a block takes `cols` vector columns (a power of
 * two up to 32) and one part of the rows; its 256 / cols row slices each sum their rows in
 * double (the forward's in f32 over BN_ROWS_IN_FLIGHT rows at a time first), the slices are
 * added in order and the part's sums written to scratch (slot SG_SLOT_BATCHNORM: double
 * [nparts][2C], then one counter per column tile). The block that finishes its tile last (a
 * ticket from the tile's counter, which it leaves at zero) adds the tile's parts in a fixed
 * order and finishes the channels: forward, the sums of x - x[0, c] and its square (shifted by
 * the channel's first value, so the one-pass variance does not cancel when |mean| >> std; the
 * f32 batches add a relative error of about 5e-7 to each sum) give mean and rstd and move the
 * running statistics; backward, the sums of g and g xhat are dbeta and dgamma, g = dy masked
 * by y > 0 under ReLU.
 *
 * Forward, training (two launches): kernel 1, then bn_apply_kernel writes
 * y = act((x - mean) rstd gamma + beta + res). Eval (one launch): bn_apply_kernel reads the
 * running statistics and writes mean and rstd from them. Backward (two launches): kernel 1, then
 * bn_dx_kernel writes dx = gamma rstd (g - dbeta / M - xhat dgamma / M) and dres = g.
 * The element-wise kernels run a whole number of threads per row of vectors, so each thread's
 * channels never change and their parameters are read once. */
#include "ops/batchnorm.h"

#include "ops/dtype_cuda.cuh"
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define BN_THREADS 256
#define BN_MAX_COLS 32                /* kernel 1: vector columns per block at most */
#define BN_PART_BLOCKS_PER_SM 1       /* kernel 1: a block per SM (more: more parts to add up;
                                       * 2 took 10% longer on an H100) */
#define BN_ROWS_IN_FLIGHT 8           /* kernel 1: rows a thread loads before adding (forward) */
#define BN_MIN_ROWS_PER_THREAD 16     /* fewer rows per thread would be mostly overhead */
#define BN_REDUCE_UNROLL 8            /* the last block's loads in flight per thread */
#define BN_ELT_BLOCKS_PER_SM 8        /* element-wise kernels: threads of this many blocks per SM */
#define BN_PARTIAL_BYTES ((size_t)2 * SG_BATCHNORM_CUDA_MAX_C * sizeof(double))
#define BN_MAX_TILES (SG_BATCHNORM_CUDA_MAX_C / BN_MAX_COLS + 1)
#define BN_SCRATCH_BYTES (BN_PARTIAL_BYTES + BN_MAX_TILES * sizeof(unsigned))

/* g: dy, or 0 where the ReLU's output y is not positive (y NULL: no ReLU). */
template <typename T> __device__ __forceinline__ float masked(float dy, const T *y, T yk)
{
    return y && !(to_f(yk) > 0.f) ? 0.f : dy;
}

/* ---- kernel 1: per-part channel sums, and the last block's statistics ---- */

/* x, dy, y (M, C) as V-vectors, nrow = C / V per row; partials (nparts, 2C): part p's sums over
 * rows [p rpp, (p+1) rpp). Forward (out0, out1 = mean, rstd; rm, rv the running statistics or
 * NULL): x - x[0, c] (columns 0..C-1) and its square (C..2C-1). Backward (out0, out1 = dgamma,
 * dbeta): g (0..C-1) and g xhat, xhat = (x - mean) rstd (C..2C-1). */
template <typename T, int V, bool BWD>
__global__ void __launch_bounds__(BN_THREADS)
    bn_sums_kernel(const T *__restrict__ x, const T *__restrict__ dy, const T *__restrict__ y,
                   const float *__restrict__ mean, const float *__restrict__ rstd,
                   double *__restrict__ partials, unsigned *__restrict__ counters, int64_t M,
                   int64_t C, int64_t rpp, int cols, float momentum, float eps,
                   float *__restrict__ out0, float *__restrict__ out1, float *__restrict__ rm,
                   float *__restrict__ rv)
{
    __shared__ double sh[2][BN_THREADS * V];
    __shared__ bool last;
    const int64_t nrow = C / V;
    const int cx = threadIdx.x % cols, sy = threadIdx.x / cols, slices = BN_THREADS / cols;
    const int64_t cv = (int64_t)blockIdx.x * cols + cx;
    const int64_t r0 = (int64_t)blockIdx.y * rpp, r1 = r0 + rpp < M ? r0 + rpp : M;
    double a[V], b[V];
#pragma unroll
    for (int k = 0; k < V; k++) a[k] = b[k] = 0;
    if (cv < nrow) {
        /* U rows' loads issued together (one thread's loads in flight stand in for more threads,
         * and more parts to add up at the end), then their terms added in row order. Forward:
         * in f32 over the batch, then into the double sums: a conversion to double per U terms,
         * not one per term (converting bounds this kernel on Hopper: 16 a clock per SM); its
         * error, a few f32 ulp of a batch's sum, is divided by M in the statistics. Backward:
         * each term in double, as dgamma = sum g xhat may cancel to near 0. */
        constexpr int U = BWD ? BN_ROWS_IN_FLIGHT / 2 : BN_ROWS_IN_FLIGHT;
        int64_t r = r0 + sy;
        if (BWD) {
            double m[V], s[V];
#pragma unroll
            for (int k = 0; k < V; k++) m[k] = mean[cv * V + k], s[k] = rstd[cv * V + k];
            vec_t<T, V> xs[U], ds[U], ys[U] = {};
            for (; r < r1; r += U * slices) {
                const int n = r + (U - 1) * slices < r1 ? U : (int)((r1 - r + slices - 1) / slices);
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (u < n) {
                        const int64_t i = (r + u * slices) * nrow + cv;
                        xs[u] = ldv<T, V>(x, i), ds[u] = ldv<T, V>(dy, i);
                        if (y) ys[u] = ldv<T, V>(y, i);
                    }
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (u < n)
#pragma unroll
                        for (int k = 0; k < V; k++) {
                            const double g = masked(to_f(ds[u].e[k]), y, ys[u].e[k]);
                            a[k] += g;
                            b[k] += g * (((double)to_f(xs[u].e[k]) - m[k]) * s[k]);
                        }
            }
        } else {
            float k0[V];
            const vec_t<T, V> kv = ldv<T, V>(x, cv);
#pragma unroll
            for (int k = 0; k < V; k++) k0[k] = to_f(kv.e[k]);
            vec_t<T, V> xs[U];
            for (; r < r1; r += U * slices) {
                const int n = r + (U - 1) * slices < r1 ? U : (int)((r1 - r + slices - 1) / slices);
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (u < n) xs[u] = ldv<T, V>(x, (r + u * slices) * nrow + cv);
#pragma unroll
                for (int k = 0; k < V; k++) {
                    float fa = 0.f, fb = 0.f;
#pragma unroll
                    for (int u = 0; u < U; u++)
                        if (u < n) {
                            const float d = to_f(xs[u].e[k]) - k0[k];
                            fa += d;
                            fb = fmaf(d, d, fb);
                        }
                    a[k] += (double)fa;
                    b[k] += (double)fb;
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < V; k++) sh[0][threadIdx.x * V + k] = a[k], sh[1][threadIdx.x * V + k] = b[k];
    __syncthreads();
    if (sy == 0 && cv < nrow) {
        double *pp = partials + (int64_t)blockIdx.y * 2 * C;
#pragma unroll
        for (int k = 0; k < V; k++) {
            for (int j = 1; j < slices; j++)
                a[k] += sh[0][(j * cols + cx) * V + k], b[k] += sh[1][(j * cols + cx) * V + k];
            pp[cv * V + k] = a[k];
            pp[C + cv * V + k] = b[k];
        }
    }
    __threadfence(); /* this block's part is visible before its ticket is taken */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();

    /* The tile's channels (cols V of them, a power of two that divides BN_THREADS): nsub
     * threads per channel each add every nsub-th part in order, then one adds theirs in order. */
    const int width = cols * V, k = threadIdx.x % width, sub = threadIdx.x / width;
    const int nsub = BN_THREADS / width, nparts = (int)gridDim.y;
    const int64_t c = (int64_t)blockIdx.x * width + k;
    double sa = 0, sb = 0;
    if (c < C)
        for (int p0 = sub; p0 < nparts; p0 += BN_REDUCE_UNROLL * nsub) {
            /* Loads first (in flight together), then the additions in part order. */
            double va[BN_REDUCE_UNROLL], vb[BN_REDUCE_UNROLL];
#pragma unroll
            for (int u = 0; u < BN_REDUCE_UNROLL; u++) {
                const int p = p0 + u * nsub;
                va[u] = p < nparts ? __ldcg(&partials[(int64_t)p * 2 * C + c]) : 0.0;
                vb[u] = p < nparts ? __ldcg(&partials[(int64_t)p * 2 * C + C + c]) : 0.0;
            }
#pragma unroll
            for (int u = 0; u < BN_REDUCE_UNROLL; u++) sa += va[u], sb += vb[u];
        }
    __syncthreads(); /* every slice's sums above are read */
    sh[0][threadIdx.x] = sa, sh[1][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.x == 0) counters[blockIdx.x] = 0; /* for the next launch */
    if (sub != 0 || c >= C) return;
    for (int j = 1; j < nsub; j++) sa += sh[0][j * width + k], sb += sh[1][j * width + k];
    if (BWD) {
        out0[c] = (float)sb;
        out1[c] = (float)sa;
        return;
    }
    const double d = sa / (double)M, var_s = sb / (double)M - d * d;
    const double var = var_s < 0 ? 0 : var_s; /* rounding; a NaN stays */
    const double mu = (double)to_f(x[c]) + d;
    out0[c] = (float)mu;
    out1[c] = (float)(1.0 / sqrt(var + (double)eps));
    if (rm) {
        const double mo = momentum;
        rm[c] = (float)((1 - mo) * (double)rm[c] + mo * mu);
        if (M > 1) rv[c] = (float)((1 - mo) * (double)rv[c] + mo * var * (double)M / (double)(M - 1));
    }
}

/* ---- element-wise: nthreads threads, a multiple of nrow, each on one column of vectors ---- */

/* y = act((x - mean) rstd gamma + beta + res). Training: m = mean, sd = rstd from kernel 1;
 * eval: m = running_mean, sd = running_var, rstd = 1 / sqrt(var + eps) computed here, and the
 * threads of row 0 write mean_out and rstd_out. */
template <typename T, int V>
__global__ void __launch_bounds__(BN_THREADS)
    bn_apply_kernel(const T *__restrict__ x, const T *__restrict__ res,
                    const float *__restrict__ gamma, const float *__restrict__ beta,
                    const float *__restrict__ m, const float *__restrict__ sd, float eps, int eval,
                    int relu, T *__restrict__ y, float *__restrict__ mean_out,
                    float *__restrict__ rstd_out, int64_t M, int64_t nrow, int64_t nthreads)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nthreads) return;
    const int64_t cv = t % nrow, rstep = nthreads / nrow;
    float mk[V], sc[V], bk[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int64_t c = cv * V + k;
        const float rs = eval ? 1.f / sqrtf(sd[c] + eps) : sd[c];
        mk[k] = m[c], sc[k] = rs * gamma[c], bk[k] = beta[c];
        if (eval && t < nrow) mean_out[c] = mk[k], rstd_out[c] = rs;
    }
    vec_t<T, V> rv = {};
    for (int64_t r = t / nrow; r < M; r += rstep) {
        const int64_t i = r * nrow + cv;
        const vec_t<T, V> xv = ldv<T, V>(x, i);
        if (res) rv = ldv<T, V>(res, i);
        vec_t<T, V> yv;
#pragma unroll
        for (int k = 0; k < V; k++) {
            float v = (to_f(xv.e[k]) - mk[k]) * sc[k] + bk[k];
            if (res) v += to_f(rv.e[k]);
            yv.e[k] = from_f<T>(relu && !(v > 0.f) ? 0.f : v); /* as sg_relu_forward: NaN -> 0 */
        }
        stv<T, V>(y, i, yv);
    }
}

/* g = dy masked by y > 0 (y NULL: dy); dx = gamma rstd (g - dbeta / M - xhat dgamma / M),
 * xhat = (x - mean) rstd; dres = g when not NULL. */
template <typename T, int V>
__global__ void __launch_bounds__(BN_THREADS)
    bn_dx_kernel(const T *__restrict__ x, const T *__restrict__ y, const T *__restrict__ dy,
                 const float *__restrict__ gamma, const float *__restrict__ mean,
                 const float *__restrict__ rstd, const float *__restrict__ dgamma,
                 const float *__restrict__ dbeta, T *__restrict__ dx, T *__restrict__ dres,
                 int64_t M, int64_t nrow, int64_t nthreads)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nthreads) return;
    const int64_t cv = t % nrow, rstep = nthreads / nrow;
    const float inv_m = 1.f / (float)M;
    float mk[V], rs[V], gr[V], k1[V], k2[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int64_t c = cv * V + k;
        mk[k] = mean[c], rs[k] = rstd[c], gr[k] = gamma[c] * rs[k];
        k1[k] = dbeta[c] * inv_m, k2[k] = dgamma[c] * inv_m;
    }
    vec_t<T, V> yv = {};
    for (int64_t r = t / nrow; r < M; r += rstep) {
        const int64_t i = r * nrow + cv;
        const vec_t<T, V> xv = ldv<T, V>(x, i), dv = ldv<T, V>(dy, i);
        if (y) yv = ldv<T, V>(y, i);
        vec_t<T, V> out, gv;
#pragma unroll
        for (int k = 0; k < V; k++) {
            const float g = masked(to_f(dv.e[k]), y, yv.e[k]);
            const float xhat = (to_f(xv.e[k]) - mk[k]) * rs[k];
            out.e[k] = from_f<T>(gr[k] * (g - k1[k] - xhat * k2[k]));
            gv.e[k] = from_f<T>(g);
        }
        stv<T, V>(dx, i, out);
        if (dres) stv<T, V>(dres, i, gv);
    }
}

/* ---- launchers ---- */

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* The element-wise kernels' thread count: a multiple of nrow (so a thread keeps its channels),
 * about BN_ELT_BLOCKS_PER_SM blocks per SM, no more than one per vector; at least nrow. */
static int64_t elt_threads(sg_ctx *ctx, int64_t M, int64_t nrow)
{
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * BN_ELT_BLOCKS_PER_SM * BN_THREADS;
    if (cap > M * nrow) cap = M * nrow;
    const int64_t n = cap / nrow * nrow;
    return n > nrow ? n : nrow;
}

static unsigned blocks_for(int64_t threads)
{
    return (unsigned)((threads + BN_THREADS - 1) / BN_THREADS);
}

/* Kernel 1's shape: cols vector columns per block (the largest power of two <= nrow, up to
 * BN_MAX_COLS), about BN_PART_BLOCKS_PER_SM blocks per SM, at least BN_MIN_ROWS_PER_THREAD rows
 * per thread, as many parts as the scratch holds. *rpp: rows per part; returns the parts. */
static int plan_parts(sg_ctx *ctx, int64_t M, int64_t C, int64_t nrow, int *cols, int64_t *rpp)
{
    int w = 1;
    while (w < BN_MAX_COLS && 2 * w <= nrow) w *= 2;
    *cols = w;
    const int64_t tiles = (nrow + w - 1) / w, slices = BN_THREADS / w;
    int64_t want = ((int64_t)sg_ctx_sm_count(ctx) * BN_PART_BLOCKS_PER_SM + tiles - 1) / tiles;
    const int64_t by_rows = (M + slices * BN_MIN_ROWS_PER_THREAD - 1) / (slices * BN_MIN_ROWS_PER_THREAD);
    if (want > by_rows) want = by_rows;
    if (want > SG_BATCHNORM_CUDA_MAX_C / C) want = SG_BATCHNORM_CUDA_MAX_C / C;
    if (want < 1) want = 1;
    *rpp = (M + want - 1) / want;
    return (int)((M + *rpp - 1) / *rpp);
}

/* Kernel 1. Forward: out0, out1 = mean, rstd (rm, rv: running stats or NULL); backward:
 * dgamma, dbeta (y: the mask or NULL). */
template <typename T, int V, bool BWD>
static sg_status channel_sums(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *dy,
                              const sg_tensor *y, const sg_tensor *mean, const sg_tensor *rstd,
                              float momentum, float eps, float *out0, float *out1, float *rm,
                              float *rv)
{
    const int64_t C = x->shape[x->ndim - 1], M = x->numel / C, nrow = C / V;
    /* Always the same size (the entry point caps C), so the buffer is allocated once (zeroed:
     * the counters start at 0) and its address never changes: a captured graph keeps pointing
     * at it. */
    void *scratch;
    SG_TRY(sg_ctx_scratch(ctx, SG_SLOT_BATCHNORM, BN_SCRATCH_BYTES, &scratch));
    double *partials = (double *)scratch;
    unsigned *counters = (unsigned *)((char *)scratch + BN_PARTIAL_BYTES);
    int cols;
    int64_t rpp;
    const int nparts = plan_parts(ctx, M, C, nrow, &cols, &rpp);
    const unsigned tiles = (unsigned)((nrow + cols - 1) / cols);
    bn_sums_kernel<T, V, BWD><<<dim3(tiles, (unsigned)nparts), BN_THREADS, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (const T *)x->data, dy ? (const T *)dy->data : nullptr, y ? (const T *)y->data : nullptr,
        mean ? (const float *)mean->data : nullptr, rstd ? (const float *)rstd->data : nullptr,
        partials, counters, M, C, rpp, cols, momentum, eps, out0, out1, rm, rv);
    SG_CUDA_CHECK_LAUNCH(ctx, "bn_sums_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <typename T, int V>
static sg_status forward_v(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                           const sg_tensor *beta, const sg_tensor *res, int relu,
                           sg_tensor *running_mean, sg_tensor *running_var, float momentum,
                           float eps, int training, sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    const int64_t C = x->shape[x->ndim - 1], M = x->numel / C, nrow = C / V;
    float *rm = running_mean ? (float *)running_mean->data : nullptr;
    float *rv = running_var ? (float *)running_var->data : nullptr;
    if (training)
        SG_TRY((channel_sums<T, V, false>(ctx, x, nullptr, nullptr, nullptr, nullptr, momentum, eps,
                                          (float *)mean->data, (float *)rstd->data, rm, rv)));
    /* Training normalises with the batch statistics just written; eval with the running ones. */
    const float *m = training ? (const float *)mean->data : rm;
    const float *sd = training ? (const float *)rstd->data : rv;
    const int64_t nt = elt_threads(ctx, M, nrow);
    bn_apply_kernel<T, V><<<blocks_for(nt), BN_THREADS, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (const T *)x->data, res ? (const T *)res->data : nullptr, (const float *)gamma->data,
        (const float *)beta->data, m, sd, eps, !training, relu, (T *)y->data, (float *)mean->data,
        (float *)rstd->data, M, nrow, nt);
    SG_CUDA_CHECK_LAUNCH(ctx, "bn_apply_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <typename T, int V>
static sg_status backward_v(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                            const sg_tensor *mean, const sg_tensor *rstd, const sg_tensor *y,
                            const sg_tensor *dy, sg_tensor *dx, sg_tensor *dres, sg_tensor *dgamma,
                            sg_tensor *dbeta)
{
    const int64_t C = x->shape[x->ndim - 1], M = x->numel / C, nrow = C / V;
    SG_TRY((channel_sums<T, V, true>(ctx, x, dy, y, mean, rstd, 0.f, 0.f, (float *)dgamma->data,
                                     (float *)dbeta->data, nullptr, nullptr)));
    const int64_t nt = elt_threads(ctx, M, nrow);
    bn_dx_kernel<T, V><<<blocks_for(nt), BN_THREADS, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (const T *)x->data, y ? (const T *)y->data : nullptr, (const T *)dy->data,
        (const float *)gamma->data, (const float *)mean->data, (const float *)rstd->data,
        (const float *)dgamma->data, (const float *)dbeta->data, (T *)dx->data,
        dres ? (T *)dres->data : nullptr, M, nrow, nt);
    SG_CUDA_CHECK_LAUNCH(ctx, "bn_dx_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* Every activation tensor (NULLs pass) 16-byte aligned and C a multiple of V: the vector path. */
static bool vectors(int64_t C, int V, const sg_tensor *const *ts, int n)
{
    if (C % V) return false;
    for (int i = 0; i < n; i++)
        if (ts[i] && !aligned16(ts[i]->data)) return false;
    return true;
}

template <typename T>
static sg_status forward_t(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                           const sg_tensor *beta, const sg_tensor *res, int relu,
                           sg_tensor *running_mean, sg_tensor *running_var, float momentum,
                           float eps, int training, sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    constexpr int VEC = 16 / sizeof(T);
    const sg_tensor *acts[3] = {x, res, y};
    if (vectors(x->shape[x->ndim - 1], VEC, acts, 3))
        return forward_v<T, VEC>(ctx, x, gamma, beta, res, relu, running_mean, running_var,
                                 momentum, eps, training, y, mean, rstd);
    return forward_v<T, 1>(ctx, x, gamma, beta, res, relu, running_mean, running_var, momentum,
                           eps, training, y, mean, rstd);
}

template <typename T>
static sg_status backward_t(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *gamma,
                            const sg_tensor *mean, const sg_tensor *rstd, const sg_tensor *y,
                            const sg_tensor *dy, sg_tensor *dx, sg_tensor *dres, sg_tensor *dgamma,
                            sg_tensor *dbeta)
{
    constexpr int VEC = 16 / sizeof(T);
    const sg_tensor *acts[5] = {x, y, dy, dx, dres};
    if (vectors(x->shape[x->ndim - 1], VEC, acts, 5))
        return backward_v<T, VEC>(ctx, x, gamma, mean, rstd, y, dy, dx, dres, dgamma, dbeta);
    return backward_v<T, 1>(ctx, x, gamma, mean, rstd, y, dy, dx, dres, dgamma, dbeta);
}

extern "C" sg_status sg_batchnorm_forward_cuda(sg_ctx *ctx, const sg_tensor *x,
                                               const sg_tensor *gamma, const sg_tensor *beta,
                                               const sg_tensor *res, int relu,
                                               sg_tensor *running_mean, sg_tensor *running_var,
                                               float momentum, float eps, int training,
                                               sg_tensor *y, sg_tensor *mean, sg_tensor *rstd)
{
    switch (x->dtype) {
    case SG_DTYPE_F32:
        return forward_t<float>(ctx, x, gamma, beta, res, relu, running_mean, running_var,
                                momentum, eps, training, y, mean, rstd);
    case SG_DTYPE_BF16:
        return forward_t<__nv_bfloat16>(ctx, x, gamma, beta, res, relu, running_mean, running_var,
                                        momentum, eps, training, y, mean, rstd);
    default:
        return sg_fail(ctx, SG_ERR_DTYPE,
                       "sg_batchnorm_forward: 'x' is %s; the CUDA kernels take f32 or bf16",
                       sg_dtype_name(x->dtype));
    }
}

extern "C" sg_status sg_batchnorm_backward_cuda(sg_ctx *ctx, const sg_tensor *x,
                                                const sg_tensor *gamma, const sg_tensor *mean,
                                                const sg_tensor *rstd, const sg_tensor *y,
                                                const sg_tensor *dy, sg_tensor *dx,
                                                sg_tensor *dres, sg_tensor *dgamma,
                                                sg_tensor *dbeta)
{
    switch (x->dtype) {
    case SG_DTYPE_F32:
        return backward_t<float>(ctx, x, gamma, mean, rstd, y, dy, dx, dres, dgamma, dbeta);
    case SG_DTYPE_BF16:
        return backward_t<__nv_bfloat16>(ctx, x, gamma, mean, rstd, y, dy, dx, dres, dgamma,
                                         dbeta);
    default:
        return sg_fail(ctx, SG_ERR_DTYPE,
                       "sg_batchnorm_backward: 'x' is %s; the CUDA kernels take f32 or bf16",
                       sg_dtype_name(x->dtype));
    }
}
