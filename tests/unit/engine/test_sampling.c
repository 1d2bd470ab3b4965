/* Sampling on hand-made logits, expected values worked out by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/errors.h"
#include "tycho/engine.h"
#include "tycho/sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t sample1(struct ty_sampling_params p, const float *in, uint32_t n,
                        const uint32_t *hist, size_t nh, struct ty_sample *out)
{
    ty_sampler_t *s;
    float l[16];
    memcpy(l, in, n * sizeof(float));
    assert_int_equal(ty_sampler_new(&s, &p, n), 0);
    assert_int_equal(ty_sampler_sample(s, l, hist, nh, out), 0);
    ty_sampler_free(s);
    return out->id;
}

static void test_greedy_and_logprobs(void **state)
{
    /* logits ln(1), ln(2), ln(5), ln(2): probabilities 0.1, 0.2, 0.5, 0.2 */
    float l[4] = {0.0f, logf(2), logf(5), logf(2)};
    struct ty_sampling_params p = {.n_logprobs = 3};
    struct ty_sample s;
    assert_int_equal(sample1(p, l, 4, NULL, 0, &s), 2);
    assert_float_equal(s.logprob, logf(0.5f), 1e-5);
    assert_int_equal(s.n_top, 3);
    assert_int_equal(s.top[0].id, 2);
    assert_float_equal(s.top[1].logprob, logf(0.2f), 1e-5);
    assert_true(s.top[1].id == 1 || s.top[1].id == 3);
    assert_float_equal(s.top[2].logprob, logf(0.2f), 1e-5);
}

/* The greedy pick a device may make in place of the sampler (struct ty_batch.ids): the lowest
 * of equal maxima, NaN never winning, 0 for a row of NaN; and which samplers it stands for:
 * greedy without penalties, bias, a pending ban or log-probabilities. */
static void test_plain_greedy(void **state)
{
    float row[37];
    for (int i = 0; i < 37; i++)
        row[i] = (float)(i % 5); /* maxima 4 at 4, 9, 14, ... */
    assert_int_equal(ty_logits_argmax(row, 37), 4);
    row[0] = NAN;
    row[30] = 9.0f, row[33] = 9.0f; /* past the 16-wide and 4-wide loops' first blocks */
    assert_int_equal(ty_logits_argmax(row, 37), 30);
    row[36] = INFINITY;
    assert_int_equal(ty_logits_argmax(row, 37), 36);
    for (int i = 0; i < 37; i++)
        row[i] = NAN;
    assert_int_equal(ty_logits_argmax(row, 37), 0);
    for (int i = 0; i < 37; i++)
        row[i] = -INFINITY;
    assert_int_equal(ty_logits_argmax(row, 37), 0);

    struct ty_sampling_params p = {.repetition_penalty = 1};
    ty_sampler_t *s;
    assert_int_equal(ty_sampler_new(&s, &p, 37), 0);
    assert_true(ty_sampler_plain_greedy(s));
    uint32_t ban = 3;
    ty_sampler_ban_next(s, &ban, 1); /* min_tokens: not plain until the draw is made */
    assert_false(ty_sampler_plain_greedy(s));
    float l[37] = {0};
    struct ty_sample out;
    assert_int_equal(ty_sampler_sample(s, l, NULL, 0, &out), 0);
    assert_true(ty_sampler_plain_greedy(s));
    ty_sampler_free(s);
    struct ty_sampling_params not_plain[] = {
        {.temperature = 0.7f, .repetition_penalty = 1}, {.repetition_penalty = 1.1f},
        {.presence_penalty = 0.5f},                      {.frequency_penalty = 0.5f},
        {.logprobs = true},                              {.n_logprobs = 2},
        {.n_logit_bias = 1, .logit_bias = {{3, 1.0f}}}};
    for (size_t i = 0; i < sizeof(not_plain) / sizeof(not_plain[0]); i++) {
        assert_int_equal(ty_sampler_new(&s, &not_plain[i], 37), 0);
        assert_false(ty_sampler_plain_greedy(s));
        ty_sampler_free(s);
    }
}

