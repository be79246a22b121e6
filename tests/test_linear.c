/* test_linear.c: the linear layer y = act(x @ w^T + b). `cpu`: the reference's forward against
 * a naive loop, float64 finite differences of its backward (x, w, b) for NONE, RELU and GELU
 * on random small shapes (N-D x included), f32 against f64, bf16 against f64 (the same op on
 * the bf16-rounded inputs), and argument errors (mixed dtypes included). `gpu`: the cuBLASLt
 * path against the CPU reference (f32 both; bf16 against f64) on several shapes, every act,
 * with and without bias and dx, outputs poisoned first; misaligned views; a repeated call
 * must reuse the cached plan (bitwise equal, no new device allocation, same launches); a context
 * that times matmul candidates (gemm_tune: tune_cases). */
#include "ops/linear.h"
#include "testutil.h"

static const char *act_name(sg_activation a)
{
    return a == SG_ACT_RELU ? "relu" : a == SG_ACT_GELU ? "gelu" : "none";
}

/* Written here from the formula, independently of src/ops. */
static double naive_gelu(double v)
{
    return 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

static double naive_gelu_grad(double v)
{
    double h = 1e-5; /* central difference of the formula, good to ~1e-10 */
    return (naive_gelu(v + h) - naive_gelu(v - h)) / (2 * h);
}

/* The same derivative in closed form, d/dv of naive_gelu: 0.5 (1 + t) + 0.5 v (1 - t^2) u'(v),
 * t = tanh(u), u = c (v + 0.044715 v^3), u' = c (1 + 3 * 0.044715 v^2). */
static double exact_gelu_grad(double v)
{
    const double c = 0.7978845608028654, t = tanh(c * (v + 0.044715 * v * v * v));
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * 0.044715 * v * v);
}

/* x's shape: (M, K), or (2, M/2, K) when nd and M is even; the same leading dims with last
 * dim c into out. Returns ndim. */
static int lead_shape(int64_t m, int nd, int64_t c, int64_t *out)
{
    if (nd && m % 2 == 0) {
        out[0] = 2, out[1] = m / 2, out[2] = c;
        return 3;
    }
    out[0] = m, out[1] = c;
    return 2;
}

/* ---- cpu: naive forward, finite differences ---- */

typedef struct {
    sg_ctx *ctx;
    sg_activation act;
    sg_tensor *x, *w, *b, *y, *pre, *r;
} fd_case;

static double fd_loss(void *u)
{
    fd_case *c = u;
    TU_OK(c->ctx, sg_linear_forward(c->ctx, c->x, c->w, c->b, c->act, c->y, c->pre));
    return tu_dot(c->y, c->r);
}

/* y (and pre) of the reference against a naive triple loop; res (NULL: none) is added to y
 * after the activation, as sg_linear_forward_residual does. */
static void check_forward_naive(const char *what, const sg_tensor *x, const sg_tensor *w,
                                const sg_tensor *b, sg_activation act, const double *res,
                                const sg_tensor *y, const sg_tensor *pre, tu_tol tol)
{
    int64_t n = w->shape[0], k = w->shape[1], m = x->numel / k;
    double *ry = malloc((size_t)(m * n) * sizeof *ry), *rp = malloc((size_t)(m * n) * sizeof *rp);
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < n; j++) {
            double s = b ? sg_ld(b, j) : 0;
            for (int64_t i = 0; i < k; i++) s += sg_ld(x, r * k + i) * sg_ld(w, j * k + i);
            rp[r * n + j] = s;
            ry[r * n + j] = act == SG_ACT_RELU ? (s > 0 ? s : 0) : act == SG_ACT_GELU ? naive_gelu(s) : s;
            if (res) ry[r * n + j] += res[r * n + j];
        }
    char label[224];
    double *gy = tu_get(y);
    snprintf(label, sizeof label, "%s: y vs naive", what);
    tu_close(label, gy, ry, m * n, tol);
    free(gy);
    if (pre) {
        double *gp = tu_get(pre);
        snprintf(label, sizeof label, "%s: pre vs naive", what);
        tu_close(label, gp, rp, m * n, tol);
        free(gp);
    }
    free(ry);
    free(rp);
}

/* The finite-difference step. */
#define FD_H 1e-6

/* max |v| over t's elements. */
static double max_abs(const sg_tensor *t)
{
    double m = 0;
    for (int64_t i = 0; i < t->numel; i++) m = fmax(m, fabs(sg_ld(t, i)));
    return m;
}

/* Fills t with k * 2^-7 (k uniform in -128..128: values in [-1, 1]); k odd in column 0 of the
 * last dimension (K long) when odd0, k even in the other columns when even_rest. */
static void fill_grid(sg_tensor *t, int64_t K, int odd0, int even_rest)
{
    double *v = malloc((size_t)t->numel * sizeof *v);
    for (int64_t i = 0; i < t->numel; i++) {
        int col0 = i % K == 0;
        int k = col0 && odd0 ? 2 * tu_randint(-64, 63) + 1
                : !col0 && even_rest ? 2 * tu_randint(-64, 64) : tu_randint(-128, 128);
        v[i] = k / 128.0;
    }
    tu_set(t, v);
    free(v);
}

/* ReLU's kink: L is linear in each element between kinks, so the central difference is exact
 * as long as no pre-activation crosses 0 when one element moves by h, which moves it by at
 * most h * max(|x|, |w|, 1 for the bias) <= h here (every value in [-1, 1]). Redrawing until
 * every |pre| clears a margin can fail for any margin (large shapes, tiny weights); instead
 * x, w and b are drawn on a grid that keeps every pre-activation KINK_GAP = 2^-15 (30 h) from
 * 0 for every seed: x and w are multiples of 2^-7, odd ones in column 0 of both and even ones
 * in w's other columns, so each dot product x_r . w_j is an odd multiple of 2^-14 (one odd
 * term, the rest even), never 0; b is an odd multiple of 2^-15, which keeps the sum an odd
 * multiple of 2^-15. f64 holds every such value and sum exactly. */
#define KINK_GAP 0x1p-15
static void relu_inputs(fd_case *c)
{
    int64_t k = c->w->shape[1];
    fill_grid(c->w, k, 1, 1);
    fill_grid(c->x, k, 1, 0);
    if (c->b) {
        double *v = malloc((size_t)c->b->numel * sizeof *v);
        for (int64_t j = 0; j < c->b->numel; j++) v[j] = (2 * tu_randint(-16384, 16383) + 1) * 0x1p-15;
        tu_set(c->b, v);
        free(v);
    }
}

/* The central difference's error bound, from the inputs (all in [-1, 1]). L = sum r * act(pre),
 * pre = x w^T + b, in f64: a sum of n terms is off by at most gamma_n = n u / (1 - n u) times
 * the sum of the terms' magnitudes (u = 2^-53, in any order of summation); here n = K + 1
 * (pre) + 16 (the activation: GELU's tanh and polynomial stay within 16 u of |pre|, and
 * |act(v)| <= |v|) + M*N + 1 (the sum with r). So L(e + h) and L(e - h) are each off by at most
 * gamma_n * S, S = sum |r| (|x| |w|^T + |b|), and their difference over 2h by gamma_n * S / h.
 * Truncation: none for NONE and RELU (L is linear in each element between kinks, see
 * relu_inputs); for GELU h^2 / 6 * max |GELU'''(v)| (0.777 < 0.8) * sum |r| (all |x|, |w| <= 1).
 * The step: e +- h rounds, moving h by up to u |e| <= u, a relative error of u / h on each
 * side of the difference: rtol 2 u / h. A factor 2 over all of it covers the analytic
 * gradient's own rounding (gamma_max(M,N) of its terms, far below) and S's change under a step. */
static tu_tol fd_tolerance(const fd_case *c)
{
    int64_t n = c->w->shape[0], k = c->w->shape[1], m = c->x->numel / k;
    double s = 0, sr = 0;
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < n; j++) {
            double a = c->b ? fabs(sg_ld(c->b, j)) : 0;
            for (int64_t i = 0; i < k; i++) a += fabs(sg_ld(c->x, r * k + i) * sg_ld(c->w, j * k + i));
            s += fabs(sg_ld(c->r, r * n + j)) * a;
            sr += fabs(sg_ld(c->r, r * n + j));
        }
    const double u = 0x1p-53, terms = (double)(k + 1 + 16 + m * n + 1);
    double gamma = terms * u / (1 - terms * u);
    double trunc = c->act == SG_ACT_GELU ? FD_H * FD_H / 6 * 0.8 * sr : 0;
    return (tu_tol){2 * (gamma * s / FD_H + trunc), 2 * (2 * u / FD_H)};
}

/* tu_gradcheck of the gradient of in, labelled "what: name". */
static void gradcheck_of(const char *what, const char *name, tu_loss_fn loss, void *user, sg_tensor *in,
                         const sg_tensor *grad, tu_tol tol)
{
    char label[120];
    snprintf(label, sizeof label, "%s: %s", what, name);
    tu_gradcheck(label, loss, user, in, grad, 0, FD_H, tol);
}

static void cpu_gradcheck_case(sg_ctx *ctx, sg_activation act, int64_t m, int64_t n, int64_t k,
                               int nd, int has_b, int has_dx)
{
    const sg_dtype f64 = SG_DTYPE_F64;
    int64_t xs[3], ys[3];
    int xnd = lead_shape(m, nd, k, xs);
    lead_shape(m, nd, n, ys);
    char what[96];
    snprintf(what, sizeof what, "cpu %s M=%lld N=%lld K=%lld ndim=%d bias=%d dx=%d", act_name(act),
             (long long)m, (long long)n, (long long)k, xnd, has_b, has_dx);

    fd_case c = {ctx, act, tu_keep(tu_tensor(ctx, f64, xnd, xs, "x")), tu_keep(tu_tensor2(ctx, f64, n, k, "w")),
                 has_b ? tu_keep(tu_tensor1(ctx, f64, n, "b")) : NULL, tu_keep(tu_tensor(ctx, f64, xnd, ys, "y")),
                 act == SG_ACT_GELU ? tu_keep(tu_tensor(ctx, f64, xnd, ys, "pre")) : NULL,
                 tu_keep(tu_tensor(ctx, f64, xnd, ys, "r"))};
    free(tu_random(c.r, -1, 1));
    if (act == SG_ACT_RELU) {
        relu_inputs(&c);
        /* What relu_inputs guarantees, measured: the smallest |pre| against the largest move of
         * a pre-activation by one element's step, h * max(|x|, |w|, 1 for the bias). */
        sg_tensor *lin = tu_keep(tu_tensor(ctx, f64, xnd, ys, "lin")); /* x w^T + b, no act */
        TU_OK(ctx, sg_linear_forward(ctx, c.x, c.w, c.b, SG_ACT_NONE, lin, NULL));
        double mn = INFINITY, move = FD_H * fmax(1, fmax(max_abs(c.x), max_abs(c.w)));
        for (int64_t i = 0; i < lin->numel; i++) mn = fmin(mn, fabs(sg_ld(lin, i)));
        TU_CHECK(mn >= KINK_GAP && KINK_GAP > 4 * move,
                 "%s: a pre-activation %.3g from ReLU's kink (grid bound %.3g); one step moves it by %.3g",
                 what, mn, KINK_GAP, move);
    } else {
        free(tu_random(c.w, -1, 1));
        if (c.b) free(tu_random(c.b, -1, 1));
        free(tu_random(c.x, -1, 1));
    }

    /* Forward against the naive loop. */
    tu_poison(c.y);
    if (c.pre) tu_poison(c.pre);
    TU_OK(ctx, sg_linear_forward(ctx, c.x, c.w, c.b, act, c.y, c.pre));
    check_forward_naive(what, c.x, c.w, c.b, act, NULL, c.y, c.pre, tu_tol_for(f64));

    /* Backward of L = sum(y * r): dy = r. Outputs poisoned: they must be written. */
    sg_tensor *dy = tu_keep(tu_tensor(ctx, f64, xnd, ys, "dy"));
    sg_tensor *dx = tu_keep(tu_tensor(ctx, f64, xnd, xs, "dx")), *dw = tu_keep(tu_tensor2(ctx, f64, n, k, "dw"));
    sg_tensor *db = tu_keep(tu_tensor1(ctx, f64, n, "db"));
    TU_OK(ctx, sg_tensor_copy(dy, c.r));
    tu_poison(dx);
    tu_poison(dw);
    tu_poison(db);
    const sg_tensor *act_in = act == SG_ACT_RELU ? c.y : act == SG_ACT_GELU ? c.pre : NULL;
    TU_OK(ctx, sg_linear_backward(ctx, c.x, c.w, dy, act, act_in, has_dx ? dx : NULL, dw,
                                  c.b ? db : NULL));

    /* dy now holds d(pre) = r * act'(pre) (r itself for NONE). */
    char label[120];
    {
        double *got = tu_get(dy), *ref = malloc((size_t)dy->numel * sizeof *ref);
        for (int64_t i = 0; i < dy->numel; i++) {
            double r = sg_ld(c.r, i), a = act_in ? sg_ld(act_in, i) : 0;
            ref[i] = act == SG_ACT_RELU ? (a > 0 ? r : 0) : act == SG_ACT_GELU ? r * naive_gelu_grad(a) : r;
        }
        snprintf(label, sizeof label, "%s: dy holds d(pre)", what);
        tu_close(label, got, ref, dy->numel, (tu_tol){1e-9, 1e-8});
        free(got);
        free(ref);
    }

    const tu_tol fd_tol = fd_tolerance(&c);
    if (has_dx) {
        gradcheck_of(what, "dx", fd_loss, &c, c.x, dx, fd_tol);
    } else {
        double *v = tu_get(dx); /* dx NULL: the poison must be untouched */
        TU_CHECK(isnan(v[0]), "%s: dx was written though NULL was passed", what);
        free(v);
    }
    gradcheck_of(what, "dw", fd_loss, &c, c.w, dw, fd_tol);
    if (c.b) gradcheck_of(what, "db", fd_loss, &c, c.b, db, fd_tol);
    tu_free_live();
}

static void cpu_gradchecks(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const sg_activation acts[] = {SG_ACT_NONE, SG_ACT_RELU, SG_ACT_GELU};
    for (int a = 0; a < 3; a++) {
        cpu_gradcheck_case(ctx, acts[a], 1, 1, 1, 0, 1, 1);
        for (int rep = 0; rep < 4; rep++) {
            int64_t m = tu_randint(1, 6), n = tu_randint(1, 7), k = tu_randint(1, 8);
            /* rep 1, 3: N-D x when M is even (M forced even for rep 1); rep 2: no bias, no dx */
            if (rep == 1) m = 2 * tu_randint(1, 3);
            cpu_gradcheck_case(ctx, acts[a], m, n, k, rep % 2, rep != 2, rep != 2);
        }
    }
    sg_ctx_destroy(ctx);
}

