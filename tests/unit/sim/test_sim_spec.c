/* Cluster spec files of `tycho sim`: the examples in configs/sim/ load with the values they
 * state (read off the files by hand), and the `scheduler:` section - the Conductor's own
 * table - reports a bad policy with file:line:column and the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tycho/errors.h"
#include "tycho/sim_config.h"

static void load_example(const char *name, struct ty_sim_opts *o)
{
    char path[1024], err[512] = "";
    snprintf(path, sizeof(path), "%s/configs/sim/%s", getenv("TYCHO_SOURCE_DIR"), name);
    ty_sim_spec_t *sp;
    if (ty_sim_spec_load(&sp, path, NULL, 0, o, err, sizeof(err)) != 0)
        fail_msg("%s: %s", path, err);
    ty_sim_spec_free(sp);
}

static void test_examples(void **st)
{
    (void)st;
    struct ty_sim_opts o;
    load_example("overload-2x.yaml", &o);
    assert_int_equal(o.n_prefill, 8);
    assert_int_equal(o.n_decode, 1);
    assert_int_equal(o.decode_kv_tokens, 1500000);
    assert_int_equal(o.sched.policy, TY_SCHED_POLICY_KVCACHE_CENTRIC);
    assert_int_equal(o.sched.admission, TY_SCHED_ADMIT_PREDICTED);
    assert_int_equal(o.sched.decode_duration_us, 28000000);
    assert_int_equal(o.sched.n_classes, 1);
    assert_int_equal(o.sched.slo[0].ttft_us, 30000000);
    assert_int_equal(o.sched.slo[0].tbt_us, 100000);
    assert_true(o.speed == 2.0);
    load_example("overload-2x-tbt25.yaml", &o);
    assert_int_equal(o.n_decode, 2);
    assert_int_equal(o.sched.slo[0].tbt_us, 25000);
    assert_int_equal(o.sched.decode_duration_us, 8500000);
    load_example("classes-2x.yaml", &o);
    assert_int_equal(o.sched.n_classes, 2);
    assert_int_equal(o.sched.slo[1].ttft_us, 60000000);
    assert_int_equal(o.sched.slo[1].tbt_us, 100000);
    assert_int_equal(o.n_class_mix, 2);
    assert_true(o.class_mix[0] == 0.7 && o.class_mix[1] == 0.3);
    load_example("conversation-16.yaml", &o);
    assert_int_equal(o.sched.admission, TY_SCHED_ADMIT_BASELINE);
    assert_int_equal(o.sched.slo[0].ttft_us, 0);
    assert_false(o.sched.local_prefix_only); /* peer prefixes unless the spec says otherwise */
}

/* scheduler.local_prefix_only (the Conductor's own setting) reaches the scheduler's options. */
static void test_local_prefix_only(void **st)
{
    (void)st;
    char *args[] = {"--scheduler.local_prefix_only=true"};
    struct ty_sim_opts o;
    ty_sim_spec_t *sp = NULL;
    char err[512] = "";
    if (ty_sim_spec_load(&sp, NULL, args, 1, &o, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    assert_true(o.sched.local_prefix_only);
    ty_sim_spec_free(sp);
    char *bad[] = {"--scheduler.local_prefix_only=sometimes"};
    assert_int_equal(ty_sim_spec_load(&sp, NULL, bad, 1, &o, err, sizeof(err)), TY_ECONFIG);
    assert_non_null(strstr(err, "scheduler.local_prefix_only"));
}

/* Write a spec file with that text under a fresh name made from the template in path. */
static void write_spec(char *path, const char *text)
{
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_bad_policy(void **st)
{
    (void)st;
    char path[] = "/tmp/tycho-sim-spec-XXXXXX";
    write_spec(path, "cluster:\n  prefill_nodes: 2\nscheduler:\n  admission: early\n  policy: fastest\n");
    struct ty_sim_opts o;
    ty_sim_spec_t *sp = NULL;
    char err[512] = "", want[600];
    assert_int_equal(ty_sim_spec_load(&sp, path, NULL, 0, &o, err, sizeof(err)), TY_ECONFIG);
    snprintf(want, sizeof(want), "%s:5:3: scheduler.policy: ", path);
    if (!strstr(err, want))
        fail_msg("want '%s' in '%s'", want, err);
    /* the same through a flag override */
    char *args[] = {"--scheduler.admission=sometimes"};
    assert_int_equal(ty_sim_spec_load(&sp, NULL, args, 1, &o, err, sizeof(err)), TY_ECONFIG);
    assert_non_null(strstr(err, "scheduler.admission"));
    unlink(path);
}

/* class_mix: shares per SLO class of the served model, checked against its classes. */
static void test_class_mix(void **st)
{
    (void)st;
    char path[] = "/tmp/tycho-sim-spec-XXXXXX";
    write_spec(path, "scheduler:\n  models:\n    - name: m\n      slo:\n"
          "        - {class: interactive, ttft: 5s, tbt: 25ms}\n"
          "        - {class: batch, ttft: 60s}\n"
          "class_mix: [0.75, 0.25]\n");
    struct ty_sim_opts o;
    ty_sim_spec_t *sp = NULL;
    char err[512] = "";
    if (ty_sim_spec_load(&sp, path, NULL, 0, &o, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    assert_int_equal(o.n_class_mix, 2);
    assert_true(o.class_mix[0] == 0.75 && o.class_mix[1] == 0.25);
    assert_string_equal(ty_sim_spec_class(sp, 1), "batch");
    ty_sim_spec_free(sp);
    char *three[] = {"--class_mix=[1, 1, 1]"};
    assert_int_equal(ty_sim_spec_load(&sp, path, three, 1, &o, err, sizeof(err)), TY_ECONFIG);
    assert_non_null(strstr(err, "class_mix: 3 shares, but model 'm' has 2 SLO classes"));
    char *neg[] = {"--class_mix=[1, -1]"};
    assert_int_equal(ty_sim_spec_load(&sp, path, neg, 1, &o, err, sizeof(err)), TY_ECONFIG);
    assert_non_null(strstr(err, "class_mix"));
    char *zero[] = {"--class_mix=[0, 0]"};
    assert_int_equal(ty_sim_spec_load(&sp, path, zero, 1, &o, err, sizeof(err)), TY_ECONFIG);
    assert_non_null(strstr(err, "add up to 0"));
    unlink(path);
}

int main(void)
{
    if (!getenv("TYCHO_SOURCE_DIR"))
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_examples),
        cmocka_unit_test(test_bad_policy),
        cmocka_unit_test(test_class_mix),
        cmocka_unit_test(test_local_prefix_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
