/* SSD tier edge cases behind issue #8 (a put that returned 0 whose block a get right after did
 * not return): signals during I/O, a budget smaller than one bucket, blocks larger than a bucket,
 * a re-put key, a bucket name the rescan cannot open, stray file names, a dropped block put
 * again across a restart, removes (tombstones) across restarts and bucket rotation, and a long
 * seeded mix of sizes with removes and restarts where every accepted put must read back at
 * once. */
#include "tycho/errors.h"
#include "tycho/store_ssd.h"

#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmocka.h>

#ifndef sigev_notify_thread_id /* Debian 12's glibc does not name the field */
#define sigev_notify_thread_id _sigev_un._tid
#endif

#define PAGE 4096u

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_dir, sizeof(g_dir), "%s/ty-ssd-edges-XXXXXX", base);
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    struct itimerval off = {{0, 0}, {0, 0}}; /* a failed signal test leaves no timer behind */
    setitimer(ITIMER_REAL, &off, NULL);
    signal(SIGALRM, SIG_IGN);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static ty_store_ssd_t *open_tier(uint64_t cap, uint64_t bucket)
{
    struct ty_store_ssd_opts o = {
        .dir = g_dir, .capacity = cap, .bucket_bytes = bucket, .direct = TY_STORE_SSD_DIRECT_OFF};
    ty_store_ssd_t *s;
    assert_int_equal(ty_store_ssd_new(&s, &o), 0);
    return s;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

/* Put key (n bytes from seed) and read it straight back: the promise a user relies on. */
static int put_get(ty_store_ssd_t *s, const char *key, size_t n, unsigned seed)
{
    uint8_t *p = malloc(n), *got = malloc(n);
    assert_non_null(p);
    assert_non_null(got);
    fill(p, n, seed);
    uint64_t loc, len = 0;
    int rc = ty_store_ssd_put(s, key, p, n, XXH3_64bits(p, n), &loc);
    if (rc == 0) {
        int g = ty_store_ssd_get(s, key, got, n, &len);
        if (g != 0)
            fprintf(stderr, "put %s (%zu bytes) returned 0, get right after: %s\n", key, n,
                    ty_err_name(g));
        assert_int_equal(g, 0);
        assert_int_equal(len, n);
        assert_memory_equal(got, p, n);
    }
    free(p);
    free(got);
    return rc;
}

static void expect_block(ty_store_ssd_t *s, const char *key, size_t n, unsigned seed)
{
    uint8_t *want = malloc(n), *got = malloc(n);
    fill(want, n, seed);
    uint64_t len = 0;
    assert_int_equal(ty_store_ssd_get(s, key, got, n, &len), 0);
    assert_int_equal(len, n);
    assert_memory_equal(got, want, n);
    free(want);
    free(got);
}

static atomic_int g_signals; /* lock-free: safe in a handler, and visible to TSan */

static void on_alarm(int sig)
{
    (void)sig;
    atomic_fetch_add_explicit(&g_signals, 1, memory_order_relaxed);
}

/* A signal landing while the tier waits for io_uring (libFuzzer's SIGALRM, a daemon's SIGHUP on
 * a libuv pool thread) must not end the wait: the request is still running on the buffer, and
 * its completion would be taken for the next request's. Before the fix a put returned 0 with
 * its write still pending and the get after it read garbage (TY_ECHECKSUM). */
static void test_signals_during_io(void **state)
{
    (void)state;
    struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART: waits see EINTR */
    sigemptyset(&sa.sa_mask);
    struct sigaction old;
    assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
    /* The timer signals this thread, the one waiting for io_uring: a process-wide SIGALRM may
     * land on any thread (a BLAS pool thread), and then no wait of the tier sees EINTR. */
    struct sigevent sev = {.sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGALRM};
    sev.sigev_notify_thread_id = gettid();
    timer_t timer;
    assert_int_equal(timer_create(CLOCK_MONOTONIC, &sev, &timer), 0);
    struct itimerspec it = {.it_interval = {0, 50000}, .it_value = {0, 50000}};
    ty_store_ssd_t *s = open_tier(64u << 20, 8u << 20);
    atomic_store(&g_signals, 0);
    assert_int_equal(timer_settime(timer, 0, &it, NULL), 0);
    for (unsigned i = 0; i < 400; i++) {
        char k[32];
        snprintf(k, sizeof(k), "sig/%u", i);
        size_t n = (i % 3 == 0) ? (1u << 20) + 17 : (i % 3 == 1) ? 3000 : 256u << 10;
        assert_int_equal(put_get(s, k, n, i), 0);
    }
    timer_delete(timer);
    sigaction(SIGALRM, &old, NULL);
    assert_true(atomic_load(&g_signals) > 100); /* the signals did arrive while blocks moved */
    ty_store_ssd_free(s);
    s = open_tier(64u << 20, 8u << 20);
    for (unsigned i = 0; i < 400; i += 37) { /* the last buckets survive a restart intact */
        char k[32];
        snprintf(k, sizeof(k), "sig/%u", i);
        size_t n = (i % 3 == 0) ? (1u << 20) + 17 : (i % 3 == 1) ? 3000 : 256u << 10;
        uint8_t *buf = malloc(n);
        uint64_t len;
        int rc = ty_store_ssd_get(s, k, buf, n, &len);
        free(buf);
        assert_true(rc == 0 || rc == TY_ENOTFOUND); /* older ones were deleted for space */
        if (rc == 0)
            expect_block(s, k, n, i);
    }
    ty_store_ssd_free(s);
}

/* Budget smaller than one bucket: the open bucket is the oldest and the only one. Before the
 * fix the tier refused every put with TY_EFBIG once the budget was reached, for good. */
static void test_budget_below_one_bucket(void **state)
{
    (void)state;
    ty_store_ssd_t *s = open_tier(12 * PAGE, 1u << 20);
    for (unsigned i = 0; i < 40; i++) {
        char k[16];
        snprintf(k, sizeof(k), "b%02u", i);
        assert_int_equal(put_get(s, k, 1000 + i * 300, i), 0);
    }
    struct ty_store_ssd_stats st;
    ty_store_ssd_stats(s, &st);
    assert_true(st.buckets_evicted > 0);
    expect_block(s, "b39", 1000 + 39 * 300, 39);
    uint8_t *big = calloc(1, 12 * PAGE); /* header + key push it past the budget */
    uint64_t loc;
    assert_int_equal(ty_store_ssd_put(s, "too-big", big, 12 * PAGE, 0, &loc), TY_EFBIG);
    free(big);
    ty_store_ssd_free(s);
}

/* Blocks larger than a bucket go in a bucket of their own; the oldest buckets make room. */
static void test_block_bigger_than_bucket(void **state)
{
    (void)state;
    ty_store_ssd_t *s = open_tier(64 * PAGE, 4 * PAGE);
    unsigned seed = 0;
    for (unsigned round = 0; round < 6; round++) {
        char k[32];
        for (unsigned j = 0; j < 3; j++) {
            snprintf(k, sizeof(k), "small/%u/%u", round, j);
            assert_int_equal(put_get(s, k, 500, seed++), 0);
        }
        snprintf(k, sizeof(k), "big/%u", round);
        assert_int_equal(put_get(s, k, 30 * PAGE, seed++), 0); /* 31 pages > 4-page bucket */
        snprintf(k, sizeof(k), "huge/%u", round);
        assert_int_equal(put_get(s, k, 63 * PAGE - 64, seed++), 0); /* the whole budget */
    }
    struct ty_store_ssd_stats st;
    ty_store_ssd_stats(s, &st);
    assert_int_equal(st.blocks, 1); /* huge/5 took everything */
    ty_store_ssd_free(s);
    s = open_tier(64 * PAGE, 4 * PAGE);
    expect_block(s, "huge/5", 63 * PAGE - 64, seed - 1);
    ty_store_ssd_free(s);
}

/* A key stored already is refused and keeps its bytes; once removed it can be put again. */
static void test_put_existing_key(void **state)
{
    (void)state;
    ty_store_ssd_t *s = open_tier(64 * PAGE, 8 * PAGE);
    assert_int_equal(put_get(s, "k", 5000, 1), 0);
    assert_int_equal(put_get(s, "k", 700, 2), TY_EEXIST);
    expect_block(s, "k", 5000, 1);
    assert_int_equal(ty_store_ssd_remove(s, "k"), 0);
    assert_int_equal(put_get(s, "k", 5000, 1), 0);
    ty_store_ssd_free(s);
}

/* A bucket name the rescan cannot open (here a directory) still holds its id: the next bucket
 * must not try to create it. Before the fix every put failed with TY_EEXIST ("key stored
 * already") for good. Names not written by the tier ("bucket-1.bkt") are left alone. */
static void test_unopenable_bucket_name(void **state)
{
    (void)state;
    ty_store_ssd_t *s = open_tier(64 * PAGE, 2 * PAGE);
    assert_int_equal(put_get(s, "a", 5000, 1), 0); /* bucket 0 */
    assert_int_equal(put_get(s, "b", 5000, 2), 0); /* bucket 1 */
    ty_store_ssd_free(s);
    char path[512];
    snprintf(path, sizeof(path), "%s/bucket-00000002.bkt", g_dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/bucket-1.bkt", g_dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs("not a bucket", f);
    fclose(f);
    s = open_tier(64 * PAGE, 2 * PAGE);
    struct ty_store_ssd_stats st;
    ty_store_ssd_stats(s, &st);
    assert_int_equal(st.buckets, 2);
    assert_int_equal(st.blocks, 2);
    assert_int_equal(put_get(s, "c", 5000, 3), 0);
    ty_store_ssd_free(s);
    s = open_tier(64 * PAGE, 2 * PAGE);
    expect_block(s, "a", 5000, 1);
    expect_block(s, "b", 5000, 2);
    expect_block(s, "c", 5000, 3);
    ty_store_ssd_free(s);
}

/* A block dropped for a bad checksum and put again reads back after a restart: the good copy,
 * not the bad one still listed in the older bucket's index. */
static void test_dropped_then_put_again(void **state)
{
    (void)state;
    ty_store_ssd_t *s = open_tier(64 * PAGE, PAGE); /* one record per bucket */
    assert_int_equal(put_get(s, "k", 1000, 1), 0);  /* bucket 0 */
    assert_int_equal(put_get(s, "j", 1000, 2), 0);  /* bucket 1; bucket 0 sealed, k indexed */
    char path[512];
    snprintf(path, sizeof(path), "%s/bucket-00000000.bkt", g_dir);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 32 + 1 + 100, SEEK_SET), 0); /* a byte of k's data */
    int c = fgetc(f);
    assert_int_equal(fseek(f, 32 + 1 + 100, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    fclose(f);
    uint8_t buf[1000];
    uint64_t len;
    assert_int_equal(ty_store_ssd_get(s, "k", buf, sizeof(buf), &len), TY_ECHECKSUM);
    assert_int_equal(put_get(s, "k", 1000, 1), 0); /* bucket 2 */
    ty_store_ssd_free(s);
    s = open_tier(64 * PAGE, PAGE);
    expect_block(s, "k", 1000, 1);
    expect_block(s, "j", 1000, 2);
    ty_store_ssd_free(s);
}

static void expect_absent(ty_store_ssd_t *s, const char *key)
{
    uint8_t buf[16];
    uint64_t len;
    assert_int_equal(ty_store_ssd_get(s, key, buf, sizeof(buf), &len), TY_ENOTFOUND);
}

/* Bytes of all bucket files in the directory. */
static uint64_t bucket_bytes_on_disk(void)
{
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    uint64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 4 || strcmp(de->d_name + n - 4, ".bkt") != 0)
            continue;
        char path[512];
        struct stat sb;
        snprintf(path, sizeof(path), "%s/%s", g_dir, de->d_name);
        assert_int_equal(stat(path, &sb), 0);
        sum += (uint64_t)sb.st_size;
    }
    closedir(d);
    return sum;
}