/* The forward on medium shapes (many elements near the ReLU kink) against the naive loop. */
static void cpu_forward_naive(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const sg_activation acts[] = {SG_ACT_NONE, SG_ACT_RELU, SG_ACT_GELU};
    for (int a = 0; a < 3; a++) {
        int64_t m = tu_randint(1, 64), n = tu_randint(1, 64), k = tu_randint(1, 64);
        sg_tensor *x = tu_keep(tu_tensor2(ctx, SG_DTYPE_F64, m, k, "x"));
        sg_tensor *w = tu_keep(tu_tensor2(ctx, SG_DTYPE_F64, n, k, "w"));
        sg_tensor *b = tu_keep(tu_tensor1(ctx, SG_DTYPE_F64, n, "b"));
        sg_tensor *y = tu_keep(tu_tensor2(ctx, SG_DTYPE_F64, m, n, "y"));
        sg_tensor *pre = acts[a] == SG_ACT_GELU ? tu_keep(tu_tensor2(ctx, SG_DTYPE_F64, m, n, "pre")) : NULL;
        free(tu_random(x, -1, 1));
        free(tu_random(w, -1, 1));
        free(tu_random(b, -1, 1));
        tu_poison(y);
        if (pre) tu_poison(pre);
        TU_OK(ctx, sg_linear_forward(ctx, x, w, b, acts[a], y, pre));
        char what[96];
        snprintf(what, sizeof what, "cpu forward %s M=%lld N=%lld K=%lld", act_name(acts[a]),
                 (long long)m, (long long)n, (long long)k);
        check_forward_naive(what, x, w, b, acts[a], NULL, y, pre, tu_tol_for(SG_DTYPE_F64));
        tu_free_live();
    }
    sg_ctx_destroy(ctx);
}

/* The f32 path of the reference agrees with its f64 path (same values, f32 rounding). */
static void cpu_f32_vs_f64(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    int64_t m = tu_randint(1, 40), n = tu_randint(1, 40), k = tu_randint(1, 40);
    const sg_dtype dts[2] = {SG_DTYPE_F64, SG_DTYPE_F32};
    sg_tensor *t[2][9]; /* x w b y pre dy dx dw db */
    for (int d = 0; d < 2; d++) {
        sg_dtype dt = dts[d];
        t[d][0] = tu_keep(tu_tensor2(ctx, dt, m, k, "x"));
        t[d][1] = tu_keep(tu_tensor2(ctx, dt, n, k, "w"));
        t[d][2] = tu_keep(tu_tensor1(ctx, dt, n, "b"));
        t[d][3] = tu_keep(tu_tensor2(ctx, dt, m, n, "y"));
        t[d][4] = tu_keep(tu_tensor2(ctx, dt, m, n, "pre"));
        t[d][5] = tu_keep(tu_tensor2(ctx, dt, m, n, "dy"));
        t[d][6] = tu_keep(tu_tensor2(ctx, dt, m, k, "dx"));
        t[d][7] = tu_keep(tu_tensor2(ctx, dt, n, k, "dw"));
        t[d][8] = tu_keep(tu_tensor1(ctx, dt, n, "db"));
    }
    /* Values representable in f32, so both paths start from the same numbers. */
    for (int i = 0; i < 3; i++) {
        free(tu_random(t[1][i], -1, 1));
        double *v = tu_get(t[1][i]);
        tu_set(t[0][i], v);
        free(v);
    }
    free(tu_random(t[1][5], -1, 1));
    {
        double *v = tu_get(t[1][5]);
        tu_set(t[0][5], v);
        free(v);
    }
    for (int d = 0; d < 2; d++) {
        TU_OK(ctx, sg_linear_forward(ctx, t[d][0], t[d][1], t[d][2], SG_ACT_GELU, t[d][3], t[d][4]));
        TU_OK(ctx, sg_linear_backward(ctx, t[d][0], t[d][1], t[d][5], SG_ACT_GELU, t[d][4], t[d][6],
                                      t[d][7], t[d][8]));
    }
    const char *names[9] = {"x", "w", "b", "y", "pre", "dpre", "dx", "dw", "db"};
    for (int i = 3; i < 9; i++) {
        char label[96];
        snprintf(label, sizeof label, "cpu f32 vs f64 %s (M=%lld N=%lld K=%lld)", names[i],
                 (long long)m, (long long)n, (long long)k);
        tu_close_tensors(label, t[1][i], t[0][i], tu_tol_for(SG_DTYPE_F32));
    }
    tu_free_live();
    sg_ctx_destroy(ctx);
}

/* Wrong shapes, dtypes, NULLs, overlaps: the right status and a message naming the tensor;
 * the context works afterwards. */
static void cpu_errors(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU), *other = tu_ctx(SG_BACKEND_CPU);
    const sg_dtype f = SG_DTYPE_F32;
    sg_tensor *x = tu_keep(tu_tensor2(ctx, f, 4, 8, "x")), *w = tu_keep(tu_tensor2(ctx, f, 5, 8, "w"));
    sg_tensor *b = tu_keep(tu_tensor1(ctx, f, 5, "b")), *y = tu_keep(tu_tensor2(ctx, f, 4, 5, "y"));
    sg_tensor *pre = tu_keep(tu_tensor2(ctx, f, 4, 5, "pre")), *dy = tu_keep(tu_tensor2(ctx, f, 4, 5, "dy"));
    sg_tensor *dx = tu_keep(tu_tensor2(ctx, f, 4, 8, "dx")), *dw = tu_keep(tu_tensor2(ctx, f, 5, 8, "dw"));
    sg_tensor *db = tu_keep(tu_tensor1(ctx, f, 5, "db"));
    sg_tensor *w59 = tu_keep(tu_tensor2(ctx, f, 5, 9, "w59")), *w1d = tu_keep(tu_tensor1(ctx, f, 8, "w1d"));
    sg_tensor *b6 = tu_keep(tu_tensor1(ctx, f, 6, "b6")), *y46 = tu_keep(tu_tensor2(ctx, f, 4, 6, "y46"));
    sg_tensor *y35 = tu_keep(tu_tensor2(ctx, f, 3, 5, "y35"));
    sg_tensor *w64 = tu_keep(tu_tensor2(ctx, SG_DTYPE_F64, 5, 8, "w64"));
    sg_tensor *xi = tu_keep(tu_tensor2(ctx, SG_DTYPE_I32, 4, 8, "xi"));
    sg_tensor *w88 = tu_keep(tu_tensor2(ctx, f, 8, 8, "w88"));
    sg_tensor *dx49 = tu_keep(tu_tensor2(ctx, f, 4, 9, "dx49")), *db4 = tu_keep(tu_tensor1(ctx, f, 4, "db4"));
    sg_tensor *wo = tu_tensor2(other, f, 5, 8, "w_other");
    free(tu_random(x, -1, 1));
    free(tu_random(w, -1, 1));
    free(tu_random(b, -1, 1));
    free(tu_random(dy, -1, 1));

    const sg_activation R = SG_ACT_RELU, G = SG_ACT_GELU, N0 = SG_ACT_NONE;
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w59, b, R, y, NULL), SG_ERR_SHAPE,
             "sg_linear_forward: 'w' is (5, 9) f32, expected (5, 8)");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w1d, b, R, y, NULL),
             SG_ERR_SHAPE, "'w' is (8) f32, expected 2-D");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b6, R, y, NULL),
             SG_ERR_SHAPE, "'b' is (6) f32, expected (5)");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b, R, y46, NULL),
             SG_ERR_SHAPE, "'y' is (4, 6) f32, expected (4, 5)");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b, R, y35, NULL), SG_ERR_SHAPE, "'y' is (3, 5) f32");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b, G, y, y35), SG_ERR_SHAPE, "'pre' is (3, 5) f32");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w64, b, R, y, NULL),
             SG_ERR_DTYPE, "'w' is f64, expected f32");
    TU_FAILS(ctx, sg_linear_forward(ctx, xi, w, b, R, y, NULL), SG_ERR_DTYPE, "'x' is i32");
    TU_FAILS(ctx, sg_linear_forward(ctx, NULL, w, b, R, y, NULL), SG_ERR_NULL, "'x' is NULL");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, NULL, b, R, y, NULL), SG_ERR_NULL, "'w' is NULL");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b, R, NULL, NULL), SG_ERR_NULL, "'y' is NULL");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b, G, y, NULL), SG_ERR_NULL, "'pre' is NULL");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b, R, y, pre), SG_ERR_INVALID, "'pre' must be NULL");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b, N0, y, pre),
             SG_ERR_INVALID, "'pre' must be NULL");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b, (sg_activation)7, y, NULL),
             SG_ERR_INVALID, "act 7");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, wo, b, R, y, NULL), SG_ERR_BACKEND, "'w'");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w88, NULL, R, x, NULL),
             SG_ERR_INVALID, "'y' overlaps 'x'");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b, G, y, y), SG_ERR_INVALID, "'y' overlaps 'pre'");
    TU_CHECK(sg_linear_forward(NULL, x, w, b, R, y, NULL) == SG_ERR_NULL, "NULL ctx");

    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, y, dx, NULL, db),
             SG_ERR_NULL, "'dw' is NULL");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, NULL, R, y, dx, dw, db),
             SG_ERR_NULL, "'dy' is NULL");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, y46, R, y, dx, dw, db),
             SG_ERR_SHAPE, "'dy' is (4, 6) f32");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, NULL, dx, dw, db),
             SG_ERR_NULL, "'act_in' is NULL");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, G, y35, dx, dw, db),
             SG_ERR_SHAPE, "'act_in' is (3, 5) f32");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, y, dx49, dw, db),
             SG_ERR_SHAPE, "'dx' is (4, 9) f32");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, y, dx, w59, db),
             SG_ERR_SHAPE, "'dw' is (5, 9) f32, expected (5, 8)");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, y, dx, dw, db4),
             SG_ERR_SHAPE, "'db' is (4) f32, expected (5)");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, y, dx, w64, db),
             SG_ERR_DTYPE, "'dw' is f64");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w59, dy, R, y, dx, dw, db),
             SG_ERR_SHAPE, "'w' is (5, 9) f32");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, (sg_activation)-1, y, dx, dw, db),
             SG_ERR_INVALID, "act -1");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, y, dx, dw, w),
             SG_ERR_SHAPE, "'db' is (5, 8) f32");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, y, x, dw, db),
             SG_ERR_INVALID, "'dx' overlaps 'x'");
    {
        /* dw and db as views into one buffer that overlap by two elements */
        sg_tensor *flat = tu_keep(tu_tensor1(ctx, f, 64, "flat")), *vw, *vb;
        int64_t sw[2] = {5, 8}, sb = 5;
        TU_OK(ctx, sg_tensor_view(flat, 0, 2, sw, "vw", &vw));
        TU_OK(ctx, sg_tensor_view(flat, 38, 1, &sb, "vb", &vb));
        TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, y, dx, vw, vb), SG_ERR_INVALID,
                 "'dw' overlaps 'db'");
        sg_tensor_destroy(vw);
        sg_tensor_destroy(vb);
    }
    TU_CHECK(sg_linear_backward(NULL, x, w, dy, R, y, dx, dw, db) == SG_ERR_NULL, "NULL ctx");

    /* The context still works: a valid forward agrees with the naive loop, and a backward
     * with act NONE and no act_in runs. */
    tu_poison(y);
    TU_OK(ctx, sg_linear_forward(ctx, x, w, b, R, y, NULL));
    check_forward_naive("cpu f32 after errors", x, w, b, R, NULL, y, NULL, tu_tol_for(f));
    TU_OK(ctx, sg_linear_backward(ctx, x, w, dy, N0, NULL, dx, dw, db));
    sg_tensor_destroy(wo);
    tu_free_live();
    sg_ctx_destroy(other);
    sg_ctx_destroy(ctx);
}

/* The reference trains MLPs in CI: time one 32x512x512 step (printed, not checked). */
static void cpu_timing(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const sg_dtype f = SG_DTYPE_F32;
    sg_tensor *x = tu_keep(tu_tensor2(ctx, f, 32, 512, "x")), *w = tu_keep(tu_tensor2(ctx, f, 512, 512, "w"));
    sg_tensor *b = tu_keep(tu_tensor1(ctx, f, 512, "b")), *y = tu_keep(tu_tensor2(ctx, f, 32, 512, "y"));
    sg_tensor *dy = tu_keep(tu_tensor2(ctx, f, 32, 512, "dy")), *dx = tu_keep(tu_tensor2(ctx, f, 32, 512, "dx"));
    sg_tensor *dw = tu_keep(tu_tensor2(ctx, f, 512, 512, "dw")), *db = tu_keep(tu_tensor1(ctx, f, 512, "db"));
    free(tu_random(x, -1, 1));
    free(tu_random(w, -0.05, 0.05));
    free(tu_random(b, -1, 1));
    free(tu_random(dy, -1, 1));
    clock_t t0 = clock();
    TU_OK(ctx, sg_linear_forward(ctx, x, w, b, SG_ACT_RELU, y, NULL));
    TU_OK(ctx, sg_linear_backward(ctx, x, w, dy, SG_ACT_RELU, y, dx, dw, db));
    printf("cpu 32x512x512 relu forward+backward: %.1f ms\n",
           1e3 * (double)(clock() - t0) / CLOCKS_PER_SEC);
    tu_free_live();
    sg_ctx_destroy(ctx);
}

/* ---- gpu: cuBLASLt against the reference ---- */

/* Whether this run asked for cuBLASLt's bias-gradient epilogues (STEPGRAPH_BGRAD=1, read by the
 * context): only then may db skip the kernel. */
static bool lt_bgrad(void)
{
    const char *v = getenv("STEPGRAPH_BGRAD");
    return v && !strcmp(v, "1");
}

/* GEMMs sum `len` products in an order of cuBLASLt's choosing (blocked, perhaps split over
 * k) in f32, the reference in double: the f32 rule's atol (1e-5, set for elementwise ops) is
 * scaled by sqrt(len), the growth of a random walk of rounding errors. */
static tu_tol gemm_tol(int64_t len)
{
    tu_tol t = tu_tol_for(SG_DTYPE_F32);
    t.atol *= sqrt((double)(len > 1 ? len : 1));
    return t;
}

/* y through cuBLASLt's GELU epilogue: it may evaluate tanh with the hardware approximation
 * (tanh.approx.f32, relative error up to ~2^-11), which moves y by up to 0.5*|pre|*5e-4, about
 * 1e-3 for the |pre| of these inputs. pre itself, from the same matmul, is held to gemm_tol,
 * and the unfused path (N not a multiple of 8) uses tanhf. The worst error is printed. */
static tu_tol gelu_epilogue_tol(int64_t k)
{
    tu_tol t = gemm_tol(k);
    t.atol += 1e-3;
    t.rtol = 1e-3;
    return t;
}

static double max_abs_diff(const sg_tensor *a, const sg_tensor *b)
{
    double *u = tu_get(a), *v = tu_get(b), mx = 0;
    for (int64_t i = 0; i < a->numel; i++) mx = fmax(mx, fabs(u[i] - v[i]));
    free(u);
    free(v);
    return mx;
}

/* The tensor's values equal `ref` bit for bit (as floats: a double holds every float). */
static void check_same_bits(const char *what, const sg_tensor *t, const double *ref)
{
    double *v = tu_get(t);
    TU_CHECK(!memcmp(v, ref, (size_t)t->numel * sizeof *v), "%s: a repeated call differs", what);
    free(v);
}

/* A tensor of dtype dt: plain, or (mis) a view one element into a larger buffer, so its
 * address is only 4-byte (f32) or 2-byte (bf16) aligned. */
static sg_tensor *dev_tensor(sg_ctx *ctx, sg_dtype dt, int nd, const int64_t *shape,
                             const char *name, int mis)
{
    if (!mis) return tu_keep(tu_tensor(ctx, dt, nd, shape, name));
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    sg_tensor *base = tu_keep(tu_tensor1(ctx, dt, n + 1, "base")), *v;
    TU_OK(ctx, sg_tensor_view(base, 1, nd, shape, name, &v));
    return tu_keep(v);
}

