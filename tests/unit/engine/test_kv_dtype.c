/* The 16-bit KV caches (f16 and bf16): the conversions (half against the CPU's own F16C where
 * it has it; bfloat16 against its definition, round to nearest even of f32's top half), and
 * the engine on the real stories260K model with 16-bit pages against the same model with f32
 * pages: half the page bytes, the story's greedy text unchanged, logits within each type's
 * precision, KV exported from one dtype refused by a pool of another (f16 and bf16 have the
 * same page bytes), and "auto" choosing by weights. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cpu-impl.h"

#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/kvpool.h"
#include "tycho/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

static ty_model_t *model;
static const char *data_dir;

static float bits_f(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint16_t half1(float f)
{
    uint16_t h;
    ty__cpu_f32_to_half(&f, &h, 1);
    return h;
}

static void test_half_values(void **state)
{
    assert_int_equal(half1(1.0f), 0x3c00);
    assert_int_equal(half1(-2.0f), 0xc000);
    assert_int_equal(half1(0.1f), 0x2e66);      /* 0.0999755859375, the nearest half */
    assert_int_equal(half1(-0.0f), 0x8000);
    assert_int_equal(half1(65504.0f), 0x7bff);  /* the largest half */
    assert_int_equal(half1(65519.0f), 0x7bff);  /* still rounds down */
    assert_int_equal(half1(65520.0f), 0x7c00);  /* the midpoint: to even, which is inf */
    assert_int_equal(half1(1e9f), 0x7c00);
    assert_int_equal(half1(-INFINITY), 0xfc00);
    assert_int_equal(half1(5.9604644775390625e-08f), 0x0001); /* 2^-24, smallest subnormal */
    assert_int_equal(half1(2.98e-08f), 0x0000);               /* below half of it */
    assert_int_equal(half1(6.097555160522461e-05f), 0x03ff);  /* largest subnormal */
    assert_int_equal(half1(1.0009765625f + 0.00048828125f), 0x3c02); /* tie 1+1.5ulp: even */
    assert_int_equal(half1(1.00048828125f), 0x3c00);           /* tie 1+0.5ulp: even */
    uint16_t n = half1(NAN);
    assert_true((n & 0x7c00) == 0x7c00 && (n & 0x3ff));
    /* every finite half widens exactly and narrows back to itself */
    const float *h2f = ty__cpu_f16_table();
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        assert_int_equal(ty__cpu_f32_to_half1(h2f[h]), h);
        uint16_t hh = (uint16_t)h;
        float f;
        ty__cpu_half_to_f32(&hh, &f, 1);
        assert_true(f == h2f[h] || (f == 0 && h2f[h] == 0));
    }
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) static uint16_t f16c_half(float f)
{
    return (uint16_t)_mm_extract_epi16(
        _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0);
}
#endif

/* The row functions (F16C on a CPU that has it) and the scalar rule give the same bits, and
 * where the CPU has F16C both equal its conversion of the same floats. */
static void test_half_rows_match(void **state)
{
    enum { N = 1 << 16 };
    float *x = malloc(N * sizeof(float));
    uint16_t *a = malloc(N * 2), *hw = malloc(N * 2);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < 32; round++) {
        for (int i = 0; i < N; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t b = (uint32_t)(r >> 32);
            /* mostly the range KV values live in (exponents around 2^-20..2^16), some anywhere */
            if (i % 4)
                b = (b & 0x807fffffu) | ((uint32_t)(107 + (r >> 20) % 36) << 23);
            x[i] = bits_f(b);
            if (isnan(x[i]))
                x[i] = 0.5f;
        }
        ty__cpu_f32_to_half(x, a, N - 3); /* a length that leaves a scalar tail */
        for (int i = 0; i < N - 3; i++)
            if (a[i] != ty__cpu_f32_to_half1(x[i]))
                fail_msg("x=%a: row %#x, scalar %#x", (double)x[i], a[i],
                         ty__cpu_f32_to_half1(x[i]));
#if defined(__x86_64__)
        unsigned ea, eb, ec = 0, ed;
        if (__get_cpuid(1, &ea, &eb, &ec, &ed) && (ec & (1u << 29))) {
            for (int i = 0; i < N; i++)
                hw[i] = f16c_half(x[i]);
            for (int i = 0; i < N - 3; i++)
                if (a[i] != hw[i])
                    fail_msg("x=%a: ours %#x, F16C %#x", (double)x[i], a[i], hw[i]);
        }
#endif
    }
    free(x);
    free(a);
    free(hw);
}

