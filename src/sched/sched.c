/* The scheduler proper: node table, placement policies and admission (see tycho/sched.h). */
#include "sched-impl.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/sched.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The names are those of the settings table (sched_config.c), in enum order. */
#define policy_names ty_sched_policy_names
#define admission_names ty_sched_admission_names
static const char *const reject_names[] = {"none", "ttft", "tbt", "decode_full", "no_node"};

const char *ty_sched_policy_name(enum ty_sched_policy p)
{
    return (unsigned)p < TY_SCHED_POLICY_COUNT_ ? policy_names[p] : "unknown";
}

int ty_sched_policy_parse(const char *s, enum ty_sched_policy *out)
{
    for (int i = 0; s && i < TY_SCHED_POLICY_COUNT_; i++) {
        if (strcmp(s, policy_names[i]) == 0) {
            *out = (enum ty_sched_policy)i;
            return 0;
        }
    }
    return TY_EINVAL;
}

const char *ty_sched_admission_name(enum ty_sched_admission a)
{
    return (unsigned)a < TY_SCHED_ADMIT_COUNT_ ? admission_names[a] : "unknown";
}

int ty_sched_admission_parse(const char *s, enum ty_sched_admission *out)
{
    for (int i = 0; s && i < TY_SCHED_ADMIT_COUNT_; i++) {
        if (strcmp(s, admission_names[i]) == 0) {
            *out = (enum ty_sched_admission)i;
            return 0;
        }
    }
    return TY_EINVAL;
}

const char *ty_sched_reject_name(enum ty_sched_reject r)
{
    return (unsigned)r <= TY_SCHED_REJECT_NO_NODE ? reject_names[r] : "unknown";
}

void ty_sched_opts_default(struct ty_sched_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->policy = TY_SCHED_POLICY_KVCACHE_CENTRIC;
    o->admission = TY_SCHED_ADMIT_PREDICTED;
    ty_sched_cost_profile("llama3-70b-8xa800", &o->cost);
    o->balancing_threshold = 1.0;
    o->n_classes = 1;
    o->seed = 1;
    o->decode_duration_us = 10000000;
}

static int opts_check(const struct ty_sched_opts *o)
{
    if ((unsigned)o->policy >= TY_SCHED_POLICY_COUNT_ ||
        (unsigned)o->admission >= TY_SCHED_ADMIT_COUNT_)
        return TY_EINVAL;
    if (o->n_classes < 1 || o->n_classes > TY_SCHED_MAX_CLASSES)
        return TY_EINVAL;
    if (o->cost.block_tokens == 0 || !(o->balancing_threshold >= 0) ||
        !(o->ttft_overhead_us >= 0) || !isfinite(o->ttft_overhead_us))
        return TY_EINVAL;
    if ((o->remote_from_node || o->has_remote_node) && o->remote_node >= TY_SCHED_MAX_NODES)
        return TY_EINVAL;
    for (int k = 0; k < 3; k++)
        if (!isfinite(o->cost.prefill[k]) || !isfinite(o->cost.decode[k]))
            return TY_EINVAL;
    return 0;
}

int ty_sched_new(ty_sched_t **out, const struct ty_sched_opts *opts)
{
    int rc = opts_check(opts);
    if (rc < 0)
        return rc;
    ty_sched_t *s = calloc(1, sizeof(*s));
    if (!s)
        return TY_ENOMEM;
    rc = ty_sched_index_new(&s->ix);
    if (rc < 0)
        goto err_free;
    s->o = *opts;
    s->rng = opts->seed ? opts->seed : 1;
    s->decode_dur_us = (double)opts->decode_duration_us;
    ty_u64map_init(&s->fl_map);
    *out = s;
    return 0;
err_free:
    free(s);
    return rc;
}

void ty_sched_free(ty_sched_t *s)
{
    if (!s)
        return;
    ty_sched_index_free(s->ix);
    ty_u64map_fini(&s->fl_map);
    free(s->fl);
    free(s);
}

const struct ty_sched_opts *ty_sched_opts_get(const ty_sched_t *s)
{
    return &s->o;
}

