/* RPC server: accepts connections, routes request frames to per-method handlers, tracks the
 * open calls of each connection so cancel frames and connection loss reach them. Loop thread
 * only (rpc.h). */
#include "rpc-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/u64map.h"
#include "tycho/xxh3.h"

#include <malloc.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A method's handler: raw payloads (cb), or messages unpacked with desc (msg_cb). */
struct handler {
    uint16_t method;
    ty_rpc_handler_cb cb;
    const ProtobufCMessageDescriptor *desc;
    ty_rpc_msg_cb msg_cb;
    void *arg;
};

struct srv_conn {
    struct ty__rpc_conn conn; /* first: conn pointers convert to srv_conn */
    ty_rpc_server_t *srv;
    struct srv_conn *prev, *next;
    struct srv_conn *up_prev, *up_next; /* the unproven FIFO, oldest first, while unproven */
    bool unproven;
    bool counted; /* in the per-peer count */
    uint64_t peer_key;
    uint64_t accepted_ms;
    ty_rpc_call_t *calls; /* open calls, doubly linked */
};

struct ty_rpc_call {
    struct srv_conn *sc; /* NULL once the connection is gone */
    uint64_t id;
    uint16_t method;
    bool canceled;
    bool cancel_notified;
    bool streamed;
    ty_rpc_cancel_cb cancel_cb;
    void *cancel_arg;
    ProtobufCMessage *msg; /* the unpacked request of a msg_cb handler, freed when the call ends */
    ty_rpc_call_t *prev, *next;
};

struct ty_rpc_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uint32_t max_frame;
    uint16_t port;
    struct handler *handlers;
    size_t n_handlers;
    struct srv_conn *conns;
    struct srv_conn *up_head, *up_tail;
    const struct ty_auth *auth;
    uint32_t max_conns, max_per_peer, max_unproven, handshake_ms, idle_ms;
    struct ty_u64map per_peer; /* peer address -> proven connections */
    uv_timer_t sweep;          /* closes timed-out handshakes and idle connections */
    struct ty_rpc_server_stats st;
    uint64_t trim_accepted; /* st.accepted at the last trim */
    uint64_t trim_ms;       /* uv_now() of the last trim */
    bool closing;
    int open_handles; /* listener + connections not yet closed */
    ty_rpc_closed_cb close_cb;
    void *close_arg;
};

/* ---- calls ---------------------------------------------------------------------------- */

static void call_unlink(ty_rpc_call_t *call)
{
    struct srv_conn *sc = call->sc;
    if (!sc)
        return;
    if (call->prev)
        call->prev->next = call->next;
    else
        sc->calls = call->next;
    if (call->next)
        call->next->prev = call->prev;
    call->prev = call->next = NULL;
    call->sc = NULL;
}

static void call_finish(ty_rpc_call_t *call)
{
    call_unlink(call);
    if (call->msg)
        protobuf_c_message_free_unpacked(call->msg, NULL);
    free(call);
}

static void call_notify_cancel(ty_rpc_call_t *call, int reason)
{
    call->canceled = true;
    if (call->cancel_notified)
        return;
    call->cancel_notified = true;
    if (call->cancel_cb)
        call->cancel_cb(call, reason, call->cancel_arg);
}

void ty_rpc_call_set_cancel_cb(ty_rpc_call_t *call, ty_rpc_cancel_cb cb, void *arg)
{
    call->cancel_cb = cb;
    call->cancel_arg = arg;
}

static int call_send(ty_rpc_call_t *call, enum ty_rpc_kind kind, const uint8_t *p, size_t len)
{
    if (!call->sc || call->canceled)
        return TY_ENOTCONN;
    return ty__rpc_conn_send(&call->sc->conn, kind, call->method, call->id, p, len);
}

int ty_rpc_call_reply(ty_rpc_call_t *call, const uint8_t *payload, size_t len)
{
    int rc = call->streamed ? TY_EINVAL : call_send(call, TY_RPC_KIND_RESPONSE, payload, len);
    call_finish(call);
    return rc;
}

int ty_rpc_call_reply_msg(ty_rpc_call_t *call, const ProtobufCMessage *msg)
{
    uint8_t *buf;
    size_t len;
    int rc = ty_rpc_pack(msg, &buf, &len);
    if (rc < 0) {
        /* still answer exactly once, so the client does not wait for its timeout */
        return ty_rpc_call_fail(call, rc, "reply does not fit in a frame");
    }
    rc = ty_rpc_call_reply(call, buf, len);
    free(buf);
    return rc;
}

