/* Settings tables of the roles known before their daemons exist (src/common/config_roles.c):
 * the Conductor's own basics with its scheduler, and a pool/engine `node` (prefill, decode or
 * store). The scheduler's table is also the `scheduler:` section of `tycho sim`'s spec.
 *
 * Filled by a ty_config_t (see config.h) on the daemon's main thread; read-only afterwards,
 * except for TY_CONFIG_RELOADABLE fields that ty_config_reload() changes on that same thread.
 * Strings and lists are owned by the config object that filled the struct.
 * To add settings: add the member here and one row to the table in config_roles.c.
 */
#ifndef TYCHO_CONFIG_ROLES_H
#define TYCHO_CONFIG_ROLES_H

#include "tycho/config.h"

#include <stdint.h>

/* The scheduler's settings (tycho/sched.h): one table shared by the Conductor's `scheduler:`
 * section and `tycho sim`'s cluster spec (src/sim/spec.c). policy and admission hold enum
 * ty_sched_policy / enum ty_sched_admission values; the name lists below are in that order
 * and are the ones the scheduler's own parsers use. */
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
    uint64_t decode_duration_ns;         /* first estimate of the uniform decode duration */
    uint64_t seed;                       /* random policy */
    struct ty_sched_model_config *models; /* SLOs per model and priority class */
    uint32_t n_models;
};

extern const struct ty_config_struct ty_sched_config_table;
extern const char *const ty_config_sched_policy_names[];    /* NULL-terminated */
extern const char *const ty_config_sched_admission_names[]; /* NULL-terminated */

/* HTTP request limits of the Conductor's front door. */
struct ty_conductor_limits {
    uint64_t max_body_bytes;     /* request body cap */
    uint64_t header_timeout_ns;  /* all headers must arrive within this */
    uint64_t body_timeout_ns;    /* the body must arrive within this after the headers */
    uint32_t max_connections;
};

struct ty_conductor_config {
    char *listen_host;
    uint16_t listen_port;
    char *model_path;
    char **api_keys; /* empty: no authentication */
    uint32_t n_api_keys;
    uint32_t kv_block_tokens;
    int log_level;                /* enum ty_log_level */
    uint64_t heartbeat_timeout_ns;
    struct ty_conductor_limits limits;
    struct ty_sched_config scheduler;
};

enum ty_node_role {
    TY_NODE_ROLE_PREFILL,
    TY_NODE_ROLE_DECODE,
    TY_NODE_ROLE_STORE,
};

enum ty_node_transport {
    TY_NODE_TRANSPORT_TCP,
    TY_NODE_TRANSPORT_RDMA,
    TY_NODE_TRANSPORT_LOCAL,
};

struct ty_node_prefill {
    uint32_t max_batch_tokens;
    uint32_t chunk_tokens;
};

struct ty_node_decode {
    uint32_t max_batch_size;
    uint64_t kv_cache_bytes;
};

struct ty_node_store {
    uint64_t dram_bytes;
    uint64_t ssd_bytes;
    char *ssd_path;
    double high_watermark;
};

struct ty_node_config {
    int role;                     /* enum ty_node_role */
    char *name;
    char *conductor_address;      /* host:port of the Conductor's RPC endpoint */
    char *listen_host;
    uint16_t listen_port;
    char *model_path;
    int transport;                /* enum ty_node_transport */
    int log_level;                /* enum ty_log_level */
    uint64_t heartbeat_interval_ns;
    uint32_t kv_block_tokens;
    struct ty_node_prefill prefill;
    struct ty_node_decode decode;
    struct ty_node_store store;
};

extern const struct ty_config_struct ty_conductor_config_table;
extern const struct ty_config_struct ty_node_config_table;

/* Names for TY_CONFIG_ENUM log levels, in enum ty_log_level order. */
extern const char *const ty_config_log_level_names[];

#endif
