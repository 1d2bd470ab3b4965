/* OpenAI request validation (api_parse.c) alone: values and precise 400s naming `param`.
 * Expected ranges are those of the OpenAI API reference. */
#include "tycho/api.h"
#include "tycho/errors.h"

#include <jansson.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

static int parse(const char *body, enum ty_api_kind k, struct ty_api_request *r,
                 struct ty_api_error *e)
{
    return ty_api_parse_request(body, strlen(body), k, r, e);
}

static void test_chat_full(void **state)
{
    struct ty_api_request r;
    struct ty_api_error e;
    const char *b = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                    "{\"type\":\"text\",\"text\":\"b\"}]}],\"n\":3,\"max_completion_tokens\":7,"
                    "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"seed\":42,"
                    "\"presence_penalty\":0.5,\"frequency_penalty\":-1,\"repetition_penalty\":1.1,"
                    "\"stop\":[\"x\",\"yy\"],\"stream\":true,\"stream_options\":"
                    "{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":3,"
                    "\"service_tier\":\"flex\",\"slo_class\":\"batch\",\"logit_bias\":{\"7\":-100,"
                    "\"12\":2.5},\"stop_token_ids\":[8,9],\"min_tokens\":3}";
    assert_int_equal(parse(b, TY_API_CHAT, &r, &e), 0);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n_msgs, 2);
    assert_string_equal(r.msgs[1].content, "a\nb"); /* vLLM joins text parts by newlines */
    assert_string_equal(r.msgs[0].role, "system");
    assert_int_equal(r.n, 3);
    assert_int_equal(r.max_tokens, 7);
    assert_float_equal(r.temperature, 0.5, 1e-6);
    assert_float_equal(r.top_p, 0.9, 1e-6);
    assert_int_equal(r.top_k, 40);
    assert_true(r.has_seed && r.seed == 42);
    assert_float_equal(r.frequency_penalty, -1, 1e-6);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "yy");
    assert_true(r.stream && r.include_usage && r.logprobs);
    assert_int_equal(r.top_logprobs, 3);
    assert_string_equal(r.service_tier, "flex");
    assert_string_equal(r.slo_class, "batch");
    assert_int_equal(r.n_logit_bias, 2);
    assert_int_equal(r.n_stop_ids, 2);
    assert_int_equal(r.stop_ids[1], 9);
    assert_int_equal(r.min_tokens, 3);
    assert_int_equal(r.logit_bias[0].id, 7);
    assert_float_equal(r.logit_bias[0].bias, -100, 0);
    assert_int_equal(r.logit_bias[1].id, 12);
    assert_float_equal(r.logit_bias[1].bias, 2.5, 0);
    ty_api_request_clear(&r);
}

static void test_defaults_and_prompt_forms(void **state)
{
    struct ty_api_request r;
    struct ty_api_error e;
    /* the harmless forms of fields this server does not implement are accepted */
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"tools\":[],\"tool_choice\":\"none\",\"response_format\":"
                           "{\"type\":\"text\"}}",
                           TY_API_CHAT, &r, &e),
                     0);
    ty_api_request_clear(&r);
    assert_int_equal(parse("{\"prompt\":\"x\",\"n\":2,\"best_of\":2,\"suffix\":\"\"}",
                           TY_API_COMPLETION, &r, &e),
                     0);
    ty_api_request_clear(&r);
    assert_int_equal(parse("{\"prompt\":\"hi\"}", TY_API_COMPLETION, &r, &e), 0);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.max_tokens, -1);
    assert_float_equal(r.temperature, 1, 0);
    assert_float_equal(r.repetition_penalty, 1, 0);
    assert_false(r.stream);
    assert_null(r.model);
    assert_string_equal(r.slo_class, "");
    ty_api_request_clear(&r);
    assert_int_equal(parse("{\"prompt\":[1,2,3],\"stop\":\"\\n\",\"logprobs\":2}",
                           TY_API_COMPLETION, &r, &e), 0);
    assert_int_equal(r.n_prompts, 1);
    assert_null(r.prompts[0].text);
    assert_int_equal(r.prompts[0].n_ids, 3);
    assert_int_equal(r.prompts[0].ids[2], 3);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "\n");
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 2);
    ty_api_request_clear(&r);
    assert_int_equal(parse("{\"prompt\":[\"one\"]}", TY_API_COMPLETION, &r, &e), 0);
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0].text, "one");
    assert_false(r.echo);
    ty_api_request_clear(&r);
}

