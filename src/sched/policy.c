/* Placement policies and admission: ty_sched_pick() (tycho/sched.h).
 *
 * Every policy ends with a predicted TTFT for the node it chose, so admission treats all of
 * them alike; only kvcache_centric also weighs fetching a longer prefix from another node
 * (FAST'25 Algorithm 1). */
#include "sched-impl.h"
#include "tycho/errors.h"
#include "tycho/sched.h"

#include <math.h>
#include <string.h>

/* One prefill candidate: predicted pieces of TTFT. */
struct cand {
    uint32_t node;
    uint32_t local, used; /* prefix blocks: cached there, reused by the plan */
    bool remote;
    bool joins; /* rides in the queue's last forward call, which has not started */
    bool lane;  /* rides beside the long work queued (an interleaving node's side lane) */
    double queue, transfer, prefill, ttft;
};

static uint64_t blocks_to_tokens(const ty_sched_t *s, const struct ty_sched_request *r,
                                 uint32_t blocks)
{
    uint64_t t = (uint64_t)blocks * s->o.cost.block_tokens;
    return t < r->prompt_tokens ? t : r->prompt_tokens;
}

static double queue_us(const ty_sched_t *s, uint32_t id, uint64_t now)
{
    double q = s->nodes[id].busy_until_us - (double)now;
    return q > 0 ? q : 0;
}

/* One full forward call of an interleaving node (batch_tokens prompt tokens). */
static double call_us(const ty_sched_t *s, const struct node *n)
{
    return ty_sched_cost_prefill_us(&s->o.cost, n->batch_tokens, 0);
}

/* A short prompt on an interleaving node with more than a call of work queued: it rides in
 * the side lane (the half of each call the node gives to prompts that join a long one): it
 * starts after the call running now, or after the lane's last call when that one is full,
 * and gets its first token at the end of the call that computes it. */
static void lane_plan(const ty_sched_t *s, const struct ty_sched_request *r,
                      const struct node *n, struct cand *c, uint64_t now)
{
    uint64_t own = r->prompt_tokens - blocks_to_tokens(s, r, c->used);
    double call = call_us(s, n);
    double start = (double)now + call; /* after the call running now */
    if (2 * own > n->batch_tokens || c->queue <= 2 * call || n->long_from_us > start ||
        n->long_until_us <= start)
        return; /* no long prompt to ride beside then: it waits its turn as before */
    if (n->lane_until_us > (double)now) { /* the lane's last call: in it while it has not */
        double last = n->lane_until_us - call; /* started and has room, else the next one */
        start = last >= (double)now && n->lane_tokens + own <= n->batch_tokens / 2 &&
                        n->lane_n + 1 < n->batch_prompts
                    ? last
                    : n->lane_until_us;
    }
    /* prefill: what it adds to the node's work (its tokens, no call of its own); its first
     * token comes when the lane call ends */
    double work = c->prefill - s->o.cost.prefill[0];
    c->lane = true;
    c->prefill = work > 0 ? work : 0;
    c->queue = start + call - c->prefill - (double)now;
}

/* Whether r goes through a pipeline group (opts.cpp), and then its prefill time alone. */
static bool pipelined(const ty_sched_t *s, const struct ty_sched_request *r, double *us)
{
    const struct ty_sched_cpp *p = &s->o.cpp;
    uint32_t chunk = p->chunk_tokens ? p->chunk_tokens : 2048;
    if (p->stages < 2 || s->n_prefill < p->stages || r->prompt_tokens <= chunk)
        return false;
    *us = ty_sched_cpp_prefill_us(&s->o.cost, p, r->prompt_tokens, 0, NULL);
    if (s->o.cpp_threshold)
        return r->prompt_tokens >= s->o.cpp_threshold;
    return *us < ty_sched_cost_prefill_us(&s->o.cost, r->prompt_tokens, 0);
}

/* Plan for node p: local prefix only, or (remote_ok) the best remote prefix when it beats
 * the local one by the balancing threshold; a pipelined prompt reuses nothing and takes the
 * pipeline's time. */
