/* Internals of ty_conductor_t (registry.c: nodes, RPC endpoint, heartbeat timeout; remote.c: the
 * serving backend, whose relayed tokens become text through tycho/stoptext.h). Everything runs
 * on the cluster's loop thread. Nodes live as long as the cluster (a dead node keeps its slot
 * and is revived by its next RegisterNode); requests are freed once finished and no RPC call
 * of theirs is pending. */
#ifndef TYCHO_CONDUCTOR_IMPL_H
#define TYCHO_CONDUCTOR_IMPL_H

#include "tycho/conductor.h"
#include "tycho/proto.h"
#include "tycho/rpc.h"
#include "tycho/stoptext.h"
#include "tycho/store.h"
#include "tycho/tokenizer.h"
#include "tycho.pb-c.h"

/* Nodes the registry holds; their slots are their scheduler ids, and the last scheduler id
 * is the KV pool's (pool_index.c). */
#define TY_CONDUCTOR_MAX_NODES (TY_SCHED_MAX_NODES - 1)
#define TY__POOL_NODE (TY_SCHED_MAX_NODES - 1)

struct ty__cnode {
    struct ty_conductor_node_info info;
    uint8_t instance[16]; /* the registered process's claim on the name (RegisterNode) */
    size_t instance_len;
    uint32_t slot;        /* index in ty_conductor.nodes: the node's id in the scheduler */
    bool in_sched;        /* added to the scheduler (alive) */
    uint64_t kv_pages;    /* as registered */
    uint32_t max_batch;   /* as registered (decode: sequences per batch; prefill: tokens
                           * per forward call) */
    uint32_t max_batch_prompts; /* prefill: prompts per forward call, as registered */
    uint32_t max_ctx;           /* the node's context, as registered (0: not said) */
    bool interleaves;           /* prefill: short prompts join a long one's chunks */
    uint64_t preempt_seen;      /* its preemption count as last reported (kept across a
                                 * re-registration; a smaller one means it restarted) */
    uint64_t decode_ctx;  /* decode: context tokens of its batch, from its heartbeats */
    uint64_t index_est;   /* prefill: blocks its events added to the index, less removals */
    /* when its last timing sample came (its registration before any) and when a probe
     * last went to it (ty_clock_us) */
    uint64_t last_sample_us, last_probe_us;
    double queued_prefill_us; /* prefill: predicted work of its placed, unprefilled requests */
    uint32_t n_queued;        /* how many requests that is */
    char segment[TY_XFER_NAME_MAX + 1];
    uint32_t block_tokens;
    char kv_dtype[8];     /* as registered: "f32" or "f16" */
    uint32_t n_layers, n_kv_heads, head_dim; /* its KV geometry (the model's) */
    char backend[8];      /* as registered: "cpu", "cuda" */
    char kv_device[16];   /* where its KV pages live: "cpu:0", "cuda:0" */
    char transports[32];  /* its KV handoff paths, comma-separated */
    uint64_t session, last_hb_ms;
    ty_rpc_client_t *rpc; /* to the node's RPC server; NULL while dead */
    /* its circuit breaker (breaker.c; state and failures in info): open until open_until_ms,
     * for open_ms this time; probing: half open and its probe request is placed */
    uint64_t open_until_ms;
    uint32_t open_ms;
    bool probing;
    ty_metrics_child_t *m_breaker, *m_failed;
    bool lost;            /* connection dropped: reaped on the next tick */
    ty_conductor_t *c;
    /* its tycho_node_* metrics (NULL without a registry); pool counters as last reported */
    /* m_pool: KV pool blocks read, written, pool errors, then the node's preemptions */
    ty_metrics_child_t *m_up, *m_kv_usage, *m_queued, *m_running, *m_pool[4];
    uint64_t pool_seen[4];
};

#define TY__PIPELINE_MAX 16 /* prefill nodes in a pipeline group, at most (pipeline.stages) */

struct ty__creq;
/* One RPC call of a request to a node (the argument of its callbacks) */
struct ty__call {
    struct ty__creq *r;
    struct ty__cnode *n;
    bool stale; /* the request let go of it: its events are ignored, its end freed */
};

