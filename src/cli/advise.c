/* advise.c: `stepgraph advise`: calibrates this device's launch path, profiles eager steps of a
 * model, prints the checklist and what each capture scope is predicted to buy (prof/advise.h,
 * docs/advisor.md), then, unless --no-measure, trains under each scope, times it as `stepgraph
 * bench` does and prints predicted next to measured, and the verdict. --json: one object. */
#include "cli/cli.h"
#include "prof/advise.h"
#include "prof/prof.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef SG_GIT_COMMIT
#define SG_GIT_COMMIT "unknown"
#endif

static const char *advise_usage =
    "usage: stepgraph advise --model NAME [options]\n"
    "\n"
    "Tells, before capturing, what each capture scope (eager, layer, model, step) will buy a\n"
    "model on this GPU, then measures it. Steps: calibrate this device's launch path (eager\n"
    "launches, graph replays, capture and instantiate costs, ~1 s); profile eager steps of the\n"
    "model (ms/step, host time to queue a step, GPU-busy time and kernels by CUPTI, launches by\n"
    "region: forward and backward of each module, loss, optimizer); try to capture the step (a\n"
    "host sync in it would be named); print the checklist and the prediction per scope (step ms,\n"
    "speedup, capture + instantiate ms, break-even steps, extra memory); then train under each\n"
    "scope, time it and print predicted next to measured. The model: docs/advisor.md.\n"
    "\n"
    "options:\n"
    "  --model NAME        e.g. mlp-512-6-32 or gpt-256-4-8-128 (required)\n"
    "  --precision P       fp32 (default) or bf16 (gpt: mixed precision)\n"
    "  --no-measure        predict only: do not train under each scope\n"
    "  --steps N           steps per timed block (default 50)\n"
    "  --repeats R         timed blocks; the median is reported (default 5)\n"
    "  --warmup W          untimed steps before timing, capture included (default 20, at least 5)\n"
    "  --data PATH         gpt: the text to train on (a regular file)\n"
    "  --backend B         cuda or auto (default auto); advise profiles a CUDA device, so cpu\n"
    "                      is refused\n"
    "  --json              one JSON object on stdout instead of tables\n"
    "  -h, --help          this text\n"
    "\n"
    "exit status: 0 done, 1 a runtime error (no CUDA device, a failed step), 2 a usage error\n";

#define MIB (1024.0 * 1024.0)

/* ---- text output ---- */

static void print_calib(const sg_advise_calib *c)
{
    printf("calibration (the library's own launch path: fills of one element, graphs of them):\n");
    printf("  eager launch    %.2f us host; %.2f us device per queued tiny kernel (idle gap %.2f us)\n",
           c->launch_host_us, c->eager_kernel_us, c->eager_gap_us);
    printf("  graph replay    %.2f us + %.3f us/node host; %.3f us device per node (gap %.3f us), "
           "+%.2f us per graph launch\n", c->replay_base_us, c->replay_node_us, c->node_device_us,
           c->node_gap_us, c->graph_gap_us);
    printf("  one-off         capture %.1f us + %.2f us/node, instantiate %.1f us + %.2f us/node, "
           "executable graph %.0f B + %.0f B/node\n", c->capture_base_us, c->capture_node_us,
           c->instantiate_base_us, c->instantiate_node_us, c->exec_base_bytes, c->exec_node_bytes);
    if (!c->device_timed) printf("  device gaps unknown: %s\n", c->note);
}

static void print_profile(const sg_advise_profile *p, const sg_advise_timing *tm)
{
    printf("\neager profile (%d warm-up steps, median of %d blocks of %d steps):\n", tm->warmup, tm->repeats,
           tm->steps);
    printf("  %.4f ms/step wall, %.4f ms host to queue a step, ", p->wall_ms, p->step.host_us / 1e3);
    if (isnan(p->busy_ms)) printf("GPU-busy unknown (%s), ", p->note);
    else printf("%.4f ms GPU-busy, %.1f kernels, ", p->busy_ms, p->kernels);
    printf("%.1f launches\n", p->launches);
    double rl = p->step.launches - p->load.launches - p->forward.launches - p->backward.launches;
    double rh = p->step.host_us - p->load.host_us - p->forward.host_us - p->backward.host_us;
    printf("  a step by region (launches, host ms): load %.0f (%.3f), forward %.0f (%.3f), loss + optimizer "
           "%.0f (%.3f), backward %.0f (%.3f); %d modules\n", p->load.launches, p->load.host_us / 1e3,
           p->forward.launches, p->forward.host_us / 1e3, rl, rh / 1e3, p->backward.launches,
           p->backward.host_us / 1e3, p->n_modules);
}

