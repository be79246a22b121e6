/* launch.c: the launcher behind `stepgraph train --gpus N`: starts one worker process per GPU
 * with its rank, the world size and the run's id in SG_DIST_* variables, waits for them, and
 * when one fails stops the others (SIGTERM, then SIGKILL after a grace period) and says which
 * rank failed and how. Across hosts the launchers keep the id exchange's connections open and
 * tell each other about failures, so every host's workers stop. Only processes this call
 * started are ever signalled. Workers end with their launcher however it ends: SIGINT or
 * SIGTERM to it stops them the same way (a second signal: SIGKILL at once), and a launcher
 * that dies outright takes them along (each worker's parent-death signal, SIGTERM). */
#define _GNU_SOURCE

#include "dist/dist.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define MAX_LOCAL 64

static const char *const env_names[] = {"SG_DIST_RANK", "SG_DIST_WORLD", "SG_DIST_LOCAL_RANK",
                                        "SG_DIST_LOCAL_WORLD", "SG_DIST_ID"};
enum { N_ENV = 5 };

/* ---- the environment a worker reads ---- */

void sg_dist_id_to_hex(const sg_dist_id *id, char out[2 * SG_DIST_ID_BYTES + 1])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < SG_DIST_ID_BYTES; i++) {
        out[2 * i] = digits[id->bytes[i] >> 4];
        out[2 * i + 1] = digits[id->bytes[i] & 15];
    }
    out[2 * SG_DIST_ID_BYTES] = '\0';
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

sg_status sg_dist_id_from_hex(const char *hex, sg_dist_id *out)
{
    if (!hex || !out) return sg_fail(NULL, SG_ERR_NULL, "sg_dist_id_from_hex: hex or out is NULL");
    size_t n = strlen(hex);
    if (n != 2 * SG_DIST_ID_BYTES)
        return sg_fail(NULL, SG_ERR_INVALID, "sg_dist_id_from_hex: %zu characters, expected %d hex digits", n,
                       2 * SG_DIST_ID_BYTES);
    for (int i = 0; i < SG_DIST_ID_BYTES; i++) {
        int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return sg_fail(NULL, SG_ERR_INVALID, "sg_dist_id_from_hex: '%c%c' at %d is not a hex byte",
                           hex[2 * i], hex[2 * i + 1], 2 * i);
        out->bytes[i] = (unsigned char)(hi << 4 | lo);
    }
    return SG_OK;
}

static bool env_int(const char *name, int lo, int hi, int *out)
{
    const char *v = getenv(name);
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi) return false;
    *out = (int)x;
    return true;
}

sg_status sg_dist_env_read(sg_dist_env *out, int *found)
{
    if (!out || !found) return sg_fail(NULL, SG_ERR_NULL, "sg_dist_env_read: out or found is NULL");
    *found = 0;
    memset(out, 0, sizeof *out);
    if (!getenv("SG_DIST_RANK")) return SG_OK;
    const char *bad = NULL;
    if (!env_int("SG_DIST_WORLD", 1, SG_DIST_MAX_WORLD, &out->world)) bad = "SG_DIST_WORLD";
    else if (!env_int("SG_DIST_RANK", 0, out->world - 1, &out->rank)) bad = "SG_DIST_RANK";
    else if (!env_int("SG_DIST_LOCAL_WORLD", 1, out->world, &out->local_world)) bad = "SG_DIST_LOCAL_WORLD";
    else if (!env_int("SG_DIST_LOCAL_RANK", 0, out->local_world - 1, &out->local_rank)) bad = "SG_DIST_LOCAL_RANK";
    else if (!getenv("SG_DIST_ID") || sg_dist_id_from_hex(getenv("SG_DIST_ID"), &out->id) != SG_OK)
        bad = "SG_DIST_ID";
    if (bad) {
        const char *v = getenv(bad);
        char shown[96];
        if (v) snprintf(shown, sizeof shown, "'%.80s'", v);
        else snprintf(shown, sizeof shown, "unset");
        return sg_fail(NULL, SG_ERR_INVALID, "sg_dist_env_read: %s is %s; the launcher (stepgraph train "
                       "--gpus N) sets SG_DIST_RANK, SG_DIST_WORLD, SG_DIST_LOCAL_RANK, SG_DIST_LOCAL_WORLD and "
                       "SG_DIST_ID (%d hex digits) together", bad, shown, 2 * SG_DIST_ID_BYTES);
    }
    *found = 1;
    return SG_OK;
}

