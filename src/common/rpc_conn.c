/* One framed TCP connection (see rpc-impl.h): read -> decode -> dispatch, frame writes, close
 * on EOF / errors / malformed input. */
#include "rpc-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho.pb-c.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wreq {
    uv_write_t req;
    struct ty__rpc_conn *conn;
    uint8_t *data;
    bool close_after; /* a handshake REJECT: close once it is out */
};

/* Reads land here and are decoded before the read callback returns (the decoder copies what a
 * frame still needs), so one buffer serves every connection of this thread's loops. */
static _Thread_local uint8_t read_buf[TY__RPC_READ_BUF];

int ty__rpc_conn_init(struct ty__rpc_conn *c, uv_loop_t *loop, uint32_t max_frame, const char *role)
{
    int rc = ty_rpc_decoder_init(&c->dec, max_frame);
    if (rc < 0)
        return rc;
    rc = uv_tcp_init(loop, &c->tcp);
    if (rc < 0) {
        ty_rpc_decoder_fini(&c->dec);
        return rc;
    }
    c->tcp.data = c;
    c->role = role;
    c->reading = false;
    c->closing = false;
    c->authed = false;
    c->close_reason = 0;
    c->on_authed = NULL;
    c->auth = NULL;
    c->hs = NULL;
    c->peer_addr.ss_family = 0;
    c->last_active_ms = uv_now(loop);
    snprintf(c->peer, sizeof(c->peer), "?");
    return 0;
}

static void record_peer(struct ty__rpc_conn *c)
{
    struct sockaddr_storage ss;
    int n = sizeof(ss);
    char host[48] = "?";
    int port = 0;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &n) != 0)
        return;
    c->peer_addr = ss;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        uv_ip4_name(a, host, sizeof(host));
        port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        uv_ip6_name(a, host, sizeof(host));
        port = ntohs(a->sin6_port);
    }
    snprintf(c->peer, sizeof(c->peer), "%s:%d", host, port);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    buf->base = (char *)read_buf;
    buf->len = sizeof(read_buf);
}

static void on_write(uv_write_t *req, int status);

/* Queue `buf` (malloc'd); on 0 the write owns it and frees it once written, then closes the
 * connection when close_after. On error the caller still owns it. */
static int write_owned(struct ty__rpc_conn *c, uint8_t *buf, size_t len, bool close_after)
{
    struct wreq *w = malloc(sizeof(*w));
    if (!w)
        return TY_ENOMEM;
    w->conn = c;
    w->data = buf;
    w->close_after = close_after;
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write);
    if (rc < 0)
        free(w);
    return rc;
}

/* Queue raw handshake bytes (copied). */
static int send_raw(struct ty__rpc_conn *c, const uint8_t *p, size_t len, bool close_after)
{
    uint8_t *copy = malloc(len);
    if (!copy)
        return TY_ENOMEM;
    memcpy(copy, p, len);
    int rc = write_owned(c, copy, len, close_after);
    if (rc < 0)
        free(copy);
    return rc;
}

/* Feed handshake bytes; returns how many it used, or SIZE_MAX when the connection is done for. */
static size_t handshake(struct ty__rpc_conn *c, const uint8_t *data, size_t n)
{
    size_t used = 0;
    int st = ty_auth_hs_feed(c->hs, data, n, &used);
    if (st == TY_AUTH_HS_FAILED) {
        ty_auth_count_failure();
        TY_LOG_WARN("rpc", "%s: dropping connection %s: cluster authentication failed: %s",
                    c->role, c->peer, c->hs->why);
        bool rejecting = c->hs->out_len > 0 && c->reading;
        if (rejecting) {
            uv_read_stop((uv_stream_t *)&c->tcp);
            c->reading = false;
        }
        if (!rejecting || send_raw(c, c->hs->out, c->hs->out_len, true) < 0)
            ty__rpc_conn_close(c, TY_EACCES);
        c->hs->out_len = 0;
        return SIZE_MAX;
    }
    if (st == TY_AUTH_HS_DONE) {
        /* the owner admits the peer first (a server over its caps closes it): the ACCEPT goes
         * out only to a peer that is kept, so a refused client sees no connected state */
        c->authed = true;
        if (c->on_authed)
            c->on_authed(c, 0);
        if (c->closing)
            return SIZE_MAX;
    }
    if (c->hs->out_len && send_raw(c, c->hs->out, c->hs->out_len, false) < 0) {
        ty__rpc_conn_close(c, TY_ENOMEM);
        return SIZE_MAX;
    }
    c->hs->out_len = 0;
    if (st == TY_AUTH_HS_DONE) {
        free(c->hs);
        c->hs = NULL;
    }
    return used;
}

