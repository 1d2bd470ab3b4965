/* Metrics registry: the rendered text of a hand-built registry, compared line by line with the
 * Prometheus text exposition format 0.0.4 (HELP/TYPE lines, escaping of help text and label
 * values, cumulative histogram buckets ending in +Inf, _sum and _count), name rules, and
 * lock-free updates from several threads adding up exactly.
 */
#include "tycho/errors.h"
#include "tycho/metrics.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void test_render(void **state)
{
    ty_metrics_registry_t *reg;
    ty_metrics_family_t *req, *running, *lat, *plain;
    ty_metrics_child_t *c200, *c500, *run, *h_a, *h_b, *p;
    assert_int_equal(ty_metrics_registry_new(&reg), 0);

    const char *req_labels[] = {"code", "path"};
    assert_int_equal(ty_metrics_counter_new(reg, &req, "tycho_http_requests_total",
                                            "HTTP requests by\nstatus \\ path.", req_labels, 2),
                     0);
    assert_int_equal(ty_metrics_child_get(req, (const char *[]){"200", "/v1/chat"}, &c200), 0);
    assert_int_equal(ty_metrics_child_get(req, (const char *[]){"500", "a\"b\\c\nd"}, &c500), 0);
    ty_metrics_counter_inc(c200);
    ty_metrics_counter_add(c200, 2);
    ty_metrics_counter_add(c200, -5); /* ignored: counters only go up */
    ty_metrics_counter_inc(c500);

    assert_int_equal(ty_metrics_gauge_new(reg, &running, "vllm:num_requests_running",
                                          "Requests running.", NULL, 0),
                     0);
    assert_int_equal(ty_metrics_child_get(running, NULL, &run), 0);
    ty_metrics_gauge_set(run, 7);
    ty_metrics_gauge_add(run, -2.5);

    const double bounds[] = {0.005, 0.1, 1, 2.5};
    const char *lat_labels[] = {"node"};
    assert_int_equal(ty_metrics_histogram_new(reg, &lat, "tycho_ttft_seconds", "TTFT.",
                                              lat_labels, 1, bounds, 4),
                     0);
    assert_int_equal(ty_metrics_child_get(lat, (const char *[]){"p0"}, &h_a), 0);
    assert_int_equal(ty_metrics_child_get(lat, (const char *[]){"p1"}, &h_b), 0);
    ty_metrics_histogram_observe(h_a, 0.005); /* on a bound: counts in that bucket (le) */
    ty_metrics_histogram_observe(h_a, 0.05);
    ty_metrics_histogram_observe(h_a, 0.5);
    ty_metrics_histogram_observe(h_a, 3);
    ty_metrics_histogram_observe(h_a, 100);

    assert_int_equal(ty_metrics_gauge_new(reg, &plain, "tycho_build_info", "", NULL, 0), 0);
    assert_int_equal(ty_metrics_child_get(plain, NULL, &p), 0);
    ty_metrics_gauge_set(p, 1e21);

    /* The same child comes back for the same label values. */
    ty_metrics_child_t *again;
    assert_int_equal(ty_metrics_child_get(req, (const char *[]){"200", "/v1/chat"}, &again), 0);
    assert_ptr_equal(again, c200);

    char *text;
    size_t len;
    assert_int_equal(ty_metrics_render(reg, &text, &len), 0);
    const char *want =
        "# HELP tycho_http_requests_total HTTP requests by\\nstatus \\\\ path.\n"
        "# TYPE tycho_http_requests_total counter\n"
        "tycho_http_requests_total{code=\"200\",path=\"/v1/chat\"} 3\n"
        "tycho_http_requests_total{code=\"500\",path=\"a\\\"b\\\\c\\nd\"} 1\n"
        "# HELP vllm:num_requests_running Requests running.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        "vllm:num_requests_running 4.5\n"
        "# HELP tycho_ttft_seconds TTFT.\n"
        "# TYPE tycho_ttft_seconds histogram\n"
        "tycho_ttft_seconds_bucket{node=\"p0\",le=\"0.005\"} 1\n"
        "tycho_ttft_seconds_bucket{node=\"p0\",le=\"0.1\"} 2\n"
        "tycho_ttft_seconds_bucket{node=\"p0\",le=\"1\"} 3\n"
        "tycho_ttft_seconds_bucket{node=\"p0\",le=\"2.5\"} 3\n"
        "tycho_ttft_seconds_bucket{node=\"p0\",le=\"+Inf\"} 5\n"
        "tycho_ttft_seconds_sum{node=\"p0\"} 103.555\n"
        "tycho_ttft_seconds_count{node=\"p0\"} 5\n"
        "tycho_ttft_seconds_bucket{node=\"p1\",le=\"0.005\"} 0\n"
        "tycho_ttft_seconds_bucket{node=\"p1\",le=\"0.1\"} 0\n"
        "tycho_ttft_seconds_bucket{node=\"p1\",le=\"1\"} 0\n"
        "tycho_ttft_seconds_bucket{node=\"p1\",le=\"2.5\"} 0\n"
        "tycho_ttft_seconds_bucket{node=\"p1\",le=\"+Inf\"} 0\n"
        "tycho_ttft_seconds_sum{node=\"p1\"} 0\n"
        "tycho_ttft_seconds_count{node=\"p1\"} 0\n"
        "# HELP tycho_build_info \n"
        "# TYPE tycho_build_info gauge\n"
        "tycho_build_info 1e+21\n";
    /* line by line, so a failure names the line */
    const char *g = text, *w = want;
    int line = 1;
    while (*g || *w) {
        const char *ge = strchr(g, '\n'), *we = strchr(w, '\n');
        assert_non_null(ge);
        assert_non_null(we);
        if ((ge - g) != (we - w) || memcmp(g, w, (size_t)(ge - g)) != 0)
            fail_msg("line %d: got '%.*s' want '%.*s'", line, (int)(ge - g), g, (int)(we - w), w);
        g = ge + 1;
        w = we + 1;
        line++;
    }
    assert_int_equal(len, strlen(want));
    free(text);
    ty_metrics_registry_free(reg);
}

