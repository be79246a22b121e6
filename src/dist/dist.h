/* dist.h: data parallelism's internals. dist.c holds what every transport shares (options,
 * gradient buckets fired by the backward, the record of collectives captured into a graph and
 * the check that every rank captured the same); a transport fills the sg_dist_i table:
 * dist_cpu.c (local sockets, the reference) and dist_nccl.c (NCCL, CUDA builds with NCCL).
 * net.c holds the socket helpers, exchange.c the TCP id exchange, launch.c the launcher. */
#ifndef SG_DIST_H
#define SG_DIST_H

#include "core/core.h"

#include <pthread.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- transports ---- */

typedef struct sg_dist_i {
    const char *name;
    /* Connects to the other ranks (bounded by d->timeout_s). */
    sg_status (*init)(sg_dist *d);
    /* Leaves the run; aborts instead when the run failed. */
    void (*shutdown)(sg_dist *d);
    /* One collective (sg_dist_op) over elements of t, queued on the communication stream
     * (CUDA) or run through sg_cpu_run (CPU), so capture records it:
     *   ALL_REDUCE_AVG / _MIN / _MAX: t[off, off + count) in place (out unused);
     *   REDUCE_SCATTER_AVG: the average of t[off, off + count), whose rank r's share,
     *     elements [off + r * count / world, ..) of it, goes to out[out_off, out_off + count /
     *     world) (t unchanged unless out's range is t's own share);
     *   ALL_GATHER: every rank's t[off, off + count / world) into out[out_off + r * count /
     *     world, ..) in rank order, bits as they are.
     * count is a multiple of the world size for the last two; t and out of one dtype. */
    sg_status (*collective)(sg_dist *d, int op, sg_tensor *t, int64_t off, int64_t count, sg_tensor *out,
                            int64_t out_off);
    /* Eager and blocking, outside capture: every rank's `bytes` of mine into all (world *
     * bytes, in rank order), after the work already queued. */
    sg_status (*all_gather_host)(sg_dist *d, const void *mine, void *all, size_t bytes);
    /* The communication stream waits for the context stream's work so far (fork), and the
     * context stream for the communication stream's (join). Legal during capture. */
    sg_status (*fork)(sg_dist *d);
    sg_status (*join)(sg_dist *d);
    /* The collectives between group(d, true) and group(d, false) go as one launch (an NCCL
     * group: one kernel for a sharded run's all-gathers instead of one per bucket, 333 against
     * 550 us on gpt-768-12 over 2 H200s); the CPU transport runs each as it comes. Legal during
     * capture. group(d, false) after a failed collective still closes the group. */
    sg_status (*group)(sg_dist *d, bool begin);
    /* Marks on the communication stream, for a join at one point of it instead of its end:
     * marks(d, n) makes n of them (eagerly, at attach); mark(d, k) records mark k after the
     * work queued there so far, wait(d, k) makes the context stream wait for it. Legal during
     * capture; no-ops on the CPU transport. */
    sg_status (*marks)(sg_dist *d, int n);
    sg_status (*mark)(sg_dist *d, int k);
    sg_status (*wait)(sg_dist *d, int k);
    /* After each training step (outside capture): a progress mark for the watchdog. */
    sg_status (*step_end)(sg_dist *d);
    /* Experimental (STEPGRAPH_NCCL_CE=1): `bytes` of device memory NCCL's copy engines can
     * gather into, registered with every rank as a symmetric window (a collective: every rank
     * calls it, in the same order); *win is the registration. NULL where there is none. */
    sg_status (*window_alloc)(sg_dist *d, size_t bytes, void **ptr, void **win);
    void (*window_free)(sg_dist *d, void *ptr, void *win);
} sg_dist_i;

extern const sg_dist_i sg_dist_cpu;
#ifdef SG_HAVE_NCCL
extern const sg_dist_i sg_dist_nccl;
sg_status sg_dist_nccl_id(sg_dist_id *out);
#endif
/* The CPU transport's ids: a magic prefix and a local socket name. */
sg_status sg_dist_cpu_id(sg_dist_id *out);

/* ---- the record of captured collectives ---- */

typedef enum sg_dist_op {
    SG_DIST_OP_ALL_REDUCE_AVG = 1,
    SG_DIST_OP_REDUCE_SCATTER_AVG,
    SG_DIST_OP_ALL_GATHER,
    SG_DIST_OP_ALL_REDUCE_MIN,
    SG_DIST_OP_ALL_REDUCE_MAX,
} sg_dist_op;
/* "all_reduce(avg)", "reduce_scatter(avg)", ...: what the capture check's messages call op. */
const char *sg_dist_op_name(int op);

/* One collective as every rank must capture it. */
typedef struct sg_dist_coll {
    int32_t op;                /* sg_dist_op */
    int32_t dtype;             /* sg_dtype */
    int64_t offset, count;     /* elements of the tensor */
    char tensor[24];           /* its name */
} sg_dist_coll;

