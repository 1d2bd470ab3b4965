/* A pool node: DRAM segment + optional SSD tier, registration and heartbeats to the master,
 * and the master's jobs (offload, load, replicate) on libuv's thread pool (store.h). */
#include "keymap-impl.h"
#include "store-impl.h"

#include "tycho/clock.h"
#include "tycho/config.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/rpc.h"
#include "tycho/xxh3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MASTERS_MAX 8

struct blk { /* a DRAM block the master told us about: announced again after a master change */
    struct ty__store_kent k; /* first: kent pointers convert to blk */
    uint64_t offset, length, checksum;
};

struct ty_store_node {
    uv_loop_t *loop;
    const struct ty_auth *auth;
    char name[TY_STORE_NODE_NAME_MAX + 1];
    char host[64];
    ty_xfer_engine_t *xfer;
    uint8_t *dram;
    uint64_t dram_bytes;
    ty_store_ssd_t *ssd;
    ty_rpc_server_t *srv;
    ty_rpc_client_t *master;
    char masters[MASTERS_MAX][128];
    int n_masters, cur_master;
    bool connected, registered, registering;
    uint64_t down_since;
    uint32_t node_id;
    uint64_t epoch;
    uv_timer_t hb;
    uint32_t heartbeat_ms;
    struct ty__store_kmap blocks; /* key -> struct blk */
    uint64_t blocks_bytes;        /* their lengths summed */
    uint64_t ssd_bytes;           /* the SSD tier's capacity (0: none) */
    int jobs; /* on the thread pool */
    bool closing;
    int close_pending;
    ty_store_closed_cb closed_cb;
    void *closed_arg;
};

struct job_work {
    uv_work_t w;
    ty_store_node_t *n;
    ty_rpc_call_t *call;
    const PB(Job) * job; /* the call's request: valid until the reply ends the call */
    int status;
    uint64_t result;
};

static void node_finish_close(ty_store_node_t *n);

/* ---- DRAM block index ------------------------------------------------------------------------ */

static void blk_set(ty_store_node_t *n, const PB(Event) * e)
{
    ty__store_kmap_reserve(&n->blocks);
    uint64_t h;
    struct ty__store_kent **pp = ty__store_kmap_slot(&n->blocks, e->key, &h);
    if (!*pp) {
        struct blk *b = calloc(1, sizeof(*b));
        TY_ASSERT(b != NULL);
        b->k.key = strdup(e->key);
        TY_ASSERT(b->k.key != NULL);
        b->k.hash = h;
        *pp = &b->k;
        n->blocks.n++;
    }
    struct blk *b = (struct blk *)*pp;
    n->blocks_bytes += e->length - b->length;
    b->offset = e->offset;
    b->length = e->length;
    b->checksum = e->checksum;
}

static void blk_del(ty_store_node_t *n, const char *key)
{
    uint64_t h;
    struct ty__store_kent **pp = ty__store_kmap_slot(&n->blocks, key, &h), *k = *pp;
    if (!k)
        return;
    *pp = k->next;
    n->blocks_bytes -= ((struct blk *)k)->length;
    free(k->key);
    free(k);
    n->blocks.n--;
}

static void h_index(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_store_node_t *n = arg;
    const PB(Events) *req = msg;
    for (size_t i = 0; i < req->n_events; i++) {
        const PB(Event) *e = req->events[i];
        bool stored = e->kind == TYCHO__STORE__V1__EVENT_KIND__EVENT_KIND_STORED;
        if (e->tier == TYCHO__STORE__V1__TIER__TIER_DRAM) {
            if (stored && e->offset + e->length <= n->dram_bytes)
                blk_set(n, e);
            else if (!stored)
                blk_del(n, e->key);
        } else if (!stored && n->ssd) {
            ty_store_ssd_remove(n->ssd, e->key);
        }
    }
    PB(Statuses) rep = PB_INIT(STATUSES);
    ty_rpc_call_reply_msg(call, &rep.base);
}

/* ---- jobs --------------------------------------------------------------------------------- */

