/* Simulated nodes: arrivals through the scheduler, FIFO prefill, continuous-batching decode.
 *
 * Decode uses a "virtual token clock" per node: between two batch changes every sequence
 * gains one token per step, so v (tokens per sequence since t = 0) advances at 1/step_us and a
 * request that joined at v0 with n tokens to produce finishes at v = v0 + n. The step time is
 * recomputed from the batch and its context at every batch change. */
#include "sim-impl.h"
#include "tycho/clock.h"
#include "tycho/log.h"

#include <math.h>
#include <stdlib.h>

double ty__sim_wall_s(void)
{
    return (double)ty_clock_ns() / 1e9;
}

double ty__sim_prefill_queued_us(const struct sim *s, const struct pnode *p, double now)
{
    double q = p->queued_us + (p->busy ? p->cont_left_us : 0);
    if (p->busy && p->cur_end > now)
        q += p->cur_end - now;
    else if (!p->busy && p->held_until > now)
        q += p->held_until - now;
    return q;
}

static void report_queue(struct sim *s, struct pnode *p, double now)
{
    ty_sched_node_set_prefill_queue(s->sched, p->id, (uint64_t)ty__sim_prefill_queued_us(s, p, now),
                                    (uint64_t)now);
}

/* Request i leaves the queue for a forward call: what it reuses of what is really cached now
 * (the local cache, or the planned remote prefix if its source still holds it); sets
 * q->reuse and q->cached_tok, returns the time to fetch the remote part. */
static double prefill_admit(struct sim *s, struct pnode *p, uint32_t i)
{
    struct rq *q = &s->rq[i];
    const struct ty_sim_request *r = ty__sim_req(s, i);
    p->queued_us -= q->d.prefill_us + q->d.transfer_us;
    if (p->queued_us < 0 || p->len == 0)
        p->queued_us = 0;
    uint32_t local = (uint32_t)ty_sim_pool_prefix(p->cache, r->blocks, r->n_blocks);
    uint32_t reuse = local;
    double xfer = 0;
    uint32_t src = q->d.prefix_source;
    if (src != TY_SCHED_NODE_NONE && src < s->o.n_prefill && q->d.used_prefix_blocks > local) {
        uint32_t there = (uint32_t)ty_sim_pool_prefix(s->p[src].cache, r->blocks, r->n_blocks);
        if (there > local) {
            reuse = there < q->d.used_prefix_blocks ? there : q->d.used_prefix_blocks;
            uint64_t bt = s->o.truth.block_tokens;
            uint64_t a = (uint64_t)local * bt, b = (uint64_t)reuse * bt;
            a = a < r->input_tokens ? a : r->input_tokens;
            b = b < r->input_tokens ? b : r->input_tokens;
            xfer = ty_sched_cost_transfer_us(&s->o.truth, b - a);
        }
    }
    uint64_t cached = (uint64_t)reuse * s->o.truth.block_tokens;
    q->reuse = reuse;
    q->cached_tok = (uint32_t)(cached < r->input_tokens ? cached : r->input_tokens - 1);
    return xfer;
}

/* Take the queue's head for a forward call; returns its true cost alone: on this node, or
 * through the pipeline whose stages can start at ready[s] from now (ready non-NULL). */
static double prefill_take(struct sim *s, struct pnode *p, const double *ready)
{
    uint32_t i = p->fifo[p->head];
    p->head = (p->head + 1) % p->cap;
    p->len--;
    struct rq *q = &s->rq[i];
    double xfer = prefill_admit(s, p, i);
    uint64_t n = ty__sim_req(s, i)->input_tokens;
    q->prefill_us = xfer + (ready ? ty_sched_cpp_prefill_us(&s->o.truth, &s->o.cpp, n,
                                                             q->cached_tok, ready)
                                  : ty_sched_cost_prefill_us(&s->o.truth, n, q->cached_tok));
    q->pipelined = ready != NULL;
    p->cur[p->n_cur++] = i;
    return q->prefill_us;
}

