/* test_amp.c: dynamic loss scaling (sg_amp_unscale). `cpu`: the reference's unscale against
 * grad_lo / scale computed here (exact: the scale is a power of two) for f32 (separate and in
 * place), bf16 and f64 grad_lo; found on finite input, with one inf, -inf or NaN at the first,
 * the last or a random index, and when an unscaled value overflows f32 (scale < 1); the
 * scaler's transitions against a model written here (halving and a skip on overflow, growth
 * after exactly growth_interval finite calls, the clamp of inf, 0, NaN and out-of-range
 * scales); argument errors; a CPU capture replayed while the scale changes. `gpu`: the CUDA
 * kernel against the CPU reference, bit for bit, for P from 1 to several million (many blocks,
 * the grid-stride loop), f32 and bf16, in place and misaligned, scales that are not powers of
 * two; non-finite values at the first and the last element of a large buffer; many calls in a
 * row on one context (the scratch words must be back at 0 after each); one launch per call;
 * and a CUDA Graph of the unscale replayed while the scale changes. Both: sg_amp_check (the
 * check and scaler update alone) against sg_amp_unscale, and its refusals.
 *
 * Tolerances: none. Unscaling multiplies by 1 / scale in f32 on both backends (the CPU divides
 * in f32 too), and a product of two floats rounded once is the same number everywhere; with a
 * power-of-two scale it is exactly grad_lo / scale. The scaler holds powers of two and small
 * integers. So every comparison here is exact (NaN matching NaN). */
#include "testutil.h"

#include "ops/amp.h"

/* ---- shared helpers ---- */

static double read1(const sg_tensor *t)
{
    double *v = tu_get(t);
    double x = v[0];
    free(v);
    return x;
}

/* The scaler's state, as the test's model of the update sees it. */
typedef struct scaler_state {
    double scale, good, interval, skipped;
} scaler_state;

static void set_scaler(sg_tensor *sc, scaler_state s)
{
    double v[SG_SCALER_COUNT] = {s.scale, s.good, s.interval, s.skipped};
    tu_set(sc, v);
}

static scaler_state get_scaler(const sg_tensor *sc)
{
    double *v = tu_get(sc);
    scaler_state s = {v[SG_SCALER_SCALE], v[SG_SCALER_GOOD_STEPS], v[SG_SCALER_GROWTH_INTERVAL],
                      v[SG_SCALER_SKIPPED]};
    free(v);
    return s;
}

/* The update as stepgraph.h documents it, written independently of amp_cpu.c. */
static scaler_state model_update(scaler_state s, int found)
{
    if (found) {
        s.scale *= 0.5;
        s.good = 0;
        s.skipped += 1;
    } else if (++s.good >= s.interval) {
        s.scale *= 2;
        s.good = 0;
    }
    if (isnan(s.scale)) s.scale = SG_LOSS_SCALE_MIN;
    if (s.scale < SG_LOSS_SCALE_MIN) s.scale = SG_LOSS_SCALE_MIN;
    if (s.scale > SG_LOSS_SCALE_MAX) s.scale = SG_LOSS_SCALE_MAX;
    return s;
}

static int same_num(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

static void expect_scaler(const char *what, const sg_tensor *sc, scaler_state want)
{
    scaler_state s = get_scaler(sc);
    TU_CHECK(same_num(s.scale, want.scale) && s.good == want.good &&
                 s.interval == want.interval && s.skipped == want.skipped,
             "%s: scaler is {scale %g, good_steps %g, growth_interval %g, skipped %g}, expected "
             "{%g, %g, %g, %g}", what, s.scale, s.good, s.interval, s.skipped, want.scale,
             want.good, want.interval, want.skipped);
}

/* got and want (n) equal element by element (NaN matching NaN); prints the first difference. */
static void expect_same(const char *what, const double *got, const double *want, int64_t n)
{
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (!same_num(got[i], want[i]) && bad++ == 0) first = i;
    TU_CHECK(bad == 0, "%s: %lld of %lld elements differ; first [%lld] got %.9g want %.9g", what,
             (long long)bad, (long long)n, (long long)first, first >= 0 ? got[first] : 0.0,
             first >= 0 ? want[first] : 0.0);
}

/* grad_lo / scale rounded once to f32: exact for f32 and bf16 values and a power-of-two scale
 * (no subnormal or overflowing results here, unless a test wants one); f64 values round. */
static double *unscaled(const double *x, int64_t n, double scale)
{
    double *w = malloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++) w[i] = (double)(float)(x[i] / scale);
    return w;
}

/* grad_lo of dtype dt and P elements on ctx, and grad: grad_lo itself (in place, f32) or a new
 * f32 tensor. */
typedef struct amp_bufs {
    sg_tensor *lo, *g, *sc, *found;
    int in_place;
} amp_bufs;

