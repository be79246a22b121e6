/* test_prof.c: the CUPTI profiler, per-step analysis and trace export. `cpu`: the interval
 * union and the idle-gap histogram on synthetic intervals whose answers are known (and the union
 * against a brute-force count on random integer intervals), summing of records, the API-call
 * classes, calls inside calls, per-step analysis of a synthetic window (two steps, a graph launch, nested driver
 * calls, records outside any step), a trace written and parsed back, and the clear refusal on
 * the CPU backend. `trace FILE`: writes the synthetic window's trace to FILE and prints what
 * tests/check_trace.py must find in it (tests/trace_test.sh runs both). `gpu`: windows of known
 * launches (fills, copies) against the runtime's own launch counter, launch calls counted once,
 * named ranges on CUPTI's clock, and trainer windows: eager steps and step-scope replays. The
 * profiler is public (stepgraph.h); its pure pieces are internal (prof/prof.h). */
#include "stepgraph.h"      /* the profiler: sg_prof_*, records, steps, traces */
#include "prof/prof.h"       /* its pure pieces: interval union, sums, call classes, nesting */
#include "testutil.h"

#include <unistd.h>

/* ---- cpu ---- */

static void check_union(const char *what, const double *s, const double *e, size_t n, double want)
{
    double got = sg_interval_union_us(s, e, n);
    TU_CHECK(fabs(got - want) <= 1e-12 * (1 + fabs(want)), "%s: union %.17g, expected %.17g", what,
             got, want);
}

static void cpu_union_known(void)
{
    check_union("empty", NULL, NULL, 0, 0.0);
    {
        double s[] = {1}, e[] = {3};
        check_union("one", s, e, 1, 2.0);
    }
    {
        double s[] = {0, 2, 5}, e[] = {1, 3, 10};
        check_union("gaps", s, e, 3, 1 + 1 + 5);
    }
    {
        double s[] = {0, 3}, e[] = {5, 8};
        check_union("overlap", s, e, 2, 8.0);
    }
    {
        double s[] = {0, 2, 4}, e[] = {10, 3, 9};
        check_union("nested", s, e, 3, 10.0);
    }
    {
        double s[] = {0, 1}, e[] = {1, 2};
        check_union("touching", s, e, 2, 2.0);
    }
    {
        /* [20,30] [0,5] [4,6] [25,40] [8,9] shuffled: runs [0,6] [8,9] [20,40]. */
        double s[] = {20, 0, 8, 25, 4}, e[] = {30, 5, 9, 40, 6};
        double s0[5], e0[5];
        memcpy(s0, s, sizeof s);
        memcpy(e0, e, sizeof e);
        check_union("unsorted", s, e, 5, 6 + 1 + 20);
        TU_CHECK(memcmp(s, s0, sizeof s) == 0 && memcmp(e, e0, sizeof e) == 0,
                 "sg_interval_union_us changed its inputs (it must sort a copy)");
    }
    {
        double s[] = {5, 1, 7}, e[] = {4, 1, 8}; /* inverted and zero-length add nothing */
        check_union("empty intervals", s, e, 3, 1.0);
    }
    {
        double s[] = {1e6, 1e6 + 0.25}, e[] = {1e6 + 0.5, 1e6 + 0.75}; /* fractions of a us */
        check_union("fractional", s, e, 2, 0.75);
    }
}

/* Random intervals with integer ends in [0, 1000): the union is the number of unit cells
 * covered, counted directly. */
static void cpu_union_random(void)
{
    enum { L = 1000 };
    for (int trial = 0; trial < 200; trial++) {
        int n = tu_randint(1, 60);
        double s[60], e[60];
        unsigned char cover[L] = {0};
        for (int i = 0; i < n; i++) {
            int a = tu_randint(0, L - 1), len = tu_randint(0, trial % 2 ? 30 : 300);
            int b = a + len < L ? a + len : L;
            s[i] = a;
            e[i] = b;
            for (int c = a; c < b; c++) cover[c] = 1;
        }
        double want = 0;
        for (int c = 0; c < L; c++) want += cover[c];
        char what[64];
        snprintf(what, sizeof what, "random trial %d (n=%d)", trial, n);
        check_union(what, s, e, (size_t)n, want);
    }
}

static void cpu_summarize(void)
{
    /* CUPTI-sized timestamps (~1.7e18 ns): the sums must keep nanoseconds. */
    const uint64_t T = 1700000000000000000ull;
    sg_prof_record r[] = {
        {.kind = SG_PROF_KIND_KERNEL, .stream_id = 7, .correlation_id = 1, .start_ns = T + 0,
         .end_ns = T + 10000},  /* 10 us, short */
        {.kind = SG_PROF_KIND_KERNEL, .stream_id = 7, .correlation_id = 2, .start_ns = T + 5000,
         .end_ns = T + 100000}, /* 95 us, overlaps the first */
        {.kind = SG_PROF_KIND_MEMCPY, .stream_id = 7, .correlation_id = 3, .start_ns = T + 200000,
         .end_ns = T + 210001}, /* 10.001 us, after a gap */
        {.kind = SG_PROF_KIND_MEMSET, .stream_id = 7, .correlation_id = 4}, /* untimed: counted only */
        {.kind = SG_PROF_KIND_KERNEL, .stream_id = 7, .correlation_id = 5, .start_ns = T + 210001,
         .end_ns = T + 210003}, /* 2 ns, touches the copy */
        /* Host records: neither counted nor part of busy time or span. */
        {.kind = SG_PROF_KIND_API, .correlation_id = 1, .start_ns = T - 50000, .end_ns = T + 900000,
         .api = SG_PROF_API_LAUNCH, .name = "cudaLaunchKernel_v7000"},
        {.kind = SG_PROF_KIND_RANGE, .start_ns = T - 90000, .end_ns = T + 990000, .name = "step"},
    };
    sg_prof_result out;
    sg_prof_summarize(r, sizeof r / sizeof *r, &out);
    TU_CHECK(out.kernels == 3 && out.memcpys == 1 && out.memsets == 1,
             "counts %llu/%llu/%llu, expected 3/1/1", (unsigned long long)out.kernels,
             (unsigned long long)out.memcpys, (unsigned long long)out.memsets);
    TU_CHECK(fabs(out.busy_us - (100.0 + 10.003)) < 1e-9, "busy %.9f, expected 110.003", out.busy_us);
    TU_CHECK(fabs(out.span_us - 210.003) < 1e-9, "span %.9f, expected 210.003", out.span_us);
    TU_CHECK(fabs(out.kernel_us_sum - (10 + 95 + 0.002)) < 1e-9, "kernel sum %.9f, expected 105.002",
             out.kernel_us_sum);
    TU_CHECK(fabs(out.short_kernel_share - 2.0 / 3.0) < 1e-12, "short share %.6f, expected 2/3",
             out.short_kernel_share);
    TU_CHECK(out.dropped == 0, "dropped %llu", (unsigned long long)out.dropped);

    sg_prof_summarize(NULL, 0, &out);
    TU_CHECK(out.kernels == 0 && out.busy_us == 0 && out.span_us == 0 && out.short_kernel_share == 0,
             "an empty window must sum to zeros");
}

