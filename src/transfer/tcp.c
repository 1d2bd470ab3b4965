/* TCP transport: several connections per peer, each with a sender thread and a reply thread.
 *
 * A task is cut into slices that wait in one per-peer queue; whichever connection has room takes
 * the next slice, so large transfers spread over all connections. Payloads go straight from and
 * into registered memory (sendmsg with an iovec of header + memory; recv into the target), and
 * every slice is acknowledged. A notification is a fence: it leaves the queue only when no slice
 * before it is unacknowledged. The peer mutex guards the queue, the per-connection FIFOs of
 * slices awaiting a reply, and the broken state; the engine watchdog calls tcp_tick() to break a
 * peer that made no progress for timeout_ms while it had work. Each sender sleeps on its own
 * condition variable and is woken only when it has room and there is work it may take (no
 * thundering herd on the peer mutex); a run of READ requests leaves in one sendmsg. A reply
 * thread that frees a place in its window sends the next READ requests itself when nothing but
 * READs is in flight on its connection (no handoff to the sender); `tx_busy` lets one thread
 * at a time take and send for a connection, so the wire order is the FIFO order. The target
 * side of WRITE and READ runs on the inbound connection's thread (inbound.c) and validates every
 * access against the region table.
 */
#include "xfer-impl.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/xxh3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Slices in flight per connection: the engine's tcp_window (2 unless set; up to this). Two
 * beat four by 15-25 % on loopback and between namespaces (docs/benchmarks.md): what is in
 * flight stays in cache. */
#define TCP_WINDOW_MAX 16

enum item_kind { ITEM_SLICE, ITEM_NOTIFY };

struct tcp_item {
    enum item_kind kind;
    struct ty__xfer_task *task;
    enum ty_xfer_op op;
    uint8_t *local; /* slice: local memory; notify: message */
    uint64_t remote;
    uint64_t len;
    uint64_t task_remote; /* the whole task's remote range */
    uint64_t task_len;
    uint64_t seq;
    bool local_cuda;
    uint32_t fence;
    int notify_rc; /* notify: result, valid when notify_done */
    bool notify_done;
    struct tcp_item *next;
};

struct tcp_peer;

struct tcp_conn {
    struct tcp_peer *peer;
    int fd;
    pthread_t send_thr, recv_thr;
    bool threads;
    struct tcp_item *fifo_head, *fifo_tail; /* sent, awaiting a reply */
    uint32_t inflight;
    uint32_t others_inflight;    /* of them, not READ slices (WRITE payloads, notifications) */
    bool tx_busy;                /* a thread is taking items for this conn and sending them */
    struct tcp_item *sending;    /* item whose memory sendmsg is reading now */
    bool reply_waits;            /* the reply thread waits on the peer's cv for `sending` */
    int lowat;                   /* the socket's SO_RCVLOWAT (reply thread) */
    pthread_cond_t cv;           /* the sender waits here for work it may take */
    bool waiting;                /* the sender is (about to be) waiting on cv */
    struct ty__xfer_stage stage; /* pinned staging for cuda memory, owned by the conn threads */
};

struct tcp_peer {
    ty_xfer_engine_t *e;
    char host[128];
    uint16_t port;
    pthread_mutex_t reconnect_mu; /* serializes reconnect and close; taken before mu */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* notify completion, a sender done with `sending` (after a break) */
    struct tcp_item *q_head, *q_tail;
    uint64_t queued;   /* items in the queue */
    uint64_t inflight; /* taken from the queue, not yet answered */
    uint32_t rr;       /* next connection to wake first (spreads work over connections) */
    uint64_t seq;
    bool broken, stop;
    int broken_err;
    _Atomic uint64_t progress_ns;
    uint32_t nconns;
    struct tcp_conn *conns;
};

/* ---- completion ---------------------------------------------------------------------------- */

/* Complete an item. mu held (notify waiters wait on cv). Slices are freed here. */
static void item_finish(struct tcp_peer *p, struct tcp_item *it, int rc)
{
    if (it->kind == ITEM_NOTIFY) {
        it->notify_rc = rc;
        it->notify_done = true;
        pthread_cond_broadcast(&p->cv);
        return;
    }
    ty__xfer_slice_done(it->task, rc ? 0 : it->len, rc);
    free(it);
}

