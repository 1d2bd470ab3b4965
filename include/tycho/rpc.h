/* RPC: protobuf-c payloads in length-prefixed frames over libuv TCP (docs/arch/rpc.md).
 *
 * Four parts: a pure frame codec (no sockets, usable from any thread on its own objects), a
 * server (per-method handlers that reply once, stream items then end, or fail), a client
 * (request ids, per-call timeouts, streams, cancel, reconnect with capped exponential backoff)
 * and a mailbox to post work onto a loop from other threads.
 *
 * Threading: a server, a client and every call object belong to the uv_loop_t given at creation
 * and may only be used from the thread running that loop; ty_rpc_mailbox_post() is the one
 * function here that any thread may call. Callbacks run on the loop thread and are never invoked
 * from inside the function that started the operation, except where stated (cancel, close).
 * Ownership: payload pointers passed to callbacks are borrowed for the duration of the callback;
 * payloads passed to send functions are copied before they return.
 */
#ifndef TYCHO_RPC_H
#define TYCHO_RPC_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* ---- frame codec ------------------------------------------------------------------------ */

#define TY_RPC_MAGIC             0x50525954u /* bytes "TYRP" on the wire (little-endian u32) */
#define TY_RPC_VERSION           1
#define TY_RPC_HEADER_SIZE       20
#define TY_RPC_DEFAULT_MAX_FRAME (8u << 20)   /* max payload bytes unless configured */
#define TY_RPC_MAX_FRAME_LIMIT   (256u << 20) /* largest max_frame_size accepted */

enum ty_rpc_kind {
    TY_RPC_KIND_REQUEST = 1,     /* client -> server: start a call */
    TY_RPC_KIND_RESPONSE = 2,    /* server -> client: the one reply of a unary call */
    TY_RPC_KIND_STREAM_ITEM = 3, /* server -> client: one item of a streaming call */
    TY_RPC_KIND_STREAM_END = 4,  /* server -> client: a streaming call finished */
    TY_RPC_KIND_ERROR = 5,       /* server -> client: the call failed; payload tycho.v1.Error */
    TY_RPC_KIND_CANCEL = 6,      /* client -> server: abandon the call; empty payload */
};

/* One frame. `payload` is borrowed: from the decoder it stays valid until the next feed. */
struct ty_rpc_frame {
    enum ty_rpc_kind kind;
    uint16_t method;
    uint64_t request_id;
    uint32_t len;
    const uint8_t *payload;
};

/* Human-readable kind name ("request", ...); "?" for values outside the enum. */
const char *ty_rpc_kind_name(int kind);

/* Encode header + payload into `out` (capacity `cap`); *written gets the frame size.
 * Returns 0, TY_EINVAL for a kind outside the enum, or TY_EMSGSIZE when cap is too small. */
int ty_rpc_frame_encode(const struct ty_rpc_frame *f, uint8_t *out, size_t cap, size_t *written);

/* Incremental decoder: feed bytes as they arrive, get whole frames back. Errors are sticky:
 * after one, every feed returns the same code. Caller-owned struct; one thread at a time. */
struct ty_rpc_decoder {
    uint32_t max_payload;
    uint8_t hdr[TY_RPC_HEADER_SIZE];
    uint32_t hdr_have;
    bool have_hdr; /* hdr complete and validated; collecting the payload */
    struct ty_rpc_frame cur;
    uint8_t *buf; /* payload assembly buffer when a payload spans feeds */
    uint32_t buf_cap;
    uint32_t buf_have;
    int err;
    char reason[128];
};

/* Initialise with a max payload size (0 = TY_RPC_DEFAULT_MAX_FRAME). Returns 0 or TY_EINVAL
 * when max_payload > TY_RPC_MAX_FRAME_LIMIT. */
int ty_rpc_decoder_init(struct ty_rpc_decoder *d, uint32_t max_payload);
void ty_rpc_decoder_fini(struct ty_rpc_decoder *d);

/* Consume bytes from `data`. Returns 1 when a frame is complete (in *out; *consumed says how
 * many bytes were used, call again with the rest), 0 when all bytes were consumed without
 * completing a frame, or a negative error: TY_EPROTO bad magic, TY_ENOTSUP unsupported version,
 * TY_EBADMSG unknown kind, TY_EMSGSIZE payload longer than the maximum, TY_ENOMEM. */
