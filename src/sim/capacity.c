/* Effective request capacity (tycho/sim.h): bisection over the replay speed for the highest
 * arrival rate whose SLO attainment holds a target, and a thread pool for many searches. */
#include "sim-impl.h"
#include "tycho/errors.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

double ty_sim_trace_rate(const struct ty_sim_trace *t, size_t limit)
{
    size_t n = limit && limit < t->n ? limit : t->n;
    if (n < 2)
        return 0;
    double span = (double)(t->reqs[n - 1].arrival_us - t->reqs[0].arrival_us) / 1e6;
    return span > 0 ? (double)n / span : 0;
}

/* One run at `speed`, recorded among the search's points (kept sorted by speed). */
static int run_at(const struct ty_sim_trace *t, const struct ty_sim_opts *base, double speed,
                  double target, struct ty_sim_capacity *out, bool *held)
{
    struct ty_sim_opts o = *base;
    o.speed = speed;
    o.progress = NULL;
    struct ty_sim_result r;
    int rc = ty_sim_run(t, &o, &r);
    if (rc < 0)
        return rc;
    *held = r.slo_attainment >= target;
    struct ty_sim_capacity_point p = {speed, ty_sim_trace_rate(t, o.limit) * speed,
                                      r.slo_attainment, r.ttft_p90, r.tbt_p90};
    ty_sim_result_fini(&r);
    if (out->n_points < TY_SIM_CAPACITY_MAX_RUNS) {
        size_t k = out->n_points++;
        while (k > 0 && out->points[k - 1].speed > speed) {
            out->points[k] = out->points[k - 1];
            k--;
        }
        out->points[k] = p;
    }
    return 0;
}

int ty_sim_capacity_find(const struct ty_sim_trace *t, const struct ty_sim_opts *o,
                         const struct ty_sim_capacity_opts *co, struct ty_sim_capacity *out)
{
    double target = co && co->target > 0 ? co->target : 0.9;
    double prec = co && co->precision > 0 ? co->precision : 0.02;
    double lo_lim = co && co->min_speed > 0 ? co->min_speed : 1.0 / 256;
    double hi_lim = co && co->max_speed > 0 ? co->max_speed : 256;
    memset(out, 0, sizeof(*out));
    if (!t || !o || !(target <= 1) || !(lo_lim < hi_lim))
        return out->rc = TY_EINVAL;
    double t0 = ty__sim_wall_s();
    /* bracket: lo held the target, hi did not (0 / inf: not seen yet) */
    double lo = 0, hi = INFINITY, s = 1;
    bool held;
    int rc;
    while (out->n_points < TY_SIM_CAPACITY_MAX_RUNS) {
        if ((rc = run_at(t, o, s, target, out, &held)) < 0)
            return out->rc = rc;
        if (held)
            lo = s;
        else
            hi = s;
        if (lo > 0 && isfinite(hi))
            break;
        if (held && s * 2 > hi_lim)
            break; /* holds at the top of the range */
        if (!held && s / 2 < lo_lim)
            break; /* capacity below the range: 0 */
        s = held ? s * 2 : s / 2;
    }
    while (lo > 0 && isfinite(hi) && hi / lo > 1 + prec &&
           out->n_points < TY_SIM_CAPACITY_MAX_RUNS) {
        double mid = sqrt(lo * hi);
        if ((rc = run_at(t, o, mid, target, out, &held)) < 0)
            return out->rc = rc;
        if (held)
            lo = mid;
        else
            hi = mid;
    }
    /* the capacity is the bracket's lower end: lo only rises and hi only falls, so no run
     * that held lies above the first that did not */
    for (size_t k = 0; k < out->n_points; k++)
        if (out->points[k].speed == lo) {
            out->speed = lo;
            out->rate_rps = out->points[k].rate_rps;
            out->attainment = out->points[k].attainment;
            out->ttft_p90 = out->points[k].ttft_p90;
            out->tbt_p90 = out->points[k].tbt_p90;
        }
    out->wall_s = ty__sim_wall_s() - t0;
    return 0;
}

struct many {
    const struct ty_sim_trace *t;
    const struct ty_sim_opts *opts;
    const struct ty_sim_capacity_opts *co;
    struct ty_sim_capacity *out;
    size_t n;
    atomic_size_t next;
    void (*done)(void *, size_t);
    void *arg;
    pthread_mutex_t lock;
};

static void *many_worker(void *arg)
{
    struct many *m = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&m->next, 1);
        if (i >= m->n)
            return NULL;
        ty_sim_capacity_find(m->t, &m->opts[i], m->co, &m->out[i]);
        if (m->done) {
            pthread_mutex_lock(&m->lock);
            m->done(m->arg, i);
            pthread_mutex_unlock(&m->lock);
        }
    }
}

int ty_sim_capacity_many(const struct ty_sim_trace *t, const struct ty_sim_opts *opts,
                         const struct ty_sim_capacity_opts *co, struct ty_sim_capacity *out,
                         size_t n, int threads, void (*done)(void *arg, size_t i), void *arg)
{
    struct many m = {.t = t, .opts = opts, .co = co, .out = out, .n = n, .done = done,
                     .arg = arg};
    atomic_init(&m.next, 0);
    pthread_mutex_init(&m.lock, NULL);
    pthread_t th[64];
    int started = 0;
    if (threads > 64)
        threads = 64;
    if ((size_t)threads > n)
        threads = (int)n;
    for (int i = 1; i < threads; i++)
        if (pthread_create(&th[started], NULL, many_worker, &m) == 0)
            started++;
    many_worker(&m);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&m.lock);
    for (size_t i = 0; i < n; i++)
        if (out[i].rc < 0)
            return out[i].rc;
    return 0;
}
