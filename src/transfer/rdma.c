/* RDMA transport: device discovery through libibverbs. Always compiled so the build proves the
 * verbs and rdmacm headers and libraries; the RC queue-pair data path (one-sided WRITE/READ in
 * 64 KiB slices striped over active NICs) is not implemented yet, so opening a segment with
 * transport "rdma" fails with TY_ENOTSUP and says so in the log. Thread-safe (no state). */
#include "xfer-impl.h"

#include "tycho/log.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* Count devices with at least one ACTIVE port; logs each device's active MTU at debug level. */
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
                if (ibv_query_port(ctx, port, &pa) == 0 && pa.state == IBV_PORT_ACTIVE) {
                    TY_LOG_DEBUG(TY_XFER_SUBSYS, "rdma device %s port %u active, mtu %d",
                                 ibv_get_device_name(list[i]), port, 128 << pa.active_mtu);
                    active++;
                }
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
