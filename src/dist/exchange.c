/* exchange.c: the id exchange between hosts. Node 0's launcher listens on --master ADDR:PORT;
 * every other node's launcher connects, says who it is (node rank, node count, workers per
 * node), and receives the run's id once all have arrived and agree. The connections stay open
 * for the launchers to stop each other's workers when one fails (launch.c). Every wait is
 * bounded by the timeout. */
#include "dist/dist.h"

#include <stdio.h>
#include <unistd.h>

#define HELLO_MAGIC "SGDXCH01"

typedef struct hello {
    char magic[8];
    int32_t node_rank, nnodes, local_world;
} hello;

typedef struct reply {
    char magic[8];
    int32_t ok;
    int32_t world;
    unsigned char id[SG_DIST_ID_BYTES];
    char reason[256];
} reply;

sg_status sg_dist_wrap(sg_status st, const char *prefix)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sg_ctx_last_error(NULL));
    return sg_fail(NULL, st, "%s: %s", prefix, msg);
}

void sg_dist_link_close(sg_dist_link *link)
{
    for (int i = 0; i < link->n && i < 64; i++)
        if (link->fd[i] >= 0) close(link->fd[i]);
    if (link->master_fd >= 0) close(link->master_fd);
    for (int i = 0; i < 64; i++) link->fd[i] = -1;
    link->master_fd = -1;
}

/* Why hello h cannot join (empty when it can). */
static void check_hello(const hello *h, int nnodes, int local_world, const int *fd, char *why, size_t n)
{
    why[0] = '\0';
    if (memcmp(h->magic, HELLO_MAGIC, 8) != 0)
        snprintf(why, n, "a connection that is not a stepgraph launcher (or of another version)");
    else if (h->nnodes != nnodes)
        snprintf(why, n, "node %d was started with --nnodes %d, node 0 with --nnodes %d", h->node_rank,
                 h->nnodes, nnodes);
    else if (h->node_rank < 1 || h->node_rank >= nnodes)
        snprintf(why, n, "node rank %d: expected 1 to %d", h->node_rank, nnodes - 1);
    else if (fd[h->node_rank] >= 0)
        snprintf(why, n, "two nodes were started with --node-rank %d", h->node_rank);
    else if (h->local_world != local_world)
        snprintf(why, n, "node %d runs %d workers (--gpus), node 0 runs %d; every node must run as many",
                 h->node_rank, h->local_world, local_world);
}

static void send_reply(int fd, bool ok, int world, const sg_dist_id *id, const char *reason, double deadline)
{
    reply r;
    memset(&r, 0, sizeof r);
    memcpy(r.magic, HELLO_MAGIC, 8);
    r.ok = ok;
    r.world = world;
    if (ok) memcpy(r.id, id->bytes, SG_DIST_ID_BYTES);
    snprintf(r.reason, sizeof r.reason, "%s", reason ? reason : "");
    if (sg_net_send(fd, &r, sizeof r, deadline, "a node") != SG_OK) { /* it will time out itself */ }
}

static sg_status master_side(const char *master, int nnodes, int local_world, double timeout_s,
                             const sg_dist_id *id, sg_dist_link *link)
{
    int lfd;
    SG_TRY(sg_net_listen_tcp(master, &lfd));
    double deadline = sg_dist_now() + timeout_s;
    sg_status st = SG_OK;
    char why[256] = "";
    for (int got = 0; got < nnodes - 1 && st == SG_OK;) {
        int fd;
        st = sg_net_accept(lfd, deadline, "the other nodes", &fd);
        if (st != SG_OK) {
            char missing[256] = "";
            size_t k = 0;
            for (int i = 1; i < nnodes && k < sizeof missing - 8; i++)
                if (link->fd[i] < 0) k += (size_t)snprintf(missing + k, sizeof missing - k, "%s%d", k ? ", " : "", i);
            st = sg_fail(NULL, SG_ERR_DIST, "only %d of the %d other nodes connected to %s within %.1f s "
                         "(missing node ranks: %s)", got, nnodes - 1, master, timeout_s, missing);
            break;
        }
        hello h;
        if (sg_net_recv(fd, &h, sizeof h, deadline, "a connecting node") != SG_OK) {
            close(fd); /* not a launcher, or one that died: wait for the real ones */
            continue;
        }
        check_hello(&h, nnodes, local_world, link->fd, why, sizeof why);
        if (why[0]) {
            send_reply(fd, false, 0, id, why, deadline);
            close(fd);
            st = sg_fail(NULL, SG_ERR_DIST, "%s", why);
            break;
        }
        link->fd[h.node_rank] = fd;
        got++;
    }
    close(lfd);
    for (int i = 1; i < nnodes; i++)
        if (link->fd[i] >= 0)
            send_reply(link->fd[i], st == SG_OK, nnodes * local_world, id,
                       st == SG_OK ? NULL : why[0] ? why : "a node did not arrive in time", deadline);
    return st;
}

