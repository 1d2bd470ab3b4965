/* Chunked pipeline parallelism on the Conductor (Mooncake §5.1; conductor-impl.h): whether a
 * request's prefill goes through a group of prefill nodes, which nodes, and the layer range
 * each computes. The group is the node the scheduler chose, as the last stage (it samples the
 * first token, its reply is the request's prefill reply), after the next stages - 1 usable
 * prefill nodes in registration order: consecutive nodes, so that the same nodes tend to work
 * together. Loop thread. */
#include "conductor-impl.h"

#include "tycho/log.h"
#include "tycho/sched.h"

#include <string.h>

static bool usable(const struct ty__cnode *n)
{
    return n && n->info.alive && !n->lost && n->rpc && ty__breaker_allows(n) &&
           n->info.role == TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL;
}

static bool same_cost(const struct ty_sched_cost *a, const struct ty_sched_cost *b)
{
    return !memcmp(a->prefill, b->prefill, sizeof(a->prefill)) &&
           a->kv_bytes_per_token == b->kv_bytes_per_token &&
           a->net_bytes_per_us == b->net_bytes_per_us && a->block_tokens == b->block_tokens;
}

uint64_t ty__pipeline_threshold(ty_conductor_t *c, const struct ty__cnode *pnode)
{
    if (c->o.pipeline.stages < 2)
        return 0;
    if (c->o.pipeline.threshold)
        return c->o.pipeline.threshold;
    struct ty_sched_cost cost = ty_sched_opts_get(c->place.s)->cost;
    uint32_t dim = c->o.model ? ty_model_config(c->o.model)->dim : 0;
    struct ty_sched_cpp cpp = {.stages = c->o.pipeline.stages,
                               .chunk_tokens = pnode && pnode->max_batch ? pnode->max_batch : 0,
                               .hidden_bytes_per_token = 4.0 * dim};
    /* a scan over the context (thousands of pipelines timed): once per cost model and chunk,
     * not per request */
    if (c->cpp_threshold.valid && c->cpp_threshold.chunk == cpp.chunk_tokens &&
        same_cost(&c->cpp_threshold.cost, &cost))
        return c->cpp_threshold.value;
    c->cpp_threshold.cost = cost;
    c->cpp_threshold.chunk = cpp.chunk_tokens;
    c->cpp_threshold.value = ty_sched_cpp_threshold(&cost, &cpp, c->o.max_ctx);
    c->cpp_threshold.valid = true;
    return c->cpp_threshold.value;
}

void ty__pipeline_sync(ty_conductor_t *c)
{
    if (c->o.pipeline.stages < 2)
        return; /* (the scheduler's default: off) */
    const struct ty__cnode *pn = ty__conductor_pick(c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL);
    uint32_t dim = c->o.model ? ty_model_config(c->o.model)->dim : 0;
    struct ty_sched_cpp cpp = {.stages = c->o.pipeline.stages,
                               .chunk_tokens = pn && pn->max_batch ? pn->max_batch : 0,
                               .hidden_bytes_per_token = 4.0 * dim};
    uint64_t threshold = ty__pipeline_threshold(c, pn);
    ty_sched_set_cpp(c->place.s, &cpp, threshold ? threshold : UINT64_MAX);
}

uint32_t ty__pipeline_group(ty_conductor_t *c, const struct ty__creq *r,
                            struct ty__cnode **group, Tycho__V1__PipelineStage *st)
{
    uint32_t S = c->o.pipeline.stages;
    uint32_t L = r->dreply && r->dreply->kv_destination
                     ? (uint32_t)r->dreply->kv_destination->n_layers
                     : 0;
    if (S < 2 || S > TY__PIPELINE_MAX || L < S || r->prefill_tries || r->replaced ||
        !usable(r->pnode) || r->n_prompt <= r->pnode->max_batch) /* one chunk: no pipeline */
        return 0;
    uint64_t threshold = ty__pipeline_threshold(c, r->pnode);
    if (!threshold || r->n_prompt < threshold)
        return 0;
    uint32_t n = 0;
    for (size_t k = 1; k < c->n_nodes && n + 1 < S; k++) {
        struct ty__cnode *m = c->nodes[(r->pnode->slot + k) % c->n_nodes];
        if (m != r->pnode && usable(m))
            group[n++] = m;
    }
    if (n + 1 < S) {
        TY_LOG_DEBUG("cluster", "request %llu [%s]: %u prompt tokens, but %u of the %u prefill "
                     "nodes of a group are up: one node", (unsigned long long)r->rid, r->cid,
                     r->n_prompt, n + 1, S);
        return 0;
    }
    group[n++] = r->pnode;
    for (uint32_t s = 0; s < S; s++) {
        tycho__v1__pipeline_stage__init(&st[s]);
        st[s].stage = s;
        st[s].n_stages = S;
        st[s].layer_begin = (uint32_t)((uint64_t)s * L / S);
        st[s].layer_end = (uint32_t)((uint64_t)(s + 1) * L / S);
        st[s].next_address = s + 1 < S ? group[s + 1]->info.address : (char *)"";
    }
    return S;
}