/* Several prompts (OpenAI: an array of strings or of token-id arrays), echo, and the
 * prompts x n limit that keeps every choice's backend id distinct. */
static void test_prompt_lists(void **state)
{
    struct ty_api_request r;
    struct ty_api_error e;
    assert_int_equal(parse("{\"prompt\":[\"a\",\"bc\",\"d\"],\"n\":2,\"echo\":true}",
                           TY_API_COMPLETION, &r, &e), 0);
    assert_int_equal(r.n_prompts, 3);
    assert_string_equal(r.prompts[1].text, "bc");
    assert_string_equal(r.prompts[2].text, "d");
    assert_int_equal(r.n, 2);
    assert_true(r.echo);
    ty_api_request_clear(&r);
    assert_int_equal(parse("{\"prompt\":[[1,2],[3],[4,5,6]]}", TY_API_COMPLETION, &r, &e), 0);
    assert_int_equal(r.n_prompts, 3);
    assert_int_equal(r.prompts[0].n_ids, 2);
    assert_int_equal(r.prompts[1].ids[0], 3);
    assert_int_equal(r.prompts[2].n_ids, 3);
    assert_int_equal(r.prompts[2].ids[2], 6);
    assert_null(r.prompts[2].text);
    ty_api_request_clear(&r);
    /* 32 prompts with n=1 and 2 prompts with n=16: exactly at the limit */
    char body[512] = "{\"prompt\":[";
    for (int i = 0; i < 32; i++)
        strcat(body, i ? ",\"p\"" : "\"p\"");
    strcat(body, "]}");
    assert_int_equal(parse(body, TY_API_COMPLETION, &r, &e), 0);
    assert_int_equal(r.n_prompts, 32);
    ty_api_request_clear(&r);
    assert_int_equal(parse("{\"prompt\":[\"a\",\"b\"],\"n\":16}", TY_API_COMPLETION, &r, &e),
                     0);
    ty_api_request_clear(&r);
    /* over the limit: 33 prompts names 'prompt', 3 x 11 names 'n' */
    body[strlen(body) - 2] = 0;
    strcat(body, ",\"p\"]}");
    assert_int_equal(parse(body, TY_API_COMPLETION, &r, &e), TY_EINVAL);
    assert_string_equal(e.param, "prompt");
    assert_null(r.prompts);
    assert_int_equal(parse("{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":11}", TY_API_COMPLETION, &r,
                           &e), TY_EINVAL);
    assert_string_equal(e.param, "n");
    assert_non_null(strstr(e.message, "33 choices"));
    assert_null(r.prompts);
}

struct bad {
    const char *body;
    enum ty_api_kind kind;
    const char *param; /* "" = null */
};

