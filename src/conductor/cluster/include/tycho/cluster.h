/* The cluster: how the Conductor and its prefill / decode nodes find each other and serve a
 * request across processes (DESIGN.md §5). Three parts:
 *   - the settings tables of tycho-conductor, of `tycho serve` (the same table plus an
 *     `engine:` section) and of tycho-prefill / tycho-decode (one table for both);
 *   - the node agent (node side): RegisterNode, then a Heartbeat with the node's load every
 *     interval, registering again when the Conductor forgets it or restarts;
 *   - ty_cluster_t (Conductor side): the node registry fed by those messages, with a heartbeat
 *     timeout, and the remote serving backend of tycho/serve.h that sends DecodeAssign, then
 *     PrefillAssign, relays the decode node's TokenChunk stream as serve events, sends Cancel
 *     when the client goes away and turns a dead node into error events.
 *
 * Threading: an agent and a ty_cluster_t belong to the uv loop given at creation; every
 * function and callback runs on that loop's thread (the serve backend's submit/cancel/stats
 * too, and its events are delivered on that thread). Ownership: both copy their options'
 * strings; the cluster borrows the model (tokenizer, end-of-generation ids), which must
 * outlive it.
 */
#ifndef TYCHO_CLUSTER_H
#define TYCHO_CLUSTER_H

#include "tycho/config.h"
#include "tycho/kv_events.h"
#include "tycho/kvpool.h"
#include "tycho/model.h"
#include "tycho/metrics.h"
#include "tycho/sched.h"
#include "tycho/serve.h"
#include "tycho/timing_ring.h"
#include "tycho/transfer.h"

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

/* ---- settings ------------------------------------------------------------------------------ */
/* Filled by a ty_config_t (tycho/daemon.h) on the daemon's main thread; read-only afterwards,
 * except for TY_CONFIG_RELOADABLE fields that a reload changes on that same thread. Strings and
 * lists are owned by the config object that filled the struct. Add a setting: a member here and
 * one row in config.c. `tycho check-config --role conductor|serve|prefill|decode` validates with
 * these same tables. */

/* HTTP request limits of the front door (tycho-conductor and tycho serve). */
struct ty_cluster_limits {
    uint64_t max_body_bytes;     /* request body cap */
    uint64_t header_timeout_ns;  /* all headers must arrive within this */
    uint64_t body_timeout_ns;    /* the body must arrive within this after the headers */
    uint32_t max_connections;
};

/* The live scheduler's cost model (tycho/sched.h struct ty_sched_cost): a starting point, and
 * whether the Conductor refits it from the timings its nodes measure. */
struct ty_cluster_cost_config {
    char *profile;                   /* built-in profile; "" or "auto": derived from the model */
    double *prefill, *decode;        /* coefficients replacing the profile's (3 each, or none) */
    uint32_t n_prefill, n_decode;
    double net_gbytes_per_s;         /* KV transfer bandwidth of a prefill node */
    bool refit;                      /* least-squares refit from the nodes' timing samples */
    uint32_t refit_window;           /* most recent samples each fit uses */
};

/* tycho-conductor: the HTTP front door, the RPC endpoint nodes register with, the registry. */
/* The Conductor's use of the cluster KV pool: it follows the blocks the pool holds. */
struct ty_cluster_pool_config {
    char *master; /* "host:port" (comma list: standbys); unset: no pool */
};

/* An API key whose requests are served in one SLO class (api_key_classes). */
struct ty_cluster_key_class {
    char *key;
    char *slo_class;
};

