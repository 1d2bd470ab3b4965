/* Arena: bump allocation from a chain of blocks, freed all at once (nginx pools).
 *
 * Use one arena per request or per parse; nothing allocated from it is freed alone. An arena is
 * not thread-safe: one thread owns it. ty_arena_alloc() aborts on out-of-memory (for small
 * metadata); ty_arena_try_alloc() returns NULL instead (for request bodies and other large or
 * attacker-sized data). Allocations are 16-byte aligned.
 */
#ifndef TYCHO_ARENA_H
#define TYCHO_ARENA_H

#include <stddef.h>

typedef struct ty_arena ty_arena_t;

/* Create an arena whose blocks are `block_size` bytes (0: 16 KiB); aborts on OOM. */
ty_arena_t *ty_arena_new(size_t block_size);

/* Free the arena and everything allocated from it. NULL is a no-op. */
void ty_arena_free(ty_arena_t *a);

/* Release all allocations but keep the first block for reuse. */
void ty_arena_reset(ty_arena_t *a);

void *ty_arena_alloc(ty_arena_t *a, size_t size);
void *ty_arena_try_alloc(ty_arena_t *a, size_t size);
void *ty_arena_calloc(ty_arena_t *a, size_t n, size_t size);

/* Copy of `s` (NUL-terminated) or of its first `n` bytes, NUL-terminated, in the arena. */
char *ty_arena_strdup(ty_arena_t *a, const char *s);
char *ty_arena_strndup(ty_arena_t *a, const char *s, size_t n);

/* Bytes handed out since creation or the last reset (for accounting and tests). */
size_t ty_arena_used(const ty_arena_t *a);

#endif
