/* Tool calls and reasoning in model output (api_tools.c): each family's syntax parsed into
 * OpenAI's message (content, reasoning_content, tool_calls), and the same output fed as a
 * stream cut at every size of piece assembles to that same message. Expected messages are
 * written by hand from the families' formats (Qwen/Hermes, gpt-oss harmony, DeepSeek-V3,
 * Llama 3 JSON) and OpenAI's. */
#include "api-tools.h"

#include "tycho/errors.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

struct want {
    const char *reasoning; /* NULL: none */
    const char *content;   /* NULL: null */
    const char *calls[4][2]; /* name, arguments (compact JSON) */
};

/* What a client assembles from the deltas. */
struct got {
    char reasoning[512], content[512];
    bool any_reasoning;
    size_t n_calls;
    char names[4][64], args[4][256];
    size_t last_index;
};

static void on_delta(void *arg, const struct ty__api_delta *d)
{
    struct got *g = arg;
    switch (d->kind) {
    case TY__API_DELTA_REASONING:
        g->any_reasoning = true;
        strncat(g->reasoning, d->text, d->len);
        break;
    case TY__API_DELTA_CONTENT:
        strncat(g->content, d->text, d->len);
        break;
    case TY__API_DELTA_CALL:
        assert_int_equal(d->index, g->n_calls); /* indexes 0, 1, ... in order */
        snprintf(g->names[g->n_calls], 64, "%s", d->call->name);
        snprintf(g->args[g->n_calls], 256, "%s", d->call->args);
        g->n_calls++;
        break;
    }
}

static size_t n_want_calls(const struct want *w)
{
    size_t n = 0;
    while (n < 4 && w->calls[n][0])
        n++;
    return n;
}

/* The whole response's parse is the expected message. */
static void check_whole(const struct ty__api_outcfg *c, const char *text, const struct want *w)
{
    struct ty__api_snap s;
    assert_int_equal(ty__api_out_parse(c, text, strlen(text), true, &s), 0);
    if (w->reasoning) {
        assert_true(s.has_reasoning);
        assert_string_equal(s.reasoning, w->reasoning);
    } else {
        assert_false(s.has_reasoning);
    }
    const char *content = ty__api_snap_content(&s);
    if (w->content) {
        assert_non_null(content);
        assert_string_equal(content, w->content);
    } else if (content) {
        fail_msg("content '%s', want null (%s)", content, text);
    }
    assert_int_equal(s.n_calls, n_want_calls(w));
    for (size_t k = 0; k < s.n_calls; k++) {
        assert_string_equal(s.calls[k].name, w->calls[k][0]);
        assert_string_equal(s.calls[k].args, w->calls[k][1]);
    }
    ty__api_snap_clear(&s);
}

/* Fed in pieces of `step` bytes (and one last empty step at the end), the deltas assemble to
 * the same message, with no content delta before the last that the whole parse lacks. */
static void check_stream(const struct ty__api_outcfg *c, const char *text, size_t step,
                         const struct want *w)
{
    struct ty__api_out o;
    struct got g;
    memset(&g, 0, sizeof(g));
    ty__api_out_init(&o, c);
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        assert_int_equal(ty__api_out_feed(&o, text + i, k), 0);
        assert_int_equal(ty__api_out_step(&o, false, on_delta, &g, NULL), 0);
    }
    assert_int_equal(ty__api_out_step(&o, true, on_delta, &g, NULL), 0);
    ty__api_out_free(&o);
    if (strcmp(g.reasoning, w->reasoning ? w->reasoning : ""))
        fail_msg("step %zu: reasoning '%s', want '%s'", step, g.reasoning,
                 w->reasoning ? w->reasoning : "");
    if (strcmp(g.content, w->content ? w->content : ""))
        fail_msg("step %zu: content '%s', want '%s'", step, g.content,
                 w->content ? w->content : "");
    assert_int_equal(g.n_calls, n_want_calls(w));
    for (size_t k = 0; k < g.n_calls; k++) {
        assert_string_equal(g.names[k], w->calls[k][0]);
        assert_string_equal(g.args[k], w->calls[k][1]);
    }
}

static void check(const struct ty__api_outcfg *c, const char *text, const struct want *w)
{
    check_whole(c, text, w);
    for (size_t step = 1; step <= strlen(text) + 1; step++)
        check_stream(c, text, step, w);
}

