/* KV page pool logic alone: page accounting, prefix matching of full blocks only, capacity,
 * export/import validation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/errors.h"
#include "tycho/hash.h"
#include "tycho/kvpool.h"

#include <stdlib.h>
#include <string.h>

static ty_kvpool_t *mk(uint32_t pages)
{
    struct ty_kvpool_opts o = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .block_tokens = 4,
                               .n_pages = pages, .hash_seed = 7};
    ty_kvpool_t *p;
    assert_int_equal(ty_kvpool_new(&p, &o), 0);
    return p;
}

static void fill(ty_kvpool_t *p, ty_kvseq_t *s, const uint32_t *t, uint32_t n)
{
    assert_int_equal(ty_kvpool_seq_reserve(p, s, n), 0);
    assert_int_equal(ty_kvpool_seq_commit(p, s, t, n), 0);
}

static void test_sharing_and_refcounts(void **state)
{
    ty_kvpool_t *p = mk(8);
    uint32_t t[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    ty_kvseq_t *a, *b, *c;
    ty_kvpool_seq_new(p, &a);
    fill(p, a, t, 10); /* 2 full blocks + 2 tokens: 3 pages */
    assert_int_equal(ty_kvpool_pages_used(p), 3);
    assert_int_equal(ty_kvpool_page_bytes(p), 2 * 4 * 4 * sizeof(float));
    ty_kvpool_seq_new(p, &b);
    /* 9 tokens: (9-1)/4 = 2 full blocks may match */
    assert_int_equal(ty_kvpool_seq_match_prefix(p, b, t, 9), 8);
    assert_int_equal(ty_kvpool_pages_used(p), 3);
    assert_memory_equal(ty_kvseq_pages(a), ty_kvseq_pages(b), 2 * sizeof(uint32_t));
    ty_kvpool_seq_new(p, &c);
    /* exactly 8 tokens: only 1 block, one token must stay to compute */
    assert_int_equal(ty_kvpool_seq_match_prefix(p, c, t, 8), 4);
    ty_kvpool_seq_free(p, c);
    uint32_t other[5] = {1, 2, 3, 99, 5};
    ty_kvpool_seq_new(p, &c);
    assert_int_equal(ty_kvpool_seq_match_prefix(p, c, other, 5), 0); /* first block differs */
    ty_kvpool_seq_free(p, c);
    ty_kvpool_seq_free(p, a);
    assert_int_equal(ty_kvpool_pages_used(p), 2); /* b still holds the shared two */
    ty_kvpool_seq_free(p, b);
    assert_int_equal(ty_kvpool_pages_used(p), 0);
    /* once freed, the two full blocks stay cached (the partial third page does not) and a
     * later prompt with that prefix takes them back */
    assert_int_equal(ty_kvpool_pages_cached(p), 2);
    ty_kvpool_seq_new(p, &c);
    assert_int_equal(ty_kvpool_seq_match_prefix(p, c, t, 12), 8);
    assert_int_equal(ty_kvpool_pages_cached(p), 0);
    assert_int_equal(ty_kvpool_pages_used(p), 2);
    ty_kvpool_seq_free(p, c);
    ty_kvpool_free(p);
}

/* The prefix cache gives its pages back when the pool needs them: least recently released
 * first, and within one sequence its deepest block first (a block is found only through the
 * blocks before it). 4 pages of 4 tokens. */
