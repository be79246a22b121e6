/* advise.c: `stepgraph advise`: runs the capture advisor (sg_advise, docs/advisor.md) on a
 * model and prints what it finds as it arrives: the calibration of this device's launch path,
 * the eager profile, the checklist and what each capture scope is predicted to buy, then,
 * unless --no-measure, each scope measured beside its prediction, and the verdict. --json: one
 * object, written with sg_json. */
#include "cli/cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    SG_CLI_MODEL_OPTS_HELP
    "  --precision P       fp32 (default) or bf16 (mixed precision; not mlp)\n"
    "  --optim-state D     f32 (default) or bf16: the AdamW moments' dtype the profile and every\n"
    "                      measurement train with (stepgraph train)\n"
    SG_CLI_ACCUM_HELP
    "                      The profile, the predictions and the measurements are then of\n"
    "                      whole accumulated steps (layer and model graphs replay K times)\n"
    "  --steps-per-graph K optimizer steps per trainer call: the step scope's graph holds K\n"
    "                      steps, so its launch's host cost is shared by K (predicted so:\n"
    "                      docs/advisor.md); other scopes run them one by one. Every figure\n"
    "                      stays per optimizer step (default 1)\n"
    "  --seq-lens L        gpt, with --vary-seq: sequence-length buckets, e.g. 32,64,128\n"
    "  --vary-seq          every run draws each step's length from 1..the largest bucket\n"
    "                      (under step scope one graph holds every bucket as a SWITCH\n"
    "                      branch); layer and model scope are then not measured\n"
    SG_CLI_COND_HELP
    "                      --loop and --skip-if shape the step scope's graph; a stop rule that\n"
    "                      holds during a run fails it (its later steps would run nothing)\n"
    "  --no-measure        predict only: do not train under each scope\n"
    "  --steps N           steps per timed block (default 50)\n"
    "  --repeats R         timed blocks; the median is reported (default 5)\n"
    "  --warmup W          untimed steps before timing, capture included (default 20, at least 5)\n"
    "  --any-cpu           let the scheduler move the advisor's thread between CPU cores; by\n"
    "                      default it stays on the core it starts on while it times, because a\n"
    "                      host-bound step's time depends on the core (pin the whole process\n"
    "                      with taskset -c N to choose one)\n"
    "  --data PATH         gpt: the text to train on (a regular file);\n"
    "                      resnet, efficientnet: a digits file (scikit-learn's 8 x 8\n"
    "                      digits.csv, scripts/fetch-digits.sh DIR) instead of synthetic\n"
    "                      images: scaled up to R x R, the last fifth held out (docs/data.md)\n"
    "  --backend B         cuda or auto (default auto); advise profiles a CUDA device, so cpu\n"
    "                      is refused\n"
    "  --json              one JSON object on stdout instead of tables\n"
    "  -h, --help          this text\n"
    "\n"
    "generation (--generate): what a new token costs a gpt model in each sg_generate mode\n"
    "(eager: every kernel launched, a flag read a token; step: the decode step one graph\n"
    "replayed a token; loop: the whole generation one graph whose WHILE node stops on the\n"
    "device). It times the parts of one decode step (its launches, the host time to queue it,\n"
    "a replay's host time, the graph's device time, a flag read, a WHILE node's turn), predicts\n"
    "each mode's ms a token from them and the calibration (docs/advisor.md, \"Generation\"),\n"
    "then generates in each mode and prints predicted next to measured. Random weights and\n"
    "random printable-byte prompts; greedy unless --temperature; no stop sequence, so every\n"
    "sequence runs --length tokens. Of the options above it takes --model, --precision, --data,\n"
    "--repeats (default 5), --no-measure, --any-cpu, --backend (cpu runs too: a check of the\n"
    "flow, its launch terms 0, not a GPU's prediction) and --json.\n"
    "  --generate          advise generation instead of training\n"
    "  --batch N           sequences (default 1)\n"
    "  --prompt-len P      tokens in each prompt (default 16)\n"
    "  --length N          new tokens a sequence, at least 2 (default 200, fewer where the\n"
    "                      model's positions less the prompt hold fewer)\n"
    "  --temperature T     0 (default): greedy; else sampled on the device\n"
    "  --top-k K           sample from the K likeliest (default 0: all)\n"
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

static void print_profile(const sg_advise_profile *p, const sg_advise_options *o)
{
    printf("\neager profile (%d warm-up steps, median of %d blocks of %d steps):\n", o->warmup, o->repeats,
           o->steps);
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
           s->shapes_static ? "static (no shape buckets: one graph serves every step)"
                            : "varies (--vary-seq): each length bucket a branch of the step graph's SWITCH node");
    if (!p->capture_tried) printf("  host syncs in the step    unknown (%s)\n", p->capture_error);
    else if (s->host_syncs) printf("  host syncs in the step    FOUND: %s\n", p->capture_error);
    else printf("  host syncs in the step    none (a trial capture of the step took %d nodes)\n", p->step_nodes);
}

