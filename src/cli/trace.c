/* trace.c: `stepgraph trace`: runs a model's warm-up (and capture) under a scope unprofiled,
 * then records a few steps with the CUPTI profiler and writes them as a Perfetto / Chrome
 * trace (CUDA calls and named ranges per host thread, kernels and copies per stream), with a
 * line per step: kernels, launch calls, graph launches, host time in launches, GPU busy/idle.
 * With --gpus N it is the launcher of a data-parallel run (as train is): every rank runs the
 * same steps, and rank 0 profiles its own and writes the trace. */
#include "cli/cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *trace_usage =
    "usage: stepgraph trace --model NAME --scope S --out FILE.json [options]\n"
    "\n"
    "Builds NAME, runs the warm-up steps (and, under a capture scope, the capture) without\n"
    "profiling, then records N training steps with CUPTI and writes a trace-event JSON file\n"
    "that https://ui.perfetto.dev and chrome://tracing open: on the host, each thread's CUDA\n"
    "calls and named ranges (\"step\", \"blocks.3.forward\"); on the GPU, each stream's kernels,\n"
    "copies and sets, graph-launched ones carrying their graph id. Prints one line per step:\n"
    "kernels, kernel launch calls, graph launches, host time inside them (and its share of the\n"
    "step's host time), and the GPU's busy and idle time over the step's work.\n"
    "\n"
    "options:\n"
    "  --model NAME        mlp-WIDTH-DEPTH-BATCH, gpt-WIDTH-DEPTH-BATCH-SEQ or\n"
    "                      resnet18|34|50-BATCH-R or efficientnet_b0-BATCH-R (required)\n"
    "  --scope S           eager, layer, model or step (required)\n"
    "  --out FILE          the trace to write, e.g. trace.json (required)\n"
    "  --steps N           steps to trace (default 5)\n"
    "  --warmup W          eager steps before capture, not traced (default 3)\n"
    SG_CLI_ACCUM_HELP
    "                      A traced step is an optimizer step: K forwards and backwards\n"
    SG_CLI_COND_HELP
    SG_CLI_MODEL_OPTS_HELP
    "  --precision P       fp32 (default) or bf16 (mixed precision; not mlp)\n"
    "  --optim-state D     f32 (default) or bf16: the AdamW moments' dtype (stepgraph train)\n"
    "  --data PATH         gpt: the text to train on (a regular file);\n"
    "                      resnet, efficientnet: a digits file (scikit-learn's 8 x 8\n"
    "                      digits.csv, scripts/fetch-digits.sh DIR) instead of synthetic\n"
    "                      images: scaled up to R x R, the last fifth held out (docs/data.md)\n"
    "  --backend B         cuda or auto (default auto); tracing needs a CUDA GPU and CUPTI\n"
    "  --gpus N            trace a data-parallel step: N processes on this host, one per GPU,\n"
    "                      as `stepgraph train --gpus N` runs them (each on 1/N of every batch,\n"
    "                      gradients averaged over NCCL inside the step); every rank runs the\n"
    "                      same steps, rank 0 profiles its GPU (its kernels and the NCCL\n"
    "                      all-reduces beside them) and writes --out. Not with --stop-nonfinite\n"
    "                      or --stop-loss\n"
    "  --bucket-mib X      with --gpus: gradient MiB an all-reduce bucket gathers, which sets how\n"
    "                      the all-reduces overlap the backward (default 4)\n"
    "  --shard-optimizer   with --gpus: a sharded optimizer, as train's (the gradients\n"
    "                      reduce-scattered, each rank updating 1/N, the weights all-gathered)\n"
    "  -h, --help          this text\n"
    "\n"
    "exit status: 0 written, 1 a runtime error (no GPU or CUPTI, a path that cannot be\n"
    "written, a rank of --gpus that failed), 2 a usage error\n";

typedef struct trace_opts {
    const char *model, *out;
    long long steps;
    sg_backend backend;
    sg_dtype optim_state;       /* --optim-state */
    sg_trainer_options tr;
    sg_model_options mo;
    sg_cli_dist dp;             /* --gpus, --bucket-mib */
} trace_opts;

