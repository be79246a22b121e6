/* test_advise_gen.c: the advisor for generation (sg_advise_gen_predict, sg_advise_generate).
 *   - the prediction of each mode on inputs whose answers are worked out by hand, the CPU case
 *     (no device timings: gaps 0), a missing WHILE turn, and refusals naming the bad input;
 *   - the whole flow on a small random-initialised GPT (`cpu`: the CPU backend, `gpu`: CUDA),
 *     a batch of prompts of different lengths with a stop sequence that would end sequence 0 at
 *     once (the advisor must drop it: every timed run is checked to run max_new tokens), each
 *     mode predicted and measured, the figures consistent with the profile they came from, and
 *     the generator giving the same tokens afterwards as before;
 *   - refusals (max_new 1, a generator of another context, a bad calibration, a bad request),
 *     the generator usable after each.
 * Timings are not asserted against each other: tests check correctness, benchmarks speed. */
#include "testutil.h"

#define MODEL "gpt-128-2-2-32"
#define NSEQ 3
#define NEW 8

static void close_to(const char *what, double got, double want)
{
    TU_CHECK(fabs(got - want) <= 1e-12 * (1 + fabs(want)), "%s: got %.15g, expected %.15g", what, got, want);
}

static sg_advise_calib calib_timed(void)
{
    sg_advise_calib c = {0};
    c.launch_host_us = 2.5, c.replay_base_us = 2, c.replay_node_us = 0.01;
    c.tiny_kernel_us = 1.5, c.eager_kernel_us = 4.5, c.node_device_us = 2.0;
    c.eager_gap_us = 3.0, c.node_gap_us = 0.5, c.graph_gap_us = 2.0;
    c.device_timed = 1;
    return c;
}

/* A decode step of 63 launches, 60 nodes, 200 us of graph on the device. */
static sg_advise_gen_profile profile_step(void)
{
    sg_advise_gen_profile p = {0};
    p.steps = 7, p.launches = 63, p.nodes = 60;
    p.host_us = 300, p.replay_us = 4, p.graph_us = 200, p.readback_us = 15, p.while_turn_us = 3.0;
    return p;
}

static void predict_by_hand(void)
{
    sg_advise_calib c = calib_timed();
    sg_advise_gen_profile p = profile_step();
    sg_advise_gen_mode m;
    /* eager: device 200 - 2 - 60 x 0.5 + 63 x 3 = 357 > host 300: (357 + 15) us. */
    TU_CHECK(sg_advise_gen_predict(&c, &p, SG_GEN_EAGER, &m) == SG_OK, "eager: %s", m.note);
    TU_CHECK(m.predicted && m.mode == SG_GEN_EAGER, "eager predicted %d mode %d", m.predicted, (int)m.mode);
    close_to("eager device", m.device_us, 357), close_to("eager host", m.host_us, 300);
    close_to("eager sync", m.sync_us, 15), close_to("eager ms", m.predicted_ms, 0.372);
    /* host-bound: the host's 500 us wins the max. */
    p.host_us = 500;
    TU_CHECK(sg_advise_gen_predict(&c, &p, SG_GEN_EAGER, &m) == SG_OK, "eager host-bound: %s", m.note);
    close_to("eager host-bound ms", m.predicted_ms, 0.515);
    /* step: replay + graph + flag read in series: (4 + 200 + 15) us. */
    TU_CHECK(sg_advise_gen_predict(&c, &p, SG_GEN_STEP, &m) == SG_OK, "step: %s", m.note);
    close_to("step ms", m.predicted_ms, 0.219), close_to("step host", m.host_us, 4);
    close_to("step device", m.device_us, 200), close_to("step sync", m.sync_us, 15);
    /* loop: the graph less its launch gap, plus the turn beyond its tiny kernel: 198 + 1. */
    TU_CHECK(sg_advise_gen_predict(&c, &p, SG_GEN_LOOP, &m) == SG_OK, "loop: %s", m.note);
    close_to("loop device", m.device_us, 199), close_to("loop ms", m.predicted_ms, 0.199);
    TU_CHECK(m.host_us == 0 && m.sync_us == 0, "loop host %g sync %g, expected 0", m.host_us, m.sync_us);
    /* A turn cheaper than the tiny kernel node adds nothing (never negative). */
    p.while_turn_us = 0.5;
    TU_CHECK(sg_advise_gen_predict(&c, &p, SG_GEN_LOOP, &m) == SG_OK, "loop, cheap turn: %s", m.note);
    close_to("loop, cheap turn", m.device_us, 198);
    /* No device timings (the CPU backend, or no CUPTI): the gaps count 0, and the note says so. */
    c.device_timed = 0, c.eager_gap_us = c.node_gap_us = c.graph_gap_us = c.node_device_us = NAN;
    p = profile_step();
    TU_CHECK(sg_advise_gen_predict(&c, &p, SG_GEN_EAGER, &m) == SG_OK, "untimed eager: %s", m.note);
    close_to("untimed eager device", m.device_us, 200), close_to("untimed eager ms", m.predicted_ms, 0.315);
    TU_CHECK(strstr(m.note, "counted 0") != NULL, "note '%s'", m.note);
    TU_CHECK(sg_advise_gen_predict(&c, &p, SG_GEN_LOOP, &m) == SG_OK, "untimed loop: %s", m.note);
    close_to("untimed loop", m.device_us, 203);
    /* No WHILE turn: loop not predicted, not an error. */
    p.while_turn_us = NAN;
    TU_CHECK(sg_advise_gen_predict(&c, &p, SG_GEN_LOOP, &m) == SG_OK && !m.predicted && m.predicted_ms == 0,
             "loop without a turn: predicted %d, %g ms", m.predicted, m.predicted_ms);
    TU_CHECK(strstr(m.note, "WHILE") != NULL, "note '%s'", m.note);
}

