/* cli.h: what the stepgraph subcommands share: strict option parsing (every value checked,
 * unknown flags rejected with a pointer to --help), a monotonic clock and the context. The
 * commands use the public header only (JSON output goes through its sg_json writer). */
#ifndef SG_CLI_H
#define SG_CLI_H

#include "stepgraph.h"

#include <stdbool.h>

/* Exit codes: 0 ok, 1 runtime failure, 2 usage error. */
#define SG_EXIT_FAIL 1
#define SG_EXIT_USAGE 2

double sg_cli_now_ms(void);
/* The median of v[0..n-1] (n >= 1; sorts v): the middle value, or the mean of the two middle
 * ones. */
double sg_cli_median(double *v, long long n);
/* Parses "--name value" or "--name=value" at argv[*i]; advances *i past it. Returns true and
 * sets *value when argv[*i] is that option; prints a usage error and sets *bad if the value is
 * missing. */
bool sg_cli_opt(int argc, char **argv, int *i, const char *name, const char **value, bool *bad);
bool sg_cli_int(const char *cmd, const char *opt, const char *s, long long lo, long long hi, long long *out);
bool sg_cli_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
bool sg_cli_backend(const char *cmd, const char *s, sg_backend *out);
/* The model options every model-building command takes alike: --classes N and --recompute
 * (into mo), and their help lines. Returns true when argv[*i] is one of them (advanced past
 * it; a bad value prints a usage error and sets *bad). */
bool sg_cli_model_opt(const char *cmd, int argc, char **argv, int *i, sg_model_options *mo, bool *bad);
#define SG_CLI_MODEL_OPTS_HELP                                                                   \
    "  --classes N         resnet, efficientnet: classes of the head and the labels (default\n"  \
    "                      1000; 10 with a digits file as --data, which refuses fewer)\n"        \
    "  --recompute         drop each GPT block's, ResNet stage's or EfficientNet stage's\n"      \
    "                      activations after the forward and compute them again in the\n"        \
    "                      backward: less memory, one more forward per step\n"                   \
    "  --loss-scale S      bf16: dynamic (default: the loss scaled on the device, the gradients\n"  \
    "                      checked, a step with non-finite ones skipped) or none (no scale and\n" \
    "                      no check, as PyTorch's bf16 autocast without a GradScaler)\n"
/* --accum K, the trainer option every training command takes alike (train, verify, bench,
 * advise, trace): K micro-batches per optimizer step (sg_trainer_options.accum), 1 to 1024.
 * Returns true when argv[*i] is it (advanced past it; a bad value prints a usage error and
 * sets *bad). */
bool sg_cli_accum_opt(const char *cmd, int argc, char **argv, int *i, int *accum, bool *bad);
#define SG_CLI_ACCUM_HELP                                                                        \
    "  --accum K           gradient accumulation: each optimizer step trains on K micro-batches\n" \
    "                      (consecutive batches of the model's batch size), their gradients\n"     \
    "                      summed in f32 before one update: the step of a K x larger batch.\n"    \
    "                      Steps and step times are optimizer steps; a step's loss is the\n"      \
    "                      mean over its micro-batches (default 1; 1 to 1024)\n"
/* The control-flow options every training command takes alike (train, verify, bench, advise,
 * trace), into tr: --loop, --skip-if (flags: a value is a usage error), --stop-nonfinite N
 * (1 to 2^30) and --stop-loss X (finite). Returns true when argv[*i] is one of them (advanced
 * past it; a bad value prints a usage error and sets *bad). */
bool sg_cli_cond_opt(const char *cmd, int argc, char **argv, int *i, sg_trainer_options *tr, bool *bad);
/* Them against the rest of the run, after parsing: --skip-if needs bf16; --loop something to
 * repeat (tr->accum >= 3 or tr->steps_per_call >= 2); with one_scope (a command that runs one
 * scope: train, verify, trace) both need tr->scope step. false with a message. */
bool sg_cli_cond_check(const char *cmd, const sg_trainer_options *tr, sg_dtype precision, bool one_scope);
#define SG_CLI_COND_HELP                                                                         \
    "  --loop              step scope: repeated work as a WHILE node on the device instead of\n" \
    "                      unrolled copies in the graph: the --accum micro-batches (3 or more;\n" \
    "                      the first and last stay unrolled) and the --steps-per-graph steps\n"   \
    "  --skip-if           bf16, step scope: the optimizer update inside an IF node that runs it\n" \
    "                      only when the step's gradients are finite, instead of update kernels\n" \
    "                      that launch and return on the skip flag\n"                            \
    "  --stop-nonfinite N  stop when the loss was not finite N steps in a row (1 to 2^30)\n"      \
    "  --stop-loss X       stop when a step's loss is <= X (a finite number). Under step scope\n" \
    "                      the rule runs on the device after each step, the --steps-per-graph\n" \
    "                      steps of a launch a WHILE node that ends early; other scopes read its\n" \
    "                      flag after each step (a host sync a step). Each form computes what\n" \
    "                      the eager step computes; where the GPU cannot make conditional nodes\n" \
    "                      the graph is built without them, and the run says so\n"
/* --precision: fp32 (or f32) or bf16 (mixed precision). */
bool sg_cli_precision(const char *cmd, const char *s, sg_dtype *out);
/* --optim-state: f32 (or fp32) or bf16 (sg_optim_set_state_dtype); false after printing why. */
bool sg_cli_optim_state(const char *cmd, const char *s, sg_dtype *out);
/* "8,16,32", the value of option opt -> sorted increasing sizes (at most max of them); false
 * with a message naming opt otherwise. */
