/* The remote serving backend (tycho/serve.h over the cluster; conductor-impl.h). A request:
 *   1. DecodeAssign (stream = true; the prompt ids and all of its sampling) to the decode node
 *      the scheduler picked: one call that is also the request's token stream. The node
 *      reserves the prompt's pages and the call's first item is the DecodeAssignReply with the
 *      KV destination (segment, page ids, per-layer K and V bases, one page stride);
 *   2. on that item, PrefillAssign (the prompt, that destination, the sampling fields that
 *      decide the first token) to the prefill node the scheduler picked (the least-loaded live
 *      one if it died meanwhile), which writes the KV layer by layer and tells the decode node
 *      when it has landed (KvReady, through the transfer engine);
 *   3. the call's next items are TokenChunks: TOKEN events (text and stop strings handled
 *      here), the last one DONE; the call then ends.
 * So the decode node gets one call per request, and each node gets the prompt once. A prefill
 * node lost before the KV landed: the decode node is asked, with a unary DecodeAssign carrying
 * only the request id and attempt > 1, whether the request still waits for its KV, and the
 * PrefillAssign goes to another prefill node. Cancel (client gone), a stop string, an error or
 * a dead node send Cancel to whichever node still holds the request; every RPC has a deadline
 * (the DecodeAssign's first item too, checked on the tick), so nothing waits forever.
 * Everything runs on the loop's thread, so events go straight to the sink (tycho/serve.h's
 * rule), a cancelled request's ERROR event from inside cancel. */
#include "conductor-impl.h"

#include "tycho/clock.h"
#include "tycho/proto.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <stdarg.h>
#include <stdio.h>

static void emit(ty_conductor_t *c, struct ty__creq *r, enum ty_serve_event_kind kind,
                 const struct ty_sample *smp, size_t text_end, enum ty_finish fin, int err)
{
    struct ty_serve_event ev = {.id = r->id, .kind = kind, .finish = fin, .error = err,
                                .text = ""};
    if (smp)
        ev.sample = *smp;
    ev.text = ty_stoptext_take(&r->tx, text_end, &ev.text_len);
    ev.n_prompt = r->n_prompt;
    ev.n_cached = r->n_cached;
    ev.n_output = r->n_out;
    ev.relay_us = kind == TY_SERVE_EV_TOKEN && r->n_out == 1 ? r->relay_us : 0;
    ev.message = kind == TY_SERVE_EV_ERROR && r->why[0] ? r->why : NULL;
    if (c->o.event_cb)
        c->o.event_cb(c->o.event_arg, &ev);
}

static void req_maybe_free(ty_conductor_t *c, struct ty__creq *r)
{
    if (!r->finished || r->decode_pending || r->prefill_pending || r->stream_pending ||
        r->n_stale || r->n_stage_calls)
        return; /* a call of it is still open: its end comes back here */
    for (struct ty__creq **pp = &c->reqs; *pp; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    }
    if (r->dreply)
        tycho__v1__decode_assign_reply__free_unpacked(r->dreply, NULL);
    ty_stoptext_clear(&r->tx);
    free(r->prompt);
    free(r);
}

static void on_cancel_reply(const struct ty_rpc_result *res, void *arg)
{
    (void)res;
    (void)arg;
}

static void send_cancel(struct ty__cnode *n, uint64_t rid, const char *why)
{
    if (!n || !n->rpc || !n->info.alive)
        return;
    Tycho__V1__Cancel m = TYCHO__V1__CANCEL__INIT;
    m.request_id = rid;
    m.reason = (char *)why;
    struct ty_rpc_call_opts co = {.timeout_ms = 2000};
    ty_rpc_client_call_msg(n->rpc, TYCHO__V1__METHOD__METHOD_CANCEL, (const ProtobufCMessage *)&m,
                           &co, on_cancel_reply, NULL, NULL);
}

/* Mark finished: the nodes still holding it are told to let go. */
static void req_end(ty_conductor_t *c, struct ty__creq *r, bool decode_done, bool natural,
                    const char *why)
{
    r->finished = true;
    ty__place_done(c, r, natural);
    if (r->dnode && r->dnode->info.inflight)
        r->dnode->info.inflight--;
    if (r->prefill_counted && r->pnode && r->pnode->info.inflight)
        r->pnode->info.inflight--;
    r->prefill_counted = false;
    if (!decode_done && r->dnode)
        send_cancel(r->dnode, r->rid, why);
    /* a prefill whose KV landed (tokens came, or its node said so) has nothing left to stop:
     * its reply may still be on the way, but a Cancel would be one more call for nothing */
    if (r->prefill_pending && !r->prefilled && !r->n_out)
        send_cancel(r->pnode, r->rid, why);
    for (uint32_t s = 0; s + 1 < r->n_group && r->n_stage_calls && !r->n_out; s++)
        send_cancel(r->group[s], r->rid, why); /* the group's other stages */
}

static void req_fail(ty_conductor_t *c, struct ty__creq *r, int err)
{
    if (r->finished)
        return;
    emit(c, r, TY_SERVE_EV_ERROR, NULL, 0, TY_FINISH_NONE, err);
    req_end(c, r, false, false, err == TY_ECANCELED ? "cancelled" : ty_strerror(err));
    req_maybe_free(c, r);
}

/* req_fail with what failed, for the client's error message and the log */
static void req_fail_why(ty_conductor_t *c, struct ty__creq *r, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void req_fail_why(ty_conductor_t *c, struct ty__creq *r, int err, const char *fmt, ...)
{
    if (r->finished)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof(r->why), fmt, ap);
    va_end(ap);
    req_fail(c, r, err);
}

/* An error a node's call ended with that says the node failed the request (its breaker
 * counts it), not a refusal it meant, a cancellation or the loss of the node (which the
 * registry handles). */
static bool node_fault(int err)
{
    return err != TY_ECANCELED && err != TY_ECONNRESET && err != TY_EUNAVAIL &&
           err != TY_ENOCAPACITY && err != TY_EREJECTED && err != TY_ESHUTDOWN &&
           err != TY_ERANGE && err != TY_EINVAL && err != TY_ENOTSUP && err != TY_EALREADY;
}

static bool req_replace(ty_conductor_t *c, struct ty__creq *r, struct ty__cnode *bad,
                        const char *why);

