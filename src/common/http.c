/* HTTP/1.1 server: connections, parsing, limits, timeouts and responses (see tycho/http.h).
 *
 * A connection reads into `in`; while no request is being handled, http-parser runs over it
 * and pauses itself at the end of each message, so a pipelined next request stays buffered
 * until the response to the current one has ended. One timer per connection carries the
 * current deadline (idle, headers or body). Errors close the connection after the error
 * response is flushed (write, shutdown, then read to EOF or a short linger).
 *
 * Output goes into the connection's buffer (`out`: a list of blocks) and connections with
 * something buffered are on the server's dirty list; a uv_check hook (after the I/O callbacks
 * of a loop turn) and a uv_prepare hook (before the loop waits, for what timers wrote) flush
 * each: one uv_try_write of every buffered block, the remainder handed to one uv_write that
 * owns its blocks until it completes; while it is in flight new output collects behind it.
 *
 * TLS (opts.tls_cert/tls_key) sits under all of this, in two memory BIOs per connection: bytes
 * read from the socket go into the session's read BIO and what it decrypts is appended to `in`
 * (tls_read), so parsing, limits and back-pressure see plaintext exactly as without TLS; at
 * flush time the plaintext blocks are sealed into records (tls_seal) and the ciphertext the
 * write BIO holds becomes the one block the flush hands to the socket. The handshake's bytes
 * and the close_notify before a shutdown go out the same way. A reload swaps the server's
 * SSL_CTX; a session holds a reference to the one it started with.
 */
#include "tycho/http.h"

#include "tls-impl.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <ctype.h>
#include <http_parser.h>
#include <jansson.h>
#include <openssl/err.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define IN_MAX_BUFFERED (256u * 1024u) /* pipelined bytes held while handling */
#define LINGER_MS 1000u
#define MAX_HEADERS 64
#define OUT_BLOCK (16u * 1024u)    /* output blocks (redis's reply blocks are 16 KiB too) */
#define OUT_MAX_IOV 64             /* blocks per write; more wait for the next */
#define FRAME_HEAD 10              /* a frame's chunk-size line: "ffffffff\r\n" at most */
#define FRAME_MIN_ROOM 512         /* a frame starts in a block with this much room left */
#define TLS_READ_BUF (64u * 1024u) /* ciphertext of one socket read */

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
    char id[TY_HTTP_REQUEST_ID_MAX + 1]; /* x-request-id: the client's, or made here */
};

/* A block of output: bytes [off, len) are not yet handed to the socket. */
struct oblk {
    struct oblk *next;
    size_t off, len, cap;
    char data[];
};

/* The one write in flight on a connection: it owns its blocks until it completes. */
struct wreq {
    uv_write_t w;
    struct conn *c;
    struct oblk *blks;
    size_t bytes;
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
    /* output */
    struct oblk *out_head, *out_tail; /* buffered, not handed to the socket */
    size_t out_bytes;
    struct wreq *writing;             /* in flight, or NULL */
    struct conn *dprev, *dnext;       /* the server's dirty list */
    bool dirty, shutdown_wanted, frame_open;
    size_t frame_start, frame_head;   /* the open frame: its offset in out_tail, head room */
    ty_http_flush_cb flush_cb;
    void *flush_arg;
    uint64_t flush_tag;
    /* TLS, or all NULL: the session and its BIOs (owned by the session) */
    SSL *ssl;
    BIO *rbio, *wbio;
    bool tls_shut; /* close_notify written */
};

struct ty_http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    struct ty_http_server_opts o;
    http_parser_settings ps;
    struct conn *conns;
    uint32_t n_conns;
    bool accepting, closing;
    uint64_t id_seed, n_ids; /* request ids made here: seed (per server) and a counter */
    ty_http_closed_cb closed_cb;
    void *closed_arg;
    uint16_t port;
    uint32_t n_alive; /* connections not yet freed */
    int n_own_handles; /* listener, check, prepare: freed once all three closed */
    uv_check_t check;   /* flushes after a turn's I/O callbacks */
    uv_prepare_t prepare; /* flushes what timers and close callbacks wrote, before waiting */
    struct conn *dirty; /* connections with output to flush */
    bool flushing;      /* the hooks are started */
    SSL_CTX *tls;       /* NULL: plain HTTP. New connections take the current one */
    char *tls_in;       /* (TLS_READ_BUF) where one socket read lands before decryption */
};