static amp_bufs bufs_create(sg_ctx *ctx, sg_dtype dt, int64_t P, int in_place)
{
    amp_bufs b = {NULL, NULL, NULL, NULL, in_place};
    b.lo = tu_tensor1(ctx, dt, P, "grad_lo");
    b.g = in_place ? b.lo : tu_tensor1(ctx, SG_DTYPE_F32, P, "grad");
    b.sc = tu_tensor1(ctx, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler");
    b.found = tu_tensor1(ctx, SG_DTYPE_I32, 1, "found");
    return b;
}

static void bufs_destroy(amp_bufs *b)
{
    if (!b->in_place) sg_tensor_destroy(b->g);
    sg_tensor_destroy(b->lo), sg_tensor_destroy(b->sc), sg_tensor_destroy(b->found);
}

/* One call with grad (unless in place) and found poisoned first; returns grad's values. */
static double *run_unscale(amp_bufs *b)
{
    if (!b->in_place) tu_poison(b->g);
    tu_poison(b->found);
    TU_OK(b->lo->ctx, sg_amp_unscale(b->lo->ctx, b->lo, b->g, b->sc, b->found));
    return tu_get(b->g);
}

/* Random scaled gradients: uniform(-1, 1) * scale, stored in lo's dtype; returns the values as
 * stored. */
static double *fill_scaled(sg_tensor *lo, double scale)
{
    free(tu_random(lo, -scale, scale));
    return tu_get(lo);
}

/* ---- values, found, transitions (either backend: the oracle is exact) ---- */

/* Finite input: grad = grad_lo / scale exactly, found 0, good_steps + 1, nothing else moves. */
static void check_values(sg_ctx *ctx, sg_dtype dt, int64_t P, int in_place)
{
    const char *be = sg_backend_name(ctx->backend);
    amp_bufs b = bufs_create(ctx, dt, P, in_place);
    double scale = ldexp(1.0, tu_randint(-8, 24));
    double *x = fill_scaled(b.lo, scale);
    scaler_state s = {scale, 5, 2000, 3};
    set_scaler(b.sc, s);
    double *got = run_unscale(&b), *want = unscaled(x, P, scale);
    char what[160];
    snprintf(what, sizeof what, "%s %s P=%lld scale 2^%d%s", be, sg_dtype_name(dt), (long long)P,
             (int)log2(scale), in_place ? " in place" : "");
    expect_same(what, got, want, P);
    TU_CHECK(read1(b.found) == 0, "%s: found is %g on finite input", what, read1(b.found));
    expect_scaler(what, b.sc, model_update(s, 0));
    free(x), free(got), free(want);
    bufs_destroy(&b);
}

/* One inf, -inf or NaN at index `at` (the others finite): found 1, the other elements still
 * unscaled, the bad one inf (same sign) or NaN, the scale halved and the step counted as
 * skipped; then a clean input clears found. */
static void check_nonfinite(sg_ctx *ctx, sg_dtype dt, int64_t P)
{
    const char *be = sg_backend_name(ctx->backend);
    amp_bufs b = bufs_create(ctx, dt, P, 0);
    const double bads[3] = {INFINITY, -INFINITY, NAN};
    const char *bad_names[3] = {"inf", "-inf", "NaN"};
    int64_t where[3] = {0, P - 1, (int64_t)(tu_next() % (uint64_t)P)};
    for (int k = 0; k < 3; k++) {
        for (int w = 0; w < 3; w++) {
            double scale = ldexp(1.0, tu_randint(0, 20));
            double *x = fill_scaled(b.lo, scale);
            x[where[w]] = bads[k];
            tu_set(b.lo, x);
            scaler_state s = {scale, tu_randint(0, 10), 2000, tu_randint(0, 5)};
            set_scaler(b.sc, s);
            double *got = run_unscale(&b), *want = unscaled(x, P, scale);
            char what[160];
            snprintf(what, sizeof what, "%s %s P=%lld with %s at [%lld]", be, sg_dtype_name(dt),
                     (long long)P, bad_names[k], (long long)where[w]);
            expect_same(what, got, want, P);
            TU_CHECK(read1(b.found) == 1, "%s: found is %g, expected 1", what, read1(b.found));
            expect_scaler(what, b.sc, model_update(s, 1));
            free(x), free(got), free(want);
        }
    }
    /* A clean input after the bad ones: the flag does not stick (on CUDA: the scratch word). */
    double *x = fill_scaled(b.lo, 1024);
    scaler_state s = {1024, 0, 2000, 0};
    set_scaler(b.sc, s);
    free(run_unscale(&b));
    TU_CHECK(read1(b.found) == 0, "%s %s P=%lld: found is %g on a clean input after bad ones", be,
             sg_dtype_name(dt), (long long)P, read1(b.found));
    free(x);
    bufs_destroy(&b);
}

/* scale < 1 can push a finite f32 value past f32's range when unscaled: that is reported too
 * (the optimizer would otherwise take an inf). */
static void check_unscale_overflow(sg_ctx *ctx)
{
    const char *be = sg_backend_name(ctx->backend);
    amp_bufs b = bufs_create(ctx, SG_DTYPE_F32, 9, 0);
    double *x = fill_scaled(b.lo, 0.25);
    x[4] = 3e38; /* / 0.25 = 1.2e39 > FLT_MAX */
    tu_set(b.lo, x);
    scaler_state s = {0.25, 7, 2000, 0};
    set_scaler(b.sc, s);
    double *got = run_unscale(&b);
    TU_CHECK(isinf(got[4]) && got[4] > 0, "%s: 3e38 / 0.25 gave %g, expected inf", be, got[4]);
    TU_CHECK(read1(b.found) == 1, "%s: found is %g after an unscale overflow", be, read1(b.found));
    expect_scaler("unscale overflow", b.sc, model_update(s, 1));
    free(x), free(got);
    bufs_destroy(&b);
}

/* The scaler's state machine over a sequence of calls; each step's state against the model. */
static void check_transitions(sg_ctx *ctx)
{
    const char *be = sg_backend_name(ctx->backend);
    const int64_t P = 37;
    amp_bufs b = bufs_create(ctx, SG_DTYPE_F32, P, 0);
    char what[160];

    /* Growth after exactly growth_interval finite calls (3), a halving on overflow, then the
     * count starts again from 0. */
    const int G = 3;
    scaler_state s = {1024, 0, G, 0};
    set_scaler(b.sc, s);
    /* 'f': finite, 'i': an inf */
    const char seq[] = "fffffffifff";
    for (int c = 0; seq[c]; c++) {
        double *x = fill_scaled(b.lo, s.scale);
        if (seq[c] == 'i') {
            x[tu_randint(0, (int)P - 1)] = INFINITY;
            tu_set(b.lo, x);
        }
        double *got = run_unscale(&b), *want = unscaled(x, P, s.scale);
        s = model_update(s, seq[c] == 'i');
        snprintf(what, sizeof what, "%s transitions call %d (%c)", be, c + 1, seq[c]);
        expect_same(what, got, want, P);
        TU_CHECK(read1(b.found) == (seq[c] == 'i'), "%s: found is %g", what, read1(b.found));
        expect_scaler(what, b.sc, s);
        free(x), free(got), free(want);
    }
    /* Spelled out, for a reader: 1024 -> 2048 after 3 calls, 4096 after 6, then the inf
     * (call 8) halves it with good_steps 1 thrown away; 3 finite calls double it again. */
    TU_CHECK(s.scale == 4096 && s.skipped == 1 && s.good == 0,
             "%s: the model itself ended at scale %g, skipped %g, good %g", be, s.scale, s.skipped,
             s.good);

    /* Edge states: {scale, good, interval, skipped}, input finite (0) or with an inf (1). */
    struct {
        const char *name;
        scaler_state s;
        int bad;
        scaler_state want;
    } cases[] = {
        {"inf scale clamps to the maximum", {INFINITY, 0, 2000, 0}, 0,
         {SG_LOSS_SCALE_MAX, 1, 2000, 0}},
        {"growth past the maximum clamps", {SG_LOSS_SCALE_MAX, 1999, 2000, 0}, 0,
         {SG_LOSS_SCALE_MAX, 0, 2000, 0}},
        {"halving below the minimum clamps", {SG_LOSS_SCALE_MIN, 4, 2000, 9}, 1,
         {SG_LOSS_SCALE_MIN, 0, 2000, 10}},
        {"growth_interval 1 doubles every finite step", {256, 0, 1, 0}, 0, {512, 0, 1, 0}},
        {"good_steps already at the interval grows at once", {256, 2000, 2000, 0}, 0,
         {512, 0, 2000, 0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        double *x = fill_scaled(b.lo, 16);
        if (cases[c].bad) {
            x[0] = INFINITY;
            tu_set(b.lo, x);
        }
        set_scaler(b.sc, cases[c].s);
        free(run_unscale(&b));
        snprintf(what, sizeof what, "%s: %s", be, cases[c].name);
        TU_CHECK(read1(b.found) == cases[c].bad, "%s: found is %g", what, read1(b.found));
        expect_scaler(what, b.sc, cases[c].want);
        TU_CHECK(model_update(cases[c].s, cases[c].bad).scale == cases[c].want.scale,
                 "%s: the test's model disagrees with the case", what);
        free(x);
    }

    /* A broken scale. inf: 1/inf = 0, every grad 0 and finite (above). NaN: every grad NaN, so
     * found, and fmaxf(NaN, MIN) gives the minimum. 0: 1/0 = inf, so grad is inf (or NaN for a
     * zero grad_lo): found, and 0 * 0.5 clamps to the minimum. */
    const double broken[2] = {NAN, 0.0};
    for (int k = 0; k < 2; k++) {
        double *x = fill_scaled(b.lo, 16);
        scaler_state bs = {broken[k], 3, 2000, 0};
        set_scaler(b.sc, bs);
        double *got = run_unscale(&b);
        snprintf(what, sizeof what, "%s: scale %g", be, broken[k]);
        TU_CHECK(read1(b.found) == 1, "%s: found is %g, expected 1", what, read1(b.found));
        TU_CHECK(!isfinite(got[0]), "%s: grad[0] is %g, expected inf or NaN", what, got[0]);
        expect_scaler(what, b.sc, (scaler_state){SG_LOSS_SCALE_MIN, 0, 2000, 1});
        free(x), free(got);
    }
    bufs_destroy(&b);
}

/* ---- capture: the unscale alone, replayed while the scale moves ---- */

static sg_status unscale_fn(void *u)
{
    amp_bufs *b = u;
    return sg_amp_unscale(b->lo->ctx, b->lo, b->g, b->sc, b->found);
}

/* The graph must read the scale at replay time: growth_interval 2, so replays 1-2 unscale by
 * 1024 (the second doubling the scale), 3 by 2048 with an inf (halving it), 4 by 1024 again.
 * nodes: the expected node count (1 on both backends). */
static void check_capture(sg_ctx *ctx, sg_dtype dt, int64_t P)
{
    const char *be = sg_backend_name(ctx->backend);
    amp_bufs b = bufs_create(ctx, dt, P, 0);
    scaler_state s = {1024, 0, 2, 0};
    set_scaler(b.sc, s);
    free(fill_scaled(b.lo, 1024));
    tu_poison(b.g), tu_poison(b.found);
    sg_graph_options o = sg_graph_options_default();
    o.name = "amp";
    o.warmup = 0;
    sg_graph *gph = NULL;
    TU_OK(ctx, sg_graph_capture(ctx, unscale_fn, &b, &o, &gph));
    if (!sg_graphs_disabled()) {
        sg_graph_stats st;
        TU_OK(ctx, sg_graph_get_stats(gph, &st));
        TU_CHECK(st.nodes == 1, "%s: the unscale graph holds %d nodes, expected 1", be, st.nodes);
        TU_CHECK(read1(b.found) == -123456789.0, "%s: capture ran the unscale", be);
        expect_scaler("capture", b.sc, s);
    }
    for (int r = 0; r < 4; r++) {
        double *x = fill_scaled(b.lo, s.scale);
        int bad = r == 2;
        if (bad) {
            x[P - 1] = INFINITY;
            tu_set(b.lo, x);
        }
        tu_poison(b.g), tu_poison(b.found);
        TU_OK(ctx, sg_graph_replay(gph));
        double *got = tu_get(b.g), *want = unscaled(x, P, s.scale);
        s = model_update(s, bad);
        char what[128];
        snprintf(what, sizeof what, "%s %s: unscale replay %d", be, sg_dtype_name(dt), r + 1);
        expect_same(what, got, want, P);
        TU_CHECK(read1(b.found) == bad, "%s: found is %g", what, read1(b.found));
        expect_scaler(what, b.sc, s);
        free(x), free(got), free(want);
    }
    sg_graph_destroy(gph);
    bufs_destroy(&b);
}

/* ---- cpu ---- */

/* Every argument check, each failing before anything is written; the context stays usable. */
static void cpu_errors(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU), *other = tu_ctx(SG_BACKEND_CPU);
    const int64_t P = 10;
    sg_tensor *lo = tu_tensor1(ctx, SG_DTYPE_BF16, P, "grad_lo");
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_F32, P, "grad");
    sg_tensor *sc = tu_tensor1(ctx, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler");
    sg_tensor *found = tu_tensor1(ctx, SG_DTYPE_I32, 1, "found");
    sg_tensor *lo_i32 = tu_tensor1(ctx, SG_DTYPE_I32, P, "lo_i32");
    sg_tensor *g_bf16 = tu_tensor1(ctx, SG_DTYPE_BF16, P, "g_bf16");
    sg_tensor *g_f64 = tu_tensor1(ctx, SG_DTYPE_F64, P, "g_f64");
    sg_tensor *g9 = tu_tensor1(ctx, SG_DTYPE_F32, P - 1, "g9");
    sg_tensor *sc3 = tu_tensor1(ctx, SG_DTYPE_F32, 3, "sc3");
    sg_tensor *sc_f64 = tu_tensor1(ctx, SG_DTYPE_F64, SG_SCALER_COUNT, "sc_f64");
    sg_tensor *found_f32 = tu_tensor1(ctx, SG_DTYPE_F32, 1, "found_f32");
    sg_tensor *found2 = tu_tensor1(ctx, SG_DTYPE_I32, 2, "found2");
    sg_tensor *g_other = tu_tensor1(other, SG_DTYPE_F32, P, "g_other");
    /* Overlaps: grad_lo and grad, views one element apart in one f32 buffer; a scaler whose
     * last two elements are grad's first two. */
    sg_tensor *base = tu_tensor1(ctx, SG_DTYPE_F32, P + 2, "base");
    int64_t four = SG_SCALER_COUNT, np = P;
    sg_tensor *lo_a = NULL, *g_b = NULL, *sc_in_g = NULL;
    TU_OK(ctx, sg_tensor_view(base, 0, 1, &np, "lo_a", &lo_a));
    TU_OK(ctx, sg_tensor_view(base, 1, 1, &np, "g_b", &g_b));
    TU_OK(ctx, sg_tensor_view(base, 0, 1, &four, "sc_in_g", &sc_in_g));
    sg_tensor *g_c = NULL;
    TU_OK(ctx, sg_tensor_view(base, 2, 1, &np, "g_c", &g_c));

    free(tu_random(lo, -100, 100));
    free(tu_random(g_f64, -100, 100));
    tu_poison(g);
    tu_poison(found);
    scaler_state s = {1024, 1, 2000, 0};
    set_scaler(sc, s);

    const char *fn = "sg_amp_unscale";
    TU_FAILS(ctx, sg_amp_unscale(ctx, NULL, g, sc, found), SG_ERR_NULL, "'grad_lo'");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo, NULL, sc, found), SG_ERR_NULL, "'grad'");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo, g, NULL, found), SG_ERR_NULL, "'scaler'");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo, g, sc, NULL), SG_ERR_NULL, "'found'");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo_i32, g, sc, found), SG_ERR_DTYPE,
             "sg_amp_unscale: tensor 'grad_lo' is i32, expected bf16 or f32");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo, g_bf16, sc, found), SG_ERR_DTYPE,
             "tensor 'grad' is bf16, expected f32");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo, g_f64, sc, found), SG_ERR_DTYPE, "'grad' is f64");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo, g9, sc, found), SG_ERR_SHAPE,
             "'grad' is (9) f32 but 'grad_lo' is (10) bf16");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo, g, sc3, found), SG_ERR_SHAPE,
             "'scaler' (sc3) is (3) f32, expected 4 elements (sg_loss_scaler: scale, good_steps");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo, g, sc_f64, found), SG_ERR_DTYPE,
             "tensor 'scaler' is f64, expected f32");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo, g, sc, found_f32), SG_ERR_DTYPE,
             "tensor 'found' is f32, expected i32");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo, g, sc, found2), SG_ERR_SHAPE,
             "'found' (found2) is (2) i32, expected 1 element (a flag)");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo, g_other, sc, found), SG_ERR_BACKEND, "another context");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo_a, g_b, sc, found), SG_ERR_INVALID,
             "output 'grad' overlaps 'grad_lo'");
    TU_FAILS(ctx, sg_amp_unscale(ctx, lo, g_c, sc_in_g, found), SG_ERR_INVALID,
             "output 'scaler' overlaps 'grad'");
    TU_FAILS(ctx, sg_amp_unscale(ctx, g_c, g, sc_in_g, found), SG_ERR_INVALID,
             "output 'scaler' overlaps 'grad_lo'");
    TU_CHECK(strstr(sg_ctx_last_error(ctx), fn) != NULL, "message names the call: %s",
             sg_ctx_last_error(ctx));
    TU_CHECK(sg_amp_unscale(NULL, lo, g, sc, found) == SG_ERR_NULL, "NULL ctx accepted");

    /* Nothing was written by the rejected calls. */
    double *gv = tu_get(g);
    int64_t written = 0;
    for (int64_t i = 0; i < P; i++) written += !isnan(gv[i]);
    TU_CHECK(written == 0, "%lld elements of grad written by rejected calls", (long long)written);
    free(gv);
    TU_CHECK(read1(found) == -123456789.0, "found written by rejected calls");
    expect_scaler("scaler after rejected calls", sc, s);

    /* The context works: a valid call unscales, and f64 grad_lo is a CPU dtype. */
    TU_OK(ctx, sg_amp_unscale(ctx, lo, g, sc, found));
    TU_CHECK(read1(found) == 0, "the valid call after the errors: found %g", read1(found));
    expect_scaler("the valid call after the errors", sc, model_update(s, 0));
    TU_OK(ctx, sg_amp_unscale(ctx, g_f64, g, sc, found));

    sg_tensor *ts[] = {lo_a, g_b, sc_in_g, g_c, base, lo, g, sc, found, lo_i32, g_bf16, g_f64,
                       g9, sc3, sc_f64, found_f32, found2, g_other};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
    sg_ctx_destroy(other);
    sg_ctx_destroy(ctx);
}