static struct cand plan(const ty_sched_t *s, const struct ty_sched_request *r, uint32_t p,
                        uint32_t best_remote, bool remote_ok, uint64_t now)
{
    struct cand c = {.node = p, .local = s->prefix[p], .used = s->prefix[p]};
    c.queue = queue_us(s, p, now);
    if (pipelined(s, r, &c.prefill)) {
        c.used = 0;
        c.ttft = c.queue + c.prefill + s->o.ttft_overhead_us;
        return c;
    }
    if (remote_ok && best_remote > c.local &&
        (double)best_remote > (double)c.local * s->o.balancing_threshold) {
        c.remote = true;
        c.used = best_remote;
        c.transfer = ty_sched_cost_transfer_us(
            &s->o.cost, blocks_to_tokens(s, r, best_remote) - blocks_to_tokens(s, r, c.local));
    }
    c.prefill = ty_sched_cost_prefill_us(&s->o.cost, r->prompt_tokens,
                                         blocks_to_tokens(s, r, c.used));
    /* A node that batches runs the prompts queued behind each other in one forward call:
     * one that fits in the queue's last call, not started yet, adds only its own work to it
     * and gets its first token when that call ends (which is the end of the queue). The
     * node fills a call up to batch_tokens prompt tokens, cached ones included (it learns
     * what is cached only once the prompt runs). */
    const struct node *n = &s->nodes[p];
    if (n->interleaves)
        lane_plan(s, r, n, &c, now);
    if (!c.lane && n->batch_prompts > 1 && n->tail_n && n->tail_n < n->batch_prompts &&
        c.queue > n->tail_us &&
        (!n->batch_tokens || n->tail_tokens + r->prompt_tokens <= n->batch_tokens)) {
        c.joins = true;
        c.prefill -= s->o.cost.prefill[0];
        if (c.prefill < 0)
            c.prefill = 0;
    }
    c.ttft = c.queue + c.transfer + c.prefill + s->o.ttft_overhead_us;
    return c;
}

static bool better(const struct cand *a, const struct cand *b, enum ty_sched_policy p)
{
    switch (p) {
    case TY_SCHED_POLICY_LOAD_BALANCE:
        return a->queue < b->queue;
    case TY_SCHED_POLICY_CACHE_AWARE:
        return a->local > b->local || (a->local == b->local && a->queue < b->queue);
    default:
        return a->ttft < b->ttft || (a->ttft == b->ttft && a->queue < b->queue);
    }
}

static struct cand choose_prefill(ty_sched_t *s, const struct ty_sched_request *r,
                                  uint32_t best_remote, uint64_t now)
{
    enum ty_sched_policy pol = s->o.policy;
    if (pol == TY_SCHED_POLICY_RANDOM) {
        uint32_t i = (uint32_t)(ty__sched_rand_next(&s->rng) % s->n_prefill);
        return plan(s, r, s->prefill_ids[i], 0, false, now);
    }
    if (pol == TY_SCHED_POLICY_ROUND_ROBIN) {
        uint32_t i = s->rr_prefill++ % s->n_prefill;
        return plan(s, r, s->prefill_ids[i], 0, false, now);
    }
    bool remote_ok = pol == TY_SCHED_POLICY_KVCACHE_CENTRIC && !s->o.local_prefix_only;
    struct cand best = plan(s, r, s->prefill_ids[0], best_remote, remote_ok, now);
    for (uint32_t i = 1; i < s->n_prefill; i++) {
        struct cand c = plan(s, r, s->prefill_ids[i], best_remote, remote_ok, now);
        if (better(&c, &best, pol))
            best = c;
    }
    return best;
}

/* TBT of decode node d once this request (ctx tokens) joins it, counting reservations. */
static double decode_tbt(const ty_sched_t *s, uint32_t d, uint64_t ctx)
{
    const struct node *n = &s->nodes[d];
    return ty_sched_cost_step_us(&s->o.cost, n->batch + n->pending + 1,
                                 n->ctx + n->pending_ctx + ctx);
}

static bool decode_full(const ty_sched_t *s, uint32_t d, uint64_t ctx)
{
    const struct node *n = &s->nodes[d];
    if (n->max_batch && n->batch + n->pending + 1 > n->max_batch)
        return true;
    return n->kv_cap && n->ctx + n->pending_ctx + ctx > n->kv_cap;
}

