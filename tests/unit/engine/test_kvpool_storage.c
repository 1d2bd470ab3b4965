/* KV pool with backend-supplied page memory (struct ty_kvpool_storage): a fake "device"
 * storage that keeps pages in its own host blocks and counts every hook call. Checks that
 * page memory comes only from the hooks, export/import go through the copy hook (and give the
 * same bytes as a host pool), a failing copy leaves the sequence empty with its pages back,
 * bookkeeping (pages used, prefix sharing) is unchanged, and the CPU backend refuses such a
 * pool, and every layer's pages are one array. Also backend selection by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/backend.h"
#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/hash.h"
#include "tycho/kvpool.h"

#include <stdlib.h>
#include <string.h>

struct fake_dev {
    int allocs, frees, copies_in, copies_out;
    size_t live_bytes;
    int fail_copy_after; /* copies allowed before failing; < 0: never fail */
};

static void *fd_alloc(void *ctx, size_t bytes)
{
    struct fake_dev *d = ctx;
    d->allocs++;
    d->live_bytes += bytes;
    return calloc(1, bytes);
}

static void fd_free(void *ctx, void *ptr)
{
    struct fake_dev *d = ctx;
    d->frees++;
    free(ptr);
}

static int fd_copy(void *ctx, void *dst, const void *src, size_t bytes, bool to_pool)
{
    struct fake_dev *d = ctx;
    if (d->fail_copy_after == 0)
        return TY_EIO;
    if (d->fail_copy_after > 0)
        d->fail_copy_after--;
    *(to_pool ? &d->copies_in : &d->copies_out) += 1;
    memcpy(dst, src, bytes);
    return 0;
}

static ty_kvpool_t *mk_pool(struct fake_dev *d, struct ty_kvpool_storage *st)
{
    struct ty_kvpool_opts o = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .block_tokens = 4,
                               .n_pages = 8, .hash_seed = ty_hash_prefix_seed("t", "f32", 4, NULL),
                               .storage = d ? st : NULL};
    if (d)
        *st = (struct ty_kvpool_storage){d, fd_alloc, fd_free, fd_copy, "fake", false};
    ty_kvpool_t *p;
    assert_int_equal(ty_kvpool_new(&p, &o), 0);
    return p;
}

/* A 10-token sequence whose K/V element (layer l, page i, index j) is 1000 l + 100 i + j,
 * written through copy_in as a backend would. */
static ty_kvseq_t *mk_seq(ty_kvpool_t *p, const uint32_t *toks)
{
    ty_kvseq_t *s;
    assert_int_equal(ty_kvpool_seq_new(p, &s), 0);
    assert_int_equal(ty_kvpool_seq_reserve(p, s, 10), 0);
    float page[2 * 4 * 4];
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t i = 0; i < ty_kvseq_n_pages(s); i++) {
            for (int j = 0; j < 32; j++)
                page[j] = 1000.0f * l + 100.0f * i + j;
            assert_int_equal(ty_kvpool_copy_in(p, ty_kvpool_k(p, l, ty_kvseq_pages(s)[i]), page,
                                               sizeof(page)), 0);
            page[0] = -page[0];
            assert_int_equal(ty_kvpool_copy_in(p, ty_kvpool_v(p, l, ty_kvseq_pages(s)[i]), page,
                                               sizeof(page)), 0);
        }
    assert_int_equal(ty_kvpool_seq_commit(p, s, toks, 10), 0);
    return s;
}