static int job_replicate(ty_store_node_t *n, const PB(Job) * j)
{
    ty_xfer_segment_t *seg;
    int rc = ty_xfer_segment_open(n->xfer, j->src_segment, &seg);
    if (rc != 0)
        return rc;
    ty_xfer_batch_t *b;
    rc = ty_xfer_batch_new(n->xfer, 1, &b);
    if (rc == 0) {
        struct ty_xfer_request r = {.op = TY_XFER_OP_READ,
                                    .local = n->dram + j->dst_offset,
                                    .segment = seg,
                                    .remote = j->src_addr,
                                    .len = j->length};
        rc = ty_xfer_batch_submit(b, &r, 1);
        if (rc == 0)
            rc = ty_xfer_batch_wait(b, 30000);
        while (ty_xfer_batch_free(b) == TY_EBUSY)
            ty_xfer_batch_wait(b, 1000);
    }
    ty_xfer_segment_close(n->xfer, seg);
    if (rc == 0 && XXH3_64bits(n->dram + j->dst_offset, j->length) != j->checksum)
        rc = TY_ECHECKSUM;
    return rc;
}

static void job_run(uv_work_t *w)
{
    struct job_work *jw = w->data;
    ty_store_node_t *n = jw->n;
    const PB(Job) *j = jw->job;
    bool in_src = j->src_offset < n->dram_bytes && j->length <= n->dram_bytes - j->src_offset;
    bool in_dst = j->dst_offset < n->dram_bytes && j->length <= n->dram_bytes - j->dst_offset;
    switch (j->kind) {
    case TYCHO__STORE__V1__JOB_KIND__JOB_KIND_OFFLOAD:
        if (!n->ssd || !in_src) {
            jw->status = n->ssd ? TY_EOUTOFRANGE : TY_ENOTSUP;
        } else if (XXH3_64bits(n->dram + j->src_offset, j->length) != j->checksum) {
            jw->status = TY_ECHECKSUM; /* never copy damaged bytes to disk */
        } else {
            ty_store_ssd_remove(n->ssd, j->key); /* an older copy of the same key */
            jw->status = ty_store_ssd_put(n->ssd, j->key, n->dram + j->src_offset, j->length,
                                          j->checksum, &jw->result);
        }
        break;
    case TYCHO__STORE__V1__JOB_KIND__JOB_KIND_LOAD: {
        uint64_t got = 0;
        jw->status =
            !n->ssd   ? TY_ENOTFOUND
            : !in_dst ? TY_EOUTOFRANGE
                      : ty_store_ssd_get(n->ssd, j->key, n->dram + j->dst_offset, j->length, &got);
        if (jw->status == 0 && got != j->length)
            jw->status = TY_ECHECKSUM;
        break;
    }
    case TYCHO__STORE__V1__JOB_KIND__JOB_KIND_REPLICATE:
        jw->status = in_dst ? job_replicate(n, j) : TY_EOUTOFRANGE;
        break;
    default:
        jw->status = TY_EINVAL;
    }
}

static void job_after(uv_work_t *w, int status)
{
    struct job_work *jw = w->data;
    ty_store_node_t *n = jw->n;
    PB(JobReply) rep = PB_INIT(JOB_REPLY);
    rep.status = status == 0 ? jw->status : TY_ECANCELED;
    rep.result = jw->result;
    ty_rpc_call_reply_msg(jw->call, &rep.base); /* frees jw->job */
    free(jw);
    if (--n->jobs == 0 && n->closing)
        node_finish_close(n);
}

static void h_job(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_store_node_t *n = arg;
    const PB(Job) *j = msg;
    if (n->closing) {
        ty_rpc_call_fail(call, TY_ESHUTDOWN, "job refused: the node is closing");
        return;
    }
    struct job_work *jw = calloc(1, sizeof(*jw));
    TY_ASSERT(jw != NULL);
    *jw = (struct job_work){.n = n, .call = call, .job = j};
    jw->w.data = jw;
    n->jobs++;
    uv_queue_work(n->loop, &jw->w, job_run, job_after);
}

/* ---- registration and heartbeats ---------------------------------------------------------- */

struct reg_ctx {
    PB(Block) * blocks;
    PB(Block) * *ptrs;
    size_t n, cap;
};

static void reg_push(struct reg_ctx *r, const char *key, PB(Tier) tier, uint64_t off, uint64_t len,
                     uint64_t cs)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 256;
        r->blocks = realloc(r->blocks, r->cap * sizeof(*r->blocks));
        TY_ASSERT(r->blocks != NULL);
    }
    PB(Block) *b = &r->blocks[r->n++];
    PB_FN(block__init)(b);
    b->key = strdup(key);
    TY_ASSERT(b->key != NULL);
    b->tier = tier;
    b->offset = off;
    b->length = len;
    b->checksum = cs;
}

