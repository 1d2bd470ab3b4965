/* Engine on the real stories260K model with small pages (B = 16, so prompts span several
 * blocks): batching, chunked prefill, prefix sharing and KV export/import. The reference in
 * each case is the same model run the plain way: one sequence alone, unshared, unchunked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/kvpool.h"
#include "tycho/sampling.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 16
static ty_model_t *model;
static uint32_t V;

static ty_engine_t *mk_engine(uint32_t batch_tokens, bool no_share)
{
    struct ty_engine_opts o = {.kv_block_tokens = B, .max_seqs = 10, .max_ctx = 512,
                               .max_batch_tokens = batch_tokens, .no_prefix_sharing = no_share};
    ty_engine_t *e;
    assert_int_equal(ty_engine_new(&e, model, &o), 0);
    return e;
}

/* A deterministic prompt of `n` in-vocabulary ids starting with BOS. */
static void mk_prompt(uint32_t *p, size_t n, uint32_t salt)
{
    p[0] = 1;
    for (size_t i = 1; i < n; i++)
        p[i] = 259 + (uint32_t)((i * 37 + salt * 101) % 253);
}

static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static struct ty_gen_params greedy(uint32_t n)
{
    struct ty_gen_params p = {.max_tokens = n, .ignore_eos = true};
    p.sampling.repetition_penalty = 1;
    return p;
}

static void test_batch_equals_alone(void **state)
{
    enum { N = 8, GEN = 40 };
    uint32_t prompts[N][80];
    size_t lens[N];
    const uint32_t *pp[N];
    struct ty_gen_result alone[N], together[N];
    struct ty_gen_params p = greedy(GEN);
    for (int i = 0; i < N; i++) {
        lens[i] = 3 + (size_t)i * 9; /* 3 .. 66 tokens: from one block to five */
        mk_prompt(prompts[i], lens[i], (uint32_t)i);
        pp[i] = prompts[i];
        ty_engine_t *e = mk_engine(512, true);
        assert_int_equal(ty_engine_generate(e, &pp[i], &lens[i], 1, &p, &alone[i], NULL, NULL), 0);
        ty_engine_free(e);
    }
    ty_engine_t *e = mk_engine(512, true);
    assert_int_equal(ty_engine_generate(e, pp, lens, N, &p, together, NULL, NULL), 0);
    assert_int_equal(ty_kvpool_pages_used(ty_engine_pool(e)), 0); /* all released */
    ty_engine_free(e);
    for (int i = 0; i < N; i++) {
        assert_int_equal(together[i].n_ids, GEN);
        assert_memory_equal(alone[i].ids, together[i].ids, GEN * sizeof(uint32_t));
        ty_gen_result_clear(&alone[i]);
        ty_gen_result_clear(&together[i]);
    }
}

/* Prefill `n` tokens into a fresh sequence, logits for every new token into `out`. */
static ty_kvseq_t *prefill(ty_engine_t *e, const uint32_t *t, size_t n, float *out, int *cached)
{
    ty_kvseq_t *s;
    assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(e), &s), 0);
    int c = ty_kvpool_seq_match_prefix(ty_engine_pool(e), s, t, n);
    assert_true(c >= 0);
    struct ty_batch_seq bs = {s, t + c, (uint32_t)(n - (size_t)c), true};
    struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
    assert_int_equal(ty_engine_forward(e, &b, out), 0);
    if (cached)
        *cached = c;
    return s;
}

/* The index of the largest logit, the lowest of equal ones (a plain loop, the reference). */
static uint32_t ref_argmax(const float *l)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < V; i++)
        best = l[i] > l[best] ? i : best;
    return best;
}

/* The batch test_greedy_ids and test_draws run, on a fresh engine of `tokens` per forward call:
 * c's first 11 tokens first (its 12th is then a one-token step), then a (30 tokens, a row for
 * every one), b (45) and c's 12th in one batch with `picks`' ids or draws; rows into logits
 * (scratch: the first call's). */
static void mixed_batch(uint32_t tokens, const uint32_t *a, const uint32_t *b, const uint32_t *c,
                        const struct ty_batch *picks, float *logits, float *scratch)
{
    ty_engine_t *e = mk_engine(tokens, true);
    ty_kvseq_t *s[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(e), &s[i]), 0);
    struct ty_batch_seq pre = {s[2], c, 11, false};
    struct ty_batch pb = {.seqs = &pre, .n_seqs = 1};
    assert_int_equal(ty_engine_forward(e, &pb, scratch), 0);
    struct ty_batch_seq bs[3] = {{s[0], a, 30, true}, {s[1], b, 45, false},
                                 {s[2], c + 11, 1, false}};
    struct ty_batch batch = *picks;
    batch.seqs = bs;
    batch.n_seqs = 3;
    assert_int_equal(ty_engine_forward(e, &batch, logits), 0);
    for (int i = 0; i < 3; i++)
        ty_kvpool_seq_free(ty_engine_pool(e), s[i]);
    ty_engine_free(e);
}

