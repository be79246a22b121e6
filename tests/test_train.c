/* test_train.c: the MLP end to end. `cpu`: the loss falls by a stated factor (AdamW and SGD),
 * no allocation after the first step, and the public API rejects bad input clearly and stays
 * usable. `gpu`: 20 steps on the GPU match 20 on the CPU (loss every step, every parameter at
 * the end), and after the first step a GPU step makes zero device allocations. Both: a bf16
 * GPT with the unscale folded into the optimizer bit for bit the separate passes, and without
 * loss scaling bit for bit the dynamic scaling's run. */
#include "testutil.h"

#include "train/model.h"

#include <unistd.h>

typedef struct run {
    sg_ctx *ctx;
    sg_model *m;
    sg_optim *o;
} run;

static run start(sg_backend be, const char *name, sg_optim_kind kind, float lr, uint64_t seed)
{
    run r = {tu_ctx(be), NULL, NULL};
    TU_OK(r.ctx, sg_model_create(r.ctx, name, seed, &r.m));
    TU_OK(r.ctx, sg_optim_create(r.ctx, r.m, kind, &r.o));
    TU_OK(r.ctx, sg_optim_set_lr(r.o, lr));
    return r;
}

static void step(run *r, int64_t s)
{
    TU_OK(r->ctx, sg_model_load_batch(r->m, s));
    TU_OK(r->ctx, sg_model_forward(r->m));
    TU_OK(r->ctx, sg_model_backward(r->m));
    TU_OK(r->ctx, sg_optim_step(r->o));
}

static void stop(run *r)
{
    sg_optim_destroy(r->o);
    sg_model_destroy(r->m);
    sg_alloc_stats st;
    TU_OK(r->ctx, sg_ctx_alloc_stats(r->ctx, &st));
    /* Only the context's own scratch buffers may remain. */
    TU_CHECK(st.live_blocks <= SG_SLOT_COUNT, "%llu blocks alive after destroying the model",
             (unsigned long long)st.live_blocks);
    sg_ctx_destroy(r->ctx);
}

/* Mean loss over the data set's batches, without updating (forward only). */
static double mean_loss(run *r, int nb)
{
    double s = 0;
    for (int b = 0; b < nb; b++) {
        float l;
        TU_OK(r->ctx, sg_model_load_batch(r->m, b));
        TU_OK(r->ctx, sg_model_forward(r->m));
        TU_OK(r->ctx, sg_model_loss_read(r->m, &l));
        s += l;
    }
    return s / nb;
}

static void cpu_learns(sg_optim_kind kind, float lr, double factor)
{
    run r = start(SG_BACKEND_CPU, "mlp-64-2-32", kind, lr, tu_next());
    double before = mean_loss(&r, 32);
    sg_alloc_stats a0, a1;
    step(&r, 0);
    TU_OK(r.ctx, sg_ctx_alloc_stats(r.ctx, &a0));
    for (int s = 1; s < 300; s++) step(&r, s);
    TU_OK(r.ctx, sg_ctx_alloc_stats(r.ctx, &a1));
    double after = mean_loss(&r, 32);
    printf("%s: mean loss %.4f -> %.4f over 300 steps\n", kind == SG_OPTIM_ADAMW ? "adamw" : "sgd",
           before, after);
    TU_CHECK(after < before / factor, "loss %.4f -> %.4f fell by less than %.1fx", before, after, factor);
    TU_CHECK(a1.device_allocs == a0.device_allocs, "%llu allocations after the first step",
             (unsigned long long)(a1.device_allocs - a0.device_allocs));
    stop(&r);
}