static int reg_ssd_cb(const char *key, uint64_t loc, uint64_t len, uint64_t cs, void *arg)
{
    reg_push(arg, key, TYCHO__STORE__V1__TIER__TIER_SSD, loc, len, cs);
    return 0;
}

static void on_register_reply(const struct ty_rpc_result *res, void *arg)
{
    ty_store_node_t *n = arg;
    n->registering = false;
    if (res->event != TY_RPC_EVENT_REPLY)
        return; /* the next heartbeat tick tries again */
    PB(NodeRegisterReply) *r = PB_FN(node_register_reply__unpack)(NULL, res->len, res->payload);
    if (r && r->status == 0) {
        n->registered = true;
        n->node_id = r->node_id;
        n->epoch = r->epoch;
        TY_LOG_INFO("store", "node %s registered with master %s as %u (%u blocks announced)",
                    n->name, n->masters[n->cur_master], r->node_id, r->announced);
    } else {
        TY_LOG_WARN("store", "node %s: registration refused: %s", n->name,
                    r ? ty_strerror(r->status) : "bad reply");
    }
    if (r)
        PB_FN(node_register_reply__free_unpacked)(r, NULL);
}

static void send_register(ty_store_node_t *n)
{
    struct reg_ctx rc = {0};
    for (size_t i = 0; i < n->blocks.cap; i++)
        for (struct ty__store_kent *k = n->blocks.v[i]; k; k = k->next) {
            const struct blk *b = (const struct blk *)k;
            reg_push(&rc, k->key, TYCHO__STORE__V1__TIER__TIER_DRAM, b->offset, b->length,
                     b->checksum);
        }
    if (n->ssd)
        ty_store_ssd_foreach(n->ssd, reg_ssd_cb, &rc);
    rc.ptrs = calloc(rc.n + 1, sizeof(*rc.ptrs));
    TY_ASSERT(rc.ptrs != NULL);
    for (size_t i = 0; i < rc.n; i++)
        rc.ptrs[i] = &rc.blocks[i];
    PB(NodeRegister) msg = PB_INIT(NODE_REGISTER);
    msg.name = n->name;
    msg.segment = (char *)ty_xfer_engine_name(n->xfer);
    msg.base_addr = (uint64_t)(uintptr_t)n->dram;
    msg.dram_bytes = n->dram_bytes;
    msg.has_ssd = n->ssd != NULL;
    msg.rpc_host = n->host;
    msg.rpc_port = ty_rpc_server_port(n->srv);
    msg.n_blocks = rc.n;
    msg.blocks = rc.ptrs;
    struct ty_rpc_call_opts co = {.timeout_ms = 10000};
    if (ty_rpc_client_call_msg(n->master, SM_NODE_REGISTER, &msg.base, &co, on_register_reply, n,
                               NULL) == 0)
        n->registering = true;
    for (size_t i = 0; i < rc.n; i++)
        free(rc.blocks[i].key);
    free(rc.blocks);
    free(rc.ptrs);
}

static void on_hb_reply(const struct ty_rpc_result *res, void *arg)
{
    ty_store_node_t *n = arg;
    if (res->event != TY_RPC_EVENT_REPLY)
        return;
    PB(Statuses) *r = PB_FN(statuses__unpack)(NULL, res->len, res->payload);
    if (r && r->n_status == 1 && r->status[0] != 0 && n->registered) {
        /* Declared dead, or a new master: announce everything again. */
        TY_LOG_WARN("store", "node %s: master says %s: registering again", n->name,
                    ty_err_name(r->status[0]));
        n->registered = false;
    }
    if (r)
        PB_FN(statuses__free_unpacked)(r, NULL);
}

static void send_heartbeat(ty_store_node_t *n)
{
    char dropped[64][256];
    char *ptrs[64];
    size_t nd = n->ssd ? ty_store_ssd_take_dropped(n->ssd, dropped, 64) : 0;
    for (size_t i = 0; i < nd; i++)
        ptrs[i] = dropped[i];
    PB(NodeHeartbeat) msg = PB_INIT(NODE_HEARTBEAT);
    msg.node_id = n->node_id;
    msg.epoch = n->epoch;
    msg.n_ssd_dropped = nd;
    msg.ssd_dropped = ptrs;
    struct ty_rpc_call_opts co = {.timeout_ms = n->heartbeat_ms * 4};
    ty_rpc_client_call_msg(n->master, SM_NODE_HEARTBEAT, &msg.base, &co, on_hb_reply, n, NULL);
}

