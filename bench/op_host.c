/* op_host.c: the ops of one mlp training step, timed one by one: host microseconds per call
 * (queuing only, no sync) and wall microseconds per call with the device synced at the end,
 * for each op of mlp-W-D-B. Validation first: every op's output must be finite.
 *   build/bench/op_host [WIDTH] [BATCH] [CALLS]  */
#include "stepgraph.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

#define SG_TRY_OP(call)                                                                      \
    do {                                                                                      \
        sg_status st_ = (call);                                                               \
        if (st_ != SG_OK) return st_;                                                         \
    } while (0)

#define CHECK(call)                                                                           \
    do {                                                                                      \
        if ((call) != SG_OK) {                                                                \
            fprintf(stderr, "op_host: %s: %s\n", #call, sg_ctx_last_error(ctx));              \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static sg_ctx *ctx;

static sg_tensor *tensor(sg_dtype dt, int64_t r, int64_t c, double lo, double hi)
{
    sg_tensor *t;
    int64_t s[2] = {r, c};
    CHECK(sg_tensor_create(ctx, dt, 2, s, "t", &t));
    size_t n = (size_t)(r * c);
    if (dt == SG_DTYPE_I32) {
        int32_t *v = malloc(n * 4);
        for (size_t i = 0; i < n; i++) v[i] = (int32_t)(rand() % (int)hi);
        CHECK(sg_tensor_copy_from_host(t, v, n * 4));
        free(v);
    } else {
        float *v = malloc(n * 4);
        for (size_t i = 0; i < n; i++) v[i] = (float)(lo + (hi - lo) * rand() / (double)RAND_MAX);
        CHECK(sg_tensor_copy_from_host(t, v, n * 4));
        free(v);
    }
    return t;
}

typedef struct fill_step {
    sg_tensor *t;
    int n;
} fill_step;

/* A region of n tiny kernels, to time graph launches of a known size. */
static sg_status fill_fn(void *u)
{
    fill_step *f = u;
    for (int i = 0; i < f->n; i++) SG_TRY_OP(sg_tensor_fill(f->t, i));
    return SG_OK;
}

/* Host and wall microseconds per replay of a graph of n kernel nodes. */
static void time_graph(sg_tensor *t, int n, int calls)
{
    fill_step f = {t, n};
    sg_graph *g;
    CHECK(sg_graph_capture(ctx, fill_fn, &f, NULL, &g));
    for (int i = 0; i < 20; i++) CHECK(sg_graph_replay(g));
    CHECK(sg_ctx_sync(ctx));
    double t0 = now_us();
    for (int i = 0; i < calls; i++) CHECK(sg_graph_replay(g));
    double t1 = now_us();
    CHECK(sg_ctx_sync(ctx));
    double t2 = now_us();
    char name[64];
    snprintf(name, sizeof name, "graph replay, %d nodes", n);
    printf("%-28s %12.2f %12.2f %10.1f\n", name, (t1 - t0) / calls, (t2 - t0) / calls, 1.0);
    sg_graph_destroy(g);
}

typedef enum { OP_FWD_RELU, OP_FWD_HEAD, OP_XENT, OP_BWD_RELU_DX, OP_BWD_FIRST, OP_RELU, OP_FILL, OP_COUNT } op_id;
static const char *names[] = {"linear fwd +bias+relu", "linear fwd head (N=10)", "softmax_xent",
                              "linear bwd relu (dx,dw,db)", "linear bwd first (dw,db)", "relu (eltwise)",
                              "fill (tiny kernel)"};

int main(int argc, char **argv)
{
    int64_t W = argc > 1 ? atoll(argv[1]) : 512, B = argc > 2 ? atoll(argv[2]) : 32;
    int calls = argc > 3 ? atoi(argv[3]) : 2000;
    sg_ctx_options o = sg_ctx_options_default();
    if (sg_ctx_create(&o, &ctx) != SG_OK) {
        fprintf(stderr, "op_host: %s\n", sg_ctx_last_error(NULL));
        return 1;
    }
    sg_tensor *x = tensor(SG_DTYPE_F32, B, W, -1, 1), *w = tensor(SG_DTYPE_F32, W, W, -0.05, 0.05);
    sg_tensor *b = tensor(SG_DTYPE_F32, 1, W, -0.05, 0.05), *y = tensor(SG_DTYPE_F32, B, W, 0, 1);
    sg_tensor *wh = tensor(SG_DTYPE_F32, 10, W, -0.05, 0.05), *bh = tensor(SG_DTYPE_F32, 1, 10, 0, 0.1);
    sg_tensor *lg = tensor(SG_DTYPE_F32, B, 10, -1, 1), *dl = tensor(SG_DTYPE_F32, B, 10, 0, 1);
    sg_tensor *tg2 = tensor(SG_DTYPE_I32, 1, B, 0, 10), *loss2 = tensor(SG_DTYPE_F32, 1, 1, 0, 1), *tg, *loss;
    int64_t one = 1;
    CHECK(sg_tensor_view(tg2, 0, 1, &B, "targets", &tg));
    CHECK(sg_tensor_view(loss2, 0, 1, &one, "loss", &loss));
    sg_tensor *dy = tensor(SG_DTYPE_F32, B, W, -1, 1), *dx = tensor(SG_DTYPE_F32, B, W, 0, 1);
    sg_tensor *dw = tensor(SG_DTYPE_F32, W, W, 0, 1), *db = tensor(SG_DTYPE_F32, 1, W, 0, 1);
    sg_tensor *bv, *dbv, *bhv;
    CHECK(sg_tensor_view(b, 0, 1, &W, "b", &bv));
    CHECK(sg_tensor_view(db, 0, 1, &W, "db", &dbv));
    int64_t ten = 10;
    CHECK(sg_tensor_view(bh, 0, 1, &ten, "bh", &bhv));
    printf("op_host: %s, W=%lld B=%lld, %d calls each\n", sg_ctx_device_name(ctx), (long long)W,
           (long long)B, calls);
    printf("%-28s %12s %12s %10s\n", "op", "host us/call", "wall us/call", "launches");
    for (int op = 0; op < OP_COUNT; op++) {
        for (int pass = 0; pass < 2; pass++) { /* pass 0: warm-up (plans, scratch) */
            int n = pass ? calls : 20;
            CHECK(sg_ctx_sync(ctx));
            uint64_t k0 = sg_ctx_launch_count(ctx);
            double t0 = now_us();
            for (int i = 0; i < n; i++) {
                switch (op) {
                case OP_FWD_RELU: CHECK(sg_linear_forward(ctx, x, w, bv, SG_ACT_RELU, y, NULL)); break;
                case OP_FWD_HEAD: CHECK(sg_linear_forward(ctx, x, wh, bhv, SG_ACT_NONE, lg, NULL)); break;
                case OP_XENT: CHECK(sg_softmax_xent(ctx, lg, tg, 1.f, loss, dl)); break;
                case OP_BWD_RELU_DX: CHECK(sg_linear_backward(ctx, x, w, dy, SG_ACT_RELU, y, dx, dw, dbv)); break;
                case OP_BWD_FIRST: CHECK(sg_linear_backward(ctx, x, w, dy, SG_ACT_NONE, NULL, NULL, dw, dbv)); break;
                case OP_RELU: CHECK(sg_relu_forward(ctx, x, y)); break;
                case OP_FILL: CHECK(sg_tensor_fill(dx, 1.0)); break;
                }
            }
            double t1 = now_us();
            CHECK(sg_ctx_sync(ctx));
            double t2 = now_us();
            if (pass)
                printf("%-28s %12.2f %12.2f %10.1f\n", names[op], (t1 - t0) / n, (t2 - t0) / n,
                       (double)(sg_ctx_launch_count(ctx) - k0) / n);
        }
    }
    time_graph(dx, 1, calls);
    time_graph(dx, 44, calls);
    float l;
    CHECK(sg_tensor_copy_to_host(loss, &l, 4));
    if (!isfinite(l)) {
        fprintf(stderr, "op_host: loss is not finite\n");
        return 1;
    }
    sg_ctx_destroy(ctx); /* frees every tensor with its pools */
    return 0;
}
