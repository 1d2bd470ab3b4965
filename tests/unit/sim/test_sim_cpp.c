/* Chunked pipeline parallelism in the cost model (ty_sched_cpp_*) and the simulator
 * (ty_sim_opts.cpp), on a toy cost model whose outcomes are worked out by hand below. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tycho/errors.h"
#include "tycho/sim.h"

/* Prefill: 100 us per call + 1 us per token (+ p2 per L^2 - P^2); hidden states 0.1 byte a
 * token over 1 byte/us (100 us per 1000-token chunk); KV nearly free; 100-token blocks. */
static struct ty_sched_cost toy_cost(double p2)
{
    struct ty_sched_cost c = {.prefill = {100, 1, p2}, .decode = {100, 50, 0},
                              .kv_bytes_per_token = 0.001, .net_bytes_per_us = 1,
                              .block_tokens = 100};
    return c;
}

static const struct ty_sched_cpp two = {.stages = 2, .chunk_tokens = 1000,
                                        .hidden_bytes_per_token = 0.1};

static bool near(double a, double b)
{
    return fabs(a - b) < 1e-6;
}

/* 3000 tokens, 2 stages, chunks of 1000: each stage call is (100 + 1000) / 2 = 550 us, a hop
 * 100 us. Stage 0 ends chunks at 550, 1100, 1650; stage 1 starts chunk 0 at 650 (-> 1200),
 * chunk 1 at max(1200, 1100 + 100) (-> 1750), chunk 2 at max(1750, 1750) (-> 2300). One node:
 * 100 + 3000 = 3100. With p2 = 1e-4 the chunks' attention adds 100, 300, 500 us (calls of
 * 600, 700, 800 per stage): stage 0 ends 600, 1300, 2100; stage 1 runs 700-1300, 1400-2100,
 * 2200-3000; one node 100 + 3000 + 900 = 4000. */
static void test_cost_hand_worked(void **st)
{
    struct ty_sched_cost c = toy_cost(0);
    assert_true(near(ty_sched_cpp_prefill_us(&c, &two, 3000, 0, NULL), 2300));
    assert_true(near(ty_sched_cost_prefill_us(&c, 3000, 0), 3100));
    c = toy_cost(1e-4);
    assert_true(near(ty_sched_cpp_prefill_us(&c, &two, 3000, 0, NULL), 3000));
    assert_true(near(ty_sched_cost_prefill_us(&c, 3000, 0), 4000));
    /* stage 1 busy for its first 2000 us: chunk 0 there 2000-2600, 1 2600-3300, 2 3300-4100 */
    double ready[2] = {0, 2000};
    assert_true(near(ty_sched_cpp_prefill_us(&c, &two, 3000, 0, ready), 4100));
    /* one stage: the one-node model */
    struct ty_sched_cpp one = {.stages = 1};
    assert_true(near(ty_sched_cpp_prefill_us(&c, &one, 3000, 0, NULL), 4000));
}

/* Threshold (p2 = 0): up to 1000 tokens (one chunk) the pipeline only adds a hop. For
 * n = 1000 + m: stage 1 ends chunk 0 at 1200 and chunk 1 at 1200 + (100 + m) / 2, one node
 * takes 1100 + m: the pipeline wins for m > 300, so from 1400 (blocks of 100). */
static void test_threshold(void **st)
{
    struct ty_sched_cost c = toy_cost(0);
    assert_int_equal(ty_sched_cpp_threshold(&c, &two, 100000), 1400);
    assert_true(ty_sched_cpp_prefill_us(&c, &two, 1300, 0, NULL) >=
                ty_sched_cost_prefill_us(&c, 1300, 0));
    /* a link slower than a stage computes (10 ms a chunk against 550 us): the hand-overs of
     * successive chunks queue on it, and the pipeline never wins */
    struct ty_sched_cpp slow = two;
    slow.hidden_bytes_per_token = 10;
    assert_int_equal(ty_sched_cpp_threshold(&c, &slow, 100000), 0);
    struct ty_sched_cpp one = {.stages = 1};
    assert_int_equal(ty_sched_cpp_threshold(&c, &one, 100000), 0);
}

static struct ty_sim_trace *trace(const char *text)
{
    struct ty_sim_trace *t;
    char err[256];
    assert_int_equal(ty_sim_trace_parse(&t, "toy", text, strlen(text), err, sizeof(err)), 0);
    return t;
}

static struct ty_sim_opts toy_sim(uint32_t n_prefill)
{
    struct ty_sim_opts o;
    ty_sim_opts_default(&o);
    o.sched.cost = toy_cost(0);
    o.sched.policy = TY_SCHED_POLICY_KVCACHE_CENTRIC;
    o.truth = o.sched.cost;
    o.n_prefill = n_prefill;
    o.n_decode = 1;
    o.cpp = two;
    return o;
}

/* The 3000-token prompt alone: its TTFT is the pipeline's 2300 us (threshold from the cost
 * model: 1400), one node's 3100 without cpp. */