int ty_rpc_decoder_feed(struct ty_rpc_decoder *d, const void *data, size_t len, size_t *consumed,
                        struct ty_rpc_frame *out);

/* End of input: 0 when the decoder sits at a frame boundary, TY_ENODATA for a truncated frame
 * (it becomes the sticky error), or the earlier sticky error. */
int ty_rpc_decoder_finish(struct ty_rpc_decoder *d);

/* Text of the last error ("bad magic 0x41414141", ...); "" when none. */
const char *ty_rpc_decoder_reason(const struct ty_rpc_decoder *d);

/* Pack a protobuf-c message into a new malloc'd buffer (*out, *len; *out is NULL for an empty
 * message). Returns 0 or TY_EMSGSIZE when the packed size exceeds TY_RPC_MAX_FRAME_LIMIT. */
int ty_rpc_pack(const ProtobufCMessage *msg, uint8_t **out, size_t *len);

/* ---- server ------------------------------------------------------------------------------ */

typedef struct ty_rpc_server ty_rpc_server_t;
typedef struct ty_rpc_call ty_rpc_call_t;

struct ty_auth;

/* Bounds on connections (docs/arch/security.md). A connection that has not finished the cluster
 * handshake is "unproven": it is closed after handshake_timeout_ms, and when max_unproven are
 * open the oldest one makes room for a new one (a flood of half-open connections cannot keep
 * the cluster's own peers out: theirs finish in a round trip). Proven ones count against
 * max_conns in all and max_conns_per_peer per peer address. */
struct ty_rpc_server_opts {
    uv_loop_t *loop;
    const char *host;        /* numeric IPv4/IPv6 address; NULL = "127.0.0.1" */
    uint16_t port;           /* 0 = an ephemeral port, see ty_rpc_server_port() */
    uint32_t max_frame_size; /* max payload bytes accepted; 0 = TY_RPC_DEFAULT_MAX_FRAME */
    int backlog;             /* listen backlog; 0 = 511 */
    const struct ty_auth *auth;     /* borrowed, outlives the server; NULL: insecure */
    uint32_t max_conns;             /* 0 = 4096 (and at most the descriptor limit - 64) */
    uint32_t max_conns_per_peer;    /* 0 = 1024 */
    uint32_t max_unproven;          /* 0 = 256 */
    uint32_t handshake_timeout_ms;  /* 0 = TY_AUTH_TIMEOUT_MS */
    uint32_t idle_timeout_ms;       /* proven connections silent this long close; 0 = never */
};

/* What a server turned away, for a daemon's /metrics. */
struct ty_rpc_server_stats {
    uint32_t conns;           /* open now, proven or not */
    uint32_t unproven;        /* of them, still in the handshake */
    uint64_t accepted;        /* connections accepted in all */
    uint64_t auth_failures;   /* handshakes refused or timed out */
    uint64_t refused;         /* over max_conns / max_conns_per_peer, or evicted unproven */
    uint64_t idle_closed;     /* proven connections closed by idle_timeout_ms */
};

/* Handler for one method. `payload` is borrowed for the call's duration. The handler owns `call`
 * until it ends it with exactly one of ty_rpc_call_reply*, ty_rpc_call_end or ty_rpc_call_fail,
 * now or later from the loop thread; after that the pointer is invalid. */
typedef void (*ty_rpc_handler_cb)(ty_rpc_call_t *call, const uint8_t *payload, size_t len,
                                  void *arg);

/* Called once when the client cancels the call (reason TY_ECANCELED) or its connection closes
 * (TY_ECONNRESET, TY_ESHUTDOWN on server close, or the protocol error that closed it). The call
 * must still be ended; sends after this return TY_ENOTCONN. */
typedef void (*ty_rpc_cancel_cb)(ty_rpc_call_t *call, int reason, void *arg);

typedef void (*ty_rpc_closed_cb)(void *arg);

/* Create a server listening on host:port. Returns 0, TY_EINVAL (bad options/address), or the
 * bind/listen error (TY_EADDRINUSE, ...); after a bind/listen error the half-made server is
 * freed by the loop's next iteration. Loop thread only. */
int ty_rpc_server_new(ty_rpc_server_t **out, const struct ty_rpc_server_opts *opts);

/* Register (or replace) the handler of `method`. Returns 0 or TY_EINVAL for method 0. */
int ty_rpc_server_handle(ty_rpc_server_t *s, uint16_t method, ty_rpc_handler_cb cb, void *arg);

