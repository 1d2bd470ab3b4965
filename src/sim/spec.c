/* Cluster spec tables for `tycho sim` (tycho/sim_config.h), on top of tycho/config.h. The
 * `scheduler:` section is the scheduler's own table (ty_sched_config_table, tycho/sched.h). */
#include "tycho/config.h"
#include "tycho/sched.h"
#include "tycho/errors.h"
#include "tycho/sim_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct spec_cluster {
    uint32_t prefill_nodes, decode_nodes;
    char *profile;
    uint64_t cache_blocks_per_node, decode_kv_tokens;
    uint32_t decode_max_batch;
    uint32_t prefill_batch, prefill_batch_tokens;
    bool prefill_interleave;
    int eviction;
    int mode;
    uint32_t nodes, chunk_tokens;
    uint32_t cpp_stages, cpp_chunk_tokens;
    uint64_t cpp_threshold;
    double cpp_hidden_bytes_per_token;
};

struct spec_cost {
    double *prefill, *decode;
    uint32_t n_prefill, n_decode;
    double kv_bytes_per_token, net_gbytes_per_s;
    uint32_t block_tokens;
};

struct spec_root {
    struct spec_cluster cluster;
    struct ty_sched_config scheduler; /* the scheduler's table (tycho/sched.h) */
    struct spec_cost cost;
    char *model;
    double speed;
    double *class_mix;
    uint32_t n_class_mix;
};

struct ty_sim_spec {
    ty_config_t *cfg;
    struct spec_root v;
    const struct ty_sched_model_config *m;
};

static const char *const evict_names[] = {"lru", "lfu", "length_aware", NULL};
static const char *const mode_names[] = {"disaggregated", "colocated", NULL};

#define K struct spec_cluster
static const struct ty_config_field cluster_fields[] = {
    {.key = "mode", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(K, mode), .def = "disaggregated",
     .enum_names = mode_names,
     .help = "disaggregated: prefill_nodes + decode_nodes; colocated: `nodes` that each "
             "prefill and decode with chunked prefill (the vLLM-style baseline)"},
    {.key = "nodes", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, nodes), .def = "16", .min = "1",
     .max = "256", .help = "colocated nodes (mode: colocated)"},
    {.key = "chunk_tokens", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, chunk_tokens), .def = "512",
     .min = "1", .max = "1048576",
     .help = "colocated: tokens per step, one per decoding sequence and the rest prompt "
             "chunks (vLLM's max_num_batched_tokens)"},
    {.key = "prefill_nodes", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, prefill_nodes), .def = "8",
     .min = "1", .max = "128", .help = "simulated prefill nodes"},
    {.key = "decode_nodes", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, decode_nodes), .def = "8",
     .min = "1", .max = "128", .help = "simulated decode nodes"},
    {.key = "profile", .type = TY_CONFIG_STRING, TY_CONFIG_AT(K, profile),
     .def = "llama3-70b-8xa800", .min = "1", .help = "built-in cost profile"},
    {.key = "cache_blocks_per_node", .type = TY_CONFIG_UINT,
     TY_CONFIG_AT(K, cache_blocks_per_node), .def = "0",
     .help = "KV cache capacity per prefill node in blocks (0: unlimited)"},
    {.key = "eviction", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(K, eviction), .def = "lru",
     .enum_names = evict_names, .help = "cache eviction policy"},
    {.key = "decode_max_batch", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, decode_max_batch),
     .def = "0", .help = "most sequences per decode batch (0: unlimited)"},
    {.key = "decode_kv_tokens", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, decode_kv_tokens),
     .def = "0", .help = "KV memory per decode node in tokens (0: unlimited)"},
    {.key = "prefill_batch", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, prefill_batch), .def = "1",
     .max = "256",
     .help = "prompts a prefill node runs together in one forward call when they queue behind "
             "each other (tycho-prefill's prefill_batch; 1: one at a time)"},
    {.key = "prefill_batch_tokens", .type = TY_CONFIG_UINT,
     TY_CONFIG_AT(K, prefill_batch_tokens), .def = "0",
     .help = "most prompt tokens in one such call (tycho-prefill's chunk_tokens; 0: no limit)"},
    {.key = "prefill_interleave", .type = TY_CONFIG_BOOL, TY_CONFIG_AT(K, prefill_interleave),
     .def = "false",
     .help = "a longer prompt runs in calls of prefill_batch_tokens that queued prompts of at "
             "most half of that join, as tycho-prefill does (needs prefill_batch_tokens)"},
    {.key = "cpp_stages", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, cpp_stages), .def = "0",
     .max = "64",
     .help = "chunked pipeline parallelism: prefill nodes in a group, each a range of layers "
             "(< 2: off; at most prefill_nodes)"},
    {.key = "cpp_chunk_tokens", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, cpp_chunk_tokens),
     .def = "2048", .min = "1", .max = "1048576",
     .help = "tokens per chunk through a pipeline group"},
    {.key = "cpp_threshold", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, cpp_threshold),
     .def = "0", .help = "prompt tokens from which a prompt is pipelined (0: from the cost model)"},
    {.key = "cpp_hidden_bytes_per_token", .type = TY_CONFIG_DOUBLE,
     TY_CONFIG_AT(K, cpp_hidden_bytes_per_token), .def = "32768", .min = "0",
     .help = "hidden-state bytes a token takes from stage to stage (dim x 4; 32768: dim 8192)"},
};
#undef K
static const struct ty_config_struct cluster_struct =
    TY_CONFIG_STRUCT("cluster", struct spec_cluster, cluster_fields);

