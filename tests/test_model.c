/* test_model.c: model names and sizes. Names are parsed whole (no trailing text, every field
 * in range), sg_model_estimate is a lower bound of what a build allocates and within 1.5x of
 * it, and a model larger than the context's memory is refused before anything is allocated.
 * Modes: cpu (the CPU backend), gpu (the same on a CUDA device). */
#include "train/model.h"
#include "nn/text.h"
#include "ops/conv.h"
#include "testutil.h"

#include <unistd.h>

static void names(void)
{
    const char *good[] = {"mlp-512-6-32", "mlp-1-1-1", "mlp-65536-64-1048576", "gpt-64-1-2-16", "gpt-256-4-8-128"};
    const char *bad[] = {"mlp-64-2-33x", "mlp-64-2-32-garbage", "mlp-64-2-32-", "mlp-064-2-32", "mlp-+64-2-32",
                         "mlp- 64-2-32", "mlp-64-2-32\"x", "mlp-65537-2-32", "mlp-64-65-32", "mlp-64-0-32",
                         "mlp-64-2-1048577", "mlp-64-2", "gpt-64-1-2", "gpt-64-1-2-16-1", "gpt-64-1-2-65537",
                         "cnn-64-2-32", "", "mlp", "MLP-64-2-32", "mlp-99999999999999999999-2-32"};
    sg_model_size z;
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        sg_status st = sg_model_estimate(good[i], NULL, &z);
        TU_CHECK(st == SG_OK, "'%s' refused: %s", good[i], sg_ctx_last_error(NULL));
        TU_CHECK(z.params > 0 && z.total_bytes > 0, "'%s': %lld parameters, %zu bytes", good[i],
                 (long long)z.params, z.total_bytes);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        sg_status st = sg_model_estimate(bad[i], NULL, &z);
        TU_CHECK(st == SG_ERR_INVALID, "'%s' accepted (%s)", bad[i], sg_status_name(st));
        TU_CHECK(strstr(sg_ctx_last_error(NULL), "unknown model") != NULL, "'%s': message %s", bad[i],
                 sg_ctx_last_error(NULL));
    }
    /* The parameter count is the built model's, exactly (a hand count for one of each). */
    TU_CHECK(sg_model_estimate("mlp-8-2-4", NULL, &z) == SG_OK && z.params == 2 * (64 + 8) + 80 + 10,
             "mlp-8-2-4: %lld parameters", (long long)z.params);
    TU_CHECK(sg_model_estimate("gpt-64-1-2-16", NULL, &z) == SG_OK &&
             z.params == 2 * 256 * 64 + 16 * 64 + (12 * 64 * 64 + 13 * 64) + 2 * 64,
             "gpt-64-1-2-16: %lld parameters", (long long)z.params);
}

/* What a build allocated (model.c counts it) against the estimate: never less, at most 1.5x
 * plus the text data set, which the estimate leaves to the reader (4 bytes a token), and on
 * the GPU the convolutions' workspace (one for the context, at most SG_CONV_WORKSPACE_MAX). */
static void estimate_bounds(sg_backend be, const char *name, sg_dtype precision, float dropout, int recompute)
{
    sg_ctx *ctx = tu_ctx(be);
    sg_model_options mo = {0};
    mo.precision = precision, mo.dropout = dropout, mo.recompute = recompute;
    if (name[0] == 'r' || name[0] == 'e') mo.classes = tu_randint(2, 20);
    sg_model_size z;
    TU_OK(NULL, sg_model_estimate(name, &mo, &z));
    sg_model *m = NULL;
    TU_OK(ctx, sg_model_create_ex(ctx, name, tu_next(), &mo, &m));
    TU_CHECK(z.params == sg_model_param_count(m), "%s: estimate %lld parameters, built %lld", name,
             (long long)z.params, (long long)sg_model_param_count(m));
    double need = (double)(z.param_bytes + z.activation_bytes + z.data_bytes);
    double text = m->text ? 4.0 * (double)(sg_text_size(m->text, 0) + sg_text_size(m->text, 1)) : 0;
    TU_CHECK((double)m->bytes >= need, "%s %s dropout %g recompute %d: built %zu bytes, estimate %.0f: not a lower "
             "bound", name, sg_dtype_name(precision), dropout, recompute, m->bytes, need);
    double ws = be == SG_BACKEND_CUDA && (name[0] == 'r' || name[0] == 'e') ? (double)SG_CONV_WORKSPACE_MAX : 0;
    TU_CHECK((double)m->bytes <= 1.5 * need + text + ws + 65536,
             "%s %s dropout %g recompute %d: built %zu bytes, estimate %.0f (+ text %.0f): off by more than 1.5x",
             name, sg_dtype_name(precision), dropout, recompute, m->bytes, need, text);
    printf("%s %s dropout %g recompute %d: estimate %.0f bytes, built %zu (text %.0f)\n", name,
           sg_dtype_name(precision), dropout, recompute, need, m->bytes, text);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
}

