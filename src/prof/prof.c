/* prof.c: the profiler's pure arithmetic, compiled in every build: interval union and idle-gap
 * histogram, summing a window's device records into a result, and cutting a window into steps
 * (per-step launches, GPU-busy and idle time). Also the fallbacks of sg_prof_* for builds
 * without CUPTI, which fail with SG_ERR_UNSUPPORTED. The CUPTI implementation is prof_cupti.c,
 * the trace export trace.c. */
#include "core/core.h"
#include "prof/prof.h"

#include <math.h>
#include <stdlib.h>

const double sg_prof_gap_edges_us[SG_PROF_GAP_BINS] = {0, 1, 2, 5, 10, 20, 50, 100};

typedef struct interval {
    double s, e;
} interval;

static int interval_by_start(const void *a, const void *b)
{
    double x = ((const interval *)a)->s, y = ((const interval *)b)->s;
    return (x > y) - (x < y);
}

/* The union of the intervals as disjoint runs sorted by start (malloc'd; *m of them), or NULL
 * with *m = 0 when no interval is non-empty. Sets *oom when the copy cannot be allocated. */
static interval *union_runs(const double *start_us, const double *end_us, size_t n, size_t *m,
                            bool *oom)
{
    *m = 0;
    *oom = false;
    if (n == 0) return NULL;
    interval *v = malloc(n * sizeof *v);
    if (!v) {
        *oom = true;
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) /* empty, inverted and NaN intervals add nothing */
        if (end_us[i] > start_us[i]) v[k++] = (interval){start_us[i], end_us[i]};
    if (k == 0) {
        free(v);
        return NULL;
    }
    qsort(v, k, sizeof *v, interval_by_start);
    /* Sweep by start: extend the current run while the next interval touches it. */
    size_t r = 0;
    for (size_t i = 1; i < k; i++) {
        if (v[i].s <= v[r].e) {
            if (v[i].e > v[r].e) v[r].e = v[i].e;
        } else {
            v[++r] = v[i];
        }
    }
    *m = r + 1;
    return v;
}

double sg_interval_union_us(const double *start_us, const double *end_us, size_t n)
{
    if (n == 0) return 0.0;
    if (!start_us || !end_us) return NAN;
    size_t m;
    bool oom;
    interval *v = union_runs(start_us, end_us, n, &m, &oom);
    if (oom) return NAN;
    double total = 0.0;
    for (size_t i = 0; i < m; i++) total += v[i].e - v[i].s;
    free(v);
    return total;
}

double sg_prof_gap_histogram(const double *start_us, const double *end_us, size_t n,
                             uint64_t hist[SG_PROF_GAP_BINS])
{
    memset(hist, 0, SG_PROF_GAP_BINS * sizeof *hist);
    if (n == 0) return 0.0;
    if (!start_us || !end_us) return NAN;
    size_t m;
    bool oom;
    interval *v = union_runs(start_us, end_us, n, &m, &oom);
    if (oom) return NAN;
    double idle = 0.0;
    for (size_t i = 1; i < m; i++) { /* runs are disjoint and sorted: each gap is > 0 */
        double gap = v[i].s - v[i - 1].e;
        int b = SG_PROF_GAP_BINS - 1;
        while (b > 0 && gap < sg_prof_gap_edges_us[b]) b--;
        hist[b]++;
        idle += gap;
    }
    free(v);
    return idle;
}

static bool record_timed(const sg_prof_record *r)
{
    return !(r->start_ns == 0 && r->end_ns == 0) && r->end_ns >= r->start_ns;
}

