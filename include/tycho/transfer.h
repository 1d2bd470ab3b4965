/* Transfer engine: moves bytes between registered memory of this process and a remote segment.
 *
 * An engine owns this process's segment (its registered regions, published under a name) and a
 * set of open remote segments, each served by exactly one transport (tcp, local shared memory,
 * rdma) chosen at open time, logged, and never changed silently. Work is submitted in batches
 * of tasks (read or write: local address, segment, remote address, length); every task ends
 * DONE or FAILED within a bounded time. The API shape follows Mooncake's transfer engine C API.
 *
 * Threading: every function is safe to call from any thread unless stated otherwise; the engine
 * runs its own I/O threads. Ownership: the caller owns registered memory and must keep it alive
 * until ty_xfer_mem_unregister() returns; a batch is owned by its creator and may be freed only
 * when none of its tasks is pending.
 */
#ifndef TYCHO_TRANSFER_H
#define TYCHO_TRANSFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ty_auth;

typedef struct ty_xfer_engine ty_xfer_engine_t;
typedef struct ty_xfer_segment ty_xfer_segment_t;
typedef struct ty_xfer_batch ty_xfer_batch_t;

#define TY_XFER_NAME_MAX    255  /* segment names, notification sender names */
#define TY_XFER_NOTIFY_MAX  4096 /* bytes in one notification */
#define TY_XFER_REGIONS_MAX 1024 /* regions one segment may publish */

struct ty_xfer_engine_opts {
    const char *name;           /* segment name; NULL: "host:port" of the listener */
    const char *listen_host;    /* NULL: "127.0.0.1"; "0.0.0.0" for every interface */
    uint16_t listen_port;       /* 0: ephemeral */
    const char *transport;      /* "auto" (NULL), "tcp", "local" or "rdma" for opened segments */
    uint32_t tcp_conns;         /* TCP connections per peer; 0: 4 */
    uint64_t slice_bytes;       /* TCP slice (unit of one acknowledged write); 0: 1 MiB */
    uint32_t tcp_window;        /* TCP slices in flight per connection, 1..16; 0: 2 */
    uint32_t timeout_ms;        /* a peer without progress this long fails its tasks; 0: 5000 */
    bool checksum;              /* XXH3 per TCP slice, verified by the receiving side */
    const char *etcd_endpoint;  /* "http://127.0.0.1:2379": metadata in etcd; NULL: handshake */
    const char *advertise_host; /* address peers should dial (etcd mode); NULL: listen_host */
    uint32_t etcd_ttl_s;        /* lease TTL of our etcd key (kept alive while we run); 0: 10 */
    const char *rdma_devices;   /* comma list of RDMA devices to use; NULL: every device with an
                                 * ACTIVE port; "none": no RDMA (no memory registration) */
    const struct ty_auth *auth; /* cluster secret every tcp and unix connection proves, both
                                 * ways, before its first message (tycho/auth.h); borrowed,
                                 * outlives the engine; NULL: insecure */
    uint32_t max_inbound;       /* inbound connections served at once; 0: 1024. Unproven ones
                                 * beyond 64 push out the oldest unproven; one peer address
                                 * holds at most a quarter of the proven ones */
};

/* Create an engine listening on opts->listen_host:port. Returns 0 and *out, or TY_EINVAL for a
 * bad option, TY_ENODEV for transport "rdma" where no listed RDMA device is usable, -errno if
 * the socket cannot be bound, TY_ERPC if etcd cannot be reached. */
int ty_xfer_engine_new(ty_xfer_engine_t **out, const struct ty_xfer_engine_opts *opts);

/* Close every segment, fail pending tasks, stop threads, remove the etcd entry. NULL: no-op.
 * Batches must already be freed. Not from an engine callback. */
void ty_xfer_engine_free(ty_xfer_engine_t *e);

/* This engine's segment name (borrowed, lives as long as the engine). */
const char *ty_xfer_engine_name(const ty_xfer_engine_t *e);

/* The TCP port the engine listens on. */
uint16_t ty_xfer_engine_port(const ty_xfer_engine_t *e);

/* ---- memory ------------------------------------------------------------------------------- */

/* Register [addr, addr+len) at `location` ("cpu:N", or "cuda:N" in CUDA builds) so peers may
 * read and write it. Returns 0, TY_EINVAL (bad location, empty or overlapping range),
 * TY_ENOSPC (too many regions), TY_ENOTSUP (cuda in a build without CUDA). */
int ty_xfer_mem_register(ty_xfer_engine_t *e, void *addr, size_t len, const char *location);

/* Unregister the region starting at addr; waits for remote accesses in progress on it.
 * Returns 0 or TY_ENOTFOUND. */
int ty_xfer_mem_unregister(ty_xfer_engine_t *e, void *addr);