static void print_checklist(const sg_advise_profile *p, const sg_advise_summary *s)
{
    printf("\nchecklist:\n");
    printf("  GPU utilisation           %4.0f%%  (GPU-busy / wall)\n", 100 * s->gpu_utilisation);
    printf("  launch-overhead share     %4.0f%%  (the eager step's time a step graph removes; > %.0f%%: "
           "graphs pay, <= %.0f%%: GPU-bound)\n", 100 * s->launch_share, 100 * SG_ADVISE_SHARE_PAYS,
           100 * SG_ADVISE_SHARE_HELPS);
    printf("  small kernels             %4.0f%%  (of kernels, shorter than %.0f us)\n",
           100 * s->short_kernel_share, SG_PROF_SHORT_KERNEL_US);
    printf("  shape stability           %s\n",
           s->shapes_static ? "static (no shape buckets: one graph serves every step)" : "varies: a graph per bucket");
    if (!p->capture_tried) printf("  host syncs in the step    unknown (%s)\n", p->capture_error);
    else if (s->host_syncs) printf("  host syncs in the step    FOUND: %s\n", p->capture_error);
    else printf("  host syncs in the step    none (a trial capture of the step took %d nodes)\n", p->step_nodes);
}

static void print_predictions(const sg_advise_prediction *pr)
{
    printf("\nprediction:\n");
    printf("  %-6s %9s %8s %9s %10s  %-6s %8s %6s %16s %11s %10s\n", "scope", "step ms", "speedup", "host ms",
           "device ms", "bound", "launches", "nodes", "capture+inst ms", "break-even", "extra MiB");
    for (int s = 0; s < SG_ADVISE_SCOPES; s++) {
        const sg_advise_prediction *q = &pr[s];
        char be[32];
        printf("  %-6s %9.4f %7.2fx %9.4f %10.4f  %-6s %8.1f %6.0f %16.2f %11s %10.2f%s\n", sg_scope_name(q->scope),
               q->step_ms, q->speedup, q->host_ms, q->device_ms, q->host_bound ? "host" : "device", q->launches,
               q->nodes, q->setup_ms, sg_advise_steps_str(q->break_even_steps, be, sizeof be),
               q->extra_bytes / MIB, q->capturable ? "" : "  (cannot be captured)");
    }
}

static double err_pct(double pred, double meas) { return 100 * (pred - meas) / meas; }

static void print_measure_head(const sg_advise_timing *tm)
{
    printf("\nmeasured (%d warm-up steps, median of %d blocks of %d steps):\n", tm->warmup, tm->repeats, tm->steps);
    printf("  %-6s %21s %8s %21s %29s %23s\n", "scope", "step ms pred / meas", "error", "speedup pred / meas",
           "capture+inst ms pred / meas", "extra MiB pred / meas");
}

static void print_measure_row(const sg_advise_prediction *q, const sg_advise_measurement *m, double eager_ms,
                              double eager_bytes)
{
    char ms[48], sp[48], setup[48], extra[48];
    snprintf(ms, sizeof ms, "%.4f / %.4f", q->step_ms, m->step_ms);
    snprintf(sp, sizeof sp, "%.2fx / %.2fx", q->speedup, eager_ms / m->step_ms);
    snprintf(setup, sizeof setup, "%.2f / %.2f", q->setup_ms, m->capture_ms + m->instantiate_ms);
    snprintf(extra, sizeof extra, "%.2f / %.2f", q->extra_bytes / MIB, (m->bytes + m->exec_bytes - eager_bytes) / MIB);
    printf("  %-6s %21s %+7.1f%% %21s %29s %23s%s%s\n", sg_scope_name(q->scope), ms, err_pct(q->step_ms, m->step_ms),
           sp, setup, extra, m->fell_back ? "  fell back to eager: " : "", m->fell_back ? m->fallback_reason : "");
    fflush(stdout);
}

/* ---- JSON ---- */

static void json_num(double v)
{
    if (isfinite(v)) printf("%.6g", v);
    else printf("null");
}

/* "key": value pairs, comma-separated; the caller writes the braces. */
static void json_kv(bool *first, const char *key, double v)
{
    printf("%s\"%s\": ", *first ? "" : ", ", key);
    json_num(v);
    *first = false;
}

static void json_ks(bool *first, const char *key, const char *v)
{
    printf("%s\"%s\": ", *first ? "" : ", ", key);
    sg_cli_json_str(stdout, v);
    *first = false;
}

