/* cache.c: the shape-bucket graph cache. Variable shapes (batch, sequence length) are padded
 * up to a few buckets (sg_bucket_for); the cache holds one captured graph per bucket key, all
 * recorded into one shared pool (graphs that replay one after another on the context's stream
 * never run at once, so they may share memory), and destroys least-recently-used graphs while
 * the estimated bytes of the cached graphs exceed a budget.
 *
 * Graphs that sg_graph_cache_get returns stay the cache's: replay them, never destroy them,
 * and do not keep the pointer across gets (a later get may evict the graph). Evicting waits
 * for the evicted graph's replays in flight (a stream sync), so it belongs to a miss, which
 * captures and instantiates anyway. Not thread-safe, as the context it belongs to.
 *
 * Library code never prints. When stats.recapture_warning is set, the caller should say so,
 * e.g. "graph cache re-captured N graphs for K shapes: the budget evicts graphs that are used
 * again; raise it or use fewer buckets" (N = captures - distinct_keys, K = distinct_keys). */
#include "graph/graph.h"

#include <stdint.h>
#include <stdlib.h>

/* With warn_after 0: a few re-captures are normal (a shape seen once, long ago); more mean the
 * budget is too small for the working set of shapes. */
#define SG_CACHE_WARN_AFTER_DEFAULT 8

/* A graph's estimated device bytes: what instantiation measurably took, but at least 1 KiB a
 * node, since the free-memory delta of a small graph often reads 0 (the driver hands out
 * memory in large chunks). */
#define SG_CACHE_BYTES_PER_NODE 1024

typedef struct cache_entry {
    int64_t key;
    sg_graph *g;
    size_t bytes;      /* estimate, fixed at capture */
} cache_entry;

struct sg_graph_cache {
    sg_ctx *ctx;
    sg_pool *pool;         /* every graph's memory: shared, owned by the cache */
    size_t budget;         /* 0: no limit */
    int warn_after;
    cache_entry *e;        /* cached graphs, least recently used first */
    int n, cap;
    int64_t *keys;         /* every key ever captured, sorted ascending (distinct_keys) */
    size_t n_keys, cap_keys;
    sg_graph_cache_stats st;
};

int64_t sg_bucket_for(const int64_t *buckets, int n_buckets, int64_t n)
{
    if (!buckets || n_buckets <= 0 || n <= 0) return -1;
    /* Bucket lists are short (a handful of sizes): a scan for the smallest bucket that holds n
     * costs nothing next to a step, and stays right even if the caller's list is unsorted. */
    int64_t best = -1;
    for (int i = 0; i < n_buckets; i++)
        if (buckets[i] >= n && (best < 0 || buckets[i] < best)) best = buckets[i];
    return best;
}

static size_t graph_bytes(const sg_graph *g)
{
    sg_graph_stats s;
    if (sg_graph_get_stats(g, &s) != SG_OK) return 0;
    size_t per_node = s.nodes > 0 ? (size_t)s.nodes * SG_CACHE_BYTES_PER_NODE : 0;
    return s.exec_bytes > per_node ? s.exec_bytes : per_node;
}

sg_status sg_graph_cache_create(sg_ctx *ctx, size_t budget_bytes, int warn_after,
                                sg_graph_cache **out)
{
    if (out) *out = NULL;
    if (!ctx) return sg_fail(NULL, SG_ERR_NULL, "sg_graph_cache_create: ctx is NULL");
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "sg_graph_cache_create: out is NULL");
    /* No device has 2^63 bytes: a budget that large is a negative number converted to size_t. */
    if (budget_bytes > SIZE_MAX / 2)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_graph_cache_create: budget_bytes %zu is not a plausible size (a negative "
                       "value converted?); expected bytes, or 0 for no limit", budget_bytes);
    if (warn_after < 0)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_graph_cache_create: warn_after %d; expected >= 0 (0: the default, %d)",
                       warn_after, SG_CACHE_WARN_AFTER_DEFAULT);
    sg_graph_cache *c = calloc(1, sizeof *c);
    if (!c) return sg_fail(ctx, SG_ERR_OOM, "sg_graph_cache_create: out of host memory");
    c->ctx = ctx;
    c->budget = budget_bytes;
    c->warn_after = warn_after ? warn_after : SG_CACHE_WARN_AFTER_DEFAULT;
    sg_status st = sg_pool_create(ctx, "graph-cache", &c->pool);
    if (st != SG_OK) {
        free(c);
        return st;
    }
    *out = c;
    return SG_OK;
}

void sg_graph_cache_destroy(sg_graph_cache *c)
{
    if (!c) return;
    for (int i = 0; i < c->n; i++) sg_graph_destroy(c->e[i].g);
    /* Tensors the caller's steps created in the pool (lazily, during warm-up) may still be
     * alive: then the pool cannot go now; it stays with the context, which frees it. */
    if (sg_pool_destroy(c->pool) != SG_OK) { /* nothing to act on in a destructor */ }
    free(c->e);
    free(c->keys);
    free(c);
}

