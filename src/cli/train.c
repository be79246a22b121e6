/* train.c: `stepgraph train`: trains a model under a capture scope. The loss is read back
 * asynchronously (a pinned copy and an event, polled at the next log point), so logging never
 * stalls the GPU. SIGINT and SIGTERM finish the step in flight, write the checkpoint asked for
 * and exit 130 or 143; a second signal exits at once. With --gpus N it is the launcher: it
 * starts N copies of itself as the ranks of a data-parallel run (sg_dist_launch), and each
 * copy, finding SG_DIST_RANK in its environment, trains its shard of every batch; rank 0
 * reports. */
#define _POSIX_C_SOURCE 200809L

#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *train_usage =
    "usage: stepgraph train --model NAME [options]\n"
    "\n"
    "Trains NAME under a capture scope (eager by default; --scope layer, model or step replays\n"
    "CUDA Graphs) and prints the loss every K steps, then ms/step, device allocations per step\n"
    "and what was captured. mlp models learn labels of a fixed random teacher network; gpt\n"
    "models learn the bytes of a text file; image models synthetic images, or the digits of\n"
    "--data. Ctrl-C (SIGINT) or SIGTERM finishes the step in flight, writes the --save\n"
    "checkpoint and exits 130 or 143; a second signal exits at once.\n"
    "\n"
    "options:\n"
    "  --model NAME        mlp-WIDTH-DEPTH-BATCH (e.g. mlp-512-6-32) or\n"
    "                      gpt-WIDTH-DEPTH-BATCH-SEQ (e.g. gpt-256-4-8-128) or\n"
    "                      resnet18|34|50-BATCH-R (R x R images, e.g. resnet18-32-32) or\n"
    "                      efficientnet_b0-BATCH-R (e.g. efficientnet_b0-32-224) (required)\n"
    "  --data PATH         gpt: text to train on, bytes as tokens: a regular file (not a\n"
    "                      pipe or device), whose size is checked against free memory before\n"
    "                      it is read (default: a licence text under /usr/share/common-licenses);\n"
    "                      with --vocab, a token file (docs/data.md).\n"
    "                      resnet, efficientnet: a digits file (scikit-learn's 8 x 8\n"
    "                      digits.csv, scripts/fetch-digits.sh DIR) instead of synthetic\n"
    "                      images: scaled up to R x R, the last fifth held out, the held-out\n"
    "                      loss printed before and after training\n"
    "  --val-data PATH     gpt: a separate validation file, read as --data is (default: the\n"
    "                      last 10% of --data is held out)\n"
    "  --vocab N           gpt: --data and --val-data are token files, tokens below N: nanoGPT's\n"
    "                      raw uint16 train.bin / val.bin, or llm.c shards (a 1024-byte header,\n"
    "                      magic 20240520, version 1 uint16 or 2 uint32 tokens), told apart by\n"
    "                      the magic; the embedding and head get N rows (e.g. 50304 for GPT-2's\n"
    "                      50257 tokens). Every token is checked before training (default:\n"
    "                      bytes, vocabulary 256)\n"
    "  --dropout P         gpt: dropout probability (default 0)\n"
    "  --clip X            clip gradients to global norm X inside the step (default off)\n"
    SG_CLI_MODEL_OPTS_HELP
    "  --precision P       fp32 (default) or bf16 (gpt, resnet, efficientnet): bf16 activations,\n"
    "                      matmuls, convolutions and gradients, fp32 master weights,\n"
    "                      optimizer state and batch-norm statistics, dynamic loss scaling on\n"
    "                      the device (a step with non-finite gradients is skipped; see\n"
    "                      --loss-scale)\n"
    "  --save PATH         write a checkpoint (safetensors) at the end, and when interrupted:\n"
    "                      parameters, optimizer state, step, dropout generator. Written to a\n"
    "                      temporary file and renamed; the target is checked before training\n"
    "                      (its directory writable, itself absent or a regular file); a\n"
    "                      symlink is followed and the file it names replaced, the link kept\n"
    "  --save-every N      also write --save every N steps (a multiple of --steps-per-graph)\n"
    "  --metrics FILE      one JSON line per logged step: step, loss, lr, loss_scale,\n"
    "                      ms_per_step, samples_per_s (mlp, images) or tokens_per_s (gpt),\n"
    "                      val_loss\n"
    "                      where measured; the first line describes the run (bench/plot.py\n"
    "                      loss draws it)\n"
    "  --resume PATH       continue from a checkpoint: the same loss curve as an uninterrupted\n"
    "                      run (--steps counts the steps of this run)\n"
    "  --steps N           training steps (optimizer steps; default 200)\n"
    "  --backend B         cpu, cuda or auto (default auto: CUDA if a GPU is usable)\n"
    "  --optim O           adamw or sgd (default adamw)\n"
    "  --optim-state D     f32 or bf16: the dtype of the optimizer's state (AdamW's moments,\n"
    "                      SGD's momentum), bf16 rounded stochastically: half its memory and\n"
    "                      8 bytes a parameter less for an AdamW step to move (default f32).\n"
    "                      --resume needs the saving run's\n"
    "  --lr X              learning rate (default 1e-3 for adamw, 1e-2 for sgd)\n"
    "  --wd X              weight decay on weights, not biases (default 0)\n"
    "  --seed S            seed of the initial parameters and the data (default 1)\n"
    "  --log-every K       print the loss every K steps (default 20)\n"
    "  --scope S           eager, layer, model or step: what is captured into CUDA Graphs\n"
    "                      (default eager; on the CPU backend graphs are recorded plans)\n"
    "  --graph-modules L   layer scope: comma-separated module names or indices (default all)\n"
    "  --warmup N          eager steps before capture (default 3)\n"
    "  --on-capture-fail P error (default) or eager: run a region that cannot be captured\n"
    "                      eagerly, and say why\n"
    "  --batch-sizes L     batch buckets, e.g. 8,16,32 (at most the model's batch); a step of n\n"
    "                      rows runs padded to its bucket, the padding masked out of the loss;\n"
    "                      step scope keeps one graph per bucket (eager and step scopes only)\n"
    "  --vary-batch        draw each step's rows from 1..largest bucket (needs --batch-sizes),\n"
    "                      as --vary-seq does lengths: one SWITCH graph under step scope, and\n"
    "                      --steps-per-graph K runs K steps of different rows a launch\n"
    "  --seq-lens L        gpt: sequence-length buckets, e.g. 32,64,128 (at most the model's\n"
    "                      SEQ); a step of n tokens a row runs padded to its bucket, the padding\n"
    "                      masked out of the loss; step scope keeps one graph per length (eager\n"
    "                      and step scopes only)\n"
    "  --vary-seq          draw each step's length from 1..largest bucket (needs --seq-lens):\n"
    "                      the trainer draws it (sg_vary_len); under step scope the device does,\n"
    "                      and one graph holds every bucket as a branch of a SWITCH node, so\n"
    "                      --steps-per-graph K runs K steps of different lengths a launch\n"
    "  --cache-budget MIB  step scope with buckets (batch or length): evict least-recently-used\n"
    "                      graphs above it\n"
    "  --steps-per-graph K step scope: one graph holds K consecutive steps, so one launch runs\n"
    "                      K steps (default 1; K must divide --steps); the loss is read every\n"
    "                      K steps at most. Not with --batch-sizes or --seq-lens without\n"
    "                      --vary-batch or --vary-seq (a padded step of a given size is one\n"
    "                      launch)\n"
    SG_CLI_COND_HELP
    "                      With a stop rule train reads the trainer's stop flag after every\n"
    "                      launch (a host sync a launch); a stopped run prints why, writes\n"
    "                      --save at the step it reached and exits 0. Not with --gpus\n"
    SG_CLI_ACCUM_HELP
    "                      Not with --batch-sizes or --seq-lens. A checkpoint records K;\n"
    "                      --resume with another K' resumes at the step of K' batches that\n"
    "                      starts at its next batch (refused when there is none)\n"
    "  --gpus N            data parallelism: N processes on this host, one per GPU, each\n"
    "                      training on 1/N of every batch (the model's batch is the global\n"
    "                      batch), gradients averaged over NCCL inside the step; rank 0\n"
    "                      reports. On the CPU backend the ranks are CPU processes joined by\n"
    "                      local sockets (the reference). Not with --batch-sizes or --seq-lens\n"
    "  --nnodes K          hosts in the run (default 1); each runs the same command with its\n"
    "  --node-rank R         own --node-rank (0..K-1) and --gpus; node 0 listens on --master\n"
    "  --master ADDR:PORT    and sends the others the run's id\n"
    "  --bucket-mib X      gradient MiB an all-reduce bucket gathers (default 4; the model's\n"
    "                      first two layers, whose backwards run last, send theirs whatever\n"
    "                      the size, so the last bucket is small)\n"
    "  --dist-timeout S    the longest wait for other ranks or hosts before failing (default 300)\n"
    "  --shard-optimizer   with --gpus: each rank keeps the optimizer state and f32 weights of\n"
    "                      1/N of the model and updates them (ZeRO stage 1): the gradients\n"
    "                      reduce-scattered instead of all-reduced, the updated weights\n"
    "                      all-gathered (with --accum the step's f32 sums reduce-scattered).\n"
    "                      Checkpoints hold the whole state. With --clip the global norm is\n"
    "                      summed over the ranks' shares\n"
    "  --quiet             no per-step lines; the summary only\n"
    "  -h, --help          this text\n"
    "\n"
    "\n"
    "A loss that turns inf or NaN in fp32 stops the run with an error and saves nothing (bf16\n"
    "skips such steps by loss scaling); with --stop-nonfinite N the rule decides instead (the\n"
    "parameters are then not finite: --save refuses them). Logs are written line by line,\n"
    "also to a file.\n"
    "Under --gpus a signal stops every rank at once: the last --save-every checkpoint stays.\n"
    "STEPGRAPH_DISABLE_GRAPHS=1 forces eager execution under every scope. STEPGRAPH_TF32=1 runs\n"
    "fp32 matmuls in TF32 on the tensor cores (CUDA; about 3.3x faster on gpt-768-12-8-256).\n"
    "STEPGRAPH_GEMM_TUNE=1 times each matmul shape's candidate algorithms on its first call and\n"
    "keeps the fastest (CUDA; about 1% on gpt-768-12-8-256 bf16; runs may differ in the last bits).\n"
    "\n"
    "exit status: 0 trained (or stopped early by a stop rule), 1 a runtime error (the loss not\n"
    "finite included), 2 a usage error,\n"
    "130 or 143 interrupted by SIGINT or SIGTERM (the checkpoint written)\n";