static void print_predictions(const sg_advise_result *r)
{
    printf("\nprediction:\n");
    printf("  %-6s %9s %8s %9s %10s  %-6s %8s %6s %16s %11s %10s\n", "scope", "step ms", "speedup", "host ms",
           "device ms", "bound", "launches", "nodes", "capture+inst ms", "break-even", "extra MiB");
    for (int s = 0; s < SG_ADVISE_SCOPES; s++) {
        const sg_advise_prediction *q = &r->scopes[s].predicted;
        char be[32];
        printf("  %-6s %9.4f %7.2fx %9.4f %10.4f  %-6s %8.1f %6.0f %16.2f %11s %10.2f%s\n", sg_scope_name(q->scope),
               q->step_ms, q->speedup, q->host_ms, q->device_ms, q->host_bound ? "host" : "device", q->launches,
               q->nodes, q->setup_ms, sg_advise_steps_str(q->break_even_steps, be, sizeof be),
               q->extra_bytes / MIB, q->capturable ? "" : "  (cannot be captured)");
    }
}

static void print_measure_head(const sg_advise_options *o)
{
    printf("\nmeasured (%d warm-up steps, median of %d blocks of %d steps):\n", o->warmup, o->repeats, o->steps);
    printf("  %-6s %21s %8s %21s %29s %23s\n", "scope", "step ms pred / meas", "error", "speedup pred / meas",
           "capture+inst ms pred / meas", "extra MiB pred / meas");
}

static void print_measure_row(const sg_advise_scope_result *sr)
{
    const sg_advise_prediction *q = &sr->predicted;
    const sg_advise_measurement *m = &sr->measurement;
    char ms[48], sp[48], setup[48], extra[48];
    snprintf(ms, sizeof ms, "%.4f / %.4f", q->step_ms, m->step_ms);
    snprintf(sp, sizeof sp, "%.2fx / %.2fx", q->speedup, sr->measured_speedup);
    snprintf(setup, sizeof setup, "%.2f / %.2f", q->setup_ms, m->capture_ms + m->instantiate_ms);
    snprintf(extra, sizeof extra, "%.2f / %.2f", q->extra_bytes / MIB, sr->measured_extra_bytes / MIB);
    printf("  %-6s %21s %+7.1f%% %21s %29s %23s%s%s\n", sg_scope_name(sr->scope), ms, sr->error_pct, sp, setup,
           extra, m->fell_back ? "  fell back to eager: " : "", m->fell_back ? m->fallback_reason : "");
}

/* The profiled step's work and its floor on this device's peaks, by op family. */
static void print_sol(const sg_advise_result *r)
{
    const sg_advise_profile *p = &r->profile;
    if (!r->sol_ok) {
        printf("\nspeed of light: n/a (%s)\n", r->sol_note);
        return;
    }
    double fl = 0, by = 0;
    for (int k = 0; k < SG_WORK_FAMILIES; k++) fl += p->work.flops[k], by += p->work.bytes[k];
    printf("\nspeed of light (this GPU: %.1f TFLOP/s %s matmul, %.0f GB/s copy): a step asks %.4g TFLOP and "
           "%.4g GB at least;\n  floor %.4f ms, the eager step at %.1f%% of it; by family (floor ms):",
           r->peaks.matmul_tflops, r->precision == SG_DTYPE_BF16 ? "bf16" : "fp32", r->peaks.copy_gbps, fl / 1e12,
           by / 1e9, r->sol.floor_ms, 100 * r->sol.floor_ms / p->wall_ms);
    for (int k = 0; k < SG_WORK_FAMILIES; k++)
        if (p->work.flops[k] > 0 || p->work.bytes[k] > 0)
            printf(" %s %.4f", sg_work_family_name((sg_work_family)k), r->sol.family_ms[k]);
    printf("\n");
    if (!isfinite(p->family_ms[SG_WORK_FAMILIES])) return;
    /* Where the eager step's device time went, against each family's floor. */
    printf("  the eager step's device time by family (ms, x its floor):");
    for (int k = 0; k < SG_WORK_FAMILIES; k++)
        if (p->work.flops[k] > 0 || p->work.bytes[k] > 0 || p->family_ms[k] > 0)
            printf(" %s %.4f (%.1fx)", sg_work_family_name((sg_work_family)k), p->family_ms[k],
                   r->sol.family_ms[k] > 0 ? p->family_ms[k] / r->sol.family_ms[k] : NAN);
    printf(" other %.4f\n", p->family_ms[SG_WORK_FAMILIES]);
}

/* sg_advise's progress: the tables as each stage completes (text output), and every failed
 * measurement on stderr. */
static void progress(void *user, const sg_advise_result *r, sg_advise_stage stage, sg_scope scope)
{
    bool json = *(const bool *)user;
    switch (stage) {
    case SG_ADVISE_STAGE_PROFILED:
        if (!json) printf("CPU: %s\n", r->cpu_note), print_calib(&r->calib), print_profile(&r->profile, &r->options),
                   print_sol(r);
        break;
    case SG_ADVISE_STAGE_PREDICTED:
        if (json) break;
        print_checklist(&r->profile, &r->summary);
        print_predictions(r);
        if (r->options.measure) print_measure_head(&r->options);
        break;
    case SG_ADVISE_STAGE_MEASURED:
        if (r->scopes[scope].measured) {
            if (!json) print_measure_row(&r->scopes[scope]);
        } else {
            fprintf(stderr, "stepgraph advise: measuring %s scope: %s\n", sg_scope_name(scope),
                    r->scopes[scope].measure_note);
        }
        break;
    }
    fflush(stdout);
}

