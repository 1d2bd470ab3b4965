/* The decode node's worker thread (node-impl.h): requests assigned by the Conductor get the
 * pages of their prompt reserved in the engine's batcher (ty_batcher_add_reserved) and the KV
 * destination goes back as the first item of their DecodeAssign stream: the pages' ids, and per
 * layer the K and V base address with one page stride (the pool's layer arrays are arrays of
 * pages, tycho/kvpool.h). The prefill node writes the KV there and its KvReady notification
 * (delivered after the writes) wakes this thread through the transfer engine's notification
 * callback and makes the request run with the others (ty_batcher_kv_landed). The thread sleeps
 * while there is nothing to do: no command, no notification, no batch that can step; a request
 * still awaiting its KV bounds the sleep by its KV deadline. Batching, pages as requests grow,
 * preemption and the token rules are the batcher's (tycho/batcher.h); stop strings are the
 * Conductor's (it has the text). */
#include "node-impl.h"

#include "tycho/xxh3.h"
#include "tycho/batcher.h"
#include "tycho/clock.h"
#include "tycho/proto.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/random.h>

/* What the node keeps of a request beside the batcher's. */
struct dreq {
    struct dreq *next;
    ty_breq_t *r;
    uint64_t rid;
    uint32_t attempt;     /* the prefill attempt whose KvReady it takes (1, then re-arms) */
    uint32_t fence;       /* KvDestination.fence: random, never 0 */
    uint32_t tag;         /* ty_kv_fence(fence, attempt) while the fence takes its writes; 0 */
    uint64_t deadline_ms; /* KV must land by then */
    bool ready;           /* its KV landed */
    char cid[TY_CLIENT_ID_MAX + 1]; /* the client's request id: log lines */
    uint32_t published;   /* tokens whose full blocks are in the KV pool (or the prefill
                           * node's to write: the prompt's) */
    /* a pipeline group's KV (KvReady with a layer range, one per stage): the layers landed
     * (n_layers flags, made by the first such KvReady) and the last stage's first token */
    uint8_t *landed;
    uint32_t n_landed, staged_cached;
    bool has_first;
    struct ty_sample staged_first;
};

struct wstate {
    ty_decode_node_t *n;
    ty_batcher_t *b;
    ty_kvpool_t *pool;
    uint32_t V, n_layers, max_ctx, n_reqs;
    bool idle;          /* the last step ran nothing (all stalled or waiting for KV) */
    struct dreq *reqs;  /* every request held */
};

static void post(struct wstate *w, const struct dreq *d, const ty_breq_t *r,
                 const struct ty_sample *smp, int finish, int rc)
{
    struct devent *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return; /* the Conductor's deadline ends that stream */
    ev->n = w->n;
    ev->kind = DEV_TOKEN;
    ev->rid = d->rid;
    ev->n_cached = ty_breq_n_cached(r);
    ev->rc = rc;
    ev->finish = finish;
    if (smp) {
        ev->has_token = true;
        ev->smp = *smp;
    }
    ty__decode_node_post(w->n, ev);
}

static struct dreq *find(struct wstate *w, uint64_t rid)
{
    for (struct dreq *d = w->reqs; d; d = d->next)
        if (d->rid == rid)
            return d;
    return NULL;
}

/* The blocks the request's generated tokens filled since the last call go to the KV pool, as it
 * streams (the prompt's full blocks are the prefill node's to write), so a conversation's next
 * turn, even one sent while this answer still streams, finds them. Its KV covers every token
 * but the last one sampled. */
static void pool_publish(struct wstate *w, struct dreq *d, ty_breq_t *r)
{
    ty_kvseq_t *seq = ty_breq_seq(r);
    if (!w->n->kvstore || !seq)
        return;
    uint32_t B = ty_kvpool_block_tokens(w->pool), n = ty_kvseq_n_tokens(seq);
    /* a sliding window's released pages are gone (published before, unless the window is
     * under a block) */
    uint32_t gone = ty_kvseq_n_released(seq) * B;
    if (d->published < gone)
        d->published = gone;
    if (n / B * B <= d->published)
        return;
    ty_node_kvstore_store(w->n->kvstore, seq, ty_kvseq_tokens(seq), n, d->published);
    d->published = n / B * B;
}

/* ---- the batcher's hooks ----------------------------------------------------------------- */

