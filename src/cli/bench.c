/* bench.c: `stepgraph bench`: validates a model trains, then times its training steps under
 * each capture scope asked for: ms/step (median over repeats of wall time per block of steps,
 * synced at the end of each block), host ms/step (time the host spends queuing a block, before
 * its sync), kernels launched per step (the runtime's own counter), GPU-busy ms/step (CUPTI:
 * union of device activity), device allocations per 100 steps, and peak memory. --json prints
 * one line per model and scope, its keys named after the table's columns. --memory adds where
 * the memory goes: peaks, the static buffers by kind, the graphs' pool and executable graphs,
 * and allocations per 100 steps eager and under replay. */
#include "cli/cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *bench_usage =
    "usage: stepgraph bench --model NAME[,NAME...] [options]\n"
    "\n"
    "Times training steps (AdamW, no weight decay: Adam) of each model under each capture\n"
    "scope of --scope: eager (the host launches every kernel) or replayed CUDA Graphs of one\n"
    "layer, the whole model or the whole step. Each run first checks that the mean loss on four\n"
    "fixed batches falls over the warm-up (a benchmark validates before it times), then prints\n"
    "one row per model and scope: ms/step (median over --repeats blocks), host ms (queuing a\n"
    "step), kernels (the runtime's launch counter: a cuBLASLt matmul or a graph launch counts\n"
    "one), busy ms (GPU-busy, CUPTI, over 20 extra steps; n/a on the CPU), capt ms (capture and\n"
    "instantiation), nodes (graph nodes), alloc/100 (device allocations per 100 timed steps)\n"
    "and peak MiB (peak reserved). --json names its keys after these columns.\n"
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
    "                      runs K steps (default 1); --steps is rounded up to a multiple of K.\n"
    "                      Every figure stays per optimizer step\n"
    "  --seq-lens L        gpt, with --vary-seq (eager and step scopes): sequence-length\n"
    "                      buckets, e.g. 32,64,128 (at most the model's SEQ)\n"
    "  --vary-seq          each step's length drawn from 1..the largest bucket (sg_vary_len),\n"
    "                      run padded up to its bucket; under step scope the device draws it\n"
    "                      and one graph holds every bucket as a branch of a SWITCH node (so\n"
    "                      --steps-per-graph works with it)\n"
    SG_CLI_COND_HELP
    "                      --loop and --skip-if shape the step scope's rows only\n"
    "  --overflow-every N  bf16: force an overflow every N steps (the loss scale set to +inf\n"
    "                      before step i with i % N == N - 1: its gradients overflow, it is\n"
    "                      skipped and the scale backs off), to time the skip; with\n"
    "                      --steps-per-graph K, N is a multiple of K and the launch that holds\n"
    "                      such a step starts with it (its first step is skipped)\n"
    SG_CLI_ACCUM_HELP
    SG_CLI_MODEL_OPTS_HELP
    "  --precision P       fp32 (default) or bf16 (mixed precision with loss scaling; not mlp)\n"
    "  --optim-state D     f32 (default) or bf16: the AdamW moments' dtype (stepgraph train)\n"
    "  --data PATH         gpt: the text to train on, as stepgraph train --data (default: a\n"
    "                      licence text); with --vocab, a token file;\n"
    "                      resnet, efficientnet: a digits file (scikit-learn's 8 x 8\n"
    "                      digits.csv, scripts/fetch-digits.sh DIR) instead of synthetic\n"
    "                      images: scaled up to R x R, the last fifth held out (docs/data.md)\n"
    "  --vocab N           gpt: --data is a token file (nanoGPT's raw uint16 or an llm.c\n"
    "                      shard), tokens below N; embedding and head get N rows (e.g. 50304)\n"
    "  --sol               speed of light: measure this GPU's matmul rate (in --precision) and\n"
    "                      copy bandwidth once (about 1 s), and report per model and scope the\n"
    "                      work of a step (the products' TFLOP, the other ops' GB at least:\n"
    "                      sg_trainer_stats.work), its floor in ms (each op family's work over\n"
    "                      the peak that bounds it, summed), the share of the floor the step\n"
    "                      reaches (floor / ms), and the floor by family: a second table, or\n"
    "                      extra fields with --json. On the CPU backend: the work, no floor\n"
    "  --memory            also report memory, per model and scope: peak reserved and in use,\n"
    "                      the static buffers (parameters, gradients, optimizer state,\n"
    "                      activations, data), the graphs' pool and executable graphs, and\n"
    "                      device allocations per 100 steps eagerly (the warm-up steps before\n"
    "                      capture) and under replay (the timed steps): a second table, or\n"
    "                      extra fields with --json. On the CPU backend host memory stands in\n"
    "                      for device memory\n"
    "  --json              one JSON object per model and scope on stdout instead of a table:\n"
    "                      framework, model, scope, precision, ms_per_step, host_ms_per_step,\n"
    "                      kernels_per_step, gpu_busy_ms_per_step (null where not measured),\n"
    "                      kernels_per_step_cupti, graphs, graph_nodes, steps_per_graph,\n"
    "                      accum (micro-batches a step), recompute (0 or 1), loss_scale\n"
    "                      (dynamic or none), loop, skip_if,\n"
    "                      vary_seq (0 or 1), seq_lens (given), stop_nonfinite, stop_loss\n"
    "                      (null: none), overflow_every (0: none), cond_note (why a form was\n"
    "                      built without conditional nodes; \"\": it was not),\n"
    "                      capture_ms, instantiate_ms, graph_exec_mib, fell_back,\n"
    "                      allocs_per_100_steps, peak_mib, loss_first, loss_after_warmup,\n"
    "                      vocab, data, tokens_per_step and tokens_per_s (gpt: the real\n"
    "                      tokens of an optimizer step, accum x batch x length, with --vary-seq\n"
    "                      the mean drawn length of the timed steps: padding not counted),\n"
    "                      device, commit. Per step means per optimizer step throughout\n"
    "  -h, --help          this text\n"
    "\n"
    "exit status: 0 every model timed under every scope, 1 a runtime error (no usable device\n"
    "for --backend, a model that does not fit, fails a step or whose loss is not finite; the\n"
    "other rows are still printed), 2 a usage error (an unknown option, scope or model name)\n";

