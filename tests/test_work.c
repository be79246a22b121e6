/* test_work.c: the work the ops count (sg_ctx_work), a trainer's step's work, and the
 * speed-of-light floor (sg_sol_floor, sg_device_peaks_measure).
 *   `cpu`: a linear layer's forward and backward (with and without dx) and attention's (fused
 *   and unfused) count exactly 2 M N K a product and the causal triangle's products, and the
 *   bytes of their tensors; a CPU capture counts its ops once and replays count nothing; an
 *   eager trainer's recorded step work equals what a second eager step counts, and a step-scope
 *   trainer's equals it; the floor worked out by hand; refusals.
 *   `gpu`: the device's peaks measured (finite, > 0) without touching the caller's memory; an
 *   eager step counts on CUDA what it counts on the CPU (the counts are the shapes'). */
#include "testutil.h"

static double delta(const sg_work *a, const sg_work *b, bool flops, sg_work_family f)
{
    return flops ? b->flops[f] - a->flops[f] : b->bytes[f] - a->bytes[f];
}

static double nb(const sg_tensor *t) { return t ? (double)sg_tensor_nbytes(t) : 0; }

static void linear_counts(sg_ctx *ctx)
{
    const int64_t M = tu_randint(1, 9), K = tu_randint(1, 17), N = tu_randint(1, 13);
    sg_tensor *x = tu_tensor2(ctx, SG_DTYPE_F32, M, K, "x"), *w = tu_tensor2(ctx, SG_DTYPE_F32, N, K, "w");
    sg_tensor *b = tu_tensor1(ctx, SG_DTYPE_F32, N, "b"), *y = tu_tensor2(ctx, SG_DTYPE_F32, M, N, "y");
    sg_tensor *dy = tu_tensor2(ctx, SG_DTYPE_F32, M, N, "dy"), *dx = tu_tensor2(ctx, SG_DTYPE_F32, M, K, "dx");
    sg_tensor *dw = tu_tensor2(ctx, SG_DTYPE_F32, N, K, "dw"), *db = tu_tensor1(ctx, SG_DTYPE_F32, N, "db");
    free(tu_random(x, -1, 1)), free(tu_random(w, -1, 1)), free(tu_random(b, -1, 1)), free(tu_random(dy, -1, 1));
    sg_work w0, w1;
    sg_ctx_work(ctx, &w0);
    TU_OK(ctx, sg_linear_forward(ctx, x, w, b, SG_ACT_NONE, y, NULL));
    sg_ctx_work(ctx, &w1);
    const double mnk = 2.0 * M * N * K;
    TU_CHECK(delta(&w0, &w1, true, SG_WORK_MATMUL) == mnk, "forward flops %g, expected %g", delta(&w0, &w1, true, SG_WORK_MATMUL), mnk);
    TU_CHECK(delta(&w0, &w1, false, SG_WORK_MATMUL) == nb(x) + nb(w) + nb(b) + nb(y), "forward bytes %g",
             delta(&w0, &w1, false, SG_WORK_MATMUL));
    for (int f = 0; f < SG_WORK_FAMILIES; f++)
        TU_CHECK(f == SG_WORK_MATMUL || (delta(&w0, &w1, true, f) == 0 && delta(&w0, &w1, false, f) == 0),
                 "the forward counted in family %s", sg_work_family_name((sg_work_family)f));
    sg_ctx_work(ctx, &w0);
    TU_OK(ctx, sg_linear_backward(ctx, x, w, dy, SG_ACT_NONE, NULL, dx, dw, db));
    sg_ctx_work(ctx, &w1);
    TU_CHECK(delta(&w0, &w1, true, SG_WORK_MATMUL) == 2 * mnk, "backward flops %g, expected %g",
             delta(&w0, &w1, true, SG_WORK_MATMUL), 2 * mnk);
    TU_CHECK(delta(&w0, &w1, false, SG_WORK_MATMUL) == nb(x) + nb(w) + nb(dy) + nb(dx) + nb(dw) + nb(db),
             "backward bytes %g", delta(&w0, &w1, false, SG_WORK_MATMUL));
    sg_ctx_work(ctx, &w0);
    TU_OK(ctx, sg_linear_backward(ctx, x, w, dy, SG_ACT_NONE, NULL, NULL, dw, db));
    sg_ctx_work(ctx, &w1);
    TU_CHECK(delta(&w0, &w1, true, SG_WORK_MATMUL) == mnk, "backward without dx: flops %g, expected %g",
             delta(&w0, &w1, true, SG_WORK_MATMUL), mnk);
    /* A refused call counts nothing. */
    sg_tensor *wide = tu_tensor2(ctx, SG_DTYPE_F32, M, N + 1, "wide");
    sg_ctx_work(ctx, &w0);
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b, SG_ACT_NONE, wide, NULL), SG_ERR_SHAPE, "y");
    sg_ctx_work(ctx, &w1);
    TU_CHECK(!memcmp(&w0, &w1, sizeof w0), "a refused call counted work");
    sg_tensor *ts[] = {x, w, b, y, dy, dx, dw, db, wide};
    tu_destroy_all(ts, 9);
}

