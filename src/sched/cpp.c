/* Chunked pipeline parallelism in the cost model (tycho/sched.h, Mooncake §5.1): the time a
 * prompt takes through a group of prefill nodes each holding a range of layers, and the
 * prompt length from which that beats one node. Pure code, used by the Conductor to choose
 * its threshold and by the simulator to time the requests it pipelines.
 *
 * Chunk j's call on stage s starts when stage s is done with chunk j-1 and chunk j's hidden
 * states have arrived from stage s-1; a hand-over takes the link between the two stages
 * (one at a time) for tokens x hidden_bytes_per_token / net_bytes_per_us. The last stage's
 * end is the prompt's: each stage streams its layers' KV to the decode node as it goes, so
 * only the last chunk's last layers are left to move after it, as for one node. */
#include "tycho/sched.h"

#include <math.h>

#define CPP_MAX_STAGES 64

double ty_sched_cpp_prefill_us(const struct ty_sched_cost *c, const struct ty_sched_cpp *p,
                               uint64_t tokens, uint64_t cached, const double *ready_us)
{
    uint32_t S = p ? p->stages : 1;
    if (S < 2 || !tokens)
        return ty_sched_cost_prefill_us(c, tokens, cached);
    S = S > CPP_MAX_STAGES ? CPP_MAX_STAGES : S;
    if (cached >= tokens)
        cached = tokens - 1; /* the last token is always computed */
    uint64_t chunk = p->chunk_tokens ? p->chunk_tokens : 2048;
    double done[CPP_MAX_STAGES]; /* when stage s finished its previous chunk */
    double link[CPP_MAX_STAGES]; /* when the link from stage s to s + 1 is free again */
    for (uint32_t s = 0; s < S; s++) {
        done[s] = ready_us ? ready_us[s] : 0;
        link[s] = 0;
    }
    for (uint64_t b = cached; b < tokens; b += chunk) {
        uint64_t e = tokens - b < chunk ? tokens : b + chunk;
        double l = (double)e, f = (double)b;
        double work =
            (c->prefill[0] + c->prefill[1] * (l - f) + c->prefill[2] * (l * l - f * f)) / S;
        double hop = c->net_bytes_per_us > 0
                         ? (l - f) * p->hidden_bytes_per_token / c->net_bytes_per_us
                         : 0;
        double in = 0; /* when the chunk's input is at stage s */
        for (uint32_t s = 0; s < S; s++) {
            done[s] = fmax(done[s], in) + work;
            link[s] = fmax(link[s], done[s]) + hop; /* one hand-over at a time per link */
            in = link[s];
        }
    }
    return done[S - 1];
}

uint64_t ty_sched_cpp_threshold(const struct ty_sched_cost *c, const struct ty_sched_cpp *p,
                                uint64_t max_tokens)
{
    if (!p || p->stages < 2)
        return 0;
    uint64_t step = c->block_tokens ? c->block_tokens : 64, from = 0;
    for (uint64_t n = step; n <= max_tokens; n += step) {
        bool wins = ty_sched_cpp_prefill_us(c, p, n, 0, NULL) < ty_sched_cost_prefill_us(c, n, 0);
        if (wins && !from)
            from = n;
        else if (!wins)
            from = 0;
    }
    return from;
}
