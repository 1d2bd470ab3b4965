/* Cluster simulation on hand-built traces whose outcome is computed by hand from a toy cost
 * model: prefill time, prefix reuse, continuous batching and TTFT rejection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tycho/errors.h"
#include "tycho/sim.h"

/* Prefill 1 us per uncached token; decode step 100 us + 50 us per sequence; KV moves are
 * nearly free (1 byte per token at 1 TB/s: 1 ns per 1000 tokens); 100-token blocks. */
static struct ty_sim_opts toy(uint32_t np, uint32_t nd, enum ty_sched_policy pol)
{
    struct ty_sim_opts o;
    ty_sim_opts_default(&o);
    memset(&o.sched.cost, 0, sizeof(o.sched.cost));
    o.sched.cost.prefill[1] = 1;
    o.sched.cost.decode[0] = 100;
    o.sched.cost.decode[1] = 50;
    o.sched.cost.kv_bytes_per_token = 1;
    o.sched.cost.net_bytes_per_us = 1e6;
    o.sched.cost.block_tokens = 100;
    o.sched.policy = pol;
    o.sched.admission = TY_SCHED_ADMIT_BASELINE;
    o.truth = o.sched.cost;
    o.n_prefill = np;
    o.n_decode = nd;
    return o;
}

static struct ty_sim_trace *trace(const char *text)
{
    struct ty_sim_trace *t;
    char err[256];
    assert_int_equal(ty_sim_trace_parse(&t, "toy", text, strlen(text), err, sizeof(err)), 0);
    return t;
}

static const char *two_turns =
    "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 10, "
    "\"hash_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\n"
    "{\"timestamp\": 5, \"input_length\": 1000, \"output_length\": 4, "
    "\"hash_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 20, 21]}\n";

/* Request 0: 1000 uncached tokens, TTFT 1000 us; alone in decode: 10 steps of 150 us.
 * Request 1 at 5 ms shares 8 blocks: 200 tokens to compute, TTFT 200 us. Reuse 8 of 20
 * blocks; prefill time 1200 of 2000 us: 40% saved. */
static void test_prefix_reuse(void **st)
{
    struct ty_sim_trace *t = trace(two_turns);
    struct ty_sim_opts o = toy(1, 1, TY_SCHED_POLICY_KVCACHE_CENTRIC);
    struct ty_sim_result r;
    assert_int_equal(ty_sim_run(t, &o, &r), 0);
    assert_int_equal(r.served, 2);
    assert_true(fabs(r.out[0].ttft_us - 1000) < 1e-3);
    assert_true(fabs(r.out[1].ttft_us - 200) < 1e-3);
    assert_true(fabs(r.out[0].tbt_us - 150) < 1e-3);
    assert_true(fabs(r.cache_hit_rate - 0.4) < 1e-9);
    assert_true(fabs(r.compute_saved - 0.4) < 1e-9);
    assert_true(fabs(r.ttft_mean - 600e-6) < 1e-9);
    ty_sim_result_fini(&r);
    ty_sim_trace_free(t);
}

/* Two unrelated prompts at t = 0 on two prefill nodes: both land on the one decode node at
 * 1000 us and decode together, 200 us a step (100 + 2 * 50), 10 tokens: TBT 200 us. */
static void test_continuous_batching(void **st)
{
    struct ty_sim_trace *t = trace(
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 10, \"hash_ids\": [1]}\n"
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 10, \"hash_ids\": [2]}\n");
    struct ty_sim_opts o = toy(2, 1, TY_SCHED_POLICY_LOAD_BALANCE);
    struct ty_sim_result r;
    assert_int_equal(ty_sim_run(t, &o, &r), 0);
    assert_int_equal(r.served, 2);
    for (int i = 0; i < 2; i++) {
        assert_true(fabs(r.out[i].ttft_us - 1000) < 1e-3);
        assert_true(fabs(r.out[i].tbt_us - 200) < 1e-3);
    }
    assert_true(fabs(r.duration_s - 3000e-6) < 1e-8); /* + 1 ns of KV transfer */
    ty_sim_result_fini(&r);
    ty_sim_trace_free(t);
}

