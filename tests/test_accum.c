/* test_accum.c: gradient accumulation (sg_trainer_options.accum). The op that sums
 * (sg_accumulate: y = beta y + alpha x) against its rounding rule, bit for bit on both backends;
 * K micro-batches of B rows against one batch of K*B rows (gradients and loss within a bound
 * derived from the reordered f32 sums); every scope bit for bit against eager over accumulated
 * steps (mlp fp32, gpt bf16 with dropout and clipping, a step graph of two accumulated steps);
 * dropout masks fresh for each micro-batch (bit for bit against micro-batches run by hand); a
 * checkpoint resumed at the right batch; refusals. `cpu`: the CPU backend; `gpu`: the op and
 * the scopes on CUDA (exit 77 without a GPU). */
#include "testutil.h"
#include "ops/accum.h"
#include "train/model.h"

static const double U = 0x1p-24; /* f32's unit roundoff */

/* ---- the op ---- */

/* What sg_accumulate must give, written out: f32(alpha x) and f32(beta y) (0 when beta is 0,
 * whatever y holds), then their f32 sum; double products of floats are exact, and a double sum
 * of two floats rounded to float is the f32 sum. */
static float want_accum(float y, float beta, float x, float alpha)
{
    float p = (float)((double)alpha * x), q = beta == 0.f ? 0.f : (float)((double)beta * y);
    return (float)((double)q + (double)p);
}

static void op_case(sg_ctx *ctx, sg_dtype xdt, int64_t n, bool odd, float beta, float alpha)
{
    sg_tensor *ybase, *xbase;
    sg_tensor *y = tu_maybe_view(ctx, SG_DTYPE_F32, 1, &n, odd, "y", &ybase);
    sg_tensor *x = tu_maybe_view(ctx, xdt, 1, &n, odd && n % 2, "x", &xbase);
    double *xv = tu_random(x, -4, 4), *yv = tu_random(y, -4, 4);
    if (beta == 0.f) tu_poison(y); /* NaN: must not be read */
    double *x_stored = tu_get(x);  /* bf16: the rounded values the op reads */
    TU_OK(ctx, sg_accumulate(ctx, y, beta, x, alpha));
    double *got = tu_get(y);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++) {
        float w = want_accum((float)yv[i], beta, (float)x_stored[i], alpha);
        if (memcmp(&w, &(float){(float)got[i]}, 4)) bad = i;
    }
    TU_CHECK(bad < 0, "sg_accumulate %s x, n %lld%s, beta %g, alpha %g: element %lld is %.9g, expected %.9g",
             sg_dtype_name(xdt), (long long)n, odd ? " (unaligned)" : "", beta, alpha, (long long)bad,
             bad >= 0 ? got[bad] : 0, bad >= 0 ? want_accum((float)yv[bad], beta, (float)x_stored[bad], alpha) : 0);
    free(xv), free(yv), free(x_stored), free(got);
    sg_tensor *ts[] = {y, x, ybase, xbase};
    tu_destroy_all(ts, 4);
}

static void op(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    const float third = 1.0f / 3.0f;
    const float fb[][2] = {{0.f, 1.f}, {1.f, 1.f}, {0.f, third}, {1.f, third}, {third, 1.f}};
    int64_t sizes[] = {1, 7, 4096 + 3, tu_randint(1, 50000)};
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (size_t f = 0; f < sizeof fb / sizeof *fb; f++)
                op_case(ctx, d ? SG_DTYPE_BF16 : SG_DTYPE_F32, sizes[s], s == 2, fb[f][0], fb[f][1]);
    /* Refusals, naming the tensor: y must be f32, of x's size, apart from x. */
    sg_tensor *a = tu_tensor1(ctx, SG_DTYPE_F32, 8, "a"), *h = tu_tensor1(ctx, SG_DTYPE_BF16, 8, "h");
    sg_tensor *c = tu_tensor1(ctx, SG_DTYPE_F32, 9, "c");
    TU_FAILS(ctx, sg_accumulate(ctx, h, 1.f, a, 1.f), SG_ERR_DTYPE, "'y'");
    TU_FAILS(ctx, sg_accumulate(ctx, c, 1.f, a, 1.f), SG_ERR_SHAPE, "same number of elements");
    TU_FAILS(ctx, sg_accumulate(ctx, a, 1.f, a, 1.f), SG_ERR_INVALID, "overlap");
    TU_FAILS(ctx, sg_accumulate(ctx, a, NAN, h, 1.f), SG_ERR_INVALID, "finite factors");
    sg_tensor_destroy(a), sg_tensor_destroy(h), sg_tensor_destroy(c);
    printf("sg_accumulate on %s: f32 and bf16 x, aligned and not, beta 0 never reads y: bit for bit\n",
           be == SG_BACKEND_CUDA ? "CUDA" : "the CPU");
    sg_ctx_destroy(ctx);
}

