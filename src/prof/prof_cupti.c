/* prof_cupti.c: sg_prof over CUPTI's activity API. CUPTI hands us buffers of records (kernels,
 * memcpys, memsets, runtime and driver API calls) through two process-global callbacks,
 * possibly on its own thread; we copy each record's kind, ids, timestamps and name (interned
 * into profiler-owned strings) into the one live profiler's array under a spin lock. Named
 * ranges come from the context's range hook, timed on CUPTI's clock. sg_prof_stop marks calls
 * made inside other calls (so that a launch counts once) and sums the window up.
 * Compiled only in CUDA builds; empty without CUPTI. */
#ifdef SG_HAVE_CUPTI
#include "core/core.h"
#include "prof/prof.h"

#include <cupti.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Activity buffers handed to CUPTI: 4 MiB holds ~20k kernel records. */
#define PROF_BUFFER_BYTES ((size_t)4 << 20)
/* Named ranges nested deeper than this are not recorded (their depth is still tracked). */
#define PROF_RANGE_DEPTH 64

/* Distinct strings (kernel, API and range names), copied once and owned by the profiler:
 * open addressing over a power-of-two table. */
typedef struct name_table {
    char **slot;
    size_t n, cap;
} name_table;

/* A runtime or driver callback id's name and class, looked up once. */
typedef struct api_info {
    const char *name;
    sg_prof_api api;
    bool known;
} api_info;

struct sg_prof {
    sg_ctx *ctx;
    bool running;             /* between start and stop; records are accepted only then */
    /* Filled by the buffer-completed callback and the range hook, guarded by g_lock. */
    sg_prof_record *rec;
    size_t n, cap;
    bool rec_oom;             /* a record or a name could not be stored (host out of memory) */
    CUptiResult parse_err;    /* cuptiActivityGetNextRecord failed on a buffer */
    name_table names;         /* kept for the profiler's life: names stay valid across windows */
    api_info runtime_api[CUPTI_RUNTIME_TRACE_CBID_SIZE];
    api_info driver_api[CUPTI_DRIVER_TRACE_CBID_SIZE];
    /* The range hook's state (the thread that drives the context only). */
    void (*prev_hook)(void *user, const char *name, bool push);
    void *prev_user;
    int range_depth;
    struct {
        const char *name;
        uint64_t start;
    } range_stack[PROF_RANGE_DEPTH];
    CUptiResult hook_err;     /* cuptiGetTimestamp failed in the range hook */
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
    CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_DRIVER,
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

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static bool name_table_grow(name_table *t)
{
    size_t cap = t->cap ? 2 * t->cap : 256;
    char **slot = calloc(cap, sizeof *slot);
    if (!slot) return false;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->slot[i]) continue;
        size_t j = name_hash(t->slot[i]) & (cap - 1);
        while (slot[j]) j = (j + 1) & (cap - 1);
        slot[j] = t->slot[i];
    }
    free(t->slot);
    t->slot = slot;
    t->cap = cap;
    return true;
}

/* The profiler's copy of s, made on first sight; NULL when out of host memory. Called with
 * g_lock held (CUPTI's thread and the range hook share the table). */
static const char *name_intern(name_table *t, const char *s)
{
    if (2 * (t->n + 1) > t->cap && !name_table_grow(t)) return NULL;
    size_t i = name_hash(s) & (t->cap - 1);
    for (; t->slot[i]; i = (i + 1) & (t->cap - 1))
        if (!strcmp(t->slot[i], s)) return t->slot[i];
    size_t len = strlen(s) + 1;
    char *copy = malloc(len);
    if (!copy) return NULL;
    memcpy(copy, s, len);
    t->slot[i] = copy;
    t->n++;
    return copy;
}

static void name_table_free(name_table *t)
{
    for (size_t i = 0; i < t->cap; i++) free(t->slot[i]);
    free(t->slot);
    *t = (name_table){0};
}

/* A string the profiler owns (NULL stays NULL); on failure NULL, noted as out of memory. */
static const char *own_name(sg_prof *p, const char *s)
{
    if (!s) return NULL;
    const char *copy = name_intern(&p->names, s);
    if (!copy) p->rec_oom = true;
    return copy;
}