/* ---- JSON ---- */

static void kv_num(sg_json *w, const char *key, double v)
{
    sg_json_key(w, key);
    sg_json_double(w, v); /* null when not finite: break_even_steps "never" */
}

static void kv_bool(sg_json *w, const char *key, int v)
{
    sg_json_key(w, key);
    sg_json_bool(w, v);
}

static void json_calib(sg_json *w, const sg_advise_calib *c)
{
    sg_json_key(w, "calibration");
    sg_json_object_begin(w);
    kv_num(w, "launch_host_us", c->launch_host_us);
    kv_num(w, "replay_base_us", c->replay_base_us);
    kv_num(w, "replay_node_us", c->replay_node_us);
    kv_num(w, "tiny_kernel_us", c->tiny_kernel_us);
    kv_num(w, "eager_kernel_us", c->eager_kernel_us);
    kv_num(w, "node_device_us", c->node_device_us);
    kv_num(w, "eager_gap_us", c->eager_gap_us);
    kv_num(w, "node_gap_us", c->node_gap_us);
    kv_num(w, "graph_gap_us", c->graph_gap_us);
    kv_num(w, "capture_base_us", c->capture_base_us);
    kv_num(w, "capture_node_us", c->capture_node_us);
    kv_num(w, "instantiate_base_us", c->instantiate_base_us);
    kv_num(w, "instantiate_node_us", c->instantiate_node_us);
    kv_num(w, "exec_base_bytes", c->exec_base_bytes);
    kv_num(w, "exec_node_bytes", c->exec_node_bytes);
    kv_bool(w, "device_timed", c->device_timed);
    sg_cli_kv_str(w, "note", c->note);
    sg_json_object_end(w);
}

/* Where an advice ran: device, commit, the held core, and the calibration. */
static void json_where(sg_json *w, const char *device, int cpu, const char *cpu_note, const sg_advise_calib *c)
{
    sg_cli_kv_str(w, "device", device);
    sg_cli_kv_str(w, "commit", sg_cli_commit());
    sg_json_key(w, "cpu");
    if (cpu >= 0) sg_json_int(w, cpu);
    else sg_json_null(w);
    sg_cli_kv_str(w, "cpu_note", cpu_note);
    json_calib(w, c);
}

static void json_region(sg_json *w, const char *key, sg_advise_region r)
{
    sg_json_key(w, key);
    sg_json_object_begin(w);
    kv_num(w, "launches", r.launches);
    kv_num(w, "host_us", r.host_us);
    sg_json_object_end(w);
}

static void json_profile(sg_json *w, const sg_advise_profile *p)
{
    sg_json_key(w, "profile");
    sg_json_object_begin(w);
    kv_num(w, "wall_ms", p->wall_ms);
    kv_num(w, "block_host_ms", p->block_host_ms);
    kv_num(w, "launches", p->launches);
    kv_num(w, "busy_ms", p->busy_ms);
    kv_num(w, "kernels", p->kernels);
    kv_num(w, "short_kernel_share", p->short_kernel_share);
    json_region(w, "step", p->step);
    json_region(w, "load", p->load);
    json_region(w, "forward", p->forward);
    json_region(w, "backward", p->backward);
    json_region(w, "load_static", p->load_static);
    sg_json_key(w, "modules");
    sg_json_array_begin(w);
    for (int i = 0; i < p->n_modules; i++) {
        sg_json_object_begin(w);
        sg_cli_kv_str(w, "name", p->modules[i].name);
        json_region(w, "forward", p->modules[i].forward);
        json_region(w, "backward", p->modules[i].backward);
        sg_json_object_end(w);
    }
    sg_json_array_end(w);
    kv_num(w, "static_bytes", p->static_bytes);
    kv_bool(w, "capture_tried", p->capture_tried);
    kv_bool(w, "step_captured", p->step_captured);
    sg_cli_kv_int(w, "step_nodes", p->step_nodes);
    sg_cli_kv_str(w, "capture_error", p->capture_error);
    kv_bool(w, "shapes_static", p->shapes_static);
    sg_cli_kv_str(w, "note", p->note);
    sg_json_object_end(w);
}

static void json_prediction(sg_json *w, const sg_advise_prediction *q)
{
    sg_json_object_begin(w);
    sg_cli_kv_str(w, "scope", sg_scope_name(q->scope));
    kv_num(w, "step_ms", q->step_ms);
    kv_num(w, "speedup", q->speedup);
    kv_num(w, "host_ms", q->host_ms);
    kv_num(w, "device_ms", q->device_ms);
    sg_cli_kv_str(w, "bound", q->host_bound ? "host" : "device");
    kv_num(w, "launches", q->launches);
    kv_num(w, "graphs", q->graphs);
    kv_num(w, "nodes", q->nodes);
    kv_num(w, "eager_kernels", q->eager_kernels);
    kv_num(w, "capture_ms", q->capture_ms);
    kv_num(w, "instantiate_ms", q->instantiate_ms);
    kv_num(w, "saving_ms", q->saving_ms);
    kv_num(w, "break_even_steps", q->break_even_steps); /* null: never */
    kv_num(w, "extra_mib", q->extra_bytes / MIB);
    kv_bool(w, "capturable", q->capturable);
    sg_cli_kv_str(w, "note", q->note);
    sg_json_object_end(w);
}