static int parse(int argc, char **argv, trace_opts *o)
{
    *o = (trace_opts){.steps = 5, .backend = SG_BACKEND_AUTO, .optim_state = SG_DTYPE_F32,
                      .tr = sg_trainer_options_default(), .dp = sg_cli_dist_default()};
    bool bad = false, scope_set = false;
    for (int i = 1; i < argc && !bad;) {
        const char *v = NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(trace_usage, stdout);
            exit(0);
        } else if (sg_cli_opt(argc, argv, &i, "--model", &v, &bad)) {
            o->model = v;
        } else if (sg_cli_opt(argc, argv, &i, "--out", &v, &bad)) {
            o->out = v;
        } else if (sg_cli_opt(argc, argv, &i, "--scope", &v, &bad)) {
            scope_set = true;
            if (!bad && sg_scope_parse(v, &o->tr.scope) != SG_OK) {
                fprintf(stderr, "stepgraph trace: --scope '%s': expected eager, layer, model or step\n", v);
                bad = true;
            }
        } else if (sg_cli_opt(argc, argv, &i, "--steps", &v, &bad)) {
            bad = bad || !sg_cli_int("trace", "--steps", v, 1, 10000, &o->steps);
        } else if (sg_cli_opt(argc, argv, &i, "--warmup", &v, &bad)) {
            long long w = 0;
            bad = bad || !sg_cli_int("trace", "--warmup", v, 0, 1000000, &w);
            o->tr.warmup = (int)w;
        } else if (sg_cli_opt(argc, argv, &i, "--precision", &v, &bad)) {
            bad = bad || !sg_cli_precision("trace", v, &o->mo.precision);
        } else if (sg_cli_opt(argc, argv, &i, "--optim-state", &v, &bad)) {
            bad = bad || !sg_cli_optim_state("trace", v, &o->optim_state);
        } else if (sg_cli_model_opt("trace", argc, argv, &i, &o->mo, &bad)) {
            /* --classes, --recompute, --loss-scale */
        } else if (sg_cli_accum_opt("trace", argc, argv, &i, &o->tr.accum, &bad)) {
            /* --accum */
        } else if (sg_cli_cond_opt("trace", argc, argv, &i, &o->tr, &bad)) {
            /* --loop, --skip-if, --stop-nonfinite, --stop-loss */
        } else if (sg_cli_dist_opt("trace", argc, argv, &i, &o->dp, &bad)) {
            /* --gpus, --bucket-mib */
        } else if (sg_cli_opt(argc, argv, &i, "--data", &v, &bad)) {
            o->mo.data_path = v;
        } else if (sg_cli_opt(argc, argv, &i, "--backend", &v, &bad)) {
            bad = bad || !sg_cli_backend("trace", v, &o->backend);
            if (!bad && o->backend == SG_BACKEND_CPU) {
                fprintf(stderr, "stepgraph trace: --backend cpu: trace needs a CUDA GPU and CUPTI (the "
                                "CPU backend runs no device activity to trace)\n");
                bad = true;
            }
        } else {
            fprintf(stderr, "stepgraph trace: unknown option '%s' (see stepgraph trace --help)\n", argv[i]);
            bad = true;
        }
    }
    if (!bad && (!o->model || !scope_set || !o->out)) {
        fprintf(stderr, "stepgraph trace: --model, --scope and --out are required (see stepgraph trace "
                        "--help)\n");
        bad = true;
    }
    if (!bad) bad = !sg_cli_cond_check("trace", &o->tr, o->mo.precision, true);
    if (!bad && o->dp.opts && !o->dp.gpus) {
        fprintf(stderr, "stepgraph trace: --bucket-mib and --shard-optimizer are for data-parallel runs: add --gpus N\n");
        bad = true;
    }
    if (!bad) bad = !sg_cli_dist_check("trace", &o->dp, o->backend, &o->tr, o->model);
    return bad ? SG_EXIT_USAGE : 0;
}

/* Fails early, before minutes of work, when the trace could not be written: opens the path
 * for appending (so an existing file is left as it is) and removes it again if it was new. */
static bool out_writable(const char *path)
{
    bool existed = access(path, F_OK) == 0;
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "stepgraph trace: --out '%s': cannot write there: %s\n", path, strerror(errno));
        return false;
    }
    fclose(f);
    if (!existed) remove(path);
    return true;
}

static int fail(sg_ctx *ctx, const char *what)
{
    fprintf(stderr, "stepgraph trace%s: %s: %s\n", sg_cli_dist_tag(), what, sg_ctx_last_error(ctx));
    return SG_EXIT_FAIL;
}

