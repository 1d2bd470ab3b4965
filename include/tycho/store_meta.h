/* The KV pool master's metadata (src/store/meta.c, evict.c): pure logic, no sockets, time passed
 * in as milliseconds. Modeled on Mooncake Store's master (docs/arch/store.md).
 *
 * It maps a key to its replicas (node, tier, offset, length, checksum, state) and decides:
 * placement over distinct live nodes preferring the writer's own node; two-phase put (start
 * allocates PENDING replicas, commit makes them COMPLETE, an uncommitted allocation expires and
 * is reclaimed); read leases (a get extends the object's lease, and nothing of a leased object
 * is freed or reused before the lease ends); eviction at a high watermark down to a low one with
 * lru / lfu / length_aware, soft pins (pinned objects go last); per-key replica counts; node
 * heartbeats and dead-node removal. Work for the pool nodes (offload to SSD, load back, copy to
 * another node) comes out as jobs; stored/removed changes come out as events.
 *
 * Threading: none inside; one thread at a time (the master's loop). Ownership: the caller owns
 * the meta object; strings passed in are copied; results are copied into caller structs.
 */
#ifndef TYCHO_STORE_META_H
#define TYCHO_STORE_META_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TY_STORE_KEY_MAX       255 /* bytes in a key (no NUL inside) */
#define TY_STORE_REPLICAS_MAX  8   /* replicas of one key, all tiers together */
#define TY_STORE_NODE_NAME_MAX 255

typedef struct ty_store_meta ty_store_meta_t;

enum ty_store_tier {
    TY_STORE_TIER_DRAM = 1,
    TY_STORE_TIER_SSD = 2,
};

enum ty_store_policy {
    TY_STORE_POLICY_LRU = 0,          /* least recently accessed first (default) */
    TY_STORE_POLICY_LFU = 1,          /* fewest accesses first, ties: least recent */
    TY_STORE_POLICY_LENGTH_AWARE = 2, /* largest (idle time x length) first */
};

enum ty_store_replica_state {
    TY_STORE_REPLICA_PENDING = 1,  /* allocated, being written (put or load) */
    TY_STORE_REPLICA_COMPLETE = 2, /* readable */
};

struct ty_store_replica {
    uint32_t node; /* node id from ty_store_meta_node_add() */
    enum ty_store_tier tier;
    enum ty_store_replica_state state;
    uint64_t offset; /* DRAM: offset in the node's segment; SSD: node's location */
    uint64_t length;
    uint64_t checksum; /* XXH3-64 of the value, 0 before commit */
};

struct ty_store_placement {
    uint32_t n;
    struct ty_store_replica r[TY_STORE_REPLICAS_MAX];
};

struct ty_store_meta_opts {
    enum ty_store_policy policy;
    double high_watermark;     /* DRAM fill ratio that starts eviction; 0: 0.9 */
    double low_watermark;      /* eviction stops below it; 0: high - 0.1 */
    uint64_t put_timeout_ms;   /* an uncommitted put expires after this; 0: 10000 */
    uint64_t lease_ms;         /* one get's lease; 0: 5000 */
    uint64_t node_timeout_ms;  /* a node silent this long is dead; 0: 5000 */
    uint32_t default_replicas; /* replicas of a put that asks for 0; 0: 1 */
    uint64_t align;            /* DRAM allocation unit, a power of two; 0: 64 */
    /* Hot blocks (FAST'25 Mooncake section 6.2, cache load balancing): a committed key whose
     * decayed read rate reaches hot_reads_per_s gets hot_replicas DRAM replicas (REPLICATE
     * jobs); once it falls below half of that, its extra replicas are evicted first. */
    double hot_reads_per_s;    /* 0: off */
    uint32_t hot_replicas;     /* DRAM replicas of a hot key (2..TY_STORE_REPLICAS_MAX); 0: 2 */
    uint32_t hot_max;          /* keys hot at once (the rest wait); 0: 1024 */
    uint64_t hot_half_life_ms; /* half-life of the read rate; 0: 1000 */
};

/* An exponentially decayed read count: each read adds 1, the sum halves every half-life, so a
 * steady rate r (reads/s) makes it r * half_life / ln 2; O(1) per read. Pure. */
struct ty_store_heat {
    double count;
    uint64_t at; /* ms of the last update */
};
/* Count one read at `now` (ms; earlier times count as `at`). */
void ty_store_heat_add(struct ty_store_heat *h, uint64_t now, uint64_t half_life_ms);
/* The read rate (reads/s) the count stands for at `now`. */
double ty_store_heat_rate(const struct ty_store_heat *h, uint64_t now, uint64_t half_life_ms);

