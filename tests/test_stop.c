/* test_stop.c: the device-side early-stop rule (sg_stop_begin, sg_stop_check) against a host
 * model written here, comparing the whole state (8 int32) bit for bit after every call: random
 * rules, limits and losses (finite, +-inf, NaN, the target and its neighbours, -0) over several
 * calls, with and without resets; scripted cases (the limit reached exactly, a streak reset by a
 * finite loss, the target met on exactly its step, NONFINITE winning a step that meets both,
 * the reason sticky across calls, saturating counters); a captured begin + 3 checks replayed
 * on fresh losses (the rule copied into the graph); the rule driving sg_graph_while, eagerly
 * (the body writes the next loss from the host) and captured (the body picks losses[step] with
 * sg_graph_switch on the state's step count); errors naming the argument, the state untouched
 * and the context usable. `cpu`: the CPU backend; `gpu`: CUDA (exit 77 without a GPU). */
#include "testutil.h"

#include "ops/stop.h"

/* ---- the host model, written from the rule's description ---- */

typedef struct model {
    int32_t s[SG_STOP_STATE];
} model;

static int32_t sat_inc(int32_t v) { return (int64_t)v + 1 > INT32_MAX ? INT32_MAX : v + 1; }

/* Finite: the exponent bits are not all ones. */
static bool finite_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return ((u >> 23) & 0xffu) != 0xffu;
}

static void m_begin(model *m, int32_t limit)
{
    (void)limit; /* always >= 1 */
    m->s[1] = 0;
    m->s[0] = m->s[3] == 0 ? 1 : 0;
}

static void m_check(model *m, float loss, int32_t limit, const sg_stop_rule *r)
{
    m->s[1] = sat_inc(m->s[1]);
    m->s[4] = sat_inc(m->s[4]);
    m->s[2] = finite_bits(loss) ? 0 : sat_inc(m->s[2]);
    if (m->s[3] == 0) {
        bool nonfinite = r->nonfinite_steps > 0 && m->s[2] >= r->nonfinite_steps;
        bool target = r->use_target && loss == loss && (double)loss <= (double)r->target_loss;
        m->s[3] = nonfinite ? 1 : target ? 2 : 0;
    }
    m->s[0] = m->s[3] == 0 && m->s[1] < limit ? 1 : 0;
}

/* ---- device state ---- */

static void get_state(const sg_tensor *t, int32_t *s)
{
    TU_OK(t->ctx, sg_tensor_copy_to_host(t, s, SG_STOP_STATE * sizeof *s));
}

static void set_state(sg_tensor *t, const int32_t *s)
{
    TU_OK(t->ctx, sg_tensor_copy_from_host(t, s, SG_STOP_STATE * sizeof *s));
}

static void set_loss(sg_tensor *t, float v) { TU_OK(t->ctx, sg_tensor_copy_from_host(t, &v, sizeof v)); }

/* The device state equals the model's, bit for bit; prints both otherwise. */
static bool same_state(const sg_tensor *state, const model *m, const char *what, int step, float loss)
{
    int32_t s[SG_STOP_STATE];
    get_state(state, s);
    bool same = !memcmp(s, m->s, sizeof s);
    TU_CHECK(same, "%s, step %d (loss %g): state {%d %d %d %d %d | %d %d %d}, model {%d %d %d %d %d | %d %d %d}",
             what, step, loss, s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], m->s[0], m->s[1], m->s[2], m->s[3],
             m->s[4], m->s[5], m->s[6], m->s[7]);
    return same;
}

static void reset(sg_tensor *state, model *m)
{
    TU_OK(state->ctx, sg_tensor_fill(state, 0));
    memset(m, 0, sizeof *m);
}

/* One check on device and model, compared; on CUDA one launch. */
static bool step(sg_tensor *state, sg_tensor *loss, model *m, float l, int32_t limit, const sg_stop_rule *r,
                 const char *what, int i)
{
    sg_ctx *ctx = state->ctx;
    set_loss(loss, l);
    uint64_t k0 = sg_ctx_launch_count(ctx);
    TU_OK(ctx, sg_stop_check(ctx, state, loss, limit, r));
    if (ctx->backend == SG_BACKEND_CUDA)
        TU_CHECK(sg_ctx_launch_count(ctx) - k0 == 1, "sg_stop_check made %llu launches",
                 (unsigned long long)(sg_ctx_launch_count(ctx) - k0));
    m_check(m, l, limit, r);
    return same_state(state, m, what, i, l);
}

