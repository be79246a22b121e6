/* predict.c: the capture advisor's prediction model (stepgraph.h: sg_advise_predict,
 * sg_advise_summarize): pure arithmetic over a calibration of the device's launch path and a
 * profile of a model's eager steps, both measured by src/advise/. Tests drive it with inputs
 * whose answers are worked out by hand; the formulas are written out in docs/advisor.md. */
#include "core/core.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

static double clamp0(double v) { return v > 0 ? v : 0; }

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
    if (p->accum < 0 || p->accum > 1024)
        return refuse(out, SG_ERR_INVALID, "profile.accum is %d: expected 0 to 1024 micro-batches a step", p->accum);
    if (p->steps_per_call < 0 || p->steps_per_call > 1024 || (p->loop != 0 && p->loop != 1))
        return refuse(out, SG_ERR_INVALID, "profile.steps_per_call %d, loop %d: expected 0 to 1024 steps a launch "
                      "and loop 0 or 1", p->steps_per_call, p->loop);
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
 * launches G and nodes N per step; load: the batch load is swapped for the static one; R: the
 * replays of each graph a step (the micro-batches under layer and model scope, else 1), so that
 * capture, instantiation and memory count each graph once. */
typedef struct takeover {
    double C, Hc, G, N, R;
    bool load;
} takeover;

