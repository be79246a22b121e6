/* advise.c: the capture advisor (advise.h). Three parts: the prediction model, pure arithmetic
 * on a calibration and a profile (tests drive it with hand-made inputs); the calibration, which
 * times tiny fills and graphs of them through the library's own launch path; and the profile
 * and measurement of a real model, which run its trainer eagerly (instrumented by the step's
 * named ranges) and under each scope. Compiled in every build; the device parts refuse the
 * CPU backend. The formulas and their inputs are written out in docs/advisor.md. */
#include "prof/advise.h"
#include "models/model.h"
#include "prof/prof.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n) (sorts v). */
static double median(double *v, int n)
{
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Least-squares line y = a + b x through n points. */
static void fit_line(const double *x, const double *y, int n, double *a, double *b)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
    double d = n * sxx - sx * sx;
    *b = d != 0 ? (n * sxy - sx * sy) / d : 0;
    *a = (sy - *b * sx) / n;
}

static double clamp0(double v) { return v > 0 ? v : 0; }

/* ---- the prediction model ---- */

static sg_status refuse(sg_advise_prediction *out, sg_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static sg_status refuse(sg_advise_prediction *out, sg_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->note, sizeof out->note, fmt, ap);
    va_end(ap);
    return st;
}

typedef struct named_input {
    const char *name;
    double v;
} named_input;

/* The first input that is negative or not finite, or NULL. */
static const named_input *first_bad(const named_input *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(in[i].v) || in[i].v < 0) return &in[i];
    return NULL;
}

static bool region_ok(sg_advise_region r)
{
    return isfinite(r.launches) && r.launches >= 0 && isfinite(r.host_us) && r.host_us >= 0;
}

/* Every input the model reads must be there and sane; the device side may be missing (no
 * CUPTI), which is SG_ERR_UNSUPPORTED rather than a bad argument. */
static sg_status check_inputs(const sg_advise_calib *c, const sg_advise_profile *p, sg_advise_prediction *out)
{
    const named_input host[] = {
        {"calib.launch_host_us", c->launch_host_us},   {"calib.replay_base_us", c->replay_base_us},
        {"calib.replay_node_us", c->replay_node_us},   {"calib.capture_base_us", c->capture_base_us},
        {"calib.capture_node_us", c->capture_node_us}, {"calib.instantiate_base_us", c->instantiate_base_us},
        {"calib.instantiate_node_us", c->instantiate_node_us}, {"calib.exec_base_bytes", c->exec_base_bytes},
        {"calib.exec_node_bytes", c->exec_node_bytes}, {"profile.static_bytes", p->static_bytes},
    };
    const named_input *bad = first_bad(host, sizeof host / sizeof *host);
    if (bad) return refuse(out, SG_ERR_INVALID, "%s is %g: expected a finite value >= 0", bad->name, bad->v);
    if (!(p->wall_ms > 0) || !isfinite(p->wall_ms))
        return refuse(out, SG_ERR_INVALID, "profile.wall_ms is %g: expected the eager step's time, > 0", p->wall_ms);
    if (!(p->step.launches > 0) || !region_ok(p->step))
        return refuse(out, SG_ERR_INVALID, "profile.step is %g launches, %g us: expected a step with launches",
                      p->step.launches, p->step.host_us);
    if (p->n_modules < 0 || p->n_modules > SG_ADVISE_MAX_MODULES)
        return refuse(out, SG_ERR_INVALID, "profile.n_modules is %d: expected 0 to %d", p->n_modules,
                      SG_ADVISE_MAX_MODULES);
    const sg_advise_region *rs[] = {&p->load, &p->forward, &p->backward, &p->load_static};
    const char *rn[] = {"load", "forward", "backward", "load_static"};
    for (int i = 0; i < 4; i++)
        if (!region_ok(*rs[i]))
            return refuse(out, SG_ERR_INVALID, "profile.%s is %g launches, %g us: expected values >= 0", rn[i],
                          rs[i]->launches, rs[i]->host_us);
    for (int i = 0; i < p->n_modules; i++)
        if (!region_ok(p->modules[i].forward) || !region_ok(p->modules[i].backward))
            return refuse(out, SG_ERR_INVALID, "profile.modules[%d] ('%s') has a negative or non-finite region", i,
                          p->modules[i].name);
    double sl = p->load.launches + p->forward.launches + p->backward.launches;
    double sh = p->load.host_us + p->forward.host_us + p->backward.host_us;
    if (sl > p->step.launches * (1 + 1e-9) || sh > p->step.host_us * (1 + 1e-9))
        return refuse(out, SG_ERR_INVALID, "profile: load + forward + backward (%g launches, %g us) exceed the "
                      "step (%g launches, %g us)", sl, sh, p->step.launches, p->step.host_us);
    if (isnan(p->busy_ms) || isnan(p->kernels))
        return refuse(out, SG_ERR_UNSUPPORTED, "the profile has no GPU-busy time or kernel count (%s)",
                      p->note[0] ? p->note : "CUPTI was not available");
    if (!c->device_timed)
        return refuse(out, SG_ERR_UNSUPPORTED, "the calibration has no device timings (%s)",
                      c->note[0] ? c->note : "CUPTI was not available");
    const named_input dev[] = {
        {"profile.busy_ms", p->busy_ms},          {"profile.kernels", p->kernels},
        {"calib.eager_gap_us", c->eager_gap_us}, {"calib.node_gap_us", c->node_gap_us},
        {"calib.graph_gap_us", c->graph_gap_us},
    };
    bad = first_bad(dev, sizeof dev / sizeof *dev);
    if (bad) return refuse(out, SG_ERR_INVALID, "%s is %g: expected a finite value >= 0", bad->name, bad->v);
    return SG_OK;
}

