/* The Conductor (src/conductor, DESIGN.md §5): its settings table (tycho-conductor's, and the
 * front-door part of `tycho serve`'s), and ty_conductor_t: the node registry fed by RegisterNode
 * and Heartbeat, with a heartbeat timeout, and the remote serving backend of tycho/serve.h that
 * places each request on a prefill and a decode node (tycho/sched.h), sends DecodeAssign (one
 * call that is also the request's token stream), then PrefillAssign with the decode node's KV
 * destination, relays the TokenChunks as serve events, sends Cancel when the client goes away
 * and turns a dead node into error events.
 *
 * Threading: a ty_conductor_t belongs to the uv loop given at creation; every function and
 * callback runs on that loop's thread (the serve backend's submit/cancel/stats too, and its
 * events are delivered on that thread). Ownership: it copies its options' strings and borrows
 * the model (tokenizer, end-of-generation ids), which must outlive it.
 */
#ifndef TYCHO_CONDUCTOR_H
#define TYCHO_CONDUCTOR_H

#include "tycho/auth.h"
#include "tycho/config.h"
#include "tycho/metrics.h"
#include "tycho/model.h"
#include "tycho/node.h"
#include "tycho/sched.h"
#include "tycho/serve.h"

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
struct ty_conductor_limits {
    uint64_t max_body_bytes;     /* request body cap */
    uint64_t header_timeout_ns;  /* all headers must arrive within this */
    uint64_t body_timeout_ns;    /* the body must arrive within this after the headers */
    uint32_t max_connections;
};

/* The live scheduler's cost model (tycho/sched.h struct ty_sched_cost): a starting point, and
 * whether the Conductor refits it from the timings its nodes measure. */
struct ty_conductor_cost_config {
    char *profile;                   /* built-in profile; "" or "auto": derived from the model */
    double *prefill, *decode;        /* coefficients replacing the profile's (3 each, or none) */
    uint32_t n_prefill, n_decode;
    double net_gbytes_per_s;         /* KV transfer bandwidth of a prefill node */
    bool refit;                      /* least-squares refit from the nodes' timing samples */
    uint32_t refit_window;           /* most recent samples each fit uses */
    uint64_t refit_max_age_ns;       /* samples older than this leave the fit (8 stay); 0: no
                                      * age limit */
    uint64_t probe_interval_ns;      /* a node with no timing sample this long gets one probe
                                      * request past a predicted SLO miss; 0: no probes */
};

/* tycho-conductor: the HTTP front door, the RPC endpoint nodes register with, the registry. */
/* The Conductor's use of the cluster KV pool: it follows the blocks the pool holds. */
struct ty_conductor_pool_config {
    char *master; /* "host:port" (comma list: standbys); unset: no pool */
};

/* Chunked pipeline parallelism (Mooncake §5.1): prompts of at least `threshold` tokens go
 * through a group of `stages` prefill nodes, each computing a contiguous range of layers of
 * every chunk (docs/arch/cluster.md "Pipeline groups"). */
struct ty_conductor_pipeline_config {
    uint32_t stages;    /* prefill nodes in a group; 0, 1: off */
    uint32_t threshold; /* prompt tokens from which a prompt is pipelined; 0: the cost model's */
};

/* An API key whose requests are served in one SLO class (api_key_classes). */
struct ty_conductor_key_class {
    char *key;
    char *slo_class;
};

