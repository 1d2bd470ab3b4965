/* Transfer engine internals shared by engine.c and the transports.
 *
 * A segment is {iface, context}: the transport's vtable and its per-peer state. Tasks are split
 * into slices by the transport; every slice completion goes through ty__xfer_slice_done(), which
 * is thread-safe. The engine's region table is guarded by a rwlock that remote accesses hold
 * for reading while they touch the memory, so unregister waits for them.
 */
#ifndef TYCHO_XFER_IMPL_H
#define TYCHO_XFER_IMPL_H

#include "tycho/transfer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define TY_XFER_SUBSYS "xfer"

/* ---- regions (pure table; locking is the caller's) ----------------------------------------- */

enum ty__xfer_loc_kind { TY__XFER_LOC_CPU = 0, TY__XFER_LOC_CUDA = 1 };

#define TY__XFER_RDMA_MAX_NICS 8
#define TY__XFER_IPC_HANDLE    64 /* bytes of a cudaIpcMemHandle_t */

struct ty__xfer_region {
    uint64_t addr;
    uint64_t len;
    int loc_kind;
    int loc_dev;
    int memfd;  /* >= 0 when shareable through the local transport */
    bool owned; /* mapped by ty_xfer_mem_alloc */
    /* cuda:N memory that same-host peers open by CUDA IPC: the handle of the allocation holding
     * it and addr's offset in that allocation */
    bool ipc;
    uint8_t ipc_handle[TY__XFER_IPC_HANDLE];
    uint64_t ipc_offset;
    /* RDMA: one memory registration per local NIC (struct ibv_mr *; NULL: not registered) */
    void *mr[TY__XFER_RDMA_MAX_NICS];
    uint32_t lkey[TY__XFER_RDMA_MAX_NICS], rkey[TY__XFER_RDMA_MAX_NICS];
};

struct ty__xfer_region_table {
    struct ty__xfer_region *v; /* sorted by addr, non-overlapping */
    size_t n, cap;
};

/* Parse "cpu:N" / "cuda:N" (N optional, default 0). Returns 0 or TY_EINVAL. */
int ty__xfer_location_parse(const char *s, int *kind, int *dev);
/* Insert; TY_EINVAL when empty or overlapping, TY_ENOSPC past TY_XFER_REGIONS_MAX. */
int ty__xfer_regions_add(struct ty__xfer_region_table *t, const struct ty__xfer_region *r);
/* Remove the region starting at addr into *out. TY_ENOTFOUND if none. */
int ty__xfer_regions_remove(struct ty__xfer_region_table *t, uint64_t addr,
                            struct ty__xfer_region *out);
/* The region wholly containing [addr, addr+len), or NULL (also on overflow, len 0). */
const struct ty__xfer_region *ty__xfer_regions_find(const struct ty__xfer_region_table *t,
                                                    uint64_t addr, uint64_t len);
void ty__xfer_regions_clear(struct ty__xfer_region_table *t);

/* ---- wire format (tcp and unix sockets; little-endian, 64-byte header) ---------------------- */

#define TY__XFER_MAGIC         0x46585954u /* "TYXF" */
#define TY__XFER_HDR_SIZE      64
#define TY__XFER_VERSION       1
#define TY__XFER_FLAG_CHECKSUM 0x1
#define TY__XFER_MAX_SLICE     (256ull << 20) /* the largest payload a peer accepts in one message */

enum ty__xfer_msg {
    TY__XFER_MSG_HELLO = 1,        /* payload: sender name; addr = version */
    TY__XFER_MSG_HELLO_REPLY = 2,  /* payload: hello body (regions, host id, unix name) */
    TY__XFER_MSG_WRITE = 3,        /* addr, len, payload len bytes */
    TY__XFER_MSG_READ = 4,         /* addr, len */
    TY__XFER_MSG_ACK = 5,          /* status; answers WRITE, NOTIFY */
    TY__XFER_MSG_READ_RESP = 6,    /* status, payload len bytes when status == 0 */
    TY__XFER_MSG_NOTIFY = 7,       /* payload: message */
    TY__XFER_MSG_FDS = 8,          /* unix only: one region per message, memfd in SCM_RIGHTS */
    TY__XFER_MSG_RDMA_CONNECT = 9, /* payload: rdma connect body (the initiator's QPs) */
    TY__XFER_MSG_RDMA_CONNECT_REPLY = 10, /* status; payload: the target's QPs, same order */
    TY__XFER_MSG_CUDA_IPC = 11, /* unix only: one device region (addr, seq = len); payload: the
                                 * 64-byte IPC handle of its allocation, u64 offset in it */
};

