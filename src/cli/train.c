/* train.c: `stepgraph train`: trains a model eagerly. The loss is read back asynchronously
 * (a pinned copy and an event, polled at the next log point), so logging never stalls the
 * GPU; the only host syncs are at the end. */
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *train_usage =
    "usage: stepgraph train --model NAME [options]\n"
    "\n"
    "Trains NAME eagerly on synthetic data (labels from a fixed random teacher network) and\n"
    "prints the loss every K steps, then ms/step and device allocations per step.\n"
    "\n"
    "options:\n"
    "  --model NAME        mlp-WIDTH-DEPTH-BATCH, e.g. mlp-512-6-32 (required)\n"
    "  --steps N           training steps (default 200)\n"
    "  --backend B         cpu, cuda or auto (default auto: CUDA if a GPU is usable)\n"
    "  --optim O           adamw or sgd (default adamw)\n"
    "  --lr X              learning rate (default 1e-3 for adamw, 1e-2 for sgd)\n"
    "  --wd X              weight decay on weights, not biases (default 0)\n"
    "  --seed S            seed of the initial parameters and the data (default 1)\n"
    "  --log-every K       print the loss every K steps (default 20)\n"
    "  --quiet             no per-step lines; the summary only\n"
    "  -h, --help          this text\n"
    "\n"
    "exit status: 0 trained, 1 a runtime error, 2 a usage error\n";

typedef struct train_opts {
    const char *model;
    long long steps, seed, log_every;
    sg_backend backend;
    sg_optim_kind optim;
    double lr, wd;
    bool lr_set, quiet;
} train_opts;

static int parse(int argc, char **argv, train_opts *o)
{
    *o = (train_opts){.steps = 200, .seed = 1, .log_every = 20, .backend = SG_BACKEND_AUTO};
    bool bad = false;
    for (int i = 1; i < argc && !bad;) {
        const char *v = NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(train_usage, stdout);
            exit(0);
        } else if (!strcmp(argv[i], "--quiet")) {
            o->quiet = true, i++;
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
    if (!bad && !o->model) {
        fprintf(stderr, "stepgraph train: --model is required (see stepgraph train --help)\n");
        bad = true;
    }
    return bad ? SG_EXIT_USAGE : 0;
}

/* Prints a failed call's message and says the run is over. */
static int fail(sg_ctx *ctx, const char *what)
{
    fprintf(stderr, "stepgraph train: %s: %s\n", what, sg_ctx_last_error(ctx));
    return SG_EXIT_FAIL;
}

int sg_cmd_train(int argc, char **argv)
{
    train_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    sg_ctx *ctx = sg_cli_ctx("train", o.backend, false);
    if (!ctx) return SG_EXIT_FAIL;
    sg_model *m = NULL;
    sg_optim *opt = NULL;
    sg_readback *rb = NULL;
    rc = 0;
    if (sg_model_create(ctx, o.model, (uint64_t)o.seed, &m) != SG_OK) {
        rc = fail(ctx, "model");
        goto out;
    }
    if (sg_optim_create(ctx, m, o.optim, &opt) != SG_OK || sg_readback_create(ctx, 4, &rb) != SG_OK) {
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
    printf("stepgraph train: %s on %s [%s], %lld parameters, %s lr %g wd %g, seed %lld\n",
           sg_model_name(m), sg_ctx_device_name(ctx), sg_backend_name(sg_ctx_backend(ctx)),
           (long long)sg_model_param_count(m), o.optim == SG_OPTIM_ADAMW ? "AdamW" : "SGD",
           hp.lr, hp.weight_decay, o.seed);

    bool tty = isatty(fileno(stderr)) && !o.quiet;
    long long pending = -1; /* step whose loss is being read back */
    float loss = 0, first_loss = -1;
    double t0 = 0, t_start = sg_cli_now_ms();
    sg_alloc_stats a0 = {0}, a1;
    for (long long s = 0; s < o.steps; s++) {
        if (sg_model_load_batch(m, s) != SG_OK || sg_model_forward(m) != SG_OK ||
            sg_model_backward(m) != SG_OK || sg_optim_step(opt) != SG_OK) {
            rc = fail(ctx, "step");
            goto out;
        }
        bool log = s % o.log_every == 0 || s == o.steps - 1;
        if (log) {
            /* The previous read-back has long finished: print it, then start this one. */
            if (pending >= 0) {
                if (sg_readback_wait(rb, &loss, sizeof loss) != SG_OK) {
                    rc = fail(ctx, "loss read-back");
                    goto out;
                }
                if (first_loss < 0) first_loss = loss;
                if (!o.quiet) printf("step %7lld  loss %.4f\n", pending + 1, loss);
            }
            if (sg_readback_start(rb, sg_model_loss(m)) != SG_OK) {
                rc = fail(ctx, "loss read-back");
                goto out;
            }
            pending = s;
        }
        if (s == 0) {
            /* Step 1 pays for lazy set-up (plans, scratch): time and count from step 2. */
            if (sg_ctx_sync(ctx) != SG_OK) {
                rc = fail(ctx, "sync");
                goto out;
            }
            sg_ctx_alloc_stats(ctx, &a0);
            t0 = sg_cli_now_ms();
        }
        if (tty && s % 10 == 9)
            fprintf(stderr, "\r  step %lld/%lld  %.0f ms  ", s + 1, o.steps, sg_cli_now_ms() - t_start);
    }
    if (sg_ctx_sync(ctx) != SG_OK || sg_readback_wait(rb, &loss, sizeof loss) != SG_OK) {
        rc = fail(ctx, "sync");
        goto out;
    }
    if (tty) fprintf(stderr, "\r%40s\r", "");
    if (first_loss < 0) first_loss = loss;
    if (!o.quiet) printf("step %7lld  loss %.4f\n", pending + 1, loss);
    double ms = o.steps > 1 ? (sg_cli_now_ms() - t0) / (double)(o.steps - 1) : sg_cli_now_ms() - t_start;
    sg_ctx_alloc_stats(ctx, &a1);
    double allocs = o.steps > 1 ? (double)(a1.device_allocs - a0.device_allocs) / (double)(o.steps - 1) : 0;
    printf("done: %lld steps, %.3f ms/step (steps 2..%lld), loss %.4f -> %.4f, device allocations "
           "per step after the first: %.2f (%llu in all), peak memory %.1f MiB\n",
           o.steps, ms, o.steps, first_loss, loss, allocs, (unsigned long long)a1.device_allocs,
           a1.peak_bytes_reserved / 1048576.0);
out:
    sg_readback_destroy(rb);
    sg_optim_destroy(opt);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
    return rc;
}