struct ty_conductor_config {
    char *listen_host;
    uint16_t listen_port;            /* HTTP */
    char *tls_cert, *tls_key;        /* PEM files: HTTPS on listen_port (both or neither) */
    char *rpc_host;
    uint16_t rpc_port;               /* RPC endpoint of the nodes; 0: ephemeral (logged) */
    char *model_path;                /* for the tokenizer and chat template */
    char *chat_template;             /* a Jinja chat template file replacing the model's */
    char **api_keys;
    uint32_t n_api_keys;
    struct ty_conductor_key_class *api_key_classes; /* more keys, each bound to an SLO class */
    uint32_t n_api_key_classes;
    int log_level;                   /* enum ty_log_level */
    int log_format;                  /* enum ty_log_format */
    uint64_t heartbeat_interval_ns;  /* told to nodes at registration */
    uint64_t heartbeat_timeout_ns;   /* a node silent this long is dead */
    uint64_t request_timeout_ns;     /* whole-request deadline (every party gives up after) */
    uint32_t max_ctx;                /* context per sequence; 0: the model's */
    uint64_t startup_wait_ns;        /* right after start, requests wait this long for nodes */
    char *port_file;                 /* write "http_port rpc_port\n" here once listening */
    struct ty_conductor_limits limits;
    /* tycho-conductor only (zero in `tycho serve`, which has no nodes to place on): */
    struct ty_sched_config scheduler;  /* placement, admission, SLOs (tycho/sched.h) */
    struct ty_conductor_cost_config cost;
    uint32_t expected_output_tokens;   /* the scheduler's guess when max_tokens is not set */
    bool x_should_retry;               /* a refusal no retry can cure: x-should-retry: false */
    uint64_t node_answer_timeout_ns;   /* failure detection by outcome (ty_conductor_opts) */
    uint32_t breaker_failures;
    uint64_t breaker_open_ns;
    struct ty_conductor_pool_config kv_pool;
    struct ty_auth_config cluster; /* tycho-conductor: cluster_secret_file / insecure */
    struct ty_conductor_pipeline_config pipeline;
};

extern const struct ty_config_struct ty_conductor_config_table; /* tycho-conductor */

/* The front-door rows of the table above (listen address, keys, limits, log level, ...) that
 * `tycho serve`'s table shares at its root: T is the struct holding them and P the member path
 * of its struct ty_conductor_config ("" in tycho-conductor, "conductor." in tycho serve). */
