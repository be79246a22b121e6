/* test_dropout.c: dropout (Philox-4x32-10 masks) and sg_rng_advance. `cpu`: Philox against
 * Random123's known answers; the reference against the counter mapping documented in
 * ops/dropout.h, re-derived here (f32, f64, bf16); the keep fraction within 6 sigma of 1 - p;
 * masks that change with the site, the seed and the offset (both words) and come back when
 * the offset is reset; the offset's carry; backward against forward; bf16 masks equal to f32
 * ones bit for bit, kept values the f32 ones rounded; float64 finite differences; argument
 * errors (mixed dtypes included); a CPU capture whose replays draw a fresh mask after each
 * advance. `gpu`: the kernel against the CPU reference bit for bit, f32 and bf16 (forward,
 * backward, p = 0, in place, misaligned views, the 4-element tail), one launch per call, bf16
 * against f32 on the GPU, and CUDA Graphs (f32, bf16) replayed with fresh masks. */
#include "testutil.h"

#include "ops/dropout.h"

/* ---- rng state ---- */

static double word_as_i32(uint32_t w)
{
    int32_t v;
    memcpy(&v, &w, sizeof v);
    return v;
}

/* A new rng tensor holding (seed, offset), both 64-bit. */
static sg_tensor *rng_new(sg_ctx *ctx, uint64_t seed, uint64_t offset)
{
    sg_tensor *r = tu_tensor1(ctx, SG_DTYPE_I32, SG_RNG_COUNT, "rng");
    double v[4] = {word_as_i32((uint32_t)seed), word_as_i32((uint32_t)(seed >> 32)),
                   word_as_i32((uint32_t)offset), word_as_i32((uint32_t)(offset >> 32))};
    tu_set(r, v);
    return r;
}

/* Rewrites (seed, offset) with a stream-ordered device write (no sync, capture-safe). */
static void rng_write(sg_tensor *r, uint64_t seed, uint64_t offset)
{
    uint32_t w[4] = {(uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)offset,
                     (uint32_t)(offset >> 32)};
    TU_OK(r->ctx, sg_tensor_write_small(r, 0, w, sizeof w));
}

static void rng_read(const sg_tensor *r, uint64_t *seed, uint64_t *offset)
{
    uint32_t w[4];
    TU_OK(r->ctx, sg_tensor_copy_to_host(r, w, sizeof w));
    *seed = (uint64_t)w[1] << 32 | w[0];
    *offset = (uint64_t)w[3] << 32 | w[2];
}

/* ---- the mapping of ops/dropout.h, written out again ---- */

/* Whether element i is kept, straight from the documented counter and key. */
static int mapped_keep(uint64_t seed, uint64_t offset, uint32_t site, int64_t i, float p)
{
    uint64_t g = (uint64_t)i / 4;
    sg_philox_out r = sg_philox4x32_10((uint32_t)g, (uint32_t)(g >> 32), site, (uint32_t)offset,
                                       (uint32_t)seed,
                                       (uint32_t)(seed >> 32) ^ (uint32_t)(offset >> 32));
    double u = (double)(r.v[i % 4] >> 8) / 16777216.0;
    return u >= (double)p;
}

/* The probability of keeping an element: (2^24 - ceil(p 2^24)) / 2^24. */
static double keep_prob(float p) { return (16777216.0 - ceil((double)p * 16777216.0)) / 16777216.0; }

/* v rounded to dt as a store of it does (bf16: through f32, to nearest even, as sg_st). */
static double round_to(sg_dtype dt, double v)
{
    if (dt == SG_DTYPE_F32) return (float)v;
    if (dt == SG_DTYPE_BF16) return sg_bf16_to_double(sg_double_to_bf16(v));
    return v;
}

/* ---- comparisons ---- */

/* got and ref (same dtype, any backends) hold the same bytes; prints the first difference. */
static void expect_bitwise(const char *what, const sg_tensor *got, const sg_tensor *ref)
{
    size_t nb = sg_tensor_nbytes(ref), es = sg_dtype_size(ref->dtype);
    if (got->dtype != ref->dtype || sg_tensor_nbytes(got) != nb) {
        TU_CHECK(0, "%s: '%s' and '%s' differ in dtype or size", what, got->name, ref->name);
        return;
    }
    unsigned char *a = malloc(nb ? nb : 1), *b = malloc(nb ? nb : 1);
    TU_OK(got->ctx, sg_tensor_copy_to_host(got, a, nb));
    TU_OK(ref->ctx, sg_tensor_copy_to_host(ref, b, nb));
    if (memcmp(a, b, nb) != 0) {
        int64_t first = -1, bad = 0;
        for (int64_t i = 0; i < ref->numel; i++)
            if (memcmp(a + i * es, b + i * es, es) != 0) {
                if (first < 0) first = i;
                bad++;
            }
        sg_tensor ha = *got, hb = *ref;
        ha.data = a, hb.data = b;
        TU_CHECK(0, "%s: %lld of %lld elements differ in their bits; first [%lld] got %.9g ref "
                 "%.9g", what, (long long)bad, (long long)ref->numel, (long long)first,
                 sg_ld(&ha, first), sg_ld(&hb, first));
    }
    free(a);
    free(b);
}

/* Elements where the two masks (outputs of positive inputs: nonzero = kept) differ. */
static int64_t mask_diff(const sg_tensor *a, const sg_tensor *b)
{
    double *u = tu_get(a), *v = tu_get(b);
    int64_t d = 0;
    for (int64_t i = 0; i < a->numel; i++) d += (u[i] != 0) != (v[i] != 0);
    free(u);
    free(v);
    return d;
}

