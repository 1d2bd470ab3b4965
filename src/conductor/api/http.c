/* HTTP/1.1 server: connections, parsing, limits, timeouts and responses (see tycho/http.h).
 *
 * A connection reads into `in`; while no request is being handled, http-parser runs over it
 * and pauses itself at the end of each message, so a pipelined next request stays buffered
 * until the response to the current one has ended. One timer per connection carries the
 * current deadline (idle, headers or body). Errors close the connection after the error
 * response is flushed (write, shutdown, then read to EOF or a short linger).
 */
#include "tycho/http.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <http_parser.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define IN_MAX_BUFFERED (256u * 1024u) /* pipelined bytes held while handling */
#define LINGER_MS 1000u
#define MAX_HEADERS 64

enum conn_state {
    CONN_IDLE,     /* waiting for the first byte of a request */
    CONN_HEAD,     /* inside request line / headers */
    CONN_BODY,     /* headers done, body arriving */
    CONN_HANDLING, /* dispatched, response not ended */
    CONN_CLOSING,  /* error sent or peer gone: draining to close */
};

struct ty_http_req {
    struct conn *conn;
    char method[16];
    char *url;       /* owned, NUL-terminated */
    size_t url_len;
    char *hbuf;      /* header names and values: "name\0value\0..." */
    size_t hlen, hcap;
    uint32_t n_headers;
    size_t hname[MAX_HEADERS], hval[MAX_HEADERS]; /* offsets into hbuf */
    bool in_value;
    char *body;
    size_t body_len, body_cap;
    bool streaming, ended, chunked_out;
    ty_http_abort_cb abort_cb;
    void *abort_arg;
};

struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    http_parser parser;
    ty_http_server_t *srv;
    struct conn *prev, *next;
    char *in;
    size_t in_len, in_cap;
    enum conn_state state;
    size_t header_bytes;
    struct ty_http_req req;
    bool keep_alive, in_parse, reading, closed;
    int n_handles; /* open handles: close frees at 0 */
};

struct ty_http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    struct ty_http_server_opts o;
    http_parser_settings ps;
    struct conn *conns;
    uint32_t n_conns;
    bool accepting, closing;
    ty_http_closed_cb closed_cb;
    void *closed_arg;
    uint16_t port;
    uint32_t n_alive; /* connections not yet freed */
    bool listener_closed;
};

/* After close: free the server once the listener and every connection are gone. */
static void server_maybe_freed(ty_http_server_t *srv)
{
    if (!srv->closing || !srv->listener_closed || srv->n_alive)
        return;
    ty_http_closed_cb cb = srv->closed_cb;
    void *arg = srv->closed_arg;
    free(srv);
    if (cb)
        cb(arg);
}

static void conn_close(struct conn *c);
static void conn_process(struct conn *c);
static void conn_fail(struct conn *c, int status, const char *msg);
static void on_timer(uv_timer_t *t);

const char *ty_http_status_text(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

/* ---- writing ----------------------------------------------------------------------------- */

struct wreq {
    uv_write_t w;
    struct conn *c;
    size_t len;
    char data[];
};

static void on_write(uv_write_t *w, int status)
{
    struct wreq *wr = (struct wreq *)w;
    struct conn *c = wr->c;
    free(wr);
    if (status < 0 && !c->closed)
        conn_close(c);
}

/* Queue bytes from up to three pieces as one write. */
static int conn_write3(struct conn *c, const void *a, size_t na, const void *b, size_t nb,
                       const void *d, size_t nd)
{
    if (c->closed || uv_is_closing((uv_handle_t *)&c->tcp))
        return TY_ENOTCONN;
    struct wreq *wr = malloc(sizeof(*wr) + na + nb + nd);
    if (!wr)
        return TY_ENOMEM;
    wr->c = c;
    wr->len = na + nb + nd;
    memcpy(wr->data, a, na);
    if (nb)
        memcpy(wr->data + na, b, nb);
    if (nd)
        memcpy(wr->data + na + nb, d, nd);
    uv_buf_t buf = uv_buf_init(wr->data, (unsigned)wr->len);
    int rc = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &buf, 1, on_write);
    if (rc) {
        free(wr);
        return rc;
    }
    return 0;
}

