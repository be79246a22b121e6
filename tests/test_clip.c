/* test_clip.c: global-norm gradient clipping. `cpu`: the reference's norm against a
 * compensated double sum written here, scaling only above max_norm (by max_norm / (norm +
 * 1e-6) rounded to f32), measure-only for max_norm <= 0, nonfinite detection (inf, -inf, NaN)
 * with g left alone, an f64 sum that overflows, argument errors, a CPU capture replayed on new
 * gradients, the split form (sg_clip_sumsq, sg_clip_apply) and the factor forms
 * (sg_clip_factor, sg_clip_factor_sums: g * factor the clipped g bit for bit). `gpu`: the CUDA
 * kernels against the CPU reference for P from 1 to ~25M (norm to 1 f32 ulp, factor to 1 ulp,
 * scaled g bit for bit g * factor), bitwise determinism, one or two launches, the scratch
 * counter back at 0, misaligned buffers, nonfinite detection, and a CUDA Graph of the whole
 * clip (no host sync inside) replayed on new gradients. */
#include "testutil.h"

#include "ops/clip.h"

/* sqrt(sum g^2) by Kahan-Babuska (Neumaier) summation: another order and another rounding
 * than the reference's plain index-order sum. */
static double naive_norm(const double *g, int64_t n)
{
    double s = 0, c = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = g[i] * g[i], t = s + v;
        c += fabs(s) >= fabs(v) ? (s - t) + v : (v - t) + s;
        s = t;
    }
    return sqrt(s + c);
}

static double read1(const sg_tensor *t)
{
    double *v = tu_get(t);
    double x = v[0];
    free(v);
    return x;
}

/* g's bits are what they were (host copy `before`, dtype-rounded). */
static void expect_unchanged(const char *what, const sg_tensor *g, const double *before)
{
    double *now = tu_get(g);
    int64_t bad = 0;
    for (int64_t i = 0; i < g->numel; i++)
        bad += memcmp(&now[i], &before[i], sizeof(double)) != 0;
    TU_CHECK(bad == 0, "%s: %lld of %lld elements of g changed", what, (long long)bad,
             (long long)g->numel);
    free(now);
}

/* ---- cpu ---- */

/* The f32 norm is the double norm rounded once: within half an f32 ulp (2^-24) of the exact
 * value, and the two double sums differ by far less, so rtol 2^-23 holds. For f64 gradients
 * the norm is still stored in f32 (the API's norm tensor is F32): the same bound. */
static const tu_tol norm_tol = {0, 1.1920928955078125e-07};

/* Two clips of the same g whose f64 norms differ by a few units of 2^-53 (another order of the
 * same sum: the other backend, the split form) may round their factors to neighbouring f32
 * values, 2^-23 relative apart; each product is rounded once more (2^-24 each), so the clipped
 * gradients agree to rtol 2^-22. */
static const tu_tol clipped_tol = {0, 2.384185791015625e-07};

/* Bits of one-element tensor t's value, as stored (4 bytes: F32 or I32). */
static uint32_t bits1(const sg_tensor *t)
{
    uint32_t b;
    TU_OK(t->ctx, sg_tensor_copy_to_host(t, &b, 4));
    return b;
}

/* Elements of got (n, as stored) that are not want[i] * f rounded once to dt, bit for bit. */
static int64_t n_not_scaled(const double *got, const double *want, int64_t n, float f, sg_dtype dt)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double w = want[i] * (double)f; /* exact for f32 values: 24 + 24 bits */
        if (dt == SG_DTYPE_F32) w = (float)w;
        bad += memcmp(&got[i], &w, sizeof w) != 0;
    }
    return bad;
}

/* On random g of P elements in (-mag, mag): measure only (max_norm 0 and -1), then max_norm
 * above the norm (no change), below it (scaled), and +inf (no change). */
static void cpu_norm_and_scale(sg_dtype dt, int64_t P, double mag)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const char *dn = sg_dtype_name(dt);
    sg_tensor *g = tu_tensor1(ctx, dt, P, "grad");
    sg_tensor *norm = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm");
    sg_tensor *nf = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nonfinite");
    free(tu_random(g, -mag, mag));
    double *g0 = tu_get(g); /* as stored (f32-rounded when dt is) */
    double ref = naive_norm(g0, P);
    char what[128];

    const float measure[2] = {0.f, -1.f};
    for (int k = 0; k < 2; k++) {
        tu_poison(norm), tu_poison(nf);
        TU_OK(ctx, sg_clip_grad_norm(ctx, g, measure[k], norm, nf));
        double got = read1(norm);
        snprintf(what, sizeof what, "cpu %s P=%lld max_norm %g: norm", dn, (long long)P,
                 (double)measure[k]);
        tu_close(what, &got, &ref, 1, norm_tol);
        TU_CHECK(read1(nf) == 0, "%s: nonfinite is %g", what, read1(nf));
        expect_unchanged(what, g, g0);
    }

    /* coef = max_norm / (norm + 1e-6) >= 1: g untouched. (As PyTorch's clip_grad_norm_, the
     * 1e-6 counts: with tiny gradients a max_norm just above the norm still scales.) */
    TU_OK(ctx, sg_clip_grad_norm(ctx, g, (float)((ref + 1e-6) * 1.01), norm, nf));
    snprintf(what, sizeof what, "cpu %s P=%lld max_norm above the norm", dn, (long long)P);
    expect_unchanged(what, g, g0);

    /* max_norm below it: g *= the coefficient max_norm / (norm + 1e-6), rounded once to the
     * dtype; for f32 gradients that coefficient is itself rounded to f32 first (the factor,
     * which sg_clip_factor reports). The test's coefficient uses its own sum of the P squares,
     * the op another order: each double sum of positive terms is within (P-1) u of the exact
     * one (u = 2^-53), so they differ by at most 2 (P-1) u, the square roots by half that; the
     * division adds 2 u. So the coefficients in f64 agree within rtol (P + 1) u (the bound, not
     * the typical error, sqrt(P) u: 1e-14 held for most seeds, not for SG_TEST_SEED=356 at P =
     * 100003). f64: the product adds 2 u more, so g agrees within (P + 3) u. f32: each factor's
     * rounding adds 2^-24, so the factors agree within 2^-23 + (P + 1) u, and the clipped g is
     * g * factor exactly as the op rounds it. */
    float max_norm = (float)(ref * 0.5);
    const double u = 1.1102230246251565e-16; /* 2^-53 */
    double coef = (double)max_norm / (ref + 1e-6), f = coef;
    snprintf(what, sizeof what, "cpu %s P=%lld clipped to %g", dn, (long long)P, (double)max_norm);
    if (dt == SG_DTYPE_F32) {
        sg_tensor *factor = tu_tensor1(ctx, SG_DTYPE_F32, 1, "factor");
        tu_poison(factor);
        TU_OK(ctx, sg_clip_factor(ctx, g, max_norm, norm, nf, factor));
        expect_unchanged(what, g, g0);
        f = read1(factor);
        tu_close(what, &f, &coef, 1, (tu_tol){0, 1.1920928955078125e-07 + ((double)P + 1) * u});
        sg_tensor_destroy(factor);
    }
    TU_CHECK(f < 1, "%s: the coefficient is %.9g, not below 1", what, f);
    TU_OK(ctx, sg_clip_grad_norm(ctx, g, max_norm, norm, nf));
    double *got = tu_get(g);
    if (dt == SG_DTYPE_F32) {
        int64_t bad = n_not_scaled(got, g0, P, (float)f, dt);
        TU_CHECK(bad == 0, "%s: %lld of %lld elements of g are not g * factor (%.9g) rounded once", what,
                 (long long)bad, (long long)P, f);
    } else {
        double *want = malloc((size_t)P * sizeof *want);
        for (int64_t i = 0; i < P; i++) want[i] = g0[i] * coef;
        tu_close(what, got, want, P, (tu_tol){0, ((double)P + 3) * u});
        free(want);
    }
    TU_CHECK(read1(nf) == 0, "%s: nonfinite is set", what);
    /* Measured again, the norm is max_norm * norm / (norm + 1e-6). */
    TU_OK(ctx, sg_clip_grad_norm(ctx, g, 0.f, norm, nf));
    double after = read1(norm), after_ref = (double)max_norm * ref / (ref + 1e-6);
    snprintf(what, sizeof what, "cpu %s P=%lld: the norm after clipping", dn, (long long)P);
    tu_close(what, &after, &after_ref, 1, (tu_tol){0, 2.4e-7});
    /* max_norm = +inf never scales. */
    free(got);
    got = tu_get(g);
    TU_OK(ctx, sg_clip_grad_norm(ctx, g, INFINITY, norm, nf));
    expect_unchanged("cpu max_norm inf", g, got);

    free(g0), free(got);
    sg_tensor_destroy(g), sg_tensor_destroy(norm), sg_tensor_destroy(nf);
    sg_ctx_destroy(ctx);
}