/* The name and class of a runtime or driver call, cached per callback id. A call CUPTI
 * cannot name keeps a generic name and class OTHER: names only label and classify, so a
 * window is not failed for one. Called with g_lock held. */
static api_info api_lookup(sg_prof *p, bool driver, uint32_t cbid)
{
    api_info *cache = driver ? p->driver_api : p->runtime_api;
    uint32_t size = driver ? CUPTI_DRIVER_TRACE_CBID_SIZE : CUPTI_RUNTIME_TRACE_CBID_SIZE;
    if (cbid < size && cache[cbid].known) return cache[cbid];
    api_info info = {driver ? "CUDA driver call" : "CUDA runtime call", SG_PROF_API_OTHER, true};
    const char *name = NULL;
    CUptiResult r = cuptiGetCallbackName(
        driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name);
    if (r == CUPTI_SUCCESS && name) {
        const char *copy = own_name(p, name);
        if (copy) info.name = copy, info.api = sg_prof_api_classify(copy);
    }
    if (cbid < size) cache[cbid] = info; /* a newer CUPTI's ids past our header's: not cached */
    return info;
}

static const char *memcpy_name(uint8_t kind)
{
    switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy";
    }
}

/* One CUPTI record in our form; false for kinds we do not collect. The structs are those of
 * the CUDA 13 headers (CUPTI writes the version its header declares; later versions only append
 * fields). Kernel names are the mangled names CUPTI gives (copied: CUPTI owns its string),
 * shortened for display by the trace writer only. Called with g_lock held. */
static bool record_from_cupti(sg_prof *p, const CUpti_Activity *a, sg_prof_record *r)
{
    switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)a;
        *r = (sg_prof_record){.kind = SG_PROF_KIND_KERNEL, .device_id = k->deviceId,
                              .stream_id = k->streamId, .correlation_id = k->correlationId,
                              .start_ns = k->start, .end_ns = k->end, .graph_id = k->graphId,
                              .name = own_name(p, k->name)};
        return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)a;
        *r = (sg_prof_record){.kind = SG_PROF_KIND_MEMCPY, .device_id = m->deviceId,
                              .stream_id = m->streamId, .correlation_id = m->correlationId,
                              .start_ns = m->start, .end_ns = m->end, .graph_id = m->graphId,
                              .name = memcpy_name(m->copyKind)};
        return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)a;
        *r = (sg_prof_record){.kind = SG_PROF_KIND_MEMSET, .device_id = m->deviceId,
                              .stream_id = m->streamId, .correlation_id = m->correlationId,
                              .start_ns = m->start, .end_ns = m->end, .graph_id = m->graphId,
                              .name = "memset"};
        return true;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
        const CUpti_ActivityAPI *c = (const CUpti_ActivityAPI *)a;
        api_info info = api_lookup(p, a->kind == CUPTI_ACTIVITY_KIND_DRIVER, c->cbid);
        *r = (sg_prof_record){.kind = SG_PROF_KIND_API, .correlation_id = c->correlationId,
                              .start_ns = c->start, .end_ns = c->end, .thread_id = c->threadId,
                              .api = info.api, .name = info.name};
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
            if (record_from_cupti(p, a, &rec)) record_push(p, rec);
        }
    }
    prof_unlock();
    free(buffer);
}

/* ---- named ranges: the context's range hook while a window records ---- */

/* Pushes and pops of sg_range_push/pop, timed on CUPTI's clock (that of the activity records)
 * and stored as range records when they close. Ranges opened before the window began are not
 * recorded, nor those still open when it ends. Chains to the hook it replaced. */
static void range_hook(void *user, const char *name, bool push)
{
    sg_prof *p = user;
    if (p->prev_hook) p->prev_hook(p->prev_user, name, push);
    uint64_t t = 0;
    CUptiResult r = cuptiGetTimestamp(&t);
    if (r != CUPTI_SUCCESS && p->hook_err == CUPTI_SUCCESS) p->hook_err = r;
    if (push) {
        int d = p->range_depth++;
        if (d >= PROF_RANGE_DEPTH) return;
        prof_lock();
        p->range_stack[d].name = own_name(p, name ? name : "(unnamed)");
        prof_unlock();
        p->range_stack[d].start = t;
        return;
    }
    if (p->range_depth == 0) return; /* the pop of a range pushed before sg_prof_start */
    int d = --p->range_depth;
    if (d >= PROF_RANGE_DEPTH || r != CUPTI_SUCCESS) return;
    sg_prof_record rec = {.kind = SG_PROF_KIND_RANGE, .start_ns = p->range_stack[d].start,
                          .end_ns = t, .thread_id = (uint32_t)syscall(SYS_gettid), .depth = d,
                          .name = p->range_stack[d].name};
    prof_lock();
    if (p->running) record_push(p, rec);
    prof_unlock();
}