/* Handler of one decoded request. `msg` is the request unpacked with the descriptor given to
 * ty_rpc_server_handle_msg (assign it to a pointer of that message type). It is the server's:
 * it stays valid until the call ends and is freed then, so a handler that answers later may
 * keep it until it does. The handler owns `call` as a ty_rpc_handler_cb does. */
typedef void (*ty_rpc_msg_cb)(ty_rpc_call_t *call, const void *msg, void *arg);

/* Register (or replace) the handler of `method` for requests of message type `desc`: the server
 * unpacks each request and hands it to `cb`; a payload that does not decode is answered with an
 * error frame (TY_EBADMSG, "undecodable <short name of desc>") and never reaches cb. A handler
 * is then one registration line plus its logic:
 *     ty_rpc_server_handle_msg(srv, METHOD_X, &tycho__v1__x__descriptor, on_x, ctx);
 *     static void on_x(ty_rpc_call_t *call, const void *msg, void *arg)
 *     { const Tycho__V1__X *m = msg; ...; ty_rpc_call_reply_msg(call, &reply.base); }
 * Returns 0 or TY_EINVAL (method 0, no desc or cb). */
int ty_rpc_server_handle_msg(ty_rpc_server_t *s, uint16_t method,
                             const ProtobufCMessageDescriptor *desc, ty_rpc_msg_cb cb, void *arg);

/* The bound port (the ephemeral one when opts.port was 0). */
uint16_t ty_rpc_server_port(const ty_rpc_server_t *s);

void ty_rpc_server_stats(const ty_rpc_server_t *s, struct ty_rpc_server_stats *out);

/* Stop listening, close every connection (their calls get their cancel callbacks) and free the
 * server once all handles are closed; then `cb(arg)` runs (cb may be NULL). */
void ty_rpc_server_close(ty_rpc_server_t *s, ty_rpc_closed_cb cb, void *arg);

void ty_rpc_call_set_cancel_cb(ty_rpc_call_t *call, ty_rpc_cancel_cb cb, void *arg);

/* Terminal: send the one response and end the call. 0, or TY_ENOTCONN when the connection is
 * gone or the call was canceled (the call still ends), TY_EINVAL after a stream item. The _msg
 * form packs a protobuf-c message (`&reply.base`); one too large for a frame fails the call
 * (TY_EMSGSIZE) instead, so the client is still answered. */
int ty_rpc_call_reply(ty_rpc_call_t *call, const uint8_t *payload, size_t len);
int ty_rpc_call_reply_msg(ty_rpc_call_t *call, const ProtobufCMessage *msg);

/* Non-terminal: send one stream item. 0 or TY_ENOTCONN (the call stays open: end it). */
int ty_rpc_call_stream(ty_rpc_call_t *call, const uint8_t *payload, size_t len);
int ty_rpc_call_stream_msg(ty_rpc_call_t *call, const ProtobufCMessage *msg);

/* Terminal: end a stream (after zero or more items). 0 or TY_ENOTCONN. */
int ty_rpc_call_end(ty_rpc_call_t *call);

