/* The Conductor's scheduler: prefix index, placement policies, cost model and admission
 * (docs/arch/sched.md; Mooncake arXiv 2407.00079 §6-§7, FAST'25 §4-§5, Algorithm 1).
 *
 * A ty_sched_t is pure logic: node state and block events come in through calls, time comes in
 * as an argument (microseconds on any monotonic origin), and no call touches a socket or a
 * clock. The live Conductor feeds it from heartbeats and KV block events; `tycho sim` feeds it
 * from simulated nodes. One scheduler serves one model. It is not thread-safe: one thread owns
 * it (the Conductor's loop thread, or one simulation). It owns everything it allocates; the
 * caller keeps ownership of the requests and arrays it passes in.
 */
#ifndef TYCHO_SCHED_H
#define TYCHO_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TY_SCHED_MAX_NODES 256  /* node ids are 0 .. TY_SCHED_MAX_NODES-1 */
#define TY_SCHED_MAX_CLASSES 8  /* priority classes with their own SLOs */
#define TY_SCHED_NODE_NONE UINT32_MAX

/* ---- cost model ------------------------------------------------------------------------- */

/* Predicted times in microseconds for one model on one kind of node.
 *
 * Prefill of a prompt of L tokens whose first P tokens are cached (paper Eq. 1 is quadratic in
 * the prompt length; the L^2 - P^2 term is causal attention over the new tokens):
 *     t_prefill(L, P) = prefill[0] + prefill[1] * (L - P) + prefill[2] * (L^2 - P^2)
 * One decode step of a batch of B sequences holding C context tokens in total (weights are
 * read once per step, KV once per context token):
 *     t_step(B, C) = decode[0] + decode[1] * B + decode[2] * C
 * Moving T tokens of KV between nodes: T * kv_bytes_per_token / net_bytes_per_us. */
struct ty_sched_cost {
    double prefill[3];
    double decode[3];
    double kv_bytes_per_token;
    double net_bytes_per_us;
    uint32_t block_tokens; /* tokens per prefix-hash block (traces: 512) */
};

/* The built-in profiles (derivation in docs/arch/sched.md): "llama3-70b-8xa800",
 * "llama3-70b-8xh800". Returns 0 or TY_ENOTFOUND. */
int ty_sched_cost_profile(const char *name, struct ty_sched_cost *out);

/* What a config may override in a cost model (the Conductor's `cost:` and a sim spec's): the
 * prefill and decode coefficients (n = 0: keep, else exactly 3 finite values >= 0) and the
 * network bandwidth (<= 0: keep). Returns 0, or TY_EINVAL with `why` naming the field (c is
 * then unchanged). */
int ty_sched_cost_override(struct ty_sched_cost *c, const double *prefill, uint32_t n_prefill,
                           const double *decode, uint32_t n_decode, double net_gbytes_per_s,
                           char *why, size_t cap);

double ty_sched_cost_prefill_us(const struct ty_sched_cost *c, uint64_t tokens, uint64_t cached);
double ty_sched_cost_step_us(const struct ty_sched_cost *c, uint64_t batch, uint64_t ctx_tokens);
double ty_sched_cost_transfer_us(const struct ty_sched_cost *c, uint64_t tokens);

/* Chunked pipeline parallelism (Mooncake §5.1): a prompt cut into chunks of `chunk_tokens`
 * flows through a group of `stages` prefill nodes, each holding a contiguous 1/stages of the
 * layers; chunk j runs on stage s once stage s-1 has handed it over (its hidden states,
 * hidden_bytes_per_token per token at the cost model's net_bytes_per_us, one hand-over at a
 * time per link) and stage s is done with chunk j-1. A stage's call costs 1/stages of the
 * whole model's call for the same tokens (fixed cost included: it is mostly reading the
 * weights, which are split by layer). */
struct ty_sched_cpp {
    uint32_t stages;                /* nodes in a group (< 2: no pipeline) */
    uint32_t chunk_tokens;          /* tokens per chunk (0: 2048) */
    double hidden_bytes_per_token;  /* dim * 4 (f32 hidden states) */
};