/* Tracing without a usable GPU: says what it needs. */
static int no_gpu(void)
{
    fprintf(stderr, "stepgraph trace: trace needs a CUDA GPU and CUPTI: no usable GPU%s\n",
#ifdef SG_HAVE_CUDA
            ""
#else
            " (this build has no CUDA)"
#endif
    );
    return SG_EXIT_FAIL;
}

/* One line per step, as sg_prof_analyze cut the window. */
static void print_steps(const sg_prof_step *st, int n)
{
    printf("%5s %8s %9s %7s %10s %9s %6s %9s %9s %9s\n", "step", "kernels", "launches", "graphs",
           "launch us", "host us", "share", "GPU us", "busy us", "idle us");
    for (int k = 0; k < n; k++)
        printf("%5d %8llu %9llu %7llu %10.1f %9.1f %5.0f%% %9.1f %9.1f %9.1f\n", k + 1,
               (unsigned long long)st[k].kernels, (unsigned long long)st[k].launch_calls,
               (unsigned long long)st[k].graph_launches, st[k].launch_host_us, st[k].host_us,
               100.0 * st[k].launch_share, st[k].device_us, st[k].busy_us, st[k].idle_us);
}

/* Rank 0's (or the one process's) report of the window p recorded: a line per step, warnings,
 * the trace written to --out, what it holds, and the data-parallel run's all-reduces. */
static int report(const trace_opts *o, sg_ctx *ctx, sg_prof *p, const sg_prof_result *res, sg_trainer *tr,
                  const sg_dist *dist)
{
    size_t n = 0;
    const sg_prof_record *rec = sg_prof_records(p, &n);
    sg_prof_step *steps = calloc((size_t)o->steps, sizeof *steps);
    int found = 0;
    if (!steps || sg_prof_analyze(rec, n, steps, (int)o->steps, &found) != SG_OK) {
        fprintf(stderr, "stepgraph trace: out of host memory analysing %zu records\n", n);
        free(steps);
        return SG_EXIT_FAIL;
    }
    print_steps(steps, found < o->steps ? found : (int)o->steps);
    free(steps);
    if (found != o->steps)
        fprintf(stderr, "stepgraph trace: warning: the window holds %d \"step\" ranges, %lld steps ran\n",
                found, o->steps);
    if (res->dropped)
        fprintf(stderr, "stepgraph trace: warning: CUPTI dropped %llu records (no buffer space): the "
                        "trace and the numbers above miss them\n", (unsigned long long)res->dropped);
    sg_trainer_stats ts;
    bool have_stats = sg_trainer_get_stats(tr, &ts) == SG_OK;
    if (have_stats && ts.fell_back) printf("note: the trainer fell back to eager: %s\n", ts.fallback_reason);
    if (have_stats && ts.cond_note[0]) printf("note: built without conditional nodes: %s\n", ts.cond_note);
    if (sg_prof_write_trace(ctx, rec, n, o->out) != SG_OK) return fail(ctx, "writing the trace");
    size_t host = 0, dev = 0;
    for (size_t i = 0; i < n; i++) {
        if (rec[i].start_ns == 0 && rec[i].end_ns == 0) continue;
        if (rec[i].kind == SG_PROF_KIND_API || rec[i].kind == SG_PROF_KIND_RANGE) host++;
        else dev++;
    }
    printf("wrote %s: %zu host events (CUDA calls, ranges), %zu GPU events (%llu kernels, %llu "
           "copies, %llu sets); open it in https://ui.perfetto.dev or chrome://tracing\n",
           o->out, host, dev, (unsigned long long)res->kernels, (unsigned long long)res->memcpys,
           (unsigned long long)res->memsets);
    sg_cli_dist_print(dist, o->dp.bucket_mib);
    return 0;
}