struct ty__xfer_hdr {
    uint32_t magic;
    uint8_t type;
    uint8_t flags;
    uint16_t reserved;
    int32_t status;
    uint32_t fence; /* WRITE: the writer's assignment token (ty_xfer_request.fence); 0: none */
    uint64_t seq;
    uint64_t addr;
    uint64_t len;
    uint64_t checksum;
    uint64_t task_addr; /* WRITE/READ: the whole task's range, which must lie in one region */
    uint64_t task_len;
};

/* The wire's 64-bit little-endian fields. */
void ty__xfer_put_u64(uint8_t *p, uint64_t v);
uint64_t ty__xfer_get_u64(const uint8_t *p);

void ty__xfer_hdr_encode(const struct ty__xfer_hdr *h, uint8_t out[TY__XFER_HDR_SIZE]);
/* Decode and validate magic, type and that len fits a payload. Returns 0 or TY_EPROTO. */
int ty__xfer_hdr_decode(const uint8_t in[TY__XFER_HDR_SIZE], struct ty__xfer_hdr *h);

/* One RDMA NIC (device port) as peers need to know it. */
struct ty__xfer_nic_info {
    char name[64];      /* device name, e.g. "mlx5_0" */
    uint8_t port;       /* 1-based port number */
    uint8_t link_layer; /* 1 InfiniBand, 2 Ethernet (RoCE) */
    uint8_t mtu;        /* active MTU as enum ibv_mtu: 1 = 256 .. 5 = 4096 bytes */
    uint8_t gid_index;
    uint16_t lid;
    uint8_t gid[16];
};

#define TY__XFER_LINK_IB  1
#define TY__XFER_LINK_ETH 2

/* Hello body: host id, unix socket name, the region list, then the RDMA NICs and, per region
 * and NIC, the rkey of that region's registration on that NIC (0: not reachable by RDMA). */
struct ty__xfer_hello {
    char name[TY_XFER_NAME_MAX + 1];
    char host_id[64];
    char unix_name[108];
    size_t n_regions;
    struct ty_xfer_region_info *regions; /* malloc'd by decode; free with ty__xfer_hello_clear */
    size_t n_nics;
    struct ty__xfer_nic_info nics[TY__XFER_RDMA_MAX_NICS];
    uint32_t *rkeys; /* [region * n_nics + nic], malloc'd (NULL when n_nics == 0) */
};

/* Encode into a malloc'd buffer (*out, *out_len). Aborts on OOM (small metadata). */
void ty__xfer_hello_encode(const struct ty__xfer_hello *h, uint8_t **out, size_t *out_len);
/* Decode outside input. Returns 0 or TY_EPROTO with nothing allocated. */
int ty__xfer_hello_decode(const uint8_t *buf, size_t len, struct ty__xfer_hello *h);
void ty__xfer_hello_clear(struct ty__xfer_hello *h);

/* ---- RDMA pure parts (rdma_plan.c): no verbs calls, unit-tested -------------------------- */

#define TY__XFER_RDMA_SLICE       (64u << 10) /* bytes per RDMA WRITE/READ work request */
#define TY__XFER_RDMA_QPS_PER_NIC 2           /* so a failed QP leaves another on one NIC */
#define TY__XFER_RDMA_MAX_LANES   (TY__XFER_RDMA_MAX_NICS * TY__XFER_RDMA_QPS_PER_NIC)
#define TY__XFER_RDMA_MAX_TRIES   3 /* attempts of one slice, each on a lane not tried before */

/* One RC queue pair as announced in the connect exchange. */
struct ty__xfer_rdma_lane_info {
    uint8_t nic;      /* the sender's NIC index (in its hello) */
    uint8_t peer_nic; /* the receiver's NIC index the QP must be created on */
    uint8_t mtu;      /* the sender NIC's active MTU (enum ibv_mtu) */
    uint8_t link_layer;
    uint32_t qpn; /* 24 bits */
    uint32_t psn; /* 24 bits */
    uint16_t lid;
    uint8_t gid[16];
};

struct ty__xfer_rdma_connect {
    uint32_t n;
    struct ty__xfer_rdma_lane_info lanes[TY__XFER_RDMA_MAX_LANES];
};