static void cpu_errors(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    sg_model *m = NULL;
    TU_FAILS(ctx, sg_model_create(ctx, "mlp-512-6", 1, &m), SG_ERR_INVALID, "unknown model 'mlp-512-6'");
    TU_FAILS(ctx, sg_model_create(ctx, "resnet-50", 1, &m), SG_ERR_INVALID, "expected mlp-WIDTH-DEPTH-BATCH");
    TU_FAILS(ctx, sg_model_create(ctx, "mlp-0-2-8", 1, &m), SG_ERR_INVALID, "unknown model");
    TU_CHECK(m == NULL, "model set on failure");
    sg_tensor *a = tu_tensor2(ctx, SG_DTYPE_F32, 4, 8, "a"), *b = tu_tensor2(ctx, SG_DTYPE_F32, 4, 9, "b");
    sg_tensor *h = tu_tensor2(ctx, SG_DTYPE_BF16, 4, 8, "h");
    TU_FAILS(ctx, sg_relu_forward(ctx, a, b), SG_ERR_SHAPE, "'y' is (4, 9) f32");
    TU_FAILS(ctx, sg_relu_forward(ctx, NULL, b), SG_ERR_NULL, "tensor 'x' is NULL");
    TU_FAILS(ctx, sg_relu_forward(ctx, h, a), SG_ERR_DTYPE, "'x' is (4, 8) bf16 but 'y' is (4, 8) f32");
    TU_FAILS(ctx, sg_tensor_copy_from_host(a, "abc", 3), SG_ERR_SHAPE, "3 bytes given");
    sg_tensor *t = NULL;
    TU_FAILS(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){4, -1}, "neg", &t), SG_ERR_SHAPE, "dimension 1 is -1");
    TU_FAILS(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 5, (int64_t[]){1, 1, 1, 1, 1}, "5d", &t), SG_ERR_SHAPE, "ndim 5");
    TU_FAILS(ctx, sg_tensor_view(a, 30, 1, (int64_t[]){8}, "v", &t), SG_ERR_SHAPE, "runs past 'a'");
    /* A tensor of another context is refused by name. */
    sg_ctx *other = tu_ctx(SG_BACKEND_CPU);
    sg_tensor *o = tu_tensor2(other, SG_DTYPE_F32, 4, 8, "foreign");
    TU_FAILS(ctx, sg_relu_forward(ctx, o, a), SG_ERR_BACKEND, "another context");
    sg_tensor_destroy(o);
    sg_ctx_destroy(other);
    /* After all that, the context still trains. */
    TU_OK(ctx, sg_model_create(ctx, "mlp-16-1-4", 3, &m));
    sg_optim *opt;
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &opt));
    TU_FAILS(ctx, sg_optim_set_lr(opt, -1.f), SG_ERR_INVALID, "lr -1");
    TU_FAILS(ctx, sg_model_load_batch(m, -5), SG_ERR_INVALID, "batch index -5");
    TU_OK(ctx, sg_model_forward(m));
    TU_OK(ctx, sg_model_backward(m));
    TU_OK(ctx, sg_optim_step(opt));
    sg_optim_hparams hp;
    TU_OK(ctx, sg_optim_get_hparams(opt, &hp));
    TU_CHECK(hp.step == 1.f, "step count %g after one step", hp.step);
    sg_optim_destroy(opt);
    sg_model_destroy(m);
    sg_tensor_destroy(a), sg_tensor_destroy(b), sg_tensor_destroy(h);
    /* A CUDA context in a build or machine without one fails with a clear message. */
    if (!sg_cuda_available()) {
        sg_ctx_options op = sg_ctx_options_default();
        op.backend = SG_BACKEND_CUDA;
        sg_ctx *c = NULL;
        TU_CHECK(sg_ctx_create(&op, &c) != SG_OK && c == NULL, "CUDA context without a GPU");
        TU_CHECK(strstr(sg_ctx_last_error(NULL), "CUDA") != NULL, "message: %s", sg_ctx_last_error(NULL));
    }
    /* TF32 is a CUDA context's: the CPU backend refuses it, naming it, and makes no context. */
    sg_ctx_options op = sg_ctx_options_default();
    op.backend = SG_BACKEND_CPU, op.tf32 = 1;
    sg_ctx *c = NULL;
    TU_CHECK(sg_ctx_create(&op, &c) == SG_ERR_INVALID && c == NULL, "a CPU context took tf32");
    TU_CHECK(strstr(sg_ctx_last_error(NULL), "tf32 is for CUDA contexts") != NULL, "message: %s",
             sg_ctx_last_error(NULL));
    /* So is timing matmul candidates (gemm_tune); a count out of range fails on any backend. */
    op.tf32 = 0, op.gemm_tune = tu_randint(1, 16);
    TU_CHECK(sg_ctx_create(&op, &c) == SG_ERR_INVALID && c == NULL, "a CPU context took gemm_tune %d", op.gemm_tune);
    TU_CHECK(strstr(sg_ctx_last_error(NULL), "gemm_tune is for CUDA contexts") != NULL, "message: %s",
             sg_ctx_last_error(NULL));
    op.gemm_tune = tu_randint(0, 1) ? -1 : 17;
    TU_CHECK(sg_ctx_create(&op, &c) == SG_ERR_INVALID && c == NULL, "gemm_tune %d taken", op.gemm_tune);
    char msg[64];
    snprintf(msg, sizeof msg, "gemm_tune is %d; expected 0 (off)", op.gemm_tune);
    TU_CHECK(strstr(sg_ctx_last_error(NULL), msg) != NULL, "message: %s", sg_ctx_last_error(NULL));
    sg_ctx_destroy(ctx);
}

