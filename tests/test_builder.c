/* test_builder.c: models a user builds from the public API: a module of the user's own
 * (examples/rmsnorm.c: its own CPU code and CUDA kernels) between built-in modules, trained
 * under every scope and checked bit for bit against eager; hierarchical parameter names and
 * a checkpoint of them; a host-fed data set against the device gather of the same batches; an
 * MSE model over an .npy data set; sg_verify on the user's model (every scope, a nudged
 * parameter named); buffers (a module's untrained state: named, moved by training and not by
 * evaluation, the same under every scope, checkpointed; CPU); RMSNorm's backward against finite
 * differences (CPU); and the builder's refusals. Modes: cpu, gpu (the CUDA kernels; skipped without a GPU). */
#define _GNU_SOURCE /* memmem */
#include "testutil.h"
#include "train/model.h"
#include "../examples/rmsnorm.h"

#include <unistd.h>

enum { IN = 12, HID = 24, OUT = 5 };

typedef struct net {
    sg_model *m;
    sg_optim *o;
    sg_trainer *t;
} net;

/* x (n, IN) F32 N(0,1) and class targets (n) in 0..OUT-1, fresh from seed. */
static sg_dataset *samples(sg_ctx *ctx, int64_t n, uint64_t seed, float **xh, int32_t **yh)
{
    sg_rng r = {seed};
    float *x = malloc((size_t)(n * IN) * sizeof *x);
    int32_t *y = malloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n * IN; i++) x[i] = (float)sg_rng_normal(&r);
    for (int64_t i = 0; i < n; i++) y[i] = (int32_t)(sg_rng_next(&r) % OUT);
    sg_tensor *tx, *ty;
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){n, IN}, "x", &tx));
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_I32, 1, &n, "y", &ty));
    TU_OK(ctx, sg_tensor_copy_from_host(tx, x, (size_t)(n * IN) * 4));
    TU_OK(ctx, sg_tensor_copy_from_host(ty, y, (size_t)n * 4));
    sg_dataset *d;
    TU_OK(ctx, sg_dataset_create(ctx, tx, ty, &d));
    if (xh) *xh = x;
    else free(x);
    if (yh) *yh = y;
    else free(y);
    return d;
}

/* enc.fc (Linear IN->HID) -> enc.norm (the user's RMSNorm) -> act (GELU) -> head (Linear HID->OUT). */
static sg_model *build(sg_ctx *ctx, int64_t B, sg_dataset *d, uint64_t seed)
{
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = B;
    sg_builder *b;
    TU_OK(ctx, sg_builder_create(ctx, "rms-net", &bo, &b));
    sg_module *l[4], *root;
    TU_OK(ctx, sg_builder_push_scope(b, "enc"));
    TU_OK(ctx, sg_module_linear(b, "fc", IN, HID, 1, SG_ACT_NONE, &l[0]));
    TU_OK(ctx, rmsnorm_create(b, "norm", HID, &l[1]));
    sg_builder_pop_scope(b);
    TU_OK(ctx, sg_module_activation(b, "act", SG_ACT_GELU, HID, &l[2]));
    TU_OK(ctx, sg_module_linear(b, "head", HID, OUT, 1, SG_ACT_NONE, &l[3]));
    TU_OK(ctx, sg_module_sequential(b, "net", l, 4, &root));
    sg_model *m;
    TU_OK(ctx, sg_builder_finish(b, root, SG_LOSS_SOFTMAX_XENT, d, seed, &m));
    return m;
}

static net make(sg_ctx *ctx, int64_t B, sg_dataset *d, uint64_t seed, sg_scope scope)
{
    net n;
    n.m = build(ctx, B, d, seed);
    TU_OK(ctx, sg_optim_create(ctx, n.m, SG_OPTIM_ADAMW, &n.o));
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = scope;
    to.warmup = 2;
    TU_OK(ctx, sg_trainer_create(n.m, n.o, &to, &n.t));
    return n;
}

static void drop(net *n)
{
    sg_trainer_destroy(n->t);
    sg_optim_destroy(n->o);
    sg_model_destroy(n->m);
}

/* Every scope trains the user's model exactly as eager does: same parameters and loss bits
 * after each step (deterministic kernels, the same work in the same order). The samples wrap
 * around the data set's end (n not a multiple of B), so the gather's wrap path runs too. */