static int on_token(void *arg, ty_breq_t *r, const struct ty_sample *smp, enum ty_finish fin)
{
    struct wstate *w = arg;
    if (fin == TY_FINISH_EOS)
        return fin; /* on_end tells the Conductor: no token */
    if (!fin) /* on_end publishes the last blocks */
        pool_publish(w, ty_breq_user(r), r);
    post(w, ty_breq_user(r), r, smp,
         fin ? TYCHO__V1__FINISH_REASON__FINISH_REASON_LENGTH
             : TYCHO__V1__FINISH_REASON__FINISH_REASON_NONE,
         0);
    return fin;
}

/* The reservation's writes are taken (attempt d->attempt's tag, into the prompt's pages) or no
 * longer taken. */
static void fence_arm(struct wstate *w, struct dreq *d, bool live)
{
    if (d->tag)
        ty__decode_fence_set(w->n, d->tag, NULL, 0);
    d->tag = live ? ty_kv_fence(d->fence, d->attempt) : 0;
    if (!d->tag)
        return;
    uint32_t B = ty_kvpool_block_tokens(w->pool), np = (ty_breq_n_prompt(d->r) + B - 1) / B;
    if (ty__decode_fence_set(w->n, d->tag, ty_kvseq_pages(ty_breq_seq(d->r)), np))
        d->tag = 0; /* no memory: its writes are refused and the KV wait times out */
}

static void on_end(void *arg, ty_breq_t *r, enum ty_finish fin, int rc)
{
    struct wstate *w = arg;
    struct dreq *d = ty_breq_user(r);
    fence_arm(w, d, false);
    if (!rc)
        pool_publish(w, d, r);
    if (rc == TY_ECANCELED)
        post(w, d, r, NULL, TYCHO__V1__FINISH_REASON__FINISH_REASON_CANCELLED, rc);
    else if (rc)
        post(w, d, r, NULL, TYCHO__V1__FINISH_REASON__FINISH_REASON_ERROR, rc);
    else if (fin == TY_FINISH_EOS)
        post(w, d, r, NULL, TYCHO__V1__FINISH_REASON__FINISH_REASON_STOP, 0);
    for (struct dreq **pp = &w->reqs; *pp; pp = &(*pp)->next) {
        if (*pp == d) {
            *pp = d->next;
            break;
        }
    }
    w->n_reqs--;
    free(d->landed);
    free(d);
}

static void on_preempt(void *arg, ty_breq_t *r, uint64_t n)
{
    TY_LOG_WARN("decode", "KV cache full: request %llu preempted (%llu so far), recomputed when "
                "pages are free; more KV memory or a lower max_batch_size avoids this",
                (unsigned long long)ty_breq_id(r), (unsigned long long)n);
}

/* Each decode step (one token for every request in it) is a timing sample: n_tokens =
 * batch_size = the requests, prefix_tokens = their context, duration = forward and sampling. */
static void on_forward(void *arg, const struct ty_batcher_call *c)
{
    struct wstate *w = arg;
    if (c->rc || !c->decode_only)
        return;
    struct ty_timing_sample ts = {
        .n_tokens = c->n_seqs, .batch_size = c->n_seqs,
        .prefix_tokens = c->context > UINT32_MAX ? UINT32_MAX : (uint32_t)c->context,
        .duration_us = c->step_us};
    ty_timing_ring_push(w->n->o.timings, &ts);
}

/* Pack the DecodeAssignReply: segment, the prompt's page ids, per-layer K and V bases and the
 * page stride (KvDestination in proto/tycho.proto). */