/* What a scope takes over from the eager step: launches C and their host time Hc (us), graph
 * launches G and nodes N per step; load: the batch load is swapped for the static one. */
typedef struct takeover {
    double C, Hc, G, N;
    bool load;
} takeover;

static takeover takeover_of(const sg_advise_profile *p, sg_scope scope, double nu)
{
    takeover t = {0};
    switch (scope) {
    case SG_SCOPE_EAGER: break;
    case SG_SCOPE_LAYER:
        for (int i = 0; i < p->n_modules; i++) {
            t.C += p->modules[i].forward.launches + p->modules[i].backward.launches;
            t.Hc += p->modules[i].forward.host_us + p->modules[i].backward.host_us;
        }
        t.G = 2.0 * p->n_modules;
        t.N = nu * t.C;
        t.load = true;
        break;
    case SG_SCOPE_MODEL:
        t.C = p->forward.launches + p->backward.launches;
        t.Hc = p->forward.host_us + p->backward.host_us;
        t.G = 2;
        t.N = nu * t.C;
        t.load = true;
        break;
    case SG_SCOPE_STEP:
        /* Everything, the batch gather included (it runs inside the graph). */
        t.C = p->step.launches - p->load.launches + p->load_static.launches;
        t.Hc = p->step.host_us - p->load.host_us + p->load_static.host_us;
        t.G = 1;
        t.N = p->step_nodes > 0 ? p->step_nodes : nu * (p->step.launches - p->load.launches) + p->load_static.launches;
        break;
    }
    return t;
}