/* The environment of one worker: ours without old SG_DIST_* launch variables, plus its own.
 * Built before fork, so the child only calls execve (the parent may have threads: NCCL's). */
static char **worker_env(const sg_dist_env *e, char vars[N_ENV][2 * SG_DIST_ID_BYTES + 32])
{
    size_t n = 0;
    while (environ && environ[n]) n++;
    char **env = calloc(n + N_ENV + 1, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool ours = false;
        for (int j = 0; j < N_ENV && !ours; j++) {
            size_t l = strlen(env_names[j]);
            ours = !strncmp(environ[i], env_names[j], l) && environ[i][l] == '=';
        }
        if (!ours) env[k++] = environ[i];
    }
    char hex[2 * SG_DIST_ID_BYTES + 1];
    sg_dist_id_to_hex(&e->id, hex);
    int v[4] = {e->rank, e->world, e->local_rank, e->local_world};
    for (int j = 0; j < 4; j++) snprintf(vars[j], sizeof vars[j], "%s=%d", env_names[j], v[j]);
    snprintf(vars[4], sizeof vars[4], "%s=%s", env_names[4], hex);
    for (int j = 0; j < N_ENV; j++) env[k++] = vars[j];
    env[k] = NULL;
    return env;
}

/* argv[0] as execve needs it: itself when it holds a '/', else found on PATH. */
static bool find_program(const char *prog, char *out, size_t n)
{
    if (strchr(prog, '/')) {
        snprintf(out, n, "%s", prog);
        return access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path ? path : "/usr/bin:/bin");
    char *save = NULL;
    for (char *dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        snprintf(out, n, "%s/%s", dir, prog);
        struct stat sb;
        if (stat(out, &sb) == 0 && S_ISREG(sb.st_mode) && access(out, X_OK) == 0) return true;
    }
    return false;
}

/* ---- the run ---- */

typedef struct worker {
    pid_t pid;
    int rank;
    bool live;
} worker;

/* A message between launchers: a failure somewhere, or a node that finished. */
typedef struct link_msg {
    int32_t kind;              /* 'F' failure, 'D' done */
    int32_t rank, status, node;
    int32_t signalled;         /* status is 128 + the signal that killed the rank */
} link_msg;

typedef struct run {
    const sg_dist_launch_options *o;
    int nnodes;
    worker w[MAX_LOCAL];
    int n, live;
    bool stopping;
    double kill_at;
    bool killed;
    int n_killed;              /* workers still alive when SIGKILL went out */
    bool killed_by_signal;     /* a second SIGINT or SIGTERM sent it, not the grace period */
    /* SIGINT and SIGTERM while the workers run (see catch_signals). */
    bool caught[2];            /* we hold the signal (false: it was ignored, and stays so) */
    struct sigaction old_act[2];
    sigset_t old_mask;
    int signals_seen;          /* of sig_count, those acted on */
    int interrupt;             /* the signal that stopped the run (0: none) */
    int interrupt_n;           /* workers it stopped */
    sg_dist_link link;
    bool multi;
    bool node_done[64];        /* node 0: nodes that said they finished */
    /* The failure that stopped the run. */
    int fail_rank, fail_status, fail_node;
    char fail_what[256];
} run;

