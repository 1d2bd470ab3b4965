/* The decode node's loop side (node-impl.h): the DecodeAssign and Cancel handlers, and the
 * delivery of the worker's events. A DecodeAssign (stream = true) is the request's one call:
 * its first stream item is the DecodeAssignReply with the KV destination, sent once the worker
 * reserved the prompt's pages, then each token is a TokenChunk item on the same call, the last
 * one with its finish reason, after which the stream ends (an error frame when the request is
 * refused or fails). Nothing is held back: the stream exists before the worker can produce
 * anything for it. A DecodeAssign with attempt > 1 re-arms a known request (its prefill node
 * was lost) and is answered once, unary. */
#include "node-impl.h"

#include "tycho/errors.h"
#include "tycho/proto.h"
#include "tycho/log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

void ty__dcmd_free(struct dcmd *c)
{
    if (c) {
        free(c->prompt);
        free(c->grammar_schema);
        free(c);
    }
}

static void push_cmd(ty_decode_node_t *n, struct dcmd *c)
{
    pthread_mutex_lock(&n->mu);
    *n->cmds_tail = c;
    n->cmds_tail = &c->next;
    pthread_cond_signal(&n->cv);
    pthread_mutex_unlock(&n->mu);
}

/* Tell the worker to let request `rid` go (a no-op for one it does not hold). */
static void push_cancel(ty_decode_node_t *n, uint64_t rid)
{
    struct dcmd *c = calloc(1, sizeof(*c));
    if (!c)
        return; /* its KV wait or the Conductor's deadline ends it */
    c->kind = DCMD_CANCEL;
    c->rid = rid;
    push_cmd(n, c);
}

static struct lreq *lreq_find(ty_decode_node_t *n, uint64_t rid)
{
    for (struct lreq *r = n->reqs; r; r = r->next)
        if (r->rid == rid)
            return r;
    return NULL;
}

static void lreq_free(ty_decode_node_t *n, struct lreq *r)
{
    for (struct lreq **pp = &n->reqs; *pp; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    }
    free(r);
}

/* Send one token event on the request's stream; true when it was the last (the call ended). */
static bool send_event(struct lreq *r, const struct devent *ev)
{
    if (ev->finish == TYCHO__V1__FINISH_REASON__FINISH_REASON_ERROR) {
        ty_rpc_call_fail(r->stream, ev->rc, "decode of request %llu failed: %s",
                         (unsigned long long)r->rid, ty_strerror(ev->rc));
        return true;
    }
    Tycho__V1__TokenChunk ch = TYCHO__V1__TOKEN_CHUNK__INIT;
    struct ty_pb_logprob lp;
    Tycho__V1__TokenLogprob *lpp = &lp.lp;
    uint32_t id = ev->smp.id;
    ch.request_id = r->rid;
    ch.seq = r->seq++;
    ch.cached_tokens = ev->n_cached;
    if (ev->has_token) {
        ch.n_token_ids = 1;
        ch.token_ids = &id;
        ty_pb_logprob_pack(&ev->smp, &lp);
        ch.n_logprobs = 1;
        ch.logprobs = &lpp;
    }
    ch.finish_reason = (Tycho__V1__FinishReason)ev->finish;
    ty_rpc_call_stream_msg(r->stream, &ch.base); /* TY_ENOTCONN: cancelled, the end follows */
    if (ev->finish == TYCHO__V1__FINISH_REASON__FINISH_REASON_NONE)
        return false;
    ty_rpc_call_end(r->stream);
    return true;
}

/* The worker reserved the request's pages (the first item of its stream: the destination) or
 * refused it (the call fails). A stream whose client went meanwhile has its cancel queued
 * behind this (on_stream_cancel): the worker ends the request and its last event ends the
 * call. */
static void on_assigned(ty_decode_node_t *n, struct lreq *r, const struct devent *ev)
{
    if (ev->rc) {
        TY_LOG_WARN("decode", "request %llu refused: %s", (unsigned long long)ev->rid,
                    ty_strerror(ev->rc));
        ty_rpc_call_fail(r->stream, ev->rc, "cannot take request %llu: %s",
                         (unsigned long long)ev->rid, ty_strerror(ev->rc));
        lreq_free(n, r);
        return;
    }
    ty_rpc_call_stream(r->stream, ev->reply, ev->reply_len);
}

