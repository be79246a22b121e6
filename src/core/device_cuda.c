/* device_cuda.c: the CUDA backend's device table: one non-blocking stream per context, a
 * cuBLASLt handle with one fixed workspace, cudaMalloc'd blocks, pinned read-back buffers
 * and events. Compiled only when the build has CUDA. */
#include "core/core.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

typedef struct sg_cuda_state {
    int device;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    int sm_count;
    bool pdl; /* programmatic dependent launch: sm_90 and later, unless SG_PDL=0 */
    bool lt_bgrad;      /* STEPGRAPH_BGRAD=1: cuBLASLt's bias-gradient epilogues (linear_cuda.cu) */
    bool node_priority; /* graphs keep captured kernel priorities, unless STEPGRAPH_NODE_PRIORITY=0 */
    bool tf32;          /* f32 matmuls in TF32: sg_ctx_options.tf32 or STEPGRAPH_TF32=1 */
    int gemm_tune;      /* matmul candidates timed (0: none): sg_ctx_options.gemm_tune or STEPGRAPH_GEMM_TUNE */
    cudaStream_t side;  /* unless STEPGRAPH_WGRAD=off: the second stream, its workspace, fork and join */
    void *side_workspace;
    cudaEvent_t fork, join;
    bool side_defer;    /* defer (the default): inside a region, joined when it ends; side: by each op */
    bool side_pending;  /* work queued there since the last join */
    unsigned side_busy; /* SG_SIDE_* bits of that work */
    int side_depth;     /* module backwards entered (sg_ctx_side_enter) and not left */
} sg_cuda_state;

static sg_cuda_state *state(const sg_ctx *ctx) { return (sg_cuda_state *)ctx->cuda; }

int sg_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

int sg_cuda_last_error(void) { return (int)cudaGetLastError(); }

sg_status sg_cuda_status(const sg_ctx *ctx, int err, const char *call, const char *file, int line)
{
    return sg_fail(ctx, SG_ERR_CUDA, "%s failed: %s (%s) at %s:%d", call,
                   cudaGetErrorName((cudaError_t)err), cudaGetErrorString((cudaError_t)err), file,
                   line);
}

sg_status sg_cublas_status(const sg_ctx *ctx, int err, const char *call, const char *file, int line)
{
    return sg_fail(ctx, SG_ERR_CUBLAS, "%s failed: cuBLAS status %d at %s:%d", call, err, file,
                   line);
}

void *sg_ctx_stream(const sg_ctx *ctx) { return ctx->cuda ? (void *)state(ctx)->stream : NULL; }
void *sg_ctx_cublaslt(const sg_ctx *ctx) { return ctx->cuda ? (void *)state(ctx)->lt : NULL; }
int sg_ctx_sm_count(const sg_ctx *ctx) { return ctx->cuda ? state(ctx)->sm_count : 0; }
bool sg_ctx_pdl(const sg_ctx *ctx) { return ctx->cuda && state(ctx)->pdl; }
bool sg_ctx_lt_bgrad(const sg_ctx *ctx) { return ctx->cuda && state(ctx)->lt_bgrad; }
bool sg_ctx_node_priority(const sg_ctx *ctx) { return ctx->cuda && state(ctx)->node_priority; }
bool sg_ctx_tf32(const sg_ctx *ctx) { return ctx->cuda && state(ctx)->tf32; }
int sg_ctx_gemm_tune(const sg_ctx *ctx) { return ctx->cuda ? state(ctx)->gemm_tune : 0; }

void *sg_ctx_side_stream(const sg_ctx *ctx) { return ctx->cuda ? (void *)state(ctx)->side : NULL; }
void *sg_ctx_side_workspace(const sg_ctx *ctx) { return ctx->cuda ? state(ctx)->side_workspace : NULL; }

sg_status sg_ctx_side_fork(sg_ctx *ctx)
{
    sg_cuda_state *s = state(ctx);
    SG_CUDA_CHECK(ctx, cudaEventRecord(s->fork, s->stream));
    SG_CUDA_CHECK(ctx, cudaStreamWaitEvent(s->side, s->fork, 0));
    s->side_pending = true;
    return SG_OK;
}

