/* The generation loop: prefill all prompts (prefix cache first), then one decode token per
 * live sequence per forward call, sampling, detokenising and checking stop conditions. */
#include "tycho/engine.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/stoptext.h"

#include <stdlib.h>
#include <string.h>

struct gen_seq {
    ty_kvseq_t *seq;
    ty_sampler_t *sampler;
    uint32_t *hist; /* prompt then output */
    size_t n_hist, cap_hist;
    size_t n_prompt;
#ifdef TY_HAVE_TOKENIZER
    struct ty_stoptext st; /* st.detok.tok NULL: the model has no tokenizer */
#endif
    bool done;
};

static int push_id(struct gen_seq *g, uint32_t id)
{
    if (g->n_hist == g->cap_hist) {
        size_t cap = g->cap_hist * 2 + 64;
        uint32_t *nh = realloc(g->hist, cap * sizeof(uint32_t));
        if (!nh)
            return TY_ENOMEM;
        g->hist = nh;
        g->cap_hist = cap;
    }
    g->hist[g->n_hist++] = id;
    return 0;
}

/* Record token `s` for sequence `i`, updating text and finish state. */
static int accept(ty_engine_t *e, struct gen_seq *g, struct ty_gen_result *r, size_t i,
                  const struct ty_sample *s, const struct ty_gen_params *p, ty_gen_token_cb cb,
                  void *arg)
{
    const ty_model_t *m = ty_engine_model(e);
    const char *piece = "";
    if (ty_gen_is_end(p, m, s->id)) { /* EOS or a stop token: not in the output */
        r->finish = TY_FINISH_EOS;
        g->done = true;
        return 0;
    }
    int rc = push_id(g, s->id);
    if (rc)
        return rc;
    r->ids[r->n_ids] = s->id;
    r->samples[r->n_ids++] = *s;
#ifdef TY_HAVE_TOKENIZER
    if (g->st.detok.tok) {
        size_t before = g->st.n_text;
        if ((rc = ty_stoptext_push(&g->st, s->id)) < 0)
            return rc;
        /* the callback sees this token's text, less what a stop string cut */
        piece = g->st.text && before < g->st.n_text ? g->st.text + before : "";
        if (ty_stoptext_hit(&g->st)) {
            r->finish = TY_FINISH_STOP;
            g->done = true;
        }
    }
#endif
    if (cb && cb(arg, i, s->id, piece))
        g->done = true;
    if (!g->done && r->n_ids >= p->max_tokens) {
        r->finish = TY_FINISH_LENGTH;
        g->done = true;
    }
    if (!g->done && ty_kvseq_n_tokens(g->seq) + 1 >= ty_engine_max_ctx(e)) {
        r->finish = TY_FINISH_CTX;
        g->done = true;
    }
    return 0;
}

static int setup(ty_engine_t *e, struct gen_seq *g, const uint32_t *prompt, size_t n,
                 const struct ty_gen_params *p, struct ty_gen_result *r)
{
    const ty_model_t *m = ty_engine_model(e);
    int rc = ty_kvpool_seq_new(ty_engine_pool(e), &g->seq);
    if (rc)
        return rc;
    if ((rc = ty_sampler_new(&g->sampler, &p->sampling, ty_model_config(m)->n_vocab)))
        return rc;
    for (size_t j = 0; j < n; j++)
        if ((rc = push_id(g, prompt[j])))
            return rc;
    g->n_prompt = n;
#ifdef TY_HAVE_TOKENIZER
    if ((rc = ty_stoptext_init(&g->st, ty_model_tokenizer(m), p->stop, p->n_stop)))
        return rc;
#endif
    r->ids = malloc(((size_t)p->max_tokens + 1) * sizeof(uint32_t));
    r->samples = malloc(((size_t)p->max_tokens + 1) * sizeof(struct ty_sample));
    if (!r->ids || !r->samples)
        return TY_ENOMEM;
    r->n_prompt = (uint32_t)n;
    rc = ty_kvpool_seq_match_prefix(ty_engine_pool(e), g->seq, prompt, n);
    if (rc < 0)
        return rc;
    r->n_cached = (uint32_t)rc;
    return 0;
}