static void cpu_gap_histogram(void)
{
    static const double edges[SG_PROF_GAP_BINS] = {0, 1, 2, 5, 10, 20, 50, 100};
    TU_CHECK(memcmp(sg_prof_gap_edges_us, edges, sizeof edges) == 0,
             "sg_prof_gap_edges_us is not 0, 1, 2, 5, 10, 20, 50, 100");
    /* Gaps 0.5, 1, 2, 4.9, 10, 20, 50, 99.9, 100, 1000: each edge lands in the bin it opens.
     * [0.5, 0.8] lies inside the first interval, [9, 8] is inverted: neither makes a gap. */
    double s[] = {0, 1.5, 3, 6, 11.9, 22, 43, 94, 194.9, 295, 1296, 0.5, 9};
    double e[] = {1, 2, 4, 7, 12, 23, 44, 95, 195, 296, 1297, 0.8, 8};
    uint64_t want[SG_PROF_GAP_BINS] = {1, 1, 2, 0, 1, 1, 2, 2}, hist[SG_PROF_GAP_BINS];
    double idle = sg_prof_gap_histogram(s, e, sizeof s / sizeof *s, hist);
    TU_CHECK(fabs(idle - 1288.3) < 1e-9, "gap histogram: idle %.9f, expected 1288.3", idle);
    for (int b = 0; b < SG_PROF_GAP_BINS; b++)
        TU_CHECK(hist[b] == want[b], "gap histogram: bin %d (from %g us) holds %llu, expected %llu",
                 b, sg_prof_gap_edges_us[b], (unsigned long long)hist[b],
                 (unsigned long long)want[b]);
    for (int b = 0; b < SG_PROF_GAP_BINS; b++) hist[b] = 99;
    idle = sg_prof_gap_histogram(NULL, NULL, 0, hist);
    uint64_t sum = 0;
    for (int b = 0; b < SG_PROF_GAP_BINS; b++) sum += hist[b];
    TU_CHECK(idle == 0 && sum == 0, "no intervals: idle %g and %llu gaps, expected none", idle,
             (unsigned long long)sum);
    double s1[] = {0, 3}, e1[] = {5, 8}; /* overlapping: one run, no gap */
    TU_CHECK(sg_prof_gap_histogram(s1, e1, 2, hist) == 0 && hist[0] == 0,
             "overlapping intervals have no gap");
}

static void cpu_api_classes(void)
{
    static const struct {
        const char *name;
        sg_prof_api want;
    } cases[] = {
        {"cudaLaunchKernel_v7000", SG_PROF_API_LAUNCH},
        {"cudaLaunchKernel_ptsz_v7000", SG_PROF_API_LAUNCH},
        {"__cudaLaunchKernel_v13000", SG_PROF_API_LAUNCH},
        {"cudaLaunchKernelExC_v11060", SG_PROF_API_LAUNCH},
        {"cudaLaunchCooperativeKernel_v9000", SG_PROF_API_LAUNCH},
        {"cuLaunchKernel", SG_PROF_API_LAUNCH},
        {"cuLaunchKernelEx_ptsz", SG_PROF_API_LAUNCH},
        {"cuLaunchCooperativeKernel", SG_PROF_API_LAUNCH},
        {"cudaGraphLaunch_v10000", SG_PROF_API_GRAPH_LAUNCH},
        {"cuGraphLaunch_ptsz", SG_PROF_API_GRAPH_LAUNCH},
        {"cudaMemcpyAsync_v3020", SG_PROF_API_MEMCPY},
        {"cuMemcpyHtoDAsync_v2", SG_PROF_API_MEMCPY},
        {"cudaMemsetAsync_v3020", SG_PROF_API_MEMSET},
        {"cuMemsetD8Async", SG_PROF_API_MEMSET},
        {"cudaStreamSynchronize_v3020", SG_PROF_API_SYNC},
        {"cudaDeviceSynchronize_v3020", SG_PROF_API_SYNC},
        {"cuCtxSynchronize_v2", SG_PROF_API_SYNC},
        {"cudaLaunchHostFunc_v10000", SG_PROF_API_OTHER}, /* runs a host function, no kernel */
        {"cudaLaunchKernelSomething", SG_PROF_API_OTHER}, /* exact base names only */
        {"cudaGraphLaunchX", SG_PROF_API_OTHER},
        {"cudaStreamWaitEvent_v3020", SG_PROF_API_OTHER}, /* the host does not wait */
        {"cudaGetLastError_v3020", SG_PROF_API_OTHER},
        {"", SG_PROF_API_OTHER},
        {NULL, SG_PROF_API_OTHER},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sg_prof_api got = sg_prof_api_classify(cases[i].name);
        TU_CHECK(got == cases[i].want, "sg_prof_api_classify(\"%s\") = %d, expected %d",
                 cases[i].name ? cases[i].name : "(null)", (int)got, (int)cases[i].want);
    }
}

/* Calls inside calls on one thread get the depth of their nesting; other threads, ranges and
 * device records are left alone. */
static void cpu_mark_nested(void)
{
    const uint64_t T = 1700000000000000000ull;
    sg_prof_record r[] = {
        /* thread 1: a runtime launch [10, 14] with its driver launch [11, 13] inside */
        {.kind = SG_PROF_KIND_API, .thread_id = 1, .start_ns = T + 10, .end_ns = T + 14, .depth = 7},
        {.kind = SG_PROF_KIND_API, .thread_id = 1, .start_ns = T + 11, .end_ns = T + 13, .depth = 7},
        /* thread 2 at the same time: its own call, not nested */
        {.kind = SG_PROF_KIND_API, .thread_id = 2, .start_ns = T + 11, .end_ns = T + 13, .depth = 7},
        /* thread 1: [20, 30] holding [21, 25] holding [22, 23], then [25, 26] after [21, 25] */
        {.kind = SG_PROF_KIND_API, .thread_id = 1, .start_ns = T + 22, .end_ns = T + 23},
        {.kind = SG_PROF_KIND_API, .thread_id = 1, .start_ns = T + 21, .end_ns = T + 25},
        {.kind = SG_PROF_KIND_API, .thread_id = 1, .start_ns = T + 20, .end_ns = T + 30},
        {.kind = SG_PROF_KIND_API, .thread_id = 1, .start_ns = T + 25, .end_ns = T + 26},
        /* partly overlapping [28, 35]: not inside [20, 30] */
        {.kind = SG_PROF_KIND_API, .thread_id = 1, .start_ns = T + 28, .end_ns = T + 35},
        /* equal intervals: one inside the other (either way round, one counts) */
        {.kind = SG_PROF_KIND_API, .thread_id = 1, .start_ns = T + 40, .end_ns = T + 41},
        {.kind = SG_PROF_KIND_API, .thread_id = 1, .start_ns = T + 40, .end_ns = T + 41},
        /* untimed: depth 0; a range and a kernel around everything: untouched */
        {.kind = SG_PROF_KIND_API, .thread_id = 1, .depth = 3},
        {.kind = SG_PROF_KIND_RANGE, .thread_id = 1, .start_ns = T, .end_ns = T + 100, .depth = 5},
        {.kind = SG_PROF_KIND_KERNEL, .start_ns = T, .end_ns = T + 100, .depth = 6},
    };
    int want[] = {0, 1, 0, 2, 1, 0, 1, 0, -1, -1, 0, 5, 6};
    TU_CHECK(sg_prof_mark_nested(r, sizeof r / sizeof *r) == SG_OK, "sg_prof_mark_nested failed");
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (want[i] >= 0)
            TU_CHECK(r[i].depth == want[i], "record %zu: depth %d, expected %d", i, r[i].depth,
                     want[i]);
    TU_CHECK(r[8].depth + r[9].depth == 1, "equal intervals: depths %d and %d, expected 0 and 1",
             r[8].depth, r[9].depth);
    TU_CHECK(sg_prof_mark_nested(NULL, 0) == SG_OK, "no records");
}

/* ---- a synthetic window whose analysis is known ---- */

static const uint64_t W0 = 1700000000000000000ull; /* a CUPTI-sized timestamp */
enum { W_THREAD = 4242 };

static uint64_t at_us(double us) { return W0 + (uint64_t)llround(us * 1000.0); }