sg_status sg_ctx_side_join(sg_ctx *ctx)
{
    sg_cuda_state *s = ctx->cuda ? state(ctx) : NULL;
    if (!s || !s->side_pending) return SG_OK;
    s->side_pending = false;
    s->side_busy = 0;
    SG_CUDA_CHECK(ctx, cudaEventRecord(s->join, s->side));
    SG_CUDA_CHECK(ctx, cudaStreamWaitEvent(s->stream, s->join, 0));
    return SG_OK;
}

bool sg_ctx_side_use(const sg_ctx *ctx)
{
    return ctx->cuda && state(ctx)->side && (!state(ctx)->side_defer || state(ctx)->side_depth > 0);
}

bool sg_ctx_side_deferred(const sg_ctx *ctx)
{
    return ctx->cuda && state(ctx)->side && state(ctx)->side_defer && state(ctx)->side_depth > 0;
}

unsigned sg_ctx_side_busy(const sg_ctx *ctx) { return ctx->cuda ? state(ctx)->side_busy : 0; }
void sg_ctx_side_mark(sg_ctx *ctx, unsigned bits)
{
    if (ctx->cuda) state(ctx)->side_busy |= bits;
}

void sg_ctx_side_enter(sg_ctx *ctx)
{
    if (ctx->cuda) state(ctx)->side_depth++;
}

sg_status sg_ctx_side_leave(sg_ctx *ctx)
{
    if (!ctx->cuda) return SG_OK;
    state(ctx)->side_depth--;
    return sg_ctx_side_join(ctx);
}

void *sg_ctx_workspace(const sg_ctx *ctx, size_t *bytes)
{
    if (!ctx->cuda) {
        if (bytes) *bytes = 0;
        return NULL;
    }
    if (bytes) *bytes = state(ctx)->workspace_bytes;
    return state(ctx)->workspace;
}

static void cuda_shutdown(sg_ctx *ctx)
{
    sg_cuda_state *s = state(ctx);
    if (!s) return;
    /* Teardown: errors here cannot be acted on; each call is still made and checked. */
    if (s->stream && cudaStreamSynchronize(s->stream) != cudaSuccess) cudaGetLastError();
    if (s->side && cudaStreamSynchronize(s->side) != cudaSuccess) cudaGetLastError();
    if (s->workspace && cudaFree(s->workspace) != cudaSuccess) cudaGetLastError();
    if (s->side_workspace && cudaFree(s->side_workspace) != cudaSuccess) cudaGetLastError();
    if (s->fork && cudaEventDestroy(s->fork) != cudaSuccess) cudaGetLastError();
    if (s->join && cudaEventDestroy(s->join) != cudaSuccess) cudaGetLastError();
    if (s->side && cudaStreamDestroy(s->side) != cudaSuccess) cudaGetLastError();
    if (s->lt) cublasLtDestroy(s->lt);
    if (s->stream && cudaStreamDestroy(s->stream) != cudaSuccess) cudaGetLastError();
    free(s);
    ctx->cuda = NULL;
}

