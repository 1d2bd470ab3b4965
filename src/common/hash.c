#include "tycho/hash.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

uint64_t ty_hash_bytes(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

static void put_u64_le(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

uint64_t ty_hash_prefix_seed(const char *model_id, const char *kv_dtype, uint32_t block_tokens,
                             const char *cache_salt)
{
    XXH3_state_t st;
    XXH3_64bits_reset_withSeed(&st, 0);
    XXH3_64bits_update(&st, model_id, strlen(model_id) + 1);
    XXH3_64bits_update(&st, kv_dtype, strlen(kv_dtype) + 1);
    unsigned char b[4] = {(unsigned char)block_tokens, (unsigned char)(block_tokens >> 8),
                          (unsigned char)(block_tokens >> 16), (unsigned char)(block_tokens >> 24)};
    XXH3_64bits_update(&st, b, 4);
    if (cache_salt && cache_salt[0])
        XXH3_64bits_update(&st, cache_salt, strlen(cache_salt));
    return XXH3_64bits_digest(&st);
}

static uint64_t block_local(const uint32_t *block, uint32_t n, uint64_t seed)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return XXH3_64bits_withSeed(block, (size_t)n * 4, seed);
#else
    XXH3_state_t st;
    XXH3_64bits_reset_withSeed(&st, seed);
    for (uint32_t i = 0; i < n; i++) {
        unsigned char b[4] = {(unsigned char)block[i], (unsigned char)(block[i] >> 8),
                              (unsigned char)(block[i] >> 16), (unsigned char)(block[i] >> 24)};
        XXH3_64bits_update(&st, b, 4);
    }
    return XXH3_64bits_digest(&st);
#endif
}

uint64_t ty_hash_prefix_step(uint64_t prev, int first, const uint32_t *block, uint32_t block_tokens,
                             uint64_t seed)
{
    uint64_t local = block_local(block, block_tokens, seed);
    if (first)
        return local;
    unsigned char buf[16];
    put_u64_le(buf, prev);
    put_u64_le(buf + 8, local);
    return XXH3_64bits_withSeed(buf, sizeof(buf), seed);
}

size_t ty_hash_prefix_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_tokens,
                             uint64_t seed, uint64_t *out, size_t max_out)
{
    size_t n = n_tokens / block_tokens;
    if (n > max_out)
        n = max_out;
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
        h = ty_hash_prefix_step(h, i == 0, tokens + i * block_tokens, block_tokens, seed);
        out[i] = h;
    }
    return n;
}
