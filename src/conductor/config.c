/* tycho-conductor's settings table (tycho/conductor.h); its front-door rows are
 * TY_CONDUCTOR_CONFIG_ROWS, which `tycho serve`'s table shares (src/serve/config.c). Tables are
 * immutable; any thread may read them. Also the one reading of them both daemons share (the API
 * keys). */
#include "tycho/conductor.h"
#include "tycho/errors.h"
#include "tycho/tls.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

static const struct ty_config_field key_class_fields[] = {
    {.key = "key", .type = TY_CONFIG_STRING, TY_CONFIG_AT(struct ty_conductor_key_class, key),
     .min = "1", .flags = TY_CONFIG_REQUIRED | TY_CONFIG_SECRET, .help = "the bearer token"},
    {.key = "class", .type = TY_CONFIG_STRING,
     TY_CONFIG_AT(struct ty_conductor_key_class, slo_class), .min = "1", .max = "64",
     .flags = TY_CONFIG_REQUIRED, .help = "the SLO class (scheduler.models[].slo[].class)"},
};
const struct ty_config_struct ty_conductor_key_class_table =
    TY_CONFIG_STRUCT("api_key_class", struct ty_conductor_key_class, key_class_fields);

#define L struct ty_conductor_limits

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
const struct ty_config_struct ty_conductor_limits_table = TY_CONFIG_STRUCT("limits", L, limit_fields);
#undef L

/* ---- the Conductor (tycho-conductor; the root of `tycho serve`) ------------------------------ */

#define K struct ty_conductor_cost_config
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
    {.key = "refit_max_age", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(K, refit_max_age_ns),
     .def = "10s", .max = "1h",
     .help = "timing samples older than this leave the refit (the newest 8 always stay), so a "
             "model fitted during a burst follows what the nodes measure now; 0: no age limit"},
    {.key = "probe_interval", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(K, probe_interval_ns),
     .def = "5s", .max = "1h",
     .help = "a node that sent no timing sample in this long gets one request (a probe) that "
             "admission would refuse for a predicted SLO miss, at most one per node per "
             "interval, so a stale model sees fresh timings; 0: no probes (none either with "
             "refit: false)"},
};
#undef K
static const struct ty_config_struct cost_struct =
    TY_CONFIG_STRUCT("cost", struct ty_conductor_cost_config, cost_fields);

static const struct ty_config_field conductor_pool_fields[] = {
    {.key = "master", .type = TY_CONFIG_STRING,
     TY_CONFIG_AT(struct ty_conductor_pool_config, master), .min = "3",
     .help = "host:port of the KV pool's master (the prefill nodes' kv_pool.master); unset: "
             "no pool"},
};
static const struct ty_config_struct conductor_pool =
    TY_CONFIG_STRUCT("kv_pool", struct ty_conductor_pool_config, conductor_pool_fields);

static const struct ty_config_field pipeline_fields[] = {
    {.key = "stages", .type = TY_CONFIG_UINT,
     TY_CONFIG_AT(struct ty_conductor_pipeline_config, stages), .def = "0", .max = "16",
     .help = "chunked pipeline parallelism: prefill nodes in a group, each computing a range "
             "of the layers of every chunk of a long prompt (0, 1: off; a prompt is pipelined "
             "only while that many prefill nodes are up)"},
    {.key = "threshold", .type = TY_CONFIG_UINT,
     TY_CONFIG_AT(struct ty_conductor_pipeline_config, threshold), .def = "0",
     .max = "16777216",
     .help = "prompt tokens from which a prompt goes through a group (0: where the cost model "
             "predicts the group's pipelined prefill, fill and hidden-state hand-overs included, "
             "shorter than one node's)"},
};
static const struct ty_config_struct pipeline_struct =
    TY_CONFIG_STRUCT("pipeline", struct ty_conductor_pipeline_config, pipeline_fields);

