/* struct ty_stoptext (tycho/stoptext.h): what a streaming client receives after each token and
 * at the end, and the final text, over a table of cases, with a hand-built SentencePiece
 * vocabulary whose pieces are known exactly. Every case also checks the streaming invariants:
 * the chunks add up to the final text, each chunk is whole UTF-8, no stop string is ever sent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tycho/errors.h"
#include "tycho/stoptext.h"

// clang-format off
enum {
    T_UNK, T_BOS, T_EOS, T_A, T_B, T_C, T_GIRL, T_E2, T_82, T_AC, T_XY, T_EURO, T_NUL, T_LONG,
    T_ABC, T_ST, T_OP, T_N
};
// clang-format on

static char long_tok[101]; /* 100 x: longer than any fixed piece buffer */
static ty_tokenizer_t *tok;

static int setup(void **state)
{
    (void)state;
    memset(long_tok, 'x', 100);
    // clang-format off
    const char *t[T_N] = {
        [T_UNK] = "<unk>", [T_BOS] = "<s>", [T_EOS] = "</s>", [T_A] = "a", [T_B] = "b",
        [T_C] = "c", [T_GIRL] = "\xe2\x96\x81girl", [T_E2] = "<0xE2>", [T_82] = "<0x82>",
        [T_AC] = "<0xAC>", [T_XY] = "xy", [T_EURO] = "\xe2\x82\xac", [T_NUL] = "<0x00>",
        [T_LONG] = long_tok, [T_ABC] = "abc", [T_ST] = "st", [T_OP] = "op"};
    int32_t ty[T_N];
    for (int i = 0; i < T_N; i++)
        ty[i] = TY_TOK_TYPE_NORMAL;
    ty[T_UNK] = TY_TOK_TYPE_UNKNOWN;
    ty[T_BOS] = ty[T_EOS] = TY_TOK_TYPE_CONTROL;
    ty[T_E2] = ty[T_82] = ty[T_AC] = ty[T_NUL] = TY_TOK_TYPE_BYTE;
    struct ty_tokenizer_spec sp = {.model = TY_TOK_MODEL_SPM, .n_vocab = T_N, .tokens = t,
                                   .token_types = ty, .bos_id = T_BOS, .eos_id = T_EOS,
                                   .unk_id = T_UNK, .pad_id = -1};
    // clang-format on
    char eb[256] = "";
    int rc = ty_tokenizer_new(&tok, &sp, eb, sizeof(eb));
    if (rc)
        fprintf(stderr, "tokenizer: %s\n", eb);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    ty_tokenizer_free(tok);
    return 0;
}

#define MAXI 8
struct st_case {
    const char *name;
    const char *stop[3];
    size_t n_stop;
    uint32_t ids[MAXI];
    size_t n_ids;
    const char *text; /* final text */
    bool hit;
    /* sent after each push (n_ids of them), then at the end (after flush) */
    const char *chunks[MAXI + 1];
};

#define EURO "\xe2\x82\xac"
#define FFFD "\xef\xbf\xbd"

// clang-format off
static const struct st_case cases[] = {
    {"stop string spanning two tokens", {"cx"}, 1, {T_A, T_B, T_C, T_XY, T_A}, 5, "ab", true,
     {"", "a", "b", "", "", ""}},
    {"stop at the very first token", {"xy"}, 1, {T_XY, T_A}, 2, "", true, {"", "", ""}},
    {"stop in the middle of a token", {"b"}, 1, {T_XY, T_ABC, T_A}, 3, "xya", true,
     {"xy", "a", "", ""}},
    /* "bc" comes first in the list but "ab" starts earlier in the text: cut at the earlier */
    {"later stop string matches earlier in the text", {"bc", "ab"}, 2, {T_XY, T_ABC}, 2, "xy",
     true, {"x", "y", ""}},
    {"several stop strings, the shorter completes first", {"abcd", "bc"}, 2, {T_A, T_B, T_C}, 3,
     "a", true, {"", "", "a", ""}},
    {"multi-byte UTF-8 split across tokens", {"zzzz"}, 1, {T_A, T_E2, T_82, T_AC, T_B, T_C}, 6,
     "a" EURO "bc", false, {"", "", "", "a", "", "", EURO "bc"}},
    {"stop string after a split character", {EURO "b"}, 1, {T_A, T_E2, T_82, T_AC, T_B}, 5, "a",
     true, {"", "", "", "a", "", ""}},
    {"stop string ending inside a split character", {"a" EURO}, 1, {T_A, T_E2, T_82, T_AC, T_C},
     5, "", true, {"", "", "", "", "", ""}},
    {"held back at the end, then sent (finish length)", {"abz"}, 1, {T_A, T_B}, 2, "ab", false,
     {"", "", "ab"}},
    {"hold-back never splits a character", {"zzz"}, 1, {T_EURO, T_EURO}, 2, EURO EURO, false,
     {"", EURO, EURO}},
    {"no stop strings", {NULL}, 0, {T_A, T_E2, T_82, T_AC, T_GIRL}, 5, "a" EURO " girl", false,
     {"a", "", "", EURO, " girl", ""}},
    {"empty stop string ignored", {"", "q"}, 2, {T_A, T_B}, 2, "ab", false, {"a", "b", ""}},
    {"empty output", {"stop"}, 1, {0}, 0, "", false, {""}},
    {"only control tokens", {"stop"}, 1, {T_BOS, T_EOS}, 2, "", false, {"", "", ""}},
    {"incomplete character at the end becomes U+FFFD", {"q"}, 1, {T_A, T_E2, T_82}, 3, "a" FFFD,
     false, {"a", "", "", FFFD}},
    {"stop string \"stop\" over st+op", {"stop", "x"}, 2, {T_A, T_ST, T_OP}, 3, "a", true,
     {"", "", "a", ""}},
    {"id outside the vocabulary adds nothing", {"q"}, 1, {T_A, 999, T_B}, 3, "ab", false,
     {"a", "", "b", ""}},
};
// clang-format on

