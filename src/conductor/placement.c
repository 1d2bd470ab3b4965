/* The Conductor's live scheduler (conductor-impl.h; DESIGN.md §6): the same ty_sched_t that
 * `tycho sim` drives, fed here by the real cluster.
 *   - Nodes: a registration adds the node (decode nodes with their batch limit and KV pages),
 *     death or re-registration removes it and its cached blocks.
 *   - Prefix index: each request's full prompt blocks are hashed as the nodes hash them
 *     (tycho/hash.h, the seed from the model and the block size), the chosen prefill node is
 *     credited with them at once (it is about to compute them), and its heartbeats' KV block
 *     events (stored / removed / reset) keep the index true to its page cache.
 *   - Load: a prefill node's queue is the scheduler's own prediction of the work it sent
 *     there, re-based on the work still outstanding whenever a prefill finishes; a decode
 *     node's batch and context come from its heartbeat (running requests, and the context
 *     its latest decode step read).
 *   - Cost model: a starting profile, refitted by non-negative least squares from the timing
 *     samples nodes put in their heartbeats (per-request prefill times, per-step decode
 *     times) over the most recent refit_window samples, those older than refit_max_age
 *     dropped (the newest 8 stay): a model fitted during a burst follows the fresh timings.
 *   - Admission at arrival: a request whose predicted TTFT (or decode TBT, per the admission
 *     mode) breaks its SLO is refused with a reason and a Retry-After, which the API turns
 *     into a 429 (x-should-retry: false instead when the request alone would miss it too).
 *     Idle capacity always admits (ty_sched_opts.admit_when_idle), and a node that sent no
 *     timing sample for probe_interval gets one refused request as a probe: refusals give no
 *     timings, so a model that predicts too high could otherwise never learn it is wrong.
 *     The decode node's own page reservation stays the hard limit, so the
 *     scheduler's decode-stage verdict is only counted (tycho_scheduler_decode_over_slo_total).
 *   - Prefix plans: kvcache_centric may plan a prefill node's prefix from another prefill
 *     node's page cache or from the KV pool (the best single source); the plan goes in the
 *     PrefillAssign (remote.c), and the node's reply says what it reused (ty__place_reused). */
#include "conductor-impl.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/hash.h"
#include "tycho/log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t now_us(void)
{
    return ty_clock_ns() / 1000;
}

/* ---- setup -------------------------------------------------------------------------------- */

static void cpu_cost_of(const ty_model_t *m, struct ty_sched_cost *out)
{
    const struct ty_model_config *mc = ty_model_config(m);
    double dim = mc->dim, kv_dim = (double)mc->n_kv_heads * mc->head_dim;
    double attn = (double)mc->n_heads * mc->head_dim;
    /* a mixture of experts computes its router and the used experts per token */
    double ffns = mc->n_experts ? mc->n_experts_used : 1;
    double per_layer = dim * attn * 2 + dim * kv_dim * 2 + 3.0 * dim * mc->ffn_dim * ffns +
                       dim * mc->n_experts;
    struct ty_sched_model_shape sh = {
        .params = per_layer * mc->n_layers + (double)mc->n_vocab * dim,
        .weight_bytes = (double)ty_model_weight_bytes(m), /* as stored: F32, F16, Q8_0 */
        .layers = mc->n_layers,
        .attn_dim = attn,
        .kv_bytes_per_token = 2.0 * mc->n_layers * kv_dim * sizeof(float)};
    ty_sched_cost_cpu(&sh, 64, out);
}

static int cost_init(const struct ty_conductor_cost_config *cc, const ty_model_t *m,
                     struct ty_sched_cost *cost)
{
    const char *profile = cc && cc->profile ? cc->profile : "auto";
    if (!*profile || !strcmp(profile, "auto")) {
        cpu_cost_of(m, cost);
    } else if (ty_sched_cost_profile(profile, cost) < 0) {
        TY_LOG_ERROR("cluster", "cost.profile: unknown profile '%s' (auto, llama3-70b-8xa800, "
                                "llama3-70b-8xh800)", profile);
        return TY_EINVAL;
    }
    char why[160];
    if (cc && ty_sched_cost_override(cost, cc->prefill, cc->n_prefill, cc->decode, cc->n_decode,
                                     cc->net_gbytes_per_s, why, sizeof(why))) {
        TY_LOG_ERROR("cluster", "%s", why);
        return TY_EINVAL;
    }
    return 0;
}

/* SLOs of the served model: the scheduler.models entry of that name, else the first. */
static void slo_init(const struct ty_sched_config *sc, const char *model,
                     struct ty_sched_opts *o, char names[][64])
{
    if (!sc || !sc->n_models)
        return;
    const struct ty_sched_model_config *mc = &sc->models[0];
    for (uint32_t i = 0; model && i < sc->n_models; i++)
        if (sc->models[i].name && !strcmp(sc->models[i].name, model))
            mc = &sc->models[i];
    if (model && strcmp(mc->name, model))
        TY_LOG_WARN("cluster", "scheduler.models has no entry for '%s': using the SLOs of '%s'",
                    model, mc->name);
    o->n_classes = mc->n_slo ? mc->n_slo : 1;
    for (uint32_t k = 0; k < mc->n_slo && k < TY_SCHED_MAX_CLASSES; k++) {
        o->slo[k].ttft_us = mc->slo[k].ttft_ns / 1000;
        o->slo[k].tbt_us = mc->slo[k].tbt_ns / 1000;
        snprintf(names[k], 64, "%s", mc->slo[k].class_name ? mc->slo[k].class_name : "");
    }
}

uint32_t ty__place_class(const ty_conductor_t *c, const char *name)
{
    const struct ty__place *p = &c->place;
    uint32_t n = ty_sched_opts_get(p->s)->n_classes;
    for (uint32_t k = 0; name && strcmp(name, "auto") && k < n; k++)
        if (!strcmp(p->class_names[k], name))
            return k;
    return 0;
}