sg_status sg_advise_predict(const sg_advise_calib *c, const sg_advise_profile *p, sg_scope scope,
                            sg_advise_prediction *out)
{
    if (!out) return SG_ERR_NULL;
    memset(out, 0, sizeof *out);
    out->scope = scope;
    out->capturable = true;
    if (!c || !p) return refuse(out, SG_ERR_NULL, "sg_advise_predict: calibration or profile is NULL");
    if (scope < SG_SCOPE_EAGER || scope > SG_SCOPE_STEP)
        return refuse(out, SG_ERR_INVALID, "scope %d: expected eager, layer, model or step", (int)scope);
    SG_TRY(check_inputs(c, p, out));
    if (scope == SG_SCOPE_LAYER && p->n_modules == 0)
        return refuse(out, SG_ERR_INVALID, "layer scope: the profile has no modules to wrap");

    double W = p->wall_ms, H = p->step.host_us, L = p->step.launches;
    double B = p->busy_ms * 1e3, K = p->kernels;
    double nu = K / L; /* device kernels per launch: a cuBLASLt matmul can be two */
    takeover t = takeover_of(p, scope, nu);
    double host, dev, E;
    if (scope == SG_SCOPE_EAGER) {
        host = H;
        E = K;
        dev = B + K * c->eager_gap_us;
        out->launches = L;
    } else if (scope == SG_SCOPE_STEP) {
        /* One launch; every kernel a node. */
        host = c->replay_base_us + t.N * c->replay_node_us;
        E = 0;
        dev = B + clamp0(t.N - 1) * c->node_gap_us + c->graph_gap_us;
        out->launches = 1;
    } else {
        /* Host: what stays eager keeps its measured cost, the static batch load replaces the
         * eager one, and each graph costs a replay. Device: what stays eager keeps its gaps. */
        double dl = p->load_static.launches - p->load.launches, dh = p->load_static.host_us - p->load.host_us;
        double replay = t.G * c->replay_base_us + t.N * c->replay_node_us;
        host = clamp0(H - t.Hc + dh) + replay;
        if (host < replay) host = replay;
        E = clamp0(nu * (L - t.C - p->load.launches)) + p->load_static.launches;
        dev = B + E * c->eager_gap_us + clamp0(t.N - t.G) * c->node_gap_us + t.G * c->graph_gap_us;
        out->launches = clamp0(L - t.C + dl) + t.G;
    }
    out->host_ms = host / 1e3;
    out->device_ms = dev / 1e3;
    out->host_bound = host >= dev;
    out->step_ms = scope == SG_SCOPE_EAGER ? W : (host > dev ? host : dev) / 1e3;
    out->speedup = W / out->step_ms;
    out->graphs = t.G;
    out->nodes = t.N;
    out->eager_kernels = E;
    if (scope != SG_SCOPE_EAGER) {
        /* Capture re-runs the region's host code, each launch recorded instead of launched. */
        double cap = t.G * c->capture_base_us + t.Hc + t.C * (c->capture_node_us - c->launch_host_us);
        out->capture_ms = (cap > t.G * c->capture_base_us ? cap : t.G * c->capture_base_us) / 1e3;
        out->instantiate_ms = (t.G * c->instantiate_base_us + t.N * c->instantiate_node_us) / 1e3;
        out->extra_bytes = p->static_bytes + t.G * c->exec_base_bytes + t.N * c->exec_node_bytes;
    }
    out->setup_ms = out->capture_ms + out->instantiate_ms;
    out->saving_ms = W - out->step_ms;
    if (scope == SG_SCOPE_EAGER) out->break_even_steps = 0;
    else out->break_even_steps = out->saving_ms > 0 ? out->setup_ms / out->saving_ms : INFINITY;
    if (scope == SG_SCOPE_STEP && p->capture_tried && !p->step_captured) {
        out->capturable = false;
        snprintf(out->note, sizeof out->note, "the trial capture of the step was refused");
    }
    return SG_OK;
}

sg_status sg_advise_summarize(const sg_advise_calib *c, const sg_advise_profile *p,
                              const sg_advise_prediction pred[SG_ADVISE_SCOPES], sg_advise_summary *out)
{
    if (!c || !p || !pred || !out) return SG_ERR_NULL;
    memset(out, 0, sizeof *out);
    for (int s = 0; s < SG_ADVISE_SCOPES; s++)
        if (pred[s].scope != (sg_scope)s || !(pred[s].step_ms > 0)) return SG_ERR_INVALID;
    double W = p->wall_ms;
    out->gpu_utilisation = p->busy_ms / W;
    double share = (W - pred[SG_SCOPE_STEP].device_ms) / W;
    out->launch_share = share < 0 ? 0 : share > 1 ? 1 : share;
    out->short_kernel_share = p->short_kernel_share;
    out->shapes_static = p->shapes_static;
    out->host_syncs = p->capture_tried && !p->step_captured;
    out->best = SG_SCOPE_EAGER;
    out->best_speedup = 1;
    sg_scope fastest = SG_SCOPE_LAYER; /* the fastest captured scope, even when slower than eager */
    for (int s = SG_SCOPE_LAYER; s <= SG_SCOPE_STEP; s++) {
        if (!pred[s].capturable) continue;
        if (!pred[fastest].capturable || pred[s].step_ms < pred[fastest].step_ms) fastest = (sg_scope)s;
        if (pred[s].speedup > out->best_speedup) out->best = (sg_scope)s, out->best_speedup = pred[s].speedup;
    }
    const char *pre = out->host_syncs ? "step scope cannot be captured (a host sync or forbidden call in the "
                                        "step, see the checklist); " : "";
    if (out->best == SG_SCOPE_EAGER)
        snprintf(out->verdict, sizeof out->verdict, "%sgraphs do not help: eager is fastest (%s scope predicted %.2fx)",
                 pre, sg_scope_name(fastest), pred[fastest].speedup);
    else if (out->launch_share > SG_ADVISE_SHARE_PAYS)
        snprintf(out->verdict, sizeof out->verdict, "%slaunch-bound: graphs pay (%s scope predicted %.2fx)", pre,
                 sg_scope_name(out->best), out->best_speedup);
    else if (out->launch_share > SG_ADVISE_SHARE_HELPS)
        snprintf(out->verdict, sizeof out->verdict, "%spartly launch-bound: graphs help a little (%s scope "
                 "predicted %.2fx)", pre, sg_scope_name(out->best), out->best_speedup);
    else
        snprintf(out->verdict, sizeof out->verdict, "%sGPU-bound: graphs barely help (%s scope predicted %.2fx)",
                 pre, sg_scope_name(out->best), out->best_speedup);
    return SG_OK;
}

