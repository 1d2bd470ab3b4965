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
    /* once freed, the blocks are no longer findable */
    ty_kvpool_seq_new(p, &c);
    assert_int_equal(ty_kvpool_seq_match_prefix(p, c, t, 12), 0);
    ty_kvpool_seq_free(p, c);
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
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_export_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