/* Delete every index file: the next open must read the records themselves, as after a crash
 * (the open bucket of a crashed tier has no index). */
static void drop_indexes(void)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -f '%s'/bucket-*.idx", g_dir);
    assert_int_equal(system(cmd), 0);
}

/* A removed block stays removed after a restart, read from the index and from the records.
 * Before the fix the remove was in memory only and the block came back (and was announced). */
static void test_remove_survives_restart(void **state)
{
    (void)state;
    for (int crash = 0; crash < 2; crash++) {
        ty_store_ssd_t *s = open_tier(64 * PAGE, 16 * PAGE);
        char a[16], b[16];
        snprintf(a, sizeof(a), "A%d", crash);
        snprintf(b, sizeof(b), "B%d", crash);
        assert_int_equal(put_get(s, a, 5000, 1), 0);
        assert_int_equal(put_get(s, b, 7000, 2), 0);
        assert_int_equal(ty_store_ssd_remove(s, a), 0);
        expect_absent(s, a);
        ty_store_ssd_free(s);
        if (crash)
            drop_indexes();
        s = open_tier(64 * PAGE, 16 * PAGE);
        expect_absent(s, a);
        expect_block(s, b, 7000, 2);
        assert_int_equal(ty_store_ssd_remove(s, a), TY_ENOTFOUND);
        ty_store_ssd_free(s);
        s = open_tier(64 * PAGE, 16 * PAGE); /* the index written on the last open agrees */
        expect_absent(s, a);
        expect_block(s, b, 7000, 2);
        ty_store_ssd_free(s);
    }
}

