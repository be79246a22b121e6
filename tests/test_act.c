/* test_act.c: ReLU, GELU and residual add. `cpu`: float64 finite-difference checks of every
 * backward on the reference. `gpu`: every CUDA kernel against the CPU reference on fresh
 * random inputs of several shapes (odd sizes included, to hit the scalar tails), outputs
 * poisoned first. */
#include "testutil.h"

typedef struct {
    sg_ctx *ctx;
    int op; /* 0 relu, 1 gelu, 2 add */
    sg_tensor *x, *b, *y, *r;
} act_case;

static double act_loss(void *u)
{
    act_case *c = u;
    if (c->op == 0) sg_relu_forward(c->ctx, c->x, c->y);
    if (c->op == 1) sg_gelu_forward(c->ctx, c->x, c->y);
    if (c->op == 2) sg_add_forward(c->ctx, c->x, c->b, c->y);
    return tu_dot(c->y, c->r);
}

static void cpu_gradchecks(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    const char *names[] = {"relu", "gelu", "add"};
    for (int op = 0; op < 3; op++) {
        int64_t n = tu_randint(5, 40);
        act_case c = {ctx, op, tu_tensor1(ctx, SG_DTYPE_F64, n, "x"), tu_tensor1(ctx, SG_DTYPE_F64, n, "b"),
                      tu_tensor1(ctx, SG_DTYPE_F64, n, "y"), tu_tensor1(ctx, SG_DTYPE_F64, n, "r")};
        free(tu_random(c.x, -2, 2));
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
        tu_gradcheck(names[op], act_loss, &c, c.x, dx, 0, 1e-6, (tu_tol){1e-8, 1e-6});
        if (op == 2) tu_gradcheck("add (b)", act_loss, &c, c.b, dx, 0, 1e-6, (tu_tol){1e-8, 1e-6});
        sg_tensor *ts[] = {c.x, c.b, c.y, c.r, dx};
        for (int i = 0; i < 5; i++) sg_tensor_destroy(ts[i]);
    }
    sg_ctx_destroy(ctx);
}

static void gpu_vs_cpu(void)
{
    sg_ctx *gpu = tu_ctx(SG_BACKEND_CUDA);
    sg_ctx *cpu = tu_ctx(SG_BACKEND_CPU);
    int64_t sizes[] = {1, 3, 4, 1000, 4097, (int64_t)tu_randint(1, 1 << 20)};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int64_t n = sizes[s];
        sg_tensor *xg = tu_tensor1(gpu, SG_DTYPE_F32, n, "x"), *bg = tu_tensor1(gpu, SG_DTYPE_F32, n, "b");
        sg_tensor *yg = tu_tensor1(gpu, SG_DTYPE_F32, n, "y");
        free(tu_random(xg, -3, 3));
        free(tu_random(bg, -3, 3));
        sg_tensor *xc = tu_clone_to(cpu, xg, SG_DTYPE_F32), *bc = tu_clone_to(cpu, bg, SG_DTYPE_F32);
        sg_tensor *yc = tu_tensor1(cpu, SG_DTYPE_F32, n, "y_ref");
        char what[64];
        for (int op = 0; op < 5; op++) {
            tu_poison(yg);
            switch (op) {
            case 0: TU_OK(gpu, sg_relu_forward(gpu, xg, yg)); sg_relu_forward(cpu, xc, yc); break;
            case 1: TU_OK(gpu, sg_relu_backward(gpu, xg, bg, yg)); sg_relu_backward(cpu, xc, bc, yc); break;
            case 2: TU_OK(gpu, sg_gelu_forward(gpu, xg, yg)); sg_gelu_forward(cpu, xc, yc); break;
            case 3: TU_OK(gpu, sg_gelu_backward(gpu, xg, bg, yg)); sg_gelu_backward(cpu, xc, bc, yc); break;
            case 4: TU_OK(gpu, sg_add_forward(gpu, xg, bg, yg)); sg_add_forward(cpu, xc, bc, yc); break;
            }
            const char *names[] = {"relu fwd", "relu bwd", "gelu fwd", "gelu bwd", "add"};
            snprintf(what, sizeof what, "%s n=%lld", names[op], (long long)n);
            /* tanhf against double tanh: a few ulp, inside the f32 rule. */
            tu_close_tensors(what, yg, yc, tu_tol_for(SG_DTYPE_F32));
        }
        sg_tensor *ts[] = {xg, bg, yg, xc, bc, yc};
        for (int i = 0; i < 6; i++) sg_tensor_destroy(ts[i]);
    }
    /* Misaligned views (4-byte aligned, not 16) take the scalar path. Input and output are
     * views of two different tensors: an overlapping, shifted output would make the result
     * depend on the order threads run in. */
    sg_tensor *big_in = tu_tensor1(gpu, SG_DTYPE_F32, 1029, "big_in");
    sg_tensor *big_out = tu_tensor1(gpu, SG_DTYPE_F32, 1029, "big_out");
    free(tu_random(big_in, -1, 1));
    int64_t m = 1027;
    sg_tensor *v1, *v2;
    TU_OK(gpu, sg_tensor_view(big_in, 1, 1, &m, "v1", &v1));
    TU_OK(gpu, sg_tensor_view(big_out, 2, 1, &m, "v2", &v2));
    tu_poison(big_out);
    sg_tensor *vc = tu_clone_to(cpu, v1, SG_DTYPE_F32), *vr = tu_tensor1(cpu, SG_DTYPE_F32, m, "vr");
    TU_OK(gpu, sg_relu_forward(gpu, v1, v2));
    sg_relu_forward(cpu, vc, vr);
    tu_close_tensors("relu misaligned view", v2, vr, tu_tol_for(SG_DTYPE_F32));
    sg_tensor_destroy(v1); sg_tensor_destroy(v2); sg_tensor_destroy(big_in); sg_tensor_destroy(big_out);
    sg_tensor_destroy(vc); sg_tensor_destroy(vr);
    sg_ctx_destroy(cpu);
    sg_ctx_destroy(gpu);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tu_seed("test_act");
    if (!strcmp(mode, "gpu")) gpu_vs_cpu();
    else cpu_gradchecks();
    return tu_finish("test_act");
}