int ty_sched_set_cost(ty_sched_t *s, const struct ty_sched_cost *c)
{
    struct ty_sched_opts o = s->o;
    o.cost = *c;
    int rc = opts_check(&o);
    if (rc == 0)
        s->o.cost = *c;
    return rc;
}

int ty_sched_set_cpp(ty_sched_t *s, const struct ty_sched_cpp *cpp, uint64_t threshold)
{
    if (!cpp || !(cpp->hidden_bytes_per_token >= 0) || !isfinite(cpp->hidden_bytes_per_token))
        return TY_EINVAL;
    s->o.cpp = *cpp;
    s->o.cpp_threshold = threshold;
    return 0;
}

int ty_sched_set_policy(ty_sched_t *s, const struct ty_sched_opts *o)
{
    if (!o)
        return TY_EINVAL;
    struct ty_sched_opts n = s->o;
    n.policy = o->policy;
    n.admission = o->admission;
    n.balancing_threshold = o->balancing_threshold;
    n.local_prefix_only = o->local_prefix_only;
    n.n_classes = o->n_classes;
    int rc = opts_check(&n);
    if (rc)
        return rc;
    memset(n.slo, 0, sizeof(n.slo)); /* a class index past the new count has no SLO */
    memcpy(n.slo, o->slo, n.n_classes * sizeof(n.slo[0]));
    s->o = n;
    return 0;
}

int ty_sched_set_ttft_overhead(ty_sched_t *s, double us)
{
    if (!(us >= 0) || !isfinite(us))
        return TY_EINVAL;
    s->o.ttft_overhead_us = us;
    return 0;
}

const ty_sched_index_t *ty_sched_index(const ty_sched_t *s)
{
    return s->ix;
}

size_t ty_sched_in_flight(const ty_sched_t *s)
{
    return s->n_fl;
}

/* ---- nodes ------------------------------------------------------------------------------ */

static void id_list_del(uint32_t *ids, uint32_t *n, uint32_t id)
{
    for (uint32_t i = 0; i < *n; i++) {
        if (ids[i] == id) {
            memmove(&ids[i], &ids[i + 1], (*n - i - 1) * sizeof(*ids));
            (*n)--;
            return;
        }
    }
}

int ty_sched_node_add(ty_sched_t *s, uint32_t id, const struct ty_sched_node_desc *d)
{
    if (id >= TY_SCHED_MAX_NODES || !d ||
        (d->role != TY_SCHED_ROLE_PREFILL && d->role != TY_SCHED_ROLE_DECODE))
        return TY_EINVAL;
    struct node *n = &s->nodes[id];
    if (n->present)
        return TY_EEXIST;
    uint32_t epoch = n->epoch + 1; /* flights still listed for an earlier life leave it alone */
    memset(n, 0, sizeof(*n));
    n->epoch = epoch;
    n->present = true;
    n->role = d->role;
    n->max_batch = d->max_batch;
    n->kv_cap = d->kv_capacity_tokens;
    n->batch_prompts = d->batch_prompts;
    n->batch_tokens = d->batch_tokens;
    n->interleaves = d->interleaves && d->batch_tokens > 1 && d->batch_prompts > 1;
    if (d->role == TY_SCHED_ROLE_PREFILL)
        s->prefill_ids[s->n_prefill++] = id;
    else
        s->decode_ids[s->n_decode++] = id;
    return 0;
}

int ty_sched_node_remove(ty_sched_t *s, uint32_t id)
{
    if (id >= TY_SCHED_MAX_NODES || !s->nodes[id].present)
        return TY_ENOTFOUND;
    ty_sched_node_set_out(s, id, true);
    s->nodes[id].present = false;
    ty_sched_index_drop_node(s->ix, id);
    return 0;
}

int ty_sched_node_set_out(ty_sched_t *s, uint32_t id, bool out)
{
    if (id >= TY_SCHED_MAX_NODES || !s->nodes[id].present)
        return TY_ENOTFOUND;
    struct node *n = &s->nodes[id];
    if (n->out == out)
        return 0;
    n->out = out;
    bool pf = n->role == TY_SCHED_ROLE_PREFILL;
    if (out)
        id_list_del(pf ? s->prefill_ids : s->decode_ids, pf ? &s->n_prefill : &s->n_decode, id);
    else if (pf)
        s->prefill_ids[s->n_prefill++] = id;
    else
        s->decode_ids[s->n_decode++] = id;
    return 0;
}

