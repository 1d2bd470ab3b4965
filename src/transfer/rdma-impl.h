/* RDMA transport internals shared by rdma.c (devices, memory registration, completion threads,
 * queue-pair setup, the target side of the connect exchange) and rdma_xport.c (the initiator's
 * transport: slicing, posting, retry, notifications, failure).
 *
 * Threading: struct ty__xfer_rdma is created with the engine and immutable afterwards except for
 * the per-NIC outstanding counters (atomics); each NIC has one completion thread that hands every
 * work completion to ty__xfer_rdma_on_completion(). Ownership: the engine owns the context; QPs
 * belong to the peer (initiator) or inbound connection (target) that created them.
 */
#ifndef TYCHO_XFER_RDMA_IMPL_H
#define TYCHO_XFER_RDMA_IMPL_H

#include "xfer-impl.h"

#include <infiniband/verbs.h>

#define TY__XFER_RDMA_QP_DEPTH 128 /* send work requests in flight per QP */

struct ty__xfer_rdma_nic {
    struct ty__xfer_nic_info info;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *channel;
    struct ibv_cq *cq;
    int cqe;                 /* CQ size: bound on work requests outstanding on this NIC */
    _Atomic int outstanding; /* posted, not completed, over all QPs of this NIC */
    int max_rd_atom;         /* RDMA READs in flight per QP (device limit, <= 16) */
    uint32_t max_qp_wr;
    pthread_t thr;
    bool thr_started;
    struct ty__xfer_rdma *owner;
};

struct ty__xfer_rdma {
    ty_xfer_engine_t *e;
    _Atomic bool stop;
    size_t n;
    struct ty__xfer_rdma_nic nic[TY__XFER_RDMA_MAX_NICS];
};

/* Create an RC QP on nic (state RESET -> INIT). Returns NULL with a log line on failure. */
struct ibv_qp *ty__xfer_rdma_qp_create(struct ty__xfer_rdma_nic *nic);
/* INIT -> RTR -> RTS against the remote QP `remote`, path MTU = min of both active MTUs, ACK
 * timeout derived from timeout_ms. Returns 0 or -errno (TY_EPROTO for an MTU mismatch). */
int ty__xfer_rdma_qp_connect(struct ibv_qp *qp, struct ty__xfer_rdma_nic *nic, uint32_t my_psn,
                             const struct ty__xfer_rdma_lane_info *remote, uint32_t timeout_ms);
/* Our side of a lane for the connect message. */
void ty__xfer_rdma_lane_fill(struct ty__xfer_rdma_lane_info *l, const struct ty__xfer_rdma_nic *nic,
                             uint8_t nic_index, uint8_t peer_nic, const struct ibv_qp *qp,
                             uint32_t psn);
/* A random 24-bit packet sequence number. */
uint32_t ty__xfer_rdma_psn(void);

/* rdma_xport.c: one work completion (wr_id, status) from a NIC's completion thread. */
void ty__xfer_rdma_on_completion(uint64_t wr_id, enum ibv_wc_status status, uint32_t vendor_err);

#endif
