/* advise.c: sg_advise, the capture advisor's driver (stepgraph.h): calibrate the device's launch
 * path (or take the caller's calibration), profile the factory's model, predict every scope and
 * summarize (prof/predict.c), then train and time each scope that can be captured, eager first,
 * and set each measurement beside its prediction. `stepgraph advise` prints what it returns. */
#define _GNU_SOURCE /* sched_getcpu, pthread_{get,set}affinity_np */
#include "advise/advise.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

sg_advise_options sg_advise_options_default(void)
{
    return (sg_advise_options){.warmup = 20, .steps = 50, .repeats = 5, .busy_steps = 20, .measure = 1,
                               .hold_cpu = 1, .accum = 1, .optim_state = SG_DTYPE_F32};
}

/* Holds the calling thread on the core it runs on (*cpu), keeping its mask in *saved for
 * give_cpu_back. Best effort: a failure leaves the thread where it was, *cpu -1, and says so in
 * note; the advice is still given. */
static bool hold_cpu(int *cpu, char *note, size_t n, cpu_set_t *saved)
{
    *cpu = -1;
    int err = pthread_getaffinity_np(pthread_self(), sizeof *saved, saved);
    int c = err ? -1 : sched_getcpu();
    if (c < 0) {
        snprintf(note, n, "not held on one core: %s", err ? strerror(err) : "sched_getcpu failed");
        return false;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c, &one);
    err = pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    if (err) {
        snprintf(note, n, "not held on core %d: %s", c, strerror(err));
        return false;
    }
    *cpu = c;
    snprintf(note, n, "held on core %d", c);
    return true;
}

static void give_cpu_back(const cpu_set_t *saved)
{
    (void)pthread_setaffinity_np(pthread_self(), sizeof *saved, saved);
}

static void report(const sg_advise_options *o, const sg_advise_result *r, sg_advise_stage stage, sg_scope s)
{
    if (o->progress) o->progress(o->progress_user, r, stage, s);
}

/* Layer scope when the net is not a Sequential: nothing to wrap. The prediction carries
 * eager's numbers and is not capturable, so the summary passes over it. */
static void nothing_to_wrap(const sg_advise_prediction *eager, sg_advise_prediction *out)
{
    *out = *eager;
    out->scope = SG_SCOPE_LAYER;
    out->capturable = 0;
    snprintf(out->note, sizeof out->note, "layer scope wraps the children of the model's Sequential, and "
             "this model's net is not one");
}

/* Layer and model scope under a trainer that draws each step's length (vary_seq): the trainer
 * runs sequence buckets under eager and step scope only. Predicted as eager, not capturable. */
static void no_buckets(const sg_advise_prediction *eager, sg_scope scope, sg_advise_prediction *out)
{
    *out = *eager;
    out->scope = scope;
    out->capturable = 0;
    snprintf(out->note, sizeof out->note, "%s scope does not run sequence buckets (trainer.vary_seq): the "
             "trainer runs them under eager and step scope", sg_scope_name(scope));
}

/* Every scope's prediction, eager first, then the summary. A scope that cannot be predicted
 * (no CUPTI, a bad profile) fails the whole: the verdict compares them all. tr: the caller's
 * trainer options (NULL: defaults): steps_per_call and loop shape the step scope's. */
static sg_status predict_all(sg_ctx *ctx, const sg_trainer_options *tr, sg_advise_result *r)
{
    sg_advise_prediction pred[SG_ADVISE_SCOPES];
    bool vary = tr && tr->vary_seq;
    for (int s = 0; s < SG_ADVISE_SCOPES; s++) {
        sg_advise_prediction *q = &r->scopes[s].predicted;
        if (vary && (s == SG_SCOPE_LAYER || s == SG_SCOPE_MODEL)) {
            no_buckets(&r->scopes[SG_SCOPE_EAGER].predicted, (sg_scope)s, q);
        } else if (s == SG_SCOPE_LAYER && r->profile.n_modules == 0) {
            nothing_to_wrap(&r->scopes[SG_SCOPE_EAGER].predicted, q);
        } else {
            sg_status st = sg_advise_predict(&r->calib, &r->profile, (sg_scope)s, q);
            if (st != SG_OK)
                return sg_fail(ctx, st, "sg_advise: cannot predict %s scope: %s", sg_scope_name((sg_scope)s),
                               q->note);
        }
        pred[s] = *q;
    }
    if (sg_advise_summarize(&r->calib, &r->profile, pred, &r->summary) != SG_OK)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_advise: the predictions of '%s' do not add up to a summary",
                       r->model);
    return SG_OK;
}

/* Measures every scope that can be captured, eager first (the others are relative to it). A
 * failure is recorded in its scope; the first one's status is returned, its message on ctx. */