int ty__place_class_find(const ty_conductor_t *c, const char *name, uint32_t *k, char *why,
                         size_t cap)
{
    const struct ty__place *p = &c->place;
    uint32_t n = ty_sched_opts_get(p->s)->n_classes;
    for (uint32_t i = 0; name && i < n; i++) {
        if (!strcmp(p->class_names[i], name)) {
            *k = i;
            return 0;
        }
    }
    size_t len = (size_t)snprintf(why, cap, "no SLO class '%s' on this server; its classes: ",
                                  name ? name : "");
    for (uint32_t i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(why + len, cap - len, "%s%s", i ? ", " : "", p->class_names[i]);
    return TY_ENOTFOUND;
}

static void ring_free(struct ty__sample_ring *r)
{
    free(r->v);
    free(r->t);
    free(r->scratch);
    r->v = r->scratch = NULL;
    r->t = NULL;
}

static int ring_init(struct ty__sample_ring *r, uint32_t cap)
{
    r->v = calloc(cap, sizeof(*r->v));
    r->t = calloc(cap, sizeof(*r->t));
    r->scratch = calloc(cap, sizeof(*r->scratch));
    r->cap = cap;
    if (r->v && r->t && r->scratch)
        return 0;
    ring_free(r);
    return TY_ENOMEM;
}

static void ring_push(struct ty__sample_ring *r, double x0, double x1, double us, uint64_t now)
{
    r->v[r->head] = (struct ty_sched_sample){x0, x1, us};
    r->t[r->head] = now;
    r->head = (r->head + 1) % r->cap;
    if (r->len < r->cap)
        r->len++;
    r->fresh++;
    if (r->count)
        ty_metrics_counter_inc(r->count);
}

const char *const ty__prefix_source_names[3] = {"local", "pool", "peer"};

/* Planned vs used prefix blocks per source (ty__place_reused). */
static void plan_metrics_init(struct ty__place *p, ty_metrics_registry_t *reg)
{
    static const char *const src[] = {"source"};
    ty_metrics_family_t *fp, *fu, *fr, *ff;
    if (ty_metrics_counter_new(reg, &fp, "tycho_prefix_planned_blocks_total",
                               "prefix blocks the scheduler planned to reuse, by where they "
                               "come from: the prefill node's own cache (local), the KV pool, "
                               "another prefill node's cache (peer)", src, 1) ||
        ty_metrics_counter_new(reg, &fu, "tycho_prefix_used_blocks_total",
                               "prefix blocks the prefill nodes reused, by source (a plan "
                               "whose fetch failed is computed instead; local may exceed "
                               "the plan)", src, 1) ||
        ty_metrics_gauge_new(reg, &fr, "tycho_prefix_used_ratio",
                             "used / planned prefix blocks so far, by source", src, 1) ||
        ty_metrics_counter_new(reg, &ff, "tycho_prefix_fetch_failed_blocks_total",
                               "planned remote prefix blocks that did not arrive (computed "
                               "instead)", NULL, 0))
        return;
    for (int k = 0; k < 3; k++) {
        const char *v = ty__prefix_source_names[k];
        ty_metrics_child_get(fp, &v, &p->m_plan[k]);
        ty_metrics_child_get(fu, &v, &p->m_used[k]);
        ty_metrics_child_get(fr, &v, &p->m_ratio[k]);
    }
    ty_metrics_child_get(ff, NULL, &p->m_failed);
}

static void metrics_init(struct ty__place *p, ty_metrics_registry_t *reg)
{
    static const char *const result[] = {"class", "result"}, *const kind[] = {"stage"};
    static const char *const coef[] = {"stage", "term"};
    ty_metrics_family_t *f;
    if (!reg)
        return;
    static const char *const cls[] = {"class"}, *const slo3[] = {"class", "slo", "result"};
    static const double lat_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1,     2.5,  5,     10,   30,  60};
    size_t nb = sizeof(lat_bounds) / sizeof(lat_bounds[0]);
    if (ty_metrics_counter_new(reg, &p->class_fam[0], "tycho_scheduler_decisions_total",
                               "requests the scheduler placed (accepted) or refused, by SLO "
                               "class and reason", result, 2))
        p->class_fam[0] = NULL;
    if (ty_metrics_histogram_new(reg, &p->class_fam[1], "tycho_request_ttft_seconds",
                                 "time to first token at the Conductor, by SLO class (requests "
                                 "that finished)", cls, 1, lat_bounds, nb))
        p->class_fam[1] = NULL;
    if (ty_metrics_histogram_new(reg, &p->class_fam[2], "tycho_request_tbt_seconds",
                                 "mean time between tokens of a request at the Conductor, by "
                                 "SLO class", cls, 1, lat_bounds, nb))
        p->class_fam[2] = NULL;
    if (ty_metrics_counter_new(reg, &p->class_fam[3], "tycho_slo_requests_total",
                               "finished requests whose class has an SLO: met or missed",
                               slo3, 3))
        p->class_fam[3] = NULL;
    if (!ty_metrics_counter_new(reg, &f, "tycho_scheduler_prompt_blocks_total",
                                "full prompt blocks of placed requests", NULL, 0))
        ty_metrics_child_get(f, NULL, &p->prompt_blocks);
    if (!ty_metrics_counter_new(reg, &f, "tycho_scheduler_cached_blocks_total",
                                "of those, blocks cached on the chosen prefill node", NULL, 0))
        ty_metrics_child_get(f, NULL, &p->cached_blocks);
    if (!ty_metrics_gauge_new(reg, &f, "tycho_scheduler_index_blocks",
                              "distinct block hashes in the prefix index", NULL, 0))
        ty_metrics_child_get(f, NULL, &p->index_blocks);
    if (!ty_metrics_counter_new(reg, &f, "tycho_scheduler_decode_over_slo_total",
                                "requests whose decode node was over the TBT SLO or full when "
                                "their KV landed (they still run)", NULL, 0))
        ty_metrics_child_get(f, NULL, &p->decode_over_slo);
    if (!ty_metrics_counter_new(reg, &f, "tycho_scheduler_admitted_over_slo_total",
                                "requests admitted although predicted over the TTFT or TBT "
                                "SLO: alone on idle nodes, or a probe of a stale cost model "
                                "(served best-effort)", NULL, 0))
        ty_metrics_child_get(f, NULL, &p->over_slo);
    if (!ty_metrics_counter_new(reg, &f, "tycho_scheduler_probes_total",
                                "requests admission would have refused, let through because "
                                "the node judged had sent no timing sample for "
                                "cost.probe_interval (by the stage whose model refused)",
                                kind, 1)) {
        const char *pre = "prefill", *dec = "decode";
        ty_metrics_child_get(f, &pre, &p->probes[0]);
        ty_metrics_child_get(f, &dec, &p->probes[1]);
    }
    plan_metrics_init(p, reg);
    static const char *const slo1[] = {"slo"};
    static const double ratio_bounds[] = {0.01, 0.03, 0.1, 0.3, 0.5, 0.8, 1.25,
                                          2,    3.3,  10,  30,  100};
    if (!ty_metrics_histogram_new(reg, &f, "tycho_scheduler_prediction_ratio",
                                  "predicted / measured per finished request: TTFT (placement "
                                  "to first token) and mean TBT; 1 is exact, (0.8, 1.25] close",
                                  slo1, 1, ratio_bounds,
                                  sizeof(ratio_bounds) / sizeof(ratio_bounds[0])))
        for (int k = 0; k < 2; k++) {
            const char *v = k ? "tbt" : "ttft";
            ty_metrics_child_get(f, &v, &p->ratio_hist[k]);
        }
    if (!ty_metrics_counter_new(reg, &f, "tycho_scheduler_cost_samples_total",
                                "timing samples received from the nodes", kind, 1)) {
        const char *pre = "prefill", *dec = "decode";
        ty_metrics_child_get(f, &pre, &p->prefill.count);
        ty_metrics_child_get(f, &dec, &p->decode.count);
    }
    if (!ty_metrics_gauge_new(reg, &f, "tycho_scheduler_cost_coefficient",
                              "cost model in use: prefill us = c0 + c1 (L-P) + c2 (L^2-P^2), "
                              "decode step us = d0 + d1 B + d2 C", coef, 2))
        for (int st = 0; st < 2; st++)
            for (int t = 0; t < 3; t++) {
                char term[2] = {(char)('0' + t), 0};
                const char *v[2] = {st ? "decode" : "prefill", term};
                ty_metrics_child_get(f, v, &p->coef[st][t]);
            }
    static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5,
                                         1,     2.5,   5,    10,   30,  60};
    if (!ty_metrics_histogram_new(reg, &f, "tycho_scheduler_predicted_ttft_seconds",
                                  "TTFT the scheduler predicted for the requests it placed", NULL,
                                  0, ttft_bounds, sizeof(ttft_bounds) / sizeof(ttft_bounds[0])))
        ty_metrics_child_get(f, NULL, &p->predicted_ttft);
    if (!ty_metrics_gauge_new(reg, &f, "tycho_scheduler_ttft_overhead_seconds",
                              "time to first token beyond queue, KV fetch and prefill, learned "
                              "from measured TTFTs and added to every prediction", NULL, 0))
        ty_metrics_child_get(f, NULL, &p->ttft_overhead);
    static const char *const slo_labels[] = {"class", "slo"};
    if (ty_metrics_gauge_new(reg, &p->class_fam[4], "tycho_scheduler_slo_seconds",
                             "SLO in force per class (0: none); changes on a SIGHUP reload",
                             slo_labels, 2))
        p->class_fam[4] = NULL;
}

