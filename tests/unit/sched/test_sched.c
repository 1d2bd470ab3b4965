/* Scheduler: prefix index, every policy's decision and the admission rules on hand-built
 * cluster states. Expected values are computed by hand in the comments from the toy cost
 * model below, not taken from the code. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "tycho/errors.h"
#include "tycho/sched.h"

static const uint64_t H[10] = {11, 22, 33, 44, 55, 66, 77, 88, 99, 1010};

/* Toy costs: prefill 1 us per uncached token, KV moves 0.1 us per token, 100-token blocks;
 * a decode step costs 1000 us + 100 us per sequence. */
static struct ty_sched_opts toy_opts(enum ty_sched_policy pol, enum ty_sched_admission adm)
{
    struct ty_sched_opts o;
    ty_sched_opts_default(&o);
    memset(&o.cost, 0, sizeof(o.cost));
    o.cost.prefill[1] = 1.0;
    o.cost.decode[0] = 1000;
    o.cost.decode[1] = 100;
    o.cost.kv_bytes_per_token = 1;
    o.cost.net_bytes_per_us = 10;
    o.cost.block_tokens = 100;
    o.policy = pol;
    o.admission = adm;
    o.n_classes = 2;
    o.decode_duration_us = 1000000000;
    return o;
}

/* Nodes 0, 1, 2 prefill, 10 decode. Node 0 holds blocks 0-7 and has 5000 us queued; node 1
 * holds blocks 0-1 and is idle; node 2 holds nothing and has 100 us queued. */
static ty_sched_t *cluster(const struct ty_sched_opts *o)
{
    ty_sched_t *s;
    assert_int_equal(ty_sched_new(&s, o), 0);
    struct ty_sched_node_desc p = {.role = TY_SCHED_ROLE_PREFILL};
    struct ty_sched_node_desc d = {.role = TY_SCHED_ROLE_DECODE};
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(ty_sched_node_add(s, i, &p), 0);
    assert_int_equal(ty_sched_node_add(s, 10, &d), 0);
    assert_int_equal(ty_sched_block_stored(s, 0, H, 8), 0);
    assert_int_equal(ty_sched_block_stored(s, 1, H, 2), 0);
    assert_int_equal(ty_sched_node_set_prefill_queue(s, 0, 5000, 0), 0);
    assert_int_equal(ty_sched_node_set_prefill_queue(s, 2, 100, 0), 0);
    return s;
}

static struct ty_sched_request req(uint64_t id, uint32_t priority)
{
    return (struct ty_sched_request){.id = id, .block_hashes = H, .n_blocks = 10,
                                     .prompt_tokens = 1000, .output_tokens = 10,
                                     .priority = priority};
}

static void test_index_match(void **st)
{
    ty_sched_index_t *ix;
    assert_int_equal(ty_sched_index_new(&ix), 0);
    assert_int_equal(ty_sched_index_add(ix, 3, H, 5), 0);
    assert_int_equal(ty_sched_index_add(ix, 200, H, 2), 0);
    uint64_t gap[3] = {H[2], H[3], H[4]};
    assert_int_equal(ty_sched_index_add(ix, 7, gap, 3), 0); /* no block 0: prefix 0 */
    uint32_t pre[TY_SCHED_MAX_NODES];
    memset(pre, 0xff, sizeof(pre));
    ty_sched_index_match(ix, H, 10, pre, TY_SCHED_MAX_NODES);
    assert_int_equal(pre[3], 5);
    assert_int_equal(pre[200], 2);
    assert_int_equal(pre[7], 0);
    assert_int_equal(pre[0], 0);
    /* node 3's eviction of block 1 leaves node 200's copy; dropping node 200 leaves node 3's */
    assert_int_equal(ty_sched_index_del(ix, 3, &H[1], 1), 0);
    ty_sched_index_match(ix, H, 10, pre, TY_SCHED_MAX_NODES);
    assert_int_equal(pre[3], 1);
    assert_int_equal(pre[200], 2);
    ty_sched_index_drop_node(ix, 200);
    ty_sched_index_match(ix, H, 10, pre, TY_SCHED_MAX_NODES);
    assert_int_equal(pre[3], 1);
    assert_int_equal(pre[200], 0);
    assert_int_equal(ty_sched_index_size(ix), 4); /* H0 (node 3), H2-H4 */
    assert_int_equal(ty_sched_index_add(ix, TY_SCHED_MAX_NODES, H, 1), TY_EINVAL);
    ty_sched_index_free(ix);
}

static void test_index_many_keys(void **st)
{
    /* the map must survive growth and backward-shift deletes: 20k keys in, odd ones out */
    ty_sched_index_t *ix;
    assert_int_equal(ty_sched_index_new(&ix), 0);
    for (uint64_t k = 0; k < 20000; k++)
        ty_sched_index_add(ix, (uint32_t)(k % 64), &k, 1);
    for (uint64_t k = 1; k < 20000; k += 2)
        ty_sched_index_del(ix, (uint32_t)(k % 64), &k, 1);
    assert_int_equal(ty_sched_index_size(ix), 10000);
    uint32_t pre[TY_SCHED_MAX_NODES];
    for (uint64_t k = 0; k < 20000; k++) {
        ty_sched_index_match(ix, &k, 1, pre, TY_SCHED_MAX_NODES);
        assert_int_equal(pre[k % 64], (k % 2) ? 0 : 1);
    }
    ty_sched_index_free(ix);
}

static void test_load_balance(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_LOAD_BALANCE, TY_SCHED_ADMIT_BASELINE);
    ty_sched_t *s = cluster(&o);
    struct ty_sched_request r = req(1, 0);
    struct ty_sched_decision d;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    /* shortest queue: node 1 (0 us); its local 2 blocks: prefill 800 us */
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
    assert_int_equal(d.prefill_node, 1);
    assert_int_equal(d.used_prefix_blocks, 2);
    assert_true(fabs(d.ttft_us - 800) < 1e-9);
    assert_int_equal(d.decode_node, 10);
    /* node 1 now has 800 us queued: the next goes to node 2 (100 us) */
    r.id = 2;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.prefill_node, 2);
    ty_sched_free(s);
}

static void test_cache_aware(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_CACHE_AWARE, TY_SCHED_ADMIT_BASELINE);
    ty_sched_t *s = cluster(&o);
    struct ty_sched_request r = req(1, 0);
    struct ty_sched_decision d;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    /* longest local prefix: node 0 (8 blocks) despite its queue: 5000 + 200 us */
    assert_int_equal(d.prefill_node, 0);
    assert_int_equal(d.local_prefix_blocks, 8);
    assert_int_equal(d.prefix_source, TY_SCHED_NODE_NONE);
    assert_true(fabs(d.ttft_us - 5200) < 1e-9);
    /* with every block gone all prefixes are equal (0): the queue breaks the tie */
    assert_int_equal(ty_sched_block_removed(s, 0, H, 8), 0);
    assert_int_equal(ty_sched_block_removed(s, 1, H, 2), 0);
    r.id = 2;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.prefill_node, 1); /* idle; node 2 has 100 us, node 0 5200 us */
    ty_sched_free(s);
}

