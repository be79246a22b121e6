/* verify.c: sg_verify, a captured scope against eager for any model: two copies from one
 * factory, one trainer eager and one under the scope, compared after every step (loss, loss
 * scaler, gradients, parameters, buffers), through public calls only: what `stepgraph verify` does for
 * the built-ins, a user does for their own model. */
#include "core/core.h" /* SG_TRY */

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sg_verify_options sg_verify_options_default(void)
{
    sg_trainer_options t = sg_trainer_options_default();
    return (sg_verify_options){.scope = SG_SCOPE_STEP, .steps = 20, .warmup = t.warmup, .optim = SG_OPTIM_ADAMW,
                               .accum = t.accum};
}

typedef struct side {
    sg_model *m;
    sg_optim *o;
    sg_trainer *t;
} side;

/* Compares n floats; returns the first index outside tolerance or -1; *max_abs the largest
 * difference (NaN if any is). */
static int64_t compare(const float *a, const float *b, int64_t n, double atol, double rtol, double *max_abs)
{
    int64_t first = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        bool same = atol == 0 && rtol == 0 ? memcmp(&a[i], &b[i], 4) == 0 : d <= atol + rtol * fabs((double)a[i]);
        if (d > *max_abs || isnan(d)) *max_abs = d;
        if (!same && first < 0) first = i;
    }
    return first;
}

/* The parameter whose slice of the flat buffer holds element i. */
static const char *param_at(const sg_model *m, int64_t i)
{
    const char *name;
    int64_t off, n;
    for (int p = 0; p < sg_model_param_tensors(m); p++)
        if (sg_model_param_info(m, p, &name, &off, &n) == SG_OK && i >= off && i < off + n) return name;
    return "(padding)";
}

/* The buffer whose slice of the flat buffer tensor holds element i. */
static const char *buffer_at(const sg_model *m, int64_t i)
{
    const char *name;
    int64_t off, n;
    for (int b = 0; b < sg_model_buffer_tensors(m); b++)
        if (sg_model_buffer_info(m, b, &name, &off, &n) == SG_OK && i >= off && i < off + n) return name;
    return "(padding)";
}

/* t's values as floats (F32, or BF16 widened in place from the end: element i's float covers
 * bf16 elements 2i and 2i+1, already read by then). */
static sg_status read_all(sg_ctx *ctx, const sg_tensor *t, float *out)
{
    SG_TRY(sg_tensor_copy_to_host(t, out, sg_tensor_nbytes(t)));
    if (sg_tensor_dtype(t) != SG_DTYPE_BF16) return SG_OK;
    for (int64_t i = sg_tensor_numel(t) - 1; i >= 0; i--) {
        uint16_t v;
        memcpy(&v, (const char *)out + 2 * i, sizeof v); /* bytes, not a uint16_t alias of floats */
        out[i] = (float)sg_bf16_to_double(v);
    }
    return SG_OK;
}

/* What compare_step reads, kind 0..2: the f32 gradients, the scaled bf16 ones (NULL in fp32),
 * the parameters. */
static sg_tensor *compared(sg_model *m, int kind)
{
    return kind == 0 ? sg_model_grads(m) : kind == 1 ? sg_model_grads_lo(m) : sg_model_params(m);
}

