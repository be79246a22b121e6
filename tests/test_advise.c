/* test_advise.c: the capture advisor, through the public API (stepgraph.h). `cpu`: the
 * prediction model on synthetic calibrations and profiles whose answers are worked out by hand
 * below (a launch-bound and a GPU-bound step), break-even and "never", the verdict,
 * monotonicity (capturing more launches never predicts a slower host), and argument errors,
 * including sg_advise's clear refusal on the CPU backend before the model is ever built; steps
 * a launch (steps_per_call, unrolled or a loop) predicted by hand, and the trainer options the
 * advisor takes or refuses by name, and the optimizer state's dtype. `gpu`:
 * the calibration gives plausible values and leaves nothing allocated; sg_advise runs end to
 * end on mlp-64-2-32 built by a factory of the test's own (profile, finite predictions, every
 * scope measured beside its prediction, the progress stages in order), then again by name,
 * predicting only with the calibration reused; then with 4 steps a launch in a loop, measured
 * per optimizer step. */
#define _GNU_SOURCE /* sched_getcpu, pthread_getaffinity_np */
#include "testutil.h"

#include <pthread.h>
#include <sched.h>

/* Relative closeness for hand-computed values (the model is double arithmetic throughout). */
static void check_close(const char *what, double got, double want)
{
    TU_CHECK(fabs(got - want) <= 1e-9 * (1 + fabs(want)), "%s: got %.12g, expected %.12g", what, got, want);
}

/* The cores the calling thread may run on (-1: unknown). */
static int allowed_cpus(void)
{
    cpu_set_t m;
    return pthread_getaffinity_np(pthread_self(), sizeof m, &m) ? -1 : CPU_COUNT(&m);
}

/* ---- synthetic inputs ---- */

/* Round numbers close to an H100's: 4 us per eager launch, replay 2 us + 0.5 us/node. */
static sg_advise_calib calib_synthetic(void)
{
    sg_advise_calib c;
    memset(&c, 0, sizeof c);
    c.launch_host_us = 4, c.replay_base_us = 2, c.replay_node_us = 0.5;
    c.tiny_kernel_us = 0.7, c.eager_kernel_us = 1.7, c.node_device_us = 1.0;
    c.eager_gap_us = 1.0, c.node_gap_us = 0.3, c.graph_gap_us = 2.0;
    c.capture_base_us = 100, c.capture_node_us = 2;
    c.instantiate_base_us = 50, c.instantiate_node_us = 5;
    c.exec_base_bytes = 0, c.exec_node_bytes = 1024;
    c.device_timed = true;
    return c;
}

/* An mlp-like step: 30 launches (40 kernels: nu = 4/3) queued in 290 us, 140 us of GPU work,
 * 0.300 ms a step: launch-bound. Two modules; the loss and optimizer take 2 launches, 19 us. */
static sg_advise_profile profile_launch_bound(void)
{
    sg_advise_profile p;
    memset(&p, 0, sizeof p);
    snprintf(p.model, sizeof p.model, "synthetic-launch-bound");
    p.wall_ms = 0.300, p.block_host_ms = 0.295, p.launches = 30;
    p.busy_ms = 0.140, p.kernels = 40, p.short_kernel_share = 1;
    p.step = (sg_advise_region){30, 290};
    p.load = (sg_advise_region){0, 1};
    p.forward = (sg_advise_region){12, 120};
    p.backward = (sg_advise_region){16, 150};
    p.n_modules = 2;
    for (int i = 0; i < 2; i++) {
        snprintf(p.modules[i].name, sizeof p.modules[i].name, "layers.%d", i);
        p.modules[i].forward = (sg_advise_region){6, 60};
        p.modules[i].backward = (sg_advise_region){8, 75};
    }
    p.load_static = (sg_advise_region){2, 8};
    p.static_bytes = 4096;
    p.capture_tried = p.step_captured = true;
    p.step_nodes = 0; /* estimated: nu * 30 + 2 = 42 */
    p.shapes_static = true;
    return p;
}

/* A gpt-768-like step: 31.6 ms, 30.95 ms of it GPU-busy, 467 launches queued in 5 ms. */
static sg_advise_profile profile_gpu_bound(void)
{
    sg_advise_profile p;
    memset(&p, 0, sizeof p);
    snprintf(p.model, sizeof p.model, "synthetic-gpu-bound");
    p.wall_ms = 31.6, p.block_host_ms = 30.5, p.launches = 467;
    p.busy_ms = 30.95, p.kernels = 600, p.short_kernel_share = 0.4;
    p.step = (sg_advise_region){467, 5000};
    p.load = (sg_advise_region){1, 10};
    p.forward = (sg_advise_region){150, 1600};
    p.backward = (sg_advise_region){300, 3200};
    p.n_modules = 3;
    for (int i = 0; i < 3; i++) {
        snprintf(p.modules[i].name, sizeof p.modules[i].name, "blocks.%d", i);
        p.modules[i].forward = (sg_advise_region){50, 500};
        p.modules[i].backward = (sg_advise_region){100, 1000};
    }
    p.load_static = (sg_advise_region){1, 10};
    p.capture_tried = p.step_captured = true;
    p.step_nodes = 610;
    p.shapes_static = true;
    return p;
}

static void predict_all(const sg_advise_calib *c, const sg_advise_profile *p, sg_advise_prediction *pr)
{
    for (int s = 0; s < SG_ADVISE_SCOPES; s++) {
        sg_status st = sg_advise_predict(c, p, (sg_scope)s, &pr[s]);
        TU_CHECK(st == SG_OK, "predict %s: %s (%s)", sg_scope_name((sg_scope)s), sg_status_name(st), pr[s].note);
    }
}

/* ---- cpu ---- */