/* r failed because of node `bad` (`why` says how): placed again elsewhere if it still can be
 * (req_replace), else ended with `err` and that message. */
static void replace_or_fail(ty_conductor_t *c, struct ty__creq *r, struct ty__cnode *bad, int err,
                            const char *why)
{
    if (!req_replace(c, r, bad, why))
        req_fail_why(c, r, err, "%s", why);
}

/* r's decode node n went down (`how`) */
static void decode_gone(ty_conductor_t *c, struct ty__creq *r, struct ty__cnode *n, int err,
                        const char *how)
{
    char why[192];
    snprintf(why, sizeof(why), "decode node %s went down (%s) after %u tokens of the request",
             n->info.id, how, r->n_out);
    replace_or_fail(c, r, n, err, why);
}

static struct ty__call *call_new(struct ty__creq *r, struct ty__cnode *n)
{
    struct ty__call *k = calloc(1, sizeof(*k));
    if (k)
        k->r = r, k->n = n;
    return k;
}

/* A call's event: the request and Conductor; NULL when the call is stale (let go of when the
 * request was placed again), whose end is accounted and freed here. */
static struct ty__creq *call_of(const struct ty_rpc_result *res, void *arg, ty_conductor_t **c)
{
    struct ty__call *k = arg;
    struct ty__creq *r = k->r;
    *c = k->n->c;
    if (!k->stale)
        return r;
    if (res->event != TY_RPC_EVENT_ITEM) {
        r->n_stale--;
        free(k);
        req_maybe_free(*c, r);
    }
    return NULL;
}

static void req_done(ty_conductor_t *c, struct ty__creq *r, enum ty_finish fin)
{
    ty__place_observe(c, r);
    ty_stoptext_flush(&r->tx); /* nothing after a stop string; TY_ENOMEM: the tail is lost */
    emit(c, r, TY_SERVE_EV_DONE, NULL, ty_stoptext_safe_end(&r->tx, true), fin, 0);
    req_end(c, r, fin != TY_FINISH_STOP, true, "stop string");
}

static void sample_of(const Tycho__V1__TokenChunk *ch, size_t i, struct ty_sample *smp)
{
    memset(smp, 0, sizeof(*smp));
    smp->id = ch->token_ids[i];
    if (i >= ch->n_logprobs || !ch->logprobs[i])
        return;
    ty_pb_logprob_unpack(ch->logprobs[i], 0, smp);
}

/* One TokenChunk from the decode node. */
static void on_chunk(ty_conductor_t *c, struct ty__creq *r, const Tycho__V1__TokenChunk *ch)
{
    /* tokens from the decode node: the KV landed, whether or not the prefill node's reply
     * has reached us yet */
    ty__place_prefilled(c, r);
    if (ch->cached_tokens && ch->cached_tokens <= r->n_prompt)
        r->n_cached = ch->cached_tokens;
    for (size_t i = 0; i < ch->n_token_ids && !r->finished; i++) {
        struct ty_sample smp;
        sample_of(ch, i, &smp);
        r->t_last_us = ty_clock_us();
        if (!r->n_out++)
            r->t_first_us = r->t_last_us;
        int rc = ty_stoptext_push(&r->tx, smp.id);
        if (rc < 0) {
            req_fail(c, r, rc);
            return;
        }
        enum ty_finish fin = ty_stoptext_hit(&r->tx) ? TY_FINISH_STOP : TY_FINISH_NONE;
        if (!fin && i + 1 == ch->n_token_ids &&
            ch->finish_reason == TYCHO__V1__FINISH_REASON__FINISH_REASON_LENGTH)
            fin = TY_FINISH_LENGTH;
        emit(c, r, TY_SERVE_EV_TOKEN, &smp, ty_stoptext_safe_end(&r->tx, fin != 0), fin, 0);
        if (fin)
            req_done(c, r, fin);
    }
    if (r->finished)
        return;
    switch (ch->finish_reason) {
    case TYCHO__V1__FINISH_REASON__FINISH_REASON_NONE: break;
    case TYCHO__V1__FINISH_REASON__FINISH_REASON_STOP: req_done(c, r, TY_FINISH_EOS); break;
    case TYCHO__V1__FINISH_REASON__FINISH_REASON_LENGTH: req_done(c, r, TY_FINISH_LENGTH); break;
    case TYCHO__V1__FINISH_REASON__FINISH_REASON_CANCELLED: req_fail(c, r, TY_ECANCELED); break;
    default: req_fail(c, r, TY_EREMOTE); break;
    }
}

static struct ty__creq *req_of(void *arg, ty_conductor_t **c)
{
    struct ty__creq *r = arg;
    *c = r->dnode->c;
    return r;
}

static int start_prefill(ty_conductor_t *c, struct ty__creq *r);

/* The first item of r's DecodeAssign stream: the decode node reserved the pages and says where
 * the KV goes; the prefill starts. */
static void on_assigned(ty_conductor_t *c, struct ty__creq *r, const struct ty_rpc_result *res)
{
    uint64_t t0 = ty_clock_ns();
    int err = 0;
    r->assigned = true;
    r->dreply = tycho__v1__decode_assign_reply__unpack(NULL, res->len, res->payload);
    if (!r->dreply || !r->dreply->kv_destination)
        err = TY_EBADMSG;
    else if (!r->dreply->accepted)
        err = TY_ENOCAPACITY;
    else if (r->gen.grammar && !r->dreply->grammar)
        err = TY_ENOTSUP; /* a node that predates structured output would ignore it */
    if (err == TY_EBADMSG)
        ty__breaker_failed(c, r->dnode, "its DecodeAssign reply is malformed");
    else
        ty__breaker_ok(c, r->dnode); /* it answered (a refusal is an answer) */
    if (!err)
        err = start_prefill(c, r);
    r->relay_us = (uint32_t)((ty_clock_ns() - t0) / 1000);
    if (err) {
        TY_LOG_WARN("cluster", "request %llu [%s] on %s: %s%s%s", (unsigned long long)r->rid,
                    r->cid, r->dnode->info.id, ty_strerror(err),
                    r->dreply && r->dreply->reason[0] ? ": " : "",
                    r->dreply ? r->dreply->reason : "");
        if (err == TY_EUNAVAIL)
            snprintf(r->why, sizeof(r->why), "no prefill node is available");
        req_fail(c, r, err == TY_ECONNRESET || err == TY_ECANCELED ? TY_EUNAVAIL : err);
    }
}

