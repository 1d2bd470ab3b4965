/* The node runtime shared by tycho-prefill and tycho-decode (src/node): their settings table;
 * the agent that registers the node with the Conductor (RegisterNode, then a Heartbeat with the
 * node's load every interval, registering again when the Conductor forgets it or restarts); the
 * service that runs a role's RPC server, worker thread and mailbox and stops them without
 * blocking the loop; and ty_node_main, the daemon's start-up and shutdown. The node's KV events
 * (tycho/kv_events.h), timing samples (tycho/timing_ring.h) and KV pool glue
 * (tycho/node_kvstore.h) belong to the same library.
 *
 * Threading: an agent and a service belong to the uv loop given at creation; every function and
 * callback runs on that loop's thread unless said otherwise. Ownership: they copy their
 * options' strings.
 */
#ifndef TYCHO_NODE_H
#define TYCHO_NODE_H

#include "tycho/auth.h"
#include "tycho/config.h"
#include "tycho/kv_events.h"
#include "tycho/kvpool.h"
#include "tycho/engine.h"
#include "tycho/model.h"
#include "tycho/rpc.h"
#include "tycho/store.h"
#include "tycho/timing_ring.h"
#include "tycho/transfer.h"

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

/* ---- settings ------------------------------------------------------------------------------ */
/* Filled by a ty_config_t (tycho/daemon.h) on the daemon's main thread; read-only afterwards.
 * Strings and lists are owned by the config object that filled the struct. Add a setting: a
 * member here and one row in src/node/config.c. `tycho check-config --role prefill|decode`
 * validates with this same table. */

/* tycho-prefill and tycho-decode. */
/* A prefill node's use of the cluster KV pool (tycho-store). */
struct ty_node_pool_config {
    char *master;          /* "host:port" of the pool's master (comma list: standbys); unset: no pool */
    uint64_t timeout_ns;   /* per pool operation */
    uint64_t retry_ns;     /* after a failure the pool is skipped this long */
    uint32_t replicas;     /* per stored block; 0: the master's default */
    int transport;         /* the pool client's transfer engine: 0 auto, 1 tcp, 2 local */
};

/* How a node's KV pages move to and from other nodes (its `transfer:` section). */
struct ty_node_transfer_config {
    int transport;         /* index into ty_node_transport_names: auto, tcp, local, rdma */
    char *rdma_devices;    /* comma list of RDMA devices; unset: every device with an active port */
};
/* "auto", "tcp", "local", "rdma" (NULL-terminated): transfer.transport. */
extern const char *const ty_node_transport_names[];

/* The tag of attempt `attempt`'s KV writes into a reservation with fence `fence`
 * (KvDestination.fence): never 0 when fence is not. */
static inline uint32_t ty_kv_fence(uint32_t fence, uint32_t attempt)
{
    if (!fence)
        return 0;
    uint32_t t = fence ^ (attempt * 0x9E3779B1u);
    return t ? t : 1;
}

struct ty_node_config {
    char *name;                      /* node id, stable across restarts (default: role-host-pid) */
    char *conductor_address;         /* host:port of the Conductor's RPC endpoint */
    char *listen_host;               /* RPC and transfer listener */
    uint16_t listen_port;            /* RPC; 0: ephemeral */
    uint16_t transfer_port;          /* transfer engine; 0: ephemeral */
    char *model_path;
    int log_level;                   /* enum ty_log_level */
    int log_format;                  /* enum ty_log_format */
    uint64_t heartbeat_interval_ns;
    uint32_t kv_block_tokens;
    uint32_t kv_pages;               /* pages per layer; 0: the engine default */
    uint64_t kv_cache_memory;        /* bytes of KV pages when kv_pages is 0; 0: unset */
    int kv_cache_dtype;              /* index into ty_engine_kv_dtype_names */
    uint32_t max_ctx;                /* 0: the model's; the Conductor admits what every live
                                      * node holds */
    uint32_t threads;
    uint32_t max_batch_size;         /* decode: sequences decoded together */
    int backend;                     /* index into ty_engine_backend_names */
    uint32_t cuda_device;            /* backend cuda: the GPU's ordinal */
    int cuda_weights;                /* backend cuda: index into ty_engine_cuda_weights_names */
    uint64_t engine_stall_ns;        /* a forward call this long holds back the watchdog */
    uint32_t chunk_tokens;           /* prefill: chunked-prefill chunk */
    uint32_t prefill_batch;          /* prefill: prompts per forward call (within chunk_tokens) */
    uint64_t kv_wait_timeout_ns;     /* decode: reserved pages wait this long for their KV */
    uint64_t peer_fetch_timeout_ns;  /* prefill: a peer's pin of planned blocks, at most */
    char *port_file;                 /* write "rpc transfer metrics" ports here once listening */
    struct ty_node_pool_config kv_pool; /* prefill */
    struct ty_node_transfer_config transfer;
    uint16_t metrics_port;           /* Prometheus /metrics; 0: ephemeral (in the port file) */
    struct ty_auth_config cluster;   /* cluster_secret_file / insecure (tycho/auth.h) */
};