typedef struct bench_row {
    char model[64], device[320];
    double ms, host_ms, kernels, cupti_kernels, busy_ms, allocs100, peak_mib, loss0, loss1;
    double tokens;              /* gpt: real tokens an optimizer step trains on (0: not gpt) */
    bool busy_ok;
    /* --memory: peaks over the whole run and over its eager steps (before any capture), and
     * allocations per 100 eager steps (NAN: none measured) and per 100 replayed ones (NAN:
     * eager scope, nothing replays). */
    bool host_memory;
    double peak_use_mib, eager_peak_mib, eager_peak_use_mib, eager_allocs100, replay_allocs100;
    sg_scope scope;
    sg_trainer_stats ts;
} bench_row;

/* Returns a failed call's status (the CLI's own: the library's SG_TRY is internal). */
#define BENCH_TRY(expr)                                                                       \
    do {                                                                                      \
        sg_status st_ = (expr);                                                               \
        if (st_ != SG_OK) return st_;                                                         \
    } while (0)

static int steps_per_call = 1;
static int accum = 1;           /* --accum: micro-batches per optimizer step */
/* The control-flow forms (--loop, --skip-if, --stop-*) and --seq-lens with --vary-seq: the
 * trainer options every row starts from. */
static sg_trainer_options forms;
static int64_t seq_lens[32];
static const char *seq_lens_arg;
static long long overflow_every; /* --overflow-every N (bf16): a forced overflow every N steps */
static sg_dtype precision = SG_DTYPE_F32;
static sg_dtype optim_state = SG_DTYPE_F32; /* --optim-state */
static const char *data_path;   /* gpt: --data (NULL: the default text) */
static int64_t vocab;           /* gpt: --vocab (0: bytes) */
static sg_model_options model_opts; /* --classes, --recompute, --loss-scale */