static int pack_destination(struct wstate *w, const struct dreq *q, uint8_t **out, size_t *len)
{
    uint32_t B = ty_kvpool_block_tokens(w->pool), np = (ty_breq_n_prompt(q->r) + B - 1) / B;
    Tycho__V1__LayerDestination *lds = calloc(w->n_layers, sizeof(*lds));
    Tycho__V1__LayerDestination **ldp = calloc(w->n_layers, sizeof(*ldp));
    int rc = lds && ldp ? 0 : TY_ENOMEM;
    for (uint32_t l = 0; !rc && l < w->n_layers; l++) {
        tycho__v1__layer_destination__init(&lds[l]);
        lds[l].layer = l;
        lds[l].k_base = (uint64_t)(uintptr_t)ty_kvpool_k(w->pool, l, 0);
        lds[l].v_base = (uint64_t)(uintptr_t)ty_kvpool_v(w->pool, l, 0);
        ldp[l] = &lds[l];
    }
    Tycho__V1__KvDestination d = TYCHO__V1__KV_DESTINATION__INIT;
    d.node_id = w->n->node_id;
    d.segment = (char *)ty_xfer_engine_name(w->n->o.xfer);
    d.n_page_ids = np;
    d.page_ids = (uint32_t *)ty_kvseq_pages(ty_breq_seq(q->r));
    d.n_layers = w->n_layers;
    d.layers = ldp;
    d.block_tokens = B;
    d.page_bytes = ty_kvpool_page_bytes(w->pool);
    d.page_stride = ty_kvpool_page_bytes(w->pool); /* tycho/kvpool.h: pages are adjacent */
    d.pool_pages = ty_kvpool_pages_total(w->pool);
    d.fence = q->fence;
    Tycho__V1__DecodeAssignReply r = TYCHO__V1__DECODE_ASSIGN_REPLY__INIT;
    r.request_id = q->rid;
    r.accepted = true;
    r.grammar = true; /* gen.grammar is honoured (ty_batcher_add_reserved) */
    r.kv_destination = &d;
    if (!rc)
        rc = ty_rpc_pack(&r.base, out, len);
    free(lds);
    free(ldp);
    return rc;
}

/* The answer to a re-arm: accepted, no destination (the Conductor kept the first one). */
static int pack_rearmed(uint64_t rid, uint8_t **out, size_t *len)
{
    Tycho__V1__DecodeAssignReply r = TYCHO__V1__DECODE_ASSIGN_REPLY__INIT;
    r.request_id = rid;
    r.accepted = true;
    r.grammar = true;
    return ty_rpc_pack(&r.base, out, len);
}

/* A reservation's fence: random (a late writer of an old request cannot guess the new one's). */
static uint32_t fence_new(uint64_t rid)
{
    uint32_t f = 0;
    if (getrandom(&f, sizeof(f), GRND_NONBLOCK) != (ssize_t)sizeof(f))
        f = (uint32_t)(XXH3_64bits(&rid, sizeof(rid)) ^ ty_clock_ns());
    return f ? f : 1;
}

/* When reserved pages stop waiting for their KV: the node's kv_wait_timeout, or the longer
 * wait the Conductor asked for (a long prompt's prefill outlasts a fixed timeout), at most an
 * hour (the most kv_wait_timeout takes). */
static uint64_t kv_deadline(const struct wstate *w, const struct dcmd *c)
{
    uint64_t ms = w->n->o.kv_wait_timeout_ms, asked = c->kv_wait_ms < 3600000 ? c->kv_wait_ms
                                                                            : 3600000;
    return ty_clock_ms() + (asked > ms ? asked : ms);
}

/* DecodeAssign: the prompt's pages reserved, answered with where its KV goes. */
static void do_assign(struct wstate *w, struct dcmd *c)
{
    struct devent *ev = calloc(1, sizeof(*ev));
    struct dreq *d = calloc(1, sizeof(*d));
    int rc = ev && d ? 0 : TY_ENOMEM;
    if (!rc && w->n_reqs >= w->n->o.max_running * 4)
        rc = TY_EREJECTED;
    struct ty_gen_params gen = {.sampling = c->sp, .ignore_eos = c->ignore_eos,
                                .min_tokens = c->min_tokens};
    gen.max_tokens = c->max_tokens ? c->max_tokens : w->max_ctx;
    gen.n_stop_ids = c->n_stop_ids < TY_GEN_MAX_STOP_IDS ? c->n_stop_ids : TY_GEN_MAX_STOP_IDS;
    memcpy(gen.stop_ids, c->stop_ids, gen.n_stop_ids * sizeof(uint32_t));
    gen.grammar = c->grammar.kind ? &c->grammar : NULL;
    struct ty_breq_opts o = {.id = c->rid, .prompt = c->prompt, .n_prompt = c->n_prompt,
                             .gen = &gen, .user = d};
    if (!rc)
        rc = ty_batcher_add_reserved(w->b, &o, &d->r);
    if (!rc) {
        d->rid = c->rid;
        memcpy(d->cid, c->cid, sizeof(d->cid));
        d->published =
            c->n_prompt / ty_kvpool_block_tokens(w->pool) * ty_kvpool_block_tokens(w->pool);
        d->attempt = 1;
        d->fence = fence_new(c->rid);
        fence_arm(w, d, true);
        d->deadline_ms = kv_deadline(w, c);
        d->next = w->reqs;
        w->reqs = d;
        w->n_reqs++;
        if ((rc = pack_destination(w, d, &ev->reply, &ev->reply_len)))
            ty_batcher_end(w->b, d->r, rc); /* on_end frees d */
        d = NULL;
    }
    free(d);
    if (!ev)
        return; /* the Conductor's assign deadline ends it */
    ev->n = w->n;
    ev->kind = DEV_ASSIGN;
    ev->rid = c->rid;
    ev->rc = rc;
    ty__decode_node_post(w->n, ev);
}

