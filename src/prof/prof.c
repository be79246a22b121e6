/* prof.c: the profiler's pure arithmetic (interval union, summing records into a result),
 * compiled in every build, and the fallbacks of sg_prof_* for builds without CUPTI, which
 * fail with SG_ERR_UNSUPPORTED. The CUPTI implementation is prof_cupti.c. */
#include "core/core.h"
#include "prof/prof.h"

#include <math.h>
#include <stdlib.h>

typedef struct interval {
    double s, e;
} interval;

static int interval_by_start(const void *a, const void *b)
{
    double x = ((const interval *)a)->s, y = ((const interval *)b)->s;
    return (x > y) - (x < y);
}

double sg_interval_union_us(const double *start_us, const double *end_us, size_t n)
{
    if (n == 0) return 0.0;
    if (!start_us || !end_us) return NAN;
    interval *v = malloc(n * sizeof *v);
    if (!v) return NAN;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) /* empty, inverted and NaN intervals add nothing */
        if (end_us[i] > start_us[i]) v[m++] = (interval){start_us[i], end_us[i]};
    if (m == 0) {
        free(v);
        return 0.0;
    }
    qsort(v, m, sizeof *v, interval_by_start);
    /* Sweep by start: extend the current run while the next interval touches it. */
    double total = 0.0, cs = v[0].s, ce = v[0].e;
    for (size_t i = 1; i < m; i++) {
        if (v[i].s <= ce) {
            if (v[i].e > ce) ce = v[i].e;
        } else {
            total += ce - cs;
            cs = v[i].s;
            ce = v[i].e;
        }
    }
    total += ce - cs;
    free(v);
    return total;
}

static int record_timed(const sg_prof_record *r)
{
    return !(r->start_ns == 0 && r->end_ns == 0) && r->end_ns >= r->start_ns;
}

void sg_prof_summarize(const sg_prof_record *r, size_t n, sg_prof_result *out)
{
    memset(out, 0, sizeof *out);
    uint64_t t0 = UINT64_MAX, t1 = 0;
    size_t timed = 0;
    for (size_t i = 0; i < n; i++) {
        switch (r[i].kind) {
        case SG_PROF_KIND_KERNEL: out->kernels++; break;
        case SG_PROF_KIND_MEMCPY: out->memcpys++; break;
        case SG_PROF_KIND_MEMSET: out->memsets++; break;
        }
        if (!record_timed(&r[i])) continue;
        timed++;
        if (r[i].start_ns < t0) t0 = r[i].start_ns;
        if (r[i].end_ns > t1) t1 = r[i].end_ns;
    }
    if (timed == 0) return;
    /* Timestamps are ~1e18 ns: subtract the first start before going to double, whose 53-bit
     * mantissa would otherwise round them to ~100 ns. */
    double *s = malloc(2 * timed * sizeof *s);
    if (!s) {
        out->busy_us = NAN;
        return;
    }
    double *e = s + timed;
    size_t k = 0, timed_kernels = 0, short_kernels = 0;
    for (size_t i = 0; i < n; i++) {
        if (!record_timed(&r[i])) continue;
        s[k] = (double)(r[i].start_ns - t0) * 1e-3;
        e[k] = (double)(r[i].end_ns - t0) * 1e-3;
        if (r[i].kind == SG_PROF_KIND_KERNEL) {
            double d = (double)(r[i].end_ns - r[i].start_ns) * 1e-3;
            out->kernel_us_sum += d;
            timed_kernels++;
            if (d < SG_PROF_SHORT_KERNEL_US) short_kernels++;
        }
        k++;
    }
    out->busy_us = sg_interval_union_us(s, e, timed);
    out->span_us = (double)(t1 - t0) * 1e-3;
    out->short_kernel_share = timed_kernels ? (double)short_kernels / (double)timed_kernels : 0.0;
    free(s);
}

#ifndef SG_HAVE_CUPTI
/* No CUPTI in this build: there is no sg_prof object to make, so every entry point fails. */

sg_status sg_prof_create(sg_ctx *ctx, sg_prof **out)
{
    if (out) *out = NULL;
    if (!ctx) return sg_fail(NULL, SG_ERR_NULL, "sg_prof_create: ctx is NULL");
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "sg_prof_create: out is NULL");
    if (ctx->backend != SG_BACKEND_CUDA)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "sg_prof_create: the %s backend has no device activity to profile; the "
                       "profiler needs a CUDA context",
                       sg_backend_name(ctx->backend));
    return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                   "sg_prof_create: this build of stepgraph has no CUPTI (CMake did not find "
                   "CUDA::cupti when it was configured), so device activity cannot be traced");
}

void sg_prof_destroy(sg_prof *p) { (void)p; }
sg_status sg_prof_start(sg_prof *p) { return p ? SG_ERR_UNSUPPORTED : SG_ERR_NULL; }
sg_status sg_prof_stop(sg_prof *p, sg_prof_result *out)
{
    if (out) memset(out, 0, sizeof *out);
    return p ? SG_ERR_UNSUPPORTED : SG_ERR_NULL;
}

const sg_prof_record *sg_prof_records(const sg_prof *p, size_t *n)
{
    (void)p;
    if (n) *n = 0;
    return NULL;
}
#endif /* !SG_HAVE_CUPTI */
