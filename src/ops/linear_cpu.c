/* linear_cpu.c: the reference linear layer, forward and backward, computed in double for f32,
 * f64 and bf16 tensors (read exactly; each result rounded once to the storage type). It is the
 * oracle the cuBLASLt path is tested against, and it trains real MLPs in CI, so the loops run
 * over rows with contiguous inner loops (axpy form, which compilers vectorize) on double
 * copies of the operands. Sums run in a fixed order. */
#include "ops/act.h"
#include "ops/linear.h"

#include <math.h>
#include <stdlib.h>


static double gelu(double v)
{
    double u = SG_GELU_K0 * (v + SG_GELU_K1 * v * v * v);
    return 0.5 * v * (1 + tanh(u));
}

/* d gelu / dv, as sg_gelu_backward_cpu. */
static double gelu_grad(double v)
{
    double u = SG_GELU_K0 * (v + SG_GELU_K1 * v * v * v);
    double t = tanh(u);
    double du = SG_GELU_K0 * (1 + 3 * SG_GELU_K1 * v * v);
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * du;
}

static sg_status oom(sg_ctx *ctx, const char *fn)
{
    return sg_fail(ctx, SG_ERR_OOM, "%s: out of host memory for the CPU reference's buffers", fn);
}

/* y(M,N) = act(x(M,K) @ w(N,K)^T + b(N)) (+ res(M,N)): per row m, acc(N) = b + sum_k x[m,k] *
 * wT[k,:], with w transposed once to wT(K,N) so the inner loop runs along n; the residual is
 * added in f64 before the one rounding to y's dtype. */
sg_status sg_linear_forward_cpu(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                                const sg_tensor *b, sg_activation act, const sg_tensor *res, sg_tensor *y,
                                sg_tensor *pre, int64_t m, int64_t n, int64_t k)
{
    double *xo = NULL, *bo = NULL, *ro = NULL;
    const double *xd = sg_cpu_as_f64(x, &xo);
    const double *bd = b ? sg_cpu_as_f64(b, &bo) : NULL;
    /* res may be y: an f64 res is read a row at a time, each row before y's row is stored */
    const double *rd = res ? sg_cpu_as_f64(res, &ro) : NULL;
    double *wt = malloc((size_t)(n * k) * sizeof *wt);
    double *acc = malloc((size_t)n * sizeof *acc);
    sg_status st = SG_OK;
    if (!xd || (b && !bd) || (res && !rd) || !wt || !acc) {
        st = oom(ctx, "sg_linear_forward");
        goto done;
    }
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < k; i++) wt[i * n + j] = sg_ld(w, j * k + i);

    for (int64_t r = 0; r < m; r++) {
        for (int64_t j = 0; j < n; j++) acc[j] = bd ? bd[j] : 0.0;
        const double *xr = xd + r * k;
        for (int64_t i = 0; i < k; i++) {
            const double a = xr[i], *restrict wr = wt + i * n;
            double *restrict ar = acc;
            for (int64_t j = 0; j < n; j++) ar[j] += a * wr[j];
        }
        if (act == SG_ACT_GELU) {
            sg_cpu_store(pre, r * n, acc, n);
            for (int64_t j = 0; j < n; j++) acc[j] = gelu(acc[j]);
        } else if (act == SG_ACT_RELU) {
            for (int64_t j = 0; j < n; j++) acc[j] = acc[j] > 0 ? acc[j] : 0.0;
        }
        if (rd)
            for (int64_t j = 0; j < n; j++) acc[j] += rd[r * n + j];
        sg_cpu_store(y, r * n, acc, n);
    }
done:
    free(xo);
    free(bo);
    free(ro);
    free(wt);
    free(acc);
    return st;
}

/* d(pre)(M,N) = dy * act'(act_in) (written back into dy when act is not NONE);
 * db(N) = sum_m dpre[m,:]; dw(N,K) = dpre^T @ x; dx(M,K) = dpre @ w. */