static bool begin(sg_tensor *state, model *m, int32_t limit, const char *what)
{
    sg_ctx *ctx = state->ctx;
    uint64_t k0 = sg_ctx_launch_count(ctx);
    TU_OK(ctx, sg_stop_begin(ctx, state, limit));
    if (ctx->backend == SG_BACKEND_CUDA)
        TU_CHECK(sg_ctx_launch_count(ctx) - k0 == 1, "sg_stop_begin made %llu launches",
                 (unsigned long long)(sg_ctx_launch_count(ctx) - k0));
    m_begin(m, limit);
    return same_state(state, m, what, 0, 0);
}

/* ---- random losses and rules ---- */

/* A loss near target: the target itself, its float neighbours, -0 when it is 0, +-inf, NaN
 * (either sign) with probability p_bad, else a uniform value around it. */
static float draw_loss(float target, double p_bad)
{
    if (tu_uniform(0, 1) < p_bad) {
        switch (tu_randint(0, 3)) {
        case 0: return INFINITY;
        case 1: return -INFINITY;
        case 2: return NAN;
        default: return -NAN;
        }
    }
    switch (tu_randint(0, 7)) {
    case 0: return target;
    case 1: return nextafterf(target, INFINITY);
    case 2: return nextafterf(target, -INFINITY);
    case 3: return target == 0.f ? -0.f : target;
    default: return (float)tu_uniform(target - 1, target + 4);
    }
}

static sg_stop_rule draw_rule(void)
{
    sg_stop_rule r = {tu_randint(0, 1) ? 0 : tu_randint(1, 4), tu_randint(0, 1), 0.f};
    int t = tu_randint(0, 3);
    r.target_loss = t == 0 ? 0.f : (float)tu_uniform(-1, 3);
    if (!r.use_target && tu_randint(0, 3) == 0) r.target_loss = NAN; /* ignored without use_target */
    return r;
}

static int32_t draw_limit(void)
{
    int k = tu_randint(0, 9);
    return k == 0 ? SG_STOP_MAX_LIMIT : k == 1 ? tu_randint(1, 40) : tu_randint(1, 8);
}

/* Trials of several calls each: begin, then checks while GO (as the WHILE runs them), then
 * 0..2 more (a caller that ignores GO: the counters still move, the reason does not). The
 * state is reset at a trial's start and now and then between calls, its reserved elements
 * sometimes set to junk the rule must leave alone. */
static void random_runs(sg_ctx *ctx, int trials)
{
    sg_tensor *state = tu_tensor1(ctx, SG_DTYPE_I32, SG_STOP_STATE, "state");
    sg_tensor *loss = tu_tensor1(ctx, SG_DTYPE_F32, 1, "loss");
    int checks = 0, reasons[3] = {0, 0, 0};
    bool ok = true;
    for (int t = 0; t < trials && ok; t++) {
        sg_stop_rule r = draw_rule();
        double p_bad = tu_uniform(0, 0.8);
        float center = r.use_target ? r.target_loss : (float)tu_uniform(-1, 3);
        model m;
        int calls = tu_randint(1, 6);
        char what[160];
        for (int c = 0; c < calls && ok; c++) {
            if (c == 0 || tu_randint(0, 4) == 0) {
                reset(state, &m);
                if (tu_randint(0, 3) == 0) {
                    for (int i = 5; i < SG_STOP_STATE; i++) m.s[i] = (int32_t)tu_next();
                    set_state(state, m.s);
                }
            }
            int32_t limit = draw_limit();
            snprintf(what, sizeof what, "trial %d call %d (limit %d, rule {%d, %d, %g})", t, c, (int)limit,
                     r.nonfinite_steps, r.use_target, r.target_loss);
            ok = begin(state, &m, limit, what);
            int extra = tu_randint(0, 2), i = 0;
            while (ok && (m.s[0] || extra-- > 0) && i < 60) {
                ok = step(state, loss, &m, draw_loss(center, p_bad), limit, &r, what, ++i);
                checks++;
            }
            reasons[m.s[3]]++;
        }
    }
    printf("%s: %d trials, %d checks equal to the model; calls ending with no reason %d, nonfinite %d, target %d\n",
           sg_backend_name(ctx->backend), trials, checks, reasons[0], reasons[1], reasons[2]);
    sg_tensor_destroy(state), sg_tensor_destroy(loss);
}