static void scopes_match_eager(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    int64_t B = tu_randint(3, 9), n = B * tu_randint(2, 4) + tu_randint(1, (int)B - 1);
    uint64_t seed = tu_next(), dseed = tu_next();
    int steps = 7;
    net e = make(ctx, B, samples(ctx, n, dseed, NULL, NULL), seed, SG_SCOPE_EAGER);
    for (int s = 0; s < steps; s++) TU_OK(ctx, sg_trainer_step(e.t, s));
    float le;
    TU_OK(ctx, sg_model_loss_read(e.m, &le));
    TU_CHECK(isfinite(le) && le > 0, "eager loss %g", le);
    for (sg_scope sc = SG_SCOPE_LAYER; sc <= SG_SCOPE_STEP; sc++) {
        net g = make(ctx, B, samples(ctx, n, dseed, NULL, NULL), seed, sc);
        for (int s = 0; s < steps; s++) TU_OK(ctx, sg_trainer_step(g.t, s));
        float lg;
        TU_OK(ctx, sg_model_loss_read(g.m, &lg));
        sg_trainer_stats st;
        TU_OK(ctx, sg_trainer_get_stats(g.t, &st));
        TU_CHECK(st.replays > 0 && !st.fell_back, "%s scope replayed %llu graphs, fell back %d",
                 sg_scope_name(sc), (unsigned long long)st.replays, st.fell_back);
        TU_CHECK(tu_same_bits(sg_model_params(e.m), sg_model_params(g.m), sg_scope_name(sc), steps),
                 "%s scope: parameters differ from eager", sg_scope_name(sc));
        TU_CHECK(memcmp(&le, &lg, sizeof le) == 0, "%s scope loss %.9g, eager %.9g", sg_scope_name(sc), lg, le);
        drop(&g);
    }
    drop(&e);
    sg_ctx_destroy(ctx);
}

/* Names are the scope's, the module's and the parameter's; a checkpoint holds them, and a
 * fresh model of another seed loads it back to the same bits. */
static void names_and_checkpoint(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    int64_t B = 4;
    net a = make(ctx, B, samples(ctx, 16, tu_next(), NULL, NULL), tu_next(), SG_SCOPE_EAGER);
    static const char *const want[] = {"enc.fc.weight", "enc.fc.bias", "enc.norm.weight", "head.weight", "head.bias"};
    TU_CHECK(sg_model_param_tensors(a.m) == 5, "%d parameter tensors, expected 5", sg_model_param_tensors(a.m));
    for (int i = 0; i < 5 && i < sg_model_param_tensors(a.m); i++) {
        const char *nm;
        TU_OK(ctx, sg_model_param_info(a.m, i, &nm, NULL, NULL));
        TU_CHECK(!strcmp(nm, want[i]), "parameter %d is '%s', expected '%s'", i, nm, want[i]);
    }
    for (int s = 0; s < 3; s++) TU_OK(ctx, sg_trainer_step(a.t, s));
    char path[64];
    snprintf(path, sizeof path, "/tmp/sg_test_builder_%d.safetensors", (int)getpid());
    TU_OK(ctx, sg_trainer_save(a.t, 3, path));
    size_t len = 0;
    unsigned char *file = tu_file_read(path, &len);
    TU_CHECK(file && len > 8, "checkpoint %s unreadable", path);
    for (int i = 0; file && i < 5; i++) {
        char key[64];
        snprintf(key, sizeof key, "\"%s\"", want[i]);
        TU_CHECK(memmem(file, len, key, strlen(key)) != NULL, "checkpoint lacks %s", key);
    }
    free(file);
    net b = make(ctx, B, samples(ctx, 16, tu_next(), NULL, NULL), tu_next(), SG_SCOPE_EAGER);
    int64_t step = 0;
    TU_OK(ctx, sg_trainer_load(b.t, path, &step));
    TU_CHECK(step == 3, "loaded step %lld", (long long)step);
    TU_CHECK(tu_same_bits(sg_model_params(a.m), sg_model_params(b.m), "loaded parameters", 0), "load differs");
    unlink(path);
    drop(&a), drop(&b);
    sg_ctx_destroy(ctx);
}

/* Batches fed from the host give the bits the device gather of the same samples gives, eager
 * and under step scope (the copy queued on the copy stream, the step waiting for it). */