/* Device work (kernels, copies, sets), as opposed to host API calls and named ranges. */
static bool record_on_device(const sg_prof_record *r)
{
    switch (r->kind) {
    case SG_PROF_KIND_KERNEL:
    case SG_PROF_KIND_MEMCPY:
    case SG_PROF_KIND_MEMSET: return true;
    case SG_PROF_KIND_API:
    case SG_PROF_KIND_RANGE: return false;
    }
    return false;
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
        case SG_PROF_KIND_API:
        case SG_PROF_KIND_RANGE: continue; /* host records: not GPU-busy time */
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
        if (!record_on_device(&r[i]) || !record_timed(&r[i])) continue;
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

sg_prof_api sg_prof_api_classify(const char *name)
{
    static const struct {
        const char *base;
        sg_prof_api api;
    } exact[] = {
        {"cudaLaunchKernel", SG_PROF_API_LAUNCH},
        {"cudaLaunchKernelExC", SG_PROF_API_LAUNCH},
        {"cudaLaunchCooperativeKernel", SG_PROF_API_LAUNCH},
        {"cudaLaunchCooperativeKernelMultiDevice", SG_PROF_API_LAUNCH},
        {"cudaLaunch", SG_PROF_API_LAUNCH},
        {"cuLaunchKernel", SG_PROF_API_LAUNCH},
        {"cuLaunchKernelEx", SG_PROF_API_LAUNCH},
        {"cuLaunchCooperativeKernel", SG_PROF_API_LAUNCH},
        {"cuLaunchCooperativeKernelMultiDevice", SG_PROF_API_LAUNCH},
        {"cuLaunch", SG_PROF_API_LAUNCH},
        {"cuLaunchGrid", SG_PROF_API_LAUNCH},
        {"cuLaunchGridAsync", SG_PROF_API_LAUNCH},
        {"cudaGraphLaunch", SG_PROF_API_GRAPH_LAUNCH},
        {"cuGraphLaunch", SG_PROF_API_GRAPH_LAUNCH},
        {"cudaStreamSynchronize", SG_PROF_API_SYNC},
        {"cudaDeviceSynchronize", SG_PROF_API_SYNC},
        {"cudaEventSynchronize", SG_PROF_API_SYNC},
        {"cudaThreadSynchronize", SG_PROF_API_SYNC},
        {"cuStreamSynchronize", SG_PROF_API_SYNC},
        {"cuCtxSynchronize", SG_PROF_API_SYNC},
        {"cuEventSynchronize", SG_PROF_API_SYNC},
    };
    static const struct {
        const char *prefix;
        sg_prof_api api;
    } prefix[] = {
        {"cudaMemcpy", SG_PROF_API_MEMCPY},
        {"cuMemcpy", SG_PROF_API_MEMCPY},
        {"cudaMemset", SG_PROF_API_MEMSET},
        {"cuMemset", SG_PROF_API_MEMSET},
    };
    if (!name) return SG_PROF_API_OTHER;
    while (*name == '_') name++;
    size_t len = strcspn(name, "_"); /* CUDA's names have no '_' but the suffix's */
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        if (strlen(exact[i].base) == len && !strncmp(name, exact[i].base, len)) return exact[i].api;
    for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++)
        if (!strncmp(name, prefix[i].prefix, strlen(prefix[i].prefix))) return prefix[i].api;
    return SG_PROF_API_OTHER;
}

/* ---- calls inside calls ---- */

typedef struct api_span {
    uint32_t thread;
    uint64_t s, e;
    size_t index;
} api_span;

/* By thread, then start; at equal starts the longer (the enclosing call) first. */
static int api_span_order(const void *a, const void *b)
{
    const api_span *x = a, *y = b;
    if (x->thread != y->thread) return (x->thread > y->thread) - (x->thread < y->thread);
    if (x->s != y->s) return (x->s > y->s) - (x->s < y->s);
    return (x->e < y->e) - (x->e > y->e);
}

