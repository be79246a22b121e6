/* test_embedding.c: token + position embedding, forward and backward. `cpu`: the forward
 * against the formula written here, float64 finite differences of dwte and dwpe (random tokens
 * with repeats, T < Tmax, unused vocabulary rows), bf16 storage against f64 on the same bf16
 * values, argument errors (tokens out of range and mixed dtypes included; the context usable
 * afterwards), and a captured plan that replays it. `gpu`: the CUDA kernels, f32 and bf16,
 * against the CPU reference in the same dtype on fresh random inputs, outputs poisoned first;
 * out-of-range tokens (zero rows, no gradient); bitwise determinism; one launch per call; a
 * captured graph that reproduces the eager results bit for bit. */
#include "testutil.h"

/* ---- shared helpers ---- */

typedef struct emb_shape {
    int64_t B, T, Tmax, C, V;
    bool y2d; /* y and dy as (B*T, C) instead of (B, T, C) */
} emb_shape;

static const char *shape_name(const emb_shape *s, char *buf, size_t n)
{
    snprintf(buf, n, "embedding B=%lld T=%lld Tmax=%lld C=%lld V=%lld%s", (long long)s->B,
             (long long)s->T, (long long)s->Tmax, (long long)s->C, (long long)s->V,
             s->y2d ? " y (B*T, C)" : "");
    return buf;
}

/* y or dy of the shape's layout. */
static sg_tensor *act_tensor(sg_ctx *ctx, sg_dtype dt, const emb_shape *s, const char *name)
{
    if (s->y2d) return tu_tensor2(ctx, dt, s->B * s->T, s->C, name);
    int64_t sh[3] = {s->B, s->T, s->C};
    return tu_tensor(ctx, dt, 3, sh, name);
}

/* Random tokens in 0..hi with at least one repeat (position 1 copies position 0). */
static double *random_tokens(sg_tensor *tokens, int hi)
{
    int64_t n = tokens->numel;
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = tu_randint(0, hi);
    if (n >= 2) v[1] = v[0];
    tu_set(tokens, v);
    return v;
}

/* y[i] = wte[tok[i]] + wpe[i % T], straight from the definition. */
static void naive_forward(const double *tok, const double *wte, const double *wpe, int64_t BT,
                          int64_t T, int64_t C, double *y)
{
    for (int64_t i = 0; i < BT; i++)
        for (int64_t c = 0; c < C; c++)
            y[i * C + c] = wte[(int64_t)tok[i] * C + c] + wpe[(i % T) * C + c];
}


/* ---- cpu: formula, finite differences, errors ---- */

typedef struct emb_case {
    sg_ctx *ctx;
    sg_tensor *tokens, *wte, *wpe, *y, *r;
} emb_case;

/* L = sum(y * r): the backward with dy = r gives dL/dwte and dL/dwpe. */
static double emb_loss(void *u)
{
    emb_case *c = u;
    TU_OK(c->ctx, sg_embedding_forward(c->ctx, c->tokens, c->wte, c->wpe, c->y));
    return tu_dot(c->y, c->r);
}

