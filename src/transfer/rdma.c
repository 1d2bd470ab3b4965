/* RDMA devices for the transfer engine (libibverbs): discovery of NICs with an ACTIVE port, one
 * protection domain, completion queue and completion-polling thread per NIC, memory registration
 * of every engine region on every NIC, RC queue-pair setup (RESET -> INIT -> RTR -> RTS with the
 * path MTU negotiated from both sides' active MTU), and the target side of the connect exchange
 * (QPs owned by the inbound tcp connection that asked for them). The initiator's data path is in
 * rdma_xport.c. Threading: see rdma-impl.h. QPs are connected out of band over the engine's tcp
 * connection (QP number, PSN, LID, GID), as Mooncake does, rather than with an rdma_cm listener,
 * so one control connection serves all NICs and no NIC needs an IP address of its own.
 */
#include "rdma-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"

#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* ---- discovery ----------------------------------------------------------------------------- */

/* Count devices with at least one ACTIVE port. */
static int active_devices(void)
{
    int n = 0, active = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list)
        return 0;
    for (int i = 0; i < n; i++) {
        struct ibv_context *ctx = ibv_open_device(list[i]);
        if (!ctx)
            continue;
        struct ibv_device_attr da;
        if (ibv_query_device(ctx, &da) == 0) {
            for (uint8_t port = 1; port <= da.phys_port_cnt; port++) {
                struct ibv_port_attr pa;
                if (ibv_query_port(ctx, port, &pa) == 0 && pa.state == IBV_PORT_ACTIVE)
                    active++;
            }
        }
        ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
    return active;
}

bool ty_xfer_rdma_available(void)
{
    return active_devices() > 0;
}

static bool name_listed(const char *filter, const char *name)
{
    if (!filter)
        return true;
    size_t n = strlen(name);
    for (const char *p = filter; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && strncmp(p, name, n) == 0)
            return true;
        p += len + (p[len] == ',');
    }
    return false;
}

/* RoCE: prefer a RoCE v2 GID holding an IPv4 address (routable), then any RoCE v2, then 0. */
static int pick_gid(struct ibv_context *ctx, uint8_t port, int tbl_len, union ibv_gid *gid)
{
    int best = 0, score = -1;
    for (int i = 0; i < tbl_len && i < 256; i++) {
        struct ibv_gid_entry ent;
        if (ibv_query_gid_ex(ctx, port, (uint32_t)i, &ent, 0) != 0)
            continue;
        static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        int s = ent.gid_type == IBV_GID_TYPE_ROCE_V2 ? 1 : 0;
        if (s && memcmp(ent.gid.raw, v4mapped, 12) == 0)
            s = 2;
        if (s > score) {
            score = s;
            best = i;
        }
    }
    return ibv_query_gid(ctx, port, best, gid) == 0 ? best : -1;
}

/* First ACTIVE port of ctx into nic->info. Returns 0 or TY_ENODEV. */
static int nic_port(struct ty__xfer_rdma_nic *nic, const struct ibv_device_attr *da)
{
    for (uint8_t port = 1; port <= da->phys_port_cnt; port++) {
        struct ibv_port_attr pa;
        if (ibv_query_port(nic->ctx, port, &pa) != 0 || pa.state != IBV_PORT_ACTIVE)
            continue;
        union ibv_gid gid;
        bool eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
        int gi = eth ? pick_gid(nic->ctx, port, pa.gid_tbl_len, &gid)
                     : (ibv_query_gid(nic->ctx, port, 0, &gid) == 0 ? 0 : -1);
        if (gi < 0)
            continue;
        nic->info.port = port;
        nic->info.link_layer = eth ? TY__XFER_LINK_ETH : TY__XFER_LINK_IB;
        nic->info.mtu = (uint8_t)pa.active_mtu;
        nic->info.lid = pa.lid;
        nic->info.gid_index = (uint8_t)gi;
        memcpy(nic->info.gid, gid.raw, 16);
        return 0;
    }
    return TY_ENODEV;
}

/* ---- completion thread ---------------------------------------------------------------------- */

static void drain_cq(struct ty__xfer_rdma_nic *nic)
{
    struct ibv_wc wc[32];
    int n;
    while ((n = ibv_poll_cq(nic->cq, 32, wc)) > 0) {
        atomic_fetch_sub(&nic->outstanding, n);
        for (int i = 0; i < n; i++)
            ty__xfer_rdma_on_completion(wc[i].wr_id, wc[i].status, wc[i].vendor_err);
    }
}

/* Event-driven polling: arm the CQ, drain it again (a completion may have landed before the
 * arm), sleep on the channel fd with a timeout so stop is noticed. */
