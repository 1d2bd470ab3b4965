/* A node's use of the KV pool (src/node/node_kvstore.c) against a real
 * tycho-store: blocks one page pool computed are read into another byte for byte; the leading run stops at
 * the first block the pool lacks or holds with the wrong size; another model's prompts find
 * nothing; a full page cache or a dead pool is a miss, and a dead pool is then skipped. */
#include "harness.h"
#include "tycho/auth.h"
#include "tycho/node_kvstore.h"

#include "tycho/errors.h"
#include "tycho/hash.h"

#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

enum { LAYERS = 3, HEADS = 2, HDIM = 8, B = 4 };

static struct proc g_store;
static char g_master[64];

static int setup(void **state)
{
    (void)state;
    const char *args[] = {"--master", "--listen_port=0", "--dram_bytes=16M", "--log_level=warn",
                          NULL};
    if (harness_start(&g_store, NULL, args))
        return -1;
    snprintf(g_master, sizeof(g_master), "127.0.0.1:%u", g_store.master_port);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    harness_stop(&g_store, SIGTERM);
    harness_cleanup();
    return 0;
}

static ty_kvpool_t *mk_pool(uint32_t pages, uint64_t seed)
{
    struct ty_kvpool_opts o = {.n_layers = LAYERS, .n_kv_heads = HEADS, .head_dim = HDIM,
                               .block_tokens = B, .n_pages = pages, .hash_seed = seed};
    ty_kvpool_t *p;
    assert_int_equal(ty_kvpool_new(&p, &o), 0);
    return p;
}

struct side {
    ty_kvpool_t *pool;
    ty_store_client_t *client;
    struct ty_node_kvstore *ks;
};

static struct side mk_side(uint32_t pages, uint64_t seed, uint32_t retry_ms)
{
    struct side s = {.pool = mk_pool(pages, seed)};
    struct ty_store_client_opts co = {.master = g_master, .transport = "tcp", .timeout_ms = 500,
                                      .auth = ty_auth_from_env()};
    assert_int_equal(ty_store_client_new(&s.client, &co), 0);
    struct ty_node_kvstore_opts ko = {.client = s.client, .pool = s.pool, .n_layers = LAYERS,
                                         .hash_seed = seed, .staging_bytes = 1 << 16,
                                         .retry_ms = retry_ms};
    assert_int_equal(ty_node_kvstore_new(&s.ks, &ko), 0);
    return s;
}

static void free_side(struct side *s)
{
    ty_node_kvstore_free(s->ks);
    ty_store_client_free(s->client);
    ty_kvpool_free(s->pool);
}

/* A sequence holding the KV of `tokens`, every float a function of (token position, layer,
 * K/V, element), as a forward pass would have written it. */
static ty_kvseq_t *computed(ty_kvpool_t *p, const uint32_t *tokens, uint32_t n)
{
    ty_kvseq_t *s;
    assert_int_equal(ty_kvpool_seq_new(p, &s), 0);
    assert_int_equal(ty_kvpool_seq_reserve(p, s, n), 0);
    for (uint32_t pg = 0; pg < (n + B - 1) / B; pg++)
        for (uint32_t l = 0; l < LAYERS; l++)
            for (int kv = 0; kv < 2; kv++) {
                float *x = kv ? ty_kvpool_v(p, l, ty_kvseq_pages(s)[pg])
                              : ty_kvpool_k(p, l, ty_kvseq_pages(s)[pg]);
                for (uint32_t i = 0; i < HEADS * B * HDIM; i++)
                    x[i] = (float)(tokens[pg * B] * 1000 + pg * 100 + l * 10 + kv) + 0.001f * i;
            }
    assert_int_equal(ty_kvpool_seq_commit(p, s, tokens, n), 0);
    return s;
}