static void class_metrics_get(struct ty__place *p, const char *name, struct ty__class_metrics *m)
{
    for (int r = 0; p->class_fam[0] && r <= TY_SCHED_REJECT_NO_NODE; r++) {
        const char *v[2] = {name, r ? ty_sched_reject_name((enum ty_sched_reject)r) : "accepted"};
        ty_metrics_child_get(p->class_fam[0], v, &m->decisions[r]);
    }
    if (p->class_fam[1])
        ty_metrics_child_get(p->class_fam[1], &name, &m->ttft);
    if (p->class_fam[2])
        ty_metrics_child_get(p->class_fam[2], &name, &m->tbt);
    static const char *const kind[2] = {"ttft", "tbt"}, *const res[2] = {"met", "missed"};
    for (int k = 0; p->class_fam[3] && k < 2; k++)
        for (int j = 0; j < 2; j++) {
            const char *v[3] = {name, kind[k], res[j]};
            ty_metrics_child_get(p->class_fam[3], v, &m->slo[k][j]);
        }
    for (int k = 0; p->class_fam[4] && k < 2; k++) {
        const char *v[2] = {name, kind[k]};
        ty_metrics_child_get(p->class_fam[4], v, &m->slo_s[k]);
    }
}

static void class_metrics_remove(struct ty__class_metrics *m)
{
    ty_metrics_child_t **all = (ty_metrics_child_t **)m;
    for (size_t i = 0; i < sizeof(*m) / sizeof(*all); i++)
        ty_metrics_child_remove(all[i]);
    memset(m, 0, sizeof(*m));
}

/* The per-class series of the classes now in p->class_names: a class that kept its name
 * across a reload keeps its series (counters do not restart), the series of a class gone
 * leave the output, a new class starts from zero. `old` / `n_old`: the names before. */
static void class_metrics_bind(struct ty__place *p, char old[][64], uint32_t n_old)
{
    struct ty__class_metrics prev[TY_SCHED_MAX_CLASSES];
    memcpy(prev, p->cm, sizeof(prev));
    memset(p->cm, 0, sizeof(p->cm));
    uint32_t n = ty_sched_opts_get(p->s)->n_classes;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t j = 0;
        while (j < n_old && strcmp(old[j], p->class_names[k]))
            j++;
        if (j < n_old) { /* same name: the same series */
            p->cm[k] = prev[j];
            memset(&prev[j], 0, sizeof(prev[j]));
        } else {
            class_metrics_get(p, p->class_names[k], &p->cm[k]);
        }
    }
    for (uint32_t j = 0; j < TY_SCHED_MAX_CLASSES; j++)
        class_metrics_remove(&prev[j]);
    const struct ty_sched_opts *so = ty_sched_opts_get(p->s);
    for (uint32_t k = 0; k < n; k++) {
        if (p->cm[k].slo_s[0])
            ty_metrics_gauge_set(p->cm[k].slo_s[0], so->slo[k].ttft_us / 1e6);
        if (p->cm[k].slo_s[1])
            ty_metrics_gauge_set(p->cm[k].slo_s[1], so->slo[k].tbt_us / 1e6);
    }
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The TTFT overhead from the observations kept: what neither the queue, the KV fetch nor the
 * prefill (under the cost model in use now, which refits change) explains. Their median: an
 * unbiased prediction is what admission compares with the SLO, and the part varies (a first
 * token waits for the decode node's step in progress). Within [0, 10 s]; called after every
 * 8 observations and after each refit. */
static void overhead_update(struct ty__place *p)
{
    enum { CAP = sizeof(p->ttft_obs) / sizeof(p->ttft_obs[0]) };
    if (p->n_obs < 8)
        return;
    const struct ty_sched_cost *cost = &ty_sched_opts_get(p->s)->cost;
    double v[CAP];
    for (uint32_t i = 0; i < p->n_obs; i++) {
        const struct ty__ttft_obs *o = &p->ttft_obs[i];
        v[i] = o->measured_us - o->wait_us - ty_sched_cost_prefill_us(cost, o->prompt, o->cached);
    }
    qsort(v, p->n_obs, sizeof(v[0]), cmp_dbl);
    double o = v[p->n_obs / 2];
    o = o < 0 ? 0 : o > 10e6 ? 10e6 : o;
    if (!ty_sched_set_ttft_overhead(p->s, o) && p->ttft_overhead)
        ty_metrics_gauge_set(p->ttft_overhead, o / 1e6);
}

static void overhead_observe(struct ty__place *p, const struct ty__creq *r)
{
    enum { CAP = sizeof(p->ttft_obs) / sizeof(p->ttft_obs[0]) };
    p->ttft_obs[p->head_obs] = (struct ty__ttft_obs){
        (double)(r->t_first_us - r->placed_at_us), r->predicted_wait_us, r->n_prompt,
        r->predicted_cached};
    p->head_obs = (p->head_obs + 1) % CAP;
    if (p->n_obs < CAP)
        p->n_obs++;
    if (++p->fresh_obs >= 8) {
        p->fresh_obs = 0;
        overhead_update(p);
    }
}

/* One finished request's predicted / measured TTFT (k 0) or TBT (k 1): how far off the
 * model that admitted it was (a model refitted in a burst, a starting profile). */
static void ratio_observe(struct ty__place *p, int k, double predicted_us, double measured_us)
{
    enum { CAP = sizeof(p->ratio[0].v) / sizeof(p->ratio[0].v[0]) };
    if (!(predicted_us > 0) || !(measured_us > 0))
        return;
    struct ty__ratio_ring *g = &p->ratio[k];
    double q = predicted_us / measured_us;
    g->v[g->head] = q;
    g->head = (g->head + 1) % CAP;
    if (g->n < CAP)
        g->n++;
    g->count++;
    if (p->ratio_hist[k])
        ty_metrics_histogram_observe(p->ratio_hist[k], q);
}

double ty__place_ratio_median(const struct ty__place *p, int k)
{
    const struct ty__ratio_ring *g = &p->ratio[k];
    double v[sizeof(g->v) / sizeof(g->v[0])];
    if (!g->n)
        return NAN;
    memcpy(v, g->v, g->n * sizeof(v[0]));
    qsort(v, g->n, sizeof(v[0]), cmp_dbl);
    return g->n % 2 ? v[g->n / 2] : (v[g->n / 2 - 1] + v[g->n / 2]) / 2;
}

void ty__place_observe(ty_conductor_t *c, const struct ty__creq *r)
{
    struct ty__place *p = &c->place;
    const struct ty_sched_opts *so = ty_sched_opts_get(p->s);
    if (!r->n_out || !r->t_first_us)
        return; /* no token came */
    if (r->placed_at_us && p->refit) /* a fixed cost model (refit: false) stays as given */
        overhead_observe(p, r);
    /* the prediction was made at placement (not at arrival: a request may have waited for
     * the first nodes) */
    if (r->placed_at_us && r->t_first_us > r->placed_at_us)
        ratio_observe(p, 0, r->predicted_ttft_us, (double)(r->t_first_us - r->placed_at_us));
    if (r->n_out >= 2 && r->t_last_us > r->t_first_us)
        ratio_observe(p, 1, r->predicted_tbt_us,
                      (double)(r->t_last_us - r->t_first_us) / (r->n_out - 1));
    if (r->priority >= so->n_classes)
        return; /* its class was reloaded away */
    struct ty__class_metrics *m = &p->cm[r->priority];
    double ttft = (double)(r->t_first_us - r->t_arrive_us) / 1e6;
    if (m->ttft)
        ty_metrics_histogram_observe(m->ttft, ttft);
    if (so->slo[r->priority].ttft_us && m->slo[0][0])
        ty_metrics_counter_inc(m->slo[0][ttft * 1e6 > (double)so->slo[r->priority].ttft_us]);
    if (r->n_out < 2)
        return;
    double tbt = (double)(r->t_last_us - r->t_first_us) / 1e6 / (r->n_out - 1);
    if (m->tbt)
        ty_metrics_histogram_observe(m->tbt, tbt);
    if (so->slo[r->priority].tbt_us && m->slo[1][0])
        ty_metrics_counter_inc(m->slo[1][tbt * 1e6 > (double)so->slo[r->priority].tbt_us]);
}

/* The settings of `sc` an operator tunes live, into so (policy, admission, threshold, the
 * classes and SLOs of this Conductor's model, their names into names). */
static void tuned_init(const struct ty_sched_config *sc, const char *model,
                       struct ty_sched_opts *so, char names[][64])
{
    if (sc) {
        so->policy = (enum ty_sched_policy)sc->policy;
        so->admission = (enum ty_sched_admission)sc->admission;
        so->balancing_threshold = sc->kvcache_balancing_threshold;
        so->local_prefix_only = sc->local_prefix_only;
    }
    so->n_classes = 1;
    memset(so->slo, 0, sizeof(so->slo));
    snprintf(names[0], 64, "default");
    slo_init(sc, model, so, names);
}

/* Two classes of one name could never be told apart (by slo_class, a key or the metrics). */
static int classes_unique(char names[][64], uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(names[i], names[j])) {
                TY_LOG_ERROR("cluster", "scheduler.models: SLO class '%s' appears twice",
                             names[i]);
                return TY_EINVAL;
            }
    return 0;
}

