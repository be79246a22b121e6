/* bench.c: `stepgraph bench`: validates a model trains, then times eager steps: ms/step
 * (median over repeats of wall time per block of steps, synced at the end of each block),
 * host ms/step (time the host spends queuing a block, before its sync), kernels launched
 * per step (the runtime's own counter), GPU-busy ms/step (CUPTI: union of device activity),
 * device allocations per 100 steps, and peak memory. --json prints one line per model. */
#include "cli/cli.h"
#include "prof/prof.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef SG_GIT_COMMIT
#define SG_GIT_COMMIT "unknown"
#endif

static const char *bench_usage =
    "usage: stepgraph bench --model NAME[,NAME...] [options]\n"
    "\n"
    "Times eager training steps (AdamW, no weight decay: Adam) of each model after a warm-up,\n"
    "and first checks that the mean loss on four fixed batches falls over the warm-up (a\n"
    "benchmark validates before it times). kernels: the runtime's launch counter (a cuBLASLt\n"
    "matmul counts one); GPU-busy and kernels_per_step_cupti: CUPTI, over 20 extra steps.\n"
    "\n"
    "options:\n"
    "  --model LIST        comma-separated model names, e.g. mlp-512-6-32,mlp-2048-6-256\n"
    "  --steps N           steps per timed block (default 100)\n"
    "  --repeats R         timed blocks; the median is reported (default 5)\n"
    "  --warmup W          untimed steps first (default 30)\n"
    "  --scope LIST        comma-separated scopes: eager, layer, model, step, or all\n"
    "                      (default eager)\n"
    "  --backend B         cpu, cuda or auto (default auto)\n"
    "  --steps-per-graph K optimizer steps per trainer call: under step scope, one graph launch\n"
    "                      runs K steps (default 1); --steps is rounded up to a multiple of K\n"
    "  --precision P       fp32 (default) or bf16 (gpt: mixed precision with loss scaling)\n"
    "  --json              one JSON object per model on stdout instead of a table\n"
    "  -h, --help          this text\n";

typedef struct bench_row {
    char model[64], device[320];
    double ms, host_ms, kernels, cupti_kernels, busy_ms, allocs100, peak_mib, loss0, loss1;
    bool busy_ok;
    sg_scope scope;
    sg_trainer_stats ts;
} bench_row;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define SG_TRY_CLI(expr)                                                                     \
    do {                                                                                      \
        sg_status st_ = (expr);                                                               \
        if (st_ != SG_OK) return st_;                                                         \
    } while (0)

static int steps_per_call = 1;
static sg_dtype precision = SG_DTYPE_F32;

/* n optimizer steps from batch `from` (n a multiple of steps_per_call). */
static sg_status steps(sg_trainer *t, long long from, long long n)
{
    for (long long s = from; s < from + n; s += steps_per_call) SG_TRY_CLI(sg_trainer_step(t, s));
    return SG_OK;
}

/* Mean loss over the first four batches, forward only: the same inputs before and after. */
static sg_status held_out_loss(sg_model *m, double *out)
{
    double sum = 0;
    for (int b = 0; b < 4; b++) {
        float l;
        SG_TRY_CLI(sg_model_load_batch(m, b));
        SG_TRY_CLI(sg_model_forward(m));
        SG_TRY_CLI(sg_model_loss_read(m, &l));
        sum += l;
    }
    *out = sum / 4;
    return SG_OK;
}