static void test_prefix_cache_eviction(void **state)
{
    ty_kvpool_t *p = mk(4);
    uint32_t t[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    uint32_t u[8] = {21, 22, 23, 24, 25, 26, 27, 28};
    ty_kvseq_t *a, *b, *c;
    ty_kvpool_seq_new(p, &a);
    fill(p, a, t, 12); /* three full blocks */
    ty_kvpool_seq_free(p, a);
    assert_int_equal(ty_kvpool_pages_cached(p), 3);
    assert_int_equal(ty_kvpool_pages_used(p), 0);
    /* the cache is free capacity: 4 pages for a new 16-token sequence */
    ty_kvpool_seq_new(p, &b);
    assert_int_equal(ty_kvpool_seq_reserve(p, b, 8), 0); /* the free page, then t's block 3 */
    assert_int_equal(ty_kvpool_seq_commit(p, b, u, 8), 0);
    assert_int_equal(ty_kvpool_pages_cached(p), 2);
    ty_kvpool_seq_new(p, &c);
    assert_int_equal(ty_kvpool_seq_match_prefix(p, c, t, 13), 8); /* blocks 1, 2 survived */
    ty_kvpool_seq_free(p, c);
    ty_kvpool_seq_free(p, b);
    /* cached now, oldest first: t's block 2 and block 1 (c released its deepest first), then
     * u's block 2 and block 1 (b was released last). A new 12-token sequence takes the three
     * oldest: t's prefix is gone, u's first block is left. */
    ty_kvpool_seq_new(p, &c);
    uint32_t w[12] = {31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42};
    fill(p, c, w, 12);
    assert_int_equal(ty_kvpool_pages_cached(p), 1);
    ty_kvpool_seq_new(p, &a);
    assert_int_equal(ty_kvpool_seq_match_prefix(p, a, t, 13), 0);
    ty_kvpool_seq_free(p, a);
    ty_kvpool_seq_new(p, &a);
    assert_int_equal(ty_kvpool_seq_match_prefix(p, a, u, 9), 4);
    ty_kvpool_seq_free(p, a);
    ty_kvpool_seq_free(p, c);
    /* cached pages are free capacity, held pages are not: 4 cached, 4 pages can be reserved */
    assert_int_equal(ty_kvpool_pages_used(p), 0);
    ty_kvpool_seq_new(p, &a);
    assert_int_equal(ty_kvpool_seq_reserve(p, a, 17), TY_ENOCAPACITY);
    assert_int_equal(ty_kvpool_seq_reserve(p, a, 16), 0);
    assert_int_equal(ty_kvpool_pages_cached(p), 0);
    ty_kvpool_seq_free(p, a); /* nothing committed: no block to cache */
    assert_int_equal(ty_kvpool_pages_cached(p), 0);
    ty_kvpool_free(p);
}

/* A long-lived pool: thousands of prompts through a small pool leave tombstones in the prefix
 * index; lookups stay right (the index is rebuilt when they pile up). */
static void test_prefix_cache_churn(void **state)
{
    ty_kvpool_t *p = mk(8);
    uint32_t t[9];
    for (uint32_t round = 0; round < 5000; round++) {
        for (uint32_t k = 0; k < 9; k++)
            t[k] = round * 16 + k;
        ty_kvseq_t *a;
        ty_kvpool_seq_new(p, &a);
        fill(p, a, t, 9); /* two full blocks, all new */
        ty_kvpool_seq_free(p, a);
        ty_kvpool_seq_new(p, &a); /* found again right away */
        assert_int_equal(ty_kvpool_seq_match_prefix(p, a, t, 9), 8);
        ty_kvpool_seq_free(p, a);
        assert_int_equal(ty_kvpool_pages_used(p), 0);
    }
    ty_kvpool_free(p);
}

static void test_capacity(void **state)
{
    ty_kvpool_t *p = mk(2);
    uint32_t t[9] = {0};
    ty_kvseq_t *a;
    ty_kvpool_seq_new(p, &a);
    assert_int_equal(ty_kvpool_seq_reserve(p, a, 9), TY_ENOCAPACITY);
    assert_int_equal(ty_kvpool_pages_used(p), 0);
    fill(p, a, t, 8);
    assert_int_equal(ty_kvpool_seq_commit(p, a, t, 1), TY_EINVAL); /* not reserved */
    ty_kvpool_seq_free(p, a);
    ty_kvpool_free(p);
    struct ty_kvpool_opts bad = {.n_layers = 0, .n_kv_heads = 1, .head_dim = 1, .n_pages = 1};
    assert_int_equal(ty_kvpool_new(&p, &bad), TY_EINVAL);
}

static void test_export_roundtrip(void **state)
{
    ty_kvpool_t *p = mk(8), *q = mk(8);
    uint32_t t[6] = {5, 6, 7, 8, 9, 10};
    ty_kvseq_t *a, *b;
    ty_kvpool_seq_new(p, &a);
    fill(p, a, t, 6);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t i = 0; i < ty_kvseq_n_pages(a); i++) {
            float *k = ty_kvpool_k(p, l, ty_kvseq_pages(a)[i]);
            for (int j = 0; j < 32; j++)
                k[j] = (float)(l * 1000 + i * 100 + j);
        }
    void *buf;
    size_t len;
    assert_int_equal(ty_kvpool_seq_export(p, a, &buf, &len), 0);
    ty_kvpool_seq_new(q, &b);
    ((uint32_t *)buf)[0] ^= 1; /* bad magic */
    assert_int_equal(ty_kvpool_seq_import(q, b, buf, len), TY_EFORMAT);
    ((uint32_t *)buf)[0] ^= 1;
    assert_int_equal(ty_kvpool_seq_import(q, b, buf, len), 0);
    assert_int_equal(ty_kvseq_n_tokens(b), 6);
    assert_memory_equal(ty_kvseq_tokens(b), t, sizeof(t));
    assert_float_equal(((float *)ty_kvpool_k(q, 1, ty_kvseq_pages(b)[1]))[3], 1103.0f, 0);
    free(buf);
    ty_kvpool_seq_free(p, a);
    ty_kvpool_seq_free(q, b);
    ty_kvpool_free(p);
    ty_kvpool_free(q);
}