/* Path MTU of a QP pair: the smaller active MTU (enum ibv_mtu values 1..5); 0 if either is not
 * a valid MTU. */
int ty__xfer_rdma_mtu_negotiate(int local_mtu, int peer_mtu);
/* Pair every local NIC with a peer NIC of the same link layer, spreading them (local i prefers
 * peer i % n_peer). pair[i] = peer index or -1. Returns the number of local NICs paired. */
size_t ty__xfer_rdma_pair_nics(const struct ty__xfer_nic_info *local, size_t n_local,
                               const struct ty__xfer_nic_info *peer, size_t n_peer, int *pair);
/* Number of slices of a task of len bytes. */
uint32_t ty__xfer_rdma_slice_count(uint64_t len, uint64_t slice);
/* Lane of slice i when the task starts at lane `cursor`: round robin. Lanes are numbered
 * lane = qp * n_nics + nic, so consecutive slices go to different NICs. */
uint32_t ty__xfer_rdma_lane_of(uint32_t cursor, uint32_t i, uint32_t n_lanes);
/* Lane for retrying a slice that failed on lane `failed`: an alive lane not in `tried` (bit per
 * lane), preferring another NIC than failed's. -1 when none is left. */
int ty__xfer_rdma_retry_lane(uint32_t failed, uint32_t tried, const bool *alive, uint32_t n_lanes,
                             uint32_t n_nics);
/* The QP local ACK timeout exponent (4.096 us * 2^t per try) such that retry_cnt + 1 tries fit
 * in half of timeout_ms; clamped to 8..24. */
uint8_t ty__xfer_rdma_ack_timeout(uint32_t timeout_ms, uint8_t retry_cnt);
/* Connect body: u8 n, then per lane u8 nic, u8 peer_nic, u8 mtu, u8 link, u32 qpn, u32 psn,
 * u16 lid, 16 B gid (little-endian). Encode returns the length written (cap >= 1 + 32 * n). */
size_t ty__xfer_rdma_connect_encode(const struct ty__xfer_rdma_connect *c, uint8_t *out,
                                    size_t cap);
/* Decode outside input. Returns 0 or TY_EPROTO. */
int ty__xfer_rdma_connect_decode(const uint8_t *buf, size_t len, struct ty__xfer_rdma_connect *c);

/* ---- socket helpers (blocking fds) ---------------------------------------------------------- */

/* Send/receive exactly the iovecs / len bytes; 0, -errno, or -ECONNRESET on EOF. */
int ty__xfer_sendv_all(int fd, struct iovec *iov, int iovcnt);
int ty__xfer_recv_all(int fd, void *buf, size_t len);
/* Receive exactly len bytes, sleeping (poll, timeout_ms; -1: none) only until a large part of
 * what is missing has arrived: SO_RCVLOWAT is raised to min(missing, 1 MiB) before a wait, never
 * above what is missing, so the wait cannot outlast the message. Without it the kernel wakes the
 * reader for every arriving segment (about 16 wakeups per MiB on veth). *lowat: the socket's
 * current value (1 on a fresh socket), kept by the caller across calls; plain recv on the fd
 * needs ty__xfer_lowat_reset first. 0, -errno, TY_ETIMEDOUT, or TY_ECONNRESET on EOF. */
int ty__xfer_recv_lowat(int fd, void *buf, size_t len, int *lowat, int timeout_ms);
/* Put SO_RCVLOWAT back to 1 (a no-op when *lowat is 1). */
void ty__xfer_lowat_reset(int fd, int *lowat);
/* Send a header-only reply (ACK, READ_RESP or HELLO_REPLY refusal) carrying `status`. */
int ty__xfer_send_status(int fd, uint8_t type, uint64_t seq, int status);
/* Receive and discard len bytes. */
int ty__xfer_drain(int fd, uint64_t len);
/* Connect to host:port within timeout_ms; returns fd or -errno / TY_ETIMEDOUT. */
int ty__xfer_tcp_connect(const char *host, uint16_t port, uint32_t timeout_ms);
/* Split "host:port". Returns 0 or TY_EINVAL. */
/* Set SO_RCVTIMEO and SO_SNDTIMEO. */
void ty__xfer_sock_timeouts(int fd, uint32_t timeout_ms);

/* ---- CUDA staging (cuda.c; only in CUDA builds) --------------------------------------------- */

struct ty__xfer_stage {
    void *ptr; /* pinned host memory */
    size_t cap;
};

