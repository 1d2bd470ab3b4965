/* RPC client: request ids, a deadline heap for per-call timeouts, a hash map from request id to
 * call, queued sends while disconnected, and reconnect with capped exponential backoff.
 * Loop thread only (rpc.h).
 *
 * Every call sits in the id map and the deadline heap from start to completion, and in exactly
 * one of two lists: `unsent` (waiting for a connection; it holds its encoded frame) or `sent`
 * (on the current connection). Completion removes it from all three before the user callback
 * runs, which is what makes "exactly once" hold under re-entrant callbacks. */
#include "rpc-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho.pb-c.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cli_call;

struct call_list {
    struct cli_call *head, *tail;
};

struct cli_call {
    uint64_t id;
    uint16_t method;
    bool stream;
    ty_rpc_result_cb cb;
    void *arg;
    uint64_t deadline; /* uv_now() ms */
    size_t heap_idx;
    struct cli_call *hnext;       /* id map chain */
    struct cli_call *prev, *next; /* position in *on */
    struct call_list *on;
    uint8_t *frame; /* encoded request while unsent */
    size_t frame_len;
};

struct cli_conn {
    struct ty__rpc_conn conn; /* first: conn pointers convert to cli_conn */
    ty_rpc_client_t *cl;
    uv_connect_t creq;
};

enum cli_state { CLI_IDLE, CLI_CONNECTING, CLI_CONNECTED };

struct ty_rpc_client {
    uv_loop_t *loop;
    struct sockaddr_storage addr;
    char addr_text[96];
    uint32_t max_frame, call_timeout_ms, connect_timeout_ms, backoff_initial_ms, backoff_max_ms;
    ty_rpc_state_cb state_cb;
    void *state_arg;
    const struct ty_auth *auth;

    enum cli_state state;
    bool closing;
    struct cli_conn *conn;
    uv_timer_t retry_timer; /* backoff delay, or connect timeout while connecting */
    uv_timer_t deadline_timer;
    uint32_t attempt;
    uint64_t next_id;

    struct cli_call **buckets;
    size_t n_buckets, n_calls;
    struct cli_call **heap;
    size_t heap_len, heap_cap;
    struct call_list unsent, sent;

    struct ty_rpc_client_stats stats;
    int open_handles;
    ty_rpc_closed_cb close_cb;
    void *close_arg;
};

static void start_connect(ty_rpc_client_t *c);

/* ---- id map ----------------------------------------------------------------------------- */

static void map_grow(ty_rpc_client_t *c)
{
    size_t n = c->n_buckets ? c->n_buckets * 2 : 256;
    struct cli_call **nb = calloc(n, sizeof(*nb));
    TY_ASSERT(nb);
    for (size_t i = 0; i < c->n_buckets; i++) {
        struct cli_call *e = c->buckets[i];
        while (e) {
            struct cli_call *next = e->hnext;
            size_t b = (size_t)(e->id & (n - 1));
            e->hnext = nb[b];
            nb[b] = e;
            e = next;
        }
    }
    free(c->buckets);
    c->buckets = nb;
    c->n_buckets = n;
}

static void map_insert(ty_rpc_client_t *c, struct cli_call *call)
{
    if (c->n_calls >= c->n_buckets)
        map_grow(c);
    size_t b = (size_t)(call->id & (c->n_buckets - 1));
    call->hnext = c->buckets[b];
    c->buckets[b] = call;
    c->n_calls++;
}

static struct cli_call *map_find(const ty_rpc_client_t *c, uint64_t id)
{
    if (!c->n_buckets)
        return NULL;
    for (struct cli_call *e = c->buckets[id & (c->n_buckets - 1)]; e; e = e->hnext)
        if (e->id == id)
            return e;
    return NULL;
}

static void map_remove(ty_rpc_client_t *c, struct cli_call *call)
{
    struct cli_call **pp = &c->buckets[call->id & (c->n_buckets - 1)];
    while (*pp && *pp != call)
        pp = &(*pp)->hnext;
    if (*pp) {
        *pp = call->hnext;
        c->n_calls--;
    }
}