int ty_rpc_call_stream(ty_rpc_call_t *call, const uint8_t *payload, size_t len)
{
    call->streamed = true;
    return call_send(call, TY_RPC_KIND_STREAM_ITEM, payload, len);
}

int ty_rpc_call_stream_msg(ty_rpc_call_t *call, const ProtobufCMessage *msg)
{
    uint8_t *buf;
    size_t len;
    int rc = ty_rpc_pack(msg, &buf, &len);
    if (rc < 0)
        return rc;
    rc = ty_rpc_call_stream(call, buf, len);
    free(buf);
    return rc;
}

int ty_rpc_call_end(ty_rpc_call_t *call)
{
    int rc = call_send(call, TY_RPC_KIND_STREAM_END, NULL, 0);
    call_finish(call);
    return rc;
}

static int send_error(struct ty__rpc_conn *c, uint16_t method, uint64_t id, int code,
                      const char *msg)
{
    uint8_t *buf;
    size_t len;
    int rc = ty__rpc_error_pack(code, msg, id, &buf, &len);
    if (rc < 0)
        return rc;
    rc = ty__rpc_conn_send(c, TY_RPC_KIND_ERROR, method, id, buf, len);
    free(buf);
    return rc;
}

int ty_rpc_call_fail(ty_rpc_call_t *call, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    int rc = TY_ENOTCONN;
    if (call->sc && !call->canceled)
        rc = send_error(&call->sc->conn, call->method, call->id, code, msg);
    call_finish(call);
    return rc;
}

/* ---- connections ---------------------------------------------------------------------- */

static const struct handler *find_handler(const ty_rpc_server_t *s, uint16_t method)
{
    for (size_t i = 0; i < s->n_handlers; i++)
        if (s->handlers[i].method == method)
            return &s->handlers[i];
    return NULL;
}

static void on_request(struct srv_conn *sc, const struct ty_rpc_frame *f)
{
    const struct handler *h = find_handler(sc->srv, f->method);
    if (!h) {
        send_error(&sc->conn, f->method, f->request_id, TY_ENOSYS, "no handler for method");
        return;
    }
    ProtobufCMessage *msg = NULL;
    if (h->desc) {
        msg = protobuf_c_message_unpack(h->desc, NULL, f->len, f->payload);
        if (!msg) {
            char why[160];
            snprintf(why, sizeof(why), "undecodable %s", h->desc->short_name);
            send_error(&sc->conn, f->method, f->request_id, TY_EBADMSG, why);
            return;
        }
    }
    ty_rpc_call_t *call = calloc(1, sizeof(*call));
    TY_ASSERT(call); /* small metadata: abort on OOM (STYLE.md) */
    call->sc = sc;
    call->id = f->request_id;
    call->method = f->method;
    call->msg = msg;
    call->next = sc->calls;
    if (sc->calls)
        sc->calls->prev = call;
    sc->calls = call;
    if (msg)
        h->msg_cb(call, msg, h->arg);
    else
        h->cb(call, f->payload, f->len, h->arg);
}

static void on_cancel_frame(struct srv_conn *sc, uint64_t id)
{
    for (ty_rpc_call_t *call = sc->calls; call; call = call->next) {
        if (call->id == id) {
            call_notify_cancel(call, TY_ECANCELED);
            return;
        }
    }
}

static void srv_on_frame(struct ty__rpc_conn *c, const struct ty_rpc_frame *f)
{
    struct srv_conn *sc = (struct srv_conn *)c;
    switch (f->kind) {
    case TY_RPC_KIND_REQUEST:
        on_request(sc, f);
        return;
    case TY_RPC_KIND_CANCEL:
        on_cancel_frame(sc, f->request_id);
        return;
    default:
        TY_LOG_WARN("rpc", "server: closing connection %s: unexpected %s frame from a client",
                    c->peer, ty_rpc_kind_name(f->kind));
        ty__rpc_conn_close(c, TY_EPROTO);
    }
}

static void unproven_unlink(ty_rpc_server_t *s, struct srv_conn *sc);