static uint16_t bf1(float f)
{
    uint16_t h;
    ty__cpu_f32_to_bf16(&f, &h, 1);
    return h;
}

static void test_bf16_values(void **state)
{
    assert_int_equal(bf1(1.0f), 0x3f80);
    assert_int_equal(bf1(-2.0f), 0xc000);
    assert_int_equal(bf1(0.1f), 0x3dcd);           /* 0x3dcccccd: the low half rounds up */
    assert_int_equal(bf1(-0.0f), 0x8000);
    assert_int_equal(bf1(bits_f(0x3f808000)), 0x3f80); /* a tie: to the even 0x3f80 */
    assert_int_equal(bf1(bits_f(0x3f818000)), 0x3f82); /* a tie: to the even 0x3f82 */
    assert_int_equal(bf1(bits_f(0x3f808001)), 0x3f81); /* past the tie */
    assert_int_equal(bf1(bits_f(0x7f7fffff)), 0x7f80); /* f32's largest rounds to inf */
    assert_int_equal(bf1(bits_f(0x7f7f7fff)), 0x7f7f); /* bf16's largest stays */
    assert_int_equal(bf1(INFINITY), 0x7f80);
    assert_int_equal(bf1(bits_f(0x00010000)), 0x0001); /* subnormals are kept */
    uint16_t n = bf1(bits_f(0x7f800001));            /* a signalling NaN becomes quiet */
    assert_true((n & 0x7f80) == 0x7f80 && (n & 0x7f) && (n & 0x40));
    assert_true((bf1(bits_f(0xffc00000)) & 0xffc0) == 0xffc0);
    /* every bf16 widens exactly and narrows back to itself */
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t hh = (uint16_t)h, back;
        float f;
        ty__cpu_bf16_to_f32(&hh, &f, 1);
        assert_int_equal(memcmp(&f, &(uint32_t){h << 16}, 4), 0);
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f))
            continue; /* NaNs come back quiet */
        ty__cpu_f32_to_bf16(&f, &back, 1);
        assert_int_equal(back, h);
    }
}

/* The row functions (AVX2 where the CPU has it) give the scalar rule's bits on any input,
 * NaNs included, and the dot/axpy the widened values' results up to summation order. */
static void test_bf16_rows_match(void **state)
{
    enum { N = 1 << 16 };
    float *x = malloc(N * sizeof(float)), *w = malloc(N * sizeof(float));
    uint16_t *a = malloc(N * 2);
    uint64_t r = 0x2545f4914f6cdd1dull;
    for (int round = 0; round < 32; round++) {
        for (int i = 0; i < N; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t b = (uint32_t)(r >> 32);
            if (i % 4) /* mostly the range KV values live in */
                b = (b & 0x807fffffu) | ((uint32_t)(107 + (r >> 20) % 36) << 23);
            x[i] = bits_f(b);
        }
        ty__cpu_f32_to_bf16(x, a, N - 3);
        for (int i = 0; i < N - 3; i++)
            if (a[i] != ty__cpu_f32_to_bf16_1(x[i]))
                fail_msg("x=%a: row %#x, scalar %#x", (double)x[i], a[i],
                         ty__cpu_f32_to_bf16_1(x[i]));
    }
    /* dot and axpy over 100 elements (a tail after the 8-lane loops) against plain loops */
    for (int i = 0; i < 100; i++) {
        x[i] = (float)((i * 37) % 19) / 7.0f - 1.0f;
        a[i] = ty__cpu_f32_to_bf16_1((float)((i * 11) % 23) / 5.0f - 2.0f);
    }
    ty__cpu_bf16_to_f32(a, w, 100);
    double want = 0;
    for (int i = 0; i < 100; i++)
        want += (double)x[i] * w[i];
    assert_true(fabs(ty__cpu_dot_bf16(x, a, 100) - want) < 1e-4);
    float y[100] = {0};
    ty__cpu_axpy_bf16(0.5f, a, y, 100);
    for (int i = 0; i < 100; i++)
        assert_true(y[i] == 0.5f * w[i]);
    free(x);
    free(w);
    free(a);
}

