/* The master's metadata: puts, gets, removes, pins and replica targets (store_meta.h). */
#include "meta-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"

#include <stdlib.h>
#include <string.h>

uint64_t ty__store_meta_node_free(const struct meta_node *n)
{
    return ty_store_alloc_size(n->alloc) - ty_store_alloc_used(n->alloc);
}

/* Live nodes in placement order: the writer's first, then the emptiest. Returns the count. */
static uint32_t placement_order(const ty_store_meta_t *m, const char *writer, uint32_t *ids)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->n_nodes; i++)
        if (m->nodes[i].used && m->nodes[i].alive)
            ids[n++] = i;
    for (uint32_t i = 1; i < n; i++) { /* insertion sort: a handful of nodes */
        uint32_t v = ids[i], j = i;
        const struct meta_node *nv = &m->nodes[v];
        bool wv = writer && strcmp(nv->name, writer) == 0;
        while (j > 0) {
            const struct meta_node *nj = &m->nodes[ids[j - 1]];
            bool wj = writer && strcmp(nj->name, writer) == 0;
            if (wj || (!wv && ty__store_meta_node_free(nj) >= ty__store_meta_node_free(nv)))
                break;
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = v;
    }
    return n;
}

/* Allocate `len` on node id, evicting there if needed. Returns 0 and *off or TY_ENOCAPACITY. */
static int node_take(ty_store_meta_t *m, uint32_t id, uint64_t len, uint64_t now, uint64_t *off)
{
    struct meta_node *n = &m->nodes[id];
    if (ty_store_alloc_take(n->alloc, len, off) == 0)
        return 0;
    ty__store_meta_evict_node(m, id, len, now);
    return ty_store_alloc_take(n->alloc, len, off);
}

static void placement_fill(const struct meta_object *o, bool complete_only,
                           struct ty_store_placement *out)
{
    memset(out, 0, sizeof(*out));
    for (int pass = 0; pass < 2; pass++) /* DRAM replicas first */
        for (uint32_t i = 0; i < o->n; i++) {
            const struct ty_store_replica *r = &o->rep[i].r;
            if ((pass == 0) != (r->tier == TY_STORE_TIER_DRAM))
                continue;
            if (complete_only && r->state != TY_STORE_REPLICA_COMPLETE)
                continue;
            out->r[out->n++] = *r;
        }
}

int ty_store_meta_put_start(ty_store_meta_t *m, const char *key, uint64_t length,
                            uint32_t n_replicas, const char *writer, uint64_t now,
                            struct ty_store_placement *out)
{
    if (!ty__store_meta_key_valid(key) || length == 0 || n_replicas > TY_STORE_REPLICAS_MAX)
        return TY_EINVAL;
    if (ty__store_meta_lookup(m, key))
        return TY_EEXIST;
    uint32_t ids[m->n_nodes + 1];
    uint32_t n_live = placement_order(m, writer, ids);
    if (n_live == 0)
        return TY_EUNAVAIL;
    uint32_t want = n_replicas ? n_replicas : m->o.default_replicas;
    if (want > n_live)
        want = n_live;
    struct meta_object *o = ty__store_meta_insert(m, key);
    o->length = length;
    o->put_deadline = now + m->o.put_timeout_ms;
    if (m->n_pending == 0 || o->put_deadline < m->next_expiry_scan)
        m->next_expiry_scan = o->put_deadline;
    o->last_access = now;
    m->n_pending++;
    for (uint32_t k = 0; k < n_live && o->n < want; k++) {
        uint64_t off;
        if (node_take(m, ids[k], length, now, &off) != 0)
            continue;
        o->rep[o->n++] = (struct meta_replica){.r = {.node = ids[k],
                                                     .tier = TY_STORE_TIER_DRAM,
                                                     .state = TY_STORE_REPLICA_PENDING,
                                                     .offset = off,
                                                     .length = length}};
    }
    if (o->n == 0) {
        ty__store_meta_delete(m, o);
        return TY_ENOCAPACITY;
    }
    placement_fill(o, false, out);
    return 0;
}

