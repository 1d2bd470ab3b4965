/* HTTP/1.1 server on libuv with http-parser: keep-alive, pipelining (one request at a time
 * per connection, later ones wait buffered), limits on header and body size, header and body
 * read timeouts, chunked request bodies, chunked streaming responses.
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
    ty_http_handler_cb handler;
    void *arg;
};

/* Bind, listen and start accepting. Returns 0, TY_EINVAL, TY_EADDRINUSE or another -errno. */
int ty_http_server_new(ty_http_server_t **out, uv_loop_t *loop,
                       const struct ty_http_server_opts *opts);
/* The bound port (useful with port 0). */
uint16_t ty_http_server_port(const ty_http_server_t *s);
/* Stop accepting new connections (drain); existing ones keep going. */
void ty_http_server_stop_accepting(ty_http_server_t *s);
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
/* Set (or clear with NULL) the callback run if the client leaves before the response ends. */
void ty_http_req_set_abort(ty_http_req_t *r, ty_http_abort_cb cb, void *arg);

/* Send a whole response and end the request. `extra_headers` are complete lines, each ending
 * in "\r\n" (may be NULL). Returns 0 or a negative TY_E* (the request is ended either way). */
int ty_http_respond(ty_http_req_t *r, int status, const char *content_type,
                    const char *extra_headers, const void *body, size_t len);
/* Streaming: status line and headers now (chunked transfer encoding), then pieces, then end. */
int ty_http_stream_begin(ty_http_req_t *r, int status, const char *content_type,
                         const char *extra_headers);
int ty_http_stream_write(ty_http_req_t *r, const void *data, size_t len);
int ty_http_stream_end(ty_http_req_t *r);
/* Bytes queued on the socket, not yet written (for back-pressure decisions). */
size_t ty_http_req_write_queue(const ty_http_req_t *r);

/* Reason phrase for a status code ("Not Found"). */
const char *ty_http_status_text(int status);

#endif