/* Put, remove, put again in the same bucket: the later put wins over the tombstone. */
static void test_remove_then_put_again(void **state)
{
    (void)state;
    for (int crash = 0; crash < 2; crash++) {
        ty_store_ssd_t *s = open_tier(64 * PAGE, 16 * PAGE);
        assert_int_equal(put_get(s, "A", 5000, 1), 0);
        assert_int_equal(ty_store_ssd_remove(s, "A"), 0);
        assert_int_equal(put_get(s, "A", 3000, 9), 0);
        ty_store_ssd_free(s);
        if (crash)
            drop_indexes();
        s = open_tier(64 * PAGE, 16 * PAGE);
        expect_block(s, "A", 3000, 9);
        struct ty_store_ssd_stats st;
        ty_store_ssd_stats(s, &st);
        assert_int_equal(st.blocks, 1);
        assert_int_equal(st.bytes_used, 3000);
        assert_int_equal(ty_store_ssd_remove(s, "A"), 0); /* removed again: a tombstone after it */
        ty_store_ssd_free(s);
        s = open_tier(64 * PAGE, 16 * PAGE);
        expect_absent(s, "A");
        ty_store_ssd_free(s);
    }
}

/* Records spread over many buckets (one or two per bucket): tombstones in later buckets than
 * their blocks, a key removed and put again in another bucket, and then a budget so small that
 * the oldest buckets (blocks and the tombstones after them) are deleted: nothing removed comes
 * back, nothing held is lost beyond what was deleted for space. */
