#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/arena.h"

#include <string.h>

static void test_alloc_aligned_and_distinct(void **state)
{
    ty_arena_t *a = ty_arena_new(256);
    unsigned char *prev = NULL;
    for (int i = 1; i < 500; i++) {
        unsigned char *p = ty_arena_alloc(a, (size_t)(i % 37) + 1);
        assert_int_equal((uintptr_t)p % 16, 0);
        memset(p, i & 0xff, (size_t)(i % 37) + 1);
        if (prev)
            assert_ptr_not_equal(p, prev);
        prev = p;
    }
    /* A block larger than the block size is served too. */
    unsigned char *big = ty_arena_alloc(a, 10000);
    memset(big, 0xab, 10000);
    char *s = ty_arena_strdup(a, "prefill");
    assert_string_equal(s, "prefill");
    char *t = ty_arena_strndup(a, "decode-node", 6);
    assert_string_equal(t, "decode");
    ty_arena_free(a);
}

static void test_values_survive_growth(void **state)
{
    ty_arena_t *a = ty_arena_new(128);
    uint32_t *ptrs[200];
    for (uint32_t i = 0; i < 200; i++) {
        ptrs[i] = ty_arena_alloc(a, sizeof(uint32_t) * 8);
        for (int k = 0; k < 8; k++)
            ptrs[i][k] = i * 8 + (uint32_t)k;
    }
    for (uint32_t i = 0; i < 200; i++)
        for (int k = 0; k < 8; k++)
            assert_int_equal(ptrs[i][k], i * 8 + (uint32_t)k);
    assert_true(ty_arena_used(a) >= 200 * 32);
    ty_arena_reset(a);
    assert_int_equal(ty_arena_used(a), 0);
    void *p = ty_arena_alloc(a, 64);
    assert_non_null(p);
    ty_arena_free(a);
}

static void test_try_alloc_refuses_absurd(void **state)
{
    ty_arena_t *a = ty_arena_new(0);
    assert_null(ty_arena_try_alloc(a, SIZE_MAX - 4));
    assert_null(ty_arena_calloc(a, SIZE_MAX / 2, 4));
    ty_arena_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_aligned_and_distinct),
        cmocka_unit_test(test_values_survive_growth),
        cmocka_unit_test(test_try_alloc_refuses_absurd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
