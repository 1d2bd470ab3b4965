/* SentencePiece-style tokenizers: stories260K's tokenizer.json (HF BPE with byte fallback)
 * against reference ids from Hugging Face tokenizers, decoding with the leading-space rule,
 * special tokens, and a 100 KB prompt. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tok_spm_cases.h"
#include "tok_test_util.h"
#include "tycho/errors.h"
#include "tycho/tokenizer.h"

static ty_tokenizer_t *tok;

static int setup(void **state)
{
    (void)state;
    char p[4096], eb[256];
    tok_test_path(p, sizeof(p), "models/stories260K-hf/tokenizer.json");
    int rc = ty_tokenizer_load_json(&tok, p, eb, sizeof(eb));
    if (rc)
        fprintf(stderr, "load: %s\n", eb);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    ty_tokenizer_free(tok);
    return 0;
}

static void test_reference_ids(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof(spm_cases) / sizeof(spm_cases[0]); c++) {
        const struct spm_case *k = &spm_cases[c];
        uint32_t ids[64];
        int n = ty_tokenizer_encode(tok, k->text, strlen(k->text), true, false, ids, 64);
        assert_int_equal(n, (int)k->n);
        assert_memory_equal(ids, k->ids, k->n * sizeof(uint32_t));
        /* without special tokens: the same minus BOS */
        n = ty_tokenizer_encode(tok, k->text, strlen(k->text), false, false, ids, 64);
        assert_int_equal(n, (int)k->n - 1);
        assert_memory_equal(ids, k->ids + 1, (k->n - 1) * sizeof(uint32_t));
        char out[256];
        int dl = ty_tokenizer_decode(tok, k->ids, k->n, true, out, sizeof(out));
        assert_int_equal(dl, (int)strlen(k->text));
        assert_string_equal(out, k->text);
    }
}

static void test_decode_rules(void **state)
{
    (void)state;
    const uint32_t ids[] = {1, 403, 407, 261, 378};
    char out[64];
    /* HF: decode(skip_special_tokens=False) keeps "<s>" and then the space of "▁Once" */
    assert_int_equal(ty_tokenizer_decode(tok, ids, 5, false, out, sizeof(out)), 20);
    assert_string_equal(out, "<s> Once upon a time");
    assert_int_equal(ty_tokenizer_decode(tok, ids + 1, 4, false, out, sizeof(out)), 16);
    assert_string_equal(out, "Once upon a time");
    /* truncation reports the full length */
    assert_int_equal(ty_tokenizer_decode(tok, ids + 1, 4, true, out, 5), 16);
    assert_string_equal(out, "Once");
    size_t l;
    assert_string_equal(ty_tokenizer_piece(tok, 403, &l), " Once");
    assert_string_equal(ty_tokenizer_piece(tok, 1, &l), ""); /* control */
    assert_int_equal(l, 0);
    assert_int_equal(ty_tokenizer_piece(tok, 243, &l)[0], (char)0xF0); /* <0xF0> */
    assert_int_equal(ty_tokenizer_bos(tok), 1);
    assert_int_equal(ty_tokenizer_eos(tok), 2);
    assert_true(ty_tokenizer_is_eog(tok, 2));
    assert_false(ty_tokenizer_is_eog(tok, 403));
    assert_int_equal(ty_tokenizer_token_id(tok, "\xe2\x96\x81Once"), 403);
    assert_int_equal(ty_tokenizer_token_id(tok, "no such token"), TY_ENOTFOUND);
    assert_int_equal(ty_tokenizer_n_vocab(tok), 512);
    assert_non_null(ty_tokenizer_chat_template(tok));
}

static void test_parse_special(void **state)
{
    (void)state;
    uint32_t ids[16];
    /* HF gives [1, 410, 444, 2] for "<s>x</s>" (specials recognised): "▁" before "x" */
    int n = ty_tokenizer_encode(tok, "<s>x</s>", 8, false, true, ids, 16);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 410);
    assert_int_equal(ids[2], 444);
    assert_int_equal(ids[3], 2);
    /* without parse_special the text is just text: no id 1 or 2 appears */
    n = ty_tokenizer_encode(tok, "<s>x</s>", 8, false, false, ids, 16);
    assert_true(n > 4);
    for (int i = 0; i < n && i < 16; i++)
        assert_true(ids[i] != 1 && ids[i] != 2);
}

/* 100 KB: the whole text is one SentencePiece word, so this exercises the heap merging. */
static void test_long_prompt(void **state)
{
    (void)state;
    const char *unit = "Once upon a time, there was a little girl named Lily. ";
    size_t ul = strlen(unit), reps = 100000 / ul + 1, n = ul * reps;
    char *text = malloc(n + 1);
    for (size_t i = 0; i < reps; i++)
        memcpy(text + i * ul, unit, ul);
    text[n] = 0;
    int k = ty_tokenizer_encode(tok, text, n, false, false, NULL, 0);
    assert_true(k > (int)(n / 8) && k < (int)n);
    uint32_t *ids = malloc(sizeof(uint32_t) * (size_t)k);
    assert_int_equal(ty_tokenizer_encode(tok, text, n, false, false, ids, (size_t)k), k);
    char *out = malloc(n + 16);
    assert_int_equal(ty_tokenizer_decode(tok, ids, (size_t)k, true, out, n + 16), (int)n);
    assert_memory_equal(out, text, n);
    free(out);
    free(ids);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_ids),
        cmocka_unit_test(test_decode_rules),
        cmocka_unit_test(test_parse_special),
        cmocka_unit_test(test_long_prompt),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