/* The admission mode's picture of decode against the node the KV finds. The two prompts of
 * the batching case land at 1000 us one after the other: the first finds 0 sequences, the
 * second 1. Early rejection judged both on the node as reported at t = 0 (empty): errors 0
 * and -1, bias -0.5. The prediction, for 1000 us, counts request 0 when judging request 1:
 * 0 and 1, exact. The baseline judges nothing at arrival. */
static void test_decode_picture_error(void **st)
{
    struct ty_sim_trace *t = trace(
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 10, \"hash_ids\": [1]}\n"
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 10, \"hash_ids\": [2]}\n");
    enum ty_sched_admission modes[3] = {TY_SCHED_ADMIT_EARLY, TY_SCHED_ADMIT_PREDICTED,
                                        TY_SCHED_ADMIT_BASELINE};
    double bias[3] = {-0.5, 0, 0}, err[3] = {0.5, 0, 0};
    size_t judged[3] = {2, 2, 0};
    for (int m = 0; m < 3; m++) {
        struct ty_sim_opts o = toy(2, 1, TY_SCHED_POLICY_LOAD_BALANCE);
        o.sched.admission = modes[m];
        struct ty_sim_result r;
        assert_int_equal(ty_sim_run(t, &o, &r), 0);
        assert_int_equal(r.served, 2);
        assert_int_equal(r.judged, judged[m]);
        assert_true(fabs(r.judged_batch_bias - bias[m]) < 1e-9);
        assert_true(fabs(r.judged_batch_err - err[m]) < 1e-9);
        if (judged[m])
            assert_true(fabs(r.landed_batch_mean - 0.5) < 1e-9);
        ty_sim_result_fini(&r);
    }
    ty_sim_trace_free(t);
}

/* Two SLO classes half and half (class_mix): class 1's TTFT SLO (500 us) refuses each of its
 * 1000-token prompts (1000 us), class 0 has no SLO and serves all. Every request lands in one
 * class, both classes get some of the 40, and the per-class counts match the outcomes. A mix
 * longer than the classes is refused. */
static void test_class_mix(void **st)
{
    char text[8192];
    size_t len = 0;
    for (int i = 0; i < 40; i++)
        len += (size_t)snprintf(text + len, sizeof(text) - len,
                                "{\"timestamp\": %d, \"input_length\": 1000, "
                                "\"output_length\": 2, \"hash_ids\": [%d]}\n",
                                i * 10, 100 + i);
    struct ty_sim_trace *t = trace(text);
    struct ty_sim_opts o = toy(4, 2, TY_SCHED_POLICY_LOAD_BALANCE);
    o.sched.n_classes = 2;
    o.sched.slo[1].ttft_us = 500;
    o.class_mix[0] = o.class_mix[1] = 1;
    o.n_class_mix = 2;
    struct ty_sim_result r;
    assert_int_equal(ty_sim_run(t, &o, &r), 0);
    assert_int_equal(r.n_classes, 2);
    assert_int_equal(r.class_n[0] + r.class_n[1], 40);
    assert_true(r.class_n[0] >= 5 && r.class_n[1] >= 5);
    size_t seen[2] = {0, 0};
    for (int i = 0; i < 40; i++) {
        assert_true(r.out[i].cls < 2);
        seen[r.out[i].cls]++;
        assert_int_equal(r.out[i].rejected,
                         r.out[i].cls == 1 ? TY_SCHED_REJECT_TTFT : TY_SCHED_REJECT_NONE);
    }
    assert_int_equal(seen[0], r.class_n[0]);
    assert_int_equal(r.class_served[0], r.class_n[0]);
    assert_int_equal(r.class_served[1], 0);
    assert_int_equal(r.class_slo_met[0], r.class_n[0]);
    ty_sim_result_fini(&r);
    o.n_class_mix = 3; /* more shares than classes */
    assert_int_equal(ty_sim_run(t, &o, &r), TY_EINVAL);
    ty_sim_trace_free(t);
}