/* The control-flow and length options against the rest, before anything runs. */
static bool check_forms(const char *models, const char *scopes)
{
    char buf[160];
    const char *err = NULL;
    if (forms.vary_seq != (forms.n_seq_buckets > 0))
        err = forms.vary_seq ? "--vary-seq needs --seq-lens"
                             : "--seq-lens is for --vary-seq (bench times steps of drawn lengths)";
    else if (forms.vary_seq && accum > 1)
        snprintf(buf, sizeof buf, "--accum %d does not combine with --seq-lens: a padded step is one batch", accum),
            err = buf;
    else if (forms.vary_seq && (strstr(scopes, "layer") || strstr(scopes, "model") || !strcmp(scopes, "all")))
        err = "--seq-lens runs under eager and step scopes only (give --scope eager,step)";
    else if (overflow_every && precision != SG_DTYPE_BF16)
        err = "--overflow-every is for --precision bf16: an fp32 step has no loss scale to overflow";
    else if (overflow_every && model_opts.loss_scaling == SG_LOSS_SCALING_NONE)
        err = "--overflow-every needs dynamic loss scaling: with --loss-scale none there is no scale to overflow";
    else if (overflow_every % steps_per_call)
        snprintf(buf, sizeof buf, "--overflow-every %lld is not a multiple of --steps-per-graph %d: an overflow is "
                 "forced before a launch", overflow_every, steps_per_call), err = buf;
    if (!err && forms.vary_seq) { /* every model a gpt */
        char *names = strdup(models), *save = NULL;
        for (char *n = strtok_r(names, ",", &save); n && !err; n = strtok_r(NULL, ",", &save))
            if (strncmp(n, "gpt-", 4))
                snprintf(buf, sizeof buf, "--seq-lens is for gpt models, not '%s'", n), err = buf;
        free(names);
    }
    if (err) fprintf(stderr, "stepgraph bench: %s\n", err);
    return !err && sg_cli_cond_check("bench", &forms, precision, false);
}

/* n optimizer steps from batch `from` (n a multiple of steps_per_call). --overflow-every N:
 * the call whose steps hold step i with i % N == N - 1 (N a multiple of the call's steps)
 * starts with an infinite loss scale, so its first step overflows and is skipped. */
static sg_status steps(sg_trainer *t, long long from, long long n)
{
    static const sg_loss_scaler overflow = {INFINITY, 0, 2000, 0};
    for (long long s = from; s < from + n; s += steps_per_call) {
        if (overflow_every && (s + steps_per_call) % overflow_every == 0)
            BENCH_TRY(sg_trainer_set_scaler(t, &overflow));
        BENCH_TRY(sg_trainer_step(t, s));
    }
    return SG_OK;
}

/* An early-stop rule that held would leave later calls running nothing: refuse to time them. */
static bool still_training(sg_trainer *t, const char *name, const char *when)
{
    sg_trainer_stop st;
    if (!forms.stop_nonfinite && !forms.stop_on_loss) return true;
    if (sg_trainer_get_stop(t, &st) != SG_OK) return false;
    if (st.stopped == SG_STOPPED_NO) return true;
    fprintf(stderr, "stepgraph bench: %s: the early-stop rule (%s) held after %lld step%s, %s: later steps would "
            "not run; not timing them\n", name, st.stopped == SG_STOPPED_NONFINITE ? "--stop-nonfinite" : "--stop-loss",
            (long long)st.steps_run, st.steps_run == 1 ? "" : "s", when);
    return false;
}

/* gpt: the real tokens an optimizer step of the timed steps from..from+n-1 trains on: accum x
 * batch x length (--vary-seq: each step's drawn length, averaged). 0 for other models. */
static double tokens_per_step(const char *name, sg_model *m, long long from, long long n)
{
    if (strncmp(name, "gpt", 3) || n <= 0) return 0;
    const sg_tensor *x = sg_model_input(m);
    double rows = (double)sg_tensor_dim(x, 0) * accum, len = (double)sg_tensor_dim(x, 1);
    if (forms.vary_seq) {
        double sum = 0;
        for (long long s = from; s < from + n; s++) sum += (double)sg_vary_len(s, seq_lens[forms.n_seq_buckets - 1]);
        len = sum / (double)n;
    }
    return rows * len;
}

/* Device allocations per 100 optimizer steps between two snapshots. */
static double per100(const sg_alloc_stats *a, const sg_alloc_stats *b, long long nsteps)
{
    return nsteps > 0 ? 100.0 * (double)(b->device_allocs - a->device_allocs) / (double)nsteps : NAN;
}

/* The warm-up's `calls` trainer calls: the first (lazy set-up allocates there), the eager calls
 * before capture (`eager_calls` in all, the first included), then the rest. *first and *eager:
 * allocator statistics after the first and after the eager calls. */