/* One forward over every live sequence (its pending tokens), then sample each. */
static int step(ty_engine_t *e, struct gen_seq *gs, size_t n, const struct ty_gen_params *p,
                struct ty_gen_result *res, float *logits, ty_gen_token_cb cb, void *arg)
{
    struct ty_batch_seq *bs = calloc(n, sizeof(*bs));
    uint32_t *map = calloc(n, sizeof(uint32_t)), nb = 0, V = ty_model_config(ty_engine_model(e))->n_vocab;
    uint32_t eog[TY_SAMPLE_MAX_BAN];
    size_t n_eog = ty_model_eog_list(ty_engine_model(e), eog, TY_SAMPLE_MAX_BAN);
    n_eog = n_eog < TY_SAMPLE_MAX_BAN ? n_eog : TY_SAMPLE_MAX_BAN;
    int rc = TY_ENOMEM;
    if (!bs || !map)
        goto out;
    for (size_t i = 0; i < n; i++) {
        uint32_t have = ty_kvseq_n_tokens(gs[i].seq);
        if (gs[i].done || have >= gs[i].n_hist)
            continue;
        bs[nb] = (struct ty_batch_seq){gs[i].seq, gs[i].hist + have,
                                       (uint32_t)(gs[i].n_hist - have), false};
        map[nb++] = (uint32_t)i;
    }
    struct ty_batch b = {.seqs = bs, .n_seqs = nb};
    if (nb && (rc = ty_engine_forward(e, &b, logits)))
        goto out;
    for (uint32_t k = 0; k < nb; k++) /* sliding window: pages no layer reads again */
        ty_engine_seq_trim(e, bs[k].seq);
    rc = 0;
    for (uint32_t k = 0; k < nb && !rc; k++) {
        struct gen_seq *g = &gs[map[k]];
        struct ty_sample s;
        ty_gen_ban_ends(p, res[map[k]].n_ids, eog, n_eog, g->sampler); /* min_tokens */
        rc = ty_sampler_sample(g->sampler, logits + (size_t)k * V, g->hist, g->n_hist, &s);
        if (!rc)
            rc = accept(e, g, &res[map[k]], map[k], &s, p, cb, arg);
    }
out:
    free(bs);
    free(map);
    return rc;
}

static int finish_results(struct gen_seq *gs, size_t n, struct ty_gen_result *res)
{
    for (size_t i = 0; i < n; i++) {
#ifdef TY_HAVE_TOKENIZER
        if (!gs[i].st.detok.tok)
            continue; /* no tokenizer: text stays NULL */
        if (ty_stoptext_flush(&gs[i].st) || !(res[i].text = ty_stoptext_release(&gs[i].st, &res[i].text_len)))
            return TY_ENOMEM;
#else
        (void)gs;
        (void)res;
#endif
    }
    return 0;
}

int ty_engine_generate(ty_engine_t *e, const uint32_t *const *prompts, const size_t *n_prompt,
                       size_t n, const struct ty_gen_params *p, struct ty_gen_result *res,
                       ty_gen_token_cb cb, void *cb_arg)
{
    const struct ty_model_config *c = ty_model_config(ty_engine_model(e));
    struct gen_seq *gs = calloc(n ? n : 1, sizeof(*gs));
    float *logits = malloc(n * (size_t)c->n_vocab * sizeof(float) + 1);
    int rc = gs && logits ? 0 : TY_ENOMEM;
    memset(res, 0, n * sizeof(*res));
    for (size_t i = 0; i < n && !rc; i++) {
        if (!n_prompt[i] || n_prompt[i] >= ty_engine_max_ctx(e))
            rc = TY_ERANGE;
        else
            rc = setup(e, &gs[i], prompts[i], n_prompt[i], p, &res[i]);
        gs[i].done = p->max_tokens == 0;
    }
    uint64_t t0 = ty_clock_ns(), t1 = t0;
    bool live = true;
    for (int first = 1; !rc && live; first = 0) {
        rc = step(e, gs, n, p, res, logits, cb, cb_arg);
        if (first)
            t1 = ty_clock_ns();
        live = false;
        for (size_t i = 0; i < n; i++)
            live |= !gs[i].done;
    }
    uint64_t t2 = ty_clock_ns();
    if (!rc)
        rc = finish_results(gs, n, res);
    for (size_t i = 0; gs && i < n; i++) {
        res[i].prefill_ms = (double)(t1 - t0) / 1e6;
        res[i].decode_ms = (double)(t2 - t1) / 1e6;
        ty_kvpool_seq_free(ty_engine_pool(e), gs[i].seq);
        ty_sampler_free(gs[i].sampler);
        free(gs[i].hist);
#ifdef TY_HAVE_TOKENIZER
        ty_stoptext_clear(&gs[i].st);
#endif
    }
    free(gs);
    free(logits);
    return rc;
}
