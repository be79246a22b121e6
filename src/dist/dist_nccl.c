/* dist_nccl.c: the NCCL transport (CUDA builds with NCCL). One non-blocking communicator per
 * process (a rank per GPU), created with a bounded wait; collectives go on a second,
 * high-priority stream that forks from the context's stream with an event and joins it with
 * another, which stream capture records as graph edges, so a captured step holds its
 * all-reduces. A watchdog thread polls NCCL's asynchronous error and an event recorded after
 * each step: when NCCL reports an error, or queued steps make no progress for the timeout (a
 * peer died in a way NCCL cannot see), it aborts the communicator (NCCL's kernels then return)
 * and records why, so no rank hangs; every later call fails with that reason. A mutex keeps
 * the abort from freeing the communicator under a call that is using it. */
#define _GNU_SOURCE

#include "dist/dist.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <string.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Symmetric windows and the communicator's CTA policy (the copy-engine gathers): NCCL 2.27. */
#define SG_NCCL_WINDOWS (NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0))

#define RING 16                /* steps in flight the watchdog follows */

typedef struct nccl_state {
    ncclComm_t comm;
    int device;
    cudaStream_t stream;       /* collectives */
    cudaEvent_t fork_ev, join_ev;
    cudaEvent_t *marks;        /* nccl_marks: joins at points of the stream */
    int n_marks;
    cudaEvent_t ring[RING];    /* one per step in flight, recorded after it */
    double ring_t[RING];
    int head, count;
    double last_progress;      /* when a step was last seen to finish */
    void *gather;              /* device buffer for the host all-gather: world * SG_DIST_GATHER_BYTES */
    void *pinned;              /* its pinned host staging (a pageable copy could block the host
                                * behind a hung collective) */
    pthread_mutex_t mu;        /* the communicator: calls and the abort */
    pthread_t watchdog;
    bool watching;
    volatile int stop;
    bool aborted;
    bool group_open;           /* between nccl_group(true) and (false): this thread holds mu */
} nccl_state;

static nccl_state *state(sg_dist *d) { return d->impl; }
static cudaStream_t main_stream(sg_dist *d) { return (cudaStream_t)sg_ctx_stream(d->ctx); }

sg_status sg_dist_nccl_id(sg_dist_id *out)
{
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
        return sg_fail(NULL, SG_ERR_DIST, "sg_dist_id_create: ncclGetUniqueId failed: %s (%s)", ncclGetErrorString(r),
                       ncclGetLastError(NULL));
    memcpy(out->bytes, id.internal, SG_DIST_ID_BYTES);
    return SG_OK;
}

/* Under mu: aborts the communicator (once) and records why. */
static void abort_locked(sg_dist *d, const char *why)
{
    nccl_state *s = state(d);
    sg_dist_set_failed(d, "%s; the NCCL communicator was aborted", why);
    if (s->group_open) { /* a collective of an open group failed: close it before the abort */
        if (ncclGroupEnd() != ncclSuccess) { /* the abort follows either way */ }
        s->group_open = false;
    }
    if (s->comm && !s->aborted) {
        ncclResult_t r = ncclCommAbort(s->comm);
        if (r != ncclSuccess) { /* it is being torn down either way */ }
        s->aborted = true;
    }
}

/* Under mu: waits, at most the timeout, until a non-blocking NCCL call has finished. */
static sg_status settle(sg_dist *d, ncclResult_t r, const char *call)
{
    nccl_state *s = state(d);
    double deadline = sg_dist_now() + d->timeout_s;
    char why[512];
    while (r == ncclInProgress) {
        if (sg_dist_now() > deadline) {
            snprintf(why, sizeof why, "%s did not complete within %.0f s: a rank is missing, stuck or cannot be "
                     "reached", call, d->timeout_s);
            abort_locked(d, why);
            return SG_ERR_DIST;
        }
        sched_yield();
        ncclResult_t q = ncclCommGetAsyncError(s->comm, &r);
        if (q != ncclSuccess) r = q;
    }
    if (r == ncclSuccess) return SG_OK;
    snprintf(why, sizeof why, "%s failed: %s (%s)", call, ncclGetErrorString(r), ncclGetLastError(s->comm));
    abort_locked(d, why);
    return SG_ERR_DIST;
}

/* ---- the watchdog ---- */

/* Under mu: retires the queued steps that have finished, oldest first; false (after aborting)
 * when one failed on the GPU. Both the watchdog and a step that finds the ring full call it, so
 * a full ring frees as soon as its oldest step is done, not at the watchdog's next tick (20 ms:
 * 16 steps in flight then allowed 1.25 ms a step at most, which capped gpt-256-4-8-128 on 2
 * GPUs at 1.22 ms). */
