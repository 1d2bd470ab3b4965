/* An open-addressing hash map from uint64 keys to uint32 values (linear probing, keys mixed
 * with ty_hash_mix64 so small consecutive keys spread), used for block-hash and request-id
 * tables: the scheduler's prefix index and in-flight table, the simulator's KV pool model.
 *
 * Threading: none; the owner of a map is its only user. Ownership: the caller owns the struct,
 * the map its arrays (ty_u64map_fini frees them). Keys may be any value (0 included); deletion
 * shifts entries back (no tombstones). Small metadata: growing aborts on out-of-memory. */
#ifndef TYCHO_U64MAP_H
#define TYCHO_U64MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ty_u64map {
    uint64_t *keys;
    uint32_t *vals;
    uint8_t *used;
    size_t cap; /* power of two */
    size_t len;
};

void ty_u64map_init(struct ty_u64map *m);
void ty_u64map_fini(struct ty_u64map *m);
/* A pointer to the value of `key`, or NULL. The pointer is valid until the next put. */
uint32_t *ty_u64map_get(const struct ty_u64map *m, uint64_t key);
/* Insert or overwrite. */
void ty_u64map_put(struct ty_u64map *m, uint64_t key, uint32_t val);
/* Remove `key`; false when it was absent. */
bool ty_u64map_del(struct ty_u64map *m, uint64_t key);

#endif
