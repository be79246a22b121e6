/* sample.c: `stepgraph sample`: generates text from a GPT. The cache modes (eager, step, loop)
 * go through the library's generator (sg_generate: a key/value cache, a batch of prompts,
 * sampling on the device); recompute, the reference, runs the whole context through
 * sg_model_forward for every token, one sequence at a time, the window sliding past the
 * model's sequence length, and samples on the host. Prompts come from --prompt, --prompts FILE
 * or a built-in text (--prompt-len); --repeat times the generation, --json writes one object. */
#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *sample_usage =
    "usage: stepgraph sample --model NAME (--resume PATH | --random-init) [options]\n"
    "\n"
    "Generates text from a GPT checkpoint written by 'stepgraph train --save': prints each\n"
    "prompt, then up to --length bytes drawn one at a time from the model's next-byte\n"
    "distribution (softmax of the logits over --temperature, cut to the --top-k likeliest),\n"
    "one sequence a line. A model trained on a token file (train --vocab N) samples token ids:\n"
    "give the same --vocab and --data, prompts of token ids, and read ids back (no tokenizer\n"
    "here).\n"
    "\n"
    "modes (--mode):\n"
    "  loop       (default) one launch for the whole generation: a graph holding the prefill\n"
    "             of the prompts and a WHILE conditional node that runs decode steps until\n"
    "             every sequence has finished; the host reads the results once\n"
    "  step       a captured graph for the prefill and one for a decode step, per batch\n"
    "             bucket, replayed once a token\n"
    "  eager      every kernel of every token launched from the host\n"
    "  recompute  no cache: the whole context through the model's forward for every token,\n"
    "             one sequence after another, sampled on the host; the reference, and the only\n"
    "             mode that generates past the model's sequence length (the window slides)\n"
    "eager, step and loop keep a key/value cache of --max-len positions a sequence and draw\n"
    "each token on the device from a counter-based generator keyed by the seed, the sequence\n"
    "and the token's number: the three give the same tokens for a seed, and the sequences of\n"
    "a batch draw their own. Greedy decoding (--temperature 0) gives recompute's tokens too,\n"
    "but where two logits are so close that the kernels' rounding decides.\n"
    "\n"
    "options:\n"
    "  --model NAME        the checkpoint's model, e.g. gpt-256-4-8-128 (required)\n"
    "  --resume PATH       the checkpoint (required unless --random-init)\n"
    "  --random-init       no checkpoint: the model's initial weights (seed 1, train's\n"
    "                      default), for benchmarks; excludes --resume\n"
    "  --precision P       fp32 (default) or bf16: the model is built in P (a checkpoint of\n"
    "                      either loads into it); the cache and the forward run in P\n"
    "  --prompt TEXT       what to continue (default: a newline); with --vocab, token ids\n"
    "                      separated by spaces or commas, e.g. '50256' (default: 0)\n"
    "  --prompts FILE      one prompt a line: its bytes (a CR before the newline dropped), with\n"
    "                      --vocab token ids as --prompt takes them; no line may be empty.\n"
    "                      Excludes --prompt\n"
    "  --prompt-len N      synthetic prompts, for benchmarks: N bytes each of a built-in\n"
    "                      English text, sequence i's from byte 7*i (with --vocab, each byte\n"
    "                      modulo the vocabulary); excludes --prompt and --prompts\n"
    "  --batch N           sequences generated together, 1 to 4096 (default: the number of\n"
    "                      prompts); sequence i continues prompt i modulo the number of prompts\n"
    "  --length N          bytes (or tokens) to generate a sequence (default 200; in a cache\n"
    "                      mode at most what the cache holds past the longest prompt). A cache\n"
    "                      mode refuses a prompt and --length past the cache (exit 2)\n"
    "  --temperature T     0 picks the likeliest byte (the lowest on a tie); default 0.8\n"
    "  --top-k K           draw among the K likeliest (ties kept); default 0: every one\n"
    "  --stop TEXT         a sequence ends once its new bytes end with TEXT (1 to 16 bytes;\n"
    "                      with --vocab 1 to 16 token ids); the printed text leaves it out,\n"
    "                      the JSON tokens keep it\n"
    "  --mode M            loop, step, eager or recompute (above; default loop)\n"
    "  --max-len N         the cache's positions a sequence, prompt and new tokens (2 to the\n"
    "                      model's sequence length, the default); not with recompute\n"
    "  --seed S            sampling seed (default 1)\n"
    "  --repeat N          time it: after a warm-up of each, N prefill-only runs (--length 1)\n"
    "                      and N full ones; their medians (prefill ms, ms a token, total ms,\n"
    "                      tokens/s, host us a token) on stderr, and in the JSON; ms a token\n"
    "                      is (total - prefill) / steps, so noise can make it negative. Every run\n"
    "                      must give the warm-up's tokens (default 0: one run, untimed)\n"
    "  --json              one JSON object on stdout instead of the text: the run, its timings\n"
    "                      and each sequence's prompt, text, tokens and why it finished\n"
    "  --vocab N           the checkpoint's model reads tokens below N (train --vocab N): prints\n"
    "                      the prompt's and the generated token ids, space-separated\n"
    "  --data PATH         with --vocab: the token file the model trained on (train --data),\n"
    "                      which building the model reads and checks\n"
    "  --backend B         cpu, cuda or auto (default auto)\n"
    "  -h, --help          this text\n"
    "\n"
    "exit status: 0 generated, 1 a runtime error (no usable device, a checkpoint that does not\n"
    "load or does not match the model, a --prompts file that cannot be read, a failed\n"
    "generation), 2 a usage error (an unknown option, a missing --model or --resume, options\n"
    "that exclude each other, a model that is not gpt, --vocab without --data, a prompt or\n"
    "stop token that is not a whole number below --vocab, an empty --prompts line, a prompt\n"
    "and --length past the cache in a cache mode)\n";

