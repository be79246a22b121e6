/* status.c: status names and the per-context error message.
 * Every failing public call records one message saying which call, which object, and what
 * was expected; sg_ctx_last_error reads it back. */
#include "core/core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Errors of sg_ctx_create, which has no context to hold them. */
static _Thread_local char create_msg[1024];

const char *sg_status_name(sg_status s)
{
    switch (s) {
    case SG_OK: return "SG_OK";
    case SG_ERR_INVALID: return "SG_ERR_INVALID";
    case SG_ERR_NULL: return "SG_ERR_NULL";
    case SG_ERR_SHAPE: return "SG_ERR_SHAPE";
    case SG_ERR_DTYPE: return "SG_ERR_DTYPE";
    case SG_ERR_BACKEND: return "SG_ERR_BACKEND";
    case SG_ERR_OOM: return "SG_ERR_OOM";
    case SG_ERR_NO_DEVICE: return "SG_ERR_NO_DEVICE";
    case SG_ERR_CUDA: return "SG_ERR_CUDA";
    case SG_ERR_CUBLAS: return "SG_ERR_CUBLAS";
    case SG_ERR_NOT_READY: return "SG_ERR_NOT_READY";
    case SG_ERR_CAPTURE: return "SG_ERR_CAPTURE";
    case SG_ERR_IO: return "SG_ERR_IO";
    case SG_ERR_UNSUPPORTED: return "SG_ERR_UNSUPPORTED";
    case SG_ERR_DIST: return "SG_ERR_DIST";
    }
    return "SG_ERR_?";
}

sg_status sg_vfail(const sg_ctx *ctx, sg_status st, const char *fmt, va_list ap)
{
    /* The message buffer is mutable state of an otherwise const context, as errno is. */
    char *buf = ctx ? ((sg_ctx *)ctx)->msg : create_msg;
    size_t n = ctx ? sizeof ctx->msg : sizeof create_msg;
    vsnprintf(buf, n, fmt, ap);
    return st;
}

sg_status sg_fail(const sg_ctx *ctx, sg_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sg_vfail(ctx, st, fmt, ap);
    va_end(ap);
    return st;
}

sg_status sg_ctx_fail(sg_ctx *ctx, sg_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sg_vfail(ctx, st, fmt, ap);
    va_end(ap);
    return st;
}

const char *sg_ctx_last_error(const sg_ctx *ctx) { return ctx ? ctx->msg : create_msg; }

void sg_assert_fail(const char *cond, const char *file, int line)
{
    fprintf(stderr, "stepgraph: internal error: %s failed at %s:%d\n", cond, file, line);
    abort();
}

double sg_clock_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double sg_median(double *v, int n)
{
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
