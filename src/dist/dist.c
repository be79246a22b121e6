/* dist.c: data parallelism's shared part. sg_dist joins a run through a transport (NCCL on
 * CUDA, local sockets on the CPU); attached to a trainer, it turns the backward pass into
 * bucketed all-reduces: after each child of the model's Sequential, the tail of the flat
 * gradient buffer that is final and not yet sent is averaged over the ranks, on a second
 * stream, once it holds bucket_bytes (the loss first, the last two children's whatever their
 * size, the rest at the end), and the context stream waits for them before the optimizer. While
 * a graph is captured the collectives are recorded, and before any rank replays it every rank
 * checks that all ranks captured the same ones: a difference would make the replay hang. */
#include "dist/dist.h"
#include "ops/amp.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

sg_dist_options sg_dist_options_default(void)
{
    sg_dist_options o;
    memset(&o, 0, sizeof o);
    o.world = 1;
    o.bucket_bytes = (size_t)4 << 20;
    o.timeout_s = 300.0;
    return o;
}

sg_status sg_dist_id_create(sg_backend b, sg_dist_id *out)
{
    if (!out) return sg_fail(NULL, SG_ERR_NULL, "sg_dist_id_create: out is NULL");
    if (b == SG_BACKEND_CPU) return sg_dist_cpu_id(out);
    if (b != SG_BACKEND_CUDA)
        return sg_fail(NULL, SG_ERR_INVALID, "sg_dist_id_create: backend %s: expected cpu or cuda (an id names "
                       "one transport: NCCL for cuda, local sockets for cpu)", sg_backend_name(b));
#ifdef SG_HAVE_NCCL
    return sg_dist_nccl_id(out);
#else
    return sg_fail(NULL, SG_ERR_UNSUPPORTED, "sg_dist_id_create: this build of stepgraph has no NCCL (%s); "
                   "data parallelism on GPUs needs NCCL (nccl.h and libnccl where CMake looks: the CUDA "
                   "toolkit, or NCCL_HOME)",
#ifdef SG_HAVE_CUDA
                   "it was not found when the build was configured"
#else
                   "nor CUDA"
#endif
    );
#endif
}

/* ---- failure: recorded once, reported by every later call ---- */

sg_status sg_dist_set_failed(sg_dist *d, const char *fmt, ...)
{
    pthread_mutex_lock(&d->fail_mu);
    if (!d->failed) {
        int k = snprintf(d->fail_msg, sizeof d->fail_msg, "sg_dist: rank %d of %d: ", d->rank, d->world);
        va_list ap;
        va_start(ap, fmt);
        if (k > 0 && (size_t)k < sizeof d->fail_msg) vsnprintf(d->fail_msg + k, sizeof d->fail_msg - (size_t)k, fmt, ap);
        va_end(ap);
        d->failed = 1;
    }
    pthread_mutex_unlock(&d->fail_mu);
    return SG_ERR_DIST;
}

sg_status sg_dist_check_failed(sg_dist *d)
{
    if (!d->failed) return SG_OK;
    pthread_mutex_lock(&d->fail_mu);
    sg_status st = sg_fail(d->ctx, SG_ERR_DIST, "%s", d->fail_msg);
    pthread_mutex_unlock(&d->fail_mu);
    return st;
}

/* ---- the run ---- */

