/* The real Mooncake traces (data/traces of the test data, TYCHO_TEST_DATA; exit 77 without
 * them): the reuse ratio at unlimited capacity that the issue gives (0.366 conversation, 0.640
 * synthetic) and the FAST'25 Fig. 5 ordering of average TTFT on 16 nodes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "tycho/errors.h"
#include "tycho/sim.h"

static struct ty_sim_trace *conv, *syn;

static struct ty_sim_trace *load(const char *name)
{
    const char *dir = getenv("TYCHO_TEST_DATA");
    char path[4096], err[512];
    snprintf(path, sizeof(path), "%s/data/traces/%s", dir ? dir : "../shared", name);
    struct ty_sim_trace *t = NULL;
    if (ty_sim_trace_load(&t, path, err, sizeof(err)) < 0)
        return NULL;
    return t;
}

static void test_reuse_ratio(void **st)
{
    assert_int_equal(conv->n, 12031);
    assert_int_equal(syn->n, 3993);
    for (int pol = 0; pol < TY_SIM_EVICT_COUNT_; pol++) {
        struct ty_sim_cache_result r;
        assert_int_equal(ty_sim_cache_run(conv, 0, (enum ty_sim_evict)pol, &r), 0);
        assert_true(r.hit_rate > 0.3655 && r.hit_rate < 0.3665);
        assert_int_equal(ty_sim_cache_run(syn, 0, (enum ty_sim_evict)pol, &r), 0);
        assert_true(r.hit_rate > 0.6395 && r.hit_rate < 0.6405);
    }
    struct ty_sim_cache_result small;
    assert_int_equal(ty_sim_cache_run(conv, 1000, TY_SIM_EVICT_LRU, &small), 0);
    assert_true(small.hit_rate < 0.366); /* a finite pool can only lose hits */
}

/* 8 prefill + 8 decode nodes, A800 profile, unlimited caches, no SLO limits. */
static void test_policy_ordering(void **st)
{
    enum ty_sched_policy order[4] = {TY_SCHED_POLICY_KVCACHE_CENTRIC, TY_SCHED_POLICY_CACHE_AWARE,
                                     TY_SCHED_POLICY_LOAD_BALANCE, TY_SCHED_POLICY_RANDOM};
    double ttft[4];
    for (int i = 0; i < 4; i++) {
        struct ty_sim_opts o;
        ty_sim_opts_default(&o);
        o.sched.policy = order[i];
        o.sched.admission = TY_SCHED_ADMIT_BASELINE;
        struct ty_sim_result r;
        assert_int_equal(ty_sim_run(conv, &o, &r), 0);
        assert_int_equal(r.served, 12031);
        ttft[i] = r.ttft_mean;
        ty_sim_result_fini(&r);
    }
    fprintf(stderr, "mean TTFT s: kvcache_centric %.2f cache_aware %.2f load_balance %.2f "
                    "random %.2f\n", ttft[0], ttft[1], ttft[2], ttft[3]);
    for (int i = 0; i < 3; i++)
        assert_true(ttft[i] < ttft[i + 1]);
}

int main(void)
{
    conv = load("conversation_trace.jsonl");
    syn = load("synthetic_trace.jsonl");
    if (!conv || !syn) {
        fprintf(stderr, "traces not found under $TYCHO_TEST_DATA/data/traces: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse_ratio),
        cmocka_unit_test(test_policy_ordering),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ty_sim_trace_free(conv);
    ty_sim_trace_free(syn);
    return rc;
}