static int write_head(struct conn *c, int status, const char *ctype, const char *extra,
                      const char *framing, const void *body, size_t blen)
{
    char head[1024];
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s%sConnection: %s\r\n\r\n", status,
                     ty_http_status_text(status), ctype ? ctype : "application/json", framing,
                     extra ? extra : "", c->keep_alive ? "keep-alive" : "close");
    if (n < 0 || (size_t)n >= sizeof(head))
        return TY_EINVAL;
    return conn_write3(c, head, (size_t)n, body, blen, NULL, 0);
}

/* ---- request state ----------------------------------------------------------------------- */

static void req_reset(struct ty_http_req *r)
{
    free(r->url);
    free(r->hbuf);
    free(r->body);
    struct conn *c = r->conn;
    memset(r, 0, sizeof(*r));
    r->conn = c;
}

static int buf_append(char **buf, size_t *len, size_t *cap, const char *at, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *len + n + 1)
            nc *= 2;
        char *nb = realloc(*buf, nc);
        if (!nb)
            return TY_ENOMEM;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, at, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

static void conn_arm(struct conn *c, uint64_t ms)
{
    uv_timer_stop(&c->timer);
    if (ms)
        uv_timer_start(&c->timer, on_timer, ms, 0);
}

/* ---- parser callbacks ---------------------------------------------------------------------- */

static int count_header(struct conn *c, size_t n)
{
    c->header_bytes += n;
    if (c->header_bytes > c->srv->o.max_header_bytes) {
        conn_fail(c, 431, "request headers exceed the server's limit");
        return 1;
    }
    return 0;
}

static int on_message_begin(http_parser *p)
{
    struct conn *c = p->data;
    req_reset(&c->req);
    c->header_bytes = 0;
    if (c->state == CONN_IDLE) {
        c->state = CONN_HEAD;
        conn_arm(c, c->srv->o.header_timeout_ms);
    }
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    struct conn *c = p->data;
    size_t cap = c->req.url ? c->req.url_len + 1 : 0;
    if (count_header(c, n))
        return 1;
    return buf_append(&c->req.url, &c->req.url_len, &cap, at, n) ? 1 : 0;
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    struct conn *c = p->data;
    struct ty_http_req *r = &c->req;
    if (count_header(c, n + 4))
        return 1;
    if (r->in_value || r->n_headers == 0) {
        if (r->n_headers == MAX_HEADERS) {
            conn_fail(c, 431, "too many request headers");
            return 1;
        }
        if (r->n_headers && buf_append(&r->hbuf, &r->hlen, &r->hcap, "", 0))
            return 1;
        if (r->n_headers)
            r->hlen++; /* keep the NUL ending the previous value */
        r->hname[r->n_headers] = r->hlen;
        r->hval[r->n_headers] = SIZE_MAX;
        r->n_headers++;
        r->in_value = false;
    }
    return buf_append(&r->hbuf, &r->hlen, &r->hcap, at, n) ? 1 : 0;
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    struct conn *c = p->data;
    struct ty_http_req *r = &c->req;
    if (count_header(c, n) || !r->n_headers)
        return 1;
    if (!r->in_value) {
        if (buf_append(&r->hbuf, &r->hlen, &r->hcap, "", 0))
            return 1;
        r->hlen++; /* NUL after the name */
        r->hval[r->n_headers - 1] = r->hlen;
        r->in_value = true;
    }
    return buf_append(&r->hbuf, &r->hlen, &r->hcap, at, n) ? 1 : 0;
}

static int on_headers_complete(http_parser *p)
{
    struct conn *c = p->data;
    struct ty_http_req *r = &c->req;
    if (r->n_headers && !r->in_value) { /* a name without value */
        buf_append(&r->hbuf, &r->hlen, &r->hcap, "", 0);
        r->hlen++;
        r->hval[r->n_headers - 1] = r->hlen;
        buf_append(&r->hbuf, &r->hlen, &r->hcap, "", 0);
    }
    snprintf(r->method, sizeof(r->method), "%s", http_method_str(p->method));
    c->keep_alive = http_should_keep_alive(p);
    if (!(p->flags & F_CHUNKED) && p->content_length != ULLONG_MAX &&
        p->content_length > c->srv->o.max_body_bytes) {
        conn_fail(c, 413, "request body exceeds the server's limit");
        return 1;
    }
    const char *expect = ty_http_req_header(r, "expect");
    if (expect && !strcasecmp(expect, "100-continue"))
        conn_write3(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, NULL, 0, NULL, 0);
    c->state = CONN_BODY;
    conn_arm(c, c->srv->o.body_timeout_ms);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    struct conn *c = p->data;
    struct ty_http_req *r = &c->req;
    if (r->body_len + n > c->srv->o.max_body_bytes) {
        conn_fail(c, 413, "request body exceeds the server's limit");
        return 1;
    }
    return buf_append(&r->body, &r->body_len, &r->body_cap, at, n) ? 1 : 0;
}