static void test_errors_name_param(void **state)
{
    static const struct bad cases[] = {
        {"{\"prompt\":", TY_API_COMPLETION, ""},
        {"[]", TY_API_COMPLETION, ""},
        {"{\"prompt\":\"a\",\"prompt\":\"b\"}", TY_API_COMPLETION, ""},
        {"{}", TY_API_COMPLETION, "prompt"},
        {"{\"prompt\":\"\"}", TY_API_COMPLETION, "prompt"},
        {"{\"prompt\":[1,-2]}", TY_API_COMPLETION, "prompt"},
        {"{\"prompt\":[]}", TY_API_COMPLETION, "prompt"},
        {"{\"prompt\":[[]]}", TY_API_COMPLETION, "prompt"},
        {"{\"prompt\":[\"a\",\"\"]}", TY_API_COMPLETION, "prompt"},
        {"{\"prompt\":[\"a\",[1,2]]}", TY_API_COMPLETION, "prompt"},
        {"{\"prompt\":[[1,2],\"a\"]}", TY_API_COMPLETION, "prompt"},
        {"{\"prompt\":[\"a\",3]}", TY_API_COMPLETION, "prompt"},
        {"{\"prompt\":[1,\"a\"]}", TY_API_COMPLETION, "prompt"},
        {"{\"prompt\":[[1],[2,-1]]}", TY_API_COMPLETION, "prompt"},
        {"{\"prompt\":[null]}", TY_API_COMPLETION, "prompt"},
        {"{\"prompt\":{}}", TY_API_COMPLETION, "prompt"},
        {"{}", TY_API_CHAT, "messages"},
        {"{\"messages\":[]}", TY_API_CHAT, "messages"},
        {"{\"messages\":[{\"content\":\"x\"}]}", TY_API_CHAT, "messages"},
        {"{\"messages\":[{\"role\":\"user\"}]}", TY_API_CHAT, "messages"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", TY_API_CHAT, "messages"},
        {"{\"prompt\":\"x\",\"max_tokens\":0}", TY_API_COMPLETION, "max_tokens"},
        {"{\"prompt\":\"x\",\"max_tokens\":1.5}", TY_API_COMPLETION, "max_tokens"},
        {"{\"prompt\":\"x\",\"n\":0}", TY_API_COMPLETION, "n"},
        {"{\"prompt\":\"x\",\"n\":17}", TY_API_COMPLETION, "n"},
        {"{\"prompt\":\"x\",\"slo_class\":7}", TY_API_COMPLETION, "slo_class"},
        {"{\"prompt\":\"x\",\"stop_token_ids\":[1,-2]}", TY_API_COMPLETION, "stop_token_ids"},
        {"{\"prompt\":\"x\",\"stop_token_ids\":3}", TY_API_COMPLETION, "stop_token_ids"},
        {"{\"prompt\":\"x\",\"stop_token_ids\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}",
         TY_API_COMPLETION, "stop_token_ids"},
        {"{\"prompt\":\"x\",\"max_tokens\":4,\"min_tokens\":5}", TY_API_COMPLETION,
         "min_tokens"},
        {"{\"prompt\":\"x\",\"min_tokens\":-1}", TY_API_COMPLETION, "min_tokens"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
         "\"function\",\"function\":{\"name\":\"f g\"}}]}", TY_API_CHAT, "tools"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":"
         "\"required\"}", TY_API_CHAT, "tool_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":"
         "{\"type\":\"xml\"}}", TY_API_CHAT, "response_format"},
        {"{\"prompt\":\"x\",\"best_of\":3}", TY_API_COMPLETION, "best_of"},
        {"{\"prompt\":\"x\",\"suffix\":\"end\"}", TY_API_COMPLETION, "suffix"},
        {"{\"prompt\":\"x\",\"guided_json\":{}}", TY_API_COMPLETION, "guided_json"},
        {"{\"prompt\":\"x\",\"logit_bias\":[1]}", TY_API_COMPLETION, "logit_bias"},
        {"{\"prompt\":\"x\",\"logit_bias\":{\"a\":1}}", TY_API_COMPLETION, "logit_bias"},
        {"{\"prompt\":\"x\",\"logit_bias\":{\"-3\":1}}", TY_API_COMPLETION, "logit_bias"},
        {"{\"prompt\":\"x\",\"logit_bias\":{\"3\":101}}", TY_API_COMPLETION, "logit_bias"},
        {"{\"prompt\":\"x\",\"logit_bias\":{\"3\":\"1\"}}", TY_API_COMPLETION, "logit_bias"},
        {"{\"prompt\":\"x\",\"logit_bias\":{\"99999999999\":1}}", TY_API_COMPLETION,
         "logit_bias"},
        {"{\"prompt\":\"x\",\"slo_class\":\"\"}", TY_API_COMPLETION, "slo_class"},
        {"{\"prompt\":\"x\",\"slo_class\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "aaaaaaaaaaaaaaaaaaaa\"}", /* 65 bytes */
         TY_API_COMPLETION, "slo_class"},
        {"{\"prompt\":\"x\",\"temperature\":2.5}", TY_API_COMPLETION, "temperature"},
        {"{\"prompt\":\"x\",\"temperature\":\"hot\"}", TY_API_COMPLETION, "temperature"},
        {"{\"prompt\":\"x\",\"top_p\":0}", TY_API_COMPLETION, "top_p"},
        {"{\"prompt\":\"x\",\"top_k\":-2}", TY_API_COMPLETION, "top_k"},
        {"{\"prompt\":\"x\",\"min_p\":2}", TY_API_COMPLETION, "min_p"},
        {"{\"prompt\":\"x\",\"frequency_penalty\":-2.5}", TY_API_COMPLETION, "frequency_penalty"},
        {"{\"prompt\":\"x\",\"repetition_penalty\":0}", TY_API_COMPLETION, "repetition_penalty"},
        {"{\"prompt\":\"x\",\"seed\":\"1\"}", TY_API_COMPLETION, "seed"},
        {"{\"prompt\":\"x\",\"stop\":[1]}", TY_API_COMPLETION, "stop"},
        {"{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}",
         TY_API_COMPLETION, "stop"},
        {"{\"prompt\":\"x\",\"stream\":1}", TY_API_COMPLETION, "stream"},
        {"{\"prompt\":\"x\",\"stream_options\":{}}", TY_API_COMPLETION, "stream_options"},
        {"{\"prompt\":\"x\",\"logprobs\":true}", TY_API_COMPLETION, "logprobs"},
        {"{\"prompt\":\"x\",\"logprobs\":21}", TY_API_COMPLETION, "logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", TY_API_CHAT,
         "top_logprobs"},
        {"{\"prompt\":\"x\",\"model\":5}", TY_API_COMPLETION, "model"},
        {"{\"prompt\":\"x\",\"echo\":1}", TY_API_COMPLETION, "echo"},
        {"{\"prompt\":\"x\",\"echo\":true,\"logprobs\":1}", TY_API_COMPLETION, "echo"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":true}", TY_API_CHAT,
         "echo"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct ty_api_request r;
        struct ty_api_error e;
        int rc = parse(cases[i].body, cases[i].kind, &r, &e);
        if (rc != TY_EINVAL || e.status != 400 || strcmp(e.param, cases[i].param))
            fail_msg("case %zu (%s): rc %d status %d param '%s', want '%s'", i, cases[i].body, rc,
                     e.status, e.param, cases[i].param);
        assert_true(e.message[0] != 0);
    }
}

static void test_utf8_and_error_json(void **state)
{
    assert_true(ty_api_utf8_valid("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15));
    assert_false(ty_api_utf8_valid("\xff", 1));
    assert_false(ty_api_utf8_valid("\xc3", 1));          /* truncated */
    assert_false(ty_api_utf8_valid("\xc0\xaf", 2));      /* overlong */
    assert_false(ty_api_utf8_valid("\xed\xa0\x80", 3));  /* surrogate */
    assert_false(ty_api_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    struct ty_api_request r;
    struct ty_api_error e;
    assert_int_equal(ty_api_parse_request("{\"prompt\":\"\xff\"}", 14, TY_API_COMPLETION, &r, &e),
                     TY_EINVAL);
    ty_api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found", "no %s", "m");
    char *s = ty_api_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"no m\",\"type\":\"invalid_request_error\","
                           "\"param\":\"model\",\"code\":\"model_not_found\"}}");
    free(s);
    ty_api_error_set(&e, 400, NULL, NULL, NULL, "bad");
    s = ty_api_error_json(&e);
    assert_string_equal(s, "{\"error\":{\"message\":\"bad\",\"type\":\"invalid_request_error\","
                           "\"param\":null,\"code\":null}}");
    free(s);
}

/* ty_api_parse_request_in: everything in the caller's arena, nothing else to free; a failed
 * parse leaves an empty request whose allocations went to the arena too. */
static void test_parse_in_arena(void **state)
{
    (void)state;
    struct ty_api_request r;
    struct ty_api_error e;
    ty_arena_t *a = ty_arena_new(0);
    const char *b = "{\"model\":\"m\",\"prompt\":[\"one\",\"two\"],\"stop\":[\"x\",\"yy\"]}";
    assert_int_equal(ty_api_parse_request_in(a, b, strlen(b), TY_API_COMPLETION, &r, &e), 0);
    assert_ptr_equal(r.arena, a);
    assert_false(r.own_arena);
    assert_string_equal(r.prompts[1].text, "two");
    assert_string_equal(r.stop[1], "yy");
    assert_string_equal(r.model, "m");
    size_t used = ty_arena_used(a);
    assert_true(used > 0);
    ty_api_request_clear(&r); /* not the arena's owner: only forgets */
    assert_int_equal(ty_arena_used(a), used);
    b = "{\"prompt\":[\"one\",\"\"]}";
    assert_int_equal(ty_api_parse_request_in(a, b, strlen(b), TY_API_COMPLETION, &r, &e),
                     TY_EINVAL);
    assert_string_equal(e.param, "prompt");
    assert_null(r.prompts);
    assert_int_equal(r.n_prompts, 0);
    ty_arena_free(a);
}


#define USER "{\"role\":\"user\",\"content\":\"x\"}"
#define TOOL_A "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":" \
               "\"d\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":" \
               "\"string\"}},\"required\":[\"city\"]}}}"
#define TOOL_B "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}"

/* The conversation the template gets: messages normalised (developer -> system, text parts
 * joined, null content "", tool-call arguments parsed into objects), tools as sent. */
static void test_chat_tools_fields(void **state)
{
    struct ty_api_request r;
    struct ty_api_error e;
    const char *b =
        "{\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"}," USER ","
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"hm\",\"tool_calls\":"
        "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":[{\"type\":\"text\","
        "\"text\":\"20C\"}]}],\"tools\":[" TOOL_A "," TOOL_B "],\"tool_choice\":\"auto\","
        "\"parallel_tool_calls\":false,\"add_generation_prompt\":false,"
        "\"chat_template_kwargs\":{\"enable_thinking\":false}}";
    assert_int_equal(parse(b, TY_API_CHAT, &r, &e), 0);
    assert_int_equal(r.n_tools, 2);
    assert_int_equal(r.tool_choice, TY_API_TOOL_CHOICE_AUTO);
    assert_false(r.parallel_tool_calls);
    assert_false(r.add_generation_prompt);
    assert_int_equal(r.grammar, TY_API_GRAMMAR_NONE);
    json_t *t = json_loads(r.tpl_json, 0, NULL);
    json_t *want = json_loads(
        "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
        "\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}],\"reasoning_content\":\"hm\"},"
        "{\"role\":\"tool\",\"content\":\"20C\",\"tool_call_id\":\"call_1\"}],"
        "\"tools\":[" TOOL_A "," TOOL_B "],\"chat_template_kwargs\":{\"enable_thinking\":false},"
        "\"add_generation_prompt\":false}", 0, NULL);
    assert_non_null(t);
    assert_non_null(want);
    if (!json_equal(t, want))
        fail_msg("template request: %s", r.tpl_json);
    json_decref(t);
    json_decref(want);
    ty_api_request_clear(&r);
    /* defaults: no tools -> none; generation prompt on; parallel calls on */
    assert_int_equal(parse("{\"messages\":[" USER "]}", TY_API_CHAT, &r, &e), 0);
    assert_int_equal(r.tool_choice, TY_API_TOOL_CHOICE_NONE);
    assert_true(r.add_generation_prompt && r.parallel_tool_calls);
    assert_null(r.tools_json);
    ty_api_request_clear(&r);
    /* "none" with tools: the tools still go to the template (vLLM's default) */
    assert_int_equal(parse("{\"messages\":[" USER "],\"tools\":[" TOOL_B "],\"tool_choice\":"
                           "\"none\"}", TY_API_CHAT, &r, &e), 0);
    assert_int_equal(r.tool_choice, TY_API_TOOL_CHOICE_NONE);
    assert_non_null(strstr(r.tpl_json, "\"tools\":[{"));
    ty_api_request_clear(&r);
}

/* required / named: the output is constrained to the calls' JSON schema (vLLM's shapes). */
static void test_tool_choice_grammar(void **state)
{
    struct ty_api_request r;
    struct ty_api_error e;
    assert_int_equal(parse("{\"messages\":[" USER "],\"tools\":[" TOOL_A "," TOOL_B "],"
                           "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":"
                           "\"get_weather\"}}}", TY_API_CHAT, &r, &e), 0);
    assert_int_equal(r.tool_choice, TY_API_TOOL_CHOICE_NAMED);
    assert_string_equal(r.tool_name, "get_weather");
    assert_int_equal(r.grammar, TY_API_GRAMMAR_JSON_SCHEMA);
    assert_string_equal(r.grammar_schema, "{\"type\":\"object\",\"properties\":{\"city\":"
                                          "{\"type\":\"string\"}},\"required\":[\"city\"]}");
    ty_api_request_clear(&r);
    assert_int_equal(parse("{\"messages\":[" USER "],\"tools\":[" TOOL_B "],\"tool_choice\":"
                           "\"required\",\"parallel_tool_calls\":false}", TY_API_CHAT, &r, &e),
                     0);
    assert_int_equal(r.tool_choice, TY_API_TOOL_CHOICE_REQUIRED);
    assert_string_equal(r.grammar_schema,
                        "{\"type\":\"array\",\"minItems\":1,\"items\":{\"type\":\"object\","
                        "\"anyOf\":[{\"properties\":{\"name\":{\"type\":\"string\",\"enum\":"
                        "[\"now\"]},\"parameters\":{\"type\":\"object\",\"properties\":{}}},"
                        "\"required\":[\"name\",\"parameters\"],\"additionalProperties\":false}]},"
                        "\"maxItems\":1}");
    ty_api_request_clear(&r);
    /* response_format */
    assert_int_equal(parse("{\"messages\":[" USER "],\"response_format\":{\"type\":"
                           "\"json_object\"}}", TY_API_CHAT, &r, &e), 0);
    assert_int_equal(r.grammar, TY_API_GRAMMAR_JSON_OBJECT);
    ty_api_request_clear(&r);
    assert_int_equal(parse("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\","
                           "\"json_schema\":{\"name\":\"p\",\"strict\":true,\"schema\":{\"type\":"
                           "\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}}",
                           TY_API_COMPLETION, &r, &e), 0);
    assert_int_equal(r.grammar, TY_API_GRAMMAR_JSON_SCHEMA);
    assert_string_equal(r.grammar_schema, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                                          "\"integer\"}}}");
    ty_api_request_clear(&r);
}

static void test_tool_errors_name_param(void **state)
{
    static const struct {
        const char *body, *param, *says;
    } cases[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
         "\"image_url\":{\"url\":\"x\"}}]}]}", "messages", "image_url"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages", "tool_call_id"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", "messages",
         "assistant"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"type\":"
         "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{nope\"}}]}]}", "messages",
         "arguments"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"type\":"
         "\"function\",\"function\":{\"arguments\":\"{}\"}}]}]}", "messages", "tool_calls[0]"},
        {"{\"messages\":[" USER "],\"tools\":{}}", "tools", "array"},
        {"{\"messages\":[" USER "],\"tools\":[{\"type\":\"retrieval\"}]}", "tools", "function"},
        {"{\"messages\":[" USER "],\"tools\":[" TOOL_B "," TOOL_B "]}", "tools", "twice"},
        {"{\"messages\":[" USER "],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
         "\"f\",\"parameters\":\"x\"}}]}", "tools", "parameters"},
        {"{\"messages\":[" USER "],\"tools\":[" TOOL_B "],\"tool_choice\":\"sometimes\"}",
         "tool_choice", "required"},
        {"{\"messages\":[" USER "],\"tools\":[" TOOL_B "],\"tool_choice\":{\"type\":"
         "\"function\",\"function\":{\"name\":\"other\"}}}", "tool_choice", "other"},
        {"{\"messages\":[" USER "],\"tool_choice\":{\"type\":\"function\",\"function\":"
         "{\"name\":\"now\"}}}", "tool_choice", "now"},
        {"{\"messages\":[" USER "],\"parallel_tool_calls\":\"yes\"}", "parallel_tool_calls",
         "boolean"},
        {"{\"messages\":[" USER "],\"chat_template_kwargs\":[1]}", "chat_template_kwargs",
         "object"},
        {"{\"messages\":[" USER "],\"add_generation_prompt\":1}", "add_generation_prompt",
         "boolean"},
        {"{\"messages\":[" USER "],\"response_format\":{\"type\":\"json_schema\"}}",
         "response_format", "json_schema"},
        {"{\"messages\":[" USER "],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
         "{\"schema\":{}}}}", "response_format", "name"},
        {"{\"messages\":[" USER "],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
         "{\"name\":\"n\",\"schema\":{\"type\":\"string\",\"pattern\":\"^a+$\"}}}}",
         "response_format", "pattern"},
        {"{\"prompt\":\"x\",\"tools\":[" TOOL_B "]}", "tools", "chat"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct ty_api_request r;
        struct ty_api_error e;
        enum ty_api_kind k = strstr(cases[i].body, "\"prompt\"") ? TY_API_COMPLETION : TY_API_CHAT;
        int rc = parse(cases[i].body, k, &r, &e);
        if (rc != TY_EINVAL || e.status != 400 || strcmp(e.param, cases[i].param) ||
            !strstr(e.message, cases[i].says))
            fail_msg("case %zu (%s): rc %d status %d param '%s' message '%s', want '%s' "
                     "saying '%s'", i, cases[i].body, rc, e.status, e.param, e.message,
                     cases[i].param, cases[i].says);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_full),
        cmocka_unit_test(test_defaults_and_prompt_forms),
        cmocka_unit_test(test_prompt_lists),
        cmocka_unit_test(test_errors_name_param),
        cmocka_unit_test(test_utf8_and_error_json),
        cmocka_unit_test(test_parse_in_arena),
        cmocka_unit_test(test_chat_tools_fields),
        cmocka_unit_test(test_tool_choice_grammar),
        cmocka_unit_test(test_tool_errors_name_param),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
