/* Structured output through the batcher (tycho/batcher.h) on the real stories260K model: a
 * request with a JSON schema gives text that jansson parses and that has the schema's required
 * members, greedy and at temperature 1, within small max_tokens (the model, trained on
 * children's stories, never writes JSON by itself); a schema the grammar refuses is refused at
 * ty_batcher_add with TY_EINVAL; on the decode side (ty_batcher_add_reserved, the first token
 * sampled elsewhere) a first token the grammar admits continues into a document, and one it
 * does not admit (a prefill node that ignored the grammar) ends the request with TY_EPROTO. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/batcher.h"
#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/grammar.h"
#include "tycho/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ty_model_t *model;

struct out {
    char text[8192];
    size_t len;
    enum ty_finish fin;
    int rc;
    bool ended;
};

static int on_token(void *arg, ty_breq_t *r, const struct ty_sample *s, enum ty_finish fin)
{
    (void)arg;
    struct out *o = ty_breq_user(r);
    if (fin != TY_FINISH_EOS) {
        size_t n;
        const char *p = ty_tokenizer_piece(ty_model_tokenizer(model), s->id, &n);
        assert_true(o->len + n < sizeof(o->text));
        memcpy(o->text + o->len, p, n);
        o->len += n;
        o->text[o->len] = 0;
    }
    return fin;
}

static void on_end(void *arg, ty_breq_t *r, enum ty_finish fin, int rc)
{
    (void)arg;
    struct out *o = ty_breq_user(r);
    o->fin = fin;
    o->rc = rc;
    o->ended = true;
}

static const char schema[] =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
    "\"integer\"},\"pets\":{\"type\":\"array\",\"items\":{\"enum\":[\"cat\",\"dog\"]}}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

/* Run requests (one per `temps` entry, each max_tokens[i]) together; outs filled. */
static void run(const float *temps, const uint32_t *max_tokens, const struct ty_gen_grammar *gg,
                struct out *outs, int n)
{
    struct ty_engine_opts eo = {.max_ctx = 256, .max_seqs = 8};
    ty_engine_t *e;
    assert_int_equal(ty_engine_new(&e, model, &eo), 0);
    struct ty_batcher_opts bo = {.engine = e, .hooks = {.on_token = on_token, .on_end = on_end}};
    ty_batcher_t *b;
    assert_int_equal(ty_batcher_new(&b, &bo), 0);
    uint32_t prompt[8] = {1, 400, 300, 350, 420, 280, 310, 290};
    struct ty_gen_params gp[8];
    for (int i = 0; i < n; i++) {
        memset(&gp[i], 0, sizeof(gp[i]));
        gp[i].sampling.temperature = temps[i];
        gp[i].sampling.seed = 7 + (uint64_t)i;
        gp[i].max_tokens = max_tokens[i];
        gp[i].grammar = gg;
        struct ty_breq_opts ro = {.id = (uint64_t)i + 1, .prompt = prompt, .n_prompt = 8,
                                  .gen = &gp[i], .user = &outs[i]};
        assert_int_equal(ty_batcher_add(b, &ro, NULL), 0);
    }
    for (int guard = 0; !ty_batcher_idle(b) && guard < 10000; guard++)
        assert_true(ty_batcher_step(b) >= 0);
    ty_batcher_free(b);
    ty_engine_free(e);
}

static void check_doc(const struct out *o)
{
    assert_true(o->ended);
    assert_int_equal(o->rc, 0);
    json_error_t je;
    json_t *d = json_loadb(o->text, o->len, 0, &je);
    if (!d)
        fprintf(stderr, "does not parse (%s): %s\n", je.text, o->text);
    assert_non_null(d);
    assert_true(json_is_string(json_object_get(d, "name")));
    assert_true(json_is_integer(json_object_get(d, "age")));
    json_t *pets = json_object_get(d, "pets");
    assert_true(!pets || json_is_array(pets));
    assert_true(json_object_size(d) == 2 + (pets ? 1u : 0u));
    json_decref(d);
}

static void test_schema_requests(void **state)
{
    (void)state;
    struct ty_gen_grammar gg = {.kind = TY_GRAMMAR_JSON_SCHEMA, .schema = schema,
                                .schema_len = strlen(schema)};
    float temps[6] = {0, 1, 1, 0, 1, 1};
    uint32_t max_tokens[6] = {200, 200, 200, 24, 24, 30};
    struct out *outs = calloc(6, sizeof(*outs));
    run(temps, max_tokens, &gg, outs, 6);
    for (int i = 0; i < 6; i++) {
        fprintf(stderr, "request %d (T=%g, max %u, %s): %s\n", i, temps[i], max_tokens[i],
                ty_finish_name(outs[i].fin), outs[i].text);
        check_doc(&outs[i]);
    }
    free(outs);
}