extern const struct ty_config_struct ty_node_config_table; /* prefill and decode */

/* The engine rows of the table above (threads, KV pages and type, batch size, backend and GPU)
 * that `tycho serve`'s `engine:` section shares: T is the struct holding them. The enums index
 * ty_engine_kv_dtype_names, ty_engine_backend_names and ty_engine_cuda_weights_names
 * (tycho/engine.h). */
#define TY_NODE_ENGINE_CONFIG_ROWS(T)                                                             \
    {.key = "threads", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, threads), .def = "1", .min = "1",  \
     .max = "256", .help = "CPU threads of the engine"},                                          \
    {.key = "kv_block_tokens", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, kv_block_tokens),          \
     .def = "64", .min = "1", .max = "4096", .help = "tokens per KV page (same on every node)"},  \
    {.key = "kv_pages", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, kv_pages), .def = "0",            \
     .max = "16777216", .help = "KV pages per layer; 0: kv_cache_memory's, else max_batch_size "  \
                                "sequences of min(max_ctx, 4096) tokens, at least one max_ctx"}, \
    {.key = "kv_cache_memory", .type = TY_CONFIG_SIZE, TY_CONFIG_AT(T, kv_cache_memory),          \
     .def = "0", .help = "KV page memory (e.g. 8G) when kv_pages is 0: pages = this / page "      \
                         "size, so f16 pages give twice the tokens; 0: kv_pages decides"},        \
    {.key = "kv_cache_dtype", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(T, kv_cache_dtype),            \
     .def = "auto", .enum_names = ty_engine_kv_dtype_names,                                       \
     .help = "KV cache elements: f32, f16 or bf16 (half the memory and transfer; bf16 on "    \
             "the cpu backend), auto (f16 for a 16-bit or quantized model, else f32; same on "    \
             "every node)"},                                                                      \
    {.key = "max_batch_size", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, max_batch_size),            \
     .def = "64", .min = "1", .max = "4096",                                                      \
     .help = "sequences decoded together (decode node, tycho serve)"},                        \
    {.key = "backend", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(T, backend), .def = "cpu",            \
     .enum_names = ty_engine_backend_names,                                                       \
     .help = "where the model and its KV pages live: cpu, or cuda (an NVIDIA GPU; a build "       \
             "with CUDA)"},                                                                       \
    {.key = "cuda_device", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, cuda_device), .def = "0",      \
     .max = "255", .help = "backend cuda: the GPU's ordinal (as in nvidia-smi)"},                 \
    {.key = "cuda_weights", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(T, cuda_weights),                \
     .def = "auto", .enum_names = ty_engine_cuda_weights_names,                                   \
     .help = "backend cuda: weight type on the GPU (auto: the file's 16-bit type, f16 for "       \
             "quantized files, f32 for F32 files)"},                                              \
    {.key = "engine_stall_timeout", .type = TY_CONFIG_DURATION,                                   \
     TY_CONFIG_AT(T, engine_stall_ns), .def = "120s", .min = "100ms", .max = "1h",                \
     .help = "under a systemd watchdog: a forward call running this long holds back the "         \
             "keep-alive, so that systemd restarts the hung daemon"}

