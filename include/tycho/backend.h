/* Compute backends behind one interface (the ggml-backend pattern: an object is an interface
 * table plus a context). A backend runs one batched forward pass over a mix of prefill chunks
 * and decode tokens of many sequences, reading and writing their KV in a ty_kvpool.
 *
 * Threads: a backend is used by one thread at a time (the engine's); it may use its own worker
 * threads inside a call. Ownership: the caller owns model, pool, sequences and buffers; the
 * backend owns only its scratch memory and threads.
 */
#ifndef TYCHO_BACKEND_H
#define TYCHO_BACKEND_H

#include "tycho/kvpool.h"
#include "tycho/model.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct ty_backend ty_backend_t;

/* One sequence's part of a batch: `n` new tokens at positions n_past .. n_past+n-1, where
 * n_past = ty_kvseq_n_tokens(seq). The sequence must have room reserved for them
 * (ty_kvpool_seq_reserve); the forward writes their K/V, the caller commits afterwards. */
struct ty_batch_seq {
    ty_kvseq_t *seq;
    const uint32_t *tokens;
    uint32_t n;
    bool logits_all; /* logits for every new token; else only for the last one */
};

struct ty_batch {
    const struct ty_batch_seq *seqs;
    uint32_t n_seqs;
};

/* Rows of logits a batch produces (sum over sequences of n or 1). */
uint32_t ty_batch_n_logits(const struct ty_batch *b);

struct ty_backend_cpu_opts {
    uint32_t n_threads; /* worker threads including the caller; 0 = 1 */
};

/* The CPU reference backend: OpenBLAS GEMMs, f32 activations and KV, F16/BF16/Q8_0 weights
 * converted to f32 tile by tile (a few hundred KiB of scratch, no full f32 copy). */
int ty_backend_cpu_new(ty_backend_t **out, const struct ty_backend_cpu_opts *opts);
void ty_backend_free(ty_backend_t *b);
const char *ty_backend_name(const ty_backend_t *b);

/* Run the forward pass; writes ty_batch_n_logits(batch) rows of n_vocab floats to `logits`,
 * in batch order. Returns 0, TY_EINVAL (bad batch: position beyond context, unreserved pages,
 * token id out of range) or TY_ENOMEM. */
int ty_backend_forward(ty_backend_t *b, const ty_model_t *m, ty_kvpool_t *pool,
                       const struct ty_batch *batch, float *logits);

#endif