static sg_status measure_all(sg_ctx *ctx, sg_model_factory factory, void *user, const sg_advise_timing *tm,
                             const sg_advise_options *o, sg_advise_result *r)
{
    sg_status first = SG_OK;
    char msg[768] = "";
    const sg_advise_scope_result *eager = &r->scopes[SG_SCOPE_EAGER];
    for (int s = 0; s < SG_ADVISE_SCOPES; s++) {
        sg_advise_scope_result *sr = &r->scopes[s];
        const char *name = sg_scope_name((sg_scope)s);
        if (!sr->predicted.capturable) {
            snprintf(sr->measure_note, sizeof sr->measure_note, "not measured: %s", sr->predicted.note);
            continue;
        }
        if (s != SG_SCOPE_EAGER && !eager->measured) {
            snprintf(sr->measure_note, sizeof sr->measure_note, "not measured: eager scope's measurement, "
                     "which the others are compared with, failed");
            continue;
        }
        sg_status st = sg_advise_measure(ctx, factory, user, (sg_scope)s, tm, &sr->measurement);
        if (st != SG_OK) {
            sr->measure_status = st;
            snprintf(sr->measure_note, sizeof sr->measure_note, "%s", sg_ctx_last_error(ctx));
            r->measure_failures++;
            if (first == SG_OK) {
                first = st;
                snprintf(msg, sizeof msg, "sg_advise: measuring %s scope: %s", name, sr->measure_note);
            }
            report(o, r, SG_ADVISE_STAGE_MEASURED, (sg_scope)s);
            continue;
        }
        sr->measured = 1;
        const sg_advise_measurement *m = &sr->measurement, *e = &eager->measurement;
        sr->error_pct = 100 * (sr->predicted.step_ms - m->step_ms) / m->step_ms;
        sr->measured_speedup = e->step_ms / m->step_ms;
        sr->measured_extra_bytes = m->bytes + m->exec_bytes - e->bytes;
        report(o, r, SG_ADVISE_STAGE_MEASURED, (sg_scope)s);
    }
    if (first != SG_OK) return sg_fail(ctx, first, "%s", msg);
    return SG_OK;
}

/* The summary's verdict with the recommended scope's measured speedup added inside its
 * closing parenthesis: "... (step scope predicted 1.78x; measured 1.85x)". */
static void verdict_measured(sg_advise_result *r)
{
    const sg_advise_scope_result *best = &r->scopes[r->summary.best];
    const char *v = r->summary.verdict;
    size_t n = strlen(v);
    r->best_measured_speedup = best->measured ? best->measured_speedup : NAN;
    if (!best->measured)
        snprintf(r->verdict, sizeof r->verdict, "%s", v);
    else if (n && v[n - 1] == ')')
        snprintf(r->verdict, sizeof r->verdict, "%.*s; measured %.2fx)", (int)n - 1, v, r->best_measured_speedup);
    else
        snprintf(r->verdict, sizeof r->verdict, "%s (measured %.2fx)", v, r->best_measured_speedup);
}

/* The floor of the profiled step on this device's peaks, best effort: a failure is a note. */
static void speed_of_light(sg_ctx *ctx, sg_advise_result *r)
{
    if (!r->profile.work_counted) {
        snprintf(r->sol_note, sizeof r->sol_note, "no work counted: the profile ran no eager step");
        return;
    }
    sg_dtype dt = r->precision == SG_DTYPE_BF16 ? SG_DTYPE_BF16 : SG_DTYPE_F32;
    if (sg_device_peaks_measure(ctx, dt, &r->peaks) != SG_OK) {
        snprintf(r->sol_note, sizeof r->sol_note, "%s", sg_ctx_last_error(ctx));
        return;
    }
    r->sol_ok = sg_sol_floor(&r->profile.work, &r->peaks, &r->sol) == SG_OK;
    if (!r->sol_ok) snprintf(r->sol_note, sizeof r->sol_note, "the peaks or the work are not finite");
}

