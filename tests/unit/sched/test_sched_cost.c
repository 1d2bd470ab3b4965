/* Cost model: the built-in profiles against the derivation written out by hand, and the
 * least-squares refit recovering known coefficients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include <math.h>

#include "tycho/errors.h"
#include "tycho/sched.h"

static void test_profile_a800(void **st)
{
    struct ty_sched_cost c;
    assert_int_equal(ty_sched_cost_profile("llama3-70b-8xa800", &c), 0);
    /* 2 * 70.6e9 FLOP per token / (8 GPUs * 312e12 * 0.40) = 141.43 us per token */
    assert_true(fabs(c.prefill[1] - 141.426) < 0.01);
    /* attention: 2 * 8192 * 80 / 998.4e12 s = 1.3128e-3 us per token^2 */
    assert_true(fabs(c.prefill[2] - 1.3128e-3) < 1e-6);
    /* KV: 2 (K,V) * 80 layers * 8 heads * 128 dims * 2 bytes = 327,680 bytes per token */
    assert_true(c.kv_bytes_per_token == 327680.0);
    /* weights 141.2 GB / (8 * 2.039 TB/s * 0.6) = 14,427 us per decode step */
    assert_true(fabs(c.decode[0] - 14427.0) < 1.0);
    /* 100 GB/s * 0.8 = 80,000 bytes per us */
    assert_true(fabs(c.net_bytes_per_us - 80000.0) < 1e-6);
    assert_int_equal(c.block_tokens, 512);
    /* 8k-token prompt, nothing cached: 10 ms + 8192 * 141.43 us + 8192^2 * 1.3128e-3 us */
    double want = 10000 + 8192 * 141.426 + 8192.0 * 8192.0 * 1.3128e-3;
    assert_true(fabs(ty_sched_cost_prefill_us(&c, 8192, 0) - want) / want < 1e-4);
    /* the cached part costs nothing but the last token is always computed */
    assert_true(ty_sched_cost_prefill_us(&c, 8192, 8192) < 10200);
}

static void test_profile_h800_faster(void **st)
{
    struct ty_sched_cost a, h;
    assert_int_equal(ty_sched_cost_profile("llama3-70b-8xa800", &a), 0);
    assert_int_equal(ty_sched_cost_profile("llama3-70b-8xh800", &h), 0);
    /* 989 / 312 TFLOPS and 3.35 / 2.039 TB/s */
    assert_true(fabs(a.prefill[1] / h.prefill[1] - 989.0 / 312.0) < 1e-9);
    assert_true(fabs(a.decode[0] / h.decode[0] - 3.35 / 2.039) < 1e-9);
    assert_int_equal(ty_sched_cost_profile("gpt-5-on-a-toaster", &a), TY_ENOTFOUND);
}

/* The sample of one prompt of L tokens, P of them cached, prefilled alone in `us`. */
static struct ty_sched_sample prefill_sample(double L, double P, double us)
{
    return (struct ty_sched_sample){L - P, L * L - P * P, us};
}

static void test_refit_recovers_prefill(void **st)
{
    struct ty_sched_cost c = {0};
    struct ty_sched_sample s[12];
    const double k0 = 5000, k1 = 120, k2 = 0.002; /* chosen by hand */
    for (int i = 0; i < 12; i++) {
        double l = 500.0 + 1500.0 * i, p = (i % 3) * 256.0;
        s[i] = prefill_sample(l, p, k0 + k1 * (l - p) + k2 * (l * l - p * p));
    }
    assert_int_equal(ty_sched_cost_refit_prefill(&c, s, 12), 0);
    assert_true(fabs(c.prefill[0] - k0) < 1e-3 * k0);
    assert_true(fabs(c.prefill[1] - k1) < 1e-6 * k1);
    assert_true(fabs(c.prefill[2] - k2) < 1e-6 * k2);
}

static void test_refit_decode_and_errors(void **st)
{
    struct ty_sched_cost c = {0};
    struct ty_sched_sample s[6] = {
        {1, 1000, 0}, {8, 50000, 0}, {16, 80000, 0}, {32, 300000, 0}, {4, 4000, 0}, {64, 9e5, 0}};
    for (int i = 0; i < 6; i++)
        s[i].us = 14000 + 140 * s[i].x0 + 0.0335 * s[i].x1;
    assert_int_equal(ty_sched_cost_refit_decode(&c, s, 6), 0);
    assert_true(fabs(c.decode[0] - 14000) < 1e-3);
    assert_true(fabs(c.decode[1] - 140) < 1e-6);
    assert_true(fabs(c.decode[2] - 0.0335) < 1e-9);
    /* too few samples, non-finite input (one shape repeated: test_refit_one_shape) */
    assert_int_equal(ty_sched_cost_refit_decode(&c, s, 2), TY_EINVAL);
    s[2].us = NAN;
    assert_int_equal(ty_sched_cost_refit_decode(&c, s, 6), TY_EINVAL);
}