struct ty__xfer_task;
struct ty__xfer_cuda_q;

#ifdef TY_XFER_HAVE_CUDA
/* Make s hold at least len bytes. Returns 0 or TY_ECUDA. */
int ty__xfer_cuda_stage_reserve(struct ty__xfer_stage *s, size_t len);
void ty__xfer_cuda_stage_free(struct ty__xfer_stage *s);
/* cudaMemcpy with cudaMemcpyDefault (UVA decides the direction). Returns 0 or TY_ECUDA. */
int ty__xfer_cuda_copy(void *dst, const void *src, size_t len);
/* Whether this process sees a CUDA device (it can open peers' IPC handles). */
bool ty__xfer_cuda_ipc_usable(void);
/* The IPC handle of the allocation holding [ptr, ptr+len) and ptr's offset in it. TY_ENOTSUP
 * when there is no device, the range is not inside one cudaMalloc allocation, or the driver
 * refuses (e.g. no IPC support). */
int ty__xfer_cuda_ipc_export(const void *ptr, uint64_t len, uint8_t handle[TY__XFER_IPC_HANDLE],
                             uint64_t *offset);
/* Open a peer's handle in the calling thread's current device (peer access enabled lazily);
 * *base is its allocation's start here. Close with ty__xfer_cuda_ipc_close. */
int ty__xfer_cuda_ipc_open(const uint8_t handle[TY__XFER_IPC_HANDLE], void **base);
void ty__xfer_cuda_ipc_close(void *base);
/* Copy queue: cudaMemcpyAsync (cudaMemcpyDefault) on the queue's own stream. q_copy starts t
 * with one slice and queues the copy; q_flush completes every task queued since the last flush
 * with one host function after their copies; q_free flushes and waits for the stream. */
int ty__xfer_cuda_q_new(struct ty__xfer_cuda_q **out);
int ty__xfer_cuda_q_copy(struct ty__xfer_cuda_q *q, void *dst, const void *src, uint64_t len,
                         struct ty__xfer_task *t);
void ty__xfer_cuda_q_flush(struct ty__xfer_cuda_q *q);
void ty__xfer_cuda_q_free(struct ty__xfer_cuda_q *q);
#else
static inline bool ty__xfer_cuda_ipc_usable(void)
{
    return false;
}
#endif

/* ---- tasks, batches ----------------------------------------------------------------------- */

struct ty__xfer_task {
    _Atomic int state; /* enum ty_xfer_task_state */
    _Atomic uint64_t bytes_done;
    _Atomic int err;
    _Atomic uint32_t slices_left;
    enum ty_xfer_op op;
    uint64_t len;
    struct ty_xfer_batch *batch;
};

struct ty_xfer_batch {
    ty_xfer_engine_t *engine;
    size_t cap;
    _Atomic size_t n; /* submitted */
    _Atomic size_t pending;
    pthread_mutex_t mu; /* guards submission and the wait condition */
    pthread_cond_t cv;
    struct ty__xfer_task *tasks;
    uint32_t fence; /* ty_xfer_batch_set_fence */
};

/* Set the number of slices before the first ty__xfer_slice_done(). */
void ty__xfer_task_start(struct ty__xfer_task *t, uint32_t slices);
/* One slice of t ended with err (0: ok, `bytes` landed). Thread-safe. */
void ty__xfer_slice_done(struct ty__xfer_task *t, uint64_t bytes, int err);

/* ---- transports -------------------------------------------------------------------------- */

struct ty__xfer_slice_req {
    struct ty__xfer_task *task;
    enum ty_xfer_op op;
    uint8_t *local;
    uint64_t remote;
    uint64_t len;
    bool local_cuda; /* local lies in a cuda:N region: staged through pinned memory */
    uint32_t fence;  /* ty_xfer_request.fence */
};

struct ty__xfer_transport_i {
    const char *name;
    /* Queue one task (already validated locally); completes through ty__xfer_slice_done. */
    int (*submit)(void *ctx, const struct ty__xfer_slice_req *req);
    /* Ordered notification; blocks until acknowledged. */
    int (*notify)(void *ctx, const void *msg, size_t len);
    /* End of a batch's submission to this peer: tasks the transport holds back to complete
     * together are let go (optional, NULL: none). */
    void (*flush)(void *ctx);
    /* Periodic check from the engine's watchdog (optional, NULL: none). */
    void (*tick)(void *ctx, uint64_t now_ns);
    /* Fail everything pending, stop threads, free ctx. */
    void (*close)(void *ctx);
};

