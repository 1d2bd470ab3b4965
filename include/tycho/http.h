/* HTTP/1.1 server on libuv with http-parser: keep-alive, pipelining (one request at a time
 * per connection, later ones wait buffered), limits on header and body size, header and body
 * read timeouts, chunked request bodies, chunked streaming responses; optionally HTTPS only
 * (OpenSSL on memory BIOs under the same buffers, certificate reloadable).
 *
 * Output: every response byte is appended to its connection's output buffer (blocks of
 * 16 KiB, more for a larger piece) and the buffers of all connections written to are handed
 * to their sockets once per loop turn (a uv_check and a uv_prepare hook: one uv_try_write,
 * the rest one uv_write), so a streamed token costs a copy, not a write. A streaming response
 * whose client reads too slowly for its unsent bytes to stay under `max_output_bytes` is cut:
 * logged, its abort callback run, the connection closed.
 *
 * Threading: a server, its connections and its requests belong to the loop given at creation;
 * every function here is loop-thread only. Ownership: the server owns each request; a handler
 * borrows it until it ends the response (ty_http_respond / ty_http_stream_end) or until the
 * request's abort callback runs (client gone), whichever comes first. After either, the
 * pointer is dead. Errors the server detects itself (malformed HTTP, 408, 413, 431) are
 * answered in OpenAI's error shape and the connection is closed.
 */
#ifndef TYCHO_HTTP_H
#define TYCHO_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <uv.h>

typedef struct ty_http_server ty_http_server_t;
typedef struct ty_http_req ty_http_req_t;

/* A complete request arrived (headers and body). Respond now or later. */
typedef void (*ty_http_handler_cb)(void *arg, ty_http_req_t *req);
/* The connection of an unfinished request went away; `req` is invalid after this returns. */
typedef void (*ty_http_abort_cb)(void *arg, ty_http_req_t *req);
typedef void (*ty_http_closed_cb)(void *arg);

struct ty_http_server_opts {
    const char *host;           /* "127.0.0.1" */
    uint16_t port;              /* 0: ephemeral (see ty_http_server_port) */
    size_t max_header_bytes;    /* request line + headers; 0 = 16 KiB; over: 431 */
    size_t max_body_bytes;      /* 0 = 8 MiB; over: 413 */
    uint64_t header_timeout_ms; /* from the first byte of a request to the end of its
                                   headers; 0 = 10 s; over: 408 */
    uint64_t body_timeout_ms;   /* from the end of headers to the end of the body; 0 = 30 s */
    uint64_t idle_timeout_ms;   /* keep-alive connection with no request; 0 = 60 s */
    uint32_t max_connections;   /* 0 = 4096; beyond it new connections are closed at once */
    size_t max_output_bytes;    /* a stream's bytes not yet taken by its client; 0 = 4 MiB;
                                   over (checked once per loop turn): the request is aborted */
    const char *tls_cert;       /* PEM certificate chain file; with tls_key: HTTPS only on
                                   this port. Both NULL: plain HTTP. Read during the call */
    const char *tls_key;        /* PEM private key file of tls_cert (no passphrase) */
    ty_http_handler_cb handler;
    void *arg;
};

/* Load the TLS credentials (if any), bind, listen and start accepting. Returns 0, TY_EINVAL
 * (also: only one of tls_cert/tls_key), TY_ECONFIG (a certificate or key that does not load:
 * logged, naming the field), TY_EADDRINUSE or another -errno. */
int ty_http_server_new(ty_http_server_t **out, uv_loop_t *loop,
                       const struct ty_http_server_opts *opts);
/* The bound port (useful with port 0). */
uint16_t ty_http_server_port(const ty_http_server_t *s);
/* Whether the server speaks HTTPS. */
bool ty_http_server_tls(const ty_http_server_t *s);
/* Load a new certificate and key (a SIGHUP reload): connections accepted from now on use
 * them, open ones keep theirs. Returns 0, TY_EINVAL (a server started without TLS: switching
 * needs a restart; or a NULL path) or TY_ECONFIG (logged; the running pair stays). */
int ty_http_server_set_tls(ty_http_server_t *s, const char *cert, const char *key);
/* Open connections, and of them the ones with a request being handled. */
uint32_t ty_http_server_n_connections(const ty_http_server_t *s);
/* Close everything (aborting unfinished requests), free the server, then cb(arg). */
void ty_http_server_close(ty_http_server_t *s, ty_http_closed_cb cb, void *arg);

