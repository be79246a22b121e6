/* alloc.c: the caching allocator. Each pool is an arena with free lists by size class;
 * a freed block goes back to its class's list and is handed to the next request of that
 * class, so a training loop that frees and allocates the same shapes stops calling
 * cudaMalloc after its first step. Frees are stream-ordered (one stream per context). */
#include "core/core.h"

#include <stdlib.h>

/* Classes: up to 512 B one class; above, 8 classes per power of two (waste under 12.5%). */
#define SG_MIN_BLOCK 512
#define SG_STEPS_LOG2 3

int sg_alloc_class(size_t bytes)
{
    if (bytes <= SG_MIN_BLOCK) return 0;
    int log2 = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* bytes-1 in [2^l, 2^l+1) */
    size_t base = (size_t)1 << log2;
    size_t step = base >> SG_STEPS_LOG2;
    size_t k = (bytes - 1 - base) / step;   /* 0..7 */
    return 1 + (log2 - 9) * (1 << SG_STEPS_LOG2) + (int)k;
}

size_t sg_alloc_class_size(int cls)
{
    if (cls == 0) return SG_MIN_BLOCK;
    int i = cls - 1;
    int log2 = 9 + i / (1 << SG_STEPS_LOG2);
    size_t base = (size_t)1 << log2;
    size_t step = base >> SG_STEPS_LOG2;
    return base + step * (size_t)(i % (1 << SG_STEPS_LOG2) + 1);
}

static void stats_add_use(sg_alloc_stats *s, size_t n)
{
    s->bytes_in_use += n;
    s->live_blocks++;
    if (s->bytes_in_use > s->peak_bytes_in_use) s->peak_bytes_in_use = s->bytes_in_use;
}

sg_status sg_pool_alloc(sg_pool *pool, size_t bytes, sg_block **out)
{
    sg_ctx *ctx = pool->ctx;
    *out = NULL;
    int cls = sg_alloc_class(bytes ? bytes : 1);
    if (cls >= SG_ALLOC_CLASSES)
        return sg_fail(ctx, SG_ERR_OOM, "sg_tensor_create: %zu bytes is larger than any size class",
                       bytes);
    size_t size = sg_alloc_class_size(cls);
    SG_ASSERT(size >= bytes);

    sg_block *b = pool->free_list[cls];
    if (b) {
        pool->free_list[cls] = b->next_free;
        b->next_free = NULL;
        b->in_use = true;
        pool->st.cache_hits++;
        stats_add_use(&pool->st, size);
        *out = b;
        return SG_OK;
    }

    if (ctx->cap.active) {
        char what[160];
        snprintf(what, sizeof what, "needed %zu bytes of new device memory in pool '%s' that warm-up did not",
                 size, pool->name);
        return sg_capture_forbid(ctx, "sg_tensor_create", what,
                                 "allocate before capture, or run the same allocations in warm-up");
    }
    size_t limit = ctx->opts.alloc_limit_bytes;
    if (limit && ctx->reserved_total + size > limit)
        return sg_fail(ctx, SG_ERR_OOM,
                       "sg_tensor_create: pool '%s': %zu more bytes would pass the context's "
                       "allocation limit of %zu bytes (%zu reserved)",
                       pool->name, size, limit, ctx->reserved_total);
    b = calloc(1, sizeof *b);
    if (!b) return sg_fail(ctx, SG_ERR_OOM, "sg_tensor_create: out of host memory");
    sg_status st = ctx->dev->malloc(ctx, size, &b->ptr);
    if (st != SG_OK) {
        free(b);
        return st;
    }
    b->size = size;
    b->cls = cls;
    b->in_use = true;
    b->next_all = pool->all;
    pool->all = b;
    pool->st.device_allocs++;
    pool->st.bytes_reserved += size;
    ctx->reserved_total += size;
    if (pool->st.bytes_reserved > pool->st.peak_bytes_reserved)
        pool->st.peak_bytes_reserved = pool->st.bytes_reserved;
    stats_add_use(&pool->st, size);
    *out = b;
    return SG_OK;
}

void sg_pool_free(sg_pool *pool, sg_block *b)
{
    SG_ASSERT(b->in_use);
    b->in_use = false;
    b->next_free = pool->free_list[b->cls];
    pool->free_list[b->cls] = b;
    pool->st.bytes_in_use -= b->size;
    pool->st.live_blocks--;
}

/* Gives every free block of the pool back to the device. */
static void pool_release_free(sg_pool *pool)
{
    sg_ctx *ctx = pool->ctx;
    sg_block **link = &pool->all;
    while (*link) {
        sg_block *b = *link;
        if (b->in_use) {
            link = &b->next_all;
            continue;
        }
        *link = b->next_all;
        ctx->dev->free(ctx, b->ptr);
        pool->st.device_frees++;
        pool->st.bytes_reserved -= b->size;
        ctx->reserved_total -= b->size;
        free(b);
    }
    for (int i = 0; i < SG_ALLOC_CLASSES; i++) pool->free_list[i] = NULL;
}