/* ---- training ---- */

typedef tu_side side;

static void drop(side *s) { tu_side_drop(s); }

static float *host_floats(const sg_tensor *t)
{
    float *v = malloc(sg_tensor_nbytes(t));
    TU_OK(t->ctx, sg_tensor_copy_to_host(t, v, sg_tensor_nbytes(t)));
    return v;
}

static float loss_of(sg_model *m)
{
    float l = NAN;
    TU_OK(m->ctx, sg_model_loss_read(m, &l));
    return l;
}

/* K micro-batches of an mlp of batch B against one batch of K*B rows of the same model (same
 * seed: the same initial parameters, and the first K*B samples of its data set are the small
 * model's batches 0..K-1), one step each, on the CPU. The bound, per gradient element i:
 *
 * - the CPU reference computes every op in double and rounds each result once to f32, so a
 *   micro-batch's gradient S_k (its rows' sum) and the big batch's S are each within u|.| of
 *   their exact sums, u = 2^-24;
 * - the big batch rounds the sum over all rows once; the micro-batches round each S_k and then
 *   add them in f32, K-1 more roundings of partial sums no larger than A = sum_k |S_k|: so
 *   |acc - big| <= (K + 1) u A, and (K + 2) u A leaves room for the doubles' own rounding;
 * - for K a power of two 1/K is exact, (1/K)/B equals 1/(K*B) in double, and every row's
 *   gradient is bit for bit the same in both runs, so that is all; for K = 3, f32(1/3) is off by
 *   u/2 relatively, which each row's loss gradient carries (plus its f32 rounding, u) through
 *   the backward, whose ops round again relative to magnitudes that cancellation can hide from
 *   A: a norm-wise term (D + 2) 4u max_i A_i per tensor covers it (D hidden layers, the head and
 *   the loss).
 *
 * A comes from the micro-batches' own gradients, G_k / K, each from a model of batch B
 * trained with lr 0. A missing 1/K, or an overwrite where a sum belongs, misses by ~|g|, some
 * 10^6 times the bound. */