/* An inf, a -inf, a NaN (and inf with NaN) set nonfinite, leave g as it was although max_norm
 * is far below the norm, and show in the norm (inf, or NaN); a clean g clears the flag. */
static void check_nonfinite(sg_ctx *ctx, sg_dtype dt, int64_t P)
{
    const char *be = sg_backend_name(ctx->backend);
    sg_tensor *g = tu_tensor1(ctx, dt, P, "grad");
    sg_tensor *norm = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm");
    sg_tensor *nf = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nonfinite");
    double *clean = malloc((size_t)P * sizeof *clean);
    for (int64_t i = 0; i < P; i++) clean[i] = tu_uniform(-1, 1);
    struct {
        const char *what;
        double v1, v2;
        int norm_nan;
    } cases[] = {{"inf", INFINITY, 0.5, 0}, {"-inf", -INFINITY, 0.5, 0},
                 {"NaN", NAN, 0.5, 1}, {"inf and NaN", INFINITY, NAN, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (P < 2 && !isfinite(cases[c].v2)) continue; /* two bad values need two elements */
        /* One bad value anywhere before the last element, the other in the last element (on
         * CUDA, the float4 part and the tail when P % 4 != 0). */
        int64_t i1 = P < 2 ? 0 : (int64_t)(tu_next() % (uint64_t)(P - 1)), i2 = P - 1;
        double keep1 = clean[i1], keep2 = clean[i2];
        clean[i2] = cases[c].v2;
        clean[i1] = cases[c].v1;
        tu_set(g, clean);
        double *before = tu_get(g);
        tu_poison(norm), tu_poison(nf);
        TU_OK(ctx, sg_clip_grad_norm(ctx, g, 1e-3f, norm, nf));
        char what[128];
        snprintf(what, sizeof what, "%s %s P=%lld with %s", be, sg_dtype_name(dt), (long long)P,
                 cases[c].what);
        TU_CHECK(read1(nf) == 1, "%s: nonfinite is %g, expected 1", what, read1(nf));
        double nv = read1(norm);
        TU_CHECK(cases[c].norm_nan ? isnan(nv) : (isinf(nv) && nv > 0), "%s: norm is %g", what, nv);
        expect_unchanged(what, g, before);
        free(before);
        clean[i2] = keep2;
        clean[i1] = keep1;
    }
    tu_set(g, clean);
    TU_OK(ctx, sg_clip_grad_norm(ctx, g, 0.f, norm, nf));
    TU_CHECK(read1(nf) == 0, "%s: nonfinite is %g on a clean g after a bad one", be, read1(nf));
    free(clean);
    sg_tensor_destroy(g), sg_tensor_destroy(norm), sg_tensor_destroy(nf);
}

/* f64 squares can overflow the sum though every value is finite: nonfinite stays 0 and the
 * scaling uses the true norm (the f32 norm tensor reads inf: it cannot hold 1.45e200). */
static void cpu_f64_overflow(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_F64, 3, "grad");
    sg_tensor *norm = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm");
    sg_tensor *nf = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nonfinite");
    double v[3] = {1e200, -1e200, 3e199}, true_norm = 1e200 * sqrt(2.09);
    tu_set(g, v);
    TU_OK(ctx, sg_clip_grad_norm(ctx, g, 1.f, norm, nf));
    TU_CHECK(read1(nf) == 0, "f64 overflow: nonfinite is set though every value is finite");
    double *got = tu_get(g), want[3];
    for (int i = 0; i < 3; i++) want[i] = v[i] / true_norm;
    tu_close("f64 overflow: g clipped to norm 1", got, want, 3, (tu_tol){0, 1e-12});
    free(got);
    sg_tensor_destroy(g), sg_tensor_destroy(norm), sg_tensor_destroy(nf);
    sg_ctx_destroy(ctx);
}

/* Every argument check, each failing before anything is written; the context stays usable. */
static void cpu_errors(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU), *other = tu_ctx(SG_BACKEND_CPU);
    const int64_t P = 10;
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_F32, P, "grad"), *g_i32 = tu_tensor1(ctx, SG_DTYPE_I32, P, "g_i32");
    sg_tensor *norm = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm"), *nf = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nonfinite");
    sg_tensor *norm64 = tu_tensor1(ctx, SG_DTYPE_F64, 1, "norm64"), *norm2 = tu_tensor1(ctx, SG_DTYPE_F32, 2, "norm2");
    sg_tensor *nf_f32 = tu_tensor1(ctx, SG_DTYPE_F32, 1, "nf_f32"), *nf2 = tu_tensor1(ctx, SG_DTYPE_I32, 2, "nf2");
    sg_tensor *norm_other = tu_tensor1(other, SG_DTYPE_F32, 1, "norm_other");
    int64_t one = 1;
    sg_tensor *norm_in_g = NULL;
    TU_OK(ctx, sg_tensor_view(g, 3, 1, &one, "norm_in_g", &norm_in_g));
    free(tu_random(g, -1, 1));
    double *g0 = tu_get(g);
    tu_poison(norm), tu_poison(nf);

    TU_FAILS(ctx, sg_clip_grad_norm(ctx, NULL, 1.f, norm, nf), SG_ERR_NULL, "'grad'");
    TU_FAILS(ctx, sg_clip_grad_norm(ctx, g, 1.f, NULL, nf), SG_ERR_NULL, "'norm'");
    TU_FAILS(ctx, sg_clip_grad_norm(ctx, g, 1.f, norm, NULL), SG_ERR_NULL, "'nonfinite'");
    TU_FAILS(ctx, sg_clip_grad_norm(ctx, g_i32, 1.f, norm, nf), SG_ERR_DTYPE, "'grad'");
    TU_FAILS(ctx, sg_clip_grad_norm(ctx, g, 1.f, norm64, nf), SG_ERR_DTYPE, "'norm'");
    TU_FAILS(ctx, sg_clip_grad_norm(ctx, g, 1.f, norm2, nf), SG_ERR_SHAPE, "'norm' (norm2) is (2) f32, expected 1 element (the norm)");
    TU_FAILS(ctx, sg_clip_grad_norm(ctx, g, 1.f, norm, nf_f32), SG_ERR_DTYPE, "sg_clip_grad_norm: tensor 'nonfinite'");
    TU_FAILS(ctx, sg_clip_grad_norm(ctx, g, 1.f, norm, nf2), SG_ERR_SHAPE, "'nonfinite'");
    TU_FAILS(ctx, sg_clip_grad_norm(ctx, g, 1.f, norm_other, nf), SG_ERR_BACKEND, "another context");
    TU_FAILS(ctx, sg_clip_grad_norm(ctx, g, NAN, norm, nf), SG_ERR_INVALID, "max_norm is NaN");
    TU_FAILS(ctx, sg_clip_grad_norm(ctx, g, 1.f, norm_in_g, nf), SG_ERR_INVALID, "overlaps");
    TU_CHECK(sg_clip_grad_norm(NULL, g, 1.f, norm, nf) == SG_ERR_NULL, "NULL ctx accepted");

    /* Nothing was written by the rejected calls. */
    expect_unchanged("g after rejected calls", g, g0);
    TU_CHECK(isnan(read1(norm)), "norm written by rejected calls");
    TU_CHECK(read1(nf) == -123456789.0, "nonfinite written by rejected calls");
    /* The context works: a valid call clips. */
    TU_OK(ctx, sg_clip_grad_norm(ctx, g, 1e-3f, norm, nf));
    TU_CHECK(read1(nf) == 0 && read1(norm) > 0, "the valid call after the errors did not measure");
    free(g0);
    sg_tensor *ts[] = {norm_in_g, g, g_i32, norm, nf, norm64, norm2, nf_f32, nf2, norm_other};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
    sg_ctx_destroy(other);
    sg_ctx_destroy(ctx);
}