/* r's DecodeAssign call ended before r did: refused before its first item (the node's error
 * is TY_EREMOTE's, as a refused assign always was), or broken after it. */
static void on_stream_ended(ty_conductor_t *c, struct ty__creq *r, const struct ty_rpc_result *res)
{
    int err = res->event == TY_RPC_EVENT_END ? TY_EPROTO : res->status;
    if (r->assigned && err == TY_EREMOTE && res->remote_code < 0)
        err = res->remote_code;
    TY_LOG_WARN("cluster", "request %llu [%s]: %s %s: %s%s%s", (unsigned long long)r->rid, r->cid,
                r->assigned ? "token stream ended early from" : "DecodeAssign refused by",
                r->dnode->info.id, ty_strerror(res->event == TY_RPC_EVENT_END ? err : res->status),
                res->message[0] ? ": " : "", res->message);
    if (r->assigned && node_fault(err))
        ty__breaker_failed(c, r->dnode, "its token stream ended early");
    if (err == TY_ECONNRESET || err == TY_ECANCELED || err == TY_EUNAVAIL) {
        /* the node went (its registry entry follows): elsewhere if no token streamed yet */
        decode_gone(c, r, r->dnode, TY_EUNAVAIL, ty_strerror(err));
        return;
    }
    req_fail_why(c, r, err, "decode node %s %s after %u tokens: %s%s%s", r->dnode->info.id,
                 r->assigned ? "ended the token stream" : "refused the request", r->n_out,
                 ty_strerror(res->event == TY_RPC_EVENT_END ? err : res->status),
                 res->message[0] ? ": " : "", res->message);
}

/* r's DecodeAssign call: its DecodeAssignReply, then TokenChunks, then the end. */
static void on_stream(const struct ty_rpc_result *res, void *arg)
{
    ty_conductor_t *c;
    struct ty__creq *r = call_of(res, arg, &c);
    if (!r)
        return;
    if (res->event == TY_RPC_EVENT_ITEM) {
        if (r->finished)
            return; /* its Cancel went to the node: the end follows */
        if (!r->assigned) {
            on_assigned(c, r, res);
            return;
        }
        Tycho__V1__TokenChunk *ch = tycho__v1__token_chunk__unpack(NULL, res->len, res->payload);
        if (!ch) {
            req_fail(c, r, TY_EBADMSG);
            return;
        }
        on_chunk(c, r, ch);
        tycho__v1__token_chunk__free_unpacked(ch, NULL);
        return;
    }
    r->stream_pending = false;
    r->stream_call = NULL;
    free(arg);
    if (!r->finished) {
        on_stream_ended(c, r, res);
        return; /* req_fail freed it if nothing else is pending */
    }
    req_maybe_free(c, r);
}

static int send_prefill(ty_conductor_t *c, struct ty__creq *r);

/* The prefill node itself is gone (the connection dropped, or the Conductor closed it when
 * the node was declared down): not a refusal or an error it reported, and not a failure of the
 * decode node, which must still be there to take the prefill again. */
static bool prefill_node_lost(const struct ty_rpc_result *res, const struct ty__creq *r)
{
    int st = res->status;
    return (st == TY_ECONNRESET || st == TY_ECANCELED || st == TY_EUNAVAIL) && r->dnode &&
           r->dnode->info.alive && !r->dnode->lost && r->dnode->rpc;
}

/* A failed call's error: the peer's own code when it sent one, else the transport's. */
static int call_error(const struct ty_rpc_result *res)
{
    return res->status == TY_EREMOTE && res->remote_code < 0 ? res->remote_code : res->status;
}

static void on_rearm_reply(const struct ty_rpc_result *res, void *arg)
{
    ty_conductor_t *c;
    struct ty__creq *r = req_of(arg, &c);
    r->decode_pending = false;
    if (r->finished) {
        req_maybe_free(c, r);
        return;
    }
    int err = res->event == TY_RPC_EVENT_REPLY ? 0 : call_error(res);
    if (err == TY_EALREADY) { /* the lost node's KV landed first: the decode node goes on */
        ty__place_prefilled(c, r);
        return;
    }
    if (!err)
        err = send_prefill(c, r);
    if (err) {
        TY_LOG_WARN("cluster", "request %llu [%s]: its prefill could not be sent again: %s",
                    (unsigned long long)r->rid, r->cid, ty_strerror(err));
        req_fail(c, r, err == TY_ECONNRESET || err == TY_ECANCELED ? TY_EUNAVAIL : err);
        return;
    }
    TY_LOG_WARN("cluster", "request %llu [%s]: prefill node lost, prefill sent again to %s",
                (unsigned long long)r->rid, r->cid, r->pnode->info.id);
    if (c->prefill_retries)
        ty_metrics_counter_inc(c->prefill_retries);
}

/* DecodeAssign.deadline_ms: how long the decode node keeps r's pages waiting for its KV. A
 * fixed wait there would end a long prompt's prefill early (a 32k prompt on a CPU node takes
 * tens of seconds); the Conductor's own KV deadline (node_answer_timeout past 4x the predicted
 * queue and prefill) comes first, and twice the answer timeout on top leaves it the decision. */
static uint64_t kv_wait_ms(const ty_conductor_t *c, const struct ty__creq *r)
{
    return 2ull * c->o.node_answer_timeout_ms +
           (uint64_t)(4 * (r->predicted_wait_us + r->predicted_prefill_us) / 1000);
}

/* Its prefill node was lost before r's KV landed: pick the least-loaded other live prefill
 * node and ask the decode node (DecodeAssign.attempt) whether the request still waits for its
 * KV; if so it takes only the new attempt's KvReady, and the prefill goes to the new node
 * (on_rearm_reply). Up to 3 sends per request. */
