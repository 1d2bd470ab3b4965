/* Master metadata: hand-built sequences for placement, two-phase put, leases, each eviction
 * policy, soft pins, replica counts, heartbeats, SSD offload/load jobs and re-announcement. */
#include "tycho/errors.h"
#include "tycho/store_meta.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define U 64 /* allocation unit in these tests */

static ty_store_meta_t *mk(enum ty_store_policy p, uint64_t lease_ms)
{
    struct ty_store_meta_opts o = {.policy = p,
                                   .high_watermark = 0.9,
                                   .low_watermark = 0.5,
                                   .put_timeout_ms = 1000,
                                   .lease_ms = lease_ms,
                                   .node_timeout_ms = 1000,
                                   .align = U};
    ty_store_meta_t *m;
    assert_int_equal(ty_store_meta_new(&m, &o), 0);
    return m;
}

static void put(ty_store_meta_t *m, const char *key, uint64_t len, uint32_t n, const char *w,
                uint64_t now)
{
    struct ty_store_placement pl;
    assert_int_equal(ty_store_meta_put_start(m, key, len, n, w, now, &pl), 0);
    assert_int_equal(ty_store_meta_put_commit(m, key, 0xc0ffee, now), 0);
}

static uint64_t used(ty_store_meta_t *m, uint32_t id)
{
    struct ty_store_node_info ni;
    assert_int_equal(ty_store_meta_node_info(m, id, &ni), 0);
    return ni.dram_used;
}

static void test_placement(void **state)
{
    ty_store_meta_t *m = mk(TY_STORE_POLICY_LRU, 100);
    uint32_t a, b, c;
    struct ty_store_placement pl;
    assert_int_equal(ty_store_meta_put_start(m, "k", 64, 1, NULL, 0, &pl), TY_EUNAVAIL);
    assert_int_equal(ty_store_meta_node_add(m, "A", 100 * U, false, 0, &a), 0);
    assert_int_equal(ty_store_meta_node_add(m, "B", 100 * U, false, 0, &b), 0);
    assert_int_equal(ty_store_meta_node_add(m, "C", 100 * U, false, 0, &c), 0);
    put(m, "fill-c", 10 * U, 1, "C", 0); /* C is now the fullest */
    assert_int_equal(ty_store_meta_put_start(m, "k", 3 * U, 2, "B", 1, &pl), 0);
    assert_int_equal(pl.n, 2);
    assert_int_equal(pl.r[0].node, b); /* the writer's own node first */
    assert_int_equal(pl.r[1].node, a); /* then the emptiest other */
    assert_int_equal(pl.r[0].state, TY_STORE_REPLICA_PENDING);
    /* More replicas than nodes: one per node, all distinct. */
    assert_int_equal(ty_store_meta_put_start(m, "k5", U, 5, NULL, 1, &pl), 0);
    assert_int_equal(pl.n, 3);
    assert_true(pl.r[0].node != pl.r[1].node && pl.r[1].node != pl.r[2].node &&
                pl.r[0].node != pl.r[2].node);
    /* A writer that is no pool node changes nothing: the emptiest comes first. */
    assert_int_equal(ty_store_meta_put_start(m, "k1", U, 1, "client-9", 1, &pl), 0);
    assert_int_not_equal(pl.r[0].node, c);
    assert_int_equal(ty_store_meta_put_start(m, "k", U, 1, NULL, 1, &pl), TY_EEXIST);
    assert_int_equal(ty_store_meta_put_start(m, "", U, 1, NULL, 1, &pl), TY_EINVAL);
    assert_int_equal(ty_store_meta_put_start(m, "z", 0, 1, NULL, 1, &pl), TY_EINVAL);
    assert_int_equal(ty_store_meta_put_start(m, "big", 101 * U, 1, NULL, 1, &pl), TY_ENOCAPACITY);
    ty_store_meta_free(m);
}