static void json_measurement(sg_json *w, const sg_advise_scope_result *sr)
{
    const sg_advise_measurement *m = &sr->measurement;
    sg_json_object_begin(w);
    sg_cli_kv_str(w, "scope", sg_scope_name(sr->scope));
    kv_num(w, "step_ms", m->step_ms);
    kv_num(w, "predicted_step_ms", sr->predicted.step_ms);
    kv_num(w, "error_pct", sr->error_pct);
    kv_num(w, "speedup", sr->measured_speedup);
    kv_num(w, "host_ms", m->host_ms);
    kv_num(w, "launches", m->launches);
    kv_num(w, "busy_ms", m->busy_ms);
    sg_cli_kv_int(w, "graphs", m->graphs);
    sg_cli_kv_int(w, "nodes", m->nodes);
    kv_num(w, "capture_ms", m->capture_ms);
    kv_num(w, "instantiate_ms", m->instantiate_ms);
    kv_num(w, "extra_mib", sr->measured_extra_bytes / MIB);
    kv_bool(w, "fell_back", m->fell_back);
    sg_json_object_end(w);
}

/* The whole result as one object on stdout; tr: the trainer options it ran with. */
static bool print_json(const sg_advise_result *r, const sg_trainer_options *tr)
{
    sg_json *w = sg_cli_json_open("advise");
    if (!w) return false;
    sg_json_object_begin(w);
    sg_cli_kv_str(w, "model", r->model);
    sg_cli_kv_str(w, "precision", r->precision == SG_DTYPE_BF16 ? "bf16" : "fp32");
    sg_cli_kv_str(w, "optim_state", sg_dtype_name(r->options.optim_state));
    sg_cli_kv_int(w, "accum", r->options.accum);
    sg_cli_kv_int(w, "steps_per_graph", tr->steps_per_call > 1 ? tr->steps_per_call : 1);
    sg_cli_kv_int(w, "loop", tr->loop);
    sg_cli_kv_int(w, "skip_if", tr->skip_if);
    sg_cli_kv_int(w, "vary_seq", tr->vary_seq);
    sg_cli_kv_int(w, "stop_nonfinite", tr->stop_nonfinite);
    sg_json_key(w, "stop_loss");
    sg_json_double(w, tr->stop_on_loss ? tr->stop_loss : NAN); /* null: no rule */
    json_where(w, r->device, r->cpu, r->cpu_note, &r->calib);
    json_profile(w, &r->profile);
    sg_json_key(w, "speed_of_light");
    sg_json_object_begin(w);
    kv_bool(w, "ok", r->sol_ok);
    sg_cli_kv_str(w, "note", r->sol_note);
    kv_num(w, "peak_matmul_tflops", r->sol_ok ? r->peaks.matmul_tflops : NAN);
    kv_num(w, "peak_copy_gbps", r->sol_ok ? r->peaks.copy_gbps : NAN);
    kv_num(w, "floor_ms", r->sol_ok ? r->sol.floor_ms : NAN);
    sg_json_key(w, "by_family");
    sg_json_object_begin(w);
    for (int k = 0; k < SG_WORK_FAMILIES; k++) {
        sg_json_key(w, sg_work_family_name((sg_work_family)k));
        sg_json_object_begin(w);
        kv_num(w, "flops", r->profile.work.flops[k]);
        kv_num(w, "bytes", r->profile.work.bytes[k]);
        kv_num(w, "floor_ms", r->sol_ok ? r->sol.family_ms[k] : NAN);
        kv_num(w, "eager_ms", r->profile.family_ms[k]);
        sg_json_object_end(w);
    }
    sg_json_key(w, "other");
    sg_json_object_begin(w);
    kv_num(w, "eager_ms", r->profile.family_ms[SG_WORK_FAMILIES]);
    sg_json_object_end(w);
    sg_json_object_end(w);
    sg_json_object_end(w);
    sg_json_key(w, "checklist");
    sg_json_object_begin(w);
    kv_num(w, "gpu_utilisation", r->summary.gpu_utilisation);
    kv_num(w, "launch_share", r->summary.launch_share);
    kv_num(w, "short_kernel_share", r->summary.short_kernel_share);
    kv_bool(w, "shapes_static", r->summary.shapes_static);
    kv_bool(w, "host_syncs", r->summary.host_syncs);
    sg_json_object_end(w);
    sg_json_key(w, "predictions");
    sg_json_array_begin(w);
    for (int s = 0; s < SG_ADVISE_SCOPES; s++) json_prediction(w, &r->scopes[s].predicted);
    sg_json_array_end(w);
    sg_json_key(w, "measurements");
    sg_json_array_begin(w);
    for (int s = 0; s < SG_ADVISE_SCOPES; s++)
        if (r->scopes[s].measured) json_measurement(w, &r->scopes[s]);
    sg_json_array_end(w);
    sg_json_key(w, "not_measured");
    sg_json_array_begin(w);
    for (int s = 0; s < SG_ADVISE_SCOPES; s++) {
        if (r->scopes[s].measured) continue;
        sg_json_object_begin(w);
        sg_cli_kv_str(w, "scope", sg_scope_name((sg_scope)s));
        sg_cli_kv_str(w, "why", r->scopes[s].measure_note);
        sg_json_object_end(w);
    }
    sg_json_array_end(w);
    sg_cli_kv_str(w, "best_scope", sg_scope_name(r->summary.best));
    kv_num(w, "best_speedup", r->summary.best_speedup);
    kv_num(w, "best_measured_speedup", r->best_measured_speedup);
    sg_cli_kv_str(w, "verdict", r->summary.verdict);
    sg_json_object_end(w);
    return sg_cli_json_close("advise", w);
}