int ty_store_meta_put_commit(ty_store_meta_t *m, const char *key, uint64_t checksum, uint64_t now)
{
    struct meta_object *o = ty__store_meta_lookup(m, key);
    if (!o)
        return TY_ENOTFOUND;
    if (o->committed)
        return TY_EALREADY;
    o->committed = true;
    o->checksum = checksum;
    o->last_access = now;
    m->n_pending--;
    for (uint32_t i = 0; i < o->n; i++) {
        o->rep[i].r.state = TY_STORE_REPLICA_COMPLETE;
        o->rep[i].r.checksum = checksum;
        ty__store_meta_event(m, TY_STORE_EVENT_STORED, o, &o->rep[i].r);
    }
    return 0;
}

int ty_store_meta_put_abort(ty_store_meta_t *m, const char *key)
{
    struct meta_object *o = ty__store_meta_lookup(m, key);
    if (!o || o->committed)
        return TY_ENOTFOUND;
    /* The writer says it is done writing, so the ranges may be reused at once; no REMOVED
     * events: the replicas were never stored. */
    while (o->n > 0) {
        struct ty_store_replica r = o->rep[--o->n].r;
        struct meta_node *n = ty__store_meta_node(m, r.node);
        if (n && n->alive)
            ty_store_alloc_give(n->alloc, r.offset, r.length);
    }
    ty__store_meta_delete(m, o);
    return 0;
}

/* Only SSD copies: allocate DRAM on the SSD replica's node and queue a LOAD job. */
static void start_load(ty_store_meta_t *m, struct meta_object *o, uint64_t now)
{
    for (uint32_t i = 0; i < o->n; i++)
        if (o->rep[i].r.tier == TY_STORE_TIER_DRAM)
            return; /* a load is already running */
    for (uint32_t i = 0; i < o->n && o->n < TY_STORE_REPLICAS_MAX; i++) {
        struct ty_store_replica *src = &o->rep[i].r;
        uint64_t off;
        if (src->tier != TY_STORE_TIER_SSD || o->rep[i].job != 0 ||
            node_take(m, src->node, o->length, now, &off) != 0)
            continue;
        struct ty_store_job j = {.kind = TY_STORE_JOB_LOAD,
                                 .node = src->node,
                                 .src_offset = src->offset,
                                 .dst_offset = off,
                                 .length = o->length,
                                 .checksum = o->checksum};
        strcpy(j.key, o->key);
        uint64_t id = ty__store_meta_job_push(m, &j);
        o->rep[i].job = id;
        o->rep[o->n++] = (struct meta_replica){.r = {.node = src->node,
                                                     .tier = TY_STORE_TIER_DRAM,
                                                     .state = TY_STORE_REPLICA_PENDING,
                                                     .offset = off,
                                                     .length = o->length,
                                                     .checksum = o->checksum},
                                               .job = id};
        return;
    }
}

/* Count a read towards o's heat; at hot_reads_per_s the key turns hot and wants hot_replicas
 * DRAM replicas (section 6.2: hot blocks are replicated so their readers spread). */
static void heat_read(ty_store_meta_t *m, struct meta_object *o, uint64_t now)
{
    if (m->o.hot_reads_per_s <= 0)
        return;
    ty_store_heat_add(&o->heat, now, m->o.hot_half_life_ms);
    if (o->hot || m->st.hot_blocks >= m->o.hot_max ||
        ty_store_heat_rate(&o->heat, now, m->o.hot_half_life_ms) < m->o.hot_reads_per_s)
        return;
    o->hot = true;
    m->st.hot_blocks++;
    if (o->want_replicas < m->o.hot_replicas)
        o->want_replicas = m->o.hot_replicas;
    ty__store_meta_hot_list_add(m, o->key);
}

/* Rotate the first k replicas of out (the DRAM ones) so that gets name each first in turn;
 * count the read against the node named first (the one the client reads). */
static void spread_readers(ty_store_meta_t *m, struct meta_object *o,
                           struct ty_store_placement *out)
{
    uint32_t k = 0;
    while (k < out->n && out->r[k].tier == TY_STORE_TIER_DRAM)
        k++;
    if (k > 1) {
        struct ty_store_replica tmp[TY_STORE_REPLICAS_MAX];
        uint32_t first = o->rr++ % k;
        for (uint32_t i = 0; i < k; i++)
            tmp[i] = out->r[(first + i) % k];
        memcpy(out->r, tmp, k * sizeof(tmp[0]));
    }
    struct meta_node *n = k > 0 ? ty__store_meta_node(m, out->r[0].node) : NULL;
    if (n)
        n->reads++;
}