static void test_two_phase_and_events(void **state)
{
    ty_store_meta_t *m = mk(TY_STORE_POLICY_LRU, 100);
    uint32_t a, b;
    assert_int_equal(ty_store_meta_node_add(m, "A", 100 * U, false, 0, &a), 0);
    assert_int_equal(ty_store_meta_node_add(m, "B", 100 * U, false, 0, &b), 0);
    struct ty_store_placement pl, g;
    uint64_t lease;
    assert_int_equal(ty_store_meta_put_start(m, "k", 100, 2, "A", 5, &pl), 0);
    assert_false(ty_store_meta_exists(m, "k"));
    assert_int_equal(ty_store_meta_get(m, "k", 6, &g, &lease), TY_ENOTFOUND);
    struct ty_store_event ev[8];
    assert_int_equal(ty_store_meta_events_take(m, ev, 8), 0);
    assert_int_equal(ty_store_meta_put_commit(m, "k", 0x1234, 7), 0);
    assert_int_equal(ty_store_meta_put_commit(m, "k", 0x1234, 7), TY_EALREADY);
    assert_true(ty_store_meta_exists(m, "k"));
    assert_int_equal(ty_store_meta_events_take(m, ev, 8), 2);
    assert_int_equal(ev[0].kind, TY_STORE_EVENT_STORED);
    assert_string_equal(ev[0].key, "k");
    assert_int_equal(ev[0].checksum, 0x1234);
    assert_int_equal(ev[0].node + ev[1].node, a + b);
    assert_int_equal(ty_store_meta_get(m, "k", 8, &g, &lease), 0);
    assert_int_equal(g.n, 2);
    assert_int_equal(g.r[0].length, 100);
    assert_int_equal(g.r[0].checksum, 0x1234);
    assert_int_equal(g.r[0].state, TY_STORE_REPLICA_COMPLETE);
    assert_int_equal(lease, 108);
    assert_int_equal(ty_store_meta_put_commit(m, "nope", 1, 9), TY_ENOTFOUND);
    /* Abort frees at once. */
    assert_int_equal(ty_store_meta_put_start(m, "x", 10 * U, 1, "A", 10, &pl), 0);
    assert_int_equal(used(m, a), 2 * U + 10 * U);
    assert_int_equal(ty_store_meta_put_abort(m, "x"), 0);
    assert_int_equal(used(m, a), 2 * U);
    assert_int_equal(ty_store_meta_put_abort(m, "k"), TY_ENOTFOUND); /* committed */
    assert_int_equal(ty_store_meta_remove(m, "k", 500), 0);
    assert_int_equal(ty_store_meta_events_take(m, ev, 8), 2);
    assert_int_equal(ev[0].kind, TY_STORE_EVENT_REMOVED);
    assert_int_equal(ty_store_meta_remove(m, "k", 500), TY_ENOTFOUND);
    ty_store_meta_free(m);
}

static void test_put_expiry(void **state)
{
    ty_store_meta_t *m = mk(TY_STORE_POLICY_LRU, 500);
    uint32_t a;
    assert_int_equal(ty_store_meta_node_add(m, "A", 100 * U, false, 0, &a), 0);
    struct ty_store_placement pl;
    assert_int_equal(ty_store_meta_put_start(m, "k", 4 * U, 1, NULL, 0, &pl), 0);
    ty_store_meta_node_heartbeat(m, a, 900);
    ty_store_meta_tick(m, 999);
    assert_int_equal(ty_store_meta_put_start(m, "k", U, 1, NULL, 999, &pl), TY_EEXIST);
    ty_store_meta_node_heartbeat(m, a, 1000);
    ty_store_meta_tick(m, 1000); /* expired: the key is free, the range after a grace period */
    assert_int_equal(ty_store_meta_put_commit(m, "k", 1, 1000), TY_ENOTFOUND);
    assert_int_equal(used(m, a), 4 * U);
    ty_store_meta_node_heartbeat(m, a, 1499);
    ty_store_meta_tick(m, 1499);
    assert_int_equal(used(m, a), 4 * U);
    ty_store_meta_tick(m, 1500);
    assert_int_equal(used(m, a), 0);
    struct ty_store_meta_stats st;
    ty_store_meta_stats(m, &st);
    assert_int_equal(st.expired_puts, 1);
    assert_int_equal(ty_store_meta_put_start(m, "k", U, 1, NULL, 1500, &pl), 0);
    ty_store_meta_free(m);
}

static void test_lease_blocks_free(void **state)
{
    ty_store_meta_t *m = mk(TY_STORE_POLICY_LRU, 400);
    uint32_t a;
    assert_int_equal(ty_store_meta_node_add(m, "A", 10 * U, false, 0, &a), 0);
    put(m, "a", 2 * U, 1, NULL, 0);
    struct ty_store_placement g, pl;
    uint64_t lease;
    assert_int_equal(ty_store_meta_get(m, "a", 100, &g, &lease), 0);
    assert_int_equal(lease, 500);
    assert_int_equal(ty_store_meta_remove(m, "a", 200), 0);
    assert_false(ty_store_meta_exists(m, "a"));
    /* The freed range must not be handed out while the reader's lease runs. */
    for (int i = 0; i < 4; i++) {
        char k[8];
        snprintf(k, sizeof(k), "f%d", i);
        assert_int_equal(ty_store_meta_put_start(m, k, 2 * U, 1, NULL, 300, &pl), 0);
        assert_true(pl.r[0].offset >= g.r[0].offset + 2 * U ||
                    pl.r[0].offset + 2 * U <= g.r[0].offset);
    }
    assert_int_equal(ty_store_meta_put_start(m, "f9", 2 * U, 1, NULL, 300, &pl), TY_ENOCAPACITY);
    ty_store_meta_node_heartbeat(m, a, 499);
    ty_store_meta_tick(m, 499);
    assert_int_equal(ty_store_meta_put_start(m, "f9", 2 * U, 1, NULL, 499, &pl), TY_ENOCAPACITY);
    ty_store_meta_node_heartbeat(m, a, 500);
    ty_store_meta_tick(m, 500);
    assert_int_equal(ty_store_meta_put_start(m, "f9", 2 * U, 1, NULL, 500, &pl), 0);
    assert_int_equal(pl.r[0].offset, g.r[0].offset);
    ty_store_meta_free(m);
}