static void test_remove_across_rotation(void **state)
{
    (void)state;
    for (int crash = 0; crash < 2; crash++) {
        ty_store_ssd_t *s = open_tier(256 * PAGE, 3 * PAGE);
        char k[16];
        for (unsigned i = 0; i < 12; i++) {
            snprintf(k, sizeof(k), "r%u", i);
            assert_int_equal(put_get(s, k, 5000, i), 0); /* 2 pages: one block per bucket */
        }
        for (unsigned i = 0; i < 12; i += 3) {
            snprintf(k, sizeof(k), "r%u", i);
            assert_int_equal(ty_store_ssd_remove(s, k), 0);
        }
        assert_int_equal(put_get(s, "r3", 6000, 33), 0);
        struct ty_store_ssd_stats st;
        ty_store_ssd_stats(s, &st);
        assert_true(st.buckets >= 8);
        ty_store_ssd_free(s);
        if (crash)
            drop_indexes();
        s = open_tier(256 * PAGE, 3 * PAGE);
        for (unsigned i = 0; i < 12; i++) {
            snprintf(k, sizeof(k), "r%u", i);
            if (i == 3)
                expect_block(s, k, 6000, 33);
            else if (i % 3 == 0)
                expect_absent(s, k);
            else
                expect_block(s, k, 5000, i);
        }
        ty_store_ssd_stats(s, &st);
        assert_int_equal(st.blocks, 9);
        ty_store_ssd_free(s);
        /* Reopen with a budget of a few buckets: the oldest are deleted as records arrive. */
        s = open_tier(12 * PAGE, 3 * PAGE);
        for (unsigned i = 100; i < 106; i++) {
            snprintf(k, sizeof(k), "r%u", i);
            assert_int_equal(put_get(s, k, 5000, i), 0);
        }
        assert_int_equal(ty_store_ssd_remove(s, "r104"), 0);
        ty_store_ssd_free(s);
        if (crash)
            drop_indexes();
        s = open_tier(12 * PAGE, 3 * PAGE);
        for (unsigned i = 0; i < 106; i = i == 11 ? 100 : i + 1) {
            snprintf(k, sizeof(k), "r%u", i);
            uint8_t buf[8192];
            uint64_t len;
            int rc = ty_store_ssd_get(s, k, buf, sizeof(buf), &len);
            if (i % 3 == 0 && i < 12 && i != 3)
                assert_int_equal(rc, TY_ENOTFOUND); /* removed: never back */
            else if (i == 104)
                assert_int_equal(rc, TY_ENOTFOUND);
            else if (i == 105)
                expect_block(s, k, 5000, i); /* the newest survive */
            else
                assert_true(rc == 0 || rc == TY_ENOTFOUND); /* or deleted for space */
        }
        ty_store_ssd_free(s);
        char cmd[512];
        snprintf(cmd, sizeof(cmd), "rm -f '%s'/bucket-*", g_dir);
        assert_int_equal(system(cmd), 0);
    }
}