/* ---- deadline heap (min-heap on deadline) ------------------------------------------------ */

static void heap_set(ty_rpc_client_t *c, size_t i, struct cli_call *call)
{
    c->heap[i] = call;
    call->heap_idx = i;
}

static void heap_up(ty_rpc_client_t *c, size_t i)
{
    struct cli_call *x = c->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (c->heap[p]->deadline <= x->deadline)
            break;
        heap_set(c, i, c->heap[p]);
        i = p;
    }
    heap_set(c, i, x);
}

static void heap_down(ty_rpc_client_t *c, size_t i)
{
    struct cli_call *x = c->heap[i];
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        uint64_t best = x->deadline;
        if (l < c->heap_len && c->heap[l]->deadline < best)
            m = l, best = c->heap[l]->deadline;
        if (l + 1 < c->heap_len && c->heap[l + 1]->deadline < best)
            m = l + 1;
        if (m == i)
            break;
        heap_set(c, i, c->heap[m]);
        i = m;
    }
    heap_set(c, i, x);
}

static void heap_push(ty_rpc_client_t *c, struct cli_call *call)
{
    if (c->heap_len == c->heap_cap) {
        c->heap_cap = c->heap_cap ? c->heap_cap * 2 : 256;
        c->heap = realloc(c->heap, c->heap_cap * sizeof(*c->heap));
        TY_ASSERT(c->heap);
    }
    heap_set(c, c->heap_len++, call);
    heap_up(c, call->heap_idx);
}

static void heap_remove(ty_rpc_client_t *c, struct cli_call *call)
{
    size_t i = call->heap_idx;
    struct cli_call *last = c->heap[--c->heap_len];
    if (i == c->heap_len)
        return;
    heap_set(c, i, last);
    heap_up(c, i);
    heap_down(c, last->heap_idx);
}

/* ---- call lists --------------------------------------------------------------------------- */

static void list_append(struct call_list *l, struct cli_call *call)
{
    call->on = l;
    call->next = NULL;
    call->prev = l->tail;
    if (l->tail)
        l->tail->next = call;
    else
        l->head = call;
    l->tail = call;
}

static void list_unlink(struct cli_call *call)
{
    struct call_list *l = call->on;
    if (!l)
        return;
    if (call->prev)
        call->prev->next = call->next;
    else
        l->head = call->next;
    if (call->next)
        call->next->prev = call->prev;
    else
        l->tail = call->prev;
    call->prev = call->next = NULL;
    call->on = NULL;
}

/* ---- completion ---------------------------------------------------------------------------- */

static void call_detach(ty_rpc_client_t *c, struct cli_call *call)
{
    map_remove(c, call);
    heap_remove(c, call);
    list_unlink(call);
    free(call->frame);
    call->frame = NULL;
}

/* Final event: detach, run the callback, free. The call pointer is dead afterwards. */
static void call_complete(ty_rpc_client_t *c, struct cli_call *call, struct ty_rpc_result *res)
{
    call_detach(c, call);
    res->request_id = call->id;
    if (!res->message)
        res->message = "";
    if (res->event == TY_RPC_EVENT_ERROR) {
        c->stats.calls_failed++;
        if (res->status == TY_ETIMEDOUT)
            c->stats.calls_timed_out++;
    }
    call->cb(res, call->arg);
    free(call);
}

static void call_fail(ty_rpc_client_t *c, struct cli_call *call, int status, const char *msg)
{
    struct ty_rpc_result res = {.event = TY_RPC_EVENT_ERROR, .status = status, .message = msg};
    call_complete(c, call, &res);
}

static void fail_list(ty_rpc_client_t *c, struct call_list *l, int status, const char *msg)
{
    while (l->head)
        call_fail(c, l->head, status, msg);
}

/* ---- timers --------------------------------------------------------------------------------- */

static void on_deadline(uv_timer_t *t);