/* Ten 1-unit keys k0..k9 committed at t = 10..19 on a 10-unit node (high 0.9, low 0.5). */
static ty_store_meta_t *ten_keys(enum ty_store_policy p, uint32_t *id)
{
    ty_store_meta_t *m = mk(p, 1);
    assert_int_equal(ty_store_meta_node_add(m, "A", 10 * U, false, 0, id), 0);
    for (int i = 0; i < 10; i++) {
        char k[8];
        snprintf(k, sizeof(k), "k%d", i);
        put(m, k, U, 1, NULL, 10 + (uint64_t)i);
    }
    return m;
}

static void get_at(ty_store_meta_t *m, const char *key, uint64_t now)
{
    struct ty_store_placement g;
    uint64_t lease;
    assert_int_equal(ty_store_meta_get(m, key, now, &g, &lease), 0);
}

static void expect_present(ty_store_meta_t *m, const char *present)
{
    for (int i = 0; i < 10; i++) {
        char k[8];
        snprintf(k, sizeof(k), "k%d", i);
        bool want = strchr(present, '0' + i) != NULL;
        if (ty_store_meta_exists(m, k) != want)
            fail_msg("%s: expected %s", k, want ? "present" : "evicted");
    }
}

static void evict_at(ty_store_meta_t *m, uint32_t id, uint64_t now)
{
    ty_store_meta_node_heartbeat(m, id, now);
    ty_store_meta_tick(m, now);
}

/* k0 read 3 times long ago, k1..k9 once each later: LRU drops k0 first, LFU keeps it. */
static void access_pattern(ty_store_meta_t *m)
{
    for (int i = 0; i < 3; i++)
        get_at(m, "k0", 100 + (uint64_t)i);
    for (int i = 1; i < 10; i++) {
        char k[8];
        snprintf(k, sizeof(k), "k%d", i);
        get_at(m, k, 200 + (uint64_t)i);
    }
}

static void test_evict_lru(void **state)
{
    uint32_t id;
    ty_store_meta_t *m = ten_keys(TY_STORE_POLICY_LRU, &id);
    evict_at(m, id, 50); /* 10/10 units > 0.9: down to 5 */
    expect_present(m, "56789");
    ty_store_meta_free(m);
    m = ten_keys(TY_STORE_POLICY_LRU, &id);
    access_pattern(m);
    evict_at(m, id, 1000);
    expect_present(m, "56789"); /* k0 (last read at 102), k1..k4 */
    assert_int_equal(used(m, id), 5 * U);
    ty_store_meta_free(m);
}

static void test_evict_lfu(void **state)
{
    uint32_t id;
    ty_store_meta_t *m = ten_keys(TY_STORE_POLICY_LFU, &id);
    access_pattern(m);
    evict_at(m, id, 1000);
    expect_present(m, "06789"); /* k0 has 3 reads; the 1-read keys go oldest first */
    ty_store_meta_free(m);
}

static void test_evict_length_aware(void **state)
{
    const char *keys[] = {"a", "b", "c", "d", "e", "f", "g"};
    const uint64_t units[] = {8, 1, 1, 1, 1, 4, 3}; /* 19 of 20 units: over 0.9 */
    for (int pol = 0; pol < 2; pol++) {
        ty_store_meta_t *m = mk(pol ? TY_STORE_POLICY_LENGTH_AWARE : TY_STORE_POLICY_LRU, 1);
        uint32_t id;
        assert_int_equal(ty_store_meta_node_add(m, "A", 20 * U, false, 0, &id), 0);
        for (int i = 0; i < 7; i++)
            put(m, keys[i], units[i] * U, 1, NULL, 10 + (uint64_t)i);
        evict_at(m, id, 1000); /* down to 10 units */
        assert_false(ty_store_meta_exists(m, "a"));
        if (pol) { /* score (idle x length): a, then f; 7 units left */
            assert_false(ty_store_meta_exists(m, "f"));
            assert_true(ty_store_meta_exists(m, "b"));
            assert_int_equal(used(m, id), 7 * U);
        } else { /* oldest first: a, b */
            assert_false(ty_store_meta_exists(m, "b"));
            assert_true(ty_store_meta_exists(m, "f"));
            assert_int_equal(used(m, id), 10 * U);
        }
        ty_store_meta_free(m);
    }
}

