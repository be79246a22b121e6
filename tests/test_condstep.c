/* test_condstep.c: the trainer's control flow on the device (sg_trainer_options loop, skip_if,
 * vary_seq, early stop), each against eager training bit for bit: the micro-batches and the
 * steps of a call as WHILE nodes (fewer graph nodes than unrolled, the same numbers); the
 * optimizer update in a conditional node on the overflow flag with an overflow forced between
 * two replays (that step skipped, the others taken); every sequence bucket a branch of a
 * SWITCH chosen by the device's gather, over a run that draws every length 1..max, several
 * steps a launch (one graph, and the lengths are sg_vary_len's: an eager trainer fed them by
 * hand agrees); early stop on a target loss and on non-finite losses at the step the host
 * model says, later calls running nothing; the same results with conditional nodes disabled
 * (the note says so); refusals. `cpu`: the CPU plan backend; `gpu`: CUDA's conditional nodes
 * (exit 77 without a GPU). */
#include "testutil.h"
#include "train/model.h"

typedef tu_side side;

/* tu_side_make with lr 1e-3. */
static side make(sg_ctx *ctx, const char *name, uint64_t seed, const sg_model_options *mo,
                 const sg_trainer_options *to)
{
    side s = tu_side_make(ctx, name, seed, mo, to);
    TU_OK(ctx, sg_optim_set_lr(s.o, 1e-3f));
    return s;
}

static void drop(side *s) { tu_side_drop(s); }

/* Loss, gradients, parameters and loss scaler of a and b bit for bit after call `call`. */
static bool same(side *a, side *b, const char *what, int call)
{
    bool ok = tu_same_bits(a->m->loss, b->m->loss, what, call);
    ok = ok && tu_same_bits(sg_model_grads(a->m), sg_model_grads(b->m), what, call);
    if (sg_model_grads_lo(a->m)) ok = ok && tu_same_bits(sg_model_grads_lo(a->m), sg_model_grads_lo(b->m), what, call);
    ok = ok && tu_same_bits(sg_model_params(a->m), sg_model_params(b->m), what, call);
    ok = ok && tu_same_bits(a->m->scaler, b->m->scaler, what, call);
    TU_CHECK(ok, "%s: eager and the graph differ after call %d", what, call);
    return ok;
}

static sg_trainer_stats stats_of(side *s)
{
    sg_trainer_stats st;
    TU_OK(s->m->ctx, sg_trainer_get_stats(s->t, &st));
    return st;
}

/* ---- loop: micro-batches and steps as WHILE nodes ---- */

/* accum K micro-batches, per_call steps a call, step scope with loop against eager and against
 * the unrolled graph: bit for bit after every call, and the loop's graph smaller. */
static void loop_case(sg_backend be, const char *name, sg_dtype prec, int K, int per_call, int calls)
{
    sg_ctx *ctx = tu_ctx(be);
    uint64_t seed = tu_next();
    sg_model_options mo = {.precision = prec, .dropout = strncmp(name, "gpt", 3) ? 0.f : 0.1f};
    sg_trainer_options eo = sg_trainer_options_default();
    eo.accum = K, eo.steps_per_call = per_call, eo.clip = 0.5f;
    sg_trainer_options uo = eo, lo = eo;
    uo.scope = lo.scope = SG_SCOPE_STEP;
    lo.loop = 1;
    side e = make(ctx, name, seed, &mo, &eo), u = make(ctx, name, seed, &mo, &uo), l = make(ctx, name, seed, &mo, &lo);
    char what[96];
    snprintf(what, sizeof what, "%s %s loop accum %d x %d steps a call", name, sg_dtype_name(prec), K, per_call);
    bool ok = true;
    for (int c = 0; c < calls && ok; c++) {
        TU_OK(ctx, sg_trainer_step(e.t, (int64_t)c * per_call));
        TU_OK(ctx, sg_trainer_step(u.t, (int64_t)c * per_call));
        TU_OK(ctx, sg_trainer_step(l.t, (int64_t)c * per_call));
        ok = same(&e, &l, what, c + 1) && same(&e, &u, what, c + 1);
    }
    sg_trainer_stats su = stats_of(&u), sl = stats_of(&l);
    TU_CHECK(sl.replays == (uint64_t)(calls - 3) && su.replays == sl.replays && !sl.fell_back && !sl.cond_note[0],
             "%s: %llu replays (unrolled %llu) of %d calls, fell back %d, note '%s'", what,
             (unsigned long long)sl.replays, (unsigned long long)su.replays, calls, sl.fell_back, sl.cond_note);
    /* The loop holds one copy of the repeated body where unrolling holds K - 2 (micro-batches)
     * and per_call (steps): its nodes must be fewer whenever something repeats. */
    if (K > 2 || per_call > 1)
        TU_CHECK(sl.nodes < su.nodes, "%s: the loop's graph has %d nodes, the unrolled one %d", what, sl.nodes,
                 su.nodes);
    printf("%s: %d calls bit-exact with eager and unrolled; %d nodes against %d unrolled\n", what, calls, sl.nodes,
           su.nodes);
    drop(&l), drop(&u), drop(&e);
    sg_ctx_destroy(ctx);
}