sg_status sg_dist_create(sg_ctx *ctx, const sg_dist_options *opts, sg_dist **out)
{
    if (!ctx) return SG_ERR_NULL;
    if (!opts || !out) return sg_fail(ctx, SG_ERR_NULL, "sg_dist_create: opts or out is NULL");
    *out = NULL;
    if (opts->world < 1 || opts->world > SG_DIST_MAX_WORLD || opts->rank < 0 || opts->rank >= opts->world ||
        opts->timeout_s < 0)
        return sg_fail(ctx, SG_ERR_INVALID, "sg_dist_create: rank %d of %d, timeout %g s: expected a world of 1 "
                       "to %d, a rank from 0 to world - 1 and a timeout >= 0", opts->rank, opts->world,
                       opts->timeout_s, SG_DIST_MAX_WORLD);
    if (sg_ctx_capturing(ctx))
        return sg_capture_forbid(ctx, "sg_dist_create", "joined a data-parallel run", "join before capture");
    const sg_dist_i *vt = &sg_dist_cpu;
    if (ctx->backend == SG_BACKEND_CUDA) {
#ifdef SG_HAVE_NCCL
        vt = &sg_dist_nccl;
#else
        return sg_fail(ctx, SG_ERR_UNSUPPORTED, "sg_dist_create: data parallelism on the CUDA backend needs NCCL, "
                       "and this build has none (it was not found when the build was configured)");
#endif
    }
    sg_dist *d = calloc(1, sizeof *d);
    if (!d) return sg_fail(ctx, SG_ERR_OOM, "sg_dist_create: out of host memory");
    d->ctx = ctx, d->vt = vt, d->rank = opts->rank, d->world = opts->world, d->id = opts->id;
    d->bucket_bytes = opts->bucket_bytes ? opts->bucket_bytes : (size_t)4 << 20;
    d->timeout_s = opts->timeout_s > 0 ? opts->timeout_s : 300.0;
    pthread_mutex_init(&d->fail_mu, NULL);
    const char *inj = getenv("SG_DIST_INJECT_SEQ"); /* test hook: see sg_dist_capture_check */
    d->inject_rank = inj && *inj ? atoi(inj) : -1;
    sg_status st = vt->init(d);
    if (st != SG_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", d->failed ? d->fail_msg : sg_ctx_last_error(ctx));
        vt->shutdown(d);
        pthread_mutex_destroy(&d->fail_mu);
        free(d);
        return sg_fail(ctx, st, "%s", msg);
    }
    *out = d;
    return SG_OK;
}

void sg_dist_destroy(sg_dist *d)
{
    if (!d) return;
    d->vt->shutdown(d);
    free(d->ready);
    pthread_mutex_destroy(&d->fail_mu);
    free(d);
}

int sg_dist_rank(const sg_dist *d) { return d ? d->rank : 0; }
int sg_dist_world(const sg_dist *d) { return d ? d->world : 1; }

sg_status sg_dist_poll(sg_dist *d)
{
    if (!d) return SG_ERR_NULL;
    return sg_dist_check_failed(d);
}

sg_status sg_dist_get_stats(const sg_dist *d, sg_dist_stats *out)
{
    if (!d || !out) return SG_ERR_NULL;
    *out = d->st;
    out->buckets_per_step = d->last_buckets;
    out->bytes_per_step = d->last_bytes;
    return SG_OK;
}

sg_status sg_dist_average_host(sg_dist *d, double *v, int n)
{
    if (!d) return SG_ERR_NULL;
    if (!v || n < 1 || n > SG_DIST_GATHER_BYTES / (int)sizeof(double))
        return sg_fail(d->ctx, SG_ERR_INVALID, "sg_dist_average_host: %d values: expected 1 to %d", n,
                       SG_DIST_GATHER_BYTES / (int)sizeof(double));
    SG_TRY(sg_dist_check_failed(d));
    if (sg_ctx_capturing(d->ctx))
        return sg_capture_forbid(d->ctx, "sg_dist_average_host", "averaged host values over the ranks",
                                 "average after replay");
    double *all = malloc((size_t)d->world * (size_t)n * sizeof *all);
    if (!all) return sg_fail(d->ctx, SG_ERR_OOM, "sg_dist_average_host: out of host memory");
    sg_status st = d->vt->all_gather_host(d, v, all, (size_t)n * sizeof *v);
    for (int i = 0; i < n && st == SG_OK; i++) {
        double s = 0;
        for (int r = 0; r < d->world; r++) s += all[(size_t)r * (size_t)n + (size_t)i];
        v[i] = s / d->world;
    }
    free(all);
    return st;
}

