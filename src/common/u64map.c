/* Open-addressing hash map uint64 -> uint32 with linear probing (tycho/u64map.h). */
#include "tycho/u64map.h"

#include <stdlib.h>
#include <string.h>

#include "tycho/hash.h" /* ty_hash_mix64: trace hash ids are small consecutive integers */
#include "tycho/log.h"

void ty_u64map_init(struct ty_u64map *m)
{
    memset(m, 0, sizeof(*m));
}

void ty_u64map_fini(struct ty_u64map *m)
{
    free(m->keys);
    free(m->vals);
    free(m->used);
    memset(m, 0, sizeof(*m));
}

static void map_alloc(struct ty_u64map *m, size_t cap)
{
    m->keys = malloc(cap * sizeof(*m->keys));
    m->vals = malloc(cap * sizeof(*m->vals));
    m->used = calloc(cap, 1);
    TY_ASSERT(m->keys && m->vals && m->used);
    m->cap = cap;
    m->len = 0;
}

static void map_grow(struct ty_u64map *m)
{
    struct ty_u64map old = *m;
    map_alloc(m, old.cap ? old.cap * 2 : 64);
    for (size_t i = 0; i < old.cap; i++)
        if (old.used[i])
            ty_u64map_put(m, old.keys[i], old.vals[i]);
    ty_u64map_fini(&old);
}

uint32_t *ty_u64map_get(const struct ty_u64map *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = ty_hash_mix64(key) & mask;; i = (i + 1) & mask) {
        if (!m->used[i])
            return NULL;
        if (m->keys[i] == key)
            return &m->vals[i];
    }
}

void ty_u64map_put(struct ty_u64map *m, uint64_t key, uint32_t val)
{
    if ((m->len + 1) * 4 > m->cap * 3)
        map_grow(m);
    size_t mask = m->cap - 1;
    size_t i = ty_hash_mix64(key) & mask;
    while (m->used[i] && m->keys[i] != key)
        i = (i + 1) & mask;
    if (!m->used[i]) {
        m->used[i] = 1;
        m->keys[i] = key;
        m->len++;
    }
    m->vals[i] = val;
}

bool ty_u64map_del(struct ty_u64map *m, uint64_t key)
{
    if (!m->cap)
        return false;
    size_t mask = m->cap - 1;
    size_t i = ty_hash_mix64(key) & mask;
    while (m->used[i] && m->keys[i] != key)
        i = (i + 1) & mask;
    if (!m->used[i])
        return false;
    /* backward-shift deletion keeps every probe chain unbroken */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->used[j])
            break;
        size_t home = ty_hash_mix64(m->keys[j]) & mask;
        bool movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->used[i] = 0;
    m->len--;
    return true;
}
