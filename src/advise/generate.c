/* generate.c: the advisor for generation (stepgraph.h: sg_advise_generate; advise.c holds the
 * thread on its core and calls sg_advise_gen_run). Times the parts of a decode step through the
 * generator's internal sg_generator_part, predicts each mode's per-token latency with
 * sg_advise_gen_predict (prof/predict.c), then runs sg_generate in each mode and measures it.
 * docs/advisor.md, "Generation", says how each number is taken. */
#include "advise/advise.h"
#include "train/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Flag reads timed for S, and WHILE turns for P (the long run less a one-turn run). */
#define GEN_READBACKS 64
#define GEN_WHILE_TURNS 1024

typedef struct gen_run {
    sg_ctx *ctx;
    sg_generator *g;
    const sg_generate_request *r;    /* the advisor's copy: every sequence runs max_new */
    int64_t k;                       /* decode steps after the prefill: max_new - 1 */
    int repeats;
} gen_run;

static double median_free(double *v, int n)
{
    double m = sg_median(v, n);
    free(v);
    return m;
}

static double *samples(gen_run *s, int64_t n)
{
    double *v = malloc((size_t)n * sizeof *v);
    if (!v) sg_fail(s->ctx, SG_ERR_OOM, "sg_advise_generate: out of host memory");
    return v;
}

/* A prefill of the request, finished: the state every timed decode sequence starts from. */
static sg_status prefill(gen_run *s)
{
    SG_TRY(sg_generator_part(s->g, s->r, SG_GEN_PART_PREFILL, NULL));
    return sg_ctx_sync(s->ctx);
}

/* H, R and L: each of the k decode steps queued on an idle device (synced after each), eagerly
 * or as the graph's replay, host time around the call; medians over every step of every repeat. */
static sg_status time_steps(gen_run *s, sg_gen_part part, double *host_us, double *launches)
{
    const int64_t n = s->k * s->repeats;
    double *h = samples(s, n), *l = samples(s, n);
    sg_status st = h && l ? SG_OK : SG_ERR_OOM;
    int64_t i = 0;
    for (int rep = 0; st == SG_OK && rep < s->repeats; rep++) {
        st = prefill(s);
        for (int64_t j = 0; st == SG_OK && j < s->k; j++, i++) {
            uint64_t c0 = sg_ctx_launch_count(s->ctx);
            double t0 = sg_clock_us();
            st = sg_generator_part(s->g, NULL, part, NULL);
            h[i] = sg_clock_us() - t0;
            l[i] = (double)(sg_ctx_launch_count(s->ctx) - c0);
            if (st == SG_OK) st = sg_ctx_sync(s->ctx);
        }
    }
    if (st == SG_OK) {
        *host_us = median_free(h, (int)n), h = NULL;
        if (launches) *launches = median_free(l, (int)n), l = NULL;
    }
    free(h), free(l);
    return st;
}

/* D: after a finished prefill, k replays queued back to back, over k; the median. (The first
 * launch's latency and the sync's, a few us, are shared by the k steps.) */
static sg_status time_graph(gen_run *s, double *graph_us)
{
    double *v = samples(s, s->repeats);
    if (!v) return SG_ERR_OOM;
    sg_status st = SG_OK;
    for (int rep = 0; st == SG_OK && rep < s->repeats; rep++) {
        st = prefill(s);
        double t0 = sg_clock_us();
        for (int64_t j = 0; st == SG_OK && j < s->k; j++) st = sg_generator_part(s->g, NULL, SG_GEN_PART_GRAPH, NULL);
        if (st == SG_OK) st = sg_ctx_sync(s->ctx);
        v[rep] = (sg_clock_us() - t0) / (double)s->k;
    }
    if (st == SG_OK) *graph_us = median_free(v, s->repeats);
    else free(v);
    return st;
}

/* S: one int32 read to the host on an idle device, the median of GEN_READBACKS. */
static sg_status time_readback(gen_run *s, sg_tensor *flag, double *us)
{
    double v[GEN_READBACKS];
    int32_t x;
    SG_TRY(sg_ctx_sync(s->ctx));
    for (int i = 0; i < GEN_READBACKS; i++) {
        double t0 = sg_clock_us();
        SG_TRY(sg_tensor_copy_to_host(flag, &x, sizeof x));
        v[i] = sg_clock_us() - t0;
    }
    *us = sg_median(v, GEN_READBACKS);
    return SG_OK;
}

/* The WHILE node of P's graph: counts its flag down by one a turn. */
static sg_status count_down(void *u) { return sg_tensor_add_scalar(u, -1.0); }

static sg_status while_region(void *u)
{
    sg_tensor *flag = u;
    return sg_graph_while(flag->ctx, flag, count_down, flag);
}