static int exit_status(int wst)
{
    if (WIFEXITED(wst)) return WEXITSTATUS(wst);
    if (WIFSIGNALED(wst)) return 128 + WTERMSIG(wst);
    return 255;
}

/* How a worker ended; signalled: status is 128 + the signal. */
static void describe(int status, bool signalled, char *buf, size_t n)
{
    if (signalled)
        snprintf(buf, n, "was killed by signal %d (%s)", status - 128, strsignal(status - 128));
    else if (status == 127)
        snprintf(buf, n, "exited with status 127 (its program could not be started, or it said so)");
    else
        snprintf(buf, n, "exited with status %d", status);
}

static void tell_nodes(run *r, link_msg m, int except)
{
    if (!r->multi) return;
    double deadline = sg_dist_now() + 2.0;
    if (r->o->node_rank != 0) {
        if (r->link.master_fd >= 0 && sg_net_send(r->link.master_fd, &m, sizeof m, deadline, "node 0") != SG_OK) {
            /* node 0 is gone: it stops on its own */
        }
        return;
    }
    for (int i = 1; i < r->link.n; i++)
        if (i != except && r->link.fd[i] >= 0 && !r->node_done[i] &&
            sg_net_send(r->link.fd[i], &m, sizeof m, deadline, "a node") != SG_OK) { /* gone already */ }
}

/* ---- SIGINT and SIGTERM to the launcher ---- *
 * The handler only counts; the wait loop acts (on_signals). One launch at a time per process:
 * the count is the process's. */

static const int caught_signals[2] = {SIGINT, SIGTERM};
static volatile sig_atomic_t sig_first, sig_count;

static void on_signal(int sig)
{
    if (!sig_first) sig_first = sig;
    if (sig_count < 1000) sig_count = sig_count + 1;
}

static const char *signal_name(int sig)
{
    return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

/* Holds SIGINT and SIGTERM for the run, unless the caller ignores them (a background job of
 * a shell, nohup): an ignored signal stays ignored, as it would for the workers. */
static void catch_signals(run *r)
{
    sig_first = 0, sig_count = 0;
    r->signals_seen = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int j = 0; j < 2; j++) sigaddset(&sa.sa_mask, caught_signals[j]);
    for (int j = 0; j < 2; j++) {
        r->caught[j] = false;
        if (sigaction(caught_signals[j], NULL, &r->old_act[j]) != 0) continue;
        if (!(r->old_act[j].sa_flags & SA_SIGINFO) && r->old_act[j].sa_handler == SIG_IGN) continue;
        r->caught[j] = sigaction(caught_signals[j], &sa, NULL) == 0;
    }
}

/* The caller's handlers back, once every worker has been reaped. */
static void release_signals(run *r)
{
    for (int j = 0; j < 2; j++)
        if (r->caught[j]) sigaction(caught_signals[j], &r->old_act[j], NULL), r->caught[j] = false;
}

/* In a new worker, between fork and exec (async-signal-safe calls only): the signals as the
 * caller had them, a SIGTERM when the launcher dies (PR_SET_PDEATHSIG; it survives execve),
 * and no start at all when the launcher died before that was in place (the worker is then
 * someone else's child). The parent death signal follows the thread that forked: sg_dist_launch
 * forks and waits on the calling thread, which so outlives every worker it starts. */
static void worker_exec(const run *r, pid_t launcher, const char *path, char **env)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int j = 0; j < 2; j++)
        if (r->caught[j]) sigaction(caught_signals[j], &dfl, NULL);
    /* An ignored SIGTERM would make the death signal a no-op: SIGKILL then. */
    int death = r->caught[1] || r->old_act[1].sa_handler != SIG_IGN ? SIGTERM : SIGKILL;
    if (prctl(PR_SET_PDEATHSIG, death) != 0) {
        static const char msg[] = "sg_dist_launch: prctl(PR_SET_PDEATHSIG) failed in a worker; not starting it\n";
        if (write(2, msg, sizeof msg - 1) < 0) { /* nothing to do */ }
        _exit(127);
    }
    if (getppid() != launcher) {
        static const char msg[] = "sg_dist_launch: the launcher ended before a worker started; not starting it\n";
        if (write(2, msg, sizeof msg - 1) < 0) { /* nothing to do */ }
        _exit(127);
    }
    pthread_sigmask(SIG_SETMASK, &r->old_mask, NULL); /* a pending signal acts here, by default */
    execve(path, r->o->argv, env);
    static const char msg[] = "sg_dist_launch: execve of the worker failed\n";
    if (write(2, msg, sizeof msg - 1) < 0) { /* nothing to do */ }
    _exit(127);
}