extern const struct ty_config_struct ty_conductor_key_class_table, ty_conductor_limits_table;
#define TY_CONDUCTOR_CONFIG_ROWS(T, P)                                                            \
    {.key = "listen_host", .type = TY_CONFIG_STRING, TY_CONFIG_AT(T, P listen_host),              \
     .def = "127.0.0.1", .min = "1", .help = "address of the HTTP front door"},                   \
    {.key = "listen_port", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, P listen_port), .def = "8000", \
     .max = "65535", .help = "TCP port of the HTTP front door; 0: ephemeral"},                    \
    {.key = "tls_cert", .type = TY_CONFIG_STRING, TY_CONFIG_AT(T, P tls_cert), .min = "1",        \
     .flags = TY_CONFIG_RELOADABLE,                                                               \
     .help = "PEM certificate (chain) file: with tls_key the front door speaks HTTPS only; "      \
             "re-read on SIGHUP"},                                                                \
    {.key = "tls_key", .type = TY_CONFIG_STRING, TY_CONFIG_AT(T, P tls_key), .min = "1",          \
     .flags = TY_CONFIG_RELOADABLE,                                                               \
     .help = "PEM private key file of tls_cert (no passphrase); re-read on SIGHUP"},              \
    {.key = "rpc_host", .type = TY_CONFIG_STRING, TY_CONFIG_AT(T, P rpc_host), .def = "127.0.0.1",\
     .min = "1", .help = "address nodes register with"},                                          \
    {.key = "rpc_port", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, P rpc_port), .def = "9000",       \
     .max = "65535", .help = "RPC port nodes register with; 0: ephemeral"},                       \
    {.key = "model_path", .type = TY_CONFIG_STRING, TY_CONFIG_AT(T, P model_path), .min = "1",    \
     .flags = TY_CONFIG_REQUIRED, .help = "model file (GGUF) or Hugging Face directory"},         \
    {.key = "chat_template", .type = TY_CONFIG_STRING, TY_CONFIG_AT(T, P chat_template),          \
     .min = "1", .help = "Jinja chat template file used instead of the model's own (a model "     \
                         "without one joins chat messages as plain text)"},                      \
    {.key = "api_keys", .type = TY_CONFIG_LIST, .elem = TY_CONFIG_STRING,                         \
     TY_CONFIG_LIST_AT(T, P api_keys, P n_api_keys), .max = "1024",                               \
     .flags = TY_CONFIG_RELOADABLE | TY_CONFIG_SECRET,                                            \
     .help = "accepted bearer tokens, or sha256:<64 hex> of one; empty: no authentication"},     \
    {.key = "api_key_classes", .type = TY_CONFIG_LIST, .sub = &ty_conductor_key_class_table,      \
     TY_CONFIG_LIST_AT(T, P api_key_classes, P n_api_key_classes), .max = "1024",                 \
     .flags = TY_CONFIG_RELOADABLE,                                                               \
     .help = "more accepted bearer tokens, each serving its requests in one SLO class "           \
             "(tycho-conductor), whatever they ask for"},                                         \
    {.key = "log_level", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(T, P log_level), .def = "info",     \
     .enum_names = ty_config_log_level_names, .flags = TY_CONFIG_RELOADABLE,                      \
     .help = "log threshold"},                                                                    \
    {.key = "log_format", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(T, P log_format), .def = "text",   \
     .enum_names = ty_config_log_format_names, .flags = TY_CONFIG_RELOADABLE,                     \
     .help = TY_CONFIG_LOG_FORMAT_HELP},                                                          \
    {.key = "heartbeat_interval", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(T, P heartbeat_interval_ns),\
     .def = "500ms", .min = "10ms", .max = "1m", .help = "heartbeat period asked of the nodes"},  \
    {.key = "heartbeat_timeout", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(T, P heartbeat_timeout_ns),\
     .def = "3s", .min = "50ms", .max = "1h",                                                     \
     .help = "a node silent this long is considered dead"},                                       \
    {.key = "request_timeout", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(T, P request_timeout_ns), \
     .def = "10m", .min = "100ms", .max = "24h", .help = "deadline of one request"},              \
    {.key = "max_ctx", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, P max_ctx), .def = "0", .max = "1048576",\
     .help = "context per sequence (prompt + max_tokens); 0: the model's; lowered to the "      \
             "least a live node registered"},                                                     \
    {.key = "startup_wait", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(T, P startup_wait_ns), .def = "10s",\
     .max = "10m",                                                                                \
     .help = "for this long after start, requests wait for the first nodes instead of a 503"},    \
    {.key = "port_file", .type = TY_CONFIG_STRING, TY_CONFIG_AT(T, P port_file),                  \
     .help = "write 'http_port rpc_port' here once listening (scripts, tests)"},                  \
    {.key = "limits", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(T, P limits), .sub = &ty_conductor_limits_table,\
     .help = "HTTP request limits"}

/* ---- Conductor side: registry and remote backend -------------------------------------------- */

typedef struct ty_conductor ty_conductor_t;

