/* profile.c: the advisor's runs of a model: the profile of its eager steps (timed blocks,
 * GPU-busy by CUPTI, one step instrumented by its named ranges, the static-input batch load, a
 * trial capture of the step) and the measurement of a scope (the same timing under that
 * scope's trainer). Each builds its model through the caller's factory, so any model can be
 * advised. CUDA only: the CPU backend has no launches to time. */
#include "advise/advise.h"
#include "train/model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

double sg_advise_now_us(void) { return sg_clock_us(); }

/* The factory's model, checked: it exists and lives on ctx. */
static sg_status build_model(sg_ctx *ctx, sg_model_factory factory, void *user, const char *fn, sg_model **m)
{
    *m = NULL;
    SG_TRY(factory(ctx, user, m));
    if (!*m) return sg_fail(ctx, SG_ERR_INVALID, "%s: the model factory returned SG_OK and no model", fn);
    if ((*m)->ctx != ctx) {
        sg_model_destroy(*m);
        *m = NULL;
        return sg_fail(ctx, SG_ERR_INVALID, "%s: the model factory built its model on another context", fn);
    }
    return SG_OK;
}

/* Every optimizer the advisor makes (the profile's, which the trial capture reuses, and each
 * measurement's): AdamW with the timing's state dtype; *o NULL on failure. */
static sg_status make_optim(sg_ctx *ctx, sg_model *m, const sg_advise_timing *tm, sg_optim **o)
{
    SG_TRY(sg_optim_create(ctx, m, SG_OPTIM_ADAMW, o));
    sg_status st = sg_optim_set_state_dtype(*o, tm->optim_state);
    if (st != SG_OK) {
        sg_optim_destroy(*o);
        *o = NULL;
    }
    return st;
}

/* ---- running a model: timed blocks, GPU-busy ---- */

sg_status sg_advise_check_timing(sg_ctx *ctx, const char *fn, const sg_advise_timing *tm)
{
    if (tm->warmup < 5 || tm->steps < 1 || tm->repeats < 1 || tm->repeats > 1000 || tm->busy_steps < 1)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: warm-up %d, %d steps, %d repeats, %d busy steps: expected a "
                       "warm-up of at least 5 steps (the trainer captures after 3) and at least one step, block "
                       "(up to 1000) and busy step", fn, tm->warmup, tm->steps, tm->repeats, tm->busy_steps);
    if (tm->accum < 1 || tm->accum > 1024)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: accum %d: expected 1 to 1024 micro-batches per optimizer step "
                       "(sg_advise_options.accum)", fn, tm->accum);
    if (tm->optim_state != SG_DTYPE_F32 && tm->optim_state != SG_DTYPE_BF16)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: optim_state %d (%s): expected SG_DTYPE_F32 or SG_DTYPE_BF16, the "
                       "dtype of the optimizer's state (sg_advise_options.optim_state)", fn, (int)tm->optim_state,
                       sg_dtype_name(tm->optim_state));
    const sg_trainer_options *o = tm->trainer;
    if (!o) return SG_OK;
    if (o->steps_per_call < 0 || o->steps_per_call > 1024)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: trainer.steps_per_call %d: expected 1 to 1024 optimizer steps a "
                       "call (0: 1)", fn, o->steps_per_call);
    if ((o->loop | o->skip_if | o->vary_seq | o->stop_on_loss) & ~1)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: trainer.loop %d, skip_if %d, vary_seq %d, stop_on_loss %d: expected "
                       "0 or 1", fn, o->loop, o->skip_if, o->vary_seq, o->stop_on_loss);
    if (o->stop_nonfinite < 0 || o->stop_nonfinite > (1 << 30) || (o->stop_on_loss && !isfinite(o->stop_loss)))
        return sg_fail(ctx, SG_ERR_INVALID, "%s: trainer.stop_nonfinite %d, stop_loss %g: expected 0 to 2^30 steps, "
                       "and a finite loss with stop_on_loss", fn, o->stop_nonfinite, (double)o->stop_loss);
    if (o->vary_seq != (o->n_seq_buckets > 0) || (o->n_seq_buckets && !o->seq_buckets))
        return sg_fail(ctx, SG_ERR_INVALID, "%s: trainer.vary_seq %d with %d seq_buckets: the advisor varies the "
                       "length only as vary_seq draws it, from seq_buckets (set both, or neither)", fn, o->vary_seq,
                       o->n_seq_buckets);
    if (o->vary_seq && tm->accum > 1)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: trainer.vary_seq with accum %d: a step of a drawn length is one "
                       "batch (accum 1)", fn, tm->accum);
    if (o->n_buckets || o->batch_buckets)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: trainer.batch_buckets: the advisor runs the model's fixed batch "
                       "(its steps are sg_trainer_step calls)", fn);
    if (o->dist)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: trainer.dist: the advisor profiles one process; advise a rank's "
                       "model without data parallelism", fn);
    return SG_OK;
}