/* Every number below is the formula of docs/advisor.md evaluated by hand. */
static void cpu_launch_bound(void)
{
    sg_advise_calib c = calib_synthetic();
    sg_advise_profile p = profile_launch_bound();
    sg_advise_prediction pr[SG_ADVISE_SCOPES];
    predict_all(&c, &p, pr);
    char buf[32];

    /* eager: the profiled wall time; components: host 290 us, device 140 + 40 kernels x 1 us. */
    check_close("eager step_ms", pr[0].step_ms, 0.300);
    check_close("eager speedup", pr[0].speedup, 1);
    check_close("eager host_ms", pr[0].host_ms, 0.290);
    check_close("eager device_ms", pr[0].device_ms, (140 + 40 * 1.0) / 1e3);
    check_close("eager setup_ms", pr[0].setup_ms, 0);
    TU_CHECK(!strcmp(sg_advise_steps_str(pr[0].break_even_steps, buf, sizeof buf), "-"), "eager break-even '%s'", buf);

    /* step: N = 4/3 * 30 + 2 = 42 nodes; host = 2 + 42 * 0.5 = 23 us; device = 140 + 41 * 0.3
     * + 2 = 154.3 us; capture = 100 + (290 - 1 + 8) + 32 * (2 - 4) = 333 us; instantiate = 50 +
     * 42 * 5 = 260 us; extra = 4096 + 42 * 1024 bytes. */
    const sg_advise_prediction *q = &pr[SG_SCOPE_STEP];
    check_close("step nodes", q->nodes, 42);
    check_close("step host_ms", q->host_ms, 0.023);
    check_close("step device_ms", q->device_ms, (140 + 41 * 0.3 + 2) / 1e3);
    check_close("step step_ms", q->step_ms, 0.1543);
    TU_CHECK(!q->host_bound, "step scope should be device-bound");
    check_close("step speedup", q->speedup, 0.300 / 0.1543);
    check_close("step capture_ms", q->capture_ms, 0.333);
    check_close("step instantiate_ms", q->instantiate_ms, 0.260);
    check_close("step break-even = setup / saving", q->break_even_steps, (0.333 + 0.260) / (0.300 - 0.1543));
    TU_CHECK(!strcmp(sg_advise_steps_str(q->break_even_steps, buf, sizeof buf), "5"), "step break-even '%s'", buf);
    check_close("step extra_bytes", q->extra_bytes, 4096 + 42 * 1024);
    check_close("step launches", q->launches, 1);

    /* model: C = 28 launches captured (270 us), G = 2, N = 4/3 * 28; the static load adds 2
     * launches and 7 us. host = (290 - 270 + 7) + 2 * 2 + N * 0.5; eager kernels E = 4/3 * 2 + 2;
     * device = 140 + E * 1 + (N - 2) * 0.3 + 2 * 2. */
    double N = 4.0 / 3.0 * 28, E = 4.0 / 3.0 * 2 + 2;
    q = &pr[SG_SCOPE_MODEL];
    check_close("model nodes", q->nodes, N);
    check_close("model eager kernels", q->eager_kernels, E);
    check_close("model host_ms", q->host_ms, (27 + 4 + N * 0.5) / 1e3);
    check_close("model device_ms", q->device_ms, (140 + E + (N - 2) * 0.3 + 4) / 1e3);
    check_close("model step_ms", q->step_ms, (140 + E + (N - 2) * 0.3 + 4) / 1e3);
    check_close("model launches", q->launches, 30 - 28 + 2 + 2);
    check_close("model capture_ms", q->capture_ms, (200 + 270 + 28 * (2 - 4)) / 1e3);
    check_close("model instantiate_ms", q->instantiate_ms, (100 + N * 5) / 1e3);

    /* layer: the same launches in 4 graphs: host + 2 * 2 us, device + 2 graph gaps - 2 node gaps. */
    q = &pr[SG_SCOPE_LAYER];
    check_close("layer host_ms", q->host_ms, (27 + 8 + N * 0.5) / 1e3);
    check_close("layer device_ms", q->device_ms, (140 + E + (N - 4) * 0.3 + 8) / 1e3);
    check_close("layer capture_ms", q->capture_ms, (400 + 270 + 28 * (2 - 4)) / 1e3);
    check_close("layer instantiate_ms", q->instantiate_ms, (200 + N * 5) / 1e3);
    TU_CHECK(pr[SG_SCOPE_STEP].step_ms < pr[SG_SCOPE_MODEL].step_ms &&
             pr[SG_SCOPE_MODEL].step_ms < pr[SG_SCOPE_LAYER].step_ms &&
             pr[SG_SCOPE_LAYER].step_ms < pr[SG_SCOPE_EAGER].step_ms,
             "launch-bound: expected step < model < layer < eager");

    /* The checklist and the verdict. */
    sg_advise_summary s;
    TU_CHECK(sg_advise_summarize(&c, &p, pr, &s) == SG_OK, "summarize");
    check_close("gpu utilisation", s.gpu_utilisation, 0.140 / 0.300);
    check_close("launch share", s.launch_share, (0.300 - 0.1543) / 0.300);
    TU_CHECK(s.best == SG_SCOPE_STEP && !s.host_syncs && s.shapes_static, "best %s", sg_scope_name(s.best));
    char want[160];
    snprintf(want, sizeof want, "launch-bound: graphs pay (step scope predicted %.2fx)", 0.300 / 0.1543);
    TU_CHECK(!strcmp(s.verdict, want), "verdict '%s', expected '%s'", s.verdict, want);

    /* A known node count (a trial capture) replaces the estimate. */
    p.step_nodes = 44;
    sg_advise_prediction q44;
    TU_CHECK(sg_advise_predict(&c, &p, SG_SCOPE_STEP, &q44) == SG_OK, "predict with step_nodes");
    check_close("step device with 44 nodes", q44.device_ms, (140 + 43 * 0.3 + 2) / 1e3);
    check_close("step host with 44 nodes", q44.host_ms, (2 + 44 * 0.5) / 1e3);
}

static void cpu_gpu_bound(void)
{
    sg_advise_calib c = calib_synthetic();
    sg_advise_profile p = profile_gpu_bound();
    sg_advise_prediction pr[SG_ADVISE_SCOPES];
    predict_all(&c, &p, pr);
    /* step: device = 30950 + 609 * 0.3 + 2 us; host = 2 + 610 * 0.5 us (far less). */
    check_close("gpu-bound step_ms", pr[SG_SCOPE_STEP].step_ms, (30950 + 609 * 0.3 + 2) / 1e3);
    for (int s = SG_SCOPE_LAYER; s <= SG_SCOPE_STEP; s++) {
        TU_CHECK(fabs(pr[s].speedup - 1) < 0.03, "gpu-bound %s scope: speedup %.4f, expected within 3%% of 1",
                 sg_scope_name((sg_scope)s), pr[s].speedup);
        TU_CHECK(!pr[s].host_bound, "gpu-bound %s scope predicted host-bound", sg_scope_name((sg_scope)s));
    }
    sg_advise_summary s;
    TU_CHECK(sg_advise_summarize(&c, &p, pr, &s) == SG_OK, "summarize");
    TU_CHECK(s.launch_share <= SG_ADVISE_SHARE_HELPS, "launch share %.4f", s.launch_share);
    TU_CHECK(!strncmp(s.verdict, "GPU-bound: graphs barely help (", 31), "verdict '%s'", s.verdict);
}

/* Nothing saved: break-even is infinite and printed "never"; the verdict says eager wins. */
static void cpu_no_saving(void)
{
    sg_advise_calib c = calib_synthetic();
    sg_advise_profile p = profile_gpu_bound();
    sg_advise_prediction q, pr[SG_ADVISE_SCOPES];
    TU_CHECK(sg_advise_predict(&c, &p, SG_SCOPE_STEP, &q) == SG_OK, "predict");
    p.wall_ms = q.step_ms; /* eager exactly as fast as the step graph: a saving of zero */
    TU_CHECK(sg_advise_predict(&c, &p, SG_SCOPE_STEP, &q) == SG_OK, "predict");
    check_close("zero saving", q.saving_ms, 0);
    TU_CHECK(isinf(q.break_even_steps) && q.break_even_steps > 0, "break-even %g, expected infinity",
             q.break_even_steps);
    char buf[32];
    TU_CHECK(!strcmp(sg_advise_steps_str(q.break_even_steps, buf, sizeof buf), "never"), "printed '%s'", buf);
    p.wall_ms = 31.0; /* eager faster than any graph */
    predict_all(&c, &p, pr);
    for (int s = SG_SCOPE_LAYER; s <= SG_SCOPE_STEP; s++)
        TU_CHECK(pr[s].saving_ms < 0 && isinf(pr[s].break_even_steps), "%s scope: saving %g, break-even %g",
                 sg_scope_name((sg_scope)s), pr[s].saving_ms, pr[s].break_even_steps);
    sg_advise_summary s;
    TU_CHECK(sg_advise_summarize(&c, &p, pr, &s) == SG_OK, "summarize");
    TU_CHECK(s.best == SG_SCOPE_EAGER && !strncmp(s.verdict, "graphs do not help: eager is fastest", 36),
             "verdict '%s'", s.verdict);
}

