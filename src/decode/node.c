/* The decode node's loop side (node-impl.h): DecodeAssign, TokenStreamOpen and Cancel
 * handlers, and the delivery of the worker's events: assign replies, and tokens as TokenChunk
 * stream items (held until the Conductor opens the stream), the last one with its finish
 * reason, after which the stream ends. */
#include "node-impl.h"

#include "tycho/errors.h"
#include "tycho/proto.h"
#include "tycho/log.h"

#include <stdlib.h>
#include <string.h>

void ty__dcmd_free(struct dcmd *c)
{
    if (c) {
        free(c->prompt);
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
    for (size_t i = 0; i < r->n_held; i++)
        free(r->held[i]);
    free(r->held);
    free(r);
}

/* Send one event on the open stream; true when it was the last. */
static bool send_event(struct lreq *r, const struct devent *ev)
{
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
    if (ev->finish == TYCHO__V1__FINISH_REASON__FINISH_REASON_ERROR) {
        ty_rpc_call_fail(r->stream, ev->rc, "decode of request %llu failed: %s",
                         (unsigned long long)r->rid, ty_strerror(ev->rc));
        return true;
    }
    ty_rpc_call_stream_msg(r->stream, (const ProtobufCMessage *)&ch);
    if (ev->finish == TYCHO__V1__FINISH_REASON__FINISH_REASON_NONE)
        return false;
    ty_rpc_call_end(r->stream);
    return true;
}

static void on_assign_event(ty_decode_node_t *n, struct devent *ev)
{
    if (ev->rc) {
        ty_rpc_call_fail(ev->call, ev->rc, "cannot take request %llu: %s",
                         (unsigned long long)ev->rid, ty_strerror(ev->rc));
        return;
    }
    if (ev->rearm) { /* the loop knows the request already */
        ty_rpc_call_reply(ev->call, ev->reply, ev->reply_len);
        return;
    }
    struct lreq *r = calloc(1, sizeof(*r));
    if (r) {
        r->rid = ev->rid;
        r->next = n->reqs;
        n->reqs = r;
    }
    if (!r || ty_rpc_call_reply(ev->call, ev->reply, ev->reply_len)) {
        struct dcmd *c = calloc(1, sizeof(*c)); /* nobody will read it: let go */
        if (c) {
            c->kind = DCMD_CANCEL;
            c->rid = ev->rid;
            push_cmd(n, c);
        }
    }
}

static void on_event(void *arg)
{
    struct devent *ev = arg;
    ty_decode_node_t *n = ev->n;
    if (ev->call) {
        on_assign_event(n, ev);
        free(ev->reply);
        free(ev);
        return;
    }
    struct lreq *r = lreq_find(n, ev->rid);
    if (!r) {
        free(ev);
        return;
    }
    if (!r->stream) {
        if (r->n_held == r->cap_held) {
            size_t cap = r->cap_held ? 2 * r->cap_held : 8;
            struct devent **h = realloc(r->held, cap * sizeof(*h));
            if (!h) {
                free(ev);
                return;
            }
            r->held = h;
            r->cap_held = cap;
        }
        r->held[r->n_held++] = ev;
        return;
    }
    bool last = send_event(r, ev);
    free(ev);
    if (last)
        lreq_free(n, r);
}

void ty__decode_node_post(ty_decode_node_t *n, struct devent *ev)
{
    if (ty_rpc_mailbox_post(n->mb, on_event, ev)) {
        free(ev->reply);
        free(ev);
    }
}

/* ---- RPC handlers --------------------------------------------------------------------------- */

static int assign_build(ty_decode_node_t *n, const Tycho__V1__DecodeAssign *m,
                        struct dcmd **out, char *why, size_t cap)
{
    uint32_t V = ty_model_config(ty_engine_model(n->o.engine))->n_vocab;
    if (m->attempt > 1) { /* its prefill node was lost: the worker says if it still waits */
        if (!lreq_find(n, m->request_id))
            return snprintf(why, cap, "request %llu is not assigned here",
                            (unsigned long long)m->request_id), TY_ENOTFOUND;
        struct dcmd *c = calloc(1, sizeof(*c));
        if (!c)
            return TY_ENOMEM;
        c->kind = DCMD_REARM;
        c->rid = m->request_id;
        c->attempt = m->attempt;
        *out = c;
        return 0;
    }
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
    c->n_prompt = (uint32_t)m->n_prompt_token_ids;
    memcpy(c->prompt, m->prompt_token_ids, c->n_prompt * sizeof(uint32_t));
    struct ty_gen_params ends = {0};
    int rc = ty_pb_sampling_unpack(m->sampling, V, &c->sp, why, cap);
    if (!rc)
        rc = ty_pb_ends_unpack(m->sampling, V, &ends, why, cap);
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

static void on_assign(ty_rpc_call_t *call, const uint8_t *payload, size_t len, void *arg)
{
    ty_decode_node_t *n = arg;
    Tycho__V1__DecodeAssign *m = tycho__v1__decode_assign__unpack(NULL, len, payload);
    char why[256] = "undecodable DecodeAssign";
    struct dcmd *c = NULL;
    int rc = m ? assign_build(n, m, &c, why, sizeof(why)) : TY_EBADMSG;
    if (m)
        tycho__v1__decode_assign__free_unpacked(m, NULL);
    if (rc) {
        TY_LOG_WARN("decode", "DecodeAssign refused: %s", why);
        ty_rpc_call_fail(call, rc, "%s", why);
        return;
    }
    c->call = call;
    push_cmd(n, c);
}

static void on_stream_cancel(ty_rpc_call_t *call, int reason, void *arg)
{
    ty_decode_node_t *n = arg;
    (void)reason;
    for (struct lreq *r = n->reqs; r; r = r->next) {
        if (r->stream == call) {
            struct dcmd *c = calloc(1, sizeof(*c));
            if (c) {
                c->kind = DCMD_CANCEL;
                c->rid = r->rid;
                push_cmd(n, c);
            }
        }
    }
}

static void on_stream_open(ty_rpc_call_t *call, const uint8_t *payload, size_t len, void *arg)
{
    ty_decode_node_t *n = arg;
    Tycho__V1__TokenStreamOpen *m = tycho__v1__token_stream_open__unpack(NULL, len, payload);
    struct lreq *r = m ? lreq_find(n, m->request_id) : NULL;
    if (!r || r->stream) {
        ty_rpc_call_fail(call, m ? TY_ENOTFOUND : TY_EBADMSG, "no such request %llu",
                         m ? (unsigned long long)m->request_id : 0ull);
        if (m)
            tycho__v1__token_stream_open__free_unpacked(m, NULL);
        return;
    }
    tycho__v1__token_stream_open__free_unpacked(m, NULL);
    r->stream = call;
    ty_rpc_call_set_cancel_cb(call, on_stream_cancel, n);
    bool last = false;
    for (size_t i = 0; i < r->n_held; i++) {
        if (!last)
            last = send_event(r, r->held[i]);
        free(r->held[i]);
    }
    r->n_held = 0;
    if (last)
        lreq_free(n, r);
}

static void on_cancel(ty_rpc_call_t *call, const uint8_t *payload, size_t len, void *arg)
{
    ty_decode_node_t *n = arg;
    Tycho__V1__Cancel *m = tycho__v1__cancel__unpack(NULL, len, payload);
    if (!m) {
        ty_rpc_call_fail(call, TY_EBADMSG, "undecodable Cancel");
        return;
    }
    struct dcmd *c = calloc(1, sizeof(*c));
    if (c) {
        c->kind = DCMD_CANCEL;
        c->rid = m->request_id;
        push_cmd(n, c);
    }
    Tycho__V1__Ack a = TYCHO__V1__ACK__INIT;
    a.request_id = m->request_id;
    tycho__v1__cancel__free_unpacked(m, NULL);
    ty_rpc_call_reply_msg(call, (const ProtobufCMessage *)&a);
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
    return ty_rpc_server_port(n->srv);
}

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
    pthread_cond_init(&n->cv, NULL);
    struct ty_rpc_server_opts so = {.loop = opts->loop, .host = opts->rpc_host,
                                    .port = opts->rpc_port, .max_frame_size = 64u << 20};
    int rc = 0;
    if (opts->store) {
        ty_kvpool_t *pool = ty_engine_pool(opts->engine);
        struct ty_node_kvstore_opts ko = {
            .client = opts->store, .pool = pool,
            .n_layers = ty_model_config(ty_engine_model(opts->engine))->n_layers,
            .hash_seed = ty_kvpool_hash_seed(pool), .retry_ms = opts->store_retry_ms};
        rc = ty_node_kvstore_new(&n->kvstore, &ko);
    }
    if (!rc)
        rc = ty_rpc_mailbox_new(&n->mb, opts->loop);
    if (!rc && (rc = ty_rpc_server_new(&n->srv, &so)))
        n->srv = NULL;
    if (!rc && pthread_create(&n->thread, NULL, ty__decode_node_worker, n))
        rc = TY_ENOMEM;
    if (rc) {
        if (n->srv)
            ty_rpc_server_close(n->srv, NULL, NULL);
        if (n->mb)
            ty_rpc_mailbox_close(n->mb, NULL, NULL);
        ty_node_kvstore_free(n->kvstore);
        free(n->node_id);
        free(n);
        return rc;
    }
    ty_rpc_server_handle(n->srv, TYCHO__V1__METHOD__METHOD_DECODE_ASSIGN, on_assign, n);
    ty_rpc_server_handle(n->srv, TYCHO__V1__METHOD__METHOD_TOKEN_STREAM, on_stream_open, n);
    ty_rpc_server_handle(n->srv, TYCHO__V1__METHOD__METHOD_CANCEL, on_cancel, n);
    *out = n;
    return 0;
}

static void on_server_closed(void *arg)
{
    ty_decode_node_t *n = arg;
    void (*cb)(void *) = n->close_cb;
    void *cb_arg = n->close_arg;
    while (n->reqs)
        lreq_free(n, n->reqs);
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    ty_node_kvstore_free(n->kvstore); /* its writer finishes what is queued */
    free(n->node_id);
    free(n);
    if (cb)
        cb(cb_arg);
}

static void on_mailbox_closed(void *arg)
{
    ty_decode_node_t *n = arg;
    for (struct lreq *r = n->reqs; r; r = r->next) {
        if (r->stream) {
            ty_rpc_call_fail(r->stream, TY_ESHUTDOWN, "decode node shutting down");
            r->stream = NULL;
        }
    }
    ty_rpc_server_close(n->srv, on_server_closed, n);
}

void ty_decode_node_close(ty_decode_node_t *n, void (*cb)(void *arg), void *arg)
{
    n->close_cb = cb;
    n->close_arg = arg;
    pthread_mutex_lock(&n->mu);
    n->stop = true;
    pthread_cond_signal(&n->cv);
    pthread_mutex_unlock(&n->mu);
    pthread_join(n->thread, NULL);
    ty_rpc_mailbox_close(n->mb, on_mailbox_closed, n);
}
