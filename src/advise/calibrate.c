/* calibrate.c: sg_advise_calibrate: this device's launch path, timed through the library's own
 * calls: eager fills of a one-element tensor are the tiny launch, graphs of 1, 16, 64 and 256
 * of them the tiny graphs (host cost of a launch and a replay, device time per kernel, node and
 * graph launch, capture and instantiate costs, executable-graph memory). docs/advisor.md says
 * how each number is taken. CUDA only: the CPU backend has no launch queue to time. */
#include "advise/advise.h"

#include <math.h>
#include <stdlib.h>

static double clamp0(double v) { return v > 0 ? v : 0; }

/* Least-squares line y = a + b x through n points. */
static void fit_line(const double *x, const double *y, int n, double *a, double *b)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
    double d = n * sxx - sx * sx;
    *b = d != 0 ? (n * sxy - sx * sy) / d : 0;
    *a = (sy - *b * sx) / n;
}

/* A region of n fills of one tensor: what the calibration graphs hold. */
typedef struct fill_region {
    sg_tensor *t;
    int n;
} fill_region;

static sg_status run_fills(void *u)
{
    const fill_region *f = u;
    for (int i = 0; i < f->n; i++) SG_TRY(sg_tensor_fill(f->t, 1.0));
    return SG_OK;
}

#define CALIB_GRAPHS 4
static const int calib_nodes[CALIB_GRAPHS] = {1, 16, 64, 256};
/* Replays per device timing: about 1024 tiny kernels, at most 256 launches. */
static const int calib_replays[CALIB_GRAPHS] = {256, 64, 16, 4};
#define CALIB_EAGER_KERNELS 256
#define CALIB_REPS 5
/* 128 MiB of f32: one fill is a long kernel (~45 us on an H100), so a few dozen of them keep the
 * stream full while the host queues what is timed, and few launches are pending at once. */
#define CALIB_BIG_ELEMS ((int64_t)32 << 20)

typedef struct calib_state {
    sg_ctx *ctx;
    sg_pool *pool, *prev_pool;
    sg_tensor *tiny, *big;      /* (1) F32; (32M) F32, whose fills keep the stream full */
    fill_region region[CALIB_GRAPHS];
    sg_graph *g[CALIB_GRAPHS];
    int blockers;               /* big fills queued ahead of a device timing */
} calib_state;

/* Host time of one eager launch: 200 fills queued back to back, median of 5 runs. */
static sg_status time_launch_host(calib_state *s, double *us)
{
    double v[CALIB_REPS];
    for (int r = 0; r < CALIB_REPS; r++) {
        SG_TRY(sg_ctx_sync(s->ctx));
        double t0 = sg_advise_now_us();
        for (int i = 0; i < 200; i++) SG_TRY(sg_tensor_fill(s->tiny, 1.0));
        v[r] = (sg_advise_now_us() - t0) / 200;
    }
    SG_TRY(sg_ctx_sync(s->ctx));
    *us = sg_median(v, CALIB_REPS);
    return SG_OK;
}

/* Host time of one sg_graph_replay: each of 8 calls after a sync timed alone (a short queue,
 * so no call waits for room), median of 80. */
static sg_status time_replay_host(calib_state *s, sg_graph *g, double *us)
{
    double v[80];
    for (int r = 0; r < 10; r++) {
        SG_TRY(sg_ctx_sync(s->ctx));
        for (int i = 0; i < 8; i++) {
            double t0 = sg_advise_now_us();
            SG_TRY(sg_graph_replay(g));
            v[r * 8 + i] = sg_advise_now_us() - t0;
        }
    }
    SG_TRY(sg_ctx_sync(s->ctx));
    *us = sg_median(v, 80);
    return SG_OK;
}

/* Wall time of: s->blockers long fills, then `count` tiny eager fills (g NULL) or `count`
 * replays of g, synced. The long fills keep the device busy while the host queues the rest,
 * so the rest runs back to back from a full queue: its share of the time is device time.
 * Median of 5. */
static sg_status time_behind_blocker(calib_state *s, int count, sg_graph *g, double *us)
{
    double v[CALIB_REPS];
    for (int r = 0; r < CALIB_REPS; r++) {
        SG_TRY(sg_ctx_sync(s->ctx));
        double t0 = sg_advise_now_us();
        for (int i = 0; i < s->blockers; i++) SG_TRY(sg_tensor_fill(s->big, 0.0));
        for (int i = 0; i < count; i++) SG_TRY(g ? sg_graph_replay(g) : sg_tensor_fill(s->tiny, 1.0));
        SG_TRY(sg_ctx_sync(s->ctx));
        v[r] = sg_advise_now_us() - t0;
    }
    *us = sg_median(v, CALIB_REPS);
    return SG_OK;
}