static void test_penalties(void **state)
{
    /* token 2 leads by 0.5; presence 0.3 + frequency 0.2 x 2 occurrences = 0.7 drops it
     * below token 0 (2.0 vs 1.8) */
    float l[3] = {2.0f, 0.0f, 2.5f};
    uint32_t hist[] = {2, 2, 1};
    struct ty_sample s;
    struct ty_sampling_params p = {.presence_penalty = 0.3f, .frequency_penalty = 0.2f};
    assert_int_equal(sample1(p, l, 3, hist, 3, &s), 0);
    /* repetition 1.5: 2.5/1.5 = 1.67 < 2.0 */
    struct ty_sampling_params r = {.repetition_penalty = 1.5f};
    assert_int_equal(sample1(r, l, 3, hist, 3, &s), 0);
    /* a window of 1 sees only token 1: token 2 keeps its lead */
    r.penalty_last_n = 1;
    assert_int_equal(sample1(r, l, 3, hist, 3, &s), 2);
    /* negative logits are multiplied: -1 * 2 = -2 < -1.5 */
    float neg[2] = {-1.0f, -1.5f};
    uint32_t h0[] = {0};
    struct ty_sampling_params r2 = {.repetition_penalty = 2.0f};
    assert_int_equal(sample1(r2, neg, 2, h0, 1, &s), 1);
}

static void test_seed_and_filters(void **state)
{
    float l[8] = {1, 2, 3, 4, 4.5f, 0, -1, 2.5f};
    struct ty_sampling_params p = {.temperature = 1.0f, .seed = 42};
    ty_sampler_t *a, *b;
    assert_int_equal(ty_sampler_new(&a, &p, 8), 0);
    assert_int_equal(ty_sampler_new(&b, &p, 8), 0);
    int seen[8] = {0};
    for (int i = 0; i < 400; i++) {
        float x[8], y[8];
        struct ty_sample sa, sb;
        memcpy(x, l, sizeof(x));
        memcpy(y, l, sizeof(y));
        ty_sampler_sample(a, x, NULL, 0, &sa);
        ty_sampler_sample(b, y, NULL, 0, &sb);
        assert_int_equal(sa.id, sb.id); /* same seed, same stream */
        seen[sa.id]++;
    }
    ty_sampler_free(a);
    ty_sampler_free(b);
    assert_true(seen[4] > seen[3] && seen[3] > 0 && seen[2] > 0);
    /* top-k 2 keeps only ids 4 and 3 */
    struct ty_sampling_params k2 = {.temperature = 1.0f, .top_k = 2, .seed = 7};
    /* top-p 0.5: p(id 4) = 0.478 < 0.5, so id 3 (0.29) is needed too: ids 4, 3 */
    struct ty_sampling_params tp = {.temperature = 1.0f, .top_p = 0.5f, .seed = 9};
    /* min-p 0.7: p(3)/p(4) = e^-0.5 = 0.61 < 0.7, so only id 4 survives */
    struct ty_sampling_params mp = {.temperature = 1.0f, .min_p = 0.7f, .seed = 11};
    for (int i = 0; i < 50; i++) {
        struct ty_sample s;
        k2.seed = tp.seed = mp.seed = (uint64_t)i;
        uint32_t id = sample1(k2, l, 8, NULL, 0, &s);
        assert_true(id == 4 || id == 3);
        id = sample1(tp, l, 8, NULL, 0, &s);
        assert_true(id == 4 || id == 3);
        assert_int_equal(sample1(mp, l, 8, NULL, 0, &s), 4);
    }
    /* a very low temperature behaves as greedy */
    struct ty_sampling_params cold = {.temperature = 0.01f, .seed = 3};
    struct ty_sample s;
    assert_int_equal(sample1(cold, l, 8, NULL, 0, &s), 4);
}

/* Log-probabilities only when asked: the chosen token's with .logprobs alone, none without. */
static void test_logprobs_on_request(void **state)
{
    float l[4] = {0.0f, logf(2), logf(5), logf(2)};
    struct ty_sample s;
    struct ty_sampling_params off = {0}, on = {.logprobs = true};
    assert_int_equal(sample1(off, l, 4, NULL, 0, &s), 2);
    assert_true(s.logprob == 0.0f && s.n_top == 0);
    assert_int_equal(sample1(on, l, 4, NULL, 0, &s), 2);
    assert_float_equal(s.logprob, logf(0.5f), 1e-5);
    assert_int_equal(s.n_top, 0);
}

