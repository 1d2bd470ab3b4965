/* Hot blocks end to end (docs/arch/store.md "Hot blocks", FAST'25 Mooncake section 6.2): a
 * master and three pool nodes as real tycho-store processes on loopback. A block read many
 * times a second gains replicas on the other two nodes (REPLICATE jobs: a node pulls the bytes
 * from another over the transfer engine), the master then names each replica first in turn so
 * the reads spread (the master's tycho_store_reads_total{node} and each node's own
 * tycho_pool_node_transfer_bytes_total{direction="out"} both rise), and once the reads stop and
 * the block cools, its extra replica is the first thing evicted on a node under pressure, before
 * older blocks that plain LRU would take. */
#include "harness.h"

#include "tycho/auth.h"
#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/store.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define UNIT    (256u << 10) /* nodes of 4 MiB hold 16 units */
#define HOT_LEN (2 * UNIT)

static struct proc g_master, g_node[3];
static const char *const g_names[3] = {"A", "B", "C"};
static char g_addr[64];

static void start_master(void)
{
    const char *args[] = {"--master",
                          "--dram_bytes=0",
                          "--listen_port=0",
                          "--log_level=warn",
                          "--node_timeout=2s",
                          "--lease=300ms",
                          "--hot_reads_per_s=50",
                          "--hot_replicas=3",
                          "--hot_half_life=300ms",
                          "--high_watermark=0.9", /* 14.4 units */
                          "--low_watermark=0.89", /* 14.24: one block of 1 or 2 units goes */
                          NULL};
    assert_int_equal(harness_start(&g_master, NULL, args), 0);
    snprintf(g_addr, sizeof(g_addr), "127.0.0.1:%u", g_master.master_port);
}

static void start_node(int i)
{
    char a1[64], a2[128];
    snprintf(a1, sizeof(a1), "--name=%s", g_names[i]);
    snprintf(a2, sizeof(a2), "--master_address=%s", g_addr);
    const char *args[] = {
        a1, a2, "--dram_bytes=4M", "--heartbeat_interval=100ms", "--log_level=warn", NULL};
    assert_int_equal(harness_start(&g_node[i], NULL, args), 0);
}

static ty_store_client_t *client(const char *writer, const char *transport)
{
    struct ty_store_client_opts o = {.master = g_addr,
                                     .auth = ty_auth_from_env(),
                                     .replicas = 1,
                                     .writer = writer,
                                     .timeout_ms = 10000,
                                     .transport = transport};
    ty_store_client_t *c;
    assert_int_equal(ty_store_client_new(&c, &o), 0);
    return c;
}

static struct ty_store_meta_stats stats(ty_store_client_t *c)
{
    struct ty_store_meta_stats st = {0};
    assert_int_equal(ty_store_client_master_stats(c, &st, NULL), 0);
    return st;
}

/* Where the pool says "hot" lives: STORED / REMOVED events per node. */
struct seen {
    pthread_mutex_t mu;
    bool stored[3], removed[3];
    int removed_other; /* REMOVED events of any other key */
};

static void on_event(const struct ty_store_event *ev, const char *node, void *arg)
{
    struct seen *s = arg;
    if (!ev)
        return;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < 3; i++) {
        if (strcmp(node, g_names[i]) != 0)
            continue;
        if (strcmp(ev->key, "hot") == 0 && ev->kind == TY_STORE_EVENT_STORED)
            s->stored[i] = true;
        else if (strcmp(ev->key, "hot") == 0)
            s->removed[i] = true;
        else if (ev->kind == TY_STORE_EVENT_REMOVED)
            s->removed_other++;
    }
    pthread_mutex_unlock(&s->mu);
}

static bool stored_everywhere(struct seen *s)
{
    pthread_mutex_lock(&s->mu);
    bool all = s->stored[0] && s->stored[1] && s->stored[2];
    pthread_mutex_unlock(&s->mu);
    return all;
}

static void put_key(ty_store_client_t *c, const char *key, uint32_t len)
{
    uint8_t *v = malloc(len);
    harness_fill(v, len, key, 0);
    assert_int_equal(ty_store_client_put(c, key, v, len), 0);
    free(v);
}

static void get_hot(ty_store_client_t *c, uint8_t *buf, const uint8_t *want)
{
    uint64_t len = 0;
    assert_int_equal(ty_store_client_get(c, "hot", buf, HOT_LEN, &len), 0);
    assert_int_equal(len, HOT_LEN);
    assert_memory_equal(buf, want, HOT_LEN);
}

static double metric(const struct proc *p, const char *series)
{
    double v = -1;
    if (harness_metric(p, series, &v) != 0)
        fail_msg("no series %s", series);
    return v;
}

/* Reads the master named node i first for; bytes node i served to tcp readers. */
static double reads_of(int i)
{
    char s[96];
    snprintf(s, sizeof(s), "tycho_store_reads_total{node=\"%s\"}", g_names[i]);
    return metric(&g_master, s);
}