/* Every live worker gets SIGKILL now. */
static void kill_all(run *r)
{
    r->n_killed = 0;
    for (int i = 0; i < r->n; i++)
        if (r->w[i].live) kill(r->w[i].pid, SIGKILL), r->n_killed++;
    r->killed = true;
}

/* The first failure stops every live worker: SIGTERM now, SIGKILL after the grace period. */
static void stop_all(run *r, int rank, int status, bool signalled, int node, const char *what, int from_node)
{
    if (r->stopping) return;
    r->stopping = true;
    r->fail_rank = rank, r->fail_status = status, r->fail_node = node;
    snprintf(r->fail_what, sizeof r->fail_what, "%s", what);
    r->kill_at = sg_dist_now() + (r->o->grace_s > 0 ? r->o->grace_s : 5.0);
    for (int i = 0; i < r->n; i++)
        if (r->w[i].live) kill(r->w[i].pid, SIGTERM);
    tell_nodes(r, (link_msg){'F', rank, status, node, signalled}, from_node);
}

static void reap(run *r, int i, int wst)
{
    r->w[i].live = false;
    r->live--;
    int status = exit_status(wst);
    if (status != 0 && !r->stopping) {
        char what[160];
        describe(status, WIFSIGNALED(wst), what, sizeof what);
        stop_all(r, r->w[i].rank, status, WIFSIGNALED(wst), r->o->node_rank, what, -1);
    }
}

/* A message (or a closed connection) from another node's launcher. */
static void on_link(run *r, int fd, int node)
{
    link_msg m;
    char who[64];
    snprintf(who, sizeof who, "node %d's launcher", node);
    sg_status st = sg_net_recv(fd, &m, sizeof m, sg_dist_now() + 2.0, who);
    bool gone = st != SG_OK;
    if (!gone && m.kind == 'D') {
        if (r->o->node_rank == 0) r->node_done[node] = true;
        else r->link.master_fd = -1, close(fd);
        return;
    }
    if (!gone && m.kind == 'F') {
        char what[160];
        if (m.rank >= 0) describe(m.status, m.signalled != 0, what, sizeof what);
        else if (m.signalled && m.status > 128)
            snprintf(what, sizeof what, "node %d's launcher was interrupted (%s)", m.node,
                     signal_name(m.status - 128));
        else snprintf(what, sizeof what, "was lost");
        stop_all(r, m.rank, m.status, m.signalled != 0, m.node, what, node);
        return;
    }
    if (r->o->node_rank == 0) {
        close(fd);
        r->link.fd[node] = -1;
        if (r->node_done[node]) return;
    } else {
        close(fd);
        r->link.master_fd = -1;
    }
    char what[200];
    snprintf(what, sizeof what, "lost contact with %s (its host or launcher died?)", who);
    stop_all(r, -1, 0, false, node, what, node);
}

