/* The engine's inbound control channel: the TCP listener and its accept thread, one serving
 * thread per accepted connection (tcp here, unix ones from local.c's accept loop) and their
 * reaping, and the protocol every tcp connection starts with: HELLO (answered with this
 * engine's hello), then NOTIFY (queued for ty_xfer_notify_poll), RDMA_CONNECT (handed to the
 * RDMA transport) and the tcp data path's WRITE and READ (served by tcp.c). The dialing half of
 * the hello, which every transport uses to reach a peer's channel, is here too.
 *
 * Threading: the accept thread and the serving threads are the engine's; inbound_mu guards the
 * list of connections. Ownership: the engine owns every inbound connection; a finished one is
 * reaped (joined, closed, freed) when the next one arrives or the engine is freed.
 */
#include "xfer-impl.h"

#include "tycho/auth.h"
#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- the cluster handshake ----------------------------------------------------------------- */

int ty__xfer_auth(ty_xfer_engine_t *e, int fd, bool server, const char *peer)
{
    char why[160];
    int rc = ty_auth_handshake_fd(fd, e->auth, server, TY_AUTH_TIMEOUT_MS, why, sizeof(why));
    if (rc) {
        atomic_fetch_add(&e->st.auth_failures, 1);
        if (!atomic_load(&e->stopping))
            TY_LOG_WARN(TY_XFER_SUBSYS, "%s connection %s %s: cluster authentication failed: %s",
                        server ? "dropping inbound" : "cannot open", server ? "from" : "to", peer,
                        why[0] ? why : ty_strerror(rc));
    }
    return rc;
}

/* ---- serving a tcp connection -------------------------------------------------------------- */

static int serve_hello(ty_xfer_engine_t *e, struct ty__xfer_inbound *in,
                       const struct ty__xfer_hdr *h)
{
    int rc = ty__xfer_recv_all(in->fd, in->peer_name, (size_t)h->len);
    if (rc)
        return rc;
    in->peer_name[h->len] = '\0';
    if (h->addr != TY__XFER_VERSION)
        return ty__xfer_send_status(in->fd, TY__XFER_MSG_HELLO_REPLY, h->seq, TY_EPROTO);
    struct ty__xfer_hello hello;
    uint8_t *body, hb[TY__XFER_HDR_SIZE];
    size_t len;
    ty__xfer_engine_hello(e, &hello);
    ty__xfer_hello_encode(&hello, &body, &len);
    ty__xfer_hello_clear(&hello);
    struct ty__xfer_hdr rh = {.type = TY__XFER_MSG_HELLO_REPLY, .len = len};
    ty__xfer_hdr_encode(&rh, hb);
    struct iovec iov[2] = {{hb, sizeof(hb)}, {body, len}};
    rc = ty__xfer_sendv_all(in->fd, iov, 2);
    free(body);
    return rc;
}

static int serve_notify(ty_xfer_engine_t *e, struct ty__xfer_inbound *in,
                        const struct ty__xfer_hdr *h)
{
    uint8_t msg[TY_XFER_NOTIFY_MAX];
    int rc = ty__xfer_recv_all(in->fd, msg, (size_t)h->len);
    if (rc)
        return rc;
    /* The sender's fence put every earlier write's ACK before this message, but those writes
     * may have landed through other connections' threads: acquire what they published, so the
     * poller of this notification is ordered after them in this process too. */
    (void)atomic_load_explicit(&e->st.served_in, memory_order_acquire);
    return ty__xfer_send_status(in->fd, TY__XFER_MSG_ACK, h->seq,
                 ty__xfer_notify_push(e, in->peer_name, msg, (size_t)h->len));
}

/* Wait for the next header. An idle connection is fine; a header cut short is not. */
static int recv_hdr_idle(ty_xfer_engine_t *e, int fd, uint8_t *hb)
{
    size_t got = 0;
    while (got < TY__XFER_HDR_SIZE) {
        ssize_t n = recv(fd, hb + got, TY__XFER_HDR_SIZE - got, 0);
        if (n == 0)
            return TY_ECONNRESET;
        if (n < 0) {
            if (errno == EINTR || ((errno == EAGAIN) && got == 0 && !atomic_load(&e->stopping)))
                continue;
            return errno == EAGAIN ? TY_ETIMEDOUT : ty_errno();
        }
        got += (size_t)n;
    }
    return 0;
}

