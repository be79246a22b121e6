/* rmsnorm.c: RMSNorm as a user writes it for stepgraph: a state, the four slots of
 * sg_module_ops, the CPU reference (which the CPU backend runs, and which the kernels are
 * tested against) and the launch of its own CUDA kernels on the context's stream.
 *   forward:  r = 1 / sqrt(mean(x^2) + eps); y = x * r * w
 *   backward: dw_j = sum_rows dy_j x_j r;  dx_j = r w_j dy_j - x_j r^3 / C * sum_k dy_k w_k x_k */
#include "rmsnorm.h"

#include <math.h>
#include <stdlib.h>

#define RMSNORM_EPS 1e-6f

#ifdef RMSNORM_CUDA
int rmsnorm_forward_cuda(void *stream, const float *x, const float *w, float *y, float *rstd, long long rows,
                         long long C, float eps);
int rmsnorm_backward_cuda(void *stream, const float *x, const float *w, const float *rstd, const float *dy,
                          float *dx, float *dw, long long rows, long long C);
const char *rmsnorm_cuda_error(int err);
#endif

typedef struct rmsnorm {
    int w;                      /* the parameter's handle */
    int64_t C;
    const sg_tensor *x;         /* the forward's input, for the backward */
    sg_tensor *y, *rstd, *dx;   /* (rows, C), (rows), (rows, C) */
} rmsnorm;

static void forward_cpu(const float *x, const float *w, float *y, float *rstd, int64_t rows, int64_t C)
{
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * C;
        double ss = 0;
        for (int64_t j = 0; j < C; j++) ss += (double)xi[j] * xi[j];
        float r = 1.0f / sqrtf((float)(ss / C) + RMSNORM_EPS);
        rstd[i] = r;
        for (int64_t j = 0; j < C; j++) y[i * C + j] = xi[j] * r * w[j];
    }
}

static void backward_cpu(const float *x, const float *w, const float *rstd, const float *dy, float *dx, float *dw,
                         int64_t rows, int64_t C)
{
    for (int64_t j = 0; j < C; j++) {
        double s = 0;
        for (int64_t i = 0; i < rows; i++) s += (double)dy[i * C + j] * x[i * C + j] * rstd[i];
        dw[j] = (float)s;
    }
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * C, *gi = dy + i * C;
        float r = rstd[i];
        double dot = 0;
        for (int64_t j = 0; j < C; j++) dot += (double)gi[j] * w[j] * xi[j];
        float k = (float)(dot / C) * r * r * r;
        for (int64_t j = 0; j < C; j++) dx[i * C + j] = r * w[j] * gi[j] - xi[j] * k;
    }
}

/* The CPU passes as host work: run now, or recorded for replay under a captured scope. */
typedef struct cpu_args {
    const float *x, *w, *rstd_in, *dy;
    float *y, *rstd, *dx, *dw;
    int64_t rows, C;
    int backward;
} cpu_args;

static sg_status run_cpu(sg_ctx *ctx, const void *p)
{
    (void)ctx;
    const cpu_args *a = p;
    if (a->backward) backward_cpu(a->x, a->w, a->rstd_in, a->dy, a->dx, a->dw, a->rows, a->C);
    else forward_cpu(a->x, a->w, a->y, a->rstd, a->rows, a->C);
    return SG_OK;
}

static sg_status cuda_result(sg_module *m, int err, const char *what)
{
#ifdef RMSNORM_CUDA
    if (err)
        return sg_ctx_fail(sg_module_ctx(m), SG_ERR_CUDA, "rmsnorm '%s': %s: %s", sg_module_name(m), what,
                           rmsnorm_cuda_error(err));
    return SG_OK;
#else
    (void)err, (void)what;
    return sg_ctx_fail(sg_module_ctx(m), SG_ERR_UNSUPPORTED, "rmsnorm '%s': built without its CUDA kernels "
                       "(RMSNORM_CUDA)", sg_module_name(m));
#endif
}