static void check_vs_unscale(sg_ctx *ctx, sg_dtype dt, int64_t P, double scale, int64_t bad_at);
static void check_errors(sg_ctx *ctx);

static void cpu_tests(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const int64_t Ps[] = {1, 5, 1000, 100003};
    for (size_t i = 0; i < sizeof Ps / sizeof *Ps; i++) {
        check_values(ctx, SG_DTYPE_F32, Ps[i], 0);
        check_values(ctx, SG_DTYPE_F32, Ps[i], 1);
        check_values(ctx, SG_DTYPE_BF16, Ps[i], 0);
        check_values(ctx, SG_DTYPE_F64, Ps[i], 0);
    }
    check_nonfinite(ctx, SG_DTYPE_F32, 1001);
    check_nonfinite(ctx, SG_DTYPE_BF16, 1001);
    check_nonfinite(ctx, SG_DTYPE_F64, 7);
    check_nonfinite(ctx, SG_DTYPE_F32, 1);
    check_unscale_overflow(ctx);
    check_transitions(ctx);
    check_capture(ctx, SG_DTYPE_BF16, 1001);
    check_vs_unscale(ctx, SG_DTYPE_BF16, 1001, 3000.5, -1);
    check_vs_unscale(ctx, SG_DTYPE_F32, 7, 0.25, 3);
    check_vs_unscale(ctx, SG_DTYPE_F64, 5, 65536, -1);
    check_errors(ctx);
    sg_ctx_destroy(ctx);
    cpu_errors();
}