/* ---- capture: the clip alone, replayed on new gradients ---- */

typedef struct clip_step {
    sg_ctx *ctx;
    sg_tensor *g, *norm, *nf;
    float max_norm;
} clip_step;

static sg_status clip_step_fn(void *u)
{
    clip_step *s = u;
    return sg_clip_grad_norm(s->ctx, s->g, s->max_norm, s->norm, s->nf);
}

/* Captures the clip on ctx (on CUDA: inside a stream capture, where a host sync or read
 * would fail it), then for two new gradients (copied in outside the graph) one replay each
 * must match the CPU reference on ref_ctx. nodes: the expected node count. */
static void check_capture(sg_ctx *ctx, sg_ctx *ref_ctx, int64_t P, int nodes)
{
    const char *be = sg_backend_name(ctx->backend);
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_F32, P, "grad"), *gr = tu_tensor1(ref_ctx, SG_DTYPE_F32, P, "grad_ref");
    sg_tensor *norm = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm"), *nf = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nf");
    sg_tensor *norm_r = tu_tensor1(ref_ctx, SG_DTYPE_F32, 1, "norm_ref");
    sg_tensor *nf_r = tu_tensor1(ref_ctx, SG_DTYPE_I32, 1, "nf_ref");
    free(tu_random(g, -1, 1));
    tu_poison(norm), tu_poison(nf);
    /* max_norm: about half the norm of uniform(-1, 1) values, sqrt(P / 3). */
    clip_step s = {ctx, g, norm, nf, (float)(0.5 * sqrt(P / 3.0))};
    sg_graph_options o = sg_graph_options_default();
    o.name = "clip";
    o.warmup = 0;
    sg_graph *gph = NULL;
    TU_OK(ctx, sg_graph_capture(ctx, clip_step_fn, &s, &o, &gph));
    if (!sg_graphs_disabled()) {
        sg_graph_stats st;
        TU_OK(ctx, sg_graph_get_stats(gph, &st));
        TU_CHECK(st.nodes == nodes, "%s: the clip graph holds %d nodes, expected %d", be, st.nodes,
                 nodes);
        TU_CHECK(isnan(read1(norm)), "%s: capture ran the clip", be);
    }
    for (int k = 0; k < 2; k++) {
        double *v = tu_random(g, -1, 1);
        tu_set(gr, v);
        free(v);
        tu_poison(norm), tu_poison(nf);
        TU_OK(ctx, sg_graph_replay(gph));
        TU_OK(ref_ctx, sg_clip_grad_norm(ref_ctx, gr, s.max_norm, norm_r, nf_r));
        char what[96];
        snprintf(what, sizeof what, "%s: clip replay %d: g", be, k);
        tu_close_tensors(what, g, gr, clipped_tol);
        snprintf(what, sizeof what, "%s: clip replay %d: norm", be, k);
        tu_close_tensors(what, norm, norm_r, norm_tol);
        TU_CHECK(read1(nf) == 0, "%s: clip replay %d: nonfinite %g", be, k, read1(nf));
    }
    sg_graph_destroy(gph);
    sg_tensor *ts[] = {g, gr, norm, nf, norm_r, nf_r};
    for (int i = 0; i < 6; i++) sg_tensor_destroy(ts[i]);
}

/* ---- the split form: sg_clip_sumsq on each part, sg_clip_apply on each ---- */

/* Part i's f64 sum of squares, from sums' raw bytes. */
static double sum_of(const sg_tensor *sums, int i)
{
    int32_t raw[64];
    TU_OK(sums->ctx, sg_tensor_copy_to_host(sums, raw, (size_t)sums->numel * sizeof raw[0]));
    double v;
    memcpy(&v, &raw[2 * i], sizeof v);
    return v;
}

typedef struct split_step {
    sg_ctx *ctx;
    sg_tensor *part[2], *sums, *norm, *nf;
    float max_norm;
} split_step;

/* Both parts' sums, then both applications: what a sharded clip does between its ranks. */
static sg_status split_fn(void *u)
{
    split_step *s = u;
    for (int k = 0; k < 2; k++) SG_TRY(sg_clip_sumsq(s->ctx, s->part[k], s->sums, k));
    for (int k = 0; k < 2; k++) SG_TRY(sg_clip_apply(s->ctx, s->part[k], s->max_norm, s->sums, s->norm, s->nf));
    return SG_OK;
}

/* Bit for bit, two tensors' values. */
static int64_t n_differ(const sg_tensor *a, const sg_tensor *b)
{
    double *x = tu_get(a), *y = tu_get(b);
    int64_t bad = 0;
    for (int64_t i = 0; i < a->numel; i++) bad += memcmp(&x[i], &y[i], sizeof x[i]) != 0;
    free(x), free(y);
    return bad;
}

/* On fresh g of P f32 elements (P >= 2), against sg_clip_grad_norm on a copy: (1) one part
 * (sumsq, then apply, on the whole g): the same norm, flag and scaled g, bit for bit (the same
 * sum in the same order, the same double arithmetic after it); (2) two parts split at a random
 * k: each part's sum within (n + 1) 2^-53 of the host's double sum of it (the bound of a
 * recursive sum of n non-negative terms), the norm the f32 of sqrt(sum0 + sum1) exactly, within
 * norm_tol of sg_clip_grad_norm's and g within clipped_tol of its (the two double sums of the
 * same squares differ by at most 2 (P-1) 2^-53 relative: see clipped_tol);
 * (3) measure only (max_norm 0): g unchanged, the norm written; (4) an inf in part 1 sets the
 * flag for both parts and leaves both alone; (5) the four calls captured and replayed on new
 * gradients: the eager calls' bits. */