static struct node *node_get(ty_sched_t *s, uint32_t id, enum ty_sched_role role)
{
    if (id >= TY_SCHED_MAX_NODES || !s->nodes[id].present || s->nodes[id].role != role)
        return NULL;
    return &s->nodes[id];
}

int ty_sched_node_set_prefill_queue(ty_sched_t *s, uint32_t id, uint64_t queued_us,
                                    uint64_t now_us)
{
    struct node *n = node_get(s, id, TY_SCHED_ROLE_PREFILL);
    if (!n)
        return TY_ENOTFOUND;
    n->busy_until_us = (double)now_us + (double)queued_us;
    if ((double)queued_us <= n->tail_us) /* the last call has started (or is gone) */
        n->tail_n = 0;
    return 0;
}

int ty_sched_node_set_decode_load(ty_sched_t *s, uint32_t id, uint32_t batch,
                                  uint64_t ctx_tokens)
{
    struct node *n = node_get(s, id, TY_SCHED_ROLE_DECODE);
    if (!n)
        return TY_ENOTFOUND;
    n->batch = batch;
    n->ctx = ctx_tokens;
    return 0;
}

int ty_sched_block_stored(ty_sched_t *s, uint32_t node, const uint64_t *hashes, size_t n)
{
    return ty_sched_index_add(s->ix, node, hashes, n);
}

int ty_sched_block_removed(ty_sched_t *s, uint32_t node, const uint64_t *hashes, size_t n)
{
    return ty_sched_index_del(s->ix, node, hashes, n);
}

int ty_sched_blocks_reset(ty_sched_t *s, uint32_t node)
{
    bool source = (s->o.remote_from_node || s->o.has_remote_node) && node == s->o.remote_node;
    if (node >= TY_SCHED_MAX_NODES || (!s->nodes[node].present && !source))
        return TY_ENOTFOUND;
    ty_sched_index_drop_node(s->ix, node);
    return 0;
}

double ty_sched_decode_duration_us(const ty_sched_t *s)
{
    return s->decode_dur_us;
}

/* ---- requests in flight ---------------------------------------------------------------- */

int ty__sched_flight_add(ty_sched_t *s, const struct flight *f)
{
    if (ty_u64map_get(&s->fl_map, f->id))
        return TY_EEXIST;
    if (s->n_fl == s->cap_fl) {
        size_t cap = s->cap_fl ? s->cap_fl * 2 : 256;
        struct flight *nf = realloc(s->fl, cap * sizeof(*nf));
        TY_ASSERT(nf);
        s->fl = nf;
        s->cap_fl = cap;
    }
    s->fl[s->n_fl] = *f;
    ty_u64map_put(&s->fl_map, f->id, (uint32_t)s->n_fl);
    s->n_fl++;
    struct node *d = &s->nodes[f->decode];
    if (d->epoch == f->decode_epoch)
        d->classes[f->priority]++;
    return 0;
}

struct flight *ty__sched_flight_get(ty_sched_t *s, uint64_t id)
{
    uint32_t *v = ty_u64map_get(&s->fl_map, id);
    return v ? &s->fl[*v] : NULL;
}

static void flight_del(ty_sched_t *s, struct flight *f)
{
    size_t i = (size_t)(f - s->fl);
    struct node *d = &s->nodes[f->decode];
    if (d->epoch == f->decode_epoch && d->classes[f->priority])
        d->classes[f->priority]--;
    ty_u64map_del(&s->fl_map, f->id);
    if (i != s->n_fl - 1) {
        s->fl[i] = s->fl[s->n_fl - 1];
        ty_u64map_put(&s->fl_map, s->fl[i].id, (uint32_t)i);
    }
    s->n_fl--;
}