/* --prompt-len's prompts: sequence i reads N bytes from byte 7*i, wrapping at the end.
 * (Dickens, A Tale of Two Cities, 1859: in the public domain.) */
static const char sample_text[] =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the "
    "season of Light, it was the season of Darkness, it was the spring of hope, it was the winter "
    "of despair, we had everything before us, we had nothing before us, we were all going direct "
    "to Heaven, we were all going direct the other way - in short, the period was so far like the "
    "present period, that some of its noisiest authorities insisted on its being received, for "
    "good or for evil, in the superlative degree of comparison only. There were a king with a "
    "large jaw and a queen with a plain face, on the throne of England; there were a king with a "
    "large jaw and a queen with a fair face, on the throne of France. ";

#define SAMPLE_MAX_BATCH 4096
#define SAMPLE_DEFAULT_LENGTH 200
/* Returns a failed call's status (the public header has no SG_TRY; the message is the ctx's). */
#define SAMPLE_TRY(call)                 \
    do {                                 \
        sg_status try_st_ = (call);      \
        if (try_st_ != SG_OK) return try_st_; \
    } while (0)

typedef struct sample_opts {
    const char *model, *resume, *prompt, *prompts, *stop, *data;
    long long length, seed, vocab, batch, top_k, prompt_len, max_len, repeat;
    double temperature;
    bool random_init, json, recompute, length_given;
    sg_gen_mode mode;
    sg_dtype precision;
    sg_backend backend;
} sample_opts;

/* The distinct prompts, as token ids: sequence i of the batch continues prompt i % n. */
typedef struct prompt_list {
    int n;
    int32_t **ids;
    int64_t *len;
} prompt_list;

/* A generation's results, whichever path made them. */
typedef struct gen_out {
    int32_t *tokens;          /* (batch, max_new): sequence i's new tokens, -1 past lens[i] */
    int64_t *lens;
    sg_gen_finish *finish;
    sg_generate_stats stats;  /* recompute: wall_ms, steps and tokens; host_us NaN */
} gen_out;

/* recompute's state: the model's input and logits on the host, the sampler's scratch. */
typedef struct recompute {
    sg_model *m;
    sg_tensor *in;
    int64_t B, T, V;
    int32_t *tok;             /* (B, T): row 0 holds the window */
    float *logits;            /* (B*T, V) */
    uint16_t *raw;            /* (B*T, V) bf16 logits as read, under --precision bf16 */
    double *p;                /* (V) the softmax's terms */
    float *sorted;            /* (V) top-k's threshold */
    int32_t *ctxt;            /* the context: the prompt, then what was generated */
} recompute;

/* What a generation runs on: the batch's prompts, the stop sequence, and one of the engines. */
typedef struct sample_run {
    const sample_opts *o;
    sg_ctx *ctx;
    sg_generator *g;          /* the cache modes */
    recompute *rc;            /* recompute */
    int n;
    const int32_t **prompts;  /* (n) */
    int64_t *plens;           /* (n) */
    int64_t longest;
    int32_t stop[SG_GEN_MAX_STOP_TOKENS];
    int n_stop;
} sample_run;

/* ---- options ---- */

/* Whole numbers below vocab separated by spaces or commas, s[0..len), into ids (room for len / 2
 * + 1 of them); their count, or -1 after a usage error naming `what` (e.g. "--prompt '1 x'"). */
static long long parse_ids(const char *what, const char *s, size_t len, long long vocab, int32_t *ids)
{
    long long n = 0;
    for (size_t i = 0; i < len;) {
        if (s[i] == ' ' || s[i] == ',') {
            i++;
            continue;
        }
        size_t w = i;
        while (w < len && s[w] != ' ' && s[w] != ',') w++;
        char word[32];
        size_t wl = w - i;
        snprintf(word, sizeof word, "%.*s", (int)(wl < sizeof word - 1 ? wl : sizeof word - 1), s + i);
        long long v = -1;
        char *end = word;
        errno = 0;
        if (wl < sizeof word && strlen(word) == wl && word[0] >= '0' && word[0] <= '9') v = strtoll(word, &end, 10);
        if (v < 0 || v >= vocab || errno || *end) {
            fprintf(stderr, "stepgraph sample: %s: '%s' is not a token id (a whole number below --vocab %lld)\n",
                    what, word, vocab);
            return -1;
        }
        ids[n++] = (int32_t)v;
        i = w;
    }
    return n;
}

