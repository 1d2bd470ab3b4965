/* Settings tables of tycho-conductor, `tycho serve` and the prefill / decode nodes
 * (tycho/cluster.h). One row per setting, each written once: the Conductor's rows are shared by
 * tycho-conductor and `tycho serve`, the engine rows by the nodes and serve's `engine:` section.
 * Tables are immutable; any thread may read them. Also the one reading of them both daemons
 * share (the API keys).
 */
#include "tycho/cluster.h"
#include "tycho/errors.h"

#include <stddef.h>
#include <stdlib.h>

/* A row's member `m` of struct T, where the member sits under `prefix` ("conductor." inside
 * struct ty_cluster_serve_config, nothing in struct ty_cluster_config). */
#define AT(T, prefix, m) TY_CONFIG_AT(T, prefix m)

static const struct ty_config_field key_class_fields[] = {
    {.key = "key", .type = TY_CONFIG_STRING, TY_CONFIG_AT(struct ty_cluster_key_class, key),
     .min = "1", .flags = TY_CONFIG_REQUIRED | TY_CONFIG_SECRET, .help = "the bearer token"},
    {.key = "class", .type = TY_CONFIG_STRING,
     TY_CONFIG_AT(struct ty_cluster_key_class, slo_class), .min = "1", .max = "64",
     .flags = TY_CONFIG_REQUIRED, .help = "the SLO class (scheduler.models[].slo[].class)"},
};
static const struct ty_config_struct key_class =
    TY_CONFIG_STRUCT("api_key_class", struct ty_cluster_key_class, key_class_fields);

#define L struct ty_cluster_limits

static const struct ty_config_field limit_fields[] = {
    {.key = "max_body_bytes", .type = TY_CONFIG_SIZE, TY_CONFIG_AT(L, max_body_bytes),
     .def = "8M", .min = "1K", .max = "1G", .help = "largest request body accepted"},
    {.key = "header_timeout", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(L, header_timeout_ns),
     .def = "10s", .min = "1ms", .max = "10m", .help = "time allowed to receive the headers"},
    {.key = "body_timeout", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(L, body_timeout_ns),
     .def = "30s", .min = "1ms", .max = "1h", .help = "time allowed to receive the body"},
    {.key = "max_connections", .type = TY_CONFIG_UINT, TY_CONFIG_AT(L, max_connections),
     .def = "4096", .min = "1", .max = "1000000", .help = "concurrent client connections"},
};
static const struct ty_config_struct limits = TY_CONFIG_STRUCT("limits", L, limit_fields);
#undef L

/* ---- the Conductor (tycho-conductor; the root of `tycho serve`) ------------------------------ */