struct ty_cluster_config {
    char *listen_host;
    uint16_t listen_port;            /* HTTP */
    char *rpc_host;
    uint16_t rpc_port;               /* RPC endpoint of the nodes; 0: ephemeral (logged) */
    char *model_path;                /* for the tokenizer and chat template */
    char **api_keys;
    uint32_t n_api_keys;
    struct ty_cluster_key_class *api_key_classes; /* more keys, each bound to an SLO class */
    uint32_t n_api_key_classes;
    int log_level;                   /* enum ty_log_level */
    uint64_t heartbeat_interval_ns;  /* told to nodes at registration */
    uint64_t heartbeat_timeout_ns;   /* a node silent this long is dead */
    uint64_t request_timeout_ns;     /* whole-request deadline (every party gives up after) */
    uint32_t max_ctx;                /* context per sequence; 0: the model's, capped at 4096 */
    uint64_t startup_wait_ns;        /* right after start, requests wait this long for nodes */
    char *port_file;                 /* write "http_port rpc_port\n" here once listening */
    struct ty_cluster_limits limits;
    /* tycho-conductor only (zero in `tycho serve`, which has no nodes to place on): */
    struct ty_sched_config scheduler;  /* placement, admission, SLOs (tycho/sched.h) */
    struct ty_cluster_cost_config cost;
    uint32_t expected_output_tokens;   /* the scheduler's guess when max_tokens is not set */
    struct ty_cluster_pool_config kv_pool;
};

/* The in-process engine of `tycho serve` (its `engine:` section). threads, kv_block_tokens,
 * kv_pages and max_batch_size are the same rows as the node settings of the same names. */
struct ty_cluster_serve_engine {
    uint32_t threads;
    uint32_t kv_block_tokens;
    uint32_t kv_pages;               /* pages per layer; 0: max_batch_size full contexts */
    uint64_t kv_cache_memory;        /* bytes of KV pages when kv_pages is 0; 0: unset */
    int kv_cache_dtype;              /* index into ty_cluster_kv_dtype_names */
    uint32_t max_batch_size;         /* sequences decoded together */
    uint32_t step_tokens;            /* token budget of one engine step */
    int backend;                     /* index into ty_cluster_backend_names */
    uint32_t cuda_device;            /* backend cuda: the GPU's ordinal */
    int cuda_weights;                /* backend cuda: index into ty_cluster_cuda_weights_names */
};

/* `tycho serve`: the Conductor's settings (same table as tycho-conductor; the RPC, heartbeat,
 * startup_wait and request_timeout settings have no effect there, having no nodes) plus the
 * engine that replaces the remote nodes. */
struct ty_cluster_serve_config {
    struct ty_cluster_config conductor;
    struct ty_cluster_serve_engine engine;
};

/* tycho-prefill and tycho-decode. */
/* A prefill node's use of the cluster KV pool (tycho-store). */
struct ty_cluster_node_pool_config {
    char *master;          /* "host:port" of the pool's master (comma list: standbys); unset: no pool */
    uint64_t timeout_ns;   /* per pool operation */
    uint64_t retry_ns;     /* after a failure the pool is skipped this long */
    uint32_t replicas;     /* per stored block; 0: the master's default */
    int transport;         /* the pool client's transfer engine: 0 auto, 1 tcp, 2 local */
};

struct ty_cluster_node_config {
    char *name;                      /* node id, stable across restarts (default: role-host-pid) */
    char *conductor_address;         /* host:port of the Conductor's RPC endpoint */
    char *listen_host;               /* RPC and transfer listener */
    uint16_t listen_port;            /* RPC; 0: ephemeral */
    uint16_t transfer_port;          /* transfer engine; 0: ephemeral */
    char *model_path;
    int log_level;                   /* enum ty_log_level */
    uint64_t heartbeat_interval_ns;
    uint32_t kv_block_tokens;
    uint32_t kv_pages;               /* pages per layer; 0: the engine default */
    uint64_t kv_cache_memory;        /* bytes of KV pages when kv_pages is 0; 0: unset */
    int kv_cache_dtype;              /* index into ty_cluster_kv_dtype_names */
    uint32_t max_ctx;                /* 0: the model's, capped at 4096 (must match the Conductor) */
    uint32_t threads;
    uint32_t max_batch_size;         /* decode: sequences decoded together */
    uint32_t chunk_tokens;           /* prefill: chunked-prefill chunk */
    uint32_t prefill_batch;          /* prefill: prompts per forward call (within chunk_tokens) */
    uint64_t kv_wait_timeout_ns;     /* decode: reserved pages wait this long for their KV */
    char *port_file;                 /* write "rpc_port transfer_port\n" here once listening */
    struct ty_cluster_node_pool_config kv_pool; /* prefill */
};