static sg_status node_side(const char *master, int nnodes, int node_rank, int local_world,
                           double timeout_s, sg_dist_id *id, sg_dist_link *link)
{
    double deadline = sg_dist_now() + timeout_s;
    int fd;
    SG_TRY(sg_net_connect_tcp(master, deadline, &fd));
    link->master_fd = fd;
    hello h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, HELLO_MAGIC, 8);
    h.node_rank = node_rank, h.nnodes = nnodes, h.local_world = local_world;
    char what[300];
    snprintf(what, sizeof what, "node 0 at %s", master);
    SG_TRY(sg_net_send(fd, &h, sizeof h, deadline, what));
    reply r;
    sg_status st = sg_net_recv(fd, &r, sizeof r, deadline, what);
    if (st != SG_OK && sg_dist_now() >= deadline)
        return sg_fail(NULL, SG_ERR_DIST, "no answer from node 0 at %s within %.1f s: it accepted the "
                       "connection but sent no id (are all nodes started, and is that node 0's launcher?)",
                       master, timeout_s);
    if (st != SG_OK) return st;
    r.reason[sizeof r.reason - 1] = '\0';
    if (memcmp(r.magic, HELLO_MAGIC, 8) != 0)
        return sg_fail(NULL, SG_ERR_DIST, "%s answered, but not as a stepgraph launcher", master);
    if (!r.ok) return sg_fail(NULL, SG_ERR_DIST, "node 0 at %s stopped the run: %s", master, r.reason);
    memcpy(id->bytes, r.id, SG_DIST_ID_BYTES);
    return SG_OK;
}

sg_status sg_dist_exchange_open(const char *master, int nnodes, int node_rank, int local_world,
                                double timeout_s, sg_dist_id *id, sg_dist_link *link)
{
    memset(link, 0, sizeof *link);
    for (int i = 0; i < 64; i++) link->fd[i] = -1;
    link->master_fd = -1;
    link->n = nnodes;
    if (!master || !id || nnodes < 2 || nnodes > 64 || node_rank < 0 || node_rank >= nnodes ||
        local_world < 1 || !(timeout_s > 0))
        return sg_fail(NULL, SG_ERR_INVALID, "sg_dist_exchange_id: %d nodes, node rank %d, %d workers a node, "
                       "timeout %g s: expected 2 to 64 nodes, a node rank below them, at least one worker, a "
                       "positive timeout and a master address", nnodes, node_rank, local_world, timeout_s);
    char host[256], port[16];
    SG_TRY(sg_net_parse_addr(master, host, sizeof host, port, sizeof port));
    sg_status st = node_rank == 0 ? master_side(master, nnodes, local_world, timeout_s, id, link)
                                  : node_side(master, nnodes, node_rank, local_world, timeout_s, id, link);
    if (st != SG_OK) {
        sg_dist_link_close(link);
        char prefix[64];
        snprintf(prefix, sizeof prefix, "sg_dist_exchange_id: node %d", node_rank);
        return sg_dist_wrap(st, prefix);
    }
    return SG_OK;
}

sg_status sg_dist_exchange_id(const char *master, int nnodes, int node_rank, int local_world,
                              double timeout_s, sg_dist_id *id)
{
    sg_dist_link link;
    SG_TRY(sg_dist_exchange_open(master, nnodes, node_rank, local_world, timeout_s, id, &link));
    sg_dist_link_close(&link);
    return SG_OK;
}
