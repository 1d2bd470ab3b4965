#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/clock.h"
#include "tycho/log.h"

#include <stdio.h>
#include <string.h>

struct capture {
    int lines;
    uint64_t suppressed;
    char last[256];
    char subsys[32];
    enum ty_log_level level;
};

static void capture_sink(enum ty_log_level level, const char *subsys, const char *msg,
                         uint64_t suppressed, void *arg)
{
    struct capture *c = arg;
    c->lines++;
    c->suppressed += suppressed;
    c->level = level;
    snprintf(c->last, sizeof(c->last), "%s", msg);
    snprintf(c->subsys, sizeof(c->subsys), "%s", subsys);
}

static void test_levels_and_sink(void **state)
{
    struct capture c = {0};
    ty_log_set_sink(capture_sink, &c);
    ty_log_set_ratelimit(0, 1000);
    ty_log_set_level(TY_LOG_LEVEL_INFO);
    TY_LOG_INFO("rpc", "hello %d", 42);
    TY_LOG_DEBUG("rpc", "not shown");
    assert_int_equal(c.lines, 1);
    assert_string_equal(c.last, "hello 42");
    assert_string_equal(c.subsys, "rpc");
    assert_int_equal(c.level, TY_LOG_LEVEL_INFO);
    ty_log_set_level(TY_LOG_LEVEL_DEBUG);
    TY_LOG_DEBUG("rpc", "now shown");
    assert_int_equal(c.lines, 2);
    ty_log_set_sink(NULL, NULL);
}

static void emit_same_site(int n)
{
    for (int i = 0; i < n; i++)
        TY_LOG_WARN("net", "peer %d unreachable", i);
}

static void test_ratelimit(void **state)
{
    struct capture c = {0};
    ty_log_set_sink(capture_sink, &c);
    ty_log_set_level(TY_LOG_LEVEL_INFO);
    ty_log_set_ratelimit(5, 200);
    emit_same_site(100);
    assert_int_equal(c.lines, 5); /* the burst, then silence */
    ty_sleep_ns(250 * TY_NS_PER_MS);
    emit_same_site(1);
    assert_int_equal(c.lines, 6);
    assert_int_equal(c.suppressed, 95); /* reported with the first line of the next window */
    /* Another call site has its own budget. */
    TY_LOG_WARN("net", "other site");
    assert_int_equal(c.lines, 7);
    ty_log_set_sink(NULL, NULL);
    ty_log_set_ratelimit(10, 1000);
}

static void test_level_parse(void **state)
{
    enum ty_log_level lv;
    assert_int_equal(ty_log_level_parse("debug", &lv), 0);
    assert_int_equal(lv, TY_LOG_LEVEL_DEBUG);
    assert_int_equal(ty_log_level_parse("WARNING", &lv), 0);
    assert_int_equal(lv, TY_LOG_LEVEL_WARN);
    assert_true(ty_log_level_parse("loud", &lv) < 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels_and_sink),
        cmocka_unit_test(test_ratelimit),
        cmocka_unit_test(test_level_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
