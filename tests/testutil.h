/* testutil.h: what every test shares: a seeded RNG (seed printed, SG_TEST_SEED to replay),
 * contexts that skip (exit 77) when no GPU is there, random fills, poisoning, the tolerance
 * rule |got - ref| <= atol + rtol * |ref| by dtype, and float64 finite differences.
 * Header-only: each test is one .c file that includes it. */
#ifndef SG_TESTUTIL_H
#define SG_TESTUTIL_H

#include "core/core.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TU_SKIP 77

static int tu_failures;

#define TU_CHECK(cond, ...)                                                                   \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            tu_failures++;                                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                   \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, "\n");                                                            \
        }                                                                                     \
    } while (0)

/* A call that must succeed; on failure prints the context's message and exits the test. */
#define TU_OK(ctx, call)                                                                      \
    do {                                                                                      \
        sg_status tu_st_ = (call);                                                            \
        if (tu_st_ != SG_OK) {                                                                \
            fprintf(stderr, "FAIL %s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call,    \
                    sg_status_name(tu_st_), sg_ctx_last_error(ctx));                          \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

/* A call that must fail with `want`, with a message containing `needle`. */
#define TU_FAILS(ctx, call, want, needle)                                                     \
    do {                                                                                      \
        sg_status tu_st_ = (call);                                                            \
        TU_CHECK(tu_st_ == (want), "%s returned %s, expected %s (message: %s)", #call,        \
                 sg_status_name(tu_st_), sg_status_name(want), sg_ctx_last_error(ctx));        \
        TU_CHECK(strstr(sg_ctx_last_error(ctx), (needle)) != NULL,                            \
                 "message of %s lacks '%s': %s", #call, (needle), sg_ctx_last_error(ctx));    \
    } while (0)

static inline int tu_finish(const char *name)
{
    if (tu_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, tu_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

/* ---- RNG: splitmix64, seeded from SG_TEST_SEED or the clock, printed for replay ---- */

static uint64_t tu_state;

static inline uint64_t tu_next(void)
{
    uint64_t z = (tu_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void tu_seed(const char *test)
{
    const char *env = getenv("SG_TEST_SEED");
    uint64_t s = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    tu_state = s;
    printf("%s: seed %llu (SG_TEST_SEED=%llu to replay)\n", test, (unsigned long long)s,
           (unsigned long long)s);
}

static inline double tu_uniform(double lo, double hi)
{
    return lo + (hi - lo) * ((tu_next() >> 11) * (1.0 / 9007199254740992.0));
}

static inline int tu_randint(int lo, int hi) /* inclusive */
{
    return lo + (int)(tu_next() % (uint64_t)(hi - lo + 1));
}

/* N(0,1) by Box-Muller from the test's generator. */
static inline double tu_normal(void)
{
    double u = tu_uniform(1e-12, 1), v = tu_uniform(0, 1);
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* Under compute-sanitizer's racecheck (gpu-check.sh sets SG_SANITIZER): cuBLAS's Hopper bf16
 * GEMM kernels (nvjet_sm90_*) and cuDNN's implicit-GEMM ones (sm90_xmma_*) use asynchronous
 * barriers that racecheck reports as hazards (2026-11-24: 5 in test_conv, all in those two,
 * none in stepgraph's kernels), and excluding those kernels by name made them fail to run;
 * tests leave their library-run cases out of racecheck runs only (memcheck and the plain runs
 * keep them). */
static inline bool tu_racecheck(void)
{
    const char *s = getenv("SG_SANITIZER");
    return s && !strcmp(s, "racecheck");
}

/* ---- contexts ---- */

/* Skips the test run (exit TU_SKIP) where there is no usable GPU. */
static inline void tu_need_gpu(void)
{
    if (sg_cuda_available()) return;
    printf("SKIP: no CUDA device (or a CPU-only build): GPU tests need a GPU; run "
           "scripts/gpu-check.sh on a machine with one\n");
    exit(TU_SKIP);
}

static inline sg_ctx *tu_ctx(sg_backend b)
{
    sg_ctx_options o = sg_ctx_options_default();
    o.backend = b;
    sg_ctx *ctx = NULL;
    if (b == SG_BACKEND_CUDA) tu_need_gpu();
    if (sg_ctx_create(&o, &ctx) != SG_OK) {
        fprintf(stderr, "FAIL: sg_ctx_create: %s\n", sg_ctx_last_error(NULL));
        exit(1);
    }
    return ctx;
}

/* sg_ctx_create of a CUDA context with var=value in the environment while it is made (the
 * switches read at creation: STEPGRAPH_WGRAD, STEPGRAPH_TF32), unset again after; value NULL:
 * made with var unset. Returns the status; *out the context or NULL. */
static inline sg_status tu_ctx_create_env(const char *var, const char *value, sg_ctx **out)
{
    sg_ctx_options o = sg_ctx_options_default();
    o.backend = SG_BACKEND_CUDA;
    *out = NULL;
    if (value) TU_CHECK(setenv(var, value, 1) == 0, "setenv %s", var);
    else TU_CHECK(unsetenv(var) == 0, "unsetenv %s", var);
    const sg_status st = sg_ctx_create(&o, out);
    TU_CHECK(unsetenv(var) == 0, "unsetenv %s", var);
    return st;
}

/* The same, made or the test run fails (skipped without a GPU). */
static inline sg_ctx *tu_ctx_env(const char *var, const char *value)
{
    tu_need_gpu();
    sg_ctx *ctx = NULL;
    if (tu_ctx_create_env(var, value, &ctx) != SG_OK) {
        fprintf(stderr, "FAIL: sg_ctx_create with %s=%s: %s\n", var, value ? value : "(unset)",
                sg_ctx_last_error(NULL));
        exit(1);
    }
    return ctx;
}

/* A built-in model by name (seed 1) and an AdamW optimizer for it. */
static inline void tu_model_optim(sg_ctx *ctx, const char *name, sg_model **m, sg_optim **o)
{
    TU_OK(ctx, sg_model_create(ctx, name, 1, m));
    TU_OK(ctx, sg_optim_create(ctx, *m, SG_OPTIM_ADAMW, o));
}

/* A model, its AdamW optimizer and a trainer: the side of a comparison of two trainings. */
typedef struct tu_side {
    sg_model *m;
    sg_optim *o;
    sg_trainer *t;
} tu_side;

static inline tu_side tu_side_make(sg_ctx *ctx, const char *name, uint64_t seed, const sg_model_options *mo,
                                   const sg_trainer_options *to)
{
    tu_side s = {0};
    TU_OK(ctx, sg_model_create_ex(ctx, name, seed, mo, &s.m));
    TU_OK(ctx, sg_optim_create(ctx, s.m, SG_OPTIM_ADAMW, &s.o));
    TU_OK(ctx, sg_trainer_create(s.m, s.o, to, &s.t));
    return s;
}

static inline void tu_side_drop(tu_side *s)
{
    sg_trainer_destroy(s->t);
    sg_optim_destroy(s->o);
    sg_model_destroy(s->m);
}

/* ---- tensors: host staging in double, so tests read every dtype the same way ---- */

static inline sg_tensor *tu_tensor(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape,
                            const char *name)
{
    sg_tensor *t = NULL;
    TU_OK(ctx, sg_tensor_create(ctx, dt, ndim, shape, name, &t));
    return t;
}

static inline sg_tensor *tu_tensor2(sg_ctx *ctx, sg_dtype dt, int64_t r, int64_t c, const char *name)
{
    int64_t s[2] = {r, c};
    return tu_tensor(ctx, dt, 2, s, name);
}

static inline sg_tensor *tu_tensor1(sg_ctx *ctx, sg_dtype dt, int64_t n, const char *name)
{
    return tu_tensor(ctx, dt, 1, &n, name);
}

/* A tensor of `shape` and dtype dt, as a view one element into a larger buffer when `odd` (its
 * address is then 4 (f32) or 2 (bf16) mod 16: vectorised kernels must take their scalar path).
 * *base: the buffer (destroy it after the view), or NULL. */
static inline sg_tensor *tu_maybe_view(sg_ctx *ctx, sg_dtype dt, int ndim, const int64_t *shape, bool odd,
                                       const char *name, sg_tensor **base)
{
    *base = NULL;
    if (!odd) return tu_tensor(ctx, dt, ndim, shape, name);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    *base = tu_tensor1(ctx, dt, n + 1, "base");
    sg_tensor *v = NULL;
    TU_OK(ctx, sg_tensor_view(*base, 1, ndim, shape, name, &v));
    return v;
}

/* Writes host doubles into t (any dtype, any backend). */
static inline void tu_set(sg_tensor *t, const double *v)
{
    size_t n = (size_t)t->numel, es = sg_dtype_size(t->dtype);
    void *buf = malloc(n * es);
    sg_tensor h = *t;
    h.data = buf;
    for (size_t i = 0; i < n; i++) sg_st(&h, (int64_t)i, v[i]);
    TU_OK(t->ctx, sg_tensor_copy_from_host(t, buf, n * es));
    TU_OK(t->ctx, sg_ctx_sync(t->ctx));
    free(buf);
}

/* Reads t into host doubles (caller frees). */
static inline double *tu_get(const sg_tensor *t)
{
    size_t n = (size_t)t->numel, es = sg_dtype_size(t->dtype);
    void *buf = malloc(n * es);
    double *v = malloc(n * sizeof *v);
    TU_OK(t->ctx, sg_tensor_copy_to_host(t, buf, n * es));
    sg_tensor h = *t;
    h.data = buf;
    for (size_t i = 0; i < n; i++) v[i] = sg_ld(&h, (int64_t)i);
    free(buf);
    return v;
}

/* Fills t with uniform values in [lo, hi); returns the host copy (caller frees). */
static inline double *tu_random(sg_tensor *t, double lo, double hi)
{
    double *v = malloc((size_t)t->numel * sizeof *v);
    for (int64_t i = 0; i < t->numel; i++) v[i] = tu_uniform(lo, hi);
    tu_set(t, v);
    return v;
}

/* Poisons an output before a kernel runs: NaN for floats, a sentinel for ints, so an
 * element the kernel forgot to write fails the comparison. */
static inline void tu_poison(sg_tensor *t)
{
    TU_OK(t->ctx, sg_tensor_fill(t, t->dtype == SG_DTYPE_I32 ? -123456789.0 : NAN));
}

/* Elements of t that are NaN: a poisoned output's elements left unwritten. */
static inline int64_t tu_count_nan(const sg_tensor *t)
{
    double *v = tu_get(t);
    int64_t n = 0;
    for (int64_t i = 0; i < t->numel; i++) n += isnan(v[i]);
    free(v);
    return n;
}

/* Copies a tensor's values into a new tensor of another context (and dtype). */
static inline sg_tensor *tu_clone_to(sg_ctx *ctx, const sg_tensor *src, sg_dtype dt)
{
    sg_tensor *t = tu_tensor(ctx, dt, src->ndim, src->shape, src->name);
    double *v = tu_get(src);
    tu_set(t, v);
    free(v);
    return t;
}

/* ---- tolerances: |got - ref| <= atol + rtol * |ref|, by dtype ---- */

typedef struct tu_tol {
    double atol, rtol;
} tu_tol;

static inline tu_tol tu_tol_for(sg_dtype dt)
{
    switch (dt) {
    case SG_DTYPE_F64: return (tu_tol){1e-12, 1e-10};
    case SG_DTYPE_F32: return (tu_tol){1e-5, 1e-4};
    case SG_DTYPE_BF16: return (tu_tol){1e-2, 1.6e-2};
    case SG_DTYPE_I32: return (tu_tol){0, 0};
    }
    return (tu_tol){0, 0};
}

/* Compares n values; prints the worst element on failure. NaN never passes. */
static inline int tu_close(const char *what, const double *got, const double *ref, int64_t n, tu_tol tol)
{
    int64_t worst = -1, bad = 0;
    double worst_excess = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double lim = tol.atol + tol.rtol * fabs(ref[i]);
        double err = fabs(got[i] - ref[i]);
        double excess = isnan(err) ? INFINITY : err - lim;
        if (excess > 0) bad++;
        if (excess > worst_excess) {
            worst_excess = excess;
            worst = i;
        }
    }
    if (bad) {
        tu_failures++;
        fprintf(stderr,
                "FAIL %s: %lld of %lld elements outside atol %.1e rtol %.1e; worst [%lld] got "
                "%.9g ref %.9g\n",
                what, (long long)bad, (long long)n, tol.atol, tol.rtol, (long long)worst,
                got[worst], ref[worst]);
        return 0;
    }
    return 1;
}

/* Compares two tensors (possibly of different contexts) under tol. */
static inline int tu_close_tensors(const char *what, const sg_tensor *got, const sg_tensor *ref, tu_tol tol)
{
    if (got->numel != ref->numel) {
        tu_failures++;
        fprintf(stderr, "FAIL %s: %lld vs %lld elements\n", what, (long long)got->numel,
                (long long)ref->numel);
        return 0;
    }
    double *g = tu_get(got), *r = tu_get(ref);
    int ok = tu_close(what, g, r, got->numel, tol);
    free(g);
    free(r);
    return ok;
}

/* ---- small conveniences shared by op tests ---- */

/* Tensors of one case, destroyed together by tu_free_live. */
static sg_tensor *tu_live[64];
static int tu_n_live;

static inline sg_tensor *tu_keep(sg_tensor *t)
{
    SG_ASSERT(tu_n_live < 64);
    return tu_live[tu_n_live++] = t;
}

static inline void tu_free_live(void)
{
    while (tu_n_live) sg_tensor_destroy(tu_live[--tu_n_live]);
}

/* The tensor's bytes, any dtype (caller frees). */
static inline void *tu_raw(const sg_tensor *t)
{
    void *v = malloc(sg_tensor_nbytes(t));
    TU_OK(t->ctx, sg_tensor_copy_to_host(t, v, sg_tensor_nbytes(t)));
    return v;
}

/* Does t hold exactly the bytes at b? */
static inline bool tu_same_bytes(const sg_tensor *t, const void *b)
{
    void *v = tu_raw(t);
    bool same = memcmp(v, b, sg_tensor_nbytes(t)) == 0;
    free(v);
    return same;
}

/* Are a and b (same size) equal bit for bit? Reports a mismatch naming what and the step. */
static inline bool tu_same_bits(const sg_tensor *a, const sg_tensor *b, const char *what, int step)
{
    size_t n = sg_tensor_nbytes(a);
    void *x = malloc(n), *y = malloc(n);
    TU_OK(a->ctx, sg_tensor_copy_to_host(a, x, n));
    TU_OK(b->ctx, sg_tensor_copy_to_host(b, y, n));
    bool same = memcmp(x, y, n) == 0;
    TU_CHECK(same, "%s: '%s' and '%s' differ after step %d", what, a->name, b->name, step);
    free(x), free(y);
    return same;
}

/* A whole file into malloc'd memory (one spare byte at the end; caller frees); a file that
 * cannot be read fails the test run. */
/* Writes len bytes to path (a test's input file); exits the test when it cannot. */
static inline void tu_file_write(const char *path, const unsigned char *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(b, 1, len, f) != len) || fclose(f) != 0) {
        fprintf(stderr, "FAIL: writing %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

/* A new temporary directory /tmp/sg_<name>_XXXXXX, its path into dir (n bytes); exits the test
 * when it cannot be made. */
static inline void tu_tempdir(char *dir, size_t n, const char *name)
{
    snprintf(dir, n, "/tmp/sg_%s_XXXXXX", name);
    if (!mkdtemp(dir)) {
        fprintf(stderr, "FAIL: mkdtemp %s: %s\n", dir, strerror(errno));
        exit(1);
    }
}

static inline unsigned char *tu_file_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "FAIL: cannot open %s: %s\n", path, strerror(errno));
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) exit(1);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static inline void tu_destroy_all(sg_tensor **ts, size_t n)
{
    for (size_t i = 0; i < n; i++) sg_tensor_destroy(ts[i]);
}

/* Compares t's values with ref (n host doubles). */
static inline void tu_close_vals(const char *what, const sg_tensor *t, const double *ref, int64_t n,
                       tu_tol tol)
{
    double *got = tu_get(t);
    tu_close(what, got, ref, n, tol);
    free(got);
}

/* Compares two tensors under the label "<what> <name>". */
static inline void tu_close_named(const char *what, const char *name, const sg_tensor *got,
                        const sg_tensor *ref, tu_tol tol)
{
    char w[320];
    snprintf(w, sizeof w, "%s %s", what, name);
    tu_close_tensors(w, got, ref, tol);
}

/* ---- finite differences in float64 ----
 * loss_fn recomputes a scalar loss from the current contents of the f64 input tensors.
 * For each element of `in` (or `max_checks` sampled ones), the central difference with step
 * h is compared against grad (an f64 tensor holding the analytic gradient). */
typedef double (*tu_loss_fn)(void *user);

static inline int tu_gradcheck(const char *what, tu_loss_fn f, void *user, sg_tensor *in,
                        const sg_tensor *grad, int max_checks, double h, tu_tol tol)
{
    SG_ASSERT(in->dtype == SG_DTYPE_F64 && grad->dtype == SG_DTYPE_F64);
    SG_ASSERT(in->ctx->backend == SG_BACKEND_CPU);
    int64_t n = in->numel;
    int checks = (max_checks <= 0 || max_checks > n) ? (int)n : max_checks;
    double *num = malloc((size_t)checks * sizeof *num), *ana = malloc((size_t)checks * sizeof *ana);
    double *x = in->data;
    const double *g = grad->data;
    for (int c = 0; c < checks; c++) {
        int64_t i = checks == n ? c : (int64_t)(tu_next() % (uint64_t)n);
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = f(user);
        x[i] = x0 - h;
        double lm = f(user);
        x[i] = x0;
        num[c] = (lp - lm) / (2 * h);
        ana[c] = g[i];
    }
    char label[160];
    snprintf(label, sizeof label, "%s: analytic vs finite-difference gradient", what);
    int ok = tu_close(label, ana, num, checks, tol);
    free(num);
    free(ana);
    return ok;
}

/* sum_i a[i] * r[i]: a random linear functional, so dL/da = r is dense and non-trivial. */
static inline double tu_dot(const sg_tensor *a, const sg_tensor *r)
{
    double s = 0;
    for (int64_t i = 0; i < a->numel; i++) s += sg_ld(a, i) * sg_ld(r, i);
    return s;
}

/* The context still trains after what came before (refusals, say): one eager AdamW step of m,
 * which it takes, with a finite positive loss (`what` names the moment in a failure). */
/* A test's start: seeds it, and picks the backend from argv[1] ("gpu": CUDA, else the CPU);
 * false when the GPU was asked for and there is none (the test skips). */
static inline bool tu_start(const char *test, int argc, char **argv, sg_backend *be)
{
    tu_seed(test);
    bool gpu = argc > 1 && !strcmp(argv[1], "gpu");
    *be = gpu ? SG_BACKEND_CUDA : SG_BACKEND_CPU;
    return !gpu || sg_cuda_available();
}

/* Output size of a convolution or pool along one side. */
static inline int64_t tu_osz(int64_t n, int k, int stride, int pad) { return (n + 2 * pad - k) / stride + 1; }

/* conv k x k (padding k/2, no bias) then batch norm (+ act), "<c>" and "<n>" in b's scope; out:
 * the output's (H, W, C); m[0], m[1] the two modules. */
static inline void tu_conv_bn(sg_ctx *ctx, sg_builder *b, const char *c, const char *n, const int64_t in[3],
                              int64_t Cout, int k, int stride, int groups, sg_activation act, int64_t out[3],
                              sg_module **m)
{
    int pad = k / 2;
    out[0] = tu_osz(in[0], k, stride, pad), out[1] = tu_osz(in[1], k, stride, pad), out[2] = Cout;
    TU_OK(ctx, sg_module_conv2d(b, c, in[0], in[1], in[2], Cout, k, stride, pad, groups, 0, &m[0]));
    TU_OK(ctx, sg_module_batchnorm2d(b, n, out[0], out[1], Cout, act, &m[1]));
}

/* n images (H, W, C) N(0,1) and labels uniform over `classes`, drawn from `seed` (the same
 * data for the same seed, the test's own stream untouched), as a data set. */
static inline sg_dataset *tu_images(sg_ctx *ctx, int64_t n, int64_t H, int64_t W, int64_t C, int64_t classes,
                                    uint64_t seed)
{
    int64_t px = H * W * C;
    float *x = malloc((size_t)(n * px) * 4);
    int32_t *y = malloc((size_t)n * 4);
    uint64_t keep = tu_state;
    tu_state = seed;
    for (int64_t i = 0; i < n * px; i++) x[i] = (float)tu_normal();
    for (int64_t i = 0; i < n; i++) y[i] = (int32_t)tu_randint(0, (int)classes - 1);
    tu_state = keep;
    sg_tensor *tx, *ty;
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 4, (int64_t[]){n, H, W, C}, "x", &tx));
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_I32, 1, &n, "y", &ty));
    TU_OK(ctx, sg_tensor_copy_from_host(tx, x, (size_t)(n * px) * 4));
    TU_OK(ctx, sg_tensor_copy_from_host(ty, y, (size_t)n * 4));
    free(x), free(y);
    sg_dataset *d;
    TU_OK(ctx, sg_dataset_create(ctx, tx, ty, &d));
    return d;
}

static inline void tu_trains_a_step(sg_ctx *ctx, sg_model *m, const char *what)
{
    sg_optim *o = NULL;
    sg_trainer *t = NULL;
    sg_trainer_options to = sg_trainer_options_default();
    float l = NAN;
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
    TU_OK(ctx, sg_trainer_step(t, 0));
    TU_OK(ctx, sg_model_loss_read(m, &l));
    TU_CHECK(isfinite(l) && l > 0, "loss %g %s", l, what);
    sg_trainer_destroy(t), sg_optim_destroy(o), sg_model_destroy(m);
}

#endif /* SG_TESTUTIL_H */