/* kv_cache_dtype values: "auto", "f32", "f16" (ty_engine_opts.kv_dtype), NULL-terminated. */
extern const char *const ty_cluster_kv_dtype_names[];
/* `tycho serve`'s engine.backend: "cpu", "cuda" (ty_engine_opts.backend), NULL-terminated. */
extern const char *const ty_cluster_backend_names[];
/* engine.cuda_weights: "auto", "f32", "f16", "bf16" (ty_engine_opts.cuda_weights). */
extern const char *const ty_cluster_cuda_weights_names[];

extern const struct ty_config_struct ty_cluster_config_table;       /* tycho-conductor */
extern const struct ty_config_struct ty_cluster_serve_config_table; /* tycho serve */
extern const struct ty_config_struct ty_cluster_node_config_table;  /* prefill and decode */

/* ---- node side: the agent ------------------------------------------------------------------ */

typedef struct ty_cluster_agent ty_cluster_agent_t;

struct ty_cluster_load {
    uint64_t queued_tokens;
    uint32_t running, queued;
    uint64_t free_pages;
    float kv_usage;
    /* prefill with a KV pool: since the node started */
    uint64_t pool_read_blocks, pool_written_blocks, pool_errors;
    uint64_t preemptions; /* decode: sequences preempted since the node started */
};

/* Fill the node's current load (loop thread). */
typedef void (*ty_cluster_load_cb)(void *arg, struct ty_cluster_load *out);

struct ty_cluster_agent_opts {
    uv_loop_t *loop;
    const char *conductor_address; /* "host:port" */
    int role;                      /* TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL / _DECODE */
    const char *node_id;
    const char *address;           /* "host:port" of this node's RPC server */
    const char *segment;           /* transfer segment name */
    const ty_model_t *model;       /* fingerprint (id from model_path, geometry) */
    const char *model_path;
    uint64_t kv_pages;
    uint32_t block_tokens, max_batch;
    uint32_t max_batch_prompts;     /* prefill: prompts per forward call (prefill_batch) */
    uint32_t max_ctx;               /* the engine's context (ty_engine_max_ctx) */
    bool interleaves;               /* prefill: short prompts join a long one's chunks */
    const char *kv_dtype;           /* the KV pool's element type ("f32", "f16"); NULL: f32 */
    uint32_t heartbeat_interval_ms; /* until the Conductor says otherwise */
    ty_cluster_load_cb load_cb;
    void *load_arg;
    /* Optional, borrowed (must outlive the agent). kv_events: each heartbeat carries a batch
     * taken from it (none when there is nothing to say), freed once the Conductor answers
     * known=true, given back when the heartbeat fails; registration asks for a resync.
     * timings: each heartbeat drains it into prefill_timings (a prefill node) or
     * decode_timings (a decode node), at most TY_CLUSTER_MAX_TIMINGS, the most recent; a
     * failed heartbeat loses its samples. */
    ty_kv_events_t *kv_events;
    ty_timing_ring_t *timings;
};

#define TY_CLUSTER_MAX_TIMINGS 64

/* Start registering (retrying until the Conductor answers). Returns 0, TY_EINVAL, TY_ENOMEM. */
int ty_cluster_agent_new(ty_cluster_agent_t **out, const struct ty_cluster_agent_opts *opts);
/* True after the Conductor accepted the registration (and has not forgotten it since). */
bool ty_cluster_agent_registered(const ty_cluster_agent_t *a);
/* Stop heartbeats, close the connection, free; then cb(arg). */
void ty_cluster_agent_close(ty_cluster_agent_t *a, void (*cb)(void *arg), void *arg);