static void matches_big_batch(int K)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    uint64_t seed = tu_next();
    int W = tu_randint(8, 40), D = 2, B = tu_randint(2, 6);
    char small[64], big[64];
    snprintf(small, sizeof small, "mlp-%d-%d-%d", W, D, B);
    snprintf(big, sizeof big, "mlp-%d-%d-%d", W, D, K * B);
    sg_model_options mo = {0};
    sg_trainer_options ta = sg_trainer_options_default(), tb = sg_trainer_options_default();
    ta.accum = K;
    side a = tu_side_make(ctx, small, seed, &mo, &ta), b = tu_side_make(ctx, big, seed, &mo, &tb);
    side r = tu_side_make(ctx, small, seed, &mo, &tb);
    TU_OK(ctx, sg_optim_set_lr(r.o, 0.f));
    TU_CHECK(tu_same_bits(sg_model_params(a.m), sg_model_params(b.m), "initial parameters", 0), "%s and %s", small, big);
    int64_t P = sg_tensor_numel(sg_model_grads(a.m));
    double *A = calloc((size_t)P, sizeof *A);
    for (int k = 0; k < K; k++) { /* G_k: micro-batch k's gradient at full scale */
        TU_OK(ctx, sg_trainer_step(r.t, k));
        float *g = host_floats(sg_model_grads(r.m));
        for (int64_t i = 0; i < P; i++) A[i] += fabs((double)g[i]) / K;
        free(g);
    }
    TU_OK(ctx, sg_trainer_step(a.t, 0));
    TU_OK(ctx, sg_trainer_step(b.t, 0));
    float *ga = host_floats(sg_model_grads(a.m)), *gb = host_floats(sg_model_grads(b.m));
    bool pow2 = (K & (K - 1)) == 0;
    double worst = 0;
    const char *worst_name = "";
    int64_t worst_i = 0;
    for (int p = 0; p < sg_model_param_tensors(a.m); p++) {
        const char *name;
        int64_t off, n;
        TU_OK(ctx, sg_model_param_info(a.m, p, &name, &off, &n));
        double amax = 0;
        for (int64_t i = off; i < off + n; i++) amax = fmax(amax, A[i]);
        for (int64_t i = off; i < off + n; i++) {
            double tol = (K + 2) * U * A[i] * (1 + 1e-6) + (pow2 ? 0 : (D + 2) * 4 * U * amax);
            double d = fabs((double)ga[i] - gb[i]), q = d == 0 ? 0 : tol > 0 ? d / tol : INFINITY;
            if (q > worst) worst = q, worst_name = name, worst_i = i;
        }
    }
    TU_CHECK(worst <= 1, "%s accum %d vs %s: %s element %lld: %.9g vs %.9g, %.3g of the bound", small, K, big,
             worst_name, (long long)worst_i, ga[worst_i], gb[worst_i], worst);
    /* The loss: the mean of K micro-batch means (each l_k / K rounded, then summed) against one
     * mean over K*B rows; losses are positive, so no cancellation: (2K + 2) u |l|. */
    float la = loss_of(a.m), lb = loss_of(b.m);
    TU_CHECK(fabs((double)la - lb) <= (2 * K + 2) * U * fabs((double)lb), "loss %.9g vs %.9g", la, lb);
    printf("%s, %d micro-batches vs %s: gradients within %.2f of the bound, loss %.7f vs %.7f\n", small, K, big,
           worst, la, lb);
    free(ga), free(gb), free(A);
    drop(&r), drop(&b), drop(&a);
    sg_ctx_destroy(ctx);
}

/* Eager and `scope` side by side, both accumulating K micro-batches a step, for `steps` steps:
 * loss, gradients, parameters (and the bf16 copies, the dropout offset) bit for bit after each. */
