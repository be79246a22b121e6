/* dist_cpu.c: the CPU transport, the reference for data parallelism as the CPU ops are for
 * the kernels: ranks are processes on one host joined by local sockets in a star around rank
 * 0, which sums every rank's values in rank order (in double) and sends the average back, so
 * every rank gets the same bits. An all-reduce is an op like any other: queued through
 * sg_cpu_run, so a CPU capture records it into the plan and replay runs it. Every wait is
 * bounded by the run's timeout, and a rank that fails closes its sockets, so its peers fail
 * at once instead of waiting. */
#define _GNU_SOURCE

#include "dist/dist.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

#define CPU_MAGIC "SGCPUDIST1:"

typedef struct cpu_state {
    int *fd;                   /* rank 0: fd[r] for r >= 1; others: fd[0], the link to rank 0 */
    unsigned char *buf;        /* rank 0: the other ranks' values */
    size_t cap;
    uint64_t calls;
} cpu_state;

typedef struct hello {
    char magic[8];
    int32_t rank, world;
} hello;

sg_status sg_dist_cpu_id(sg_dist_id *out)
{
    unsigned char r[12];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return sg_fail(NULL, SG_ERR_DIST, "sg_dist_id_create: getrandom failed: %s", strerror(errno));
    memset(out, 0, sizeof *out);
    int k = snprintf((char *)out->bytes, sizeof out->bytes, "%sstepgraph-%d-", CPU_MAGIC, (int)getpid());
    for (size_t i = 0; i < sizeof r && k + 2 < SG_DIST_ID_BYTES; i++, k += 2)
        snprintf((char *)out->bytes + k, 3, "%02x", r[i]);
    return SG_OK;
}

/* The socket name of the id, or NULL when it is not a CPU id. */
static const char *socket_name(const sg_dist_id *id)
{
    size_t m = strlen(CPU_MAGIC);
    if (memcmp(id->bytes, CPU_MAGIC, m) != 0 || memchr(id->bytes, '\0', SG_DIST_ID_BYTES) == NULL) return NULL;
    return (const char *)id->bytes + m;
}

static cpu_state *state(sg_dist *d) { return d->impl; }

static void close_all(sg_dist *d)
{
    cpu_state *s = state(d);
    if (!s || !s->fd) return;
    for (int r = 0; r < d->world; r++)
        if (s->fd[r] >= 0) close(s->fd[r]), s->fd[r] = -1;
}

/* A transport failure: recorded for the run; the sockets close so that the peers see it. */
static sg_status cpu_fail(sg_dist *d, const char *what)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sg_ctx_last_error(NULL));
    sg_dist_set_failed(d, "%s: %s", what, msg);
    close_all(d);
    return sg_dist_check_failed(d);
}

static sg_status root_accept(sg_dist *d, const char *name, double deadline)
{
    cpu_state *s = state(d);
    int lfd;
    SG_TRY(sg_net_listen_local(name, &lfd));
    sg_status st = SG_OK;
    for (int got = 0; got < d->world - 1 && st == SG_OK;) {
        int fd;
        st = sg_net_accept(lfd, deadline, "the other ranks", &fd);
        if (st != SG_OK) {
            st = sg_fail(NULL, SG_ERR_DIST, "only %d of the %d other ranks connected within %.1f s (did they all "
                         "start, with this id?)", got, d->world - 1, d->timeout_s);
            break;
        }
        hello h;
        st = sg_net_recv(fd, &h, sizeof h, deadline, "a connecting rank");
        if (st == SG_OK && (memcmp(h.magic, "SGDCPU01", 8) || h.world != d->world || h.rank < 1 ||
                            h.rank >= d->world || s->fd[h.rank] >= 0))
            st = sg_fail(NULL, SG_ERR_DIST, "a rank connected as rank %d of %d, but this run has %d ranks%s",
                         h.rank, h.world, d->world, h.rank >= 1 && h.rank < d->world && s->fd[h.rank] >= 0 ?
                         " and that rank is here already" : "");
        if (st != SG_OK) {
            close(fd);
            break;
        }
        s->fd[h.rank] = fd;
        got++;
    }
    close(lfd);
    int32_t ok = 1;
    for (int r = 1; r < d->world && st == SG_OK; r++) st = sg_net_send(s->fd[r], &ok, sizeof ok, deadline, "a rank");
    return st;
}

