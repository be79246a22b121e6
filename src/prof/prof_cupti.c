/* prof_cupti.c: sg_prof over CUPTI's activity API. CUPTI hands us buffers of records (kernel,
 * memcpy, memset) through two process-global callbacks, possibly on its own thread; we copy
 * each record's kind, ids and timestamps into the one live profiler's array under a spin lock,
 * and sum the window up at sg_prof_stop. Compiled only in CUDA builds; empty without CUPTI. */
#ifdef SG_HAVE_CUPTI
#include "core/core.h"
#include "prof/prof.h"

#include <cupti.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Activity buffers handed to CUPTI: 4 MiB holds ~20k kernel records. */
#define PROF_BUFFER_BYTES ((size_t)4 << 20)

struct sg_prof {
    sg_ctx *ctx;
    bool running;             /* between start and stop; records are accepted only then */
    /* Filled by the buffer-completed callback, guarded by g_lock. */
    sg_prof_record *rec;
    size_t n, cap;
    bool rec_oom;             /* a record could not be stored (host out of memory) */
    CUptiResult parse_err;    /* cuptiActivityGetNextRecord failed on a buffer */
};

/* The live profiler (at most one: CUPTI's activity API is process-global) and the lock that
 * guards it and its record array against CUPTI's callback thread. Critical sections are short
 * (an append, a pointer swap), so a spin lock serves and needs no thread library. */
static atomic_flag g_lock = ATOMIC_FLAG_INIT;
static sg_prof *g_active;
static bool g_callbacks_registered; /* touched only by the thread that holds g_active */

static void prof_lock(void)
{
    while (atomic_flag_test_and_set_explicit(&g_lock, memory_order_acquire)) {
    }
}

static void prof_unlock(void) { atomic_flag_clear_explicit(&g_lock, memory_order_release); }

static const CUpti_ActivityKind prof_kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMSET,
};
#define PROF_NKINDS (sizeof prof_kinds / sizeof *prof_kinds)

static const char *cupti_msg(CUptiResult r)
{
    const char *s = NULL;
    if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || !s) s = "unknown CUPTI error";
    return s;
}

static sg_status cupti_status(const sg_ctx *ctx, CUptiResult r, const char *fn, const char *call,
                              const char *file, int line)
{
    /* The failures a user can act on: CUPTI is taken, or not allowed, in this process. */
    const char *hint = "";
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED || r == CUPTI_ERROR_NOT_INITIALIZED ||
        r == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES || r == CUPTI_ERROR_NOT_COMPATIBLE)
        hint = "; another CUPTI client in this process (Nsight Systems, compute-sanitizer, a "
               "framework's profiler) or a driver that forbids tracing can cause this";
    return sg_fail(ctx, SG_ERR_CUDA, "%s: %s failed: %s (CUPTI result %d) at %s:%d%s", fn, call,
                   cupti_msg(r), (int)r, file, line, hint);
}

/* ---- CUPTI's buffer callbacks (any thread) ---- */

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    /* malloc's alignment (16) covers CUPTI's 8-byte requirement. NULL makes CUPTI drop
     * records, which sg_prof_stop reports through the dropped count. */
    *buffer = malloc(PROF_BUFFER_BYTES);
    *size = *buffer ? PROF_BUFFER_BYTES : 0;
    *max_records = 0;
}

/* Appends one record; called with g_lock held. */
static void record_push(sg_prof *p, sg_prof_record r)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 4096;
        sg_prof_record *rec = realloc(p->rec, cap * sizeof *rec);
        if (!rec) {
            p->rec_oom = true;
            return;
        }
        p->rec = rec;
        p->cap = cap;
    }
    p->rec[p->n++] = r;
}

/* One CUPTI record in our form; false for kinds we do not collect. The structs are those of
 * the CUDA 13 headers (CUPTI writes the version its header declares); start, end and the ids
 * sit at the same places in every version of them. */