#define SG_DIST_RECORD 64      /* collectives a rank sends whole for the check; the rest hashed */

/* One bucket of the backward's gradients, fixed at sg_dist_attach: grads[lo, hi), sent after
 * child `child`'s backward (-1: at sg_dist_backward_end). With a sharded optimizer, hi - lo is a
 * multiple of 4 x world and rank r owns its share [lo + r * s, lo + (r + 1) * s), s = (hi - lo)
 * / world, kept at shard_off in the compact buffers (sg_dist_shard_layout). */
typedef struct sg_dist_bucket {
    int64_t lo, hi, shard_off;
    int child;
} sg_dist_bucket;
#define SG_DIST_GATHER_BYTES 4096 /* the most a rank contributes to all_gather_host */

struct sg_dist {
    sg_ctx *ctx;
    const sg_dist_i *vt;
    int rank, world;
    sg_dist_id id;
    size_t bucket_bytes;
    double timeout_s;
    void *impl;                /* the transport's state */
    /* Failure: set once (by any thread), read by every later call. */
    pthread_mutex_t fail_mu;
    volatile int failed;
    char fail_msg[768];
    /* Attached gradients (sg_dist_attach): the flat buffer, the loss, and after child i's
     * backward, elements [ready[i], numel) of grads are final. */
    sg_tensor *grads, *loss;
    int64_t *ready;
    int n_ready;
    bool in_backward;
    /* The buckets, in the order the backward sends them; next_plan: the first not yet sent
     * this backward. Sharded (shard_out set): each bucket reduce-scattered into shard_out at
     * its shard_off, and grads[tail_lo, numel) (fewer than 4 x world elements) all-reduced
     * whole at the end; shard_numel: the compact buffers' elements (the shares, then the tail). */
    sg_dist_bucket *plan;
    int n_plan, next_plan;
    bool shard;
    sg_tensor *shard_out;
    int64_t tail_lo, shard_numel;
    int gather_left;           /* sg_dist_gather_begin's buckets the context has not waited for */
    int buckets, last_buckets;
    uint64_t step_bytes, last_bytes;
    /* Capture: the collectives queued while ctx captures. */
    bool recording;
    sg_dist_coll rec[SG_DIST_RECORD];
    int n_rec;
    uint64_t rec_hash;
    int inject_rank;           /* test hook SG_DIST_INJECT_SEQ: this rank captures differently */
    sg_dist_stats st;
};

/* Records the run's failure (the first one wins; "sg_dist: rank r of n: " is prepended) and
 * returns SG_ERR_DIST. Thread-safe (the watchdog calls it); does not touch the context. */
