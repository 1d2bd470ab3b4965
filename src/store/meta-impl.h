/* Internals of the master's metadata shared by meta.c (map, nodes, puts, gets) and evict.c
 * (eviction, jobs, tick). Same threading rule as store_meta.h: one thread at a time. */
#ifndef TYCHO_STORE_META_IMPL_H
#define TYCHO_STORE_META_IMPL_H

#include "tycho/store_alloc.h"
#include "tycho/store_meta.h"

struct meta_replica {
    struct ty_store_replica r;
    uint64_t job; /* id of the job working on this replica (offload source, load target), 0 */
    bool extra;   /* made because the key was hot: once it cools, evicted before anything else */
};

struct meta_object {
    char *key;
    uint64_t hash;
    uint64_t length, checksum;
    bool committed;
    uint64_t put_deadline; /* pending puts expire at this time */
    uint64_t last_access;  /* lru, length_aware */
    uint64_t accesses;     /* lfu */
    uint64_t lease_until;  /* nothing of the object is freed before this */
    uint32_t pins;
    uint32_t want_replicas; /* DRAM replicas wanted now (set_replicas, heat); 0: no target */
    uint32_t want_set;      /* the set_replicas target alone; 0: none */
    bool hot;               /* read rate crossed hot_reads_per_s, not yet below half of it */
    struct ty_store_heat heat;
    uint32_t rr;            /* rotates the replica a get names first */
    uint64_t repl_retry_at; /* a REPLICATE job failed: no new one before this */
    uint32_t n;
    struct meta_replica rep[TY_STORE_REPLICAS_MAX];
    struct meta_object *next; /* hash chain */
};

struct meta_node {
    bool used, alive;
    char name[TY_STORE_NODE_NAME_MAX + 1];
    bool has_ssd;
    uint64_t last_heartbeat;
    uint64_t reads; /* gets answered with a replica here first */
    ty_store_alloc_t *alloc;
};

struct meta_free { /* a DRAM range freed once its lease ends */
    uint32_t node;
    uint64_t offset, length, at;
};

struct ty_store_meta {
    struct ty_store_meta_opts o;
    struct meta_object **buckets;
    size_t n_buckets, n_objects, n_pending;
    struct meta_node *nodes;
    uint32_t n_nodes, cap_nodes;
    struct meta_free *frees;
    size_t n_frees, cap_frees;
    struct ty_store_job *queue; /* jobs not yet taken */
    size_t n_queue, cap_queue;
    struct ty_store_job *inflight; /* jobs taken, not done */
    size_t n_inflight, cap_inflight;
    uint64_t next_job;
    uint64_t next_expiry_scan;     /* pending puts are looked for at most every 100 ms */
    struct ty_store_event *events; /* ring */
    size_t ev_head, ev_len, ev_cap;
    char **hot; /* keys with a replica target (set_replicas, heat) */
    size_t n_hot, cap_hot;
    struct ty_store_meta_stats st;
};

/* meta.c */
struct meta_object *ty__store_meta_lookup(const ty_store_meta_t *m, const char *key);
void ty__store_meta_event(ty_store_meta_t *m, enum ty_store_event_kind kind,
                          const struct meta_object *o, const struct ty_store_replica *r);
/* Drop replica i of o: free (or defer) its DRAM range, REMOVED event if it was complete. */
void ty__store_meta_drop_replica(ty_store_meta_t *m, struct meta_object *o, uint32_t i,
                                 uint64_t now);
/* Unlink and free an object whose replicas are all dropped. */
void ty__store_meta_delete(ty_store_meta_t *m, struct meta_object *o);
struct meta_node *ty__store_meta_node(const ty_store_meta_t *m, uint32_t id);
/* Free the deferred ranges whose time has come. */
void ty__store_meta_run_frees(ty_store_meta_t *m, uint64_t now);
/* Insert a new, empty object for key (valid, absent). */
struct meta_object *ty__store_meta_insert(ty_store_meta_t *m, const char *key);
/* Index of o's replica on (node, tier), or -1. */
int ty__store_meta_find_replica(const struct meta_object *o, uint32_t node, enum ty_store_tier t);
bool ty__store_meta_key_valid(const char *key);
/* Drop every replica of o (deferring leased ranges) and delete it. */
void ty__store_meta_drop_all(ty_store_meta_t *m, struct meta_object *o, uint64_t now);

/* evict.c */
/* Evict on node `id` until its use is below the low watermark (or `need` bytes fit when need>0).
 * When drop_only, victims are dropped even if the node has an SSD tier. Returns bytes freed now. */
uint64_t ty__store_meta_evict_node(ty_store_meta_t *m, uint32_t id, uint64_t need, uint64_t now);
uint64_t ty__store_meta_job_push(ty_store_meta_t *m, const struct ty_store_job *j);

/* meta_ops.c */
/* Put key on the list tick walks for replica targets (once). */
void ty__store_meta_hot_list_add(ty_store_meta_t *m, const char *key);
/* Free DRAM bytes of a node. */
uint64_t ty__store_meta_node_free(const struct meta_node *n);

#endif
