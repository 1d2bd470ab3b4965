/* SSD tier of a pool node (src/store/ssd.c): KV blocks in append-only bucket files.
 *
 * Blocks are appended as self-describing records (header with key, length and the block's
 * XXH3-64, then key and bytes, padded to 4 KiB) to `bucket-NNNNNNNN.bkt` files written with
 * io_uring, O_DIRECT where the filesystem allows it (else buffered, with a logged warning). A
 * sealed bucket gets an index file `bucket-NNNNNNNN.idx` beside it. Every read is checked
 * against the block's checksum: a block whose bytes changed on disk is dropped, never returned.
 * A remove appends a tombstone record (one page) the same way. On open the directory is
 * rescanned (index files, or the records of a bucket without one), oldest bucket first, so
 * blocks and removes survive a restart. When the tier is full the oldest buckets are deleted.
 *
 * Threading: all functions are safe from any thread (one mutex; I/O happens under it).
 * Ownership: the caller owns the tier object and its buffers; keys are copied.
 */
#ifndef TYCHO_STORE_SSD_H
#define TYCHO_STORE_SSD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ty_store_ssd ty_store_ssd_t;

enum ty_store_ssd_direct {
    TY_STORE_SSD_DIRECT_AUTO = 0, /* O_DIRECT when the filesystem supports it */
    TY_STORE_SSD_DIRECT_ON = 1,   /* O_DIRECT or fail with TY_ENOTSUP */
    TY_STORE_SSD_DIRECT_OFF = 2,  /* buffered I/O */
};

struct ty_store_ssd_opts {
    const char *dir;       /* created if missing */
    uint64_t capacity;     /* bytes of bucket files at most; > 0 */
    uint64_t bucket_bytes; /* a bucket is sealed past this size; 0: 64 MiB */
    enum ty_store_ssd_direct direct;
};

/* Open (or create) the tier in opts->dir and rescan what is there. Returns 0 and *out,
 * TY_EINVAL (bad options), TY_ENOTSUP (DIRECT_ON on a filesystem without O_DIRECT), -errno. */
int ty_store_ssd_new(ty_store_ssd_t **out, const struct ty_store_ssd_opts *opts);

/* Seal the open bucket (writes its index) and close. NULL: no-op. */
void ty_store_ssd_free(ty_store_ssd_t *s);

/* Append a block. Returns 0 and *loc (an opaque location), TY_EEXIST (key stored already),
 * TY_EINVAL, TY_EFBIG (larger than the tier), or -errno. May delete the oldest buckets. */
int ty_store_ssd_put(ty_store_ssd_t *s, const char *key, const void *data, uint64_t len,
                     uint64_t checksum, uint64_t *loc);

/* Read the block of `key` into buf (cap bytes). Returns 0 and *len, TY_ENOTFOUND, TY_ENOSPC
 * (cap too small), TY_ECHECKSUM (bytes on disk do not match: the block is dropped), -errno. */
int ty_store_ssd_get(ty_store_ssd_t *s, const char *key, void *buf, uint64_t cap, uint64_t *len);

/* Remove a block for good: appends a tombstone (4 KiB, counted against the capacity; may delete
 * the oldest buckets) so that a restart does not bring the block back, then forgets it. Its space
 * returns when its bucket is deleted. Returns 0, TY_EINVAL, TY_ENOTFOUND (no such block: nothing
 * written), or the write's error (TY_EIO, -errno: the block is still held; after a crash it
 * may come back or not). */
int ty_store_ssd_remove(ty_store_ssd_t *s, const char *key);

/* Call cb for every block held (for announcements); stops early when cb returns non-zero. */
typedef int (*ty_store_ssd_block_cb)(const char *key, uint64_t loc, uint64_t len, uint64_t checksum,
                                     void *arg);
int ty_store_ssd_foreach(ty_store_ssd_t *s, ty_store_ssd_block_cb cb, void *arg);

/* Move up to cap keys of blocks dropped since the last call (bucket deleted for space, checksum
 * failure) into keys[] (each TY_STORE_KEY_MAX + 1 bytes). Returns how many. */
size_t ty_store_ssd_take_dropped(ty_store_ssd_t *s, char (*keys)[256], size_t cap);

struct ty_store_ssd_stats {
    uint64_t blocks, bytes_used, buckets;
    uint64_t checksum_errors, buckets_evicted, blocks_rescanned;
    bool direct; /* O_DIRECT in use */
};
void ty_store_ssd_stats(ty_store_ssd_t *s, struct ty_store_ssd_stats *out);

#endif
