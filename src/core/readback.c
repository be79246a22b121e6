/* readback.c: asynchronous read-back of small device values (the loss) into pinned host
 * memory. start() queues the copy and an event; poll() checks the event, so logging never
 * stalls the stream or the host. */
#include "core/core.h"

#include <stdlib.h>

struct sg_readback {
    sg_ctx *ctx;
    void *host;        /* pinned on CUDA */
    size_t max_bytes;
    size_t bytes;      /* of the copy in flight */
    void *event;
    bool pending;
};

sg_status sg_readback_create(sg_ctx *ctx, size_t max_bytes, sg_readback **out)
{
    if (!ctx || !out) return SG_ERR_NULL;
    *out = NULL;
    sg_readback *rb = calloc(1, sizeof *rb);
    if (!rb) return sg_fail(ctx, SG_ERR_OOM, "sg_readback_create: out of host memory");
    rb->ctx = ctx;
    rb->max_bytes = max_bytes ? max_bytes : 8;
    sg_status st = ctx->dev->host_alloc(ctx, rb->max_bytes, &rb->host);
    if (st == SG_OK) st = ctx->dev->event_create(ctx, &rb->event);
    if (st != SG_OK) {
        sg_readback_destroy(rb);
        return st;
    }
    *out = rb;
    return SG_OK;
}

void sg_readback_destroy(sg_readback *rb)
{
    if (!rb) return;
    if (rb->event) rb->ctx->dev->event_destroy(rb->ctx, rb->event);
    if (rb->host) rb->ctx->dev->host_free(rb->ctx, rb->host);
    free(rb);
}

sg_status sg_readback_start(sg_readback *rb, const sg_tensor *t)
{
    if (!rb || !t) return SG_ERR_NULL;
    sg_ctx *ctx = rb->ctx;
    SG_TRY(sg_cond_forbid(ctx, "sg_readback_start", "started a read-back (a device-to-host copy and an event)"));
    SG_TRY(sg_capture_forbid(ctx, "sg_readback_start", "started a read-back",
                             "start the read-back after replay"));
    size_t n = sg_tensor_nbytes(t);
    if (n > rb->max_bytes)
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_readback_start: tensor '%s' is %zu bytes, the read-back holds %zu",
                       t->name, n, rb->max_bytes);
    SG_TRY(ctx->dev->copy_d2h_async(ctx, rb->host, t->data, n));
    SG_TRY(ctx->dev->event_record(ctx, rb->event));
    rb->bytes = n;
    rb->pending = true;
    return SG_OK;
}

static sg_status finish(sg_readback *rb, void *dst, size_t nbytes)
{
    if (nbytes != rb->bytes)
        return sg_fail(rb->ctx, SG_ERR_INVALID, "sg_readback: %zu bytes asked for, %zu were read",
                       nbytes, rb->bytes);
    memcpy(dst, rb->host, nbytes);
    return SG_OK;
}

sg_status sg_readback_poll(sg_readback *rb, void *dst, size_t nbytes)
{
    if (!rb || !dst) return SG_ERR_NULL;
    SG_TRY(sg_capture_forbid(rb->ctx, "sg_readback_poll", "polled a read-back", "poll after replay"));
    if (!rb->pending) return sg_fail(rb->ctx, SG_ERR_INVALID, "sg_readback_poll: nothing was started");
    sg_status st = rb->ctx->dev->event_query(rb->ctx, rb->event);
    if (st != SG_OK) return st;
    return finish(rb, dst, nbytes);
}

sg_status sg_readback_wait(sg_readback *rb, void *dst, size_t nbytes)
{
    if (!rb || !dst) return SG_ERR_NULL;
    SG_TRY(sg_capture_forbid(rb->ctx, "sg_readback_wait", "waited for a read-back", "wait after replay"));
    if (!rb->pending) return sg_fail(rb->ctx, SG_ERR_INVALID, "sg_readback_wait: nothing was started");
    SG_TRY(rb->ctx->dev->event_sync(rb->ctx, rb->event));
    return finish(rb, dst, nbytes);
}
