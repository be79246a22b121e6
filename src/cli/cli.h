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
    "                      backward: less memory, one more forward per step\n"
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
/* --precision: fp32 (or f32) or bf16 (mixed precision). */
bool sg_cli_precision(const char *cmd, const char *s, sg_dtype *out);
/* "8,16,32", the value of option opt -> sorted increasing sizes (at most max of them); false
 * with a message naming opt otherwise. */
bool sg_cli_buckets(const char *cmd, const char *opt, const char *s, int64_t *out, int *n, int max);
/* Rows of step `step` under --vary-batch (or its length under --vary-seq): a fixed
 * pseudo-random sequence in 1..max_rows. */
int64_t sg_cli_vary_rows(int64_t step, int64_t max_rows);
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

int sg_cmd_train(int argc, char **argv);
int sg_cmd_bench(int argc, char **argv);
int sg_cmd_verify(int argc, char **argv);
int sg_cmd_sample(int argc, char **argv);
int sg_cmd_advise(int argc, char **argv);
int sg_cmd_trace(int argc, char **argv);

#endif
