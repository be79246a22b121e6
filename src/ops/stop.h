/* stop.h: the device-side early-stop rule of a multi-step graph. A graph runs up to `limit`
 * optimizer steps in a WHILE region (sg_graph_while); after each step a one-thread kernel,
 * sg_stop_check, reads the step's loss and decides whether the loop goes on, and the host reads
 * the state once, later, to learn how many steps ran and why they stopped. The CPU reference
 * (stop_cpu.c), the CUDA kernels (stop_cuda.cu) and the entry points that check the arguments
 * (stop.c).
 *
 * The state, an SG_DTYPE_I32 tensor of SG_STOP_STATE elements on the device:
 *   [SG_STOP_GO]     1 when the loop should run another step (the WHILE's condition: a view of
 *                    this one element), else 0
 *   [SG_STOP_STEPS]  steps run in the current call (since sg_stop_begin)
 *   [SG_STOP_STREAK] consecutive steps, up to the last, whose loss was not finite
 *   [SG_STOP_REASON] why the run stopped: SG_STOP_NONE, SG_STOP_NONFINITE (the streak reached
 *                    rule.nonfinite_steps) or SG_STOP_TARGET (a step's loss <= rule.target_loss).
 *                    Sticky: once set it stays, across calls, and GO stays 0, until the host
 *                    resets the state
 *   [SG_STOP_TOTAL]  steps run since the state was reset
 *   [5..7]           reserved: never written (0 after a reset)
 * The counters STEPS, STREAK and TOTAL saturate at INT32_MAX instead of wrapping. The caller
 * resets the state (sg_tensor_fill(state, 0)) before the first call and whenever it wants the
 * rule to start over; the streak carries over from one call to the next.
 *
 * A step's order of decisions: the streak is updated first; then, when no reason is set yet,
 * NONFINITE is tested before TARGET, so NONFINITE wins a step that meets both (a loss of -inf
 * is not finite and is <= any target: it stops with SG_STOP_NONFINITE when it completes the
 * streak, and with SG_STOP_TARGET when the streak is still short or nonfinite_steps is 0). A
 * NaN loss never meets the target.
 *
 * Both calls are device work: no host sync, no allocation, capturable. A typical step graph:
 *     sg_stop_begin(ctx, state, K);
 *     sg_graph_while(ctx, go, body, user);   go: a 1-element view of state[SG_STOP_GO]
 * where body runs the step and then sg_stop_check(ctx, state, loss, K, &rule). */
#ifndef SG_OPS_STOP_H
#define SG_OPS_STOP_H

#include "core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sg_stop_rule {
    int nonfinite_steps; /* stop after this many consecutive steps with a non-finite loss (0: never) */
    int use_target;      /* stop when a step's loss <= target_loss (a NaN loss never meets it) */
    float target_loss;   /* finite when use_target; ignored otherwise */
} sg_stop_rule;

enum {
    SG_STOP_STATE = 8, /* elements of the state tensor */
    SG_STOP_NONE = 0,  /* reasons, state[SG_STOP_REASON] */
    SG_STOP_NONFINITE = 1,
    SG_STOP_TARGET = 2
};

/* Element indices of the state. */
enum { SG_STOP_GO = 0, SG_STOP_STEPS, SG_STOP_STREAK, SG_STOP_REASON, SG_STOP_TOTAL };

/* The largest limit a call takes (steps it may run). */
#define SG_STOP_MAX_LIMIT (1 << 30)

/* A call's start: state[STEPS] = 0, state[GO] = (state[REASON] == 0 && limit > 0); nothing else
 * changes. state (SG_STOP_STATE) I32; limit 1..SG_STOP_MAX_LIMIT. One launch on CUDA. */
sg_status sg_stop_begin(sg_ctx *ctx, sg_tensor *state, int32_t limit);

/* After a step whose loss is the one F32 element of `loss`: STEPS += 1, TOTAL += 1 (both
 * saturating); STREAK = loss finite ? 0 : STREAK + 1; when REASON is 0: REASON = NONFINITE if
 * rule->nonfinite_steps > 0 and STREAK >= it, else TARGET if rule->use_target and loss <=
 * rule->target_loss; GO = (REASON == 0 && STEPS < limit). limit as sg_stop_begin's;
 * rule->nonfinite_steps >= 0; rule->target_loss finite when rule->use_target. The rule is
 * copied: a captured graph keeps the values it was recorded with. One launch on CUDA. */
sg_status sg_stop_check(sg_ctx *ctx, sg_tensor *state, const sg_tensor *loss, int32_t limit,
                        const sg_stop_rule *rule);

/* The reference, arguments already checked: s is the state's SG_STOP_STATE elements. */
void sg_stop_begin_cpu(int32_t *s, int32_t limit);
void sg_stop_check_cpu(int32_t *s, float loss, int32_t limit, sg_stop_rule rule);

/* One block of one thread each. */
sg_status sg_stop_begin_cuda(sg_ctx *ctx, sg_tensor *state, int32_t limit);
sg_status sg_stop_check_cuda(sg_ctx *ctx, sg_tensor *state, const sg_tensor *loss, int32_t limit,
                             sg_stop_rule rule);

#ifdef __cplusplus
}
#endif
#endif
