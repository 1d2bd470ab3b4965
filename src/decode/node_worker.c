/* The decode node's worker thread (node-impl.h): reserves pages for assigned requests, takes
 * KvReady notifications from the transfer engine (they arrive after the KV writes they
 * follow), commits the landed prompt, and runs continuous batching over the ready sequences.
 * The token rules (EOS not reported, max_tokens, context full) are ty_engine_generate's;
 * stop strings are the Conductor's (it has the text). */
#include "node-impl.h"

#include "tycho/clock.h"
#include "tycho/cluster_pb.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct dseq {
    struct dseq *next;
    uint64_t rid;
    ty_kvseq_t *seq;
    ty_sampler_t *sampler;
    uint32_t *hist; /* prompt then output */
    uint32_t n_hist, cap_hist, n_prompt, n_out, max_tokens;
    uint32_t n_cached; /* prompt tokens the prefill node reused (KvReady) */
    uint64_t order;    /* assignment order: the newest is preempted first */
    uint32_t attempt;  /* the prefill attempt whose KvReady it takes (1, then re-arms) */
    bool ignore_eos, ready;
    bool preempted; /* ready, its pages taken back: recomputed from hist when readmitted */
    bool stalled;   /* no page to grow into this step (grow) */
    struct ty_gen_params ends; /* ignore_eos, stop tokens, min_tokens (ty_gen_is_end) */
    uint64_t deadline_ms; /* KV must land by then */
};

struct wstate {
    ty_decode_node_t *n;
    ty_kvpool_t *pool;
    const ty_model_t *m;
    uint32_t V, n_layers, max_ctx, n_seqs, n_ready, n_preempted;
    uint32_t watermark;   /* free pages kept when taking a new request beside others */
    uint64_t n_assigned;  /* dseq.order */
    uint64_t preemptions; /* since start (heartbeats) */
    bool idle;            /* the last step ran nothing (all stalled or waiting for KV) */
    struct dseq *seqs;    /* newest first */
    float *logits; /* (max_running, V) */
    uint32_t eog[TY_SAMPLE_MAX_BAN]; /* the model's end-of-generation ids (min_tokens) */
    size_t n_eog;
};

static void dseq_free(struct wstate *w, struct dseq *s)
{
    ty_kvpool_seq_free(w->pool, s->seq);
    ty_sampler_free(s->sampler);
    free(s->hist);
    free(s);
}

static void post(struct wstate *w, const struct dseq *s, const struct ty_sample *smp, int finish,
                 int rc)
{
    struct devent *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return; /* the Conductor's deadline ends that stream */
    ev->n = w->n;
    ev->rid = s->rid;
    ev->n_cached = s->n_cached;
    ev->rc = rc;
    ev->finish = finish;
    if (smp) {
        ev->has_token = true;
        ev->smp = *smp;
    }
    ty__decode_node_post(w->n, ev);
}