/* ---- scripted cases, each against the model and against the numbers written out ---- */

static void expect_state(const sg_tensor *state, int32_t go, int32_t steps, int32_t streak, int32_t reason,
                         int32_t total, const char *what)
{
    int32_t s[SG_STOP_STATE];
    get_state(state, s);
    TU_CHECK(s[0] == go && s[1] == steps && s[2] == streak && s[3] == reason && s[4] == total,
             "%s: state {%d %d %d %d %d}, expected {%d %d %d %d %d}", what, s[0], s[1], s[2], s[3], s[4], go, steps,
             streak, reason, total);
}

static void scripted(sg_ctx *ctx)
{
    sg_tensor *state = tu_tensor1(ctx, SG_DTYPE_I32, SG_STOP_STATE, "state");
    sg_tensor *loss = tu_tensor1(ctx, SG_DTYPE_F32, 1, "loss");
    model m;
    char what[128];

    /* The limit reached exactly: L finite losses above the target, GO 1 until the L-th. */
    int32_t L = tu_randint(1, 12);
    sg_stop_rule r = {2, 1, -5.f};
    reset(state, &m);
    begin(state, &m, L, "limit");
    expect_state(state, 1, 0, 0, 0, 0, "limit: begin");
    for (int i = 1; i <= L; i++) {
        snprintf(what, sizeof what, "limit %d, step %d", (int)L, i);
        step(state, loss, &m, (float)tu_uniform(-4, 4), L, &r, what, i);
        expect_state(state, i < L, i, 0, SG_STOP_NONE, i, what);
    }
    begin(state, &m, L, "limit: the next call");
    expect_state(state, 1, 0, 0, SG_STOP_NONE, L, "limit: the next call");

    /* A streak reset by a finite loss: nonfinite_steps 3 stops at the third in a row only. */
    const float streak_losses[] = {NAN, INFINITY, 1.f, NAN, -INFINITY, 2.f, NAN, -NAN, INFINITY};
    const int32_t streaks[] = {1, 2, 0, 1, 2, 0, 1, 2, 3};
    r = (sg_stop_rule){3, 0, 0.f};
    reset(state, &m);
    begin(state, &m, 100, "streak");
    for (int i = 0; i < 9; i++) {
        snprintf(what, sizeof what, "streak, step %d", i + 1);
        step(state, loss, &m, streak_losses[i], 100, &r, what, i + 1);
        expect_state(state, i < 8, i + 1, streaks[i], i < 8 ? SG_STOP_NONE : SG_STOP_NONFINITE, i + 1, what);
    }

    /* The target met on exactly its step: above it by one ulp, NaN and +inf do not meet it,
     * equal does. */
    float t = (float)tu_uniform(-2, 2);
    const float target_losses[] = {t + 1, nextafterf(t, INFINITY), NAN, INFINITY, t};
    r = (sg_stop_rule){0, 1, t};
    reset(state, &m);
    begin(state, &m, 50, "target");
    for (int i = 0; i < 5; i++) {
        snprintf(what, sizeof what, "target %g, step %d", t, i + 1);
        step(state, loss, &m, target_losses[i], 50, &r, what, i + 1);
        expect_state(state, i < 4, i + 1, i == 2 || i == 3 ? i - 1 : 0, i < 4 ? SG_STOP_NONE : SG_STOP_TARGET, i + 1,
                     what);
    }
    /* -0 meets a target of 0. */
    r = (sg_stop_rule){0, 1, 0.f};
    reset(state, &m);
    begin(state, &m, 5, "-0");
    step(state, loss, &m, -0.f, 5, &r, "-0 against 0", 1);
    expect_state(state, 0, 1, 0, SG_STOP_TARGET, 1, "-0 against 0");

    /* Both on one step (-inf completes the streak and is <= the target): NONFINITE. A -inf
     * that does not complete it meets the target. */
    r = (sg_stop_rule){1, 1, t};
    reset(state, &m);
    begin(state, &m, 5, "both");
    step(state, loss, &m, -INFINITY, 5, &r, "both on step 1", 1);
    expect_state(state, 0, 1, 1, SG_STOP_NONFINITE, 1, "both on step 1");
    r = (sg_stop_rule){2, 1, t};
    reset(state, &m);
    begin(state, &m, 5, "both");
    step(state, loss, &m, NAN, 5, &r, "NaN, then", 1);
    step(state, loss, &m, -INFINITY, 5, &r, "-inf completing the streak", 2);
    expect_state(state, 0, 2, 2, SG_STOP_NONFINITE, 2, "-inf completing the streak");
    reset(state, &m);
    begin(state, &m, 5, "short streak");
    step(state, loss, &m, -INFINITY, 5, &r, "-inf, streak 1 of 2", 1);
    expect_state(state, 0, 1, 1, SG_STOP_TARGET, 1, "-inf, streak 1 of 2");

    /* Sticky: a stop by TARGET stays through more checks (a streak long enough for NONFINITE
     * included) and the next call's begin; a reset starts over. */
    r = (sg_stop_rule){2, 1, t};
    reset(state, &m);
    begin(state, &m, 10, "sticky");
    step(state, loss, &m, t - 1, 10, &r, "sticky: target", 1);
    for (int i = 2; i <= 4; i++) step(state, loss, &m, NAN, 10, &r, "sticky: NaN after the stop", i);
    expect_state(state, 0, 4, 3, SG_STOP_TARGET, 4, "sticky: NaN after the stop");
    begin(state, &m, 10, "sticky: the next call");
    expect_state(state, 0, 0, 3, SG_STOP_TARGET, 4, "sticky: the next call");
    step(state, loss, &m, t + 1, 10, &r, "sticky: a finite loss in the next call", 1);
    expect_state(state, 0, 1, 0, SG_STOP_TARGET, 5, "sticky: a finite loss in the next call");
    reset(state, &m);
    begin(state, &m, 10, "sticky: after a reset");
    expect_state(state, 1, 0, 0, SG_STOP_NONE, 0, "sticky: after a reset");

    /* Counters saturate at INT32_MAX. */
    r = (sg_stop_rule){0, 0, 0.f};
    reset(state, &m);
    m.s[1] = m.s[2] = m.s[4] = INT32_MAX - 1;
    set_state(state, m.s);
    step(state, loss, &m, NAN, SG_STOP_MAX_LIMIT, &r, "saturating", 1);
    step(state, loss, &m, NAN, SG_STOP_MAX_LIMIT, &r, "saturating", 2);
    expect_state(state, 0, INT32_MAX, INT32_MAX, SG_STOP_NONE, INT32_MAX, "saturated");
    printf("%s: scripted cases (limit %d exactly, streak reset, target on its step, -0, NONFINITE first, sticky, "
           "saturation) as expected\n", sg_backend_name(ctx->backend), (int)L);
    sg_tensor_destroy(state), sg_tensor_destroy(loss);
}

