/* The trace simulator behind `tycho sim` and `tycho cache-sim`: a Mooncake trace reader, a KV
 * pool model with eviction policies, and a discrete-event simulation of prefill nodes, decode
 * nodes and their caches driven by the real scheduler (tycho/sched.h).
 *
 * Everything is single-threaded per object: a trace is immutable once read and may be shared
 * read-only by several simulations running on different threads; a pool or a simulation is
 * owned by one thread. Objects own what they allocate and are released by their _free.
 */
#ifndef TYCHO_SIM_H
#define TYCHO_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tycho/sched.h"

/* ---- traces ----------------------------------------------------------------------------- */

/* One request of a Mooncake-format trace (JSON lines: timestamp in ms, input_length,
 * output_length, hash_ids of 512-token blocks). */
struct ty_sim_request {
    uint64_t arrival_us;
    uint32_t input_tokens;
    uint32_t output_tokens;
    uint32_t n_blocks;
    const uint64_t *blocks; /* points into the trace */
};

struct ty_sim_trace {
    struct ty_sim_request *reqs; /* sorted by arrival (stable) */
    size_t n;
    uint64_t *blocks; /* all hash ids, back to back */
    size_t n_blocks;
};

/* Read a trace file. On a malformed line returns TY_EPARSE and writes "path:line: what" to
 * err (err_len bytes, may be 0); TY_ENOENT etc. for I/O errors. Blank lines are skipped. */
int ty_sim_trace_load(struct ty_sim_trace **out, const char *path, char *err, size_t err_len);
/* The same from a memory buffer (name is used in messages). */
int ty_sim_trace_parse(struct ty_sim_trace **out, const char *name, const char *buf, size_t len,
                       char *err, size_t err_len);
void ty_sim_trace_free(struct ty_sim_trace *t);

/* ---- KV pool model ---------------------------------------------------------------------- */

enum ty_sim_evict {
    TY_SIM_EVICT_LRU = 0,
    TY_SIM_EVICT_LFU,          /* least frequently used, LRU among equals */
    TY_SIM_EVICT_LENGTH_AWARE, /* LFU; among equals evict the block deepest in its request */
    TY_SIM_EVICT_COUNT_,
};

const char *ty_sim_evict_name(enum ty_sim_evict e);
int ty_sim_evict_parse(const char *s, enum ty_sim_evict *out);

typedef struct ty_sim_pool ty_sim_pool_t;

/* Called for each block that enters (stored = true) or leaves the pool. */
typedef void (*ty_sim_pool_event_cb)(void *arg, uint64_t hash, bool stored);

struct ty_sim_pool_opts {
    uint64_t capacity_blocks; /* 0: unlimited */
    enum ty_sim_evict policy;
    ty_sim_pool_event_cb on_event; /* may be NULL */
    void *arg;
};

int ty_sim_pool_new(ty_sim_pool_t **out, const struct ty_sim_pool_opts *o);
void ty_sim_pool_free(ty_sim_pool_t *p);
/* Leading blocks of the sequence that are cached; no side effects. */
size_t ty_sim_pool_prefix(const ty_sim_pool_t *p, const uint64_t *blocks, size_t n);
/* Insert or touch every block of one request (block i at position i), then evict down to the
 * capacity. Aborts on out-of-memory (simulation metadata). */
void ty_sim_pool_access(ty_sim_pool_t *p, const uint64_t *blocks, size_t n);
size_t ty_sim_pool_size(const ty_sim_pool_t *p);
bool ty_sim_pool_contains(const ty_sim_pool_t *p, uint64_t hash);

/* cache-sim: replay every request's blocks; hit = leading blocks already cached. */
struct ty_sim_cache_result {
    uint64_t hit_blocks, total_blocks;
    double hit_rate;
};
int ty_sim_cache_run(const struct ty_sim_trace *t, uint64_t capacity, enum ty_sim_evict policy,
                     struct ty_sim_cache_result *out);

/* ---- cluster simulation ----------------------------------------------------------------- */