/* One step's comparison; fills row and, on the first difference, r->mismatch. */
static sg_status compare_step(sg_ctx *ctx, side s[2], const sg_verify_options *o, int64_t step, float *a, float *b,
                              int64_t P, sg_verify_step *row, sg_verify_result *r)
{
    *row = (sg_verify_step){.step = step};
    sg_status st = sg_model_loss_read(s[0].m, &row->loss_eager);
    if (st == SG_OK) st = sg_model_loss_read(s[1].m, &row->loss_graph);
    if (st != SG_OK) return st;
    bool differ = compare(&row->loss_eager, &row->loss_graph, 1, o->atol, o->rtol, &row->max_dloss) >= 0;
    if (differ)
        snprintf(r->mismatch, sizeof r->mismatch, "loss (eager %.9g, graph %.9g)", row->loss_eager, row->loss_graph);
    /* The loss scaler (scale, good steps, skipped steps) must agree exactly. */
    sg_loss_scaler sa, sb;
    SG_TRY(sg_trainer_get_scaler(s[0].t, &sa));
    SG_TRY(sg_trainer_get_scaler(s[1].t, &sb));
    if (!differ && memcmp(&sa, &sb, sizeof sa)) {
        differ = true;
        snprintf(r->mismatch, sizeof r->mismatch, "amp.scaler (eager scale %g, %g skipped; graph scale %g, %g skipped)",
                 sa.scale, sa.skipped, sb.scale, sb.skipped);
    }
    /* The f32 gradients, mixed precision's scaled bf16 ones (what the backward wrote: with the
     * unscale folded into the optimizer the f32 ones are not written), then the parameters. */
    for (int kind = 0; kind < 3; kind++) {
        sg_tensor *ta = compared(s[0].m, kind), *tb = compared(s[1].m, kind);
        if (!ta || !tb) continue;
        SG_TRY(read_all(ctx, ta, a));
        SG_TRY(read_all(ctx, tb, b));
        double scaled_max = 0;
        int64_t i = compare(a, b, P, o->atol, o->rtol,
                            kind == 2 ? &row->max_dparam : kind ? &scaled_max : &row->max_dgrad);
        if (i >= 0 && !differ) {
            differ = true;
            snprintf(r->mismatch, sizeof r->mismatch, "%s%s (element %lld of the flat buffer: eager %.9g, graph %.9g)",
                     param_at(s[0].m, i), kind == 2 ? "" : kind ? ".grad (bf16, scaled)" : ".grad", (long long)i, a[i],
                     b[i]);
        }
    }
    sg_tensor *ba = sg_model_buffers(s[0].m), *bb = sg_model_buffers(s[1].m);
    if (ba && bb) { /* BatchNorm's running statistics and the like */
        int64_t nb = sg_tensor_numel(ba);
        float *ha = malloc((size_t)nb * sizeof *ha), *hb = malloc((size_t)nb * sizeof *hb);
        sg_status st2 = ha && hb ? read_all(ctx, ba, ha) : sg_ctx_fail(ctx, SG_ERR_OOM, "sg_verify: buffers");
        if (st2 == SG_OK) st2 = read_all(ctx, bb, hb);
        int64_t i = st2 == SG_OK ? compare(ha, hb, nb, o->atol, o->rtol, &row->max_dbuffer) : -1;
        if (i >= 0 && !differ) {
            differ = true;
            snprintf(r->mismatch, sizeof r->mismatch, "%s (element %lld of the buffers: eager %.9g, graph %.9g)",
                     buffer_at(s[0].m, i), (long long)i, ha[i], hb[i]);
        }
        free(ha), free(hb);
        SG_TRY(st2);
    }
    /* Early stop: both sides ran the same steps and stopped for the same reason. */
    sg_trainer_stop pa, pb;
    SG_TRY(sg_trainer_get_stop(s[0].t, &pa));
    SG_TRY(sg_trainer_get_stop(s[1].t, &pb));
    if (!differ && (pa.steps_run != pb.steps_run || pa.stopped != pb.stopped)) {
        differ = true;
        snprintf(r->mismatch, sizeof r->mismatch, "steps run (eager %lld, stopped %d; graph %lld, stopped %d)",
                 (long long)pa.steps_run, (int)pa.stopped, (long long)pb.steps_run, (int)pb.stopped);
    }
    if (differ) r->mismatch_step = step;
    return SG_OK;
}