const char *sg_advise_steps_str(double steps, char *buf, size_t n)
{
    if (isinf(steps) || isnan(steps)) snprintf(buf, n, "never");
    else if (steps <= 0) snprintf(buf, n, "-");
    else snprintf(buf, n, "%.0f", ceil(steps));
    return buf;
}

/* ---- calibration ---- */

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
        double t0 = now_us();
        for (int i = 0; i < 200; i++) SG_TRY(sg_tensor_fill(s->tiny, 1.0));
        v[r] = (now_us() - t0) / 200;
    }
    SG_TRY(sg_ctx_sync(s->ctx));
    *us = median(v, CALIB_REPS);
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
            double t0 = now_us();
            SG_TRY(sg_graph_replay(g));
            v[r * 8 + i] = now_us() - t0;
        }
    }
    SG_TRY(sg_ctx_sync(s->ctx));
    *us = median(v, 80);
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
        double t0 = now_us();
        for (int i = 0; i < s->blockers; i++) SG_TRY(sg_tensor_fill(s->big, 0.0));
        for (int i = 0; i < count; i++) SG_TRY(g ? sg_graph_replay(g) : sg_tensor_fill(s->tiny, 1.0));
        SG_TRY(sg_ctx_sync(s->ctx));
        v[r] = now_us() - t0;
    }
    *us = median(v, CALIB_REPS);
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
    double t0 = now_us();
    for (int i = 0; i < 8; i++) SG_TRY(sg_tensor_fill(s->big, 0.0));
    SG_TRY(sg_ctx_sync(s->ctx));
    double big_us = (now_us() - t0) / 8;
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
        c->tiny_kernel_us = median(d, nd);
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

/* ---- running a model: timed blocks, GPU-busy ---- */

sg_advise_timing sg_advise_timing_default(void)
{
    return (sg_advise_timing){.warmup = 20, .steps = 50, .repeats = 5, .busy_steps = 20};
}

static sg_status check_timing(sg_ctx *ctx, const char *fn, const sg_advise_timing *tm)
{
    if (tm->warmup < 5 || tm->steps < 1 || tm->repeats < 1 || tm->repeats > 1000 || tm->busy_steps < 1)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: warm-up %d, %d steps, %d repeats, %d busy steps: expected a "
                       "warm-up of at least 5 steps (the trainer captures after 3) and at least one step, block "
                       "(up to 1000) and busy step", fn, tm->warmup, tm->steps, tm->repeats, tm->busy_steps);
    return SG_OK;
}

static sg_status run_steps(sg_trainer *t, int64_t *s, int n)
{
    for (int i = 0; i < n; i++) SG_TRY(sg_trainer_step(t, (*s)++));
    return SG_OK;
}

/* Blocks of steps, each synced at the end: wall ms per step (median), host ms per step queuing
 * a block (median), launches per step. */
