/* test_dist.c: data parallelism. `cpu`: ids and their hex form; the id exchange over TCP
 * loopback between several processes (every node gets node 0's id) and its errors, each within
 * a bounded time (a malformed address, a name that does not resolve, refused connections, a
 * listener that never answers, a node that never comes, nodes that disagree); the launcher
 * (each worker's environment; a failing worker is named and stops the others; two hosts on
 * loopback, where a failure on one stops the other; SIGTERM or SIGINT to a launcher stops its
 * workers and is reported as such, a second signal kills them at once, the caller's handlers
 * come back, and workers end when their launcher is killed outright); then training over the CPU transport: 2
 * ranks with global batch B match 1 rank with batch B over 20 steps under every scope (and
 * with gradient accumulation: the step's sum averaged once, after its last micro-batch), the
 * check catches a rank that captured other collectives, and a rank that dies makes the other
 * fail within the timeout instead of hanging. `gpu` (2 GPUs and NCCL, else skipped): the same
 * training checks over NCCL, eager and step scope, for mlp-64-2-32 and a small gpt.
 * Workers are this program again, started by the launcher: `test_dist worker ...`. */
#define _GNU_SOURCE

#include "testutil.h"
#include "dist/dist.h"
#include "nn/nn.h"
#include "train/model.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define STEPS 20

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A TCP port on 127.0.0.1 that nobody listens on (now). */
static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(s, (struct sockaddr *)&a, &len) != 0) {
        fprintf(stderr, "FAIL: no free port: %s\n", strerror(errno));
        exit(1);
    }
    close(s);
    return ntohs(a.sin_port);
}

static sg_dist_id fake_id(void)
{
    sg_dist_id id;
    for (int i = 0; i < SG_DIST_ID_BYTES; i++) id.bytes[i] = (unsigned char)tu_next();
    return id;
}

/* ---- a call in a child process, its result sent back through a pipe ---- */

typedef struct result {
    int status;
    double secs;
    sg_dist_id id;
    sg_dist_launch_result launch;
    bool restored;             /* the signal cases: the caller's handlers were back afterwards */
    char msg[1024];
} result;

typedef struct child {
    pid_t pid;
    int fd;
} child;

typedef struct exchange_args {
    char master[64];
    int nnodes, node_rank, local_world;
    double timeout;
    sg_dist_id id;
} exchange_args;

static child spawn(void (*fn)(const void *, result *), const void *args)
{
    int p[2];
    if (pipe(p) != 0) exit(1);
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        result r;
        memset(&r, 0, sizeof r);
        double t0 = now_s();
        fn(args, &r);
        r.secs = now_s() - t0;
        snprintf(r.msg, sizeof r.msg, "%s", sg_ctx_last_error(NULL));
        if (write(p[1], &r, sizeof r) != (ssize_t)sizeof r) _exit(2);
        _exit(0);
    }
    close(p[1]);
    return (child){pid, p[0]};
}

static result collect(child c)
{
    result r;
    memset(&r, 0, sizeof r);
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t k = read(c.fd, (char *)&r + got, sizeof r - got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(c.fd);
    int wst;
    waitpid(c.pid, &wst, 0);
    if (got != sizeof r) {
        r.status = -1;
        snprintf(r.msg, sizeof r.msg, "the child process ended without a result");
    }
    return r;
}

static void do_exchange(const void *p, result *r)
{
    const exchange_args *a = p;
    r->id = a->id;
    r->status = sg_dist_exchange_id(a->master, a->nnodes, a->node_rank, a->local_world, a->timeout, &r->id);
}

static child exchange(const char *master, int nnodes, int node_rank, int local_world, double timeout,
                      sg_dist_id id)
{
    exchange_args a = {"", nnodes, node_rank, local_world, timeout, id};
    snprintf(a.master, sizeof a.master, "%s", master);
    return spawn(do_exchange, &a);
}

/* ---- ids, hex, environment ---- */

static void cpu_ids(void)
{
    sg_dist_id a, b, c;
    TU_OK(NULL, sg_dist_id_create(SG_BACKEND_CPU, &a));
    TU_OK(NULL, sg_dist_id_create(SG_BACKEND_CPU, &b));
    TU_CHECK(memcmp(&a, &b, sizeof a) != 0, "two CPU ids are the same");
    char hex[2 * SG_DIST_ID_BYTES + 1];
    sg_dist_id f = fake_id();
    sg_dist_id_to_hex(&f, hex);
    TU_CHECK(strlen(hex) == 2 * SG_DIST_ID_BYTES, "hex of %zu characters", strlen(hex));
    TU_OK(NULL, sg_dist_id_from_hex(hex, &c));
    TU_CHECK(memcmp(&c, &f, sizeof c) == 0, "hex round trip changed the id");
    TU_FAILS(NULL, sg_dist_id_from_hex("abc", &c), SG_ERR_INVALID, "expected 256 hex digits");
    hex[10] = 'g';
    TU_FAILS(NULL, sg_dist_id_from_hex(hex, &c), SG_ERR_INVALID, "is not a hex byte");
    TU_FAILS(NULL, sg_dist_id_create(SG_BACKEND_AUTO, &c), SG_ERR_INVALID, "expected cpu or cuda");

    sg_dist_env e;
    int found = 1;
    unsetenv("SG_DIST_RANK");
    TU_OK(NULL, sg_dist_env_read(&e, &found));
    TU_CHECK(found == 0, "no SG_DIST_RANK, yet found");
    setenv("SG_DIST_RANK", "1", 1);
    setenv("SG_DIST_WORLD", "2", 1);
    TU_FAILS(NULL, sg_dist_env_read(&e, &found), SG_ERR_INVALID, "SG_DIST_LOCAL_WORLD is unset");
    setenv("SG_DIST_LOCAL_WORLD", "2", 1);
    setenv("SG_DIST_LOCAL_RANK", "1", 1);
    sg_dist_id_to_hex(&f, hex);
    setenv("SG_DIST_ID", hex, 1);
    TU_OK(NULL, sg_dist_env_read(&e, &found));
    TU_CHECK(found == 1 && e.rank == 1 && e.world == 2 && e.local_rank == 1 && !memcmp(&e.id, &f, sizeof f),
             "environment read as rank %d of %d", e.rank, e.world);
    setenv("SG_DIST_RANK", "2", 1);
    TU_FAILS(NULL, sg_dist_env_read(&e, &found), SG_ERR_INVALID, "SG_DIST_RANK is '2'");
    const char *vars[] = {"SG_DIST_RANK", "SG_DIST_WORLD", "SG_DIST_LOCAL_RANK", "SG_DIST_LOCAL_WORLD", "SG_DIST_ID"};
    for (int i = 0; i < 5; i++) unsetenv(vars[i]);
}

/* ---- the id exchange over TCP loopback ---- */

static void cpu_exchange(void)
{
    char master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    sg_dist_id id = fake_id(), none;
    memset(&none, 0, sizeof none);
    /* Nodes 1..3 start before node 0: they retry while refused. */
    child c[4];
    for (int n = 1; n < 4; n++) c[n] = exchange(master, 4, n, 2, 20, none);
    usleep(200000);
    c[0] = exchange(master, 4, 0, 2, 20, id);
    for (int n = 0; n < 4; n++) {
        result r = collect(c[n]);
        TU_CHECK(r.status == SG_OK, "node %d: %s", n, r.msg);
        TU_CHECK(memcmp(&r.id, &id, sizeof id) == 0, "node %d received another id than node 0's", n);
    }

    /* Nodes that disagree: every node hears why. */
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    c[1] = exchange(master, 2, 1, 3, 10, none);
    c[0] = exchange(master, 2, 0, 2, 10, id);
    result r0 = collect(c[0]), r1 = collect(c[1]);
    TU_CHECK(r0.status == SG_ERR_DIST && strstr(r0.msg, "node 1 runs 3 workers (--gpus), node 0 runs 2"),
             "mismatched --gpus, node 0: %d %s", r0.status, r0.msg);
    TU_CHECK(r1.status == SG_ERR_DIST && strstr(r1.msg, "stopped the run: node 1 runs 3 workers"),
             "mismatched --gpus, node 1: %d %s", r1.status, r1.msg);
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    c[1] = exchange(master, 3, 1, 2, 10, none);
    usleep(100000);
    c[2] = exchange(master, 3, 1, 2, 10, none);
    c[0] = exchange(master, 3, 0, 2, 10, id);
    r0 = collect(c[0]);
    collect(c[1]), collect(c[2]);
    TU_CHECK(r0.status == SG_ERR_DIST && strstr(r0.msg, "two nodes were started with --node-rank 1"),
             "duplicate node rank: %d %s", r0.status, r0.msg);

    /* Bad addresses fail at once, or within the timeout; never later. */
    TU_FAILS(NULL, sg_dist_exchange_id("127.0.0.1", 2, 1, 1, 1, &none), SG_ERR_INVALID, "expected HOST:PORT");
    TU_FAILS(NULL, sg_dist_exchange_id("127.0.0.1:99999", 2, 1, 1, 1, &none), SG_ERR_INVALID, "port from 1 to 65535");
    double t0 = now_s();
    TU_FAILS(NULL, sg_dist_exchange_id("no-such-host.invalid:29500", 2, 1, 1, 2, &none), SG_ERR_DIST,
             "cannot resolve 'no-such-host.invalid'");
    TU_CHECK(now_s() - t0 < 30, "an unresolvable name took %.1f s", now_s() - t0);
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    t0 = now_s();
    TU_FAILS(NULL, sg_dist_exchange_id(master, 2, 1, 1, 1.5, &none), SG_ERR_DIST, "Connection refused");
    double dt = now_s() - t0;
    TU_CHECK(dt >= 1.0 && dt < 6, "refused connections: gave up after %.1f s, expected about the 1.5 s timeout", dt);

    /* A listener that accepts (in the kernel's backlog) but never answers. */
    int port = free_port();
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    TU_CHECK(l >= 0 && bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 8) == 0, "silent listener: %s",
             strerror(errno));
    snprintf(master, sizeof master, "127.0.0.1:%d", port);
    t0 = now_s();
    TU_FAILS(NULL, sg_dist_exchange_id(master, 2, 1, 1, 1.5, &none), SG_ERR_DIST, "no answer from node 0");
    dt = now_s() - t0;
    TU_CHECK(dt >= 1.0 && dt < 6, "silent listener: gave up after %.1f s, expected about 1.5 s", dt);
    close(l);

    /* Node 0 waits for a node that never comes: bounded, naming the missing one; the node that
     * came hears that the run stopped. */
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    c[1] = exchange(master, 3, 1, 1, 5, none);
    c[0] = exchange(master, 3, 0, 1, 1.5, id);
    r0 = collect(c[0]), r1 = collect(c[1]);
    TU_CHECK(r0.status == SG_ERR_DIST && strstr(r0.msg, "only 1 of the 2 other nodes") &&
             strstr(r0.msg, "missing node ranks: 2") && r0.secs < 6,
             "missing node: %d after %.1f s: %s", r0.status, r0.secs, r0.msg);
    TU_CHECK(r1.status == SG_ERR_DIST && strstr(r1.msg, "stopped the run") && r1.secs < 6,
             "the node that came: %d after %.1f s: %s", r1.status, r1.secs, r1.msg);
}