static void srv_on_closing(struct ty__rpc_conn *c, int reason)
{
    struct srv_conn *sc = (struct srv_conn *)c;
    if (reason == TY_EACCES)
        sc->srv->st.auth_failures++;
    unproven_unlink(sc->srv, sc); /* closing: it holds no unproven place any more */
    while (sc->calls) {
        ty_rpc_call_t *call = sc->calls;
        call_unlink(call);
        call_notify_cancel(call, reason ? reason : TY_ECONNRESET);
    }
}

static void maybe_finish_close(ty_rpc_server_t *s)
{
    if (!s->closing || s->open_handles > 0)
        return;
    ty_rpc_closed_cb cb = s->close_cb;
    void *arg = s->close_arg;
    ty_u64map_fini(&s->per_peer);
    free(s->handlers);
    free(s);
    if (cb)
        cb(arg);
}

static void unproven_unlink(ty_rpc_server_t *s, struct srv_conn *sc)
{
    if (!sc->unproven)
        return;
    if (sc->up_prev)
        sc->up_prev->up_next = sc->up_next;
    else
        s->up_head = sc->up_next;
    if (sc->up_next)
        sc->up_next->up_prev = sc->up_prev;
    else
        s->up_tail = sc->up_prev;
    sc->up_prev = sc->up_next = NULL;
    sc->unproven = false;
    s->st.unproven--;
}

/* The per-peer count's key: the peer's address (the port left out). */
static uint64_t peer_key_of(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return (1ull << 32) | ((const struct sockaddr_in *)ss)->sin_addr.s_addr;
    if (ss->ss_family == AF_INET6)
        return XXH3_64bits(&((const struct sockaddr_in6 *)ss)->sin6_addr, 16) | (1ull << 63);
    return 0;
}

static void peer_uncount(ty_rpc_server_t *s, struct srv_conn *sc)
{
    if (!sc->counted)
        return;
    uint32_t *n = ty_u64map_get(&s->per_peer, sc->peer_key);
    if (n && --*n == 0)
        ty_u64map_del(&s->per_peer, sc->peer_key);
    sc->counted = false;
}

/* The handshake succeeded: the connection leaves the unproven FIFO and counts for its peer. */
static void srv_on_authed(struct ty__rpc_conn *c, int reason)
{
    struct srv_conn *sc = (struct srv_conn *)c;
    ty_rpc_server_t *s = sc->srv;
    (void)reason;
    unproven_unlink(s, sc);
    sc->peer_key = peer_key_of(&c->peer_addr);
    uint32_t *n = ty_u64map_get(&s->per_peer, sc->peer_key);
    if (n && *n >= s->max_per_peer) {
        s->st.refused++;
        TY_LOG_WARN("rpc", "server: closing connection %s: its address has %u open (the most "
                    "one peer may have)", c->peer, *n);
        ty__rpc_conn_close(c, TY_EMFILE);
        return;
    }
    ty_u64map_put(&s->per_peer, sc->peer_key, n ? *n + 1 : 1);
    sc->counted = true;
}

static void srv_on_closed(struct ty__rpc_conn *c, int reason)
{
    struct srv_conn *sc = (struct srv_conn *)c;
    ty_rpc_server_t *s = sc->srv;
    unproven_unlink(s, sc);
    peer_uncount(s, sc);
    s->st.conns--;
    if (sc->prev)
        sc->prev->next = sc->next;
    else
        s->conns = sc->next;
    if (sc->next)
        sc->next->prev = sc->prev;
    s->open_handles--;
    free(sc);
    maybe_finish_close(s);
}


static void unproven_push(ty_rpc_server_t *s, struct srv_conn *sc)
{
    sc->unproven = true;
    sc->up_prev = s->up_tail;
    if (s->up_tail)
        s->up_tail->up_next = sc;
    else
        s->up_head = sc;
    s->up_tail = sc;
    s->st.unproven++;
}

/* Drop the oldest unproven connection (it is closing, so it leaves the FIFO now). */
static void evict_oldest_unproven(ty_rpc_server_t *s, const char *why)
{
    struct srv_conn *old = s->up_head;
    unproven_unlink(s, old);
    s->st.refused++;
    s->st.auth_failures++;
    ty_auth_count_failure();
    TY_LOG_WARN("rpc", "server: dropping connection %s: %s", old->conn.peer, why);
    ty__rpc_conn_close(&old->conn, TY_ETIMEDOUT);
}

/* Before a new connection starts: false when it must be refused. The new one is already
 * counted in st.conns (and is not in the unproven FIFO yet). */
