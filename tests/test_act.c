/* test_act.c: ReLU, GELU, SiLU, sigmoid and residual add. `cpu`: float64 finite-difference
 * checks of every
 * backward on the reference; bf16 storage against f64 on the same (bf16-rounded) inputs; mixed
 * dtypes refused by name. `gpu`: every CUDA kernel, f32 and bf16, against the CPU reference on
 * fresh random inputs of several shapes (odd sizes included, to hit the scalar tails), outputs
 * poisoned first; bitwise determinism and one launch per call. */
#include "testutil.h"

#define N_OPS 9
static const char *op_names[N_OPS] = {"relu fwd", "relu bwd",    "gelu fwd",
                                      "gelu bwd", "add",         "silu fwd",
                                      "silu bwd", "sigmoid fwd", "sigmoid bwd"};

/* Op k of the nine above on ctx: y = op(a) or op(a, b) (b: dy of the backwards; a is x, or
 * sigmoid's output y for its backward). */
static sg_status run_op(sg_ctx *ctx, int op, const sg_tensor *a, const sg_tensor *b, sg_tensor *y)
{
    switch (op) {
    case 0: return sg_relu_forward(ctx, a, y);
    case 1: return sg_relu_backward(ctx, a, b, y);
    case 2: return sg_gelu_forward(ctx, a, y);
    case 3: return sg_gelu_backward(ctx, a, b, y);
    case 4: return sg_add_forward(ctx, a, b, y);
    case 5: return sg_silu_forward(ctx, a, y);
    case 6: return sg_silu_backward(ctx, a, b, y);
    case 7: return sg_sigmoid_forward(ctx, a, y);
    default: return sg_sigmoid_backward(ctx, a, b, y);
    }
}

typedef struct {
    sg_ctx *ctx;
    int op; /* 0 relu, 1 gelu, 2 add, 3 silu, 4 sigmoid */
    sg_tensor *x, *b, *y, *r;
} act_case;

static double act_loss(void *u)
{
    act_case *c = u;
    if (c->op == 0) sg_relu_forward(c->ctx, c->x, c->y);
    if (c->op == 1) sg_gelu_forward(c->ctx, c->x, c->y);
    if (c->op == 2) sg_add_forward(c->ctx, c->x, c->b, c->y);
    if (c->op == 3) sg_silu_forward(c->ctx, c->x, c->y);
    if (c->op == 4) sg_sigmoid_forward(c->ctx, c->x, c->y);
    return tu_dot(c->y, c->r);
}

static void cpu_gradchecks(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const char *names[] = {"relu", "gelu", "add", "silu", "sigmoid"};
    for (int op = 0; op < 5; op++) {
        int64_t n = tu_randint(5, 40);
        act_case c = {ctx, op, tu_tensor1(ctx, SG_DTYPE_F64, n, "x"), tu_tensor1(ctx, SG_DTYPE_F64, n, "b"),
                      tu_tensor1(ctx, SG_DTYPE_F64, n, "y"), tu_tensor1(ctx, SG_DTYPE_F64, n, "r")};
        free(tu_random(c.x, op >= 3 ? -6 : -2, op >= 3 ? 6 : 2)); /* both tails of sigmoid */
        free(tu_random(c.b, -2, 2));
        free(tu_random(c.r, -1, 1));
        /* ReLU's kink: keep inputs away from 0 so the central difference is valid. */
        if (op == 0)
            for (int64_t i = 0; i < n; i++) {
                double *x = c.x->data;
                if (fabs(x[i]) < 1e-3) x[i] = 0.5;
            }
        sg_tensor *dx = tu_tensor1(ctx, SG_DTYPE_F64, n, "dx");
        if (op == 0) TU_OK(ctx, sg_relu_backward(ctx, c.x, c.r, dx));
        if (op == 1) TU_OK(ctx, sg_gelu_backward(ctx, c.x, c.r, dx));
        if (op == 2) TU_OK(ctx, sg_tensor_copy(dx, c.r)); /* d(a+b)/da = identity */
        if (op == 3) TU_OK(ctx, sg_silu_backward(ctx, c.x, c.r, dx));
        if (op == 4) { /* the backward reads the forward's output */
            TU_OK(ctx, sg_sigmoid_forward(ctx, c.x, c.y));
            TU_OK(ctx, sg_sigmoid_backward(ctx, c.y, c.r, dx));
        }
        /* SiLU and sigmoid over [-6, 6): |L| reaches ~10, so a step of 1e-5 keeps the rounding
         * error (~1e-16 |L| / h) well under atol; truncation ~h^2 |f'''| < 1e-10. */
        const double h = op >= 3 ? 1e-5 : 1e-6;
        tu_gradcheck(names[op], act_loss, &c, c.x, dx, 0, h, (tu_tol){1e-8, 1e-6});
        if (op == 2) tu_gradcheck("add (b)", act_loss, &c, c.b, dx, 0, 1e-6, (tu_tol){1e-8, 1e-6});
        sg_tensor *ts[] = {c.x, c.b, c.y, c.r, dx};
        for (int i = 0; i < 5; i++) sg_tensor_destroy(ts[i]);
    }
    sg_ctx_destroy(ctx);
}

