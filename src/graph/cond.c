/* cond.c: conditional regions (stepgraph.h: sg_graph_if, sg_graph_while, sg_graph_switch). What
 * every backend shares: the argument checks, the eager path (read the value, run the body as C
 * would), the depth count that refuses collectives and events in a body, and the dispatch to
 * the backend's recording during capture (graph_cpu.c: a plan entry with sub-plans;
 * graph_cuda.c: a conditional node). */
#include "graph/graph.h"

#include <stdlib.h>

#define SG_COND_MAX_BRANCHES 64

static bool disabled(void)
{
    const char *e = getenv("STEPGRAPH_DISABLE_CONDITIONALS");
    return e && *e && strcmp(e, "0") != 0;
}

int sg_graph_conditionals(const sg_ctx *ctx)
{
    if (!ctx || disabled()) return 0;
    return sg_graph_backend_of(ctx)->cond_kinds(ctx);
}

sg_status sg_cond_body(sg_ctx *ctx, sg_cond_kind kind, sg_step_fn fn, void *user)
{
    sg_cond_kind outer = ctx->cond_kind;
    ctx->cond_depth++;
    ctx->cond_kind = kind;
    sg_status st = fn(user);
    ctx->cond_depth--;
    ctx->cond_kind = outer;
    return st;
}

static sg_status check(sg_ctx *ctx, sg_cond_kind kind, const sg_tensor *v, int n, const sg_step_fn *fns)
{
    const char *fn = sg_cond_call(kind);
    const char *what = kind == SG_COND_SWITCH ? "index" : "cond";
    if (!v) return sg_fail(ctx, SG_ERR_NULL, "%s: %s is NULL", fn, what);
    SG_TRY(sg_check_tensor(ctx, fn, what, v));
    if (v->dtype != SG_DTYPE_I32 || v->numel != 1)
        return sg_fail(ctx, v->dtype != SG_DTYPE_I32 ? SG_ERR_DTYPE : SG_ERR_SHAPE,
                       "%s: %s '%s' is %s with %lld elements: expected one int32 element", fn, what, v->name,
                       sg_dtype_name(v->dtype), (long long)v->numel);
    if (n < 1 || n > SG_COND_MAX_BRANCHES)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: %d branches: expected 1 to %d", fn, n, SG_COND_MAX_BRANCHES);
    if (!fns) return sg_fail(ctx, SG_ERR_NULL, "%s: %s is NULL", fn, kind == SG_COND_SWITCH ? "branches" : "body");
    for (int i = 0; i < n; i++)
        if (!fns[i])
            return kind == SG_COND_SWITCH ? sg_fail(ctx, SG_ERR_NULL, "%s: branch %d is NULL", fn, i)
                                          : sg_fail(ctx, SG_ERR_NULL, "%s: body is NULL", fn);
    return SG_OK;
}

static sg_status read_value(const sg_tensor *v, int32_t *x) { return sg_tensor_copy_to_host(v, x, sizeof *x); }

/* Eagerly: the value read to the host before each body, as C's if, while and switch. */
static sg_status run_eager(sg_ctx *ctx, sg_cond_kind kind, const sg_tensor *v, int n, const sg_step_fn *fns,
                           void *const *users)
{
    int32_t x = 0;
    SG_TRY(read_value(v, &x));
    if (kind == SG_COND_IF) return x ? sg_cond_body(ctx, kind, fns[0], users[0]) : SG_OK;
    if (kind == SG_COND_SWITCH) return x >= 0 && x < n ? sg_cond_body(ctx, kind, fns[x], users[x]) : SG_OK;
    while (x) {
        SG_TRY(sg_cond_body(ctx, kind, fns[0], users[0]));
        SG_TRY(read_value(v, &x));
    }
    return SG_OK;
}

static sg_status cond(sg_ctx *ctx, sg_cond_kind kind, const sg_tensor *v, int n, const sg_step_fn *fns,
                      void *const *users)
{
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check(ctx, kind, v, n, fns));
    void *none[SG_COND_MAX_BRANCHES] = {0};
    if (!users) users = none;
    if (!ctx->cap.active) return run_eager(ctx, kind, v, n, fns, users);
    if (!(sg_graph_conditionals(ctx) & (1 << kind))) {
        sg_fail(ctx, SG_ERR_UNSUPPORTED,
                "%s: this %s capture cannot make %s conditional nodes (%s); run the region eagerly or "
                "without it", sg_cond_call(kind), sg_graph_backend_of(ctx)->name,
                kind == SG_COND_IF ? "IF" : kind == SG_COND_WHILE ? "WHILE" : "SWITCH",
                disabled() ? "STEPGRAPH_DISABLE_CONDITIONALS is set"
                           : "IF and WHILE need CUDA 12.4, SWITCH 12.8, in both the driver and the runtime");
        sg_capture_void(ctx, SG_ERR_UNSUPPORTED);
        return SG_ERR_UNSUPPORTED;
    }
    return sg_graph_backend_of(ctx)->cond(ctx, kind, v, n, fns, users);
}

sg_status sg_graph_if(sg_ctx *ctx, const sg_tensor *c, sg_step_fn body, void *user)
{
    return cond(ctx, SG_COND_IF, c, 1, &body, &user);
}

sg_status sg_graph_while(sg_ctx *ctx, const sg_tensor *c, sg_step_fn body, void *user)
{
    return cond(ctx, SG_COND_WHILE, c, 1, &body, &user);
}

sg_status sg_graph_switch(sg_ctx *ctx, const sg_tensor *index, int n, const sg_step_fn *branches,
                          void *const *users)
{
    return cond(ctx, SG_COND_SWITCH, index, n, branches, users);
}