static void test_kvcache_centric(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_KVCACHE_CENTRIC, TY_SCHED_ADMIT_BASELINE);
    ty_sched_t *s = cluster(&o);
    struct ty_sched_request r = req(1, 0);
    struct ty_sched_decision d;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    /* node 0: 5000 + 200 = 5200; node 1: fetch 600 tokens from node 0 (60 us) + 200 = 260;
     * node 2: 100 + fetch 800 tokens (80 us) + 200 = 380. Node 1 wins, prefix from node 0. */
    assert_int_equal(d.prefill_node, 1);
    assert_int_equal(d.prefix_source, 0);
    assert_int_equal(d.local_prefix_blocks, 2);
    assert_int_equal(d.remote_prefix_blocks, 8);
    assert_int_equal(d.used_prefix_blocks, 8);
    assert_true(fabs(d.transfer_us - 60) < 1e-9);
    assert_true(fabs(d.ttft_us - 260) < 1e-9);
    ty_sched_free(s);
    /* threshold 5: node 1's 2 local blocks are kept (8 <= 2 * 5): 0 + 800; node 2 (nothing
     * local) still fetches: 380. */
    o.balancing_threshold = 5.0;
    s = cluster(&o);
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.prefill_node, 2);
    assert_int_equal(d.prefix_source, 0);
    assert_true(fabs(d.ttft_us - 380) < 1e-9);
    ty_sched_free(s);
}

/* The live cluster: prefill nodes cannot fetch prefixes from each other, the cost model is
 * refitted while serving, and a node's cached blocks can be forgotten wholesale. */
static void test_kvcache_centric_local_only(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_KVCACHE_CENTRIC, TY_SCHED_ADMIT_BASELINE);
    o.local_prefix_only = true;
    ty_sched_t *s = cluster(&o);
    struct ty_sched_request r = req(1, 0);
    struct ty_sched_decision d;
    /* node 0: 5000 + 200 = 5200; node 1: 0 + 800; node 2: 100 + 1000 = 1100 */
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.prefill_node, 1);
    assert_int_equal(d.prefix_source, TY_SCHED_NODE_NONE);
    assert_int_equal(d.used_prefix_blocks, 2);
    assert_true(fabs(d.transfer_us) < 1e-9 && fabs(d.ttft_us - 800) < 1e-9);
    /* 2 us per token from now on: node 1 1600 + its own 800 queued from the first pick =
     * 2400; node 2: 100 + 2000 = 2100; node 0: 5000 + 400 */
    struct ty_sched_cost c = o.cost;
    c.prefill[1] = 2.0;
    assert_int_equal(ty_sched_set_cost(s, &c), 0);
    r.id = 2;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.prefill_node, 2);
    assert_true(fabs(d.ttft_us - 2100) < 1e-9);
    /* node 0 forgets its blocks: 5000 + 2000 */
    assert_int_equal(ty_sched_blocks_reset(s, 0), 0);
    uint32_t prefix[3];
    ty_sched_index_match(ty_sched_index(s), H, 10, prefix, 3);
    assert_int_equal(prefix[0], 0);
    assert_int_equal(prefix[1], 2);
    c.prefill[1] = NAN;
    assert_int_equal(ty_sched_set_cost(s, &c), TY_EINVAL);
    assert_int_equal(ty_sched_blocks_reset(s, 7), TY_ENOTFOUND);
    ty_sched_free(s);
}

/* Six requests at once that share an 8-block prefix only node 0 of three idle prefill nodes
 * holds (each with 2 blocks of its own), each pick credited to its node as the Conductor
 * does. Returns how many went to each node. */
static void hot_prefix_burst(ty_sched_t *s, uint32_t per_node[3])
{
    memset(per_node, 0, 3 * sizeof(uint32_t));
    for (uint64_t i = 0; i < 6; i++) {
        uint64_t h[10];
        memcpy(h, H, 8 * sizeof(uint64_t));
        h[8] = 5000 + 2 * i;
        h[9] = 5001 + 2 * i;
        struct ty_sched_request r = {.id = 100 + i, .block_hashes = h, .n_blocks = 10,
                                     .prompt_tokens = 1000, .output_tokens = 10};
        struct ty_sched_decision d;
        assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
        assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
        assert_true(d.prefill_node < 3);
        per_node[d.prefill_node]++;
        assert_int_equal(ty_sched_block_stored(s, d.prefill_node, h, 10), 0);
    }
}

/* Three idle prefill nodes and a decode node; node 0 holds blocks 0-7. The scheduler is made
 * with local_prefix_only = !local and then set to `local` the way a SIGHUP reload does
 * (ty_sched_set_policy), so the setting is shown to take both ways. */
static ty_sched_t *hot_cluster(struct ty_sched_opts *o, bool local)
{
    ty_sched_t *s;
    o->local_prefix_only = !local;
    assert_int_equal(ty_sched_new(&s, o), 0);
    o->local_prefix_only = local;
    assert_int_equal(ty_sched_set_policy(s, o), 0);
    assert_true(ty_sched_opts_get(s)->local_prefix_only == local);
    struct ty_sched_node_desc p = {.role = TY_SCHED_ROLE_PREFILL};
    struct ty_sched_node_desc d = {.role = TY_SCHED_ROLE_DECODE};
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(ty_sched_node_add(s, i, &p), 0);
    assert_int_equal(ty_sched_node_add(s, 10, &d), 0);
    assert_int_equal(ty_sched_block_stored(s, 0, H, 8), 0);
    return s;
}

/* Hot-prefix replication (paper §6.2, cache load balancing): with peer prefixes a burst on one
 * hot prefix spreads over the nodes, each new holder reading the prefix from one that has it
 * (then serving the next ones from its own copy); with local_prefix_only the holder queues
 * them until recomputing elsewhere is as fast. */
static void test_hot_prefix_spreads(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_KVCACHE_CENTRIC, TY_SCHED_ADMIT_BASELINE);
    uint32_t n[3];
    /* 200 us of own work each, 80 us to fetch the prefix: node 0 answers at 200, 400, 600; a
     * peer at 80 + 200 = 280 first, then 200 more per request on its own copy: 0, 1, 2, 0,
     * 1, 2 (ties: the shorter queue, then the lower id) */
    ty_sched_t *s = hot_cluster(&o, false);
    hot_prefix_burst(s, n);
    assert_int_equal(n[0], 2);
    assert_int_equal(n[1], 2);
    assert_int_equal(n[2], 2);
    ty_sched_free(s);
    /* local only: node 0 answers at 200, 400, 600, 800; the fifth's 1000 ties an idle node's
     * recompute (1000 tokens: 1000 us) and the shorter queue wins; the sixth: node 0 1200,
     * node 1 (now holding the prefix) 1200, node 2 1000 */
    s = hot_cluster(&o, true);
    hot_prefix_burst(s, n);
    assert_int_equal(n[0], 4);
    assert_int_equal(n[1], 1);
    assert_int_equal(n[2], 1);
    ty_sched_free(s);
}