static ty_engine_t *mk(const char *dtype, const ty_model_t *m)
{
    struct ty_engine_opts o = {.kv_block_tokens = 16, .max_seqs = 4, .max_ctx = 256,
                               .kv_dtype = dtype};
    ty_engine_t *e;
    assert_int_equal(ty_engine_new(&e, m, &o), 0);
    return e;
}

static void gen(ty_engine_t *e, const uint32_t *p, size_t n, uint32_t max, struct ty_gen_result *r)
{
    struct ty_gen_params gp = {.max_tokens = max};
    gp.sampling.repetition_penalty = 1;
    assert_int_equal(ty_engine_generate(e, &p, &n, 1, &gp, r, NULL, NULL), 0);
}

static void test_story_unchanged(void **state)
{
    uint32_t ids[64];
    int n = ty_tokenizer_encode(ty_model_tokenizer(model), "Once upon a time", 16, true, false,
                                ids, 64);
    assert_true(n > 1);
    ty_engine_t *e32 = mk("f32", model), *e16 = mk("f16", model), *eb = mk("bf16", model);
    ty_kvpool_t *p32 = ty_engine_pool(e32), *p16 = ty_engine_pool(e16), *pb = ty_engine_pool(eb);
    assert_int_equal(ty_kvpool_dtype(p16), TY_KV_F16);
    assert_int_equal(ty_kvpool_dtype(pb), TY_KV_BF16);
    assert_int_equal(ty_kvpool_page_bytes(p16) * 2, ty_kvpool_page_bytes(p32));
    assert_int_equal(ty_kvpool_page_bytes(pb) * 2, ty_kvpool_page_bytes(p32));
    /* prefix hashes (pool keys) differ by layout, so cached KV of one type never meets another */
    assert_int_not_equal(ty_kvpool_hash_seed(p16), ty_kvpool_hash_seed(p32));
    assert_int_not_equal(ty_kvpool_hash_seed(pb), ty_kvpool_hash_seed(p32));
    assert_int_not_equal(ty_kvpool_hash_seed(pb), ty_kvpool_hash_seed(p16));
    struct ty_gen_result a = {0};
    gen(e32, ids, (size_t)n, 120, &a);
    ty_engine_t *e16s[2] = {e16, eb};
    for (int k = 0; k < 2; k++) {
        struct ty_gen_result b = {0};
        gen(e16s[k], ids, (size_t)n, 120, &b);
        /* the story the issue names, then on: the same ids with 16-bit pages */
        assert_non_null(strstr(b.text, "there was a little girl named Lily. She loved to play "
                                       "outside in the park."));
        assert_int_equal(a.n_ids, b.n_ids);
        assert_memory_equal(a.ids, b.ids, a.n_ids * sizeof(uint32_t));
        ty_gen_result_clear(&b);
    }
    ty_gen_result_clear(&a);
    ty_engine_free(e32);
    ty_engine_free(e16);
    ty_engine_free(eb);
}

/* Logits after a 150-token prompt (several pages, prefill GEMM attention) and after decode
 * steps (the per-token attention), 16-bit pages against f32 ones: within the stored type's
 * rounding (f16 keeps 11 significant bits, bf16 8). */
