/* dataset_cuda.cu: the batch gather a captured step loads its own inputs with (the batch index
 * read from device memory; rows back to back are copied as one block, rows that wrap around
 * the end of the data set one by one), and the feed of host batches: pinned staging, a copy
 * stream, and events so that the copy of batch i+1 overlaps the step of batch i. */
#include "nn/dataset.h"

#include <cuda_runtime.h>
#include <stdlib.h>

/* x_out (rows, xr) and y_out (rows, yr) from samples (idx*stride + offset + r) mod n: 4-byte
 * elements (f32 or i32 alike). */
__global__ void gather_rows_kernel(const uint32_t *__restrict__ xs, const uint32_t *__restrict__ ys,
                                   uint32_t *__restrict__ xo, uint32_t *__restrict__ yo,
                                   const int32_t *__restrict__ idx, int64_t n, int64_t stride, int64_t offset,
                                   int64_t rows, int64_t xr, int64_t yr)
{
    int64_t i = ((int64_t)*idx % n + n) % n;
    int64_t s0 = (i * (stride % n) % n + offset % n) % n;
    int64_t tid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    int64_t nx = rows * xr, ny = rows * yr;
    if (s0 + rows <= n) {
        const uint32_t *src = xs + s0 * xr;
        bool vec = nx % 4 == 0 && ((uintptr_t)src | (uintptr_t)xo) % 16 == 0;
        if (vec)
            for (int64_t e = tid; e < nx / 4; e += step)
                reinterpret_cast<uint4 *>(xo)[e] = reinterpret_cast<const uint4 *>(src)[e];
        else
            for (int64_t e = tid; e < nx; e += step) xo[e] = src[e];
        for (int64_t e = tid; e < ny; e += step) yo[e] = ys[s0 * yr + e];
        return;
    }
    for (int64_t e = tid; e < nx; e += step) {
        int64_t r = e / xr, s = (s0 + r) % n;
        xo[e] = xs[s * xr + e % xr];
    }
    for (int64_t e = tid; e < ny; e += step) {
        int64_t r = e / yr, s = (s0 + r) % n;
        yo[e] = ys[s * yr + e % yr];
    }
}

extern "C" sg_status sg_dataset_gather_cuda(sg_dataset *d, const sg_tensor *idx, int64_t stride, int64_t offset,
                                            sg_tensor *x_out, sg_tensor *y_out)
{
    int64_t rows = x_out->numel / d->x_row, nx = x_out->numel;
    int threads = 256;
    int64_t want = (nx / 4 + threads - 1) / threads;
    int64_t cap = (int64_t)sg_ctx_sm_count(d->ctx) * 4;
    int blocks = (int)(want < 1 ? 1 : want < cap ? want : cap);
    gather_rows_kernel<<<blocks, threads, 0, (cudaStream_t)sg_ctx_stream(d->ctx)>>>(
        (const uint32_t *)d->x->data, (const uint32_t *)d->y->data, (uint32_t *)x_out->data,
        (uint32_t *)y_out->data, (const int32_t *)idx->data, d->n, stride, offset, rows, d->x_row, d->y_row);
    SG_CUDA_CHECK_LAUNCH(d->ctx, "gather_rows_kernel");
    sg_ctx_count_launches(d->ctx, 1);
    return SG_OK;
}

/* Padding of a variable batch drawn on the device: each thread draws rows and the bucket (a
 * few multiplies), then pads its share of rows..Tb-1; thread 0 writes the bucket. */
__global__ void pad_vary_kernel(const int32_t *__restrict__ step, sg_text_buckets bk, int64_t xr, int64_t yr,
                                uint32_t *__restrict__ x, uint32_t *__restrict__ y, uint32_t y_pad,
                                int32_t *__restrict__ bucket_out)
{
    int64_t rows = sg_text_vary_len(*step, bk.size[bk.n - 1]);
    int k = sg_text_bucket_of(&bk, rows);
    int64_t tb = bk.size[k];
    int64_t tid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = rows * xr + tid; e < tb * xr; e += stride) x[e] = 0;
    for (int64_t e = rows * yr + tid; e < tb * yr; e += stride) y[e] = y_pad;
    if (tid == 0) *bucket_out = k;
}