static void *cq_main(void *arg)
{
    struct ty__xfer_rdma_nic *nic = arg;
    while (!atomic_load(&nic->owner->stop)) {
        ibv_req_notify_cq(nic->cq, 0);
        drain_cq(nic);
        struct pollfd pfd = {.fd = nic->channel->fd, .events = POLLIN};
        if (poll(&pfd, 1, 50) <= 0)
            continue;
        struct ibv_cq *cq;
        void *cq_ctx;
        if (ibv_get_cq_event(nic->channel, &cq, &cq_ctx) == 0)
            ibv_ack_cq_events(cq, 1);
        drain_cq(nic);
    }
    return NULL;
}

/* ---- NIC lifecycle -------------------------------------------------------------------------- */

static void nic_close(struct ty__xfer_rdma_nic *nic)
{
    if (nic->thr_started)
        pthread_join(nic->thr, NULL);
    if (nic->cq)
        ibv_destroy_cq(nic->cq);
    if (nic->channel)
        ibv_destroy_comp_channel(nic->channel);
    if (nic->pd)
        ibv_dealloc_pd(nic->pd);
    if (nic->ctx)
        ibv_close_device(nic->ctx);
    memset(nic, 0, sizeof(*nic));
}

static int nic_open(struct ty__xfer_rdma *r, struct ibv_device *dev, struct ty__xfer_rdma_nic *nic)
{
    struct ibv_device_attr da;
    nic->owner = r;
    snprintf(nic->info.name, sizeof(nic->info.name), "%s", ibv_get_device_name(dev));
    if (!(nic->ctx = ibv_open_device(dev)) || ibv_query_device(nic->ctx, &da) != 0)
        goto err;
    if (nic_port(nic, &da) != 0)
        goto err;
    nic->cqe = da.max_cqe < 65536 ? da.max_cqe : 65536;
    nic->max_rd_atom = da.max_qp_rd_atom < 16 ? da.max_qp_rd_atom : 16;
    nic->max_qp_wr = (uint32_t)da.max_qp_wr;
    if (!(nic->pd = ibv_alloc_pd(nic->ctx)) || !(nic->channel = ibv_create_comp_channel(nic->ctx)))
        goto err;
    fcntl(nic->channel->fd, F_SETFL, fcntl(nic->channel->fd, F_GETFL) | O_NONBLOCK);
    if (!(nic->cq = ibv_create_cq(nic->ctx, nic->cqe, nic, nic->channel, 0)))
        goto err;
    if (pthread_create(&nic->thr, NULL, cq_main, nic) != 0)
        goto err;
    nic->thr_started = true;
    TY_LOG_INFO(TY_XFER_SUBSYS, "rdma nic %s port %u: %s, mtu %d, lid %u, gid index %u",
                nic->info.name, nic->info.port,
                nic->info.link_layer == TY__XFER_LINK_ETH ? "RoCE" : "InfiniBand",
                128 << nic->info.mtu, nic->info.lid, nic->info.gid_index);
    return 0;
err:
    TY_LOG_WARN(TY_XFER_SUBSYS, "rdma device %s unusable (no active port or setup failed)",
                nic->info.name);
    nic_close(nic);
    return TY_ENODEV;
}

int ty__xfer_rdma_new(ty_xfer_engine_t *e, const char *filter, struct ty__xfer_rdma **out)
{
    *out = NULL;
    if (filter && strcmp(filter, "none") == 0)
        return 0;
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        if (list)
            ibv_free_device_list(list);
        return 0;
    }
    struct ty__xfer_rdma *r = calloc(1, sizeof(*r));
    if (!r)
        abort();
    r->e = e;
    for (int i = 0; i < n && r->n < TY__XFER_RDMA_MAX_NICS; i++)
        if (name_listed(filter, ibv_get_device_name(list[i])) &&
            nic_open(r, list[i], &r->nic[r->n]) == 0)
            r->n++;
    ibv_free_device_list(list);
    if (r->n == 0) {
        free(r);
        return 0;
    }
    *out = r;
    return 0;
}

void ty__xfer_rdma_free(struct ty__xfer_rdma *r)
{
    if (!r)
        return;
    atomic_store(&r->stop, true);
    for (size_t i = 0; i < r->n; i++)
        nic_close(&r->nic[i]);
    free(r);
}

void ty__xfer_rdma_describe(const struct ty__xfer_rdma *r, struct ty__xfer_hello *h)
{
    h->n_nics = ty__xfer_rdma_nic_count(r);
    for (size_t i = 0; i < h->n_nics; i++)
        h->nics[i] = r->nic[i].info;
}