static void on_event(void *arg)
{
    struct devent *ev = arg;
    ty_decode_node_t *n = ev->n;
    struct lreq *r = ev->kind == DEV_REARM ? NULL : lreq_find(n, ev->rid);
    if (ev->kind == DEV_REARM) {
        if (ev->rc)
            ty_rpc_call_fail(ev->call, ev->rc, "request %llu does not wait for this KV: %s",
                             (unsigned long long)ev->rid, ty_strerror(ev->rc));
        else
            ty_rpc_call_reply(ev->call, ev->reply, ev->reply_len);
    } else if (r && ev->kind == DEV_ASSIGN) {
        on_assigned(n, r, ev);
    } else if (r && send_event(r, ev)) {
        lreq_free(n, r);
    }
    free(ev->reply);
    free(ev);
}

void ty__decode_node_post(ty_decode_node_t *n, struct devent *ev)
{
    if (ty_rpc_mailbox_post(n->mb, on_event, ev)) {
        free(ev->reply);
        free(ev);
    }
}

/* ---- RPC handlers --------------------------------------------------------------------------- */

/* DecodeAssign with attempt > 1 or extend_wait: the worker says whether the request still
 * waits for its KV (and re-arms it, or extends its wait). */
static int rearm_build(ty_decode_node_t *n, const Tycho__V1__DecodeAssign *m, struct dcmd **out,
                       char *why, size_t cap)
{
    if (!lreq_find(n, m->request_id))
        return snprintf(why, cap, "request %llu is not assigned here",
                        (unsigned long long)m->request_id), TY_ENOTFOUND;
    struct dcmd *c = calloc(1, sizeof(*c));
    if (!c)
        return TY_ENOMEM;
    c->kind = m->extend_wait ? DCMD_EXTEND : DCMD_REARM;
    c->rid = m->request_id;
    c->attempt = m->attempt ? m->attempt : 1;
    c->kv_wait_ms = m->deadline_ms;
    *out = c;
    return 0;
}

static int assign_build(ty_decode_node_t *n, const Tycho__V1__DecodeAssign *m,
                        struct dcmd **out, char *why, size_t cap)
{
    uint32_t V = ty_model_config(ty_engine_model(n->o.engine))->n_vocab;
    if (m->attempt > 1 || m->extend_wait)
        return rearm_build(n, m, out, why, cap);
    if (!m->stream)
        return snprintf(why, cap, "DecodeAssign without stream: the token stream is the "
                        "DecodeAssign call itself (TokenStreamOpen is gone); a Conductor that "
                        "predates it must be upgraded"), TY_ENOTSUP;
    if (!m->n_prompt_token_ids || m->n_prompt_token_ids != m->prompt_tokens)
        return snprintf(why, cap, "prompt_token_ids (%zu) must hold prompt_tokens (%u) ids",
                        m->n_prompt_token_ids, m->prompt_tokens), TY_EINVAL;
    if (lreq_find(n, m->request_id))
        return snprintf(why, cap, "request %llu already assigned",
                        (unsigned long long)m->request_id), TY_EEXIST;
    for (size_t i = 0; i < m->n_prompt_token_ids; i++)
        if (m->prompt_token_ids[i] >= V)
            return snprintf(why, cap, "token id %u out of range", m->prompt_token_ids[i]),
                   TY_EINVAL;
    struct dcmd *c = calloc(1, sizeof(*c));
    if (!c || !(c->prompt = malloc(m->n_prompt_token_ids * sizeof(uint32_t)))) {
        free(c);
        return TY_ENOMEM;
    }
    c->kind = DCMD_ASSIGN;
    c->rid = m->request_id;
    c->kv_wait_ms = m->deadline_ms;
    ty_client_id_copy(c->cid, m->client_request_id);
    c->n_prompt = (uint32_t)m->n_prompt_token_ids;
    memcpy(c->prompt, m->prompt_token_ids, c->n_prompt * sizeof(uint32_t));
    struct ty_gen_params ends = {0};
    int rc = ty_pb_sampling_unpack(m->sampling, V, &c->sp, why, cap);
    if (!rc)
        rc = ty_pb_ends_unpack(m->sampling, V, &ends, why, cap);
    if (!rc)
        rc = ty_pb_grammar_unpack(m->sampling, &c->grammar, &c->grammar_schema, why, cap);
    if (rc) {
        ty__dcmd_free(c);
        return rc;
    }
    c->min_tokens = ends.min_tokens;
    c->n_stop_ids = ends.n_stop_ids;
    memcpy(c->stop_ids, ends.stop_ids, ends.n_stop_ids * sizeof(uint32_t));
    if (m->sampling) {
        c->max_tokens = m->sampling->max_tokens;
        c->ignore_eos = m->sampling->ignore_eos;
    }
    *out = c;
    return 0;
}

