/* sched_bench: time of one scheduling decision (ty_sched_pick) at cluster scale.
 *
 * Replays the conversation trace's requests through a kvcache_centric scheduler with
 * prediction-based admission on N prefill + N decode nodes; after each pick the chosen node
 * "stores" the request's blocks (so the prefix index fills up the way it does live) and the
 * scheduler keeps up to --in-flight requests in flight (the predicted-admission scan).
 * Prints mean / p50 / p99 / max microseconds per decision.
 *
 * usage: sched_bench TRACE [prefill_nodes=32] [decode_nodes=32] [in_flight=2000] */
#include "tycho/clock.h"
#include "tycho/sched.h"
#include "tycho/sim.h"

#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: sched_bench TRACE [prefill] [decode] [in_flight]\n");
        return 2;
    }
    uint32_t np = argc > 2 ? (uint32_t)atoi(argv[2]) : 32;
    uint32_t nd = argc > 3 ? (uint32_t)atoi(argv[3]) : 32;
    size_t keep = argc > 4 ? (size_t)atol(argv[4]) : 2000;
    char err[512];
    struct ty_sim_trace *t;
    if (ty_sim_trace_load(&t, argv[1], err, sizeof(err)) < 0 || np + nd > TY_SCHED_MAX_NODES) {
        fprintf(stderr, "sched_bench: %s\n", err);
        return 1;
    }
    struct ty_sched_opts o;
    ty_sched_opts_default(&o);
    o.slo[0].ttft_us = 30000000;
    o.slo[0].tbt_us = 100000;
    ty_sched_t *s;
    ty_sched_new(&s, &o);
    struct ty_sched_node_desc p = {.role = TY_SCHED_ROLE_PREFILL};
    struct ty_sched_node_desc d = {.role = TY_SCHED_ROLE_DECODE};
    for (uint32_t i = 0; i < np; i++)
        ty_sched_node_add(s, i, &p);
    for (uint32_t i = 0; i < nd; i++)
        ty_sched_node_add(s, np + i, &d);
    double *us = malloc(t->n * sizeof(*us));
    size_t oldest = 0;
    for (size_t i = 0; i < t->n; i++) {
        const struct ty_sim_request *r = &t->reqs[i];
        struct ty_sched_request q = {.id = i, .block_hashes = r->blocks, .n_blocks = r->n_blocks,
                                     .prompt_tokens = r->input_tokens,
                                     .output_tokens = r->output_tokens};
        struct ty_sched_decision dec;
        uint64_t now = r->arrival_us / 100; /* 100x speed: queues stay busy */
        uint64_t t0 = ty_clock_ns();
        ty_sched_pick(s, &q, now, &dec);
        us[i] = (double)(ty_clock_ns() - t0) / 1e3;
        if (dec.reject == TY_SCHED_REJECT_NONE)
            ty_sched_block_stored(s, dec.prefill_node, r->blocks, r->n_blocks);
        while (ty_sched_in_flight(s) > keep && oldest < i)
            ty_sched_request_done(s, oldest++, now);
    }
    double sum = 0;
    for (size_t i = 0; i < t->n; i++)
        sum += us[i];
    qsort(us, t->n, sizeof(*us), cmp);
    printf("nodes %u prefill + %u decode, %zu decisions, index %zu blocks, in flight <= %zu\n",
           np, nd, t->n, ty_sched_index_size(ty_sched_index(s)), keep);
    printf("decision us: mean %.2f p50 %.2f p99 %.2f max %.2f\n", sum / (double)t->n,
           us[t->n / 2], us[t->n * 99 / 100], us[t->n - 1]);
    free(us);
    ty_sched_free(s);
    ty_sim_trace_free(t);
    return 0;
}