static int prefill_elsewhere(ty_conductor_t *c, struct ty__creq *r)
{
    struct ty__cnode *from = r->pnode, *to = NULL;
    if (r->prefill_tries < 3)
        to = ty__conductor_pick_except(c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, from);
    if (!to)
        return TY_EUNAVAIL;
    Tycho__V1__DecodeAssign m = TYCHO__V1__DECODE_ASSIGN__INIT;
    m.request_id = r->rid;
    m.attempt = r->prefill_tries + 1u;
    m.deadline_ms = kv_wait_ms(c, r);
    struct ty_rpc_call_opts o = {.timeout_ms = c->o.request_timeout_ms};
    int rc = ty_rpc_client_call_msg(r->dnode->rpc, TYCHO__V1__METHOD__METHOD_DECODE_ASSIGN,
                                    (const ProtobufCMessage *)&m, &o, on_rearm_reply, r, NULL);
    if (rc)
        return rc;
    r->decode_pending = true;
    r->kv_wait_by_ms = ty_clock_ms() + m.deadline_ms;
    r->pnode = to;
    ty__place_moved(c, r, from);
    ty__breaker_placed(c, to);
    return 0;
}

static void on_prefill_reply(const struct ty_rpc_result *res, void *arg)
{
    ty_conductor_t *c;
    struct ty__creq *r = call_of(res, arg, &c);
    if (!r)
        return;
    free(arg);
    r->prefill_call = NULL;
    r->prefill_pending = false;
    if (r->prefill_counted && r->pnode->info.inflight)
        r->pnode->info.inflight--;
    r->prefill_counted = false;
    if (!r->finished && res->event != TY_RPC_EVENT_REPLY) {
        int err = call_error(res);
        if (r->t_first_us && prefill_node_lost(res, r)) {
            /* its KV landed (the decode node streams tokens): the node's end is not its */
            ty__place_prefilled(c, r);
            return;
        }
        if (prefill_node_lost(res, r) && !prefill_elsewhere(c, r))
            return;
        char why[192];
        snprintf(why, sizeof(why), "prefill node %s failed: %s%s%s", r->pnode->info.id,
                 ty_strerror(res->status), res->message[0] ? ": " : "", res->message);
        TY_LOG_WARN("cluster", "request %llu [%s]: %s", (unsigned long long)r->rid, r->cid, why);
        err = err == TY_ECONNRESET || err == TY_ECANCELED ? TY_EUNAVAIL : err;
        if (node_fault(err)) {
            ty__breaker_failed(c, r->pnode, why);
            replace_or_fail(c, r, r->pnode, err, why);
        } else {
            req_fail_why(c, r, err, "%s", why);
        }
        return;
    }
    if (res->event == TY_RPC_EVENT_REPLY) {
        ty__breaker_ok(c, r->pnode);
        Tycho__V1__PrefillAssignReply *m =
            tycho__v1__prefill_assign_reply__unpack(NULL, res->len, res->payload);
        if (m) { /* what it reused, against the plan */
            ty__place_reused(c, r, m);
            tycho__v1__prefill_assign_reply__free_unpacked(m, NULL);
        }
    }
    if (!r->finished)
        ty__place_prefilled(c, r);
    req_maybe_free(c, r);
}

/* SamplingParams of r, with its logit bias in storage that lives as long as the message. */
struct pb_sampling {
    Tycho__V1__SamplingParams sp;
    Tycho__V1__LogitBias bias[TY_SAMPLE_MAX_LOGIT_BIAS];
    Tycho__V1__LogitBias *bias_ptrs[TY_SAMPLE_MAX_LOGIT_BIAS];
};

static void fill_sampling(const struct ty_gen_params *g, struct pb_sampling *ps)
{
    tycho__v1__sampling_params__init(&ps->sp);
    ty_pb_sampling_pack(g, &ps->sp, ps->bias, ps->bias_ptrs);
}

/* What the prefill node needs of r's sampling: what decides the first token (tycho.proto,
 * PrefillAssign). max_tokens and min_tokens beyond 1 are the decode node's; the end tokens
 * (stop ids, EOS unless ignore_eos) matter to token 1 only when min_tokens bans them. */
static void fill_first_sampling(const struct ty_gen_params *g, struct pb_sampling *ps)
{
    fill_sampling(g, ps);
    ps->sp.max_tokens = 0;
    ps->sp.min_tokens = g->min_tokens ? 1 : 0;
    if (!g->min_tokens) {
        ps->sp.n_stop_token_ids = 0;
        ps->sp.stop_token_ids = NULL;
        ps->sp.ignore_eos = false;
    }
}

/* The decode node reserved pages: start the prefill. */
static int start_prefill(ty_conductor_t *c, struct ty__creq *r)
{
    if (!r->pnode || !r->pnode->info.alive || r->pnode->lost || !r->pnode->rpc) {
        /* the scheduler's choice died while the decode node reserved pages */
        struct ty__cnode *chosen = r->pnode;
        r->pnode = ty__conductor_pick_except(c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, chosen);
        if (!r->pnode)
            return TY_EUNAVAIL;
        ty__place_moved(c, r, chosen);
    }
    return send_prefill(c, r);
}

/* A pipeline stage before the last answered its PrefillAssign: a failure fails the request
 * (its layers will not come), unless its prefill was sent again meanwhile (one node then). */
static void on_stage_reply(const struct ty_rpc_result *res, void *arg)
{
    struct ty__call *k = arg;
    struct ty__creq *r = k->r;
    ty_conductor_t *c = k->n->c;
    r->n_stage_calls--;
    if (k->n->info.inflight)
        k->n->info.inflight--;
    if (res->event == TY_RPC_EVENT_REPLY) {
        ty__breaker_ok(c, k->n);
    } else if (!r->finished && r->prefill_tries == 1 && !r->replaced) {
        int err = call_error(res);
        TY_LOG_WARN("cluster", "request %llu [%s]: pipeline stage on prefill node %s failed: "
                    "%s%s%s", (unsigned long long)r->rid, r->cid, k->n->info.id,
                    ty_strerror(res->status), res->message[0] ? ": " : "", res->message);
        req_fail_why(c, r, err == TY_ECONNRESET || err == TY_ECANCELED ? TY_EUNAVAIL : err,
                     "pipeline stage on prefill node %s failed: %s", k->n->info.id,
                     ty_strerror(err));
    }
    free(k);
    req_maybe_free(c, r);
}

/* The PrefillAssigns of the stages of r's group before the last (pa with each one's stage);
 * the last, r->pnode's, is the request's prefill call. */
