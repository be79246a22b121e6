/* test_alloc.c: the caching allocator: size classes, reuse of freed blocks, statistics,
 * pools as separate arenas, the allocation limit (failure injection), and no leaks.
 * `cpu` runs it on the CPU backend; `gpu` runs the same checks on CUDA. */
#include "testutil.h"

static void check_classes(void)
{
    size_t prev = 0;
    for (size_t b = 1; b < ((size_t)1 << 34); b = b * 3 / 2 + 1 + tu_randint(0, 7)) {
        int c = sg_alloc_class(b);
        size_t s = sg_alloc_class_size(c);
        TU_CHECK(s >= b, "class %d of %zu bytes holds only %zu", c, b, s);
        TU_CHECK(b <= 512 || s <= b + b / 8 + 1, "class of %zu bytes wastes too much (%zu)", b, s);
        TU_CHECK(s >= prev, "class sizes not monotone at %zu", b);
        if (c > 0) TU_CHECK(sg_alloc_class_size(c - 1) < b, "%zu bytes could use a smaller class", b);
        prev = s;
    }
}

static void check_reuse(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    sg_alloc_stats s0, s1, s2;
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &s0));
    /* A "training step": allocate and free the same shapes several times. */
    int64_t shapes[6];
    for (int i = 0; i < 6; i++) shapes[i] = tu_randint(1, 1 << 16);
    for (int step = 0; step < 5; step++) {
        sg_tensor *t[6];
        for (int i = 0; i < 6; i++) t[i] = tu_tensor1(ctx, SG_DTYPE_F32, shapes[i], "t");
        if (step == 0) TU_OK(ctx, sg_ctx_alloc_stats(ctx, &s1));
        for (int i = 0; i < 6; i++) sg_tensor_destroy(t[i]);
    }
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &s2));
    TU_CHECK(s1.device_allocs - s0.device_allocs <= 6, "first step made %llu allocations",
             (unsigned long long)(s1.device_allocs - s0.device_allocs));
    TU_CHECK(s2.device_allocs == s1.device_allocs, "steps 2..5 made %llu device allocations",
             (unsigned long long)(s2.device_allocs - s1.device_allocs));
    TU_CHECK(s2.cache_hits - s1.cache_hits >= 24, "expected >= 24 cache hits, got %llu",
             (unsigned long long)(s2.cache_hits - s1.cache_hits));
    TU_CHECK(s2.bytes_in_use == s0.bytes_in_use, "bytes in use %zu after freeing all, was %zu",
             s2.bytes_in_use, s0.bytes_in_use);
    TU_CHECK(s2.live_blocks == s0.live_blocks, "live blocks leaked");
    TU_CHECK(s2.peak_bytes_in_use >= s1.bytes_in_use, "peak below a past in-use value");
    TU_CHECK(s2.bytes_reserved >= s2.peak_bytes_in_use - s0.bytes_in_use, "reserved below peak");

    /* empty_cache returns every free block. */
    TU_OK(ctx, sg_ctx_empty_cache(ctx));
    sg_alloc_stats s3;
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &s3));
    TU_CHECK(s3.bytes_reserved == s3.bytes_in_use, "after empty_cache %zu reserved, %zu in use",
             s3.bytes_reserved, s3.bytes_in_use);
    TU_CHECK(s3.device_frees == s3.device_allocs - s3.live_blocks,
             "frees %llu, allocs %llu, live %llu", (unsigned long long)s3.device_frees,
             (unsigned long long)s3.device_allocs, (unsigned long long)s3.live_blocks);

    /* Data survives in reused blocks: write, free, reallocate, write again, read back. */
    sg_tensor *t = tu_tensor1(ctx, SG_DTYPE_F32, 1000, "data");
    double *v = tu_random(t, -1, 1), *back = tu_get(t);
    for (int i = 0; i < 1000; i++) v[i] = (float)v[i]; /* stored as f32: exact after rounding */
    tu_close("round trip", back, v, 1000, (tu_tol){0, 0});
    free(v), free(back);
    sg_tensor_destroy(t);
    sg_ctx_destroy(ctx);
}

static void check_pools(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    sg_pool *p;
    TU_OK(ctx, sg_pool_create(ctx, "graph0", &p));
    TU_OK(ctx, sg_ctx_set_pool(ctx, p));
    sg_tensor *a = tu_tensor1(ctx, SG_DTYPE_F32, 4096, "a");
    TU_OK(ctx, sg_ctx_set_pool(ctx, NULL));
    sg_alloc_stats ps, ds;
    TU_OK(ctx, sg_pool_stats(ctx, p, &ps));
    TU_OK(ctx, sg_pool_stats(ctx, NULL, &ds));
    TU_CHECK(ps.live_blocks == 1 && ps.bytes_in_use >= 4096 * 4, "pool holds %llu blocks",
             (unsigned long long)ps.live_blocks);
    /* A block freed into one pool is not handed to another. */
    sg_tensor_destroy(a);
    sg_tensor *b = tu_tensor1(ctx, SG_DTYPE_F32, 4096, "b");
    sg_alloc_stats ds2;
    TU_OK(ctx, sg_pool_stats(ctx, NULL, &ds2));
    TU_CHECK(ds2.device_allocs == ds.device_allocs + 1, "default pool reused another pool's block");
    /* A pool with live tensors is not destroyed. */
    TU_OK(ctx, sg_ctx_set_pool(ctx, p));
    sg_tensor *c = tu_tensor1(ctx, SG_DTYPE_F32, 10, "c");
    TU_FAILS(ctx, sg_pool_destroy(p), SG_ERR_INVALID, "live tensors");
    sg_tensor_destroy(c);
    TU_OK(ctx, sg_pool_destroy(p));
    TU_CHECK(ctx->cur_pool == ctx->default_pool, "destroyed pool still current");
    TU_FAILS(ctx, sg_pool_destroy(ctx->default_pool), SG_ERR_INVALID, "default pool");
    sg_tensor_destroy(b);
    sg_ctx_destroy(ctx);
}

static void check_limit(sg_backend be)
{
    sg_ctx_options o = sg_ctx_options_default();
    o.backend = be;
    o.alloc_limit_bytes = 1 << 20;
    sg_ctx *ctx;
    TU_OK(NULL, sg_ctx_create(&o, &ctx));
    sg_tensor *t = NULL;
    int64_t n = 1 << 19; /* 2 MiB of f32 */
    TU_FAILS(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 1, &n, "big", &t), SG_ERR_OOM, "allocation limit");
    TU_CHECK(t == NULL, "out set on failure");
    /* The context is still usable. */
    sg_tensor *s = tu_tensor1(ctx, SG_DTYPE_F32, 100, "small");
    double *v = tu_random(s, 0, 1);
    free(v);
    sg_tensor_destroy(s);
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_alloc");
    sg_backend be = strcmp(mode, "gpu") ? SG_BACKEND_CPU : SG_BACKEND_CUDA;
    if (be == SG_BACKEND_CPU) check_classes();
    check_reuse(be);
    check_pools(be);
    check_limit(be);
    return tu_finish("test_alloc");
}