/* Elements of got outside tol may be at most max_frac of all, and none may differ by more
 * than hard; prints the count, the share and the worst element. */
static void close_mostly(const char *what, const sg_tensor *got, const sg_tensor *ref, tu_tol tol,
                         double max_frac, double hard)
{
    double *g = tu_get(got), *r = tu_get(ref);
    int64_t n = got->numel, bad = 0, worst = 0;
    double worst_d = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(g[i] - r[i]);
        if (!(d <= tol.atol + tol.rtol * fabs(r[i]))) bad++;
        if (!(d <= worst_d)) worst_d = d, worst = i;
    }
    printf("%s: %lld of %lld outside atol %.0e rtol %.0e (%.4f%%), worst |diff| %.3g at [%lld]\n", what,
           (long long)bad, (long long)n, tol.atol, tol.rtol, 100.0 * bad / n, worst_d, (long long)worst);
    TU_CHECK(bad <= max_frac * n, "%s: %lld elements outside tolerance, more than %.3f%%", what,
             (long long)bad, 100 * max_frac);
    TU_CHECK(worst_d <= hard, "%s: worst |diff| %.3g > %.3g (got %.9g ref %.9g)", what, worst_d, hard,
             g[worst], r[worst]);
    free(g), free(r);
}

/* 20 steps on each backend from the same seed; the loss of every step and every parameter at
 * the end must agree. Both sides are f32 but accumulate GEMMs in different orders (cuBLAS vs
 * the double-accumulating reference), so they differ by rounding; how far that spreads depends
 * on the optimizer:
 * - SGD's update is linear in the gradient: parameters agree to f32 rounding, all of them.
 * - Adam divides by sqrt(v): a weight whose gradient is rounding noise (a ReLU that is dead for
 *   the batch but for one sample near its kink) gets an update of about +-lr on either side, in
 *   whatever direction the noise points. So elements may differ by up to a few lr after 20
 *   steps (seen on the H100: 141 of 1.58M by up to 1.2e-3 in one run, 95,770 by up to 5.9e-3 in
 *   another, with lr 1e-3); the test bounds their size (20 steps x 2 lr) and the loss. */
static void gpu_vs_cpu(sg_optim_kind kind, float lr, const char *name, uint64_t seed, tu_tol ptol,
                       double max_frac, double hard)
{
    run g = start(SG_BACKEND_CUDA, name, kind, lr, seed);
    run c = start(SG_BACKEND_CPU, name, kind, lr, seed);
    double lg[20], lc[20];
    for (int s = 0; s < 20; s++) {
        float a, b;
        step(&g, s);
        step(&c, s);
        TU_OK(g.ctx, sg_model_loss_read(g.m, &a));
        TU_OK(c.ctx, sg_model_loss_read(c.m, &b));
        lg[s] = a, lc[s] = b;
    }
    const char *on = kind == SG_OPTIM_ADAMW ? "adamw" : "sgd";
    char what[96];
    snprintf(what, sizeof what, "%s %s: loss per step, GPU vs CPU", name, on);
    tu_close(what, lg, lc, 20, (tu_tol){1e-5, 1e-3});
    printf("%s %s: loss step 1 %.5f / %.5f, step 20 %.5f / %.5f (GPU / CPU)\n", name, on, lg[0], lc[0],
           lg[19], lc[19]);
    snprintf(what, sizeof what, "%s %s: parameters after 20 steps", name, on);
    close_mostly(what, sg_model_params(g.m), sg_model_params(c.m), ptol, max_frac, hard);
    stop(&c);
    stop(&g);
}