static void test_storage_hooks(void **state)
{
    struct fake_dev d = {.fail_copy_after = -1};
    struct ty_kvpool_storage st;
    uint32_t toks[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    ty_kvpool_t *dev = mk_pool(&d, &st), *host = mk_pool(NULL, NULL);
    assert_false(ty_kvpool_is_host(dev));
    assert_true(ty_kvpool_is_host(host));
    assert_int_equal(d.allocs, 4); /* K and V of 2 layers */
    assert_int_equal(d.live_bytes, 4 * 8 * ty_kvpool_page_bytes(dev));
    ty_kvseq_t *a = mk_seq(dev, toks), *h = mk_seq(host, toks);
    assert_int_equal(ty_kvpool_pages_used(dev), 3);
    void *bd, *bh;
    size_t ld, lh;
    int before = d.copies_out;
    assert_int_equal(ty_kvpool_seq_export(dev, a, &bd, &ld), 0);
    assert_int_equal(d.copies_out - before, 2 * 2 * 3); /* layers x (K, V) x pages */
    assert_int_equal(ty_kvpool_seq_export(host, h, &bh, &lh), 0);
    assert_int_equal(ld, lh);
    assert_memory_equal(bd, bh, ld); /* same flat bytes for host and device pools */
    /* prefix sharing unchanged: 2 full blocks of a are found again */
    ty_kvseq_t *b;
    assert_int_equal(ty_kvpool_seq_new(dev, &b), 0);
    assert_int_equal(ty_kvpool_seq_match_prefix(dev, b, toks, 10), 8);
    assert_int_equal(ty_kvpool_pages_used(dev), 3);
    ty_kvpool_seq_free(dev, b);
    /* import into a second device pool through copy_in; a failing copy leaves it empty */
    struct fake_dev d2 = {.fail_copy_after = 5};
    struct ty_kvpool_storage st2;
    ty_kvpool_t *dev2 = mk_pool(&d2, &st2);
    ty_kvseq_t *c;
    assert_int_equal(ty_kvpool_seq_new(dev2, &c), 0);
    assert_int_equal(ty_kvpool_seq_import(dev2, c, bh, lh), TY_EIO);
    assert_int_equal(ty_kvseq_n_tokens(c), 0);
    assert_int_equal(ty_kvpool_pages_used(dev2), 0);
    d2.fail_copy_after = -1;
    assert_int_equal(ty_kvpool_seq_import(dev2, c, bh, lh), 0);
    assert_int_equal(d2.copies_in, 5 + 12);
    float got[32];
    assert_int_equal(ty_kvpool_copy_out(dev2, got, ty_kvpool_v(dev2, 1, ty_kvseq_pages(c)[2]),
                                        sizeof(got)), 0);
    assert_float_equal(got[0], -1200.0f, 0);
    assert_float_equal(got[7], 1207.0f, 0);
    /* the CPU backend cannot run on device pages */
    ty_backend_t *cpu;
    assert_int_equal(ty_backend_cpu_new(&cpu, NULL), 0);
    struct ty_kvpool_storage none;
    assert_int_equal(ty_backend_kv_storage(cpu, &none), 0);
    assert_null(none.alloc);
    assert_true(ty_backend_healthy(cpu));
    ty_backend_free(cpu);
    free(bd);
    free(bh);
    ty_kvpool_seq_free(dev, a);
    ty_kvpool_seq_free(host, h);
    ty_kvpool_seq_free(dev2, c);
    ty_kvpool_free(dev);
    ty_kvpool_free(dev2);
    ty_kvpool_free(host);
    assert_int_equal(d.frees, 4);
    assert_int_equal(d2.frees, 4);
}

/* Every layer's K and V are arrays of pages, host or backend memory alike: page i's chunk is
 * page 0's plus i page_bytes (a decode node sends its KV destination as a base per layer and
 * one stride, tycho.proto KvDestination). */
static void test_pages_affine(void **state)
{
    (void)state;
    struct fake_dev d = {.fail_copy_after = -1};
    struct ty_kvpool_storage st;
    for (int dev = 0; dev < 2; dev++) {
        ty_kvpool_t *p = mk_pool(dev ? &d : NULL, &st);
        size_t pb = ty_kvpool_page_bytes(p);
        for (uint32_t l = 0; l < 2; l++) {
            uintptr_t k0 = (uintptr_t)ty_kvpool_k(p, l, 0), v0 = (uintptr_t)ty_kvpool_v(p, l, 0);
            for (uint32_t i = 0; i < ty_kvpool_pages_total(p); i++) {
                assert_true((uintptr_t)ty_kvpool_k(p, l, i) == k0 + i * pb);
                assert_true((uintptr_t)ty_kvpool_v(p, l, i) == v0 + i * pb);
            }
        }
        ty_kvpool_free(p);
    }
}

static void test_bad_storage(void **state)
{
    struct fake_dev d = {.fail_copy_after = -1};
    struct ty_kvpool_storage st = {&d, fd_alloc, fd_free, NULL, "no copy", false};
    struct ty_kvpool_opts o = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .n_pages = 2,
                               .storage = &st};
    ty_kvpool_t *p;
    assert_int_equal(ty_kvpool_new(&p, &o), TY_EINVAL);
    assert_int_equal(d.allocs, 0);
}

/* Host memory from the caller (the node's shared memory): no copy hook needed, the pool is a
 * host pool (the CPU forward reads it), copies are plain, and every page array goes back to
 * the caller's free hook. */
static void test_host_storage(void **state)
{
    struct fake_dev d = {.fail_copy_after = -1};
    struct ty_kvpool_storage st = {&d, fd_alloc, fd_free, NULL, "shared memory", true};
    struct ty_kvpool_opts o = {.n_layers = 3, .n_kv_heads = 1, .head_dim = 4, .n_pages = 2,
                               .storage = &st};
    ty_kvpool_t *p;
    assert_int_equal(ty_kvpool_new(&p, &o), 0);
    assert_int_equal(d.allocs, 6);
    assert_true(ty_kvpool_is_host(p));
    float in[4] = {1, 2, 3, 4}, out[4] = {0};
    assert_int_equal(ty_kvpool_copy_in(p, ty_kvpool_k(p, 2, 1), in, sizeof(in)), 0);
    assert_int_equal(ty_kvpool_copy_out(p, out, ty_kvpool_k(p, 2, 1), sizeof(out)), 0);
    assert_memory_equal(in, out, sizeof(in));
    assert_int_equal(d.copies_in + d.copies_out, 0);
    ty_kvpool_free(p);
    assert_int_equal(d.frees, 6);
}

static void test_backend_by_name(void **state)
{
    ty_backend_t *b = NULL;
    assert_int_equal(ty_backend_new_by_name(&b, "tpu", NULL, NULL), TY_EINVAL);
    assert_null(b);
    assert_int_equal(ty_backend_new_by_name(&b, "cpu", NULL, NULL), 0);
    assert_string_equal(ty_backend_name(b), "cpu");
    ty_backend_free(b);
    int rc = ty_backend_new_by_name(&b, "cuda", NULL, NULL);
#ifdef TY_HAVE_CUDA
    /* a CUDA build: a device here, or a clear "no device" */
    assert_true(rc == 0 || rc == TY_ENODEV);
    if (rc == 0) {
        assert_string_equal(ty_backend_name(b), "cuda");
        assert_true(ty_backend_healthy(b));
        ty_backend_free(b);
    }
    struct ty_backend_cuda_opts bad = {.weights = "int4"};
    assert_int_equal(ty_backend_cuda_new(&b, &bad), TY_EINVAL);
#else
    assert_int_equal(rc, TY_ENOTSUP);
    assert_null(b);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_storage_hooks),
        cmocka_unit_test(test_pages_affine),
        cmocka_unit_test(test_bad_storage), cmocka_unit_test(test_host_storage),
        cmocka_unit_test(test_backend_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
