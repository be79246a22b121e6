/* graph_cpu.c: the capture engine's CPU backend (the sg_graph_backend_i table). A recording is
 * the plan of op calls that sg_cpu_run appended during capture (core/capture.c); replay runs
 * them in order, as a CUDA Graph replays its kernels. */
#include "graph/graph.h"

#include <stdlib.h>

static sg_status cpu_begin(sg_ctx *ctx)
{
    ctx->cap.plan = sg_plan_create();
    if (!ctx->cap.plan) return sg_fail(ctx, SG_ERR_OOM, "sg_graph_capture: out of host memory");
    return SG_OK;
}

static sg_status cpu_end(sg_ctx *ctx, void **rec)
{
    *rec = ctx->cap.plan;
    return SG_OK;
}

static void cpu_discard(void *rec) { sg_plan_destroy(rec); }

static sg_status cpu_instantiate(sg_graph *g, void *rec)
{
    g->plan = rec;
    g->st.nodes = sg_plan_length(g->plan);
    g->st.exec_bytes = sg_plan_bytes(g->plan);
    return SG_OK;
}

/* A plan has nothing to update in place: the new one replaces the old. */
static sg_status cpu_update(sg_graph *g, void *rec)
{
    sg_plan_destroy(g->plan);
    g->plan = rec;
    g->st.nodes = sg_plan_length(g->plan);
    g->st.updates++;
    return SG_OK;
}

static sg_status cpu_launch(sg_graph *g) { return sg_plan_run(g->ctx, g->plan); }

static void cpu_release(sg_graph *g)
{
    sg_plan_destroy(g->plan);
    g->plan = NULL;
}

/* A conditional entry: the value's address (host memory on this backend) and a sub-plan per
 * body, owned by the plan the entry is in. */
typedef struct cond_entry {
    sg_cond_kind kind;
    const int32_t *v;
    int n;
    sg_plan *body[];
} cond_entry;

static sg_status cpu_cond_run(sg_ctx *ctx, const void *args)
{
    const cond_entry *e = args;
    switch (e->kind) {
    case SG_COND_IF:
        return *e->v ? sg_plan_run(ctx, e->body[0]) : SG_OK;
    case SG_COND_WHILE:
        while (*e->v) SG_TRY(sg_plan_run(ctx, e->body[0]));
        return SG_OK;
    case SG_COND_SWITCH:
        return *e->v >= 0 && *e->v < e->n ? sg_plan_run(ctx, e->body[*e->v]) : SG_OK;
    }
    return SG_OK;
}

/* Each body records into its own plan, which the current plan adopts; then the entry that
 * picks among them goes into the current plan. */
static sg_status cpu_cond(sg_ctx *ctx, sg_cond_kind kind, const sg_tensor *v, int n, const sg_step_fn *fns,
                          void *const *users)
{
    sg_plan *parent = ctx->cap.plan;
    size_t size = sizeof(cond_entry) + (size_t)n * sizeof(sg_plan *);
    cond_entry *e = calloc(1, size);
    if (!e) return sg_fail(ctx, SG_ERR_OOM, "%s: out of host memory for the plan", sg_cond_call(kind));
    e->kind = kind, e->v = v->data, e->n = n;
    sg_status st = SG_OK;
    for (int i = 0; i < n && st == SG_OK; i++) {
        sg_plan *kid = sg_plan_create();
        if (!kid) st = sg_fail(ctx, SG_ERR_OOM, "%s: out of host memory for the plan", sg_cond_call(kind));
        if (st == SG_OK) st = sg_plan_adopt(ctx, parent, kid);
        if (st != SG_OK) break;
        e->body[i] = kid;
        ctx->cap.plan = kid;
        st = sg_cond_body(ctx, kind, fns[i], users[i]);
        ctx->cap.plan = parent;
    }
    if (st == SG_OK) st = sg_cpu_run(ctx, cpu_cond_run, e, size);
    free(e);
    return st;
}

static int cpu_cond_kinds(const sg_ctx *ctx)
{
    (void)ctx;
    return 1 << SG_COND_IF | 1 << SG_COND_WHILE | 1 << SG_COND_SWITCH;
}

const sg_graph_backend_i sg_graph_cpu = {
    .name = "CPU",
    .begin = cpu_begin,
    .end = cpu_end,
    .discard = cpu_discard,
    .instantiate = cpu_instantiate,
    .update = cpu_update,
    .launch = cpu_launch,
    .set_args = NULL, /* a plan holds op calls, not kernel nodes */
    .release = cpu_release,
    .cond = cpu_cond,
    .cond_kinds = cpu_cond_kinds,
};