/* An f32 GPU tensor, as dev_tensor. */
static sg_tensor *gpu_tensor(sg_ctx *ctx, int nd, const int64_t *shape, const char *name, int mis)
{
    return dev_tensor(ctx, SG_DTYPE_F32, nd, shape, name, mis);
}

typedef struct {
    int64_t m, n, k;
    sg_activation act;
    int has_b, has_dx, nd, mis;
    int expect_fused; /* the forward must be one launch (one fused cublasLtMatmul) */
} gpu_spec;

static void gpu_case(sg_ctx *gpu, sg_ctx *cpu, gpu_spec s)
{
    const sg_dtype f = SG_DTYPE_F32;
    int64_t xs[3], ys[3];
    int xnd = lead_shape(s.m, s.nd, s.k, xs);
    lead_shape(s.m, s.nd, s.n, ys);
    char what[160], label[224];
    snprintf(what, sizeof what, "gpu %s M=%lld N=%lld K=%lld ndim=%d bias=%d dx=%d misaligned=%d",
             act_name(s.act), (long long)s.m, (long long)s.n, (long long)s.k, xnd, s.has_b,
             s.has_dx, s.mis);
    int64_t ws[2] = {s.n, s.k};
    sg_tensor *x = gpu_tensor(gpu, xnd, xs, "x", s.mis), *w = gpu_tensor(gpu, 2, ws, "w", s.mis);
    sg_tensor *b = s.has_b ? gpu_tensor(gpu, 1, &s.n, "b", s.mis) : NULL;
    sg_tensor *y = gpu_tensor(gpu, xnd, ys, "y", s.mis);
    sg_tensor *pre = s.act == SG_ACT_GELU ? gpu_tensor(gpu, xnd, ys, "pre", s.mis) : NULL;
    double wscale = 1 / sqrt((double)s.k); /* PyTorch's init: outputs of order 1 */
    free(tu_random(x, -1, 1));
    free(tu_random(w, -wscale, wscale));
    if (b) free(tu_random(b, -1, 1));
    sg_tensor *xc = tu_keep(tu_clone_to(cpu, x, f)), *wc = tu_keep(tu_clone_to(cpu, w, f));
    sg_tensor *bc = b ? tu_keep(tu_clone_to(cpu, b, f)) : NULL;
    sg_tensor *yc = tu_keep(tu_tensor(cpu, f, xnd, ys, "y_ref"));
    sg_tensor *prec = pre ? tu_keep(tu_tensor(cpu, f, xnd, ys, "pre_ref")) : NULL;

    /* ---- forward ---- */
    tu_poison(y);
    if (pre) tu_poison(pre);
    uint64_t l0 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_linear_forward(gpu, x, w, b, s.act, y, pre));
    uint64_t fwd_launches = sg_ctx_launch_count(gpu) - l0;
    TU_OK(cpu, sg_linear_forward(cpu, xc, wc, bc, s.act, yc, prec));
    snprintf(label, sizeof label, "%s: y", what);
    tu_close_tensors(label, y, yc, s.act == SG_ACT_GELU ? gelu_epilogue_tol(s.k) : gemm_tol(s.k));
    if (pre) {
        snprintf(label, sizeof label, "%s: pre", what);
        tu_close_tensors(label, pre, prec, gemm_tol(s.k));
        printf("%s: max |y - y_ref| = %.3g (GELU, %s)\n", what, max_abs_diff(y, yc),
               fwd_launches == 1 ? "cuBLASLt epilogue" : "unfused: tanhf in bias_act_kernel");
    }
    /* One fused matmul; a second launch (the bias + act kernel) only when the fused epilogue
     * cannot run: GELU with N % 8 != 0, a bias under 16-byte alignment, or a shape the
     * heuristic refuses. Aligned shapes must fuse. */
    TU_CHECK(fwd_launches == 1 || ((s.act != SG_ACT_NONE || s.has_b) && fwd_launches == 2),
             "%s: forward took %llu launches", what, (unsigned long long)fwd_launches);
    if (s.expect_fused)
        TU_CHECK(fwd_launches == 1, "%s: forward took %llu launches, expected one fused matmul",
                 what, (unsigned long long)fwd_launches);
    if (s.mis && s.has_b && s.m > 1) /* one row: the GEMV kernel, one launch at any alignment */
        TU_CHECK(fwd_launches == 2, "%s: an under-aligned bias took the fused epilogue", what);

    /* The same call again: the cached plan, bit-identical results, no device allocation. */
    double *y1 = tu_get(y), *pre1 = pre ? tu_get(pre) : NULL;
    tu_poison(y);
    if (pre) tu_poison(pre);
    sg_alloc_stats a0, a1;
    TU_OK(gpu, sg_ctx_alloc_stats(gpu, &a0));
    l0 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_linear_forward(gpu, x, w, b, s.act, y, pre));
    TU_CHECK(sg_ctx_launch_count(gpu) - l0 == fwd_launches, "%s: repeated forward launches differ", what);
    TU_OK(gpu, sg_ctx_alloc_stats(gpu, &a1));
    TU_CHECK(a1.device_allocs == a0.device_allocs, "%s: repeated forward allocated device memory", what);
    snprintf(label, sizeof label, "%s: forward y", what);
    check_same_bits(label, y, y1);
    if (pre) {
        snprintf(label, sizeof label, "%s: forward pre", what);
        check_same_bits(label, pre, pre1);
    }
    free(y1);
    free(pre1);

    /* ---- backward: act_in is the forward's real output (RELU: y, zeros included; GELU: pre) */
    sg_tensor *dy = gpu_tensor(gpu, xnd, ys, "dy", s.mis);
    double *dyv = tu_random(dy, -1, 1);
    sg_tensor *dx = s.has_dx ? gpu_tensor(gpu, xnd, xs, "dx", s.mis) : NULL;
    sg_tensor *dw = gpu_tensor(gpu, 2, ws, "dw", s.mis);
    sg_tensor *db = s.has_b ? gpu_tensor(gpu, 1, &s.n, "db", s.mis) : NULL;
    const sg_tensor *ain = s.act == SG_ACT_RELU ? y : s.act == SG_ACT_GELU ? pre : NULL;
    sg_tensor *dyc = tu_keep(tu_clone_to(cpu, dy, f)), *ainc = ain ? tu_keep(tu_clone_to(cpu, ain, f)) : NULL;
    sg_tensor *dxc = dx ? tu_keep(tu_tensor(cpu, f, xnd, xs, "dx_ref")) : NULL;
    sg_tensor *dwc = tu_keep(tu_tensor2(cpu, f, s.n, s.k, "dw_ref"));
    sg_tensor *dbc = db ? tu_keep(tu_tensor1(cpu, f, s.n, "db_ref")) : NULL;
    sg_tensor *outs[3] = {dx, dw, db};
    for (int i = 0; i < 3; i++)
        if (outs[i]) tu_poison(outs[i]);
    l0 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_linear_backward(gpu, x, w, dy, s.act, ain, dx, dw, db));
    uint64_t bwd_launches = sg_ctx_launch_count(gpu) - l0;
    TU_OK(cpu, sg_linear_backward(cpu, xc, wc, dyc, s.act, ainc, dxc, dwc, dbc));
    /* The activation's kernel (which also sums db); with STEPGRAPH_BGRAD=1 and no activation,
     * db may come from the dw matmul's BGRADB epilogue instead: one launch less. */
    uint64_t want = (uint64_t)((s.act != SG_ACT_NONE || s.has_b) + 1 + s.has_dx);
    bool bgrad = lt_bgrad() && s.act == SG_ACT_NONE && s.has_b && bwd_launches == want - 1;
    TU_CHECK(bwd_launches == want || bgrad, "%s: backward took %llu launches, expected %llu", what,
             (unsigned long long)bwd_launches, (unsigned long long)want);
    if (s.act == SG_ACT_NONE && s.has_b)
        printf("%s: db by %s\n", what, bgrad ? "the BGRADB epilogue" : "the column-sum kernel");
    /* d(pre) is elementwise (tanhf vs tanh: a few ulp), the rest are sums over M or N. */
    snprintf(label, sizeof label, "%s: d(pre) in dy", what);
    tu_close_tensors(label, dy, dyc, tu_tol_for(f));
    snprintf(label, sizeof label, "%s: dw", what);
    tu_close_tensors(label, dw, dwc, gemm_tol(s.m));
    if (dx) {
        snprintf(label, sizeof label, "%s: dx", what);
        tu_close_tensors(label, dx, dxc, gemm_tol(s.n));
    }
    if (db) {
        snprintf(label, sizeof label, "%s: db", what);
        tu_close_tensors(label, db, dbc, gemm_tol(s.m));
    }

    /* Again, from the same dy: bit-identical (db's reduction is deterministic), no allocation. */
    double *dpre1 = tu_get(dy), *dw1 = tu_get(dw);
    double *dx1 = dx ? tu_get(dx) : NULL, *db1 = db ? tu_get(db) : NULL;
    tu_set(dy, dyv);
    for (int i = 0; i < 3; i++)
        if (outs[i]) tu_poison(outs[i]);
    TU_OK(gpu, sg_ctx_alloc_stats(gpu, &a0));
    l0 = sg_ctx_launch_count(gpu);
    TU_OK(gpu, sg_linear_backward(gpu, x, w, dy, s.act, ain, dx, dw, db));
    TU_CHECK(sg_ctx_launch_count(gpu) - l0 == bwd_launches, "%s: repeated backward launches differ", what);
    TU_OK(gpu, sg_ctx_alloc_stats(gpu, &a1));
    TU_CHECK(a1.device_allocs == a0.device_allocs, "%s: repeated backward allocated device memory", what);
    snprintf(label, sizeof label, "%s: backward d(pre)", what);
    check_same_bits(label, dy, dpre1);
    snprintf(label, sizeof label, "%s: backward dw", what);
    check_same_bits(label, dw, dw1);
    if (dx) {
        snprintf(label, sizeof label, "%s: backward dx", what);
        check_same_bits(label, dx, dx1);
    }
    if (db) {
        snprintf(label, sizeof label, "%s: backward db", what);
        check_same_bits(label, db, db1);
    }
    free(dyv);
    free(dpre1);
    free(dw1);
    free(dx1);
    free(db1);
    tu_free_live();
}

/* The first backward with a bias gradient allocates the context's linear scratch (a fixed
 * size per device) and zero-fills it: one allocation and one extra launch, once. Done here,
 * so that every case below counts launches exactly; later calls, of any shape, allocate
 * nothing. */
static void gpu_scratch_warmup(sg_ctx *gpu)
{
    sg_tensor *x = tu_keep(tu_tensor2(gpu, SG_DTYPE_F32, 64, 8, "x"));
    sg_tensor *w = tu_keep(tu_tensor2(gpu, SG_DTYPE_F32, 8, 8, "w"));
    sg_tensor *dy = tu_keep(tu_tensor2(gpu, SG_DTYPE_F32, 64, 8, "dy"));
    sg_tensor *dw = tu_keep(tu_tensor2(gpu, SG_DTYPE_F32, 8, 8, "dw"));
    sg_tensor *db = tu_keep(tu_tensor1(gpu, SG_DTYPE_F32, 8, "db"));
    free(tu_random(x, -1, 1));
    free(tu_random(w, -1, 1));
    free(tu_random(dy, -1, 1));
    sg_alloc_stats a0, a1;
    TU_OK(gpu, sg_ctx_alloc_stats(gpu, &a0));
    TU_OK(gpu, sg_linear_backward(gpu, x, w, dy, SG_ACT_RELU, dy, NULL, dw, db)); /* the kernel, whatever db's path */
    TU_OK(gpu, sg_ctx_alloc_stats(gpu, &a1));
    TU_CHECK(a1.device_allocs - a0.device_allocs <= 1, "the scratch took %llu allocations",
             (unsigned long long)(a1.device_allocs - a0.device_allocs));
    tu_free_live();
}

/* ---- bf16 (mixed precision): either backend against the f64 reference ----
 *
 * Every tensor of a call is bf16; the reference runs the same op in f64 on the CPU, on the
 * inputs as stored (already rounded to bf16), so the only differences are the bf16 path's own.
 * The tolerance is the bf16 rule (atol 1e-2, rtol 1.6e-2), elementwise, and why it holds:
 * - each bf16 output is its value rounded once: relative error <= 2^-8 = 3.9e-3 (8 significant
 *   bits), 4x inside rtol. Before that rounding, the CUDA path accumulates in f32 (at worst
 *   len * 2^-24 of the sum of |terms|: 2e-4 at len 3072), its GELU epilogue may use
 *   tanh.approx (~1e-3 absolute, see gelu_epilogue_tol), and the unfused epilogue rounds the
 *   matmul before adding the bias: a second rounding, up to 2^-8 of |x w^T|, which stays near
 *   or under 1.2 for these inputs (x in [-1, 1], w in +-1/sqrt(K)): about 5e-3, under atol;
 * - dw, dx and db are held elementwise to the reference computed from d(pre) as stored in dy
 *   (bf16), which is what both backends sum (linear.h). From the unrounded d(pre) a sum of
 *   len terms moves by ~sqrt(len) * 2^-8/sqrt(3) * |term| (about 0.02 at M = 2048: past atol
 *   for the small elements), so against that full f64 chain they meet the norm rule instead;
 * - every output of 16 elements or more also meets ||got - ref|| / ||ref|| < 1e-2 against
 *   the reference it is computed from (on the CPU it is at most 2^-8 there, by the one
 *   rounding). Against the full f64 chain, what rounding d(pre) to bf16 does comes on top: a
 *   property of the draw, not of the code (on the CPU up to 5.3e-3 over 4000 seeds, and
 *   unbounded where a sum cancels), so it is measured and printed, not bounded; by the triangle
 *   inequality the error against the chain is at most 1e-2 (1 + d) + d, where d is the
 *   references' own relative L2 distance.
 * On the CPU the bf16 path is the f64 computation plus that one rounding, so there each output
 * must also equal the f64 value rounded to bf16, exactly. */

/* ||got - ref|| / ||ref|| (0 when both are zero). */
static double rel_l2(const double *got, const double *ref, int64_t n)
{
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        e += (got[i] - ref[i]) * (got[i] - ref[i]);
        r += ref[i] * ref[i];
    }
    if (r == 0) return e == 0 ? 0 : INFINITY;
    return sqrt(e / r);
}

/* got (bf16) against ref_elem by the bf16 rule, elementwise and by the relative L2 error;
 * with exact, got must be ref_elem rounded to bf16. Returns the relative L2 error against
 * ref_chain (NULL: ref_elem), for the record (see above). */
