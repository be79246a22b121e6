/* graph.c: sg_graph: warm up, capture a step into a graph with its own pool, replay it with one
 * launch, recapture (update in place), destroy. What differs by backend sits behind the
 * sg_graph_backend_i table (graph_cpu.c, graph_cuda.c). On the CPU a "graph" is the plan of op
 * calls recorded during capture (core/capture.c), so CI exercises the same semantics: static
 * tensors, no allocation on replay, errors for forbidden calls during capture. */
#include "graph/graph.h"

#include <stdlib.h>
#include <time.h>

static double now_ms(void) { return sg_clock_us() / 1e3; }

int sg_graphs_disabled(void)
{
    const char *e = getenv("STEPGRAPH_DISABLE_GRAPHS");
    return e && *e && strcmp(e, "0") != 0;
}

sg_graph_options sg_graph_options_default(void)
{
    sg_graph_options o;
    memset(&o, 0, sizeof o);
    o.warmup = 3;
    return o;
}

sg_pool *sg_graph_pool(const sg_graph *g) { return g ? g->pool : NULL; }

sg_status sg_graph_get_stats(const sg_graph *g, sg_graph_stats *out)
{
    if (!g || !out) return SG_ERR_NULL;
    *out = g->st;
    return SG_OK;
}

const sg_graph_backend_i *sg_graph_backend_of(const sg_ctx *ctx)
{
#ifdef SG_HAVE_CUDA
    if (ctx->backend == SG_BACKEND_CUDA) return &sg_graph_cuda;
#endif
    return &sg_graph_cpu;
}

/* ---- the live graphs of a context ----
 * Replay must refuse a static input that was destroyed, so graphs watch tensor destruction
 * through the context's tensor hook (core knows nothing of graphs). The hook is installed
 * while a graph is alive, and its user pointer is the list's head: no allocation, and a
 * context without graphs pays nothing when a tensor goes. */

static void forget_tensor(void *user, const sg_tensor *t)
{
    for (sg_graph *g = user; g; g = g->next)
        for (int i = 0; i < g->n_in; i++)
            if (g->in[i].t == t) g->in[i].gone = true;
}

sg_graph *sg_graphs_of(const sg_ctx *ctx)
{
    return ctx->tensor_hook == forget_tensor ? ctx->tensor_user : NULL;
}

static void set_graphs(sg_ctx *ctx, sg_graph *head)
{
    sg_ctx_set_tensor_hook(ctx, head ? forget_tensor : NULL, head);
}

static void link_graph(sg_graph *g)
{
    g->next = sg_graphs_of(g->ctx);
    set_graphs(g->ctx, g);
}

static void unlink_graph(sg_graph *g)
{
    sg_graph *head = sg_graphs_of(g->ctx);
    if (head == g) {
        set_graphs(g->ctx, g->next);
        return;
    }
    for (sg_graph *p = head; p; p = p->next)
        if (p->next == g) {
            p->next = g->next;
            return;
        }
}

void sg_graph_destroy(sg_graph *g)
{
    if (!g) return;
    sg_ctx *ctx = g->ctx;
    /* Replays may be in flight: the pool's memory is theirs until they finish. */
    if (!ctx->cap.active && ctx->dev->sync(ctx) != SG_OK) { /* keep going: nothing to act on */ }
    g->be->release(g);
    for (int i = 0; i < g->n_deferred; i++) sg_pool_free(g->deferred_pool[i], g->deferred[i]);
    free(g->deferred);
    free(g->deferred_pool);
    for (int i = 0; i < g->n_dead; i++) free(g->dead[i]);
    free(g->dead);
    unlink_graph(g);
    if (g->own_pool && sg_pool_destroy(g->pool) != SG_OK) {
        /* Live tensors of the pool remain (the caller's): the pool stays with the context. */
    }
    free(g);
}

