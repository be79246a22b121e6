/* pool_cuda.cu: max pooling, global average pooling and channel scaling kernels over
 * channels-last images, and their launchers. Storage type T: f32, or bf16 for mixed precision
 * (every float tensor of a call); math in f32, sums over H W in double, each output rounded
 * once to T. One launch per call, no atomics: the same inputs give the same bits.
 *
 * Max pooling: a thread per output element, channels fastest (a warp reads 32 consecutive
 * channels of a window position: coalesced). Its backward gathers: a thread per dx element
 * visits the few windows that contain it (ceil(k / stride)^2 at most) in row-major order and
 * adds the dy of those whose argmax names it, so overlapping windows add in a fixed order.
 * Sums over H W (average pooling, the channel scaling's ds): a block per (image, 32 channels),
 * its SLICES warps taking every SLICES-th position, each lane one channel, then the warps'
 * sums added in order. The rest is elementwise. */
#include "ops/pool.h"

#include "ops/dtype_cuda.cuh"
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define POOL_THREADS 256
#define POOL_BLOCKS_PER_SM 8 /* elementwise grid cap (grid-stride beyond it) */
#define HW_COLS 32           /* sums over H W: channels per block */
#define HW_MAX_GRID_Y 65535  /* images per grid column (grid-stride beyond) */

/* ---- max pooling ---- */

/* x (N, H, W, C) -> y, argmax (N, OH, OW, C); index type I: int when every index fits (32-bit
 * division is several times cheaper than 64-bit), else int64_t. The scan starts at the window's first position
 * inside the image; a later one wins when strictly greater, or NaN (the first NaN stays), as
 * the CPU reference. */
template <typename T, typename I>
__global__ void maxpool_forward_kernel(const T *__restrict__ x, T *__restrict__ y,
                                       int *__restrict__ argmax, I n_out, I H,
                                       I W, I C, I OH, I OW, int k,
                                       int stride, int pad)
{
    const I step = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n_out; i += step) {
        const I c = i % C, t = i / C, ow = t % OW, t2 = t / OW, oh = t2 % OH, n = t2 / OH;
        const I h0 = oh * stride - pad, w0 = ow * stride - pad;
        const I hs = h0 < 0 ? 0 : h0, he = h0 + k < H ? h0 + k : H;
        const I ws = w0 < 0 ? 0 : w0, we = w0 + k < W ? w0 + k : W;
        const T *xn = x + n * H * W * C + c;
        float best = to_f(xn[(hs * W + ws) * C]);
        I arg = hs * W + ws;
        for (I h = hs; h < he; h++)
            for (I w = ws; w < we; w++) {
                const float v = to_f(xn[(h * W + w) * C]);
                if (!isnan(best) && (v > best || isnan(v))) {
                    best = v;
                    arg = h * W + w;
                }
            }
        y[i] = from_f<T>(best); /* one of x's values: exact */
        argmax[i] = (int)arg;
    }
}

/* The outputs o in [*lo, *hi] whose window (o*stride - pad .. + k - 1) contains position i. */
template <typename I>
__device__ __forceinline__ void windows_of(I i, int k, int stride, int pad, I out, I *lo, I *hi)
{
    const I t = i + pad - k + 1;
    *lo = t <= 0 ? 0 : (t + stride - 1) / stride;
    *hi = (i + pad) / stride;
    if (*hi > out - 1) *hi = out - 1;
}

/* dx (N, H, W, C), every element written: the sum over the windows containing it, row-major,
 * of dy where argmax names it. */
