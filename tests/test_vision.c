/* test_vision.c: the vision modules (sg_module_conv2d, _batchnorm2d, _maxpool2d, _avgpool,
 * _residual_block) composed into a small ResNet of fresh random sizes (odd images, channels not
 * a multiple of 8, a depthwise convolution, an identity and a strided 1x1 shortcut): every scope
 * bit for bit against eager through sg_verify, BatchNorm's running statistics included (a nudged
 * one is named); parameter and buffer names; running statistics moved by training and not by
 * evaluation, saved and loaded with a checkpoint; no device allocation per step; the loss falls
 * on a batch it sees again; every parameter's gradient against finite differences (CPU); and the
 * refusals, after which the context still trains. The ops themselves are tested one by one in
 * test_conv, test_batchnorm, test_pool and test_act. Modes: cpu, gpu (skipped without a GPU). */
#define _GNU_SOURCE /* memmem */
#include "testutil.h"
#include "train/model.h"

#include <unistd.h>

/* The network's sizes and seeds, drawn once per test. */
typedef struct spec {
    int64_t B, n, H, W, Cin, C1, C2, classes;
    uint64_t seed, dseed;
    int smooth;        /* no ReLU and no max pool: differentiable everywhere (finite differences) */
    int tamper_at;     /* sg_verify's after_step: nudge a running variance after this step */
    sg_dtype precision; /* f32, or bf16 mixed precision (0: f32) */
} spec;

static spec draw(void)
{
    spec s = {.B = tu_randint(2, 6), .H = tu_randint(5, 11), .W = tu_randint(5, 11), .Cin = tu_randint(1, 5),
              .C1 = tu_randint(3, 13), .C2 = tu_randint(3, 13), .classes = tu_randint(2, 7), .seed = tu_next(),
              .dseed = tu_next()};
    s.n = s.B * tu_randint(2, 3) + tu_randint(0, (int)s.B - 1);
    return s;
}

/* x (n, H, W, Cin) N(0,1), labels uniform over the classes. */
static sg_dataset *images(sg_ctx *ctx, const spec *s, int64_t n)
{
    return tu_images(ctx, n, s->H, s->W, s->Cin, s->classes, s->dseed);
}

/* stem (conv 3x3 with bias, BN + ReLU), max pool 3/2 pad 1, block1 (3x3, BN + ReLU, depthwise
 * 3x3, BN; identity), block2 (3x3 stride 2, BN + SiLU, 3x3, BN; shortcut 1x1 stride 2, BN),
 * global average pool, fc. smooth: no ReLU, no max pool. */
