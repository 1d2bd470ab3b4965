/* RDMA transport smoke test in one process: skips (77) without an active RDMA device. With one,
 * a segment opened with transport "rdma" is served by rdma (never silently by tcp), a 3 MiB + 1 B
 * write lands byte for byte (RDMA loopback through the NIC), reads back, and a notification sent
 * after the write arrives. The multi-process tests are test_xfer_e2e_rdma and _rdma_kill. */
#include "tycho/errors.h"
#include "tycho/transfer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN ((3u << 20) + 1)

static int move(ty_xfer_engine_t *e, ty_xfer_segment_t *seg, enum ty_xfer_op op, uint8_t *local,
                uint8_t *remote)
{
    ty_xfer_batch_t *b;
    struct ty_xfer_request r = {op, local, seg, (uintptr_t)remote, LEN};
    int rc = ty_xfer_batch_new(e, 1, &b);
    if (rc || (rc = ty_xfer_batch_submit(b, &r, 1)) != 0)
        return rc;
    rc = ty_xfer_batch_wait(b, 10000);
    ty_xfer_batch_free(b);
    return rc;
}

int main(void)
{
    if (!ty_xfer_rdma_available()) {
        fprintf(stderr, "no active RDMA device: skipping\n");
        return 77;
    }
    ty_xfer_engine_t *target, *e;
    struct ty_xfer_engine_opts t = {.transport = "tcp"}, o = {.transport = "rdma"};
    if (ty_xfer_engine_new(&target, &t) || ty_xfer_engine_new(&e, &o))
        return 1;
    uint8_t *src = malloc(LEN), *dst = calloc(1, LEN), *back = calloc(1, LEN);
    for (uint32_t i = 0; i < LEN; i++)
        src[i] = (uint8_t)(i * 2654435761u >> 24);
    if (ty_xfer_mem_register(target, dst, LEN, "cpu:0") ||
        ty_xfer_mem_register(e, src, LEN, "cpu:0") || ty_xfer_mem_register(e, back, LEN, "cpu:0"))
        return 1;
    ty_xfer_segment_t *seg;
    int rc = ty_xfer_segment_open(e, ty_xfer_engine_name(target), &seg);
    if (rc || strcmp(ty_xfer_segment_transport(seg), "rdma") != 0) {
        fprintf(stderr, "open: %s\n", ty_strerror(rc));
        return 1;
    }
    int fail = 0;
    if ((rc = move(e, seg, TY_XFER_OP_WRITE, src, dst)) != 0 || memcmp(src, dst, LEN) != 0)
        fail = fprintf(stderr, "write: %s\n", ty_strerror(rc));
    if ((rc = move(e, seg, TY_XFER_OP_READ, back, dst)) != 0 || memcmp(src, back, LEN) != 0)
        fail = fprintf(stderr, "read: %s\n", ty_strerror(rc));
    struct ty_xfer_notify n;
    if (ty_xfer_notify_send(e, seg, "landed", 6) != 0 || ty_xfer_notify_poll(target, &n) != 0 ||
        n.len != 6)
        fail = fprintf(stderr, "notify failed\n");
    ty_xfer_segment_close(e, seg);
    ty_xfer_engine_free(e);
    ty_xfer_engine_free(target);
    free(src);
    free(dst);
    free(back);
    return fail ? 1 : 0;
}
