/* net.c: the socket helpers of data parallelism: exact sends and receives, listening and
 * connecting over TCP (the launcher's id exchange) and local abstract Unix sockets (the CPU
 * transport), every wait bounded by a deadline so a missing peer gives an error, not a hang.
 * Errors go to the thread's message (sg_fail(NULL, ...)); callers with a context copy it. */
#define _GNU_SOURCE

#include "dist/dist.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

double sg_dist_now(void) { return sg_clock_us() / 1e6; }

/* Milliseconds left before the deadline, for poll (at least 0). */
static int ms_left(double deadline)
{
    double left = (deadline - sg_dist_now()) * 1e3;
    return left <= 0 ? 0 : left > 1e9 ? 1000000000 : (int)left + 1;
}

/* Waits until fd is readable (or writable); SG_ERR_DIST when the deadline passes first. */
static sg_status wait_fd(int fd, short events, double deadline, const char *what, const char *doing)
{
    for (;;) {
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, ms_left(deadline));
        if (r > 0) return SG_OK;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return sg_fail(NULL, SG_ERR_DIST, "poll while %s %s: %s", doing, what, strerror(errno));
        if (sg_dist_now() >= deadline)
            return sg_fail(NULL, SG_ERR_DIST, "timed out %s %s", doing, what);
    }
}

sg_status sg_net_send(int fd, const void *buf, size_t n, double deadline, const char *what)
{
    const char *p = buf;
    while (n > 0) {
        SG_TRY(wait_fd(fd, POLLOUT, deadline, what, "sending to"));
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (k < 0)
            return sg_fail(NULL, SG_ERR_DIST, "sending to %s failed: %s (its process ended?)", what,
                           strerror(errno));
        p += k, n -= (size_t)k;
    }
    return SG_OK;
}

sg_status sg_net_recv(int fd, void *buf, size_t n, double deadline, const char *what)
{
    char *p = buf;
    while (n > 0) {
        SG_TRY(wait_fd(fd, POLLIN, deadline, what, "waiting for"));
        ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (k < 0)
            return sg_fail(NULL, SG_ERR_DIST, "receiving from %s failed: %s", what, strerror(errno));
        if (k == 0)
            return sg_fail(NULL, SG_ERR_DIST, "%s closed the connection (its process ended?)", what);
        p += k, n -= (size_t)k;
    }
    return SG_OK;
}

sg_status sg_net_parse_addr(const char *addr, char *host, size_t host_n, char *port, size_t port_n)
{
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    size_t hl = colon ? (size_t)(colon - addr) : 0;
    const char *h = addr;
    if (hl >= 2 && addr[0] == '[' && addr[hl - 1] == ']') h++, hl -= 2; /* [::1]:port */
    bool ok = colon && hl > 0 && hl < host_n && colon[1] && strlen(colon + 1) < port_n;
    for (const char *c = colon ? colon + 1 : ""; ok && *c; c++) ok = *c >= '0' && *c <= '9';
    long p = ok ? strtol(colon + 1, NULL, 10) : 0;
    if (!ok || p < 1 || p > 65535)
        return sg_fail(NULL, SG_ERR_INVALID, "address '%s': expected HOST:PORT with a port from 1 to 65535 "
                       "(e.g. 10.0.0.1:29500)", addr ? addr : "(null)");
    memcpy(host, h, hl);
    host[hl] = '\0';
    snprintf(port, port_n, "%s", colon + 1);
    return SG_OK;
}

static sg_status resolve(const char *addr, bool passive, struct addrinfo **out)
{
    char host[256], port[16];
    SG_TRY(sg_net_parse_addr(addr, host, sizeof host, port, sizeof port));
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    int e = getaddrinfo(host, port, &hints, out);
    if (e != 0)
        return sg_fail(NULL, SG_ERR_DIST, "cannot resolve '%s' (of %s): %s", host, addr, gai_strerror(e));
    return SG_OK;
}

static void set_nodelay(int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) { /* latency only */ }
}

sg_status sg_net_listen_tcp(const char *addr, int *fd)
{
    *fd = -1;
    struct addrinfo *ai = NULL;
    SG_TRY(resolve(addr, true, &ai));
    int err = 0;
    for (struct addrinfo *a = ai; a && *fd < 0; a = a->ai_next) {
        int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
            bind(s, a->ai_addr, a->ai_addrlen) != 0 || listen(s, 128) != 0) {
            err = errno;
            close(s);
            continue;
        }
        *fd = s;
    }
    freeaddrinfo(ai);
    if (*fd < 0)
        return sg_fail(NULL, SG_ERR_DIST, "cannot listen on %s: %s (another run on that port? a --master "
                       "address that is not this host's?)", addr, strerror(err));
    return SG_OK;
}

