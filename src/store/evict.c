/* The master's metadata: eviction policies, jobs for pool nodes, the periodic tick
 * (store_meta.h). Eviction follows Mooncake Store: it starts when a node's DRAM use passes the
 * high watermark and frees down to the low one; leased objects and objects a job works on are
 * never chosen; soft-pinned objects only when nothing else is left. Extra replicas of keys that
 * were hot and cooled down go before anything else (section 6.2: hot blocks get replicas while
 * hot; the copies are the cheapest loss once they are not). */
#include "meta-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"

#include <stdlib.h>
#include <string.h>

#define EXPIRY_SCAN_MS     100
#define REPLICATE_RETRY_MS 1000 /* after a failed REPLICATE job */

struct cand {
    struct meta_object *o;
    double k1, k2; /* sort keys, ascending: evicted first */
};

static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->k1 != y->k1)
        return x->k1 < y->k1 ? -1 : 1;
    if (x->k2 != y->k2)
        return x->k2 < y->k2 ? -1 : 1;
    return strcmp(x->o->key, y->o->key);
}

static void cand_score(const ty_store_meta_t *m, struct cand *c, uint64_t now)
{
    const struct meta_object *o = c->o;
    switch (m->o.policy) {
    case TY_STORE_POLICY_LFU:
        c->k1 = (double)o->accesses;
        c->k2 = (double)o->last_access;
        break;
    case TY_STORE_POLICY_LENGTH_AWARE:
        /* Big idle blocks free the most room for the least expected reuse (GDSF-like). */
        c->k1 = -((double)(now - o->last_access + 1) * (double)o->length);
        c->k2 = (double)o->last_access;
        break;
    case TY_STORE_POLICY_LRU:
    default:
        c->k1 = (double)o->last_access;
        c->k2 = 0;
        break;
    }
}

/* Index of o's evictable DRAM replica on node id, or -1. */
static int evictable(const struct meta_object *o, uint32_t id, uint64_t now)
{
    if (!o->committed || o->lease_until > now)
        return -1;
    int i = ty__store_meta_find_replica(o, id, TY_STORE_TIER_DRAM);
    if (i < 0 || o->rep[i].job != 0 || o->rep[i].r.state != TY_STORE_REPLICA_COMPLETE)
        return -1;
    return i;
}

/* Whether replica i of o is an extra one of a cooled key with another readable DRAM replica:
 * the first to go on eviction, never offloaded. */
static bool cold_extra(const struct meta_object *o, int i)
{
    if (o->hot || !o->rep[i].extra)
        return false;
    for (uint32_t k = 0; k < o->n; k++)
        if ((int)k != i && o->rep[k].r.tier == TY_STORE_TIER_DRAM &&
            o->rep[k].r.state == TY_STORE_REPLICA_COMPLETE)
            return true;
    return false;
}

/* Eviction group of o's replica i: 0 cold extra, 1 unpinned, 2 soft-pinned. */
static int cand_group(const struct meta_object *o, int i)
{
    if (o->pins > 0)
        return 2;
    return cold_extra(o, i) ? 0 : 1;
}

/* Candidates on node id by group (cand_group), each group in policy order. */
static struct cand *collect(ty_store_meta_t *m, uint32_t id, uint64_t now, size_t *n_out)
{
    size_t n = 0, cap = 256;
    struct cand *c = malloc(cap * sizeof(*c));
    TY_ASSERT(c != NULL);
    for (int grp = 0; grp < 3; grp++) {
        size_t start = n;
        for (size_t b = 0; b < m->n_buckets; b++)
            for (struct meta_object *o = m->buckets[b]; o; o = o->next) {
                int i = evictable(o, id, now);
                if (i < 0 || cand_group(o, i) != grp)
                    continue;
                if (n == cap) {
                    cap *= 2;
                    c = realloc(c, cap * sizeof(*c));
                    TY_ASSERT(c != NULL);
                }
                c[n].o = o;
                cand_score(m, &c[n], now);
                n++;
            }
        qsort(c + start, n - start, sizeof(*c), cand_cmp);
    }
    *n_out = n;
    return c;
}