/* sg_advise once the thread is where it stays. */
static sg_status advise_held(sg_ctx *ctx, sg_model_factory factory, void *user, const sg_advise_options *o,
                             const sg_advise_timing *tm, sg_advise_result *out)
{
    if (o->calib) out->calib = *o->calib;
    else SG_TRY(sg_advise_calibrate(ctx, &out->calib));
    SG_TRY(sg_advise_profile_model(ctx, factory, user, tm, &out->profile));
    snprintf(out->model, sizeof out->model, "%s", out->profile.model);
    out->precision = out->profile.precision;
    speed_of_light(ctx, out);
    report(o, out, SG_ADVISE_STAGE_PROFILED, SG_SCOPE_EAGER);
    SG_TRY(predict_all(ctx, o->trainer, out));
    snprintf(out->verdict, sizeof out->verdict, "%s", out->summary.verdict);
    report(o, out, SG_ADVISE_STAGE_PREDICTED, out->summary.best);
    if (!o->measure) {
        for (int s = 0; s < SG_ADVISE_SCOPES; s++)
            snprintf(out->scopes[s].measure_note, sizeof out->scopes[s].measure_note,
                     "not measured: measure is 0 (predict only)");
        return SG_OK;
    }
    sg_status st = measure_all(ctx, factory, user, tm, o, out);
    verdict_measured(out);
    return st;
}

sg_status sg_advise(sg_ctx *ctx, sg_model_factory factory, void *user, const sg_advise_options *opts,
                    sg_advise_result *out)
{
    if (!ctx) return sg_fail(NULL, SG_ERR_NULL, "sg_advise: ctx is NULL");
    if (!factory || !out) return sg_fail(ctx, SG_ERR_NULL, "sg_advise: factory or out is NULL");
    sg_advise_options o = opts ? *opts : sg_advise_options_default();
    memset(out, 0, sizeof *out);
    out->best_measured_speedup = NAN;
    for (int s = 0; s < SG_ADVISE_SCOPES; s++) {
        sg_advise_scope_result *sr = &out->scopes[s];
        sr->scope = sr->predicted.scope = sr->measurement.scope = (sg_scope)s;
        sr->error_pct = sr->measured_speedup = sr->measured_extra_bytes = NAN;
    }
    out->options = o;
    out->options.calib = NULL, out->options.progress = NULL, out->options.progress_user = NULL;
    out->options.trainer = NULL;
    snprintf(out->device, sizeof out->device, "%s", sg_ctx_device_name(ctx));
    sg_advise_timing tm = {.warmup = o.warmup, .steps = o.steps, .repeats = o.repeats, .busy_steps = o.busy_steps,
                           .accum = o.accum, .trainer = o.trainer, .optim_state = o.optim_state};
    SG_TRY(sg_advise_check_timing(ctx, "sg_advise", &tm)); /* before a second of calibration */

    cpu_set_t saved;
    bool held = false;
    out->cpu = -1;
    if (o.hold_cpu) held = hold_cpu(&out->cpu, out->cpu_note, sizeof out->cpu_note, &saved);
    else snprintf(out->cpu_note, sizeof out->cpu_note, "not held: hold_cpu is 0");
    sg_status st = advise_held(ctx, factory, user, &o, &tm, out);
    if (held) give_cpu_back(&saved);
    return st;
}

/* ---- a built-in model by name ---- */

typedef struct named_model {
    const char *name;
    const sg_model_options *mo;
} named_model;

static sg_status build_named(sg_ctx *ctx, void *user, sg_model **out)
{
    const named_model *n = user;
    return sg_model_create_ex(ctx, n->name, 1, n->mo, out);
}

sg_status sg_advise_name(sg_ctx *ctx, const char *name, const sg_model_options *mo,
                         const sg_advise_options *opts, sg_advise_result *out)
{
    if (!ctx) return sg_fail(NULL, SG_ERR_NULL, "sg_advise_name: ctx is NULL");
    if (!name) return sg_fail(ctx, SG_ERR_NULL, "sg_advise_name: name is NULL");
    named_model n = {name, mo};
    return sg_advise(ctx, build_named, &n, opts, out);
}

/* ---- generation (the parts, the prediction and the measurements: generate.c) ---- */

sg_status sg_advise_generate(sg_ctx *ctx, sg_generator *g, const sg_generate_request *r,
                             const sg_advise_options *opts, sg_advise_gen_result *out)
{
    if (!ctx) return sg_fail(NULL, SG_ERR_NULL, "sg_advise_generate: ctx is NULL");
    if (!g || !r || !out)
        return sg_fail(ctx, SG_ERR_NULL, "sg_advise_generate: %s is NULL", !g ? "g (the generator)" : !r ? "r (the "
                       "request)" : "out");
    sg_advise_options o = opts ? *opts : sg_advise_options_default();
    cpu_set_t saved;
    bool held = false;
    memset(out, 0, sizeof *out);
    out->cpu = -1;
    if (o.hold_cpu) held = hold_cpu(&out->cpu, out->cpu_note, sizeof out->cpu_note, &saved);
    else snprintf(out->cpu_note, sizeof out->cpu_note, "not held: hold_cpu is 0");
    sg_status st = sg_advise_gen_run(ctx, g, r, &o, out);
    if (held) give_cpu_back(&saved);
    return st;
}