/* The options into o: 0, SG_EXIT_USAGE after a message, or -1 for --help (printed). */
static int parse_opts(int argc, char **argv, sample_opts *o)
{
    *o = (sample_opts){.length = SAMPLE_DEFAULT_LENGTH, .seed = 1, .temperature = 0.8, .mode = SG_GEN_LOOP,
                       .precision = SG_DTYPE_F32, .backend = SG_BACKEND_AUTO};
    bool bad = false;
    for (int i = 1; i < argc && !bad;) {
        const char *v = NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(sample_usage, stdout);
            return -1;
        } else if (!strcmp(argv[i], "--random-init")) {
            o->random_init = true, i++;
        } else if (!strcmp(argv[i], "--json")) {
            o->json = true, i++;
        } else if (sg_cli_opt(argc, argv, &i, "--model", &v, &bad)) {
            o->model = v;
        } else if (sg_cli_opt(argc, argv, &i, "--resume", &v, &bad)) {
            o->resume = v;
        } else if (sg_cli_opt(argc, argv, &i, "--prompt", &v, &bad)) {
            o->prompt = v;
        } else if (sg_cli_opt(argc, argv, &i, "--prompts", &v, &bad)) {
            o->prompts = v;
        } else if (sg_cli_opt(argc, argv, &i, "--prompt-len", &v, &bad)) {
            bad = bad || !sg_cli_int("sample", "--prompt-len", v, 1, 1 << 20, &o->prompt_len);
        } else if (sg_cli_opt(argc, argv, &i, "--batch", &v, &bad)) {
            bad = bad || !sg_cli_int("sample", "--batch", v, 1, SAMPLE_MAX_BATCH, &o->batch);
        } else if (sg_cli_opt(argc, argv, &i, "--length", &v, &bad)) {
            bad = bad || !sg_cli_int("sample", "--length", v, 1, 1000000, &o->length);
            o->length_given = true;
        } else if (sg_cli_opt(argc, argv, &i, "--temperature", &v, &bad)) {
            bad = bad || !sg_cli_float("sample", "--temperature", v, 0, 100, &o->temperature);
        } else if (sg_cli_opt(argc, argv, &i, "--top-k", &v, &bad)) {
            bad = bad || !sg_cli_int("sample", "--top-k", v, 0, INT32_MAX, &o->top_k);
        } else if (sg_cli_opt(argc, argv, &i, "--stop", &v, &bad)) {
            o->stop = v;
        } else if (sg_cli_opt(argc, argv, &i, "--mode", &v, &bad)) {
            o->recompute = !bad && !strcmp(v, "recompute");
            if (!bad && !o->recompute && sg_gen_mode_parse(v, &o->mode) != SG_OK) {
                fprintf(stderr, "stepgraph sample: --mode '%s': expected loop, step, eager or recompute\n", v);
                bad = true;
            }
        } else if (sg_cli_opt(argc, argv, &i, "--max-len", &v, &bad)) {
            bad = bad || !sg_cli_int("sample", "--max-len", v, 2, INT32_MAX, &o->max_len);
        } else if (sg_cli_opt(argc, argv, &i, "--repeat", &v, &bad)) {
            bad = bad || !sg_cli_int("sample", "--repeat", v, 0, 1000000, &o->repeat);
        } else if (sg_cli_opt(argc, argv, &i, "--precision", &v, &bad)) {
            bad = bad || !sg_cli_precision("sample", v, &o->precision);
        } else if (sg_cli_opt(argc, argv, &i, "--seed", &v, &bad)) {
            bad = bad || !sg_cli_int("sample", "--seed", v, 0, INT64_MAX, &o->seed);
        } else if (sg_cli_opt(argc, argv, &i, "--backend", &v, &bad)) {
            bad = bad || !sg_cli_backend("sample", v, &o->backend);
        } else if (sg_cli_opt(argc, argv, &i, "--vocab", &v, &bad)) {
            bad = bad || !sg_cli_int("sample", "--vocab", v, 1, INT32_MAX, &o->vocab);
        } else if (sg_cli_opt(argc, argv, &i, "--data", &v, &bad)) {
            o->data = v;
        } else {
            fprintf(stderr, "stepgraph sample: unknown option '%s' (see stepgraph sample --help)\n", argv[i]);
            bad = true;
        }
    }
    if (bad) return SG_EXIT_USAGE;
    const char *clash = o->random_init && o->resume         ? "--random-init and --resume"
                        : o->prompt && o->prompts           ? "--prompt and --prompts"
                        : o->prompt_len && o->prompt        ? "--prompt-len and --prompt"
                        : o->prompt_len && o->prompts       ? "--prompt-len and --prompts"
                        : o->max_len && o->recompute        ? "--max-len and --mode recompute (which has no cache)"
                                                            : NULL;
    if (clash) {
        fprintf(stderr, "stepgraph sample: %s exclude each other (see stepgraph sample --help)\n", clash);
        return SG_EXIT_USAGE;
    }
    if (!o->model || (!o->resume && !o->random_init)) {
        fprintf(stderr, "stepgraph sample: --model and --resume (or --random-init) are required (see stepgraph "
                "sample --help)\n");
        return SG_EXIT_USAGE;
    }
    if (strncmp(o->model, "gpt-", 4) != 0) {
        fprintf(stderr, "stepgraph sample: '%s' is not a gpt model; sampling needs one\n", o->model);
        return SG_EXIT_USAGE;
    }
    if ((o->vocab > 0) != (o->data != NULL)) {
        fprintf(stderr, "stepgraph sample: %s: a model of a token vocabulary is built on its token file "
                "(see stepgraph sample --help)\n", o->vocab ? "--vocab needs --data" : "--data needs --vocab");
        return SG_EXIT_USAGE;
    }
    return 0;
}

/* ---- prompts ---- */

static void prompts_free(prompt_list *pl)
{
    for (int i = 0; i < pl->n; i++) free(pl->ids[i]);
    free(pl->ids), free(pl->len);
    *pl = (prompt_list){0};
}

/* Appends one prompt, s[0..len): its bytes, or under --vocab its ids (`what` names it in a
 * usage error). 0, or an exit status after a message. */
static int prompts_add(prompt_list *pl, const sample_opts *o, const char *what, const char *s, size_t len)
{
    int32_t **ids = realloc(pl->ids, (size_t)(pl->n + 1) * sizeof *ids);
    if (ids) pl->ids = ids;
    int64_t *lens = realloc(pl->len, (size_t)(pl->n + 1) * sizeof *lens);
    if (lens) pl->len = lens;
    int32_t *p = malloc((len + 1) * sizeof *p);
    if (!ids || !lens || !p) {
        free(p);
        fprintf(stderr, "stepgraph sample: out of host memory\n");
        return SG_EXIT_FAIL;
    }
    long long n = (long long)len;
    if (o->vocab) {
        n = parse_ids(what, s, len, o->vocab, p);
        if (n == 0) fprintf(stderr, "stepgraph sample: %s holds no token id\n", what);
    } else {
        for (size_t i = 0; i < len; i++) p[i] = (unsigned char)s[i];
    }
    if (n <= 0) {
        free(p);
        return SG_EXIT_USAGE;
    }
    pl->ids[pl->n] = p, pl->len[pl->n] = n, pl->n++;
    return 0;
}

