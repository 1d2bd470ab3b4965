/* A node's use of the cluster KV pool (tycho-store, DESIGN.md §8). A prefill node, before a
 * prompt is computed, looks up the full blocks after its local prefix match in the pool and
 * reads the leading run found there into the sequence's pages; after the prompt is computed,
 * it writes the full blocks the pool did not have. A decode node writes the blocks its
 * generated tokens filled when a request ends, so that the next turn of a conversation (its
 * prompt and this answer) finds them too. A block's key is "kv/" and its chained prefix hash
 * in 16 lowercase hex digits (ty_hash_prefix_step, seeded with the model, KV dtype and block
 * size, as the page cache's index is), so any node of the same model finds what any other one
 * stored. A block's value is, for each layer, its page's K chunk then its V chunk
 * (2 * n_layers * page_bytes).
 *
 * The pool is an accelerator, never a dependency: every failure (master or pool node down, a
 * block gone between lookup and read, a value of the wrong size, the page cache full) is a miss,
 * and after an error that says the pool is unreachable it is not asked again for retry_ms, so a
 * dead pool costs one timeout, not one per request.
 *
 * Threads: fetch and store run on the node's worker, which owns the engine's page pool; a
 * writer thread of this module does the puts, from a ring of block slots in registered
 * memory the worker copies blocks into (a quarter of staging_bytes reads, the rest the ring),
 * so the pool's round trips never delay the worker. free() lets the writer finish what is
 * queued. The stats are atomics any thread may read. */
#ifndef TYCHO_NODE_KVSTORE_H
#define TYCHO_NODE_KVSTORE_H

#include "tycho/kvpool.h"
#include "tycho/store.h"

#include <stdint.h>

struct ty_node_kvstore;

struct ty_node_kvstore_opts {
    ty_store_client_t *client; /* borrowed */
    ty_kvpool_t *pool;         /* the engine's page pool (its geometry and hash seed) */
    uint32_t n_layers;
    uint64_t hash_seed;
    uint64_t staging_bytes; /* registered buffers: reads and the write ring; 0: 64 MiB */
    uint32_t retry_ms;      /* after the pool failed, skip it this long; 0: 5000 */
};

struct ty_node_kvstore_stats {
    uint64_t lookups;       /* prompts with blocks to look up */
    uint64_t hit_blocks;    /* blocks read from the pool into the page cache */
    uint64_t stored_blocks; /* blocks written to the pool */
    uint64_t errors;        /* operations that failed (each counted as a miss) */
    uint64_t skipped;       /* prompts that did not ask the pool because it had failed */
    uint64_t dropped;       /* blocks not written: the writer was behind or the pool down */
};

int ty_node_kvstore_new(struct ty_node_kvstore **out, const struct ty_node_kvstore_opts *opts);
void ty_node_kvstore_free(struct ty_node_kvstore *s);

/* `seq` holds the local prefix of `tokens` (cached tokens, a multiple of B). Append the blocks
 * that follow it from the pool, up to block max_blocks (UINT32_MAX: no limit; the Conductor's
 * plan), leaving at least one token of the prompt to compute. Returns the number of tokens
 * appended (a multiple of B, 0 on any miss or failure). */
uint32_t ty_node_kvstore_fetch(struct ty_node_kvstore *s, ty_kvseq_t *seq, const uint32_t *tokens,
                               uint32_t n, uint32_t max_blocks);

/* `seq` holds the KV of all n tokens; the first `known` tokens' blocks are in the pool already
 * (fetched from it, or local: written when they were computed). Write the other full blocks:
 * they are copied into the write ring at once (the sequence may be freed on return) and
 * written by the writer thread; when the ring is full the rest are dropped (counted). */
void ty_node_kvstore_store(struct ty_node_kvstore *s, const ty_kvseq_t *seq, const uint32_t *tokens,
                           uint32_t n, uint32_t known);
/* Wait until every block handed to store() was written (or failed). Any thread. */
void ty_node_kvstore_flush(struct ty_node_kvstore *s);

/* The pool client of a node with `kv_pool.master` set (its own transfer engine on
 * listen_host); *out = NULL and 0 without a master. An unreachable master is not an error:
 * the node then skips the pool until it answers. */
struct ty_node_pool_config;
int ty_node_kvstore_client_new(const struct ty_node_pool_config *k, const char *listen_host,
                               const struct ty_auth *auth,
                               ty_store_client_t **out);

void ty_node_kvstore_stats(const struct ty_node_kvstore *s, struct ty_node_kvstore_stats *out);

#endif