/* Capturing more of the step's launches never predicts a slower host: each captured launch
 * trades its eager host cost (9 us here) for nu * 0.5 us of replay. */
static void cpu_monotonic(void)
{
    sg_advise_calib c = calib_synthetic();
    sg_advise_profile p = profile_launch_bound();
    p.step = (sg_advise_region){30, 270}, p.load = (sg_advise_region){0, 0};
    double prev_model = INFINITY, prev_layer = INFINITY;
    for (int j = 0; j <= 30; j++) {
        int f = j / 2, b = j - f;
        p.forward = (sg_advise_region){f, 9.0 * f};
        p.backward = (sg_advise_region){b, 9.0 * b};
        p.modules[0].forward = p.forward, p.modules[0].backward = p.backward;
        p.modules[1].forward = p.modules[1].backward = (sg_advise_region){0, 0};
        sg_advise_prediction m, l;
        TU_CHECK(sg_advise_predict(&c, &p, SG_SCOPE_MODEL, &m) == SG_OK, "model, %d captured: %s", j, m.note);
        TU_CHECK(sg_advise_predict(&c, &p, SG_SCOPE_LAYER, &l) == SG_OK, "layer, %d captured: %s", j, l.note);
        TU_CHECK(m.host_ms <= prev_model + 1e-12, "model scope: %d launches captured predicts host %.6f ms, "
                 "%d predicted %.6f", j, m.host_ms, j - 1, prev_model);
        TU_CHECK(l.host_ms <= prev_layer + 1e-12, "layer scope: %d launches captured predicts host %.6f ms, "
                 "%d predicted %.6f", j, l.host_ms, j - 1, prev_layer);
        prev_model = m.host_ms, prev_layer = l.host_ms;
    }
    sg_advise_prediction st;
    TU_CHECK(sg_advise_predict(&c, &p, SG_SCOPE_STEP, &st) == SG_OK, "step");
    TU_CHECK(st.host_ms <= prev_model, "step scope host %.6f ms above model scope's %.6f with every launch captured",
             st.host_ms, prev_model);
}

/* A step the trial capture refused: step scope is flagged, the verdict says so, and the best
 * scope is another. */
static void cpu_host_sync(void)
{
    sg_advise_calib c = calib_synthetic();
    sg_advise_profile p = profile_launch_bound();
    p.step_captured = false;
    snprintf(p.capture_error, sizeof p.capture_error, "sg_tensor_copy_to_host: a host read during capture");
    sg_advise_prediction pr[SG_ADVISE_SCOPES];
    predict_all(&c, &p, pr);
    TU_CHECK(!pr[SG_SCOPE_STEP].capturable && pr[SG_SCOPE_MODEL].capturable, "capturable flags");
    sg_advise_summary s;
    TU_CHECK(sg_advise_summarize(&c, &p, pr, &s) == SG_OK, "summarize");
    TU_CHECK(s.host_syncs && s.best == SG_SCOPE_MODEL, "host_syncs %d, best %s", s.host_syncs, sg_scope_name(s.best));
    TU_CHECK(strstr(s.verdict, "step scope cannot be captured") && strstr(s.verdict, "model scope predicted"),
             "verdict '%s'", s.verdict);
}

/* Gradient accumulation: the launch-bound profile read as a whole step of 3 micro-batches.
 * Step scope's graph holds all of them: nothing changes. Layer and model scope replay their
 * graphs once a micro-batch: 3 times the graph launches a step (host: 2 us each, device: a graph
 * gap instead of a node gap each); capture, instantiation and memory are one micro-batch's: a
 * third of the nodes and of the captured host work, the graphs once. */
static void cpu_accum(void)
{
    sg_advise_calib c = calib_synthetic();
    sg_advise_profile p = profile_launch_bound();
    sg_advise_prediction one[SG_ADVISE_SCOPES], pr[SG_ADVISE_SCOPES];
    predict_all(&c, &p, one);
    p.accum = 3;
    predict_all(&c, &p, pr);
    check_close("accum: step step_ms", pr[SG_SCOPE_STEP].step_ms, one[SG_SCOPE_STEP].step_ms);
    check_close("accum: step capture_ms", pr[SG_SCOPE_STEP].capture_ms, one[SG_SCOPE_STEP].capture_ms);
    double N = 4.0 / 3.0 * 28, E = 4.0 / 3.0 * 2 + 2;
    const sg_advise_prediction *q = &pr[SG_SCOPE_MODEL];
    check_close("accum: model graphs", q->graphs, 6);
    check_close("accum: model nodes", q->nodes, N);
    check_close("accum: model host_ms", q->host_ms, (27 + 6 * 2 + N * 0.5) / 1e3);
    check_close("accum: model device_ms", q->device_ms, (140 + E + (N - 6) * 0.3 + 6 * 2) / 1e3);
    check_close("accum: model launches", q->launches, 30 - 28 + 2 + 6);
    check_close("accum: model capture_ms", q->capture_ms, (200 + (270 + 28 * (2 - 4)) / 3.0) / 1e3);
    check_close("accum: model instantiate_ms", q->instantiate_ms, (100 + N / 3 * 5) / 1e3);
    check_close("accum: model extra_bytes", q->extra_bytes, 4096 + N / 3 * 1024);
    q = &pr[SG_SCOPE_LAYER];
    check_close("accum: layer graphs", q->graphs, 12);
    check_close("accum: layer host_ms", q->host_ms, (27 + 12 * 2 + N * 0.5) / 1e3);
    check_close("accum: layer capture_ms", q->capture_ms, (400 + (270 + 28 * (2 - 4)) / 3.0) / 1e3);
    check_close("accum: layer instantiate_ms", q->instantiate_ms, (200 + N / 3 * 5) / 1e3);
    p.accum = -1;
    sg_advise_prediction bad;
    TU_CHECK(sg_advise_predict(&c, &p, SG_SCOPE_MODEL, &bad) == SG_ERR_INVALID && strstr(bad.note, "accum"),
             "accum -1: %s", bad.note);
}

/* A result to fill (the struct is large: on the heap); the test stops when there is no memory. */
static sg_advise_result *new_result(void)
{
    sg_advise_result *r = malloc(sizeof *r);
    TU_CHECK(r != NULL, "out of memory");
    if (!r) exit(1);
    return r;
}

/* A factory of the test's own: counts its calls and builds mlp-64-2-32. */
static sg_status count_factory(sg_ctx *ctx, void *user, sg_model **out)
{
    ++*(int *)user;
    return sg_model_create_ex(ctx, "mlp-64-2-32", 1, NULL, out);
}

/* Steps a launch (profile.steps_per_call and loop, docs/advisor.md): the launch-bound
 * profile's step graph of N = 42 nodes, 4 steps a launch. Unrolled: the launch holds 168 nodes,
 * host (2 + 168 x 0.5) / 4 = 21.5 us a step; device 140 + 167 / 4 x 0.3 + 2 / 4 = 153.025 us;
 * capture 100 + 4 x (333 - 100) = 1032 us; instantiate 50 + 168 x 5 = 890 us. Loop: one body of
 * 42 nodes, host (2 + 21) / 4 = 5.75 us; device 140 + 41 x 0.3 + 2 + 2 / 4 = 154.8 us (a graph
 * launch's gap a turn); capture and instantiate the one-step graph's. One step a launch changes
 * nothing, and neither does another scope. */
