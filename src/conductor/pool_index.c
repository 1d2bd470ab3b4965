/* The Conductor's view of the cluster KV pool (tycho-store, DESIGN.md §6 and §8): which
 * prompt blocks the pool holds, for the scheduler's remote-prefix plans. Prefill nodes read a
 * prompt's leading blocks from the pool and write the blocks they compute to it
 * (include/tycho/node_kvstore.h); the Conductor subscribes to the master's stored/removed events,
 * keeps the blocks under the pool's own node id in the scheduler's prefix index
 * (TY__POOL_NODE, which no prefill node has), and lets kvcache_centric plan a prefix "fetched
 * from the pool" on any prefill node (ty_sched_opts.remote_node).
 *
 * The events arrive on the store client's thread; they are coalesced into a ty_kv_events_t
 * (the same set-with-pending-changes a prefill node keeps for its heartbeats) and applied to
 * the scheduler on the loop thread by the cluster's 100 ms tick. Each subscription starts
 * with a snapshot of the block keys the pool holds (so a Conductor started or restarted after
 * the pool filled knows its contents), then follows the events; when it drops (master gone,
 * failover) the view is emptied and subscribed again, so it never keeps a block the pool
 * lost while nobody listened. A block with several replicas counts as gone when one replica
 * leaves (the same direction). Keys that are not block keys ("kv/" + 16 hex digits) are
 * other users' and ignored. */
#include "conductor-impl.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct ty__pool {
    ty_store_client_t *client;
    pthread_mutex_t mu;
    ty_kv_events_t *ev; /* under mu: the client's thread notes, the loop takes */
    bool lost;          /* under mu: the subscription ended */
    bool subscribed;    /* loop */
    uint64_t retry_at_ms;
    char master[256];
    ty_metrics_child_t *events[2]; /* stored, removed */
};

/* "kv/" + 16 lowercase hex digits -> hash. */
static bool block_key(const char *key, uint64_t *out)
{
    if (strncmp(key, "kv/", 3) != 0 || strlen(key) != 19)
        return false;
    uint64_t h = 0;
    for (int i = 3; i < 19; i++) {
        char ch = key[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0)
            return false;
        h = h << 4 | (uint64_t)d;
    }
    *out = h;
    return true;
}

/* The store client's thread. */
static void on_event(const struct ty_store_event *ev, const char *node, void *arg)
{
    struct ty__pool *pl = arg;
    (void)node;
    uint64_t h;
    pthread_mutex_lock(&pl->mu);
    if (!ev)
        pl->lost = true;
    else if (block_key(ev->key, &h))
        ty_kv_events_note(pl->ev, h, ev->kind == TY_STORE_EVENT_STORED);
    pthread_mutex_unlock(&pl->mu);
    if (ev && pl->events[ev->kind == TY_STORE_EVENT_STORED ? 0 : 1])
        ty_metrics_counter_inc(pl->events[ev->kind == TY_STORE_EVENT_STORED ? 0 : 1]);
}

int ty__pool_start(ty_conductor_t *c, const char *master, ty_metrics_registry_t *reg)
{
    struct ty__pool *pl = calloc(1, sizeof(*pl));
    if (!pl)
        return TY_ENOMEM;
    pthread_mutex_init(&pl->mu, NULL);
    snprintf(pl->master, sizeof(pl->master), "%s", master);
    struct ty_store_client_opts co = {.master = master,
                                      .listen_host = c->o.rpc_host,
                                      .transport = "tcp",
                                      .staging_bytes = 1u << 20,
                                      .auth = c->o.auth};
    int rc = ty_kv_events_new(&pl->ev, 0);
    if (!rc)
        rc = ty_store_client_new(&pl->client, &co);
    if (rc) {
        ty_kv_events_free(pl->ev);
        pthread_mutex_destroy(&pl->mu);
        free(pl);
        return rc;
    }
    static const char *const kind[] = {"kind"}, *const kinds[] = {"stored", "removed"};
    ty_metrics_family_t *f;
    if (reg && !ty_metrics_counter_new(reg, &f, "tycho_kv_pool_events_total",
                                       "block replicas the KV pool's master reported stored or "
                                       "removed",
                                       kind, 1))
        for (int k = 0; k < 2; k++)
            ty_metrics_child_get(f, &kinds[k], &pl->events[k]);
    c->place.pool = pl;
    TY_LOG_INFO("cluster", "KV pool: following the blocks of the pool at %s", master);
    return 0;
}

void ty__pool_stop(ty_conductor_t *c)
{
    struct ty__pool *pl = c->place.pool;
    if (!pl)
        return;
    ty_store_client_free(pl->client); /* no callback after this */
    ty_kv_events_free(pl->ev);
    pthread_mutex_destroy(&pl->mu);
    free(pl);
    c->place.pool = NULL;
}

const char *ty__pool_master(const ty_conductor_t *c)
{
    return c->place.pool ? c->place.pool->master : NULL;
}

bool ty__pool_following(ty_conductor_t *c)
{
    struct ty__pool *pl = c->place.pool;
    if (!pl)
        return false;
    pthread_mutex_lock(&pl->mu);
    bool on = pl->subscribed && !pl->lost;
    pthread_mutex_unlock(&pl->mu);
    return on;
}

/* The loop's tick: (re)subscribe when needed, apply what the pool reported. */
void ty__pool_tick(ty_conductor_t *c)
{
    struct ty__pool *pl = c->place.pool;
    if (!pl)
        return;
    ty_sched_t *s = c->place.s;
    uint64_t now = ty_clock_ms();
    pthread_mutex_lock(&pl->mu);
    if (pl->lost) { /* what happened while nobody listened is unknown: start empty */
        pl->lost = false;
        pl->subscribed = false;
        ty_kv_events_t *fresh;
        if (ty_kv_events_new(&fresh, 0) == 0) {
            ty_kv_events_free(pl->ev);
            pl->ev = fresh;
        }
        ty_sched_blocks_reset(s, TY__POOL_NODE);
        pl->retry_at_ms = now + 1000;
        TY_LOG_WARN("cluster",
                    "KV pool: lost the master's events (%s): forgetting the pool's "
                    "blocks, subscribing again",
                    pl->master);
    }
    struct ty_kv_events_batch b = {0};
    int rc = ty_kv_events_take(pl->ev, &b);
    pthread_mutex_unlock(&pl->mu);
    if (rc == 0) {
        if (b.reset)
            ty_sched_blocks_reset(s, TY__POOL_NODE);
        ty_sched_block_removed(s, TY__POOL_NODE, b.removed, b.n_removed);
        ty_sched_block_stored(s, TY__POOL_NODE, b.stored, b.n_stored);
        ty_kv_events_batch_clear(&b);
    }
    if (!pl->subscribed && now >= pl->retry_at_ms) {
        pl->subscribed =
            ty_store_client_subscribe_snapshot(pl->client, "kv/", true, on_event, pl) == 0;
        if (!pl->subscribed)
            pl->retry_at_ms = now + 1000;
    }
}
