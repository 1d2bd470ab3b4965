/* Private pieces of the scheduler library: its state (sched.c: nodes and events; policy.c: pick
 * and admission) and a small random generator. Not thread-safe (tycho/sched.h). */
#ifndef TYCHO_SCHED_IMPL_H
#define TYCHO_SCHED_IMPL_H

#include "tycho/u64map.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Small xorshift64* generator: deterministic per seed. */
static inline uint64_t ty__sched_rand_next(uint64_t *state)
{
    uint64_t x = *state ? *state : 0x9e3779b97f4a7c15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* ---- scheduler state ---- */
#include "tycho/sched.h"

struct node {
    bool present;
    bool out; /* present but not chosen (ty_sched_node_set_out): not in prefill_ids/decode_ids */
    enum ty_sched_role role;
    uint32_t max_batch;
    uint64_t kv_cap;
    double busy_until_us; /* prefill: predicted end of the queued work */
    /* prefill nodes that batch: the last forward call of the queue (it ends at
     * busy_until_us), its predicted work, prompts and prompt tokens; it can still take a prompt
     * while it has not started (busy_until_us - tail_us > now) and has room */
    uint32_t batch_prompts, batch_tokens;
    double tail_us;
    uint32_t tail_n;
    uint64_t tail_tokens;
    /* prefill nodes that interleave: the side lane of short prompts beside the queued long
     * work: when its last call ends, and the tokens it holds (of batch_tokens / 2) */
    bool interleaves;
    double lane_until_us;
    uint64_t lane_tokens;
    uint32_t lane_n;                    /* prompts in the lane's last call */
    double long_from_us, long_until_us; /* when a prompt longer than a call is computing */
    uint32_t batch;       /* decode: as last reported */
    uint64_t ctx;
    uint32_t pending;     /* decode: accepted requests not yet arrived */
    uint64_t pending_ctx;
    uint32_t classes[TY_SCHED_MAX_CLASSES]; /* decode: requests in flight to it, per class */
    uint32_t epoch; /* bumped each time the id is added: flights of an earlier life are stale */
};

struct flight {
    uint64_t id;
    uint32_t prefill, decode;
    uint32_t decode_epoch; /* the decode node's epoch when chosen */
    uint32_t priority;
    uint64_t ctx;    /* prompt + expected output: the KV this request will hold on decode */
    uint64_t output; /* expected output tokens (part of ctx) */
    double start_us, end_us; /* predicted (then actual start) decode interval */
    double at_decode_us;
    bool at_decode;
};

struct ty_sched {
    struct ty_sched_opts o;
    struct node nodes[TY_SCHED_MAX_NODES];
    uint32_t prefill_ids[TY_SCHED_MAX_NODES], n_prefill;
    uint32_t decode_ids[TY_SCHED_MAX_NODES], n_decode;
    ty_sched_index_t *ix;
    uint32_t prefix[TY_SCHED_MAX_NODES]; /* scratch of one pick */
    struct flight *fl;
    size_t n_fl, cap_fl;
    struct ty_u64map fl_map; /* id -> index in fl[] */
    uint64_t rng;
    uint32_t rr_prefill, rr_decode;
    double decode_dur_us;
};

enum ty_sched_reject ty__sched_decode_check(const ty_sched_t *s, const struct node *d,
                                            double batch, double ctx_tokens, uint32_t priority,
                                            double *tbt);
int ty__sched_flight_add(ty_sched_t *s, const struct flight *f);
struct flight *ty__sched_flight_get(ty_sched_t *s, uint64_t id);

#endif
