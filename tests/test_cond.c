/* test_cond.c: conditional regions (sg_graph_if, sg_graph_while, sg_graph_switch), through the
 * public API, in both modes (cpu: the plan backend; gpu: CUDA conditional nodes). Each region
 * is captured once and replayed with fresh random device values set between replays: the
 * output equals what the same code computes eagerly and what the host computes in float,
 * bit for bit (the bodies add random floats, in a fixed order), for IF (zero and non-zero
 * values), WHILE (0..9 turns, the counter counted down on the device), SWITCH (every index
 * from -1 to n, n random) and a region nested in another; a branch chosen by a user's kernel
 * from data written in the same graph; one launch per replay on CUDA. Errors: bad arguments;
 * collectives' and events' calls inside a body refused eagerly and during capture, naming the
 * call and the region, the context usable afterwards; STEPGRAPH_DISABLE_CONDITIONALS makes
 * capture refuse a region with SG_ERR_UNSUPPORTED while eager calls still work. */
#include "testutil.h"

#include <stdlib.h>

#ifdef SG_HAVE_CUDA
int tc_positive_launch(void *stream, const float *x, int *c); /* cond_user_kernel.cu */
#endif

/* What the regions work on: out (n floats) and the values that pick. */
typedef struct fixture {
    sg_ctx *ctx;
    sg_tensor *out, *flag, *count, *index, *inner, *x;
    float base, add[8];   /* out starts at base; body or branch i adds add[i] */
    int n_branches;
    sg_step_fn loop_body; /* what step_while repeats */
} fixture;

static sg_status set_i32(sg_tensor *t, int32_t v) { return sg_tensor_copy_from_host(t, &v, sizeof v); }

static int32_t get_i32(const sg_tensor *t)
{
    int32_t v = 0;
    TU_OK(t->ctx, sg_tensor_copy_to_host(t, &v, sizeof v));
    return v;
}

/* Every element of out must equal want (float), bit for bit. */
static void check_out(const fixture *f, float want, const char *what, int value)
{
    double *v = tu_get(f->out);
    int bad = 0;
    for (int64_t i = 0; i < f->out->numel; i++) bad += (float)v[i] != want;
    TU_CHECK(bad == 0, "%s (value %d): %d of %lld elements differ from %.9g (first %.9g)", what, value, bad,
             (long long)f->out->numel, want, v[0]);
    free(v);
}

static sg_status add_0(void *u) { fixture *f = u; return sg_tensor_add_scalar(f->out, f->add[0]); }

static sg_status branch(fixture *f, int i) { return sg_tensor_add_scalar(f->out, f->add[i]); }
static sg_status br0(void *u) { return branch(u, 0); }
static sg_status br1(void *u) { return branch(u, 1); }
static sg_status br2(void *u) { return branch(u, 2); }
static sg_status br3(void *u) { return branch(u, 3); }
static sg_status br4(void *u) { return branch(u, 4); }
static sg_status br5(void *u) { return branch(u, 5); }
static const sg_step_fn branches[] = {br0, br1, br2, br3, br4, br5};

/* ---- the regions under test: each starts from out = base ---- */

static sg_status step_if(void *u)
{
    fixture *f = u;
    SG_TRY(sg_tensor_fill(f->out, f->base));
    return sg_graph_if(f->ctx, f->flag, add_0, f);
}

static sg_status while_body(void *u)
{
    fixture *f = u;
    SG_TRY(sg_tensor_add_scalar(f->out, f->add[0]));
    return sg_tensor_add_scalar(f->count, -1);
}


static sg_status step_switch(void *u)
{
    fixture *f = u;
    SG_TRY(sg_tensor_fill(f->out, f->base));
    void *users[6] = {f, f, f, f, f, f};
    return sg_graph_switch(f->ctx, f->index, f->n_branches, branches, users);
}

/* while (count) { count--; if (inner) out += add[1]; out += add[0]; } */
static sg_status inner_if(void *u) { return branch(u, 1); }