sg_status sg_dist_set_failed(sg_dist *d, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* On the calling (context's) thread: SG_OK, or the recorded failure, its message put on the
 * context. */
sg_status sg_dist_check_failed(sg_dist *d);
double sg_dist_now(void);
/* The thread's last message (sg_fail(NULL, ...)) behind a prefix: "prefix: message". */
sg_status sg_dist_wrap(sg_status st, const char *prefix);

/* ---- what the trainer calls ---- */

/* Gradients to average: grads (the flat buffer, F32 or BF16), loss (averaged too, so every
 * rank reports the global batch's loss), and ready[i] for each of the n children of the
 * model's Sequential: after child i's backward, grads[ready[i] ..] are final. The buckets are
 * planned here. shard: for a sharded optimizer (buckets of multiples of 4 x world elements,
 * reduce-scattered once sg_dist_set_shard_out names where). */
sg_status sg_dist_attach(sg_dist *d, sg_tensor *grads, sg_tensor *loss, const int64_t *ready, int n, bool shard);
/* A sharded run's layout (sg_dist_shard_layout): the buckets (owned by d); the tail, grads[tail_lo,
 * tail_lo + tail_n), which every rank holds whole, at tail_off in the compact buffers (after the
 * shares); and the compact buffers' element count (tail_off + tail_n). sg_dist_set_shard_out
 * names the compact gradients (grads' dtype, numel elements) the backward's reduce-scatters
 * write, and sg_dist_backward_end the tail. */
typedef struct sg_dist_layout {
    const sg_dist_bucket *plan;
    int n_plan;
    int64_t tail_lo, tail_n, tail_off, numel;
} sg_dist_layout;
sg_dist_layout sg_dist_shard_layout(const sg_dist *d);
sg_status sg_dist_set_shard_out(sg_dist *d, sg_tensor *shard_out);
/* Queued on the collectives' stream between a fork and a join of the context's: a sharded
 * step's scaler agreement (found: max; scale, good steps: min; skipped: max), and the
 * all-gather of every bucket's shares from src (compact, src's dtype) into dst (flat), the
 * tail copied (every rank holds it whole). */
sg_status sg_dist_agree_scaler(sg_dist *d, sg_tensor *found, sg_tensor *scaler);
sg_status sg_dist_gather_shards(sg_dist *d, sg_tensor *src, sg_tensor *dst);
/* Queued the same way: every rank's mine (n elements) into all (world x n, mine's dtype) in rank
 * order, bits as they are (a sharded clip's sums of squares, each an f64's bytes). */
sg_status sg_dist_gather_bits(sg_dist *d, sg_tensor *mine, sg_tensor *all);
/* The same gather ahead of the forward that reads it (as FSDP prefetches): begin queues every
 * bucket's all-gather in the forward's order (a mark after each); sg_dist_forward_hook before
 * child i's forward makes the context's stream wait for the buckets that hold its parameters,
 * so each layer's forward overlaps the gathers of the layers after it; end waits for the rest
 * (after the forward). */
sg_status sg_dist_gather_begin(sg_dist *d, sg_tensor *src, sg_tensor *dst);
sg_status sg_dist_forward_hook(void *dist, int child);
sg_status sg_dist_gather_end(sg_dist *d);
/* Experimental: the transport's window_alloc / window_free; SG_ERR_UNSUPPORTED without them
 * (sg_dist_has_windows says). */
bool sg_dist_has_windows(const sg_dist *d);
sg_status sg_dist_window_alloc(sg_dist *d, size_t bytes, void **ptr, void **win);
void sg_dist_window_free(sg_dist *d, void *ptr, void *win);
void sg_dist_detach(sg_dist *d);
/* Around the model's backward: begin, then sg_dist_backward_hook after each child (buckets
 * of at least bucket_bytes are all-reduced on the second stream as soon as they are final;
 * begin queues the loss's first), then end: the rest, and the join before the optimizer. */
sg_status sg_dist_backward_begin(sg_dist *d);
sg_status sg_dist_backward_hook(void *dist, int child);
sg_status sg_dist_backward_end(sg_dist *d);
/* Around a capture: begin starts the record; check, on every rank after its capture (local:
 * its status), compares the records of all ranks and returns SG_OK only when every rank
 * captured, and captured the same collectives; otherwise an error naming the first
 * difference (or the rank whose capture failed, with its message). */
void sg_dist_capture_begin(sg_dist *d);
sg_status sg_dist_capture_check(sg_dist *d, const char *graph, sg_status local);
/* After every training step, outside capture. */
sg_status sg_dist_step_end(sg_dist *d);

/* ---- sockets (net.c): blocking calls bounded by an absolute deadline (sg_dist_now) ---- */

/* Sends / receives exactly n bytes; SG_ERR_DIST on EOF, error or the deadline (what names
 * the peer in the message, e.g. "rank 1"). */
sg_status sg_net_send(int fd, const void *buf, size_t n, double deadline, const char *what);
sg_status sg_net_recv(int fd, void *buf, size_t n, double deadline, const char *what);
/* "HOST:PORT" into host and port; SG_ERR_INVALID when malformed. */
sg_status sg_net_parse_addr(const char *addr, char *host, size_t host_n, char *port, size_t port_n);
/* A TCP listener on addr; a connection to addr, retried while refused until the deadline. */
sg_status sg_net_listen_tcp(const char *addr, int *fd);
sg_status sg_net_connect_tcp(const char *addr, double deadline, int *fd);
/* Accepts one connection on a listener before the deadline. */
sg_status sg_net_accept(int lfd, double deadline, const char *what, int *fd);
/* Local (abstract Unix) sockets named by name: the CPU transport. */
sg_status sg_net_listen_local(const char *name, int *fd);
sg_status sg_net_connect_local(const char *name, double deadline, int *fd);

/* ---- exchange.c: the TCP id exchange, keeping its connections for the launcher ---- */

typedef struct sg_dist_link {
    int fd[64];                /* node 0: one per other node, by node rank (fd[0] unused) */
    int n;                     /* nodes */
    int master_fd;             /* other nodes: the connection to node 0 */
} sg_dist_link;

sg_status sg_dist_exchange_open(const char *master, int nnodes, int node_rank, int local_world,
                                double timeout_s, sg_dist_id *id, sg_dist_link *link);
void sg_dist_link_close(sg_dist_link *link);

/* ---- launch.c: sg_dist_launch (stepgraph.h) and signals ----
 * From its first fork to its last reap, sg_dist_launch holds SIGINT and SIGTERM (unless the
 * caller ignores them; its handlers come back before it returns; one launch at a time per
 * process). The first stops the run as a worker's failure would (SIGTERM to its workers, and
 * to the other nodes' through their launchers; SIGKILL after grace_s), a second kills the
 * workers at once. The call then fails with SG_ERR_DIST, "sg_dist_launch: interrupted
 * (SIGINT): stopped N workers", and the result says so: interrupted_by the signal, failed_rank
 * -1, failed_node -1 and exit_status 128 + the signal, which the CLI exits with (130, 143); a
 * node interrupted elsewhere reports interrupted_by 0, exit_status 0 and its failed_node. Each
 * worker gets SIGTERM when the launcher dies (PR_SET_PDEATHSIG), and one
 * whose launcher died before that was in place does not start. */

#ifdef __cplusplus
}
#endif
#endif