static void arm_deadline(ty_rpc_client_t *c)
{
    if (c->closing)
        return;
    if (c->heap_len == 0) {
        uv_timer_stop(&c->deadline_timer);
        return;
    }
    uint64_t now = uv_now(c->loop), d = c->heap[0]->deadline;
    uv_timer_start(&c->deadline_timer, on_deadline, d > now ? d - now : 0, 0);
}

static void on_deadline(uv_timer_t *t)
{
    ty_rpc_client_t *c = t->data;
    uint64_t now = uv_now(c->loop);
    while (!c->closing && c->heap_len > 0 && c->heap[0]->deadline <= now) {
        struct cli_call *call = c->heap[0];
        if (call->on == &c->sent && c->conn && c->state == CLI_CONNECTED)
            ty__rpc_conn_send(&c->conn->conn, TY_RPC_KIND_CANCEL, call->method, call->id, NULL,
                              0); /* best effort: let the server stop working on it */
        call_fail(c, call, TY_ETIMEDOUT, "call timed out");
    }
    arm_deadline(c);
}

static void on_retry(uv_timer_t *t)
{
    ty_rpc_client_t *c = t->data;
    if (!c->closing && c->state == CLI_IDLE)
        start_connect(c);
}

static void schedule_retry(ty_rpc_client_t *c)
{
    uint32_t shift = c->attempt < 20 ? c->attempt : 20;
    uint64_t delay = (uint64_t)c->backoff_initial_ms << shift;
    if (delay > c->backoff_max_ms)
        delay = c->backoff_max_ms;
    c->attempt++;
    c->stats.last_backoff_ms = (uint32_t)delay;
    uv_timer_start(&c->retry_timer, on_retry, delay, 0);
}

static void on_connect_timeout(uv_timer_t *t)
{
    ty_rpc_client_t *c = t->data;
    if (c->conn && c->state == CLI_CONNECTING) {
        TY_LOG_INFO("rpc", "client: connect to %s timed out", c->addr_text);
        ty__rpc_conn_close(&c->conn->conn, TY_ETIMEDOUT);
    }
}

/* ---- sending ----------------------------------------------------------------------------------
 */

/* Try to put an unsent call on the wire. Returns 0 (now in `sent`), 1 (the connection dropped
 * meanwhile: the call stays queued for the next one) or a negative error (call untouched). */
static int send_call(ty_rpc_client_t *c, struct cli_call *call)
{
    struct cli_conn *cc = c->conn;
    int rc = ty__rpc_conn_send_owned(&cc->conn, call->frame, call->frame_len);
    if (rc == 0) {
        call->frame = NULL;
        list_unlink(call);
        list_append(&c->sent, call);
        return 0;
    }
    if (cc->conn.closing)
        return 1;
    return rc;
}

static void flush_unsent(ty_rpc_client_t *c)
{
    while (c->unsent.head && c->state == CLI_CONNECTED) {
        struct cli_call *call = c->unsent.head;
        int rc = send_call(c, call);
        if (rc == 1)
            return;
        if (rc < 0)
            call_fail(c, call, rc, "cannot send the request");
    }
}

/* ---- connection --------------------------------------------------------------------------------
 */

static void on_stream_frame(ty_rpc_client_t *c, struct cli_call *call, const struct ty_rpc_frame *f)
{
    struct ty_rpc_result res = {.payload = f->payload, .len = f->len};
    if (f->kind == TY_RPC_KIND_STREAM_ITEM) {
        res.event = TY_RPC_EVENT_ITEM;
        res.request_id = call->id;
        res.message = "";
        call->cb(&res, call->arg); /* not final: the call stays registered */
        return;
    }
    res.event = TY_RPC_EVENT_END;
    call_complete(c, call, &res);
}

static void on_error_frame(ty_rpc_client_t *c, struct cli_call *call, const struct ty_rpc_frame *f)
{
    Tycho__V1__Error *e = tycho__v1__error__unpack(NULL, f->len, f->payload);
    struct ty_rpc_result res = {.event = TY_RPC_EVENT_ERROR, .status = TY_EREMOTE};
    if (e) {
        res.remote_code = e->code;
        res.message = e->message;
    } else {
        res.remote_code = TY_EBADMSG;
        res.message = "malformed error payload";
    }
    call_complete(c, call, &res);
    if (e)
        tycho__v1__error__free_unpacked(e, NULL);
}