/* Allocate `len` bytes of shared (memfd) host memory and register it, so peers on this host can
 * reach it through the local transport. Returns 0 and *out, or TY_ENOMEM / -errno. */
int ty_xfer_mem_alloc(ty_xfer_engine_t *e, size_t len, void **out);

/* Unregister and unmap memory from ty_xfer_mem_alloc(). Returns 0 or TY_ENOTFOUND. */
int ty_xfer_mem_release(ty_xfer_engine_t *e, void *addr);

/* ---- segments ------------------------------------------------------------------------------ */

struct ty_xfer_region_info {
    uint64_t addr; /* address in the owner's space: the `remote` of a request */
    uint64_t len;
    char location[16];
    bool shared;   /* reachable by the local transport: memfd host memory, or cuda_ipc */
    bool cuda_ipc; /* device memory a same-host peer opens by CUDA IPC */
};

/* Open the segment `name` ("host:port" in handshake mode; any name in etcd mode). Opening the
 * same name again returns the same handle with its open count raised. Returns 0 and *out,
 * TY_ENOTFOUND (unknown in etcd), -ECONNREFUSED / TY_ETIMEDOUT (peer unreachable), TY_EPROTO
 * (bad handshake), TY_ENOTSUP (the requested transport cannot serve this peer). */
int ty_xfer_segment_open(ty_xfer_engine_t *e, const char *name, ty_xfer_segment_t **out);

/* Drop one open of seg; the last one fails its pending tasks and frees it. Returns 0. */
int ty_xfer_segment_close(ty_xfer_engine_t *e, ty_xfer_segment_t *seg);

/* Name of the transport serving seg: "tcp", "local", "cuda_ipc" (the local transport to a peer
 * with device regions) or "rdma" (static string). */
const char *ty_xfer_segment_transport(const ty_xfer_segment_t *seg);

/* Copy up to `cap` of the segment's regions (as last learned) to out; *n gets the total count. */
int ty_xfer_segment_regions(ty_xfer_segment_t *seg, struct ty_xfer_region_info *out, size_t cap,
                            size_t *n);

/* ---- batches ------------------------------------------------------------------------------- */

enum ty_xfer_op {
    TY_XFER_OP_READ = 0,  /* remote -> local */
    TY_XFER_OP_WRITE = 1, /* local -> remote */
};

enum ty_xfer_task_state {
    TY_XFER_TASK_EMPTY = 0, /* slot not submitted */
    TY_XFER_TASK_PENDING = 1,
    TY_XFER_TASK_DONE = 2,
    TY_XFER_TASK_FAILED = 3,
};

struct ty_xfer_request {
    enum ty_xfer_op op;
    void *local; /* inside memory registered with this engine */
    ty_xfer_segment_t *segment;
    uint64_t remote; /* address inside one of the segment's regions */
    uint64_t len;    /* > 0 */
};

struct ty_xfer_task_status {
    enum ty_xfer_task_state state;
    uint64_t bytes_done;
    int err; /* first error of a FAILED task: TY_EOUTOFRANGE, TY_ETIMEDOUT, -ECONNRESET, ... */
};

/* Create a batch with room for max_tasks tasks. Returns 0 and *out, or TY_EINVAL. */
int ty_xfer_batch_new(ty_xfer_engine_t *e, size_t max_tasks, ty_xfer_batch_t **out);

/* Submit n more tasks (appended after those already submitted). Requests are validated first:
 * TY_EINVAL (zero length, NULL segment), TY_EOUTOFRANGE (local range not registered), TY_ENOSPC
 * (batch full); then nothing was submitted. Once accepted each task ends DONE or FAILED. */
int ty_xfer_batch_submit(ty_xfer_batch_t *b, const struct ty_xfer_request *reqs, size_t n);

/* Tag the writes of tasks submitted from now on with `fence`: the token of the assignment the
 * bytes belong to, which the target's write fence checks (ty_xfer_engine_set_write_fence) over
 * tcp. 0 (the default): untagged. The submitting thread. */
void ty_xfer_batch_set_fence(ty_xfer_batch_t *b, uint32_t fence);

/* Status of task i (0-based, in submission order). Returns 0 or TY_EINVAL. */
int ty_xfer_batch_status(ty_xfer_batch_t *b, size_t i, struct ty_xfer_task_status *out);

/* Wait until no task is pending or timeout_ms passes. Returns 0 when all tasks are DONE, the
 * first failed task's error when one FAILED (which may itself be TY_ETIMEDOUT: its peer
 * stalled), and TY_EBUSY when some are still pending at the deadline. */
int ty_xfer_batch_wait(ty_xfer_batch_t *b, uint32_t timeout_ms);