static void fed_matches_gather(sg_backend be, sg_scope scope)
{
    sg_ctx *ctx = tu_ctx(be);
    int64_t B = tu_randint(2, 8), nb = tu_randint(2, 5), n = B * nb;
    float *xh;
    int32_t *yh;
    uint64_t seed = tu_next();
    net g = make(ctx, B, samples(ctx, n, tu_next(), &xh, &yh), seed, scope);
    sg_dataset *fd;
    TU_OK(ctx, sg_dataset_create_fed(ctx, SG_DTYPE_F32, 2, (int64_t[]){B, IN}, SG_DTYPE_I32, 1, &B, &fd));
    sg_model *fm = build(ctx, B, fd, seed);
    sg_optim *fo;
    TU_OK(ctx, sg_optim_create(ctx, fm, SG_OPTIM_ADAMW, &fo));
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = scope, to.warmup = 2;
    sg_trainer *ft;
    TU_OK(ctx, sg_trainer_create(fm, fo, &to, &ft));
    int steps = 8;
    /* The loop a host loader runs: batch 0 fed first, then batch s+1 after queuing step s. */
    TU_OK(ctx, sg_dataset_feed(fd, 0, xh, (size_t)(B * IN) * 4, yh, (size_t)B * 4));
    for (int s = 0; s < steps; s++) {
        TU_OK(ctx, sg_trainer_step(g.t, s));
        TU_OK(ctx, sg_trainer_step(ft, s));
        int64_t k = (s + 1) % nb;
        TU_OK(ctx, sg_dataset_feed(fd, s + 1, xh + k * B * IN, (size_t)(B * IN) * 4, yh + k * B, (size_t)B * 4));
    }
    TU_CHECK(tu_same_bits(sg_model_params(g.m), sg_model_params(fm), "fed", steps), "%s: fed parameters differ",
             sg_scope_name(scope));
    /* Misuse: a step of a batch not fed; a feed two ahead (into the slot the step queued last
     * reads); a batch of the wrong size. */
    TU_FAILS(ctx, sg_trainer_step(ft, steps + 3), SG_ERR_INVALID, "was not fed");
    TU_FAILS(ctx, sg_dataset_feed(fd, steps + 1, xh, (size_t)(B * IN) * 4, yh, (size_t)B * 4), SG_ERR_INVALID,
             "at most one batch ahead");
    TU_FAILS(ctx, sg_dataset_feed(fd, steps, xh, 4, yh, (size_t)B * 4), SG_ERR_SHAPE, "bytes");
    sg_trainer_destroy(ft);
    sg_optim_destroy(fo);
    sg_model_destroy(fm);
    drop(&g);
    free(xh), free(yh);
    sg_ctx_destroy(ctx);
}

/* RMSNorm's analytic gradient of a random linear functional L = sum(c * y) against central
 * differences, on the CPU in f32. With h = 1e-2 on inputs of size ~1, the truncation error is
 * O(h^2 * |y'''|) ~ 1e-4 and the rounding error of L (a sum of HID*rows f32 terms of size ~1)
 * is ~ HID*rows*2^-24 / h ~ 1e-3 for rows*HID <= 200: tolerance 5e-3 + 1e-2 |g|. A wrong term
 * in the backward (the r^3 correction dropped) is off by O(1). */
static void rmsnorm_finite_differences(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    int64_t rows = tu_randint(2, 6), C = tu_randint(3, 20);
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = rows;
    sg_builder *b;
    TU_OK(ctx, sg_builder_create(ctx, "fd", &bo, &b));
    sg_module *r;
    TU_OK(ctx, rmsnorm_create(b, "norm", C, &r));
    sg_tensor *x, *y;
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){rows, C}, "x", &x));
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_I32, 1, &rows, "y", &y));
    TU_OK(ctx, sg_tensor_fill(y, 0.0));
    sg_dataset *d;
    TU_OK(ctx, sg_dataset_create(ctx, x, y, &d));
    sg_model *m;
    TU_OK(ctx, sg_builder_finish(b, r, SG_LOSS_SOFTMAX_XENT, d, tu_next(), &m));
    /* Drive the module directly: x random, L = sum(c * y), so dy = c. */
    int64_t nx = rows * C;
    float *xv = malloc((size_t)nx * 4), *c = malloc((size_t)nx * 4), *yv = malloc((size_t)nx * 4);
    float *dx = malloc((size_t)nx * 4), *dw = malloc((size_t)C * 4);
    for (int64_t i = 0; i < nx; i++) xv[i] = (float)tu_uniform(-2, 2), c[i] = (float)tu_uniform(-1, 1);
    sg_tensor *xin = sg_model_input(m), *dy;
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){rows, C}, "dy", &dy));
    const sg_tensor *out = NULL;
    sg_tensor *g = NULL;
