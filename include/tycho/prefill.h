/* The prefill node (DESIGN.md §5 step 5): takes PrefillAssign requests over RPC (their KV
 * destination checked first: page ids, per-layer bases and stride, the decode node's
 * registered memory), reuses the prefix the Conductor planned (its page cache, the KV pool,
 * or another prefill node's cache, which that node pins while we read it: KvFetch; what fails
 * to arrive is computed, and the reply says what was reused), computes the rest of the
 * prompt's KV in chunks on its engine and, as soon as each
 * layer of a chunk is done, posts that layer's K/V page writes (base + page id * stride) to the
 * decode node through the transfer engine; after the last
 * layer it samples the first token and sends a KvReady notification (delivered after the
 * writes), then answers the PrefillAssign.
 *
 * Threading: ty_prefill_new/close/rpc_port/load run on the loop's thread; one worker thread
 * owns the engine between new and close. Ownership: the node borrows the engine and the
 * transfer engine (the pool's layer arrays must already be registered with it: see
 * ty_node_kv_register), which must outlive it.
 */
#ifndef TYCHO_PREFILL_H
#define TYCHO_PREFILL_H

#include "tycho/node.h"
#include "tycho/engine.h"
#include "tycho/store.h"
#include "tycho/transfer.h"

#include <stdint.h>
#include <uv.h>

typedef struct ty_prefill ty_prefill_t;

struct ty_prefill_opts {
    uv_loop_t *loop;
    ty_engine_t *engine;    /* borrowed; its max_batch_tokens is the prefill chunk */
    ty_xfer_engine_t *xfer; /* borrowed */
    const char *rpc_host;   /* NULL: 127.0.0.1 */
    uint16_t rpc_port;      /* 0: ephemeral */
    const struct ty_auth *auth; /* the cluster secret callers must prove; NULL: insecure */
    uint32_t max_queue;     /* queued requests before PrefillAssign is refused; 0: 1024 */
    uint32_t max_batch;     /* queued prompts run in one forward call (their tokens within the
                             * engine's max_batch_tokens, their pages free); 0: 8, at most 64 */
    uint32_t xfer_timeout_ms; /* a layer's writes must land within this; 0: 10000 */
    ty_timing_ring_t *timings; /* optional, borrowed: one sample per forward call (batch_size
                                * = prompts in it), pushed by the worker (see ty_prefill_new) */
    /* Optional, borrowed: the cluster KV pool. A prompt's full blocks after its local prefix
     * match are read from the pool when it has them (the leading run), and the blocks the
     * prompt computed are written to it by a writer thread once the decode node has the KV
     * (tycho/node_kvstore.h: the node runtime's, which outlives the prefill node). */
    struct ty_node_kvstore *kvstore;
    struct ty_node_metrics *metrics; /* optional, borrowed: KV handoffs are counted there */
    /* A PrefillAssign whose plan (cached_prefix) names another prefill node's cache: that
     * node is asked (KvFetch) to pin the blocks before the job queues, within this; what is
     * not pinned in time, or not read before the pin's lease ends, is computed. 0: 1000. */
    uint32_t peer_timeout_ms;
};

struct ty_prefill_stats {
    uint64_t pool_lookups, pool_hit_blocks, pool_stored_blocks, pool_errors, pool_skipped;
    uint64_t pool_dropped; /* blocks not written (the writer was behind, or the pool down) */
    /* peer reads: blocks read from other prefill nodes' caches, planned ones that failed
     * (computed instead); pins of our blocks taken for peers, and requests for none held */
    uint64_t peer_read_blocks, peer_failed_blocks, pins_taken, pins_refused;
};
/* Counters of the KV pool's use (zero without a pool); any thread. */
void ty_prefill_stats(const ty_prefill_t *p, struct ty_prefill_stats *out);

/* Start the RPC server and the worker. Returns 0, TY_EINVAL, TY_ENOMEM or a listen error.
 * Each successful forward call (one prompt, or up to opts.max_batch short ones) adds to
 * opts.timings n_tokens = prompt tokens computed (the prompts less their cached prefixes),
 * prefix_tokens = the cached prefixes reused (local page cache and KV pool), batch_size = the
 * prompts in the call and duration_us = the wall time of the forward pass over all chunks
 * (the KV writes it posts are asynchronous; sampling and waiting for the writes to land are
 * not counted). max_batch over 64 is TY_EINVAL. */
int ty_prefill_new(ty_prefill_t **out, const struct ty_prefill_opts *opts);
uint16_t ty_prefill_rpc_port(const ty_prefill_t *p);
/* The node's load for its heartbeats (a ty_node_load_cb; arg is the ty_prefill_t). */
void ty_prefill_load(void *arg, struct ty_node_load *out);
/* The prompts the worker has begun computing and not finished (ty_node_progress_cb; loop
 * thread): tokens done per prompt, its last chunk's time and its rate. */
size_t ty_prefill_progress(void *arg, struct ty_node_progress *out, size_t cap);
/* Stop the worker, fail what is queued (TY_ESHUTDOWN), close the server, free; then cb. */
void ty_prefill_close(ty_prefill_t *p, void (*cb)(void *arg), void *arg);

#endif
