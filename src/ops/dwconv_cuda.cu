/* dwconv_cuda.cu: stepgraph's depthwise 2-D convolution kernels (groups = Cin = Cout = C, w
 * (C, KH, KW, 1)), channels last, f32 or bf16 storage, f32 math, any stride, padding and
 * dilation: the forward (bias fused), the input gradient and the weight gradient. conv_cuda.cu's
 * plan chooses them over cuDNN pass by pass (STEPGRAPH_DEPTHWISE, see conv.h); the launchers take
 * raw device pointers, queue on the context's stream, never allocate and count no launches (the
 * caller does: forward 1, data 1, filter 2).
 *
 * Deterministic without atomics. Forward and data: one thread writes each output, summing its
 * taps in row-major (kh, kw) order. Filter: dw[c, kh, kw] sums N OH OW products; the rows
 * (output positions) are cut into `slices` runs of `rows`, a thread sums one (channel, tap)
 * over one run in row order into the plan's workspace (partials (slices, KH KW, C) f32), and a
 * second kernel adds each weight's partials in a fixed order in double, rounding once.
 *
 * Vectors: a thread owns V consecutive channels, V = 16 bytes of them (8 bf16, 4 f32) when
 * C % V == 0 and the vector-loaded pointers are 16-byte aligned, else V = 1 (any C, any view).
 * Both paths add every sum in the same order, and the slicing depends on the shape alone (not
 * on V, nor on the device), so they give the same bits.
 *
 * Tiling. Forward: a block stages its chunk of txc V channels' weights in shared memory as f32
 * (KH KW, txc V), its threads are (channel vector, tile); a tile is DW_TW consecutive outputs
 * along OW of one (n, oh), so a weight read serves DW_TW outputs and neighbouring taps hit L1;
 * blocks stride over the tiles. Data: the same, a tile being DW_TW inputs iw = r + sw q of one
 * residue r = iw mod sw, whose taps are then the same and read DW_TW consecutive dy columns.
 * Filter: a block is (channel vector, tap) threads of one chunk, for one run of rows. */
#include "ops/conv.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <limits.h>

#include "ops/dtype_cuda.cuh"

#define DW_TW 4                      /* forward, data: positions along W per thread */
#define DW_THREADS 256               /* forward, data: threads per block (at most) */
#define DW_MAX_TXC 32                /* forward, data: channel vectors per block (at most) */
#define DW_SMEM_MAX 32768            /* forward, data: bytes of staged weights per block */
#define DW_BLOCKS_PER_SM 8           /* forward, data: grid cap (blocks stride beyond it) */
#define DW_MAX_TAPS 1024             /* KH KW at most (filter: a block holds every tap) */
#define DW_MAX_GRID_Y 65535          /* channel chunks at most */
#define DW_FILTER_THREADS 256        /* filter: (channel vector, tap) threads per block aimed at */
#define DW_TARGET_THREADS (1 << 18)  /* filter: (16-byte channel vector, tap, run) triples */
#define DW_MIN_ROWS 32               /* filter: rows per run at least */
#define DW_RED_GROUPS 16             /* filter reduce: runs summed apart, then in order */

/* The plan's sizes, and every element offset into x, y and their gradients, fit an int
 * (sg_dwconv_supported). */
typedef struct dw_geom {
    int N, H, W, C, OH, OW, KH, KW;
    int sh, sw, ph, pw, dh, dw;
} dw_geom;

static dw_geom geom_of(const sg_conv2d *c)
{
    dw_geom g = {(int)c->x_shape[0], (int)c->x_shape[1], (int)c->x_shape[2], (int)c->x_shape[3],
                 (int)c->y_shape[1], (int)c->y_shape[2], (int)c->w_shape[1], (int)c->w_shape[2],
                 c->p.stride_h,      c->p.stride_w,      c->p.pad_h,         c->p.pad_w,
                 c->p.dil_h,         c->p.dil_w};
    return g;
}

/* 16 bytes of channels: the vector width of dtype dt. */
static int vec_width(sg_dtype dt) { return dt == SG_DTYPE_BF16 ? 8 : 4; }

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Forward and data: channel vectors per block, so that the staged weights (KK, txc V) f32 fit
 * DW_SMEM_MAX (KK <= DW_MAX_TAPS and V <= 8 leave txc >= 1). */
