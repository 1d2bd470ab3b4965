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
struct ty_row_draw;
struct ty_logit_adj;
struct ty_sample;

/* One sequence's part of a batch: `n` new tokens at positions n_past .. n_past+n-1, where
 * n_past = ty_kvseq_n_tokens(seq). The sequence must have room reserved for them
 * (ty_kvpool_seq_reserve); the forward writes their K/V, the caller commits afterwards. */
struct ty_batch_seq {
    ty_kvseq_t *seq;
    const uint32_t *tokens;
    uint32_t n;
    bool logits_all; /* logits for every new token; else only for the last one */
};

struct ty_batch;
/* Optional per-layer hook: called on the forward's calling thread right after layer `layer`'s
 * K/V of every token of `batch` are in the pool, before the next layer starts (the prefill
 * node posts that layer's KV transfer from here). `batch` is the batch the backend runs (a
 * chunk of the caller's when the engine splits it); n_past of a sequence is still
 * ty_kvseq_n_tokens(seq) (nothing committed yet). Must not touch the pool's structure. */
typedef void (*ty_batch_layer_cb)(void *arg, const struct ty_batch *batch, uint32_t layer);

struct ty_batch {
    const struct ty_batch_seq *seqs;
    uint32_t n_seqs;
    ty_batch_layer_cb layer_cb; /* NULL: none */
    void *layer_arg;
    /* A stage of chunked pipeline parallelism (Mooncake §5.1: a group of prefill nodes, each
     * holding a contiguous range of layers): run only layers [layer_begin, layer_end) (both
     * 0: all layers; the K/V of those layers only is written). hidden_in (T, dim) f32, the
     * residual stream entering layer_begin for each token of the batch in batch order, is
     * required when layer_begin > 0 (else the token embeddings are the input). A stage that
     * ends before the last layer sets hidden_out (T, dim): it receives the residual stream
     * after layer layer_end - 1, and no logits are made (logits may be NULL); the last stage
     * leaves hidden_out NULL and makes logits as a whole-model pass does. Backends that
     * cannot run a range refuse it (TY_ENOTSUP). */
    uint32_t layer_begin, layer_end;
    const float *hidden_in;
    float *hidden_out;
    /* Greedy rows: when set (one entry per logits row), every logits row is decided by its
     * argmax alone: ids[i] receives ty_logits_argmax() of row i, and the logits buffer may be
     * left unwritten (NULL is allowed), so a device backend copies back 4 bytes a row instead
     * of the vocabulary. A backend that cannot pick on its side has the rows written and
     * picked on the host by ty_backend_forward (same result). */
    uint32_t *ids;
    /* Draws: one per logits row (tycho/sampling.h's halves of a draw), row i adjusted by its
     * entries of adj (indices draws[i].adj_begin.. of this array) and drawn; samples[i]
     * receives the token and the log-probabilities asked for. A device backend draws on its
     * side (its own rounding of ty_sampler_draw) and may leave the logits rows unwritten, so
     * it copies back a few bytes a row; for the others ty_backend_forward draws each row the
     * backend wrote (then logits is required), exactly as ty_sampler_sample would. */
    const struct ty_row_draw *draws;
    const struct ty_logit_adj *adj;
    struct ty_sample *samples;
};

/* Rows of logits a batch produces (sum over sequences of n or 1; 0 with hidden_out). */
uint32_t ty_batch_n_logits(const struct ty_batch *b);
/* Tokens of a batch (sum over sequences of n). */
uint32_t ty_batch_n_tokens(const struct ty_batch *b);
/* Whether the batch is a pipeline stage (a layer range or hidden states in or out), and the
 * layer range it runs for a model of n_layers: [*begin, *end). TY_EINVAL for a range that is
 * empty, beyond n_layers, starts past 0 without hidden_in, or ends before n_layers without
 * hidden_out (or at n_layers with it). */
int ty_batch_layers(const struct ty_batch *b, uint32_t n_layers, uint32_t *begin, uint32_t *end);

struct ty_backend_cpu_opts {
    uint32_t n_threads; /* worker threads including the caller; 0 = 1 */
};

/* The CPU reference backend: OpenBLAS GEMMs, f32 activations and KV, F16/BF16/quantized weights
 * converted to f32 tile by tile (a few hundred KiB of scratch, no full f32 copy). */
int ty_backend_cpu_new(ty_backend_t **out, const struct ty_backend_cpu_opts *opts);

struct ty_backend_cuda_opts {
    int device;          /* CUDA device ordinal */
    const char *weights; /* device weight type: NULL or "auto" (F32 stays f32, F16 f16, BF16
                          * bf16, Q8_0 becomes f16), "f32", "f16" or "bf16" */
    bool no_graphs;      /* never capture decode steps into CUDA graphs */
};

/* The CUDA backend (src/engine/cuda/): weights uploaded once per model, f32 activations, KV
 * pages in device memory (see ty_backend_kv_storage()), one stream, cuBLAS projections.
 * Returns TY_ENOTSUP in a build without CUDA, TY_ENODEV when no usable device exists,
 * TY_EINVAL for bad options, TY_ECUDA / TY_ENOMEM on a failed setup. */
int ty_backend_cuda_new(ty_backend_t **out, const struct ty_backend_cuda_opts *opts);

/* Backend by name: "cpu" (cpu_opts) or "cuda" (cuda_opts; either opts may be NULL for the
 * defaults). TY_EINVAL for an unknown name, else as the constructor. */
int ty_backend_new_by_name(ty_backend_t **out, const char *name,
                           const struct ty_backend_cpu_opts *cpu_opts,
                           const struct ty_backend_cuda_opts *cuda_opts);

void ty_backend_free(ty_backend_t *b);
const char *ty_backend_name(const ty_backend_t *b);

/* Page memory the KV pool used with this backend must have: fills *out and returns 1 for
 * backend memory (pass out as ty_kvpool_opts.storage), 0 for host memory. The hooks stay
 * valid until ty_backend_free(); free the pool first. */
int ty_backend_kv_storage(ty_backend_t *b, struct ty_kvpool_storage *out);

/* False once the backend saw a device error it cannot recover from (a sticky CUDA error):
 * every later forward fails with TY_ECUDA, and a node should stop taking work and exit so
 * that traffic moves elsewhere. Always true for the CPU backend. */
bool ty_backend_healthy(const ty_backend_t *b);

/* Run the forward pass; writes ty_batch_n_logits(batch) rows of n_vocab floats to `logits`
 * (host memory), in batch order. Returns 0, TY_EINVAL (bad batch: position beyond context,
 * unreserved pages, token id out of range, a pool whose memory is not this backend's, a bad
 * layer range), TY_ENOTSUP (a layer range on a backend that runs only whole passes),
 * TY_ENOMEM or TY_ECUDA. */
int ty_backend_forward(ty_backend_t *b, const ty_model_t *m, ty_kvpool_t *pool,
                       const struct ty_batch *batch, float *logits);

#endif