typedef struct train_opts {
    const char *model;
    long long steps, seed, log_every;
    sg_backend backend;
    sg_optim_kind optim;
    sg_dtype optim_state;
    double lr, wd;
    bool lr_set, quiet;
    sg_trainer_options tr;
    int64_t buckets[32], seq_lens[32];
    bool vary, vary_seq;
    sg_model_options mo;
    const char *save, *resume, *metrics;
    long long save_every;
    sg_cli_dist dp;             /* data parallelism: --gpus, the hosts, --bucket-mib, --dist-timeout */
} train_opts;

/* "HOST:PORT" with a port from 1 to 65535 (the library checks it again, and resolves it). */
static bool addr_ok(const char *a)
{
    const char *c = strrchr(a, ':');
    char *end;
    long p = c ? strtol(c + 1, &end, 10) : 0;
    return c && c != a && c[1] && !*end && p >= 1 && p <= 65535;
}

/* The data-parallel options, together: usage errors before any process starts. */
static bool check_dist(const train_opts *o)
{
    const sg_cli_dist *d = &o->dp;
    const char *err = NULL;
    char buf[256];
    if (d->opts && !d->gpus) err = "--nnodes, --node-rank, --master, --bucket-mib, --dist-timeout and "
                                   "--shard-optimizer are for data-parallel runs: add --gpus N";
    else if (d->nnodes > 1 && !d->master) err = "--nnodes > 1 needs --master ADDR:PORT (node 0's address)";
    else if (d->nnodes == 1 && (d->master || d->node_rank)) err = "--master and --node-rank are for runs on several "
                                                                  "hosts (--nnodes K > 1)";
    else if (d->master && !addr_ok(d->master))
        snprintf(buf, sizeof buf, "--master '%s': expected ADDR:PORT with a port from 1 to 65535", d->master), err = buf;
    else if (d->node_rank >= d->nnodes)
        snprintf(buf, sizeof buf, "--node-rank %lld: expected 0 to %lld (--nnodes %lld)", d->node_rank, d->nnodes - 1,
                 d->nnodes), err = buf;
    if (err) {
        fprintf(stderr, "stepgraph train: %s\n", err);
        return false;
    }
    return sg_cli_dist_check("train", d, o->backend, &o->tr, o->model);
}