/* A 500 us TTFT SLO: request 0 needs 1000 us and is refused, so its blocks are never cached
 * and request 1 needs 1000 us too: both refused for TTFT, none served. */
static void test_ttft_rejection(void **st)
{
    struct ty_sim_trace *t = trace(two_turns);
    struct ty_sim_opts o = toy(1, 1, TY_SCHED_POLICY_KVCACHE_CENTRIC);
    o.sched.slo[0].ttft_us = 500;
    struct ty_sim_result r;
    assert_int_equal(ty_sim_run(t, &o, &r), 0);
    assert_int_equal(r.served, 0);
    assert_int_equal(r.rejected_by[TY_SCHED_REJECT_TTFT], 2);
    assert_true(r.slo_attainment == 0);
    ty_sim_result_fini(&r);
    /* 1500 us: both fit, SLO attainment 100% */
    o.sched.slo[0].ttft_us = 1500;
    assert_int_equal(ty_sim_run(t, &o, &r), 0);
    assert_int_equal(r.slo_met, 2);
    ty_sim_result_fini(&r);
    ty_sim_trace_free(t);
}

/* Four 100-token prompts at t = 0 on one prefill node whose calls cost 1000 us + 1 us per
 * token. One at a time: TTFTs 1100, 2200, 3300, 4400 us. Batched (4 per call): the first
 * starts alone at once, the three that queue behind it share the next call (1000 + 300 us):
 * 1100, 2400, 2400, 2400. With 250 tokens per call only two join: 1100, 2300, 2300, 3400.
 * Prompts starting with the same uncached block do not share a call (the second finds the
 * block cached in the next one). */
static void test_prefill_batch(void **st)
{
    const char *four =
        "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 1, \"hash_ids\": [1]}\n"
        "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 1, \"hash_ids\": [2]}\n"
        "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 1, \"hash_ids\": [3]}\n"
        "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 1, \"hash_ids\": [4]}\n";
    static const double want[3][4] = {{1100, 2200, 3300, 4400},
                                      {1100, 2400, 2400, 2400},
                                      {1100, 2300, 2300, 3400}};
    struct ty_sim_trace *t = trace(four);
    for (int k = 0; k < 3; k++) {
        struct ty_sim_opts o = toy(1, 1, TY_SCHED_POLICY_KVCACHE_CENTRIC);
        o.sched.cost.prefill[0] = o.truth.prefill[0] = 1000;
        o.prefill_batch = k ? 4 : 1;
        o.prefill_batch_tokens = k == 2 ? 250 : 0;
        struct ty_sim_result r;
        assert_int_equal(ty_sim_run(t, &o, &r), 0);
        assert_int_equal(r.served, 4);
        for (int i = 0; i < 4; i++)
            assert_true(fabs(r.out[i].ttft_us - want[k][i]) < 1e-6);
        assert_true(fabs(r.prefill_busy_s * 1e6 - (k == 0 ? 4400 : k == 1 ? 2400 : 3400)) < 1e-3);
        ty_sim_result_fini(&r);
    }
    ty_sim_trace_free(t);
    /* the same first block: the second prompt waits for the next call and reuses the block */
    t = trace("{\"timestamp\": 0, \"input_length\": 200, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
              "{\"timestamp\": 0, \"input_length\": 200, \"output_length\": 1, \"hash_ids\": [9]}\n"
              "{\"timestamp\": 0, \"input_length\": 200, \"output_length\": 1, \"hash_ids\": [9, 5]}\n");
    struct ty_sim_opts o = toy(1, 1, TY_SCHED_POLICY_KVCACHE_CENTRIC);
    o.sched.cost.prefill[0] = o.truth.prefill[0] = 1000;
    o.prefill_batch = 4;
    struct ty_sim_result r;
    assert_int_equal(ty_sim_run(t, &o, &r), 0);
    /* 0: 1200 alone; 1 joins nothing else (2 starts with its uncached block 9): 2400;
     * 2: next call, block 9 cached: 1000 + 100 -> 3500 */
    assert_true(fabs(r.out[0].ttft_us - 1200) < 1e-6);
    assert_true(fabs(r.out[1].ttft_us - 2400) < 1e-6);
    assert_true(fabs(r.out[2].ttft_us - 3500) < 1e-6);
    ty_sim_result_fini(&r);
    ty_sim_trace_free(t);
}

