/* The batcher: continuous batching over one engine, the one loop that `tycho serve`'s worker,
 * the decode node and the prefill node run (DESIGN.md §9 "one batcher"). It owns the
 * requests it is given and decides, step by step, which of them share the next forward call:
 *
 *   admit    waiting requests join in order (preempted ones first) while the pages of what
 *            they still have to compute can be reserved, keeping a 1 % watermark free for the
 *            running ones to grow into; with opts.lookahead up to that many requests that
 *            fit may pass the first queued one that does not (never a preempted one); a
 *            prompt whose first block another running prompt is computing waits for it (then
 *            finds it in the page cache);
 *   grow     before each step every running request gets room for its next tokens, oldest
 *            first; when the pool is full the newest running request is preempted: its pages
 *            go back (its full blocks stay cached) and it is recomputed from its tokens when
 *            readmitted, its sampler kept, so its answer is the one it would have given;
 *   step     one forward call within opts.step_tokens: every decoding request's next token,
 *            then prompts that fit whole (half the budget while a longer prompt is part way),
 *            then chunks of longer prompts, oldest first; requests whose tokens are all in
 *            are sampled;
 *   finish   end-of-generation or stop token (not part of the output), max_tokens, context
 *            full; the hooks add their own (stop strings) and see every token and every end.
 *
 * A request may also start with its prompt's KV coming from elsewhere (a decode node's KV is
 * written by a prefill node): ty_batcher_add_reserved() reserves its pages at once and
 * ty_batcher_kv_landed() makes it run, with the first token sampled there.
 *
 * Threading: a batcher and its requests belong to one thread (the engine's); the hooks run on
 * it, inside the call that caused them. Ownership: the batcher borrows the engine (which must
 * outlive it) and copies what ty_batcher_add() is given; a request is freed right after its
 * on_end hook returns.
 */
#ifndef TYCHO_BATCHER_H
#define TYCHO_BATCHER_H

#include "tycho/engine.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct ty_batcher ty_batcher_t;
typedef struct ty_breq ty_breq_t;

/* What one forward call of a step did (ty_batcher_hooks.on_forward). */
struct ty_batcher_call {
    uint32_t n_seqs;      /* requests in the call */
    uint32_t n_tokens;    /* tokens computed */
    uint32_t prefix;      /* sum over the call's pieces of the KV already present before it */
    uint64_t attn_work;   /* sum of L^2 - P^2 over the pieces (L = P + n): the attention term */
    uint64_t context;     /* sum over the pieces of P + n: positions attended by last tokens */
    bool decode_only;     /* one token for every request: a decode step */
    uint64_t forward_us;  /* the forward pass */
    uint64_t step_us;     /* forward, sampling and the token hooks */
    int rc;               /* the forward's result (its requests ended with it when < 0) */
};

struct ty_batcher_hooks {
    void *arg;
    /* A token was sampled for r. `fin` is the batcher's verdict: TY_FINISH_EOS (an end or stop
     * token: not appended to the output), TY_FINISH_LENGTH (max_tokens), TY_FINISH_CTX
     * (context full) or TY_FINISH_NONE. Returns the finish to apply (e.g. TY_FINISH_STOP for a
     * stop string; `fin` to agree) or a negative TY_E* that ends r with that error. Required. */
    int (*on_token)(void *arg, ty_breq_t *r, const struct ty_sample *s, enum ty_finish fin);
    /* r leaves the batcher: finished (`fin` set, rc 0) or failed / cancelled (rc < 0). Its KV
     * and tokens are still readable; r is freed when this returns. Required. */
    void (*on_end)(void *arg, ty_breq_t *r, enum ty_finish fin, int rc);
    /* Optional: r is admitted for the first time; its sequence holds what the page cache had
     * of its prompt and pages reserved for the rest. The hook may import more of the prompt's
     * KV into those pages (the KV pool: ty_kvpool_seq_commit) and prepare what r's KV is for;
     * a negative TY_E* ends r with it. */
    int (*on_admit)(void *arg, ty_breq_t *r);
    /* Optional: layer `layer`'s K/V of `piece` (r's tokens in this call, n_past =
     * ty_kvseq_n_tokens(piece->seq) before the call commits) is in the pool. */
    void (*on_layer)(void *arg, ty_breq_t *r, const struct ty_batch_seq *piece, uint32_t layer);
    /* Optional: after each step's forward call and its sampling. */
    void (*on_forward)(void *arg, const struct ty_batcher_call *call);
    /* Optional: r was preempted (n: preemptions since the batcher started). */
    void (*on_preempt)(void *arg, ty_breq_t *r, uint64_t n);
    /* A pipeline stage before the last (ty_breq_opts.layer_end < n_layers): the hidden
     * states (n, dim) f32 leaving its last layer for prompt tokens [first, first + n), each
     * token once, in order, right after the call that computed them (the node hands them to
     * the next stage). Required for such requests (ty_batcher_add refuses them without). */
    void (*on_hidden)(void *arg, ty_breq_t *r, const float *rows, uint32_t first, uint32_t n);
};