static void cli_on_frame(struct ty__rpc_conn *conn, const struct ty_rpc_frame *f)
{
    ty_rpc_client_t *c = ((struct cli_conn *)conn)->cl;
    if (f->kind == TY_RPC_KIND_REQUEST || f->kind == TY_RPC_KIND_CANCEL) {
        TY_LOG_WARN("rpc", "client: closing connection %s: unexpected %s frame from a server",
                    conn->peer, ty_rpc_kind_name(f->kind));
        ty__rpc_conn_close(conn, TY_EPROTO);
        return;
    }
    struct cli_call *call = map_find(c, f->request_id);
    if (!call || call->on != &c->sent) {
        c->stats.stray_frames++; /* finished (timeout, cancel) or never ours */
        return;
    }
    if (f->kind == TY_RPC_KIND_ERROR) {
        on_error_frame(c, call, f);
    } else if ((f->kind == TY_RPC_KIND_RESPONSE) == call->stream) {
        call_fail(c, call, TY_EPROTO,
                  call->stream ? "unary response to a streaming call"
                               : "stream frame to a unary call");
    } else if (f->kind == TY_RPC_KIND_RESPONSE) {
        struct ty_rpc_result res = {
            .event = TY_RPC_EVENT_REPLY, .payload = f->payload, .len = f->len};
        call_complete(c, call, &res);
    } else {
        on_stream_frame(c, call, f);
    }
}

static void cli_on_closing(struct ty__rpc_conn *conn, int reason)
{
    struct cli_conn *cc = (struct cli_conn *)conn;
    ty_rpc_client_t *c = cc->cl;
    if (c->conn != cc)
        return;
    bool was_connected = c->state == CLI_CONNECTED;
    c->conn = NULL;
    c->state = CLI_IDLE;
    uv_timer_stop(&c->retry_timer);
    if (was_connected) {
        c->stats.disconnects++;
        if (!c->closing)
            TY_LOG_INFO("rpc", "client: connection to %s lost: %s", c->addr_text,
                        reason == TY_ECONNRESET ? "closed by the server" : ty_strerror(reason));
    }
    fail_list(c, &c->sent, c->closing ? TY_ECANCELED : TY_ECONNRESET,
              c->closing ? "client closed" : "connection lost");
    if (was_connected && !c->closing && c->state_cb)
        c->state_cb(c, false, reason, c->state_arg);
    if (!c->closing && c->state == CLI_IDLE && !c->conn)
        schedule_retry(c);
}

static void maybe_finish_close(ty_rpc_client_t *c)
{
    if (!c->closing || c->open_handles > 0)
        return;
    ty_rpc_closed_cb cb = c->close_cb;
    void *arg = c->close_arg;
    free(c->buckets);
    free(c->heap);
    free(c);
    if (cb)
        cb(arg);
}

static void cli_on_closed(struct ty__rpc_conn *conn, int reason)
{
    struct cli_conn *cc = (struct cli_conn *)conn;
    ty_rpc_client_t *c = cc->cl;
    free(cc);
    c->open_handles--;
    maybe_finish_close(c);
}

static void on_connect(uv_connect_t *req, int status)
{
    struct cli_conn *cc = req->data;
    ty_rpc_client_t *c = cc->cl;
    if (status == UV_ECANCELED || cc->conn.closing || c->conn != cc)
        return;
    if (status < 0) {
        TY_LOG_DEBUG("rpc", "client: connect to %s failed: %s", c->addr_text, ty_strerror(status));
        ty__rpc_conn_close(&cc->conn, status);
        return;
    }
    /* the connect timer keeps running: it bounds the handshake too */
    int rc = ty__rpc_conn_start(&cc->conn);
    if (rc < 0)
        ty__rpc_conn_close(&cc->conn, rc);
}