/* Decode node: random / round robin for those policies, else the lowest predicted TBT among
 * nodes with room (or among all when none has room). */
static uint32_t choose_decode(ty_sched_t *s, uint64_t ctx)
{
    if (s->o.policy == TY_SCHED_POLICY_RANDOM)
        return s->decode_ids[ty__sched_rand_next(&s->rng) % s->n_decode];
    if (s->o.policy == TY_SCHED_POLICY_ROUND_ROBIN)
        return s->decode_ids[s->rr_decode++ % s->n_decode];
    uint32_t best = TY_SCHED_NODE_NONE;
    double best_tbt = INFINITY;
    for (int pass = 0; pass < 2 && best == TY_SCHED_NODE_NONE; pass++) {
        for (uint32_t i = 0; i < s->n_decode; i++) {
            uint32_t d = s->decode_ids[i];
            if (pass == 0 && decode_full(s, d, ctx))
                continue;
            double t = decode_tbt(s, d, ctx);
            if (t < best_tbt) {
                best_tbt = t;
                best = d;
            }
        }
    }
    return best;
}

/* Prediction-based early rejection (arXiv 2407.00079 §7.3): the decode pool's load at
 * t_arrive, the moment this request would reach decode, predicted at system level with every
 * request decoding for the same duration D. A request accepted earlier is counted when
 * [start, start + D) covers t_arrive, start being its predicted decode start while it is in
 * prefill and its real one once it decodes (finished requests are gone from the table; one
 * still decoding past D is not counted, as the uniform model has it gone); its KV grows from
 * the prompt to prompt + output over that interval. The load is spread evenly over the
 * decode nodes. Out: per-node batch and KV tokens. */
static void predicted_load(const ty_sched_t *s, double t_arrive, double *batch, double *ctx)
{
    uint64_t count = 0;
    double ctx_sum = 0;
    for (size_t i = 0; i < s->n_fl; i++) {
        const struct flight *f = &s->fl[i];
        if (f->start_us <= t_arrive && t_arrive < f->end_us) {
            /* its KV then: the prompt and the share of its output made so far, the output
             * spread evenly over [start, start + D) (what the decode stage's check will see
             * of it, not its peak) */
            double done = (t_arrive - f->start_us) / (f->end_us - f->start_us);
            count++;
            ctx_sum += (double)(f->ctx - f->output) + done * (double)f->output;
        }
    }
    *batch = (double)count / s->n_decode;
    *ctx = ctx_sum / s->n_decode;
}

/* Admission on the decode side at arrival; returns the reason to refuse, if any. Every mode
 * applies the same rule (ty__sched_decode_check) to a different picture of the decode node:
 * early to its load as reported now (what is still in prefill is not seen), predicted to the
 * load predicted for when the request gets there; baseline checks nothing here. */
static enum ty_sched_reject admit_decode(ty_sched_t *s, const struct ty_sched_request *r,
                                         uint32_t d, double ttft, uint64_t now, uint64_t ctx,
                                         double *tbt, struct ty_sched_decision *dec)
{
    const struct node *n = &s->nodes[d];
    double batch, kv;
    switch (s->o.admission) {
    case TY_SCHED_ADMIT_EARLY:
        batch = (double)n->batch;
        kv = (double)n->ctx;
        break;
    case TY_SCHED_ADMIT_PREDICTED:
        predicted_load(s, (double)now + ttft, &batch, &kv);
        break;
    default:
        *tbt = decode_tbt(s, d, ctx);
        return TY_SCHED_REJECT_NONE;
    }
    dec->judged = true;
    dec->judged_batch = batch;
    dec->judged_ctx = kv;
    return ty__sched_decode_check(s, n, batch + 1, kv + (double)ctx, r->priority, tbt);
}

/* Nothing is reported running on decode node n, nothing reserved there and no request
 * placed is in flight to it: a request placed there now decodes alone. */