/* --prompts FILE: one prompt a line. A file that cannot be read is a runtime error (1), as a
 * --resume or --data that cannot be; what a line holds is a usage error (2), as --prompt's. */
static int prompts_read(prompt_list *pl, const sample_opts *o)
{
    FILE *f = fopen(o->prompts, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int err = f ? 0 : errno;
    while (f && !err) {
        if (n == cap) {
            char *grown = realloc(buf, cap = cap ? 2 * cap : 65536);
            if (!grown) {
                err = ENOMEM;
                break;
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) err = errno ? errno : EIO;
            break;
        }
    }
    if (f) fclose(f);
    if (err) {
        fprintf(stderr, "stepgraph sample: --prompts '%s': cannot read it: %s\n", o->prompts, strerror(err));
        free(buf);
        return SG_EXIT_FAIL;
    }
    int rc = 0;
    long long line = 0;
    for (size_t at = 0; at < n && !rc; line++) {
        const char *s = buf + at, *nl = memchr(s, '\n', n - at);
        size_t len = nl ? (size_t)(nl - s) : n - at;
        at += len + (nl != NULL);
        if (len && s[len - 1] == '\r') len--;
        char what[600];
        snprintf(what, sizeof what, "--prompts '%s' line %lld", o->prompts, line + 1);
        if (len == 0) {
            fprintf(stderr, "stepgraph sample: %s is empty: one prompt a line, none empty\n", what);
            rc = SG_EXIT_USAGE;
        } else if (pl->n == SAMPLE_MAX_BATCH) {
            fprintf(stderr, "stepgraph sample: --prompts '%s' holds more than %d prompts\n", o->prompts,
                    SAMPLE_MAX_BATCH);
            rc = SG_EXIT_USAGE;
        } else {
            rc = prompts_add(pl, o, what, s, len);
        }
    }
    if (!rc && pl->n == 0) {
        fprintf(stderr, "stepgraph sample: --prompts '%s' holds no prompt\n", o->prompts);
        rc = SG_EXIT_USAGE;
    }
    free(buf);
    return rc;
}

/* The prompts of --prompt, --prompts or --prompt-len (one per sequence of the batch). */
static int prompts_make(prompt_list *pl, const sample_opts *o)
{
    if (o->prompts) return prompts_read(pl, o);
    if (o->prompt_len) {
        const size_t tl = sizeof sample_text - 1;
        char *s = malloc((size_t)o->prompt_len);
        int rc = s ? 0 : SG_EXIT_FAIL;
        for (long long i = 0; !rc && i < (o->batch ? o->batch : 1); i++) {
            for (long long k = 0; k < o->prompt_len; k++) {
                unsigned char b = (unsigned char)sample_text[(size_t)(7 * i + k) % tl];
                s[k] = (char)(o->vocab ? b % o->vocab : b);
            }
            rc = prompts_add(pl, o, "--prompt-len", s, (size_t)o->prompt_len);
        }
        if (!s) fprintf(stderr, "stepgraph sample: out of host memory\n");
        free(s);
        return rc;
    }
    /* --prompt: an empty one is a newline (bytes) as it always was. */
    const char *p = o->prompt ? o->prompt : o->vocab ? "0" : "\n";
    if (!*p && !o->vocab) p = "\n";
    char what[600];
    snprintf(what, sizeof what, "--prompt '%s'", p);
    return prompts_add(pl, o, what, p, strlen(p));
}

/* --stop into s->stop: bytes, or token ids under --vocab, 1 to SG_GEN_MAX_STOP_TOKENS. */
static int stop_make(sample_run *s, const sample_opts *o)
{
    if (!o->stop) return 0;
    size_t len = strlen(o->stop);
    char what[600];
    snprintf(what, sizeof what, "--stop '%s'", o->stop);
    int32_t *ids = malloc((len / 2 + 1) * sizeof *ids);
    long long n = (long long)len;
    if (!ids) {
        fprintf(stderr, "stepgraph sample: out of host memory\n");
        return SG_EXIT_FAIL;
    }
    if (o->vocab) n = parse_ids(what, o->stop, len, o->vocab, ids);
    if (n < 0) {
        free(ids);
        return SG_EXIT_USAGE;
    }
    if (n < 1 || n > SG_GEN_MAX_STOP_TOKENS) {
        fprintf(stderr, "stepgraph sample: %s holds %lld %s: expected 1 to %d\n", what, n, o->vocab ? "token ids" : "bytes",
                SG_GEN_MAX_STOP_TOKENS);
        free(ids);
        return SG_EXIT_USAGE;
    }
    for (long long k = 0; k < n; k++) s->stop[k] = o->vocab ? ids[k] : (unsigned char)o->stop[k];
    s->n_stop = (int)n;
    free(ids);
    return 0;
}

/* ---- recompute: the whole context through the model for every token ---- */

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* A token drawn from softmax(logits / temperature) over the top_k likeliest (0: all; ties at
 * the k-th kept); temperature 0: argmax, the lowest token on a tie. p, sorted: V of scratch. */
static int draw(const float *logits, int V, double temperature, int top_k, uint64_t *rng, double *p, float *sorted)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0) return best;
    float cut = -INFINITY;
    if (top_k > 0 && top_k < V) {
        memcpy(sorted, logits, (size_t)V * sizeof *sorted);
        qsort(sorted, (size_t)V, sizeof *sorted, cmp_desc);
        cut = sorted[top_k - 1];
    }
    double sum = 0;
    for (int v = 0; v < V; v++)
        sum += p[v] = logits[v] >= cut ? exp((logits[v] - logits[best]) / temperature) : 0;
    double u = (next_u64(rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
    for (int v = 0; v < V; v++)
        if (p[v] > 0 && (u -= p[v]) <= 0) return v;
    return best;
}

static void recompute_destroy(recompute *r)
{
    if (!r) return;
    free(r->tok), free(r->logits), free(r->raw), free(r->p), free(r->sorted), free(r->ctxt);
    free(r);
}

static recompute *recompute_create(sg_model *m, int64_t V, int64_t max_ctx)
{
    recompute *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->m = m, r->in = sg_model_input(m), r->V = V;
    r->B = sg_tensor_dim(r->in, 0), r->T = sg_tensor_dim(r->in, 1);
    size_t bt = (size_t)(r->B * r->T);
    r->tok = calloc(bt, sizeof *r->tok);
    r->logits = malloc(bt * (size_t)V * sizeof *r->logits);
    r->raw = malloc(bt * (size_t)V * sizeof *r->raw);
    r->p = malloc((size_t)V * sizeof *r->p), r->sorted = malloc((size_t)V * sizeof *r->sorted);
    r->ctxt = malloc((size_t)max_ctx * sizeof *r->ctxt);
    if (!r->tok || !r->logits || !r->raw || !r->p || !r->sorted || !r->ctxt) {
        recompute_destroy(r);
        return NULL;
    }
    return r;
}

/* The model's logits as f32 on the host (bf16 ones widened). */
static sg_status read_logits(recompute *r)
{
    const sg_tensor *lg = sg_model_logits(r->m);
    size_t n = (size_t)(r->B * r->T * r->V);
    if (sg_tensor_dtype(lg) != SG_DTYPE_BF16) return sg_tensor_copy_to_host(lg, r->logits, n * sizeof *r->logits);
    SAMPLE_TRY(sg_tensor_copy_to_host(lg, r->raw, n * sizeof *r->raw));
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)r->raw[i] << 16;
        memcpy(&r->logits[i], &bits, sizeof bits);
    }
    return SG_OK;
}

