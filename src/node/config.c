/* The prefill and decode nodes' settings table (tycho/node.h); its engine rows are
 * TY_NODE_ENGINE_CONFIG_ROWS, which `tycho serve`'s `engine:` section shares. Immutable; any
 * thread may read it. */
#include "tycho/node.h"

#include "tycho/engine.h"

#include <stddef.h>

/* ---- prefill and decode nodes ---------------------------------------------------------------- */

#define K struct ty_node_pool_config
static const char *const pool_transport_names[] = {"auto", "tcp", "local", NULL};
static const struct ty_config_field node_pool_fields[] = {
    {.key = "master", .type = TY_CONFIG_STRING, TY_CONFIG_AT(K, master), .min = "3",
     .help = "host:port of the KV pool's master (comma list: standbys); unset: no pool"},
    {.key = "timeout", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(K, timeout_ns), .def = "1s",
     .min = "1ms", .max = "1m", .help = "limit of one pool operation (lookup, read, write)"},
    {.key = "retry", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(K, retry_ns), .def = "5s",
     .min = "1ms", .max = "1h", .help = "after the pool failed, prompts skip it this long"},
    {.key = "replicas", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, replicas), .def = "0",
     .max = "8", .help = "replicas of each stored block; 0: the master's default"},
    {.key = "transport", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(K, transport), .def = "auto",
     .enum_names = pool_transport_names,
     .help = "transfers to and from the pool: auto (local on the same host, else tcp), tcp, local"},
};
static const struct ty_config_struct node_pool =
    TY_CONFIG_STRUCT("kv_pool", K, node_pool_fields);
#undef K

#define X struct ty_node_transfer_config
const char *const ty_node_transport_names[] = {"auto", "tcp", "local", "rdma", NULL};
static const struct ty_config_field node_transfer_fields[] = {
    {.key = "transport", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(X, transport), .def = "auto",
     .enum_names = ty_node_transport_names,
     .help = "how KV pages move between nodes: auto (per peer the fastest path both ends have: "
             "local shared memory on the same host, rdma where both have a device, else tcp), "
             "tcp, local (same host only) or rdma (start-up fails without an RDMA device)"},
    {.key = "rdma_devices", .type = TY_CONFIG_STRING, TY_CONFIG_AT(X, rdma_devices), .min = "1",
     .help = "comma list of RDMA devices (e.g. mlx5_0,mlx5_1); unset: every one with an active "
             "port; none: no RDMA"},
};
static const struct ty_config_struct node_transfer =
    TY_CONFIG_STRUCT("transfer", X, node_transfer_fields);
#undef X

#define N struct ty_node_config

static const struct ty_config_field node_fields[] = {
    {.key = "name", .type = TY_CONFIG_STRING, TY_CONFIG_AT(N, name), .min = "1", .max = "63",
     .help = "node id, stable across restarts (default: role-host-pid)"},
    {.key = "conductor_address", .type = TY_CONFIG_STRING, TY_CONFIG_AT(N, conductor_address),
     .def = "127.0.0.1:9000", .min = "3",
     .help = "host:port of the Conductor's RPC endpoint; a comma list: the node registers "
             "with each of several Conductors that run side by side"},
    {.key = "listen_host", .type = TY_CONFIG_STRING, TY_CONFIG_AT(N, listen_host),
     .def = "127.0.0.1", .min = "1", .help = "address for RPC and KV transfers"},
    {.key = "listen_port", .type = TY_CONFIG_UINT, TY_CONFIG_AT(N, listen_port), .def = "0",
     .max = "65535", .help = "RPC port; 0: ephemeral"},
    {.key = "transfer_port", .type = TY_CONFIG_UINT, TY_CONFIG_AT(N, transfer_port), .def = "0",
     .max = "65535", .help = "transfer engine port; 0: ephemeral"},
    {.key = "model_path", .type = TY_CONFIG_STRING, TY_CONFIG_AT(N, model_path), .min = "1",
     .flags = TY_CONFIG_REQUIRED, .help = "model file (GGUF) or Hugging Face directory"},
    {.key = "log_level", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(N, log_level), .def = "info",
     .enum_names = ty_config_log_level_names, .flags = TY_CONFIG_RELOADABLE,
     .help = "log threshold"},
    {.key = "log_format", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(N, log_format), .def = "text",
     .enum_names = ty_config_log_format_names, .flags = TY_CONFIG_RELOADABLE,
     .help = TY_CONFIG_LOG_FORMAT_HELP},
    {.key = "heartbeat_interval", .type = TY_CONFIG_DURATION,
     TY_CONFIG_AT(N, heartbeat_interval_ns), .def = "500ms", .min = "10ms", .max = "1m",
     .help = "load report period until the Conductor sets one"},
    TY_NODE_ENGINE_CONFIG_ROWS(N),
    {.key = "max_ctx", .type = TY_CONFIG_UINT, TY_CONFIG_AT(N, max_ctx), .def = "0",
     .max = "1048576", .help = "context per sequence; 0: the model's (lowered to what the KV "
                               "cache holds)"},
    {.key = "chunk_tokens", .type = TY_CONFIG_UINT, TY_CONFIG_AT(N, chunk_tokens),
     .def = "512", .min = "1", .max = "1048576", .help = "prefill: chunked-prefill chunk"},
    {.key = "prefill_batch", .type = TY_CONFIG_UINT, TY_CONFIG_AT(N, prefill_batch),
     .def = "8", .min = "1", .max = "64",
     .help = "prefill: queued prompts run in one forward call (within chunk_tokens); 1: one "
             "at a time"},
    {.key = "kv_wait_timeout", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(N, kv_wait_timeout_ns),
     .def = "30s", .min = "10ms", .max = "1h",
     .help = "decode: reserved pages are released if their KV has not landed by then"},
    {.key = "peer_fetch_timeout", .type = TY_CONFIG_DURATION,
     TY_CONFIG_AT(N, peer_fetch_timeout_ns), .def = "1s", .min = "1ms", .max = "1m",
     .help = "prefill: a prefix planned from another prefill node's cache waits this long for "
             "that node to pin it; then (or when its read fails) it is computed"},
    {.key = "metrics_port", .type = TY_CONFIG_UINT, TY_CONFIG_AT(N, metrics_port), .def = "0",
     .max = "65535", .help = "Prometheus /metrics (and /health) over HTTP on listen_host; 0: "
                             "ephemeral"},
    {.key = "port_file", .type = TY_CONFIG_STRING, TY_CONFIG_AT(N, port_file),
     .help = "write 'rpc_port transfer_port metrics_port' here once listening (scripts, tests)"},
    {.key = "kv_pool", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(N, kv_pool), .sub = &node_pool,
     .help = "the cluster KV pool (tycho-store): prefill nodes read prompt prefixes from it "
             "and write their blocks, decode nodes write a finished answer's blocks"},
    {.key = "transfer", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(N, transfer),
     .sub = &node_transfer, .help = "the KV handoff between prefill and decode nodes"},
    TY_AUTH_CONFIG_ROWS(N, cluster.),
};
const struct ty_config_struct ty_node_config_table =
    TY_CONFIG_STRUCT("node", N, node_fields);
#undef N