static sg_status cuda_init(sg_ctx *ctx)
{
    int n = sg_cuda_device_count();
    if (n <= 0)
        return sg_fail(ctx, SG_ERR_NO_DEVICE,
                       "sg_ctx_create: the CUDA backend was asked for, but no CUDA device is "
                       "visible (cudaGetDeviceCount found none)");
    if (ctx->opts.device < 0 || ctx->opts.device >= n)
        return sg_fail(ctx, SG_ERR_NO_DEVICE, "sg_ctx_create: device %d asked for, %d visible",
                       ctx->opts.device, n);
    /* The second stream (sg_ctx_side_use): defer unless the environment says otherwise. */
    const char *wgrad = getenv("STEPGRAPH_WGRAD");
    if (!wgrad || !*wgrad) wgrad = "defer";
    if (strcmp(wgrad, "off") && strcmp(wgrad, "side") && strcmp(wgrad, "defer"))
        return sg_fail(ctx, SG_ERR_INVALID, "sg_ctx_create: STEPGRAPH_WGRAD is '%.40s'; expected off, side or defer",
                       wgrad);
    const char *tf32 = getenv("STEPGRAPH_TF32");
    if (tf32 && *tf32 && strcmp(tf32, "0") && strcmp(tf32, "1"))
        return sg_fail(ctx, SG_ERR_INVALID, "sg_ctx_create: STEPGRAPH_TF32 is '%.40s'; expected 0 or 1", tf32);
    /* STEPGRAPH_GEMM_TUNE: 0 or 1 to 16, as sg_ctx_options.gemm_tune (1: up to 16). */
    const char *tune = getenv("STEPGRAPH_GEMM_TUNE");
    int tune_n = 0;
    if (tune && *tune) {
        char *end = NULL;
        const long v = strtol(tune, &end, 10);
        if (*end || v < 0 || v > SG_GEMM_TUNE_MAX)
            return sg_fail(ctx, SG_ERR_INVALID, "sg_ctx_create: STEPGRAPH_GEMM_TUNE is '%.40s'; " SG_GEMM_TUNE_RANGE,
                           tune);
        tune_n = (int)v;
    }
    sg_cuda_state *s = calloc(1, sizeof *s);
    if (!s) return sg_fail(ctx, SG_ERR_OOM, "sg_ctx_create: out of host memory");
    ctx->cuda = s;
    s->device = ctx->opts.device;
    sg_status st = SG_OK;
#define INIT_CHECK(call)                                                                      \
    do {                                                                                      \
        int e_ = (int)(call);                                                                 \
        if (e_ != 0) {                                                                        \
            st = sg_cuda_status(ctx, e_, #call, __FILE__, __LINE__);                          \
            goto fail;                                                                        \
        }                                                                                     \
    } while (0)
    INIT_CHECK(cudaSetDevice(s->device));
    struct cudaDeviceProp prop;
    INIT_CHECK(cudaGetDeviceProperties(&prop, s->device));
    s->sm_count = prop.multiProcessorCount;
    const char *pdl = getenv("SG_PDL");
    s->pdl = prop.major >= 9 && !(pdl && !strcmp(pdl, "0"));
    const char *bgrad = getenv("STEPGRAPH_BGRAD"), *prio = getenv("STEPGRAPH_NODE_PRIORITY");
    s->lt_bgrad = bgrad && !strcmp(bgrad, "1");
    s->node_priority = !(prio && !strcmp(prio, "0"));
    s->tf32 = ctx->opts.tf32 || (tf32 && !strcmp(tf32, "1"));
    s->gemm_tune = ctx->opts.gemm_tune ? ctx->opts.gemm_tune : tune_n; /* the option wins */
    if (s->gemm_tune == 1) s->gemm_tune = SG_GEMM_TUNE_MAX;
    snprintf(ctx->device_name, sizeof ctx->device_name, "%s (sm_%d%d, %d SMs)", prop.name,
             prop.major, prop.minor, prop.multiProcessorCount);
    INIT_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    s->workspace_bytes = ctx->opts.workspace_bytes;
    if (s->workspace_bytes) INIT_CHECK(cudaMalloc(&s->workspace, s->workspace_bytes));
    if (strcmp(wgrad, "off")) {
        s->side_defer = !strcmp(wgrad, "defer");
        INIT_CHECK(cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking));
        INIT_CHECK(cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming));
        INIT_CHECK(cudaEventCreateWithFlags(&s->join, cudaEventDisableTiming));
        if (s->workspace_bytes) INIT_CHECK(cudaMalloc(&s->side_workspace, s->workspace_bytes));
    }
    {
        cublasStatus_t cs = cublasLtCreate(&s->lt);
        if (cs != CUBLAS_STATUS_SUCCESS) {
            st = sg_cublas_status(ctx, (int)cs, "cublasLtCreate(&lt)", __FILE__, __LINE__);
            goto fail;
        }
    }