/* ---- gpu ---- */

/* The scratch words (counter, found) are back at 0 for the next call or replay. */
static void expect_scratch_zero(sg_ctx *gpu, const char *what)
{
    double *c = tu_get(gpu->scratch[SG_SLOT_AMP]);
    TU_CHECK(c[0] == 0 && c[1] == 0, "%s: the scratch words are %g (counter) and %g (found), "
             "expected 0", what, c[0], c[1]);
    free(c);
}

/* A tensor of P elements, or a view of one at element 1 (4 or 2 bytes off: the kernel's
 * scalar path). *base receives the owning tensor (NULL when none). */
static sg_tensor *maybe_misaligned(sg_ctx *ctx, sg_dtype dt, int64_t P, int misaligned,
                                   const char *name, sg_tensor **base)
{
    *base = NULL;
    if (!misaligned) return tu_tensor1(ctx, dt, P, name);
    *base = tu_tensor1(ctx, dt, P + 1, "base");
    sg_tensor *t = NULL;
    TU_OK(ctx, sg_tensor_view(*base, 1, 1, &P, name, &t));
    return t;
}

/* GPU against the CPU reference on the same input and scaler: grad, found and the scaler
 * equal bit for bit (NaN matching NaN), one launch, scratch back at 0. misaligned: bit 1
 * grad_lo, bit 2 grad. bad_at >= 0: bad_val there. scale: any float (not only powers of two:
 * both sides multiply by the same f32 1 / scale). */
