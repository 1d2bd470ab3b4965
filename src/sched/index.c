/* Prefix index: block hash -> set of nodes holding it (a 256-bit set per block).
 *
 * match() walks the request's blocks once, keeping the set of nodes that hold every block so
 * far; a node's prefix ends where it drops out of that set, so the cost is
 * O(blocks * TY_SCHED_MAX_NODES / 64) whatever the number of nodes. */
#include "sched-impl.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/sched.h"

#include <stdlib.h>
#include <string.h>

#define SET_WORDS (TY_SCHED_MAX_NODES / 64)

struct nodeset {
    uint64_t w[SET_WORDS];
};

struct ty_sched_index {
    struct ty_u64map map; /* hash -> slot in sets[] */
    struct nodeset *sets;
    uint32_t *free_slots;
    size_t n_sets, cap_sets, n_free;
};

int ty_sched_index_new(ty_sched_index_t **out)
{
    ty_sched_index_t *ix = calloc(1, sizeof(*ix));
    if (!ix)
        return TY_ENOMEM;
    ty_u64map_init(&ix->map);
    *out = ix;
    return 0;
}

void ty_sched_index_free(ty_sched_index_t *ix)
{
    if (!ix)
        return;
    ty_u64map_fini(&ix->map);
    free(ix->sets);
    free(ix->free_slots);
    free(ix);
}

static uint32_t slot_alloc(ty_sched_index_t *ix)
{
    if (ix->n_free)
        return ix->free_slots[--ix->n_free];
    if (ix->n_sets == ix->cap_sets) {
        size_t cap = ix->cap_sets ? ix->cap_sets * 2 : 256;
        ix->sets = realloc(ix->sets, cap * sizeof(*ix->sets));
        ix->free_slots = realloc(ix->free_slots, cap * sizeof(*ix->free_slots));
        TY_ASSERT(ix->sets && ix->free_slots);
        ix->cap_sets = cap;
    }
    return (uint32_t)ix->n_sets++;
}

static bool set_empty(const struct nodeset *s)
{
    for (int i = 0; i < SET_WORDS; i++)
        if (s->w[i])
            return false;
    return true;
}

int ty_sched_index_add(ty_sched_index_t *ix, uint32_t node, const uint64_t *hashes, size_t n)
{
    if (node >= TY_SCHED_MAX_NODES || (n && !hashes))
        return TY_EINVAL;
    for (size_t i = 0; i < n; i++) {
        uint32_t *v = ty_u64map_get(&ix->map, hashes[i]);
        uint32_t slot;
        if (v) {
            slot = *v;
        } else {
            slot = slot_alloc(ix);
            memset(&ix->sets[slot], 0, sizeof(ix->sets[slot]));
            ty_u64map_put(&ix->map, hashes[i], slot);
        }
        ix->sets[slot].w[node / 64] |= 1ull << (node % 64);
    }
    return 0;
}

static void slot_clear(ty_sched_index_t *ix, uint64_t hash, uint32_t slot, uint32_t node)
{
    ix->sets[slot].w[node / 64] &= ~(1ull << (node % 64));
    if (set_empty(&ix->sets[slot])) {
        ty_u64map_del(&ix->map, hash);
        ix->free_slots[ix->n_free++] = slot;
    }
}

int ty_sched_index_del(ty_sched_index_t *ix, uint32_t node, const uint64_t *hashes, size_t n)
{
    if (node >= TY_SCHED_MAX_NODES || (n && !hashes))
        return TY_EINVAL;
    for (size_t i = 0; i < n; i++) {
        uint32_t *v = ty_u64map_get(&ix->map, hashes[i]);
        if (v)
            slot_clear(ix, hashes[i], *v, node);
    }
    return 0;
}

void ty_sched_index_drop_node(ty_sched_index_t *ix, uint32_t node)
{
    if (node >= TY_SCHED_MAX_NODES)
        return;
    /* collect first: deleting from the map while walking it would move entries */
    size_t n = 0, cap = 1024;
    uint64_t *keys = malloc(cap * sizeof(*keys));
    TY_ASSERT(keys);
    for (size_t i = 0; i < ix->map.cap; i++) {
        if (!ix->map.used[i])
            continue;
        if (!(ix->sets[ix->map.vals[i]].w[node / 64] & (1ull << (node % 64))))
            continue;
        if (n == cap) {
            cap *= 2;
            keys = realloc(keys, cap * sizeof(*keys));
            TY_ASSERT(keys);
        }
        keys[n++] = ix->map.keys[i];
    }
    ty_sched_index_del(ix, node, keys, n);
    free(keys);
}

void ty_sched_index_match(const ty_sched_index_t *ix, const uint64_t *hashes, size_t n,
                          uint32_t *prefix, uint32_t n_nodes)
{
    struct nodeset alive;
    memset(&alive, 0xff, sizeof(alive));
    size_t i = 0;
    for (; i < n; i++) {
        const uint32_t *v = ty_u64map_get(&ix->map, hashes[i]);
        bool any = false;
        for (int w = 0; w < SET_WORDS; w++) {
            uint64_t keep = v ? (alive.w[w] & ix->sets[*v].w[w]) : 0;
            uint64_t dropped = alive.w[w] & ~keep;
            while (dropped) {
                uint32_t node = (uint32_t)(w * 64 + __builtin_ctzll(dropped));
                if (node < n_nodes)
                    prefix[node] = (uint32_t)i;
                dropped &= dropped - 1;
            }
            alive.w[w] = keep;
            any |= keep != 0;
        }
        if (!any)
            return;
    }
    for (int w = 0; w < SET_WORDS; w++) {
        uint64_t left = alive.w[w];
        while (left) {
            uint32_t node = (uint32_t)(w * 64 + __builtin_ctzll(left));
            if (node < n_nodes)
                prefix[node] = (uint32_t)i;
            left &= left - 1;
        }
    }
}

size_t ty_sched_index_size(const ty_sched_index_t *ix)
{
    return ix->map.len;
}