static sg_status warm_up(sg_trainer *t, sg_ctx *ctx, long long calls, long long eager_calls,
                         sg_alloc_stats *first, sg_alloc_stats *eager)
{
    long long k = steps_per_call;
    BENCH_TRY(steps(t, 0, k));
    sg_ctx_alloc_stats(ctx, first);
    BENCH_TRY(steps(t, k, (eager_calls - 1) * k));
    sg_ctx_alloc_stats(ctx, eager);
    return steps(t, eager_calls * k, (calls - eager_calls) * k);
}

/* Mean loss over the first four batches, forward only: the same inputs before and after. */
static sg_status held_out_loss(sg_model *m, double *out)
{
    double sum = 0;
    for (int b = 0; b < 4; b++) {
        float l;
        BENCH_TRY(sg_model_load_batch(m, b));
        BENCH_TRY(sg_model_forward(m));
        BENCH_TRY(sg_model_loss_read(m, &l));
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
    sg_trainer_options to = forms;
    to.scope = scope;
    to.steps_per_call = steps_per_call;
    to.accum = accum;
    int rc = SG_EXIT_FAIL;
    double *ms = calloc((size_t)repeats, sizeof *ms), *host = calloc((size_t)repeats, sizeof *host);
    memset(r, 0, sizeof *r);
    snprintf(r->model, sizeof r->model, "%s", name);
    r->scope = scope;
    snprintf(r->device, sizeof r->device, "%s", sg_ctx_device_name(ctx));
    double l0 = 0, l1 = 0;
    sg_model_options mo = {.precision = precision, .data_path = data_path, .vocab = vocab, .classes = model_opts.classes,
                                   .recompute = model_opts.recompute, .loss_scaling = model_opts.loss_scaling};
    if (sg_model_create_ex(ctx, name, 1, &mo, &m) != SG_OK || sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o) != SG_OK ||
        sg_optim_set_state_dtype(o, optim_state) != SG_OK || sg_trainer_create(m, o, &to, &t) != SG_OK)
        goto fail;
    /* Validate: the mean loss on fixed batches must fall over the warm-up. */
    if (held_out_loss(m, &l0) != SG_OK) goto fail;
    /* Eager calls before capture: the trainer's warm-up (all of them under eager scope). */
    long long calls = warmup + 1, eager_calls = to.warmup < calls ? to.warmup : calls;
    if (scope == SG_SCOPE_EAGER || eager_calls < 1) eager_calls = 1;
    sg_alloc_stats w0, w1;
    if (warm_up(t, ctx, calls, eager_calls, &w0, &w1) != SG_OK || held_out_loss(m, &l1) != SG_OK) goto fail;
    if (!still_training(t, name, "in the warm-up")) goto out;
    /* --overflow-every: a forced overflow was skipped (the scaler counts it), or say so. */
    sg_loss_scaler sc;
    if (overflow_every && calls * steps_per_call >= overflow_every && sg_trainer_get_scaler(t, &sc) == SG_OK &&
        sc.skipped < 1)
        fprintf(stderr, "stepgraph bench: %s: warning: --overflow-every %lld: no step was skipped after a forced "
                "overflow in the warm-up\n", name, overflow_every);
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
    if (!still_training(t, name, "while timed")) goto out;
    r->tokens = tokens_per_step(name, m, (warmup + 1) * steps_per_call, repeats * nsteps);
    r->kernels = (double)(sg_ctx_launch_count(ctx) - k0) / (double)(repeats * nsteps);
    r->allocs100 = 100.0 * (double)(a1.device_allocs - a0.device_allocs) / (double)(repeats * nsteps);
    r->peak_mib = a1.peak_bytes_reserved / 1048576.0;
    r->peak_use_mib = a1.peak_bytes_in_use / 1048576.0;
    r->host_memory = sg_ctx_backend(ctx) == SG_BACKEND_CPU;
    if (scope == SG_SCOPE_EAGER) {
        r->eager_peak_mib = r->peak_mib, r->eager_peak_use_mib = r->peak_use_mib;
        r->eager_allocs100 = r->allocs100, r->replay_allocs100 = NAN;
    } else {
        r->eager_peak_mib = w1.peak_bytes_reserved / 1048576.0;
        r->eager_peak_use_mib = w1.peak_bytes_in_use / 1048576.0;
        r->eager_allocs100 = per100(&w0, &w1, (eager_calls - 1) * steps_per_call);
        r->replay_allocs100 = r->allocs100;
    }
    r->ms = sg_cli_median(ms, repeats);
    r->host_ms = sg_cli_median(host, repeats);

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
    if (r->ts.cond_note[0])
        fprintf(stderr, "stepgraph bench: %s, %s scope: built without conditional nodes: %s\n", name,
                sg_scope_name(scope), r->ts.cond_note);
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

/* "key": v with `decimals` digits (null when not finite), "key": "s", "key": n. */
static void json_num(sg_json *w, const char *key, double v, int decimals)
{
    sg_json_key(w, key);
    sg_json_fixed(w, v, decimals);
}

/* --memory --json: the extra fields of a row's line (before "device"). */
/* ---- --sol ---- */

static sg_device_peaks peaks;
static bool peaks_ok;

/* The device's peaks, once, on a context of the run's backend; the CPU backend has none (the
 * work is still reported). False after a failure, said on stderr. */
static bool measure_peaks(sg_backend backend)
{
    sg_ctx *ctx = sg_cli_ctx("bench", backend, true);
    if (!ctx) return false;
    sg_status st = SG_OK;
    if (sg_ctx_backend(ctx) == SG_BACKEND_CUDA) {
        st = sg_device_peaks_measure(ctx, precision, &peaks);
        if (st != SG_OK) fprintf(stderr, "stepgraph bench: --sol: %s\n", sg_ctx_last_error(ctx));
        peaks_ok = st == SG_OK;
    }
    sg_ctx_destroy(ctx);
    return st == SG_OK;
}

static double work_sum(const double *v)
{
    double s = 0;
    for (int f = 0; f < SG_WORK_FAMILIES; f++) s += v[f];
    return s;
}

/* The row's floor (false: no peaks or no work counted). */
static bool row_floor(const bench_row *r, sg_sol *out)
{
    return peaks_ok && r->ts.work_counted && sg_sol_floor(&r->ts.work, &peaks, out) == SG_OK;
}

static void json_sol(sg_json *w, const bench_row *r)
{
    sg_sol f;
    bool ok = row_floor(r, &f);
    json_num(w, "work_tflop", r->ts.work_counted ? work_sum(r->ts.work.flops) / 1e12 : NAN, 6);
    json_num(w, "work_gb", r->ts.work_counted ? work_sum(r->ts.work.bytes) / 1e9 : NAN, 6);
    json_num(w, "peak_matmul_tflops", peaks_ok ? peaks.matmul_tflops : NAN, 1);
    json_num(w, "peak_copy_gbps", peaks_ok ? peaks.copy_gbps : NAN, 1);
    json_num(w, "floor_ms", ok ? f.floor_ms : NAN, 5);
    json_num(w, "sol_share", ok ? f.floor_ms / r->ms : NAN, 4);
    sg_json_key(w, "floor_ms_by_family");
    sg_json_object_begin(w);
    for (int k = 0; k < SG_WORK_FAMILIES; k++) json_num(w, sg_work_family_name((sg_work_family)k), ok ? f.family_ms[k] : NAN, 5);
    sg_json_object_end(w);
}

static void print_sol_table(const bench_row *rows, int n)
{
    if (peaks_ok)
        printf("\nspeed of light on %s: %.1f TFLOP/s %s matmul, %.0f GB/s copy (measured now)\n", peaks.device,
               peaks.matmul_tflops, precision == SG_DTYPE_BF16 ? "bf16" : "fp32", peaks.copy_gbps);
    else
        printf("\nspeed of light: no device peaks on the CPU backend; the work of a step only\n");
    printf("%-16s %-6s %9s %9s %9s %9s %6s", "model", "scope", "ms/step", "TFLOP", "GB", "floor ms", "share");
    for (int k = 0; k < SG_WORK_FAMILIES; k++) printf(" %9.9s", sg_work_family_name((sg_work_family)k));
    printf("\n");
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        sg_sol f;
        bool ok = row_floor(r, &f);
        printf("%-16s %-6s %9.4f", r->model, sg_scope_name(r->scope), r->ms);
        if (!r->ts.work_counted) {
            printf(" %9s (no eager step ran: no work counted)\n", "n/a");
            continue;
        }
        printf(" %9.4g %9.4g", work_sum(r->ts.work.flops) / 1e12, work_sum(r->ts.work.bytes) / 1e9);
        if (!ok) {
            printf(" %9s %6s\n", "n/a", "n/a");
            continue;
        }
        printf(" %9.4f %5.1f%%", f.floor_ms, 100 * f.floor_ms / r->ms);
        for (int k = 0; k < SG_WORK_FAMILIES; k++) printf(" %9.4f", f.family_ms[k]);
        printf("\n");
    }
    printf("TFLOP, GB: a step's products and the other ops' bytes at least. floor: each family's work over\n"
           "the peak that bounds it (matmul rate or copy bandwidth), summed; share: floor / ms. By family:\n"
           "the floor's ms of each.\n");
}