size_t ty__xfer_rdma_nic_count(const struct ty__xfer_rdma *r)
{
    return r ? r->n : 0;
}

/* ---- memory registration -------------------------------------------------------------------- */

int ty__xfer_rdma_reg(struct ty__xfer_rdma *r, struct ty__xfer_region *reg)
{
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    for (size_t i = 0; r && i < r->n; i++) {
        struct ibv_mr *mr =
            ibv_reg_mr(r->nic[i].pd, (void *)(uintptr_t)reg->addr, (size_t)reg->len, access);
        if (!mr && reg->loc_kind == TY__XFER_LOC_CUDA) {
            TY_LOG_WARN(TY_XFER_SUBSYS,
                        "rdma nic %s cannot register cuda:%d memory (%s): "
                        "peers reach it over tcp only",
                        r->nic[i].info.name, reg->loc_dev, strerror(errno));
            continue;
        }
        if (!mr) {
            int rc = ty_errno();
            TY_LOG_ERROR(TY_XFER_SUBSYS, "ibv_reg_mr of %llu bytes on %s: %s",
                         (unsigned long long)reg->len, r->nic[i].info.name, ty_strerror(rc));
            ty__xfer_rdma_dereg(reg);
            return rc;
        }
        reg->mr[i] = mr;
        reg->lkey[i] = mr->lkey;
        reg->rkey[i] = mr->rkey;
    }
    return 0;
}

void ty__xfer_rdma_dereg(struct ty__xfer_region *reg)
{
    for (size_t i = 0; i < TY__XFER_RDMA_MAX_NICS; i++) {
        if (reg->mr[i])
            ibv_dereg_mr(reg->mr[i]);
        reg->mr[i] = NULL;
        reg->lkey[i] = reg->rkey[i] = 0;
    }
}

/* ---- queue pairs ---------------------------------------------------------------------------- */

uint32_t ty__xfer_rdma_psn(void)
{
    uint32_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != sizeof(v))
        v = (uint32_t)getpid() * 2654435761u;
    return v & 0xFFFFFF;
}

struct ibv_qp *ty__xfer_rdma_qp_create(struct ty__xfer_rdma_nic *nic)
{
    uint32_t depth =
        TY__XFER_RDMA_QP_DEPTH < nic->max_qp_wr ? TY__XFER_RDMA_QP_DEPTH : nic->max_qp_wr;
    struct ibv_qp_init_attr ia = {
        .send_cq = nic->cq,
        .recv_cq = nic->cq,
        .cap = {.max_send_wr = depth, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 0,
    };
    struct ibv_qp *qp = ibv_create_qp(nic->pd, &ia);
    if (!qp) {
        TY_LOG_ERROR(TY_XFER_SUBSYS, "ibv_create_qp on %s: %s", nic->info.name, strerror(errno));
        return NULL;
    }
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                            .pkey_index = 0,
                            .port_num = nic->info.port,
                            .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                               IBV_ACCESS_REMOTE_READ};
    int rc =
        ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc) {
        TY_LOG_ERROR(TY_XFER_SUBSYS, "QP to INIT on %s: %s", nic->info.name, strerror(rc));
        ibv_destroy_qp(qp);
        return NULL;
    }
    return qp;
}

int ty__xfer_rdma_qp_connect(struct ibv_qp *qp, struct ty__xfer_rdma_nic *nic, uint32_t my_psn,
                             const struct ty__xfer_rdma_lane_info *remote, uint32_t timeout_ms)
{
    int mtu = ty__xfer_rdma_mtu_negotiate(nic->info.mtu, remote->mtu);
    if (!mtu || remote->link_layer != nic->info.link_layer)
        return TY_EPROTO;
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = (enum ibv_mtu)mtu,
        .dest_qp_num = remote->qpn,
        .rq_psn = remote->psn,
        .max_dest_rd_atomic = (uint8_t)nic->max_rd_atom,
        .min_rnr_timer = 12,
        .ah_attr = {.dlid = remote->lid, .sl = 0, .port_num = nic->info.port},
    };
    /* RoCE needs the GRH (routing by GID); plain IB within a subnet routes by LID */
    if (nic->info.link_layer == TY__XFER_LINK_ETH) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, remote->gid, 16);
        a.ah_attr.grh.sgid_index = nic->info.gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    int rc = ibv_modify_qp(qp, &a,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc)
        return -rc;
    struct ibv_qp_attr b = {.qp_state = IBV_QPS_RTS,
                            .timeout = ty__xfer_rdma_ack_timeout(timeout_ms, 7),
                            .retry_cnt = 7,
                            .rnr_retry = 7,
                            .sq_psn = my_psn,
                            .max_rd_atomic = (uint8_t)nic->max_rd_atom};
    rc = ibv_modify_qp(qp, &b,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    return rc ? -rc : 0;
}

