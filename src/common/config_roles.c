/* Settings tables of the Conductor's basics and of a node; the roles `tycho check-config` and
 * the daemons know. One row per setting: add a member to config_roles.h and a row here.
 * Tables are immutable; any thread may read them.
 */
#include "tycho/config_roles.h"

#include <stddef.h>
#include <string.h>

const char *const ty_config_log_level_names[] = {"error", "warn", "info", "debug", "trace", NULL};

/* ---- scheduler (the Conductor's `scheduler:` section and `tycho sim`'s) ------------------------ */

/* In enum ty_sched_policy / enum ty_sched_admission order (tycho/sched.h). */
const char *const ty_config_sched_policy_names[] = {"random",      "round_robin", "load_balance",
                                                    "cache_aware", "kvcache_centric", NULL};
const char *const ty_config_sched_admission_names[] = {"baseline", "early", "predicted", NULL};

#define K struct ty_sched_slo_config
static const struct ty_config_field sched_slo_fields[] = {
    {.key = "class", .type = TY_CONFIG_STRING, TY_CONFIG_AT(K, class_name), .def = "default",
     .min = "1", .max = "64", .help = "priority class name (entry i is class i)"},
    {.key = "ttft", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(K, ttft_ns), .def = "0s",
     .help = "time-to-first-token SLO (0: none)"},
    {.key = "tbt", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(K, tbt_ns), .def = "0s",
     .help = "time-between-tokens SLO (0: none)"},
};
#undef K
static const struct ty_config_struct sched_slo =
    TY_CONFIG_STRUCT("slo_class", struct ty_sched_slo_config, sched_slo_fields);

#define K struct ty_sched_model_config
static const struct ty_config_field sched_model_fields[] = {
    {.key = "name", .type = TY_CONFIG_STRING, TY_CONFIG_AT(K, name), .min = "1",
     .flags = TY_CONFIG_REQUIRED, .help = "model id"},
    {.key = "slo", .type = TY_CONFIG_LIST, .sub = &sched_slo, TY_CONFIG_LIST_AT(K, slo, n_slo),
     .max = "8", .help = "SLOs per priority class; class 0 is the default"},
};
#undef K
static const struct ty_config_struct sched_model =
    TY_CONFIG_STRUCT("model", struct ty_sched_model_config, sched_model_fields);

#define K struct ty_sched_config
static const struct ty_config_field sched_fields[] = {
    {.key = "policy", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(K, policy), .def = "kvcache_centric",
     .enum_names = ty_config_sched_policy_names, .help = "prefill/decode placement policy"},
    {.key = "admission", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(K, admission),
     .def = "predicted", .enum_names = ty_config_sched_admission_names,
     .help = "admission control: per-stage baseline, early or prediction-based rejection"},
    {.key = "kvcache_balancing_threshold", .type = TY_CONFIG_DOUBLE,
     TY_CONFIG_AT(K, kvcache_balancing_threshold), .def = "1.0", .min = "0", .max = "1000",
     .help = "fetch a remote prefix R over the local L only when R > L * threshold"},
    {.key = "decode_duration", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(K, decode_duration_ns),
     .def = "10s", .min = "1ms", .max = "1h",
     .help = "first estimate of the uniform decode duration (predicted admission)"},
    {.key = "seed", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, seed), .def = "1",
     .help = "seed of the random policy"},
    {.key = "models", .type = TY_CONFIG_LIST, .sub = &sched_model,
     TY_CONFIG_LIST_AT(K, models, n_models), .max = "64",
     .help = "SLOs per model and priority class"},
};
#undef K
const struct ty_config_struct ty_sched_config_table =
    TY_CONFIG_STRUCT("scheduler", struct ty_sched_config, sched_fields);

/* ---- conductor ----------------------------------------------------------------------------- */

#define C struct ty_conductor_config
#define L struct ty_conductor_limits