/* Waits up to ms for a message from another node; without other nodes, just sleeps. */
static void poll_links(run *r, int ms)
{
    struct pollfd p[64];
    int node[64], n = 0;
    if (r->multi && r->o->node_rank == 0) {
        for (int i = 1; i < r->link.n; i++)
            if (r->link.fd[i] >= 0) p[n] = (struct pollfd){r->link.fd[i], POLLIN, 0}, node[n++] = i;
    } else if (r->multi && r->link.master_fd >= 0) {
        p[n] = (struct pollfd){r->link.master_fd, POLLIN, 0}, node[n++] = 0;
    }
    if (n == 0) {
        usleep((useconds_t)ms * 1000);
        return;
    }
    if (poll(p, (nfds_t)n, ms) <= 0) return;
    for (int i = 0; i < n; i++)
        if (p[i].revents) on_link(r, p[i].fd, node[i]);
}

/* Acts on SIGINT and SIGTERM the handler counted: the first stops the run as a failure would
 * (the other nodes are told), one that comes while it stops already kills the workers now. */
static void on_signals(run *r)
{
    int count = sig_count;
    if (count == r->signals_seen) return;
    bool again = r->stopping;
    if (!r->stopping) {
        r->interrupt = sig_first ? sig_first : SIGTERM;
        r->interrupt_n = r->live;
        stop_all(r, -1, 128 + r->interrupt, true, r->o->node_rank, "", -1);
    }
    if ((again || count - r->signals_seen > 1) && !r->killed) r->killed_by_signal = true, kill_all(r);
    r->signals_seen = count;
}

static void wait_all(run *r)
{
    while (r->live > 0) {
        on_signals(r);
        for (int i = 0; i < r->n; i++) {
            if (!r->w[i].live) continue;
            int wst = 0;
            pid_t p = waitpid(r->w[i].pid, &wst, WNOHANG);
            if (p == r->w[i].pid) reap(r, i, wst);
            else if (p < 0 && errno == ECHILD) r->w[i].live = false, r->live--; /* reaped elsewhere */
        }
        if (r->live == 0) break;
        if (r->stopping && !r->killed && sg_dist_now() >= r->kill_at) kill_all(r);
        poll_links(r, 20);
    }
}

/* Forks the workers with SIGINT and SIGTERM blocked, so that neither runs the launcher's
 * handler in a child before it execs (where the signal would be lost). */
static sg_status start_workers(run *r, const char *path, const sg_dist_id *id)
{
    const sg_dist_launch_options *o = r->o;
    pid_t launcher = getpid();
    sigset_t block;
    sigemptyset(&block);
    for (int j = 0; j < 2; j++) sigaddset(&block, caught_signals[j]);
    for (int i = 0; i < o->local_world; i++) {
        sg_dist_env e = {o->node_rank * o->local_world + i, r->nnodes * o->local_world, i, o->local_world, *id};
        char vars[N_ENV][2 * SG_DIST_ID_BYTES + 32];
        char **env = worker_env(&e, vars);
        if (!env) return sg_fail(NULL, SG_ERR_OOM, "sg_dist_launch: out of host memory");
        pthread_sigmask(SIG_BLOCK, &block, &r->old_mask);
        pid_t pid = fork();
        if (pid == 0) worker_exec(r, launcher, path, env);
        pthread_sigmask(SIG_SETMASK, &r->old_mask, NULL);
        free(env);
        if (pid < 0)
            return sg_fail(NULL, SG_ERR_DIST, "sg_dist_launch: fork of worker %d failed: %s", i, strerror(errno));
        r->w[i] = (worker){pid, e.rank, true};
        r->n++, r->live++;
    }
    return SG_OK;
}