#define CONDUCTOR_ROWS(T, P)                                                                      \
    {.key = "listen_host", .type = TY_CONFIG_STRING, AT(T, P, listen_host),                       \
     .def = "127.0.0.1", .min = "1", .help = "address of the HTTP front door"},                   \
    {.key = "listen_port", .type = TY_CONFIG_UINT, AT(T, P, listen_port), .def = "8000",          \
     .max = "65535", .help = "TCP port of the HTTP front door; 0: ephemeral"},                    \
    {.key = "rpc_host", .type = TY_CONFIG_STRING, AT(T, P, rpc_host), .def = "127.0.0.1",         \
     .min = "1", .help = "address nodes register with"},                                         \
    {.key = "rpc_port", .type = TY_CONFIG_UINT, AT(T, P, rpc_port), .def = "9000",                \
     .max = "65535", .help = "RPC port nodes register with; 0: ephemeral"},                       \
    {.key = "model_path", .type = TY_CONFIG_STRING, AT(T, P, model_path), .min = "1",             \
     .flags = TY_CONFIG_REQUIRED, .help = "model file (GGUF) or Hugging Face directory"},         \
    {.key = "api_keys", .type = TY_CONFIG_LIST, .elem = TY_CONFIG_STRING,                         \
     TY_CONFIG_LIST_AT(T, P api_keys, P n_api_keys), .max = "1024",                               \
     .flags = TY_CONFIG_RELOADABLE | TY_CONFIG_SECRET,                                            \
     .help = "accepted bearer tokens; empty: no authentication"},                                 \
    {.key = "api_key_classes", .type = TY_CONFIG_LIST, .sub = &key_class,                         \
     TY_CONFIG_LIST_AT(T, P api_key_classes, P n_api_key_classes), .max = "1024",                 \
     .flags = TY_CONFIG_RELOADABLE,                                                               \
     .help = "more accepted bearer tokens, each serving its requests in one SLO class "            \
             "(tycho-conductor), whatever they ask for"},                                         \
    {.key = "log_level", .type = TY_CONFIG_ENUM, AT(T, P, log_level), .def = "info",              \
     .enum_names = ty_config_log_level_names, .flags = TY_CONFIG_RELOADABLE,                      \
     .help = "log threshold"},                                                                    \
    {.key = "heartbeat_interval", .type = TY_CONFIG_DURATION, AT(T, P, heartbeat_interval_ns),    \
     .def = "500ms", .min = "10ms", .max = "1m", .help = "heartbeat period asked of the nodes"},  \
    {.key = "heartbeat_timeout", .type = TY_CONFIG_DURATION, AT(T, P, heartbeat_timeout_ns),      \
     .def = "3s", .min = "50ms", .max = "1h",                                                     \
     .help = "a node silent this long is considered dead"},                                       \
    {.key = "request_timeout", .type = TY_CONFIG_DURATION, AT(T, P, request_timeout_ns),          \
     .def = "10m", .min = "100ms", .max = "24h", .help = "deadline of one request"},              \
    {.key = "max_ctx", .type = TY_CONFIG_UINT, AT(T, P, max_ctx), .def = "0", .max = "1048576",   \
     .help = "context per sequence; 0: the model's, at most 4096"},                               \
    {.key = "startup_wait", .type = TY_CONFIG_DURATION, AT(T, P, startup_wait_ns), .def = "10s",  \
     .max = "10m",                                                                                \
     .help = "for this long after start, requests wait for the first nodes instead of a 503"},    \
    {.key = "port_file", .type = TY_CONFIG_STRING, AT(T, P, port_file),                           \
     .help = "write 'http_port rpc_port' here once listening (scripts, tests)"},                  \
    {.key = "limits", .type = TY_CONFIG_SECTION, AT(T, P, limits), .sub = &limits,                \
     .help = "HTTP request limits"}

#define K struct ty_cluster_cost_config
static const struct ty_config_field cost_fields[] = {
    {.key = "profile", .type = TY_CONFIG_STRING, TY_CONFIG_AT(K, profile), .def = "auto",
     .min = "1",
     .help = "starting cost model: auto (derived from the model for a CPU node), "
             "llama3-70b-8xa800, llama3-70b-8xh800"},
    {.key = "prefill", .type = TY_CONFIG_LIST, .elem = TY_CONFIG_DOUBLE,
     TY_CONFIG_LIST_AT(K, prefill, n_prefill), .max = "3",
     .help = "[c0 us, c1 us/token, c2 us/token^2] replacing the profile's (3 or none)"},
    {.key = "decode", .type = TY_CONFIG_LIST, .elem = TY_CONFIG_DOUBLE,
     TY_CONFIG_LIST_AT(K, decode, n_decode), .max = "3",
     .help = "[d0 us, d1 us/sequence, d2 us/context token] replacing the profile's (3 or none)"},
    {.key = "net_gbytes_per_s", .type = TY_CONFIG_DOUBLE, TY_CONFIG_AT(K, net_gbytes_per_s),
     .def = "1.0", .min = "0.001", .max = "100000",
     .help = "KV transfer bandwidth of a prefill node, GB/s"},
    {.key = "refit", .type = TY_CONFIG_BOOL, TY_CONFIG_AT(K, refit), .def = "true",
     .help = "refit prefill and decode coefficients from the nodes' measured timings"},
    {.key = "refit_window", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, refit_window),
     .def = "256", .min = "8", .max = "65536", .help = "most recent samples each refit uses"},
};
#undef K
static const struct ty_config_struct cost_struct =
    TY_CONFIG_STRUCT("cost", struct ty_cluster_cost_config, cost_fields);