/* Mark the peer broken, fail everything queued and wake every thread. mu held. */
static void peer_break(struct tcp_peer *p, int err)
{
    if (p->broken)
        return;
    p->broken = true;
    p->broken_err = err ? err : TY_ECONNRESET;
    if (!p->stop) {
        atomic_fetch_add(&p->e->st.peer_failures, 1);
        TY_LOG_WARN(TY_XFER_SUBSYS, "tcp peer %s:%u failed: %s; failing its pending tasks", p->host,
                    p->port, ty_strerror(p->broken_err));
    }
    for (uint32_t i = 0; i < p->nconns; i++)
        if (p->conns[i].fd >= 0)
            shutdown(p->conns[i].fd, SHUT_RDWR);
    while (p->q_head) {
        struct tcp_item *it = p->q_head;
        p->q_head = it->next;
        item_finish(p, it, p->broken_err);
    }
    p->q_tail = NULL;
    p->queued = 0;
    pthread_cond_broadcast(&p->cv);
    for (uint32_t i = 0; i < p->nconns; i++)
        pthread_cond_signal(&p->conns[i].cv);
}

static void progress(struct tcp_peer *p)
{
    atomic_store_explicit(&p->progress_ns, ty_clock_ns(), memory_order_relaxed);
}

/* Wake as many idle senders with room as there are items they may take (one for a notification
 * whose fence is clear, none for one still waiting on replies), starting at a rotating
 * connection. A sender that is busy looks at the queue again before it sleeps. mu held. */
static void kick(struct tcp_peer *p)
{
    if (!p->q_head)
        return;
    uint64_t want = p->q_head->kind == ITEM_NOTIFY ? p->inflight == 0 : p->queued;
    for (uint32_t i = 0; i < p->nconns && want > 0; i++) {
        struct tcp_conn *c = &p->conns[(p->rr + i) % p->nconns];
        if (!c->waiting || c->tx_busy || c->inflight >= p->e->tcp_window)
            continue;
        c->waiting = false;
        pthread_cond_signal(&c->cv);
        uint64_t room = p->e->tcp_window - c->inflight;
        want = want > room ? want - room : 0;
    }
    p->rr++;
}

/* Unlink an item that was never sent from c's FIFO (it may not be the head: a reply-less
 * item is always the most recent one this connection took). mu held. */
static void fifo_remove(struct tcp_conn *c, struct tcp_item *it)
{
    struct tcp_item **pp = &c->fifo_head, *prev = NULL;
    while (*pp && *pp != it) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = it->next;
    if (c->fifo_tail == it)
        c->fifo_tail = prev;
    c->inflight--;
    c->others_inflight--; /* only a WRITE goes unsent */
    c->peer->inflight--;
}

/* ---- sender -------------------------------------------------------------------------------- */

/* Send a NOTIFY or a WRITE slice (header + payload). */
static int send_item(struct tcp_conn *c, struct tcp_item *it)
{
    struct tcp_peer *p = c->peer;
    struct ty__xfer_hdr h = {.seq = it->seq,
                             .addr = it->remote,
                             .len = it->len,
                             .task_addr = it->task_remote,
                             .task_len = it->task_len};
    uint8_t hb[TY__XFER_HDR_SIZE];
    struct iovec iov[2] = {{hb, sizeof(hb)}, {it->local, (size_t)it->len}};
    int iovcnt = 2;
    if (it->kind == ITEM_NOTIFY) {
        h.type = TY__XFER_MSG_NOTIFY;
    } else if (it->op == TY_XFER_OP_WRITE) {
        h.type = TY__XFER_MSG_WRITE;
        h.fence = it->fence;
#ifdef TY_XFER_HAVE_CUDA
        if (it->local_cuda) { /* device -> pinned host, then send from the staging buffer */
            int rc = ty__xfer_cuda_stage_reserve(&c->stage, (size_t)it->len);
            if (rc || (rc = ty__xfer_cuda_copy(c->stage.ptr, it->local, (size_t)it->len)))
                return rc;
            iov[1].iov_base = c->stage.ptr;
        }
#endif
        if (p->e->checksum) {
            h.flags = TY__XFER_FLAG_CHECKSUM;
            h.checksum = XXH3_64bits(iov[1].iov_base, (size_t)it->len);
        }
    } /* READ requests are headers only and leave through take_reads */
    if (iovcnt == 2 && it->len == 0)
        iovcnt = 1;
    ty__xfer_hdr_encode(&h, hb);
    int rc = ty__xfer_sendv_all(c->fd, iov, iovcnt);
    if (rc == 0)
        progress(p);
    return rc;
}