static void json_kb(bool *first, const char *key, bool v)
{
    printf("%s\"%s\": %s", *first ? "" : ", ", key, v ? "true" : "false");
    *first = false;
}

static void json_calib(const sg_advise_calib *c)
{
    bool f = true;
    printf("{");
    json_kv(&f, "launch_host_us", c->launch_host_us);
    json_kv(&f, "replay_base_us", c->replay_base_us);
    json_kv(&f, "replay_node_us", c->replay_node_us);
    json_kv(&f, "tiny_kernel_us", c->tiny_kernel_us);
    json_kv(&f, "eager_kernel_us", c->eager_kernel_us);
    json_kv(&f, "node_device_us", c->node_device_us);
    json_kv(&f, "eager_gap_us", c->eager_gap_us);
    json_kv(&f, "node_gap_us", c->node_gap_us);
    json_kv(&f, "graph_gap_us", c->graph_gap_us);
    json_kv(&f, "capture_base_us", c->capture_base_us);
    json_kv(&f, "capture_node_us", c->capture_node_us);
    json_kv(&f, "instantiate_base_us", c->instantiate_base_us);
    json_kv(&f, "instantiate_node_us", c->instantiate_node_us);
    json_kv(&f, "exec_base_bytes", c->exec_base_bytes);
    json_kv(&f, "exec_node_bytes", c->exec_node_bytes);
    json_kb(&f, "device_timed", c->device_timed);
    json_ks(&f, "note", c->note);
    printf("}");
}

static void json_region(bool *f, const char *key, sg_advise_region r)
{
    printf("%s\"%s\": {\"launches\": ", *f ? "" : ", ", key);
    json_num(r.launches);
    printf(", \"host_us\": ");
    json_num(r.host_us);
    printf("}");
    *f = false;
}

static void json_profile(const sg_advise_profile *p)
{
    bool f = true;
    printf("{");
    json_kv(&f, "wall_ms", p->wall_ms);
    json_kv(&f, "block_host_ms", p->block_host_ms);
    json_kv(&f, "launches", p->launches);
    json_kv(&f, "busy_ms", p->busy_ms);
    json_kv(&f, "kernels", p->kernels);
    json_kv(&f, "short_kernel_share", p->short_kernel_share);
    json_region(&f, "step", p->step);
    json_region(&f, "load", p->load);
    json_region(&f, "forward", p->forward);
    json_region(&f, "backward", p->backward);
    json_region(&f, "load_static", p->load_static);
    printf(", \"modules\": [");
    for (int i = 0; i < p->n_modules; i++) {
        bool g = true;
        printf("%s{", i ? ", " : "");
        json_ks(&g, "name", p->modules[i].name);
        json_region(&g, "forward", p->modules[i].forward);
        json_region(&g, "backward", p->modules[i].backward);
        printf("}");
    }
    printf("]");
    json_kv(&f, "static_bytes", p->static_bytes);
    json_kb(&f, "capture_tried", p->capture_tried);
    json_kb(&f, "step_captured", p->step_captured);
    json_kv(&f, "step_nodes", p->step_nodes);
    json_ks(&f, "capture_error", p->capture_error);
    json_kb(&f, "shapes_static", p->shapes_static);
    json_ks(&f, "note", p->note);
    printf("}");
}

static void json_prediction(const sg_advise_prediction *q)
{
    bool f = true;
    printf("{");
    json_ks(&f, "scope", sg_scope_name(q->scope));
    json_kv(&f, "step_ms", q->step_ms);
    json_kv(&f, "speedup", q->speedup);
    json_kv(&f, "host_ms", q->host_ms);
    json_kv(&f, "device_ms", q->device_ms);
    json_ks(&f, "bound", q->host_bound ? "host" : "device");
    json_kv(&f, "launches", q->launches);
    json_kv(&f, "graphs", q->graphs);
    json_kv(&f, "nodes", q->nodes);
    json_kv(&f, "eager_kernels", q->eager_kernels);
    json_kv(&f, "capture_ms", q->capture_ms);
    json_kv(&f, "instantiate_ms", q->instantiate_ms);
    json_kv(&f, "saving_ms", q->saving_ms);
    json_kv(&f, "break_even_steps", q->break_even_steps); /* null: never */
    json_kv(&f, "extra_mib", q->extra_bytes / MIB);
    json_kb(&f, "capturable", q->capturable);
    printf("}");
}

