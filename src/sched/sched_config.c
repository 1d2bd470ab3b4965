/* The scheduler's settings table (tycho/sched.h). One row per setting. Tables are immutable;
 * any thread may read them.
 */
#include "tycho/config.h"
#include "tycho/sched.h"

#include <stddef.h>

/* In enum ty_sched_policy / enum ty_sched_admission order. */
const char *const ty_sched_policy_names[] = {"random",      "round_robin",     "load_balance",
                                             "cache_aware", "kvcache_centric", NULL};
const char *const ty_sched_admission_names[] = {"baseline", "early", "predicted", NULL};

#define K struct ty_sched_slo_config
static const struct ty_config_field slo_fields[] = {
    {.key = "class", .type = TY_CONFIG_STRING, TY_CONFIG_AT(K, class_name), .def = "default",
     .min = "1", .max = "64", .help = "priority class name (entry i is class i)"},
    {.key = "ttft", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(K, ttft_ns), .def = "0s",
     .help = "time-to-first-token SLO (0: none)"},
    {.key = "tbt", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(K, tbt_ns), .def = "0s",
     .help = "time-between-tokens SLO (0: none)"},
};
#undef K
static const struct ty_config_struct slo = TY_CONFIG_STRUCT("slo_class", struct ty_sched_slo_config,
                                                            slo_fields);

#define K struct ty_sched_model_config
static const struct ty_config_field model_fields[] = {
    {.key = "name", .type = TY_CONFIG_STRING, TY_CONFIG_AT(K, name), .min = "1",
     .flags = TY_CONFIG_REQUIRED, .help = "model id"},
    {.key = "slo", .type = TY_CONFIG_LIST, .sub = &slo, TY_CONFIG_LIST_AT(K, slo, n_slo),
     .max = "8", .help = "SLOs per priority class; class 0 is the default"},
};
#undef K
static const struct ty_config_struct model =
    TY_CONFIG_STRUCT("model", struct ty_sched_model_config, model_fields);

#define K struct ty_sched_config
static const struct ty_config_field sched_fields[] = {
    {.key = "policy", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(K, policy), .def = "kvcache_centric",
     .enum_names = ty_sched_policy_names, .flags = TY_CONFIG_RELOADABLE,
     .help = "prefill/decode placement policy"},
    {.key = "admission", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(K, admission),
     .def = "predicted", .enum_names = ty_sched_admission_names,
     .flags = TY_CONFIG_RELOADABLE,
     .help = "admission control: per-stage baseline, early or prediction-based rejection"},
    {.key = "kvcache_balancing_threshold", .type = TY_CONFIG_DOUBLE,
     TY_CONFIG_AT(K, kvcache_balancing_threshold), .def = "1.0", .min = "0", .max = "1000",
     .flags = TY_CONFIG_RELOADABLE,
     .help = "fetch a remote prefix R over the local L only when R > L * threshold"},
    {.key = "local_prefix_only", .type = TY_CONFIG_BOOL, TY_CONFIG_AT(K, local_prefix_only),
     .def = "false", .flags = TY_CONFIG_RELOADABLE,
     .help = "kvcache_centric plans with each prefill node's own cache only: no prefix read "
             "from another node or the pool, so hot prefixes do not replicate"},
    {.key = "decode_duration", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(K, decode_duration_ns),
     .def = "10s", .min = "1ms", .max = "1h",
     .help = "first estimate of the uniform decode duration (predicted admission)"},
    {.key = "seed", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, seed), .def = "1",
     .help = "seed of the random policy"},
    {.key = "models", .type = TY_CONFIG_LIST, .sub = &model,
     TY_CONFIG_LIST_AT(K, models, n_models), .max = "64", .flags = TY_CONFIG_RELOADABLE,
     .help = "SLOs per model and priority class"},
};
#undef K
const struct ty_config_struct ty_sched_config_table =
    TY_CONFIG_STRUCT("scheduler", struct ty_sched_config, sched_fields);