/* Optimizer steps a call of the caller's trainer options (0 and unset: 1). */
static int steps_per_call(const sg_advise_timing *tm)
{
    return tm->trainer && tm->trainer->steps_per_call > 1 ? tm->trainer->steps_per_call : 1;
}

/* n steps rounded up to whole calls of k. */
static int whole_calls(int n, int k)
{
    return (n + k - 1) / k * k;
}

/* The trainer options of the advisor's runs: the caller's (or the defaults), with the scope,
 * the trainer's own warm-up and the timing's micro-batches a step. */
static sg_trainer_options trainer_options(sg_scope scope, const sg_advise_timing *tm)
{
    sg_trainer_options to = tm->trainer ? *tm->trainer : sg_trainer_options_default();
    to.scope = scope;
    to.warmup = sg_trainer_options_default().warmup;
    to.accum = tm->accum;
    to.steps_per_call = steps_per_call(tm);
    to.dist = NULL;
    return to;
}

/* n optimizer steps from *s, in calls of the trainer's k steps (n a multiple of k). */
static sg_status run_steps(sg_trainer *t, int k, int64_t *s, int n)
{
    for (int i = 0; i < n; i += k, *s += k) SG_TRY(sg_trainer_step(t, *s));
    return SG_OK;
}

/* An early-stop rule that held leaves later calls running nothing: the timings would be of
 * steps that did not run. */
static sg_status check_not_stopped(sg_ctx *ctx, sg_trainer *t, const sg_trainer_options *to, const char *fn)
{
    if (!to->stop_nonfinite && !to->stop_on_loss) return SG_OK;
    sg_trainer_stop st;
    SG_TRY(sg_trainer_get_stop(t, &st));
    if (st.stopped == SG_STOPPED_NO) return SG_OK;
    return sg_fail(ctx, SG_ERR_INVALID, "%s: the early-stop rule (%s) held after %lld steps, so later steps ran "
                   "nothing: advise with a rule that holds later, or none", fn,
                   st.stopped == SG_STOPPED_NONFINITE ? "stop_nonfinite" : "stop_on_loss", (long long)st.steps_run);
}

/* Blocks of steps (whole calls of k), each synced at the end: wall ms per step (median), host
 * ms per step queuing a block (median), launches per step. */
static sg_status time_blocks(sg_ctx *ctx, sg_trainer *t, int k, const sg_advise_timing *tm, int64_t *s,
                             double *wall, double *host, double *launches)
{
    int n = whole_calls(tm->steps, k);
    double *w = calloc((size_t)tm->repeats * 2, sizeof *w);
    if (!w) return sg_fail(ctx, SG_ERR_OOM, "sg_advise: out of host memory timing steps");
    double *h = w + tm->repeats;
    uint64_t k0 = sg_ctx_launch_count(ctx);
    sg_status st = SG_OK;
    for (int r = 0; r < tm->repeats && st == SG_OK; r++) {
        st = sg_ctx_sync(ctx);
        double t0 = sg_advise_now_us();
        if (st == SG_OK) st = run_steps(t, k, s, n);
        double t1 = sg_advise_now_us();
        if (st == SG_OK) st = sg_ctx_sync(ctx);
        w[r] = (sg_advise_now_us() - t0) / 1e3 / n;
        h[r] = (t1 - t0) / 1e3 / n;
    }
    if (st == SG_OK) {
        *launches = (double)(sg_ctx_launch_count(ctx) - k0) / ((double)tm->repeats * n);
        *wall = sg_median(w, tm->repeats);
        *host = sg_median(h, tm->repeats);
    }
    free(w);
    return st;
}

/* GPU-busy per step and kernels per step over busy_steps steps (whole calls of k). A profiler
 * that cannot run (no CUPTI, another client) leaves NAN and a note; a step that fails is an
 * error. */
