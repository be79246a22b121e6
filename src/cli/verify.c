/* verify.c: `stepgraph verify`: eager is the reference. Two copies of a model from the same
 * seed train on the same batches, one eagerly and one under a capture scope; after every step
 * the loss, every gradient and every parameter are compared, bit for bit by default. The first
 * tensor that differs is named and the exit status is 1. The comparison is sg_verify's (the
 * library's, src/train/verify.c); this file parses the options and prints its rows. */
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>

static const char *verify_usage =
    "usage: stepgraph verify --model NAME --scope S [options]\n"
    "\n"
    "Trains two copies of NAME from the same initial state on the same data, one eagerly and\n"
    "one under scope S, and compares loss, every gradient and every parameter after each step.\n"
    "Our kernels are deterministic, so the default demands bit-exact equality.\n"
    "\n"
    "options:\n"
    "  --model NAME        e.g. mlp-512-6-32 (required)\n"
    "  --scope S           layer, model or step (required; eager checks the checker)\n"
    "  --steps K           steps to compare (default 20); under layer, model and step scope\n"
    "                      at least --warmup + 2, so that two or more steps run from graphs\n"
    "  --backend B         cpu, cuda or auto (default auto)\n"
    "  --graph-modules L   layer scope: modules to capture (default all)\n"
    "  --warmup N          eager steps before capture (default 3)\n"
    "  --lr-schedule       apply a warm-up + cosine lr schedule (lr set on the device each step)\n"
    SG_CLI_MODEL_OPTS_HELP
    "  --precision P       fp32 (default) or bf16 (mixed precision, not mlp; the loss scaler's\n"
    "                      state is compared too)\n"
    "  --dropout P         gpt: dropout probability (default 0)\n"
    "  --clip X            clip gradients to global norm X inside the step (default off)\n"
    "  --optim-state D     f32 (default) or bf16: both sides' AdamW moments (stepgraph train)\n"
    SG_CLI_ACCUM_HELP
    "  --steps-per-graph K step scope: each trainer call runs K optimizer steps (one launch\n"
    "                      of a graph that holds them); a compared step is then a call of K\n"
    "                      (--steps counts calls, --warmup eager calls; default 1)\n"
    "  --seq-lens L        gpt, with --vary-seq: sequence-length buckets, e.g. 8,16,32\n"
    "  --vary-seq          both sides draw each step's length from 1..the largest bucket\n"
    "                      (sg_vary_len), run padded up to its bucket; under step scope one\n"
    "                      graph holds every bucket as a branch of a SWITCH node\n"
    SG_CLI_COND_HELP
    "                      With a stop rule both sides must run the same steps and stop for\n"
    "                      the same reason\n"
    "  --data PATH         gpt: the text to train on (a regular file);\n"
    "                      resnet, efficientnet: a digits file (scikit-learn's 8 x 8\n"
    "                      digits.csv, scripts/fetch-digits.sh DIR) instead of synthetic\n"
    "                      images: scaled up to R x R, the last fifth held out (docs/data.md)\n"
    "  --atol X --rtol X   accept |a - b| <= atol + rtol |eager| instead of bit-exact\n"
    "  --seed S            (default 1)\n"
    "  -h, --help          this text\n"
    "\n"
    "A run that would compare no step replayed from a graph fails: too few --steps is a usage\n"
    "error; STEPGRAPH_DISABLE_GRAPHS=1, or a capture that fell back to eager, is a failure.\n"
    "\n"
    "exit status: 0 all steps match, 1 a mismatch, nothing replayed or a runtime error,\n"
    "2 a usage error\n";

/* The built-in model by name, as the command's options say. */
typedef struct builtin {
    const char *name;
    uint64_t seed;
    sg_model_options mo;
} builtin;

static sg_status make_builtin(sg_ctx *ctx, void *user, sg_model **out)
{
    const builtin *b = user;
    return sg_model_create_ex(ctx, b->name, b->seed, &b->mo, out);
}

/* --lr-schedule: warm-up then cosine decay, both sides alike. */
typedef struct hooks {
    bool schedule;
    int64_t steps;
    long long inject;   /* SG_VERIFY_INJECT: the step after which the graph side is nudged */
} hooks;