/* The model name, --steps-per-graph and --save-every, together: usage errors before any
 * context or process starts. */
static bool check_steps(const train_opts *o)
{
    long long K = o->tr.steps_per_call > 0 ? o->tr.steps_per_call : 1;
    sg_model_size z;
    if (sg_model_estimate(o->model, &o->mo, &z) != SG_OK) {
        fprintf(stderr, "stepgraph train: --model: %s\n", sg_ctx_last_error(NULL));
        return false;
    }
    if (K > 1 && o->tr.scope != SG_SCOPE_STEP) {
        fprintf(stderr, "stepgraph train: --steps-per-graph %lld is for --scope step (one graph holds K steps); "
                "scope %s launches each step\n", K, sg_scope_name(o->tr.scope));
        return false;
    }
    if (o->steps % K) {
        fprintf(stderr, "stepgraph train: --steps %lld is not a multiple of --steps-per-graph %lld: a launch runs "
                "%lld steps; give --steps %lld or %lld\n", o->steps, K, K, o->steps / K * K > 0 ? o->steps / K * K : K,
                (o->steps / K + 1) * K);
        return false;
    }
    if (o->save_every && !o->save) {
        fprintf(stderr, "stepgraph train: --save-every needs --save PATH\n");
        return false;
    }
    if (o->save_every % K) {
        fprintf(stderr, "stepgraph train: --save-every %lld is not a multiple of --steps-per-graph %lld: "
                "checkpoints are written between launches\n", o->save_every, K);
        return false;
    }
    return true;
}