/* ---- op families: the context's work hook while a window records ---- */

/* Each op's call, as it happens: a range record of no length named sg_prof_family_marker(f),
 * at the depth of the ranges open around it, which sg_prof_family_us reads back. */
static void work_hook(void *user, int family)
{
    sg_prof *p = user;
    uint64_t t = 0;
    CUptiResult r = cuptiGetTimestamp(&t);
    if (r != CUPTI_SUCCESS) {
        if (p->hook_err == CUPTI_SUCCESS) p->hook_err = r;
        return;
    }
    sg_prof_record rec = {.kind = SG_PROF_KIND_RANGE, .start_ns = t, .end_ns = t,
                          .thread_id = (uint32_t)syscall(SYS_gettid), .depth = p->range_depth,
                          .name = sg_prof_family_marker((sg_work_family)family)};
    prof_lock();
    if (p->running) record_push(p, rec);
    prof_unlock();
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
    /* API records then carry the kernel's thread id (gettid), which the range hook records too,
     * so that a thread's calls and ranges share one track. */
    CUptiResult r = cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);
    if (r != CUPTI_SUCCESS) {
        sg_status st = cupti_status(ctx, r, "sg_prof_create", "cuptiSetThreadIdType", __FILE__,
                                    __LINE__);
        sg_prof_destroy(p);
        return st;
    }
    *out = p;
    return SG_OK;
}

void sg_prof_destroy(sg_prof *p)
{
    if (!p) return;
    if (p->running) (void)sg_prof_stop(p, NULL); /* teardown: its status cannot be acted on */
    prof_lock();
    const bool was_active = g_active == p;
    prof_unlock();
    /* Detach CUPTI from the process: attached, it stays subscribed to every runtime and driver
     * call after its activity kinds are disabled, and slowed later eager launches 2-3x on an
     * H100 (cuDNN's calls most: the advisor's eager steps after its calibration). The next
     * sg_prof_create attaches it again, callbacks registered anew. */
    if (was_active && cuptiFinalize() == CUPTI_SUCCESS) g_callbacks_registered = false;
    prof_lock();
    if (g_active == p) g_active = NULL;
    prof_unlock();
    free(p->rec);
    name_table_free(&p->names);
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
    p->range_depth = 0;
    p->hook_err = CUPTI_SUCCESS;
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
    p->prev_hook = p->ctx->range_hook;
    p->prev_user = p->ctx->range_user;
    p->ctx->range_hook = range_hook;
    p->ctx->range_user = p;
    p->ctx->work_hook = work_hook;
    p->ctx->work_user = p;
    return SG_OK;
}

sg_status sg_prof_stop(sg_prof *p, sg_prof_result *out)
{
    if (out) memset(out, 0, sizeof *out);
    if (!p) return SG_ERR_NULL;
    if (!p->running)
        return sg_fail(p->ctx, SG_ERR_INVALID,
                       "sg_prof_stop: the profiler is not started; call sg_prof_start first");
    p->ctx->range_hook = p->prev_hook; /* no more ranges: the window ends here */
    p->ctx->range_user = p->prev_user;
    p->ctx->work_hook = NULL, p->ctx->work_user = NULL;
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
    if (p->hook_err != CUPTI_SUCCESS)
        return cupti_status(p->ctx, p->hook_err, "sg_prof_stop (a named range)",
                            "cuptiGetTimestamp", __FILE__, __LINE__);
    if (oom)
        return sg_fail(p->ctx, SG_ERR_OOM,
                       "sg_prof_stop: out of host memory storing activity records (%zu kept)", p->n);
    if (sg_prof_mark_nested(p->rec, p->n) != SG_OK)
        return sg_fail(p->ctx, SG_ERR_OOM, "sg_prof_stop: out of host memory sorting %zu records",
                       p->n);
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