/* ---- the command ---- */

typedef struct advise_opts {
    const char *model;
    sg_model_options mo;
    sg_advise_options ao;
    sg_trainer_options tr;      /* the runs' other trainer options (ao.trainer) */
    int64_t seq_lens[32];
    sg_backend backend;
    bool json;
    /* --generate */
    bool generate, length_given, training_opt;
    long long batch, prompt_len, length, top_k;
    double temperature;
} advise_opts;

/* The option argument a names (bare or --name=value) among names[0..n), or NULL. */
static const char *named(const char *a, const char *const *names, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        size_t len = strlen(names[k]);
        if (!strncmp(a, names[k], len) && (a[len] == '\0' || a[len] == '=')) return names[k];
    }
    return NULL;
}

/* Options of one kind of advice only: training's, and generation's. */
static const char *const train_only[] = {"--accum", "--loop", "--skip-if", "--stop-nonfinite", "--stop-loss",
                                         "--vary-seq", "--seq-lens", "--steps-per-graph", "--steps", "--warmup",
                                         "--classes", "--recompute", "--loss-scale", "--optim-state"};
static const char *const gen_only[] = {"--batch", "--prompt-len", "--length", "--temperature", "--top-k"};

/* Parses argv into o; returns -1 to go on, else the exit status (0 after --help). */
static int parse(int argc, char **argv, advise_opts *o)
{
    bool bad = false;
    const char *a_train = NULL, *a_gen = NULL;
    for (int i = 1; i < argc && !bad;) {
        const char *v = NULL;
        long long n = 0;
        if (!a_train) a_train = named(argv[i], train_only, sizeof train_only / sizeof *train_only);
        if (!a_gen) a_gen = named(argv[i], gen_only, sizeof gen_only / sizeof *gen_only);
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(advise_usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            o->json = true, i++;
        } else if (!strcmp(argv[i], "--any-cpu")) {
            o->ao.hold_cpu = 0, i++;
        } else if (!strcmp(argv[i], "--no-measure")) {
            o->ao.measure = 0, i++;
        } else if (sg_cli_opt(argc, argv, &i, "--model", &v, &bad)) {
            o->model = v;
        } else if (sg_cli_opt(argc, argv, &i, "--precision", &v, &bad)) {
            bad = bad || !sg_cli_precision("advise", v, &o->mo.precision);
        } else if (sg_cli_opt(argc, argv, &i, "--optim-state", &v, &bad)) {
            bad = bad || !sg_cli_optim_state("advise", v, &o->ao.optim_state);
        } else if (sg_cli_model_opt("advise", argc, argv, &i, &o->mo, &bad)) {
            /* --classes, --recompute, --loss-scale */
        } else if (sg_cli_accum_opt("advise", argc, argv, &i, &o->ao.accum, &bad)) {
            /* --accum */
        } else if (sg_cli_cond_opt("advise", argc, argv, &i, &o->tr, &bad)) {
            /* --loop, --skip-if, --stop-nonfinite, --stop-loss */
        } else if (!strcmp(argv[i], "--vary-seq")) {
            o->tr.vary_seq = 1, i++;
        } else if (sg_cli_opt(argc, argv, &i, "--seq-lens", &v, &bad)) {
            bad = bad || !sg_cli_buckets("advise", "--seq-lens", v, o->seq_lens, &o->tr.n_seq_buckets, 32);
            o->tr.seq_buckets = o->seq_lens;
        } else if (sg_cli_opt(argc, argv, &i, "--steps-per-graph", &v, &bad)) {
            bad = bad || !sg_cli_int("advise", "--steps-per-graph", v, 1, 1024, &n);
            o->tr.steps_per_call = (int)n;
        } else if (sg_cli_opt(argc, argv, &i, "--steps", &v, &bad)) {
            bad = bad || !sg_cli_int("advise", "--steps", v, 1, 1000000, &n);
            o->ao.steps = (int)n;
        } else if (sg_cli_opt(argc, argv, &i, "--repeats", &v, &bad)) {
            bad = bad || !sg_cli_int("advise", "--repeats", v, 1, 1000, &n);
            o->ao.repeats = (int)n;
        } else if (sg_cli_opt(argc, argv, &i, "--warmup", &v, &bad)) {
            bad = bad || !sg_cli_int("advise", "--warmup", v, 5, 1000000, &n);
            o->ao.warmup = (int)n;
        } else if (sg_cli_opt(argc, argv, &i, "--data", &v, &bad)) {
            o->mo.data_path = v;
        } else if (sg_cli_opt(argc, argv, &i, "--backend", &v, &bad)) {
            bad = bad || !sg_cli_backend("advise", v, &o->backend);
        } else if (!strcmp(argv[i], "--generate")) {
            o->generate = true, i++;
        } else if (sg_cli_opt(argc, argv, &i, "--batch", &v, &bad)) {
            bad = bad || !sg_cli_int("advise", "--batch", v, 1, 4096, &o->batch);
        } else if (sg_cli_opt(argc, argv, &i, "--prompt-len", &v, &bad)) {
            bad = bad || !sg_cli_int("advise", "--prompt-len", v, 1, 1 << 20, &o->prompt_len);
        } else if (sg_cli_opt(argc, argv, &i, "--length", &v, &bad)) {
            bad = bad || !sg_cli_int("advise", "--length", v, 2, 1 << 20, &o->length);
            o->length_given = true;
        } else if (sg_cli_opt(argc, argv, &i, "--temperature", &v, &bad)) {
            bad = bad || !sg_cli_float("advise", "--temperature", v, 0, 100, &o->temperature);
        } else if (sg_cli_opt(argc, argv, &i, "--top-k", &v, &bad)) {
            bad = bad || !sg_cli_int("advise", "--top-k", v, 0, INT32_MAX, &o->top_k);
        } else {
            fprintf(stderr, "stepgraph advise: unknown option '%s' (see stepgraph advise --help)\n", argv[i]);
            bad = true;
        }
    }
    if (!bad && !o->model) {
        fprintf(stderr, "stepgraph advise: --model is required (see stepgraph advise --help)\n");
        bad = true;
    }
    if (!bad && (o->generate ? a_train != NULL : a_gen != NULL)) {
        fprintf(stderr, "stepgraph advise: %s is %s (see stepgraph advise --help)\n", o->generate ? a_train : a_gen,
                o->generate ? "for training, not --generate" : "for --generate");
        bad = true;
    }
    if (!bad && o->generate && strncmp(o->model, "gpt-", 4)) {
        fprintf(stderr, "stepgraph advise: --generate runs a gpt model, not '%s'\n", o->model);
        bad = true;
    }
    if (o->generate) return bad ? SG_EXIT_USAGE : -1;
    if (!bad && o->tr.vary_seq != (o->tr.n_seq_buckets > 0)) {
        fprintf(stderr, "stepgraph advise: %s\n", o->tr.vary_seq ? "--vary-seq needs --seq-lens"
                                                                  : "--seq-lens is for --vary-seq (the advisor's "
                                                                    "steps are otherwise full-length)");
        bad = true;
    }
    if (!bad && o->tr.n_seq_buckets && strncmp(o->model, "gpt-", 4)) {
        fprintf(stderr, "stepgraph advise: --seq-lens is for gpt models, not '%s'\n", o->model);
        bad = true;
    }
    if (!bad && o->tr.n_seq_buckets && o->ao.accum > 1) {
        fprintf(stderr, "stepgraph advise: --accum %d does not combine with --seq-lens: a padded step is one "
                "batch\n", o->ao.accum);
        bad = true;
    }
    o->tr.accum = o->ao.accum; /* what the check below sees; the advisor sets it itself */
    if (!bad) bad = !sg_cli_cond_check("advise", &o->tr, o->mo.precision, false);
    o->ao.trainer = &o->tr;
    return bad ? SG_EXIT_USAGE : -1;
}