static bool retire_locked(sg_dist *d)
{
    nccl_state *s = state(d);
    double now = sg_dist_now();
    while (s->count > 0) {
        int tail = (s->head - s->count + RING) % RING;
        cudaError_t ce = cudaEventQuery(s->ring[tail]);
        if (ce == cudaErrorNotReady) return true;
        if (ce != cudaSuccess) {
            char why[256];
            snprintf(why, sizeof why, "a step failed on the GPU: %s", cudaGetErrorString(ce));
            abort_locked(d, why);
            return false;
        }
        s->count--;
        s->last_progress = now;
    }
    return true;
}

static void watch_once(sg_dist *d)
{
    nccl_state *s = state(d);
    char why[512];
    ncclResult_t e = ncclSuccess, q = ncclCommGetAsyncError(s->comm, &e);
    if (q != ncclSuccess) e = q;
    if (e != ncclSuccess && e != ncclInProgress) {
        snprintf(why, sizeof why, "NCCL reported %s (%s): a peer rank failed or its connection broke",
                 ncclGetErrorString(e), ncclGetLastError(s->comm));
        abort_locked(d, why);
        return;
    }
    if (!retire_locked(d)) return;
    double now = sg_dist_now();
    if (s->count == 0) return;
    int tail = (s->head - s->count + RING) % RING;
    double since = s->ring_t[tail] > s->last_progress ? s->ring_t[tail] : s->last_progress;
    if (now - since > d->timeout_s) {
        snprintf(why, sizeof why, "queued steps made no progress for %.0f s: a peer rank died or is stuck in "
                 "another collective", d->timeout_s);
        abort_locked(d, why);
    }
}