/* ---- skip_if: the update in a conditional node on the overflow flag ---- */

static void skip_if_case(sg_backend be, const char *name)
{
    sg_ctx *ctx = tu_ctx(be);
    uint64_t seed = tu_next();
    sg_model_options mo = {.precision = SG_DTYPE_BF16};
    sg_trainer_options eo = sg_trainer_options_default();
    eo.clip = 0.5f;
    sg_trainer_options go = eo;
    go.scope = SG_SCOPE_STEP, go.skip_if = 1;
    side e = make(ctx, name, seed, &mo, &eo), g = make(ctx, name, seed, &mo, &go);
    int steps = 12, bad = tu_randint(go.warmup + 2, steps - 2); /* after the capture: between two replays */
    int64_t P = sg_tensor_numel(sg_model_params(g.m));
    float *before = malloc((size_t)P * 4), *after = malloc((size_t)P * 4);
    bool ok = true;
    for (int i = 0; i < steps && ok; i++) {
        if (i == bad) {
            sg_loss_scaler sc;
            TU_OK(ctx, sg_trainer_get_scaler(e.t, &sc));
            sc.scale = INFINITY; /* the loss times inf: every gradient overflows */
            TU_OK(ctx, sg_trainer_set_scaler(e.t, &sc));
            TU_OK(ctx, sg_trainer_set_scaler(g.t, &sc));
            TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(g.m), before, (size_t)P * 4));
        }
        TU_OK(ctx, sg_trainer_step(e.t, i));
        TU_OK(ctx, sg_trainer_step(g.t, i));
        ok = same(&e, &g, "skip_if", i + 1);
        sg_loss_scaler sc;
        TU_OK(ctx, sg_trainer_get_scaler(g.t, &sc));
        TU_CHECK(sc.skipped == (i >= bad ? 1.f : 0.f), "skip_if: after step %d, %g steps skipped (overflow at %d)",
                 i + 1, sc.skipped, bad + 1);
        TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(g.m), after, (size_t)P * 4));
        if (i == bad) TU_CHECK(!memcmp(before, after, (size_t)P * 4), "skip_if: the overflowing step %d moved the "
                               "parameters", i + 1);
        if (i == bad + 1) TU_CHECK(memcmp(before, after, (size_t)P * 4), "skip_if: step %d after the overflow "
                                   "did not move the parameters", i + 1);
    }
    sg_trainer_stats s = stats_of(&g);
    TU_CHECK(s.replays >= (uint64_t)(steps - go.warmup - 1) && !s.cond_note[0], "skip_if: %llu replays, note '%s'",
             (unsigned long long)s.replays, s.cond_note);
    printf("%s bf16 skip_if: an overflow forced at step %d skipped that step only, %d steps bit-exact with eager\n",
           name, bad + 1, steps);
    free(before), free(after);
    drop(&g), drop(&e);
    sg_ctx_destroy(ctx);
}

/* ---- vary_seq: every bucket a branch of a SWITCH ---- */

/* Eager vary_seq (gpt: sequence lengths) or vary_batch (mlp: rows), the SWITCH graph (per_call
 * steps a launch) and an eager trainer fed sg_vary_len's sizes by hand (sg_trainer_step_seq or
 * _rows), until every size 1..max has been drawn. */