static void test_soft_pin(void **state)
{
    uint32_t id;
    ty_store_meta_t *m = ten_keys(TY_STORE_POLICY_LRU, &id);
    assert_int_equal(ty_store_meta_pin(m, "k0"), 0);
    assert_int_equal(ty_store_meta_pin(m, "k1"), 0);
    evict_at(m, id, 50);
    expect_present(m, "01789");
    assert_int_equal(ty_store_meta_unpin(m, "k1"), 0);
    assert_int_equal(ty_store_meta_unpin(m, "k1"), TY_EINVAL);
    assert_int_equal(ty_store_meta_pin(m, "nope"), TY_ENOTFOUND);
    ty_store_meta_free(m);
    /* Only pinned keys left: a put still gets room (the pin is soft). */
    ty_store_meta_t *m2 = mk(TY_STORE_POLICY_LRU, 1);
    assert_int_equal(ty_store_meta_node_add(m2, "A", 2 * U, false, 0, &id), 0);
    put(m2, "p0", U, 1, NULL, 1);
    put(m2, "p1", U, 1, NULL, 2);
    assert_int_equal(ty_store_meta_pin(m2, "p0"), 0);
    assert_int_equal(ty_store_meta_pin(m2, "p1"), 0);
    put(m2, "n", U, 1, NULL, 10);
    assert_false(ty_store_meta_exists(m2, "p0"));
    assert_true(ty_store_meta_exists(m2, "p1"));
    ty_store_meta_free(m2);
}

static void test_dead_node(void **state)
{
    ty_store_meta_t *m = mk(TY_STORE_POLICY_LRU, 1);
    uint32_t a, b;
    assert_int_equal(ty_store_meta_node_add(m, "A", 100 * U, false, 0, &a), 0);
    assert_int_equal(ty_store_meta_node_add(m, "B", 100 * U, false, 0, &b), 0);
    put(m, "both", U, 2, NULL, 1);
    put(m, "onb", U, 1, "B", 1);
    struct ty_store_event ev[16];
    ty_store_meta_events_take(m, ev, 16);
    assert_int_equal(ty_store_meta_node_heartbeat(m, a, 900), 0);
    ty_store_meta_tick(m, 1000); /* B: 1000 ms silent, not more */
    assert_true(ty_store_meta_exists(m, "onb"));
    ty_store_meta_tick(m, 1001);
    assert_false(ty_store_meta_exists(m, "onb"));
    struct ty_store_placement g;
    uint64_t lease;
    assert_int_equal(ty_store_meta_get(m, "both", 1001, &g, &lease), 0);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.r[0].node, a);
    assert_int_equal(ty_store_meta_events_take(m, ev, 16), 2);
    assert_int_equal(ev[0].kind, TY_STORE_EVENT_REMOVED);
    assert_int_equal(ev[0].node, b);
    assert_int_equal(ty_store_meta_node_heartbeat(m, b, 1002), TY_ENOTFOUND);
    struct ty_store_meta_stats st;
    ty_store_meta_stats(m, &st);
    assert_int_equal(st.dead_nodes, 1);
    assert_int_equal(st.nodes_alive, 1);
    ty_store_meta_free(m);
}

static void test_replica_target(void **state)
{
    ty_store_meta_t *m = mk(TY_STORE_POLICY_LRU, 1);
    uint32_t a, b, c;
    assert_int_equal(ty_store_meta_node_add(m, "A", 100 * U, false, 0, &a), 0);
    assert_int_equal(ty_store_meta_node_add(m, "B", 100 * U, false, 0, &b), 0);
    assert_int_equal(ty_store_meta_node_add(m, "C", 100 * U, false, 0, &c), 0);
    put(m, "hot", 3 * U, 1, "B", 1);
    assert_int_equal(ty_store_meta_set_replicas(m, "hot", 3), 0);
    assert_int_equal(ty_store_meta_set_replicas(m, "hot", 0), TY_EINVAL);
    struct ty_store_job j1, j2, j3;
    for (uint32_t i = 0; i < 3; i++)
        ty_store_meta_node_heartbeat(m, i, 2);
    ty_store_meta_tick(m, 2);
    assert_int_equal(ty_store_meta_job_next(m, &j1), 0);
    assert_int_equal(j1.kind, TY_STORE_JOB_REPLICATE);
    assert_int_equal(j1.src_node, b);
    assert_true(j1.node != b);
    assert_int_equal(j1.length, 3 * U);
    ty_store_meta_tick(m, 3);
    assert_int_equal(ty_store_meta_job_next(m, &j2), 0);
    assert_true(j2.node != b && j2.node != j1.node);
    ty_store_meta_tick(m, 4);
    assert_int_equal(ty_store_meta_job_next(m, &j3), TY_EAGAIN); /* all three placed */
    assert_int_equal(ty_store_meta_job_done(m, j1.id, 0, 0, 5), 0);
    assert_int_equal(ty_store_meta_job_done(m, j2.id, TY_ETIMEDOUT, 0, 5), 0);
    assert_int_equal(ty_store_meta_job_done(m, j2.id, 0, 0, 5), TY_ENOTFOUND);
    struct ty_store_placement g;
    uint64_t lease;
    assert_int_equal(ty_store_meta_get(m, "hot", 6, &g, &lease), 0);
    assert_int_equal(g.n, 2);
    ty_store_meta_tick(m, 6); /* a failed copy waits a second before it is tried again */
    assert_int_equal(ty_store_meta_job_next(m, &j3), TY_EAGAIN);
    for (uint32_t i = 0; i < 3; i++)
        ty_store_meta_node_heartbeat(m, i, 1005);
    ty_store_meta_tick(m, 1005);
    assert_int_equal(ty_store_meta_job_next(m, &j3), 0);
    assert_int_equal(j3.node, j2.node);
    struct ty_store_meta_stats st;
    ty_store_meta_stats(m, &st);
    assert_int_equal(st.replications_started, 3);
    assert_int_equal(st.replications_done, 1);
    assert_int_equal(st.replications_failed, 1);
    ty_store_meta_free(m);
}

