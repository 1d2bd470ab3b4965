/* Unit tests of the transfer engine's pure parts (wire format, hello body, region table,
 * base64, metadata JSON) and of the API's validation, in one process over loopback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/errors.h"
#include "tycho/transfer.h"
#include "xfer-impl.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void test_hdr_bytes(void **state)
{
    struct ty__xfer_hdr h = {.type = TY__XFER_MSG_WRITE,
                             .flags = 1,
                             .status = 0,
                             .seq = 0x0102,
                             .addr = 0x1000,
                             .len = 16,
                             .checksum = 0xAABB,
                             .task_addr = 0x1000,
                             .task_len = 32};
    uint8_t b[TY__XFER_HDR_SIZE];
    ty__xfer_hdr_encode(&h, b);
    /* hand-written little-endian layout of the header */
    static const uint8_t want[64] = {
        'T', 'Y',  'X',  'F',  3, 1, 0, 0, 0, 0,  0,  0, 0, 0, 0, 0, 0x02, 0x01, 0,    0, 0, 0, 0,
        0,   0x00, 0x10, 0,    0, 0, 0, 0, 0, 16, 0,  0, 0, 0, 0, 0, 0,    0xBB, 0xAA, 0, 0, 0, 0,
        0,   0,    0x00, 0x10, 0, 0, 0, 0, 0, 0,  32, 0, 0, 0, 0, 0, 0,    0};
    assert_memory_equal(b, want, 64);
    struct ty__xfer_hdr d;
    assert_int_equal(ty__xfer_hdr_decode(b, &d), 0);
    assert_true(d.seq == 0x0102 && d.addr == 0x1000 && d.len == 16 && d.task_len == 32);
    b[0] = 'X';
    assert_int_equal(ty__xfer_hdr_decode(b, &d), TY_EPROTO);
    /* a slice outside its own task, an oversized notify, an unknown type */
    h.addr = 0x1000 + 20;
    ty__xfer_hdr_encode(&h, b);
    assert_int_equal(ty__xfer_hdr_decode(b, &d), TY_EPROTO);
    h = (struct ty__xfer_hdr){.type = TY__XFER_MSG_NOTIFY, .len = TY_XFER_NOTIFY_MAX + 1};
    ty__xfer_hdr_encode(&h, b);
    assert_int_equal(ty__xfer_hdr_decode(b, &d), TY_EPROTO);
    h = (struct ty__xfer_hdr){.type = 99};
    ty__xfer_hdr_encode(&h, b);
    assert_int_equal(ty__xfer_hdr_decode(b, &d), TY_EPROTO);
    /* a CUDA IPC region message carries exactly a 64-byte handle and an 8-byte offset */
    h = (struct ty__xfer_hdr){.type = TY__XFER_MSG_CUDA_IPC, .len = 72};
    ty__xfer_hdr_encode(&h, b);
    assert_int_equal(ty__xfer_hdr_decode(b, &d), 0);
    h.len = 71;
    ty__xfer_hdr_encode(&h, b);
    assert_int_equal(ty__xfer_hdr_decode(b, &d), TY_EPROTO);
}