static sg_status cpu_init(sg_dist *d)
{
    const char *name = socket_name(&d->id);
    if (!name)
        return sg_fail(d->ctx, SG_ERR_INVALID, "sg_dist_create: rank %d: the id was not made for the CPU backend "
                       "(sg_dist_id_create(SG_BACKEND_CPU)); NCCL's ids need the CUDA backend", d->rank);
    cpu_state *s = calloc(1, sizeof *s);
    int *fd = calloc((size_t)d->world, sizeof *fd);
    if (!s || !fd) {
        free(s), free(fd);
        return sg_fail(d->ctx, SG_ERR_OOM, "sg_dist_create: out of host memory");
    }
    for (int r = 0; r < d->world; r++) fd[r] = -1;
    s->fd = fd;
    d->impl = s;
    if (d->world == 1) return SG_OK;
    double deadline = sg_dist_now() + d->timeout_s;
    sg_status st;
    if (d->rank == 0) {
        st = root_accept(d, name, deadline);
    } else {
        st = sg_net_connect_local(name, deadline, &fd[0]);
        hello h;
        memset(&h, 0, sizeof h);
        memcpy(h.magic, "SGDCPU01", 8);
        h.rank = d->rank, h.world = d->world;
        int32_t ok = 0;
        if (st == SG_OK) st = sg_net_send(fd[0], &h, sizeof h, deadline, "rank 0");
        if (st == SG_OK) st = sg_net_recv(fd[0], &ok, sizeof ok, deadline, "rank 0 (waiting for every rank to join)");
    }
    if (st != SG_OK) return cpu_fail(d, "joining the run on local sockets");
    return SG_OK;
}

static void cpu_shutdown(sg_dist *d)
{
    cpu_state *s = state(d);
    if (!s) return;
    close_all(d);
    free(s->fd);
    free(s->buf);
    free(s);
    d->impl = NULL;
}

/* Rank 0's scratch for the other ranks' bytes. */
static sg_status reserve(sg_dist *d, size_t bytes)
{
    cpu_state *s = state(d);
    if (bytes <= s->cap) return SG_OK;
    unsigned char *b = realloc(s->buf, bytes);
    if (!b) return sg_fail(d->ctx, SG_ERR_OOM, "sg_dist: out of host memory for %zu bytes of a collective", bytes);
    s->buf = b, s->cap = bytes;
    return SG_OK;
}

typedef struct coll_args {
    sg_dist *d;
    int op;
    sg_tensor *t, *out;
    int64_t off, count, out_off;
} coll_args;

/* Element i of the bytes at p, read as t's dtype (in double). */
static double ld_at(const sg_tensor *t, const unsigned char *p, int64_t i)
{
    sg_tensor v = *t;
    v.data = (void *)p;
    return sg_ld(&v, i);
}

/* Rank 0 combines the n elements of every rank's bytes (rank r's at in + r * n elements) into
 * res: the average summed in rank order in double and divided once, or the least or greatest
 * (compared as doubles, NaN never chosen over a number), stored in t's dtype. */
static void combine(const coll_args *a, const unsigned char *in, unsigned char *res, int64_t n)
{
    const int W = a->d->world;
    size_t es = sg_dtype_size(a->t->dtype);
    sg_tensor r = *a->t;
    r.data = res;
    for (int64_t i = 0; i < n; i++) {
        double v = ld_at(a->t, in, i);
        for (int k = 1; k < W; k++) {
            double x = ld_at(a->t, in + (size_t)k * (size_t)n * es, i);
            if (a->op == SG_DIST_OP_ALL_REDUCE_MIN) v = x < v || v != v ? x : v;
            else if (a->op == SG_DIST_OP_ALL_REDUCE_MAX) v = x > v || v != v ? x : v;
            else v += x;
        }
        sg_st(&r, i, a->op == SG_DIST_OP_ALL_REDUCE_MIN || a->op == SG_DIST_OP_ALL_REDUCE_MAX ? v : v / W);
    }
}

/* A collective through rank 0: every rank sends it its elements (for ALL_GATHER its share), rank
 * 0 combines them (combine, or for ALL_GATHER puts them in rank order, bits as they are) and
 * sends each rank what it gets (for REDUCE_SCATTER_AVG its share), so every rank gets the same
 * bits. */