static int send_stages(ty_conductor_t *c, struct ty__creq *r, Tycho__V1__PrefillAssign *pa,
                       Tycho__V1__PipelineStage *st)
{
    struct ty_rpc_call_opts o = {.timeout_ms = c->o.request_timeout_ms};
    for (uint32_t s = 0; s + 1 < r->n_group; s++) {
        struct ty__call *k = call_new(r, r->group[s]);
        if (!k)
            return TY_ENOMEM;
        pa->stage = &st[s];
        int rc = ty_rpc_client_call_msg(r->group[s]->rpc, TYCHO__V1__METHOD__METHOD_PREFILL_ASSIGN,
                                        &pa->base, &o, on_stage_reply, k, NULL);
        if (rc) {
            free(k);
            return rc;
        }
        r->n_stage_calls++;
        r->group[s]->info.inflight++;
        r->group[s]->info.served++;
        ty__breaker_placed(c, r->group[s]);
    }
    pa->stage = &st[r->n_group - 1];
    /* no stage keeps the prompt's blocks (their pages hold some layers): the blocks credited
     * to pnode at placement go back, as for a prefill moved away (its queue stays) */
    ty__place_moved(c, r, r->pnode);
    c->pipelined++;
    if (c->m_pipelined)
        ty_metrics_counter_inc(c->m_pipelined);
    TY_LOG_DEBUG("cluster", "request %llu [%s]: %u prompt tokens through %u prefill nodes",
                 (unsigned long long)r->rid, r->cid, r->n_prompt, r->n_group);
    return 0;
}

/* PrefillAssign to r->pnode: the prompt, the decode node's KV destination, the first token's
 * sampling; a long prompt's to each node of its pipeline group (pipeline.c). */
static int send_prefill(ty_conductor_t *c, struct ty__creq *r)
{
    struct pb_sampling *ps = malloc(sizeof(*ps));
    struct ty__call *k = call_new(r, r->pnode);
    if (!ps || !k) {
        free(ps);
        free(k);
        return TY_ENOMEM;
    }
    fill_first_sampling(&r->gen, ps);
    Tycho__V1__PrefillAssign pa = TYCHO__V1__PREFILL_ASSIGN__INIT;
    pa.request_id = r->rid;
    pa.n_prompt_tokens = r->n_prompt;
    pa.prompt_tokens = r->prompt;
    pa.kv_destination = r->dreply->kv_destination;
    pa.sampling = &ps->sp;
    pa.decode_node_id = r->dnode->info.id;
    pa.attempt = r->prefill_tries + 1u;
    pa.client_request_id = r->cid;
    Tycho__V1__PrefixLocation plan = TYCHO__V1__PREFIX_LOCATION__INIT;
    if (r->plan_node == r->pnode) { /* the node it was planned for (not a node moved to) */
        plan.n_blocks = r->plan_blocks;
        plan.local_blocks = r->plan_local;
        plan.source = r->plan_src;
        plan.tier = r->plan_src == TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_POOL
                        ? TYCHO__V1__STORAGE_TIER__STORAGE_TIER_DRAM
                        : TYCHO__V1__STORAGE_TIER__STORAGE_TIER_UNSPECIFIED;
        plan.node_id = r->plan_peer_id;
        plan.address = r->plan_peer_addr;
        plan.segment = r->plan_peer_seg;
        plan.pool_planned = ty__pool_following(c);
        pa.cached_prefix = &plan;
    }
    Tycho__V1__PipelineStage st[TY__PIPELINE_MAX];
    int rc = 0;
    r->n_group = (uint8_t)ty__pipeline_group(c, r, r->group, st);
    if (r->n_group) {
        pa.cached_prefix = NULL; /* a stage reuses no prefix (its pages hold some layers) */
        rc = send_stages(c, r, &pa, st);
    }
    struct ty_rpc_call_opts pco = {.timeout_ms = c->o.request_timeout_ms};
    if (!rc)
        rc = ty_rpc_client_call_msg(r->pnode->rpc, TYCHO__V1__METHOD__METHOD_PREFILL_ASSIGN,
                                    &pa.base, &pco, on_prefill_reply, k, NULL);
    free(ps); /* packed by the call */
    if (rc) {
        free(k);
        return rc;
    }
    r->prefill_call = k;
    /* its KV is due: the predicted queue and prefill, four times over, plus the answer time;
     * a group's by one node's prefill (its stages may share cores, or wait for each other's
     * queues, which the pipeline's prediction does not count) */
    double prefill_us = r->predicted_prefill_us;
    if (r->n_group) {
        const struct ty_sched_cost *cost = &ty_sched_opts_get(c->place.s)->cost;
        double one = ty_sched_cost_prefill_us(cost, r->n_prompt, 0);
        prefill_us = one > prefill_us ? one : prefill_us;
    }
    r->prefill_by_ms = ty_clock_ms() + c->o.node_answer_timeout_ms +
                       (uint64_t)(4 * (r->predicted_wait_us + prefill_us) / 1000);
    r->progress_done = 0; /* this attempt's progress reports count from here */
    ty__breaker_placed(c, r->pnode);
    r->prefill_pending = r->prefill_counted = true;
    r->prefill_tries++;
    r->pnode->info.inflight++;
    r->pnode->info.served++;
    return 0;
}

static int req_new(ty_conductor_t *c, const struct ty_serve_request *sr, struct ty__creq **out)
{
    struct ty__creq *r = calloc(1, sizeof(*r));
    if (!r)
        return TY_ENOMEM;
    r->prompt = malloc((sr->n_prompt ? sr->n_prompt : 1) * sizeof(uint32_t));
    size_t n_stop = sr->gen.n_stop < TY_SERVE_MAX_STOP ? sr->gen.n_stop : TY_SERVE_MAX_STOP;
    int rc = r->prompt ? ty_stoptext_init(&r->tx, c->tok, sr->gen.stop, n_stop) : TY_ENOMEM;
    if (rc) {
        free(r->prompt);
        free(r);
        return rc;
    }
    memcpy(r->prompt, sr->prompt, sr->n_prompt * sizeof(uint32_t));
    r->n_prompt = (uint32_t)sr->n_prompt;
    r->id = sr->id;
    r->rid = ++c->next_rid;
    ty_client_id_copy(r->cid, sr->client_id);
    r->t_arrive_us = ty_clock_us();
    r->priority = ty__place_class(c, sr->slo_class);
    r->gen = sr->gen;
    r->gen.stop = NULL;
    r->gen.n_stop = 0;
    *out = r;
    return 0;
}

/* Place `r` (the scheduler chooses its nodes or refuses it) and send DecodeAssign to its
 * decode node: the call that is also r's token stream (on_stream). */