static bool utf8_whole(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        if (!l || i + l > n)
            return false;
        for (size_t j = 1; j < l; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80)
                return false;
        i += l;
    }
    return true;
}

static bool has(const char *h, size_t n, const char *s)
{
    size_t sl = strlen(s);
    for (size_t i = 0; sl && i + sl <= n; i++)
        if (memcmp(h + i, s, sl) == 0)
            return true;
    return false;
}

static void check_chunk(const struct st_case *k, size_t step, const char *p, size_t len, char *acc,
                        size_t *n_acc)
{
    const char *want = k->chunks[step];
    if (len != strlen(want) || memcmp(p, want, len) != 0)
        fail_msg("%s: chunk %zu is \"%.*s\", want \"%s\"", k->name, step, (int)len, p, want);
    assert_true(utf8_whole(p, len));
    memcpy(acc + *n_acc, p, len);
    *n_acc += len;
    for (size_t i = 0; i < k->n_stop; i++)
        if (k->stop[i] && has(acc, *n_acc, k->stop[i]))
            fail_msg("%s: stop string \"%s\" was sent", k->name, k->stop[i]);
}

static void test_cases(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const struct st_case *k = &cases[c];
        struct ty_stoptext st;
        char acc[512];
        size_t n_acc = 0, len;
        assert_int_equal(ty_stoptext_init(&st, tok, k->stop, k->n_stop), 0);
        for (size_t i = 0; i < k->n_ids; i++) {
            bool was_hit = ty_stoptext_hit(&st);
            int n = ty_stoptext_push(&st, k->ids[i]);
            assert_true(n >= 0);
            if (was_hit)
                assert_int_equal(n, 0); /* nothing after the stop string */
            const char *p = ty_stoptext_take(&st, ty_stoptext_safe_end(&st, false), &len);
            check_chunk(k, i, p, len, acc, &n_acc);
            /* what was sent is still the start of the text: never retracted */
            assert_true(n_acc <= st.n_text);
            assert_memory_equal(acc, st.text ? st.text : "", n_acc);
        }
        assert_int_equal(ty_stoptext_flush(&st), 0);
        const char *p = ty_stoptext_take(&st, ty_stoptext_safe_end(&st, true), &len);
        check_chunk(k, k->n_ids, p, len, acc, &n_acc);
        if (ty_stoptext_hit(&st) != k->hit)
            fail_msg("%s: hit %d, want %d", k->name, ty_stoptext_hit(&st), k->hit);
        size_t tl;
        char *text = ty_stoptext_release(&st, &tl);
        assert_non_null(text);
        if (strcmp(text, k->text) != 0)
            fail_msg("%s: text \"%s\", want \"%s\"", k->name, text, k->text);
        assert_int_equal(tl, strlen(k->text));
        assert_int_equal(n_acc, strlen(k->text));
        assert_memory_equal(acc, k->text, n_acc);
        free(text);
        ty_stoptext_clear(&st);
    }
}

