/* prof.h: a small device-activity profiler over CUPTI's activity API: it records every kernel,
 * memcpy and memset the GPU runs between sg_prof_start and sg_prof_stop and sums them up
 * (counts, GPU-busy time, span, short-kernel share). Used by `stepgraph bench` and the tests.
 *
 *     sg_prof *p;
 *     if (sg_prof_create(ctx, &p) != SG_OK) { puts(sg_ctx_last_error(ctx)); ... }
 *     sg_prof_start(p);
 *     for (...) run_step();
 *     sg_prof_result r;
 *     sg_prof_stop(p, &r);          // syncs the context, flushes CUPTI, fills r
 *     printf("%llu kernels, busy %.1f us of %.1f us\n", r.kernels, r.busy_us, r.span_us);
 *     sg_prof_destroy(p);
 *
 * CUPTI is process-global: it sees every kernel of the process (all contexts, all streams),
 * and only one sg_prof may exist at a time. On the CPU backend, or in a build without CUDA or
 * CUPTI, sg_prof_create fails with SG_ERR_UNSUPPORTED. Call a profiler's functions from one
 * thread, and destroy it before its context. */
#ifndef SG_PROF_H
#define SG_PROF_H

#include "stepgraph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sg_prof sg_prof;

/* What one start/stop window saw. Times are microseconds of device time. */
typedef struct sg_prof_result {
    uint64_t kernels;            /* kernel executions (graph-replayed kernels count one each) */
    uint64_t memcpys;
    uint64_t memsets;
    double busy_us;              /* union of all activity intervals: time the GPU did anything */
    double span_us;              /* first activity's start to last activity's end */
    double kernel_us_sum;        /* sum of kernel durations (overlapping kernels count twice) */
    double short_kernel_share;   /* share of timed kernels shorter than SG_PROF_SHORT_KERNEL_US */
    uint64_t dropped;            /* records CUPTI dropped (no buffer space): then the numbers
                                  * above undercount; 0 in a sound run */
} sg_prof_result;

#define SG_PROF_SHORT_KERNEL_US 50.0

/* One device activity, as recorded (for a later trace export or per-kernel report). */
typedef enum sg_prof_kind {
    SG_PROF_KIND_KERNEL = 0,
    SG_PROF_KIND_MEMCPY,
    SG_PROF_KIND_MEMSET
} sg_prof_kind;

typedef struct sg_prof_record {
    sg_prof_kind kind;
    uint32_t device_id;
    uint32_t stream_id;
    uint32_t correlation_id;     /* links the activity to the API call that queued it */
    uint64_t start_ns, end_ns;   /* CUPTI timestamps; both 0 when CUPTI could not time it */
} sg_prof_record;

/* Creates the process's profiler for ctx (a CUDA context). Registers the CUPTI buffer
 * callbacks; records nothing until sg_prof_start. Fails with SG_ERR_UNSUPPORTED on the CPU
 * backend or without CUPTI, and with SG_ERR_INVALID while another sg_prof exists. */
sg_status sg_prof_create(sg_ctx *ctx, sg_prof **out);
/* Stops recording if it is on (results discarded) and frees the profiler. */
void sg_prof_destroy(sg_prof *p);

/* Clears the previous window's records and enables kernel, memcpy and memset activity. */
sg_status sg_prof_start(sg_prof *p);
/* Waits for the context's stream, disables the activity kinds, flushes CUPTI's buffers and
 * sums up the window into *out (may be NULL: records only). A host sync. */
sg_status sg_prof_stop(sg_prof *p, sg_prof_result *out);

/* The last window's records, in delivery order (valid until the next start or destroy). */
const sg_prof_record *sg_prof_records(const sg_prof *p, size_t *n);

/* Sums records into a result (what sg_prof_stop does); pure, so tests can drive it. */
void sg_prof_summarize(const sg_prof_record *r, size_t n, sg_prof_result *out);

/* Total length of the union of the intervals [start_us[i], end_us[i]]: overlaps and nested
 * intervals count once, gaps not at all. Order does not matter (a copy is sorted); intervals
 * with end < start are empty. Returns 0 for n == 0, NAN if the copy cannot be allocated. */
double sg_interval_union_us(const double *start_us, const double *end_us, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* SG_PROF_H */