static void log_tuned(const struct ty__place *p)
{
    const struct ty_sched_opts *so = ty_sched_opts_get(p->s);
    char buf[640];
    size_t len = 0;
    for (uint32_t k = 0; k < so->n_classes && len < sizeof(buf); k++)
        len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%s%s: TTFT %.3f s, TBT %.3f s",
                                k ? "; " : "", p->class_names[k], so->slo[k].ttft_us / 1e6,
                                so->slo[k].tbt_us / 1e6);
    TY_LOG_INFO("cluster", "scheduler: policy %s, admission %s, balancing threshold %g%s; %s",
                ty_sched_policy_name(so->policy), ty_sched_admission_name(so->admission),
                so->balancing_threshold, so->local_prefix_only ? ", local prefixes only" : "",
                buf);
}

int ty_conductor_reload_sched(ty_conductor_t *c, const struct ty_sched_config *sc)
{
    struct ty__place *p = &c->place;
    struct ty_sched_opts so = *ty_sched_opts_get(p->s);
    uint32_t n_old = so.n_classes;
    char names[TY_SCHED_MAX_CLASSES][64] = {{0}};
    tuned_init(sc, p->model_name[0] ? p->model_name : NULL, &so, names);
    int rc = classes_unique(names, so.n_classes);
    if (!rc)
        rc = ty_sched_set_policy(p->s, &so);
    if (rc) {
        TY_LOG_ERROR("cluster", "scheduler settings refused, keeping the running ones: %s",
                     ty_strerror(rc));
        return rc;
    }
    char old[TY_SCHED_MAX_CLASSES][64];
    memcpy(old, p->class_names, sizeof(old));
    memcpy(p->class_names, names, sizeof(names));
    class_metrics_bind(p, old, n_old);
    log_tuned(p);
    return 0;
}

static void index_gauge(struct ty__place *p)
{
    if (p->index_blocks)
        ty_metrics_gauge_set(p->index_blocks, (double)ty_sched_index_size(ty_sched_index(p->s)));
}

static void coef_publish(struct ty__place *p)
{
    const struct ty_sched_cost *c = &ty_sched_opts_get(p->s)->cost;
    for (int t = 0; t < 3; t++) {
        if (p->coef[0][t])
            ty_metrics_gauge_set(p->coef[0][t], c->prefill[t]);
        if (p->coef[1][t])
            ty_metrics_gauge_set(p->coef[1][t], c->decode[t]);
    }
}

int ty__place_init(ty_conductor_t *c, const struct ty_conductor_opts *o)
{
    struct ty__place *p = &c->place;
    struct ty_sched_opts so;
    ty_sched_opts_default(&so);
    /* prefill nodes fetch a planned prefix from each other's page caches and, with a pool
     * (indexed under TY__POOL_NODE), from the pool: the best single source wins (unless
     * scheduler.local_prefix_only, tuned_init) */
    so.local_prefix_only = false;
    so.has_remote_node = true;
    so.remote_node = TY__POOL_NODE;
    so.admit_when_idle = true;
    so.decode_check_advisory = true;
    const struct ty_sched_config *sc = o->sched;
    if (sc) {
        if (sc->decode_duration_ns)
            so.decode_duration_us = sc->decode_duration_ns / 1000;
        so.seed = sc->seed ? sc->seed : 1;
    }
    snprintf(p->model_name, sizeof(p->model_name), "%s", o->model_name ? o->model_name : "");
    tuned_init(sc, o->model_name, &so, p->class_names);
    int rc = classes_unique(p->class_names, so.n_classes);
    if (!rc)
        rc = cost_init(o->cost, o->model, &so.cost);
    if (rc)
        return rc;
    p->refit = o->cost ? o->cost->refit : true;
    /* without a config (tests, embedders): the table's defaults, 10 s and 5 s */
    p->max_age_us = o->cost ? o->cost->refit_max_age_ns / 1000 : 10000000;
    p->probe_us = o->cost ? o->cost->probe_interval_ns / 1000 : 5000000;
    p->retry_after_only = o->retry_after_only;
    /* the auto profile assumed f32 KV: rescaled to the nodes' type when they register */
    p->cost_auto = !o->cost || !o->cost->profile || !*o->cost->profile ||
                   !strcmp(o->cost->profile, "auto");
    uint32_t window = o->cost && o->cost->refit_window ? o->cost->refit_window : 256;
    p->expected_output = o->expected_output_tokens ? o->expected_output_tokens : 256;
    if ((rc = ring_init(&p->prefill, window)) || (rc = ring_init(&p->decode, window)) ||
        (rc = ty_sched_new(&p->s, &so))) {
        ring_free(&p->prefill);
        ring_free(&p->decode);
        return rc;
    }
    metrics_init(p, o->metrics);
    coef_publish(p);
    class_metrics_bind(p, NULL, 0);
    log_tuned(p);
    if (o->kv_pool_master && (rc = ty__pool_start(c, o->kv_pool_master, o->metrics))) {
        TY_LOG_ERROR("cluster", "KV pool client (master %s): %s", o->kv_pool_master,
                     ty_strerror(rc));
        ty_sched_free(p->s);
        ring_free(&p->prefill);
        ring_free(&p->decode);
        return rc;
    }
    TY_LOG_INFO("cluster", "scheduler: %s placement, %s admission, TTFT SLO %.0f ms, TBT SLO "
                           "%.0f ms (0: none), cost model %s%s",
                ty_sched_policy_name(so.policy), ty_sched_admission_name(so.admission),
                so.slo[0].ttft_us / 1e3, so.slo[0].tbt_us / 1e3,
                o->cost && o->cost->profile ? o->cost->profile : "auto",
                p->refit ? " (refitted from measured timings)" : "");
    return 0;
}