/* One non-blocking connect, waited for until the deadline; 0 or the errno. */
static int connect_once(const struct addrinfo *a, double deadline, int *fd)
{
    int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (s < 0) return errno;
    int r = connect(s, a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
        struct pollfd p = {s, POLLOUT, 0};
        int pr;
        do pr = poll(&p, 1, ms_left(deadline));
        while (pr < 0 && errno == EINTR);
        int soerr = 0;
        socklen_t len = sizeof soerr;
        if (pr <= 0) soerr = ETIMEDOUT;
        else if (getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0) soerr = errno;
        r = soerr ? -1 : 0;
        errno = soerr;
    }
    if (r != 0) {
        int e = errno;
        close(s);
        return e;
    }
    *fd = s;
    return 0;
}

sg_status sg_net_connect_tcp(const char *addr, double deadline, int *fd)
{
    *fd = -1;
    struct addrinfo *ai = NULL;
    SG_TRY(resolve(addr, false, &ai));
    int err = 0, tries = 0;
    /* The listener may not be up yet: retry refused connections until the deadline. */
    while (*fd < 0) {
        for (struct addrinfo *a = ai; a && *fd < 0; a = a->ai_next) err = connect_once(a, deadline, fd);
        tries++;
        if (*fd >= 0 || sg_dist_now() >= deadline) break;
        usleep(50000);
    }
    freeaddrinfo(ai);
    if (*fd < 0)
        return sg_fail(NULL, SG_ERR_DIST, "cannot connect to %s: %s (%d attempts until the deadline; is node "
                       "0's launcher running there, and is the port open?)", addr, strerror(err), tries);
    set_nodelay(*fd);
    return SG_OK;
}

sg_status sg_net_accept(int lfd, double deadline, const char *what, int *fd)
{
    *fd = -1;
    for (;;) {
        SG_TRY(wait_fd(lfd, POLLIN, deadline, what, "waiting for a connection from"));
        int s = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (s >= 0) {
            *fd = s;
            set_nodelay(s);
            return SG_OK;
        }
        if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
            return sg_fail(NULL, SG_ERR_DIST, "accepting %s failed: %s", what, strerror(errno));
    }
}

/* An abstract socket address: no file to clean up, gone with the last descriptor. */
static socklen_t local_addr(const char *name, struct sockaddr_un *sa)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    size_t n = strlen(name);
    if (n > sizeof sa->sun_path - 2) n = sizeof sa->sun_path - 2;
    memcpy(sa->sun_path + 1, name, n); /* sun_path[0] = 0: the abstract namespace */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

sg_status sg_net_listen_local(const char *name, int *fd)
{
    struct sockaddr_un sa;
    socklen_t len = local_addr(name, &sa);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return sg_fail(NULL, SG_ERR_DIST, "socket(AF_UNIX) failed: %s", strerror(errno));
    if (bind(s, (struct sockaddr *)&sa, len) != 0 || listen(s, 128) != 0) {
        int e = errno;
        close(s);
        return sg_fail(NULL, SG_ERR_DIST, "cannot listen on local socket '@%s': %s (is another rank 0 of "
                       "this id running?)", name, strerror(e));
    }
    *fd = s;
    return SG_OK;
}

sg_status sg_net_connect_local(const char *name, double deadline, int *fd)
{
    struct sockaddr_un sa;
    socklen_t len = local_addr(name, &sa);
    int err = 0;
    for (;;) {
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0) return sg_fail(NULL, SG_ERR_DIST, "socket(AF_UNIX) failed: %s", strerror(errno));
        if (connect(s, (struct sockaddr *)&sa, len) == 0) {
            *fd = s;
            return SG_OK;
        }
        err = errno;
        close(s);
        if (sg_dist_now() >= deadline) break;
        usleep(10000); /* rank 0 may not listen yet */
    }
    *fd = -1;
    return sg_fail(NULL, SG_ERR_DIST, "cannot reach rank 0 at local socket '@%s': %s until the deadline (did "
                   "rank 0 start, with the same id?)", name, strerror(err));
}