static void scope_bit_exact(sg_backend be, const char *name, sg_dtype prec, float dropout, float clip, sg_scope scope,
                            int K, int per_call, int steps)
{
    sg_ctx *ctx = tu_ctx(be);
    uint64_t seed = tu_next();
    sg_model_options mo = {.precision = prec, .dropout = dropout};
    sg_trainer_options eo = sg_trainer_options_default(), go = sg_trainer_options_default();
    eo.accum = go.accum = K;
    eo.clip = go.clip = clip;
    go.scope = scope;
    go.steps_per_call = per_call;
    side e = tu_side_make(ctx, name, seed, &mo, &eo), g = tu_side_make(ctx, name, seed, &mo, &go);
    bool ok = true;
    for (int s = 0; s < steps && ok; s += per_call) {
        for (int k = 0; k < per_call; k++) TU_OK(ctx, sg_trainer_step(e.t, s + k));
        TU_OK(ctx, sg_trainer_step(g.t, s));
        int n = s + per_call;
        ok = tu_same_bits(sg_model_loss(e.m), sg_model_loss(g.m), "loss", n) &&
             tu_same_bits(sg_model_grads(e.m), sg_model_grads(g.m), "gradients", n) &&
             tu_same_bits(sg_model_params(e.m), sg_model_params(g.m), "parameters", n) &&
             tu_same_bits(e.m->scaler, g.m->scaler, "loss scaler", n);
        if (ok && e.m->rng) ok = tu_same_bits(e.m->rng, g.m->rng, "dropout offset", n);
        if (ok && prec == SG_DTYPE_BF16)
            ok = tu_same_bits(e.m->params->flat_lo, g.m->params->flat_lo, "bf16 parameter copies", n);
    }
    sg_trainer_stats ts;
    TU_OK(ctx, sg_trainer_get_stats(g.t, &ts));
    int calls = steps / per_call, replayed = calls - go.warmup;
    TU_CHECK(!ts.fell_back, "fell back: %s", ts.fallback_reason);
    if (scope == SG_SCOPE_STEP)
        TU_CHECK(ts.graphs == 1 && ts.replays == (uint64_t)replayed, "step scope: %d graphs, %llu replays, expected "
                 "1 and %d", ts.graphs, (unsigned long long)ts.replays, replayed);
    else if (scope == SG_SCOPE_MODEL) /* the forward and backward graphs replay once a micro-batch */
        TU_CHECK(ts.graphs == 2 && ts.replays == (uint64_t)(2 * K * replayed), "model scope: %d graphs, %llu "
                 "replays, expected 2 and %d", ts.graphs, (unsigned long long)ts.replays, 2 * K * replayed);
    else
        TU_CHECK(ts.graphs >= 2 && ts.replays == (uint64_t)ts.graphs * K * replayed, "layer scope: %d graphs, %llu "
                 "replays, expected %d", ts.graphs, (unsigned long long)ts.replays, ts.graphs * K * replayed);
    /* The gradients' bytes count the fp32 sum (bf16: the f32 gradients are the sum). */
    TU_CHECK(ts.grad_bytes >= (size_t)(prec == SG_DTYPE_BF16 ? 6 : 8) * (size_t)sg_model_param_count(g.m),
             "grad_bytes %zu for %lld parameters", ts.grad_bytes, (long long)sg_model_param_count(g.m));
    printf("%s %s%s%s %s scope, %d micro-batches a step%s: %d steps bit-exact with eager; %d graphs, %llu replays\n",
           name, prec == SG_DTYPE_BF16 ? "bf16" : "fp32", dropout > 0 ? ", dropout" : "", clip > 0 ? ", clipping" : "",
           sg_scope_name(scope), K, per_call > 1 ? ", 2 steps a graph" : "", steps, ts.graphs,
           (unsigned long long)ts.replays);
    drop(&g), drop(&e);
    sg_ctx_destroy(ctx);
}

/* A step of 2 micro-batches against the same two run by hand with the public calls (load,
 * forward with the loss, backward, the dropout offset advanced between them), on a gpt with
 * dropout. 1/2 is a power of two and every op of the backward is linear in the gradient it
 * gets, rounding once per result, so micro-batch k's gradient at scale 1/2 is exactly half its
 * gradient at scale 1: the step's gradients must be f32(g0/2 + g1/2) bit for bit, its loss
 * f32(l0/2 + l1/2), its generator two offsets on (masks drawn twice from one offset give
 * another g1). bf16: g_k are the backward's bf16 gradients, scaled by the loss scale S, and
 * the step's are f32(g0/2 + g1/2) times f32(1/S); the scaler moves once (one good step). Then
 * an overflow (S set to inf) skips one step, counted once, whatever the micro-batches. */