/* ---- generation (--generate) ---- */

static void print_gen(const advise_opts *o, const sg_advise_gen_result *r)
{
    const sg_advise_gen_profile *p = &r->profile;
    if (r->calib.device_timed || r->calib.launch_host_us > 0) print_calib(&r->calib);
    else printf("calibration: none (%s)\n", r->calib.note);
    printf("\ndecode step (median of %d runs of %lld steps after a prefill):\n", r->repeats, (long long)p->steps);
    printf("  %.0f launches eagerly, %d graph nodes; host %.2f us to queue it eagerly, %.2f us to replay its graph\n",
           p->launches, p->nodes, p->host_us, p->replay_us);
    printf("  device %.2f us per replayed graph; flag read %.2f us; ", p->graph_us, p->readback_us);
    if (isnan(p->while_turn_us)) printf("no WHILE nodes here\n");
    else printf("WHILE turn %.2f us\n", p->while_turn_us);
    printf("\n%-6s %12s %9s %9s %9s   %12s %7s %11s %14s\n", "mode", "predicted ms", "host us", "device us",
           "sync us", "measured ms", "error", "prefill ms", "host us/token");
    int best = -1;
    for (int k = SG_GEN_EAGER; k <= SG_GEN_LOOP; k++) {
        const sg_advise_gen_mode *m = &r->modes[k];
        printf("%-6s ", sg_gen_mode_name((sg_gen_mode)k));
        if (!m->predicted) {
            printf("not predicted: %s\n", m->note);
            continue;
        }
        if (best < 0 || m->predicted_ms < r->modes[best].predicted_ms) best = k;
        printf("%12.4f %9.2f %9.2f %9.2f   ", m->predicted_ms, m->host_us, m->device_us, m->sync_us);
        if (m->measured)
            printf("%12.4f %+6.1f%% %11.3f %14.2f\n", m->measured_ms, 100 * (m->ratio - 1), m->prefill_ms,
                   m->host_us_per_token);
        else
            printf("%12s\n", "-");
    }
    if (best >= 0) {
        const sg_advise_gen_mode *b = &r->modes[best], *e = &r->modes[SG_GEN_EAGER];
        printf("\nverdict: %s predicted fastest, %.4f ms a token (%.2fx eager's prediction)", sg_gen_mode_name(b->mode),
               b->predicted_ms, e->predicted_ms / b->predicted_ms);
        if (b->measured && e->measured)
            printf("; measured %.4f ms, %.2fx eager", b->measured_ms, e->measured_ms / b->measured_ms);
        printf("\n");
    }
    (void)o;
}

