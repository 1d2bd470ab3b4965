/* Every case of the test data's data/tokenizer_cases_{qwen3,gptoss}.jsonl (ids produced by Hugging
 * Face tokenizers, special tokens not added) must come out of ty_tokenizer_encode exactly, and
 * decoding gives the text back (byte-level BPE is lossless; qwen3 normalizes to NFC first). */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tok_test_util.h"
#include "tycho/tokenizer.h"

static void run_cases(const char *tok_rel, const char *cases_rel, bool exact_roundtrip)
{
    char p1[4096], p2[4096], eb[256];
    ty_tokenizer_t *tok;
    tok_test_path(p1, sizeof(p1), tok_rel);
    tok_test_path(p2, sizeof(p2), cases_rel);
    int rc = ty_tokenizer_load_json(&tok, p1, eb, sizeof(eb));
    if (rc)
        fail_msg("load %s: %d %s", p1, rc, eb);
    FILE *f = fopen(p2, "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int n_cases = 0, n_bad = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        assert_non_null(o);
        const char *text = json_string_value(json_object_get(o, "text"));
        size_t tl = json_string_length(json_object_get(o, "text"));
        json_t *want = json_object_get(o, "ids");
        uint32_t ids[512];
        int k = ty_tokenizer_encode(tok, text, tl, false, false, ids, 512);
        bool same = k == (int)json_array_size(want);
        for (int i = 0; same && i < k; i++)
            same = ids[i] == (uint32_t)json_integer_value(json_array_get(want, (size_t)i));
        if (!same) {
            n_bad++;
            fprintf(stderr, "MISMATCH %s: %s\n  got:", tok_rel, text);
            for (int i = 0; i < k; i++)
                fprintf(stderr, " %u", ids[i]);
            fprintf(stderr, "\n  want: %s\n", json_dumps(want, JSON_COMPACT));
        }
        char out[4096];
        int dl = ty_tokenizer_decode(tok, ids, (size_t)k, false, out, sizeof(out));
        if (exact_roundtrip || strspn(text, " !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~\t\r\n") == tl) {
            assert_int_equal(dl, (int)tl);
            assert_memory_equal(out, text, tl);
        }
        json_decref(o);
        n_cases++;
    }
    free(line);
    fclose(f);
    ty_tokenizer_free(tok);
    assert_true(n_cases >= 30);
    assert_int_equal(n_bad, 0);
}

static void test_qwen3(void **state)
{
    (void)state;
    run_cases("tokenizers/qwen3/tokenizer.json", "data/tokenizer_cases_qwen3.jsonl", false);
}

static void test_gptoss(void **state)
{
    (void)state;
    run_cases("tokenizers/gptoss/tokenizer.json", "data/tokenizer_cases_gptoss.jsonl", true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_gptoss),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