/* On a 5,000-token row with many equal logits: top-k (a partial selection) keeps exactly the
 * k best by (logit, then lower id), and a draw with no filter (no sort, index order) follows
 * the softmax: a token's frequency over 20,000 draws is within 5 sigma of its probability. */
static void test_large_vocab(void **state)
{
    enum { V = 5000, K = 37, N = 20000 };
    static float l[V], x[V];
    uint64_t r = 12345;
    for (int i = 0; i < V; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((r >> 33) % 50) / 10.0f; /* 50 distinct values: many ties */
    }
    /* the K-th best value and how many of it the top K take (the lowest ids) */
    int cnt[50] = {0};
    for (int i = 0; i < V; i++)
        cnt[(int)lroundf(l[i] * 10)]++;
    int need = K, cut = 49;
    while (need > cnt[cut])
        need -= cnt[cut--];
    struct ty_sampling_params pk = {.temperature = 1.0f, .top_k = K};
    ty_sampler_t *s;
    for (int t = 0; t < 200; t++) {
        pk.seed = (uint64_t)t;
        assert_int_equal(ty_sampler_new(&s, &pk, V), 0);
        memcpy(x, l, sizeof(x));
        struct ty_sample o;
        assert_int_equal(ty_sampler_sample(s, x, NULL, 0, &o), 0);
        ty_sampler_free(s);
        int v = (int)lroundf(l[o.id] * 10);
        assert_true(v >= cut);
        if (v == cut) { /* among the first `need` ids holding the cut value */
            int before = 0;
            for (uint32_t i = 0; i < o.id; i++)
                before += (int)lroundf(l[i] * 10) == cut;
            assert_true(before < need);
        }
    }
    struct ty_sampling_params pf = {.temperature = 1.0f, .seed = 5};
    assert_int_equal(ty_sampler_new(&s, &pf, V), 0);
    int top = 0; /* draws of the tokens holding the largest value */
    for (int t = 0; t < N; t++) {
        memcpy(x, l, sizeof(x));
        struct ty_sample o;
        assert_int_equal(ty_sampler_sample(s, x, NULL, 0, &o), 0);
        top += (int)lroundf(l[o.id] * 10) == 49;
    }
    ty_sampler_free(s);
    double z = 0;
    for (int i = 0; i < V; i++)
        z += exp(l[i] - 4.9);
    double p = cnt[49] / z, sd = sqrt(N * p * (1 - p));
    assert_true(fabs(top - N * p) < 5 * sd);
}

/* The reference cut, written the plain way: softmax over the whole row, every token sorted
 * by (logit desc, id asc), the shortest prefix reaching top_p, then the tokens of it with
 * p >= min_p x the largest (at least one). rank[id] = position in that order; returns the
 * count kept. */
static const float *ref_l; /* the row ref_rank_cmp orders by */

static int ref_rank_cmp(const void *a, const void *b)
{
    const float *l = ref_l;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (l[x] != l[y])
        return l[x] < l[y] ? 1 : -1;
    return (x > y) - (x < y);
}

static uint32_t ref_cut(const float *l, uint32_t n, float temp, float top_p, float min_p,
                        uint32_t *order, uint32_t *rank)
{
    float mx = l[0];
    for (uint32_t i = 1; i < n; i++)
        mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += expf((l[i] - mx) / temp);
    for (uint32_t i = 0; i < n; i++)
        order[i] = i;
    ref_l = l;
    qsort(order, n, sizeof(*order), ref_rank_cmp);
    for (uint32_t i = 0; i < n; i++)
        rank[order[i]] = i;
    uint32_t keep = n;
    double cum = 0;
    for (uint32_t i = 0; i < n && top_p > 0 && top_p < 1; i++) {
        cum += (float)(expf((l[order[i]] - mx) / temp) / sum);
        if (cum >= top_p) {
            keep = i + 1;
            break;
        }
    }
    if (min_p > 0) {
        float thr = (float)(1.0 / sum) * min_p;
        uint32_t k = 1;
        while (k < keep && (float)(expf((l[order[k]] - mx) / temp) / sum) >= thr)
            k++;
        keep = k;
    }
    return keep;
}

/* Top-p and min-p on a 20,000-token row whose nucleus is hundreds to thousands of tokens
 * (1,000 tokens share the top logit, the rest are lower, with ties): every draw lies inside
 * the reference cut, and draws reach deep into it (the sampler sorts only as far as it must,
 * so a cut past its first sorted block is where it could go wrong). */
