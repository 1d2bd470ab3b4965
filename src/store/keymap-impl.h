/* A string-keyed chained hash table shared by the pool node's DRAM block index (node.c) and the
 * SSD tier's key map (ssd.c). Intrusive: an entry embeds struct ty__store_kent as its first
 * member and is converted back with a cast; the table owns only its bucket array, the caller
 * allocates, links and frees entries and their keys. Not thread-safe: the owner's lock or loop.
 */
#ifndef TYCHO_STORE_KEYMAP_IMPL_H
#define TYCHO_STORE_KEYMAP_IMPL_H

#include <stddef.h>
#include <stdint.h>

struct ty__store_kent {
    char *key;
    uint64_t hash; /* XXH3 of key */
    struct ty__store_kent *next;
};

struct ty__store_kmap {
    struct ty__store_kent **v; /* cap buckets, a power of two */
    size_t cap;
    size_t n; /* entries linked; the caller counts them in and out */
};

/* 1024 buckets. Small metadata: aborts on out-of-memory, as does growing. */
void ty__store_kmap_init(struct ty__store_kmap *m);
/* Frees the buckets, not the entries. */
void ty__store_kmap_fini(struct ty__store_kmap *m);
/* The link that holds `key`'s entry, or the empty link where it would go; *hash gets its hash.
 * Valid until the table grows. */
struct ty__store_kent **ty__store_kmap_slot(const struct ty__store_kmap *m, const char *key,
                                            uint64_t *hash);
/* Room for one more entry: doubles the buckets once n reaches cap. Call before the slot of an
 * insertion. */
void ty__store_kmap_reserve(struct ty__store_kmap *m);

#endif