static bool record_from_cupti(const CUpti_Activity *a, sg_prof_record *r)
{
    switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)a;
        *r = (sg_prof_record){SG_PROF_KIND_KERNEL, k->deviceId, k->streamId, k->correlationId,
                              k->start, k->end};
        return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)a;
        *r = (sg_prof_record){SG_PROF_KIND_MEMCPY, m->deviceId, m->streamId, m->correlationId,
                              m->start, m->end};
        return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)a;
        *r = (sg_prof_record){SG_PROF_KIND_MEMSET, m->deviceId, m->streamId, m->correlationId,
                              m->start, m->end};
        return true;
    }
    default: return false;
    }
}

static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t *buffer,
                                      size_t size, size_t valid_size)
{
    (void)context;
    (void)stream_id;
    (void)size;
    prof_lock();
    sg_prof *p = g_active;
    if (p && p->running) { /* outside a window (or with no profiler) the buffer is dropped */
        CUpti_Activity *a = NULL;
        for (;;) {
            CUptiResult r = cuptiActivityGetNextRecord(buffer, valid_size, &a);
            if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break; /* end of the buffer */
            if (r != CUPTI_SUCCESS) {
                if (p->parse_err == CUPTI_SUCCESS) p->parse_err = r;
                break;
            }
            sg_prof_record rec;
            if (record_from_cupti(a, &rec)) record_push(p, rec);
        }
    }
    prof_unlock();
    free(buffer);
}

/* ---- the API ---- */

/* Disables the first n collected kinds; returns the first failure (all are tried). */
static sg_status disable_kinds(sg_ctx *ctx, const char *fn, size_t n)
{
    sg_status st = SG_OK;
    for (size_t i = 0; i < n; i++) {
        CUptiResult r = cuptiActivityDisable(prof_kinds[i]);
        if (r != CUPTI_SUCCESS && st == SG_OK)
            st = cupti_status(ctx, r, fn, "cuptiActivityDisable", __FILE__, __LINE__);
    }
    return st;
}

sg_status sg_prof_create(sg_ctx *ctx, sg_prof **out)
{
    if (out) *out = NULL;
    if (!ctx) return sg_fail(NULL, SG_ERR_NULL, "sg_prof_create: ctx is NULL");
    if (!out) return sg_fail(ctx, SG_ERR_NULL, "sg_prof_create: out is NULL");
    if (ctx->backend != SG_BACKEND_CUDA)
        return sg_fail(ctx, SG_ERR_UNSUPPORTED,
                       "sg_prof_create: the %s backend has no device activity to profile; the "
                       "profiler needs a CUDA context",
                       sg_backend_name(ctx->backend));
    sg_prof *p = calloc(1, sizeof *p);
    if (!p) return sg_fail(ctx, SG_ERR_OOM, "sg_prof_create: out of host memory");
    p->ctx = ctx;
    prof_lock();
    bool taken = g_active != NULL;
    if (!taken) g_active = p;
    prof_unlock();
    if (taken) {
        free(p);
        return sg_fail(ctx, SG_ERR_INVALID,
                       "sg_prof_create: another sg_prof exists in this process (CUPTI's activity "
                       "API is process-global); destroy it first");
    }
    if (!g_callbacks_registered) {
        CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
        if (r != CUPTI_SUCCESS) {
            sg_status st = cupti_status(ctx, r, "sg_prof_create", "cuptiActivityRegisterCallbacks",
                                        __FILE__, __LINE__);
            sg_prof_destroy(p);
            return st;
        }
        g_callbacks_registered = true;
    }
    *out = p;
    return SG_OK;
}

void sg_prof_destroy(sg_prof *p)
{
    if (!p) return;
    if (p->running) (void)sg_prof_stop(p, NULL); /* teardown: its status cannot be acted on */
    prof_lock();
    if (g_active == p) g_active = NULL;
    prof_unlock();
    free(p->rec);
    free(p);
}