static void switch_case(sg_backend be, const char *name, sg_dtype prec, int per_call)
{
    sg_ctx *ctx = tu_ctx(be);
    uint64_t seed = tu_next();
    long long w, d, B, T;
    bool seq = !strncmp(name, "gpt", 3);
    if (seq) TU_CHECK(sscanf(name, "gpt-%lld-%lld-%lld-%lld", &w, &d, &B, &T) == 4, "%s", name);
    else TU_CHECK(sscanf(name, "mlp-%lld-%lld-%lld", &w, &d, &T) == 3, "%s", name); /* T: the rows */
    /* Random increasing buckets ending at a random max <= T (a single bucket sometimes). */
    int64_t lens[8];
    int n = 0;
    int64_t max = tu_randint((int)T / 2, (int)T);
    for (int64_t v = tu_randint(1, 4); v < max && n < 7; v += tu_randint(1, (int)max / 2)) lens[n++] = v;
    lens[n++] = max;
    sg_model_options mo = {.precision = prec, .dropout = seq ? 0.1f : 0.f};
    sg_trainer_options eo = sg_trainer_options_default();
    if (seq) eo.seq_buckets = lens, eo.n_seq_buckets = n, eo.vary_seq = 1;
    else eo.batch_buckets = lens, eo.n_buckets = n, eo.vary_batch = 1;
    eo.clip = 0.5f, eo.steps_per_call = per_call;
    sg_trainer_options go = eo, ho = eo;
    go.scope = SG_SCOPE_STEP;
    ho.vary_seq = ho.vary_batch = 0, ho.steps_per_call = 1;
    side e = make(ctx, name, seed, &mo, &eo), g = make(ctx, name, seed, &mo, &go), h = make(ctx, name, seed, &mo, &ho);
    bool seen[1024] = {false};
    int n_seen = 0, c = 0;
    char what[128];
    snprintf(what, sizeof what, "%s %s %s buckets ..%lld (%d), %d steps a launch", name, sg_dtype_name(prec),
             seq ? "vary_seq" : "vary_batch", (long long)max, n, per_call);
    bool ok = true;
    for (; ok && c < 400 && (n_seen < max || c < go.warmup + 3); c++) {
        int64_t first = (int64_t)c * per_call;
        TU_OK(ctx, sg_trainer_step(e.t, first));
        TU_OK(ctx, sg_trainer_step(g.t, first));
        for (int k = 0; k < per_call; k++) {
            int64_t len = sg_vary_len(first + k, max);
            TU_OK(ctx, seq ? sg_trainer_step_seq(h.t, first + k, len) : sg_trainer_step_rows(h.t, first + k, len));
            if (!seen[len]) seen[len] = true, n_seen++;
        }
        ok = same(&e, &g, what, c + 1) && same(&e, &h, what, c + 1);
    }
    TU_CHECK(n_seen == max, "%s: %d of the %lld lengths drawn in %d calls", what, n_seen, (long long)max, c);
    sg_trainer_stats s = stats_of(&g);
    TU_CHECK(s.graphs == 1 && s.cache.cached == 0 && s.replays == (uint64_t)(c - go.warmup) && !s.cond_note[0],
             "%s: %d graphs (%d cached), %llu replays of %d calls, note '%s'", what, s.graphs, s.cache.cached,
             (unsigned long long)s.replays, c, s.cond_note);
    printf("%s: %d calls (every length 1..%lld) bit-exact with eager; 1 graph of %d nodes\n", what, c,
           (long long)max, s.nodes);
    drop(&h), drop(&g), drop(&e);
    sg_ctx_destroy(ctx);
}

/* ---- early stop ---- */

/* A reference run without a rule records each step's loss; then eager and step scope with the
 * rule "loss <= the loss of a chosen step" (or, with nonfinite, a NaN written into a parameter
 * at a chosen step and a streak of N) must stop after the step the host model says, with the
 * parameters of that step, and run nothing in later calls. */