static sg_advise_prediction step_with(const sg_advise_calib *c, sg_advise_profile p, int steps, int loop,
                                      sg_scope scope)
{
    sg_advise_prediction q;
    p.steps_per_call = steps, p.loop = loop;
    TU_CHECK(sg_advise_predict(c, &p, scope, &q) == SG_OK, "predict %s, %d steps a launch, loop %d: %s",
             sg_scope_name(scope), steps, loop, q.note);
    return q;
}

static void cpu_calls(void)
{
    sg_advise_calib c = calib_synthetic();
    sg_advise_profile p = profile_launch_bound();
    sg_advise_prediction one = step_with(&c, p, 0, 0, SG_SCOPE_STEP), q = step_with(&c, p, 1, 1, SG_SCOPE_STEP);
    TU_CHECK(!memcmp(&q, &one, sizeof q), "one step a launch changed the prediction");
    q = step_with(&c, p, 4, 0, SG_SCOPE_STEP);
    check_close("unrolled host_ms", q.host_ms, 21.5 / 1e3);
    check_close("unrolled device_ms", q.device_ms, 153.025 / 1e3);
    check_close("unrolled step_ms", q.step_ms, 153.025 / 1e3);
    TU_CHECK(!q.host_bound, "unrolled: device-bound expected");
    check_close("unrolled speedup", q.speedup, 0.300 / 0.153025);
    check_close("unrolled launches", q.launches, 0.25);
    check_close("unrolled graphs", q.graphs, 0.25);
    check_close("unrolled nodes a step", q.nodes, 42);
    check_close("unrolled capture_ms", q.capture_ms, 1.032);
    check_close("unrolled instantiate_ms", q.instantiate_ms, 0.890);
    check_close("unrolled extra_bytes", q.extra_bytes, 4096 + 168 * 1024);
    check_close("unrolled break-even", q.break_even_steps, (1.032 + 0.890) / (0.300 - 0.153025));
    q = step_with(&c, p, 4, 1, SG_SCOPE_STEP);
    check_close("loop host_ms", q.host_ms, 5.75 / 1e3);
    check_close("loop device_ms", q.device_ms, 154.8 / 1e3);
    check_close("loop step_ms", q.step_ms, 154.8 / 1e3);
    check_close("loop capture_ms", q.capture_ms, one.capture_ms);
    check_close("loop instantiate_ms", q.instantiate_ms, one.instantiate_ms);
    check_close("loop extra_bytes", q.extra_bytes, one.extra_bytes);
    check_close("loop launches", q.launches, 0.25);
    /* Almost no GPU work: the host bounds the step, and K shares its launch. */
    sg_advise_profile tiny = p;
    tiny.busy_ms = 0.001;
    q = step_with(&c, tiny, 4, 0, SG_SCOPE_STEP);
    TU_CHECK(q.host_bound, "tiny GPU work: host-bound expected (host %g, device %g ms)", q.host_ms, q.device_ms);
    check_close("host-bound step_ms", q.step_ms, 21.5 / 1e3);
    sg_advise_prediction m = step_with(&c, p, 0, 0, SG_SCOPE_MODEL), m4 = step_with(&c, p, 4, 1, SG_SCOPE_MODEL);
    TU_CHECK(!memcmp(&m, &m4, sizeof m), "model scope changed by steps a launch");
    p.steps_per_call = 1025;
    TU_CHECK(sg_advise_predict(&c, &p, SG_SCOPE_STEP, &q) == SG_ERR_INVALID && strstr(q.note, "steps_per_call"),
             "steps_per_call 1025: %s", q.note);
    p.steps_per_call = 4, p.loop = 2;
    TU_CHECK(sg_advise_predict(&c, &p, SG_SCOPE_STEP, &q) == SG_ERR_INVALID && strstr(q.note, "loop 2"),
             "loop 2: %s", q.note);
}

/* The trainer options sg_advise takes (then refused on the CPU backend, after the check: the
 * CUDA refusal) and those it refuses by name before anything runs. */
static void cpu_trainer_options(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    sg_advise_result *r = new_result();
    int built = 0;
    int64_t lens[] = {8, 16};
    sg_advise_options o = sg_advise_options_default();
    sg_trainer_options to = sg_trainer_options_default();
    o.trainer = &to;
    to.loop = 1, to.steps_per_call = 4;
    TU_FAILS(ctx, sg_advise(ctx, count_factory, &built, &o, r), SG_ERR_UNSUPPORTED, "profiles a CUDA device");
    TU_CHECK(r->options.trainer == NULL, "the result keeps the caller's trainer pointer");
    to.vary_seq = 1, to.seq_buckets = lens, to.n_seq_buckets = 2, to.skip_if = 1, to.stop_nonfinite = 3;
    TU_FAILS(ctx, sg_advise(ctx, count_factory, &built, &o, r), SG_ERR_UNSUPPORTED, "profiles a CUDA device");
    struct {
        const char *what, *needle;
        sg_trainer_options to;
        int accum;
    } bad[8];
    for (int i = 0; i < 8; i++) bad[i].to = sg_trainer_options_default(), bad[i].accum = 1;
    bad[0].what = "steps_per_call -1", bad[0].needle = "trainer.steps_per_call -1", bad[0].to.steps_per_call = -1;
    bad[1].what = "steps_per_call 2000", bad[1].needle = "trainer.steps_per_call 2000",
    bad[1].to.steps_per_call = 2000;
    bad[2].what = "loop 2", bad[2].needle = "trainer.loop 2", bad[2].to.loop = 2;
    bad[3].what = "vary_seq without buckets", bad[3].needle = "trainer.vary_seq 1 with 0 seq_buckets",
    bad[3].to.vary_seq = 1;
    bad[4].what = "buckets without vary_seq", bad[4].needle = "trainer.vary_seq 0 with 2 seq_buckets",
    bad[4].to.seq_buckets = lens, bad[4].to.n_seq_buckets = 2;
    bad[5].what = "stop_loss NaN", bad[5].needle = "trainer.stop_nonfinite 0, stop_loss nan",
    bad[5].to.stop_on_loss = 1, bad[5].to.stop_loss = NAN;
    bad[6].what = "batch buckets", bad[6].needle = "trainer.batch_buckets", bad[6].to.batch_buckets = lens,
    bad[6].to.n_buckets = 2;
    bad[7].what = "vary_seq with accum 2", bad[7].needle = "trainer.vary_seq with accum 2", bad[7].to.vary_seq = 1,
    bad[7].to.seq_buckets = lens, bad[7].to.n_seq_buckets = 2, bad[7].accum = 2;
    for (int i = 0; i < 8; i++) {
        o = sg_advise_options_default();
        o.trainer = &bad[i].to, o.accum = bad[i].accum;
        sg_status st = sg_advise(ctx, count_factory, &built, &o, r);
        const char *msg = sg_ctx_last_error(ctx);
        TU_CHECK(st == SG_ERR_INVALID && strstr(msg, bad[i].needle) && strstr(msg, "sg_advise:"),
                 "%s: %s '%s', expected SG_ERR_INVALID naming '%s'", bad[i].what, sg_status_name(st), msg,
                 bad[i].needle);
    }
    TU_CHECK(built == 0, "the factory was called %d times on the CPU backend", built);
    free(r);
    sg_ctx_destroy(ctx);
}

/* The optimizer state's dtype (optim_state): F32 by default; BF16 taken (then refused on the
 * CPU backend, after the check: the CUDA refusal) and kept in the result's options; any other
 * dtype refused by name before anything runs, the context usable afterwards. */