/* ---- capture: begin + 3 checks in one graph ---- */

typedef struct three {
    sg_ctx *ctx;
    sg_tensor *state, *loss[3];
    int32_t limit;
    sg_stop_rule rule;
} three;

static sg_status three_step(void *u)
{
    three *c = u;
    SG_TRY(sg_stop_begin(c->ctx, c->state, c->limit));
    for (int i = 0; i < 3; i++) SG_TRY(sg_stop_check(c->ctx, c->state, c->loss[i], c->limit, &c->rule));
    return SG_OK;
}

static void captured_checks(sg_ctx *ctx)
{
    three c = {ctx, tu_tensor1(ctx, SG_DTYPE_I32, SG_STOP_STATE, "state"), {NULL}, 0, {0}};
    for (int i = 0; i < 3; i++) c.loss[i] = tu_tensor1(ctx, SG_DTYPE_F32, 1, "loss");
    int replays = 0;
    for (int gi = 0; gi < 4; gi++) {
        c.limit = tu_randint(1, 4);
        c.rule = draw_rule();
        const sg_stop_rule rule = c.rule;
        float center = rule.use_target ? rule.target_loss : 1.f;
        for (int i = 0; i < 3; i++) set_loss(c.loss[i], 1.f);
        TU_OK(ctx, sg_tensor_fill(c.state, 0));
        sg_graph_options o = sg_graph_options_default();
        o.name = "stop", o.warmup = 1;
        sg_graph *g = NULL;
        TU_OK(ctx, sg_graph_capture(ctx, three_step, &c, &o, &g));
        /* The graph holds the rule's values: the caller's struct may change or go. */
        c.rule = (sg_stop_rule){-7, 1, NAN};
        model m;
        reset(c.state, &m);
        bool ok = true;
        for (int r = 0; r < 16 && ok; r++) {
            if (tu_randint(0, 3) == 0) reset(c.state, &m);
            float l[3];
            for (int i = 0; i < 3; i++) set_loss(c.loss[i], l[i] = draw_loss(center, 0.4));
            uint64_t k0 = sg_ctx_launch_count(ctx);
            TU_OK(ctx, sg_graph_replay(g));
            if (ctx->backend == SG_BACKEND_CUDA)
                TU_CHECK(sg_ctx_launch_count(ctx) - k0 == 1, "a replay made %llu launches",
                         (unsigned long long)(sg_ctx_launch_count(ctx) - k0));
            m_begin(&m, c.limit);
            for (int i = 0; i < 3; i++) m_check(&m, l[i], c.limit, &rule);
            char what[160];
            snprintf(what, sizeof what, "graph %d (limit %d, rule {%d, %d, %g}), replay %d, losses %g %g %g", gi,
                     (int)c.limit, rule.nonfinite_steps, rule.use_target, rule.target_loss, r, l[0], l[1], l[2]);
            ok = same_state(c.state, &m, what, 3, l[2]);
            replays++;
        }
        sg_graph_destroy(g);
    }
    printf("%s: begin + 3 checks captured, %d replays on fresh losses equal to the model\n",
           sg_backend_name(ctx->backend), replays);
    sg_tensor_destroy(c.state);
    for (int i = 0; i < 3; i++) sg_tensor_destroy(c.loss[i]);
}