/* Mixed precision, one micro-batch, no clipping: the trainer folds the unscale into the
 * optimizer (sg_amp_check, sg_adamw_step_amp). Against STEPGRAPH_UNSCALE=separate (sg_amp_unscale
 * into the f32 gradients, then sg_adamw_step): loss, parameters, bf16 gradients and scaler bit
 * for bit over 6 steps, eager and step scope. The f32 gradients, poisoned first, stay poisoned
 * on the folded side (nothing wrote them: the fold ran) and are finite on the other. */
static void fold_unscale(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    const uint64_t seed = tu_next();
    sg_model_options mo = {0};
    mo.precision = SG_DTYPE_BF16;
    const sg_scope scopes[2] = {SG_SCOPE_EAGER, SG_SCOPE_STEP};
    for (int k = 0; k < 2; k++) {
        sg_trainer_options to = sg_trainer_options_default();
        to.scope = scopes[k];
        tu_side a = tu_side_make(ctx, "gpt-64-2-4-16", seed, &mo, &to);
        TU_CHECK(setenv("STEPGRAPH_UNSCALE", "separate", 1) == 0, "setenv");
        tu_side b = tu_side_make(ctx, "gpt-64-2-4-16", seed, &mo, &to);
        TU_CHECK(unsetenv("STEPGRAPH_UNSCALE") == 0, "unsetenv");
        tu_poison(sg_model_grads(a.m)), tu_poison(sg_model_grads(b.m));
        bool ok = true;
        for (int s = 0; s < 6 && ok; s++) {
            TU_OK(ctx, sg_trainer_step(a.t, s));
            TU_OK(ctx, sg_trainer_step(b.t, s));
            ok = tu_same_bits(sg_model_loss(b.m), sg_model_loss(a.m), "loss (folded unscale)", s + 1) &&
                 tu_same_bits(sg_model_params(b.m), sg_model_params(a.m), "parameters (folded unscale)", s + 1) &&
                 tu_same_bits(sg_model_grads_lo(b.m), sg_model_grads_lo(a.m), "bf16 gradients (folded unscale)", s + 1) &&
                 tu_same_bits(sg_model_loss_scaler(b.m), sg_model_loss_scaler(a.m), "scaler (folded unscale)", s + 1);
        }
        double *ga = tu_get(sg_model_grads(a.m)), *gb = tu_get(sg_model_grads(b.m));
        int64_t n = sg_tensor_numel(sg_model_grads(a.m)), nan_a = 0, fin_b = 0;
        for (int64_t i = 0; i < n; i++) nan_a += isnan(ga[i]), fin_b += isfinite(gb[i]);
        TU_CHECK(nan_a == n, "%s scope: %lld of %lld f32 gradients written with the unscale folded",
                 sg_scope_name(scopes[k]), (long long)(n - nan_a), (long long)n);
        TU_CHECK(fin_b == n, "%s scope: %lld of %lld f32 gradients not finite with the unscale separate",
                 sg_scope_name(scopes[k]), (long long)(n - fin_b), (long long)n);
        free(ga), free(gb);
        tu_side_drop(&a), tu_side_drop(&b);
    }
    sg_ctx_destroy(ctx);
}

/* The optimizer family's bytes counted on ctx so far (sg_ctx_work). */
static double optim_bytes(const sg_ctx *ctx)
{
    sg_work w;
    sg_ctx_work(ctx, &w);
    return w.bytes[SG_WORK_OPTIMIZER];
}

/* Mixed precision without loss scaling (SG_LOSS_SCALING_NONE) against the default dynamic
 * scaling. The dynamic scale starts at 65536, a power of two, and multiplying by one is exact
 * in every op of the backward (each is linear in the gradient it receives, and each rounding
 * commutes with a power of two away from overflow and underflow); so the two runs' losses and
 * parameters agree bit for bit over 6 steps, and every bf16 gradient of the dynamic run is
 * exactly 65536 times the unscaled run's. Under eager and step scope with one micro-batch (the
 * check folded into the update), two (the f32 sum, unscaled after the last), clipping (the norm
 * of the unscaled gradients), and STEPGRAPH_UNSCALE=separate (the bf16 gradients widened into
 * the f32 ones instead of unscaled). The unscaled run's scaler stays {1, 0, 2000, 0}, and an
 * eager step of it counts 2P bytes of optimizer work fewer than the dynamic run's: the check's
 * read of the P bf16 gradients did not run. On the CPU also: a bad loss_scaling refused, the
 * scale refused by sg_trainer_set_scaler unless 1, and a checkpoint of the dynamic run resumed
 * without scaling at scale 1 with the same parameters. */