/* ---- cpu ---- */

/* Random123's kat_vectors, the three philox4x32 10 lines: counter, key, output. */
static void cpu_philox_kat(void)
{
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1}};
    for (int t = 0; t < 3; t++) {
        const uint32_t *k = kat[t];
        sg_philox_out r = sg_philox4x32_10(k[0], k[1], k[2], k[3], k[4], k[5]);
        for (int j = 0; j < 4; j++)
            TU_CHECK(r.v[j] == k[6 + j], "philox4x32-10 known answer %d word %d: %08x, expected %08x",
                     t, j, (unsigned)r.v[j], (unsigned)k[6 + j]);
    }
}

/* Every element of the reference against the mapping: kept ones are x * 1/(1-p) rounded to
 * the dtype once, dropped ones 0. Seed and offset have both words set, n is not a multiple
 * of 4. */
static void cpu_mapping(sg_dtype dt, float p)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const int64_t n = 1003;
    uint64_t seed = tu_next(), offset = tu_next();
    uint32_t site = (uint32_t)tu_next();
    sg_tensor *rng = rng_new(ctx, seed, offset);
    sg_tensor *x = tu_tensor1(ctx, dt, n, "x"), *y = tu_tensor1(ctx, dt, n, "y");
    free(tu_random(x, -2, 2));
    double *xv = tu_get(x); /* as stored: rounded to f32 or bf16 when dt is */
    tu_poison(y);
    TU_OK(ctx, sg_dropout_forward(ctx, x, p, rng, site, y));
    double *yv = tu_get(y), scale = 1.0 / (1.0 - (double)p);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        double want = round_to(dt, mapped_keep(seed, offset, site, i, p) ? xv[i] * scale : 0.0);
        if (yv[i] != want && first < 0) first = i;
        bad += yv[i] != want;
    }
    TU_CHECK(bad == 0, "cpu %s p=%g: %lld of %lld elements differ from the documented mapping "
             "(first [%lld]: %.9g, expected %.9g)", sg_dtype_name(dt), (double)p, (long long)bad,
             (long long)n, (long long)first, first < 0 ? 0 : yv[first],
             first < 0 ? 0 : xv[first] * scale);
    free(xv);
    free(yv);
    sg_tensor_destroy(x), sg_tensor_destroy(y), sg_tensor_destroy(rng);
    sg_ctx_destroy(ctx);
}

/* Kept count within 6 sigma of the binomial mean n q, q = keep_prob(p), and each of the four
 * Philox words' kept count within 6 too; x = 1 so y is scale or 0. The draws are random per
 * seed, so a bound can only make a false failure unlikely: at 4 sigma (6e-5 a check) one seed
 * in 1,500 failed (SG_TEST_SEED=101, p = 0.001); at 6 sigma it is 2e-9 a check, about 1e-7 a run.
 * A keep probability 1% off at p = 0.5 still moves the count by 1.7x the bound. */
static void cpu_keep_fraction(float p)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const int64_t n = 1 << 20;
    sg_tensor *rng = rng_new(ctx, tu_next(), tu_next());
    sg_tensor *x = tu_tensor1(ctx, SG_DTYPE_F32, n, "x"), *y = tu_tensor1(ctx, SG_DTYPE_F32, n, "y");
    TU_OK(ctx, sg_tensor_fill(x, 1.0));
    TU_OK(ctx, sg_dropout_forward(ctx, x, p, rng, (uint32_t)tu_next(), y));
    const float *yv = y->data;
    float scale = (float)(1.0 / (1.0 - (double)p));
    int64_t kept = 0, lane[4] = {0, 0, 0, 0}, other = 0;
    for (int64_t i = 0; i < n; i++) {
        int k = yv[i] != 0;
        kept += k;
        lane[i % 4] += k;
        other += yv[i] != 0 && yv[i] != scale;
    }
    double q = keep_prob(p);
    double mean = n * q, sigma = sqrt(n * q * (1 - q));
    TU_CHECK(fabs(kept - mean) <= 6 * sigma, "p=%g: kept %lld of %lld, expected %.1f +- 6 x %.1f",
             (double)p, (long long)kept, (long long)n, mean, sigma);
    double lmean = n / 4 * q, lsigma = sqrt(n / 4 * q * (1 - q));
    for (int k = 0; k < 4; k++)
        TU_CHECK(fabs(lane[k] - lmean) <= 6 * lsigma, "p=%g: Philox word %d kept %lld of %lld, "
                 "expected %.1f +- 6 x %.1f", (double)p, k, (long long)lane[k], (long long)n / 4,
                 lmean, lsigma);
    TU_CHECK(other == 0, "p=%g: %lld kept values are not 1/(1-p)", (double)p, (long long)other);
    sg_tensor_destroy(x), sg_tensor_destroy(y), sg_tensor_destroy(rng);
    sg_ctx_destroy(ctx);
}

/* Masks differ across sites, seeds, offsets (either word) and after sg_rng_advance, in about
 * 2 q (1 - q) of the elements (more than a quarter of them at p = 0.5), and are the same
 * again, bit for bit, once the state is written back. */