/* Enough long fills to outlast, three times over, the host's queuing of the longest timed
 * sequence (estimated from the host costs just measured). */
static sg_status size_blocker(calib_state *s, const sg_advise_calib *c)
{
    double queue = CALIB_EAGER_KERNELS * c->launch_host_us;
    for (int i = 0; i < CALIB_GRAPHS; i++) {
        double q = calib_replays[i] * (c->replay_base_us + calib_nodes[i] * c->replay_node_us);
        if (q > queue) queue = q;
    }
    SG_TRY(sg_ctx_sync(s->ctx));
    double t0 = sg_advise_now_us();
    for (int i = 0; i < 8; i++) SG_TRY(sg_tensor_fill(s->big, 0.0));
    SG_TRY(sg_ctx_sync(s->ctx));
    double big_us = (sg_advise_now_us() - t0) / 8;
    double n = ceil((3 * queue + 200) / (big_us > 1 ? big_us : 1));
    s->blockers = n < 4 ? 4 : n > 500 ? 500 : (int)n;
    return SG_OK;
}

/* Device time per tiny eager kernel, per graph node and per graph launch (wall clock, full
 * stream), and the tiny kernel's own duration (CUPTI); the gaps are the differences. */
static sg_status calib_device(calib_state *s, sg_advise_calib *c)
{
    SG_TRY(size_blocker(s, c));
    double t0, te, x[CALIB_GRAPHS], y[CALIB_GRAPHS];
    SG_TRY(time_behind_blocker(s, 0, NULL, &t0));
    SG_TRY(time_behind_blocker(s, CALIB_EAGER_KERNELS, NULL, &te));
    c->eager_kernel_us = clamp0((te - t0) / CALIB_EAGER_KERNELS);
    for (int i = 0; i < CALIB_GRAPHS; i++) {
        double tg;
        SG_TRY(time_behind_blocker(s, calib_replays[i], s->g[i], &tg));
        x[i] = calib_nodes[i];
        y[i] = (tg - t0) / calib_replays[i];
    }
    double a, b;
    fit_line(x, y, CALIB_GRAPHS, &a, &b);
    c->node_device_us = clamp0(b);
    c->graph_gap_us = clamp0(a);

    /* The tiny kernel's duration: CUPTI, over eager fills and two replays of the 64-node graph. */
    sg_prof *p = NULL;
    sg_status st = sg_prof_create(s->ctx, &p);
    if (st == SG_OK) st = sg_ctx_sync(s->ctx);
    if (st == SG_OK) st = sg_prof_start(p);
    if (st == SG_OK) {
        for (int i = 0; i < 64 && st == SG_OK; i++) st = sg_tensor_fill(s->tiny, 1.0);
        for (int i = 0; i < 2 && st == SG_OK; i++) st = sg_graph_replay(s->g[2]);
        sg_status st2 = sg_prof_stop(p, NULL);
        if (st == SG_OK) st = st2;
    }
    double *d = NULL;
    int nd = 0;
    if (st == SG_OK) {
        size_t n = 0;
        const sg_prof_record *r = sg_prof_records(p, &n);
        d = malloc((n ? n : 1) * sizeof *d);
        for (size_t i = 0; d && i < n; i++)
            if (r[i].kind == SG_PROF_KIND_KERNEL && r[i].end_ns > r[i].start_ns)
                d[nd++] = (double)(r[i].end_ns - r[i].start_ns) * 1e-3;
        if (!d) st = sg_fail(s->ctx, SG_ERR_OOM, "sg_advise_calibrate: out of host memory");
        else if (nd == 0) st = sg_fail(s->ctx, SG_ERR_UNSUPPORTED, "CUPTI timed none of the tiny kernels");
    }
    if (st == SG_OK) {
        c->tiny_kernel_us = sg_median(d, nd);
        c->eager_gap_us = clamp0(c->eager_kernel_us - c->tiny_kernel_us);
        c->node_gap_us = clamp0(c->node_device_us - c->tiny_kernel_us);
        c->device_timed = true;
    } else {
        snprintf(c->note, sizeof c->note, "no kernel durations: %s", sg_ctx_last_error(s->ctx));
        c->tiny_kernel_us = c->eager_gap_us = c->node_gap_us = NAN;
    }
    free(d);
    sg_prof_destroy(p);
    return sg_ctx_sync(s->ctx); /* a profiler failure is a note, not an error */
}