static bool can_take(struct tcp_peer *p, struct tcp_conn *c)
{
    if (!p->q_head || c->inflight >= p->e->tcp_window)
        return false;
    return p->q_head->kind != ITEM_NOTIFY || p->inflight == 0;
}

static bool is_read(const struct tcp_item *it)
{
    return it->kind == ITEM_SLICE && it->op == TY_XFER_OP_READ;
}

/* Take the next item off the queue into c's FIFO. mu held. */
static struct tcp_item *take_next(struct tcp_peer *p, struct tcp_conn *c)
{
    struct tcp_item *it = p->q_head;
    p->q_head = it->next;
    if (!p->q_head)
        p->q_tail = NULL;
    p->queued--;
    it->next = NULL;
    it->seq = ++p->seq;
    if (c->fifo_tail)
        c->fifo_tail->next = it;
    else
        c->fifo_head = it;
    c->fifo_tail = it;
    c->inflight++;
    c->others_inflight += !is_read(it);
    p->inflight++;
    return it;
}

/* A WRITE reads local memory: it must still lie in one registered region, and the region lock is
 * held while sendmsg reads it (so unregister waits). Returns true with the lock held. */
static bool local_lock(struct tcp_peer *p, const struct tcp_item *it)
{
    if (it->kind != ITEM_SLICE)
        return false;
    return ty__xfer_regions_rdlock(p->e, (uintptr_t)it->local, it->len) != NULL;
}

/* Send one item taken by this connection. A WRITE whose local memory was unregistered since
 * submit is not sent: it fails with TY_EOUTOFRANGE and leaves the FIFO. mu not held. */
static int send_taken(struct tcp_conn *c, struct tcp_item *it)
{
    struct tcp_peer *p = c->peer;
    bool is_write = it->kind == ITEM_SLICE && it->op == TY_XFER_OP_WRITE;
    bool locked = is_write && local_lock(p, it);
    if (is_write && !locked) {
        pthread_mutex_lock(&p->mu);
        fifo_remove(c, it);
        item_finish(p, it, TY_EOUTOFRANGE);
        kick(p); /* the fence before a notification may have cleared */
        pthread_mutex_unlock(&p->mu);
        return 0;
    }
    int rc = send_item(c, it);
    if (locked)
        ty__xfer_regions_unlock(p->e);
    return rc;
}

#define READ_RUN_MAX TCP_WINDOW_MAX /* a run never exceeds the window */

/* Take the READ slices at the head of the queue that fit c's window (at least `it`, already
 * taken) and encode their requests into hb: a READ request is a header only, so a run of them
 * leaves in one sendmsg and the sender touches no item after mu is released. mu held. Returns
 * the number of requests. */
static int take_reads(struct tcp_peer *p, struct tcp_conn *c, struct tcp_item *it,
                      uint8_t (*hb)[TY__XFER_HDR_SIZE])
{
    int n = 0;
    for (;;) {
        struct ty__xfer_hdr h = {.type = TY__XFER_MSG_READ,
                                 .flags = p->e->checksum ? TY__XFER_FLAG_CHECKSUM : 0,
                                 .seq = it->seq,
                                 .addr = it->remote,
                                 .len = it->len,
                                 .task_addr = it->task_remote,
                                 .task_len = it->task_len};
        ty__xfer_hdr_encode(&h, hb[n++]);
        struct tcp_item *nx = p->q_head;
        if (n == READ_RUN_MAX || !can_take(p, c) || nx->kind != ITEM_SLICE ||
            nx->op != TY_XFER_OP_READ)
            return n;
        it = take_next(p, c);
    }
}

/* Send the run of READ requests that starts with `it` (taken by the caller, who holds mu and
 * set c->tx_busy): headers only, encoded under mu, so no item is touched once mu is released
 * for the send. mu held again on return. Returns a connection error. */
static int send_read_run(struct tcp_peer *p, struct tcp_conn *c, struct tcp_item *it)
{
    uint8_t hb[READ_RUN_MAX][TY__XFER_HDR_SIZE];
    struct iovec iov[READ_RUN_MAX];
    int n = take_reads(p, c, it, hb);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < n; i++)
        iov[i] = (struct iovec){hb[i], TY__XFER_HDR_SIZE};
    int rc = ty__xfer_sendv_all(c->fd, iov, n);
    if (rc == 0)
        progress(p);
    pthread_mutex_lock(&p->mu);
    return rc;
}

