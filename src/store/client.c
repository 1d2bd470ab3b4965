/* The pool's client library: control calls to the master over RPC (on the client's own loop
 * thread), bytes through the transfer engine from the calling thread (store.h). */
#include "store-impl.h"

#include "tycho/clock.h"
#include "tycho/config.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/rpc.h"
#include "tycho/xxh3.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MASTERS_MAX 8
#define SEGS_MAX    256 /* default segments_max */
#define REGIONS_MAX 64

/* An open pool segment. Nodes that restart come back under new names (their engine's port),
 * so the table is a cache: beyond segments_max the least recently used one that no transfer
 * holds is closed (a dead node's segment goes that way too). The limit is soft: when every
 * open segment is in use (a put writing more replicas than segments_max, or a batch over
 * more nodes), the table grows for that transfer and shrinks back when it lets go. */
struct seg {
    char name[TY_XFER_NAME_MAX + 1];
    ty_xfer_segment_t *s;
    uint32_t refs;  /* transfers using it now */
    uint64_t used;  /* c->seg_clock at the last seg_get */
};

struct ty_store_client {
    const struct ty_auth *auth;
    char masters[MASTERS_MAX][128];
    int n_masters, cur;
    char writer[TY_STORE_NODE_NAME_MAX + 1];
    ty_xfer_engine_t *xfer;
    bool own_xfer;
    uint32_t replicas, timeout_ms;
    enum ty_store_verify verify;
    bool xfer_checksum; /* the engine verifies every TCP slice */
    /* RPC thread */
    pthread_t thr;
    uv_loop_t loop;
    ty_rpc_mailbox_t *mb;
    ty_rpc_client_t *rpc;
    int start_rc;
    bool started;
    /* shared state, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct seg *segs;
    int n_segs, segs_max, segs_cap;
    uint64_t seg_clock;
    struct {
        uint8_t *addr;
        size_t len;
    } regions[REGIONS_MAX];
    int n_regions;
    struct ty_store_client_stats st;
    /* staging buffer for unregistered memory */
    pthread_mutex_t stage_mu;
    uint8_t *stage;
    uint64_t stage_bytes;
};

/* ---- RPC bridge: post a call to the loop thread and wait for its outcome ------------------- */

struct scall {
    ty_store_client_t *c;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    uint16_t method;
    uint8_t *req;
    size_t req_len;
    uint32_t timeout_ms;
    int status;
    uint8_t *rep;
    size_t rep_len;
};

static void scall_finish(struct scall *sc, int status, const uint8_t *p, size_t len)
{
    pthread_mutex_lock(&sc->mu);
    sc->status = status;
    if (status == 0 && len > 0) {
        sc->rep = malloc(len);
        TY_ASSERT(sc->rep != NULL);
        memcpy(sc->rep, p, len);
        sc->rep_len = len;
    }
    sc->done = true;
    pthread_cond_signal(&sc->cv);
    pthread_mutex_unlock(&sc->mu);
}

static void scall_cb(const struct ty_rpc_result *res, void *arg)
{
    struct scall *sc = arg;
    if (res->event == TY_RPC_EVENT_REPLY)
        scall_finish(sc, 0, res->payload, res->len);
    else
        scall_finish(sc,
                     res->status == TY_EREMOTE && res->remote_code ? res->remote_code : res->status,
                     NULL, 0);
}

static void scall_start(void *arg)
{
    struct scall *sc = arg;
    if (!sc->c->rpc) {
        scall_finish(sc, TY_ENOTCONN, NULL, 0);
        return;
    }
    struct ty_rpc_call_opts o = {.timeout_ms = sc->timeout_ms};
    int rc =
        ty_rpc_client_call(sc->c->rpc, sc->method, sc->req, sc->req_len, &o, scall_cb, sc, NULL);
    if (rc != 0)
        scall_finish(sc, rc, NULL, 0);
}

static int rpc_connect(ty_store_client_t *c)
{
    char host[128];
    uint16_t port;
    int rc = ty_config_split_hostport(c->masters[c->cur], host, sizeof(host), &port);
    if (rc != 0)
        return rc;
    struct ty_rpc_client_opts o = {.loop = &c->loop,
                                   .host = host,
                                   .port = port,
                                   .call_timeout_ms = c->timeout_ms,
                                   .connect_timeout_ms = 1000,
                                   .backoff_max_ms = 500,
                                   .auth = c->auth};
    return ty_rpc_client_new(&c->rpc, &o);
}

/* Loop thread: move to the next master of the list. */
static void switch_master(void *arg)
{
    ty_store_client_t *c = arg;
    if (c->rpc)
        ty_rpc_client_close(c->rpc, NULL, NULL);
    c->rpc = NULL;
    c->cur = (c->cur + 1) % c->n_masters;
    if (rpc_connect(c) != 0)
        c->rpc = NULL;
    TY_LOG_INFO("store", "client: following master %s", c->masters[c->cur]);
}