static sg_prof_record w_dev(sg_prof_kind kind, uint32_t stream, uint32_t corr, double s, double e,
                            uint32_t graph, const char *name)
{
    return (sg_prof_record){.kind = kind, .stream_id = stream, .correlation_id = corr,
                            .start_ns = at_us(s), .end_ns = at_us(e), .graph_id = graph,
                            .name = name};
}

static sg_prof_record w_api(const char *name, uint32_t corr, double s, double e)
{
    return (sg_prof_record){.kind = SG_PROF_KIND_API, .correlation_id = corr, .start_ns = at_us(s),
                            .end_ns = at_us(e), .thread_id = W_THREAD,
                            .api = sg_prof_api_classify(name), .name = name};
}

static sg_prof_record w_range(const char *name, double s, double e, int depth)
{
    return (sg_prof_record){.kind = SG_PROF_KIND_RANGE, .start_ns = at_us(s), .end_ns = at_us(e),
                            .thread_id = W_THREAD, .depth = depth, .name = name};
}

/* A range name that needs escaping: quotes, a backslash, a newline, a tab, a control byte,
 * UTF-8 (é) and a byte that is not UTF-8. */
#define W_ODD_NAME "eval \"q\" \\ \n\t\x01 \xc3\xa9 \xff"
#define W_ODD_JSON "\"eval \\\"q\\\" \\\\ \\n\\t\\u0001 \xc3\xa9 \\ufffd\""

/* Times in us. Step A [0, 100]: three launches (a runtime launch with its own driver launch
 * inside, whose correlation id its kernel carries, found nested by sg_prof_mark_nested; a cuBLAS-style driver launch; a runtime
 * launch), a copy, a set on a second stream overlapping the last kernel, a sync. Step B
 * [200, 300] holds a nested "step" range (not a step), a graph launch of three kernels and a
 * launch whose second kernel is untimed. A kernel with no API record inside step B's time and
 * a launch inside an "eval" range belong to no step. */
static size_t synthetic_window(sg_prof_record *r)
{
    size_t n = 0;
    r[n++] = w_range("step", 0, 100, 0);
    r[n++] = w_range("blocks.0.forward", 5, 40, 1);
    r[n++] = w_range("step", 200, 300, 0);
    r[n++] = w_range("step", 216, 225, 1);
    r[n++] = w_range(W_ODD_NAME, 400, 450, 0);
    r[n++] = w_api("cudaLaunchKernel_v7000", 1, 10, 14);
    r[n++] = w_api("cuLaunchKernel", 2, 11, 13);
    r[n++] = w_api("cuLaunchKernelEx", 3, 20, 23);
    r[n++] = w_api("cudaMemcpyAsync_v3020", 4, 30, 32);
    r[n++] = w_api("cudaMemsetAsync_v3020", 7, 41, 42);
    r[n++] = w_api("cudaLaunchKernel_v7000", 5, 50, 55);
    r[n++] = w_api("cudaStreamSynchronize_v3020", 6, 60, 95);
    r[n++] = w_api("cudaGraphLaunch_v10000", 10, 205, 215);
    r[n++] = w_api("cudaLaunchKernel_ptsz_v7000", 11, 230, 233);
    r[n++] = w_api("cudaLaunchKernel_v7000", 20, 410, 412);
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 2, 15, 25, 0, "_Z11fill_kernelPfmf");
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 3, 25, 30, 0, "nvjet_tst_64x8_64x16_4x1_v_bz_TNT");
    r[n++] = w_dev(SG_PROF_KIND_MEMCPY, 7, 4, 33, 35, 0, "memcpy HtoD");
    r[n++] = w_dev(SG_PROF_KIND_MEMSET, 8, 7, 80, 130, 0, "memset");
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 5, 56, 120, 0, "_ZN7cutlass7Kernel2INS_4gemmEEEvT_");
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 10, 216, 217, 5, "_Z12adamw_kernelIfEvPT_");
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 10, 217.5, 218, 5, "_Z12adamw_kernelIfEvPT_");
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 10, 219, 229, 5, "_ZL9my_kernelv");
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 11, 240, 245, 0, "_ZSt4swapIiEvRT_S1_");
    r[n] = w_dev(SG_PROF_KIND_KERNEL, 7, 11, 0, 0, 0, NULL);
    r[n].start_ns = r[n].end_ns = 0, n++; /* untimed */
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 99, 250, 260, 0, "orphan_kernel");
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 20, 415, 420, 0, "_Z11fill_kernelPfmf");
    /* As sg_prof_stop: the driver launch inside the runtime launch gets depth 1. */
    TU_CHECK(sg_prof_mark_nested(r, n) == SG_OK, "sg_prof_mark_nested failed");
    return n;
}
#define W_MAX 32
#define W_HOST_EVENTS 15  /* 5 ranges + 10 API calls */
#define W_DEVICE_EVENTS 11 /* every device record but the untimed one */

/* sg_prof_family_us on a synthetic window with random durations (us). Step A [0, 100]: a
 * kernel queued before any op's marker (the copy-in: other); a matmul marker, then a launch; a
 * norm marker, then a runtime launch whose kernel carries its nested driver call's id; an
 * optimizer marker, then a set; a graph launch of two kernels (other, though a marker came
 * before it); an unknown "work:" name, which is no marker. Step B [200, 300]: a launch before
 * its first marker (other: step A's optimizer marker does not reach across the step's start),
 * an attention marker on another thread (not this one's), then a loss marker and a copy. The
 * expected sums are taken in record order, as the function takes them. */
