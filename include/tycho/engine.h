/* The engine: a model, a backend and a KV page pool put together, with chunked, batched
 * forward passes and a generation loop (sampling, stop strings, max tokens, EOS).
 *
 * Threads: an engine and its sequences are used by one thread at a time. Ownership: the
 * engine borrows the model (which must outlive it) and owns its backend and pool.
 */
#ifndef TYCHO_ENGINE_H
#define TYCHO_ENGINE_H

#include "tycho/backend.h"
#include "tycho/grammar.h"
#include "tycho/kvpool.h"
#include "tycho/model.h"
#include "tycho/sampling.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ty_engine ty_engine_t;

struct ty_engine_opts {
    uint32_t n_threads;        /* CPU threads, 0 = 1 */
    uint32_t kv_block_tokens;  /* B, 0 = 64 */
    uint32_t kv_pages;         /* pages per layer, 0 = kv_bytes' worth, else max_seqs
                                * sequences of min(max_ctx, 4096) tokens and at least one of
                                * max_ctx */
    uint64_t kv_bytes;         /* with kv_pages 0: page memory of K and V over all layers */
    uint32_t max_seqs;         /* for the kv_pages default, 0 = 8 */
    uint32_t max_ctx;          /* context per sequence, 0 = the model's (at most
                                * TY_ENGINE_MAX_CTX); lowered to what the KV pool holds */
    uint32_t max_batch_tokens; /* tokens per forward call (prefill chunk size), 0 = 512 */
    bool no_prefix_sharing;
    const char *kv_dtype;      /* KV cache element type: "f32", "f16" or "auto" (NULL): f16 for
                                * a model whose matrices are 16-bit or quantized (what
                                * llama.cpp keeps by default), else f32; on either backend. */
    ty_kvpool_block_cb kv_block_cb; /* optional: the pool's prefix index changes, on the
                                     * engine's thread (tycho/kvpool.h) */
    void *kv_block_arg;
    const char *backend;       /* "cpu" (NULL) or "cuda"; TY_ENOTSUP for "cuda" in a build
                                * without CUDA */
    int cuda_device;           /* cuda: device ordinal */
    const char *cuda_weights;  /* cuda: device weight type, see ty_backend_cuda_opts */
    bool cuda_no_graphs;       /* cuda: no CUDA graphs for decode steps */
    /* cpu: page memory from the caller (host memory, storage->host set), e.g. shared memory
     * the transfer engine hands to peers on this host; NULL: the pool's own. Copied; its ctx
     * must outlive the engine. A device backend's page memory takes precedence. */
    const struct ty_kvpool_storage *kv_host_storage;
};

/* The longest context an engine takes (tokens). */
#define TY_ENGINE_MAX_CTX (1u << 20)

/* The context an engine, node or Conductor uses when none is configured: the model's own
 * (<arch>.context_length, HF max_position_embeddings), at most TY_ENGINE_MAX_CTX. */
uint32_t ty_engine_default_ctx(uint32_t model_ctx);

/* The names ty_engine_opts takes, as settings tables list them (NULL-terminated). */
/* kv_dtype: "auto", "f32", "f16" (ty_engine_opts.kv_dtype), NULL-terminated. */
extern const char *const ty_engine_kv_dtype_names[];
/* backend: "cpu", "cuda" (ty_engine_opts.backend), NULL-terminated. */
extern const char *const ty_engine_backend_names[];
/* cuda_weights: "auto", "f32", "f16", "bf16" (ty_engine_opts.cuda_weights). */
extern const char *const ty_engine_cuda_weights_names[];


/* Returns 0, TY_EINVAL (bad options, unknown backend or kv_dtype), TY_ENOTSUP (backend not in
 * this build), TY_ENODEV (no CUDA device), TY_ENOMEM or
 * TY_ECUDA. */
int ty_engine_new(ty_engine_t **out, const ty_model_t *m, const struct ty_engine_opts *opts);
void ty_engine_free(ty_engine_t *e);
ty_kvpool_t *ty_engine_pool(ty_engine_t *e);
/* The engine's backend (borrowed), its name ("cpu", "cuda") and health: false after a sticky
 * device error (then stop taking work; see ty_backend_healthy()). */
ty_backend_t *ty_engine_backend(ty_engine_t *e);
bool ty_engine_healthy(const ty_engine_t *e);
const ty_model_t *ty_engine_model(const ty_engine_t *e);
uint32_t ty_engine_max_ctx(const ty_engine_t *e);
/* How long the forward call now running has run (0: none runs): the daemons' watchdog holds
 * back systemd's keep-alive when it exceeds their stall limit. Any thread. (Test hook: with
 * TYCHO_TEST_HANG_FORWARD=N in the environment the engine's Nth forward call never returns.) */
