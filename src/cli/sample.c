/* sample.c: `stepgraph sample`: generates text from a trained GPT checkpoint. The context (the
 * prompt, then what was generated) fills row 0 of the model's token input from position 0; by
 * causality the logits at the last filled position depend on it alone. Past the model's
 * sequence length the window slides. A byte (or, for a model of a token vocabulary, a token
 * id: there is no tokenizer here) is drawn from softmax(logits / temperature). */
#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *sample_usage =
    "usage: stepgraph sample --model NAME --resume PATH [options]\n"
    "\n"
    "Generates text from a GPT checkpoint written by 'stepgraph train --save': prints the\n"
    "prompt, then --length bytes drawn one at a time from the model's next-byte distribution\n"
    "(softmax of the logits over --temperature; the window slides past the model's sequence\n"
    "length). A model trained on a token file (train --vocab N) samples token ids: give the\n"
    "same --vocab and --data, a --prompt of token ids, and read ids back (no tokenizer here).\n"
    "\n"
    "options:\n"
    "  --model NAME        the checkpoint's model, e.g. gpt-256-4-8-128 (required)\n"
    "  --resume PATH       the checkpoint (required)\n"
    "  --prompt TEXT       what to continue (default: a newline); with --vocab, token ids\n"
    "                      separated by spaces or commas, e.g. '50256' (default: 0)\n"
    "  --length N          bytes (or tokens) to generate (default 200)\n"
    "  --temperature T     0 picks the likeliest byte; default 0.8\n"
    "  --vocab N           the checkpoint's model reads tokens below N (train --vocab N): prints\n"
    "                      the prompt's and the generated token ids, space-separated\n"
    "  --data PATH         with --vocab: the token file the model trained on (train --data),\n"
    "                      which building the model reads and checks\n"
    "  --seed S            sampling seed (default 1)\n"
    "  --backend B         cpu, cuda or auto (default auto)\n"
    "  -h, --help          this text\n"
    "\n"
    "exit status: 0 generated, 1 a runtime error (no usable device, a checkpoint that does not\n"
    "load or does not match the model, a failed step), 2 a usage error (an unknown option, a\n"
    "missing --model or --resume, a model that is not gpt, --vocab without --data, a prompt\n"
    "token that is not a whole number below --vocab)\n";

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A token drawn from softmax(logits / temperature) (p: V doubles of scratch); temperature 0:
 * argmax. */
