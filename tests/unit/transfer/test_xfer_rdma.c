/* RDMA transport: skips (77) without an RDMA device. With one, opening a segment with transport
 * "rdma" must say clearly that the data path is not built rather than fall back silently. */
#include "tycho/errors.h"
#include "tycho/transfer.h"

#include <stdio.h>
#include <string.h>

int main(void)
{
    if (!ty_xfer_rdma_available()) {
        fprintf(stderr, "no active RDMA device: skipping\n");
        return 77;
    }
    ty_xfer_engine_t *target, *e;
    struct ty_xfer_engine_opts t = {0}, o = {.transport = "rdma"};
    if (ty_xfer_engine_new(&target, &t) || ty_xfer_engine_new(&e, &o))
        return 1;
    ty_xfer_segment_t *seg;
    int rc = ty_xfer_segment_open(e, ty_xfer_engine_name(target), &seg);
    ty_xfer_engine_free(e);
    ty_xfer_engine_free(target);
    return rc == TY_ENOTSUP ? 0 : 1;
}