void ty__place_fini(ty_conductor_t *c)
{
    struct ty__place *p = &c->place;
    ty__pool_stop(c);
    ty_sched_free(p->s);
    ring_free(&p->prefill);
    ring_free(&p->decode);
    free(p->hashes);
    memset(p, 0, sizeof(*p));
}

/* ---- nodes -------------------------------------------------------------------------------- */

static bool is_prefill(const struct ty__cnode *n)
{
    return n->info.role == TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL;
}

/* "f16, 16-token pages, 2 layers x 4 KV heads x 8 dims": what a page holds. */
static void layout_desc(const struct ty__cnode *n, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s, %u-token pages, %u layers x %u KV heads x %u dims",
             n->kv_dtype[0] ? n->kv_dtype : "f32", n->block_tokens, n->n_layers, n->n_kv_heads,
             n->head_dim);
}

/* KV pages move between nodes as bytes and prefix hashes name the element type and the page
 * size: every node up has one KV layout. The first node that differs from one that is up is
 * refused, naming both layouts (a cluster whose nodes all left may take another layout). */
static int layout_check(ty_conductor_t *c, const struct ty__cnode *n, char *why, size_t cap)
{
    for (size_t i = 0; i < c->n_nodes; i++) {
        const struct ty__cnode *o = c->nodes[i];
        if (o == n || !o->in_sched)
            continue;
        const char *what = strcmp(n->kv_dtype, o->kv_dtype) ? "kv_cache_dtype"
                           : n->block_tokens != o->block_tokens ? "kv_block_tokens"
                           : n->n_layers != o->n_layers || n->n_kv_heads != o->n_kv_heads ||
                                   n->head_dim != o->head_dim
                               ? "model geometry"
                               : NULL;
        if (!what)
            continue;
        char a[128], b[128];
        layout_desc(n, a, sizeof(a));
        layout_desc(o, b, sizeof(b));
        if (!strcmp(what, "kv_cache_dtype"))
            snprintf(why, cap, "kv_cache_dtype %s differs from node %s's %s: KV layout %s, "
                     "theirs %s", n->kv_dtype, o->info.id, o->kv_dtype, a, b);
        else if (!strcmp(what, "kv_block_tokens"))
            snprintf(why, cap, "kv_block_tokens %u differs from node %s's %u: KV layout %s, "
                     "theirs %s", n->block_tokens, o->info.id, o->block_tokens, a, b);
        else
            snprintf(why, cap, "KV layout %s differs from node %s's %s", a, o->info.id, b);
        return TY_EINVAL;
    }
    return 0;
}

int ty__place_node_up(ty_conductor_t *c, struct ty__cnode *n, char *why, size_t cap)
{
    struct ty__place *p = &c->place;
    int rc = layout_check(c, n, why, cap);
    if (rc)
        return rc;
    if (strcmp(n->kv_dtype, p->kv_dtype)) { /* the first node up, or all others left */
        enum ty_kv_dtype was = TY_KV_F32, now = TY_KV_F32; /* "" before the first node: f32 */
        ty_kv_dtype_parse(p->kv_dtype, &was);
        ty_kv_dtype_parse(n->kv_dtype, &now);
        if (p->cost_auto && was != now) { /* KV bytes moved and read per token */
            struct ty_sched_cost cost = ty_sched_opts_get(p->s)->cost;
            double f = (double)ty_kv_dtype_size(now) / (double)ty_kv_dtype_size(was);
            cost.kv_bytes_per_token *= f;
            cost.decode[2] *= f;
            ty_sched_set_cost(p->s, &cost);
        }
        snprintf(p->kv_dtype, sizeof(p->kv_dtype), "%s", n->kv_dtype);
        p->block_tokens = 0; /* the seed below depends on it */
    }
    if (is_prefill(n) && n->block_tokens != p->block_tokens) { /* hashes depend on it */
        p->block_tokens = n->block_tokens;
        p->hash_seed = ty_hash_prefix_seed(ty_model_desc(c->o.model), p->kv_dtype,
                                           p->block_tokens, NULL);
        struct ty_sched_cost cost = ty_sched_opts_get(p->s)->cost;
        cost.block_tokens = p->block_tokens;
        ty_sched_set_cost(p->s, &cost);
    }
    struct ty_sched_node_desc d = {.role = is_prefill(n) ? TY_SCHED_ROLE_PREFILL
                                                         : TY_SCHED_ROLE_DECODE};
    if (!is_prefill(n)) {
        d.max_batch = n->max_batch;
        d.kv_capacity_tokens = n->kv_pages * n->block_tokens;
    } else {
        d.batch_prompts = n->max_batch_prompts;
        d.batch_tokens = n->max_batch;
        d.interleaves = n->interleaves;
    }
    if (n->in_sched)
        ty__place_node_down(c, n);
    rc = ty_sched_node_add(p->s, n->slot, &d);
    if (rc) {
        snprintf(why, cap, "scheduler: %s", ty_strerror(rc));
        return rc;
    }
    n->in_sched = true;
    n->last_sample_us = now_us(); /* a probe is due only after probe_interval of silence */
    n->last_probe_us = 0;
    return 0;
}

void ty__place_node_down(ty_conductor_t *c, struct ty__cnode *n)
{
    if (!n->in_sched)
        return;
    ty_sched_node_remove(c->place.s, n->slot);
    n->in_sched = false;
    index_gauge(&c->place);
}

/* ---- heartbeats --------------------------------------------------------------------------- */

/* Samples older than max_age_us leave the ring, oldest first, while more than 8 stay (a fit
 * needs them: under a light load the newest 8 are the evidence there is, however old).
 * Returns how many left. */
static uint32_t ring_expire(struct ty__sample_ring *r, uint64_t now, uint64_t max_age_us)
{
    uint32_t gone = 0;
    while (max_age_us && r->len > 8) {
        uint32_t oldest = (r->head + r->cap - r->len) % r->cap;
        if (r->t[oldest] + max_age_us >= now)
            break;
        r->len--;
        gone++;
    }
    return gone;
}

/* The ring's samples in one piece (the ring itself when they do not wrap around). */
static const struct ty_sched_sample *ring_live(struct ty__sample_ring *r)
{
    uint32_t oldest = (r->head + r->cap - r->len) % r->cap;
    if (oldest + r->len <= r->cap)
        return r->v + oldest;
    uint32_t first = r->cap - oldest;
    memcpy(r->scratch, r->v + oldest, first * sizeof(*r->v));
    memcpy(r->scratch + first, r->v, (r->len - first) * sizeof(*r->v));
    return r->scratch;
}

/* The rule (docs/arch/sched.md, "In the live Conductor"): a fit uses the samples of the last
 * refit_max_age (at least the newest 8) among the newest refit_window. After a burst the
 * samples it left describe a machine under a load that is gone; kept, they would outvote
 * the few samples a quiet cluster gives (the robust fit even trims those as outliers), and
 * the model would go on predicting burst timings. */
