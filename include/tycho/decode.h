/* The decode worker: one thread that owns an engine and runs continuous batching over it.
 * Requests join between steps (their prompt prefilled in chunks that share each step's token
 * budget with the running decodes, so a long prompt does not stall them) and leave when they
 * finish or are cancelled. A request's KV pages are taken as it grows: its prompt's when it is
 * admitted (it waits in a FIFO queue while they, plus a 1 % watermark, are not free), one more
 * each time its answer fills one; when the pool is full the newest running sequence is
 * preempted (pages freed, recomputed from its tokens when readmitted at the queue's head).
 * It implements the serving backend of tycho/serve.h; the decode daemon reuses it later.
 *
 * Threading: ty_decode_worker_backend()'s submit/cancel/stats and ty_decode_worker_free may
 * be called from any thread; the engine is used only by the worker thread between new and
 * free; events are delivered on the worker thread. Ownership: the worker borrows the engine
 * (which must outlive it) and copies every request it is given.
 */
#ifndef TYCHO_DECODE_H
#define TYCHO_DECODE_H

#include "tycho/engine.h"
#include "tycho/serve.h"

#include <stdint.h>

typedef struct ty_decode_worker ty_decode_worker_t;

struct ty_decode_worker_opts {
    ty_engine_t *engine;       /* borrowed */
    uint32_t max_running;      /* sequences in the batch at once; 0 = 64 */
    uint32_t max_waiting;      /* queued requests before submit answers TY_EREJECTED; 0 = 1024 */
    uint32_t step_tokens;      /* token budget of one step (decodes + prefill chunks); 0 = 256 */
    ty_serve_event_cb event_cb; /* worker thread */
    void *event_arg;
};

/* Start the worker thread. Returns 0, TY_EINVAL or TY_ENOMEM. */
int ty_decode_worker_new(ty_decode_worker_t **out, const struct ty_decode_worker_opts *opts);
/* The worker as a serving backend (valid until ty_decode_worker_free). */
struct ty_serve_backend ty_decode_worker_backend(ty_decode_worker_t *w);
/* Stop the thread (what is in flight is dropped without events) and free. NULL is a no-op. */
void ty_decode_worker_free(ty_decode_worker_t *w);

#endif