/* Samples of forward calls that ran several prompts (1 to 5, some with a cached prefix):
 * one fixed cost per call, the other terms summed over the call's prompts. The fit recovers
 * the per-prompt model, and a call's time is not the sum of its prompts' times alone. */
static void test_fit_batched_calls(void **st)
{
    const double k0 = 8000, k1 = 60, k2 = 0.004; /* chosen by hand */
    struct ty_sched_sample s[20];
    for (int i = 0; i < 20; i++) {
        double n = 0, attn = 0;
        for (int k = 0; k <= i % 5; k++) {
            double l = 40.0 + 97 * ((i * 7 + k * 3) % 11), p = (k % 2) * 32.0;
            n += l - p;
            attn += l * l - p * p;
        }
        s[i] = (struct ty_sched_sample){n, attn, k0 + k1 * n + k2 * attn};
    }
    struct ty_sched_cost c = {0};
    assert_int_equal(ty_sched_cost_refit_prefill(&c, s, 20), 0);
    assert_true(fabs(c.prefill[0] - k0) < 1e-3 * k0);
    assert_true(fabs(c.prefill[1] - k1) < 1e-6 * k1);
    assert_true(fabs(c.prefill[2] - k2) < 1e-6 * k2);
}

/* Measured prefill times of a machine whose fixed cost is ~0: an unconstrained fit puts the
 * intercept and quadratic term below zero (a short prompt would be "free" or negative); the
 * non-negative refit keeps every coefficient >= 0 and still explains the samples. */
static void test_refit_nonnegative(void **st)
{
    struct ty_sched_sample s[10];
    for (int i = 0; i < 10; i++) {
        double l = 64.0 * (i + 1);
        /* 40 us/token, slightly sub-linear at the long end (cache effects): a negative
         * intercept and quadratic term fit it best */
        s[i] = prefill_sample(l, 0, 40 * l - 0.004 * l * l + (i % 2 ? 30 : -30));
    }
    struct ty_sched_cost c = {0};
    assert_int_equal(ty_sched_cost_refit_prefill(&c, s, 10), 0);
    for (int k = 0; k < 3; k++)
        assert_true(c.prefill[k] >= 0);
    for (int i = 0; i < 10; i++) { /* within 2 % of the longest prefill's time everywhere */
        double pred = ty_sched_cost_prefill_us(&c, (uint64_t)s[i].x0, 0);
        assert_true(fabs(pred - s[i].us) < 0.02 * s[9].us);
    }
    /* data that a non-negative model explains exactly: recovered exactly */
    for (int i = 0; i < 10; i++)
        s[i].us = 900 + 35 * s[i].x0 + 0.01 * s[i].x0 * s[i].x0;
    assert_int_equal(ty_sched_cost_refit_prefill(&c, s, 10), 0);
    assert_true(fabs(c.prefill[0] - 900) < 1e-3 && fabs(c.prefill[1] - 35) < 1e-6 &&
                fabs(c.prefill[2] - 0.01) < 1e-9);
}

/* A window of honest samples and one 30 s stall: the stall does not set the model. */
static void test_refit_outlier(void **st)
{
    struct ty_sched_sample s[64];
    for (int i = 0; i < 64; i++) {
        double l = 16.0 + 8 * (i % 32);
        s[i] = prefill_sample(l, 0, 500 + 20 * l + (i % 3) * 10);
    }
    s[17].us = 30e6;
    struct ty_sched_cost c = {0};
    assert_int_equal(ty_sched_cost_refit_prefill(&c, s, 64), 0);
    double pred = ty_sched_cost_prefill_us(&c, 100, 0); /* truth: 2500-2520 us */
    assert_true(pred > 2400 && pred < 2650);
}

/* One batch shape repeated: least squares cannot tell the terms apart; the refit keeps the
 * model's shape (here three equal terms) and scales it to that shape's median time. */