static bool decode_empty(const struct node *n)
{
    if (n->batch || n->pending)
        return false;
    for (uint32_t k = 0; k < TY_SCHED_MAX_CLASSES; k++)
        if (n->classes[k])
            return false;
    return true;
}

/* Whether r misses its TTFT SLO even alone: on every prefill node, its queue gone (all that
 * waiting can buy), its transfer + prefill + the fixed overhead stay over the SLO. */
static bool ttft_never_fits(ty_sched_t *s, const struct ty_sched_request *r, uint32_t best_remote,
                            uint64_t now, uint64_t slo)
{
    bool remote_ok = s->o.policy == TY_SCHED_POLICY_KVCACHE_CENTRIC && !s->o.local_prefix_only;
    for (uint32_t i = 0; i < s->n_prefill; i++) {
        struct cand c = plan(s, r, s->prefill_ids[i], best_remote, remote_ok, now);
        double pipe_us, alone = c.transfer + s->o.ttft_overhead_us +
                                (pipelined(s, r, &pipe_us)
                                     ? pipe_us
                                     : ty_sched_cost_prefill_us(&s->o.cost, r->prompt_tokens,
                                                                blocks_to_tokens(s, r, c.used)));
        if (alone <= (double)slo)
            return false;
    }
    return true;
}

/* Whether a refusal on the decode side (reason `why`) would stand with r alone on an empty
 * decode node: one step of it alone over its class's TBT SLO, or more KV than any decode
 * node holds. */
static bool decode_never_fits(const ty_sched_t *s, const struct ty_sched_request *r,
                              enum ty_sched_reject why, uint64_t ctx)
{
    if (why == TY_SCHED_REJECT_TBT) {
        uint64_t slo = s->o.slo[r->priority].tbt_us;
        return slo && ty_sched_cost_step_us(&s->o.cost, 1, ctx) > (double)slo;
    }
    for (uint32_t i = 0; i < s->n_decode; i++) {
        const struct node *n = &s->nodes[s->decode_ids[i]];
        if (!n->kv_cap || ctx <= n->kv_cap)
            return false;
    }
    return why == TY_SCHED_REJECT_DECODE_FULL;
}

static void commit(ty_sched_t *s, const struct ty_sched_request *r, const struct cand *c,
                   uint32_t d, uint64_t ctx, uint64_t now)
{
    struct node *p = &s->nodes[c->node];
    if (c->lane) { /* the long work ends later by its tokens; the lane has it */
        double end = (double)now + c->queue + c->prefill;
        uint64_t own = r->prompt_tokens - blocks_to_tokens(s, r, c->used);
        bool next = end > p->lane_until_us;
        p->lane_tokens = next ? own : p->lane_tokens + own;
        p->lane_n = next ? 1 : p->lane_n + 1;
        p->lane_until_us = next ? end : p->lane_until_us;
        p->busy_until_us += c->transfer + c->prefill;
        p->long_until_us += c->transfer + c->prefill; /* the long prompt ends later by it */
        goto placed;
    }
    bool queued = p->busy_until_us > (double)now;
    double start = queued ? p->busy_until_us : (double)now;
    p->busy_until_us = start + c->transfer + c->prefill;
    if (p->interleaves &&
        r->prompt_tokens - blocks_to_tokens(s, r, c->used) > p->batch_tokens) { /* chunked */
        if (start > p->long_until_us)
            p->long_from_us = start;
        p->long_until_us = p->busy_until_us;
    }
    if (c->joins) { /* the queue's last call takes it */
        p->tail_us += c->transfer + c->prefill;
        p->tail_n++;
        p->tail_tokens += r->prompt_tokens;
    } else if (queued) { /* a new last call, behind the work queued */
        p->tail_us = c->transfer + c->prefill;
        p->tail_n = 1;
        p->tail_tokens = r->prompt_tokens;
    } else { /* an idle node starts it at once: nothing can join */
        p->tail_us = 0;
        p->tail_n = 0;
        p->tail_tokens = 0;
    }
placed:
    s->nodes[d].pending++;
    s->nodes[d].pending_ctx += ctx;
    struct flight f = {.id = r->id, .prefill = c->node, .decode = d, .priority = r->priority,
                       .ctx = ctx, .output = r->output_tokens,
                       .decode_epoch = s->nodes[d].epoch};
    f.start_us = (double)now + c->ttft;
    f.end_us = f.start_us + s->decode_dur_us;
    ty__sched_flight_add(s, &f);
}