static void serve_tcp(ty_xfer_engine_t *e, struct ty__xfer_inbound *in)
{
    uint8_t hb[TY__XFER_HDR_SIZE];
    struct ty__xfer_hdr h;
    if (ty__xfer_auth(e, in->fd, true, in->peer_addr) != 0)
        return;
    atomic_store(&in->proven, true);
    ty__xfer_sock_timeouts(in->fd, e->timeout_ms);
    int rc = 0;
    bool hello = false;
    while (rc == 0 && !atomic_load(&e->stopping)) {
        if ((rc = recv_hdr_idle(e, in->fd, hb)) != 0)
            break;
        if ((rc = ty__xfer_hdr_decode(hb, &h)) != 0)
            break;
        if (!hello && h.type != TY__XFER_MSG_HELLO) {
            rc = TY_EPROTO;
            break;
        }
        switch (h.type) {
        case TY__XFER_MSG_HELLO:
            rc = hello ? TY_EPROTO : serve_hello(e, in, &h);
            hello = true;
            break;
        case TY__XFER_MSG_WRITE:
            rc = ty__xfer_tcp_serve_write(e, in, &h);
            break;
        case TY__XFER_MSG_READ:
            rc = ty__xfer_tcp_serve_read(e, in, &h);
            break;
        case TY__XFER_MSG_NOTIFY:
            rc = serve_notify(e, in, &h);
            break;
        case TY__XFER_MSG_RDMA_CONNECT:
            rc = ty__xfer_rdma_serve_connect(e, in, &h);
            break;
        default:
            rc = TY_EPROTO;
        }
    }
    ty__xfer_rdma_serve_free(in); /* the QPs of an rdma peer live as long as its control conn */
    if (rc && rc != TY_ECONNRESET && !atomic_load(&e->stopping))
        TY_LOG_WARN(TY_XFER_SUBSYS, "closing inbound connection from '%s': %s",
                    in->peer_name[0] ? in->peer_name : "?", ty_strerror(rc));
}

/* ---- listener and connections ------------------------------------------------------------- */

int ty__xfer_inbound_listen(ty_xfer_engine_t *e, uint16_t port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, e->listen_host, &sa.sin_addr) != 1) {
        TY_LOG_ERROR(TY_XFER_SUBSYS, "listen_host '%s' is not an IPv4 address", e->listen_host);
        return TY_EINVAL;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return ty_errno();
    int one = 1, rc;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
        rc = ty_errno();
        TY_LOG_ERROR(TY_XFER_SUBSYS, "cannot listen on %s:%u: %s", e->listen_host, port,
                     ty_strerror(rc));
        close(fd);
        return rc;
    }
    socklen_t sl = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    e->port = ntohs(sa.sin_port);
    e->listen_fd = fd;
    return 0;
}

void ty__xfer_inbound_reap(ty_xfer_engine_t *e, bool all)
{
    pthread_mutex_lock(&e->inbound_mu);
    struct ty__xfer_inbound **pp = &e->inbound, *done = NULL;
    while (*pp) {
        struct ty__xfer_inbound *in = *pp;
        if (all)
            shutdown(in->fd, SHUT_RDWR);
        if (all || atomic_load(&in->finished)) {
            *pp = in->next;
            in->next = done;
            done = in;
        } else {
            pp = &in->next;
        }
    }
    pthread_mutex_unlock(&e->inbound_mu);
    while (done) {
        struct ty__xfer_inbound *next = done->next;
        pthread_join(done->thr, NULL);
        close(done->fd);
#ifdef TY_XFER_HAVE_CUDA
        ty__xfer_cuda_stage_free(&done->stage);
#endif
        free(done);
        done = next;
    }
}

static void *inbound_main(void *arg)
{
    struct ty__xfer_inbound *in = arg;
    if (in->is_unix)
        ty__xfer_local_serve(in->engine, in);
    else
        serve_tcp(in->engine, in);
    shutdown(in->fd, SHUT_RDWR);
    atomic_store(&in->finished, true);
    return NULL;
}

/* Unproven connections (still in the handshake) beyond this push out the oldest of them: a
 * flood of half-open connections cannot keep the cluster's own peers out. */
#define UNPROVEN_MAX 64

/* With inbound_mu held: room for one more connection? Pushes out the oldest unproven one when
 * the unproven are at their cap (its thread sees the shutdown and ends). */
static bool inbound_room(ty_xfer_engine_t *e, uint32_t peer_ip)
{
    uint32_t total = 0, unproven = 0, same = 0;
    struct ty__xfer_inbound *oldest = NULL;
    for (struct ty__xfer_inbound *in = e->inbound; in; in = in->next) {
        if (atomic_load(&in->finished))
            continue;
        total++;
        same += peer_ip && in->peer_ip == peer_ip && atomic_load(&in->proven);
        if (!atomic_load(&in->proven)) {
            unproven++;
            oldest = in; /* the list is newest first */
        }
    }
    if (same >= e->max_inbound / 4) {
        TY_LOG_WARN(TY_XFER_SUBSYS, "refusing an inbound connection: its address holds %u, the "
                    "most one peer may", same);
        return false;
    }
    if (oldest && (unproven >= UNPROVEN_MAX || total >= e->max_inbound)) {
        shutdown(oldest->fd, SHUT_RDWR);
        atomic_store(&oldest->finished, true); /* not counted again; reaped when it ends */
        atomic_fetch_add(&e->st.refused_conns, 1);
        TY_LOG_WARN(TY_XFER_SUBSYS, "dropping the oldest unproven inbound connection (%u "
                    "unproven, %u open)", unproven, total);
        total--;
    }
    return total < e->max_inbound;
}