/* The live cluster with a KV pool: prefixes are read from the pool (index node 255, no
 * prefill node) only, never from another prefill node. */
static void test_kvcache_centric_pool_source(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_KVCACHE_CENTRIC, TY_SCHED_ADMIT_BASELINE);
    o.remote_from_node = true;
    o.remote_node = 255;
    ty_sched_t *s = cluster(&o);
    struct ty_sched_request r = req(1, 0);
    struct ty_sched_decision d;
    /* the pool holds nothing: node 0's 8 blocks cannot be fetched. node 0: 5000 + 200;
     * node 1: 0 + 800 (local 2 blocks); node 2: 100 + 1000 */
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.prefill_node, 1);
    assert_int_equal(d.prefix_source, TY_SCHED_NODE_NONE);
    assert_int_equal(d.used_prefix_blocks, 2);
    assert_int_equal(d.remote_prefix_blocks, 0);
    ty_sched_free(s);
    /* the pool holds blocks 0-5: node 1 fetches 400 tokens (40 us) + 400 = 440; node 2:
     * 100 + 60 + 400 = 560; node 0 (8 local) 5000 + 200 */
    s = cluster(&o);
    assert_int_equal(ty_sched_block_stored(s, 255, H, 6), 0);
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.prefill_node, 1);
    assert_int_equal(d.prefix_source, 255);
    assert_int_equal(d.local_prefix_blocks, 2);
    assert_int_equal(d.used_prefix_blocks, 6);
    assert_true(fabs(d.transfer_us - 40) < 1e-9 && fabs(d.ttft_us - 440) < 1e-9);
    /* the pool's blocks can be forgotten although 255 is no node; other absent ids cannot */
    assert_int_equal(ty_sched_blocks_reset(s, 255), 0);
    assert_int_equal(ty_sched_blocks_reset(s, 254), TY_ENOTFOUND);
    r.id = 2;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.remote_prefix_blocks, 0);
    ty_sched_free(s);
    o.remote_node = TY_SCHED_MAX_NODES;
    assert_int_equal(ty_sched_new(&s, &o), TY_EINVAL);
}

/* The live Conductor (has_remote_node): the pool (index node 255) and the prefill nodes'
 * caches are all sources of a remote prefix; the longest one wins, a peer before the pool
 * on a tie; the pool's blocks can be reset though 255 is no node. */
static void test_kvcache_centric_peer_or_pool(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_KVCACHE_CENTRIC, TY_SCHED_ADMIT_BASELINE);
    o.has_remote_node = true;
    o.remote_node = 255;
    ty_sched_t *s = cluster(&o);
    struct ty_sched_request r = req(1, 0);
    struct ty_sched_decision d;
    /* the pool holds blocks 0-5, node 0 blocks 0-7: node 1 fetches 6 blocks from node 0 */
    assert_int_equal(ty_sched_block_stored(s, 255, H, 6), 0);
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.prefill_node, 1);
    assert_int_equal(d.prefix_source, 0);
    assert_int_equal(d.local_prefix_blocks, 2);
    assert_int_equal(d.used_prefix_blocks, 8);
    ty_sched_free(s);
    /* the pool holds all 10 blocks: it is the longest source */
    s = cluster(&o);
    assert_int_equal(ty_sched_block_stored(s, 255, H, 10), 0);
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.prefix_source, 255);
    assert_int_equal(d.used_prefix_blocks, 10);
    assert_int_equal(ty_sched_blocks_reset(s, 255), 0);
    assert_int_equal(ty_sched_blocks_reset(s, 254), TY_ENOTFOUND);
    /* a node out of placement is no source: node 0 out, the pool empty, nothing to fetch */
    assert_int_equal(ty_sched_node_set_out(s, 0, true), 0);
    r.id = 2;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.prefix_source, TY_SCHED_NODE_NONE);
    ty_sched_free(s);
    o.remote_node = TY_SCHED_MAX_NODES;
    assert_int_equal(ty_sched_new(&s, &o), TY_EINVAL);
}

static void test_round_robin_and_random(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_ROUND_ROBIN, TY_SCHED_ADMIT_BASELINE);
    ty_sched_t *s = cluster(&o);
    struct ty_sched_decision d;
    uint32_t want[4] = {0, 1, 2, 0};
    for (uint64_t i = 0; i < 4; i++) {
        struct ty_sched_request r = req(i, 0);
        assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
        assert_int_equal(d.prefill_node, want[i]);
    }
    ty_sched_free(s);
    o.policy = TY_SCHED_POLICY_RANDOM;
    unsigned seen[3] = {0};
    uint32_t first[20];
    for (int rep = 0; rep < 2; rep++) {
        s = cluster(&o);
        for (uint64_t i = 0; i < 300; i++) {
            struct ty_sched_request r = req(i, 0);
            assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
            assert_true(d.prefill_node < 3);
            seen[d.prefill_node]++;
            if (i < 20 && rep == 0)
                first[i] = d.prefill_node;
            if (i < 20 && rep == 1)
                assert_int_equal(first[i], d.prefill_node); /* same seed, same choices */
        }
        ty_sched_free(s);
    }
    for (int i = 0; i < 3; i++)
        assert_true(seen[i] > 100); /* 600 draws over 3 nodes */
}

static void test_reject_ttft_and_no_node(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_KVCACHE_CENTRIC, TY_SCHED_ADMIT_EARLY);
    o.slo[1].ttft_us = 250; /* best plan is 260 us */
    ty_sched_t *s = cluster(&o);
    struct ty_sched_request r = req(1, 1);
    struct ty_sched_decision d;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_TTFT);
    assert_int_equal(ty_sched_in_flight(s), 0);
    r.priority = 0; /* class 0 has no limit */
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), TY_EEXIST);
    r.id = 9;
    r.priority = 2;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), TY_EINVAL);
    r.priority = 0;
    r.prompt_tokens = 0;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), TY_EINVAL);
    r.prompt_tokens = 1000;
    assert_int_equal(ty_sched_node_remove(s, 10), 0);
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NO_NODE);
    ty_sched_free(s);
}

/* The live Conductor's options: an idle prefill node admits a request predicted over the
 * TTFT SLO (only a queue refuses), a request the caller already accepted is never refused,
 * the decode-stage verdict only reports, and an aborted request leaves the decode-duration
 * estimate alone. */