struct ty_conductor_opts {
    uv_loop_t *loop;
    const char *rpc_host;
    uint16_t rpc_port;
    const struct ty_auth *auth; /* the cluster secret of the RPC port, of the Conductor's calls
                                 * to the nodes and of its pool client; borrowed; NULL: insecure */
    const ty_model_t *model;
    uint32_t max_ctx;
    uint32_t heartbeat_interval_ms;
    uint32_t heartbeat_timeout_ms;
    uint32_t request_timeout_ms;
    /* Failure detection by outcome: a decode node that has not answered a DecodeAssign (pages
     * reserved) in node_answer_timeout_ms, or a prefill node whose KV is that much past its
     * predicted time, failed the request, which is placed again on another node (once, only
     * while no token has streamed). breaker_failures such failures in a row (0: 3) take a node
     * out of placement for breaker_open_ms (0: 5000), doubling per failed probe up to 16x;
     * then one request probes it, and its success puts the node back. 0: 10000. */
    uint32_t node_answer_timeout_ms;
    uint32_t breaker_failures;
    uint32_t breaker_open_ms;
    uint32_t startup_wait_ms; /* requests before any node registered wait this long (first
                               * seconds after start only); 0: answer TY_EUNAVAIL at once */
    ty_serve_event_cb event_cb; /* loop thread */
    void *event_arg;
    /* The scheduler (DESIGN.md §6). NULL: defaults (kvcache_centric, predicted admission, no
     * SLO, cost derived from the model and refitted). Borrowed until ty_conductor_new returns. */
    const struct ty_sched_config *sched;
    const struct ty_conductor_cost_config *cost;
    const char *model_name;            /* picks the SLO entry of sched->models */
    uint32_t expected_output_tokens;   /* when a request has no max_tokens (0: 256) */
    /* Every SLO refusal carries Retry-After, also one that no retry can cure (config
     * x_should_retry: false); else such a refusal carries x-should-retry: false instead
     * (ty_serve_reject.no_retry), which the OpenAI SDKs honour. */
    bool retry_after_only;
    ty_metrics_registry_t *metrics;    /* optional: scheduler counters and gauges */
    /* The cluster KV pool's master, when the prefill nodes use one (their kv_pool.master):
     * the scheduler then knows the pool's blocks and plans prefixes read from it. */
    const char *kv_pool_master;
    /* Chunked pipeline parallelism (struct ty_conductor_pipeline_config; zero: off). */
    struct ty_conductor_pipeline_config pipeline;
};

/* A node's circuit breaker: closed (placed on), open (failed breaker_failures requests in a
 * row: out of placement), half_open (its probe: one request may go to it). */
enum ty_conductor_breaker { TY_BREAKER_CLOSED, TY_BREAKER_OPEN, TY_BREAKER_HALF_OPEN };
const char *ty_conductor_breaker_name(int state);

struct ty_conductor_node_info {
    char id[64];
    int role;
    char address[128];
    bool alive;
    uint32_t inflight;         /* requests the Conductor has on it now */
    int breaker;               /* enum ty_conductor_breaker */
    uint32_t failures;         /* requests it failed in a row */
    uint64_t served;           /* requests assigned to it so far */
    struct ty_node_load load;
};

int ty_conductor_new(ty_conductor_t **out, const struct ty_conductor_opts *opts);
uint16_t ty_conductor_rpc_port(const ty_conductor_t *c);
/* Every accepted API key of c (api_keys, then api_key_classes) and its SLO class (NULL for
 * the first kind), as the API's ty_api_set_keys takes them: two malloc'd arrays of *n
 * borrowed strings (free the arrays, not the strings; both NULL when there are none).
 * Returns 0 or TY_ENOMEM. */
int ty_conductor_api_keys(const struct ty_conductor_config *c, const char ***keys,
                        const char ***classes, size_t *n);

/* The checks across the front-door rows (the root tables' ty_config_check_cb): tls_cert and
 * tls_key both or neither, readable PEM files, the key that of the certificate; every
 * "sha256:" API key well-formed. Returns 0 or TY_ECONFIG with `field` and `why` filled. Any
 * thread (reads the files). */
int ty_conductor_config_check(const struct ty_conductor_config *c, char *field, size_t field_cap,
                              char *why, size_t why_cap);

/* The remote serving backend (valid until close). */
struct ty_serve_backend ty_conductor_backend(ty_conductor_t *c);
/* Apply the scheduler settings an operator tunes live (a SIGHUP reload of `scheduler:`):
 * policy, admission, kvcache_balancing_threshold, local_prefix_only and this model's SLO
 * classes. Requests in flight keep their class; new ones are judged by the new SLOs. The
 * loop's thread. Returns 0 or TY_EINVAL (logged; the running settings stay). */
int ty_conductor_reload_sched(ty_conductor_t *c, const struct ty_sched_config *sc);
/* Copy up to `cap` nodes; returns how many there are. */
size_t ty_conductor_nodes(const ty_conductor_t *c, struct ty_conductor_node_info *out, size_t cap);
/* Fail every request (ERROR events), close the RPC server and node connections, free; cb. */
void ty_conductor_close(ty_conductor_t *c, void (*cb)(void *arg), void *arg);

#endif