struct ty_xfer_segment {
    const struct ty__xfer_transport_i *iface;
    void *context;
    char name[TY_XFER_NAME_MAX + 1];
    int opens;
    pthread_mutex_t mu; /* guards regions */
    size_t n_regions;
    struct ty_xfer_region_info *regions;
    struct ty_xfer_segment *next;
};

/* served_in doubles as the publication point of bytes peers wrote into our regions: a serving
 * thread adds to it (release) after the bytes landed and before it acknowledges them, and a
 * thread that loads it (acquire) after the ACK, through the kernel, was sent is ordered after
 * those bytes. The peer learns of the ACK only through a socket, which the memory model (and
 * ThreadSanitizer) cannot see; serve_notify, serve_read and ty_xfer_engine_stats make it
 * visible. */
struct ty__xfer_stats_atomic {
    _Atomic uint64_t bytes_written, bytes_read, tasks_done, tasks_failed;
    _Atomic uint64_t served_in, served_out, refused, checksum_errors, peer_failures, reconnects;
    _Atomic uint64_t auth_failures, refused_conns, fenced_writes;
};

struct ty__xfer_inbound {
    int fd;
    pthread_t thr;
    bool is_unix;
    _Atomic bool finished;
    _Atomic bool proven;  /* passed the cluster handshake */
    _Atomic uint32_t writing_tag; /* the fence tag of the write whose bytes are landing; 0 */
    uint32_t peer_ip;             /* IPv4 address of a tcp peer (per-peer cap); 0: unix */
    char peer_addr[24];           /* "a.b.c.d:port" of a tcp peer, for log lines */
    struct ty__xfer_stage stage; /* for cuda regions (CUDA builds) */
    ty_xfer_engine_t *engine;
    char peer_name[TY_XFER_NAME_MAX + 1];
    void *rdma_qps; /* target-side QPs made by RDMA_CONNECT on this connection (rdma.c) */
    struct ty__xfer_inbound *next;
};

struct ty__xfer_notify_node {
    struct ty_xfer_notify n;
    struct ty__xfer_notify_node *next;
};

struct ty__xfer_etcd;
struct ty__xfer_rdma;

struct ty_xfer_engine {
    char name[TY_XFER_NAME_MAX + 1];
    char listen_host[64];
    char advertise_host[64];
    uint16_t port;
    char transport[16];
    uint32_t tcp_conns;
    uint64_t slice_bytes;
    uint32_t tcp_window; /* slices in flight per connection (tcp.c) */
    uint32_t timeout_ms;
    bool checksum;
    char host_id[64];

    pthread_rwlock_t regions_lock;
    struct ty__xfer_region_table regions;

    int listen_fd;
    pthread_t listen_thr;
    int unix_fd;
    char unix_name[108]; /* abstract socket name, without the leading NUL */
    pthread_t unix_thr;

    const struct ty_auth *auth; /* borrowed; NULL: insecure */
    pthread_rwlock_t fence_lock; /* guards fence_cb/fence_arg against a concurrent unset */
    ty_xfer_write_fence_cb fence_cb;
    void *fence_arg;
    uint32_t max_inbound;
    pthread_mutex_t inbound_mu; /* guards inbound list */
    struct ty__xfer_inbound *inbound;
    _Atomic bool stopping;

    pthread_mutex_t seg_mu; /* guards segments list and opens */
    struct ty_xfer_segment *segments;

    pthread_mutex_t notify_mu;
    struct ty__xfer_notify_node *notify_head, *notify_tail;
    size_t notify_len;
    pthread_mutex_t notify_cb_mu; /* held while notify_cb runs and while it is replaced */
    ty_xfer_notify_cb notify_cb;  /* under notify_cb_mu; NULL: none */
    void *notify_arg;
    pthread_mutex_t open_mu; /* serializes segment opens (connects run without seg_mu) */

    pthread_mutex_t wd_mu;
    pthread_cond_t wd_cv;
    pthread_t wd_thr;

    struct ty__xfer_rdma *rdma; /* NULL: no RDMA device (or rdma_devices "none") */
    struct ty__xfer_etcd *etcd;
    uint32_t etcd_ttl_s;
    pthread_t etcd_thr; /* lease keepalive, every ttl/3 */
    bool etcd_thr_started;
    struct ty__xfer_stats_atomic st;
};