static void *send_main(void *arg)
{
    struct tcp_conn *c = arg;
    struct tcp_peer *p = c->peer;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->broken && (c->tx_busy || !can_take(p, c))) {
            c->waiting = true;
            pthread_cond_wait(&c->cv, &p->mu);
        }
        c->waiting = false;
        if (p->broken)
            break;
        c->tx_busy = true; /* wire order = FIFO order: one thread takes and sends at a time */
        struct tcp_item *it = take_next(p, c);
        int rc;
        if (is_read(it)) {
            rc = send_read_run(p, c, it);
        } else {
            c->sending = it;
            pthread_mutex_unlock(&p->mu);
            rc = send_taken(c, it);
            pthread_mutex_lock(&p->mu);
            c->sending = NULL;
            if (p->broken || c->reply_waits)
                pthread_cond_broadcast(&p->cv); /* recv_main, recv_fail_fifo wait for it */
        }
        c->tx_busy = false;
        if (rc) {
            peer_break(p, rc);
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- reply reader -------------------------------------------------------------------------- */

static int recv_payload(struct tcp_conn *c, struct tcp_item *it, const struct ty__xfer_hdr *h,
                        int *status);

/* Handle the reply for `it`. Returns the item's status in *status and a connection error. */
static int read_reply(struct tcp_conn *c, struct tcp_item *it, const struct ty__xfer_hdr *h,
                      int *status)
{
    *status = h->status;
    bool want_resp = it->kind == ITEM_SLICE && it->op == TY_XFER_OP_READ;
    if (h->type != (want_resp ? TY__XFER_MSG_READ_RESP : TY__XFER_MSG_ACK))
        return TY_EPROTO;
    if (!want_resp || h->status != 0)
        return h->len == 0 || !want_resp ? 0 : TY_EPROTO;
    if (h->len != it->len)
        return TY_EPROTO;
    /* the target memory must still be registered; hold the region while receiving into it */
    if (!local_lock(c->peer, it)) {
        *status = TY_EOUTOFRANGE;
        ty__xfer_lowat_reset(c->fd, &c->lowat);
        return ty__xfer_drain(c->fd, h->len);
    }
    int rc = recv_payload(c, it, h, status);
    ty__xfer_regions_unlock(c->peer->e);
    return rc;
}

/* Receive a READ_RESP payload into it->local (through staging for cuda). Region lock held. */
static int recv_payload(struct tcp_conn *c, struct tcp_item *it, const struct ty__xfer_hdr *h,
                        int *status)
{
    uint8_t *dst = it->local;
#ifdef TY_XFER_HAVE_CUDA
    if (it->local_cuda) {
        int src = ty__xfer_cuda_stage_reserve(&c->stage, (size_t)it->len);
        if (src)
            return src;
        dst = c->stage.ptr;
    }
#endif
    int rc = ty__xfer_recv_lowat(c->fd, dst, (size_t)it->len, &c->lowat, -1);
    if (rc)
        return rc;
    if ((h->flags & TY__XFER_FLAG_CHECKSUM) && XXH3_64bits(dst, (size_t)it->len) != h->checksum) {
        atomic_fetch_add(&c->peer->e->st.checksum_errors, 1);
        *status = TY_ECHECKSUM;
    }
#ifdef TY_XFER_HAVE_CUDA
    if (it->local_cuda && *status == 0)
        *status = ty__xfer_cuda_copy(it->local, dst, (size_t)it->len);
#endif
    return 0;
}

/* Called by the reply thread with mu held, right after a reply freed a place in c's window:
 * when READ requests wait at the head of the queue and no other thread is sending on c, send
 * them from here instead of waking the sender (one thread handoff less per slice; a get is a
 * chain of them). Only while every item c has in flight is a READ: then the socket's send
 * buffer holds a few headers at most and this send cannot block on a peer that is itself
 * blocked sending us a reply this thread should be reading. Returns a connection error. */
static int send_reads_inline(struct tcp_peer *p, struct tcp_conn *c)
{
    if (c->tx_busy || c->others_inflight || !can_take(p, c) || !is_read(p->q_head))
        return 0;
    c->tx_busy = true;
    int rc = send_read_run(p, c, take_next(p, c));
    c->tx_busy = false;
    return rc;
}

static void recv_fail_fifo(struct tcp_conn *c, int rc)
{
    struct tcp_peer *p = c->peer;
    pthread_mutex_lock(&p->mu);
    peer_break(p, rc);
    while (c->sending)
        pthread_cond_wait(&p->cv, &p->mu);
    while (c->fifo_head) {
        struct tcp_item *it = c->fifo_head;
        c->fifo_head = it->next;
        p->inflight--;
        item_finish(p, it, p->broken_err);
    }
    c->fifo_tail = NULL;
    c->inflight = 0;
    c->others_inflight = 0;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void *recv_main(void *arg)
{
    struct tcp_conn *c = arg;
    struct tcp_peer *p = c->peer;
    uint8_t hb[TY__XFER_HDR_SIZE];
    struct ty__xfer_hdr h;
    int rc;
    for (;;) {
        if ((rc = ty__xfer_recv_lowat(c->fd, hb, sizeof(hb), &c->lowat, -1)) != 0)
            break;
        if ((rc = ty__xfer_hdr_decode(hb, &h)) != 0)
            break;
        pthread_mutex_lock(&p->mu);
        struct tcp_item *it = c->fifo_head;
        if (!it || it->seq != h.seq) {
            pthread_mutex_unlock(&p->mu);
            rc = TY_EPROTO;
            break;
        }
        c->fifo_head = it->next;
        if (!c->fifo_head)
            c->fifo_tail = NULL;
        pthread_mutex_unlock(&p->mu);
        int status;
        rc = read_reply(c, it, &h, &status);
        progress(p);
        pthread_mutex_lock(&p->mu);
        /* The peer can answer a WRITE or NOTIFY while our sender has not yet returned from the
         * sendmsg that carried it (the kernel has the bytes; the thread is on its way back).
         * Completing it hands the memory back to its owner, so first let the sender let go of
         * it: its reads of that memory then happen before the completion in the memory model
         * too, not only through the socket (ThreadSanitizer sees the mutex, not the ACK). */
        while (c->sending == it) {
            c->reply_waits = true;
            pthread_cond_wait(&p->cv, &p->mu);
        }
        c->reply_waits = false;
        c->inflight--;
        c->others_inflight -= !is_read(it);
        p->inflight--;
        item_finish(p, it, rc ? rc : status);
        if (rc == 0 && !p->broken && (rc = send_reads_inline(p, c)) != 0)
            peer_break(p, rc);
        kick(p);
        pthread_mutex_unlock(&p->mu);
        if (rc)
            break;
    }
    recv_fail_fifo(c, rc);
    return NULL;
}

/* ---- connection setup ---------------------------------------------------------------------- */

/* Connect one socket and run the hello exchange; returns fd, fills *hello when non-NULL. */
static int conn_dial(struct tcp_peer *p, struct ty__xfer_hello *hello)
{
    return ty__xfer_inbound_dial(p->e, p->host, p->port, hello);
}

static void conns_close(struct tcp_peer *p)
{
    for (uint32_t i = 0; i < p->nconns; i++) {
        struct tcp_conn *c = &p->conns[i];
        if (c->threads) {
            pthread_join(c->send_thr, NULL);
            pthread_join(c->recv_thr, NULL);
            c->threads = false;
        }
        if (c->fd >= 0)
            close(c->fd);
        c->fd = -1;
#ifdef TY_XFER_HAVE_CUDA
        ty__xfer_cuda_stage_free(&c->stage);
#endif
    }
}

/* Dial every connection (conn 0's hello into *hello) and start the threads. reconnect_mu held. */
static int conns_open(struct tcp_peer *p, struct ty__xfer_hello *hello)
{
    for (uint32_t i = 0; i < p->nconns; i++) {
        int fd = conn_dial(p, i == 0 ? hello : NULL);
        if (fd < 0) {
            if (i > 0 && hello)
                ty__xfer_hello_clear(hello);
            conns_close(p);
            return fd;
        }
        p->conns[i].fd = fd;
        p->conns[i].lowat = 1;
    }
    pthread_mutex_lock(&p->mu);
    p->broken = false;
    p->broken_err = 0;
    progress(p);
    for (uint32_t i = 0; i < p->nconns; i++) {
        struct tcp_conn *c = &p->conns[i];
        if (pthread_create(&c->send_thr, NULL, send_main, c) != 0)
            abort();
        if (pthread_create(&c->recv_thr, NULL, recv_main, c) != 0)
            abort();
        c->threads = true;
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int ty__xfer_tcp_open(ty_xfer_engine_t *e, const char *host, uint16_t port,
                      struct ty__xfer_hello *hello, void **ctx)
{
    struct tcp_peer *p = calloc(1, sizeof(*p));
    if (!p)
        abort();
    p->e = e;
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->port = port;
    pthread_mutex_init(&p->reconnect_mu, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->nconns = e->tcp_conns;
    p->conns = calloc(p->nconns, sizeof(*p->conns));
    if (!p->conns)
        abort();
    for (uint32_t i = 0; i < p->nconns; i++) {
        p->conns[i].peer = p;
        p->conns[i].fd = -1;
        pthread_cond_init(&p->conns[i].cv, NULL);
    }
    int rc = conns_open(p, hello);
    if (rc) {
        TY_LOG_ERROR(TY_XFER_SUBSYS, "cannot reach tcp peer %s:%u: %s", host, port,
                     ty_strerror(rc));
        for (uint32_t i = 0; i < p->nconns; i++)
            pthread_cond_destroy(&p->conns[i].cv);
        free(p->conns);
        free(p);
        return rc;
    }
    *ctx = p;
    return 0;
}

/* The peer broke earlier: wait for its threads, dial again. reconnect_mu held. */
static int peer_reconnect(struct tcp_peer *p)
{
    conns_close(p);
    atomic_fetch_add(&p->e->st.reconnects, 1);
    int rc = conns_open(p, NULL);
    if (rc) {
        TY_LOG_WARN(TY_XFER_SUBSYS, "reconnect to %s:%u failed: %s", p->host, p->port,
                    ty_strerror(rc));
        return rc;
    }
    TY_LOG_INFO(TY_XFER_SUBSYS, "reconnected to %s:%u (tcp)", p->host, p->port);
    return 0;
}

static int peer_ready(struct tcp_peer *p)
{
    pthread_mutex_lock(&p->mu);
    bool broken = p->broken;
    pthread_mutex_unlock(&p->mu);
    if (!broken)
        return 0;
    pthread_mutex_lock(&p->reconnect_mu);
    pthread_mutex_lock(&p->mu);
    broken = p->broken && !p->stop;
    bool stopped = p->stop;
    pthread_mutex_unlock(&p->mu);
    int rc = stopped ? TY_ESHUTDOWN : broken ? peer_reconnect(p) : 0;
    pthread_mutex_unlock(&p->reconnect_mu);
    return rc;
}

/* Append items to the queue; reset the progress clock when the peer was idle. mu held. */
static void enqueue(struct tcp_peer *p, struct tcp_item *first, struct tcp_item *last)
{
    if (!p->q_head && p->inflight == 0)
        progress(p);
    if (p->q_tail)
        p->q_tail->next = first;
    else
        p->q_head = first;
    p->q_tail = last;
    for (struct tcp_item *it = first; it; it = it->next)
        p->queued++;
    kick(p);
}

static int tcp_submit(void *ctx, const struct ty__xfer_slice_req *req)
{
    struct tcp_peer *p = ctx;
    int rc = peer_ready(p);
    if (rc)
        return rc;
    uint64_t slice = p->e->slice_bytes;
    uint32_t n = (uint32_t)((req->len + slice - 1) / slice);
    struct tcp_item *first = NULL, *last = NULL;
    for (uint32_t i = 0; i < n; i++) {
        struct tcp_item *it = calloc(1, sizeof(*it));
        if (!it)
            abort();
        uint64_t off = (uint64_t)i * slice;
        it->kind = ITEM_SLICE;
        it->task = req->task;
        it->op = req->op;
        it->local = req->local + off;
        it->remote = req->remote + off;
        it->len = req->len - off < slice ? req->len - off : slice;
        it->task_remote = req->remote;
        it->local_cuda = req->local_cuda;
        it->fence = req->fence;
        it->task_len = req->len;
        if (last)
            last->next = it;
        else
            first = it;
        last = it;
    }
    ty__xfer_task_start(req->task, n);
    pthread_mutex_lock(&p->mu);
    if (p->broken) { /* broke between peer_ready and now */
        rc = p->broken_err;
        for (struct tcp_item *it = first, *nx; it; it = nx) {
            nx = it->next;
            item_finish(p, it, rc);
        }
    } else {
        enqueue(p, first, last);
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

static int tcp_notify(void *ctx, const void *msg, size_t len)
{
    struct tcp_peer *p = ctx;
    int rc = peer_ready(p);
    if (rc)
        return rc;
    struct tcp_item it = {.kind = ITEM_NOTIFY, .local = (uint8_t *)msg, .len = len};
    pthread_mutex_lock(&p->mu);
    if (p->broken) {
        pthread_mutex_unlock(&p->mu);
        return p->broken_err;
    }
    enqueue(p, &it, &it);
    while (!it.notify_done)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return it.notify_rc;
}

static void tcp_tick(void *ctx, uint64_t now_ns)
{
    struct tcp_peer *p = ctx;
    pthread_mutex_lock(&p->mu);
    uint64_t last = atomic_load_explicit(&p->progress_ns, memory_order_relaxed);
    if (!p->broken && (p->q_head || p->inflight) &&
        now_ns > last + (uint64_t)p->e->timeout_ms * TY_NS_PER_MS)
        peer_break(p, TY_ETIMEDOUT);
    pthread_mutex_unlock(&p->mu);
}

static void tcp_close(void *ctx)
{
    struct tcp_peer *p = ctx;
    pthread_mutex_lock(&p->reconnect_mu);
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    peer_break(p, TY_ECANCELED);
    pthread_mutex_unlock(&p->mu);
    conns_close(p);
    pthread_mutex_unlock(&p->reconnect_mu);
    for (uint32_t i = 0; i < p->nconns; i++)
        pthread_cond_destroy(&p->conns[i].cv);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->reconnect_mu);
    free(p->conns);
    free(p);
}

const struct ty__xfer_transport_i ty__xfer_tcp_iface = {
    .name = "tcp",
    .submit = tcp_submit,
    .notify = tcp_notify,
    .tick = tcp_tick,
    .close = tcp_close,
};

/* ---- target side: WRITE and READ on an inbound connection (inbound.c) --------------------- */

static void refuse_log(ty_xfer_engine_t *e, struct ty__xfer_inbound *in, const char *what,
                       const struct ty__xfer_hdr *h)
{
    atomic_fetch_add(&e->st.refused, 1);
    TY_LOG_WARN(TY_XFER_SUBSYS,
                "refused %s of %llu bytes at 0x%llx (task 0x%llx+%llu) from "
                "'%s': outside registered memory",
                what, (unsigned long long)h->len, (unsigned long long)h->addr,
                (unsigned long long)h->task_addr, (unsigned long long)h->task_len, in->peer_name);
}

/* The target's write fence (ty_xfer_engine_set_write_fence): may this write land? */
static bool fence_allows(ty_xfer_engine_t *e, struct ty__xfer_inbound *in,
                         const struct ty__xfer_hdr *h)
{
    pthread_rwlock_rdlock(&e->fence_lock);
    bool ok = !e->fence_cb || e->fence_cb(e->fence_arg, h->fence, h->addr, h->len);
    if (ok && e->fence_cb) /* before the lock goes: a revoke waits for this write to land */
        atomic_store(&in->writing_tag, h->fence);
    pthread_rwlock_unlock(&e->fence_lock);
    if (!ok) {
        atomic_fetch_add(&e->st.fenced_writes, 1);
        TY_LOG_WARN(TY_XFER_SUBSYS, "refused a write of %llu bytes from '%s': fence %08x is not "
                    "a live assignment's (a superseded writer)", (unsigned long long)h->len,
                    in->peer_name, h->fence);
    }
    return ok;
}

static int serve_write(ty_xfer_engine_t *e, struct ty__xfer_inbound *in,
                       const struct ty__xfer_hdr *h);

int ty__xfer_tcp_serve_write(ty_xfer_engine_t *e, struct ty__xfer_inbound *in,
                             const struct ty__xfer_hdr *h)
{
    if (!fence_allows(e, in, h)) {
        int rc = ty__xfer_drain(in->fd, h->len);
        return rc ? rc : ty__xfer_send_status(in->fd, TY__XFER_MSG_ACK, h->seq, TY_ESTALE);
    }
    int rc = serve_write(e, in, h);
    atomic_store(&in->writing_tag, 0); /* landed or failed: nothing of it lands later */
    return rc;
}

static int serve_write(ty_xfer_engine_t *e, struct ty__xfer_inbound *in,
                       const struct ty__xfer_hdr *h)
{
    const struct ty__xfer_region *r = ty__xfer_regions_rdlock(e, h->task_addr, h->task_len);
    if (!r) {
        refuse_log(e, in, "write", h);
        int rc = ty__xfer_drain(in->fd, h->len);
        return rc ? rc : ty__xfer_send_status(in->fd, TY__XFER_MSG_ACK, h->seq, TY_EOUTOFRANGE);
    }
    uint8_t *target = (uint8_t *)(uintptr_t)h->addr, *dst = target;
    int rc = 0, status = 0;
#ifdef TY_XFER_HAVE_CUDA
    bool cuda = r->loc_kind == TY__XFER_LOC_CUDA;
    if (cuda && (rc = ty__xfer_cuda_stage_reserve(&in->stage, (size_t)h->len)) == 0)
        dst = in->stage.ptr;
#endif
    if (rc == 0) { /* the header waits of this thread use plain recv: the mark goes back to 1 */
        int lowat = 1;
        rc = ty__xfer_recv_lowat(in->fd, dst, (size_t)h->len, &lowat, (int)e->timeout_ms);
        ty__xfer_lowat_reset(in->fd, &lowat);
    }
    if (rc == 0 && (h->flags & TY__XFER_FLAG_CHECKSUM) &&
        XXH3_64bits(dst, (size_t)h->len) != h->checksum) {
        atomic_fetch_add(&e->st.checksum_errors, 1);
        status = TY_ECHECKSUM;
    }
#ifdef TY_XFER_HAVE_CUDA
    if (rc == 0 && status == 0 && cuda)
        status = ty__xfer_cuda_copy(target, dst, (size_t)h->len);
#endif
    ty__xfer_regions_unlock(e);
    if (rc)
        return rc;
    /* after the bytes landed, before the ACK: the release that serve_notify and stats readers
     * acquire (struct ty__xfer_stats_atomic) */
    atomic_fetch_add_explicit(&e->st.served_in, h->len, memory_order_acq_rel);
    return ty__xfer_send_status(in->fd, TY__XFER_MSG_ACK, h->seq, status);
}

int ty__xfer_tcp_serve_read(ty_xfer_engine_t *e, struct ty__xfer_inbound *in,
                            const struct ty__xfer_hdr *h)
{
    const struct ty__xfer_region *r = ty__xfer_regions_rdlock(e, h->task_addr, h->task_len);
    if (!r) {
        refuse_log(e, in, "read", h);
        return ty__xfer_send_status(in->fd, TY__XFER_MSG_READ_RESP, h->seq, TY_EOUTOFRANGE);
    }
    /* a peer reads back what it wrote through another connection only after that write's ACK:
     * acquire what the serving thread of the write released (struct ty__xfer_stats_atomic) */
    (void)atomic_load_explicit(&e->st.served_in, memory_order_acquire);
    uint8_t *src = (uint8_t *)(uintptr_t)h->addr;
#ifdef TY_XFER_HAVE_CUDA
    if (r->loc_kind == TY__XFER_LOC_CUDA) {
        int crc = ty__xfer_cuda_stage_reserve(&in->stage, (size_t)h->len);
        if (crc == 0)
            crc = ty__xfer_cuda_copy(in->stage.ptr, src, (size_t)h->len);
        if (crc) {
            ty__xfer_regions_unlock(e);
            return ty__xfer_send_status(in->fd, TY__XFER_MSG_READ_RESP, h->seq, crc);
        }
        src = in->stage.ptr;
    }
#endif
    struct ty__xfer_hdr rh = {.type = TY__XFER_MSG_READ_RESP, .seq = h->seq, .len = h->len};
    if (h->flags & TY__XFER_FLAG_CHECKSUM) {
        rh.flags = TY__XFER_FLAG_CHECKSUM;
        rh.checksum = XXH3_64bits(src, (size_t)h->len);
    }
    uint8_t hb[TY__XFER_HDR_SIZE];
    ty__xfer_hdr_encode(&rh, hb);
    struct iovec iov[2] = {{hb, sizeof(hb)}, {src, (size_t)h->len}};
    int rc = ty__xfer_sendv_all(in->fd, iov, 2);
    ty__xfer_regions_unlock(e);
    if (rc == 0)
        atomic_fetch_add(&e->st.served_out, h->len);
    return rc;
}
