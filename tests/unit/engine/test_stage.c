/* Pipeline stages of the engine (chunked pipeline parallelism, Mooncake §5.1) on the real
 * stories260K model: layers [0, a) on one engine and [a, L) on another, chained through the
 * hidden states (the residual stream, T x dim f32), give the logits and, layer by layer, the
 * K/V of one engine running all L layers.
 *
 * Equality is bitwise where both sides run the same forward calls (same tokens per call, same
 * threads): a stage runs each of its layers on the same input rows with the same GEMM shapes
 * as the whole pass does, and the hidden states cross as an exact f32 copy. Chunking a prompt
 * (several forward calls instead of one) changes GEMM shapes and so the float sums' order:
 * that comparison is to a relative 1e-5, as test_engine's chunked prefill. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/batcher.h"
#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/kvpool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 16
static ty_model_t *model;
static uint32_t V, D, L;

static ty_engine_t *mk_engine(uint32_t batch_tokens)
{
    struct ty_engine_opts o = {.kv_block_tokens = B, .max_seqs = 4, .max_ctx = 512,
                               .max_batch_tokens = batch_tokens, .no_prefix_sharing = true};
    ty_engine_t *e;
    assert_int_equal(ty_engine_new(&e, model, &o), 0);
    return e;
}

static void mk_prompt(uint32_t *p, size_t n, uint32_t salt)
{
    p[0] = 1;
    for (size_t i = 1; i < n; i++)
        p[i] = 259 + (uint32_t)((i * 37 + salt * 101) % 253);
}

static ty_kvseq_t *new_seq(ty_engine_t *e)
{
    ty_kvseq_t *s;
    assert_int_equal(ty_kvpool_seq_new(ty_engine_pool(e), &s), 0);
    return s;
}

/* One forward call of tokens t[0..n) on seq s over layers [lo, hi). */
static int run(ty_engine_t *e, ty_kvseq_t *s, const uint32_t *t, uint32_t n, uint32_t lo,
               uint32_t hi, const float *in, float *out, float *logits)
{
    struct ty_batch_seq bs = {s, t, n, false};
    struct ty_batch b = {.seqs = &bs, .n_seqs = 1, .layer_begin = lo, .layer_end = hi,
                         .hidden_in = in, .hidden_out = out};
    return ty_engine_forward(e, &b, logits);
}

/* K and V of layers [lo, hi) for positions [0, n) of a and b agree bit for bit. */
static void assert_kv_equal(ty_engine_t *ea, ty_kvseq_t *a, ty_engine_t *eb, ty_kvseq_t *b,
                            uint32_t lo, uint32_t hi, uint32_t n)
{
    ty_kvpool_t *pa = ty_engine_pool(ea), *pb = ty_engine_pool(eb);
    const struct ty_model_config *c = ty_model_config(model);
    size_t chunk = (size_t)c->n_kv_heads * B * c->head_dim * sizeof(float);
    assert_int_equal(ty_kvseq_n_tokens(a), n);
    assert_int_equal(ty_kvseq_n_tokens(b), n);
    for (uint32_t l = lo; l < hi; l++)
        for (uint32_t p = 0; p < (n + B - 1) / B; p++) {
            uint32_t ga = ty_kvseq_pages(a)[p], gb = ty_kvseq_pages(b)[p];
            /* whole chunks: the rows past n of the last page are unwritten in both */
            if ((p + 1) * B <= n) {
                assert_memory_equal(ty_kvpool_k(pa, l, ga), ty_kvpool_k(pb, l, gb), chunk);
                assert_memory_equal(ty_kvpool_v(pa, l, ga), ty_kvpool_v(pb, l, gb), chunk);
            }
        }
}