static double out_of(int i)
{
    return metric(&g_node[i], "tycho_pool_node_transfer_bytes_total{direction=\"out\"}");
}

static void test_hot_block(void **state)
{
    (void)state;
    ty_store_client_t *ca = client("A", NULL), *cb = client("B", NULL);
    ty_store_client_t *rd = client(NULL, "tcp"); /* tcp: the nodes count what it reads */
    for (int i = 0; i < 500 && stats(rd).nodes_alive < 3; i++)
        ty_sleep_ns(10 * 1000000ull);
    assert_int_equal(stats(rd).nodes_alive, 3);
    struct seen seen = {.mu = PTHREAD_MUTEX_INITIALIZER};
    assert_int_equal(ty_store_client_subscribe_snapshot(rd, NULL, false, on_event, &seen), 0);

    /* B: four old blocks (1 unit each); A: the block to be read (2 units) */
    char key[32];
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof(key), "old%d", i);
        put_key(cb, key, UNIT);
    }
    put_key(ca, "hot", HOT_LEN);
    uint8_t *want = malloc(HOT_LEN), *buf = malloc(HOT_LEN);
    harness_fill(want, HOT_LEN, "hot", 0);

    /* Read it a few hundred times a second until it has a replica on every node. */
    uint64_t t0 = ty_clock_ms();
    while (!stored_everywhere(&seen) && ty_clock_ms() - t0 < 10000) {
        get_hot(rd, buf, want);
        ty_sleep_ns(2 * 1000000ull);
    }
    assert_true(stored_everywhere(&seen));
    struct ty_store_meta_stats st = stats(rd);
    assert_int_equal(st.hot_blocks, 1);
    assert_int_equal(st.replications_started, 2);
    assert_int_equal(st.replications_done, 2);
    assert_int_equal(st.replications_failed, 0);

    /* Readers spread: the master names each replica first in turn, and each node serves. */
    double reads0[3], out0[3];
    for (int i = 0; i < 3; i++) {
        reads0[i] = reads_of(i);
        out0[i] = out_of(i);
    }
    for (int k = 0; k < 30; k++)
        get_hot(rd, buf, want);
    for (int i = 0; i < 3; i++) {
        double r = reads_of(i), o = out_of(i);
        printf("node %s: %.0f reads named first, %.0f bytes served over tcp\n", g_names[i],
               r - reads0[i], o - out0[i]);
        assert_true(r - reads0[i] >= 9); /* round-robin: 10 each */
        assert_true(o - out0[i] >= 9.0 * HOT_LEN);
    }
    assert_true(metric(&g_master, "tycho_store_hot_blocks") == 1);
    assert_true(metric(&g_master, "tycho_store_replications_total{state=\"done\"}") == 2);

    /* The reads stop: the block cools (rate below 25/s) and its lease ends. */
    t0 = ty_clock_ms();
    while (stats(rd).hot_blocks != 0 && ty_clock_ms() - t0 < 10000)
        ty_sleep_ns(50 * 1000000ull);
    assert_int_equal(stats(rd).hot_blocks, 0);
    ty_sleep_ns(400 * 1000000ull);

    /* Fill B past its high watermark: 4 old + 2 (hot's copy) + 9 new = 15 units > 14.4. Plain
     * LRU would drop old0 (the least recently read); the cooled extra copy goes instead. */
    for (int i = 0; i < 9; i++) {
        snprintf(key, sizeof(key), "new%d", i);
        put_key(cb, key, UNIT);
    }
    t0 = ty_clock_ms();
    while (stats(rd).evictions == 0 && ty_clock_ms() - t0 < 5000)
        ty_sleep_ns(10 * 1000000ull);
    ty_sleep_ns(100 * 1000000ull); /* the events of the eviction reach the subscriber */
    st = stats(rd);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.cold_evictions, 1);
    pthread_mutex_lock(&seen.mu);
    assert_true(seen.removed[1]); /* hot's copy on B left */
    assert_false(seen.removed[0] || seen.removed[2]);
    assert_int_equal(seen.removed_other, 0);
    pthread_mutex_unlock(&seen.mu);
    const char *olds[] = {"old0", "old1", "old2", "old3"};
    int status[4];
    assert_int_equal(ty_store_client_exists_batch(rd, 4, olds, status), 0);
    get_hot(rd, buf, want); /* still readable on A and C */
    assert_true(metric(&g_master, "tycho_store_cold_evictions_total") == 1);
    free(want);
    free(buf);
    ty_store_client_free(rd);
    ty_store_client_free(cb);
    ty_store_client_free(ca);
}

static int setup(void **state)
{
    (void)state;
    start_master();
    for (int i = 0; i < 3; i++)
        start_node(i);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++)
        harness_stop(&g_node[i], SIGTERM);
    harness_stop(&g_master, SIGTERM);
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest t[] = {
        cmocka_unit_test_setup_teardown(test_hot_block, setup, teardown)};
    int rc = cmocka_run_group_tests_name("hot", t, NULL, NULL);
    teardown(NULL);
    harness_cleanup();
    return rc;
}
