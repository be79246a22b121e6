/* ctx.c: the context. Picks a backend (CUDA when a GPU is usable, else the CPU reference),
 * owns the default pool, the error message, the launch counter, the ops' scratch buffers and
 * caches (by slot), and the tensor hook an upper layer observes destruction through. Backend
 * specifics sit behind the sg_device_i table (device_cpu.c, device_cuda.c). */
#include "core/core.h"

#include <stdlib.h>

void sg_pool_release_all(sg_pool *pool);

sg_ctx_options sg_ctx_options_default(void)
{
    sg_ctx_options o;
    memset(&o, 0, sizeof o);
    o.backend = SG_BACKEND_AUTO;
    o.device = 0;
    o.workspace_bytes = (size_t)32 << 20; /* cuBLASLt: 32 MiB covers Hopper's kernels */
    return o;
}

const char *sg_backend_name(sg_backend b)
{
    switch (b) {
    case SG_BACKEND_AUTO: return "auto";
    case SG_BACKEND_CPU: return "cpu";
    case SG_BACKEND_CUDA: return "cuda";
    }
    return "?";
}

#ifdef SG_HAVE_CUDA
int sg_cuda_device_count(void); /* device_cuda.c */
#endif

int sg_cuda_available(void)
{
#ifdef SG_HAVE_CUDA
    return sg_cuda_device_count() > 0;
#else
    return 0;
#endif
}

sg_status sg_ctx_create(const sg_ctx_options *opts, sg_ctx **out)
{
    if (!out) return sg_fail(NULL, SG_ERR_NULL, "sg_ctx_create: out is NULL");
    *out = NULL;
    sg_ctx_options o = opts ? *opts : sg_ctx_options_default();
    sg_backend b = o.backend;
    if (b == SG_BACKEND_AUTO) b = sg_cuda_available() ? SG_BACKEND_CUDA : SG_BACKEND_CPU;
    if (b != SG_BACKEND_CPU && b != SG_BACKEND_CUDA)
        return sg_fail(NULL, SG_ERR_INVALID, "sg_ctx_create: unknown backend %d", (int)o.backend);
    if (o.gemm_tune < 0 || o.gemm_tune > SG_GEMM_TUNE_MAX)
        return sg_fail(NULL, SG_ERR_INVALID, "sg_ctx_create: gemm_tune is %d; " SG_GEMM_TUNE_RANGE, o.gemm_tune);
    if (o.gemm_tune && b == SG_BACKEND_CPU)
        return sg_fail(NULL, SG_ERR_INVALID, "sg_ctx_create: gemm_tune is for CUDA contexts (the CPU backend has "
                       "no matmul algorithms to choose)");
    if (o.tf32 && b == SG_BACKEND_CPU)
        return sg_fail(NULL, SG_ERR_INVALID, "sg_ctx_create: tf32 is for CUDA contexts (the CPU backend computes "
                       "in double)");
#ifndef SG_HAVE_CUDA
    if (b == SG_BACKEND_CUDA)
        return sg_fail(NULL, SG_ERR_NO_DEVICE,
                       "sg_ctx_create: the CUDA backend was asked for, but this build has no "
                       "CUDA (nvcc was not found when it was configured)");
#endif
    sg_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return sg_fail(NULL, SG_ERR_OOM, "sg_ctx_create: out of host memory");
    ctx->backend = b;
    ctx->opts = o;
#ifdef SG_HAVE_CUDA
    ctx->dev = b == SG_BACKEND_CUDA ? &sg_device_cuda : &sg_device_cpu;
#else
    ctx->dev = &sg_device_cpu;
#endif
    sg_status st = ctx->dev->init(ctx);
    if (st != SG_OK) {
        sg_fail(NULL, st, "%s", ctx->msg);
        free(ctx);
        return st;
    }
    st = sg_pool_create(ctx, "default", &ctx->default_pool);
    if (st != SG_OK) {
        ctx->dev->shutdown(ctx);
        sg_fail(NULL, st, "%s", ctx->msg);
        free(ctx);
        return st;
    }
    ctx->cur_pool = ctx->default_pool;
    *out = ctx;
    return SG_OK;
}

void sg_ctx_destroy(sg_ctx *ctx)
{
    if (!ctx) return;
    ctx->dev->sync(ctx);
    for (int i = 0; i < SG_EXT_COUNT; i++)
        if (ctx->ext[i] && ctx->ext_free[i]) ctx->ext_free[i](ctx, ctx->ext[i]);
    for (int i = 0; i < SG_SLOT_COUNT; i++) sg_tensor_destroy(ctx->scratch[i]);
    for (sg_pool *p = ctx->pools, *n; p; p = n) {
        n = p->next;
        sg_pool_release_all(p);
    }
    ctx->dev->shutdown(ctx);
    free(ctx);
}