static void by_hand(sg_backend be, sg_dtype prec)
{
    sg_ctx *ctx = tu_ctx(be);
    uint64_t seed = tu_next();
    const char *name = be == SG_BACKEND_CUDA ? "gpt-128-2-4-32" : "gpt-64-1-2-16";
    bool bf16 = prec == SG_DTYPE_BF16;
    sg_model_options mo = {.dropout = 0.2f, .precision = prec};
    sg_trainer_options to = sg_trainer_options_default();
    to.accum = 2;
    side a = tu_side_make(ctx, name, seed, &mo, &to);
    sg_model *h;
    TU_OK(ctx, sg_model_create_ex(ctx, name, seed, &mo, &h));
    TU_CHECK(tu_same_bits(a.m->rng, h->rng, "generator", 0), "the two models start from other generators");
    sg_loss_scaler sc0;
    TU_OK(ctx, sg_tensor_copy_to_host(h->scaler, &sc0, sizeof sc0));
    const sg_tensor *hg = bf16 ? h->params->grad_flat_lo : sg_model_grads(h);
    int64_t P = sg_tensor_numel(sg_model_grads(h));
    double *g[2];
    float l[2];
    for (int k = 0; k < 2; k++) {
        TU_OK(ctx, sg_model_load_batch(h, k));
        TU_OK(ctx, sg_model_forward(h));
        TU_OK(ctx, sg_model_backward(h));
        TU_OK(ctx, sg_rng_advance(ctx, h->rng));
        g[k] = tu_get(hg); /* bf16 read exactly */
        l[k] = loss_of(h);
    }
    TU_OK(ctx, sg_trainer_step(a.t, 0));
    float *ga = host_floats(sg_model_grads(a.m));
    float inv = 1.0f / sc0.scale;
    int64_t bad = -1;
    float want = 0;
    for (int64_t i = 0; i < P && bad < 0; i++) {
        float half0 = 0.5f * (float)g[0][i], half1 = 0.5f * (float)g[1][i]; /* exact */
        want = (float)((double)half0 + (double)half1);
        if (bf16) want = (float)((double)want * inv);
        if (memcmp(&want, &ga[i], 4)) bad = i;
    }
    TU_CHECK(bad < 0, "%s %s, 2 micro-batches with dropout: gradient %lld is %.9g, by hand %.9g", name,
             sg_dtype_name(prec), (long long)bad, bad >= 0 ? ga[bad] : 0, want);
    float lw = (float)((double)(0.5f * l[0]) + (double)(0.5f * l[1])), la = loss_of(a.m);
    TU_CHECK(!memcmp(&lw, &la, 4), "loss %.9g, by hand %.9g", la, lw);
    TU_CHECK(tu_same_bits(a.m->rng, h->rng, "generator after the step", 1), "the step did not advance the dropout "
             "offset once per micro-batch");
    sg_loss_scaler sc;
    TU_OK(ctx, sg_trainer_get_scaler(a.t, &sc));
    TU_CHECK(sc.good_steps == (bf16 ? 1.f : 0.f) && sc.skipped == 0.f && sc.scale == sc0.scale,
             "after one step of 2 micro-batches the scaler holds %g good steps, %g skipped, scale %g", sc.good_steps,
             sc.skipped, sc.scale);
    if (bf16) {
        float inf = INFINITY;
        double *before = tu_get(sg_model_params(a.m));
        TU_OK(ctx, sg_tensor_write_small(a.m->scaler, 0, &inf, sizeof inf));
        TU_OK(ctx, sg_trainer_step(a.t, 1));
        TU_OK(ctx, sg_trainer_get_scaler(a.t, &sc));
        TU_CHECK(sc.skipped == 1.f && sc.good_steps == 0.f && sc.scale == SG_LOSS_SCALE_MAX,
                 "an overflow in both micro-batches: %g skipped, %g good steps, scale %g (expected 1, 0, %g)",
                 sc.skipped, sc.good_steps, sc.scale, SG_LOSS_SCALE_MAX);
        double *after = tu_get(sg_model_params(a.m));
        TU_CHECK(!memcmp(before, after, (size_t)P * sizeof *before), "the skipped step changed the parameters");
        free(before), free(after);
    }
    printf("%s %s dropout 0.2: a step of 2 micro-batches is the 2 run by hand, fresh masks each, bit for bit%s\n",
           name, sg_dtype_name(prec), bf16 ? "; the scaler moved once; an overflow skipped one step" : "");
    free(g[0]), free(g[1]), free(ga);
    sg_model_destroy(h);
    drop(&a);
    sg_ctx_destroy(ctx);
}