static sg_status time_blocks(sg_ctx *ctx, sg_trainer *t, const sg_advise_timing *tm, int64_t *s, double *wall,
                             double *host, double *launches)
{
    double *w = calloc((size_t)tm->repeats * 2, sizeof *w);
    if (!w) return sg_fail(ctx, SG_ERR_OOM, "sg_advise: out of host memory timing steps");
    double *h = w + tm->repeats;
    uint64_t k0 = sg_ctx_launch_count(ctx);
    sg_status st = SG_OK;
    for (int r = 0; r < tm->repeats && st == SG_OK; r++) {
        st = sg_ctx_sync(ctx);
        double t0 = now_us();
        if (st == SG_OK) st = run_steps(t, s, tm->steps);
        double t1 = now_us();
        if (st == SG_OK) st = sg_ctx_sync(ctx);
        w[r] = (now_us() - t0) / 1e3 / tm->steps;
        h[r] = (t1 - t0) / 1e3 / tm->steps;
    }
    if (st == SG_OK) {
        *launches = (double)(sg_ctx_launch_count(ctx) - k0) / ((double)tm->repeats * tm->steps);
        *wall = median(w, tm->repeats);
        *host = median(h, tm->repeats);
    }
    free(w);
    return st;
}

/* GPU-busy per step and kernels per step over busy_steps steps. A profiler that cannot run
 * (no CUPTI, another client) leaves NAN and a note; a step that fails is an error. */
static sg_status measure_busy(sg_ctx *ctx, sg_trainer *t, const sg_advise_timing *tm, int64_t *s, double *busy_ms,
                              double *kernels, double *short_share, char *note, size_t note_n)
{
    *busy_ms = *kernels = *short_share = NAN;
    sg_prof *p = NULL;
    sg_prof_result r;
    sg_status pst = sg_prof_create(ctx, &p);
    if (pst == SG_OK) pst = sg_ctx_sync(ctx);
    if (pst == SG_OK) pst = sg_prof_start(p);
    sg_status st = SG_OK;
    if (pst == SG_OK) {
        st = run_steps(t, s, tm->busy_steps);
        pst = sg_prof_stop(p, &r);
    }
    if (st == SG_OK && pst == SG_OK) {
        *busy_ms = r.busy_us / 1e3 / tm->busy_steps;
        *kernels = (double)r.kernels / tm->busy_steps;
        *short_share = r.short_kernel_share;
        if (r.dropped && note)
            snprintf(note, note_n, "CUPTI dropped %llu records: GPU-busy undercounts", (unsigned long long)r.dropped);
    } else if (st == SG_OK && note) {
        snprintf(note, note_n, "%s", sg_ctx_last_error(ctx));
    }
    sg_prof_destroy(p);
    return st;
}

/* ---- the profile: one eager step by region, from its named ranges ---- */

typedef struct range_event {
    char name[80];
    bool push;
    uint64_t launches;
    double t_us;
} range_event;

#define RANGE_EVENTS 1024

typedef struct range_log {
    const sg_ctx *ctx;
    range_event ev[RANGE_EVENTS];
    int n;
    bool overflow;
} range_log;

/* The context's range hook while a probe step runs: the launch counter and the clock at each
 * push and pop. A pop is stamped first and a push last, so the hook's own work stays outside
 * the ranges it times. */
static void range_log_hook(void *user, const char *name, bool push)
{
    range_log *l = user;
    if (l->n == RANGE_EVENTS) {
        l->overflow = true;
        return;
    }
    range_event *e = &l->ev[l->n++];
    if (!push) e->t_us = now_us(), e->launches = l->ctx->launches;
    size_t k = strlen(name);
    if (k >= sizeof e->name) k = sizeof e->name - 1;
    memcpy(e->name, name, k);
    e->name[k] = '\0';
    e->push = push;
    if (push) e->launches = l->ctx->launches, e->t_us = now_us();
}

/* One probe step's regions. */
typedef struct step_split {
    sg_advise_region step, load, forward, backward;
    sg_advise_region fwd[SG_ADVISE_MAX_MODULES], bwd[SG_ADVISE_MAX_MODULES];
} step_split;

static sg_advise_region span(const range_event *a, const range_event *b)
{
    return (sg_advise_region){(double)(b->launches - a->launches), b->t_us - a->t_us};
}

/* Pairs the log's pushes and pops and files each range under its region: "step", the net's
 * "<net>.forward"/".backward", its children's. The load is the stretch from the step's push to
 * the net's forward push. */