static void refit(struct ty__place *p, struct ty__sample_ring *r, bool prefill, uint64_t now)
{
    if (!p->refit)
        return;
    uint32_t expired = ring_expire(r, now, p->max_age_us);
    /* refit once enough new evidence came in: every 16 samples, at once while few, and at
     * once when stale ones just left (the model must stop reflecting them) */
    if (r->len < 8 || (r->fresh < 16 && r->len > 16 && !expired))
        return;
    r->fresh = 0;
    struct ty_sched_cost cost = ty_sched_opts_get(p->s)->cost;
    const struct ty_sched_sample *v = ring_live(r);
    int rc = prefill ? ty_sched_cost_refit_prefill(&cost, v, r->len)
                     : ty_sched_cost_refit_decode(&cost, v, r->len);
    if (rc == 0 && ty_sched_set_cost(p->s, &cost) == 0) {
        const double *k = prefill ? cost.prefill : cost.decode;
        TY_LOG_DEBUG("cluster", "%s cost refitted from %u samples: %.1f us + %.4g us/token + "
                                "%.4g us/token^2",
                     prefill ? "prefill" : "decode", r->len, k[0], k[1], k[2]);
        coef_publish(p);
        if (prefill)
            overhead_update(p); /* the prefill part of the observed TTFTs changed */
    }
}

static void take_samples(struct ty__place *p, struct ty__cnode *node,
                         Tycho__V1__TimingSample **s, size_t n, bool prefill)
{
    struct ty__sample_ring *r = prefill ? &p->prefill : &p->decode;
    uint64_t now = now_us(), before = r->fresh;
    if (n > TY_NODE_MAX_TIMINGS) /* what an agent sends; more would let one node flood */
        n = TY_NODE_MAX_TIMINGS;
    for (size_t i = 0; i < n; i++) {
        const Tycho__V1__TimingSample *t = s[i];
        if (!t || !t->duration_us || t->duration_us > 3600ull * 1000000)
            continue; /* nothing measured, or nonsense */
        double all = (double)t->n_tokens + t->prefix_tokens;
        if (prefill && t->attn_work) { /* one call: the sums over its prompts */
            /* sum (L-P)(L+P) is at least the tokens computed, at most (sum L)^2 */
            if ((double)t->attn_work < t->n_tokens || (double)t->attn_work > all * all)
                continue;
            ring_push(r, t->n_tokens, (double)t->attn_work, (double)t->duration_us, now);
        }
        else if (prefill && t->batch_size <= 1) { /* one prompt: L = computed + cached */
            double pc = t->prefix_tokens;
            ring_push(r, t->n_tokens, all * all - pc * pc, (double)t->duration_us, now);
        } else if (!prefill && t->batch_size)
            ring_push(r, t->batch_size, t->prefix_tokens, (double)t->duration_us, now);
    }
    if (r->fresh != before) /* fresh evidence of this node's speed: no probe due there */
        node->last_sample_us = now;
    if (n)
        refit(p, r, prefill, now);
}

void ty__place_heartbeat(ty_conductor_t *c, struct ty__cnode *n, const Tycho__V1__Heartbeat *m)
{
    struct ty__place *p = &c->place;
    if (!n->in_sched)
        return;
    if (!is_prefill(n) && m->load) {
        /* the batch's context is what its latest step read (the node's used pages also hold
         * the reservations of requests still in prefill, which the scheduler counts itself
         * as pending): scaled to the running count now; nothing running, nothing read */
        uint32_t running = m->load->running_requests;
        const Tycho__V1__TimingSample *last =
            m->n_decode_timings ? m->decode_timings[m->n_decode_timings - 1] : NULL;
        if (!running)
            n->decode_ctx = 0;
        else if (last && last->batch_size)
            n->decode_ctx = (uint64_t)((double)last->prefix_tokens * running / last->batch_size);
        ty_sched_node_set_decode_load(p->s, n->slot, running, n->decode_ctx);
    }
    const Tycho__V1__KvBlockEvents *ev = m->kv_events;
    if (ev && is_prefill(n)) {
        if (ev->reset) {
            ty_sched_blocks_reset(p->s, n->slot);
            n->index_est = 0;
        }
        if (ev->n_removed)
            ty_sched_block_removed(p->s, n->slot, ev->removed, ev->n_removed);
        n->index_est -= n->index_est > ev->n_removed ? ev->n_removed : n->index_est;
        n->index_est += ev->n_stored;
        if (n->kv_pages && n->index_est > 2 * n->kv_pages) {
            /* more blocks than its pages can hold: a confused node; forget its blocks (they
             * come back with its next reset) rather than grow without bound */
            TY_LOG_WARN("cluster", "node %s reports %llu cached blocks for %llu pages: "
                                   "dropping its prefix index entries", n->info.id,
                        (unsigned long long)n->index_est, (unsigned long long)n->kv_pages);
            ty_sched_blocks_reset(p->s, n->slot);
            n->index_est = 0;
        } else if (ev->n_stored) {
            ty_sched_block_stored(p->s, n->slot, ev->stored, ev->n_stored);
        }
        index_gauge(p);
    }
    /* each kind from its own role only: a node cannot skew the other stage's model */
    if (is_prefill(n))
        take_samples(p, n, m->prefill_timings, m->n_prefill_timings, true);
    else
        take_samples(p, n, m->decode_timings, m->n_decode_timings, false);
}

/* ---- requests ----------------------------------------------------------------------------- */

/* The 429 of a refusal: its code, a message saying why and whether retrying can help, and
 * either Retry-After (the load is the cause: when it should have eased) or, when the request
 * alone on idle nodes would miss the SLO too (d->never_fits), no_retry: the OpenAI SDKs retry
 * a 429 twice unless told `x-should-retry: false`, tripling the load for nothing. ctx: the
 * request's prompt + expected output tokens. */
static void reject_fill(const struct ty__place *p, const struct ty_sched_decision *d,
                        uint32_t priority, uint64_t ctx, struct ty_serve_reject *rej)
{
    const struct ty_sched_slo *slo = &ty_sched_opts_get(p->s)->slo[priority];
    double retry_s = 1;
    bool never = d->never_fits;
    switch (d->reject) {
    case TY_SCHED_REJECT_TTFT:
        snprintf(rej->code, sizeof(rej->code), "ttft_slo");
        if (never)
            snprintf(rej->message, sizeof(rej->message),
                     "predicted time to first token %.0f ms exceeds the SLO of %.0f ms, and "
                     "this prompt alone (%.0f ms) would exceed it on an idle node: retrying "
                     "will not help (a shorter prompt or a laxer class may)",
                     d->ttft_us / 1e3, slo->ttft_us / 1e3,
                     (d->ttft_us - d->queue_us) / 1e3);
        else
            snprintf(rej->message, sizeof(rej->message),
                     "predicted time to first token %.0f ms exceeds the SLO of %.0f ms (queue "
                     "%.0f ms + prefill %.0f ms): the queue is the cause; retry later",
                     d->ttft_us / 1e3, slo->ttft_us / 1e3, d->queue_us / 1e3,
                     (d->prefill_us + d->transfer_us) / 1e3);
        retry_s = (d->ttft_us - (double)slo->ttft_us) / 1e6; /* the queue has to shrink by it */
        break;
    case TY_SCHED_REJECT_TBT:
    case TY_SCHED_REJECT_DECODE_FULL:
        snprintf(rej->code, sizeof(rej->code), "%s",
                 d->reject == TY_SCHED_REJECT_TBT ? "tbt_slo" : "decode_full");
        if (d->reject == TY_SCHED_REJECT_TBT && never)
            snprintf(rej->message, sizeof(rej->message),
                     "a decode step of this request alone is predicted over the "
                     "time-between-tokens SLO of %.0f ms (predicted %.1f ms now): retrying "
                     "will not help", slo->tbt_us / 1e3, d->tbt_us / 1e3);
        else if (d->reject == TY_SCHED_REJECT_TBT)
            snprintf(rej->message, sizeof(rej->message),
                     "the decode nodes would exceed the time-between-tokens SLO of %.0f ms "
                     "(predicted %.1f ms) under their load; retry later", slo->tbt_us / 1e3,
                     d->tbt_us / 1e3);
        else if (never)
            snprintf(rej->message, sizeof(rej->message),
                     "this request needs %llu tokens of KV (prompt + max_tokens), more than "
                     "any decode node holds: retrying will not help (lower max_tokens)",
                     (unsigned long long)ctx);
        else
            snprintf(rej->message, sizeof(rej->message),
                     "the decode nodes have no room for this request under their load; retry "
                     "later");
        /* a running request leaves every D / batch on average */
        retry_s = ty_sched_decode_duration_us(p->s) / 1e6 /
                  (d->judged_batch > 1 ? d->judged_batch : 1);
        break;
    default:
        snprintf(rej->code, sizeof(rej->code), "no_node");
        snprintf(rej->message, sizeof(rej->message), "no prefill or decode node is available");
        break;
    }
    rej->retry_after_s = (uint32_t)fmin(60, fmax(1, ceil(retry_s)));
    rej->no_retry = never && !p->retry_after_only;
}