static void test_hermes(void **state)
{
    struct ty__api_outcfg c = {.fam = TY__API_FAM_HERMES, .mode = TY__API_OUT_AUTO};
    check(&c, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
              "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
          &(struct want){.content = "Let me check.\n",
                         .calls = {{"get_weather", "{\"city\":\"Paris\",\"days\":2}"}}});
    /* two calls and nothing else: content null */
    check(&c, "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
              "{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
          &(struct want){.calls = {{"a", "{}"}, {"b", "{\"x\":[1,2]}"}}});
    /* text that looks like the start of a marker but is not one */
    check(&c, "if a <b then <tool and <tool_cal", &(struct want){.content = "if a <b then <tool "
                                                                            "and <tool_cal"});
    /* a broken call stays text */
    check(&c, "<tool_call>{not json}</tool_call>",
          &(struct want){.content = "<tool_call>{not json}</tool_call>"});
    /* no tools offered (mode text): the markup is content */
    struct ty__api_outcfg t = {.fam = TY__API_FAM_HERMES, .mode = TY__API_OUT_TEXT};
    check(&t, "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>",
          &(struct want){.content = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n"
                                    "</tool_call>"});
}

static void test_qwen3_think(void **state)
{
    struct ty__api_outcfg c = {.fam = TY__API_FAM_HERMES, .mode = TY__API_OUT_AUTO,
                               .think = true};
    check(&c, "<think>\nParis weather, so call.\n</think>\n\n<tool_call>\n{\"name\": "
              "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
          &(struct want){.reasoning = "\nParis weather, so call.\n",
                         .calls = {{"get_weather", "{\"city\":\"Paris\"}"}}});
    check(&c, "<think>\nhm\n</think>\n\nHello!",
          &(struct want){.reasoning = "\nhm\n", .content = "\n\nHello!"});
    /* the prompt ended inside <think>: the output opens as reasoning */
    struct ty__api_outcfg o = {.fam = TY__API_FAM_HERMES, .mode = TY__API_OUT_TEXT,
                               .think = true, .think_open = true};
    check(&o, "a<b</think>Hi", &(struct want){.reasoning = "a<b", .content = "Hi"});
    /* cut off while thinking: all of it is reasoning */
    check(&o, "still thinking", &(struct want){.reasoning = "still thinking", .content = ""});
    /* thinking off (the prompt closed an empty block): plain content */
    struct ty__api_outcfg off = {.fam = TY__API_FAM_HERMES, .mode = TY__API_OUT_TEXT,
                                 .think = true};
    check(&off, "Hello <there>", &(struct want){.content = "Hello <there>"});
}

static void test_harmony(void **state)
{
    struct ty__api_outcfg c = {.fam = TY__API_FAM_HARMONY, .mode = TY__API_OUT_AUTO};
    check(&c, "<|channel|>analysis<|message|>User wants weather.<|end|><|start|>assistant"
              "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
              "{\"city\":\"Paris\"}<|call|>",
          &(struct want){.reasoning = "User wants weather.",
                         .calls = {{"get_weather", "{\"city\":\"Paris\"}"}}});
    check(&c, "<|channel|>analysis<|message|>Say hi.<|end|><|start|>assistant<|channel|>final"
              "<|message|>Hi there<|return|>",
          &(struct want){.reasoning = "Say hi.", .content = "Hi there"});
    /* the recipient before the channel, and the stop token left out of the output */
    check(&c, "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.f"
              "<|channel|>commentary json<|message|>{}",
          &(struct want){.reasoning = "x", .calls = {{"f", "{}"}}});
    /* no channel markup at all: the text is the content */
    check(&c, "Just text.", &(struct want){.content = "Just text."});
}

#define DS(s) "<\xef\xbd\x9ctool\xe2\x96\x81" s "\xef\xbd\x9c>"

static void test_deepseek(void **state)
{
    struct ty__api_outcfg c = {.fam = TY__API_FAM_DEEPSEEK, .mode = TY__API_OUT_AUTO};
    check(&c, "Checking." DS("calls\xe2\x96\x81" "begin") DS("call\xe2\x96\x81" "begin")
              "function" DS("sep") "get_weather\n```json\n{\"city\": \"Paris\"}\n```"
              DS("call\xe2\x96\x81" "end") DS("call\xe2\x96\x81" "begin") "function" DS("sep")
              "now\n```json\n{}\n```" DS("call\xe2\x96\x81" "end") DS("calls\xe2\x96\x81" "end"),
          &(struct want){.content = "Checking.",
                         .calls = {{"get_weather", "{\"city\":\"Paris\"}"}, {"now", "{}"}}});
}

static void test_llama3(void **state)
{
    struct ty__api_outcfg c = {.fam = TY__API_FAM_LLAMA3, .mode = TY__API_OUT_AUTO};
    check(&c, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
          &(struct want){.calls = {{"get_weather", "{\"city\":\"Paris\"}"}}});
    check(&c, "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"k\": 1}}",
          &(struct want){.calls = {{"a", "{}"}, {"b", "{\"k\":1}"}}});
    check(&c, "The answer is {42}.", &(struct want){.content = "The answer is {42}."});
    check(&c, "{\"not\": \"a call\"}", &(struct want){.content = "{\"not\": \"a call\"}"});
}