/* Whether request i goes through a pipeline group (opts.cpp). */
static bool pipelines(const struct sim *s, uint32_t i)
{
    uint32_t chunk = s->o.cpp.chunk_tokens ? s->o.cpp.chunk_tokens : 2048, n;
    n = ty__sim_req(s, i)->input_tokens;
    return s->o.cpp.stages >= 2 && s->cpp_threshold && n >= s->cpp_threshold && n > chunk;
}

/* Keep p from taking work until p->held_until (a stage of another node's pipeline): an empty
 * call that ends then. */
static void prefill_hold(struct sim *s, struct pnode *p)
{
    p->n_cur = 0;
    p->busy = true;
    p->cur_end = p->held_until;
    ty__sim_push(s, p->cur_end, EV_PREFILL_DONE, p->id, 0);
}

/* Group member k of a pipeline led by p: p itself, then the next nodes by index. */
static struct pnode *cpp_member(struct sim *s, const struct pnode *p, uint32_t k)
{
    return &s->p[(p->id + k) % s->o.n_prefill];
}

/* Run the queue's head through p's pipeline group when it is long enough (opts.cpp): alone in
 * the call, each stage starting when its node is free, the other members held until the
 * prompt is done. Returns false (nothing done) for a prompt one node takes. */
static bool cpp_start(struct sim *s, struct pnode *p, double now)
{
    uint32_t S = s->o.cpp.stages;
    if (!pipelines(s, p->fifo[p->head]))
        return false;
    double ready[TY_SCHED_MAX_NODES];
    for (uint32_t k = 0; k < S; k++) {
        const struct pnode *m = cpp_member(s, p, k);
        double free_at = fmax(m->busy ? m->cur_end : now, m->held_until);
        ready[k] = k && free_at > now ? free_at - now : 0;
    }
    p->n_cur = 0;
    double dur = prefill_take(s, p, ready);
    p->busy = true;
    p->cur_end = now + dur;
    ty__sim_push(s, p->cur_end, EV_PREFILL_DONE, p->id, 0);
    for (uint32_t k = 1; k < S; k++) {
        struct pnode *m = cpp_member(s, p, k);
        m->held_until = fmax(m->held_until, p->cur_end);
        if (!m->busy)
            prefill_hold(s, m);
        report_queue(s, m, now);
    }
    return true;
}

/* The prompts of the call being formed, or of the running one: p->cur, then (interleaving)
 * the long prompt continuing in it. */
static uint32_t members(const struct pnode *p)
{
    return p->n_cur + (p->has_cont ? 1 : 0);
}

static uint32_t member(const struct pnode *p, uint32_t m)
{
    return m < p->n_cur ? p->cur[m] : p->cont;
}

/* Whether waiting request k may join the call being formed: its tokens within `cap`, and not
 * starting with an uncached first block another member computes (tycho-prefill keeps that one
 * for a later call, where it finds the block cached). */
static bool joins_at(const struct sim *s, const struct pnode *p, size_t k, uint64_t tokens,
                     uint64_t cap)
{
    const struct ty_sim_request *r = ty__sim_req(s, p->fifo[(p->head + k) % p->cap]);
    if (tokens + r->input_tokens > cap)
        return false;
    if (!r->n_blocks || ty_sim_pool_prefix(p->cache, r->blocks, 1))
        return true;
    for (uint32_t m = 0; m < members(p); m++) {
        const struct ty_sim_request *o = ty__sim_req(s, member(p, m));
        if (o->n_blocks && o->blocks[0] == r->blocks[0])
            return false;
    }
    return true;
}

/* Whether the queue's head may join the call being formed (prefill_batch, within
 * prefill_batch_tokens). */
static bool prefill_joins(const struct sim *s, const struct pnode *p, uint64_t tokens)
{
    uint64_t cap = s->o.prefill_batch_tokens ? s->o.prefill_batch_tokens : UINT64_MAX;
    return p->len && p->n_cur < s->o.prefill_batch && joins_at(s, p, 0, tokens, cap);
}