/* ---- node side: the agent ------------------------------------------------------------------ */

typedef struct ty_node_agent ty_node_agent_t;

struct ty_node_load {
    uint64_t queued_tokens;
    uint32_t running, queued;
    uint64_t free_pages;
    float kv_usage;
    /* prefill with a KV pool: since the node started */
    uint64_t pool_read_blocks, pool_written_blocks, pool_errors;
    uint64_t preemptions; /* decode: sequences preempted since the node started */
};

/* Fill the node's current load (loop thread). */
typedef void (*ty_node_load_cb)(void *arg, struct ty_node_load *out);

/* How far a prefill node has come with one prompt it is computing (Heartbeat.prefill_progress):
 * the Conductor extends the prompt's KV deadline while tokens_done grows. */
struct ty_node_progress {
    uint64_t rid;
    uint32_t attempt;              /* PrefillAssign.attempt (0 = 1) */
    uint32_t tokens_done, tokens_total;
    uint64_t step_us;              /* its last chunk's forward call, writes included */
    uint64_t tokens_per_s;         /* computed since it started */
};

#define TY_NODE_MAX_PROGRESS 64 /* prompts reported per heartbeat, at most */

/* Fill out[0..cap) with the prompts being computed now (loop thread); returns how many. */
typedef size_t (*ty_node_progress_cb)(void *arg, struct ty_node_progress *out, size_t cap);

struct ty_node_agent_opts {
    uv_loop_t *loop;
    const struct ty_auth *auth; /* proven to the Conductor (and it to us); NULL: insecure */
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
    ty_node_load_cb load_cb;
    void *load_arg;
    ty_node_progress_cb progress_cb; /* optional (prefill): each heartbeat's prefill_progress;
                                      * called with load_arg */
    /* Optional, borrowed (must outlive the agent). kv_events: each heartbeat carries a batch
     * taken from it (none when there is nothing to say), freed once the Conductor answers
     * known=true, given back when the heartbeat fails; registration asks for a resync.
     * timings: each heartbeat drains it into prefill_timings (a prefill node) or
     * decode_timings (a decode node), at most TY_NODE_MAX_TIMINGS, the most recent; a
     * failed heartbeat loses its samples. */
    ty_kv_events_t *kv_events;
    ty_timing_ring_t *timings;
    /* Optional, borrowed: told at registration (status, the Conductor's log). */
    const char *backend;                /* "cpu", "cuda" */
    const char *kv_device;              /* "cpu", "cuda:0" */
    const char *const *transports;      /* the KV handoff paths this node takes */
    size_t n_transports;
};

#define TY_NODE_MAX_TIMINGS 64

/* Start registering (retrying until the Conductor answers). Returns 0, TY_EINVAL, TY_ENOMEM. */
int ty_node_agent_new(ty_node_agent_t **out, const struct ty_node_agent_opts *opts);
/* True after the Conductor accepted the registration (and has not forgotten it since). */
bool ty_node_agent_registered(const ty_node_agent_t *a);
/* Stop heartbeats, close the connection, free; then cb(arg). */
void ty_node_agent_close(ty_node_agent_t *a, void (*cb)(void *arg), void *arg);


/* Write "a b c\n" ("a b\n" when c is 0) to `path` atomically (rename); NULL or "" is a
 * no-op. Returns 0 or -errno. */
int ty_node_write_ports(const char *path, unsigned a, unsigned b, unsigned c);

/* Node name default: "<role>-<hostname>-<pid>" into buf. */
void ty_node_default_name(const char *role, char *buf, size_t cap);

/* ---- a node's service: RPC server, worker thread, mailbox, started and stopped once --------- */

typedef struct ty_node_service ty_node_service_t;

/* One RPC method of a role's server: its request message and handler (ty_rpc_server_handle_msg,
 * arg = the service's arg). */
struct ty_node_handler {
    uint16_t method;
    const ProtobufCMessageDescriptor *desc;
    ty_rpc_msg_cb cb;
};

