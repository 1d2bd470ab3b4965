/* Discrete-event cluster simulation (tycho/sim.h): prefill nodes run FIFO, one prompt at a
 * time; decode nodes run continuous batching whose step time follows the cost model; each
 * prefill node keeps a KV cache whose block events feed the scheduler's prefix index, exactly
 * as a live node's events would. The scheduler is the real one (src/conductor). */
#include "sim-impl.h"
#include "tycho/errors.h"
#include "tycho/hash.h"
#include "tycho/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ty_sim_opts_default(struct ty_sim_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->n_prefill = 8;
    o->n_decode = 8;
    ty_sched_opts_default(&o->sched);
    o->truth = o->sched.cost;
    o->cache_blocks = 0;
    o->evict = TY_SIM_EVICT_LRU;
    o->speed = 1.0;
    o->sample_us = 10000000;
}

static void cache_event(void *arg, uint64_t hash, bool stored)
{
    struct pnode *p = arg;
    if (stored)
        ty_sched_block_stored(p->sim->sched, p->id, &hash, 1);
    else
        ty_sched_block_removed(p->sim->sched, p->id, &hash, 1);
}

/* Class of each request: a hash of its index and the seed against the cumulative mix. */
static void assign_classes(struct sim *s)
{
    const struct ty_sim_opts *o = &s->o;
    double total = 0;
    for (uint32_t k = 0; k < o->n_class_mix; k++)
        total += o->class_mix[k];
    if (!(total > 0))
        return;
    for (size_t i = 0; i < s->n; i++) {
        uint64_t h = ty_hash_mix64((uint64_t)i * 0x9e3779b97f4a7c15ull ^ o->sched.seed);
        double u = (double)(h >> 11) / 9007199254740992.0 * total, acc = 0;
        uint32_t k = 0;
        while (k + 1 < o->n_class_mix && u >= (acc += o->class_mix[k]))
            k++;
        s->rq[i].cls = (uint8_t)k;
    }
}

static int sim_setup(struct sim *s, const struct ty_sim_trace *t, const struct ty_sim_opts *o)
{
    s->t = t;
    s->o = *o;
    s->n = o->limit && o->limit < t->n ? o->limit : t->n;
    if (o->cpp.stages >= 2)
        s->cpp_threshold = o->cpp_threshold
                               ? o->cpp_threshold
                               : ty_sched_cpp_threshold(&o->truth, &o->cpp, 1u << 20);
    struct ty_sched_opts so = o->sched; /* its scheduler knows the groups the nodes form */
    so.cpp = o->cpp;
    so.cpp_threshold = s->cpp_threshold ? s->cpp_threshold : UINT64_MAX;
    int rc = ty_sched_new(&s->sched, &so);
    if (rc < 0)
        return rc;
    if (o->n_colocated) {
        s->rq = calloc(s->n ? s->n : 1, sizeof(*s->rq));
        TY_ASSERT(s->rq);
        assign_classes(s);
        ty__sim_coloc_setup(s);
        return 0;
    }
    s->p = calloc(o->n_prefill, sizeof(*s->p));
    s->d = calloc(o->n_decode, sizeof(*s->d));
    s->rq = calloc(s->n ? s->n : 1, sizeof(*s->rq));
    TY_ASSERT(s->p && s->d && s->rq);
    assign_classes(s);
    for (uint32_t i = 0; i < o->n_prefill; i++) {
        struct ty_sched_node_desc nd = {.role = TY_SCHED_ROLE_PREFILL,
                                        .batch_prompts = o->prefill_batch,
                                        .batch_tokens = o->prefill_batch_tokens,
                                        .interleaves = o->prefill_interleave &&
                                                       o->prefill_batch > 1};
        ty_sched_node_add(s->sched, i, &nd);
        s->p[i].id = i;
        s->p[i].sim = s;
        s->p[i].cur = calloc(o->prefill_batch > 1 ? o->prefill_batch : 1, sizeof(uint32_t));
        TY_ASSERT(s->p[i].cur);
        struct ty_sim_pool_opts po = {.capacity_blocks = o->cache_blocks, .policy = o->evict,
                                      .on_event = cache_event, .arg = &s->p[i]};
        rc = ty_sim_pool_new(&s->p[i].cache, &po);
        if (rc < 0)
            return rc;
    }
    for (uint32_t i = 0; i < o->n_decode; i++) {
        struct ty_sched_node_desc nd = {.role = TY_SCHED_ROLE_DECODE,
                                        .max_batch = o->decode_max_batch,
                                        .kv_capacity_tokens = o->decode_kv_tokens};
        ty_sched_node_add(s->sched, o->n_prefill + i, &nd);
        s->d[i].id = o->n_prefill + i;
        s->d[i].step_us = ty_sched_cost_step_us(&o->truth, 0, 0);
    }
    return 0;
}