/* bf16 storage on the CPU: each op against the same op in f64 on the bf16 values (exactly
 * representable in f64), so the only difference is the output's one rounding to bf16: inside
 * the bf16 rule. In place (x and y aliased) as the forward allows. */
static void cpu_bf16(sg_ctx *ctx)
{
    int64_t n = tu_randint(1, 300);
    sg_tensor *a = tu_tensor1(ctx, SG_DTYPE_BF16, n, "x"),
              *b = tu_tensor1(ctx, SG_DTYPE_BF16, n, "dy"),
              *y = tu_tensor1(ctx, SG_DTYPE_BF16, n, "y");
    free(tu_random(a, -3, 3));
    free(tu_random(b, -3, 3));
    sg_tensor *a64 = tu_clone_to(ctx, a, SG_DTYPE_F64), *b64 = tu_clone_to(ctx, b, SG_DTYPE_F64);
    sg_tensor *y64 = tu_tensor1(ctx, SG_DTYPE_F64, n, "y64");
    char what[64];
    for (int op = 0; op < N_OPS; op++) {
        tu_poison(y);
        TU_OK(ctx, run_op(ctx, op, a, b, y));
        TU_OK(ctx, run_op(ctx, op, a64, b64, y64));
        snprintf(what, sizeof what, "bf16 cpu %s n=%lld", op_names[op], (long long)n);
        tu_close_tensors(what, y, y64, tu_tol_for(SG_DTYPE_BF16));
    }
    TU_OK(ctx, sg_tensor_copy(y, a));
    TU_OK(ctx, sg_gelu_forward(ctx, y, y));
    TU_OK(ctx, sg_gelu_forward(ctx, a64, y64));
    tu_close_tensors("bf16 cpu gelu fwd in place", y, y64, tu_tol_for(SG_DTYPE_BF16));
    TU_OK(ctx, sg_tensor_copy(y, a));
    TU_OK(ctx, sg_silu_forward(ctx, y, y));
    TU_OK(ctx, sg_silu_forward(ctx, a64, y64));
    tu_close_tensors("bf16 cpu silu fwd in place", y, y64, tu_tol_for(SG_DTYPE_BF16));
    TU_OK(ctx, sg_tensor_copy(y, a));
    TU_OK(ctx, sg_sigmoid_forward(ctx, y, y));
    TU_OK(ctx, sg_sigmoid_forward(ctx, a64, y64));
    tu_close_tensors("bf16 cpu sigmoid fwd in place", y, y64, tu_tol_for(SG_DTYPE_BF16));
    sg_tensor *ts[] = {a, b, y, a64, b64, y64};
    for (int i = 0; i < 6; i++) sg_tensor_destroy(ts[i]);
}

/* Every tensor of a call has the first one's dtype; the first that differs is named. Run on
 * either backend (no f64 tensors: the CUDA backend has none). */
