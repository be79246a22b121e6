/* graph_cpu.c: the capture engine's CPU backend (the sg_graph_backend_i table). A recording is
 * the plan of op calls that sg_cpu_run appended during capture (core/capture.c); replay runs
 * them in order, as a CUDA Graph replays its kernels. */
#include "graph/graph.h"

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
};
