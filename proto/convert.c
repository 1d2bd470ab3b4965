/* Conversions between the cluster's control messages and engine types (tycho/proto.h). */
#include "tycho/proto.h"

#include "tycho/errors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ty_pb_logprob_pack(const struct ty_sample *s, struct ty_pb_logprob *out)
{
    tycho__v1__token_logprob__init(&out->lp);
    out->lp.token_id = s->id;
    out->lp.logprob = s->logprob;
    uint32_t n = s->n_top < TY_SAMPLE_MAX_LOGPROBS ? s->n_top : TY_SAMPLE_MAX_LOGPROBS;
    for (uint32_t k = 0; k < n; k++) {
        tycho__v1__top_logprob__init(&out->top[k]);
        out->top[k].token_id = s->top[k].id;
        out->top[k].logprob = s->top[k].logprob;
        out->topp[k] = &out->top[k];
    }
    out->lp.n_top = n;
    out->lp.top = out->topp;
}

void ty_pb_logprob_unpack(const Tycho__V1__TokenLogprob *lp, uint32_t n_vocab,
                                struct ty_sample *s)
{
    s->logprob = lp->logprob;
    s->n_top = 0;
    for (size_t k = 0; k < lp->n_top && s->n_top < TY_SAMPLE_MAX_LOGPROBS; k++)
        if (!n_vocab || lp->top[k]->token_id < n_vocab)
            s->top[s->n_top++] =
                (struct ty_token_logprob){lp->top[k]->token_id, lp->top[k]->logprob};
}

void ty_pb_sampling_pack(const struct ty_gen_params *g, Tycho__V1__SamplingParams *sp,
                               Tycho__V1__LogitBias *bias, Tycho__V1__LogitBias **bias_ptrs)
{
    const struct ty_sampling_params *p = &g->sampling;
    sp->temperature = p->temperature;
    sp->top_p = p->top_p;
    sp->top_k = p->top_k;
    sp->min_p = p->min_p;
    sp->seed = p->seed;
    sp->has_seed = true;
    sp->repetition_penalty = p->repetition_penalty;
    sp->presence_penalty = p->presence_penalty;
    sp->frequency_penalty = p->frequency_penalty;
    sp->max_tokens = g->max_tokens;
    sp->logprobs = p->logprobs || p->n_logprobs > 0;
    sp->top_logprobs = p->n_logprobs;
    sp->ignore_eos = g->ignore_eos;
    uint32_t n = p->n_logit_bias < TY_SAMPLE_MAX_LOGIT_BIAS ? p->n_logit_bias
                                                            : TY_SAMPLE_MAX_LOGIT_BIAS;
    for (uint32_t i = 0; i < n; i++) {
        tycho__v1__logit_bias__init(&bias[i]);
        bias[i].token_id = p->logit_bias[i].id;
        bias[i].bias = p->logit_bias[i].bias;
        bias_ptrs[i] = &bias[i];
    }
    sp->n_logit_bias = n;
    sp->logit_bias = n ? bias_ptrs : NULL;
    sp->n_stop_token_ids = g->n_stop_ids < TY_GEN_MAX_STOP_IDS ? g->n_stop_ids
                                                               : TY_GEN_MAX_STOP_IDS;
    sp->stop_token_ids = sp->n_stop_token_ids ? (uint32_t *)g->stop_ids : NULL;
    sp->min_tokens = g->min_tokens;
    if (g->grammar) {
        sp->grammar_kind = (uint32_t)g->grammar->kind;
        sp->grammar_schema.data = (uint8_t *)(uintptr_t)g->grammar->schema;
        sp->grammar_schema.len = g->grammar->schema ? g->grammar->schema_len : 0;
    }
}