static const struct ty_config_field conductor_limit_fields[] = {
    {.key = "max_body_bytes", .type = TY_CONFIG_SIZE, TY_CONFIG_AT(L, max_body_bytes),
     .def = "8M", .min = "1K", .max = "1G", .help = "largest request body accepted"},
    {.key = "header_timeout", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(L, header_timeout_ns),
     .def = "10s", .min = "1ms", .max = "10m", .help = "time allowed to receive the headers"},
    {.key = "body_timeout", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(L, body_timeout_ns),
     .def = "30s", .min = "1ms", .max = "1h", .help = "time allowed to receive the body"},
    {.key = "max_connections", .type = TY_CONFIG_UINT, TY_CONFIG_AT(L, max_connections),
     .def = "4096", .min = "1", .max = "1000000", .flags = TY_CONFIG_RELOADABLE,
     .help = "concurrent client connections"},
};
static const struct ty_config_struct conductor_limits =
    TY_CONFIG_STRUCT("limits", L, conductor_limit_fields);

static const struct ty_config_field conductor_fields[] = {
    {.key = "listen_host", .type = TY_CONFIG_STRING, TY_CONFIG_AT(C, listen_host),
     .def = "127.0.0.1", .min = "1", .help = "address of the HTTP front door"},
    {.key = "listen_port", .type = TY_CONFIG_UINT, TY_CONFIG_AT(C, listen_port), .def = "8000",
     .min = "1", .max = "65535", .help = "TCP port of the HTTP front door"},
    {.key = "model_path", .type = TY_CONFIG_STRING, TY_CONFIG_AT(C, model_path), .min = "1",
     .flags = TY_CONFIG_REQUIRED, .help = "model file (GGUF) or Hugging Face directory"},
    {.key = "api_keys", .type = TY_CONFIG_LIST, .elem = TY_CONFIG_STRING,
     TY_CONFIG_LIST_AT(C, api_keys, n_api_keys), .max = "1024",
     .flags = TY_CONFIG_RELOADABLE | TY_CONFIG_SECRET,
     .help = "accepted bearer tokens; empty: no authentication"},
    {.key = "kv_block_tokens", .type = TY_CONFIG_UINT, TY_CONFIG_AT(C, kv_block_tokens),
     .def = "64", .min = "1", .max = "4096", .help = "tokens per KV block (DESIGN.md 4)"},
    {.key = "log_level", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(C, log_level), .def = "info",
     .enum_names = ty_config_log_level_names, .flags = TY_CONFIG_RELOADABLE,
     .help = "log threshold"},
    {.key = "heartbeat_timeout", .type = TY_CONFIG_DURATION,
     TY_CONFIG_AT(C, heartbeat_timeout_ns), .def = "10s", .min = "100ms", .max = "1h",
     .help = "a node silent this long is considered dead"},
    {.key = "limits", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(C, limits),
     .sub = &conductor_limits, .help = "HTTP request limits"},
    {.key = "scheduler", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(C, scheduler),
     .sub = &ty_sched_config_table, .help = "request placement and admission"},
};
const struct ty_config_struct ty_conductor_config_table =
    TY_CONFIG_STRUCT("conductor", C, conductor_fields);

#undef C
#undef L

/* ---- node (prefill / decode / store) ------------------------------------------------------- */

#define N struct ty_node_config

static const char *const node_role_names[] = {"prefill", "decode", "store", NULL};
static const char *const transport_names[] = {"tcp", "rdma", "local", NULL};

static const struct ty_config_field node_prefill_fields[] = {
    {.key = "max_batch_tokens", .type = TY_CONFIG_UINT,
     TY_CONFIG_AT(struct ty_node_prefill, max_batch_tokens), .def = "8192", .min = "1",
     .max = "1048576", .help = "tokens in one prefill batch"},
    {.key = "chunk_tokens", .type = TY_CONFIG_UINT,
     TY_CONFIG_AT(struct ty_node_prefill, chunk_tokens), .def = "2048", .min = "1",
     .max = "1048576", .help = "chunked-prefill chunk length"},
};
static const struct ty_config_struct node_prefill =
    TY_CONFIG_STRUCT("prefill", struct ty_node_prefill, node_prefill_fields);

static const struct ty_config_field node_decode_fields[] = {
    {.key = "max_batch_size", .type = TY_CONFIG_UINT,
     TY_CONFIG_AT(struct ty_node_decode, max_batch_size), .def = "64", .min = "1",
     .max = "4096", .help = "requests decoded together"},
    {.key = "kv_cache_bytes", .type = TY_CONFIG_SIZE,
     TY_CONFIG_AT(struct ty_node_decode, kv_cache_bytes), .def = "1G", .min = "1M",
     .help = "memory for the KV page pool"},
};
static const struct ty_config_struct node_decode =
    TY_CONFIG_STRUCT("decode", struct ty_node_decode, node_decode_fields);