/* A piece longer than 64 bytes, and a NUL byte before a stop string (no strstr). */
static void test_long_piece_and_nul(void **state)
{
    (void)state;
    struct ty_stoptext st;
    const char *stop[] = {"ab"};
    assert_int_equal(ty_stoptext_init(&st, tok, stop, 1), 0);
    assert_int_equal(ty_stoptext_push(&st, T_LONG), 100);
    assert_int_equal(ty_stoptext_push(&st, T_NUL), 1);
    assert_int_equal(ty_stoptext_push(&st, T_A), 1);
    assert_false(ty_stoptext_hit(&st));
    assert_int_equal(ty_stoptext_push(&st, T_B), 1);
    assert_true(ty_stoptext_hit(&st));
    assert_int_equal(st.n_text, 101);
    assert_memory_equal(st.text, long_tok, 100);
    assert_int_equal(st.text[100], 0);
    size_t len;
    ty_stoptext_take(&st, ty_stoptext_safe_end(&st, false), &len);
    assert_int_equal(len, 101);
    ty_stoptext_clear(&st);
}

/* No tokenizer (ids only): no text, never a hit; stop strings are still copied. */
static void test_no_tokenizer(void **state)
{
    (void)state;
    struct ty_stoptext st;
    const char *stop[] = {"a"};
    assert_int_equal(ty_stoptext_init(&st, NULL, stop, 1), 0);
    assert_int_equal(ty_stoptext_push(&st, T_A), 0);
    assert_int_equal(ty_stoptext_flush(&st), 0);
    assert_false(ty_stoptext_hit(&st));
    assert_int_equal(ty_stoptext_safe_end(&st, true), 0);
    size_t tl = 1;
    char *text = ty_stoptext_release(&st, &tl);
    assert_string_equal(text, "");
    assert_int_equal(tl, 0);
    free(text);
    ty_stoptext_clear(&st);
    ty_stoptext_clear(&st); /* twice is fine */
}

/* Output continues a prompt: its first piece keeps the leading space a SentencePiece "\u2581"
 * stands for ("The little dog" + " girl", not "dog" + "girl"), as vLLM and llama.cpp return it. */
static void test_first_piece_keeps_space(void **state)
{
    (void)state;
    /* a llama-style vocabulary whose decoder strips the space of a text's first piece */
    const char *t[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81girl"};
    int32_t ty[] = {TY_TOK_TYPE_UNKNOWN, TY_TOK_TYPE_CONTROL, TY_TOK_TYPE_CONTROL,
                    TY_TOK_TYPE_NORMAL};
    struct ty_tokenizer_spec sp = {.model = TY_TOK_MODEL_SPM, .n_vocab = 4, .tokens = t,
                                   .token_types = ty, .bos_id = 1, .eos_id = 2, .unk_id = 0,
                                   .pad_id = -1, .add_space_prefix = true};
    ty_tokenizer_t *spm;
    char eb[256] = "";
    assert_int_equal(ty_tokenizer_new(&spm, &sp, eb, sizeof(eb)), 0);
    uint32_t ids[] = {3, 3};
    char whole[32];
    /* the decoder of a whole text does strip it: this vocabulary can tell the two apart */
    assert_true(ty_tokenizer_decode(spm, ids, 2, true, whole, sizeof(whole)) >= 0);
    assert_string_equal(whole, "girl girl");
    struct ty_stoptext st;
    assert_int_equal(ty_stoptext_init(&st, spm, NULL, 0), 0);
    assert_int_equal(ty_stoptext_push(&st, 3), 5);
    assert_int_equal(ty_stoptext_push(&st, 3), 5);
    assert_int_equal(st.n_text, 10);
    assert_memory_equal(st.text, " girl girl", 10);
    ty_stoptext_clear(&st);
    ty_tokenizer_free(spm);
}

/* The stop strings are copies: the caller's buffer may change after init. */
static void test_stop_copied(void **state)
{
    (void)state;
    char buf[] = "b";
    const char *stop[] = {buf};
    struct ty_stoptext st;
    assert_int_equal(ty_stoptext_init(&st, tok, stop, 1), 0);
    buf[0] = 'a';
    ty_stoptext_push(&st, T_A);
    assert_false(ty_stoptext_hit(&st));
    ty_stoptext_push(&st, T_B);
    assert_true(ty_stoptext_hit(&st));
    assert_int_equal(st.n_text, 1);
    ty_stoptext_clear(&st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_long_piece_and_nul),
        cmocka_unit_test(test_no_tokenizer),
        cmocka_unit_test(test_stop_copied),
        cmocka_unit_test(test_first_piece_keeps_space),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