static void stop_case(sg_backend be, const char *name, bool nonfinite, int per_call)
{
    sg_ctx *ctx = tu_ctx(be);
    uint64_t seed = tu_next();
    sg_model_options mo = {0};
    sg_trainer_options ro = sg_trainer_options_default();
    ro.steps_per_call = per_call;
    int calls = 12, total = calls * per_call;
    side r = make(ctx, name, seed, &mo, &ro);
    int64_t P = sg_tensor_numel(sg_model_params(r.m));
    float *loss = malloc((size_t)total * 4), **params = calloc((size_t)total, sizeof *params);
    /* The NaN goes in between two calls, past the capture: its first step starts a call. */
    int poison_at = tu_randint(ro.warmup + 1, calls - 3) * per_call, N = tu_randint(1, 3);
    const char *pname;
    int64_t off, n;
    /* The head's last parameter (not the flat buffer's padding; past every ReLU, which could
     * swallow a NaN): the loss is NaN from that step on. */
    TU_OK(ctx, sg_model_param_info(r.m, sg_model_param_tensors(r.m) - 1, &pname, &off, &n));
    int64_t poison_elem = off + tu_randint(0, (int)n - 1);
    for (int c = 0; c < calls; c++) {
        /* The reference steps one at a time (a call of per_call steps reads only its last loss). */
        for (int k = 0; k < per_call; k++) {
            int i = c * per_call + k;
            if (nonfinite && i == poison_at)
                TU_OK(ctx, sg_tensor_write_small(sg_model_params(r.m), (size_t)poison_elem * 4, &(float){NAN}, 4));
            sg_trainer_destroy(r.t);
            sg_trainer_options one = ro;
            one.steps_per_call = 1, one.warmup = 1 << 20; /* eager */
            TU_OK(ctx, sg_trainer_create(r.m, r.o, &one, &r.t));
            TU_OK(ctx, sg_trainer_step(r.t, i));
            TU_OK(ctx, sg_model_loss_read(r.m, &loss[i]));
            params[i] = malloc((size_t)P * 4);
            TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(r.m), params[i], (size_t)P * 4));
        }
    }
    /* The host model of the rule. */
    sg_trainer_options so = ro;
    int expect = -1; /* the 0-based step after which the run stops */
    if (nonfinite) {
        so.stop_nonfinite = N;
        for (int i = 0, streak = 0; i < total && expect < 0; i++)
            if ((streak = isfinite(loss[i]) ? 0 : streak + 1) >= N) expect = i;
    } else {
        /* A step past the capture whose loss is below every earlier one (a running minimum:
         * the rule first holds there), chosen at random among them. */
        int cand[256], nc = 0;
        float lo = INFINITY;
        for (int i = 0; i < total; i++) {
            if (loss[i] < lo && i >= (ro.warmup + 1) * per_call && nc < 256) cand[nc++] = i;
            lo = fminf(lo, loss[i]);
        }
        TU_CHECK(nc > 0, "stop: no step past the capture lowers the loss (%d steps)", total);
        int j = nc ? cand[tu_randint(0, nc - 1)] : 0;
        so.stop_on_loss = 1, so.stop_loss = loss[j];
        for (int i = 0; i < total && expect < 0; i++)
            if (loss[i] <= so.stop_loss) expect = i;
    }
    TU_CHECK(expect >= 0, "stop: the rule never holds in the reference run");
    for (int sc = 0; sc < 2 && expect >= 0; sc++) {
        sg_trainer_options o = so;
        o.scope = sc ? SG_SCOPE_STEP : SG_SCOPE_EAGER;
        side s = make(ctx, name, seed, &mo, &o);
        for (int c = 0; c < calls; c++) {
            if (nonfinite && poison_at == c * per_call)
                TU_OK(ctx, sg_tensor_write_small(sg_model_params(s.m), (size_t)poison_elem * 4, &(float){NAN}, 4));
            TU_OK(ctx, sg_trainer_step(s.t, (int64_t)c * per_call));
        }
        sg_trainer_stop st;
        TU_OK(ctx, sg_trainer_get_stop(s.t, &st));
        sg_stop_reason want = nonfinite ? SG_STOPPED_NONFINITE : SG_STOPPED_LOSS;
        TU_CHECK(st.steps_run == expect + 1 && st.stopped == want, "stop (%s, %s, %d a call): ran %lld steps, "
                 "reason %d; expected %d steps, reason %d", nonfinite ? "non-finite" : "target", sc ? "step" : "eager",
                 per_call, (long long)st.steps_run, (int)st.stopped, expect + 1, (int)want);
        float *p = malloc((size_t)P * 4);
        TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(s.m), p, (size_t)P * 4));
        TU_CHECK(!memcmp(p, params[expect], (size_t)P * 4), "stop (%s): the parameters are not those after step %d",
                 sc ? "step" : "eager", expect + 1);
        free(p);
        printf("%s %s stop (%s), %d steps a call: stopped after step %d of %d as the host model says\n", name,
               sc ? "step scope" : "eager", nonfinite ? "non-finite loss" : "target loss", per_call, expect + 1, total);
        drop(&s);
    }
    for (int i = 0; i < total; i++) free(params[i]);
    free(params), free(loss);
    drop(&r);
    sg_ctx_destroy(ctx);
}

/* ---- without conditional nodes, and refusals ---- */

