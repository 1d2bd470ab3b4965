/* Capacity studies for `tycho sim --capacity` and `tycho plan`: for each TBT threshold, the
 * effective request capacity (tycho/sim.h) of every disaggregated P:D split of a node budget
 * and of the colocated baseline at every chunk size, searched in parallel; the best of each. */
#ifndef TYCHO_CLI_SIM_CAPACITY_H
#define TYCHO_CLI_SIM_CAPACITY_H

#include "tycho/sim.h"

#include <stdbool.h>
#include <stdio.h>

#define TY_CAP_MAX_LIST 64

struct ty_cap_run {
    size_t tbt;          /* index into the study's tbt_ms */
    bool colocated;
    uint32_t prefill, decode; /* disaggregated split */
    uint32_t chunk;      /* colocated chunk_tokens, or the prefill nodes' prefill_batch_tokens */
    uint64_t cache_blocks;
    struct ty_sim_opts o;
    struct ty_sim_capacity cap;
};

struct ty_cap_study {
    uint32_t nodes;
    double ttft_s;                      /* TTFT SLO of class 0 */
    double tbt_ms[TY_CAP_MAX_LIST];     /* TBT SLOs of class 0 */
    size_t n_tbt;
    uint32_t chunks[TY_CAP_MAX_LIST];   /* colocated chunk sizes */
    size_t n_chunks;
    uint32_t splits[TY_CAP_MAX_LIST][2]; /* disaggregated P:D (0: every split of nodes) */
    size_t n_splits;
    uint32_t prefill_chunks[TY_CAP_MAX_LIST]; /* disaggregated prefill_batch_tokens to try
                                                 (0 entries: the base's; a listed 0: one
                                                 whole prompt per forward call) */
    size_t n_prefill_chunks;
    uint64_t cache_blocks[TY_CAP_MAX_LIST]; /* per node to try (0 entries: the base's) */
    size_t n_cache_blocks;
    bool no_colocated, no_disaggregated;
    struct ty_sim_capacity_opts co;
    int jobs;
    bool quiet;                         /* no progress lines */
    struct ty_cap_run *runs;
    size_t n_runs;
};

/* Build and run every search of the study against trace t (base: the spec's options).
 * Returns 0, or a TY_E* with a message on stderr. */
int ty_cap_study_run(struct ty_cap_study *st, const struct ty_sim_trace *t,
                     const struct ty_sim_opts *base);
void ty_cap_study_fini(struct ty_cap_study *st);
/* The run with the highest capacity for TBT threshold k among colocated or disaggregated
 * runs, NULL if there is none; `second`, when given, gets the runner-up. */
const struct ty_cap_run *ty_cap_best(const struct ty_cap_study *st, size_t k, bool colocated,
                                     const struct ty_cap_run **second);

void ty_cap_print_table(const struct ty_cap_study *st, FILE *f);
void ty_cap_print_json(const struct ty_cap_study *st, const char *trace, FILE *f);
/* Attainment against rate, one PNG per threshold (gnuplot), in dir. */
int ty_cap_plot(const struct ty_cap_study *st, const char *dir);

#endif
