/* Pure parts of the RDMA transport: MTU negotiation, NIC pairing, slice-to-lane planning, retry
 * lane choice, the ACK timeout exponent and the connect message codec. No verbs calls and no
 * state, so all of it is unit-tested on machines without an RDMA device. Thread-safe. */
#include "xfer-impl.h"

#include "tycho/errors.h"

#include <string.h>

int ty__xfer_rdma_mtu_negotiate(int local_mtu, int peer_mtu)
{
    /* enum ibv_mtu: IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5; bigger value, bigger MTU */
    if (local_mtu < 1 || local_mtu > 5 || peer_mtu < 1 || peer_mtu > 5)
        return 0;
    return local_mtu < peer_mtu ? local_mtu : peer_mtu;
}

size_t ty__xfer_rdma_pair_nics(const struct ty__xfer_nic_info *local, size_t n_local,
                               const struct ty__xfer_nic_info *peer, size_t n_peer, int *pair)
{
    size_t paired = 0;
    for (size_t i = 0; i < n_local; i++) {
        pair[i] = -1;
        for (size_t k = 0; k < n_peer; k++) {
            size_t j = (i + k) % n_peer;
            if (peer[j].link_layer == local[i].link_layer) {
                pair[i] = (int)j;
                paired++;
                break;
            }
        }
    }
    return paired;
}

uint32_t ty__xfer_rdma_slice_count(uint64_t len, uint64_t slice)
{
    return (uint32_t)((len + slice - 1) / slice);
}

uint32_t ty__xfer_rdma_lane_of(uint32_t cursor, uint32_t i, uint32_t n_lanes)
{
    return (uint32_t)(((uint64_t)cursor + i) % n_lanes);
}

int ty__xfer_rdma_retry_lane(uint32_t failed, uint32_t tried, const bool *alive, uint32_t n_lanes,
                             uint32_t n_nics)
{
    int same_nic = -1;
    for (uint32_t k = 1; k <= n_lanes; k++) {
        uint32_t l = (failed + k) % n_lanes;
        if (!alive[l] || (tried & (1u << l)))
            continue;
        if (l % n_nics != failed % n_nics)
            return (int)l; /* another NIC: the failure may be this NIC's link */
        if (same_nic < 0)
            same_nic = (int)l;
    }
    return same_nic;
}

uint8_t ty__xfer_rdma_ack_timeout(uint32_t timeout_ms, uint8_t retry_cnt)
{
    /* IB local ACK timeout: 4.096 us * 2^t per attempt, retry_cnt + 1 attempts */
    uint64_t budget_ns = (uint64_t)timeout_ms * 1000000ull / 2;
    uint8_t t = 8;
    while (t < 24 && 4096ull * (1ull << (t + 1)) * (retry_cnt + 1u) <= budget_ns)
        t++;
    return t;
}

#define LANE_BYTES 32

size_t ty__xfer_rdma_connect_encode(const struct ty__xfer_rdma_connect *c, uint8_t *out, size_t cap)
{
    if (cap < 1 + (size_t)LANE_BYTES * c->n)
        return 0;
    out[0] = (uint8_t)c->n;
    for (uint32_t i = 0; i < c->n; i++) {
        const struct ty__xfer_rdma_lane_info *l = &c->lanes[i];
        uint8_t *p = out + 1 + (size_t)LANE_BYTES * i;
        p[0] = l->nic;
        p[1] = l->peer_nic;
        p[2] = l->mtu;
        p[3] = l->link_layer;
        for (int k = 0; k < 4; k++) {
            p[4 + k] = (uint8_t)(l->qpn >> (8 * k));
            p[8 + k] = (uint8_t)(l->psn >> (8 * k));
        }
        p[12] = (uint8_t)l->lid;
        p[13] = (uint8_t)(l->lid >> 8);
        memcpy(p + 14, l->gid, 16);
        p[30] = p[31] = 0;
    }
    return 1 + (size_t)LANE_BYTES * c->n;
}

int ty__xfer_rdma_connect_decode(const uint8_t *buf, size_t len, struct ty__xfer_rdma_connect *c)
{
    memset(c, 0, sizeof(*c));
    if (len < 1 || buf[0] == 0 || buf[0] > TY__XFER_RDMA_MAX_LANES ||
        len != 1 + (size_t)LANE_BYTES * buf[0])
        return TY_EPROTO;
    c->n = buf[0];
    for (uint32_t i = 0; i < c->n; i++) {
        struct ty__xfer_rdma_lane_info *l = &c->lanes[i];
        const uint8_t *p = buf + 1 + (size_t)LANE_BYTES * i;
        l->nic = p[0];
        l->peer_nic = p[1];
        l->mtu = p[2];
        l->link_layer = p[3];
        l->qpn = l->psn = 0;
        for (int k = 3; k >= 0; k--) {
            l->qpn = (l->qpn << 8) | p[4 + k];
            l->psn = (l->psn << 8) | p[8 + k];
        }
        l->lid = (uint16_t)(p[12] | (p[13] << 8));
        memcpy(l->gid, p + 14, 16);
        if (l->nic >= TY__XFER_RDMA_MAX_NICS || l->peer_nic >= TY__XFER_RDMA_MAX_NICS ||
            l->mtu < 1 || l->mtu > 5 ||
            (l->link_layer != TY__XFER_LINK_IB && l->link_layer != TY__XFER_LINK_ETH) ||
            l->qpn > 0xFFFFFF || l->qpn == 0 || l->psn > 0xFFFFFF || p[30] || p[31])
            return TY_EPROTO;
    }
    return 0;
}
