/* KV pool model: a set of block hashes with a capacity and an eviction order kept in an
 * indexed binary min-heap (the heap top is the next victim). Every access is O(log n). */
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/sim.h"
#include "tycho/u64map.h"

#include <stdlib.h>
#include <string.h>

struct entry {
    uint64_t hash;
    uint64_t freq;
    uint64_t last; /* tick of the last touch */
    uint32_t pos;  /* block position in the request that touched it last */
    uint32_t heap; /* index in heap[] */
};

struct ty_sim_pool {
    struct ty_sim_pool_opts o;
    struct ty_u64map map; /* hash -> entry index */
    struct entry *e;
    uint32_t *heap;
    uint32_t *free_e;
    size_t n, cap, n_free, n_heap;
    uint64_t tick;
};

static const char *const evict_names[] = {"lru", "lfu", "length_aware"};

const char *ty_sim_evict_name(enum ty_sim_evict e)
{
    return (unsigned)e < TY_SIM_EVICT_COUNT_ ? evict_names[e] : "unknown";
}

int ty_sim_evict_parse(const char *s, enum ty_sim_evict *out)
{
    for (int i = 0; s && i < TY_SIM_EVICT_COUNT_; i++) {
        if (strcmp(s, evict_names[i]) == 0) {
            *out = (enum ty_sim_evict)i;
            return 0;
        }
    }
    return TY_EINVAL;
}

int ty_sim_pool_new(ty_sim_pool_t **out, const struct ty_sim_pool_opts *o)
{
    if (!o || (unsigned)o->policy >= TY_SIM_EVICT_COUNT_)
        return TY_EINVAL;
    ty_sim_pool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return TY_ENOMEM;
    p->o = *o;
    ty_u64map_init(&p->map);
    *out = p;
    return 0;
}

void ty_sim_pool_free(ty_sim_pool_t *p)
{
    if (!p)
        return;
    ty_u64map_fini(&p->map);
    free(p->e);
    free(p->heap);
    free(p->free_e);
    free(p);
}

/* true when a should be evicted before b */
static bool before(const ty_sim_pool_t *p, const struct entry *a, const struct entry *b)
{
    if (p->o.policy != TY_SIM_EVICT_LRU && a->freq != b->freq)
        return a->freq < b->freq;
    if (p->o.policy == TY_SIM_EVICT_LENGTH_AWARE && a->pos != b->pos)
        return a->pos > b->pos;
    return a->last < b->last;
}

static void heap_swap(ty_sim_pool_t *p, size_t i, size_t j)
{
    uint32_t t = p->heap[i];
    p->heap[i] = p->heap[j];
    p->heap[j] = t;
    p->e[p->heap[i]].heap = (uint32_t)i;
    p->e[p->heap[j]].heap = (uint32_t)j;
}

static void heap_up(ty_sim_pool_t *p, size_t i)
{
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(p, &p->e[p->heap[i]], &p->e[p->heap[parent]]))
            break;
        heap_swap(p, i, parent);
        i = parent;
    }
}

static void heap_down(ty_sim_pool_t *p, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < p->n_heap && before(p, &p->e[p->heap[l]], &p->e[p->heap[m]]))
            m = l;
        if (r < p->n_heap && before(p, &p->e[p->heap[r]], &p->e[p->heap[m]]))
            m = r;
        if (m == i)
            return;
        heap_swap(p, i, m);
        i = m;
    }
}

static uint32_t entry_alloc(ty_sim_pool_t *p)
{
    if (p->n_free)
        return p->free_e[--p->n_free];
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 1024;
        p->e = realloc(p->e, cap * sizeof(*p->e));
        p->heap = realloc(p->heap, cap * sizeof(*p->heap));
        p->free_e = realloc(p->free_e, cap * sizeof(*p->free_e));
        TY_ASSERT(p->e && p->heap && p->free_e);
        p->cap = cap;
    }
    return (uint32_t)p->n++;
}

static void evict_top(ty_sim_pool_t *p)
{
    uint32_t victim = p->heap[0];
    heap_swap(p, 0, p->n_heap - 1);
    p->n_heap--;
    if (p->n_heap)
        heap_down(p, 0);
    uint64_t hash = p->e[victim].hash;
    ty_u64map_del(&p->map, hash);
    p->free_e[p->n_free++] = victim;
    if (p->o.on_event)
        p->o.on_event(p->o.arg, hash, false);
}

static void touch(ty_sim_pool_t *p, uint64_t hash, uint32_t pos)
{
    uint32_t *v = ty_u64map_get(&p->map, hash);
    struct entry *e;
    if (v) {
        e = &p->e[*v];
        e->freq++;
        e->last = ++p->tick;
        e->pos = pos;
        heap_down(p, e->heap); /* keys only grow: the entry can only sink */
        heap_up(p, e->heap);   /* (length_aware: a smaller pos may raise it) */
        return;
    }
    uint32_t idx = entry_alloc(p);
    e = &p->e[idx];
    *e = (struct entry){.hash = hash, .freq = 1, .last = ++p->tick, .pos = pos};
    e->heap = (uint32_t)p->n_heap;
    p->heap[p->n_heap++] = idx;
    heap_up(p, e->heap);
    ty_u64map_put(&p->map, hash, idx);
    if (p->o.on_event)
        p->o.on_event(p->o.arg, hash, true);
}

void ty_sim_pool_access(ty_sim_pool_t *p, const uint64_t *blocks, size_t n)
{
    for (size_t i = 0; i < n; i++)
        touch(p, blocks[i], (uint32_t)i);
    while (p->o.capacity_blocks && p->n_heap > p->o.capacity_blocks)
        evict_top(p);
}

size_t ty_sim_pool_prefix(const ty_sim_pool_t *p, const uint64_t *blocks, size_t n)
{
    size_t i = 0;
    while (i < n && ty_u64map_get(&p->map, blocks[i]))
        i++;
    return i;
}

size_t ty_sim_pool_size(const ty_sim_pool_t *p)
{
    return p->n_heap;
}

bool ty_sim_pool_contains(const ty_sim_pool_t *p, uint64_t hash)
{
    return ty_u64map_get(&p->map, hash) != NULL;
}

int ty_sim_cache_run(const struct ty_sim_trace *t, uint64_t capacity, enum ty_sim_evict policy,
                     struct ty_sim_cache_result *out)
{
    struct ty_sim_pool_opts o = {.capacity_blocks = capacity, .policy = policy};
    ty_sim_pool_t *p;
    int rc = ty_sim_pool_new(&p, &o);
    if (rc < 0)
        return rc;
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < t->n; i++) {
        const struct ty_sim_request *r = &t->reqs[i];
        out->hit_blocks += ty_sim_pool_prefix(p, r->blocks, r->n_blocks);
        out->total_blocks += r->n_blocks;
        ty_sim_pool_access(p, r->blocks, r->n_blocks);
    }
    out->hit_rate = out->total_blocks ? (double)out->hit_blocks / (double)out->total_blocks : 0;
    ty_sim_pool_free(p);
    return 0;
}
