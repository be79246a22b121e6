/* verify.c: `stepgraph verify`: eager is the reference. Two copies of a model from the same
 * seed train on the same batches, one eagerly and one under a capture scope; after every step
 * the loss, every gradient and every parameter are compared, bit for bit by default. The first
 * tensor that differs is named and the exit status is 1. */
#include "cli/cli.h"

#include <math.h>
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
    "  --precision P       fp32 (default) or bf16 (gpt: mixed precision; the loss scaler's\n"
    "                      state is compared too)\n"
    "  --dropout P         gpt: dropout probability (default 0)\n"
    "  --clip X            clip gradients to global norm X inside the step (default off)\n"
    "  --data PATH         gpt: the text to train on (a regular file)\n"
    "  --atol X --rtol X   accept |a - b| <= atol + rtol |eager| instead of bit-exact\n"
    "  --seed S            (default 1)\n"
    "  -h, --help          this text\n"
    "\n"
    "A run that would compare no step replayed from a graph fails: too few --steps is a usage\n"
    "error; STEPGRAPH_DISABLE_GRAPHS=1, or a capture that fell back to eager, is a failure.\n"
    "\n"
    "exit status: 0 all steps match, 1 a mismatch, nothing replayed or a runtime error,\n"
    "2 a usage error\n";

typedef struct side {
    sg_model *m;
    sg_optim *o;
    sg_trainer *t;
} side;

/* Compares n floats; returns the first index outside tolerance or -1; max errors out. */
static int64_t compare(const float *a, const float *b, int64_t n, double atol, double rtol,
                       double *max_abs, double *max_rel)
{
    int64_t first = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        double r = d / (fabs((double)a[i]) > 1e-30 ? fabs((double)a[i]) : 1e-30);
        bool same = atol == 0 && rtol == 0 ? memcmp(&a[i], &b[i], 4) == 0 : d <= atol + rtol * fabs((double)a[i]);
        if (d > *max_abs || isnan(d)) *max_abs = d;
        if (r > *max_rel) *max_rel = r;
        if (!same && first < 0) first = i;
    }
    return first;
}

/* The parameter whose slice of the flat buffer holds element i. */
static const char *param_at(const sg_model *m, int64_t i)
{
    const char *name;
    int64_t off, n;
    for (int p = 0; p < sg_model_param_tensors(m); p++)
        if (sg_model_param_info(m, p, &name, &off, &n) == SG_OK && i >= off && i < off + n) return name;
    return "(padding)";
}

static float *read_all(sg_ctx *ctx, const sg_tensor *t)
{
    float *v = malloc(sg_tensor_nbytes(t));
    if (v && sg_tensor_copy_to_host(t, v, sg_tensor_nbytes(t)) != SG_OK) {
        free(v);
        return NULL;
    }
    return v;
}

