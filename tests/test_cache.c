/* test_cache.c: the shape-bucket graph cache: sg_bucket_for against a brute-force scan; a
 * step y(b,N) = relu(x(b,K) w(N,K)^T) replayed for random batch sizes padded up to buckets
 * {8,16,32} and checked against eager runs on the unpadded rows; eviction under a budget,
 * re-capture warnings, LRU order, the shared pool, and errors. `cpu` runs it on the CPU
 * backend; `gpu` runs the same checks on CUDA. */
#include "testutil.h"

#include "graph/graph.h"

#define K 24          /* in features */
#define N 40          /* out features */
#define N_BUCKETS 3
static const int64_t BUCKETS[N_BUCKETS] = {8, 16, 32};

/* ---- sg_bucket_for ---- */

/* The smallest bucket >= n in a sorted list, by the definition: first one that holds n. */
static int64_t brute_bucket(const int64_t *b, int nb, int64_t n)
{
    if (!b || nb <= 0 || n <= 0) return -1;
    for (int i = 0; i < nb; i++)
        if (b[i] >= n) return b[i];
    return -1;
}

static void check_bucket_for(void)
{
    static const struct { int64_t n, want; } known[] = {
        {1, 8}, {7, 8}, {8, 8}, {9, 16}, {16, 16}, {17, 32}, {31, 32}, {32, 32}, {33, -1},
        {1000, -1}, {INT64_MAX, -1}, {0, -1}, {-1, -1}, {INT64_MIN, -1},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        int64_t got = sg_bucket_for(BUCKETS, N_BUCKETS, known[i].n);
        TU_CHECK(got == known[i].want, "sg_bucket_for({8,16,32}, %lld) = %lld, expected %lld",
                 (long long)known[i].n, (long long)got, (long long)known[i].want);
    }
    TU_CHECK(sg_bucket_for(NULL, 3, 4) == -1, "NULL buckets");
    TU_CHECK(sg_bucket_for(BUCKETS, 0, 4) == -1, "no buckets");
    TU_CHECK(sg_bucket_for(BUCKETS, -2, 4) == -1, "negative bucket count");
    int64_t one = 5;
    TU_CHECK(sg_bucket_for(&one, 1, 5) == 5 && sg_bucket_for(&one, 1, 6) == -1, "one bucket");

    /* Random sorted lists (duplicates allowed) and sizes on both sides of every bucket. */
    for (int trial = 0; trial < 2000; trial++) {
        int nb = tu_randint(1, 20);
        int64_t b[20];
        int64_t v = tu_randint(1, 50);
        for (int i = 0; i < nb; i++) {
            b[i] = v;
            v += tu_randint(0, 200);
        }
        int64_t n = tu_randint(-3, (int)b[nb - 1] + 10);
        int64_t got = sg_bucket_for(b, nb, n), want = brute_bucket(b, nb, n);
        TU_CHECK(got == want, "trial %d: %d buckets %lld..%lld, n %lld: got %lld, expected %lld",
                 trial, nb, (long long)b[0], (long long)b[nb - 1], (long long)n, (long long)got,
                 (long long)want);
    }
}

/* ---- the step: one per bucket (or per key), with its own static tensors ---- */

typedef struct step {
    sg_ctx *ctx;
    int64_t b;            /* rows: the bucket */
    sg_tensor *x;         /* (b, K) static input: real rows, then zero rows */
    const sg_tensor *w;   /* (N, K), shared by every step */
    sg_tensor *h;         /* (b, N) pre-activation: created by the first (warm-up) call, so it
                             comes from the pool the graph is captured in */
    sg_tensor *y;         /* (b, N) */
    sg_pool *h_pool;      /* the pool h came from */
} step;

static sg_status step_fn(void *user)
{
    step *s = user;
    if (!s->h) {
        int64_t shape[2] = {s->b, N};
        SG_TRY(sg_tensor_create(s->ctx, SG_DTYPE_F32, 2, shape, "h", &s->h));
        s->h_pool = s->h->pool;
    }
    SG_TRY(sg_linear_forward(s->ctx, s->x, s->w, NULL, SG_ACT_NONE, s->h, NULL));
    return sg_relu_forward(s->ctx, s->h, s->y);
}

/* Fails every time: in warm-up already. */
static sg_status fail_fn(void *user)
{
    step *s = user;
    return sg_fail(s->ctx, SG_ERR_INVALID, "test step: failing on purpose");
}

