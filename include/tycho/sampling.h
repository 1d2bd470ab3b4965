/* Token sampling from a row of logits: penalties (repetition as in CTRL/llama.cpp, presence
 * and frequency as in OpenAI's API), logit bias (OpenAI's), then greedy, or top-k -> temperature -> top-p -> min-p and
 * a seeded draw. Same params and seed give the same tokens.
 * Threads: a sampler is per sequence and owned by one thread; it keeps its RNG state.
 */
#ifndef TYCHO_SAMPLING_H
#define TYCHO_SAMPLING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TY_SAMPLE_MAX_LOGPROBS 20
#define TY_SAMPLE_MAX_LOGIT_BIAS 300 /* entries of ty_sampling_params.logit_bias */

/* OpenAI's logit_bias entry: `bias` is added to token `id`'s logit before any sampling step
 * (-100 bans a token in practice, +100 all but forces it). */
struct ty_logit_bias {
    uint32_t id;
    float bias;
};

struct ty_sampling_params {
    float temperature;        /* <= 0: greedy */
    uint32_t top_k;           /* 0: off */
    float top_p;              /* >= 1 or <= 0: off */
    float min_p;              /* <= 0: off */
    uint64_t seed;
    float repetition_penalty; /* 1 (or 0): off; logit > 0 ? logit / p : logit * p */
    float presence_penalty;   /* subtracted once from every token seen */
    float frequency_penalty;  /* subtracted per occurrence */
    uint32_t penalty_last_n;  /* window of history the penalties see; 0 = all */
    uint32_t n_logprobs;      /* top-n log-probabilities to report, <= TY_SAMPLE_MAX_LOGPROBS */
    bool logprobs;            /* report the chosen token's log-probability; implied by
                               * n_logprobs > 0. Off: ty_sample.logprob and n_top stay 0 (saves
                               * a pass of exp over the vocabulary per token) */
    uint32_t n_logit_bias;    /* entries used in logit_bias, <= TY_SAMPLE_MAX_LOGIT_BIAS */
    struct ty_logit_bias logit_bias[TY_SAMPLE_MAX_LOGIT_BIAS]; /* after the penalties */
};

struct ty_token_logprob {
    uint32_t id;
    float logprob;
};

#define TY_SAMPLE_NOT_DRAWN UINT32_MAX /* ty_sample.id of a draw the backend left to the host */

struct ty_sample {
    uint32_t id;
    float logprob; /* of the chosen token under the penalised distribution (temperature 1);
                    * 0 unless the params ask for log-probabilities */
    uint32_t n_top;
    struct ty_token_logprob top[TY_SAMPLE_MAX_LOGPROBS];
};

typedef struct ty_sampler ty_sampler_t;

/* Returns 0, TY_EINVAL (parameters out of range) or TY_ENOMEM. */
int ty_sampler_new(ty_sampler_t **out, const struct ty_sampling_params *p, uint32_t n_vocab);
void ty_sampler_free(ty_sampler_t *s);
/* Tokens the next ty_sampler_sample() may not pick (their logits become -inf after the
 * penalties and the bias; greedy too): the end-of-generation and stop tokens while a request
 * has not reached its min_tokens. Copies up to TY_SAMPLE_MAX_BAN ids; applies to one draw. */
#define TY_SAMPLE_MAX_BAN 64
void ty_sampler_ban_next(ty_sampler_t *s, const uint32_t *ids, size_t n);
/* Pick the next token. `logits` (n_vocab) is modified in place; `history` is the sequence so
 * far (prompt and output) for the penalties. The same as ty_sampler_prepare followed by
 * ty_sampler_draw on the row. */
int ty_sampler_sample(ty_sampler_t *s, float *logits, const uint32_t *history, size_t n_history,
                      struct ty_sample *out);

/* ---- a draw in two halves: made on the host, carried out where the logits are ------------- */

/* What the penalties, the logit bias and a pending ban do to one token's logit l:
 * l = (l > 0 ? l / rep : l * rep) - sub, then l += bias (bias -inf: banned). rep 1, sub 0,
 * bias 0 leave l as it is (bit for bit). */
struct ty_logit_adj {
    uint32_t id;
    float rep, sub, bias;
};

/* One draw: its adjustments (entries adj_begin.. of the caller's array, one per token id), then
 * greedy (temperature <= 0: the argmax) or top-k -> temperature -> top-p -> min-p and the
 * uniform u in [0, 1) the sampler drew; the log-probabilities the params ask for. */
struct ty_row_draw {
    float temperature, top_p, min_p;
    uint32_t top_k;
    double u;
    uint32_t adj_begin, n_adj;
    uint32_t n_logprobs; /* top log-probabilities wanted (<= TY_SAMPLE_MAX_LOGPROBS) */
    bool logprobs;       /* the chosen token's log-probability (implied by n_logprobs) */
};

/* The adjustment entries the next draw needs (bounded by the penalty window's distinct tokens,
 * the logit bias and the ban). */
uint32_t ty_sampler_adj_count(const ty_sampler_t *s, size_t n_history);
/* Make the next draw: its adjustments into adj[0..*n_adj) (cap entries; d->adj_begin is left
 * for the caller), the RNG's uniform (drawn as ty_sampler_sample would: only when sampling), the
 * pending ban taken. TY_ENOSPC (nothing consumed) when cap < ty_sampler_adj_count(). */
int ty_sampler_prepare(ty_sampler_t *s, const uint32_t *history, size_t n_history,
                       struct ty_row_draw *d, struct ty_logit_adj *adj, uint32_t cap,
                       uint32_t *n_adj);
/* Carry out a prepared draw on a row of raw logits (modified in place) with this sampler's
 * scratch: what ty_sampler_sample would have picked. adj: the draw's own entries. */
void ty_sampler_draw(ty_sampler_t *s, float *logits, const struct ty_row_draw *d,
                     const struct ty_logit_adj *adj, struct ty_sample *out);
/* Whether the next ty_sampler_sample() is the argmax of the raw logits and nothing else:
 * greedy, no penalty, no logit bias, no ban pending, no log-probabilities. Its result is then
 * {ty_logits_argmax(row), 0...}, which a device can compute without sending the row back
 * (struct ty_batch.ids). */
bool ty_sampler_plain_greedy(const ty_sampler_t *s);
/* Greedy decoding's pick: the index of the largest of l[0..n) (the lowest among equal maxima;
 * NaN never wins; 0 when every value is NaN). */
uint32_t ty_logits_argmax(const float *l, uint32_t n);

#endif