static void attention_counts(sg_ctx *ctx, bool fused)
{
    const int64_t B = tu_randint(1, 3), T = tu_randint(1, 9), H = tu_randint(1, 3), hs = tu_randint(1, 5), C = H * hs;
    const int64_t q[2] = {B * T, 3 * C}, o[2] = {B * T, C}, l[3] = {B, H, T}, a[4] = {B, H, T, T};
    const int64_t wn = sg_attention_work_elems(B, T, C, (int)H);
    sg_tensor *qkv = tu_tensor(ctx, SG_DTYPE_F32, 2, q, "qkv"), *out = tu_tensor(ctx, SG_DTYPE_F32, 2, o, "out");
    sg_tensor *dout = tu_tensor(ctx, SG_DTYPE_F32, 2, o, "dout"), *dqkv = tu_tensor(ctx, SG_DTYPE_F32, 2, q, "dqkv");
    sg_tensor *sv = fused ? tu_tensor(ctx, SG_DTYPE_F32, 3, l, "lse") : tu_tensor(ctx, SG_DTYPE_F32, 4, a, "att");
    sg_tensor *wk = fused ? tu_tensor(ctx, SG_DTYPE_F32, 3, l, "delta") : tu_tensor1(ctx, SG_DTYPE_F32, wn, "work");
    free(tu_random(qkv, -1, 1)), free(tu_random(dout, -1, 1));
    sg_work w0, w1, w2;
    sg_ctx_work(ctx, &w0);
    if (fused) TU_OK(ctx, sg_attention_fused_forward(ctx, qkv, (int)H, out, sv));
    else TU_OK(ctx, sg_attention_forward(ctx, qkv, (int)H, out, sv, wk));
    sg_ctx_work(ctx, &w1);
    if (fused) TU_OK(ctx, sg_attention_fused_backward(ctx, qkv, out, sv, dout, (int)H, dqkv, wk));
    else TU_OK(ctx, sg_attention_backward(ctx, qkv, sv, dout, (int)H, dqkv, wk));
    sg_ctx_work(ctx, &w2);
    /* q k^T and p v over the T (T + 1) / 2 (query, key) pairs of each head. */
    const double fwd = 2.0 * 2.0 * B * H * (T * (T + 1) / 2.0) * hs;
    TU_CHECK(delta(&w0, &w1, true, SG_WORK_ATTENTION) == fwd && delta(&w1, &w2, true, SG_WORK_ATTENTION) == 2 * fwd,
             "%s attention flops %g and %g, expected %g and %g", fused ? "fused" : "unfused",
             delta(&w0, &w1, true, SG_WORK_ATTENTION), delta(&w1, &w2, true, SG_WORK_ATTENTION), fwd, 2 * fwd);
    const double bf = nb(qkv) + nb(out) + nb(sv), bb = fused ? nb(qkv) + nb(out) + nb(sv) + nb(dout) + nb(dqkv) + nb(wk)
                                                              : nb(qkv) + nb(sv) + nb(dout) + nb(dqkv);
    TU_CHECK(delta(&w0, &w1, false, SG_WORK_ATTENTION) == bf && delta(&w1, &w2, false, SG_WORK_ATTENTION) == bb,
             "%s attention bytes %g and %g, expected %g and %g", fused ? "fused" : "unfused",
             delta(&w0, &w1, false, SG_WORK_ATTENTION), delta(&w1, &w2, false, SG_WORK_ATTENTION), bf, bb);
    sg_tensor *ts[] = {qkv, out, dout, dqkv, sv, wk};
    tu_destroy_all(ts, 6);
}

/* A capture records the ops once (their work counts once); replays count nothing. */
typedef struct {
    sg_ctx *ctx;
    sg_tensor *x, *y;
} gelu_args;

static sg_status gelu_step(void *u)
{
    gelu_args *g = u;
    return sg_gelu_forward(g->ctx, g->x, g->y);
}

