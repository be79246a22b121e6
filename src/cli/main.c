/* main.c: the stepgraph command: dispatches to a subcommand and holds the shared option
 * helpers. `stepgraph --help` lists the subcommands; each takes --help of its own. */
#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *usage =
    "usage: stepgraph <command> [options]\n"
    "\n"
    "Trains neural networks on NVIDIA GPUs (or the CPU reference backend), eagerly or from\n"
    "captured CUDA Graphs, and measures the trade-off.\n"
    "\n"
    "commands:\n"
    "  train    train a model and print loss, ms/step and allocations per step\n"
    "  bench    time training steps under each capture scope: ms/step, host ms, kernels, GPU-busy\n"
    "  verify   check that a captured scope computes what eager computes, step by step\n"
    "  sample   generate text from a GPT checkpoint (train --save)\n"
    "  advise   profile eager steps, predict what each capture scope buys, then measure it\n"
    "  trace    write a Perfetto/Chrome trace of a few steps under a scope\n"
    "\n"
    "Run 'stepgraph <command> --help' for a command's options; 'stepgraph --version' prints\n"
    "the version and the commit it was built from.\n"
    "Models: mlp-WIDTH-DEPTH-BATCH (e.g. mlp-512-6-32), gpt-WIDTH-DEPTH-BATCH-SEQ (e.g.\n"
    "gpt-256-4-8-128: a byte-level transformer trained on a text file), resnet18-BATCH-R,\n"
    "resnet34-BATCH-R and resnet50-BATCH-R (torchvision's ResNets on R x R synthetic images,\n"
    "or on scikit-learn's 8 x 8 digits scaled up: --data) and efficientnet_b0-BATCH-R\n"
    "(torchvision's EfficientNet-B0 on the same images).\n"
    "Backend: CUDA when a GPU is usable, else the CPU reference (--backend to choose).\n"
    "Environment (every command): STEPGRAPH_TF32=1 runs fp32 models' matmuls, and the GPT's\n"
    "attention, on the tensor cores in TF32, as PyTorch's allow_tf32 (CUDA; true fp32\n"
    "otherwise). STEPGRAPH_GEMM_TUNE=1 times cuBLASLt's candidate algorithms for each matmul\n"
    "shape on its first call and keeps the fastest, as PyTorch's cudnn.benchmark (CUDA; two\n"
    "runs may then differ in the last bits).\n"
    "docs/performance.md lists the measurement switches (STEPGRAPH_WGRAD, STEPGRAPH_ATTENTION, ...).\n"
    "\n"
    "exit status: 0 done, 1 a runtime error, 2 a usage error (each command's --help says more)\n";

/* The version: CMake's project VERSION, passed as SG_VERSION; until the build passes it, the
 * same number here (tests/cli_help_test.sh compares it with CMake's). */
#ifndef SG_VERSION
#define SG_VERSION "0.1.0"
#endif
#ifndef SG_GIT_COMMIT
#define SG_GIT_COMMIT "unknown"
#endif

sg_json *sg_cli_json_open(const char *cmd)
{
    sg_json *w = NULL;
    if (sg_json_create_file(stdout, SG_JSON_SPACED, &w) != SG_OK) {
        fprintf(stderr, "stepgraph %s: out of host memory writing JSON\n", cmd);
        return NULL;
    }
    return w;
}

bool sg_cli_json_close(const char *cmd, sg_json *w)
{
    sg_status st = sg_json_finish(w);
    if (st != SG_OK) fprintf(stderr, "stepgraph %s: writing JSON: %s\n", cmd, sg_json_error(w));
    sg_json_destroy(w);
    putchar('\n');
    return st == SG_OK;
}

const char *sg_cli_commit(void)
{
    const char *c = getenv("SG_COMMIT");
    return c && *c ? c : SG_GIT_COMMIT;
}

double sg_cli_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double sg_cli_median(double *v, long long n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bool sg_cli_opt(int argc, char **argv, int *i, const char *name, const char **value, bool *bad)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return false;
    if (a[n] == '=') {
        *value = a + n + 1;
        (*i)++;
        return true;
    }
    if (a[n] != '\0') return false;
    if (*i + 1 >= argc) {
        fprintf(stderr, "stepgraph: option %s needs a value\n", name);
        *bad = true;
        (*i)++;
        return true;
    }
    *value = argv[*i + 1];
    *i += 2;
    return true;
}