static void check_split(sg_ctx *ctx, int64_t P)
{
    const char *be = sg_backend_name(ctx->backend);
    char what[128];
    sg_tensor *g1 = tu_tensor1(ctx, SG_DTYPE_F32, P, "grad_whole"), *g2 = tu_tensor1(ctx, SG_DTYPE_F32, P, "grad_split");
    sg_tensor *n1 = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm1"), *f1 = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nf1");
    sg_tensor *n2 = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm2"), *f2 = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nf2");
    sg_tensor *one = tu_tensor1(ctx, SG_DTYPE_I32, 2, "sums1"), *sums = tu_tensor1(ctx, SG_DTYPE_I32, 4, "sums2");
    sg_tensor *sums_e = tu_tensor1(ctx, SG_DTYPE_I32, 4, "sums_eager");
    free(tu_random(g1, -1, 1));
    double *gs = tu_get(g1); /* as stored: f32 */
    const float max_norm = (float)(0.5 * sqrt(P / 3.0)); /* about half the norm of uniform(-1, 1) values */

    /* (1) One part. */
    tu_set(g2, gs);
    tu_poison(n1), tu_poison(f1), tu_poison(n2), tu_poison(f2);
    TU_OK(ctx, sg_clip_grad_norm(ctx, g1, max_norm, n1, f1));
    TU_OK(ctx, sg_clip_sumsq(ctx, g2, one, 0));
    TU_OK(ctx, sg_clip_apply(ctx, g2, max_norm, one, n2, f2));
    int64_t bad = n_differ(g1, g2);
    TU_CHECK(bad == 0 && read1(n1) == read1(n2) && read1(f1) == 0 && read1(f2) == 0,
             "%s P=%lld: sumsq + apply on one part: %lld elements differ from sg_clip_grad_norm's, norm %.9g "
             "against %.9g, flags %g %g", be, (long long)P, (long long)bad, read1(n2), read1(n1), read1(f2), read1(f1));

    /* (2) Two parts. */
    int64_t k = 1 + (int64_t)(tu_next() % (uint64_t)(P - 1)), len[2] = {k, P - k};
    sg_tensor *part[2], *ref_part[2];
    TU_OK(ctx, sg_tensor_view(g2, 0, 1, &len[0], "part0", &part[0]));
    TU_OK(ctx, sg_tensor_view(g2, k, 1, &len[1], "part1", &part[1]));
    TU_OK(ctx, sg_tensor_view(g1, 0, 1, &len[0], "ref_part0", &ref_part[0]));
    TU_OK(ctx, sg_tensor_view(g1, k, 1, &len[1], "ref_part1", &ref_part[1]));
    tu_set(g2, gs);
    tu_set(g1, gs);
    TU_OK(ctx, sg_clip_grad_norm(ctx, g1, max_norm, n1, f1));
    double host_sum[2] = {0, 0}, got_sum[2];
    for (int64_t i = 0; i < P; i++) host_sum[i >= k] += gs[i] * gs[i];
    tu_poison(sums);
    for (int j = 0; j < 2; j++) TU_OK(ctx, sg_clip_sumsq(ctx, part[j], sums, j));
    for (int j = 0; j < 2; j++) {
        got_sum[j] = sum_of(sums, j);
        snprintf(what, sizeof what, "%s P=%lld split at %lld: part %d's sum of squares", be, (long long)P,
                 (long long)k, j);
        tu_close(what, &got_sum[j], &host_sum[j], 1, (tu_tol){0, ((double)len[j] + 1) * 1.1102230246251565e-16});
    }
    tu_poison(n2), tu_poison(f2);
    for (int j = 0; j < 2; j++) TU_OK(ctx, sg_clip_apply(ctx, part[j], max_norm, sums, n2, f2));
    snprintf(what, sizeof what, "%s P=%lld split at %lld: g", be, (long long)P, (long long)k);
    tu_close_tensors(what, g2, g1, clipped_tol);
    snprintf(what, sizeof what, "%s P=%lld split at %lld: norm", be, (long long)P, (long long)k);
    tu_close_tensors(what, n2, n1, norm_tol);
    TU_CHECK(read1(n2) == (double)(float)sqrt(got_sum[0] + got_sum[1]) && read1(f2) == 0,
             "%s: %.9g and flag %g, want %.9g (the parts' sums added in order) and 0", what, read1(n2), read1(f2),
             (double)(float)sqrt(got_sum[0] + got_sum[1]));

    /* (3) Measure only. */
    tu_set(g2, gs);
    tu_poison(n2);
    TU_OK(ctx, sg_clip_apply(ctx, part[0], 0.f, sums, n2, f2));
    snprintf(what, sizeof what, "%s P=%lld: apply with max_norm 0", be, (long long)P);
    expect_unchanged(what, g2, gs);
    TU_CHECK(read1(n2) == (double)(float)sqrt(got_sum[0] + got_sum[1]), "%s: norm %.9g", what, read1(n2));

    /* (4) An inf in part 1: its sum is inf, the total too; neither part is scaled. */
    double *bad_g = malloc((size_t)P * sizeof *bad_g);
    memcpy(bad_g, gs, (size_t)P * sizeof *bad_g);
    bad_g[k + (int64_t)(tu_next() % (uint64_t)len[1])] = INFINITY;
    tu_set(g2, bad_g);
    for (int j = 0; j < 2; j++) TU_OK(ctx, sg_clip_sumsq(ctx, part[j], sums, j));
    tu_poison(f2);
    for (int j = 0; j < 2; j++) TU_OK(ctx, sg_clip_apply(ctx, part[j], 1e-3f, sums, n2, f2));
    snprintf(what, sizeof what, "%s P=%lld: an inf in part 1", be, (long long)P);
    TU_CHECK(read1(f2) == 1 && isinf(read1(n2)), "%s: nonfinite %g, norm %g", what, read1(f2), read1(n2));
    expect_unchanged(what, g2, bad_g);
    free(bad_g);

    /* (5) Captured, replayed on new gradients; the same four calls eagerly on a copy. */
    split_step st = {ctx, {part[0], part[1]}, sums, n2, f2, max_norm};
    sg_graph_options o = sg_graph_options_default();
    o.name = "clip_split";
    o.warmup = 0;
    sg_graph *gph = NULL;
    TU_OK(ctx, sg_graph_capture(ctx, split_fn, &st, &o, &gph));
    /* |g| in [0.5, 1): a norm of at least 0.5 sqrt(P), above max_norm (0.29 sqrt(P)) whatever
     * is drawn, so the replay scales. */
    double *fresh = malloc((size_t)P * sizeof *fresh);
    for (int64_t i = 0; i < P; i++) fresh[i] = tu_uniform(0.5, 1) * (tu_next() & 1 ? 1 : -1);
    tu_set(g2, fresh);
    tu_set(g1, fresh);
    tu_poison(n2);
    TU_OK(ctx, sg_graph_replay(gph));
    split_step eager = {ctx, {ref_part[0], ref_part[1]}, sums_e, n1, f1, max_norm};
    TU_OK(ctx, split_fn(&eager));
    bad = n_differ(g1, g2);
    TU_CHECK(bad == 0 && read1(n1) == read1(n2) && sum_of(sums, 0) == sum_of(sums_e, 0) &&
             sum_of(sums, 1) == sum_of(sums_e, 1), "%s P=%lld: the captured split clip: %lld elements differ from "
             "the eager calls', norm %.9g against %.9g", be, (long long)P, (long long)bad, read1(n2), read1(n1));
    TU_CHECK(read1(n2) > max_norm, "%s P=%lld: the replay's norm %.9g is not above max_norm %g: nothing clipped",
             be, (long long)P, read1(n2), (double)max_norm);
    free(fresh);
    sg_graph_destroy(gph);

    free(gs);
    sg_tensor *ts[] = {part[0], part[1], ref_part[0], ref_part[1], g1, g2, n1, f1, n2, f2, one, sums, sums_e};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

/* sg_clip_sumsq_amp: the sum of squares of scaled gradients grad_lo (dt; misaligned: a view at
 * element 1) times inv, against sg_amp_unscale's f32 output summed by sg_clip_sumsq, bit for
 * bit, into part 1 of a 2-part sums; and against the host's index-order sum of f32(g * inv)
 * squared (the CPU reference's own order: equal there; a CUDA grid's order: within (P + 1)
 * 2^-53 relative, as check_split). The scale is not a power of two, so f32(g * inv) rounds and
 * the sum of the unrounded products would differ. Then an inf: both sums inf. One launch. */