const char *ty_store_policy_name(enum ty_store_policy p);

int ty_store_meta_new(ty_store_meta_t **out, const struct ty_store_meta_opts *opts);
void ty_store_meta_free(ty_store_meta_t *m);

/* ---- nodes ---------------------------------------------------------------------------------- */

/* Add a live node with `dram_bytes` of segment and (has_ssd) an SSD tier. A node of the same
 * name already present is removed first (a restart: its replicas leave the map). Returns 0 and
 * *id, or TY_EINVAL (empty or long name, dram_bytes below the alignment). */
int ty_store_meta_node_add(ty_store_meta_t *m, const char *name, uint64_t dram_bytes, bool has_ssd,
                           uint64_t now, uint32_t *id);

/* A node (re-)announces a block it holds, as after a master failover or a restart with its SSD
 * directory: the replica becomes COMPLETE in the map. Returns 0, TY_ENOTFOUND (unknown node),
 * TY_EINVAL (bad key/tier/length), TY_ESTALE (the key is known with another length or
 * checksum), TY_EBUSY (the DRAM range overlaps one in use) or TY_EEXIST (already known). */
int ty_store_meta_node_announce(ty_store_meta_t *m, uint32_t id, const char *key,
                                enum ty_store_tier tier, uint64_t offset, uint64_t length,
                                uint64_t checksum, uint64_t now);

/* Record a heartbeat. Returns 0 or TY_ENOTFOUND (unknown or already dead: re-register). */
int ty_store_meta_node_heartbeat(ty_store_meta_t *m, uint32_t id, uint64_t now);

/* Remove a node now; its replicas leave the map (REMOVED events). Returns 0 or TY_ENOTFOUND. */
int ty_store_meta_node_remove(ty_store_meta_t *m, uint32_t id);

/* The node lost one replica (an SSD bucket evicted for space, a checksum failure). */
int ty_store_meta_replica_lost(ty_store_meta_t *m, uint32_t id, const char *key,
                               enum ty_store_tier tier);

struct ty_store_node_info {
    char name[TY_STORE_NODE_NAME_MAX + 1];
    uint64_t dram_bytes, dram_used;
    bool has_ssd;
    uint64_t last_heartbeat;
    uint64_t reads; /* gets answered with a replica here first (the one the client reads) */
};
/* Node ids run 0..slots-1; ty_store_meta_node_info says TY_ENOTFOUND for a free slot. */
uint32_t ty_store_meta_node_slots(const ty_store_meta_t *m);
int ty_store_meta_node_info(const ty_store_meta_t *m, uint32_t id, struct ty_store_node_info *out);

/* ---- objects -------------------------------------------------------------------------------- */

/* Phase one of a put: place `n_replicas` (0: the default; capped by the live nodes) PENDING
 * replicas of `length` bytes on distinct nodes, the node named `writer` first when it is a pool
 * node. Evicts on a node over its high watermark to make room. Returns 0 and the placement
 * (at least one replica), TY_EEXIST (key present, committed or pending), TY_EUNAVAIL (no live
 * node), TY_ENOCAPACITY (no node has room now: retry later), TY_EINVAL. */
int ty_store_meta_put_start(ty_store_meta_t *m, const char *key, uint64_t length,
                            uint32_t n_replicas, const char *writer, uint64_t now,
                            struct ty_store_placement *out);

/* Phase two: the bytes are written; replicas become COMPLETE with `checksum` (STORED events).
 * Returns 0, TY_ENOTFOUND (no pending put: expired or aborted) or TY_EALREADY (committed). */
int ty_store_meta_put_commit(ty_store_meta_t *m, const char *key, uint64_t checksum, uint64_t now);

/* Give up a pending put; its ranges are freed. Returns 0 or TY_ENOTFOUND. */
int ty_store_meta_put_abort(ty_store_meta_t *m, const char *key);

/* Look up a committed key, count an access and extend its lease to now + lease_ms (*lease_until).
 * out gets the COMPLETE replicas, DRAM first; with several DRAM replicas the first one (the one
 * a client reads) rotates from get to get, so readers spread over them. A get answered from DRAM
 * counts towards the key's heat (hot_reads_per_s). When only SSD replicas exist a load to DRAM is
 * started and TY_EAGAIN returned (ask again shortly). TY_ENOTFOUND when absent or pending. */
int ty_store_meta_get(ty_store_meta_t *m, const char *key, uint64_t now,
                      struct ty_store_placement *out, uint64_t *lease_until);