#define LOSS(res)                                                                                   \
    do {                                                                                           \
        TU_OK(ctx, sg_tensor_copy_from_host(xin, xv, (size_t)nx * 4));                             \
        TU_OK(ctx, sg_module_forward(m->net, xin, &out));                                          \
        TU_OK(ctx, sg_tensor_copy_to_host(out, yv, (size_t)nx * 4));                               \
        double l_ = 0;                                                                             \
        for (int64_t i_ = 0; i_ < nx; i_++) l_ += (double)c[i_] * yv[i_];                          \
        res = l_;                                                                                  \
    } while (0)
    double l0;
    LOSS(l0);
    (void)l0;
    TU_OK(ctx, sg_tensor_copy_from_host(dy, c, (size_t)nx * 4));
    TU_OK(ctx, sg_module_backward(m->net, dy, &g));
    TU_CHECK(g != NULL, "no input gradient");
    if (g) TU_OK(ctx, sg_tensor_copy_to_host(g, dx, (size_t)nx * 4));
    TU_OK(ctx, sg_tensor_copy_to_host(sg_model_grads(m), dw, (size_t)C * 4)); /* weight: the only parameter */
    const double h = 1e-2;
    for (int k = 0; k < 6; k++) {
        int64_t i = tu_randint(0, (int)nx - 1);
        float keep = xv[i];
        double lp, lm;
        xv[i] = keep + (float)h;
        LOSS(lp);
        xv[i] = keep - (float)h;
        LOSS(lm);
        xv[i] = keep;
        double fd = (lp - lm) / (2 * h);
        TU_CHECK(fabs(fd - dx[i]) <= 5e-3 + 1e-2 * fabs(fd), "dx[%lld] = %g, finite differences %g", (long long)i,
                 dx[i], fd);
    }
    /* dw against a plain double sum over rows, from the same r the forward used. */
    for (int64_t j = 0; j < C; j++) {
        double want = 0;
        for (int64_t i = 0; i < rows; i++) {
            double ss = 0;
            for (int64_t q = 0; q < C; q++) ss += (double)xv[i * C + q] * xv[i * C + q];
            want += c[i * C + j] * xv[i * C + j] / sqrt(ss / C + 1e-6);
        }
        TU_CHECK(fabs(want - dw[j]) <= 1e-4 * (1 + fabs(want)) * rows, "dw[%lld] = %g, expected %g", (long long)j,
                 dw[j], want);
    }
#undef LOSS
    free(xv), free(c), free(yv), free(dx), free(dw);
    sg_tensor_destroy(dy);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
}

/* sg_verify on the user's model: what the factory needs to build it again. */
typedef struct verify_ctx {
    int64_t B, n;
    uint64_t seed, dseed;
    int tamper;        /* after_step: nudge enc.norm.weight's first element on the graph side */
    int64_t tamper_at; /* ... after this step (1-based) */
    int rows;          /* on_step calls */
} verify_ctx;

static sg_status verify_factory(sg_ctx *ctx, void *user, sg_model **out)
{
    verify_ctx *v = user;
    *out = build(ctx, v->B, samples(ctx, v->n, v->dseed, NULL, NULL), v->seed);
    return SG_OK;
}

static sg_status verify_tamper(void *user, int64_t step, sg_model *eager, sg_model *graph)
{
    (void)eager;
    verify_ctx *v = user;
    if (!v->tamper || step + 1 != v->tamper_at) return SG_OK;
    int64_t off = 0;
    for (int i = 0; i < sg_model_param_tensors(graph); i++) {
        const char *nm;
        sg_model_param_info(graph, i, &nm, &off, NULL);
        if (!strcmp(nm, "enc.norm.weight")) break;
    }
    sg_tensor *one;
    float x = 0;
    sg_status st = sg_tensor_view(sg_model_params(graph), off, 1, (int64_t[]){1}, "one", &one);
    if (st != SG_OK) return st;
    st = sg_tensor_copy_to_host(one, &x, 4);
    x += 0.125f; /* another value: the weight is near 1 */
    if (st == SG_OK) st = sg_tensor_copy_from_host(one, &x, 4);
    sg_tensor_destroy(one);
    return st;
}

static void verify_count(void *user, const sg_verify_step *row)
{
    verify_ctx *v = user;
    v->rows++;
    TU_CHECK(row->step == v->rows, "on_step row %lld, expected %d", (long long)row->step, v->rows);
}

/* sg_verify passes the user's model under every scope (bit for bit, graphs replayed), catches
 * a nudged parameter and names it, and refuses a run too short to replay a graph. */