/* The request's prefill node was lost and the Conductor sends its prefill to another one: if
 * its KV has not landed, it now takes only that attempt's KvReady (a late one of the lost node
 * is ignored) and waits for it afresh; the destination stays what it was (the reply does not
 * repeat it). Once the KV landed (the lost node's KvReady came first) the new prefill must not
 * write the pages: EALREADY. */
static void do_rearm(struct wstate *w, struct dcmd *c)
{
    struct devent *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return; /* the Conductor's call times out */
    struct dreq *d = find(w, c->rid);
    int rc = !d ? TY_ENOTFOUND : d->ready ? TY_EALREADY : c->attempt <= d->attempt ? TY_ESTALE : 0;
    if (!rc)
        rc = pack_rearmed(c->rid, &ev->reply, &ev->reply_len);
    if (!rc) {
        d->attempt = c->attempt;
        if (d->landed) /* a group's layers of the lost attempt do not count */
            memset(d->landed, 0, w->n_layers);
        d->n_landed = 0;
        d->has_first = false;
        fence_arm(w, d, true); /* the lost node's tag is refused from here on */
        d->deadline_ms = kv_deadline(w, c);
    }
    ev->n = w->n;
    ev->kind = DEV_REARM;
    ev->rid = c->rid;
    ev->call = c->call;
    ev->rc = rc;
    ty__decode_node_post(w->n, ev);
}

/* Its prefill node is making progress (the Conductor saw its prompt's chunks go through):
 * the request's pages wait for its KV until kv_deadline from now, or longer if they already
 * would. Only for the attempt it waits for; once the KV landed: EALREADY. */
static void do_extend(struct wstate *w, struct dcmd *c)
{
    struct devent *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return; /* the Conductor's call times out */
    struct dreq *d = find(w, c->rid);
    int rc = !d ? TY_ENOTFOUND : d->ready ? TY_EALREADY : c->attempt != d->attempt ? TY_ESTALE : 0;
    if (!rc)
        rc = pack_rearmed(c->rid, &ev->reply, &ev->reply_len);
    if (!rc) {
        uint64_t until = kv_deadline(w, c);
        if (until > d->deadline_ms)
            d->deadline_ms = until;
    }
    ev->n = w->n;
    ev->kind = DEV_REARM;
    ev->rid = c->rid;
    ev->call = c->call;
    ev->rc = rc;
    ty__decode_node_post(w->n, ev);
}

/* The prompt's KV is in d's pages: run it with the others, first token `first`. */
static void kv_landed(struct wstate *w, struct dreq *d, const struct ty_sample *first,
                      uint32_t cached)
{
    d->ready = true;
    fence_arm(w, d, false); /* the pages are the decode's own from here on */
    ty_batcher_kv_landed(w->b, d->r, first, cached);
}

/* A pipeline stage's KvReady (layers [layer_begin, layer_end) of the prompt): noted; the
 * request runs once every layer landed and the last stage's first token came. Returns 0 or
 * TY_EPROTO for a range or token the request cannot have. */
static int stage_ready(struct wstate *w, struct dreq *d, const Tycho__V1__KvReady *k)
{
    if (k->layer_end > w->n_layers || k->n_tokens != ty_breq_n_prompt(d->r) ||
        (k->has_first_token && (k->first_token >= w->V || k->layer_end != w->n_layers)))
        return TY_EPROTO;
    if (!d->landed && !(d->landed = calloc(w->n_layers, 1)))
        return TY_ENOMEM;
    for (uint32_t l = k->layer_begin; l < k->layer_end; l++) {
        d->n_landed += !d->landed[l];
        d->landed[l] = 1;
    }
    if (k->has_first_token) {
        d->staged_first = (struct ty_sample){.id = k->first_token};
        if (k->first_logprob && k->first_logprob->token_id == k->first_token)
            ty_pb_logprob_unpack(k->first_logprob, w->V, &d->staged_first);
        d->staged_cached = k->cached_tokens;
        d->has_first = true;
    }
    ty_node_metrics_kv(w->n->o.metrics, false, k->transport, k->kv_bytes, k->transfer_us);
    if (d->n_landed == w->n_layers && d->has_first)
        kv_landed(w, d, &d->staged_first, d->staged_cached);
    return 0;
}