static void json_measurement(const sg_advise_prediction *q, const sg_advise_measurement *m, double eager_ms,
                             double eager_bytes)
{
    bool f = true;
    printf("{");
    json_ks(&f, "scope", sg_scope_name(m->scope));
    json_kv(&f, "step_ms", m->step_ms);
    json_kv(&f, "predicted_step_ms", q->step_ms);
    json_kv(&f, "error_pct", err_pct(q->step_ms, m->step_ms));
    json_kv(&f, "speedup", eager_ms / m->step_ms);
    json_kv(&f, "host_ms", m->host_ms);
    json_kv(&f, "launches", m->launches);
    json_kv(&f, "busy_ms", m->busy_ms);
    json_kv(&f, "graphs", m->graphs);
    json_kv(&f, "nodes", m->nodes);
    json_kv(&f, "capture_ms", m->capture_ms);
    json_kv(&f, "instantiate_ms", m->instantiate_ms);
    json_kv(&f, "extra_mib", (m->bytes + m->exec_bytes - eager_bytes) / MIB);
    json_kb(&f, "fell_back", m->fell_back);
    printf("}");
}

/* ---- the command ---- */

typedef struct advise_opts {
    const char *model;
    sg_model_options mo;
    sg_advise_timing tm;
    sg_backend backend;
    bool measure, json;
} advise_opts;

/* Parses argv into o; returns -1 to go on, else the exit status (0 after --help). */
static int parse(int argc, char **argv, advise_opts *o)
{
    bool bad = false;
    for (int i = 1; i < argc && !bad;) {
        const char *v = NULL;
        long long n = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(advise_usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            o->json = true, i++;
        } else if (!strcmp(argv[i], "--no-measure")) {
            o->measure = false, i++;
        } else if (sg_cli_opt(argc, argv, &i, "--model", &v, &bad)) {
            o->model = v;
        } else if (sg_cli_opt(argc, argv, &i, "--precision", &v, &bad)) {
            bad = bad || !sg_cli_precision("advise", v, &o->mo.precision);
        } else if (sg_cli_opt(argc, argv, &i, "--steps", &v, &bad)) {
            bad = bad || !sg_cli_int("advise", "--steps", v, 1, 1000000, &n);
            o->tm.steps = (int)n;
        } else if (sg_cli_opt(argc, argv, &i, "--repeats", &v, &bad)) {
            bad = bad || !sg_cli_int("advise", "--repeats", v, 1, 1000, &n);
            o->tm.repeats = (int)n;
        } else if (sg_cli_opt(argc, argv, &i, "--warmup", &v, &bad)) {
            bad = bad || !sg_cli_int("advise", "--warmup", v, 5, 1000000, &n);
            o->tm.warmup = (int)n;
        } else if (sg_cli_opt(argc, argv, &i, "--data", &v, &bad)) {
            o->mo.data_path = v;
        } else if (sg_cli_opt(argc, argv, &i, "--backend", &v, &bad)) {
            bad = bad || !sg_cli_backend("advise", v, &o->backend);
        } else {
            fprintf(stderr, "stepgraph advise: unknown option '%s' (see stepgraph advise --help)\n", argv[i]);
            bad = true;
        }
    }
    if (!bad && !o->model) {
        fprintf(stderr, "stepgraph advise: --model is required (see stepgraph advise --help)\n");
        bad = true;
    }
    return bad ? SG_EXIT_USAGE : -1;
}