static void mixed_dtypes(sg_ctx *ctx)
{
    sg_tensor *xb = tu_tensor1(ctx, SG_DTYPE_BF16, 5, "xb"),
              *yb = tu_tensor1(ctx, SG_DTYPE_BF16, 5, "yb");
    sg_tensor *xf = tu_tensor1(ctx, SG_DTYPE_F32, 5, "xf"),
              *yf = tu_tensor1(ctx, SG_DTYPE_F32, 5, "yf");
    sg_tensor *xi = tu_tensor1(ctx, SG_DTYPE_I32, 5, "xi");
    TU_FAILS(ctx, sg_relu_forward(ctx, xb, yf), SG_ERR_DTYPE,
             "sg_relu_forward: 'x' is (5) bf16 but 'y' is (5) f32");
    TU_FAILS(ctx, sg_relu_forward(ctx, xf, yb), SG_ERR_DTYPE, "'x' is (5) f32 but 'y' is (5) bf16");
    TU_FAILS(ctx, sg_relu_backward(ctx, xb, xf, yb), SG_ERR_DTYPE,
             "sg_relu_backward: 'x' is (5) bf16 but 'dy' is (5) f32");
    TU_FAILS(ctx, sg_gelu_forward(ctx, xb, yf), SG_ERR_DTYPE,
             "sg_gelu_forward: 'x' is (5) bf16 but 'y' is (5) f32");
    TU_FAILS(ctx, sg_gelu_backward(ctx, xb, yb, xf), SG_ERR_DTYPE,
             "sg_gelu_backward: 'x' is (5) bf16 but 'dx' is (5) f32");
    TU_FAILS(ctx, sg_add_forward(ctx, xb, xf, yb), SG_ERR_DTYPE,
             "sg_add_forward: 'a' is (5) bf16 but 'b' is (5) f32");
    TU_FAILS(ctx, sg_add_forward(ctx, xb, yb, yf), SG_ERR_DTYPE,
             "'a' is (5) bf16 but 'y' is (5) f32");
    TU_FAILS(ctx, sg_relu_forward(ctx, xi, xi), SG_ERR_DTYPE, "tensor 'x' is i32");
    TU_FAILS(ctx, sg_silu_forward(ctx, xb, yf), SG_ERR_DTYPE,
             "sg_silu_forward: 'x' is (5) bf16 but 'y' is (5) f32");
    TU_FAILS(ctx, sg_silu_backward(ctx, xb, xf, yb), SG_ERR_DTYPE,
             "sg_silu_backward: 'x' is (5) bf16 but 'dy' is (5) f32");
    TU_FAILS(ctx, sg_sigmoid_forward(ctx, xf, yb), SG_ERR_DTYPE,
             "sg_sigmoid_forward: 'x' is (5) f32 but 'y' is (5) bf16");
    TU_FAILS(ctx, sg_sigmoid_backward(ctx, xb, yb, xf), SG_ERR_DTYPE,
             "sg_sigmoid_backward: 'y' is (5) bf16 but 'dx' is (5) f32");
    TU_FAILS(ctx, sg_sigmoid_backward(ctx, xi, xi, xi), SG_ERR_DTYPE, "tensor 'y' is i32");
    sg_tensor *x6 = tu_tensor1(ctx, SG_DTYPE_F32, 6, "x6");
    TU_FAILS(ctx, sg_silu_forward(ctx, xf, x6), SG_ERR_SHAPE,
             "sg_silu_forward: 'x' is (5) f32 but 'y' is (6) f32");
    TU_FAILS(ctx, sg_sigmoid_backward(ctx, xf, x6, yf), SG_ERR_SHAPE,
             "'y' is (5) f32 but 'dy' is (6) f32");
    sg_tensor_destroy(x6);
    /* The context is still usable. */
    free(tu_random(xf, -1, 1));
    TU_OK(ctx, sg_sigmoid_forward(ctx, xf, yf));
    double *yv = tu_get(yf), *xv = tu_get(xf);
    for (int i = 0; i < 5; i++)
        TU_CHECK(fabs(yv[i] - 1 / (1 + exp(-xv[i]))) < 1e-6, "sigmoid after errors: [%d] %g", i,
                 yv[i]);
    free(yv), free(xv);
    sg_tensor *ts[] = {xb, yb, xf, yf, xi};
    for (int i = 0; i < 5; i++) sg_tensor_destroy(ts[i]);
}

static void cpu_tests(void)
{
    cpu_gradchecks();
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    cpu_bf16(ctx);
    mixed_dtypes(ctx);
    sg_ctx_destroy(ctx);
}