/* The hooks run on the loop's thread except `worker`, which is the worker thread's body. */
struct ty_node_service_opts {
    uv_loop_t *loop;
    const struct ty_auth *auth; /* the cluster secret callers must prove; NULL: insecure */
    const char *host;          /* the RPC listener */
    uint16_t port;             /* 0: ephemeral (ty_node_service_port) */
    void *(*worker)(void *arg); /* returns once `stop` asked it to */
    void (*stop)(void *arg);   /* ask the worker to return (set its flag, wake it); no wait */
    /* Optional: the worker returned and was joined, and every post it made has run: fail
     * what is still queued, close what the worker used. The server still runs. */
    void (*drained)(void *arg);
    /* Optional: the RPC server closed (its calls failed): free the role. */
    void (*closed)(void *arg);
    void *arg;
    const struct ty_node_handler *handlers; /* registered before the worker starts */
    size_t n_handlers;
};

/* Listen with the handlers, then start the worker thread. Returns 0, TY_EINVAL, TY_ENOMEM or
 * the listen error (nothing started). */
int ty_node_service_new(ty_node_service_t **out, const struct ty_node_service_opts *opts);
/* The worker's way to the loop (ty_rpc_mailbox_post, any thread), open until drained ran. */
ty_rpc_mailbox_t *ty_node_service_mailbox(ty_node_service_t *s);
uint16_t ty_node_service_port(const ty_node_service_t *s);
/* Loop thread: stop; the loop is never blocked on the worker. Then drained, the server
 * closed, closed, and the service freed. A second call does nothing. */
void ty_node_service_close(ty_node_service_t *s);

/* ---- the node's metrics: Prometheus text on their own HTTP port ---------------------------- */

/* tycho_node_info{role,backend,device,transport}, KV handoff bytes / count / latency by
 * direction and transport (tycho_node_kv_transfer_*), KV pages used/free of the device, requests
 * running and waiting, preemptions, step time, batch size and tokens per forward call. GET
 * /metrics renders them (the load gauges read from the role's load callback then), GET /health
 * answers "ok", GET /ready 200 once registered with the Conductor (else 503). Threading:
 * new/close/free on the loop thread (free after the loop ran the close and every worker that
 * reports has stopped); kv and step from any thread. */
typedef struct ty_node_metrics ty_node_metrics_t;

struct ty_node_metrics_opts {
    uv_loop_t *loop;
    const char *host;
    uint16_t port;                  /* 0: ephemeral (ty_node_metrics_port) */
    const char *role, *backend;     /* labels of tycho_node_info */
    const char *device;             /* "cpu", "cuda:0": tycho_node_info and the pages' label */
    const char *transport;          /* the transfer.transport setting */
    uint64_t pages_total;           /* KV pages per layer */
    ty_xfer_engine_t *xfer;         /* its counters on scrape (borrowed, outlives the metrics) */
};

/* Listen and register the families. Returns 0, TY_ENOMEM or the listen error. */
int ty_node_metrics_new(ty_node_metrics_t **out, const struct ty_node_metrics_opts *opts);
uint16_t ty_node_metrics_port(const ty_node_metrics_t *m);
/* GET /ready answers 200 once the agent is registered with the Conductor, 503 before and
 * while it is not (loop thread; the agent must outlive the metrics' port). */
void ty_node_metrics_set_agent(ty_node_metrics_t *m, const ty_node_agent_t *agent);
/* The role's load, read at each scrape from then on (loop thread). */
void ty_node_metrics_set_load(ty_node_metrics_t *m, ty_node_load_cb load, void *arg);
/* One request's KV handoff: `sent` by this (prefill) node or received by this (decode) node,
 * over `transport` ("tcp", "local", "rdma", "cuda_ipc"; any other name, e.g. from an older
 * peer, is not counted), `bytes` in `us` microseconds. NULL m is a no-op. Any thread. */
void ty_node_metrics_kv(ty_node_metrics_t *m, bool sent, const char *transport, uint64_t bytes,
                        uint64_t us);
/* Peer reads (prefill): `bytes` of planned prefix blocks read from another prefill node's
 * cache over `transport` in `us`; blocks of such plans read / failed (computed instead); a
 * peer's pin request answered with `pinned` blocks (0: refused). NULL m: no-op. Any thread. */