sg_status sg_linear_backward_cpu(sg_ctx *ctx, const sg_tensor *x, const sg_tensor *w,
                                 sg_tensor *dy, sg_activation act, const sg_tensor *act_in,
                                 sg_tensor *dx, sg_tensor *dw, sg_tensor *db,
                                 const sg_linear_through *th, int64_t m, int64_t n, int64_t k)
{
    double *xo = NULL, *wo = NULL, *go = NULL, *ao = NULL, *po = NULL;
    const bool through = th && th->x_act != SG_ACT_NONE;
    const double *pd = through ? sg_cpu_as_f64(th->x_pre, &po) : NULL;
    const double *xd = sg_cpu_as_f64(x, &xo);
    const double *wd = sg_cpu_as_f64(w, &wo);
    const double *gd = sg_cpu_as_f64(dy, &go);
    const double *ad = act_in ? sg_cpu_as_f64(act_in, &ao) : NULL;
    double *dpre = malloc((size_t)(m * n) * sizeof *dpre);
    int64_t accn = n > k ? n : k;
    double *acc = malloc((size_t)accn * sizeof *acc);
    sg_status st = SG_OK;
    if (!xd || !wd || !gd || (act_in && !ad) || (through && !pd) || !dpre || !acc) {
        st = oom(ctx, "sg_linear_backward");
        goto done;
    }

    for (int64_t i = 0; i < m * n; i++) {
        double g = gd[i];
        if (act == SG_ACT_RELU) g = ad[i] > 0 ? g : 0.0;
        if (act == SG_ACT_GELU) g *= gelu_grad(ad[i]);
        dpre[i] = g;
    }
    if (act != SG_ACT_NONE) sg_cpu_store(dy, 0, dpre, m * n);
    /* bf16: the sums below use d(pre) as stored in dy (rounded to bf16), as the CUDA path,
     * whose matmuls read dy, does. (f32's rounding, 2^-24, is left out, as it always was.) */
    if (act != SG_ACT_NONE && dy->dtype == SG_DTYPE_BF16)
        for (int64_t i = 0; i < m * n; i++) dpre[i] = sg_ld(dy, i);

    if (db) {
        for (int64_t j = 0; j < n; j++) acc[j] = 0.0;
        for (int64_t r = 0; r < m; r++) {
            const double *restrict pr = dpre + r * n;
            double *restrict ar = acc;
            for (int64_t j = 0; j < n; j++) ar[j] += pr[j];
        }
        sg_cpu_store(db, 0, acc, n);
    }

    /* dw[j,:] = sum_r dpre[r,j] * x[r,:] */
    for (int64_t j = 0; j < n; j++) {
        for (int64_t i = 0; i < k; i++) acc[i] = 0.0;
        for (int64_t r = 0; r < m; r++) {
            const double a = dpre[r * n + j], *restrict xr = xd + r * k;
            double *restrict ar = acc;
            for (int64_t i = 0; i < k; i++) ar[i] += a * xr[i];
        }
        sg_cpu_store(dw, j * k, acc, k);
    }

    /* dx[r,:] = sum_j dpre[r,j] * w[j,:]; through an activation, times x_act'(x_pre[r,:]). */
    if (dx) {
        for (int64_t r = 0; r < m; r++) {
            for (int64_t i = 0; i < k; i++) acc[i] = 0.0;
            for (int64_t j = 0; j < n; j++) {
                const double a = dpre[r * n + j], *restrict wr = wd + j * k;
                double *restrict ar = acc;
                for (int64_t i = 0; i < k; i++) ar[i] += a * wr[i];
            }
            if (th && th->x_act == SG_ACT_RELU)
                for (int64_t i = 0; i < k; i++) acc[i] = pd[r * k + i] > 0 ? acc[i] : 0.0;
            if (th && th->x_act == SG_ACT_GELU)
                for (int64_t i = 0; i < k; i++) acc[i] *= gelu_grad(pd[r * k + i]);
            sg_cpu_store(dx, r * k, acc, k);
        }
        if (through && th->x_db) { /* the column sums of dx as stored */
            double *col = calloc((size_t)k, sizeof *col);
            if (!col) {
                st = oom(ctx, "sg_linear_backward_through");
                goto done;
            }
            for (int64_t r = 0; r < m; r++)
                for (int64_t i = 0; i < k; i++) col[i] += sg_ld(dx, r * k + i);
            sg_cpu_store(th->x_db, 0, col, k);
            free(col);
        }
    }
done:
    free(xo);
    free(wo);
    free(go);
    free(ao);
    free(po);
    free(dpre);
    free(acc);
    return st;
}