/* Runs eagerly, fails only while being captured. */
static sg_status fail_in_capture_fn(void *user)
{
    step *s = user;
    SG_TRY(step_fn(s));
    if (sg_ctx_capturing(s->ctx))
        return sg_fail(s->ctx, SG_ERR_SHAPE, "test step: refusing to be captured");
    return SG_OK;
}

/* Syncs inside the step and ignores the status: the capture must fail all the same. */
static sg_status sync_fn(void *user)
{
    step *s = user;
    SG_TRY(step_fn(s));
    (void)sg_ctx_sync(s->ctx);
    return SG_OK;
}

/* The step, then 40 more in-place ReLUs: a graph of many small nodes. */
static sg_status deep_fn(void *user)
{
    step *s = user;
    SG_TRY(step_fn(s));
    for (int i = 0; i < 40; i++) SG_TRY(sg_relu_forward(s->ctx, s->y, s->y));
    return SG_OK;
}

typedef struct env {
    sg_backend be;
    sg_ctx *ctx;
    sg_tensor *w;
    step s[4];
    int n_steps;
} env;

static env env_create(sg_backend be, const int64_t *rows, int n_steps)
{
    env e;
    memset(&e, 0, sizeof e);
    e.be = be;
    e.ctx = tu_ctx(be);
    e.w = tu_tensor2(e.ctx, SG_DTYPE_F32, N, K, "w");
    free(tu_random(e.w, -0.5, 0.5));
    e.n_steps = n_steps;
    for (int i = 0; i < n_steps; i++) {
        step *s = &e.s[i];
        s->ctx = e.ctx;
        s->b = rows[i];
        s->w = e.w;
        s->x = tu_tensor2(e.ctx, SG_DTYPE_F32, rows[i], K, "x");
        s->y = tu_tensor2(e.ctx, SG_DTYPE_F32, rows[i], N, "y");
    }
    return e;
}

/* Destroys the test's tensors (h included, wherever it lives), then the context. */
static void env_destroy(env *e)
{
    for (int i = 0; i < e->n_steps; i++) {
        sg_tensor_destroy(e->s[i].x);
        sg_tensor_destroy(e->s[i].h);
        sg_tensor_destroy(e->s[i].y);
    }
    sg_tensor_destroy(e->w);
    sg_ctx_destroy(e->ctx);
}

static step *step_for(env *e, int64_t b)
{
    for (int i = 0; i < e->n_steps; i++)
        if (e->s[i].b == b) return &e->s[i];
    return NULL;
}

/* The CPU reference computes each row on its own in a fixed order: padding cannot move a bit.
 * cuBLASLt may pick another kernel for b rows than for n (another summation order over K in
 * f32), so the GPU gets the GEMM rule of test_linear.c: atol scaled by sqrt(K). */
static tu_tol rows_tol(sg_backend be)
{
    if (be == SG_BACKEND_CPU) return (tu_tol){0, 0};
    tu_tol t = tu_tol_for(SG_DTYPE_F32);
    t.atol *= sqrt((double)K);
    return t;
}

/* n random rows (host, n*K floats), copied into s->x followed by b - n zero rows. */
static float *fill_input(step *s, int n)
{
    float *xh = calloc((size_t)(s->b * K), sizeof *xh);
    for (int i = 0; i < n * K; i++) xh[i] = (float)tu_uniform(-1, 1);
    TU_OK(s->ctx, sg_tensor_copy_from_host(s->x, xh, (size_t)(s->b * K) * sizeof *xh));
    return xh;
}

/* Replays g (s's graph) on the input xh of n real rows and compares y's first n rows with an
 * eager run of the same ops on just those rows; the padding rows (zeros, no bias) must give 0. */