#define K struct spec_cost
static const struct ty_config_field cost_fields[] = {
    {.key = "prefill", .type = TY_CONFIG_LIST, .elem = TY_CONFIG_DOUBLE,
     TY_CONFIG_LIST_AT(K, prefill, n_prefill), .max = "3",
     .help = "[c0 us, c1 us/token, c2 us/token^2] (empty: the profile's)"},
    {.key = "decode", .type = TY_CONFIG_LIST, .elem = TY_CONFIG_DOUBLE,
     TY_CONFIG_LIST_AT(K, decode, n_decode), .max = "3",
     .help = "[d0 us, d1 us/sequence, d2 us/context token] (empty: the profile's)"},
    {.key = "kv_bytes_per_token", .type = TY_CONFIG_DOUBLE, TY_CONFIG_AT(K, kv_bytes_per_token),
     .def = "0", .min = "0", .help = "KV bytes per token (0: the profile's)"},
    {.key = "net_gbytes_per_s", .type = TY_CONFIG_DOUBLE, TY_CONFIG_AT(K, net_gbytes_per_s),
     .def = "0", .min = "0", .help = "KV transfer bandwidth per node (0: the profile's)"},
    {.key = "block_tokens", .type = TY_CONFIG_UINT, TY_CONFIG_AT(K, block_tokens), .def = "0",
     .max = "65536", .help = "tokens per hash block (0: the profile's 512)"},
};
#undef K
static const struct ty_config_struct cost_struct =
    TY_CONFIG_STRUCT("cost", struct spec_cost, cost_fields);

#define K struct spec_root
static const struct ty_config_field root_fields[] = {
    {.key = "cluster", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(K, cluster),
     .sub = &cluster_struct, .help = "simulated nodes"},
    {.key = "scheduler", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(K, scheduler),
     .sub = &ty_sched_config_table, .help = "scheduler under test, SLOs per model"},
    {.key = "cost", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(K, cost), .sub = &cost_struct,
     .help = "cost model overrides"},
    {.key = "model", .type = TY_CONFIG_STRING, TY_CONFIG_AT(K, model), .def = "",
     .help = "served model (empty: the first of scheduler.models)"},
    {.key = "speed", .type = TY_CONFIG_DOUBLE, TY_CONFIG_AT(K, speed), .def = "1.0",
     .min = "0.001", .max = "1000", .help = "replay speed (2: arrivals twice as fast)"},
    {.key = "class_mix", .type = TY_CONFIG_LIST, .elem = TY_CONFIG_DOUBLE,
     TY_CONFIG_LIST_AT(K, class_mix, n_class_mix), .max = "8",
     .help = "share of requests in each SLO class of the model, in its slo: order (empty: "
             "all in the first)"},
};
#undef K
static const struct ty_config_struct root_struct =
    TY_CONFIG_STRUCT("sim", struct spec_root, root_fields);