static void on_master_state(ty_rpc_client_t *c, bool connected, int reason, void *arg)
{
    ty_store_node_t *n = arg;
    n->connected = connected;
    if (!connected) {
        n->registered = false;
        n->down_since = ty_clock_ms();
        return;
    }
    if (!n->registering)
        send_register(n);
}

static int master_connect(ty_store_node_t *n)
{
    char host[128];
    uint16_t port;
    int rc = ty_config_split_hostport(n->masters[n->cur_master], host, sizeof(host), &port);
    if (rc != 0)
        return rc;
    struct ty_rpc_client_opts o = {.loop = n->loop,
                                   .host = host,
                                   .port = port,
                                   .call_timeout_ms = 10000,
                                   .backoff_max_ms = 500,
                                   .state_cb = on_master_state,
                                   .state_arg = n,
                                   .auth = n->auth};
    n->down_since = ty_clock_ms();
    return ty_rpc_client_new(&n->master, &o);
}

static void on_hb(uv_timer_t *t)
{
    ty_store_node_t *n = t->data;
    if (!n->master) {
        master_connect(n);
    } else if (n->registered) {
        send_heartbeat(n);
    } else if (n->connected && !n->registering) {
        send_register(n);
    } else if (!n->connected && n->n_masters > 1 &&
               ty_clock_ms() - n->down_since > 2ull * n->heartbeat_ms) {
        ty_rpc_client_close(n->master, NULL, NULL); /* try the next master */
        n->master = NULL;
        n->registering = false;
        n->cur_master = (n->cur_master + 1) % n->n_masters;
        if (master_connect(n) != 0)
            TY_LOG_WARN("store", "node %s: bad master address %s", n->name,
                        n->masters[n->cur_master]);
    }
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static int parse_masters(ty_store_node_t *n, const char *list)
{
    const char *p = list;
    while (p && *p && n->n_masters < MASTERS_MAX) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof(n->masters[0]))
            return TY_EINVAL;
        memcpy(n->masters[n->n_masters], p, len);
        n->masters[n->n_masters++][len] = 0;
        p += len + (p[len] == ',');
    }
    return n->n_masters > 0 ? 0 : TY_EINVAL;
}

static int dram_mount(ty_store_node_t *n)
{
    void *p;
    int rc = ty_xfer_mem_alloc(n->xfer, n->dram_bytes, &p);
    if (rc != 0)
        return rc;
    /* the engine maps it on huge pages where the host has them (and says which); touch every
     * page now so the first puts do not pay for faults */
    memset(p, 0, n->dram_bytes);
    n->dram = p;
    return 0;
}

static int node_setup(ty_store_node_t *n, const struct ty_store_node_opts *o)
{
    struct ty_xfer_engine_opts xo = {
        .listen_host = n->host, .listen_port = o->xfer_port, .checksum = o->xfer_checksum,
        .auth = n->auth};
    int rc = ty_xfer_engine_new(&n->xfer, &xo);
    if (rc != 0)
        return rc;
    if ((rc = dram_mount(n)) != 0)
        return rc;
    if (o->ssd_dir) {
        struct ty_store_ssd_opts so = {
            .dir = o->ssd_dir, .capacity = o->ssd_bytes, .direct = o->ssd_direct};
        if ((rc = ty_store_ssd_new(&n->ssd, &so)) != 0)
            return rc;
        n->ssd_bytes = o->ssd_bytes;
    }
    struct ty_rpc_server_opts ro = {
        .loop = n->loop, .host = n->host, .port = o->rpc_port, .auth = n->auth};
    if ((rc = ty_rpc_server_new(&n->srv, &ro)) != 0)
        return rc;
    ty_rpc_server_handle_msg(n->srv, SM_NODE_JOB, &PB_FN(job__descriptor), h_job, n);
    ty_rpc_server_handle_msg(n->srv, SM_NODE_INDEX, &PB_FN(events__descriptor), h_index, n);
    return master_connect(n);
}

static void node_free_parts(ty_store_node_t *n)
{
    ty_store_ssd_free(n->ssd);
    if (n->dram)
        ty_xfer_mem_release(n->xfer, n->dram);
    ty_xfer_engine_free(n->xfer);
    for (size_t i = 0; i < n->blocks.cap; i++)
        for (struct ty__store_kent *k = n->blocks.v[i], *next; k; k = next) {
            next = k->next;
            free(k->key);
            free(k);
        }
    ty__store_kmap_fini(&n->blocks);
    free(n);
}