static void test_hello_roundtrip_and_truncation(void **state)
{
    struct ty_xfer_region_info regs[3] = {{0x1000, 4096, "cpu:0", true, false},
                                          {0x9000, 1, "cuda:3", false, false},
                                          {0x20000, 64, "cuda:1", true, true}};
    struct ty__xfer_hello h = {
        .name = "decode-1", .host_id = "boot-1", .unix_name = "u", .n_regions = 3, .regions = regs};
    uint8_t *buf;
    size_t len;
    ty__xfer_hello_encode(&h, &buf, &len);
    struct ty__xfer_hello d;
    assert_int_equal(ty__xfer_hello_decode(buf, len, &d), 0);
    assert_string_equal(d.name, "decode-1");
    assert_int_equal(d.n_regions, 3);
    assert_true(d.regions[0].shared && !d.regions[0].cuda_ipc);
    assert_true(d.regions[1].addr == 0x9000 && d.regions[1].len == 1 && !d.regions[1].shared &&
                !d.regions[1].cuda_ipc);
    assert_string_equal(d.regions[1].location, "cuda:3");
    /* device memory a same-host peer opens by CUDA IPC: shared, and says how */
    assert_true(d.regions[2].shared && d.regions[2].cuda_ipc);
    ty__xfer_hello_clear(&d);
    for (size_t cut = 0; cut < len; cut++)
        assert_int_equal(ty__xfer_hello_decode(buf, cut, &d), TY_EPROTO);
    /* the last region's sharing byte (before the NIC count) is 0 none, 1 memfd, 2 CUDA IPC */
    assert_int_equal(buf[len - 2], 2);
    buf[len - 2] = 3;
    assert_int_equal(ty__xfer_hello_decode(buf, len, &d), TY_EPROTO);
    buf[len - 2] = 0;
    assert_int_equal(ty__xfer_hello_decode(buf, len, &d), 0);
    assert_true(!d.regions[2].shared && !d.regions[2].cuda_ipc);
    ty__xfer_hello_clear(&d);
    buf[len - 1] = 7; /* seven NICs announced, none follows */
    assert_int_equal(ty__xfer_hello_decode(buf, len, &d), TY_EPROTO);
    free(buf);
}

static void test_regions(void **state)
{
    struct ty__xfer_region_table t = {0};
    struct ty__xfer_region a = {.addr = 1000, .len = 100, .memfd = -1};
    struct ty__xfer_region b = {.addr = 2000, .len = 50, .memfd = -1};
    struct ty__xfer_region o = {.addr = 1099, .len = 2, .memfd = -1};
    assert_int_equal(ty__xfer_regions_add(&t, &b), 0);
    assert_int_equal(ty__xfer_regions_add(&t, &a), 0);
    assert_int_equal(ty__xfer_regions_add(&t, &o), TY_EINVAL);
    assert_non_null(ty__xfer_regions_find(&t, 1000, 100));
    assert_null(ty__xfer_regions_find(&t, 1000, 101));
    assert_null(ty__xfer_regions_find(&t, 999, 1));
    assert_null(ty__xfer_regions_find(&t, 1050, 951));         /* spans the gap into b */
    assert_null(ty__xfer_regions_find(&t, UINT64_MAX - 1, 4)); /* wraps */
    assert_true(ty__xfer_regions_find(&t, 2049, 1)->addr == 2000);
    assert_int_equal(ty__xfer_regions_remove(&t, 1000, NULL), 0);
    assert_null(ty__xfer_regions_find(&t, 1000, 1));
    assert_int_equal(ty__xfer_regions_remove(&t, 1000, NULL), TY_ENOTFOUND);
    ty__xfer_regions_clear(&t);
    int kind, dev;
    assert_int_equal(ty__xfer_location_parse("cuda:7", &kind, &dev), 0);
    assert_true(kind == TY__XFER_LOC_CUDA && dev == 7);
    assert_int_equal(ty__xfer_location_parse("cpu", &kind, &dev), 0);
    assert_int_equal(ty__xfer_location_parse("gpu:0", &kind, &dev), TY_EINVAL);
    assert_int_equal(ty__xfer_location_parse("cpu:x", &kind, &dev), TY_EINVAL);
}

static void test_base64_rfc4648(void **state)
{
    /* RFC 4648 §10 test vectors */
    static const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *out[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        char *e = ty__xfer_b64_encode((const uint8_t *)in[i], strlen(in[i]));
        assert_string_equal(e, out[i]);
        uint8_t *d;
        size_t n;
        assert_int_equal(ty__xfer_b64_decode(e, &d, &n), 0);
        assert_int_equal(n, strlen(in[i]));
        assert_memory_equal(d, in[i], n);
        free(d);
        free(e);
    }
    uint8_t *d;
    size_t n;
    assert_int_equal(ty__xfer_b64_decode("Zm9", &d, &n), TY_EPARSE);
    assert_int_equal(ty__xfer_b64_decode("Zm=v", &d, &n), TY_EPARSE);
    assert_int_equal(ty__xfer_b64_decode("Z!9v", &d, &n), TY_EPARSE);
}