static sg_model *mini(sg_ctx *ctx, const spec *s, sg_dataset *d)
{
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = s->B;
    if (s->precision) bo.precision = s->precision;
    sg_builder *b;
    TU_OK(ctx, sg_builder_create(ctx, "mini-resnet", &bo, &b));
    sg_activation relu = s->smooth ? SG_ACT_NONE : SG_ACT_RELU;
    sg_module *l[8], *m1[4], *m2[4], *sc[2], *seq;
    int n = 0;
    int64_t x[3] = {s->H, s->W, s->Cin}, a[3], c[3], e[3], f[3];
    TU_OK(ctx, sg_module_conv2d(b, "conv1", x[0], x[1], x[2], s->C1, 3, 1, 1, 1, 1, &l[n++]));
    TU_OK(ctx, sg_module_batchnorm2d(b, "bn1", x[0], x[1], s->C1, relu, &l[n++]));
    a[0] = x[0], a[1] = x[1], a[2] = s->C1;
    if (!s->smooth) {
        TU_OK(ctx, sg_module_maxpool2d(b, "maxpool", a[0], a[1], a[2], 3, 2, 1, &l[n++]));
        a[0] = tu_osz(a[0], 3, 2, 1), a[1] = tu_osz(a[1], 3, 2, 1);
    }
    TU_OK(ctx, sg_builder_push_scope(b, "layer1.0"));
    tu_conv_bn(ctx, b, "conv1", "bn1", a, s->C1, 3, 1, 1, relu, c, &m1[0]);
    tu_conv_bn(ctx, b, "conv2", "bn2", c, s->C1, 3, 1, (int)s->C1, SG_ACT_NONE, e, &m1[2]);
    TU_OK(ctx, sg_module_sequential(b, "main", m1, 4, &seq));
    TU_OK(ctx, sg_module_residual_block(b, "", seq, NULL, a, e, relu, &l[n++]));
    sg_builder_pop_scope(b);
    TU_OK(ctx, sg_builder_push_scope(b, "layer2.0"));
    tu_conv_bn(ctx, b, "conv1", "bn1", e, s->C2, 3, 2, 1, SG_ACT_SILU, c, &m2[0]); /* EfficientNet's */
    tu_conv_bn(ctx, b, "conv2", "bn2", c, s->C2, 3, 1, 1, SG_ACT_NONE, f, &m2[2]);
    TU_OK(ctx, sg_module_sequential(b, "main", m2, 4, &seq));
    TU_OK(ctx, sg_builder_push_scope(b, "downsample"));
    int64_t so[3];
    tu_conv_bn(ctx, b, "0", "1", e, s->C2, 1, 2, 1, SG_ACT_NONE, so, sc);
    sg_builder_pop_scope(b);
    TU_CHECK(!memcmp(so, f, sizeof so), "shortcut (%lld, %lld) and main (%lld, %lld) differ", (long long)so[0],
             (long long)so[1], (long long)f[0], (long long)f[1]);
    sg_module *sc_seq;
    TU_OK(ctx, sg_module_sequential(b, "downsample", sc, 2, &sc_seq));
    TU_OK(ctx, sg_module_residual_block(b, "", seq, sc_seq, e, f, relu, &l[n++]));
    sg_builder_pop_scope(b);
    TU_OK(ctx, sg_module_avgpool(b, "avgpool", f[0], f[1], f[2], &l[n++]));
    TU_OK(ctx, sg_module_linear(b, "fc", f[2], s->classes, 1, SG_ACT_NONE, &l[n++]));
    sg_module *root;
    TU_OK(ctx, sg_module_sequential(b, "net", l, n, &root));
    sg_model *m;
    TU_OK(ctx, sg_builder_finish(b, root, SG_LOSS_SOFTMAX_XENT, d, s->seed, &m));
    return m;
}

static sg_status factory(sg_ctx *ctx, void *user, sg_model **out)
{
    const spec *s = user;
    *out = mini(ctx, s, images(ctx, s, s->n));
    return *out ? SG_OK : SG_ERR_INVALID;
}

/* The element of buffer `name` at index j, nudged by +0.125 on the graph side. */
static sg_status nudge_buffer(sg_model *m, const char *name, int64_t j)
{
    for (int i = 0; i < sg_model_buffer_tensors(m); i++) {
        const char *nm;
        int64_t off, n;
        sg_status st = sg_model_buffer_info(m, i, &nm, &off, &n);
        if (st != SG_OK) return st;
        if (strcmp(nm, name)) continue;
        sg_tensor *one;
        float v;
        SG_TRY(sg_tensor_view(sg_model_buffers(m), off + j % n, 1, (int64_t[]){1}, "one", &one));
        st = sg_tensor_copy_to_host(one, &v, 4);
        v += 0.125f;
        if (st == SG_OK) st = sg_tensor_copy_from_host(one, &v, 4);
        sg_tensor_destroy(one);
        return st;
    }
    return SG_ERR_INVALID;
}

static sg_status tamper(void *user, int64_t step, sg_model *eager, sg_model *graph)
{
    (void)eager;
    const spec *s = user;
    return step + 1 == s->tamper_at ? nudge_buffer(graph, "layer2.0.bn1.running_var", 1) : SG_OK;
}

/* Every scope equals eager bit for bit (loss, gradients, parameters, running statistics; bf16:
 * the loss scaler's state too) with graphs replayed; a nudged running variance is named at the
 * step it was nudged. */
