/* The GGUF path: stories260K.gguf's tokenizer.ggml.* (SentencePiece scores, llama.cpp's
 * llm_tokenizer_spm algorithm) must give the reference ids that Hugging Face tokenizers gives
 * for the same vocabulary's tokenizer.json (tok_spm_cases.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tok_spm_cases.h"
#include "tok_test_util.h"
#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/tokenizer.h"

static void test_stories_gguf(void **state)
{
    (void)state;
    char p[4096], eb[256];
    ty_gguf_t *g;
    ty_tokenizer_t *tok;
    tok_test_path(p, sizeof(p), "models/stories260K/stories260K.gguf");
    assert_int_equal(ty_gguf_open(&g, p, eb, sizeof(eb)), 0);
    int rc = ty_tokenizer_new_from_gguf(&tok, g, eb, sizeof(eb));
    if (rc)
        fail_msg("%s", eb);
    ty_gguf_close(g); /* the tokenizer keeps copies */
    for (size_t c = 0; c < sizeof(spm_cases) / sizeof(spm_cases[0]); c++) {
        const struct spm_case *k = &spm_cases[c];
        uint32_t ids[64];
        int n = ty_tokenizer_encode(tok, k->text, strlen(k->text), true, false, ids, 64);
        assert_int_equal(n, (int)k->n);
        assert_memory_equal(ids, k->ids, k->n * sizeof(uint32_t));
        char out[256];
        assert_int_equal(ty_tokenizer_decode(tok, ids, (size_t)n, true, out, sizeof(out)),
                         (int)strlen(k->text));
        assert_string_equal(out, k->text);
    }
    assert_int_equal(ty_tokenizer_bos(tok), 1);
    assert_int_equal(ty_tokenizer_eos(tok), 2);
    ty_tokenizer_free(tok);
}

/* The 32k Llama-2 vocabulary: spot checks against ids known from Llama-2's tokenizer
 * (sentencepiece): "Hello" -> [1, 15043], " world" pieces, byte fallback for an emoji. */
static void test_llama2_vocab(void **state)
{
    (void)state;
    char p[4096], eb[256];
    ty_gguf_t *g;
    ty_tokenizer_t *tok;
    tok_test_path(p, sizeof(p), "models/llama-2-tiny-random/llama-2-tiny-random.gguf");
    assert_int_equal(ty_gguf_open(&g, p, eb, sizeof(eb)), 0);
    assert_int_equal(ty_tokenizer_new_from_gguf(&tok, g, eb, sizeof(eb)), 0);
    ty_gguf_close(g);
    uint32_t ids[16];
    int n = ty_tokenizer_encode(tok, "Hello world", 11, true, false, ids, 16);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 15043); /* "▁Hello" */
    assert_int_equal(ids[2], 3186);  /* "▁world" */
    /* U+1F680 is not in the vocabulary: "▁" then bytes F0 9F 9A 80 = ids 0xF0+3 ... */
    n = ty_tokenizer_encode(tok, "\xf0\x9f\x9a\x80", 4, false, false, ids, 16);
    assert_int_equal(n, 5);
    assert_int_equal(ids[0], 29871); /* "▁" */
    assert_int_equal(ids[1], 0xF0 + 3);
    assert_int_equal(ids[2], 0x9F + 3);
    assert_int_equal(ids[3], 0x9A + 3);
    assert_int_equal(ids[4], 0x80 + 3);
    ty_tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_gguf),
        cmocka_unit_test(test_llama2_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
