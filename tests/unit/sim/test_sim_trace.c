/* Trace reader: well-formed input, and every kind of malformed line answered with file:line
 * and the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tycho/errors.h"
#include "tycho/sim.h"

static int parse(const char *text, struct ty_sim_trace **t, char *err, size_t n)
{
    return ty_sim_trace_parse(t, "t.jsonl", text, strlen(text), err, n);
}

static void test_good(void **st)
{
    const char *text =
        "{\"timestamp\": 5, \"input_length\": 1000, \"output_length\": 3, \"hash_ids\": [0, 1]}\n"
        "\n"
        "{\"timestamp\": 2, \"input_length\": 10, \"output_length\": 0, \"hash_ids\": []}\n"
        "{\"hash_ids\": [0, 7], \"output_length\": 9, \"input_length\": 600, \"timestamp\": 5}";
    struct ty_sim_trace *t;
    char err[256];
    assert_int_equal(parse(text, &t, err, sizeof(err)), 0);
    assert_int_equal(t->n, 3);
    assert_int_equal(t->n_blocks, 4);
    /* sorted by arrival, stable among equal timestamps */
    assert_int_equal(t->reqs[0].arrival_us, 2000);
    assert_int_equal(t->reqs[0].n_blocks, 0);
    assert_int_equal(t->reqs[1].input_tokens, 1000);
    assert_int_equal(t->reqs[1].blocks[1], 1);
    assert_int_equal(t->reqs[2].output_tokens, 9);
    assert_int_equal(t->reqs[2].blocks[1], 7);
    ty_sim_trace_free(t);
}

static void expect_error(const char *text, const char *want)
{
    struct ty_sim_trace *t = NULL;
    char err[256] = "";
    assert_int_equal(parse(text, &t, err, sizeof(err)), TY_EPARSE);
    assert_null(t);
    if (!strstr(err, want)) {
        fprintf(stderr, "got '%s', want '%s'\n", err, want);
        fail();
    }
}

static void test_errors(void **st)
{
    const char *ok = "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, "
                     "\"hash_ids\": [1]}\n";
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s\n{\"timestamp\": 0, \"input_length\": 5", ok);
    expect_error(buf, "t.jsonl:3: invalid JSON");
    expect_error("[1, 2]", "t.jsonl:1: expected a JSON object");
    expect_error("{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": []}",
                 "t.jsonl:1: field 'timestamp': missing");
    snprintf(buf, sizeof(buf), "%s%s", ok,
             "{\"timestamp\": 1, \"input_length\": -5, \"output_length\": 1, \"hash_ids\": []}");
    expect_error(buf, "t.jsonl:2: field 'input_length': out of range");
    expect_error("{\"timestamp\": 1, \"input_length\": \"5\", \"output_length\": 1, "
                 "\"hash_ids\": []}",
                 "field 'input_length': not an integer");
    expect_error("{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 1, "
                 "\"hash_ids\": []}",
                 "field 'input_length': must be at least 1");
    expect_error("{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1, "
                 "\"hash_ids\": {}}",
                 "field 'hash_ids': not an array");
    expect_error("{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1, "
                 "\"hash_ids\": [1, -2]}",
                 "field 'hash_ids': element is not a non-negative integer");
    expect_error("{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1e3, "
                 "\"hash_ids\": [1]}",
                 "field 'output_length': not an integer");
    expect_error("{\"timestamp\": 1, \"timestamp\": 2, \"input_length\": 5, "
                 "\"output_length\": 1, \"hash_ids\": [1]}",
                 "t.jsonl:1: invalid JSON");
    /* NUL bytes and garbage never crash */
    static const char junk[] = "{\"timestamp\"\0: 1}\n\xff\xfe";
    struct ty_sim_trace *t = NULL;
    assert_int_equal(ty_sim_trace_parse(&t, "j", junk, sizeof(junk) - 1, NULL, 0), TY_EPARSE);
}

static void test_missing_file(void **st)
{
    struct ty_sim_trace *t;
    char err[256];
    assert_int_equal(ty_sim_trace_load(&t, "/nonexistent/x.jsonl", err, sizeof(err)), TY_ENOENT);
    assert_non_null(strstr(err, "/nonexistent/x.jsonl"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_missing_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