static void replay_and_check(env *e, step *s, sg_graph *g, int n, const float *xh, const char *what)
{
    sg_ctx *ctx = e->ctx;
    tu_poison(s->y); /* a replay that wrote nothing fails the comparison */
    TU_OK(ctx, sg_graph_replay(g));
    sg_tensor *xr = tu_tensor2(ctx, SG_DTYPE_F32, n, K, "x_ref");
    sg_tensor *hr = tu_tensor2(ctx, SG_DTYPE_F32, n, N, "h_ref");
    sg_tensor *yr = tu_tensor2(ctx, SG_DTYPE_F32, n, N, "y_ref");
    TU_OK(ctx, sg_tensor_copy_from_host(xr, xh, (size_t)(n * K) * sizeof *xh));
    TU_OK(ctx, sg_linear_forward(ctx, xr, e->w, NULL, SG_ACT_NONE, hr, NULL));
    TU_OK(ctx, sg_relu_forward(ctx, hr, yr));
    double *got = tu_get(s->y), *ref = tu_get(yr);
    char label[128];
    snprintf(label, sizeof label, "%s: bucket %lld, %d real rows vs eager", what, (long long)s->b, n);
    tu_close(label, got, ref, (int64_t)n * N, rows_tol(e->be));
    int64_t bad = 0;
    for (int64_t i = (int64_t)n * N; i < s->b * N; i++) bad += got[i] != 0.0;
    TU_CHECK(bad == 0, "%s: %lld padding outputs are not 0", label, (long long)bad);
    free(got), free(ref);
    sg_tensor_destroy(xr), sg_tensor_destroy(hr), sg_tensor_destroy(yr);
}

/* One batch of n rows through the bucket cache: pad, get the bucket's graph, replay, check. */
static sg_graph *run_batch(env *e, sg_graph_cache *c, int n, const char *what)
{
    int64_t b = sg_bucket_for(BUCKETS, N_BUCKETS, n);
    step *s = step_for(e, b);
    TU_CHECK(s != NULL, "no bucket for %d rows (got %lld)", n, (long long)b);
    if (!s) return NULL;
    float *xh = fill_input(s, n);
    sg_graph_options o = sg_graph_options_default();
    const sg_tensor *inputs[1] = {s->x};
    o.static_inputs = inputs, o.n_static_inputs = 1;
    sg_graph *g = NULL;
    TU_OK(e->ctx, sg_graph_cache_get(c, b, step_fn, s, &o, &g));
    replay_and_check(e, s, g, n, xh, what);
    free(xh);
    return g;
}

static size_t estimate(const sg_graph *g)
{
    sg_graph_stats s;
    if (sg_graph_get_stats(g, &s) != SG_OK) return 0;
    size_t per_node = s.nodes > 0 ? (size_t)s.nodes * 1024 : 0;
    return s.exec_bytes > per_node ? s.exec_bytes : per_node;
}

static sg_graph_cache_stats stats_of(sg_ctx *ctx, const sg_graph_cache *c)
{
    sg_graph_cache_stats st;
    TU_OK(ctx, sg_graph_cache_get_stats(c, &st));
    return st;
}

/* What a cache may leave behind once destroyed, measured so that the test's own eager
 * tensors (freed into the default pool's cache) and scratch buffers do not count: live blocks
 * other than scratch, bytes in use, and bytes reserved by pools other than the default. */
typedef struct footprint {
    uint64_t live_blocks;
    size_t in_use, reserved_elsewhere;
} footprint;

static footprint footprint_of(sg_ctx *ctx)
{
    sg_alloc_stats all, def;
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &all));
    TU_OK(ctx, sg_pool_stats(ctx, NULL, &def));
    footprint f = {all.live_blocks, all.bytes_in_use, all.bytes_reserved - def.bytes_reserved};
    for (int i = 0; i < SG_SLOT_COUNT; i++)
        if (ctx->scratch[i]) {
            f.live_blocks--;
            f.in_use -= ctx->scratch[i]->block->size;
        }
    return f;
}

static int count_pools(const sg_ctx *ctx)
{
    int n = 0;
    for (const sg_pool *p = ctx->pools; p; p = p->next) n++;
    return n;
}

/* ---- buckets without a budget: one capture per bucket, every graph in one pool ---- */