/* True when the key is committed and has a replica. */
bool ty_store_meta_exists(const ty_store_meta_t *m, const char *key);

/* Remove a key: it disappears at once; ranges of a leased object are freed when the lease ends.
 * Returns 0 or TY_ENOTFOUND. */
int ty_store_meta_remove(ty_store_meta_t *m, const char *key, uint64_t now);

/* Soft pin: pinned keys are evicted only when nothing unpinned is left on the node. Counted:
 * one unpin per successful pin. Returns 0, TY_ENOTFOUND, or TY_EINVAL (unpin of an unpinned). */
int ty_store_meta_pin(ty_store_meta_t *m, const char *key);
int ty_store_meta_unpin(ty_store_meta_t *m, const char *key);

/* Want `n` DRAM replicas of a key on distinct nodes (1..TY_STORE_REPLICAS_MAX); the missing
 * ones come out as REPLICATE jobs from tick (on the emptiest live nodes without one). A key that
 * turns hot gets max(n, hot_replicas). Returns 0, TY_ENOTFOUND or TY_EINVAL. */
int ty_store_meta_set_replicas(ty_store_meta_t *m, const char *key, uint32_t n);

/* Expire uncommitted puts and ended leases' deferred frees, remove dead nodes, evict nodes over
 * the high watermark, schedule replication. Call every few milliseconds. */
void ty_store_meta_tick(ty_store_meta_t *m, uint64_t now);

/* ---- jobs for pool nodes ------------------------------------------------------------------- */

enum ty_store_job_kind {
    TY_STORE_JOB_OFFLOAD = 1,   /* node: copy DRAM [src_offset, +length) to its SSD tier */
    TY_STORE_JOB_LOAD = 2,      /* node: read SSD location src_offset into DRAM dst_offset */
    TY_STORE_JOB_REPLICATE = 3, /* node: read src_node's DRAM src_offset into its dst_offset */
};

struct ty_store_job {
    uint64_t id;
    enum ty_store_job_kind kind;
    char key[TY_STORE_KEY_MAX + 1];
    uint32_t node;     /* the node that does the work */
    uint32_t src_node; /* REPLICATE only */
    uint64_t src_offset, dst_offset, length, checksum;
};

/* Take the next job to send. Returns 0 or TY_EAGAIN when none. */
int ty_store_meta_job_next(ty_store_meta_t *m, struct ty_store_job *out);

/* A job finished: status 0 (OFFLOAD: `result` is the SSD location) or an error (TY_ECHECKSUM
 * drops the SSD replica a LOAD read). Returns 0 or TY_ENOTFOUND for an unknown job id. */
int ty_store_meta_job_done(ty_store_meta_t *m, uint64_t job_id, int status, uint64_t result,
                           uint64_t now);

/* ---- events ---------------------------------------------------------------------------------- */

enum ty_store_event_kind {
    TY_STORE_EVENT_STORED = 1,  /* a replica became readable */
    TY_STORE_EVENT_REMOVED = 2, /* a replica left the map (node, tier) */
};

struct ty_store_event {
    enum ty_store_event_kind kind;
    char key[TY_STORE_KEY_MAX + 1];
    uint32_t node;
    enum ty_store_tier tier;
    uint64_t offset, length, checksum;
};

/* A STORED event for every complete replica of every committed object whose key starts with
 * `prefix` (NULL or "": all), in no particular order, passed to cb. Returns how many. */
size_t ty_store_meta_snapshot(const ty_store_meta_t *m, const char *prefix,
                              void (*cb)(void *arg, const struct ty_store_event *ev), void *arg);

/* Move up to `cap` queued events, oldest first, into out. Returns how many. */
size_t ty_store_meta_events_take(ty_store_meta_t *m, struct ty_store_event *out, size_t cap);

struct ty_store_meta_stats {
    uint64_t objects, pending_puts, nodes_alive;
    uint64_t dram_bytes, dram_used;
    uint64_t evictions, offloads, expired_puts, dead_nodes, deferred_frees;
    uint64_t hot_blocks;           /* keys hot now (their read rate crossed hot_reads_per_s) */
    uint64_t replications_started; /* REPLICATE jobs queued */
    uint64_t replications_done;    /* ... that made a readable replica */
    uint64_t replications_failed;  /* ... that did not (retried after 1 s while wanted) */
    uint64_t cold_evictions;       /* extra replicas of cooled keys evicted (before LRU) */
};
void ty_store_meta_stats(const ty_store_meta_t *m, struct ty_store_meta_stats *out);

#endif