int ty_store_meta_get(ty_store_meta_t *m, const char *key, uint64_t now,
                      struct ty_store_placement *out, uint64_t *lease_until)
{
    struct meta_object *o = ty__store_meta_lookup(m, key);
    if (!o || !o->committed)
        return TY_ENOTFOUND;
    o->accesses++;
    o->last_access = now;
    if (o->lease_until < now + m->o.lease_ms)
        o->lease_until = now + m->o.lease_ms;
    *lease_until = o->lease_until;
    placement_fill(o, true, out);
    spread_readers(m, o, out);
    if (out->n > 0 && out->r[0].tier == TY_STORE_TIER_DRAM) {
        heat_read(m, o, now); /* a read served, not a client polling for a load (TY_EAGAIN) */
        return 0;
    }
    if (out->n == 0)
        return TY_ENOTFOUND;
    start_load(m, o, now);
    return TY_EAGAIN;
}

bool ty_store_meta_exists(const ty_store_meta_t *m, const char *key)
{
    const struct meta_object *o = ty__store_meta_lookup(m, key);
    if (!o || !o->committed)
        return false;
    for (uint32_t i = 0; i < o->n; i++)
        if (o->rep[i].r.state == TY_STORE_REPLICA_COMPLETE)
            return true;
    return false;
}

int ty_store_meta_remove(ty_store_meta_t *m, const char *key, uint64_t now)
{
    struct meta_object *o = ty__store_meta_lookup(m, key);
    if (!o)
        return TY_ENOTFOUND;
    ty__store_meta_drop_all(m, o, now);
    return 0;
}

int ty_store_meta_pin(ty_store_meta_t *m, const char *key)
{
    struct meta_object *o = ty__store_meta_lookup(m, key);
    if (!o)
        return TY_ENOTFOUND;
    o->pins++;
    return 0;
}

int ty_store_meta_unpin(ty_store_meta_t *m, const char *key)
{
    struct meta_object *o = ty__store_meta_lookup(m, key);
    if (!o)
        return TY_ENOTFOUND;
    if (o->pins == 0)
        return TY_EINVAL;
    o->pins--;
    return 0;
}

int ty_store_meta_set_replicas(ty_store_meta_t *m, const char *key, uint32_t n)
{
    struct meta_object *o = ty__store_meta_lookup(m, key);
    if (!o)
        return TY_ENOTFOUND;
    if (n == 0 || n > TY_STORE_REPLICAS_MAX)
        return TY_EINVAL;
    o->want_set = n;
    o->want_replicas = o->hot && m->o.hot_replicas > n ? m->o.hot_replicas : n;
    ty__store_meta_hot_list_add(m, key);
    return 0;
}

void ty__store_meta_hot_list_add(ty_store_meta_t *m, const char *key)
{
    for (size_t i = 0; i < m->n_hot; i++)
        if (strcmp(m->hot[i], key) == 0)
            return;
    if (m->n_hot == m->cap_hot) {
        m->cap_hot = m->cap_hot ? m->cap_hot * 2 : 16;
        m->hot = realloc(m->hot, m->cap_hot * sizeof(*m->hot));
        TY_ASSERT(m->hot != NULL);
    }
    m->hot[m->n_hot] = strdup(key);
    TY_ASSERT(m->hot[m->n_hot] != NULL);
    m->n_hot++;
}

void ty_store_meta_stats(const ty_store_meta_t *m, struct ty_store_meta_stats *out)
{
    *out = m->st;
    out->objects = m->n_objects - m->n_pending;
    out->pending_puts = m->n_pending;
    out->nodes_alive = out->dram_bytes = out->dram_used = 0;
    for (uint32_t i = 0; i < m->n_nodes; i++) {
        if (!m->nodes[i].used || !m->nodes[i].alive)
            continue;
        out->nodes_alive++;
        out->dram_bytes += ty_store_alloc_size(m->nodes[i].alloc);
        out->dram_used += ty_store_alloc_used(m->nodes[i].alloc);
    }
}