sg_status sg_verify(sg_ctx *ctx, sg_model_factory factory, void *user, const sg_verify_options *opts,
                    sg_verify_result *out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!factory || !out) return sg_ctx_fail(ctx, SG_ERR_NULL, "sg_verify: factory and out are required");
    memset(out, 0, sizeof *out);
    sg_verify_options o = opts ? *opts : sg_verify_options_default();
    if (o.steps < 1 || o.warmup < 0 || o.atol < 0 || o.rtol < 0 || !(o.clip >= 0) || o.scope < SG_SCOPE_EAGER ||
        o.scope > SG_SCOPE_STEP)
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_verify: steps %lld (>= 1), warmup %d (>= 0), atol %g, rtol %g, "
                           "clip %g (>= 0) or scope %d out of range", (long long)o.steps, o.warmup, o.atol, o.rtol,
                           o.clip, (int)o.scope);
    if (o.scope != SG_SCOPE_EAGER && o.steps < (int64_t)o.warmup + 2)
        /* Steps 1..warmup run eagerly on both sides and step warmup+1 captures: fewer steps
         * would compare eager with eager and pass on nothing. */
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_verify: %lld steps with warmup %d compare %s: steps 1..%d run "
                           "eagerly and step %d is the capture's first replay; give %d steps or more",
                           (long long)o.steps, o.warmup, o.steps <= o.warmup ? "no step replayed from a graph"
                                                                            : "one replay only",
                           o.warmup, o.warmup + 1, o.warmup + 2);
    if (o.scope != SG_SCOPE_EAGER && sg_graphs_disabled())
        return sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_verify: STEPGRAPH_DISABLE_GRAPHS=1 runs every scope eagerly: "
                           "there is no graph to verify; unset it");
    side s[2] = {{0}};
    float *a = NULL, *b = NULL;
    sg_status st = SG_OK;
    for (int k = 0; k < 2 && st == SG_OK; k++) {
        sg_trainer_options to = o.trainer ? *o.trainer : sg_trainer_options_default();
        to.scope = SG_SCOPE_EAGER;
        to.clip = o.clip;
        to.accum = o.accum;
        if (k) to.scope = o.scope, to.warmup = o.warmup, to.graph_modules = o.graph_modules;
        st = factory(ctx, user, &s[k].m);
        if (st == SG_OK && !s[k].m) st = sg_ctx_fail(ctx, SG_ERR_NULL, "sg_verify: the factory returned no model");
        if (st == SG_OK) st = sg_optim_create(ctx, s[k].m, o.optim, &s[k].o);
        if (st == SG_OK) st = sg_optim_set_state_dtype(s[k].o, o.optim_state);
        if (st == SG_OK) st = sg_trainer_create(s[k].m, s[k].o, &to, &s[k].t);
    }
    int64_t P = 0;
    if (st == SG_OK) {
        P = sg_tensor_numel(sg_model_params(s[0].m));
        if (P != sg_tensor_numel(sg_model_params(s[1].m)))
            st = sg_ctx_fail(ctx, SG_ERR_INVALID, "sg_verify: the factory built models of %lld and %lld parameters: "
                             "it must build the same model each time", (long long)P,
                             (long long)sg_tensor_numel(sg_model_params(s[1].m)));
    }
    if (st == SG_OK && (!(a = malloc((size_t)P * sizeof *a)) || !(b = malloc((size_t)P * sizeof *b))))
        st = sg_ctx_fail(ctx, SG_ERR_OOM, "sg_verify: %lld parameters' host copies", (long long)P);
    int64_t per_call = o.trainer && o.trainer->steps_per_call > 1 ? o.trainer->steps_per_call : 1;
    for (int64_t step = 0; st == SG_OK && step < o.steps && !out->mismatch_step; step++) {
        if (o.before_step) st = o.before_step(o.user, step, s[0].o, s[1].o);
        for (int k = 0; k < 2 && st == SG_OK; k++) {
            st = sg_trainer_step(s[k].t, step * per_call);
            if (st != SG_OK)
                st = sg_ctx_fail(ctx, st, "sg_verify: step %lld (%s): %s", (long long)step + 1, k ? "graph" : "eager",
                                 sg_ctx_last_error(ctx));
        }
        if (st == SG_OK && o.after_step) st = o.after_step(o.user, step, s[0].m, s[1].m);
        sg_verify_step row;
        if (st == SG_OK) st = compare_step(ctx, s, &o, step + 1, a, b, P, &row, out);
        if (st == SG_OK) {
            out->steps = step + 1;
            if (o.on_step) o.on_step(o.user, &row);
        }
    }
    if (st == SG_OK) st = sg_trainer_get_stats(s[1].t, &out->stats);
    if (st == SG_OK && !out->mismatch_step) {
        const sg_trainer_stats *ts = &out->stats;
        /* Matching proves nothing if the graph side never ran a graph. */
        out->replayed = o.scope == SG_SCOPE_EAGER || ts->fell_back || !ts->replays ? 0 : o.steps - o.warmup;
        out->passed = o.scope == SG_SCOPE_EAGER || out->replayed > 0;
        if (!out->passed)
            snprintf(out->no_graph, sizeof out->no_graph, "no step ran from a graph under scope %s (%d graphs, %llu "
                     "replays)%s%s: the %lld steps compared eager with eager", sg_scope_name(o.scope), ts->graphs,
                     (unsigned long long)ts->replays, ts->fell_back ? "; capture fell back to eager: " : "",
                     ts->fell_back ? ts->fallback_reason : "", (long long)o.steps);
    }
    free(a), free(b);
    for (int k = 0; k < 2; k++) {
        sg_trainer_destroy(s[k].t);
        sg_optim_destroy(s[k].o);
        sg_model_destroy(s[k].m);
    }
    return st;
}