static int spec_fail(char *err, size_t len, const char *origin, const char *what)
{
    if (err && len)
        snprintf(err, len, "%s: %s", origin ? origin : "<defaults>", what);
    return TY_ECONFIG;
}

static int apply_cost(const struct spec_root *v, struct ty_sched_cost *c, const char *origin,
                      char *err, size_t len)
{
    if (ty_sched_cost_profile(v->cluster.profile, c) < 0)
        return spec_fail(err, len, origin,
                         "cluster.profile: unknown profile (llama3-70b-8xa800, "
                         "llama3-70b-8xh800)");
    char why[160];
    if (ty_sched_cost_override(c, v->cost.prefill, v->cost.n_prefill, v->cost.decode,
                               v->cost.n_decode, v->cost.net_gbytes_per_s, why, sizeof(why)))
        return spec_fail(err, len, origin, why);
    if (v->cost.kv_bytes_per_token > 0)
        c->kv_bytes_per_token = v->cost.kv_bytes_per_token;
    if (v->cost.block_tokens)
        c->block_tokens = v->cost.block_tokens;
    return 0;
}

static int find_model(ty_sim_spec_t *sp, const char *origin, char *err, size_t len)
{
    const struct spec_root *v = &sp->v;
    sp->m = NULL;
    const struct ty_sched_config *sc = &v->scheduler;
    for (uint32_t i = 0; i < sc->n_models; i++)
        if (!v->model[0] || strcmp(v->model, sc->models[i].name) == 0) {
            sp->m = &sc->models[i];
            break;
        }
    if (!sp->m && (sc->n_models || v->model[0]))
        return spec_fail(err, len, origin, "model: not found in scheduler.models");
    return 0;
}

static int to_opts(ty_sim_spec_t *sp, struct ty_sim_opts *o, const char *origin, char *err,
                   size_t len)
{
    const struct spec_root *v = &sp->v;
    ty_sim_opts_default(o);
    int rc = apply_cost(v, &o->sched.cost, origin, err, len);
    if (rc < 0 || (rc = find_model(sp, origin, err, len)) < 0)
        return rc;
    o->truth = o->sched.cost;
    o->n_prefill = v->cluster.prefill_nodes;
    o->n_decode = v->cluster.decode_nodes;
    o->n_colocated = v->cluster.mode == 1 ? v->cluster.nodes : 0;
    o->chunk_tokens = v->cluster.chunk_tokens;
    o->cache_blocks = v->cluster.cache_blocks_per_node;
    o->evict = (enum ty_sim_evict)v->cluster.eviction;
    o->decode_max_batch = v->cluster.decode_max_batch;
    o->decode_kv_tokens = v->cluster.decode_kv_tokens;
    o->prefill_batch = v->cluster.prefill_batch;
    o->prefill_batch_tokens = v->cluster.prefill_batch_tokens;
    o->prefill_interleave = v->cluster.prefill_interleave;
    if (o->prefill_interleave && o->prefill_batch_tokens < 2)
        return spec_fail(err, len, origin,
                         "cluster.prefill_interleave needs prefill_batch_tokens (>= 2)");
    o->cpp = (struct ty_sched_cpp){.stages = v->cluster.cpp_stages,
                                   .chunk_tokens = v->cluster.cpp_chunk_tokens,
                                   .hidden_bytes_per_token = v->cluster.cpp_hidden_bytes_per_token};
    o->cpp_threshold = v->cluster.cpp_threshold;
    if (o->cpp.stages >= 2 && (o->cpp.stages > o->n_prefill || o->prefill_interleave ||
                               o->n_colocated))
        return spec_fail(err, len, origin,
                         "cluster.cpp_stages: at most prefill_nodes, in disaggregated mode, "
                         "without prefill_interleave");
    o->speed = v->speed;
    o->sched.policy = (enum ty_sched_policy)v->scheduler.policy;
    o->sched.admission = (enum ty_sched_admission)v->scheduler.admission;
    o->sched.balancing_threshold = v->scheduler.kvcache_balancing_threshold;
    o->sched.local_prefix_only = v->scheduler.local_prefix_only;
    o->sched.decode_duration_us = v->scheduler.decode_duration_ns / 1000;
    o->sched.seed = v->scheduler.seed;
    o->sched.n_classes = 1;
    if (sp->m && sp->m->n_slo) {
        o->sched.n_classes = sp->m->n_slo;
        for (uint32_t i = 0; i < sp->m->n_slo; i++) {
            o->sched.slo[i].ttft_us = sp->m->slo[i].ttft_ns / 1000;
            o->sched.slo[i].tbt_us = sp->m->slo[i].tbt_ns / 1000;
        }
    }
    if (v->n_class_mix > o->sched.n_classes) {
        char what[160];
        snprintf(what, sizeof(what), "class_mix: %u shares, but model '%s' has %u SLO classes",
                 v->n_class_mix, sp->m ? sp->m->name : "default", o->sched.n_classes);
        return spec_fail(err, len, origin, what);
    }
    double total = 0;
    for (uint32_t i = 0; i < v->n_class_mix; i++) {
        if (!(v->class_mix[i] >= 0) || v->class_mix[i] > 1e9)
            return spec_fail(err, len, origin, "class_mix: shares must be >= 0");
        o->class_mix[i] = v->class_mix[i];
        total += v->class_mix[i];
    }
    if (v->n_class_mix && !(total > 0))
        return spec_fail(err, len, origin, "class_mix: the shares add up to 0");
    o->n_class_mix = v->n_class_mix;
    return 0;
}

