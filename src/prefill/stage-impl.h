/* A prefill node's hidden-state traffic between pipeline stages (chunked pipeline parallelism,
 * Mooncake §5.1; tycho.proto PipelineStage, StageHidden): the rows a stage receives for its
 * requests, kept per request until the worker feeds them to the batcher (rows that come before
 * the request's PrefillAssign wait for it, a while and a bounded amount), and the rows it sends
 * to the next stage's node over RPC, in order on one connection per node.
 *
 * Threads: receive and the sending itself run on the loop thread; send (which posts to the
 * loop), take and forget run on the worker; the inbox is under the hub's own mutex. The hub is
 * made and freed by the prefill node (prefill.c), closed on the loop before the mailbox goes.
 */
#ifndef TYCHO_PREFILL_STAGE_IMPL_H
#define TYCHO_PREFILL_STAGE_IMPL_H

#include "tycho/auth.h"
#include "tycho/rpc.h"

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

typedef struct ty__stage_hub ty__stage_hub_t;

struct ty__stage_hub_opts {
    uv_loop_t *loop;
    const struct ty_auth *auth; /* the cluster secret for the next stages' nodes */
    uint32_t dim;               /* floats per token */
    void (*wake)(void *arg);    /* rows came in (any request): wake the worker */
    void *wake_arg;
};

int ty__stage_hub_new(ty__stage_hub_t **out, const struct ty__stage_hub_opts *o);
/* The mailbox sends go through (the node service's, made after the hub). Loop thread. */
void ty__stage_hub_set_mailbox(ty__stage_hub_t *h, ty_rpc_mailbox_t *mb);
/* Close the RPC clients to the next stages (loop thread, before the mailbox closes). */
void ty__stage_hub_close(ty__stage_hub_t *h);
void ty__stage_hub_free(ty__stage_hub_t *h);

/* StageHidden handler body (loop thread): checks the message, keeps the rows, answers. */
void ty__stage_hub_receive(ty__stage_hub_t *h, ty_rpc_call_t *call, const void *msg);
/* Worker: hand the rows received for (rid, attempt) since the last call, in order, to
 * feed(arg, rows, first, n); their first token must be `*next` (advanced by what is fed).
 * Returns 0, TY_EPROTO (rows out of order: a lost message), or feed's error. */
int ty__stage_hub_take(ty__stage_hub_t *h, uint64_t rid, uint32_t attempt, uint32_t *next,
                       int (*feed)(void *arg, const float *rows, uint32_t first, uint32_t n),
                       void *arg);
/* Worker: drop what is kept for rid (its job ended). */
void ty__stage_hub_forget(ty__stage_hub_t *h, uint64_t rid);
/* Worker: send rows (n, dim) of prompt tokens [first, first + n) of (rid, attempt) to the
 * node at addr ("host:port"), in messages of at most 4 MiB, after what was sent before.
 * Returns 0 or TY_ENOMEM / TY_ESHUTDOWN (nothing more can be sent). */
int ty__stage_hub_send(ty__stage_hub_t *h, const char *addr, uint64_t rid, uint32_t attempt,
                       const float *rows, uint32_t first, uint32_t n);
/* Sends whose call failed (the next stage did not take them), since the hub was made. */
uint64_t ty__stage_hub_send_failures(const ty__stage_hub_t *h);

#endif