/* ---- gradients: buckets fired by the backward ---- */

/* The buckets the backward sends, in order: after child i (last to first), the gradients final
 * and not yet sent, once they hold bucket_bytes (children 1 and 0 send theirs whatever the
 * size: see sg_dist_backward_hook), the rest at the end. Sharded, every boundary but the top is
 * rounded up to a multiple of 4 x world (what is left below goes with the next bucket, final by
 * then too), and the top's remainder [tail_lo, numel) is left for the end, whole. */
static sg_status plan_buckets(sg_dist *d)
{
    const int64_t numel = d->grads->numel, align = d->shard ? 4 * (int64_t)d->world : 1;
    const size_t es = sg_dtype_size(d->grads->dtype);
    sg_dist_bucket *p = calloc((size_t)d->n_ready + 1, sizeof *p);
    if (!p) return sg_fail(d->ctx, SG_ERR_OOM, "sg_dist_attach: out of host memory");
    int n = 0;
    int64_t sent_lo = numel - numel % align, off = 0;
    d->tail_lo = sent_lo;
    for (int child = d->n_ready - 1; child >= -1; child--) {
        int64_t lo = child < 0 ? 0 : d->ready[child] < sent_lo ? d->ready[child] : sent_lo;
        lo = (lo + align - 1) / align * align;
        if (lo > sent_lo) lo = sent_lo;
        size_t bytes = (size_t)(sent_lo - lo) * es;
        if (bytes == 0 || (child > 1 && bytes < d->bucket_bytes)) continue;
        p[n++] = (sg_dist_bucket){lo, sent_lo, off, child};
        off += (sent_lo - lo) / d->world;
        sent_lo = lo;
    }
    free(d->plan);
    d->plan = p, d->n_plan = n;
    d->shard_numel = d->shard ? off + (numel - d->tail_lo) : 0;
    return SG_OK;
}

sg_status sg_dist_attach(sg_dist *d, sg_tensor *grads, sg_tensor *loss, const int64_t *ready, int n, bool shard)
{
    if (!grads || !loss || (n > 0 && !ready) || n < 0)
        return sg_fail(d->ctx, SG_ERR_NULL, "sg_dist_attach: gradients, loss and %d ready offsets needed", n);
    if (grads->ctx != d->ctx || loss->ctx != d->ctx)
        return sg_fail(d->ctx, SG_ERR_BACKEND, "sg_dist_attach: '%s' or '%s' belongs to another context than the "
                       "run's", grads->name, loss->name);
    if ((grads->dtype != SG_DTYPE_F32 && grads->dtype != SG_DTYPE_BF16) || loss->dtype != SG_DTYPE_F32)
        return sg_fail(d->ctx, SG_ERR_DTYPE, "sg_dist_attach: gradients '%s' are %s and the loss %s: expected f32 "
                       "or bf16 gradients and an f32 loss", grads->name, sg_dtype_name(grads->dtype),
                       sg_dtype_name(loss->dtype));
    int64_t *r = malloc((size_t)(n > 0 ? n : 1) * sizeof *r);
    if (!r) return sg_fail(d->ctx, SG_ERR_OOM, "sg_dist_attach: out of host memory");
    for (int i = 0; i < n; i++) {
        if (ready[i] < 0 || ready[i] > grads->numel) {
            free(r);
            return sg_fail(d->ctx, SG_ERR_INVALID, "sg_dist_attach: ready offset %lld of child %d is outside "
                           "'%s' (%lld elements)", (long long)ready[i], i, grads->name, (long long)grads->numel);
        }
        r[i] = ready[i];
    }
    free(d->ready);
    d->ready = r, d->n_ready = n, d->grads = grads, d->loss = loss, d->shard = shard, d->shard_out = NULL;
    d->gather_left = 0;
    SG_TRY(plan_buckets(d));
    return shard ? d->vt->marks(d, d->n_plan) : SG_OK;
}

