/* A small RPC server process for the loopback integration tests.
 *
 *   rpc_test_server [--port N] [--max-frame BYTES]
 *
 * Prints "PORT <n>" on stdout once listening, serves until SIGTERM/SIGINT, exits 0.
 * Methods: METHOD_PING echoes a tycho.v1.Ping; 1001 streams Ping.nonce TokenChunks (in batches
 * across loop iterations, a real server push); 1002 replies to a Ping after Ping.nonce ms. */
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/rpc.h"
#include "tycho.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { M_STREAM_CHUNKS = 1001, M_SLOW = 1002, STREAM_BATCH = 64 };

struct stream_job {
    uv_timer_t timer;
    ty_rpc_call_t *call;
    uint64_t stream_id; /* Ping.wall_ms of the request: the client's stream number */
    uint32_t next, total;
    bool canceled;
};

struct slow_job {
    uv_timer_t timer;
    ty_rpc_call_t *call;
    Tycho__V1__Ping *req;
};

static void h_ping(ty_rpc_call_t *call, const uint8_t *p, size_t len, void *arg)
{
    Tycho__V1__Ping *req = tycho__v1__ping__unpack(NULL, len, p);
    if (!req) {
        ty_rpc_call_fail(call, TY_EBADMSG, "not a Ping");
        return;
    }
    ty_rpc_call_reply_msg(call, &req->base); /* echo */
    tycho__v1__ping__free_unpacked(req, NULL);
}

static void job_closed(uv_handle_t *h)
{
    free(h->data);
}

static void stream_tick(uv_timer_t *t)
{
    struct stream_job *j = t->data;
    for (int k = 0; k < STREAM_BATCH && j->next < j->total && !j->canceled; k++) {
        char text[64];
        uint32_t ids[2] = {j->next, j->next * 7u};
        snprintf(text, sizeof(text), "s%llu-%u", (unsigned long long)j->stream_id, j->next);
        Tycho__V1__TokenChunk c = TYCHO__V1__TOKEN_CHUNK__INIT;
        c.request_id = j->stream_id;
        c.seq = j->next;
        c.n_token_ids = 2;
        c.token_ids = ids;
        c.text = text;
        if (j->next + 1 == j->total)
            c.finish_reason = TYCHO__V1__FINISH_REASON__FINISH_REASON_LENGTH;
        if (ty_rpc_call_stream_msg(j->call, &c.base) < 0)
            j->canceled = true;
        j->next++;
    }
    if (j->next < j->total && !j->canceled)
        return;
    ty_rpc_call_end(j->call);
    uv_timer_stop(t);
    uv_close((uv_handle_t *)t, job_closed);
}

static void stream_cancel(ty_rpc_call_t *call, int reason, void *arg)
{
    ((struct stream_job *)arg)->canceled = true;
}

static void h_stream(ty_rpc_call_t *call, const uint8_t *p, size_t len, void *arg)
{
    Tycho__V1__Ping *req = tycho__v1__ping__unpack(NULL, len, p);
    if (!req) {
        ty_rpc_call_fail(call, TY_EBADMSG, "not a Ping");
        return;
    }
    struct stream_job *j = calloc(1, sizeof(*j));
    j->call = call;
    j->total = (uint32_t)req->nonce;
    j->stream_id = req->wall_ms;
    tycho__v1__ping__free_unpacked(req, NULL);
    uv_timer_init(arg, &j->timer);
    j->timer.data = j;
    ty_rpc_call_set_cancel_cb(call, stream_cancel, j);
    uv_timer_start(&j->timer, stream_tick, 0, 1);
}

static void slow_fire(uv_timer_t *t)
{
    struct slow_job *j = t->data;
    ty_rpc_call_reply_msg(j->call, &j->req->base);
    tycho__v1__ping__free_unpacked(j->req, NULL);
    uv_close((uv_handle_t *)t, job_closed);
}

static void slow_cancel(ty_rpc_call_t *call, int reason, void *arg)
{
    struct slow_job *j = arg;
    uv_timer_start(&j->timer, slow_fire, 0, 0); /* end it now (the reply is dropped) */
}

static void h_slow(ty_rpc_call_t *call, const uint8_t *p, size_t len, void *arg)
{
    Tycho__V1__Ping *req = tycho__v1__ping__unpack(NULL, len, p);
    if (!req) {
        ty_rpc_call_fail(call, TY_EBADMSG, "not a Ping");
        return;
    }
    struct slow_job *j = calloc(1, sizeof(*j));
    j->call = call;
    j->req = req;
    uv_timer_init(arg, &j->timer);
    j->timer.data = j;
    ty_rpc_call_set_cancel_cb(call, slow_cancel, j);
    uv_timer_start(&j->timer, slow_fire, req->nonce, 0);
}

static ty_rpc_server_t *g_srv;
static uv_signal_t g_sigterm, g_sigint;

static void on_signal(uv_signal_t *s, int signum)
{
    TY_LOG_INFO("rpc-test-server", "signal %d: shutting down", signum);
    if (g_srv)
        ty_rpc_server_close(g_srv, NULL, NULL);
    g_srv = NULL;
    uv_close((uv_handle_t *)&g_sigterm, NULL);
    uv_close((uv_handle_t *)&g_sigint, NULL);
}

int main(int argc, char **argv)
{
    struct ty_rpc_server_opts so = {.host = "127.0.0.1"};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--port") == 0)
            so.port = (uint16_t)atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--max-frame") == 0)
            so.max_frame_size = (uint32_t)strtoul(argv[i + 1], NULL, 10);
    }
    uv_loop_t *loop = uv_default_loop();
    so.loop = loop;
    int rc = ty_rpc_server_new(&g_srv, &so);
    if (rc < 0) {
        fprintf(stderr, "rpc_test_server: %s\n", ty_strerror(rc));
        return 1;
    }
    ty_rpc_server_handle(g_srv, TYCHO__V1__METHOD__METHOD_PING, h_ping, loop);
    ty_rpc_server_handle(g_srv, M_STREAM_CHUNKS, h_stream, loop);
    ty_rpc_server_handle(g_srv, M_SLOW, h_slow, loop);
    uv_signal_init(loop, &g_sigterm);
    uv_signal_init(loop, &g_sigint);
    uv_signal_start(&g_sigterm, on_signal, SIGTERM);
    uv_signal_start(&g_sigint, on_signal, SIGINT);
    printf("PORT %u\n", ty_rpc_server_port(g_srv));
    fflush(stdout);
    uv_run(loop, UV_RUN_DEFAULT); /* returns once the server and every job are closed */
    return uv_loop_close(loop) == 0 ? 0 : 1;
}