static double bf16_check(const char *what, const char *name, const sg_tensor *got,
                         const sg_tensor *ref_elem, const sg_tensor *ref_chain, int exact)
{
    char label[256];
    snprintf(label, sizeof label, "%s: %s", what, name);
    double *g = tu_get(got), *r = tu_get(ref_elem), *c = ref_chain ? tu_get(ref_chain) : r;
    tu_close(label, g, r, got->numel, tu_tol_for(SG_DTYPE_BF16));
    /* Over fewer than 16 elements a norm is one element's relative error, unbounded where
     * terms cancel (the unfused epilogue rounds x w^T before adding b; dw's sums of a few
     * rounded d(pre)): there the elementwise rule alone holds. */
    double e = rel_l2(g, r, got->numel), chain = rel_l2(g, c, got->numel);
    if (got->numel >= 16)
        TU_CHECK(e < 1e-2, "%s: ||got - ref|| / ||ref|| = %.3g, limit 1e-2", label, e);
    else
        chain = 0;
    if (exact) {
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < got->numel; i++)
            if (sg_bf16_to_double(sg_double_to_bf16(r[i])) != g[i] && bad++ == 0) first = i;
        TU_CHECK(bad == 0,
                 "%s: %lld of %lld elements are not the f64 value rounded once to bf16; first "
                 "[%lld] got %.9g ref %.17g",
                 label, (long long)bad, (long long)got->numel, (long long)first,
                 first >= 0 ? g[first] : 0.0, first >= 0 ? r[first] : 0.0);
    }
    if (c != r) free(c);
    free(g);
    free(r);
    return chain;
}

/* One case on ctx (CPU or CUDA) in bf16, against ref (a CPU context) in f64. The CUDA path
 * is also checked for its launches (one fused matmul where expected) and, called again,
 * for bit-identical results without device allocation (the cached plans). */
static void bf16_case(sg_ctx *ctx, sg_ctx *ref, gpu_spec s)
{
    if (ctx->backend == SG_BACKEND_CUDA && tu_racecheck()) return; /* see tu_racecheck */
    const sg_dtype h = SG_DTYPE_BF16, d = SG_DTYPE_F64;
    const int gpu = sg_ctx_backend(ctx) == SG_BACKEND_CUDA, exact = !gpu;
    int64_t xs[3], ys[3];
    int xnd = lead_shape(s.m, s.nd, s.k, xs);
    lead_shape(s.m, s.nd, s.n, ys);
    char what[192], label[256];
    snprintf(what, sizeof what,
             "%s bf16 %s M=%lld N=%lld K=%lld ndim=%d bias=%d dx=%d misaligned=%d",
             gpu ? "gpu" : "cpu", act_name(s.act), (long long)s.m, (long long)s.n,
             (long long)s.k, xnd, s.has_b, s.has_dx, s.mis);
    int64_t ws[2] = {s.n, s.k};
    sg_tensor *x = dev_tensor(ctx, h, xnd, xs, "x", s.mis), *w = dev_tensor(ctx, h, 2, ws, "w", s.mis);
    sg_tensor *b = s.has_b ? dev_tensor(ctx, h, 1, &s.n, "b", s.mis) : NULL;
    sg_tensor *y = dev_tensor(ctx, h, xnd, ys, "y", s.mis);
    sg_tensor *pre = s.act == SG_ACT_GELU ? dev_tensor(ctx, h, xnd, ys, "pre", s.mis) : NULL;
    double wscale = 1 / sqrt((double)s.k); /* outputs of order 1 */
    free(tu_random(x, -1, 1));
    free(tu_random(w, -wscale, wscale));
    if (b) free(tu_random(b, -1, 1));
    /* The reference's inputs: the bf16 values as stored, exactly, in f64. */
    sg_tensor *xr = tu_keep(tu_clone_to(ref, x, d)), *wr = tu_keep(tu_clone_to(ref, w, d));
    sg_tensor *br = b ? tu_keep(tu_clone_to(ref, b, d)) : NULL;
    sg_tensor *yr = tu_keep(tu_tensor(ref, d, xnd, ys, "y_ref"));
    sg_tensor *prer = pre ? tu_keep(tu_tensor(ref, d, xnd, ys, "pre_ref")) : NULL;
    double worst = 0;

    /* ---- forward ---- */
    tu_poison(y);
    if (pre) tu_poison(pre);
    uint64_t l0 = sg_ctx_launch_count(ctx);
    TU_OK(ctx, sg_linear_forward(ctx, x, w, b, s.act, y, pre));
    uint64_t fwd_launches = sg_ctx_launch_count(ctx) - l0;
    TU_OK(ref, sg_linear_forward(ref, xr, wr, br, s.act, yr, prer));
    worst = fmax(worst, bf16_check(what, "y", y, yr, NULL, exact));
    if (pre) worst = fmax(worst, bf16_check(what, "pre", pre, prer, NULL, exact));
    sg_alloc_stats a0, a1;
    if (gpu) {
        /* As f32: one fused matmul, or the plain one and the bias/act kernel. */
        TU_CHECK(fwd_launches == 1 || ((s.act != SG_ACT_NONE || s.has_b) && fwd_launches == 2),
                 "%s: forward took %llu launches", what, (unsigned long long)fwd_launches);
        if (s.expect_fused)
            TU_CHECK(fwd_launches == 1,
                     "%s: forward took %llu launches, expected one fused bf16 matmul", what,
                     (unsigned long long)fwd_launches);
        if (s.mis && s.has_b && s.m > 1) /* one row: the GEMV kernel, one launch at any alignment */
            TU_CHECK(fwd_launches == 2, "%s: an under-aligned bias took the fused epilogue", what);
        double *y1 = tu_get(y), *pre1 = pre ? tu_get(pre) : NULL;
        tu_poison(y);
        if (pre) tu_poison(pre);
        TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a0));
        l0 = sg_ctx_launch_count(ctx);
        TU_OK(ctx, sg_linear_forward(ctx, x, w, b, s.act, y, pre));
        TU_CHECK(sg_ctx_launch_count(ctx) - l0 == fwd_launches,
                 "%s: repeated forward launches differ", what);
        TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a1));
        TU_CHECK(a1.device_allocs == a0.device_allocs,
                 "%s: repeated forward allocated device memory", what);
        snprintf(label, sizeof label, "%s: forward y", what);
        check_same_bits(label, y, y1);
        if (pre) {
            snprintf(label, sizeof label, "%s: forward pre", what);
            check_same_bits(label, pre, pre1);
        }
        free(y1);
        free(pre1);
    }

    /* ---- backward: act_in is the forward's real output (RELU: y; GELU: pre), bf16 ---- */
    sg_tensor *dy = dev_tensor(ctx, h, xnd, ys, "dy", s.mis);
    double *dyv = tu_random(dy, -1, 1);
    sg_tensor *dx = s.has_dx ? dev_tensor(ctx, h, xnd, xs, "dx", s.mis) : NULL;
    sg_tensor *dw = dev_tensor(ctx, h, 2, ws, "dw", s.mis);
    sg_tensor *db = s.has_b ? dev_tensor(ctx, h, 1, &s.n, "db", s.mis) : NULL;
    const sg_tensor *ain = s.act == SG_ACT_RELU ? y : s.act == SG_ACT_GELU ? pre : NULL;
    /* The full f64 chain: d(pre) never rounded. */
    sg_tensor *dyr = tu_keep(tu_clone_to(ref, dy, d));
    sg_tensor *ainr = ain ? tu_keep(tu_clone_to(ref, ain, d)) : NULL;
    sg_tensor *dxr = dx ? tu_keep(tu_tensor(ref, d, xnd, xs, "dx_ref")) : NULL;
    sg_tensor *dwr = tu_keep(tu_tensor2(ref, d, s.n, s.k, "dw_ref"));
    sg_tensor *dbr = db ? tu_keep(tu_tensor1(ref, d, s.n, "db_ref")) : NULL;
    sg_tensor *outs[3] = {dx, dw, db};
    for (int i = 0; i < 3; i++)
        if (outs[i]) tu_poison(outs[i]);
    l0 = sg_ctx_launch_count(ctx);
    TU_OK(ctx, sg_linear_backward(ctx, x, w, dy, s.act, ain, dx, dw, db));
    uint64_t bwd_launches = sg_ctx_launch_count(ctx) - l0;
    TU_OK(ref, sg_linear_backward(ref, xr, wr, dyr, s.act, ainr, dxr, dwr, dbr));
    worst = fmax(worst, bf16_check(what, "d(pre) in dy", dy, dyr, NULL, exact));

    /* The reference of dw, dx, db from d(pre) as stored: act NONE on dy's bf16 values. With
     * NONE, d(pre) is dy itself; with RELU it is dy or 0, exact in bf16: the chain is it. */
    sg_tensor *dxs = dxr, *dws = dwr, *dbs = dbr;
    if (s.act == SG_ACT_GELU) {
        sg_tensor *dps = tu_keep(tu_clone_to(ref, dy, d));
        dxs = dx ? tu_keep(tu_tensor(ref, d, xnd, xs, "dx_stored")) : NULL;
        dws = tu_keep(tu_tensor2(ref, d, s.n, s.k, "dw_stored"));
        dbs = db ? tu_keep(tu_tensor1(ref, d, s.n, "db_stored")) : NULL;
        TU_OK(ref, sg_linear_backward(ref, xr, wr, dps, SG_ACT_NONE, NULL, dxs, dws, dbs));
    }
    worst = fmax(worst, bf16_check(what, "dw", dw, dws, dwr, exact));
    if (dx) worst = fmax(worst, bf16_check(what, "dx", dx, dxs, dxr, exact));
    if (db) worst = fmax(worst, bf16_check(what, "db", db, dbs, dbr, exact));

    if (gpu) {
        uint64_t want = (uint64_t)((s.act != SG_ACT_NONE || s.has_b) + 1 + s.has_dx);
        bool bgrad = lt_bgrad() && s.act == SG_ACT_NONE && s.has_b && bwd_launches == want - 1; /* db by BGRADB */
        TU_CHECK(bwd_launches == want || bgrad, "%s: backward took %llu launches, expected %llu", what,
                 (unsigned long long)bwd_launches, (unsigned long long)want);
        /* Again, from the same dy: bit-identical, no allocation. */
        double *dpre1 = tu_get(dy), *dw1 = tu_get(dw);
        double *dx1 = dx ? tu_get(dx) : NULL, *db1 = db ? tu_get(db) : NULL;
        tu_set(dy, dyv);
        for (int i = 0; i < 3; i++)
            if (outs[i]) tu_poison(outs[i]);
        TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a0));
        l0 = sg_ctx_launch_count(ctx);
        TU_OK(ctx, sg_linear_backward(ctx, x, w, dy, s.act, ain, dx, dw, db));
        TU_CHECK(sg_ctx_launch_count(ctx) - l0 == bwd_launches,
                 "%s: repeated backward launches differ", what);
        TU_OK(ctx, sg_ctx_alloc_stats(ctx, &a1));
        TU_CHECK(a1.device_allocs == a0.device_allocs,
                 "%s: repeated backward allocated device memory", what);
        snprintf(label, sizeof label, "%s: backward d(pre)", what);
        check_same_bits(label, dy, dpre1);
        snprintf(label, sizeof label, "%s: backward dw", what);
        check_same_bits(label, dw, dw1);
        if (dx) {
            snprintf(label, sizeof label, "%s: backward dx", what);
            check_same_bits(label, dx, dx1);
        }
        if (db) {
            snprintf(label, sizeof label, "%s: backward db", what);
            check_same_bits(label, db, db1);
        }
        free(dpre1);
        free(dw1);
        free(dx1);
        free(db1);
        printf("%s: worst relative L2 error against the f64 chain %.3g (forward %s)\n", what, worst,
               fwd_launches == 1 ? "fused" : "unfused");
    }
    free(dyv);
    tu_free_live();
}

/* Mixed dtypes in one call fail with SG_ERR_DTYPE naming the tensor (x sets the dtype);
 * nothing is left broken: a valid bf16 call runs afterwards. */
static void bf16_errors(sg_ctx *ctx)
{
    const sg_dtype h = SG_DTYPE_BF16, f = SG_DTYPE_F32;
    sg_tensor *x = tu_keep(tu_tensor2(ctx, h, 4, 8, "x")), *w = tu_keep(tu_tensor2(ctx, h, 5, 8, "w"));
    sg_tensor *b = tu_keep(tu_tensor1(ctx, h, 5, "b")), *y = tu_keep(tu_tensor2(ctx, h, 4, 5, "y"));
    sg_tensor *pre = tu_keep(tu_tensor2(ctx, h, 4, 5, "pre")), *dy = tu_keep(tu_tensor2(ctx, h, 4, 5, "dy"));
    sg_tensor *dx = tu_keep(tu_tensor2(ctx, h, 4, 8, "dx")), *dw = tu_keep(tu_tensor2(ctx, h, 5, 8, "dw"));
    sg_tensor *db = tu_keep(tu_tensor1(ctx, h, 5, "db"));
    sg_tensor *xf = tu_keep(tu_tensor2(ctx, f, 4, 8, "xf")), *wf = tu_keep(tu_tensor2(ctx, f, 5, 8, "wf"));
    sg_tensor *bf = tu_keep(tu_tensor1(ctx, f, 5, "bf")), *yf = tu_keep(tu_tensor2(ctx, f, 4, 5, "yf"));
    sg_tensor *pref = tu_keep(tu_tensor2(ctx, f, 4, 5, "pref")), *dyf = tu_keep(tu_tensor2(ctx, f, 4, 5, "dyf"));
    sg_tensor *dxf = tu_keep(tu_tensor2(ctx, f, 4, 8, "dxf")), *dwf = tu_keep(tu_tensor2(ctx, f, 5, 8, "dwf"));
    sg_tensor *dbf = tu_keep(tu_tensor1(ctx, f, 5, "dbf"));
    free(tu_random(x, -1, 1));
    free(tu_random(w, -1, 1));
    free(tu_random(b, -1, 1));
    free(tu_random(dy, -1, 1));
    free(tu_random(xf, -1, 1));
    free(tu_random(wf, -1, 1));

    const sg_activation R = SG_ACT_RELU, G = SG_ACT_GELU;
    TU_FAILS(ctx, sg_linear_forward(ctx, x, wf, b, R, y, NULL), SG_ERR_DTYPE,
             "sg_linear_forward: tensor 'w' is f32, expected bf16");
    TU_FAILS(ctx, sg_linear_forward(ctx, xf, w, bf, R, yf, NULL), SG_ERR_DTYPE,
             "'w' is bf16, expected f32");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, bf, R, y, NULL), SG_ERR_DTYPE,
             "'b' is f32, expected bf16");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b, R, yf, NULL), SG_ERR_DTYPE,
             "'y' is f32, expected bf16");
    TU_FAILS(ctx, sg_linear_forward(ctx, x, w, b, G, y, pref), SG_ERR_DTYPE,
             "'pre' is f32, expected bf16");
    TU_FAILS(ctx, sg_linear_forward(ctx, xf, wf, bf, G, yf, pre), SG_ERR_DTYPE,
             "'pre' is bf16, expected f32");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dyf, R, y, dx, dw, db), SG_ERR_DTYPE,
             "sg_linear_backward: tensor 'dy' is f32, expected bf16");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, yf, dx, dw, db), SG_ERR_DTYPE,
             "'act_in' is f32, expected bf16");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, y, dxf, dw, db), SG_ERR_DTYPE,
             "'dx' is f32, expected bf16");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, y, dx, dwf, db), SG_ERR_DTYPE,
             "'dw' is f32, expected bf16");
    TU_FAILS(ctx, sg_linear_backward(ctx, x, w, dy, R, y, dx, dw, dbf), SG_ERR_DTYPE,
             "'db' is f32, expected bf16");
    TU_FAILS(ctx, sg_linear_backward(ctx, xf, w, dyf, R, yf, dxf, dwf, dbf), SG_ERR_DTYPE,
             "'w' is bf16, expected f32");

    TU_OK(ctx, sg_linear_forward(ctx, x, w, b, R, y, NULL));
    TU_OK(ctx, sg_linear_backward(ctx, x, w, dy, R, y, dx, dw, db));
    double *v = tu_get(dw);
    int finite = 1;
    for (int64_t i = 0; i < dw->numel; i++) finite = finite && isfinite(v[i]);
    TU_CHECK(finite, "%s: bf16 dw after the errors is not finite", sg_ctx_device_name(ctx));
    free(v);
    tu_free_live();
}