static int dispatch(ty_conductor_t *c, struct ty__creq *r, struct ty_serve_reject *rej,
                    bool admitted)
{
    ty__pipeline_sync(c); /* the scheduler predicts a long prompt through its group */
    int rc = ty__place_pick(c, r, rej, admitted);
    if (rc)
        return rc;
    struct ty__cnode *d = r->dnode;
    struct pb_sampling *ps = malloc(sizeof(*ps));
    struct ty__call *k = call_new(r, d);
    if (!ps || !k) {
        free(ps);
        free(k);
        ty__place_done(c, r, false);
        r->dnode = r->pnode = NULL;
        return TY_ENOMEM;
    }
    fill_sampling(&r->gen, ps);
    Tycho__V1__DecodeAssign m = TYCHO__V1__DECODE_ASSIGN__INIT;
    m.request_id = r->rid;
    m.sampling = &ps->sp;
    m.prompt_tokens = r->n_prompt;
    m.expected_output_tokens = r->gen.max_tokens;
    m.n_prompt_token_ids = r->n_prompt;
    m.prompt_token_ids = r->prompt;
    m.stream = true;
    m.client_request_id = r->cid;
    m.deadline_ms = kv_wait_ms(c, r);
    struct ty_rpc_call_opts co = {.timeout_ms = c->o.request_timeout_ms, .stream = true};
    rc = ty_rpc_client_call_msg(d->rpc, TYCHO__V1__METHOD__METHOD_DECODE_ASSIGN, &m.base, &co,
                                on_stream, k, NULL);
    free(ps); /* packed by the call */
    if (rc) {
        free(k);
        ty__place_done(c, r, false);
        r->dnode = r->pnode = NULL;
        return rc == TY_ESHUTDOWN ? TY_EUNAVAIL : rc;
    }
    r->stream_call = k;
    r->stream_pending = true;
    r->kv_wait_by_ms = ty_clock_ms() + m.deadline_ms;
    ty__breaker_placed(c, d);
    ty__breaker_placed(c, r->pnode);
    r->assign_by_ms = ty_clock_ms() + c->o.node_answer_timeout_ms;
    r->wait_until_ms = 0;
    d->info.inflight++;
    d->info.served++;
    return 0;
}

/* Its decode node keeps r's pages waiting `wait_ms` from now (DecodeAssign.extend_wait), for
 * the prefill attempt in flight; the answer only matters to the decode node (a refusal: the
 * KV landed, or the request is gone there, which its stream says). */
static void extend_decode_wait(ty_conductor_t *c, struct ty__creq *r, uint64_t wait_ms)
{
    struct ty__cnode *d = r->dnode;
    if (!d || !d->rpc || !d->info.alive || r->decode_pending)
        return;
    Tycho__V1__DecodeAssign m = TYCHO__V1__DECODE_ASSIGN__INIT;
    m.request_id = r->rid;
    m.attempt = r->prefill_tries;
    m.extend_wait = true;
    m.deadline_ms = wait_ms;
    struct ty_rpc_call_opts o = {.timeout_ms = c->o.node_answer_timeout_ms};
    if (!ty_rpc_client_call_msg(d->rpc, TYCHO__V1__METHOD__METHOD_DECODE_ASSIGN,
                                (const ProtobufCMessage *)&m, &o, on_cancel_reply, NULL, NULL))
        r->kv_wait_by_ms = ty_clock_ms() + wait_ms;
}

/* A progress report of r's prefill (its node computed the prompt up to g->tokens_done): the
 * KV is due node_answer_timeout, twice the node's last chunk time and one heartbeat interval
 * (the report's age at most) from now, if that is later, so a prompt that takes longer than
 * its prediction goes on while its chunks go through, and a node that stops making progress
 * (hung, or dead) fails it that long after its last chunk. The decode node's wait stays
 * node_answer_timeout past that deadline, as at assignment (kv_wait_ms). */
static void prefill_progressed(ty_conductor_t *c, struct ty__creq *r,
                               const Tycho__V1__PrefillProgress *g, uint64_t now)
{
    if (g->tokens_done <= r->progress_done)
        return; /* no chunk since the last report */
    r->progress_done = g->tokens_done;
    uint64_t step_ms = g->step_us / 1000 < 3600000 ? g->step_us / 1000 : 3600000;
    uint64_t by = now + c->o.node_answer_timeout_ms + 2 * step_ms + c->o.heartbeat_interval_ms;
    if (by > r->prefill_by_ms) {
        TY_LOG_DEBUG("cluster", "request %llu [%s]: prefill on %s at %u/%u tokens (%llu "
                     "tokens/s, last chunk %llu ms): KV due in %llu ms",
                     (unsigned long long)r->rid, r->cid, r->pnode->info.id, g->tokens_done,
                     g->tokens_total, (unsigned long long)g->tokens_per_s,
                     (unsigned long long)step_ms, (unsigned long long)(by - now));
        r->prefill_by_ms = by;
    }
    if (r->prefill_by_ms + c->o.node_answer_timeout_ms > r->kv_wait_by_ms)
        extend_decode_wait(c, r, r->prefill_by_ms - now + 2ull * c->o.node_answer_timeout_ms);
}

void ty__conductor_progress(ty_conductor_t *c, struct ty__cnode *n, const Tycho__V1__Heartbeat *m)
{
    if (!m->n_prefill_progress)
        return;
    uint64_t now = ty_clock_ms();
    for (struct ty__creq *r = c->reqs; r; r = r->next) {
        if (r->finished || r->pnode != n || !r->prefill_pending || r->prefilled ||
            !r->prefill_by_ms)
            continue;
        for (size_t i = 0; i < m->n_prefill_progress; i++) {
            const Tycho__V1__PrefillProgress *g = m->prefill_progress[i];
            if (g && g->request_id == r->rid && (g->attempt ? g->attempt : 1) == r->prefill_tries)
                prefill_progressed(c, r, g, now);
        }
    }
}

static bool nodes_up(ty_conductor_t *c)
{
    return ty__conductor_pick(c, TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE) &&
           ty__conductor_pick(c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL);
}

/* Let go of r's placement (its nodes are told to drop it; the calls' ends come back stale)
 * and place it again as an admitted request, the scheduler not choosing `bad`: once per
 * request, and only while no token has streamed (the client sees nothing but the delay) and
 * no prefill re-send is being arranged. false: it was not (the caller fails it). */