/* Start a forward call: the queue's head, and (prefill_batch) the prompts queued behind it
 * that fit; a joiner pays its tokens but not the call's fixed cost. */
static void prefill_start(struct sim *s, struct pnode *p, double now)
{
    if (p->held_until > now) {
        prefill_hold(s, p);
        return;
    }
    if (cpp_start(s, p, now))
        return;
    p->n_cur = 0;
    uint64_t tokens = ty__sim_req(s, p->fifo[p->head])->input_tokens;
    double dur = prefill_take(s, p, NULL);
    while (prefill_joins(s, p, tokens) && !pipelines(s, p->fifo[p->head])) {
        tokens += ty__sim_req(s, p->fifo[p->head])->input_tokens;
        double c = prefill_take(s, p, NULL) - s->o.truth.prefill[0];
        s->rq[p->cur[p->n_cur - 1]].prefill_us = c > 0 ? c : 0;
        dur += c > 0 ? c : 0;
    }
    p->busy = true;
    p->cur_end = now + dur;
    ty__sim_push(s, p->cur_end, EV_PREFILL_DONE, p->id, 0);
}

/* ---- interleaved prefill (opts.prefill_interleave) ---- */

/* Remove and return the k-th waiting request (0: the head). */
static uint32_t fifo_take_at(struct pnode *p, size_t k)
{
    uint32_t i = p->fifo[(p->head + k) % p->cap];
    for (size_t m = k; m + 1 < p->len; m++)
        p->fifo[(p->head + m) % p->cap] = p->fifo[(p->head + m + 1) % p->cap];
    p->len--;
    return i;
}

/* One forward call of an interleaving node: a long prompt's next chunk (or the queue's head)
 * and the waiting prompts that fit beside it (half the call beside a chunk), each computing
 * what the call's tokens leave it, the newcomers first. */
static void prefill_start_interleaved(struct sim *s, struct pnode *p, double now)
{
    uint32_t budget = s->o.prefill_batch_tokens, most = s->o.prefill_batch ? s->o.prefill_batch : 1;
    uint64_t tokens = 0, cap = p->has_cont ? budget / 2 : budget;
    double dur = s->o.truth.prefill[0];
    p->n_cur = 0;
    for (size_t k = 0, seen = 0; k < p->len && seen < 64 && members(p) < most;
         seen++) {
        if ((p->n_cur || p->has_cont) && !joins_at(s, p, k, tokens, cap)) {
            k++;
            continue; /* the head always goes; the others that fit, in their order */
        }
        uint32_t i = fifo_take_at(p, k);
        struct rq *q = &s->rq[i];
        double xfer = prefill_admit(s, p, i); /* (takes its predicted work off the queue) */
        q->prefill_us = xfer;
        q->done = 0;
        dur += xfer;
        tokens += ty__sim_req(s, i)->input_tokens;
        p->cur[p->n_cur++] = i;
    }
    uint64_t left = budget;
    p->cont_left_us = 0;
    for (uint32_t m = 0; m < members(p); m++) {
        uint32_t i = member(p, m);
        struct rq *q = &s->rq[i];
        uint64_t start = (uint64_t)q->cached_tok + q->done;
        uint64_t rest = ty__sim_req(s, i)->input_tokens - start;
        q->piece = (uint32_t)(rest < left ? rest : left);
        left -= q->piece;
        double w = q->piece ? ty__sim_piece_us(s, start, q->piece) : 0;
        q->prefill_us += w + (m == 0 ? s->o.truth.prefill[0] : 0);
        dur += w;
        if (q->piece < rest) /* what is left of it after this call */
            p->cont_left_us += ty__sim_piece_us(s, start + q->piece, rest - q->piece);
    }
    p->busy = true;
    p->cur_end = now + dur;
    ty__sim_push(s, p->cur_end, EV_PREFILL_DONE, p->id, 0);
}