static void json_memory(sg_json *w, const bench_row *r)
{
    const double mib = 1048576.0;
    const sg_trainer_stats *ts = &r->ts;
    sg_cli_kv_str(w, "memory_of", r->host_memory ? "host" : "device");
    json_num(w, "peak_in_use_mib", r->peak_use_mib, 3);
    json_num(w, "eager_peak_mib", r->eager_peak_mib, 3);
    json_num(w, "eager_peak_in_use_mib", r->eager_peak_use_mib, 3);
    json_num(w, "params_mib", ts->param_bytes / mib, 3);
    json_num(w, "grads_mib", ts->grad_bytes / mib, 3);
    json_num(w, "optim_state_mib", ts->optim_bytes / mib, 3);
    json_num(w, "activations_mib", ts->activation_bytes / mib, 3);
    json_num(w, "data_mib", ts->data_bytes / mib, 3);
    json_num(w, "graph_pool_mib", ts->graph_pool.bytes_reserved / mib, 3);
    json_num(w, "graph_pool_peak_in_use_mib", ts->graph_pool.peak_bytes_in_use / mib, 3);
    json_num(w, "allocs_per_100_eager", r->eager_allocs100, 2);
    json_num(w, "allocs_per_100_replay", r->replay_allocs100, 2);
}

