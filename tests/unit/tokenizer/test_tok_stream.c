/* Incremental detokenization and malformed tokenizer.json files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tok_test_util.h"
#include "tycho/errors.h"
#include "tycho/tokenizer.h"

/* Independent UTF-8 validity check (RFC 3629 table). */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t l = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                                                      : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (l == 0 || i + l > n)
            return false;
        for (size_t j = 1; j < l; j++)
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) ||
            (c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] > 0x8F))
            return false;
        i += l;
    }
    return true;
}

static void stream_equals_decode(ty_tokenizer_t *tok, const char *text, bool expect_split)
{
    uint32_t ids[256];
    int n = ty_tokenizer_encode(tok, text, strlen(text), false, false, ids, 256);
    assert_true(n > 0);
    char full[2048], acc[2048], out[64];
    int fl = ty_tokenizer_decode(tok, ids, (size_t)n, true, full, sizeof(full));
    assert_string_equal(full, text);
    struct ty_detok d;
    ty_detok_init(&d, tok);
    size_t al = 0;
    bool held = false;
    for (int i = 0; i < n; i++) {
        size_t pl;
        ty_tokenizer_piece(tok, ids[i], &pl);
        int w = ty_detok_feed(&d, ids[i], out, sizeof(out));
        assert_true(w >= 0);
        held = held || (pl > 0 && w == 0) || (size_t)w < pl;
        memcpy(acc + al, out, (size_t)w);
        al += (size_t)w;
        assert_true(utf8_valid((unsigned char *)acc, al)); /* never a broken prefix */
    }
    int w = ty_detok_flush(&d, out, sizeof(out));
    assert_int_equal(w, 0);
    assert_int_equal(al, fl);
    assert_memory_equal(acc, full, al);
    if (expect_split)
        assert_true(held); /* some character really was split over tokens */
}

static void test_stream_bytelevel(void **state)
{
    (void)state;
    char p[4096], eb[256];
    ty_tokenizer_t *tok;
    tok_test_path(p, sizeof(p), "tokenizers/qwen3/tokenizer.json");
    assert_int_equal(ty_tokenizer_load_json(&tok, p, eb, sizeof(eb)), 0);
    /* qwen3 splits the ZWJ sequence and the skin tone over several tokens */
    stream_equals_decode(tok, "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x94\xac scientist "
                              "\xf0\x9f\x91\x8b\xf0\x9f\x8f\xbf", true);
    stream_equals_decode(tok, "\xe5\x8c\x97\xe4\xba\xac\xe6\xac\xa2\xe8\xbf\x8e\xe4\xbd\xa0", false);
    /* an id stream cut inside a character: the flush turns the held bytes into U+FFFD */
    uint32_t ids[32];
    int n = ty_tokenizer_encode(tok, "\xf0\x9f\x91\x8b\xf0\x9f\x8f\xbf", 8, false, false, ids, 32);
    assert_true(n >= 2);
    struct ty_detok d;
    char out[64];
    ty_detok_init(&d, tok);
    int total = 0;
    size_t l0;
    ty_tokenizer_piece(tok, ids[0], &l0);
    total += ty_detok_feed(&d, ids[0], out, sizeof(out));
    if (l0 % 4 != 0) {
        assert_int_equal(total, (int)(l0 / 4) * 4);
        assert_int_equal(ty_detok_flush(&d, out, sizeof(out)), 3);
        assert_string_equal(out, "\xef\xbf\xbd");
    }
    /* too small an output buffer is an error and keeps the state */
    ty_detok_init(&d, tok);
    assert_int_equal(ty_detok_feed(&d, 785 /* "The" */, out, 2), TY_ERANGE);
    assert_int_equal(ty_detok_feed(&d, 785, out, sizeof(out)), 3);
    assert_string_equal(out, "The");
    ty_tokenizer_free(tok);
}

static void test_stream_spm(void **state)
{
    (void)state;
    char p[4096], eb[256];
    ty_tokenizer_t *tok;
    tok_test_path(p, sizeof(p), "models/stories260K-hf/tokenizer.json");
    assert_int_equal(ty_tokenizer_load_json(&tok, p, eb, sizeof(eb)), 0);
    /* byte fallback: each emoji is four <0xNN> tokens */
    stream_equals_decode(tok, "Hi \xf0\x9f\x9a\x80 and \xe6\x97\xa5\xe6\x9c\xac!", true);
    stream_equals_decode(tok, "  two  spaces", false);
    ty_tokenizer_free(tok);
}

static int load_text(const char *json, char *eb, size_t el)
{
    char path[] = "/tmp/ty_tok_badXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    ty_tokenizer_t *tok = NULL;
    int rc = ty_tokenizer_load_json(&tok, path, eb, el);
    unlink(path);
    assert_true(rc != 0 && tok == NULL);
    return rc;
}

static void test_malformed(void **state)
{
    (void)state;
    char eb[256];
    static const char ok_vocab[] = "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}";
    char buf[1024];
    struct {
        const char *json;
        int rc;
        const char *msg;
    } cases[] = {
        {"{\"model\": {\"type\": \"BPE\", ", TY_EPARSE, "end of file"},
        {"[1,2,3]", TY_EPARSE, "not a JSON object"},
        {"{}", TY_EPARSE, "\"model\""},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", TY_ENOTSUP, "Unigram"},
        {"{\"model\":{\"type\":\"WordPiece\"}}", TY_ENOTSUP, "WordPiece"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":[1]}}", TY_EPARSE, "vocab"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-4}}}", TY_EPARSE, "bad id"},
        {NULL, TY_EPARSE, "merges[0]"},
        {NULL, TY_ENOTSUP, "Lowercase"},
        {NULL, TY_ENOTSUP, "Whitespace"},
        {NULL, TY_ENOTSUP, "Removed"},
        {NULL, TY_EPARSE, "added_tokens[0]"},
        {NULL, TY_EINVAL, "regex"},
    };
    const char *tails[] = {
        ",\"merges\":[7]}}",
        "},\"normalizer\":{\"type\":\"Lowercase\"},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}",
        "},\"pre_tokenizer\":{\"type\":\"Whitespace\"}}",
        "},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},"
        "\"behavior\":\"Removed\"}}",
        "},\"added_tokens\":[{\"content\":\"x\"}],\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}",
        "},\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
        "\"pattern\":{\"Regex\":\"(unclosed\"},\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\","
        "\"use_regex\":false}]}}",
    };
    size_t nt = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *json = cases[i].json;
        if (!json) {
            snprintf(buf, sizeof(buf), "{\"model\":{\"type\":\"BPE\",%s%s", ok_vocab, tails[nt++]);
            json = buf;
        }
        eb[0] = 0;
        int rc = load_text(json, eb, sizeof(eb));
        if (rc != cases[i].rc || !strstr(eb, cases[i].msg))
            fail_msg("case %zu: rc %d (want %d), message \"%s\" (want \"%s\")", i, rc,
                     cases[i].rc, eb, cases[i].msg);
    }
    ty_tokenizer_t *tok;
    assert_int_equal(ty_tokenizer_load_json(&tok, "/nonexistent/tok.json", eb, sizeof(eb)),
                     TY_ENOENT);
    assert_non_null(strstr(eb, "/nonexistent/tok.json"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_bytelevel),
        cmocka_unit_test(test_stream_spm),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