sg_status sg_graph_cache_get_stats(const sg_graph_cache *c, sg_graph_cache_stats *out)
{
    if (!c) return SG_ERR_NULL;
    if (!out) return sg_fail(c->ctx, SG_ERR_NULL, "sg_graph_cache_get_stats: out is NULL");
    *out = c->st;
    for (int i = 0; i < c->n; i++) { /* the held graphs' own figures, summed */
        sg_graph_stats gs;
        if (sg_graph_get_stats(c->e[i].g, &gs) != SG_OK) continue;
        out->nodes += gs.nodes;
        out->replays += gs.replays;
        out->capture_ms += gs.capture_ms;
        out->instantiate_ms += gs.instantiate_ms;
        out->exec_bytes += gs.exec_bytes;
    }
    return SG_OK;
}

sg_pool *sg_graph_cache_pool(const sg_graph_cache *c) { return c ? c->pool : NULL; }

static int find_entry(const sg_graph_cache *c, int64_t key)
{
    for (int i = 0; i < c->n; i++)
        if (c->e[i].key == key) return i;
    return -1;
}

/* Where key is, or would be inserted, in the sorted key list. */
static size_t key_slot(const sg_graph_cache *c, int64_t key)
{
    size_t lo = 0, hi = c->n_keys;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->keys[mid] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Room for one more graph and one more key, taken before capture: once a graph is captured,
 * nothing may fail and leave it unowned. */
static sg_status reserve(sg_graph_cache *c)
{
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        cache_entry *e = realloc(c->e, (size_t)cap * sizeof *e);
        if (!e) return sg_fail(c->ctx, SG_ERR_OOM, "sg_graph_cache_get: out of host memory");
        c->e = e, c->cap = cap;
    }
    if (c->n_keys == c->cap_keys) {
        size_t cap = c->cap_keys ? 2 * c->cap_keys : 16;
        int64_t *k = realloc(c->keys, cap * sizeof *k);
        if (!k) return sg_fail(c->ctx, SG_ERR_OOM, "sg_graph_cache_get: out of host memory");
        c->keys = k, c->cap_keys = cap;
    }
    return SG_OK;
}

/* Destroys least-recently-used graphs, never the newest (the one a get is about to return),
 * while the cached graphs' estimate exceeds the budget. A single graph larger than the budget
 * therefore stays: the step needs it now. */
static void evict(sg_graph_cache *c)
{
    if (!c->budget) return;
    int drop = 0;
    size_t bytes = c->st.bytes;
    while (bytes > c->budget && c->n - drop > 1) {
        sg_graph_destroy(c->e[drop].g); /* waits for its replays in flight */
        bytes -= c->e[drop].bytes;
        drop++;
    }
    if (!drop) return;
    memmove(c->e, c->e + drop, (size_t)(c->n - drop) * sizeof *c->e);
    c->n -= drop;
    c->st.bytes = bytes;
    c->st.cached = c->n;
    c->st.evictions += (uint64_t)drop;
}

/* The captured graph for key: appended as the most recently used, its key recorded. */
static void insert(sg_graph_cache *c, int64_t key, sg_graph *g)
{
    size_t bytes = graph_bytes(g);
    c->e[c->n++] = (cache_entry){key, g, bytes};
    c->st.cached = c->n;
    c->st.bytes += bytes;
    c->st.captures++;
    size_t k = key_slot(c, key);
    if (k == c->n_keys || c->keys[k] != key) {
        memmove(c->keys + k + 1, c->keys + k, (c->n_keys - k) * sizeof *c->keys);
        c->keys[k] = key;
        c->n_keys++;
        c->st.distinct_keys = c->n_keys;
    }
    if (c->st.captures > c->st.distinct_keys + (uint64_t)c->warn_after) c->st.recapture_warning = 1;
}

sg_status sg_graph_cache_get(sg_graph_cache *c, int64_t key, sg_step_fn fn, void *user,
                             const sg_graph_options *opts, sg_graph **out)
{
    if (out) *out = NULL;
    if (!c) return SG_ERR_NULL; /* no context to hold a message */
    sg_ctx *ctx = c->ctx;
    if (!out || !fn)
        return sg_fail(ctx, SG_ERR_NULL, "sg_graph_cache_get: %s is NULL", out ? "fn" : "out");
    if (key < 0)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_graph_cache_get: key %lld; expected >= 0 (sg_bucket_for returns -1 when "
                       "the size exceeds the largest bucket)", (long long)key);

    int i = find_entry(c, key);
    if (i >= 0) {
        /* Most recently used goes last. */
        cache_entry hit = c->e[i];
        memmove(c->e + i, c->e + i + 1, (size_t)(c->n - i - 1) * sizeof *c->e);
        c->e[c->n - 1] = hit;
        c->st.hits++;
        *out = hit.g;
        return SG_OK;
    }

    c->st.misses++;
    SG_TRY(reserve(c));
    /* The caller's options, but the cache's pool; a graph with no name is named by its key. */
    sg_graph_options o = opts ? *opts : sg_graph_options_default();
    o.pool = c->pool;
    char name[48];
    if (!o.name) {
        snprintf(name, sizeof name, "bucket-%lld", (long long)key);
        o.name = name;
    }
    sg_graph *g = NULL;
    sg_status st = sg_graph_capture(ctx, fn, user, &o, &g);
    if (st != SG_OK) {
        char msg[sizeof ctx->msg];
        snprintf(msg, sizeof msg, "%s", ctx->msg);
        return sg_fail(ctx, st, "sg_graph_cache_get: key %lld: %s", (long long)key, msg);
    }
    insert(c, key, g);
    evict(c);
    *out = g;
    return SG_OK;
}