static void cpu_gradcheck(sg_ctx *ctx, emb_shape s)
{
    char what[160];
    shape_name(&s, what, sizeof what);
    sg_tensor *tokens = tu_tensor2(ctx, SG_DTYPE_I32, s.B, s.T, "tokens");
    sg_tensor *wte = tu_tensor2(ctx, SG_DTYPE_F64, s.V, s.C, "wte"),
              *wpe = tu_tensor2(ctx, SG_DTYPE_F64, s.Tmax, s.C, "wpe");
    sg_tensor *dwte = tu_tensor2(ctx, SG_DTYPE_F64, s.V, s.C, "dwte"),
              *dwpe = tu_tensor2(ctx, SG_DTYPE_F64, s.Tmax, s.C, "dwpe");
    sg_tensor *y = act_tensor(ctx, SG_DTYPE_F64, &s, "y"),
              *r = act_tensor(ctx, SG_DTYPE_F64, &s, "r");
    double *tv = random_tokens(tokens, (int)s.V - 2); /* row V-1 is never used */
    double *ev = tu_random(wte, -1, 1), *pv = tu_random(wpe, -1, 1);
    free(tu_random(r, -1, 1));

    tu_poison(y);
    TU_OK(ctx, sg_embedding_forward(ctx, tokens, wte, wpe, y));
    int64_t BT = s.B * s.T;
    double *ye = malloc((size_t)(BT * s.C) * sizeof *ye);
    naive_forward(tv, ev, pv, BT, s.T, s.C, ye);
    char w[224];
    snprintf(w, sizeof w, "%s: y vs formula", what);
    tu_close_vals(w, y, ye, BT * s.C, (tu_tol){0, 0}); /* one add: exact */

    tu_poison(dwte), tu_poison(dwpe);
    TU_OK(ctx, sg_embedding_backward(ctx, tokens, r, dwte, dwpe));
    /* Written in full: the unused vocabulary row and the positions >= T are exactly 0. */
    for (int64_t c = 0; c < s.C; c++)
        TU_CHECK(sg_ld(dwte, (s.V - 1) * s.C + c) == 0.0, "%s: unused dwte row has %g", what,
                 sg_ld(dwte, (s.V - 1) * s.C + c));
    for (int64_t k = s.T * s.C; k < s.Tmax * s.C; k++)
        TU_CHECK(sg_ld(dwpe, k) == 0.0, "%s: dwpe[%lld] beyond T is %g", what, (long long)(k / s.C),
                 sg_ld(dwpe, k));
    emb_case c = {ctx, tokens, wte, wpe, y, r};
    /* L is linear in wte and wpe: central differences are exact up to rounding. */
    tu_tol tol = {1e-8, 1e-6};
    snprintf(w, sizeof w, "%s dwte", what);
    tu_gradcheck(w, emb_loss, &c, wte, dwte, 0, 1e-3, tol);
    snprintf(w, sizeof w, "%s dwpe", what);
    tu_gradcheck(w, emb_loss, &c, wpe, dwpe, 0, 1e-3, tol);
    free(tv), free(ev), free(pv), free(ye);
    sg_tensor *ts[] = {tokens, wte, wpe, dwte, dwpe, y, r};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* The f32 path (the GPU test's oracle) against the formula: an f32 add, exact both ways. */
static void cpu_f32(sg_ctx *ctx)
{
    emb_shape s = {tu_randint(1, 4),  tu_randint(1, 9),  0,
                   tu_randint(1, 40), tu_randint(1, 30), false};
    s.Tmax = s.T + tu_randint(0, 3);
    sg_tensor *tokens = tu_tensor2(ctx, SG_DTYPE_I32, s.B, s.T, "tokens");
    sg_tensor *wte = tu_tensor2(ctx, SG_DTYPE_F32, s.V, s.C, "wte"),
              *wpe = tu_tensor2(ctx, SG_DTYPE_F32, s.Tmax, s.C, "wpe");
    sg_tensor *y = act_tensor(ctx, SG_DTYPE_F32, &s, "y");
    double *tv = random_tokens(tokens, (int)s.V - 1);
    free(tu_random(wte, -1, 1)), free(tu_random(wpe, -1, 1));
    double *ev = tu_get(wte), *pv = tu_get(wpe);
    int64_t BT = s.B * s.T;
    double *ye = malloc((size_t)(BT * s.C) * sizeof *ye);
    naive_forward(tv, ev, pv, BT, s.T, s.C, ye);
    for (int64_t i = 0; i < BT * s.C; i++) ye[i] = (float)ye[i];
    TU_OK(ctx, sg_embedding_forward(ctx, tokens, wte, wpe, y));
    tu_close_vals("embedding f32 cpu y vs formula", y, ye, BT * s.C, (tu_tol){0, 0});
    free(tv), free(ev), free(pv), free(ye);
    sg_tensor *ts[] = {tokens, wte, wpe, y};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* bf16 on the CPU: wte, wpe, y, dy, dwte, dwpe bf16. The forward against the formula on the
 * bf16 values, the backward against the f64 backward (checked by finite differences above) on
 * the same dy: the reference adds and sums in double and rounds only the outputs, so it sits
 * within half a bf16 ulp of f64, inside the bf16 rule. Repeated tokens: dwte rows are sums. */
static void cpu_bf16(sg_ctx *ctx)
{
    emb_shape s = {tu_randint(1, 4),  tu_randint(1, 9),  0,
                   tu_randint(1, 40), tu_randint(1, 30), tu_randint(0, 1)};
    s.Tmax = s.T + tu_randint(0, 3);
    const sg_dtype bf = SG_DTYPE_BF16, f64 = SG_DTYPE_F64;
    sg_tensor *tokens = tu_tensor2(ctx, SG_DTYPE_I32, s.B, s.T, "tokens");
    sg_tensor *wte = tu_tensor2(ctx, bf, s.V, s.C, "wte"),
              *wpe = tu_tensor2(ctx, bf, s.Tmax, s.C, "wpe");
    sg_tensor *dwte = tu_tensor2(ctx, bf, s.V, s.C, "dwte"),
              *dwpe = tu_tensor2(ctx, bf, s.Tmax, s.C, "dwpe");
    sg_tensor *y = act_tensor(ctx, bf, &s, "y"), *dy = act_tensor(ctx, bf, &s, "dy");
    double *tv = random_tokens(tokens, (int)s.V - 1);
    free(tu_random(wte, -1, 1)), free(tu_random(wpe, -1, 1)), free(tu_random(dy, -1, 1));
    double *ev = tu_get(wte), *pv = tu_get(wpe); /* as stored in bf16 */
    int64_t BT = s.B * s.T;
    double *ye = malloc((size_t)(BT * s.C) * sizeof *ye);
    naive_forward(tv, ev, pv, BT, s.T, s.C, ye);
    tu_poison(y);
    TU_OK(ctx, sg_embedding_forward(ctx, tokens, wte, wpe, y));
    tu_close_vals("embedding bf16 cpu y vs formula", y, ye, BT * s.C, tu_tol_for(bf));

    sg_tensor *dy64 = tu_clone_to(ctx, dy, f64);
    sg_tensor *dwte64 = tu_tensor2(ctx, f64, s.V, s.C, "dwte64"),
              *dwpe64 = tu_tensor2(ctx, f64, s.Tmax, s.C, "dwpe64");
    TU_OK(ctx, sg_embedding_backward(ctx, tokens, dy64, dwte64, dwpe64));
    tu_poison(dwte), tu_poison(dwpe);
    TU_OK(ctx, sg_embedding_backward(ctx, tokens, dy, dwte, dwpe));
    tu_close_tensors("embedding bf16 cpu dwte vs f64", dwte, dwte64, tu_tol_for(bf));
    tu_close_tensors("embedding bf16 cpu dwpe vs f64", dwpe, dwpe64, tu_tol_for(bf));
    free(tv), free(ev), free(pv), free(ye);
    sg_tensor *ts[] = {tokens, wte, wpe, dwte, dwpe, y, dy, dy64, dwte64, dwpe64};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* Mixed float dtypes: wte (forward) or dy (backward) sets the dtype of every float tensor; the
 * first that differs is named. No f64 tensors, so it runs on either backend. */
static void mixed_dtypes(sg_ctx *ctx)
{
    const int64_t B = 2, T = 3, C = 4, V = 7;
    const sg_dtype bf = SG_DTYPE_BF16, f32 = SG_DTYPE_F32;
    sg_tensor *tokens = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens");
    sg_tensor *wteb = tu_tensor2(ctx, bf, V, C, "wteb"), *wpeb = tu_tensor2(ctx, bf, T, C, "wpeb");
    sg_tensor *wtef = tu_tensor2(ctx, f32, V, C, "wtef"),
              *wpef = tu_tensor2(ctx, f32, T, C, "wpef");
    sg_tensor *yb = tu_tensor(ctx, bf, 3, (int64_t[]){B, T, C}, "yb"),
              *yf = tu_tensor(ctx, f32, 3, (int64_t[]){B, T, C}, "yf");
    free(random_tokens(tokens, (int)V - 1));
    free(tu_random(wteb, -1, 1)), free(tu_random(wpeb, -1, 1)), free(tu_random(yb, -1, 1));
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wteb, wpef, yb), SG_ERR_DTYPE,
             "sg_embedding_forward: tensor 'wpe' is f32, expected bf16");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wtef, wpeb, yf), SG_ERR_DTYPE,
             "tensor 'wpe' is bf16, expected f32");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wteb, wpeb, yf), SG_ERR_DTYPE,
             "'y' is (2, 3, 4) f32 but 'wte' is (7, 4) bf16; expected C = 4 and the same dtype");
    TU_OK(ctx, sg_embedding_forward(ctx, tokens, wteb, wpeb, yb));
    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, yb, wtef, wpeb), SG_ERR_DTYPE,
             "sg_embedding_backward: tensor 'dwte' is f32, expected bf16");
    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, yb, wteb, wpef), SG_ERR_DTYPE,
             "tensor 'dwpe' is f32, expected bf16");
    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, yf, wteb, wpef), SG_ERR_DTYPE,
             "tensor 'dwte' is bf16, expected f32");
    TU_OK(ctx, sg_embedding_backward(ctx, tokens, yb, wteb, wpeb));
    sg_tensor *ts[] = {tokens, wteb, wpeb, wtef, wpef, yb, yf};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void cpu_errors(sg_ctx *ctx)
{
    const int64_t B = 2, T = 3, C = 4, V = 7;
    sg_tensor *tokens = tu_tensor2(ctx, SG_DTYPE_I32, B, T, "tokens");
    sg_tensor *wte = tu_tensor2(ctx, SG_DTYPE_F64, V, C, "wte"),
              *wpe = tu_tensor2(ctx, SG_DTYPE_F64, T + 1, C, "wpe");
    sg_tensor *y = tu_tensor(ctx, SG_DTYPE_F64, 3, (int64_t[]){B, T, C}, "y");
    sg_tensor *dwte = tu_tensor2(ctx, SG_DTYPE_F64, V, C, "dwte"),
              *dwpe = tu_tensor2(ctx, SG_DTYPE_F64, T + 1, C, "dwpe");
    sg_tensor *t_f32 = tu_tensor2(ctx, SG_DTYPE_F32, B, T, "t_f32"),
              *t_1d = tu_tensor1(ctx, SG_DTYPE_I32, B * T, "t_1d");
    sg_tensor *wte_b = tu_tensor2(ctx, SG_DTYPE_BF16, V, C, "wte_b"),
              *wte_1d = tu_tensor1(ctx, SG_DTYPE_F64, C, "wte_1d");
    sg_tensor *wpe_short = tu_tensor2(ctx, SG_DTYPE_F64, T - 1, C, "wpe_short"),
              *wpe_c5 = tu_tensor2(ctx, SG_DTYPE_F64, T, C + 1, "wpe_c5");
    sg_tensor *wpe_f32 = tu_tensor2(ctx, SG_DTYPE_F32, T, C, "wpe_f32");
    sg_tensor *y_t4 = tu_tensor(ctx, SG_DTYPE_F64, 3, (int64_t[]){B, T + 1, C}, "y_t4");
    sg_tensor *y_c5 = tu_tensor(ctx, SG_DTYPE_F64, 3, (int64_t[]){B, T, C + 1}, "y_c5");
    sg_tensor *y_f32 = tu_tensor(ctx, SG_DTYPE_F32, 3, (int64_t[]){B, T, C}, "y_f32");
    sg_tensor *dwte_c5 = tu_tensor2(ctx, SG_DTYPE_F64, V, C + 1, "dwte_c5");
    sg_tensor *base = tu_tensor1(ctx, SG_DTYPE_F64, B * T * C, "base"), *wte_v = NULL, *y_v = NULL;
    TU_OK(ctx, sg_tensor_view(base, 0, 2, (int64_t[]){B * T, C}, "wte_view", &wte_v));
    TU_OK(ctx, sg_tensor_view(base, C, 3, (int64_t[]){B, T - 1, C}, "y_view", &y_v));
    sg_tensor *tok2 = tu_tensor2(ctx, SG_DTYPE_I32, B, T - 1, "tok2");
    double *tv = random_tokens(tokens, (int)V - 1);
    free(random_tokens(tok2, (int)V - 1));
    free(tu_random(wte, -1, 1)), free(tu_random(wpe, -1, 1)), free(tu_random(y, -1, 1));

    const char *F = "sg_embedding_forward";
    TU_FAILS(ctx, sg_embedding_forward(ctx, NULL, wte, wpe, y), SG_ERR_NULL,
             "sg_embedding_forward: tensor 'tokens' is NULL");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, NULL, wpe, y), SG_ERR_NULL,
             "tensor 'wte' is NULL");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wte, NULL, y), SG_ERR_NULL,
             "tensor 'wpe' is NULL");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wte, wpe, NULL), SG_ERR_NULL,
             "tensor 'y' is NULL");
    TU_CHECK(sg_embedding_forward(NULL, tokens, wte, wpe, y) == SG_ERR_NULL, "%s: ctx NULL", F);
    TU_FAILS(ctx, sg_embedding_forward(ctx, t_f32, wte, wpe, y), SG_ERR_DTYPE,
             "tensor 'tokens' is f32, expected i32");
    TU_FAILS(ctx, sg_embedding_forward(ctx, t_1d, wte, wpe, y), SG_ERR_SHAPE,
             "'tokens' is (6) i32, expected (B, T) i32");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, t_1d, wpe, y), SG_ERR_DTYPE,
             "tensor 'wte' is i32, expected f32 or f64");
    /* bf16 wte is taken (mixed precision); then wpe must be bf16 too. */
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wte_b, wpe, y), SG_ERR_DTYPE,
             "tensor 'wpe' is f64, expected bf16");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wte_1d, wpe, y), SG_ERR_SHAPE,
             "'wte' is (4) f64, expected (V, 4) f64");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wte, wpe_short, y), SG_ERR_SHAPE,
             "'wpe' is (2, 4) f64, expected (Tmax >= 3, 4) f64");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wte, wpe_c5, y), SG_ERR_SHAPE,
             "'wpe' is (3, 5) f64, expected (Tmax >= 3, 4)");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wte, wpe_f32, y), SG_ERR_DTYPE,
             "tensor 'wpe' is f32, expected f64");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wte, wpe, y_t4), SG_ERR_SHAPE,
             "'y' is (2, 4, 4) f64, expected (2, 3, C) or (6, C)");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wte, wpe, y_c5), SG_ERR_SHAPE,
             "'y' is (2, 3, 5) f64 but 'wte' is (7, 4) f64");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wte, wpe, y_f32), SG_ERR_DTYPE,
             "expected C = 4 and the same dtype");
    TU_FAILS(ctx, sg_embedding_forward(ctx, tok2, wte_v, wpe, y_v), SG_ERR_INVALID,
             "output 'y' overlaps 'wte'");

    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, NULL, dwte, dwpe), SG_ERR_NULL,
             "sg_embedding_backward: tensor 'dy' is NULL");
    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, y, NULL, dwpe), SG_ERR_NULL,
             "tensor 'dwte' is NULL");
    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, y, dwte, NULL), SG_ERR_NULL,
             "tensor 'dwpe' is NULL");
    TU_FAILS(ctx, sg_embedding_backward(ctx, t_1d, y, dwte, dwpe), SG_ERR_SHAPE,
             "'tokens' is (6) i32");
    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, y_t4, dwte, dwpe), SG_ERR_SHAPE,
             "'dy' is (2, 4, 4) f64");
    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, y, dwte_c5, dwpe), SG_ERR_SHAPE,
             "'dwte' is (7, 5) f64, expected (V, 4) f64");
    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, y, dwte, wpe_short), SG_ERR_SHAPE,
             "'dwpe' is (2, 4) f64, expected (Tmax >= 3, 4) f64");
    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, y, dwte, wpe_f32), SG_ERR_DTYPE,
             "tensor 'dwpe' is f32, expected f64");
    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, y, dwpe, dwpe), SG_ERR_INVALID,
             "output 'dwte' overlaps 'dwpe'");

    /* Tokens out of range: an error naming the position, and nothing written. */
    const double keep = 12345.0;
    TU_OK(ctx, sg_tensor_fill(y, keep));
    TU_OK(ctx, sg_tensor_fill(dwte, keep));
    TU_OK(ctx, sg_tensor_fill(dwpe, keep));
    int32_t *tk = tokens->data;
    tk[5] = (int32_t)V; /* (1, 2) */
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wte, wpe, y), SG_ERR_INVALID,
             "sg_embedding_forward: tokens[1][2] is 7, but 'wte' has 7 rows; expected 0 to 6");
    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, y, dwte, dwpe), SG_ERR_INVALID,
             "sg_embedding_backward: tokens[1][2] is 7");
    tk[5] = (int32_t)tv[5];
    tk[0] = -1;
    TU_FAILS(ctx, sg_embedding_forward(ctx, tokens, wte, wpe, y), SG_ERR_INVALID,
             "tokens[0][0] is -1");
    TU_FAILS(ctx, sg_embedding_backward(ctx, tokens, y, dwte, dwpe), SG_ERR_INVALID,
             "tokens[0][0] is -1");
    for (int64_t i = 0; i < y->numel; i++)
        TU_CHECK(sg_ld(y, i) == keep, "a failed forward wrote y[%lld]", (long long)i);
    for (int64_t i = 0; i < dwte->numel; i++)
        TU_CHECK(sg_ld(dwte, i) == keep, "a failed backward wrote dwte[%lld]", (long long)i);
    for (int64_t i = 0; i < dwpe->numel; i++)
        TU_CHECK(sg_ld(dwpe, i) == keep, "a failed backward wrote dwpe[%lld]", (long long)i);
    tk[0] = (int32_t)tv[0];

    /* The context is still usable, and computes the right thing. */
    TU_OK(ctx, sg_embedding_forward(ctx, tokens, wte, wpe, y));
    double *ev = tu_get(wte), *pv = tu_get(wpe), ye[2 * 3 * 4];
    naive_forward(tv, ev, pv, B * T, T, C, ye);
    tu_close_vals("embedding after errors: y", y, ye, B * T * C, (tu_tol){0, 0});
    TU_OK(ctx, sg_embedding_backward(ctx, tokens, y, dwte, dwpe));
    TU_CHECK(sg_ld(dwpe, T * C) == 0.0, "embedding after errors: dwpe beyond T is %g",
             sg_ld(dwpe, T * C));
    free(tv), free(ev), free(pv);
    sg_tensor *ts[] = {tokens, wte,   wpe,     y,         dwte,   dwpe,    t_f32,
                       t_1d,   wte_b, wte_1d,  wpe_short, wpe_c5, wpe_f32, y_t4,
                       y_c5,   y_f32, dwte_c5, wte_v,     y_v,    base,    tok2};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* ---- capture: recorded into a graph (CPU: a plan), replayed with new tokens ---- */