/* Time from the start until the last stage has computed the last chunk of a prompt of
 * `tokens` with `cached` reused, through c's pipeline; ready_us[s] (NULL: all 0) is when
 * stage s can start, relative to the start. With stages < 2, ty_sched_cost_prefill_us. Pure. */
double ty_sched_cpp_prefill_us(const struct ty_sched_cost *c, const struct ty_sched_cpp *p,
                               uint64_t tokens, uint64_t cached, const double *ready_us);
/* The shortest prompt (a multiple of c->block_tokens, or of 64 when that is 0, up to
 * max_tokens) whose pipelined prefill on idle nodes is shorter than on one node, where it
 * stays shorter up to max_tokens; 0 when none is (a pipeline never pays for itself there).
 * Pure. */
uint64_t ty_sched_cpp_threshold(const struct ty_sched_cost *c, const struct ty_sched_cpp *p,
                                uint64_t max_tokens);

/* One measured forward call. Prefill: x0 = tokens computed, sum of L - P over the call's
 * prompts; x1 = attention work, sum of L^2 - P^2 (one fixed cost per call, so a call of
 * several prompts is one sample). Decode step: x0 = B, x1 = C. Microseconds. */
struct ty_sched_sample {
    double x0, x1;
    double us;
};

/* Least-squares refit of c->prefill (or c->decode) from n >= 3 samples with every coefficient
 * >= 0 (least squares over the feature subsets whose unconstrained fit is non-negative, the
 * best of them), so that a live cluster's noisy
 * samples never yield negative predicted times, then refitted once without the samples whose
 * residual exceeds 8x the median one (a stall or a cold start must not set the model).
 * Samples that all sit at about one size (x0 within 25 %: one prompt length, one batch size)
 * cannot tell the fixed term from the per-token one: the model in c keeps its shape and is
 * scaled by the median of measured / predicted instead. Returns 0, TY_EINVAL or TY_ERANGE
 * (no subset can be solved: the samples carry no information); c is unchanged on error. */
int ty_sched_cost_refit_prefill(struct ty_sched_cost *c, const struct ty_sched_sample *s,
                                size_t n);
int ty_sched_cost_refit_decode(struct ty_sched_cost *c, const struct ty_sched_sample *s,
                               size_t n);

/* A starting cost model for a model served by CPU nodes, derived from its shape the way the
 * GPU profiles are (docs/arch/sched.md) with a stated machine: 50 GFLOP/s of effective prefill
 * compute, 10 GB/s of memory bandwidth, f32 KV, 1 ms of fixed cost per prefill. Meant to be
 * refitted from measured timings within seconds of serving. */
struct ty_sched_model_shape {
    double params;         /* parameters (each read once per decode step) */
    double weight_bytes;   /* bytes of weights read per decode step */
    double layers, attn_dim; /* attention width = query heads * head_dim */
    double kv_bytes_per_token;
};
void ty_sched_cost_cpu(const struct ty_sched_model_shape *m, uint32_t block_tokens,
                       struct ty_sched_cost *out);

/* ---- prefix index ----------------------------------------------------------------------- */

/* Which node holds which block hash. Fed by "stored"/"removed" events; answers the longest
 * cached prefix of a request on every node in O(blocks of the request * nodes / 64). */
typedef struct ty_sched_index ty_sched_index_t;

int ty_sched_index_new(ty_sched_index_t **out);
void ty_sched_index_free(ty_sched_index_t *ix);
int ty_sched_index_add(ty_sched_index_t *ix, uint32_t node, const uint64_t *hashes, size_t n);
int ty_sched_index_del(ty_sched_index_t *ix, uint32_t node, const uint64_t *hashes, size_t n);
/* Forget every block of `node` (node left or restarted). */
void ty_sched_index_drop_node(ty_sched_index_t *ix, uint32_t node);
/* prefix[node] = number of leading blocks of `hashes` that node holds, for node < n_nodes. */
void ty_sched_index_match(const ty_sched_index_t *ix, const uint64_t *hashes, size_t n,
                          uint32_t *prefix, uint32_t n_nodes);
