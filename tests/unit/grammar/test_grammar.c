/* Structured output (tycho/grammar.h): schemas compile or are refused naming the keyword and
 * where it is; a matcher fed hand-written JSON accepts the documents a schema allows and
 * refuses the rest; and random walks that draw uniformly among the tokens the mask allows
 * (llama3.1's 128k vocabulary and stories260K's 512), with small token budgets, always end in
 * a document that jansson parses and that a small validator written here (independent of the
 * grammar code) accepts. Median mask time on the 128k vocabulary is printed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/grammar.h"
#include "tycho/model.h"
#include "tycho/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *data_dir(void)
{
    const char *d = getenv("TYCHO_TEST_DATA");
    return d ? d : "../shared";
}

/* ---- a validator for the supported subset (written from the JSON Schema spec) ------------- */

static bool validate(json_t *root, json_t *s, json_t *v);

static size_t utf8_len(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((uint8_t)*s & 0xC0) != 0x80;
    return n;
}

static bool type_ok(json_t *s, const char *t, json_t *v)
{
    if (!strcmp(t, "object"))
        return json_is_object(v);
    if (!strcmp(t, "array"))
        return json_is_array(v);
    if (!strcmp(t, "string"))
        return json_is_string(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v);
    if (!strcmp(t, "number"))
        return json_is_number(v);
    if (!strcmp(t, "boolean"))
        return json_is_boolean(v);
    if (!strcmp(t, "null"))
        return json_is_null(v);
    (void)s;
    return false;
}

static bool validate_object(json_t *root, json_t *s, json_t *v)
{
    json_t *props = json_object_get(s, "properties"), *add = json_object_get(s, "additionalProperties");
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(s, "required"), i, x)
        if (!json_object_get(v, json_string_value(x)))
            return false;
    const char *k;
    json_object_foreach(v, k, x) {
        json_t *ps = json_object_get(props, k);
        if (ps ? !validate(root, ps, x) : json_is_false(add) || (add && !validate(root, add, x)))
            return false;
    }
    return true;
}

static bool validate_array(json_t *root, json_t *s, json_t *v)
{
    json_t *pre = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    if (mn && json_array_size(v) < (size_t)json_integer_value(mn))
        return false;
    if (mx && json_array_size(v) > (size_t)json_integer_value(mx))
        return false;
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
        json_t *is = i < json_array_size(pre) ? json_array_get(pre, i) : items;
        if (is && !validate(root, is, x))
            return false;
    }
    return true;
}

static bool validate(json_t *root, json_t *s, json_t *v)
{
    if (json_is_true(s))
        return true;
    json_t *x;
    if ((x = json_object_get(s, "$ref"))) {
        const char *ref = json_string_value(x);
        json_t *t = root;
        if (!strncmp(ref, "#/$defs/", 8))
            t = json_object_get(json_object_get(root, "$defs"), ref + 8);
        return t && validate(root, t, v);
    }
    if ((x = json_object_get(s, "const")))
        return json_equal(x, v);
    if ((x = json_object_get(s, "enum"))) {
        size_t i;
        json_t *e;
        json_array_foreach(x, i, e)
            if (json_equal(e, v))
                return true;
        return false;
    }
    const char *comb[] = {"anyOf", "oneOf", "allOf"};
    for (int c = 0; c < 3; c++)
        if ((x = json_object_get(s, comb[c]))) {
            size_t i;
            json_t *e;
            json_array_foreach(x, i, e)
                if (validate(root, e, v))
                    return true;
            return false;
        }
    json_t *t = json_object_get(s, "type");
    if (t) {
        bool ok = json_is_true(json_object_get(s, "nullable")) && json_is_null(v);
        if (json_is_string(t))
            ok = ok || type_ok(s, json_string_value(t), v);
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e)
            ok = ok || type_ok(s, json_string_value(e), v);
        if (!ok)
            return false;
    }
    if (json_is_string(v)) {
        size_t n = utf8_len(json_string_value(v));
        if ((x = json_object_get(s, "minLength")) && n < (size_t)json_integer_value(x))
            return false;
        if ((x = json_object_get(s, "maxLength")) && n > (size_t)json_integer_value(x))
            return false;
    }
    if (json_is_object(v))
        return validate_object(root, s, v);
    if (json_is_array(v))
        return validate_array(root, s, v);
    return true;
}