static int parse(int argc, char **argv, train_opts *o)
{
    *o = (train_opts){.steps = 200, .seed = 1, .log_every = 20, .backend = SG_BACKEND_AUTO,
                      .tr = sg_trainer_options_default(), .dp = sg_cli_dist_default()};
    bool bad = false;
    for (int i = 1; i < argc && !bad;) {
        const char *v = NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(train_usage, stdout);
            exit(0);
        } else if (!strcmp(argv[i], "--quiet")) {
            o->quiet = true, i++;
        } else if (!strcmp(argv[i], "--vary-batch")) {
            o->vary = true, i++;
        } else if (!strcmp(argv[i], "--vary-seq")) {
            o->vary_seq = true, i++;
        } else if (sg_cli_opt(argc, argv, &i, "--batch-sizes", &v, &bad)) {
            bad = bad || !sg_cli_buckets("train", "--batch-sizes", v, o->buckets, &o->tr.n_buckets, 32);
            o->tr.batch_buckets = o->buckets;
        } else if (sg_cli_opt(argc, argv, &i, "--seq-lens", &v, &bad)) {
            bad = bad || !sg_cli_buckets("train", "--seq-lens", v, o->seq_lens, &o->tr.n_seq_buckets, 32);
            o->tr.seq_buckets = o->seq_lens;
        } else if (sg_cli_dist_opt("train", argc, argv, &i, &o->dp, &bad)) {
            /* --gpus, --bucket-mib */
        } else if (sg_cli_opt(argc, argv, &i, "--nnodes", &v, &bad)) {
            bad = bad || !sg_cli_int("train", "--nnodes", v, 1, 64, &o->dp.nnodes);
            o->dp.opts = true;
        } else if (sg_cli_opt(argc, argv, &i, "--node-rank", &v, &bad)) {
            bad = bad || !sg_cli_int("train", "--node-rank", v, 0, 63, &o->dp.node_rank);
            o->dp.opts = true;
        } else if (sg_cli_opt(argc, argv, &i, "--master", &v, &bad)) {
            o->dp.master = v;
            o->dp.opts = true;
        } else if (sg_cli_opt(argc, argv, &i, "--dist-timeout", &v, &bad)) {
            bad = bad || !sg_cli_float("train", "--dist-timeout", v, 1, 86400, &o->dp.timeout_s);
            o->dp.opts = true;
        } else if (sg_cli_opt(argc, argv, &i, "--save", &v, &bad)) {
            o->save = v;
        } else if (sg_cli_opt(argc, argv, &i, "--save-every", &v, &bad)) {
            bad = bad || !sg_cli_int("train", "--save-every", v, 1, 100000000, &o->save_every);
        } else if (sg_cli_opt(argc, argv, &i, "--metrics", &v, &bad)) {
            o->metrics = v;
        } else if (sg_cli_opt(argc, argv, &i, "--resume", &v, &bad)) {
            o->resume = v;
        } else if (sg_cli_opt(argc, argv, &i, "--data", &v, &bad)) {
            o->mo.data_path = v;
        } else if (sg_cli_opt(argc, argv, &i, "--val-data", &v, &bad)) {
            o->mo.val_data_path = v;
        } else if (sg_cli_opt(argc, argv, &i, "--vocab", &v, &bad)) {
            long long n = 0;
            bad = bad || !sg_cli_int("train", "--vocab", v, 1, INT32_MAX, &n);
            o->mo.vocab = n;
        } else if (sg_cli_opt(argc, argv, &i, "--precision", &v, &bad)) {
            bad = bad || !sg_cli_precision("train", v, &o->mo.precision);
        } else if (sg_cli_model_opt("train", argc, argv, &i, &o->mo, &bad)) {
            /* --classes, --recompute, --loss-scale */
        } else if (sg_cli_accum_opt("train", argc, argv, &i, &o->tr.accum, &bad)) {
            /* --accum */
        } else if (sg_cli_cond_opt("train", argc, argv, &i, &o->tr, &bad)) {
            /* --loop, --skip-if, --stop-nonfinite, --stop-loss */
        } else if (sg_cli_opt(argc, argv, &i, "--dropout", &v, &bad)) {
            double p = 0;
            bad = bad || !sg_cli_float("train", "--dropout", v, 0, 0.99, &p);
            o->mo.dropout = (float)p;
        } else if (sg_cli_opt(argc, argv, &i, "--clip", &v, &bad)) {
            double c = 0;
            bad = bad || !sg_cli_float("train", "--clip", v, 0, 1e9, &c);
            o->tr.clip = (float)c;
        } else if (sg_cli_opt(argc, argv, &i, "--steps-per-graph", &v, &bad)) {
            long long k = 1;
            bad = bad || !sg_cli_int("train", "--steps-per-graph", v, 1, 1024, &k);
            o->tr.steps_per_call = (int)k;
        } else if (sg_cli_opt(argc, argv, &i, "--cache-budget", &v, &bad)) {
            double mib = 0;
            bad = bad || !sg_cli_float("train", "--cache-budget", v, 0, 1e9, &mib);
            o->tr.cache_budget = (size_t)(mib * 1048576.0);
        } else if (sg_cli_opt(argc, argv, &i, "--model", &v, &bad)) {
            o->model = v;
        } else if (sg_cli_opt(argc, argv, &i, "--steps", &v, &bad)) {
            bad = bad || !sg_cli_int("train", "--steps", v, 1, 100000000, &o->steps);
        } else if (sg_cli_opt(argc, argv, &i, "--seed", &v, &bad)) {
            bad = bad || !sg_cli_int("train", "--seed", v, 0, INT64_MAX, &o->seed);
        } else if (sg_cli_opt(argc, argv, &i, "--log-every", &v, &bad)) {
            bad = bad || !sg_cli_int("train", "--log-every", v, 1, 100000000, &o->log_every);
        } else if (sg_cli_opt(argc, argv, &i, "--backend", &v, &bad)) {
            bad = bad || !sg_cli_backend("train", v, &o->backend);
        } else if (sg_cli_opt(argc, argv, &i, "--lr", &v, &bad)) {
            bad = bad || !sg_cli_float("train", "--lr", v, 0, 10, &o->lr);
            o->lr_set = true;
        } else if (sg_cli_opt(argc, argv, &i, "--wd", &v, &bad)) {
            bad = bad || !sg_cli_float("train", "--wd", v, 0, 10, &o->wd);
        } else if (sg_cli_opt(argc, argv, &i, "--scope", &v, &bad)) {
            if (!bad && sg_scope_parse(v, &o->tr.scope) != SG_OK) {
                fprintf(stderr, "stepgraph train: --scope '%s': expected eager, layer, model or step\n", v);
                bad = true;
            }
        } else if (sg_cli_opt(argc, argv, &i, "--graph-modules", &v, &bad)) {
            o->tr.graph_modules = v;
        } else if (sg_cli_opt(argc, argv, &i, "--warmup", &v, &bad)) {
            long long w = 0;
            bad = bad || !sg_cli_int("train", "--warmup", v, 0, 1000000, &w);
            o->tr.warmup = (int)w;
        } else if (sg_cli_opt(argc, argv, &i, "--on-capture-fail", &v, &bad)) {
            if (!bad && !strcmp(v, "error")) o->tr.on_capture_fail = SG_CAPTURE_FAIL_ERROR;
            else if (!bad && !strcmp(v, "eager")) o->tr.on_capture_fail = SG_CAPTURE_FAIL_EAGER;
            else if (!bad) {
                fprintf(stderr, "stepgraph train: --on-capture-fail '%s': expected error or eager\n", v);
                bad = true;
            }
        } else if (sg_cli_opt(argc, argv, &i, "--optim-state", &v, &bad)) {
            bad = bad || !sg_cli_optim_state("train", v, &o->optim_state);
        } else if (sg_cli_opt(argc, argv, &i, "--optim", &v, &bad)) {
            if (!bad && !strcmp(v, "adamw")) o->optim = SG_OPTIM_ADAMW;
            else if (!bad && !strcmp(v, "sgd")) o->optim = SG_OPTIM_SGD;
            else if (!bad) {
                fprintf(stderr, "stepgraph train: --optim '%s': expected adamw or sgd\n", v);
                bad = true;
            }
        } else {
            fprintf(stderr, "stepgraph train: unknown option '%s' (see stepgraph train --help)\n", argv[i]);
            bad = true;
        }
    }
    if (!bad && o->vary && !o->tr.n_buckets) {
        fprintf(stderr, "stepgraph train: --vary-batch needs --batch-sizes\n");
        bad = true;
    }
    if (!bad && o->vary_seq && !o->tr.n_seq_buckets) {
        fprintf(stderr, "stepgraph train: --vary-seq needs --seq-lens\n");
        bad = true;
    }
    if (!bad && o->tr.accum > 1 && (o->tr.n_buckets || o->tr.n_seq_buckets)) {
        fprintf(stderr, "stepgraph train: --accum %d does not combine with --batch-sizes or --seq-lens: a padded "
                "step is one batch\n", o->tr.accum);
        bad = true;
    }
    if (!bad && o->tr.n_buckets && o->tr.n_seq_buckets) {
        fprintf(stderr, "stepgraph train: --batch-sizes and --seq-lens together: a run varies one shape\n");
        bad = true;
    }
    o->tr.vary_seq = o->vary_seq; /* the trainer draws each step's length, or rows */
    o->tr.vary_batch = o->vary;
    if (!bad && o->tr.steps_per_call > 1 && ((o->tr.n_buckets && !o->vary) || (o->tr.n_seq_buckets && !o->vary_seq))) {
        fprintf(stderr, "stepgraph train: --steps-per-graph %d does not combine with %s: a padded step of a given "
                "size is one launch%s\n", o->tr.steps_per_call, o->tr.n_buckets ? "--batch-sizes" : "--seq-lens",
                o->tr.n_buckets ? " (add --vary-batch: the device then draws each step's rows)"
                                : " (add --vary-seq: the device then draws each step's length)");
        bad = true;
    }
    if (!bad) bad = !sg_cli_cond_check("train", &o->tr, o->mo.precision, true);
    if (!bad && !o->model) {
        fprintf(stderr, "stepgraph train: --model is required (see stepgraph train --help)\n");
        bad = true;
    }
    if (!bad && o->tr.n_seq_buckets && strncmp(o->model, "gpt-", 4)) {
        fprintf(stderr, "stepgraph train: --seq-lens is for gpt models, not '%s'\n", o->model);
        bad = true;
    }
    if (!bad) bad = !check_dist(o);
    if (!bad) bad = !check_steps(o);
    return bad ? SG_EXIT_USAGE : 0;
}