/* What block_cb reported, and the index membership it implies (checked to alternate). */
struct events {
    uint64_t stored[64], removed[64];
    size_t n_stored, n_removed;
    uint64_t live[4096];
    size_t n_live;
    size_t total;
};

static void on_block(void *arg, uint64_t h, bool stored)
{
    struct events *e = arg;
    size_t i = 0;
    while (i < e->n_live && e->live[i] != h)
        i++;
    if (stored) {
        assert_true(i == e->n_live); /* never stored twice without a removal between */
        assert_true(e->n_live < 4096);
        e->live[e->n_live++] = h;
        if (e->n_stored < 64)
            e->stored[e->n_stored++] = h;
    } else {
        assert_true(i < e->n_live); /* only what was stored is removed */
        e->live[i] = e->live[--e->n_live];
        if (e->n_removed < 64)
            e->removed[e->n_removed++] = h;
    }
    e->total++;
}

static ty_kvpool_t *mk_events(uint32_t pages, struct events *e)
{
    struct ty_kvpool_opts o = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .block_tokens = 4,
                               .n_pages = pages, .hash_seed = 7, .block_cb = on_block,
                               .block_arg = e};
    ty_kvpool_t *p;
    memset(e, 0, sizeof(*e));
    assert_int_equal(ty_kvpool_new(&p, &o), 0);
    return p;
}

/* block_cb: a hash is stored when its block becomes full and indexed, with the chain hash a
 * Conductor computes from the prompt; a duplicate page, a block taken back from the cache and
 * a release report nothing; the eviction of the indexed page reports it removed. */
static void test_block_events(void **state)
{
    struct events e;
    ty_kvpool_t *p = mk_events(4, &e);
    uint32_t t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    uint64_t h[2];
    assert_int_equal(ty_hash_prefix_blocks(t, 10, 4, 7, h, 2), 2);
    ty_kvseq_t *a, *b;
    ty_kvpool_seq_new(p, &a);
    fill(p, a, t, 3);
    assert_int_equal(e.total, 0); /* no full block yet */
    assert_int_equal(ty_kvpool_seq_reserve(p, a, 7), 0);
    assert_int_equal(ty_kvpool_seq_commit(p, a, t + 3, 7), 0);
    assert_int_equal(e.n_stored, 2);
    assert_true(e.stored[0] == h[0] && e.stored[1] == h[1]);
    /* the same first block computed again on another page (no match_prefix): not indexed,
     * so neither its commit nor its release say anything */
    ty_kvpool_seq_new(p, &b);
    fill(p, b, t, 4);
    assert_int_equal(e.total, 2);
    ty_kvpool_seq_free(p, b);
    ty_kvpool_seq_free(p, a); /* both full blocks cached: still indexed */
    assert_int_equal(e.total, 2);
    ty_kvpool_seq_new(p, &a);
    assert_int_equal(ty_kvpool_seq_match_prefix(p, a, t, 10), 8); /* taken back: no event */
    ty_kvpool_seq_free(p, a);
    assert_int_equal(e.total, 2);
    /* 2 free pages (the duplicate's and the partial block's), then the cached ones, oldest
     * first: block 2 (a sequence releases its deepest block first), then block 1 */
    uint32_t u[16] = {50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65};
    ty_kvpool_seq_new(p, &b);
    assert_int_equal(ty_kvpool_seq_reserve(p, b, 8), 0);
    assert_int_equal(e.n_removed, 0);
    assert_int_equal(ty_kvpool_seq_reserve(p, b, 12), 0); /* counts from committed tokens */
    assert_int_equal(e.n_removed, 1);
    assert_true(e.removed[0] == h[1]);
    assert_int_equal(ty_kvpool_seq_reserve(p, b, 16), 0);
    assert_int_equal(e.n_removed, 2);
    assert_true(e.removed[1] == h[0]);
    assert_int_equal(e.n_live, 0);
    assert_int_equal(ty_kvpool_seq_commit(p, b, u, 16), 0);
    assert_int_equal(e.n_live, 4);
    ty_kvpool_seq_free(p, b);
    ty_kvpool_free(p);
    assert_int_equal(e.total, 2 + 2 + 4); /* freeing the pool reports nothing */
}

/* Through thousands of evictions and index compactions, the stored-minus-removed set is always
 * what the index holds: every live hash is found, and the compactions add no events. */
