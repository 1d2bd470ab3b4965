/* KV page pool logic alone: page accounting, prefix matching of full blocks only, capacity,
 * export/import validation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/errors.h"
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
    assert_float_equal(ty_kvpool_k(q, 1, ty_kvseq_pages(b)[1])[3], 1103.0f, 0);
    free(buf);
    ty_kvpool_seq_free(p, a);
    ty_kvpool_seq_free(q, b);
    ty_kvpool_free(p);
    ty_kvpool_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sharing_and_refcounts),
        cmocka_unit_test(test_prefix_cache_eviction),
        cmocka_unit_test(test_prefix_cache_churn),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_export_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