static void test_meta_json(void **state)
{
    struct ty_xfer_region_info regs[2] = {{0x7f0000001000ull, 1ull << 30, "cpu:0", true, false},
                                          {0x7f8000000000ull, 1ull << 20, "cuda:0", true, true}};
    struct ty__xfer_hello h = {
        .name = "n", .host_id = "b", .unix_name = "u", .n_regions = 2, .regions = regs};
    char *js = ty__xfer_meta_to_json(&h, "10.0.0.5", 4242), host[64];
    struct ty__xfer_hello d;
    uint16_t port;
    assert_int_equal(ty__xfer_meta_from_json(js, &d, host, sizeof(host), &port), 0);
    assert_string_equal(host, "10.0.0.5");
    assert_int_equal(port, 4242);
    assert_true(d.n_regions == 2 && d.regions[0].addr == 0x7f0000001000ull);
    assert_true(d.regions[0].shared && !d.regions[0].cuda_ipc);
    assert_true(d.regions[1].shared && d.regions[1].cuda_ipc); /* etcd mode says it as well */
    ty__xfer_hello_clear(&d);
    free(js);
    assert_int_equal(ty__xfer_meta_from_json("{\"port\":99999}", &d, host, 64, &port), TY_EPARSE);
    assert_int_equal(ty__xfer_meta_from_json("not json", &d, host, 64, &port), TY_EPARSE);
}

/* A notification callback that takes what it is woken for, as a consumer would. */
struct notify_seen {
    ty_xfer_engine_t *e;
    int calls, found;
};

static void on_notify_seen(void *arg)
{
    struct notify_seen *s = arg;
    struct ty_xfer_notify n;
    s->calls++;
    while (ty_xfer_notify_poll(s->e, &n) == 0)
        s->found++;
}