static void fifo_push(struct pnode *p, uint32_t i)
{
    if (p->len == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        uint32_t *f = malloc(cap * sizeof(*f));
        TY_ASSERT(f);
        for (size_t k = 0; k < p->len; k++)
            f[k] = p->fifo[(p->head + k) % p->cap];
        free(p->fifo);
        p->fifo = f;
        p->head = 0;
        p->cap = cap;
    }
    p->fifo[(p->head + p->len) % p->cap] = i;
    p->len++;
}

void ty__sim_arrival(struct sim *s, size_t i, double now)
{
    const struct ty_sim_request *r = ty__sim_req(s, i);
    struct rq *q = &s->rq[i];
    q->arrival = now;
    struct ty_sched_request sr = {.id = i, .block_hashes = r->blocks, .n_blocks = r->n_blocks,
                                  .prompt_tokens = r->input_tokens,
                                  .output_tokens = r->output_tokens, .priority = q->cls};
    if (ty_sched_pick(s->sched, &sr, (uint64_t)now, &q->d) < 0 ||
        q->d.reject != TY_SCHED_REJECT_NONE) {
        q->state = 2;
        q->reject = q->d.reject ? (uint8_t)q->d.reject : TY_SCHED_REJECT_NO_NODE;
        return;
    }
    struct pnode *p = &s->p[q->d.prefill_node];
    fifo_push(p, (uint32_t)i);
    p->queued_us += q->d.prefill_us + q->d.transfer_us;
    if (!p->busy)
        (s->o.prefill_interleave ? prefill_start_interleaved : prefill_start)(s, p, now);
    report_queue(s, p, now);
}

/* The prompts of an interleaved call whose last token it computed are done; a long one
 * that is not stays (the node's next call takes its next chunk). */
static void prefill_done_interleaved(struct sim *s, struct pnode *p)
{
    uint32_t n = 0, nm = members(p), cont = p->cont;
    p->has_cont = false;
    for (uint32_t m = 0; m < nm; m++) {
        uint32_t i = m < p->n_cur ? p->cur[m] : cont;
        struct rq *q = &s->rq[i];
        q->done += q->piece;
        uint64_t at = (uint64_t)q->cached_tok + q->done, len = ty__sim_req(s, i)->input_tokens;
        if (at < len) { /* its full blocks computed so far are in the cache, as on the node */
            const struct ty_sim_request *r = ty__sim_req(s, i);
            uint64_t full = at / s->o.truth.block_tokens;
            ty_sim_pool_access(p->cache, r->blocks, full < r->n_blocks ? full : r->n_blocks);
            p->has_cont = true;
            p->cont = i;
        } else {
            p->cur[n++] = i; /* finished: reported below */
        }
    }
    p->n_cur = n;
}

void ty__sim_prefill_done(struct sim *s, struct pnode *p, double now)
{
    if (s->o.prefill_interleave)
        prefill_done_interleaved(s, p);
    for (uint32_t k = 0; k < p->n_cur; k++) {
        uint32_t i = p->cur[k];
        const struct ty_sim_request *r = ty__sim_req(s, i);
        s->rq[i].ttft = now - s->rq[i].arrival;
        /* the node keeps every block of the prompt, fetched ones included: hot blocks
         * replicate */
        ty_sim_pool_access(p->cache, r->blocks, r->n_blocks);
        double kv = ty_sched_cost_transfer_us(&s->o.truth, r->input_tokens);
        ty__sim_push(s, now + kv, EV_DECODE_ARRIVE, i, 0);
    }
    p->n_cur = 0;
    p->busy = false;
    if (p->len || p->has_cont)
        (s->o.prefill_interleave ? prefill_start_interleaved : prefill_start)(s, p, now);
    report_queue(s, p, now);
}