/* cpu mode: the CPU backend in bf16 against its own f64 path, on random small shapes (N-D x,
 * no bias / no dx, views one bf16 element into a buffer), then the dtype errors. */
static void cpu_bf16(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const sg_activation acts[] = {SG_ACT_NONE, SG_ACT_RELU, SG_ACT_GELU};
    for (int a = 0; a < 3; a++) {
        bf16_case(ctx, ctx, (gpu_spec){1, 1, 1, acts[a], 1, 1, 0, 0, 0});
        bf16_case(ctx, ctx, (gpu_spec){64, 96, 80, acts[a], 1, 1, 1, 0, 0});
        for (int rep = 0; rep < 4; rep++) {
            int64_t m = tu_randint(1, 40), n = tu_randint(1, 40), k = tu_randint(1, 40);
            if (rep == 1) m = 2 * tu_randint(1, 20);
            /* rep 1, 3: N-D x when M is even; rep 2: no bias, no dx; rep 3: views */
            bf16_case(ctx, ctx, (gpu_spec){m, n, k, acts[a], rep != 2, rep != 2, rep % 2,
                                           rep == 3, 0});
        }
    }
    bf16_errors(ctx);
    sg_ctx_destroy(ctx);
}

/* ---- sg_linear_backward_through: the gradient taken on through the layer before's activation ----
 *
 * through_case(ctx, ref, dt, ...): on ctx (either backend) against the f64 CPU reference on the
 * same stored inputs: x = x_act(x_pre) as stored, a layer with act NONE or GELU and a bias.
 * The reference itself is checked (on the CPU, f64) against the composition it replaces:
 * sg_linear_backward's dx, then times x_act'(x_pre) elementwise, then the column sums. Tolerances:
 * dx_pre is a sum of N products times a factor in [-0.13, 1.13] (gelu', whose |value| <= 1.13),
 * so gemm_tol(N) scaled by 1.13 in f32; x_db sums M of those: gemm_tol(M) on top, times
 * |factor| bound, plus M times dx_pre's atol (each summand carries it); bf16: the bf16 rule
 * elementwise against the reference summed from dx_pre as stored, as bf16_check does. */
static void through_case(sg_ctx *ctx, sg_ctx *ref, sg_dtype dt, int64_t m, int64_t n, int64_t k,
                         sg_activation act, sg_activation x_act, int mis, int with_db)
{
    char what[160];
    snprintf(what, sizeof what, "%s %s through m=%lld n=%lld k=%lld act %s x_act %s%s%s",
             ctx->backend == SG_BACKEND_CPU ? "cpu" : "gpu", sg_dtype_name(dt), (long long)m, (long long)n,
             (long long)k, act_name(act), act_name(x_act), mis ? " misaligned" : "", with_db ? "" : " no x_db");
    const sg_dtype d = SG_DTYPE_F64;
    sg_tensor *base[8] = {NULL};
    int nb = 0;
#define T2(name, r, c) tu_keep(tu_maybe_view(ctx, dt, 2, (int64_t[]){r, c}, mis, name, &base[nb++]))
    sg_tensor *xp = T2("x_pre", m, k), *x = T2("x", m, k), *w = T2("w", n, k), *dy = T2("dy", m, n);
    sg_tensor *dxp = T2("dx_pre", m, k), *dw = T2("dw", n, k);
    sg_tensor *pre = act == SG_ACT_GELU ? T2("pre", m, n) : NULL;
#undef T2
    sg_tensor *db = tu_keep(tu_tensor1(ctx, dt, n, "db"));
    sg_tensor *xdb = with_db ? tu_keep(tu_tensor1(ctx, dt, k, "x_db")) : NULL;
    for (int i = 0; i < nb; i++) tu_keep(base[i]);
    free(tu_random(xp, -2, 2));
    free(tu_random(w, -1 / sqrt((double)k), 1 / sqrt((double)k)));
    free(tu_random(dy, -1, 1));
    if (pre) free(tu_random(pre, -2, 2));
    /* x = x_act(x_pre), computed on the CPU in f64 and stored in dt. */
    double *xpv = tu_get(xp), *xv = malloc((size_t)(m * k) * sizeof *xv);
    for (int64_t i = 0; i < m * k; i++)
        xv[i] = x_act == SG_ACT_GELU ? naive_gelu(xpv[i]) : (xpv[i] > 0 ? xpv[i] : 0);
    tu_set(x, xv);
    free(xpv), free(xv);
    /* x_act RELU reads the output (as act_in does): x itself. */
    const sg_tensor *xin = x_act == SG_ACT_RELU ? x : xp;
    /* The f64 reference on the same stored values. */
    sg_tensor *xr = tu_keep(tu_clone_to(ref, x, d)), *wr = tu_keep(tu_clone_to(ref, w, d));
    sg_tensor *dyr = tu_keep(tu_clone_to(ref, dy, d)), *xinr = tu_keep(tu_clone_to(ref, xin, d));
    sg_tensor *dyr2 = tu_keep(tu_clone_to(ref, dy, d)); /* dy before the calls overwrite it with d(pre) */
    sg_tensor *prer = pre ? tu_keep(tu_clone_to(ref, pre, d)) : NULL;
    sg_tensor *dxpr = tu_keep(tu_tensor2(ref, d, m, k, "dx_pre_ref")), *dwr = tu_keep(tu_tensor2(ref, d, n, k, "dw_ref"));
    sg_tensor *dbr = tu_keep(tu_tensor1(ref, d, n, "db_ref")), *xdbr = tu_keep(tu_tensor1(ref, d, k, "x_db_ref"));
    sg_tensor *outs[] = {dxp, dw, db, xdb};
    for (int i = 0; i < 4; i++)
        if (outs[i]) tu_poison(outs[i]);
    TU_OK(ctx, sg_linear_backward_through(ctx, x, w, dy, act, pre, dw, db, x_act, xin, dxp, xdb));
    TU_OK(ref, sg_linear_backward_through(ref, xr, wr, dyr, act, prer, dwr, dbr, x_act, xinr, dxpr, xdbr));
    /* The reference against the composition it replaces (f64: rounding only). */
    sg_tensor *dxr = tu_keep(tu_tensor2(ref, d, m, k, "dx"));
    sg_tensor *dwr2 = tu_keep(tu_tensor2(ref, d, n, k, "dw2")), *dbr2 = tu_keep(tu_tensor1(ref, d, n, "db2"));
    TU_OK(ref, sg_linear_backward(ref, xr, wr, dyr2, act, prer, dxr, dwr2, dbr2));
    double *dx = tu_get(dxr), *xi = tu_get(xinr), *got = tu_get(dxpr), *gdb = tu_get(xdbr);
    double *col = calloc((size_t)k, sizeof *col), worst = 0, worst_db = 0;
    for (int64_t r = 0; r < m; r++)
        for (int64_t i = 0; i < k; i++) {
            double v = dx[r * k + i] * (x_act == SG_ACT_GELU ? exact_gelu_grad(xi[r * k + i]) : (xi[r * k + i] > 0));
            col[i] += v;
            worst = fmax(worst, fabs(v - got[r * k + i]));
        }
    for (int64_t i = 0; i < k; i++) worst_db = fmax(worst_db, fabs(col[i] - gdb[i]));
    TU_CHECK(worst <= 1e-12 && worst_db <= 1e-12 * (double)m, "%s: the f64 reference is not the composition "
             "(dx_pre off by %.3g, x_db by %.3g)", what, worst, worst_db);
    free(dx), free(xi), free(got), free(gdb), free(col);
    char label[200];
    if (dt == SG_DTYPE_BF16 && act == SG_ACT_GELU) {
        /* dw, db and dx_pre from d(pre) as stored in dy (bf16), as both backends compute them
         * (bf16_case's reasoning): the reference again from this run's d(pre). */
        sg_tensor *dps = tu_keep(tu_clone_to(ref, dy, d));
        TU_OK(ref, sg_linear_backward_through(ref, xr, wr, dps, SG_ACT_NONE, NULL, dwr, dbr, x_act, xinr, dxpr,
                                              xdbr));
    }
    if (dt == SG_DTYPE_BF16) {
        /* x_db from dx_pre as stored: the reference's sums of this run's dx_pre. */
        sg_tensor *dps = tu_keep(tu_clone_to(ref, dxp, d));
        double *ps = tu_get(dps), *cs = calloc((size_t)k, sizeof *cs);
        for (int64_t r = 0; r < m; r++)
            for (int64_t i = 0; i < k; i++) cs[i] += ps[r * k + i];
        sg_tensor *xdbs = tu_keep(tu_tensor1(ref, d, k, "x_db_stored"));
        tu_set(xdbs, cs);
        free(ps), free(cs);
        bf16_check(what, "dx_pre", dxp, dxpr, NULL, false);
        bf16_check(what, "dw", dw, dwr, NULL, false);
        bf16_check(what, "db", db, dbr, NULL, false);
        if (xdb) bf16_check(what, "x_db", xdb, xdbs, xdbr, false);
    } else {
        tu_tol tx = gemm_tol(n), tb;
        tx.atol *= 1.13;
        tb = gemm_tol(m);
        tb.atol = tb.atol * 1.13 + (double)m * tx.atol;
        snprintf(label, sizeof label, "%s: dx_pre", what);
        tu_close_tensors(label, dxp, dxpr, tx);
        snprintf(label, sizeof label, "%s: dw", what);
        tu_close_tensors(label, dw, dwr, gemm_tol(m));
        snprintf(label, sizeof label, "%s: db", what);
        tu_close_tensors(label, db, dbr, gemm_tol(m));
        if (xdb) {
            snprintf(label, sizeof label, "%s: x_db", what);
            tu_close_tensors(label, xdb, xdbr, tb);
        }
    }
    tu_free_live();
}

/* The checks sg_linear_backward_through adds, each naming the tensor or argument. */
static void through_errors(sg_ctx *ctx)
{
    const sg_dtype f = SG_DTYPE_F32;
    sg_tensor *x = tu_keep(tu_tensor2(ctx, f, 4, 8, "x")), *xp = tu_keep(tu_tensor2(ctx, f, 4, 8, "xp"));
    sg_tensor *w = tu_keep(tu_tensor2(ctx, f, 5, 8, "w")), *dy = tu_keep(tu_tensor2(ctx, f, 4, 5, "dy"));
    sg_tensor *dw = tu_keep(tu_tensor2(ctx, f, 5, 8, "dw")), *dxp = tu_keep(tu_tensor2(ctx, f, 4, 8, "dxp"));
    sg_tensor *xdb = tu_keep(tu_tensor1(ctx, f, 8, "xdb")), *xdb7 = tu_keep(tu_tensor1(ctx, f, 7, "xdb7"));
    sg_tensor *xp9 = tu_keep(tu_tensor2(ctx, f, 4, 9, "xp9"));
    const sg_activation N0 = SG_ACT_NONE, G = SG_ACT_GELU;
    TU_FAILS(ctx, sg_linear_backward_through(ctx, x, w, dy, N0, NULL, dw, NULL, N0, xp, dxp, xdb), SG_ERR_INVALID,
             "x_act NONE");
    TU_FAILS(ctx, sg_linear_backward_through(ctx, x, w, dy, N0, NULL, dw, NULL, G, NULL, dxp, xdb), SG_ERR_NULL,
             "'x_pre' is NULL");
    TU_FAILS(ctx, sg_linear_backward_through(ctx, x, w, dy, N0, NULL, dw, NULL, G, xp, NULL, xdb), SG_ERR_NULL,
             "'dx_pre' is NULL");
    TU_FAILS(ctx, sg_linear_backward_through(ctx, x, w, dy, N0, NULL, dw, NULL, G, xp9, dxp, xdb), SG_ERR_SHAPE,
             "'x_pre'");
    TU_FAILS(ctx, sg_linear_backward_through(ctx, x, w, dy, N0, NULL, dw, NULL, G, xp, dxp, xdb7), SG_ERR_SHAPE,
             "'x_db'");
    TU_FAILS(ctx, sg_linear_backward_through(ctx, x, w, dy, N0, NULL, dw, NULL, G, xp, xp, xdb), SG_ERR_INVALID,
             "'dx_pre' overlaps 'x_pre'");
    TU_FAILS(ctx, sg_linear_backward_through(ctx, x, w, dy, N0, NULL, dw, NULL, SG_ACT_SILU, xp, dxp, xdb),
             SG_ERR_INVALID, "expected RELU or GELU");
    tu_free_live();
}

/* Finite differences: L(x_pre) = sum(r * y), y = x_act(x_pre) @ w^T + b, so dL/dx_pre is the
 * through backward's dx_pre with dy = r, and x_db its column sums (the gradient of a shift of
 * each column of x_pre). f64, central differences with h = 1e-6: truncation ~h^2 times L's third
 * derivative and cancellation ~1e-16 |L| / h, both under 1e-8 here; tolerance 1e-7. */
typedef struct through_fd {
    sg_ctx *ctx;
    sg_tensor *xp, *x, *w, *b, *y, *r;
    sg_activation x_act;
} through_fd;

static double through_loss(void *u)
{
    through_fd *c = u;
    if (c->x_act == SG_ACT_GELU) TU_OK(c->ctx, sg_gelu_forward(c->ctx, c->xp, c->x));
    else TU_OK(c->ctx, sg_relu_forward(c->ctx, c->xp, c->x));
    TU_OK(c->ctx, sg_linear_forward(c->ctx, c->x, c->w, c->b, SG_ACT_NONE, c->y, NULL));
    return tu_dot(c->y, c->r);
}

static void cpu_through_fd(sg_ctx *ctx, sg_activation x_act)
{
    const sg_dtype d = SG_DTYPE_F64;
    const int64_t m = 5, n = 4, k = 6;
    through_fd c = {ctx, tu_keep(tu_tensor2(ctx, d, m, k, "x_pre")), tu_keep(tu_tensor2(ctx, d, m, k, "x")),
                    tu_keep(tu_tensor2(ctx, d, n, k, "w")), tu_keep(tu_tensor1(ctx, d, n, "b")),
                    tu_keep(tu_tensor2(ctx, d, m, n, "y")), tu_keep(tu_tensor2(ctx, d, m, n, "r")), x_act};
    double *v = tu_random(c.xp, -2, 2);
    for (int64_t i = 0; i < m * k; i++) /* ReLU: clear of its kink, where differences mean nothing */
        if (fabs(v[i]) < 0.05) v[i] = v[i] < 0 ? -0.5 : 0.5;
    tu_set(c.xp, v);
    free(v);
    free(tu_random(c.w, -1, 1));
    free(tu_random(c.b, -1, 1));
    free(tu_random(c.r, -1, 1));
    through_loss(&c); /* x from x_pre */
    sg_tensor *dy = tu_keep(tu_clone_to(ctx, c.r, d)), *dw = tu_keep(tu_tensor2(ctx, d, n, k, "dw"));
    sg_tensor *dxp = tu_keep(tu_tensor2(ctx, d, m, k, "dx_pre")), *xdb = tu_keep(tu_tensor1(ctx, d, k, "x_db"));
    tu_poison(dxp);
    tu_poison(xdb);
    const sg_tensor *xin = x_act == SG_ACT_RELU ? c.x : c.xp;
    TU_OK(ctx, sg_linear_backward_through(ctx, c.x, c.w, dy, SG_ACT_NONE, NULL, dw, NULL, x_act, xin, dxp, xdb));
    char what[64];
    snprintf(what, sizeof what, "cpu through %s: dx_pre", act_name(x_act));
    tu_gradcheck(what, through_loss, &c, c.xp, dxp, 0, 1e-6, (tu_tol){1e-7, 1e-7});
    double *g = tu_get(dxp), *xd = tu_get(xdb), *col = calloc((size_t)k, sizeof *col);
    for (int64_t i = 0; i < m * k; i++) col[i % k] += g[i];
    snprintf(what, sizeof what, "cpu through %s: x_db", act_name(x_act));
    tu_close(what, xd, col, k, (tu_tol){1e-12, 1e-12});
    free(g);
    free(xd);
    free(col);
    tu_free_live();
}