static void check_sumsq_amp(sg_ctx *ctx, sg_dtype dt, int64_t P, int misaligned)
{
    const char *be = ctx->backend == SG_BACKEND_CPU ? "cpu" : "gpu";
    char what[160];
    snprintf(what, sizeof what, "%s sg_clip_sumsq_amp %s P=%lld%s", be, sg_dtype_name(dt), (long long)P,
             misaligned ? " misaligned" : "");
    sg_tensor *base = tu_tensor1(ctx, dt, P + misaligned, "grad_lo_base"), *glo = base;
    if (misaligned) TU_OK(ctx, sg_tensor_view(base, 1, 1, &P, "grad_lo", &glo));
    sg_tensor *g32 = tu_tensor1(ctx, SG_DTYPE_F32, P, "grad_f32");
    sg_tensor *sa = tu_tensor1(ctx, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler_a");
    sg_tensor *sb = tu_tensor1(ctx, SG_DTYPE_F32, SG_SCALER_COUNT, "scaler_b");
    sg_tensor *fa = tu_tensor1(ctx, SG_DTYPE_I32, 1, "found_a"), *fb = tu_tensor1(ctx, SG_DTYPE_I32, 1, "found_b");
    sg_tensor *inv = tu_tensor1(ctx, SG_DTYPE_F32, 1, "inv");
    sg_tensor *want = tu_tensor1(ctx, SG_DTYPE_I32, 4, "sums_unscaled"), *got = tu_tensor1(ctx, SG_DTYPE_I32, 4, "sums");
    const double scale = 3000.5 * (1 + (double)(tu_next() % 1000)) / 1000, sc[SG_SCALER_COUNT] = {scale, 0, 1e6, 0};
    for (int bad = 0; bad < 2; bad++) {
        double *g = tu_random(glo, -3000, 3000);
        if (bad) {
            g[tu_randint(0, (int)(P - 1))] = INFINITY;
            tu_set(glo, g);
        }
        free(g);
        g = tu_get(glo); /* as stored */
        tu_set(sa, sc), tu_set(sb, sc);
        tu_poison(g32), tu_poison(inv), tu_poison(want), tu_poison(got);
        if (dt != SG_DTYPE_F64) { /* sg_amp_unscale writes f32 from bf16 or f32 */
            TU_OK(ctx, sg_amp_unscale(ctx, glo, g32, sa, fa));
            TU_OK(ctx, sg_clip_sumsq(ctx, g32, want, 1));
        }
        TU_OK(ctx, sg_amp_check(ctx, glo, sb, fb, inv));
        uint64_t before = sg_ctx_launch_count(ctx);
        TU_OK(ctx, sg_clip_sumsq_amp(ctx, glo, inv, got, 1));
        uint64_t launches = sg_ctx_launch_count(ctx) - before;
        if (ctx->backend == SG_BACKEND_CUDA)
            TU_CHECK(launches == 1, "%s: %llu launches, expected 1", what, (unsigned long long)launches);
        const double s = sum_of(got, 1), iv = read1(inv);
        double host = 0;
        for (int64_t i = 0; i < P; i++) {
            double v = (double)(float)(g[i] * iv);
            host += v * v;
        }
        if (dt != SG_DTYPE_F64)
            TU_CHECK(!memcmp(&s, &(double){sum_of(want, 1)}, sizeof s), "%s%s: the sum of squares is %.17g, "
                     "sg_amp_unscale then sg_clip_sumsq gave %.17g: not bit for bit", what, bad ? " (an inf)" : "",
                     s, sum_of(want, 1));
        if (bad) {
            TU_CHECK(isinf(s), "%s: an inf among the gradients, the sum is %g", what, s);
        } else {
            char w[200];
            snprintf(w, sizeof w, "%s: the sum against the host's", what);
            tu_close(w, &s, &host, 1, (tu_tol){0, ((double)P + 1) * 1.1102230246251565e-16});
            if (ctx->backend == SG_BACKEND_CPU)
                TU_CHECK(s == host, "%s: the CPU's sum %.17g is not the index-order sum %.17g", what, s, host);
        }
        free(g);
    }
    if (misaligned) sg_tensor_destroy(glo);
    sg_tensor *ts[] = {base, g32, sa, sb, fa, fb, inv, want, got};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* sg_clip_sumsq_amp's own refusals: grad_lo's dtype, inv's dtype and count, the part. */
static void sumsq_amp_errors(sg_ctx *ctx)
{
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_BF16, 12, "grad_lo"), *gi = tu_tensor1(ctx, SG_DTYPE_I32, 12, "grad_i32");
    sg_tensor *s = tu_tensor1(ctx, SG_DTYPE_I32, 4, "sums"), *inv = tu_tensor1(ctx, SG_DTYPE_F32, 1, "inv");
    sg_tensor *inv2 = tu_tensor1(ctx, SG_DTYPE_F32, 2, "inv2"), *invb = tu_tensor1(ctx, SG_DTYPE_BF16, 1, "invb");
    free(tu_random(g, -1, 1));
    TU_OK(ctx, sg_tensor_fill(inv, 0.5));
    tu_poison(s);
    double *s0 = tu_get(s);
    TU_FAILS(ctx, sg_clip_sumsq_amp(ctx, gi, inv, s, 0), SG_ERR_DTYPE, "'grad_lo' is i32");
    TU_FAILS(ctx, sg_clip_sumsq_amp(ctx, g, NULL, s, 0), SG_ERR_NULL, "'inv'");
    TU_FAILS(ctx, sg_clip_sumsq_amp(ctx, g, inv2, s, 0), SG_ERR_SHAPE, "'inv'");
    TU_FAILS(ctx, sg_clip_sumsq_amp(ctx, g, invb, s, 0), SG_ERR_DTYPE, "'inv'");
    TU_FAILS(ctx, sg_clip_sumsq_amp(ctx, g, inv, s, 2), SG_ERR_INVALID, "part 2");
    TU_CHECK(sg_clip_sumsq_amp(NULL, g, inv, s, 0) == SG_ERR_NULL, "NULL ctx accepted");
    expect_unchanged("sums after sg_clip_sumsq_amp's rejected calls", s, s0);
    TU_OK(ctx, sg_clip_sumsq_amp(ctx, g, inv, s, 1)); /* still usable */
    TU_CHECK(sum_of(s, 1) > 0, "the valid call after the errors wrote %g", sum_of(s, 1));
    free(s0);
    sg_tensor *ts[] = {g, gi, s, inv, inv2, invb};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* The split form's argument checks: nothing written, the context usable after. */
static void split_errors(sg_ctx *ctx)
{
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_F32, 12, "grad"), *g_bf16 = tu_tensor1(ctx, SG_DTYPE_BF16, 12, "g_bf16");
    sg_tensor *s = tu_tensor1(ctx, SG_DTYPE_I32, 4, "sums"), *s_f32 = tu_tensor1(ctx, SG_DTYPE_F32, 4, "sums_f32");
    sg_tensor *s3 = tu_tensor1(ctx, SG_DTYPE_I32, 3, "sums3");
    sg_tensor *norm = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm"), *nf = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nf");
    free(tu_random(g, -1, 1));
    double *g0 = tu_get(g);
    tu_poison(s), tu_poison(norm), tu_poison(nf);
    double *s0 = tu_get(s);
    TU_FAILS(ctx, sg_clip_sumsq(ctx, g_bf16, s, 0), SG_ERR_DTYPE, "'grad'");
    TU_FAILS(ctx, sg_clip_sumsq(ctx, g, s_f32, 0), SG_ERR_DTYPE, "'sums'");
    TU_FAILS(ctx, sg_clip_sumsq(ctx, g, s3, 0), SG_ERR_SHAPE, "'sums' (sums3) has 3 elements; expected 2 per part");
    TU_FAILS(ctx, sg_clip_sumsq(ctx, g, s, 2), SG_ERR_INVALID, "part 2 of 'sums' (sums), which holds 2 parts");
    TU_FAILS(ctx, sg_clip_sumsq(ctx, g, s, -1), SG_ERR_INVALID, "part -1");
    TU_FAILS(ctx, sg_clip_sumsq(ctx, g, NULL, 0), SG_ERR_NULL, "'sums'");
    TU_FAILS(ctx, sg_clip_apply(ctx, g, 1.f, s, norm, NULL), SG_ERR_NULL, "'nonfinite'");
    TU_FAILS(ctx, sg_clip_apply(ctx, g, NAN, s, norm, nf), SG_ERR_INVALID, "max_norm is NaN");
    TU_FAILS(ctx, sg_clip_apply(ctx, g, 1.f, s3, norm, nf), SG_ERR_SHAPE, "2 per part");
    TU_FAILS(ctx, sg_clip_apply(ctx, g, 1.f, s, nf, nf), SG_ERR_DTYPE, "'norm'");
    TU_CHECK(sg_clip_sumsq(NULL, g, s, 0) == SG_ERR_NULL, "NULL ctx accepted");
    expect_unchanged("g after the split form's rejected calls", g, g0);
    expect_unchanged("sums after the split form's rejected calls", s, s0);
    TU_CHECK(isnan(read1(norm)), "a rejected call wrote the norm");
    TU_OK(ctx, sg_clip_sumsq(ctx, g, s, 0));
    TU_OK(ctx, sg_clip_sumsq(ctx, g, s, 1));
    TU_OK(ctx, sg_clip_apply(ctx, g, 1e-3f, s, norm, nf));
    TU_CHECK(read1(nf) == 0 && read1(norm) > 0, "the valid split calls after the errors did not measure");
    free(g0), free(s0);
    sg_tensor *ts[] = {g, g_bf16, s, s_f32, s3, norm, nf};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

typedef struct factor_step {
    sg_ctx *ctx;
    sg_tensor *g, *norm, *nf, *factor;
    float max_norm;
} factor_step;

static sg_status factor_fn(void *u)
{
    factor_step *s = u;
    return sg_clip_factor(s->ctx, s->g, s->max_norm, s->norm, s->nf, s->factor);
}

/* The factor forms on fresh g (P f32 elements) against sg_clip_grad_norm on a copy: (1) max_norm
 * half the norm: g left alone, the norm and flag the same bits, a factor below 1 with g * factor
 * (f32) the clipped copy bit for bit; sumsq on the whole g then sg_clip_factor_sums: the same
 * factor and norm, bit for bit; (2) a factor of exactly 1 wherever the scaling does nothing:
 * max_norm above the norm, 0, +inf, and an inf in g (the flag set, g alone); (3) captured (one
 * node) and replayed on new gradients: the eager call's bits. */
static void check_factor(sg_ctx *ctx, int64_t P)
{
    const char *be = sg_backend_name(ctx->backend);
    char what[128];
    snprintf(what, sizeof what, "%s P=%lld: sg_clip_factor", be, (long long)P);
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_F32, P, "grad"), *gc = tu_tensor1(ctx, SG_DTYPE_F32, P, "grad_clipped");
    sg_tensor *n1 = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm1"), *f1 = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nf1");
    sg_tensor *n2 = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm2"), *f2 = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nf2");
    sg_tensor *fac = tu_tensor1(ctx, SG_DTYPE_F32, 1, "factor"), *fac2 = tu_tensor1(ctx, SG_DTYPE_F32, 1, "factor2");
    sg_tensor *one = tu_tensor1(ctx, SG_DTYPE_I32, 2, "sums1");
    double *gs = tu_random(g, -1, 1);
    free(gs);
    gs = tu_get(g); /* as stored: f32 */
    tu_set(gc, gs);
    TU_OK(ctx, sg_clip_grad_norm(ctx, gc, 0.f, n1, f1));
    const float max_norm = (float)(read1(n1) * 0.5);

    /* (1) */
    tu_poison(n2), tu_poison(f2), tu_poison(fac);
    TU_OK(ctx, sg_clip_factor(ctx, g, max_norm, n2, f2, fac));
    TU_OK(ctx, sg_clip_grad_norm(ctx, gc, max_norm, n1, f1));
    expect_unchanged(what, g, gs);
    TU_CHECK(bits1(n2) == bits1(n1) && read1(f2) == 0 && read1(f1) == 0,
             "%s: norm %.9g and flag %g, sg_clip_grad_norm's %.9g and %g", what, read1(n2), read1(f2), read1(n1),
             read1(f1));
    const double F = read1(fac);
    TU_CHECK(F < 1 && F > 0, "%s: the factor for max_norm %g is %.9g, expected in (0, 1)", what, (double)max_norm, F);
    double *clipped = tu_get(gc);
    int64_t bad = n_not_scaled(clipped, gs, P, (float)F, SG_DTYPE_F32);
    TU_CHECK(bad == 0, "%s: %lld of %lld elements of sg_clip_grad_norm's g are not g * factor (%.9g) in f32", what,
             (long long)bad, (long long)P, F);
    free(clipped);
    TU_OK(ctx, sg_clip_sumsq(ctx, g, one, 0));
    tu_poison(fac2), tu_poison(n1), tu_poison(f1);
    TU_OK(ctx, sg_clip_factor_sums(ctx, max_norm, one, n1, f1, fac2));
    TU_CHECK(bits1(fac2) == bits1(fac) && bits1(n1) == bits1(n2) && read1(f1) == 0,
             "%s: sg_clip_factor_sums on one part gave factor %.9g, norm %.9g, flag %g; sg_clip_factor %.9g, %.9g",
             what, read1(fac2), read1(n1), read1(f1), F, read1(n2));

    /* (2) */
    const float nothing[3] = {(float)((read1(n2) + 1e-6) * 1.01), 0.f, INFINITY};
    for (int k = 0; k < 3; k++) {
        tu_poison(fac), tu_poison(fac2);
        TU_OK(ctx, sg_clip_factor(ctx, g, nothing[k], n2, f2, fac));
        TU_OK(ctx, sg_clip_factor_sums(ctx, nothing[k], one, n1, f1, fac2));
        TU_CHECK(read1(fac) == 1 && read1(fac2) == 1, "%s: max_norm %g: factors %.9g and %.9g (split), expected 1",
                 what, (double)nothing[k], read1(fac), read1(fac2));
    }
    double *bad_g = malloc((size_t)P * sizeof *bad_g);
    memcpy(bad_g, gs, (size_t)P * sizeof *bad_g);
    bad_g[(int64_t)(tu_next() % (uint64_t)P)] = INFINITY;
    tu_set(g, bad_g);
    tu_poison(fac), tu_poison(f2);
    TU_OK(ctx, sg_clip_factor(ctx, g, 1e-3f, n2, f2, fac));
    TU_CHECK(read1(fac) == 1 && read1(f2) == 1 && isinf(read1(n2)), "%s with an inf: factor %.9g, flag %g, norm %g",
             what, read1(fac), read1(f2), read1(n2));
    expect_unchanged(what, g, bad_g);
    free(bad_g);

    /* (3) |g| in [0.5, 1) on replay: a norm of at least 0.5 sqrt(P), above 0.25 sqrt(P). */
    factor_step st = {ctx, g, n2, f2, fac, (float)(0.25 * sqrt((double)P))};
    sg_graph_options o = sg_graph_options_default();
    o.name = "clip_factor";
    o.warmup = 0;
    sg_graph *gph = NULL;
    tu_poison(fac);
    TU_OK(ctx, sg_graph_capture(ctx, factor_fn, &st, &o, &gph));
    if (!sg_graphs_disabled()) {
        sg_graph_stats gs_st;
        TU_OK(ctx, sg_graph_get_stats(gph, &gs_st));
        TU_CHECK(gs_st.nodes == 1, "%s: the factor's graph holds %d nodes, expected 1", what, gs_st.nodes);
        TU_CHECK(isnan(read1(fac)), "%s: capture ran the clip", what);
    }
    double *fresh = malloc((size_t)P * sizeof *fresh);
    for (int64_t i = 0; i < P; i++) fresh[i] = tu_uniform(0.5, 1) * (tu_next() & 1 ? 1 : -1);
    tu_set(g, fresh);
    free(fresh);
    fresh = tu_get(g); /* as stored: f32 */
    tu_poison(fac);
    TU_OK(ctx, sg_graph_replay(gph));
    TU_OK(ctx, sg_clip_factor(ctx, g, st.max_norm, n1, f1, fac2));
    TU_CHECK(bits1(fac) == bits1(fac2) && bits1(n2) == bits1(n1) && read1(fac) < 1,
             "%s: replayed, factor %.9g and norm %.9g; eagerly %.9g and %.9g (expected below 1)", what, read1(fac),
             read1(n2), read1(fac2), read1(n1));
    expect_unchanged(what, g, fresh);
    free(fresh);
    sg_graph_destroy(gph);
    free(gs);
    sg_tensor *ts[] = {g, gc, n1, f1, n2, f2, fac, fac2, one};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