/* Greedy rows (struct ty_batch.ids): a batch of a prompt with logits for every token, a
 * prompt and a one-token step gives, in ids, the argmax of each logits row the same batch
 * gives without ids; also when the engine splits the batch over forward calls of 7 tokens
 * (the rows are then picked from its scratch rows). */
static void test_greedy_ids(void **state)
{
    uint32_t a[30], b[45], c[12];
    mk_prompt(a, 30, 1), mk_prompt(b, 45, 2), mk_prompt(c, 12, 3);
    enum { ROWS = 30 + 1 + 1 };
    for (int k = 0; k < 2; k++) {
        uint32_t tokens = k ? 7 : 512;
        float *want = malloc((size_t)ROWS * V * sizeof(float));
        float *scratch = malloc((size_t)ROWS * V * sizeof(float));
        uint32_t ids[ROWS];
        memset(ids, 0xff, sizeof(ids));
        mixed_batch(tokens, a, b, c, &(struct ty_batch){0}, want, scratch);
        mixed_batch(tokens, a, b, c, &(struct ty_batch){.ids = ids}, scratch, scratch);
        for (uint32_t r = 0; r < ROWS; r++)
            assert_int_equal(ids[r], ref_argmax(want + (size_t)r * V));
        free(want);
        free(scratch);
    }
}

/* Draws (struct ty_batch.draws): the same batch as test_greedy_ids, each row drawn with its own
 * prepared draw (penalties, bias, a ban, temperature and the filters, log-probabilities); in
 * samples, what ty_sampler_sample gives on the logits row the batch gives without draws, the
 * same sampler state on both sides. Split over calls of 7 tokens the rows of a call that also
 * computes an earlier chunk come back TY_SAMPLE_NOT_DRAWN with the row in logits, for the
 * caller's ty_sampler_draw. */
static void test_draws(void **state)
{
    uint32_t a[30], b[45], c[12];
    mk_prompt(a, 30, 1), mk_prompt(b, 45, 2), mk_prompt(c, 12, 3);
    enum { ROWS = 30 + 1 + 1 };
    for (int k = 0; k < 2; k++) {
        uint32_t tokens = k ? 7 : 512;
        float *want = malloc((size_t)ROWS * V * sizeof(float));
        float *got = malloc((size_t)ROWS * V * sizeof(float));
        struct ty_sample samples[ROWS], ref;
        struct ty_row_draw draws[ROWS];
        struct ty_logit_adj adj[ROWS * 8];
        ty_sampler_t *mine[ROWS], *theirs[ROWS];
        uint32_t used = 0;
        for (uint32_t r = 0; r < ROWS; r++) {
            struct ty_sampling_params p = {.temperature = r % 4 ? 0.7f + 0.1f * (r % 3) : 0,
                                           .top_k = r % 5 == 1 ? 20 : 0,
                                           .top_p = r % 5 == 2 ? 0.8f : 1,
                                           .min_p = r % 5 == 3 ? 0.1f : 0,
                                           .seed = r + 1,
                                           .repetition_penalty = 1.2f,
                                           .n_logprobs = r % 2 ? 3 : 0,
                                           .n_logit_bias = 1};
            p.logit_bias[0] = (struct ty_logit_bias){r % V, 1.5f};
            assert_int_equal(ty_sampler_new(&mine[r], &p, V), 0);
            assert_int_equal(ty_sampler_new(&theirs[r], &p, V), 0);
            uint32_t ban = (r * 7) % V, n_adj;
            ty_sampler_ban_next(mine[r], &ban, 1);
            ty_sampler_ban_next(theirs[r], &ban, 1);
            assert_int_equal(ty_sampler_prepare(mine[r], a, 5, &draws[r], adj + used, 8, &n_adj),
                             0);
            draws[r].adj_begin = used;
            used += n_adj;
        }
        memset(samples, 0xff, sizeof(samples));
        mixed_batch(tokens, a, b, c, &(struct ty_batch){0}, want, got);
        mixed_batch(tokens, a, b, c,
                    &(struct ty_batch){.draws = draws, .adj = adj, .samples = samples}, got, got);
        uint32_t left = 0;
        for (uint32_t r = 0; r < ROWS; r++) {
            if (samples[r].id == TY_SAMPLE_NOT_DRAWN) { /* the caller's draw, on its row */
                left++;
                ty_sampler_draw(mine[r], got + (size_t)r * V, &draws[r], adj + draws[r].adj_begin,
                                &samples[r]);
            }
            assert_int_equal(ty_sampler_sample(theirs[r], want + (size_t)r * V, a, 5, &ref), 0);
            assert_int_equal(samples[r].id, ref.id);
            assert_true(samples[r].n_top == ref.n_top && samples[r].logprob == ref.logprob);
            for (uint32_t j = 0; j < ref.n_top; j++)
                assert_int_equal(samples[r].top[j].id, ref.top[j].id);
            ty_sampler_free(mine[r]);
            ty_sampler_free(theirs[r]);
        }
        /* whole calls: every row drawn by the engine; split: the calls with earlier chunks */
        assert_true(k ? left > 0 : left == 0);
        free(want);
        free(got);
    }
}