static void no_loss_scale(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    const uint64_t seed = tu_next();
    const char *name = "gpt-64-2-4-16";
    sg_model_options dyn = {0}, none = {0};
    dyn.precision = none.precision = SG_DTYPE_BF16;
    none.loss_scaling = SG_LOSS_SCALING_NONE;
    typedef struct cfg { sg_scope scope; int accum; float clip; const char *unscale; } cfg;
    const cfg cfgs[] = {{SG_SCOPE_EAGER, 1, 0.f, NULL},
                        {SG_SCOPE_STEP, 1, 0.f, NULL},
                        {SG_SCOPE_STEP, 2, 0.f, NULL},
                        {SG_SCOPE_STEP, 1, 1e-3f, NULL},
                        {SG_SCOPE_EAGER, 1, 0.f, "separate"}};
    for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; c++) {
        sg_trainer_options to = sg_trainer_options_default();
        to.scope = cfgs[c].scope, to.accum = cfgs[c].accum, to.clip = cfgs[c].clip;
        if (cfgs[c].unscale) TU_CHECK(setenv("STEPGRAPH_UNSCALE", cfgs[c].unscale, 1) == 0, "setenv");
        tu_side a = tu_side_make(ctx, name, seed, &dyn, &to);
        tu_side b = tu_side_make(ctx, name, seed, &none, &to);
        if (cfgs[c].unscale) TU_CHECK(unsetenv("STEPGRAPH_UNSCALE") == 0, "unsetenv");
        const int64_t P = sg_tensor_numel(sg_model_params(a.m));
        double da = 0, db = 0;
        bool ok = true;
        for (int s = 0; s < 6 && ok; s++) {
            double w0 = optim_bytes(ctx);
            TU_OK(ctx, sg_trainer_step(a.t, s));
            double w1 = optim_bytes(ctx);
            TU_OK(ctx, sg_trainer_step(b.t, s));
            double w2 = optim_bytes(ctx);
            da = w1 - w0, db = w2 - w1;
            ok = tu_same_bits(sg_model_loss(b.m), sg_model_loss(a.m), "loss (no loss scaling)", s + 1) &&
                 tu_same_bits(sg_model_params(b.m), sg_model_params(a.m), "parameters (no loss scaling)", s + 1);
            double *ga = tu_get(sg_model_grads_lo(a.m)), *gb = tu_get(sg_model_grads_lo(b.m));
            int64_t n = sg_tensor_numel(sg_model_grads_lo(a.m)), off = 0, nonzero = 0;
            for (int64_t i = 0; i < n; i++) off += !(isfinite(gb[i]) && ga[i] == gb[i] * 65536.0), nonzero += gb[i] != 0;
            TU_CHECK(off == 0 && nonzero > n / 2, "config %zu step %d: %lld of %lld bf16 gradients are not 1/65536 "
                     "of the scaled run's (%lld nonzero)", c, s + 1, (long long)off, (long long)n, (long long)nonzero);
            ok = ok && off == 0;
            free(ga), free(gb);
        }
        sg_loss_scaler sa, sb;
        TU_OK(ctx, sg_trainer_get_scaler(a.t, &sa));
        TU_OK(ctx, sg_trainer_get_scaler(b.t, &sb));
        TU_CHECK(sa.scale == 65536.f && sa.skipped == 0.f && sa.good_steps == 6.f,
                 "config %zu: dynamic scaler {%g, %g, %g, %g}, expected 65536, 6 good steps, none skipped", c,
                 (double)sa.scale, (double)sa.good_steps, (double)sa.growth_interval, (double)sa.skipped);
        TU_CHECK(sb.scale == 1.f && sb.good_steps == 0.f && sb.growth_interval == 2000.f && sb.skipped == 0.f,
                 "config %zu: scaler without loss scaling {%g, %g, %g, %g}, expected {1, 0, 2000, 0}", c,
                 (double)sb.scale, (double)sb.good_steps, (double)sb.growth_interval, (double)sb.skipped);
        if (cfgs[c].scope == SG_SCOPE_EAGER && !cfgs[c].unscale)
            TU_CHECK(da - db == 2.0 * (double)P, "config %zu: an eager step's optimizer bytes %.0f with dynamic "
                     "scaling, %.0f without: expected 2P = %lld fewer (the check's read)", c, da, db, (long long)(2 * P));
        if (c == 0 && be == SG_BACKEND_CPU) {
            sg_loss_scaler two = sb;
            two.scale = 2.f;
            TU_CHECK(sg_trainer_set_scaler(b.t, &two) == SG_ERR_INVALID &&
                         strstr(sg_ctx_last_error(ctx), "without loss scaling"),
                     "sg_trainer_set_scaler(scale 2) on a model without loss scaling: %s", sg_ctx_last_error(ctx));
            TU_OK(ctx, sg_trainer_set_scaler(b.t, &sb));
            char dir[64], path[96];
            tu_tempdir(dir, sizeof dir, "noscale");
            snprintf(path, sizeof path, "%s/a.safetensors", dir);
            TU_OK(ctx, sg_trainer_save(a.t, 6, path));
            int64_t step = -1;
            TU_OK(ctx, sg_trainer_load(b.t, path, &step));
            TU_OK(ctx, sg_trainer_get_scaler(b.t, &sb));
            TU_CHECK(step == 6 && sb.scale == 1.f && sb.good_steps == 6.f,
                     "a dynamic run's checkpoint resumed without loss scaling: step %lld, scale %g, %g good steps: "
                     "expected 6, 1, 6", (long long)step, (double)sb.scale, (double)sb.good_steps);
            tu_same_bits(sg_model_params(b.m), sg_model_params(a.m), "parameters (resumed)", 6);
            remove(path), rmdir(dir);
        }
        tu_side_drop(&a), tu_side_drop(&b);
    }
    if (be == SG_BACKEND_CPU) {
        sg_model_options bad = none;
        bad.loss_scaling = (sg_loss_scaling)7;
        sg_model *m = NULL;
        TU_CHECK(sg_model_create_ex(ctx, name, seed, &bad, &m) == SG_ERR_INVALID && !m &&
                     strstr(sg_ctx_last_error(ctx), "loss_scaling 7"),
                 "loss_scaling 7: %s", sg_ctx_last_error(ctx));
        TU_OK(ctx, sg_model_create_ex(ctx, name, seed, &none, &m)); /* the context stays usable */
        tu_trains_a_step(ctx, m, "without loss scaling, after a refused loss_scaling");
    }
    sg_ctx_destroy(ctx);
}