static bool conn_error(int rc)
{
    return rc == TY_ETIMEDOUT || rc == TY_ECONNRESET || rc == TY_ECONNREFUSED ||
           rc == TY_ENOTCONN || rc == TY_ESTALE || rc == TY_ESHUTDOWN;
}

/* Send msg as `method` and wait; on 0 *rep / *rep_len hold the reply (caller frees). When the
 * master cannot be reached and others are listed, the next one is tried until the timeout. */
static int call(ty_store_client_t *c, uint16_t method, const ProtobufCMessage *msg, uint8_t **rep,
                size_t *rep_len)
{
    struct scall sc = {.c = c, .method = method};
    *rep = NULL;
    *rep_len = 0;
    int rc = ty_rpc_pack(msg, &sc.req, &sc.req_len);
    if (rc != 0)
        return rc;
    uint64_t deadline = ty_clock_ms() + c->timeout_ms;
    for (;;) {
        uint64_t now = ty_clock_ms();
        uint32_t left = now < deadline ? (uint32_t)(deadline - now) : 1;
        sc.timeout_ms = c->n_masters > 1 && left > 2000 ? 2000 : left;
        sc.done = false;
        sc.rep = NULL;
        pthread_mutex_init(&sc.mu, NULL);
        pthread_cond_init(&sc.cv, NULL);
        rc = ty_rpc_mailbox_post(c->mb, scall_start, &sc);
        if (rc == 0) {
            pthread_mutex_lock(&sc.mu);
            while (!sc.done)
                pthread_cond_wait(&sc.cv, &sc.mu);
            pthread_mutex_unlock(&sc.mu);
            rc = sc.status;
        }
        pthread_mutex_destroy(&sc.mu);
        pthread_cond_destroy(&sc.cv);
        if (rc == 0 || !conn_error(rc) || c->n_masters < 2 || ty_clock_ms() >= deadline)
            break;
        pthread_mutex_lock(&c->mu);
        c->st.master_switches++;
        pthread_mutex_unlock(&c->mu);
        ty_rpc_mailbox_post(c->mb, switch_master, c);
        ty_sleep_ns(50 * 1000000ull);
    }
    free(sc.req);
    *rep = sc.rep;
    *rep_len = sc.rep_len;
    return rc;
}

static void *rpc_thread(void *arg)
{
    ty_store_client_t *c = arg;
    uv_loop_init(&c->loop);
    int rc = ty_rpc_mailbox_new(&c->mb, &c->loop);
    if (rc == 0)
        rc = rpc_connect(c);
    pthread_mutex_lock(&c->mu);
    c->start_rc = rc;
    c->started = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (rc == 0)
        uv_run(&c->loop, UV_RUN_DEFAULT);
    else if (c->mb)
        ty_rpc_mailbox_close(c->mb, NULL, NULL);
    uv_run(&c->loop, UV_RUN_DEFAULT); /* close callbacks */
    uv_loop_close(&c->loop);
    return NULL;
}

static void stop_loop(void *arg)
{
    ty_store_client_t *c = arg;
    if (c->rpc)
        ty_rpc_client_close(c->rpc, NULL, NULL);
    c->rpc = NULL;
    ty_rpc_mailbox_close(c->mb, NULL, NULL);
}

/* ---- segments, registered memory, transfers ------------------------------------------------- */

/* Find or open the segment `name` and hold it (seg_put releases). TY_ENOSPC when the table is
 * full of segments in use. */
/* The least recently used segment no transfer holds, or -1. Under mu. */
static int seg_idle_lru(const ty_store_client_t *c)
{
    int victim = -1;
    for (int i = 0; i < c->n_segs; i++)
        if (c->segs[i].refs == 0 && (victim < 0 || c->segs[i].used < c->segs[victim].used))
            victim = i;
    return victim;
}

static int seg_get(ty_store_client_t *c, const char *name, ty_xfer_segment_t **out)
{
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n_segs; i++) {
        struct seg *g = &c->segs[i];
        if (strcmp(g->name, name) == 0) {
            g->refs++;
            g->used = ++c->seg_clock;
            *out = g->s;
            pthread_mutex_unlock(&c->mu);
            return 0;
        }
    }
    int victim = c->n_segs >= c->segs_max ? seg_idle_lru(c) : -1; /* at the limit: make room */
    int slot = c->n_segs;
    if (victim >= 0) {
        ty_xfer_segment_close(c->xfer, c->segs[victim].s);
        c->st.segments_closed++;
        slot = victim;
    } else if (c->n_segs == c->segs_cap) { /* all in use: over the soft limit for now */
        int cap = c->segs_cap * 2;
        struct seg *ns = realloc(c->segs, (size_t)cap * sizeof(*ns));
        if (!ns) {
            pthread_mutex_unlock(&c->mu);
            return TY_ENOMEM;
        }
        c->segs = ns;
        c->segs_cap = cap;
    }
    ty_xfer_segment_t *seg = NULL;
    int rc = ty_xfer_segment_open(c->xfer, name, &seg);
    if (rc == 0) {
        struct seg *g = &c->segs[slot];
        snprintf(g->name, sizeof(g->name), "%s", name);
        g->s = *out = seg;
        g->refs = 1;
        g->used = ++c->seg_clock;
        c->n_segs += slot == c->n_segs;
    } else if (slot != c->n_segs) { /* the victim's place is free now: fill it from the end */
        c->segs[slot] = c->segs[--c->n_segs];
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static void seg_put(ty_store_client_t *c, ty_xfer_segment_t *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n_segs; i++)
        if (c->segs[i].s == s) {
            TY_ASSERT(c->segs[i].refs > 0);
            c->segs[i].refs--;
            break;
        }
    while (c->n_segs > c->segs_max) { /* back under the soft limit: least recently used first */
        int victim = seg_idle_lru(c);
        if (victim < 0)
            break;
        ty_xfer_segment_close(c->xfer, c->segs[victim].s);
        c->st.segments_closed++;
        c->segs[victim] = c->segs[--c->n_segs];
    }
    pthread_mutex_unlock(&c->mu);
}