static void test_chunked_prefill(void **state)
{
    uint32_t t[100];
    mk_prompt(t, 100, 3);
    float *a = malloc(100 * (size_t)V * sizeof(float)), *b = malloc(100 * (size_t)V * sizeof(float));
    ty_engine_t *e1 = mk_engine(512, true), *e2 = mk_engine(7, true);
    ty_kvseq_t *s1 = prefill(e1, t, 100, a, NULL), *s2 = prefill(e2, t, 100, b, NULL);
    assert_true(rel_err(b, a, 100 * (size_t)V) <= 1e-5);
    ty_kvpool_seq_free(ty_engine_pool(e1), s1);
    ty_kvpool_seq_free(ty_engine_pool(e2), s2);
    ty_engine_free(e1);
    ty_engine_free(e2);
    free(a);
    free(b);
}

static void test_prefix_sharing(void **state)
{
    enum { SHARED = 3 * B, LA = SHARED + 5, LB = SHARED + 9 };
    uint32_t ta[LA], tb[LB];
    mk_prompt(ta, LA, 5);
    memcpy(tb, ta, SHARED * sizeof(uint32_t));
    for (int i = SHARED; i < LB; i++)
        tb[i] = 300 + (uint32_t)i; /* a different tail */
    float *la = malloc(LA * (size_t)V * 4), *lb = malloc(LB * (size_t)V * 4);
    float *ref = malloc(LB * (size_t)V * 4);
    ty_engine_t *e = mk_engine(512, false), *u = mk_engine(512, true);
    int cached = -1;
    ty_kvseq_t *sa = prefill(e, ta, LA, la, &cached);
    assert_int_equal(cached, 0);
    ty_kvseq_t *sb = prefill(e, tb, LB, lb, &cached);
    assert_int_equal(cached, SHARED);
    uint32_t shared_pages = ty_kvpool_pages_used(ty_engine_pool(e));
    ty_kvseq_t *ua = prefill(u, ta, LA, la, NULL), *ub = prefill(u, tb, LB, ref, NULL);
    uint32_t unshared_pages = ty_kvpool_pages_used(ty_engine_pool(u));
    assert_int_equal(unshared_pages - shared_pages, 3);
    /* B's logits after the shared blocks equal the unshared run's */
    assert_true(rel_err(lb, ref + (size_t)SHARED * V, (LB - SHARED) * (size_t)V) <= 1e-5);
    /* freeing A keeps the shared pages alive for B */
    ty_kvpool_seq_free(ty_engine_pool(e), sa);
    assert_int_equal(ty_kvpool_pages_used(ty_engine_pool(e)), ty_kvseq_n_pages(sb));
    ty_kvpool_seq_free(ty_engine_pool(e), sb);
    assert_int_equal(ty_kvpool_pages_used(ty_engine_pool(e)), 0);
    ty_kvpool_seq_free(ty_engine_pool(u), ua);
    ty_kvpool_seq_free(ty_engine_pool(u), ub);
    ty_engine_free(e);
    ty_engine_free(u);
    free(la);
    free(lb);
    free(ref);
}

static uint32_t argmax(const float *l)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < V; i++)
        b = l[i] > l[b] ? i : b;
    return b;
}

/* Greedy decode `n` tokens on sequence s, starting from token `next`. */
static void decode(ty_engine_t *e, ty_kvseq_t *s, uint32_t next, uint32_t *out, int n)
{
    float *l = malloc(V * sizeof(float));
    for (int i = 0; i < n; i++) {
        struct ty_batch_seq bs = {s, &next, 1, false};
        struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
        assert_int_equal(ty_engine_forward(e, &b, l), 0);
        out[i] = next = argmax(l);
    }
    free(l);
}