static void cpu_optim_state(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    sg_advise_result *r = new_result();
    int built = 0;
    sg_advise_options o = sg_advise_options_default();
    TU_CHECK(o.optim_state == SG_DTYPE_F32, "sg_advise_options_default: optim_state %s",
             sg_dtype_name(o.optim_state));
    o.optim_state = SG_DTYPE_BF16;
    TU_FAILS(ctx, sg_advise(ctx, count_factory, &built, &o, r), SG_ERR_UNSUPPORTED, "profiles a CUDA device");
    TU_CHECK(r->options.optim_state == SG_DTYPE_BF16, "the result's options: optim_state %s",
             sg_dtype_name(r->options.optim_state));
    const sg_dtype bad[] = {SG_DTYPE_I32, SG_DTYPE_F64, (sg_dtype)-1, (sg_dtype)7};
    for (int i = 0; i < 4; i++) {
        o = sg_advise_options_default();
        o.optim_state = bad[i];
        sg_status st = sg_advise(ctx, count_factory, &built, &o, r);
        const char *msg = sg_ctx_last_error(ctx);
        TU_CHECK(st == SG_ERR_INVALID && strstr(msg, "sg_advise: optim_state") &&
                 strstr(msg, "sg_advise_options.optim_state"),
                 "optim_state %d: %s '%s', expected SG_ERR_INVALID naming optim_state", (int)bad[i],
                 sg_status_name(st), msg);
        st = sg_advise_name(ctx, "mlp-64-2-32", NULL, &o, r);
        TU_CHECK(st == SG_ERR_INVALID && strstr(sg_ctx_last_error(ctx), "optim_state"),
                 "sg_advise_name, optim_state %d: %s '%s'", (int)bad[i], sg_status_name(st), sg_ctx_last_error(ctx));
    }
    /* The context still works: a valid run reaches the CPU backend's refusal again. */
    o = sg_advise_options_default();
    TU_FAILS(ctx, sg_advise(ctx, count_factory, &built, &o, r), SG_ERR_UNSUPPORTED, "profiles a CUDA device");
    TU_CHECK(built == 0, "the factory was called %d times on the CPU backend", built);
    free(r);
    sg_ctx_destroy(ctx);
}

static void expect_refusal(const char *what, const sg_advise_calib *c, const sg_advise_profile *p, sg_scope scope,
                           sg_status want, const char *needle)
{
    sg_advise_prediction q;
    sg_status st = sg_advise_predict(c, p, scope, &q);
    TU_CHECK(st == want, "%s: %s, expected %s (%s)", what, sg_status_name(st), sg_status_name(want), q.note);
    TU_CHECK(strstr(q.note, needle) != NULL, "%s: note '%s' lacks '%s'", what, q.note, needle);
}

static void cpu_errors(void)
{
    sg_advise_calib c = calib_synthetic();
    sg_advise_profile p = profile_launch_bound();
    sg_advise_prediction q, pr[SG_ADVISE_SCOPES];
    TU_CHECK(sg_advise_predict(&c, &p, SG_SCOPE_STEP, NULL) == SG_ERR_NULL, "NULL out");
    expect_refusal("NULL calibration", NULL, &p, SG_SCOPE_STEP, SG_ERR_NULL, "NULL");
    expect_refusal("NULL profile", &c, NULL, SG_SCOPE_STEP, SG_ERR_NULL, "NULL");
    expect_refusal("scope 9", &c, &p, (sg_scope)9, SG_ERR_INVALID, "scope 9");
    sg_advise_calib c2 = c;
    c2.launch_host_us = -1;
    expect_refusal("negative launch cost", &c2, &p, SG_SCOPE_STEP, SG_ERR_INVALID, "calib.launch_host_us");
    c2 = c;
    c2.replay_node_us = NAN;
    expect_refusal("NaN replay cost", &c2, &p, SG_SCOPE_STEP, SG_ERR_INVALID, "calib.replay_node_us");
    c2 = c;
    c2.device_timed = false;
    snprintf(c2.note, sizeof c2.note, "no CUPTI in this build");
    expect_refusal("no device timings", &c2, &p, SG_SCOPE_MODEL, SG_ERR_UNSUPPORTED, "no CUPTI in this build");
    sg_advise_profile p2 = p;
    p2.busy_ms = NAN;
    expect_refusal("no GPU-busy", &c, &p2, SG_SCOPE_STEP, SG_ERR_UNSUPPORTED, "GPU-busy");
    p2 = p;
    p2.wall_ms = 0;
    expect_refusal("zero wall", &c, &p2, SG_SCOPE_STEP, SG_ERR_INVALID, "profile.wall_ms");
    p2 = p;
    p2.forward.launches = 20;
    expect_refusal("regions beyond the step", &c, &p2, SG_SCOPE_MODEL, SG_ERR_INVALID, "exceed the step");
    p2 = p;
    p2.n_modules = 0;
    expect_refusal("layer without modules", &c, &p2, SG_SCOPE_LAYER, SG_ERR_INVALID, "no modules");
    p2.n_modules = SG_ADVISE_MAX_MODULES + 1;
    expect_refusal("too many modules", &c, &p2, SG_SCOPE_EAGER, SG_ERR_INVALID, "n_modules");
    TU_CHECK(sg_advise_predict(&c, &p, SG_SCOPE_EAGER, &q) == SG_OK, "eager");

    sg_advise_summary s;
    predict_all(&c, &p, pr);
    TU_CHECK(sg_advise_summarize(NULL, &p, pr, &s) == SG_ERR_NULL, "summarize NULL");
    pr[2].scope = SG_SCOPE_STEP;
    TU_CHECK(sg_advise_summarize(&c, &p, pr, &s) == SG_ERR_INVALID, "summarize with scopes out of order");

    /* The device parts: NULLs, a timing it cannot run, and a clear refusal on the CPU backend,
     * before any model is built. */
    sg_advise_calib cal;
    TU_CHECK(sg_advise_calibrate(NULL, &cal) == SG_ERR_NULL, "calibrate NULL ctx");
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    TU_FAILS(ctx, sg_advise_calibrate(ctx, NULL), SG_ERR_NULL, "out is NULL");
    TU_FAILS(ctx, sg_advise_calibrate(ctx, &cal), SG_ERR_UNSUPPORTED, "profiles a CUDA device");
    sg_advise_result *r = new_result();
    int built = 0;
    sg_advise_options o = sg_advise_options_default();
    TU_CHECK(o.warmup == 20 && o.steps == 50 && o.repeats == 5 && o.busy_steps == 20 && o.measure == 1 &&
             !o.calib && !o.progress && o.hold_cpu == 1, "sg_advise_options_default");
    TU_CHECK(sg_advise(NULL, count_factory, &built, NULL, r) == SG_ERR_NULL, "sg_advise NULL ctx");
    TU_FAILS(ctx, sg_advise(ctx, NULL, &built, NULL, r), SG_ERR_NULL, "factory or out is NULL");
    TU_FAILS(ctx, sg_advise(ctx, count_factory, &built, NULL, NULL), SG_ERR_NULL, "factory or out is NULL");
    TU_FAILS(ctx, sg_advise_name(ctx, NULL, NULL, NULL, r), SG_ERR_NULL, "name is NULL");
    o.warmup = 4;
    TU_FAILS(ctx, sg_advise(ctx, count_factory, &built, &o, r), SG_ERR_INVALID, "warm-up of at least 5");
    o = sg_advise_options_default();
    o.repeats = 1001;
    TU_FAILS(ctx, sg_advise_name(ctx, "mlp-64-2-32", NULL, &o, r), SG_ERR_INVALID, "up to 1000");
    /* The refusal comes after the thread was held (calibration says it): its affinity is given
     * back on failure too; hold_cpu 0 leaves it alone. */
    int cpus0 = allowed_cpus();
    TU_FAILS(ctx, sg_advise(ctx, count_factory, &built, NULL, r), SG_ERR_UNSUPPORTED, "profiles a CUDA device");
    TU_CHECK(allowed_cpus() == cpus0 && cpus0 >= 1, "affinity after a failed sg_advise: %d cores, %d before",
             allowed_cpus(), cpus0);
    TU_CHECK(r->cpu >= 0 ? !!strstr(r->cpu_note, "held on core") : !!strstr(r->cpu_note, "not held"),
             "cpu %d: '%s'", r->cpu, r->cpu_note);
    o = sg_advise_options_default();
    o.hold_cpu = 0;
    TU_FAILS(ctx, sg_advise(ctx, count_factory, &built, &o, r), SG_ERR_UNSUPPORTED, "profiles a CUDA device");
    TU_CHECK(r->cpu == -1 && strstr(r->cpu_note, "hold_cpu is 0"), "hold_cpu 0: cpu %d, '%s'", r->cpu,
             r->cpu_note);
    TU_FAILS(ctx, sg_advise_name(ctx, "mlp-64-2-32", NULL, NULL, r), SG_ERR_UNSUPPORTED, "profiles a CUDA device");
    /* With a calibration given, the profile refuses the CPU backend, still before building. */
    sg_advise_calib given = calib_synthetic();
    o = sg_advise_options_default();
    o.calib = &given;
    TU_FAILS(ctx, sg_advise(ctx, count_factory, &built, &o, r), SG_ERR_UNSUPPORTED, "profiles a CUDA device");
    check_close("the given calibration is the result's", r->calib.launch_host_us, given.launch_host_us);
    TU_CHECK(r->options.calib == NULL && r->options.warmup == 20, "the result's options");
    TU_CHECK(built == 0, "the factory was called %d times on the CPU backend", built);
    TU_CHECK(isnan(r->best_measured_speedup) && isnan(r->scopes[SG_SCOPE_STEP].error_pct) &&
             r->scopes[SG_SCOPE_STEP].scope == SG_SCOPE_STEP && !r->scopes[SG_SCOPE_STEP].measured,
             "a failed sg_advise's result is cleared");
    free(r);
    sg_ctx_destroy(ctx);
    char buf[16];
    TU_CHECK(!strcmp(sg_advise_steps_str(NAN, buf, sizeof buf), "never"), "NaN steps '%s'", buf);
    TU_CHECK(!strcmp(sg_advise_steps_str(1.2, buf, sizeof buf), "2"), "1.2 steps '%s'", buf);
}