static void dispatch(struct ty__rpc_conn *c, const uint8_t *data, size_t n)
{
    size_t off = 0;
    if (!c->authed) {
        if (!c->hs)
            return; /* failed: closing */
        off = handshake(c, data, n);
        if (off == SIZE_MAX || !c->authed)
            return;
    }
    while (off < n && !c->closing) {
        struct ty_rpc_frame f;
        size_t used = 0;
        int rc = ty_rpc_decoder_feed(&c->dec, data + off, n - off, &used, &f);
        off += used;
        if (rc == 1) {
            c->on_frame(c, &f);
            continue;
        }
        if (rc == 0)
            break;
        TY_LOG_WARN("rpc", "%s: closing connection %s: %s (%s)", c->role, c->peer,
                    ty_rpc_decoder_reason(&c->dec), ty_err_name(rc));
        ty__rpc_conn_close(c, rc);
    }
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct ty__rpc_conn *c = s->data;
    if (c->closing)
        return;
    if (n > 0) {
        c->last_active_ms = uv_now(c->tcp.loop);
        dispatch(c, (const uint8_t *)buf->base, (size_t)n);
        return;
    }
    if (n == 0)
        return; /* EAGAIN */
    if (n == UV_EOF && !c->authed) {
        TY_LOG_INFO("rpc", "%s: connection %s closed before it authenticated", c->role, c->peer);
        ty__rpc_conn_close(c, TY_ECONNRESET);
        return;
    }
    if (n == UV_EOF) {
        int rc = ty_rpc_decoder_finish(&c->dec);
        if (rc < 0)
            TY_LOG_WARN("rpc", "%s: closing connection %s: %s (%s)", c->role, c->peer,
                        ty_rpc_decoder_reason(&c->dec), ty_err_name(rc));
        else
            TY_LOG_DEBUG("rpc", "%s: connection %s closed by peer", c->role, c->peer);
        ty__rpc_conn_close(c, rc < 0 ? rc : TY_ECONNRESET);
        return;
    }
    TY_LOG_INFO("rpc", "%s: connection %s: read error: %s", c->role, c->peer, ty_strerror((int)n));
    ty__rpc_conn_close(c, (int)n);
}

int ty__rpc_conn_start(struct ty__rpc_conn *c)
{
    record_peer(c);
    uv_tcp_nodelay(&c->tcp, 1);
    c->hs = malloc(sizeof(*c->hs));
    if (!c->hs)
        return TY_ENOMEM;
    bool server = strcmp(c->role, "server") == 0;
    ty_auth_hs_init(c->hs, c->auth, server);
    if (c->hs->state == TY_AUTH_HS_FAILED)
        return TY_EIO;
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc == 0)
        c->reading = true;
    if (rc == 0 && c->hs->out_len) {
        rc = send_raw(c, c->hs->out, c->hs->out_len, false);
        c->hs->out_len = 0;
    }
    return rc;
}

static void on_write(uv_write_t *req, int status)
{
    struct wreq *w = (struct wreq *)req;
    struct ty__rpc_conn *c = w->conn;
    bool close_after = w->close_after;
    free(w->data);
    free(w);
    if (close_after) {
        ty__rpc_conn_close(c, TY_EACCES);
        return;
    }
    if (status < 0 && status != UV_ECANCELED && !c->closing) {
        TY_LOG_INFO("rpc", "%s: connection %s: write error: %s", c->role, c->peer,
                    ty_strerror(status));
        ty__rpc_conn_close(c, status);
    }
}

int ty__rpc_conn_send_owned(struct ty__rpc_conn *c, uint8_t *frame, size_t len)
{
    if (c->closing || !c->authed)
        return TY_ENOTCONN;
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > TY__RPC_MAX_WRITE_QUEUE)
        return TY_EAGAIN;
    int rc = write_owned(c, frame, len, false);
    if (rc < 0 && rc != TY_ENOMEM)
        ty__rpc_conn_close(c, rc);
    return rc;
}

int ty__rpc_frame_alloc(enum ty_rpc_kind kind, uint16_t method, uint64_t id, const uint8_t *payload,
                        size_t len, uint8_t **out, size_t *out_len)
{
    if (len > TY_RPC_MAX_FRAME_LIMIT)
        return TY_EMSGSIZE;
    size_t n = TY_RPC_HEADER_SIZE + len;
    uint8_t *buf = malloc(n);
    if (!buf)
        return TY_ENOMEM;
    struct ty_rpc_frame f = {
        .kind = kind, .method = method, .request_id = id, .len = (uint32_t)len, .payload = payload};
    int rc = ty_rpc_frame_encode(&f, buf, n, out_len);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}

int ty__rpc_conn_send(struct ty__rpc_conn *c, enum ty_rpc_kind kind, uint16_t method, uint64_t id,
                      const uint8_t *payload, size_t len)
{
    if (c->closing)
        return TY_ENOTCONN;
    uint8_t *frame;
    size_t n;
    int rc = ty__rpc_frame_alloc(kind, method, id, payload, len, &frame, &n);
    if (rc < 0)
        return rc;
    rc = ty__rpc_conn_send_owned(c, frame, n);
    if (rc < 0)
        free(frame);
    return rc;
}

static void on_handle_closed(uv_handle_t *h)
{
    struct ty__rpc_conn *c = h->data;
    ty_rpc_decoder_fini(&c->dec);
    free(c->hs);
    c->hs = NULL;
    c->on_closed(c, c->close_reason);
}

void ty__rpc_conn_close(struct ty__rpc_conn *c, int reason)
{
    if (c->closing)
        return;
    c->closing = true;
    c->close_reason = reason;
    if (c->on_closing)
        c->on_closing(c, reason);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

int ty__rpc_error_pack(int code, const char *message, uint64_t id, uint8_t **out, size_t *len)
{
    Tycho__V1__Error e = TYCHO__V1__ERROR__INIT;
    e.code = code;
    e.message = (char *)(message ? message : "");
    e.request_id = id;
    return ty_rpc_pack(&e.base, out, len);
}