static void check_buckets(sg_backend be)
{
    env e = env_create(be, BUCKETS, N_BUCKETS);
    sg_ctx *ctx = e.ctx;
    footprint base = footprint_of(ctx);
    int pools0 = count_pools(ctx);

    sg_graph_cache *c = NULL;
    TU_OK(ctx, sg_graph_cache_create(ctx, 0, 0, &c));
    /* 60 random sizes in 1..32, with the edges of every bucket at random places. */
    int sizes[60], pos[60];
    for (int i = 0; i < 60; i++) sizes[i] = tu_randint(1, 32), pos[i] = i;
    for (int i = 59; i > 0; i--) { /* shuffle positions: the edges land on 6 distinct ones */
        int j = tu_randint(0, i), t = pos[i];
        pos[i] = pos[j], pos[j] = t;
    }
    static const int edges[] = {1, 8, 9, 16, 17, 32};
    for (int i = 0; i < 6; i++) sizes[pos[i]] = edges[i];
    sg_pool *pool = NULL;
    sg_graph *by_bucket[N_BUCKETS] = {NULL};
    for (int i = 0; i < 60; i++) {
        sg_graph *g = run_batch(&e, c, sizes[i], "buckets");
        if (!g) continue;
        if (!pool) pool = sg_graph_pool(g);
        TU_CHECK(sg_graph_pool(g) == pool, "batch %d: graph of another pool", i);
        int bi = (int)(step_for(&e, sg_bucket_for(BUCKETS, N_BUCKETS, sizes[i])) - e.s);
        if (!by_bucket[bi]) by_bucket[bi] = g;
        TU_CHECK(by_bucket[bi] == g, "batch %d (%d rows): a second graph for bucket %lld", i,
                 sizes[i], (long long)BUCKETS[bi]);
    }
    sg_graph_cache_stats st = stats_of(ctx, c);
    TU_CHECK(st.captures == 3 && st.misses == 3, "captures %llu, misses %llu; expected 3 (one per bucket)",
             (unsigned long long)st.captures, (unsigned long long)st.misses);
    TU_CHECK(st.hits + st.misses == 60, "hits %llu + misses %llu != 60", (unsigned long long)st.hits,
             (unsigned long long)st.misses);
    TU_CHECK(st.cached == 3 && st.evictions == 0 && st.distinct_keys == 3,
             "cached %d, evictions %llu, distinct keys %llu", st.cached,
             (unsigned long long)st.evictions, (unsigned long long)st.distinct_keys);
    TU_CHECK(!st.recapture_warning, "warning without re-captures");
    size_t sum = 0;
    for (int i = 0; i < N_BUCKETS; i++) sum += by_bucket[i] ? estimate(by_bucket[i]) : 0;
    TU_CHECK(st.bytes == sum && sum > 0, "bytes %zu, the graphs' estimates sum to %zu", st.bytes, sum);

    /* The shared pool: the cache's own, holding exactly the three h tensors the steps made. */
    TU_CHECK(pool && pool != ctx->default_pool && !strcmp(pool->name, "graph-cache"),
             "graphs' pool is '%s'", pool ? pool->name : "(none)");
    for (int i = 0; i < N_BUCKETS; i++)
        TU_CHECK(e.s[i].h_pool == pool, "bucket %lld: h came from pool '%s'", (long long)e.s[i].b,
                 e.s[i].h_pool ? e.s[i].h_pool->name : "(none)");
    sg_alloc_stats ps;
    TU_OK(ctx, sg_pool_stats(ctx, pool, &ps));
    TU_CHECK(ps.live_blocks == 3, "the cache's pool holds %llu live blocks, expected 3",
             (unsigned long long)ps.live_blocks);

    /* The test's tensors of the pool go first; then the cache takes every graph and its pool
     * with it: the context is back where it was before the cache. */
    for (int i = 0; i < N_BUCKETS; i++) {
        sg_tensor_destroy(e.s[i].h);
        e.s[i].h = NULL;
    }
    sg_graph_cache_destroy(c);
    footprint after = footprint_of(ctx);
    TU_CHECK(after.live_blocks == base.live_blocks && after.in_use == base.in_use,
             "after destroy: %llu live blocks (%zu bytes), before the cache %llu (%zu bytes)",
             (unsigned long long)after.live_blocks, after.in_use,
             (unsigned long long)base.live_blocks, base.in_use);
    TU_CHECK(after.reserved_elsewhere == base.reserved_elsewhere,
             "after destroy %zu bytes reserved outside the default pool, before the cache %zu: "
             "the cache's pool was not released", after.reserved_elsewhere, base.reserved_elsewhere);
    TU_CHECK(count_pools(ctx) == pools0, "%d pools after destroy, %d before", count_pools(ctx), pools0);
    TU_CHECK(sg_graphs_of(ctx) == NULL, "graphs left on the context after destroy");
    env_destroy(&e);
}

/* ---- a budget of 1 byte: only the newest graph stays ---- */