static void offload(ty_store_meta_t *m, struct meta_object *o, int i, uint64_t now)
{
    struct ty_store_job j = {.kind = TY_STORE_JOB_OFFLOAD,
                             .node = o->rep[i].r.node,
                             .src_offset = o->rep[i].r.offset,
                             .length = o->length,
                             .checksum = o->checksum};
    strcpy(j.key, o->key);
    o->rep[i].job = ty__store_meta_job_push(m, &j);
    if (o->lease_until < now + m->o.lease_ms) /* the node reads the range meanwhile */
        o->lease_until = now + m->o.lease_ms;
    m->st.offloads++;
}

uint64_t ty__store_meta_evict_node(ty_store_meta_t *m, uint32_t id, uint64_t need, uint64_t now)
{
    struct meta_node *n = ty__store_meta_node(m, id);
    if (!n || !n->alive)
        return 0;
    uint64_t size = ty_store_alloc_size(n->alloc);
    uint64_t target = (uint64_t)(m->o.low_watermark * (double)size);
    if (need > 0 && size - need < target)
        target = need > size ? 0 : size - need;
    if (ty_store_alloc_used(n->alloc) <= target)
        return 0;
    size_t nc;
    struct cand *c = collect(m, id, now, &nc);
    uint64_t freed = 0, planned = 0;
    for (size_t k = 0; k < nc && ty_store_alloc_used(n->alloc) > target + planned; k++) {
        struct meta_object *o = c[k].o;
        int i = evictable(o, id, now);
        if (i < 0)
            continue;
        bool cold = cold_extra(o, i);
        if (!cold && n->has_ssd && ty__store_meta_find_replica(o, id, TY_STORE_TIER_SSD) < 0 &&
            o->n < TY_STORE_REPLICAS_MAX) {
            offload(m, o, i, now);
            planned += o->length;
            continue;
        }
        freed += o->length;
        m->st.evictions++;
        m->st.cold_evictions += cold;
        ty__store_meta_drop_replica(m, o, (uint32_t)i, now);
        if (o->n == 0)
            ty__store_meta_delete(m, o); /* c[] holds no other pointer to o: one per object */
    }
    free(c);
    return freed;
}

/* ---- jobs ------------------------------------------------------------------------------------ */

uint64_t ty__store_meta_job_push(ty_store_meta_t *m, const struct ty_store_job *j)
{
    if (m->n_queue == m->cap_queue) {
        m->cap_queue = m->cap_queue ? m->cap_queue * 2 : 64;
        m->queue = realloc(m->queue, m->cap_queue * sizeof(*m->queue));
        TY_ASSERT(m->queue != NULL);
    }
    struct ty_store_job *q = &m->queue[m->n_queue++];
    *q = *j;
    q->id = m->next_job++;
    return q->id;
}

int ty_store_meta_job_next(ty_store_meta_t *m, struct ty_store_job *out)
{
    if (m->n_queue == 0)
        return TY_EAGAIN;
    *out = m->queue[0];
    memmove(m->queue, m->queue + 1, (m->n_queue - 1) * sizeof(*m->queue));
    m->n_queue--;
    if (m->n_inflight == m->cap_inflight) {
        m->cap_inflight = m->cap_inflight ? m->cap_inflight * 2 : 64;
        m->inflight = realloc(m->inflight, m->cap_inflight * sizeof(*m->inflight));
        TY_ASSERT(m->inflight != NULL);
    }
    m->inflight[m->n_inflight++] = *out;
    return 0;
}

static int job_replica(const struct meta_object *o, uint64_t id, enum ty_store_tier tier)
{
    for (uint32_t i = 0; o && i < o->n; i++)
        if (o->rep[i].job == id && o->rep[i].r.tier == tier)
            return (int)i;
    return -1;
}

static void done_offload(ty_store_meta_t *m, struct meta_object *o, const struct ty_store_job *j,
                         int status, uint64_t loc, uint64_t now)
{
    int src = job_replica(o, j->id, TY_STORE_TIER_DRAM);
    struct ty_store_replica ssd = {.node = j->node,
                                   .tier = TY_STORE_TIER_SSD,
                                   .state = TY_STORE_REPLICA_COMPLETE,
                                   .offset = loc,
                                   .length = j->length,
                                   .checksum = j->checksum};
    if (src < 0) { /* removed meanwhile: the node must forget its new SSD copy */
        if (status == 0) {
            struct meta_object tmp = {.key = (char *)j->key, .checksum = j->checksum};
            ty__store_meta_event(m, TY_STORE_EVENT_REMOVED, &tmp, &ssd);
        }
        return;
    }
    o->rep[src].job = 0;
    if (status == 0) {
        o->rep[o->n++] = (struct meta_replica){.r = ssd};
        ty__store_meta_event(m, TY_STORE_EVENT_STORED, o, &ssd);
    }
    m->st.evictions++; /* the DRAM copy goes either way: eviction wanted its room */
    ty__store_meta_drop_replica(m, o, (uint32_t)src, now);
    if (o->n == 0)
        ty__store_meta_delete(m, o);
}