static void capture_counts(sg_ctx *ctx)
{
    gelu_args g = {ctx, tu_tensor1(ctx, SG_DTYPE_F32, tu_randint(1, 100), "x"), NULL};
    g.y = tu_tensor1(ctx, SG_DTYPE_F32, g.x->numel, "y");
    free(tu_random(g.x, -1, 1));
    sg_graph_options o = sg_graph_options_default();
    o.warmup = 2;
    sg_work w0, w1, w2;
    sg_ctx_work(ctx, &w0);
    sg_graph *gr = NULL;
    TU_OK(ctx, sg_graph_capture(ctx, gelu_step, &g, &o, &gr));
    sg_ctx_work(ctx, &w1);
    for (int i = 0; i < 3; i++) TU_OK(ctx, sg_graph_replay(gr));
    sg_ctx_work(ctx, &w2);
    const double one = 2 * nb(g.x); /* x read, y written */
    TU_CHECK(delta(&w0, &w1, false, SG_WORK_ELEMENTWISE) == 3 * one,
             "warm-up (2) and capture (1) counted %g bytes, expected %g", delta(&w0, &w1, false, SG_WORK_ELEMENTWISE), 3 * one);
    TU_CHECK(!memcmp(&w1, &w2, sizeof w1), "replays counted work");
    sg_graph_destroy(gr);
    sg_tensor *ts[] = {g.x, g.y};
    tu_destroy_all(ts, 2);
}

/* The step work a trainer records: the same as a second eager step counts, and the same under
 * step scope (replays counting nothing). */
static sg_work trainer_work(sg_ctx *ctx, const char *name, sg_scope scope, int steps)
{
    sg_model *m = NULL;
    sg_optim *o = NULL;
    sg_trainer *t = NULL;
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = scope;
    TU_OK(ctx, sg_model_create(ctx, name, 7, &m));
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
    sg_trainer_stats ts;
    TU_OK(ctx, sg_trainer_get_stats(t, &ts));
    TU_CHECK(!ts.work_counted, "%s %s: work counted before any step", name, sg_scope_name(scope));
    sg_work a, b;
    for (int s = 0; s < steps; s++) {
        sg_ctx_work(ctx, &a);
        TU_OK(ctx, sg_trainer_step(t, s));
        sg_ctx_work(ctx, &b);
    }
    TU_OK(ctx, sg_trainer_get_stats(t, &ts));
    TU_CHECK(ts.work_counted, "%s %s: no work counted", name, sg_scope_name(scope));
    double total = 0;
    for (int f = 0; f < SG_WORK_FAMILIES; f++) total += ts.work.flops[f] + ts.work.bytes[f];
    TU_CHECK(total > 0 && ts.work.flops[SG_WORK_MATMUL] > 0 && ts.work.bytes[SG_WORK_OPTIMIZER] > 0,
             "%s %s: work %g, matmul flops %g, optimizer bytes %g", name, sg_scope_name(scope), total,
             ts.work.flops[SG_WORK_MATMUL], ts.work.bytes[SG_WORK_OPTIMIZER]);
    if (scope == SG_SCOPE_EAGER)
        for (int f = 0; f < SG_WORK_FAMILIES; f++)
            TU_CHECK(ts.work.flops[f] == b.flops[f] - a.flops[f] && ts.work.bytes[f] == b.bytes[f] - a.bytes[f],
                     "%s: family %s: recorded %g flops %g bytes, the last step counted %g and %g", name,
                     sg_work_family_name((sg_work_family)f), ts.work.flops[f], ts.work.bytes[f], b.flops[f] - a.flops[f],
                     b.bytes[f] - a.bytes[f]);
    else
        TU_CHECK(!memcmp(&a, &b, sizeof a), "%s %s: a replayed step counted work", name, sg_scope_name(scope));
    sg_trainer_destroy(t);
    sg_optim_destroy(o);
    sg_model_destroy(m);
    return ts.work;
}

static void trainer_counts(sg_ctx *ctx, const char *name)
{
    sg_work e = trainer_work(ctx, name, SG_SCOPE_EAGER, 2), s = trainer_work(ctx, name, SG_SCOPE_STEP, 6);
    TU_CHECK(!memcmp(&e, &s, sizeof e), "%s: step scope's recorded work differs from eager's", name);
}