static sg_status split_step(sg_ctx *ctx, const range_log *l, const sg_advise_profile *p, const char *net,
                            step_split *out)
{
    memset(out, 0, sizeof *out);
    if (l->overflow)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_advise_profile_model: a step has more than %d named "
                       "ranges", RANGE_EVENTS / 2);
    char fwd[80], bwd[80];
    snprintf(fwd, sizeof fwd, "%s.forward", net);
    snprintf(bwd, sizeof bwd, "%s.backward", net);
    int stack[64], depth = 0, step_push = -1, fwd_push = -1;
    for (int i = 0; i < l->n; i++) {
        const range_event *e = &l->ev[i];
        if (e->push) {
            if (depth == 64)
                return sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_advise_profile_model: ranges nest deeper than 64");
            stack[depth++] = i;
            if (step_push < 0 && !strcmp(e->name, "step")) step_push = i;
            if (fwd_push < 0 && !strcmp(e->name, fwd)) fwd_push = i;
            continue;
        }
        if (depth == 0 || strcmp(l->ev[stack[depth - 1]].name, e->name))
            return sg_fail(ctx, SG_ERR_INVALID, "sg_advise_profile_model: range '%s' popped out of order", e->name);
        sg_advise_region r = span(&l->ev[stack[--depth]], e);
        if (!strcmp(e->name, "step")) out->step = r;
        else if (!strcmp(e->name, fwd)) out->forward = r;
        else if (!strcmp(e->name, bwd)) out->backward = r;
        else
            for (int k = 0; k < p->n_modules; k++) {
                size_t n = strlen(p->modules[k].name);
                if (strncmp(e->name, p->modules[k].name, n)) continue;
                sg_advise_region *to = !strcmp(e->name + n, ".forward")    ? &out->fwd[k]
                                       : !strcmp(e->name + n, ".backward") ? &out->bwd[k]
                                                                           : NULL;
                if (to) to->launches += r.launches, to->host_us += r.host_us;
            }
    }
    if (step_push < 0 || fwd_push < 0 || depth != 0)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_advise_profile_model: the step's ranges ('step', '%s') were not "
                       "all seen", fwd);
    out->load = span(&l->ev[step_push], &l->ev[fwd_push]);
    return SG_OK;
}

#define PROBE_STEPS 7

/* The median over probe steps of the region at byte offset off of a step_split. */
static sg_advise_region median_region(const step_split *sp, size_t off)
{
    double l[PROBE_STEPS], h[PROBE_STEPS];
    for (int i = 0; i < PROBE_STEPS; i++) {
        const sg_advise_region *r = (const sg_advise_region *)((const char *)&sp[i] + off);
        l[i] = r->launches, h[i] = r->host_us;
    }
    return (sg_advise_region){median(l, PROBE_STEPS), median(h, PROBE_STEPS)};
}

/* PROBE_STEPS eager steps, each queued on an idle device with the range log as the context's
 * range hook; the regions are their medians. */
static sg_status probe_regions(sg_ctx *ctx, sg_model *m, sg_trainer *t, int64_t *s, sg_advise_profile *out)
{
    int n = sg_sequential_count(m->net);
    if (n > SG_ADVISE_MAX_MODULES)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_advise_profile_model: '%s' has %d modules; the advisor takes "
                       "up to %d", m->name, n, SG_ADVISE_MAX_MODULES);
    out->n_modules = n;
    for (int i = 0; i < n; i++)
        snprintf(out->modules[i].name, sizeof out->modules[i].name, "%s", sg_sequential_child(m->net, i)->name);
    range_log *log = calloc(1, sizeof *log);
    step_split *sp = calloc(PROBE_STEPS, sizeof *sp);
    if (!log || !sp) {
        free(log), free(sp);
        return sg_fail(ctx, SG_ERR_OOM, "sg_advise_profile_model: out of host memory");
    }
    log->ctx = ctx;
    void (*prev_hook)(void *, const char *, bool) = ctx->range_hook;
    void *prev_user = ctx->range_user;
    sg_status st = SG_OK;
    for (int i = 0; i < PROBE_STEPS && st == SG_OK; i++) {
        st = sg_ctx_sync(ctx);
        log->n = 0, log->overflow = false;
        ctx->range_hook = range_log_hook, ctx->range_user = log;
        if (st == SG_OK) st = sg_trainer_step(t, (*s)++);
        ctx->range_hook = prev_hook, ctx->range_user = prev_user;
        if (st == SG_OK) st = split_step(ctx, log, out, m->net->name, &sp[i]);
    }
    if (st == SG_OK) st = sg_ctx_sync(ctx);
    if (st == SG_OK) {
        out->step = median_region(sp, offsetof(step_split, step));
        out->load = median_region(sp, offsetof(step_split, load));
        out->forward = median_region(sp, offsetof(step_split, forward));
        out->backward = median_region(sp, offsetof(step_split, backward));
        for (int k = 0; k < n; k++) {
            size_t at = (size_t)k * sizeof(sg_advise_region);
            out->modules[k].forward = median_region(sp, offsetof(step_split, fwd) + at);
            out->modules[k].backward = median_region(sp, offsetof(step_split, bwd) + at);
        }
    }
    free(log), free(sp);
    return st;
}