/* ---- the launcher ---- */

typedef struct launch_args {
    sg_dist_launch_options o;
    char master[64];
    char script[1024];
} launch_args;

static void do_launch(const void *p, result *r)
{
    launch_args a = *(const launch_args *)p;
    char *argv[] = {"/bin/sh", "-c", a.script, NULL};
    a.o.argv = argv;
    a.o.master = a.master[0] ? a.master : NULL;
    r->status = sg_dist_launch(&a.o, &r->launch);
}

static launch_args launch_setup(int local_world, int nnodes, int node_rank, const char *master, sg_dist_id id,
                                const char *script)
{
    launch_args a;
    memset(&a, 0, sizeof a);
    a.o.local_world = local_world, a.o.nnodes = nnodes, a.o.node_rank = node_rank, a.o.id = id;
    a.o.timeout_s = 20, a.o.grace_s = 2;
    snprintf(a.master, sizeof a.master, "%s", master ? master : "");
    snprintf(a.script, sizeof a.script, "%s", script);
    return a;
}

static child launch(int local_world, int nnodes, int node_rank, const char *master, sg_dist_id id,
                    const char *script)
{
    launch_args a = launch_setup(local_world, nnodes, node_rank, master, id, script);
    return spawn(do_launch, &a);
}

/* Each worker of a finished launch wrote "rank world local_rank local_world id" to dir/rank.R. */
static void check_env_files(const char *dir, int world, int local_world, const sg_dist_id *id)
{
    char hex[2 * SG_DIST_ID_BYTES + 1];
    sg_dist_id_to_hex(id, hex);
    for (int r = 0; r < world; r++) {
        char path[512], got_hex[300] = "";
        snprintf(path, sizeof path, "%s/rank.%d", dir, r);
        FILE *f = fopen(path, "r");
        int rank = -1, w = -1, lr = -1, lw = -1;
        if (f) {
            if (fscanf(f, "%d %d %d %d %299s", &rank, &w, &lr, &lw, got_hex) != 5) rank = -2;
            fclose(f);
        }
        TU_CHECK(rank == r && w == world && lr == r % local_world && lw == local_world,
                 "rank %d's worker saw rank %d, world %d, local rank %d of %d", r, rank, w, lr, lw);
        TU_CHECK(!strcmp(got_hex, hex), "rank %d's worker got another id", r);
    }
}

static void cpu_launcher(void)
{
    char dir[] = "/tmp/sg_test_dist_XXXXXX";
    TU_CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    char script[1024];
    sg_dist_id id = fake_id();
    snprintf(script, sizeof script, "echo $SG_DIST_RANK $SG_DIST_WORLD $SG_DIST_LOCAL_RANK $SG_DIST_LOCAL_WORLD "
             "$SG_DIST_ID > %s/rank.$SG_DIST_RANK", dir);
    result r = collect(launch(3, 1, 0, NULL, id, script));
    TU_CHECK(r.status == SG_OK && r.launch.failed_rank == -1, "launch of 3 workers: %s", r.msg);
    check_env_files(dir, 3, 3, &id);

    /* Rank 1 fails: the launcher names it and stops the others long before their sleep ends (it
     * returns once it has reaped every worker). The others exec sleep, so no grandchild outlives
     * them holding the test's output open. */
    snprintf(script, sizeof script, "if [ $SG_DIST_RANK = 1 ]; then sleep 0.3; exit 3; fi; exec sleep 30");
    r = collect(launch(3, 1, 0, NULL, id, script));
    TU_CHECK(r.status == SG_ERR_DIST && r.launch.failed_rank == 1 && r.launch.exit_status == 3 &&
             strstr(r.msg, "rank 1 (GPU 1) exited with status 3; stopped the other workers"),
             "a failing worker: status %d, rank %d, exit %d: %s", r.status, r.launch.failed_rank,
             r.launch.exit_status, r.msg);
    TU_CHECK(r.secs < 10, "the launcher took %.1f s to stop the workers", r.secs);
    /* A worker killed by a signal; one that ignores SIGTERM is killed after the grace period. */
    snprintf(script, sizeof script, "if [ $SG_DIST_RANK = 0 ]; then sleep 0.3; kill -9 $$; fi; trap '' TERM; "
             "exec sleep 30");
    r = collect(launch(2, 1, 0, NULL, id, script));
    TU_CHECK(r.status == SG_ERR_DIST && r.launch.failed_rank == 0 && r.launch.exit_status == 128 + 9 &&
             strstr(r.msg, "rank 0 (GPU 0) was killed by signal 9"), "a killed worker: %s", r.msg);
    TU_CHECK(r.secs < 10, "the launcher took %.1f s with a worker ignoring SIGTERM (grace 2 s)", r.secs);
    /* A program that cannot run. */
    sg_dist_launch_options o;
    memset(&o, 0, sizeof o);
    char *bad[] = {"/nonexistent/worker", NULL};
    o.local_world = 1, o.argv = bad;
    TU_FAILS(NULL, sg_dist_launch(&o, NULL), SG_ERR_INVALID, "cannot execute '/nonexistent/worker'");
    o.local_world = 0;
    TU_FAILS(NULL, sg_dist_launch(&o, NULL), SG_ERR_INVALID, "expected 1 to 64 workers");

    /* Two hosts on loopback, two workers each: ranks 0..3 and node 0's id everywhere. */
    char master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    snprintf(script, sizeof script, "echo $SG_DIST_RANK $SG_DIST_WORLD $SG_DIST_LOCAL_RANK $SG_DIST_LOCAL_WORLD "
             "$SG_DIST_ID > %s/rank.$SG_DIST_RANK", dir);
    sg_dist_id other = fake_id();
    child n1 = launch(2, 2, 1, master, other, script);
    child n0 = launch(2, 2, 0, master, id, script);
    result r0 = collect(n0), r1 = collect(n1);
    TU_CHECK(r0.status == SG_OK && r1.status == SG_OK, "two nodes: %s / %s", r0.msg, r1.msg);
    check_env_files(dir, 4, 2, &id);

    /* Rank 3 (node 1) fails: both launchers say so, and node 0's workers stop too. */
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    snprintf(script, sizeof script, "if [ $SG_DIST_RANK = 3 ]; then sleep 0.5; exit 5; fi; exec sleep 30");
    n1 = launch(2, 2, 1, master, other, script);
    n0 = launch(2, 2, 0, master, id, script);
    r0 = collect(n0), r1 = collect(n1);
    TU_CHECK(r0.status == SG_ERR_DIST && r0.launch.failed_rank == 3 && r0.launch.failed_node == 1 &&
             strstr(r0.msg, "rank 3 on node 1 exited with status 5; stopped the workers of every node"),
             "node 0 after rank 3 failed: %s", r0.msg);
    TU_CHECK(r1.status == SG_ERR_DIST && strstr(r1.msg, "rank 3 (GPU 1) exited with status 5"),
             "node 1 after rank 3 failed: %s", r1.msg);
    TU_CHECK(r0.secs < 12 && r1.secs < 12, "stopping two nodes took %.1f / %.1f s", r0.secs, r1.secs);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) { /* a leftover temporary directory */ }
}

/* ---- the launcher under signals ---- */

static void mark_signal(int sig) { (void)sig; }