static const struct ty_config_field conductor_pool_fields[] = {
    {.key = "master", .type = TY_CONFIG_STRING,
     TY_CONFIG_AT(struct ty_cluster_pool_config, master), .min = "3",
     .help = "host:port of the KV pool's master (the prefill nodes' kv_pool.master); unset: "
             "no pool"},
};
static const struct ty_config_struct conductor_pool =
    TY_CONFIG_STRUCT("kv_pool", struct ty_cluster_pool_config, conductor_pool_fields);

static const struct ty_config_field conductor_fields[] = {
    CONDUCTOR_ROWS(struct ty_cluster_config, ),
    {.key = "scheduler", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(struct ty_cluster_config,
     scheduler), .sub = &ty_sched_config_table,
     .help = "placement policy, admission and SLOs per model (DESIGN.md §6)"},
    {.key = "cost", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(struct ty_cluster_config, cost),
     .sub = &cost_struct, .help = "the scheduler's cost model"},
    {.key = "expected_output_tokens", .type = TY_CONFIG_UINT,
     TY_CONFIG_AT(struct ty_cluster_config, expected_output_tokens), .def = "256", .min = "1",
     .max = "1048576",
     .help = "output length the scheduler assumes for a request without max_tokens"},
    {.key = "kv_pool", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(struct ty_cluster_config, kv_pool),
     .sub = &conductor_pool,
     .help = "the cluster KV pool the prefill nodes share: the scheduler follows its blocks"},
};
const struct ty_config_struct ty_cluster_config_table =
    TY_CONFIG_STRUCT("conductor", struct ty_cluster_config, conductor_fields);

/* ---- the engine settings (nodes at the root, `tycho serve` in `engine:`) --------------------- */

const char *const ty_cluster_kv_dtype_names[] = {"auto", "f32", "f16", NULL};
const char *const ty_cluster_backend_names[] = {"cpu", "cuda", NULL};
const char *const ty_cluster_cuda_weights_names[] = {"auto", "f32", "f16", "bf16", NULL};

#define ENGINE_ROWS(T)                                                                            \
    {.key = "threads", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, threads), .def = "1", .min = "1",  \
     .max = "256", .help = "CPU threads of the engine"},                                          \
    {.key = "kv_block_tokens", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, kv_block_tokens),          \
     .def = "64", .min = "1", .max = "4096", .help = "tokens per KV page (same on every node)"},  \
    {.key = "kv_pages", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, kv_pages), .def = "0",            \
     .max = "16777216", .help = "KV pages per layer; 0: max_batch_size full contexts"},           \
    {.key = "kv_cache_memory", .type = TY_CONFIG_SIZE, TY_CONFIG_AT(T, kv_cache_memory),          \
     .def = "0", .help = "KV page memory (e.g. 8G) when kv_pages is 0: pages = this / page "      \
                         "size, so f16 pages give twice the tokens; 0: kv_pages decides"},        \
    {.key = "kv_cache_dtype", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(T, kv_cache_dtype),            \
     .def = "auto", .enum_names = ty_cluster_kv_dtype_names,                                     \
     .help = "KV cache elements: f32, f16 (half the memory and transfer), auto (f16 for a "      \
             "16-bit or quantized model, else f32; same on every node)"},                         \
    {.key = "max_batch_size", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, max_batch_size),            \
     .def = "64", .min = "1", .max = "4096",                                                      \
     .help = "sequences decoded together (decode node, tycho serve)"}

#define E struct ty_cluster_serve_engine
static const struct ty_config_field serve_engine_fields[] = {
    ENGINE_ROWS(E),
    {.key = "step_tokens", .type = TY_CONFIG_UINT, TY_CONFIG_AT(E, step_tokens), .def = "256",
     .min = "1", .max = "1048576",
     .help = "token budget of one engine step (decodes plus prefill chunks)"},
    {.key = "backend", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(E, backend), .def = "cpu",
     .enum_names = ty_cluster_backend_names,
     .help = "where the model runs: cpu, or cuda (an NVIDIA GPU; a build with CUDA)"},
    {.key = "cuda_device", .type = TY_CONFIG_UINT, TY_CONFIG_AT(E, cuda_device), .def = "0",
     .max = "255", .help = "backend cuda: the GPU's ordinal (as in nvidia-smi)"},
    {.key = "cuda_weights", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(E, cuda_weights),
     .def = "auto", .enum_names = ty_cluster_cuda_weights_names,
     .help = "backend cuda: weight type on the GPU (auto: the file's 16-bit type, f16 for "
             "quantized files, f32 for F32 files)"},
};
static const struct ty_config_struct serve_engine =
    TY_CONFIG_STRUCT("engine", E, serve_engine_fields);
