/* Mailbox: a mutex-protected FIFO of (fn, arg) drained on the loop thread by a uv_async_t.
 * uv_async_send coalesces wake-ups, so one drain may run many items; items posted during a
 * drain run in the next one (the queue is swapped out under the lock, then run unlocked). */
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/rpc.h"

#include <pthread.h>
#include <stdlib.h>

struct mb_item {
    ty_rpc_work_cb fn;
    void *arg;
    struct mb_item *next;
};

struct ty_rpc_mailbox {
    uv_async_t async;
    pthread_mutex_t lock;
    struct mb_item *head, *tail;
    bool closing; /* under lock */
    ty_rpc_closed_cb close_cb;
    void *close_arg;
};

static void drain(ty_rpc_mailbox_t *mb)
{
    for (;;) {
        pthread_mutex_lock(&mb->lock);
        struct mb_item *it = mb->head;
        mb->head = mb->tail = NULL;
        pthread_mutex_unlock(&mb->lock);
        if (!it)
            return;
        while (it) {
            struct mb_item *next = it->next;
            it->fn(it->arg);
            free(it);
            it = next;
        }
    }
}

static void on_async(uv_async_t *a)
{
    drain(a->data);
}

int ty_rpc_mailbox_new(ty_rpc_mailbox_t **out, uv_loop_t *loop)
{
    ty_rpc_mailbox_t *mb = calloc(1, sizeof(*mb));
    TY_ASSERT(mb);
    int rc = uv_async_init(loop, &mb->async, on_async);
    if (rc < 0) {
        free(mb);
        return rc;
    }
    pthread_mutex_init(&mb->lock, NULL);
    mb->async.data = mb;
    *out = mb;
    return 0;
}

int ty_rpc_mailbox_post(ty_rpc_mailbox_t *mb, ty_rpc_work_cb fn, void *arg)
{
    if (!fn)
        return TY_EINVAL;
    struct mb_item *it = malloc(sizeof(*it));
    TY_ASSERT(it);
    it->fn = fn;
    it->arg = arg;
    it->next = NULL;
    pthread_mutex_lock(&mb->lock);
    if (mb->closing) {
        pthread_mutex_unlock(&mb->lock);
        free(it);
        return TY_ESHUTDOWN;
    }
    if (mb->tail)
        mb->tail->next = it;
    else
        mb->head = it;
    mb->tail = it;
    /* under the lock, so close cannot free the handle between enqueue and send */
    int rc = uv_async_send(&mb->async);
    pthread_mutex_unlock(&mb->lock);
    return rc;
}

static void on_closed(uv_handle_t *h)
{
    ty_rpc_mailbox_t *mb = h->data;
    drain(mb); /* posts that raced with close */
    ty_rpc_closed_cb cb = mb->close_cb;
    void *arg = mb->close_arg;
    pthread_mutex_destroy(&mb->lock);
    free(mb);
    if (cb)
        cb(arg);
}

void ty_rpc_mailbox_close(ty_rpc_mailbox_t *mb, ty_rpc_closed_cb cb, void *arg)
{
    pthread_mutex_lock(&mb->lock);
    bool already = mb->closing;
    mb->closing = true;
    pthread_mutex_unlock(&mb->lock);
    if (already)
        return;
    mb->close_cb = cb;
    mb->close_arg = arg;
    drain(mb);
    uv_close((uv_handle_t *)&mb->async, on_closed);
}