static void test_api_validation(void **state)
{
    ty_xfer_engine_t *e;
    struct ty_xfer_engine_opts bad = {.transport = "carrier-pigeon"};
    assert_int_equal(ty_xfer_engine_new(&e, &bad), TY_EINVAL);
    struct ty_xfer_engine_opts wide = {.tcp_window = 17}; /* more than a READ run can carry */
    assert_int_equal(ty_xfer_engine_new(&e, &wide), TY_EINVAL);
    /* rdma asked for where no device serves it: refused at creation, not at the first open */
    struct ty_xfer_engine_opts rdma_off = {.transport = "rdma", .rdma_devices = "none"};
    assert_int_equal(ty_xfer_engine_new(&e, &rdma_off), TY_ENODEV);
    struct ty_xfer_engine_opts rdma_absent = {.transport = "rdma",
                                              .rdma_devices = "no-such-nic0"};
    assert_int_equal(ty_xfer_engine_new(&e, &rdma_absent), TY_ENODEV);
    struct ty_xfer_engine_opts o = {.timeout_ms = 1000};
    assert_int_equal(ty_xfer_engine_new(&e, &o), 0);
    static uint8_t mem[1 << 16], other[64];
    assert_int_equal(ty_xfer_mem_register(e, mem, sizeof(mem), "cpu:0"), 0);
    assert_int_equal(ty_xfer_mem_register(e, mem + 8, 8, "cpu:0"), TY_EINVAL);
    assert_int_equal(ty_xfer_mem_register(e, other, sizeof(other), "tpu:0"), TY_EINVAL);
    ty_xfer_segment_t *seg;
    assert_int_equal(ty_xfer_segment_open(e, "no-port-here", &seg), TY_EINVAL);
    /* our own name: served in-process by memcpy */
    assert_int_equal(ty_xfer_segment_open(e, ty_xfer_engine_name(e), &seg), 0);
    assert_string_equal(ty_xfer_segment_transport(seg), "local");
    ty_xfer_batch_t *b;
    assert_int_equal(ty_xfer_batch_new(e, 2, &b), 0);
    for (size_t i = 0; i < 4096; i++)
        mem[i] = (uint8_t)(i * 31);
    struct ty_xfer_request r[3] = {
        {TY_XFER_OP_WRITE, mem, seg, (uintptr_t)(mem + 8192), 4096},
        {TY_XFER_OP_READ, mem + 16384, seg, (uintptr_t)(mem + 8192), 4096},
        {TY_XFER_OP_READ, mem, seg, (uintptr_t)mem, 1}};
    assert_int_equal(ty_xfer_batch_submit(b, r, 3), TY_ENOSPC);
    struct ty_xfer_request z = r[0];
    z.len = 0;
    assert_int_equal(ty_xfer_batch_submit(b, &z, 1), TY_EINVAL);
    z = r[0];
    z.local = other; /* not registered */
    assert_int_equal(ty_xfer_batch_submit(b, &z, 1), TY_EOUTOFRANGE);
    assert_int_equal(ty_xfer_batch_submit(b, r, 1), 0);
    assert_int_equal(ty_xfer_batch_submit(b, r + 1, 1), 0);
    assert_int_equal(ty_xfer_batch_wait(b, 1000), 0);
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(mem[16384 + i], (uint8_t)(i * 31));
    struct ty_xfer_task_status st;
    assert_int_equal(ty_xfer_batch_status(b, 1, &st), 0);
    assert_true(st.state == TY_XFER_TASK_DONE && st.bytes_done == 4096);
    assert_int_equal(ty_xfer_batch_free(b), 0);
    assert_int_equal(ty_xfer_notify_send(e, seg, "hi", 2), 0);
    struct ty_xfer_notify n;
    assert_int_equal(ty_xfer_notify_poll(e, &n), 0);
    assert_true(n.len == 2 && memcmp(n.msg, "hi", 2) == 0);
    assert_int_equal(ty_xfer_notify_poll(e, &n), TY_EAGAIN);
    /* the callback runs once per notification, which is queued by then; none once removed */
    struct notify_seen seen = {.e = e};
    ty_xfer_notify_set_cb(e, on_notify_seen, &seen);
    assert_int_equal(ty_xfer_notify_send(e, seg, "one", 3), 0);
    assert_int_equal(ty_xfer_notify_send(e, seg, "two", 3), 0);
    assert_int_equal(seen.calls, 2);
    assert_int_equal(seen.found, 2);
    ty_xfer_notify_set_cb(e, NULL, NULL);
    assert_int_equal(ty_xfer_notify_send(e, seg, "three", 5), 0);
    assert_int_equal(seen.calls, 2);
    assert_int_equal(ty_xfer_notify_poll(e, &n), 0);
    assert_true(n.len == 5 && memcmp(n.msg, "three", 5) == 0);
    assert_int_equal(ty_xfer_segment_close(e, seg), 0);
    assert_int_equal(ty_xfer_mem_unregister(e, mem), 0);
    assert_int_equal(ty_xfer_mem_unregister(e, mem), TY_ENOTFOUND);
    ty_xfer_engine_free(e);
}

/* ---- RDMA pure parts ---------------------------------------------------------------------- */

static void test_rdma_mtu(void **state)
{
    /* enum ibv_mtu: 1 = 256, 2 = 512, 3 = 1024, 4 = 2048, 5 = 4096 bytes */
    assert_int_equal(ty__xfer_rdma_mtu_negotiate(5, 3), 3); /* 4096 vs 1024: 1024 */
    assert_int_equal(ty__xfer_rdma_mtu_negotiate(2, 4), 2);
    assert_int_equal(ty__xfer_rdma_mtu_negotiate(5, 5), 5);
    assert_int_equal(ty__xfer_rdma_mtu_negotiate(0, 5), 0);
    assert_int_equal(ty__xfer_rdma_mtu_negotiate(5, 6), 0);
}