/* A launch whose caller holds SIGINT and SIGTERM itself (so neither is ignored, whatever the
 * test's own parent did), and finds its handlers back once the launch returns. */
static void do_signalled_launch(const void *p, result *r)
{
    struct sigaction mine, now_int, now_term;
    memset(&mine, 0, sizeof mine);
    mine.sa_handler = mark_signal;
    sigemptyset(&mine.sa_mask);
    sigaction(SIGINT, &mine, NULL);
    sigaction(SIGTERM, &mine, NULL);
    do_launch(p, r);
    sigaction(SIGINT, NULL, &now_int);
    sigaction(SIGTERM, NULL, &now_term);
    r->restored = now_int.sa_handler == mark_signal && now_term.sa_handler == mark_signal;
}

/* The pids the n workers wrote to dir/TAG.RANK (the worker script below), within 20 s. */
static bool worker_pids(const char *dir, const char *tag, int first, int n, pid_t *pids)
{
    double end = now_s() + 20;
    for (;;) {
        int got = 0;
        for (int i = 0; i < n; i++) {
            char path[600];
            snprintf(path, sizeof path, "%s/%s.%d", dir, tag, first + i);
            FILE *f = fopen(path, "r");
            long v = 0;
            if (f && fscanf(f, "%ld", &v) == 1 && v > 0) pids[i] = (pid_t)v, got++;
            if (f) fclose(f);
        }
        if (got == n) return true;
        if (now_s() > end) return false;
        usleep(10000);
    }
}

/* A worker that says its pid (written whole, then renamed) and sleeps 30 s, as its own
 * process (exec), so signalling it reaches the sleep; ignoring SIGTERM when asked. */
static void pid_script(char *out, size_t n, const char *dir, const char *tag, bool ignore_term)
{
    snprintf(out, n, "%secho $$ > %s/%s.$SG_DIST_RANK.tmp && mv %s/%s.$SG_DIST_RANK.tmp %s/%s.$SG_DIST_RANK; "
             "exec sleep 30", ignore_term ? "trap '' TERM; " : "", dir, tag, dir, tag, dir, tag);
}

static bool gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

static void cpu_launcher_signals(void)
{
    char dir[] = "/tmp/sg_test_dist_XXXXXX";
    TU_CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    char script[1024];
    sg_dist_id id = fake_id();
    pid_t w[4];

    /* SIGTERM: both workers stopped, the call says so, -1 / 143 / -1 in the result. */
    pid_script(script, sizeof script, dir, "term", false);
    launch_args a = launch_setup(2, 1, 0, NULL, id, script);
    child c = spawn(do_signalled_launch, &a);
    bool started = worker_pids(dir, "term", 0, 2, w);
    TU_CHECK(started, "SIGTERM case: the workers did not start within 20 s");
    kill(c.pid, SIGTERM);
    result r = collect(c);
    TU_CHECK(r.status == SG_ERR_DIST && r.launch.failed_rank == -1 && r.launch.failed_node == -1 &&
             r.launch.exit_status == 128 + SIGTERM && r.launch.interrupted_by == SIGTERM &&
             strstr(r.msg, "interrupted (SIGTERM): stopped 2 workers"),
             "SIGTERM to the launcher: status %d, rank %d, node %d, exit %d: %s", r.status, r.launch.failed_rank,
             r.launch.failed_node, r.launch.exit_status, r.msg);
    TU_CHECK(r.secs < 10, "the launcher took %.1f s to stop its workers on SIGTERM", r.secs);
    TU_CHECK(started && gone(w[0]) && gone(w[1]), "a worker outlived its launcher's SIGTERM");
    TU_CHECK(r.restored, "the caller's SIGINT and SIGTERM handlers were not restored after the launch");

    /* SIGINT, workers that ignore SIGTERM, a 30 s grace period: SIGINT again (until the
     * launcher answers) kills them at once. */
    pid_script(script, sizeof script, dir, "int", true);
    a = launch_setup(2, 1, 0, NULL, id, script);
    a.o.grace_s = 30;
    c = spawn(do_signalled_launch, &a);
    started = worker_pids(dir, "int", 0, 2, w);
    TU_CHECK(started, "SIGINT case: the workers did not start within 20 s");
    double end = now_s() + 10;
    struct pollfd pf = {c.fd, POLLIN, 0};
    do kill(c.pid, SIGINT);
    while (poll(&pf, 1, 100) == 0 && now_s() < end);
    r = collect(c);
    TU_CHECK(r.status == SG_ERR_DIST && r.launch.failed_rank == -1 && r.launch.exit_status == 128 + SIGINT &&
             r.launch.interrupted_by == SIGINT &&
             strstr(r.msg, "interrupted (SIGINT): stopped 2 workers (2 with SIGKILL, after a second signal)"),
             "SIGINT twice to the launcher: status %d, exit %d: %s", r.status, r.launch.exit_status, r.msg);
    TU_CHECK(r.secs < 15, "a second SIGINT took %.1f s to end workers that ignore SIGTERM (grace 30 s)", r.secs);
    TU_CHECK(started && gone(w[0]) && gone(w[1]), "a worker outlived its launcher's second SIGINT");

    /* Two hosts: SIGTERM to node 0's launcher stops node 1's workers too, and node 1 says why. */
    char master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
    pid_script(script, sizeof script, dir, "nodes", false);
    launch_args a1 = launch_setup(2, 2, 1, master, fake_id(), script);
    a = launch_setup(2, 2, 0, master, id, script);
    child n1 = spawn(do_signalled_launch, &a1), n0 = spawn(do_signalled_launch, &a);
    started = worker_pids(dir, "nodes", 0, 4, w);
    TU_CHECK(started, "two nodes: the 4 workers did not start within 20 s");
    kill(n0.pid, SIGTERM);
    result r0 = collect(n0), r1 = collect(n1);
    TU_CHECK(r0.status == SG_ERR_DIST && r0.launch.exit_status == 128 + SIGTERM &&
             strstr(r0.msg, "interrupted (SIGTERM): stopped 2 workers and told the other nodes"),
             "node 0 after its SIGTERM: %s", r0.msg);
    TU_CHECK(r1.status == SG_ERR_DIST && r1.launch.failed_rank == -1 && r1.launch.exit_status == 0 &&
             r1.launch.interrupted_by == 0 &&
             r1.launch.failed_node == 0 && strstr(r1.msg, "node 0's launcher was interrupted (SIGTERM)"),
             "node 1 after node 0's SIGTERM: exit %d, node %d: %s", r1.launch.exit_status,
             r1.launch.failed_node, r1.msg);
    TU_CHECK(r0.secs < 12 && r1.secs < 12, "stopping two nodes on SIGTERM took %.1f / %.1f s", r0.secs, r1.secs);
    for (int i = 0; i < 4; i++) TU_CHECK(started && gone(w[i]), "rank %d outlived the SIGTERM to node 0", i);

    /* SIGKILL: the launcher cannot act, its workers' parent-death signal (SIGTERM) ends them.
     * This process adopts them meanwhile (a subreaper) to see how they ended. */
    TU_CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0, "PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
    pid_script(script, sizeof script, dir, "kill", false);
    c = launch(2, 1, 0, NULL, id, script);
    started = worker_pids(dir, "kill", 0, 2, w);
    TU_CHECK(started, "SIGKILL case: the workers did not start within 20 s");
    kill(c.pid, SIGKILL);
    int wst;
    waitpid(c.pid, &wst, 0);
    close(c.fd);
    for (int i = 0; i < 2 && started; i++) {
        end = now_s() + 10;
        pid_t p = 0;
        while ((p = waitpid(w[i], &wst, WNOHANG)) == 0 && now_s() < end) usleep(10000);
        TU_CHECK(p == w[i] && WIFSIGNALED(wst) && WTERMSIG(wst) == SIGTERM,
                 "worker %d after its launcher's SIGKILL: %s", i,
                 p == 0 ? "still running 10 s later" : p < 0 ? strerror(errno) : "ended otherwise than by SIGTERM");
        if (p == 0) kill(w[i], SIGKILL), waitpid(w[i], &wst, 0);
    }
    prctl(PR_SET_CHILD_SUBREAPER, 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) { /* a leftover temporary directory */ }
}

/* ---- training: N ranks with global batch B against 1 rank with batch B ---- */

typedef struct tcase {
    const char *name, *model;
    sg_scope scope;
    sg_optim_kind optim;
    float lr;
    bool gpu;
    int accum;                 /* micro-batches a step (0: 1): the sum averaged once, after the last */
    size_t bucket;             /* bucket bytes (0: 1 KiB, several buckets even for small models) */
    bool shard;                /* a sharded optimizer: against the same ranks unsharded, bit for bit */
    sg_dtype precision;        /* 0: f32 */
    float clip;                /* sharded with clipping to this norm: mode "clip" (see there) */
} tcase;

/* SGD: a sum where an average belongs would change its steps (AdamW's barely: it is scale-free),
 * and its differences stay proportional to the gradients' (AdamW normalises the update of a
 * gradient that cancels to near zero, so rounding there moves a parameter by up to lr). */