/* ---- the rule driving sg_graph_while ---- */

#define MAX_STEPS 16

typedef struct loop {
    sg_ctx *ctx;
    sg_tensor *state, *go, *steps, *loss;
    int32_t limit;
    sg_stop_rule rule;
    /* eager: the host's list and the next index */
    const float *host;
    int next;
    /* captured: losses (MAX_STEPS) F32 on the device, a view of each element */
    sg_tensor *losses, *at[MAX_STEPS];
    struct pick {
        struct loop *w;
        int i;
    } picks[MAX_STEPS];
} loop;

static sg_status eager_body(void *u)
{
    loop *w = u;
    if (w->next >= w->limit) return sg_ctx_fail(w->ctx, SG_ERR_INVALID, "the loop ran past its limit %d", w->limit);
    SG_TRY(sg_tensor_copy_from_host(w->loss, &w->host[w->next++], sizeof(float)));
    return sg_stop_check(w->ctx, w->state, w->loss, w->limit, &w->rule);
}

static sg_status eager_step(void *u)
{
    loop *w = u;
    SG_TRY(sg_stop_begin(w->ctx, w->state, w->limit));
    return sg_graph_while(w->ctx, w->go, eager_body, w);
}

/* Branch i of the body's SWITCH on state[SG_STOP_STEPS]: this step's loss is losses[i]. */
static sg_status pick(void *u)
{
    struct pick *p = u;
    return sg_tensor_copy(p->w->loss, p->w->at[p->i]);
}

static sg_status graph_body(void *u)
{
    loop *w = u;
    sg_step_fn fns[MAX_STEPS];
    void *users[MAX_STEPS];
    for (int i = 0; i < w->limit; i++) fns[i] = pick, users[i] = &w->picks[i];
    SG_TRY(sg_graph_switch(w->ctx, w->steps, w->limit, fns, users));
    return sg_stop_check(w->ctx, w->state, w->loss, w->limit, &w->rule);
}