static bool make_room(ty_rpc_server_t *s)
{
    if (s->st.unproven >= s->max_unproven && s->up_head)
        evict_oldest_unproven(s, "unproven connections are at their cap; the oldest goes");
    if (s->st.conns <= s->max_conns)
        return true;
    if (s->up_head) {
        evict_oldest_unproven(s, "connections are at their cap; the oldest unproven goes");
        return true;
    }
    return false;
}

/* Every second: close handshakes past their deadline and proven connections idle too long. */
static void on_sweep(uv_timer_t *t)
{
    ty_rpc_server_t *s = t->data;
    uint64_t now = uv_now(s->loop);
    while (s->up_head && now - s->up_head->accepted_ms >= s->handshake_ms)
        evict_oldest_unproven(s, "no cluster handshake in time");
    /* A burst of connections (a flood, a reconnect storm) is over: give the heap pages their
     * small allocations left free back to the system, or the RSS would keep the peak. */
    if (s->st.accepted - s->trim_accepted >= 64 && s->st.unproven == 0 &&
        now - s->trim_ms >= 10000) { /* trim walks every arena under its lock: rarely */
        s->trim_ms = now;
        malloc_trim(0);
        s->trim_accepted = s->st.accepted;
    }
    if (!s->idle_ms)
        return;
    for (struct srv_conn *sc = s->conns; sc; sc = sc->next) {
        if (sc->conn.authed && !sc->conn.closing && !sc->calls &&
            now - sc->conn.last_active_ms >= s->idle_ms) {
            s->st.idle_closed++;
            TY_LOG_INFO("rpc", "server: closing idle connection %s", sc->conn.peer);
            ty__rpc_conn_close(&sc->conn, TY_ETIMEDOUT);
        }
    }
}

static void on_connection(uv_stream_t *listener, int status)
{
    ty_rpc_server_t *s = listener->data;
    if (status < 0) {
        TY_LOG_WARN("rpc", "server: accept failed: %s", ty_strerror(status));
        return;
    }
    struct srv_conn *sc = calloc(1, sizeof(*sc));
    TY_ASSERT(sc);
    if (ty__rpc_conn_init(&sc->conn, s->loop, s->max_frame, "server") < 0) {
        free(sc);
        return;
    }
    sc->srv = s;
    sc->conn.on_frame = srv_on_frame;
    sc->conn.on_closing = srv_on_closing;
    sc->conn.on_closed = srv_on_closed;
    sc->conn.on_authed = srv_on_authed;
    sc->conn.auth = s->auth;
    sc->accepted_ms = uv_now(s->loop);
    sc->next = s->conns;
    if (s->conns)
        s->conns->prev = sc;
    s->conns = sc;
    s->open_handles++;
    s->st.conns++;
    s->st.accepted++;
    int rc = uv_accept(listener, (uv_stream_t *)&sc->conn.tcp);
    if (rc == 0 && !make_room(s)) {
        s->st.refused++;
        TY_LOG_WARN("rpc", "server: refusing a connection: %u open, the most allowed",
                    s->max_conns);
        rc = TY_EMFILE;
    }
    if (rc == 0) {
        unproven_push(s, sc);
        uv_tcp_keepalive(&sc->conn.tcp, 1, 30);
        rc = ty__rpc_conn_start(&sc->conn);
    }
    if (rc < 0) {
        if (rc != TY_EMFILE)
            TY_LOG_WARN("rpc", "server: cannot start connection: %s", ty_strerror(rc));
        ty__rpc_conn_close(&sc->conn, rc);
    }
}

/* ---- server lifecycle ------------------------------------------------------------------ */

static int parse_addr(const char *host, uint16_t port, struct sockaddr_storage *ss)
{
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0)
        return 0;
    if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0)
        return 0;
    return TY_EINVAL;
}

static void on_listener_closed(uv_handle_t *h)
{
    ty_rpc_server_t *s = h->data;
    s->open_handles--;
    maybe_finish_close(s);
}

static int bind_and_listen(ty_rpc_server_t *s, const struct sockaddr_storage *ss, int backlog)
{
    int rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, backlog, on_connection);
    if (rc < 0)
        return rc;
    struct sockaddr_storage bound;
    int n = sizeof(bound);
    rc = uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &n);
    if (rc < 0)
        return rc;
    s->port = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                               : ((struct sockaddr_in6 *)&bound)->sin6_port);
    return 0;
}

