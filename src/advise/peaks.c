/* peaks.c: sg_device_peaks_measure (stepgraph.h, "speed of light"): this device's matmul rate
 * and copy bandwidth, timed through the library's own calls (sg_linear_forward, sg_tensor_copy)
 * on a context of its own, so that the caller's pools and statistics stay as they were. The
 * floor arithmetic over them is prof/predict.c's sg_sol_floor. */
#include "advise/advise.h"

#include <math.h>
#include <stdlib.h>

#define PEAK_REPS 5
#define PEAK_COPY_BYTES ((int64_t)1 << 30)

/* Fills t with values in [-1, 1) from a fixed sequence (never zeros: a product of zeros runs
 * faster than real data does). */
static sg_status fill(sg_tensor *t)
{
    float *v = malloc((size_t)t->numel * sizeof *v);
    if (!v) return sg_fail(t->ctx, SG_ERR_OOM, "sg_device_peaks_measure: out of host memory");
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < t->numel; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        v[i] = (float)((double)(x >> 11) * 0x1p-52 - 1.0);
    }
    sg_tensor *f = NULL;
    sg_status st = sg_tensor_create(t->ctx, SG_DTYPE_F32, t->ndim, t->shape, "peaks.fill", &f);
    if (st == SG_OK) st = sg_tensor_copy_from_host(f, v, (size_t)t->numel * sizeof *v);
    if (st == SG_OK) st = sg_tensor_convert(t, f);
    sg_tensor_destroy(f);
    free(v);
    return st;
}

typedef sg_status (*peak_fn)(void *u);

static sg_status run_matmul(void *u)
{
    sg_tensor **t = u;
    return sg_linear_forward(t[0]->ctx, t[0], t[1], NULL, SG_ACT_NONE, t[2], NULL);
}

static sg_status run_copy(void *u)
{
    sg_tensor **t = u;
    return sg_tensor_copy(t[1], t[0]);
}

/* The median wall time of PEAK_REPS runs of fn, each synced, after two untimed ones; us. */
static sg_status time_median(sg_ctx *ctx, peak_fn fn, void *u, double *us)
{
    double v[PEAK_REPS];
    for (int i = -2; i < PEAK_REPS; i++) {
        SG_TRY(sg_ctx_sync(ctx));
        double t0 = sg_clock_us();
        SG_TRY(fn(u));
        SG_TRY(sg_ctx_sync(ctx));
        if (i >= 0) v[i] = sg_clock_us() - t0;
    }
    *us = sg_median(v, PEAK_REPS);
    return SG_OK;
}

static sg_status measure(sg_ctx *c, sg_dtype dt, sg_device_peaks *out)
{
    const int64_t n = dt == SG_DTYPE_BF16 ? 8192 : 4096, sq[2] = {n, n};
    sg_tensor *mm[3] = {NULL, NULL, NULL}, *cp[2] = {NULL, NULL};
    sg_status st = SG_OK;
    for (int i = 0; i < 3 && st == SG_OK; i++) st = sg_tensor_create(c, dt, 2, sq, "peaks.matmul", &mm[i]);
    if (st == SG_OK) st = fill(mm[0]);
    if (st == SG_OK) st = fill(mm[1]);
    double us = 0;
    if (st == SG_OK) st = time_median(c, run_matmul, mm, &us);
    if (st == SG_OK) out->matmul_tflops = 2.0 * (double)n * (double)n * (double)n / (us * 1e6);
    for (int i = 0; i < 3; i++) sg_tensor_destroy(mm[i]);
    const int64_t elems = PEAK_COPY_BYTES / 4;
    for (int i = 0; i < 2 && st == SG_OK; i++) st = sg_tensor_create(c, SG_DTYPE_F32, 1, &elems, "peaks.copy", &cp[i]);
    if (st == SG_OK) st = sg_tensor_fill(cp[0], 0.5);
    if (st == SG_OK) st = time_median(c, run_copy, cp, &us);
    if (st == SG_OK) out->copy_gbps = 2.0 * (double)PEAK_COPY_BYTES / (us * 1e3);
    for (int i = 0; i < 2; i++) sg_tensor_destroy(cp[i]);
    return st;
}

sg_status sg_device_peaks_measure(sg_ctx *ctx, sg_dtype dtype, sg_device_peaks *out)
{
    const char *fn = "sg_device_peaks_measure";
    if (!ctx) return SG_ERR_NULL;
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "%s: out is NULL", fn);
    memset(out, 0, sizeof *out);
    out->dtype = dtype;
    if (dtype != SG_DTYPE_F32 && dtype != SG_DTYPE_BF16)
        return sg_fail(ctx, SG_ERR_INVALID, "%s: dtype %s: expected f32 or bf16", fn, sg_dtype_name(dtype));
    if (sg_ctx_backend(ctx) != SG_BACKEND_CUDA)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "%s: the %s backend has no device peaks to measure (the floor "
                       "is a GPU's)", fn, sg_backend_name(sg_ctx_backend(ctx)));
    if (sg_ctx_capturing(ctx))
        return sg_fail(ctx, SG_ERR_CAPTURE, "%s: called during a capture", fn);
    snprintf(out->device, sizeof out->device, "%s", sg_ctx_device_name(ctx));
    sg_ctx_options o = sg_ctx_options_default();
    o.backend = SG_BACKEND_CUDA, o.device = ctx->opts.device;
    o.tf32 = sg_ctx_tf32(ctx);           /* its f32 matmuls as ctx's */
    o.gemm_tune = sg_ctx_gemm_tune(ctx); /* and its algorithms chosen as ctx's (in the untimed runs) */
    sg_ctx *c = NULL;
    if (sg_ctx_create(&o, &c) != SG_OK)
        return sg_fail(ctx, SG_ERR_CUDA, "%s: a context of its own: %s", fn, sg_ctx_last_error(NULL));
    sg_status st = measure(c, dtype, out);
    if (st != SG_OK) st = sg_fail(ctx, st, "%s: %s", fn, sg_ctx_last_error(c));
    sg_ctx_destroy(c);
    return st;
}