/* A remove of a key not held writes nothing: no bytes in the buckets, no change in the stats. */
static void test_remove_absent_writes_nothing(void **state)
{
    (void)state;
    ty_store_ssd_t *s = open_tier(64 * PAGE, 16 * PAGE);
    assert_int_equal(put_get(s, "A", 5000, 1), 0);
    struct ty_store_ssd_stats st0, st1;
    ty_store_ssd_stats(s, &st0);
    uint64_t disk0 = bucket_bytes_on_disk();
    assert_int_equal(ty_store_ssd_remove(s, "nope"), TY_ENOTFOUND);
    ty_store_ssd_stats(s, &st1);
    assert_int_equal(bucket_bytes_on_disk(), disk0);
    assert_int_equal(st1.bytes_used, st0.bytes_used);
    assert_int_equal(st1.blocks, 1);
    assert_int_equal(ty_store_ssd_remove(s, "A"), 0); /* a real remove takes one page */
    assert_int_equal(bucket_bytes_on_disk(), disk0 + PAGE);
    assert_int_equal(ty_store_ssd_remove(s, "A"), TY_ENOTFOUND);
    assert_int_equal(bucket_bytes_on_disk(), disk0 + PAGE);
    ty_store_ssd_stats(s, &st1);
    assert_int_equal(st1.bytes_used, 0);
    assert_int_equal(st1.blocks, 0);
    ty_store_ssd_free(s);
}

/* The tombstone's room is made by deleting the bucket of the block being removed: the block is
 * gone (0), and it is not reported as dropped (the node's OFFLOAD removes a key and puts it
 * again at once; a report would make the master forget the new copy). */
static void test_remove_deletes_own_bucket(void **state)
{
    (void)state;
    ty_store_ssd_t *s = open_tier(2 * PAGE, 16 * PAGE);
    assert_int_equal(put_get(s, "A", 5000, 1), 0); /* 2 pages: the whole budget */
    assert_int_equal(ty_store_ssd_remove(s, "A"), 0);
    char dropped[4][256];
    assert_int_equal(ty_store_ssd_take_dropped(s, dropped, 4), 0);
    expect_absent(s, "A");
    assert_int_equal(put_get(s, "A", 5000, 2), 0);
    ty_store_ssd_free(s);
    s = open_tier(2 * PAGE, 16 * PAGE);
    expect_block(s, "A", 5000, 2);
    ty_store_ssd_free(s);
}

/* Seeded mix: sizes from 1 byte to 3 buckets, a small budget, removes, re-puts and restarts.
 * Every put either returns 0 and reads back at once, or (only for a record over the budget)
 * TY_EFBIG; every block listed reads back with its bytes. */
static void test_mixed_sizes_with_restarts(void **state)
{
    (void)state;
    const uint64_t cap = 40 * PAGE, bucket = 6 * PAGE;
    ty_store_ssd_t *s = open_tier(cap, bucket);
    uint64_t x = 12345;
    unsigned seed = 0;
    for (unsigned op = 0; op < 3000; op++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        unsigned r = (unsigned)(x >> 33);
        char k[32];
        snprintf(k, sizeof(k), "m/%u", r % 97);
        if (r % 50 == 0) {
            ty_store_ssd_free(s);
            s = open_tier(cap, bucket);
        } else if (r % 7 == 0) {
            int rc = ty_store_ssd_remove(s, k);
            assert_true(rc == 0 || rc == TY_ENOTFOUND);
        } else {
            size_t n = (r % 5 == 0) ? 1 + (r >> 8) % (3 * bucket) : 1 + (r >> 8) % (2 * PAGE);
            uint64_t rs = (32 + strlen(k) + n + PAGE - 1) / PAGE * PAGE;
            int rc = put_get(s, k, n, seed++);
            if (rs > cap)
                assert_int_equal(rc, TY_EFBIG);
            else
                assert_true(rc == 0 || rc == TY_EEXIST);
        }
        struct ty_store_ssd_stats st;
        ty_store_ssd_stats(s, &st);
        assert_true(st.bytes_used <= cap);
    }
    ty_store_ssd_free(s);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]); /* e.g. test_signals_during_io */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_signals_during_io, setup, teardown),
        cmocka_unit_test_setup_teardown(test_budget_below_one_bucket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_block_bigger_than_bucket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_existing_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unopenable_bucket_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dropped_then_put_again, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_survives_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_then_put_again, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_across_rotation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_absent_writes_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_deletes_own_bucket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mixed_sizes_with_restarts, setup, teardown),
    };
    return cmocka_run_group_tests_name("ssd_edges", tests, NULL, NULL);
}