static void scopes_match_eager(sg_backend be, sg_dtype precision)
{
    sg_ctx *ctx = tu_ctx(be);
    spec s = draw();
    s.precision = precision;
    for (sg_scope sc = SG_SCOPE_EAGER; sc <= SG_SCOPE_STEP; sc++) {
        sg_verify_options o = sg_verify_options_default();
        o.scope = sc, o.steps = 7;
        sg_verify_result r;
        TU_OK(ctx, sg_verify(ctx, factory, &s, &o, &r));
        TU_CHECK(r.passed && r.steps == 7, "%s %s: passed %d, %lld steps, mismatch at %lld: %s", sg_dtype_name(precision),
                 sg_scope_name(sc), r.passed, (long long)r.steps, (long long)r.mismatch_step, r.mismatch);
        TU_CHECK(sc == SG_SCOPE_EAGER || (r.replayed == 7 - o.warmup && r.stats.replays > 0),
                 "%s: %lld steps replayed, %llu replays", sg_scope_name(sc), (long long)r.replayed,
                 (unsigned long long)r.stats.replays);
    }
    sg_verify_options o = sg_verify_options_default();
    o.scope = SG_SCOPE_STEP, o.steps = 8, o.user = &s, o.after_step = tamper;
    s.tamper_at = (int)tu_randint(1, 8);
    sg_verify_result r;
    TU_OK(ctx, sg_verify(ctx, factory, &s, &o, &r));
    TU_CHECK(!r.passed && r.mismatch_step == s.tamper_at && !strncmp(r.mismatch, "layer2.0.bn1.running_var (", 26),
             "running_var nudged after step %d: passed %d, mismatch at step %lld: %s", s.tamper_at, r.passed,
             (long long)r.mismatch_step, r.mismatch);
    sg_ctx_destroy(ctx);
}

static bool named(sg_model *m, bool buffers, const char *want)
{
    int n = buffers ? sg_model_buffer_tensors(m) : sg_model_param_tensors(m);
    for (int i = 0; i < n; i++) {
        const char *nm = NULL;
        if (buffers) sg_model_buffer_info(m, i, &nm, NULL, NULL);
        else sg_model_param_info(m, i, &nm, NULL, NULL);
        if (nm && !strcmp(nm, want)) return true;
    }
    return false;
}

/* torchvision's names (scopes pushed as "layer2.0" end whole at their pop: "fc" after them);
 * running statistics start at 0 and 1, move in training steps and not in
 * evaluation, survive a checkpoint into a model of another seed (evaluation then gives the same
 * loss bits); a step allocates nothing on the device. */