static sg_status graph_step(void *u)
{
    loop *w = u;
    SG_TRY(sg_stop_begin(w->ctx, w->state, w->limit));
    return sg_graph_while(w->ctx, w->go, graph_body, w);
}

/* What the loop must do: begin, then check while GO; returns the steps run. */
static int m_loop(model *m, const float *l, int32_t limit, const sg_stop_rule *r)
{
    int n = 0;
    m_begin(m, limit);
    while (m->s[0]) m_check(m, l[n++], limit, r);
    return n;
}

static void loop_setup(loop *w, sg_ctx *ctx)
{
    memset(w, 0, sizeof *w);
    w->ctx = ctx;
    w->state = tu_tensor1(ctx, SG_DTYPE_I32, SG_STOP_STATE, "state");
    TU_OK(ctx, sg_tensor_view(w->state, SG_STOP_GO, 1, (int64_t[]){1}, "go", &w->go));
    TU_OK(ctx, sg_tensor_view(w->state, SG_STOP_STEPS, 1, (int64_t[]){1}, "steps", &w->steps));
    w->loss = tu_tensor1(ctx, SG_DTYPE_F32, 1, "loss");
    w->losses = tu_tensor1(ctx, SG_DTYPE_F32, MAX_STEPS, "losses");
    for (int i = 0; i < MAX_STEPS; i++) {
        TU_OK(ctx, sg_tensor_view(w->losses, i, 1, (int64_t[]){1}, "losses[i]", &w->at[i]));
        w->picks[i] = (struct pick){w, i};
    }
}

static void loop_teardown(loop *w)
{
    for (int i = 0; i < MAX_STEPS; i++) sg_tensor_destroy(w->at[i]);
    sg_tensor *ts[] = {w->go, w->steps, w->losses, w->loss, w->state};
    tu_destroy_all(ts, 5);
}

/* Eagerly (the WHILE reads GO on the host before each turn), then, where the backend can
 * capture WHILE and SWITCH, the same loop captured and replayed on fresh losses. */
static void while_loops(sg_ctx *ctx)
{
    loop w;
    loop_setup(&w, ctx);
    model m;
    float l[MAX_STEPS];
    int runs = 0, steps = 0;
    bool ok = true;
    for (int t = 0; t < 40 && ok; t++) {
        w.limit = tu_randint(1, MAX_STEPS);
        w.rule = draw_rule();
        if (t == 0 || tu_randint(0, 2) == 0) reset(w.state, &m); /* else the last run's state carries on */
        float center = w.rule.use_target ? w.rule.target_loss : 1.f;
        double p_bad = tu_uniform(0, 0.7);
        for (int i = 0; i < MAX_STEPS; i++) l[i] = draw_loss(center, p_bad);
        w.host = l, w.next = 0;
        TU_OK(ctx, eager_step(&w));
        int n = m_loop(&m, l, w.limit, &w.rule);
        TU_CHECK(w.next == n, "eager WHILE, limit %d: %d steps ran, the model says %d", w.limit, w.next, n);
        ok = same_state(w.state, &m, "eager WHILE", n, n ? l[n - 1] : 0);
        runs++, steps += n;
    }
    printf("%s: sg_graph_while eagerly, %d runs (%d steps), each stopping where the model does\n",
           sg_backend_name(ctx->backend), runs, steps);

    int need = (1 << SG_COND_WHILE) | (1 << SG_COND_SWITCH);
    if ((sg_graph_conditionals(ctx) & need) != need) {
        printf("%s: no WHILE and SWITCH conditional nodes here: the captured loop is skipped\n",
               sg_backend_name(ctx->backend));
        loop_teardown(&w);
        return;
    }
    runs = 0, steps = 0;
    for (int gi = 0; gi < 3 && ok; gi++) {
        w.limit = tu_randint(1, MAX_STEPS);
        w.rule = draw_rule();
        const sg_stop_rule rule = w.rule;
        float center = rule.use_target ? rule.target_loss : 1.f;
        tu_set(w.losses, (double[MAX_STEPS]){0});
        TU_OK(ctx, sg_tensor_fill(w.state, 0));
        sg_graph_options o = sg_graph_options_default();
        o.name = "stop-while", o.warmup = 1;
        sg_graph *g = NULL;
        TU_OK(ctx, sg_graph_capture(ctx, graph_step, &w, &o, &g));
        w.rule = (sg_stop_rule){-7, 1, NAN}; /* the graph holds the values */
        reset(w.state, &m);
        for (int r = 0; r < 12 && ok; r++) {
            if (tu_randint(0, 2) == 0) reset(w.state, &m);
            double p_bad = tu_uniform(0, 0.7);
            for (int i = 0; i < MAX_STEPS; i++) l[i] = draw_loss(center, p_bad);
            TU_OK(ctx, sg_tensor_copy_from_host(w.losses, l, sizeof l));
            TU_OK(ctx, sg_graph_replay(g));
            int n = m_loop(&m, l, w.limit, &rule);
            char what[128];
            snprintf(what, sizeof what, "captured WHILE %d (limit %d, rule {%d, %d, %g}), replay %d", gi,
                     (int)w.limit, rule.nonfinite_steps, rule.use_target, rule.target_loss, r);
            ok = same_state(w.state, &m, what, n, n ? l[n - 1] : 0);
            runs++, steps += n;
        }
        sg_graph_destroy(g);
    }
    printf("%s: sg_graph_while captured (the body's SWITCH on the step count picks the loss), %d replays "
           "(%d steps) equal to the model\n", sg_backend_name(ctx->backend), runs, steps);
    loop_teardown(&w);
}