static void test_ssd_offload_and_load(void **state)
{
    ty_store_meta_t *m = mk(TY_STORE_POLICY_LRU, 10);
    uint32_t a;
    assert_int_equal(ty_store_meta_node_add(m, "A", 10 * U, true, 0, &a), 0);
    for (int i = 0; i < 10; i++) {
        char k[8];
        snprintf(k, sizeof(k), "k%d", i);
        put(m, k, U, 1, NULL, 10 + (uint64_t)i);
    }
    struct ty_store_event ev[64];
    ty_store_meta_events_take(m, ev, 64);
    evict_at(m, a, 100);
    struct ty_store_job j[8];
    int n = 0;
    while (n < 8 && ty_store_meta_job_next(m, &j[n]) == 0)
        n++;
    assert_int_equal(n, 5); /* k0..k4 offloaded, nothing freed yet */
    assert_int_equal(j[0].kind, TY_STORE_JOB_OFFLOAD);
    assert_string_equal(j[0].key, "k0");
    assert_int_equal(used(m, a), 10 * U);
    /* Still readable from DRAM while the node copies. */
    struct ty_store_placement g;
    uint64_t lease;
    assert_int_equal(ty_store_meta_get(m, "k0", 101, &g, &lease), 0);
    assert_int_equal(g.r[0].tier, TY_STORE_TIER_DRAM);
    for (int i = 0; i < 5; i++)
        assert_int_equal(ty_store_meta_job_done(m, j[i].id, 0, 4096 * (uint64_t)(i + 1), 102), 0);
    /* The offload jobs leased their blocks until 110 (the node reads them), k0's reader
     * until 111: the DRAM ranges wait for that. */
    assert_int_equal(used(m, a), 10 * U);
    evict_at(m, a, 110);
    assert_int_equal(used(m, a), 6 * U);
    evict_at(m, a, 111);
    assert_int_equal(used(m, a), 5 * U);
    /* k0 now lives on SSD only: a get starts a load and says "again". */
    assert_int_equal(ty_store_meta_get(m, "k0", 120, &g, &lease), TY_EAGAIN);
    assert_int_equal(ty_store_meta_get(m, "k0", 121, &g, &lease), TY_EAGAIN);
    struct ty_store_job ld;
    assert_int_equal(ty_store_meta_job_next(m, &ld), 0);
    assert_int_equal(ld.kind, TY_STORE_JOB_LOAD);
    assert_int_equal(ld.src_offset, 4096);
    assert_int_equal(ty_store_meta_job_next(m, &ld) == 0 ? 1 : 0, 0); /* one load only */
    ty_store_meta_job_done(m, 6, 0, 0, 122); /* ids: 1..5 offloads, 6 the load */
    assert_int_equal(ty_store_meta_get(m, "k0", 123, &g, &lease), 0);
    assert_int_equal(g.n, 2);
    assert_int_equal(g.r[0].tier, TY_STORE_TIER_DRAM);
    assert_int_equal(g.r[1].tier, TY_STORE_TIER_SSD);
    /* A load that finds flipped bytes drops the SSD copy: the key is gone, never served. */
    assert_int_equal(ty_store_meta_get(m, "k1", 130, &g, &lease), TY_EAGAIN);
    assert_int_equal(ty_store_meta_job_next(m, &ld), 0);
    assert_int_equal(ty_store_meta_job_done(m, ld.id, TY_ECHECKSUM, 0, 131), 0);
    assert_false(ty_store_meta_exists(m, "k1"));
    assert_int_equal(ty_store_meta_get(m, "k1", 132, &g, &lease), TY_ENOTFOUND);
    size_t ne = ty_store_meta_events_take(m, ev, 64);
    int stored_ssd = 0, removed_ssd = 0;
    for (size_t i = 0; i < ne; i++) {
        if (ev[i].tier == TY_STORE_TIER_SSD && ev[i].kind == TY_STORE_EVENT_STORED)
            stored_ssd++;
        if (ev[i].tier == TY_STORE_TIER_SSD && ev[i].kind == TY_STORE_EVENT_REMOVED)
            removed_ssd++;
    }
    assert_int_equal(stored_ssd, 5);
    assert_int_equal(removed_ssd, 1);
    ty_store_meta_free(m);
}