static sg_status nested_body(void *u)
{
    fixture *f = u;
    SG_TRY(sg_tensor_add_scalar(f->count, -1));
    SG_TRY(sg_graph_if(f->ctx, f->inner, inner_if, f));
    return sg_tensor_add_scalar(f->out, f->add[0]);
}

/* The WHILE cases: while_body, or nested_body with an IF in it. */
static sg_status step_while(void *u)
{
    fixture *f = u;
    SG_TRY(sg_tensor_fill(f->out, f->base));
    return sg_graph_while(f->ctx, f->count, f->loop_body, f);
}

/* A user's kernel decides: flag = x[0] > 0, written in the graph, then the IF. */
static sg_status positive_cpu(sg_ctx *ctx, const void *a)
{
    (void)ctx;
    const fixture *f = *(fixture *const *)a;
    *(int32_t *)f->flag->data = *(const float *)f->x->data > 0.f;
    return SG_OK;
}

static sg_status step_data(void *u)
{
    fixture *f = u;
    SG_TRY(sg_tensor_fill(f->out, f->base));
    if (f->ctx->backend == SG_BACKEND_CPU) {
        SG_TRY(sg_cpu_run(f->ctx, positive_cpu, &f, sizeof f));
    } else {
#ifdef SG_HAVE_CUDA
        int e = tc_positive_launch(sg_ctx_stream(f->ctx), f->x->data, f->flag->data);
        if (e) return sg_ctx_fail(f->ctx, SG_ERR_CUDA, "tc_positive_launch: CUDA error %d", e);
#endif
    }
    return sg_graph_if(f->ctx, f->flag, add_0, f);
}

/* ---- running them ---- */

static void setup(fixture *f, sg_backend be)
{
    memset(f, 0, sizeof *f);
    f->ctx = tu_ctx(be);
    f->out = tu_tensor1(f->ctx, SG_DTYPE_F32, tu_randint(1, 3000), "out");
    f->flag = tu_tensor1(f->ctx, SG_DTYPE_I32, 1, "flag");
    f->count = tu_tensor1(f->ctx, SG_DTYPE_I32, 1, "count");
    f->index = tu_tensor1(f->ctx, SG_DTYPE_I32, 1, "index");
    f->inner = tu_tensor1(f->ctx, SG_DTYPE_I32, 1, "inner");
    f->x = tu_tensor1(f->ctx, SG_DTYPE_F32, 1, "x");
    f->base = (float)tu_uniform(-4, 4);
    for (int i = 0; i < 8; i++) f->add[i] = (float)tu_uniform(0.25, 2) * (i % 2 ? -1 : 1);
    f->n_branches = tu_randint(2, 6);
}

static void teardown(fixture *f)
{
    sg_tensor *all[] = {f->out, f->flag, f->count, f->index, f->inner, f->x};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) sg_tensor_destroy(all[i]);
    sg_ctx_destroy(f->ctx);
}

/* The value a case sets before a run, and what out must then hold (host float arithmetic in
 * the bodies' order). */
typedef enum which { W_IF, W_WHILE, W_SWITCH, W_NESTED, W_DATA } which;

static float expect(const fixture *f, which w, int v, int v2)
{
    float o = f->base;
    switch (w) {
    case W_IF:
        if (v) o += f->add[0];
        break;
    case W_WHILE:
        for (int i = 0; i < v; i++) o += f->add[0];
        break;
    case W_SWITCH:
        if (v >= 0 && v < f->n_branches) o += f->add[v];
        break;
    case W_NESTED:
        for (int i = 0; i < v; i++) {
            if (v2) o += f->add[1];
            o += f->add[0];
        }
        break;
    case W_DATA:
        if (v > 0) o += f->add[0];
        break;
    }
    return o;
}

