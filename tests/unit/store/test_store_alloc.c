/* Offset allocator: first fit, alignment, coalescing, exact takes, double frees. */
#include "tycho/errors.h"
#include "tycho/store_alloc.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

static void test_first_fit_and_align(void **state)
{
    ty_store_alloc_t *a;
    assert_int_equal(ty_store_alloc_new(&a, 1000, 64), 0);
    assert_int_equal(ty_store_alloc_size(a), 960); /* 15 units of 64 */
    uint64_t o1, o2, o3;
    assert_int_equal(ty_store_alloc_take(a, 1, &o1), 0);
    assert_int_equal(ty_store_alloc_take(a, 65, &o2), 0);
    assert_int_equal(ty_store_alloc_take(a, 64, &o3), 0);
    assert_int_equal(o1, 0);
    assert_int_equal(o2, 64);
    assert_int_equal(o3, 192);
    assert_int_equal(ty_store_alloc_used(a), 256);
    /* Free the middle: a 128-byte hole at 64 is the first fit for 100 bytes. */
    assert_int_equal(ty_store_alloc_give(a, o2, 65), 0);
    uint64_t o4;
    assert_int_equal(ty_store_alloc_take(a, 100, &o4), 0);
    assert_int_equal(o4, 64);
    uint64_t big;
    assert_int_equal(ty_store_alloc_take(a, 960 - 256 + 1, &big), TY_ENOCAPACITY);
    assert_int_equal(ty_store_alloc_take(a, 960 - 256, &big), 0);
    assert_int_equal(big, 256);
    assert_int_equal(ty_store_alloc_take(a, 1, &big), TY_ENOCAPACITY);
    assert_int_equal(ty_store_alloc_take(a, 0, &big), TY_EINVAL);
    ty_store_alloc_free(a);
}

static void test_coalesce(void **state)
{
    ty_store_alloc_t *a;
    assert_int_equal(ty_store_alloc_new(&a, 64 * 10, 64), 0);
    uint64_t o[10];
    for (int i = 0; i < 10; i++)
        assert_int_equal(ty_store_alloc_take(a, 64, &o[i]), 0);
    /* Free 1, 3, 2 in that order: 1..3 must merge into one 192-byte range, the only free one
     * (two separate ranges could not take 128 or 192 bytes). */
    uint64_t got;
    assert_int_equal(ty_store_alloc_give(a, o[1], 64), 0);
    assert_int_equal(ty_store_alloc_give(a, o[3], 64), 0);
    assert_int_equal(ty_store_alloc_take(a, 128, &got), TY_ENOCAPACITY);
    assert_int_equal(ty_store_alloc_give(a, o[2], 64), 0);
    assert_int_equal(ty_store_alloc_take(a, 256, &got), TY_ENOCAPACITY);
    assert_int_equal(ty_store_alloc_take(a, 192, &got), 0);
    assert_int_equal(got, o[1]);
    assert_int_equal(ty_store_alloc_give(a, got, 192), 0);
    for (int i = 0; i < 10; i++)
        if (i < 1 || i > 3)
            assert_int_equal(ty_store_alloc_give(a, o[i], 64), 0);
    assert_int_equal(ty_store_alloc_used(a), 0);
    /* everything merged back: the whole arena in one piece */
    assert_int_equal(ty_store_alloc_take(a, 640, &got), 0);
    assert_int_equal(got, 0);
    ty_store_alloc_free(a);
}

static void test_double_free_and_take_at(void **state)
{
    ty_store_alloc_t *a;
    assert_int_equal(ty_store_alloc_new(&a, 4096, 64), 0);
    uint64_t o;
    assert_int_equal(ty_store_alloc_take(a, 128, &o), 0);
    assert_int_equal(ty_store_alloc_give(a, o, 128), 0);
    assert_int_equal(ty_store_alloc_give(a, o, 128), TY_EINVAL);
    assert_int_equal(ty_store_alloc_give(a, 4096, 64), TY_EINVAL);
    assert_int_equal(ty_store_alloc_take_at(a, 1024, 100), 0);
    assert_int_equal(ty_store_alloc_take_at(a, 1088, 64), TY_EBUSY); /* rounded to 128 */
    assert_int_equal(ty_store_alloc_take_at(a, 1152, 64), 0);
    assert_int_equal(ty_store_alloc_take_at(a, 10, 64), TY_EINVAL);
    assert_int_equal(ty_store_alloc_take_at(a, 4032, 128), TY_EINVAL);
    assert_int_equal(ty_store_alloc_used(a), 192);
    /* First fit skips the taken range. */
    assert_int_equal(ty_store_alloc_take(a, 1024, &o), 0);
    assert_int_equal(o, 0);
    assert_int_equal(ty_store_alloc_take(a, 64, &o), 0);
    assert_int_equal(o, 1216);
    ty_store_alloc_free(a);
    assert_int_equal(ty_store_alloc_new(&a, 4096, 48), TY_EINVAL);
    assert_int_equal(ty_store_alloc_new(&a, 32, 64), TY_EINVAL);
}

/* Random takes and gives against a byte map: no overlap ever, used always matches. */
static void test_random_against_map(void **state)
{
    enum { UNITS = 512, N = 200 };
    ty_store_alloc_t *a;
    assert_int_equal(ty_store_alloc_new(&a, UNITS * 64, 64), 0);
    unsigned char map[UNITS] = {0};
    uint64_t off[N], len[N];
    int live[N] = {0};
    srand(7);
    uint64_t used = 0;
    for (int it = 0; it < 20000; it++) {
        int i = rand() % N;
        if (live[i]) {
            assert_int_equal(ty_store_alloc_give(a, off[i], len[i]), 0);
            for (uint64_t u = off[i] / 64; u < (off[i] + len[i] + 63) / 64; u++)
                map[u] = 0;
            used -= (len[i] + 63) / 64 * 64;
            live[i] = 0;
        } else {
            len[i] = 1 + (uint64_t)(rand() % (64 * 8));
            if (ty_store_alloc_take(a, len[i], &off[i]) != 0)
                continue;
            for (uint64_t u = off[i] / 64; u < (off[i] + len[i] + 63) / 64; u++) {
                assert_int_equal(map[u], 0);
                map[u] = 1;
            }
            used += (len[i] + 63) / 64 * 64;
            live[i] = 1;
        }
        assert_int_equal(ty_store_alloc_used(a), used);
    }
    ty_store_alloc_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_fit_and_align),
        cmocka_unit_test(test_coalesce),
        cmocka_unit_test(test_double_free_and_take_at),
        cmocka_unit_test(test_random_against_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