static const tcase cases[] = {
    {"mlp-eager", "mlp-32-2-16", SG_SCOPE_EAGER, SG_OPTIM_SGD, 0.05f, false, 0, 0, false, 0, 0},
    {"mlp-layer", "mlp-32-2-16", SG_SCOPE_LAYER, SG_OPTIM_SGD, 0.05f, false, 0, 0, false, 0, 0},
    {"mlp-model", "mlp-32-2-16", SG_SCOPE_MODEL, SG_OPTIM_SGD, 0.05f, false, 0, 0, false, 0, 0},
    {"mlp-step", "mlp-32-2-16", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.05f, false, 0, 0, false, 0, 0},
    {"gpt-eager", "gpt-64-1-4-16", SG_SCOPE_EAGER, SG_OPTIM_SGD, 0.1f, false, 0, 0, false, 0, 0},
    {"gpt-step", "gpt-64-1-4-16", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.1f, false, 0, 0, false, 0, 0},
    {"mlp64-eager", "mlp-64-2-32", SG_SCOPE_EAGER, SG_OPTIM_SGD, 0.05f, true, 0, 0, false, 0, 0},
    {"mlp64-step", "mlp-64-2-32", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.05f, true, 0, 0, false, 0, 0},
    {"gpt-eager-gpu", "gpt-128-2-4-32", SG_SCOPE_EAGER, SG_OPTIM_SGD, 0.1f, true, 0, 0, false, 0, 0},
    {"gpt-step-gpu", "gpt-128-2-4-32", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.1f, true, 0, 0, false, 0, 0},
    {"mlp-model-accum", "mlp-32-2-16", SG_SCOPE_MODEL, SG_OPTIM_SGD, 0.05f, false, 3, 0, false, 0, 0},
    {"gpt-step-accum", "gpt-64-1-4-16", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.1f, false, 2, 0, false, 0, 0},
    {"mlp64-step-accum", "mlp-64-2-32", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.05f, true, 2, 0, false, 0, 0},
    {"gpt-step-accum-gpu", "gpt-128-2-4-32", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.1f, true, 3, 0, false, 0, 0},
    /* Buckets larger than the model: the last two children (block 0 and the embedding) still
     * send theirs, so exactly two gradient all-reduces a step. */
    {"gpt-step-whole", "gpt-64-1-4-16", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.1f, false, 0, (size_t)64 << 20, false, 0, 0},
    /* A sharded optimizer: the same run as unsharded, bit for bit (the CPU transport's
     * reduce-scatter averages as its all-reduce does; the update is elementwise). Mixed
     * precision: a step whose gradients overflow (scale inf) is skipped alike, and every rank's
     * scaler agrees after each rank checked only its shares. */
    {"gpt-step-shard", "gpt-64-1-4-16", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.1f, false, 0, 0, true, 0, 0},
    {"gpt-eager-shard-bf16", "gpt-64-1-4-16", SG_SCOPE_EAGER, SG_OPTIM_ADAMW, 3e-3f, false, 0, 0, true,
     SG_DTYPE_BF16, 0},
    {"gpt-step-shard-bf16", "gpt-64-1-4-16", SG_SCOPE_STEP, SG_OPTIM_ADAMW, 3e-3f, false, 0, 0, true,
     SG_DTYPE_BF16, 0},
    /* The mlp's 2442 parameters leave a tail of 2 (not a multiple of 4 x 2), updated whole by
     * every rank: eagerly at model scope, captured at step scope. */
    {"mlp-model-shard", "mlp-32-2-16", SG_SCOPE_MODEL, SG_OPTIM_ADAMW, 3e-3f, false, 0, 0, true, 0, 0},
    {"mlp-step-shard", "mlp-32-2-16", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.05f, false, 0, 0, true, 0, 0},
    /* With accumulation: the step's f32 sums reduce-scattered after the last micro-batch. */
    {"gpt-step-accum-shard", "gpt-64-1-4-16", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.1f, false, 2, 0, true, 0, 0},
    {"gpt-eager-accum-shard-bf16", "gpt-64-1-4-16", SG_SCOPE_EAGER, SG_OPTIM_ADAMW, 3e-3f, false, 3, 0, true,
     SG_DTYPE_BF16, 0},
    {"gpt-step-accum-shard-bf16", "gpt-64-1-4-16", SG_SCOPE_STEP, SG_OPTIM_ADAMW, 3e-3f, false, 2, 0, true,
     SG_DTYPE_BF16, 0},
    /* Clipping with a sharded optimizer (mode "clip"): the mlp's tail of 2 is counted once in
     * the norm, by rank 0. */
    {"gpt-step-shard-clip", "gpt-64-1-4-16", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.1f, false, 0, 0, true, 0, 0.05f},
    {"mlp-model-shard-clip", "mlp-32-2-16", SG_SCOPE_MODEL, SG_OPTIM_SGD, 0.05f, false, 0, 0, true, 0, 0.05f},
    {"gpt-eager-shard-clip-bf16", "gpt-64-1-4-16", SG_SCOPE_EAGER, SG_OPTIM_ADAMW, 3e-3f, false, 0, 0, true,
     SG_DTYPE_BF16, 0.05f},
    {"gpt-step-shard-clip-bf16", "gpt-64-1-4-16", SG_SCOPE_STEP, SG_OPTIM_ADAMW, 3e-3f, false, 0, 0, true,
     SG_DTYPE_BF16, 0.05f}, /* the unscale folded too: sg_clip_sumsq_amp on the bf16 shares */
    {"gpt-step-accum-shard-clip-bf16", "gpt-64-1-4-16", SG_SCOPE_STEP, SG_OPTIM_ADAMW, 3e-3f, false, 2, 0, true,
     SG_DTYPE_BF16, 0.05f},
    {"gpt-step-shard-gpu", "gpt-128-2-4-32", SG_SCOPE_STEP, SG_OPTIM_ADAMW, 3e-3f, true, 0, 0, true,
     SG_DTYPE_BF16, 0},
    {"gpt-step-shard-clip-gpu", "gpt-128-2-4-32", SG_SCOPE_STEP, SG_OPTIM_ADAMW, 3e-3f, true, 0, 0, true,
     SG_DTYPE_BF16, 0.05f},
    {"mlp64-step-shard-clip-gpu", "mlp-64-2-32", SG_SCOPE_STEP, SG_OPTIM_SGD, 0.05f, true, 0, 0, true, 0, 0.05f},
    {"gpt-step-accum-shard-gpu", "gpt-128-2-4-32", SG_SCOPE_STEP, SG_OPTIM_ADAMW, 3e-3f, true, 2, 0, true,
     SG_DTYPE_BF16, 0},
};

static const tcase *find_case(const char *name)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!strcmp(cases[i].name, name)) return &cases[i];
    return NULL;
}

typedef struct trainee {
    sg_ctx *ctx;
    sg_model *m;
    sg_optim *o;
    sg_trainer *t;
} trainee;

static trainee make(sg_ctx *ctx, const tcase *c, uint64_t seed, int shard, int shards, sg_dist *d,
                    bool shard_optim)
{
    trainee r = {ctx, NULL, NULL, NULL};
    sg_model_options mo = {.shard = shard, .shards = shards, .precision = c->precision};
    TU_OK(ctx, sg_model_create_ex(ctx, c->model, seed, &mo, &r.m));
    TU_OK(ctx, sg_optim_create(ctx, r.m, c->optim, &r.o));
    TU_OK(ctx, sg_optim_set_lr(r.o, c->lr));
    sg_trainer_options to = sg_trainer_options_default();
    to.scope = c->scope;
    to.accum = c->accum > 0 ? c->accum : 1;
    to.warmup = SG_DIST_MIN_WARMUP;
    to.dist = d;
    to.shard_optimizer = shard_optim;
    to.clip = c->clip;
    TU_OK(ctx, sg_trainer_create(r.m, r.o, &to, &r.t));
    return r;
}

static void unmake(trainee *r)
{
    sg_trainer_destroy(r->t);
    sg_optim_destroy(r->o);
    sg_model_destroy(r->m);
}

/* The reference: one rank with the whole batch. Its losses and its parameters after the first
 * step go to path. */
static void reference(sg_backend be, const tcase *c, uint64_t seed, const char *path)
{
    sg_ctx *ctx = tu_ctx(be);
    trainee r = make(ctx, c, seed, 0, 0, NULL, false);
    float loss[STEPS];
    int64_t n = sg_tensor_numel(sg_model_params(r.m));
    float *p = malloc((size_t)n * sizeof *p);
    for (int s = 0; s < STEPS; s++) {
        TU_OK(ctx, sg_trainer_step(r.t, s));
        TU_OK(ctx, sg_model_loss_read(r.m, &loss[s]));
        if (s == 0) TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(r.m), p, (size_t)n * sizeof *p));
    }
    FILE *f = fopen(path, "wb");
    TU_CHECK(f && fwrite(loss, sizeof loss, 1, f) == 1 && fwrite(&n, sizeof n, 1, f) == 1 &&
             fwrite(p, sizeof *p, (size_t)n, f) == (size_t)n, "writing %s", path);
    if (f) fclose(f);
    free(p);
    unmake(&r);
    sg_ctx_destroy(ctx);
}

/* Whether two files hold the same bytes. */
/* The first i < n where a and b differ bit for bit, or -1. */
static int64_t first_diff(const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a)) return i;
    return -1;
}