static void cpu_mask_changes(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const int64_t n = 1 << 16;
    const float p = 0.5f;
    uint64_t seed = tu_next(), offset = tu_next() >> 1; /* room for +1 without carry out */
    uint32_t site = (uint32_t)tu_next();
    sg_tensor *rng = rng_new(ctx, seed, offset);
    sg_tensor *x = tu_tensor1(ctx, SG_DTYPE_F32, n, "x");
    sg_tensor *y0 = tu_tensor1(ctx, SG_DTYPE_F32, n, "y0"), *y1 = tu_tensor1(ctx, SG_DTYPE_F32, n, "y1");
    free(tu_random(x, 0.5, 1.5));
    TU_OK(ctx, sg_dropout_forward(ctx, x, p, rng, site, y0));
    const int64_t min_diff = n / 4;
    struct {
        const char *what;
        uint64_t seed, offset;
        uint32_t site;
    } v[] = {{"site + 1", seed, offset, site + 1},
             {"seed lo ^ 1", seed ^ 1, offset, site},
             {"seed hi ^ 1", seed ^ (1ull << 32), offset, site},
             {"offset lo + 1", seed, offset + 1, site},
             {"offset hi ^ 1", seed, offset ^ (1ull << 32), site}};
    for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
        rng_write(rng, v[k].seed, v[k].offset);
        TU_OK(ctx, sg_dropout_forward(ctx, x, p, rng, v[k].site, y1));
        int64_t d = mask_diff(y0, y1);
        TU_CHECK(d > min_diff, "%s: the mask changed in %lld of %lld elements, expected about half",
                 v[k].what, (long long)d, (long long)n);
    }
    /* sg_rng_advance: a new mask; writing the old offset back: the old mask again. */
    rng_write(rng, seed, offset);
    TU_OK(ctx, sg_rng_advance(ctx, rng));
    TU_OK(ctx, sg_dropout_forward(ctx, x, p, rng, site, y1));
    int64_t d = mask_diff(y0, y1);
    TU_CHECK(d > min_diff, "after sg_rng_advance the mask changed in %lld of %lld elements, "
             "expected about half", (long long)d, (long long)n);
    rng_write(rng, seed, offset);
    TU_OK(ctx, sg_dropout_forward(ctx, x, p, rng, site, y1));
    expect_bitwise("cpu: the mask after resetting the offset", y1, y0);
    sg_tensor *ts[] = {rng, x, y0, y1};
    for (int i = 0; i < 4; i++) sg_tensor_destroy(ts[i]);
    sg_ctx_destroy(ctx);
}

/* offset += 1 carries from lo into hi and wraps at 2^64; the seed is left alone. */
static void check_advance(sg_ctx *ctx, const char *what)
{
    const uint64_t from[3] = {41, 0x00000001ffffffffull, 0xffffffffffffffffull};
    uint64_t seed = tu_next();
    sg_tensor *rng = rng_new(ctx, seed, 0);
    for (int k = 0; k < 3; k++) {
        rng_write(rng, seed, from[k]);
        uint64_t before = sg_ctx_launch_count(ctx);
        TU_OK(ctx, sg_rng_advance(ctx, rng));
        uint64_t launches = sg_ctx_launch_count(ctx) - before;
        uint64_t s, o;
        rng_read(rng, &s, &o);
        TU_CHECK(o == from[k] + 1 && s == seed, "%s: offset %#llx advanced to %#llx (seed %#llx "
                 "-> %#llx), expected %#llx", what, (unsigned long long)from[k],
                 (unsigned long long)o, (unsigned long long)seed, (unsigned long long)s,
                 (unsigned long long)(from[k] + 1));
        if (ctx->backend == SG_BACKEND_CUDA)
            TU_CHECK(launches == 1, "%s: sg_rng_advance took %llu launches, expected 1", what,
                     (unsigned long long)launches);
    }
    sg_tensor_destroy(rng);
}

/* The backward regenerates the forward's mask: dx is nonzero exactly where y is, and there
 * equals dy * 1/(1-p) (rounded once); p = 0 copies; in place equals out of place. */
static void cpu_backward(sg_dtype dt)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const int64_t shape[3] = {3, 7, 11};
    const float p = 0.3f;
    uint32_t site = (uint32_t)tu_next();
    sg_tensor *rng = rng_new(ctx, tu_next(), tu_next());
    sg_tensor *x = tu_tensor(ctx, dt, 3, shape, "x"), *y = tu_tensor(ctx, dt, 3, shape, "y");
    sg_tensor *dy = tu_tensor(ctx, dt, 3, shape, "dy"), *dx = tu_tensor(ctx, dt, 3, shape, "dx");
    free(tu_random(x, 0.5, 1.5)); /* no zeros: nonzero output = kept */
    free(tu_random(dy, -1.5, -0.5));
    double *xv = tu_get(x), *dyv = tu_get(dy);
    TU_OK(ctx, sg_dropout_forward(ctx, x, p, rng, site, y));
    TU_OK(ctx, sg_dropout_backward(ctx, dy, p, rng, site, dx));
    double *yv = tu_get(y), *dxv = tu_get(dx), scale = 1.0 / (1.0 - (double)p);
    int64_t n = x->numel, bad = 0, kept = 0;
    for (int64_t i = 0; i < n; i++) {
        double want = round_to(dt, yv[i] != 0 ? dyv[i] * scale : 0.0);
        bad += dxv[i] != want;
        kept += yv[i] != 0;
    }
    TU_CHECK(bad == 0, "cpu %s backward: %lld of %lld elements disagree with the forward's mask",
             sg_dtype_name(dt), (long long)bad, (long long)n);
    TU_CHECK(kept > 0 && kept < n, "cpu %s: %lld of %lld kept", sg_dtype_name(dt), (long long)kept,
             (long long)n);
    /* p = 0: y is x. */
    TU_OK(ctx, sg_dropout_forward(ctx, x, 0.f, rng, site, y));
    expect_bitwise("cpu p=0: y", y, x);
    /* In place: the same values as out of place. */
    TU_OK(ctx, sg_dropout_forward(ctx, x, p, rng, site, y));
    TU_OK(ctx, sg_dropout_forward(ctx, x, p, rng, site, x));
    expect_bitwise("cpu in place", x, y);
    free(xv), free(dyv), free(yv), free(dxv);
    sg_tensor *ts[] = {rng, x, y, dy, dx};
    for (int i = 0; i < 5; i++) sg_tensor_destroy(ts[i]);
    sg_ctx_destroy(ctx);
}