/* ---- gpu ---- */

static void gpu_calibration(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CUDA);
    sg_alloc_stats a0, a1;
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a0));
    sg_advise_calib c;
    TU_OK(ctx, sg_advise_calibrate(ctx, &c));
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a1));
    printf("calibration on %s: launch %.2f us host; replay %.2f + %.3f us/node host; device per eager kernel %.2f "
           "us, per node %.3f us, tiny kernel %.2f us, gaps eager %.2f node %.3f graph %.2f us; capture %.1f + "
           "%.2f us/node, instantiate %.1f + %.2f us/node; %.0f B/node%s%s\n",
           c.device, c.launch_host_us, c.replay_base_us, c.replay_node_us, c.eager_kernel_us, c.node_device_us,
           c.tiny_kernel_us, c.eager_gap_us, c.node_gap_us, c.graph_gap_us, c.capture_base_us, c.capture_node_us,
           c.instantiate_base_us, c.instantiate_node_us, c.exec_node_bytes, c.device_timed ? "" : "; ", c.note);
    TU_CHECK(c.launch_host_us >= 0.5 && c.launch_host_us <= 50, "launch host cost %.3f us", c.launch_host_us);
    /* The host's replay cost per node is a fitted slope, clamped at 0: on the H100 with CUDA 13
     * it is small enough that timing noise flattened it to 0.000 once in a --repeat run
     * (2026-11-24), so only its sign and the bound by a launch are checked; the replay as a
     * whole (below) must cost something. */
    TU_CHECK(c.replay_node_us >= 0 && c.replay_node_us < c.launch_host_us,
             "replay per node %.3f us should be non-negative and below a launch (%.3f us)", c.replay_node_us,
             c.launch_host_us);
    TU_CHECK(c.replay_base_us + c.replay_node_us > 0 && c.replay_base_us < 100, "replay base %.3f us",
             c.replay_base_us);
    TU_CHECK(c.capture_node_us > 0 && c.capture_node_us < 100, "capture per node %.3f us", c.capture_node_us);
    TU_CHECK(c.instantiate_node_us > 0 && c.instantiate_node_us < 200, "instantiate per node %.3f us",
             c.instantiate_node_us);
    TU_CHECK(c.eager_kernel_us > 0 && c.eager_kernel_us < 50, "device per eager kernel %.3f us", c.eager_kernel_us);
    TU_CHECK(c.node_device_us > 0 && c.node_device_us < 50, "device per node %.3f us", c.node_device_us);
    TU_CHECK(c.graph_gap_us >= 0 && c.graph_gap_us < 100, "device per graph launch %.3f us", c.graph_gap_us);
    if (c.device_timed) {
        TU_CHECK(c.tiny_kernel_us > 0 && c.tiny_kernel_us < 50, "tiny kernel %.3f us", c.tiny_kernel_us);
        TU_CHECK(c.eager_gap_us >= 0 && c.eager_gap_us < 50 && c.node_gap_us >= 0 && c.node_gap_us < 50,
                 "gaps %.3f, %.3f us", c.eager_gap_us, c.node_gap_us);
    }
    TU_CHECK(a1.bytes_in_use == a0.bytes_in_use && a1.live_blocks == a0.live_blocks,
             "calibration left %zu bytes (%llu blocks) in use", a1.bytes_in_use - a0.bytes_in_use,
             (unsigned long long)(a1.live_blocks - a0.live_blocks));
    sg_ctx_destroy(ctx);
}

/* The progress stages sg_advise reports, in order. */
typedef struct stages {
    int n;
    sg_advise_stage stage[8];
    sg_scope scope[8];
    int cpus[8], on[8];  /* cores the thread may run on, and the one it ran on, at each stage */
} stages;

static void record_stage(void *user, const sg_advise_result *r, sg_advise_stage stage, sg_scope scope)
{
    stages *s = user;
    (void)r;
    if (s->n < 8)
        s->stage[s->n] = stage, s->scope[s->n] = scope, s->cpus[s->n] = allowed_cpus(), s->on[s->n] = sched_getcpu();
    s->n++;
}

