/* fuzz_safetensors.c: the safetensors reader (src/nn/checkpoint.c) on arbitrary bytes. Each input
 * is written to a file and loaded three ways: sg_checkpoint_load into a fixed table of small CPU
 * tensors of every dtype, sg_checkpoint_meta_get on the metadata it returns and on the raw
 * input, and sg_trainer_load into an mlp-4-1-2 trainer. Invariants (checkpoint.h, stepgraph.h):
 * no crash, leak or UB; a refused file changes no tensor and no parameter; a loaded one yields
 * NUL-terminated metadata, finite floating values and a step from 0 to SG_TRAINER_MAX_STEP.
 * fuzz/corpus/safetensors/ holds the seeds (gen_corpus.c writes them). */
#include "fuzz.h"

#include "nn/checkpoint.h"

#include <math.h>

/* The fixed table: one tensor of each dtype, 1-D to 3-D. gen_corpus.c saves it too. */
#define FZ_NT 4
static sg_ckpt_entry fz_table[FZ_NT];

int fz_ckpt_table(const sg_ckpt_entry **out)
{
    static const struct {
        const char *name;
        sg_dtype dt;
        int ndim;
        int64_t shape[3];
    } spec[FZ_NT] = {
        {"layer.w", SG_DTYPE_F32, 2, {3, 2}},
        {"layer.b", SG_DTYPE_BF16, 1, {3}},
        {"stats", SG_DTYPE_F64, 3, {2, 1, 2}},
        {"count", SG_DTYPE_I32, 1, {1}},
    };
    sg_ctx *ctx = fz_ctx();
    for (int i = 0; i < FZ_NT && !fz_table[i].t; i++) {
        fz_table[i].name = spec[i].name;
        FZ_OK(ctx, sg_tensor_create(ctx, spec[i].dt, spec[i].ndim, spec[i].shape, spec[i].name,
                                    &fz_table[i].t));
    }
    *out = fz_table;
    return FZ_NT;
}

static sg_model *fz_model;

/* A tiny model's trainer, as `stepgraph train --model mlp-4-1-2` builds it. */
sg_trainer *fz_trainer(void)
{
    static sg_trainer *t;
    if (!t) {
        sg_ctx *ctx = fz_ctx();
        sg_model *m;
        sg_optim *o;
        FZ_OK(ctx, sg_model_create(ctx, "mlp-4-1-2", 1, &m));
        fz_model = m;
        FZ_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
        sg_trainer_options to = sg_trainer_options_default();
        FZ_OK(ctx, sg_trainer_create(m, o, &to, &t));
    }
    return t;
}

/* Every byte of the table's tensors set to 0xa5 (before a load), or checked to be. */
static void table_poison(const sg_ckpt_entry *e, int n, int check)
{
    unsigned char buf[64];
    for (int i = 0; i < n; i++) {
        size_t nb = sg_tensor_nbytes(e[i].t);
        if (!check) {
            memset(buf, 0xa5, nb);
            FZ_OK(fz_ctx(), sg_tensor_copy_from_host(e[i].t, buf, nb));
            continue;
        }
        FZ_OK(fz_ctx(), sg_tensor_copy_to_host(e[i].t, buf, nb));
        for (size_t j = 0; j < nb; j++)
            FZ_CHECK(buf[j] == 0xa5, "refused load changed byte %zu of tensor '%s'", j, e[i].name);
    }
}

/* A tensor's bytes on the host (malloc'd). */
static unsigned char *host_bytes(const sg_tensor *t, size_t *nb)
{
    *nb = sg_tensor_nbytes(t);
    unsigned char *b = malloc(*nb ? *nb : 1);
    if (!b) abort();
    FZ_OK(fz_ctx(), sg_tensor_copy_to_host(t, b, *nb));
    return b;
}

/* Every element of a floating tensor finite. */
static void check_finite(const sg_tensor *t)
{
    size_t nb;
    unsigned char *b = host_bytes(t, &nb);
    sg_dtype dt = sg_tensor_dtype(t);
    for (size_t i = 0; i < nb / sg_dtype_size(dt); i++) {
        double v = 0;
        if (dt == SG_DTYPE_F32) {
            float f;
            memcpy(&f, b + 4 * i, 4);
            v = f;
        } else if (dt == SG_DTYPE_F64) {
            memcpy(&v, b + 8 * i, 8);
        } else if (dt == SG_DTYPE_BF16) {
            uint32_t u = (uint32_t)(b[2 * i] | b[2 * i + 1] << 8) << 16;
            float f;
            memcpy(&f, &u, 4);
            v = f;
        }
        FZ_CHECK(isfinite(v), "tensor '%s' element %zu loaded as %g", sg_tensor_name(t), i, v);
    }
    free(b);
}

/* meta_get on a few keys, with a roomy and a tight buffer: the value fits and ends in NUL. */
static void meta_probe(const char *meta)
{
    static const char *const keys[] = {"step", "model", "precision", "format", "", "absent"};
    char big[512], small[4];
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        memset(big, 'x', sizeof big);
        if (sg_checkpoint_meta_get(meta, keys[k], big, sizeof big) == SG_OK)
            FZ_CHECK(memchr(big, 0, sizeof big), "meta_get('%s') left no NUL", keys[k]);
        memset(small, 'x', sizeof small);
        sg_status st = sg_checkpoint_meta_get(meta, keys[k], small, sizeof small);
        FZ_CHECK(memchr(small, 0, sizeof small), "meta_get('%s', cap 4) left no NUL (%s)",
                 keys[k], sg_status_name(st));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fz_write_file("in.safetensors", data, size);
    const sg_ckpt_entry *e;
    int n = fz_ckpt_table(&e);

    char meta[1024];
    memset(meta, 'x', sizeof meta);
    table_poison(e, n, 0);
    sg_status st = sg_checkpoint_load(fz_ctx(), path, e, n, meta, sizeof meta);
    fz_say(fz_ctx(), "sg_checkpoint_load", st);
    if (st == SG_OK) {
        FZ_CHECK(memchr(meta, 0, sizeof meta), "loaded metadata has no NUL within its cap");
        meta_probe(meta);
        for (int i = 0; i < n; i++)
            if (sg_tensor_dtype(e[i].t) != SG_DTYPE_I32) check_finite(e[i].t);
    } else {
        table_poison(e, n, 1);
    }

    /* The metadata parser on its own, on the raw input as text. */
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    meta_probe(text);
    free(text);

    /* The trainer: unchanged when refused; finite, at a step in range, when loaded. */
    sg_trainer *tr = fz_trainer();
    size_t nb, nb2;
    unsigned char *before = host_bytes(sg_model_params(fz_model), &nb);
    int64_t step = -1;
    st = sg_trainer_load(tr, path, &step);
    fz_say(fz_ctx(), "sg_trainer_load", st);
    if (st == SG_OK) {
        FZ_CHECK(step >= 0 && step <= SG_TRAINER_MAX_STEP,
                 "sg_trainer_load accepted a checkpoint with step %lld", (long long)step);
        check_finite(sg_model_params(fz_model));
    } else {
        unsigned char *after = host_bytes(sg_model_params(fz_model), &nb2);
        FZ_CHECK(nb == nb2 && !memcmp(before, after, nb),
                 "a refused sg_trainer_load (%s) changed the parameters", sg_status_name(st));
        free(after);
    }
    free(before);
    return 0;
}