static int on_message_complete(http_parser *p)
{
    struct conn *c = p->data;
    if (!c->req.body && buf_append(&c->req.body, &c->req.body_len, &c->req.body_cap, "", 0))
        return 1;
    c->state = CONN_HANDLING;
    uv_timer_stop(&c->timer);
    http_parser_pause(p, 1);
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = h->data;
    if (c->in_cap - c->in_len < 16384) {
        size_t nc = c->in_cap ? c->in_cap * 2 : 32768;
        char *ni = realloc(c->in, nc);
        if (!ni) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        c->in = ni;
        c->in_cap = nc;
    }
    *buf = uv_buf_init(c->in + c->in_len, (unsigned)(c->in_cap - c->in_len));
}

static void conn_abort_request(struct conn *c)
{
    if (c->state == CONN_HANDLING && !c->req.ended) {
        c->req.ended = true;
        ty_http_abort_cb cb = c->req.abort_cb;
        c->req.abort_cb = NULL;
        if (cb)
            cb(c->req.abort_arg, &c->req);
    }
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    if (n < 0) { /* EOF or error: the client is gone */
        conn_abort_request(c);
        conn_close(c);
        return;
    }
    if (c->state == CONN_CLOSING) {
        c->in_len = 0; /* discard while lingering */
        return;
    }
    c->in_len += (size_t)n;
    if (c->state == CONN_HANDLING) {
        if (c->in_len > IN_MAX_BUFFERED) {
            uv_read_stop(s); /* back-pressure on a pipelining client */
            c->reading = false;
        }
        return;
    }
    conn_process(c);
}

/* Run the parser over buffered input until it pauses at a complete request or runs dry. */
static void conn_process(struct conn *c)
{
    ty_http_server_t *srv = c->srv;
    c->in_parse = true;
    while (!c->closed && c->state != CONN_HANDLING && c->state != CONN_CLOSING && c->in_len) {
        size_t used = http_parser_execute(&c->parser, &srv->ps, c->in, c->in_len);
        enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
        if (c->state == CONN_CLOSING || c->closed)
            break;
        if (e != HPE_OK && e != HPE_PAUSED) {
            conn_fail(c, e == HPE_HEADER_OVERFLOW ? 431 : 400, http_errno_description(e));
            break;
        }
        memmove(c->in, c->in + used, c->in_len - used);
        c->in_len -= used;
        if (c->state == CONN_HANDLING) {
            srv->o.handler(srv->o.arg, &c->req);
            continue; /* the handler may have answered synchronously */
        }
        if (e == HPE_OK && used == 0)
            break;
    }
    c->in_parse = false;
    if (!c->closed && c->state != CONN_CLOSING && !c->reading &&
        c->in_len < IN_MAX_BUFFERED) {
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
            c->reading = true;
    }
}

static void on_shutdown(uv_shutdown_t *sh, int status)
{
    free(sh);
}

/* The response ended: go back to reading the next request. */
static void conn_request_done(struct conn *c)
{
    if (c->closed || c->state == CONN_CLOSING)
        return;
    if (!c->keep_alive) {
        c->state = CONN_CLOSING;
        uv_shutdown_t *sh = malloc(sizeof(*sh));
        if (!sh || uv_shutdown(sh, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
            free(sh);
            conn_close(c);
            return;
        }
        conn_arm(c, LINGER_MS);
        return;
    }
    c->state = CONN_IDLE;
    http_parser_pause(&c->parser, 0);
    conn_arm(c, c->srv->o.idle_timeout_ms);
    if (!c->in_parse)
        conn_process(c);
}

/* A protocol error: answer `status` in OpenAI's error shape and close. */
static void conn_fail(struct conn *c, int status, const char *msg)
{
    if (c->state == CONN_CLOSING || c->closed)
        return;
    json_t *o = json_pack("{s:{s:s,s:s,s:n,s:n}}", "error", "message", msg, "type",
                          "invalid_request_error", "param", "code");
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    c->keep_alive = false;
    char framing[64];
    snprintf(framing, sizeof(framing), "Content-Length: %zu\r\n", body ? strlen(body) : 0);
    write_head(c, status, "application/json", NULL, framing, body, body ? strlen(body) : 0);
    free(body);
    TY_LOG_DEBUG("http", "connection error %d: %s", status, msg);
    c->req.ended = true;
    conn_request_done(c);
}

static void on_timer(uv_timer_t *t)
{
    struct conn *c = t->data;
    switch (c->state) {
    case CONN_HEAD: conn_fail(c, 408, "timed out waiting for the request headers"); break;
    case CONN_BODY: conn_fail(c, 408, "timed out waiting for the request body"); break;
    case CONN_HANDLING: break;
    default: conn_close(c); break; /* idle keep-alive, or linger over */
    }
}

/* ---- connection lifecycle ------------------------------------------------------------------ */

static void on_conn_handle_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    if (--c->n_handles > 0)
        return;
    ty_http_server_t *srv = c->srv;
    req_reset(&c->req);
    free(c->in);
    free(c);
    srv->n_alive--;
    server_maybe_freed(srv);
}