static void verify_user_model(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    verify_ctx v = {.B = tu_randint(3, 8), .seed = tu_next(), .dseed = tu_next()};
    v.n = v.B * tu_randint(2, 4) + tu_randint(0, (int)v.B - 1);
    for (sg_scope sc = SG_SCOPE_EAGER; sc <= SG_SCOPE_STEP; sc++) {
        sg_verify_options o = sg_verify_options_default();
        o.scope = sc, o.steps = 6, o.user = &v, o.on_step = verify_count;
        v.rows = 0;
        sg_verify_result r;
        TU_OK(ctx, sg_verify(ctx, verify_factory, &v, &o, &r));
        TU_CHECK(r.passed && !r.mismatch_step && r.steps == 6 && v.rows == 6, "%s: passed %d, mismatch at %lld (%s), "
                 "%lld steps, %d rows", sg_scope_name(sc), r.passed, (long long)r.mismatch_step, r.mismatch,
                 (long long)r.steps, v.rows);
        TU_CHECK(sc == SG_SCOPE_EAGER || (r.replayed == 6 - o.warmup && r.stats.replays > 0),
                 "%s: %lld steps replayed, %llu replays", sg_scope_name(sc), (long long)r.replayed,
                 (unsigned long long)r.stats.replays);
    }
    sg_verify_options o = sg_verify_options_default();
    o.scope = SG_SCOPE_STEP, o.steps = 8, o.user = &v, o.after_step = verify_tamper;
    v.tamper = 1, v.tamper_at = tu_randint(1, 8);
    sg_verify_result r;
    TU_OK(ctx, sg_verify(ctx, verify_factory, &v, &o, &r));
    TU_CHECK(!r.passed && r.mismatch_step == v.tamper_at && !strncmp(r.mismatch, "enc.norm.weight (", 17),
             "nudged after step %lld: passed %d, mismatch at step %lld: %s", (long long)v.tamper_at, r.passed,
             (long long)r.mismatch_step, r.mismatch);
    v.tamper = 0;
    o = sg_verify_options_default();
    o.steps = o.warmup + 1;
    TU_FAILS(ctx, sg_verify(ctx, verify_factory, &v, &o, &r), SG_ERR_INVALID, "one replay only");
    sg_ctx_destroy(ctx);
}

/* ---- buffers: a module with state that is not trained (CPU) ---- */

/* "tracker": y = x, and in training passes its buffer running_mean (C) becomes
 * 0.75 running_mean + 0.25 mean over rows of x (as BatchNorm's running statistics do); dx = dy. */
typedef struct tracker {
    int64_t C;
    int buf;
    sg_tensor *y, *dx;
} tracker;

typedef struct tracker_args {
    const float *x, *dy;
    float *y, *dx, *run;
    int64_t rows, C;
    int training, backward;
} tracker_args;

static sg_status tracker_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    const tracker_args *a = p;
    int64_t n = a->rows * a->C;
    if (a->backward) {
        memcpy(a->dx, a->dy, (size_t)n * 4);
        return SG_OK;
    }
    memcpy(a->y, a->x, (size_t)n * 4);
    for (int64_t j = 0; a->training && j < a->C; j++) {
        double s = 0;
        for (int64_t i = 0; i < a->rows; i++) s += a->x[i * a->C + j];
        a->run[j] = 0.75f * a->run[j] + 0.25f * (float)(s / (double)a->rows);
    }
    return SG_OK;
}

static sg_status tracker_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    tracker *t = sg_module_state(m);
    tracker_args a = {.x = sg_tensor_data(x), .y = sg_tensor_data(t->y),
                      .run = sg_tensor_data(sg_module_buffer_tensor(m, t->buf)), .rows = sg_tensor_dim(x, 0),
                      .C = t->C, .training = sg_module_training(m)};
    *y = t->y;
    return sg_cpu_run(sg_module_ctx(m), tracker_cpu, &a, sizeof a);
}

static sg_status tracker_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    tracker *t = sg_module_state(m);
    tracker_args a = {.dy = sg_tensor_data(dy), .dx = sg_tensor_data(t->dx), .rows = sg_tensor_dim(dy, 0),
                      .C = t->C, .backward = 1};
    *dx = t->dx;
    return sg_cpu_run(sg_module_ctx(m), tracker_cpu, &a, sizeof a);
}

static void tracker_destroy(sg_module *m)
{
    tracker *t = sg_module_state(m);
    sg_tensor_destroy(t->y), sg_tensor_destroy(t->dx);
    free(t);
}

static const sg_module_ops tracker_ops = {"tracker", tracker_forward, tracker_backward, NULL, tracker_destroy};

static sg_model *build_tracked(sg_ctx *ctx, int64_t B, sg_dataset *d, uint64_t seed)
{
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = B;
    sg_builder *b;
    TU_OK(ctx, sg_builder_create(ctx, "tracked", &bo, &b));
    sg_module *l[3], *root;
    TU_OK(ctx, sg_module_linear(b, "fc", IN, HID, 1, SG_ACT_RELU, &l[0]));
    tracker *t = calloc(1, sizeof *t);
    t->C = HID;
    TU_OK(ctx, sg_module_create(b, "trk", &tracker_ops, t, &l[1]));
    t->buf = sg_module_declare_buffer(l[1], "running_mean", 1, (int64_t[]){HID}, SG_INIT_ZEROS);
    TU_CHECK(t->buf >= 0, "declare_buffer: %s", sg_ctx_last_error(ctx));
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){B, HID}, "trk.y", &t->y));
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){B, HID}, "trk.dx", &t->dx));
    /* Names are unique among parameters and buffers. */
    TU_FAILS(ctx, sg_module_declare_buffer(l[1], "running_mean", 1, (int64_t[]){HID}, SG_INIT_ONES) >= 0
                      ? SG_OK : SG_ERR_INVALID, SG_ERR_INVALID, "declared twice");
    TU_FAILS(ctx, sg_module_param(l[1], "running_mean", 1, (int64_t[]){HID}, SG_INIT_ONES, HID, 0) >= 0
                      ? SG_OK : SG_ERR_INVALID, SG_ERR_INVALID, "already a buffer's name");
    TU_FAILS(ctx, sg_module_declare_buffer(l[0], "weight", 1, (int64_t[]){HID}, SG_INIT_ZEROS) >= 0
                      ? SG_OK : SG_ERR_INVALID, SG_ERR_INVALID, "already a parameter's name");
    TU_OK(ctx, sg_module_linear(b, "head", HID, OUT, 1, SG_ACT_NONE, &l[2]));
    TU_OK(ctx, sg_module_sequential(b, "net", l, 3, &root));
    sg_model *m;
    TU_OK(ctx, sg_builder_finish(b, root, SG_LOSS_SOFTMAX_XENT, d, seed, &m));
    return m;
}

