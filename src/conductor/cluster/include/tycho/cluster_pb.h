/* Conversions between the cluster's protobuf messages (proto/tycho.proto) and engine types,
 * shared by the prefill node, the decode node and the Conductor. Apart from cluster.h so that
 * its users that never touch a message (config checks, the fuzz targets) need no protobuf. */
#ifndef TYCHO_CLUSTER_PB_H
#define TYCHO_CLUSTER_PB_H

#include "tycho/sampling.h"
#include "tycho.pb-c.h"

#include <stdint.h>

/* A sampled token's logprob and alternatives as a TokenLogprob (KvReady, TokenChunk): `lp`
 * points into the struct's own storage, so the struct must outlive the packing. */
struct ty_cluster_pb_logprob {
    Tycho__V1__TokenLogprob lp;
    Tycho__V1__TopLogprob top[TY_SAMPLE_MAX_LOGPROBS];
    Tycho__V1__TopLogprob *topp[TY_SAMPLE_MAX_LOGPROBS];
};
void ty_cluster_logprob_to_pb(const struct ty_sample *s, struct ty_cluster_pb_logprob *out);
/* The other way: s->logprob and s->top from lp (s->id untouched); alternatives whose id is not
 * below n_vocab are dropped (n_vocab 0: every one kept), at most TY_SAMPLE_MAX_LOGPROBS. */
void ty_cluster_logprob_from_pb(const Tycho__V1__TokenLogprob *lp, uint32_t n_vocab,
                                struct ty_sample *s);

#endif
