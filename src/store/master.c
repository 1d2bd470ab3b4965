/* The pool's master service: RPC handlers over the pure metadata, a tick that sends jobs and
 * index updates to nodes and events to subscribers (store.h). Loop thread only. */
#include "store-impl.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/rpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mnode {
    bool used;
    char name[TY_STORE_NODE_NAME_MAX + 1];
    char segment[TY_XFER_NAME_MAX + 1];
    uint64_t base;
    ty_rpc_client_t *rpc;
    struct ty_store_event *idx; /* index updates not yet sent to the node */
    size_t n_idx, cap_idx;
};

struct sub {
    ty_rpc_call_t *call;
    struct sub *next;
};

struct ty_store_master {
    uv_loop_t *loop;
    const struct ty_auth *auth;
    ty_rpc_server_t *srv;
    ty_store_meta_t *meta;
    uv_timer_t tick;
    uint32_t tick_ms;
    uint64_t epoch;
    struct mnode *nodes; /* indexed by meta node id */
    uint32_t n_nodes;
    struct sub *subs;
    int closing; /* handles still to close */
    ty_store_closed_cb closed_cb;
    void *closed_arg;
};

struct job_ctx {
    ty_store_master_t *m;
    uint64_t id;
};

static struct mnode *mnode_get(ty_store_master_t *m, uint32_t id)
{
    if (id >= m->n_nodes) {
        uint32_t nn = id + 8;
        m->nodes = realloc(m->nodes, nn * sizeof(*m->nodes));
        TY_ASSERT(m->nodes != NULL);
        memset(m->nodes + m->n_nodes, 0, (nn - m->n_nodes) * sizeof(*m->nodes));
        m->n_nodes = nn;
    }
    return &m->nodes[id];
}

static void fill_replica(ty_store_master_t *m, const struct ty_store_replica *r, PB(Replica) * out)
{
    PB_FN(replica__init)(out);
    struct mnode *n = mnode_get(m, r->node);
    out->node = r->node;
    out->segment = n->segment;
    out->tier = r->tier == TY_STORE_TIER_DRAM ? TYCHO__STORE__V1__TIER__TIER_DRAM
                                              : TYCHO__STORE__V1__TIER__TIER_SSD;
    out->addr = n->base + r->offset;
    out->length = r->length;
}

static void reply_statuses(ty_rpc_call_t *call, int32_t *st, size_t n, uint64_t epoch)
{
    PB(Statuses) msg = PB_INIT(STATUSES);
    msg.n_status = n;
    msg.status = st;
    msg.epoch = epoch;
    ty_rpc_call_reply_msg(call, &msg.base);
}

/* ---- client methods ----------------------------------------------------------------------- */

static void h_put_start(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_store_master_t *m = arg;
    const PB(PutStart) *req = msg;
    uint64_t now = ty_clock_ms();
    size_t n = req->n_items;
    PB(PutSlot) *slots = calloc(n ? n : 1, sizeof(*slots));
    PB(PutSlot) **sp = calloc(n ? n : 1, sizeof(*sp));
    PB(Replica) *reps = calloc((n ? n : 1) * TY_STORE_REPLICAS_MAX, sizeof(*reps));
    PB(Replica) **rp = calloc((n ? n : 1) * TY_STORE_REPLICAS_MAX, sizeof(*rp));
    TY_ASSERT(slots && sp && reps && rp);
    const char *writer = req->writer && *req->writer ? req->writer : NULL;
    for (size_t i = 0; i < n; i++) {
        struct ty_store_placement pl;
        PB_FN(put_slot__init)(&slots[i]);
        sp[i] = &slots[i];
        slots[i].status =
            ty_store_meta_put_start(m->meta, req->items[i]->key, req->items[i]->length,
                                    req->items[i]->replicas, writer, now, &pl);
        if (slots[i].status != 0)
            continue;
        slots[i].replicas = &rp[i * TY_STORE_REPLICAS_MAX];
        for (uint32_t r = 0; r < pl.n; r++) {
            PB(Replica) *x = &reps[i * TY_STORE_REPLICAS_MAX + r];
            fill_replica(m, &pl.r[r], x);
            slots[i].replicas[r] = x;
        }
        slots[i].n_replicas = pl.n;
    }
    PB(PutStartReply) rep = PB_INIT(PUT_START_REPLY);
    rep.n_slots = n;
    rep.slots = sp;
    ty_rpc_call_reply_msg(call, &rep.base);
    free(slots);
    free(sp);
    free(reps);
    free(rp);
}