static void logits_close(const char *dtype, double bound)
{
    enum { LP = 150, STEPS = 20 };
    uint32_t V = ty_model_config(model)->n_vocab, t[LP];
    t[0] = 1;
    for (int i = 1; i < LP; i++)
        t[i] = 259 + (uint32_t)((i * 37) % 253);
    ty_engine_t *e[2] = {mk("f32", model), mk(dtype, model)};
    ty_kvseq_t *s[2];
    float *l[2] = {malloc((size_t)V * 4), malloc((size_t)V * 4)};
    double worst = 0, any = 0;
    for (int k = 0; k < 2; k++) {
        assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(e[k]), &s[k]), 0);
        struct ty_batch_seq bs = {s[k], t, LP, false};
        struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
        assert_int_equal(ty_engine_forward(e[k], &b, l[k]), 0);
    }
    for (int step = 0; step <= STEPS; step++) {
        double num = 0, den = 0;
        for (uint32_t i = 0; i < V; i++) {
            double d = (double)l[0][i] - l[1][i];
            num += d * d;
            den += (double)l[0][i] * l[0][i];
            any = fabs(d) > any ? fabs(d) : any;
        }
        double rel = sqrt(num / den);
        worst = rel > worst ? rel : worst;
        uint32_t next = 259 + (uint32_t)step * 7;
        for (int k = 0; k < 2 && step < STEPS; k++) {
            struct ty_batch_seq bs = {s[k], &next, 1, false};
            struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
            assert_int_equal(ty_engine_forward(e[k], &b, l[k]), 0);
        }
    }
    printf("%s vs f32 KV: worst relative logit error %.2e, largest difference %.2e\n", dtype,
           worst, any);
    assert_true(any > 0); /* the pages really are 16-bit */
    assert_true(worst < bound);
    for (int k = 0; k < 2; k++) {
        ty_kvpool_seq_free(ty_engine_pool(e[k]), s[k]);
        ty_engine_free(e[k]);
        free(l[k]);
    }
}

static void test_logits_close(void **state)
{
    logits_close("f16", 5e-3);  /* 2^-11 per stored element */
    logits_close("bf16", 2e-2); /* 2^-8 per stored element */
}

static void test_export_dtype(void **state)
{
    uint32_t t[40];
    t[0] = 1;
    for (int i = 1; i < 40; i++)
        t[i] = 300 + (uint32_t)i;
    ty_engine_t *e16 = mk("f16", model), *o16 = mk("f16", model), *o32 = mk("f32", model);
    ty_kvseq_t *s, *d16, *d32;
    assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(e16), &s), 0);
    struct ty_batch_seq bs = {s, t, 40, false};
    struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
    float *l = malloc((size_t)ty_model_config(model)->n_vocab * 4);
    assert_int_equal(ty_engine_forward(e16, &b, l), 0);
    void *buf;
    size_t len;
    assert_int_equal(ty_kvpool_seq_export(ty_engine_pool(e16), s, &buf, &len), 0);
    assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(o16), &d16), 0);
    assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(o32), &d32), 0);
    assert_int_equal(ty_kvpool_seq_import(ty_engine_pool(o32), d32, buf, len), TY_EFORMAT);
    /* bf16 pages have the f16 page's bytes, but not its values */
    ty_engine_t *ob = mk("bf16", model);
    ty_kvseq_t *db;
    assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(ob), &db), 0);
    assert_int_equal(ty_kvpool_seq_import(ty_engine_pool(ob), db, buf, len), TY_EFORMAT);
    ty_kvpool_seq_free(ty_engine_pool(ob), db);
    ty_engine_free(ob);
    assert_int_equal(ty_kvpool_seq_import(ty_engine_pool(o16), d16, buf, len), 0);
    assert_memory_equal(ty_kvpool_k(ty_engine_pool(o16), 3, ty_kvseq_pages(d16)[1]),
                        ty_kvpool_k(ty_engine_pool(e16), 3, ty_kvseq_pages(s)[1]),
                        ty_kvpool_page_bytes(ty_engine_pool(e16)));
    free(buf);
    free(l);
    ty_kvpool_seq_free(ty_engine_pool(e16), s);
    ty_kvpool_seq_free(ty_engine_pool(o16), d16);
    ty_kvpool_seq_free(ty_engine_pool(o32), d32);
    ty_engine_free(e16);
    ty_engine_free(o16);
    ty_engine_free(o32);
}