static void cpu_through(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    cpu_through_fd(ctx, SG_ACT_GELU);
    cpu_through_fd(ctx, SG_ACT_RELU);
    const sg_dtype dts[] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        through_case(ctx, ctx, dts[t], 1, 1, 1, SG_ACT_NONE, SG_ACT_GELU, 0, 1);
        through_case(ctx, ctx, dts[t], tu_randint(2, 40), tu_randint(1, 40), tu_randint(1, 40), SG_ACT_GELU,
                     SG_ACT_GELU, 1, 1);
        through_case(ctx, ctx, dts[t], tu_randint(2, 40), tu_randint(1, 40), tu_randint(1, 40), SG_ACT_NONE,
                     SG_ACT_RELU, 0, tu_randint(0, 1));
    }
    through_errors(ctx);
    sg_ctx_destroy(ctx);
}

/* ---- sg_linear_forward_residual: y = x w^T + b + r, rounded once ---- */

/* y of sg_linear_forward_residual against the f64 reference yr: on the CPU the f64 value
 * rounded once (exact); on CUDA an f32 sum of k products (gemm_tol) then one rounding (bf16:
 * the bf16 rule). */
static void residual_y_close(const char *what, const char *name, const sg_tensor *y, const sg_tensor *yr, int gpu,
                             int64_t k)
{
    if (y->dtype == SG_DTYPE_BF16) {
        bf16_check(what, name, y, yr, NULL, !gpu);
        return;
    }
    char label[256];
    snprintf(label, sizeof label, "%s: %s", what, name);
    tu_close_tensors(label, y, yr, gpu ? gemm_tol(k) : tu_tol_for(y->dtype));
}

/* One case on ctx (CPU or CUDA) in dtype dt, against ref's f64 path on the values as stored.
 * mis: every tensor a view one element into its buffer (2- or 4-byte aligned: on CUDA the bias
 * then takes the unfused path). y is checked as written beside r and written over r in place;
 * on CUDA a repeated call gives the same bits, and aligned shapes are one launch. */
static void residual_case(sg_ctx *ctx, sg_ctx *ref, sg_dtype dt, int64_t m, int64_t n, int64_t k, int has_b,
                          int mis, int expect_fused)
{
    if (ctx->backend == SG_BACKEND_CUDA && tu_racecheck()) return; /* see tu_racecheck */
    const sg_dtype d = SG_DTYPE_F64;
    const int gpu = sg_ctx_backend(ctx) == SG_BACKEND_CUDA;
    char what[192], label[256];
    snprintf(what, sizeof what, "%s residual %s M=%lld N=%lld K=%lld bias=%d misaligned=%d", gpu ? "gpu" : "cpu",
             sg_dtype_name(dt), (long long)m, (long long)n, (long long)k, has_b, mis);
    int64_t xs[2] = {m, k}, ws[2] = {n, k}, ys[2] = {m, n};
    sg_tensor *x = dev_tensor(ctx, dt, 2, xs, "x", mis), *w = dev_tensor(ctx, dt, 2, ws, "w", mis);
    sg_tensor *b = has_b ? dev_tensor(ctx, dt, 1, &n, "b", mis) : NULL;
    sg_tensor *r = dev_tensor(ctx, dt, 2, ys, "r", mis), *y = dev_tensor(ctx, dt, 2, ys, "y", mis);
    const double wscale = 1 / sqrt((double)k); /* outputs of order 1, as the residual */
    free(tu_random(x, -1, 1));
    free(tu_random(w, -wscale, wscale));
    if (b) free(tu_random(b, -1, 1));
    free(tu_random(r, -1, 1));
    sg_tensor *xr = tu_keep(tu_clone_to(ref, x, d)), *wr = tu_keep(tu_clone_to(ref, w, d));
    sg_tensor *br = b ? tu_keep(tu_clone_to(ref, b, d)) : NULL, *rr = tu_keep(tu_clone_to(ref, r, d));
    sg_tensor *yr = tu_keep(tu_tensor(ref, d, 2, ys, "y_ref"));
    tu_poison(yr);
    TU_OK(ref, sg_linear_forward_residual(ref, xr, wr, br, rr, yr));
    /* The reference against the naive loop: every CPU case, and the GPU cases' small shapes
     * (for the GPU's large ones it is the same CPU code the CPU cases check, and the naive loop
     * through sg_ld took longer than the rest of the case). */
    if (!gpu || m * n * k <= (int64_t)1 << 22) {
        double *rv = tu_get(rr);
        check_forward_naive(what, xr, wr, br, SG_ACT_NONE, rv, yr, NULL, tu_tol_for(SG_DTYPE_F64));
        free(rv);
    }

    tu_poison(y);
    uint64_t l0 = sg_ctx_launch_count(ctx);
    TU_OK(ctx, sg_linear_forward_residual(ctx, x, w, b, r, y));
    const uint64_t launches = sg_ctx_launch_count(ctx) - l0;
    residual_y_close(what, "y", y, yr, gpu, k);
    if (gpu) {
        TU_CHECK(launches == 1 || (has_b && launches == 2), "%s: took %llu launches", what,
                 (unsigned long long)launches);
        if (expect_fused) TU_CHECK(launches == 1, "%s: took %llu launches, expected one matmul", what,
                                   (unsigned long long)launches);
        double *y1 = tu_get(y);
        tu_poison(y);
        TU_OK(ctx, sg_linear_forward_residual(ctx, x, w, b, r, y));
        snprintf(label, sizeof label, "%s: repeated", what);
        check_same_bits(label, y, y1);
        free(y1);
    }
    /* In place: y starts as r. r's values are still those the reference used. */
    TU_OK(ctx, sg_tensor_copy(y, r));
    TU_OK(ctx, sg_linear_forward_residual(ctx, x, w, b, y, y));
    residual_y_close(what, "y in place", y, yr, gpu, k);
    tu_free_live();
}

typedef struct {
    sg_ctx *ctx;
    sg_tensor *x, *w, *b, *r, *y, *g;
} res_fd;

static double res_loss(void *u)
{
    res_fd *c = u;
    TU_OK(c->ctx, sg_linear_forward_residual(c->ctx, c->x, c->w, c->b, c->r, c->y));
    return tu_dot(c->y, c->g);
}

/* Finite differences of L = sum(y * g) in f64: dL/dr is g, and dL/dx, dL/dw, dL/db are
 * sg_linear_backward's with SG_ACT_NONE and dy = g. The tolerance is fd_tolerance's (L is
 * linear in every input, so no truncation) with the residual's terms sum |g r| added to S. */
static void cpu_residual_fd(sg_ctx *ctx, int64_t m, int64_t n, int64_t k, int has_b)
{
    const sg_dtype d = SG_DTYPE_F64;
    char what[80];
    snprintf(what, sizeof what, "cpu residual fd M=%lld N=%lld K=%lld bias=%d", (long long)m, (long long)n,
             (long long)k, has_b);
    res_fd c = {ctx, tu_keep(tu_tensor2(ctx, d, m, k, "x")), tu_keep(tu_tensor2(ctx, d, n, k, "w")),
                has_b ? tu_keep(tu_tensor1(ctx, d, n, "b")) : NULL, tu_keep(tu_tensor2(ctx, d, m, n, "r")),
                tu_keep(tu_tensor2(ctx, d, m, n, "y")), tu_keep(tu_tensor2(ctx, d, m, n, "g"))};
    sg_tensor *all[] = {c.x, c.w, c.b, c.r, c.g};
    for (int i = 0; i < 5; i++)
        if (all[i]) free(tu_random(all[i], -1, 1));
    fd_case lin = {ctx, SG_ACT_NONE, c.x, c.w, c.b, c.y, NULL, c.g};
    tu_tol tol = fd_tolerance(&lin);
    double sgr = 0;
    for (int64_t i = 0; i < m * n; i++) sgr += fabs(sg_ld(c.g, i) * sg_ld(c.r, i));
    const double u = 0x1p-53, terms = (double)(k + 1 + 16 + m * n + 1);
    tol.atol += 2 * (terms * u / (1 - terms * u)) * sgr / FD_H;

    sg_tensor *dy = tu_keep(tu_tensor2(ctx, d, m, n, "dy")), *dx = tu_keep(tu_tensor2(ctx, d, m, k, "dx"));
    sg_tensor *dw = tu_keep(tu_tensor2(ctx, d, n, k, "dw")), *db = tu_keep(tu_tensor1(ctx, d, n, "db"));
    TU_OK(ctx, sg_tensor_copy(dy, c.g));
    tu_poison(dx), tu_poison(dw), tu_poison(db);
    TU_OK(ctx, sg_linear_backward(ctx, c.x, c.w, dy, SG_ACT_NONE, NULL, dx, dw, c.b ? db : NULL));
    gradcheck_of(what, "dr = g", res_loss, &c, c.r, c.g, tol);
    gradcheck_of(what, "dx", res_loss, &c, c.x, dx, tol);
    gradcheck_of(what, "dw", res_loss, &c, c.w, dw, tol);
    if (c.b) gradcheck_of(what, "db", res_loss, &c, c.b, db, tol);
    tu_free_live();
}

/* Bad arguments fail naming r; the context stays usable. */
static void residual_errors(sg_ctx *ctx)
{
    const sg_dtype f = SG_DTYPE_F32;
    sg_tensor *x = tu_keep(tu_tensor2(ctx, f, 4, 8, "x")), *w = tu_keep(tu_tensor2(ctx, f, 5, 8, "w"));
    sg_tensor *b = tu_keep(tu_tensor1(ctx, f, 5, "b")), *y = tu_keep(tu_tensor2(ctx, f, 4, 5, "y"));
    sg_tensor *r = tu_keep(tu_tensor2(ctx, f, 4, 5, "r")), *r6 = tu_keep(tu_tensor2(ctx, f, 4, 6, "r6"));
    sg_tensor *rh = tu_keep(tu_tensor2(ctx, SG_DTYPE_BF16, 4, 5, "rh"));
    sg_tensor *base = tu_keep(tu_tensor1(ctx, f, 21, "base")), *yv, *rv;
    TU_OK(ctx, sg_tensor_view(base, 0, 2, (int64_t[]){4, 5}, "yv", &yv));
    TU_OK(ctx, sg_tensor_view(base, 1, 2, (int64_t[]){4, 5}, "rv", &rv));
    tu_keep(yv), tu_keep(rv);
    free(tu_random(x, -1, 1)), free(tu_random(w, -1, 1)), free(tu_random(b, -1, 1)), free(tu_random(r, -1, 1));
    free(tu_random(base, -1, 1));
    TU_FAILS(ctx, sg_linear_forward_residual(ctx, x, w, b, NULL, y), SG_ERR_NULL, "'r'");
    TU_FAILS(ctx, sg_linear_forward_residual(ctx, x, w, b, r6, y), SG_ERR_SHAPE, "'r' is (4, 6)");
    TU_FAILS(ctx, sg_linear_forward_residual(ctx, x, w, b, rh, y), SG_ERR_DTYPE, "'r' is bf16");
    TU_FAILS(ctx, sg_linear_forward_residual(ctx, x, w, b, rv, yv), SG_ERR_INVALID, "overlaps 'r'");
    TU_FAILS(ctx, sg_linear_forward_residual(ctx, x, w, b, r, x), SG_ERR_SHAPE, "'y'");
    TU_CHECK(sg_linear_forward_residual(NULL, x, w, b, r, y) == SG_ERR_NULL, "a NULL context was accepted");
    /* still usable: a good call after the failures */
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    sg_tensor *xr = tu_keep(tu_clone_to(cpu, x, SG_DTYPE_F64)), *wr = tu_keep(tu_clone_to(cpu, w, SG_DTYPE_F64));
    sg_tensor *br = tu_keep(tu_clone_to(cpu, b, SG_DTYPE_F64)), *rr = tu_keep(tu_clone_to(cpu, r, SG_DTYPE_F64));
    sg_tensor *yr = tu_keep(tu_tensor2(cpu, SG_DTYPE_F64, 4, 5, "y_ref"));
    TU_OK(cpu, sg_linear_forward_residual(cpu, xr, wr, br, rr, yr));
    tu_poison(y);
    TU_OK(ctx, sg_linear_forward_residual(ctx, x, w, b, r, y));
    tu_close_tensors("residual after errors", y, yr, gemm_tol(8));
    tu_free_live();
    sg_ctx_destroy(cpu);
}

static void cpu_residual(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const sg_dtype dts[] = {SG_DTYPE_F64, SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int t = 0; t < 3; t++)
        for (int rep = 0; rep < 3; rep++)
            residual_case(ctx, ctx, dts[t], tu_randint(1, 40), tu_randint(1, 40), tu_randint(1, 40), rep != 1,
                          rep == 2, 0);
    cpu_residual_fd(ctx, 1, 1, 1, 1);
    for (int rep = 0; rep < 3; rep++)
        cpu_residual_fd(ctx, tu_randint(1, 6), tu_randint(1, 7), tu_randint(1, 8), rep != 2);
    residual_errors(ctx);
    sg_ctx_destroy(ctx);
}

/* CUDA against the f64 reference: one row (the GEMV kernel, which adds the residual itself),
 * odd shapes, the GPT block's projection (2048 x 768 from 3072), views (the unfused bias path)
 * and a random tall shape, with and without a bias, f32 and bf16. */
static void gpu_residual(sg_ctx *gpu, sg_ctx *cpu)
{
    const sg_dtype dts[] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int t = 0; t < 2; t++)
        for (int v = 0; v < 2; v++) {
            residual_case(gpu, cpu, dts[t], 1, 768, 3072, v, 0, 1);
            residual_case(gpu, cpu, dts[t], 7, 13, 5, v, 0, 0);
            residual_case(gpu, cpu, dts[t], 2048, 768, 3072, v, 0, 1);
            residual_case(gpu, cpu, dts[t], 64, 40, 24, v, 1, 0);
            residual_case(gpu, cpu, dts[t], 2 * tu_randint(1, 500), tu_randint(1, 64), tu_randint(1, 64), v, 0, 0);
        }
    residual_errors(gpu);
}