sg_status sg_prof_mark_nested(sg_prof_record *r, size_t n)
{
    if (n && !r) return SG_ERR_NULL;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) m += r[i].kind == SG_PROF_KIND_API;
    if (m == 0) return SG_OK;
    api_span *v = malloc(m * sizeof *v);
    size_t *open = malloc(m * sizeof *open); /* the calls enclosing the current one */
    if (!v || !open) {
        free(v);
        free(open);
        return SG_ERR_OOM;
    }
    m = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].kind != SG_PROF_KIND_API) continue;
        r[i].depth = 0;
        if (record_timed(&r[i])) v[m++] = (api_span){r[i].thread_id, r[i].start_ns, r[i].end_ns, i};
    }
    qsort(v, m, sizeof *v, api_span_order);
    size_t depth = 0;
    for (size_t i = 0; i < m; i++) {
        if (i && v[i].thread != v[i - 1].thread) depth = 0;
        /* Close the calls this one does not lie inside (ended, or overlapping it only partly). */
        while (depth && (v[i].s >= v[open[depth - 1]].e || v[i].e > v[open[depth - 1]].e)) depth--;
        r[v[i].index].depth = (int)depth;
        open[depth++] = i;
    }
    free(v);
    free(open);
    return SG_OK;
}

/* ---- per-step analysis ---- */

typedef struct step_range {
    uint64_t s, e;
} step_range;

/* A correlation id and the step its API call lies in. */
typedef struct corr_step {
    uint32_t corr;
    int step;
} corr_step;

/* Sorted by start; at equal starts the longer first, so an enclosing range precedes those it
 * holds. */
static int step_by_start(const void *a, const void *b)
{
    const step_range *x = a, *y = b;
    if (x->s != y->s) return (x->s > y->s) - (x->s < y->s);
    return (x->e < y->e) - (x->e > y->e);
}

static int corr_by_id(const void *a, const void *b)
{
    uint32_t x = ((const corr_step *)a)->corr, y = ((const corr_step *)b)->corr;
    return (x > y) - (x < y);
}

/* The step whose range holds host time t, or -1. Steps are sorted and disjoint. */
static int step_at(const step_range *st, int n, uint64_t t)
{
    int lo = 0, hi = n - 1, k = -1;
    while (lo <= hi) { /* the last step starting at or before t */
        int mid = lo + (hi - lo) / 2;
        if (st[mid].s <= t) k = mid, lo = mid + 1;
        else hi = mid - 1;
    }
    return k >= 0 && t <= st[k].e ? k : -1;
}

static int step_of_corr(const corr_step *map, size_t n, uint32_t corr)
{
    corr_step key = {corr, 0};
    const corr_step *hit = bsearch(&key, map, n, sizeof *map, corr_by_id);
    return hit ? hit->step : -1;
}

/* Busy, idle, span and gap histogram of one step's device intervals (us). */
static sg_status step_device_time(const double *s, const double *e, size_t n, sg_prof_step *out)
{
    if (n == 0) return SG_OK;
    double lo = s[0], hi = e[0];
    for (size_t i = 1; i < n; i++) {
        if (s[i] < lo) lo = s[i];
        if (e[i] > hi) hi = e[i];
    }
    out->device_us = hi - lo;
    out->busy_us = sg_interval_union_us(s, e, n);
    double idle = sg_prof_gap_histogram(s, e, n, out->gap_hist);
    if (isnan(out->busy_us) || isnan(idle)) return SG_ERR_OOM;
    out->idle_us = out->device_us - out->busy_us;
    return SG_OK;
}