static sg_status measure_busy(sg_ctx *ctx, sg_trainer *t, int k, const sg_advise_timing *tm, int64_t *s,
                              double *busy_ms, double *kernels, double *short_share, double *family_ms,
                              char *note, size_t note_n)
{
    int n = whole_calls(tm->busy_steps, k);
    *busy_ms = *kernels = *short_share = NAN;
    for (int f = 0; family_ms && f <= SG_WORK_FAMILIES; f++) family_ms[f] = NAN;
    sg_prof *p = NULL;
    sg_prof_result r;
    sg_status pst = sg_prof_create(ctx, &p);
    if (pst == SG_OK) pst = sg_ctx_sync(ctx);
    if (pst == SG_OK) pst = sg_prof_start(p);
    sg_status st = SG_OK;
    if (pst == SG_OK) {
        st = run_steps(t, k, s, n);
        pst = sg_prof_stop(p, &r);
    }
    if (st == SG_OK && pst == SG_OK) {
        *busy_ms = r.busy_us / 1e3 / n;
        *kernels = (double)r.kernels / n;
        *short_share = r.short_kernel_share;
        size_t nr = 0;
        const sg_prof_record *rec = sg_prof_records(p, &nr);
        double us[SG_WORK_FAMILIES + 1];
        if (family_ms && sg_prof_family_us(rec, nr, us) == SG_OK)
            for (int f = 0; f <= SG_WORK_FAMILIES; f++) family_ms[f] = us[f] / 1e3 / n;
        if (r.dropped && note)
            snprintf(note, note_n, "CUPTI dropped %llu records: GPU-busy undercounts", (unsigned long long)r.dropped);
    } else if (st == SG_OK && note) {
        snprintf(note, note_n, "%s", sg_ctx_last_error(ctx));
    }
    sg_prof_destroy(p);
    return st;
}

/* ---- the profile: one eager step by region, from its named ranges ---- */

/* A range's name: a module's (up to 95 bytes) and ".backward". */
#define RANGE_NAME 128

typedef struct range_event {
    char name[RANGE_NAME];
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
    if (!push) e->t_us = sg_advise_now_us(), e->launches = l->ctx->launches;
    size_t k = strlen(name);
    if (k >= sizeof e->name) k = sizeof e->name - 1;
    memcpy(e->name, name, k);
    e->name[k] = '\0';
    e->push = push;
    if (push) e->launches = l->ctx->launches, e->t_us = sg_advise_now_us();
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
 * "<net>.forward"/".backward" (summed over a step's micro-batches), its children's (summed).
 * The load is the stretch from the step's push to the net's first forward push, times the
 * micro-batches (each loads a batch alike; the later loads sit between a backward and the
 * next forward, beside the sums, and are not told apart from them). */
static sg_status split_step(sg_ctx *ctx, const range_log *l, const sg_advise_profile *p, const char *net,
                            step_split *out)
{
    memset(out, 0, sizeof *out);
    if (l->overflow)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_advise_profile_model: a step has more than %d named "
                       "ranges", RANGE_EVENTS / 2);
    char fwd[RANGE_NAME], bwd[RANGE_NAME];
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
        sg_advise_region *sum = !strcmp(e->name, fwd) ? &out->forward : !strcmp(e->name, bwd) ? &out->backward : NULL;
        if (!strcmp(e->name, "step")) out->step = r;
        else if (sum) sum->launches += r.launches, sum->host_us += r.host_us;
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
    int K = p->accum > 1 ? p->accum : 1;
    out->load.launches *= K, out->load.host_us *= K;
    return SG_OK;
}

#define PROBE_STEPS 7

/* PROBE_STEPS eager steps, each queued on an idle device with the range log as the context's
 * range hook; the regions are those of the step of median host time. */
static sg_status probe_regions(sg_ctx *ctx, sg_model *m, sg_trainer *t, int64_t *s, sg_advise_profile *out)
{
    if (!m->net)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_advise_profile_model: model '%s' has no network of modules to "
                       "profile", m->name);
    int n = sg_sequential_count(m->net);
    if (n > SG_ADVISE_MAX_MODULES)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_advise_profile_model: '%s' has %d modules; the advisor takes "
                       "up to %d", m->name, n, SG_ADVISE_MAX_MODULES);