/* bf16 against f32 on ctx (either backend), on the same values (bf16 ones, stored in both
 * dtypes, no zeros) at the same (seed, offset, site): the keep masks are equal bit for bit,
 * and every bf16 output element holds the bits of the f32 output's value rounded to bf16
 * (sg_double_to_bf16, nearest even): the mask is dtype-independent, the scale is applied as
 * in f32 and the result rounded to bf16 once. Forward and backward, n not a multiple of 4. */
static void check_bf16_vs_f32(sg_ctx *ctx, int64_t n, float p, const char *be)
{
    uint64_t seed = tu_next(), offset = tu_next();
    uint32_t site = (uint32_t)tu_next();
    sg_tensor *rng = rng_new(ctx, seed, offset);
    sg_tensor *xb = tu_tensor1(ctx, SG_DTYPE_BF16, n, "xb");
    sg_tensor *yb = tu_tensor1(ctx, SG_DTYPE_BF16, n, "yb");
    sg_tensor *xf = tu_tensor1(ctx, SG_DTYPE_F32, n, "xf"), *yf = tu_tensor1(ctx, SG_DTYPE_F32, n, "yf");
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (tu_next() & 1 ? 1 : -1) * tu_uniform(0.25, 4);
    tu_set(xb, v);
    free(v);
    v = tu_get(xb); /* bf16 values: exact in f32 too */
    tu_set(xf, v);
    free(v);
    for (int pass = 0; pass < 2; pass++) {
        tu_poison(yb), tu_poison(yf);
        if (pass == 0) {
            TU_OK(ctx, sg_dropout_forward(ctx, xb, p, rng, site, yb));
            TU_OK(ctx, sg_dropout_forward(ctx, xf, p, rng, site, yf));
        } else {
            TU_OK(ctx, sg_dropout_backward(ctx, xb, p, rng, site, yb));
            TU_OK(ctx, sg_dropout_backward(ctx, xf, p, rng, site, yf));
        }
        uint16_t *hb = malloc((size_t)n * sizeof *hb);
        float *hf = malloc((size_t)n * sizeof *hf);
        TU_OK(ctx, sg_tensor_copy_to_host(yb, hb, (size_t)n * sizeof *hb));
        TU_OK(ctx, sg_tensor_copy_to_host(yf, hf, (size_t)n * sizeof *hf));
        unsigned char *mb = malloc((size_t)n), *mf = malloc((size_t)n);
        int64_t bad_bits = 0, first = -1, kept = 0;
        for (int64_t i = 0; i < n; i++) {
            mb[i] = sg_bf16_to_double(hb[i]) != 0.0;
            mf[i] = hf[i] != 0.f;
            kept += mf[i];
            if (hb[i] != sg_double_to_bf16(hf[i])) {
                if (first < 0) first = i;
                bad_bits++;
            }
        }
        const char *dir = pass ? "backward" : "forward";
        TU_CHECK(!memcmp(mb, mf, (size_t)n),
                 "%s p=%g %s: the bf16 keep mask differs from the f32 one", be, (double)p, dir);
        TU_CHECK(bad_bits == 0,
                 "%s p=%g %s: %lld of %lld bf16 outputs are not the f32 output rounded "
                 "(first [%lld]: %#06x, f32 %.9g)", be, (double)p, dir, (long long)bad_bits,
                 (long long)n, (long long)first, first < 0 ? 0u : (unsigned)hb[first],
                 first < 0 ? 0.0 : (double)hf[first]);
        TU_CHECK(p == 0.f || (kept > 0 && kept < n), "%s p=%g %s: %lld of %lld kept", be, (double)p,
                 dir, (long long)kept, (long long)n);
        free(hb), free(hf), free(mb), free(mf);
    }
    sg_tensor *ts[] = {rng, xb, yb, xf, yf};
    for (int i = 0; i < 5; i++) sg_tensor_destroy(ts[i]);
}

static void cpu_bf16_vs_f32(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const float ps[] = {0.f, 0.1f, 0.5f, 0.9f};
    for (size_t k = 0; k < sizeof ps / sizeof *ps; k++) check_bf16_vs_f32(ctx, 1003, ps[k], "cpu");
    sg_ctx_destroy(ctx);
}

/* Dropout is linear in x for a fixed mask: the gradient of sum(y * r) is backward(r). */
typedef struct fd_case {
    sg_ctx *ctx;
    sg_tensor *x, *y, *r, *rng;
    float p;
    uint32_t site;
} fd_case;

static double fd_loss(void *u)
{
    fd_case *c = u;
    TU_OK(c->ctx, sg_dropout_forward(c->ctx, c->x, c->p, c->rng, c->site, c->y));
    return tu_dot(c->y, c->r);
}