int sg_cmd_verify(int argc, char **argv)
{
    const char *model = NULL;
    long long steps = 20, seed = 1;
    double atol = 0, rtol = 0;
    bool schedule = false, bad = false, scope_set = false;
    sg_backend backend = SG_BACKEND_AUTO;
    sg_trainer_options tr = sg_trainer_options_default();
    sg_model_options mo = {0};
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
            if (!bad && sg_scope_parse(v, &tr.scope) != SG_OK) {
                fprintf(stderr, "stepgraph verify: --scope '%s': expected eager, layer, model or step\n", v);
                bad = true;
            }
        } else if (sg_cli_opt(argc, argv, &i, "--steps", &v, &bad)) {
            bad = bad || !sg_cli_int("verify", "--steps", v, 1, 1000000, &steps);
        } else if (sg_cli_opt(argc, argv, &i, "--precision", &v, &bad)) {
            bad = bad || !sg_cli_precision("verify", v, &mo.precision);
        } else if (sg_cli_opt(argc, argv, &i, "--dropout", &v, &bad)) {
            double p = 0;
            bad = bad || !sg_cli_float("verify", "--dropout", v, 0, 0.99, &p);
            mo.dropout = (float)p;
        } else if (sg_cli_opt(argc, argv, &i, "--clip", &v, &bad)) {
            double c = 0;
            bad = bad || !sg_cli_float("verify", "--clip", v, 0, 1e9, &c);
            tr.clip = (float)c;
        } else if (sg_cli_opt(argc, argv, &i, "--data", &v, &bad)) {
            mo.data_path = v;
        } else if (sg_cli_opt(argc, argv, &i, "--seed", &v, &bad)) {
            bad = bad || !sg_cli_int("verify", "--seed", v, 0, INT64_MAX, &seed);
        } else if (sg_cli_opt(argc, argv, &i, "--warmup", &v, &bad)) {
            long long w = 0;
            bad = bad || !sg_cli_int("verify", "--warmup", v, 0, 1000000, &w);
            tr.warmup = (int)w;
        } else if (sg_cli_opt(argc, argv, &i, "--graph-modules", &v, &bad)) {
            tr.graph_modules = v;
        } else if (sg_cli_opt(argc, argv, &i, "--backend", &v, &bad)) {
            bad = bad || !sg_cli_backend("verify", v, &backend);
        } else if (sg_cli_opt(argc, argv, &i, "--atol", &v, &bad)) {
            bad = bad || !sg_cli_float("verify", "--atol", v, 0, 1e9, &atol);
        } else if (sg_cli_opt(argc, argv, &i, "--rtol", &v, &bad)) {
            bad = bad || !sg_cli_float("verify", "--rtol", v, 0, 1e9, &rtol);
        } else {
            fprintf(stderr, "stepgraph verify: unknown option '%s' (see stepgraph verify --help)\n", argv[i]);
            bad = true;
        }
    }
    if (!bad && (!model || !scope_set)) {
        fprintf(stderr, "stepgraph verify: --model and --scope are required (see stepgraph verify --help)\n");
        bad = true;
    }
    if (!bad && tr.scope != SG_SCOPE_EAGER && steps < (long long)tr.warmup + 2) {
        /* Steps 1..warmup run eagerly on both sides and step warmup+1 captures: fewer steps
         * would compare eager with eager and pass on nothing. */
        fprintf(stderr, "stepgraph verify: --steps %lld with --warmup %d compares %s: steps 1..%d run eagerly and "
                "step %d is the capture's first replay; give --steps %d or more\n", steps, tr.warmup,
                steps <= tr.warmup ? "no step replayed from a graph" : "one replay only", tr.warmup,
                tr.warmup + 1, tr.warmup + 2);
        bad = true;
    }
    if (bad) return SG_EXIT_USAGE;
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach a log file as they are printed */
    if (tr.scope != SG_SCOPE_EAGER && sg_graphs_disabled()) {
        fprintf(stderr, "stepgraph verify: STEPGRAPH_DISABLE_GRAPHS=1 runs every scope eagerly: there is no "
                "graph to verify; unset it\n");
        return SG_EXIT_FAIL;
    }

    sg_ctx *ctx = sg_cli_ctx("verify", backend, false);
    if (!ctx) return SG_EXIT_FAIL;
    side s[2] = {{0}};
    int rc = SG_EXIT_FAIL;
    float *a = NULL, *b = NULL;
    sg_trainer_options eager = sg_trainer_options_default();
    eager.clip = tr.clip;
    for (int k = 0; k < 2; k++) {
        if (sg_model_create_ex(ctx, model, (uint64_t)seed, &mo, &s[k].m) != SG_OK ||
            sg_optim_create(ctx, s[k].m, SG_OPTIM_ADAMW, &s[k].o) != SG_OK ||
            sg_trainer_create(s[k].m, s[k].o, k ? &tr : &eager, &s[k].t) != SG_OK) {
            fprintf(stderr, "stepgraph verify: %s\n", sg_ctx_last_error(ctx));
            goto out;
        }
    }
    printf("stepgraph verify: %s (%s%s%s), eager vs %s scope, %lld steps on %s, %s\n", model,
           mo.precision == SG_DTYPE_BF16 ? "bf16" : "fp32", mo.dropout > 0 ? ", dropout" : "",
           tr.clip > 0 ? ", clipping" : "", sg_scope_name(tr.scope), steps, sg_ctx_device_name(ctx),
           atol == 0 && rtol == 0 ? "bit-exact" : "within tolerance");
    printf("%6s %12s %12s %14s %14s %14s\n", "step", "loss eager", "loss graph", "max |dloss|",
           "max |dgrad|", "max |dparam|");
    int64_t P = sg_tensor_numel(sg_model_params(s[0].m));
    for (long long step = 0; step < steps; step++) {
        for (int k = 0; k < 2; k++) {
            if (schedule &&
                sg_optim_set_lr(s[k].o, sg_lr_warmup_cosine(step, steps / 4, steps, 3e-3f, 1e-4f)) != SG_OK) {
                fprintf(stderr, "stepgraph verify: %s\n", sg_ctx_last_error(ctx));
                goto out;
            }
            if (sg_trainer_step(s[k].t, step) != SG_OK) {
                fprintf(stderr, "stepgraph verify: step %lld (%s): %s\n", step + 1, k ? "graph" : "eager",
                        sg_ctx_last_error(ctx));
                goto out;
            }
        }
        /* Test hook: SG_VERIFY_INJECT=K nudges one weight of the graph side after step K, so
         * the test suite can check that a mismatch is caught and named. */
        const char *inj = getenv("SG_VERIFY_INJECT");
        if (inj && atoll(inj) == step + 1) {
            sg_model *gm = s[1].m;
            int64_t off = 0;
            if (sg_model_param_info(gm, sg_model_param_tensors(gm) > 2 ? 2 : 0, NULL, &off, NULL) != SG_OK)
                goto out;
            free(b);
            if (!(b = read_all(ctx, sg_model_params(gm)))) goto out;
            b[off] = 0.125f;
            if (sg_tensor_copy_from_host(sg_model_params(gm), b, sg_tensor_nbytes(sg_model_params(gm))) != SG_OK)
                goto out;
        }
        float la, lb;
        if (sg_model_loss_read(s[0].m, &la) != SG_OK || sg_model_loss_read(s[1].m, &lb) != SG_OK) goto out;
        double ml = 0, mr = 0, mg = 0, mp = 0;
        const char *first = NULL;
        char what[160];
        if (compare(&la, &lb, 1, atol, rtol, &ml, &mr) >= 0) first = "loss";
        /* The loss scaler (scale, good steps, skipped steps) must agree exactly. */
        sg_loss_scaler sa, sb;
        if (sg_trainer_get_scaler(s[0].t, &sa) != SG_OK || sg_trainer_get_scaler(s[1].t, &sb) != SG_OK) goto out;
        if (!first && memcmp(&sa, &sb, sizeof sa)) {
            snprintf(what, sizeof what, "amp.scaler (eager scale %g, %g skipped; graph scale %g, %g skipped)",
                     sa.scale, sa.skipped, sb.scale, sb.skipped);
            first = what;
        }
        const char *kinds[2] = {"grad", "param"};
        for (int kind = 0; kind < 2; kind++) {
            free(a), free(b);
            a = read_all(ctx, kind ? sg_model_params(s[0].m) : sg_model_grads(s[0].m));
            b = read_all(ctx, kind ? sg_model_params(s[1].m) : sg_model_grads(s[1].m));
            if (!a || !b) goto out;
            double mx = 0;
            int64_t i = compare(a, b, P, atol, rtol, &mx, &mr);
            if (kind) mp = mx;
            else mg = mx;
            if (i >= 0 && !first) {
                snprintf(what, sizeof what, "%s%s (element %lld of the flat buffer: eager %.9g, graph %.9g)",
                         param_at(s[0].m, i), kind ? "" : ".grad", (long long)i, a[i], b[i]);
                first = what;
            }
            (void)kinds;
        }
        printf("%6lld %12.6f %12.6f %14.3g %14.3g %14.3g\n", step + 1, la, lb, ml, mg, mp);
        if (first) {
            printf("MISMATCH at step %lld: first tensor that differs: %s\n", step + 1, first);
            goto out;
        }
    }
    sg_trainer_stats ts;
    if (sg_trainer_get_stats(s[1].t, &ts) != SG_OK) {
        fprintf(stderr, "stepgraph verify: %s\n", sg_ctx_last_error(ctx));
        goto out;
    }
    /* Matching proves nothing if the graph side never ran a graph. */
    long long replayed = tr.scope == SG_SCOPE_EAGER || ts.fell_back || !ts.replays ? 0 : steps - tr.warmup;
    if (tr.scope != SG_SCOPE_EAGER && !replayed) {
        printf("FAILED: no step ran from a graph under scope %s (%d graphs, %llu replays)%s%s: the %lld steps "
               "compared eager with eager\n", sg_scope_name(tr.scope), ts.graphs, (unsigned long long)ts.replays,
               ts.fell_back ? "; capture fell back to eager: " : "", ts.fell_back ? ts.fallback_reason : "", steps);
        goto out;
    }
    printf("OK: %lld steps match (%s), %lld of them replayed from graphs; scope %s: %d graphs, %d nodes, "
           "%llu replays\n", steps, atol == 0 && rtol == 0 ? "bit-exact" : "within tolerance", replayed,
           sg_scope_name(tr.scope), ts.graphs, ts.nodes, (unsigned long long)ts.replays);
    rc = 0;
out:
    free(a), free(b);
    for (int k = 0; k < 2; k++) {
        sg_trainer_destroy(s[k].t);
        sg_optim_destroy(s[k].o);
        sg_model_destroy(s[k].m);
    }
    sg_ctx_destroy(ctx);
    return rc;
}