/* Leaves capture mode: restores the pool and hands the deferred frees to g. */
static void end_capture_state(sg_ctx *ctx, sg_graph *g, sg_pool *prev_pool)
{
    sg_capture *c = &ctx->cap;
    for (int i = 0; i < c->n_deferred; i++) {
        sg_block **nb = realloc(g->deferred, (size_t)(g->n_deferred + 1) * sizeof *nb);
        sg_pool **np = realloc(g->deferred_pool, (size_t)(g->n_deferred + 1) * sizeof *np);
        if (nb) g->deferred = nb;
        if (np) g->deferred_pool = np;
        if (!nb || !np) break; /* out of host memory: the blocks leak, never reused */
        g->deferred[g->n_deferred] = c->deferred[i];
        g->deferred_pool[g->n_deferred++] = c->deferred_pool[i];
    }
    free(c->deferred);
    free(c->deferred_pool);
    sg_tensor **d = realloc(g->dead, (size_t)(g->n_dead + c->n_dead + 1) * sizeof *d);
    if (d) {
        g->dead = d;
        for (int i = 0; i < c->n_dead; i++) d[g->n_dead++] = c->dead[i];
    }
    free(c->dead);
    memset(c, 0, sizeof *c);
    ctx->cur_pool = prev_pool;
}

/* One recording of g->fn into *rec (the backend's: a CPU plan, a cudaGraph_t). */
static sg_status record(sg_graph *g, void **rec)
{
    sg_ctx *ctx = g->ctx;
    sg_pool *prev_pool = ctx->cur_pool;
    *rec = NULL;
    ctx->cur_pool = g->pool;
    memset(&ctx->cap, 0, sizeof ctx->cap);
    ctx->cap.pool = g->pool;
    sg_status st = g->be->begin(ctx);
    if (st != SG_OK) {
        memset(&ctx->cap, 0, sizeof ctx->cap);
        ctx->cur_pool = prev_pool;
        return st;
    }
    ctx->cap.active = true;
    const char *module = ctx->module;
    double t0 = now_ms();
    st = g->fn(g->user);
    ctx->module = module;
    ctx->cap.active = false;
    sg_status end = g->be->end(ctx, rec);
    g->st.capture_ms = now_ms() - t0;
    bool failed = ctx->cap.failed;
    sg_status why = ctx->cap.fail_status;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", failed ? ctx->cap.fail_msg : ctx->msg);
    end_capture_state(ctx, g, prev_pool);
    if (st == SG_OK && !failed && end == SG_OK) return SG_OK;
    /* Nothing of a failed recording is kept. */
    if (*rec) g->be->discard(*rec);
    *rec = NULL;
    if (failed) return sg_fail(ctx, why ? why : SG_ERR_CAPTURE, "%s", msg);
    if (st != SG_OK)
        return sg_fail(ctx, st == SG_ERR_CUDA ? SG_ERR_CAPTURE : st,
                       "sg_graph_capture: graph '%s': the step failed during capture: %s", g->name, msg);
    return end; /* the backend's end names its reason (CUDA's error) */
}

sg_status sg_graph_capture(sg_ctx *ctx, sg_step_fn fn, void *user, const sg_graph_options *opts,
                           sg_graph **out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!out || !fn) return sg_fail(ctx, SG_ERR_NULL, "sg_graph_capture: fn or out is NULL");
    *out = NULL;
    SG_TRY(sg_cond_forbid(ctx, "sg_graph_capture", "started a capture"));
    if (ctx->cap.active)
        return sg_capture_forbid(ctx, "sg_graph_capture", "started a nested capture",
                                 "capture graphs one at a time");
    sg_graph_options o = opts ? *opts : sg_graph_options_default();
    if (o.warmup < 0 || o.n_static_inputs < 0 || o.n_static_inputs > SG_GRAPH_MAX_INPUTS ||
        (o.n_static_inputs && !o.static_inputs))
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_graph_capture: warmup %d and %d static inputs: expected warmup >= 0 and "
                       "0..%d static inputs", o.warmup, o.n_static_inputs, SG_GRAPH_MAX_INPUTS);
    if (o.pool && o.pool->ctx != ctx)
        return sg_fail(ctx, SG_ERR_BACKEND, "sg_graph_capture: pool '%s' belongs to another context",
                       o.pool->name);
    sg_graph *g = calloc(1, sizeof *g);
    if (!g) return sg_fail(ctx, SG_ERR_OOM, "sg_graph_capture: out of host memory");
    g->ctx = ctx, g->fn = fn, g->user = user, g->be = sg_graph_backend_of(ctx);
    snprintf(g->name, sizeof g->name, "%s", o.name ? o.name : "graph");
    for (int i = 0; i < o.n_static_inputs; i++) {
        const sg_tensor *t = o.static_inputs[i];
        if (!t || t->ctx != ctx) {
            free(g);
            return sg_fail(ctx, t ? SG_ERR_BACKEND : SG_ERR_NULL,
                           "sg_graph_capture: static input %d is %s", i, t ? "of another context" : "NULL");
        }
        g->in[i] = (sg_static_input){t, t->data, false, {0}};
        snprintf(g->in[i].name, sizeof g->in[i].name, "%s", t->name);
    }
    g->n_in = o.n_static_inputs;
    link_graph(g);
    sg_status st = SG_OK;
    if (o.pool) {
        g->pool = o.pool;
    } else {
        char pn[80];
        snprintf(pn, sizeof pn, "graph:%s", g->name);
        st = sg_pool_create(ctx, pn, &g->pool);
        g->own_pool = st == SG_OK;
    }
    g->eager = sg_graphs_disabled();
    /* Warm-up, eagerly, in the graph's pool: lazy set-up (plans, scratch) and the step's own
     * temporaries happen here, so capture finds them cached. */
    sg_pool *prev = ctx->cur_pool;
    ctx->cur_pool = g->pool ? g->pool : prev;
    for (int i = 0; st == SG_OK && i < o.warmup; i++) st = fn(user);
    ctx->cur_pool = prev;
    if (st == SG_OK && !g->eager) st = ctx->dev->sync(ctx);
    if (st == SG_OK && !g->eager) {
        void *rec = NULL;
        st = record(g, &rec);
        if (st == SG_OK) {
            double t0 = now_ms();
            st = g->be->instantiate(g, rec);
            g->st.instantiate_ms = now_ms() - t0;
        }
    }
    if (st != SG_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ctx->msg);
        sg_graph_destroy(g);
        return sg_fail(ctx, st, "%s", msg);
    }
    g->st.captures = 1;
    *out = g;
    return SG_OK;
}