#ifdef SG_MODULE_NAME_MAX
    _Static_assert(sizeof out->modules[0].name >= SG_MODULE_NAME_MAX, "sg_advise_module holds a module's name");
#endif
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
        /* The split of one step, the one of median host time: medians taken part by part can
         * add up to more than the median step (seen on cuDNN models, whose per-call host time
         * varies), and the parts must fit in the whole. */
        int im = 0, best = PROBE_STEPS;
        for (int i = 0; i < PROBE_STEPS; i++) {
            int below = 0, above = 0;
            for (int j = 0; j < PROBE_STEPS; j++)
                below += sp[j].step.host_us < sp[i].step.host_us, above += sp[j].step.host_us > sp[i].step.host_us;
            int off = below > above ? below - above : above - below;
            if (off < best) best = off, im = i;
        }
        sg_trainer_stats ts;
        st = sg_trainer_get_stats(t, &ts);
        out->work = ts.work, out->work_counted = ts.work_counted;
        out->step = sp[im].step, out->load = sp[im].load;
        out->forward = sp[im].forward, out->backward = sp[im].backward;
        for (int k = 0; k < n; k++) out->modules[k].forward = sp[im].fwd[k], out->modules[k].backward = sp[im].bwd[k];
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
        double t0 = sg_advise_now_us();
        SG_TRY(sg_model_load_batch(m, (*s)++));
        h[i] = sg_advise_now_us() - t0;
        l = (double)(sg_ctx_launch_count(ctx) - k0);
    }
    SG_TRY(sg_ctx_sync(ctx));
    int K = out->accum > 1 ? out->accum : 1; /* a step loads K batches */
    out->load_static = (sg_advise_region){K * l, K * sg_median(h, PROBE_STEPS)};
    return SG_OK;
}

/* Tries to capture the step as the trainer's step scope does: a host sync or another call
 * forbidden during capture (data-dependent control flow reads device values) is refused with
 * SG_ERR_CAPTURE, which is reported, not returned. */
static sg_status trial_capture(sg_model *m, sg_optim *o, const sg_advise_timing *tm, int64_t *s,
                               sg_advise_profile *out)
{
    if (sg_graphs_disabled()) {
        snprintf(out->capture_error, sizeof out->capture_error, "not tried: STEPGRAPH_DISABLE_GRAPHS=1");
        return SG_OK;
    }
    /* One plain step a graph: the kernels a step replays (the caller's loop, IF, SWITCH and
     * early stop put some of them in conditional nodes' bodies, which the node count leaves
     * out). The measurement captures the real form. */
    sg_trainer_options to = trainer_options(SG_SCOPE_STEP, tm);
    to.warmup = 1;
    to.steps_per_call = 1;
    to.loop = to.skip_if = to.vary_seq = 0;
    to.seq_buckets = NULL, to.n_seq_buckets = 0;
    to.stop_nonfinite = to.stop_on_loss = 0;
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

sg_status sg_advise_profile_model(sg_ctx *ctx, sg_model_factory factory, void *user,
                                  const sg_advise_timing *tm, sg_advise_profile *out)
{
    if (!ctx) return sg_fail(NULL, SG_ERR_NULL, "sg_advise_profile_model: ctx is NULL");
    if (!factory || !out) return sg_fail(ctx, SG_ERR_NULL, "sg_advise_profile_model: factory or out is NULL");
    memset(out, 0, sizeof *out);
    out->busy_ms = out->kernels = out->short_kernel_share = NAN;
    for (int f = 0; f <= SG_WORK_FAMILIES; f++) out->family_ms[f] = NAN;
    if (ctx->backend != SG_BACKEND_CUDA)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "sg_advise_profile_model: the %s backend has no kernel launches or GPU-busy time to "
                       "profile; the advisor profiles a CUDA device", sg_backend_name(ctx->backend));
    if (!tm) return sg_fail(ctx, SG_ERR_NULL, "sg_advise_profile_model: timing is NULL");
    sg_advise_timing t = *tm;
    SG_TRY(sg_advise_check_timing(ctx, "sg_advise_profile_model", &t));
    /* A fixed batch; the length fixed too unless the caller's trainer draws it (vary_seq). */
    out->shapes_static = !(t.trainer && t.trainer->vary_seq);
    out->accum = t.accum;
    out->steps_per_call = t.trainer ? t.trainer->steps_per_call : 1;
    out->loop = t.trainer ? t.trainer->loop : 0;
    sg_trainer_options eager = trainer_options(SG_SCOPE_EAGER, &t);
    eager.steps_per_call = 1; /* the regions below are one step's; eager calls cost K steps alike */
    sg_model *m = NULL;
    sg_optim *o = NULL;
    sg_trainer *tr = NULL;
    int64_t s = 0;
    sg_status st = build_model(ctx, factory, user, "sg_advise_profile_model", &m);
    if (st == SG_OK) {
        snprintf(out->model, sizeof out->model, "%s", sg_model_name(m));
        out->precision = sg_model_precision(m);
        st = make_optim(ctx, m, &t, &o);
    }
    if (st == SG_OK) st = sg_trainer_create(m, o, &eager, &tr);
    if (st == SG_OK) st = run_steps(tr, 1, &s, t.warmup);
    if (st == SG_OK) st = time_blocks(ctx, tr, 1, &t, &s, &out->wall_ms, &out->block_host_ms, &out->launches);
    if (st == SG_OK) st = probe_regions(ctx, m, tr, &s, out);
    if (st == SG_OK)
        st = measure_busy(ctx, tr, 1, &t, &s, &out->busy_ms, &out->kernels, &out->short_kernel_share,
                          out->family_ms, out->note, sizeof out->note);
    if (st == SG_OK) st = check_not_stopped(ctx, tr, &eager, "sg_advise_profile_model");
    sg_trainer_destroy(tr);
    if (st == SG_OK) st = probe_static_load(ctx, m, &s, out);
    if (st == SG_OK) st = trial_capture(m, o, &t, &s, out);
    sg_optim_destroy(o);
    sg_model_destroy(m);
    return st;
}