/* Prints a failed call's message (a data-parallel worker's names its rank) and says the run
 * is over. */
static int fail(sg_ctx *ctx, const char *what)
{
    fprintf(stderr, "stepgraph train%s: %s: %s\n", sg_cli_dist_tag(), what, sg_ctx_last_error(ctx));
    return SG_EXIT_FAIL;
}

/* ---- signals: the first SIGINT or SIGTERM ends the run after the step in flight ---- */

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
    if (stop_signal) _exit(128 + sig); /* a second signal: at once */
    stop_signal = sig;
}

static void catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* ---- what the loop reports: loss lines, the progress line, metrics, checkpoints ---- */

typedef struct run {
    const train_opts *o;
    sg_ctx *ctx;
    sg_model *m;
    sg_trainer *tr;
    FILE *metrics;
    float lr;
    long long start;           /* the first step's index */
    int64_t rows, tokens;      /* global batch rows; tokens per row (gpt), else 0 */
    bool tty, shown;           /* progress line on a terminal's stderr; shown now */
    double t_start, t_log;     /* the run's start; the last log point's time */
    long long done_log;        /* steps done at the last log point */
    double ms;                 /* ms/step over the interval that ended at the last log point */
    sg_readback *rb;           /* the loss, read back asynchronously at log points */
    sg_readback *rb_scale;     /* bf16 with --metrics: the loss scaler, read back beside it */
    sg_loss_scaler scale;      /* what rb_scale read last */
} run;

/* Starts the read-backs of this log point: the loss (and the loss scaler). */
static sg_status reads_start(run *r)
{
    sg_status st = sg_readback_start(r->rb, sg_model_loss(r->m));
    if (st != SG_OK) return st;
    return r->rb_scale ? sg_readback_start(r->rb_scale, sg_model_loss_scaler(r->m)) : SG_OK;
}

/* Waits for them (queued a log interval ago, so long finished). */
static sg_status reads_wait(run *r, float *loss)
{
    sg_status st = sg_readback_wait(r->rb, loss, sizeof *loss);
    if (st != SG_OK) return st;
    return r->rb_scale ? sg_readback_wait(r->rb_scale, &r->scale, sizeof r->scale) : SG_OK;
}

/* Clears the progress line before anything else is printed on the terminal. */
static void progress_clear(run *r)
{
    if (r->shown) fputs("\r\033[K", stderr);
    r->shown = false;
}

/* "  step 120/1000  1.23 ms/step  ETA 1.1 s" on stderr, overwritten in place. */
static void progress_show(run *r, long long done)
{
    double ms = (sg_cli_now_ms() - r->t_start) / (double)done;
    double eta = ms * (double)(r->o->steps - done) / 1e3;
    fprintf(stderr, "\r\033[K  step %lld/%lld  %.3g ms/step  ETA %.1f s", done, r->o->steps, ms, eta);
    r->shown = true;
}

/* The metrics file's first line: what ran. */
static void metrics_run(run *r, float val0)
{
    FILE *f = r->metrics;
    fputs("{\"run\": {\"model\": ", f);
    sg_json_write_string(f, sg_model_name(r->m));
    fprintf(f, ", \"scope\": \"%s\", \"precision\": \"%s\", \"backend\": \"%s\", \"device\": ",
            sg_scope_name(r->o->tr.scope), r->o->mo.precision == SG_DTYPE_BF16 ? "bf16" : "fp32",
            sg_backend_name(sg_ctx_backend(r->ctx)));
    sg_json_write_string(f, sg_ctx_device_name(r->ctx));
    fprintf(f, ", \"steps\": %lld, \"start_step\": %lld, \"seed\": %lld, \"accum\": %d}}\n", r->o->steps, r->start,
            r->o->seed, r->o->tr.accum);
    if (val0 >= 0) fprintf(f, "{\"step\": %lld, \"val_loss\": %.6g}\n", r->start, val0);
    fflush(f);
}

/* A log point after `done` steps: the host's ms/step since the last one (the host waits for
 * the device at least every few steps: read-backs, the allocator, queue depth). */
static void log_point(run *r, long long done)
{
    double now = sg_cli_now_ms();
    r->ms = done > r->done_log ? (now - r->t_log) / (double)(done - r->done_log) : 0;
    r->t_log = now, r->done_log = done;
}

/* The loss of step `step` (and val_loss when >= 0): a log line, a metrics line. A loss that is
 * not finite in fp32 ends the run (bf16 skips such steps by loss scaling), unless
 * --stop-nonfinite asked for a rule of its own. */
static int log_loss(run *r, long long step, float loss, float val, double ms, const sg_loss_scaler *sc)
{
    const train_opts *o = r->o;
    if (!isfinite(loss) && o->mo.precision != SG_DTYPE_BF16 && !o->tr.stop_nonfinite) {
        progress_clear(r);
        fprintf(stderr, "stepgraph train: the loss is %s at step %lld (fp32): stopping; nothing is saved. Lower "
                "--lr, or add --clip\n", isnan(loss) ? "NaN" : "infinite", step);
        return SG_EXIT_FAIL;
    }
    if (!o->quiet) {
        progress_clear(r);
        printf("step %7lld  loss %.4f\n", step, loss);
    }
    if (!r->metrics) return 0;
    FILE *f = r->metrics;
    fprintf(f, "{\"step\": %lld, \"loss\": %.6g, \"lr\": %.6g, \"loss_scale\": ", step, loss, r->lr);
    if (sc) fprintf(f, "%g", sc->scale);
    else fputs("null", f);
    fprintf(f, ", \"ms_per_step\": %.6g", ms);
    if (ms > 0) fprintf(f, ", \"%s\": %.6g", r->tokens ? "tokens_per_s" : "samples_per_s",
                        (double)r->rows * (double)(r->tokens ? r->tokens : 1) * 1e3 / ms);
    if (val >= 0) fprintf(f, ", \"val_loss\": %.6g", val);
    fputs("}\n", f);
    if (fflush(f) != 0) {
        fprintf(stderr, "stepgraph train: --metrics '%s': %s\n", o->metrics, strerror(errno));
        return SG_EXIT_FAIL;
    }
    return 0;
}

