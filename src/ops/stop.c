/* stop.c: entry points of the early-stop rule (stop.h): check the state, the loss, the limit
 * and the rule, then run the CPU reference (through sg_cpu_run, so a CPU capture records it
 * and reads the loss at replay) or the CUDA kernel. Nothing is written before every check has
 * passed. */
#include "ops/stop.h"

#include <math.h>

/* state: SG_STOP_STATE int32 elements. */
static sg_status check_state(sg_ctx *ctx, const char *fn, const sg_tensor *state)
{
    return sg_check_count(ctx, fn, "state", state, SG_DTYPE_I32, SG_STOP_STATE, "SG_STOP_STATE");
}

static sg_status check_limit(sg_ctx *ctx, const char *fn, int32_t limit)
{
    if (limit < 1 || limit > SG_STOP_MAX_LIMIT)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: limit %d: expected the steps a call may run, 1 to %d", fn,
                       (int)limit, SG_STOP_MAX_LIMIT);
    return SG_OK;
}

typedef struct begin_args {
    sg_tensor *state;
    int32_t limit;
} begin_args;

static sg_status begin_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    const begin_args *a = p;
    sg_stop_begin_cpu(a->state->data, a->limit);
    return SG_OK;
}

sg_status sg_stop_begin(sg_ctx *ctx, sg_tensor *state, int32_t limit)
{
    const char *fn = "sg_stop_begin";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_state(ctx, fn, state));
    SG_TRY(check_limit(ctx, fn, limit));
    if (ctx->backend == SG_BACKEND_CPU) {
        begin_args a = {state, limit};
        return sg_cpu_run(ctx, begin_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_stop_begin_cuda(ctx, state, limit));
}

typedef struct check_args {
    sg_tensor *state;
    const sg_tensor *loss;
    int32_t limit;
    sg_stop_rule rule; /* by value: the caller's struct need not outlive a graph */
} check_args;

static sg_status check_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    const check_args *a = p;
    sg_stop_check_cpu(a->state->data, *(const float *)a->loss->data, a->limit, a->rule);
    return SG_OK;
}

sg_status sg_stop_check(sg_ctx *ctx, sg_tensor *state, const sg_tensor *loss, int32_t limit,
                        const sg_stop_rule *rule)
{
    const char *fn = "sg_stop_check";
    if (!ctx) return SG_ERR_NULL;
    SG_TRY(check_state(ctx, fn, state));
    SG_TRY(sg_check_count(ctx, fn, "loss", loss, SG_DTYPE_F32, 1, "the step's loss"));
    SG_TRY(check_limit(ctx, fn, limit));
    if (!rule) return sg_fail(ctx, SG_ERR_NULL, "%s: rule is NULL", fn);
    if (rule->nonfinite_steps < 0)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: rule->nonfinite_steps %d: expected >= 0 (0: never stop on "
                       "non-finite losses)", fn, rule->nonfinite_steps);
    if (rule->use_target && !isfinite(rule->target_loss))
        return sg_fail(ctx, SG_ERR_INVALID, "%s: rule->target_loss %g with use_target: expected a finite "
                       "target", fn, rule->target_loss);
    if (ctx->backend == SG_BACKEND_CPU) {
        check_args a = {state, loss, limit, *rule};
        return sg_cpu_run(ctx, check_cpu, &a, sizeof a);
    }
    return SG_CUDA_DISPATCH(ctx, sg_stop_check_cuda(ctx, state, loss, limit, *rule));
}