bool sg_cli_buckets(const char *cmd, const char *opt, const char *s, int64_t *out, int *n, int max);
/* The commit the binary was built from (SG_GIT_COMMIT); the environment's SG_COMMIT overrides
 * it (a copy of the tree without .git). */
const char *sg_cli_commit(void);
/* Creates a context, saying on stderr which backend runs and why. NULL on failure (printed). */
sg_ctx *sg_cli_ctx(const char *cmd, sg_backend b, bool quiet);

/* A key and its value, for the commands' --json output. */
static inline void sg_cli_kv_str(sg_json *w, const char *key, const char *v)
{
    sg_json_key(w, key);
    sg_json_string(w, v);
}
static inline void sg_cli_kv_int(sg_json *w, const char *key, int64_t v)
{
    sg_json_key(w, key);
    sg_json_int(w, v);
}

/* One --json object on stdout: a writer (NULL after saying on stderr that memory ran out), and
 * its end: the object finished, a newline, the writer destroyed; false (said on stderr, naming
 * cmd) when writing failed. */
sg_json *sg_cli_json_open(const char *cmd);
bool sg_cli_json_close(const char *cmd, sg_json *w);

/* ---- data parallelism: what train and trace share (dist.c) ---- *
 *
 * With --gpus N the command's process is the launcher: sg_cli_dist_launch starts it again once
 * per GPU; each copy finds its place with sg_cli_dist_env, makes its context with
 * sg_cli_dist_ctx, joins with sg_cli_dist_join, runs the same steps as every other rank (they
 * all run the same collectives), and destroys the sg_dist after its trainer. */

/* A command's data-parallel options: --gpus N (0: one process), the hosts of the run
 * (--nnodes, --node-rank, --master: train's), --bucket-mib and --dist-timeout. */
typedef struct sg_cli_dist {
    long long gpus, nnodes, node_rank;
    const char *master;
    double bucket_mib, timeout_s;
    bool shard_optimizer;       /* --shard-optimizer */
    bool opts;                  /* an option besides --gpus was given: it needs --gpus */
} sg_cli_dist;

/* One process; when --gpus asks for a run: one host, buckets of 4 MiB, 300 s timeout. */
sg_cli_dist sg_cli_dist_default(void);
/* --gpus N (1 to 64) and --bucket-mib X (1/1024 to 4096) into d. Returns true when argv[*i] is
 * one of them (advanced past it; a bad value prints a usage error and sets *bad). */
bool sg_cli_dist_opt(const char *cmd, int argc, char **argv, int *i, sg_cli_dist *d, bool *bad);
/* After the command's own checks, what --gpus does not combine with (nothing without it): batch
 * or sequence buckets, an early-stop rule, several hosts on the CPU backend (b), an mlp or gpt
 * model whose global batch does not split into one equal part per rank. false with a message. */
bool sg_cli_dist_check(const char *cmd, const sg_cli_dist *d, sg_backend b, const sg_trainer_options *tr,
                       const char *model);
/* *worker = 1 and env filled in a rank that a launcher started (SG_DIST_* set), 0 otherwise;
 * false (printed) when those variables are malformed. */
bool sg_cli_dist_env(const char *cmd, sg_dist_env *env, int *worker);
/* The launcher: starts this program once per rank with the command's arguments (argv[0]: the
 * command's name) and --backend b made explicit (auto: CUDA if a GPU is usable, else the CPU),
 * waits for them all, and says which failed. Returns the exit status: 0, 1, or 130 / 143 when
 * SIGINT / SIGTERM stopped the run. */
int sg_cli_dist_launch(const char *cmd, int argc, char **argv, sg_backend b, const sg_cli_dist *d);
/* A worker's context on its GPU (its local rank); a rank other than 0 sends its stdout to
 * /dev/null (rank 0 reports; errors still go to stderr). NULL on failure (printed). */
sg_ctx *sg_cli_dist_ctx(const char *cmd, sg_backend b, const sg_dist_env *env);
/* " [rank r of n]" once sg_cli_dist_ctx ran, for a worker's messages; "" otherwise. */
const char *sg_cli_dist_tag(void);
/* Joins the run (sg_dist_create, waiting for every rank) and sets the worker's model and
 * trainer up for it: mo's shard, tr->dist, tr->warmup at least SG_DIST_MIN_WARMUP under a
 * capture scope (NCCL connects during the eager steps). The error: sg_ctx_last_error(ctx). */
sg_status sg_cli_dist_join(sg_ctx *ctx, const sg_dist_env *env, const sg_cli_dist *d, sg_model_options *mo,
                           sg_trainer_options *tr, sg_dist **out);
/* "data parallel: ..." on stdout: ranks, all-reduces a step and their MiB (nothing when dist
 * is NULL). */
void sg_cli_dist_print(const sg_dist *dist, double bucket_mib);

int sg_cmd_train(int argc, char **argv);
int sg_cmd_bench(int argc, char **argv);
int sg_cmd_verify(int argc, char **argv);
int sg_cmd_sample(int argc, char **argv);
int sg_cmd_advise(int argc, char **argv);
int sg_cmd_trace(int argc, char **argv);

#endif