sg_backend sg_ctx_backend(const sg_ctx *ctx) { return ctx ? ctx->backend : SG_BACKEND_AUTO; }
const char *sg_ctx_device_name(const sg_ctx *ctx) { return ctx ? ctx->device_name : ""; }
uint64_t sg_ctx_launch_count(const sg_ctx *ctx) { return ctx ? ctx->launches : 0; }

sg_status sg_ctx_side_end(sg_ctx *ctx, bool side, sg_status st)
{
    if (!side || (st == SG_OK && sg_ctx_side_deferred(ctx))) return st;
    sg_status j = sg_ctx_side_join(ctx);
    return st == SG_OK ? j : st;
}

void sg_ctx_work(const sg_ctx *ctx, sg_work *out)
{
    if (!out) return;
    if (ctx) *out = ctx->work;
    else memset(out, 0, sizeof *out);
}

const char *sg_work_family_name(sg_work_family f)
{
    static const char *const names[SG_WORK_FAMILIES] = {"matmul", "attention", "conv", "norm", "elementwise",
                                                        "loss", "optimizer"};
    return f >= 0 && f < SG_WORK_FAMILIES ? names[f] : "?";
}

double sg_tensors_bytes(const sg_tensor *a, const sg_tensor *b, const sg_tensor *c, const sg_tensor *d,
                        const sg_tensor *e, const sg_tensor *f, const sg_tensor *g, const sg_tensor *h)
{
    const sg_tensor *ts[8] = {a, b, c, d, e, f, g, h};
    double n = 0;
    for (int i = 0; i < 8; i++)
        if (ts[i]) n += (double)sg_tensor_nbytes(ts[i]);
    return n;
}

sg_status sg_ctx_mem_info(sg_ctx *ctx, size_t *free_bytes, size_t *total_bytes)
{
    if (!ctx) return SG_ERR_NULL;
    if (!free_bytes || !total_bytes) return sg_fail(ctx, SG_ERR_NULL, "sg_ctx_mem_info: an output is NULL");
    SG_TRY(ctx->dev->mem_info(ctx, free_bytes, total_bytes));
    /* Blocks the caching allocator holds free are free to this context too; a limit caps both. */
    sg_alloc_stats st;
    if (sg_ctx_alloc_stats(ctx, &st) == SG_OK && st.bytes_reserved > st.bytes_in_use)
        *free_bytes += st.bytes_reserved - st.bytes_in_use;
    if (ctx->opts.alloc_limit_bytes) {
        size_t room = ctx->opts.alloc_limit_bytes > st.bytes_in_use ? ctx->opts.alloc_limit_bytes - st.bytes_in_use : 0;
        if (room < *free_bytes) *free_bytes = room;
        if (ctx->opts.alloc_limit_bytes < *total_bytes) *total_bytes = ctx->opts.alloc_limit_bytes;
    }
    return SG_OK;
}

sg_status sg_ctx_sync(sg_ctx *ctx)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_capture_forbid(ctx, "sg_ctx_sync", "waited for the device",
                             "a captured step may not synchronize; sync after replay"));
    return ctx->dev->sync(ctx);
}

sg_status sg_ctx_scratch(sg_ctx *ctx, sg_scratch_slot slot, size_t bytes, void **out)
{
    SG_ASSERT((int)slot >= 0 && slot < SG_SLOT_COUNT);
    sg_tensor *t = ctx->scratch[slot];
    if (!t || sg_tensor_nbytes(t) < bytes) {
        sg_tensor_destroy(t);
        ctx->scratch[slot] = NULL;
        int64_t n = (int64_t)((bytes + 3) / 4);
        sg_pool *keep = ctx->cur_pool;
        ctx->cur_pool = ctx->default_pool; /* scratch outlives any graph's pool */
        sg_status st = sg_tensor_create(ctx, SG_DTYPE_I32, 1, &n, "scratch", &t);
        ctx->cur_pool = keep;
        SG_TRY(st);
        ctx->scratch[slot] = t;
        SG_TRY(sg_tensor_fill(t, 0.0));
    }
    *out = t->data;
    return SG_OK;
}

void sg_ctx_set_ext(sg_ctx *ctx, sg_ext_slot slot, void *ext,
                    void (*free_fn)(sg_ctx *ctx, void *ext))
{
    SG_ASSERT((int)slot >= 0 && slot < SG_EXT_COUNT);
    ctx->ext[slot] = ext;
    ctx->ext_free[slot] = free_fn;
}

void sg_ctx_set_tensor_hook(sg_ctx *ctx, sg_tensor_hook_fn fn, void *user)
{
    /* One observer: a second would silently replace the first. */
    SG_ASSERT(!fn || !ctx->tensor_hook || ctx->tensor_hook == fn);
    ctx->tensor_hook = fn;
    ctx->tensor_user = fn ? user : NULL;
}