static void test_rdma_pairing_and_striping(void **state)
{
    struct ty__xfer_nic_info local[3] = {{.link_layer = TY__XFER_LINK_IB},
                                         {.link_layer = TY__XFER_LINK_ETH},
                                         {.link_layer = TY__XFER_LINK_IB}};
    struct ty__xfer_nic_info peer[2] = {{.link_layer = TY__XFER_LINK_ETH},
                                        {.link_layer = TY__XFER_LINK_IB}};
    int pair[3];
    assert_int_equal(ty__xfer_rdma_pair_nics(local, 3, peer, 2, pair), 3);
    assert_int_equal(pair[0], 1); /* IB: prefers peer 0 (RoCE), takes peer 1 */
    assert_int_equal(pair[1], 0); /* RoCE: prefers peer 1 (IB), takes peer 0 */
    assert_int_equal(pair[2], 1);
    assert_int_equal(ty__xfer_rdma_pair_nics(local + 1, 1, peer + 1, 1, pair), 0);
    assert_int_equal(pair[0], -1);

    /* 64 KiB slices: 64 MiB -> 1024, 1 B -> 1, 64 KiB + 1 -> 2 */
    assert_int_equal(ty__xfer_rdma_slice_count(64u << 20, TY__XFER_RDMA_SLICE), 1024);
    assert_int_equal(ty__xfer_rdma_slice_count(1, TY__XFER_RDMA_SLICE), 1);
    assert_int_equal(ty__xfer_rdma_slice_count((64u << 10) + 1, TY__XFER_RDMA_SLICE), 2);
    /* 2 NICs x 2 QPs = 4 lanes (lane = qp * 2 + nic), task starting at lane 3 */
    static const uint32_t want[6] = {3, 0, 1, 2, 3, 0};
    for (uint32_t i = 0; i < 6; i++)
        assert_int_equal(ty__xfer_rdma_lane_of(3, i, 4), want[i]);
    /* a 1 MiB task (16 slices): 8 slices per NIC, consecutive slices on different NICs */
    int per_nic[2] = {0, 0};
    for (uint32_t i = 0; i < 16; i++) {
        uint32_t nic = ty__xfer_rdma_lane_of(1, i, 4) % 2;
        per_nic[nic]++;
        if (i > 0)
            assert_int_not_equal(nic, ty__xfer_rdma_lane_of(1, i - 1, 4) % 2);
    }
    assert_true(per_nic[0] == 8 && per_nic[1] == 8);
}

static void test_rdma_retry(void **state)
{
    bool alive[4] = {true, true, true, true};
    /* lane 0 (nic 0) failed: another NIC first (lane 1), then lane 3, then nic 0's other QP */
    assert_int_equal(ty__xfer_rdma_retry_lane(0, 1u << 0, alive, 4, 2), 1);
    alive[1] = false;
    assert_int_equal(ty__xfer_rdma_retry_lane(0, 1u << 0, alive, 4, 2), 3);
    assert_int_equal(ty__xfer_rdma_retry_lane(0, (1u << 0) | (1u << 3), alive, 4, 2), 2);
    assert_int_equal(ty__xfer_rdma_retry_lane(0, 0xF, alive, 4, 2), -1);
    alive[2] = alive[3] = false;
    assert_int_equal(ty__xfer_rdma_retry_lane(0, 1u << 0, alive, 4, 2), -1);
    /* one NIC, two QPs: the other QP */
    bool one[2] = {true, true};
    assert_int_equal(ty__xfer_rdma_retry_lane(1, 1u << 1, one, 2, 1), 0);
    /* ACK timeout: 4.096 us * 2^t * 8 tries <= timeout / 2
     * 5000 ms: 2^t <= 2.5e9 / 32768 = 76293 -> t = 16; 1000 ms: 15258 -> t = 13 */
    assert_int_equal(ty__xfer_rdma_ack_timeout(5000, 7), 16);
    assert_int_equal(ty__xfer_rdma_ack_timeout(1000, 7), 13);
    assert_int_equal(ty__xfer_rdma_ack_timeout(1, 7), 8);
    assert_int_equal(ty__xfer_rdma_ack_timeout(4000000000u, 0), 24);
}