static bool same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    for (int x = 0, y = 0; same && x != EOF; same = x == y) x = fgetc(fa), y = fgetc(fb);
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* Tolerance of N ranks against 1: the gradients' sums run in another order (rows split across
 * ranks, then averaged), a few ulps in a step; a missing or doubled average moves SGD's
 * parameters by a whole step, orders of magnitude more. */
static bool close_to(double got, double ref, double atol, double rtol)
{
    return fabs(got - ref) <= atol + rtol * fabs(ref);
}

/* `test_dist worker BACKEND CASE SEED REF MODE`: one rank of a run the launcher started. MODE
 * "match": train 20 steps and compare with REF; "inject": step scope where rank 1 captures other
 * collectives (SG_DIST_INJECT_SEQ=1): the capture step must fail naming the difference; "die":
 * rank 1 leaves after 3 steps, and rank 0 must fail within the timeout. Exit 0 when all held. */
static int worker(int argc, char **argv)
{
    if (argc < 7) return 2;
    sg_backend be = !strcmp(argv[2], "cuda") ? SG_BACKEND_CUDA : SG_BACKEND_CPU;
    const tcase *c = find_case(argv[3]);
    uint64_t seed = strtoull(argv[4], NULL, 10);
    const char *ref = argv[5], *mode = argv[6];
    sg_dist_env e;
    int found = 0;
    if (!c || sg_dist_env_read(&e, &found) != SG_OK || !found) {
        fprintf(stderr, "worker: no case '%s' or no launcher environment: %s\n", argv[3], sg_ctx_last_error(NULL));
        return 2;
    }
    alarm(180); /* a hang fails the test instead of holding ctest */
    sg_ctx_options co = sg_ctx_options_default();
    co.backend = be;
    co.device = be == SG_BACKEND_CUDA ? e.local_rank : 0;
    sg_ctx *ctx;
    TU_OK(NULL, sg_ctx_create(&co, &ctx));
    sg_dist_options dopt = sg_dist_options_default();
    dopt.rank = e.rank, dopt.world = e.world, dopt.id = e.id;
    dopt.bucket_bytes = c->bucket ? c->bucket : 1024;
    dopt.timeout_s = !strcmp(mode, "die") ? 15 : 60;
    sg_dist *d;
    TU_OK(ctx, sg_dist_create(ctx, &dopt, &d));
    bool sharded = !strcmp(mode, "shard");
    trainee r = make(ctx, c, seed, e.rank, e.world, d, sharded);
    char tag[64];
    snprintf(tag, sizeof tag, "worker %s rank %d", c->name, e.rank);
    if (!strcmp(mode, "match")) {
        FILE *f = fopen(ref, "rb");
        float ref_loss[STEPS];
        int64_t n = 0;
        TU_CHECK(f && fread(ref_loss, sizeof ref_loss, 1, f) == 1 && fread(&n, sizeof n, 1, f) == 1, "reading %s", ref);
        float *ref_p = malloc((size_t)(n > 0 ? n : 1) * sizeof *ref_p);
        TU_CHECK(f && fread(ref_p, sizeof *ref_p, (size_t)n, f) == (size_t)n, "reading %s", ref);
        if (f) fclose(f);
        /* The parameters after the first step: both runs started from the same weights and
         * forwarded every row alike, so they differ only by the order of the gradients' sums.
         * Later steps are not compared parameter by parameter: a pre-activation that rounding
         * moves across a ReLU's kink changes that unit's gradient whole, and the runs part there
         * (seed 865784597: mlp-model-accum's weights 64x the tolerance apart after 20 steps while
         * every loss agreed to 1e-4); the losses of every step still follow the reference. */
        int64_t np = sg_tensor_numel(sg_model_params(r.m));
        TU_CHECK(np == n, "%s: %lld parameters, the reference %lld", tag, (long long)np, (long long)n);
        float *p = malloc((size_t)np * sizeof *p);
        int64_t worst = 0;
        double worst_d = 0;
        for (int s = 0; s < STEPS; s++) {
            float l;
            TU_OK(ctx, sg_trainer_step(r.t, s));
            TU_OK(ctx, sg_model_loss_read(r.m, &l));
            TU_CHECK(close_to(l, ref_loss[s], 1e-5, 1e-4), "%s: step %d loss %.7f, 1 rank %.7f", tag, s, l, ref_loss[s]);
            if (s > 0) continue;
            TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(r.m), p, (size_t)np * sizeof *p));
            for (int64_t i = 0; i < np && np == n; i++) {
                double dd = fabs((double)p[i] - ref_p[i]) / (1e-5 + 1e-3 * fabs(ref_p[i]));
                if (dd > worst_d) worst_d = dd, worst = i;
            }
        }
        TU_CHECK(worst_d <= 1, "%s: after step 0 parameter %lld is %.8g, 1 rank %.8g (|d| / tolerance %.2f)", tag,
                 (long long)worst, p[worst], ref_p[worst], worst_d);
        printf("%s: 20 steps, the losses within 1e-4; after the first the largest parameter difference from 1 "
               "rank is %.3f of the tolerance (parameter %lld: %.9g vs %.9g)\n", tag, worst_d, (long long)worst,
               p[worst], ref_p[worst]);
        TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(r.m), p, (size_t)np * sizeof *p));
        double sum = 0;
        for (int64_t i = 0; i < np; i++) sum += p[i] * (double)(i % 7 + 1);
        /* Every rank holds the same parameters: their checksum's average is each one's. */
        double avg = sum;
        TU_OK(ctx, sg_dist_average_host(d, &avg, 1));
        TU_CHECK(avg == sum, "%s: the ranks' parameters differ (checksum %.17g, average %.17g)", tag, sum, avg);
        sg_dist_stats ds;
        TU_OK(ctx, sg_dist_get_stats(d, &ds));
        /* Accumulated steps average their sum once, after the backward: one all-reduce. */
        if (c->accum > 1) TU_CHECK(ds.buckets_per_step == 1, "%s: %d gradient all-reduces a step of %d micro-batches",
                                   tag, ds.buckets_per_step, c->accum);
        else if (c->bucket) TU_CHECK(ds.buckets_per_step == 2, "%s: %d gradient buckets a step with buckets larger "
                                     "than the model (want 2: the last two children's)", tag, ds.buckets_per_step);
        else TU_CHECK(ds.buckets_per_step >= 2, "%s: %d gradient buckets a step with 1 KiB buckets", tag,
                      ds.buckets_per_step);
        TU_CHECK(c->scope == SG_SCOPE_EAGER || ds.checks >= 1, "%s: no capture was checked", tag);
        free(p);
        free(ref_p);
    } else if (!strcmp(mode, "dump") || !strcmp(mode, "shard")) {
        /* dump: the run unsharded, rank 0 writing its losses and parameters to REF; shard: the
         * run sharded, which must match them bit for bit on every rank. Mixed precision: step 5
         * overflows (scale inf). */
        float loss[STEPS];
        sg_dist_stats ds0, ds1;
        TU_OK(ctx, sg_dist_get_stats(d, &ds0));
        for (int s = 0; s < STEPS; s++) {
            if (s == 5 && c->precision == SG_DTYPE_BF16) {
                sg_loss_scaler sc;
                TU_OK(ctx, sg_trainer_get_scaler(r.t, &sc));
                sc.scale = INFINITY;
                TU_OK(ctx, sg_trainer_set_scaler(r.t, &sc));
            }
            TU_OK(ctx, sg_trainer_step(r.t, s));
            TU_OK(ctx, sg_model_loss_read(r.m, &loss[s]));
        }
        TU_OK(ctx, sg_dist_get_stats(d, &ds1));
        sg_loss_scaler sc = {0};
        if (c->precision == SG_DTYPE_BF16) TU_OK(ctx, sg_trainer_get_scaler(r.t, &sc));
        /* An evaluation after the steps reads the weights the last update left (sharded: its
         * shares gathered from every rank), bit for bit the unsharded run's. */
        float ev = 0;
        TU_OK(ctx, sg_trainer_eval(r.t, 0, 2, &ev));
        int64_t np = sg_tensor_numel(sg_model_params(r.m));
        if (sharded && c->scope == SG_SCOPE_EAGER) {
            /* Every eager step queues the loss's all-reduce, each bucket's reduce-scatter and
             * all-gather, the tail's all-reduce and under mixed precision the scaler agreement's
             * three: none left out (the agreement's effect is seen only when some ranks' shares
             * overflow and others' do not, which no drawn step here does). */
            const sg_dist_layout L = sg_dist_shard_layout(d);
            uint64_t want = (uint64_t)STEPS * (uint64_t)(1 + 2 * L.n_plan + (L.tail_n > 0) +
                                                         (c->precision == SG_DTYPE_BF16 ? 3 : 0));
            TU_CHECK(ds1.collectives - ds0.collectives == want, "%s: %llu collectives in %d eager steps, want %llu",
                     tag, (unsigned long long)(ds1.collectives - ds0.collectives), STEPS, (unsigned long long)want);
        }
        float *p = malloc((size_t)np * sizeof *p);
        /* Sharded, the masters of other ranks' shares are gathered by a save (the bf16 copies
         * every step): the parameters compared are the saved ones. */
        char ck[600];
        snprintf(ck, sizeof ck, "%s.%s.ckpt", ref, mode);
        if (sharded || e.rank == 0) TU_OK(ctx, sg_trainer_save(r.t, STEPS, ck)); /* sharded: every rank gathers */
        if (sharded) {
            /* A sharded save returns on every rank once rank 0 has written the file, and fails
             * on every rank when rank 0 cannot write it; the run goes on after that error. */
            struct stat sb;
            TU_CHECK(stat(ck, &sb) == 0 && sb.st_size > 0, "%s: %s not there when the save returned: %s", tag, ck,
                     strerror(errno));
            char bad[640];
            snprintf(bad, sizeof bad, "%s.no-such-dir/x.ckpt", ref);
            TU_FAILS(ctx, sg_trainer_save(r.t, STEPS, bad), SG_ERR_IO, e.rank == 0 ? bad : "rank 0 could not write");
            /* A rank that cannot allocate the gathered state: every rank fails at once (before
             * any gather, not at the watchdog's timeout), and the run goes on. */
            char inj[640];
            snprintf(inj, sizeof inj, "%s.inject.ckpt", ref);
            setenv("SG_DIST_INJECT_SAVE", "1", 1);
            double t0 = now_s();
            TU_FAILS(ctx, sg_trainer_save(r.t, STEPS, inj), SG_ERR_OOM,
                     e.rank == 1 ? "test hook SG_DIST_INJECT_SAVE" : "another rank could not allocate");
            unsetenv("SG_DIST_INJECT_SAVE");
            TU_CHECK(now_s() - t0 < 10, "%s: the save with rank 1 short of memory took %.1f s to fail", tag,
                     now_s() - t0);
            TU_CHECK(stat(inj, &sb) != 0, "%s: %s was written by a save that failed on rank 1", tag, inj);
            if (e.rank == 0) unlink(inj);
        }
        TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(r.m), p, (size_t)np * sizeof *p));
        if (!sharded && e.rank == 0) {
            FILE *f = fopen(ref, "wb");
            TU_CHECK(f && fwrite(loss, sizeof loss, 1, f) == 1 && fwrite(&sc, sizeof sc, 1, f) == 1 &&
                     fwrite(&ev, sizeof ev, 1, f) == 1 &&
                     fwrite(&np, sizeof np, 1, f) == 1 && fwrite(p, sizeof *p, (size_t)np, f) == (size_t)np,
                     "%s: writing %s", tag, ref);
            if (f) fclose(f);
        } else if (sharded) {
            FILE *f = fopen(ref, "rb");
            float rl[STEPS];
            sg_loss_scaler rsc;
            float rev = 0;
            int64_t n = 0;
            TU_CHECK(f && fread(rl, sizeof rl, 1, f) == 1 && fread(&rsc, sizeof rsc, 1, f) == 1 &&
                     fread(&rev, sizeof rev, 1, f) == 1 &&
                     fread(&n, sizeof n, 1, f) == 1 && n == np, "%s: reading %s", tag, ref);
            float *rp = malloc((size_t)(n > 0 ? n : 1) * sizeof *rp);
            TU_CHECK(f && n == np && fread(rp, sizeof *rp, (size_t)n, f) == (size_t)n, "%s: reading %s", tag, ref);
            if (f) fclose(f);
            for (int s = 0; s < STEPS; s++)
                TU_CHECK(!memcmp(&loss[s], &rl[s], sizeof rl[s]), "%s: step %d loss %.9g, unsharded %.9g", tag, s,
                         loss[s], rl[s]);
            TU_CHECK(!memcmp(&ev, &rev, sizeof ev), "%s: evaluated loss %.9g after the steps, unsharded %.9g", tag,
                     ev, rev);
            TU_CHECK(!memcmp(&sc, &rsc, sizeof sc), "%s: scaler (scale %g, good %g, skipped %g), unsharded (%g, %g, "
                     "%g)", tag, sc.scale, sc.good_steps, sc.skipped, rsc.scale, rsc.good_steps, rsc.skipped);
            TU_CHECK(c->precision != SG_DTYPE_BF16 || sc.skipped == 1, "%s: %g steps skipped, want the one that "
                     "overflowed", tag, sc.skipped);
            int64_t diff = n == np ? first_diff(p, rp, np) : -1;
            TU_CHECK(diff < 0, "%s: parameter %lld is %.9g, unsharded %.9g", tag, (long long)diff,
                     diff >= 0 ? p[diff] : 0, diff >= 0 ? rp[diff] : 0);
            /* The state this rank keeps: about 1/world of the moments. */
            sg_tensor *om, *ov, *hp;
            sg_optim_state(r.o, &om, &ov, &hp);
            TU_CHECK(sg_tensor_numel(om) <= np / e.world + 4 * e.world, "%s: the optimizer keeps %lld moments of %lld "
                     "parameters on %d ranks", tag, (long long)sg_tensor_numel(om), (long long)np, e.world);
            printf("%s: 20 steps sharded, bit for bit the unsharded run; %lld of %lld moments kept here\n", tag,
                   (long long)sg_tensor_numel(om), (long long)np);
            free(rp);
            /* The two runs' checkpoints hold the same state (the sharded one gathered). */
            char ck0[600];
            snprintf(ck0, sizeof ck0, "%s.dump.ckpt", ref);
            if (e.rank == 0) TU_CHECK(same_file(ck, ck0), "%s: the checkpoints %s and %s differ", tag, ck, ck0);
            if (c->precision == SG_DTYPE_BF16) {
                /* A resume whose first step is skipped: the gather after it must spread the loaded
                 * weights' bf16 copies, not those of the update before the load. Loss A: load,
                 * one step; loss B: load, a skipped step, the same step: the same weights. */
                int64_t at = 0;
                float la, lb;
                TU_OK(ctx, sg_trainer_step(r.t, STEPS)); /* the state moves away from the file */
                TU_OK(ctx, sg_trainer_load(r.t, ck, &at));
                TU_OK(ctx, sg_trainer_step(r.t, STEPS + 1));
                TU_OK(ctx, sg_model_loss_read(r.m, &la));
                TU_OK(ctx, sg_trainer_load(r.t, ck, &at));
                sg_loss_scaler ok, inf;
                TU_OK(ctx, sg_trainer_get_scaler(r.t, &ok));
                inf = ok, inf.scale = INFINITY;
                TU_OK(ctx, sg_trainer_set_scaler(r.t, &inf));
                TU_OK(ctx, sg_trainer_step(r.t, STEPS));
                TU_OK(ctx, sg_trainer_set_scaler(r.t, &ok));
                TU_OK(ctx, sg_trainer_step(r.t, STEPS + 1));
                TU_OK(ctx, sg_model_loss_read(r.m, &lb));
                TU_CHECK(!memcmp(&la, &lb, sizeof la), "%s: after a resume and a skipped step the loss is %.9g, "
                         "without the skipped step %.9g: the weights differ", tag, lb, la);
            }
        }
        /* The end: the state moves on by a step (bf16: the sharded run's resume above ended on
         * load and step STEPS + 1, which the unsharded run takes too), the f32 masters are
         * gathered (sharded; nothing to do otherwise), and the trainer goes. The model it leaves:
         * the weights the forward reads (the bf16 copies under mixed precision, gathered after
         * every update) and the masters, bit for bit the unsharded run's. */
        if (c->precision == SG_DTYPE_BF16 && !sharded) {
            double barrier = 0; /* rank 0 wrote the checkpoint that every rank loads */
            TU_OK(ctx, sg_dist_average_host(d, &barrier, 1));
            int64_t at = 0;
            TU_OK(ctx, sg_trainer_load(r.t, ck, &at));
        }
        if (c->precision != SG_DTYPE_BF16 || !sharded) TU_OK(ctx, sg_trainer_step(r.t, STEPS + 1));
        TU_OK(ctx, sg_trainer_gather_params(r.t));
        sg_trainer_destroy(r.t);
        r.t = NULL;
        sg_tensor *wt[2] = {r.m->params->flat_lo ? r.m->params->flat_lo : r.m->params->flat, r.m->params->flat};
        int64_t nw = sg_tensor_numel(wt[1]);
        float *wf = malloc(2 * (size_t)nw * sizeof *wf), *rf = malloc(2 * (size_t)nw * sizeof *rf);
        sg_tensor *wf32 = NULL;
        TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 1, &nw, "weights.f32", &wf32));
        for (int k = 0; k < 2; k++) {
            TU_OK(ctx, sg_tensor_convert(wf32, wt[k]));
            TU_OK(ctx, sg_tensor_copy_to_host(wf32, wf + k * nw, (size_t)nw * sizeof *wf));
        }
        sg_tensor_destroy(wf32);
        char fin[640];
        snprintf(fin, sizeof fin, "%s.final", ref);
        if (!sharded && e.rank == 0) {
            FILE *f = fopen(fin, "wb");
            TU_CHECK(f && fwrite(wf, sizeof *wf, 2 * (size_t)nw, f) == 2 * (size_t)nw, "%s: writing %s", tag, fin);
            if (f) fclose(f);
        } else if (sharded) {
            FILE *f = fopen(fin, "rb");
            bool got = f && fread(rf, sizeof *rf, 2 * (size_t)nw, f) == 2 * (size_t)nw;
            TU_CHECK(got, "%s: reading %s", tag, fin);
            if (f) fclose(f);
            int64_t diff = got ? first_diff(wf, rf, 2 * nw) : -1;
            TU_CHECK(diff < 0, "%s: after a step and the trainer's end, %s %lld is %.9g, unsharded %.9g", tag,
                     diff < nw ? "weight" : "master", (long long)(diff % nw), diff >= 0 ? wf[diff] : 0,
                     diff >= 0 ? rf[diff] : 0);
        }
        free(wf);
        free(rf);
        if (sharded) {
            /* The optimizer belonged to the trainer: once it is gone, a clear error, no stale state. */
            TU_FAILS(ctx, sg_optim_update(r.o), SG_ERR_INVALID, "sharded by a trainer that has been destroyed");
            sg_trainer_options to = sg_trainer_options_default();
            sg_trainer *t2 = NULL;
            TU_FAILS(ctx, sg_trainer_create(r.m, r.o, &to, &t2), SG_ERR_INVALID, "create a new optimizer");
        }
        free(p);
    } else if (!strcmp(mode, "clip")) {
        /* Clipping with a sharded optimizer: the global norm from every rank's shares (the tail
         * once), summed over the ranks. Three runs on these ranks: unsharded (r), sharded, and
         * sharded eagerly (captured scopes). At step 0 both see the same gradients bit for bit
         * (the sharded tests above) and sum the same squares in f64 in two orders, each within
         * P 2^-53 of the exact sum (1e-11 here), so the f32 norms are at most 1 ulp apart: a
         * share left out, the tail counted twice or a rank's own norm alone would move it by
         * 1e-3 or more; the weights after that step within "match"'s tolerance. After that the
         * two runs' coefficients differ in their last bits, and the losses and norms drift as N
         * ranks do from 1 (the weights are not compared later: see "match"). The sharded run
         * captured and eager: the same bits to the end, the eager run with STEPGRAPH_CLIP=separate
         * (sg_clip_apply scaling the shares, then the update) and the captured one folded
         * (sg_clip_factor_sums, the update multiplying by the factor as it reads; under mixed
         * precision with accum 1 the norm of the bf16 shares times 1 / scale, sg_clip_sumsq_amp,
         * and the update unscaling them too). */
        float loss[3][STEPS], norm[3][STEPS];
        int64_t np = sg_tensor_numel(sg_model_params(r.m));
        float *p[3], *first[2];
        tcase eager = *c;
        eager.scope = SG_SCOPE_EAGER;
        int runs = c->scope == SG_SCOPE_EAGER ? 2 : 3;
        for (int k = 0; k < runs; k++) {
            if (k == 2) TU_CHECK(setenv("STEPGRAPH_CLIP", "separate", 1) == 0, "setenv");
            if (k > 0) r = make(ctx, k == 2 ? &eager : c, seed, e.rank, e.world, d, true);
            if (k == 2) TU_CHECK(unsetenv("STEPGRAPH_CLIP") == 0, "unsetenv");
            for (int s = 0; s < STEPS; s++) {
                TU_OK(ctx, sg_trainer_step(r.t, s));
                TU_OK(ctx, sg_model_loss_read(r.m, &loss[k][s]));
                TU_OK(ctx, sg_tensor_copy_to_host(r.m->gnorm, &norm[k][s], sizeof norm[k][s]));
                if (s > 0 || k == 2) continue;
                TU_OK(ctx, sg_trainer_gather_params(r.t));
                first[k] = malloc((size_t)np * sizeof *first[k]);
                TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(r.m), first[k], (size_t)np * sizeof *first[k]));
            }
            TU_OK(ctx, sg_trainer_gather_params(r.t));
            p[k] = malloc((size_t)np * sizeof *p[k]);
            TU_OK(ctx, sg_tensor_copy_to_host(sg_model_params(r.m), p[k], (size_t)np * sizeof *p[k]));
            if (k < runs - 1) unmake(&r);
        }
        float ulp = nextafterf(norm[0][0], INFINITY) - norm[0][0];
        TU_CHECK(norm[0][0] > c->clip, "%s: the norm at step 0 is %.9g, not above the clip %g: nothing clipped",
                 tag, norm[0][0], c->clip);
        TU_CHECK(fabsf(norm[1][0] - norm[0][0]) <= ulp, "%s: step 0's norm sharded %.9g, unsharded %.9g (more than "
                 "1 ulp apart)", tag, norm[1][0], norm[0][0]);
        int clipped = 0;
        for (int s = 0; s < STEPS; s++) {
            clipped += norm[0][s] > c->clip;
            TU_CHECK(close_to(loss[1][s], loss[0][s], 1e-5, 1e-4) && close_to(norm[1][s], norm[0][s], 1e-5, 1e-4),
                     "%s: step %d sharded loss %.9g norm %.9g, unsharded %.9g %.9g", tag, s, loss[1][s], norm[1][s],
                     loss[0][s], norm[0][s]);
        }
        int64_t worst = 0;
        double worst_d = 0;
        for (int64_t i = 0; i < np; i++) {
            double dd = fabs((double)first[1][i] - first[0][i]) / (1e-5 + 1e-3 * fabs(first[0][i]));
            if (dd > worst_d) worst_d = dd, worst = i;
        }
        TU_CHECK(worst_d <= 1, "%s: after step 0 parameter %lld is %.9g sharded, %.9g unsharded (|d| / tolerance "
                 "%.2f)", tag, (long long)worst, first[1][worst], first[0][worst], worst_d);
        if (runs == 3) {
            int64_t diff = first_diff(p[2], p[1], np);
            TU_CHECK(!memcmp(loss[2], loss[1], sizeof loss[1]) && !memcmp(norm[2], norm[1], sizeof norm[1]) &&
                     diff < 0, "%s: sharded eager (clipping separate) and %s (folded) differ (losses, norms, or "
                     "parameter %lld)", tag,
                     sg_scope_name(c->scope), (long long)diff);
        }
        printf("%s: clipped in %d of %d steps (norm %.6g at step 0, sharded %.6g); parameters after it within %.3f "
               "of the tolerance of the unsharded run's%s\n", tag, clipped, STEPS, norm[0][0], norm[1][0], worst_d,
               runs == 3 ? "; eager with the clipping separate bit for bit" : "");
        for (int k = 0; k < runs; k++) free(p[k]);
        free(first[0]), free(first[1]);
    } else if (!strcmp(mode, "agree")) {
        /* A sharded step where only some ranks' shares overflowed: each rank ran the scaler's
         * update on its own flag; after sg_dist_agree_scaler every rank must hold what a rank
         * that saw every gradient holds (the flag set, the scale halved, good steps 0, one more
         * skip), whichever ranks overflowed, including a rank whose good steps just grew the
         * scale. Rank r's flag is bit r of `pattern`, drawn here (the same on every rank). */
        int64_t one = 1, four = SG_SCALER_COUNT;
        sg_tensor *found, *scaler;
        TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_I32, 1, &one, "found", &found));
        TU_OK(ctx, sg_tensor_create(ctx, SG_DTYPE_F32, 1, &four, "scaler", &scaler));
        for (int trial = 0; trial < 8; trial++) {
            uint64_t h = seed * 0x9e3779b97f4a7c15ull + (uint64_t)trial * 0xbf58476d1ce4e5b9ull;
            int pattern = (int)((h >> 17) % ((1u << e.world) - 1)) + 1; /* some rank overflowed */
            float scale = (float)(1 << (h >> 40) % 20), good = (float)((h >> 8) % 50), skipped = (float)(h % 9);
            float interval = good + 1; /* a rank without overflow grows the scale this step */
            int32_t f = (pattern >> e.rank) & 1;
            sg_loss_scaler mine = f ? (sg_loss_scaler){scale * 0.5f, 0, interval, skipped + 1}
                                    : (sg_loss_scaler){scale * 2.f, 0, interval, skipped};
            if (!f && trial % 2) mine.scale = scale, mine.good_steps = good + 1, mine.growth_interval = good + 2;
            TU_OK(ctx, sg_tensor_copy_from_host(found, &f, sizeof f));
            TU_OK(ctx, sg_tensor_copy_from_host(scaler, &mine, sizeof mine));
            TU_OK(ctx, sg_dist_agree_scaler(d, found, scaler));
            sg_loss_scaler got;
            int32_t gf;
            TU_OK(ctx, sg_tensor_copy_to_host(found, &gf, sizeof gf));
            TU_OK(ctx, sg_tensor_copy_to_host(scaler, &got, sizeof got));
            TU_CHECK(gf == 1 && got.scale == scale * 0.5f && got.good_steps == 0 && got.skipped == skipped + 1,
                     "%s: trial %d (overflow on ranks %#x): flag %d, scale %g, good %g, skipped %g; want 1, %g, 0, %g",
                     tag, trial, pattern, gf, got.scale, got.good_steps, got.skipped, scale * 0.5f, skipped + 1);
        }
        sg_tensor_destroy(found);
        sg_tensor_destroy(scaler);
    } else if (!strcmp(mode, "inject")) {
        sg_status st = SG_OK;
        int s = 0;
        for (; s < STEPS && st == SG_OK; s++) st = sg_trainer_step(r.t, s);
        const char *msg = sg_ctx_last_error(ctx);
        /* Collective #0 is the loss's (sg_dist_backward_begin), #1 the first bucket, which
         * rank 1 splits. */
        TU_CHECK(st == SG_ERR_DIST && s - 1 == SG_DIST_MIN_WARMUP &&
                 strstr(msg, "rank 1 captured other collectives than rank 0") &&
                 strstr(msg, "first difference at collective #1"),
                 "%s: a different capture on rank 1 gave %s at step %d: %s", tag, sg_status_name(st), s - 1, msg);
        printf("%s: %s\n", tag, msg);
    } else if (!strcmp(mode, "die")) {
        sg_status st = SG_OK;
        double t0 = 0;
        for (int s = 0; s < 200 && st == SG_OK; s++) {
            if (s == 3 && e.rank == 1) _exit(0); /* a clean exit: the launcher lets rank 0 find out */
            if (s == 3) t0 = now_s();
            float l;
            st = sg_trainer_step(r.t, s);
            if (st == SG_OK) st = sg_model_loss_read(r.m, &l);
        }
        double dt = now_s() - t0;
        TU_CHECK(st == SG_ERR_DIST && dt < dopt.timeout_s + 15, "%s: after rank 1 left: %s after %.1f s: %s", tag,
                 sg_status_name(st), dt, sg_ctx_last_error(ctx));
        TU_CHECK(sg_dist_poll(d) == SG_ERR_DIST, "%s: the run is not marked failed", tag);
        printf("%s: failed after %.1f s, as it should: %s\n", tag, dt, sg_ctx_last_error(ctx));
    }
    unmake(&r);
    sg_dist_destroy(d);
    sg_ctx_destroy(ctx);
    return tu_failures ? 1 : 0;
}