static void cpu_family(void)
{
    double d[9], want[SG_WORK_FAMILIES + 1] = {0};
    for (int i = 0; i < 9; i++) d[i] = tu_randint(500, 20000) * 1e-3; /* whole ns, as CUPTI stamps */
    sg_prof_record r[32];
    size_t n = 0;
    r[n++] = w_range("step", 0, 100, 0);
    r[n++] = w_api("cudaMemcpyAsync", 1, 1, 2);
    r[n++] = w_dev(SG_PROF_KIND_MEMCPY, 7, 1, 3, 3 + d[0], 0, "memcpy HtoD");
    want[SG_WORK_FAMILIES] += d[0];
    r[n++] = w_range(sg_prof_family_marker(SG_WORK_MATMUL), 5, 5, 1);
    r[n++] = w_api("cuLaunchKernel", 2, 6, 7);
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 2, 10, 10 + d[1], 0, "gemm");
    want[SG_WORK_MATMUL] += d[1];
    r[n++] = w_range(sg_prof_family_marker(SG_WORK_NORM), 30, 30, 1);
    r[n++] = w_api("cudaLaunchKernel", 3, 31, 34);
    sg_prof_record inner = w_api("cuLaunchKernel", 4, 32, 33);
    inner.depth = 1;
    r[n++] = inner;
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 4, 35, 35 + d[2], 0, "ln");
    want[SG_WORK_NORM] += d[2];
    r[n++] = w_range(sg_prof_family_marker(SG_WORK_OPTIMIZER), 60, 60, 0);
    r[n++] = w_api("cudaMemsetAsync", 5, 61, 62);
    r[n++] = w_dev(SG_PROF_KIND_MEMSET, 8, 5, 63, 63 + d[3], 0, "memset");
    want[SG_WORK_OPTIMIZER] += d[3];
    r[n++] = w_range("work:bogus", 70, 70, 0);
    r[n++] = w_api("cudaGraphLaunch", 6, 71, 72);
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 6, 73, 73 + d[4], 9, "g1");
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 6, 80, 80 + d[5], 9, "g2");
    want[SG_WORK_FAMILIES] += d[4], want[SG_WORK_FAMILIES] += d[5];
    r[n++] = w_range("step", 200, 300, 0);
    r[n++] = w_api("cudaLaunchKernel", 7, 201, 202);
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 7, 205, 205 + d[6], 0, "batch");
    want[SG_WORK_FAMILIES] += d[6];
    sg_prof_record other = w_range(sg_prof_family_marker(SG_WORK_ATTENTION), 210, 210, 0);
    other.thread_id = W_THREAD + 1;
    r[n++] = other;
    r[n++] = w_api("cudaLaunchKernel", 8, 211, 212);
    r[n++] = w_dev(SG_PROF_KIND_KERNEL, 7, 8, 215, 215 + d[7], 0, "k");
    want[SG_WORK_FAMILIES] += d[7];
    r[n++] = w_range(sg_prof_family_marker(SG_WORK_LOSS), 240, 240, 0);
    r[n++] = w_api("cudaMemcpyAsync", 9, 241, 242);
    r[n++] = w_dev(SG_PROF_KIND_MEMCPY, 7, 9, 245, 245 + d[8], 0, "memcpy DtoH");
    want[SG_WORK_LOSS] += d[8];
    /* Any order of records gives the same split: shuffle. */
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)tu_randint(0, (int)i);
        sg_prof_record t = r[i];
        r[i] = r[j], r[j] = t;
    }
    double got[SG_WORK_FAMILIES + 1];
    TU_CHECK(sg_prof_family_us(r, n, got) == SG_OK, "sg_prof_family_us failed");
    for (int k = 0; k <= SG_WORK_FAMILIES; k++) /* sums of at most 4 terms: 4 ulp of 100 us */
        TU_CHECK(fabs(got[k] - want[k]) <= 4 * 100 * 0x1p-52, "family %s: %.9f us, expected %.9f",
                 k < SG_WORK_FAMILIES ? sg_work_family_name((sg_work_family)k) : "other", got[k], want[k]);
    TU_CHECK(sg_prof_family_us(NULL, 1, got) == SG_ERR_NULL && sg_prof_family_us(r, n, NULL) == SG_ERR_NULL,
             "NULL arguments were not refused");
    TU_CHECK(sg_prof_family_us(r, 0, got) == SG_OK && got[0] == 0 && got[SG_WORK_FAMILIES] == 0, "no records");
    TU_CHECK(sg_prof_family_marker(SG_WORK_FAMILIES) == NULL, "a marker for no family");
}

static void check_step(const char *what, const sg_prof_step *got, const sg_prof_step *want)
{
    TU_CHECK(got->kernels == want->kernels && got->launch_calls == want->launch_calls &&
                 got->graph_launches == want->graph_launches,
             "%s: %llu kernels, %llu launch calls, %llu graph launches; expected %llu, %llu, %llu",
             what, (unsigned long long)got->kernels, (unsigned long long)got->launch_calls,
             (unsigned long long)got->graph_launches, (unsigned long long)want->kernels,
             (unsigned long long)want->launch_calls, (unsigned long long)want->graph_launches);
    static const char *names[] = {"host_us", "launch_host_us", "device_us", "busy_us", "idle_us",
                                  "short_kernel_share", "launch_share"};
    double gv[] = {got->host_us, got->launch_host_us, got->device_us, got->busy_us, got->idle_us,
                   got->short_kernel_share, got->launch_share};
    double wv[] = {want->host_us, want->launch_host_us, want->device_us, want->busy_us,
                   want->idle_us, want->short_kernel_share, want->launch_share};
    for (size_t i = 0; i < sizeof gv / sizeof *gv; i++)
        TU_CHECK(fabs(gv[i] - wv[i]) <= 1e-9 * (1 + fabs(wv[i])), "%s: %s %.12g, expected %.12g",
                 what, names[i], gv[i], wv[i]);
    for (int b = 0; b < SG_PROF_GAP_BINS; b++)
        TU_CHECK(got->gap_hist[b] == want->gap_hist[b], "%s: gap bin %d holds %llu, expected %llu",
                 what, b, (unsigned long long)got->gap_hist[b],
                 (unsigned long long)want->gap_hist[b]);
}

static void cpu_analyze(void)
{
    sg_prof_record r[W_MAX], rev[W_MAX];
    size_t n = synthetic_window(r);
    const sg_prof_step want[2] = {
        {.host_us = 100, .kernels = 3, .launch_calls = 3, .graph_launches = 0,
         .launch_host_us = 4 + 3 + 5, .device_us = 130 - 15, .busy_us = 15 + 2 + 74, .idle_us = 3 + 21,
         .short_kernel_share = 2.0 / 3.0, .launch_share = 0.12, .gap_hist = {0, 0, 1, 0, 0, 1, 0, 0}},
        {.host_us = 100, .kernels = 5, .launch_calls = 1, .graph_launches = 1,
         .launch_host_us = 10 + 3, .device_us = 245 - 216, .busy_us = 1 + 0.5 + 10 + 5,
         .idle_us = 0.5 + 1 + 11, .short_kernel_share = 1.0, .launch_share = 0.13,
         .gap_hist = {1, 1, 0, 0, 1, 0, 0, 0}},
    };
    sg_prof_step st[4];
    int ns = -1;
    TU_CHECK(sg_prof_analyze(r, n, st, 4, &ns) == SG_OK, "sg_prof_analyze failed");
    TU_CHECK(ns == 2, "%d steps found, expected 2 (a nested \"step\" range is not a step)", ns);
    if (ns == 2) {
        check_step("step A", &st[0], &want[0]);
        check_step("step B", &st[1], &want[1]);
    }
    /* Delivery order does not matter. */
    for (size_t i = 0; i < n; i++) rev[i] = r[n - 1 - i];
    TU_CHECK(sg_prof_analyze(rev, n, st, 4, &ns) == SG_OK && ns == 2, "reversed: %d steps", ns);
    if (ns == 2) {
        check_step("step A (reversed records)", &st[0], &want[0]);
        check_step("step B (reversed records)", &st[1], &want[1]);
    }
    /* Fewer slots than steps: the first filled, all counted. */
    TU_CHECK(sg_prof_analyze(r, n, st, 1, &ns) == SG_OK && ns == 2, "max_steps 1: %d steps", ns);
    check_step("step A (one slot)", &st[0], &want[0]);
    TU_CHECK(sg_prof_analyze(r, n, NULL, 0, &ns) == SG_OK && ns == 2, "no slots: %d steps", ns);
    TU_CHECK(sg_prof_analyze(NULL, 0, st, 4, &ns) == SG_OK && ns == 0, "no records: %d steps", ns);
    TU_CHECK(sg_prof_analyze(r, n, st, 4, NULL) == SG_ERR_NULL, "n_steps NULL must fail");

    /* The window's totals: device records only. */
    sg_prof_result sum;
    sg_prof_summarize(r, n, &sum);
    TU_CHECK(sum.kernels == 10 && sum.memcpys == 1 && sum.memsets == 1,
             "summary counts %llu/%llu/%llu, expected 10/1/1", (unsigned long long)sum.kernels,
             (unsigned long long)sum.memcpys, (unsigned long long)sum.memsets);
    TU_CHECK(fabs(sum.span_us - (420 - 15)) < 1e-9, "summary span %.9f, expected 405", sum.span_us);
    TU_CHECK(fabs(sum.busy_us - 122.5) < 1e-9, "summary busy %.9f, expected 122.5", sum.busy_us);
}

/* ---- a small JSON reader, to parse traces back without a library ---- */

typedef struct json_counts {
    int host, device, spans_bad, meta_names;
} json_counts;

typedef struct json_in {
    const char *s;
    bool bad;
    json_counts *c;
} json_in;

