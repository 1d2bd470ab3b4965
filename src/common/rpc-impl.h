/* Internal: one framed TCP connection shared by the RPC server and client.
 *
 * A ty__rpc_conn is embedded in its owner's per-connection struct. It reads, decodes and
 * dispatches frames to on_frame, writes frames (each frame one uv_write with its own copy of
 * the bytes), and closes itself on EOF, socket errors and malformed input (logging the reason,
 * rate-limited). Loop thread only. The owner frees the embedding struct in on_closed, which runs
 * from the uv close callback; on_closing runs once, synchronously, when the close starts.
 */
#ifndef TYCHO_RPC_IMPL_H
#define TYCHO_RPC_IMPL_H

#include "tycho/auth.h"
#include "tycho/rpc.h"

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#define TY__RPC_READ_BUF        (64u * 1024u)
#define TY__RPC_MAX_WRITE_QUEUE (64u << 20) /* bytes queued on a socket before sends fail */

struct ty__rpc_conn;

typedef void (*ty__rpc_frame_cb)(struct ty__rpc_conn *c, const struct ty_rpc_frame *f);
typedef void (*ty__rpc_conn_cb)(struct ty__rpc_conn *c, int reason);

/* A connection first runs the cluster handshake (tycho/auth.h): no frame is decoded, and the
 * client sends none, until both ends proved they know the secret; then on_authed runs. Reads go
 * into one buffer per thread (frames are decoded from it before the read callback returns), so
 * an idle or half-open connection costs a few hundred bytes, not a read buffer. */
struct ty__rpc_conn {
    uv_tcp_t tcp;
    struct ty_rpc_decoder dec;
    ty__rpc_frame_cb on_frame;
    ty__rpc_conn_cb on_closing; /* optional; close started (reason 0 = local close) */
    ty__rpc_conn_cb on_closed;  /* required; handle closed, owner frees */
    ty__rpc_conn_cb on_authed;  /* optional; the handshake succeeded (reason 0) */
    void *owner;
    const char *role; /* "server" / "client", for log lines */
    char peer[64];
    struct sockaddr_storage peer_addr; /* recorded at start (family 0 if unknown) */
    bool reading;
    bool closing;
    bool authed;
    int close_reason;
    const struct ty_auth *auth; /* borrowed; NULL: insecure */
    struct ty_auth_hs *hs;      /* while the handshake runs */
    uint64_t last_active_ms;    /* uv_now() of the last byte read */
};

/* Initialise the embedded conn and its uv_tcp_t on `loop`. Returns 0 or a TY_E* code (then
 * nothing needs closing). */
int ty__rpc_conn_init(struct ty__rpc_conn *c, uv_loop_t *loop, uint32_t max_frame,
                      const char *role);

/* Start reading (after accept or connect) and the handshake (the server sends its challenge);
 * records the peer address for logs. */
int ty__rpc_conn_start(struct ty__rpc_conn *c);

/* Queue one frame. Returns 0, TY_ENOTCONN when closing, TY_EAGAIN when the write queue is over
 * TY__RPC_MAX_WRITE_QUEUE, TY_EMSGSIZE over the frame limit, or a uv write error. */
int ty__rpc_conn_send(struct ty__rpc_conn *c, enum ty_rpc_kind kind, uint16_t method, uint64_t id,
                      const uint8_t *payload, size_t len);

/* Queue an already-encoded frame (malloc'd). On 0 the conn owns `frame` and frees it once
 * written; on error the caller still owns it. A socket error also starts the close. */
int ty__rpc_conn_send_owned(struct ty__rpc_conn *c, uint8_t *frame, size_t len);

/* Encode a frame into a new malloc'd buffer. */
int ty__rpc_frame_alloc(enum ty_rpc_kind kind, uint16_t method, uint64_t id, const uint8_t *payload,
                        size_t len, uint8_t **out, size_t *out_len);

/* Start closing (idempotent). `reason` 0 for an orderly local close, else the TY_E* cause. */
void ty__rpc_conn_close(struct ty__rpc_conn *c, int reason);

/* Encode a tycho.v1.Error payload (malloc'd). */
int ty__rpc_error_pack(int code, const char *message, uint64_t id, uint8_t **out, size_t *len);

#endif
