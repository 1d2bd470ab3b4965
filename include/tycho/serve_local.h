/* `tycho serve` (src/serve): all roles in one process. Its settings table (the Conductor's
 * front-door settings plus an `engine:` section) and its worker: one thread that owns an engine
 * and serves requests on the engine's batcher (tycho/batcher.h: continuous batching, chunked
 * prompts sharing each step's token budget with the running decodes, preemption of the newest
 * sequence when pages run out). It implements the serving backend of tycho/serve.h.
 *
 * Threading: ty_serve_worker_backend()'s submit/cancel/stats and ty_serve_worker_free may
 * be called from any thread; the engine is used only by the worker thread between new and
 * free; events are delivered on the worker thread. Ownership: the worker borrows the engine
 * (which must outlive it) and copies every request it is given; the settings' strings belong
 * to the config object that filled them.
 */
#ifndef TYCHO_SERVE_LOCAL_H
#define TYCHO_SERVE_LOCAL_H

#include "tycho/conductor.h"
#include "tycho/engine.h"
#include "tycho/serve.h"

#include <stdint.h>

/* ---- settings ------------------------------------------------------------------------------ */

/* The in-process engine of `tycho serve` (its `engine:` section). threads, kv_block_tokens,
 * kv_pages and max_batch_size are the same rows as the node settings of the same names. */
struct ty_serve_engine_config {
    uint32_t threads;
    uint32_t kv_block_tokens;
    uint32_t kv_pages;               /* pages per layer; 0: kv_cache_memory's, else the engine's
                                      * default (max_batch_size sequences of up to 4096 tokens,
                                      * at least one whole context) */
    uint64_t kv_cache_memory;        /* bytes of KV pages when kv_pages is 0; 0: unset */
    int kv_cache_dtype;              /* index into ty_engine_kv_dtype_names */
    uint32_t max_batch_size;         /* sequences decoded together */
    uint32_t step_tokens;            /* token budget of one engine step */
    int backend;                     /* index into ty_engine_backend_names */
    uint32_t cuda_device;            /* backend cuda: the GPU's ordinal */
    int cuda_weights;                /* backend cuda: index into ty_engine_cuda_weights_names */
    uint64_t engine_stall_ns;        /* a forward call this long holds back the watchdog */
};

/* `tycho serve`: the Conductor's settings (same table as tycho-conductor; the RPC, heartbeat,
 * startup_wait and request_timeout settings have no effect there, having no nodes) plus the
 * engine that replaces the remote nodes. */
struct ty_serve_config {
    struct ty_conductor_config conductor;
    struct ty_serve_engine_config engine;
};

extern const struct ty_config_struct ty_serve_config_table; /* tycho serve */

/* ---- the worker ---------------------------------------------------------------------------- */

typedef struct ty_serve_worker ty_serve_worker_t;

struct ty_serve_worker_opts {
    ty_engine_t *engine;       /* borrowed */
    uint32_t max_running;      /* sequences in the batch at once; 0 = 64 */
    uint32_t max_waiting;      /* queued requests before submit answers TY_EREJECTED; 0 = 1024 */
    uint32_t step_tokens;      /* token budget of one step (decodes + prefill chunks); 0 = 256 */
    ty_serve_event_cb event_cb; /* worker thread */
    void *event_arg;
};

/* Start the worker thread. Returns 0, TY_EINVAL or TY_ENOMEM. */
int ty_serve_worker_new(ty_serve_worker_t **out, const struct ty_serve_worker_opts *opts);
/* The worker as a serving backend (valid until ty_serve_worker_free). */
struct ty_serve_backend ty_serve_worker_backend(ty_serve_worker_t *w);
/* Stop the thread (what is in flight is dropped without events) and free. NULL is a no-op. */
void ty_serve_worker_free(ty_serve_worker_t *w);

#endif
