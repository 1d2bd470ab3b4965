/* RPC clients to other prefill nodes by address ("host:port"), made on first use and kept
 * open: a peer's KvFetch (prefill.c) and the next pipeline stage's StageHidden (stage.c).
 * Past TY__PEERS_MAX addresses the oldest client is closed and its slot reused.
 * Threads: the loop thread only. */
#ifndef TYCHO_PREFILL_PEERS_IMPL_H
#define TYCHO_PREFILL_PEERS_IMPL_H

#include "tycho/auth.h"
#include "tycho/rpc.h"

#include <stdint.h>
#include <uv.h>

#define TY__PEERS_MAX 16

struct ty__peers {
    uv_loop_t *loop;
    const struct ty_auth *auth;
    uint32_t connect_timeout_ms;
    struct {
        char addr[128];
        ty_rpc_client_t *c;
    } slot[TY__PEERS_MAX];
    uint32_t rr; /* the next slot to recycle */
};

/* The client to addr; NULL for a bad address or no memory. */
ty_rpc_client_t *ty__peers_get(struct ty__peers *p, const char *addr);
/* Close every client (a call pending on one fails). */
void ty__peers_close(struct ty__peers *p);

#endif