typedef struct emb_step {
    sg_ctx *ctx;
    const sg_tensor *tokens, *wte, *wpe, *dy;
    sg_tensor *y, *dwte, *dwpe;
} emb_step;

static sg_status emb_step_fn(void *u)
{
    emb_step *s = u;
    SG_TRY(sg_embedding_forward(s->ctx, s->tokens, s->wte, s->wpe, s->y));
    return sg_embedding_backward(s->ctx, s->tokens, s->dy, s->dwte, s->dwpe);
}

/* dt: f32 or bf16. */
static void capture_case(sg_ctx *ctx, emb_shape s, sg_dtype dt)
{
    char what[160];
    shape_name(&s, what, sizeof what);
    snprintf(what + strlen(what), sizeof what - strlen(what), " %s", sg_dtype_name(dt));
    sg_tensor *tokens = tu_tensor2(ctx, SG_DTYPE_I32, s.B, s.T, "tokens");
    sg_tensor *wte = tu_tensor2(ctx, dt, s.V, s.C, "wte"),
              *wpe = tu_tensor2(ctx, dt, s.Tmax, s.C, "wpe");
    sg_tensor *dy = act_tensor(ctx, dt, &s, "dy");
    emb_step e = {.ctx = ctx, .tokens = tokens, .wte = wte, .wpe = wpe, .dy = dy}, r = e;
    emb_step *both[2] = {&e, &r};
    for (int k = 0; k < 2; k++) {
        both[k]->y = act_tensor(ctx, dt, &s, "y");
        both[k]->dwte = tu_tensor2(ctx, dt, s.V, s.C, "dwte");
        both[k]->dwpe = tu_tensor2(ctx, dt, s.Tmax, s.C, "dwpe");
    }
    free(random_tokens(tokens, (int)s.V - 1));
    free(tu_random(wte, -1, 1)), free(tu_random(wpe, -1, 1)), free(tu_random(dy, -1, 1));

    const sg_tensor *ins[2] = {tokens, dy};
    sg_graph_options o = sg_graph_options_default();
    o.name = "embedding";
    o.warmup = 1;
    o.static_inputs = ins;
    o.n_static_inputs = 2;
    sg_graph *graph = NULL;
    TU_OK(ctx, sg_graph_capture(ctx, emb_step_fn, &r, &o, &graph));
    for (int round = 0; round < 2; round++) {
        if (round) free(random_tokens(tokens, (int)s.V - 1)); /* new tokens, in place */
        sg_tensor *outs[6] = {e.y, e.dwte, e.dwpe, r.y, r.dwte, r.dwpe};
        for (int i = 0; i < 6; i++) tu_poison(outs[i]);
        TU_OK(ctx, emb_step_fn(&e));
        TU_OK(ctx, sg_graph_replay(graph));
        for (int i = 0; i < 3; i++) {
            char w[320];
            snprintf(w, sizeof w, "%s replay %d: %s vs eager", what, round, outs[i]->name);
            tu_close_tensors(w, outs[i + 3], outs[i], (tu_tol){0, 0});
        }
    }
    if (ctx->backend == SG_BACKEND_CPU) {
        /* The plan checks the tokens of the step it replays. */
        int32_t *tk = tokens->data, keep = tk[0];
        tk[0] = (int32_t)s.V;
        TU_FAILS(ctx, sg_graph_replay(graph), SG_ERR_INVALID, "tokens[0][0] is");
        tk[0] = keep;
        TU_OK(ctx, sg_graph_replay(graph));
    }
    sg_graph_destroy(graph);
    sg_tensor *ts[] = {tokens, wte, wpe, dy, e.y, e.dwte, e.dwpe, r.y, r.dwte, r.dwpe};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void cpu_tests(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    int64_t T = tu_randint(1, 5);
    emb_shape a = {tu_randint(1, 3), T,    T + tu_randint(1, 3), 2 * tu_randint(1, 4),
                   tu_randint(3, 6), false};
    cpu_gradcheck(ctx, a); /* C even, T < Tmax */
    T = tu_randint(2, 6);
    emb_shape b = {tu_randint(2, 4), T, T + 2, 2 * tu_randint(0, 3) + 1, 2, true};
    cpu_gradcheck(ctx, b); /* C odd, V = 2 (one token value: every position repeats it), y 2-D */
    emb_shape c = {1, 1, 1, 1, 2, false};
    cpu_gradcheck(ctx, c);
    cpu_f32(ctx);
    cpu_bf16(ctx);
    cpu_errors(ctx);
    mixed_dtypes(ctx);
    emb_shape d = {tu_randint(1, 4), 5, 7, tu_randint(1, 20), tu_randint(2, 30), false};
    capture_case(ctx, d, SG_DTYPE_F32);
    capture_case(ctx, d, SG_DTYPE_BF16);
    sg_ctx_destroy(ctx);
}

/* ---- gpu: CUDA against the CPU reference ---- */

/* One shape, one dtype dt (f32 or bf16): forward and backward against the CPU reference in dt,
 * outputs poisoned; then again: bitwise the same and one launch each. Tolerance: dt's rule
 * holds as is. y is one add, correctly rounded on both sides (in bf16 the f32 sum of two bf16
 * values is exact, or its rounding to bf16 is the same as the double's); the GPU sums dwte and
 * dwpe in double in the reference's order, so only the final rounding to dt can differ. When
 * `odd`, wte is a view one element into a buffer (4 or 2 mod 16): the forward must take its
 * scalar path. */
static void gpu_case(sg_ctx *gpu, sg_ctx *cpu, emb_shape s, bool odd, sg_dtype dt)
{
    char what[192];
    shape_name(&s, what, sizeof what);
    snprintf(what + strlen(what), sizeof what - strlen(what), " %s%s", sg_dtype_name(dt),
             odd ? " unaligned wte" : "");
    sg_tensor *tokens = tu_tensor2(gpu, SG_DTYPE_I32, s.B, s.T, "tokens");
    sg_tensor *wbase = NULL, *wte;
    if (odd) {
        wbase = tu_tensor1(gpu, dt, s.V * s.C + 1, "wte_base");
        TU_OK(gpu, sg_tensor_view(wbase, 1, 2, (int64_t[]){s.V, s.C}, "wte", &wte));
    } else {
        wte = tu_tensor2(gpu, dt, s.V, s.C, "wte");
    }
    sg_tensor *wpe = tu_tensor2(gpu, dt, s.Tmax, s.C, "wpe");
    sg_tensor *y = act_tensor(gpu, dt, &s, "y"),
              *dy = act_tensor(gpu, dt, &s, "dy");
    sg_tensor *dwte = tu_tensor2(gpu, dt, s.V, s.C, "dwte"),
              *dwpe = tu_tensor2(gpu, dt, s.Tmax, s.C, "dwpe");
    free(random_tokens(tokens, (int)s.V - 1));
    free(tu_random(wte, -1, 1)), free(tu_random(wpe, -1, 1)), free(tu_random(dy, -1, 1));

    sg_tensor *tc = tu_clone_to(cpu, tokens, SG_DTYPE_I32),
              *ec = tu_clone_to(cpu, wte, dt), *pc = tu_clone_to(cpu, wpe, dt),
              *dyc = tu_clone_to(cpu, dy, dt);
    sg_tensor *yc = act_tensor(cpu, dt, &s, "y_ref");
    sg_tensor *dec = tu_tensor2(cpu, dt, s.V, s.C, "dwte_ref"),
              *dpc = tu_tensor2(cpu, dt, s.Tmax, s.C, "dwpe_ref");
    TU_OK(cpu, sg_embedding_forward(cpu, tc, ec, pc, yc));
    TU_OK(cpu, sg_embedding_backward(cpu, tc, dyc, dec, dpc));

    tu_tol tol = tu_tol_for(dt);
    tu_poison(y);
    TU_OK(gpu, sg_embedding_forward(gpu, tokens, wte, wpe, y));
    tu_close_named(what, "y", y, yc, tol);
    tu_poison(dwte), tu_poison(dwpe);
    TU_OK(gpu, sg_embedding_backward(gpu, tokens, dy, dwte, dwpe));
    tu_close_named(what, "dwte", dwte, dec, tol);
    tu_close_named(what, "dwpe", dwpe, dpc, tol);

    sg_tensor *outs[3] = {y, dwte, dwpe};
    void *first[3];
    for (int i = 0; i < 3; i++) first[i] = tu_raw(outs[i]), tu_poison(outs[i]);
    uint64_t n0 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_embedding_forward(gpu, tokens, wte, wpe, y));
    uint64_t n1 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_embedding_backward(gpu, tokens, dy, dwte, dwpe));
    uint64_t n2 = sg_ctx_launch_count(gpu);
    TU_CHECK(n1 - n0 == 1, "%s: forward made %llu launches, expected 1", what,
             (unsigned long long)(n1 - n0));
    TU_CHECK(n2 - n1 == 1, "%s: backward made %llu launches, expected 1", what,
             (unsigned long long)(n2 - n1));
    for (int i = 0; i < 3; i++) {
        TU_CHECK(tu_same_bytes(outs[i], first[i]), "%s: %s differs between two identical runs", what,
                 outs[i]->name);
        free(first[i]);
    }
    sg_tensor *ts[] = {tokens, wte, wbase, wpe, y, dy, dwte, dwpe, tc, ec, pc, dyc, yc, dec, dpc};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

