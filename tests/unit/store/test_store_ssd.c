/* SSD tier on real files in a temp dir: round trips, flipped bytes detected and dropped, restart
 * rescans (with and without index files), oldest buckets deleted when full; O_DIRECT and
 * buffered I/O both. */
#include "tycho/errors.h"
#include "tycho/store_ssd.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmocka.h>

static enum ty_store_ssd_direct g_mode;
static char g_dir[256];

static int setup(void **state)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_dir, sizeof(g_dir), "%s/ty-ssd-XXXXXX", base);
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static ty_store_ssd_t *open_tier(uint64_t cap, uint64_t bucket)
{
    struct ty_store_ssd_opts o = {
        .dir = g_dir, .capacity = cap, .bucket_bytes = bucket, .direct = g_mode};
    ty_store_ssd_t *s;
    assert_int_equal(ty_store_ssd_new(&s, &o), 0);
    struct ty_store_ssd_stats st;
    ty_store_ssd_stats(s, &st);
    assert_int_equal(st.direct, g_mode == TY_STORE_SSD_DIRECT_ON); /* /tmp-like: ext4 */
    return s;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1); /* xorshift: no block inside another */
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static void put_block(ty_store_ssd_t *s, const char *key, size_t n, unsigned seed)
{
    uint8_t *p = malloc(n);
    fill(p, n, seed);
    uint64_t loc;
    assert_int_equal(ty_store_ssd_put(s, key, p, n, XXH3_64bits(p, n), &loc), 0);
    free(p);
}

static void expect_block(ty_store_ssd_t *s, const char *key, size_t n, unsigned seed)
{
    uint8_t *want = malloc(n), *got = malloc(n + 16);
    fill(want, n, seed);
    uint64_t len = 0;
    assert_int_equal(ty_store_ssd_get(s, key, got, n + 16, &len), 0);
    assert_int_equal(len, n);
    assert_memory_equal(got, want, n);
    free(want);
    free(got);
}

static void test_round_trip(void **state)
{
    ty_store_ssd_t *s = open_tier(64u << 20, 0);
    const size_t sizes[] = {1, 4095, 4096 - 32 - 2, 4096, 65536, (1u << 20) + 3};
    for (unsigned i = 0; i < 6; i++) {
        char k[16];
        snprintf(k, sizeof(k), "b%u", i);
        put_block(s, k, sizes[i], i);
    }
    for (unsigned i = 0; i < 6; i++) {
        char k[16];
        snprintf(k, sizeof(k), "b%u", i);
        expect_block(s, k, sizes[i], i);
    }
    uint8_t small[8];
    uint64_t len, loc;
    assert_int_equal(ty_store_ssd_get(s, "b4", small, sizeof(small), &len), TY_ENOSPC);
    assert_int_equal(ty_store_ssd_put(s, "b0", small, 8, 0, &loc), TY_EEXIST);
    assert_int_equal(ty_store_ssd_remove(s, "b0"), 0);
    assert_int_equal(ty_store_ssd_get(s, "b0", small, 8, &len), TY_ENOTFOUND);
    assert_int_equal(ty_store_ssd_remove(s, "b0"), TY_ENOTFOUND);
    assert_int_equal(ty_store_ssd_put(s, "", small, 8, 0, &loc), TY_EINVAL);
    ty_store_ssd_free(s);
}

/* Flip one byte of `key`'s data in its bucket file (found by searching for the record). */
static void flip_on_disk(const char *key, size_t n, unsigned seed)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/bucket-00000000.bkt", g_dir);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    off_t size = lseek(fd, 0, SEEK_END);
    uint8_t *all = malloc((size_t)size);
    assert_int_equal(pread(fd, all, (size_t)size, 0), size);
    uint8_t *want = malloc(n);
    fill(want, n, seed);
    uint8_t *at = memmem(all, (size_t)size, want, n);
    assert_non_null(at);
    off_t off = (at - all) + (off_t)n / 2;
    uint8_t b = all[off] ^ 0x40;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    close(fd);
    free(all);
    free(want);
}

static void test_flipped_bytes(void **state)
{
    ty_store_ssd_t *s = open_tier(64u << 20, 0);
    put_block(s, "good", 10000, 1);
    put_block(s, "bad", 10000, 2);
    put_block(s, "live", 5000, 3);
    ty_store_ssd_free(s);
    flip_on_disk("bad", 10000, 2);
    s = open_tier(64u << 20, 0);
    uint8_t *buf = malloc(10000);
    uint64_t len;
    assert_int_equal(ty_store_ssd_get(s, "bad", buf, 10000, &len), TY_ECHECKSUM);
    assert_int_equal(ty_store_ssd_get(s, "bad", buf, 10000, &len), TY_ENOTFOUND);
    expect_block(s, "good", 10000, 1);
    /* A flip while the tier is open is caught the same way. */
    flip_on_disk("live", 5000, 3);
    assert_int_equal(ty_store_ssd_get(s, "live", buf, 10000, &len), TY_ECHECKSUM);
    char dropped[4][256];
    assert_int_equal(ty_store_ssd_take_dropped(s, dropped, 4), 2);
    assert_string_equal(dropped[0], "bad");
    assert_string_equal(dropped[1], "live");
    struct ty_store_ssd_stats st;
    ty_store_ssd_stats(s, &st);
    assert_int_equal(st.checksum_errors, 2);
    free(buf);
    ty_store_ssd_free(s);
}

