/* Offset allocator over one pool node's DRAM segment (src/store/alloc.c).
 *
 * Hands out aligned [offset, offset+len) ranges of a fixed-size arena, first fit over an
 * address-ordered free list that coalesces neighbours on free. It only does arithmetic: it never
 * touches the arena's memory, so the master can run one per node it places blocks on.
 * Threading: none inside; one thread at a time per allocator. Ownership: the caller owns the
 * allocator; ranges are plain numbers.
 */
#ifndef TYCHO_STORE_ALLOC_H
#define TYCHO_STORE_ALLOC_H

#include <stdint.h>

typedef struct ty_store_alloc ty_store_alloc_t;

/* Create an allocator of `size` bytes handing out multiples of `align` (a power of two; 0: 64).
 * Returns 0 and *out, or TY_EINVAL (size 0 or smaller than align, align not a power of two). */
int ty_store_alloc_new(ty_store_alloc_t **out, uint64_t size, uint64_t align);

/* Free the allocator. NULL: no-op. */
void ty_store_alloc_free(ty_store_alloc_t *a);

/* Reserve `len` bytes (rounded up to the alignment). Returns 0 and *offset, TY_EINVAL for len 0,
 * or TY_ENOCAPACITY when no free range is large enough. */
int ty_store_alloc_take(ty_store_alloc_t *a, uint64_t len, uint64_t *offset);

/* Reserve exactly [offset, offset+len) (used when a master rebuilds from announcements).
 * Returns 0, TY_EINVAL (misaligned or outside the arena) or TY_EBUSY (overlaps a used range). */
int ty_store_alloc_take_at(ty_store_alloc_t *a, uint64_t offset, uint64_t len);

/* Release a range returned by take/take_at (same len). Returns 0 or TY_EINVAL when the range is
 * outside the arena or (partly) free already. */
int ty_store_alloc_give(ty_store_alloc_t *a, uint64_t offset, uint64_t len);

/* Bytes in use (after rounding), the arena size, and the number of free ranges. */
uint64_t ty_store_alloc_used(const ty_store_alloc_t *a);
uint64_t ty_store_alloc_size(const ty_store_alloc_t *a);

#endif