static void check_eviction(sg_backend be)
{
    env e = env_create(be, BUCKETS, N_BUCKETS);
    sg_ctx *ctx = e.ctx;
    int pools0 = count_pools(ctx);
    sg_graph_cache *c = NULL;
    const int warn_after = 2;
    TU_OK(ctx, sg_graph_cache_create(ctx, 1, warn_after, &c));
    int gets = 0;
    for (int round = 0; round < 10; round++)
        for (int bi = 0; bi < N_BUCKETS; bi++) {
            /* A size inside bucket bi: the last bucket's graph is the only one cached, so
             * every get misses, re-captures, and evicts the one before. */
            int lo = bi ? (int)BUCKETS[bi - 1] + 1 : 1, hi = (int)BUCKETS[bi];
            run_batch(&e, c, tu_randint(lo, hi), "eviction");
            gets++;
            sg_graph_cache_stats st = stats_of(ctx, c);
            TU_CHECK(st.cached == 1, "get %d: %d graphs cached under a 1-byte budget", gets, st.cached);
            TU_CHECK(st.misses == (uint64_t)gets && st.captures == (uint64_t)gets && st.hits == 0,
                     "get %d: misses %llu, captures %llu, hits %llu", gets,
                     (unsigned long long)st.misses, (unsigned long long)st.captures,
                     (unsigned long long)st.hits);
            TU_CHECK(st.evictions == (uint64_t)gets - 1, "get %d: %llu evictions", gets,
                     (unsigned long long)st.evictions);
            TU_CHECK(st.distinct_keys == (uint64_t)(gets < 3 ? gets : 3), "get %d: %llu distinct keys",
                     gets, (unsigned long long)st.distinct_keys);
            /* Set once captures pass distinct keys + warn_after, and it stays set. */
            int want = gets > 3 + warn_after;
            TU_CHECK(st.recapture_warning == want, "get %d (captures %llu, keys %llu): warning %d",
                     gets, (unsigned long long)st.captures, (unsigned long long)st.distinct_keys,
                     st.recapture_warning);
        }
    sg_graph_cache_stats st = stats_of(ctx, c);
    if (st.recapture_warning) /* as a caller would print it */
        printf("note (expected here): graph cache re-captured %llu graphs for %llu shapes: the "
               "budget evicts graphs that are used again; raise it or use fewer buckets\n",
               (unsigned long long)(st.captures - st.distinct_keys),
               (unsigned long long)st.distinct_keys);
    /* Destroyed while the steps' h tensors still live in its pool: the pool stays with the
     * context (freed with it), and those tensors can still be destroyed afterwards. */
    sg_graph_cache_destroy(c);
    TU_CHECK(count_pools(ctx) == pools0 + 1, "%d pools, expected the cache's left with the context (%d)",
             count_pools(ctx), pools0 + 1);
    TU_CHECK(sg_graphs_of(ctx) == NULL, "graphs left on the context after destroy");
    env_destroy(&e);
}

/* ---- LRU order, against a model of the policy ----
 * The budget fits exactly two graphs of the first one's estimate. On the CPU every graph here
 * has the same estimate (the same plan), so A, B, A, C must evict B. On the GPU exec_bytes is a
 * free-memory delta and may differ between graphs; the model below (evict the least recently
 * used, never the newest, while the sum exceeds the budget) then says what must happen. */

typedef struct model {
    int64_t key[8];
    sg_graph *g[8];
    size_t bytes[8];
    int n;
    size_t budget, total;
    uint64_t hits, misses, evictions;
    size_t one;           /* the probe graph's estimate */
    bool uniform;         /* every graph captured so far had that estimate */
} model;