/* One replay of the WHILE graph set to run `turns` turns, synced; wall us. */
static sg_status time_turns(gen_run *s, sg_graph *gr, sg_tensor *flag, int turns, double *us)
{
    SG_TRY(sg_tensor_fill(flag, turns));
    SG_TRY(sg_ctx_sync(s->ctx));
    double t0 = sg_clock_us();
    SG_TRY(sg_graph_replay(gr));
    SG_TRY(sg_ctx_sync(s->ctx));
    *us = sg_clock_us() - t0;
    return SG_OK;
}

/* P: a turn of a WHILE node whose body is one tiny kernel: a replay of GEN_WHILE_TURNS turns
 * less one of a single turn, over the turns between; the median of the repeats. NAN where
 * capture cannot make WHILE nodes. */
static sg_status time_while_turn(gen_run *s, sg_tensor *flag, double *us)
{
    *us = NAN;
    if (!(sg_graph_conditionals(s->ctx) & (1 << SG_COND_WHILE))) return SG_OK;
    sg_graph_options o = sg_graph_options_default();
    o.name = "advise.while_turn";
    o.warmup = 1;
    SG_TRY(sg_tensor_fill(flag, 1));
    sg_graph *gr = NULL;
    SG_TRY(sg_graph_capture(s->ctx, while_region, flag, &o, &gr));
    double *v = samples(s, s->repeats);
    sg_status st = v ? SG_OK : SG_ERR_OOM;
    for (int rep = 0; st == SG_OK && rep < s->repeats; rep++) {
        double one = 0, many = 0;
        st = time_turns(s, gr, flag, 1, &one);
        if (st == SG_OK) st = time_turns(s, gr, flag, GEN_WHILE_TURNS, &many);
        /* A difference of two timings: where the turn costs less than their noise (the CPU
         * backend's turn is a flag read) it can come out below 0, which is 0 (seen: -0.02 us
         * in 1 of 10 runs of cli_test, which then failed the prediction's check). */
        if (st == SG_OK) v[rep] = fmax(0.0, (many - one) / (GEN_WHILE_TURNS - 1));
    }
    if (st == SG_OK) *us = median_free(v, s->repeats);
    else free(v);
    sg_graph_destroy(gr);
    return st;
}

static sg_status profile(gen_run *s, sg_advise_gen_profile *p)
{
    p->steps = s->k;
    /* The decode graph captured (its warm-up runs a step) before anything is timed. */
    SG_TRY(prefill(s));
    SG_TRY(sg_generator_part(s->g, NULL, SG_GEN_PART_GRAPH, &p->nodes));
    SG_TRY(time_steps(s, SG_GEN_PART_EAGER, &p->host_us, &p->launches));
    SG_TRY(time_steps(s, SG_GEN_PART_GRAPH, &p->replay_us, NULL));
    if (sg_ctx_backend(s->ctx) == SG_BACKEND_CPU) p->replay_us = 0; /* the replay ran the work: graph_us */
    SG_TRY(time_graph(s, &p->graph_us));
    sg_tensor *flag = NULL;
    SG_TRY(sg_tensor_create(s->ctx, SG_DTYPE_I32, 1, (int64_t[]){1}, "advise.flag", &flag));
    sg_status st = time_readback(s, flag, &p->readback_us);
    if (st == SG_OK) st = time_while_turn(s, flag, &p->while_turn_us);
    sg_tensor_destroy(flag);
    return st;
}

/* One mode run as a user runs it: a warm-up call (captures its graphs), then per repeat a call
 * of max_new 1 (the prefill) and one of max_new; medians. */
static sg_status measure(gen_run *s, sg_gen_mode mode, sg_advise_gen_mode *m)
{
    sg_generate_request q = *s->r;
    q.mode = mode;
    const int n = q.n;
    int32_t *tok = malloc((size_t)n * (size_t)q.max_new * sizeof *tok);
    int64_t *len = malloc((size_t)n * sizeof *len);
    double *pre = samples(s, s->repeats), *tot = samples(s, s->repeats), *host = samples(s, s->repeats);
    sg_status st = tok && len && pre && tot && host ? SG_OK : sg_fail(s->ctx, SG_ERR_OOM, "sg_advise_generate: out "
                                                                      "of host memory");
    sg_generate_stats gs;
    if (st == SG_OK) st = sg_generate(s->g, &q, tok, len, NULL, &gs);
    for (int rep = 0; st == SG_OK && rep < s->repeats; rep++) {
        q.max_new = 1;
        st = sg_generate(s->g, &q, tok, len, NULL, &gs);
        pre[rep] = gs.wall_ms;
        q.max_new = s->r->max_new;
        if (st == SG_OK) st = sg_generate(s->g, &q, tok, len, NULL, &gs);
        tot[rep] = gs.wall_ms;
        host[rep] = gs.host_us / (double)q.max_new;
        for (int i = 0; st == SG_OK && i < n; i++)
            if (len[i] != q.max_new)
                st = sg_fail(s->ctx, SG_ERR_INVALID, "sg_advise_generate: sequence %d ran %lld tokens of %lld in mode "
                             "%s (a bug: the advisor's request has no stop)", i, (long long)len[i],
                             (long long)q.max_new, sg_gen_mode_name(mode));
    }
    if (st == SG_OK) {
        m->prefill_ms = sg_median(pre, s->repeats);
        m->total_ms = sg_median(tot, s->repeats);
        m->host_us_per_token = sg_median(host, s->repeats);
        m->measured_ms = (m->total_ms - m->prefill_ms) / (double)s->k;
        m->ratio = m->predicted ? m->predicted_ms / m->measured_ms : NAN;
        m->measured = 1;
    }
    free(tok), free(len), free(pre), free(tot), free(host);
    return st;
}