/* The Conductor cancelled a request's stream or its connection closed: let the request go. */
static void on_stream_cancel(ty_rpc_call_t *call, int reason, void *arg)
{
    ty_decode_node_t *n = arg;
    (void)reason;
    for (struct lreq *r = n->reqs; r; r = r->next)
        if (r->stream == call)
            push_cancel(n, r->rid);
}

static void on_assign(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_decode_node_t *n = arg;
    const Tycho__V1__DecodeAssign *m = msg;
    char why[256] = "";
    struct dcmd *c = NULL;
    if (ty_node_test_mute(call, "DecodeAssign"))
        return;
    int rc = assign_build(n, m, &c, why, sizeof(why));
    struct lreq *r = NULL;
    if (!rc && c->kind == DCMD_ASSIGN && !(r = calloc(1, sizeof(*r)))) {
        ty__dcmd_free(c);
        rc = TY_ENOMEM;
    }
    if (rc) {
        TY_LOG_WARN("decode", "DecodeAssign refused: %s", why[0] ? why : ty_strerror(rc));
        ty_rpc_call_fail(call, rc, "%s", why[0] ? why : ty_strerror(rc));
        return;
    }
    if (r) { /* the call is the stream from now on */
        r->rid = m->request_id;
        r->stream = call;
        r->next = n->reqs;
        n->reqs = r;
        ty_rpc_call_set_cancel_cb(call, on_stream_cancel, n);
    } else {
        c->call = call;
    }
    push_cmd(n, c);
}

static void on_cancel(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_decode_node_t *n = arg;
    const Tycho__V1__Cancel *m = msg;
    push_cancel(n, m->request_id);
    Tycho__V1__Ack a = TYCHO__V1__ACK__INIT;
    a.request_id = m->request_id;
    ty_rpc_call_reply_msg(call, &a.base);
}

/* Transfer engine thread (tycho/transfer.h): a notification (a KvReady) is queued. */
static void on_notify(void *arg)
{
    ty_decode_node_t *n = arg;
    pthread_mutex_lock(&n->mu);
    n->notified = true;
    pthread_cond_signal(&n->cv);
    pthread_mutex_unlock(&n->mu);
}

/* ---- lifecycle -------------------------------------------------------------------------------- */

void ty_decode_node_load(void *arg, struct ty_node_load *out)
{
    ty_decode_node_t *n = arg;
    pthread_mutex_lock(&n->mu);
    *out = n->load;
    pthread_mutex_unlock(&n->mu);
    if (n->kvstore) {
        struct ty_node_kvstore_stats st;
        ty_node_kvstore_stats(n->kvstore, &st);
        out->pool_written_blocks = st.stored_blocks;
        out->pool_errors = st.errors;
    }
}

uint16_t ty_decode_node_rpc_port(const ty_decode_node_t *n)
{
    return ty_node_service_port(n->svc);
}

static void on_stop(void *arg);
static void on_drained(void *arg);
static void on_closed(void *arg);

/* Is [addr, addr+len) inside pages of `f`? The range must lie in one layer's K or V array and
 * every page it touches be one of the reservation's. */