static void state_and_checkpoint(sg_backend be, sg_scope scope)
{
    sg_ctx *ctx = tu_ctx(be);
    spec s = draw();
    sg_model *m;
    TU_OK(ctx, factory(ctx, &s, &m));
    static const char *const params[] = {"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias",
                                         "layer1.0.conv2.weight", "layer2.0.downsample.0.weight",
                                         "layer2.0.downsample.1.bias", "fc.weight", "fc.bias"};
    for (size_t i = 0; i < sizeof params / sizeof *params; i++)
        TU_CHECK(named(m, false, params[i]), "no parameter '%s'", params[i]);
    static const char *const bufs[] = {"bn1.running_mean", "bn1.running_var", "layer1.0.bn2.running_var",
                                       "layer2.0.downsample.1.running_mean"};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) TU_CHECK(named(m, true, bufs[i]), "no buffer '%s'", bufs[i]);
    TU_CHECK(sg_model_buffer_tensors(m) == 2 * 6, "%d buffers, expected 12 (6 batch norms)", sg_model_buffer_tensors(m));
    TU_CHECK(!named(m, false, "conv1.running_mean") && !named(m, true, "bn1.weight"), "parameters and buffers mixed");
    int64_t nb = sg_tensor_numel(sg_model_buffers(m));
    float *b0 = malloc((size_t)nb * 4), *b1 = malloc((size_t)nb * 4), *b2 = malloc((size_t)nb * 4);
    TU_OK(ctx, sg_tensor_copy_to_host(sg_model_buffers(m), b0, (size_t)nb * 4));
    for (int i = 0; i < sg_model_buffer_tensors(m); i++) {
        const char *nm;
        int64_t off, n;
        TU_OK(ctx, sg_model_buffer_info(m, i, &nm, &off, &n));
        float want = strstr(nm, "running_var") ? 1.f : 0.f;
        for (int64_t j = 0; j < n; j++) TU_CHECK(b0[off + j] == want, "%s[%lld] = %g at first", nm, (long long)j, b0[off + j]);
    }
    sg_optim *o;
    sg_trainer *t;
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = scope;
    TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
    for (int st = 0; st < 5; st++) TU_OK(ctx, sg_trainer_step(t, st));
    sg_alloc_stats a0, a1;
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a0));
    for (int st = 5; st < 9; st++) TU_OK(ctx, sg_trainer_step(t, st));
    TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a1));
    TU_CHECK(a1.device_allocs == a0.device_allocs, "%s: %llu device allocations in 4 steps", sg_scope_name(scope),
             (unsigned long long)(a1.device_allocs - a0.device_allocs));
    TU_OK(ctx, sg_tensor_copy_to_host(sg_model_buffers(m), b1, (size_t)nb * 4));
    /* Buffers are aligned in the flat tensor: count their own elements, not the padding. */
    int64_t moved = 0, total = 0;
    for (int i = 0; i < sg_model_buffer_tensors(m); i++) {
        int64_t off, n;
        TU_OK(ctx, sg_model_buffer_info(m, i, NULL, &off, &n));
        for (int64_t j = off; j < off + n; j++) moved += b1[j] != b0[j];
        total += n;
    }
    TU_CHECK(moved == total, "training moved %lld of %lld running statistics", (long long)moved, (long long)total);
    float le;
    TU_OK(ctx, sg_trainer_eval(t, 0, 2, &le));
    TU_OK(ctx, sg_tensor_copy_to_host(sg_model_buffers(m), b2, (size_t)nb * 4));
    TU_CHECK(!memcmp(b1, b2, (size_t)nb * 4), "evaluation changed the running statistics");
    TU_CHECK(isfinite(le) && le > 0, "evaluation loss %g", le);
    char path[80];
    snprintf(path, sizeof path, "/tmp/sg_test_vision_%d.safetensors", (int)getpid());
    TU_OK(ctx, sg_trainer_save(t, 9, path));
    size_t len = 0;
    unsigned char *file = tu_file_read(path, &len);
    TU_CHECK(file && memmem(file, len, "\"layer2.0.downsample.1.running_var\"", 35), "checkpoint lacks a running_var");
    free(file);
    spec s2 = s;
    s2.seed++;
    sg_model *m2;
    sg_optim *o2;
    sg_trainer *t2;
    TU_OK(ctx, factory(ctx, &s2, &m2));
    TU_OK(ctx, sg_optim_create(ctx, m2, SG_OPTIM_ADAMW, &o2));
    TU_OK(ctx, sg_trainer_create(m2, o2, &to, &t2));
    int64_t step = 0;
    TU_OK(ctx, sg_trainer_load(t2, path, &step));
    unlink(path);
    TU_CHECK(step == 9, "loaded step %lld", (long long)step);
    TU_CHECK(tu_same_bits(sg_model_params(m), sg_model_params(m2), "loaded parameters", 0), "parameters differ");
    TU_CHECK(tu_same_bits(sg_model_buffers(m), sg_model_buffers(m2), "loaded buffers", 0), "buffers differ");
    float le2;
    TU_OK(ctx, sg_trainer_eval(t2, 0, 2, &le2));
    TU_CHECK(!memcmp(&le, &le2, 4), "evaluation loss after loading %.9g, before saving %.9g", le2, le);
    free(b0), free(b1), free(b2);
    sg_trainer_destroy(t2), sg_optim_destroy(o2), sg_model_destroy(m2);
    sg_trainer_destroy(t), sg_optim_destroy(o), sg_model_destroy(m);
    sg_ctx_destroy(ctx);
}