static void h_put_commit(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_store_master_t *m = arg;
    const PB(PutCommit) *req = msg;
    uint64_t now = ty_clock_ms();
    int32_t *st = calloc(req->n_items + 1, sizeof(*st));
    TY_ASSERT(st != NULL);
    for (size_t i = 0; i < req->n_items; i++) {
        PB(CommitItem) *it = req->items[i];
        st[i] = it->abort ? ty_store_meta_put_abort(m->meta, it->key)
                          : ty_store_meta_put_commit(m->meta, it->key, it->checksum, now);
    }
    reply_statuses(call, st, req->n_items, m->epoch);
    free(st);
}

static void get_one(ty_store_master_t *m, const char *key, uint64_t now, PB(GetSlot) * s,
                    PB(Replica) * reps, PB(Replica) * *rp)
{
    struct ty_store_placement pl;
    uint64_t until = 0;
    PB_FN(get_slot__init)(s);
    s->status = ty_store_meta_get(m->meta, key, now, &pl, &until);
    if (s->status != 0)
        return;
    s->lease_ms = until > now ? until - now : 0;
    s->replicas = rp;
    for (uint32_t r = 0; r < pl.n; r++) {
        if (pl.r[r].tier != TY_STORE_TIER_DRAM)
            continue; /* clients read DRAM only; SSD blocks come back through a load */
        s->length = pl.r[r].length;
        s->checksum = pl.r[r].checksum;
        fill_replica(m, &pl.r[r], &reps[s->n_replicas]);
        rp[s->n_replicas] = &reps[s->n_replicas];
        s->n_replicas++;
    }
}

static void h_get(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_store_master_t *m = arg;
    const PB(Get) *req = msg;
    uint64_t now = ty_clock_ms();
    size_t n = req->n_keys ? req->n_keys : 1;
    PB(GetSlot) *slots = calloc(n, sizeof(*slots));
    PB(GetSlot) **sp = calloc(n, sizeof(*sp));
    PB(Replica) *reps = calloc(n * TY_STORE_REPLICAS_MAX, sizeof(*reps));
    PB(Replica) **rp = calloc(n * TY_STORE_REPLICAS_MAX, sizeof(*rp));
    TY_ASSERT(slots && sp && reps && rp);
    for (size_t i = 0; i < req->n_keys; i++) {
        get_one(m, req->keys[i], now, &slots[i], &reps[i * TY_STORE_REPLICAS_MAX],
                &rp[i * TY_STORE_REPLICAS_MAX]);
        sp[i] = &slots[i];
    }
    PB(GetReply) rep = PB_INIT(GET_REPLY);
    rep.n_slots = req->n_keys;
    rep.slots = sp;
    ty_rpc_call_reply_msg(call, &rep.base);
    free(slots);
    free(sp);
    free(reps);
    free(rp);
}

static int keys_one(ty_store_master_t *m, const PB(KeysOp) * req, const char *key, uint64_t now)
{
    switch (req->op) {
    case TYCHO__STORE__V1__KEYS_OP_KIND__KEYS_OP_EXISTS:
        return ty_store_meta_exists(m->meta, key) ? 0 : TY_ENOTFOUND;
    case TYCHO__STORE__V1__KEYS_OP_KIND__KEYS_OP_REMOVE:
        return ty_store_meta_remove(m->meta, key, now);
    case TYCHO__STORE__V1__KEYS_OP_KIND__KEYS_OP_PIN:
        return ty_store_meta_pin(m->meta, key);
    case TYCHO__STORE__V1__KEYS_OP_KIND__KEYS_OP_UNPIN:
        return ty_store_meta_unpin(m->meta, key);
    case TYCHO__STORE__V1__KEYS_OP_KIND__KEYS_OP_SET_REPLICAS:
        return ty_store_meta_set_replicas(m->meta, key, req->replicas);
    default:
        return TY_EINVAL;
    }
}

static void h_keys(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_store_master_t *m = arg;
    const PB(KeysOp) *req = msg;
    uint64_t now = ty_clock_ms();
    int32_t *st = calloc(req->n_keys + 1, sizeof(*st));
    TY_ASSERT(st != NULL);
    for (size_t i = 0; i < req->n_keys; i++)
        st[i] = keys_one(m, req, req->keys[i], now);
    reply_statuses(call, st, req->n_keys, m->epoch);
    free(st);
}