/* A KvReady arrived: the prompt's KV is in our pages. */
static void on_kv_ready(struct wstate *w, const Tycho__V1__KvReady *k)
{
    struct dreq *d = find(w, k->request_id);
    if (!d || d->ready)
        return; /* cancelled meanwhile, or a duplicate */
    if ((k->attempt ? k->attempt : 1) != d->attempt) {
        TY_LOG_INFO("decode",
                    "request %llu [%s]: KvReady of prefill attempt %u ignored (waiting for "
                    "attempt %u)",
                    (unsigned long long)d->rid, d->cid, k->attempt ? k->attempt : 1, d->attempt);
        return;
    }
    if (!k->all_layers && k->layer_end > k->layer_begin) {
        int rc = stage_ready(w, d, k);
        if (rc) {
            TY_LOG_WARN("decode", "request %llu [%s]: bad KvReady of layers %u..%u: %s",
                        (unsigned long long)d->rid, d->cid, k->layer_begin, k->layer_end,
                        ty_strerror(rc));
            ty_batcher_end(w->b, d->r, rc);
        }
        return;
    }
    if (!k->all_layers || k->n_tokens != ty_breq_n_prompt(d->r) || !k->has_first_token ||
        k->first_token >= w->V) {
        TY_LOG_WARN("decode", "request %llu [%s]: bad KvReady", (unsigned long long)d->rid, d->cid);
        ty_batcher_end(w->b, d->r, TY_EPROTO);
        return;
    }
    /* The prefill node drew the first token from its own sampler with the same seed. */
    struct ty_sample first = {.id = k->first_token};
    if (k->first_logprob && k->first_logprob->token_id == k->first_token)
        ty_pb_logprob_unpack(k->first_logprob, w->V, &first); /* prefill's, of token 1 */
    ty_node_metrics_kv(w->n->o.metrics, false, k->transport, k->kv_bytes, k->transfer_us);
    kv_landed(w, d, &first, k->cached_tokens);
}

static void poll_notifications(struct wstate *w)
{
    struct ty_xfer_notify nt;
    while (ty_xfer_notify_poll(w->n->o.xfer, &nt) == 0) {
        Tycho__V1__KvReady *k = tycho__v1__kv_ready__unpack(NULL, nt.len, nt.msg);
        if (!k) {
            TY_LOG_WARN("decode", "undecodable notification from %s", nt.from);
            continue;
        }
        on_kv_ready(w, k);
        tycho__v1__kv_ready__free_unpacked(k, NULL);
    }
}

/* Release reservations whose KV never came. */
static void expire(struct wstate *w)
{
    uint64_t now = ty_clock_ms();
    for (struct dreq *d = w->reqs, *next; d; d = next) {
        next = d->next;
        if (!d->ready && now > d->deadline_ms) {
            TY_LOG_WARN("decode", "request %llu [%s]: KV did not arrive in time; pages released",
                        (unsigned long long)d->rid, d->cid);
            ty_batcher_end(w->b, d->r, TY_ETIMEDOUT);
        }
    }
}

static void publish_load(struct wstate *w)
{
    ty_decode_node_t *n = w->n;
    struct ty_batcher_stats bs;
    ty_batcher_stats(w->b, &bs);
    uint32_t total = ty_kvpool_pages_total(w->pool), used = ty_kvpool_pages_used(w->pool);
    pthread_mutex_lock(&n->mu);
    n->load.running = bs.running;
    n->load.queued = bs.reserved + bs.waiting;
    n->load.preemptions = bs.preemptions;
    n->load.free_pages = total - used;
    n->load.kv_usage = total ? (float)used / (float)total : 0;
    pthread_mutex_unlock(&n->mu);
}

/* The earliest KV deadline of a request still awaiting its KV; 0: none. */
static uint64_t next_kv_deadline(const struct wstate *w)
{
    uint64_t t = 0;
    for (const struct dreq *d = w->reqs; d; d = d->next)
        if (!d->ready && (!t || d->deadline_ms < t))
            t = d->deadline_ms;
    return t;
}