/* sqrt(sum g^2) of a tensor, in double on the host. */
static double host_norm(const sg_tensor *g)
{
    double *v = tu_get(g), s = 0;
    for (int64_t i = 0; i < sg_tensor_numel(g); i++) s += v[i] * v[i];
    free(v);
    return sqrt(s);
}

/* Clipping folded into the optimizer (sg_clip_factor, then the update multiplying the f32
 * gradients by the factor as it reads them; under mixed precision sg_clip_sumsq_amp and the
 * update unscaling and clipping the bf16 gradients as it reads them) against
 * STEPGRAPH_CLIP=separate (the unscale pass, sg_clip_grad_norm scaling the f32 gradients, then
 * the update) and, under mixed precision, against STEPGRAPH_UNSCALE=separate too (the unscale
 * pass, then the clip folded): loss, parameters, norm (and under mixed precision the scaler)
 * bit for bit over 6 steps, fp32 and bf16, eager and step scope, SGD and AdamW, with a max_norm
 * below every step's norm. Then which path ran, the f32 gradients poisoned first: the separate
 * side's are clipped (norm max_norm norm / (norm + 1e-6), to the f32 products' rounding: rtol
 * 1e-6); the folded side's fp32 ones are the unclipped ones (their norm is the measured one, to
 * the rounding of two f64 sums of f32 squares: rtol 1e-6 is far above it), and its bf16 run
 * wrote none (still poisoned); the unscale-separate side's are unclipped. */