static void assert_blocks_equal(ty_kvpool_t *a, const ty_kvseq_t *sa, ty_kvpool_t *b,
                                const ty_kvseq_t *sb, uint32_t blocks)
{
    size_t bytes = ty_kvpool_page_bytes(a);
    for (uint32_t pg = 0; pg < blocks; pg++)
        for (uint32_t l = 0; l < LAYERS; l++) {
            uint32_t pa = ty_kvseq_pages(sa)[pg], pb = ty_kvseq_pages(sb)[pg];
            assert_memory_equal(ty_kvpool_k(a, l, pa), ty_kvpool_k(b, l, pb), bytes);
            assert_memory_equal(ty_kvpool_v(a, l, pa), ty_kvpool_v(b, l, pb), bytes);
        }
}

static uint32_t fetch(struct side *s, const uint32_t *tokens, uint32_t n)
{
    ty_kvseq_t *q;
    assert_int_equal(ty_kvpool_seq_new(s->pool, &q), 0);
    uint32_t got = ty_node_kvstore_fetch(s->ks, q, tokens, n, UINT32_MAX);
    assert_int_equal(ty_kvseq_n_tokens(q), got);
    ty_kvpool_seq_free(s->pool, q);
    return got;
}

static void test_share_blocks(void **state)
{
    (void)state;
    uint32_t t[19];
    for (uint32_t i = 0; i < 19; i++)
        t[i] = 100 + i;
    struct side a = mk_side(32, 42, 5000), b = mk_side(32, 42, 5000);
    ty_kvseq_t *sa = computed(a.pool, t, 19);
    ty_node_kvstore_store(a.ks, sa, t, 19, 0);
    /* the blocks were copied out: the sequence can go before the writer is done */
    uint8_t first[64];
    memcpy(first, ty_kvpool_k(a.pool, 0, ty_kvseq_pages(sa)[0]), sizeof(first));
    ty_kvpool_seq_free(a.pool, sa);
    ty_node_kvstore_flush(a.ks);
    struct ty_node_kvstore_stats st;
    ty_node_kvstore_stats(a.ks, &st);
    assert_int_equal(st.stored_blocks, 4); /* the full blocks; the last 3 tokens are not one */
    assert_int_equal(ty_kvpool_seq_new(a.pool, &sa), 0); /* the same KV, from a's cache */
    assert_int_equal(ty_kvpool_seq_match_prefix(a.pool, sa, t, 19), 16);
    assert_memory_equal(first, ty_kvpool_k(a.pool, 0, ty_kvseq_pages(sa)[0]), sizeof(first));
    /* b never saw the prompt: it reads all 4 full blocks ((19 - 1) / 4), byte for byte */
    ty_kvseq_t *sb;
    assert_int_equal(ty_kvpool_seq_new(b.pool, &sb), 0);
    assert_int_equal(ty_node_kvstore_fetch(b.ks, sb, t, 19, UINT32_MAX), 16);
    assert_blocks_equal(a.pool, sa, b.pool, sb, 4);
    ty_kvpool_seq_free(b.pool, sb);
    /* ... and now holds them in its own page cache, found by the usual prefix match */
    assert_int_equal(ty_kvpool_seq_new(b.pool, &sb), 0);
    assert_int_equal(ty_kvpool_seq_match_prefix(b.pool, sb, t, 19), 16);
    ty_kvpool_seq_free(b.pool, sb);
    /* a prompt of exactly 4 blocks leaves its last one to compute */
    struct side c = mk_side(32, 42, 5000);
    assert_int_equal(fetch(&c, t, 16), 12);
    /* the Conductor's plan caps what is read: 2 blocks planned, 2 read (of the 4 there) */
    struct side e = mk_side(32, 42, 5000);
    ty_kvseq_t *se;
    assert_int_equal(ty_kvpool_seq_new(e.pool, &se), 0);
    assert_int_equal(ty_node_kvstore_fetch(e.ks, se, t, 19, 2), 8);
    assert_int_equal(ty_kvseq_n_tokens(se), 8);
    ty_kvpool_seq_free(e.pool, se);
    /* a prompt that diverges in block 2 shares blocks 0 and 1 only (chained hashes) */
    uint32_t u[19];
    memcpy(u, t, sizeof(u));
    u[9] = 7;
    assert_int_equal(fetch(&c, u, 19), 8);
    /* writing again stores nothing new (the pool has every block) */
    ty_kvseq_t *full = computed(a.pool, t, 19);
    ty_node_kvstore_store(a.ks, full, t, 19, 0);
    ty_kvpool_seq_free(a.pool, full);
    ty_node_kvstore_flush(a.ks);
    ty_node_kvstore_stats(a.ks, &st);
    assert_int_equal(st.stored_blocks, 4);
    assert_int_equal(st.errors, 0);
    /* another model (another seed) finds nothing */
    struct side d = mk_side(32, 43, 5000);
    assert_int_equal(fetch(&d, t, 19), 0);
    ty_kvpool_seq_free(a.pool, sa);
    free_side(&a);
    free_side(&b);
    free_side(&c);
    free_side(&d);
    free_side(&e);
}