/* The server proved it knows the cluster secret: now the client is connected. */
static void cli_on_authed(struct ty__rpc_conn *conn, int reason)
{
    struct cli_conn *cc = (struct cli_conn *)conn;
    ty_rpc_client_t *c = cc->cl;
    (void)reason;
    if (cc->conn.closing || c->conn != cc)
        return;
    uv_timer_stop(&c->retry_timer);
    c->state = CLI_CONNECTED;
    c->attempt = 0;
    c->stats.connects++;
    TY_LOG_DEBUG("rpc", "client: connected to %s", c->addr_text);
    if (c->state_cb)
        c->state_cb(c, true, 0, c->state_arg);
    if (c->conn == cc)
        flush_unsent(c);
}

static void start_connect(ty_rpc_client_t *c)
{
    struct cli_conn *cc = calloc(1, sizeof(*cc));
    TY_ASSERT(cc);
    c->stats.connect_attempts++;
    if (ty__rpc_conn_init(&cc->conn, c->loop, c->max_frame, "client") < 0) {
        free(cc);
        schedule_retry(c);
        return;
    }
    cc->cl = c;
    cc->creq.data = cc;
    cc->conn.on_frame = cli_on_frame;
    cc->conn.on_closing = cli_on_closing;
    cc->conn.on_closed = cli_on_closed;
    cc->conn.on_authed = cli_on_authed;
    cc->conn.auth = c->auth;
    c->open_handles++;
    c->conn = cc;
    c->state = CLI_CONNECTING;
    uv_timer_start(&c->retry_timer, on_connect_timeout, c->connect_timeout_ms, 0);
    int rc =
        uv_tcp_connect(&cc->creq, &cc->conn.tcp, (const struct sockaddr *)&c->addr, on_connect);
    if (rc < 0)
        ty__rpc_conn_close(&cc->conn, rc);
}

/* ---- public API
 * ---------------------------------------------------------------------------------- */