int ty_store_node_new(ty_store_node_t **out, const struct ty_store_node_opts *o)
{
    if (!o || !o->loop || !o->name || !*o->name || strlen(o->name) > TY_STORE_NODE_NAME_MAX ||
        o->dram_bytes < (1u << 20) || (o->ssd_dir && o->ssd_bytes == 0))
        return TY_EINVAL;
    ty_store_node_t *n = calloc(1, sizeof(*n));
    TY_ASSERT(n != NULL);
    n->loop = o->loop;
    n->auth = o->auth;
    snprintf(n->name, sizeof(n->name), "%s", o->name);
    snprintf(n->host, sizeof(n->host), "%s", o->host ? o->host : "127.0.0.1");
    n->dram_bytes = o->dram_bytes;
    n->heartbeat_ms = o->heartbeat_ms ? o->heartbeat_ms : 500;
    ty__store_kmap_init(&n->blocks);
    int rc = parse_masters(n, o->master);
    if (rc == 0)
        rc = node_setup(n, o);
    if (rc != 0) {
        TY_LOG_ERROR("store", "node %s: cannot start: %s", n->name, ty_strerror(rc));
        if (n->master)
            ty_rpc_client_close(n->master, NULL, NULL);
        if (n->srv)
            ty_rpc_server_close(n->srv, NULL, NULL); /* frees itself once closed */
        node_free_parts(n);
        return rc;
    }
    uv_timer_init(n->loop, &n->hb);
    n->hb.data = n;
    uv_timer_start(&n->hb, on_hb, n->heartbeat_ms, n->heartbeat_ms);
    TY_LOG_INFO("store", "node %s: segment %s, %llu MiB DRAM, job service on port %u", n->name,
                ty_xfer_engine_name(n->xfer), (unsigned long long)(n->dram_bytes >> 20),
                ty_rpc_server_port(n->srv));
    *out = n;
    return 0;
}

uint16_t ty_store_node_rpc_port(const ty_store_node_t *n)
{
    return ty_rpc_server_port(n->srv);
}
void ty_store_node_stats(ty_store_node_t *n, struct ty_store_node_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->dram_bytes = n->dram_bytes;
    out->dram_blocks = n->blocks.n;
    out->dram_used = n->blocks_bytes;
    out->registered = n->registered;
    out->jobs = n->jobs > 0 ? (uint32_t)n->jobs : 0;
    if (n->ssd) {
        struct ty_store_ssd_stats s;
        ty_store_ssd_stats(n->ssd, &s);
        out->ssd = true;
        out->ssd_bytes = n->ssd_bytes;
        out->ssd_blocks = s.blocks;
        out->ssd_used = s.bytes_used;
        out->ssd_checksum_errors = s.checksum_errors;
        out->ssd_buckets_evicted = s.buckets_evicted;
    }
    if (n->xfer) {
        struct ty_xfer_stats x;
        ty_xfer_engine_stats(n->xfer, &x);
        out->xfer_bytes_in = x.served_bytes_in;
        out->xfer_bytes_out = x.served_bytes_out;
        out->xfer_refused = x.refused_accesses;
    }
}

const char *ty_store_node_segment(const ty_store_node_t *n)
{
    return ty_xfer_engine_name(n->xfer);
}

static void node_closed_one(ty_store_node_t *n)
{
    if (--n->close_pending > 0)
        return;
    ty_store_closed_cb cb = n->closed_cb;
    void *arg = n->closed_arg;
    node_free_parts(n);
    if (cb)
        cb(arg);
}

static void on_hb_closed(uv_handle_t *h)
{
    node_closed_one(h->data);
}
static void on_srv_closed(void *arg)
{
    node_closed_one(arg);
}

/* Jobs drained: close the server (after the last reply went out) and the timer. */
static void node_finish_close(ty_store_node_t *n)
{
    n->close_pending = 2;
    uv_close((uv_handle_t *)&n->hb, on_hb_closed);
    ty_rpc_server_close(n->srv, on_srv_closed, n);
}

void ty_store_node_close(ty_store_node_t *n, ty_store_closed_cb cb, void *arg)
{
    n->closing = true;
    n->closed_cb = cb;
    n->closed_arg = arg;
    uv_timer_stop(&n->hb);
    if (n->master)
        ty_rpc_client_close(n->master, NULL, NULL);
    n->master = NULL;
    if (n->jobs == 0)
        node_finish_close(n);
}