/* ---- compile ------------------------------------------------------------------------------ */

static int compile_text(const char *schema, char *err, size_t errlen, ty_grammar_t **out)
{
    struct ty_gen_grammar spec = {.kind = TY_GRAMMAR_JSON_SCHEMA, .schema = schema,
                                  .schema_len = strlen(schema)};
    ty_grammar_t *g = NULL;
    int rc = ty_grammar_compile(&g, &spec, err, errlen);
    if (out)
        *out = g;
    else
        ty_grammar_free(g);
    return rc;
}

static void test_compile(void **state)
{
    (void)state;
    char err[256];
    static const char *const good[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"description\":\"x\"}},"
        "\"required\":[\"a\"],\"additionalProperties\":false,\"title\":\"T\"}",
        "{\"type\":[\"integer\",\"null\"]}",
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\","
        "\"items\":{\"$ref\":\"#/$defs/n\"}}}}},\"$ref\":\"#/$defs/n\"}",
        "{\"definitions\":{\"x\":{\"const\":3}},\"allOf\":[{\"$ref\":\"#/definitions/x\"}]}",
        "{\"oneOf\":[{\"type\":\"string\",\"format\":\"date\"},{\"enum\":[1,\"two\",null]}]}",
        "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"boolean\"}],\"minItems\":1,\"maxItems\":4}",
        "{\"type\":\"string\",\"nullable\":true,\"minLength\":1,\"maxLength\":3}",
        "{}",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++) {
        int rc = compile_text(good[i], err, sizeof(err), NULL);
        if (rc)
            fprintf(stderr, "schema %zu: %s\n", i, err);
        assert_int_equal(rc, 0);
    }
    static const struct {
        const char *schema, *msg;
        int rc;
    } bad[] = {
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"pattern\":\"a+\"}}}",
         "'pattern' at /properties/name", TY_ENOTSUP},
        {"{\"type\":\"integer\",\"minimum\":3}", "'minimum' at /", TY_ENOTSUP},
        {"{\"type\":\"array\",\"items\":{\"not\":{}}}", "'not' at /items", TY_ENOTSUP},
        {"{\"allOf\":[{},{}]}", "allOf", TY_ENOTSUP},
        {"{\"if\":{},\"then\":{}}", "'if'", TY_ENOTSUP},
        {"{\"type\":\"strin\"}", "unknown type", TY_EINVAL},
        {"{\"type\":\"object\"", "not valid JSON", TY_EINVAL},
        {"{\"$ref\":\"#/$defs/missing\"}", "cannot resolve", TY_EINVAL},
        {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"$ref\":\"#/$defs/n\"}},"
         "\"required\":[\"k\"]}},\"$ref\":\"#/$defs/n\"}", "no finite", TY_EINVAL},
        {"{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", "minLength", TY_EINVAL},
        {"{\"enum\":[]}", "enum", TY_EINVAL},
        {"[1]", "schema must be", TY_EINVAL},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        int rc = compile_text(bad[i].schema, err, sizeof(err), NULL);
        if (rc != bad[i].rc || !strstr(err, bad[i].msg))
            fprintf(stderr, "bad %zu: rc %d err \"%s\"\n", i, rc, err);
        assert_int_equal(rc, bad[i].rc);
        assert_non_null(strstr(err, bad[i].msg));
    }
}

/* ---- bytes -------------------------------------------------------------------------------- */

static ty_grammar_vocab_t *byte_vocab(void)
{
    static char bytes[256];
    const char *pieces[257];
    size_t lens[257];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        pieces[i] = &bytes[i];
        lens[i] = 1;
    }
    pieces[256] = "";
    lens[256] = 0;
    uint32_t eog = 256;
    ty_grammar_vocab_t *v;
    assert_int_equal(ty_grammar_vocab_new_pieces(&v, pieces, lens, 257, &eog, 1), 0);
    return v;
}