/* ---- measurement ---- */

sg_status sg_advise_measure(sg_ctx *ctx, sg_model_factory factory, void *user, sg_scope scope,
                            const sg_advise_timing *tm, sg_advise_measurement *out)
{
    if (!ctx) return sg_fail(NULL, SG_ERR_NULL, "sg_advise_measure: ctx is NULL");
    if (!factory || !out) return sg_fail(ctx, SG_ERR_NULL, "sg_advise_measure: factory or out is NULL");
    memset(out, 0, sizeof *out);
    out->scope = scope;
    out->busy_ms = NAN;
    if (ctx->backend != SG_BACKEND_CUDA)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_advise_measure: the advisor measures on a CUDA device, not "
                       "the %s backend", sg_backend_name(ctx->backend));
    if (scope < SG_SCOPE_EAGER || scope > SG_SCOPE_STEP)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_advise_measure: scope %d: expected eager, layer, model or step",
                       (int)scope);
    if (!tm) return sg_fail(ctx, SG_ERR_NULL, "sg_advise_measure: timing is NULL");
    sg_advise_timing t = *tm;
    SG_TRY(sg_advise_check_timing(ctx, "sg_advise_measure", &t));
    sg_alloc_stats a0, a1;
    SG_TRY(sg_ctx_alloc_stats(ctx, &a0));
    sg_model *m = NULL;
    sg_optim *o = NULL;
    sg_trainer *tr = NULL;
    sg_trainer_options to = trainer_options(scope, &t);
    /* Whole calls of K steps; the warm-up at least the trainer's eager calls, the capture's and
     * one replay's. */
    int K = to.steps_per_call, warm = whole_calls(t.warmup, K);
    if (scope != SG_SCOPE_EAGER && warm < (to.warmup + 2) * K) warm = (to.warmup + 2) * K;
    int64_t s = 0;
    sg_status st = build_model(ctx, factory, user, "sg_advise_measure", &m);
    if (st == SG_OK) st = make_optim(ctx, m, &t, &o);
    if (st == SG_OK) st = sg_trainer_create(m, o, &to, &tr);
    if (st == SG_OK) st = run_steps(tr, K, &s, warm);
    if (st == SG_OK) st = time_blocks(ctx, tr, K, &t, &s, &out->step_ms, &out->host_ms, &out->launches);
    if (st == SG_OK) {
        double k, sh;
        st = measure_busy(ctx, tr, K, &t, &s, &out->busy_ms, &k, &sh, NULL, NULL, 0);
    }
    if (st == SG_OK) st = check_not_stopped(ctx, tr, &to, "sg_advise_measure");
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
