/* The master's metadata: key map, nodes, two-phase puts, leased gets (store_meta.h). */
#include "meta-impl.h"

#include "tycho/errors.h"
#include "tycho/hash.h"
#include "tycho/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EVENTS_MAX (1u << 20) /* queued events kept when nobody drains them */

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n);
    TY_ASSERT(q != NULL);
    return q;
}

const char *ty_store_policy_name(enum ty_store_policy p)
{
    switch (p) {
    case TY_STORE_POLICY_LRU:
        return "lru";
    case TY_STORE_POLICY_LFU:
        return "lfu";
    case TY_STORE_POLICY_LENGTH_AWARE:
        return "length_aware";
    }
    return "?";
}

int ty_store_meta_new(ty_store_meta_t **out, const struct ty_store_meta_opts *opts)
{
    struct ty_store_meta_opts o = opts ? *opts : (struct ty_store_meta_opts){0};
    if (o.high_watermark == 0)
        o.high_watermark = 0.9;
    if (o.low_watermark == 0)
        o.low_watermark = o.high_watermark - 0.1;
    if (!(o.high_watermark > 0 && o.high_watermark <= 1) || !(o.low_watermark > 0) ||
        o.low_watermark > o.high_watermark || (unsigned)o.policy > TY_STORE_POLICY_LENGTH_AWARE)
        return TY_EINVAL;
    if (o.put_timeout_ms == 0)
        o.put_timeout_ms = 10000;
    if (o.lease_ms == 0)
        o.lease_ms = 5000;
    if (o.node_timeout_ms == 0)
        o.node_timeout_ms = 5000;
    if (o.default_replicas == 0)
        o.default_replicas = 1;
    if (o.align == 0)
        o.align = 64;
    if (o.hot_replicas == 0)
        o.hot_replicas = 2;
    if (o.hot_max == 0)
        o.hot_max = 1024;
    if (o.hot_half_life_ms == 0)
        o.hot_half_life_ms = 1000;
    if (o.default_replicas > TY_STORE_REPLICAS_MAX || (o.align & (o.align - 1)) != 0 ||
        o.hot_replicas > TY_STORE_REPLICAS_MAX || !(o.hot_reads_per_s >= 0))
        return TY_EINVAL;
    ty_store_meta_t *m = calloc(1, sizeof(*m));
    TY_ASSERT(m != NULL);
    m->o = o;
    m->n_buckets = 1024;
    m->buckets = calloc(m->n_buckets, sizeof(*m->buckets));
    TY_ASSERT(m->buckets != NULL);
    m->next_job = 1;
    *out = m;
    return 0;
}

void ty_store_meta_free(ty_store_meta_t *m)
{
    if (!m)
        return;
    for (size_t b = 0; b < m->n_buckets; b++) {
        struct meta_object *o = m->buckets[b];
        while (o) {
            struct meta_object *n = o->next;
            free(o->key);
            free(o);
            o = n;
        }
    }
    for (uint32_t i = 0; i < m->n_nodes; i++)
        ty_store_alloc_free(m->nodes[i].alloc);
    free(m->buckets);
    free(m->nodes);
    free(m->frees);
    free(m->queue);
    free(m->inflight);
    for (size_t i = 0; i < m->n_hot; i++)
        free(m->hot[i]);
    free(m->hot);
    free(m->events);
    free(m);
}

/* ---- heat ------------------------------------------------------------------------------------ */

static double heat_at(const struct ty_store_heat *h, uint64_t now, uint64_t half_life_ms)
{
    if (now <= h->at || h->count == 0)
        return h->count;
    return h->count * exp2(-(double)(now - h->at) / (double)half_life_ms);
}

void ty_store_heat_add(struct ty_store_heat *h, uint64_t now, uint64_t half_life_ms)
{
    h->count = heat_at(h, now, half_life_ms) + 1;
    if (now > h->at)
        h->at = now;
}