static void disabled_case(sg_backend be)
{
    setenv("STEPGRAPH_DISABLE_CONDITIONALS", "1", 1);
    sg_ctx *ctx = tu_ctx(be);
    uint64_t seed = tu_next();
    sg_model_options mo = {0};
    sg_trainer_options eo = sg_trainer_options_default();
    eo.accum = 3;
    sg_trainer_options go = eo;
    go.scope = SG_SCOPE_STEP, go.loop = 1;
    side e = make(ctx, "mlp-32-2-8", seed, &mo, &eo), g = make(ctx, "mlp-32-2-8", seed, &mo, &go);
    for (int i = 0; i < 6; i++) {
        TU_OK(ctx, sg_trainer_step(e.t, i));
        TU_OK(ctx, sg_trainer_step(g.t, i));
        same(&e, &g, "loop without conditional nodes", i + 1);
    }
    sg_trainer_stats s = stats_of(&g);
    TU_CHECK(strstr(s.cond_note, "loop (unrolled instead)") && strstr(s.cond_note, "STEPGRAPH_DISABLE_CONDITIONALS") &&
                 s.replays == 3 && !s.fell_back,
             "without conditional nodes: note '%s', %llu replays, fell back %d", s.cond_note,
             (unsigned long long)s.replays, s.fell_back);
    printf("loop with STEPGRAPH_DISABLE_CONDITIONALS=1: unrolled, bit-exact, said: %s\n", s.cond_note);
    drop(&g), drop(&e);
    unsetenv("STEPGRAPH_DISABLE_CONDITIONALS");
    sg_ctx_destroy(ctx);
}

static void refusals(sg_backend be)
{
    sg_ctx *ctx = tu_ctx(be);
    sg_model *m;
    sg_optim *o;
    tu_model_optim(ctx, "mlp-16-1-4", &m, &o);
    sg_trainer *t = NULL;
    int64_t lens[] = {4, 8};
    sg_trainer_options to = sg_trainer_options_default();
    to.loop = 2;
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "expected 0 or 1");
    to = sg_trainer_options_default(), to.stop_on_loss = 1, to.stop_loss = NAN;
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "finite loss");
    to = sg_trainer_options_default(), to.stop_nonfinite = -1;
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "stop_nonfinite -1");
    to = sg_trainer_options_default(), to.vary_seq = 1;
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "set seq_buckets");
    to = sg_trainer_options_default(), to.batch_buckets = lens, to.n_buckets = 2, to.steps_per_call = 2;
    TU_FAILS(ctx, sg_trainer_create(m, o, &to, &t), SG_ERR_INVALID, "expected 1 with batch or sequence buckets");
    sg_loss_scaler bad = {-1.f, 0.f, 2000.f, 0.f};
    to = sg_trainer_options_default();
    TU_OK(ctx, sg_trainer_create(m, o, &to, &t));
    TU_FAILS(ctx, sg_trainer_set_scaler(t, &bad), SG_ERR_INVALID, "scale -1");
    bad.scale = 1.f, bad.growth_interval = 0.f;
    TU_FAILS(ctx, sg_trainer_set_scaler(t, &bad), SG_ERR_INVALID, "growth_interval 0");
    sg_trainer_stop st;
    TU_OK(ctx, sg_trainer_step(t, 0));
    TU_OK(ctx, sg_trainer_get_stop(t, &st));
    TU_CHECK(st.steps_run == 1 && st.last_call_steps == 1 && st.stopped == SG_STOPPED_NO,
             "no rule: %lld steps run, last call %d, stopped %d", (long long)st.steps_run, st.last_call_steps,
             (int)st.stopped);
    sg_trainer_destroy(t);
    sg_optim_destroy(o);
    tu_trains_a_step(ctx, m, "after the refusals"); /* (destroys m) */
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    sg_backend be;
    if (!tu_start("test_condstep", argc, argv, &be)) {
        printf("SKIP: no CUDA device (or a CPU-only build): GPU tests need a GPU; run scripts/gpu-check.sh on a "
               "machine with one\n");
        return TU_SKIP;
    }
    bool gpu = be == SG_BACKEND_CUDA;
    const char *mlp = gpu ? "mlp-256-4-32" : "mlp-32-2-8", *gpt = gpu ? "gpt-128-2-4-32" : "gpt-64-1-2-16";
    loop_case(be, mlp, SG_DTYPE_F32, tu_randint(3, 5), 1, 7);
    loop_case(be, gpt, SG_DTYPE_BF16, tu_randint(3, 5), tu_randint(2, 3), 6);
    loop_case(be, mlp, SG_DTYPE_F32, 1, tu_randint(2, 4), 6);
    skip_if_case(be, gpt);
    switch_case(be, gpt, SG_DTYPE_F32, 1);
    switch_case(be, gpt, SG_DTYPE_BF16, tu_randint(2, 4));
    switch_case(be, mlp, SG_DTYPE_F32, 1);
    switch_case(be, mlp, SG_DTYPE_F32, tu_randint(2, 4));
    stop_case(be, gpt, false, 1); /* a gpt's loss falls steadily: a target past the capture */
    stop_case(be, gpt, false, tu_randint(2, 4));
    stop_case(be, mlp, true, 1);
    stop_case(be, mlp, true, tu_randint(2, 4)); /* a streak of up to 3 ends mid-call */
    disabled_case(be);
    refusals(be);
    return tu_finish("test_condstep");
}