static sg_status tracked_factory(sg_ctx *ctx, void *user, sg_model **out)
{
    verify_ctx *v = user;
    *out = build_tracked(ctx, v->B, samples(ctx, v->n, v->dseed, NULL, NULL), v->seed);
    return SG_OK;
}

static sg_status tamper_buffer(void *user, int64_t step, sg_model *eager, sg_model *graph)
{
    (void)eager;
    verify_ctx *v = user;
    if (step + 1 != v->tamper_at) return SG_OK;
    float x[HID];
    sg_tensor *b = sg_model_buffers(graph);
    sg_status st = sg_tensor_copy_to_host(b, x, sizeof x);
    x[HID / 2] += 0.125f;
    return st == SG_OK ? sg_tensor_copy_from_host(b, x, sizeof x) : st;
}

/* Buffers: named, zero at first, moved by training steps and not by evaluation, the same bits
 * under every scope as eagerly (sg_verify compares them, and names one that differs), and saved
 * and loaded with the checkpoint. */
static void buffers(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    verify_ctx v = {.B = tu_randint(3, 8), .seed = tu_next(), .dseed = tu_next()};
    v.n = v.B * tu_randint(2, 4) + tu_randint(0, (int)v.B - 1);
    sg_model *m;
    TU_OK(ctx, tracked_factory(ctx, &v, &m));
    const char *name = NULL;
    int64_t off = -1, n = 0;
    TU_CHECK(sg_model_buffer_tensors(m) == 1, "%d buffers", sg_model_buffer_tensors(m));
    TU_OK(ctx, sg_model_buffer_info(m, 0, &name, &off, &n));
    TU_CHECK(name && !strcmp(name, "trk.running_mean") && off == 0 && n == HID, "buffer '%s' at %lld, %lld",
             name ? name : "", (long long)off, (long long)n);
    TU_CHECK(sg_model_param_tensors(m) == 4, "%d parameter tensors (buffers are not parameters)",
             sg_model_param_tensors(m));
    sg_optim *o;
    sg_trainer *t;
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = SG_SCOPE_STEP;
    TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
    float b0[HID], b1[HID], b2[HID];
    TU_OK(ctx, sg_tensor_copy_to_host(sg_model_buffers(m), b0, sizeof b0));
    for (int j = 0; j < HID; j++) TU_CHECK(b0[j] == 0.f, "buffer[%d] = %g before training", j, b0[j]);
    for (int s = 0; s < 5; s++) TU_OK(ctx, sg_trainer_step(t, s));
    TU_OK(ctx, sg_tensor_copy_to_host(sg_model_buffers(m), b1, sizeof b1));
    int moved = 0;
    for (int j = 0; j < HID; j++) moved += b1[j] != 0.f;
    TU_CHECK(moved > HID / 2, "training moved %d of %d buffer elements", moved, HID);
    float loss;
    TU_OK(ctx, sg_trainer_eval(t, 0, 2, &loss));
    TU_OK(ctx, sg_tensor_copy_to_host(sg_model_buffers(m), b2, sizeof b2));
    TU_CHECK(!memcmp(b1, b2, sizeof b1), "evaluation changed the buffer");
    char path[64];
    snprintf(path, sizeof path, "/tmp/sg_test_builder_buf_%d.safetensors", (int)getpid());
    TU_OK(ctx, sg_trainer_save(t, 5, path));
    size_t len = 0;
    unsigned char *file = tu_file_read(path, &len);
    TU_CHECK(file && memmem(file, len, "\"trk.running_mean\"", 18), "checkpoint lacks trk.running_mean");
    free(file);
    sg_model *m2;
    sg_optim *o2;
    sg_trainer *t2;
    v.seed++;
    TU_OK(ctx, tracked_factory(ctx, &v, &m2));
    TU_OK(ctx, sg_optim_create(ctx, m2, SG_OPTIM_ADAMW, &o2));
    TU_OK(ctx, sg_trainer_create(m2, o2, &to, &t2));
    int64_t step;
    TU_OK(ctx, sg_trainer_load(t2, path, &step));
    TU_CHECK(tu_same_bits(sg_model_buffers(m), sg_model_buffers(m2), "loaded buffers", 0), "buffers not restored");
    unlink(path);
    sg_trainer_destroy(t2), sg_optim_destroy(o2), sg_model_destroy(m2);
    sg_trainer_destroy(t), sg_optim_destroy(o), sg_model_destroy(m);
    v.seed--;
    for (sg_scope sc = SG_SCOPE_LAYER; sc <= SG_SCOPE_STEP; sc++) {
        sg_verify_options vo = sg_verify_options_default();
        vo.scope = sc, vo.steps = 6;
        sg_verify_result r;
        TU_OK(ctx, sg_verify(ctx, tracked_factory, &v, &vo, &r));
        TU_CHECK(r.passed, "%s scope with a buffer: mismatch at %lld: %s %s", sg_scope_name(sc),
                 (long long)r.mismatch_step, r.mismatch, r.no_graph);
    }
    sg_verify_options vo = sg_verify_options_default();
    vo.steps = 7, vo.user = &v, vo.after_step = tamper_buffer;
    v.tamper_at = tu_randint(1, 7);
    sg_verify_result r;
    TU_OK(ctx, sg_verify(ctx, tracked_factory, &v, &vo, &r));
    TU_CHECK(!r.passed && r.mismatch_step == v.tamper_at && !strncmp(r.mismatch, "trk.running_mean (", 18),
             "nudged buffer after step %lld: mismatch at %lld: %s", (long long)v.tamper_at, (long long)r.mismatch_step,
             r.mismatch);
    sg_ctx_destroy(ctx);
}