/* An interleaving node, calls of 64 tokens at 1000 us + 1 us per token. A 200-token prompt
 * and a 16-token one at t = 0: the long one starts alone (64 tokens, call 1 ends at 1064); the
 * short one joins call 2 beside the next 48 (1064 + 1064: TTFT 2128), then 64 (3192) and the
 * last 24 (4216). Without interleaving: 1200 and 1200 + 1016. A 40-token prompt (over half a
 * call) does not join a chunk: it waits for the long prompt's end. */
static void test_prefill_interleave(void **st)
{
    const char *two =
        "{\"timestamp\": 0, \"input_length\": 200, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
        "{\"timestamp\": 0, \"input_length\": 16, \"output_length\": 1, \"hash_ids\": [3]}\n";
    struct ty_sim_trace *t = trace(two);
    struct ty_sim_opts o = toy(1, 1, TY_SCHED_POLICY_KVCACHE_CENTRIC);
    o.sched.cost.prefill[0] = o.truth.prefill[0] = 1000;
    o.prefill_batch = 8;
    o.prefill_batch_tokens = 64;
    struct ty_sim_result r;
    assert_int_equal(ty_sim_run(t, &o, &r), 0);
    assert_true(fabs(r.out[0].ttft_us - 1200) < 1e-6 && fabs(r.out[1].ttft_us - 2216) < 1e-6);
    ty_sim_result_fini(&r);
    o.prefill_interleave = true;
    assert_int_equal(ty_sim_run(t, &o, &r), 0);
    assert_true(fabs(r.out[0].ttft_us - 4216) < 1e-6);
    assert_true(fabs(r.out[1].ttft_us - 2128) < 1e-6);
    assert_true(fabs(r.prefill_busy_s * 1e6 - 4216) < 1e-3); /* the four calls */
    ty_sim_result_fini(&r);
    ty_sim_trace_free(t);
    t = trace("{\"timestamp\": 0, \"input_length\": 200, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
              "{\"timestamp\": 0, \"input_length\": 40, \"output_length\": 1, \"hash_ids\": [3]}\n");
    assert_int_equal(ty_sim_run(t, &o, &r), 0);
    /* 4 calls of the long prompt alone: 1064 x 3 + 1008 = 4200; then the 40: 1040 */
    assert_true(fabs(r.out[0].ttft_us - 4200) < 1e-6);
    assert_true(fabs(r.out[1].ttft_us - 5240) < 1e-6);
    ty_sim_result_fini(&r);
    o.prefill_batch_tokens = 0; /* interleaving needs a call size */
    assert_int_equal(ty_sim_run(t, &o, &r), TY_EINVAL);
    ty_sim_trace_free(t);
}

static void test_bad_opts(void **st)
{
    struct ty_sim_trace *t = trace(two_turns);
    struct ty_sim_opts o = toy(0, 1, TY_SCHED_POLICY_RANDOM);
    struct ty_sim_result r;
    assert_int_equal(ty_sim_run(t, &o, &r), TY_EINVAL);
    o = toy(1, 1, TY_SCHED_POLICY_RANDOM);
    o.speed = 0;
    assert_int_equal(ty_sim_run(t, &o, &r), TY_EINVAL);
    ty_sim_trace_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_continuous_batching),
        cmocka_unit_test(test_prefill_batch),
        cmocka_unit_test(test_prefill_interleave),
        cmocka_unit_test(test_decode_picture_error),
        cmocka_unit_test(test_class_mix),
        cmocka_unit_test(test_ttft_rejection),
        cmocka_unit_test(test_bad_opts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