/* ---- a request ------------------------------------------------------------------------- */

const char *ty_http_req_method(const ty_http_req_t *r); /* "GET", "POST", ... */
const char *ty_http_req_path(const ty_http_req_t *r);   /* "/v1/models", without the query */
/* Value of a header (case-insensitive name), or NULL. */
const char *ty_http_req_header(const ty_http_req_t *r, const char *name);
const char *ty_http_req_body(const ty_http_req_t *r, size_t *len); /* NUL-terminated */
/* The request's id: the client's x-request-id header when it is 1..64 characters of
 * [A-Za-z0-9._:-], else one the server made (16 hex digits). Every response to the request
 * carries it back in an x-request-id header. */
#define TY_HTTP_REQUEST_ID_MAX 64
const char *ty_http_req_id(const ty_http_req_t *r);
/* Set (or clear with NULL) the callback run if the client leaves before the response ends. */
void ty_http_req_set_abort(ty_http_req_t *r, ty_http_abort_cb cb, void *arg);

/* Send a whole response and end the request. `extra_headers` are complete lines, each ending
 * in "\r\n" (may be NULL). Returns 0 or a negative TY_E* (the request is ended either way). */
int ty_http_respond(ty_http_req_t *r, int status, const char *content_type,
                    const char *extra_headers, const void *body, size_t len);
/* Streaming: status line and headers now (chunked transfer encoding), then pieces, then end. */
int ty_http_stream_begin(ty_http_req_t *r, int status, const char *content_type,
                         const char *extra_headers);
/* One piece of the body (one HTTP chunk with chunked encoding), copied into the buffer. */
int ty_http_stream_write(ty_http_req_t *r, const void *data, size_t len);
int ty_http_stream_end(ty_http_req_t *r);
/* Output bytes of the request's connection not yet written to its socket. */
size_t ty_http_req_write_queue(const ty_http_req_t *r);

/* Called once the bytes buffered on a connection up to the ty_http_req_on_flush call have been
 * handed to its socket (t_ns: ty_clock_ns() then), whether or not the request has ended by then;
 * not called if the connection closes first. `tag` is the caller's. */
typedef void (*ty_http_flush_cb)(void *arg, uint64_t tag, uint64_t t_ns);
/* One per connection: a later call replaces a pending one. */
void ty_http_req_on_flush(ty_http_req_t *r, ty_http_flush_cb cb, void *arg, uint64_t tag);

/* ---- a piece of a streamed body formatted in place ---------------------------------------
 * ty_http_frame_begin opens a piece at the end of the connection's output buffer; the caller
 * writes its bytes at f->p (ty_http_frame_room / ty_http_frame_put keep room ahead of it) and
 * ty_http_frame_end closes it as one piece of the body, exactly as ty_http_stream_write of
 * the same bytes would. Nothing else may be written to the connection while a frame is open.
 */
struct ty_http_frame {
    char *p, *end; /* the next byte goes at p; there is room up to end */
    ty_http_req_t *req;
};

/* Returns 0, or TY_EINVAL (not streaming, or ended) / TY_ENOTCONN (connection closing): then
 * write nothing and do not call ty_http_frame_end. */
int ty_http_frame_begin(ty_http_req_t *r, struct ty_http_frame *f);
/* Make room for `n` more bytes at f->p; what the frame holds moves along. Aborts on OOM. */
void ty__http_frame_grow(struct ty_http_frame *f, size_t n);
/* Close the frame (an empty one writes nothing). Returns 0. */
int ty_http_frame_end(struct ty_http_frame *f);

/* Room for n more bytes at f->p (returned). */
static inline char *ty_http_frame_room(struct ty_http_frame *f, size_t n)
{
    if ((size_t)(f->end - f->p) < n)
        ty__http_frame_grow(f, n);
    return f->p;
}

static inline void ty_http_frame_put(struct ty_http_frame *f, const void *s, size_t n)
{
    memcpy(ty_http_frame_room(f, n), s, n);
    f->p += n;
}

/* Reason phrase for a status code ("Not Found"). */
const char *ty_http_status_text(int status);

#endif