static void gpu_vs_cpu(sg_ctx *gpu, sg_ctx *cpu, sg_dtype dt, int64_t P, int in_place,
                       int misaligned, double scale, int64_t bad_at, double bad_val)
{
    char what[200];
    snprintf(what, sizeof what, "gpu %s P=%lld%s%s%s scale %g", sg_dtype_name(dt), (long long)P,
             in_place ? " in place" : "", misaligned & 1 ? " grad_lo misaligned" : "",
             misaligned & 2 ? " grad misaligned" : "", scale);
    if (bad_at >= 0)
        snprintf(what + strlen(what), sizeof what - strlen(what), " with %g at [%lld]", bad_val,
                 (long long)bad_at);
    sg_tensor *lo_base, *g_base = NULL;
    sg_tensor *lo = maybe_misaligned(gpu, dt, P, misaligned & 1, "grad_lo", &lo_base);
    sg_tensor *g = in_place ? lo
                            : maybe_misaligned(gpu, SG_DTYPE_F32, P, misaligned & 2, "grad", &g_base);
    sg_tensor *sc = tu_tensor1(gpu, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler");
    sg_tensor *found = tu_tensor1(gpu, SG_DTYPE_I32, 1, "found");
    amp_bufs c = bufs_create(cpu, dt, P, in_place);

    double *x = fill_scaled(lo, scale);
    if (bad_at >= 0) {
        x[bad_at] = bad_val;
        tu_set(lo, x);
    }
    tu_set(c.lo, x);
    scaler_state s = {scale, tu_randint(0, 3), 4, tu_randint(0, 3)};
    set_scaler(sc, s);
    set_scaler(c.sc, s);
    if (!in_place) tu_poison(g);
    tu_poison(found);
    uint64_t before = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_amp_unscale(gpu, lo, g, sc, found));
    uint64_t launches = sg_ctx_launch_count(gpu) - before;
    TU_CHECK(launches == 1, "%s: %llu launches, expected 1", what, (unsigned long long)launches);
    double *ref = run_unscale(&c), *got = tu_get(g);
    expect_same(what, got, ref, P);
    TU_CHECK(read1(found) == read1(c.found), "%s: found is %g, the reference %g", what,
             read1(found), read1(c.found));
    TU_CHECK(read1(found) == (bad_at >= 0), "%s: found is %g", what, read1(found));
    expect_scaler(what, sc, get_scaler(c.sc));
    expect_scratch_zero(gpu, what);
    free(x), free(ref), free(got);
    if (!in_place) sg_tensor_destroy(g);
    sg_tensor_destroy(g_base);
    sg_tensor_destroy(lo), sg_tensor_destroy(lo_base), sg_tensor_destroy(sc);
    sg_tensor_destroy(found);
    bufs_destroy(&c);
}