int ty_pb_grammar_unpack(const Tycho__V1__SamplingParams *s, struct ty_gen_grammar *out,
                         char **schema, char *why, size_t cap)
{
    memset(out, 0, sizeof(*out));
    *schema = NULL;
    if (!s || !s->grammar_kind)
        return 0;
    if (s->grammar_kind != TY_GRAMMAR_JSON_OBJECT && s->grammar_kind != TY_GRAMMAR_JSON_SCHEMA)
        return snprintf(why, cap, "grammar_kind %u unknown", s->grammar_kind), TY_EINVAL;
    out->kind = (enum ty_grammar_kind)s->grammar_kind;
    if (s->grammar_kind == TY_GRAMMAR_JSON_SCHEMA) {
        if (!(*schema = malloc(s->grammar_schema.len + 1)))
            return TY_ENOMEM;
        if (s->grammar_schema.len)
            memcpy(*schema, s->grammar_schema.data, s->grammar_schema.len);
        (*schema)[s->grammar_schema.len] = 0;
        out->schema = *schema;
        out->schema_len = s->grammar_schema.len;
    }
    return 0;
}

int ty_pb_ends_unpack(const Tycho__V1__SamplingParams *s, uint32_t V,
                            struct ty_gen_params *g, char *why, size_t cap)
{
    g->n_stop_ids = 0;
    g->min_tokens = 0;
    if (!s)
        return 0;
    if (s->n_stop_token_ids > TY_GEN_MAX_STOP_IDS)
        return snprintf(why, cap, "stop_token_ids has %zu entries (at most %d)",
                        s->n_stop_token_ids, TY_GEN_MAX_STOP_IDS), TY_EINVAL;
    for (size_t i = 0; i < s->n_stop_token_ids; i++) {
        if (s->stop_token_ids[i] >= V)
            return snprintf(why, cap, "stop_token_ids[%zu] = %u outside the vocabulary (%u)", i,
                            s->stop_token_ids[i], V), TY_EINVAL;
        g->stop_ids[i] = s->stop_token_ids[i];
    }
    g->n_stop_ids = (uint32_t)s->n_stop_token_ids;
    g->min_tokens = s->min_tokens;
    g->ignore_eos = s->ignore_eos;
    return 0;
}

int ty_pb_sampling_unpack(const Tycho__V1__SamplingParams *s, uint32_t V,
                                struct ty_sampling_params *o, char *why, size_t cap)
{
    memset(o, 0, sizeof(*o));
    if (!s)
        return 0;
    if (s->top_logprobs > TY_SAMPLE_MAX_LOGPROBS)
        return snprintf(why, cap, "top_logprobs above %d", TY_SAMPLE_MAX_LOGPROBS), TY_EINVAL;
    if (s->n_logit_bias > TY_SAMPLE_MAX_LOGIT_BIAS)
        return snprintf(why, cap, "logit_bias has %zu entries (at most %d)", s->n_logit_bias,
                        TY_SAMPLE_MAX_LOGIT_BIAS), TY_EINVAL;
    for (size_t i = 0; i < s->n_logit_bias; i++) {
        const Tycho__V1__LogitBias *b = s->logit_bias[i];
        if (!b || b->token_id >= V || !isfinite(b->bias))
            return snprintf(why, cap, "logit_bias[%zu]: token %u, bias %g (vocabulary of %u)",
                            i, b ? b->token_id : 0, b ? (double)b->bias : 0.0, V), TY_EINVAL;
        o->logit_bias[i] = (struct ty_logit_bias){b->token_id, b->bias};
    }
    o->n_logit_bias = (uint32_t)s->n_logit_bias;
    o->temperature = s->temperature;
    o->top_k = s->top_k;
    o->top_p = s->top_p;
    o->min_p = s->min_p;
    o->seed = s->seed;
    o->repetition_penalty = s->repetition_penalty;
    o->presence_penalty = s->presence_penalty;
    o->frequency_penalty = s->frequency_penalty;
    o->n_logprobs = s->logprobs ? s->top_logprobs : 0;
    o->logprobs = s->logprobs;
    return 0;
}