static bool print_gen_json(const advise_opts *o, const sg_advise_gen_result *r)
{
    sg_json *w = sg_cli_json_open("advise");
    if (!w) return false;
    const sg_advise_gen_profile *p = &r->profile;
    sg_json_object_begin(w);
    sg_cli_kv_str(w, "model", o->model);
    sg_cli_kv_str(w, "precision", o->mo.precision == SG_DTYPE_BF16 ? "bf16" : "fp32");
    sg_cli_kv_str(w, "advice", "generate");
    sg_cli_kv_int(w, "batch", r->batch);
    sg_cli_kv_int(w, "prompt_len", r->prompt_len);
    sg_cli_kv_int(w, "max_new", r->max_new);
    sg_cli_kv_int(w, "repeats", r->repeats);
    kv_num(w, "temperature", o->temperature);
    sg_cli_kv_int(w, "top_k", o->top_k);
    json_where(w, r->device, r->cpu, r->cpu_note, &r->calib);
    sg_json_key(w, "decode_step");
    sg_json_object_begin(w);
    sg_cli_kv_int(w, "steps", p->steps);
    kv_num(w, "launches", p->launches);
    sg_cli_kv_int(w, "nodes", p->nodes);
    kv_num(w, "host_us", p->host_us);
    kv_num(w, "replay_us", p->replay_us);
    kv_num(w, "graph_us", p->graph_us);
    kv_num(w, "readback_us", p->readback_us);
    kv_num(w, "while_turn_us", p->while_turn_us);
    sg_json_object_end(w);
    sg_json_key(w, "modes");
    sg_json_array_begin(w);
    for (int k = SG_GEN_EAGER; k <= SG_GEN_LOOP; k++) {
        const sg_advise_gen_mode *m = &r->modes[k];
        sg_json_object_begin(w);
        sg_cli_kv_str(w, "mode", sg_gen_mode_name(m->mode));
        kv_bool(w, "predicted", m->predicted);
        kv_num(w, "host_us", m->host_us);
        kv_num(w, "device_us", m->device_us);
        kv_num(w, "sync_us", m->sync_us);
        kv_num(w, "predicted_ms", m->predicted ? m->predicted_ms : NAN);
        kv_bool(w, "measured", m->measured);
        kv_num(w, "prefill_ms", m->measured ? m->prefill_ms : NAN);
        kv_num(w, "total_ms", m->measured ? m->total_ms : NAN);
        kv_num(w, "measured_ms", m->measured ? m->measured_ms : NAN);
        kv_num(w, "host_us_per_token", m->measured ? m->host_us_per_token : NAN);
        kv_num(w, "error_pct", m->measured ? 100 * (m->ratio - 1) : NAN);
        sg_cli_kv_str(w, "note", m->note);
        sg_json_object_end(w);
    }
    sg_json_array_end(w);
    sg_json_object_end(w);
    return sg_cli_json_close("advise", w);
}

/* --generate: a random-initialised model, a generator of --batch sequences, random printable
 * prompts of --prompt-len bytes (seed 1), sg_advise_generate. */