static void test_sim_alone(void **st)
{
    struct ty_sim_trace *t = trace(
        "{\"timestamp\": 0, \"input_length\": 3000, \"output_length\": 1, \"hash_ids\": [1]}\n");
    struct ty_sim_opts o = toy_sim(2);
    struct ty_sim_result r;
    assert_int_equal(ty_sim_run(t, &o, &r), 0);
    assert_int_equal(r.served, 1);
    assert_int_equal(r.pipelined, 1);
    assert_int_equal(r.cpp_threshold, 1400);
    assert_true(near(r.out[0].ttft_us, 2300));
    ty_sim_result_fini(&r);
    o.cpp.stages = 0;
    assert_int_equal(ty_sim_run(t, &o, &r), 0);
    assert_int_equal(r.pipelined, 0);
    assert_true(near(r.out[0].ttft_us, 3100));
    ty_sim_result_fini(&r);
    ty_sim_trace_free(t);
}

/* A short prompt arriving 1 ms into the pipelined one, with both nodes in its group: whichever
 * the scheduler picks is busy (or held) until 2300, so it ends at 2300 + 100 + 100 us and
 * its TTFT is 2500 - 1000 = 1500. A prompt under the threshold is not pipelined. */
static void test_sim_group_held(void **st)
{
    struct ty_sim_trace *t = trace(
        "{\"timestamp\": 0, \"input_length\": 3000, \"output_length\": 1, \"hash_ids\": [1]}\n"
        "{\"timestamp\": 1, \"input_length\": 100, \"output_length\": 1, \"hash_ids\": [2]}\n");
    struct ty_sim_opts o = toy_sim(2);
    struct ty_sim_result r;
    assert_int_equal(ty_sim_run(t, &o, &r), 0);
    assert_int_equal(r.served, 2);
    assert_int_equal(r.pipelined, 1);
    assert_true(near(r.out[0].ttft_us, 2300));
    assert_true(near(r.out[1].ttft_us, 1500));
    ty_sim_result_fini(&r);
    ty_sim_trace_free(t);
}

/* The scheduler predicts a pipelined prompt's prefill as the pipeline's (2300 us for the
 * 3000-token prompt above, not one node's 3100), reusing no prefix; so a TTFT SLO of 2500 us
 * admits it with the group and refuses it (never fits) without. Under the threshold or within
 * one chunk, one node's time. */
static void test_sched_predicts_pipeline(void **st)
{
    struct ty_sched_opts o;
    ty_sched_opts_default(&o);
    o.cost = toy_cost(0);
    o.policy = TY_SCHED_POLICY_KVCACHE_CENTRIC;
    o.admission = TY_SCHED_ADMIT_EARLY;
    o.slo[0].ttft_us = 2500;
    o.cpp = two;
    ty_sched_t *s;
    assert_int_equal(ty_sched_new(&s, &o), 0);
    struct ty_sched_node_desc pd = {.role = TY_SCHED_ROLE_PREFILL};
    struct ty_sched_node_desc dd = {.role = TY_SCHED_ROLE_DECODE, .kv_capacity_tokens = 100000};
    assert_int_equal(ty_sched_node_add(s, 0, &pd), 0);
    assert_int_equal(ty_sched_node_add(s, 1, &pd), 0);
    assert_int_equal(ty_sched_node_add(s, 2, &dd), 0);
    struct ty_sched_request r = {.id = 1, .prompt_tokens = 3000, .output_tokens = 1};
    struct ty_sched_decision d;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_NONE);
    assert_true(near(d.prefill_us, 2300));
    ty_sched_request_done(s, 1, 1);
    r.id = 2;
    r.prompt_tokens = 900; /* one chunk: one node (100 + 900) */
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_true(near(d.prefill_us, 1000));
    ty_sched_request_done(s, 2, 1);
    struct ty_sched_cpp off = {.stages = 0};
    assert_int_equal(ty_sched_set_cpp(s, &off, 0), 0);
    r.id = 3;
    r.prompt_tokens = 3000;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_TTFT);
    assert_true(d.never_fits);
    assert_int_equal(ty_sched_set_cpp(s, &two, 5000), 0); /* a threshold above the prompt */
    r.id = 4;
    assert_int_equal(ty_sched_pick(s, &r, 0, &d), 0);
    assert_int_equal(d.reject, TY_SCHED_REJECT_TTFT);
    ty_sched_free(s);
}

/* Settings the simulator refuses: a group larger than the prefill nodes, with interleaving. */
static void test_sim_bad_opts(void **st)
{
    struct ty_sim_trace *t = trace(
        "{\"timestamp\": 0, \"input_length\": 3000, \"output_length\": 1, \"hash_ids\": [1]}\n");
    struct ty_sim_opts o = toy_sim(2);
    struct ty_sim_result r;
    o.cpp.stages = 3;
    assert_int_equal(ty_sim_run(t, &o, &r), TY_EINVAL);
    o = toy_sim(2);
    o.prefill_interleave = true;
    o.prefill_batch_tokens = 512;
    assert_int_equal(ty_sim_run(t, &o, &r), TY_EINVAL);
    ty_sim_trace_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost_hand_worked), cmocka_unit_test(test_threshold),
        cmocka_unit_test(test_sim_alone),        cmocka_unit_test(test_sim_group_held),
        cmocka_unit_test(test_sim_bad_opts),     cmocka_unit_test(test_sched_predicts_pipeline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