static void decode_advance(struct dnode *d, double now)
{
    if (d->n_reqs && d->step_us > 0)
        d->v += (now - d->last_t) / d->step_us;
    d->last_t = now;
}

/* After a batch change: new step time, next finish event, report the load. */
static void decode_replan(struct sim *s, struct dnode *d)
{
    double b = (double)d->n_reqs;
    double ctx = d->sum_prompt + b * d->v - d->sum_vjoin;
    d->step_us = ty_sched_cost_step_us(&s->o.truth, d->n_reqs, (uint64_t)(ctx > 0 ? ctx : 0));
    d->version++;
    ty_sched_node_set_decode_load(s->sched, d->id, (uint32_t)d->n_reqs,
                                  (uint64_t)(ctx > 0 ? ctx : 0));
    if (!d->n_reqs)
        return;
    double left = INFINITY;
    for (size_t k = 0; k < d->n_reqs; k++) {
        const struct rq *q = &s->rq[d->reqs[k]];
        double rem = q->vjoin + ty__sim_out_tokens(ty__sim_req(s, d->reqs[k])) - d->v;
        left = fmin(left, rem);
    }
    ty__sim_push(s, d->last_t + fmax(left, 0) * d->step_us, EV_DECODE_TICK,
                 d->id - s->o.n_prefill, d->version);
}

/* How far the admission mode's picture of the decode node (at arrival) was from the node
 * as it is now that the KV lands. */
static void judge(struct sim *s, const struct rq *q, const struct dnode *d)
{
    if (!q->d.judged)
        return;
    double b = (double)d->n_reqs;
    double ctx = d->sum_prompt + b * d->v - d->sum_vjoin;
    double eb = q->d.judged_batch - b, ek = q->d.judged_ctx - ctx;
    s->judged++;
    s->judged_bias_batch += eb;
    s->judged_abs_batch += fabs(eb);
    s->judged_bias_ctx += ek;
    s->judged_abs_ctx += fabs(ek);
    s->landed_batch += b;
}

void ty__sim_decode_arrive(struct sim *s, uint32_t i, double now)
{
    struct rq *q = &s->rq[i];
    struct dnode *d = &s->d[q->d.decode_node - s->o.n_prefill];
    decode_advance(d, now);
    judge(s, q, d);
    enum ty_sched_reject rej = TY_SCHED_REJECT_NONE;
    ty_sched_request_at_decode(s->sched, i, (uint64_t)now, &rej);
    if (rej != TY_SCHED_REJECT_NONE) {
        q->state = 2;
        q->reject = (uint8_t)rej;
        q->at_decode = 1;
        return;
    }
    if (d->n_reqs == d->cap_reqs) {
        d->cap_reqs = d->cap_reqs ? d->cap_reqs * 2 : 16;
        d->reqs = realloc(d->reqs, d->cap_reqs * sizeof(*d->reqs));
        TY_ASSERT(d->reqs);
    }
    d->reqs[d->n_reqs++] = i;
    q->join = now;
    q->vjoin = d->v;
    d->sum_prompt += ty__sim_req(s, i)->input_tokens;
    d->sum_vjoin += d->v;
    decode_replan(s, d);
}

void ty__sim_decode_tick(struct sim *s, struct dnode *d, double now)
{
    decode_advance(d, now);
    for (size_t k = 0; k < d->n_reqs;) {
        uint32_t i = d->reqs[k];
        struct rq *q = &s->rq[i];
        double n = ty__sim_out_tokens(ty__sim_req(s, i));
        if (q->vjoin + n - d->v > 1e-6) {
            k++;
            continue;
        }
        q->state = 1;
        q->tbt = (now - q->join) / n;
        d->sum_prompt -= ty__sim_req(s, i)->input_tokens;
        d->sum_vjoin -= q->vjoin;
        d->reqs[k] = d->reqs[--d->n_reqs];
        ty_sched_request_done(s->sched, i, (uint64_t)now);
    }
    decode_replan(s, d);
}