static void sub_cancel(ty_rpc_call_t *call, int reason, void *arg)
{
    ty_store_master_t *m = arg;
    for (struct sub **pp = &m->subs; *pp; pp = &(*pp)->next)
        if ((*pp)->call == call) {
            struct sub *s = *pp;
            *pp = s->next;
            free(s);
            break;
        }
    ty_rpc_call_end(call);
}

static void send_events(ty_store_master_t *m, const struct ty_store_event *ev, size_t n,
                        ty_rpc_client_t *to, ty_rpc_call_t *stream);

/* A subscription's snapshot, sent in frames of 4096 events. */
struct snap {
    ty_store_master_t *m;
    ty_rpc_call_t *call;
    struct ty_store_event ev[256];
    size_t n;
};

static void snap_one(void *arg, const struct ty_store_event *ev)
{
    struct snap *sn = arg;
    sn->ev[sn->n++] = *ev;
    if (sn->n == sizeof(sn->ev) / sizeof(sn->ev[0])) {
        send_events(sn->m, sn->ev, sn->n, NULL, sn->call);
        sn->n = 0;
    }
}

/* Events from now on; with `snapshot`, first the replicas held now (the events still queued
 * may repeat some of them: a subscriber applies them to a set). */
static void h_subscribe(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_store_master_t *m = arg;
    const PB(Subscribe) *req = msg;
    if (req->snapshot) {
        struct snap *sn = malloc(sizeof(*sn));
        TY_ASSERT(sn != NULL);
        sn->m = m;
        sn->call = call;
        sn->n = 0;
        ty_store_meta_snapshot(m->meta, req->key_prefix, snap_one, sn);
        if (sn->n)
            send_events(m, sn->ev, sn->n, NULL, call);
        free(sn);
    }
    struct sub *s = calloc(1, sizeof(*s));
    TY_ASSERT(s != NULL);
    s->call = call;
    s->next = m->subs;
    m->subs = s;
    ty_rpc_call_set_cancel_cb(call, sub_cancel, m);
}

/* The request is an empty Subscribe. */
static void h_stats(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_store_master_t *m = arg;
    struct ty_store_meta_stats st;
    ty_store_meta_stats(m->meta, &st);
    PB(Stats) r = PB_INIT(STATS);
    r.objects = st.objects;
    r.pending_puts = st.pending_puts;
    r.nodes_alive = st.nodes_alive;
    r.dram_bytes = st.dram_bytes;
    r.dram_used = st.dram_used;
    r.evictions = st.evictions;
    r.offloads = st.offloads;
    r.expired_puts = st.expired_puts;
    r.dead_nodes = st.dead_nodes;
    r.hot_blocks = st.hot_blocks;
    r.replications_started = st.replications_started;
    r.replications_done = st.replications_done;
    r.replications_failed = st.replications_failed;
    r.cold_evictions = st.cold_evictions;
    r.epoch = m->epoch;
    ty_rpc_call_reply_msg(call, &r.base);
}

/* ---- node methods --------------------------------------------------------------------------- */

static void mnode_clear(struct mnode *n)
{
    if (n->rpc)
        ty_rpc_client_close(n->rpc, NULL, NULL);
    free(n->idx);
    memset(n, 0, sizeof(*n));
}

static int node_connect(ty_store_master_t *m, struct mnode *n, const PB(NodeRegister) * req)
{
    struct ty_rpc_client_opts o = {.loop = m->loop,
                                   .host = req->rpc_host,
                                   .port = (uint16_t)req->rpc_port,
                                   .call_timeout_ms = 30000,
                                   .backoff_max_ms = 1000,
                                   .auth = m->auth};
    return ty_rpc_client_new(&n->rpc, &o);
}

static uint32_t announce_all(ty_store_master_t *m, uint32_t id, const PB(NodeRegister) * req,
                             uint64_t now)
{
    uint32_t ok = 0;
    for (size_t i = 0; i < req->n_blocks; i++) {
        const PB(Block) *b = req->blocks[i];
        enum ty_store_tier t =
            b->tier == TYCHO__STORE__V1__TIER__TIER_SSD ? TY_STORE_TIER_SSD : TY_STORE_TIER_DRAM;
        int rc = ty_store_meta_node_announce(m->meta, id, b->key, t, b->offset, b->length,
                                             b->checksum, now);
        if (rc == 0)
            ok++;
        else
            TY_LOG_DEBUG("store", "node %s: block %s not taken: %s", req->name, b->key,
                         ty_strerror(rc));
    }
    return ok;
}