static int count_cb(const char *key, uint64_t loc, uint64_t len, uint64_t cs, void *arg)
{
    (*(int *)arg)++;
    return 0;
}

static void test_restart(void **state)
{
    ty_store_ssd_t *s = open_tier(64u << 20, 256u << 10);
    for (unsigned i = 0; i < 50; i++) {
        char k[16];
        snprintf(k, sizeof(k), "r%u", i);
        put_block(s, k, 20000 + i, i);
    }
    ty_store_ssd_free(s);
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 1) { /* no index files: the records are scanned */
            char cmd[400];
            snprintf(cmd, sizeof(cmd), "rm -f %s/*.idx", g_dir);
            assert_int_equal(system(cmd), 0);
        }
        if (pass == 2) { /* a damaged index is ignored the same way */
            char path[400];
            snprintf(path, sizeof(path), "%s/bucket-00000001.idx", g_dir);
            int fd = open(path, O_RDWR);
            assert_true(fd >= 0);
            assert_int_equal(pwrite(fd, "X", 1, 20), 1);
            close(fd);
        }
        s = open_tier(64u << 20, 256u << 10);
        struct ty_store_ssd_stats st;
        ty_store_ssd_stats(s, &st);
        assert_int_equal(st.blocks, 50);
        assert_true(st.buckets >= 4); /* 50 x ~24 KiB in 256 KiB buckets */
        int n = 0;
        ty_store_ssd_foreach(s, count_cb, &n);
        assert_int_equal(n, 50);
        for (unsigned i = 0; i < 50; i++) {
            char k[16];
            snprintf(k, sizeof(k), "r%u", i);
            expect_block(s, k, 20000 + i, i);
        }
        ty_store_ssd_free(s);
    }
}

static void test_full_evicts_oldest(void **state)
{
    /* 1000-byte blocks take one 4 KiB record; 4 per 16 KiB bucket; 48 KiB in all. */
    ty_store_ssd_t *s = open_tier(48u << 10, 16u << 10);
    for (unsigned i = 0; i < 20; i++) {
        char k[16];
        snprintf(k, sizeof(k), "f%02u", i);
        put_block(s, k, 1000, i);
    }
    struct ty_store_ssd_stats st;
    ty_store_ssd_stats(s, &st);
    assert_true(st.buckets <= 3);
    assert_int_equal(st.buckets_evicted, 2); /* buckets 0..4 held f00..f19; 0 and 1 deleted */
    char dropped[16][256];
    assert_int_equal(ty_store_ssd_take_dropped(s, dropped, 16), 8);
    uint8_t buf[1000];
    uint64_t len;
    for (unsigned i = 0; i < 20; i++) {
        char k[16];
        snprintf(k, sizeof(k), "f%02u", i);
        if (i < 8)
            assert_int_equal(ty_store_ssd_get(s, k, buf, sizeof(buf), &len), TY_ENOTFOUND);
        else
            expect_block(s, k, 1000, i);
    }
    uint8_t *huge = calloc(1, 64u << 10);
    uint64_t loc;
    assert_int_equal(ty_store_ssd_put(s, "huge", huge, 64u << 10, 0, &loc), TY_EFBIG);
    free(huge);
    ty_store_ssd_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flipped_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_evicts_oldest, setup, teardown),
    };
    int rc = 0;
    /* Buffered, then O_DIRECT (the temp dir is on a filesystem that supports it; when it is
     * not, the O_DIRECT pass is skipped with a message). */
    g_mode = TY_STORE_SSD_DIRECT_OFF;
    rc |= cmocka_run_group_tests_name("buffered", tests, NULL, NULL);
    char probe[300];
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(probe, sizeof(probe), "%s/ty-ssd-probe-%d", base, (int)getpid());
    int fd = open(probe, O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd >= 0) {
        close(fd);
        unlink(probe);
        g_mode = TY_STORE_SSD_DIRECT_ON;
        rc |= cmocka_run_group_tests_name("o_direct", tests, NULL, NULL);
    } else {
        unlink(probe);
        printf("O_DIRECT not supported under %s: direct pass skipped\n", base);
    }
    return rc;
}