double ty_store_heat_rate(const struct ty_store_heat *h, uint64_t now, uint64_t half_life_ms)
{
    /* sum of r dt 2^(-t/H) over t >= 0 is r H / ln 2 */
    return heat_at(h, now, half_life_ms) * 0.69314718055994530942 * 1000.0 / (double)half_life_ms;
}

/* ---- key map ------------------------------------------------------------------------------- */

static uint64_t key_hash(const char *key)
{
    return ty_hash_bytes(key, strlen(key), 0x7479636f);
}

bool ty__store_meta_key_valid(const char *key)
{
    if (!key)
        return false;
    size_t n = strnlen(key, TY_STORE_KEY_MAX + 1);
    return n > 0 && n <= TY_STORE_KEY_MAX;
}

struct meta_object *ty__store_meta_lookup(const ty_store_meta_t *m, const char *key)
{
    if (!ty__store_meta_key_valid(key))
        return NULL;
    uint64_t h = key_hash(key);
    for (struct meta_object *o = m->buckets[h & (m->n_buckets - 1)]; o; o = o->next)
        if (o->hash == h && strcmp(o->key, key) == 0)
            return o;
    return NULL;
}

static void map_grow(ty_store_meta_t *m)
{
    size_t nb = m->n_buckets * 2;
    struct meta_object **b = calloc(nb, sizeof(*b));
    TY_ASSERT(b != NULL);
    for (size_t i = 0; i < m->n_buckets; i++) {
        struct meta_object *o = m->buckets[i];
        while (o) {
            struct meta_object *n = o->next;
            o->next = b[o->hash & (nb - 1)];
            b[o->hash & (nb - 1)] = o;
            o = n;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->n_buckets = nb;
}

struct meta_object *ty__store_meta_insert(ty_store_meta_t *m, const char *key)
{
    if (m->n_objects + 1 > m->n_buckets)
        map_grow(m);
    struct meta_object *o = calloc(1, sizeof(*o));
    TY_ASSERT(o != NULL);
    o->key = strdup(key);
    TY_ASSERT(o->key != NULL);
    o->hash = key_hash(key);
    size_t b = o->hash & (m->n_buckets - 1);
    o->next = m->buckets[b];
    m->buckets[b] = o;
    m->n_objects++;
    return o;
}

void ty__store_meta_delete(ty_store_meta_t *m, struct meta_object *o)
{
    struct meta_object **pp = &m->buckets[o->hash & (m->n_buckets - 1)];
    while (*pp != o)
        pp = &(*pp)->next;
    *pp = o->next;
    if (!o->committed)
        m->n_pending--;
    if (o->hot)
        m->st.hot_blocks--;
    m->n_objects--;
    free(o->key);
    free(o);
}

/* ---- events -------------------------------------------------------------------------------- */

void ty__store_meta_event(ty_store_meta_t *m, enum ty_store_event_kind kind,
                          const struct meta_object *o, const struct ty_store_replica *r)
{
    if (m->ev_len == m->ev_cap) {
        if (m->ev_cap >= EVENTS_MAX) { /* nobody drains: forget the oldest */
            m->ev_head = (m->ev_head + 1) % m->ev_cap;
            m->ev_len--;
        } else {
            size_t nc = m->ev_cap ? m->ev_cap * 2 : 256;
            struct ty_store_event *ne = xrealloc(NULL, nc * sizeof(*ne));
            for (size_t i = 0; i < m->ev_len; i++)
                ne[i] = m->events[(m->ev_head + i) % m->ev_cap];
            free(m->events);
            m->events = ne;
            m->ev_cap = nc;
            m->ev_head = 0;
        }
    }
    struct ty_store_event *e = &m->events[(m->ev_head + m->ev_len) % m->ev_cap];
    m->ev_len++;
    memset(e, 0, sizeof(*e));
    e->kind = kind;
    strcpy(e->key, o->key);
    e->node = r->node;
    e->tier = r->tier;
    e->offset = r->offset;
    e->length = r->length;
    e->checksum = o->checksum;
}

size_t ty_store_meta_snapshot(const ty_store_meta_t *m, const char *prefix,
                              void (*cb)(void *arg, const struct ty_store_event *ev), void *arg)
{
    size_t n = 0, plen = prefix ? strlen(prefix) : 0;
    for (size_t b = 0; b < m->n_buckets; b++) {
        for (const struct meta_object *o = m->buckets[b]; o; o = o->next) {
            if (!o->committed || (plen && strncmp(o->key, prefix, plen) != 0))
                continue;
            for (uint32_t i = 0; i < o->n; i++) {
                const struct ty_store_replica *r = &o->rep[i].r;
                if (r->state != TY_STORE_REPLICA_COMPLETE)
                    continue;
                struct ty_store_event e = {.kind = TY_STORE_EVENT_STORED, .node = r->node,
                                           .tier = r->tier, .offset = r->offset,
                                           .length = r->length, .checksum = o->checksum};
                strcpy(e.key, o->key); /* keys are valid, <= TY_STORE_KEY_MAX */
                cb(arg, &e);
                n++;
            }
        }
    }
    return n;
}

size_t ty_store_meta_events_take(ty_store_meta_t *m, struct ty_store_event *out, size_t cap)
{
    size_t n = 0;
    while (n < cap && m->ev_len > 0) {
        out[n++] = m->events[m->ev_head];
        m->ev_head = (m->ev_head + 1) % m->ev_cap;
        m->ev_len--;
    }
    return n;
}

/* ---- replicas -------------------------------------------------------------------------------- */

struct meta_node *ty__store_meta_node(const ty_store_meta_t *m, uint32_t id)
{
    if (id >= m->n_nodes || !m->nodes[id].used)
        return NULL;
    return &m->nodes[id];
}

static void free_range_at(ty_store_meta_t *m, uint32_t node, uint64_t off, uint64_t len,
                          uint64_t at, uint64_t now)
{
    struct meta_node *n = ty__store_meta_node(m, node);
    if (!n || !n->alive)
        return; /* the node's memory went with it */
    if (at <= now) {
        int rc = ty_store_alloc_give(n->alloc, off, len);
        TY_ASSERT(rc == 0);
        return;
    }
    if (m->n_frees == m->cap_frees) {
        m->cap_frees = m->cap_frees ? m->cap_frees * 2 : 64;
        m->frees = xrealloc(m->frees, m->cap_frees * sizeof(*m->frees));
    }
    m->frees[m->n_frees++] =
        (struct meta_free){.node = node, .offset = off, .length = len, .at = at};
    m->st.deferred_frees++;
}

static void drop_at(ty_store_meta_t *m, struct meta_object *o, uint32_t i, uint64_t at,
                    uint64_t now)
{
    struct ty_store_replica r = o->rep[i].r;
    if (r.state == TY_STORE_REPLICA_COMPLETE)
        ty__store_meta_event(m, TY_STORE_EVENT_REMOVED, o, &r);
    if (r.tier == TY_STORE_TIER_DRAM)
        free_range_at(m, r.node, r.offset, r.length, at, now);
    o->rep[i] = o->rep[--o->n];
}

void ty__store_meta_drop_replica(ty_store_meta_t *m, struct meta_object *o, uint32_t i,
                                 uint64_t now)
{
    uint64_t at = o->lease_until;
    /* A writer (client put, node load) may still be writing a pending range: give it a lease. */
    if (o->rep[i].r.state == TY_STORE_REPLICA_PENDING && now + m->o.lease_ms > at)
        at = now + m->o.lease_ms;
    drop_at(m, o, i, at, now);
}

void ty__store_meta_drop_all(ty_store_meta_t *m, struct meta_object *o, uint64_t now)
{
    while (o->n > 0)
        ty__store_meta_drop_replica(m, o, o->n - 1, now);
    ty__store_meta_delete(m, o);
}

void ty__store_meta_run_frees(ty_store_meta_t *m, uint64_t now)
{
    size_t w = 0;
    for (size_t i = 0; i < m->n_frees; i++) {
        struct meta_free f = m->frees[i];
        if (f.at <= now)
            free_range_at(m, f.node, f.offset, f.length, 0, now);
        else
            m->frees[w++] = f;
    }
    m->n_frees = w;
}

/* ---- nodes ----------------------------------------------------------------------------------- */

static void node_forget(ty_store_meta_t *m, uint32_t id)
{
    for (size_t b = 0; b < m->n_buckets; b++) {
        struct meta_object *o = m->buckets[b];
        while (o) {
            struct meta_object *next = o->next;
            for (uint32_t i = o->n; i-- > 0;)
                if (o->rep[i].r.node == id)
                    drop_at(m, o, i, 0, 0);
            if (o->n == 0)
                ty__store_meta_delete(m, o);
            o = next;
        }
    }
    /* Deferred frees and queued jobs of that node are void now. */
    size_t w = 0;
    for (size_t i = 0; i < m->n_frees; i++)
        if (m->frees[i].node != id)
            m->frees[w++] = m->frees[i];
    m->n_frees = w;
}

/* Jobs done by or reading from a removed node fail, which releases what they held. */
static void fail_node_jobs(ty_store_meta_t *m, uint32_t id)
{
    struct ty_store_job j;
    size_t n = m->n_queue;
    for (size_t k = 0; k < n && ty_store_meta_job_next(m, &j) == 0; k++) {
        if (j.node == id || (j.kind == TY_STORE_JOB_REPLICATE && j.src_node == id)) {
            ty_store_meta_job_done(m, j.id, TY_ECONNRESET, 0, 0);
        } else { /* back to the end of the queue, same id */
            m->n_inflight--;
            ty__store_meta_job_push(m, &j);
            m->queue[m->n_queue - 1].id = j.id;
            m->next_job--;
        }
    }
    for (size_t k = m->n_inflight; k-- > 0;) {
        j = m->inflight[k];
        if (j.node == id || (j.kind == TY_STORE_JOB_REPLICATE && j.src_node == id))
            ty_store_meta_job_done(m, j.id, TY_ECONNRESET, 0, 0);
    }
}

int ty_store_meta_node_remove(ty_store_meta_t *m, uint32_t id)
{
    struct meta_node *n = ty__store_meta_node(m, id);
    if (!n)
        return TY_ENOTFOUND;
    n->alive = false; /* first, so frees of its ranges are skipped */
    node_forget(m, id);
    fail_node_jobs(m, id);
    ty_store_alloc_free(n->alloc);
    memset(n, 0, sizeof(*n));
    return 0;
}

/* Node id of a name, or TY_ENOTFOUND. */
static int node_find(const ty_store_meta_t *m, const char *name, uint32_t *id)
{
    for (uint32_t i = 0; name && i < m->n_nodes; i++)
        if (m->nodes[i].used && strcmp(m->nodes[i].name, name) == 0) {
            *id = i;
            return 0;
        }
    return TY_ENOTFOUND;
}

int ty_store_meta_node_add(ty_store_meta_t *m, const char *name, uint64_t dram_bytes, bool has_ssd,
                           uint64_t now, uint32_t *id)
{
    if (!name || !*name || strlen(name) > TY_STORE_NODE_NAME_MAX || dram_bytes < m->o.align)
        return TY_EINVAL;
    uint32_t old;
    if (node_find(m, name, &old) == 0)
        ty_store_meta_node_remove(m, old);
    uint32_t slot = m->n_nodes;
    for (uint32_t i = 0; i < m->n_nodes; i++)
        if (!m->nodes[i].used) {
            slot = i;
            break;
        }
    if (slot == m->n_nodes) {
        if (m->n_nodes == m->cap_nodes) {
            m->cap_nodes = m->cap_nodes ? m->cap_nodes * 2 : 8;
            m->nodes = xrealloc(m->nodes, m->cap_nodes * sizeof(*m->nodes));
        }
        m->n_nodes++;
    }
    struct meta_node *n = &m->nodes[slot];
    memset(n, 0, sizeof(*n));
    int rc = ty_store_alloc_new(&n->alloc, dram_bytes, m->o.align);
    if (rc != 0)
        return rc;
    n->used = n->alive = true;
    n->has_ssd = has_ssd;
    n->last_heartbeat = now;
    strcpy(n->name, name);
    *id = slot;
    return 0;
}

int ty_store_meta_node_heartbeat(ty_store_meta_t *m, uint32_t id, uint64_t now)
{
    struct meta_node *n = ty__store_meta_node(m, id);
    if (!n || !n->alive)
        return TY_ENOTFOUND;
    n->last_heartbeat = now;
    return 0;
}

int ty_store_meta_node_info(const ty_store_meta_t *m, uint32_t id, struct ty_store_node_info *out)
{
    const struct meta_node *n = ty__store_meta_node(m, id);
    if (!n)
        return TY_ENOTFOUND;
    memset(out, 0, sizeof(*out));
    strcpy(out->name, n->name);
    out->dram_bytes = ty_store_alloc_size(n->alloc);
    out->dram_used = ty_store_alloc_used(n->alloc);
    out->has_ssd = n->has_ssd;
    out->last_heartbeat = n->last_heartbeat;
    out->reads = n->reads;
    return 0;
}

uint32_t ty_store_meta_node_slots(const ty_store_meta_t *m)
{
    return m->n_nodes;
}

int ty__store_meta_find_replica(const struct meta_object *o, uint32_t node, enum ty_store_tier tier)
{
    for (uint32_t i = 0; i < o->n; i++)
        if (o->rep[i].r.node == node && o->rep[i].r.tier == tier)
            return (int)i;
    return -1;
}

int ty_store_meta_node_announce(ty_store_meta_t *m, uint32_t id, const char *key,
                                enum ty_store_tier tier, uint64_t offset, uint64_t length,
                                uint64_t checksum, uint64_t now)
{
    struct meta_node *n = ty__store_meta_node(m, id);
    if (!n || !n->alive)
        return TY_ENOTFOUND;
    if (!ty__store_meta_key_valid(key) || length == 0 ||
        (tier != TY_STORE_TIER_DRAM && tier != TY_STORE_TIER_SSD))
        return TY_EINVAL;
    struct meta_object *o = ty__store_meta_lookup(m, key);
    if (o && (!o->committed || o->length != length || o->checksum != checksum))
        return TY_ESTALE;
    if (o && ty__store_meta_find_replica(o, id, tier) >= 0)
        return TY_EEXIST;
    if (o && o->n == TY_STORE_REPLICAS_MAX)
        return TY_ENOSPC;
    if (tier == TY_STORE_TIER_DRAM) {
        int rc = ty_store_alloc_take_at(n->alloc, offset, length);
        if (rc != 0)
            return rc;
    }
    if (!o) {
        o = ty__store_meta_insert(m, key);
        o->length = length;
        o->checksum = checksum;
        o->committed = true;
        o->last_access = now;
    }
    struct meta_replica *r = &o->rep[o->n++];
    *r = (struct meta_replica){.r = {.node = id,
                                     .tier = tier,
                                     .state = TY_STORE_REPLICA_COMPLETE,
                                     .offset = offset,
                                     .length = length,
                                     .checksum = checksum}};
    ty__store_meta_event(m, TY_STORE_EVENT_STORED, o, &r->r);
    return 0;
}

int ty_store_meta_replica_lost(ty_store_meta_t *m, uint32_t id, const char *key,
                               enum ty_store_tier tier)
{
    struct meta_object *o = ty__store_meta_lookup(m, key);
    int i = o ? ty__store_meta_find_replica(o, id, tier) : -1;
    if (i < 0)
        return TY_ENOTFOUND;
    if (o->rep[i].job != 0)
        return TY_EBUSY; /* a job reads it; its completion will tell */
    drop_at(m, o, (uint32_t)i, 0, 0);
    if (o->n == 0)
        ty__store_meta_delete(m, o);
    return 0;
}