static void fold_clip(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    const uint64_t seed = tu_next();
    const sg_dtype precs[2] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    const sg_scope scopes[2] = {SG_SCOPE_EAGER, SG_SCOPE_STEP};
    const float max_norm = 0.05f;
    for (int k = 0; k < 4; k++) {
        sg_model_options mo = {0};
        mo.precision = precs[k / 2];
        const bool amp = mo.precision == SG_DTYPE_BF16;
        sg_trainer_options to = sg_trainer_options_default();
        to.scope = scopes[k % 2];
        to.clip = max_norm;
        const sg_optim_kind kind = k == 1 ? SG_OPTIM_SGD : SG_OPTIM_ADAMW;
        char what[96];
        snprintf(what, sizeof what, "%s %s %s scope %s, clipping folded", sg_backend_name(be),
                 sg_dtype_name(precs[k / 2]), sg_scope_name(scopes[k % 2]), kind == SG_OPTIM_SGD ? "SGD" : "AdamW");
        /* a: folded; b: STEPGRAPH_CLIP=separate; c (mixed precision): STEPGRAPH_UNSCALE=separate */
        tu_side sd[3] = {{0}};
        const char *env[3][2] = {{NULL, NULL}, {"STEPGRAPH_CLIP", "separate"}, {"STEPGRAPH_UNSCALE", "separate"}};
        const int n_sides = amp ? 3 : 2;
        for (int j = 0; j < n_sides; j++) {
            if (env[j][0]) TU_CHECK(setenv(env[j][0], env[j][1], 1) == 0, "setenv");
            TU_OK(ctx, sg_model_create_ex(ctx, "gpt-64-2-4-16", seed, &mo, &sd[j].m));
            TU_OK(ctx, sg_optim_create(ctx, sd[j].m, kind, &sd[j].o));
            if (kind == SG_OPTIM_SGD) TU_OK(ctx, sg_optim_set_lr(sd[j].o, 0.1f));
            TU_OK(ctx, sg_trainer_create(sd[j].m, sd[j].o, &to, &sd[j].t));
            if (env[j][0]) TU_CHECK(unsetenv(env[j][0]) == 0, "unsetenv");
            tu_poison(sg_model_grads(sd[j].m));
        }
        bool ok = true;
        float n0 = 0;
        for (int s = 0; s < 6 && ok; s++) {
            for (int j = 0; j < n_sides; j++) TU_OK(ctx, sg_trainer_step(sd[j].t, s));
            for (int j = 1; j < n_sides && ok; j++) {
                const sg_model *a = sd[0].m, *b = sd[j].m;
                ok = tu_same_bits(b->loss, a->loss, what, s + 1) &&
                     tu_same_bits(sg_model_params((sg_model *)b), sg_model_params((sg_model *)a), what, s + 1) &&
                     tu_same_bits(b->gnorm, a->gnorm, what, s + 1) &&
                     (!b->scaler || tu_same_bits(b->scaler, a->scaler, what, s + 1));
            }
            float n;
            TU_OK(ctx, sg_tensor_copy_to_host(sd[0].m->gnorm, &n, sizeof n));
            TU_CHECK(n > max_norm, "%s: step %d's norm %g is not above max_norm %g: nothing clipped", what, s, n,
                     (double)max_norm);
            n0 = n;
        }
        const double want_b = (double)max_norm * n0 / (n0 + 1e-6);
        const double nb = host_norm(sg_model_grads(sd[1].m));
        TU_CHECK(fabs(nb - want_b) <= 1e-6 * want_b, "%s: with STEPGRAPH_CLIP=separate the gradients' norm is %.9g, "
                 "expected %.9g (clipped)", what, nb, want_b);
        if (amp) {
            double *ga = tu_get(sg_model_grads(sd[0].m));
            int64_t n = sg_tensor_numel(sg_model_grads(sd[0].m)), written = 0;
            for (int64_t i = 0; i < n; i++) written += !isnan(ga[i]);
            TU_CHECK(written == 0, "%s: %lld of %lld f32 gradients written with the unscale and the clip folded",
                     what, (long long)written, (long long)n);
            free(ga);
        }
        const double na = host_norm(sg_model_grads(sd[amp ? 2 : 0].m));
        TU_CHECK(fabs(na - n0) <= 1e-6 * n0, "%s: the f32 gradients' norm is %.9g%s, the measured one %.9g: not "
                 "the unclipped gradients", what, na, amp ? " with STEPGRAPH_UNSCALE=separate" : "", (double)n0);
        for (int j = 0; j < n_sides; j++) tu_side_drop(&sd[j]);
    }
    sg_ctx_destroy(ctx);
}