static int stage_txc(int C, int V, int KK)
{
    int64_t cv = ceil_div(C, V), t = cv < DW_MAX_TXC ? cv : DW_MAX_TXC;
    int64_t fit = DW_SMEM_MAX / ((int64_t)V * KK * (int64_t)sizeof(float));
    if (fit < 1) fit = 1;
    return (int)(t < fit ? t : fit);
}

/* Filter: channel vectors per block (a block holds txc KK threads). */
static int filter_txc(int C, int V, int KK)
{
    int64_t cv = ceil_div(C, V), t = DW_FILTER_THREADS / KK;
    if (t < 1) t = 1;
    return (int)(cv < t ? cv : t);
}

/* Filter: the runs of rows, from the shape alone (V of the dtype, not of the path taken). */
static void filter_runs(const sg_conv2d *c, int64_t *slices, int64_t *rows)
{
    const int64_t M = c->y_shape[0] * c->y_shape[1] * c->y_shape[2];
    const int64_t KK = c->w_shape[1] * c->w_shape[2];
    const int64_t per = ceil_div(c->x_shape[3], vec_width(c->dtype)) * KK; /* threads per run */
    int64_t s = ceil_div(DW_TARGET_THREADS, per), most = ceil_div(M, DW_MIN_ROWS);
    if (s > most) s = most;
    if (s < 1) s = 1;
    *rows = ceil_div(M, s);
    *slices = ceil_div(M, *rows);
}

extern "C" bool sg_dwconv_supported(const sg_conv2d *c)
{
    if (c->dtype != SG_DTYPE_F32 && c->dtype != SG_DTYPE_BF16) return false;
    const int64_t C = c->x_shape[3], KK = c->w_shape[1] * c->w_shape[2];
    if (c->p.groups != C || c->w_shape[0] != C || c->w_shape[3] != 1 || c->y_shape[3] != C)
        return false;
    if (KK > DW_MAX_TAPS) return false;
    /* The kernels index in int: every tensor under 2^31 elements (conv.c refuses more, for
     * cuDNN's descriptors, before the plan gets here). */
    if (c->x_shape[0] * c->x_shape[1] * c->x_shape[2] * C > INT_MAX ||
        c->y_shape[0] * c->y_shape[1] * c->y_shape[2] * C > INT_MAX)
        return false;
    /* The scalar path has the most chunks. */
    return ceil_div(C, stage_txc((int)C, 1, (int)KK)) <= DW_MAX_GRID_Y &&
           ceil_div(C, filter_txc((int)C, 1, (int)KK)) <= DW_MAX_GRID_Y;
}

extern "C" size_t sg_dwconv_workspace_bytes(const sg_conv2d *c)
{
    int64_t slices, rows;
    filter_runs(c, &slices, &rows);
    return (size_t)(slices * c->w_shape[1] * c->w_shape[2] * c->x_shape[3]) * sizeof(float);
}

/* ---- kernels ---- */

/* Stages the chunk's weights: ws[tap CB + j] = w[(c0 + j) KK + tap] as f32, 0 past C (w read
 * in its own order: the chunk's weights are contiguous there). */
template <typename T>
__device__ __forceinline__ void stage_weights(const T *__restrict__ w, float *ws, int c0, int CB,
                                              int KK, int C)
{
    for (int i = threadIdx.x; i < KK * CB; i += blockDim.x) {
        const int j = i / KK, tap = i % KK;
        ws[tap * CB + j] = c0 + j < C ? to_f(w[(int64_t)c0 * KK + i]) : 0.f;
    }
    __syncthreads();
}

/* A tap's V channel weights from the block's shared copy, into registers. */
template <int V>
__device__ __forceinline__ void tap_weights(const float *wp, float wv[V])
{
#pragma unroll
    for (int v = 0; v < V; v++) wv[v] = wp[v];
}

/* y (N, OH, OW, C) = b + x (*) w. Block: txc channel vectors x TY tiles, chunk blockIdx.y;
 * dynamic shared memory (KH KW, txc V) f32. */
