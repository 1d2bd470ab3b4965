/* Sampling on hand-made logits, expected values worked out by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/errors.h"
#include "tycho/sampling.h"

#include <math.h>
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

static void test_bad_params(void **state)
{
    ty_sampler_t *s;
    struct ty_sampling_params p = {.n_logprobs = TY_SAMPLE_MAX_LOGPROBS + 1};
    assert_int_equal(ty_sampler_new(&s, &p, 4), TY_EINVAL);
    struct ty_sampling_params q = {.temperature = NAN};
    assert_int_equal(ty_sampler_new(&s, &q, 4), TY_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_logprobs),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_seed_and_filters),
        cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