/* The value of run r of case w: every index -1..n for SWITCH, random otherwise. */
static void set_value(fixture *f, which w, int r, int *v, int *v2)
{
    *v2 = 0;
    switch (w) {
    case W_IF: *v = r < 2 ? r : (tu_randint(0, 1) ? tu_randint(-1000, 1000) : 0); break;
    case W_WHILE: *v = r == 0 ? 0 : tu_randint(0, 9); break;
    case W_SWITCH: *v = r - 1; break;
    case W_NESTED:
        *v = tu_randint(0, 6), *v2 = tu_randint(0, 1) ? tu_randint(1, 50) : 0;
        TU_OK(f->ctx, set_i32(f->inner, *v2));
        break;
    case W_DATA: {
        float x = (float)tu_uniform(-1, 1);
        *v = x > 0.f;
        TU_OK(f->ctx, sg_tensor_copy_from_host(f->x, &x, sizeof x));
        return;
    }
    }
    sg_tensor *t = w == W_IF ? f->flag : w == W_SWITCH ? f->index : f->count;
    TU_OK(f->ctx, set_i32(t, *v));
}

static void test_region(sg_backend be, which w, const char *name, sg_step_fn fn)
{
    fixture f;
    setup(&f, be);
    f.loop_body = w == W_NESTED ? nested_body : while_body;
    int runs = w == W_SWITCH ? f.n_branches + 2 : 8;
    /* Eagerly first: the same code, values read on the host. */
    for (int r = 0; r < runs; r++) {
        int v, v2;
        set_value(&f, w, r, &v, &v2);
        tu_poison(f.out);
        TU_OK(f.ctx, fn(&f));
        check_out(&f, expect(&f, w, v, v2), name, v);
        if (w == W_WHILE || w == W_NESTED) TU_CHECK(get_i32(f.count) == 0, "%s eager: count left %d", name, get_i32(f.count));
    }
    /* Captured once (warm-up 1 with the last value), then replayed with fresh values. */
    sg_graph_options o = sg_graph_options_default();
    o.name = name, o.warmup = 1;
    int v, v2;
    set_value(&f, w, 1, &v, &v2);
    sg_graph *g = NULL;
    TU_OK(f.ctx, sg_graph_capture(f.ctx, fn, &f, &o, &g));
    sg_graph_stats gs;
    TU_OK(f.ctx, sg_graph_get_stats(g, &gs));
    TU_CHECK(gs.nodes >= 2, "%s: %d nodes", name, gs.nodes);
    for (int r = 0; r < 2 * runs; r++) {
        set_value(&f, w, r % runs, &v, &v2);
        tu_poison(f.out);
        uint64_t k0 = sg_ctx_launch_count(f.ctx);
        TU_OK(f.ctx, sg_graph_replay(g));
        if (be == SG_BACKEND_CUDA)
            TU_CHECK(sg_ctx_launch_count(f.ctx) - k0 == 1, "%s: a replay made %llu launches", name,
                     (unsigned long long)(sg_ctx_launch_count(f.ctx) - k0));
        check_out(&f, expect(&f, w, v, v2), name, v);
        if (w == W_WHILE || w == W_NESTED) TU_CHECK(get_i32(f.count) == 0, "%s replay: count left %d", name, get_i32(f.count));
    }
    sg_graph_destroy(g);
    teardown(&f);
}

/* ---- errors ---- */

static sg_status nothing(void *u)
{
    (void)u;
    return SG_OK;
}

typedef struct forbidden {
    fixture *f;
    sg_readback *rb;
    int call; /* 0: a read-back, 1: a capture, 2: a replay */
    sg_graph *g;
} forbidden;

static sg_status forbidden_body(void *u)
{
    forbidden *b = u;
    SG_TRY(sg_tensor_add_scalar(b->f->out, 1));
    if (b->call == 0) return sg_readback_start(b->rb, b->f->out);
    if (b->call == 1) {
        sg_graph *g = NULL;
        sg_status st = sg_graph_capture(b->f->ctx, nothing, NULL, NULL, &g);
        sg_graph_destroy(g);
        return st;
    }
    return sg_graph_replay(b->g);
}

static sg_status forbidden_step(void *u)
{
    forbidden *b = u;
    return sg_graph_if(b->f->ctx, b->f->flag, forbidden_body, b);
}