static void predict_refusals(void)
{
    sg_advise_calib c = calib_timed();
    sg_advise_gen_profile p = profile_step();
    sg_advise_gen_mode m;
    TU_CHECK(sg_advise_gen_predict(NULL, &p, SG_GEN_STEP, &m) == SG_ERR_NULL, "NULL calib");
    TU_CHECK(sg_advise_gen_predict(&c, &p, (sg_gen_mode)3, &m) == SG_ERR_INVALID && strstr(m.note, "mode 3"),
             "mode 3: '%s'", m.note);
    p.graph_us = -1;
    TU_CHECK(sg_advise_gen_predict(&c, &p, SG_GEN_STEP, &m) == SG_ERR_INVALID && strstr(m.note, "profile.graph_us"),
             "negative graph_us: '%s'", m.note);
    p = profile_step(), p.launches = NAN;
    TU_CHECK(sg_advise_gen_predict(&c, &p, SG_GEN_EAGER, &m) == SG_ERR_INVALID && strstr(m.note, "profile.launches"),
             "NaN launches: '%s'", m.note);
    p = profile_step(), p.while_turn_us = -2;
    TU_CHECK(sg_advise_gen_predict(&c, &p, SG_GEN_LOOP, &m) == SG_ERR_INVALID && strstr(m.note, "while_turn_us"),
             "negative turn: '%s'", m.note);
    p = profile_step(), c.node_gap_us = INFINITY;
    TU_CHECK(sg_advise_gen_predict(&c, &p, SG_GEN_EAGER, &m) == SG_ERR_INVALID && strstr(m.note, "calib.node_gap_us"),
             "infinite node gap: '%s'", m.note);
}

/* ---- the flow ---- */

typedef struct prompts {
    int32_t tok[NSEQ][6];
    const int32_t *ptr[NSEQ];
    int64_t len[NSEQ];
} prompts;

static void draw_prompts(prompts *p)
{
    for (int i = 0; i < NSEQ; i++) {
        p->len[i] = tu_randint(1, 6);
        for (int k = 0; k < 6; k++) p->tok[i][k] = tu_randint(32, 126);
        p->ptr[i] = p->tok[i];
    }
}

static sg_generate_request request(const prompts *p, sg_gen_mode mode)
{
    sg_generate_request r = {0};
    r.n = NSEQ, r.prompts = p->ptr, r.prompt_lens = p->len, r.max_new = NEW, r.mode = mode;
    r.seed = (uint64_t)tu_randint(0, 1 << 30);
    return r;
}