static void test_rdma_connect_codec(void **state)
{
    struct ty__xfer_rdma_connect c = {.n = 1};
    c.lanes[0] = (struct ty__xfer_rdma_lane_info){.nic = 1,
                                                  .peer_nic = 0,
                                                  .mtu = 5,
                                                  .link_layer = TY__XFER_LINK_ETH,
                                                  .qpn = 0x123456,
                                                  .psn = 0xABCDEF,
                                                  .lid = 0x0102};
    for (int i = 0; i < 16; i++)
        c.lanes[0].gid[i] = (uint8_t)i;
    uint8_t b[64];
    assert_int_equal(ty__xfer_rdma_connect_encode(&c, b, sizeof(b)), 33);
    static const uint8_t want[33] = {1,    1, 0,    5,  2,  0x56, 0x34, 0x12, 0,  0xEF, 0xCD,
                                     0xAB, 0, 0x02, 1,  0,  1,    2,    3,    4,  5,    6,
                                     7,    8, 9,    10, 11, 12,   13,   14,   15, 0,    0};
    assert_memory_equal(b, want, 33);
    struct ty__xfer_rdma_connect d;
    assert_int_equal(ty__xfer_rdma_connect_decode(b, 33, &d), 0);
    assert_true(d.n == 1 && d.lanes[0].qpn == 0x123456 && d.lanes[0].psn == 0xABCDEF);
    assert_true(d.lanes[0].lid == 0x0102 && d.lanes[0].gid[15] == 15 && d.lanes[0].mtu == 5);
    for (size_t cut = 0; cut < 33; cut++)
        assert_int_equal(ty__xfer_rdma_connect_decode(b, cut, &d), TY_EPROTO);
    b[8] = 1; /* qpn wider than 24 bits */
    assert_int_equal(ty__xfer_rdma_connect_decode(b, 33, &d), TY_EPROTO);
    b[8] = 0;
    b[3] = 6; /* no such MTU */
    assert_int_equal(ty__xfer_rdma_connect_decode(b, 33, &d), TY_EPROTO);
    assert_int_equal(ty__xfer_rdma_connect_encode(&c, b, 32), 0); /* no room */
}

/* rkeys of every region on every NIC travel in the hello and in the etcd JSON */
static void test_rdma_rkeys_in_metadata(void **state)
{
    struct ty_xfer_region_info regs[2] = {{0x1000, 4096, "cpu:0", false, false},
                                          {0x9000, 8192, "cpu:0", false, false}};
    uint32_t rkeys[4] = {0x11, 0x22, 0x33, 0xFFFFFFFFu}; /* [region][nic] */
    struct ty__xfer_hello h = {.name = "n",
                               .host_id = "b",
                               .unix_name = "u",
                               .n_regions = 2,
                               .regions = regs,
                               .n_nics = 2,
                               .rkeys = rkeys};
    h.nics[0] = (struct ty__xfer_nic_info){"mlx5_0", 1, TY__XFER_LINK_IB, 5, 0, 7, {0xfe, 0x80}};
    h.nics[1] = (struct ty__xfer_nic_info){"mlx5_1", 1, TY__XFER_LINK_ETH, 3, 3, 0, {[15] = 9}};
    uint8_t *buf;
    size_t len;
    ty__xfer_hello_encode(&h, &buf, &len);
    struct ty__xfer_hello d;
    assert_int_equal(ty__xfer_hello_decode(buf, len, &d), 0);
    assert_int_equal(d.n_nics, 2);
    assert_string_equal(d.nics[1].name, "mlx5_1");
    assert_true(d.nics[0].lid == 7 && d.nics[1].mtu == 3 && d.nics[1].gid[15] == 9);
    assert_memory_equal(d.rkeys, rkeys, sizeof(rkeys));
    ty__xfer_hello_clear(&d);
    for (size_t cut = 0; cut < len; cut++)
        assert_int_equal(ty__xfer_hello_decode(buf, cut, &d), TY_EPROTO);
    free(buf);
    char *js = ty__xfer_meta_to_json(&h, "10.0.0.5", 4242), host[64];
    uint16_t port;
    assert_int_equal(ty__xfer_meta_from_json(js, &d, host, sizeof(host), &port), 0);
    assert_true(d.n_nics == 2 && d.nics[0].gid[0] == 0xfe && d.nics[0].gid[1] == 0x80);
    assert_memory_equal(d.rkeys, rkeys, sizeof(rkeys));
    ty__xfer_hello_clear(&d);
    free(js);
}

