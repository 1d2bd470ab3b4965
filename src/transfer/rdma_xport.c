/* RDMA transport, initiator side: one-sided RDMA WRITE and READ over RC queue pairs.
 *
 * A peer has a control tcp connection (hello, RDMA_CONNECT, notifications, liveness) and
 * `lanes`: TY__XFER_RDMA_QPS_PER_NIC QPs on every local NIC that pairs with a peer NIC, numbered
 * lane = qp * n_nics + nic. A task is cut into 64 KiB slices dealt round robin over the lanes
 * (so consecutive slices use different NICs); each slice is one signaled work request against
 * the peer's rkey for the region. A lane whose QP fails is dead until the next reconnect; its
 * slices (and those flushed from its QP) are retried on a lane not tried before, preferring
 * another NIC, up to TY__XFER_RDMA_MAX_TRIES attempts. A remote access error (outside the peer's
 * registrations) is final: TY_EOUTOFRANGE. When no lane is left, or the control connection
 * hangs up, or nothing completes for timeout_ms while work is pending (engine watchdog, tick),
 * the peer breaks: its QPs go to the error state, which flushes every posted request, and every
 * pending task fails; the next submit or notify reconnects. A notification is a fence: it is
 * sent on the control connection once every slice submitted before it has completed, and an RC
 * work request completes at the requester only after the responder acknowledged it.
 *
 * Threading: `mu` guards lanes, queues and counters and is taken by submitters, the completion
 * threads (ty__xfer_rdma_on_completion) and the watchdog; `ctl_mu` serializes the control
 * connection; `reconnect_mu` (taken first) serializes reconnect and close. A job (one task's
 * slices) is freed by whoever completes its last slice.
 */
#include "rdma-impl.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct rdma_peer;
struct rdma_job;

struct rdma_slice {
    struct rdma_job *job;
    uint8_t *local;
    uint64_t remote;
    uint32_t len;
    uint32_t lane;  /* where it is posted or waiting */
    uint32_t tried; /* bit per lane */
    uint8_t attempts;
    struct rdma_slice *next;
};

struct rdma_job {
    struct rdma_peer *p;
    struct ty__xfer_task *task;
    enum ty_xfer_op op;
    uint32_t lkey[TY__XFER_RDMA_MAX_NICS]; /* by local NIC */
    uint32_t rkey[TY__XFER_RDMA_MAX_NICS]; /* by peer NIC */
    _Atomic uint32_t left;
    struct rdma_slice s[];
};

struct rdma_lane {
    struct ty__xfer_rdma_nic *nic;
    uint8_t nic_idx, peer_nic;
    struct ibv_qp *qp;
    uint32_t psn;
    bool alive;
    uint32_t posted, depth;
    struct rdma_slice *wait_head, *wait_tail; /* queue full: posted as completions free room */
};

struct rdma_peer {
    ty_xfer_engine_t *e;
    char host[128];
    uint16_t port;
    pthread_mutex_t reconnect_mu, ctl_mu, mu;
    pthread_cond_t cv;
    int ctl_fd;
    uint64_t ctl_seq;
    struct ty__xfer_hello hello; /* the peer's regions, NICs, rkeys (refreshed on a miss) */
    uint32_t n_lanes, n_nics;
    struct rdma_lane lanes[TY__XFER_RDMA_MAX_LANES];
    uint32_t cursor;
    uint64_t pending; /* slices posted or waiting */
    uint64_t posted;  /* posted, completion not seen */
    bool broken, stop;
    int broken_err;
    uint64_t progress_ns;
};

static void progress(struct rdma_peer *p)
{
    p->progress_ns = ty_clock_ns();
}

/* ---- completion ---------------------------------------------------------------------------- */

/* A slice ended. mu held. The job is freed with its last slice. */
static void slice_finish(struct rdma_peer *p, struct rdma_slice *sl, int err)
{
    struct rdma_job *j = sl->job;
    p->pending--;
    ty__xfer_slice_done(j->task, err ? 0 : sl->len, err);
    if (atomic_fetch_sub(&j->left, 1) == 1)
        free(j);
    pthread_cond_broadcast(&p->cv);
}