sg_status sg_prof_analyze(const sg_prof_record *r, size_t n, sg_prof_step *steps, int max_steps,
                          int *n_steps)
{
    if (!n_steps || (n && !r) || (max_steps > 0 && !steps)) return SG_ERR_NULL;
    *n_steps = 0;
    if (max_steps < 0) max_steps = 0;
    if (max_steps > 0) memset(steps, 0, (size_t)max_steps * sizeof *steps);
    if (n == 0) return SG_OK;
    step_range *st = malloc(n * sizeof *st);
    corr_step *map = malloc(n * sizeof *map);
    int *dev_step = malloc(n * sizeof *dev_step);
    double *ds = malloc(2 * n * sizeof *ds);
    sg_status status = SG_ERR_OOM;
    if (!st || !map || !dev_step || !ds) goto out;

    /* Steps: the outermost "step" ranges in time order (a "step" inside another is not one). */
    int ns = 0;
    uint64_t t0 = UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        if (!record_timed(&r[i])) continue;
        if (r[i].start_ns < t0) t0 = r[i].start_ns;
        if (r[i].kind == SG_PROF_KIND_RANGE && r[i].name && !strcmp(r[i].name, "step"))
            st[ns++] = (step_range){r[i].start_ns, r[i].end_ns};
    }
    qsort(st, (size_t)ns, sizeof *st, step_by_start);
    int kept = 0;
    for (int i = 0; i < ns; i++)
        if (kept == 0 || st[i].s > st[kept - 1].e || st[i].e > st[kept - 1].e) st[kept++] = st[i];
    ns = kept;
    *n_steps = ns;
    int filled = ns < max_steps ? ns : max_steps;
    for (int k = 0; k < filled; k++) steps[k].host_us = (double)(st[k].e - st[k].s) * 1e-3;

    /* API calls join the step whose range holds their start; launches count once (depth 0:
     * a driver call made inside a runtime call is that call's implementation). */
    size_t nmap = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].kind != SG_PROF_KIND_API || !record_timed(&r[i])) continue;
        int k = step_at(st, ns, r[i].start_ns);
        if (k < 0) continue;
        map[nmap++] = (corr_step){r[i].correlation_id, k};
        if (k >= filled || r[i].depth != 0) continue;
        double us = (double)(r[i].end_ns - r[i].start_ns) * 1e-3;
        if (r[i].api == SG_PROF_API_LAUNCH) steps[k].launch_calls++, steps[k].launch_host_us += us;
        if (r[i].api == SG_PROF_API_GRAPH_LAUNCH)
            steps[k].graph_launches++, steps[k].launch_host_us += us;
    }
    qsort(map, nmap, sizeof *map, corr_by_id);

    /* Device work joins the step of the API call that queued it (same correlation id). Per
     * step: timed device records, timed kernels, short kernels; then the records' intervals
     * are laid out step by step in ds (starts) and de (ends). */
    size_t *cnt = calloc(3 * ((size_t)filled + 1), sizeof *cnt);
    if (!cnt) goto out;
    size_t *timed_kernels = cnt + filled + 1, *short_kernels = timed_kernels + filled + 1;
    for (size_t i = 0; i < n; i++) {
        dev_step[i] = -1;
        if (!record_on_device(&r[i])) continue;
        int k = step_of_corr(map, nmap, r[i].correlation_id);
        if (k < 0 || k >= filled) continue;
        dev_step[i] = k;
        if (r[i].kind == SG_PROF_KIND_KERNEL) steps[k].kernels++;
        if (!record_timed(&r[i])) continue;
        cnt[k + 1]++;
        if (r[i].kind == SG_PROF_KIND_KERNEL) {
            timed_kernels[k]++;
            if ((double)(r[i].end_ns - r[i].start_ns) * 1e-3 < SG_PROF_SHORT_KERNEL_US)
                short_kernels[k]++;
        }
    }
    for (int k = 0; k < filled; k++) cnt[k + 1] += cnt[k]; /* cnt[k]: step k's first slot */
    double *de = ds + n;
    for (size_t i = 0; i < n; i++) {
        if (dev_step[i] < 0 || !record_timed(&r[i])) continue;
        size_t at = cnt[dev_step[i]]++;
        ds[at] = (double)(r[i].start_ns - t0) * 1e-3;
        de[at] = (double)(r[i].end_ns - t0) * 1e-3;
    }
    /* cnt[k] is now step k's end, so step k's intervals are [cnt[k-1], cnt[k]). */
    status = SG_OK;
    for (int k = 0; k < filled && status == SG_OK; k++) {
        size_t from = k ? cnt[k - 1] : 0;
        status = step_device_time(ds + from, de + from, cnt[k] - from, &steps[k]);
        steps[k].short_kernel_share =
            timed_kernels[k] ? (double)short_kernels[k] / (double)timed_kernels[k] : 0.0;
        steps[k].launch_share =
            steps[k].host_us > 0 ? steps[k].launch_host_us / steps[k].host_us : 0.0;
    }
    free(cnt);
out:
    free(st);
    free(map);
    free(dev_step);
    free(ds);
    return status;
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