/* The factor forms' own argument checks: nothing written, the context usable after. */
static void factor_errors(sg_ctx *ctx)
{
    sg_tensor *g = tu_tensor1(ctx, SG_DTYPE_F32, 12, "grad"), *s = tu_tensor1(ctx, SG_DTYPE_I32, 2, "sums");
    sg_tensor *norm = tu_tensor1(ctx, SG_DTYPE_F32, 1, "norm"), *nf = tu_tensor1(ctx, SG_DTYPE_I32, 1, "nf");
    sg_tensor *fac = tu_tensor1(ctx, SG_DTYPE_F32, 1, "factor"), *fac_i = tu_tensor1(ctx, SG_DTYPE_I32, 1, "factor_i32");
    sg_tensor *fac2 = tu_tensor1(ctx, SG_DTYPE_F32, 2, "factor2"), *fac_in_g = NULL;
    int64_t one = 1;
    TU_OK(ctx, sg_tensor_view(g, 5, 1, &one, "factor_in_g", &fac_in_g));
    free(tu_random(g, -1, 1));
    double *g0 = tu_get(g);
    TU_OK(ctx, sg_clip_sumsq(ctx, g, s, 0));
    tu_poison(norm), tu_poison(nf), tu_poison(fac);
    TU_FAILS(ctx, sg_clip_factor(ctx, g, 1.f, norm, nf, NULL), SG_ERR_NULL, "'factor'");
    TU_FAILS(ctx, sg_clip_factor(ctx, g, 1.f, norm, nf, fac_i), SG_ERR_DTYPE, "'factor'");
    TU_FAILS(ctx, sg_clip_factor(ctx, g, 1.f, norm, nf, fac2), SG_ERR_SHAPE, "'factor' (factor2)");
    TU_FAILS(ctx, sg_clip_factor(ctx, g, 1.f, norm, nf, fac_in_g), SG_ERR_INVALID, "overlaps");
    TU_FAILS(ctx, sg_clip_factor(ctx, g, 1.f, norm, nf, norm), SG_ERR_INVALID, "'factor'");
    TU_FAILS(ctx, sg_clip_factor(ctx, g, NAN, norm, nf, fac), SG_ERR_INVALID, "max_norm is NaN");
    TU_FAILS(ctx, sg_clip_factor(ctx, NULL, 1.f, norm, nf, fac), SG_ERR_NULL, "'grad'");
    TU_FAILS(ctx, sg_clip_factor_sums(ctx, 1.f, s, norm, nf, NULL), SG_ERR_NULL, "'factor'");
    TU_FAILS(ctx, sg_clip_factor_sums(ctx, 1.f, NULL, norm, nf, fac), SG_ERR_NULL, "'sums'");
    TU_FAILS(ctx, sg_clip_factor_sums(ctx, 1.f, s, norm, nf, nf), SG_ERR_DTYPE, "'factor'");
    TU_FAILS(ctx, sg_clip_factor_sums(ctx, NAN, s, norm, nf, fac), SG_ERR_INVALID, "max_norm is NaN");
    TU_CHECK(sg_clip_factor(NULL, g, 1.f, norm, nf, fac) == SG_ERR_NULL, "NULL ctx accepted");
    expect_unchanged("g after the factor forms' rejected calls", g, g0);
    TU_CHECK(isnan(read1(norm)) && isnan(read1(fac)), "a rejected call wrote the norm or the factor");
    TU_OK(ctx, sg_clip_factor_sums(ctx, 1e-3f, s, norm, nf, fac));
    TU_CHECK(read1(nf) == 0 && read1(norm) > 0 && read1(fac) < 1, "the valid call after the errors: norm %g, "
             "factor %g", read1(norm), read1(fac));
    free(g0);
    sg_tensor *ts[] = {fac_in_g, g, s, norm, nf, fac, fac_i, fac2};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
}

