/* The Conductor's part of GET /status (`tycho status`): the scheduler's settings in force, its
 * cost model, the KV pool it follows and every node the registry holds, as JSON. Loop thread
 * (the API's), like every other reading of the registry. */
#include "conductor-impl.h"

#include "tycho/clock.h"
#include "tycho/sched.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>

static const char *role_name(int role)
{
    switch (role) {
    case TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL: return "prefill";
    case TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE: return "decode";
    default: return "other";
    }
}

/* A counter's value (0 without a metrics registry). */
static double count(const ty_metrics_child_t *c)
{
    return c ? ty_metrics_child_value(c) : 0;
}

static json_t *coefs(const double k[3])
{
    return json_pack("[f,f,f]", k[0], k[1], k[2]);
}

/* Planned vs used prefix blocks per source, over the prefill replies that reported them. */
static json_t *plan_json(const struct ty__place *p)
{
    json_t *o = json_object(), *planned = json_object(), *used = json_object(),
           *ratio = json_object();
    for (int k = 0; k < 3; k++) {
        const char *n = ty__prefix_source_names[k];
        json_object_set_new(planned, n, json_integer((json_int_t)p->plan_blocks[k]));
        json_object_set_new(used, n, json_integer((json_int_t)p->used_blocks[k]));
        json_object_set_new(ratio, n, p->plan_blocks[k] ? json_real((double)p->used_blocks[k] /
                                                                    (double)p->plan_blocks[k])
                                                        : json_null());
    }
    json_object_set_new(o, "requests", json_integer((json_int_t)p->plan_replies));
    json_object_set_new(o, "planned_blocks", planned);
    json_object_set_new(o, "used_blocks", used);
    json_object_set_new(o, "used_ratio", ratio);
    json_object_set_new(o, "fetch_failed_blocks", json_integer((json_int_t)p->plan_failed));
    return o;
}

static json_t *scheduler_json(const ty_conductor_t *c)
{
    const struct ty__place *p = &c->place;
    const struct ty_sched_opts *so = ty_sched_opts_get(p->s);
    json_t *classes = json_array();
    for (uint32_t k = 0; k < so->n_classes; k++) {
        const struct ty__class_metrics *m = &p->cm[k];
        double refused = 0;
        for (int r = 1; r <= TY_SCHED_REJECT_NO_NODE; r++)
            refused += count(m->decisions[r]);
        json_array_append_new(
            classes,
            json_pack("{s:s,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "name", p->class_names[k],
                      "ttft_s", so->slo[k].ttft_us / 1e6, "tbt_s", so->slo[k].tbt_us / 1e6,
                      "accepted", count(m->decisions[0]), "refused", refused, "ttft_met",
                      count(m->slo[0][0]), "ttft_missed", count(m->slo[0][1]), "tbt_met",
                      count(m->slo[1][0]), "tbt_missed", count(m->slo[1][1])));
    }
    json_t *cost = json_pack(
        "{s:o,s:o,s:f,s:f,s:b,s:I,s:I}", "prefill_us", coefs(so->cost.prefill), "decode_us",
        coefs(so->cost.decode), "kv_bytes_per_token", so->cost.kv_bytes_per_token,
        "net_gbytes_per_s", so->cost.net_bytes_per_us / 1e3, "refit", p->refit,
        "prefill_samples", (json_int_t)p->prefill.len, "decode_samples",
        (json_int_t)p->decode.len);
    json_object_set_new(cost, "ttft_overhead_us", json_real(so->ttft_overhead_us));
    json_object_set_new(cost, "refit_max_age_s", json_real(p->max_age_us / 1e6));
    json_object_set_new(cost, "probe_interval_s", json_real(p->probe_us / 1e6));
    json_object_set_new(cost, "probes", json_integer((json_int_t)p->n_probes));
    /* how far off the model was for the requests it admitted: predicted / measured */
    json_t *pred = json_object();
    for (int k = 0; k < 2; k++) {
        double m = ty__place_ratio_median(p, k);
        json_object_set_new(pred, k ? "tbt" : "ttft",
                            json_pack("{s:I,s:o}", "requests", (json_int_t)p->ratio[k].count,
                                      "median_ratio", isnan(m) ? json_null() : json_real(m)));
    }
    json_object_set_new(cost, "prediction", pred);
    json_t *sch = json_pack("{s:s,s:s,s:f,s:o,s:o,s:f,s:I,s:I}", "policy",
                     ty_sched_policy_name(so->policy), "admission",
                     ty_sched_admission_name(so->admission), "balancing_threshold",
                     so->balancing_threshold, "classes", classes, "cost", cost,
                     "decode_duration_s", ty_sched_decode_duration_us(p->s) / 1e6, "in_flight",
                     (json_int_t)ty_sched_in_flight(p->s), "index_blocks",
                     (json_int_t)ty_sched_index_size(ty_sched_index(p->s)));
    json_object_set_new(sch, "local_prefix_only", json_boolean(so->local_prefix_only));
    json_object_set_new(sch, "prefix_plan", plan_json(p));
    return sch;
}