static bool is_registered(ty_store_client_t *c, const void *p, uint64_t len)
{
    const uint8_t *b = p;
    bool ok = false;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n_regions && !ok; i++)
        ok = b >= c->regions[i].addr && len <= c->regions[i].len &&
             (size_t)(b - c->regions[i].addr) <= c->regions[i].len - len;
    pthread_mutex_unlock(&c->mu);
    return ok;
}

int ty_store_client_register(ty_store_client_t *c, void *addr, size_t len)
{
    pthread_mutex_lock(&c->mu);
    int rc =
        c->n_regions == REGIONS_MAX ? TY_ENOSPC : ty_xfer_mem_register(c->xfer, addr, len, "cpu:0");
    if (rc == 0) {
        c->regions[c->n_regions].addr = addr;
        c->regions[c->n_regions++].len = len;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int ty_store_client_unregister(ty_store_client_t *c, void *addr)
{
    pthread_mutex_lock(&c->mu);
    int rc = TY_ENOTFOUND;
    for (int i = 0; i < c->n_regions; i++)
        if (c->regions[i].addr == addr) {
            c->regions[i] = c->regions[--c->n_regions];
            rc = ty_xfer_mem_unregister(c->xfer, addr);
            break;
        }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* One transfer of a whole value between user memory and a replica. */
struct xitem {
    uint8_t *buf;
    uint64_t len;
    ty_xfer_segment_t *seg;
    uint64_t remote;
    int status;
};

static int run_batch(ty_store_client_t *c, struct ty_xfer_request *r, size_t n, int *st)
{
    ty_xfer_batch_t *b;
    int rc = ty_xfer_batch_new(c->xfer, n, &b);
    if (rc != 0)
        return rc;
    rc = ty_xfer_batch_submit(b, r, n);
    if (rc == 0) {
        ty_xfer_batch_wait(b, c->timeout_ms);
        for (size_t i = 0; i < n; i++) {
            struct ty_xfer_task_status ts;
            ty_xfer_batch_status(b, i, &ts);
            st[i] = ts.state == TY_XFER_TASK_DONE ? 0 : ts.err ? ts.err : TY_ETIMEDOUT;
        }
    }
    while (ty_xfer_batch_free(b) == TY_EBUSY)
        ty_xfer_batch_wait(b, 1000);
    return rc;
}

/* Registered buffers: one batch for all of them. */
static void xfer_direct(ty_store_client_t *c, enum ty_xfer_op op, struct xitem *it, size_t n)
{
    struct ty_xfer_request *r = calloc(n, sizeof(*r));
    int *st = calloc(n, sizeof(*st));
    size_t *idx = calloc(n, sizeof(*idx));
    TY_ASSERT(r && st && idx);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (it[i].status == 1 && is_registered(c, it[i].buf, it[i].len)) {
            r[k] = (struct ty_xfer_request){.op = op,
                                            .local = it[i].buf,
                                            .segment = it[i].seg,
                                            .remote = it[i].remote,
                                            .len = it[i].len};
            idx[k++] = i;
        }
    if (k > 0) {
        int rc = run_batch(c, r, k, st);
        for (size_t j = 0; j < k; j++)
            it[idx[j]].status = rc != 0 ? rc : st[j];
    }
    free(r);
    free(st);
    free(idx);
}

/* Other memory: through the staging buffer, in pieces of at most its size. */
static void xfer_staged(ty_store_client_t *c, enum ty_xfer_op op, struct xitem *it, size_t n)
{
    pthread_mutex_lock(&c->stage_mu);
    for (size_t i = 0; i < n; i++) {
        if (it[i].status != 1)
            continue;
        int rc = 0;
        for (uint64_t off = 0; rc == 0 && off < it[i].len; off += c->stage_bytes) {
            uint64_t len = it[i].len - off < c->stage_bytes ? it[i].len - off : c->stage_bytes;
            if (op == TY_XFER_OP_WRITE)
                memcpy(c->stage, it[i].buf + off, len);
            struct ty_xfer_request r = {.op = op,
                                        .local = c->stage,
                                        .segment = it[i].seg,
                                        .remote = it[i].remote + off,
                                        .len = len};
            int st = 0;
            rc = run_batch(c, &r, 1, &st);
            if (rc == 0)
                rc = st;
            if (rc == 0 && op == TY_XFER_OP_READ)
                memcpy(it[i].buf + off, c->stage, len);
        }
        it[i].status = rc;
    }
    pthread_mutex_unlock(&c->stage_mu);
}

/* Move every item whose status is 1 (to do); each ends with 0 or its error. */
static void xfer_run(ty_store_client_t *c, enum ty_xfer_op op, struct xitem *it, size_t n)
{
    xfer_direct(c, op, it, n);
    xfer_staged(c, op, it, n);
}

/* ---- put ------------------------------------------------------------------------------------ */

static int first_error(const int *st, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (st[i] != 0)
            return st[i];
    return 0;
}

static bool key_ok(const char *k)
{
    return k && *k && strlen(k) <= TY_STORE_KEY_MAX;
}

static int put_start(ty_store_client_t *c, size_t n, const char *const *keys, const uint64_t *lens,
                     PB(PutStartReply) * *out)
{
    PB(PutItem) *items = calloc(n, sizeof(*items));
    PB(PutItem) **ip = calloc(n, sizeof(*ip));
    TY_ASSERT(items && ip);
    for (size_t i = 0; i < n; i++) {
        PB_FN(put_item__init)(&items[i]);
        items[i].key = (char *)keys[i];
        items[i].length = lens[i];
        items[i].replicas = c->replicas;
        ip[i] = &items[i];
    }
    PB(PutStart) req = PB_INIT(PUT_START);
    req.n_items = n;
    req.items = ip;
    req.writer = c->writer;
    uint8_t *rep;
    size_t rl;
    int rc = call(c, SM_PUT_START, &req.base, &rep, &rl);
    free(items);
    free(ip);
    if (rc != 0)
        return rc;
    *out = PB_FN(put_start_reply__unpack)(NULL, rl, rep);
    free(rep);
    return *out && (*out)->n_slots == n ? 0 : TY_EBADMSG;
}

enum { PH_COMMIT = 0, PH_SKIP = 1, PH_ABORT = 2 };

/* Phase two for every key not PH_SKIP: commit (with its checksum) or abort. out[i] gets the
 * master's status of key i's commit (0 for skipped and aborted keys). */
static int put_commit(ty_store_client_t *c, size_t n, const char *const *keys, const uint64_t *sums,
                      const uint8_t *phase, int *out)
{
    PB(CommitItem) *items = calloc(n, sizeof(*items));
    PB(CommitItem) **ip = calloc(n, sizeof(*ip));
    size_t *idx = calloc(n, sizeof(*idx));
    TY_ASSERT(items && ip && idx);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        out[i] = 0;
        if (phase[i] == PH_SKIP)
            continue;
        PB_FN(commit_item__init)(&items[k]);
        items[k].key = (char *)keys[i];
        items[k].checksum = sums[i];
        items[k].abort = phase[i] == PH_ABORT;
        ip[k] = &items[k];
        idx[k++] = i;
    }
    PB(PutCommit) req = PB_INIT(PUT_COMMIT);
    req.n_items = k;
    req.items = ip;
    uint8_t *rep = NULL;
    size_t rl = 0;
    int rc = k ? call(c, SM_PUT_COMMIT, &req.base, &rep, &rl) : 0;
    if (rc == 0 && k) {
        PB(Statuses) *r = PB_FN(statuses__unpack)(NULL, rl, rep);
        if (!r || r->n_status != k)
            rc = TY_EBADMSG;
        for (size_t j = 0; rc == 0 && j < k; j++)
            out[idx[j]] = phase[idx[j]] == PH_COMMIT ? r->status[j] : 0;
        if (r)
            PB_FN(statuses__free_unpacked)(r, NULL);
    }
    free(rep);
    free(items);
    free(ip);
    free(idx);
    return rc;
}

/* Write every replica (it[0..nx), owner[j] = its key), then commit the keys whose replicas all
 * landed and abort the others. status[] holds each key's outcome. */
static int put_finish(ty_store_client_t *c, size_t n, const char *const *keys, const uint64_t *sums,
                      struct xitem *it, const size_t *owner, size_t nx, int *status)
{
    xfer_run(c, TY_XFER_OP_WRITE, it, nx);
    uint8_t *phase = calloc(n, 1);
    int *cst = calloc(n, sizeof(*cst));
    TY_ASSERT(phase && cst);
    for (size_t i = 0; i < n; i++)
        phase[i] = status[i] != 0 ? PH_SKIP : PH_COMMIT;
    for (size_t j = 0; j < nx; j++)
        if (it[j].status != 0 && phase[owner[j]] == PH_COMMIT) {
            status[owner[j]] = it[j].status; /* a replica was not written: give it all back */
            phase[owner[j]] = PH_ABORT;
        }
    int rc = put_commit(c, n, keys, sums, phase, cst);
    for (size_t i = 0; i < n; i++)
        if (phase[i] == PH_COMMIT)
            status[i] = rc != 0 ? rc : cst[i];
    free(phase);
    free(cst);
    return rc;
}

int ty_store_client_put_batch(ty_store_client_t *c, size_t n, const char *const *keys,
                              const void *const *bufs, const uint64_t *lens, int *status)
{
    for (size_t i = 0; i < n; i++)
        if (!key_ok(keys[i]) || !bufs[i] || lens[i] == 0)
            return TY_EINVAL;
    if (n == 0)
        return 0;
    PB(PutStartReply) *ps = NULL;
    int rc = put_start(c, n, keys, lens, &ps);
    if (rc != 0) {
        for (size_t i = 0; i < n; i++)
            status[i] = rc;
        return rc;
    }
    size_t nx = 0;
    for (size_t i = 0; i < n; i++)
        nx += ps->slots[i]->status == 0 ? ps->slots[i]->n_replicas : 0;
    struct xitem *it = calloc(nx + 1, sizeof(*it));
    size_t *owner = calloc(nx + 1, sizeof(*owner));
    uint64_t *sums = calloc(n, sizeof(*sums));
    TY_ASSERT(it && owner && sums);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        status[i] = ps->slots[i]->status;
        if (status[i] != 0)
            continue;
        sums[i] = XXH3_64bits(bufs[i], lens[i]);
        for (size_t r = 0; r < ps->slots[i]->n_replicas; r++, k++) {
            PB(Replica) *rp = ps->slots[i]->replicas[r];
            it[k] = (struct xitem){
                .buf = (uint8_t *)bufs[i], .len = lens[i], .remote = rp->addr, .status = 1};
            owner[k] = i;
            int src = seg_get(c, rp->segment, &it[k].seg);
            if (src != 0)
                it[k].status = src;
        }
    }
    rc = put_finish(c, n, keys, sums, it, owner, nx, status);
    for (size_t j = 0; j < nx; j++)
        seg_put(c, it[j].seg);
    pthread_mutex_lock(&c->mu);
    c->st.puts += n;
    pthread_mutex_unlock(&c->mu);
    free(it);
    free(owner);
    free(sums);
    PB_FN(put_start_reply__free_unpacked)(ps, NULL);
    return first_error(status, n);
}

int ty_store_client_put(ty_store_client_t *c, const char *key, const void *buf, uint64_t len)
{
    int st;
    return ty_store_client_put_batch(c, 1, &key, &buf, &len, &st);
}

/* ---- get ------------------------------------------------------------------------------------ */

static int get_slots(ty_store_client_t *c, size_t n, const char *const *keys, PB(GetReply) * *out)
{
    PB(Get) req = PB_INIT(GET);
    req.n_keys = n;
    req.keys = (char **)keys;
    uint8_t *rep;
    size_t rl;
    int rc = call(c, SM_GET, &req.base, &rep, &rl);
    if (rc != 0)
        return rc;
    *out = PB_FN(get_reply__unpack)(NULL, rl, rep);
    free(rep);
    if (*out && (*out)->n_slots != n) {
        PB_FN(get_reply__free_unpacked)(*out, NULL);
        *out = NULL;
    }
    return *out ? 0 : TY_EBADMSG;
}

/* Whether the policy wants the bytes of a read within its lease hashed (enum ty_store_verify). */
static bool verify_wanted(const ty_store_client_t *c, const struct xitem *it)
{
    if (c->verify == TY_STORE_VERIFY_ALWAYS)
        return true;
    if (c->verify == TY_STORE_VERIFY_LEASE)
        return false;
    return strcmp(ty_xfer_segment_transport(it->seg), "tcp") == 0 && !c->xfer_checksum;
}

/* The read of `it` finished at t_done (ns); the master granted s->lease_ms from its answer to a
 * request sent at t0 (ns). Within the lease nothing of the block was freed or overwritten, so
 * the policy decides whether to hash; past it (2 ms margin for the master's ms clock) always. */
static bool get_check(ty_store_client_t *c, const PB(GetSlot) * s, const struct xitem *it,
                      uint64_t t0, uint64_t t_done, int *status)
{
    uint64_t lease_ns = s->lease_ms > 2 ? (s->lease_ms - 2) * 1000000ull : 0;
    bool overran = t_done - t0 >= lease_ns;
    bool hash = it->status == 0 && (overran || verify_wanted(c, it));
    bool ok = it->status == 0 && (!hash || XXH3_64bits(it->buf, s->length) == s->checksum);
    pthread_mutex_lock(&c->mu);
    c->st.verified += hash;
    c->st.unverified += it->status == 0 && !hash;
    c->st.lease_overruns += ok && overran; /* the checksum still proves the bytes */
    c->st.checksum_mismatches += it->status == 0 && !ok;
    c->st.replica_failovers += !ok;
    pthread_mutex_unlock(&c->mu);
    if (ok)
        *status = 0;
    return ok;
}

/* Read the slots that are ready (status 0), trying replica after replica. */
static void get_read(ty_store_client_t *c, size_t n, PB(GetReply) * g, void *const *bufs,
                     const uint64_t *caps, uint64_t *lens, int *status, uint64_t t0,
                     const size_t *map)
{
    struct xitem *it = calloc(n, sizeof(*it));
    TY_ASSERT(it != NULL);
    for (size_t round = 0; round < TY_STORE_REPLICAS_MAX; round++) {
        size_t todo = 0;
        for (size_t j = 0; j < g->n_slots; j++) {
            size_t i = map[j];
            const PB(GetSlot) *s = g->slots[j];
            it[j].status = 2; /* nothing to do */
            if (status[i] != 1 || round >= s->n_replicas)
                continue;
            it[j] = (struct xitem){
                .buf = bufs[i], .len = s->length, .remote = s->replicas[round]->addr, .status = 1};
            if (seg_get(c, s->replicas[round]->segment, &it[j].seg) != 0)
                it[j].status = TY_EUNAVAIL;
            todo++;
        }
        if (todo == 0)
            break;
        xfer_run(c, TY_XFER_OP_READ, it, g->n_slots);
        uint64_t t_done = ty_clock_ns(); /* every read of this round has finished */
        for (size_t j = 0; j < g->n_slots; j++) {
            if (it[j].status != 2 &&
                get_check(c, g->slots[j], &it[j], t0, t_done, &status[map[j]]))
                lens[map[j]] = g->slots[j]->length;
            seg_put(c, it[j].seg);
            it[j].seg = NULL;
        }
    }
    for (size_t j = 0; j < g->n_slots; j++)
        if (status[map[j]] == 1)
            status[map[j]] = TY_ENOTFOUND; /* every replica failed: a clean miss */
    free(it);
    (void)caps;
}

/* One round: ask the master about the keys still marked 1 (to do); read those it has. */
static int get_round(ty_store_client_t *c, size_t n, const char *const *keys, void *const *bufs,
                     const uint64_t *caps, uint64_t *lens, int *status, bool *again)
{
    const char **sub = calloc(n, sizeof(*sub));
    size_t *map = calloc(n, sizeof(*map));
    TY_ASSERT(sub && map);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (status[i] == 1) {
            sub[m] = keys[i];
            map[m++] = i;
        }
    PB(GetReply) *g = NULL;
    uint64_t t0 = ty_clock_ns(); /* before the request: the lease runs from later than this */
    int rc = get_slots(c, m, sub, &g);
    *again = false;
    if (rc == 0) {
        for (size_t j = 0; j < m; j++) {
            PB(GetSlot) *s = g->slots[j];
            size_t i = map[j];
            if (s->status == TY_EAGAIN) {
                *again = true; /* loading from SSD: ask again */
                status[i] = 3; /* not read this round */
                continue;
            }
            status[i] = s->status != 0 ? s->status : s->n_replicas == 0 ? TY_ENOTFOUND : 1;
            if (status[i] == 1 && s->length > caps[i]) {
                lens[i] = s->length;
                status[i] = TY_ENOSPC;
            }
        }
        get_read(c, n, g, bufs, caps, lens, status, t0, map);
        for (size_t j = 0; j < m; j++)
            if (status[map[j]] == 3)
                status[map[j]] = 1;
        PB_FN(get_reply__free_unpacked)(g, NULL);
    }
    free(sub);
    free(map);
    return rc;
}

int ty_store_client_get_batch(ty_store_client_t *c, size_t n, const char *const *keys,
                              void *const *bufs, const uint64_t *caps, uint64_t *lens, int *status)
{
    for (size_t i = 0; i < n; i++)
        if (!key_ok(keys[i]) || !bufs[i])
            return TY_EINVAL;
    for (size_t i = 0; i < n; i++) {
        status[i] = 1;
        lens[i] = 0;
    }
    uint64_t deadline = ty_clock_ms() + c->timeout_ms;
    int rc = 0;
    bool again = n > 0;
    while (again) {
        rc = get_round(c, n, keys, bufs, caps, lens, status, &again);
        if (rc != 0 || !again || ty_clock_ms() >= deadline)
            break;
        ty_sleep_ns(2 * 1000000ull);
    }
    size_t hits = 0;
    for (size_t i = 0; i < n; i++) {
        if (status[i] == 1)
            status[i] = rc != 0 ? rc : TY_ETIMEDOUT;
        hits += status[i] == 0;
    }
    pthread_mutex_lock(&c->mu);
    c->st.gets += n;
    c->st.hits += hits;
    pthread_mutex_unlock(&c->mu);
    return first_error(status, n);
}

int ty_store_client_get(ty_store_client_t *c, const char *key, void *buf, uint64_t cap,
                        uint64_t *len)
{
    int st;
    return ty_store_client_get_batch(c, 1, &key, &buf, &cap, len, &st);
}

/* ---- key operations ------------------------------------------------------------------------- */

static int keys_op(ty_store_client_t *c, PB(KeysOpKind) op, uint32_t replicas, size_t n,
                   const char *const *keys, int *status)
{
    for (size_t i = 0; i < n; i++)
        if (!key_ok(keys[i]))
            return TY_EINVAL;
    PB(KeysOp) req = PB_INIT(KEYS_OP);
    req.op = op;
    req.n_keys = n;
    req.keys = (char **)keys;
    req.replicas = replicas;
    uint8_t *rep = NULL;
    size_t rl = 0;
    int rc = call(c, SM_KEYS, &req.base, &rep, &rl);
    PB(Statuses) *r = rc == 0 ? PB_FN(statuses__unpack)(NULL, rl, rep) : NULL;
    if (rc == 0 && (!r || r->n_status != n))
        rc = TY_EBADMSG;
    for (size_t i = 0; i < n; i++)
        status[i] = rc != 0 ? rc : r->status[i];
    if (r)
        PB_FN(statuses__free_unpacked)(r, NULL);
    free(rep);
    return rc != 0 ? rc : first_error(status, n);
}

#define KOP(x) TYCHO__STORE__V1__KEYS_OP_KIND__KEYS_OP_##x

int ty_store_client_exists_batch(ty_store_client_t *c, size_t n, const char *const *keys,
                                 int *status)
{
    return keys_op(c, KOP(EXISTS), 0, n, keys, status);
}

int ty_store_client_remove(ty_store_client_t *c, const char *key)
{
    int st;
    return keys_op(c, KOP(REMOVE), 0, 1, &key, &st);
}

void ty_store_client_stats(ty_store_client_t *c, struct ty_store_client_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    out->segments_open = (uint64_t)c->n_segs;
    pthread_mutex_unlock(&c->mu);
}

struct subscription {
    ty_store_client_t *c;
    ty_store_event_cb cb;
    void *arg;
    bool snapshot;
    char prefix[TY_STORE_KEY_MAX + 1];
};

static void sub_event(const PB(Event) * e, struct subscription *s)
{
    struct ty_store_event ev = {
        .kind = e->kind == TYCHO__STORE__V1__EVENT_KIND__EVENT_KIND_STORED ? TY_STORE_EVENT_STORED
                                                                           : TY_STORE_EVENT_REMOVED,
        .tier =
            e->tier == TYCHO__STORE__V1__TIER__TIER_SSD ? TY_STORE_TIER_SSD : TY_STORE_TIER_DRAM,
        .offset = e->offset,
        .length = e->length,
        .checksum = e->checksum};
    snprintf(ev.key, sizeof(ev.key), "%s", e->key ? e->key : "");
    s->cb(&ev, e->node ? e->node : "", s->arg);
}

static void sub_result(const struct ty_rpc_result *res, void *arg)
{
    struct subscription *s = arg;
    if (res->event != TY_RPC_EVENT_ITEM) {
        s->cb(NULL, NULL, s->arg);
        free(s);
        return;
    }
    PB(Events) *m = PB_FN(events__unpack)(NULL, res->len, res->payload);
    for (size_t i = 0; m && i < m->n_events; i++)
        sub_event(m->events[i], s);
    if (m)
        PB_FN(events__free_unpacked)(m, NULL);
}

static void sub_start(void *arg)
{
    struct subscription *s = arg;
    PB(Subscribe) req = PB_INIT(SUBSCRIBE);
    req.snapshot = s->snapshot;
    req.key_prefix = s->prefix;
    struct ty_rpc_call_opts o = {.stream = true, .timeout_ms = UINT32_MAX};
    if (!s->c->rpc ||
        ty_rpc_client_call_msg(s->c->rpc, SM_SUBSCRIBE, &req.base, &o, sub_result, s, NULL) != 0) {
        s->cb(NULL, NULL, s->arg);
        free(s);
    }
}

int ty_store_client_subscribe_snapshot(ty_store_client_t *c, const char *prefix, bool snapshot,
                                       ty_store_event_cb cb, void *arg)
{
    if (prefix && strlen(prefix) > TY_STORE_KEY_MAX)
        return TY_EINVAL;
    struct subscription *s = malloc(sizeof(*s));
    TY_ASSERT(s != NULL);
    *s = (struct subscription){.c = c, .cb = cb, .arg = arg, .snapshot = snapshot};
    snprintf(s->prefix, sizeof(s->prefix), "%s", prefix ? prefix : "");
    int rc = ty_rpc_mailbox_post(c->mb, sub_start, s);
    if (rc != 0)
        free(s);
    return rc;
}

int ty_store_client_master_stats(ty_store_client_t *c, struct ty_store_meta_stats *out,
                                 uint64_t *epoch)
{
    PB(Subscribe) req = PB_INIT(SUBSCRIBE);
    uint8_t *rep;
    size_t rl;
    int rc = call(c, SM_STATS, &req.base, &rep, &rl);
    if (rc != 0)
        return rc;
    PB(Stats) *r = PB_FN(stats__unpack)(NULL, rl, rep);
    free(rep);
    if (!r)
        return TY_EBADMSG;
    memset(out, 0, sizeof(*out));
    out->objects = r->objects;
    out->pending_puts = r->pending_puts;
    out->nodes_alive = r->nodes_alive;
    out->dram_bytes = r->dram_bytes;
    out->dram_used = r->dram_used;
    out->evictions = r->evictions;
    out->offloads = r->offloads;
    out->expired_puts = r->expired_puts;
    out->dead_nodes = r->dead_nodes;
    out->hot_blocks = r->hot_blocks;
    out->replications_started = r->replications_started;
    out->replications_done = r->replications_done;
    out->replications_failed = r->replications_failed;
    out->cold_evictions = r->cold_evictions;
    if (epoch)
        *epoch = r->epoch;
    PB_FN(stats__free_unpacked)(r, NULL);
    return 0;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

static int parse_list(ty_store_client_t *c, const char *list)
{
    const char *p = list;
    while (p && *p && c->n_masters < MASTERS_MAX) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof(c->masters[0]))
            return TY_EINVAL;
        memcpy(c->masters[c->n_masters], p, len);
        c->masters[c->n_masters++][len] = 0;
        p += len + (p[len] == ',');
    }
    return c->n_masters > 0 ? 0 : TY_EINVAL;
}