/* A log point after `done` steps, the loss tensor holding step `last`'s loss: the previous
 * read-back (step *pending) printed when `print`, then this one started. 0, or the exit
 * status of a failure. */
static int log_turn(run *r, bool print, long long *pending, double *pending_ms, float *first_loss, long long done,
                    long long last)
{
    float loss;
    if (print) {
        if (reads_wait(r, &loss) != SG_OK) return fail(r->ctx, "loss read-back");
        if (*first_loss < 0) *first_loss = loss;
        int rc = log_loss(r, r->start + *pending + 1, loss, -1, *pending_ms, r->rb_scale ? &r->scale : NULL);
        if (rc) return rc;
    }
    log_point(r, done);
    *pending_ms = r->ms;
    if (reads_start(r) != SG_OK) return fail(r->ctx, "loss read-back");
    *pending = last;
    return 0;
}

/* Writes --save at `step` (atomically: the library writes a temporary and renames it). */
static int save(run *r, long long step, const char *verb)
{
    if (sg_trainer_save(r->tr, step, r->o->save) != SG_OK) return fail(r->ctx, "save");
    progress_clear(r);
    printf("%s %s (step %lld)\n", verb, r->o->save, step);
    return 0;
}

int sg_cmd_train(int argc, char **argv)
{
    train_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    sg_dist_env env;
    int worker = 0;
    if (!sg_cli_dist_env("train", &env, &worker)) return SG_EXIT_FAIL;
    setvbuf(stdout, NULL, _IOLBF, 0); /* a log file gets each line as it is printed, not at exit */
    if (o.dp.gpus && !worker) return sg_cli_dist_launch("train", argc, argv, o.backend, &o.dp);
    /* A data-parallel worker stops with its launcher (which signals every rank at once); a
     * single process finishes its step and saves. */
    if (!worker) catch_signals();
    FILE *metrics = NULL;
    if (o.metrics && !(metrics = fopen(o.metrics, "w"))) {
        fprintf(stderr, "stepgraph train: --metrics '%s': cannot create it: %s\n", o.metrics, strerror(errno));
        return SG_EXIT_USAGE;
    }
    sg_ctx *ctx = worker ? sg_cli_dist_ctx("train", o.backend, &env) : sg_cli_ctx("train", o.backend, false);
    if (!ctx) {
        if (metrics) fclose(metrics);
        return SG_EXIT_FAIL;
    }
    sg_model *m = NULL;
    sg_optim *opt = NULL;
    sg_readback *rb = NULL, *rb_scale = NULL;
    sg_trainer *tr = NULL;
    sg_dist *dist = NULL;
    rc = 0;
    /* A checkpoint that could not be written would lose the run: check the target first. */
    if (o.save && (!worker || env.rank == 0) && sg_checkpoint_check_path(ctx, o.save) != SG_OK) {
        fprintf(stderr, "stepgraph train: --save: %s\n", sg_ctx_last_error(ctx));
        rc = SG_EXIT_USAGE;
        goto out;
    }
    if (worker && sg_cli_dist_join(ctx, &env, &o.dp, &o.mo, &o.tr, &dist) != SG_OK) {
        rc = fail(ctx, "joining the run");
        goto out;
    }
    if (sg_model_create_ex(ctx, o.model, (uint64_t)o.seed, &o.mo, &m) != SG_OK) {
        rc = fail(ctx, "model");
        goto out;
    }
    if (sg_optim_create(ctx, m, o.optim, &opt) != SG_OK || sg_optim_set_state_dtype(opt, o.optim_state) != SG_OK ||
        sg_readback_create(ctx, 4, &rb) != SG_OK ||
        (metrics && o.mo.precision == SG_DTYPE_BF16 &&
         sg_readback_create(ctx, sizeof(sg_loss_scaler), &rb_scale) != SG_OK)) {
        rc = fail(ctx, "optimizer");
        goto out;
    }
    sg_optim_hparams hp;
    if (sg_optim_get_hparams(opt, &hp) != SG_OK) {
        rc = fail(ctx, "optimizer");
        goto out;
    }
    if (o.lr_set) hp.lr = (float)o.lr;
    hp.weight_decay = (float)o.wd;
    if (sg_optim_set_hparams(opt, &hp) != SG_OK) {
        rc = fail(ctx, "optimizer");
        goto out;
    }
    sg_status tst = sg_trainer_create(m, opt, &o.tr, &tr);
    if (tst != SG_OK) {
        rc = fail(ctx, "trainer");
        if (tst == SG_ERR_INVALID) rc = SG_EXIT_USAGE; /* an option's value (e.g. --graph-modules) */
        goto out;
    }
    long long start = 0; /* the first step's index: 0, or where a checkpoint left off */
    if (o.resume) {
        int64_t s0 = 0;
        if (sg_trainer_load(tr, o.resume, &s0) != SG_OK) {
            rc = fail(ctx, "resume");
            goto out;
        }
        start = s0;
        if (start > SG_TRAINER_MAX_STEP - o.steps) { /* checkpoints count steps up to it */
            fprintf(stderr, "stepgraph train: --resume: '%s' is at step %lld: %lld more steps pass the largest step "
                    "a checkpoint holds (%lld)\n", o.resume, start, o.steps, (long long)SG_TRAINER_MAX_STEP);
            rc = SG_EXIT_USAGE;
            goto out;
        }
        if (o.tr.accum > 1) printf("stepgraph train: resumed from %s at step %lld (batch %lld)\n", o.resume, start,
                                   start * o.tr.accum);
        else printf("stepgraph train: resumed from %s at step %lld\n", o.resume, start);
    }
    /* The held-out loss before and after: 4 batches of a gpt's windows, or every image of a
     * digits file's validation split once (none without a validation split). */
    int64_t n_val = sg_model_split_size(m, 1);
    int64_t rows = sg_tensor_dim(sg_model_input(m), 0) * (dist ? sg_dist_world(dist) : 1);
    int val_batches = n_val <= 0 ? 0 : strncmp(o.model, "gpt", 3) == 0 ? 4 : (int)((n_val + rows - 1) / rows);
    float val0 = -1;
    if (val_batches && sg_trainer_eval(tr, 1, val_batches, &val0) != SG_OK) {
        rc = fail(ctx, "validation");
        goto out;
    }
    char accum[96] = "";
    if (o.tr.accum > 1)
        snprintf(accum, sizeof accum, ", %d micro-batches a step (%lld rows)", o.tr.accum, (long long)rows * o.tr.accum);
    printf("stepgraph train: %s (%s) on %s [%s], %lld parameters, %s lr %g wd %g, seed %lld, scope %s%s%s\n",
           sg_model_name(m), o.mo.precision == SG_DTYPE_BF16 ? "bf16 mixed precision" : "fp32",
           sg_ctx_device_name(ctx), sg_backend_name(sg_ctx_backend(ctx)),
           (long long)sg_model_param_count(m), o.optim == SG_OPTIM_ADAMW ? "AdamW" : "SGD",
           hp.lr, hp.weight_decay, o.seed, sg_scope_name(o.tr.scope), accum,
           sg_graphs_disabled() && o.tr.scope != SG_SCOPE_EAGER ? " (STEPGRAPH_DISABLE_GRAPHS=1: run eagerly)" : "");

    run r = {.o = &o, .ctx = ctx, .m = m, .tr = tr, .metrics = metrics, .lr = hp.lr, .start = start,
             .rb = rb, .rb_scale = rb_scale, .tty = isatty(fileno(stderr)) && !o.quiet, .t_start = sg_cli_now_ms()};
    r.t_log = r.t_start;
    r.rows = rows * o.tr.accum; /* rows an optimizer step trains on */
    r.tokens = strncmp(o.model, "gpt", 3) == 0 ? sg_tensor_dim(sg_model_input(m), 1) : 0;
    if (metrics) metrics_run(&r, val0);
    long long pending = -1; /* step whose loss is being read back */
    double pending_ms = 0;  /* ms/step of the interval that ended with it */
    float loss = 0, first_loss = -1;
    double t0 = 0;
    sg_alloc_stats a0 = {0}, a1;
    /* Each call runs K steps (--steps-per-graph), and K divides --steps (parse checked it). */
    long long K = o.tr.steps_per_call > 0 ? o.tr.steps_per_call : 1;
    /* The first step of the last set-up call: step 1 eagerly (plans, scratch), the capture
     * call otherwise. Timing starts after it. */
    long long setup_step = (o.tr.scope != SG_SCOPE_EAGER ? o.tr.warmup : 0) * K;
    long long done = 0; /* steps run by this process */
    /* An early-stop rule: the trainer's flag is read after every call (a host sync a call). */
    bool stop_rule = o.tr.stop_nonfinite > 0 || o.tr.stop_on_loss;
    sg_trainer_stop stopped = {0};
    for (long long s = 0; s < o.steps && !stop_signal; s += K) {
        sg_status sst;
        if (o.tr.n_buckets && !o.vary) {
            sst = sg_trainer_step_rows(tr, start + s, o.buckets[o.tr.n_buckets - 1]);
        } else if (o.tr.n_seq_buckets && !o.vary_seq) {
            sst = sg_trainer_step_seq(tr, start + s, o.seq_lens[o.tr.n_seq_buckets - 1]);
        } else {
            sst = sg_trainer_step(tr, start + s); /* --vary-seq/-batch: the trainer draws each step's shape */
        }
        if (sst != SG_OK) {
            rc = fail(ctx, "step");
            goto out;
        }
        done = s + K;
        if (stop_rule) {
            if (sg_trainer_get_stop(tr, &stopped) != SG_OK) {
                rc = fail(ctx, "early stop");
                goto out;
            }
            if (stopped.stopped != SG_STOPPED_NO) {
                /* The steps this process ran: the trainer was made for this run. */
                done = stopped.steps_run;
                /* the last log point's loss, then the last step's */
                if ((rc = log_turn(&r, pending >= 0 && pending != done - 1, &pending, &pending_ms, &first_loss, done,
                                   done - 1)))
                    goto out;
                break;
            }
        }
        long long last = s + K - 1; /* the step whose loss the loss tensor now holds */
        /* Log the first step, each step whose number is a multiple of --log-every, the last. */
        bool log = s == 0 || done / o.log_every != s / o.log_every || done == o.steps;
        if (log) {
            /* The previous read-back has long finished: print it, then start this one. */
            if ((rc = log_turn(&r, pending >= 0, &pending, &pending_ms, &first_loss, done, last))) goto out;
        }
        if (s == setup_step) {
            /* Warm-up steps and the capture pay for set-up: time and count from the step after. */
            if (sg_ctx_sync(ctx) != SG_OK) {
                rc = fail(ctx, "sync");
                goto out;
            }
            sg_ctx_alloc_stats(ctx, &a0);
            t0 = sg_cli_now_ms();
        }
        if (o.save_every && done % o.save_every == 0 && done < o.steps && !stop_signal &&
            (rc = save(&r, start + done, "checkpoint")) != 0)
            goto out;
        if (r.tty && (last / 10 != (s - 1) / 10 || s == 0)) progress_show(&r, done);
    }
    if (sg_ctx_sync(ctx) != SG_OK || (dist && sg_dist_poll(dist) != SG_OK) ||
        reads_wait(&r, &loss) != SG_OK) {
        rc = fail(ctx, "sync");
        goto out;
    }
    if (first_loss < 0) first_loss = loss;
    float val1 = -1;
    if (val0 >= 0 && !stop_signal && sg_trainer_eval(tr, 1, val_batches, &val1) != SG_OK) {
        rc = fail(ctx, "validation");
        goto out;
    }
    if ((rc = log_loss(&r, start + pending + 1, loss, val1, pending_ms, r.rb_scale ? &r.scale : NULL)) != 0)
        goto out;
    /* The steps that ran: --steps, or fewer when an early-stop rule held. */
    long long ran = stopped.stopped != SG_STOPPED_NO ? done : o.steps;
    if (stopped.stopped == SG_STOPPED_NONFINITE)
        printf("stepgraph train: stopped early after %lld step%s: the loss was not finite for %d step%s in a row\n",
               ran, ran == 1 ? "" : "s", o.tr.stop_nonfinite, o.tr.stop_nonfinite == 1 ? "" : "s");
    else if (stopped.stopped == SG_STOPPED_LOSS)
        printf("stepgraph train: stopped early after %lld step%s: the loss reached %g\n", ran, ran == 1 ? "" : "s",
               o.tr.stop_loss);
    if (stop_signal) {
        /* The step in flight has finished: keep what the user asked for, then stop. */
        int sig = stop_signal;
        printf("stepgraph train: interrupted by %s after step %lld\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
               start + done);
        /* A sharded optimizer's state is gathered from every rank, which a signal may have
         * stopped at another step: the last --save-every checkpoint stays. */
        if (o.save && o.dp.shard_optimizer && (!dist || sg_dist_rank(dist) == 0))
            printf("stepgraph train: --shard-optimizer: %s not written at the interrupt (the ranks' shares are "
                   "gathered at a step every rank reaches); the last --save-every checkpoint stays\n", o.save);
        else if (o.save && (!dist || sg_dist_rank(dist) == 0) && (rc = save(&r, start + done, "saved")) != 0)
            goto out;
        rc = 128 + sig;
        goto out;
    }
    long long first_timed = setup_step + K;
    long long timed = ran - first_timed;
    double ms = timed > 0 ? (sg_cli_now_ms() - t0) / (double)timed : (sg_cli_now_ms() - r.t_start) / (double)ran;
    sg_ctx_alloc_stats(ctx, &a1);
    double allocs = timed > 0 ? (double)(a1.device_allocs - a0.device_allocs) / (double)timed : 0;
    char window[96], allocs_s[32];
    if (timed > 0) snprintf(window, sizeof window, "steps %lld..%lld", start + first_timed + 1, start + ran);
    else snprintf(window, sizeof window, "all %lld steps, set-up included: too few to time after it", ran);
    printf("done: %lld steps, %.3f ms/step (%s), loss %.4f -> %.4f, device allocations per step after set-up: "
           "%s (%llu in all), peak memory %.1f MiB\n", ran, ms, window, first_loss, loss,
           timed > 0 ? (snprintf(allocs_s, sizeof allocs_s, "%.2f", allocs), allocs_s) : "n/a",
           (unsigned long long)a1.device_allocs, a1.peak_bytes_reserved / 1048576.0);
    sg_cli_dist_print(dist, o.dp.bucket_mib);
    sg_loss_scaler sc;
    if (o.mo.precision == SG_DTYPE_BF16) {
        if (sg_trainer_get_scaler(tr, &sc) != SG_OK) {
            rc = fail(ctx, "loss scaler");
            goto out;
        }
        if (o.mo.loss_scaling == SG_LOSS_SCALING_NONE) printf("no loss scaling (--loss-scale none): no step skipped\n");
        else printf("loss scale %g, %.0f steps skipped (non-finite gradients)\n", sc.scale, sc.skipped);
    }
    if (val0 >= 0) printf("validation loss (%d held-out batches): %.4f -> %.4f\n", val_batches, val0, val1);
    /* Every rank holds the same state; a sharded optimizer's is gathered by all, written by rank 0. */
    if (o.save && (!dist || sg_dist_rank(dist) == 0 || o.dp.shard_optimizer) &&
        (rc = save(&r, start + ran, "saved")) != 0)
        goto out;
    sg_trainer_stats ts;
    if (o.tr.scope != SG_SCOPE_EAGER && sg_trainer_get_stats(tr, &ts) == SG_OK) {
        printf("graphs: %d (%d nodes), captured in %.2f ms, instantiated in %.2f ms, %llu replays\n",
               ts.graphs, ts.nodes, ts.capture_ms, ts.instantiate_ms, (unsigned long long)ts.replays);
        if (ts.fell_back) printf("capture fell back to eager: %s\n", ts.fallback_reason);
        if (ts.cond_note[0]) printf("built without conditional nodes: %s\n", ts.cond_note);
        /* --vary-seq's SWITCH graph needs no cache; without SWITCH nodes it keeps one per bucket. */
        if ((o.tr.n_buckets || o.tr.n_seq_buckets) && o.tr.scope == SG_SCOPE_STEP &&
            (!o.vary_seq || ts.cache.hits + ts.cache.misses > 0)) {
            printf("bucket cache: %d graphs held, %llu hits, %llu misses, %llu captures, %llu evictions, "
                   "%.2f MiB\n", ts.cache.cached, (unsigned long long)ts.cache.hits,
                   (unsigned long long)ts.cache.misses, (unsigned long long)ts.cache.captures,
                   (unsigned long long)ts.cache.evictions, ts.cache.bytes / 1048576.0);
            if (ts.cache.recapture_warning)
                fprintf(stderr, "stepgraph train: warning: graph cache re-captured %llu graphs for %llu "
                        "shapes: the budget evicts graphs that are used again; raise --cache-budget "
                        "or use fewer buckets\n", (unsigned long long)ts.cache.captures,
                        (unsigned long long)ts.cache.distinct_keys);
        }
    }
out:
    if (metrics && fclose(metrics) != 0 && rc == 0) {
        fprintf(stderr, "stepgraph train: --metrics '%s': %s\n", o.metrics, strerror(errno));
        rc = SG_EXIT_FAIL;
    }
    sg_trainer_destroy(tr);
    sg_readback_destroy(rb);
    sg_readback_destroy(rb_scale);
    sg_optim_destroy(opt);
    sg_model_destroy(m);
    sg_dist_destroy(dist); /* after the trainer: its graphs hold the run's collectives */
    sg_ctx_destroy(ctx);
    return rc;
}