static void gpu_flow(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CUDA);
    sg_advise_result *r = new_result();
    int built = 0;
    stages seen = {0};
    sg_advise_options o = sg_advise_options_default();
    o.warmup = 5, o.steps = 10, o.repeats = 3, o.busy_steps = 5;
    o.progress = record_stage, o.progress_user = &seen;
    int cpus0 = allowed_cpus();
    sg_status st = sg_advise(ctx, count_factory, &built, &o, r);
    /* Held on one core throughout (where the machine lets a thread set its affinity), then
     * given its affinity back. */
    TU_CHECK(allowed_cpus() == cpus0, "the thread may run on %d cores after sg_advise, %d before", allowed_cpus(),
             cpus0);
    TU_CHECK(r->cpu >= 0 || strstr(r->cpu_note, "not held"), "cpu %d: '%s'", r->cpu, r->cpu_note);
    for (int i = 0; i < seen.n && i < 8 && r->cpu >= 0; i++)
        TU_CHECK(seen.cpus[i] == 1 && seen.on[i] == r->cpu, "stage %d ran on core %d of %d allowed, held on %d", i,
                 seen.on[i], seen.cpus[i], r->cpu);
    if (st == SG_ERR_UNSUPPORTED && !r->summary.verdict[0]) { /* no CUPTI: said, nothing else to check */
        printf("no prediction: %s\n", sg_ctx_last_error(ctx));
        free(r);
        sg_ctx_destroy(ctx);
        return;
    }
    TU_OK(ctx, st);
    const sg_advise_profile *p = &r->profile;
    printf("profile of %s: %.4f ms/step, host %.4f ms, busy %.4f ms, %.1f kernels, %.1f launches; load %.0f, "
           "forward %.0f, backward %.0f launches; static load %.0f launches; %d modules; step graph %d nodes%s%s\n",
           r->model, p->wall_ms, p->step.host_us / 1e3, p->busy_ms, p->kernels, p->launches, p->load.launches,
           p->forward.launches, p->backward.launches, p->load_static.launches, p->n_modules, p->step_nodes,
           p->note[0] ? "; " : "", p->note);
    TU_CHECK(!strcmp(r->model, "mlp-64-2-32") && !strcmp(p->model, "mlp-64-2-32") && r->precision == SG_DTYPE_F32,
             "model '%s' (%s)", r->model, sg_dtype_name(r->precision));
    TU_CHECK(p->wall_ms > 0 && p->step.host_us > 0 && p->launches > 0, "wall %g, host %g, launches %g", p->wall_ms,
             p->step.host_us, p->launches);
    TU_CHECK(fabs(p->step.launches - p->launches) < 0.5, "instrumented step %.1f launches, timed steps %.1f",
             p->step.launches, p->launches);
    TU_CHECK(p->forward.launches > 0 && p->backward.launches > 0 &&
             p->load.launches + p->forward.launches + p->backward.launches <= p->step.launches,
             "regions: load %g, forward %g, backward %g of %g", p->load.launches, p->forward.launches,
             p->backward.launches, p->step.launches);
    TU_CHECK(p->n_modules == 3, "mlp-64-2-32 has 3 modules (2 hidden layers and the head), profile says %d",
             p->n_modules);
    double ml = 0;
    for (int i = 0; i < p->n_modules; i++) ml += p->modules[i].forward.launches + p->modules[i].backward.launches;
    TU_CHECK(fabs(ml - (p->forward.launches + p->backward.launches)) < 0.5, "modules hold %g of the net's %g "
             "launches", ml, p->forward.launches + p->backward.launches);
    TU_CHECK(p->load_static.launches >= 1 && p->static_bytes > 0, "static load %g launches, %g bytes",
             p->load_static.launches, p->static_bytes);
    TU_CHECK(p->capture_tried && p->step_captured && p->step_nodes > 0, "trial capture: %s", p->capture_error);

    /* Every scope predicted and measured; the factory built the profile's model and one a scope. */
    TU_CHECK(built == 1 + SG_ADVISE_SCOPES, "the factory was called %d times, expected %d", built,
             1 + SG_ADVISE_SCOPES);
    TU_CHECK(r->measure_failures == 0, "%d measurements failed", r->measure_failures);
    for (int s = 0; s < SG_ADVISE_SCOPES; s++) {
        const sg_advise_scope_result *sr = &r->scopes[s];
        const sg_advise_prediction *q = &sr->predicted;
        const sg_advise_measurement *m = &sr->measurement;
        const char *name = sg_scope_name((sg_scope)s);
        TU_CHECK(sr->scope == (sg_scope)s && q->scope == (sg_scope)s && m->scope == (sg_scope)s, "%s: scopes", name);
        TU_CHECK(isfinite(q->step_ms) && q->step_ms > 0 && isfinite(q->speedup) && isfinite(q->host_ms) &&
                 isfinite(q->device_ms) && isfinite(q->setup_ms) && isfinite(q->extra_bytes),
                 "%s: a prediction is not finite", name);
        TU_CHECK(sr->measured && sr->measure_status == SG_OK, "%s not measured: %s", name, sr->measure_note);
        TU_CHECK(isfinite(m->step_ms) && m->step_ms > 0 && !m->fell_back, "%s measured %g ms%s%s", name, m->step_ms,
                 m->fell_back ? ", fell back: " : "", m->fallback_reason);
        TU_CHECK((s == SG_SCOPE_EAGER) == (m->graphs == 0), "%s scope: %d graphs", name, m->graphs);
        check_close("error_pct", sr->error_pct, 100 * (q->step_ms - m->step_ms) / m->step_ms);
        check_close("measured speedup", sr->measured_speedup, r->scopes[0].measurement.step_ms / m->step_ms);
        printf("%-6s predicted %.4f ms (host %.4f, device %.4f), measured %.4f ms (%+.1f%%); setup %.2f / %.2f ms\n",
               name, q->step_ms, q->host_ms, q->device_ms, m->step_ms, sr->error_pct, q->setup_ms,
               m->capture_ms + m->instantiate_ms);
    }
    check_close("eager's own measured speedup", r->scopes[0].measured_speedup, 1);
    TU_CHECK(r->summary.verdict[0] && strstr(r->verdict, "; measured ") &&
             !strncmp(r->verdict, r->summary.verdict, strlen(r->summary.verdict) - 1),
             "verdict '%s' (summary '%s')", r->verdict, r->summary.verdict);
    check_close("best measured speedup", r->best_measured_speedup, r->scopes[r->summary.best].measured_speedup);
    printf("verdict: %s\n", r->verdict);
    /* Progress: profiled, predicted, then each scope measured, in order. */
    TU_CHECK(seen.n == 2 + SG_ADVISE_SCOPES && seen.stage[0] == SG_ADVISE_STAGE_PROFILED &&
             seen.stage[1] == SG_ADVISE_STAGE_PREDICTED, "%d progress calls", seen.n);
    for (int s = 0; s < SG_ADVISE_SCOPES && s + 2 < 8; s++)
        TU_CHECK(seen.stage[s + 2] == SG_ADVISE_STAGE_MEASURED && seen.scope[s + 2] == (sg_scope)s,
                 "progress call %d: stage %d, scope %d", s + 2, (int)seen.stage[s + 2], (int)seen.scope[s + 2]);

    /* By name, predicting only, with the calibration reused: no measurement, the same model. */
    sg_advise_calib calib = r->calib;
    sg_advise_result *r2 = new_result();
    o = sg_advise_options_default();
    o.warmup = 5, o.steps = 10, o.repeats = 3, o.busy_steps = 5, o.measure = 0, o.calib = &calib;
    TU_OK(ctx, sg_advise_name(ctx, "mlp-64-2-32", NULL, &o, r2));
    TU_CHECK(r2->calib.launch_host_us == calib.launch_host_us && r2->calib.node_gap_us == calib.node_gap_us &&
             r2->calib.device_timed == calib.device_timed && !strcmp(r2->calib.device, calib.device),
             "the reused calibration");
    TU_CHECK(!strcmp(r2->model, "mlp-64-2-32") && r2->profile.n_modules == 3, "model '%s'", r2->model);
    for (int s = 0; s < SG_ADVISE_SCOPES; s++)
        TU_CHECK(!r2->scopes[s].measured && isnan(r2->scopes[s].error_pct) &&
                 strstr(r2->scopes[s].measure_note, "predict only"), "%s: measured with measure 0 (%s)",
                 sg_scope_name((sg_scope)s), r2->scopes[s].measure_note);
    TU_CHECK(!strcmp(r2->verdict, r2->summary.verdict) && isnan(r2->best_measured_speedup),
             "predict-only verdict '%s'", r2->verdict);

    /* Accumulated steps of 2 micro-batches, predicted only: the regions are a whole step's,
     * twice one micro-batch's (launches are counts: the same each time), the trial capture
     * holds both micro-batches. */
    const sg_advise_profile *p1 = &r2->profile;
    sg_advise_result *r3 = new_result();
    o.accum = 2;
    TU_OK(ctx, sg_advise_name(ctx, "mlp-64-2-32", NULL, &o, r3));
    const sg_advise_profile *p2 = &r3->profile;
    TU_CHECK(p2->accum == 2 && r3->options.accum == 2, "profile accum %d, options %d", p2->accum, r3->options.accum);
    TU_CHECK(fabs(p2->forward.launches - 2 * p1->forward.launches) < 0.5 &&
             fabs(p2->backward.launches - 2 * p1->backward.launches) < 0.5 &&
             fabs(p2->load_static.launches - 2 * p1->load_static.launches) < 0.5,
             "accum 2: forward %g, backward %g, static load %g launches; one micro-batch: %g, %g, %g",
             p2->forward.launches, p2->backward.launches, p2->load_static.launches, p1->forward.launches,
             p1->backward.launches, p1->load_static.launches);
    TU_CHECK(p2->step.launches > 2 * (p1->forward.launches + p1->backward.launches) &&
             p2->step_captured && p2->step_nodes > p1->step_nodes,
             "accum 2: %g launches a step, step graph %d nodes (one micro-batch: %d)", p2->step.launches,
             p2->step_nodes, p1->step_nodes);
    TU_CHECK(r3->scopes[SG_SCOPE_MODEL].predicted.graphs == 4, "accum 2: model scope replays %g graphs a step",
             r3->scopes[SG_SCOPE_MODEL].predicted.graphs);
    printf("accum 2: %.0f launches a step (forward %.0f, backward %.0f), step graph %d nodes; %s\n",
           p2->step.launches, p2->forward.launches, p2->backward.launches, p2->step_nodes, r3->verdict);

    /* bf16 optimizer state, predicted only: the profile's optimizer keeps its moments in bf16,
     * which its counted work shows (the update moves 2 (4 + 2 + 2) + 4 bytes a parameter, not
     * 2 (4 + 4 + 4) + 4: 8 fewer for each element of the flat parameter buffer, its padding
     * included), and the trial capture still captures the step. */
    o.accum = 1, o.optim_state = SG_DTYPE_BF16;
    TU_OK(ctx, sg_advise_name(ctx, "mlp-64-2-32", NULL, &o, r3));
    const double *b32 = p1->work.bytes, *b16 = r3->profile.work.bytes;
    sg_model *pm = NULL;
    TU_OK(ctx, sg_model_create(ctx, "mlp-64-2-32", 1, &pm));
    const double fewer = 8.0 * (double)sg_model_params(pm)->numel;
    sg_model_destroy(pm);
    TU_CHECK(r3->options.optim_state == SG_DTYPE_BF16 && p1->work_counted && r3->profile.work_counted &&
             fabs(b32[SG_WORK_OPTIMIZER] - b16[SG_WORK_OPTIMIZER] - fewer) <= 1e-9 * b32[SG_WORK_OPTIMIZER] &&
             fabs(b16[SG_WORK_MATMUL] - b32[SG_WORK_MATMUL]) <= 1e-9 * b32[SG_WORK_MATMUL],
             "bf16 state: optimizer %g bytes a step, f32 state %g (%g fewer expected); matmul %g, %g",
             b16[SG_WORK_OPTIMIZER], b32[SG_WORK_OPTIMIZER], fewer, b16[SG_WORK_MATMUL], b32[SG_WORK_MATMUL]);
    TU_CHECK(r3->profile.step_captured && r3->profile.step_nodes > 0,
             "bf16 state: step graph %d nodes (f32 state: %d): %s", r3->profile.step_nodes, p1->step_nodes,
             r3->profile.capture_error);
    printf("bf16 optimizer state: the update moves %.0f bytes a step (f32 state: %.0f); %s\n",
           b16[SG_WORK_OPTIMIZER], b32[SG_WORK_OPTIMIZER], r3->verdict);
    free(r3);

    /* 4 steps a launch, in a WHILE loop, measured: every figure is an optimizer step's. Step
     * scope launches one graph a call, a quarter of a launch a step, as predicted; eager scope
     * launches what one step launches, 4 times a call. */
    sg_trainer_options to = sg_trainer_options_default();
    to.steps_per_call = 4, to.loop = 1;
    o = sg_advise_options_default();
    o.warmup = 8, o.steps = 12, o.repeats = 3, o.busy_steps = 8, o.calib = &calib, o.trainer = &to;
    sg_advise_result *r4 = new_result();
    TU_OK(ctx, sg_advise_name(ctx, "mlp-64-2-32", NULL, &o, r4));
    TU_CHECK(r4->options.trainer == NULL && r4->measure_failures == 0, "4 a launch: %d measurements failed",
             r4->measure_failures);
    const sg_advise_scope_result *e4 = &r4->scopes[SG_SCOPE_EAGER], *s4 = &r4->scopes[SG_SCOPE_STEP];
    check_close("4 a launch: predicted launches a step", s4->predicted.launches, 0.25);
    TU_CHECK(s4->measured && s4->measurement.graphs == 1 && fabs(s4->measurement.launches - 0.25) < 0.01 &&
             isfinite(s4->measurement.step_ms) && s4->measurement.step_ms > 0,
             "4 a launch, step scope: measured %d, %d graphs, %.3f launches a step, %g ms (%s)", s4->measured,
             s4->measurement.graphs, s4->measurement.launches, s4->measurement.step_ms, s4->measure_note);
    TU_CHECK(e4->measured && fabs(e4->measurement.launches - r->scopes[SG_SCOPE_EAGER].measurement.launches) < 0.5,
             "4 a launch, eager: %.2f launches a step, one a launch: %.2f", e4->measurement.launches,
             r->scopes[SG_SCOPE_EAGER].measurement.launches);
    printf("4 steps a launch, loop: step scope predicted %.4f ms (host %.4f), measured %.4f ms (host %.4f, %+.1f%%); "
           "one a launch measured %.4f ms\n", s4->predicted.step_ms, s4->predicted.host_ms, s4->measurement.step_ms,
           s4->measurement.host_ms, s4->error_pct, r->scopes[SG_SCOPE_STEP].measurement.step_ms);
    free(r4);
    free(r2);
    free(r);
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_advise");
    if (strcmp(mode, "cpu") == 0) {
        cpu_launch_bound();
        cpu_gpu_bound();
        cpu_no_saving();
        cpu_monotonic();
        cpu_host_sync();
        cpu_accum();
        cpu_calls();
        cpu_trainer_options();
        cpu_optim_state();
        cpu_errors();
    } else if (strcmp(mode, "gpu") == 0) {
        gpu_calibration();
        gpu_flow();
    } else {
        fprintf(stderr, "usage: test_advise cpu|gpu\n");
        return 2;
    }
    return tu_finish("test_advise");
}