static void gpu_no_allocations(const char *name)
{
    run g = start(SG_BACKEND_CUDA, name, SG_OPTIM_ADAMW, 1e-3f, tu_next());
    step(&g, 0);
    sg_alloc_stats a0, a1;
    TU_OK(g.ctx, sg_ctx_sync(g.ctx));
    TU_OK(g.ctx, sg_ctx_alloc_stats(g.ctx, &a0));
    uint64_t k0 = sg_ctx_launch_count(g.ctx);
    for (int s = 1; s < 101; s++) step(&g, s);
    TU_OK(g.ctx, sg_ctx_sync(g.ctx));
    TU_OK(g.ctx, sg_ctx_alloc_stats(g.ctx, &a1));
    TU_CHECK(a1.device_allocs == a0.device_allocs, "%llu device allocations in 100 GPU steps",
             (unsigned long long)(a1.device_allocs - a0.device_allocs));
    printf("%s: %llu device allocations in 100 steps after the first; %.1f launches per step\n", name,
           (unsigned long long)(a1.device_allocs - a0.device_allocs),
           (double)(sg_ctx_launch_count(g.ctx) - k0) / 100.0);
    stop(&g);
}

static void gpu_suite(void)
{
    /* SG_TEST_MODEL picks a smaller model for the sanitizers, which slow cuBLAS down 100x. */
    const char *name = getenv("SG_TEST_MODEL") ? getenv("SG_TEST_MODEL") : "mlp-512-6-32";
    /* The model's seed is fixed, not drawn: 20 steps of two backends that round differently
     * are chaotic at ReLU's kink. A pre-activation within rounding of 0 is active on one
     * backend and not on the other, so that sample's gradient differs by far more than
     * rounding, and later steps carry it on (Adam amplifies it: a weight whose gradient is
     * noise moves by about lr either way). With drawn seeds this test failed in 6 of 296 runs
     * on the H100 (2026-11-25, 4 runs at a time and alone alike): SGD with 1 to 3 of 1.58M
     * parameters past the rounding rule (by up to 1e-4, inside the hard bound), Adam with the
     * loss off by 1.1e-3 of itself after 12 to 16 steps. Where the flips fall depends on the
     * seed, not on the code; with a fixed seed the kernels (deterministic, bit for bit on
     * repeat: test_linear gpu) give one outcome, the same on every run. The op tests draw
     * fresh inputs on every run. */
    gpu_vs_cpu(SG_OPTIM_SGD, 1e-2f, name, 1, (tu_tol){2e-5, 1e-3}, 0.0, 1e-3);
    /* Adam: the share of parameters that drift is seed-dependent (0.001% to 6% seen on the H100
     * with identical code), so it is reported, not bounded; the drift itself is bounded, and the
     * loss trajectory must match. SGD above checks the whole pipeline's gradients tightly, and
     * test_optim checks Adam's arithmetic element by element. */
    gpu_vs_cpu(SG_OPTIM_ADAMW, 1e-3f, name, 2, (tu_tol){2e-4, 1e-3}, 1.0, 20 * 2 * 1e-3);
    gpu_no_allocations(name);
    fold_unscale(SG_BACKEND_CUDA);
    fold_clip(SG_BACKEND_CUDA);
    no_loss_scale(SG_BACKEND_CUDA);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_train");
    if (!strcmp(mode, "gpu")) {
        gpu_suite();
    } else {
        cpu_learns(SG_OPTIM_ADAMW, 3e-3f, 3.0);
        cpu_learns(SG_OPTIM_SGD, 5e-2f, 2.0);
        cpu_errors();
        fold_unscale(SG_BACKEND_CPU);
        fold_clip(SG_BACKEND_CPU);
        no_loss_scale(SG_BACKEND_CPU);
    }
    return tu_finish("test_train");
}