static void lru_get(env *e, sg_graph_cache *c, model *m, int64_t key, step *s, const char *what)
{
    float *xh = fill_input(s, (int)s->b);
    int at = -1;
    for (int i = 0; i < m->n; i++)
        if (m->key[i] == key) at = i;
    sg_graph *g = NULL;
    sg_graph_options o = sg_graph_options_default();
    o.warmup = 1;
    TU_OK(e->ctx, sg_graph_cache_get(c, key, step_fn, s, &o, &g));
    if (at >= 0) {
        TU_CHECK(g == m->g[at], "%s: key %lld hit another graph", what, (long long)key);
        int64_t k = m->key[at];
        size_t b = m->bytes[at];
        for (int i = at; i < m->n - 1; i++)
            m->key[i] = m->key[i + 1], m->g[i] = m->g[i + 1], m->bytes[i] = m->bytes[i + 1];
        m->key[m->n - 1] = k, m->g[m->n - 1] = g, m->bytes[m->n - 1] = b;
        m->hits++;
    } else {
        m->key[m->n] = key, m->g[m->n] = g, m->bytes[m->n] = estimate(g);
        m->uniform &= m->bytes[m->n] == m->one;
        m->total += m->bytes[m->n++];
        m->misses++;
        while (m->total > m->budget && m->n > 1) {
            m->total -= m->bytes[0];
            for (int i = 0; i < m->n - 1; i++)
                m->key[i] = m->key[i + 1], m->g[i] = m->g[i + 1], m->bytes[i] = m->bytes[i + 1];
            m->n--;
            m->evictions++;
        }
    }
    sg_graph_cache_stats st = stats_of(e->ctx, c);
    TU_CHECK(st.hits == m->hits && st.misses == m->misses && st.evictions == m->evictions &&
                 st.cached == m->n && st.bytes == m->total,
             "%s: hits %llu misses %llu evictions %llu cached %d bytes %zu; the LRU model says "
             "%llu %llu %llu %d %zu", what, (unsigned long long)st.hits,
             (unsigned long long)st.misses, (unsigned long long)st.evictions, st.cached, st.bytes,
             (unsigned long long)m->hits, (unsigned long long)m->misses,
             (unsigned long long)m->evictions, m->n, m->total);
    replay_and_check(e, s, g, (int)s->b, xh, what);
    free(xh);
}

static void check_lru(sg_backend be)
{
    /* Three keys of one shape, each with its own tensors, so a wrong graph shows in y. */
    static const int64_t rows[3] = {8, 8, 8};
    env e = env_create(be, rows, 3);
    sg_ctx *ctx = e.ctx;
    enum { A = 100, B = 7, C = 42 }; /* keys: any non-negative integers */

    /* The first graph's estimate, from a probe cache without a budget. */
    sg_graph_cache *probe = NULL;
    sg_graph *g = NULL;
    TU_OK(ctx, sg_graph_cache_create(ctx, 0, 0, &probe));
    TU_OK(ctx, sg_graph_cache_get(probe, A, step_fn, &e.s[0], NULL, &g));
    size_t one = stats_of(ctx, probe).bytes;
    TU_CHECK(one > 0 && one == estimate(g), "probe: %zu bytes, the graph's estimate %zu", one, estimate(g));
    /* h was made in the probe's pool: let the real cache's warm-up make it again in its own. */
    sg_tensor_destroy(e.s[0].h);
    e.s[0].h = NULL;
    sg_graph_cache_destroy(probe);

    sg_graph_cache *c = NULL;
    TU_OK(ctx, sg_graph_cache_create(ctx, 2 * one, 0, &c));
    model m = {.budget = 2 * one, .one = one, .uniform = true};
    lru_get(&e, c, &m, A, &e.s[0], "lru A");
    lru_get(&e, c, &m, B, &e.s[1], "lru B");
    lru_get(&e, c, &m, A, &e.s[0], "lru A again");
    lru_get(&e, c, &m, C, &e.s[2], "lru C");
    TU_CHECK(be != SG_BACKEND_CPU || m.uniform, "cpu: graphs of one plan have different estimates");
    if (m.uniform) {
        /* B was the least recently used: gone; A stays (a hit), B comes back (a miss). */
        sg_graph_cache_stats st = stats_of(ctx, c);
        TU_CHECK(st.evictions == 1 && st.cached == 2, "after A B A C: %llu evictions, %d cached",
                 (unsigned long long)st.evictions, st.cached);
        uint64_t h0 = st.hits, m0 = st.misses;
        lru_get(&e, c, &m, A, &e.s[0], "lru A after C");
        st = stats_of(ctx, c);
        TU_CHECK(st.hits == h0 + 1 && st.misses == m0, "A was evicted instead of B");
        lru_get(&e, c, &m, B, &e.s[1], "lru B after C");
        st = stats_of(ctx, c);
        TU_CHECK(st.misses == m0 + 1, "B is still cached after A B A C with room for two");
        lru_get(&e, c, &m, C, &e.s[2], "lru C last"); /* C was least recent: evicted by B */
        st = stats_of(ctx, c);
        TU_CHECK(st.misses == m0 + 2, "C should have been evicted by B");
    } else {
        printf("note: the GPU graphs' estimates differ (exec_bytes is a free-memory delta); "
               "LRU order checked against the model only\n");
        for (int k = 0; k < 6; k++) {
            int i = tu_randint(0, 2);
            lru_get(&e, c, &m, i == 0 ? A : i == 1 ? B : C, &e.s[i], "lru random");
        }
    }
    sg_graph_cache_destroy(c);
    env_destroy(&e);
}

