/* libFuzzer target: the JSON-schema compiler, then the matcher over a small byte vocabulary.
 * Input: byte 0 = flags (bit 0: json_object instead of a schema; the rest seeds the walk),
 * then the schema text. A refused schema must come with a message; an accepted one is walked
 * for a token budget a little above its shortest document, drawing among the allowed tokens:
 * some token is always allowed, every allowed token is accepted, and when the budget is spent
 * (or an end token drawn) the text is a complete document that jansson parses. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tycho/errors.h"
#include "tycho/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok, const char *what, const char *text)
{
    if (!ok) {
        fprintf(stderr, "broken promise: %s (text so far: %s)\n", what, text ? text : "");
        abort();
    }
}

static const char *const multi[] = {"\"", "\":", "{\"", "\"}", "true", "null", "false", ", ",
                                     "\\u00", "\\ud83d", "\xc3\xa9", "\xe2\x82", "\xac", "12",
                                     "-0.5e", "[]", "{}", "\"a\"", "  ", "\n", "},{\"", NULL};

static ty_grammar_vocab_t *vocab(uint32_t *eog)
{
    static ty_grammar_vocab_t *v;
    static uint32_t n;
    if (!v) {
        static char bytes[256];
        const char *pieces[300];
        size_t lens[300];
        for (n = 0; n < 256; n++) {
            bytes[n] = (char)n;
            pieces[n] = &bytes[n];
            lens[n] = 1;
        }
        for (size_t i = 0; multi[i]; i++, n++) {
            pieces[n] = multi[i];
            lens[n] = strlen(multi[i]);
        }
        pieces[n] = "";
        lens[n] = 0;
        uint32_t e = n++;
        if (ty_grammar_vocab_new_pieces(&v, pieces, lens, n, &e, 1))
            abort();
    }
    *eog = n - 1;
    return v;
}

static void walk(const ty_grammar_t *g, uint8_t seed)
{
    uint32_t eog;
    const ty_grammar_vocab_t *v = vocab(&eog);
    ty_grammar_matcher_t *m;
    if (ty_grammar_matcher_new(&m, g, v))
        return;
    uint32_t need = ty_grammar_matcher_min_close(m);
    if (need > 1500) {
        ty_grammar_matcher_free(m);
        return;
    }
    uint32_t budget = need + seed % 24, mask[16], rng = seed * 2654435761u + 1;
    char text[4096];
    size_t len = 0;
    text[0] = 0;
    for (uint32_t k = 0; k < budget; k++) {
        int n = ty_grammar_matcher_fill_mask(m, budget - k, mask);
        check(n > 0, "some token is allowed", text);
        rng = rng * 1103515245u + 12345u;
        uint32_t pick = (rng >> 8) % (uint32_t)n, id = 0;
        for (id = 0; id < ty_grammar_vocab_size(v); id++)
            if (mask[id / 32] >> (id % 32) & 1 && pick-- == 0)
                break;
        check(id < ty_grammar_vocab_size(v), "the count matches the mask", text);
        check(ty_grammar_matcher_accept(m, id) == 0, "an allowed token is accepted", text);
        if (id == eog)
            break;
        size_t pl = id < 256 ? 1 : strlen(multi[id - 256]);
        check(len + pl < sizeof(text), "budget bounds the text", text);
        memcpy(text + len, id < 256 ? (const char *)&id : multi[id - 256], pl);
        len += pl;
        text[len] = 0;
    }
    check(ty_grammar_matcher_is_complete(m), "complete within the budget", text);
    json_t *j = json_loadb(text, len, JSON_DECODE_ANY, NULL);
    check(j != NULL, "the document parses", text);
    json_decref(j);
    ty_grammar_matcher_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct ty_gen_grammar spec = {
        .kind = data[0] & 1 ? TY_GRAMMAR_JSON_OBJECT : TY_GRAMMAR_JSON_SCHEMA,
        .schema = (const char *)data + 1, .schema_len = size - 1};
    ty_grammar_t *g;
    char err[256];
    int rc = ty_grammar_compile(&g, &spec, err, sizeof(err));
    if (rc) {
        check(rc == TY_EINVAL || rc == TY_ENOTSUP || rc == TY_ENOMEM, "a documented error", err);
        check(err[0] != 0, "a refusal has a message", NULL);
        return 0;
    }
    walk(g, data[0] >> 1);
    ty_grammar_free(g);
    return 0;
}