struct ty__creq {
    struct ty__creq *next;
    uint64_t id;  /* the serve id */
    uint64_t rid; /* the id nodes know the request by (unique for this Conductor's life) */
    char cid[TY_CLIENT_ID_MAX + 1]; /* the client's x-request-id: log lines, the nodes' too */
    uint32_t *prompt;
    uint32_t n_prompt, n_out;
    uint32_t n_cached; /* prompt tokens the prefill node reused (from the decode node) */
    struct ty_gen_params gen;
    struct ty__cnode *pnode, *dnode;
    Tycho__V1__DecodeAssignReply *dreply; /* kept to forward its KV destination */
    /* stream_pending: its DecodeAssign call (the token stream) is open; assigned: that call's
     * first item (the DecodeAssignReply) came, else it must by assign_by_ms; decode_pending: a
     * re-arm DecodeAssign (attempt > 1) is open */
    bool decode_pending, prefill_pending, stream_pending, finished, prefill_counted, assigned;
    uint64_t assign_by_ms;
    /* the open DecodeAssign stream and PrefillAssign calls (remote.c); calls of a placement
     * let go (the request placed again elsewhere) end later as stale, n_stale of them */
    struct ty__call *stream_call, *prefill_call;
    uint8_t n_stale;
    uint8_t replaced;       /* placed again after a node failed it (at most once) */
    uint64_t prefill_by_ms; /* its KV is due by then, else its prefill node failed it; moved
                             * on while its node reports progress (ty__conductor_progress) */
    uint32_t progress_done; /* this attempt's prompt tokens its prefill node said are done */
    uint64_t kv_wait_by_ms; /* until when its decode node keeps the pages waiting (at least) */
    char why[192];          /* what failed, for the client (its ERROR event's message) */
    uint64_t wait_until_ms; /* no node yet (Conductor just started): dispatch when one comes */
    bool placed;            /* in the scheduler's flight table (until ty__place_done) */
    uint8_t prefill_tries;  /* PrefillAssigns sent (a dead prefill node's are sent again) */
    bool prefilled;         /* its prefill finished (ty__place_prefilled) */
    uint32_t priority;      /* SLO class index (ty__place_class) */
    uint64_t *credit;       /* blocks credited to pnode at placement that it did not hold:
                             * withdrawn if the request ends before its prefill */
    uint32_t n_credit;
    double predicted_prefill_us; /* the scheduler's transfer + prefill estimate */
    uint64_t t_arrive_us, t_first_us, t_last_us; /* at the Conductor: the tokens' arrivals */
    /* the scheduler's picture at placement: predicted queue + KV fetch, the prompt tokens it
     * counted as cached, when (0: not placed yet) */
    double predicted_wait_us;
    uint32_t predicted_cached;
    double predicted_ttft_us, predicted_tbt_us; /* as admission judged them */
    uint64_t placed_at_us;
    /* the prefix its prefill node was planned to reuse (PrefillAssign.cached_prefix): blocks
     * [0, plan_local) from its own page cache, [plan_local, plan_blocks) from plan_src (a
     * Tycho__V1__PrefixSource: the pool, or the cache of the prefill node plan_peer_* names,
     * copied here: a node's slot may be reused meanwhile); plan_node: the node it is for (a
     * prefill moved elsewhere goes without a plan) */
    uint32_t plan_local, plan_blocks;
    int plan_src;
    const struct ty__cnode *plan_node;
    char plan_peer_id[64], plan_peer_addr[128], plan_peer_seg[TY_XFER_NAME_MAX + 1];
    struct ty__cnode *queued_on; /* the prefill node whose queue counts it (until unqueued) */
    uint32_t relay_us;      /* the Conductor's own time turning the decode node's reply into
                             * the PrefillAssign (its first token's event carries it) */
    struct ty_stoptext tx;  /* text of the relayed tokens, as ty_engine_generate makes it */
    /* a pipelined prefill (pipeline.c): the PrefillAssigns of its stages before the last
     * (pnode) still open, the nodes of the group (pnode last) */
    uint8_t n_stage_calls, n_group;
    struct ty__cnode *group[TY__PIPELINE_MAX];
};

/* The live scheduler (placement.c): ty_sched_t fed from registrations, heartbeats (decode
 * load, KV block events, timing samples) and the requests' lifecycle. */
struct ty__sample_ring {
    struct ty_sched_sample *v;
    uint64_t *t;                    /* when each came (ty_clock_us): stale ones expire */
    struct ty_sched_sample *scratch; /* the live samples in one piece, for a fit */
    uint32_t cap, len, head, fresh; /* fresh: added since the last refit */
    ty_metrics_child_t *count;
};

