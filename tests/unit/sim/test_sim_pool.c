/* KV pool model: each eviction policy on hand-built access sequences, where the policies
 * disagree about the victim. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/errors.h"
#include "tycho/sim.h"

enum { A = 1, B = 2, C = 3, X = 10, Y = 11, Z = 12 };

struct counts {
    int stored, removed;
    uint64_t last_removed;
};

static void on_event(void *arg, uint64_t hash, bool stored)
{
    struct counts *c = arg;
    if (stored) {
        c->stored++;
    } else {
        c->removed++;
        c->last_removed = hash;
    }
}

static ty_sim_pool_t *pool(enum ty_sim_evict pol, uint64_t cap, struct counts *c)
{
    struct ty_sim_pool_opts o = {.capacity_blocks = cap, .policy = pol, .on_event = on_event,
                                 .arg = c};
    ty_sim_pool_t *p;
    assert_int_equal(ty_sim_pool_new(&p, &o), 0);
    return p;
}

static void one(ty_sim_pool_t *p, uint64_t h)
{
    ty_sim_pool_access(p, &h, 1);
}

/* Capacity 2; requests [A] [A] [B] [C]. A is used twice but longer ago than B. LRU evicts
 * A (least recent); LFU evicts B (used once, A twice). */
static void test_lru_vs_lfu(void **st)
{
    struct counts c = {0};
    ty_sim_pool_t *p = pool(TY_SIM_EVICT_LRU, 2, &c);
    one(p, A), one(p, A), one(p, B), one(p, C);
    assert_false(ty_sim_pool_contains(p, A));
    assert_true(ty_sim_pool_contains(p, B) && ty_sim_pool_contains(p, C));
    assert_int_equal(c.stored, 3);
    assert_int_equal(c.removed, 1);
    assert_int_equal(c.last_removed, A);
    ty_sim_pool_free(p);

    c = (struct counts){0};
    p = pool(TY_SIM_EVICT_LFU, 2, &c);
    one(p, A), one(p, A), one(p, B), one(p, C);
    assert_true(ty_sim_pool_contains(p, A) && ty_sim_pool_contains(p, C));
    assert_false(ty_sim_pool_contains(p, B));
    assert_int_equal(c.last_removed, B);
    ty_sim_pool_free(p);
}

/* Capacity 2; one request [X Y] (X at position 0, Y at 1), then [Z]. All used once. LRU and
 * LFU evict X (oldest); length-aware evicts Y, the block deepest in its request, keeping the
 * prefix X usable. */
static void test_length_aware(void **st)
{
    const uint64_t xy[2] = {X, Y};
    enum ty_sim_evict pols[3] = {TY_SIM_EVICT_LRU, TY_SIM_EVICT_LFU, TY_SIM_EVICT_LENGTH_AWARE};
    uint64_t victim[3] = {X, X, Y};
    for (int i = 0; i < 3; i++) {
        struct counts c = {0};
        ty_sim_pool_t *p = pool(pols[i], 2, &c);
        ty_sim_pool_access(p, xy, 2);
        one(p, Z);
        assert_int_equal(c.last_removed, victim[i]);
        assert_int_equal(ty_sim_pool_size(p), 2);
        ty_sim_pool_free(p);
    }
}

/* LFU ties fall back to recency: [A] [B] [A] [B] [C]: A and B both twice, A older. */
static void test_lfu_tie_is_lru(void **st)
{
    struct counts c = {0};
    ty_sim_pool_t *p = pool(TY_SIM_EVICT_LFU, 3, &c);
    one(p, A), one(p, B), one(p, A), one(p, B), one(p, C);
    assert_int_equal(c.removed, 0);
    one(p, X); /* C and X once: C, older, goes */
    assert_int_equal(c.last_removed, C);
    ty_sim_pool_free(p);
}

static void test_prefix_and_unlimited(void **st)
{
    struct counts c = {0};
    ty_sim_pool_t *p = pool(TY_SIM_EVICT_LRU, 0, &c);
    uint64_t seq[5] = {1, 2, 3, 4, 5}, other[3] = {1, 2, 9};
    ty_sim_pool_access(p, seq, 5);
    assert_int_equal(ty_sim_pool_prefix(p, other, 3), 2);
    assert_int_equal(ty_sim_pool_prefix(p, seq, 5), 5);
    for (uint64_t i = 100; i < 5100; i++)
        one(p, i);
    assert_int_equal(ty_sim_pool_size(p), 5005);
    assert_int_equal(c.removed, 0);
    ty_sim_pool_free(p);
}

/* A heap under churn: capacity 100, 10,000 random-ish accesses; the pool never exceeds its
 * capacity and what it holds answers prefix queries consistently. */
static void test_churn(void **st)
{
    for (int pol = 0; pol < TY_SIM_EVICT_COUNT_; pol++) {
        struct counts c = {0};
        ty_sim_pool_t *p = pool((enum ty_sim_evict)pol, 100, &c);
        uint64_t x = 12345;
        for (int i = 0; i < 10000; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t req[4] = {(x >> 33) % 300, (x >> 40) % 300, 7, (x >> 20) % 1000};
            ty_sim_pool_access(p, req, 4);
            assert_true(ty_sim_pool_size(p) <= 100);
        }
        assert_int_equal(c.stored - c.removed, (int)ty_sim_pool_size(p));
        ty_sim_pool_free(p);
    }
}

static void test_names(void **st)
{
    enum ty_sim_evict e;
    assert_int_equal(ty_sim_evict_parse("length_aware", &e), 0);
    assert_int_equal(e, TY_SIM_EVICT_LENGTH_AWARE);
    assert_int_equal(ty_sim_evict_parse("fifo", &e), TY_EINVAL);
    struct ty_sim_pool_opts o = {.policy = (enum ty_sim_evict)7};
    ty_sim_pool_t *p;
    assert_int_equal(ty_sim_pool_new(&p, &o), TY_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lru_vs_lfu),          cmocka_unit_test(test_length_aware),
        cmocka_unit_test(test_lfu_tie_is_lru),      cmocka_unit_test(test_prefix_and_unlimited),
        cmocka_unit_test(test_churn),               cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