/* Sequence `seq`: up to max_new tokens after the prompt into out, their count into *len; the
 * last w <= T tokens of the context at positions 0..w-1 of row 0. Sequence i's generator
 * starts at seed ^ i * golden (sequence 0's at the seed, as this command always drew). */
static sg_status recompute_one(const sample_run *s, int seq, int64_t max_new, int32_t *out, int64_t *len,
                               sg_gen_finish *finish)
{
    recompute *r = s->rc;
    const sample_opts *o = s->o;
    int64_t n = s->plens[seq];
    memcpy(r->ctxt, s->prompts[seq], (size_t)n * sizeof *r->ctxt);
    uint64_t rng = (uint64_t)o->seed ^ ((uint64_t)seq * 0x9e3779b97f4a7c15ull);
    *len = 0, *finish = SG_GEN_FINISH_LENGTH;
    for (int64_t k = 0; k < max_new; k++) {
        int64_t w = n < r->T ? n : r->T; /* the last w tokens, at positions 0..w-1 */
        memcpy(r->tok, r->ctxt + n - w, (size_t)w * sizeof *r->tok);
        SAMPLE_TRY(sg_tensor_copy_from_host(r->in, r->tok, (size_t)(r->B * r->T) * sizeof *r->tok));
        SAMPLE_TRY(sg_model_forward(r->m));
        SAMPLE_TRY(read_logits(r));
        int b = draw(r->logits + (w - 1) * r->V, (int)r->V, o->temperature, (int)o->top_k, &rng, r->p, r->sorted);
        r->ctxt[n++] = b, out[k] = b, *len = k + 1;
        if (s->n_stop && *len >= s->n_stop &&
            !memcmp(out + *len - s->n_stop, s->stop, (size_t)s->n_stop * sizeof *out)) {
            *finish = SG_GEN_FINISH_STOP;
            break;
        }
    }
    return SG_OK;
}

/* ---- a generation, either way ---- */

static void out_free(gen_out *g)
{
    free(g->tokens), free(g->lens), free(g->finish);
    *g = (gen_out){0};
}

static bool out_alloc(gen_out *g, int n, int64_t max_new)
{
    g->tokens = malloc((size_t)(n * max_new) * sizeof *g->tokens);
    g->lens = calloc((size_t)n, sizeof *g->lens), g->finish = calloc((size_t)n, sizeof *g->finish);
    return g->tokens && g->lens && g->finish;
}

/* The batch's sequences, max_new tokens at most each, into out (allocated by the caller). */
static sg_status generate(const sample_run *s, int64_t max_new, gen_out *out)
{
    const sample_opts *o = s->o;
    if (!s->rc) {
        sg_generate_request r = {.n = s->n, .prompts = s->prompts, .prompt_lens = s->plens, .max_new = max_new,
                                 .temperature = (float)o->temperature, .top_k = (int)o->top_k,
                                 .seed = (uint64_t)o->seed, .stop = s->n_stop ? s->stop : NULL,
                                 .n_stop = s->n_stop, .mode = o->mode};
        return sg_generate(s->g, &r, out->tokens, out->lens, out->finish, &out->stats);
    }
    double t0 = sg_cli_now_ms();
    sg_generate_stats st = {.host_us = NAN, .batch_bucket = 1};
    for (int i = 0; i < s->n; i++) {
        int32_t *row = out->tokens + i * max_new;
        SAMPLE_TRY(recompute_one(s, i, max_new, row, &out->lens[i], &out->finish[i]));
        for (int64_t k = out->lens[i]; k < max_new; k++) row[k] = -1;
        st.tokens += out->lens[i];
        if (out->lens[i] - 1 > st.steps) st.steps = out->lens[i] - 1;
    }
    st.wall_ms = sg_cli_now_ms() - t0;
    out->stats = st;
    return SG_OK;
}