/* Tokens outside 0..V-1 on CUDA (documented): the forward reads a zero wte row, the backward
 * gives that position's dy to no dwte row (dwpe still gets it). Expected values: the CPU
 * reference with one extra, zero, wte row V that every bad token is mapped to. */
static void gpu_bad_tokens(sg_ctx *gpu, sg_ctx *cpu, sg_dtype dt)
{
    emb_shape s = {3, 17, 20, 12, 9, false};
    sg_tensor *tokens = tu_tensor2(gpu, SG_DTYPE_I32, s.B, s.T, "tokens");
    sg_tensor *wte = tu_tensor2(gpu, dt, s.V, s.C, "wte"),
              *wpe = tu_tensor2(gpu, dt, s.Tmax, s.C, "wpe");
    sg_tensor *y = act_tensor(gpu, dt, &s, "y"),
              *dy = act_tensor(gpu, dt, &s, "dy");
    sg_tensor *dwte = tu_tensor2(gpu, dt, s.V, s.C, "dwte"),
              *dwpe = tu_tensor2(gpu, dt, s.Tmax, s.C, "dwpe");
    double *tv = random_tokens(tokens, (int)s.V - 1);
    const int32_t bad[4] = {-1, (int32_t)s.V, INT32_MAX, INT32_MIN};
    for (int k = 0; k < 4; k++) tv[tu_randint(0, (int)(s.B * s.T) - 1)] = bad[k];
    tu_set(tokens, tv);
    double *ev = tu_random(wte, -1, 1);
    free(tu_random(wpe, -1, 1)), free(tu_random(dy, -1, 1));

    sg_tensor *tc = tu_tensor2(cpu, SG_DTYPE_I32, s.B, s.T, "tokens_ref");
    sg_tensor *ec = tu_tensor2(cpu, dt, s.V + 1, s.C, "wte_ref");
    sg_tensor *pc = tu_clone_to(cpu, wpe, dt), *dyc = tu_clone_to(cpu, dy, dt);
    sg_tensor *yc = act_tensor(cpu, dt, &s, "y_ref");
    sg_tensor *dec = tu_tensor2(cpu, dt, s.V + 1, s.C, "dwte_ref"),
              *dpc = tu_tensor2(cpu, dt, s.Tmax, s.C, "dwpe_ref");
    for (int64_t i = 0; i < s.B * s.T; i++)
        tv[i] = (tv[i] < 0 || tv[i] >= s.V) ? (double)s.V : tv[i];
    tu_set(tc, tv);
    double *ext = calloc((size_t)((s.V + 1) * s.C), sizeof *ext);
    memcpy(ext, ev, (size_t)(s.V * s.C) * sizeof *ext);
    tu_set(ec, ext);
    TU_OK(cpu, sg_embedding_forward(cpu, tc, ec, pc, yc));
    TU_OK(cpu, sg_embedding_backward(cpu, tc, dyc, dec, dpc));

    char what_y[64], what_dwpe[64], what_dwte[64];
    snprintf(what_y, sizeof what_y, "embedding bad tokens %s: y", sg_dtype_name(dt));
    snprintf(what_dwpe, sizeof what_dwpe, "embedding bad tokens %s: dwpe", sg_dtype_name(dt));
    snprintf(what_dwte, sizeof what_dwte, "embedding bad tokens %s: dwte", sg_dtype_name(dt));
    tu_poison(y), tu_poison(dwte), tu_poison(dwpe);
    TU_OK(gpu, sg_embedding_forward(gpu, tokens, wte, wpe, y));
    TU_OK(gpu, sg_embedding_backward(gpu, tokens, dy, dwte, dwpe));
    tu_close_tensors(what_y, y, yc, tu_tol_for(dt));
    tu_close_tensors(what_dwpe, dwpe, dpc, tu_tol_for(dt));
    double *got = tu_get(dwte), *ref = tu_get(dec); /* the first V rows of the reference */
    tu_close(what_dwte, got, ref, s.V * s.C, tu_tol_for(dt));
    free(got), free(ref), free(tv), free(ev), free(ext);

    sg_tensor *ts[] = {tokens, wte, wpe, y, dy, dwte, dwpe, tc, ec, pc, dyc, yc, dec, dpc};
    tu_destroy_all(ts, sizeof ts / sizeof *ts);
}