template <typename T, typename I>
__global__ void maxpool_backward_kernel(const T *__restrict__ dy, const int *__restrict__ argmax,
                                        T *__restrict__ dx, I n_in, I H, I W,
                                        I C, I OH, I OW, int k, int stride,
                                        int pad)
{
    const I step = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n_in; i += step) {
        const I c = i % C, t = i / C, w = t % W, t2 = t / W, h = t2 % H, n = t2 / H;
        I oh0, oh1, ow0, ow1;
        windows_of(h, k, stride, pad, OH, &oh0, &oh1);
        windows_of(w, k, stride, pad, OW, &ow0, &ow1);
        const int me = (int)(h * W + w);
        float s = 0.f;
        for (I oh = oh0; oh <= oh1; oh++)
            for (I ow = ow0; ow <= ow1; ow++) {
                const I o = ((n * OH + oh) * OW + ow) * C + c;
                if (argmax[o] == me) s += to_f(dy[o]);
            }
        dx[i] = from_f<T>(s);
    }
}

/* ---- sums over H W ---- */

/* Block (channel tile, image): lanes are channels, SLICES warps split the H W positions.
 * SCALE_BWD: a = dy, b = x, s (N, C): dx = dy s written on the way, out = ds = sum dy x.
 * Otherwise: a = x, out = y = sum x / HW. */
template <typename T, bool SCALE_BWD, int SLICES>
__global__ void __launch_bounds__(HW_COLS *SLICES)
    hw_sum_kernel(const T *__restrict__ a, const T *__restrict__ b, const T *__restrict__ s,
                  T *__restrict__ dx, T *__restrict__ out, int64_t N, int64_t HW, int64_t C)
{
    __shared__ double sh[SLICES][HW_COLS];
    const int cx = threadIdx.x % HW_COLS, sy = threadIdx.x / HW_COLS;
    const int64_t c = (int64_t)blockIdx.x * HW_COLS + cx;
    for (int64_t n = blockIdx.y; n < N; n += gridDim.y) { /* uniform over the block */
        double acc = 0;
        if (c < C) {
            const int64_t base = n * HW * C + c;
            const float sc = SCALE_BWD ? to_f(s[n * C + c]) : 0.f;
            for (int64_t p = sy; p < HW; p += SLICES) {
                const int64_t i = base + p * C;
                if (SCALE_BWD) {
                    const float d = to_f(a[i]);
                    acc += (double)d * (double)to_f(b[i]);
                    dx[i] = from_f<T>(d * sc);
                } else {
                    acc += to_f(a[i]);
                }
            }
        }
        __syncthreads(); /* the previous image's readers of sh are done */
        sh[sy][cx] = acc;
        __syncthreads();
        if (sy == 0 && c < C) {
            for (int k = 1; k < SLICES; k++) acc += sh[k][cx];
            out[n * C + c] = from_d<T>(SCALE_BWD ? acc : acc / (double)HW);
        }
    }
}

/* ---- elementwise over (N, H, W, C) with a (N, C) operand ---- */

/* SCALE: out = x * v[n, c] (v = s). Otherwise: out = v[n, c] / HW (v = dy; x unused). */
template <typename T, bool SCALE>
__global__ void nc_eltwise_kernel(const T *__restrict__ x, const T *__restrict__ v,
                                  T *__restrict__ out, int64_t n_all, int64_t HW, int64_t C)
{
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    const float hw = (float)HW;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_all; i += step) {
        const int64_t c = i % C, n = i / (HW * C);
        const float vv = to_f(v[n * C + c]);
        out[i] = from_f<T>(SCALE ? to_f(x[i]) * vv : vv / hw);
    }
}

/* ---- launchers ---- */

/* Every index of t (and of the grid-stride loop past its end) fits an int. */
static bool fits_int(const sg_tensor *t)
{
    return t->numel < ((int64_t)1 << 30);
}

static int elt_blocks(sg_ctx *ctx, int64_t n)
{
    int64_t want = (n + POOL_THREADS - 1) / POOL_THREADS;
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * POOL_BLOCKS_PER_SM;
    return (int)(want < 1 ? 1 : (want < cap ? want : cap));
}