static int request_check(const ty_sched_t *s, const struct ty_sched_request *r)
{
    if (!r || r->prompt_tokens == 0 || r->priority >= s->o.n_classes ||
        (r->n_blocks && !r->block_hashes))
        return TY_EINVAL;
    if (ty_u64map_get(&s->fl_map, r->id))
        return TY_EEXIST;
    return 0;
}

int ty_sched_pick(ty_sched_t *s, const struct ty_sched_request *r, uint64_t now_us,
                  struct ty_sched_decision *d)
{
    int rc = request_check(s, r);
    if (rc < 0 || !d)
        return rc < 0 ? rc : TY_EINVAL;
    memset(d, 0, sizeof(*d));
    d->prefill_node = d->decode_node = d->prefix_source = TY_SCHED_NODE_NONE;
    if (!s->n_prefill || !s->n_decode) {
        d->reject = TY_SCHED_REJECT_NO_NODE;
        return 0;
    }
    ty_sched_index_match(s->ix, r->block_hashes, r->n_blocks, s->prefix, TY_SCHED_MAX_NODES);
    uint32_t best_remote = 0, source = TY_SCHED_NODE_NONE;
    if (s->o.remote_from_node) {
        best_remote = s->prefix[s->o.remote_node];
        source = s->o.remote_node;
    }
    for (uint32_t i = 0; i < TY_SCHED_MAX_NODES && !s->o.remote_from_node; i++) {
        if (s->prefix[i] > best_remote && !s->nodes[i].out) {
            best_remote = s->prefix[i];
            source = i;
        }
    }
    struct cand c = choose_prefill(s, r, best_remote, now_us);
    d->prefill_node = c.node;
    d->prefix_source = c.remote ? source : TY_SCHED_NODE_NONE;
    d->local_prefix_blocks = c.local;
    d->remote_prefix_blocks = best_remote;
    d->used_prefix_blocks = c.used;
    d->queue_us = c.queue;
    d->transfer_us = c.transfer;
    d->prefill_us = c.prefill;
    d->ttft_us = c.ttft;
    uint64_t ttft_slo = s->o.slo[r->priority].ttft_us;
    bool over_ttft = ttft_slo && c.ttft > (double)ttft_slo;
    bool idle = s->o.admit_when_idle && c.queue <= 0; /* waiting is not what breaks it */
    if (over_ttft && !idle && !r->probe && !r->admitted) {
        d->reject = TY_SCHED_REJECT_TTFT;
        d->never_fits = ttft_never_fits(s, r, best_remote, now_us, ttft_slo);
        return 0;
    }
    uint64_t ctx = (uint64_t)r->prompt_tokens + r->output_tokens;
    d->decode_node = choose_decode(s, ctx);
    enum ty_sched_reject why = admit_decode(s, r, d->decode_node, c.ttft, now_us, ctx,
                                            &d->tbt_us, d);
    const struct node *dn = &s->nodes[d->decode_node];
    bool alone = idle && decode_empty(dn);
    if (why != TY_SCHED_REJECT_NONE && alone) /* what the picture predicted is not there */
        why = ty__sched_decode_check(s, dn, 1, (double)ctx, r->priority, &d->tbt_us);
    /* alone on idle nodes (or a probe), a predicted TBT miss is served best-effort, and its
     * timings correct the model that predicted it; only the hard limits refuse */
    d->over_tbt = why == TY_SCHED_REJECT_TBT;
    d->reject = why;
    if (r->admitted || (d->over_tbt && (alone || r->probe)))
        d->reject = TY_SCHED_REJECT_NONE;
    if (d->reject != TY_SCHED_REJECT_NONE) {
        d->over_tbt = false;
        d->never_fits = decode_never_fits(s, r, d->reject, ctx);
        return 0;
    }
    d->over_ttft = over_ttft;
    commit(s, r, &c, d->decode_node, ctx, now_us);
    return 0;
}