/* Removing a child drops its series (head, middle and tail of the list) and the family goes on:
 * new children append after the remaining ones, and the same labels again start from zero. */
static void test_remove(void **state)
{
    ty_metrics_registry_t *reg;
    ty_metrics_family_t *up;
    ty_metrics_child_t *c[4], *again;
    assert_int_equal(ty_metrics_registry_new(&reg), 0);
    assert_int_equal(ty_metrics_gauge_new(reg, &up, "tycho_node_up", "Up.",
                                          (const char *[]){"node"}, 1),
                     0);
    const char *names[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ty_metrics_child_get(up, (const char *[]){names[i]}, &c[i]), 0);
        ty_metrics_gauge_set(c[i], i + 1);
    }
    ty_metrics_child_remove(c[1]); /* middle */
    ty_metrics_child_remove(c[0]); /* head */
    ty_metrics_child_remove(c[3]); /* tail */
    ty_metrics_child_remove(NULL);
    assert_int_equal(ty_metrics_child_get(up, (const char *[]){"e"}, &again), 0);
    ty_metrics_gauge_set(again, 5);
    assert_int_equal(ty_metrics_child_get(up, (const char *[]){"a"}, &again), 0);
    char *text;
    size_t len;
    assert_int_equal(ty_metrics_render(reg, &text, &len), 0);
    assert_string_equal(text, "# HELP tycho_node_up Up.\n# TYPE tycho_node_up gauge\n"
                              "tycho_node_up{node=\"c\"} 3\ntycho_node_up{node=\"e\"} 5\n"
                              "tycho_node_up{node=\"a\"} 0\n");
    free(text);
    ty_metrics_registry_free(reg);
}

static void test_names(void **state)
{
    ty_metrics_registry_t *reg;
    ty_metrics_family_t *f;
    ty_metrics_registry_new(&reg);
    const char *le[] = {"le"}, *dunder[] = {"__x"}, *colon[] = {"a:b"}, *dup[] = {"a", "a"};
    const double b[] = {1, 1};
    assert_int_equal(ty_metrics_counter_new(reg, &f, "9bad", "", NULL, 0), TY_EINVAL);
    assert_int_equal(ty_metrics_counter_new(reg, &f, "bad-name", "", NULL, 0), TY_EINVAL);
    assert_int_equal(ty_metrics_counter_new(reg, &f, "ok", "", dunder, 1), TY_EINVAL);
    assert_int_equal(ty_metrics_counter_new(reg, &f, "ok", "", colon, 1), TY_EINVAL);
    assert_int_equal(ty_metrics_counter_new(reg, &f, "ok", "", dup, 2), TY_EINVAL);
    assert_int_equal(ty_metrics_histogram_new(reg, &f, "h", "", le, 1, NULL, 0), TY_EINVAL);
    assert_int_equal(ty_metrics_histogram_new(reg, &f, "h", "", NULL, 0, b, 2), TY_EINVAL);
    assert_int_equal(ty_metrics_counter_new(reg, &f, "ok:x_1", "", NULL, 0), 0);
    assert_int_equal(ty_metrics_gauge_new(reg, &f, "ok:x_1", "", NULL, 0), TY_EEXIST);
    ty_metrics_registry_free(reg);
}

#define N_THREADS 4
#define N_ITERS 100000

static void *hammer(void *arg)
{
    ty_metrics_family_t **fams = arg;
    ty_metrics_child_t *c, *h;
    ty_metrics_child_get(fams[0], (const char *[]){"x"}, &c);
    ty_metrics_child_get(fams[1], NULL, &h);
    for (int i = 0; i < N_ITERS; i++) {
        ty_metrics_counter_inc(c);
        ty_metrics_histogram_observe(h, (i % 2) ? 0.5 : 2.0);
    }
    return NULL;
}

static void test_threads(void **state)
{
    ty_metrics_registry_t *reg;
    ty_metrics_family_t *fams[2];
    ty_metrics_registry_new(&reg);
    const char *l[] = {"k"};
    const double b[] = {1};
    ty_metrics_counter_new(reg, &fams[0], "c_total", "c", l, 1);
    ty_metrics_histogram_new(reg, &fams[1], "h", "h", NULL, 0, b, 1);
    pthread_t t[N_THREADS];
    for (int i = 0; i < N_THREADS; i++)
        pthread_create(&t[i], NULL, hammer, fams);
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(t[i], NULL);
    char *text;
    assert_int_equal(ty_metrics_render(reg, &text, NULL), 0);
    /* 4 x 100000 increments; half the observations are 0.5 (le=1), half 2.0 */
    assert_non_null(strstr(text, "c_total{k=\"x\"} 400000\n"));
    assert_non_null(strstr(text, "h_bucket{le=\"1\"} 200000\n"));
    assert_non_null(strstr(text, "h_bucket{le=\"+Inf\"} 400000\n"));
    assert_non_null(strstr(text, "h_sum 500000\n"));
    assert_non_null(strstr(text, "h_count 400000\n"));
    free(text);
    ty_metrics_registry_free(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_remove),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