/* Trained on one batch again and again (AdamW, lr 1e-2), the loss falls below half of where it
 * began in 100 steps: over 300 seeds it ended at 0.25 of the start at worst, 0.1 typically. */
enum { LEARN_STEPS = 100 };
#define LEARN_LR 1e-2f
static void learns(sg_backend be, sg_dtype precision)
{
    sg_ctx *ctx = tu_ctx(be);
    spec s = draw();
    s.precision = precision;
    s.n = s.B; /* every step sees the same batch */
    sg_model *m;
    TU_OK(ctx, factory(ctx, &s, &m));
    sg_optim *o;
    sg_trainer *t;
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    TU_OK(ctx, sg_optim_set_lr(o, LEARN_LR));
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = SG_SCOPE_STEP;
    TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
    float l0 = 0, l1 = 0;
    for (int st = 0; st < LEARN_STEPS; st++) {
        TU_OK(ctx, sg_trainer_step(t, st));
        if (st == 0) TU_OK(ctx, sg_model_loss_read(m, &l0));
    }
    TU_OK(ctx, sg_model_loss_read(m, &l1));
    TU_CHECK(isfinite(l0) && l1 < l0 / 2, "%s: loss %g -> %g over 100 steps on one batch of %lld", sg_dtype_name(precision), l0, l1,
             (long long)s.B);
    sg_trainer_destroy(t), sg_optim_destroy(o), sg_model_destroy(m);
    sg_ctx_destroy(ctx);
}

/* Every parameter tensor's gradient at one random element against finite differences of
 * L = sum(c * logits) through the smooth network (no ReLU kinks, no max-pool ties), driven
 * module by module on the CPU. Central differences at 2h and h (h = 1e-2) combined by Richardson
 * extrapolation cancel the h^2 term: the truncation left is O(h^4 |L^(5)|), ~1e-4 relative
 * (measured up to 1e-4 over 1260 gradients); the f32 rounding of L (rows * classes terms of
 * O(1) after ~10 layers, ~1e-7 relative), over 2h with the extrapolation's 5/3: ~2e-5
 * (measured up to 1.5e-5): tolerance 1e-4 + 2e-3 |g|. A dropped branch in the residual
 * backward, a wrong stride or group mapping is off by O(|g|). */
static void finite_differences(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    spec s = draw();
    s.smooth = 1;
    sg_model *m;
    TU_OK(ctx, factory(ctx, &s, &m));
    int64_t nx = s.B * s.H * s.W * s.Cin, ny = s.B * s.classes, np = sg_tensor_numel(sg_model_params(m));
    float *xv = malloc((size_t)nx * 4), *c = malloc((size_t)ny * 4), *yv = malloc((size_t)ny * 4);
    float *p = malloc((size_t)np * 4), *g = malloc((size_t)np * 4);
    for (int64_t i = 0; i < nx; i++) xv[i] = (float)tu_normal();
    for (int64_t i = 0; i < ny; i++) c[i] = (float)tu_uniform(-1, 1);
    sg_tensor *xin = sg_model_input(m), *dy, *dx = NULL;
    TU_OK(ctx, sg_tensor_copy_from_host(xin, xv, (size_t)nx * 4));
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){s.B, s.classes}, "dy", &dy));
    TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(m), p, (size_t)np * 4));
    const sg_tensor *out = NULL;