static void cpu_gradcheck(float p)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    fd_case c = {ctx, tu_tensor2(ctx, SG_DTYPE_F64, 6, 11, "x"),
                 tu_tensor2(ctx, SG_DTYPE_F64, 6, 11, "y"), tu_tensor2(ctx, SG_DTYPE_F64, 6, 11, "r"),
                 rng_new(ctx, tu_next(), tu_next()), p, (uint32_t)tu_next()};
    sg_tensor *dx = tu_tensor2(ctx, SG_DTYPE_F64, 6, 11, "dx");
    free(tu_random(c.x, -1, 1));
    free(tu_random(c.r, -1, 1));
    TU_OK(ctx, sg_dropout_backward(ctx, c.r, p, c.rng, c.site, dx));
    char what[64];
    snprintf(what, sizeof what, "dropout f64 p=%g: dx", (double)p);
    tu_gradcheck(what, fd_loss, &c, c.x, dx, 0, 1e-6, (tu_tol){1e-8, 1e-6});
    sg_tensor *ts[] = {c.x, c.y, c.r, c.rng, dx};
    for (int i = 0; i < 5; i++) sg_tensor_destroy(ts[i]);
    sg_ctx_destroy(ctx);
}

/* Every argument check, each failing before anything is written; the context stays usable. */
static void cpu_errors(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU), *other = tu_ctx(SG_BACKEND_CPU);
    const int64_t n = 12;
    sg_tensor *x = tu_tensor1(ctx, SG_DTYPE_F32, n, "x"), *y = tu_tensor1(ctx, SG_DTYPE_F32, n, "y");
    sg_tensor *y11 = tu_tensor1(ctx, SG_DTYPE_F32, n - 1, "y11"), *y64 = tu_tensor1(ctx, SG_DTYPE_F64, n, "y64");
    sg_tensor *x_i32 = tu_tensor1(ctx, SG_DTYPE_I32, n, "x_i32");
    sg_tensor *x_bf16 = tu_tensor1(ctx, SG_DTYPE_BF16, n, "x_bf16");
    sg_tensor *y_bf16 = tu_tensor1(ctx, SG_DTYPE_BF16, n, "y_bf16");
    sg_tensor *rng = rng_new(ctx, 1, 2), *rng3 = tu_tensor1(ctx, SG_DTYPE_I32, 3, "rng3");
    sg_tensor *rng_f32 = tu_tensor1(ctx, SG_DTYPE_F32, 4, "rng_f32"), *rng_other = rng_new(other, 1, 2);
    int64_t s22[2] = {2, 2};
    sg_tensor *rng22 = tu_tensor(ctx, SG_DTYPE_I32, 2, s22, "rng22");
    free(tu_random(x, -1, 1));
    free(tu_random(x_bf16, -1, 1));
    tu_poison(y);
    tu_poison(y_bf16);
    const char *fwd = "sg_dropout_forward", *bwd = "sg_dropout_backward";

    TU_FAILS(ctx, sg_dropout_forward(ctx, x, -0.1f, rng, 0, y), SG_ERR_INVALID, "p is -0.1");
    TU_FAILS(ctx, sg_dropout_forward(ctx, x, 1.0f, rng, 0, y), SG_ERR_INVALID, "0 <= p < 1");
    TU_FAILS(ctx, sg_dropout_forward(ctx, x, 1.5f, rng, 0, y), SG_ERR_INVALID, fwd);
    TU_FAILS(ctx, sg_dropout_forward(ctx, x, NAN, rng, 0, y), SG_ERR_INVALID, "p is nan");
    TU_FAILS(ctx, sg_dropout_backward(ctx, x, 1.0f, rng, 0, y), SG_ERR_INVALID, bwd);
    TU_FAILS(ctx, sg_dropout_forward(ctx, x, 0.5f, rng_f32, 0, y), SG_ERR_DTYPE, "'rng'");
    TU_FAILS(ctx, sg_dropout_forward(ctx, x, 0.5f, rng3, 0, y), SG_ERR_SHAPE, "'rng'");
    TU_FAILS(ctx, sg_dropout_backward(ctx, x, 0.5f, rng3, 0, y), SG_ERR_SHAPE, "expected 4 elements");
    TU_FAILS(ctx, sg_dropout_forward(ctx, x, 0.5f, NULL, 0, y), SG_ERR_NULL, "'rng'");
    TU_FAILS(ctx, sg_dropout_forward(ctx, x, 0.5f, rng_other, 0, y), SG_ERR_BACKEND, "another context");
    TU_FAILS(ctx, sg_dropout_forward(ctx, x, 0.5f, rng, 0, y11), SG_ERR_SHAPE, "'y'");
    TU_FAILS(ctx, sg_dropout_backward(ctx, x, 0.5f, rng, 0, y11), SG_ERR_SHAPE, "'dx'");
    TU_FAILS(ctx, sg_dropout_forward(ctx, x, 0.5f, rng, 0, y64), SG_ERR_DTYPE, "'y'");
    /* bf16 is taken, but only with bf16 on the other side. */
    TU_FAILS(ctx, sg_dropout_forward(ctx, x, 0.5f, rng, 0, y_bf16), SG_ERR_DTYPE,
             "sg_dropout_forward: 'x' is (12) f32 but 'y' is (12) bf16");
    TU_FAILS(ctx, sg_dropout_forward(ctx, x_bf16, 0.5f, rng, 0, y), SG_ERR_DTYPE,
             "'x' is (12) bf16 but 'y' is (12) f32");
    TU_FAILS(ctx, sg_dropout_backward(ctx, x_bf16, 0.5f, rng, 0, y64), SG_ERR_DTYPE,
             "sg_dropout_backward: 'dy' is (12) bf16 but 'dx' is (12) f64");
    TU_FAILS(ctx, sg_dropout_backward(ctx, x_i32, 0.5f, rng, 0, y_bf16), SG_ERR_DTYPE,
             "'dy' is i32");
    TU_FAILS(ctx, sg_dropout_forward(ctx, x_i32, 0.5f, rng, 0, y), SG_ERR_DTYPE, "'x'");
    TU_FAILS(ctx, sg_dropout_forward(ctx, NULL, 0.5f, rng, 0, y), SG_ERR_NULL, "'x'");
    TU_FAILS(ctx, sg_dropout_backward(ctx, x, 0.5f, rng, 0, NULL), SG_ERR_NULL, "'dx'");
    TU_FAILS(ctx, sg_rng_advance(ctx, rng_f32), SG_ERR_DTYPE, "sg_rng_advance");
    TU_FAILS(ctx, sg_rng_advance(ctx, rng3), SG_ERR_SHAPE, "sg_rng_advance");
    TU_FAILS(ctx, sg_rng_advance(ctx, rng_other), SG_ERR_BACKEND, "another context");
    TU_CHECK(sg_dropout_forward(NULL, x, 0.5f, rng, 0, y) == SG_ERR_NULL, "NULL ctx accepted");
    TU_CHECK(sg_rng_advance(NULL, rng) == SG_ERR_NULL, "NULL ctx accepted by sg_rng_advance");

    /* Nothing was written; a (2, 2) rng is 4 elements and is fine; the context works. */
    double *yv = tu_get(y);
    int64_t written = 0;
    for (int64_t i = 0; i < n; i++) written += !isnan(yv[i]);
    free(yv);
    yv = tu_get(y_bf16);
    for (int64_t i = 0; i < n; i++) written += !isnan(yv[i]);
    TU_CHECK(written == 0, "%lld elements of y, y_bf16 written by rejected calls",
             (long long)written);
    free(yv);
    uint64_t s, o;
    rng_read(rng, &s, &o);
    TU_CHECK(s == 1 && o == 2, "rng changed by rejected calls: seed %llu offset %llu",
             (unsigned long long)s, (unsigned long long)o);
    TU_OK(ctx, sg_tensor_fill(rng22, 0.0));
    TU_OK(ctx, sg_dropout_forward(ctx, x, 0.5f, rng22, 0, y));
    TU_OK(ctx, sg_dropout_forward(ctx, x, 0.5f, rng, 0, y));
    TU_OK(ctx, sg_dropout_forward(ctx, x_bf16, 0.5f, rng, 0, y_bf16));
    TU_OK(ctx, sg_rng_advance(ctx, rng));
    sg_tensor *ts[] = {x, y, y11, y64, x_i32, x_bf16, y_bf16, rng, rng3, rng_f32, rng_other, rng22};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) sg_tensor_destroy(ts[i]);
    sg_ctx_destroy(other);
    sg_ctx_destroy(ctx);
}