static sg_status before_step(void *user, int64_t step, sg_optim *eager, sg_optim *graph)
{
    const hooks *h = user;
    if (!h->schedule) return SG_OK;
    float lr = sg_lr_warmup_cosine(step, h->steps / 4, h->steps, 3e-3f, 1e-4f);
    sg_status st = sg_optim_set_lr(eager, lr);
    return st == SG_OK ? sg_optim_set_lr(graph, lr) : st;
}

/* Test hook: SG_VERIFY_INJECT=K nudges one weight of the graph side after step K, so the test
 * suite can check that a mismatch is caught and named. */
static sg_status after_step(void *user, int64_t step, sg_model *eager, sg_model *gm)
{
    (void)eager;
    const hooks *h = user;
    if (h->inject != step + 1) return SG_OK;
    int64_t off = 0;
    sg_tensor *p = sg_model_params(gm);
    sg_status st = sg_model_param_info(gm, sg_model_param_tensors(gm) > 2 ? 2 : 0, NULL, &off, NULL);
    float *b = malloc(sg_tensor_nbytes(p));
    if (!b) return SG_ERR_OOM;
    if (st == SG_OK) st = sg_tensor_copy_to_host(p, b, sg_tensor_nbytes(p));
    b[off] = 0.125f;
    if (st == SG_OK) st = sg_tensor_copy_from_host(p, b, sg_tensor_nbytes(p));
    free(b);
    return st;
}

static void print_row(void *user, const sg_verify_step *r)
{
    (void)user;
    printf("%6lld %12.6f %12.6f %14.3g %14.3g %14.3g\n", (long long)r->step, r->loss_eager, r->loss_graph,
           r->max_dloss, r->max_dgrad, r->max_dparam);
}

