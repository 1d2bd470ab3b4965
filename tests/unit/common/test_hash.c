#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/hash.h"

#include <string.h>
#include <xxhash.h>

/* The chain of include/tycho/hash.h written out byte by byte, independent of src/common/hash.c. */
static uint64_t spec_chain(const uint32_t *tok, size_t nblocks, uint32_t B, uint64_t seed,
                           uint64_t *out)
{
    uint64_t prev = 0;
    for (size_t i = 0; i < nblocks; i++) {
        unsigned char bytes[4 * 64];
        for (uint32_t t = 0; t < B; t++) {
            uint32_t v = tok[i * B + t];
            bytes[4 * t + 0] = (unsigned char)(v & 0xff);
            bytes[4 * t + 1] = (unsigned char)((v >> 8) & 0xff);
            bytes[4 * t + 2] = (unsigned char)((v >> 16) & 0xff);
            bytes[4 * t + 3] = (unsigned char)((v >> 24) & 0xff);
        }
        uint64_t local = XXH3_64bits_withSeed(bytes, 4 * (size_t)B, seed);
        if (i == 0) {
            prev = local;
        } else {
            unsigned char cat[16];
            for (int k = 0; k < 8; k++) {
                cat[k] = (unsigned char)(prev >> (8 * k));
                cat[8 + k] = (unsigned char)(local >> (8 * k));
            }
            prev = XXH3_64bits_withSeed(cat, 16, seed);
        }
        out[i] = prev;
    }
    return prev;
}

static void test_xxh3_known_vector(void **state)
{
    /* Published XXH3-64 of the empty input with seed 0. */
    assert_true(ty_hash_bytes("", 0, 0) == 0x2D06800538D394C2ull);
}

static void test_chain_matches_spec(void **state)
{
    enum { B = 16, NB = 5 };
    uint32_t tok[B * NB + 7];
    for (size_t i = 0; i < sizeof(tok) / sizeof(tok[0]); i++)
        tok[i] = (uint32_t)(i * 2654435761u) ^ 0x12345u;
    uint64_t seed = ty_hash_prefix_seed("stories260K", "f32", B, NULL);
    uint64_t got[NB + 2], want[NB];
    size_t n = ty_hash_prefix_blocks(tok, B * NB + 7, B, seed, got, NB + 2);
    assert_int_equal(n, NB); /* the partial block is not hashed */
    spec_chain(tok, NB, B, seed, want);
    for (int i = 0; i < NB; i++)
        assert_true(got[i] == want[i]);
    /* max_out caps the count */
    assert_int_equal(ty_hash_prefix_blocks(tok, B * NB, B, seed, got, 2), 2);
    assert_true(got[1] == want[1]);
}

static void test_prefix_property(void **state)
{
    enum { B = 8, NB = 4 };
    uint32_t a[B * NB], b[B * NB];
    for (int i = 0; i < B * NB; i++)
        a[i] = b[i] = (uint32_t)i + 1000;
    b[2 * B + 3] ^= 1; /* differ inside block 2 */
    uint64_t ha[NB], hb[NB];
    ty_hash_prefix_blocks(a, B * NB, B, 7, ha, NB);
    ty_hash_prefix_blocks(b, B * NB, B, 7, hb, NB);
    assert_true(ha[0] == hb[0] && ha[1] == hb[1]);
    assert_true(ha[2] != hb[2] && ha[3] != hb[3]); /* everything after the change differs */
    /* Same block content at another position hashes differently (the chain carries history). */
    uint32_t c[B * 2];
    for (int i = 0; i < B; i++)
        c[i] = c[B + i] = 5;
    uint64_t hc[2];
    ty_hash_prefix_blocks(c, 2 * B, B, 7, hc, 2);
    assert_true(hc[0] != hc[1]);
}

static void test_seed_isolation(void **state)
{
    uint64_t s1 = ty_hash_prefix_seed("m", "f16", 64, NULL);
    uint64_t s1b = ty_hash_prefix_seed("m", "f16", 64, "");
    uint64_t s2 = ty_hash_prefix_seed("m", "f16", 64, "tenant-a");
    uint64_t s3 = ty_hash_prefix_seed("m", "f16", 128, NULL);
    uint64_t s4 = ty_hash_prefix_seed("m", "bf16", 64, NULL);
    uint64_t s5 = ty_hash_prefix_seed("mf", "16", 64, NULL); /* field boundaries matter */
    assert_true(s1 == s1b);
    assert_true(s1 != s2 && s1 != s3 && s1 != s4 && s1 != s5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xxh3_known_vector),
        cmocka_unit_test(test_chain_matches_spec),
        cmocka_unit_test(test_prefix_property),
        cmocka_unit_test(test_seed_isolation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
