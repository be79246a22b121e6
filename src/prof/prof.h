/* prof.h: a small profiler over CUPTI's activity API: it records every kernel, memcpy and
 * memset the GPU runs between sg_prof_start and sg_prof_stop, the CUDA runtime and driver calls
 * that queued them, and the context's named ranges ("step", "blocks.3.forward"); sums the
 * device work up (counts, GPU-busy time, span, short-kernel share), cuts a window into steps
 * (sg_prof_analyze) and writes a Perfetto trace (sg_prof_write_trace). Used by `stepgraph
 * bench`, `stepgraph trace`, the advisor and the tests.
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

/* One recorded activity: device work (kernel, memcpy, memset), a host API call that queued
 * or waited for work (CUPTI's runtime and driver API records), or a named host range
 * (sg_range_push/pop: "step", "blocks.3.forward"). All on CUPTI's clock. */
typedef enum sg_prof_kind {
    SG_PROF_KIND_KERNEL = 0,
    SG_PROF_KIND_MEMCPY,
    SG_PROF_KIND_MEMSET,
    SG_PROF_KIND_API,            /* host: a CUDA runtime or driver call */
    SG_PROF_KIND_RANGE           /* host: a named range */
} sg_prof_kind;

/* What an API record's call does, for the analysis (launch overhead) and the trace. */
typedef enum sg_prof_api {
    SG_PROF_API_OTHER = 0,
    SG_PROF_API_LAUNCH,          /* a kernel launch (cudaLaunchKernel, cuLaunchKernel[Ex], ...) */
    SG_PROF_API_GRAPH_LAUNCH,    /* cudaGraphLaunch / cuGraphLaunch */
    SG_PROF_API_MEMCPY,          /* cudaMemcpy*Async and the like */
    SG_PROF_API_MEMSET,
    SG_PROF_API_SYNC             /* a host wait: stream, event or device synchronize */
} sg_prof_api;

typedef struct sg_prof_record {
    sg_prof_kind kind;
    uint32_t device_id;
    uint32_t stream_id;          /* device records */
    uint32_t correlation_id;     /* links device activity to the API call that queued it (a
                                  * graph's kernels share the cudaGraphLaunch's id) */
    uint64_t start_ns, end_ns;   /* CUPTI timestamps; both 0 when CUPTI could not time it */
    uint32_t graph_id;           /* device work run by a graph launch: the graph's id; else 0 */
    uint32_t thread_id;          /* API and range records: the host thread (gettid) */
    sg_prof_api api;             /* API records */
    int depth;                   /* range records: nesting depth, 0 outermost. API records:
                                  * 0, or 1 (2, ...) for a call made inside another call on the
                                  * same thread, i.e. its implementation (cudaLaunchKernel's own
                                  * cuLaunchKernel); launches count at depth 0 only */
    const char *name;            /* kernel name as CUPTI gives it (mangled), API function name
                                  * as CUPTI names it ("cudaLaunchKernel_v7000"), "memcpy HtoD",
                                  * "memset", or range name (owned by the profiler and valid
                                  * until it is destroyed, or static; may be NULL) */
} sg_prof_record;

/* The class of a CUDA runtime or driver call from its CUPTI name: the base name (leading
 * underscores and the "_v7000" / "_ptsz" suffix dropped) matched exactly for launches, graph
 * launches and syncs ("cudaLaunchKernel", "__cudaLaunchKernel_v13000", "cuLaunchKernelEx_ptsz",
 * "cudaGraphLaunch", "cuCtxSynchronize"), by prefix for copies and sets ("cudaMemcpyAsync",
 * "cuMemsetD8Async"). NULL and everything else: SG_PROF_API_OTHER (cudaLaunchHostFunc too). */
sg_prof_api sg_prof_api_classify(const char *name);

/* Creates the process's profiler for ctx (a CUDA context). Registers the CUPTI buffer
 * callbacks; records nothing until sg_prof_start. Fails with SG_ERR_UNSUPPORTED on the CPU
 * backend or without CUPTI, and with SG_ERR_INVALID while another sg_prof exists. */
sg_status sg_prof_create(sg_ctx *ctx, sg_prof **out);
/* Stops recording if it is on (results discarded) and frees the profiler. */
void sg_prof_destroy(sg_prof *p);

/* Clears the previous window's records and enables kernel, memcpy, memset, runtime and driver
 * API activity, and records the context's named ranges (it sets ctx's range hook). */
sg_status sg_prof_start(sg_prof *p);
/* Waits for the context's stream, disables the activity kinds, flushes CUPTI's buffers, marks
 * calls made inside calls (sg_prof_mark_nested) and sums up the window into *out (may be
 * NULL: records only). A host sync. */