static int bench_one(const char *name, sg_scope scope, sg_backend backend, long long nsteps,
                     long long repeats, long long warmup, bench_row *r)
{
    sg_ctx *ctx = sg_cli_ctx("bench", backend, true);
    if (!ctx) return SG_EXIT_FAIL;
    sg_model *m = NULL;
    sg_optim *o = NULL;
    sg_trainer *t = NULL;
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = scope;
    to.steps_per_call = steps_per_call;
    int rc = SG_EXIT_FAIL;
    double *ms = calloc((size_t)repeats, sizeof *ms), *host = calloc((size_t)repeats, sizeof *host);
    memset(r, 0, sizeof *r);
    snprintf(r->model, sizeof r->model, "%s", name);
    r->scope = scope;
    snprintf(r->device, sizeof r->device, "%s", sg_ctx_device_name(ctx));
    double l0 = 0, l1 = 0;
    sg_model_options mo = {.precision = precision};
    if (sg_model_create_ex(ctx, name, 1, &mo, &m) != SG_OK || sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o) != SG_OK ||
        sg_trainer_create(m, o, &to, &t) != SG_OK)
        goto fail;
    /* Validate: the mean loss on fixed batches must fall over the warm-up. */
    if (held_out_loss(m, &l0) != SG_OK) goto fail;
    if (steps(t, 0, (warmup + 1) * steps_per_call) != SG_OK || held_out_loss(m, &l1) != SG_OK) goto fail;
    r->loss0 = l0, r->loss1 = l1;
    if (!isfinite(l0) || !isfinite(l1)) {
        fprintf(stderr, "stepgraph bench: %s: the loss is not finite (%g -> %g); not timing a broken step\n",
                name, l0, l1);
        goto out;
    }
    /* Correctness is the GPU tests' job; here a loss that did not fall is worth a warning. */
    if (!(l1 < l0))
        fprintf(stderr, "stepgraph bench: %s: warning: mean loss on 4 fixed batches did not fall over %lld "
                "warm-up steps (%.4f -> %.4f)\n", name, warmup, l0, l1);
    sg_alloc_stats a0, a1;
    sg_ctx_alloc_stats(ctx, &a0);
    uint64_t k0 = sg_ctx_launch_count(ctx);
    long long s = (warmup + 1) * steps_per_call;
    for (long long rep = 0; rep < repeats; rep++, s += nsteps) {
        if (sg_ctx_sync(ctx) != SG_OK) goto fail;
        double t0 = sg_cli_now_ms();
        if (steps(t, s, nsteps) != SG_OK) goto fail;
        double t1 = sg_cli_now_ms();
        if (sg_ctx_sync(ctx) != SG_OK) goto fail;
        double t2 = sg_cli_now_ms();
        ms[rep] = (t2 - t0) / nsteps;
        host[rep] = (t1 - t0) / nsteps;
    }
    sg_ctx_alloc_stats(ctx, &a1);
    r->kernels = (double)(sg_ctx_launch_count(ctx) - k0) / (double)(repeats * nsteps);
    r->allocs100 = 100.0 * (double)(a1.device_allocs - a0.device_allocs) / (double)(repeats * nsteps);
    r->peak_mib = a1.peak_bytes_reserved / 1048576.0;
    qsort(ms, (size_t)repeats, sizeof *ms, cmp_double);
    qsort(host, (size_t)repeats, sizeof *host, cmp_double);
    r->ms = ms[repeats / 2];
    r->host_ms = host[repeats / 2];

    /* GPU-busy time: profiled separately, so CUPTI's overhead stays out of the timings. */
    sg_prof *p = NULL;
    if (sg_ctx_backend(ctx) == SG_BACKEND_CUDA && sg_prof_create(ctx, &p) == SG_OK) {
        sg_prof_result pr;
        long long n = nsteps < 20 ? nsteps : 20;
        n = (n + steps_per_call - 1) / steps_per_call * steps_per_call;
        if (sg_ctx_sync(ctx) == SG_OK && sg_prof_start(p) == SG_OK && steps(t, s, n) == SG_OK &&
            sg_prof_stop(p, &pr) == SG_OK) {
            r->busy_ms = pr.busy_us / 1000.0 / (double)n;
            r->cupti_kernels = (double)pr.kernels / (double)n;
            r->busy_ok = true;
        }
        sg_prof_destroy(p);
    }
    sg_trainer_get_stats(t, &r->ts);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "stepgraph bench: %s: %s\n", name, sg_ctx_last_error(ctx));
out:
    free(ms), free(host);
    sg_trainer_destroy(t);
    sg_optim_destroy(o);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
    return rc;
}