/* ---- timing (--repeat) ---- */

typedef struct sample_timing {
    double prefill_ms, per_token_ms, total_ms, tokens_per_s, host_us_per_token, wall_ms, host_us;
    int captured;             /* graphs captured across every call of the run */
} sample_timing;

/* One call's figures, untimed (no --repeat): what its stats say. */
static sample_timing timing_once(const gen_out *out, int64_t max_new)
{
    const sg_generate_stats *st = &out->stats;
    return (sample_timing){.prefill_ms = NAN, .per_token_ms = NAN, .total_ms = st->wall_ms,
                           .tokens_per_s = st->tokens / st->wall_ms * 1e3, .host_us_per_token = st->host_us / max_new,
                           .wall_ms = st->wall_ms, .host_us = st->host_us, .captured = st->captured};
}

/* --repeat N after the full warm-up in *out: a prefill-only warm-up, N prefill-only runs and N
 * full ones (each checked against the warm-up's tokens); the medians into *t. *out keeps the
 * warm-up's sequences and takes the last full run's stats. 0, or SG_EXIT_FAIL after a message. */
static int timing_repeat(const sample_run *s, int64_t max_new, gen_out *out, sample_timing *t)
{
    long long N = s->o->repeat;
    gen_out pre = {0}, full = {0};
    double *pw = malloc((size_t)N * sizeof *pw), *fw = malloc((size_t)N * sizeof *fw),
           *fh = malloc((size_t)N * sizeof *fh);
    int rc = 0;
    if (!pw || !fw || !fh || !out_alloc(&pre, s->n, 1) || !out_alloc(&full, s->n, max_new)) {
        fprintf(stderr, "stepgraph sample: out of host memory\n");
        rc = SG_EXIT_FAIL;
    }
    int captured = out->stats.captured;
    sg_status st = SG_OK;
    for (long long k = -1; !rc && st == SG_OK && k < N; k++) { /* k = -1: the prefill's warm-up */
        st = generate(s, 1, &pre);
        captured += pre.stats.captured;
        if (k >= 0) pw[k] = pre.stats.wall_ms;
    }
    for (long long k = 0; !rc && st == SG_OK && k < N; k++) {
        st = generate(s, max_new, &full);
        captured += full.stats.captured;
        fw[k] = full.stats.wall_ms, fh[k] = full.stats.host_us;
        for (int i = 0; st == SG_OK && !rc && i < s->n; i++)
            if (full.lens[i] != out->lens[i] ||
                memcmp(full.tokens + i * max_new, out->tokens + i * max_new, (size_t)max_new * sizeof *out->tokens)) {
                fprintf(stderr, "stepgraph sample: --repeat: run %lld gave sequence %d other tokens than the "
                        "first run\n", k + 1, i);
                rc = SG_EXIT_FAIL;
            }
    }
    if (st != SG_OK) {
        fprintf(stderr, "stepgraph sample: %s\n", sg_ctx_last_error(s->ctx));
        rc = SG_EXIT_FAIL;
    }
    if (!rc) {
        t->prefill_ms = sg_cli_median(pw, N), t->total_ms = sg_cli_median(fw, N), t->host_us = sg_cli_median(fh, N);
        t->wall_ms = t->total_ms;
        out->stats.steps = full.stats.steps, out->stats.nodes = full.stats.nodes;
        out->stats.graphs = full.stats.graphs;
        t->per_token_ms = full.stats.steps ? (t->total_ms - t->prefill_ms) / full.stats.steps : NAN;
        t->tokens_per_s = full.stats.tokens / t->total_ms * 1e3;
        t->host_us_per_token = t->host_us / max_new;
        t->captured = captured;
    }
    out_free(&pre), out_free(&full);
    free(pw), free(fw), free(fh);
    return rc;
}

/* ---- output ---- */

/* Sequence i's new tokens that are printed: a stop sequence that ended it is left out. */
static int64_t shown(const sample_run *s, const gen_out *out, int i)
{
    return out->lens[i] - (out->finish[i] == SG_GEN_FINISH_STOP ? s->n_stop : 0);
}

/* Each sequence, its prompt then its continuation, one a line: bytes, or ids under --vocab. */
static void print_text(const sample_run *s, const gen_out *out, int64_t max_new)
{
    for (int i = 0; i < s->n; i++) {
        const int32_t *row = out->tokens + i * max_new;
        int64_t n = shown(s, out, i);
        for (int64_t k = 0; k < s->plens[i] + n; k++) {
            int t = k < s->plens[i] ? s->prompts[i][k] : row[k - s->plens[i]];
            if (s->o->vocab) printf(k ? " %d" : "%d", t);
            else fputc(t, stdout);
        }
        fputc('\n', stdout);
    }
}

/* Tokens [0, n) as a NUL-terminated byte string (buf: n + 1). */
static const char *as_bytes(const int32_t *t, int64_t n, char *buf)
{
    for (int64_t k = 0; k < n; k++) buf[k] = (char)t[k];
    buf[n] = 0;
    return buf;
}