/* ---- capture: a step of {dropout forward, advance}, replayed ---- */

typedef struct drop_step {
    sg_ctx *ctx;
    const sg_tensor *x;
    sg_tensor *y, *rng;
    float p;
    uint32_t site;
} drop_step;

static sg_status drop_step_fn(void *u)
{
    drop_step *s = u;
    SG_TRY(sg_dropout_forward(s->ctx, s->x, s->p, s->rng, s->site, s->y));
    return sg_rng_advance(s->ctx, s->rng);
}

/* Captures the step on ctx (nothing runs during capture), then each replay k must equal the
 * CPU reference at offset offset0 + k and leave the offset at offset0 + k + 1: the kernel
 * reads the state from memory, so the graph draws a fresh mask each replay. ref_ctx: a CPU
 * context (ctx itself on the CPU). */
static void check_capture(sg_ctx *ctx, sg_ctx *ref_ctx, int64_t n, sg_dtype dt)
{
    char be[48];
    snprintf(be, sizeof be, "%s %s", sg_backend_name(ctx->backend), sg_dtype_name(dt));
    uint64_t seed = tu_next(), offset0 = tu_next() >> 1;
    sg_tensor *rng = rng_new(ctx, seed, 0), *rng_ref = rng_new(ref_ctx, seed, 0);
    sg_tensor *x = tu_tensor1(ctx, dt, n, "x"), *y = tu_tensor1(ctx, dt, n, "y");
    sg_tensor *x_ref = tu_tensor1(ref_ctx, dt, n, "x_ref");
    sg_tensor *y_ref = tu_tensor1(ref_ctx, dt, n, "y_ref");
    double *xv = tu_random(x, -1, 1);
    tu_set(x_ref, xv);
    free(xv);
    tu_poison(y);
    drop_step s = {ctx, x, y, rng, 0.25f, (uint32_t)tu_next()};
    sg_graph_options o = sg_graph_options_default();
    o.name = "dropout-step";
    o.warmup = 0;
    sg_graph *g = NULL;
    TU_OK(ctx, sg_graph_capture(ctx, drop_step_fn, &s, &o, &g));
    if (!sg_graphs_disabled()) {
        sg_graph_stats st;
        TU_OK(ctx, sg_graph_get_stats(g, &st));
        TU_CHECK(st.nodes == 2, "%s: the graph holds %d nodes, expected 2 (dropout, advance)", be,
                 st.nodes);
        uint64_t so, oo;
        rng_read(rng, &so, &oo);
        TU_CHECK(oo == 0, "%s: capture ran the step (offset %llu)", be, (unsigned long long)oo);
    }
    rng_write(rng, seed, offset0);
    for (int k = 0; k < 3; k++) {
        tu_poison(y);
        TU_OK(ctx, sg_graph_replay(g));
        rng_write(rng_ref, seed, offset0 + (uint64_t)k);
        TU_OK(ref_ctx, sg_dropout_forward(ref_ctx, x_ref, s.p, rng_ref, s.site, y_ref));
        char what[96];
        snprintf(what, sizeof what, "%s: replay %d against the reference at offset + %d", be, k, k);
        expect_bitwise(what, y, y_ref);
        uint64_t so, oo;
        rng_read(rng, &so, &oo);
        TU_CHECK(so == seed && oo == offset0 + (uint64_t)k + 1, "%s: after replay %d the offset is "
                 "%llu, expected %llu", be, k, (unsigned long long)oo,
                 (unsigned long long)(offset0 + k + 1));
    }
    sg_graph_destroy(g);
    sg_tensor *ts[] = {rng, rng_ref, x, y, x_ref, y_ref};
    for (int i = 0; i < 6; i++) sg_tensor_destroy(ts[i]);
}