static int node_register(ty_store_master_t *m, const PB(NodeRegister) * req, uint32_t *id,
                         uint32_t *announced)
{
    if (!req->name || !*req->name || !req->segment || !*req->segment ||
        strlen(req->segment) > TY_XFER_NAME_MAX || !req->rpc_host || req->rpc_port == 0 ||
        req->rpc_port > 65535)
        return TY_EINVAL;
    for (uint32_t i = 0; i < m->n_nodes; i++) /* a restart: forget the old incarnation */
        if (m->nodes[i].used && strcmp(m->nodes[i].name, req->name) == 0)
            mnode_clear(&m->nodes[i]);
    uint64_t now = ty_clock_ms();
    int rc = ty_store_meta_node_add(m->meta, req->name, req->dram_bytes, req->has_ssd, now, id);
    if (rc != 0)
        return rc;
    struct mnode *n = mnode_get(m, *id);
    mnode_clear(n);
    rc = node_connect(m, n, req);
    if (rc != 0) {
        ty_store_meta_node_remove(m->meta, *id);
        return rc;
    }
    n->used = true;
    snprintf(n->name, sizeof(n->name), "%s", req->name);
    snprintf(n->segment, sizeof(n->segment), "%s", req->segment);
    n->base = req->base_addr;
    *announced = announce_all(m, *id, req, now);
    TY_LOG_INFO("store", "node %s registered as %u: segment %s, %llu MiB DRAM%s, %u blocks",
                n->name, *id, n->segment, (unsigned long long)(req->dram_bytes >> 20),
                req->has_ssd ? " + SSD" : "", *announced);
    return 0;
}

static void h_node_register(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_store_master_t *m = arg;
    const PB(NodeRegister) *req = msg;
    PB(NodeRegisterReply) rep = PB_INIT(NODE_REGISTER_REPLY);
    uint32_t id = 0, announced = 0;
    rep.status = node_register(m, req, &id, &announced);
    rep.node_id = id;
    rep.epoch = m->epoch;
    rep.announced = announced;
    ty_rpc_call_reply_msg(call, &rep.base);
}

static void h_node_heartbeat(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_store_master_t *m = arg;
    const PB(NodeHeartbeat) *req = msg;
    int32_t st = req->epoch == m->epoch
                     ? ty_store_meta_node_heartbeat(m->meta, req->node_id, ty_clock_ms())
                     : TY_ESTALE;
    for (size_t i = 0; st == 0 && i < req->n_ssd_dropped; i++)
        ty_store_meta_replica_lost(m->meta, req->node_id, req->ssd_dropped[i], TY_STORE_TIER_SSD);
    reply_statuses(call, &st, 1, m->epoch);
}

/* ---- tick: jobs, events, index updates ----------------------------------------------------- */

static void on_job_reply(const struct ty_rpc_result *res, void *arg)
{
    struct job_ctx *ctx = arg;
    int status = res->status;
    uint64_t result = 0;
    if (res->event == TY_RPC_EVENT_REPLY) {
        PB(JobReply) *r = PB_FN(job_reply__unpack)(NULL, res->len, res->payload);
        status = r ? r->status : TY_EBADMSG;
        result = r ? r->result : 0;
        if (r)
            PB_FN(job_reply__free_unpacked)(r, NULL);
    } else if (status == TY_EREMOTE) {
        status = res->remote_code ? res->remote_code : TY_EREMOTE;
    }
    ty_store_meta_job_done(ctx->m->meta, ctx->id, status, result, ty_clock_ms());
    free(ctx);
}