sg_status sg_pool_create(sg_ctx *ctx, const char *name, sg_pool **out)
{
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "sg_pool_create: out is NULL");
    *out = NULL;
    if (!ctx) return SG_ERR_NULL;
    sg_pool *p = calloc(1, sizeof *p);
    if (!p) return sg_fail(ctx, SG_ERR_OOM, "sg_pool_create: out of host memory");
    p->ctx = ctx;
    snprintf(p->name, sizeof p->name, "%s", name ? name : "pool");
    /* Append, so the default pool stays first. */
    sg_pool **link = &ctx->pools;
    while (*link) link = &(*link)->next;
    *link = p;
    *out = p;
    return SG_OK;
}

sg_status sg_pool_destroy(sg_pool *pool)
{
    if (!pool) return SG_OK;
    sg_ctx *ctx = pool->ctx;
    if (pool == ctx->default_pool)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_pool_destroy: the default pool belongs to the context");
    SG_TRY(sg_capture_forbid(ctx, "sg_pool_destroy", "destroyed a pool", "destroy pools after capture"));
    if (pool->st.live_blocks)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_pool_destroy: pool '%s' still holds %llu live tensors; destroy them "
                       "first",
                       pool->name, (unsigned long long)pool->st.live_blocks);
    /* Work queued on the stream may still use the blocks: wait before returning them. */
    SG_TRY(ctx->dev->sync(ctx));
    pool_release_free(pool);
    for (sg_pool **link = &ctx->pools; *link; link = &(*link)->next)
        if (*link == pool) {
            *link = pool->next;
            break;
        }
    if (ctx->cur_pool == pool) ctx->cur_pool = ctx->default_pool;
    free(pool);
    return SG_OK;
}

/* Frees everything of a pool, live or not: the context is going away. */
void sg_pool_release_all(sg_pool *pool)
{
    sg_ctx *ctx = pool->ctx;
    for (sg_block *b = pool->all, *n; b; b = n) {
        n = b->next_all;
        ctx->dev->free(ctx, b->ptr);
        free(b);
    }
    free(pool);
}

sg_status sg_ctx_set_pool(sg_ctx *ctx, sg_pool *pool)
{
    if (!ctx) return SG_ERR_NULL;
    if (pool && pool->ctx != ctx)
        return sg_fail(ctx, SG_ERR_BACKEND, "sg_ctx_set_pool: pool '%s' belongs to another context",
                       pool->name);
    if (ctx->cap.active && (pool ? pool : ctx->default_pool) != ctx->cap.pool)
        return sg_capture_forbid(ctx, "sg_ctx_set_pool", "switched to another pool",
                                 "everything a graph touches comes from its own pool");
    ctx->cur_pool = pool ? pool : ctx->default_pool;
    return SG_OK;
}

sg_status sg_pool_stats(const sg_ctx *ctx, const sg_pool *pool, sg_alloc_stats *out)
{
    if (!ctx || !out) return SG_ERR_NULL;
    *out = (pool ? pool : ctx->default_pool)->st;
    return SG_OK;
}

sg_status sg_ctx_alloc_stats(const sg_ctx *ctx, sg_alloc_stats *out)
{
    if (!ctx || !out) return SG_ERR_NULL;
    memset(out, 0, sizeof *out);
    for (const sg_pool *p = ctx->pools; p; p = p->next) {
        out->bytes_in_use += p->st.bytes_in_use;
        out->bytes_reserved += p->st.bytes_reserved;
        /* Pools peak at different times: the sum bounds the true peak from above. */
        out->peak_bytes_in_use += p->st.peak_bytes_in_use;
        out->peak_bytes_reserved += p->st.peak_bytes_reserved;
        out->device_allocs += p->st.device_allocs;
        out->device_frees += p->st.device_frees;
        out->cache_hits += p->st.cache_hits;
        out->live_blocks += p->st.live_blocks;
    }
    return SG_OK;
}

sg_status sg_ctx_empty_cache(sg_ctx *ctx)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(sg_capture_forbid(ctx, "sg_ctx_empty_cache", "returned cached memory to the device",
                             "empty the cache outside capture"));
    SG_TRY(ctx->dev->sync(ctx));
    for (sg_pool *p = ctx->pools; p; p = p->next) pool_release_free(p);
    return SG_OK;
}

void sg_ctx_print_memory(const sg_ctx *ctx, FILE *f)
{
    if (!ctx || !f) return;
    const double mib = 1024.0 * 1024.0;
    fprintf(f, "%-16s %10s %10s %10s %10s %8s %8s %8s\n", "pool", "in use", "reserved",
            "peak use", "peak res", "allocs", "frees", "hits");
    for (const sg_pool *p = ctx->pools; p; p = p->next)
        fprintf(f, "%-16s %7.2f MiB %6.2f MiB %6.2f MiB %6.2f MiB %8llu %8llu %8llu\n", p->name,
                p->st.bytes_in_use / mib, p->st.bytes_reserved / mib,
                p->st.peak_bytes_in_use / mib, p->st.peak_bytes_reserved / mib,
                (unsigned long long)p->st.device_allocs, (unsigned long long)p->st.device_frees,
                (unsigned long long)p->st.cache_hits);
}