static void cpu_tests(void)
{
    cpu_philox_kat();
    const float ps[4] = {0.1f, 0.5f, 0.9f, 0.001f};
    for (int i = 0; i < 4; i++) {
        cpu_mapping(SG_DTYPE_F32, ps[i]);
        cpu_mapping(SG_DTYPE_F64, ps[i]);
        cpu_mapping(SG_DTYPE_BF16, ps[i]);
        cpu_keep_fraction(ps[i]);
    }
    cpu_keep_fraction(0.25f);
    cpu_mask_changes();
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    check_advance(ctx, "cpu");
    check_capture(ctx, ctx, 1001, SG_DTYPE_F32);
    check_capture(ctx, ctx, 1001, SG_DTYPE_BF16);
    sg_ctx_destroy(ctx);
    cpu_backward(SG_DTYPE_F32);
    cpu_backward(SG_DTYPE_F64);
    cpu_backward(SG_DTYPE_BF16);
    cpu_bf16_vs_f32();
    cpu_gradcheck(0.3f);
    cpu_gradcheck(0.8f);
    cpu_errors();
}

/* ---- gpu ---- */

/* Forward and backward of n elements of dtype dt at p on the GPU against the CPU reference
 * (same dtype), bit for bit, outputs poisoned first, one launch each. misaligned: the GPU
 * tensors are views at element 1 (the kernel's element-by-element path). */
static void gpu_run(sg_ctx *gpu, sg_ctx *cpu, int64_t n, float p, int misaligned, sg_dtype dt)
{
    uint64_t seed = tu_next(), offset = tu_next();
    uint32_t site = (uint32_t)tu_next();
    sg_tensor *rg = rng_new(gpu, seed, offset), *rc = rng_new(cpu, seed, offset);
    const char *names[4] = {"x", "y", "dy", "dx"};
    sg_tensor *base[4] = {NULL}, *tg[4], *tc[4];
    for (int j = 0; j < 4; j++) {
        if (misaligned) {
            base[j] = tu_tensor1(gpu, dt, n + 1, "base");
            TU_OK(gpu, sg_tensor_view(base[j], 1, 1, &n, names[j], &tg[j]));
        } else {
            tg[j] = tu_tensor1(gpu, dt, n, names[j]);
        }
        tc[j] = tu_tensor1(cpu, dt, n, names[j]);
    }
    for (int j = 0; j < 4; j += 2) { /* x, dy: the same values (of dt) on both sides */
        double *v = tu_random(tg[j], -2, 2);
        tu_set(tc[j], v);
        free(v);
    }
    tu_poison(tg[1]), tu_poison(tg[3]);
    char what[160], tag[96];
    snprintf(tag, sizeof tag, "gpu %s n=%lld p=%g%s", sg_dtype_name(dt), (long long)n, (double)p,
             misaligned ? " misaligned" : "");
    uint64_t before = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_dropout_forward(gpu, tg[0], p, rg, site, tg[1]));
    uint64_t launches = sg_ctx_launch_count(gpu) - before;
    TU_CHECK(launches == 1, "%s: %llu launches for the forward, expected 1", tag,
             (unsigned long long)launches);
    before = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_dropout_backward(gpu, tg[2], p, rg, site, tg[3]));
    launches = sg_ctx_launch_count(gpu) - before;
    TU_CHECK(launches == 1, "%s: %llu launches for the backward, expected 1", tag,
             (unsigned long long)launches);
    TU_OK(cpu, sg_dropout_forward(cpu, tc[0], p, rc, site, tc[1]));
    TU_OK(cpu, sg_dropout_backward(cpu, tc[2], p, rc, site, tc[3]));
    snprintf(what, sizeof what, "%s: y", tag);
    expect_bitwise(what, tg[1], tc[1]);
    snprintf(what, sizeof what, "%s: dx", tag);
    expect_bitwise(what, tg[3], tc[3]);
    /* In place (x overwritten by y) gives the same bits. */
    TU_OK(gpu, sg_dropout_forward(gpu, tg[0], p, rg, site, tg[0]));
    snprintf(what, sizeof what, "%s: in place", tag);
    expect_bitwise(what, tg[0], tc[1]);
    /* After an advance on both sides, they still agree (and the state was read on device). */
    TU_OK(gpu, sg_rng_advance(gpu, rg));
    TU_OK(cpu, sg_rng_advance(cpu, rc));
    TU_OK(gpu, sg_dropout_backward(gpu, tg[2], p, rg, site, tg[3]));
    TU_OK(cpu, sg_dropout_backward(cpu, tc[2], p, rc, site, tc[3]));
    snprintf(what, sizeof what, "%s: dx after sg_rng_advance", tag);
    expect_bitwise(what, tg[3], tc[3]);
    for (int j = 0; j < 4; j++) {
        sg_tensor_destroy(tg[j]);
        sg_tensor_destroy(base[j]);
        sg_tensor_destroy(tc[j]);
    }
    sg_tensor_destroy(rg), sg_tensor_destroy(rc);
}

