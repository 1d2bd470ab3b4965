/* The decode node (DESIGN.md §5 steps 3 and 6): a DecodeAssign (stream = true) is a request's
 * one call. It reserves the pages of the request's prompt (the answer's are taken as it grows;
 * when the pool is full the newest running request is preempted and later recomputed on this
 * node, node_worker.c) and its first stream item is the KV destination: this node's transfer
 * segment, the pages' ids, and per layer the base of the K and V page arrays with one page
 * stride (the pool's layer arrays are registered with the transfer engine once at start). The
 * prefill node writes the KV there and sends a KvReady notification with the first token,
 * which wakes the worker (the transfer engine's notification callback); the request then joins
 * the running batch (continuous batching: requests join and leave between steps) and its
 * tokens go back on the same call as TokenChunk items. Cancel, the Conductor's disconnect, or
 * KV that never lands (kv_wait_timeout) release the pages.
 *
 * Threading: new/close/rpc_port/load on the loop's thread; one worker thread owns the engine
 * between new and close. Ownership: borrows the engine and the transfer engine.
 */
#ifndef TYCHO_DECODE_NODE_H
#define TYCHO_DECODE_NODE_H

#include "tycho/node.h"
#include "tycho/engine.h"
#include "tycho/store.h"
#include "tycho/transfer.h"

#include <stdint.h>
#include <uv.h>

typedef struct ty_decode_node ty_decode_node_t;

struct ty_decode_node_opts {
    uv_loop_t *loop;
    ty_engine_t *engine;      /* borrowed */
    ty_xfer_engine_t *xfer;   /* borrowed; the pool's layer arrays registered with it */
    const char *node_id;      /* in KvDestination.node_id */
    const char *rpc_host;     /* NULL: 127.0.0.1 */
    uint16_t rpc_port;        /* 0: ephemeral */
    const struct ty_auth *auth; /* the cluster secret callers must prove; NULL: insecure */
    uint32_t max_running;     /* sequences decoded together; 0: 64 */
    uint32_t kv_wait_timeout_ms; /* reserved pages wait this long for their KV; 0: 30000 */
    ty_timing_ring_t *timings; /* optional, borrowed: one sample per decode step (below) */
    /* Optional, borrowed: the cluster KV pool. When a request ends naturally (EOS, max_tokens,
     * context), the full blocks its generated tokens filled are written to the pool (the
     * prompt's are the prefill node's to write), so the next turn of a conversation finds its
     * answer there too (tycho/node_kvstore.h: the node runtime's, which outlives the decode
     * node). */
    struct ty_node_kvstore *kvstore;
    struct ty_node_metrics *metrics; /* optional, borrowed: KV handoffs are counted there */
};

/* Each successful decode step adds to opts.timings (from the worker): n_tokens = batch_size =
 * the sequences stepped, prefix_tokens = their context in total (KV positions the step attends
 * to, its own new token included), duration_us = the step's wall time (forward pass, sampling
 * and handing the tokens to the loop). */
int ty_decode_node_new(ty_decode_node_t **out, const struct ty_decode_node_opts *opts);
uint16_t ty_decode_node_rpc_port(const ty_decode_node_t *n);
/* The node's load for its heartbeats (a ty_node_load_cb; arg is the ty_decode_node_t). */
void ty_decode_node_load(void *arg, struct ty_node_load *out);
/* Stop the worker (requests in flight end with an error chunk), close the server, free. */
void ty_decode_node_close(ty_decode_node_t *n, void (*cb)(void *arg), void *arg);

#endif
