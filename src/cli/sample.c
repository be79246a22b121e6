/* sample.c: `stepgraph sample`: generates text from a trained GPT checkpoint. The context (the
 * prompt, then what was generated) fills row 0 of the model's token input from position 0; by
 * causality the logits at the last filled position depend on it alone. Past the model's
 * sequence length the window slides. A byte is drawn from softmax(logits / temperature). */
#include "cli/cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *sample_usage =
    "usage: stepgraph sample --model NAME --resume PATH [options]\n"
    "\n"
    "Generates text from a GPT checkpoint written by 'stepgraph train --save': prints the\n"
    "prompt, then --length bytes drawn one at a time from the model's next-byte distribution\n"
    "(softmax of the logits over --temperature; the window slides past the model's sequence\n"
    "length).\n"
    "\n"
    "options:\n"
    "  --model NAME        the checkpoint's model, e.g. gpt-256-4-8-128 (required)\n"
    "  --resume PATH       the checkpoint (required)\n"
    "  --prompt TEXT       what to continue (default: a newline)\n"
    "  --length N          bytes to generate (default 200)\n"
    "  --temperature T     0 picks the likeliest byte; default 0.8\n"
    "  --seed S            sampling seed (default 1)\n"
    "  --backend B         cpu, cuda or auto (default auto)\n"
    "  -h, --help          this text\n"
    "\n"
    "exit status: 0 generated, 1 a runtime error (no usable device, a checkpoint that does not\n"
    "load or does not match the model, a failed step), 2 a usage error (an unknown option, a\n"
    "missing --model or --resume, a model that is not gpt)\n";

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A byte drawn from softmax(logits / temperature); temperature 0: argmax. */
static int draw(const float *logits, int V, double temperature, uint64_t *rng)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0) return best;
    double sum = 0, p[256];
    for (int v = 0; v < V; v++) sum += p[v] = exp((logits[v] - logits[best]) / temperature);
    double u = (next_u64(rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
    for (int v = 0; v < V; v++)
        if ((u -= p[v]) <= 0) return v;
    return best;
}

int sg_cmd_sample(int argc, char **argv)
{
    const char *model = NULL, *path = NULL, *prompt = "\n";
    long long length = 200, seed = 1;
    double temperature = 0.8;
    sg_backend backend = SG_BACKEND_AUTO;
    bool bad = false;
    for (int i = 1; i < argc && !bad;) {
        const char *v = NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(sample_usage, stdout);
            return 0;
        } else if (sg_cli_opt(argc, argv, &i, "--model", &v, &bad)) {
            model = v;
        } else if (sg_cli_opt(argc, argv, &i, "--resume", &v, &bad)) {
            path = v;
        } else if (sg_cli_opt(argc, argv, &i, "--prompt", &v, &bad)) {
            prompt = v;
        } else if (sg_cli_opt(argc, argv, &i, "--length", &v, &bad)) {
            bad = bad || !sg_cli_int("sample", "--length", v, 1, 1000000, &length);
        } else if (sg_cli_opt(argc, argv, &i, "--temperature", &v, &bad)) {
            bad = bad || !sg_cli_float("sample", "--temperature", v, 0, 100, &temperature);
        } else if (sg_cli_opt(argc, argv, &i, "--seed", &v, &bad)) {
            bad = bad || !sg_cli_int("sample", "--seed", v, 0, INT64_MAX, &seed);
        } else if (sg_cli_opt(argc, argv, &i, "--backend", &v, &bad)) {
            bad = bad || !sg_cli_backend("sample", v, &backend);
        } else {
            fprintf(stderr, "stepgraph sample: unknown option '%s' (see stepgraph sample --help)\n", argv[i]);
            bad = true;
        }
    }
    if (!bad && (!model || !path)) {
        fprintf(stderr, "stepgraph sample: --model and --resume are required (see stepgraph sample --help)\n");
        bad = true;
    }
    if (!bad && strncmp(model, "gpt-", 4) != 0) {
        fprintf(stderr, "stepgraph sample: '%s' is not a gpt model; sampling needs one\n", model);
        bad = true;
    }
    if (bad) return SG_EXIT_USAGE;

    sg_ctx *ctx = sg_cli_ctx("sample", backend, true);
    if (!ctx) return SG_EXIT_FAIL;
    sg_model *m = NULL;
    sg_optim *o = NULL;
    sg_trainer *t = NULL;
    int32_t *tok = NULL;
    float *logits = NULL;
    int rc = SG_EXIT_FAIL;
    int64_t step = 0;
    if (sg_model_create(ctx, model, 1, &m) != SG_OK || sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o) != SG_OK ||
        sg_trainer_create(m, o, NULL, &t) != SG_OK || sg_trainer_load(t, path, &step) != SG_OK) {
        fprintf(stderr, "stepgraph sample: %s\n", sg_ctx_last_error(ctx));
        goto out;
    }
    sg_tensor *in = sg_model_input(m);
    int64_t B = sg_tensor_dim(in, 0), T = sg_tensor_dim(in, 1), V = 256;
    tok = calloc((size_t)(B * T), sizeof *tok);
    logits = malloc((size_t)(B * T * V) * sizeof *logits);
    size_t plen = strlen(prompt);
    unsigned char *ctxt = malloc(plen + (size_t)length + 1);
    if (!tok || !logits || !ctxt) {
        free(ctxt);
        goto out;
    }
    memcpy(ctxt, prompt, plen);
    size_t n = plen ? plen : 1;
    if (!plen) ctxt[0] = '\n';
    uint64_t rng = (uint64_t)seed;
    fwrite(ctxt, 1, n, stdout);
    for (long long k = 0; k < length; k++) {
        size_t w = n < (size_t)T ? n : (size_t)T; /* the last w bytes, at positions 0..w-1 */
        for (size_t i = 0; i < w; i++) tok[i] = ctxt[n - w + i];
        if (sg_tensor_copy_from_host(in, tok, (size_t)(B * T) * sizeof *tok) != SG_OK ||
            sg_model_forward(m) != SG_OK ||
            sg_tensor_copy_to_host(sg_model_logits(m), logits, (size_t)(B * T * V) * sizeof *logits) != SG_OK) {
            fprintf(stderr, "\nstepgraph sample: %s\n", sg_ctx_last_error(ctx));
            free(ctxt);
            goto out;
        }
        int b = draw(logits + (w - 1) * V, (int)V, temperature, &rng);
        ctxt[n++] = (unsigned char)b;
        fputc(b, stdout);
        fflush(stdout);
    }
    fputc('\n', stdout);
    free(ctxt);
    rc = 0;
out:
    free(tok), free(logits);
    sg_trainer_destroy(t);
    sg_optim_destroy(o);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
    return rc;
}