static bool fence_covers(const ty_decode_node_t *n, const struct ty__fence *f, uint64_t addr,
                         uint64_t len)
{
    if (!len || addr + len < addr)
        return false;
    for (uint32_t a = 0; a < n->n_kv_arrays; a++) {
        uint64_t base = n->kv_base[a];
        if (addr < base || addr + len > base + n->kv_span)
            continue;
        uint64_t p0 = (addr - base) / n->page_bytes, p1 = (addr + len - 1 - base) / n->page_bytes;
        for (uint64_t p = p0; p <= p1; p++) {
            bool mine = false;
            for (uint32_t k = 0; k < f->n_pages && !mine; k++)
                mine = f->pages[k] == p;
            if (!mine)
                return false;
        }
        return true;
    }
    return false;
}

/* Transfer engine thread: the write fence. A write lands only with the tag of a reservation
 * still waiting for its KV, for the attempt it waits for, and only into that reservation's
 * pages: a prefill node that hung, was given up and came back writes with an old tag (or after
 * the KV landed) and is refused. */
static bool fence_ok(void *arg, uint32_t tag, uint64_t addr, uint64_t len)
{
    ty_decode_node_t *n = arg;
    if (!tag)
        return false; /* every prefill node that knows fences tags its writes */
    bool ok = false;
    pthread_mutex_lock(&n->fence_mu);
    for (size_t i = 0; i < n->n_fences && !ok; i++)
        ok = n->fences[i].tag == tag && fence_covers(n, &n->fences[i], addr, len);
    pthread_mutex_unlock(&n->fence_mu);
    return ok;
}

int ty__decode_fence_set(ty_decode_node_t *n, uint32_t tag, const uint32_t *pages,
                         uint32_t n_pages)
{
    if (!tag)
        return 0;
    int rc = 0;
    pthread_mutex_lock(&n->fence_mu);
    if (!pages) {
        for (size_t i = 0; i < n->n_fences; i++) {
            if (n->fences[i].tag == tag) {
                free(n->fences[i].pages);
                n->fences[i] = n->fences[--n->n_fences];
                break;
            }
        }
        pthread_mutex_unlock(&n->fence_mu);
        /* writes of it that the fence let through before have landed once this returns: the
         * pages are the next attempt's, the decode's own or free from here on */
        ty_xfer_engine_fence_revoke(n->o.xfer, tag);
        return 0;
    } else if (n->n_fences == n->cap_fences &&
               !(n->cap_fences = n->cap_fences ? n->cap_fences * 2 : 64,
                 n->fences = realloc(n->fences, n->cap_fences * sizeof(*n->fences)))) {
        rc = TY_ENOMEM;
    } else {
        struct ty__fence *f = &n->fences[n->n_fences];
        f->tag = tag;
        f->n_pages = n_pages;
        f->pages = malloc((n_pages ? n_pages : 1) * sizeof(uint32_t));
        if (!f->pages) {
            rc = TY_ENOMEM;
        } else {
            memcpy(f->pages, pages, n_pages * sizeof(uint32_t));
            n->n_fences++;
        }
    }
    pthread_mutex_unlock(&n->fence_mu);
    return rc;
}

/* The KV pool's geometry, for the fence: where each layer's K and V page arrays lie. */
static int fence_geometry(ty_decode_node_t *n)
{
    ty_kvpool_t *pool = ty_engine_pool(n->o.engine);
    uint32_t L = ty_model_config(ty_engine_model(n->o.engine))->n_layers;
    n->kv_base = calloc(2 * (size_t)L, sizeof(uint64_t));
    if (!n->kv_base)
        return TY_ENOMEM;
    for (uint32_t l = 0; l < L; l++) {
        n->kv_base[2 * l] = (uint64_t)(uintptr_t)ty_kvpool_k(pool, l, 0);
        n->kv_base[2 * l + 1] = (uint64_t)(uintptr_t)ty_kvpool_v(pool, l, 0);
    }
    n->n_kv_arrays = 2 * L;
    n->page_bytes = ty_kvpool_page_bytes(pool);
    n->kv_span = (uint64_t)ty_kvpool_pages_total(pool) * n->page_bytes;
    return 0;
}

static const struct ty_node_handler handlers[] = {
    {TYCHO__V1__METHOD__METHOD_DECODE_ASSIGN, &tycho__v1__decode_assign__descriptor, on_assign},
    {TYCHO__V1__METHOD__METHOD_CANCEL, &tycho__v1__cancel__descriptor, on_cancel},
};