/* Distinct blocks indexed (for metrics and tests). */
size_t ty_sched_index_size(const ty_sched_index_t *ix);

/* ---- scheduler -------------------------------------------------------------------------- */

typedef struct ty_sched ty_sched_t;

enum ty_sched_policy {
    TY_SCHED_POLICY_RANDOM = 0,
    TY_SCHED_POLICY_ROUND_ROBIN,
    TY_SCHED_POLICY_LOAD_BALANCE,    /* shortest predicted queue */
    TY_SCHED_POLICY_CACHE_AWARE,     /* longest local prefix, queue as tie-break */
    TY_SCHED_POLICY_KVCACHE_CENTRIC, /* Algorithm 1: min predicted TTFT with remote prefix */
    TY_SCHED_POLICY_COUNT_,
};

enum ty_sched_admission {
    TY_SCHED_ADMIT_BASELINE = 0, /* TTFT checked at arrival, decode load at decode arrival */
    TY_SCHED_ADMIT_EARLY,        /* decode load as it is now, checked at arrival */
    TY_SCHED_ADMIT_PREDICTED,    /* decode load predicted for when the request reaches decode */
    TY_SCHED_ADMIT_COUNT_,
};

enum ty_sched_reject {
    TY_SCHED_REJECT_NONE = 0,
    TY_SCHED_REJECT_TTFT,        /* predicted TTFT above the class's TTFT SLO */
    TY_SCHED_REJECT_TBT,         /* (predicted) decode TBT above the class's TBT SLO */
    TY_SCHED_REJECT_DECODE_FULL, /* decode node at max batch or out of KV memory */
    TY_SCHED_REJECT_NO_NODE,     /* no prefill or no decode node */
};

enum ty_sched_role {
    TY_SCHED_ROLE_PREFILL = 1,
    TY_SCHED_ROLE_DECODE = 2,
};

/* Names as used in configs and on the command line: "kvcache_centric", "early", "tbt", ...
 * Parsers return 0 or TY_EINVAL. */
const char *ty_sched_policy_name(enum ty_sched_policy p);
int ty_sched_policy_parse(const char *s, enum ty_sched_policy *out);
const char *ty_sched_admission_name(enum ty_sched_admission a);
int ty_sched_admission_parse(const char *s, enum ty_sched_admission *out);
const char *ty_sched_reject_name(enum ty_sched_reject r);

struct ty_sched_slo {
    uint64_t ttft_us; /* 0: no limit */
    uint64_t tbt_us;  /* 0: no limit */
};