static void send_jobs(ty_store_master_t *m, uint64_t now)
{
    struct ty_store_job j;
    while (ty_store_meta_job_next(m->meta, &j) == 0) {
        struct mnode *n = j.node < m->n_nodes ? &m->nodes[j.node] : NULL;
        if (!n || !n->used || !n->rpc) {
            ty_store_meta_job_done(m->meta, j.id, TY_EUNAVAIL, 0, now);
            continue;
        }
        PB(Job) msg = PB_INIT(JOB);
        msg.id = j.id;
        msg.kind = (PB(JobKind))j.kind;
        msg.key = j.key;
        msg.src_offset = j.src_offset;
        msg.dst_offset = j.dst_offset;
        msg.length = j.length;
        msg.checksum = j.checksum;
        if (j.kind == TY_STORE_JOB_REPLICATE) {
            struct mnode *src = mnode_get(m, j.src_node);
            msg.src_segment = src->segment;
            msg.src_addr = src->base + j.src_offset;
        }
        struct job_ctx *ctx = malloc(sizeof(*ctx));
        TY_ASSERT(ctx != NULL);
        *ctx = (struct job_ctx){.m = m, .id = j.id};
        if (ty_rpc_client_call_msg(n->rpc, SM_NODE_JOB, &msg.base, NULL, on_job_reply, ctx, NULL) !=
            0) {
            free(ctx);
            ty_store_meta_job_done(m->meta, j.id, TY_ERPC, 0, now);
        }
    }
}

static void event_to_pb(ty_store_master_t *m, const struct ty_store_event *e, PB(Event) * out)
{
    PB_FN(event__init)(out);
    out->kind = e->kind == TY_STORE_EVENT_STORED ? TYCHO__STORE__V1__EVENT_KIND__EVENT_KIND_STORED
                                                 : TYCHO__STORE__V1__EVENT_KIND__EVENT_KIND_REMOVED;
    out->key = (char *)e->key;
    out->node = e->node < m->n_nodes ? m->nodes[e->node].name : "";
    out->tier = e->tier == TY_STORE_TIER_SSD ? TYCHO__STORE__V1__TIER__TIER_SSD
                                             : TYCHO__STORE__V1__TIER__TIER_DRAM;
    out->offset = e->offset;
    out->length = e->length;
    out->checksum = e->checksum;
}

static void on_index_reply(const struct ty_rpc_result *res, void *arg)
{
    if (res->event == TY_RPC_EVENT_ERROR)
        TY_LOG_WARN("store", "index update to a node failed: %s", ty_strerror(res->status));
}

static void send_events(ty_store_master_t *m, const struct ty_store_event *ev, size_t n,
                        ty_rpc_client_t *to, ty_rpc_call_t *stream)
{
    PB(Event) *pe = calloc(n, sizeof(*pe));
    PB(Event) **pp = calloc(n, sizeof(*pp));
    TY_ASSERT(pe && pp);
    for (size_t i = 0; i < n; i++) {
        event_to_pb(m, &ev[i], &pe[i]);
        pp[i] = &pe[i];
    }
    PB(Events) msg = PB_INIT(EVENTS);
    msg.n_events = n;
    msg.events = pp;
    if (to)
        ty_rpc_client_call_msg(to, SM_NODE_INDEX, &msg.base, NULL, on_index_reply, NULL, NULL);
    else
        ty_rpc_call_stream_msg(stream, &msg.base);
    free(pe);
    free(pp);
}

static void dispatch_events(ty_store_master_t *m)
{
    struct ty_store_event ev[256];
    size_t n;
    while ((n = ty_store_meta_events_take(m->meta, ev, 256)) > 0) {
        for (struct sub *s = m->subs; s; s = s->next)
            send_events(m, ev, n, NULL, s->call);
        for (size_t i = 0; i < n; i++) {
            struct mnode *nd = ev[i].node < m->n_nodes ? &m->nodes[ev[i].node] : NULL;
            if (!nd || !nd->used)
                continue;
            if (nd->n_idx == nd->cap_idx) {
                nd->cap_idx = nd->cap_idx ? nd->cap_idx * 2 : 64;
                nd->idx = realloc(nd->idx, nd->cap_idx * sizeof(*nd->idx));
                TY_ASSERT(nd->idx != NULL);
            }
            nd->idx[nd->n_idx++] = ev[i];
        }
    }
    for (uint32_t i = 0; i < m->n_nodes; i++) {
        struct mnode *nd = &m->nodes[i];
        for (size_t k = 0; nd->used && nd->rpc && k < nd->n_idx; k += 4096)
            send_events(m, nd->idx + k, nd->n_idx - k < 4096 ? nd->n_idx - k : 4096, nd->rpc, NULL);
        nd->n_idx = 0;
    }
}