static void json_ints(sg_json *w, const int32_t *t, int64_t n)
{
    sg_json_array_begin(w);
    for (int64_t k = 0; k < n; k++) sg_json_int(w, t[k]);
    sg_json_array_end(w);
}

static bool print_json(const sample_run *s, const gen_out *out, int64_t max_new, const sample_timing *t)
{
    const sample_opts *o = s->o;
    char *buf = malloc((size_t)(s->longest > max_new ? s->longest : max_new) + 1);
    sg_json *w = buf ? sg_cli_json_open("sample") : NULL;
    if (!w) {
        if (!buf) fprintf(stderr, "stepgraph sample: out of host memory writing JSON\n");
        free(buf);
        return false;
    }
    const sg_generate_stats *st = &out->stats;
    sg_json_object_begin(w);
    sg_cli_kv_str(w, "model", o->model);
    sg_cli_kv_str(w, "precision", o->precision == SG_DTYPE_BF16 ? "bf16" : "fp32");
    sg_cli_kv_str(w, "mode", o->recompute ? "recompute" : sg_gen_mode_name(o->mode));
    sg_cli_kv_int(w, "batch", s->n);
    sg_cli_kv_int(w, "prompt_len", s->longest);
    sg_cli_kv_int(w, "max_new", max_new);
    sg_json_key(w, "temperature"), sg_json_double(w, o->temperature);
    sg_cli_kv_int(w, "top_k", o->top_k);
    sg_cli_kv_int(w, "seed", o->seed);
    if (o->vocab) sg_cli_kv_int(w, "vocab", o->vocab);
    sg_cli_kv_str(w, "backend", sg_backend_name(sg_ctx_backend(s->ctx)));
    sg_cli_kv_str(w, "device", sg_ctx_device_name(s->ctx));
    sg_cli_kv_int(w, "repeat", o->repeat);
    sg_json_key(w, "prefill_ms"), sg_json_double(w, t->prefill_ms);
    sg_json_key(w, "per_token_ms"), sg_json_double(w, t->per_token_ms);
    sg_json_key(w, "total_ms"), sg_json_double(w, t->total_ms);
    sg_json_key(w, "tokens_per_s"), sg_json_double(w, t->tokens_per_s);
    sg_json_key(w, "host_us_per_token"), sg_json_double(w, t->host_us_per_token);
    sg_json_key(w, "wall_ms"), sg_json_double(w, t->wall_ms);
    sg_json_key(w, "host_us"), sg_json_double(w, t->host_us);
    sg_cli_kv_int(w, "steps", st->steps);
    sg_cli_kv_int(w, "tokens", st->tokens);
    sg_cli_kv_int(w, "nodes", st->nodes);
    sg_cli_kv_int(w, "graphs", st->graphs);
    sg_cli_kv_int(w, "captured", t->captured);
    sg_json_key(w, "sequences");
    sg_json_array_begin(w);
    for (int i = 0; i < s->n; i++) {
        const int32_t *row = out->tokens + i * max_new;
        sg_json_object_begin(w);
        sg_json_key(w, "prompt");
        if (o->vocab) json_ints(w, s->prompts[i], s->plens[i]);
        else sg_json_string(w, as_bytes(s->prompts[i], s->plens[i], buf));
        if (!o->vocab) sg_cli_kv_str(w, "text", as_bytes(row, shown(s, out, i), buf));
        sg_json_key(w, "tokens");
        json_ints(w, row, out->lens[i]);
        sg_cli_kv_str(w, "finish", out->finish[i] == SG_GEN_FINISH_STOP ? "stop" : "length");
        sg_json_object_end(w);
    }
    sg_json_array_end(w);
    sg_json_object_end(w);
    bool ok = sg_cli_json_close("sample", w);
    free(buf);
    return ok;
}

/* --repeat's medians, one line on stderr (recompute has no host time of its own: n/a). */
static void print_timing(const sample_run *s, const gen_out *out, int64_t max_new, const sample_timing *t)
{
    const sample_opts *o = s->o;
    char host[32] = "n/a";
    if (!isnan(t->host_us_per_token)) snprintf(host, sizeof host, "%.2f us", t->host_us_per_token);
    fprintf(stderr, "stepgraph sample: %s, mode %s, batch %d, prompt %lld, %lld new: prefill %.3f ms, %.4f ms a "
            "token (%lld steps), total %.3f ms, %.1f tokens/s, host %s a token (medians of %lld; %s)\n",
            o->model, o->recompute ? "recompute" : sg_gen_mode_name(o->mode), s->n, (long long)s->longest,
            (long long)max_new, t->prefill_ms, t->per_token_ms, (long long)out->stats.steps, t->total_ms,
            t->tokens_per_s, host, o->repeat, sg_ctx_device_name(s->ctx));
}

/* ---- the command ---- */

/* The model, its checkpoint loaded (SG_OK), or an exit status after a message. */
static int model_load(sg_ctx *ctx, const sample_opts *o, sg_model **m, sg_optim **opt, sg_trainer **t)
{
    sg_model_options mo = {.data_path = o->data, .vocab = o->vocab, .precision = o->precision};
    if (sg_model_create_ex(ctx, o->model, 1, &mo, m) != SG_OK) {
        fprintf(stderr, "stepgraph sample: %s\n", sg_ctx_last_error(ctx));
        return SG_EXIT_FAIL;
    }
    if (o->random_init) return 0;
    if (sg_optim_create(ctx, *m, SG_OPTIM_ADAMW, opt) != SG_OK || sg_trainer_create(*m, *opt, NULL, t) != SG_OK) {
        fprintf(stderr, "stepgraph sample: %s\n", sg_ctx_last_error(ctx));
        return SG_EXIT_FAIL;
    }
    int64_t step = 0;
    sg_status st = sg_trainer_load(*t, o->resume, &step);
    if (st != SG_OK) {
        /* A shape that differs may be the embedding of a model of a token vocabulary. */
        fprintf(stderr, "stepgraph sample: %s%s\n", sg_ctx_last_error(ctx),
                st == SG_ERR_SHAPE && !o->vocab ? " (if it was trained with --vocab N, sample with --vocab N --data PATH)"
                                                : "");
        return SG_EXIT_FAIL;
    }
    return 0;
}