/* Free a batch. Returns 0, or TY_EBUSY (and frees nothing) while a task is pending. */
int ty_xfer_batch_free(ty_xfer_batch_t *b);

/* ---- notifications ------------------------------------------------------------------------- */

struct ty_xfer_notify {
    char from[TY_XFER_NAME_MAX + 1]; /* sender's segment name */
    uint32_t len;
    uint8_t msg[TY_XFER_NOTIFY_MAX];
};

/* Send a small message to seg's owner, delivered after every write submitted to seg before this
 * call has landed. Blocks until the peer has it (or the timeout). Returns 0, TY_EMSGSIZE,
 * TY_ETIMEDOUT, -ECONNRESET. */
int ty_xfer_notify_send(ty_xfer_engine_t *e, ty_xfer_segment_t *seg, const void *msg, size_t len);

/* Take the oldest notification received, if any. Returns 0 or TY_EAGAIN when none. */
int ty_xfer_notify_poll(ty_xfer_engine_t *e, struct ty_xfer_notify *out);

/* Called after a notification was queued, so that a consumer sleeps until one comes instead of
 * polling. It runs on the engine thread that received the notification (an inbound
 * connection's thread, or the sender's own thread for a notification to its own segment), with
 * the engine's callback lock held: one callback at a time, never after the
 * ty_xfer_notify_set_cb() that replaced it returned. Keep it short and non-blocking (signal a
 * condition variable, write an eventfd); it may call ty_xfer_notify_poll() but not
 * ty_xfer_notify_set_cb() nor ty_xfer_engine_free(). The notification is queued before the
 * callback runs, so a consumer that clears its "woken" flag before it polls loses none. */
typedef void (*ty_xfer_notify_cb)(void *arg);

/* Install (or, cb NULL, remove) the notification callback; `arg` is borrowed and must stay valid
 * until the callback is replaced or removed. Any thread except the callback itself. */
void ty_xfer_notify_set_cb(ty_xfer_engine_t *e, ty_xfer_notify_cb cb, void *arg);

/* ---- observability ------------------------------------------------------------------------- */

struct ty_xfer_stats {
    uint64_t bytes_written; /* by this engine's tasks, to peers */
    uint64_t bytes_read;    /* by this engine's tasks, from peers */
    uint64_t tasks_done;
    uint64_t tasks_failed;
    uint64_t served_bytes_in;  /* written into our regions by peers */
    uint64_t served_bytes_out; /* read from our regions by peers */
    uint64_t refused_accesses; /* peer accesses outside our regions, answered with an error */
    uint64_t checksum_errors;
    uint64_t peer_failures; /* peers broken by error or timeout */
    uint64_t reconnects;
    uint64_t auth_failures;    /* inbound or outbound connections that failed the handshake */
    uint64_t refused_conns;    /* inbound connections over max_inbound, or unproven pushed out */
    uint64_t fenced_writes;    /* inbound writes the write fence refused */
    uint32_t segments_tcp; /* gauges: open segments per transport */
    uint32_t segments_local;
    uint32_t segments_rdma;
};

/* Write fencing: the target says which writes it still takes. `cb` runs on an inbound serving
 * thread for each tcp WRITE before its bytes land, with the writer's fence token and the range;
 * false refuses the write (its bytes are dropped, the writer's task fails with TY_ESTALE) and
 * counts it in fenced_writes. A superseded writer (a prefill node that hung and came back after
 * its request went elsewhere) so cannot touch pages that now belong to someone else. Writes over
 * the local and rdma transports land without the target's CPU and are not fenced. cb NULL: no
 * fence. Any thread; cb must be thread-safe and live until it is unset. */
typedef bool (*ty_xfer_write_fence_cb)(void *arg, uint32_t fence, uint64_t addr, uint64_t len);
void ty_xfer_engine_set_write_fence(ty_xfer_engine_t *e, ty_xfer_write_fence_cb cb, void *arg);

/* The fence stopped taking `tag` (cb now says false for it): once this returns, no write tagged
 * `tag` that the fence let through before is still landing. One whose bytes are still coming
 * is given 100 ms, then its connection is shut down (a writer that hung mid-write). Not from
 * the fence callback. */
void ty_xfer_engine_fence_revoke(ty_xfer_engine_t *e, uint32_t tag);

/* Snapshot of the engine's counters and gauges. A peer's TCP write is counted in
 * served_bytes_in after its bytes landed and before it is acknowledged, so a thread that takes a
 * snapshot after learning of the ACK (e.g. from the peer) may read those bytes: the snapshot
 * acquires what the serving threads released. Notifications carry the same ordering. */
void ty_xfer_engine_stats(ty_xfer_engine_t *e, struct ty_xfer_stats *out);

/* True when an RDMA device is present (ibv_get_device_list finds one). */
bool ty_xfer_rdma_available(void);

#endif