int ty_decode_node_new(ty_decode_node_t **out, const struct ty_decode_node_opts *opts)
{
    if (!out || !opts || !opts->loop || !opts->engine || !opts->xfer || !opts->node_id)
        return TY_EINVAL;
    ty_decode_node_t *n = calloc(1, sizeof(*n));
    if (!n || !(n->node_id = strdup(opts->node_id))) {
        free(n);
        return TY_ENOMEM;
    }
    n->o = *opts;
    n->o.rpc_host = NULL;
    n->o.node_id = n->node_id;
    if (!n->o.max_running)
        n->o.max_running = 64;
    if (!n->o.kv_wait_timeout_ms)
        n->o.kv_wait_timeout_ms = 30000;
    n->cmds_tail = &n->cmds;
    pthread_mutex_init(&n->mu, NULL);
    pthread_mutex_init(&n->fence_mu, NULL);
    pthread_condattr_t ca; /* the worker's KV deadlines are ty_clock_ms() (monotonic) */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&n->cv, &ca);
    pthread_condattr_destroy(&ca);
    struct ty_node_service_opts so = {.loop = opts->loop, .auth = opts->auth,
                                      .host = opts->rpc_host,
                                      .port = opts->rpc_port, .worker = ty__decode_node_worker,
                                      .stop = on_stop, .drained = on_drained,
                                      .closed = on_closed, .arg = n,
                                      .handlers = handlers,
                                      .n_handlers = sizeof(handlers) / sizeof(handlers[0])};
    n->kvstore = opts->kvstore;
    ty_xfer_notify_set_cb(n->o.xfer, on_notify, n); /* before the worker waits for it */
    int rc = fence_geometry(n);
    if (!rc)
        ty_xfer_engine_set_write_fence(n->o.xfer, fence_ok, n);
    if (!rc)
        rc = ty_node_service_new(&n->svc, &so);
    if (rc) {
        ty_xfer_notify_set_cb(n->o.xfer, NULL, NULL);
        ty_xfer_engine_set_write_fence(n->o.xfer, NULL, NULL);
        pthread_mutex_destroy(&n->fence_mu);
        free(n->kv_base);
        free(n->node_id);
        free(n);
        return rc;
    }
    n->mb = ty_node_service_mailbox(n->svc);
    *out = n;
    return 0;
}

/* Service hooks (loop thread): stop asks the worker to return; drained runs once it has (its
 * events all delivered); closed once the RPC server is closed. */
static void on_stop(void *arg)
{
    ty_decode_node_t *n = arg;
    pthread_mutex_lock(&n->mu);
    n->stop = true;
    pthread_cond_signal(&n->cv);
    pthread_mutex_unlock(&n->mu);
}

static void on_drained(void *arg)
{
    ty_decode_node_t *n = arg;
    ty_xfer_notify_set_cb(n->o.xfer, NULL, NULL); /* no callback runs once this returns */
    ty_xfer_engine_set_write_fence(n->o.xfer, NULL, NULL); /* nor the fence */
    for (struct lreq *r = n->reqs; r; r = r->next) {
        if (r->stream) {
            ty_rpc_call_fail(r->stream, TY_ESHUTDOWN, "decode node shutting down");
            r->stream = NULL;
        }
    }
}

static void on_closed(void *arg)
{
    ty_decode_node_t *n = arg;
    void (*cb)(void *) = n->close_cb;
    void *cb_arg = n->close_arg;
    while (n->reqs)
        lreq_free(n, n->reqs);
    pthread_mutex_destroy(&n->mu);
    pthread_mutex_destroy(&n->fence_mu);
    for (size_t i = 0; i < n->n_fences; i++)
        free(n->fences[i].pages);
    free(n->fences);
    free(n->kv_base);
    pthread_cond_destroy(&n->cv);
    free(n->node_id);
    free(n);
    if (cb)
        cb(cb_arg);
}

void ty_decode_node_close(ty_decode_node_t *n, void (*cb)(void *arg), void *arg)
{
    n->close_cb = cb;
    n->close_arg = arg;
    ty_node_service_close(n->svc);
}