/* Every static input must still be there, at the address the graph was recorded with. */
static sg_status check_inputs(sg_graph *g)
{
    for (int i = 0; i < g->n_in; i++) {
        sg_static_input *in = &g->in[i];
        if (in->gone)
            return sg_fail(g->ctx, SG_ERR_INVALID,
                           "sg_graph_replay: graph '%s': static input '%s' was destroyed after capture; "
                           "the graph would read freed memory (recapture with the new tensor)",
                           g->name, in->name);
        if (in->t->data != in->data)
            return sg_fail(g->ctx, SG_ERR_INVALID,
                           "sg_graph_replay: graph '%s': static input '%s' was rebound to other memory "
                           "(%p, captured at %p); copy new data into it instead",
                           g->name, in->name, in->t->data, in->data);
    }
    return SG_OK;
}

sg_status sg_graph_replay(sg_graph *g)
{
    if (!g) return SG_ERR_NULL;
    sg_ctx *ctx = g->ctx;
    SG_TRY(sg_cond_forbid(ctx, "sg_graph_replay", "replayed a graph"));
    SG_TRY(sg_capture_forbid(ctx, "sg_graph_replay", "replayed a graph", "replay outside capture"));
    SG_TRY(check_inputs(g));
    sg_status st;
    if (g->eager) st = g->fn(g->user);
    else st = g->be->launch(g);
    if (st == SG_OK) g->st.replays++;
    return st;
}

sg_status sg_graph_recapture(sg_graph *g)
{
    if (!g) return SG_ERR_NULL;
    sg_ctx *ctx = g->ctx;
    SG_TRY(sg_cond_forbid(ctx, "sg_graph_recapture", "started a capture"));
    if (ctx->cap.active)
        return sg_capture_forbid(ctx, "sg_graph_recapture", "started a nested capture",
                                 "capture graphs one at a time");
    if (g->eager) return SG_OK;
    SG_TRY(check_inputs(g));
    SG_TRY(ctx->dev->sync(ctx));
    void *rec = NULL;
    SG_TRY(record(g, &rec));
    g->st.captures++;
    return g->be->update(g, rec);
}

sg_status sg_graph_kernel_set_args(sg_graph *g, const void *func, int occurrence, void **args)
{
    if (!g) return SG_ERR_NULL;
    if (!func || !args || occurrence < 0)
        return sg_fail(g->ctx, SG_ERR_INVALID, "sg_graph_kernel_set_args: func, args and occurrence >= 0 are required");
    if (!g->be->set_args || g->eager)
        return sg_fail(g->ctx, SG_ERR_UNSUPPORTED,
                       "sg_graph_kernel_set_args: graph '%s' has no CUDA kernel nodes (%s%s)",
                       g->name, g->eager ? "graphs are disabled" : g->be->name,
                       g->eager ? "" : " backend");
    return g->be->set_args(g, func, occurrence, args);
}