bool sg_cli_int(const char *cmd, const char *opt, const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "stepgraph %s: %s '%s' is not a whole number from %lld to %lld\n", cmd, opt, s, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool sg_cli_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "stepgraph %s: %s '%s' is not a number from %g to %g\n", cmd, opt, s, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool sg_cli_backend(const char *cmd, const char *s, sg_backend *out)
{
    if (!strcmp(s, "cpu")) *out = SG_BACKEND_CPU;
    else if (!strcmp(s, "cuda")) *out = SG_BACKEND_CUDA;
    else if (!strcmp(s, "auto")) *out = SG_BACKEND_AUTO;
    else {
        fprintf(stderr, "stepgraph %s: --backend '%s': expected cpu, cuda or auto\n", cmd, s);
        return false;
    }
    return true;
}

bool sg_cli_model_opt(const char *cmd, int argc, char **argv, int *i, sg_model_options *mo, bool *bad)
{
    const char *v = NULL;
    if (!strcmp(argv[*i], "--recompute")) {
        mo->recompute = 1, (*i)++;
        return true;
    }
    if (sg_cli_opt(argc, argv, i, "--loss-scale", &v, bad)) {
        if (!strcmp(v, "dynamic")) mo->loss_scaling = SG_LOSS_SCALING_DYNAMIC;
        else if (!strcmp(v, "none")) mo->loss_scaling = SG_LOSS_SCALING_NONE;
        else {
            fprintf(stderr, "stepgraph %s: --loss-scale '%s': expected dynamic or none\n", cmd, v);
            *bad = true;
        }
        return true;
    }
    if (!sg_cli_opt(argc, argv, i, "--classes", &v, bad)) return false;
    long long n = 0;
    *bad = *bad || !sg_cli_int(cmd, "--classes", v, 1, 1 << 20, &n);
    mo->classes = n;
    return true;
}

bool sg_cli_accum_opt(const char *cmd, int argc, char **argv, int *i, int *accum, bool *bad)
{
    const char *v = NULL;
    if (!sg_cli_opt(argc, argv, i, "--accum", &v, bad)) return false;
    long long k = 1;
    *bad = *bad || !sg_cli_int(cmd, "--accum", v, 1, 1024, &k);
    *accum = (int)k;
    return true;
}

/* A flag of sg_cli_cond_opt: "--name" sets *flag; "--name=..." is a usage error. */
static bool cond_flag(const char *cmd, const char *a, const char *name, int *flag, bool *bad)
{
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0 || (a[n] != '\0' && a[n] != '=')) return false;
    if (a[n] == '=') {
        fprintf(stderr, "stepgraph %s: %s takes no value ('%s')\n", cmd, name, a);
        *bad = true;
    }
    *flag = 1;
    return true;
}

bool sg_cli_cond_opt(const char *cmd, int argc, char **argv, int *i, sg_trainer_options *tr, bool *bad)
{
    const char *v = NULL;
    if (cond_flag(cmd, argv[*i], "--loop", &tr->loop, bad) ||
        cond_flag(cmd, argv[*i], "--skip-if", &tr->skip_if, bad)) {
        (*i)++;
        return true;
    }
    if (sg_cli_opt(argc, argv, i, "--stop-nonfinite", &v, bad)) {
        long long n = 0;
        *bad = *bad || !sg_cli_int(cmd, "--stop-nonfinite", v, 1, 1 << 30, &n);
        tr->stop_nonfinite = (int)n;
        return true;
    }
    if (sg_cli_opt(argc, argv, i, "--stop-loss", &v, bad)) {
        double x = 0;
        *bad = *bad || !sg_cli_float(cmd, "--stop-loss", v, -1e30, 1e30, &x);
        tr->stop_on_loss = 1, tr->stop_loss = (float)x;
        return true;
    }
    return false;
}