/* After close: free the server once its own handles and every connection are gone. */
static void server_maybe_freed(ty_http_server_t *srv)
{
    if (!srv->closing || srv->n_own_handles || srv->n_alive)
        return;
    ty_http_closed_cb cb = srv->closed_cb;
    void *arg = srv->closed_arg;
    SSL_CTX_free(srv->tls);
    free(srv->tls_in);
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

/* ---- the output buffer ---------------------------------------------------------------- */

static void on_flush_hook(uv_handle_t *h);
static void on_check(uv_check_t *h)
{
    on_flush_hook((uv_handle_t *)h);
}

static void on_prepare(uv_prepare_t *h)
{
    on_flush_hook((uv_handle_t *)h);
}

static void conn_mark_dirty(struct conn *c)
{
    ty_http_server_t *srv = c->srv;
    if (c->dirty || c->closed)
        return;
    c->dirty = true;
    c->dprev = NULL;
    c->dnext = srv->dirty;
    if (srv->dirty)
        srv->dirty->dprev = c;
    srv->dirty = c;
    if (!srv->flushing) {
        srv->flushing = true;
        uv_check_start(&srv->check, on_check);
        uv_prepare_start(&srv->prepare, on_prepare);
    }
}

static void conn_unmark_dirty(struct conn *c)
{
    if (!c->dirty)
        return;
    c->dirty = false;
    if (c->dprev)
        c->dprev->dnext = c->dnext;
    else
        c->srv->dirty = c->dnext;
    if (c->dnext)
        c->dnext->dprev = c->dprev;
    c->dprev = c->dnext = NULL;
}

static struct oblk *oblk_new(size_t cap)
{
    struct oblk *b = malloc(sizeof(*b) + cap);
    if (!b)
        return NULL;
    b->next = NULL;
    b->off = b->len = 0;
    b->cap = cap;
    return b;
}

static void oblk_free_list(struct oblk *b)
{
    while (b) {
        struct oblk *next = b->next;
        free(b);
        b = next;
    }
}

/* A new tail block with room for `n` bytes (NULL: out of memory). */
static struct oblk *out_add_block(struct conn *c, size_t n)
{
    struct oblk *b = oblk_new(n > OUT_BLOCK ? n : OUT_BLOCK);
    if (!b)
        return NULL;
    if (c->out_tail)
        c->out_tail->next = b;
    else
        c->out_head = b;
    c->out_tail = b;
    return b;
}

/* Append n bytes. Returns 0, TY_ENOTCONN (closing: dropped) or TY_ENOMEM. */
static int out_put(struct conn *c, const void *p, size_t n)
{
    if (c->closed || uv_is_closing((uv_handle_t *)&c->tcp))
        return TY_ENOTCONN;
    TY_ASSERT(!c->frame_open);
    struct oblk *b = c->out_tail;
    if (!b || b->cap - b->len < n) {
        /* fill the tail first only when the piece is small (a large body gets its own) */
        size_t room = b ? b->cap - b->len : 0;
        if (b && room && n <= OUT_BLOCK) {
            memcpy(b->data + b->len, p, room);
            b->len += room;
            c->out_bytes += room;
            p = (const char *)p + room;
            n -= room;
        }
        if (!(b = out_add_block(c, n)))
            return TY_ENOMEM;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    c->out_bytes += n;
    conn_mark_dirty(c);
    return 0;
}

static size_t tls_pending(const struct conn *c);

static void on_write(uv_write_t *w, int status)
{
    struct wreq *wr = (struct wreq *)w;
    struct conn *c = wr->c;
    oblk_free_list(wr->blks);
    free(wr);
    c->writing = NULL;
    if (c->closed)
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    if (c->out_bytes || c->shutdown_wanted || tls_pending(c))
        conn_mark_dirty(c);
}

static void on_shutdown(uv_shutdown_t *sh, int status)
{
    free(sh);
}

/* Drop blocks whose bytes were all written, keeping one empty block to fill next. */
static void out_consume(struct conn *c, size_t n)
{
    c->out_bytes -= n;
    while (c->out_head) {
        struct oblk *b = c->out_head;
        size_t k = b->len - b->off < n ? b->len - b->off : n;
        b->off += k;
        n -= k;
        if (b->off < b->len)
            break;
        if (b == c->out_tail) { /* reuse it */
            b->off = b->len = 0;
            break;
        }
        c->out_head = b->next;
        free(b);
    }
}

/* ---- TLS under the buffers ------------------------------------------------------------------ */

/* Ciphertext the session wrote that is not yet in `out` (handshake, records, close_notify). */
static size_t tls_pending(const struct conn *c)
{
    return c->ssl ? BIO_ctrl_pending(c->wbio) : 0;
}

/* Seal every buffered plaintext block into TLS records and put the ciphertext in their place
 * (one block). Returns 0, TY_ENOMEM or TY_EPROTO (the connection must close). */
static int tls_seal(struct conn *c)
{
    for (struct oblk *b = c->out_head; b; b = b->next) {
        size_t done;
        if (b->len > b->off &&
            SSL_write_ex(c->ssl, b->data + b->off, b->len - b->off, &done) != 1) {
            ERR_clear_error();
            return TY_EPROTO;
        }
    }
    out_consume(c, c->out_bytes);
    size_t n = BIO_ctrl_pending(c->wbio);
    if (!n)
        return 0;
    struct oblk *b = c->out_tail; /* emptied by out_consume, or none */
    if ((!b || b->len || b->cap < n) && !(b = out_add_block(c, n)))
        return TY_ENOMEM;
    if (BIO_read(c->wbio, b->data + b->len, (int)n) != (int)n)
        return TY_EPROTO;
    b->len += n;
    c->out_bytes += n;
    return 0;
}

/* Room for `min` more bytes in `in`. Returns false when out of memory. */
static bool in_reserve(struct conn *c, size_t min)
{
    if (c->in_cap - c->in_len >= min)
        return true;
    size_t nc = c->in_cap ? c->in_cap * 2 : 32768;
    while (nc - c->in_len < min)
        nc *= 2;
    char *ni = realloc(c->in, nc);
    if (!ni)
        return false;
    c->in = ni;
    c->in_cap = nc;
    return true;
}

/* Feed n bytes read from the socket to the session and append what it decrypts to `in` (the
 * handshake runs inside SSL_read). Returns 0, or TY_ECONNRESET (the client's close_notify),
 * TY_EPROTO (not TLS, a failed handshake, a bad record) or TY_ENOMEM: close the connection. */
static int tls_read(struct conn *c, const char *data, size_t n)
{
    if (n && BIO_write(c->rbio, data, (int)n) != (int)n)
        return TY_ENOMEM;
    for (;;) {
        size_t got = 0;
        if (!in_reserve(c, 16384))
            return TY_ENOMEM;
        int r = SSL_read_ex(c->ssl, c->in + c->in_len, c->in_cap - c->in_len, &got);
        if (r == 1) {
            c->in_len += got;
            continue;
        }
        int e = SSL_get_error(c->ssl, r);
        if (tls_pending(c))
            conn_mark_dirty(c); /* handshake replies, session tickets, alerts */
        if (e == SSL_ERROR_WANT_READ)
            return 0;
        if (e == SSL_ERROR_ZERO_RETURN)
            return TY_ECONNRESET;
        char why[160] = "";
        unsigned long err = ERR_peek_error();
        if (err)
            ERR_error_string_n(err, why, sizeof(why));
        ERR_clear_error();
        TY_LOG_DEBUG("http", "TLS connection dropped: %s", why[0] ? why : "protocol error");
        return TY_EPROTO;
    }
}

/* Hand what is buffered to the socket: one uv_try_write, the rest as one uv_write. */
static void conn_flush(struct conn *c)
{
    if (c->ssl && tls_seal(c)) {
        conn_close(c);
        return;
    }
    uv_buf_t bufs[OUT_MAX_IOV];
    unsigned n = 0;
    size_t bytes = 0;
    struct oblk *last = NULL;
    for (struct oblk *b = c->out_head; b && n < OUT_MAX_IOV; b = b->next) {
        if (b->len > b->off)
            bufs[n++] = uv_buf_init(b->data + b->off, (unsigned)(b->len - b->off));
        bytes += b->len - b->off;
        last = b;
    }
    int k = n ? uv_try_write((uv_stream_t *)&c->tcp, bufs, n) : 0;
    if (k < 0 && k != UV_EAGAIN) {
        conn_close(c);
        return;
    }
    size_t done = k > 0 ? (size_t)k : 0;
    out_consume(c, done);
    if (done == bytes)
        return;
    /* the rest of the blocks up to `last` go to one write that owns them */
    struct wreq *wr = malloc(sizeof(*wr));
    if (!wr)
        abort(); /* small metadata allocation (STYLE.md) */
    wr->c = c;
    wr->blks = c->out_head;
    wr->bytes = bytes - done;
    n = 0;
    for (struct oblk *b = c->out_head;; b = b->next) {
        if (b->len > b->off)
            bufs[n++] = uv_buf_init(b->data + b->off, (unsigned)(b->len - b->off));
        if (b == last)
            break;
    }
    c->out_head = last->next;
    if (!c->out_head)
        c->out_tail = NULL;
    last->next = NULL;
    c->out_bytes -= wr->bytes;
    if (uv_write(&wr->w, (uv_stream_t *)&c->tcp, bufs, n, on_write)) {
        oblk_free_list(wr->blks);
        free(wr);
        conn_close(c);
        return;
    }
    c->writing = wr;
}

/* The flush of one connection, then what follows from it: the flush callback, a shutdown
 * that waited for the output, the cut of a stream whose client does not keep up. */
static void conn_flush_turn(struct conn *c, uint64_t now_ns)
{
    if (!c->writing && (c->out_bytes || tls_pending(c)))
        conn_flush(c);
    if (c->closed)
        return;
    if (c->flush_cb && !c->out_bytes) {
        ty_http_flush_cb cb = c->flush_cb;
        c->flush_cb = NULL;
        cb(c->flush_arg, c->flush_tag, now_ns);
    }
    if (c->shutdown_wanted && !c->out_bytes) {
        if (c->ssl && !c->tls_shut) { /* close_notify, after the response's records */
            c->tls_shut = true;
            SSL_shutdown(c->ssl);
            ERR_clear_error();
            if (!c->writing)
                conn_flush(c);
            if (c->closed)
                return;
        }
        if (c->out_bytes || tls_pending(c))
            return; /* behind the write in flight: on_write brings the connection back */
        c->shutdown_wanted = false;
        uv_shutdown_t *sh = malloc(sizeof(*sh));
        if (!sh || uv_shutdown(sh, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
            free(sh);
            conn_close(c);
        }
        return;
    }
    if (!c->out_bytes && c->out_head && c->state != CONN_HANDLING) {
        oblk_free_list(c->out_head); /* an idle connection keeps no output block */
        c->out_head = c->out_tail = NULL;
    }
    size_t unsent = c->out_bytes + (c->writing ? c->writing->bytes : 0);
    if (unsent > c->srv->o.max_output_bytes && c->state == CONN_HANDLING && c->req.streaming &&
        !c->req.ended) {
        TY_LOG_WARN("http", "a client reads its stream too slowly (%zu bytes not taken, limit "
                            "%zu): request aborted, connection closed", unsent,
                    c->srv->o.max_output_bytes);
        conn_close(c);
    }
}

static void on_flush_hook(uv_handle_t *h)
{
    ty_http_server_t *srv = h->data;
    uint64_t now = ty_clock_ns();
    while (srv->dirty) {
        struct conn *c = srv->dirty;
        conn_unmark_dirty(c);
        if (!c->closed)
            conn_flush_turn(c, now);
    }
    srv->flushing = false;
    uv_check_stop(&srv->check);
    uv_prepare_stop(&srv->prepare);
}

static int write_head(struct conn *c, int status, const char *ctype, const char *extra,
                      const char *framing, const void *body, size_t blen)
{
    char head[1024], idh[TY_HTTP_REQUEST_ID_MAX + 24] = "";
    if (c->req.id[0])
        snprintf(idh, sizeof(idh), "x-request-id: %s\r\n", c->req.id);
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s%s%sConnection: %s\r\n\r\n",
                     status, ty_http_status_text(status), ctype ? ctype : "application/json",
                     framing, idh, extra ? extra : "", c->keep_alive ? "keep-alive" : "close");
    if (n < 0 || (size_t)n >= sizeof(head))
        return TY_EINVAL;
    int rc = out_put(c, head, (size_t)n);
    return rc || !blen ? rc : out_put(c, body, blen);
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
        out_put(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
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

/* The client's x-request-id when it is 1..64 characters of [A-Za-z0-9._:-], else one made
 * here (hex, unique per server). */
static void req_set_id(struct conn *c)
{
    const char *h = ty_http_req_header(&c->req, "x-request-id");
    size_t n = h ? strlen(h) : 0;
    bool good = n > 0 && n <= TY_HTTP_REQUEST_ID_MAX;
    for (size_t i = 0; good && i < n; i++)
        good = isalnum((unsigned char)h[i]) || strchr("._:-", h[i]);
    if (good)
        memcpy(c->req.id, h, n + 1);
    else
        snprintf(c->req.id, sizeof(c->req.id), "%08llx%08llx",
                 (unsigned long long)(c->srv->id_seed & 0xffffffffu),
                 (unsigned long long)++c->srv->n_ids);
}

static int on_message_complete(http_parser *p)
{
    struct conn *c = p->data;
    if (!c->req.body && buf_append(&c->req.body, &c->req.body_len, &c->req.body_cap, "", 0))
        return 1;
    req_set_id(c);
    c->state = CONN_HANDLING;
    uv_timer_stop(&c->timer);
    http_parser_pause(p, 1);
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = h->data;
    if (c->ssl) /* ciphertext: decrypted into `in` by tls_read, before the next read */
        *buf = uv_buf_init(c->srv->tls_in, TLS_READ_BUF);
    else if (!in_reserve(c, 16384))
        *buf = uv_buf_init(NULL, 0);
    else
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
    if (!c->ssl) {
        c->in_len += (size_t)n;
    } else if (tls_read(c, buf->base, (size_t)n)) {
        conn_abort_request(c);
        conn_close(c);
        return;
    }
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

/* The response ended: go back to reading the next request. */
static void conn_request_done(struct conn *c)
{
    if (c->closed || c->state == CONN_CLOSING)
        return;
    if (!c->keep_alive) {
        /* shut down once the response is out (conn_flush_turn), then linger */
        c->state = CONN_CLOSING;
        c->shutdown_wanted = true;
        conn_mark_dirty(c);
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
    conn_unmark_dirty(c);
    oblk_free_list(c->out_head);
    SSL_free(c->ssl); /* and its BIOs */
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
    conn_unmark_dirty(c);
    c->flush_cb = NULL;
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

/* A server-side TLS session on two memory BIOs. Returns 0 or TY_ENOMEM. */
static int conn_tls_start(struct conn *c, SSL_CTX *ctx)
{
    if (!(c->ssl = SSL_new(ctx)))
        goto err;
    c->rbio = BIO_new(BIO_s_mem());
    c->wbio = BIO_new(BIO_s_mem());
    if (!c->rbio || !c->wbio) {
        BIO_free(c->rbio);
        BIO_free(c->wbio);
        c->rbio = c->wbio = NULL;
        goto err;
    }
    BIO_set_mem_eof_return(c->rbio, -1); /* empty: "want more", not end of stream */
    SSL_set_bio(c->ssl, c->rbio, c->wbio);
    SSL_set_accept_state(c->ssl);
    return 0;
err:
    ERR_clear_error();
    return TY_ENOMEM;
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
    if (srv->tls && conn_tls_start(c, srv->tls)) {
        conn_close(c);
        return;
    }
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

static void on_own_handle_closed(uv_handle_t *h)
{
    ty_http_server_t *srv = h->data;
    srv->n_own_handles--;
    server_maybe_freed(srv);
}

static void on_listener_closed_free(uv_handle_t *h)
{
    ty_http_server_t *srv = h->data;
    SSL_CTX_free(srv->tls);
    free(srv->tls_in);
    free(srv);
}

/* Load (or replace) the server's TLS context from PEM files; nothing changes on failure.
 * Returns 0, TY_EINVAL (only one of the two), TY_ECONFIG (logged) or TY_ENOMEM. */
static int server_tls_load(ty_http_server_t *srv, const char *cert, const char *key)
{
    if (!cert && !key)
        return 0;
    if (!cert || !key)
        return TY_EINVAL;
    const char *field = "";
    char why[512] = "";
    SSL_CTX *ctx;
    int rc = ty__tls_server_ctx_new(&ctx, cert, key, &field, why, sizeof(why));
    if (rc == TY_ECONFIG)
        TY_LOG_ERROR("http", "%s: %s", field, why);
    if (rc)
        return rc;
    if (!srv->tls_in && !(srv->tls_in = malloc(TLS_READ_BUF))) {
        SSL_CTX_free(ctx);
        return TY_ENOMEM;
    }
    SSL_CTX_free(srv->tls); /* sessions that use it hold their own reference */
    srv->tls = ctx;
    return 0;
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
    if (!srv->o.max_output_bytes)
        srv->o.max_output_bytes = 4u << 20;
    http_parser_settings_init(&srv->ps);
    srv->ps.on_message_begin = on_message_begin;
    srv->ps.on_url = on_url;
    srv->ps.on_header_field = on_header_field;
    srv->ps.on_header_value = on_header_value;
    srv->ps.on_headers_complete = on_headers_complete;
    srv->ps.on_body = on_body;
    srv->ps.on_message_complete = on_message_complete;
    srv->id_seed = ty_clock_ns() ^ ((uint64_t)getpid() << 32);
    srv->accepting = true;
    int rc = server_tls_load(srv, opts->tls_cert, opts->tls_key);
    if (rc) {
        free(srv);
        return rc;
    }
    srv->o.tls_cert = srv->o.tls_key = NULL; /* borrowed for the call only */
    uv_tcp_init(loop, &srv->listener);
    srv->listener.data = srv;
    rc = server_bind(srv);
    if (rc) {
        uv_close((uv_handle_t *)&srv->listener, on_listener_closed_free);
        return rc;
    }
    uv_check_init(loop, &srv->check);
    uv_prepare_init(loop, &srv->prepare);
    srv->check.data = srv->prepare.data = srv;
    srv->n_own_handles = 3;
    *out = srv;
    return 0;
}

uint16_t ty_http_server_port(const ty_http_server_t *s)
{
    return s->port;
}

bool ty_http_server_tls(const ty_http_server_t *s)
{
    return s->tls != NULL;
}

int ty_http_server_set_tls(ty_http_server_t *s, const char *cert, const char *key)
{
    if (!s->tls || !cert || !key)
        return TY_EINVAL;
    return server_tls_load(s, cert, key);
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
    uv_close((uv_handle_t *)&s->listener, on_own_handle_closed);
    uv_close((uv_handle_t *)&s->check, on_own_handle_closed);
    uv_close((uv_handle_t *)&s->prepare, on_own_handle_closed);
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

const char *ty_http_req_id(const ty_http_req_t *r)
{
    return r->id;
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
    const struct conn *c = r->conn;
    return c->closed ? 0 : c->out_bytes + (c->writing ? c->writing->bytes : 0);
}

void ty_http_req_on_flush(ty_http_req_t *r, ty_http_flush_cb cb, void *arg, uint64_t tag)
{
    struct conn *c = r->conn;
    if (c->closed)
        return;
    c->flush_cb = cb;
    c->flush_arg = arg;
    c->flush_tag = tag;
    conn_mark_dirty(c);
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

int ty_http_frame_begin(ty_http_req_t *r, struct ty_http_frame *f)
{
    struct conn *c = r->conn;
    if (r->ended || !r->streaming)
        return TY_EINVAL;
    if (c->closed || uv_is_closing((uv_handle_t *)&c->tcp))
        return TY_ENOTCONN;
    TY_ASSERT(!c->frame_open);
    struct oblk *b = c->out_tail;
    if (!b || b->cap - b->len < FRAME_HEAD + FRAME_MIN_ROOM + 2) {
        if (b && b->len == b->off && b->cap >= FRAME_HEAD + FRAME_MIN_ROOM + 2)
            b->off = b->len = 0; /* an emptied tail: start it over */
        else if (!(b = out_add_block(c, OUT_BLOCK)))
            abort(); /* small metadata allocation (STYLE.md) */
    }
    c->frame_open = true;
    c->frame_start = b->len;
    c->frame_head = r->chunked_out ? FRAME_HEAD : 0;
    f->req = r;
    f->p = b->data + b->len + c->frame_head;
    f->end = b->data + b->cap - 2; /* the chunk's closing CRLF always fits */
    return 0;
}

void ty__http_frame_grow(struct ty_http_frame *f, size_t n)
{
    struct conn *c = f->req->conn;
    struct oblk *old = c->out_tail;
    char *start = old->data + c->frame_start;
    size_t used = (size_t)(f->p - start), need = used + n + 2;
    struct oblk *b = oblk_new(2 * need > OUT_BLOCK ? 2 * need : OUT_BLOCK);
    if (!b)
        abort(); /* output is our own text, small per frame (STYLE.md) */
    memcpy(b->data, start, used);
    if (old->len == old->off && c->out_head == old) { /* it held only this frame: replace */
        c->out_head = b;
        free(old);
    } else {
        old->next = b;
    }
    c->out_tail = b;
    c->frame_start = 0;
    f->p = b->data + used;
    f->end = b->data + b->cap - 2;
}

int ty_http_frame_end(struct ty_http_frame *f)
{
    struct conn *c = f->req->conn;
    struct oblk *b = c->out_tail;
    char *start = b->data + c->frame_start;
    size_t body = (size_t)(f->p - start) - c->frame_head, total = body;
    c->frame_open = false;
    if (!body)
        return 0;
    if (c->frame_head) { /* the chunk-size line in front, the CRLF after */
        char head[FRAME_HEAD + 1];
        int k = snprintf(head, sizeof(head), "%zx\r\n", body);
        memmove(start + k, start + c->frame_head, body);
        memcpy(start, head, (size_t)k);
        memcpy(start + k + body, "\r\n", 2);
        total = (size_t)k + body + 2;
    }
    b->len = c->frame_start + total;
    c->out_bytes += total;
    conn_mark_dirty(c);
    return 0;
}

int ty_http_stream_write(ty_http_req_t *r, const void *data, size_t len)
{
    struct ty_http_frame f;
    if (!len)
        return r->ended || !r->streaming ? TY_EINVAL : 0;
    int rc = ty_http_frame_begin(r, &f);
    if (rc)
        return rc;
    ty_http_frame_put(&f, data, len);
    return ty_http_frame_end(&f);
}

int ty_http_stream_end(ty_http_req_t *r)
{
    if (r->ended || !r->streaming)
        return TY_EINVAL;
    int rc = r->chunked_out ? out_put(r->conn, "0\r\n\r\n", 5) : 0;
    req_end(r);
    return rc;
}