struct ty_sched_opts {
    enum ty_sched_policy policy;
    enum ty_sched_admission admission;
    struct ty_sched_cost cost;
    /* kvcache_centric fetches the best remote prefix R instead of using the local one L only
     * when R > L * threshold (and R > L); 1.0 means "any longer remote prefix". */
    double balancing_threshold;
    uint32_t n_classes; /* 1..TY_SCHED_MAX_CLASSES; request.priority indexes slo[] */
    struct ty_sched_slo slo[TY_SCHED_MAX_CLASSES];
    uint64_t seed;               /* for the random policy */
    uint64_t decode_duration_us; /* first estimate of the uniform decode duration (predicted
                                  * admission); refined from ty_sched_request_done() */
    /* Prefill nodes do not fetch a prefix from another node or the pool (the scheduler
     * setting local_prefix_only): kvcache_centric plans with local prefixes only,
     * so a hot prefix is never copied to spread its readers, only recomputed. */
    bool local_prefix_only;
    /* Remote prefixes come from index node `remote_node` only (the live cluster's KV pool,
     * whose blocks are indexed under an id no prefill node has), not from whichever node
     * holds the longest one (the simulator's nodes fetch from each other). */
    bool remote_from_node;
    uint32_t remote_node;
    /* remote_node is an index-only source (the live cluster's KV pool) even without
     * remote_from_node: its blocks may be reset though no node has its id, and it competes
     * with the nodes as the source of a remote prefix. */
    bool has_remote_node;
    /* Idle capacity always admits (the live Conductor sets this). A request whose chosen
     * prefill node is idle is admitted even when its predicted TTFT is over the SLO:
     * queueing is not what breaks it, so refusing only makes the client retry something that
     * will never fit. One that would also be alone on its decode node (nothing reported
     * running there, nothing reserved or in flight to it) is not refused for its predicted
     * TBT either: only the hard limit (its KV over the node's capacity) holds. Either way a
     * live cost model that predicts too high (refitted during a burst, say) sees the timings
     * that correct it, where refusing would leave it with no new sample ever
     * (decision.over_ttft / over_tbt say it happened). */
    bool admit_when_idle;
    /* The decode-stage check of ty_sched_request_at_decode() only reports: the request stays
     * in flight (the live cluster, where the decode node reserved its pages at assignment
     * and runs it whatever the scheduler thinks). */
    bool decode_check_advisory;
    /* Added to every predicted TTFT: what a request's first token takes beyond queue, KV fetch
     * and prefill (RPCs, the KV handoff to the decode node, the token's way back). 0 in the
     * simulator; the live Conductor learns it from measured TTFTs
     * (ty_sched_set_ttft_overhead). */
    double ttft_overhead_us;
    /* Chunked pipeline parallelism (the Conductor's pipeline.stages, the simulator's cpp): a
     * prompt longer than one chunk goes through a group of cpp.stages prefill nodes when it
     * has at least cpp_threshold tokens (0: when ty_sched_cpp_prefill_us predicts it shorter
     * than one node's prefill) and that many prefill nodes are up; its predicted prefill is
     * then the pipeline's, on the chosen node's queue, reusing no prefix (a stage's KV holds
     * its layers only). cpp.stages < 2: off. */
    struct ty_sched_cpp cpp;
    uint64_t cpp_threshold;
};

/* Fill opts with defaults: kvcache_centric, predicted admission, the A800 profile, threshold
 * 1.0, one class without limits, decode duration 10 s. */
void ty_sched_opts_default(struct ty_sched_opts *o);

struct ty_sched_node_desc {
    enum ty_sched_role role;
    uint32_t max_batch;          /* decode: most sequences in a batch (0: unlimited) */
    uint64_t kv_capacity_tokens; /* decode: KV memory in tokens (0: unlimited) */
    /* prefill: prompts the node runs together in one forward call when they queue behind
     * each other (0 or 1: one at a time), and their most prompt tokens per call, cached
     * ones included (0: no limit).
     * A request that joins a call still waiting to start pays no fixed cost (prefill[0])
     * of its own. */
    uint32_t batch_prompts;
    uint32_t batch_tokens;
    /* prefill: the node computes a long prompt in calls of batch_tokens and lets a queued
     * prompt of at most batch_tokens / 2 uncached tokens join them (tycho-prefill does): such a
     * prompt behind more than a call of queued work is predicted to ride in a side lane of
     * half calls (its first token when the call that computes it ends), not behind the whole
     * queue. Needs batch_tokens. */
    bool interleaves;
};

struct ty_sched_request {
    uint64_t id;                 /* unique among requests in flight */
    const uint64_t *block_hashes; /* prefix hashes of the prompt's blocks (borrowed) */
    uint32_t n_blocks;
    uint32_t prompt_tokens;
    uint32_t output_tokens; /* expected output length (max_tokens or a prediction) */
    uint32_t priority;      /* class index < n_classes */
    bool admitted;          /* already accepted by the caller: place it, never refuse it for
                             * an SLO (a request that waited for the first nodes) */
    bool probe;             /* a probe of a cost model that may be stale: never refused for a
                             * predicted SLO miss (TTFT, TBT), only for the decode node's hard
                             * limits (max_batch, KV capacity) */
};