static void conn_close(struct conn *c)
{
    if (c->closed)
        return;
    conn_abort_request(c);
    c->closed = true;
    ty_http_server_t *srv = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->n_conns--;
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
}

static void on_connection(uv_stream_t *l, int status)
{
    ty_http_server_t *srv = l->data;
    if (status < 0)
        return;
    struct conn *c = calloc(1, sizeof(*c));
    if (!c)
        return;
    c->srv = srv;
    c->req.conn = c;
    uv_tcp_init(srv->loop, &c->tcp);
    uv_timer_init(srv->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->n_handles = 2;
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->n_conns++;
    srv->n_alive++;
    if (uv_accept(l, (uv_stream_t *)&c->tcp) || srv->n_conns > srv->o.max_connections ||
        !srv->accepting) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    c->state = CONN_IDLE;
    conn_arm(c, srv->o.idle_timeout_ms);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
        c->reading = true;
}

/* ---- server --------------------------------------------------------------------------------- */

static int server_bind(ty_http_server_t *srv)
{
    struct sockaddr_storage ss;
    int rc = uv_ip4_addr(srv->o.host, srv->o.port, (struct sockaddr_in *)&ss);
    if (rc)
        rc = uv_ip6_addr(srv->o.host, srv->o.port, (struct sockaddr_in6 *)&ss);
    if (rc)
        return TY_EINVAL;
    if ((rc = uv_tcp_bind(&srv->listener, (struct sockaddr *)&ss, 0)))
        return rc;
    if ((rc = uv_listen((uv_stream_t *)&srv->listener, 511, on_connection)))
        return rc;
    struct sockaddr_storage got;
    int len = sizeof(got);
    if ((rc = uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&got, &len)))
        return rc;
    srv->port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                : ((struct sockaddr_in *)&got)->sin_port);
    return 0;
}

static void on_listener_closed(uv_handle_t *h)
{
    ty_http_server_t *srv = h->data;
    srv->listener_closed = true;
    server_maybe_freed(srv);
}

static void on_listener_closed_free(uv_handle_t *h)
{
    free(h->data);
}

int ty_http_server_new(ty_http_server_t **out, uv_loop_t *loop,
                       const struct ty_http_server_opts *opts)
{
    if (!out || !loop || !opts || !opts->host || !opts->handler)
        return TY_EINVAL;
    ty_http_server_t *srv = calloc(1, sizeof(*srv));
    if (!srv)
        return TY_ENOMEM;
    srv->loop = loop;
    srv->o = *opts;
    if (!srv->o.max_header_bytes)
        srv->o.max_header_bytes = 16384;
    if (!srv->o.max_body_bytes)
        srv->o.max_body_bytes = 8u << 20;
    if (!srv->o.header_timeout_ms)
        srv->o.header_timeout_ms = 10000;
    if (!srv->o.body_timeout_ms)
        srv->o.body_timeout_ms = 30000;
    if (!srv->o.idle_timeout_ms)
        srv->o.idle_timeout_ms = 60000;
    if (!srv->o.max_connections)
        srv->o.max_connections = 4096;
    http_parser_settings_init(&srv->ps);
    srv->ps.on_message_begin = on_message_begin;
    srv->ps.on_url = on_url;
    srv->ps.on_header_field = on_header_field;
    srv->ps.on_header_value = on_header_value;
    srv->ps.on_headers_complete = on_headers_complete;
    srv->ps.on_body = on_body;
    srv->ps.on_message_complete = on_message_complete;
    srv->accepting = true;
    uv_tcp_init(loop, &srv->listener);
    srv->listener.data = srv;
    int rc = server_bind(srv);
    if (rc) {
        uv_close((uv_handle_t *)&srv->listener, on_listener_closed_free);
        return rc;
    }
    *out = srv;
    return 0;
}