#define LOSS(res)                                                                                   \
    do {                                                                                           \
        TU_OK(ctx, sg_tensor_copy_from_host(sg_model_params(m), p, (size_t)np * 4));               \
        TU_OK(ctx, sg_module_forward(m->net, xin, &out));                                          \
        TU_OK(ctx, sg_tensor_copy_to_host(out, yv, (size_t)ny * 4));                               \
        double l_ = 0;                                                                             \
        for (int64_t i_ = 0; i_ < ny; i_++) l_ += (double)c[i_] * yv[i_];                          \
        res = l_;                                                                                  \
    } while (0)
    double l0;
    LOSS(l0);
    TU_CHECK(isfinite(l0), "L = %g", l0);
    TU_OK(ctx, sg_tensor_copy_from_host(dy, c, (size_t)ny * 4));
    TU_OK(ctx, sg_tensor_fill(sg_model_grads(m), 0.0));
    TU_OK(ctx, sg_module_backward(m->net, dy, &dx));
    TU_OK(ctx, sg_tensor_copy_to_host(sg_model_grads(m), g, (size_t)np * 4));
    const double h = 1e-2;
    int big = 0;
    for (int i = 0; i < sg_model_param_tensors(m); i++) {
        const char *nm;
        int64_t off, n;
        TU_OK(ctx, sg_model_param_info(m, i, &nm, &off, &n));
        int64_t j = off + tu_randint(0, (int)n - 1);
        float keep = p[j];
        double fdh[2];
        for (int r = 0; r < 2; r++) { /* at 2h and h */
            double lp, lm, hh = h * (2 - r);
            p[j] = keep + (float)hh;
            LOSS(lp);
            p[j] = keep - (float)hh;
            LOSS(lm);
            p[j] = keep;
            fdh[r] = (lp - lm) / (2 * hh);
        }
        double fd = (4 * fdh[1] - fdh[0]) / 3; /* Richardson: the h^2 term cancels */
        big += fabs(fd) > 1e-3;
        TU_CHECK(fabs(fd - g[j]) <= 1e-4 + 2e-3 * fabs(fd), "%s[%lld]: gradient %g, finite differences %g", nm,
                 (long long)(j - off), g[j], fd);
    }
#undef LOSS
    /* Not vacuous: half the gradients are 10x the absolute tolerance or more (a conv bias before
     * a BN has none; over 60 seeds at least 15 of 21 were above 1e-3). */
    TU_CHECK(big >= sg_model_param_tensors(m) / 2, "only %d of %d gradients above 1e-3", big,
             sg_model_param_tensors(m));
    free(xv), free(c), free(yv), free(p), free(g);
    sg_tensor_destroy(dy);
    sg_model_destroy(m);
    sg_ctx_destroy(ctx);
}

/* The built-in ResNets have torchvision's parameter counts (its documented 11,689,512,
 * 21,797,672 and 25,557,032 at 1000 classes) and names, and a BN per conv in buffers. */
static void builtin_resnets(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    static const struct {
        const char *name, *param, *buffer;
        int64_t params;
        int bns;
    } want[] = {{"resnet18-1-32", "layer4.1.conv2.weight", "layer2.0.downsample.1.running_var", 11689512, 20},
                {"resnet34-1-32", "layer3.5.bn2.bias", "layer4.2.bn2.running_mean", 21797672, 36},
                {"resnet50-1-32", "layer3.5.conv3.weight", "layer4.0.downsample.1.running_mean", 25557032, 53}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        sg_model *m;
        TU_OK(ctx, sg_model_create(ctx, want[i].name, tu_next(), &m));
        int64_t total = 0;
        for (int p = 0; p < sg_model_param_tensors(m); p++) {
            int64_t n = 0;
            TU_OK(ctx, sg_model_param_info(m, p, NULL, NULL, &n));
            total += n;
        }
        TU_CHECK(total == want[i].params, "%s: %lld parameters, torchvision has %lld", want[i].name, (long long)total,
                 (long long)want[i].params);
        TU_CHECK(named(m, false, want[i].param) && named(m, false, "conv1.weight") && named(m, false, "fc.bias"),
                 "%s lacks %s, conv1.weight or fc.bias", want[i].name, want[i].param);
        TU_CHECK(named(m, true, want[i].buffer), "%s lacks buffer %s", want[i].name, want[i].buffer);
        TU_CHECK(sg_model_buffer_tensors(m) == 2 * want[i].bns, "%s: %d buffers, expected %d", want[i].name,
                 sg_model_buffer_tensors(m), 2 * want[i].bns);
        sg_model_destroy(m);
    }
    sg_ctx_destroy(ctx);
}

