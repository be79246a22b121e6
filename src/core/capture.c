/* capture.c: the core's part of capture: the forbidden-call check every host-reading,
 * syncing or allocating call makes, the module name that messages cite, and the CPU plan:
 * during a CPU capture, op calls are recorded (function and copied arguments) instead of run,
 * and replay runs them in order, as a CUDA Graph replays its kernels. */
#include "core/core.h"

#include <stdlib.h>

const char *sg_ctx_set_module(sg_ctx *ctx, const char *name)
{
    if (!ctx) return NULL;
    const char *prev = ctx->module;
    ctx->module = name;
    return prev;
}

int sg_ctx_capturing(const sg_ctx *ctx) { return ctx && ctx->cap.active; }

void sg_capture_void(sg_ctx *ctx, sg_status why)
{
    if (!ctx->cap.active || ctx->cap.failed) return;
    ctx->cap.failed = true;
    ctx->cap.fail_status = why;
    snprintf(ctx->cap.fail_msg, sizeof ctx->cap.fail_msg, "%s", ctx->msg);
}

/* "module 'm'", or `outside` when no module is queuing work. */
static void where_str(const sg_ctx *ctx, const char *outside, char *out, size_t n)
{
    if (ctx->module) snprintf(out, n, "module '%s'", ctx->module);
    else snprintf(out, n, "%s", outside);
}

sg_status sg_capture_forbid(sg_ctx *ctx, const char *call, const char *what, const char *hint)
{
    if (!ctx || !ctx->cap.active) return SG_OK;
    char where[96];
    where_str(ctx, "the captured step (outside any module)", where, sizeof where);
    sg_fail(ctx, SG_ERR_CAPTURE, "sg_graph_capture: %s %s during capture (%s); %s", where, what,
            call, hint);
    sg_capture_void(ctx, SG_ERR_CAPTURE);
    return SG_ERR_CAPTURE;
}

const char *sg_cond_call(sg_cond_kind kind)
{
    static const char *const call[] = {"sg_graph_if", "sg_graph_while", "sg_graph_switch"};
    return kind >= SG_COND_IF && kind <= SG_COND_SWITCH ? call[kind] : "sg_graph_cond";
}

sg_status sg_cond_forbid(sg_ctx *ctx, const char *call, const char *what)
{
    if (!ctx || ctx->cond_depth == 0) return SG_OK;
    char where[96];
    where_str(ctx, "the step", where, sizeof where);
    sg_fail(ctx, SG_ERR_CAPTURE,
            "%s: %s %s inside a conditional region (%s): a CUDA conditional node's body holds kernels, "
            "memsets, copies and conditional nodes only; move it out of the region",
            call, where, what, sg_cond_call(ctx->cond_kind));
    sg_capture_void(ctx, SG_ERR_CAPTURE);
    return SG_ERR_CAPTURE;
}

/* ---- the CPU plan ---- */

typedef struct plan_entry {
    sg_cpu_thunk fn;
    size_t off;
} plan_entry;

struct sg_plan {
    plan_entry *e;
    int n, cap;
    unsigned char *args;
    size_t used, cap_bytes;
    sg_plan **kids;            /* conditional bodies, freed with the plan */
    int n_kids;
};

sg_plan *sg_plan_create(void) { return calloc(1, sizeof(sg_plan)); }

void sg_plan_destroy(sg_plan *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_kids; i++) sg_plan_destroy(p->kids[i]);
    free(p->kids);
    free(p->e);
    free(p->args);
    free(p);
}

sg_status sg_plan_adopt(sg_ctx *ctx, sg_plan *parent, sg_plan *child)
{
    sg_plan **k = realloc(parent->kids, (size_t)(parent->n_kids + 1) * sizeof *k);
    if (!k) {
        sg_plan_destroy(child);
        return sg_fail(ctx, SG_ERR_OOM, "sg_graph_capture: out of host memory for the plan");
    }
    parent->kids = k;
    k[parent->n_kids++] = child;
    return SG_OK;
}

int sg_plan_length(const sg_plan *p) { return p ? p->n : 0; }

size_t sg_plan_bytes(const sg_plan *p)
{
    if (!p) return 0;
    size_t b = p->cap_bytes + (size_t)p->cap * sizeof(plan_entry);
    for (int i = 0; i < p->n_kids; i++) b += sg_plan_bytes(p->kids[i]);
    return b;
}

static sg_status plan_append(sg_ctx *ctx, sg_plan *p, sg_cpu_thunk fn, const void *args, size_t size)
{
    size_t off = (p->used + 15) & ~(size_t)15;
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        plan_entry *e = realloc(p->e, (size_t)cap * sizeof *e);
        if (!e) return sg_fail(ctx, SG_ERR_OOM, "sg_graph_capture: out of host memory for the plan");
        p->e = e, p->cap = cap;
    }
    if (off + size > p->cap_bytes) {
        size_t cap = p->cap_bytes ? 2 * p->cap_bytes : 4096;
        while (cap < off + size) cap *= 2;
        unsigned char *a = realloc(p->args, cap);
        if (!a) return sg_fail(ctx, SG_ERR_OOM, "sg_graph_capture: out of host memory for the plan");
        p->args = a, p->cap_bytes = cap;
    }
    memcpy(p->args + off, args, size);
    p->e[p->n++] = (plan_entry){fn, off};
    p->used = off + size;
    return SG_OK;
}

sg_status sg_cpu_run(sg_ctx *ctx, sg_cpu_thunk fn, const void *args, size_t size)
{
    if (ctx->cap.active && ctx->cap.plan) return plan_append(ctx, ctx->cap.plan, fn, args, size);
    return fn(ctx, args);
}

sg_status sg_plan_run(sg_ctx *ctx, const sg_plan *p)
{
    for (int i = 0; i < p->n; i++) SG_TRY(p->e[i].fn(ctx, p->args + p->e[i].off));
    return SG_OK;
}