void ty__xfer_rdma_lane_fill(struct ty__xfer_rdma_lane_info *l, const struct ty__xfer_rdma_nic *nic,
                             uint8_t nic_index, uint8_t peer_nic, const struct ibv_qp *qp,
                             uint32_t psn)
{
    memset(l, 0, sizeof(*l));
    l->nic = nic_index;
    l->peer_nic = peer_nic;
    l->mtu = nic->info.mtu;
    l->link_layer = nic->info.link_layer;
    l->qpn = qp->qp_num;
    l->psn = psn;
    l->lid = nic->info.lid;
    memcpy(l->gid, nic->info.gid, 16);
}

/* ---- target side ---------------------------------------------------------------------------- */

struct serve_qps {
    uint32_t n;
    struct ibv_qp *qp[TY__XFER_RDMA_MAX_LANES];
};

void ty__xfer_rdma_serve_free(struct ty__xfer_inbound *in)
{
    struct serve_qps *s = in->rdma_qps;
    if (!s)
        return;
    for (uint32_t i = 0; i < s->n; i++)
        ibv_destroy_qp(s->qp[i]); /* a target QP has no work requests of its own */
    free(s);
    in->rdma_qps = NULL;
}

/* Create and connect our QP for each requested lane; fill *ours. Returns 0 or a refusal. */
static int serve_lanes(ty_xfer_engine_t *e, struct serve_qps *s,
                       const struct ty__xfer_rdma_connect *req, struct ty__xfer_rdma_connect *ours)
{
    struct ty__xfer_rdma *r = e->rdma;
    ours->n = req->n;
    for (uint32_t i = 0; i < req->n; i++) {
        const struct ty__xfer_rdma_lane_info *l = &req->lanes[i];
        if (l->peer_nic >= r->n)
            return TY_EPROTO;
        struct ty__xfer_rdma_nic *nic = &r->nic[l->peer_nic];
        struct ibv_qp *qp = ty__xfer_rdma_qp_create(nic);
        if (!qp)
            return TY_ENOMEM;
        s->qp[s->n++] = qp;
        uint32_t psn = ty__xfer_rdma_psn();
        int rc = ty__xfer_rdma_qp_connect(qp, nic, psn, l, e->timeout_ms);
        if (rc)
            return rc;
        ty__xfer_rdma_lane_fill(&ours->lanes[i], nic, l->peer_nic, l->nic, qp, psn);
    }
    return 0;
}

int ty__xfer_rdma_serve_connect(ty_xfer_engine_t *e, struct ty__xfer_inbound *in,
                                const struct ty__xfer_hdr *h)
{
    uint8_t body[TY_XFER_NOTIFY_MAX], out[TY_XFER_NOTIFY_MAX];
    int rc = ty__xfer_recv_all(in->fd, body, (size_t)h->len);
    if (rc)
        return rc;
    struct ty__xfer_rdma_connect req, ours;
    int status = !e->rdma       ? TY_ENOTSUP
                 : in->rdma_qps ? TY_EPROTO /* one connect per control connection */
                                : ty__xfer_rdma_connect_decode(body, (size_t)h->len, &req);
    size_t len = 0;
    if (status == 0) {
        struct serve_qps *s = calloc(1, sizeof(*s));
        if (!s)
            abort();
        in->rdma_qps = s;
        status = serve_lanes(e, s, &req, &ours);
        if (status == 0)
            len = ty__xfer_rdma_connect_encode(&ours, out, sizeof(out));
        else
            ty__xfer_rdma_serve_free(in);
    }
    if (status)
        TY_LOG_WARN(TY_XFER_SUBSYS, "rdma connect from '%s' refused: %s", in->peer_name,
                    ty_strerror(status));
    else
        TY_LOG_INFO(TY_XFER_SUBSYS, "rdma: %u queue pairs connected for '%s'", ours.n,
                    in->peer_name);
    struct ty__xfer_hdr rh = {
        .type = TY__XFER_MSG_RDMA_CONNECT_REPLY, .seq = h->seq, .status = status, .len = len};
    uint8_t hb[TY__XFER_HDR_SIZE];
    ty__xfer_hdr_encode(&rh, hb);
    struct iovec iov[2] = {{hb, sizeof(hb)}, {out, len}};
    return ty__xfer_sendv_all(in->fd, iov, len ? 2 : 1);
}