/* The most recent finished requests' predicted / measured TTFT or TBT (GET /status). */
struct ty__ratio_ring {
    double v[64];
    uint32_t n, head;
    uint64_t count;
};

struct ty__place {
    ty_sched_t *s;
    bool refit;
    uint64_t max_age_us;   /* cost.refit_max_age (0: none) */
    uint64_t probe_us;     /* cost.probe_interval (0: no probes) */
    bool retry_after_only; /* ty_conductor_opts.retry_after_only */
    uint32_t block_tokens; /* B of the prefill nodes (0 until the first registered) */
    char kv_dtype[8];      /* KV element type of the nodes ("" until the first registered) */
    bool cost_auto;        /* the cost model is the auto (CPU) profile, made for f32 KV */
    uint64_t hash_seed;
    uint32_t expected_output;
    char class_names[TY_SCHED_MAX_CLASSES][64]; /* the model's SLO classes, in slo: order */
    char model_name[256];  /* picks the SLO entry of scheduler.models (init and reload) */
    struct ty__sample_ring prefill, decode;
    uint64_t *hashes; /* scratch of one pick */
    size_t cap_hashes;
    /* metrics (NULL without a registry) */
    /* per SLO class: tycho_scheduler_decisions_total{class,result}, the TTFT and TBT
     * requests saw (tycho_request_{ttft,tbt}_seconds{class}), whether they met their SLOs
     * (tycho_slo_requests_total{class,slo,result}) and the SLOs in force
     * (tycho_scheduler_slo_seconds{class,slo}); only child pointers (removed as an array) */
    /* the most recent finished requests' measured TTFT (from placement) with what the model
     * needs to predict it again: the median of measured - predicted, under the cost
     * model in use, is the TTFT overhead the scheduler adds (ty_sched_set_ttft_overhead) */
    struct ty__ttft_obs {
        double measured_us, wait_us; /* wait: queue + KV fetch as predicted at placement */
        uint32_t prompt, cached;
    } ttft_obs[64];
    uint32_t n_obs, head_obs, fresh_obs;
    ty_metrics_child_t *ttft_overhead; /* tycho_scheduler_ttft_overhead_seconds */
    ty_metrics_family_t *class_fam[5];
    struct ty__class_metrics {
        ty_metrics_child_t *decisions[TY_SCHED_REJECT_NO_NODE + 1];
        ty_metrics_child_t *ttft, *tbt;
        ty_metrics_child_t *slo[2][2]; /* [ttft, tbt][met, missed] */
        ty_metrics_child_t *slo_s[2];  /* the SLO in force: ttft, tbt */
    } cm[TY_SCHED_MAX_CLASSES];
    ty_metrics_child_t *prompt_blocks, *cached_blocks, *index_blocks, *decode_over_slo;
    ty_metrics_child_t *over_slo; /* admitted although predicted over the TTFT SLO (idle) */
    ty_metrics_child_t *coef[2][3];
    ty_metrics_child_t *predicted_ttft;
    /* predicted / measured per finished request, [ttft, tbt]: the histograms
     * tycho_scheduler_prediction_ratio{slo} and the latest 64 of each */
    ty_metrics_child_t *ratio_hist[2];
    struct ty__ratio_ring ratio[2];
    ty_metrics_child_t *probes[2]; /* tycho_scheduler_probes_total{stage}: prefill, decode */
    /* planned vs used prefix blocks per source (local, pool, peer), from the prefill nodes'
     * replies: tycho_prefix_{planned,used}_blocks_total{source}, tycho_prefix_used_ratio
     * {source}; the counts for GET /status */
    uint64_t plan_blocks[3], used_blocks[3], plan_failed, plan_replies;
    ty_metrics_child_t *m_plan[3], *m_used[3], *m_ratio[3], *m_failed;
    uint64_t n_probes;
    struct ty__pool *pool; /* the KV pool's blocks (pool_index.c); NULL: no pool */
};

