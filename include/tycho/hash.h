/* Prefix hashing of token blocks (DESIGN.md §4), the same chain as Mooncake's indexer:
 *
 *   local_i = XXH3_64(tokens of block i as u32 little-endian, seed)
 *   h_0     = local_0
 *   h_i     = XXH3_64(h_{i-1} as u64 LE || local_i as u64 LE, seed)
 *
 * Only full blocks are hashed. The seed derives from the model id, KV dtype, block size and an
 * optional cache_salt, so two models (or two tenants with different salts) never share blocks.
 * All functions are pure and thread-safe.
 */
#ifndef TYCHO_HASH_H
#define TYCHO_HASH_H

#include <stddef.h>
#include <stdint.h>

/* XXH3-64 of a byte string. */
uint64_t ty_hash_bytes(const void *data, size_t len, uint64_t seed);

/* The splitmix64 finaliser: spreads small or consecutive integers (table keys, indices) over
 * all 64 bits. Not a hash of data; one multiply-xorshift mix. */
static inline uint64_t ty_hash_mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Seed for prefix hashing: XXH3_64 over "model_id\0dtype\0" || block_tokens (u32 LE) ||
 * cache_salt (may be NULL or empty), with seed 0. */
uint64_t ty_hash_prefix_seed(const char *model_id, const char *kv_dtype, uint32_t block_tokens,
                             const char *cache_salt);

/* Hash the full blocks of `tokens`: writes min(n_tokens / block_tokens, max_out) chained hashes
 * to `out` and returns how many it wrote. block_tokens must be > 0. */
size_t ty_hash_prefix_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_tokens,
                             uint64_t seed, uint64_t *out, size_t max_out);

/* One step of the chain, for callers that hash incrementally: returns h_i from h_{i-1}
 * (`prev`, ignored when `first`) and the block's tokens. */
uint64_t ty_hash_prefix_step(uint64_t prev, int first, const uint32_t *block, uint32_t block_tokens,
                             uint64_t seed);

#endif
