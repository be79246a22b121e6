/* stop_cpu.c: the reference of the early-stop rule (stop.h) on the state's int32 elements, in
 * the kernel's order of decisions: the counters, the streak, the reason (NONFINITE before
 * TARGET, only while none is set), then GO. */
#include "ops/stop.h"

#include <math.h>

static int32_t add1_saturating(int32_t v) { return v == INT32_MAX ? v : v + 1; }

void sg_stop_begin_cpu(int32_t *s, int32_t limit)
{
    s[SG_STOP_STEPS] = 0;
    s[SG_STOP_GO] = s[SG_STOP_REASON] == SG_STOP_NONE && limit > 0;
}

void sg_stop_check_cpu(int32_t *s, float loss, int32_t limit, sg_stop_rule rule)
{
    s[SG_STOP_STEPS] = add1_saturating(s[SG_STOP_STEPS]);
    s[SG_STOP_TOTAL] = add1_saturating(s[SG_STOP_TOTAL]);
    s[SG_STOP_STREAK] = isfinite(loss) ? 0 : add1_saturating(s[SG_STOP_STREAK]);
    if (s[SG_STOP_REASON] == SG_STOP_NONE) {
        if (rule.nonfinite_steps > 0 && s[SG_STOP_STREAK] >= rule.nonfinite_steps)
            s[SG_STOP_REASON] = SG_STOP_NONFINITE;
        else if (rule.use_target && loss <= rule.target_loss) /* false for NaN */
            s[SG_STOP_REASON] = SG_STOP_TARGET;
    }
    s[SG_STOP_GO] = s[SG_STOP_REASON] == SG_STOP_NONE && s[SG_STOP_STEPS] < limit;
}