template <typename T, int V>
__global__ void __launch_bounds__(DW_THREADS)
dw_forward_kernel(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ b,
                  T *__restrict__ y, dw_geom g, int txc)
{
    extern __shared__ float wsh[];
    const int KK = g.KH * g.KW, CB = txc * V, c0 = blockIdx.y * CB;
    stage_weights(w, wsh, c0, CB, KK, g.C);
    const int cl = threadIdx.x % txc, ty = threadIdx.x / txc, TY = blockDim.x / txc;
    const int c = c0 + cl * V;
    if (c >= g.C) return; /* V > 1: C % V == 0, so the whole vector is in */
    float bias[V];
#pragma unroll
    for (int v = 0; v < V; v++) bias[v] = b ? to_f(b[c + v]) : 0.f;
    const int OWT = (g.OW + DW_TW - 1) / DW_TW;
    const int64_t tiles = (int64_t)g.N * g.OH * OWT;
    for (int64_t q = (int64_t)blockIdx.x * TY + ty; q < tiles; q += (int64_t)gridDim.x * TY) {
        const int qi = (int)q; /* tiles <= N OH OW: an int */
        const int ow0 = qi % OWT * DW_TW, oh = qi / OWT % g.OH, n = qi / OWT / g.OH;
        float acc[DW_TW][V];
#pragma unroll
        for (int t = 0; t < DW_TW; t++)
#pragma unroll
            for (int v = 0; v < V; v++) acc[t][v] = bias[v];
        for (int kh = 0; kh < g.KH; kh++) {
            const int ih = oh * g.sh - g.ph + kh * g.dh;
            if (ih < 0 || ih >= g.H) continue;
            const T *xr = x + ((n * g.H + ih) * g.W) * g.C + c;
            for (int kw = 0; kw < g.KW; kw++) {
                float wv[V];
                tap_weights<V>(wsh + (kh * g.KW + kw) * CB + cl * V, wv);
#pragma unroll
                for (int t = 0; t < DW_TW; t++) {
                    const int iw = (ow0 + t) * g.sw - g.pw + kw * g.dw;
                    if (ow0 + t >= g.OW || iw < 0 || iw >= g.W) continue;
                    const vec_t<T, V> xv = ldv<T, V>(xr + iw * g.C, 0);
#pragma unroll
                    for (int v = 0; v < V; v++) acc[t][v] = fmaf(to_f(xv.e[v]), wv[v], acc[t][v]);
                }
            }
        }
        T *yr = y + ((n * g.OH + oh) * g.OW + ow0) * g.C + c;
#pragma unroll
        for (int t = 0; t < DW_TW; t++) {
            if (ow0 + t >= g.OW) break;
            vec_t<T, V> o;
#pragma unroll
            for (int v = 0; v < V; v++) o.e[v] = from_f<T>(acc[t][v]);
            stv<T, V>(yr + t * g.C, 0, o);
        }
    }
}

/* dx (N, H, W, C): dx[n, ih, iw, c] = sum over the taps (kh, kw) whose output (oh, ow) exists,
 * oh = (ih + ph - kh dh) / sh dividing exactly (ow likewise), of dy[n, oh, ow, c] w[c, kh, kw].
 * A tile: DW_TW inputs iw = r + sw (qt DW_TW + t) of one (n, ih) and residue r, so tap kw
 * divides for all or none of them, and they read dy columns ow = (r + pw - kw dw) / sw +
 * qt DW_TW + t. */
