/* device_cpu.c: the CPU backend's device table. "Device" memory is 64-byte aligned host
 * memory, copies are memcpy, and every queued operation has finished when it returns. */
#include "core/core.h"

#include <stdlib.h>
#include <unistd.h>

static sg_status cpu_init(sg_ctx *ctx)
{
    snprintf(ctx->device_name, sizeof ctx->device_name, "CPU (reference backend)");
    return SG_OK;
}

static void cpu_shutdown(sg_ctx *ctx) { (void)ctx; }

static sg_status cpu_malloc(sg_ctx *ctx, size_t bytes, void **out)
{
    /* aligned_alloc wants a multiple of the alignment; size classes are multiples of 64. */
    *out = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!*out) return sg_fail(ctx, SG_ERR_OOM, "sg_tensor_create: host allocation of %zu bytes failed", bytes);
    return SG_OK;
}

static void cpu_free(sg_ctx *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static sg_status cpu_copy(sg_ctx *ctx, void *dst, const void *src, size_t n)
{
    (void)ctx;
    memmove(dst, src, n);
    return SG_OK;
}

typedef struct copy_args {
    void *dst;
    const void *src;
    size_t n;
} copy_args;

static sg_status copy_thunk(sg_ctx *ctx, const void *a)
{
    const copy_args *c = a;
    memmove(c->dst, c->src, c->n);
    return SG_OK;
}

/* Device-to-device copies are queued work: recorded during a CPU capture. */
static sg_status cpu_copy_d2d(sg_ctx *ctx, void *dst, const void *src, size_t n)
{
    return sg_cpu_run(ctx, copy_thunk, &(copy_args){dst, src, n}, sizeof(copy_args));
}

static sg_status cpu_ok(sg_ctx *ctx)
{
    (void)ctx;
    return SG_OK;
}

static sg_status cpu_event_create(sg_ctx *ctx, void **ev)
{
    (void)ctx;
    *ev = NULL;
    return SG_OK;
}

static void cpu_event_destroy(sg_ctx *ctx, void *ev) { (void)ctx; (void)ev; }

static sg_status cpu_event_op(sg_ctx *ctx, void *ev)
{
    (void)ctx;
    (void)ev;
    return SG_OK;
}

/* Host RAM: MemAvailable and MemTotal of /proc/meminfo (sysconf where it is missing). */
static sg_status cpu_mem_info(sg_ctx *ctx, size_t *free_bytes, size_t *total_bytes)
{
    (void)ctx;
    unsigned long long avail = 0, total = 0, v;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &v) == 1) avail = v * 1024ull;
        else if (sscanf(line, "MemTotal: %llu kB", &v) == 1) total = v * 1024ull;
    }
    if (f) fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    if (!total && page > 0) total = (unsigned long long)sysconf(_SC_PHYS_PAGES) * (unsigned long long)page;
    if (!avail && page > 0) avail = (unsigned long long)sysconf(_SC_AVPHYS_PAGES) * (unsigned long long)page;
    *free_bytes = (size_t)avail, *total_bytes = (size_t)total;
    return SG_OK;
}

const sg_device_i sg_device_cpu = {
    .name = "cpu",
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .malloc = cpu_malloc,
    .free = cpu_free,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2h_async = cpu_copy,
    .copy_d2d = cpu_copy_d2d,
    .sync = cpu_ok,
    .host_alloc = cpu_malloc,
    .host_free = cpu_free,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_op,
    .event_query = cpu_event_op,
    .event_sync = cpu_event_op,
    .mem_info = cpu_mem_info,
};

/* Getters of CUDA state: NULL on the CPU backend (defined here so CPU builds link). */
#ifndef SG_HAVE_CUDA
void *sg_ctx_stream(const sg_ctx *ctx) { (void)ctx; return NULL; }
void *sg_ctx_cublaslt(const sg_ctx *ctx) { (void)ctx; return NULL; }
void *sg_ctx_workspace(const sg_ctx *ctx, size_t *bytes) { (void)ctx; if (bytes) *bytes = 0; return NULL; }
int sg_ctx_sm_count(const sg_ctx *ctx) { (void)ctx; return 0; }
bool sg_ctx_pdl(const sg_ctx *ctx) { (void)ctx; return false; }
bool sg_ctx_tf32(const sg_ctx *ctx) { (void)ctx; return false; }
int sg_ctx_gemm_tune(const sg_ctx *ctx) { (void)ctx; return 0; }
void *sg_ctx_side_stream(const sg_ctx *ctx) { (void)ctx; return NULL; }
void *sg_ctx_side_workspace(const sg_ctx *ctx) { (void)ctx; return NULL; }
sg_status sg_ctx_side_fork(sg_ctx *ctx) { (void)ctx; return SG_OK; }
sg_status sg_ctx_side_join(sg_ctx *ctx) { (void)ctx; return SG_OK; }
bool sg_ctx_side_use(const sg_ctx *ctx) { (void)ctx; return false; }
bool sg_ctx_side_deferred(const sg_ctx *ctx) { (void)ctx; return false; }
void sg_ctx_side_enter(sg_ctx *ctx) { (void)ctx; }
sg_status sg_ctx_side_leave(sg_ctx *ctx) { (void)ctx; return SG_OK; }
unsigned sg_ctx_side_busy(const sg_ctx *ctx) { (void)ctx; return 0; }
void sg_ctx_side_mark(sg_ctx *ctx, unsigned bits) { (void)ctx, (void)bits; }
int sg_cuda_last_error(void) { return 0; }
sg_status sg_cuda_status(const sg_ctx *ctx, int err, const char *call, const char *file, int line)
{
    return sg_fail(ctx, SG_ERR_CUDA, "%s failed (%d) at %s:%d", call, err, file, line);
}
sg_status sg_cublas_status(const sg_ctx *ctx, int err, const char *call, const char *file, int line)
{
    return sg_fail(ctx, SG_ERR_CUBLAS, "%s failed (%d) at %s:%d", call, err, file, line);
}
#endif