static const struct ty_config_field node_store_fields[] = {
    {.key = "dram_bytes", .type = TY_CONFIG_SIZE, TY_CONFIG_AT(struct ty_node_store, dram_bytes),
     .def = "1G", .min = "1M", .help = "DRAM tier size"},
    {.key = "ssd_bytes", .type = TY_CONFIG_SIZE, TY_CONFIG_AT(struct ty_node_store, ssd_bytes),
     .def = "0", .help = "SSD tier size; 0: no SSD tier"},
    {.key = "ssd_path", .type = TY_CONFIG_STRING, TY_CONFIG_AT(struct ty_node_store, ssd_path),
     .help = "directory of the SSD tier's bucket files"},
    {.key = "high_watermark", .type = TY_CONFIG_DOUBLE,
     TY_CONFIG_AT(struct ty_node_store, high_watermark), .def = "0.9", .min = "0.1",
     .max = "1.0", .flags = TY_CONFIG_RELOADABLE, .help = "fill ratio that starts eviction"},
};
static const struct ty_config_struct node_store =
    TY_CONFIG_STRUCT("store", struct ty_node_store, node_store_fields);

static const struct ty_config_field node_fields[] = {
    {.key = "role", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(N, role), .enum_names = node_role_names,
     .flags = TY_CONFIG_REQUIRED, .help = "what this node does"},
    {.key = "name", .type = TY_CONFIG_STRING, TY_CONFIG_AT(N, name), .min = "1", .max = "64",
     .help = "node name in logs and metrics (default: host name)"},
    {.key = "conductor_address", .type = TY_CONFIG_STRING, TY_CONFIG_AT(N, conductor_address),
     .def = "127.0.0.1:9000", .min = "3", .help = "host:port of the Conductor's RPC endpoint"},
    {.key = "listen_host", .type = TY_CONFIG_STRING, TY_CONFIG_AT(N, listen_host),
     .def = "127.0.0.1", .min = "1", .help = "address for RPC and transfers"},
    {.key = "listen_port", .type = TY_CONFIG_UINT, TY_CONFIG_AT(N, listen_port), .def = "0",
     .max = "65535", .help = "RPC port; 0: an ephemeral port"},
    {.key = "model_path", .type = TY_CONFIG_STRING, TY_CONFIG_AT(N, model_path),
     .help = "model (prefill and decode nodes)"},
    {.key = "transport", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(N, transport), .def = "tcp",
     .enum_names = transport_names, .help = "KV transfer transport"},
    {.key = "log_level", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(N, log_level), .def = "info",
     .enum_names = ty_config_log_level_names, .flags = TY_CONFIG_RELOADABLE,
     .help = "log threshold"},
    {.key = "heartbeat_interval", .type = TY_CONFIG_DURATION,
     TY_CONFIG_AT(N, heartbeat_interval_ns), .def = "1s", .min = "10ms", .max = "1m",
     .help = "how often the node reports its load"},
    {.key = "kv_block_tokens", .type = TY_CONFIG_UINT, TY_CONFIG_AT(N, kv_block_tokens),
     .def = "64", .min = "1", .max = "4096", .help = "tokens per KV block (must match the Conductor)"},
    {.key = "prefill", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(N, prefill), .sub = &node_prefill,
     .help = "prefill settings"},
    {.key = "decode", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(N, decode), .sub = &node_decode,
     .help = "decode settings"},
    {.key = "store", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(N, store), .sub = &node_store,
     .help = "KV pool settings"},
};
const struct ty_config_struct ty_node_config_table = TY_CONFIG_STRUCT("node", N, node_fields);

#undef N

/* ---- the role list --------------------------------------------------------------------------- */

const struct ty_config_role ty_config_roles[] = {
    {"conductor", "the Conductor (scheduler and HTTP front door)", &ty_conductor_config_table},
    {"node", "a prefill, decode or store node", &ty_node_config_table},
};
const size_t ty_config_n_roles = sizeof(ty_config_roles) / sizeof(ty_config_roles[0]);

const struct ty_config_role *ty_config_role_find(const char *name)
{
    for (size_t i = 0; i < ty_config_n_roles; i++)
        if (strcmp(ty_config_roles[i].name, name) == 0)
            return &ty_config_roles[i];
    return NULL;
}