/* A context whose memory is capped below the estimate refuses the model with both figures,
 * and allocates nothing for it. */
static void refused_before_allocating(sg_backend be)
{
    sg_model_size z;
    const char *name = "mlp-256-4-64";
    TU_OK(NULL, sg_model_estimate(name, NULL, &z));
    sg_ctx_options o = sg_ctx_options_default();
    o.backend = be;
    o.alloc_limit_bytes = (size_t)tu_randint(1, 16) * (z.param_bytes / 32);
    sg_ctx *ctx = NULL;
    TU_OK(NULL, sg_ctx_create(&o, &ctx));
    sg_alloc_stats a0, a1;
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a0));
    sg_model *m = NULL;
    TU_FAILS(ctx, sg_model_create(ctx, name, 1, &m), SG_ERR_OOM, "needs at least");
    TU_CHECK(strstr(sg_ctx_last_error(ctx), "GiB free of") != NULL, "message lacks the free figure: %s",
             sg_ctx_last_error(ctx));
    TU_CHECK(m == NULL, "model set on failure");
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a1));
    TU_CHECK(a1.device_allocs == a0.device_allocs, "%llu allocations before refusing",
             (unsigned long long)(a1.device_allocs - a0.device_allocs));
    sg_ctx_destroy(ctx);
}

/* The deepest GPT a name accepts (depth 64: 773 parameter tensors) builds, takes a step and
 * saves and reloads its checkpoint. */
static void deepest(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    sg_model *m = NULL;
    sg_optim *o = NULL;
    sg_trainer *t = NULL;
    TU_OK(ctx, sg_model_create(ctx, "gpt-64-64-1-8", tu_next(), &m));
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    TU_OK(ctx, sg_trainer_create(m, o, NULL, &t));
    TU_OK(ctx, sg_trainer_step(t, 0));
    float loss = 0;
    TU_OK(ctx, sg_model_loss_read(m, &loss));
    TU_CHECK(isfinite(loss) && loss > 0, "gpt-64-64-1-8: loss %g after a step", loss);
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_model_%d.safetensors", (int)getpid());
    TU_OK(ctx, sg_trainer_save(t, 1, path));
    int64_t step = -1;
    TU_OK(ctx, sg_trainer_load(t, path, &step));
    TU_CHECK(step == 1, "reloaded step %lld", (long long)step);
    remove(path);
    sg_trainer_destroy(t);
    sg_optim_destroy(o);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_model");
    sg_backend be = strcmp(mode, "gpu") ? SG_BACKEND_CPU : SG_BACKEND_CUDA;
    if (be == SG_BACKEND_CUDA) sg_ctx_destroy(tu_ctx(be)); /* skips (77) without a GPU */
    names();
    char mlp[64], gpt[64];
    snprintf(mlp, sizeof mlp, "mlp-%d-%d-%d", tu_randint(1, 96), tu_randint(1, 4), tu_randint(1, 40));
    snprintf(gpt, sizeof gpt, "gpt-%d-%d-%d-%d", 64 * tu_randint(1, 2), tu_randint(1, 3), tu_randint(1, 4),
             tu_randint(2, 48));
    estimate_bounds(be, mlp, SG_DTYPE_F32, 0.f, 0);
    estimate_bounds(be, gpt, SG_DTYPE_F32, 0.f, 0);
    estimate_bounds(be, gpt, SG_DTYPE_F32, 0.1f, 0);
    estimate_bounds(be, gpt, SG_DTYPE_BF16, 0.1f, 0);
    estimate_bounds(be, gpt, SG_DTYPE_F32, 0.1f, 1);
    estimate_bounds(be, gpt, SG_DTYPE_BF16, 0.f, 1);
    /* A shape where the allocator's rounding does not hide an estimate one M x C buffer a block
     * too large (723a4df: CI drew it). */
    estimate_bounds(be, "gpt-64-3-4-40", SG_DTYPE_F32, 0.f, 0);
    /* The image models, with and without recompute (batch 1 or 2, R 32 to 48). */
    char img[64];
    for (int r = 0; r < 2; r++) {
        static const char *const kinds[] = {"resnet18", "resnet50", "efficientnet_b0"};
        snprintf(img, sizeof img, "%s-%d-%d", kinds[tu_randint(0, 2)], tu_randint(1, 2), tu_randint(32, 48));
        estimate_bounds(be, img, tu_randint(0, 1) ? SG_DTYPE_BF16 : SG_DTYPE_F32, 0.f, r);
    }
    refused_before_allocating(be);
    deepest(be);
    return tu_finish("test_model");
}