/* --json: a row as one line on stdout, every string escaped (sg_json). */
static bool print_json_row(const bench_row *r, bool memory, bool sol, const char *commit)
{
    sg_json *w = sg_cli_json_open("bench");
    if (!w) return false;
    sg_json_object_begin(w);
    sg_cli_kv_str(w, "framework", "stepgraph");
    sg_cli_kv_str(w, "model", r->model);
    sg_cli_kv_str(w, "scope", sg_scope_name(r->scope));
    sg_cli_kv_str(w, "precision", precision == SG_DTYPE_BF16 ? "bf16" : "fp32");
    sg_cli_kv_str(w, "optim_state", optim_state == SG_DTYPE_BF16 ? "bf16" : "f32");
    json_num(w, "ms_per_step", r->ms, 5);
    json_num(w, "host_ms_per_step", r->host_ms, 5);
    json_num(w, "kernels_per_step", r->kernels, 2);
    json_num(w, "gpu_busy_ms_per_step", r->busy_ok ? r->busy_ms : NAN, 5);
    if (r->busy_ok) json_num(w, "kernels_per_step_cupti", r->cupti_kernels, 2);
    sg_cli_kv_int(w, "graphs", r->ts.graphs);
    sg_cli_kv_int(w, "graph_nodes", r->ts.nodes);
    sg_cli_kv_int(w, "steps_per_graph", steps_per_call);
    sg_cli_kv_int(w, "accum", accum);
    sg_cli_kv_int(w, "recompute", model_opts.recompute);
    sg_cli_kv_str(w, "loss_scale", model_opts.loss_scaling == SG_LOSS_SCALING_NONE ? "none" : "dynamic");
    sg_cli_kv_int(w, "loop", forms.loop);
    sg_cli_kv_int(w, "skip_if", forms.skip_if);
    sg_cli_kv_int(w, "vary_seq", forms.vary_seq);
    if (seq_lens_arg) sg_cli_kv_str(w, "seq_lens", seq_lens_arg);
    sg_cli_kv_int(w, "stop_nonfinite", forms.stop_nonfinite);
    json_num(w, "stop_loss", forms.stop_on_loss ? forms.stop_loss : NAN, 6);
    sg_cli_kv_int(w, "overflow_every", overflow_every);
    sg_cli_kv_str(w, "cond_note", r->ts.cond_note);
    json_num(w, "capture_ms", r->ts.capture_ms, 3);
    json_num(w, "instantiate_ms", r->ts.instantiate_ms, 3);
    json_num(w, "graph_exec_mib", r->ts.exec_bytes / 1048576.0, 2);
    sg_json_key(w, "fell_back");
    sg_json_bool(w, r->ts.fell_back);
    json_num(w, "allocs_per_100_steps", r->allocs100, 2);
    json_num(w, "peak_mib", r->peak_mib, 1);
    json_num(w, "loss_first", r->loss0, 4);
    json_num(w, "loss_after_warmup", r->loss1, 4);
    if (!strncmp(r->model, "gpt", 3)) sg_cli_kv_int(w, "vocab", vocab ? vocab : 256);
    if (data_path && strncmp(r->model, "mlp", 3)) sg_cli_kv_str(w, "data", data_path); /* text, or digits */
    if (r->tokens > 0) {
        json_num(w, "tokens_per_step", r->tokens, 1);
        json_num(w, "tokens_per_s", r->ms > 0 ? r->tokens * 1e3 / r->ms : NAN, 1);
    }
    if (memory) json_memory(w, r);
    if (sol) json_sol(w, r);
    sg_cli_kv_str(w, "device", r->device);
    sg_cli_kv_str(w, "commit", commit);
    sg_json_object_end(w);
    return sg_cli_json_close("bench", w);
}