static bool req_replace(ty_conductor_t *c, struct ty__creq *r, struct ty__cnode *bad,
                        const char *why)
{
    if (r->finished || r->n_out || r->decode_pending || r->replaced || c->closing)
        return false;
    if (r->stream_call) {
        r->stream_call->stale = true;
        r->stream_call = NULL;
        r->stream_pending = false;
        r->n_stale++;
    }
    bool prefilling = r->prefill_pending && !r->prefilled;
    if (r->prefill_call) {
        r->prefill_call->stale = true;
        r->prefill_call = NULL;
        r->prefill_pending = false;
        r->n_stale++;
    }
    send_cancel(r->dnode, r->rid, "placed again elsewhere");
    if (prefilling)
        send_cancel(r->pnode, r->rid, "placed again elsewhere");
    if (r->dnode && r->dnode->info.inflight)
        r->dnode->info.inflight--;
    if (r->prefill_counted && r->pnode && r->pnode->info.inflight)
        r->pnode->info.inflight--;
    r->prefill_counted = false;
    ty__place_done(c, r, false);
    if (r->dreply)
        tycho__v1__decode_assign_reply__free_unpacked(r->dreply, NULL);
    r->dreply = NULL;
    r->assigned = r->prefilled = false;
    r->prefill_tries = 0;
    r->prefill_by_ms = 0;
    r->replaced++;
    uint64_t old = r->rid;
    r->rid = ++c->next_rid; /* the old nodes may still hold the old id */
    r->dnode = r->pnode = NULL;
    ty__breaker_avoid(c, bad, true);
    int rc = dispatch(c, r, NULL, true);
    ty__breaker_avoid(c, bad, false);
    if (rc) {
        TY_LOG_WARN("cluster", "request %llu [%s]: %s; no other node to place it on: %s",
                    (unsigned long long)old, r->cid, why, ty_strerror(rc));
        return false;
    }
    TY_LOG_WARN("cluster", "request %llu [%s]: %s; placed again as %llu: prefill %s, decode %s",
                (unsigned long long)old, r->cid, why, (unsigned long long)r->rid,
                r->pnode->info.id, r->dnode->info.id);
    if (c->replaced)
        ty_metrics_counter_inc(c->replaced);
    return true;
}

/* r's node failed it (`bad`, said `why`): counted against the node, then r goes elsewhere or
 * ends with 503 saying what failed. */
static void node_failed_req(ty_conductor_t *c, struct ty__creq *r, struct ty__cnode *bad,
                            const char *why)
{
    ty__breaker_failed(c, bad, why);
    replace_or_fail(c, r, bad, TY_EUNAVAIL, why);
}

void ty__conductor_retry_waiting(ty_conductor_t *c)
{
    uint64_t now = ty_clock_ms();
    char why[192];
    for (struct ty__creq *r = c->reqs, *next; r; r = next) {
        next = r->next;
        if (!r->finished && r->stream_pending && !r->assigned && now > r->assign_by_ms) {
            snprintf(why, sizeof(why), "decode node %s did not take the request in %u ms",
                     r->dnode->info.id, c->o.node_answer_timeout_ms);
            node_failed_req(c, r, r->dnode, why); /* its Cancel lets the node end the call */
            continue;
        }
        if (!r->finished && r->prefill_pending && !r->prefilled && !r->n_out &&
            r->prefill_by_ms && now > r->prefill_by_ms) {
            snprintf(why, sizeof(why), "prefill node %s did not deliver the KV in time (%u ms "
                     "past 4x its predicted queue and prefill, or past its last progress)",
                     r->pnode->info.id, c->o.node_answer_timeout_ms);
            node_failed_req(c, r, r->pnode, why);
            continue;
        }
        if (r->finished || !r->wait_until_ms)
            continue;
        /* accepted while no node was up (a stream may have begun): placed, never refused */
        int rc = nodes_up(c) ? dispatch(c, r, NULL, true) : now > r->wait_until_ms ? TY_EUNAVAIL : 0;
        if (rc)
            req_fail(c, r, rc);
    }
}

/* The longest sequence the cluster serves: the Conductor's max_ctx, lowered to the least a
 * live node registered (its context, itself lowered to what its KV pool holds), so that no
 * request is placed where it cannot fit; *kv_tokens: the smallest live node's KV pool in
 * tokens (0: no node). */
static uint32_t cluster_ctx_limit(const ty_conductor_t *c, uint32_t *kv_tokens)
{
    uint32_t lim = c->o.max_ctx;
    uint64_t kv = 0;
    for (size_t i = 0; i < c->n_nodes; i++) {
        const struct ty__cnode *n = c->nodes[i];
        if (!n->info.alive)
            continue;
        if (n->max_ctx && n->max_ctx < lim)
            lim = n->max_ctx;
        uint64_t t = n->kv_pages * n->block_tokens;
        if (t && (!kv || t < kv))
            kv = t;
    }
    if (kv_tokens)
        *kv_tokens = kv < UINT32_MAX ? (uint32_t)kv : UINT32_MAX;
    return lim;
}

static int cluster_submit(void *ctx, const struct ty_serve_request *sr)
{
    ty_conductor_t *c = ctx;
    if (c->closing)
        return TY_ESHUTDOWN;
    if (!sr || !sr->n_prompt)
        return TY_EINVAL;
    /* the API front door answered a 400 naming the limits already; this holds for any other
     * caller: the prompt and its first token must fit every node it may be placed on */
    if (sr->n_prompt >= cluster_ctx_limit(c, NULL))
        return TY_ERANGE;
    uint64_t now = ty_clock_ms();
    bool up = nodes_up(c);
    if (!up && now - c->started_ms >= c->o.startup_wait_ms)
        return TY_EUNAVAIL;
    uint32_t cls;
    char why[sizeof(sr->reject->message)];
    if (sr->slo_class_strict && ty__place_class_find(c, sr->slo_class, &cls, why, sizeof(why))) {
        if (sr->reject)
            snprintf(sr->reject->message, sizeof(sr->reject->message), "%s", why);
        return TY_ENOTFOUND;
    }
    struct ty__creq *r;
    int rc = req_new(c, sr, &r);
    if (rc)
        return rc;
    if (up && (rc = dispatch(c, r, sr->reject, false))) {
        ty_stoptext_clear(&r->tx);
        free(r->prompt);
        free(r);
        return rc;
    }
    if (!up)
        r->wait_until_ms = c->started_ms + c->o.startup_wait_ms;
    r->next = c->reqs;
    c->reqs = r;
    return 0;
}