static sg_status calib_run(calib_state *s, sg_advise_calib *c)
{
    sg_ctx *ctx = s->ctx;
    SG_TRY(sg_pool_create(ctx, "advise.calibration", &s->pool));
    SG_TRY(sg_ctx_set_pool(ctx, s->pool));
    sg_status st = sg_tensor_create(ctx, SG_DTYPE_F32, 1, (int64_t[]){1}, "calib.tiny", &s->tiny);
    if (st == SG_OK) st = sg_tensor_create(ctx, SG_DTYPE_F32, 1, (int64_t[]){CALIB_BIG_ELEMS}, "calib.big", &s->big);
    sg_ctx_set_pool(ctx, s->prev_pool);
    SG_TRY(st);
    /* Warm: module loading and the first launches' set-up stay out of the timings. */
    for (int i = 0; i < 64; i++) SG_TRY(sg_tensor_fill(s->tiny, 1.0));
    SG_TRY(sg_tensor_fill(s->big, 0.0));
    SG_TRY(sg_ctx_sync(ctx));
    SG_TRY(time_launch_host(s, &c->launch_host_us));

    double x[CALIB_GRAPHS], host[CALIB_GRAPHS], cap[CALIB_GRAPHS], inst[CALIB_GRAPHS], mem[CALIB_GRAPHS];
    for (int i = 0; i < CALIB_GRAPHS; i++) {
        s->region[i] = (fill_region){s->tiny, calib_nodes[i]};
        sg_graph_options o = sg_graph_options_default();
        char name[32];
        snprintf(name, sizeof name, "advise.fills%d", calib_nodes[i]);
        o.name = name;
        o.warmup = 1;
        o.pool = s->pool;
        SG_TRY(sg_graph_capture(ctx, run_fills, &s->region[i], &o, &s->g[i]));
        sg_graph_stats gs;
        SG_TRY(sg_graph_get_stats(s->g[i], &gs));
        for (int k = 0; k < 3; k++) SG_TRY(sg_graph_replay(s->g[i])); /* warm */
        x[i] = gs.nodes;
        cap[i] = gs.capture_ms * 1e3;
        inst[i] = gs.instantiate_ms * 1e3;
        mem[i] = (double)gs.exec_bytes;
        SG_TRY(time_replay_host(s, s->g[i], &host[i]));
    }
    fit_line(x, host, CALIB_GRAPHS, &c->replay_base_us, &c->replay_node_us);
    fit_line(x, cap, CALIB_GRAPHS, &c->capture_base_us, &c->capture_node_us);
    fit_line(x, inst, CALIB_GRAPHS, &c->instantiate_base_us, &c->instantiate_node_us);
    fit_line(x, mem, CALIB_GRAPHS, &c->exec_base_bytes, &c->exec_node_bytes);
    c->replay_base_us = clamp0(c->replay_base_us), c->replay_node_us = clamp0(c->replay_node_us);
    c->capture_base_us = clamp0(c->capture_base_us), c->capture_node_us = clamp0(c->capture_node_us);
    c->instantiate_base_us = clamp0(c->instantiate_base_us);
    c->instantiate_node_us = clamp0(c->instantiate_node_us);
    c->exec_base_bytes = clamp0(c->exec_base_bytes), c->exec_node_bytes = clamp0(c->exec_node_bytes);
    return calib_device(s, c);
}

sg_status sg_advise_calibrate(sg_ctx *ctx, sg_advise_calib *out)
{
    if (!ctx) return sg_fail(NULL, SG_ERR_NULL, "sg_advise_calibrate: ctx is NULL");
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "sg_advise_calibrate: out is NULL");
    memset(out, 0, sizeof *out);
    out->tiny_kernel_us = out->eager_kernel_us = out->node_device_us = NAN;
    out->eager_gap_us = out->node_gap_us = out->graph_gap_us = NAN;
    if (ctx->backend != SG_BACKEND_CUDA)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "sg_advise_calibrate: the advisor times CUDA kernel launches and graph replays, and "
                       "the %s backend has neither; it profiles a CUDA device", sg_backend_name(ctx->backend));
    if (sg_graphs_disabled())
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_advise_calibrate: STEPGRAPH_DISABLE_GRAPHS=1 turns graphs "
                       "off, so there are no replays to time; unset it to advise");
    snprintf(out->device, sizeof out->device, "%s", sg_ctx_device_name(ctx));
    calib_state s = {.ctx = ctx, .prev_pool = ctx->cur_pool};
    sg_status st = calib_run(&s, out);
    char msg[sizeof ctx->msg]; /* the failure's message, before clean-up can overwrite it */
    snprintf(msg, sizeof msg, "%s", ctx->msg);
    sg_ctx_set_pool(ctx, s.prev_pool);
    for (int i = 0; i < CALIB_GRAPHS; i++) sg_graph_destroy(s.g[i]);
    sg_tensor_destroy(s.tiny);
    sg_tensor_destroy(s.big);
    sg_status st2 = sg_pool_destroy(s.pool);
    if (st != SG_OK) return sg_fail(ctx, st, "%s", msg);
    return st2;
}