/* Many calls in a row on one context and one set of tensors, inputs finite or not, each
 * against the CPU reference that went through the same sequence: a scratch word left non-zero
 * by one call would show in the next one's found (or the block count). growth_interval 3, so
 * the scale grows, halves and grows again along the way. */
static void gpu_repeat(sg_ctx *gpu, sg_ctx *cpu, sg_dtype dt, int64_t P)
{
    amp_bufs b = bufs_create(gpu, dt, P, 0), c = bufs_create(cpu, dt, P, 0);
    scaler_state s = {32768, 0, 3, 0};
    set_scaler(b.sc, s);
    set_scaler(c.sc, s);
    /* f finite, i an inf at the end, n a NaN at the start, l a -inf at a random index */
    const char seq[] = "fffifnfffffnilff";
    for (int k = 0; seq[k]; k++) {
        double scale = get_scaler(c.sc).scale;
        double *x = fill_scaled(b.lo, scale);
        if (seq[k] == 'i') x[P - 1] = INFINITY;
        if (seq[k] == 'n') x[0] = NAN;
        if (seq[k] == 'l') x[tu_next() % (uint64_t)P] = -INFINITY;
        tu_set(b.lo, x);
        tu_set(c.lo, x);
        double *got = run_unscale(&b), *ref = run_unscale(&c);
        char what[128];
        snprintf(what, sizeof what, "gpu %s P=%lld repeated call %d (%c)", sg_dtype_name(dt),
                 (long long)P, k + 1, seq[k]);
        expect_same(what, got, ref, P);
        TU_CHECK(read1(b.found) == (seq[k] != 'f'), "%s: found is %g", what, read1(b.found));
        TU_CHECK(read1(c.found) == (seq[k] != 'f'), "%s: the reference's found is %g", what,
                 read1(c.found));
        s = model_update(s, seq[k] != 'f');
        expect_scaler(what, b.sc, s);
        expect_scaler(what, c.sc, s);
        expect_scratch_zero(gpu, what);
        free(x), free(got), free(ref);
    }
    bufs_destroy(&b);
    bufs_destroy(&c);
}

/* The checks CUDA can make without reading device memory. */
/* sg_amp_check against sg_amp_unscale on ctx, from the same grad_lo (dt, P elements; an inf
 * at bad_at when >= 0) and scaler state: found and the scaler bit for bit, inv = f32(1 / the
 * scale before), grad_lo untouched; on CUDA one launch, the scratch words back at 0. */