uint16_t ty_http_server_port(const ty_http_server_t *s)
{
    return s->port;
}

void ty_http_server_stop_accepting(ty_http_server_t *s)
{
    s->accepting = false;
}

uint32_t ty_http_server_n_connections(const ty_http_server_t *s)
{
    return s->n_conns;
}

void ty_http_server_close(ty_http_server_t *s, ty_http_closed_cb cb, void *arg)
{
    s->closing = true;
    s->accepting = false;
    s->closed_cb = cb;
    s->closed_arg = arg;
    while (s->conns)
        conn_close(s->conns);
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
}

/* ---- requests --------------------------------------------------------------------------------- */

const char *ty_http_req_method(const ty_http_req_t *r)
{
    return r->method;
}

const char *ty_http_req_path(const ty_http_req_t *r)
{
    if (!r->url)
        return "";
    char *q = strchr(r->url, '?');
    if (q)
        *q = 0; /* the query string is not used by any endpoint */
    return r->url;
}

const char *ty_http_req_header(const ty_http_req_t *r, const char *name)
{
    for (uint32_t i = 0; i < r->n_headers; i++)
        if (r->hval[i] != SIZE_MAX && !strcasecmp(r->hbuf + r->hname[i], name))
            return r->hbuf + r->hval[i];
    return NULL;
}

const char *ty_http_req_body(const ty_http_req_t *r, size_t *len)
{
    if (len)
        *len = r->body_len;
    return r->body ? r->body : "";
}

void ty_http_req_set_abort(ty_http_req_t *r, ty_http_abort_cb cb, void *arg)
{
    r->abort_cb = cb;
    r->abort_arg = arg;
}

size_t ty_http_req_write_queue(const ty_http_req_t *r)
{
    return r->conn->closed ? 0 : uv_stream_get_write_queue_size((uv_stream_t *)&r->conn->tcp);
}

static void req_end(ty_http_req_t *r)
{
    r->ended = true;
    r->abort_cb = NULL;
    conn_request_done(r->conn);
}

int ty_http_respond(ty_http_req_t *r, int status, const char *content_type,
                    const char *extra_headers, const void *body, size_t len)
{
    if (r->ended || r->streaming)
        return TY_EINVAL;
    char framing[64];
    snprintf(framing, sizeof(framing), "Content-Length: %zu\r\n", len);
    int rc = write_head(r->conn, status, content_type, extra_headers, framing, body, len);
    req_end(r);
    return rc;
}

int ty_http_stream_begin(ty_http_req_t *r, int status, const char *content_type,
                         const char *extra_headers)
{
    if (r->ended || r->streaming)
        return TY_EINVAL;
    r->streaming = true;
    struct conn *c = r->conn;
    /* An HTTP/1.0 client gets the body delimited by the connection's close. */
    r->chunked_out = c->parser.http_major > 1 || c->parser.http_minor >= 1;
    if (!r->chunked_out)
        c->keep_alive = false;
    return write_head(c, status, content_type, extra_headers,
                      r->chunked_out ? "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n"
                                     : "Cache-Control: no-cache\r\n",
                      NULL, 0);
}

int ty_http_stream_write(ty_http_req_t *r, const void *data, size_t len)
{
    if (r->ended || !r->streaming)
        return TY_EINVAL;
    if (!len)
        return 0;
    if (!r->chunked_out)
        return conn_write3(r->conn, data, len, NULL, 0, NULL, 0);
    char head[24];
    int n = snprintf(head, sizeof(head), "%zx\r\n", len);
    return conn_write3(r->conn, head, (size_t)n, data, len, "\r\n", 2);
}

int ty_http_stream_end(ty_http_req_t *r)
{
    if (r->ended || !r->streaming)
        return TY_EINVAL;
    int rc = r->chunked_out ? conn_write3(r->conn, "0\r\n\r\n", 5, NULL, 0, NULL, 0) : 0;
    req_end(r);
    return rc;
}