static void gpu_tests(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    int64_t T = tu_randint(1, 256);
    /* The same shapes in both dtypes; C % 4 (f32) or C % 8 (bf16) == 0 takes 16-byte accesses. */
    emb_shape shapes[] = {
        {1, 1, 1, 4, 256, false},
        {8, 128, 128, 256, 256, false},
        {8, 256, 256, 768, 256, false},
        {8, 256, 256, 768, 256, true},
        {4, 64, 100, 33, 256, false}, /* C odd: scalar forward; Tmax > T */
        {2, 3, 5, 300, 7, true},      /* chunks of 128 columns, the last one partial */
        {16, 128, 128, 1, 3, false},  /* C = 1; 3 tokens, each repeated ~700 times */
        {70, 40, 40, 24, 5, false},   /* B*T = 2800: two tiles of positions (2048, 752), ~410
                                       * and ~150 uses of each token; 70 terms a dwpe sum */
        {tu_randint(1, 8), T, T + tu_randint(0, 40), tu_randint(1, 1000), tu_randint(1, 300),
         tu_randint(0, 1)},
    };
    const sg_dtype dts[2] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        sg_dtype dt = dts[d];
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            gpu_case(gpu, cpu, shapes[i], false, dt);
        emb_shape u = {8, 32, 32, 256, 256, false};
        gpu_case(gpu, cpu, u, true, dt);
        gpu_bad_tokens(gpu, cpu, dt);
        emb_shape c = {8, 256, 256, 768, 256, false};
        capture_case(gpu, c, dt);
    }
    mixed_dtypes(gpu);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_embedding");
    if (!strcmp(mode, "gpu"))
        gpu_tests();
    else
        cpu_tests();
    return tu_finish("test_embedding");
}