/* Engine services used by the transports and servers. */
/* Hold the region table for reading while touching memory at [addr, addr+len): returns the
 * region (lock held) or NULL (lock released). Pair with ty__xfer_regions_unlock. */
const struct ty__xfer_region *ty__xfer_regions_rdlock(ty_xfer_engine_t *e, uint64_t addr,
                                                      uint64_t len);
void ty__xfer_regions_unlock(ty_xfer_engine_t *e);
/* Fill a hello describing this engine (regions malloc'd). */
void ty__xfer_engine_hello(ty_xfer_engine_t *e, struct ty__xfer_hello *h);
/* Queue a received notification; TY_ENOSPC when the queue is full. */
int ty__xfer_notify_push(ty_xfer_engine_t *e, const char *from, const void *msg, size_t len);

/* inbound.c: the inbound control channel */
/* The cluster handshake on a new connection (either side); logs and counts a failure. Returns
 * 0 or the handshake's error. */
int ty__xfer_auth(ty_xfer_engine_t *e, int fd, bool server, const char *peer);
/* Bind and listen on listen_host:port (0: ephemeral; e->port gets the bound one). */
int ty__xfer_inbound_listen(ty_xfer_engine_t *e, uint16_t port);
/* Accept loops (thread bodies) of the tcp listener and of the local transport's unix socket
 * (ty__xfer_local_listen); they return once the engine is stopping. */
void *ty__xfer_inbound_accept_main(void *arg);
void *ty__xfer_inbound_accept_unix_main(void *arg);
/* Register an accepted connection and start its serving thread. */
void ty__xfer_inbound_start(ty_xfer_engine_t *e, int fd, bool is_unix);
/* Join and free the finished connections, or (all) shut down and free every one. */
void ty__xfer_inbound_reap(ty_xfer_engine_t *e, bool all);
/* Dial a peer's inbound channel at host:port and run the hello exchange (fills *hello when
 * non-NULL). Returns the connected fd (blocking, no socket timeouts) or a negative error. */
int ty__xfer_inbound_dial(ty_xfer_engine_t *e, const char *host, uint16_t port,
                          struct ty__xfer_hello *hello);

/* tcp.c */
extern const struct ty__xfer_transport_i ty__xfer_tcp_iface;
/* Connect to host:port, handshake, fill *hello. On success *ctx is the peer state. */
int ty__xfer_tcp_open(ty_xfer_engine_t *e, const char *host, uint16_t port,
                      struct ty__xfer_hello *hello, void **ctx);
/* Target side of a WRITE (receive the payload into registered memory, ACK) and of a READ
 * (READ_RESP + payload) whose header h arrived on inbound connection `in`. An access outside
 * registered memory is refused (TY_EOUTOFRANGE in the reply) and the connection kept. Returns
 * a connection error (the connection ends), else 0. */
int ty__xfer_tcp_serve_write(ty_xfer_engine_t *e, struct ty__xfer_inbound *in,
                             const struct ty__xfer_hdr *h);
int ty__xfer_tcp_serve_read(ty_xfer_engine_t *e, struct ty__xfer_inbound *in,
                            const struct ty__xfer_hdr *h);

/* rdma.c, rdma_xport.c: what the engine core, the segments and the inbound channel ask of the
 * RDMA transport. struct ty__xfer_rdma stays opaque outside it (rdma-impl.h). */
/* Open the devices named in `filter` (comma list; NULL: all) that have an ACTIVE port, one NIC
 * per device (its first active port), each with a PD, a CQ and a completion thread. *out is NULL
 * (and 0 returned) when there is none. */
int ty__xfer_rdma_new(ty_xfer_engine_t *e, const char *filter, struct ty__xfer_rdma **out);
/* Stop the completion threads and close the devices. Every QP and MR must be gone. */
void ty__xfer_rdma_free(struct ty__xfer_rdma *r);
/* Register reg's memory on every NIC (fills mr, lkey, rkey). A cuda region that a NIC cannot
 * register (no GPUDirect) keeps mr NULL and rkey 0 on it. Returns 0 or -errno. */
