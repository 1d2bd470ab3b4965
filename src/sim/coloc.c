/* The colocated baseline (ty_sim_opts.n_colocated): nodes that prefill and decode in the same
 * steps, as vLLM does with chunked prefill. Each step: every decoding sequence gains a token,
 * and what is left of chunk_tokens goes to prompt chunks, oldest prompt first. A prompt's last
 * chunk ends its TTFT; it decodes from the next step on.
 *
 * Decode uses the same virtual token clock as the disaggregated decode nodes (nodes.c): v
 * counts steps, a sequence that joined at v0 with n tokens to produce is done at v0 + n, and
 * the batch's context is sum_prompt + B * v - sum_vjoin. */
#include "sim-impl.h"
#include "tycho/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t chunk_tokens(const struct sim *s)
{
    return s->o.chunk_tokens ? s->o.chunk_tokens : 512;
}

void ty__sim_coloc_setup(struct sim *s)
{
    s->c = calloc(s->o.n_colocated, sizeof(*s->c));
    TY_ASSERT(s->c);
    for (uint32_t i = 0; i < s->o.n_colocated; i++) {
        struct ty_sim_pool_opts po = {.capacity_blocks = s->o.cache_blocks, .policy = s->o.evict};
        TY_ASSERT(ty_sim_pool_new(&s->c[i].cache, &po) == 0);
        s->c[i].id = i;
        s->c[i].next_finish_v = INFINITY;
    }
}

void ty__sim_coloc_teardown(struct sim *s)
{
    for (uint32_t i = 0; s->c && i < s->o.n_colocated; i++) {
        ty_sim_pool_free(s->c[i].cache);
        free(s->c[i].queue);
        free(s->c[i].run);
    }
    free(s->c);
}

static void push(uint32_t **v, size_t *n, size_t *cap, uint32_t x)
{
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        *v = realloc(*v, *cap * sizeof(**v));
        TY_ASSERT(*v);
    }
    (*v)[(*n)++] = x;
}

/* Cached prefix of request i on node c, in tokens (the last prompt token is always computed). */
static uint32_t cached_tokens(const struct sim *s, const struct cnode *c, size_t i,
                              uint32_t *blocks)
{
    const struct ty_sim_request *r = ty__sim_req(s, i);
    size_t b = ty_sim_pool_prefix(c->cache, r->blocks, r->n_blocks);
    uint64_t t = (uint64_t)b * s->o.truth.block_tokens;
    if (blocks)
        *blocks = (uint32_t)b;
    return (uint32_t)(t < r->input_tokens ? t : (r->input_tokens ? r->input_tokens - 1 : 0));
}

/* The queue's request k may take its KV memory: in order, within decode_kv_tokens (prompt
 * and output reserved, so no sequence is ever preempted) and decode_max_batch. */
static bool can_start(const struct sim *s, const struct cnode *c, size_t k)
{
    const struct ty_sim_request *r = ty__sim_req(s, c->queue[k]);
    uint64_t need = (uint64_t)r->input_tokens + r->output_tokens;
    if (s->o.decode_kv_tokens && c->kv_reserved + need > s->o.decode_kv_tokens &&
        c->kv_reserved > 0)
        return false; /* (a request larger than the whole memory still runs alone) */
    return !s->o.decode_max_batch || c->n_run + k < s->o.decode_max_batch;
}

/* Form and start the node's next step, if it has work. */
static void step_start(struct sim *s, struct cnode *c, double now)
{
    double b = (double)c->n_run;
    uint32_t budget = chunk_tokens(s), used = (uint32_t)c->n_run;
    budget = budget > used ? budget - used : 0;
    double work = 0;
    bool prompt = false;
    for (size_t k = 0; k < c->n_queue && budget; k++) {
        uint32_t i = c->queue[k];
        struct rq *q = &s->rq[i];
        if (k >= c->n_started) {
            if (!can_start(s, c, k))
                break;
            const struct ty_sim_request *r = ty__sim_req(s, i);
            c->n_started++;
            c->kv_reserved += (uint64_t)r->input_tokens + r->output_tokens;
            uint32_t blocks;
            q->cached_tok = cached_tokens(s, c, i, &blocks);
            q->reuse = blocks;
            q->done = 0;
        }
        uint64_t start = (uint64_t)q->cached_tok + q->done;
        uint64_t rest = ty__sim_req(s, i)->input_tokens - start;
        q->piece = (uint32_t)(rest < budget ? rest : budget);
        budget -= q->piece;
        double w = ty__sim_piece_us(s, start, q->piece);
        q->prefill_us += w;
        work += w;
        prompt = true;
    }
    if (!c->n_run && !prompt) {
        c->busy = false;
        return;
    }
    const struct ty_sched_cost *t = &s->o.truth;
    double fixed = c->n_run ? ty_sched_cost_step_us(t, c->n_run,
                                                    (uint64_t)fmax(0, c->sum_prompt + b * c->v -
                                                                          c->sum_vjoin))
                            : t->prefill[0];
    if (c->n_run && prompt && t->prefill[0] > t->decode[0])
        fixed += t->prefill[0] - t->decode[0]; /* one fixed cost per step: the larger */
    c->busy = true;
    ty__sim_push(s, now + fixed + work, EV_COLOC_STEP, c->id, 0);
}