template <typename T, int V>
__global__ void __launch_bounds__(DW_THREADS)
dw_data_kernel(const T *__restrict__ dy, const T *__restrict__ w, T *__restrict__ dx, dw_geom g,
               int txc)
{
    extern __shared__ float wsh[];
    const int KK = g.KH * g.KW, CB = txc * V, c0 = blockIdx.y * CB;
    stage_weights(w, wsh, c0, CB, KK, g.C);
    const int cl = threadIdx.x % txc, ty = threadIdx.x / txc, TY = blockDim.x / txc;
    const int c = c0 + cl * V;
    if (c >= g.C) return;
    const int Q = (g.W + g.sw - 1) / g.sw, QT = (Q + DW_TW - 1) / DW_TW;
    const int R = g.sw < g.W ? g.sw : g.W; /* residues with an input */
    const int64_t tiles = (int64_t)g.N * g.H * R * QT;
    for (int64_t q = (int64_t)blockIdx.x * TY + ty; q < tiles; q += (int64_t)gridDim.x * TY) {
        const int qt = (int)(q % QT), r = (int)(q / QT % R);
        const int row = (int)(q / QT / R); /* n H + ih */
        const int ih = row % g.H, n = row / g.H;
        float acc[DW_TW][V];
#pragma unroll
        for (int t = 0; t < DW_TW; t++)
#pragma unroll
            for (int v = 0; v < V; v++) acc[t][v] = 0.f;
        for (int kh = 0; kh < g.KH; kh++) {
            const int th = ih + g.ph - kh * g.dh;
            if (th < 0 || th % g.sh) continue;
            const int oh = th / g.sh;
            if (oh >= g.OH) continue;
            const T *dyr = dy + ((n * g.OH + oh) * g.OW) * g.C + c;
            for (int kw = 0; kw < g.KW; kw++) {
                const int num = r + g.pw - kw * g.dw; /* may be negative: % is 0 iff it divides */
                if (num % g.sw) continue;
                const int ow0 = num / g.sw + qt * DW_TW;
                float wv[V];
                tap_weights<V>(wsh + (kh * g.KW + kw) * CB + cl * V, wv);
#pragma unroll
                for (int t = 0; t < DW_TW; t++) {
                    const int ow = ow0 + t;
                    if (ow < 0 || ow >= g.OW) continue;
                    const vec_t<T, V> gv = ldv<T, V>(dyr + ow * g.C, 0);
#pragma unroll
                    for (int v = 0; v < V; v++) acc[t][v] = fmaf(to_f(gv.e[v]), wv[v], acc[t][v]);
                }
            }
        }
        T *dxr = dx + (row * g.W + r) * g.C + c;
#pragma unroll
        for (int t = 0; t < DW_TW; t++) {
            const int iw = r + g.sw * (qt * DW_TW + t);
            if (iw >= g.W) break;
            vec_t<T, V> o;
#pragma unroll
            for (int v = 0; v < V; v++) o.e[v] = from_f<T>(acc[t][v]);
            stv<T, V>(dxr + (iw - r) * g.C, 0, o);
        }
    }
}

/* Filter partials: block (run blockIdx.x, chunk blockIdx.y), thread (channel vector cl, tap):
 * the sum over the run's rows p = (n, oh, ow), in order, of dy[p, c] x[n, ih, iw, c] with
 * (ih, iw) the tap's input (padding skipped), into partials[(run KK + tap) C + c], f32. */
template <typename T, int V>
__global__ void __launch_bounds__(DW_MAX_TAPS) /* blocks of txc KK <= max(256, KK) threads */
dw_filter_partial_kernel(const T *__restrict__ x, const T *__restrict__ dy,
                                         float *__restrict__ partials, dw_geom g, int txc,
                                         int rows)
{
    const int KK = g.KH * g.KW;
    const int cl = threadIdx.x % txc, tap = threadIdx.x / txc;
    const int c = (blockIdx.y * txc + cl) * V;
    if (c >= g.C) return;
    const int kh = tap / g.KW, kw = tap % g.KW;
    const int M = g.N * g.OH * g.OW, p0 = blockIdx.x * rows, p1 = p0 + rows < M ? p0 + rows : M;
    int ow = p0 % g.OW, oh = p0 / g.OW % g.OH, n = p0 / g.OW / g.OH;
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; v++) acc[v] = 0.f;
#pragma unroll 4
    for (int p = p0; p < p1; p++) {
        const int ih = oh * g.sh - g.ph + kh * g.dh, iw = ow * g.sw - g.pw + kw * g.dw;
        if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) {
            const vec_t<T, V> gv = ldv<T, V>(dy + p * g.C + c, 0);
            const vec_t<T, V> xv = ldv<T, V>(x + ((n * g.H + ih) * g.W + iw) * g.C + c, 0);
#pragma unroll
            for (int v = 0; v < V; v++) acc[v] = fmaf(to_f(gv.e[v]), to_f(xv.e[v]), acc[v]);
        }
        if (++ow == g.OW) {
            ow = 0;
            if (++oh == g.OH) oh = 0, n++;
        }
    }
    float *out = partials + ((int64_t)blockIdx.x * KK + tap) * g.C + c;