/* Checkpoints: a run of 6 accumulated steps equals 3 steps, a save, a fresh trainer that loads
 * it and runs steps 3..5 (step 3 trains on batch 3*K next), bit for bit. A trainer of another
 * accum resumes at the step that starts at the saving run's next batch (batch 6: step 2 of 3
 * batches, step 6 of 1), or refuses the checkpoint when none does (accum 4; accum 2 after
 * step 5 of 1). */
static void checkpoint_resume(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    uint64_t seed = tu_next();
    const char *name = "mlp-32-2-8";
    int K = 2;
    char dir[256], path[300], path1[300];
    tu_tempdir(dir, sizeof dir, "accum");
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
    snprintf(path1, sizeof path1, "%s/ck1.safetensors", dir);
    sg_model_options mo = {0};
    sg_trainer_options to = sg_trainer_options_default(), t1 = sg_trainer_options_default(),
                       t3 = sg_trainer_options_default();
    to.accum = K, to.scope = SG_SCOPE_STEP, t3.accum = 3;
    side whole = tu_side_make(ctx, name, seed, &mo, &to), first = tu_side_make(ctx, name, seed, &mo, &to);
    for (int s = 0; s < 6; s++) TU_OK(ctx, sg_trainer_step(whole.t, s));
    for (int s = 0; s < 3; s++) TU_OK(ctx, sg_trainer_step(first.t, s));
    TU_OK(ctx, sg_trainer_save(first.t, 3, path));
    side again = tu_side_make(ctx, name, seed, &mo, &to); /* the seed makes the data set too */
    TU_OK(ctx, sg_trainer_step(again.t, 5));                        /* state the load must replace */
    int64_t at = -1;
    TU_OK(ctx, sg_trainer_load(again.t, path, &at));
    TU_CHECK(at == 3, "resumed at step %lld, expected 3", (long long)at);
    for (int64_t s = at; s < 6; s++) TU_OK(ctx, sg_trainer_step(again.t, s));
    tu_same_bits(sg_model_params(whole.m), sg_model_params(again.m), "parameters after a resume", 6);
    side other = tu_side_make(ctx, name, seed, &mo, &t3), one = tu_side_make(ctx, name, seed, &mo, &t1);
    TU_OK(ctx, sg_trainer_load(other.t, path, &at));
    TU_CHECK(at == 2, "a trainer of 3 batches a step resumed at step %lld, expected 2 (batch 6)", (long long)at);
    TU_OK(ctx, sg_trainer_load(one.t, path, &at));
    TU_CHECK(at == 6, "a trainer of 1 batch a step resumed at step %lld, expected 6", (long long)at);
    TU_CHECK(tu_same_bits(sg_model_params(one.m), sg_model_params(first.m), "loaded parameters", 3), "accum 1");
    t3.accum = 4;
    side four = tu_side_make(ctx, name, seed, &mo, &t3);
    TU_FAILS(ctx, sg_trainer_load(four.t, path, &at), SG_ERR_INVALID, "its next batch, 6, starts no step of this "
             "trainer's 4 batches");
    TU_OK(ctx, sg_trainer_save(one.t, 5, path1));
    TU_FAILS(ctx, sg_trainer_load(again.t, path1, &at), SG_ERR_INVALID, "step 5 of 1 batch each (accum 1)");
    printf("checkpoint: 6 accumulated steps, saved at 3 and resumed, bit-exact; accum 3 and 1 resume at batch 6, "
           "accum 4 refused\n");
    drop(&four), drop(&one), drop(&other), drop(&again), drop(&first), drop(&whole);
    remove(path), remove(path1), remove(dir);
    sg_ctx_destroy(ctx);
}

/* Refusals: accum outside 1..1024, with batch or sequence buckets, with a fed data set; a
 * step index whose batches overflow. */