/* An .npy file of F32 (rows, cols), as np.save writes it (format 1.0, header padded to 64). */
static void write_npy_f32(const char *path, const float *v, int64_t rows, int64_t cols)
{
    char dict[128];
    int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                     (long long)rows, (long long)cols);
    int hlen = (10 + n + 1 + 63) / 64 * 64 - 10;
    size_t data = (size_t)(rows * cols) * 4, len = 10 + (size_t)hlen + data;
    unsigned char *f = malloc(len);
    memcpy(f, "\x93NUMPY\x01\x00", 8);
    f[8] = (unsigned char)(hlen & 0xff), f[9] = (unsigned char)(hlen >> 8);
    memset(f + 10, ' ', (size_t)hlen);
    memcpy(f + 10, dict, (size_t)n);
    f[10 + hlen - 1] = '\n';
    memcpy(f + 10 + hlen, v, data);
    tu_file_write(path, f, len);
    free(f);
}

/* An MSE model over an .npy data set (x and F32 targets from files) trains, under step scope,
 * to the bits of the same model over the same arrays handed in as tensors: the files reach the
 * device as they are. */
static void npy_matches_tensors(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    int64_t B = tu_randint(2, 6), n = B * tu_randint(2, 5) + tu_randint(0, (int)B - 1);
    float *x = malloc((size_t)(n * IN) * 4), *t = malloc((size_t)(n * OUT) * 4);
    for (int64_t i = 0; i < n * IN; i++) x[i] = (float)tu_uniform(-2, 2);
    for (int64_t i = 0; i < n * OUT; i++) t[i] = (float)tu_uniform(-1, 1);
    char px[64], pt[64];
    snprintf(px, sizeof px, "/tmp/sg_test_builder_%d_x.npy", (int)getpid());
    snprintf(pt, sizeof pt, "/tmp/sg_test_builder_%d_t.npy", (int)getpid());
    write_npy_f32(px, x, n, IN);
    write_npy_f32(pt, t, n, OUT);
    sg_dataset *dn, *dt;
    TU_OK(ctx, sg_dataset_from_npy(ctx, px, pt, &dn));
    TU_CHECK(sg_dataset_samples(dn) == n, "%lld samples from the files, expected %lld",
             (long long)sg_dataset_samples(dn), (long long)n);
    sg_tensor *tx, *tt;
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){n, IN}, "x", &tx));
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){n, OUT}, "t", &tt));
    TU_OK(ctx, sg_tensor_copy_from_host(tx, x, (size_t)(n * IN) * 4));
    TU_OK(ctx, sg_tensor_copy_from_host(tt, t, (size_t)(n * OUT) * 4));
    TU_OK(ctx, sg_dataset_create(ctx, tx, tt, &dt));
    uint64_t seed = tu_next();
    sg_model *m[2];
    sg_optim *o[2];
    sg_trainer *tr[2];
    for (int k = 0; k < 2; k++) {
        sg_builder_options bo = sg_builder_options_default();
        bo.batch = B;
        sg_builder *b;
        TU_OK(ctx, sg_builder_create(ctx, "npy-mse", &bo, &b));
        sg_module *l[3], *root;
        TU_OK(ctx, sg_module_linear(b, "fc", IN, HID, 1, SG_ACT_GELU, &l[0]));
        TU_OK(ctx, rmsnorm_create(b, "norm", HID, &l[1]));
        TU_OK(ctx, sg_module_linear(b, "out", HID, OUT, 1, SG_ACT_NONE, &l[2]));
        TU_OK(ctx, sg_module_sequential(b, "net", l, 3, &root));
        TU_OK(ctx, sg_builder_finish(b, root, SG_LOSS_MSE, k ? dt : dn, seed, &m[k]));
        TU_OK(ctx, sg_optim_create(ctx, m[k], SG_OPTIM_ADAMW, &o[k]));
        sg_trainer_options to = sg_trainer_options_default();
        to.scope = SG_SCOPE_STEP, to.warmup = 2;
        TU_OK(ctx, sg_trainer_create(m[k], o[k], &to, &tr[k]));
    }
    int steps = 6;
    for (int s = 0; s < steps; s++)
        for (int k = 0; k < 2; k++) TU_OK(ctx, sg_trainer_step(tr[k], s));
    float l[2];
    for (int k = 0; k < 2; k++) TU_OK(ctx, sg_model_loss_read(m[k], &l[k]));
    TU_CHECK(isfinite(l[0]) && l[0] > 0, "MSE loss %g", l[0]);
    TU_CHECK(!memcmp(&l[0], &l[1], sizeof *l), "loss over .npy %.9g, over tensors %.9g", l[0], l[1]);
    TU_CHECK(tu_same_bits(sg_model_params(m[0]), sg_model_params(m[1]), "npy", steps),
             ".npy model's parameters differ from the tensors' model's");
    for (int k = 0; k < 2; k++) sg_trainer_destroy(tr[k]), sg_optim_destroy(o[k]), sg_model_destroy(m[k]);
    unlink(px), unlink(pt);
    free(x), free(t);
    sg_ctx_destroy(ctx);
}