static void test_nucleus_large_vocab(void **state)
{
    enum { V = 20000 };
    /* sanitizer builds (TYCHO_SANITIZER_SLOW=1) run this 20x slower: fewer draws, the same
     * checks (40 uniform draws all missing the cut's deeper half: odds 1e-12) */
    const int N = getenv("TYCHO_SANITIZER_SLOW") ? 40 : 400;
    static float l[V], x[V];
    static uint32_t order[V], rank[V];
    uint64_t r = 777;
    for (int i = 0; i < V; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (r >> 33) % 20 == 0 ? 5.0f : (float)((r >> 40) % 4) / 2.0f; /* 0, .5, 1, 1.5 */
    }
    const struct {
        float top_p, min_p;
    } cases[] = {{0.8f, 0}, {0.97f, 0}, {0, 0.5f}, {0.97f, 0.1f}, {0.999f, 0.01f}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        uint32_t keep = ref_cut(l, V, 1.0f, cases[c].top_p, cases[c].min_p, order, rank);
        struct ty_sampling_params p = {.temperature = 1.0f, .top_p = cases[c].top_p,
                                       .min_p = cases[c].min_p, .seed = 31 + c};
        ty_sampler_t *s;
        assert_int_equal(ty_sampler_new(&s, &p, V), 0);
        uint32_t deepest = 0;
        for (int t = 0; t < N; t++) {
            memcpy(x, l, sizeof(x));
            struct ty_sample o;
            assert_int_equal(ty_sampler_sample(s, x, NULL, 0, &o), 0);
            if (rank[o.id] >= keep)
                fail_msg("case %zu: drew rank %u of a cut of %u", c, rank[o.id], keep);
            deepest = rank[o.id] > deepest ? rank[o.id] : deepest;
        }
        ty_sampler_free(s);
        assert_true(keep > 256);
        assert_true(deepest > keep / 2); /* the draws span the cut, not its head */
    }
}

/* OpenAI's logit_bias: -100 bans the greedy pick (the next best wins), +100 on one token makes
 * every draw at temperature 1 that token, a small bias shifts a draw's odds as exp(bias)
 * predicts; an id outside the vocabulary or a non-finite bias is refused. */
static void test_logit_bias(void **state)
{
    float l[4] = {0.0f, logf(2), logf(5), logf(2)}; /* p = 0.1, 0.2, 0.5, 0.2 */
    struct ty_sample s;
    struct ty_sampling_params ban = {.n_logit_bias = 1, .logit_bias = {{2, -100}}};
    assert_int_equal(sample1(ban, l, 4, NULL, 0, &s), 1); /* ids 1 and 3 tie: the lower */
    struct ty_sampling_params force = {.temperature = 1, .n_logit_bias = 1,
                                       .logit_bias = {{0, 100}}};
    for (int i = 0; i < 50; i++) {
        force.seed = (uint64_t)i;
        assert_int_equal(sample1(force, l, 4, NULL, 0, &s), 0);
    }
    /* +ln 4 on id 0: p(0) = 0.4 / 1.3 */
    struct ty_sampling_params tilt = {.temperature = 1, .seed = 5, .n_logit_bias = 1,
                                      .logit_bias = {{0, logf(4)}}};
    ty_sampler_t *smp;
    assert_int_equal(ty_sampler_new(&smp, &tilt, 4), 0);
    int hits = 0, N = 20000;
    for (int i = 0; i < N; i++) {
        float x[4];
        memcpy(x, l, sizeof(x));
        assert_int_equal(ty_sampler_sample(smp, x, NULL, 0, &s), 0);
        hits += s.id == 0;
    }
    ty_sampler_free(smp);
    double p = 0.4 / 1.3, sd = sqrt(N * p * (1 - p));
    assert_true(fabs(hits - N * p) < 5 * sd);
    struct ty_sampling_params bad = {.n_logit_bias = 1, .logit_bias = {{4, 1}}};
    assert_int_equal(ty_sampler_new(&smp, &bad, 4), TY_EINVAL);
    bad.logit_bias[0] = (struct ty_logit_bias){1, NAN};
    assert_int_equal(ty_sampler_new(&smp, &bad, 4), TY_EINVAL);
    bad.logit_bias[0] = (struct ty_logit_bias){1, 1};
    bad.n_logit_bias = TY_SAMPLE_MAX_LOGIT_BIAS + 1;
    assert_int_equal(ty_sampler_new(&smp, &bad, 4), TY_EINVAL);
}