extern "C" sg_status sg_dataset_pad_vary_cuda(sg_ctx *ctx, const int32_t *step, sg_text_buckets bk, int64_t x_row,
                                              int64_t y_row, uint32_t *x, uint32_t *y, uint32_t y_pad,
                                              int32_t *bucket_out)
{
    int threads = 256;
    int64_t want = (bk.size[bk.n - 1] * x_row + threads - 1) / threads;
    int64_t cap = (int64_t)sg_ctx_sm_count(ctx) * 4;
    int blocks = (int)(want < 1 ? 1 : want < cap ? want : cap);
    pad_vary_kernel<<<blocks, threads, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>(step, bk, x_row, y_row, x, y, y_pad,
                                                                             bucket_out);
    SG_CUDA_CHECK_LAUNCH(ctx, "pad_vary_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

__global__ void index_advance_kernel(int32_t *idx) { *idx += 1; }

/* The end of a captured step: the next replay gathers the next batch. */
extern "C" sg_status sg_index_advance_cuda(sg_ctx *ctx, sg_tensor *idx)
{
    index_advance_kernel<<<1, 1, 0, (cudaStream_t)sg_ctx_stream(ctx)>>>((int32_t *)idx->data);
    SG_CUDA_CHECK_LAUNCH(ctx, "index_advance_kernel");
    sg_ctx_count_launches(ctx, 1);
    return SG_OK;
}

/* ---- the feed ---- */

typedef struct feed_state {
    cudaStream_t copy;            /* the copies run here, beside the context's stream */
    cudaEvent_t filled[2];        /* slot s's copy is done (recorded on copy) */
    cudaEvent_t freed[2];         /* the work that read slot s is done (recorded on the stream) */
    bool filled_rec[2], freed_rec[2];
    void *stage_x[2], *stage_y[2];/* pinned staging, a pair a slot */
} feed_state;

extern "C" void sg_feed_cuda_destroy(sg_ctx *ctx, void *p)
{
    feed_state *f = (feed_state *)p;
    if (!f) return;
    (void)ctx;
    if (f->copy) (void)cudaStreamSynchronize(f->copy); /* staging may be in flight */
    for (int s = 0; s < 2; s++) {
        if (f->filled[s]) (void)cudaEventDestroy(f->filled[s]);
        if (f->freed[s]) (void)cudaEventDestroy(f->freed[s]);
        if (f->stage_x[s]) (void)cudaFreeHost(f->stage_x[s]);
        if (f->stage_y[s]) (void)cudaFreeHost(f->stage_y[s]);
    }
    if (f->copy) (void)cudaStreamDestroy(f->copy);
    free(f);
}

extern "C" sg_status sg_feed_cuda_create(sg_ctx *ctx, size_t x_bytes, size_t y_bytes, void **out)
{
    *out = NULL;
    feed_state *f = (feed_state *)calloc(1, sizeof *f);
    if (!f) return sg_fail(ctx, SG_ERR_OOM, "sg_dataset_create_fed: out of host memory");
    sg_status st = SG_OK;
#define FEED_CHECK(call)                                                                            \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess && st == SG_OK)                                                      \
            st = sg_fail(ctx, SG_ERR_CUDA, "sg_dataset_create_fed: %s: %s", #call, cudaGetErrorString(e_)); \
    } while (0)
    FEED_CHECK(cudaStreamCreateWithFlags(&f->copy, cudaStreamNonBlocking));
    for (int s = 0; s < 2 && st == SG_OK; s++) {
        FEED_CHECK(cudaEventCreateWithFlags(&f->filled[s], cudaEventDisableTiming));
        FEED_CHECK(cudaEventCreateWithFlags(&f->freed[s], cudaEventDisableTiming));
        FEED_CHECK(cudaMallocHost(&f->stage_x[s], x_bytes));
        FEED_CHECK(cudaMallocHost(&f->stage_y[s], y_bytes));
    }
#undef FEED_CHECK
    if (st != SG_OK) {
        sg_feed_cuda_destroy(ctx, f);
        return st;
    }
    *out = f;
    return SG_OK;
}

#define FEED_TRY(call, what)                                                                        \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return sg_fail(ctx, SG_ERR_CUDA, "sg_dataset_feed: %s: %s", what, cudaGetErrorString(e_)); \
    } while (0)

/* Host -> staging (after the slot's previous copy left it), then staging -> the device slot on
 * the copy stream, after the work that read the slot last is done. */
extern "C" sg_status sg_feed_cuda_copy(sg_ctx *ctx, void *p, int slot, const void *x, size_t xb, const void *y,
                                       size_t yb, void *dst_x, void *dst_y)
{
    feed_state *f = (feed_state *)p;
    if (f->filled_rec[slot]) FEED_TRY(cudaEventSynchronize(f->filled[slot]), "waiting for the staging buffer");
    memcpy(f->stage_x[slot], x, xb);
    memcpy(f->stage_y[slot], y, yb);
    if (f->freed_rec[slot]) FEED_TRY(cudaStreamWaitEvent(f->copy, f->freed[slot], 0), "cudaStreamWaitEvent");
    FEED_TRY(cudaMemcpyAsync(dst_x, f->stage_x[slot], xb, cudaMemcpyHostToDevice, f->copy), "cudaMemcpyAsync x");
    FEED_TRY(cudaMemcpyAsync(dst_y, f->stage_y[slot], yb, cudaMemcpyHostToDevice, f->copy), "cudaMemcpyAsync y");
    FEED_TRY(cudaEventRecord(f->filled[slot], f->copy), "cudaEventRecord");
    f->filled_rec[slot] = true;
    return SG_OK;
}

/* Before the step that reads `slot`: the stream waits for its copy; the other slot is free
 * once the work queued so far (the step before, which read it) is done. */
extern "C" sg_status sg_feed_cuda_begin(sg_ctx *ctx, void *p, int slot, int free_slot)
{
    feed_state *f = (feed_state *)p;
    cudaStream_t s = (cudaStream_t)sg_ctx_stream(ctx);
    FEED_TRY(cudaEventRecord(f->freed[free_slot], s), "cudaEventRecord");
    f->freed_rec[free_slot] = true;
    FEED_TRY(cudaStreamWaitEvent(s, f->filled[slot], 0), "cudaStreamWaitEvent");
    return SG_OK;
}