/* One dtype (f32 or bf16) on the GPU against the CPU reference in the same dtype: the inputs
 * are the same values, so only the f32 math differs (tanhf, expf against double tanh, exp: a
 * few f32 ulp, inside the f32 rule; in bf16 at most one bf16 ulp after rounding, inside the
 * bf16 rule). Then again: the same bits, and one launch. */
static void gpu_vs_cpu(sg_dtype dt)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    int64_t sizes[] = {1, 3, 4, 1000, 4097, (int64_t)tu_randint(1, 1 << 20)};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int64_t n = sizes[s];
        sg_tensor *xg = tu_tensor1(gpu, dt, n, "x"), *bg = tu_tensor1(gpu, dt, n, "b");
        sg_tensor *yg = tu_tensor1(gpu, dt, n, "y");
        free(tu_random(xg, -3, 3));
        free(tu_random(bg, -3, 3));
        sg_tensor *xc = tu_clone_to(cpu, xg, dt), *bc = tu_clone_to(cpu, bg, dt);
        sg_tensor *yc = tu_tensor1(cpu, dt, n, "y_ref");
        char what[64];
        size_t nb = sg_tensor_nbytes(yg);
        void *first = malloc(nb), *again = malloc(nb);
        for (int op = 0; op < N_OPS; op++) {
            tu_poison(yg);
            TU_OK(gpu, run_op(gpu, op, xg, bg, yg));
            TU_OK(cpu, run_op(cpu, op, xc, bc, yc));
            snprintf(what, sizeof what, "%s %s n=%lld", sg_dtype_name(dt), op_names[op],
                     (long long)n);
            tu_close_tensors(what, yg, yc, tu_tol_for(dt));
            TU_OK(gpu, sg_tensor_copy_to_host(yg, first, nb));
            tu_poison(yg);
            uint64_t n0 = sg_ctx_launch_count(gpu);
            TU_OK(gpu, run_op(gpu, op, xg, bg, yg));
            uint64_t n1 = sg_ctx_launch_count(gpu);
            TU_OK(gpu, sg_tensor_copy_to_host(yg, again, nb));
            TU_CHECK(n1 - n0 == 1, "%s: %llu launches, expected 1", what,
                     (unsigned long long)(n1 - n0));
            TU_CHECK(memcmp(first, again, nb) == 0, "%s: differs between two identical runs", what);
        }
        free(first);
        free(again);
        sg_tensor *ts[] = {xg, bg, yg, xc, bc, yc};
        for (int i = 0; i < 6; i++) sg_tensor_destroy(ts[i]);
    }
    /* Misaligned views (aligned to the element, not to 16 bytes) take the scalar path. Input
     * and output are views of two different tensors: an overlapping, shifted output would make
     * the result depend on the order threads run in. */
    sg_tensor *big_in = tu_tensor1(gpu, dt, 1029, "big_in");
    sg_tensor *big_out = tu_tensor1(gpu, dt, 1029, "big_out");
    free(tu_random(big_in, -1, 1));
    int64_t m = 1027;
    char what_v[64];
    sg_tensor *v1, *v2;
    TU_OK(gpu, sg_tensor_view(big_in, 1, 1, &m, "v1", &v1));
    TU_OK(gpu, sg_tensor_view(big_out, 2, 1, &m, "v2", &v2));
    tu_poison(big_out);
    sg_tensor *vc = tu_clone_to(cpu, v1, dt), *vr = tu_tensor1(cpu, dt, m, "vr");
    TU_OK(gpu, sg_relu_forward(gpu, v1, v2));
    sg_relu_forward(cpu, vc, vr);
    snprintf(what_v, sizeof what_v, "%s relu misaligned view", sg_dtype_name(dt));
    tu_close_tensors(what_v, v2, vr, tu_tol_for(dt));
    /* A mixed-dtype call is refused on the GPU too. */
    if (dt == SG_DTYPE_BF16) mixed_dtypes(gpu);
    sg_tensor_destroy(v1); sg_tensor_destroy(v2); sg_tensor_destroy(big_in); sg_tensor_destroy(big_out);
    sg_tensor_destroy(vc); sg_tensor_destroy(vr);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_act");
    if (!strcmp(mode, "gpu")) {
        gpu_vs_cpu(SG_DTYPE_F32);
        gpu_vs_cpu(SG_DTYPE_BF16);
    } else {
        cpu_tests();
    }
    return tu_finish("test_act");
}
