/* String-keyed chained hash table (keymap-impl.h). */
#include "keymap-impl.h"

#include "tycho/log.h"
#include "tycho/xxh3.h"

#include <stdlib.h>
#include <string.h>

void ty__store_kmap_init(struct ty__store_kmap *m)
{
    m->cap = 1024;
    m->n = 0;
    m->v = calloc(m->cap, sizeof(*m->v));
    TY_ASSERT(m->v != NULL);
}

void ty__store_kmap_fini(struct ty__store_kmap *m)
{
    free(m->v);
    memset(m, 0, sizeof(*m));
}

struct ty__store_kent **ty__store_kmap_slot(const struct ty__store_kmap *m, const char *key,
                                            uint64_t *hash)
{
    *hash = XXH3_64bits(key, strlen(key));
    struct ty__store_kent **pp = &m->v[*hash & (m->cap - 1)];
    while (*pp && !((*pp)->hash == *hash && strcmp((*pp)->key, key) == 0))
        pp = &(*pp)->next;
    return pp;
}

void ty__store_kmap_reserve(struct ty__store_kmap *m)
{
    if (m->n + 1 <= m->cap)
        return;
    size_t nn = m->cap * 2;
    struct ty__store_kent **nv = calloc(nn, sizeof(*nv));
    TY_ASSERT(nv != NULL);
    for (size_t i = 0; i < m->cap; i++)
        for (struct ty__store_kent *e = m->v[i], *next; e; e = next) {
            next = e->next;
            e->next = nv[e->hash & (nn - 1)];
            nv[e->hash & (nn - 1)] = e;
        }
    free(m->v);
    m->v = nv;
    m->cap = nn;
}