static void cpu_tests(void)
{
    const int64_t Ps[] = {1, 5, 1000, 100003};
    for (size_t i = 0; i < sizeof Ps / sizeof *Ps; i++) {
        cpu_norm_and_scale(SG_DTYPE_F32, Ps[i], 1.0);
        cpu_norm_and_scale(SG_DTYPE_F64, Ps[i], 1.0);
    }
    cpu_norm_and_scale(SG_DTYPE_F32, 4099, 1e-20); /* tiny gradients: norm + 1e-6 is 1e-6 */
    cpu_norm_and_scale(SG_DTYPE_F32, 4099, 1e15);
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    check_nonfinite(ctx, SG_DTYPE_F32, 1001);
    check_nonfinite(ctx, SG_DTYPE_F64, 7);
    check_nonfinite(ctx, SG_DTYPE_F32, 1);
    check_capture(ctx, ctx, 1001, 1);
    check_split(ctx, 2);
    check_split(ctx, 100003);
    split_errors(ctx);
    check_sumsq_amp(ctx, SG_DTYPE_BF16, 1, 0);
    check_sumsq_amp(ctx, SG_DTYPE_BF16, 4099, 1);
    check_sumsq_amp(ctx, SG_DTYPE_F32, 1003, 0);
    check_sumsq_amp(ctx, SG_DTYPE_F64, 77, 0);
    sumsq_amp_errors(ctx);
    check_factor(ctx, 1);
    check_factor(ctx, 4099);
    factor_errors(ctx);
    sg_ctx_destroy(ctx);
    cpu_f64_overflow();
    cpu_errors();
}

/* ---- gpu ---- */

/* Host f32 data straight into a tensor (no double staging: P reaches 25M). */
static void set_f32(sg_tensor *t, const float *v)
{
    TU_OK(t->ctx, sg_tensor_copy_from_host(t, v, (size_t)t->numel * sizeof(float)));
    TU_OK(t->ctx, sg_ctx_sync(t->ctx));
}

static void get_f32(const sg_tensor *t, float *v)
{
    TU_OK(t->ctx, sg_tensor_copy_to_host(t, v, (size_t)t->numel * sizeof(float)));
}

/* The "last block done" counter in scratch is back at 0 for the next call or replay. */
static void expect_counter_zero(sg_ctx *gpu, const char *what)
{
    double *c = tu_get(gpu->scratch[SG_SLOT_CLIP]);
    TU_CHECK(c[0] == 0, "%s: the block counter is %g, expected 0", what, c[0]);
    free(c);
}

/* P elements: measure only (1 launch), twice (bitwise the same norm), against the CPU; then
 * max_norm above the norm (2 launches, g untouched) and below it (g scaled), twice from the
 * same input (bitwise the same g), against the CPU. misaligned: views at element 1.
 *
 * Tolerances: the GPU sums in double in another order than the CPU's index-order double sum;
 * both are within P * 2^-53 (3e-9 at 25M) of the exact sum, so the f32 norms differ by at most
 * 1 ulp (rtol 2^-23); the coefficients in f64 then differ by about 1e-9 relative at most, and
 * rounded to f32 by at most 1 ulp; each clipped element is g * the GPU's factor, bit for bit. */