static void test_live_admission_options(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_KVCACHE_CENTRIC, TY_SCHED_ADMIT_BASELINE);
    o.slo[1].ttft_us = 250; /* best plan: node 1, idle, 260 us */
    o.slo[1].tbt_us = 2000; /* at most 10 sequences per step */
    o.admit_when_idle = true;
    o.decode_check_advisory = true;
    ty_sched_t *s = cluster(&o);
    struct ty_sched_request r = req(1, 1);
    struct ty_sched_decision d;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
    assert_int_equal(d.prefill_node, 1);
    assert_true(d.ttft_us > 250);
    /* now every prefill node has a queue (node 1: 260, node 2: 100 + 380): refused */
    r.id = 2;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_TTFT);
    r.admitted = true;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
    /* the decode node is over its TBT SLO when request 1 lands: reported, still in flight */
    assert_int_equal(ty_sched_node_set_decode_load(s, 10, 50, 0), 0);
    enum ty_sched_reject rej;
    assert_int_equal(ty_sched_request_at_decode(s, 1, 1000, &rej), 0);
    assert_int_equal(rej, TY_SCHED_REJECT_TBT);
    assert_int_equal(ty_sched_in_flight(s), 2);
    /* aborted after decoding 5 s: the estimate (1000 s in toy_opts) stays */
    double dur = ty_sched_decode_duration_us(s);
    assert_int_equal(ty_sched_request_abort(s, 1), 0);
    assert_true(ty_sched_decode_duration_us(s) == dur);
    assert_int_equal(ty_sched_request_abort(s, 1), TY_ENOTFOUND);
    assert_int_equal(ty_sched_request_at_decode(s, 2, 2000, &rej), 0);
    assert_int_equal(ty_sched_request_done(s, 2, 5002000), 0); /* finished: 5 s moves it */
    assert_true(ty_sched_decode_duration_us(s) < dur);
    assert_int_equal(ty_sched_in_flight(s), 0);
    ty_sched_free(s);
}

/* One prefill node (0) and one decode node (1) with the given KV capacity, toy costs. */
static ty_sched_t *pair(const struct ty_sched_opts *o, uint64_t kv_cap)
{
    ty_sched_t *s;
    assert_int_equal(ty_sched_new(&s, o), 0);
    struct ty_sched_node_desc p = {.role = TY_SCHED_ROLE_PREFILL};
    struct ty_sched_node_desc dn = {.role = TY_SCHED_ROLE_DECODE, .kv_capacity_tokens = kv_cap};
    assert_int_equal(ty_sched_node_add(s, 0, &p), 0);
    assert_int_equal(ty_sched_node_add(s, 1, &dn), 0);
    return s;
}

/* Idle capacity always admits: with a model that predicts one sequence alone over the TBT SLO
 * (1000 + 100 us > 1050 us), the first request on an idle cluster is admitted (and says it
 * was over); the next, behind it, is refused and told no retry can help (alone it is over
 * too); a probe of that model goes ahead; more KV than the decode node has is refused even
 * alone, probe or not. Without admit_when_idle the first is refused as before. TTFT: a
 * prompt whose prefill alone is over the SLO never fits, one refused for the queue may. */
static void test_idle_capacity_admits(void **st)
{
    (void)st;
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_KVCACHE_CENTRIC, TY_SCHED_ADMIT_PREDICTED);
    o.slo[0].tbt_us = 1050;
    o.admit_when_idle = true;
    ty_sched_t *s = pair(&o, 5000);
    struct ty_sched_request r = req(1, 0);
    struct ty_sched_decision d;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
    assert_true(d.over_tbt && !d.over_ttft);
    assert_true(fabs(d.tbt_us - 1100) < 1e-9); /* one step of it alone */
    r.id = 2; /* the prefill node has 1000 us queued now, the decode node a request */
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_TBT);
    assert_true(d.never_fits);
    r.probe = true;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
    assert_true(d.over_tbt);
    assert_int_equal(ty_sched_in_flight(s), 2);
    ty_sched_free(s);

    /* 1000 + 10000 tokens of KV on a 5000-token node: refused alone, probe or not */
    s = pair(&o, 5000);
    r = req(3, 0);
    r.output_tokens = 10000;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_DECODE_FULL);
    assert_true(d.never_fits);
    r.probe = true;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_DECODE_FULL);
    ty_sched_free(s);

    o.admit_when_idle = false; /* the option is what admits */
    s = pair(&o, 5000);
    r = req(4, 0);
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_TBT);
    ty_sched_free(s);

    /* TTFT: prefill of 1000 uncached tokens is 1000 us alone */
    o.admit_when_idle = true;
    o.slo[0].tbt_us = 0;
    o.slo[0].ttft_us = 1500;
    s = pair(&o, 0);
    r = req(5, 0);
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0); /* idle: admitted */
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
    assert_false(d.over_ttft || d.over_tbt);
    r.id = 6; /* 1000 us queued + 1000 us: over 1500, but it fits once the queue is gone */
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_TTFT);
    assert_false(d.never_fits);
    ty_sched_free(s);
    o.slo[0].ttft_us = 500; /* over it even alone */
    s = pair(&o, 0);
    r = req(7, 0);
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
    assert_true(d.over_ttft);
    r.id = 8;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_TTFT);
    assert_true(d.never_fits);
    ty_sched_free(s);
}

/* TBT SLO 2000 us: a step of B sequences costs 1000 + 100 B, so at most 10 sequences. */
static void test_early_rejection(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_LOAD_BALANCE, TY_SCHED_ADMIT_EARLY);
    o.slo[1].tbt_us = 2000;
    ty_sched_t *s = cluster(&o);
    struct ty_sched_decision d;
    struct ty_sched_request r = req(1, 1);
    assert_int_equal(ty_sched_node_set_decode_load(s, 10, 9, 0), 0);
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE); /* 10 sequences: 2000 us, not above */
    assert_true(fabs(d.tbt_us - 2000) < 1e-9);
    assert_int_equal(ty_sched_node_set_decode_load(s, 10, 10, 0), 0);
    r.id = 2;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_TBT); /* 11 sequences: 2100 us */
    ty_sched_free(s);
}

/* Ten requests of class 0 (no limits) are in prefill on the only prefill node; none has
 * reached decode. Early rejection sees an empty decode node and admits a class-1 probe
 * (TBT SLO 1500 us: 5 sequences); the prediction sees all ten landing before the probe (they
 * are ahead of it in the one queue) and refuses it: 11 sequences, 2100 us. */
static void test_prediction_based_rejection(void **st)
{
    enum ty_sched_admission modes[2] = {TY_SCHED_ADMIT_EARLY, TY_SCHED_ADMIT_PREDICTED};
    enum ty_sched_reject want[2] = {TY_SCHED_REJECT_NONE, TY_SCHED_REJECT_TBT};
    for (int m = 0; m < 2; m++) {
        struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_LOAD_BALANCE, modes[m]);
        o.slo[1].tbt_us = 1500;
        ty_sched_t *s;
        assert_int_equal(ty_sched_new(&s, &o), 0);
        struct ty_sched_node_desc p = {.role = TY_SCHED_ROLE_PREFILL};
        struct ty_sched_node_desc dn = {.role = TY_SCHED_ROLE_DECODE};
        assert_int_equal(ty_sched_node_add(s, 0, &p), 0);
        assert_int_equal(ty_sched_node_add(s, 1, &dn), 0);
        struct ty_sched_decision d;
        for (uint64_t i = 0; i < 10; i++) {
            struct ty_sched_request r = req(i, 0);
            assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
            assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
        }
        struct ty_sched_request probe = req(100, 1);
        assert_int_equal(ty_sched_pick(s, &probe, 0, &d), 0);
        assert_int_equal(d.reject, want[m]);
        if (m == 1)
            assert_true(fabs(d.tbt_us - 2100) < 1e-9);
        ty_sched_free(s);
    }
}