/* Map a failed work completion to an error, and say whether another lane may succeed. */
static int wc_error(enum ibv_wc_status st, bool *retry)
{
    *retry = false;
    switch (st) {
    case IBV_WC_REM_ACCESS_ERR: /* outside the peer's registration: the receiver refused */
        return TY_EOUTOFRANGE;
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
        return TY_EFAULT;
    case IBV_WC_RETRY_EXC_ERR: /* no ACK after every retry: link or peer gone */
    case IBV_WC_RNR_RETRY_EXC_ERR:
        *retry = true;
        return TY_ETIMEDOUT;
    default: /* flushed by a QP error elsewhere, transport errors: try another lane */
        *retry = true;
        return TY_EIO;
    }
}

static void lane_kill(struct rdma_peer *p, struct rdma_lane *l, int err);
static void slice_place(struct rdma_peer *p, struct rdma_slice *sl, int err);

/* Post sl on lane l now. mu held. Returns 0 or the post error (nothing posted). */
static int slice_post(struct rdma_peer *p, struct rdma_lane *l, struct rdma_slice *sl)
{
    struct rdma_job *j = sl->job;
    struct ibv_sge sge = {(uintptr_t)sl->local, sl->len, j->lkey[l->nic_idx]};
    struct ibv_send_wr wr = {
        .wr_id = (uintptr_t)sl,
        .sg_list = &sge,
        .num_sge = 1,
        .opcode = j->op == TY_XFER_OP_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
        .send_flags = IBV_SEND_SIGNALED,
        .wr.rdma = {.remote_addr = sl->remote, .rkey = j->rkey[l->peer_nic]},
    };
    struct ibv_send_wr *bad;
    atomic_fetch_add(&l->nic->outstanding, 1);
    int rc = ibv_post_send(l->qp, &wr, &bad);
    if (rc) {
        atomic_fetch_sub(&l->nic->outstanding, 1);
        return -rc;
    }
    l->posted++;
    p->posted++;
    return 0;
}

static bool lane_has_room(const struct rdma_lane *l)
{
    return l->posted < l->depth && atomic_load(&l->nic->outstanding) < l->nic->cqe;
}

/* Post or queue sl on its lane; a dead lane sends it to another one. mu held. */
static void slice_enqueue(struct rdma_peer *p, struct rdma_slice *sl)
{
    struct rdma_lane *l = &p->lanes[sl->lane];
    if (!l->alive) {
        slice_place(p, sl, TY_EIO);
        return;
    }
    if (!l->wait_head && lane_has_room(l)) {
        int rc = slice_post(p, l, sl);
        if (rc == 0)
            return;
        lane_kill(p, l, rc);
        slice_place(p, sl, rc);
        return;
    }
    sl->next = NULL;
    if (l->wait_tail)
        l->wait_tail->next = sl;
    else
        l->wait_head = sl;
    l->wait_tail = sl;
}

/* sl could not run on its lane (err): retry on an untried alive lane, or fail. mu held. */
static void slice_place(struct rdma_peer *p, struct rdma_slice *sl, int err)
{
    bool alive[TY__XFER_RDMA_MAX_LANES];
    for (uint32_t i = 0; i < p->n_lanes; i++)
        alive[i] = p->lanes[i].alive;
    int nl = p->broken || sl->attempts >= TY__XFER_RDMA_MAX_TRIES
                 ? -1
                 : ty__xfer_rdma_retry_lane(sl->lane, sl->tried, alive, p->n_lanes, p->n_nics);
    if (nl < 0) {
        slice_finish(p, sl, p->broken ? p->broken_err : err);
        return;
    }
    sl->lane = (uint32_t)nl;
    sl->tried |= 1u << nl;
    sl->attempts++;
    slice_enqueue(p, sl);
}