/* The cache modes' limits, now that the model's sequence length T is known: --max-len within
 * it, the default --length fitted to the cache, a prompt and --length past it refused. */
static int check_cache(const sample_run *s, sample_opts *o, int64_t T)
{
    if (o->max_len > T) {
        fprintf(stderr, "stepgraph sample: --max-len %lld: the model's sequence length is %lld, the most a learnt "
                "position embedding holds\n", o->max_len, (long long)T);
        return SG_EXIT_USAGE;
    }
    int64_t cache = o->max_len ? o->max_len : T;
    if (!o->length_given && s->longest < cache && cache - s->longest < o->length) o->length = cache - s->longest;
    const char *what = o->max_len ? "--max-len" : "the model's sequence length";
    if (!o->length_given && s->longest >= cache) {
        fprintf(stderr, "stepgraph sample: a prompt of %lld tokens leaves no room in the cache's %lld positions (%s); "
                "shorten it, or use --mode recompute, which slides a window past the model's sequence length\n",
                (long long)s->longest, (long long)cache, what);
        return SG_EXIT_USAGE;
    }
    if (s->longest + o->length > cache) {
        fprintf(stderr, "stepgraph sample: a prompt of %lld tokens and --length %lld need %lld positions, past "
                "the cache's %lld (%s); ask for fewer, or use --mode recompute, which slides a window past the "
                "model's sequence length\n", (long long)s->longest, o->length, (long long)s->longest + o->length,
                (long long)cache, what);
        return SG_EXIT_USAGE;
    }
    return 0;
}

int sg_cmd_sample(int argc, char **argv)
{
    sample_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    prompt_list pl = {0};
    sample_run s = {.o = &o};
    rc = prompts_make(&pl, &o);
    if (!rc) rc = stop_make(&s, &o);
    if (!rc && o.batch && o.batch < pl.n) {
        fprintf(stderr, "stepgraph sample: --batch %lld is fewer than the %d prompts of --prompts '%s'\n", o.batch,
                pl.n, o.prompts);
        rc = SG_EXIT_USAGE;
    }
    /* The batch: sequence i continues prompt i % n. */
    s.n = (int)(o.batch ? o.batch : pl.n);
    s.prompts = rc ? NULL : malloc((size_t)s.n * sizeof *s.prompts);
    s.plens = rc ? NULL : malloc((size_t)s.n * sizeof *s.plens);
    if (!rc && (!s.prompts || !s.plens)) {
        fprintf(stderr, "stepgraph sample: out of host memory\n");
        rc = SG_EXIT_FAIL;
    }
    for (int i = 0; !rc && i < s.n; i++) {
        s.prompts[i] = pl.ids[i % pl.n], s.plens[i] = pl.len[i % pl.n];
        if (s.plens[i] > s.longest) s.longest = s.plens[i];
    }
    sg_ctx *ctx = rc ? NULL : sg_cli_ctx("sample", o.backend, true);
    if (!rc && !ctx) rc = SG_EXIT_FAIL;
    s.ctx = ctx;
    sg_model *m = NULL;
    sg_optim *opt = NULL;
    sg_trainer *t = NULL;
    gen_out out = {0};
    if (!rc) rc = model_load(ctx, &o, &m, &opt, &t);
    int64_t T = rc ? 0 : sg_tensor_dim(sg_model_input(m), 1);
    if (!rc && !o.recompute) rc = check_cache(&s, &o, T);
    if (!rc && o.recompute && !(s.rc = recompute_create(m, o.vocab ? o.vocab : 256, s.longest + o.length))) {
        fprintf(stderr, "stepgraph sample: out of host memory\n");
        rc = SG_EXIT_FAIL;
    }
    if (!rc && !o.recompute) {
        sg_generator_options go = sg_generator_options_default();
        go.max_batch = s.n, go.max_len = o.max_len;
        if (sg_generator_create(m, &go, &s.g) != SG_OK) {
            fprintf(stderr, "stepgraph sample: %s\n", sg_ctx_last_error(ctx));
            rc = SG_EXIT_FAIL;
        }
    }
    if (!rc && !out_alloc(&out, s.n, o.length)) {
        fprintf(stderr, "stepgraph sample: out of host memory\n");
        rc = SG_EXIT_FAIL;
    }
    sample_timing tm = {0};
    if (!rc && generate(&s, o.length, &out) != SG_OK) {
        fprintf(stderr, "stepgraph sample: %s\n", sg_ctx_last_error(ctx));
        rc = SG_EXIT_FAIL;
    }
    if (!rc) tm = timing_once(&out, o.length);
    if (!rc && o.repeat) rc = timing_repeat(&s, o.length, &out, &tm);
    if (!rc) {
        if (o.json) {
            if (!print_json(&s, &out, o.length, &tm)) rc = SG_EXIT_FAIL;
        } else {
            print_text(&s, &out, o.length);
        }
        if (o.repeat) print_timing(&s, &out, o.length, &tm);
    }
    out_free(&out);
    recompute_destroy(s.rc);
    sg_generator_destroy(s.g);
    sg_trainer_destroy(t);
    sg_optim_destroy(opt);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
    free(s.prompts), free(s.plens);
    prompts_free(&pl);
    return rc;
}