static void copy_limits(ty_rpc_server_t *s, const struct ty_rpc_server_opts *o)
{
    s->auth = o->auth;
    s->max_conns = o->max_conns ? o->max_conns : 4096;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur > 128 && s->max_conns > rl.rlim_cur - 64)
        s->max_conns = (uint32_t)(rl.rlim_cur - 64); /* leave the process room for files */
    s->max_per_peer = o->max_conns_per_peer ? o->max_conns_per_peer : 1024;
    s->max_unproven = o->max_unproven ? o->max_unproven : 256;
    s->handshake_ms = o->handshake_timeout_ms ? o->handshake_timeout_ms : TY_AUTH_TIMEOUT_MS;
    s->idle_ms = o->idle_timeout_ms;
    ty_u64map_init(&s->per_peer);
}

int ty_rpc_server_new(ty_rpc_server_t **out, const struct ty_rpc_server_opts *opts)
{
    struct sockaddr_storage ss;
    const char *host = opts->host ? opts->host : "127.0.0.1";
    if (!opts->loop || opts->max_frame_size > TY_RPC_MAX_FRAME_LIMIT)
        return TY_EINVAL;
    if (parse_addr(host, opts->port, &ss) < 0) {
        TY_LOG_ERROR("rpc", "server: '%s' is not a numeric IPv4/IPv6 address", host);
        return TY_EINVAL;
    }
    ty_rpc_server_t *s = calloc(1, sizeof(*s));
    TY_ASSERT(s);
    s->loop = opts->loop;
    s->max_frame = opts->max_frame_size ? opts->max_frame_size : TY_RPC_DEFAULT_MAX_FRAME;
    int rc = uv_tcp_init(s->loop, &s->listener);
    if (rc < 0) {
        free(s);
        return rc;
    }
    s->listener.data = s;
    s->open_handles = 1;
    copy_limits(s, opts);
    uv_timer_init(s->loop, &s->sweep);
    s->sweep.data = s;
    s->open_handles++;
    uv_timer_start(&s->sweep, on_sweep, 1000, 1000);
    uv_unref((uv_handle_t *)&s->sweep);
    rc = bind_and_listen(s, &ss, opts->backlog > 0 ? opts->backlog : 511);
    if (rc < 0) {
        TY_LOG_ERROR("rpc", "server: cannot listen on %s:%u: %s", host, opts->port,
                     ty_strerror(rc));
        ty_rpc_server_close(s, NULL, NULL); /* freed on the next loop iteration */
        return rc;
    }
    *out = s;
    return 0;
}

static void handler_set(ty_rpc_server_t *s, const struct handler *h)
{
    for (size_t i = 0; i < s->n_handlers; i++) {
        if (s->handlers[i].method == h->method) {
            s->handlers[i] = *h;
            return;
        }
    }
    struct handler *nh = realloc(s->handlers, (s->n_handlers + 1) * sizeof(*nh));
    TY_ASSERT(nh);
    s->handlers = nh;
    s->handlers[s->n_handlers++] = *h;
}

int ty_rpc_server_handle(ty_rpc_server_t *s, uint16_t method, ty_rpc_handler_cb cb, void *arg)
{
    if (method == 0 || !cb)
        return TY_EINVAL;
    handler_set(s, &(struct handler){.method = method, .cb = cb, .arg = arg});
    return 0;
}

int ty_rpc_server_handle_msg(ty_rpc_server_t *s, uint16_t method,
                             const ProtobufCMessageDescriptor *desc, ty_rpc_msg_cb cb, void *arg)
{
    if (method == 0 || !desc || !cb)
        return TY_EINVAL;
    handler_set(s, &(struct handler){.method = method, .desc = desc, .msg_cb = cb, .arg = arg});
    return 0;
}

uint16_t ty_rpc_server_port(const ty_rpc_server_t *s)
{
    return s->port;
}

void ty_rpc_server_stats(const ty_rpc_server_t *s, struct ty_rpc_server_stats *out)
{
    *out = s->st;
}

void ty_rpc_server_close(ty_rpc_server_t *s, ty_rpc_closed_cb cb, void *arg)
{
    if (s->closing)
        return;
    s->closing = true;
    s->close_cb = cb;
    s->close_arg = arg;
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
    uv_close((uv_handle_t *)&s->sweep, on_listener_closed);
    for (struct srv_conn *sc = s->conns; sc; sc = sc->next)
        ty__rpc_conn_close(&sc->conn, TY_ESHUTDOWN);
}