static int draw(const float *logits, int V, double temperature, uint64_t *rng, double *p)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0) return best;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += p[v] = exp((logits[v] - logits[best]) / temperature);
    double u = (next_u64(rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
    for (int v = 0; v < V; v++)
        if ((u -= p[v]) <= 0) return v;
    return best;
}

/* --prompt under --vocab: whole numbers below vocab separated by spaces or commas, into ids
 * (room for strlen(s) / 2 + 1 of them); their count, or -1 after a usage error. */
static long long parse_ids(const char *s, long long vocab, int32_t *ids)
{
    long long n = 0;
    for (const char *p = s; *p;) {
        if (*p == ' ' || *p == ',') {
            p++;
            continue;
        }
        size_t len = strcspn(p, " ,");
        char word[32];
        long long v = -1;
        snprintf(word, sizeof word, "%.*s", (int)(len < sizeof word - 1 ? len : sizeof word - 1), p);
        char *end;
        errno = 0;
        if (len < sizeof word && word[0] >= '0' && word[0] <= '9') v = strtoll(word, &end, 10);
        if (v < 0 || v >= vocab || errno || *end) {
            fprintf(stderr, "stepgraph sample: --prompt '%s': '%s' is not a token id (a whole number below "
                    "--vocab %lld)\n", s, word, vocab);
            return -1;
        }
        ids[n++] = (int32_t)v;
        p += len;
    }
    return n;
}

int sg_cmd_sample(int argc, char **argv)
{
    const char *model = NULL, *path = NULL, *prompt = NULL, *data = NULL;
    long long length = 200, seed = 1, vocab = 0;
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
        } else if (sg_cli_opt(argc, argv, &i, "--vocab", &v, &bad)) {
            bad = bad || !sg_cli_int("sample", "--vocab", v, 1, INT32_MAX, &vocab);
        } else if (sg_cli_opt(argc, argv, &i, "--data", &v, &bad)) {
            data = v;
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
    if (!bad && (vocab > 0) != (data != NULL)) {
        fprintf(stderr, "stepgraph sample: %s: a model of a token vocabulary is built on its token file "
                "(see stepgraph sample --help)\n", vocab ? "--vocab needs --data" : "--data needs --vocab");
        bad = true;
    }
    if (!prompt) prompt = vocab ? "0" : "\n";
    int32_t *ids = NULL;
    long long n_ids = 0;
    if (!bad && vocab) {
        ids = malloc((strlen(prompt) / 2 + 1) * sizeof *ids);
        n_ids = ids ? parse_ids(prompt, vocab, ids) : -1;
        if (n_ids == 0) fprintf(stderr, "stepgraph sample: --prompt '%s' holds no token id\n", prompt);
        bad = n_ids <= 0;
    }
    if (bad) {
        free(ids);
        return SG_EXIT_USAGE;
    }

    sg_ctx *ctx = sg_cli_ctx("sample", backend, true);
    if (!ctx) {
        free(ids);
        return SG_EXIT_FAIL;
    }
    sg_model *m = NULL;
    sg_optim *o = NULL;
    sg_trainer *t = NULL;
    int32_t *tok = NULL, *ctxt = NULL;
    float *logits = NULL;
    double *p = NULL;
    int rc = SG_EXIT_FAIL;
    int64_t step = 0;
    sg_model_options mo = {.data_path = data, .vocab = vocab};
    if (sg_model_create_ex(ctx, model, 1, &mo, &m) != SG_OK || sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o) != SG_OK ||
        sg_trainer_create(m, o, NULL, &t) != SG_OK) {
        fprintf(stderr, "stepgraph sample: %s\n", sg_ctx_last_error(ctx));
        goto out;
    }
    sg_status st = sg_trainer_load(t, path, &step);
    if (st != SG_OK) {
        /* A shape that differs may be the embedding of a model of a token vocabulary. */
        fprintf(stderr, "stepgraph sample: %s%s\n", sg_ctx_last_error(ctx),
                st == SG_ERR_SHAPE && !vocab ? " (if it was trained with --vocab N, sample with --vocab N --data PATH)"
                                             : "");
        goto out;
    }
    sg_tensor *in = sg_model_input(m);
    int64_t B = sg_tensor_dim(in, 0), T = sg_tensor_dim(in, 1), V = vocab ? vocab : 256;
    tok = calloc((size_t)(B * T), sizeof *tok);
    logits = malloc((size_t)(B * T * V) * sizeof *logits);
    p = malloc((size_t)V * sizeof *p);
    size_t plen = vocab ? (size_t)n_ids : strlen(prompt);
    ctxt = malloc((plen + (size_t)length + 1) * sizeof *ctxt);
    if (!tok || !logits || !p || !ctxt) {
        fprintf(stderr, "stepgraph sample: out of host memory\n");
        goto out;
    }
    /* The context as token ids: the prompt's bytes (a newline for an empty one), or its ids. */
    for (size_t i = 0; i < plen; i++) ctxt[i] = vocab ? ids[i] : (unsigned char)prompt[i];
    size_t n = plen ? plen : 1;
    if (!plen) ctxt[0] = '\n';
    uint64_t rng = (uint64_t)seed;
    for (size_t i = 0; i < n; i++)
        if (vocab) printf(i ? " %d" : "%d", (int)ctxt[i]);
        else fputc(ctxt[i], stdout);
    for (long long k = 0; k < length; k++) {
        size_t w = n < (size_t)T ? n : (size_t)T; /* the last w tokens, at positions 0..w-1 */
        for (size_t i = 0; i < w; i++) tok[i] = ctxt[n - w + i];
        if (sg_tensor_copy_from_host(in, tok, (size_t)(B * T) * sizeof *tok) != SG_OK ||
            sg_model_forward(m) != SG_OK ||
            sg_tensor_copy_to_host(sg_model_logits(m), logits, (size_t)(B * T * V) * sizeof *logits) != SG_OK) {
            fprintf(stderr, "\nstepgraph sample: %s\n", sg_ctx_last_error(ctx));
            goto out;
        }
        int b = draw(logits + (w - 1) * V, (int)V, temperature, &rng, p);
        ctxt[n++] = b;
        if (vocab) printf(" %d", b);
        else fputc(b, stdout);
        fflush(stdout);
    }
    fputc('\n', stdout);
    rc = 0;
out:
    free(tok), free(logits), free(p), free(ctxt), free(ids);
    sg_trainer_destroy(t);
    sg_optim_destroy(o);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
    return rc;
}