static int cluster_cancel(void *ctx, uint64_t id)
{
    ty_conductor_t *c = ctx;
    for (struct ty__creq *r = c->reqs; r; r = r->next) {
        if (r->id == id && !r->finished) {
            req_fail(c, r, TY_ECANCELED);
            return 0;
        }
    }
    return 0;
}

static void cluster_stats(void *ctx, struct ty_serve_stats *out)
{
    ty_conductor_t *c = ctx;
    memset(out, 0, sizeof(*out));
    out->max_ctx = cluster_ctx_limit(c, &out->kv_seq_tokens);
    uint32_t n_decode = 0, n_prefill = 0;
    for (size_t i = 0; i < c->n_nodes; i++) {
        const struct ty__cnode *n = c->nodes[i];
        if (!n->info.alive)
            continue;
        n_prefill += n->info.role == TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL;
        out->running += n->info.role == TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE
                            ? n->info.load.running : 0;
        out->waiting += n->info.load.queued;
        if (n->info.role == TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE) {
            out->kv_usage += n->info.load.kv_usage;
            out->kv_block_tokens = n->block_tokens;
            n_decode++;
        }
    }
    if (n_decode)
        out->kv_usage /= n_decode;
    out->ready = n_decode && n_prefill;
    out->preemptions = c->preemptions; /* a down node's count stays in it */
}

static void cluster_set_sink(void *ctx, ty_serve_event_cb sink, void *arg)
{
    ty_conductor_t *c = ctx;
    c->o.event_cb = sink;
    c->o.event_arg = arg;
}

const struct ty_serve_backend_i ty__conductor_backend_iface = {
    .submit = cluster_submit, .cancel = cluster_cancel, .stats = cluster_stats,
    .status_json = ty__conductor_status_json, .set_sink = cluster_set_sink};

void ty__conductor_fail_node(ty_conductor_t *c, struct ty__cnode *n, int err, const char *why)
{
    for (struct ty__creq *r = c->reqs, *next; r; r = next) {
        next = r->next;
        /* a request whose prefill node went is sent elsewhere (or, its KV landed, left to
         * decode) when that call completes with the node's loss: on_prefill_reply; one whose
         * decode node went before any token streamed is placed again */
        if (!r->finished && r->dnode == n)
            decode_gone(c, r, n, err, why);
    }
}

void ty__conductor_fail_all(ty_conductor_t *c, int err)
{
    for (struct ty__creq *r = c->reqs, *next; r; r = next) {
        next = r->next;
        req_fail(c, r, err);
    }
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

int ty_conductor_new(ty_conductor_t **out, const struct ty_conductor_opts *opts)
{
    if (!out || !opts || !opts->loop || !opts->model || !opts->max_ctx)
        return TY_EINVAL;
    ty_conductor_t *c = calloc(1, sizeof(*c));
    if (!c)
        return TY_ENOMEM;
    c->o = *opts;
    c->o.rpc_host = NULL; /* only used during start */
    if (!c->o.heartbeat_interval_ms)
        c->o.heartbeat_interval_ms = 500;
    if (!c->o.heartbeat_timeout_ms)
        c->o.heartbeat_timeout_ms = 3000;
    if (!c->o.request_timeout_ms)
        c->o.request_timeout_ms = 600000;
    if (!c->o.node_answer_timeout_ms)
        c->o.node_answer_timeout_ms = 10000;
    if (!c->o.breaker_failures)
        c->o.breaker_failures = 3;
    if (!c->o.breaker_open_ms)
        c->o.breaker_open_ms = 5000;
    c->tok = ty_model_tokenizer(opts->model);
    c->started_ms = ty_clock_ms();
    /* request ids are unique across the Conductors a node serves (each starts at a random
     * multiple of 2^32, below 2^53 so that JSON readers keep them exact) */
    uint32_t r = 0;
    if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
        r = (uint32_t)(ty_clock_ns() ^ (uint64_t)getpid());
    c->next_rid = (uint64_t)(r & 0x1fffff) << 32;
    c->o.rpc_host = opts->rpc_host;
    int rc = ty__place_init(c, opts);
    if (rc) {
        free(c);
        return rc;
    }
    rc = ty__conductor_registry_start(c);
    c->o.rpc_host = NULL;
    if (rc) {
        ty__place_fini(c);
        free(c);
        return rc;
    }
    c->o.sched = NULL; /* borrowed only until here */
    c->o.cost = NULL;
    c->o.model_name = NULL;
    *out = c;
    return 0;
}

struct ty_serve_backend ty_conductor_backend(ty_conductor_t *c)
{
    return (struct ty_serve_backend){&ty__conductor_backend_iface, c};
}

static void close_step(void *arg)
{
    ty_conductor_t *c = arg;
    if (--c->n_closing)
        return;
    void (*cb)(void *) = c->close_cb;
    void *cb_arg = c->close_arg;
    for (size_t i = 0; i < c->n_nodes; i++)
        free(c->nodes[i]);
    ty__place_fini(c);
    free(c);
    if (cb)
        cb(cb_arg);
}

static void on_tick_closed(uv_handle_t *h)
{
    close_step(h->data);
}

void ty_conductor_close(ty_conductor_t *c, void (*cb)(void *arg), void *arg)
{
    c->closing = true;
    c->close_cb = cb;
    c->close_arg = arg;
    ty__conductor_fail_all(c, TY_ESHUTDOWN);
    c->n_closing = 3; /* tick, server, this function */
    for (size_t i = 0; i < c->n_nodes; i++) {
        struct ty__cnode *n = c->nodes[i];
        n->info.alive = false;
        if (n->rpc) {
            ty_rpc_client_t *r = n->rpc;
            n->rpc = NULL;
            c->n_closing++;
            ty_rpc_client_close(r, close_step, c);
        }
    }
    uv_timer_stop(&c->tick);
    uv_close((uv_handle_t *)&c->tick, on_tick_closed);
    ty_rpc_server_close(c->srv, close_step, c);
    close_step(c);
}