static void gpu_run(sg_ctx *gpu, sg_ctx *cpu, int64_t P, int misaligned)
{
    char what[160];
    snprintf(what, sizeof what, "gpu P=%lld%s", (long long)P, misaligned ? " misaligned" : "");
    sg_tensor *base = NULL, *g;
    if (misaligned) {
        base = tu_tensor1(gpu, SG_DTYPE_F32, P + 1, "base");
        TU_OK(gpu, sg_tensor_view(base, 1, 1, &P, "grad", &g));
    } else {
        g = tu_tensor1(gpu, SG_DTYPE_F32, P, "grad");
    }
    sg_tensor *gc = tu_tensor1(cpu, SG_DTYPE_F32, P, "grad_ref");
    sg_tensor *norm = tu_tensor1(gpu, SG_DTYPE_F32, 1, "norm"), *nf = tu_tensor1(gpu, SG_DTYPE_I32, 1, "nf");
    sg_tensor *norm_c = tu_tensor1(cpu, SG_DTYPE_F32, 1, "norm_ref"), *nf_c = tu_tensor1(cpu, SG_DTYPE_I32, 1, "nf_ref");
    float *g0 = malloc((size_t)P * sizeof *g0), *a = malloc((size_t)P * sizeof *a);
    float *b = malloc((size_t)P * sizeof *b);
    for (int64_t i = 0; i < P; i++) g0[i] = (float)tu_uniform(-1, 1);
    set_f32(g, g0);
    set_f32(gc, g0);

    /* Measure only. */
    tu_poison(norm), tu_poison(nf);
    uint64_t before = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_clip_grad_norm(gpu, g, 0.f, norm, nf));
    uint64_t launches = sg_ctx_launch_count(gpu) - before;
    TU_CHECK(launches == 1, "%s: %llu launches to measure, expected 1", what, (unsigned long long)launches);
    uint32_t bits = bits1(norm);
    TU_OK(gpu, sg_clip_grad_norm(gpu, g, -1.f, norm, nf));
    TU_CHECK(bits1(norm) == bits, "%s: two runs gave norms %08x and %08x: not deterministic", what,
             (unsigned)bits, (unsigned)bits1(norm));
    TU_OK(cpu, sg_clip_grad_norm(cpu, gc, 0.f, norm_c, nf_c));
    char label[200];
    snprintf(label, sizeof label, "%s: norm", what);
    tu_close_tensors(label, norm, norm_c, norm_tol);
    TU_CHECK(read1(nf) == 0, "%s: nonfinite is %g", what, read1(nf));
    get_f32(g, a);
    TU_CHECK(memcmp(a, g0, (size_t)P * sizeof *a) == 0, "%s: measuring changed g", what);
    expect_counter_zero(gpu, what);
    double nd = read1(norm_c);

    /* max_norm above norm + 1e-6 (coef >= 1): two launches, g untouched. */
    before = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_clip_grad_norm(gpu, g, (float)((nd + 1e-6) * 1.01), norm, nf));
    launches = sg_ctx_launch_count(gpu) - before;
    TU_CHECK(launches == 2, "%s: %llu launches to clip, expected 2", what, (unsigned long long)launches);
    get_f32(g, a);
    TU_CHECK(memcmp(a, g0, (size_t)P * sizeof *a) == 0, "%s: g changed though its norm is below max_norm",
             what);

    /* max_norm below it: scaled; twice from the same input, the same bits. */
    float max_norm = (float)(nd * 0.5);
    for (int rep = 0; rep < 2; rep++) {
        set_f32(g, g0);
        TU_OK(gpu, sg_clip_grad_norm(gpu, g, max_norm, norm, nf));
        get_f32(g, rep == 0 ? a : b);
    }
    TU_CHECK(memcmp(a, b, (size_t)P * sizeof *a) == 0, "%s: two clips of the same g differ in their "
             "bits: not deterministic", what);
    /* The factor (sg_clip_factor: one launch, g left alone) against the CPU's: the two f64
     * coefficients differ by at most about 2 P 2^-53 relative (see gpu_run's tolerances), each
     * f32 rounding adds 2^-24, so rtol 2^-23 + 2 P 2^-53. The clipped g is g * factor, bit for
     * bit. */
    sg_tensor *factor = tu_tensor1(gpu, SG_DTYPE_F32, 1, "factor");
    sg_tensor *factor_c = tu_tensor1(cpu, SG_DTYPE_F32, 1, "factor_ref");
    tu_poison(factor);
    set_f32(g, g0);
    before = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_clip_factor(gpu, g, max_norm, norm, nf, factor));
    launches = sg_ctx_launch_count(gpu) - before;
    TU_CHECK(launches == 1, "%s: %llu launches for the factor, expected 1", what, (unsigned long long)launches);
    get_f32(g, b);
    TU_CHECK(memcmp(b, g0, (size_t)P * sizeof *b) == 0, "%s: sg_clip_factor changed g", what);
    TU_OK(cpu, sg_clip_factor(cpu, gc, max_norm, norm_c, nf_c, factor_c));
    snprintf(label, sizeof label, "%s: the factor for %g", what, (double)max_norm);
    const double u = 1.1102230246251565e-16; /* 2^-53 */
    tu_close_tensors(label, factor, factor_c, (tu_tol){0, 1.1920928955078125e-07 + 2.0 * (double)P * u});
    const float F = (float)read1(factor);
    TU_CHECK(F < 1.f, "%s: %.9g, not below 1", label, (double)F);
    int64_t bad = 0;
    for (int64_t i = 0; i < P; i++) {
        float w = g0[i] * F;
        bad += memcmp(&a[i], &w, sizeof w) != 0;
    }
    TU_CHECK(bad == 0, "%s: %lld of %lld clipped elements are not g * factor (%.9g) in f32", what, (long long)bad,
             (long long)P, (double)F);
    expect_counter_zero(gpu, what);

    free(g0), free(a), free(b);
    sg_tensor *ts[] = {g, base, gc, norm, nf, norm_c, nf_c, factor, factor_c};
    for (int i = 0; i < 9; i++) sg_tensor_destroy(ts[i]);
}

/* The checks CUDA can make without reading device memory. */
static void gpu_errors(sg_ctx *gpu, sg_ctx *cpu)
{
    sg_tensor *g = tu_tensor1(gpu, SG_DTYPE_F32, 8, "grad"), *g_bf16 = tu_tensor1(gpu, SG_DTYPE_BF16, 8, "g_bf16");
    sg_tensor *norm = tu_tensor1(gpu, SG_DTYPE_F32, 1, "norm"), *nf = tu_tensor1(gpu, SG_DTYPE_I32, 1, "nf");
    sg_tensor *norm_cpu = tu_tensor1(cpu, SG_DTYPE_F32, 1, "norm_cpu");
    TU_FAILS(gpu, sg_clip_grad_norm(gpu, g_bf16, 1.f, norm, nf), SG_ERR_DTYPE, "'grad'");
    TU_FAILS(gpu, sg_clip_grad_norm(gpu, g, 1.f, norm_cpu, nf), SG_ERR_BACKEND, "another context");
    TU_FAILS(gpu, sg_clip_grad_norm(gpu, g, 1.f, nf, nf), SG_ERR_DTYPE, "'norm'");
    free(tu_random(g, -1, 1));
    TU_OK(gpu, sg_clip_grad_norm(gpu, g, 1.f, norm, nf)); /* the context still works */
    sg_tensor *ts[] = {g, g_bf16, norm, nf, norm_cpu};
    for (int i = 0; i < 5; i++) sg_tensor_destroy(ts[i]);
}

static void gpu_tests(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    /* The first call of a context allocates and zero-fills the scratch (one more launch, and
     * an allocation capture forbids); reserve it up front, as a trainer does. */
    void *scratch;
    TU_OK(gpu, sg_ctx_scratch(gpu, SG_SLOT_CLIP, SG_CLIP_SCRATCH_BYTES, &scratch));
    /* Single elements, the float4 tail, one block, many blocks, and a GPT-2-small-sized
     * buffer (more float4s than threads of the grid: the grid-stride loop). */
    const int64_t Ps[] = {1, 5, 1000, (1 << 20) + 7, 25198602};
    for (size_t i = 0; i < sizeof Ps / sizeof *Ps; i++) gpu_run(gpu, cpu, Ps[i], 0);
    gpu_run(gpu, cpu, 1001, 1);
    check_nonfinite(gpu, SG_DTYPE_F32, (1 << 20) + 3);
    check_nonfinite(gpu, SG_DTYPE_F32, 1);
    check_capture(gpu, cpu, (1 << 20) + 5, 2);
    check_split(gpu, 2);
    check_split(gpu, 1001);
    check_split(gpu, (1 << 20) + 7);
    split_errors(gpu);
    /* the scaled sum: one element, the tails, a misaligned bf16 view (scalar loads, the same
     * order), f32, and more groups than threads of the grid */
    check_sumsq_amp(gpu, SG_DTYPE_BF16, 1, 0);
    check_sumsq_amp(gpu, SG_DTYPE_BF16, 4099, 0);
    check_sumsq_amp(gpu, SG_DTYPE_BF16, 4099, 1);
    check_sumsq_amp(gpu, SG_DTYPE_F32, 1003, 1);
    check_sumsq_amp(gpu, SG_DTYPE_BF16, (1 << 22) + 6, 0);
    sumsq_amp_errors(gpu);
    check_factor(gpu, 1);
    check_factor(gpu, (1 << 20) + 5);
    factor_errors(gpu);
    gpu_errors(gpu, cpu);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_clip");
    if (!strcmp(mode, "gpu")) gpu_tests();
    else cpu_tests();
    return tu_finish("test_clip");
}