static void test_restart_and_announce(void **state)
{
    ty_store_meta_t *m = mk(TY_STORE_POLICY_LRU, 1);
    uint32_t a, a2;
    assert_int_equal(ty_store_meta_node_add(m, "A", 100 * U, true, 0, &a), 0);
    assert_int_equal(ty_store_meta_node_announce(m, a, "d", TY_STORE_TIER_DRAM, 2 * U, U, 77, 1),
                     0);
    assert_int_equal(ty_store_meta_node_announce(m, a, "d", TY_STORE_TIER_SSD, 8192, U, 77, 1), 0);
    assert_int_equal(ty_store_meta_node_announce(m, a, "e", TY_STORE_TIER_DRAM, 2 * U, U, 78, 1),
                     TY_EBUSY);
    assert_int_equal(ty_store_meta_node_announce(m, a, "d", TY_STORE_TIER_SSD, 0, U, 99, 1),
                     TY_ESTALE);
    assert_int_equal(ty_store_meta_node_announce(m, a, "d", TY_STORE_TIER_SSD, 0, U, 77, 1),
                     TY_EEXIST);
    struct ty_store_placement g;
    uint64_t lease;
    assert_int_equal(ty_store_meta_get(m, "d", 2, &g, &lease), 0);
    assert_int_equal(g.r[0].offset, 2 * U);
    assert_int_equal(g.r[0].checksum, 77);
    assert_int_equal(used(m, a), U);
    /* The same name registering again is a restart: what it had is gone until announced. */
    assert_int_equal(ty_store_meta_node_add(m, "A", 100 * U, true, 3, &a2), 0);
    assert_false(ty_store_meta_exists(m, "d"));
    assert_int_equal(used(m, a2), 0);
    ty_store_meta_free(m);
}

/* Random puts, gets, removes and ticks: no range a reader holds under lease is ever given to a
 * new put, and a get never returns a replica of another key's range. */
static void test_random_leases(void **state)
{
    enum { KEYS = 64, HELD = 256 };
    ty_store_meta_t *m = mk(TY_STORE_POLICY_LRU, 50);
    uint32_t ids[2];
    assert_int_equal(ty_store_meta_node_add(m, "A", 40 * U, false, 0, &ids[0]), 0);
    assert_int_equal(ty_store_meta_node_add(m, "B", 40 * U, true, 0, &ids[1]), 0);
    struct {
        uint32_t node;
        uint64_t off, len, until;
    } held[HELD];
    size_t nh = 0;
    srand(11);
    uint64_t now = 0;
    for (int it = 0; it < 20000; it++) {
        now += (uint64_t)(rand() % 5);
        char k[16];
        snprintf(k, sizeof(k), "k%d", rand() % KEYS);
        int op = rand() % 10;
        struct ty_store_placement pl;
        uint64_t lease;
        if (op < 4) {
            if (ty_store_meta_put_start(m, k, U * (1 + (uint64_t)(rand() % 4)), 1 + rand() % 2,
                                        NULL, now, &pl) != 0)
                continue;
            for (uint32_t r = 0; r < pl.n; r++)
                for (size_t h = 0; h < nh; h++)
                    if (held[h].until > now && held[h].node == pl.r[r].node &&
                        pl.r[r].offset < held[h].off + held[h].len &&
                        held[h].off < pl.r[r].offset + pl.r[r].length)
                        fail_msg("range of a leased block reused at t=%llu",
                                 (unsigned long long)now);
            if (rand() % 8 != 0)
                ty_store_meta_put_commit(m, k, 1, now);
        } else if (op < 8) {
            if (ty_store_meta_get(m, k, now, &pl, &lease) == 0)
                for (uint32_t r = 0; r < pl.n; r++)
                    if (pl.r[r].tier == TY_STORE_TIER_DRAM) {
                        held[nh % HELD].node = pl.r[r].node;
                        held[nh % HELD].off = pl.r[r].offset;
                        held[nh % HELD].len = pl.r[r].length;
                        held[nh % HELD].until = lease;
                        nh = nh + 1 < HELD ? nh + 1 : HELD;
                    }
        } else if (op == 8) {
            ty_store_meta_remove(m, k, now);
        } else {
            struct ty_store_job j;
            while (ty_store_meta_job_next(m, &j) == 0) /* node B copies to SSD at once */
                ty_store_meta_job_done(m, j.id, rand() % 4 ? 0 : TY_EIO, 4096, now);
            ty_store_meta_node_heartbeat(m, ids[0], now);
            ty_store_meta_node_heartbeat(m, ids[1], now);
            ty_store_meta_tick(m, now);
        }
    }
    ty_store_meta_free(m);
}