static int client_engine(ty_store_client_t *c, const struct ty_store_client_opts *o)
{
    if (o->engine) {
        c->xfer = o->engine;
    } else {
        struct ty_xfer_engine_opts xo = {
            .listen_host = o->listen_host,
            .checksum = o->xfer_checksum,
            .transport = o->transport,
            .tcp_conns = o->tcp_conns,
            .auth = o->auth};
        int rc = ty_xfer_engine_new(&c->xfer, &xo);
        if (rc != 0)
            return rc;
        c->own_xfer = true;
    }
    c->stage_bytes = o->staging_bytes ? o->staging_bytes : 8u << 20;
    void *p;
    int rc = ty_xfer_mem_alloc(c->xfer, c->stage_bytes, &p);
    c->stage = p;
    return rc;
}

static void client_release(ty_store_client_t *c)
{
    if (c->stage)
        ty_xfer_mem_release(c->xfer, c->stage);
    for (int i = 0; i < c->n_segs; i++)
        ty_xfer_segment_close(c->xfer, c->segs[i].s);
    free(c->segs);
    for (int i = 0; i < c->n_regions; i++)
        ty_xfer_mem_unregister(c->xfer, c->regions[i].addr);
    if (c->own_xfer)
        ty_xfer_engine_free(c->xfer);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->stage_mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

int ty_store_client_new(ty_store_client_t **out, const struct ty_store_client_opts *o)
{
    if (!o || (o->writer && strlen(o->writer) > TY_STORE_NODE_NAME_MAX) ||
        o->verify > TY_STORE_VERIFY_LEASE || o->segments_max > 65536)
        return TY_EINVAL;
    ty_store_client_t *c = calloc(1, sizeof(*c));
    TY_ASSERT(c != NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->stage_mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    snprintf(c->writer, sizeof(c->writer), "%s", o->writer ? o->writer : "");
    c->replicas = o->replicas;
    c->auth = o->auth;
    c->timeout_ms = o->timeout_ms ? o->timeout_ms : 10000;
    c->verify = o->verify;
    c->xfer_checksum = o->xfer_checksum;
    c->segs_max = o->segments_max ? (int)o->segments_max : SEGS_MAX;
    c->segs_cap = c->segs_max;
    c->segs = calloc((size_t)c->segs_cap, sizeof(*c->segs));
    TY_ASSERT(c->segs != NULL);
    int rc = parse_list(c, o->master);
    if (rc == 0)
        rc = client_engine(c, o);
    if (rc == 0)
        rc = pthread_create(&c->thr, NULL, rpc_thread, c) == 0 ? 0 : TY_ENOMEM;
    if (rc != 0) {
        client_release(c);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    while (!c->started)
        pthread_cond_wait(&c->cv, &c->mu);
    rc = c->start_rc;
    pthread_mutex_unlock(&c->mu);
    if (rc != 0) {
        pthread_join(c->thr, NULL);
        client_release(c);
        return rc;
    }
    *out = c;
    return 0;
}

void ty_store_client_free(ty_store_client_t *c)
{
    if (!c)
        return;
    ty_rpc_mailbox_post(c->mb, stop_loop, c);
    pthread_join(c->thr, NULL);
    client_release(c);
}