struct ty_conductor {
    struct ty_conductor_opts o;
    struct ty__place place;
    const ty_tokenizer_t *tok;
    ty_rpc_server_t *srv;
    uv_timer_t tick;
    struct ty__cnode *nodes[TY_CONDUCTOR_MAX_NODES];
    size_t n_nodes;
    struct ty__creq *reqs;
    uint64_t next_rid, next_session;
    uint64_t started_ms;
    bool closing;
    int n_closing;
    void (*close_cb)(void *);
    void *close_arg;
    /* tycho_node_*: up, kv_usage, queued, running, KV pool blocks {read, written}, errors,
     * preemptions, breaker state, failed requests */
    ty_metrics_family_t *node_fam[9];
    ty_metrics_child_t *replaced; /* tycho_requests_replaced_total (NULL: no registry) */
    ty_metrics_child_t *prefill_retries; /* tycho_prefill_retries_total (NULL: no registry) */
    uint64_t preemptions; /* decode nodes' preemptions since this Conductor started */
    ty_metrics_child_t *name_conflicts; /* registrations refused: the name is held (or NULL) */
    ty_metrics_child_t *auth_failures;  /* the process's failed cluster handshakes (or NULL) */
    uint64_t auth_seen;
    uint64_t pipelined; /* requests prefilled through a pipeline group */
    struct { /* the cost model's threshold (pipeline.c), kept until the model or chunk change */
        struct ty_sched_cost cost;
        uint32_t chunk;
        uint64_t value;
        bool valid;
    } cpp_threshold;
    ty_metrics_child_t *m_pipelined; /* tycho_requests_pipelined_total (NULL: no registry) */
};

/* registry.c */
int ty__conductor_registry_start(ty_conductor_t *c);
/* The alive node of `role` with the fewest requests in flight, or NULL; _except: other than
 * `except` (NULL: any). */
struct ty__cnode *ty__conductor_pick(ty_conductor_t *c, int role);
struct ty__cnode *ty__conductor_pick_except(ty_conductor_t *c, int role,
                                          const struct ty__cnode *except);
/* Mark `n` dead: fail its requests, close its connection. */
void ty__conductor_node_down(ty_conductor_t *c, struct ty__cnode *n, const char *why);

/* pipeline.c: chunked pipeline parallelism. The prompt length from which a prompt is
 * pipelined (pipeline.threshold, else the cost model's for pnode's chunk; 0: never). */
uint64_t ty__pipeline_threshold(ty_conductor_t *c, const struct ty__cnode *pnode);
/* Whether r's prefill goes through a group: its nodes (stage order, r->pnode last) in group
 * and each one's PipelineStage in st (both TY__PIPELINE_MAX long); returns the group's size,
 * 0 for one node (pipelining off, a prompt under the threshold or within one chunk, too few
 * usable prefill nodes, a prefill sent again). */
uint32_t ty__pipeline_group(ty_conductor_t *c, const struct ty__creq *r,
                            struct ty__cnode **group, Tycho__V1__PipelineStage *st);
/* Before a placement: the scheduler's pipeline settings (ty_sched_set_cpp) as the groups will
 * be formed now (the stages, the least-loaded prefill node's chunk, the threshold in force),
 * so that it predicts a pipelined prompt's prefill as the pipeline's. */
void ty__pipeline_sync(ty_conductor_t *c);

/* breaker.c: failure detection by outcome (ty_conductor_opts.node_answer_timeout_ms). */
/* A node (re)registered: closed, no failures. */
void ty__breaker_reset(ty_conductor_t *c, struct ty__cnode *n);
/* May a request be placed on n outside the scheduler (a prefill moved, a retry)? */
bool ty__breaker_allows(const struct ty__cnode *n);
/* A request was placed on n: a half-open node's probe is now out (no more until it ends). */
void ty__breaker_placed(ty_conductor_t *c, struct ty__cnode *n);
/* The node answered one of its requests / failed one (`what` says how, for the log). */
void ty__breaker_ok(ty_conductor_t *c, struct ty__cnode *n);
void ty__breaker_failed(ty_conductor_t *c, struct ty__cnode *n, const char *what);
/* While `hold`, n is out of the scheduler's choice whatever its breaker says (a request's
 * retry avoiding the node that failed it); then back as its breaker says. */
void ty__breaker_avoid(ty_conductor_t *c, struct ty__cnode *n, bool hold);
/* On the tick: open breakers whose time is up turn half open (one probe may go). */
void ty__breaker_tick(ty_conductor_t *c, uint64_t now_ms);

/* placement.c: every call on the loop thread. */
int ty__place_init(ty_conductor_t *c, const struct ty_conductor_opts *o);
void ty__place_fini(ty_conductor_t *c);
/* A node registered: checks it fits (prefill nodes share one block size; `why` says what is
 * wrong) and adds it to the scheduler. */