/* Remove `s` from the list, free it, and tell the loop how it ended. */
static void dseq_end(struct wstate *w, struct dseq *s, int finish, int rc)
{
    for (struct dseq **pp = &w->seqs; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    w->n_seqs--;
    if (s->ready)
        w->n_ready--;
    if (s->preempted)
        w->n_preempted--;
    if (finish != TYCHO__V1__FINISH_REASON__FINISH_REASON_NONE)
        post(w, s, NULL, finish, rc);
    dseq_free(w, s);
}

/* Pack the DecodeAssignReply: segment and per-layer addresses of the prompt's pages. */
static int pack_destination(struct wstate *w, struct dseq *s, uint8_t **out, size_t *len)
{
    uint32_t B = ty_kvpool_block_tokens(w->pool), np = (s->n_prompt + B - 1) / B;
    const uint32_t *pages = ty_kvseq_pages(s->seq);
    Tycho__V1__LayerDestination *lds = calloc(w->n_layers, sizeof(*lds));
    Tycho__V1__LayerDestination **ldp = calloc(w->n_layers, sizeof(*ldp));
    uint64_t *addr = malloc(2 * (size_t)w->n_layers * np * sizeof(uint64_t) + 1);
    int rc = lds && ldp && addr ? 0 : TY_ENOMEM;
    for (uint32_t l = 0; !rc && l < w->n_layers; l++) {
        tycho__v1__layer_destination__init(&lds[l]);
        lds[l].layer = l;
        lds[l].n_k_offsets = lds[l].n_v_offsets = np;
        lds[l].k_offsets = addr + (size_t)2 * l * np;
        lds[l].v_offsets = addr + (size_t)(2 * l + 1) * np;
        for (uint32_t i = 0; i < np; i++) {
            lds[l].k_offsets[i] = (uint64_t)(uintptr_t)ty_kvpool_k(w->pool, l, pages[i]);
            lds[l].v_offsets[i] = (uint64_t)(uintptr_t)ty_kvpool_v(w->pool, l, pages[i]);
        }
        ldp[l] = &lds[l];
    }
    Tycho__V1__KvDestination d = TYCHO__V1__KV_DESTINATION__INIT;
    d.node_id = w->n->node_id;
    d.segment = (char *)ty_xfer_engine_name(w->n->o.xfer);
    d.n_page_ids = np;
    d.page_ids = (uint32_t *)pages;
    d.n_layers = w->n_layers;
    d.layers = ldp;
    d.block_tokens = B;
    d.page_bytes = ty_kvpool_page_bytes(w->pool);
    Tycho__V1__DecodeAssignReply r = TYCHO__V1__DECODE_ASSIGN_REPLY__INIT;
    r.request_id = s->rid;
    r.accepted = true;
    r.kv_destination = &d;
    if (!rc)
        rc = ty_rpc_pack((const ProtobufCMessage *)&r, out, len);
    free(lds);
    free(ldp);
    free(addr);
    return rc;
}

/* Pages the preempted sequences need to be readmitted. */
static uint64_t preempted_need(const struct wstate *w)
{
    uint32_t B = ty_kvpool_block_tokens(w->pool);
    uint64_t need = 0;
    for (const struct dseq *s = w->seqs; s && w->n_preempted; s = s->next)
        if (s->preempted)
            need += (s->n_hist + B - 1) / B;
    return need;
}

static int dseq_reserve(struct wstate *w, struct dcmd *c, struct dseq *s)
{
    s->rid = c->rid;
    s->n_prompt = s->n_hist = c->n_prompt;
    s->max_tokens = c->max_tokens ? c->max_tokens : w->max_ctx;
    s->ignore_eos = c->ignore_eos;
    s->ends.ignore_eos = c->ignore_eos;
    s->ends.min_tokens = c->min_tokens;
    s->ends.n_stop_ids = c->n_stop_ids < TY_GEN_MAX_STOP_IDS ? c->n_stop_ids : TY_GEN_MAX_STOP_IDS;
    memcpy(s->ends.stop_ids, c->stop_ids, s->ends.n_stop_ids * sizeof(uint32_t));
    uint64_t total = (uint64_t)c->n_prompt + s->max_tokens;
    if (total > w->max_ctx)
        total = w->max_ctx;
    s->cap_hist = (uint32_t)total + 1;
    s->hist = malloc(s->cap_hist * sizeof(uint32_t));
    if (!s->hist)
        return TY_ENOMEM;
    memcpy(s->hist, c->prompt, c->n_prompt * sizeof(uint32_t));
    int rc = ty_sampler_new(&s->sampler, &c->sp, w->V);
    if (!rc)
        rc = ty_kvpool_seq_new(w->pool, &s->seq);
    if (!rc) /* the prompt's pages (the prefill node writes them); the rest as it grows */
        rc = ty_kvpool_seq_reserve(w->pool, s->seq, c->n_prompt);
    if (!rc && w->n_seqs && ty_kvpool_pages_free(w->pool) < w->watermark + preempted_need(w))
        rc = TY_ENOCAPACITY; /* what is preempted here gets its pages back first */
    s->order = ++w->n_assigned;
    s->attempt = 1;
    s->deadline_ms = ty_clock_ms() + w->n->o.kv_wait_timeout_ms;
    return rc;
}

static void do_assign(struct wstate *w, struct dcmd *c)
{
    struct devent *ev = calloc(1, sizeof(*ev));
    struct dseq *s = calloc(1, sizeof(*s));
    int rc = ev && s ? 0 : TY_ENOMEM;
    if (!rc && c->n_prompt >= w->max_ctx)
        rc = TY_ERANGE;
    if (!rc && w->n_seqs >= w->n->o.max_running * 4)
        rc = TY_EREJECTED;
    if (!rc)
        rc = dseq_reserve(w, c, s);
    if (!rc)
        rc = pack_destination(w, s, &ev->reply, &ev->reply_len);
    if (rc && s) {
        if (s->seq || s->sampler || s->hist)
            dseq_free(w, s);
        else
            free(s);
        s = NULL;
    }
    if (s) {
        s->next = w->seqs;
        w->seqs = s;
        w->n_seqs++;
    }
    if (!ev)
        return; /* the Conductor's call times out */
    ev->n = w->n;
    ev->rid = c->rid;
    ev->call = c->call;
    ev->rc = rc;
    ty__decode_node_post(w->n, ev);
}

static struct dseq *find(struct wstate *w, uint64_t rid)
{
    for (struct dseq *s = w->seqs; s; s = s->next)
        if (s->rid == rid)
            return s;
    return NULL;
}

/* The request's prefill node was lost and the Conductor sends its prefill to another one: if
 * its KV has not landed, it now takes only that attempt's KvReady (a late one of the lost node
 * is ignored) and waits for it afresh; the reply is the same destination. Once the KV landed
 * (the lost node's KvReady came first) the new prefill must not write the pages: EALREADY. */
static void do_rearm(struct wstate *w, struct dcmd *c)
{
    struct devent *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return; /* the Conductor's call times out */
    struct dseq *s = find(w, c->rid);
    int rc = !s ? TY_ENOTFOUND : s->ready ? TY_EALREADY : c->attempt <= s->attempt ? TY_ESTALE : 0;
    if (!rc)
        rc = pack_destination(w, s, &ev->reply, &ev->reply_len);
    if (!rc) {
        s->attempt = c->attempt;
        s->deadline_ms = ty_clock_ms() + w->n->o.kv_wait_timeout_ms;
    }
    ev->n = w->n;
    ev->rid = c->rid;
    ev->call = c->call;
    ev->rc = rc;
    ev->rearm = true;
    ty__decode_node_post(w->n, ev);
}

/* `s` ended naturally: the blocks its generated tokens filled go to the KV pool (the prompt's
 * full blocks are the prefill node's to write). Its KV covers every token but the last one
 * sampled. */
static void pool_write(struct wstate *w, const struct dseq *s)
{
    if (!w->n->kvstore)
        return;
    uint32_t B = ty_kvpool_block_tokens(w->pool);
    ty_node_kvstore_store(w->n->kvstore, s->seq, ty_kvseq_tokens(s->seq),
                          ty_kvseq_n_tokens(s->seq), s->n_prompt / B * B);
}

/* Record token `smp` of `s` and report it; true when `s` finished (and was ended). */
static bool accept_token(struct wstate *w, struct dseq *s, const struct ty_sample *smp)
{
    if (ty_gen_is_end(&s->ends, w->m, smp->id)) { /* EOS or a stop token */
        pool_write(w, s);
        dseq_end(w, s, TYCHO__V1__FINISH_REASON__FINISH_REASON_STOP, 0);
        return true;
    }
    s->hist[s->n_hist++] = smp->id;
    s->n_out++;
    bool full = ty_kvseq_n_tokens(s->seq) + 1 >= w->max_ctx || s->n_hist >= s->cap_hist;
    if (s->n_out >= s->max_tokens || full) {
        post(w, s, smp, TYCHO__V1__FINISH_REASON__FINISH_REASON_LENGTH, 0);
        pool_write(w, s);
        dseq_end(w, s, TYCHO__V1__FINISH_REASON__FINISH_REASON_NONE, 0);
        return true;
    }
    post(w, s, smp, TYCHO__V1__FINISH_REASON__FINISH_REASON_NONE, 0);
    return false;
}

/* A KvReady arrived: the prompt's KV is in our pages. */
static void on_kv_ready(struct wstate *w, const Tycho__V1__KvReady *k)
{
    struct dseq *s = find(w, k->request_id);
    if (!s || s->ready)
        return; /* cancelled meanwhile, or a duplicate */
    if ((k->attempt ? k->attempt : 1) != s->attempt) {
        TY_LOG_INFO("decode", "request %llu: KvReady of prefill attempt %u ignored (waiting for "
                    "attempt %u)", (unsigned long long)s->rid, k->attempt ? k->attempt : 1,
                    s->attempt);
        return;
    }
    int rc = k->all_layers && k->n_tokens == s->n_prompt && k->has_first_token &&
                     k->first_token < w->V
                 ? ty_kvpool_seq_commit(w->pool, s->seq, s->hist, s->n_prompt)
                 : TY_EPROTO;
    if (rc) {
        TY_LOG_WARN("decode", "request %llu: bad KvReady (%s)",
                    (unsigned long long)s->rid, ty_strerror(rc));
        dseq_end(w, s, TYCHO__V1__FINISH_REASON__FINISH_REASON_ERROR, rc);
        return;
    }
    /* The prefill node drew the first token from its own sampler with the same seed: draw
     * once here too, so the rest of the stream is what one sampler would give (tycho
     * generate's). The logits row is scratch. */
    struct ty_sample first = {.id = k->first_token}, skip;
    if (k->first_logprob && k->first_logprob->token_id == k->first_token)
        ty_cluster_logprob_from_pb(k->first_logprob, w->V, &first); /* prefill's, of token 1 */
    memset(w->logits, 0, w->V * sizeof(float));
    ty_sampler_sample(s->sampler, w->logits, s->hist, s->n_hist, &skip);
    s->ready = true;
    s->n_cached = k->cached_tokens <= s->n_prompt ? k->cached_tokens : 0;
    w->n_ready++;
    accept_token(w, s, &first);
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

/* ---- pages on demand ----------------------------------------------------------------------
 * A request gets the pages of its prompt when it is assigned (the prefill node writes them)
 * and one page more each time its answer fills one. When the pool is full the newest running
 * sequence is preempted (as vLLM does): its pages go back (its full blocks stay cached), and
 * it is recomputed from its tokens, by this node, once pages are free again; preempted
 * sequences get pages before new requests do. Its sampler is kept, so its answer is the one
 * it would have given. */

static void preempt(struct wstate *w, struct dseq *s)
{
    ty_kvpool_seq_free(w->pool, s->seq);
    s->seq = NULL;
    s->preempted = true;
    s->stalled = false;
    w->n_preempted++;
    w->preemptions++;
    TY_LOG_WARN("decode", "KV cache full: request %llu preempted (%llu so far), recomputed when "
                "pages are free; more KV memory or a lower max_batch_size avoids this",
                (unsigned long long)s->rid, (unsigned long long)w->preemptions);
}

/* Give preempted sequences their pages back, oldest first, while they fit (keeping the
 * watermark free when others run). */
static void readmit(struct wstate *w)
{
    while (w->n_preempted) {
        struct dseq *o = NULL;
        for (struct dseq *s = w->seqs; s; s = s->next)
            if (s->preempted && (!o || s->order < o->order))
                o = s;
        bool alone = w->n_seqs == w->n_preempted; /* nothing else holds pages */
        int rc = ty_kvpool_seq_new(w->pool, &o->seq);
        int cached = rc ? rc : ty_kvpool_seq_match_prefix(w->pool, o->seq, o->hist, o->n_hist);
        rc = cached < 0 ? cached
                        : ty_kvpool_seq_reserve(w->pool, o->seq, o->n_hist - (uint32_t)cached);
        if (!rc && !alone && ty_kvpool_pages_free(w->pool) < w->watermark)
            rc = TY_ENOCAPACITY;
        if (rc == TY_ENOCAPACITY && !alone) {
            ty_kvpool_seq_free(w->pool, o->seq);
            o->seq = NULL;
            return;
        }
        if (rc) {
            TY_LOG_WARN("decode", "request %llu: cannot be readmitted: %s",
                        (unsigned long long)o->rid, ty_strerror(rc));
            dseq_end(w, o, TYCHO__V1__FINISH_REASON__FINISH_REASON_ERROR, rc);
            continue;
        }
        o->preempted = false;
        w->n_preempted--;
        TY_LOG_DEBUG("decode", "request %llu readmitted: %d of its %u tokens from the page cache",
                     (unsigned long long)o->rid, cached, o->n_hist);
    }
}

/* Room for what every running sequence computes next, oldest first, preempting the newest
 * while the pool is full. One that finds no newer sequence to preempt waits a step (a request
 * still awaiting its KV holds pages that will be preemptable once it runs), or fails when
 * nothing else holds pages (the pool is smaller than its context). */
static void grow(struct wstate *w)
{
    struct dseq *v[w->n_seqs ? w->n_seqs : 1]; /* running, newest first (the list's order) */
    uint32_t n = 0;
    for (struct dseq *s = w->seqs; s; s = s->next) {
        s->stalled = false;
        if (s->ready && !s->preempted)
            v[n++] = s;
    }
    for (uint32_t i = n; i-- > 0;) {
        struct dseq *s = v[i];
        if (s->preempted)
            continue;
        uint32_t left = s->n_hist - ty_kvseq_n_tokens(s->seq);
        int rc;
        uint32_t j = 0;
        while ((rc = ty_kvpool_seq_reserve(w->pool, s->seq, left)) == TY_ENOCAPACITY) {
            while (j < i && v[j]->preempted)
                j++;
            if (j == i)
                break;
            preempt(w, v[j]);
        }
        if (rc == TY_ENOCAPACITY && w->n_seqs > w->n_preempted + 1) {
            s->stalled = true;
        } else if (rc) {
            TY_LOG_WARN("decode", "request %llu: no KV pages to grow into: %s",
                        (unsigned long long)s->rid, ty_strerror(rc));
            dseq_end(w, s, TYCHO__V1__FINISH_REASON__FINISH_REASON_ERROR, rc);
        }
    }
}

/* One decode step: the next token of every running sequence (up to max_running, oldest
 * first; a readmitted one first recomputes its tokens in the same forward call), sampled. */
static bool step(struct wstate *w)
{
    uint32_t cap = w->n->o.max_running, nb = 0, nr = 0;
    struct ty_batch_seq bs[cap];
    struct dseq *who[cap], *run[w->n_seqs ? w->n_seqs : 1];
    bool pure = true; /* one token each: a decode-step timing sample */
    for (struct dseq *s = w->seqs; s; s = s->next) /* newest first */
        if (s->ready && !s->preempted && !s->stalled)
            run[nr++] = s;
    while (nr && nb < cap) {
        struct dseq *s = run[--nr];
        uint32_t have = ty_kvseq_n_tokens(s->seq);
        bs[nb] = (struct ty_batch_seq){.seq = s->seq, .tokens = &s->hist[have],
                                       .n = s->n_hist - have};
        pure = pure && bs[nb].n == 1;
        who[nb++] = s;
    }
    if (!nb)
        return false;
    uint64_t ctx = 0, t0 = ty_clock_us();
    for (uint32_t i = 0; i < nb; i++)
        ctx += ty_kvseq_n_tokens(bs[i].seq) + 1;
    struct ty_batch b = {.seqs = bs, .n_seqs = nb};
    int rc = ty_engine_forward(w->n->o.engine, &b, w->logits);
    for (uint32_t i = 0; i < nb; i++) {
        struct dseq *s = who[i];
        struct ty_sample smp;
        if (!rc)
            ty_gen_ban_ends(&s->ends, s->n_out, w->eog, w->n_eog, s->sampler);
        int src = rc ? rc
                     : ty_sampler_sample(s->sampler, w->logits + (size_t)i * w->V, s->hist,
                                         s->n_hist, &smp);
        if (src) {
            TY_LOG_WARN("decode", "request %llu: step failed: %s", (unsigned long long)s->rid,
                        ty_strerror(src));
            dseq_end(w, s, TYCHO__V1__FINISH_REASON__FINISH_REASON_ERROR, src);
            continue;
        }
        accept_token(w, s, &smp);
    }
    if (rc || !pure)
        return true;
    struct ty_timing_sample ts = {.n_tokens = nb, .batch_size = nb,
                                  .prefix_tokens = ctx > UINT32_MAX ? UINT32_MAX : (uint32_t)ctx,
                                  .duration_us = ty_clock_us() - t0};
    ty_timing_ring_push(w->n->o.timings, &ts);
    return true;
}

/* Release reservations whose KV never came. */
static void expire(struct wstate *w)
{
    uint64_t now = ty_clock_ms();
    for (struct dseq *s = w->seqs, *next; s; s = next) {
        next = s->next;
        if (!s->ready && now > s->deadline_ms) {
            TY_LOG_WARN("decode", "request %llu: KV did not arrive in time; pages released",
                        (unsigned long long)s->rid);
            dseq_end(w, s, TYCHO__V1__FINISH_REASON__FINISH_REASON_ERROR, TY_ETIMEDOUT);
        }
    }
}

static void publish_load(struct wstate *w)
{
    ty_decode_node_t *n = w->n;
    uint32_t total = ty_kvpool_pages_total(w->pool), used = ty_kvpool_pages_used(w->pool);
    pthread_mutex_lock(&n->mu);
    n->load.running = w->n_ready - w->n_preempted;
    n->load.queued = w->n_seqs - w->n_ready + w->n_preempted;
    n->load.preemptions = w->preemptions;
    n->load.free_pages = total - used;
    n->load.kv_usage = total ? (float)used / (float)total : 0;
    pthread_mutex_unlock(&n->mu);
}

/* Take the commands; wait for one while nothing can run (polling for KV every ms while some
 * request awaits it). Returns false when the worker must stop. */
static bool take_commands(struct wstate *w, struct dcmd **out)
{
    ty_decode_node_t *n = w->n;
    pthread_mutex_lock(&n->mu);
    if (!n->stop && !n->cmds && (w->n_ready == w->n_preempted || w->idle)) {
        if (!w->n_seqs) {
            pthread_cond_wait(&n->cv, &n->mu);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&n->cv, &n->mu, &ts);
        }
    }
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
    struct dseq *s = find(w, c->rid);
    if (s)
        dseq_end(w, s, TYCHO__V1__FINISH_REASON__FINISH_REASON_CANCELLED, TY_ECANCELED);
}

void *ty__decode_node_worker(void *arg)
{
    ty_decode_node_t *n = arg;
    struct wstate w = {.n = n, .pool = ty_engine_pool(n->o.engine),
                       .m = ty_engine_model(n->o.engine),
                       .max_ctx = ty_engine_max_ctx(n->o.engine)};
    w.V = ty_model_config(w.m)->n_vocab;
    w.n_eog = ty_model_eog_list(w.m, w.eog, TY_SAMPLE_MAX_BAN);
    if (w.n_eog > TY_SAMPLE_MAX_BAN)
        w.n_eog = TY_SAMPLE_MAX_BAN;
    w.n_layers = ty_model_config(w.m)->n_layers;
    w.logits = malloc((size_t)n->o.max_running * w.V * sizeof(float));
    w.watermark = ty_kvpool_pages_total(w.pool) / 100 ? ty_kvpool_pages_total(w.pool) / 100 : 1;
    if (!w.logits) {
        TY_LOG_ERROR("decode", "no memory for logits");
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
        grow(&w); /* the running first, then what is left for the preempted */
        readmit(&w);
        w.idle = !step(&w);
        expire(&w);
        publish_load(&w);
    }
    for (struct dcmd *c = cmds, *next; c; c = next) {
        next = c->next;
        struct devent *ev = c->kind != DCMD_CANCEL ? calloc(1, sizeof(*ev)) : NULL;
        if (ev) { /* the loop answers the call with the error */
            *ev = (struct devent){.n = n, .rid = c->rid, .call = c->call, .rc = TY_ESHUTDOWN};
            ty__decode_node_post(n, ev);
        }
        ty__dcmd_free(c);
    }
    while (w.seqs)
        dseq_end(&w, w.seqs, TYCHO__V1__FINISH_REASON__FINISH_REASON_ERROR, TY_ESHUTDOWN);
    free(w.logits);
    return NULL;
}
