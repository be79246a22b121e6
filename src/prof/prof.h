/* prof.h: the profiler's internals. The public calls (sg_prof_create/start/stop/records,
 * sg_prof_analyze, sg_prof_write_trace) and the record, result and step structs are in
 * stepgraph.h; here are the pure pieces they are built from, which prof_cupti.c and prof.c
 * share and tests/test_prof.c drives with synthetic records. */
#ifndef SG_PROF_H
#define SG_PROF_H

#include "stepgraph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The class of a CUDA runtime or driver call from its CUPTI name: the base name (leading
 * underscores and the "_v7000" / "_ptsz" suffix dropped) matched exactly for launches, graph
 * launches and syncs ("cudaLaunchKernel", "__cudaLaunchKernel_v13000", "cuLaunchKernelEx_ptsz",
 * "cudaGraphLaunch", "cuCtxSynchronize"), by prefix for copies and sets ("cudaMemcpyAsync",
 * "cuMemsetD8Async"). NULL and everything else: SG_PROF_API_OTHER (cudaLaunchHostFunc too). */
sg_prof_api sg_prof_api_classify(const char *name);

/* Sums records into a result (what sg_prof_stop does). */
void sg_prof_summarize(const sg_prof_record *r, size_t n, sg_prof_result *out);

/* Total length of the union of the intervals [start_us[i], end_us[i]]: overlaps and nested
 * intervals count once, gaps not at all. Order does not matter (a copy is sorted); intervals
 * with end < start are empty. Returns 0 for n == 0, NAN if the copy cannot be allocated. */
double sg_interval_union_us(const double *start_us, const double *end_us, size_t n);

/* Sets each API record's depth: the number of API calls on the same thread it lies inside.
 * Such a call is the enclosing call's implementation: cudaLaunchKernel calling cuLaunchKernel,
 * which CUPTI may report as a driver record with its own correlation id. Launches count at
 * depth 0 only, so each counts once whichever record the kernel's correlation id names; driver
 * calls made directly (cuBLAS launches its kernels through the driver API) stay at 0. What
 * sg_prof_stop does; returns SG_OK, SG_ERR_NULL or SG_ERR_OOM. */
sg_status sg_prof_mark_nested(sg_prof_record *r, size_t n);

/* The gaps between the union of the intervals (the idle stretches inside [min start, max end])
 * counted into hist (zeroed first, bins as sg_prof_gap_edges_us); returns the summed idle
 * time. Empty and inverted intervals are ignored. */
double sg_prof_gap_histogram(const double *start_us, const double *end_us, size_t n,
                             uint64_t hist[SG_PROF_GAP_BINS]);

#ifdef __cplusplus
}
#endif
#endif /* SG_PROF_H */