void ty__xfer_inbound_start(ty_xfer_engine_t *e, int fd, bool is_unix)
{
    struct ty__xfer_inbound *in = calloc(1, sizeof(*in));
    if (!in)
        abort();
    in->fd = fd;
    in->is_unix = is_unix;
    in->engine = e;
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    snprintf(in->peer_addr, sizeof(in->peer_addr), "?");
    if (!is_unix && getpeername(fd, (struct sockaddr *)&sa, &sl) == 0 &&
        sa.sin_family == AF_INET) {
        in->peer_ip = sa.sin_addr.s_addr | 1u; /* never 0 */
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
        snprintf(in->peer_addr, sizeof(in->peer_addr), "%s:%u", ip, ntohs(sa.sin_port));
    }
    ty__xfer_inbound_reap(e, false);
    pthread_mutex_lock(&e->inbound_mu);
    if (!inbound_room(e, in->peer_ip)) {
        pthread_mutex_unlock(&e->inbound_mu);
        atomic_fetch_add(&e->st.refused_conns, 1);
        TY_LOG_WARN(TY_XFER_SUBSYS, "refused an inbound connection (%u at most in all)",
                    e->max_inbound);
        close(fd);
        free(in);
        return;
    }
    if (atomic_load(&e->stopping) || pthread_create(&in->thr, NULL, inbound_main, in) != 0) {
        pthread_mutex_unlock(&e->inbound_mu);
        close(fd);
        free(in);
        return;
    }
    in->next = e->inbound;
    e->inbound = in;
    pthread_mutex_unlock(&e->inbound_mu);
}

/* Accept loop of one listening socket, until the engine stops. */
static void accept_loop(ty_xfer_engine_t *e, int listen_fd, bool is_unix)
{
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (atomic_load(&e->stopping)) {
            if (fd >= 0)
                close(fd);
            return;
        }
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE) {
                TY_LOG_WARN(TY_XFER_SUBSYS, "accept: out of file descriptors");
                ty_sleep_ns(10 * TY_NS_PER_MS);
                continue;
            }
            return;
        }
        if (!is_unix) {
            /* Acks and small replies must not wait for Nagle + delayed ACK (~40 ms a round). */
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        ty__xfer_inbound_start(e, fd, is_unix);
    }
}

void *ty__xfer_inbound_accept_main(void *arg)
{
    ty_xfer_engine_t *e = arg;
    accept_loop(e, e->listen_fd, false);
    return NULL;
}

void *ty__xfer_inbound_accept_unix_main(void *arg)
{
    ty_xfer_engine_t *e = arg;
    accept_loop(e, e->unix_fd, true);
    return NULL;
}

/* ---- the hello, dialing side ------------------------------------------------------------- */

int ty__xfer_inbound_dial(ty_xfer_engine_t *e, const char *host, uint16_t port,
                          struct ty__xfer_hello *hello)
{
    int fd = ty__xfer_tcp_connect(host, port, e->timeout_ms);
    if (fd < 0)
        return fd;
    char addr[160];
    snprintf(addr, sizeof(addr), "%s:%u", host, port);
    int rc = ty__xfer_auth(e, fd, false, addr);
    if (rc) {
        close(fd);
        return rc;
    }
    ty__xfer_sock_timeouts(fd, e->timeout_ms);
    struct ty__xfer_hdr h = {
        .type = TY__XFER_MSG_HELLO, .addr = TY__XFER_VERSION, .len = strlen(e->name)};
    uint8_t hb[TY__XFER_HDR_SIZE], *body = NULL;
    ty__xfer_hdr_encode(&h, hb);
    struct iovec iov[2] = {{hb, sizeof(hb)}, {e->name, (size_t)h.len}};
    rc = ty__xfer_sendv_all(fd, iov, 2);
    if (rc || (rc = ty__xfer_recv_all(fd, hb, sizeof(hb))) != 0)
        goto err_close;
    if ((rc = ty__xfer_hdr_decode(hb, &h)) != 0 || h.type != TY__XFER_MSG_HELLO_REPLY) {
        rc = TY_EPROTO;
        goto err_close;
    }
    if (h.status) {
        rc = h.status;
        goto err_close;
    }
    body = malloc(h.len ? h.len : 1);
    if (!body)
        abort();
    if ((rc = ty__xfer_recv_all(fd, body, (size_t)h.len)) != 0)
        goto err_free;
    struct ty__xfer_hello tmp;
    if ((rc = ty__xfer_hello_decode(body, (size_t)h.len, &tmp)) != 0)
        goto err_free;
    if (hello)
        *hello = tmp;
    else
        ty__xfer_hello_clear(&tmp);
    free(body);
    /* Replies may legitimately take long when a slice is large; the watchdog bounds stalls. */
    ty__xfer_sock_timeouts(fd, 0);
    return fd;
err_free:
    free(body);
err_close:
    close(fd);
    return rc;
}