static void done_copy(ty_store_meta_t *m, struct meta_object *o, const struct ty_store_job *j,
                      int status, uint64_t now)
{
    int dst = job_replica(o, j->id, TY_STORE_TIER_DRAM);
    int src = j->kind == TY_STORE_JOB_LOAD ? job_replica(o, j->id, TY_STORE_TIER_SSD) : -1;
    if (src >= 0)
        o->rep[src].job = 0;
    if (j->kind == TY_STORE_JOB_REPLICATE) {
        if (status == 0 && dst >= 0) {
            m->st.replications_done++;
        } else {
            m->st.replications_failed++;
            o->repl_retry_at = now + REPLICATE_RETRY_MS;
        }
    }
    if (dst >= 0) {
        o->rep[dst].job = 0;
        if (status == 0) {
            o->rep[dst].r.state = TY_STORE_REPLICA_COMPLETE;
            ty__store_meta_event(m, TY_STORE_EVENT_STORED, o, &o->rep[dst].r);
        } else {
            ty__store_meta_drop_replica(m, o, (uint32_t)dst, now);
        }
    }
    /* drop_replica moves the last replica into the freed slot: look the source up again. */
    src = j->kind == TY_STORE_JOB_LOAD ? ty__store_meta_find_replica(o, j->node, TY_STORE_TIER_SSD)
                                       : -1;
    if (src >= 0 && (status == TY_ECHECKSUM || status == TY_ENOTFOUND))
        ty__store_meta_drop_replica(m, o, (uint32_t)src, now); /* bad or gone on disk */
    if (o->n == 0)
        ty__store_meta_delete(m, o);
}

int ty_store_meta_job_done(ty_store_meta_t *m, uint64_t job_id, int status, uint64_t result,
                           uint64_t now)
{
    size_t k = 0;
    while (k < m->n_inflight && m->inflight[k].id != job_id)
        k++;
    if (k == m->n_inflight)
        return TY_ENOTFOUND;
    struct ty_store_job j = m->inflight[k];
    m->inflight[k] = m->inflight[--m->n_inflight];
    struct meta_object *o = ty__store_meta_lookup(m, j.key);
    if (j.kind == TY_STORE_JOB_OFFLOAD)
        done_offload(m, o, &j, status, result, now);
    else if (o)
        done_copy(m, o, &j, status, now);
    return 0;
}

/* ---- tick ------------------------------------------------------------------------------------ */

static void expire_puts(ty_store_meta_t *m, uint64_t now)
{
    if (m->n_pending == 0 || now < m->next_expiry_scan)
        return;
    uint64_t earliest = UINT64_MAX;
    for (size_t b = 0; b < m->n_buckets; b++) {
        struct meta_object *o = m->buckets[b];
        while (o) {
            struct meta_object *next = o->next;
            if (!o->committed && o->put_deadline <= now) {
                m->st.expired_puts++;
                ty__store_meta_drop_all(m, o, now);
            } else if (!o->committed && o->put_deadline < earliest) {
                earliest = o->put_deadline;
            }
            o = next;
        }
    }
    /* Full scans at most every EXPIRY_SCAN_MS, but never later than the next deadline. */
    m->next_expiry_scan = now + EXPIRY_SCAN_MS;
    if (earliest < m->next_expiry_scan)
        m->next_expiry_scan = earliest;
}

/* The emptiest live node without a DRAM replica of o that has room for it, or -1. */
static int replicate_target(ty_store_meta_t *m, const struct meta_object *o)
{
    int best = -1;
    uint64_t best_free = 0;
    for (uint32_t id = 0; id < m->n_nodes; id++) {
        struct meta_node *n = &m->nodes[id];
        uint64_t free_b = n->used && n->alive ? ty__store_meta_node_free(n) : 0;
        if (free_b < o->length || free_b <= best_free ||
            ty__store_meta_find_replica(o, id, TY_STORE_TIER_DRAM) >= 0)
            continue;
        best = (int)id;
        best_free = free_b;
    }
    return best;
}