/* What the builder refuses, naming what is wrong; the context stays usable. */
static void refusals(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = 4;
    sg_builder *b, *b2;
    TU_OK(ctx, sg_builder_create(ctx, "bad", &bo, &b));
    TU_OK(ctx, sg_builder_create(ctx, "other", &bo, &b2));
    sg_module *l1, *l2, *o1, *s;
    TU_OK(ctx, sg_module_linear(b, "fc", 4, 4, 1, SG_ACT_NONE, &l1));
    TU_FAILS(ctx, sg_module_linear(b, "fc", 4, 4, 1, SG_ACT_NONE, &l2), SG_ERR_INVALID, "declared twice");
    TU_OK(ctx, sg_module_linear(b2, "fc", 4, 4, 1, SG_ACT_NONE, &o1));
    sg_module *mixed[2] = {l1, o1};
    TU_FAILS(ctx, sg_module_sequential(b, "s", mixed, 2, &s), SG_ERR_INVALID, "another builder");
    TU_FAILS(ctx, sg_module_linear(b, "wide", 0, 4, 1, SG_ACT_NONE, &l2), SG_ERR_SHAPE, "inputs");
    TU_FAILS(ctx, sg_module_embedding(b, "emb", 10, 4, &l2), SG_ERR_INVALID, "seq > 0");
    TU_FAILS(ctx, sg_builder_finish(b, l1, SG_LOSS_SOFTMAX_XENT, NULL, 1, &(sg_model *){NULL}), SG_ERR_NULL,
             "root or data");
    sg_builder_destroy(b2);
    sg_builder_options bad = bo;
    bad.batch = 6, bad.shards = 4;
    TU_FAILS(ctx, sg_builder_create(ctx, "x", &bad, &b), SG_ERR_INVALID, "shards dividing");
    TU_FAILS(ctx, sg_builder_create(ctx, "", &bo, &b), SG_ERR_INVALID, "model name");
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    tu_seed("test_builder");
    bool gpu = argc > 1 && !strcmp(argv[1], "gpu");
    sg_backend be = gpu ? SG_BACKEND_CUDA : SG_BACKEND_CPU;
    if (gpu && !sg_cuda_available()) return TU_SKIP;
    scopes_match_eager(be);
    names_and_checkpoint(be);
    fed_matches_gather(be, SG_SCOPE_EAGER);
    fed_matches_gather(be, SG_SCOPE_STEP);
    npy_matches_tensors(be);
    verify_user_model(be);
    refusals(be);
    if (!gpu) rmsnorm_finite_differences(), buffers();
    return tu_finish("test_builder");
}