struct ty_sched_decision {
    enum ty_sched_reject reject; /* NONE: accepted and committed */
    uint32_t prefill_node;
    uint32_t decode_node;
    uint32_t prefix_source;    /* node to fetch the prefix from, TY_SCHED_NODE_NONE: local */
    uint32_t local_prefix_blocks;  /* cached on the chosen prefill node */
    uint32_t remote_prefix_blocks; /* best single-node prefix anywhere */
    uint32_t used_prefix_blocks;   /* what the prefill will reuse */
    double queue_us, transfer_us, prefill_us, ttft_us; /* predicted */
    double tbt_us;             /* predicted decode TBT (as checked by the admission mode) */
    /* The decode node as the admission mode pictured it for the moment the KV lands, with
     * the request not yet added (early: as reported at arrival; predicted: the prediction;
     * baseline: nothing, judged == false). Lets a caller measure the prediction's error. */
    bool judged;
    double judged_batch, judged_ctx;
    /* Accepted although predicted over the class's TTFT / TBT SLO: the request was alone on
     * idle nodes (admit_when_idle) or a probe. */
    bool over_ttft, over_tbt;
    /* Refused, and waiting cannot cure it: the request alone on idle nodes is predicted to
     * miss the SLO it was refused for (its transfer + prefill alone over the TTFT SLO, one
     * decode step of it alone over its class's TBT SLO) or it needs more KV than any decode
     * node has. A retry could only be served best-effort, on an idle cluster. */
    bool never_fits;
};

int ty_sched_new(ty_sched_t **out, const struct ty_sched_opts *opts);
void ty_sched_free(ty_sched_t *s);
const struct ty_sched_opts *ty_sched_opts_get(const ty_sched_t *s);
/* Replace the cost model (a refit); decisions from now on use it. TY_EINVAL for non-finite
 * coefficients or block_tokens 0. */
int ty_sched_set_cost(ty_sched_t *s, const struct ty_sched_cost *c);
/* Replace the pipeline settings (opts.cpp, opts.cpp_threshold); TY_EINVAL for a negative or
 * non-finite hidden_bytes_per_token. */
int ty_sched_set_cpp(ty_sched_t *s, const struct ty_sched_cpp *cpp, uint64_t threshold);
/* Replace what an operator tunes in a running scheduler (a SIGHUP reload): o's policy,
 * admission, balancing_threshold, local_prefix_only, n_classes and slo[]; the rest of o is
 * ignored (the cost model, the seed, the decode duration learned so far and the caller's
 * other flags stay). Requests in flight keep their class index; one beyond the new n_classes
 * has no SLO from now on. Returns 0, or TY_EINVAL (nothing changed). */
int ty_sched_set_policy(ty_sched_t *s, const struct ty_sched_opts *o);
/* Replace opts.ttft_overhead_us (finite, >= 0; else TY_EINVAL). */
int ty_sched_set_ttft_overhead(ty_sched_t *s, double us);

/* Nodes. Ids are the caller's (< TY_SCHED_MAX_NODES); TY_EEXIST / TY_ENOTFOUND / TY_EINVAL. */
int ty_sched_node_add(ty_sched_t *s, uint32_t id, const struct ty_sched_node_desc *d);
int ty_sched_node_remove(ty_sched_t *s, uint32_t id);
/* Take a present node out of placement (out = true) or put it back: an out node is never
 * chosen, but keeps its prefix index, queue and the requests in flight to it (a Conductor's
 * circuit breaker: the node is up but failing). TY_ENOTFOUND if absent. */
int ty_sched_node_set_out(ty_sched_t *s, uint32_t id, bool out);
/* A prefill node reports `queued_us` of work left at `now_us`. */
int ty_sched_node_set_prefill_queue(ty_sched_t *s, uint32_t id, uint64_t queued_us,
                                    uint64_t now_us);