/* Greedy over a long row: the largest logit wins wherever it sits (the row is scanned 16 at a
 * time, then the tail), the lowest index among equal ones, and a NaN never wins, even at 0. */
static void test_greedy_long_rows(void **state)
{
    enum { V = 1003 };
    static float l[V];
    ty_sampler_t *s;
    struct ty_sampling_params p = {0};
    for (uint32_t at = 0; at < V; at += 37) {
        for (uint32_t i = 0; i < V; i++)
            l[i] = (float)(i % 97) / 10.0f;
        l[at] = 50;
        l[(at + 500) % V] = 50; /* a tie further on: the first one wins */
        uint32_t want = at < (at + 500) % V ? at : (at + 500) % V;
        assert_int_equal(ty_sampler_new(&s, &p, V), 0);
        struct ty_sample o;
        assert_int_equal(ty_sampler_sample(s, l, NULL, 0, &o), 0);
        assert_int_equal(o.id, want);
        ty_sampler_free(s);
    }
    for (uint32_t i = 0; i < V; i++)
        l[i] = -1;
    l[0] = NAN;
    l[V - 1] = 3; /* in the scalar tail */
    assert_int_equal(ty_sampler_new(&s, &p, V), 0);
    struct ty_sample o;
    assert_int_equal(ty_sampler_sample(s, l, NULL, 0, &o), 0);
    assert_int_equal(o.id, V - 1);
    ty_sampler_free(s);
}

/* A ban covers one draw: the greedy pick is refused once, then allowed again; min_tokens
 * bans the end tokens and the stop tokens until that many tokens were made, and only then. */
static void test_ban_next_and_min_tokens(void **state)
{
    float l[4] = {0.0f, logf(2), logf(5), logf(3)}, x[4];
    struct ty_sampling_params p = {0};
    ty_sampler_t *s;
    struct ty_sample o;
    assert_int_equal(ty_sampler_new(&s, &p, 4), 0);
    uint32_t two = 2;
    ty_sampler_ban_next(s, &two, 1);
    memcpy(x, l, sizeof(x));
    assert_int_equal(ty_sampler_sample(s, x, NULL, 0, &o), 0);
    assert_int_equal(o.id, 3);
    memcpy(x, l, sizeof(x));
    assert_int_equal(ty_sampler_sample(s, x, NULL, 0, &o), 0);
    assert_int_equal(o.id, 2);
    /* ends: "EOS" 2 and stop token 3, min_tokens 2 */
    struct ty_gen_params g = {.stop_ids = {3}, .n_stop_ids = 1, .min_tokens = 2};
    const uint32_t eog[1] = {2};
    for (uint32_t n_out = 0; n_out < 3; n_out++) {
        ty_gen_ban_ends(&g, n_out, eog, 1, s);
        memcpy(x, l, sizeof(x));
        assert_int_equal(ty_sampler_sample(s, x, NULL, 0, &o), 0);
        assert_int_equal(o.id, n_out < 2 ? 1 : 2);
    }
    g.ignore_eos = true; /* EOS is an ordinary token then: only the stop token is held back */
    ty_gen_ban_ends(&g, 0, eog, 1, s);
    memcpy(x, l, sizeof(x));
    assert_int_equal(ty_sampler_sample(s, x, NULL, 0, &o), 0);
    assert_int_equal(o.id, 2);
    ty_sampler_free(s);
}

static void test_bad_params(void **state)
{
    ty_sampler_t *s;
    struct ty_sampling_params p = {.n_logprobs = TY_SAMPLE_MAX_LOGPROBS + 1};
    assert_int_equal(ty_sampler_new(&s, &p, 4), TY_EINVAL);
    struct ty_sampling_params q = {.temperature = NAN};
    assert_int_equal(ty_sampler_new(&s, &q, 4), TY_EINVAL);
}

/* A draw made in two halves (prepare on the host, carried out where the row is) is the draw
 * ty_sampler_sample makes: the same token and log-probabilities for the same seed, with every
 * adjustment at once (penalties over a window, logit bias on a penalised token and on another,
 * a ban) and each filter. The prepared adjustments hold one entry per token; too small an array
 * is refused without consuming the draw. */