int ty__xfer_rdma_reg(struct ty__xfer_rdma *r, struct ty__xfer_region *reg);
void ty__xfer_rdma_dereg(struct ty__xfer_region *reg);
/* Our NICs for a hello. */
void ty__xfer_rdma_describe(const struct ty__xfer_rdma *r, struct ty__xfer_hello *h);
/* Number of NICs opened (0 for NULL: no RDMA). */
size_t ty__xfer_rdma_nic_count(const struct ty__xfer_rdma *r);
/* Target side of RDMA_CONNECT on an inbound tcp connection: create and connect one QP per lane
 * the initiator asked for, answer with ours. The QPs live until the connection ends
 * (ty__xfer_rdma_serve_free). Returns a connection error; refusals go in the reply status. */
int ty__xfer_rdma_serve_connect(ty_xfer_engine_t *e, struct ty__xfer_inbound *in,
                                const struct ty__xfer_hdr *h);
void ty__xfer_rdma_serve_free(struct ty__xfer_inbound *in);

extern const struct ty__xfer_transport_i ty__xfer_rdma_iface;
/* Whether RDMA can serve this peer: we and it have NICs that pair. */
bool ty__xfer_rdma_can_serve(ty_xfer_engine_t *e, const struct ty__xfer_hello *hello);
/* Open the RDMA transport to a peer whose hello we have: a control tcp connection, then one RC
 * QP pair per lane. On success *ctx is the peer state. */
int ty__xfer_rdma_open(ty_xfer_engine_t *e, const char *host, uint16_t port,
                       const struct ty__xfer_hello *hello, void **ctx);

/* local.c */
extern const struct ty__xfer_transport_i ty__xfer_local_iface;
/* The same transport to a peer with device regions opened by CUDA IPC (named "cuda_ipc"). */
extern const struct ty__xfer_transport_i ty__xfer_local_ipc_iface;
/* Same-host peer: connect its unix socket, map its memfd regions and open its CUDA IPC ones. */
int ty__xfer_local_open(ty_xfer_engine_t *e, const struct ty__xfer_hello *hello, void **ctx);
/* Same process: memcpy against our own table. */
int ty__xfer_local_open_self(ty_xfer_engine_t *e, void **ctx);
void ty__xfer_local_serve(ty_xfer_engine_t *e, struct ty__xfer_inbound *in);
int ty__xfer_local_listen(ty_xfer_engine_t *e);
/* Republish this engine's metadata to etcd (no-op without etcd). */
int ty__xfer_engine_publish(ty_xfer_engine_t *e);
/* Shared memory that other processes on this host can map (the local transport passes the fd),
 * advised for transparent huge pages. */
int ty__xfer_memfd_alloc(size_t len, int *fd, void **addr);
/* Whether tmpfs grants those (the selected word of
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled is advise, within_size, always or force). */
bool ty__xfer_shmem_thp(void);

/* etcd.c */
int ty__xfer_etcd_new(struct ty__xfer_etcd **out, const char *endpoint, uint32_t timeout_ms);
void ty__xfer_etcd_free(struct ty__xfer_etcd *c);
int ty__xfer_etcd_put(struct ty__xfer_etcd *c, const char *key, const char *value);
/* *value is malloc'd; TY_ENOTFOUND when the key is absent. */
int ty__xfer_etcd_get(struct ty__xfer_etcd *c, const char *key, char **value);
int ty__xfer_etcd_del(struct ty__xfer_etcd *c, const char *key);
/* Grant a lease of ttl_s seconds; later puts carry it. Returns 0, TY_ERPC, TY_EPARSE. */
int ty__xfer_etcd_lease_grant(struct ty__xfer_etcd *c, uint32_t ttl_s);
/* Refresh the lease once. Returns 0, TY_ELEASE when it expired (grant a new one), TY_ERPC. */
int ty__xfer_etcd_lease_keepalive(struct ty__xfer_etcd *c);
/* Revoke the lease (its keys vanish with it); no-op without one. */
int ty__xfer_etcd_lease_revoke(struct ty__xfer_etcd *c);
/* Standard base64 (RFC 4648 §4); decode returns 0 or TY_EPARSE. Outputs malloc'd. */
char *ty__xfer_b64_encode(const uint8_t *in, size_t len);
int ty__xfer_b64_decode(const char *in, uint8_t **out, size_t *out_len);
/* Segment metadata JSON <-> hello ("host", "port", "host_id", "regions"). */
char *ty__xfer_meta_to_json(const struct ty__xfer_hello *h, const char *host, uint16_t port);
int ty__xfer_meta_from_json(const char *json, struct ty__xfer_hello *h, char *host, size_t host_cap,
                            uint16_t *port);

#endif