/* The checks CUDA can make without reading device memory. */
static void gpu_errors(sg_ctx *gpu, sg_ctx *cpu)
{
    const int64_t n = 8;
    sg_tensor *x = tu_tensor1(gpu, SG_DTYPE_F32, n, "x"), *y = tu_tensor1(gpu, SG_DTYPE_F32, n, "y");
    sg_tensor *x_bf16 = tu_tensor1(gpu, SG_DTYPE_BF16, n, "x_bf16");
    sg_tensor *y_bf16 = tu_tensor1(gpu, SG_DTYPE_BF16, n, "y_bf16");
    sg_tensor *rng = rng_new(gpu, 3, 4), *rng_cpu = rng_new(cpu, 3, 4);
    sg_tensor *rng5 = tu_tensor1(gpu, SG_DTYPE_I32, 5, "rng5");
    /* f32 and bf16 do not mix. */
    TU_FAILS(gpu, sg_dropout_forward(gpu, x_bf16, 0.5f, rng, 0, y), SG_ERR_DTYPE, "'x'");
    TU_FAILS(gpu, sg_dropout_forward(gpu, x, 0.5f, rng, 0, y_bf16), SG_ERR_DTYPE,
             "'x' is (8) f32 but 'y' is (8) bf16");
    TU_FAILS(gpu, sg_dropout_backward(gpu, x, 0.5f, rng, 0, y_bf16), SG_ERR_DTYPE,
             "sg_dropout_backward: 'dy' is (8) f32 but 'dx' is (8) bf16");
    TU_FAILS(gpu, sg_dropout_forward(gpu, x, 0.5f, rng_cpu, 0, y), SG_ERR_BACKEND, "another context");
    TU_FAILS(gpu, sg_dropout_forward(gpu, x, 1.0f, rng, 0, y), SG_ERR_INVALID, "0 <= p < 1");
    TU_FAILS(gpu, sg_dropout_backward(gpu, x, 0.5f, rng5, 0, y), SG_ERR_SHAPE, "'rng'");
    TU_FAILS(gpu, sg_rng_advance(gpu, rng5), SG_ERR_SHAPE, "'rng'");
    uint64_t s, o;
    rng_read(rng, &s, &o);
    TU_CHECK(s == 3 && o == 4, "gpu: rng changed by rejected calls");
    TU_OK(gpu, sg_dropout_forward(gpu, x, 0.5f, rng, 0, y)); /* the context still works */
    TU_OK(gpu, sg_tensor_fill(x_bf16, 1.0));
    TU_OK(gpu, sg_dropout_forward(gpu, x_bf16, 0.5f, rng, 0, y_bf16));
    sg_tensor *ts[] = {x, y, x_bf16, y_bf16, rng, rng_cpu, rng5};
    for (int i = 0; i < 7; i++) sg_tensor_destroy(ts[i]);
}

static void gpu_tests(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    /* Single elements, the 4-element tail (n % 4 = 1..3), several blocks, and more groups
     * than threads of the grid (the grid-stride loop); f32, then bf16. */
    const int64_t ns[] = {1, 3, 4, 5, 1000, 4099, (1 << 20) + 3, (1 << 23) + 2};
    const float ps[] = {0.f, 0.1f, 0.5f, 0.9f};
    const sg_dtype dts[] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        for (size_t i = 0; i < sizeof ns / sizeof *ns; i++)
            for (size_t k = 0; k < sizeof ps / sizeof *ps; k++)
                gpu_run(gpu, cpu, ns[i], ps[k], 0, dts[d]);
        gpu_run(gpu, cpu, 1001, 0.5f, 1, dts[d]);
        gpu_run(gpu, cpu, 1001, 0.f, 1, dts[d]);
    }
    /* bf16 against f32 on the GPU itself: the same mask, values rounded once. */
    for (size_t k = 0; k < sizeof ps / sizeof *ps; k++) {
        check_bf16_vs_f32(gpu, 4099, ps[k], "gpu");
        check_bf16_vs_f32(gpu, (1 << 20) + 3, ps[k], "gpu");
    }
    check_advance(gpu, "gpu");
    check_capture(gpu, cpu, (1 << 16) + 1, SG_DTYPE_F32);
    check_capture(gpu, cpu, (1 << 16) + 1, SG_DTYPE_BF16);
    gpu_errors(gpu, cpu);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_dropout");
    if (!strcmp(mode, "gpu")) gpu_tests();
    else cpu_tests();
    return tu_finish("test_dropout");
}