/* ---- SO_RCVLOWAT receive: whole messages, no wait past the message's end ------------------- */

#define LW_BIG (3u << 20)

struct lw_sender {
    int fd;
    uint8_t *big;
};

static void lw_sleep_ms(long ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Sends the big message in three pieces with pauses, then a lone 64-byte message after a
 * pause, then 10 bytes: a mark left above what is missing would wait for bytes that never
 * come. */
static void *lw_send(void *arg)
{
    struct lw_sender *s = arg;
    size_t cut[] = {0, 200000, 1700000, LW_BIG};
    for (int i = 0; i < 3; i++) {
        struct iovec iov = {s->big + cut[i], cut[i + 1] - cut[i]};
        assert_int_equal(ty__xfer_sendv_all(s->fd, &iov, 1), 0);
        lw_sleep_ms(30);
    }
    uint8_t small[64], tail[10];
    memset(small, 0x5a, sizeof(small));
    memset(tail, 0xa5, sizeof(tail));
    lw_sleep_ms(30);
    struct iovec iov = {small, sizeof(small)};
    assert_int_equal(ty__xfer_sendv_all(s->fd, &iov, 1), 0);
    lw_sleep_ms(30);
    iov = (struct iovec){tail, sizeof(tail)};
    assert_int_equal(ty__xfer_sendv_all(s->fd, &iov, 1), 0);
    return NULL;
}

static void test_recv_lowat(void **state)
{
    (void)state;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
    int rx = ty__xfer_tcp_connect("127.0.0.1", ntohs(sa.sin_port), 1000);
    assert_true(rx >= 0);
    struct lw_sender s = {.fd = accept(l, NULL, NULL), .big = malloc(LW_BIG)};
    uint8_t *got = malloc(LW_BIG);
    assert_true(s.fd >= 0 && s.big && got);
    for (size_t i = 0; i < LW_BIG; i++)
        s.big[i] = (uint8_t)(i * 2654435761u >> 11);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, lw_send, &s), 0);
    int lowat = 1;
    /* 2 s per wait: the pauses are 30 ms, so a timeout means a wait past the message's end */
    assert_int_equal(ty__xfer_recv_lowat(rx, got, LW_BIG, &lowat, 2000), 0);
    assert_memory_equal(got, s.big, LW_BIG);
    uint8_t small[64], want[64];
    memset(want, 0x5a, sizeof(want));
    assert_int_equal(ty__xfer_recv_lowat(rx, small, sizeof(small), &lowat, 2000), 0);
    assert_memory_equal(small, want, sizeof(want));
    ty__xfer_lowat_reset(rx, &lowat);
    assert_int_equal(lowat, 1);
    ty__xfer_sock_timeouts(rx, 2000); /* plain recv after the reset: the mark is 1 again */
    uint8_t tail[10];
    assert_int_equal(ty__xfer_recv_all(rx, tail, sizeof(tail)), 0);
    assert_int_equal(tail[9], 0xa5);
    pthread_join(th, NULL);
    close(s.fd);
    assert_int_equal(ty__xfer_recv_lowat(rx, small, 1, &lowat, 2000), TY_ECONNRESET);
    close(rx);
    close(l);
    free(s.big);
    free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hdr_bytes),
        cmocka_unit_test(test_hello_roundtrip_and_truncation),
        cmocka_unit_test(test_regions),
        cmocka_unit_test(test_base64_rfc4648),
        cmocka_unit_test(test_meta_json),
        cmocka_unit_test(test_api_validation),
        cmocka_unit_test(test_rdma_mtu),
        cmocka_unit_test(test_rdma_pairing_and_striping),
        cmocka_unit_test(test_rdma_retry),
        cmocka_unit_test(test_rdma_connect_codec),
        cmocka_unit_test(test_rdma_rkeys_in_metadata),
        cmocka_unit_test(test_recv_lowat),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