/* Whether the matcher takes `doc` whole and calls it complete. */
static bool matches(const ty_grammar_t *g, const ty_grammar_vocab_t *v, const char *doc)
{
    ty_grammar_matcher_t *m;
    assert_int_equal(ty_grammar_matcher_new(&m, g, v), 0);
    bool ok = ty_grammar_matcher_accept_bytes(m, doc, strlen(doc)) == 0 &&
              ty_grammar_matcher_is_complete(m);
    ty_grammar_matcher_free(m);
    return ok;
}

static void test_bytes(void **state)
{
    (void)state;
    ty_grammar_vocab_t *v = byte_vocab();
    static const struct {
        const char *schema;
        const char *yes[6], *no[8];
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
         "\"string\",\"maxLength\":3},\"c\":{\"type\":\"boolean\"}},\"required\":[\"a\",\"c\"],"
         "\"additionalProperties\":false}",
         {"{\"a\":1,\"c\":true}", "{ \"a\" : -20, \"b\": \"x\\u00e9\\n\", \"c\":false}",
          "{\"a\":0,\"b\":\"\xc3\xa9\xe2\x82\xac\",\"c\":true}"},
         {"{\"c\":true,\"a\":1}", "{\"a\":1}", "{\"a\":1.5,\"c\":true}",
          "{\"a\":01,\"c\":true}", "{\"a\":1,\"b\":\"abcd\",\"c\":true}",
          "{\"a\":1,\"c\":true,\"d\":1}", "{\"a\":1,\"b\":\"\xc3\",\"c\":true}",
          "{\"a\":1,     \"c\":true}"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":1,\"maxItems\":2}",
         {"[1]", "[1e5,-0.25]", "[ 3 , 4 ]"},
         {"[]", "[1,2,3]", "[1,]", "[.5]", "[1e]", "[\"1\"]", "[1] "}},
        {"{\"anyOf\":[{\"type\":\"string\",\"minLength\":2},{\"enum\":[\"a\",true]},"
         "{\"type\":\"null\"}]}",
         {"\"ab\"", "\"a\"", "true", "null"},
         {"\"\"", "\"b\"", "false", "nul", "\"\\ud800\"", "\"\\u0000\"", "\"\x01\""}},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"const\":{\"k\":[1,\"z\"]}}},"
         "\"additionalProperties\":{\"type\":\"integer\"}}",
         {"{}", "{\"x\":{\"k\":[1,\"z\"]}}", "{\"y\":3,\"x\":{\"k\":[1,\"z\"]},\"zz\":4}"},
         {"{\"x\":3}", "{\"y\":\"s\"}", "{\"x\":{\"k\":[1, \"z\"]}}"}},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(*cases); c++) {
        char err[256];
        ty_grammar_t *g;
        assert_int_equal(compile_text(cases[c].schema, err, sizeof(err), &g), 0);
        for (size_t i = 0; i < 6 && cases[c].yes[i]; i++) {
            if (!matches(g, v, cases[c].yes[i]))
                fprintf(stderr, "case %zu should accept %s\n", c, cases[c].yes[i]);
            assert_true(matches(g, v, cases[c].yes[i]));
        }
        for (size_t i = 0; i < 8 && cases[c].no[i]; i++) {
            if (matches(g, v, cases[c].no[i]))
                fprintf(stderr, "case %zu should refuse %s\n", c, cases[c].no[i]);
            assert_false(matches(g, v, cases[c].no[i]));
        }
        ty_grammar_free(g);
    }
    /* unions that refer to themselves several times: each expanded once, not 3^depth times */
    {
        const char *selfref = "{\"anyOf\":[{\"$ref\":\"#\"},{\"$ref\":\"#\"},{\"$ref\":\"#\"},"
                              "{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"maxItems\":2},"
                              "{\"type\":\"null\"}]}";
        char err[256];
        ty_grammar_t *g;
        assert_int_equal(compile_text(selfref, err, sizeof(err), &g), 0);
        uint64_t t0 = ty_clock_ns();
        assert_true(matches(g, v, "[null,[[null],[]]]"));
        assert_false(matches(g, v, "[null,null,null]"));
        assert_true(ty_clock_ns() - t0 < 1000000000ull);
        ty_grammar_free(g);
    }
    /* json_object: any JSON whose top level is an object */
    struct ty_gen_grammar spec = {.kind = TY_GRAMMAR_JSON_OBJECT};
    ty_grammar_t *g;
    assert_int_equal(ty_grammar_compile(&g, &spec, NULL, 0), 0);
    assert_true(matches(g, v, "{\"a\":[1,{\"b\":null}],\"c\":\"d\"}"));
    assert_false(matches(g, v, "[1]"));
    assert_false(matches(g, v, "\"s\""));
    ty_grammar_free(g);
    ty_grammar_vocab_free(v);
}

