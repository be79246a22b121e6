/* custom_module.c: a model with a module of your own, trained under every capture scope.
 *
 * The network is Linear(16 -> 32) -> RMSNorm (rmsnorm.c: the user's module, its own CPU
 * reference and, built with RMSNORM_CUDA, its own CUDA kernels) -> GELU -> Linear(32 -> 4),
 * classifying points by a random linear teacher, with softmax cross-entropy and AdamW. The
 * same model (same seed, same data) trains under eager, layer, model and step scope; each
 * captured run must end bit for bit where eager ends, the loss must fall, and the step-scope
 * run is saved to a checkpoint and loaded into a fresh model of another seed, which must then
 * hold the same bits. Usage: custom_module [cpu|cuda]. */
#include "rmsnorm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N = 1000, IN = 16, HID = 32, OUT = 4, B = 50, STEPS = 60 };

static sg_ctx *ctx;

#define TRY(call)                                                                          \
    do {                                                                                   \
        if ((call) != SG_OK) {                                                             \
            fprintf(stderr, "custom_module: %s: %s\n", #call, sg_ctx_last_error(ctx));     \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* N points x ~ N(0, 1) labelled by the teacher's largest output, as a device data set. */
static sg_dataset *make_data(void)
{
    static float x[N * IN], teacher[OUT * IN];
    static int32_t y[N];
    sg_rng r = {12345};
    for (int i = 0; i < OUT * IN; i++) teacher[i] = (float)sg_rng_normal(&r);
    for (int i = 0; i < N * IN; i++) x[i] = (float)sg_rng_normal(&r);
    for (int i = 0; i < N; i++) {
        double best = -1e30;
        for (int o = 0; o < OUT; o++) {
            double s = 0;
            for (int d = 0; d < IN; d++) s += (double)teacher[o * IN + d] * x[i * IN + d];
            if (s > best) best = s, y[i] = o;
        }
    }
    sg_tensor *tx, *ty;
    TRY(sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){N, IN}, "x", &tx));
    TRY(sg_tensor_create(ctx, SG_DTYPE_I32, 1, (int64_t[]){N}, "y", &ty));
    TRY(sg_tensor_copy_from_host(tx, x, sizeof x));
    TRY(sg_tensor_copy_from_host(ty, y, sizeof y));
    sg_dataset *d;
    TRY(sg_dataset_create(ctx, tx, ty, &d)); /* takes the tensors */
    return d;
}

/* The model: parameters named "enc.fc.weight", "enc.norm.weight", "head.bias", ... */
static sg_model *build(uint64_t seed)
{
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = B;
    sg_builder *b;
    TRY(sg_builder_create(ctx, "rmsnorm-net", &bo, &b));
    sg_module *l[4], *root;
    TRY(sg_builder_push_scope(b, "enc"));
    TRY(sg_module_linear(b, "fc", IN, HID, 1, SG_ACT_NONE, &l[0]));
    TRY(rmsnorm_create(b, "norm", HID, &l[1]));
    sg_builder_pop_scope(b);
    TRY(sg_module_activation(b, "act", SG_ACT_GELU, HID, &l[2]));
    TRY(sg_module_linear(b, "head", HID, OUT, 1, SG_ACT_NONE, &l[3]));
    TRY(sg_module_sequential(b, "net", l, 4, &root));
    sg_model *m;
    TRY(sg_builder_finish(b, root, SG_LOSS_SOFTMAX_XENT, make_data(), seed, &m));
    return m;
}

typedef struct run {
    sg_model *m;
    sg_optim *o;
    sg_trainer *t;
} run;

static run start(uint64_t seed, sg_scope scope)
{
    run r;
    r.m = build(seed);
    TRY(sg_optim_create(ctx, r.m, SG_OPTIM_ADAMW, &r.o));
    TRY(sg_optim_set_lr(r.o, 1e-2f));
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = scope;
    TRY(sg_trainer_create(r.m, r.o, &to, &r.t));
    return r;
}

static void stop(run *r)
{
    sg_trainer_destroy(r->t);
    sg_optim_destroy(r->o);
    sg_model_destroy(r->m);
}

/* The model's flat parameters on the host (caller frees). */
static float *params(sg_model *m, size_t *bytes)
{
    sg_tensor *p = sg_model_params(m);
    *bytes = (size_t)sg_tensor_numel(p) * sizeof(float);
    float *h = malloc(*bytes);
    if (!h) exit(1);
    TRY(sg_tensor_copy_to_host(p, h, *bytes));
    return h;
}

int main(int argc, char **argv)
{
    sg_ctx_options o = sg_ctx_options_default();
    o.backend = argc > 1 && !strcmp(argv[1], "cuda") ? SG_BACKEND_CUDA : SG_BACKEND_CPU;
    if (sg_ctx_create(&o, &ctx) != SG_OK) {
        fprintf(stderr, "custom_module: %s\n", sg_ctx_last_error(NULL));
        return 1;
    }
    const uint64_t seed = 7;
    float first = 0, last = 0;
    size_t bytes;
    run e = start(seed, SG_SCOPE_EAGER);
    for (int s = 0; s < STEPS; s++) {
        TRY(sg_trainer_step(e.t, s));
        if (s == 0) TRY(sg_model_loss_read(e.m, &first));
    }
    TRY(sg_model_loss_read(e.m, &last));
    float *want = params(e.m, &bytes);
    int bad = 0;
    char path[64];
    snprintf(path, sizeof path, "/tmp/custom_module_%d.safetensors", (int)getpid());
    printf("custom_module on %s: %d parameters in %d tensors (", sg_ctx_device_name(ctx),
           (int)sg_tensor_numel(sg_model_params(e.m)), sg_model_param_tensors(e.m));
    for (int i = 0; i < sg_model_param_tensors(e.m); i++) {
        const char *name;
        TRY(sg_model_param_info(e.m, i, &name, NULL, NULL));
        printf("%s%s", i ? ", " : "", name);
    }
    printf("); eager loss %.4f -> %.4f over %d steps\n", first, last, STEPS);
    for (sg_scope sc = SG_SCOPE_LAYER; sc <= SG_SCOPE_STEP; sc++) {
        run g = start(seed, sc);
        for (int s = 0; s < STEPS; s++) TRY(sg_trainer_step(g.t, s));
        float lg;
        TRY(sg_model_loss_read(g.m, &lg));
        sg_trainer_stats st;
        TRY(sg_trainer_get_stats(g.t, &st));
        float *got = params(g.m, &bytes);
        int same = !memcmp(got, want, bytes) && !memcmp(&lg, &last, sizeof lg);
        printf("  %-5s scope: %llu graph replays, loss %.4f, %s eager\n", sg_scope_name(sc),
               (unsigned long long)st.replays, lg, same ? "bit-exact with" : "DIFFERS from");
        bad += !same || st.replays == 0;
        free(got);
        if (sc == SG_SCOPE_STEP) TRY(sg_trainer_save(g.t, STEPS, path));
        stop(&g);
    }
    /* A fresh model of another seed takes the checkpoint's parameters and optimizer state. */
    run f = start(seed + 1, SG_SCOPE_STEP);
    int64_t step = 0;
    TRY(sg_trainer_load(f.t, path, &step));
    float *loaded = params(f.m, &bytes);
    int same = step == STEPS && !memcmp(loaded, want, bytes);
    printf("  checkpoint %s: step %lld, parameters %s\n", path, (long long)step,
           same ? "reloaded bit for bit" : "DIFFER after reloading");
    bad += !same;
    unlink(path);
    free(loaded), free(want);
    stop(&f), stop(&e);
    sg_ctx_destroy(ctx);
    if (!(last < 0.5f * first)) {
        fprintf(stderr, "custom_module: the loss did not halve (%.4f -> %.4f)\n", first, last);
        bad++;
    }
    return bad ? 1 : 0;
}