/* Per-stage baseline: admitted at arrival whatever the decode load, refused when the KV lands
 * on a decode node that is over the TBT SLO; max_batch is a hard limit in every mode. */
static void test_decode_stage_rejection(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_LOAD_BALANCE, TY_SCHED_ADMIT_BASELINE);
    o.slo[1].tbt_us = 2000;
    ty_sched_t *s = cluster(&o);
    struct ty_sched_decision d;
    struct ty_sched_request r = req(1, 1);
    assert_int_equal(ty_sched_node_set_decode_load(s, 10, 50, 0), 0);
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
    enum ty_sched_reject rej;
    assert_int_equal(ty_sched_request_at_decode(s, 1, 900, &rej), 0);
    assert_int_equal(rej, TY_SCHED_REJECT_TBT);
    assert_int_equal(ty_sched_in_flight(s), 0);
    assert_int_equal(ty_sched_request_at_decode(s, 1, 900, &rej), TY_ENOTFOUND);
    /* a light node takes it; done releases it */
    assert_int_equal(ty_sched_node_set_decode_load(s, 10, 3, 0), 0);
    r.id = 2;
    assert_int_equal(ty_sched_pick(s, &r, 1000, &d), 0);
    assert_int_equal(ty_sched_request_at_decode(s, 2, 2000, &rej), 0);
    assert_int_equal(rej, TY_SCHED_REJECT_NONE);
    assert_int_equal(ty_sched_in_flight(s), 1);
    assert_int_equal(ty_sched_request_done(s, 2, 9000), 0);
    assert_int_equal(ty_sched_in_flight(s), 0);
    ty_sched_free(s);

    struct ty_sched_node_desc full = {.role = TY_SCHED_ROLE_DECODE, .max_batch = 4};
    o.admission = TY_SCHED_ADMIT_PREDICTED;
    s = cluster(&o);
    assert_int_equal(ty_sched_node_add(s, 11, &full), 0);
    assert_int_equal(ty_sched_node_remove(s, 10), 0);
    assert_int_equal(ty_sched_node_set_decode_load(s, 11, 4, 0), 0);
    r = req(3, 0);
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE); /* predicted: the batch may drain */
    assert_int_equal(ty_sched_request_at_decode(s, 3, 500, &rej), 0);
    assert_int_equal(rej, TY_SCHED_REJECT_DECODE_FULL); /* it did not */
    ty_sched_free(s);
}

/* req() without prefix blocks: the pair() tests need no prefix index. */
static struct ty_sched_request bare(uint64_t id, uint32_t priority)
{
    struct ty_sched_request r = req(id, priority);
    r.n_blocks = 0;
    return r;
}

/* r admitted at t_pick, its KV landed at t_land; then decode node 1 reports batch / ctx. */
static void decoding(ty_sched_t *s, struct ty_sched_request r, uint64_t t_pick, uint64_t t_land,
                     uint32_t batch, uint64_t ctx)
{
    struct ty_sched_decision d;
    enum ty_sched_reject rej;
    assert_int_equal(ty_sched_pick(s, &r, t_pick, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
    assert_int_equal(ty_sched_request_at_decode(s, r.id, t_land, &rej), 0);
    assert_int_equal(rej, TY_SCHED_REJECT_NONE);
    assert_int_equal(ty_sched_node_set_decode_load(s, 1, batch, ctx), 0);
}

/* Decode KV memory is part of the decode load in both arrival-time modes, each on its own
 * picture of the node. Node KV 2500 tokens; every request holds 1000 + 10 = 1010. Two class-0
 * requests are in prefill (0-1000 us and 1000-2000 us); the probe at t = 0 would land at
 * 2000 + 1000 = 3000 us. Early rejection sees the reported (empty) node: 1010 <= 2500, admit;
 * once the node reports 1600 tokens: 2610 > 2500, full. The prediction sees both queued
 * requests decoding at 3000 us: 3 x 1010 = 3030 > 2500, full. */
static void test_decode_kv_in_admission(void **st)
{
    enum ty_sched_admission modes[2] = {TY_SCHED_ADMIT_EARLY, TY_SCHED_ADMIT_PREDICTED};
    enum ty_sched_reject want[2] = {TY_SCHED_REJECT_NONE, TY_SCHED_REJECT_DECODE_FULL};
    for (int m = 0; m < 2; m++) {
        struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_LOAD_BALANCE, modes[m]);
        ty_sched_t *s = pair(&o, 2500);
        struct ty_sched_decision d;
        for (uint64_t i = 0; i < 2; i++) {
            struct ty_sched_request r = bare(i, 0);
            assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
            assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
        }
        struct ty_sched_request probe = bare(100, 1);
        assert_int_equal(ty_sched_pick(s, &probe, 0, &d), 0);
        assert_true(fabs(d.ttft_us - 3000) < 1e-9);
        assert_int_equal(d.reject, want[m]);
        if (m == 0) {
            assert_int_equal(ty_sched_node_set_decode_load(s, 1, 2, 1600), 0);
            probe.id = 101;
            assert_int_equal(ty_sched_pick(s, &probe, 0, &d), 0);
            assert_int_equal(d.reject, TY_SCHED_REJECT_DECODE_FULL);
        }
        ty_sched_free(s);
    }
}

/* The prediction uses one uniform decode duration D = 1000 us for every request: one that
 * started decoding at 100 us is predicted gone by 1100 us, even if it still runs at 5000 us.
 * Class 1 TBT SLO 1150 us allows one sequence (1100 us), not two (1200 us). The probe arrives
 * at 5000 us (idle prefill: TTFT 1000 us, lands at 6000 us): predicted batch 0 + 1, admitted;
 * early rejection sees the long request still running (reported batch 1): two, refused. */
static void test_prediction_uniform_duration(void **st)
{
    enum ty_sched_admission modes[2] = {TY_SCHED_ADMIT_PREDICTED, TY_SCHED_ADMIT_EARLY};
    enum ty_sched_reject want[2] = {TY_SCHED_REJECT_NONE, TY_SCHED_REJECT_TBT};
    for (int m = 0; m < 2; m++) {
        struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_LOAD_BALANCE, modes[m]);
        o.decode_duration_us = 1000;
        o.slo[1].tbt_us = 1150;
        ty_sched_t *s = pair(&o, 0);
        struct ty_sched_decision d;
        decoding(s, bare(1, 0), 0, 100, 1, 0);
        struct ty_sched_request probe = bare(2, 1);
        assert_int_equal(ty_sched_pick(s, &probe, 5000, &d), 0);
        assert_int_equal(d.reject, want[m]);
        assert_true(fabs(d.tbt_us - (m == 0 ? 1100 : 1200)) < 1e-9);
        ty_sched_free(s);
    }
}

