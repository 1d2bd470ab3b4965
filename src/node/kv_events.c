/* KV block events of a node (tycho/kv_events.h): two hash sets under one mutex, the mirror of
 * the cache and the pending hashes. A pending hash is FLIPPED (changed once since it was last
 * taken, so the Conductor holds the opposite of the mirror: a re-store cancels a removal) or
 * UNKNOWN (its batch was given back, or it was stored and removed unseen, so the Conductor may
 * hold either state: it stays pending until taken). */
#include "tycho/kv_events.h"

#include "tycho/errors.h"
#include "tycho/hash.h"
#include "tycho/log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { SLOT_EMPTY = 0, SLOT_HELD, PENDING_FLIPPED = SLOT_HELD, PENDING_UNKNOWN };

/* Open addressing, linear probing, backward-shift deletion (no tombstones). */
struct hset {
    uint64_t *keys;
    uint8_t *val;  /* SLOT_EMPTY or the entry's value */
    size_t cap, n; /* cap: a power of two, or 0 */
};

static size_t hset_find(const struct hset *s, uint64_t k)
{
    if (!s->cap)
        return SIZE_MAX;
    size_t mask = s->cap - 1;
    for (size_t i = ty_hash_mix64(k) & mask;; i = (i + 1) & mask) {
        if (s->val[i] == SLOT_EMPTY)
            return SIZE_MAX;
        if (s->keys[i] == k)
            return i;
    }
}

static void hset_put_new(struct hset *s, uint64_t k, uint8_t v)
{
    size_t mask = s->cap - 1, i = ty_hash_mix64(k) & mask;
    while (s->val[i] != SLOT_EMPTY)
        i = (i + 1) & mask;
    s->keys[i] = k;
    s->val[i] = v;
    s->n++;
}

/* Set k's value (insert when absent); grows at 3/4 load, aborting on OOM (metadata). */
static void hset_set(struct hset *s, uint64_t k, uint8_t v)
{
    size_t i = hset_find(s, k);
    if (i != SIZE_MAX) {
        s->val[i] = v;
        return;
    }
    if ((s->n + 1) * 4 > s->cap * 3) {
        struct hset g = {.cap = s->cap ? 2 * s->cap : 64};
        g.keys = malloc(g.cap * sizeof(uint64_t));
        g.val = calloc(g.cap, 1);
        TY_ASSERT(g.keys && g.val);
        for (size_t j = 0; j < s->cap; j++)
            if (s->val[j] != SLOT_EMPTY)
                hset_put_new(&g, s->keys[j], s->val[j]);
        free(s->keys);
        free(s->val);
        *s = g;
    }
    hset_put_new(s, k, v);
}

static void hset_del_at(struct hset *s, size_t i)
{
    size_t mask = s->cap - 1;
    s->val[i] = SLOT_EMPTY;
    s->n--;
    /* pull later entries of the probe run back over the hole, unless that would move one
     * before its home slot */
    for (size_t j = (i + 1) & mask; s->val[j] != SLOT_EMPTY; j = (j + 1) & mask) {
        size_t home = ty_hash_mix64(s->keys[j]) & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            s->keys[i] = s->keys[j];
            s->val[i] = s->val[j];
            s->val[j] = SLOT_EMPTY;
            i = j;
        }
    }
}

static void hset_clear(struct hset *s)
{
    if (s->cap)
        memset(s->val, 0, s->cap);
    s->n = 0;
}

static void hset_free(struct hset *s)
{
    free(s->keys);
    free(s->val);
}

struct ty_kv_events {
    pthread_mutex_t mu;
    struct hset mirror;  /* hashes the cache holds */
    struct hset pending; /* PENDING_*; empty while need_reset (the snapshot covers it) */
    size_t max_pending;
    bool need_reset;
    ty_kv_events_t *followers[8]; /* noted along (ty_kv_events_follow), under mu */
    size_t n_followers;
};

int ty_kv_events_new(ty_kv_events_t **out, size_t max_pending)
{
    ty_kv_events_t *ev = calloc(1, sizeof(*ev));
    *out = ev;
    if (!ev)
        return TY_ENOMEM;
    pthread_mutex_init(&ev->mu, NULL);
    ev->max_pending = max_pending ? max_pending : 65536;
    ev->need_reset = true; /* the Conductor knows nothing of us yet */
    return 0;
}

void ty_kv_events_free(ty_kv_events_t *ev)
{
    if (!ev)
        return;
    hset_free(&ev->mirror);
    hset_free(&ev->pending);
    pthread_mutex_destroy(&ev->mu);
    free(ev);
}

/* Under mu: too much pending turns into one reset snapshot (bounded by the mirror). */
static void check_overflow(ty_kv_events_t *ev)
{
    if (ev->pending.n > ev->max_pending) {
        hset_clear(&ev->pending);
        ev->need_reset = true;
    }
}