static void print_count(double v)
{
    if (isnan(v)) printf(" %10s", "n/a");
    else printf(" %10.2f", v);
}

/* --memory, table output: one row per model and scope, after the timing table. */
static void print_memory_table(const bench_row *rows, int n)
{
    const double mib = 1048576.0;
    printf("\nmemory in MiB%s\n",
           n && rows[0].host_memory ? " (CPU backend: host memory stands in for device memory)" : "");
    printf("%-16s %-6s %9s %9s %9s %9s %9s %9s %9s %9s %9s %10s %10s\n", "model", "scope", "peak res",
           "peak use", "params", "grads", "optim", "activ", "data", "pool res", "exec", "eager/100", "replay/100");
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        const sg_trainer_stats *ts = &r->ts;
        printf("%-16s %-6s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f", r->model,
               sg_scope_name(r->scope), r->peak_mib, r->peak_use_mib, ts->param_bytes / mib,
               ts->grad_bytes / mib, ts->optim_bytes / mib, ts->activation_bytes / mib, ts->data_bytes / mib,
               ts->graph_pool.bytes_reserved / mib, ts->exec_bytes / mib);
        print_count(r->eager_allocs100);
        print_count(r->replay_allocs100);
        printf("\n");
    }
    printf("peak res/use: the run's peak reserved / in use (summed over pools; eager rows: the eager peak).\n"
           "params, grads, optim, activ, data: the static buffers, allocated when built. pool res: the\n"
           "graphs' pool; exec: the instantiated graphs. eager/100, replay/100: device allocations per 100\n"
           "steps before capture (the warm-up) and under replay (the timed steps).\n");
}