/* ---- random walks --------------------------------------------------------------------------- */

static const char *const walk_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
    "\"maxItems\":3},\"kind\":{\"enum\":[\"a\",\"b c\",1,null]},\"score\":{\"type\":[\"number\","
    "\"null\"]},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"kind\"],"
    "\"additionalProperties\":false}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],"
    "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
    "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":"
    "[\"a\"],\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{\"b\":{\"const\":"
    "[1,2]}},\"required\":[\"b\"],\"additionalProperties\":false}]}",
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"minLength\":2},{\"type\":"
    "\"number\"}],\"items\":false,\"minItems\":2}",
    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"null\"}},\"additionalProperties\":"
    "{\"type\":\"integer\"}}",
    NULL, /* json_object */
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

struct walk_stats {
    uint64_t ns[20000];
    size_t n;
};

/* One walk: draw uniformly among allowed tokens until an end token or the budget; the text
 * must then be a complete document that parses and validates. */
static void walk_once(const ty_grammar_t *g, const ty_grammar_vocab_t *v,
                      const ty_tokenizer_t *tok, json_t *schema, uint32_t budget, uint64_t *rng,
                      struct walk_stats *st)
{
    ty_grammar_matcher_t *m;
    assert_int_equal(ty_grammar_matcher_new(&m, g, v), 0);
    size_t words = ty_grammar_mask_words(v);
    uint32_t *mask = malloc(words * sizeof(uint32_t));
    char text[1 << 16];
    size_t len = 0;
    bool ended = false;
    for (uint32_t n = 0; n < budget && !ended; n++) {
        uint64_t t0 = ty_clock_ns();
        int allowed = ty_grammar_matcher_fill_mask(m, budget - n, mask);
        if (st && st->n < 20000)
            st->ns[st->n++] = ty_clock_ns() - t0;
        assert_true(allowed > 0);
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t k = (uint32_t)((*rng >> 33) % (uint32_t)allowed), id = 0;
        for (size_t w = 0; w < words; w++) {
            uint32_t c = (uint32_t)__builtin_popcount(mask[w]);
            if (k >= c) {
                k -= c;
                continue;
            }
            uint32_t bits = mask[w];
            for (; k; k--)
                bits &= bits - 1;
            id = (uint32_t)(w * 32 + (uint32_t)__builtin_ctz(bits));
            break;
        }
        if (ty_tokenizer_is_eog(tok, id)) {
            assert_true(ty_grammar_matcher_is_complete(m));
            ended = true;
            break;
        }
        size_t pl;
        const char *p = ty_tokenizer_piece(tok, id, &pl);
        assert_int_equal(ty_grammar_matcher_accept(m, id), 0);
        assert_true(len + pl < sizeof(text));
        memcpy(text + len, p, pl);
        len += pl;
    }
    text[len] = 0;
    if (!ty_grammar_matcher_is_complete(m))
        fprintf(stderr, "incomplete after %u tokens: %s\n", budget, text);
    assert_true(ty_grammar_matcher_is_complete(m));
    json_error_t je;
    json_t *doc = json_loadb(text, len, JSON_DECODE_ANY, &je);
    if (!doc)
        fprintf(stderr, "does not parse (%s): %s\n", je.text, text);
    assert_non_null(doc);
    if (schema && !validate(schema, schema, doc))
        fprintf(stderr, "does not validate: %s\n", text);
    assert_true(schema ? validate(schema, schema, doc) : json_is_object(doc));
    json_decref(doc);
    free(mask);
    ty_grammar_matcher_free(m);
}