static void check_vs_unscale(sg_ctx *ctx, sg_dtype dt, int64_t P, double scale, int64_t bad_at)
{
    char what[160];
    snprintf(what, sizeof what, "%s sg_amp_check %s P=%lld scale %g%s", ctx->backend == SG_BACKEND_CUDA ? "gpu" : "cpu",
             sg_dtype_name(dt), (long long)P, scale, bad_at >= 0 ? " with an inf" : "");
    amp_bufs a = bufs_create(ctx, dt, P, 0);
    sg_tensor *sc = tu_tensor1(ctx, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler_check");
    sg_tensor *found = tu_tensor1(ctx, SG_DTYPE_I32, 1, "found_check"), *inv = tu_tensor1(ctx, SG_DTYPE_F32, 1, "inv");
    double *x = fill_scaled(a.lo, scale);
    if (bad_at >= 0) {
        x[bad_at] = INFINITY;
        tu_set(a.lo, x);
    }
    free(x);
    scaler_state s = {scale, tu_randint(0, 3), 4, tu_randint(0, 3)};
    set_scaler(a.sc, s), set_scaler(sc, s);
    void *lo_bits = tu_raw(a.lo);
    tu_poison(found), tu_poison(inv);
    uint64_t before = sg_ctx_launch_count(ctx);
    TU_OK(ctx, sg_amp_check(ctx, a.lo, sc, found, inv));
    uint64_t launches = sg_ctx_launch_count(ctx) - before;
    if (ctx->backend == SG_BACKEND_CUDA) {
        TU_CHECK(launches == 1, "%s: %llu launches, expected 1", what, (unsigned long long)launches);
        expect_scratch_zero(ctx, what);
    }
    free(run_unscale(&a));
    TU_CHECK(read1(found) == read1(a.found) && read1(found) == (bad_at >= 0), "%s: found %g, sg_amp_unscale's %g", what,
             read1(found), read1(a.found));
    expect_scaler(what, sc, get_scaler(a.sc));
    const float want = 1.0f / (float)scale;
    TU_CHECK(read1(inv) == (double)want, "%s: inv %.9g, expected %.9g", what, read1(inv), (double)want);
    void *now = tu_raw(a.lo);
    TU_CHECK(memcmp(now, lo_bits, sg_tensor_nbytes(a.lo)) == 0, "%s: grad_lo changed", what);
    free(now), free(lo_bits);
    sg_tensor_destroy(sc), sg_tensor_destroy(found), sg_tensor_destroy(inv);
    bufs_destroy(&a);
}

/* sg_amp_check's refusals: inv's dtype, size and overlaps; nothing written. */
static void check_errors(sg_ctx *ctx)
{
    sg_tensor *lo = tu_tensor1(ctx, SG_DTYPE_BF16, 8, "grad_lo"), *sc = tu_tensor1(ctx, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler");
    sg_tensor *found = tu_tensor1(ctx, SG_DTYPE_I32, 1, "found"), *inv = tu_tensor1(ctx, SG_DTYPE_F32, 1, "inv");
    sg_tensor *inv2 = tu_tensor1(ctx, SG_DTYPE_F32, 2, "inv2"), *inv_i = tu_tensor1(ctx, SG_DTYPE_I32, 1, "inv_i32");
    sg_tensor *inv_in_sc = NULL;
    TU_OK(ctx, sg_tensor_view(sc, 3, 1, (int64_t[]){1}, "inv_in_scaler", &inv_in_sc));
    free(tu_random(lo, -1, 1));
    scaler_state s = {8, 0, 2000, 0};
    set_scaler(sc, s);
    tu_poison(found), tu_poison(inv);
    TU_FAILS(ctx, sg_amp_check(ctx, lo, sc, found, NULL), SG_ERR_NULL, "'inv'");
    TU_FAILS(ctx, sg_amp_check(ctx, lo, sc, found, inv2), SG_ERR_SHAPE, "'inv' (inv2) is (2) f32, expected 1 element (1 / scale)");
    TU_FAILS(ctx, sg_amp_check(ctx, lo, sc, found, inv_i), SG_ERR_DTYPE, "'inv' is i32");
    TU_FAILS(ctx, sg_amp_check(ctx, lo, sc, found, inv_in_sc), SG_ERR_INVALID, "overlaps");
    TU_FAILS(ctx, sg_amp_check(ctx, lo, found, found, inv), SG_ERR_DTYPE, "'scaler'");
    TU_CHECK(read1(found) == -123456789.0, "found written by rejected sg_amp_check calls");
    expect_scaler("scaler after rejected sg_amp_check calls", sc, s);
    TU_OK(ctx, sg_amp_check(ctx, lo, sc, found, inv)); /* still usable */
    TU_CHECK(read1(inv) == 0.125 && read1(found) == 0, "sg_amp_check after the errors: inv %g found %g", read1(inv),
             read1(found));
    sg_tensor *ts[] = {inv_in_sc, lo, sc, found, inv, inv2, inv_i};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

static void gpu_errors(sg_ctx *gpu, sg_ctx *cpu)
{
    sg_tensor *lo_i32 = tu_tensor1(gpu, SG_DTYPE_I32, 8, "lo_i32");
    sg_tensor *g = tu_tensor1(gpu, SG_DTYPE_F32, 8, "grad");
    sg_tensor *lo = tu_tensor1(gpu, SG_DTYPE_BF16, 8, "grad_lo");
    sg_tensor *sc = tu_tensor1(gpu, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler");
    sg_tensor *found = tu_tensor1(gpu, SG_DTYPE_I32, 1, "found");
    sg_tensor *sc_cpu = tu_tensor1(cpu, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler_cpu");
    TU_FAILS(gpu, sg_amp_unscale(gpu, lo_i32, g, sc, found), SG_ERR_DTYPE,
             "tensor 'grad_lo' is i32, expected bf16 or f32");
    TU_FAILS(gpu, sg_amp_unscale(gpu, lo, g, sc_cpu, found), SG_ERR_BACKEND, "another context");
    TU_FAILS(gpu, sg_amp_unscale(gpu, lo, g, found, found), SG_ERR_DTYPE, "'scaler'");
    free(tu_random(lo, -1, 1));
    set_scaler(sc, (scaler_state){2, 0, 2000, 0});
    TU_OK(gpu, sg_amp_unscale(gpu, lo, g, sc, found)); /* the context still works */
    TU_CHECK(read1(found) == 0, "gpu: found is %g after the errors", read1(found));
    sg_tensor *ts[] = {lo_i32, g, lo, sc, found, sc_cpu};
    for (int i = 0; i < 6; i++) sg_tensor_destroy(ts[i]);
}

static void gpu_tests(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    /* The first call of a context allocates and zero-fills the scratch (one more launch, and
     * an allocation capture forbids); reserve it up front, as a trainer does. */
    void *scratch;
    TU_OK(gpu, sg_ctx_scratch(gpu, SG_SLOT_AMP, SG_AMP_SCRATCH_BYTES, &scratch));

    /* Single elements, the float4 tail, one block, many blocks, and several million elements
     * (more float4s than threads in the grid: the grid-stride loop). */
    const int64_t Ps[] = {1, 5, 1000, (1 << 20) + 7, 5000003};
    for (size_t i = 0; i < sizeof Ps / sizeof *Ps; i++) {
        double scale = ldexp(1.0, tu_randint(-4, 24));
        gpu_vs_cpu(gpu, cpu, SG_DTYPE_F32, Ps[i], 0, 0, scale, -1, 0);
        gpu_vs_cpu(gpu, cpu, SG_DTYPE_F32, Ps[i], 1, 0, scale, -1, 0);
        gpu_vs_cpu(gpu, cpu, SG_DTYPE_BF16, Ps[i], 0, 0, scale, -1, 0);
    }
    /* Scales that are not powers of two: the same f32 factor and product on both sides. */
    gpu_vs_cpu(gpu, cpu, SG_DTYPE_F32, 4099, 0, 0, 3.0, -1, 0);
    gpu_vs_cpu(gpu, cpu, SG_DTYPE_BF16, 4099, 0, 0, 1000.0, -1, 0);
    gpu_vs_cpu(gpu, cpu, SG_DTYPE_F32, 4099, 0, 0, (double)(float)tu_uniform(0.1, 1e5), -1, 0);
    /* Misaligned buffers: the scalar path. */
    for (int mis = 1; mis <= 3; mis++) {
        gpu_vs_cpu(gpu, cpu, SG_DTYPE_F32, 1001, 0, mis, 512, -1, 0);
        gpu_vs_cpu(gpu, cpu, SG_DTYPE_BF16, 1001, 0, mis, 512, -1, 0);
    }
    gpu_vs_cpu(gpu, cpu, SG_DTYPE_F32, 1001, 1, 1, 512, -1, 0);
    /* A non-finite value at the first and the last element of a large buffer (the first
     * block's float4 part, the last block's tail), and somewhere in the middle. */
    const int64_t big = 5000003;
    const double bads[2] = {INFINITY, NAN};
    for (int k = 0; k < 2; k++) {
        int64_t at[3] = {0, big - 1, (int64_t)(tu_next() % (uint64_t)big)};
        for (int w = 0; w < 3; w++) {
            gpu_vs_cpu(gpu, cpu, SG_DTYPE_F32, big, 0, 0, 65536, at[w], bads[k]);
            gpu_vs_cpu(gpu, cpu, SG_DTYPE_BF16, big, 0, 0, 65536, at[w], bads[k]);
        }
        gpu_vs_cpu(gpu, cpu, SG_DTYPE_F32, big, 1, 0, 65536, big - 1, bads[k]);
        gpu_vs_cpu(gpu, cpu, SG_DTYPE_F32, 1001, 0, 3, 65536, 1000, bads[k]);
    }
    /* The exact oracle on the GPU as on the CPU. */
    check_values(gpu, SG_DTYPE_BF16, (1 << 20) + 3, 0);
    check_values(gpu, SG_DTYPE_F32, (1 << 20) + 3, 1);
    check_nonfinite(gpu, SG_DTYPE_F32, (1 << 22) + 1);
    check_nonfinite(gpu, SG_DTYPE_BF16, 1001);
    check_nonfinite(gpu, SG_DTYPE_F32, 1);
    check_unscale_overflow(gpu);
    check_transitions(gpu);
    gpu_repeat(gpu, cpu, SG_DTYPE_BF16, big);
    gpu_repeat(gpu, cpu, SG_DTYPE_F32, 1003);
    check_capture(gpu, SG_DTYPE_BF16, (1 << 20) + 5);
    check_vs_unscale(gpu, SG_DTYPE_BF16, big, 3000.5, -1);
    check_vs_unscale(gpu, SG_DTYPE_BF16, big, 65536, big - 1);
    check_vs_unscale(gpu, SG_DTYPE_F32, 1001, 0.25, 0);
    check_errors(gpu);
    gpu_errors(gpu, cpu);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_amp");
    if (!strcmp(mode, "gpu")) gpu_tests();
    else cpu_tests();
    return tu_finish("test_amp");
}