/* ---- errors: each names the problem, leaves every tensor as it was, the context usable ---- */

static void errors(sg_ctx *ctx)
{
    sg_tensor *state = tu_tensor1(ctx, SG_DTYPE_I32, SG_STOP_STATE, "state");
    sg_tensor *loss = tu_tensor1(ctx, SG_DTYPE_F32, 1, "loss");
    sg_tensor *fstate = tu_tensor1(ctx, SG_DTYPE_F32, SG_STOP_STATE, "fstate");
    sg_tensor *short_state = tu_tensor1(ctx, SG_DTYPE_I32, SG_STOP_STATE - 1, "short");
    sg_tensor *iloss = tu_tensor1(ctx, SG_DTYPE_I32, 1, "iloss");
    sg_tensor *wide = tu_tensor1(ctx, SG_DTYPE_F32, 2, "wide");
    sg_ctx *other = tu_ctx(SG_BACKEND_CPU);
    sg_tensor *foreign = tu_tensor1(other, SG_DTYPE_I32, SG_STOP_STATE, "foreign");
    sg_tensor *all[] = {state, loss, fstate, short_state, iloss, wide};
    enum { N_ALL = sizeof all / sizeof *all };
    void *before[N_ALL];
    for (int i = 0; i < N_ALL; i++) tu_poison(all[i]), before[i] = tu_raw(all[i]);
    set_loss(loss, 1.f);
    free(before[1]), before[1] = tu_raw(loss);
    const sg_stop_rule good = {2, 1, 0.5f};

#define REFUSED(call, want, needle)                                                                            \
    do {                                                                                                       \
        TU_FAILS(ctx, call, want, needle);                                                                     \
        for (int i_ = 0; i_ < N_ALL; i_++)                                                                     \
            TU_CHECK(tu_same_bytes(all[i_], before[i_]), "%s changed '%s'", #call, all[i_]->name);             \
    } while (0)

    TU_CHECK(sg_stop_begin(NULL, state, 4) == SG_ERR_NULL, "NULL ctx");
    TU_CHECK(sg_stop_check(NULL, state, loss, 4, &good) == SG_ERR_NULL, "NULL ctx");
    REFUSED(sg_stop_begin(ctx, NULL, 4), SG_ERR_NULL, "sg_stop_begin: tensor 'state' is NULL");
    REFUSED(sg_stop_begin(ctx, fstate, 4), SG_ERR_DTYPE, "sg_stop_begin: tensor 'state' is f32, expected i32");
    REFUSED(sg_stop_begin(ctx, short_state, 4), SG_ERR_SHAPE, "'state' (short) is (7) i32, expected 8 elements (SG_STOP_STATE)");
    REFUSED(sg_stop_begin(ctx, foreign, 4), SG_ERR_BACKEND, "'state' (foreign) belongs to another context");
    REFUSED(sg_stop_begin(ctx, state, 0), SG_ERR_INVALID, "sg_stop_begin: limit 0: expected");
    REFUSED(sg_stop_begin(ctx, state, -3), SG_ERR_INVALID, "limit -3");
    REFUSED(sg_stop_begin(ctx, state, SG_STOP_MAX_LIMIT + 1), SG_ERR_INVALID, "limit 1073741825: expected the "
            "steps a call may run, 1 to 1073741824");
    REFUSED(sg_stop_check(ctx, fstate, loss, 4, &good), SG_ERR_DTYPE, "sg_stop_check: tensor 'state' is f32");
    REFUSED(sg_stop_check(ctx, short_state, loss, 4, &good), SG_ERR_SHAPE, "expected 8 elements");
    REFUSED(sg_stop_check(ctx, state, NULL, 4, &good), SG_ERR_NULL, "sg_stop_check: tensor 'loss' is NULL");
    REFUSED(sg_stop_check(ctx, state, iloss, 4, &good), SG_ERR_DTYPE, "tensor 'loss' is i32, expected f32");
    REFUSED(sg_stop_check(ctx, state, wide, 4, &good), SG_ERR_SHAPE, "'loss' (wide) is (2) f32, expected 1 element (the step's loss)");
    REFUSED(sg_stop_check(ctx, state, loss, 0, &good), SG_ERR_INVALID, "sg_stop_check: limit 0");
    REFUSED(sg_stop_check(ctx, state, loss, INT32_MAX, &good), SG_ERR_INVALID, "limit 2147483647");
    REFUSED(sg_stop_check(ctx, state, loss, 4, NULL), SG_ERR_NULL, "sg_stop_check: rule is NULL");
    REFUSED(sg_stop_check(ctx, state, loss, 4, (&(sg_stop_rule){-1, 0, 0.f})), SG_ERR_INVALID,
            "rule->nonfinite_steps -1: expected >= 0");
    REFUSED(sg_stop_check(ctx, state, loss, 4, (&(sg_stop_rule){0, 1, NAN})), SG_ERR_INVALID,
            "use_target: expected a finite target");
    REFUSED(sg_stop_check(ctx, state, loss, 4, (&(sg_stop_rule){0, 1, -INFINITY})), SG_ERR_INVALID,
            "rule->target_loss -inf");
#undef REFUSED

    /* Usable: the same state, reset, runs the rule; a NaN target without use_target is fine. */
    model m;
    reset(state, &m);
    begin(state, &m, 3, "after the refusals");
    step(state, loss, &m, 1.f, 3, &good, "after the refusals", 1);
    step(state, loss, &m, NAN, 3, &(sg_stop_rule){0, 0, NAN}, "a NaN target, unused", 2);
    printf("%s: 20 refusals, each naming the argument; nothing written; the context usable\n",
           sg_backend_name(ctx->backend));
    for (int i = 0; i < N_ALL; i++) free(before[i]);
    tu_destroy_all(all, N_ALL);
    sg_tensor_destroy(foreign);
    sg_ctx_destroy(other);
}

int main(int argc, char **argv)
{
    sg_backend be;
    if (!tu_start("test_stop", argc, argv, &be)) {
        printf("SKIP: no CUDA device (or a CPU-only build): GPU tests need a GPU; run scripts/gpu-check.sh on a "
               "machine with one\n");
        return TU_SKIP;
    }
    unsetenv("STEPGRAPH_DISABLE_GRAPHS");
    unsetenv("STEPGRAPH_DISABLE_CONDITIONALS");
    sg_ctx *ctx = tu_ctx(be);
    random_runs(ctx, be == SG_BACKEND_CUDA ? 150 : 400);
    scripted(ctx);
    captured_checks(ctx);
    while_loops(ctx);
    errors(ctx);
    sg_ctx_destroy(ctx);
    return tu_finish("test_stop");
}