/* A calibration's host terms and, where timed, device terms: finite and >= 0. */
static sg_status check_calib(sg_ctx *ctx, const sg_advise_calib *c)
{
    const struct {
        const char *name;
        double v;
        bool device;
    } in[] = {{"launch_host_us", c->launch_host_us, false}, {"replay_base_us", c->replay_base_us, false},
              {"replay_node_us", c->replay_node_us, false}, {"eager_gap_us", c->eager_gap_us, true},
              {"node_gap_us", c->node_gap_us, true},       {"graph_gap_us", c->graph_gap_us, true},
              {"node_device_us", c->node_device_us, true}};
    for (size_t i = 0; i < sizeof in / sizeof *in; i++)
        if ((!in[i].device || c->device_timed) && !(isfinite(in[i].v) && in[i].v >= 0))
            return sg_fail(ctx, SG_ERR_INVALID, "sg_advise_generate: calib.%s is %g: expected a finite value >= 0",
                           in[i].name, in[i].v);
    return SG_OK;
}

sg_status sg_advise_gen_run(sg_ctx *ctx, sg_generator *g, const sg_generate_request *r, const sg_advise_options *o,
                            sg_advise_gen_result *out)
{
    const char *fn = "sg_advise_generate";
    if (sg_generator_ctx(g) != ctx)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: the generator runs on another context", fn);
    if (sg_graphs_disabled())
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: STEPGRAPH_DISABLE_GRAPHS=1: step and loop modes would run "
                       "eagerly, so there is nothing to advise between", fn);
    if (r->max_new < 2)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: max_new %lld: expected at least 2 (a decode step to time after "
                       "the prefill)", fn, (long long)r->max_new);
    if (o->repeats < 1 || o->repeats > 1000)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: repeats %d: expected 1 to 1000", fn, o->repeats);
    if (o->calib) SG_TRY(check_calib(ctx, o->calib));
    sg_generate_request q = *r;
    q.stop = NULL, q.n_stop = 0, q.max_new_each = NULL, q.mode = SG_GEN_EAGER;
    gen_run s = {.ctx = ctx, .g = g, .r = &q, .k = r->max_new - 1, .repeats = o->repeats};
    snprintf(out->device, sizeof out->device, "%s", sg_ctx_device_name(ctx));
    /* The request's checks first (sg_generate's, through the prefill), then the calibration. */
    SG_TRY(prefill(&s));
    out->batch = r->n, out->max_new = r->max_new, out->repeats = o->repeats;
    for (int i = 0; i < r->n; i++)
        if (r->prompt_lens[i] > out->prompt_len) out->prompt_len = r->prompt_lens[i];
    if (o->calib) out->calib = *o->calib;
    else if (sg_ctx_backend(ctx) == SG_BACKEND_CUDA) SG_TRY(sg_advise_calibrate(ctx, &out->calib));
    else snprintf(out->calib.note, sizeof out->calib.note, "the CPU backend has no launch queue: launch terms 0");
    SG_TRY(profile(&s, &out->profile));
    for (int k = SG_GEN_EAGER; k <= SG_GEN_LOOP; k++) {
        sg_advise_gen_mode *m = &out->modes[k];
        m->ratio = NAN;
        sg_status st = sg_advise_gen_predict(&out->calib, &out->profile, (sg_gen_mode)k, m);
        if (st != SG_OK) return sg_fail(ctx, st, "%s: predicting mode %s: %s", fn, sg_gen_mode_name((sg_gen_mode)k),
                                        m->note);
    }
    for (int k = SG_GEN_EAGER; o->measure && k <= SG_GEN_LOOP; k++)
        if (out->modes[k].predicted) SG_TRY(measure(&s, (sg_gen_mode)k, &out->modes[k]));
    return SG_OK;
}