/* gpu: the id made to learn whether this build has NCCL, used by the first run (an NCCL id's
 * maker answers its ranks until they join, so none is made that no rank uses). */
static sg_dist_id first_id;
static bool have_first_id;

/* Runs `mode` of case c on `world` ranks of backend be; SG_OK when every worker exited 0. */
static void run_ranks(sg_backend be, const tcase *c, int world, uint64_t seed, const char *ref, const char *mode)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    TU_CHECK(n > 0, "readlink /proc/self/exe: %s", strerror(errno));
    if (n <= 0) return;
    self[n] = '\0';
    char seeds[32];
    snprintf(seeds, sizeof seeds, "%llu", (unsigned long long)seed);
    char *argv[] = {self, "worker", be == SG_BACKEND_CUDA ? "cuda" : "cpu", (char *)c->name, seeds, (char *)ref,
                    (char *)mode, NULL};
    sg_dist_launch_options o;
    memset(&o, 0, sizeof o);
    o.local_world = world;
    o.argv = argv;
    if (have_first_id) o.id = first_id, have_first_id = false;
    else TU_OK(NULL, sg_dist_id_create(be, &o.id));
    fflush(stdout);
    double t0 = now_s();
    sg_status st = sg_dist_launch(&o, NULL);
    TU_CHECK(st == SG_OK, "%s (%s, %d ranks): %s", c->name, mode, world, sg_ctx_last_error(NULL));
    printf("%s: %s on %d ranks: %s in %.1f s\n", c->name, mode, world, st == SG_OK ? "ok" : "FAILED", now_s() - t0);
}

