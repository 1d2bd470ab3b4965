/* libFuzzer target for the HTTP/1.1 request glue of the front door (src/common/http.c).
 *
 * http.c has no pure entry point: its http-parser callbacks live on a connection. So the target
 * runs the real server on 127.0.0.1 in this process and sends each input over a real loopback
 * TCP connection (libuv on one loop for both ends, the client from a fresh 127.x.y.z source
 * address each time), then half-closes and reads until the server closes. The first input byte picks how the handler answers (bit 0: whole response or chunked
 * stream; bit 1: at once or on a later loop turn, so pipelined requests wait buffered and a
 * client that leaves aborts the request; bit 2: a stream's in-place frame also grows past an
 * output block); the rest are the bytes on the wire. A stream sends the body twice: as one
 * piece, and formatted in place (ty_http_frame_*) in 7-byte puts.
 *
 * Checked: every request handed to the handler has a method, a body within the limit and
 * NUL-terminated, and header lookups that return NUL-terminated strings; everything the server
 * writes back parses as a sequence of HTTP/1.1 responses (http-parser in response mode, an
 * independent reader), each with a status the server can send; nothing is left open. */
#include "tycho/http.h"

#include <http_parser.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define FUZZ_MAX_BODY 4096
#define FUZZ_MAX_HEADER 2048

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A failed check names itself before aborting, so a crash report says which promise broke. */
#define check(cond) ((cond) ? (void)0 : check_failed(__LINE__, #cond))
static void check_failed(int line, const char *what)
{
    fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, line, what);
    abort();
}

static uv_loop_t g_loop;
static ty_http_server_t *g_srv;
static uv_timer_t g_later; /* answers deferred requests */

static struct {
    unsigned mode;
    ty_http_req_t *pending; /* deferred, not yet answered */
    unsigned n_handled;
} g;

static void answer(ty_http_req_t *r)
{
    size_t blen = 0;
    const char *body = ty_http_req_body(r, &blen);
    if (g.mode & 1) {
        ty_http_stream_begin(r, 200, "text/event-stream", NULL);
        ty_http_stream_write(r, "data: x\n\n", 9);
        ty_http_stream_write(r, body, blen);
        struct ty_http_frame f;
        if (ty_http_frame_begin(r, &f) == 0) {
            for (size_t i = 0; i < blen; i += 7)
                ty_http_frame_put(&f, body + i, blen - i < 7 ? blen - i : 7);
            if (g.mode & 4) {
                memset(ty_http_frame_room(&f, 20000), 'y', 20000);
                f.p += 20000;
            }
            ty_http_frame_end(&f);
        }
        ty_http_stream_end(r);
    } else {
        ty_http_respond(r, 200, "application/octet-stream", "X-Fuzz: 1\r\n", body, blen);
    }
}

static void on_abort(void *arg, ty_http_req_t *r)
{
    (void)arg;
    check(r == g.pending);
    g.pending = NULL;
}

static void on_later(uv_timer_t *t)
{
    (void)t;
    ty_http_req_t *r = g.pending;
    g.pending = NULL;
    if (r) {
        ty_http_req_set_abort(r, NULL, NULL);
        answer(r);
    }
}

static void handler(void *arg, ty_http_req_t *r)
{
    (void)arg;
    g.n_handled++;
    check(g.pending == NULL); /* one request at a time per connection */
    const char *m = ty_http_req_method(r);
    check(m && m[0]);
    const char *path = ty_http_req_path(r);
    check(path && !strchr(path, '?'));
    size_t blen = 0;
    const char *body = ty_http_req_body(r, &blen);
    check(body && blen <= FUZZ_MAX_BODY && body[blen] == 0);
    const char *names[] = {"host", "content-length", "transfer-encoding", "expect", "x"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const char *v = ty_http_req_header(r, names[i]);
        if (v)
            check(strlen(v) <= FUZZ_MAX_HEADER);
    }
    if (g.mode & 2) {
        g.pending = r;
        ty_http_req_set_abort(r, on_abort, NULL);
        uv_timer_start(&g_later, on_later, 0, 0);
        return;
    }
    answer(r);
}

/* ---- the client end -------------------------------------------------------------------- */

struct client {
    uv_tcp_t tcp;
    uv_connect_t conn;
    uv_write_t w;
    uv_shutdown_t sh;
    char *out;
    size_t out_len;
    char in[1 << 16];
    size_t in_len;
    bool truncated, done;
};

static void on_client_closed(uv_handle_t *h)
{
    ((struct client *)h->data)->done = true;
}