static const struct ty_config_field conductor_fields[] = {
    TY_CONDUCTOR_CONFIG_ROWS(struct ty_conductor_config, ),
    {.key = "scheduler", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(struct ty_conductor_config,
     scheduler), .sub = &ty_sched_config_table,
     .help = "placement policy, admission and SLOs per model (DESIGN.md §6)"},
    {.key = "cost", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(struct ty_conductor_config, cost),
     .sub = &cost_struct, .help = "the scheduler's cost model"},
    {.key = "expected_output_tokens", .type = TY_CONFIG_UINT,
     TY_CONFIG_AT(struct ty_conductor_config, expected_output_tokens), .def = "256", .min = "1",
     .max = "1048576",
     .help = "output length the scheduler assumes for a request without max_tokens"},
    {.key = "x_should_retry", .type = TY_CONFIG_BOOL,
     TY_CONFIG_AT(struct ty_conductor_config, x_should_retry), .def = "true",
     .help = "an SLO refusal that no retry can cure (the request alone on idle nodes is "
             "predicted to miss the SLO, or needs more KV than a decode node has) answers 429 "
             "with x-should-retry: false and no Retry-After, so OpenAI SDKs do not retry it; "
             "false: every refusal carries Retry-After"},
    {.key = "node_answer_timeout", .type = TY_CONFIG_DURATION,
     TY_CONFIG_AT(struct ty_conductor_config, node_answer_timeout_ns), .def = "10s",
     .min = "100ms", .max = "10m",
     .help = "a decode node that has not taken a request (its pages reserved) in this long, or a "
             "prefill node whose KV is this much later than predicted, has failed it: the "
             "request is placed again on another node (once) and the failure counts against "
             "the node's circuit breaker"},
    {.key = "breaker_failures", .type = TY_CONFIG_UINT,
     TY_CONFIG_AT(struct ty_conductor_config, breaker_failures), .def = "3", .min = "1",
     .max = "1000",
     .help = "requests failed in a row that take a node out of placement (its circuit breaker "
             "opens)"},
    {.key = "breaker_open", .type = TY_CONFIG_DURATION,
     TY_CONFIG_AT(struct ty_conductor_config, breaker_open_ns), .def = "5s", .min = "10ms",
     .max = "1h",
     .help = "how long a node stays out of placement before one request probes it; each "
             "failed probe doubles it, up to 16 times this"},
    {.key = "kv_pool", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(struct ty_conductor_config, kv_pool),
     .sub = &conductor_pool,
     .help = "the cluster KV pool the prefill nodes share: the scheduler follows its blocks"},
    {.key = "pipeline", .type = TY_CONFIG_SECTION,
     TY_CONFIG_AT(struct ty_conductor_config, pipeline), .sub = &pipeline_struct,
     .help = "chunked pipeline parallelism for long prompts (Mooncake §5.1)"},
    TY_AUTH_CONFIG_ROWS(struct ty_conductor_config, cluster.),
};
static int conductor_check(const void *data, char *field, size_t field_cap, char *why,
                           size_t why_cap)
{
    return ty_conductor_config_check(data, field, field_cap, why, why_cap);
}

const struct ty_config_struct ty_conductor_config_table = TY_CONFIG_STRUCT_CHECKED(
    "conductor", struct ty_conductor_config, conductor_fields, conductor_check);

/* An API key entry that does not parse: its field and why. */
static int bad_key(const char *entry, const char *name, uint32_t i, const char *sub, char *field,
                   size_t field_cap, char *why, size_t why_cap)
{
    struct ty_apikey k;
    if (ty_apikey_parse(entry, &k, why, why_cap) == 0)
        return 0;
    snprintf(field, field_cap, "%s[%u]%s", name, i, sub);
    return TY_ECONFIG;
}

int ty_conductor_config_check(const struct ty_conductor_config *c, char *field, size_t field_cap,
                              char *why, size_t why_cap)
{
    if (!c->tls_cert != !c->tls_key) {
        const char *set = c->tls_cert ? "tls_cert" : "tls_key";
        const char *unset = c->tls_cert ? "tls_key" : "tls_cert";
        snprintf(field, field_cap, "%s", unset);
        snprintf(why, why_cap, "%s is set but %s is not: HTTPS needs both (neither: plain HTTP)",
                 set, unset);
        return TY_ECONFIG;
    }
    const char *bad = NULL;
    if (c->tls_cert && ty_tls_check_pair(c->tls_cert, c->tls_key, &bad, why, why_cap)) {
        snprintf(field, field_cap, "%s", bad);
        return TY_ECONFIG;
    }
    for (uint32_t i = 0; i < c->n_api_keys; i++)
        if (bad_key(c->api_keys[i], "api_keys", i, "", field, field_cap, why, why_cap))
            return TY_ECONFIG;
    for (uint32_t i = 0; i < c->n_api_key_classes; i++)
        if (bad_key(c->api_key_classes[i].key, "api_key_classes", i, ".key", field, field_cap,
                    why, why_cap))
            return TY_ECONFIG;
    return 0;
}

int ty_conductor_api_keys(const struct ty_conductor_config *c, const char ***keys,
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