/* The context's second stream (core.h, sg_ctx_side_use): under STEPGRAPH_WGRAD=side the dw
 * matmul (and a bias sum without an activation) runs there beside dx, joined before the call
 * returns; under the default (defer) a direct call queues nothing there, and a call inside a
 * region (sg_ctx_side_enter, as the built-in modules open one) leaves it unjoined until the
 * region ends. Each gives the dx, dw and db of STEPGRAPH_WGRAD=off bit for bit (the same
 * plans), plain and through GELU, f32 and bf16, and a repeat allocates nothing. A value other
 * than off, side or defer fails the context's creation, naming it. */
static void side_stream_cases(void)
{
    const char *W = "STEPGRAPH_WGRAD";
    sg_ctx *c[4] = {tu_ctx_env(W, "off"), tu_ctx_env(W, "side"), tu_ctx_env(W, NULL), tu_ctx_env(W, "defer")};
    const char *how[4] = {"off", "side", "default (defer), a direct call", "defer, inside a region"};
    TU_CHECK(sg_ctx_side_stream(c[0]) == NULL, "STEPGRAPH_WGRAD=off made a second stream");
    for (int i = 1; i < 4; i++) TU_CHECK(sg_ctx_side_stream(c[i]) != NULL, "%s: no second stream", how[i]);
    sg_ctx *bad = NULL;
    const sg_status st = tu_ctx_create_env(W, "sideways", &bad);
    TU_CHECK(st == SG_ERR_INVALID && !bad && strstr(sg_ctx_last_error(NULL), "STEPGRAPH_WGRAD is 'sideways'"),
             "STEPGRAPH_WGRAD=sideways: status %d, message '%s'", (int)st, sg_ctx_last_error(NULL));
    if (bad) sg_ctx_destroy(bad);
    const sg_dtype dts[] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int t = 0; t < 2; t++)
        for (int thr = 0; thr < 2; thr++) {
            const sg_dtype dt = dts[t];
            const int64_t m = 2 * tu_randint(64, 512), n = 8 * tu_randint(8, 96), k = 8 * tu_randint(8, 96);
            sg_tensor *dx[4], *dw[4], *db[4], *dy[4];
            sg_tensor *x = tu_keep(tu_tensor2(c[0], dt, m, k, "x")), *w = tu_keep(tu_tensor2(c[0], dt, n, k, "w"));
            sg_tensor *dy0 = tu_keep(tu_tensor2(c[0], dt, m, n, "dy")), *xp = tu_keep(tu_tensor2(c[0], dt, m, k, "x_pre"));
            free(tu_random(x, -1, 1)), free(tu_random(w, -0.1, 0.1)), free(tu_random(dy0, -1, 1));
            free(tu_random(xp, -2, 2));
            for (int i = 0; i < 4; i++) {
                sg_tensor *xi = tu_keep(tu_clone_to(c[i], x, dt)), *wi = tu_keep(tu_clone_to(c[i], w, dt));
                sg_tensor *xpi = tu_keep(tu_clone_to(c[i], xp, dt));
                dy[i] = tu_keep(tu_clone_to(c[i], dy0, dt));
                dx[i] = tu_keep(tu_tensor2(c[i], dt, m, k, "dx")), dw[i] = tu_keep(tu_tensor2(c[i], dt, n, k, "dw"));
                db[i] = tu_keep(tu_tensor1(c[i], dt, n, "db"));
                tu_poison(dx[i]), tu_poison(dw[i]), tu_poison(db[i]);
                for (int rep = 0; rep < 2; rep++) { /* the second call on the plans and scratch of the first */
                    sg_alloc_stats a0, a1;
                    TU_OK(c[i], sg_ctx_alloc_stats(c[i], &a0));
                    if (i == 3) sg_ctx_side_enter(c[i]);
                    if (thr)
                        TU_OK(c[i], sg_linear_backward_through(c[i], xi, wi, dy[i], SG_ACT_NONE, NULL, dw[i], db[i],
                                                               SG_ACT_GELU, xpi, dx[i], NULL));
                    else
                        TU_OK(c[i], sg_linear_backward(c[i], xi, wi, dy[i], SG_ACT_NONE, NULL, dx[i], dw[i], db[i]));
                    if (i == 3) TU_OK(c[i], sg_ctx_side_leave(c[i]));
                    TU_OK(c[i], sg_ctx_alloc_stats(c[i], &a1));
                    TU_CHECK(rep == 0 || a1.device_allocs == a0.device_allocs, "%s: a repeat allocated", how[i]);
                }
            }
            for (int i = 1; i < 4; i++) {
                char what[160];
                snprintf(what, sizeof what, "STEPGRAPH_WGRAD %s, %s M=%lld N=%lld K=%lld%s", how[i], sg_dtype_name(dt),
                         (long long)m, (long long)n, (long long)k, thr ? " through GELU" : "");
                tu_same_bits(dx[i], dx[0], what, 0);
                tu_same_bits(dw[i], dw[0], what, 0);
                tu_same_bits(db[i], db[0], what, 0);
            }
            const sg_tensor *outs[3] = {dx[0], dw[0], db[0]};
            for (int o = 0; o < 3; o++) { /* written everywhere (poisoned before) */
                const int64_t nan = tu_count_nan(outs[o]);
                TU_CHECK(nan == 0, "STEPGRAPH_WGRAD=off: %lld of output %d left poisoned", (long long)nan, o);
            }
            tu_free_live();
        }
    for (int i = 0; i < 4; i++) sg_ctx_destroy(c[i]);
}

/* |got - ref| <= c * bound + 1e-30 elementwise, where bound = sum |a||b| of the element's
 * terms (an f64 matmul of absolute values, the bias's too) and c the relative error of one
 * TF32 product plus f32 accumulation over len terms: each input cut to 10 mantissa bits
 * (rounded or truncated, off by less than u = 2^-10 relatively, so a product by less than
 * 2u + u^2), the sum off by at most (len + 1) 2^-24 of the absolute sum. A bound, not an
 * estimate: it holds for every draw. */
static void tf32_close(const char *what, const sg_tensor *got, const sg_tensor *ref, const sg_tensor *bound,
                       int64_t len)
{
    const double u = ldexp(1, -10), c = 2 * u + u * u + (double)(len + 1) * ldexp(1, -24);
    double *g = tu_get(got), *r = tu_get(ref), *b = tu_get(bound), worst = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < got->numel; i++) {
        const double d = fabs(g[i] - r[i]), lim = c * b[i] + 1e-30;
        bad += !(d <= lim);
        if (d / lim > worst) worst = d / lim;
    }
    TU_CHECK(bad == 0, "%s: %lld of %lld elements past the TF32 bound (worst %.3g of it)", what, (long long)bad,
             (long long)got->numel, worst);
    free(g), free(r), free(b);
}

/* sg_ctx_options.tf32: a context's f32 linear forward and backward run in TF32. Against the f64
 * reference within the TF32 bound (tf32_close), and unlike a plain f32 context's bits in most
 * elements (so TF32 is really on: rounding the inputs to 10 mantissa bits moves nearly every
 * sum). The bounds come from f64 matmuls of the operands' absolute values. */
static void tf32_cases(sg_ctx *plain, sg_ctx *cpu)
{
    sg_ctx_options o = sg_ctx_options_default();
    o.backend = SG_BACKEND_CUDA, o.tf32 = 1;
    sg_ctx *tf = NULL;
    TU_OK(NULL, sg_ctx_create(&o, &tf));
    TU_CHECK(sg_ctx_tf32(tf) && !sg_ctx_tf32(plain), "sg_ctx_options.tf32 did not reach the context");
    /* the environment's switch: 1 turns it on, another value fails the creation, naming it */
    const char *vals[2] = {"1", "yes"};
    for (int e = 0; e < 2; e++) {
        sg_ctx *c = NULL;
        const sg_status st = tu_ctx_create_env("STEPGRAPH_TF32", vals[e], &c);
        if (e == 0) TU_CHECK(st == SG_OK && sg_ctx_tf32(c), "STEPGRAPH_TF32=1: status %d, tf32 off", (int)st);
        else TU_CHECK(st == SG_ERR_INVALID && !c && strstr(sg_ctx_last_error(NULL), "STEPGRAPH_TF32 is 'yes'"),
                      "STEPGRAPH_TF32=yes: status %d, '%s'", (int)st, sg_ctx_last_error(NULL));
        if (c) sg_ctx_destroy(c);
    }
    const sg_dtype f = SG_DTYPE_F32, d = SG_DTYPE_F64;
    const int64_t shapes[2][3] = {{256, 384, 768}, {4 * tu_randint(8, 128), 4 * tu_randint(8, 128), 4 * tu_randint(8, 256)}};
    for (int i = 0; i < 2; i++) {
        const int64_t m = shapes[i][0], n = shapes[i][1], k = shapes[i][2];
        char what[128];
        snprintf(what, sizeof what, "tf32 M=%lld N=%lld K=%lld", (long long)m, (long long)n, (long long)k);
        sg_tensor *x = tu_keep(tu_tensor2(tf, f, m, k, "x")), *w = tu_keep(tu_tensor2(tf, f, n, k, "w"));
        sg_tensor *b = tu_keep(tu_tensor1(tf, f, n, "b")), *dy = tu_keep(tu_tensor2(tf, f, m, n, "dy"));
        free(tu_random(x, -1, 1)), free(tu_random(w, -1, 1)), free(tu_random(b, -1, 1)), free(tu_random(dy, -1, 1));
        sg_tensor *y = tu_keep(tu_tensor2(tf, f, m, n, "y")), *dx = tu_keep(tu_tensor2(tf, f, m, k, "dx"));
        sg_tensor *dw = tu_keep(tu_tensor2(tf, f, n, k, "dw")), *db = tu_keep(tu_tensor1(tf, f, n, "db"));
        tu_poison(y), tu_poison(dx), tu_poison(dw), tu_poison(db);
        TU_OK(tf, sg_linear_forward(tf, x, w, b, SG_ACT_NONE, y, NULL));
        sg_tensor *g = tu_keep(tu_clone_to(tf, dy, f)); /* the backward may write d(pre) over dy */
        TU_OK(tf, sg_linear_backward(tf, x, w, g, SG_ACT_NONE, NULL, dx, dw, db));
        /* the f64 reference and the bounds: the same matmuls on |x|, |w|, |dy| (no bias) */
        sg_tensor *xr = tu_keep(tu_clone_to(cpu, x, d)), *wr = tu_keep(tu_clone_to(cpu, w, d));
        sg_tensor *br = tu_keep(tu_clone_to(cpu, b, d)), *dyr = tu_keep(tu_clone_to(cpu, dy, d));
        sg_tensor *yr = tu_keep(tu_tensor2(cpu, d, m, n, "y_ref")), *dxr = tu_keep(tu_tensor2(cpu, d, m, k, "dx_ref"));
        sg_tensor *dwr = tu_keep(tu_tensor2(cpu, d, n, k, "dw_ref")), *dbr = tu_keep(tu_tensor1(cpu, d, n, "db_ref"));
        TU_OK(cpu, sg_linear_forward(cpu, xr, wr, br, SG_ACT_NONE, yr, NULL));
        TU_OK(cpu, sg_linear_backward(cpu, xr, wr, dyr, SG_ACT_NONE, NULL, dxr, dwr, dbr));
        sg_tensor *ax = tu_keep(tu_clone_to(cpu, x, d)), *aw = tu_keep(tu_clone_to(cpu, w, d));
        sg_tensor *ady = tu_keep(tu_clone_to(cpu, dy, d)), *ab = tu_keep(tu_clone_to(cpu, b, d));
        sg_tensor *abs_of[4] = {ax, aw, ady, ab};
        for (int t = 0; t < 4; t++) {
            double *v = tu_get(abs_of[t]);
            for (int64_t e = 0; e < abs_of[t]->numel; e++) v[e] = fabs(v[e]);
            tu_set(abs_of[t], v);
            free(v);
        }
        sg_tensor *yb = tu_keep(tu_tensor2(cpu, d, m, n, "y_bound")), *dxb = tu_keep(tu_tensor2(cpu, d, m, k, "dx_bound"));
        sg_tensor *dwb = tu_keep(tu_tensor2(cpu, d, n, k, "dw_bound"));
        TU_OK(cpu, sg_linear_forward(cpu, ax, aw, ab, SG_ACT_NONE, yb, NULL));
        TU_OK(cpu, sg_linear_backward(cpu, ax, aw, ady, SG_ACT_NONE, NULL, dxb, dwb, NULL));
        char label[192];
        snprintf(label, sizeof label, "%s: y", what), tf32_close(label, y, yr, yb, k + 1);
        snprintf(label, sizeof label, "%s: dx", what), tf32_close(label, dx, dxr, dxb, n);
        snprintf(label, sizeof label, "%s: dw", what), tf32_close(label, dw, dwr, dwb, m);
        snprintf(label, sizeof label, "%s: db", what), tu_close_tensors(label, db, dbr, gemm_tol(m));
        /* the plain context's forward on the same values: most elements' bits differ */
        sg_tensor *xp = tu_keep(tu_clone_to(plain, x, f)), *wp = tu_keep(tu_clone_to(plain, w, f));
        sg_tensor *bp = tu_keep(tu_clone_to(plain, b, f)), *yp = tu_keep(tu_tensor2(plain, f, m, n, "y_plain"));
        TU_OK(plain, sg_linear_forward(plain, xp, wp, bp, SG_ACT_NONE, yp, NULL));
        double *a = tu_get(y), *p = tu_get(yp);
        int64_t same = 0;
        for (int64_t e = 0; e < m * n; e++) same += a[e] == p[e];
        TU_CHECK(2 * same < m * n, "%s: %lld of %lld outputs are a plain f32 context's bits: TF32 seems off", what,
                 (long long)same, (long long)(m * n));
        free(a), free(p);
        tu_free_live();
    }
    sg_ctx_destroy(tf);
}

/* sg_ctx_options.gemm_tune and STEPGRAPH_GEMM_TUNE. Creation: the option's and the
 * environment's values (1 means 16), and a value out of range fails naming it. A tuned context's
 * forward and backward (bias, GELU with its aux output, a residual, f32 and bf16) against the f64
 * reference with the untuned tolerances; some plan is timed. A shape's second call gives its
 * first call's bits (the choice is fixed at the first call, and the timing's writes to y and pre
 * are written over by the call itself). A shape first met inside a capture, and an in-place
 * residual (C is the output), are not timed and give the plain context's bits (the heuristic's
 * first, as an untuned context asks for one). */
typedef struct tune_fwd {
    sg_ctx *ctx;
    const sg_tensor *x, *w, *b;
    sg_tensor *y;
} tune_fwd;

static sg_status tune_fwd_step(void *user)
{
    tune_fwd *f = user;
    return sg_linear_forward(f->ctx, f->x, f->w, f->b, SG_ACT_NONE, f->y, NULL);
}

static int tune_timed(sg_ctx *ctx)
{
    int timed, switched;
    sg_linear_tune_counts(ctx, &timed, &switched);
    TU_CHECK(switched >= 0 && switched <= timed, "tune counts: %d switched of %d timed", switched, timed);
    return timed;
}