/* A request refused for a predicted SLO miss goes ahead as a probe when the node that verdict
 * was about (its prefill node for TTFT, its decode node for TBT) has sent no timing sample
 * and got no probe for probe_interval: refused requests give no timings, so a model that
 * predicts too high (fitted in a burst now over) would otherwise refuse forever. One probe
 * per node per interval bounds what a model that is right costs: an SLO miss now and then.
 * Returns the node to probe, or NULL. */
static struct ty__cnode *probe_target(ty_conductor_t *c, const struct ty_sched_decision *d,
                                      uint64_t now)
{
    const struct ty__place *p = &c->place;
    if (!p->refit || !p->probe_us ||
        (d->reject != TY_SCHED_REJECT_TTFT && d->reject != TY_SCHED_REJECT_TBT))
        return NULL;
    uint32_t id = d->reject == TY_SCHED_REJECT_TTFT ? d->prefill_node : d->decode_node;
    struct ty__cnode *n = id < c->n_nodes ? c->nodes[id] : NULL;
    if (!n || now < n->last_sample_us + p->probe_us ||
        (n->last_probe_us && now < n->last_probe_us + p->probe_us))
        return NULL;
    return n;
}

static struct ty__cnode *node_of(ty_conductor_t *c, uint32_t id)
{
    return id < c->n_nodes ? c->nodes[id] : NULL;
}

/* Keep the decision's prefix plan in r for its PrefillAssign: local blocks, then the remote
 * ones from the pool or a peer prefill node (its id, RPC address and segment). */
static void plan_keep(ty_conductor_t *c, struct ty__creq *r, const struct ty_sched_decision *d)
{
    r->plan_node = node_of(c, d->prefill_node);
    r->plan_local = d->local_prefix_blocks < d->used_prefix_blocks ? d->local_prefix_blocks
                                                                    : d->used_prefix_blocks;
    r->plan_blocks = d->used_prefix_blocks;
    r->plan_src = TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_NONE;
    r->plan_peer_id[0] = r->plan_peer_addr[0] = r->plan_peer_seg[0] = 0;
    const struct ty__cnode *src = node_of(c, d->prefix_source);
    if (d->prefix_source == TY__POOL_NODE) {
        r->plan_src = TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_POOL;
    } else if (src && src->info.alive && src->segment[0]) {
        r->plan_src = TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_PEER;
        snprintf(r->plan_peer_id, sizeof(r->plan_peer_id), "%s", src->info.id);
        snprintf(r->plan_peer_addr, sizeof(r->plan_peer_addr), "%s", src->info.address);
        snprintf(r->plan_peer_seg, sizeof(r->plan_peer_seg), "%s", src->segment);
    } else {
        r->plan_blocks = r->plan_local; /* no source to name: local only */
    }
}

static void ratio_publish(struct ty__place *p, int k)
{
    if (p->m_ratio[k] && p->plan_blocks[k])
        ty_metrics_gauge_set(p->m_ratio[k],
                             (double)p->used_blocks[k] / (double)p->plan_blocks[k]);
}

void ty__place_reused(ty_conductor_t *c, const struct ty__creq *r,
                      const Tycho__V1__PrefillAssignReply *m)
{
    struct ty__place *p = &c->place;
    if (!m->has_reuse || r->plan_node != r->pnode)
        return; /* an older node, or a prefill moved off its plan */
    uint32_t remote = r->plan_blocks - r->plan_local;
    uint32_t plan[3] = {r->plan_local, 0, 0};
    if (r->plan_src == TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_POOL)
        plan[1] = remote;
    else if (r->plan_src == TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_PEER)
        plan[2] = remote;
    uint32_t used[3] = {m->local_blocks, m->pool_blocks, m->peer_blocks};
    p->plan_replies++;
    p->plan_failed += m->fetch_failed_blocks;
    for (int k = 0; k < 3; k++) {
        p->plan_blocks[k] += plan[k];
        p->used_blocks[k] += used[k];
        if (p->m_plan[k]) {
            ty_metrics_counter_add(p->m_plan[k], plan[k]);
            ty_metrics_counter_add(p->m_used[k], used[k]);
        }
        ratio_publish(p, k);
    }
    if (p->m_failed)
        ty_metrics_counter_add(p->m_failed, m->fetch_failed_blocks);
    if (plan[1] + plan[2] != used[1] + used[2] || used[0] != plan[0])
        TY_LOG_DEBUG("cluster",
                     "request %llu [%s] on %s: planned %u local + %u %s blocks, used %u local, "
                     "%u pool, %u peer (%u failed to arrive)",
                     (unsigned long long)r->rid, r->cid, r->pnode->info.id, plan[0], remote,
                     r->plan_src == TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_POOL   ? "pool"
                     : r->plan_src == TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_PEER ? r->plan_peer_id
                                                                                   : "remote",
                     used[0], used[1], used[2], m->fetch_failed_blocks);
}