static void json_ws(json_in *in)
{
    while (*in->s == ' ' || *in->s == '\n' || *in->s == '\t' || *in->s == '\r') in->s++;
}

/* A string; its first cap-1 raw bytes (escapes kept as written) go to out when out is set. */
static void json_string(json_in *in, char *out, size_t cap)
{
    size_t k = 0;
    if (*in->s != '"') {
        in->bad = true;
        return;
    }
    for (in->s++; *in->s != '"'; in->s++) {
        if (!*in->s || (unsigned char)*in->s < 0x20) {
            in->bad = true;
            return;
        }
        if (*in->s == '\\') {
            if (out && k + 1 < cap) out[k++] = *in->s;
            in->s++;
            if (!strchr("\"\\/bfnrtu", *in->s) || !*in->s) {
                in->bad = true;
                return;
            }
        }
        if (out && k + 1 < cap) out[k++] = *in->s;
    }
    in->s++;
    if (out) out[k] = '\0';
}

static void json_value(json_in *in, int depth);

/* An object; a trace event ("ph": "X") must carry ts >= 0, dur >= 0, pid, tid and a name. */
static void json_object(json_in *in, int depth)
{
    char key[64], ph[8] = "";
    double pid = -1;
    bool ts = false, dur = false, has_pid = false, tid = false, name = false;
    in->s++;
    json_ws(in);
    if (*in->s == '}') {
        in->s++;
        return;
    }
    while (!in->bad) {
        json_ws(in);
        json_string(in, key, sizeof key);
        json_ws(in);
        if (in->bad || *in->s++ != ':') {
            in->bad = true;
            return;
        }
        json_ws(in);
        const char *v = in->s;
        if (!strcmp(key, "ph") && *v == '"') {
            json_string(in, ph, sizeof ph);
        } else if (strchr("-0123456789", *v) && *v) {
            char *end;
            double x = strtod(v, &end);
            if (end == v) in->bad = true;
            in->s = end;
            if (!strcmp(key, "ts")) ts = x >= 0;
            if (!strcmp(key, "dur")) dur = x >= 0;
            if (!strcmp(key, "pid")) has_pid = true, pid = x;
            if (!strcmp(key, "tid")) tid = true;
        } else {
            if (!strcmp(key, "name") && *v == '"') name = true;
            json_value(in, depth + 1);
        }
        json_ws(in);
        if (*in->s == ',') {
            in->s++;
            continue;
        }
        if (*in->s == '}') {
            in->s++;
            break;
        }
        in->bad = true;
    }
    if (!strcmp(ph, "X")) {
        if (!(ts && dur && has_pid && tid && name)) in->c->spans_bad++;
        else if (pid == 1) in->c->host++;
        else in->c->device++;
    }
    if (!strcmp(ph, "M")) in->c->meta_names++;
}

static void json_value(json_in *in, int depth)
{
    json_ws(in);
    if (depth > 32) {
        in->bad = true;
        return;
    }
    if (*in->s == '{') {
        json_object(in, depth);
    } else if (*in->s == '[') {
        in->s++;
        json_ws(in);
        if (*in->s == ']') {
            in->s++;
            return;
        }
        while (!in->bad) {
            json_value(in, depth + 1);
            json_ws(in);
            if (*in->s == ',') in->s++;
            else if (*in->s == ']') {
                in->s++;
                return;
            } else {
                in->bad = true;
            }
        }
    } else if (*in->s == '"') {
        json_string(in, NULL, 0);
    } else if (!strncmp(in->s, "true", 4) || !strncmp(in->s, "null", 4)) {
        in->s += 4;
    } else if (!strncmp(in->s, "false", 5)) {
        in->s += 5;
    } else {
        char *end;
        strtod(in->s, &end);
        if (end == in->s) in->bad = true;
        in->s = end;
    }
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len + 1);
    if (text && fread(text, 1, (size_t)len, f) != (size_t)len) {
        free(text);
        text = NULL;
    }
    if (text) text[len] = '\0';
    fclose(f);
    return text;
}

/* Parses a trace file: valid JSON, {"traceEvents": [...]}, every span complete; returns the
 * text (for the caller's searches) and the span counts. */
static char *check_trace_c(const char *what, const char *path, int host, int device)
{
    char *text = read_file(path);
    TU_CHECK(text != NULL, "%s: cannot read back %s", what, path);
    if (!text) return NULL;
    json_counts c = {0};
    json_in in = {text, false, &c};
    json_ws(&in);
    static const char head[] = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
    TU_CHECK(!strncmp(in.s, head, strlen(head)),
             "%s: the trace does not open with {\"traceEvents\": [", what);
    json_value(&in, 0);
    json_ws(&in);
    TU_CHECK(!in.bad && *in.s == '\0', "%s: %s is not valid JSON (at byte %ld)", what, path,
             (long)(in.s - text));
    TU_CHECK(c.spans_bad == 0, "%s: %d spans lack ts, dur, pid, tid or name", what, c.spans_bad);
    TU_CHECK(c.host == host && c.device == device, "%s: %d host and %d device spans, expected %d and %d",
             what, c.host, c.device, host, device);
    TU_CHECK(c.meta_names > 0 || host + device == 0, "%s: no track-name metadata", what);
    return text;
}

static void tmp_trace_path(char *buf, size_t cap, const char *tag)
{
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(buf, cap, "%s/sg_test_prof_%s_%ld.json", dir, tag, (long)getpid());
}

static void cpu_trace(void)
{
    sg_prof_record r[W_MAX];
    size_t n = synthetic_window(r);
    char path[512];
    tmp_trace_path(path, sizeof path, "cpu");
    TU_CHECK(sg_prof_write_trace(NULL, r, n, path) == SG_OK, "sg_prof_write_trace: %s",
             sg_ctx_last_error(NULL));
    char *text = check_trace_c("synthetic trace", path, W_HOST_EVENTS, W_DEVICE_EVENTS);
    if (text) {
        static const char *want[] = {
            "\"name\":" W_ODD_JSON,
            "\"name\":\"fill_kernel\",\"cat\":\"kernel\"",
            "\"mangled\":\"_Z11fill_kernelPfmf\"",
            "\"name\":\"cutlass::Kernel2<...>\"",
            "\"name\":\"adamw_kernel<...>\"",
            "\"name\":\"my_kernel\"",
            "\"name\":\"std::swap<...>\"",
            "\"name\":\"nvjet_tst_64x8_64x16_4x1_v_bz_TNT\"",
            "\"graph\":5",
            "\"class\":\"graph launch\"",
            "\"name\":\"cudaMemcpyAsync\",\"cat\":\"cuda_api\"", /* CUPTI's "_v3020" dropped */
            "\"name\":\"cuLaunchKernel\",\"cat\":\"cuda_api\",\"ph\":\"X\",\"ts\":11.000,\"dur\":2.000,"
            "\"pid\":1,\"tid\":4242,\"args\":{\"correlation\":2,\"class\":\"launch\",\"depth\":1}",
            "\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"host\"}",
            "\"args\":{\"name\":\"GPU 0\"}",
            "\"pid\":2,\"tid\":8,\"args\":{\"name\":\"stream 8\"}",
            "\"ts\":0.000,\"dur\":100.000,\"pid\":1,\"tid\":4242", /* the first step: from t0 */
        };
        for (size_t i = 0; i < sizeof want / sizeof *want; i++)
            TU_CHECK(strstr(text, want[i]) != NULL, "synthetic trace lacks %s", want[i]);
        free(text);
    }
    remove(path);

    /* An empty window is an empty, valid trace. */
    TU_CHECK(sg_prof_write_trace(NULL, NULL, 0, path) == SG_OK, "empty trace: %s",
             sg_ctx_last_error(NULL));
    free(check_trace_c("empty trace", path, 0, 0));
    remove(path);

    /* A path that cannot be written fails with SG_ERR_IO naming it, and leaves no file. */
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    TU_FAILS(ctx, sg_prof_write_trace(ctx, r, n, "/nonexistent-dir/t.json"), SG_ERR_IO,
             "/nonexistent-dir/t.json");
    TU_FAILS(ctx, sg_prof_write_trace(ctx, r, n, NULL), SG_ERR_NULL, "path is NULL");
    sg_ctx_destroy(ctx);
}