#pragma unroll
    for (int v = 0; v < V; v++) out[v] = acc[v];
}

/* dw (C, KH, KW): j = tap C + c sums partials[s KK C + j] over the runs s: group k of
 * DW_RED_GROUPS takes s = k, k + DW_RED_GROUPS, ... in order, then the groups in order; double,
 * rounded once to T. Block: 32 consecutive j x DW_RED_GROUPS. */
template <typename T>
__global__ void __launch_bounds__(32 * DW_RED_GROUPS)
dw_filter_reduce_kernel(const float *__restrict__ partials, int64_t slices, int C, int KK,
                        T *__restrict__ dw)
{
    __shared__ double sh[DW_RED_GROUPS][32];
    const int lane = threadIdx.x % 32, grp = threadIdx.x / 32;
    const int64_t j = (int64_t)blockIdx.x * 32 + lane, n = (int64_t)C * KK;
    double s = 0;
    if (j < n)
        for (int64_t p = grp; p < slices; p += DW_RED_GROUPS) s += partials[p * n + j];
    sh[grp][lane] = s;
    __syncthreads();
    if (grp != 0 || j >= n) return;
    double t = sh[0][lane];
    for (int k = 1; k < DW_RED_GROUPS; k++) t += sh[k][lane];
    const int64_t tap = j / C, c = j % C;
    dw[c * KK + tap] = from_d<T>(t);
}

/* ---- launchers ---- */

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Forward and data: the grid for `tiles` tiles of txc channel vectors in `chunks` chunks. */
static void stage_grid(sg_ctx *ctx, int64_t tiles, int txc, int64_t chunks, dim3 *grid,
                       dim3 *block)
{
    const int TY = DW_THREADS / txc;
    const int64_t cap = ceil_div((int64_t)sg_ctx_sm_count(ctx) * DW_BLOCKS_PER_SM, chunks);
    int64_t bx = ceil_div(tiles, TY);
    if (bx > cap) bx = cap;
    if (bx < 1) bx = 1;
    *grid = dim3((unsigned)bx, (unsigned)chunks);
    *block = dim3((unsigned)(txc * TY));
}

template <typename T, int V>
static sg_status forward_as(sg_ctx *ctx, const sg_conv2d *c, const void *x, const void *w,
                            const void *b, void *y)
{
    const dw_geom g = geom_of(c);
    const int KK = g.KH * g.KW, txc = stage_txc(g.C, V, KK);
    const int64_t tiles = (int64_t)g.N * g.OH * ((g.OW + DW_TW - 1) / DW_TW);
    dim3 grid, block;
    stage_grid(ctx, tiles, txc, ceil_div(ceil_div(g.C, V), txc), &grid, &block);
    const size_t smem = (size_t)KK * txc * V * sizeof(float);
    dw_forward_kernel<T, V><<<grid, block, smem, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (const T *)x, (const T *)w, (const T *)b, (T *)y, g, txc);
    SG_CUDA_CHECK_LAUNCH(ctx, "dw_forward_kernel");
    return SG_OK;
}

template <typename T, int V>
static sg_status data_as(sg_ctx *ctx, const sg_conv2d *c, const void *w, const void *dy, void *dx)
{
    const dw_geom g = geom_of(c);
    const int KK = g.KH * g.KW, txc = stage_txc(g.C, V, KK);
    const int64_t R = g.sw < g.W ? g.sw : g.W;
    const int64_t tiles = (int64_t)g.N * g.H * R * ceil_div(ceil_div(g.W, g.sw), DW_TW);
    dim3 grid, block;
    stage_grid(ctx, tiles, txc, ceil_div(ceil_div(g.C, V), txc), &grid, &block);
    const size_t smem = (size_t)KK * txc * V * sizeof(float);
    dw_data_kernel<T, V><<<grid, block, smem, (cudaStream_t)sg_ctx_stream(ctx)>>>(
        (const T *)dy, (const T *)w, (T *)dx, g, txc);
    SG_CUDA_CHECK_LAUNCH(ctx, "dw_data_kernel");
    return SG_OK;
}

