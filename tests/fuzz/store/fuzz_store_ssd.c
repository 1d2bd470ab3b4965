/* libFuzzer target for the SSD tier's on-disk parsing (src/store/ssd.c): the rescan on open
 * of bucket files (4 KiB-aligned records: 32-byte header {u32 magic "TYKV", u16 version,
 * u16 key_len, u64 data_len, u64 XXH3 of the bytes, u64 XXH3 of the 24 bytes before it and
 * the key}, key, bytes, zero padding) and of their index files ({u32 magic "TYIX", u32 count,
 * u64 XXH3 of the rest} then per block {u16 key_len, key, u64 off, u64 len, u64 checksum}).
 *
 * Input: flag byte, u16 LE index length, index bytes, then pages [u16 LE len, bytes] each
 * written at the next 4 KiB boundary of bucket-00000001.bkt (at most 8 pages).
 * Flags: bit 0 write the index file; bit 1 fix its checksum; bit 2 fix the header check of a
 * record starting on each page; bit 3 fix that record's data checksum; bits 4-7 add that many
 * 512-byte units of unaligned tail. The fix-ups let the fuzzer get past XXH3 the way a
 * damaged or hostile writer could (XXH3 is a checksum, not a MAC).
 *
 * Checked: the tier opens on any contents; every block it reports lies inside its bucket
 * (offset aligned, record within the file) with a key of 1..255 bytes; stats agree with the
 * blocks listed; a get returns bytes that match the reported checksum or an error; a new
 * block can be put and read back, and is still there after a reopen. */
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/store_meta.h"
#include "tycho/store_ssd.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define PAGE 4096u
#define MAX_PAGES 8u
#define HDR 32u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A failed check names itself before aborting, so a crash report says which promise broke. */
#define check(cond) ((cond) ? (void)0 : check_failed(__LINE__, #cond))
static void check_failed(int line, const char *what)
{
    fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, line, what);
    abort();
}

static char g_dir[256];
static uint8_t g_bkt[MAX_PAGES * PAGE + 15 * 512];
static uint8_t g_buf[MAX_PAGES * PAGE];