int sg_cmd_verify(int argc, char **argv)
{
    const char *model = NULL;
    long long steps = 20, seed = 1;
    bool schedule = false, bad = false, scope_set = false;
    sg_backend backend = SG_BACKEND_AUTO;
    sg_verify_options vo = sg_verify_options_default();
    sg_model_options mo = {0};
    /* Both sides' other trainer options: the control-flow forms, buckets, steps per call. */
    sg_trainer_options tr = sg_trainer_options_default();
    int64_t seq_lens[32];
    bool vary_seq = false;
    for (int i = 1; i < argc && !bad;) {
        const char *v = NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(verify_usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--lr-schedule")) {
            schedule = true, i++;
        } else if (sg_cli_opt(argc, argv, &i, "--model", &v, &bad)) {
            model = v;
        } else if (sg_cli_opt(argc, argv, &i, "--scope", &v, &bad)) {
            scope_set = true;
            if (!bad && sg_scope_parse(v, &vo.scope) != SG_OK) {
                fprintf(stderr, "stepgraph verify: --scope '%s': expected eager, layer, model or step\n", v);
                bad = true;
            }
        } else if (sg_cli_opt(argc, argv, &i, "--steps", &v, &bad)) {
            bad = bad || !sg_cli_int("verify", "--steps", v, 1, 1000000, &steps);
        } else if (sg_cli_opt(argc, argv, &i, "--precision", &v, &bad)) {
            bad = bad || !sg_cli_precision("verify", v, &mo.precision);
        } else if (sg_cli_model_opt("verify", argc, argv, &i, &mo, &bad)) {
            /* --classes, --recompute, --loss-scale */
        } else if (sg_cli_opt(argc, argv, &i, "--optim-state", &v, &bad)) {
            bad = bad || !sg_cli_optim_state("verify", v, &vo.optim_state);
        } else if (sg_cli_accum_opt("verify", argc, argv, &i, &vo.accum, &bad)) {
            /* --accum */
        } else if (sg_cli_cond_opt("verify", argc, argv, &i, &tr, &bad)) {
            /* --loop, --skip-if, --stop-nonfinite, --stop-loss */
        } else if (!strcmp(argv[i], "--vary-seq")) {
            vary_seq = true, i++;
        } else if (sg_cli_opt(argc, argv, &i, "--seq-lens", &v, &bad)) {
            bad = bad || !sg_cli_buckets("verify", "--seq-lens", v, seq_lens, &tr.n_seq_buckets, 32);
            tr.seq_buckets = seq_lens;
        } else if (sg_cli_opt(argc, argv, &i, "--steps-per-graph", &v, &bad)) {
            long long k = 1;
            bad = bad || !sg_cli_int("verify", "--steps-per-graph", v, 1, 1024, &k);
            tr.steps_per_call = (int)k;
        } else if (sg_cli_opt(argc, argv, &i, "--dropout", &v, &bad)) {
            double p = 0;
            bad = bad || !sg_cli_float("verify", "--dropout", v, 0, 0.99, &p);
            mo.dropout = (float)p;
        } else if (sg_cli_opt(argc, argv, &i, "--clip", &v, &bad)) {
            double c = 0;
            bad = bad || !sg_cli_float("verify", "--clip", v, 0, 1e9, &c);
            vo.clip = (float)c;
        } else if (sg_cli_opt(argc, argv, &i, "--data", &v, &bad)) {
            mo.data_path = v;
        } else if (sg_cli_opt(argc, argv, &i, "--seed", &v, &bad)) {
            bad = bad || !sg_cli_int("verify", "--seed", v, 0, INT64_MAX, &seed);
        } else if (sg_cli_opt(argc, argv, &i, "--warmup", &v, &bad)) {
            long long w = 0;
            bad = bad || !sg_cli_int("verify", "--warmup", v, 0, 1000000, &w);
            vo.warmup = (int)w;
        } else if (sg_cli_opt(argc, argv, &i, "--graph-modules", &v, &bad)) {
            vo.graph_modules = v;
        } else if (sg_cli_opt(argc, argv, &i, "--backend", &v, &bad)) {
            bad = bad || !sg_cli_backend("verify", v, &backend);
        } else if (sg_cli_opt(argc, argv, &i, "--atol", &v, &bad)) {
            bad = bad || !sg_cli_float("verify", "--atol", v, 0, 1e9, &vo.atol);
        } else if (sg_cli_opt(argc, argv, &i, "--rtol", &v, &bad)) {
            bad = bad || !sg_cli_float("verify", "--rtol", v, 0, 1e9, &vo.rtol);
        } else {
            fprintf(stderr, "stepgraph verify: unknown option '%s' (see stepgraph verify --help)\n", argv[i]);
            bad = true;
        }
    }
    if (!bad && (!model || !scope_set)) {
        fprintf(stderr, "stepgraph verify: --model and --scope are required (see stepgraph verify --help)\n");
        bad = true;
    }
    /* The scope, accumulation and precision the checks below see; sg_verify sets the first two
     * on each side itself. */
    tr.scope = vo.scope, tr.accum = vo.accum, tr.vary_seq = vary_seq;
    if (!bad && vary_seq != (tr.n_seq_buckets > 0)) {
        fprintf(stderr, "stepgraph verify: %s\n", vary_seq ? "--vary-seq needs --seq-lens"
                                                            : "--seq-lens is for --vary-seq (a verify step is "
                                                              "otherwise a full-length one)");
        bad = true;
    }
    if (!bad && tr.n_seq_buckets && strncmp(model, "gpt-", 4)) {
        fprintf(stderr, "stepgraph verify: --seq-lens is for gpt models, not '%s'\n", model);
        bad = true;
    }
    if (!bad && tr.n_seq_buckets && vo.accum > 1) {
        fprintf(stderr, "stepgraph verify: --accum %d does not combine with --seq-lens: a padded step is one "
                "batch\n", vo.accum);
        bad = true;
    }
    if (!bad && tr.steps_per_call > 1 && vo.scope != SG_SCOPE_STEP) {
        fprintf(stderr, "stepgraph verify: --steps-per-graph %d is for --scope step (one graph holds K steps); "
                "scope %s launches each step\n", tr.steps_per_call, sg_scope_name(vo.scope));
        bad = true;
    }
    if (!bad) bad = !sg_cli_cond_check("verify", &tr, mo.precision, true);
    if (!bad && vo.scope != SG_SCOPE_EAGER && steps < (long long)vo.warmup + 2) {
        /* sg_verify refuses it too; here it is a usage error naming the options. */
        fprintf(stderr, "stepgraph verify: --steps %lld with --warmup %d compares %s: steps 1..%d run eagerly and "
                "step %d is the capture's first replay; give --steps %d or more\n", steps, vo.warmup,
                steps <= vo.warmup ? "no step replayed from a graph" : "one replay only", vo.warmup,
                vo.warmup + 1, vo.warmup + 2);
        bad = true;
    }
    if (bad) return SG_EXIT_USAGE;
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach a log file as they are printed */
    if (vo.scope != SG_SCOPE_EAGER && sg_graphs_disabled()) {
        fprintf(stderr, "stepgraph verify: STEPGRAPH_DISABLE_GRAPHS=1 runs every scope eagerly: there is no "
                "graph to verify; unset it\n");
        return SG_EXIT_FAIL;
    }

    sg_ctx *ctx = sg_cli_ctx("verify", backend, false);
    if (!ctx) return SG_EXIT_FAIL;
    builtin bi = {.name = model, .seed = (uint64_t)seed, .mo = mo};
    const char *inj = getenv("SG_VERIFY_INJECT");
    hooks h = {.schedule = schedule, .steps = steps, .inject = inj ? atoll(inj) : 0};
    vo.steps = steps, vo.user = &h, vo.before_step = before_step, vo.after_step = after_step, vo.on_step = print_row;
    vo.trainer = &tr;
    char accum[48] = "", forms[160] = "";
    if (vo.accum > 1) snprintf(accum, sizeof accum, ", %d micro-batches a step", vo.accum);
    snprintf(forms, sizeof forms, "%s%s%s%s", vary_seq ? ", varying length" : "", tr.loop ? ", loop" : "",
             tr.skip_if ? ", skip-if" : "", tr.stop_nonfinite || tr.stop_on_loss ? ", early stop" : "");
    printf("stepgraph verify: %s (%s%s%s%s%s), eager vs %s scope, %lld steps on %s, %s\n", model,
           mo.precision == SG_DTYPE_BF16 ? "bf16" : "fp32", mo.dropout > 0 ? ", dropout" : "",
           vo.clip > 0 ? ", clipping" : "", accum, forms, sg_scope_name(vo.scope), steps, sg_ctx_device_name(ctx),
           vo.atol == 0 && vo.rtol == 0 ? "bit-exact" : "within tolerance");
    if (tr.steps_per_call > 1)
        printf("each compared step is a call of %d optimizer steps (%lld in all)\n", tr.steps_per_call,
               steps * tr.steps_per_call);
    printf("%6s %12s %12s %14s %14s %14s\n", "step", "loss eager", "loss graph", "max |dloss|",
           "max |dgrad|", "max |dparam|");
    sg_verify_result r;
    memset(&r, 0, sizeof r);
    int rc = SG_EXIT_FAIL;
    if (sg_verify(ctx, make_builtin, &bi, &vo, &r) != SG_OK) {
        /* A usage-like refusal (too few steps, graphs disabled) is still the caller's to fix. */
        fprintf(stderr, "stepgraph verify: %s\n", sg_ctx_last_error(ctx));
    } else if (r.mismatch_step) {
        printf("MISMATCH at step %lld: first tensor that differs: %s\n", (long long)r.mismatch_step, r.mismatch);
    } else if (!r.passed) {
        printf("FAILED: %s\n", r.no_graph);
    } else {
        printf("OK: %lld steps match (%s), %lld of them replayed from graphs; scope %s: %d graphs, %d nodes, "
               "%llu replays\n", steps, vo.atol == 0 && vo.rtol == 0 ? "bit-exact" : "within tolerance",
               (long long)r.replayed, sg_scope_name(vo.scope), r.stats.graphs, r.stats.nodes,
               (unsigned long long)r.stats.replays);
        rc = 0;
    }
    if (r.stats.cond_note[0]) printf("built without conditional nodes: %s\n", r.stats.cond_note);
    sg_ctx_destroy(ctx);
    return rc;
}