struct ty_batcher_opts {
    ty_engine_t *engine;   /* borrowed */
    uint32_t max_running;  /* requests in one forward call; 0 = 64 */
    uint32_t step_tokens;  /* tokens in one forward call; 0 = the engine's max_batch_tokens */
    uint32_t lookahead;    /* requests that may pass a queued one that does not fit, in all,
                            * when they fit (0: strict order) */
    bool no_grow;          /* every request reserves all it computes at admission (prefill
                            * only: max_tokens 1); nothing is ever preempted */
    bool trim_window;      /* sliding-window models: after each call, release the pages no
                            * layer reads again (ty_engine_seq_trim); not where a request's
                            * whole KV is exported later (prefill). A decode node trims: its
                            * KV pool writes take each block as the step that fills it ends */
    struct ty_batcher_hooks hooks;
};

/* A request. Copied by ty_batcher_add*: prompt and gen (its stop strings are not kept: they
 * are the on_token hook's). */
struct ty_breq_opts {
    uint64_t id;
    const uint32_t *prompt;
    uint32_t n_prompt;
    const struct ty_gen_params *gen;
    void *user; /* the caller's, ty_breq_user() */
    /* A stage of chunked pipeline parallelism (Mooncake §5.1; tycho/backend.h): compute the
     * prompt's layers [layer_begin, layer_end) only (both 0: the whole model). Its KV is
     * private (ty_kvpool_seq_set_private: never in the page cache), it runs alone in its
     * forward calls, and a stage that starts past layer 0 computes a prompt token only once
     * its hidden states came in (ty_batcher_stage_input). A stage before the last hands its
     * hidden states out (hooks.on_hidden) and ends (on_end, TY_FINISH_NONE, rc 0) when the
     * prompt is computed, sampling nothing; the last stage samples as a whole request does. */
    uint32_t layer_begin, layer_end;
};

/* Returns 0, TY_EINVAL or TY_ENOMEM. */
int ty_batcher_new(ty_batcher_t **out, const struct ty_batcher_opts *opts);
/* Frees every request without calling its hooks. NULL is a no-op. */
void ty_batcher_free(ty_batcher_t *b);
/* Ends every request with `rc` (on_end), e.g. TY_ESHUTDOWN. */
void ty_batcher_end_all(ty_batcher_t *b, int rc);

/* Queue a request; it is admitted by a later step. Returns 0, TY_EINVAL (empty prompt, a token
 * out of the vocabulary, max_tokens 0, a grammar ty_grammar_compile refuses), TY_ENOTSUP (a
 * grammar for a model without a tokenizer), TY_ERANGE (prompt + 1 beyond the context) or
 * TY_ENOMEM. *out (optional) is valid until its on_end.
 * With gen->grammar (structured output) the request keeps a matcher: before each draw the
 * tokens the grammar does not admit next get -inf logits (greedy and sampled draws alike), the
 * budget being what max_tokens and the context leave (tycho/grammar.h: the output always
 * parses), and every token taken (ty_batcher_kv_landed's first one too) advances it; a token
 * it does not admit ends the request with TY_EPROTO. The first grammar request builds the
 * tokenizer's vocabulary index (tenths of a second for 128k tokens), kept for the batcher. */