int sg_cmd_bench(int argc, char **argv)
{
    const char *models = NULL, *scopes = "eager";
    long long nsteps = 100, repeats = 5, warmup = 30;
    sg_backend backend = SG_BACKEND_AUTO;
    bool json = false, bad = false;
    for (int i = 1; i < argc && !bad;) {
        const char *v = NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(bench_usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = true, i++;
        } else if (sg_cli_opt(argc, argv, &i, "--model", &v, &bad)) {
            models = v;
        } else if (sg_cli_opt(argc, argv, &i, "--steps", &v, &bad)) {
            bad = bad || !sg_cli_int("bench", "--steps", v, 1, 1000000, &nsteps);
        } else if (sg_cli_opt(argc, argv, &i, "--repeats", &v, &bad)) {
            bad = bad || !sg_cli_int("bench", "--repeats", v, 1, 1000, &repeats);
        } else if (sg_cli_opt(argc, argv, &i, "--warmup", &v, &bad)) {
            bad = bad || !sg_cli_int("bench", "--warmup", v, 1, 1000000, &warmup);
        } else if (sg_cli_opt(argc, argv, &i, "--backend", &v, &bad)) {
            bad = bad || !sg_cli_backend("bench", v, &backend);
        } else if (sg_cli_opt(argc, argv, &i, "--steps-per-graph", &v, &bad)) {
            long long k = 1;
            bad = bad || !sg_cli_int("bench", "--steps-per-graph", v, 1, 1024, &k);
            steps_per_call = (int)k;
        } else if (sg_cli_opt(argc, argv, &i, "--precision", &v, &bad)) {
            bad = bad || !sg_cli_precision("bench", v, &precision);
        } else if (sg_cli_opt(argc, argv, &i, "--scope", &v, &bad)) {
            scopes = !strcmp(v, "all") ? "eager,layer,model,step" : v;
        } else {
            fprintf(stderr, "stepgraph bench: unknown option '%s' (see stepgraph bench --help)\n", argv[i]);
            bad = true;
        }
    }
    if (!bad && !models) {
        fprintf(stderr, "stepgraph bench: --model is required (see stepgraph bench --help)\n");
        bad = true;
    }
    if (bad) return SG_EXIT_USAGE;
    nsteps = (nsteps + steps_per_call - 1) / steps_per_call * steps_per_call;

    /* The commit the binary was built from; SG_COMMIT overrides it (a copy without .git). */
    const char *commit = getenv("SG_COMMIT") ? getenv("SG_COMMIT") : SG_GIT_COMMIT;
    sg_scope sc[4];
    int nsc = 0;
    {
        char buf[64], *save = NULL;
        snprintf(buf, sizeof buf, "%s", scopes);
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (nsc == 4 || sg_scope_parse(tok, &sc[nsc]) != SG_OK) {
                fprintf(stderr, "stepgraph bench: --scope '%s': expected eager, layer, model, step or all\n", tok);
                return SG_EXIT_USAGE;
            }
            nsc++;
        }
    }
    char *list = strdup(models), *save = NULL;
    int rc = 0;
    if (!json)
        printf("%-16s %-6s %9s %9s %8s %9s %9s %8s %9s %8s\n", "model", "scope", "ms/step", "host ms",
               "launch", "busy ms", "capt ms", "nodes", "alloc/100", "peak MiB");
    for (char *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        for (int k = 0; k < nsc; k++) {
            bench_row r;
            if (bench_one(name, sc[k], backend, nsteps, repeats, warmup, &r) != 0) {
                rc = SG_EXIT_FAIL;
                continue;
            }
            if (json) {
                printf("{\"framework\": \"stepgraph\", \"model\": \"%s\", \"mode\": \"%s\", "
                       "\"precision\": \"%s\", "
                       "\"ms_per_step\": %.5f, \"host_ms_per_step\": %.5f, \"kernels_per_step\": %.2f, "
                       "\"gpu_busy_ms_per_step\": ",
                       r.model, sg_scope_name(r.scope), precision == SG_DTYPE_BF16 ? "bf16" : "fp32", r.ms,
                       r.host_ms, r.kernels);
                if (r.busy_ok) printf("%.5f, \"kernels_per_step_cupti\": %.2f", r.busy_ms, r.cupti_kernels);
                else printf("null");
                printf(", \"graphs\": %d, \"graph_nodes\": %d, \"steps_per_graph\": %d, \"capture_ms\": %.3f, \"instantiate_ms\": %.3f, "
                       "\"graph_exec_mib\": %.2f, \"fell_back\": %s, \"allocs_per_100_steps\": %.2f, "
                       "\"peak_mib\": %.1f, \"loss_first\": %.4f, \"loss_after_warmup\": %.4f, "
                       "\"device\": \"%s\", \"commit\": \"%s\"}\n",
                       r.ts.graphs, r.ts.nodes, steps_per_call, r.ts.capture_ms, r.ts.instantiate_ms,
                       r.ts.exec_bytes / 1048576.0, r.ts.fell_back ? "true" : "false", r.allocs100,
                       r.peak_mib, r.loss0, r.loss1, r.device, commit);
            } else {
                char busy[32];
                if (r.busy_ok) snprintf(busy, sizeof busy, "%.4f", r.busy_ms);
                else snprintf(busy, sizeof busy, "n/a");
                printf("%-16s %-6s %9.4f %9.4f %8.1f %9s %9.2f %8d %9.2f %8.1f\n", r.model,
                       sg_scope_name(r.scope), r.ms, r.host_ms, r.kernels, busy,
                       r.ts.capture_ms + r.ts.instantiate_ms, r.ts.nodes, r.allocs100, r.peak_mib);
            }
            fflush(stdout);
        }
    }
    free(list);
    return rc;
}
