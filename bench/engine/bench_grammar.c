/* Structured output's cost: decode tokens/s through the batcher with a JSON-schema grammar and
 * without, same model, same run (requests alternate so that drift hits both), and the median
 * time of one mask over the states the grammar requests went through (replayed with a matcher
 * of the same vocabulary). Prints JSON lines.
 * usage: bench_grammar MODEL [GEN_TOKENS] [REQUESTS_EACH] [THREADS]
 * MODEL: e.g. the directory bench/engine/mk_vocab_model.py writes (llama3.1's 128k vocab). */
#include "tycho/batcher.h"
#include "tycho/clock.h"
#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/grammar.h"
#include "tycho/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GEN 1024

static const char schema[] =
    "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\"},\"year\":{\"type\":"
    "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"rating\":"
    "{\"enum\":[\"G\",\"PG\",\"R\"]}},\"required\":[\"title\",\"year\",\"tags\",\"rating\"],"
    "\"additionalProperties\":false}";

struct run {
    uint32_t ids[MAX_GEN], n_ids;
    uint64_t decode_us, decode_tokens;
    bool ended;
};

static struct run *cur;

static int on_token(void *arg, ty_breq_t *r, const struct ty_sample *s, enum ty_finish fin)
{
    (void)arg;
    (void)r;
    if (fin != TY_FINISH_EOS && cur->n_ids < MAX_GEN)
        cur->ids[cur->n_ids++] = s->id;
    return fin;
}

static void on_end(void *arg, ty_breq_t *r, enum ty_finish fin, int rc)
{
    (void)arg;
    (void)r;
    (void)fin;
    if (rc)
        fprintf(stderr, "bench_grammar: request failed: %s\n", ty_strerror(rc));
    cur->ended = true;
}

static void on_forward(void *arg, const struct ty_batcher_call *c)
{
    (void)arg;
    if (c->decode_only) {
        cur->decode_us += c->step_us;
        cur->decode_tokens += c->n_tokens;
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Mask times over the states of one grammar request's output (ns into out). */
static size_t replay(const ty_grammar_t *g, const ty_grammar_vocab_t *v, const struct run *r,
                     uint32_t max_tokens, uint64_t *out)
{
    ty_grammar_matcher_t *m;
    uint32_t *mask = malloc(ty_grammar_mask_words(v) * sizeof(uint32_t));
    if (!mask || ty_grammar_matcher_new(&m, g, v)) {
        free(mask);
        return 0;
    }
    size_t n = 0;
    for (uint32_t k = 0; k < r->n_ids; k++) {
        uint64_t t0 = ty_clock_ns();
        ty_grammar_matcher_fill_mask(m, max_tokens - k, mask);
        out[n++] = ty_clock_ns() - t0;
        if (ty_grammar_matcher_accept(m, r->ids[k]))
            break;
    }
    ty_grammar_matcher_free(m);
    free(mask);
    return n;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_grammar MODEL [GEN_TOKENS] [REQUESTS_EACH] [THREADS]\n");
        return 2;
    }
    uint32_t gen = argc > 2 ? (uint32_t)atoi(argv[2]) : 128;
    int reqs = argc > 3 ? atoi(argv[3]) : 4;
    uint32_t threads = argc > 4 ? (uint32_t)atoi(argv[4]) : 1;
    gen = gen > MAX_GEN ? MAX_GEN : gen;
    char err[256];
    ty_model_t *model;
    if (ty_model_load(&model, argv[1], err, sizeof(err))) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    struct ty_engine_opts eo = {.n_threads = threads, .max_ctx = 2048, .max_seqs = 2};
    ty_engine_t *e;
    ty_batcher_t *b;
    struct ty_batcher_opts bo = {.hooks = {.on_token = on_token, .on_end = on_end,
                                           .on_forward = on_forward}};
    if (ty_engine_new(&e, model, &eo) || (bo.engine = e, ty_batcher_new(&b, &bo))) {
        fprintf(stderr, "bench_grammar: engine\n");
        return 1;
    }
    struct ty_gen_grammar gg = {.kind = TY_GRAMMAR_JSON_SCHEMA, .schema = schema,
                                .schema_len = strlen(schema)};
    struct run *runs = calloc((size_t)reqs * 2, sizeof(*runs));
    uint32_t prompt[16];
    for (int i = 0; i < 16; i++)
        prompt[i] = 1000 + (uint32_t)i * 997;
    for (int i = 0; i < reqs * 2; i++) {
        struct ty_gen_params gp = {.max_tokens = gen, .ignore_eos = !(i & 1)};
        gp.sampling.temperature = 1.0f;
        gp.sampling.seed = (uint64_t)i;
        gp.grammar = i & 1 ? &gg : NULL;
        cur = &runs[i];
        struct ty_breq_opts ro = {.id = (uint64_t)i + 1, .prompt = prompt, .n_prompt = 16,
                                  .gen = &gp};
        int rc = ty_batcher_add(b, &ro, NULL);
        while (!rc && !cur->ended)
            rc = ty_batcher_step(b) < 0;
    }
    uint64_t us[2] = {0}, tok[2] = {0};
    for (int i = 0; i < reqs * 2; i++) {
        us[i & 1] += runs[i].decode_us;
        tok[i & 1] += runs[i].decode_tokens;
    }
    ty_grammar_t *g;
    ty_grammar_vocab_t *v;
    uint64_t *ns = malloc((size_t)reqs * MAX_GEN * sizeof(uint64_t));
    size_t n_ns = 0;
    if (!ty_grammar_compile(&g, &gg, err, sizeof(err)) &&
        !ty_grammar_vocab_new(&v, ty_model_tokenizer(model))) {
        for (int i = 1; i < reqs * 2; i += 2)
            n_ns += replay(g, v, &runs[i], gen, ns + n_ns);
        ty_grammar_vocab_free(v);
        ty_grammar_free(g);
    }
    qsort(ns, n_ns, sizeof(uint64_t), cmp_u64);
    double tps0 = tok[0] ? tok[0] * 1e6 / (double)us[0] : 0;
    double tps1 = tok[1] ? tok[1] * 1e6 / (double)us[1] : 0;
    printf("{\"vocab\":%u,\"threads\":%u,\"plain_tokens\":%llu,\"plain_tok_s\":%.1f,"
           "\"grammar_tokens\":%llu,\"grammar_tok_s\":%.1f,\"ratio\":%.3f,"
           "\"mask_median_ms\":%.3f,\"mask_p90_ms\":%.3f,\"masks\":%zu}\n",
           ty_model_config(model)->n_vocab, threads, (unsigned long long)tok[0], tps0,
           (unsigned long long)tok[1], tps1, tps0 ? tps1 / tps0 : 0,
           n_ns ? ns[n_ns / 2] / 1e6 : 0, n_ns ? ns[n_ns * 9 / 10] / 1e6 : 0, n_ns);
    if (reqs > 0) {
        char text[8192];
        const struct run *r = &runs[1];
        int n = ty_tokenizer_decode(ty_model_tokenizer(model), r->ids, r->n_ids, true, text,
                                    sizeof(text));
        if (n >= 0)
            printf("# a grammar request's output: %s\n", text);
    }
    free(ns);
    free(runs);
    ty_batcher_free(b);
    ty_engine_free(e);
    ty_model_free(model);
    return 0;
}