static void on_tick(uv_timer_t *t)
{
    ty_store_master_t *m = t->data;
    uint64_t now = ty_clock_ms();
    ty_store_meta_tick(m->meta, now);
    for (uint32_t i = 0; i < m->n_nodes; i++) { /* nodes the metadata declared dead */
        struct ty_store_node_info ni;
        if (m->nodes[i].used && ty_store_meta_node_info(m->meta, i, &ni) != 0)
            mnode_clear(&m->nodes[i]);
    }
    send_jobs(m, now);
    dispatch_events(m);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static const struct {
    uint16_t method;
    const ProtobufCMessageDescriptor *req;
    ty_rpc_msg_cb cb;
} routes[] = {
    {SM_PUT_START, &PB_FN(put_start__descriptor), h_put_start},
    {SM_PUT_COMMIT, &PB_FN(put_commit__descriptor), h_put_commit},
    {SM_GET, &PB_FN(get__descriptor), h_get},
    {SM_KEYS, &PB_FN(keys_op__descriptor), h_keys},
    {SM_SUBSCRIBE, &PB_FN(subscribe__descriptor), h_subscribe},
    {SM_STATS, &PB_FN(subscribe__descriptor), h_stats},
    {SM_NODE_REGISTER, &PB_FN(node_register__descriptor), h_node_register},
    {SM_NODE_HEARTBEAT, &PB_FN(node_heartbeat__descriptor), h_node_heartbeat},
};

int ty_store_master_new(ty_store_master_t **out, const struct ty_store_master_opts *opts)
{
    if (!opts || !opts->loop)
        return TY_EINVAL;
    ty_store_master_t *m = calloc(1, sizeof(*m));
    TY_ASSERT(m != NULL);
    m->loop = opts->loop;
    m->auth = opts->auth;
    m->tick_ms = opts->tick_ms ? opts->tick_ms : 10;
    m->epoch = opts->epoch ? opts->epoch : ty_wall_ms();
    int rc = ty_store_meta_new(&m->meta, &opts->meta);
    if (rc != 0)
        goto err_free;
    struct ty_rpc_server_opts so = {
        .loop = m->loop, .host = opts->host, .port = opts->port, .auth = m->auth};
    rc = ty_rpc_server_new(&m->srv, &so);
    if (rc != 0)
        goto err_meta;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        ty_rpc_server_handle_msg(m->srv, routes[i].method, routes[i].req, routes[i].cb, m);
    uv_timer_init(m->loop, &m->tick);
    m->tick.data = m;
    uv_timer_start(&m->tick, on_tick, m->tick_ms, m->tick_ms);
    TY_LOG_INFO("store", "master listening on port %u (epoch %llu, %s eviction)",
                ty_rpc_server_port(m->srv), (unsigned long long)m->epoch,
                ty_store_policy_name(opts->meta.policy));
    *out = m;
    return 0;
err_meta:
    ty_store_meta_free(m->meta);
err_free:
    free(m);
    return rc;
}

void ty_store_master_stats(const ty_store_master_t *m, struct ty_store_meta_stats *out)
{
    ty_store_meta_stats(m->meta, out);
}

int ty_store_master_node_info(const ty_store_master_t *m, uint32_t id,
                              struct ty_store_node_info *out)
{
    if (id >= ty_store_meta_node_slots(m->meta))
        return TY_EINVAL;
    return ty_store_meta_node_info(m->meta, id, out);
}

uint16_t ty_store_master_port(const ty_store_master_t *m)
{
    return ty_rpc_server_port(m->srv);
}

static void master_closed_one(ty_store_master_t *m)
{
    if (--m->closing > 0)
        return;
    ty_store_meta_free(m->meta);
    free(m->nodes);
    ty_store_closed_cb cb = m->closed_cb;
    void *arg = m->closed_arg;
    free(m);
    if (cb)
        cb(arg);
}

static void on_timer_closed(uv_handle_t *h)
{
    master_closed_one(h->data);
}
static void on_srv_closed(void *arg)
{
    master_closed_one(arg);
}

void ty_store_master_close(ty_store_master_t *m, ty_store_closed_cb cb, void *arg)
{
    m->closed_cb = cb;
    m->closed_arg = arg;
    m->closing = 2;
    for (uint32_t i = 0; i < m->n_nodes; i++)
        mnode_clear(&m->nodes[i]); /* pending jobs complete (canceled) before this returns */
    while (m->subs) {
        struct sub *s = m->subs;
        m->subs = s->next;
        ty_rpc_call_end(s->call);
        free(s);
    }
    uv_timer_stop(&m->tick);
    uv_close((uv_handle_t *)&m->tick, on_timer_closed);
    ty_rpc_server_close(m->srv, on_srv_closed, m);
}