static void sim_teardown(struct sim *s)
{
    for (uint32_t i = 0; s->p && i < s->o.n_prefill; i++) {
        ty_sim_pool_free(s->p[i].cache);
        free(s->p[i].fifo);
        free(s->p[i].cur);
    }
    for (uint32_t i = 0; s->d && i < s->o.n_decode; i++)
        free(s->d[i].reqs);
    ty__sim_coloc_teardown(s);
    free(s->p);
    free(s->d);
    free(s->rq);
    free(s->ev);
    ty_sched_free(s->sched);
}

/* ---- events ----------------------------------------------------------------------------- */

static bool ev_before(const struct event *a, const struct event *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

void ty__sim_push(struct sim *s, double t, enum ev_kind kind, uint32_t a, uint64_t version)
{
    if (s->n_ev == s->cap_ev) {
        s->cap_ev = s->cap_ev ? s->cap_ev * 2 : 1024;
        s->ev = realloc(s->ev, s->cap_ev * sizeof(*s->ev));
        TY_ASSERT(s->ev);
    }
    size_t i = s->n_ev++;
    s->ev[i] = (struct event){.t = t, .seq = s->seq++, .kind = kind, .a = a, .version = version};
    while (i > 0 && ev_before(&s->ev[i], &s->ev[(i - 1) / 2])) {
        struct event tmp = s->ev[i];
        s->ev[i] = s->ev[(i - 1) / 2];
        s->ev[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
}

static struct event ev_pop(struct sim *s)
{
    struct event top = s->ev[0];
    s->ev[0] = s->ev[--s->n_ev];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < s->n_ev && ev_before(&s->ev[l], &s->ev[m]))
            m = l;
        if (r < s->n_ev && ev_before(&s->ev[r], &s->ev[m]))
            m = r;
        if (m == i)
            break;
        struct event tmp = s->ev[i];
        s->ev[i] = s->ev[m];
        s->ev[m] = tmp;
        i = m;
    }
    return top;
}

static size_t in_flight(const struct sim *s)
{
    return s->o.n_colocated ? s->c_in_flight : ty_sched_in_flight(s->sched);
}

static void sample(struct sim *s, double now)
{
    if (s->n_samples == s->cap_samples) {
        s->cap_samples = s->cap_samples ? s->cap_samples * 2 : 256;
        s->samples = realloc(s->samples, s->cap_samples * sizeof(*s->samples));
        TY_ASSERT(s->samples);
    }
    double q = 0, b = 0;
    uint32_t np = s->o.n_prefill, nd = s->o.n_decode;
    if (s->o.n_colocated) {
        np = nd = s->o.n_colocated;
        for (uint32_t i = 0; i < np; i++) {
            q += s->c[i].queued_us;
            b += (double)s->c[i].n_run;
        }
    } else {
        for (uint32_t i = 0; i < np; i++)
            q += ty__sim_prefill_queued_us(s, &s->p[i], now);
        for (uint32_t i = 0; i < nd; i++)
            b += s->d[i].n_reqs;
    }
    s->samples[s->n_samples++] = (struct ty_sim_sample){
        .t_s = now / 1e6,
        .prefill_queue_s = q / np / 1e6,
        .decode_batch = b / nd,
        .in_flight = (uint32_t)in_flight(s),
    };
}

static void dispatch(struct sim *s, const struct event *e)
{
    switch (e->kind) {
    case EV_PREFILL_DONE:
        ty__sim_prefill_done(s, &s->p[e->a], e->t);
        break;
    case EV_DECODE_ARRIVE:
        ty__sim_decode_arrive(s, e->a, e->t);
        break;
    case EV_DECODE_TICK:
        if (e->version == s->d[e->a].version)
            ty__sim_decode_tick(s, &s->d[e->a], e->t);
        break;
    case EV_COLOC_STEP:
        ty__sim_coloc_step_end(s, &s->c[e->a], e->t);
        break;
    case EV_SAMPLE:
        sample(s, e->t);
        if (s->next_arrival < s->n || in_flight(s))
            ty__sim_push(s, e->t + (double)s->o.sample_us, EV_SAMPLE, 0, 0);
        break;
    }
}

static void run_loop(struct sim *s)
{
    ty__sim_push(s, 0, EV_SAMPLE, 0, 0);
    while (s->next_arrival < s->n || s->n_ev) {
        double ta = INFINITY;
        if (s->next_arrival < s->n)
            ta = (double)s->t->reqs[s->next_arrival].arrival_us / s->o.speed;
        if (s->n_ev && s->ev[0].t <= ta) {
            struct event e = ev_pop(s);
            s->now = e.t;
            if (e.kind != EV_SAMPLE)
                s->t_end = e.t;
            dispatch(s, &e);
        } else {
            s->now = s->t_end = ta;
            (s->o.n_colocated ? ty__sim_coloc_arrival : ty__sim_arrival)(s, s->next_arrival++,
                                                                         ta);
            if (s->o.progress && (s->next_arrival % 1000 == 0 || s->next_arrival == s->n))
                s->o.progress(s->o.progress_arg, s->next_arrival, s->n);
        }
    }
}

int ty_sim_run(const struct ty_sim_trace *t, const struct ty_sim_opts *o,
               struct ty_sim_result *res)
{
    if (!t || !o || !res || (!o->n_colocated && (o->n_prefill == 0 || o->n_decode == 0)) ||
        !(o->speed > 0) || o->n_prefill + o->n_decode > TY_SCHED_MAX_NODES ||
        o->n_colocated > TY_SCHED_MAX_NODES || o->n_class_mix > o->sched.n_classes ||
        o->n_class_mix > TY_SCHED_MAX_CLASSES || o->prefill_batch > 4096 ||
        (o->prefill_interleave && o->prefill_batch_tokens < 2) ||
        (o->cpp.stages >= 2 && (o->cpp.stages > o->n_prefill || o->cpp.stages > 64 ||
                                o->prefill_interleave || o->n_colocated ||
                                !(o->cpp.hidden_bytes_per_token >= 0))))
        return TY_EINVAL;
    for (uint32_t k = 0; k < o->n_class_mix; k++)
        if (!(o->class_mix[k] >= 0) || !isfinite(o->class_mix[k]))
            return TY_EINVAL;
    struct sim s = {0};
    double wall0 = ty__sim_wall_s();
    int rc = sim_setup(&s, t, o);
    if (rc < 0)
        goto out;
    if (s.o.sample_us == 0)
        s.o.sample_us = 10000000;
    run_loop(&s);
    rc = ty__sim_summarize(&s, res);
    res->wall_s = ty__sim_wall_s() - wall0;
out:
    sim_teardown(&s);
    if (rc < 0)
        free(s.samples);
    return rc;
}