/* [0, L) in one call equals [0, a) then [a, L), for every split a, bitwise. */
static void test_two_stages_bitwise(void **state)
{
    enum { N = 70 };
    uint32_t t[N];
    mk_prompt(t, N, 1);
    float *want = malloc(V * sizeof(float)), *got = malloc(V * sizeof(float));
    float *h = malloc((size_t)N * D * sizeof(float));
    ty_engine_t *whole = mk_engine(512);
    ty_kvseq_t *sw = new_seq(whole);
    assert_int_equal(run(whole, sw, t, N, 0, 0, NULL, NULL, want), 0);
    for (uint32_t a = 1; a < L; a++) {
        ty_engine_t *e0 = mk_engine(512), *e1 = mk_engine(512);
        ty_kvseq_t *s0 = new_seq(e0), *s1 = new_seq(e1);
        assert_int_equal(run(e0, s0, t, N, 0, a, NULL, h, NULL), 0);
        assert_int_equal(run(e1, s1, t, N, a, L, h, NULL, got), 0);
        assert_memory_equal(got, want, V * sizeof(float));
        assert_kv_equal(e0, s0, whole, sw, 0, a, N);
        assert_kv_equal(e1, s1, whole, sw, a, L, N);
        ty_kvpool_seq_free(ty_engine_pool(e0), s0);
        ty_kvpool_seq_free(ty_engine_pool(e1), s1);
        ty_engine_free(e0);
        ty_engine_free(e1);
    }
    ty_kvpool_seq_free(ty_engine_pool(whole), sw);
    ty_engine_free(whole);
    free(want);
    free(got);
    free(h);
}

/* A prompt cut into chunks flowing through three stages (chunk i on stage s after stage
 * s-1): bitwise what one engine gives for the same chunks, and within 1e-5 of one call. */