/* Post waiting slices while the lane has room. mu held. */
static void lane_pump(struct rdma_peer *p, struct rdma_lane *l)
{
    while (l->alive && l->wait_head && lane_has_room(l)) {
        struct rdma_slice *sl = l->wait_head;
        l->wait_head = sl->next;
        if (!l->wait_head)
            l->wait_tail = NULL;
        int rc = slice_post(p, l, sl);
        if (rc) {
            lane_kill(p, l, rc);
            slice_place(p, sl, rc);
        }
    }
}

static void peer_break(struct rdma_peer *p, int err);

/* A lane's QP failed: move it to ERR (flushing what is posted; those completions are retried
 * as they arrive), re-place its waiting slices, break the peer when no lane is left. mu held. */
static void lane_kill(struct rdma_peer *p, struct rdma_lane *l, int err)
{
    if (!l->alive)
        return;
    l->alive = false;
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    ibv_modify_qp(l->qp, &a, IBV_QP_STATE);
    if (!p->broken && !p->stop)
        TY_LOG_WARN(TY_XFER_SUBSYS,
                    "rdma peer %s:%u: QP %u on %s failed (%s); retrying its "
                    "slices on other lanes",
                    p->host, p->port, l->qp->qp_num, l->nic->info.name, ty_strerror(err));
    struct rdma_slice *sl = l->wait_head;
    l->wait_head = l->wait_tail = NULL;
    while (sl) {
        struct rdma_slice *next = sl->next;
        slice_place(p, sl, err);
        sl = next;
    }
    bool any = false;
    for (uint32_t i = 0; i < p->n_lanes; i++)
        any |= p->lanes[i].alive;
    if (!any)
        peer_break(p, err);
}