#undef INIT_CHECK
    return SG_OK;
fail:
    cuda_shutdown(ctx);
    return st;
}

static sg_status cuda_malloc(sg_ctx *ctx, size_t bytes, void **out)
{
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return sg_fail(ctx, SG_ERR_OOM, "sg_tensor_create: cudaMalloc(%zu bytes) failed: %s", bytes,
                       cudaGetErrorString(e));
    }
    return SG_OK;
}

static void cuda_free(sg_ctx *ctx, void *p)
{
    (void)ctx;
    if (cudaFree(p) != cudaSuccess) cudaGetLastError();
}

static sg_status cuda_copy_h2d(sg_ctx *ctx, void *dst, const void *src, size_t n)
{
    SG_CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, state(ctx)->stream));
    return SG_OK;
}

static sg_status cuda_copy_d2h(sg_ctx *ctx, void *dst, const void *src, size_t n)
{
    SG_CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, state(ctx)->stream));
    SG_CUDA_CHECK(ctx, cudaStreamSynchronize(state(ctx)->stream));
    return SG_OK;
}

static sg_status cuda_copy_d2h_async(sg_ctx *ctx, void *dst, const void *src, size_t n)
{
    SG_CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, state(ctx)->stream));
    return SG_OK;
}

static sg_status cuda_copy_d2d(sg_ctx *ctx, void *dst, const void *src, size_t n)
{
    SG_CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, state(ctx)->stream));
    return SG_OK;
}

static sg_status cuda_sync(sg_ctx *ctx)
{
    SG_CUDA_CHECK(ctx, cudaStreamSynchronize(state(ctx)->stream));
    return SG_OK;
}

static sg_status cuda_host_alloc(sg_ctx *ctx, size_t bytes, void **out)
{
    SG_CUDA_CHECK(ctx, cudaMallocHost(out, bytes));
    return SG_OK;
}

static void cuda_host_free(sg_ctx *ctx, void *p)
{
    (void)ctx;
    if (cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
}

static sg_status cuda_event_create(sg_ctx *ctx, void **ev)
{
    SG_CUDA_CHECK(ctx, cudaEventCreateWithFlags((cudaEvent_t *)ev, cudaEventDisableTiming));
    return SG_OK;
}

static void cuda_event_destroy(sg_ctx *ctx, void *ev)
{
    (void)ctx;
    if (ev && cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess) cudaGetLastError();
}

static sg_status cuda_event_record(sg_ctx *ctx, void *ev)
{
    SG_CUDA_CHECK(ctx, cudaEventRecord((cudaEvent_t)ev, state(ctx)->stream));
    return SG_OK;
}

static sg_status cuda_event_query(sg_ctx *ctx, void *ev)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return SG_ERR_NOT_READY;
    }
    SG_CUDA_CHECK(ctx, e);
    return SG_OK;
}

static sg_status cuda_event_sync(sg_ctx *ctx, void *ev)
{
    SG_CUDA_CHECK(ctx, cudaEventSynchronize((cudaEvent_t)ev));
    return SG_OK;
}

static sg_status cuda_mem_info(sg_ctx *ctx, size_t *free_bytes, size_t *total_bytes)
{
    SG_CUDA_CHECK(ctx, cudaMemGetInfo(free_bytes, total_bytes));
    return SG_OK;
}

const sg_device_i sg_device_cuda = {
    .name = "cuda",
    .init = cuda_init,
    .shutdown = cuda_shutdown,
    .malloc = cuda_malloc,
    .free = cuda_free,
    .copy_h2d = cuda_copy_h2d,
    .copy_d2h = cuda_copy_d2h,
    .copy_d2h_async = cuda_copy_d2h_async,
    .copy_d2d = cuda_copy_d2d,
    .sync = cuda_sync,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .mem_info = cuda_mem_info,
};