static sg_status rms_forward(sg_module *m, const sg_tensor *x, const sg_tensor **y)
{
    rmsnorm *s = sg_module_state(m);
    sg_ctx *ctx = sg_module_ctx(m);
    int64_t rows = sg_tensor_dim(x, 0);
    if (sg_tensor_ndim(x) != 2 || sg_tensor_dim(x, 1) != s->C || sg_tensor_dtype(x) != SG_DTYPE_F32)
        return sg_ctx_fail(ctx, SG_ERR_SHAPE, "rmsnorm '%s': x must be (rows, %lld) f32", sg_module_name(m),
                           (long long)s->C);
    s->x = x;
    const float *w = sg_tensor_data(sg_module_param_tensor(m, s->w));
    *y = s->y;
    if (sg_ctx_backend(ctx) == SG_BACKEND_CPU) {
        cpu_args a = {sg_tensor_data(x), w, NULL, NULL, sg_tensor_data(s->y), sg_tensor_data(s->rstd), NULL, NULL,
                      rows, s->C, 0};
        return sg_cpu_run(ctx, run_cpu, &a, sizeof a);
    }
#ifdef RMSNORM_CUDA
    return cuda_result(m, rmsnorm_forward_cuda(sg_ctx_stream(ctx), sg_tensor_data(x), w, sg_tensor_data(s->y),
                                               sg_tensor_data(s->rstd), rows, s->C, RMSNORM_EPS), "forward");
#else
    return cuda_result(m, 0, "forward");
#endif
}

static sg_status rms_backward(sg_module *m, sg_tensor *dy, sg_tensor **dx)
{
    rmsnorm *s = sg_module_state(m);
    sg_ctx *ctx = sg_module_ctx(m);
    if (!s->x) return sg_ctx_fail(ctx, SG_ERR_INVALID, "rmsnorm '%s': backward before forward", sg_module_name(m));
    int64_t rows = sg_tensor_dim(s->x, 0);
    const float *w = sg_tensor_data(sg_module_param_tensor(m, s->w));
    float *dw = sg_tensor_data(sg_module_param_grad(m, s->w));
    *dx = s->dx;
    if (sg_ctx_backend(ctx) == SG_BACKEND_CPU) {
        cpu_args a = {sg_tensor_data(s->x), w, sg_tensor_data(s->rstd), sg_tensor_data(dy), NULL, NULL,
                      sg_tensor_data(s->dx), dw, rows, s->C, 1};
        return sg_cpu_run(ctx, run_cpu, &a, sizeof a);
    }
#ifdef RMSNORM_CUDA
    return cuda_result(m, rmsnorm_backward_cuda(sg_ctx_stream(ctx), sg_tensor_data(s->x), w, sg_tensor_data(s->rstd),
                                                sg_tensor_data(dy), sg_tensor_data(s->dx), dw, rows, s->C),
                       "backward");
#else
    return cuda_result(m, 0, "backward");
#endif
}

static sg_status rms_set_rows(sg_module *m, int64_t rows)
{
    rmsnorm *s = sg_module_state(m);
    sg_status st = sg_tensor_set_rows(s->y, rows);
    if (st == SG_OK) st = sg_tensor_set_rows(s->dx, rows);
    if (st == SG_OK) st = sg_tensor_set_rows(s->rstd, rows);
    return st;
}

static void rms_destroy(sg_module *m)
{
    rmsnorm *s = sg_module_state(m);
    sg_tensor_destroy(s->y), sg_tensor_destroy(s->rstd), sg_tensor_destroy(s->dx);
    free(s);
}

static const sg_module_ops rmsnorm_ops = {"rmsnorm", rms_forward, rms_backward, rms_set_rows, rms_destroy};

sg_status rmsnorm_create(sg_builder *b, const char *name, int64_t C, sg_module **out)
{
    sg_ctx *ctx = sg_builder_ctx(b);
    if (sg_builder_dtype(b) != SG_DTYPE_F32)
        return sg_ctx_fail(ctx, SG_ERR_DTYPE, "rmsnorm '%s': f32 models only", name);
    rmsnorm *s = calloc(1, sizeof *s);
    if (!s) return sg_ctx_fail(ctx, SG_ERR_OOM, "rmsnorm '%s': out of host memory", name);
    s->C = C;
    sg_status st = sg_module_create(b, name, &rmsnorm_ops, s, out);
    if (st != SG_OK) {
        free(s);
        return st;
    }
    /* From here the module owns s: the builder (or the model) frees it through rms_destroy. */
    s->w = sg_module_param(*out, "weight", 1, &C, SG_INIT_ONES, C, 0);
    if (s->w < 0) return SG_ERR_INVALID;
    int64_t rows = sg_builder_rows(b);
    st = sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){rows, C}, "rmsnorm.y", &s->y);
    if (st == SG_OK) st = sg_tensor_create(ctx, SG_DTYPE_F32, 1, &rows, "rmsnorm.rstd", &s->rstd);
    if (st == SG_OK) st = sg_tensor_create(ctx, SG_DTYPE_F32, 2, (int64_t[]){rows, C}, "rmsnorm.dx", &s->dx);
    return st;
}