int sg_cmd_trace(int argc, char **argv)
{
    trace_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    sg_dist_env env;
    int worker = 0;
    if (!sg_cli_dist_env("trace", &env, &worker)) return SG_EXIT_FAIL;
    bool tracer = !worker || env.rank == 0; /* the process that profiles and writes --out */
    if (tracer && !out_writable(o.out)) return SG_EXIT_FAIL;
    if (o.dp.gpus && !worker) {
        /* Ranks on the CPU would have nothing to trace: refuse before starting them. */
        if (!sg_cuda_available()) return no_gpu();
        return sg_cli_dist_launch("trace", argc, argv, SG_BACKEND_CUDA, &o.dp);
    }
    sg_ctx *ctx = worker ? sg_cli_dist_ctx("trace", o.backend, &env) : sg_cli_ctx("trace", o.backend, true);
    if (!ctx) return SG_EXIT_FAIL;
    sg_prof *p = NULL;
    sg_dist *dist = NULL;
    sg_model *m = NULL;
    sg_optim *opt = NULL;
    sg_trainer *tr = NULL;
    rc = SG_EXIT_FAIL;
    if (sg_ctx_backend(ctx) != SG_BACKEND_CUDA) {
        no_gpu();
        goto out;
    }
    if (tracer && sg_prof_create(ctx, &p) != SG_OK) {
        rc = fail(ctx, "trace needs a CUDA GPU and CUPTI");
        goto out;
    }
    if (worker && sg_cli_dist_join(ctx, &env, &o.dp, &o.mo, &o.tr, &dist) != SG_OK) {
        rc = fail(ctx, "joining the run");
        goto out;
    }
    if (sg_model_create_ex(ctx, o.model, 1, &o.mo, &m) != SG_OK) {
        rc = fail(ctx, "model");
        goto out;
    }
    if (sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &opt) != SG_OK ||
        sg_optim_set_state_dtype(opt, o.optim_state) != SG_OK || sg_trainer_create(m, opt, &o.tr, &tr) != SG_OK) {
        rc = fail(ctx, "trainer");
        goto out;
    }
    /* Warm-up steps, then (under a capture scope) the capture step, all unprofiled: the trace
     * shows steady-state steps. */
    long long untraced = o.tr.warmup + (o.tr.scope != SG_SCOPE_EAGER ? 1 : 0);
    if (untraced < 1) untraced = 1;
    char setup[80] = "";
    if (o.tr.accum > 1) snprintf(setup, sizeof setup, ", %d micro-batches a step", o.tr.accum);
    if (o.optim_state == SG_DTYPE_BF16)
        snprintf(setup + strlen(setup), sizeof setup - strlen(setup), ", bf16 optimizer state");
    printf("stepgraph trace: %s (%s%s) on %s, scope %s%s: %lld untraced step%s, then %lld traced\n",
           sg_model_name(m), o.mo.precision == SG_DTYPE_BF16 ? "bf16" : "fp32", setup, sg_ctx_device_name(ctx),
           sg_scope_name(o.tr.scope),
           sg_graphs_disabled() && o.tr.scope != SG_SCOPE_EAGER ? " (STEPGRAPH_DISABLE_GRAPHS=1: run eagerly)" : "",
           untraced, untraced == 1 ? "" : "s", o.steps);
    if (dist)
        printf("stepgraph trace: rank %d of %d of a data-parallel run (each rank on 1/%d of every batch, "
               "all-reduces in buckets of %.3g MiB): the trace is rank %d's GPU\n", sg_dist_rank(dist),
               sg_dist_world(dist), sg_dist_world(dist), o.dp.bucket_mib, sg_dist_rank(dist));
    for (long long s = 0; s < untraced; s++)
        if (sg_trainer_step(tr, s) != SG_OK) {
            rc = fail(ctx, "warm-up step");
            goto out;
        }
    /* Rank 0 profiles the steps; the other ranks run them unprofiled, the same collectives. */
    if (sg_ctx_sync(ctx) != SG_OK || (p && sg_prof_start(p) != SG_OK)) {
        rc = fail(ctx, "profiler");
        goto out;
    }
    for (long long s = untraced; s < untraced + o.steps; s++)
        if (sg_trainer_step(tr, s) != SG_OK) {
            rc = fail(ctx, "traced step");
            if (p) (void)sg_prof_stop(p, NULL);
            goto out;
        }
    sg_prof_result res;
    if (p && sg_prof_stop(p, &res) != SG_OK) {
        rc = fail(ctx, "profiler");
        goto out;
    }
    /* Every rank's steps, their all-reduces included, finish before it leaves the run. */
    if (sg_ctx_sync(ctx) != SG_OK || (dist && sg_dist_poll(dist) != SG_OK)) {
        rc = fail(ctx, "sync");
        goto out;
    }
    rc = p ? report(&o, ctx, p, &res, tr, dist) : 0;
out:
    sg_prof_destroy(p);
    sg_trainer_destroy(tr);
    sg_optim_destroy(opt);
    sg_model_destroy(m);
    sg_dist_destroy(dist); /* after the trainer: its graphs hold the run's collectives */
    sg_ctx_destroy(ctx);
    return rc;
}