static sg_status coll_cpu(sg_ctx *ctx, const void *p)
{
    const coll_args *a = p;
    sg_dist *d = a->d;
    cpu_state *s = state(d);
    SG_TRY(sg_dist_check_failed(d));
    s->calls++;
    const int W = d->world;
    const bool gather = a->op == SG_DIST_OP_ALL_GATHER, scatter = a->op == SG_DIST_OP_REDUCE_SCATTER_AVG;
    const size_t es = sg_dtype_size(a->t->dtype);
    const int64_t share = gather || scatter ? a->count / W : a->count;
    const size_t sent = (size_t)(gather ? share : a->count) * es; /* bytes each rank gives rank 0 */
    const size_t back = (size_t)(scatter ? share : a->count) * es; /* bytes each rank gets back */
    unsigned char *mine = (unsigned char *)a->t->data + (size_t)a->off * es;
    unsigned char *dst = gather || scatter ? (unsigned char *)a->out->data + (size_t)a->out_off * es : mine;
    (void)ctx;
    if (W == 1) {
        if (dst != mine) memmove(dst, mine, back);
        return SG_OK;
    }
    double deadline = sg_dist_now() + d->timeout_s;
    char what[64];
    if (d->rank != 0) {
        if (sg_net_send(s->fd[0], mine, sent, deadline, "rank 0") != SG_OK ||
            sg_net_recv(s->fd[0], dst, back, deadline, "rank 0") != SG_OK)
            return cpu_fail(d, sg_dist_op_name(a->op));
        return SG_OK;
    }
    /* Rank 0: every rank's bytes in rank order, then the result (count elements). */
    SG_TRY(reserve(d, sent * (size_t)W + (size_t)a->count * es));
    unsigned char *in = s->buf, *res = s->buf + sent * (size_t)W;
    memcpy(in, mine, sent);
    for (int r = 1; r < W; r++) {
        snprintf(what, sizeof what, "rank %d", r);
        if (sg_net_recv(s->fd[r], in + (size_t)r * sent, sent, deadline, what) != SG_OK)
            return cpu_fail(d, sg_dist_op_name(a->op));
    }
    if (gather) res = in; /* already in rank order */
    else combine(a, in, res, a->count);
    for (int r = 1; r < W; r++) {
        snprintf(what, sizeof what, "rank %d", r);
        if (sg_net_send(s->fd[r], res + (scatter ? (size_t)r * back : 0), back, deadline, what) != SG_OK)
            return cpu_fail(d, sg_dist_op_name(a->op));
    }
    memcpy(dst, res, back);
    return SG_OK;
}

static sg_status cpu_collective(sg_dist *d, int op, sg_tensor *t, int64_t off, int64_t count, sg_tensor *out,
                                int64_t out_off)
{
    coll_args a = {d, op, t, out, off, count, out_off};
    return sg_cpu_run(d->ctx, coll_cpu, &a, sizeof a);
}

static sg_status cpu_all_gather_host(sg_dist *d, const void *mine, void *all, size_t bytes)
{
    cpu_state *s = state(d);
    SG_TRY(sg_dist_check_failed(d));
    unsigned char *out = all;
    memcpy(out + (size_t)d->rank * bytes, mine, bytes);
    if (d->world == 1) return SG_OK;
    double deadline = sg_dist_now() + d->timeout_s;
    char what[64];
    if (d->rank != 0) {
        if (sg_net_send(s->fd[0], mine, bytes, deadline, "rank 0") != SG_OK ||
            sg_net_recv(s->fd[0], out, bytes * (size_t)d->world, deadline, "rank 0") != SG_OK)
            return cpu_fail(d, "all-gather");
        return SG_OK;
    }
    for (int r = 1; r < d->world; r++) {
        snprintf(what, sizeof what, "rank %d", r);
        if (sg_net_recv(s->fd[r], out + (size_t)r * bytes, bytes, deadline, what) != SG_OK)
            return cpu_fail(d, "all-gather");
    }
    for (int r = 1; r < d->world; r++) {
        snprintf(what, sizeof what, "rank %d", r);
        if (sg_net_send(s->fd[r], out, bytes * (size_t)d->world, deadline, what) != SG_OK)
            return cpu_fail(d, "all-gather");
    }
    return SG_OK;
}

/* One stream of work on the CPU: nothing to fork or join, no watchdog (every wait is bounded). */
static sg_status cpu_nothing(sg_dist *d)
{
    (void)d;
    return SG_OK;
}

static sg_status cpu_group(sg_dist *d, bool begin)
{
    (void)d, (void)begin;
    return SG_OK;
}

static sg_status cpu_mark(sg_dist *d, int k)
{
    (void)d, (void)k;
    return SG_OK;
}

const sg_dist_i sg_dist_cpu = {
    "cpu (local sockets)", cpu_init, cpu_shutdown, cpu_collective, cpu_all_gather_host,
    cpu_nothing, cpu_nothing, cpu_group, cpu_mark, cpu_mark, cpu_mark, cpu_nothing, NULL, NULL,
};