static void same_tokens(sg_ctx *ctx, sg_generator *g, const sg_generate_request *r, const int32_t *want,
                        const char *when)
{
    int32_t tok[NSEQ * NEW];
    int64_t len[NSEQ];
    memset(tok, 0x5a, sizeof tok);
    TU_OK(ctx, sg_generate(g, r, tok, len, NULL, NULL));
    TU_CHECK(!memcmp(tok, want, sizeof tok), "%s: the greedy tokens changed", when);
}

static void flow(sg_ctx *ctx, sg_dtype prec)
{
    sg_model *m = NULL;
    sg_generator *g = NULL;
    sg_model_options mo = {.precision = prec};
    TU_OK(ctx, sg_model_create_ex(ctx, MODEL, 5, &mo, &m));
    sg_generator_options go = sg_generator_options_default();
    go.max_batch = 4;
    TU_OK(ctx, sg_generator_create(m, &go, &g));
    prompts p;
    draw_prompts(&p);
    sg_generate_request r = request(&p, SG_GEN_STEP);
    int32_t before[NSEQ * NEW];
    int64_t len[NSEQ];
    TU_OK(ctx, sg_generate(g, &r, before, len, NULL, NULL));
    /* A stop sequence that ends sequence 0 at its first token, and a shorter limit for 1: the
     * advisor's runs must not see either. */
    int32_t stop = before[0];
    int64_t each[NSEQ] = {NEW, 2, NEW};
    sg_generate_request ar = r;
    ar.stop = &stop, ar.n_stop = 1, ar.max_new_each = each, ar.mode = (sg_gen_mode)7;
    sg_advise_options o = sg_advise_options_default();
    o.repeats = 3;
    sg_advise_gen_result *res = malloc(sizeof *res);
    TU_CHECK(res != NULL, "out of memory");
    memset(res, 0x7f, sizeof *res); /* poisoned: no stale value can pass */
    TU_OK(ctx, sg_advise_generate(ctx, g, &ar, &o, res));
    const sg_advise_gen_profile *pf = &res->profile;
    TU_CHECK(res->batch == NSEQ && res->max_new == NEW && res->repeats == 3, "header: batch %d max_new %lld "
             "repeats %d", res->batch, (long long)res->max_new, res->repeats);
    int64_t longest = 0;
    for (int i = 0; i < NSEQ; i++) longest = p.len[i] > longest ? p.len[i] : longest;
    TU_CHECK(res->prompt_len == longest, "prompt_len %lld, expected %lld", (long long)res->prompt_len,
             (long long)longest);
    TU_CHECK(pf->steps == NEW - 1, "steps %lld, expected %d", (long long)pf->steps, NEW - 1);
    TU_CHECK(pf->nodes > 0 && pf->graph_us > 0 && pf->host_us > 0 && pf->readback_us >= 0 && isfinite(pf->readback_us),
             "profile: %d nodes, D %g, H %g, S %g", pf->nodes, pf->graph_us, pf->host_us, pf->readback_us);
    bool cpu = sg_ctx_backend(ctx) == SG_BACKEND_CPU;
    if (cpu) {
        TU_CHECK(pf->launches == 0 && pf->replay_us == 0, "CPU: launches %g, replay %g, expected 0", pf->launches,
                 pf->replay_us);
        TU_CHECK(!res->calib.device_timed && strstr(res->calib.note, "CPU"), "CPU calib note '%s'", res->calib.note);
    } else {
        /* Every launch of the eager step is a node of its graph: as many, or the graph more
         * (memsets and copies are nodes but not counted launches). */
        TU_CHECK(pf->launches >= 1 && pf->launches <= pf->nodes && pf->replay_us > 0, "GPU: launches %g nodes %d "
                 "replay %g", pf->launches, pf->nodes, pf->replay_us);
    }
    bool has_while = sg_graph_conditionals(ctx) & (1 << SG_COND_WHILE);
    TU_CHECK(has_while ? isfinite(pf->while_turn_us) && pf->while_turn_us >= 0 : isnan(pf->while_turn_us),
             "while turn %g (WHILE nodes: %d)", pf->while_turn_us, has_while);
    for (int k = SG_GEN_EAGER; k <= SG_GEN_LOOP; k++) {
        const sg_advise_gen_mode *md = &res->modes[k];
        const char *name = sg_gen_mode_name((sg_gen_mode)k);
        sg_advise_gen_mode again;
        memset(&again, 0, sizeof again);
        TU_CHECK(sg_advise_gen_predict(&res->calib, pf, (sg_gen_mode)k, &again) == SG_OK, "%s again", name);
        TU_CHECK(md->mode == (sg_gen_mode)k && md->predicted == again.predicted &&
                 md->predicted_ms == again.predicted_ms, "%s: the result's prediction %g is not the profile's %g",
                 name, md->predicted_ms, again.predicted_ms);
        if (k == SG_GEN_LOOP && !has_while) {
            TU_CHECK(!md->predicted && !md->measured, "loop without WHILE nodes predicted or measured");
            continue;
        }
        TU_CHECK(md->predicted && md->predicted_ms > 0 && md->measured, "%s: predicted %d (%g ms), measured %d",
                 name, md->predicted, md->predicted_ms, md->measured);
        TU_CHECK(md->prefill_ms > 0 && md->total_ms > 0 && md->host_us_per_token > 0, "%s: prefill %g total %g host %g",
                 name, md->prefill_ms, md->total_ms, md->host_us_per_token);
        close_to("measured_ms", md->measured_ms, (md->total_ms - md->prefill_ms) / (NEW - 1));
        close_to("ratio", md->ratio, md->predicted_ms / md->measured_ms);
    }
    TU_CHECK(res->cpu >= 0 ? strstr(res->cpu_note, "held on core") != NULL : res->cpu_note[0] != 0, "cpu %d '%s'",
             res->cpu, res->cpu_note);
    same_tokens(ctx, g, &r, before, "after sg_advise_generate");
    /* Predict only. */
    o.measure = 0, o.repeats = 1;
    TU_OK(ctx, sg_advise_generate(ctx, g, &ar, &o, res));
    for (int k = SG_GEN_EAGER; k <= SG_GEN_LOOP; k++)
        TU_CHECK(!res->modes[k].measured && isnan(res->modes[k].ratio), "measure 0: mode %d measured", k);
    /* Refusals, the generator usable after each. */
    o = sg_advise_options_default(), o.repeats = 1;
    TU_CHECK(sg_advise_generate(NULL, g, &r, &o, res) == SG_ERR_NULL, "NULL ctx");
    TU_FAILS(ctx, sg_advise_generate(ctx, NULL, &r, &o, res), SG_ERR_NULL, "generator");
    TU_FAILS(ctx, sg_advise_generate(ctx, g, &r, &o, NULL), SG_ERR_NULL, "out");
    sg_generate_request bad = r;
    bad.max_new = 1;
    TU_FAILS(ctx, sg_advise_generate(ctx, g, &bad, &o, res), SG_ERR_INVALID, "max_new 1");
    bad = r, bad.n = 5;
    TU_FAILS(ctx, sg_advise_generate(ctx, g, &bad, &o, res), SG_ERR_INVALID, "max_batch");
    bad = r, bad.temperature = NAN;
    TU_FAILS(ctx, sg_advise_generate(ctx, g, &bad, &o, res), SG_ERR_INVALID, "temperature");
    sg_advise_calib c = calib_timed();
    c.launch_host_us = -1;
    o.calib = &c;
    TU_FAILS(ctx, sg_advise_generate(ctx, g, &r, &o, res), SG_ERR_INVALID, "calib.launch_host_us");
    o.calib = NULL, o.repeats = 0;
    TU_FAILS(ctx, sg_advise_generate(ctx, g, &r, &o, res), SG_ERR_INVALID, "repeats 0");
    sg_ctx *other = tu_ctx(SG_BACKEND_CPU);
    o.repeats = 1;
    TU_FAILS(other, sg_advise_generate(other, g, &r, &o, res), SG_ERR_INVALID, "another context");
    sg_ctx_destroy(other);
    same_tokens(ctx, g, &r, before, "after the refusals");
    free(res);
    sg_generator_destroy(g);
    sg_model_destroy(m);
}

int main(int argc, char **argv)
{
    sg_backend be;
    if (!tu_start("advise_gen", argc, argv, &be)) return TU_SKIP;
    predict_by_hand();
    predict_refusals();
    sg_ctx *ctx = tu_ctx(be);
    flow(ctx, SG_DTYPE_F32);
    flow(ctx, SG_DTYPE_BF16);
    sg_ctx_destroy(ctx);
    return tu_finish("advise_gen");
}