#undef E

#define S struct ty_cluster_serve_config
static const struct ty_config_field serve_fields[] = {
    CONDUCTOR_ROWS(S, conductor.),
    {.key = "engine", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(S, engine), .sub = &serve_engine,
     .help = "the in-process engine that serves the requests"},
};
const struct ty_config_struct ty_cluster_serve_config_table =
    TY_CONFIG_STRUCT("serve", S, serve_fields);
#undef S

/* ---- prefill and decode nodes ---------------------------------------------------------------- */

#define K struct ty_cluster_node_pool_config
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

#define N struct ty_cluster_node_config

static const struct ty_config_field node_fields[] = {
    {.key = "name", .type = TY_CONFIG_STRING, TY_CONFIG_AT(N, name), .min = "1", .max = "63",
     .help = "node id, stable across restarts (default: role-host-pid)"},
    {.key = "conductor_address", .type = TY_CONFIG_STRING, TY_CONFIG_AT(N, conductor_address),
     .def = "127.0.0.1:9000", .min = "3", .help = "host:port of the Conductor's RPC endpoint"},
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
    {.key = "heartbeat_interval", .type = TY_CONFIG_DURATION,
     TY_CONFIG_AT(N, heartbeat_interval_ns), .def = "500ms", .min = "10ms", .max = "1m",
     .help = "load report period until the Conductor sets one"},
    ENGINE_ROWS(N),
    {.key = "max_ctx", .type = TY_CONFIG_UINT, TY_CONFIG_AT(N, max_ctx), .def = "0",
     .max = "1048576", .help = "context per sequence; 0: the model's, at most 4096"},
    {.key = "chunk_tokens", .type = TY_CONFIG_UINT, TY_CONFIG_AT(N, chunk_tokens),
     .def = "512", .min = "1", .max = "1048576", .help = "prefill: chunked-prefill chunk"},
    {.key = "prefill_batch", .type = TY_CONFIG_UINT, TY_CONFIG_AT(N, prefill_batch),
     .def = "8", .min = "1", .max = "64",
     .help = "prefill: queued prompts run in one forward call (within chunk_tokens); 1: one "
             "at a time"},
    {.key = "kv_wait_timeout", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(N, kv_wait_timeout_ns),
     .def = "30s", .min = "10ms", .max = "1h",
     .help = "decode: reserved pages are released if their KV has not landed by then"},
    {.key = "port_file", .type = TY_CONFIG_STRING, TY_CONFIG_AT(N, port_file),
     .help = "write 'rpc_port transfer_port' here once listening (scripts, tests)"},
    {.key = "kv_pool", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(N, kv_pool), .sub = &node_pool,
     .help = "the cluster KV pool (tycho-store): prefill nodes read prompt prefixes from it "
             "and write their blocks, decode nodes write a finished answer's blocks"},
};
const struct ty_config_struct ty_cluster_node_config_table =
    TY_CONFIG_STRUCT("node", N, node_fields);
#undef N

int ty_cluster_api_keys(const struct ty_cluster_config *c, const char ***keys,
                        const char ***classes, size_t *n)
{
    size_t total = (size_t)c->n_api_keys + c->n_api_key_classes;
    *keys = *classes = NULL;
    *n = 0;
    if (!total)
        return 0;
    const char **k = calloc(total, sizeof(*k)), **cl = calloc(total, sizeof(*cl));
    if (!k || !cl) {
        free(k);
        free(cl);
        return TY_ENOMEM;
    }
    for (uint32_t i = 0; i < c->n_api_keys; i++)
        k[i] = c->api_keys[i];
    for (uint32_t i = 0; i < c->n_api_key_classes; i++) {
        k[c->n_api_keys + i] = c->api_key_classes[i].key;
        cl[c->n_api_keys + i] = c->api_key_classes[i].slo_class;
    }
    *keys = k;
    *classes = cl;
    *n = total;
    return 0;
}