static void floor_by_hand(sg_ctx *ctx)
{
    sg_device_peaks p = {.dtype = SG_DTYPE_BF16, .matmul_tflops = 100, .copy_gbps = 1000};
    sg_work w = {{0}, {0}};
    w.flops[SG_WORK_MATMUL] = 1e12, w.bytes[SG_WORK_MATMUL] = 1e9; /* 10 ms of products, 1 of bytes */
    w.flops[SG_WORK_ATTENTION] = 1e10, w.bytes[SG_WORK_ATTENTION] = 3e8; /* 0.1 vs 0.3: bytes bound */
    w.bytes[SG_WORK_NORM] = 2e9, w.bytes[SG_WORK_OPTIMIZER] = 5e8;
    sg_sol f;
    TU_CHECK(sg_sol_floor(&w, &p, &f) == SG_OK, "floor");
    const double want[SG_WORK_FAMILIES] = {10, 0.3, 0, 2, 0, 0, 0.5};
    for (int k = 0; k < SG_WORK_FAMILIES; k++)
        TU_CHECK(fabs(f.family_ms[k] - want[k]) <= 1e-12 * (1 + want[k]), "family %s: %g ms, expected %g",
                 sg_work_family_name((sg_work_family)k), f.family_ms[k], want[k]);
    TU_CHECK(fabs(f.floor_ms - 12.8) <= 1e-12 * 12.8, "floor %g ms, expected 12.8", f.floor_ms);
    p.copy_gbps = 0;
    TU_CHECK(sg_sol_floor(&w, &p, &f) == SG_ERR_INVALID, "zero bandwidth accepted");
    p.copy_gbps = 1000, w.bytes[SG_WORK_LOSS] = -1;
    TU_CHECK(sg_sol_floor(&w, &p, &f) == SG_ERR_INVALID, "negative work accepted");
    TU_CHECK(sg_sol_floor(NULL, &p, &f) == SG_ERR_NULL, "NULL work accepted");
    sg_device_peaks q;
    if (sg_ctx_backend(ctx) == SG_BACKEND_CPU)
        TU_FAILS(ctx, sg_device_peaks_measure(ctx, SG_DTYPE_F32, &q), SG_ERR_UNSUPPORTED, "no device peaks");
    TU_FAILS(ctx, sg_device_peaks_measure(ctx, SG_DTYPE_F64, &q), SG_ERR_INVALID, "expected f32 or bf16");
    TU_CHECK(!strcmp(sg_work_family_name(SG_WORK_OPTIMIZER), "optimizer") &&
             !strcmp(sg_work_family_name((sg_work_family)SG_WORK_FAMILIES), "?"), "family names");
}

static void gpu_peaks(sg_ctx *gpu)
{
    sg_alloc_stats a0, a1;
    TU_OK(gpu, sg_ctx_alloc_stats(gpu, &a0));
    const sg_dtype dts[2] = {SG_DTYPE_BF16, SG_DTYPE_F32};
    for (int i = 0; i < 2; i++) {
        sg_device_peaks p;
        TU_OK(gpu, sg_device_peaks_measure(gpu, dts[i], &p));
        TU_CHECK(isfinite(p.matmul_tflops) && p.matmul_tflops > 0 && isfinite(p.copy_gbps) && p.copy_gbps > 0 &&
                 p.dtype == dts[i] && p.device[0], "%s peaks: %g TFLOP/s, %g GB/s", sg_dtype_name(dts[i]),
                 p.matmul_tflops, p.copy_gbps);
        printf("peaks %s: %.1f TFLOP/s matmul, %.0f GB/s copy on %s\n", sg_dtype_name(dts[i]), p.matmul_tflops,
               p.copy_gbps, p.device);
    }
    TU_OK(gpu, sg_ctx_alloc_stats(gpu, &a1));
    TU_CHECK(a0.bytes_in_use == a1.bytes_in_use && a0.bytes_reserved == a1.bytes_reserved,
             "the caller's memory moved: in use %zu -> %zu, reserved %zu -> %zu", a0.bytes_in_use, a1.bytes_in_use,
             a0.bytes_reserved, a1.bytes_reserved);
}

int main(int argc, char **argv)
{
    sg_backend be;
    if (!tu_start("work", argc, argv, &be)) return TU_SKIP;
    sg_ctx *ctx = tu_ctx(be);
    floor_by_hand(ctx);
    if (be == SG_BACKEND_CPU) {
        linear_counts(ctx);
        attention_counts(ctx, false);
        attention_counts(ctx, true);
        capture_counts(ctx);
        trainer_counts(ctx, "mlp-64-2-32");
        trainer_counts(ctx, "gpt-64-1-2-16");
    } else {
        gpu_peaks(ctx);
        /* The counts are the shapes': an eager step counts on CUDA what it counts on the CPU. */
        sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
        sg_work g = trainer_work(ctx, "mlp-64-2-32", SG_SCOPE_EAGER, 2), c = trainer_work(cpu, "mlp-64-2-32", SG_SCOPE_EAGER, 2);
        TU_CHECK(!memcmp(&g, &c, sizeof g), "an eager step's work differs between CUDA and the CPU");
        sg_ctx_destroy(cpu);
    }
    sg_ctx_destroy(ctx);
    return tu_finish("work");
}