bool sg_cli_cond_check(const char *cmd, const sg_trainer_options *tr, sg_dtype precision, bool one_scope)
{
    int K = tr->steps_per_call > 1 ? tr->steps_per_call : 1;
    const char *err = NULL;
    if (tr->skip_if && precision != SG_DTYPE_BF16)
        err = "--skip-if is for --precision bf16: an fp32 step skips nothing (no loss scaler)";
    else if (tr->loop && tr->accum < 3 && K < 2)
        err = "--loop: nothing repeats in the step graph: it loops over --accum micro-batches (3 or more) or "
              "--steps-per-graph steps (2 or more)";
    else if (one_scope && (tr->loop || tr->skip_if) && tr->scope != SG_SCOPE_STEP)
        err = tr->loop ? "--loop is for --scope step (it shapes the step graph)"
                       : "--skip-if is for --scope step (it shapes the step graph)";
    if (err) fprintf(stderr, "stepgraph %s: %s\n", cmd, err);
    return err == NULL;
}

/* fp32 (or f32) or bf16 into *out; false after printing why, naming opt and the preferred
 * spelling of f32 (`f32name`). */
static bool f32_or_bf16(const char *cmd, const char *opt, const char *f32name, const char *s, sg_dtype *out)
{
    if (!strcmp(s, "fp32") || !strcmp(s, "f32")) *out = SG_DTYPE_F32;
    else if (!strcmp(s, "bf16")) *out = SG_DTYPE_BF16;
    else {
        fprintf(stderr, "stepgraph %s: %s '%s': expected %s or bf16\n", cmd, opt, s, f32name);
        return false;
    }
    return true;
}

bool sg_cli_precision(const char *cmd, const char *s, sg_dtype *out)
{
    return f32_or_bf16(cmd, "--precision", "fp32", s, out);
}

bool sg_cli_optim_state(const char *cmd, const char *s, sg_dtype *out)
{
    return f32_or_bf16(cmd, "--optim-state", "f32", s, out);
}

bool sg_cli_buckets(const char *cmd, const char *opt, const char *s, int64_t *out, int *n, int max)
{
    char buf[256], *save = NULL;
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long long v;
        if (*n == max) {
            fprintf(stderr, "stepgraph %s: %s '%s': more than %d sizes\n", cmd, opt, s, max);
            return false;
        }
        if (!sg_cli_int(cmd, opt, tok, 1, 1 << 20, &v)) return false;
        if (*n && v <= out[*n - 1]) {
            fprintf(stderr, "stepgraph %s: %s '%s': expected increasing sizes\n", cmd, opt, s);
            return false;
        }
        out[(*n)++] = v;
    }
    if (!*n) fprintf(stderr, "stepgraph %s: %s '%s': no sizes\n", cmd, opt, s);
    return *n > 0;
}

sg_ctx *sg_cli_ctx(const char *cmd, sg_backend b, bool quiet)
{
    sg_ctx_options o = sg_ctx_options_default();
    o.backend = b;
    sg_ctx *ctx;
    if (sg_ctx_create(&o, &ctx) != SG_OK) {
        fprintf(stderr, "stepgraph %s: %s\n", cmd, sg_ctx_last_error(NULL));
        return NULL;
    }
    if (!quiet && b == SG_BACKEND_AUTO && sg_ctx_backend(ctx) == SG_BACKEND_CPU)
        fprintf(stderr, "stepgraph %s: no usable GPU%s: running on the CPU reference backend\n", cmd,
#ifdef SG_HAVE_CUDA
                ""
#else
                " (this build has no CUDA)"
#endif
        );
    return ctx;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return SG_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(usage, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        if (argc > 2) {
            fprintf(stderr, "stepgraph %s: takes no arguments ('%s' given)\n", cmd, argv[2]);
            return SG_EXIT_USAGE;
        }
        printf("stepgraph %s (commit %s)\n", SG_VERSION, sg_cli_commit());
        return 0;
    }
    if (!strcmp(cmd, "train")) return sg_cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return sg_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "verify")) return sg_cmd_verify(argc - 1, argv + 1);
    if (!strcmp(cmd, "sample")) return sg_cmd_sample(argc - 1, argv + 1);
    if (!strcmp(cmd, "advise")) return sg_cmd_advise(argc - 1, argv + 1);
    if (!strcmp(cmd, "trace")) return sg_cmd_trace(argc - 1, argv + 1);
    fprintf(stderr, "stepgraph: unknown command '%s'\n\n%s", cmd, usage);
    return SG_EXIT_USAGE;
}