/* `test_prof trace FILE`: the synthetic trace for tests/check_trace.py, and what it must find. */
static int write_synthetic_trace(const char *path)
{
    sg_prof_record r[W_MAX];
    size_t n = synthetic_window(r);
    if (sg_prof_write_trace(NULL, r, n, path) != SG_OK) {
        fprintf(stderr, "test_prof trace: %s\n", sg_ctx_last_error(NULL));
        return 1;
    }
    printf("expect: --host %d --device %d --graph-events 3 --name fill_kernel --name step "
           "--name cudaGraphLaunch --name cudaLaunchKernel_ptsz\n", W_HOST_EVENTS, W_DEVICE_EVENTS);
    return 0;
}

static void cpu_refusals(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    sg_prof *p = (sg_prof *)&p; /* must be reset to NULL on failure */
    TU_FAILS(ctx, sg_prof_create(ctx, &p), SG_ERR_UNSUPPORTED, "sg_prof_create");
    TU_CHECK(p == NULL, "sg_prof_create left *out set after failing");
    TU_FAILS(ctx, sg_prof_create(ctx, NULL), SG_ERR_NULL, "out is NULL");
    sg_prof_destroy(NULL);
    sg_ctx_destroy(ctx);
}

/* ---- gpu ---- */

static size_t count_device(const sg_prof_record *r, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += r[i].kind == SG_PROF_KIND_KERNEL || r[i].kind == SG_PROF_KIND_MEMCPY ||
             r[i].kind == SG_PROF_KIND_MEMSET;
    return k;
}

/* API records of class api at depth 0 (each call once) and, in *nested, those at depth 1. */
static uint64_t count_api(const sg_prof_record *r, size_t n, sg_prof_api api, uint64_t *nested)
{
    uint64_t k = 0, in = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].kind != SG_PROF_KIND_API || r[i].api != api) continue;
        if (r[i].depth == 0) k++;
        else in++;
    }
    if (nested) *nested = in;
    return k;
}

static const sg_prof_record *api_of(const sg_prof_record *r, size_t n, uint32_t corr)
{
    for (size_t i = 0; i < n; i++)
        if (r[i].kind == SG_PROF_KIND_API && r[i].correlation_id == corr) return &r[i];
    return NULL;
}

static void check_window(const char *what, const sg_prof *p, const sg_prof_result *r,
                         uint64_t kernels, uint64_t memcpys)
{
    TU_CHECK(r->kernels == kernels, "%s: %llu kernels recorded, the runtime launched %llu", what,
             (unsigned long long)r->kernels, (unsigned long long)kernels);
    TU_CHECK(r->memcpys == memcpys, "%s: %llu memcpys recorded, expected %llu", what,
             (unsigned long long)r->memcpys, (unsigned long long)memcpys);
    TU_CHECK(r->memsets == 0, "%s: %llu memsets recorded, expected none", what,
             (unsigned long long)r->memsets);
    TU_CHECK(r->dropped == 0, "%s: CUPTI dropped %llu records", what, (unsigned long long)r->dropped);
    size_t n = 0;
    const sg_prof_record *rec = sg_prof_records(p, &n);
    TU_CHECK(count_device(rec, n) == r->kernels + r->memcpys + r->memsets,
             "%s: %zu device records, counts add to %llu", what, count_device(rec, n),
             (unsigned long long)(r->kernels + r->memcpys + r->memsets));
    /* Each kernel launch is one API call at depth 0: a runtime launch's own driver launch (if
     * CUPTI reports one) is marked nested and not counted again. */
    uint64_t nested = 0, launches = count_api(rec, n, SG_PROF_API_LAUNCH, &nested);
    TU_CHECK(launches == kernels, "%s: %llu launch calls recorded (and %llu nested driver "
             "launches), the runtime launched %llu kernels", what, (unsigned long long)launches,
             (unsigned long long)nested, (unsigned long long)kernels);
    uint64_t copies = count_api(rec, n, SG_PROF_API_MEMCPY, NULL);
    TU_CHECK(copies == memcpys, "%s: %llu copy calls, expected %llu", what,
             (unsigned long long)copies, (unsigned long long)memcpys);
    for (size_t i = 0; i < n; i++) {
        if (rec[i].kind != SG_PROF_KIND_KERNEL) continue;
        const sg_prof_record *a = api_of(rec, n, rec[i].correlation_id);
        TU_CHECK(a && a->api == SG_PROF_API_LAUNCH,
                 "%s: kernel %s (correlation %u) has no launch call in the window (%s)", what,
                 rec[i].name ? rec[i].name : "(unnamed)", rec[i].correlation_id,
                 a ? a->name : "no API record");
        TU_CHECK(rec[i].name && rec[i].name[0], "%s: a kernel without a name", what);
        TU_CHECK(rec[i].graph_id == 0, "%s: eagerly launched kernel %s has graph id %u", what,
                 rec[i].name, rec[i].graph_id);
    }
    if (kernels + memcpys == 0) {
        TU_CHECK(r->busy_us == 0 && r->span_us == 0, "%s: busy %.3f span %.3f us in an empty window",
                 what, r->busy_us, r->span_us);
        return;
    }
    TU_CHECK(r->busy_us > 0, "%s: busy %.3f us, expected > 0", what, r->busy_us);
    /* busy is a sum of pieces of the span computed the same way: equal up to rounding. */
    TU_CHECK(r->busy_us <= r->span_us * (1 + 1e-12), "%s: busy %.3f us exceeds span %.3f us", what,
             r->busy_us, r->span_us);
    if (kernels) {
        TU_CHECK(r->kernel_us_sum > 0, "%s: kernel time %.3f us", what, r->kernel_us_sum);
        TU_CHECK(r->short_kernel_share >= 0 && r->short_kernel_share <= 1, "%s: short share %.3f",
                 what, r->short_kernel_share);
    }
    printf("%s: %llu kernels, %llu memcpys, %zu records (%llu launch calls, %llu nested driver "
           "launches), busy %.1f us, span %.1f us, kernel sum %.1f us, short share %.2f\n",
           what, (unsigned long long)r->kernels, (unsigned long long)r->memcpys, n,
           (unsigned long long)launches, (unsigned long long)nested, r->busy_us, r->span_us,
           r->kernel_us_sum, r->short_kernel_share);
}

/* Named ranges: recorded with depth and thread, on CUPTI's clock, so the fills' launch calls
 * lie inside the range that wrapped them, on the same thread. */