static void path_of(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static void put_file(const char *name, const uint8_t *p, size_t n)
{
    char path[512];
    path_of(name, path, sizeof(path));
    FILE *f = fopen(path, "wb");
    check(f != NULL);
    check(n == 0 || fwrite(p, 1, n, f) == n);
    check(fclose(f) == 0);
}

/* Remove every file the tier may have made (buckets, indexes, temporaries). */
static void clear_dir(void)
{
    char path[512], name[64];
    static const char *const ext[] = {"bkt", "idx", "idx.tmp"};
    for (unsigned id = 0; id < 4; id++)
        for (size_t e = 0; e < 3; e++) {
            snprintf(name, sizeof(name), "bucket-%08u.%s", id, ext[e]);
            path_of(name, path, sizeof(path));
            unlink(path);
        }
}

static void fix_record(uint8_t *page, size_t avail, unsigned flags)
{
    uint16_t kl;
    uint64_t dl;
    memcpy(&kl, page + 6, 2);
    memcpy(&dl, page + 8, 8);
    if (kl == 0 || kl > TY_STORE_KEY_MAX)
        return;
    if ((flags & 8) && dl <= avail - HDR - kl) {
        uint64_t cs = XXH3_64bits(page + HDR + kl, dl);
        memcpy(page + 16, &cs, 8);
    }
    if (flags & 4) {
        uint8_t tmp[24 + TY_STORE_KEY_MAX];
        memcpy(tmp, page, 24);
        memcpy(tmp + 24, page + HDR, kl);
        uint64_t hc = XXH3_64bits(tmp, 24u + kl);
        memcpy(page + 24, &hc, 8);
    }
}

/* Build the bucket image from the page records; returns its size. */
static size_t build_bucket(const uint8_t *p, size_t n, unsigned flags)
{
    size_t off = 0, pages = 0;
    memset(g_bkt, 0, sizeof(g_bkt));
    while (pages < MAX_PAGES && off + 2 <= n) {
        uint16_t len;
        memcpy(&len, p + off, 2);
        off += 2;
        size_t take = len < n - off ? len : n - off;
        if (take > PAGE)
            take = PAGE;
        memcpy(g_bkt + pages * PAGE, p + off, take);
        off += take;
        pages++;
    }
    size_t total = pages * PAGE;
    for (size_t i = 0; i < pages; i++)
        fix_record(g_bkt + i * PAGE, total - i * PAGE, flags);
    return total + (flags >> 4) * 512u;
}

static void remove_dir(void)
{
    clear_dir();
    rmdir(g_dir);
}

struct seen {
    ty_store_ssd_t *s;
    uint64_t bucket_size; /* aligned size of bucket 1 */
    uint64_t n, bytes;
};

static int on_block(const char *key, uint64_t loc, uint64_t len, uint64_t cs, void *arg)
{
    struct seen *sn = arg;
    size_t kl = strlen(key);
    uint64_t off = loc & ((1ull << 40) - 1);
    check(kl >= 1 && kl <= TY_STORE_KEY_MAX);
    check((loc >> 40) == 1 && off % PAGE == 0);
    check(off <= sn->bucket_size && len <= sn->bucket_size);
    uint64_t rs = (HDR + kl + len + PAGE - 1) / PAGE * PAGE;
    check(rs <= sn->bucket_size - off);
    sn->n++;
    sn->bytes += len;
    (void)cs;
    return 0;
}

struct blk {
    char key[TY_STORE_KEY_MAX + 1];
    uint64_t len, cs;
};

static int collect(const char *key, uint64_t loc, uint64_t len, uint64_t cs, void *arg)
{
    struct blk *b = arg;
    (void)loc;
    for (size_t i = 0; i < 16; i++)
        if (!b[i].key[0]) {
            snprintf(b[i].key, sizeof(b[i].key), "%s", key);
            b[i].len = len;
            b[i].cs = cs;
            return 0;
        }
    return 0;
}

static void get_each(ty_store_ssd_t *s)
{
    struct blk b[16];
    memset(b, 0, sizeof(b));
    ty_store_ssd_foreach(s, collect, b);
    for (size_t i = 0; i < 16 && b[i].key[0]; i++) {
        uint64_t len = 0;
        int rc = ty_store_ssd_get(s, b[i].key, g_buf, sizeof(g_buf), &len);
        if (rc == 0)
            check(len == b[i].len && XXH3_64bits(g_buf, len) == b[i].cs);
        else
            check(rc == TY_ENOSPC || rc == TY_ECHECKSUM || rc == TY_EIO || rc == TY_ENOTFOUND);
    }
}

/* The block just put (the put returned 0) reads back, byte for byte. (A CI run once saw this
 * fail: a SIGALRM from libFuzzer's timeout timer cut an io_uring wait short and the tier took
 * one request's completion for the next one's; see docs/arch/fuzz.md.) */
static void get_new(ty_store_ssd_t *s, const char *key, const char *bytes, uint64_t n)
{
    uint64_t len = 0;
    int rc = ty_store_ssd_get(s, key, g_buf, sizeof(g_buf), &len);
    if (rc != 0)
        fprintf(stderr, "get of the block just put: %s\n", ty_err_name(rc));
    check(rc == 0);
    check(len == n && !memcmp(g_buf, bytes, len));
}

static void put_and_reopen(ty_store_ssd_t *s, const struct ty_store_ssd_opts *o)
{
    static const char key[] = "fuzz/new-block", bytes[] = "fresh bytes after a rescan";
    uint64_t loc, cs = XXH3_64bits(bytes, sizeof(bytes));
    int rc = ty_store_ssd_put(s, key, bytes, sizeof(bytes), cs, &loc);
    /* the budget (1 MiB) always has room for it; only a key the files already hold is refused */
    check(rc == 0 || rc == TY_EEXIST);
    if (rc == 0)
        get_new(s, key, bytes, sizeof(bytes));
    ty_store_ssd_free(s);
    check(ty_store_ssd_new(&s, o) == 0);
    if (rc == 0)
        get_new(s, key, bytes, sizeof(bytes));
    ty_store_ssd_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
        snprintf(g_dir, sizeof(g_dir), "%s/fuzz-ssd-XXXXXX", base ? base : "/tmp");
        check(mkdtemp(g_dir) != NULL);
        atexit(remove_dir);
        ty_log_set_level(TY_LOG_LEVEL_ERROR);
    }
    if (size < 3)
        return 0;
    unsigned flags = data[0];
    uint16_t il;
    memcpy(&il, data + 1, 2);
    size_t rest = size - 3, idx_len = il < rest ? il : rest;
    const uint8_t *idx = data + 3;
    clear_dir();
    size_t bsize = build_bucket(idx + idx_len, rest - idx_len, flags);
    put_file("bucket-00000001.bkt", g_bkt, bsize);
    if (flags & 1) {
        uint8_t ib[65536 + 16];
        memcpy(ib, idx, idx_len);
        if ((flags & 2) && idx_len >= 16) {
            uint64_t sum = XXH3_64bits(ib + 16, idx_len - 16);
            memcpy(ib + 8, &sum, 8);
        }
        put_file("bucket-00000001.idx", ib, idx_len);
    }
    struct ty_store_ssd_opts o = {.dir = g_dir,
                                  .capacity = 1u << 20,
                                  .bucket_bytes = 64u << 10,
                                  .direct = TY_STORE_SSD_DIRECT_OFF};
    ty_store_ssd_t *s;
    check(ty_store_ssd_new(&s, &o) == 0);
    struct seen sn = {.s = s, .bucket_size = bsize / PAGE * PAGE};
    ty_store_ssd_foreach(s, on_block, &sn);
    struct ty_store_ssd_stats st;
    ty_store_ssd_stats(s, &st);
    check(st.blocks == sn.n && st.bytes_used == sn.bytes && st.buckets == 1);
    get_each(s);
    put_and_reopen(s, &o);
    return 0;
}