/* `test_dist cpu|gpu ONLY`: the training cases whose names hold ONLY, nothing else (to repeat a
 * few cases many times). */
static const char *only;

static void training(sg_backend be, bool gpu)
{
    uint64_t seed = tu_next() % 1000000;
    char ref[] = "/tmp/sg_test_dist_ref_XXXXXX";
    int fd = mkstemp(ref);
    TU_CHECK(fd >= 0, "mkstemp: %s", strerror(errno));
    if (fd < 0) return;
    close(fd);
    const char *first = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const tcase *c = &cases[i];
        if (c->gpu != gpu || (only && !strstr(c->name, only))) continue;
        if (!first) first = c->name;
        if (c->clip > 0) {
            run_ranks(be, c, 2, seed, ref, "clip");
            continue;
        }
        if (c->shard) {
            run_ranks(be, c, 2, seed, ref, "dump");
            run_ranks(be, c, 2, seed, ref, "shard");
            /* The same with the gather ahead of the next forward (each child's forward waiting
             * for its buckets; the model stale between steps until eval, save, gather_params or
             * the trainer's end gathers it): the same bits. */
            setenv("STEPGRAPH_SHARD_GATHER", "ahead", 1);
            run_ranks(be, c, 2, seed, ref, "shard");
            unsetenv("STEPGRAPH_SHARD_GATHER");
            char ck[600];
            snprintf(ck, sizeof ck, "%s.dump.ckpt", ref);
            unlink(ck);
            snprintf(ck, sizeof ck, "%s.shard.ckpt", ref);
            unlink(ck);
            snprintf(ck, sizeof ck, "%s.final", ref);
            unlink(ck);
            continue;
        }
        reference(be, c, seed, ref);
        run_ranks(be, c, 2, seed, ref, "match");
    }
    /* A different capture on one rank, and a rank that dies: errors, not hangs. */
    if (only) {
        TU_CHECK(first != NULL, "no %s training case holds '%s'", gpu ? "gpu" : "cpu", only);
        unlink(ref);
        return;
    }
    const tcase *step = find_case(gpu ? "mlp64-step" : "mlp-step");
    run_ranks(be, step, 2, seed, ref, "agree");
    if (!gpu) run_ranks(be, step, 4, seed, ref, "agree");
    setenv("SG_DIST_INJECT_SEQ", "1", 1);
    run_ranks(be, step, 2, seed, ref, "inject");
    unsetenv("SG_DIST_INJECT_SEQ");
    run_ranks(be, step, 2, seed, ref, "die");
    unlink(ref);
}