template <typename T>
static sg_status maxpool_forward_t(sg_ctx *ctx, const sg_tensor *x, int k, int stride, int pad,
                                   sg_tensor *y, sg_tensor *argmax)
{
    const int64_t H = x->shape[1], W = x->shape[2], C = x->shape[3];
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    if (fits_int(x) && fits_int(y))
        maxpool_forward_kernel<T, int><<<elt_blocks(ctx, y->numel), POOL_THREADS, 0, st>>>(
            (const T *)x->data, (T *)y->data, (int *)argmax->data, (int)y->numel, (int)H, (int)W,
            (int)C, (int)y->shape[1], (int)y->shape[2], k, stride, pad);
    else
        maxpool_forward_kernel<T, int64_t><<<elt_blocks(ctx, y->numel), POOL_THREADS, 0, st>>>(
            (const T *)x->data, (T *)y->data, (int *)argmax->data, y->numel, H, W, C, y->shape[1],
            y->shape[2], k, stride, pad);
    SG_CUDA_CHECK_LAUNCH(ctx, "maxpool_forward_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <typename T>
static sg_status maxpool_backward_t(sg_ctx *ctx, const sg_tensor *dy, const sg_tensor *argmax,
                                    int k, int stride, int pad, sg_tensor *dx)
{
    const int64_t H = dx->shape[1], W = dx->shape[2], C = dx->shape[3];
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    if (fits_int(dx) && fits_int(dy))
        maxpool_backward_kernel<T, int><<<elt_blocks(ctx, dx->numel), POOL_THREADS, 0, st>>>(
            (const T *)dy->data, (const int *)argmax->data, (T *)dx->data, (int)dx->numel, (int)H,
            (int)W, (int)C, (int)dy->shape[1], (int)dy->shape[2], k, stride, pad);
    else
        maxpool_backward_kernel<T, int64_t><<<elt_blocks(ctx, dx->numel), POOL_THREADS, 0, st>>>(
            (const T *)dy->data, (const int *)argmax->data, (T *)dx->data, dx->numel, H, W, C,
            dy->shape[1], dy->shape[2], k, stride, pad);
    SG_CUDA_CHECK_LAUNCH(ctx, "maxpool_backward_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* 8 slices per block; 32 (1024 threads) when the (image, tile) blocks are too few to fill the
 * GPU and each has many positions (early, wide layers with few channels). */
template <typename T, bool SCALE_BWD>
static sg_status hw_sum(sg_ctx *ctx, const sg_tensor *img, const sg_tensor *b, const sg_tensor *s,
                        sg_tensor *dx, sg_tensor *out)
{
    const int64_t N = img->shape[0], HW = img->shape[1] * img->shape[2], C = img->shape[3];
    const int64_t tiles = (C + HW_COLS - 1) / HW_COLS;
    dim3 grid((unsigned)tiles, (unsigned)(N < HW_MAX_GRID_Y ? N : HW_MAX_GRID_Y));
    cudaStream_t st = (cudaStream_t)sg_ctx_stream(ctx);
    const T *pa = (const T *)img->data, *pb = b ? (const T *)b->data : nullptr,
            *ps = s ? (const T *)s->data : nullptr;
    T *pdx = dx ? (T *)dx->data : nullptr, *po = (T *)out->data;
    if (tiles * N < 2 * (int64_t)sg_ctx_sm_count(ctx) && HW >= 256)
        hw_sum_kernel<T, SCALE_BWD, 32>
            <<<grid, HW_COLS * 32, 0, st>>>(pa, pb, ps, pdx, po, N, HW, C);
    else
        hw_sum_kernel<T, SCALE_BWD, 8><<<grid, HW_COLS * 8, 0, st>>>(pa, pb, ps, pdx, po, N, HW, C);
    SG_CUDA_CHECK_LAUNCH(ctx, "hw_sum_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

template <typename T, bool SCALE>
static sg_status nc_eltwise(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *v, sg_tensor *out)
{
    const int64_t HW = out->shape[1] * out->shape[2], C = out->shape[3];
    nc_eltwise_kernel<T, SCALE>
        <<<elt_blocks(ctx, out->numel), POOL_THREADS, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(
            x ? (const T *)x->data : nullptr, (const T *)v->data, (T *)out->data, out->numel, HW,
            C);
    SG_CUDA_CHECK_LAUNCH(ctx, "nc_eltwise_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* By the dtype of t (the entry point fn has checked that every float tensor has it). */
#define POOL_DISPATCH(fn, t, call_f32, call_bf16)                                                  \
    switch ((t)->dtype) {                                                                          \
    case SG_DTYPE_F32: return call_f32;                                                            \
    case SG_DTYPE_BF16: return call_bf16;                                                          \
    default:                                                                                       \
        return sg_fail(ctx, SG_ERR_DTYPE, "%s: '%s' is %s; the CUDA kernels take f32 or bf16", fn, \
                       (t)->name, sg_dtype_name((t)->dtype));                                      \
    }

extern "C" sg_status sg_maxpool2d_forward_cuda(sg_ctx *ctx, const sg_tensor *x, int k, int stride,
                                               int pad, sg_tensor *y, sg_tensor *argmax)
{
    POOL_DISPATCH("sg_maxpool2d_forward", x,
                  (maxpool_forward_t<float>(ctx, x, k, stride, pad, y, argmax)),
                  (maxpool_forward_t<__nv_bfloat16>(ctx, x, k, stride, pad, y, argmax)));
}

extern "C" sg_status sg_maxpool2d_backward_cuda(sg_ctx *ctx, const sg_tensor *dy,
                                                const sg_tensor *argmax, int k, int stride, int pad,
                                                sg_tensor *dx)
{
    POOL_DISPATCH("sg_maxpool2d_backward", dy,
                  (maxpool_backward_t<float>(ctx, dy, argmax, k, stride, pad, dx)),
                  (maxpool_backward_t<__nv_bfloat16>(ctx, dy, argmax, k, stride, pad, dx)));
}

extern "C" sg_status sg_avgpool_forward_cuda(sg_ctx *ctx, const sg_tensor *x, sg_tensor *y)
{
    POOL_DISPATCH("sg_avgpool_forward", x,
                  (hw_sum<float, false>(ctx, x, nullptr, nullptr, nullptr, y)),
                  (hw_sum<__nv_bfloat16, false>(ctx, x, nullptr, nullptr, nullptr, y)));
}

extern "C" sg_status sg_avgpool_backward_cuda(sg_ctx *ctx, const sg_tensor *dy, sg_tensor *dx)
{
    POOL_DISPATCH("sg_avgpool_backward", dy, (nc_eltwise<float, false>(ctx, nullptr, dy, dx)),
                  (nc_eltwise<__nv_bfloat16, false>(ctx, nullptr, dy, dx)));
}

extern "C" sg_status sg_channel_scale_forward_cuda(sg_ctx *ctx, const sg_tensor *x,
                                                   const sg_tensor *s, sg_tensor *y)
{
    POOL_DISPATCH("sg_channel_scale_forward", x, (nc_eltwise<float, true>(ctx, x, s, y)),
                  (nc_eltwise<__nv_bfloat16, true>(ctx, x, s, y)));
}

/* One launch: dx is written while ds is summed (a = dy, b = x). */
extern "C" sg_status sg_channel_scale_backward_cuda(sg_ctx *ctx, const sg_tensor *x,
                                                    const sg_tensor *s, const sg_tensor *dy,
                                                    sg_tensor *dx, sg_tensor *ds)
{
    POOL_DISPATCH("sg_channel_scale_backward", x, (hw_sum<float, true>(ctx, dy, x, s, dx, ds)),
                  (hw_sum<__nv_bfloat16, true>(ctx, dy, x, s, dx, ds)));
}