static void test_refit_one_shape(void **st)
{
    struct ty_sched_sample same[4] = {{8, 100, 1000}, {8, 100, 2000}, {8, 100, 3000},
                                      {8, 100, 4000}};
    struct ty_sched_cost c = {.decode = {7, 7, 7}};
    assert_int_equal(ty_sched_cost_refit_decode(&c, same, 4), 0);
    assert_true(fabs(ty_sched_cost_step_us(&c, 8, 100) - 2500) < 1e-6);
    assert_true(c.decode[0] == c.decode[1] && c.decode[1] == c.decode[2]);
    struct ty_sched_cost before = c;
    assert_int_equal(ty_sched_cost_refit_decode(&c, same, 2), TY_EINVAL);
    assert_memory_equal(&before, &c, sizeof(c)); /* unchanged on error */
}

/* A warm-up of one prompt length (every call 32 tokens, ~120 ms): the refit scales the
 * starting model (1 ms + 4 ms per token) to it instead of fitting "120 ms per call whatever
 * its size", which would predict a 224-token call of seven prompts at 120 ms; a stall among
 * the samples does not move the scale. Spread samples are fitted as before. */
static void test_refit_one_length(void **st)
{
    struct ty_sched_cost c = {.prefill = {1000, 4000, 0}};
    struct ty_sched_sample s[20];
    for (int i = 0; i < 20; i++)
        s[i] = prefill_sample(32, 0, 120000 + (i % 5) * 1000);
    s[7].us = 30e6;
    assert_int_equal(ty_sched_cost_refit_prefill(&c, s, 20), 0);
    double at32 = ty_sched_cost_prefill_us(&c, 32, 0);
    assert_true(at32 > 120000 && at32 < 125000);
    assert_true(fabs(c.prefill[1] / c.prefill[0] - 4.0) < 1e-9); /* the shape kept */
    double call7 = c.prefill[0] + c.prefill[1] * 224; /* one call of seven 32-token prompts */
    assert_true(call7 > 6 * at32);
    /* prompts of 16 to 264 tokens: fitted (the shape changes to the data's) */
    for (int i = 0; i < 20; i++) {
        double l = 16.0 + 13 * i;
        s[i] = prefill_sample(l, 0, 50000 + 2000 * l);
    }
    assert_int_equal(ty_sched_cost_refit_prefill(&c, s, 20), 0);
    assert_true(fabs(c.prefill[0] - 50000) < 1 && fabs(c.prefill[1] - 2000) < 1e-3);
}

/* A config's overrides (the Conductor's cost: and a sim spec's): lists of exactly 3 finite
 * non-negative values replace the coefficients, anything else is refused with the field
 * named and leaves the model as it was. */
static void test_override(void **st)
{
    (void)st;
    struct ty_sched_cost c, before;
    assert_int_equal(ty_sched_cost_profile("llama3-70b-8xa800", &c), 0);
    before = c;
    char why[160];
    const double ok3[3] = {1000, 2, 0}, neg[3] = {1, -2, 3}, nan3[3] = {1, NAN, 3};
    assert_int_equal(ty_sched_cost_override(&c, ok3, 2, NULL, 0, 0, why, sizeof(why)),
                     TY_EINVAL);
    assert_non_null(strstr(why, "cost.prefill"));
    assert_int_equal(ty_sched_cost_override(&c, NULL, 0, neg, 3, 0, why, sizeof(why)),
                     TY_EINVAL);
    assert_non_null(strstr(why, "cost.decode[1]"));
    assert_int_equal(ty_sched_cost_override(&c, nan3, 3, NULL, 0, 0, why, sizeof(why)),
                     TY_EINVAL);
    assert_memory_equal(&c, &before, sizeof(c));
    assert_int_equal(ty_sched_cost_override(&c, ok3, 3, NULL, 0, 2.5, why, sizeof(why)), 0);
    assert_true(c.prefill[0] == 1000 && c.prefill[1] == 2 && c.prefill[2] == 0);
    assert_memory_equal(c.decode, before.decode, sizeof(c.decode)); /* not given: kept */
    assert_true(fabs(c.net_bytes_per_us - 2500) < 1e-9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_profile_a800),
        cmocka_unit_test(test_profile_h800_faster),
        cmocka_unit_test(test_refit_recovers_prefill),
        cmocka_unit_test(test_refit_decode_and_errors),
        cmocka_unit_test(test_fit_batched_calls),
        cmocka_unit_test(test_refit_nonnegative),
        cmocka_unit_test(test_refit_one_shape),
        cmocka_unit_test(test_refit_one_length),
        cmocka_unit_test(test_refit_outlier),
        cmocka_unit_test(test_override),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