int ty_batcher_add(ty_batcher_t *b, const struct ty_breq_opts *o, ty_breq_t **out);
/* A request whose prompt KV is written by someone else: its prompt's pages are reserved now
 * (TY_ENOCAPACITY when they and the watermark, plus what preempted requests need back, are
 * not free while others hold pages), as ty_batcher_add's errors otherwise. The request waits,
 * outside every step, until ty_batcher_kv_landed() or ty_batcher_end(). */
int ty_batcher_add_reserved(ty_batcher_t *b, const struct ty_breq_opts *o, ty_breq_t **out);
/* The prompt's KV of a reserved request is in its pages: commit it, take `first` (the first
 * token, sampled where the prompt was computed by a sampler with the same parameters and
 * seed: r's sampler draws once too, so that the rest of the stream is what one sampler gives)
 * through on_token, and run r with the others. n_cached: prompt tokens the computing side
 * reused (usage). Returns 0 or a TY_E* (r is then ended with it). */
int ty_batcher_kv_landed(ty_batcher_t *b, ty_breq_t *r, const struct ty_sample *first,
                         uint32_t n_cached);
/* A stage past layer 0: the hidden states (n, dim) f32 entering its first layer for the next
 * n prompt tokens (copied). Returns 0, or TY_EINVAL (not such a stage, or more rows than the
 * prompt has). */
int ty_batcher_stage_input(ty_batcher_t *b, ty_breq_t *r, const float *rows, uint32_t n);
/* Prompt tokens whose hidden states r has received (a stage past layer 0). */
uint32_t ty_breq_stage_ready(const ty_breq_t *r);
/* End r now with `rc` (< 0, e.g. TY_ECANCELED): on_end runs, r is freed. */
void ty_batcher_end(ty_batcher_t *b, ty_breq_t *r, int rc);
/* The request with this id (linear in the requests held), or NULL. */
ty_breq_t *ty_batcher_find(ty_batcher_t *b, uint64_t id);

/* Admit, grow and run one forward call. Returns the number of requests stepped (0: nothing
 * could run: idle, or everything waits for KV or pages) or a negative TY_E* from the forward
 * (the call's requests were ended with it). */
int ty_batcher_step(ty_batcher_t *b);

struct ty_batcher_stats {
    uint32_t running;     /* admitted (computing or decoding) */
    uint32_t waiting;     /* queued, preempted ones included */
    uint32_t requeued;    /* of the waiting: preempted ones */
    uint32_t reserved;    /* waiting for their KV (ty_batcher_add_reserved) */
    uint64_t preemptions; /* since new */
    uint64_t steps;       /* forward calls since new */
};
void ty_batcher_stats(const ty_batcher_t *b, struct ty_batcher_stats *out);
bool ty_batcher_idle(const ty_batcher_t *b); /* nothing held at all */
/* The forward call of the step whose token hooks (on_token, on_end) are running: n_seqs,
 * n_tokens, prefix, attn_work, context, forward_us and rc are set (step_us is not yet); NULL
 * outside them (an on_end from a cancel or an expiry). Worker thread. */
const struct ty_batcher_call *ty_batcher_call(const ty_batcher_t *b);

uint64_t ty_breq_id(const ty_breq_t *r);
void *ty_breq_user(const ty_breq_t *r);
ty_kvseq_t *ty_breq_seq(const ty_breq_t *r);     /* NULL while waiting */
const uint32_t *ty_breq_tokens(const ty_breq_t *r); /* prompt then output */
uint32_t ty_breq_n_prompt(const ty_breq_t *r);
uint32_t ty_breq_n_output(const ty_breq_t *r);
/* Prompt tokens found computed at first admission (page cache, on_admit's imports) or
 * reported by ty_batcher_kv_landed. */
uint32_t ty_breq_n_cached(const ty_breq_t *r);
uint32_t ty_breq_n_preempted(const ty_breq_t *r);

#endif