template <typename T, int V>
static sg_status filter_as(sg_ctx *ctx, const sg_conv2d *c, const void *x, const void *dy,
                           void *dw, float *partials)
{
    const dw_geom g = geom_of(c);
    const int KK = g.KH * g.KW, txc = filter_txc(g.C, V, KK);
    int64_t slices, rows;
    filter_runs(c, &slices, &rows);
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    dim3 grid((unsigned)slices, (unsigned)ceil_div(ceil_div(g.C, V), txc));
    dw_filter_partial_kernel<T, V><<<grid, txc * KK, 0, st>>>((const T *)x, (const T *)dy,
                                                              partials, g, txc, (int)rows);
    SG_CUDA_CHECK_LAUNCH(ctx, "dw_filter_partial_kernel");
    const int64_t n = (int64_t)g.C * KK;
    dw_filter_reduce_kernel<T><<<(unsigned)ceil_div(n, 32), 32 * DW_RED_GROUPS, 0, st>>>(
        partials, slices, g.C, KK, (T *)dw);
    SG_CUDA_CHECK_LAUNCH(ctx, "dw_filter_reduce_kernel");
    return SG_OK;
}

/* The vector path when C and the pointers allow it, else the scalar one (the same bits). */
extern "C" sg_status sg_dwconv_forward_cuda(sg_ctx *ctx, const sg_conv2d *c, const void *x,
                                            const void *w, const void *b, void *y)
{
    const bool vec = c->x_shape[3] % vec_width(c->dtype) == 0 && aligned16(x) && aligned16(y);
    if (c->dtype == SG_DTYPE_BF16)
        return vec ? forward_as<__nv_bfloat16, 8>(ctx, c, x, w, b, y)
                   : forward_as<__nv_bfloat16, 1>(ctx, c, x, w, b, y);
    return vec ? forward_as<float, 4>(ctx, c, x, w, b, y)
               : forward_as<float, 1>(ctx, c, x, w, b, y);
}

extern "C" sg_status sg_dwconv_backward_data_cuda(sg_ctx *ctx, const sg_conv2d *c, const void *w,
                                                  const void *dy, void *dx)
{
    const bool vec = c->x_shape[3] % vec_width(c->dtype) == 0 && aligned16(dy) && aligned16(dx);
    if (c->dtype == SG_DTYPE_BF16)
        return vec ? data_as<__nv_bfloat16, 8>(ctx, c, w, dy, dx)
                   : data_as<__nv_bfloat16, 1>(ctx, c, w, dy, dx);
    return vec ? data_as<float, 4>(ctx, c, w, dy, dx) : data_as<float, 1>(ctx, c, w, dy, dx);
}

extern "C" sg_status sg_dwconv_backward_filter_cuda(sg_ctx *ctx, const sg_conv2d *c,
                                                    const void *x, const void *dy, void *dw,
                                                    void *ws, size_t ws_bytes)
{
    const size_t need = sg_dwconv_workspace_bytes(c);
    if (ws_bytes < need || !aligned16(ws))
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_conv2d_backward: the depthwise weight gradient needs %zu bytes of "
                       "16-byte aligned workspace, the plan holds %zu%s",
                       need, ws_bytes, aligned16(ws) ? "" : " (misaligned)");
    const bool vec = c->x_shape[3] % vec_width(c->dtype) == 0 && aligned16(x) && aligned16(dy);
    float *part = (float *)ws;
    if (c->dtype == SG_DTYPE_BF16)
        return vec ? filter_as<__nv_bfloat16, 8>(ctx, c, x, dy, dw, part)
                   : filter_as<__nv_bfloat16, 1>(ctx, c, x, dy, dw, part);
    return vec ? filter_as<float, 4>(ctx, c, x, dy, dw, part)
               : filter_as<float, 1>(ctx, c, x, dy, dw, part);
}