struct ty_sim_opts {
    uint32_t n_prefill, n_decode;
    struct ty_sched_opts sched;   /* scheduler under test (its cost model predicts) */
    struct ty_sched_cost truth;   /* what simulated nodes really take (usually = sched.cost) */
    uint64_t cache_blocks;        /* per prefill node, 0: unlimited */
    enum ty_sim_evict evict;
    uint32_t decode_max_batch;    /* 0: unlimited */
    uint64_t decode_kv_tokens;    /* 0: unlimited */
    /* Prefill nodes run the prompts queued behind each other in one forward call, as
     * tycho-prefill does: at most prefill_batch of them (0, 1: one at a time) and
     * prefill_batch_tokens prompt tokens (0: no limit); the first pays the call's fixed cost
     * (prefill[0]), the others only their tokens, and all end with the call. The scheduler
     * is told (ty_sched_node_desc.batch_prompts / batch_tokens). */
    uint32_t prefill_batch, prefill_batch_tokens;
    /* ... and (prefill_interleave, needs prefill_batch_tokens) compute a longer prompt in calls
     * of prefill_batch_tokens, which queued prompts of at most half of that join (any of the
     * next 64 queued that fit, as tycho-prefill does); the scheduler is told
     * (ty_sched_node_desc.interleaves). */
    bool prefill_interleave;
    /* Colocated baseline (vLLM-style): n_colocated > 0 replaces the prefill and decode nodes
     * by that many nodes that each prefill and decode. Every step of a node runs its decodes
     * (one token each) and fills what is left of chunk_tokens with prompt chunks, oldest
     * prompt first (continuous batching with chunked prefill); each node caches the blocks of
     * the prompts it computed (cache_blocks, evict), and a request goes to the node where its
     * predicted TTFT (queued prompt work, minus the prefix that node holds) is lowest. A step
     * costs the decode step of its batch plus its prompt chunks' work, with one fixed cost
     * (the larger of decode[0] and prefill[0]: weights are read once per step). A prompt
     * starts only while the node's KV memory (decode_kv_tokens: prompt + output reserved)
     * and decode_max_batch allow, in arrival order. As at a prefill node in every admission
     * mode, a request whose predicted TTFT breaks its SLO is refused at arrival; nothing is
     * refused for TBT (vLLM has no such check). */
    uint32_t n_colocated;
    uint32_t chunk_tokens;        /* tokens per step, decodes included (0: 512) */
    /* Chunked pipeline parallelism (Mooncake §5.1; not with prefill_interleave): with
     * cpp.stages >= 2, a prompt of at least cpp_threshold tokens (0: ty_sched_cpp_threshold
     * of the truth model up to 1M tokens) runs alone in a call on the node the scheduler chose
     * and the next cpp.stages - 1 nodes by index (a group of consecutive nodes, as the
     * Conductor forms them), each stage starting when its node has finished what it runs;
     * it takes ty_sched_cpp_prefill_us, and the other nodes of the group take nothing else
     * until it is done. The scheduler is told (ty_sched_opts.cpp): it predicts the pipeline's
     * time for such a prompt. */
    struct ty_sched_cpp cpp;
    uint64_t cpp_threshold;
    /* Judge SLO attainment against these thresholds instead of each request's class SLOs
     * (0: the class's), as a benchmark client's goodput does; admission still uses the
     * class SLOs (0 there: nothing refused). */
    struct ty_sched_slo judge;
    double speed;                 /* replay speed: arrival times divided by this */
    uint64_t sample_us;           /* load sample interval (0: 10 s) */
    size_t limit;                 /* first N requests only (0: all) */
    /* Share of the trace's requests in each SLO class (index = class, sched.slo[] order);
     * n_class_mix 0: all in class 0. A request's class is drawn from a hash of its index and
     * sched.seed, so a replay is reproducible. */
    double class_mix[TY_SCHED_MAX_CLASSES];
    uint32_t n_class_mix;
    void (*progress)(void *arg, size_t done, size_t total); /* may be NULL */
    void *progress_arg;
};

void ty_sim_opts_default(struct ty_sim_opts *o);

/* Per request outcome (index = trace order). */
struct ty_sim_outcome {
    uint8_t rejected;  /* enum ty_sched_reject, 0 = served */
    uint8_t at_decode; /* 1: refused at the decode stage (after its prefill ran) */
    uint8_t cls;       /* its SLO class */
    double ttft_us;    /* served only */
    double tbt_us;     /* mean time between tokens while decoding */
};

struct ty_sim_sample {
    double t_s;
    double prefill_queue_s; /* mean queued work per prefill node */
    double decode_batch;    /* mean batch per decode node */
    uint32_t in_flight;
};