/* Register each layer's K and V array of `pool` with `xfer` ("cpu:0"), so peers can write a
 * sequence's pages (decode) and our batches can read them (prefill). Returns 0 or the error. */
int ty_cluster_kv_register(ty_xfer_engine_t *xfer, ty_kvpool_t *pool, uint32_t n_layers);

/* Write "a b\n" to `path` atomically (rename); NULL or "" is a no-op. Returns 0 or -errno. */
int ty_cluster_write_ports(const char *path, unsigned a, unsigned b);

/* Node name default: "<role>-<hostname>-<pid>" into buf. */
void ty_cluster_default_name(const char *role, char *buf, size_t cap);

/* ---- Conductor side: registry and remote backend -------------------------------------------- */

typedef struct ty_cluster ty_cluster_t;

struct ty_cluster_opts {
    uv_loop_t *loop;
    const char *rpc_host;
    uint16_t rpc_port;
    const ty_model_t *model;
    uint32_t max_ctx;
    uint32_t heartbeat_interval_ms;
    uint32_t heartbeat_timeout_ms;
    uint32_t request_timeout_ms;
    uint32_t startup_wait_ms; /* requests before any node registered wait this long (first
                               * seconds after start only); 0: answer TY_EUNAVAIL at once */
    ty_serve_event_cb event_cb; /* loop thread */
    void *event_arg;
    /* The scheduler (DESIGN.md §6). NULL: defaults (kvcache_centric, predicted admission, no
     * SLO, cost derived from the model and refitted). Borrowed until ty_cluster_new returns. */
    const struct ty_sched_config *sched;
    const struct ty_cluster_cost_config *cost;
    const char *model_name;            /* picks the SLO entry of sched->models */
    uint32_t expected_output_tokens;   /* when a request has no max_tokens (0: 256) */
    ty_metrics_registry_t *metrics;    /* optional: scheduler counters and gauges */
    /* The cluster KV pool's master, when the prefill nodes use one (their kv_pool.master):
     * the scheduler then knows the pool's blocks and plans prefixes read from it. */
    const char *kv_pool_master;
};

struct ty_cluster_node_info {
    char id[64];
    int role;
    char address[128];
    bool alive;
    uint32_t inflight;         /* requests the Conductor has on it now */
    uint64_t served;           /* requests assigned to it so far */
    struct ty_cluster_load load;
};

int ty_cluster_new(ty_cluster_t **out, const struct ty_cluster_opts *opts);
uint16_t ty_cluster_rpc_port(const ty_cluster_t *c);
/* Every accepted API key of c (api_keys, then api_key_classes) and its SLO class (NULL for
 * the first kind), as the API's ty_api_set_keys takes them: two malloc'd arrays of *n
 * borrowed strings (free the arrays, not the strings; both NULL when there are none).
 * Returns 0 or TY_ENOMEM. */
int ty_cluster_api_keys(const struct ty_cluster_config *c, const char ***keys,
                        const char ***classes, size_t *n);

/* The remote serving backend (valid until close). */
struct ty_serve_backend ty_cluster_backend(ty_cluster_t *c);
/* Apply the scheduler settings an operator tunes live (a SIGHUP reload of `scheduler:`):
 * policy, admission, kvcache_balancing_threshold and this model's SLO classes. Requests in
 * flight keep their class; new ones are judged by the new SLOs. The loop's thread. Returns 0
 * or TY_EINVAL (logged; the running settings stay). */
int ty_cluster_reload_sched(ty_cluster_t *c, const struct ty_sched_config *sc);
/* Copy up to `cap` nodes; returns how many there are. */
size_t ty_cluster_nodes(const ty_cluster_t *c, struct ty_cluster_node_info *out, size_t cap);
/* Fail every request (ERROR events), close the RPC server and node connections, free; cb. */
void ty_cluster_close(ty_cluster_t *c, void (*cb)(void *arg), void *arg);

#endif