/* What the prediction counts of a request already decoding is its KV at the moment the probe
 * lands, not its peak: the decode stage's check sees the others' current KV. D = 1000 us.
 * A (prompt 1000, output 1000) prefills 0-1000 us and lands at 1500 us, so it decodes over
 * [1500, 2500). The probe (1000 + 10) arrives at 1000 us on the now idle prefill node: TTFT
 * 1000 us, lands at 2000 us, when A is half done: 1000 + 500 = 1500 tokens. KV 2600:
 * 1500 + 1010 = 2510 fits (A's peak, 2000 + 1010 = 3010, would not). Early rejection judges
 * the node as reported (1 sequence, 1200 tokens); the baseline judges nothing at arrival. */
static void test_prediction_kv_at_landing(void **st)
{
    enum ty_sched_admission modes[3] = {TY_SCHED_ADMIT_PREDICTED, TY_SCHED_ADMIT_EARLY,
                                        TY_SCHED_ADMIT_BASELINE};
    double want_ctx[2] = {1500, 1200};
    for (int m = 0; m < 3; m++) {
        struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_LOAD_BALANCE, modes[m]);
        o.decode_duration_us = 1000;
        ty_sched_t *s = pair(&o, 2600);
        struct ty_sched_decision d;
        struct ty_sched_request a = bare(1, 0);
        a.output_tokens = 1000;
        decoding(s, a, 0, 1500, 1, 1200);
        struct ty_sched_request probe = bare(2, 0);
        assert_int_equal(ty_sched_pick(s, &probe, 1000, &d), 0);
        assert_true(fabs(d.ttft_us - 1000) < 1e-9);
        assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
        if (m == 2) {
            assert_false(d.judged);
        } else {
            assert_true(d.judged);
            assert_true(fabs(d.judged_batch - 1) < 1e-9);
            assert_true(fabs(d.judged_ctx - want_ctx[m]) < 1e-6);
        }
        ty_sched_free(s);
    }
}

/* A batch runs at one pace: a request whose own TBT SLO is lax must not slow a batch holding a
 * request with a tight one. Class 0 allows 1150 us (one sequence: 1100 us), class 1 5000 us.
 * With a class-1 request decoding, a class-1 probe makes two sequences, 1200 us: admitted. With
 * a class-0 request decoding instead, the same probe would push it to 1200 us: refused, in
 * early admission at arrival and in the baseline when its KV lands. */
static void test_batch_tbt_slo(void **st)
{
    enum ty_sched_admission modes[2] = {TY_SCHED_ADMIT_EARLY, TY_SCHED_ADMIT_BASELINE};
    for (int m = 0; m < 2; m++) {
        for (uint32_t first = 0; first < 2; first++) {
            struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_LOAD_BALANCE, modes[m]);
            o.slo[0].tbt_us = 1150;
            o.slo[1].tbt_us = 5000;
            ty_sched_t *s = pair(&o, 0);
            struct ty_sched_decision d;
            enum ty_sched_reject rej;
            decoding(s, bare(1, 1 - first), 0, 1000, 1, 0); /* first == 1: class 0 */
            struct ty_sched_request probe = bare(2, 1);
            assert_int_equal(ty_sched_pick(s, &probe, 2000, &d), 0);
            enum ty_sched_reject want = first ? TY_SCHED_REJECT_TBT : TY_SCHED_REJECT_NONE;
            if (m == 0) {
                assert_int_equal(d.reject, want);
            } else {
                assert_int_equal(d.reject, TY_SCHED_REJECT_NONE); /* baseline: judged later */
                assert_int_equal(ty_sched_request_at_decode(s, 2, 3000, &rej), 0);
                assert_int_equal(rej, want);
            }
            ty_sched_free(s);
        }
    }
}

/* A decode node that goes and comes back (restart) starts a new life: a request still listed
 * from its old life must not take the new life's requests out of its per-class counts. A
 * tight-SLO (class 0) request B decodes on the re-added node; the old request A finishing must
 * leave B counted, so a lax probe that would slow B past 1150 us is still refused. */
static void test_node_readded_counts(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_LOAD_BALANCE, TY_SCHED_ADMIT_EARLY);
    o.slo[0].tbt_us = 1150;
    o.slo[1].tbt_us = 5000;
    ty_sched_t *s = pair(&o, 0);
    struct ty_sched_decision d;
    decoding(s, bare(1, 0), 0, 1000, 1, 0); /* A */
    struct ty_sched_node_desc dn = {.role = TY_SCHED_ROLE_DECODE};
    assert_int_equal(ty_sched_node_remove(s, 1), 0);
    assert_int_equal(ty_sched_node_add(s, 1, &dn), 0);
    decoding(s, bare(2, 0), 2000, 3000, 1, 0);               /* B, on the new life */
    assert_int_equal(ty_sched_request_done(s, 1, 4000), 0); /* A, of the old life */
    struct ty_sched_request probe = bare(3, 1);
    assert_int_equal(ty_sched_pick(s, &probe, 5000, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_TBT);
    ty_sched_free(s);
}

/* A prefill node that runs queued prompts together (batch_prompts 4, 300 prompt tokens per call)
 * and prompts that fit: the fixed cost of a call (1000 us) is paid once per call, not once
 * per prompt, and a prompt's first token comes when its call ends. A node that runs one
 * prompt at a time (the same costs) predicts every prompt behind the whole queue. */
