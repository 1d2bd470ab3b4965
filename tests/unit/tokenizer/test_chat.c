/* Chat templates. Expected strings were written by hand from the template texts (the Jinja in
 * the test data's tokenizers/{qwen3,gptoss}/ tokenizer_config.json, chat_template.jinja,
 * stories260K-hf's tokenizer_config.json, and the published Llama-3 / ChatML / Mistral v0.1
 * templates), not from this code's output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tok_test_util.h"
#include "tycho/errors.h"
#include "tycho/tokenizer.h"

static const struct ty_chat_msg conv[] = {
    {"system", "Be brief."},
    {"user", "Hi there "},
    {"assistant", " Hello!"},
    {"user", "2+2?"},
};

static void expect(enum ty_chat_family f, const struct ty_chat_msg *m, size_t n, bool gen,
                   const char *want)
{
    char *got = ty_chat_render(f, m, n, gen, "<s>", "</s>");
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void test_llama2(void **state)
{
    (void)state;
    /* stories260K-hf template: system folded into the first user turn, content | trim */
    expect(TY_CHAT_LLAMA2, conv, 4, true,
           "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi there [/INST] Hello! </s>"
           "<s>[INST] 2+2? [/INST]");
    expect(TY_CHAT_LLAMA2, conv + 1, 1, false, "<s>[INST] Hi there [/INST]");
    /* roles must alternate: raise_exception */
    const struct ty_chat_msg bad[] = {{"user", "a"}, {"user", "b"}};
    assert_null(ty_chat_render(TY_CHAT_LLAMA2, bad, 2, true, "<s>", "</s>"));
}

static void test_llama3(void **state)
{
    (void)state;
    expect(TY_CHAT_LLAMA3, conv, 4, true,
           "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void test_chatml_mistral(void **state)
{
    (void)state;
    expect(TY_CHAT_CHATML, conv, 2, true,
           "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there <|im_end|>\n"
           "<|im_start|>assistant\n");
    expect(TY_CHAT_MISTRAL, conv + 1, 3, true,
           "<s>[INST] Hi there  [/INST] Hello!</s>[INST] 2+2? [/INST]");
    assert_null(ty_chat_render(TY_CHAT_MISTRAL, conv, 4, true, "<s>", "</s>"));
}

static void test_qwen3(void **state)
{
    (void)state;
    /* qwen3/tokenizer_config.json: earlier assistant turns are plain; generation prompt */
    expect(TY_CHAT_QWEN3, conv, 4, true,
           "<|im_start|>system\nBe brief.<|im_end|>\n"
           "<|im_start|>user\nHi there <|im_end|>\n"
           "<|im_start|>assistant\n Hello!<|im_end|>\n"
           "<|im_start|>user\n2+2?<|im_end|>\n"
           "<|im_start|>assistant\n");
    /* the last assistant turn after the last query gets a think block; earlier reasoning is
     * cut at </think> */
    const struct ty_chat_msg m[] = {
        {"user", "q1"},
        {"assistant", "<think>\nr1\n</think>\n\na1"},
        {"user", "q2"},
        {"assistant", "a2"},
    };
    expect(TY_CHAT_QWEN3, m, 4, false,
           "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
           "<|im_start|>user\nq2<|im_end|>\n"
           "<|im_start|>assistant\n<think>\n\n</think>\n\na2<|im_end|>\n");
    struct ty_chat_opts o = {.disable_thinking = true};
    char *s = ty_chat_render_opts(TY_CHAT_QWEN3, m, 1, true, NULL, NULL, &o);
    assert_string_equal(s, "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n"
                           "<think>\n\n</think>\n\n");
    free(s);
}

static void test_gptoss(void **state)
{
    (void)state;
    struct ty_chat_opts o = {.date = "2025-08-08"};
    char *s = ty_chat_render_opts(TY_CHAT_GPTOSS, conv, 4, true, NULL, NULL, &o);
    assert_non_null(s);
    assert_string_equal(
        s, "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
           "OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-08-08\n\nReasoning: medium\n\n"
           "# Valid channels: analysis, commentary, final. Channel must be included for every "
           "message.<|end|>"
           "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
           "<|start|>user<|message|>Hi there <|end|>"
           "<|start|>assistant<|channel|>final<|message|> Hello!<|end|>"
           "<|start|>user<|message|>2+2?<|end|>"
           "<|start|>assistant");
    free(s);
    /* a final assistant turn without a generation prompt ends in <|return|> */
    s = ty_chat_render_opts(TY_CHAT_GPTOSS, conv + 1, 2, false, NULL, NULL, &o);
    const char *tail = "<|start|>user<|message|>Hi there <|end|>"
                       "<|start|>assistant<|channel|>final<|message|> Hello!<|return|>";
    assert_non_null(strstr(s, tail));
    assert_string_equal(s + strlen(s) - strlen(tail), tail);
    assert_null(strstr(s, "developer"));
    free(s);
}

static char *slurp(const char *rel)
{
    char p[4096];
    tok_test_path(p, sizeof(p), rel);
    FILE *f = fopen(p, "rb");
    char *b = calloc(1, 1 << 20);
    size_t n = fread(b, 1, (1 << 20) - 1, f);
    b[n] = 0;
    fclose(f);
    return b;
}

static void test_detect(void **state)
{
    (void)state;
    char *g = slurp("tokenizers/gptoss/chat_template.jinja");
    assert_int_equal(ty_chat_detect(g), TY_CHAT_GPTOSS);
    free(g);
    char p[4096], eb[256];
    ty_tokenizer_t *tok;
    tok_test_path(p, sizeof(p), "tokenizers/qwen3");
    assert_int_equal(ty_tokenizer_load_json(&tok, p, eb, sizeof(eb)), 0);
    assert_int_equal(ty_chat_detect(ty_tokenizer_chat_template(tok)), TY_CHAT_QWEN3);
    ty_tokenizer_free(tok);
    tok_test_path(p, sizeof(p), "models/stories260K-hf");
    assert_int_equal(ty_tokenizer_load_json(&tok, p, eb, sizeof(eb)), 0);
    assert_int_equal(ty_chat_detect(ty_tokenizer_chat_template(tok)), TY_CHAT_LLAMA2);
    ty_tokenizer_free(tok);
    assert_int_equal(ty_chat_detect("{% for m in messages %}{{ m.content }}{% endfor %}"),
                     TY_CHAT_NONE);
    assert_int_equal(ty_chat_detect(NULL), TY_CHAT_NONE);
    enum ty_chat_family f;
    assert_int_equal(ty_chat_family_parse("chatml", &f), 0);
    assert_int_equal(f, TY_CHAT_CHATML);
    assert_int_equal(ty_chat_family_parse("jinja2", &f), TY_EINVAL);
    assert_string_equal(ty_chat_family_name(TY_CHAT_LLAMA3), "llama-3");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2), cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_chatml_mistral), cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_gptoss), cmocka_unit_test(test_detect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