static void test_prepare_then_draw(void **state)
{
    enum { V = 3000, N = 40 };
    static float base[V], a[V], b[V];
    uint64_t x = 7;
    for (uint32_t i = 0; i < V; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        base[i] = (float)((x >> 40) % 2000) / 200.0f - 5.0f;
    }
    uint32_t hist[N];
    for (uint32_t i = 0; i < N; i++)
        hist[i] = (i * 37) % 11 + 5; /* eleven distinct tokens, repeated */
    struct ty_sampling_params cases[] = {
        {.temperature = 0.8f, .seed = 1, .repetition_penalty = 1.3f, .presence_penalty = 0.5f,
         .frequency_penalty = 0.25f, .penalty_last_n = 30, .n_logprobs = 5},
        {.temperature = 1.1f, .top_k = 50, .seed = 2, .frequency_penalty = 0.1f},
        {.temperature = 0.9f, .top_p = 0.7f, .min_p = 0.05f, .seed = 3, .logprobs = true},
        {.temperature = 0, .repetition_penalty = 1.5f, .n_logprobs = 3},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct ty_sampling_params p = cases[c];
        p.n_logit_bias = 2;
        p.logit_bias[0] = (struct ty_logit_bias){5, 2.5f};  /* also penalised */
        p.logit_bias[1] = (struct ty_logit_bias){900, 4.0f}; /* only biased */
        ty_sampler_t *one, *two;
        assert_int_equal(ty_sampler_new(&one, &p, V), 0);
        assert_int_equal(ty_sampler_new(&two, &p, V), 0);
        for (int round = 0; round < 20; round++) {
            uint32_t ban = 7; /* a penalised token banned (min_tokens) */
            ty_sampler_ban_next(one, &ban, 1);
            ty_sampler_ban_next(two, &ban, 1);
            memcpy(a, base, sizeof(a));
            memcpy(b, base, sizeof(b));
            struct ty_sample sa, sb;
            assert_int_equal(ty_sampler_sample(one, a, hist, N, &sa), 0);
            struct ty_logit_adj adj[64];
            struct ty_row_draw d;
            uint32_t n_adj = 0, need = ty_sampler_adj_count(two, N);
            assert_true(need <= 64);
            assert_int_equal(ty_sampler_prepare(two, hist, N, &d, adj, 1, &n_adj), TY_ENOSPC);
            assert_int_equal(ty_sampler_prepare(two, hist, N, &d, adj, 64, &n_adj), 0);
            assert_true(n_adj <= need);
            /* one entry per token the draw adjusts: the window's distinct tokens (penalties
             * on), the two biased ones and the banned one */
            bool pen = p.repetition_penalty != 0 || p.frequency_penalty != 0, seen[V] = {0};
            uint32_t want = 0, from = pen && p.penalty_last_n ? N - p.penalty_last_n : 0;
            for (uint32_t i = from; i < N && pen; i++)
                want += !seen[hist[i]], seen[hist[i]] = true;
            want += !seen[5] + !seen[900] + !seen[7];
            assert_int_equal(n_adj, want);
            for (uint32_t i = 0; i < n_adj; i++)
                for (uint32_t j = i + 1; j < n_adj; j++)
                    assert_int_not_equal(adj[i].id, adj[j].id);
            ty_sampler_draw(two, b, &d, adj, &sb);
            assert_int_equal(sa.id, sb.id);
            assert_true(sa.id != 7);
            assert_true(sa.logprob == sb.logprob && sa.n_top == sb.n_top);
            for (uint32_t i = 0; i < sa.n_top; i++)
                assert_true(sa.top[i].id == sb.top[i].id &&
                            sa.top[i].logprob == sb.top[i].logprob);
            assert_memory_equal(a, b, sizeof(a)); /* the same adjusted row */
            hist[round % N] = sa.id;
        }
        ty_sampler_free(one);
        ty_sampler_free(two);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_logprobs),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_plain_greedy),
        cmocka_unit_test(test_seed_and_filters),
        cmocka_unit_test(test_logprobs_on_request),
        cmocka_unit_test(test_large_vocab),
        cmocka_unit_test(test_nucleus_large_vocab),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_greedy_long_rows),
        cmocka_unit_test(test_ban_next_and_min_tokens),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_prepare_then_draw),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