/* Bad arguments are refused, named, and the context trains afterwards. */
static void refusals(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = 2;
    bo.precision = SG_DTYPE_BF16;
    sg_builder *b;
    sg_module *m = NULL, *c = NULL;
    sg_tensor *x;
    const sg_tensor *y = NULL;
    /* In a bf16 model only the first convolution takes f32 images (it converts them). */
    TU_OK(ctx, sg_builder_create(ctx, "bf16", &bo, &b));
    TU_OK(ctx, sg_module_conv2d(b, "c", 8, 8, 3, 4, 3, 1, 1, 1, 0, &c));
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 4, (int64_t[]){2, 8, 8, 3}, "x32", &x));
    TU_OK(ctx, sg_tensor_fill(x, 0.5));
    TU_FAILS(ctx, sg_module_forward(c, x, &y), SG_ERR_SHAPE, "(2, 8, 8, 3) bf16 as its input");
    sg_tensor_destroy(x);
    sg_builder_destroy(b);
    bo.precision = SG_DTYPE_F32;
    TU_OK(ctx, sg_builder_create(ctx, "bad", &bo, &b));
    TU_FAILS(ctx, sg_module_conv2d(b, "c", 8, 8, 4, 6, 3, 1, 1, 3, 0, &m), SG_ERR_INVALID, "groups dividing");
    TU_FAILS(ctx, sg_module_conv2d(b, "c", 2, 2, 3, 4, 5, 1, 0, 1, 0, &m), SG_ERR_SHAPE, "spans more than");
    TU_FAILS(ctx, sg_module_batchnorm2d(b, "n", 4, 4, 3, SG_ACT_GELU, &m), SG_ERR_INVALID, "SG_ACT_RELU");
    TU_FAILS(ctx, sg_module_maxpool2d(b, "p", 8, 8, 3, 3, 2, 2, &m), SG_ERR_INVALID, "pad <= k / 2");
    TU_FAILS(ctx, sg_module_avgpool(b, "a", 0, 8, 3, &m), SG_ERR_SHAPE, ">= 1");
    TU_OK(ctx, sg_module_conv2d(b, "c", 8, 8, 3, 4, 3, 2, 1, 1, 0, &c));
    int64_t in[3] = {8, 8, 3}, out[3] = {4, 4, 4};
    TU_FAILS(ctx, sg_module_residual_block(b, "r", c, NULL, in, out, SG_ACT_RELU, &m), SG_ERR_SHAPE,
             "identity shortcut");
    /* A wrong input at forward: (2, 8, 8, 5) where (2, 8, 8, 3) was built. */
    TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 4, (int64_t[]){2, 8, 8, 5}, "x5", &x));
    TU_OK(ctx, sg_tensor_fill(x, 0.5));
    TU_FAILS(ctx, sg_module_forward(c, x, &y), SG_ERR_SHAPE, "'x5' is (2, 8, 8, 5)");
    sg_tensor_destroy(x);
    sg_builder_destroy(b);
    /* Still usable: a model trains a step in the same context. */
    spec s = draw();
    sg_model *mm;
    TU_OK(ctx, factory(ctx, &s, &mm));
    tu_trains_a_step(ctx, mm, "after the refusals");
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    sg_backend be;
    if (!tu_start("test_vision", argc, argv, &be)) return TU_SKIP;
    bool gpu = be == SG_BACKEND_CUDA;
    scopes_match_eager(be, SG_DTYPE_F32);
    scopes_match_eager(be, SG_DTYPE_BF16);
    state_and_checkpoint(be, SG_SCOPE_EAGER);
    state_and_checkpoint(be, SG_SCOPE_STEP);
    learns(be, SG_DTYPE_F32);
    learns(be, SG_DTYPE_BF16);
    refusals(be);
    if (!gpu) finite_differences(), builtin_resnets();
    return tu_finish("test_vision");
}