int sg_cmd_bench(int argc, char **argv)
{
    forms = sg_trainer_options_default();
    const char *models = NULL, *scopes = "eager";
    long long nsteps = 100, repeats = 5, warmup = 30;
    sg_backend backend = SG_BACKEND_AUTO;
    bool json = false, memory = false, sol = false, bad = false;
    for (int i = 1; i < argc && !bad;) {
        const char *v = NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(bench_usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = true, i++;
        } else if (!strcmp(argv[i], "--memory")) {
            memory = true, i++;
        } else if (!strcmp(argv[i], "--sol")) {
            sol = true, i++;
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
        } else if (sg_cli_opt(argc, argv, &i, "--optim-state", &v, &bad)) {
            bad = bad || !sg_cli_optim_state("bench", v, &optim_state);
        } else if (sg_cli_opt(argc, argv, &i, "--precision", &v, &bad)) {
            bad = bad || !sg_cli_precision("bench", v, &precision);
        } else if (sg_cli_opt(argc, argv, &i, "--data", &v, &bad)) {
            data_path = v;
        } else if (sg_cli_model_opt("bench", argc, argv, &i, &model_opts, &bad)) {
            /* --classes, --recompute, --loss-scale */
        } else if (sg_cli_accum_opt("bench", argc, argv, &i, &accum, &bad)) {
            /* --accum */
        } else if (sg_cli_cond_opt("bench", argc, argv, &i, &forms, &bad)) {
            /* --loop, --skip-if, --stop-nonfinite, --stop-loss */
        } else if (!strcmp(argv[i], "--vary-seq")) {
            forms.vary_seq = 1, i++;
        } else if (sg_cli_opt(argc, argv, &i, "--seq-lens", &v, &bad)) {
            bad = bad || !sg_cli_buckets("bench", "--seq-lens", v, seq_lens, &forms.n_seq_buckets, 32);
            forms.seq_buckets = seq_lens, seq_lens_arg = v;
        } else if (sg_cli_opt(argc, argv, &i, "--overflow-every", &v, &bad)) {
            bad = bad || !sg_cli_int("bench", "--overflow-every", v, 1, 1000000000, &overflow_every);
        } else if (sg_cli_opt(argc, argv, &i, "--vocab", &v, &bad)) {
            long long n = 0;
            bad = bad || !sg_cli_int("bench", "--vocab", v, 1, INT32_MAX, &n);
            vocab = n;
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
    forms.steps_per_call = steps_per_call, forms.accum = accum;
    if (!bad) bad = !check_forms(models, scopes);
    if (bad) return SG_EXIT_USAGE;
    nsteps = (nsteps + steps_per_call - 1) / steps_per_call * steps_per_call;

    const char *commit = sg_cli_commit();
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
    /* Every model name is checked before anything runs: a typo is a usage error, not a row. */
    {
        char *names = strdup(models), *save = NULL;
        int n = 0;
        for (char *name = strtok_r(names, ",", &save); name && !bad; name = strtok_r(NULL, ",", &save), n++) {
            sg_model_size z;
            sg_model_options mo = {.precision = precision, .data_path = data_path, .vocab = vocab, .classes = model_opts.classes,
                                   .recompute = model_opts.recompute, .loss_scaling = model_opts.loss_scaling};
            if (sg_model_estimate(name, &mo, &z) != SG_OK) {
                fprintf(stderr, "stepgraph bench: --model: %s\n", sg_ctx_last_error(NULL));
                bad = true;
            }
        }
        free(names);
        if (!bad && n == 0) {
            fprintf(stderr, "stepgraph bench: --model '%s': no model names\n", models);
            bad = true;
        }
        if (bad) return SG_EXIT_USAGE;
    }
    if (sol && !measure_peaks(backend)) return SG_EXIT_FAIL;
    char *list = strdup(models), *save = NULL;
    int rc = 0, nrows = 0;
    bench_row *rows = NULL; /* --memory, --sol: kept for the second tables */
    if (!json)
        printf("%-16s %-6s %9s %9s %8s %9s %9s %8s %9s %8s\n", "model", "scope", "ms/step", "host ms",
               "kernels", "busy ms", "capt ms", "nodes", "alloc/100", "peak MiB");
    for (char *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        for (int k = 0; k < nsc; k++) {
            bench_row r;
            if (bench_one(name, sc[k], backend, nsteps, repeats, warmup, &r) != 0) {
                rc = SG_EXIT_FAIL;
                continue;
            }
            if (json) {
                if (!print_json_row(&r, memory, sol, commit)) rc = SG_EXIT_FAIL;
            } else {
                char busy[32];
                if (r.busy_ok) snprintf(busy, sizeof busy, "%.4f", r.busy_ms);
                else snprintf(busy, sizeof busy, "n/a");
                printf("%-16s %-6s %9.4f %9.4f %8.1f %9s %9.2f %8d %9.2f %8.1f\n", r.model,
                       sg_scope_name(r.scope), r.ms, r.host_ms, r.kernels, busy,
                       r.ts.capture_ms + r.ts.instantiate_ms, r.ts.nodes, r.allocs100, r.peak_mib);
                bench_row *grown = memory || sol ? realloc(rows, (size_t)(nrows + 1) * sizeof *rows) : NULL;
                if (grown) rows = grown, rows[nrows++] = r;
            }
            fflush(stdout);
        }
    }
    if (memory && !json) print_memory_table(rows, nrows);
    if (sol && !json) print_sol_table(rows, nrows);
    free(rows);
    free(list);
    return rc;
}