/* Terminal: fail the call with a TY_E* code and a message (tycho.v1.Error payload). */
int ty_rpc_call_fail(ty_rpc_call_t *call, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- client ------------------------------------------------------------------------------ */

typedef struct ty_rpc_client ty_rpc_client_t;

enum ty_rpc_event {
    TY_RPC_EVENT_REPLY = 1, /* unary call succeeded (final) */
    TY_RPC_EVENT_ITEM = 2,  /* one stream item (not final) */
    TY_RPC_EVENT_END = 3,   /* stream finished (final) */
    TY_RPC_EVENT_ERROR = 4, /* call failed (final); see status */
};

/* What a call's callback receives; everything is borrowed for the callback's duration.
 * status on ERROR: TY_ETIMEDOUT (deadline passed), TY_ECONNRESET (connection dropped after the
 * call was sent), TY_ECANCELED (the client closed), TY_EREMOTE (the server
 * failed it: remote_code / message), TY_EPROTO (the server answered with the wrong kind). */
struct ty_rpc_result {
    uint64_t request_id;
    enum ty_rpc_event event;
    int status;
    const uint8_t *payload;
    size_t len;
    int remote_code;
    const char *message; /* "" unless an error */
};

/* Every call sees zero or more ITEM events (streaming calls only), then exactly one final
 * event (REPLY, END or ERROR). */
typedef void (*ty_rpc_result_cb)(const struct ty_rpc_result *res, void *arg);

/* connected: true after a connect succeeded, false when the connection dropped. */
typedef void (*ty_rpc_state_cb)(ty_rpc_client_t *c, bool connected, int reason, void *arg);

struct ty_rpc_client_opts {
    uv_loop_t *loop;
    const char *host; /* numeric address or a host name (resolved once, blocking) */
    uint16_t port;
    uint32_t max_frame_size;     /* 0 = TY_RPC_DEFAULT_MAX_FRAME */
    uint32_t call_timeout_ms;    /* default per-call timeout; 0 = 30000 */
    uint32_t connect_timeout_ms; /* 0 = 5000 */
    uint32_t backoff_initial_ms; /* first reconnect delay; 0 = 50 */
    uint32_t backoff_max_ms;     /* cap of the doubling delay; 0 = 5000 */
    ty_rpc_state_cb state_cb;    /* optional */
    void *state_arg;
    const struct ty_auth *auth;  /* borrowed, outlives the client; NULL: insecure. The client
                                  * counts as connected once the server proved itself. */
};

struct ty_rpc_call_opts {
    uint32_t timeout_ms; /* 0 = the client's call_timeout_ms */
    bool stream;         /* expect ITEM* END instead of one REPLY */
};

struct ty_rpc_client_stats {
    uint64_t connect_attempts;
    uint64_t connects; /* successful connects */
    uint64_t disconnects;
    uint64_t calls_started;
    uint64_t calls_timed_out;
    uint64_t calls_failed; /* any final ERROR */
    uint64_t stray_frames; /* replies for unknown or finished request ids (ignored) */
    uint32_t last_backoff_ms;
};

/* Create a client and start connecting. Calls made before the connection is up are queued and
 * sent when it is (their timeout runs meanwhile). Returns 0 or TY_EINVAL / TY_ENOTFOUND. */
int ty_rpc_client_new(ty_rpc_client_t **out, const struct ty_rpc_client_opts *opts);

/* Start a call. On 0, `cb` will run later with the call's events and *out_id (optional) gets the
 * request id. On error (TY_EMSGSIZE payload too large, TY_ESHUTDOWN client closing, TY_EINVAL)
 * nothing is started and cb never runs. */
int ty_rpc_client_call(ty_rpc_client_t *c, uint16_t method, const uint8_t *payload, size_t len,
                       const struct ty_rpc_call_opts *opts, ty_rpc_result_cb cb, void *arg,
                       uint64_t *out_id);
int ty_rpc_client_call_msg(ty_rpc_client_t *c, uint16_t method, const ProtobufCMessage *msg,
                           const struct ty_rpc_call_opts *opts, ty_rpc_result_cb cb, void *arg,
                           uint64_t *out_id);

bool ty_rpc_client_is_connected(const ty_rpc_client_t *c);
size_t ty_rpc_client_pending(const ty_rpc_client_t *c);
void ty_rpc_client_stats(const ty_rpc_client_t *c, struct ty_rpc_client_stats *out);

/* Complete every pending call with TY_ECANCELED (before returning), close the connection and
 * free the client once its handles are closed; then `cb(arg)` runs (cb may be NULL). */
void ty_rpc_client_close(ty_rpc_client_t *c, ty_rpc_closed_cb cb, void *arg);

/* ---- mailbox: post work onto a loop from any thread -------------------------------------- */

typedef struct ty_rpc_mailbox ty_rpc_mailbox_t;
typedef void (*ty_rpc_work_cb)(void *arg);

/* Create a mailbox bound to `loop` (loop thread only). */
int ty_rpc_mailbox_new(ty_rpc_mailbox_t **out, uv_loop_t *loop);

/* Any thread: queue fn(arg) to run on the loop thread, in posting order. Returns 0, or
 * TY_ESHUTDOWN once close has started (fn will not run). */
int ty_rpc_mailbox_post(ty_rpc_mailbox_t *mb, ty_rpc_work_cb fn, void *arg);

/* Loop thread: stop accepting posts, run every queued item, then free the mailbox and run
 * `cb(arg)` (may be NULL). Other threads may keep calling post (getting TY_ESHUTDOWN) until
 * close is called, but must be stopped or joined before cb runs: the memory is gone then. */
void ty_rpc_mailbox_close(ty_rpc_mailbox_t *mb, ty_rpc_closed_cb cb, void *arg);

#endif