void ty_node_metrics_peer_read(ty_node_metrics_t *m, const char *transport, uint64_t bytes,
                               uint64_t us);
void ty_node_metrics_peer_blocks(ty_node_metrics_t *m, uint32_t read, uint32_t failed);
void ty_node_metrics_peer_pins(ty_node_metrics_t *m, uint32_t pinned);
/* One forward call (a ty_timing_ring observer: arg is the metrics). Any thread. */
void ty_node_metrics_step(void *arg, const struct ty_timing_sample *s);
/* Stop serving (the loop then closes the port). NULL: no-op. */
void ty_node_metrics_close(ty_node_metrics_t *m);
void ty_node_metrics_free(ty_node_metrics_t *m);

/* ---- the daemon: a node's start-up and shutdown, written once ------------------------------ */

/* What a role's server is started with (borrowed; all of it outlives the server). */
struct ty_node_runtime {
    const struct ty_node_config *cfg;
    uv_loop_t *loop;
    const char *name;           /* the node id */
    ty_engine_t *engine;
    ty_xfer_engine_t *xfer;     /* the engine's KV pages registered with it: peers write a
                                 * sequence's pages (decode), our batches read them (prefill) */
    ty_store_client_t *store;   /* the cluster KV pool's client; NULL: none configured */
    struct ty_node_kvstore *kvstore; /* the node's reads and writes of it; NULL with store */
    ty_timing_ring_t *timings;  /* drained into the heartbeats */
    ty_kv_events_t *kv_events;  /* the page cache's block events (role.kv_events); else NULL */
    ty_node_metrics_t *metrics; /* the node's /metrics (KV handoffs are counted there) */
    const struct ty_auth *auth; /* the cluster secret every port of the node proves */
};

/* What the settings make of a role: the engine's shape and what the Conductor is told. */
struct ty_node_shape {
    uint32_t max_seqs, max_batch_tokens;   /* ty_engine_opts */
    uint32_t max_batch, max_batch_prompts; /* ty_node_agent_opts */
    bool interleaves;
};

/* A node role: the daemon's names and the hooks around its server. The hooks run on the main
 * thread, which runs the loop. */
struct ty_node_role {
    const char *daemon;  /* "tycho-prefill": --help, errors */
    const char *name;    /* "prefill": logs, the default node id */
    const char *summary; /* --help */
    int pb_role;         /* TYCHO__V1__NODE_ROLE__NODE_ROLE_* */
    bool kv_events;      /* its page cache's block events go to the Conductor (prefill) */
    void (*shape)(const struct ty_node_config *cfg, struct ty_node_shape *out);
    /* Start the server (listening); returns 0 with *server and its *rpc_port, or an error. */
    int (*start)(const struct ty_node_runtime *rt, void **server, uint16_t *rpc_port);
    ty_node_load_cb load; /* arg: the server */
    ty_node_progress_cb progress; /* optional, arg: the server (prefill) */
    /* Close the server (the loop then runs until its handles are closed). */
    void (*stop)(void *server, const struct ty_node_runtime *rt);
};

/* A daemon's watchdog check of its engine (ty_daemon_alive_cb's shape): false, with `why`,
 * when the engine's current forward call has run `stall_ns` or longer. NULL e: alive. */
bool ty_node_engine_alive(const ty_engine_t *e, uint64_t stall_ns, char *why, size_t cap);

/* Test hook TYCHO_TEST_MUTE_FILE=PATH, for a request call (DecodeAssign, PrefillAssign) as its
 * handler starts: while PATH exists the node takes the call and never answers it (a node that
 * heartbeats but does not serve; its caller's cancel or the connection's loss ends it) and
 * this returns true; otherwise false and nothing happens. */
bool ty_node_test_mute(ty_rpc_call_t *call, const char *what);

/* The daemon's main: settings from argv, the file and the environment (tycho/daemon.h; --help
 * exits 0); the model, the engine, the transfer engine (tcp) with the KV pages registered, the
 * KV pool's client, the role's server, the agent, the port file; the loop until SIGTERM drains
 * it; then everything closed in the reverse order. Returns the process's exit code. */
int ty_node_main(const struct ty_node_role *role, int argc, char **argv);

#endif
