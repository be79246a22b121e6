/* test_prof.c: the CUPTI profiler. `cpu`: the interval union on synthetic intervals whose
 * answer is known (and against a brute-force count on random integer intervals), summing of
 * records, and the clear refusal on the CPU backend. `gpu`: profiles windows of known launches
 * (fills, copies) and checks the counts against the runtime's own launch counter. */
#include "prof/prof.h"
#include "testutil.h"

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
        {SG_PROF_KIND_KERNEL, 0, 7, 1, T + 0, T + 10000},         /* 10 us, short */
        {SG_PROF_KIND_KERNEL, 0, 7, 2, T + 5000, T + 100000},     /* 95 us, overlaps the first */
        {SG_PROF_KIND_MEMCPY, 0, 7, 3, T + 200000, T + 210001},   /* 10.001 us, after a gap */
        {SG_PROF_KIND_MEMSET, 0, 7, 4, 0, 0},                     /* untimed: counted only */
        {SG_PROF_KIND_KERNEL, 0, 7, 5, T + 210001, T + 210003},   /* 2 ns, touches the copy */
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
    sg_prof_records(p, &n);
    TU_CHECK(n == r->kernels + r->memcpys + r->memsets, "%s: %zu records, counts add to %llu", what,
             n, (unsigned long long)(r->kernels + r->memcpys + r->memsets));
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
    printf("%s: %llu kernels, %llu memcpys, busy %.1f us, span %.1f us, kernel sum %.1f us, "
           "short share %.2f\n",
           what, (unsigned long long)r->kernels, (unsigned long long)r->memcpys, r->busy_us,
           r->span_us, r->kernel_us_sum, r->short_kernel_share);
}

static void gpu_counts(void)
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
    for (int i = 0; i < fills; i++) TU_OK(ctx, sg_tensor_fill(big, (double)i));
    TU_OK(ctx, sg_tensor_copy_from_host(a, host, sizeof host)); /* one H2D memcpy */
    TU_OK(ctx, sg_tensor_copy(b, a));                           /* one D2D memcpy */
    uint64_t launched = sg_ctx_launch_count(ctx) - c0;
    sg_prof_result r;
    TU_OK(ctx, sg_prof_stop(p, &r));
    TU_CHECK(launched == (uint64_t)fills, "the runtime counted %llu launches for %d fills",
             (unsigned long long)launched, fills);
    check_window("window 1 (fills + 2 copies)", p, &r, launched, 2);

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

    /* Destroying releases the process's one profiler; destroy while started stops it. */
    TU_OK(ctx, sg_prof_start(p));
    sg_prof_destroy(p);
    TU_OK(ctx, sg_prof_create(ctx, &p));
    sg_prof_destroy(p);

    sg_tensor_destroy(big);
    sg_tensor_destroy(a);
    sg_tensor_destroy(b);
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_prof");
    if (strcmp(mode, "cpu") == 0) {
        cpu_union_known();
        cpu_union_random();
        cpu_summarize();
        cpu_refusals();
    } else if (strcmp(mode, "gpu") == 0) {
        gpu_counts();
    } else {
        fprintf(stderr, "usage: test_prof cpu|gpu\n");
        return 2;
    }
    return tu_finish("test_prof");
}