static void test_errors(sg_backend be)
{
    fixture f;
    setup(&f, be);
    sg_ctx *ctx = f.ctx;
    sg_step_fn two[] = {br0, NULL};
    sg_tensor *wide = tu_tensor1(ctx, SG_DTYPE_I32, 2, "wide");
    TU_CHECK(sg_graph_if(NULL, f.flag, add_0, &f) == SG_ERR_NULL, "NULL ctx");
    TU_FAILS(ctx, sg_graph_if(ctx, NULL, add_0, &f), SG_ERR_NULL, "sg_graph_if: cond is NULL");
    TU_FAILS(ctx, sg_graph_while(ctx, f.count, NULL, &f), SG_ERR_NULL, "sg_graph_while: body is NULL");
    TU_FAILS(ctx, sg_graph_if(ctx, f.x, add_0, &f), SG_ERR_DTYPE, "expected one int32 element");
    TU_FAILS(ctx, sg_graph_while(ctx, wide, add_0, &f), SG_ERR_SHAPE, "'wide' is i32 with 2 elements");
    TU_FAILS(ctx, sg_graph_switch(ctx, f.index, 0, branches, NULL), SG_ERR_INVALID, "0 branches: expected 1 to 64");
    TU_FAILS(ctx, sg_graph_switch(ctx, f.index, 65, branches, NULL), SG_ERR_INVALID, "65 branches");
    TU_FAILS(ctx, sg_graph_switch(ctx, f.index, 2, two, NULL), SG_ERR_NULL, "sg_graph_switch: branch 1 is NULL");
    sg_ctx *other = tu_ctx(SG_BACKEND_CPU);
    sg_tensor *foreign = tu_tensor1(other, SG_DTYPE_I32, 1, "foreign");
    TU_CHECK(sg_graph_if(ctx, foreign, add_0, &f) != SG_OK, "a tensor of another context is refused");
    sg_tensor_destroy(foreign);
    sg_ctx_destroy(other);

    /* Calls a body may not hold: refused eagerly and during capture, naming the call and the
     * region; the context works afterwards. */
    forbidden b = {&f, NULL, 0, NULL};
    TU_OK(ctx, sg_readback_create(ctx, 64, &b.rb));
    TU_OK(ctx, sg_graph_capture(ctx, nothing, NULL, NULL, &b.g));
    const char *calls[] = {"sg_readback_start", "sg_graph_capture", "sg_graph_replay"};
    for (int c = 0; c < 3; c++) {
        b.call = c;
        TU_OK(ctx, set_i32(f.flag, 1));
        TU_FAILS(ctx, forbidden_step(&b), SG_ERR_CAPTURE, calls[c]);
        TU_CHECK(strstr(sg_ctx_last_error(ctx), "inside a conditional region (sg_graph_if)") != NULL,
                 "eager message: %s", sg_ctx_last_error(ctx));
        sg_graph *g = NULL;
        sg_graph_options o = sg_graph_options_default();
        o.warmup = 0;
        TU_FAILS(ctx, sg_graph_capture(ctx, forbidden_step, &b, &o, &g), SG_ERR_CAPTURE, calls[c]);
        TU_CHECK(g == NULL, "a failed capture returns no graph");
        /* Usable: an eager region and a fresh capture work. */
        TU_OK(ctx, set_i32(f.flag, 1));
        tu_poison(f.out);
        TU_OK(ctx, step_if(&f));
        check_out(&f, f.base + f.add[0], "after a refused call", c);
        TU_OK(ctx, sg_graph_capture(ctx, step_if, &f, &o, &g));
        TU_OK(ctx, set_i32(f.flag, 0));
        TU_OK(ctx, sg_graph_replay(g));
        check_out(&f, f.base, "capture after a refused call", c);
        sg_graph_destroy(g);
    }
    sg_graph_destroy(b.g);
    sg_readback_destroy(b.rb);

    /* No conditional nodes: capture refuses the region, naming why; eager calls still run. */
    TU_CHECK(sg_graph_conditionals(ctx) & (1 << SG_COND_IF), "conditionals of this backend: %d",
             sg_graph_conditionals(ctx));
    setenv("STEPGRAPH_DISABLE_CONDITIONALS", "1", 1);
    TU_CHECK(sg_graph_conditionals(ctx) == 0, "STEPGRAPH_DISABLE_CONDITIONALS: %d", sg_graph_conditionals(ctx));
    sg_graph *g = NULL;
    TU_FAILS(ctx, sg_graph_capture(ctx, step_if, &f, NULL, &g), SG_ERR_UNSUPPORTED,
             "STEPGRAPH_DISABLE_CONDITIONALS is set");
    TU_OK(ctx, set_i32(f.flag, 7));
    TU_OK(ctx, step_if(&f));
    check_out(&f, f.base + f.add[0], "eager without conditional nodes", 7);
    unsetenv("STEPGRAPH_DISABLE_CONDITIONALS");
    sg_tensor_destroy(wide);
    teardown(&f);
}