static int resolve(ty_rpc_client_t *c, const char *host, uint16_t port)
{
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&c->addr) == 0 ||
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&c->addr) == 0) {
        snprintf(c->addr_text, sizeof(c->addr_text), "%s:%u", host, port);
        return 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    char service[8];
    snprintf(service, sizeof(service), "%u", port);
    if (getaddrinfo(host, service, &hints, &res) != 0 || !res) {
        TY_LOG_ERROR("rpc", "client: cannot resolve host '%s'", host);
        return TY_ENOTFOUND;
    }
    memcpy(&c->addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    snprintf(c->addr_text, sizeof(c->addr_text), "%s:%u", host, port);
    return 0;
}

static void copy_opts(ty_rpc_client_t *c, const struct ty_rpc_client_opts *o)
{
    c->loop = o->loop;
    c->max_frame = o->max_frame_size ? o->max_frame_size : TY_RPC_DEFAULT_MAX_FRAME;
    c->call_timeout_ms = o->call_timeout_ms ? o->call_timeout_ms : 30000;
    c->connect_timeout_ms = o->connect_timeout_ms ? o->connect_timeout_ms : 5000;
    c->backoff_initial_ms = o->backoff_initial_ms ? o->backoff_initial_ms : 50;
    c->backoff_max_ms = o->backoff_max_ms ? o->backoff_max_ms : 5000;
    if (c->backoff_max_ms < c->backoff_initial_ms)
        c->backoff_max_ms = c->backoff_initial_ms;
    c->state_cb = o->state_cb;
    c->state_arg = o->state_arg;
    c->auth = o->auth;
}

int ty_rpc_client_new(ty_rpc_client_t **out, const struct ty_rpc_client_opts *opts)
{
    if (!opts->loop || !opts->host || opts->port == 0 ||
        opts->max_frame_size > TY_RPC_MAX_FRAME_LIMIT)
        return TY_EINVAL;
    ty_rpc_client_t *c = calloc(1, sizeof(*c));
    TY_ASSERT(c);
    copy_opts(c, opts);
    int rc = resolve(c, opts->host, opts->port);
    if (rc < 0) {
        free(c);
        return rc;
    }
    uv_timer_init(c->loop, &c->retry_timer);
    uv_timer_init(c->loop, &c->deadline_timer);
    c->retry_timer.data = c;
    c->deadline_timer.data = c;
    c->open_handles = 2;
    start_connect(c);
    *out = c;
    return 0;
}

static struct cli_call *call_new(ty_rpc_client_t *c, uint16_t method,
                                 const struct ty_rpc_call_opts *opts, ty_rpc_result_cb cb,
                                 void *arg)
{
    struct cli_call *call = calloc(1, sizeof(*call));
    TY_ASSERT(call);
    call->id = ++c->next_id;
    call->method = method;
    call->stream = opts && opts->stream;
    call->cb = cb;
    call->arg = arg;
    uint32_t t = opts && opts->timeout_ms ? opts->timeout_ms : c->call_timeout_ms;
    uv_update_time(c->loop); /* the cached loop time may be stale outside callbacks */
    call->deadline = uv_now(c->loop) + t;
    return call;
}

int ty_rpc_client_call(ty_rpc_client_t *c, uint16_t method, const uint8_t *payload, size_t len,
                       const struct ty_rpc_call_opts *opts, ty_rpc_result_cb cb, void *arg,
                       uint64_t *out_id)
{
    if (c->closing)
        return TY_ESHUTDOWN;
    if (!cb || (len && !payload))
        return TY_EINVAL;
    if (len > c->max_frame)
        return TY_EMSGSIZE;
    struct cli_call *call = call_new(c, method, opts, cb, arg);
    int rc = ty__rpc_frame_alloc(TY_RPC_KIND_REQUEST, method, call->id, payload, len, &call->frame,
                                 &call->frame_len);
    if (rc < 0) {
        free(call);
        return rc;
    }
    map_insert(c, call);
    heap_push(c, call);
    list_append(&c->unsent, call);
    if (c->state == CLI_CONNECTED) {
        rc = send_call(c, call);
        if (rc < 0) {
            call_detach(c, call);
            free(call);
            return rc;
        }
    }
    if (call->heap_idx == 0)
        arm_deadline(c);
    c->stats.calls_started++;
    if (out_id)
        *out_id = call->id;
    return 0;
}

int ty_rpc_client_call_msg(ty_rpc_client_t *c, uint16_t method, const ProtobufCMessage *msg,
                           const struct ty_rpc_call_opts *opts, ty_rpc_result_cb cb, void *arg,
                           uint64_t *out_id)
{
    uint8_t *buf;
    size_t len;
    int rc = ty_rpc_pack(msg, &buf, &len);
    if (rc < 0)
        return rc;
    rc = ty_rpc_client_call(c, method, buf, len, opts, cb, arg, out_id);
    free(buf);
    return rc;
}

bool ty_rpc_client_is_connected(const ty_rpc_client_t *c)
{
    return c->state == CLI_CONNECTED;
}

size_t ty_rpc_client_pending(const ty_rpc_client_t *c)
{
    return c->n_calls;
}

void ty_rpc_client_stats(const ty_rpc_client_t *c, struct ty_rpc_client_stats *out)
{
    *out = c->stats;
}

static void on_timer_closed(uv_handle_t *h)
{
    ty_rpc_client_t *c = h->data;
    c->open_handles--;
    maybe_finish_close(c);
}

void ty_rpc_client_close(ty_rpc_client_t *c, ty_rpc_closed_cb cb, void *arg)
{
    if (c->closing)
        return;
    c->closing = true;
    c->close_cb = cb;
    c->close_arg = arg;
    fail_list(c, &c->unsent, TY_ECANCELED, "client closed");
    fail_list(c, &c->sent, TY_ECANCELED, "client closed");
    uv_close((uv_handle_t *)&c->retry_timer, on_timer_closed);
    uv_close((uv_handle_t *)&c->deadline_timer, on_timer_closed);
    if (c->conn)
        ty__rpc_conn_close(&c->conn->conn, 0);
}