static void test_batching_prefill_queue(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_LOAD_BALANCE, TY_SCHED_ADMIT_BASELINE);
    o.cost.prefill[0] = 1000;
    ty_sched_t *s, *one;
    assert_int_equal(ty_sched_new(&s, &o), 0);
    assert_int_equal(ty_sched_new(&one, &o), 0);
    struct ty_sched_node_desc pb = {.role = TY_SCHED_ROLE_PREFILL, .batch_prompts = 4,
                                    .batch_tokens = 300};
    struct ty_sched_node_desc p1 = {.role = TY_SCHED_ROLE_PREFILL};
    struct ty_sched_node_desc d = {.role = TY_SCHED_ROLE_DECODE};
    assert_int_equal(ty_sched_node_add(s, 0, &pb), 0);
    assert_int_equal(ty_sched_node_add(s, 10, &d), 0);
    assert_int_equal(ty_sched_node_add(one, 0, &p1), 0);
    assert_int_equal(ty_sched_node_add(one, 10, &d), 0);
    /* ten 50-token prompts at t = 0: 1050 us alone; the first starts at once (its call can
     * take nobody), the next four share one call (1000 + 4 x 50), the four after the next */
    const double want[10] = {1050, 2100, 2150, 2200, 2250, 3300, 3350, 3400, 3450, 4500};
    for (uint64_t i = 0; i < 10; i++) {
        struct ty_sched_request r = {.id = i + 1, .prompt_tokens = 50, .output_tokens = 1};
        struct ty_sched_decision a, b;
        assert_int_equal(ty_sched_pick(s, &r, 0, &a), 0);
        assert_int_equal(ty_sched_pick(one, &r, 0, &b), 0);
        assert_true(fabs(a.ttft_us - want[i]) < 1e-6);
        assert_true(fabs(b.ttft_us - 1050.0 * (i + 1)) < 1e-6);
    }
    /* a prompt too long for the last call's room (50 + 251 > 300) opens a call of its own */
    struct ty_sched_request big = {.id = 100, .prompt_tokens = 251, .output_tokens = 1};
    struct ty_sched_decision a;
    assert_int_equal(ty_sched_pick(s, &big, 0, &a), 0);
    assert_true(fabs(a.ttft_us - (4500 + 1251)) < 1e-6);
    /* the node reports its queue: 1251 us left at t = 10000 is the last call alone, which has
     * started; a short prompt now waits for it and runs in a call of its own */
    assert_int_equal(ty_sched_node_set_prefill_queue(s, 0, 1251, 10000), 0);
    struct ty_sched_request late = {.id = 101, .prompt_tokens = 50, .output_tokens = 1};
    assert_int_equal(ty_sched_pick(s, &late, 10000, &a), 0);
    assert_true(fabs(a.ttft_us - (1251 + 1050)) < 1e-6);
    /* and the next one joins that call, which has not started */
    late.id = 102;
    assert_int_equal(ty_sched_pick(s, &late, 10000, &a), 0);
    assert_true(fabs(a.ttft_us - (1251 + 1100)) < 1e-6);
    assert_true(fabs(a.prefill_us - 50) < 1e-6); /* what it adds to the node's queue */
    ty_sched_free(s);
    ty_sched_free(one);
}

/* A node that interleaves (tycho-prefill: a long prompt in calls of batch_tokens = 64, short
 * prompts joining them in half of each): calls cost 1000 us + 1 us per token, a full one
 * 1064 us. A 2000-token prompt at t = 0: 3000 us. Short (16-token) prompts behind it ride the
 * side lane: the first two in the call after the one running now (TTFT 2 x 1064), the third
 * in the next (32 tokens per lane call), while a node that does not interleave queues them
 * behind the whole prompt (in one call: 4016, 4032, 4048); a prompt over half a call (40 tokens) waits its turn there too, and
 * the long work ends later by the short prompts' tokens (3 x 16 us). */
static void test_interleave_lane(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_LOAD_BALANCE, TY_SCHED_ADMIT_BASELINE);
    o.cost.prefill[0] = 1000;
    ty_sched_t *s, *fifo;
    assert_int_equal(ty_sched_new(&s, &o), 0);
    assert_int_equal(ty_sched_new(&fifo, &o), 0);
    struct ty_sched_node_desc pi = {.role = TY_SCHED_ROLE_PREFILL, .batch_prompts = 8,
                                    .batch_tokens = 64, .interleaves = true};
    struct ty_sched_node_desc pf = pi;
    pf.interleaves = false;
    struct ty_sched_node_desc d = {.role = TY_SCHED_ROLE_DECODE};
    assert_int_equal(ty_sched_node_add(s, 0, &pi), 0);
    assert_int_equal(ty_sched_node_add(s, 10, &d), 0);
    assert_int_equal(ty_sched_node_add(fifo, 0, &pf), 0);
    assert_int_equal(ty_sched_node_add(fifo, 10, &d), 0);
    struct ty_sched_request r = {.id = 1, .prompt_tokens = 2000, .output_tokens = 1};
    struct ty_sched_decision a, b;
    assert_int_equal(ty_sched_pick(s, &r, 0, &a), 0);
    assert_int_equal(ty_sched_pick(fifo, &r, 0, &b), 0);
    assert_true(fabs(a.ttft_us - 3000) < 1e-6 && fabs(b.ttft_us - 3000) < 1e-6);
    const double lane[3] = {2128, 2128, 3192}, queued[3] = {4016, 4032, 4048};
    for (uint64_t i = 0; i < 3; i++) {
        r = (struct ty_sched_request){.id = 2 + i, .prompt_tokens = 16, .output_tokens = 1};
        assert_int_equal(ty_sched_pick(s, &r, 0, &a), 0);
        assert_int_equal(ty_sched_pick(fifo, &r, 0, &b), 0);
        assert_true(fabs(a.ttft_us - lane[i]) < 1e-6);
        assert_true(fabs(a.prefill_us - 16) < 1e-6); /* what it adds to the node's work */
        assert_true(fabs(b.ttft_us - queued[i]) < 1e-6);
    }
    r = (struct ty_sched_request){.id = 9, .prompt_tokens = 40, .output_tokens = 1};
    assert_int_equal(ty_sched_pick(s, &r, 0, &a), 0);
    assert_true(fabs(a.ttft_us - (3000 + 48 + 1040)) < 1e-6);
    /* at t = 1500 the lane's first call runs: a short prompt joins its last one (which holds
     * 16 tokens and starts at 2128): TTFT 2128 + 1064 - 1500 */
    r = (struct ty_sched_request){.id = 10, .prompt_tokens = 16, .output_tokens = 1};
    assert_int_equal(ty_sched_pick(s, &r, 1500, &a), 0);
    assert_true(fabs(a.ttft_us - 1692) < 1e-6);
    /* the node reports a short queue (one call left): no lane, the usual queue */
    assert_int_equal(ty_sched_node_set_prefill_queue(s, 0, 1000, 5000), 0);
    r.id = 11;
    assert_int_equal(ty_sched_pick(s, &r, 5000, &a), 0);
    assert_true(fabs(a.ttft_us - (1000 + 1016)) < 1e-6);
    ty_sched_free(s);
    ty_sched_free(fifo);
    /* no lane without a long prompt computing: five 64-token prompts (a call each, 5320 us
     * queued) and then a short one, which waits its turn in a call of its own */
    assert_int_equal(ty_sched_new(&s, &o), 0);
    assert_int_equal(ty_sched_node_add(s, 0, &pi), 0);
    assert_int_equal(ty_sched_node_add(s, 10, &d), 0);
    for (uint64_t i = 0; i < 5; i++) {
        r = (struct ty_sched_request){.id = 20 + i, .prompt_tokens = 64, .output_tokens = 1};
        assert_int_equal(ty_sched_pick(s, &r, 0, &a), 0);
    }
    r = (struct ty_sched_request){.id = 30, .prompt_tokens = 16, .output_tokens = 1};
    assert_int_equal(ty_sched_pick(s, &r, 0, &a), 0);
    assert_true(fabs(a.ttft_us - (5320 + 1016)) < 1e-6);
    ty_sched_free(s);
    /* nor on a node that runs one prompt per call (prefill_batch 1: nothing joins a chunk) */
    pi.batch_prompts = 1;
    assert_int_equal(ty_sched_new(&s, &o), 0);
    assert_int_equal(ty_sched_node_add(s, 0, &pi), 0);
    assert_int_equal(ty_sched_node_add(s, 10, &d), 0);
    r = (struct ty_sched_request){.id = 1, .prompt_tokens = 2000, .output_tokens = 1};
    assert_int_equal(ty_sched_pick(s, &r, 0, &a), 0);
    r = (struct ty_sched_request){.id = 2, .prompt_tokens = 16, .output_tokens = 1};
    assert_int_equal(ty_sched_pick(s, &r, 0, &a), 0);
    assert_true(fabs(a.ttft_us - 4016) < 1e-6);
    ty_sched_free(s);
}