static void test_auto_and_bad(void **state)
{
    /* stories260K is F32: auto keeps f32 */
    ty_engine_t *e = mk(NULL, model);
    assert_int_equal(ty_kvpool_dtype(ty_engine_pool(e)), TY_KV_F32);
    ty_engine_free(e);
    struct ty_engine_opts o = {.max_seqs = 1, .max_ctx = 64, .kv_dtype = "f8"};
    assert_int_equal(ty_engine_new(&e, model, &o), TY_EINVAL);
    /* an F16 model: auto takes f16, as llama.cpp's default cache type */
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/models/llama-2-tiny-random/llama-2-tiny-random.gguf",
             data_dir);
    ty_model_t *m16;
    if (ty_model_load(&m16, path, err, sizeof(err)) != 0) {
        printf("llama-2-tiny-random not loadable here (%s): auto on F16 not checked\n", err);
        return;
    }
    e = mk("auto", m16);
    assert_int_equal(ty_kvpool_dtype(ty_engine_pool(e)), TY_KV_F16);
    ty_engine_free(e);
    ty_model_free(m16);
}

/* A memory budget instead of a page count: the same bytes hold twice the f16 pages. */
static void test_memory_budget(void **state)
{
    ty_engine_t *e32, *e16, *bad;
    struct ty_engine_opts o = {.kv_block_tokens = 16, .max_seqs = 1, .max_ctx = 256,
                               .kv_bytes = 4u << 20, .kv_dtype = "f32"};
    assert_int_equal(ty_engine_new(&e32, model, &o), 0);
    o.kv_dtype = "f16";
    assert_int_equal(ty_engine_new(&e16, model, &o), 0);
    ty_kvpool_t *p32 = ty_engine_pool(e32), *p16 = ty_engine_pool(e16);
    const struct ty_model_config *c = ty_model_config(model);
    uint32_t n32 = ty_kvpool_pages_total(p32), n16 = ty_kvpool_pages_total(p16);
    assert_true(n16 == 2 * n32 || n16 == 2 * n32 + 1); /* each rounded down */
    assert_true(2ull * c->n_layers * ty_kvpool_page_bytes(p32) * ty_kvpool_pages_total(p32) <=
                4u << 20);
    assert_true(2ull * c->n_layers * ty_kvpool_page_bytes(p32) *
                    (ty_kvpool_pages_total(p32) + 1) > 4u << 20);
    o.kv_bytes = 100; /* not one page */
    assert_int_equal(ty_engine_new(&bad, model, &o), TY_EINVAL);
    o.kv_pages = 7; /* an explicit page count wins */
    assert_int_equal(ty_engine_new(&bad, model, &o), 0);
    assert_int_equal(ty_kvpool_pages_total(ty_engine_pool(bad)), 7);
    ty_engine_free(bad);
    ty_engine_free(e32);
    ty_engine_free(e16);
}

int main(void)
{
    const char *data = getenv("TYCHO_TEST_DATA");
    char path[512], err[256];
    data_dir = data ? data : "../shared";
    snprintf(path, sizeof(path), "%s/models/stories260K/stories260K.gguf", data_dir);
    if (ty_model_load(&model, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "skip: %s\n", err);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_values),    cmocka_unit_test(test_half_rows_match),
        cmocka_unit_test(test_bf16_values),    cmocka_unit_test(test_bf16_rows_match),
        cmocka_unit_test(test_story_unchanged), cmocka_unit_test(test_logits_close),
        cmocka_unit_test(test_export_dtype),   cmocka_unit_test(test_auto_and_bad),
        cmocka_unit_test(test_memory_budget),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ty_model_free(model);
    return rc;
}