sg_dist_layout sg_dist_shard_layout(const sg_dist *d)
{
    const int64_t tail_n = d->grads->numel - d->tail_lo;
    return (sg_dist_layout){d->plan, d->n_plan, d->tail_lo, tail_n, d->shard_numel - tail_n, d->shard_numel};
}

sg_status sg_dist_set_shard_out(sg_dist *d, sg_tensor *shard_out)
{
    if (!d->shard || !shard_out || shard_out->dtype != d->grads->dtype || shard_out->numel != d->shard_numel ||
        shard_out->ctx != d->ctx)
        return sg_fail(d->ctx, SG_ERR_INVALID, "sg_dist_set_shard_out: expected a sharded attach and %lld %s "
                       "elements of the run's context", (long long)d->shard_numel, sg_dtype_name(d->grads->dtype));
    d->shard_out = shard_out;
    return SG_OK;
}

void sg_dist_detach(sg_dist *d)
{
    if (!d) return;
    free(d->ready);
    free(d->plan);
    d->ready = NULL, d->n_ready = 0, d->grads = d->loss = NULL, d->in_backward = false;
    d->plan = NULL, d->n_plan = 0, d->shard = false, d->shard_out = NULL, d->gather_left = 0;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

const char *sg_dist_op_name(int op)
{
    switch (op) {
    case SG_DIST_OP_ALL_REDUCE_AVG: return "all_reduce(avg)";
    case SG_DIST_OP_REDUCE_SCATTER_AVG: return "reduce_scatter(avg)";
    case SG_DIST_OP_ALL_GATHER: return "all_gather";
    case SG_DIST_OP_ALL_REDUCE_MIN: return "all_reduce(min)";
    case SG_DIST_OP_ALL_REDUCE_MAX: return "all_reduce(max)";
    default: return "an unknown collective";
    }
}

/* One collective (the transport's table says what each op does); recorded when the context
 * captures. The record names t and its range (for ALL_GATHER, the range gathered into out). */
static sg_status collective(sg_dist *d, sg_dist_op op, sg_tensor *t, int64_t off, int64_t count, sg_tensor *out,
                            int64_t out_off)
{
    if (d->recording && sg_ctx_capturing(d->ctx)) {
        sg_dist_coll c;
        memset(&c, 0, sizeof c);
        c.op = (int32_t)op, c.dtype = (int32_t)t->dtype, c.offset = off, c.count = count;
        snprintf(c.tensor, sizeof c.tensor, "%.23s", t->name);
        d->rec_hash = fnv1a(d->rec_hash, &c, sizeof c);
        if (d->n_rec < SG_DIST_RECORD) d->rec[d->n_rec] = c;
        d->n_rec++;
    }
    d->st.collectives++;
    d->st.bytes += (uint64_t)count * sg_dtype_size(t->dtype);
    d->step_bytes += (uint64_t)count * sg_dtype_size(t->dtype);
    return d->vt->collective(d, op, t, off, count, out, out_off);
}

/* One all-reduce (average) of t[off, off + count), in place. */
static sg_status all_reduce(sg_dist *d, sg_tensor *t, int64_t off, int64_t count)
{
    return collective(d, SG_DIST_OP_ALL_REDUCE_AVG, t, off, count, NULL, 0);
}

/* Bucket b is final: fork the second stream here and average it there (sharded: reduce-scatter
 * it into the compact gradients). */
static sg_status send_bucket(sg_dist *d, const sg_dist_bucket *b)
{
    int64_t lo = b->lo, hi = b->hi;
    SG_TRY(sg_cond_forbid(d->ctx, "sg_dist_backward_hook", "averaged gradients over the ranks (an NCCL collective)"));
    SG_TRY(d->vt->fork(d));
    d->buckets++;
    if (d->shard)
        return collective(d, SG_DIST_OP_REDUCE_SCATTER_AVG, d->grads, lo, hi - lo, d->shard_out, b->shard_off);
    /* Test hook: rank SG_DIST_INJECT_SEQ captures its first bucket as two all-reduces (the same
     * numbers, another sequence), which the check must catch before any replay. */
    if (d->rank == d->inject_rank && d->recording && d->buckets == 1 && hi - lo >= 2) {
        int64_t mid = lo + (hi - lo) / 2;
        SG_TRY(all_reduce(d, d->grads, lo, mid - lo));
        lo = mid;
    }
    return all_reduce(d, d->grads, lo, hi - lo);
}

sg_status sg_dist_backward_begin(sg_dist *d)
{
    SG_TRY(sg_dist_check_failed(d));
    SG_TRY(sg_cond_forbid(d->ctx, "sg_dist_backward_begin", "began a data-parallel backward (NCCL collectives)"));
    if (!d->grads)
        return sg_fail(d->ctx, SG_ERR_INVALID, "sg_dist_backward_begin: no gradients attached (sg_dist_attach)");
    if (d->shard && !d->shard_out)
        return sg_fail(d->ctx, SG_ERR_INVALID, "sg_dist_backward_begin: a sharded attach without its compact "
                       "gradients (sg_dist_set_shard_out)");
    d->in_backward = true;
    d->next_plan = 0;
    d->buckets = 0;
    d->step_bytes = 0;
    /* The loss first (so that every rank reports the whole batch's): the backward does not read
     * it, so its all-reduce runs beside the backward instead of after the last bucket, on the
     * way to the optimizer. */
    SG_TRY(d->vt->fork(d));
    return all_reduce(d, d->loss, 0, 1);
}

/* The buckets planned for child (sg_dist_attach): after child i's backward, the gradients that
 * are final go as soon as they hold bucket_bytes; children 1 and 0 send what they have whatever
 * its size: child 0's backward is the last, so the bucket it sends waits for no compute; sent
 * at child 1, the gradients before it are averaged while child 0's backward runs, and the last
 * bucket holds child 0's alone (a GPT's embeddings, small). */
sg_status sg_dist_backward_hook(void *dist, int child)
{
    sg_dist *d = dist;
    if (!d->in_backward || child < 0) return SG_OK;
    while (d->next_plan < d->n_plan && d->plan[d->next_plan].child == child)
        SG_TRY(send_bucket(d, &d->plan[d->next_plan++]));
    return SG_OK;
}

/* Closes a group opened after collectives whose status is st: st's failure first, else the
 * close's. */
static sg_status end_group(sg_dist *d, sg_status st)
{
    sg_status end = d->vt->group(d, false);
    return st != SG_OK ? st : end;
}

/* A sharded run's tail (all-reduced whole, so the same on every rank) copied between a flat
 * tensor (at tail_lo) and a compact one (at tail_off), into the compact one or out of it, on the
 * context's stream. */
static sg_status copy_tail(sg_dist *d, sg_tensor *flat, sg_tensor *compact, bool into_compact)
{
    const sg_dist_layout L = sg_dist_shard_layout(d);
    int64_t n = L.tail_n;
    if (n <= 0) return SG_OK;
    sg_tensor *a = NULL, *b = NULL;
    sg_status st = sg_tensor_view(flat, L.tail_lo, 1, &n, "tail.flat", &a);
    if (st == SG_OK) st = sg_tensor_view(compact, L.tail_off, 1, &n, "tail.compact", &b);
    if (st == SG_OK) st = into_compact ? sg_tensor_copy(b, a) : sg_tensor_copy(a, b);
    sg_tensor_destroy(a);
    sg_tensor_destroy(b);
    return st;
}

sg_status sg_dist_backward_end(sg_dist *d)
{
    if (!d->in_backward)
        return sg_fail(d->ctx, SG_ERR_INVALID, "sg_dist_backward_end: no sg_dist_backward_begin before it");
    d->in_backward = false;
    SG_TRY(sg_cond_forbid(d->ctx, "sg_dist_backward_end", "averaged gradients over the ranks (an NCCL collective)"));
    /* What no child's hook sent (alignment padding too; everything when no hook ran, as after
     * accumulated micro-batches): one all-reduce, or sharded each planned bucket's
     * reduce-scatter, then the tail whole. */
    if (d->shard)
        while (d->next_plan < d->n_plan) SG_TRY(send_bucket(d, &d->plan[d->next_plan++]));
    else if (d->next_plan < d->n_plan) {
        sg_dist_bucket rest = {0, d->plan[d->next_plan].hi, 0, -1};
        d->next_plan = d->n_plan;
        SG_TRY(send_bucket(d, &rest));
    }
    if (d->shard && d->tail_lo < d->grads->numel) {
        SG_TRY(d->vt->fork(d));
        SG_TRY(all_reduce(d, d->grads, d->tail_lo, d->grads->numel - d->tail_lo));
    }
    d->last_buckets = d->buckets;
    d->last_bytes = d->step_bytes;
    SG_TRY(d->vt->join(d));
    /* Sharded: the tail into the compact gradients' last elements. */
    return d->shard ? copy_tail(d, d->grads, d->shard_out, true) : SG_OK;
}

sg_status sg_dist_agree_scaler(sg_dist *d, sg_tensor *found, sg_tensor *scaler)
{
    SG_TRY(sg_cond_forbid(d->ctx, "sg_dist_agree_scaler", "agreed on the loss scale over the ranks (a collective)"));
    SG_TRY(d->vt->fork(d));
    SG_TRY(d->vt->group(d, true));
    sg_status st = collective(d, SG_DIST_OP_ALL_REDUCE_MAX, found, 0, 1, NULL, 0);
    if (st == SG_OK) st = collective(d, SG_DIST_OP_ALL_REDUCE_MIN, scaler, SG_SCALER_SCALE, 2, NULL, 0);
    if (st == SG_OK) st = collective(d, SG_DIST_OP_ALL_REDUCE_MAX, scaler, SG_SCALER_SKIPPED, 1, NULL, 0);
    SG_TRY(end_group(d, st));
    return d->vt->join(d);
}

/* The checks of a gather of src's shares into dst, and the tail copied (every rank holds it
 * whole). */
static sg_status gather_tail(sg_dist *d, const char *fn, sg_tensor *src, sg_tensor *dst)
{
    SG_TRY(sg_cond_forbid(d->ctx, fn, "gathered the parameters over the ranks (a collective)"));
    if (!d->shard || src->dtype != dst->dtype || src->numel != d->shard_numel || dst->numel != d->grads->numel)
        return sg_fail(d->ctx, SG_ERR_INVALID, "%s: '%s' (%lld %s) into '%s' (%lld %s): expected a sharded run's "
                       "compact %lld elements into its flat %lld, one dtype", fn, src->name, (long long)src->numel,
                       sg_dtype_name(src->dtype), dst->name, (long long)dst->numel, sg_dtype_name(dst->dtype),
                       (long long)d->shard_numel, (long long)d->grads->numel);
    if (d->gather_left)
        return sg_fail(d->ctx, SG_ERR_INVALID, "%s: the gather begun before was not ended (sg_dist_gather_end)", fn);
    return copy_tail(d, dst, src, false);
}

/* Every bucket's all-gather in the order the forward reads them (the plan's last bucket holds
 * the first children's parameters), each followed by its mark. */
sg_status sg_dist_gather_begin(sg_dist *d, sg_tensor *src, sg_tensor *dst)
{
    SG_TRY(gather_tail(d, "sg_dist_gather_begin", src, dst));
    SG_TRY(d->vt->fork(d));
    for (int i = d->n_plan - 1; i >= 0; i--) {
        const sg_dist_bucket *b = &d->plan[i];
        SG_TRY(collective(d, SG_DIST_OP_ALL_GATHER, src, b->shard_off, b->hi - b->lo, dst, b->lo));
        SG_TRY(d->vt->mark(d, i));
    }
    d->gather_left = d->n_plan;
    return SG_OK;
}

/* Before child i's forward: it reads parameters below ready[i + 1] (the next child's first),
 * so the context's stream waits for every bucket that starts below that. */
sg_status sg_dist_forward_hook(void *dist, int child)
{
    sg_dist *d = dist;
    if (!d->gather_left || child < 0) return SG_OK;
    int64_t end = child + 1 < d->n_ready ? d->ready[child + 1] : d->grads->numel;
    while (d->gather_left && d->plan[d->gather_left - 1].lo < end) SG_TRY(d->vt->wait(d, --d->gather_left));
    return SG_OK;
}

sg_status sg_dist_gather_end(sg_dist *d)
{
    if (!d->gather_left) return SG_OK;
    d->gather_left = 0;
    return d->vt->wait(d, 0); /* bucket 0's mark is the last */
}

sg_status sg_dist_gather_shards(sg_dist *d, sg_tensor *src, sg_tensor *dst)
{
    SG_TRY(gather_tail(d, "sg_dist_gather_shards", src, dst));
    SG_TRY(d->vt->fork(d));
    /* One group: NCCL launches one kernel for all buckets, not one each. */
    SG_TRY(d->vt->group(d, true));
    sg_status st = SG_OK;
    for (int i = 0; i < d->n_plan && st == SG_OK; i++) {
        const sg_dist_bucket *b = &d->plan[i];
        st = collective(d, SG_DIST_OP_ALL_GATHER, src, b->shard_off, b->hi - b->lo, dst, b->lo);
    }
    SG_TRY(end_group(d, st));
    return d->vt->join(d);
}

sg_status sg_dist_gather_bits(sg_dist *d, sg_tensor *mine, sg_tensor *all)
{
    SG_TRY(sg_cond_forbid(d->ctx, "sg_dist_gather_bits", "gathered values over the ranks (a collective)"));
    if (mine->dtype != all->dtype || all->numel != mine->numel * d->world)
        return sg_fail(d->ctx, SG_ERR_INVALID, "sg_dist_gather_bits: '%s' (%lld %s) into '%s' (%lld %s): expected "
                       "%d times the elements, one dtype", mine->name, (long long)mine->numel,
                       sg_dtype_name(mine->dtype), all->name, (long long)all->numel, sg_dtype_name(all->dtype),
                       d->world);
    SG_TRY(d->vt->fork(d));
    SG_TRY(collective(d, SG_DIST_OP_ALL_GATHER, mine, 0, all->numel, all, 0));
    return d->vt->join(d);
}

bool sg_dist_has_windows(const sg_dist *d) { return d->vt->window_alloc != NULL; }

sg_status sg_dist_window_alloc(sg_dist *d, size_t bytes, void **ptr, void **win)
{
    if (!d->vt->window_alloc)
        return sg_fail(d->ctx, SG_ERR_UNSUPPORTED, "sg_dist: the %s transport has no copy-engine windows", d->vt->name);
    return d->vt->window_alloc(d, bytes, ptr, win);
}

void sg_dist_window_free(sg_dist *d, void *ptr, void *win)
{
    if (d->vt->window_free) d->vt->window_free(d, ptr, win);
}

sg_status sg_dist_step_end(sg_dist *d)
{
    SG_TRY(sg_dist_check_failed(d));
    return d->vt->step_end(d);
}

/* ---- the check of captured collectives ---- */

/* What a rank tells the others about one capture. */
typedef struct summary {
    char magic[8];
    int32_t rank, failed, n, pad;
    uint64_t hash;
    char graph[32];
    char msg[384];
    sg_dist_coll c[SG_DIST_RECORD];
} summary;

_Static_assert(sizeof(summary) <= SG_DIST_GATHER_BYTES, "a check's summary must fit all_gather_host");

void sg_dist_capture_begin(sg_dist *d)
{
    d->recording = true;
    d->n_rec = 0;
    d->rec_hash = 0xcbf29ce484222325ull;
}

static void describe(const summary *s, int k, char *buf, size_t n)
{
    if (k >= s->n) {
        snprintf(buf, n, "nothing (it captured %d collectives)", s->n);
        return;
    }
    if (k >= SG_DIST_RECORD) {
        snprintf(buf, n, "collectives #%d.. differ (only the first %d are compared one by one)", SG_DIST_RECORD,
                 SG_DIST_RECORD);
        return;
    }
    const sg_dist_coll *c = &s->c[k];
    snprintf(buf, n, "%s of %lld %s at %s[%lld..%lld)", sg_dist_op_name(c->op), (long long)c->count,
             sg_dtype_name((sg_dtype)c->dtype), c->tensor, (long long)c->offset, (long long)(c->offset + c->count));
}

/* The first collective where a and b differ, or -1 when they are the same. */
static int first_difference(const summary *a, const summary *b)
{
    int n = a->n < b->n ? a->n : b->n;
    for (int k = 0; k < n && k < SG_DIST_RECORD; k++)
        if (memcmp(&a->c[k], &b->c[k], sizeof a->c[k]) != 0) return k;
    if (a->n != b->n) return n;
    return a->hash != b->hash ? SG_DIST_RECORD : -1;
}

sg_status sg_dist_capture_check(sg_dist *d, const char *graph, sg_status local)
{
    d->recording = false;
    if (d->failed) return sg_dist_check_failed(d);
    summary *all = calloc((size_t)d->world + 1, sizeof *all);
    if (!all) return sg_fail(d->ctx, SG_ERR_OOM, "sg_dist_capture_check: out of host memory");
    summary *mine = &all[d->world];
    memcpy(mine->magic, "SGDSUM01", 8);
    mine->rank = d->rank, mine->failed = local != SG_OK, mine->n = d->n_rec, mine->hash = d->rec_hash;
    snprintf(mine->graph, sizeof mine->graph, "%s", graph);
    snprintf(mine->msg, sizeof mine->msg, "%s", local != SG_OK ? sg_ctx_last_error(d->ctx) : "");
    memcpy(mine->c, d->rec, sizeof mine->c);
    char local_msg[1024];
    snprintf(local_msg, sizeof local_msg, "%s", sg_ctx_last_error(d->ctx));
    sg_status st = d->vt->all_gather_host(d, mine, all, sizeof *mine);
    if (st == SG_OK) d->st.checks++;
    /* Every rank reads the same summaries, so every rank comes to the same verdict. */
    for (int r = 0; r < d->world && st == SG_OK; r++) {
        all[r].msg[sizeof all[r].msg - 1] = '\0';
        if (!all[r].failed) continue;
        if (r == d->rank) st = sg_fail(d->ctx, local, "%s", local_msg);
        else
            st = sg_fail(d->ctx, SG_ERR_CAPTURE, "sg_dist: rank %d of %d: graph '%s': rank %d's capture failed, so no "
                         "rank replays it: %s", d->rank, d->world, graph, r, all[r].msg);
    }
    for (int r = 1; r < d->world && st == SG_OK; r++) {
        int k = first_difference(&all[0], &all[r]);
        if (k < 0) continue;
        char a[160], b[160];
        describe(&all[0], k, a, sizeof a);
        describe(&all[r], k, b, sizeof b);
        st = sg_dist_set_failed(d, "graph '%s': rank %d captured other collectives than rank 0, and replaying it "
                                "would hang: first difference at collective #%d: rank 0 %s, rank %d %s (rank 0 "
                                "captured %d, rank %d captured %d). Every rank must capture the same step: the "
                                "same model, options and bucket size", graph, r, k, a, r, b, all[0].n, r, all[r].n);
        st = sg_dist_check_failed(d);
    }
    free(all);
    return st;
}
