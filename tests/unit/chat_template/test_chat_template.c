/* ty_chat_tpl: which template a tokenizer directory yields (override file, chat_template.jinja,
 * the list form of tokenizer_config.json's "chat_template", none), the variables a template sees
 * (special tokens as transformers' special_tokens_map gives them, tools=None, kwargs), errors, and
 * encoding without added BOS. Each test writes a tiny byte-level tokenizer and hand-written
 * templates to a temporary directory; expected strings follow from the templates by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "tycho/chat_template.h"
#include "tycho/errors.h"
#include "tycho/tokenizer.h"

static const char *tok_json =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"<s>\": 2, \"</s>\": 3, "
    "\"<x>\": 4}, \"merges\": []},"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": "
    "false},"
    " \"decoder\": {\"type\": \"ByteLevel\"},"
    " \"added_tokens\": [{\"id\": 2, \"content\": \"<s>\", \"special\": true},"
    " {\"id\": 3, \"content\": \"</s>\", \"special\": true}, {\"id\": 4, \"content\": \"<x>\", "
    "\"special\": true}]}";

/* special tokens as AddedToken dicts and plain strings, unk_token null, add_bos_token true */
#define CFG_HEAD                                                                                   \
    "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\"}, \"eos_token\": "          \
    "\"</s>\", "                                                                                   \
    "\"unk_token\": null, \"add_bos_token\": true, \"additional_special_tokens\": [\"<x>\"]"

static char dir[64];

static void write_file(const char *name, const char *text)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/ty_chat_tpl_XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    write_file("tokenizer.json", tok_json);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void remove_file(const char *name)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    unlink(path);
}

/* Load the directory's tokenizer and its template (or override); returns ty_chat_tpl_new's code. */
static int open_tpl(ty_tokenizer_t **tok, ty_chat_tpl_t **t, const char *override, char *err)
{
    char eb[256];
    int rc = ty_tokenizer_load_json(tok, dir, eb, sizeof(eb));
    if (rc)
        print_error("tokenizer: %s\n", eb);
    assert_int_equal(rc, 0);
    return ty_chat_tpl_new(t, *tok, override, err, 256);
}

/* Render `req` (JSON text) and compare with `want`. */
static void expect_render(const ty_chat_tpl_t *t, const char *req, const char *want)
{
    json_t *r = json_loads(req, 0, NULL);
    assert_non_null(r);
    char *out, err[256];
    size_t len;
    int rc = ty_chat_tpl_render(t, r, &out, &len, err, sizeof(err));
    if (rc)
        print_error("render: %s\n", err);
    assert_int_equal(rc, 0);
    assert_string_equal(out, want);
    assert_int_equal(len, strlen(want));
    free(out);
    json_decref(r);
}

static const char *msgs = "\"messages\": [{\"role\": \"user\", \"content\": \"ab\"}]";

static void test_list_form(void **state)
{
    (void)state;
    remove_file("chat_template.jinja");
    write_file("tokenizer_config.json",
               CFG_HEAD ", \"chat_template\": [{\"name\": \"default\", \"template\": "
                        "\"D{{ bos_token }}{{ messages[0].content }}\"}, {\"name\": \"tool_use\", "
                        "\"template\": \"T{{ tools|length }}\"}, {\"name\": \"rag\", \"template\": "
                        "\"R\"}]}");
    ty_tokenizer_t *tok;
    ty_chat_tpl_t *t;
    char err[256], req[256];
    assert_int_equal(open_tpl(&tok, &t, NULL, err), 0);
    assert_string_equal(ty_chat_tpl_source(t), "D{{ bos_token }}{{ messages[0].content }}");
    snprintf(req, sizeof(req), "{%s}", msgs);
    expect_render(t, req, "D<s>ab"); /* no tools: "default" */
    snprintf(req, sizeof(req), "{%s, \"tools\": [1, 2]}", msgs);
    expect_render(t, req, "T2"); /* tools given: "tool_use" */
    snprintf(req, sizeof(req), "{%s, \"tools\": null}", msgs);
    expect_render(t, req, "D<s>ab"); /* tools=None is no tools */
    ty_chat_tpl_free(t);
    ty_tokenizer_free(tok);
}

static void test_variables(void **state)
{
    (void)state;
    write_file("tokenizer_config.json",
               CFG_HEAD ", \"chat_template\": \"{{ bos_token }}|{{ eos_token }}|{{ unk_token is "
                        "defined }}|{{ additional_special_tokens|join(',') }}|{{ tools is defined "
                        "}}{{ tools is none }}|{{ add_generation_prompt }}|{{ enable_thinking is "
                        "defined }}\"}");
    ty_tokenizer_t *tok;
    ty_chat_tpl_t *t;
    char err[256], req[256];
    assert_int_equal(open_tpl(&tok, &t, NULL, err), 0);
    /* unk_token null is left out; tools is passed as None (defined); agp defaults to true */
    snprintf(req, sizeof(req), "{%s}", msgs);
    expect_render(t, req, "<s>|</s>|False|<x>|TrueTrue|True|False");
    /* kwargs become variables and override special tokens; add_generation_prompt false */
    snprintf(req, sizeof(req),
             "{%s, \"add_generation_prompt\": false, \"chat_template_kwargs\": "
             "{\"eos_token\": \"E\", \"enable_thinking\": false, \"tools\": [1]}}",
             msgs);
    expect_render(t, req, "<s>|E|False|<x>|TrueTrue|False|True");
    ty_chat_tpl_free(t);
    ty_tokenizer_free(tok);
}