/* ---- hot blocks (section 6.2) --------------------------------------------------------------- */

static void test_heat_rate(void **state)
{
    struct ty_store_heat h = {0};
    ty_store_heat_add(&h, 0, 1000);
    assert_float_equal(ty_store_heat_rate(&h, 0, 1000), 0.6931, 1e-3);
    assert_float_equal(ty_store_heat_rate(&h, 1000, 1000), 0.6931 / 2, 1e-3); /* one half-life */
    assert_float_equal(ty_store_heat_rate(&h, 3000, 1000), 0.6931 / 8, 1e-3);
    /* a steady 100 reads/s reads as about 100/s (discrete sum: within 1 %) */
    h = (struct ty_store_heat){0};
    for (uint64_t t = 0; t < 20000; t += 10)
        ty_store_heat_add(&h, t, 1000);
    double r = ty_store_heat_rate(&h, 19990, 1000);
    assert_true(r > 99 && r < 101.5);
    assert_float_equal(ty_store_heat_rate(&h, 20990, 1000), r / 2, 0.01 * r);
    /* a read stamped before the last one counts undecayed, the clock does not go back */
    ty_store_heat_add(&h, 100, 1000);
    assert_int_equal(h.at, 19990);
    assert_float_equal(ty_store_heat_rate(&h, 19990, 1000), r + 0.6931, 1e-3);
}

static ty_store_meta_t *mk_hot(double thr, uint32_t replicas)
{
    struct ty_store_meta_opts o = {.high_watermark = 0.9,
                                   .low_watermark = 0.89,
                                   .lease_ms = 10,
                                   .node_timeout_ms = 100000,
                                   .align = U,
                                   .hot_reads_per_s = thr,
                                   .hot_replicas = replicas,
                                   .hot_half_life_ms = 100};
    ty_store_meta_t *m;
    assert_int_equal(ty_store_meta_new(&m, &o), 0);
    return m;
}

static uint32_t first_node(ty_store_meta_t *m, const char *key, uint64_t now, uint32_t *n)
{
    struct ty_store_placement g;
    uint64_t lease;
    assert_int_equal(ty_store_meta_get(m, key, now, &g, &lease), 0);
    *n = g.n;
    return g.r[0].node;
}

static uint64_t reads(ty_store_meta_t *m, uint32_t id)
{
    struct ty_store_node_info ni;
    assert_int_equal(ty_store_meta_node_info(m, id, &ni), 0);
    return ni.reads;
}

/* Reads past hot_reads_per_s make REPLICATE jobs up to hot_replicas on distinct nodes; gets then
 * name the replicas first in turn; the key cools once its rate is below half. */
static void test_hot_replicates_and_spreads(void **state)
{
    ty_store_meta_t *m = mk_hot(50, 3);
    uint32_t a, b, c, n;
    struct ty_store_meta_stats st;
    assert_int_equal(ty_store_meta_node_add(m, "A", 100 * U, false, 0, &a), 0);
    assert_int_equal(ty_store_meta_node_add(m, "B", 100 * U, false, 0, &b), 0);
    assert_int_equal(ty_store_meta_node_add(m, "C", 100 * U, false, 0, &c), 0);
    put(m, "h", U, 1, "B", 1);
    put(m, "cold", U, 1, "B", 1);
    /* 5 reads in 5 ms: rate 5 ln2 / 0.1 s = 35/s, under 50 */
    for (uint64_t t = 10; t < 15; t++)
        assert_int_equal(first_node(m, "h", t, &n), b);
    ty_store_meta_tick(m, 15);
    struct ty_store_job j[3];
    assert_int_equal(ty_store_meta_job_next(m, &j[0]), TY_EAGAIN);
    ty_store_meta_stats(m, &st);
    assert_int_equal(st.hot_blocks, 0);
    for (uint64_t t = 15; t < 20; t++) /* 10 reads: ~65/s */
        first_node(m, "h", t, &n);
    get_at(m, "cold", 20); /* one read: no heat to speak of */
    ty_store_meta_stats(m, &st);
    assert_int_equal(st.hot_blocks, 1);
    ty_store_meta_tick(m, 20);
    ty_store_meta_tick(m, 21);
    ty_store_meta_tick(m, 22);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ty_store_meta_job_next(m, &j[i]), 0);
        assert_int_equal(j[i].kind, TY_STORE_JOB_REPLICATE);
        assert_int_equal(j[i].src_node, b);
        assert_string_equal(j[i].key, "h");
    }
    assert_int_equal(ty_store_meta_job_next(m, &j[2]), TY_EAGAIN); /* 3 replicas: no more */
    assert_true(j[0].node != b && j[1].node != b && j[0].node != j[1].node);
    assert_int_equal(ty_store_meta_job_done(m, j[0].id, 0, 0, 23), 0);
    assert_int_equal(ty_store_meta_job_done(m, j[1].id, 0, 0, 23), 0);
    ty_store_meta_stats(m, &st);
    assert_int_equal(st.replications_started, 2);
    assert_int_equal(st.replications_done, 2);
    /* readers spread: three gets name three different nodes first */
    uint64_t r0[3] = {reads(m, a), reads(m, b), reads(m, c)};
    bool seen[3] = {false, false, false};
    for (uint64_t t = 24; t < 27; t++) {
        uint32_t f = first_node(m, "h", t, &n);
        assert_int_equal(n, 3);
        seen[f] = true;
    }
    assert_true(seen[a] && seen[b] && seen[c]);
    assert_int_equal(reads(m, a), r0[0] + 1);
    assert_int_equal(reads(m, b), r0[1] + 1);
    assert_int_equal(reads(m, c), r0[2] + 1);
    /* a single replica is always named first */
    assert_int_equal(first_node(m, "cold", 27, &n), b);
    assert_int_equal(first_node(m, "cold", 28, &n), b);
    /* cooling: still hot a half-life later (rate ~ 105/s -> ~50/s > 25), cold after four */
    ty_store_meta_tick(m, 130);
    ty_store_meta_stats(m, &st);
    assert_int_equal(st.hot_blocks, 1);
    ty_store_meta_tick(m, 430);
    ty_store_meta_stats(m, &st);
    assert_int_equal(st.hot_blocks, 0);
    assert_int_equal(ty_store_meta_job_next(m, &j[2]), TY_EAGAIN); /* nothing to re-replicate */
    ty_store_meta_free(m);
}