static void pending_release(ty_sched_t *s, struct flight *f)
{
    struct node *d = &s->nodes[f->decode];
    if (d->epoch == f->decode_epoch && d->pending) {
        d->pending--;
        d->pending_ctx -= d->pending_ctx >= f->ctx ? f->ctx : d->pending_ctx;
    }
}

/* The tightest TBT SLO on decode node d once a request of class `priority` joins: every
 * sequence of a batch waits for the same steps, so a request with a lax SLO must not slow the
 * batch past the SLO of one already there (0: none applies). */
static uint64_t batch_tbt_slo(const ty_sched_t *s, const struct node *d, uint32_t priority)
{
    uint64_t slo = s->o.slo[priority].tbt_us;
    for (uint32_t c = 0; c < s->o.n_classes; c++) {
        uint64_t t = s->o.slo[c].tbt_us;
        if (d->classes[c] && t && (!slo || t < slo))
            slo = t;
    }
    return slo;
}

/* The one decode-load rule every admission mode applies (arXiv 2407.00079 §7: a decode
 * instance is overloaded when taking the request would break the TBT SLO, here the tightest
 * SLO of the batch it joins; max_batch and KV memory are hard limits). batch and ctx_tokens
 * describe the node with the request added; only the state they come from differs between
 * modes: the real state when the KV lands, the reported state at arrival (early), the
 * predicted state at arrival (predicted). */
enum ty_sched_reject ty__sched_decode_check(const ty_sched_t *s, const struct node *d,
                                            double batch, double ctx_tokens, uint32_t priority,
                                            double *tbt)
{
    double t = ty_sched_cost_step_us(&s->o.cost, (uint64_t)ceil(batch),
                                     (uint64_t)(ctx_tokens > 0 ? ctx_tokens : 0));
    if (tbt)
        *tbt = t;
    if (d->max_batch && batch > (double)d->max_batch)
        return TY_SCHED_REJECT_DECODE_FULL;
    if (d->kv_cap && ctx_tokens > (double)d->kv_cap)
        return TY_SCHED_REJECT_DECODE_FULL;
    uint64_t slo = batch_tbt_slo(s, d, priority);
    return slo && t > (double)slo ? TY_SCHED_REJECT_TBT : TY_SCHED_REJECT_NONE;
}

int ty_sched_request_at_decode(ty_sched_t *s, uint64_t id, uint64_t now_us,
                               enum ty_sched_reject *reject)
{
    struct flight *f = ty__sched_flight_get(s, id);
    if (!f || f->at_decode)
        return TY_ENOTFOUND;
    struct node *d = &s->nodes[f->decode];
    pending_release(s, f);
    /* the decode stage sees its real batch at the moment the KV lands (every mode) */
    enum ty_sched_reject r = ty__sched_decode_check(s, d, (double)d->batch + 1,
                                                    (double)d->ctx + (double)f->ctx, f->priority,
                                                    NULL);
    *reject = r;
    if (r != TY_SCHED_REJECT_NONE && !s->o.decode_check_advisory) {
        flight_del(s, f);
        return 0;
    }
    f->at_decode = true;
    f->at_decode_us = (double)now_us;
    f->start_us = (double)now_us;
    f->end_us = (double)now_us + s->decode_dur_us;
    return 0;
}

int ty_sched_request_abort(ty_sched_t *s, uint64_t id)
{
    struct flight *f = ty__sched_flight_get(s, id);
    if (!f)
        return TY_ENOTFOUND;
    if (!f->at_decode)
        pending_release(s, f);
    flight_del(s, f);
    return 0;
}

int ty_sched_request_done(ty_sched_t *s, uint64_t id, uint64_t now_us)
{
    struct flight *f = ty__sched_flight_get(s, id);
    if (!f)
        return TY_ENOTFOUND;
    if (f->at_decode) {
        /* system-level uniform decode duration: a slow moving average of what we observe */
        double took = (double)now_us - f->at_decode_us;
        if (took > 0)
            s->decode_dur_us += 0.02 * (took - s->decode_dur_us);
    } else {
        pending_release(s, f);
    }
    flight_del(s, f);
    return 0;
}