static json_t *node_json(const struct ty__cnode *n, uint64_t now_ms)
{
    const struct ty_conductor_node_info *i = &n->info;
    bool prefill = i->role == TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL;
    json_t *o = json_pack(
        "{s:s,s:s,s:s,s:b,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:I,s:I,s:s}", "id", i->id, "role",
        role_name(i->role), "address", i->address, "alive", i->alive, "in_flight",
        (json_int_t)i->inflight, "served", (json_int_t)i->served, "queued_tokens",
        (json_int_t)i->load.queued_tokens, "running", (json_int_t)i->load.running, "queued",
        (json_int_t)i->load.queued, "free_pages", (json_int_t)i->load.free_pages, "kv_usage",
        (double)i->load.kv_usage, "kv_pages", (json_int_t)n->kv_pages, "block_tokens",
        (json_int_t)n->block_tokens, "kv_dtype", n->kv_dtype);
    if (o && n->max_ctx)
        json_object_set_new(o, "max_ctx", json_integer(n->max_ctx));
    if (!o)
        return NULL;
    json_object_set_new(o, "backend", json_string(n->backend));
    json_object_set_new(o, "kv_device", json_string(n->kv_device));
    json_object_set_new(o, "transports", json_string(n->transports));
    json_object_set_new(o, "breaker", json_string(ty_conductor_breaker_name(i->breaker)));
    json_object_set_new(o, "failed_in_a_row", json_integer(i->failures));
    if (n->rpc) { /* calls the Conductor made to it since it registered (the request path) */
        struct ty_rpc_client_stats st;
        ty_rpc_client_stats(n->rpc, &st);
        json_object_set_new(o, "rpc_calls", json_integer((json_int_t)st.calls_started));
    }
    json_object_set_new(o, "heartbeat_age_s",
                        n->last_hb_ms && now_ms >= n->last_hb_ms
                            ? json_real((double)(now_ms - n->last_hb_ms) / 1e3)
                            : json_null());
    if (prefill) {
        json_object_set_new(o, "batch_prompts", json_integer(n->max_batch_prompts));
        json_object_set_new(o, "batch_tokens", json_integer(n->max_batch));
        json_object_set_new(o, "predicted_queue_s", json_real(n->queued_prefill_us / 1e6));
        json_object_set_new(o, "index_blocks", json_integer((json_int_t)n->index_est));
        json_object_set_new(o, "pool_read_blocks",
                            json_integer((json_int_t)i->load.pool_read_blocks));
        json_object_set_new(o, "pool_written_blocks",
                            json_integer((json_int_t)i->load.pool_written_blocks));
    } else {
        json_object_set_new(o, "max_batch", json_integer(n->max_batch));
        json_object_set_new(o, "preemptions",
                            json_integer((json_int_t)i->load.preemptions));
    }
    return o;
}

char *ty__conductor_status_json(void *ctx)
{
    ty_conductor_t *c = ctx;
    json_t *nodes = json_array();
    uint64_t now = ty_clock_ms();
    for (size_t i = 0; nodes && i < c->n_nodes; i++) {
        json_t *n = node_json(c->nodes[i], now);
        if (n)
            json_array_append_new(nodes, n);
    }
    const char *master = ty__pool_master(c);
    json_t *pool = master ? json_pack("{s:s,s:b}", "master", master, "following",
                                      ty__pool_following(c))
                          : json_null();
    json_t *o = json_pack("{s:s,s:o,s:o,s:o}", "role", "conductor", "scheduler",
                          scheduler_json(c), "nodes", nodes, "kv_pool", pool);
    if (o) /* chunked pipeline parallelism: the group size, the threshold now, the requests */
        json_object_set_new(o, "pipeline",
                            json_pack("{s:I,s:I,s:I}", "stages",
                                      (json_int_t)c->o.pipeline.stages, "threshold",
                                      (json_int_t)ty__pipeline_threshold(
                                          c, ty__conductor_pick(
                                                 c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL)),
                                      "requests", (json_int_t)c->pipelined));
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}