static void walks(const ty_tokenizer_t *tok, int per_schema, struct walk_stats *st)
{
    ty_grammar_vocab_t *v;
    uint64_t t0 = ty_clock_ns();
    assert_int_equal(ty_grammar_vocab_new(&v, tok), 0);
    fprintf(stderr, "vocabulary index of %u tokens: %.1f ms\n", ty_grammar_vocab_size(v),
            (double)(ty_clock_ns() - t0) / 1e6);
    uint64_t rng = 42;
    for (size_t s = 0; s < sizeof(walk_schemas) / sizeof(*walk_schemas); s++) {
        struct ty_gen_grammar spec = {.kind = walk_schemas[s] ? TY_GRAMMAR_JSON_SCHEMA
                                                              : TY_GRAMMAR_JSON_OBJECT,
                                      .schema = walk_schemas[s],
                                      .schema_len = walk_schemas[s] ? strlen(walk_schemas[s]) : 0};
        ty_grammar_t *g;
        char err[256];
        assert_int_equal(ty_grammar_compile(&g, &spec, err, sizeof(err)), 0);
        json_t *schema = walk_schemas[s] ? json_loads(walk_schemas[s], 0, NULL) : NULL;
        for (int i = 0; i < per_schema; i++) {
            uint32_t budget = 40 + (uint32_t)(i * 37 % 120); /* each > the shortest document */
            walk_once(g, v, tok, schema, budget, &rng, st);
        }
        json_decref(schema);
        ty_grammar_free(g);
    }
    ty_grammar_vocab_free(v);
}

/* llama3.1's tokenizer.json; its post_processor (a "Sequence", which only adds BOS and which
 * the loader does not take) is dropped: the vocabulary is what matters here. */
static int load_llama3(ty_tokenizer_t **tok, char *err, size_t errlen)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/tokenizers/llama3_1/tokenizer.json", data_dir());
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) {
        snprintf(err, errlen, "llama3_1 tokenizer.json: %s", je.text);
        return TY_ENOENT;
    }
    json_object_set_new(j, "post_processor", json_null());
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    int rc = ty_tokenizer_load_json_buf(tok, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

static void test_walks_llama3(void **state)
{
    (void)state;
    char err[256];
    ty_tokenizer_t *tok;
    if (load_llama3(&tok, err, sizeof(err))) {
        fprintf(stderr, "skip llama3_1: %s\n", err);
        skip();
    }
    struct walk_stats *st = calloc(1, sizeof(*st));
    walks(tok, 40, st);
    qsort(st->ns, st->n, sizeof(uint64_t), cmp_u64);
    fprintf(stderr, "llama3_1 mask time over %zu masks: median %.3f ms, p90 %.3f ms, max %.3f ms\n",
            st->n, st->ns[st->n / 2] / 1e6, st->ns[st->n * 9 / 10] / 1e6, st->ns[st->n - 1] / 1e6);
    free(st);
    ty_tokenizer_free(tok);
}

static void test_walks_stories(void **state)
{
    (void)state;
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/models/stories260K/stories260K.gguf", data_dir());
    ty_model_t *model;
    if (ty_model_load(&model, path, err, sizeof(err)) || !ty_model_tokenizer(model)) {
        fprintf(stderr, "skip stories260K: %s\n", err);
        skip();
    }
    walks(ty_model_tokenizer(model), 100, NULL);
    ty_model_free(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compile),
        cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_walks_stories),
        cmocka_unit_test(test_walks_llama3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