/* ---- the estimate: at least 1 KiB a node, even where instantiation measures less ----
 * A graph of many small nodes: the CPU plan's bytes, and on the GPU a free-memory delta that
 * often reads 0, are below 1 KiB a node, so the floor must set the estimate. */
static void check_estimate(sg_backend be)
{
    static const int64_t rows[1] = {8};
    env e = env_create(be, rows, 1);
    sg_ctx *ctx = e.ctx;
    sg_graph_cache *c = NULL;
    sg_graph *g = NULL;
    TU_OK(ctx, sg_graph_cache_create(ctx, 0, 0, &c));
    TU_OK(ctx, sg_graph_cache_get(c, 0, deep_fn, &e.s[0], NULL, &g));
    sg_graph_stats gs;
    TU_OK(ctx, sg_graph_get_stats(g, &gs));
    size_t want = gs.exec_bytes > (size_t)gs.nodes * 1024 ? gs.exec_bytes : (size_t)gs.nodes * 1024;
    sg_graph_cache_stats st = stats_of(ctx, c);
    TU_CHECK(gs.nodes >= 42 && st.bytes == want && st.bytes >= 42 * 1024,
             "a graph of %d nodes and %zu exec bytes is estimated at %zu bytes, expected %zu",
             gs.nodes, gs.exec_bytes, st.bytes, want);
    sg_graph_cache_destroy(c);
    env_destroy(&e);
}

/* ---- errors: clear messages, nothing cached, the context still usable ---- */