/* Take the commands; sleep while there is nothing to do: no command, no notification (the
 * transfer engine's callback sets `notified`), no batch that can step. A request
 * awaiting its KV wakes us just after its deadline (expire). `notified` is cleared before the
 * notifications are polled, so one that comes after the poll wakes the next wait. Returns
 * false when the worker must stop. */
static bool take_commands(struct wstate *w, struct dcmd **out)
{
    ty_decode_node_t *n = w->n;
    /* the last step ran something: the next may too (a request that finished in it freed
     * pages a preempted one waits for); once a step runs nothing, only an event changes that */
    bool busy = !w->idle && !ty_batcher_idle(w->b);
    uint64_t until = next_kv_deadline(w);
    pthread_mutex_lock(&n->mu);
    while (!n->stop && !n->cmds && !n->notified && !busy) {
        if (!until) {
            pthread_cond_wait(&n->cv, &n->mu);
            continue;
        }
        uint64_t now = ty_clock_ms();
        if (now > until)
            break;
        uint64_t ns = (until + 1) * TY_NS_PER_MS; /* cv on CLOCK_MONOTONIC, as ty_clock_ms */
        struct timespec ts = {.tv_sec = (time_t)(ns / TY_NS_PER_S),
                              .tv_nsec = (long)(ns % TY_NS_PER_S)};
        pthread_cond_timedwait(&n->cv, &n->mu, &ts);
    }
    n->notified = false;
    *out = n->cmds;
    n->cmds = NULL;
    n->cmds_tail = &n->cmds;
    bool stop = n->stop;
    pthread_mutex_unlock(&n->mu);
    return !stop;
}

static void apply(struct wstate *w, struct dcmd *c)
{
    if (c->kind == DCMD_ASSIGN) {
        do_assign(w, c);
        return;
    }
    if (c->kind == DCMD_REARM) {
        do_rearm(w, c);
        return;
    }
    if (c->kind == DCMD_EXTEND) {
        do_extend(w, c);
        return;
    }
    struct dreq *d = find(w, c->rid);
    if (d)
        ty_batcher_end(w->b, d->r, TY_ECANCELED);
}

static void answer_shutdown(ty_decode_node_t *n, struct dcmd *cmds)
{
    for (struct dcmd *c = cmds, *next; c; c = next) {
        next = c->next;
        struct devent *ev = c->kind != DCMD_CANCEL ? calloc(1, sizeof(*ev)) : NULL;
        if (ev) { /* the loop answers the call with the error */
            *ev = (struct devent){.n = n, .rid = c->rid, .call = c->call, .rc = TY_ESHUTDOWN,
                                  .kind = c->kind == DCMD_ASSIGN ? DEV_ASSIGN : DEV_REARM};
            ty__decode_node_post(n, ev);
        }
        ty__dcmd_free(c);
    }
}

void *ty__decode_node_worker(void *arg)
{
    ty_decode_node_t *n = arg;
    struct wstate w = {.n = n, .pool = ty_engine_pool(n->o.engine),
                       .max_ctx = ty_engine_max_ctx(n->o.engine)};
    const ty_model_t *m = ty_engine_model(n->o.engine);
    w.V = ty_model_config(m)->n_vocab;
    w.n_layers = ty_model_config(m)->n_layers;
    struct ty_batcher_opts bo = {
        .engine = n->o.engine, .max_running = n->o.max_running,
        .trim_window = true, /* the KV pool writes follow each step (pool_publish) */
        .hooks = {.arg = &w, .on_token = on_token, .on_end = on_end, .on_preempt = on_preempt,
                  .on_forward = on_forward}};
    int rc = ty_batcher_new(&w.b, &bo);
    if (rc) {
        TY_LOG_ERROR("decode", "cannot start the batcher: %s", ty_strerror(rc));
        return NULL;
    }
    struct dcmd *cmds;
    publish_load(&w); /* the free pages are known before any request comes */
    while (take_commands(&w, &cmds)) {
        for (struct dcmd *c = cmds, *next; c; c = next) {
            next = c->next;
            apply(&w, c);
            ty__dcmd_free(c);
        }
        poll_notifications(&w);
        rc = ty_batcher_step(w.b);
        if (rc < 0)
            TY_LOG_WARN("decode", "step failed: %s", ty_strerror(rc));
        w.idle = rc == 0;
        expire(&w);
        publish_load(&w);
    }
    answer_shutdown(n, cmds);
    ty_batcher_end_all(w.b, TY_ESHUTDOWN);
    ty_batcher_free(w.b);
    return NULL;
}