static void test_forced(void **state)
{
    struct ty__api_outcfg r = {.mode = TY__API_OUT_REQUIRED};
    check(&r, "[{\"name\": \"a\", \"parameters\": {\"x\": 1}}, {\"name\": \"b\", \"parameters\": "
              "{}}]", &(struct want){.calls = {{"a", "{\"x\":1}"}, {"b", "{}"}}});
    struct ty__api_outcfg n = {.mode = TY__API_OUT_NAMED, .named = "get_weather"};
    check(&n, "{ \"city\": \"Paris\" }",
          &(struct want){.calls = {{"get_weather", "{\"city\":\"Paris\"}"}}});
    /* cut short by max_tokens: not JSON, so it is content */
    check(&n, "{ \"city\": \"Pa", &(struct want){.content = "{ \"city\": \"Pa"});
}

static void test_schema_and_ids(void **state)
{
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"a\","
                               "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":"
                               "{\"type\":\"integer\"}}}}},{\"type\":\"function\",\"function\":"
                               "{\"name\":\"b\"}}]", 0, NULL);
    char *s = ty__api_tools_schema(tools, NULL);
    assert_string_equal(s, "{\"type\":\"array\",\"minItems\":1,\"items\":{\"type\":\"object\","
                           "\"anyOf\":[{\"properties\":{\"name\":{\"type\":\"string\",\"enum\":"
                           "[\"a\"]},\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":"
                           "{\"type\":\"integer\"}}}},\"required\":[\"name\",\"parameters\"],"
                           "\"additionalProperties\":false},"
                           "{\"properties\":{\"name\":{\"type\":\"string\",\"enum\":[\"b\"]},"
                           "\"parameters\":{\"type\":\"object\",\"properties\":{}}},"
                           "\"required\":[\"name\",\"parameters\"],\"additionalProperties\":false}]}}");
    free(s);
    s = ty__api_tools_schema(tools, "b");
    assert_string_equal(s, "{\"type\":\"object\",\"properties\":{}}");
    free(s);
    json_decref(tools);
    char id1[32], id2[32];
    ty__api_call_id(id1, sizeof(id1), 1);
    ty__api_call_id(id2, sizeof(id2), 2);
    assert_int_equal(strlen(id1), 29);
    assert_memory_equal(id1, "call_", 5);
    assert_string_not_equal(id1, id2);
}

/* The families of the real templates (skipped without the shared data). */
static void test_detect(void **state)
{
    const char *root = getenv("TYCHO_TEST_DATA") ? getenv("TYCHO_TEST_DATA") : "../shared";
    static const struct {
        const char *file;
        enum ty__api_fam fam;
    } cases[] = {{"tokenizers/qwen3/tokenizer_config.json", TY__API_FAM_HERMES},
                 {"tokenizers/gptoss/chat_template.jinja", TY__API_FAM_HARMONY},
                 {"tokenizers/deepseek_v3/tokenizer_config.json", TY__API_FAM_DEEPSEEK},
                 {"tokenizers/llama3_1/tokenizer_config.json", TY__API_FAM_LLAMA3}};
    assert_int_equal(ty__api_fam_detect(NULL), TY__API_FAM_NONE);
    assert_int_equal(ty__api_fam_detect("{% for m in messages %}{{ m.content }}{% endfor %}"),
                     TY__API_FAM_NONE);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", root, cases[i].file);
        json_t *cfg = NULL;
        const char *src;
        static char buf[1 << 20];
        if (strstr(path, ".json")) { /* tokenizer_config.json's chat_template (a string) */
            json_error_t je;
            if (!(cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je))) {
                print_message("%s: %s\n", path, je.text);
                skip();
            }
            src = json_string_value(json_object_get(cfg, "chat_template"));
            assert_non_null(src);
        } else {
            FILE *f = fopen(path, "rb");
            if (!f)
                skip();
            size_t n = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
            buf[n] = 0;
            src = buf;
        }
        enum ty__api_fam fam = ty__api_fam_detect(src);
        json_decref(cfg);
        if (fam != cases[i].fam)
            fail_msg("%s: family %s", cases[i].file, ty__api_fam_name(fam));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes),   cmocka_unit_test(test_qwen3_think),
        cmocka_unit_test(test_harmony),  cmocka_unit_test(test_deepseek),
        cmocka_unit_test(test_llama3),   cmocka_unit_test(test_forced),
        cmocka_unit_test(test_schema_and_ids), cmocka_unit_test(test_detect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