static void on_client_alloc(uv_handle_t *h, size_t sz, uv_buf_t *buf)
{
    struct client *c = h->data;
    static char sink[4096];
    (void)sz;
    if (c->in_len < sizeof(c->in))
        *buf = uv_buf_init(c->in + c->in_len, (unsigned)(sizeof(c->in) - c->in_len));
    else
        *buf = uv_buf_init(sink, sizeof(sink));
}

static void on_client_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct client *c = s->data;
    if (n > 0) {
        if (buf->base == c->in + c->in_len)
            c->in_len += (size_t)n;
        else
            c->truncated = true;
        return;
    }
    if (n < 0 && !uv_is_closing((uv_handle_t *)s))
        uv_close((uv_handle_t *)s, on_client_closed);
}

static void on_client_shutdown(uv_shutdown_t *sh, int status)
{
    (void)sh;
    (void)status;
}

static void on_client_write(uv_write_t *w, int status)
{
    struct client *c = w->data;
    if (status == 0)
        uv_shutdown(&c->sh, (uv_stream_t *)&c->tcp, on_client_shutdown);
}

static void on_client_connect(uv_connect_t *req, int status)
{
    struct client *c = req->data;
    check(status == 0);
    check(uv_read_start((uv_stream_t *)&c->tcp, on_client_alloc, on_client_read) == 0);
    uv_buf_t b = uv_buf_init(c->out, (unsigned)c->out_len);
    c->w.data = c;
    check(uv_write(&c->w, (uv_stream_t *)&c->tcp, &b, 1, on_client_write) == 0);
}

/* ---- checking what came back -------------------------------------------------------------- */

static int on_resp_complete(http_parser *p)
{
    int st = (int)p->status_code;
    check(st == 100 || st == 200 || st == 400 || st == 408 || st == 413 || st == 431);
    (*(unsigned *)p->data)++;
    return 0;
}

static void check_responses(const struct client *c)
{
    if (c->truncated || c->in_len == 0)
        return;
    http_parser p;
    http_parser_settings ps;
    http_parser_settings_init(&ps);
    ps.on_message_complete = on_resp_complete;
    unsigned n_resp = 0;
    http_parser_init(&p, HTTP_RESPONSE);
    p.data = &n_resp;
    size_t used = http_parser_execute(&p, &ps, c->in, c->in_len);
    check(HTTP_PARSER_ERRNO(&p) == HPE_OK && used == c->in_len);
    http_parser_execute(&p, &ps, NULL, 0); /* EOF ends a close-delimited body */
    check(HTTP_PARSER_ERRNO(&p) == HPE_OK);
    check(n_resp >= 1);
}

static void setup(void)
{
    check(uv_loop_init(&g_loop) == 0);
    uv_timer_init(&g_loop, &g_later);
    struct ty_http_server_opts o = {.host = "127.0.0.1",
                                    .max_header_bytes = FUZZ_MAX_HEADER,
                                    .max_body_bytes = FUZZ_MAX_BODY,
                                    .handler = handler};
    check(ty_http_server_new(&g_srv, &g_loop, &o) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_srv)
        setup();
    if (size < 1)
        return 0;
    g.mode = data[0];
    g.pending = NULL;
    g.n_handled = 0;
    static struct client c;
    memset(&c, 0, sizeof(c));
    c.out = malloc(size);
    check(c.out != NULL);
    memcpy(c.out, data + 1, size - 1);
    c.out_len = size - 1;
    uv_tcp_init(&g_loop, &c.tcp);
    c.tcp.data = c.conn.data = &c;
    /* The client closes first, so each run leaves a TIME_WAIT socket for 60 s. A new source
     * address in 127.0.0.0/8 per run keeps them from using up 127.0.0.1's ephemeral ports. */
    static uint32_t n_runs;
    uint32_t k = n_runs++ % (254u * 254u * 254u);
    char src[32];
    snprintf(src, sizeof(src), "127.%u.%u.%u", 1 + k / (254u * 254u), 1 + k / 254u % 254u,
             1 + k % 254u);
    struct sockaddr_in sa;
    uv_ip4_addr(src, 0, &sa);
    check(uv_tcp_bind(&c.tcp, (struct sockaddr *)&sa, 0) == 0);
    uv_ip4_addr("127.0.0.1", ty_http_server_port(g_srv), &sa);
    check(uv_tcp_connect(&c.conn, &c.tcp, (struct sockaddr *)&sa, on_client_connect) == 0);
    while (!c.done)
        uv_run(&g_loop, UV_RUN_ONCE);
    /* The server sees the client's FIN or RST on its next reads: let it close its end. */
    while (ty_http_server_n_connections(g_srv) || g.pending)
        uv_run(&g_loop, UV_RUN_ONCE);
    uv_timer_stop(&g_later);
    check(g.pending == NULL);
    check_responses(&c);
    free(c.out);
    return 0;
}