static void check_errors(sg_backend be)
{
    env e = env_create(be, BUCKETS, N_BUCKETS);
    sg_ctx *ctx = e.ctx;
    step *s = &e.s[0];
    sg_graph_cache *c = (sg_graph_cache *)&e; /* poison: must be set to NULL on failure */
    TU_CHECK(sg_graph_cache_create(NULL, 0, 0, &c) == SG_ERR_NULL && c == NULL, "NULL ctx accepted");
    c = (sg_graph_cache *)&e;
    TU_FAILS(ctx, sg_graph_cache_create(ctx, 0, 0, NULL), SG_ERR_NULL, "sg_graph_cache_create");
    TU_FAILS(ctx, sg_graph_cache_create(ctx, 0, -1, &c), SG_ERR_INVALID, "warn_after");
    TU_CHECK(c == NULL, "out not cleared on failure");
    TU_FAILS(ctx, sg_graph_cache_create(ctx, (size_t)-1, 0, &c), SG_ERR_INVALID, "budget_bytes");
    sg_graph_cache_destroy(NULL);

    TU_OK(ctx, sg_graph_cache_create(ctx, 0, 0, &c));
    sg_graph *g = (sg_graph *)&e;
    TU_CHECK(sg_graph_cache_get(NULL, 8, step_fn, s, NULL, &g) == SG_ERR_NULL && g == NULL, "NULL cache accepted");
    g = (sg_graph *)&e;
    TU_FAILS(ctx, sg_graph_cache_get(c, 8, step_fn, s, NULL, NULL), SG_ERR_NULL, "out is NULL");
    TU_FAILS(ctx, sg_graph_cache_get(c, 8, NULL, s, NULL, &g), SG_ERR_NULL, "fn is NULL");
    TU_CHECK(g == NULL, "out not cleared on failure");
    TU_FAILS(ctx, sg_graph_cache_get(c, sg_bucket_for(BUCKETS, N_BUCKETS, 33), step_fn, s, NULL, &g),
             SG_ERR_INVALID, "key -1");
    sg_graph_cache_stats st;
    TU_CHECK(sg_graph_cache_get_stats(NULL, &st) == SG_ERR_NULL, "NULL cache accepted");
    TU_FAILS(ctx, sg_graph_cache_get_stats(c, NULL), SG_ERR_NULL, "sg_graph_cache_get_stats");
    st = stats_of(ctx, c);
    TU_CHECK(st.misses == 0 && st.hits == 0, "argument errors counted as gets");

    /* One good graph, so that "cached unchanged" means something. */
    run_batch(&e, c, 5, "errors: before");
    sg_graph_options bad = sg_graph_options_default();
    bad.warmup = -1;
    struct { sg_step_fn fn; const sg_graph_options *opts; sg_status want; const char *needle; } fails[] = {
        {fail_fn, NULL, SG_ERR_INVALID, "failing on purpose"},
        {fail_in_capture_fn, NULL, SG_ERR_SHAPE, "refusing to be captured"},
        {sync_fn, NULL, SG_ERR_CAPTURE, "sg_ctx_sync"},
        {step_fn, &bad, SG_ERR_INVALID, "warmup -1"},
    };
    step *s16 = step_for(&e, 16);
    for (int i = 0; i < 4; i++) {
        sg_graph_cache_stats before = stats_of(ctx, c);
        g = (sg_graph *)&e;
        TU_FAILS(ctx, sg_graph_cache_get(c, 16, fails[i].fn, s16, fails[i].opts, &g), fails[i].want,
                 fails[i].needle);
        TU_CHECK(strstr(sg_ctx_last_error(ctx), "sg_graph_cache_get: key 16") != NULL,
                 "message does not name the call and key: %s", sg_ctx_last_error(ctx));
        TU_CHECK(g == NULL, "failure %d: out not cleared", i);
        st = stats_of(ctx, c);
        TU_CHECK(st.cached == before.cached && st.misses == before.misses + 1 &&
                     st.captures == before.captures && st.distinct_keys == before.distinct_keys &&
                     st.bytes == before.bytes && st.hits == before.hits,
                 "failure %d changed the cache: cached %d->%d, misses %llu->%llu, captures "
                 "%llu->%llu, keys %llu->%llu", i, before.cached, st.cached,
                 (unsigned long long)before.misses, (unsigned long long)st.misses,
                 (unsigned long long)before.captures, (unsigned long long)st.captures,
                 (unsigned long long)before.distinct_keys, (unsigned long long)st.distinct_keys);
        TU_CHECK(!sg_ctx_capturing(ctx), "failure %d left the context capturing", i);
    }
    /* A graph named by its key when the options give no name: the capture error cites it. */
    TU_FAILS(ctx, sg_graph_cache_get(c, 16, fail_in_capture_fn, s16, NULL, &g), SG_ERR_SHAPE,
             "graph 'bucket-16'");

    /* The context works: the cached graph still replays, the failed key captures now, and the
     * caller's pool in the options is overridden by the cache's. */
    run_batch(&e, c, 3, "errors: after, cached");
    sg_pool *other;
    TU_OK(ctx, sg_pool_create(ctx, "other", &other));
    sg_graph_options o = sg_graph_options_default();
    o.pool = other;
    o.name = "mine";
    float *xh = fill_input(s16, 11);
    TU_OK(ctx, sg_graph_cache_get(c, 16, step_fn, s16, &o, &g));
    TU_CHECK(sg_graph_pool(g) != other && sg_graph_pool(g) == s16->h_pool,
             "the options' pool was used instead of the cache's");
    TU_CHECK(!strcmp(g->name, "mine"), "the options' name was not kept: '%s'", g->name);
    replay_and_check(&e, s16, g, 11, xh, "errors: after, new");
    free(xh);
    sg_alloc_stats os;
    TU_OK(ctx, sg_pool_stats(ctx, other, &os));
    TU_CHECK(os.device_allocs == 0, "the options' pool was allocated from");
    TU_OK(ctx, sg_pool_destroy(other));
    st = stats_of(ctx, c);
    TU_CHECK(st.cached == 2 && st.captures == 2 && st.distinct_keys == 2 && st.misses == 7,
             "after the errors: cached %d, captures %llu, keys %llu, misses %llu", st.cached,
             (unsigned long long)st.captures, (unsigned long long)st.distinct_keys,
             (unsigned long long)st.misses);
    sg_graph_cache_destroy(c);
    env_destroy(&e);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_cache");
    sg_backend be = strcmp(mode, "gpu") ? SG_BACKEND_CPU : SG_BACKEND_CUDA;
    if (be == SG_BACKEND_CPU) check_bucket_for();
    if (sg_graphs_disabled()) {
        /* Eager "graphs" record nothing: no nodes, no bytes, no capture to fail. */
        if (tu_failures) return tu_finish("test_cache");
        printf("SKIP: STEPGRAPH_DISABLE_GRAPHS is set: the cache's checks need captured graphs\n");
        return TU_SKIP;
    }
    check_buckets(be);
    check_eviction(be);
    check_lru(be);
    check_estimate(be);
    check_errors(be);
    return tu_finish("test_cache");
}