/* The TTFT overhead is added to every prediction (and so to what admission compares with
 * the SLO), and a negative or non-finite one is refused. */
static void test_ttft_overhead(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_LOAD_BALANCE, TY_SCHED_ADMIT_BASELINE);
    o.slo[0].ttft_us = 1500;
    ty_sched_t *s;
    assert_int_equal(ty_sched_new(&s, &o), 0);
    struct ty_sched_node_desc p = {.role = TY_SCHED_ROLE_PREFILL};
    struct ty_sched_node_desc d = {.role = TY_SCHED_ROLE_DECODE};
    assert_int_equal(ty_sched_node_add(s, 0, &p), 0);
    assert_int_equal(ty_sched_node_add(s, 10, &d), 0);
    assert_int_equal(ty_sched_node_set_prefill_queue(s, 0, 500, 0), 0);
    struct ty_sched_request r = {.id = 1, .prompt_tokens = 800, .output_tokens = 1};
    struct ty_sched_decision dec;
    assert_int_equal(ty_sched_pick(s, &r, 0, &dec), 0); /* 500 queued + 800 = 1300 */
    assert_int_equal(dec.reject, TY_SCHED_REJECT_NONE);
    assert_true(fabs(dec.ttft_us - 1300) < 1e-9);
    assert_int_equal(ty_sched_set_ttft_overhead(s, 400), 0);
    r.id = 2;
    r.prompt_tokens = 100; /* 1300 queued + 100 + 400 = 1800 > 1500 */
    assert_int_equal(ty_sched_pick(s, &r, 0, &dec), 0);
    assert_int_equal(dec.reject, TY_SCHED_REJECT_TTFT);
    assert_true(fabs(dec.ttft_us - 1800) < 1e-9);
    assert_int_equal(ty_sched_set_ttft_overhead(s, -1), TY_EINVAL);
    assert_int_equal(ty_sched_set_ttft_overhead(s, NAN), TY_EINVAL);
    assert_true(ty_sched_opts_get(s)->ttft_overhead_us == 400);
    ty_sched_free(s);
}

static void test_names(void **st)
{
    enum ty_sched_policy p;
    enum ty_sched_admission a;
    for (int i = 0; i < TY_SCHED_POLICY_COUNT_; i++) {
        assert_int_equal(ty_sched_policy_parse(ty_sched_policy_name(i), &p), 0);
        assert_int_equal(p, i);
    }
    assert_int_equal(ty_sched_policy_parse("kvcache_centric", &p), 0);
    assert_int_equal(p, TY_SCHED_POLICY_KVCACHE_CENTRIC);
    assert_int_equal(ty_sched_policy_parse("fastest", &p), TY_EINVAL);
    assert_int_equal(ty_sched_admission_parse("predicted", &a), 0);
    assert_int_equal(a, TY_SCHED_ADMIT_PREDICTED);
    assert_int_equal(ty_sched_admission_parse(NULL, &a), TY_EINVAL);
}

/* A node taken out of placement (a Conductor's circuit breaker) is never chosen, keeps its
 * prefix index, and is chosen again once back; with every decode node out nothing is placed. */
static void test_node_out(void **st)
{
    struct ty_sched_opts o = toy_opts(TY_SCHED_POLICY_KVCACHE_CENTRIC, TY_SCHED_ADMIT_BASELINE);
    ty_sched_t *s = cluster(&o);
    struct ty_sched_request r = req(1, 0);
    struct ty_sched_decision d;
    assert_int_equal(ty_sched_node_set_out(s, 1, true), 0);
    assert_int_equal(ty_sched_node_set_out(s, 1, true), 0); /* twice: no change */
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
    assert_int_not_equal(d.prefill_node, 1); /* node 1 (TTFT 800 us) would win */
    assert_int_equal(ty_sched_node_set_out(s, 1, false), 0);
    r.id = 2;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.prefill_node, 1);
    assert_int_equal(d.local_prefix_blocks, 2); /* its index survived */
    assert_int_equal(ty_sched_node_set_out(s, 10, true), 0);
    r.id = 3;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NO_NODE);
    assert_int_equal(ty_sched_node_remove(s, 10), 0); /* removing an out node */
    assert_int_equal(ty_sched_node_set_out(s, 10, false), TY_ENOTFOUND);
    struct ty_sched_node_desc dd = {.role = TY_SCHED_ROLE_DECODE};
    assert_int_equal(ty_sched_node_add(s, 10, &dd), 0); /* back in, chosen */
    r.id = 4;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.decode_node, 10);
    ty_sched_free(s);
    (void)st;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_index_match),
        cmocka_unit_test(test_index_many_keys),
        cmocka_unit_test(test_load_balance),
        cmocka_unit_test(test_cache_aware),
        cmocka_unit_test(test_kvcache_centric),
        cmocka_unit_test(test_kvcache_centric_local_only),
        cmocka_unit_test(test_hot_prefix_spreads),
        cmocka_unit_test(test_kvcache_centric_pool_source),
        cmocka_unit_test(test_live_admission_options),
        cmocka_unit_test(test_idle_capacity_admits),
        cmocka_unit_test(test_round_robin_and_random),
        cmocka_unit_test(test_reject_ttft_and_no_node),
        cmocka_unit_test(test_early_rejection),
        cmocka_unit_test(test_prediction_based_rejection),
        cmocka_unit_test(test_decode_stage_rejection),
        cmocka_unit_test(test_decode_kv_in_admission),
        cmocka_unit_test(test_prediction_uniform_duration),
        cmocka_unit_test(test_prediction_kv_at_landing),
        cmocka_unit_test(test_batch_tbt_slo),
        cmocka_unit_test(test_node_readded_counts),
        cmocka_unit_test(test_batching_prefill_queue),
        cmocka_unit_test(test_interleave_lane),
        cmocka_unit_test(test_ttft_overhead),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_node_out),
        cmocka_unit_test(test_kvcache_centric_peer_or_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