int sg_cmd_advise(int argc, char **argv)
{
    advise_opts o = {.tm = sg_advise_timing_default(), .backend = SG_BACKEND_AUTO, .measure = true};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    if (o.backend == SG_BACKEND_CPU || (o.backend == SG_BACKEND_AUTO && !sg_cuda_available())) {
        fprintf(stderr, "stepgraph advise: advise profiles a CUDA device (kernel launches, graph replays, "
                "GPU-busy time), and %s; run it where a GPU is usable\n",
                o.backend == SG_BACKEND_CPU ? "--backend cpu has none of them"
#ifdef SG_HAVE_CUDA
                                            : "no usable GPU was found");
#else
                                            : "this build of stepgraph has no CUDA");
#endif
        return SG_EXIT_FAIL;
    }
    sg_ctx *ctx = sg_cli_ctx("advise", o.backend, true);
    if (!ctx) return SG_EXIT_FAIL;
    const char *precision = o.mo.precision == SG_DTYPE_BF16 ? "bf16" : "fp32";
    sg_advise_calib c;
    sg_advise_profile p;
    sg_advise_prediction pr[SG_ADVISE_SCOPES];
    sg_advise_measurement ms[SG_ADVISE_SCOPES];
    bool measured[SG_ADVISE_SCOPES] = {false};
    sg_advise_summary sum;
    rc = SG_EXIT_FAIL;
    if (!o.json) {
        printf("stepgraph advise: %s (%s) on %s\n\n", o.model, precision, sg_ctx_device_name(ctx));
        fflush(stdout);
    }
    if (sg_advise_calibrate(ctx, &c) != SG_OK || sg_advise_profile_model(ctx, o.model, &o.mo, &o.tm, &p) != SG_OK) {
        fprintf(stderr, "stepgraph advise: %s\n", sg_ctx_last_error(ctx));
        goto out;
    }
    if (!o.json) print_calib(&c), print_profile(&p, &o.tm);
    for (int s = 0; s < SG_ADVISE_SCOPES; s++)
        if (sg_advise_predict(&c, &p, (sg_scope)s, &pr[s]) != SG_OK) {
            fprintf(stderr, "stepgraph advise: cannot predict %s scope: %s\n", sg_scope_name((sg_scope)s), pr[s].note);
            goto out;
        }
    if (sg_advise_summarize(&c, &p, pr, &sum) != SG_OK) {
        fprintf(stderr, "stepgraph advise: the predictions do not add up to a summary\n");
        goto out;
    }
    if (!o.json) {
        print_checklist(&p, &sum);
        print_predictions(pr);
        if (o.measure) print_measure_head(&o.tm);
        fflush(stdout);
    }
    rc = 0;
    /* Eager first: the measured speedups and extra memory are relative to it. */
    for (int s = 0; o.measure && s < SG_ADVISE_SCOPES; s++) {
        if (!pr[s].capturable) continue;
        if (sg_advise_measure(ctx, o.model, &o.mo, (sg_scope)s, &o.tm, &ms[s]) != SG_OK) {
            fprintf(stderr, "stepgraph advise: measuring %s scope: %s\n", sg_scope_name((sg_scope)s),
                    sg_ctx_last_error(ctx));
            rc = SG_EXIT_FAIL;
            if (s == SG_SCOPE_EAGER) break;
            continue;
        }
        measured[s] = true;
        if (!o.json) print_measure_row(&pr[s], &ms[s], ms[0].step_ms, ms[0].bytes);
    }
    char meas[64] = "";
    if (measured[0] && measured[sum.best])
        snprintf(meas, sizeof meas, "; measured %.2fx", ms[0].step_ms / ms[sum.best].step_ms);
    if (!o.json) {
        size_t n = strlen(sum.verdict);
        if (meas[0] && n && sum.verdict[n - 1] == ')') printf("\nverdict: %.*s%s)\n", (int)n - 1, sum.verdict, meas);
        else printf("\nverdict: %s\n", sum.verdict);
    } else {
        bool f = true;
        const char *commit = getenv("SG_COMMIT") ? getenv("SG_COMMIT") : SG_GIT_COMMIT;
        printf("{");
        json_ks(&f, "model", o.model);
        json_ks(&f, "precision", precision);
        json_ks(&f, "device", sg_ctx_device_name(ctx));
        json_ks(&f, "commit", commit);
        printf(", \"calibration\": ");
        json_calib(&c);
        printf(", \"profile\": ");
        json_profile(&p);
        printf(", \"checklist\": {");
        bool g = true;
        json_kv(&g, "gpu_utilisation", sum.gpu_utilisation);
        json_kv(&g, "launch_share", sum.launch_share);
        json_kv(&g, "short_kernel_share", sum.short_kernel_share);
        json_kb(&g, "shapes_static", sum.shapes_static);
        json_kb(&g, "host_syncs", sum.host_syncs);
        printf("}, \"predictions\": [");
        for (int s = 0; s < SG_ADVISE_SCOPES; s++) {
            if (s) printf(", ");
            json_prediction(&pr[s]);
        }
        printf("], \"measurements\": [");
        bool any = false;
        for (int s = 0; s < SG_ADVISE_SCOPES; s++) {
            if (!measured[s]) continue;
            if (any) printf(", ");
            json_measurement(&pr[s], &ms[s], ms[0].step_ms, ms[0].bytes);
            any = true;
        }
        printf("]");
        f = false;
        json_ks(&f, "best_scope", sg_scope_name(sum.best));
        json_kv(&f, "best_speedup", sum.best_speedup);
        json_ks(&f, "verdict", sum.verdict);
        printf("}\n");
    }
out:
    sg_ctx_destroy(ctx);
    return rc;
}