static void check_ranges(const sg_prof *p, int fills)
{
    size_t n = 0;
    const sg_prof_record *rec = sg_prof_records(p, &n);
    const sg_prof_record *outer = NULL, *inner = NULL;
    for (size_t i = 0; i < n; i++) {
        if (rec[i].kind != SG_PROF_KIND_RANGE) continue;
        if (rec[i].name && !strcmp(rec[i].name, "outer")) outer = &rec[i];
        if (rec[i].name && !strcmp(rec[i].name, "inner")) inner = &rec[i];
    }
    TU_CHECK(outer && inner, "the ranges 'outer' and 'inner' were not recorded");
    if (!outer || !inner) return;
    TU_CHECK(outer->depth == 0 && inner->depth == 1, "range depths %d and %d, expected 0 and 1",
             outer->depth, inner->depth);
    TU_CHECK(inner->start_ns >= outer->start_ns && inner->end_ns <= outer->end_ns,
             "range 'inner' [%llu, %llu] is not inside 'outer' [%llu, %llu]",
             (unsigned long long)inner->start_ns, (unsigned long long)inner->end_ns,
             (unsigned long long)outer->start_ns, (unsigned long long)outer->end_ns);
    int inside = 0;
    for (size_t i = 0; i < n; i++) {
        if (rec[i].kind != SG_PROF_KIND_API || rec[i].api != SG_PROF_API_LAUNCH || rec[i].depth)
            continue;
        bool in = rec[i].start_ns >= inner->start_ns && rec[i].end_ns <= inner->end_ns;
        inside += in;
        TU_CHECK(!in || rec[i].thread_id == inner->thread_id,
                 "launch call on thread %u inside a range recorded on thread %u (CUPTI's thread "
                 "ids and gettid differ)", rec[i].thread_id, inner->thread_id);
    }
    TU_CHECK(inside == fills, "%d launch calls lie inside the range around %d fills (CUPTI's "
             "API timestamps and cuptiGetTimestamp disagree?)", inside, fills);
}

static void gpu_counts(sg_ctx *ctx, sg_prof *p)
{
    sg_prof *second = NULL;
    TU_FAILS(ctx, sg_prof_create(ctx, &second), SG_ERR_INVALID, "another sg_prof");
    TU_FAILS(ctx, sg_prof_stop(p, NULL), SG_ERR_INVALID, "not started");

    /* 4 MiB, so each fill is a real kernel; a small tensor for the copies. */
    sg_tensor *big = tu_tensor1(ctx, SG_DTYPE_F32, 1 << 20, "big");
    sg_tensor *a = tu_tensor1(ctx, SG_DTYPE_F32, 256, "a"), *b = tu_tensor1(ctx, SG_DTYPE_F32, 256, "b");
    float host[256];
    for (int i = 0; i < 256; i++) host[i] = (float)i;
    TU_OK(ctx, sg_tensor_fill(big, 0.0)); /* module load and first-launch costs stay outside */
    TU_OK(ctx, sg_ctx_sync(ctx));

    int fills = tu_randint(5, 20);
    TU_OK(ctx, sg_prof_start(p));
    TU_FAILS(ctx, sg_prof_start(p), SG_ERR_INVALID, "already started");
    uint64_t c0 = sg_ctx_launch_count(ctx);
    sg_range_push(ctx, "outer");
    sg_range_push(ctx, "inner");
    for (int i = 0; i < fills; i++) TU_OK(ctx, sg_tensor_fill(big, (double)i));
    sg_range_pop(ctx, "inner");
    TU_OK(ctx, sg_tensor_copy_from_host(a, host, sizeof host)); /* one H2D memcpy */
    TU_OK(ctx, sg_tensor_copy(b, a));                           /* one D2D memcpy */
    sg_range_pop(ctx, "outer");
    uint64_t launched = sg_ctx_launch_count(ctx) - c0;
    sg_prof_result r;
    TU_OK(ctx, sg_prof_stop(p, &r));
    TU_CHECK(ctx->range_hook == NULL, "sg_prof_stop left the context's range hook set");
    TU_CHECK(launched == (uint64_t)fills, "the runtime counted %llu launches for %d fills",
             (unsigned long long)launched, fills);
    check_window("window 1 (fills + 2 copies)", p, &r, launched, 2);
    check_ranges(p, fills);

    /* A second window sees only its own launches. */
    c0 = sg_ctx_launch_count(ctx);
    TU_OK(ctx, sg_prof_start(p));
    for (int i = 0; i < 3; i++) TU_OK(ctx, sg_tensor_fill(big, 1.0));
    TU_OK(ctx, sg_prof_stop(p, &r));
    check_window("window 2 (3 fills)", p, &r, sg_ctx_launch_count(ctx) - c0, 0);

    /* Work launched between windows is not recorded. */
    TU_OK(ctx, sg_tensor_fill(big, 2.0));
    TU_OK(ctx, sg_ctx_sync(ctx));
    TU_OK(ctx, sg_prof_start(p));
    TU_OK(ctx, sg_prof_stop(p, NULL));
    TU_OK(ctx, sg_prof_start(p));
    TU_OK(ctx, sg_prof_stop(p, &r));
    check_window("window 3 (empty)", p, &r, 0, 0);

    sg_tensor_destroy(big);
    sg_tensor_destroy(a);
    sg_tensor_destroy(b);
}

/* The trace of a real window parses (C reader; tests/check_trace.py too where python3 is). */
static void gpu_check_trace(const char *what, sg_ctx *ctx, const sg_prof *p, const char *tag)
{
    size_t n = 0;
    const sg_prof_record *rec = sg_prof_records(p, &n);
    int host = 0, dev = 0, graph = 0;
    for (size_t i = 0; i < n; i++) {
        if (rec[i].start_ns == 0 && rec[i].end_ns == 0) continue;
        if (rec[i].kind == SG_PROF_KIND_API || rec[i].kind == SG_PROF_KIND_RANGE) host++;
        else dev++, graph += rec[i].graph_id != 0;
    }
    char path[512];
    tmp_trace_path(path, sizeof path, tag);
    TU_OK(ctx, sg_prof_write_trace(ctx, rec, n, path));
    free(check_trace_c(what, path, host, dev));
#ifdef SG_CHECK_TRACE_PY
    if (system("python3 -c 'import json' >/dev/null 2>&1") == 0) {
        char cmd[1400];
        snprintf(cmd, sizeof cmd, "python3 '%s' '%s' --host %d --device %d --graph-events %d --name step",
                 SG_CHECK_TRACE_PY, path, host, dev, graph);
        TU_CHECK(system(cmd) == 0, "%s: %s failed", what, cmd);
    } else {
        printf("%s: no python3: the trace was checked by the C reader only\n", what);
    }
#endif
    remove(path);
}