/* Static inputs (what captured scopes give the model): the bytes they add, and the batch load
 * with them (a copy into them where eager steps only rebound views). */
static sg_status probe_static_load(sg_ctx *ctx, sg_model *m, int64_t *s, sg_advise_profile *out)
{
    sg_alloc_stats a0, a1;
    SG_TRY(sg_ctx_alloc_stats(ctx, &a0));
    SG_TRY(sg_model_use_static_inputs(m));
    SG_TRY(sg_ctx_alloc_stats(ctx, &a1));
    out->static_bytes = a1.bytes_in_use > a0.bytes_in_use ? (double)(a1.bytes_in_use - a0.bytes_in_use) : 0;
    double h[PROBE_STEPS], l = 0;
    for (int i = 0; i < PROBE_STEPS; i++) {
        SG_TRY(sg_ctx_sync(ctx));
        uint64_t k0 = sg_ctx_launch_count(ctx);
        double t0 = now_us();
        SG_TRY(sg_model_load_batch(m, (*s)++));
        h[i] = now_us() - t0;
        l = (double)(sg_ctx_launch_count(ctx) - k0);
    }
    SG_TRY(sg_ctx_sync(ctx));
    out->load_static = (sg_advise_region){l, median(h, PROBE_STEPS)};
    return SG_OK;
}

/* Tries to capture the step as the trainer's step scope does: a host sync or another call
 * forbidden during capture (data-dependent control flow reads device values) is refused with
 * SG_ERR_CAPTURE, which is reported, not returned. */
static sg_status trial_capture(sg_model *m, sg_optim *o, int64_t *s, sg_advise_profile *out)
{
    if (sg_graphs_disabled()) {
        snprintf(out->capture_error, sizeof out->capture_error, "not tried: STEPGRAPH_DISABLE_GRAPHS=1");
        return SG_OK;
    }
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = SG_SCOPE_STEP;
    to.warmup = 1;
    sg_trainer *t = NULL;
    SG_TRY(sg_trainer_create(m, o, &to, &t));
    sg_status st = sg_trainer_step(t, (*s)++);
    if (st == SG_OK) st = sg_trainer_step(t, (*s)++); /* captures, then replays */
    out->capture_tried = true;
    if (st == SG_OK) {
        sg_trainer_stats ts;
        st = sg_trainer_get_stats(t, &ts);
        out->step_captured = st == SG_OK && ts.graphs > 0;
        out->step_nodes = ts.nodes;
    } else if (st == SG_ERR_CAPTURE) {
        snprintf(out->capture_error, sizeof out->capture_error, "%s", sg_ctx_last_error(m->ctx));
        st = SG_OK;
    }
    if (st == SG_OK) st = sg_ctx_sync(m->ctx);
    sg_trainer_destroy(t);
    return st;
}