sg_status sg_prof_stop(sg_prof *p, sg_prof_result *out);

/* The last window's records, in delivery order (valid until the next start or destroy). */
const sg_prof_record *sg_prof_records(const sg_prof *p, size_t *n);

/* Sums records into a result (what sg_prof_stop does); pure, so tests can drive it. */
void sg_prof_summarize(const sg_prof_record *r, size_t n, sg_prof_result *out);

/* Total length of the union of the intervals [start_us[i], end_us[i]]: overlaps and nested
 * intervals count once, gaps not at all. Order does not matter (a copy is sorted); intervals
 * with end < start are empty. Returns 0 for n == 0, NAN if the copy cannot be allocated. */
double sg_interval_union_us(const double *start_us, const double *end_us, size_t n);

/* ---- per-step analysis: pure functions over records, so tests can drive them ---- */

/* Sets each API record's depth: the number of API calls on the same thread it lies inside.
 * Such a call is the enclosing call's implementation: cudaLaunchKernel calling cuLaunchKernel,
 * which CUPTI may report as a driver record with its own correlation id. Launches count at
 * depth 0 only, so each counts once whichever record the kernel's correlation id names; driver
 * calls made directly (cuBLAS launches its kernels through the driver API) stay at 0. What
 * sg_prof_stop does; returns SG_OK, SG_ERR_NULL or SG_ERR_OOM. */
sg_status sg_prof_mark_nested(sg_prof_record *r, size_t n);

/* Device idle gaps by length, in microseconds: bin i holds gaps in [edge[i], edge[i+1]), the
 * last bin everything from its edge up. */
#define SG_PROF_GAP_BINS 8
extern const double sg_prof_gap_edges_us[SG_PROF_GAP_BINS]; /* 0, 1, 2, 5, 10, 20, 50, 100 */

/* The gaps between the union of the intervals (the idle stretches inside [min start, max end])
 * counted into hist (zeroed first); returns the summed idle time. Empty and inverted intervals
 * are ignored. */
double sg_prof_gap_histogram(const double *start_us, const double *end_us, size_t n,
                             uint64_t hist[SG_PROF_GAP_BINS]);

/* One step, as the records of a window show it. Steps are the outermost "step" ranges (a "step"
 * inside another is not one), in time order. An API call belongs to the step whose range holds
 * its start; device work belongs to the step of the API call with its correlation id (device
 * work without one in any step, and calls outside every step, belong to none). Launches count
 * at depth 0 only. Device times are over the step's own device records. */
typedef struct sg_prof_step {
    double host_us;              /* the step range's length on the host */
    uint64_t kernels;            /* device kernels of the step (a graph's count one each) */
    uint64_t launch_calls;       /* kernel launch API calls (depth 0) */
    uint64_t graph_launches;     /* graph launch API calls */
    double launch_host_us;       /* host time inside launch and graph-launch calls */
    double device_us;            /* first device start to last device end of the step */
    double busy_us;              /* union of the step's device activity */
    double idle_us;              /* device_us - busy_us: gaps between the step's activity */
    double short_kernel_share;   /* share of timed kernels shorter than SG_PROF_SHORT_KERNEL_US */
    double launch_share;         /* launch_host_us / host_us: launch overhead's share */
    uint64_t gap_hist[SG_PROF_GAP_BINS];
} sg_prof_step;

/* Cuts records (in any order) into steps: fills up to max_steps entries of steps (may be NULL
 * when max_steps is 0), *n_steps the number found (even when more than max_steps). Returns
 * SG_OK, SG_ERR_NULL, or SG_ERR_OOM. */
sg_status sg_prof_analyze(const sg_prof_record *r, size_t n, sg_prof_step *steps, int max_steps,
                          int *n_steps);

/* ---- trace export ---- */

/* Writes records as a Chrome trace-event JSON file ({"traceEvents": [...]}) that Perfetto and
 * chrome://tracing open: process 1 "host" with one track per thread (API calls, named ranges
 * nested by time), process 2 + device id "GPU n" with one track per stream (kernels, copies,
 * sets), times in microseconds from the first record, every span a complete event ("ph": "X")
 * with "ts", "dur", "pid", "tid" and "name", plus track-name metadata. "args" hold the
 * correlation id, the graph id of graph-launched work, an API call's class and depth, a
 * range's depth, and a kernel's mangled name where the shown name is shortened ("fill_kernel",
 * "cutlass::Kernel2<...>"). API names drop CUPTI's version suffix. Untimed records are left
 * out. Returns SG_ERR_IO (with a message on ctx, which may be NULL) when the file cannot be
 * written, leaving no partial file. */
sg_status sg_prof_write_trace(sg_ctx *ctx, const sg_prof_record *r, size_t n, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* SG_PROF_H */