static int copy_cfg_err(const struct ty_config_error *ce, int rc, char *err, size_t len)
{
    if (err && len)
        snprintf(err, len, "%s", ce->msg[0] ? ce->msg : ty_strerror(rc));
    return rc;
}

int ty_sim_spec_load(ty_sim_spec_t **out, const char *path, char *const *args, size_t n_args,
                     struct ty_sim_opts *opts, char *err, size_t err_len)
{
    ty_sim_spec_t *sp = calloc(1, sizeof(*sp));
    if (!sp)
        return TY_ENOMEM;
    struct ty_config_error ce = {0};
    struct ty_config_opts co = {.root = &root_struct, .data = &sp->v};
    int rc = ty_config_new(&sp->cfg, &co, &ce);
    if (rc < 0) {
        copy_cfg_err(&ce, rc, err, err_len);
        free(sp);
        return rc;
    }
    if (path && (rc = ty_config_load_file(sp->cfg, path, &ce)) < 0)
        goto err_cfg;
    for (size_t i = 0; i < n_args; i++)
        if ((rc = ty_config_set_arg(sp->cfg, args[i], &ce)) < 0)
            goto err_cfg;
    if ((rc = ty_config_finish(sp->cfg, &ce)) < 0)
        goto err_cfg;
    rc = to_opts(sp, opts, path, err, err_len);
    if (rc < 0)
        goto err_free;
    *out = sp;
    return 0;
err_cfg:
    copy_cfg_err(&ce, rc, err, err_len);
err_free:
    ty_sim_spec_free(sp);
    return rc;
}

void ty_sim_spec_free(ty_sim_spec_t *spec)
{
    if (!spec)
        return;
    ty_config_free(spec->cfg);
    free(spec);
}

int ty_sim_spec_dump(const ty_sim_spec_t *spec, FILE *out)
{
    return ty_config_dump(spec->cfg, out);
}

const char *ty_sim_spec_model(const ty_sim_spec_t *spec)
{
    return spec->m ? spec->m->name : "default";
}

const char *ty_sim_spec_profile(const ty_sim_spec_t *spec)
{
    return spec->v.cluster.profile;
}

const char *ty_sim_spec_class(const ty_sim_spec_t *spec, uint32_t i)
{
    return spec->m && i < spec->m->n_slo ? spec->m->slo[i].class_name : NULL;
}