int ty__place_node_up(ty_conductor_t *c, struct ty__cnode *n, char *why, size_t cap);
void ty__place_node_down(ty_conductor_t *c, struct ty__cnode *n);
void ty__place_heartbeat(ty_conductor_t *c, struct ty__cnode *n, const Tycho__V1__Heartbeat *m);
/* remote.c: a prefill node's Heartbeat.prefill_progress: each of its requests whose prompt
 * advanced since the last report gets a later KV deadline, and its decode node a longer wait.
 * Loop thread. */
void ty__conductor_progress(ty_conductor_t *c, struct ty__cnode *n, const Tycho__V1__Heartbeat *m);
/* The SLO class index of a class name (NULL, "auto" or unknown: 0). */
uint32_t ty__place_class(const ty_conductor_t *c, const char *name);
/* The class `name` names exactly (no "auto", no fallback): 0 with *k set, or TY_ENOTFOUND with
 * a message for the client in why (the classes there are). */
int ty__place_class_find(const ty_conductor_t *c, const char *name, uint32_t *k, char *why,
                         size_t cap);
/* Choose the prefill and decode nodes of r (r->pnode, r->dnode). Returns 0, TY_EREJECTED with
 * *rej filled (an SLO would be missed, and r is not due as a probe of a silent node; never
 * when `admitted`: r was accepted already),
 * TY_EUNAVAIL (no node) or TY_ENOMEM. */
int ty__place_pick(ty_conductor_t *c, struct ty__creq *r, struct ty_serve_reject *rej,
                   bool admitted);
/* r->pnode was replaced by another prefill node (`from`, the scheduler's choice, died before
 * r was sent to it): its queue and block credit move off `from`. */
void ty__place_moved(ty_conductor_t *c, struct ty__creq *r, struct ty__cnode *from);
/* r's prefill finished on r->pnode: its KV is at the decode node (the prefill node's reply,
 * or the first token chunk from the decode node, whichever comes first; once). */
void ty__place_prefilled(ty_conductor_t *c, struct ty__creq *r);
/* r finished (natural: EOS, length or a stop string), failed or was cancelled. */
void ty__place_done(ty_conductor_t *c, struct ty__creq *r, bool natural);
/* r's prefill node replied with what it reused (PrefillAssignReply): compared with r's plan
 * (planned / used counters per source). */
void ty__place_reused(ty_conductor_t *c, const struct ty__creq *r,
                      const Tycho__V1__PrefillAssignReply *m);
/* The names of the prefix sources, in the counters' order: "local", "pool", "peer". */
extern const char *const ty__prefix_source_names[3];
/* r finished naturally: its TTFT and mean TBT as the Conductor saw them, against its class's
 * SLOs (metrics). */
void ty__place_observe(ty_conductor_t *c, const struct ty__creq *r);

/* pool_index.c: loop thread. start: follow the pool of master `master` (the scheduler then
 * plans prefixes fetched from it); tick: apply its events; stop: NULL-safe. */
int ty__pool_start(ty_conductor_t *c, const char *master, ty_metrics_registry_t *reg);
void ty__pool_tick(ty_conductor_t *c);
void ty__pool_stop(ty_conductor_t *c);
/* The pool's master address (NULL: no pool) and whether its block events are followed now. */
const char *ty__pool_master(const ty_conductor_t *c);
bool ty__pool_following(ty_conductor_t *c);

/* The median of the latest predicted / measured ratios (k 0: TTFT, 1: TBT); NAN: none yet. */
double ty__place_ratio_median(const struct ty__place *p, int k);

/* status.c: the Conductor's members of GET /status (ty_serve_backend_i.status_json). */
char *ty__conductor_status_json(void *ctx);

/* remote.c */
extern const struct ty_serve_backend_i ty__conductor_backend_iface;
/* Fail every unfinished request that depends on node `n` (error `err`). */
void ty__conductor_fail_node(ty_conductor_t *c, struct ty__cnode *n, int err, const char *why);
void ty__conductor_fail_all(ty_conductor_t *c, int err);
/* A node registered / the tick: dispatch or expire requests that wait for a first node, and
 * fail those whose decode node did not answer their DecodeAssign in time. */
void ty__conductor_retry_waiting(ty_conductor_t *c);

#endif