static void test_export_import(void **state)
{
    enum { LP = 37, GEN = 30 };
    uint32_t t[LP], ref[GEN], got[GEN];
    mk_prompt(t, LP, 9);
    float *l = malloc(LP * (size_t)V * 4);
    ty_engine_t *e1 = mk_engine(512, false), *e2 = mk_engine(512, false);
    ty_kvseq_t *s1 = prefill(e1, t, LP, l, NULL);
    uint32_t first = argmax(l + (size_t)(LP - 1) * V);
    /* per-layer ranges cover every page, K then V */
    struct ty_kv_range r[16];
    assert_int_equal(ty_kvpool_seq_layer_ranges(ty_engine_pool(e1), s1, 2, r, 16),
                     2 * ((LP + B - 1) / B));
    void *buf;
    size_t len;
    assert_int_equal(ty_kvpool_seq_export(ty_engine_pool(e1), s1, &buf, &len), 0);
    decode(e1, s1, first, ref, GEN);
    ty_kvseq_t *s2;
    assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(e2), &s2), 0);
    assert_int_equal(ty_kvpool_seq_import(ty_engine_pool(e2), s2, buf, len - 4), TY_EFORMAT);
    assert_int_equal(ty_kvpool_seq_import(ty_engine_pool(e2), s2, buf, len), 0);
    assert_int_equal(ty_kvseq_n_tokens(s2), LP);
    decode(e2, s2, first, got, GEN);
    assert_memory_equal(ref, got, sizeof(ref));
    free(buf);
    free(l);
    ty_kvpool_seq_free(ty_engine_pool(e1), s1);
    ty_kvpool_seq_free(ty_engine_pool(e2), s2);
    ty_engine_free(e1);
    ty_engine_free(e2);
}

static void test_bad_batches(void **state)
{
    ty_engine_t *e = mk_engine(512, true);
    ty_kvseq_t *s;
    float *l = malloc(V * sizeof(float));
    uint32_t bad = 100000, ok[600];
    mk_prompt(ok, 600, 1);
    assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(e), &s), 0);
    struct ty_batch_seq bs = {s, &bad, 1, false};
    struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
    assert_int_equal(ty_engine_forward(e, &b, l), TY_EINVAL); /* token out of vocabulary */
    bs = (struct ty_batch_seq){s, ok, 600, false};
    assert_int_equal(ty_engine_forward(e, &b, l), TY_ERANGE); /* beyond max_ctx */
    ty_kvpool_seq_free(ty_engine_pool(e), s);
    ty_engine_free(e);
    free(l);
}

/* Context and KV pool defaults: the model's own context; without kv_pages
 * or kv_bytes, max_seqs sequences of min(max_ctx, 4096) tokens and at least one whole
 * max_ctx (a long context is one sequence's worth, not max_seqs of them); a pool smaller than
 * the context lowers it. */
static void test_context_defaults(void **state)
{
    (void)state;
    uint32_t own = ty_model_config(model)->ctx_len; /* stories260K: 2048 */
    struct {
        uint32_t max_seqs, max_ctx, kv_pages, want_pages, want_ctx;
    } cases[] = {
        {4, 0, 0, 4 * own / B, own},          /* the model's context, 4 of them */
        {4, 8192, 0, 4 * 4096 / B, 8192},     /* 4 x 4096 tokens: holds 8192 */
        {1, 32768, 0, 32768 / B, 32768},      /* one whole long context */
        {8, 131072, 0, 131072 / B, 131072},   /* 8 x 4096 < 128k: one 128k sequence */
        {8, 4000, 0, 8 * 250, 4000},          /* sequences rounded up to whole pages */
        {1, 8192, 100, 100, 100 * B},         /* kv_pages below the context lowers it */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct ty_engine_opts o = {.kv_block_tokens = B, .max_seqs = cases[i].max_seqs,
                                   .max_ctx = cases[i].max_ctx, .kv_pages = cases[i].kv_pages};
        ty_engine_t *e;
        assert_int_equal(ty_engine_new(&e, model, &o), 0);
        assert_int_equal(ty_kvpool_pages_total(ty_engine_pool(e)), cases[i].want_pages);
        assert_int_equal(ty_engine_max_ctx(e), cases[i].want_ctx);
        ty_engine_free(e);
    }
    assert_int_equal(ty_engine_default_ctx(131072), 131072);
    assert_int_equal(ty_engine_default_ctx(10000000), TY_ENGINE_MAX_CTX);
}

int main(void)
{
    const char *data = getenv("TYCHO_TEST_DATA");
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/models/stories260K/stories260K.gguf", data ? data : "");
    if (!data || ty_model_load(&model, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "skip: %s\n", data ? err : "TYCHO_TEST_DATA not set");
        return 77;
    }
    V = ty_model_config(model)->n_vocab;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_equals_alone), cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_greedy_ids),
        cmocka_unit_test(test_draws),
        cmocka_unit_test(test_prefix_sharing),     cmocka_unit_test(test_export_import),
        cmocka_unit_test(test_bad_batches),        cmocka_unit_test(test_context_defaults),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ty_model_free(model);
    return rc;
}