static void *watchdog(void *u)
{
    sg_dist *d = u;
    nccl_state *s = state(d);
    if (cudaSetDevice(s->device) != cudaSuccess) cudaGetLastError();
    while (!s->stop) {
        usleep(20000);
        pthread_mutex_lock(&s->mu);
        if (!s->aborted) watch_once(d);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* ---- the transport ---- */

static sg_status nccl_init(sg_dist *d)
{
    nccl_state *s = calloc(1, sizeof *s);
    if (!s) return sg_fail(d->ctx, SG_ERR_OOM, "sg_dist_create: out of host memory");
    d->impl = s;
    pthread_mutex_init(&s->mu, NULL);
    s->device = d->ctx->opts.device;
    SG_CUDA_CHECK(d->ctx, cudaSetDevice(s->device));
    int lo = 0, hi = 0;
    SG_CUDA_CHECK(d->ctx, cudaDeviceGetStreamPriorityRange(&lo, &hi));
    /* High priority: a bucket's all-reduce starts as soon as the backward makes it ready. */
    SG_CUDA_CHECK(d->ctx, cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, hi));
    SG_CUDA_CHECK(d->ctx, cudaEventCreateWithFlags(&s->fork_ev, cudaEventDisableTiming));
    SG_CUDA_CHECK(d->ctx, cudaEventCreateWithFlags(&s->join_ev, cudaEventDisableTiming));
    for (int i = 0; i < RING; i++) SG_CUDA_CHECK(d->ctx, cudaEventCreateWithFlags(&s->ring[i], cudaEventDisableTiming));
    /* Allocated now: a cudaFree later could wait for the device behind a hung collective. */
    SG_CUDA_CHECK(d->ctx, cudaMalloc(&s->gather, (size_t)d->world * SG_DIST_GATHER_BYTES));
    SG_CUDA_CHECK(d->ctx, cudaMallocHost(&s->pinned, (size_t)d->world * SG_DIST_GATHER_BYTES));
    ncclUniqueId id;
    memcpy(id.internal, d->id.bytes, SG_DIST_ID_BYTES);
    /* Non-blocking: the init returns at once and is polled with a deadline, so a rank that never
     * arrives (or an id whose address cannot be reached) is an error, not a hang. */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
#if SG_NCCL_WINDOWS
    const char *ce = getenv("STEPGRAPH_NCCL_CE");
    if (ce && !strcmp(ce, "1")) cfg.CTAPolicy = NCCL_CTA_POLICY_ZERO, cfg.blocking = 1; /* gathers into windows on the copy engines */
#endif
    pthread_mutex_lock(&s->mu);
    ncclResult_t r = ncclCommInitRankConfig(&s->comm, d->world, id, d->rank, &cfg);
    sg_status st = SG_OK;
    if (r != ncclSuccess && r != ncclInProgress) {
        char why[512];
        snprintf(why, sizeof why, "ncclCommInitRankConfig failed: %s (%s)", ncclGetErrorString(r),
                 ncclGetLastError(NULL));
        if (s->comm) abort_locked(d, why);
        else sg_dist_set_failed(d, "%s", why);
        st = SG_ERR_DIST;
    } else {
        st = settle(d, r, "joining the NCCL communicator (ncclCommInitRankConfig)");
    }
    pthread_mutex_unlock(&s->mu);
    if (st != SG_OK) return sg_dist_check_failed(d);
    s->last_progress = sg_dist_now();
    if (pthread_create(&s->watchdog, NULL, watchdog, d) != 0)
        return sg_fail(d->ctx, SG_ERR_DIST, "sg_dist_create: could not start the watchdog thread");
    s->watching = true;
    return SG_OK;
}

static void nccl_shutdown(sg_dist *d)
{
    nccl_state *s = state(d);
    if (!s) return;
    if (s->watching) {
        s->stop = 1;
        pthread_join(s->watchdog, NULL);
    }
    pthread_mutex_lock(&s->mu);
    if (s->comm && !s->aborted) {
        /* Finalize flushes what was queued; bounded like every wait, then destroy. */
        if (!d->failed && settle(d, ncclCommFinalize(s->comm), "ncclCommFinalize") == SG_OK) {
            if (ncclCommDestroy(s->comm) != ncclSuccess) { /* nothing left to act on */ }
        } else if (!s->aborted) {
            if (ncclCommAbort(s->comm) != ncclSuccess) { /* nothing left to act on */ }
        }
        s->aborted = true;
    }
    pthread_mutex_unlock(&s->mu);
    /* Teardown: each call is made and checked; errors here cannot be acted on. */
    if (s->stream && cudaStreamSynchronize(s->stream) != cudaSuccess) cudaGetLastError();
    for (int i = 0; i < RING; i++)
        if (s->ring[i] && cudaEventDestroy(s->ring[i]) != cudaSuccess) cudaGetLastError();
    if (s->fork_ev && cudaEventDestroy(s->fork_ev) != cudaSuccess) cudaGetLastError();
    if (s->join_ev && cudaEventDestroy(s->join_ev) != cudaSuccess) cudaGetLastError();
    for (int i = 0; i < s->n_marks; i++)
        if (cudaEventDestroy(s->marks[i]) != cudaSuccess) cudaGetLastError();
    free(s->marks);
    if (s->stream && cudaStreamDestroy(s->stream) != cudaSuccess) cudaGetLastError();
    if (s->gather && cudaFree(s->gather) != cudaSuccess) cudaGetLastError();
    if (s->pinned && cudaFreeHost(s->pinned) != cudaSuccess) cudaGetLastError();
    pthread_mutex_destroy(&s->mu);
    free(s);
    d->impl = NULL;
}

static ncclDataType_t nccl_type(sg_dtype dt)
{
    return dt == SG_DTYPE_BF16 ? ncclBfloat16 : dt == SG_DTYPE_I32 ? ncclInt32 : ncclFloat32;
}

static sg_status nccl_collective(sg_dist *d, int op, sg_tensor *t, int64_t off, int64_t count, sg_tensor *out,
                                int64_t out_off)
{
    nccl_state *s = state(d);
    size_t es = sg_dtype_size(t->dtype);
    char *p = (char *)t->data + (size_t)off * es;
    char *q = out ? (char *)out->data + (size_t)out_off * es : NULL;
    size_t n = (size_t)count, share = (size_t)(count / d->world);
    ncclDataType_t ty = nccl_type(t->dtype);
    bool own = !s->group_open; /* inside a group this thread holds mu already */
    if (own) pthread_mutex_lock(&s->mu);
    sg_status st = SG_ERR_DIST;
    if (!s->aborted) {
        switch (op) {
        case SG_DIST_OP_REDUCE_SCATTER_AVG:
            st = settle(d, ncclReduceScatter(p, q, share, ty, ncclAvg, s->comm, s->stream), "ncclReduceScatter");
            break;
        case SG_DIST_OP_ALL_GATHER:
            st = settle(d, ncclAllGather(p, q, share, ty, s->comm, s->stream), "ncclAllGather");
            break;
        default: {
            ncclRedOp_t r = op == SG_DIST_OP_ALL_REDUCE_MIN ? ncclMin : op == SG_DIST_OP_ALL_REDUCE_MAX ? ncclMax : ncclAvg;
            st = settle(d, ncclAllReduce(p, p, n, ty, r, s->comm, s->stream), "ncclAllReduce");
        }
        }
    }
    if (own) pthread_mutex_unlock(&s->mu);
    return st == SG_OK ? SG_OK : sg_dist_check_failed(d);
}

static sg_status nccl_fork(sg_dist *d)
{
    nccl_state *s = state(d);
    SG_CUDA_CHECK(d->ctx, cudaEventRecord(s->fork_ev, main_stream(d)));
    SG_CUDA_CHECK(d->ctx, cudaStreamWaitEvent(s->stream, s->fork_ev, 0));
    return SG_OK;
}

static sg_status nccl_join(sg_dist *d)
{
    nccl_state *s = state(d);
    SG_CUDA_CHECK(d->ctx, cudaEventRecord(s->join_ev, s->stream));
    SG_CUDA_CHECK(d->ctx, cudaStreamWaitEvent(main_stream(d), s->join_ev, 0));
    return SG_OK;
}

static sg_status nccl_marks(sg_dist *d, int n)
{
    nccl_state *s = state(d);
    if (n <= s->n_marks) return SG_OK;
    cudaEvent_t *m = realloc(s->marks, (size_t)n * sizeof *m);
    if (!m) return sg_fail(d->ctx, SG_ERR_OOM, "sg_dist: out of host memory (%d events)", n);
    s->marks = m;
    for (; s->n_marks < n; s->n_marks++)
        SG_CUDA_CHECK(d->ctx, cudaEventCreateWithFlags(&s->marks[s->n_marks], cudaEventDisableTiming));
    return SG_OK;
}

static sg_status mark_index(sg_dist *d, int k)
{
    if (k >= 0 && k < state(d)->n_marks) return SG_OK;
    return sg_fail(d->ctx, SG_ERR_INVALID, "sg_dist: mark %d of %d", k, state(d)->n_marks);
}

static sg_status nccl_mark(sg_dist *d, int k)
{
    SG_TRY(mark_index(d, k));
    SG_CUDA_CHECK(d->ctx, cudaEventRecord(state(d)->marks[k], state(d)->stream));
    return SG_OK;
}

static sg_status nccl_wait(sg_dist *d, int k)
{
    SG_TRY(mark_index(d, k));
    SG_CUDA_CHECK(d->ctx, cudaStreamWaitEvent(main_stream(d), state(d)->marks[k], 0));
    return SG_OK;
}

/* ncclGroupStart / ncclGroupEnd. mu is held from the start to the end (the group is this
 * thread's; the watchdog cannot abort the communicator under it); the non-blocking end is
 * settled like a collective. A collective that fails inside closes the group before the abort
 * (abort_locked), and the end then reports the failure. */
static sg_status nccl_group(sg_dist *d, bool begin)
{
    nccl_state *s = state(d);
    sg_status st = SG_ERR_DIST;
    if (begin) {
        pthread_mutex_lock(&s->mu);
        if (!s->aborted) st = settle(d, ncclGroupStart(), "ncclGroupStart");
        if (st != SG_OK) {
            pthread_mutex_unlock(&s->mu);
            return sg_dist_check_failed(d);
        }
        s->group_open = true;
        return SG_OK;
    }
    if (s->group_open) {
        s->group_open = false;
        st = settle(d, ncclGroupEnd(), "ncclGroupEnd");
    }
    pthread_mutex_unlock(&s->mu);
    return st == SG_OK ? SG_OK : sg_dist_check_failed(d);
}

/* Waits for the collectives stream, at most the timeout (aborting after it). */
static sg_status wait_stream(sg_dist *d, const char *what)
{
    nccl_state *s = state(d);
    double deadline = sg_dist_now() + d->timeout_s;
    for (;;) {
        cudaError_t e = cudaStreamQuery(s->stream);
        if (e == cudaSuccess) return SG_OK;
        if (e != cudaErrorNotReady) return sg_cuda_status(d->ctx, (int)e, "cudaStreamQuery", __FILE__, __LINE__);
        SG_TRY(sg_dist_check_failed(d));
        if (sg_dist_now() > deadline) {
            char why[256];
            snprintf(why, sizeof why, "%s did not finish within %.0f s: a peer rank died or is stuck", what,
                     d->timeout_s);
            pthread_mutex_lock(&s->mu);
            abort_locked(d, why);
            pthread_mutex_unlock(&s->mu);
            return sg_dist_check_failed(d);
        }
        usleep(200);
    }
}

static sg_status nccl_all_gather_host(sg_dist *d, const void *mine, void *all, size_t bytes)
{
    nccl_state *s = state(d);
    SG_TRY(sg_dist_check_failed(d));
    size_t total = bytes * (size_t)d->world;
    SG_ASSERT(bytes <= SG_DIST_GATHER_BYTES);
    char *dev = s->gather, *host = s->pinned;
    memcpy(host + (size_t)d->rank * bytes, mine, bytes);
    SG_TRY(nccl_fork(d)); /* after the steps already queued: one order of collectives on every rank */
    SG_CUDA_CHECK(d->ctx, cudaMemcpyAsync(dev + (size_t)d->rank * bytes, host + (size_t)d->rank * bytes, bytes,
                                          cudaMemcpyHostToDevice, s->stream));
    pthread_mutex_lock(&s->mu);
    sg_status st = SG_ERR_DIST;
    if (!s->aborted)
        st = settle(d, ncclAllGather(dev + (size_t)d->rank * bytes, dev, bytes, ncclUint8, s->comm, s->stream),
                    "ncclAllGather");
    pthread_mutex_unlock(&s->mu);
    if (st != SG_OK) return sg_dist_check_failed(d);
    SG_CUDA_CHECK(d->ctx, cudaMemcpyAsync(host, dev, total, cudaMemcpyDeviceToHost, s->stream));
    SG_TRY(wait_stream(d, "an all-gather of the ranks' check data"));
    memcpy(all, host, total);
    return SG_OK;
}

static sg_status nccl_step_end(sg_dist *d)
{
    nccl_state *s = state(d);
    pthread_mutex_lock(&s->mu);
    /* At most RING steps in flight: wait (bounded by the watchdog, which aborts a step that
     * makes no progress) for the oldest to finish, polling it here. */
    while (s->count == RING && !s->aborted && retire_locked(d) && s->count == RING) {
        pthread_mutex_unlock(&s->mu);
        usleep(20);
        pthread_mutex_lock(&s->mu);
    }
    sg_status st = SG_OK;
    if (!s->aborted) {
        cudaError_t e = cudaEventRecord(s->ring[s->head], main_stream(d));
        if (e != cudaSuccess) st = sg_cuda_status(d->ctx, (int)e, "cudaEventRecord", __FILE__, __LINE__);
        else {
            if (s->count == 0) s->last_progress = sg_dist_now();
            s->ring_t[s->head] = sg_dist_now();
            s->head = (s->head + 1) % RING;
            s->count++;
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (st != SG_OK) return st;
    return sg_dist_check_failed(d);
}

#if SG_NCCL_WINDOWS
static sg_status nccl_window_alloc(sg_dist *d, size_t bytes, void **ptr, void **win)
{
    nccl_state *s = state(d);
    *ptr = *win = NULL;
    bytes = (bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT;
    ncclResult_t r = ncclMemAlloc(ptr, bytes);
    if (r != ncclSuccess)
        return sg_fail(d->ctx, SG_ERR_OOM, "ncclMemAlloc of %zu bytes failed: %s", bytes, ncclGetErrorString(r));
    pthread_mutex_lock(&s->mu);
    sg_status st = s->aborted ? SG_ERR_DIST
                              : settle(d, ncclCommWindowRegister(s->comm, *ptr, bytes, (ncclWindow_t *)win,
                                                                 NCCL_WIN_COLL_SYMMETRIC),
                                       "ncclCommWindowRegister");
    pthread_mutex_unlock(&s->mu);
    if (st != SG_OK) {
        if (ncclMemFree(*ptr) != ncclSuccess) { /* the run failed already */ }
        *ptr = *win = NULL;
        return sg_dist_check_failed(d);
    }
    return SG_OK;
}

static void nccl_window_free(sg_dist *d, void *ptr, void *win)
{
    nccl_state *s = state(d);
    pthread_mutex_lock(&s->mu);
    if (win && !s->aborted) (void)settle(d, ncclCommWindowDeregister(s->comm, (ncclWindow_t)win), "ncclCommWindowDeregister");
    pthread_mutex_unlock(&s->mu);
    if (ptr && ncclMemFree(ptr) != ncclSuccess) { /* teardown: nothing to act on */ }
}

#else
#define nccl_window_alloc NULL /* NCCL before 2.27: no symmetric windows, no CTA policy */
#define nccl_window_free NULL
#endif

const sg_dist_i sg_dist_nccl = {
    "nccl", nccl_init, nccl_shutdown, nccl_collective, nccl_all_gather_host,
    nccl_fork, nccl_join, nccl_group, nccl_marks, nccl_mark, nccl_wait, nccl_step_end,
    nccl_window_alloc, nccl_window_free,
};