static void test_chunks_through_stages(void **state)
{
    enum { N = 100, C = 24, S = 3 };
    uint32_t t[N], cut[S + 1] = {0, 1, 3, 0};
    cut[S] = L;
    if (L < 4)
        skip();
    mk_prompt(t, N, 7);
    float *want = malloc(V * sizeof(float)), *chunked = malloc(V * sizeof(float));
    float *got = malloc(V * sizeof(float)), *h = malloc((size_t)C * D * sizeof(float));
    ty_engine_t *whole = mk_engine(512), *one = mk_engine(512), *st[S];
    ty_kvseq_t *sw = new_seq(whole), *so = new_seq(one), *ss[S];
    for (int s = 0; s < S; s++) {
        st[s] = mk_engine(512);
        ss[s] = new_seq(st[s]);
    }
    assert_int_equal(run(whole, sw, t, N, 0, 0, NULL, NULL, want), 0);
    for (uint32_t at = 0; at < N; at += C) {
        uint32_t n = N - at < C ? N - at : C;
        assert_int_equal(run(one, so, t + at, n, 0, 0, NULL, NULL, chunked), 0);
        for (int s = 0; s < S; s++) /* h carries the chunk from stage to stage, in place */
            assert_int_equal(run(st[s], ss[s], t + at, n, cut[s], cut[s + 1], s ? h : NULL,
                                 s + 1 < S ? h : NULL, s + 1 < S ? NULL : got),
                             0);
    }
    assert_memory_equal(got, chunked, V * sizeof(float));
    for (int s = 0; s < S; s++)
        assert_kv_equal(st[s], ss[s], one, so, cut[s], cut[s + 1], N);
    double num = 0, den = 0;
    for (uint32_t i = 0; i < V; i++) {
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    assert_true(sqrt(num / den) <= 1e-5);
    for (int s = 0; s < S; s++) {
        ty_kvpool_seq_free(ty_engine_pool(st[s]), ss[s]);
        ty_engine_free(st[s]);
    }
    ty_kvpool_seq_free(ty_engine_pool(whole), sw);
    ty_kvpool_seq_free(ty_engine_pool(one), so);
    ty_engine_free(whole);
    ty_engine_free(one);
    free(want);
    free(chunked);
    free(got);
    free(h);
}

/* A stage split by the engine's max_batch_tokens keeps each token's hidden row with it. */
static void test_stage_split_by_engine(void **state)
{
    enum { N = 50 };
    uint32_t t[N];
    mk_prompt(t, N, 3);
    float *h1 = malloc((size_t)N * D * sizeof(float)), *h2 = malloc((size_t)N * D * sizeof(float));
    float *a = malloc(V * sizeof(float)), *b = malloc(V * sizeof(float));
    ty_engine_t *e1 = mk_engine(512), *e2 = mk_engine(512), *f1 = mk_engine(9), *f2 = mk_engine(9);
    ty_kvseq_t *s1 = new_seq(e1), *s2 = new_seq(e2), *g1 = new_seq(f1), *g2 = new_seq(f2);
    /* the same 9-token calls on both sides: the small engine splits one batch, the other is
     * handed the chunks one by one */
    for (uint32_t at = 0; at < N; at += 9) {
        uint32_t n = N - at < 9 ? N - at : 9;
        assert_int_equal(run(e1, s1, t + at, n, 0, 2, NULL, h1 + (size_t)at * D, NULL), 0);
    }
    for (uint32_t at = 0; at < N; at += 9) {
        uint32_t n = N - at < 9 ? N - at : 9;
        assert_int_equal(run(e2, s2, t + at, n, 2, L, h1 + (size_t)at * D, NULL, a), 0);
    }
    assert_int_equal(run(f1, g1, t, N, 0, 2, NULL, h2, NULL), 0);
    assert_memory_equal(h2, h1, (size_t)N * D * sizeof(float));
    assert_int_equal(run(f2, g2, t, N, 2, L, h2, NULL, b), 0);
    assert_memory_equal(b, a, V * sizeof(float));
    ty_kvpool_seq_free(ty_engine_pool(e1), s1);
    ty_kvpool_seq_free(ty_engine_pool(e2), s2);
    ty_kvpool_seq_free(ty_engine_pool(f1), g1);
    ty_kvpool_seq_free(ty_engine_pool(f2), g2);
    ty_engine_free(e1);
    ty_engine_free(e2);
    ty_engine_free(f1);
    ty_engine_free(f2);
    free(h1);
    free(h2);
    free(a);
    free(b);
}

/* ---- the batcher's stages ---- */

/* What one batcher's hooks saw, and where a stage's hidden states go next. */
struct seen {
    ty_batcher_t *next_b; /* the next stage's batcher (NULL: last) */
    ty_breq_t *next_r;
    uint32_t n_out, ended, hidden_rows, hidden_calls, next_first;
    struct ty_sample first;
    enum ty_finish fin;
    int rc;
};

static int on_token(void *arg, ty_breq_t *r, const struct ty_sample *s, enum ty_finish fin)
{
    struct seen *w = arg;
    if (!w->n_out++)
        w->first = *s;
    return fin;
}

static void on_end(void *arg, ty_breq_t *r, enum ty_finish fin, int rc)
{
    struct seen *w = arg;
    w->ended++;
    w->fin = fin;
    w->rc = rc;
}

/* Stage s hands its rows to stage s + 1 as they come (the node sends them over the wire). */
static void on_hidden(void *arg, ty_breq_t *r, const float *rows, uint32_t first, uint32_t n)
{
    struct seen *w = arg;
    assert_int_equal(first, w->next_first); /* each token once, in order */
    w->next_first += n;
    w->hidden_rows += n;
    w->hidden_calls++;
    assert_int_equal(ty_batcher_stage_input(w->next_b, w->next_r, rows, n), 0);
}

static ty_batcher_t *mk_batcher(ty_engine_t *e, struct seen *w, uint32_t step)
{
    struct ty_batcher_opts o = {.engine = e, .step_tokens = step, .no_grow = true,
                                .hooks = {.arg = w, .on_token = on_token, .on_end = on_end,
                                          .on_hidden = on_hidden}};
    ty_batcher_t *b;
    assert_int_equal(ty_batcher_new(&b, &o), 0);
    return b;
}

/* A 100-token prompt in 24-token calls through two batchers (layers [0, 2) and [2, L)),
 * stepped in turn as two nodes would run, chunk i on stage 1 while chunk i+1 is on stage 0:
 * the first token and its log-probability are bitwise those of one batcher making the same
 * 24-token calls. A whole-model request on the first stage's batcher meanwhile gives what it
 * gives alone (the stage runs in calls of its own). */
static void test_batcher_stages(void **state)
{
    enum { N = 100, STEP = 24 };
    uint32_t t[N], u[30];
    mk_prompt(t, N, 11);
    mk_prompt(u, 30, 12);
    struct ty_gen_params g = {.max_tokens = 1, .ignore_eos = true};
    g.sampling.repetition_penalty = 1;
    g.sampling.logprobs = true;
    struct ty_gen_params g4 = g;
    g4.max_tokens = 4;
    /* one node */
    struct seen w1 = {0}, wu = {0};
    ty_engine_t *e1 = mk_engine(512);
    ty_batcher_t *b1 = mk_batcher(e1, &w1, STEP);
    struct ty_breq_opts o = {.id = 1, .prompt = t, .n_prompt = N, .gen = &g};
    assert_int_equal(ty_batcher_add(b1, &o, NULL), 0);
    while (!w1.ended)
        assert_true(ty_batcher_step(b1) >= 0);
    struct ty_breq_opts ou = {.id = 2, .prompt = u, .n_prompt = 30, .gen = &g4};
    struct ty_batcher_opts bo = {.engine = e1, .step_tokens = STEP, .no_grow = true,
                                 .hooks = {.arg = &wu, .on_token = on_token, .on_end = on_end}};
    ty_batcher_t *bu;
    assert_int_equal(ty_batcher_new(&bu, &bo), 0);
    assert_int_equal(ty_batcher_add(bu, &ou, NULL), 0);
    while (!wu.ended)
        assert_true(ty_batcher_step(bu) >= 0);
    /* two stages */
    struct seen w0 = {0}, wl = {0};
    ty_engine_t *e0 = mk_engine(512), *el = mk_engine(512);
    ty_batcher_t *b0 = mk_batcher(e0, &w0, STEP), *bl = mk_batcher(el, &wl, STEP);
    struct ty_breq_opts s0 = o, sl = o;
    s0.layer_end = 2;
    sl.layer_begin = 2;
    sl.layer_end = L;
    assert_int_equal(ty_batcher_add(bl, &sl, &w0.next_r), 0);
    w0.next_b = bl;
    assert_int_equal(ty_batcher_add(b0, &s0, NULL), 0);
    ty_breq_t *ur;
    ou.id = 3;
    assert_int_equal(ty_batcher_add(b0, &ou, &ur), 0);
    uint32_t last_steps = 0;
    while (!wl.ended) {
        assert_true(ty_batcher_step(b0) >= 0);
        int k = ty_batcher_step(bl);
        assert_true(k >= 0);
        last_steps += k > 0;
    }
    while (!ty_batcher_idle(b0))
        assert_true(ty_batcher_step(b0) >= 0);
    assert_int_equal(w0.ended, 2); /* the stage (no token) and the whole request */
    assert_int_equal(w0.hidden_rows, N);
    assert_int_equal(w0.hidden_calls, (N + STEP - 1) / STEP);
    assert_int_equal(last_steps, (N + STEP - 1) / STEP); /* a call per chunk as it came */
    assert_int_equal(wl.rc, 0);
    assert_int_equal(wl.n_out, 1);
    assert_int_equal(wl.first.id, w1.first.id);
    assert_memory_equal(&wl.first.logprob, &w1.first.logprob, sizeof(float));
    /* the whole request beside the stage: 4 tokens, the first as alone (the stage made none) */
    assert_int_equal(w0.n_out, 4);
    assert_int_equal(w0.first.id, wu.first.id);
    ty_batcher_free(b0);
    ty_batcher_free(bl);
    ty_batcher_free(b1);
    ty_batcher_free(bu);
    assert_int_equal(ty_kvpool_pages_cached(ty_engine_pool(e0)), 0); /* stage KV never cached */
    ty_engine_free(e0);
    ty_engine_free(el);
    ty_engine_free(e1);
}

/* Stage requests the batcher refuses. */
static void test_batcher_bad_stages(void **state)
{
    uint32_t t[20];
    mk_prompt(t, 20, 1);
    struct ty_gen_params g = {.max_tokens = 1, .ignore_eos = true};
    struct seen w = {0};
    ty_engine_t *e = mk_engine(512);
    struct ty_batcher_opts bo = {.engine = e,
                                 .hooks = {.arg = &w, .on_token = on_token, .on_end = on_end}};
    ty_batcher_t *b;
    assert_int_equal(ty_batcher_new(&b, &bo), 0);
    struct ty_breq_opts o = {.id = 1, .prompt = t, .n_prompt = 20, .gen = &g, .layer_end = 1};
    assert_int_equal(ty_batcher_add(b, &o, NULL), TY_EINVAL); /* no on_hidden */
    o.layer_begin = 1, o.layer_end = L + 1;
    assert_int_equal(ty_batcher_add(b, &o, NULL), TY_EINVAL); /* past the model */
    o.layer_begin = 2, o.layer_end = 2;
    assert_int_equal(ty_batcher_add(b, &o, NULL), TY_EINVAL); /* empty */
    o.layer_begin = 1, o.layer_end = L;
    assert_int_equal(ty_batcher_add_reserved(b, &o, NULL), TY_EINVAL);
    ty_breq_t *r;
    assert_int_equal(ty_batcher_add(b, &o, &r), 0);
    float *rows = calloc(21 * (size_t)D, sizeof(float));
    assert_int_equal(ty_batcher_stage_input(b, r, rows, 21), TY_EINVAL); /* more than the prompt */
    assert_int_equal(ty_batcher_stage_input(b, r, rows, 5), 0);
    assert_int_equal(ty_breq_stage_ready(r), 5);
    assert_int_equal(ty_batcher_step(b), 1); /* the 5 tokens it has */
    assert_int_equal(ty_batcher_step(b), 0); /* waits for the rest */
    ty_batcher_end(b, r, TY_ECANCELED);
    assert_int_equal(w.rc, TY_ECANCELED);
    ty_batcher_free(b);
    ty_engine_free(e);
    free(rows);
}

/* Ranges a stage cannot run are refused before anything is computed. */
static void test_bad_ranges(void **state)
{
    uint32_t t[4] = {1, 300, 301, 302};
    float *h = calloc(4 * (size_t)D, sizeof(float)), *lg = malloc(V * sizeof(float));
    ty_engine_t *e = mk_engine(512);
    ty_kvseq_t *s = new_seq(e);
    assert_int_equal(run(e, s, t, 4, 1, L, NULL, NULL, lg), TY_EINVAL);    /* no hidden_in */
    assert_int_equal(run(e, s, t, 4, 0, 1, NULL, NULL, lg), TY_EINVAL);    /* no hidden_out */
    assert_int_equal(run(e, s, t, 4, 0, L, NULL, h, lg), TY_EINVAL);       /* out at the end */
    assert_int_equal(run(e, s, t, 4, 2, 2, h, h, lg), TY_EINVAL);          /* empty */
    assert_int_equal(run(e, s, t, 4, 1, L + 1, h, NULL, lg), TY_EINVAL);   /* past the model */
    assert_int_equal(ty_kvseq_n_tokens(s), 0);
    assert_int_equal(run(e, s, t, 4, 0, 1, NULL, h, NULL), 0);
    assert_int_equal(ty_kvseq_n_tokens(s), 4);
    ty_kvpool_seq_free(ty_engine_pool(e), s);
    ty_engine_free(e);
    free(h);
    free(lg);
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
    D = ty_model_config(model)->dim;
    L = ty_model_config(model)->n_layers;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_stages_bitwise),
        cmocka_unit_test(test_chunks_through_stages),
        cmocka_unit_test(test_stage_split_by_engine),
        cmocka_unit_test(test_bad_ranges),
        cmocka_unit_test(test_batcher_stages),
        cmocka_unit_test(test_batcher_bad_stages),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ty_model_free(model);
    return rc;
}