static void test_json_object(void **state)
{
    (void)state;
    struct ty_gen_grammar gg = {.kind = TY_GRAMMAR_JSON_OBJECT};
    float temps[2] = {0, 1};
    uint32_t max_tokens[2] = {16, 40};
    struct out *outs = calloc(2, sizeof(*outs));
    run(temps, max_tokens, &gg, outs, 2);
    for (int i = 0; i < 2; i++) {
        fprintf(stderr, "json_object %d: %s\n", i, outs[i].text);
        json_t *d = json_loadb(outs[i].text, outs[i].len, 0, NULL);
        assert_true(json_is_object(d));
        json_decref(d);
    }
    free(outs);
}

static void test_refused(void **state)
{
    (void)state;
    struct ty_engine_opts eo = {.max_ctx = 64};
    ty_engine_t *e;
    assert_int_equal(ty_engine_new(&e, model, &eo), 0);
    struct ty_batcher_opts bo = {.engine = e, .hooks = {.on_token = on_token, .on_end = on_end}};
    ty_batcher_t *b;
    assert_int_equal(ty_batcher_new(&b, &bo), 0);
    const char *bad = "{\"type\":\"string\",\"pattern\":\"x\"}";
    struct ty_gen_grammar gg = {.kind = TY_GRAMMAR_JSON_SCHEMA, .schema = bad,
                                .schema_len = strlen(bad)};
    struct ty_gen_params gp = {.max_tokens = 8, .grammar = &gg};
    uint32_t prompt[2] = {1, 300};
    struct out o = {0};
    struct ty_breq_opts ro = {.id = 1, .prompt = prompt, .n_prompt = 2, .gen = &gp, .user = &o};
    assert_int_equal(ty_batcher_add(b, &ro, NULL), TY_EINVAL);
    assert_true(ty_batcher_idle(b));
    ty_batcher_free(b);
    ty_engine_free(e);
}

/* The first token whose piece is exactly `text` in stories260K's vocabulary. */
static uint32_t piece_id(const char *text)
{
    const ty_tokenizer_t *tok = ty_model_tokenizer(model);
    for (uint32_t i = 0; i < ty_tokenizer_n_vocab(tok); i++) {
        size_t n;
        const char *p = ty_tokenizer_piece(tok, i, &n);
        if (n == strlen(text) && !memcmp(p, text, n))
            return i;
    }
    fail_msg("no token \"%s\"", text);
    return 0;
}

static void test_first_token_elsewhere(void **state)
{
    (void)state;
    struct ty_engine_opts eo = {.max_ctx = 256, .max_seqs = 4};
    ty_engine_t *e;
    assert_int_equal(ty_engine_new(&e, model, &eo), 0);
    struct ty_batcher_opts bo = {.engine = e, .hooks = {.on_token = on_token, .on_end = on_end}};
    ty_batcher_t *b;
    assert_int_equal(ty_batcher_new(&b, &bo), 0);
    struct ty_gen_grammar gg = {.kind = TY_GRAMMAR_JSON_SCHEMA, .schema = schema,
                                .schema_len = strlen(schema)};
    struct ty_gen_params gp = {.max_tokens = 40, .grammar = &gg};
    uint32_t prompt[4] = {1, 300, 301, 302};
    struct out *o = calloc(2, sizeof(*o));
    ty_breq_t *r[2];
    for (int i = 0; i < 2; i++) {
        struct ty_breq_opts ro = {.id = (uint64_t)i + 1, .prompt = prompt, .n_prompt = 4,
                                  .gen = &gp, .user = &o[i]};
        assert_int_equal(ty_batcher_add_reserved(b, &ro, &r[i]), 0);
    }
    struct ty_sample good = {.id = piece_id("{")}, bad = {.id = piece_id("a")};
    assert_int_equal(ty_batcher_kv_landed(b, r[0], &good, 0), 0);
    ty_batcher_kv_landed(b, r[1], &bad, 0);
    assert_true(o[1].ended);
    assert_int_equal(o[1].rc, TY_EPROTO);
    for (int guard = 0; !ty_batcher_idle(b) && guard < 1000; guard++)
        assert_true(ty_batcher_step(b) >= 0);
    fprintf(stderr, "first token from elsewhere: %s\n", o[0].text);
    check_doc(&o[0]);
    free(o);
    ty_batcher_free(b);
    ty_engine_free(e);
}

int main(void)
{
    const char *data = getenv("TYCHO_TEST_DATA");
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/models/stories260K/stories260K.gguf",
             data ? data : "../shared");
    if (ty_model_load(&model, path, err, sizeof(err)) != 0 || !ty_model_tokenizer(model)) {
        fprintf(stderr, "skip: %s\n", err);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_requests),
        cmocka_unit_test(test_json_object),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_first_token_elsewhere),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ty_model_free(model);
    return rc;
}
