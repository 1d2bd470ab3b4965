/* Private state of one simulation (sim.c: event loop; nodes.c: prefill and decode nodes;
 * report.c: metrics). One thread owns a struct sim. */
#ifndef TYCHO_SIM_IMPL_H
#define TYCHO_SIM_IMPL_H

#include "tycho/sched.h"
#include "tycho/sim.h"

enum ev_kind { EV_PREFILL_DONE, EV_DECODE_ARRIVE, EV_DECODE_TICK, EV_SAMPLE, EV_COLOC_STEP };

struct event {
    double t; /* us */
    uint64_t seq;
    enum ev_kind kind;
    uint32_t a;       /* node index or request index */
    uint64_t version; /* decode ticks: stale when the node's version moved on */
};

struct sim;

struct pnode {
    uint32_t id;
    struct sim *sim;
    ty_sim_pool_t *cache;
    uint32_t *fifo; /* request indices waiting */
    size_t head, len, cap;
    bool busy;
    uint32_t *cur, n_cur; /* the prompts of the running forward call (opts.prefill_batch) */
    bool has_cont;        /* prefill_interleave: a long prompt between two of its calls */
    uint32_t cont;
    double cont_left_us;  /* work left of the running call's prompts after it (interleave) */
    double cur_end, queued_us; /* predicted work of the waiting requests */
    double held_until; /* a stage of another node's pipelined prompt until then (opts.cpp) */
};

struct dnode {
    uint32_t id;
    uint32_t *reqs;
    size_t n_reqs, cap_reqs;
    double v, last_t, step_us; /* tokens produced per sequence since t = 0 ("virtual") */
    double sum_prompt, sum_vjoin;
    uint64_t version;
};

/* A colocated node (opts.n_colocated): prefill and decode in the same steps (coloc.c). */
struct cnode {
    uint32_t id;
    ty_sim_pool_t *cache;
    uint32_t *queue; /* requests whose prompt is not done, in arrival order */
    size_t n_queue, cap_queue, n_started; /* the first n_started hold their KV memory */
    uint32_t *run;   /* decoding */
    size_t n_run, cap_run;
    double v, sum_prompt, sum_vjoin, next_finish_v; /* decode's virtual token clock */
    uint64_t kv_reserved;
    double queued_us; /* predicted prompt work not yet computed (routing) */
    bool busy;
};

struct rq { /* per request */
    struct ty_sched_decision d;
    double arrival, ttft, join, vjoin, prefill_us;
    uint32_t reuse; /* prefix blocks actually reused */
    uint32_t cached_tok, done, piece; /* prefill_interleave: prompt tokens reused, computed
                                       * so far, computed by the running call */
    uint8_t state;  /* 0 pending, 1 served, 2 rejected */
    uint8_t reject, at_decode;
    uint8_t cls; /* SLO class */
    uint8_t pipelined; /* prefilled through a pipeline group (opts.cpp) */
    double tbt;
};

struct sim {
    const struct ty_sim_trace *t;
    struct ty_sim_opts o;
    size_t n, next_arrival;
    ty_sched_t *sched;
    struct pnode *p;
    struct dnode *d;
    struct cnode *c; /* opts.n_colocated */
    size_t c_in_flight;
    struct rq *rq;
    struct event *ev;
    size_t n_ev, cap_ev;
    uint64_t seq;
    double now;
    uint64_t cpp_threshold; /* opts.cpp_threshold or the cost model's (0: no pipelining) */
    double t_end; /* last event other than a load sample */
    struct ty_sim_sample *samples;
    size_t n_samples, cap_samples;
    /* the admission mode's picture of decode against the node when the KV lands */
    size_t judged;
    double judged_bias_batch, judged_abs_batch, judged_bias_ctx, judged_abs_ctx, landed_batch;
};

/* Request i of the trace. */
static inline const struct ty_sim_request *ty__sim_req(const struct sim *s, size_t i)
{
    return &s->t->reqs[i];
}

/* True work of computing prompt tokens [start, start + n) in a call, the call's fixed cost
 * apart (prefill nodes' interleaved calls, colocated steps). */
static inline double ty__sim_piece_us(const struct sim *s, uint64_t start, uint64_t n)
{
    return ty_sched_cost_prefill_us(&s->o.truth, start + n, start) - s->o.truth.prefill[0];
}

/* Tokens a request decodes (at least one: its first token). */
static inline double ty__sim_out_tokens(const struct ty_sim_request *r)
{
    return r->output_tokens ? (double)r->output_tokens : 1.0;
}

void ty__sim_push(struct sim *s, double t, enum ev_kind kind, uint32_t a, uint64_t version);
void ty__sim_arrival(struct sim *s, size_t i, double now);
void ty__sim_prefill_done(struct sim *s, struct pnode *p, double now);
void ty__sim_decode_arrive(struct sim *s, uint32_t i, double now);
void ty__sim_decode_tick(struct sim *s, struct dnode *d, double now);
double ty__sim_prefill_queued_us(const struct sim *s, const struct pnode *p, double now);
void ty__sim_coloc_setup(struct sim *s);
void ty__sim_coloc_teardown(struct sim *s);
void ty__sim_coloc_arrival(struct sim *s, size_t i, double now);
void ty__sim_coloc_step_end(struct sim *s, struct cnode *c, double now);
int ty__sim_summarize(struct sim *s, struct ty_sim_result *res);
double ty__sim_wall_s(void);

#endif