static void test_jinja_file_and_override(void **state)
{
    (void)state;
    write_file("tokenizer_config.json", CFG_HEAD ", \"chat_template\": \"CONFIG\"}");
    write_file("chat_template.jinja", "JINJA{{ eos_token }}");
    write_file("override.jinja", "OVERRIDE{{ messages|length }}");
    ty_tokenizer_t *tok;
    ty_chat_tpl_t *t;
    char err[256], req[256], path[128];
    snprintf(req, sizeof(req), "{%s}", msgs);
    assert_int_equal(open_tpl(&tok, &t, NULL, err), 0);
    expect_render(t, req, "JINJA</s>"); /* chat_template.jinja replaces the config's */
    ty_chat_tpl_free(t);
    ty_tokenizer_free(tok);
    snprintf(path, sizeof(path), "%s/override.jinja", dir);
    assert_int_equal(open_tpl(&tok, &t, path, err), 0);
    expect_render(t, req, "OVERRIDE1");
    assert_string_equal(ty_chat_tpl_source(t), "OVERRIDE{{ messages|length }}");
    ty_chat_tpl_free(t);
    ty_tokenizer_free(tok);
    remove_file("chat_template.jinja");
}

static void test_missing(void **state)
{
    (void)state;
    ty_tokenizer_t *tok;
    ty_chat_tpl_t *t = (ty_chat_tpl_t *)1;
    char err[256];
    write_file("tokenizer_config.json", CFG_HEAD "}");
    assert_int_equal(open_tpl(&tok, &t, NULL, err), TY_ENOENT);
    assert_null(t);
    assert_non_null(strstr(err, "no chat template"));
    ty_tokenizer_free(tok);
    write_file("tokenizer_config.json",
               CFG_HEAD ", \"chat_template\": [{\"name\": \"rag\", \"template\": \"R\"}]}");
    assert_int_equal(open_tpl(&tok, &t, NULL, err), TY_ENOENT);
    ty_tokenizer_free(tok);
    assert_int_equal(open_tpl(&tok, &t, "/nonexistent/t.jinja", err), TY_ENOENT);
    assert_non_null(strstr(err, "/nonexistent/t.jinja"));
    ty_tokenizer_free(tok);
}

static void test_errors(void **state)
{
    (void)state;
    ty_tokenizer_t *tok;
    ty_chat_tpl_t *t;
    char err[256], path[128];
    write_file("tokenizer_config.json", CFG_HEAD ", \"chat_template\": \"x\"}");
    /* a syntax error is reported at parse time with its line */
    write_file("bad.jinja", "ok\n{{ messages }}\n{% if %}\n");
    snprintf(path, sizeof(path), "%s/bad.jinja", dir);
    int rc = open_tpl(&tok, &t, path, err);
    assert_true(rc == TY_EPARSE || rc == TY_ENOTSUP);
    assert_non_null(strstr(err, "line 3"));
    ty_tokenizer_free(tok);
    /* raise_exception's text comes back from render; bad requests are TY_EINVAL */
    write_file("raise.jinja", "{{ raise_exception('only ' + 'system') }}");
    snprintf(path, sizeof(path), "%s/raise.jinja", dir);
    assert_int_equal(open_tpl(&tok, &t, path, err), 0);
    const char *reqs[] = {"{\"messages\": []}", "{\"messages\": {}}", "[1]",
                          "{\"messages\": [], \"chat_template_kwargs\": 3}"};
    const char *want[] = {"only system", "messages", "object", "chat_template_kwargs"};
    for (size_t i = 0; i < 4; i++) {
        json_t *r = json_loads(reqs[i], 0, NULL);
        char *out = (char *)1;
        size_t len = 7;
        assert_int_equal(ty_chat_tpl_render(t, r, &out, &len, err, sizeof(err)), TY_EINVAL);
        assert_null(out);
        assert_non_null(strstr(err, want[i]));
        json_decref(r);
    }
    ty_chat_tpl_free(t);
    ty_tokenizer_free(tok);
}

static void test_encode(void **state)
{
    (void)state;
    write_file("tokenizer_config.json", CFG_HEAD ", \"chat_template\": \"x\"}");
    ty_tokenizer_t *tok;
    ty_chat_tpl_t *t;
    char err[256];
    assert_int_equal(open_tpl(&tok, &t, NULL, err), 0);
    uint32_t ids[8];
    /* add_bos_token is true, yet the template's own "<s>" is the only BOS; "<x>" is special */
    assert_int_equal(ty_chat_tpl_encode(t, "<s>a<x>b", 8, ids, 8), 4);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 0);
    assert_int_equal(ids[2], 4);
    assert_int_equal(ids[3], 1);
    ty_chat_tpl_free(t);
    ty_tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_form),
        cmocka_unit_test(test_variables),
        cmocka_unit_test(test_jinja_file_and_override),
        cmocka_unit_test(test_missing),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_encode),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