sg_status sg_dist_launch(const sg_dist_launch_options *o, sg_dist_launch_result *res)
{
    if (res) *res = (sg_dist_launch_result){-1, 0, -1, 0};
    if (!o || !o->argv || !o->argv[0]) return sg_fail(NULL, SG_ERR_NULL, "sg_dist_launch: options or argv is NULL");
    int nnodes = o->nnodes > 0 ? o->nnodes : 1;
    if (o->local_world < 1 || o->local_world > MAX_LOCAL || nnodes > 64 || o->node_rank < 0 ||
        o->node_rank >= nnodes || (nnodes > 1 && !o->master) || nnodes * o->local_world > SG_DIST_MAX_WORLD)
        return sg_fail(NULL, SG_ERR_INVALID, "sg_dist_launch: %d workers a node, %d nodes, node rank %d%s: "
                       "expected 1 to %d workers, 1 to 64 nodes, a node rank below them and a master "
                       "address with several nodes", o->local_world, nnodes, o->node_rank,
                       nnodes > 1 && !o->master ? " and no master" : "", MAX_LOCAL);
    char path[PATH_MAX];
    if (!find_program(o->argv[0], path, sizeof path))
        return sg_fail(NULL, SG_ERR_INVALID, "sg_dist_launch: cannot execute '%s' (not found, or not "
                       "executable)", o->argv[0]);
    run *r = calloc(1, sizeof *r);
    if (!r) return sg_fail(NULL, SG_ERR_OOM, "sg_dist_launch: out of host memory");
    r->o = o;
    r->nnodes = nnodes;
    r->link.master_fd = -1;
    for (int i = 0; i < 64; i++) r->link.fd[i] = -1;
    sg_dist_id id = o->id;
    r->multi = nnodes > 1;
    sg_status st = SG_OK;
    if (r->multi)
        st = sg_dist_exchange_open(o->master, nnodes, o->node_rank, o->local_world,
                                   o->timeout_s > 0 ? o->timeout_s : 60.0, &id, &r->link);
    /* From the first fork to the last reap: SIGINT and SIGTERM stop the workers. */
    if (st == SG_OK) catch_signals(r), st = start_workers(r, path, &id);
    if (st != SG_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", sg_ctx_last_error(NULL));
        stop_all(r, -1, 0, false, o->node_rank, "could not start", -1);
        wait_all(r);
        release_signals(r);
        sg_dist_link_close(&r->link);
        free(r);
        return sg_fail(NULL, st, "%s", msg);
    }
    wait_all(r);
    release_signals(r);
    if (!r->stopping) tell_nodes(r, (link_msg){'D', -1, 0, o->node_rank, 0}, -1);
    sg_dist_link_close(&r->link);
    if (!r->stopping) {
        free(r);
        return SG_OK;
    }
    if (r->interrupt) {
        /* Documented in dist.h: failed_rank and failed_node -1, exit_status 128 + the signal. */
        if (res) *res = (sg_dist_launch_result){-1, 128 + r->interrupt, -1, r->interrupt};
        char killed[96] = "";
        if (r->killed && r->n_killed > 0)
            snprintf(killed, sizeof killed, " (%d with SIGKILL, %s)", r->n_killed,
                     r->killed_by_signal ? "after a second signal" : "after the grace period");
        st = sg_fail(NULL, SG_ERR_DIST, "sg_dist_launch: interrupted (%s): stopped %d worker%s%s%s",
                     signal_name(r->interrupt), r->interrupt_n, r->interrupt_n == 1 ? "" : "s", killed,
                     r->multi ? " and told the other nodes" : "");
        free(r);
        return st;
    }
    /* No rank failed (a node lost, or interrupted elsewhere): exit_status 0, see dist.h. */
    if (res) *res = (sg_dist_launch_result){r->fail_rank, r->fail_rank >= 0 ? r->fail_status : 0, r->fail_node, 0};
    char who[96] = "";
    if (r->fail_rank >= 0 && r->fail_node == o->node_rank)
        snprintf(who, sizeof who, "rank %d (GPU %d) ", r->fail_rank, r->fail_rank - o->node_rank * o->local_world);
    else if (r->fail_rank >= 0)
        snprintf(who, sizeof who, "rank %d on node %d ", r->fail_rank, r->fail_node);
    st = sg_fail(NULL, SG_ERR_DIST, "sg_dist_launch: %s%s; stopped %s", who, r->fail_what,
                 r->multi ? "the workers of every node" : "the other workers");
    free(r);
    return st;
}