/* sg_tensor_add_scalar, what the regions count with: every dtype against the host's sum in
 * the dtype's arithmetic (f32 and bf16 in float, rounded once), bit for bit. */
static void test_add_scalar(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    const sg_dtype dts[] = {SG_DTYPE_F32, SG_DTYPE_BF16, SG_DTYPE_I32};
    for (int d = 0; d < 3; d++) {
        sg_tensor *t = tu_tensor1(ctx, dts[d], tu_randint(1, 5000), "t");
        double *x = tu_random(t, -100, 100);
        for (int64_t i = 0; i < t->numel && dts[d] == SG_DTYPE_I32; i++) x[i] = (int32_t)x[i]; /* as stored */
        double v = dts[d] == SG_DTYPE_I32 ? tu_randint(-1000, 1000) : tu_uniform(-10, 10);
        TU_OK(ctx, sg_tensor_add_scalar(t, v));
        double *got = tu_get(t);
        int bad = 0;
        for (int64_t i = 0; i < t->numel; i++) {
            double want;
            if (dts[d] == SG_DTYPE_I32) {
                want = x[i] + v;
            } else {
                float vv = dts[d] == SG_DTYPE_BF16 ? (float)sg_bf16_to_double(sg_double_to_bf16(v)) : (float)v;
                float xs = dts[d] == SG_DTYPE_BF16 ? (float)sg_bf16_to_double(sg_double_to_bf16(x[i])) : (float)x[i];
                float sum = xs + vv;
                want = dts[d] == SG_DTYPE_BF16 ? sg_bf16_to_double(sg_double_to_bf16(sum)) : sum;
            }
            bad += got[i] != want;
        }
        TU_CHECK(bad == 0, "sg_tensor_add_scalar %s: %d of %lld differ", sg_dtype_name(dts[d]), bad,
                 (long long)t->numel);
        free(x);
        free(got);
        if (dts[d] == SG_DTYPE_I32)
            TU_FAILS(ctx, sg_tensor_add_scalar(t, 0.5), SG_ERR_INVALID, "expected an int32 value");
        sg_tensor_destroy(t);
    }
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_cond");
    unsetenv("STEPGRAPH_DISABLE_GRAPHS");
    unsetenv("STEPGRAPH_DISABLE_CONDITIONALS");
    sg_backend be = strcmp(mode, "gpu") ? SG_BACKEND_CPU : SG_BACKEND_CUDA;
    if (be == SG_BACKEND_CUDA) sg_ctx_destroy(tu_ctx(be)); /* skips (77) without a GPU */
    test_add_scalar(be);
    test_region(be, W_IF, "if", step_if);
    test_region(be, W_WHILE, "while", step_while);
    test_region(be, W_SWITCH, "switch", step_switch);
    test_region(be, W_NESTED, "nested", step_while);
    test_region(be, W_DATA, "data", step_data);
    test_errors(be);
    return tu_finish("test_cond");
}