/* A decode node reports its running batch (requests it holds, including those that joined). */
int ty_sched_node_set_decode_load(ty_sched_t *s, uint32_t id, uint32_t batch,
                                  uint64_t ctx_tokens);

/* KV block events of a prefill node's cache, or of the remote_node (the prefix index). */
int ty_sched_block_stored(ty_sched_t *s, uint32_t node, const uint64_t *hashes, size_t n);
int ty_sched_block_removed(ty_sched_t *s, uint32_t node, const uint64_t *hashes, size_t n);
/* Forget every block of `node` (it sends its whole cache next). TY_ENOTFOUND if it is neither
 * present nor the remote_node. */
int ty_sched_blocks_reset(ty_sched_t *s, uint32_t node);
/* The current estimate of the uniform decode duration (predicted admission), microseconds. */
double ty_sched_decode_duration_us(const ty_sched_t *s);
const ty_sched_index_t *ty_sched_index(const ty_sched_t *s);

/* Place a request arriving at now_us. Returns 0 with *d filled: accepted (d->reject == NONE,
 * the work is committed to the chosen nodes and the request is in flight) or rejected with a
 * reason. Returns TY_EINVAL for a malformed request (bad class, zero tokens) and TY_EEXIST for
 * an id already in flight. */
int ty_sched_pick(ty_sched_t *s, const struct ty_sched_request *r, uint64_t now_us,
                  struct ty_sched_decision *d);

/* The request's KV reached its decode node at now_us. Under BASELINE admission (and for the
 * hard max_batch / KV limits under every mode) this is where the decode stage may still refuse
 * it: returns 0 with *reject set; a refused request is no longer in flight. TY_ENOTFOUND for
 * an unknown id. */
int ty_sched_request_at_decode(ty_sched_t *s, uint64_t id, uint64_t now_us,
                               enum ty_sched_reject *reject);

/* The request finished at now_us; its reservations are released and, if it decoded, its
 * decode time refines the uniform decode duration. */
int ty_sched_request_done(ty_sched_t *s, uint64_t id, uint64_t now_us);
/* The request failed or was cancelled: released like done, but its decode time says nothing
 * about how long requests decode. */
int ty_sched_request_abort(ty_sched_t *s, uint64_t id);

/* Requests accepted and not yet done. */
size_t ty_sched_in_flight(const ty_sched_t *s);

/* ---- settings ------------------------------------------------------------------------------ */

/* The scheduler's settings table (src/sched/sched_config.c): the `scheduler:` section of
 * `tycho sim`'s cluster spec (src/sim/spec.c), and of the Conductor's once it runs the
 * scheduler. Filled by a ty_config_t (tycho/config.h) on one thread; strings and lists are
 * owned by that config. policy and admission hold enum ty_sched_policy / ty_sched_admission
 * values; the name lists are in that order and are the ones the parsers above use. */
struct ty_config_struct;

struct ty_sched_slo_config {
    char *class_name;  /* priority class; entry i is class i, entry 0 the default */
    uint64_t ttft_ns;  /* 0: no limit */
    uint64_t tbt_ns;   /* 0: no limit */
};

struct ty_sched_model_config {
    char *name;
    struct ty_sched_slo_config *slo;
    uint32_t n_slo;
};

struct ty_sched_config {
    int policy;                          /* enum ty_sched_policy */
    int admission;                       /* enum ty_sched_admission */
    double kvcache_balancing_threshold;
    bool local_prefix_only; /* ty_sched_opts.local_prefix_only */
    uint64_t decode_duration_ns;         /* first estimate of the uniform decode duration */
    uint64_t seed;                       /* random policy */
    struct ty_sched_model_config *models; /* SLOs per model and priority class */
    uint32_t n_models;
};

extern const struct ty_config_struct ty_sched_config_table;
extern const char *const ty_sched_policy_names[];    /* NULL-terminated, enum order */
extern const char *const ty_sched_admission_names[]; /* NULL-terminated, enum order */

#endif