sg_status sg_prof_start(sg_prof *p)
{
    if (!p) return SG_ERR_NULL;
    if (p->running)
        return sg_fail(p->ctx, SG_ERR_INVALID,
                       "sg_prof_start: the profiler is already started; call sg_prof_stop first");
    /* CUPTI's dropped count needs no reset here: sg_prof_stop reads (and so resets) it, and
     * nothing is recorded while the kinds are disabled between windows. */
    prof_lock();
    p->n = 0;
    p->rec_oom = false;
    p->parse_err = CUPTI_SUCCESS;
    p->running = true;
    prof_unlock();
    for (size_t i = 0; i < PROF_NKINDS; i++) {
        CUptiResult r = cuptiActivityEnable(prof_kinds[i]);
        if (r != CUPTI_SUCCESS) {
            sg_status st = cupti_status(p->ctx, r, "sg_prof_start", "cuptiActivityEnable",
                                        __FILE__, __LINE__);
            char msg[sizeof p->ctx->msg]; /* the first error is the one told */
            memcpy(msg, p->ctx->msg, sizeof msg);
            (void)disable_kinds(p->ctx, "sg_prof_start", i);
            sg_fail(p->ctx, st, "%s", msg);
            prof_lock();
            p->running = false;
            prof_unlock();
            return st;
        }
    }
    return SG_OK;
}

sg_status sg_prof_stop(sg_prof *p, sg_prof_result *out)
{
    if (out) memset(out, 0, sizeof *out);
    if (!p) return SG_ERR_NULL;
    if (!p->running)
        return sg_fail(p->ctx, SG_ERR_INVALID,
                       "sg_prof_stop: the profiler is not started; call sg_prof_start first");
    /* Every queued activity must finish before its record is complete; then no new records,
     * then CUPTI hands over what it holds (the forced flush includes part-filled buffers). */
    sg_status st = sg_ctx_sync(p->ctx);
    sg_status st2 = disable_kinds(p->ctx, "sg_prof_stop", PROF_NKINDS);
    if (st == SG_OK) st = st2;
    CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (r != CUPTI_SUCCESS && st == SG_OK)
        st = cupti_status(p->ctx, r, "sg_prof_stop", "cuptiActivityFlushAll", __FILE__, __LINE__);
    size_t dropped = 0;
    r = cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped);
    if (r != CUPTI_SUCCESS && st == SG_OK)
        st = cupti_status(p->ctx, r, "sg_prof_stop", "cuptiActivityGetNumDroppedRecords", __FILE__,
                          __LINE__);
    prof_lock();
    p->running = false;
    bool oom = p->rec_oom;
    CUptiResult parse_err = p->parse_err;
    prof_unlock();
    if (st != SG_OK) return st;
    if (parse_err != CUPTI_SUCCESS)
        return cupti_status(p->ctx, parse_err, "sg_prof_stop", "cuptiActivityGetNextRecord",
                            __FILE__, __LINE__);
    if (oom)
        return sg_fail(p->ctx, SG_ERR_OOM,
                       "sg_prof_stop: out of host memory storing activity records (%zu kept)", p->n);
    if (out) {
        sg_prof_summarize(p->rec, p->n, out);
        out->dropped = (uint64_t)dropped;
        if (isnan(out->busy_us)) /* the union's copy could not be allocated */
            return sg_fail(p->ctx, SG_ERR_OOM, "sg_prof_stop: out of host memory summing %zu "
                                               "records", p->n);
    }
    return SG_OK;
}

const sg_prof_record *sg_prof_records(const sg_prof *p, size_t *n)
{
    if (n) *n = p ? p->n : 0;
    return p ? p->rec : NULL;
}

#else
/* A CUDA build without CUPTI: prof.c holds the fallbacks. (Keeps the unit non-empty.) */
typedef int sg_prof_cupti_unused;
#endif /* SG_HAVE_CUPTI */