/* Node B holds 16 blocks of one unit, older than everything else, and the extra replica of h
 * (2 units) that was hot and cooled: over the watermark B loses h's copy first, where LRU alone
 * would take old0; h stays readable on A. */
static void test_cold_extra_evicted_first(void **state)
{
    ty_store_meta_t *m = mk_hot(50, 2);
    uint32_t a, b, n;
    assert_int_equal(ty_store_meta_node_add(m, "A", 20 * U, false, 0, &a), 0);
    assert_int_equal(ty_store_meta_node_add(m, "B", 20 * U, false, 0, &b), 0);
    for (int i = 0; i < 16; i++) {
        char k[8];
        snprintf(k, sizeof(k), "old%d", i);
        put(m, k, U, 1, "B", 1);
    }
    put(m, "h", 2 * U, 1, "A", 2);
    for (uint64_t t = 10; t < 30; t++)
        first_node(m, "h", t, &n);
    ty_store_meta_tick(m, 30);
    struct ty_store_job j;
    assert_int_equal(ty_store_meta_job_next(m, &j), 0);
    assert_int_equal(j.node, b);
    assert_int_equal(ty_store_meta_job_done(m, j.id, 0, 0, 31), 0);
    assert_int_equal(used(m, b), 18 * U);
    /* while hot (and leased) nothing of h is a candidate; put keeps B at the watermark */
    ty_store_meta_tick(m, 700); /* cooled, lease over */
    struct ty_store_meta_stats st;
    ty_store_meta_stats(m, &st);
    assert_int_equal(st.hot_blocks, 0);
    struct ty_store_event ev[64];
    ty_store_meta_events_take(m, ev, 64);
    put(m, "new0", U, 1, "B", 701); /* 19 units > 0.9 x 20 */
    ty_store_meta_tick(m, 702);
    size_t ne = ty_store_meta_events_take(m, ev, 64);
    size_t removed = 0;
    for (size_t i = 0; i < ne; i++) {
        if (ev[i].kind != TY_STORE_EVENT_REMOVED)
            continue;
        removed++;
        assert_string_equal(ev[i].key, "h");
        assert_int_equal(ev[i].node, b);
    }
    assert_int_equal(removed, 1);
    assert_true(ty_store_meta_exists(m, "old0"));
    assert_true(ty_store_meta_exists(m, "h")); /* A's copy */
    ty_store_meta_stats(m, &st);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.cold_evictions, 1);
    assert_int_equal(used(m, b), 17 * U);
    /* h's last copy on A is no extra: on A, LRU decides as usual */
    ty_store_meta_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_two_phase_and_events),
        cmocka_unit_test(test_put_expiry),
        cmocka_unit_test(test_lease_blocks_free),
        cmocka_unit_test(test_evict_lru),
        cmocka_unit_test(test_evict_lfu),
        cmocka_unit_test(test_evict_length_aware),
        cmocka_unit_test(test_soft_pin),
        cmocka_unit_test(test_dead_node),
        cmocka_unit_test(test_replica_target),
        cmocka_unit_test(test_ssd_offload_and_load),
        cmocka_unit_test(test_restart_and_announce),
        cmocka_unit_test(test_random_leases),
        cmocka_unit_test(test_heat_rate),
        cmocka_unit_test(test_hot_replicates_and_spreads),
        cmocka_unit_test(test_cold_extra_evicted_first),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
