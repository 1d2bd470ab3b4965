/* A node's service (tycho/node.h): its RPC server, its worker thread and the mailbox through
 * which the worker hands results to the loop, started and stopped the same way for every role.
 * Closing never blocks the loop on the worker: the worker's last act is a mailbox post, and the
 * loop joins it (already returning) only when that post is run. */
#include "tycho/node.h"

#include "tycho/errors.h"

#include <pthread.h>
#include <stdlib.h>

struct ty_node_service {
    struct ty_node_service_opts o;
    ty_rpc_server_t *srv;
    ty_rpc_mailbox_t *mb;
    pthread_t thread;
    bool closing;
};

/* Worker thread: the role's body, then the post that lets the loop join it. */
static void on_worker_done(void *arg);

static void *thread_main(void *arg)
{
    ty_node_service_t *s = arg;
    s->o.worker(s->o.arg);
    ty_rpc_mailbox_post(s->mb, on_worker_done, s); /* the mailbox is open until this ran */
    return NULL;
}

int ty_node_service_new(ty_node_service_t **out, const struct ty_node_service_opts *opts)
{
    if (!out || !opts || !opts->loop || !opts->worker || !opts->stop)
        return TY_EINVAL;
    ty_node_service_t *s = calloc(1, sizeof(*s));
    if (!s)
        return TY_ENOMEM;
    s->o = *opts;
    s->o.host = NULL; /* borrowed only until the server listens */
    struct ty_rpc_server_opts so = {.loop = opts->loop, .host = opts->host, .port = opts->port,
                                    .max_frame_size = 64u << 20, .auth = opts->auth};
    int rc = ty_rpc_mailbox_new(&s->mb, opts->loop);
    if (!rc && (rc = ty_rpc_server_new(&s->srv, &so)))
        s->srv = NULL;
    for (size_t i = 0; !rc && i < opts->n_handlers; i++) {
        const struct ty_node_handler *h = &opts->handlers[i];
        rc = ty_rpc_server_handle_msg(s->srv, h->method, h->desc, h->cb, opts->arg);
    }
    if (!rc && pthread_create(&s->thread, NULL, thread_main, s))
        rc = TY_ENOMEM;
    if (rc) {
        if (s->srv)
            ty_rpc_server_close(s->srv, NULL, NULL);
        if (s->mb)
            ty_rpc_mailbox_close(s->mb, NULL, NULL);
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

ty_rpc_mailbox_t *ty_node_service_mailbox(ty_node_service_t *s)
{
    return s->mb;
}

uint16_t ty_node_service_port(const ty_node_service_t *s)
{
    return ty_rpc_server_port(s->srv);
}

static void on_server_closed(void *arg)
{
    ty_node_service_t *s = arg;
    void (*closed)(void *) = s->o.closed;
    void *role = s->o.arg;
    free(s);
    if (closed)
        closed(role);
}

static void on_mailbox_closed(void *arg)
{
    ty_node_service_t *s = arg;
    ty_rpc_server_close(s->srv, on_server_closed, s);
}

/* Loop: the worker returned; what it posted before has run (the mailbox keeps order). */
static void on_worker_done(void *arg)
{
    ty_node_service_t *s = arg;
    pthread_join(s->thread, NULL); /* it is past its last statement */
    if (s->o.drained)
        s->o.drained(s->o.arg);
    ty_rpc_mailbox_close(s->mb, on_mailbox_closed, s);
}

void ty_node_service_close(ty_node_service_t *s)
{
    if (!s || s->closing)
        return;
    s->closing = true;
    s->o.stop(s->o.arg);
}