static void tune_cases(sg_ctx *plain, sg_ctx *cpu)
{
    if (tu_racecheck()) return; /* see tu_racecheck */
    sg_ctx_options o = sg_ctx_options_default();
    o.backend = SG_BACKEND_CUDA;
    sg_ctx *c = NULL;
    o.gemm_tune = 17;
    TU_CHECK(sg_ctx_create(&o, &c) == SG_ERR_INVALID && !c && strstr(sg_ctx_last_error(NULL), "gemm_tune is 17"),
             "gemm_tune 17: '%s'", sg_ctx_last_error(NULL));
    const char *vals[5] = {"8", "1", "0", "17", "fast"};
    const int want[3] = {8, 16, 0};
    for (int e = 0; e < 5; e++) {
        const sg_status st = tu_ctx_create_env("STEPGRAPH_GEMM_TUNE", vals[e], &c);
        char msg[64];
        snprintf(msg, sizeof msg, "STEPGRAPH_GEMM_TUNE is '%s'", vals[e]);
        if (e < 3)
            TU_CHECK(st == SG_OK && sg_ctx_gemm_tune(c) == want[e], "STEPGRAPH_GEMM_TUNE=%s: status %d, %d timed",
                     vals[e], (int)st, c ? sg_ctx_gemm_tune(c) : -1);
        else
            TU_CHECK(st == SG_ERR_INVALID && !c && strstr(sg_ctx_last_error(NULL), msg),
                     "STEPGRAPH_GEMM_TUNE=%s: status %d, '%s'", vals[e], (int)st, sg_ctx_last_error(NULL));
        if (c) sg_ctx_destroy(c), c = NULL;
    }
    TU_CHECK(sg_ctx_gemm_tune(plain) == 0, "the plain context times candidates");
    o.gemm_tune = 1;
    sg_ctx *tc = NULL;
    TU_OK(NULL, sg_ctx_create(&o, &tc));
    TU_CHECK(sg_ctx_gemm_tune(tc) == 16 && tune_timed(tc) == 0, "gemm_tune 1: %d candidates, %d timed",
             sg_ctx_gemm_tune(tc), tune_timed(tc));
    gpu_scratch_warmup(tc); /* the cases count launches: the scratch's first fills are not theirs */

    bf16_case(tc, cpu, (gpu_spec){256, 384, 512, SG_ACT_NONE, 1, 1, 2, 0, 1});
    bf16_case(tc, cpu, (gpu_spec){128, 512, 256, SG_ACT_GELU, 1, 1, 2, 0, 1});
    gpu_case(tc, cpu, (gpu_spec){192, 320, 160, SG_ACT_GELU, 1, 1, 2, 0, 1});
    residual_case(tc, cpu, SG_DTYPE_BF16, 256, 384, 512, 1, 0, 1);
    const int timed = tune_timed(tc);
    TU_CHECK(timed > 0, "a tuned context timed no plan");

    const sg_dtype h = SG_DTYPE_BF16;
    const int64_t m = 200, n = 1024, k = 320;
    sg_tensor *x = tu_keep(tu_tensor2(tc, h, m, k, "x")), *w = tu_keep(tu_tensor2(tc, h, n, k, "w"));
    sg_tensor *b = tu_keep(tu_tensor1(tc, h, n, "b"));
    free(tu_random(x, -1, 1)), free(tu_random(w, -0.1, 0.1)), free(tu_random(b, -1, 1));
    sg_tensor *y = tu_keep(tu_tensor2(tc, h, m, n, "y")), *pre = tu_keep(tu_tensor2(tc, h, m, n, "pre"));
    tu_poison(y), tu_poison(pre);
    TU_OK(tc, sg_linear_forward(tc, x, w, b, SG_ACT_GELU, y, pre));
    double *y1 = tu_get(y), *pre1 = tu_get(pre);
    for (int64_t e = 0; e < m * n; e++) TU_CHECK(!isnan(y1[e]) && !isnan(pre1[e]), "GELU forward: element %lld unwritten", (long long)e);
    tu_poison(y), tu_poison(pre);
    TU_OK(tc, sg_linear_forward(tc, x, w, b, SG_ACT_GELU, y, pre));
    check_same_bits("tuned GELU forward, second call: y", y, y1);
    check_same_bits("tuned GELU forward, second call: pre", pre, pre1);
    free(y1), free(pre1);

    /* first met inside a capture (no warm-up run), then replayed */
    const int64_t cm = 96, cn = 640, ck = 192;
    sg_tensor *cx = tu_keep(tu_tensor2(tc, h, cm, ck, "cx")), *cw = tu_keep(tu_tensor2(tc, h, cn, ck, "cw"));
    sg_tensor *cb = tu_keep(tu_tensor1(tc, h, cn, "cb")), *cy = tu_keep(tu_tensor2(tc, h, cm, cn, "cy"));
    free(tu_random(cx, -1, 1)), free(tu_random(cw, -0.2, 0.2)), free(tu_random(cb, -1, 1));
    tu_poison(cy);
    const int before = tune_timed(tc);
    tune_fwd f = {tc, cx, cw, cb, cy};
    sg_graph_options go = sg_graph_options_default();
    go.warmup = 0;
    sg_graph *g = NULL;
    TU_OK(tc, sg_graph_capture(tc, tune_fwd_step, &f, &go, &g));
    TU_OK(tc, sg_graph_replay(g));
    TU_OK(tc, sg_ctx_sync(tc));
    TU_CHECK(tune_timed(tc) == before, "a plan first met in a capture was timed (%d, was %d)", tune_timed(tc), before);
    sg_tensor *px = tu_keep(tu_clone_to(plain, cx, h)), *pw = tu_keep(tu_clone_to(plain, cw, h));
    sg_tensor *pb = tu_keep(tu_clone_to(plain, cb, h)), *py = tu_keep(tu_tensor2(plain, h, cm, cn, "py"));
    tu_poison(py);
    TU_OK(plain, sg_linear_forward(plain, px, pw, pb, SG_ACT_NONE, py, NULL));
    double *pv = tu_get(py);
    check_same_bits("a plan first met in a capture, against the plain context", cy, pv);
    free(pv);
    sg_graph_destroy(g);

    /* in place: r is y (cuBLASLt's C is D), not timed */
    const int64_t rm = 160, rn = 448, rk = 224;
    sg_tensor *rx = tu_keep(tu_tensor2(tc, h, rm, rk, "rx")), *rw = tu_keep(tu_tensor2(tc, h, rn, rk, "rw"));
    sg_tensor *rb = tu_keep(tu_tensor1(tc, h, rn, "rb")), *ry = tu_keep(tu_tensor2(tc, h, rm, rn, "ry"));
    free(tu_random(rx, -1, 1)), free(tu_random(rw, -0.2, 0.2)), free(tu_random(rb, -1, 1)), free(tu_random(ry, -1, 1));
    sg_tensor *qx = tu_keep(tu_clone_to(plain, rx, h)), *qw = tu_keep(tu_clone_to(plain, rw, h));
    sg_tensor *qb = tu_keep(tu_clone_to(plain, rb, h)), *qy = tu_keep(tu_clone_to(plain, ry, h));
    const int before2 = tune_timed(tc);
    TU_OK(tc, sg_linear_forward_residual(tc, rx, rw, rb, ry, ry));
    TU_CHECK(tune_timed(tc) == before2, "an in-place residual's plan was timed");
    TU_OK(plain, sg_linear_forward_residual(plain, qx, qw, qb, qy, qy));
    double *qv = tu_get(qy);
    check_same_bits("an in-place residual, against the plain context", ry, qv);
    free(qv);
    tu_free_live();
    sg_ctx_destroy(tc);
}

static void gpu_vs_cpu(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    gpu_scratch_warmup(gpu);
    int64_t shapes[][3] = {
        {1, 1, 1},
        {7, 13, 5},   /* odd: unaligned rows, unfused GELU (N % 8 != 0) */
        {32, 512, 512},
        {tu_randint(1, 300), tu_randint(1, 300), tu_randint(1, 300)},
        {2 * tu_randint(1, 1000), tu_randint(1, 64), tu_randint(1, 64)}, /* tall: db split over rows */
    };
    const sg_activation acts[] = {SG_ACT_NONE, SG_ACT_RELU, SG_ACT_GELU};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int a = 0; a < 3; a++)
            for (int v = 0; v < 4; v++) {
                gpu_spec s = {shapes[i][0], shapes[i][1], shapes[i][2], acts[a],
                              v & 1, (v >> 1) & 1, v == 1 || v == 2, 0, i == 2};
                gpu_case(gpu, cpu, s);
            }
    /* Views one element into their buffers: pointers only 4-byte aligned. */
    gpu_case(gpu, cpu, (gpu_spec){48, 32, 16, SG_ACT_NONE, 1, 1, 0, 1, 0});
    gpu_case(gpu, cpu, (gpu_spec){64, 40, 24, SG_ACT_GELU, 1, 1, 0, 1, 0});
    gpu_case(gpu, cpu, (gpu_spec){33, 17, 9, SG_ACT_RELU, 1, 1, 1, 1, 0});
    /* One large call. */
    gpu_case(gpu, cpu, (gpu_spec){256, 2048, 2048, SG_ACT_GELU, 1, 1, 1, 0, 1});
    /* One row: stepgraph's GEMV kernel (one launch with its bias and activation), with 16-byte
     * loads (k a multiple of 4 and aligned rows) and without (k odd; views 4-byte aligned). */
    for (int a = 0; a < 3; a++) {
        gpu_case(gpu, cpu, (gpu_spec){1, 2304, 768, acts[a], 1, 1, 0, 0, 1});
        gpu_case(gpu, cpu, (gpu_spec){1, 17, 9, acts[a], a != 1, 1, 0, 0, 1});
        gpu_case(gpu, cpu, (gpu_spec){1, 40, 24, acts[a], 1, 1, 0, 1, 1});
    }

    /* bf16 (mixed precision) on the same context: its plans sit in the cache beside the f32
     * ones of the same shapes and alignments (the key holds the dtype), and must not be
     * mistaken for them either way. Each act, with and without bias; odd shapes (K and N
     * odd: rows 2-byte aligned) included: cuBLASLt must find a bf16 algorithm for them. The
     * aligned shapes (from 32x512x512 on) must fuse, as in f32. */
    int64_t hshapes[][3] = {
        {1, 1, 1}, {7, 13, 5}, {32, 512, 512}, {2048, 768, 3072}, {256, 2048, 2048},
    };
    for (size_t i = 0; i < sizeof hshapes / sizeof *hshapes; i++)
        for (int a = 0; a < 3; a++)
            for (int v = 0; v < 2; v++)
                bf16_case(gpu, cpu, (gpu_spec){hshapes[i][0], hshapes[i][1], hshapes[i][2],
                                               acts[a], v, 1, 0, 0, i >= 2});
    /* dx NULL with N-D x; views one bf16 element in (2-byte aligned: the bias and the GELU
     * aux then take the unfused path); a tall shape whose db is split over row chunks. */
    bf16_case(gpu, cpu, (gpu_spec){48, 32, 16, SG_ACT_NONE, 1, 0, 1, 0, 0});
    bf16_case(gpu, cpu, (gpu_spec){64, 40, 24, SG_ACT_GELU, 1, 1, 0, 1, 0});
    bf16_case(gpu, cpu, (gpu_spec){33, 17, 9, SG_ACT_RELU, 1, 1, 1, 1, 0});
    bf16_case(gpu, cpu, (gpu_spec){2 * tu_randint(1, 1000), tu_randint(1, 64), tu_randint(1, 64),
                                   SG_ACT_GELU, 1, 1, 0, 0, 0});
    for (int a = 0; a < 3; a++) { /* one row, as in f32 (16-byte loads: k a multiple of 8) */
        bf16_case(gpu, cpu, (gpu_spec){1, 3072, 768, acts[a], 1, 1, 0, 0, 1});
        bf16_case(gpu, cpu, (gpu_spec){1, 17, 12, acts[a], a != 1, 1, 0, 0, 1});
    }
    /* f32 again on a shape whose bf16 plans are now cached: still its own plans. */
    gpu_case(gpu, cpu, (gpu_spec){32, 512, 512, SG_ACT_GELU, 1, 1, 0, 0, 1});

    /* Mixed dtypes fail naming the tensor (x sets the call's dtype); the context and its
     * cache keep working (the cases above ran on the same context). */
    sg_tensor *x = tu_keep(tu_tensor2(gpu, SG_DTYPE_F32, 4, 8, "x"));
    sg_tensor *w = tu_keep(tu_tensor2(gpu, SG_DTYPE_F32, 5, 8, "w"));
    sg_tensor *y = tu_keep(tu_tensor2(gpu, SG_DTYPE_F32, 4, 5, "y"));
    sg_tensor *xh = tu_keep(tu_tensor2(gpu, SG_DTYPE_BF16, 4, 8, "xh"));
    sg_tensor *wh = tu_keep(tu_tensor2(gpu, SG_DTYPE_BF16, 5, 8, "wh"));
    sg_tensor *dy = tu_keep(tu_tensor2(gpu, SG_DTYPE_F32, 4, 5, "dy"));
    sg_tensor *dw = tu_keep(tu_tensor2(gpu, SG_DTYPE_F32, 5, 8, "dw"));
    TU_FAILS(gpu, sg_linear_forward(gpu, xh, w, NULL, SG_ACT_NONE, y, NULL),
             SG_ERR_DTYPE, "'w' is f32, expected bf16");
    TU_FAILS(gpu, sg_linear_forward(gpu, x, wh, NULL, SG_ACT_NONE, y, NULL),
             SG_ERR_DTYPE, "'w' is bf16, expected f32");
    TU_FAILS(gpu, sg_linear_backward(gpu, xh, w, dy, SG_ACT_NONE, NULL, NULL, dw, NULL),
             SG_ERR_DTYPE, "'w' is f32, expected bf16");
    tu_free_live();
    bf16_errors(gpu);
    gpu_case(gpu, cpu, (gpu_spec){9, 24, 16, SG_ACT_RELU, 1, 1, 0, 0, 0});
    /* Through an activation: the GPT MLP's shape (the DGELU_BGRAD epilogue), K not a multiple
     * of 8 and views at element 1 (the matmul, then the kernel), ReLU (the kernel). */
    const sg_dtype dts[] = {SG_DTYPE_F32, SG_DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        through_case(gpu, cpu, dts[t], 512, 192, 768, SG_ACT_NONE, SG_ACT_GELU, 0, 1);
        through_case(gpu, cpu, dts[t], 256, 64, 96, SG_ACT_GELU, SG_ACT_GELU, 0, 0);
        through_case(gpu, cpu, dts[t], 77, 40, 30, SG_ACT_NONE, SG_ACT_GELU, 1, 1);
        through_case(gpu, cpu, dts[t], 64, 32, 48, SG_ACT_NONE, SG_ACT_RELU, 0, 1);
    }
    through_errors(gpu);
    gpu_residual(gpu, cpu);
    side_stream_cases();
    tf32_cases(gpu, cpu);
    tune_cases(gpu, cpu);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_linear");
    if (!strcmp(mode, "gpu")) {
        gpu_vs_cpu();
    } else if (!strcmp(mode, "gpu-tune")) { /* tune_cases alone, for repeated runs */
        sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA), *cpu = tu_ctx(SG_BACKEND_CPU);
        tune_cases(gpu, cpu);
        sg_ctx_destroy(cpu);
        sg_ctx_destroy(gpu);
    } else {
        cpu_gradchecks();
        cpu_forward_naive();
        cpu_f32_vs_f64();
        cpu_errors();
        cpu_bf16();
        cpu_through();
        cpu_residual();
        cpu_timing();
    }
    return tu_finish("test_linear");
}