static void finish_decodes(struct sim *s, struct cnode *c, double now)
{
    if (c->v + 1e-9 < c->next_finish_v)
        return;
    c->next_finish_v = INFINITY;
    for (size_t k = 0; k < c->n_run;) {
        uint32_t i = c->run[k];
        struct rq *q = &s->rq[i];
        const struct ty_sim_request *r = ty__sim_req(s, i);
        double end = q->vjoin + ty__sim_out_tokens(r);
        if (end - c->v > 1e-9) {
            c->next_finish_v = fmin(c->next_finish_v, end);
            k++;
            continue;
        }
        q->state = 1;
        q->tbt = (now - q->join) / ty__sim_out_tokens(r);
        c->sum_prompt -= r->input_tokens;
        c->sum_vjoin -= q->vjoin;
        c->kv_reserved -= (uint64_t)r->input_tokens + r->output_tokens;
        c->run[k] = c->run[--c->n_run];
        s->c_in_flight--;
    }
}

void ty__sim_coloc_step_end(struct sim *s, struct cnode *c, double now)
{
    /* the decodes of this step produced their token */
    if (c->n_run) {
        c->v += 1;
        finish_decodes(s, c, now);
    }
    /* the prompt chunks of this step are computed */
    size_t kept = 0, started = c->n_started;
    for (size_t k = 0; k < c->n_queue; k++) {
        uint32_t i = c->queue[k];
        struct rq *q = &s->rq[i];
        const struct ty_sim_request *r = ty__sim_req(s, i);
        if (k >= started || !q->piece) {
            c->queue[kept++] = i;
            continue;
        }
        q->done += q->piece;
        c->queued_us -=
            ty__sim_piece_us(s, (uint64_t)q->cached_tok + q->done - q->piece, q->piece);
        q->piece = 0;
        uint64_t at = (uint64_t)q->cached_tok + q->done;
        if (at < r->input_tokens) { /* its full blocks so far are cached, as on a node */
            uint64_t full = at / s->o.truth.block_tokens;
            ty_sim_pool_access(c->cache, r->blocks, full < r->n_blocks ? full : r->n_blocks);
            c->queue[kept++] = i;
            continue;
        }
        ty_sim_pool_access(c->cache, r->blocks, r->n_blocks);
        q->ttft = now - q->arrival;
        q->join = now;
        q->vjoin = c->v;
        c->sum_prompt += r->input_tokens;
        c->sum_vjoin += c->v;
        c->next_finish_v = fmin(c->next_finish_v, c->v + ty__sim_out_tokens(r));
        push(&c->run, &c->n_run, &c->cap_run, i);
        c->n_started--;
    }
    c->n_queue = kept;
    if (c->queued_us < 0 || !c->n_queue)
        c->queued_us = 0;
    step_start(s, c, now);
}

/* Route request i to the node where its predicted TTFT is lowest: the prompt work queued
 * there plus its own, less the prefix that node caches (ties: the smaller batch). */
void ty__sim_coloc_arrival(struct sim *s, size_t i, double now)
{
    const struct ty_sim_request *r = ty__sim_req(s, i);
    struct rq *q = &s->rq[i];
    q->arrival = now;
    uint32_t best = 0;
    double best_us = INFINITY, own_best = 0;
    for (uint32_t n = 0; n < s->o.n_colocated; n++) {
        const struct cnode *c = &s->c[n];
        uint32_t cached = cached_tokens(s, c, i, NULL);
        double own = ty__sim_piece_us(s, cached, r->input_tokens - cached);
        double us = c->queued_us + own;
        if (us < best_us || (us == best_us && c->n_run < s->c[best].n_run)) {
            best = n;
            best_us = us;
            own_best = own;
        }
    }
    const struct ty_sched_slo *slo = &s->o.sched.slo[q->cls];
    if (slo->ttft_us && best_us + s->o.truth.prefill[0] > (double)slo->ttft_us) {
        q->state = 2;
        q->reject = TY_SCHED_REJECT_TTFT;
        return;
    }
    struct cnode *c = &s->c[best];
    c->queued_us += own_best;
    push(&c->queue, &c->n_queue, &c->cap_queue, (uint32_t)i);
    s->c_in_flight++;
    if (!c->busy)
        step_start(s, c, now);
}