/* Three traced steps of a small model under scope sc, after its warm-up and capture. */
static void gpu_trainer_window(sg_ctx *ctx, sg_prof *p, sg_scope sc)
{
    char what[64];
    snprintf(what, sizeof what, "trainer, scope %s", sg_scope_name(sc));
    sg_model *m = NULL;
    sg_optim *o = NULL;
    sg_trainer *t = NULL;
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = sc;
    to.warmup = 2;
    TU_OK(ctx, sg_model_create(ctx, "mlp-128-3-16", 1, &m));
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
    for (int s = 0; s < 3; s++) TU_OK(ctx, sg_trainer_step(t, s)); /* warm-up and capture */
    TU_OK(ctx, sg_ctx_sync(ctx));
    enum { STEPS = 3 };
    uint64_t c0 = sg_ctx_launch_count(ctx);
    TU_OK(ctx, sg_prof_start(p));
    for (int s = 3; s < 3 + STEPS; s++) TU_OK(ctx, sg_trainer_step(t, s));
    sg_prof_result r;
    TU_OK(ctx, sg_prof_stop(p, &r));
    uint64_t launched = sg_ctx_launch_count(ctx) - c0;
    TU_CHECK(r.dropped == 0, "%s: CUPTI dropped %llu records", what, (unsigned long long)r.dropped);
    size_t n = 0;
    const sg_prof_record *rec = sg_prof_records(p, &n);
    sg_prof_step st[8];
    int ns = 0;
    TU_OK(ctx, sg_prof_analyze(rec, n, st, 8, &ns));
    TU_CHECK(ns == STEPS, "%s: %d step ranges in the window, %d steps ran", what, ns, STEPS);
    uint64_t kernels = 0;
    for (int k = 0; k < ns && k < 8; k++) {
        const sg_prof_step *s = &st[k];
        kernels += s->kernels;
        printf("%s: step %d: %llu kernels, %llu launch calls, %llu graph launches, launch host "
               "%.1f of %.1f us (%.0f%%), device %.1f us, busy %.1f, idle %.1f\n", what, k + 1,
               (unsigned long long)s->kernels, (unsigned long long)s->launch_calls,
               (unsigned long long)s->graph_launches, s->launch_host_us, s->host_us,
               100 * s->launch_share, s->device_us, s->busy_us, s->idle_us);
        TU_CHECK(s->kernels > 0 && s->busy_us > 0, "%s: step %d: %llu kernels, busy %.3f us", what,
                 k + 1, (unsigned long long)s->kernels, s->busy_us);
        TU_CHECK(s->busy_us <= s->device_us * (1 + 1e-12) && s->idle_us >= -1e-9,
                 "%s: step %d: busy %.3f, idle %.3f of %.3f us", what, k + 1, s->busy_us,
                 s->idle_us, s->device_us);
        TU_CHECK(s->launch_share > 0 && s->launch_share <= 1, "%s: step %d: launch share %.3f",
                 what, k + 1, s->launch_share);
        if (sc == SG_SCOPE_EAGER) {
            /* Every kernel has its own launch call, counted once. */
            TU_CHECK(s->graph_launches == 0 && s->launch_calls == s->kernels,
                     "%s: step %d: %llu launch calls and %llu graph launches for %llu kernels",
                     what, k + 1, (unsigned long long)s->launch_calls,
                     (unsigned long long)s->graph_launches, (unsigned long long)s->kernels);
        } else {
            TU_CHECK(s->graph_launches == 1, "%s: step %d: %llu graph launches, expected 1", what,
                     k + 1, (unsigned long long)s->graph_launches);
        }
    }
    /* Under step scope: the kernels carrying a graph launch's correlation id carry a graph id,
     * and with the step's own launches they make up its kernels. */
    if (sc == SG_SCOPE_STEP) {
        uint64_t graph_kernels = 0, eager_launches = 0;
        for (int k = 0; k < ns && k < 8; k++) eager_launches += st[k].launch_calls;
        for (size_t i = 0; i < n; i++) {
            if (rec[i].kind != SG_PROF_KIND_KERNEL) continue;
            const sg_prof_record *a = api_of(rec, n, rec[i].correlation_id);
            if (!a || a->api != SG_PROF_API_GRAPH_LAUNCH) continue;
            graph_kernels++;
            TU_CHECK(rec[i].graph_id != 0, "%s: replayed kernel %s has graph id 0", what, rec[i].name);
        }
        TU_CHECK(graph_kernels > 0 && graph_kernels + eager_launches == kernels,
                 "%s: %llu graph-launched kernels + %llu launch calls, %llu kernels in the steps",
                 what, (unsigned long long)graph_kernels, (unsigned long long)eager_launches,
                 (unsigned long long)kernels);
    } else {
        /* Eager: the runtime's counter sees a cuBLASLt matmul as one launch; CUPTI sees each of
         * its kernels (split-K runs two), so it sees at least as many. */
        TU_CHECK(kernels >= launched, "%s: %llu kernels in the steps, the runtime launched %llu",
                 what, (unsigned long long)kernels, (unsigned long long)launched);
    }
    /* By op family: the whole device time is split (each record once); eagerly the matmuls,
     * the loss and the optimizer have theirs; under step scope the graph's work is other. */
    double fam[SG_WORK_FAMILIES + 1], all = 0, split = 0;
    TU_OK(ctx, sg_prof_family_us(rec, n, fam));
    for (size_t i = 0; i < n; i++)
        if ((rec[i].kind == SG_PROF_KIND_KERNEL || rec[i].kind == SG_PROF_KIND_MEMCPY || rec[i].kind == SG_PROF_KIND_MEMSET) &&
            !(rec[i].start_ns == 0 && rec[i].end_ns == 0) && rec[i].end_ns >= rec[i].start_ns)
            all += (double)(rec[i].end_ns - rec[i].start_ns) * 1e-3;
    for (int k = 0; k <= SG_WORK_FAMILIES; k++) split += fam[k];
    TU_CHECK(fabs(split - all) <= 1e-9 * all, "%s: families sum to %.3f us of %.3f", what, split, all);
    printf("%s: by family (us):", what);
    for (int k = 0; k <= SG_WORK_FAMILIES; k++)
        printf(" %s %.1f", k < SG_WORK_FAMILIES ? sg_work_family_name((sg_work_family)k) : "other", fam[k]);
    printf("\n");
    if (sc == SG_SCOPE_EAGER)
        TU_CHECK(fam[SG_WORK_MATMUL] > 0 && fam[SG_WORK_LOSS] > 0 && fam[SG_WORK_OPTIMIZER] > 0 &&
                 fam[SG_WORK_MATMUL] > fam[SG_WORK_FAMILIES],
                 "%s: matmul %.1f, loss %.1f, optimizer %.1f, other %.1f us", what, fam[SG_WORK_MATMUL],
                 fam[SG_WORK_LOSS], fam[SG_WORK_OPTIMIZER], fam[SG_WORK_FAMILIES]);
    else
        TU_CHECK(fam[SG_WORK_MATMUL] == 0 && fam[SG_WORK_OPTIMIZER] == 0 && fam[SG_WORK_FAMILIES] > 0,
                 "%s: a replayed step's work was given a family (matmul %.1f, optimizer %.1f us)", what,
                 fam[SG_WORK_MATMUL], fam[SG_WORK_OPTIMIZER]);
    gpu_check_trace(what, ctx, p, sg_scope_name(sc));
    sg_trainer_destroy(t);
    sg_optim_destroy(o);
    sg_model_destroy(m);
}

static void gpu_all(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CUDA);
    sg_prof *p = NULL;
    sg_status st = sg_prof_create(ctx, &p);
    if (st == SG_ERR_UNSUPPORTED) {
        printf("SKIP: %s\n", sg_ctx_last_error(ctx));
        sg_ctx_destroy(ctx);
        exit(TU_SKIP);
    }
    TU_OK(ctx, st);
    gpu_counts(ctx, p);
    gpu_trainer_window(ctx, p, SG_SCOPE_EAGER);
    gpu_trainer_window(ctx, p, SG_SCOPE_STEP);

    /* Destroying releases the process's one profiler; destroy while started stops it and gives
     * the context its range hook back. */
    TU_OK(ctx, sg_prof_start(p));
    TU_CHECK(ctx->range_hook != NULL, "sg_prof_start did not set the context's range hook");
    sg_prof_destroy(p);
    TU_CHECK(ctx->range_hook == NULL, "sg_prof_destroy left the context's range hook set");
    TU_OK(ctx, sg_prof_create(ctx, &p));
    sg_prof_destroy(p);
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    if (strcmp(mode, "trace") == 0) {
        if (argc != 3) {
            fprintf(stderr, "usage: test_prof trace FILE\n");
            return 2;
        }
        return write_synthetic_trace(argv[2]);
    }
    tu_seed("test_prof");
    if (strcmp(mode, "cpu") == 0) {
        cpu_union_known();
        cpu_union_random();
        cpu_summarize();
        cpu_gap_histogram();
        cpu_api_classes();
        cpu_mark_nested();
        cpu_analyze();
        cpu_family();
        cpu_trace();
        cpu_refusals();
    } else if (strcmp(mode, "gpu") == 0) {
        gpu_all();
    } else {
        fprintf(stderr, "usage: test_prof cpu|gpu|trace FILE\n");
        return 2;
    }
    return tu_finish("test_prof");
}