static int advise_generate(advise_opts *o)
{
    sg_ctx *ctx = sg_cli_ctx("advise", o->backend, true);
    if (!ctx) return SG_EXIT_FAIL;
    sg_model *m = NULL;
    sg_generator *g = NULL;
    int32_t *tok = malloc((size_t)o->prompt_len * sizeof *tok);
    const int32_t **prompts = malloc((size_t)o->batch * sizeof *prompts);
    int64_t *lens = malloc((size_t)o->batch * sizeof *lens);
    sg_advise_gen_result *r = malloc(sizeof *r);
    int rc = 0;
    if (!tok || !prompts || !lens || !r) {
        fprintf(stderr, "stepgraph advise: out of host memory\n");
        rc = SG_EXIT_FAIL;
    }
    sg_status st = rc ? SG_ERR_OOM : sg_model_create_ex(ctx, o->model, 1, &o->mo, &m);
    int64_t T = st == SG_OK ? sg_tensor_dim(sg_model_input(m), 1) : 0;
    if (st == SG_OK && !o->length_given) o->length = T - o->prompt_len < 200 ? T - o->prompt_len : 200;
    if (st == SG_OK && (o->prompt_len + o->length > T || o->length < 2)) {
        fprintf(stderr, "stepgraph advise: a prompt of %lld tokens and %lld new need %lld positions; '%s' holds "
                "%lld (--prompt-len, --length)\n", o->prompt_len, o->length < 2 ? 2 : o->length,
                o->prompt_len + (o->length < 2 ? 2 : o->length), o->model, (long long)T);
        rc = SG_EXIT_USAGE;
    }
    sg_generator_options go = sg_generator_options_default();
    go.max_batch = (int)o->batch;
    if (st == SG_OK && !rc) st = sg_generator_create(m, &go, &g);
    uint64_t rng = 1;
    for (long long k = 0; !rc && tok && k < o->prompt_len; k++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        tok[k] = (int32_t)(32 + (rng >> 33) % 95);
    }
    for (long long i = 0; !rc && i < o->batch; i++) prompts[i] = tok, lens[i] = o->prompt_len;
    sg_generate_request q = {.n = (int)o->batch, .prompts = prompts, .prompt_lens = lens, .max_new = o->length,
                             .temperature = (float)o->temperature, .top_k = (int)o->top_k, .seed = 1};
    if (st == SG_OK && !rc && !o->json) {
        printf("stepgraph advise --generate: %s (%s) on %s, batch %lld, prompts of %lld tokens, %lld new tokens%s\n\n",
               o->model, o->mo.precision == SG_DTYPE_BF16 ? "bf16" : "fp32", sg_ctx_device_name(ctx), o->batch,
               o->prompt_len, o->length,
               sg_ctx_backend(ctx) == SG_BACKEND_CPU ? " (CPU backend: a check of the flow, not a GPU's prediction)"
                                                     : "");
        fflush(stdout);
    }
    if (st == SG_OK && !rc) st = sg_advise_generate(ctx, g, &q, &o->ao, r);
    if (st != SG_OK) {
        fprintf(stderr, "stepgraph advise: %s\n", sg_ctx_last_error(ctx));
        rc = SG_EXIT_FAIL;
    } else if (!rc) {
        if (o->json) rc = print_gen_json(o, r) ? 0 : SG_EXIT_FAIL;
        else print_gen(o, r);
    }
    free(r), free(lens), free(prompts), free(tok);
    sg_generator_destroy(g);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
    return rc;
}

int sg_cmd_advise(int argc, char **argv)
{
    advise_opts o = {.ao = sg_advise_options_default(), .tr = sg_trainer_options_default(),
                     .backend = SG_BACKEND_AUTO, .batch = 1, .prompt_len = 16, .length = 200};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    if (o.generate) return advise_generate(&o);
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
    sg_advise_result *r = malloc(sizeof *r);
    if (!r) {
        fprintf(stderr, "stepgraph advise: out of host memory\n");
        return SG_EXIT_FAIL;
    }
    sg_ctx *ctx = sg_cli_ctx("advise", o.backend, true);
    if (!ctx) {
        free(r);
        return SG_EXIT_FAIL;
    }
    if (!o.json) {
        char setup[96] = "", forms[192] = "";
        if (o.ao.accum > 1) snprintf(setup, sizeof setup, ", %d micro-batches per optimizer step", o.ao.accum);
        if (o.ao.optim_state == SG_DTYPE_BF16)
            snprintf(setup + strlen(setup), sizeof setup - strlen(setup), ", bf16 optimizer state");
        snprintf(forms, sizeof forms, "%s%s%s%s%s", o.tr.loop ? ", loop" : "", o.tr.skip_if ? ", skip-if" : "",
                 o.tr.vary_seq ? ", varying length" : "",
                 o.tr.stop_nonfinite || o.tr.stop_on_loss ? ", early stop" : "",
                 o.tr.steps_per_call > 1 ? ", steps per graph: " : "");
        if (o.tr.steps_per_call > 1)
            snprintf(forms + strlen(forms), sizeof forms - strlen(forms), "%d (figures per optimizer step)",
                     o.tr.steps_per_call);
        printf("stepgraph advise: %s (%s%s%s) on %s\n\n", o.model, o.mo.precision == SG_DTYPE_BF16 ? "bf16" : "fp32",
               setup, forms, sg_ctx_device_name(ctx));
        fflush(stdout);
    }
    o.ao.progress = progress;
    o.ao.progress_user = &o.json;
    sg_status st = sg_advise_name(ctx, o.model, &o.mo, &o.ao, r);
    /* Calibration, profile or prediction failed: nothing to conclude. A failed measurement was
     * said as it happened, and the rest is still printed. */
    bool predicted = r->summary.verdict[0] != '\0';
    rc = st == SG_OK ? 0 : SG_EXIT_FAIL;
    if (!predicted) fprintf(stderr, "stepgraph advise: %s\n", sg_ctx_last_error(ctx));
    else if (o.json && !print_json(r, &o.tr)) rc = SG_EXIT_FAIL;
    else if (!o.json) {
        if (r->sol_ok)
            for (int k = 0; k < SG_ADVISE_SCOPES; k++)
                if (r->scopes[k].measured)
                    printf("%s speed of light: %s scope %.4f ms, %.1f%% of the %.4f ms floor\n", k ? "     " : "\n",
                           sg_scope_name((sg_scope)k), r->scopes[k].measurement.step_ms,
                           100 * r->sol.floor_ms / r->scopes[k].measurement.step_ms, r->sol.floor_ms);
        printf("\nverdict: %s\n", r->verdict);
    }
    free(r);
    sg_ctx_destroy(ctx);
    return rc;
}