static void note_locked(ty_kv_events_t *ev, uint64_t hash, bool stored)
{
    size_t i = hset_find(&ev->mirror, hash);
    if ((i != SIZE_MAX) == stored)
        return; /* no change */
    if (stored)
        hset_set(&ev->mirror, hash, SLOT_HELD);
    else
        hset_del_at(&ev->mirror, i);
    if (ev->need_reset)
        return;
    size_t j = hset_find(&ev->pending, hash);
    if (j == SIZE_MAX)
        hset_set(&ev->pending, hash, PENDING_FLIPPED);
    else if (ev->pending.val[j] == PENDING_FLIPPED && stored)
        hset_del_at(&ev->pending, j); /* removed and stored again: as the Conductor holds it */
    else if (ev->pending.val[j] == PENDING_FLIPPED)
        ev->pending.val[j] = PENDING_UNKNOWN; /* stored and removed unseen: the Conductor may
                                               * still have credited us with it (it does when
                                               * it sends us the prompt), so send the removal */
    check_overflow(ev);
}

void ty_kv_events_note(ty_kv_events_t *ev, uint64_t hash, bool stored)
{
    pthread_mutex_lock(&ev->mu);
    note_locked(ev, hash, stored);
    for (size_t k = 0; k < ev->n_followers; k++) { /* lock order: the set, then a follower */
        pthread_mutex_lock(&ev->followers[k]->mu);
        note_locked(ev->followers[k], hash, stored);
        pthread_mutex_unlock(&ev->followers[k]->mu);
    }
    pthread_mutex_unlock(&ev->mu);
}

int ty_kv_events_follow(ty_kv_events_t *ev, ty_kv_events_t *follower)
{
    if (!ev || !follower || follower == ev || follower->n_followers)
        return TY_EINVAL;
    pthread_mutex_lock(&ev->mu);
    int rc = ev->n_followers == sizeof(ev->followers) / sizeof(ev->followers[0]) ? TY_ENOSPC : 0;
    if (!rc) {
        pthread_mutex_lock(&follower->mu);
        for (size_t i = 0; i < ev->mirror.cap; i++) /* from now on it sees what ev sees */
            if (ev->mirror.val[i] != SLOT_EMPTY)
                hset_set(&follower->mirror, ev->mirror.keys[i], SLOT_HELD);
        hset_free(&follower->pending);
        memset(&follower->pending, 0, sizeof(follower->pending));
        follower->need_reset = true;
        pthread_mutex_unlock(&follower->mu);
        ev->followers[ev->n_followers++] = follower;
    }
    pthread_mutex_unlock(&ev->mu);
    return rc;
}

void ty_kv_events_unfollow(ty_kv_events_t *ev, ty_kv_events_t *follower)
{
    if (!ev)
        return;
    pthread_mutex_lock(&ev->mu);
    for (size_t k = 0; k < ev->n_followers; k++) {
        if (ev->followers[k] == follower) {
            ev->followers[k] = ev->followers[--ev->n_followers];
            break;
        }
    }
    pthread_mutex_unlock(&ev->mu);
}

/* Under mu: the reset snapshot, or the pending hashes split by their state now. */
static int fill_batch(ty_kv_events_t *ev, struct ty_kv_events_batch *b)
{
    const struct hset *src = ev->need_reset ? &ev->mirror : &ev->pending;
    /* +1: malloc(0) may return NULL */
    b->stored = malloc((src->n + 1) * sizeof(uint64_t));
    b->removed = ev->need_reset ? NULL : malloc((src->n + 1) * sizeof(uint64_t));
    if (!b->stored || (!ev->need_reset && !b->removed)) {
        ty_kv_events_batch_clear(b);
        return TY_ENOMEM;
    }
    b->reset = ev->need_reset;
    for (size_t i = 0; i < src->cap; i++) {
        if (src->val[i] == SLOT_EMPTY)
            continue;
        uint64_t h = src->keys[i];
        if (b->reset || hset_find(&ev->mirror, h) != SIZE_MAX)
            b->stored[b->n_stored++] = h;
        else
            b->removed[b->n_removed++] = h;
    }
    return 0;
}

int ty_kv_events_take(ty_kv_events_t *ev, struct ty_kv_events_batch *out)
{
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&ev->mu);
    int rc = fill_batch(ev, out);
    if (!rc) {
        hset_clear(&ev->pending);
        ev->need_reset = false;
    }
    pthread_mutex_unlock(&ev->mu);
    return rc;
}

bool ty_kv_events_batch_empty(const struct ty_kv_events_batch *b)
{
    return !b->reset && !b->n_stored && !b->n_removed;
}

void ty_kv_events_give_back(ty_kv_events_t *ev, struct ty_kv_events_batch *b)
{
    pthread_mutex_lock(&ev->mu);
    if (b->reset) {
        hset_clear(&ev->pending);
        ev->need_reset = true;
    } else if (!ev->need_reset) {
        for (size_t i = 0; i < b->n_stored; i++)
            hset_set(&ev->pending, b->stored[i], PENDING_UNKNOWN);
        for (size_t i = 0; i < b->n_removed; i++)
            hset_set(&ev->pending, b->removed[i], PENDING_UNKNOWN);
        check_overflow(ev);
    }
    pthread_mutex_unlock(&ev->mu);
    ty_kv_events_batch_clear(b);
}

void ty_kv_events_resync(ty_kv_events_t *ev)
{
    pthread_mutex_lock(&ev->mu);
    hset_clear(&ev->pending);
    ev->need_reset = true;
    pthread_mutex_unlock(&ev->mu);
}

void ty_kv_events_batch_clear(struct ty_kv_events_batch *b)
{
    if (!b)
        return;
    free(b->stored);
    free(b->removed);
    memset(b, 0, sizeof(*b));
}