/* ---- device time by op family ---- */

const char *sg_prof_family_marker(sg_work_family f)
{
    static const char *const names[SG_WORK_FAMILIES] = {"work:matmul", "work:attention", "work:conv", "work:norm",
                                                        "work:elementwise", "work:loss", "work:optimizer"};
    return f >= 0 && f < SG_WORK_FAMILIES ? names[f] : NULL;
}

/* A point on a thread's timeline: a family marker (family >= 0) or a step's start (-1). */
typedef struct mark {
    uint32_t thread;
    uint64_t t;
    int family;
} mark;

static int mark_cmp(const void *a, const void *b)
{
    const mark *x = a, *y = b;
    if (x->thread != y->thread) return x->thread < y->thread ? -1 : 1;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->family < y->family ? -1 : x->family > y->family; /* a step's start before a marker at its time */
}

static int api_by_corr(const void *a, const void *b)
{
    const sg_prof_record *x = *(const sg_prof_record *const *)a, *y = *(const sg_prof_record *const *)b;
    if (x->correlation_id != y->correlation_id) return x->correlation_id < y->correlation_id ? -1 : 1;
    return x->depth - y->depth; /* the outermost call of an id first */
}

/* The family in force at time t on thread th: the last point at or before t, when it is a
 * marker (a step's start resets it); -1 otherwise. */
static int family_at(const mark *m, size_t n, uint32_t th, uint64_t t)
{
    size_t lo = 0, hi = n; /* first point after (th, t) */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m[mid].thread < th || (m[mid].thread == th && m[mid].t <= t)) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0 || m[lo - 1].thread != th) return -1;
    return m[lo - 1].family;
}

sg_status sg_prof_family_us(const sg_prof_record *r, size_t n, double out_us[SG_WORK_FAMILIES + 1])
{
    if (!out_us || (n && !r)) return SG_ERR_NULL;
    for (int k = 0; k <= SG_WORK_FAMILIES; k++) out_us[k] = 0;
    if (n == 0) return SG_OK;
    mark *m = malloc(n * sizeof *m);
    const sg_prof_record **api = malloc(n * sizeof *api);
    if (!m || !api) {
        free(m), free(api);
        return SG_ERR_OOM;
    }
    size_t nm = 0, na = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].kind == SG_PROF_KIND_API && record_timed(&r[i])) api[na++] = &r[i];
        if (r[i].kind != SG_PROF_KIND_RANGE || !r[i].name) continue;
        if (!strcmp(r[i].name, "step")) m[nm++] = (mark){r[i].thread_id, r[i].start_ns, -1};
        else if (!strncmp(r[i].name, "work:", 5))
            for (int k = 0; k < SG_WORK_FAMILIES; k++)
                if (!strcmp(r[i].name, sg_prof_family_marker((sg_work_family)k))) m[nm++] = (mark){r[i].thread_id, r[i].start_ns, k};
    }
    qsort(m, nm, sizeof *m, mark_cmp);
    qsort(api, na, sizeof *api, api_by_corr);
    for (size_t i = 0; i < n; i++) {
        const sg_prof_record *d = &r[i];
        if ((d->kind != SG_PROF_KIND_KERNEL && d->kind != SG_PROF_KIND_MEMCPY && d->kind != SG_PROF_KIND_MEMSET) ||
            !record_timed(d))
            continue;
        double us = (double)(d->end_ns - d->start_ns) * 1e-3;
        size_t lo = 0, hi = na; /* the first API record with this correlation id */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (api[mid]->correlation_id < d->correlation_id) lo = mid + 1;
            else hi = mid;
        }
        int k = -1;
        if (lo < na && api[lo]->correlation_id == d->correlation_id && api[lo]->api != SG_PROF_API_GRAPH_LAUNCH &&
            d->graph_id == 0)
            k = family_at(m, nm, api[lo]->thread_id, api[lo]->start_ns);
        out_us[k >= 0 ? k : SG_WORK_FAMILIES] += us;
    }
    free(m), free(api);
    return SG_OK;
}