/* Queue one REPLICATE job when o has fewer DRAM replicas than it wants: the emptiest node
 * without one pulls the bytes from a complete replica (no eviction for it: a copy is not worth
 * another block). */
static void replicate_one(ty_store_meta_t *m, struct meta_object *o, uint64_t now)
{
    uint32_t have = 0;
    int src = -1;
    for (uint32_t i = 0; i < o->n; i++)
        if (o->rep[i].r.tier == TY_STORE_TIER_DRAM) {
            have++;
            if (o->rep[i].r.state == TY_STORE_REPLICA_COMPLETE && o->rep[i].job == 0)
                src = (int)i;
        }
    if (!o->committed || have >= o->want_replicas || src < 0 || o->n >= TY_STORE_REPLICAS_MAX ||
        now < o->repl_retry_at)
        return;
    int id = replicate_target(m, o);
    uint64_t off;
    if (id < 0 || ty_store_alloc_take(m->nodes[id].alloc, o->length, &off) != 0)
        return;
    struct ty_store_job j = {.kind = TY_STORE_JOB_REPLICATE,
                             .node = (uint32_t)id,
                             .src_node = o->rep[src].r.node,
                             .src_offset = o->rep[src].r.offset,
                             .dst_offset = off,
                             .length = o->length,
                             .checksum = o->checksum};
    strcpy(j.key, o->key);
    uint64_t jid = ty__store_meta_job_push(m, &j);
    m->st.replications_started++;
    o->rep[o->n++] = (struct meta_replica){.r = {.node = (uint32_t)id,
                                                 .tier = TY_STORE_TIER_DRAM,
                                                 .state = TY_STORE_REPLICA_PENDING,
                                                 .offset = off,
                                                 .length = o->length,
                                                 .checksum = o->checksum},
                                           .job = jid,
                                           .extra = o->hot && have >= o->want_set};
    if (o->lease_until < now + m->o.lease_ms) /* the source is read meanwhile */
        o->lease_until = now + m->o.lease_ms;
}

/* A hot key whose rate fell below half the threshold cools: its target goes back to what
 * set_replicas asked (its extra replicas stay, first in line for eviction). */
static void cool(ty_store_meta_t *m, struct meta_object *o, uint64_t now)
{
    if (!o->hot ||
        ty_store_heat_rate(&o->heat, now, m->o.hot_half_life_ms) >= m->o.hot_reads_per_s / 2)
        return;
    o->hot = false;
    m->st.hot_blocks--;
    o->want_replicas = o->want_set;
}

static void replicate_hot(ty_store_meta_t *m, uint64_t now)
{
    size_t w = 0;
    for (size_t i = 0; i < m->n_hot; i++) {
        struct meta_object *o = ty__store_meta_lookup(m, m->hot[i]);
        if (o)
            cool(m, o, now);
        if (!o || o->want_replicas == 0) {
            free(m->hot[i]);
            continue;
        }
        replicate_one(m, o, now);
        m->hot[w++] = m->hot[i];
    }
    m->n_hot = w;
}

void ty_store_meta_tick(ty_store_meta_t *m, uint64_t now)
{
    ty__store_meta_run_frees(m, now);
    for (uint32_t id = 0; id < m->n_nodes; id++) {
        struct meta_node *n = &m->nodes[id];
        if (n->used && n->alive && now > n->last_heartbeat + m->o.node_timeout_ms) {
            TY_LOG_WARN("store", "node %s missed heartbeats for %llu ms: removed", n->name,
                        (unsigned long long)(now - n->last_heartbeat));
            m->st.dead_nodes++;
            ty_store_meta_node_remove(m, id);
        }
    }
    expire_puts(m, now);
    for (uint32_t id = 0; id < m->n_nodes; id++) {
        struct meta_node *n = &m->nodes[id];
        if (n->used && n->alive &&
            (double)ty_store_alloc_used(n->alloc) >
                m->o.high_watermark * (double)ty_store_alloc_size(n->alloc))
            ty__store_meta_evict_node(m, id, 0, now);
    }
    replicate_hot(m, now);
}