void ty__xfer_rdma_on_completion(uint64_t wr_id, enum ibv_wc_status status, uint32_t vendor_err)
{
    struct rdma_slice *sl = (struct rdma_slice *)(uintptr_t)wr_id;
    struct rdma_peer *p = sl->job->p;
    pthread_mutex_lock(&p->mu);
    struct rdma_lane *l = &p->lanes[sl->lane];
    l->posted--;
    p->posted--;
    progress(p);
    if (status == IBV_WC_SUCCESS) {
        slice_finish(p, sl, 0);
    } else {
        bool retry;
        int err = wc_error(status, &retry);
        if (status != IBV_WC_WR_FLUSH_ERR && !p->broken)
            TY_LOG_DEBUG(TY_XFER_SUBSYS, "rdma completion error %s (vendor 0x%x)",
                         ibv_wc_status_str(status), vendor_err);
        lane_kill(p, l, err); /* any error leaves the QP in the error state */
        if (retry)
            slice_place(p, sl, err);
        else
            slice_finish(p, sl, err);
    }
    lane_pump(p, l);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Fail everything: QPs to ERR (posted requests come back flushed and fail, since broken). mu
 * held. */
static void peer_break(struct rdma_peer *p, int err)
{
    if (p->broken)
        return;
    p->broken = true;
    p->broken_err = err ? err : TY_ECONNRESET;
    if (!p->stop) {
        atomic_fetch_add(&p->e->st.peer_failures, 1);
        TY_LOG_WARN(TY_XFER_SUBSYS, "rdma peer %s:%u failed: %s; failing its pending tasks",
                    p->host, p->port, ty_strerror(p->broken_err));
    }
    for (uint32_t i = 0; i < p->n_lanes; i++)
        lane_kill(p, &p->lanes[i], p->broken_err);
    if (p->ctl_fd >= 0)
        shutdown(p->ctl_fd, SHUT_RDWR);
    pthread_cond_broadcast(&p->cv);
}

/* ---- connection ---------------------------------------------------------------------------- */

/* Wait until no work request is posted (flushes are quick once QPs are in ERR). mu held.
 * Returns false if they did not come back within 2 * timeout: then nothing may be freed. */
static bool wait_quiet(struct rdma_peer *p)
{
    uint64_t deadline = ty_clock_ns() + 2ull * p->e->timeout_ms * TY_NS_PER_MS;
    while (p->posted > 0 && ty_clock_ns() < deadline) {
        pthread_mutex_unlock(&p->mu);
        ty_sleep_ns(TY_NS_PER_MS);
        pthread_mutex_lock(&p->mu);
    }
    return p->posted == 0;
}

static void lanes_destroy(struct rdma_peer *p)
{
    for (uint32_t i = 0; i < p->n_lanes; i++)
        if (p->lanes[i].qp)
            ibv_destroy_qp(p->lanes[i].qp);
    memset(p->lanes, 0, sizeof(p->lanes));
    p->n_lanes = p->n_nics = 0;
    if (p->ctl_fd >= 0)
        close(p->ctl_fd);
    p->ctl_fd = -1;
}

/* Create our QPs: QPS_PER_NIC on every local NIC that pairs with a peer NIC. */
static int lanes_create(struct rdma_peer *p, struct ty__xfer_rdma_connect *req)
{
    struct ty__xfer_rdma *r = p->e->rdma;
    struct ty__xfer_nic_info local[TY__XFER_RDMA_MAX_NICS];
    int pair[TY__XFER_RDMA_MAX_NICS];
    for (size_t i = 0; i < r->n; i++)
        local[i] = r->nic[i].info;
    ty__xfer_rdma_pair_nics(local, r->n, p->hello.nics, p->hello.n_nics, pair);
    uint8_t used[TY__XFER_RDMA_MAX_NICS];
    for (size_t i = 0; i < r->n; i++)
        if (pair[i] >= 0)
            used[p->n_nics++] = (uint8_t)i;
    if (p->n_nics == 0)
        return TY_ENOTSUP;
    for (uint32_t q = 0; q < TY__XFER_RDMA_QPS_PER_NIC; q++) {
        for (uint32_t k = 0; k < p->n_nics; k++) {
            struct rdma_lane *l = &p->lanes[p->n_lanes];
            l->nic_idx = used[k];
            l->peer_nic = (uint8_t)pair[used[k]];
            l->nic = &r->nic[l->nic_idx];
            if (!(l->qp = ty__xfer_rdma_qp_create(l->nic)))
                return TY_ENOMEM;
            l->psn = ty__xfer_rdma_psn();
            l->depth = TY__XFER_RDMA_QP_DEPTH;
            ty__xfer_rdma_lane_fill(&req->lanes[p->n_lanes], l->nic, l->nic_idx, l->peer_nic, l->qp,
                                    l->psn);
            p->n_lanes++;
        }
    }
    req->n = p->n_lanes;
    return 0;
}

/* RDMA_CONNECT over the control connection; *rep gets the peer's QPs. */
static int connect_exchange(struct rdma_peer *p, const struct ty__xfer_rdma_connect *req,
                            struct ty__xfer_rdma_connect *rep)
{
    uint8_t body[TY_XFER_NOTIFY_MAX], hb[TY__XFER_HDR_SIZE];
    size_t len = ty__xfer_rdma_connect_encode(req, body, sizeof(body));
    struct ty__xfer_hdr h = {.type = TY__XFER_MSG_RDMA_CONNECT, .seq = ++p->ctl_seq, .len = len};
    ty__xfer_hdr_encode(&h, hb);
    struct iovec iov[2] = {{hb, sizeof(hb)}, {body, len}};
    int rc = ty__xfer_sendv_all(p->ctl_fd, iov, 2);
    if (rc || (rc = ty__xfer_recv_all(p->ctl_fd, hb, sizeof(hb))) != 0)
        return rc;
    if ((rc = ty__xfer_hdr_decode(hb, &h)) != 0 || h.type != TY__XFER_MSG_RDMA_CONNECT_REPLY ||
        h.seq != p->ctl_seq)
        return TY_EPROTO;
    if (h.status)
        return h.status;
    if ((rc = ty__xfer_recv_all(p->ctl_fd, body, (size_t)h.len)) != 0)
        return rc;
    if (ty__xfer_rdma_connect_decode(body, (size_t)h.len, rep) != 0 || rep->n != req->n)
        return TY_EPROTO;
    return 0;
}

/* Dial, take a fresh hello (regions and rkeys may have changed), connect every lane. */
static int peer_connect(struct rdma_peer *p)
{
    struct ty__xfer_hello fresh;
    int fd = ty__xfer_inbound_dial(p->e, p->host, p->port, &fresh);
    if (fd < 0)
        return fd;
    ty__xfer_hello_clear(&p->hello);
    p->hello = fresh;
    p->ctl_fd = fd;
    ty__xfer_sock_timeouts(fd, p->e->timeout_ms);
    struct ty__xfer_rdma_connect req, rep;
    int rc = lanes_create(p, &req);
    if (rc == 0)
        rc = connect_exchange(p, &req, &rep);
    for (uint32_t i = 0; rc == 0 && i < p->n_lanes; i++) {
        struct rdma_lane *l = &p->lanes[i];
        if (rep.lanes[i].nic != l->peer_nic || rep.lanes[i].peer_nic != l->nic_idx)
            rc = TY_EPROTO;
        else
            rc = ty__xfer_rdma_qp_connect(l->qp, l->nic, l->psn, &rep.lanes[i], p->e->timeout_ms);
        l->alive = rc == 0;
    }
    if (rc) {
        TY_LOG_ERROR(TY_XFER_SUBSYS, "rdma connect to %s:%u failed: %s", p->host, p->port,
                     ty_strerror(rc));
        lanes_destroy(p);
        return rc;
    }
    pthread_mutex_lock(&p->mu);
    p->broken = false;
    p->broken_err = 0;
    progress(p);
    pthread_mutex_unlock(&p->mu);
    TY_LOG_INFO(TY_XFER_SUBSYS, "rdma peer %s:%u: %u lanes over %u nics", p->host, p->port,
                p->n_lanes, p->n_nics);
    return 0;
}

bool ty__xfer_rdma_can_serve(ty_xfer_engine_t *e, const struct ty__xfer_hello *hello)
{
    struct ty__xfer_rdma *r = e->rdma;
    if (!r || hello->n_nics == 0)
        return false;
    struct ty__xfer_nic_info local[TY__XFER_RDMA_MAX_NICS];
    int pair[TY__XFER_RDMA_MAX_NICS];
    for (size_t i = 0; i < r->n; i++)
        local[i] = r->nic[i].info;
    return ty__xfer_rdma_pair_nics(local, r->n, hello->nics, hello->n_nics, pair) > 0;
}

int ty__xfer_rdma_open(ty_xfer_engine_t *e, const char *host, uint16_t port,
                       const struct ty__xfer_hello *hello, void **ctx)
{
    if (!ty__xfer_rdma_can_serve(e, hello))
        return TY_ENOTSUP;
    struct rdma_peer *p = calloc(1, sizeof(*p));
    if (!p)
        abort();
    p->e = e;
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->port = port;
    p->ctl_fd = -1;
    pthread_mutex_init(&p->reconnect_mu, NULL);
    pthread_mutex_init(&p->ctl_mu, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    int rc = peer_connect(p);
    if (rc) {
        ty__xfer_hello_clear(&p->hello);
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        pthread_mutex_destroy(&p->ctl_mu);
        pthread_mutex_destroy(&p->reconnect_mu);
        free(p);
        return rc;
    }
    *ctx = p;
    return 0;
}

/* Broken earlier: wait for the flushes, drop the QPs, connect again. */
static int peer_ready(struct rdma_peer *p)
{
    pthread_mutex_lock(&p->mu);
    bool broken = p->broken;
    pthread_mutex_unlock(&p->mu);
    if (!broken)
        return 0;
    pthread_mutex_lock(&p->reconnect_mu);
    pthread_mutex_lock(&p->mu);
    int rc = p->stop ? TY_ESHUTDOWN : 0;
    if (rc == 0 && p->broken && !wait_quiet(p))
        rc = TY_ETIMEDOUT;
    broken = p->broken;
    pthread_mutex_unlock(&p->mu);
    if (rc == 0 && broken) {
        lanes_destroy(p);
        atomic_fetch_add(&p->e->st.reconnects, 1);
        rc = peer_connect(p);
        if (rc == 0)
            TY_LOG_INFO(TY_XFER_SUBSYS, "reconnected to %s:%u (rdma)", p->host, p->port);
    }
    pthread_mutex_unlock(&p->reconnect_mu);
    return rc;
}

/* ---- vtable -------------------------------------------------------------------------------- */

/* The peer's region holding [addr, addr+len): its index, or -1. mu held. */
static int remote_region(const struct rdma_peer *p, uint64_t addr, uint64_t len)
{
    for (size_t i = 0; i < p->hello.n_regions; i++) {
        const struct ty_xfer_region_info *r = &p->hello.regions[i];
        if (addr >= r->addr && addr + len >= addr && addr + len <= r->addr + r->len)
            return (int)i;
    }
    return -1;
}

/* A new job with the keys of both ends; TY_EOUTOFRANGE / TY_ENOTSUP when a key is missing. */
static int job_new(struct rdma_peer *p, const struct ty__xfer_slice_req *req, struct rdma_job **out)
{
    const struct ty__xfer_region *lr =
        ty__xfer_regions_rdlock(p->e, (uintptr_t)req->local, req->len);
    if (!lr)
        return TY_EOUTOFRANGE;
    uint32_t n = ty__xfer_rdma_slice_count(req->len, TY__XFER_RDMA_SLICE);
    struct rdma_job *j = calloc(1, sizeof(*j) + n * sizeof(j->s[0]));
    if (!j)
        abort();
    memcpy(j->lkey, lr->lkey, sizeof(j->lkey));
    ty__xfer_regions_unlock(p->e);
    pthread_mutex_lock(&p->mu);
    int ri = remote_region(p, req->remote, req->len), rc = ri < 0 ? TY_EOUTOFRANGE : 0;
    for (uint32_t i = 0; rc == 0 && i < p->n_lanes; i++) {
        const struct rdma_lane *l = &p->lanes[i];
        j->rkey[l->peer_nic] = p->hello.rkeys[(size_t)ri * p->hello.n_nics + l->peer_nic];
        if (!j->rkey[l->peer_nic] || !j->lkey[l->nic_idx])
            rc = TY_ENOTSUP; /* e.g. cuda memory a NIC could not register */
    }
    pthread_mutex_unlock(&p->mu);
    if (rc) {
        free(j);
        return rc;
    }
    j->p = p;
    j->task = req->task;
    j->op = req->op;
    atomic_store(&j->left, n);
    *out = j;
    return 0;
}

/* Ask the peer for its regions again (a region registered after we connected). */
static void hello_refresh(struct rdma_peer *p)
{
    struct ty__xfer_hello fresh;
    int fd = ty__xfer_inbound_dial(p->e, p->host, p->port, &fresh);
    if (fd < 0)
        return;
    close(fd);
    pthread_mutex_lock(&p->mu);
    if (fresh.n_nics == p->hello.n_nics) {
        ty__xfer_hello_clear(&p->hello);
        p->hello = fresh;
    } else {
        ty__xfer_hello_clear(&fresh);
    }
    pthread_mutex_unlock(&p->mu);
}

static int rdma_submit(void *ctx, const struct ty__xfer_slice_req *req)
{
    struct rdma_peer *p = ctx;
    int rc = peer_ready(p);
    if (rc)
        return rc;
    struct rdma_job *j = NULL;
    rc = job_new(p, req, &j);
    if (rc == TY_EOUTOFRANGE) { /* maybe registered after we connected: ask again */
        hello_refresh(p);
        rc = job_new(p, req, &j);
    }
    if (rc)
        return rc;
    uint32_t n = ty__xfer_rdma_slice_count(req->len, TY__XFER_RDMA_SLICE);
    ty__xfer_task_start(req->task, n);
    pthread_mutex_lock(&p->mu);
    if (p->pending == 0)
        progress(p); /* idle until now: the stall clock starts here */
    for (uint32_t i = 0; i < n; i++) {
        struct rdma_slice *sl = &j->s[i];
        uint64_t off = (uint64_t)i * TY__XFER_RDMA_SLICE;
        sl->job = j;
        sl->local = req->local + off;
        sl->remote = req->remote + off;
        sl->len =
            (uint32_t)(req->len - off < TY__XFER_RDMA_SLICE ? req->len - off : TY__XFER_RDMA_SLICE);
        sl->lane = ty__xfer_rdma_lane_of(p->cursor, i, p->n_lanes);
        sl->tried = 1u << sl->lane;
        sl->attempts = 1;
        p->pending++;
        if (p->broken)
            slice_finish(p, sl, p->broken_err);
        else
            slice_enqueue(p, sl);
    }
    p->cursor = ty__xfer_rdma_lane_of(p->cursor, n, p->n_lanes);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

/* NOTIFY on the control connection once everything submitted before it completed. */
static int rdma_notify(void *ctx, const void *msg, size_t len)
{
    struct rdma_peer *p = ctx;
    int rc = peer_ready(p);
    if (rc)
        return rc;
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0 && !p->broken)
        pthread_cond_wait(&p->cv, &p->mu);
    rc = p->broken ? p->broken_err : 0;
    pthread_mutex_unlock(&p->mu);
    if (rc)
        return rc;
    pthread_mutex_lock(&p->ctl_mu);
    uint8_t hb[TY__XFER_HDR_SIZE];
    struct ty__xfer_hdr h = {.type = TY__XFER_MSG_NOTIFY, .seq = ++p->ctl_seq, .len = len};
    ty__xfer_hdr_encode(&h, hb);
    struct iovec iov[2] = {{hb, sizeof(hb)}, {(void *)msg, len}};
    rc = ty__xfer_sendv_all(p->ctl_fd, iov, len ? 2 : 1);
    if (rc == 0 && (rc = ty__xfer_recv_all(p->ctl_fd, hb, sizeof(hb))) == 0)
        rc = ty__xfer_hdr_decode(hb, &h) != 0 || h.type != TY__XFER_MSG_ACK || h.seq != p->ctl_seq
                 ? TY_EPROTO
                 : h.status;
    pthread_mutex_unlock(&p->ctl_mu);
    return rc;
}

static void rdma_tick(void *ctx, uint64_t now_ns)
{
    struct rdma_peer *p = ctx;
    pthread_mutex_lock(&p->mu);
    if (!p->broken && !p->stop && p->ctl_fd >= 0) {
        struct pollfd pfd = {.fd = p->ctl_fd, .events = POLLRDHUP};
        if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            peer_break(p, TY_ECONNRESET); /* the peer process is gone */
        else if (p->pending && now_ns > p->progress_ns + (uint64_t)p->e->timeout_ms * TY_NS_PER_MS)
            peer_break(p, TY_ETIMEDOUT);
    }
    pthread_mutex_unlock(&p->mu);
}

static void rdma_close(void *ctx)
{
    struct rdma_peer *p = ctx;
    pthread_mutex_lock(&p->reconnect_mu);
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    peer_break(p, TY_ECANCELED);
    bool quiet = wait_quiet(p);
    pthread_mutex_unlock(&p->mu);
    if (!quiet) { /* completions may still name our slices: leak rather than free them */
        TY_LOG_ERROR(TY_XFER_SUBSYS,
                     "rdma peer %s:%u: %llu work requests never completed; "
                     "leaking its state",
                     p->host, p->port, (unsigned long long)p->posted);
        pthread_mutex_unlock(&p->reconnect_mu);
        return;
    }
    lanes_destroy(p);
    pthread_mutex_unlock(&p->reconnect_mu);
    ty__xfer_hello_clear(&p->hello);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->ctl_mu);
    pthread_mutex_destroy(&p->reconnect_mu);
    free(p);
}

const struct ty__xfer_transport_i ty__xfer_rdma_iface = {
    .name = "rdma",
    .submit = rdma_submit,
    .notify = rdma_notify,
    .tick = rdma_tick,
    .close = rdma_close,
};