struct ty_sim_result {
    size_t n, served, rejected, rejected_at_decode, slo_met;
    size_t pipelined;        /* requests prefilled through a pipeline group (opts.cpp) */
    uint64_t cpp_threshold;  /* the threshold used (0: no pipelining) */
    size_t rejected_by[TY_SCHED_REJECT_NO_NODE + 1];
    double ttft_mean, ttft_p50, ttft_p90, ttft_p99; /* seconds, served requests */
    double tbt_mean, tbt_p50, tbt_p90, tbt_p99;     /* seconds */
    double slo_attainment;   /* slo_met / n (a rejection is a miss; each against its class) */
    uint32_t n_classes;      /* classes below (sched.n_classes) */
    size_t class_n[TY_SCHED_MAX_CLASSES], class_served[TY_SCHED_MAX_CLASSES];
    size_t class_slo_met[TY_SCHED_MAX_CLASSES];
    double goodput_rps;      /* SLO-meeting requests per second of trace time */
    double cache_hit_rate;   /* reused prefix blocks / prompt blocks, served requests */
    double compute_saved;    /* prefill time saved by reuse / prefill time without reuse */
    double wasted_prefill_s; /* prefill time spent on requests refused at decode */
    double prefill_busy_s;   /* prefill time (transfer of fetched prefixes included) run */
    double duration_s;       /* simulated time until the last request finished */
    /* Early and predicted admission: their picture of the decode node (batch, KV tokens) for
     * the moment the KV lands, minus the node's real state then, over `judged` requests that
     * reached decode; bias = mean signed error, err = mean absolute error. */
    size_t judged;
    double judged_batch_bias, judged_batch_err, judged_ctx_bias, judged_ctx_err;
    double landed_batch_mean; /* the real batch those requests found */
    double wall_s;           /* host time the simulation took */
    struct ty_sim_outcome *out;
    struct ty_sim_sample *samples;
    size_t n_samples;
};

/* Run one simulation. Returns 0 with *res filled (free with ty_sim_result_fini), or TY_EINVAL
 * for bad options (no nodes, speed <= 0). */
int ty_sim_run(const struct ty_sim_trace *t, const struct ty_sim_opts *o,
               struct ty_sim_result *res);
void ty_sim_result_fini(struct ty_sim_result *res);

/* ---- effective request capacity --------------------------------------------------------- */

/* The highest arrival rate at which at least `target` of the requests meet both their TTFT
 * and TBT SLOs (a refusal is a miss): the trace replayed at speeds found by bisection (speed
 * 1 first, doubled or halved until the attainment crosses the target, then halved intervals
 * until they are within `precision`). Attainment is not strictly monotonic in the rate; the
 * search reports the highest rate it ran that held the target below the lowest one it ran
 * that did not (the bracket's ends only move inward, so none that held lies above). */
struct ty_sim_capacity_opts {
    double target;         /* 0: 0.9 */
    double precision;      /* relative width of the final interval (0: 0.02) */
    double min_speed, max_speed; /* search range (0: 1/256, 256) */
};

#define TY_SIM_CAPACITY_MAX_RUNS 48
struct ty_sim_capacity_point {
    double speed, rate_rps, attainment;
    double ttft_p90, tbt_p90; /* seconds, served requests */
};

struct ty_sim_capacity {
    double speed;      /* highest speed that held the target, 0: none down to min_speed */
    double rate_rps;   /* requests per second at that speed (the capacity) */
    double attainment; /* SLO attainment there */
    double ttft_p90, tbt_p90; /* seconds, there */
    size_t n_points;   /* every run of the search, by speed */
    struct ty_sim_capacity_point points[TY_SIM_CAPACITY_MAX_RUNS];
    double wall_s;
    int rc;            /* < 0: a run failed (bad options) */
};

/* Mean arrival rate of the first n requests of t (limit 0: all) at speed 1, in requests/s. */
double ty_sim_trace_rate(const struct ty_sim_trace *t, size_t limit);

int ty_sim_capacity_find(const struct ty_sim_trace *t, const struct ty_sim_opts *o,
                         const struct ty_sim_capacity_opts *co, struct ty_sim_capacity *out);

/* Run n searches (opts[i] -> out[i]) on up to `threads` threads; done(arg, i) after each
 * (from any of them, may be NULL). Returns the first failure's code, or 0. */
int ty_sim_capacity_many(const struct ty_sim_trace *t, const struct ty_sim_opts *opts,
                         const struct ty_sim_capacity_opts *co, struct ty_sim_capacity *out,
                         size_t n, int threads, void (*done)(void *arg, size_t i), void *arg);

#endif
