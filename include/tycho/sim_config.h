/* Cluster spec files of `tycho sim` (the YAML files in configs/sim/), read through tycho/config.h.
 *
 *   cluster:   prefill_nodes, decode_nodes, profile, cache_blocks_per_node, eviction,
 *              decode_max_batch, decode_kv_tokens
 *   scheduler: policy, admission, kvcache_balancing_threshold, decode_duration, seed,
 *              models: [{name, slo: [{class, ttft, tbt}, ...]}]  SLOs per model and class
 *              (the scheduler's own table, ty_sched_config_table in tycho/sched.h)
 *   cost:      optional override of the profile (prefill: [c0, c1, c2], decode: [...],
 *              kv_bytes_per_token, net_gbytes_per_s, block_tokens)
 *   model:     which entry of scheduler.models the simulated cluster serves
 *   speed:     replay speed
 *   class_mix: share of requests in each SLO class of the model (empty: all in the first)
 *
 * A ty_sim_spec is owned by the caller; load fills it, ty_sim_spec_free releases it. One
 * thread at a time. Errors name file:line:col and the field.
 */
#ifndef TYCHO_SIM_CONFIG_H
#define TYCHO_SIM_CONFIG_H

#include <stdio.h>

#include "tycho/sim.h"

typedef struct ty_sim_spec ty_sim_spec_t;

/* Load `path` (NULL: defaults only) then apply `--section.key=value` overrides (n_args of
 * them). On success *out holds the spec and `opts` is filled from it. Returns 0, TY_ECONFIG,
 * TY_EPARSE or -errno with the one-line message in err. */
int ty_sim_spec_load(ty_sim_spec_t **out, const char *path, char *const *args, size_t n_args,
                     struct ty_sim_opts *opts, char *err, size_t err_len);
void ty_sim_spec_free(ty_sim_spec_t *spec);
/* Write the effective spec as YAML (for --dump-config). */
int ty_sim_spec_dump(const ty_sim_spec_t *spec, FILE *out);
/* Name of the served model and of class `i` (NULL when out of range). */
const char *ty_sim_spec_model(const ty_sim_spec_t *spec);
/* The cluster's cost profile name (cluster.profile). */
const char *ty_sim_spec_profile(const ty_sim_spec_t *spec);
const char *ty_sim_spec_class(const ty_sim_spec_t *spec, uint32_t i);

#endif