int ty__place_pick(ty_conductor_t *c, struct ty__creq *r, struct ty_serve_reject *rej,
                   bool admitted)
{
    struct ty__place *p = &c->place;
    uint32_t B = p->block_tokens ? p->block_tokens : 1;
    size_t nb = p->block_tokens ? r->n_prompt / B : 0;
    if (nb > p->cap_hashes) {
        uint64_t *h = realloc(p->hashes, nb * sizeof(*h));
        if (!h)
            return TY_ENOMEM;
        p->hashes = h;
        p->cap_hashes = nb;
    }
    if (nb)
        nb = ty_hash_prefix_blocks(r->prompt, r->n_prompt, B, p->hash_seed, p->hashes, nb);
    uint32_t room = c->o.max_ctx > r->n_prompt ? c->o.max_ctx - r->n_prompt : 1;
    uint32_t out = r->gen.max_tokens ? r->gen.max_tokens : p->expected_output;
    struct ty_sched_request q = {.id = r->rid, .block_hashes = p->hashes,
                                 .n_blocks = (uint32_t)nb, .prompt_tokens = r->n_prompt,
                                 .output_tokens = out < room ? out : room,
                                 .priority = r->priority, .admitted = admitted};
    if (q.priority >= ty_sched_opts_get(p->s)->n_classes)
        q.priority = 0; /* its class was reloaded away while it waited for the first nodes */
    struct ty_sched_decision d;
    uint64_t now = now_us();
    int rc = ty_sched_pick(p->s, &q, now, &d);
    if (rc)
        return rc;
    uint64_t t_probe = now;
    struct ty__cnode *probed = probe_target(c, &d, t_probe);
    if (probed) {
        enum ty_sched_reject was = d.reject;
        double pred = was == TY_SCHED_REJECT_TTFT ? d.ttft_us : d.tbt_us;
        q.probe = true;
        if ((rc = ty_sched_pick(p->s, &q, now, &d)))
            return rc;
        if (d.reject != TY_SCHED_REJECT_NONE) {
            probed = NULL;
        } else {
            bool pre = was == TY_SCHED_REJECT_TTFT;
            probed->last_probe_us = t_probe;
            p->n_probes++;
            if (p->probes[pre ? 0 : 1])
                ty_metrics_counter_inc(p->probes[pre ? 0 : 1]);
            TY_LOG_INFO("cluster",
                        "request %llu [%s] admitted as a probe: predicted %s %.2f ms is over "
                        "the SLO, but node %s sent no timing sample for %.1f s (the %s cost "
                        "model may be stale)",
                        (unsigned long long)r->rid, r->cid, pre ? "TTFT" : "TBT", pred / 1e3,
                        probed->info.id, (double)(t_probe - probed->last_sample_us) / 1e6,
                        pre ? "prefill" : "decode");
        }
    }
    if (p->cm[q.priority].decisions[d.reject])
        ty_metrics_counter_inc(p->cm[q.priority].decisions[d.reject]);
    if (d.reject == TY_SCHED_REJECT_NO_NODE)
        return TY_EUNAVAIL;
    if (d.reject != TY_SCHED_REJECT_NONE) {
        if (rej)
            reject_fill(p, &d, r->priority, (uint64_t)q.prompt_tokens + q.output_tokens, rej);
        TY_LOG_DEBUG("cluster",
                     "request %llu [%s] refused: %s (predicted TTFT %.1f ms, TBT %.2f ms)",
                     (unsigned long long)r->rid, r->cid, ty_sched_reject_name(d.reject),
                     d.ttft_us / 1e3, d.tbt_us / 1e3);
        return TY_EREJECTED;
    }
    r->pnode = node_of(c, d.prefill_node);
    r->dnode = node_of(c, d.decode_node);
    r->placed = true;
    r->predicted_prefill_us = d.prefill_us + d.transfer_us;
    r->predicted_wait_us = d.queue_us + d.transfer_us;
    r->predicted_ttft_us = d.ttft_us;
    r->predicted_tbt_us = d.tbt_us;
    uint64_t cached = (uint64_t)d.used_prefix_blocks * B;
    r->predicted_cached = (uint32_t)(cached < r->n_prompt ? cached : r->n_prompt);
    plan_keep(c, r, &d);
    r->placed_at_us = ty_clock_us();
    if (r->pnode) {
        r->queued_on = r->pnode;
        r->pnode->queued_prefill_us += r->predicted_prefill_us;
        r->pnode->n_queued++;
    }
    if (!r->pnode || !r->dnode) { /* the scheduler only knows live nodes: cannot happen */
        ty__place_done(c, r, false);
        return TY_EUNAVAIL;
    }
    /* the prefill node is about to hold the blocks it lacks (computed, or read from the KV
     * pool): route the next request with the same prefix there before its heartbeat says so;
     * kept in r to be withdrawn should r end before its prefill (the node will never report
     * them) */
    size_t have = d.local_prefix_blocks < nb ? d.local_prefix_blocks : nb;
    if (nb > have) {
        r->credit = malloc((nb - have) * sizeof(*r->credit));
        if (r->credit) {
            memcpy(r->credit, p->hashes + have, (nb - have) * sizeof(*r->credit));
            r->n_credit = (uint32_t)(nb - have);
            ty_sched_block_stored(p->s, d.prefill_node, r->credit, r->n_credit);
        }
    }
    if ((d.over_ttft || d.over_tbt) && p->over_slo) /* alone on idle nodes, or a probe */
        ty_metrics_counter_inc(p->over_slo);
    if (p->prompt_blocks) {
        ty_metrics_counter_add(p->prompt_blocks, (double)nb);
        ty_metrics_counter_add(p->cached_blocks, d.used_prefix_blocks);
        index_gauge(p);
        ty_metrics_histogram_observe(p->predicted_ttft, d.ttft_us / 1e6);
    }
    TY_LOG_DEBUG("cluster",
                 "request %llu [%s]: prefill %s (%u of %zu blocks cached, predicted TTFT "
                 "%.1f ms), decode %s",
                 (unsigned long long)r->rid, r->cid, r->pnode->info.id, d.used_prefix_blocks, nb,
                 d.ttft_us / 1e3, r->dnode->info.id);
    return 0;
}

/* r's predicted prefill is no longer ahead of its prefill node (done, or never to be): the
 * node's queue is re-based on the predicted work still placed there. */
static void unqueue(ty_conductor_t *c, struct ty__creq *r, uint64_t now)
{
    struct ty__cnode *pn = r->queued_on;
    if (!pn)
        return;
    r->queued_on = NULL;
    pn->queued_prefill_us -= r->predicted_prefill_us;
    if (pn->n_queued)
        pn->n_queued--;
    if (pn->queued_prefill_us < 0 || !pn->n_queued)
        pn->queued_prefill_us = 0; /* rounding: nothing is left when nothing is placed */
    if (pn->in_sched)
        ty_sched_node_set_prefill_queue(c->place.s, pn->slot, (uint64_t)pn->queued_prefill_us,
                                        now);
}

void ty__place_moved(ty_conductor_t *c, struct ty__creq *r, struct ty__cnode *from)
{
    struct ty__place *p = &c->place;
    if (r->n_credit && from && from->in_sched) { /* it will not compute them */
        ty_sched_block_removed(p->s, from->slot, r->credit, r->n_credit);
        index_gauge(p);
    }
    free(r->credit); /* the new node reports what it computes in its heartbeats */
    r->credit = NULL;
    r->n_credit = 0;
    uint64_t now = now_us();
    bool queued = r->queued_on != NULL;
    unqueue(c, r, now);
    struct ty__cnode *pn = r->pnode;
    if (queued && pn) {
        r->queued_on = pn;
        pn->queued_prefill_us += r->predicted_prefill_us;
        pn->n_queued++;
        if (pn->in_sched)
            ty_sched_node_set_prefill_queue(p->s, pn->slot, (uint64_t)pn->queued_prefill_us,
                                            now);
    }
}

void ty__place_prefilled(ty_conductor_t *c, struct ty__creq *r)
{
    struct ty__place *p = &c->place;
    if (!r->placed || r->prefilled)
        return;
    r->prefilled = true;
    free(r->credit); /* computed there now: the node's events speak for these blocks */
    r->credit = NULL;
    r->n_credit = 0;
    uint64_t now = now_us();
    enum ty_sched_reject why = TY_SCHED_REJECT_NONE;
    /* advisory (decode_check_advisory): the request stays in the scheduler's picture */
    if (ty_sched_request_at_decode(p->s, r->rid, now, &why) == 0 && why != TY_SCHED_REJECT_NONE &&
        p->decode_over_slo)
        ty_metrics_counter_inc(p->decode_over_slo);
    unqueue(c, r, now);
}

void ty__place_done(ty_conductor_t *c, struct ty__creq *r, bool natural)
{
    struct ty__place *p = &c->place;
    /* ended before its prefill (a natural end implies one): the blocks were never computed */
    if (r->n_credit && !natural && r->pnode && r->pnode->in_sched) {
        ty_sched_block_removed(p->s, r->pnode->slot, r->credit, r->n_credit);
        index_gauge(p);
    }
    free(r->credit);
    r->credit = NULL;
    r->n_credit = 0;
    unqueue(c, r, now_us());
    if (!r->placed)
        return;
    r->placed = false;
    if (natural)
        ty_sched_request_done(p->s, r->rid, now_us());
    else
        ty_sched_request_abort(p->s, r->rid);
}
