/* Metrics of one simulation: latency percentiles, SLO attainment, cache reuse. */
#include "sim-impl.h"
#include "tycho/errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const double *v, size_t n, double p)
{
    if (!n)
        return 0;
    size_t k = (size_t)ceil(p * (double)n);
    return v[k ? k - 1 : 0];
}

static void stats(double *v, size_t n, double *mean, double *p50, double *p90, double *p99)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    qsort(v, n, sizeof(*v), cmp_double);
    *mean = n ? sum / (double)n : 0;
    *p50 = pct(v, n, 0.50);
    *p90 = pct(v, n, 0.90);
    *p99 = pct(v, n, 0.99);
}

static bool slo_ok(const struct sim *s, const struct rq *q)
{
    const struct ty_sched_slo *slo = &s->o.sched.slo[q->cls];
    uint64_t ttft = s->o.judge.ttft_us ? s->o.judge.ttft_us : slo->ttft_us;
    uint64_t tbt = s->o.judge.tbt_us ? s->o.judge.tbt_us : slo->tbt_us;
    if (ttft && q->ttft > (double)ttft)
        return false;
    return !(tbt && q->tbt > (double)tbt);
}

/* Prefill reuse accounting of one served request. */
static void reuse(const struct sim *s, size_t i, double *blocks, double *hit, double *full,
                  double *saved)
{
    const struct ty_sim_request *r = &s->t->reqs[i];
    const struct rq *q = &s->rq[i];
    double f = ty_sched_cost_prefill_us(&s->o.truth, r->input_tokens, 0);
    double w = ty_sched_cost_prefill_us(&s->o.truth, r->input_tokens,
                                        (uint64_t)q->reuse * s->o.truth.block_tokens);
    *blocks += r->n_blocks;
    *hit += q->reuse;
    *full += f;
    *saved += f - w;
}

int ty__sim_summarize(struct sim *s, struct ty_sim_result *res)
{
    memset(res, 0, sizeof(*res));
    res->n = s->n;
    res->n_classes = s->o.sched.n_classes;
    res->out = calloc(s->n ? s->n : 1, sizeof(*res->out));
    double *ttft = malloc((s->n ? s->n : 1) * sizeof(double));
    double *tbt = malloc((s->n ? s->n : 1) * sizeof(double));
    if (!res->out || !ttft || !tbt) {
        free(ttft);
        free(tbt);
        free(res->out);
        res->out = NULL;
        return TY_ENOMEM;
    }
    double blocks = 0, hit = 0, full = 0, saved = 0;
    res->cpp_threshold = s->cpp_threshold;
    for (size_t i = 0; i < s->n; i++) {
        const struct rq *q = &s->rq[i];
        struct ty_sim_outcome *o = &res->out[i];
        o->cls = q->cls;
        res->class_n[q->cls]++;
        if (q->state != 1) {
            o->rejected = q->reject ? q->reject : TY_SCHED_REJECT_NO_NODE;
            o->at_decode = q->at_decode;
            res->rejected++;
            res->rejected_by[o->rejected]++;
            if (q->at_decode) {
                res->rejected_at_decode++;
                res->prefill_busy_s += q->prefill_us / 1e6;
                res->wasted_prefill_s += q->prefill_us / 1e6;
            }
            continue;
        }
        res->prefill_busy_s += q->prefill_us / 1e6;
        o->ttft_us = q->ttft;
        o->tbt_us = q->tbt;
        ttft[res->served] = q->ttft / 1e6;
        tbt[res->served] = q->tbt / 1e6;
        res->served++;
        res->pipelined += q->pipelined;
        bool ok = slo_ok(s, q);
        res->slo_met += ok;
        res->class_served[q->cls]++;
        res->class_slo_met[q->cls] += ok;
        reuse(s, i, &blocks, &hit, &full, &saved);
    }
    stats(ttft, res->served, &res->ttft_mean, &res->ttft_p50, &res->ttft_p90, &res->ttft_p99);
    stats(tbt, res->served, &res->tbt_mean, &res->tbt_p50, &res->tbt_p90, &res->tbt_p99);
    free(ttft);
    free(tbt);
    res->duration_s = s->t_end / 1e6;
    res->slo_attainment = s->n ? (double)res->slo_met / (double)s->n : 0;
    double span = s->n ? (double)s->t->reqs[s->n - 1].arrival_us / s->o.speed / 1e6 : 0;
    res->goodput_rps = span > 0 ? (double)res->slo_met / span : 0;
    res->cache_hit_rate = blocks > 0 ? hit / blocks : 0;
    res->compute_saved = full > 0 ? saved / full : 0;
    if (s->judged) {
        double n = (double)s->judged;
        res->judged = s->judged;
        res->judged_batch_bias = s->judged_bias_batch / n;
        res->judged_batch_err = s->judged_abs_batch / n;
        res->judged_ctx_bias = s->judged_bias_ctx / n;
        res->judged_ctx_err = s->judged_abs_ctx / n;
        res->landed_batch_mean = s->landed_batch / n;
    }
    res->samples = s->samples;
    res->n_samples = s->n_samples;
    s->samples = NULL;
    return 0;
}

void ty_sim_result_fini(struct ty_sim_result *res)
{
    if (!res)
        return;
    free(res->out);
    free(res->samples);
    memset(res, 0, sizeof(*res));
}