static void test_block_events_churn(void **state)
{
    struct events e;
    ty_kvpool_t *p = mk_events(8, &e);
    uint32_t t[9];
    for (uint32_t round = 0; round < 3000; round++) {
        for (uint32_t k = 0; k < 9; k++)
            t[k] = round * 16 + k;
        ty_kvseq_t *a;
        ty_kvpool_seq_new(p, &a);
        fill(p, a, t, 9);
        ty_kvpool_seq_free(p, a);
        assert_int_equal(e.n_live, ty_kvpool_pages_cached(p));
    }
    assert_int_equal(e.total, 2 * 3000 + (2 * 3000 - e.n_live)); /* each stored once, and
                                                                   * removed unless live */
    uint64_t h[2];
    ty_hash_prefix_blocks(t, 9, 4, 7, h, 2);
    size_t found = 0;
    for (size_t i = 0; i < e.n_live; i++)
        found += e.live[i] == h[0] || e.live[i] == h[1];
    assert_int_equal(found, 2); /* the last prompt's blocks are live, and findable: */
    ty_kvseq_t *a;
    ty_kvpool_seq_new(p, &a);
    assert_int_equal(ty_kvpool_seq_match_prefix(p, a, t, 9), 8);
    ty_kvpool_seq_free(p, a);
    ty_kvpool_free(p);
}

/* Sliding window: pages wholly before a position go back (free, or cached when indexed),
 * their block table entries read TY_KVPOOL_NO_PAGE, the rest of the table keeps its
 * positions; a released sequence is not exported; a new prompt still matches the cached
 * blocks (their KV is its prefix's) and stops where a block is gone. */
static void test_release_before(void **state)
{
    ty_kvpool_t *p = mk(8);
    uint32_t t[14] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    ty_kvseq_t *a, *b;
    ty_kvpool_seq_new(p, &a);
    fill(p, a, t, 14); /* 3 full blocks + 2 tokens: 4 pages */
    uint32_t pages[4];
    memcpy(pages, ty_kvseq_pages(a), sizeof(pages));
    assert_int_equal(ty_kvpool_seq_release_before(p, a, 3), 0); /* no whole block before 3 */
    assert_int_equal(ty_kvpool_seq_release_before(p, a, 9), 2); /* blocks 0, 1 */
    assert_int_equal(ty_kvpool_seq_release_before(p, a, 9), 0); /* idempotent */
    assert_int_equal(ty_kvseq_n_released(a), 2);
    assert_int_equal(ty_kvseq_n_pages(a), 4);
    assert_int_equal(ty_kvseq_pages(a)[0], TY_KVPOOL_NO_PAGE);
    assert_int_equal(ty_kvseq_pages(a)[1], TY_KVPOOL_NO_PAGE);
    assert_int_equal(ty_kvseq_pages(a)[2], pages[2]);
    assert_int_equal(ty_kvpool_pages_used(p), 2);
    assert_int_equal(ty_kvpool_pages_cached(p), 2); /* indexed full blocks stay cached */
    /* never beyond the committed tokens */
    assert_int_equal(ty_kvpool_seq_release_before(p, a, 100), 1); /* block 2 (12 committed) */
    assert_int_equal(ty_kvseq_n_released(a), 3);
    struct ty_kv_range r[8];
    void *buf;
    size_t len;
    assert_int_equal(ty_kvpool_seq_layer_ranges(p, a, 0, r, 8), TY_EINVAL);
    assert_int_equal(ty_kvpool_seq_export(p, a, &buf, &len), TY_EINVAL);
    /* the table grows on, positions keep their pages */
    assert_int_equal(ty_kvpool_seq_reserve(p, a, 4), 0);
    assert_int_equal(ty_kvpool_seq_commit(p, a, t, 4), 0);
    assert_int_equal(ty_kvseq_n_pages(a), 5);
    assert_int_equal(ty_kvpool_pages_used(p), 2);
    /* a new prompt takes the cached blocks back (all three) */
    ty_kvpool_seq_new(p, &b);
    assert_int_equal(ty_kvpool_seq_match_prefix(p, b, t, 14), 12);
    assert_memory_equal(ty_kvseq_pages(b), pages, 3 * sizeof(uint32_t));
    ty_kvpool_seq_free(p, b);
    ty_kvpool_seq_free(p, a);
    assert_int_equal(ty_kvpool_pages_used(p), 0);
    /* evict block 0 (fill the pool with other tokens): a match then finds nothing */
    ty_kvpool_seq_new(p, &b);
    uint32_t other[32];
    for (uint32_t i = 0; i < 32; i++)
        other[i] = 100 + i;
    fill(p, b, other, 32);
    ty_kvpool_seq_free(p, b);
    ty_kvpool_seq_new(p, &b);
    assert_int_equal(ty_kvpool_seq_match_prefix(p, b, t, 14), 0);
    ty_kvpool_seq_free(p, b);
    ty_kvpool_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sharing_and_refcounts),
        cmocka_unit_test(test_prefix_cache_eviction),
        cmocka_unit_test(test_prefix_cache_churn),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_export_roundtrip),
        cmocka_unit_test(test_block_events),
        cmocka_unit_test(test_block_events_churn),
        cmocka_unit_test(test_release_before),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