sg_status sg_advise_profile_model(sg_ctx *ctx, const char *name, const sg_model_options *mo,
                                  const sg_advise_timing *tm, sg_advise_profile *out)
{
    if (!ctx) return sg_fail(NULL, SG_ERR_NULL, "sg_advise_profile_model: ctx is NULL");
    if (!name || !out) return sg_fail(ctx, SG_ERR_NULL, "sg_advise_profile_model: name or out is NULL");
    memset(out, 0, sizeof *out);
    out->busy_ms = out->kernels = out->short_kernel_share = NAN;
    if (ctx->backend != SG_BACKEND_CUDA)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "sg_advise_profile_model: the %s backend has no kernel launches or GPU-busy time to "
                       "profile; the advisor profiles a CUDA device", sg_backend_name(ctx->backend));
    sg_advise_timing t = tm ? *tm : sg_advise_timing_default();
    SG_TRY(check_timing(ctx, "sg_advise_profile_model", &t));
    snprintf(out->model, sizeof out->model, "%s", name);
    out->precision = mo ? mo->precision : SG_DTYPE_F32;
    out->shapes_static = true; /* fixed batch and length: the advisor does not vary shapes */
    sg_model *m = NULL;
    sg_optim *o = NULL;
    sg_trainer *tr = NULL;
    int64_t s = 0;
    sg_status st = sg_model_create_ex(ctx, name, 1, mo, &m);
    if (st == SG_OK) st = sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o);
    if (st == SG_OK) st = sg_trainer_create(m, o, NULL, &tr);
    if (st == SG_OK) st = run_steps(tr, &s, t.warmup);
    if (st == SG_OK) st = time_blocks(ctx, tr, &t, &s, &out->wall_ms, &out->block_host_ms, &out->launches);
    if (st == SG_OK) st = probe_regions(ctx, m, tr, &s, out);
    if (st == SG_OK)
        st = measure_busy(ctx, tr, &t, &s, &out->busy_ms, &out->kernels, &out->short_kernel_share, out->note,
                          sizeof out->note);
    sg_trainer_destroy(tr);
    if (st == SG_OK) st = probe_static_load(ctx, m, &s, out);
    if (st == SG_OK) st = trial_capture(m, o, &s, out);
    sg_optim_destroy(o);
    sg_model_destroy(m);
    return st;
}

/* ---- measurement ---- */

sg_status sg_advise_measure(sg_ctx *ctx, const char *name, const sg_model_options *mo, sg_scope scope,
                            const sg_advise_timing *tm, sg_advise_measurement *out)
{
    if (!ctx) return sg_fail(NULL, SG_ERR_NULL, "sg_advise_measure: ctx is NULL");
    if (!name || !out) return sg_fail(ctx, SG_ERR_NULL, "sg_advise_measure: name or out is NULL");
    memset(out, 0, sizeof *out);
    out->scope = scope;
    out->busy_ms = NAN;
    if (ctx->backend != SG_BACKEND_CUDA)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_advise_measure: the advisor measures on a CUDA device, not "
                       "the %s backend", sg_backend_name(ctx->backend));
    if (scope < SG_SCOPE_EAGER || scope > SG_SCOPE_STEP)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_advise_measure: scope %d: expected eager, layer, model or step",
                       (int)scope);
    sg_advise_timing t = tm ? *tm : sg_advise_timing_default();
    SG_TRY(check_timing(ctx, "sg_advise_measure", &t));
    sg_alloc_stats a0, a1;
    SG_TRY(sg_ctx_alloc_stats(ctx, &a0));
    sg_model *m = NULL;
    sg_optim *o = NULL;
    sg_trainer *tr = NULL;
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = scope;
    int64_t s = 0;
    sg_status st = sg_model_create_ex(ctx, name, 1, mo, &m);
    if (st == SG_OK) st = sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o);
    if (st == SG_OK) st = sg_trainer_create(m, o, &to, &tr);
    if (st == SG_OK) st = run_steps(tr, &s, t.warmup);
    if (st == SG_OK) st = time_blocks(ctx, tr, &t, &s, &out->step_ms, &out->host_ms, &out->launches);
    if (st == SG_OK) {
        double k, sh;
        st = measure_busy(ctx, tr, &t, &s, &out->busy_ms, &k, &sh, NULL, 0);
    }
    if (st == SG_OK) st = sg_ctx_alloc_stats(ctx, &a1);
    if (st == SG_OK) {
        sg_trainer_stats ts;
        st = sg_trainer_get_stats(tr, &ts);
        out->graphs = ts.graphs, out->nodes = ts.nodes;
        out->capture_ms = ts.capture_ms, out->instantiate_ms = ts.instantiate_ms;
        out->exec_bytes = (double)ts.exec_bytes;
        out->fell_back = ts.fell_back != 0;
        snprintf(out->fallback_reason, sizeof out->fallback_reason, "%s", ts.fallback_reason);
        out->bytes = a1.bytes_in_use > a0.bytes_in_use ? (double)(a1.bytes_in_use - a0.bytes_in_use) : 0;
    }
    sg_trainer_destroy(tr);
    sg_optim_destroy(o);
    sg_model_destroy(m);
    return st;
}