static takeover takeover_of(const sg_advise_profile *p, sg_scope scope, double nu)
{
    takeover t = {0};
    double K = p->accum > 1 ? p->accum : 1; /* micro-batches a step: each replays the graphs */
    t.R = scope == SG_SCOPE_LAYER || scope == SG_SCOPE_MODEL ? K : 1;
    switch (scope) {
    case SG_SCOPE_EAGER: break;
    case SG_SCOPE_LAYER:
        for (int i = 0; i < p->n_modules; i++) {
            t.C += p->modules[i].forward.launches + p->modules[i].backward.launches;
            t.Hc += p->modules[i].forward.host_us + p->modules[i].backward.host_us;
        }
        t.G = 2.0 * p->n_modules * K;
        t.N = nu * t.C;
        t.load = true;
        break;
    case SG_SCOPE_MODEL:
        t.C = p->forward.launches + p->backward.launches;
        t.Hc = p->forward.host_us + p->backward.host_us;
        t.G = 2 * K;
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
    /* Step scope: S steps a launch, its graph S copies of the step's N nodes or (loop) one WHILE
     * body of N; the launch's host cost and gap are shared by the S steps. */
    double S = scope == SG_SCOPE_STEP && p->steps_per_call > 1 ? p->steps_per_call : 1;
    bool loop = S > 1 && p->loop;
    double Ng = loop ? t.N : S * t.N;
    if (scope == SG_SCOPE_EAGER) {
        host = H;
        E = K;
        dev = B + K * c->eager_gap_us;
        out->launches = L;
    } else if (scope == SG_SCOPE_STEP) {
        /* One launch (of S steps); every kernel a node. A loop's turn costs a graph launch's gap. */
        host = (c->replay_base_us + Ng * c->replay_node_us) / S;
        E = 0;
        dev = loop ? B + clamp0(t.N - 1) * c->node_gap_us + c->graph_gap_us + c->graph_gap_us / S
                   : B + clamp0(Ng - 1) / S * c->node_gap_us + c->graph_gap_us / S;
        out->launches = 1 / S;
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
    out->graphs = t.G / S;
    out->nodes = t.N;
    out->eager_kernels = E;
    if (scope != SG_SCOPE_EAGER) {
        /* Capture re-runs the region's host code, each launch recorded instead of launched; one
         * micro-batch's worth of graphs is captured, instantiated and held. */
        double G = t.G / t.R, N = (scope == SG_SCOPE_STEP ? Ng : t.N) / t.R;
        double cap = G * c->capture_base_us + (t.Hc + t.C * (c->capture_node_us - c->launch_host_us)) / t.R;
        cap = cap > G * c->capture_base_us ? cap : G * c->capture_base_us;
        if (S > 1 && !loop) cap = c->capture_base_us + S * (cap - c->capture_base_us); /* S steps recorded */
        out->capture_ms = cap / 1e3;
        out->instantiate_ms = (G * c->instantiate_base_us + N * c->instantiate_node_us) / 1e3;
        out->extra_bytes = p->static_bytes + G * c->exec_base_bytes + N * c->exec_node_bytes;
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

/* ---- generation: a token's cost in each sg_gen_mode ---- */

sg_status sg_advise_gen_predict(const sg_advise_calib *c, const sg_advise_gen_profile *p, sg_gen_mode mode,
                                sg_advise_gen_mode *out)
{
    if (!c || !p || !out) return SG_ERR_NULL;
    out->mode = mode;
    out->predicted = 0;
    out->host_us = out->device_us = out->sync_us = out->predicted_ms = 0;
    out->note[0] = '\0';
    if (mode < SG_GEN_EAGER || mode > SG_GEN_LOOP) {
        snprintf(out->note, sizeof out->note, "mode %d: expected SG_GEN_EAGER, _STEP or _LOOP", (int)mode);
        return SG_ERR_INVALID;
    }
    const named_input in[] = {
        {"profile.launches", p->launches},   {"profile.nodes", p->nodes},
        {"profile.host_us", p->host_us},     {"profile.replay_us", p->replay_us},
        {"profile.graph_us", p->graph_us},   {"profile.readback_us", p->readback_us},
    };
    const named_input *bad = first_bad(in, sizeof in / sizeof *in);
    if (bad) {
        snprintf(out->note, sizeof out->note, "%s is %g: expected a finite value >= 0", bad->name, bad->v);
        return SG_ERR_INVALID;
    }
    /* Without device timings (no CUPTI, the CPU backend) the gaps are unknown: count them 0. */
    double eg = 0, ng = 0, gg = 0, nd = 0;
    if (c->device_timed) {
        const named_input dev[] = {{"calib.eager_gap_us", c->eager_gap_us}, {"calib.node_gap_us", c->node_gap_us},
                                   {"calib.graph_gap_us", c->graph_gap_us},
                                   {"calib.node_device_us", c->node_device_us}};
        bad = first_bad(dev, sizeof dev / sizeof *dev);
        if (bad) {
            snprintf(out->note, sizeof out->note, "%s is %g: expected a finite value >= 0", bad->name, bad->v);
            return SG_ERR_INVALID;
        }
        eg = c->eager_gap_us, ng = c->node_gap_us, gg = c->graph_gap_us, nd = c->node_device_us;
    }
    const double D = p->graph_us, S = p->readback_us;
    switch (mode) {
    case SG_GEN_EAGER:
        /* The host queues the step while the device runs it; then the flag read waits. */
        out->host_us = p->host_us;
        out->device_us = clamp0(D - gg - p->nodes * ng + p->launches * eg);
        out->sync_us = S;
        out->predicted_ms = ((out->host_us > out->device_us ? out->host_us : out->device_us) + S) / 1e3;
        break;
    case SG_GEN_STEP:
        /* One replay, the graph, then the flag read: in series. */
        out->host_us = p->replay_us, out->device_us = D, out->sync_us = S;
        out->predicted_ms = (p->replay_us + D + S) / 1e3;
        break;
    case SG_GEN_LOOP:
        if (!isfinite(p->while_turn_us) || p->while_turn_us < 0) {
            snprintf(out->note, sizeof out->note, isnan(p->while_turn_us)
                     ? "no WHILE turn timed: capture here cannot make WHILE nodes, so loop mode does not run"
                     : "profile.while_turn_us is %g: expected a finite value >= 0", p->while_turn_us);
            return isnan(p->while_turn_us) ? SG_OK : SG_ERR_INVALID;
        }
        /* The body on the device, a turn's own cost instead of a graph launch; no host. */
        out->device_us = clamp0(D - gg) + clamp0(p->while_turn_us - nd);
        out->predicted_ms = out->device_us / 1e3;
        break;
    }
    out->predicted = 1;
    if (!c->device_timed)
        snprintf(out->note, sizeof out->note, "launch gaps counted 0: the calibration has no device timings (%.180s)",
                 c->note[0] ? c->note : "none taken");
    return SG_OK;
}

/* ---- speed of light ---- */

sg_status sg_sol_floor(const sg_work *w, const sg_device_peaks *p, sg_sol *out)
{
    if (!w || !p || !out) return SG_ERR_NULL;
    memset(out, 0, sizeof *out);
    if (!(isfinite(p->matmul_tflops) && p->matmul_tflops > 0 && isfinite(p->copy_gbps) && p->copy_gbps > 0))
        return SG_ERR_INVALID;
    for (int f = 0; f < SG_WORK_FAMILIES; f++) {
        if (!(isfinite(w->flops[f]) && w->flops[f] >= 0 && isfinite(w->bytes[f]) && w->bytes[f] >= 0))
            return SG_ERR_INVALID;
        double c = w->flops[f] / (p->matmul_tflops * 1e12), b = w->bytes[f] / (p->copy_gbps * 1e9);
        out->family_ms[f] = 1e3 * (c > b ? c : b);
        out->floor_ms += out->family_ms[f];
    }
    return SG_OK;
}