/* Training with the run but the wrong shard, and other misuse: clear errors. */
static void cpu_misuse(void)
{
    sg_ctx *ctx = tu_ctx(SG_BACKEND_CPU);
    sg_dist_options o = sg_dist_options_default();
    TU_OK(NULL, sg_dist_id_create(SG_BACKEND_CPU, &o.id));
    sg_dist *d;
    TU_OK(ctx, sg_dist_create(ctx, &o, &d)); /* a run of one */
    sg_model *m;
    sg_optim *opt;
    sg_model_options mo = {.shard = 1, .shards = 3};
    TU_FAILS(ctx, sg_model_create_ex(ctx, "mlp-32-2-16", 1, &mo, &m), SG_ERR_INVALID, "shards dividing the batch 16");
    mo = (sg_model_options){.shard = 1, .shards = 2};
    TU_OK(ctx, sg_model_create_ex(ctx, "mlp-32-2-16", 1, &mo, &m));
    TU_OK(ctx, sg_optim_create(ctx, m, SG_OPTIM_SGD, &opt));
    sg_trainer_options to = sg_trainer_options_default();
    to.dist = d;
    sg_trainer *t;
    TU_FAILS(ctx, sg_trainer_create(m, opt, &to, &t), SG_ERR_INVALID, "shard 1 of 2 of each batch, but this "
             "process is rank 0 of 1");
    sg_optim_destroy(opt);
    sg_model_destroy(m);
    sg_dist_destroy(d);
    o.rank = 2;
    TU_FAILS(ctx, sg_dist_create(ctx, &o, &d), SG_ERR_INVALID, "rank 2 of 1");
    sg_dist_id other;
    memset(&other, 7, sizeof other);
    o = sg_dist_options_default();
    o.id = other;
    TU_FAILS(ctx, sg_dist_create(ctx, &o, &d), SG_ERR_INVALID, "the id was not made for the CPU backend");
    sg_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cpu";
    if (!strcmp(mode, "worker")) return worker(argc, argv);
    only = argc > 2 ? argv[2] : NULL;
    tu_seed("test_dist");
    if (!strcmp(mode, "gpu")) {
        if (!sg_cuda_available()) {
            printf("SKIP: no CUDA device (or a CPU-only build): the NCCL tests need 2 GPUs\n");
            return TU_SKIP;
        }
        sg_ctx_options co = sg_ctx_options_default();
        co.backend = SG_BACKEND_CUDA, co.device = 1;
        sg_ctx *probe = NULL;
        if (sg_ctx_create(&co, &probe) != SG_OK) {
            printf("SKIP: the NCCL tests need 2 GPUs: %s\n", sg_ctx_last_error(NULL));
            return TU_SKIP;
        }
        sg_ctx_destroy(probe);
        sg_status st = sg_dist_id_create(SG_BACKEND_CUDA, &first_id);
        if (st == SG_ERR_UNSUPPORTED) {
            printf("SKIP: %s\n", sg_ctx_last_error(NULL));
            return TU_SKIP;
        }
        TU_OK(NULL, st);
        have_first_id = true;
        training(SG_BACKEND_CUDA, true);
    } else if (only) {
        training(SG_BACKEND_CPU, false);
    } else {
        double t0 = now_s();
        cpu_ids();
        cpu_exchange();
        printf("id exchange: %.1f s\n", now_s() - t0);
        t0 = now_s();
        cpu_launcher();
        cpu_launcher_signals();
        printf("launcher: %.1f s\n", now_s() - t0);
        cpu_misuse();
        t0 = now_s();
        training(SG_BACKEND_CPU, false);
        printf("training: %.1f s\n", now_s() - t0);
    }
    return tu_finish("test_dist");
}