uint64_t ty_engine_busy_ns(const ty_engine_t *e);
/* Tokens per forward call (max_batch_tokens). */
uint32_t ty_engine_max_batch_tokens(const ty_engine_t *e);

/* Reserve, run and commit a batch, split into forward calls of at most max_batch_tokens
 * (chunked prefill). Logits as ty_backend_forward (rows in batch order); a pipeline stage's
 * layer range and hidden rows (tycho/backend.h) go with each split. With batch->ids each
 * row's greedy pick lands there and the logits rows may stay unwritten (logits is still
 * required: split calls use it as scratch). With batch->draws each row's draw lands in
 * batch->samples (made on the device where the backend draws), except in a call that also
 * computes a prompt's earlier chunk: there the row is in logits and its sample's id is
 * TY_SAMPLE_NOT_DRAWN (the caller draws it with ty_sampler_draw). Returns 0, TY_ENOTSUP,
 * TY_ENOCAPACITY (pool full), TY_ERANGE (beyond max_ctx), TY_EINVAL or TY_ENOMEM. */
int ty_engine_forward(ty_engine_t *e, const struct ty_batch *batch, float *logits);

/* Sliding-window models (model config kv_window > 0): give back the pages of `s` that no
 * layer reads for its next token (before position n_tokens + 1 - kv_window), so a long
 * generation holds a bounded number of pages. Returns the pages released (0 for other
 * models). Only for sequences whose KV is not exported afterwards: ty_engine_generate and the
 * batcher with opts.trim_window call it; prefill nodes do not (their pages go to decode).
 * The engine's thread. */
uint32_t ty_engine_seq_trim(ty_engine_t *e, ty_kvseq_t *s);

enum ty_finish {
    TY_FINISH_NONE = 0,
    TY_FINISH_LENGTH, /* max_tokens */
    TY_FINISH_EOS,
    TY_FINISH_STOP,   /* a stop string */
    TY_FINISH_CTX,    /* context full */
};
const char *ty_finish_name(enum ty_finish f);

#define TY_GEN_MAX_STOP_IDS 16

struct ty_gen_params {
    struct ty_sampling_params sampling;
    uint32_t max_tokens;
    bool ignore_eos;
    const char *const *stop; /* stop strings (text is cut before the match) */
    size_t n_stop;
    /* vLLM's extensions: a sampled stop token ends the request like EOS (finish "stop", the
     * token not in the output); before min_tokens output tokens neither EOS nor a stop token
     * can be sampled (their logits are masked) */
    uint32_t stop_ids[TY_GEN_MAX_STOP_IDS], n_stop_ids;
    uint32_t min_tokens;
    /* Structured output: the sampled text must match this (NULL: unconstrained). Borrowed for the
     * request's life (the API keeps it in the request's arena). */
    const struct ty_gen_grammar *grammar;
};

/* True when `id` ends generation under g: an end-of-generation token (unless ignore_eos) or
 * one of g's stop tokens. */
bool ty_gen_is_end(const struct ty_gen_params *g, const ty_model_t *m, uint32_t id);
/* Before a request's min_tokens output tokens (n_out made so far), hand its sampler the
 * tokens it may not draw next: `eog` (the model's end-of-generation ids, from
 * ty_model_eog_list; not with ignore_eos) and g's stop tokens. No-op otherwise. */
void ty_gen_ban_ends(const struct ty_gen_params *g, uint32_t n_out, const uint32_t *eog,
                     size_t n_eog, ty_sampler_t *s);

struct ty_gen_result {
    uint32_t *ids; /* output token ids (malloc'ed) */
    size_t n_ids;
    char *text;    /* decoded output (malloc'ed; NULL without a tokenizer), NUL-terminated */
    size_t text_len; /* its bytes: a token may decode to a NUL byte inside the text */
    struct ty_sample *samples; /* per output token (malloc'ed), with logprobs */
    enum ty_finish finish;
    uint32_t n_prompt, n_cached; /* prompt tokens, of which found in the prefix cache */
    double prefill_ms, decode_ms;
};
void ty_gen_result_clear(struct ty_gen_result *r);

/* Called after each token of sequence `seq` (streaming); text may be "" while a UTF-8
 * character is incomplete. Return non-zero to stop that sequence. */
typedef int (*ty_gen_token_cb)(void *arg, size_t seq, uint32_t id, const char *text);

/* Generate for `n` prompts at once, all sequences sharing every forward call (continuous
 * batching: prefill of all, then one decode token per live sequence per step). */
int ty_engine_generate(ty_engine_t *e, const uint32_t *const *prompts, const size_t *n_prompt,
                       size_t n, const struct ty_gen_params *p, struct ty_gen_result *results,
                       ty_gen_token_cb cb, void *cb_arg);

#endif