static void refusals(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    sg_model *m;
    sg_optim *o;
    sg_trainer *t = NULL;
    tu_model_optim(ctx, "mlp-16-2-8", &m, &o);
    sg_trainer_options to = sg_trainer_options_default();
    TU_CHECK(to.accum == 1, "default accum %d", to.accum);
    to.accum = 0;
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "sg_trainer_options.accum 0");
    to.accum = 1025;
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "accum 1025: expected 1 to 1024");
    to.accum = -3;
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "accum -3");
    int64_t rows[] = {4, 8};
    to.accum = 2, to.batch_buckets = rows, to.n_buckets = 2;
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "1 with batch or sequence buckets");
    TU_CHECK(t == NULL, "trainer set on failure");
    to = sg_trainer_options_default();
    to.accum = 1024;
    TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
    TU_FAILS(ctx, sg_trainer_step(t, -1), SG_ERR_INVALID, "step -1");
    TU_FAILS(ctx, sg_trainer_step(t, INT64_MAX / 1000), SG_ERR_INVALID, "i*accum");
    sg_trainer_destroy(t);
    sg_optim_destroy(o);
    sg_model_destroy(m);
    /* A gpt with sequence buckets. */
    TU_OK(ctx, sg_model_create(ctx, "gpt-64-1-2-16", 1, &m));
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    int64_t lens[] = {8, 16};
    to = sg_trainer_options_default();
    to.accum = 3, to.seq_buckets = lens, to.n_seq_buckets = 2;
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "accum 3");
    sg_optim_destroy(o);
    sg_model_destroy(m);
    /* A model fed from the host, a batch a step. */
    int64_t B = 4, IN = 6;
    sg_builder_options bo = sg_builder_options_default();
    bo.batch = B;
    sg_builder *b;
    sg_module *l;
    sg_dataset *fd;
    TU_OK(ctx, sg_builder_create(ctx, "fed", &bo, &b));
    TU_OK(ctx, sg_module_linear(b, "fc", IN, 3, 1, SG_ACT_NONE, &l));
    TU_OK(ctx, sg_dataset_create_fed(ctx, SG_DTYPE_F32, 2, (int64_t[]){B, IN}, SG_DTYPE_I32, 1, &B, &fd));
    TU_OK(ctx, sg_builder_finish(b, l, SG_LOSS_SOFTMAX_XENT, fd, 1, &m));
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_ADAMW, &o));
    to = sg_trainer_options_default();
    to.accum = 2;
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_UNSUPPORTED, "steps_per_call and accum must be 1");
    sg_optim_destroy(o);
    sg_model_destroy(m);
    printf("refused: accum 0, 1025, -3, with batch or sequence buckets, with fed data; steps past int64\n");
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    sg_backend be;
    if (!tu_start("test_accum", argc, argv, &be)) {
        printf("SKIP: no CUDA device (or a CPU-only build): GPU tests need a GPU; run scripts/gpu-check.sh on a "
               "machine with one\n");
        return TU_SKIP;
    }
    bool gpu = be == SG_BACKEND_CUDA;
    op(be);
    if (!gpu)
        for (int K = 2; K <= 4; K++) matches_big_batch(K);
    const char *mlp = gpu ? "mlp-512-6-32" : "mlp-64-2-32", *gpt = gpu ? "gpt-128-2-4-32" : "gpt-64-1-4-16";
    for (int sc = SG_SCOPE_LAYER; sc <= SG_SCOPE_STEP; sc++) {
        scope_bit_exact(be, mlp, SG_DTYPE_F32, 0, 0, (sg_scope)sc, 3, 1, 6);
        scope_bit_exact(be, gpt, SG_DTYPE_BF16, 0.1f, 0.5f, (sg_scope)sc, 3, 1, 6);
    }
    scope_bit_exact(be, gpt, SG_DTYPE_F32, 0.1f, 0, SG_SCOPE_STEP, 2, 2, 10); /* 2 steps of 2 a graph */
    by_hand(be, SG_DTYPE_F32);
    by_hand(be, SG_DTYPE_BF16);
    checkpoint_resume(be);
    refusals(be);
    return tu_finish("test_accum");
}