static void test_bad_value_and_full_cache(void **state)
{
    (void)state;
    uint32_t t[21];
    for (uint32_t i = 0; i < 21; i++)
        t[i] = 300 + i;
    struct side a = mk_side(32, 42, 5000);
    ty_kvseq_t *sa = computed(a.pool, t, 21);
    ty_node_kvstore_store(a.ks, sa, t, 21, 0);
    ty_kvpool_seq_free(a.pool, sa);
    ty_node_kvstore_flush(a.ks);
    /* block 2's value replaced by one of another size (the key format is kvstore.h's) */
    uint64_t h[5];
    assert_int_equal(ty_hash_prefix_blocks(t, 21, B, 42, h, 5), 5);
    char key[32];
    snprintf(key, sizeof(key), "kv/%016" PRIx64, h[2]);
    assert_int_equal(ty_store_client_remove(a.client, key), 0);
    assert_int_equal(ty_store_client_put(a.client, key, "short", 5), 0);
    struct side b = mk_side(32, 42, 5000);
    assert_int_equal(fetch(&b, t, 21), 8); /* blocks 0 and 1, then the bad one ends the run */
    struct ty_node_kvstore_stats st;
    ty_node_kvstore_stats(b.ks, &st);
    assert_int_equal(st.hit_blocks, 2);
    assert_true(st.errors >= 1);
    /* the pool is not blamed for one bad block: the next prompt still asks it */
    assert_int_equal(fetch(&b, t, 21), 8);
    ty_node_kvstore_stats(b.ks, &st);
    assert_int_equal(st.skipped, 0);
    /* a page cache with room for 2 pages cannot take 5 blocks: a miss, nothing held */
    struct side c = mk_side(2, 42, 5000);
    assert_int_equal(fetch(&c, t, 21), 0);
    assert_int_equal(ty_kvpool_pages_used(c.pool), 0);
    free_side(&a);
    free_side(&b);
    free_side(&c);
}

/* A writer that falls behind drops blocks (counted) instead of holding the worker: with a
 * ring of 3 block slots, a 10-block prompt stores the first 3 and drops the other 7. */
static void test_ring_full(void **state)
{
    (void)state;
    uint32_t t[41];
    for (uint32_t i = 0; i < 41; i++)
        t[i] = 700 + i;
    struct side a = mk_side(32, 42, 5000);
    ty_node_kvstore_free(a.ks);
    size_t block = 2 * LAYERS * ty_kvpool_page_bytes(a.pool);
    struct ty_node_kvstore_opts ko = {.client = a.client, .pool = a.pool, .n_layers = LAYERS,
                                         .hash_seed = 42, .staging_bytes = 4 * block};
    assert_int_equal(ty_node_kvstore_new(&a.ks, &ko), 0); /* 1 read slot, 3 write slots */
    ty_kvseq_t *sa = computed(a.pool, t, 41);
    ty_node_kvstore_store(a.ks, sa, t, 41, 0);
    ty_kvpool_seq_free(a.pool, sa);
    ty_node_kvstore_flush(a.ks);
    struct ty_node_kvstore_stats st;
    ty_node_kvstore_stats(a.ks, &st);
    assert_int_equal(st.stored_blocks + st.dropped, 10);
    assert_true(st.stored_blocks >= 3 && st.dropped >= 1);
    struct side b = mk_side(32, 42, 5000);
    assert_int_equal(fetch(&b, t, 41), st.stored_blocks * B); /* the leading ones were kept */
    free_side(&a);
    free_side(&b);
}

