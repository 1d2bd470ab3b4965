/* The control-plane messages (proto/tycho.proto, generated into tycho.pb-c.h) and their
 * conversions to and from engine types (proto/convert.c), shared by the prefill node, the decode
 * node and the Conductor (library ty_proto). Any thread; nothing is kept. */
#ifndef TYCHO_PROTO_H
#define TYCHO_PROTO_H

#include "tycho/engine.h"
#include "tycho/sampling.h"
#include "tycho.pb-c.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* A sampled token's logprob and alternatives as a TokenLogprob (KvReady, TokenChunk): `lp`
 * points into the struct's own storage, so the struct must outlive the packing. */
struct ty_pb_logprob {
    Tycho__V1__TokenLogprob lp;
    Tycho__V1__TopLogprob top[TY_SAMPLE_MAX_LOGPROBS];
    Tycho__V1__TopLogprob *topp[TY_SAMPLE_MAX_LOGPROBS];
};
void ty_pb_logprob_pack(const struct ty_sample *s, struct ty_pb_logprob *out);
/* The other way: s->logprob and s->top from lp (s->id untouched); alternatives whose id is not
 * below n_vocab are dropped (n_vocab 0: every one kept), at most TY_SAMPLE_MAX_LOGPROBS. */
void ty_pb_logprob_unpack(const Tycho__V1__TokenLogprob *lp, uint32_t n_vocab,
                                struct ty_sample *s);

/* Sampling parameters as the control messages carry them (SamplingParams), both ways, so that
 * the Conductor, the prefill and the decode node agree on every field. to_pb points sp's
 * logit_bias at `bias` / `bias_ptrs` (room for TY_SAMPLE_MAX_LOGIT_BIAS entries each, alive
 * while sp is packed). from_pb refuses what a sampler would (a logit_bias token id outside a
 * vocabulary of V tokens, a non-finite bias, more than TY_SAMPLE_MAX_LOGIT_BIAS entries,
 * top_logprobs over TY_SAMPLE_MAX_LOGPROBS): TY_EINVAL with why. max_tokens and ignore_eos
 * are not sampling parameters: the caller takes them from sp itself. */
void ty_pb_sampling_pack(const struct ty_gen_params *g, Tycho__V1__SamplingParams *sp,
                               Tycho__V1__LogitBias *bias, Tycho__V1__LogitBias **bias_ptrs);
int ty_pb_sampling_unpack(const Tycho__V1__SamplingParams *sp, uint32_t V,
                                struct ty_sampling_params *out, char *why, size_t cap);
/* The request's ends from sp: stop tokens (each < V, at most TY_GEN_MAX_STOP_IDS), min_tokens
 * and ignore_eos into g (its other fields untouched). TY_EINVAL with why. */
int ty_pb_ends_unpack(const Tycho__V1__SamplingParams *sp, uint32_t V,
                            struct ty_gen_params *g, char *why, size_t cap);

/* The request's grammar (structured output) from sp: out->kind 0 when it has none; else the
 * schema is copied into *schema (malloc'ed, NUL-terminated: the caller frees it; out points
 * into it). Not compiled here (the batcher compiles it and refuses a bad one). TY_EINVAL (an
 * unknown kind, with why) or TY_ENOMEM. */
int ty_pb_grammar_unpack(const Tycho__V1__SamplingParams *sp, struct ty_gen_grammar *out,
                         char **schema, char *why, size_t cap);

/* A client's request id (the API's x-request-id, PrefillAssign / DecodeAssign
 * client_request_id) as the Conductor and the nodes keep it for their log lines: at most
 * TY_CLIENT_ID_MAX characters (longer ones cut), "-" when there is none. */
#define TY_CLIENT_ID_MAX 64
static inline void ty_client_id_copy(char dst[TY_CLIENT_ID_MAX + 1], const char *src)
{
    snprintf(dst, TY_CLIENT_ID_MAX + 1, "%s", src && *src ? src : "-");
}

#endif