struct snapshot_seen {
    pthread_mutex_t mu;
    int stored, other;
};

static void on_snapshot_event(const struct ty_store_event *ev, const char *node, void *arg)
{
    struct snapshot_seen *s = arg;
    (void)node;
    if (!ev)
        return;
    pthread_mutex_lock(&s->mu);
    if (ev->kind == TY_STORE_EVENT_STORED && !strncmp(ev->key, "kv/", 3))
        s->stored++;
    else
        s->other++;
    pthread_mutex_unlock(&s->mu);
}

/* A subscriber that comes after the blocks were written (a restarted Conductor) learns them
 * from the subscription's snapshot, only the keys of its prefix. */
static void test_subscribe_snapshot(void **state)
{
    (void)state;
    uint32_t t[13];
    for (uint32_t i = 0; i < 13; i++)
        t[i] = 900 + i;
    struct side a = mk_side(32, 77, 5000);
    assert_int_equal(ty_store_client_put(a.client, "not-a-block", "x", 1), 0);
    ty_kvseq_t *sa = computed(a.pool, t, 13);
    ty_node_kvstore_store(a.ks, sa, t, 13, 0);
    ty_kvpool_seq_free(a.pool, sa);
    ty_node_kvstore_flush(a.ks);
    /* the master's live events for these go out before the late subscriber comes (it would
     * see those too: only the snapshot is filtered by prefix) */
    struct timespec pause = {0, 300 * 1000000};
    nanosleep(&pause, NULL);
    struct snapshot_seen seen = {.mu = PTHREAD_MUTEX_INITIALIZER};
    ty_store_client_t *late;
    struct ty_store_client_opts co = {.master = g_master, .transport = "tcp", .timeout_ms = 500,
                                      .auth = ty_auth_from_env()};
    assert_int_equal(ty_store_client_new(&late, &co), 0);
    assert_int_equal(ty_store_client_subscribe_snapshot(late, "kv/", true, on_snapshot_event,
                                                        &seen),
                     0);
    int stored = 0;
    for (int i = 0; i < 200 && stored < 3; i++) { /* 3 blocks of this test and those before */
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&seen.mu);
        stored = seen.stored;
        pthread_mutex_unlock(&seen.mu);
    }
    struct ty_store_meta_stats ms;
    uint64_t epoch;
    assert_int_equal(ty_store_client_master_stats(late, &ms, &epoch), 0);
    pthread_mutex_lock(&seen.mu);
    /* every block key the pool holds, the other key not (one replica each) */
    assert_int_equal(seen.stored, (int)ms.objects - 1);
    assert_int_equal(seen.other, 0);
    pthread_mutex_unlock(&seen.mu);
    ty_store_client_free(late);
    free_side(&a);
}

/* Last: kills the pool. */
static void test_dead_pool(void **state)
{
    (void)state;
    uint32_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    struct side a = mk_side(32, 42, 60000);
    harness_stop(&g_store, SIGKILL);
    assert_int_equal(fetch(&a, t, 9), 0);
    struct ty_node_kvstore_stats st;
    ty_node_kvstore_stats(a.ks, &st);
    assert_int_equal(st.errors, 1);
    /* the next prompts do not wait for it again */
    assert_int_equal(fetch(&a, t, 9), 0);
    ty_kvseq_t *sa = computed(a.pool, t, 9);
    ty_node_kvstore_store(a.ks, sa, t, 9, 0);
    ty_kvpool_seq_free(a.pool, sa);
    ty_node_kvstore_flush(a.ks);
    ty_node_kvstore_stats(a.ks, &st);
    assert_int_equal(st.errors, 1);
    assert_int_equal(st.skipped, 2);
    assert_int_equal(st.stored_blocks, 0);
    free_side(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_share_blocks),
        cmocka_unit_test(test_bad_value_and_full_cache),
        cmocka_unit_test(test_ring_full),
        cmocka_unit_test(test_subscribe_snapshot),
        cmocka_unit_test(test_dead_pool),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
