/* The prefill node (tycho/prefill.h). The loop thread validates PrefillAssign (the KV
 * destination's page ids, bases and stride: take_destination) and Cancel and queues jobs; the
 * worker thread hands them to the engine's batcher (tycho/batcher.h), which runs the queued
 * prompts together in forward calls of the engine's max_batch_tokens (a long prompt over
 * several calls that shorter prompts join; up to opts.max_batch prompts a call; a short prompt
 * passes a long one queued before it). On admission a job's destination is checked against
 * the decode node's registered memory (dest_check_regions); the batcher's per-layer hook posts
 * each prompt's finished pages to k_base/v_base + page id * stride on its decode node; the
 * first token is sampled by the batcher (max_tokens 1); when a prompt ends the worker waits for
 * its writes, sends KvReady, hands its new blocks to the KV pool, and posts the result back to
 * the loop through a mailbox. A job with PrefillAssign.stage is one stage of a pipeline group
 * (chunked pipeline parallelism): the batcher computes its layer range only, hidden states
 * come from the previous stage and go to the next one through stage.c, and its KvReady names
 * its layers (only the last stage's carries the first token). */
#include "tycho/prefill.h"
#include "peers-impl.h"
#include "stage-impl.h"

#include "tycho/node.h"
#include "tycho/node_kvstore.h"

#include "tycho/batcher.h"

#include "tycho/clock.h"
#include "tycho/config.h"
#include "tycho/proto.h"
#include "tycho/errors.h"
#include "tycho/hash.h"
#include "tycho/log.h"
#include "tycho/rpc.h"
#include "tycho.pb-c.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_BATCH 64 /* prompts in one forward call, at most (opts.max_batch) */
#define PIN_LEASE_MS 10000 /* a pin for a peer's read lapses after this (the peer gone) */

struct pjob {
    struct pjob *next;
    ty_prefill_t *p;
    ty_rpc_call_t *call;
    uint64_t rid;
    uint32_t attempt; /* PrefillAssign.attempt, echoed in KvReady */
    char cid[TY_CLIENT_ID_MAX + 1]; /* the client's request id: log lines */
    uint32_t *tokens;
    uint32_t n;
    char segment[TY_XFER_NAME_MAX + 1];
    /* the KV destination: page i of the prompt goes, for layer l, to k_base[l] +
     * dest_pages[i] * stride (V: v_base[l]); validated by take_destination (and against the
     * segment's regions by dest_check_regions once the segment is open) */
    uint32_t n_dest_pages;
    uint32_t *dest_pages;      /* (n_dest_pages) the decode node's page ids */
    uint32_t min_page, max_page; /* of dest_pages */
    uint64_t *k_base, *v_base; /* (n_layers) remote addresses of page 0 */
    uint64_t stride;
    uint32_t fence;   /* ty_kv_fence of the destination's fence and this attempt */
    bool test_late;   /* the test hook stopped the process in it: cancel is not seen */
    char why[TY_XFER_NAME_MAX + 160]; /* what failed, for its error ("": rc says) */
    struct ty_sampling_params sp;
    struct ty_gen_params ends; /* stop tokens, min_tokens: no EOS / stop as the first token */
    struct ty_gen_grammar grammar; /* structured output (kind 0: none), in grammar_schema */
    char *grammar_schema;
    atomic_bool cancelled;
    struct pjob *jnext; /* ty_prefill.jobs, under mu */
    /* worker only */
    ty_breq_t *r;       /* in the batcher; NULL before and after */
    ty_xfer_segment_t *seg;
    ty_xfer_batch_t *batch;
    uint32_t pages_sent;
    uint64_t t_first_write; /* us: the first layer's writes submitted; 0: none yet */
    int xfer_err;
    bool admitted;      /* on_admit ran (it is no longer queued) */
    /* progress, for the heartbeat (ty_prefill_progress, which reads them under mu): prompt
     * tokens computed (0: no chunk yet) and before its first chunk (a reused prefix), its last
     * chunk's time and the time from admission to it; t_admit / t_step: worker only */
    _Atomic uint32_t done, done0;
    _Atomic uint64_t step_us, busy_us;
    uint64_t t_admit, t_step;
    /* result */
    int rc;
    uint32_t first_token;
    struct ty_sample first; /* the first token with its logprobs (sampler output) */
    uint32_t cached;        /* prompt tokens found in the KV cache (not computed) */
    uint32_t pool_tokens;   /* of which read from the KV pool */
    size_t seg_slot;        /* worker: its segment's slot in ty_prefill.segs (pinned) */
    bool seg_bad;           /* worker: the segment failed: dropped once the job is done */
    /* The Conductor's plan (PrefillAssign.cached_prefix; has_plan false: an older Conductor,
     * the node looks the pool up itself): blocks [0, plan_local) from the page cache,
     * [plan_local, plan_blocks) from plan_src (Tycho__V1__PrefixSource) */
    bool has_plan, pool_planned;
    int plan_src;
    uint32_t plan_local, plan_blocks;
    /* plan_src PEER: the peer's pin of our blocks (KvFetchReply), taken before the job was
     * queued: pin_n blocks at its pages pin_pages, per layer at pin_k / pin_v + page * stride
     * in segment peer_seg; valid until pin_t0 + pin_lease_ms (our clock: the peer's lease
     * started later) */
    char peer_addr[128];
    char peer_seg[TY_XFER_NAME_MAX + 1];
    uint64_t pin, pin_t0_us, pin_stride;
    uint32_t pin_n, pin_lease_ms;
    uint32_t *pin_pages;
    uint64_t *pin_k, *pin_v;
    atomic_bool pin_released;
    /* what the prompt reused, in blocks: own cache, pool, peer; planned remote blocks that
     * did not arrive (computed instead) */
    uint32_t used_local, used_pool, used_peer, fetch_failed;
    /* a pipeline stage (PrefillAssign.stage): layers [lo, hi) of the prompt; hidden states
     * from the previous stage (lo > 0: hin_next is the next prompt token they are due for)
     * and to next_addr (not the last stage) */
    bool staged;
    uint32_t lo, hi, stage, n_stages, hin_next;
    char next_addr[128];
};

/* A KvFetch for the worker: pin the leading blocks of `tokens` for a peer's read, or release
 * pin `release`. */
struct pin_cmd {
    struct pin_cmd *next;
    ty_prefill_t *p;
    ty_rpc_call_t *call;   /* NULL: a release (answered at once) */
    uint64_t rid, release;
    uint32_t *tokens;
    uint32_t n_tokens, n_blocks;
    /* the worker's answer */
    uint64_t pin;
    uint32_t n_pinned;
    uint32_t *pages;
};

/* Blocks of our page cache a peer reads (worker): attached to a sequence of their own, so
 * no eviction takes their pages until the peer releases the pin or its lease lapses. */
struct pin {
    uint64_t id, expires_ms;
    ty_kvseq_t *seq;
};

struct ty_prefill {
    struct ty_prefill_opts o;
    ty_node_service_t *svc; /* RPC server, worker thread, mailbox (tycho/node.h) */
    ty_rpc_mailbox_t *mb;   /* the service's */
    const ty_model_t *m;
    uint32_t n_layers, B, V;
    /* test hook TYCHO_TEST_STOP_AFTER_LAYER=N: after the first job's layer N writes, the
     * process stops itself (SIGSTOP: a hang) and, resumed, writes that job's other layers as a
     * node would that never learnt it was given up (the decode node's fence must refuse them) */
    int32_t test_stop_layer;
    bool test_stopped;
    /* test hook TYCHO_TEST_SLOW_CHUNK_MS=N: every chunk of a prompt takes N ms longer (a node
     * far slower than the Conductor's cost model predicts) */
    uint32_t test_slow_chunk_ms;
    uint32_t eog[TY_SAMPLE_MAX_BAN]; /* the model's end-of-generation ids (min_tokens) */
    size_t n_eog;
    size_t page_bytes;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct pjob *queue, **tail;          /* under mu: not yet handed to the worker */
    struct pjob *jobs;                   /* under mu: handed to the worker, not yet done (the
                                          * loop marks them cancelled) */
    uint32_t n_queued, n_running;        /* under mu: waiting to start / started */
    uint64_t queued_tokens;
    bool stop;
    ty_batcher_t *b; /* worker */
    /* The pool belongs to the worker (tycho/kvpool.h): it publishes its use here for the
     * loop thread's heartbeat (ty_prefill_load) instead of the loop reading the pool. */
    _Atomic uint32_t pages_used;
    struct ty_node_kvstore *kvstore; /* NULL: no KV pool */
    struct {
        char name[TY_XFER_NAME_MAX + 1];
        ty_xfer_segment_t *seg;
        uint32_t pins; /* jobs of the running batch using it: never evicted while > 0 */
    } segs[32]; /* worker: open decode-node (and peer) segments, reused across requests */
    /* peer reads: KvFetch commands for the worker (under mu), the pins it holds (worker) */
    struct pin_cmd *pin_q, **pin_tail;
    struct pin *pins;
    size_t n_pins, cap_pins;
    uint64_t next_pin;
    /* our page arrays, for KvFetchReply (fixed from start on: read by the loop) */
    uint64_t *own_k, *own_v;
    uint32_t pool_pages;
    struct ty__peers peers; /* loop: RPC clients to peer prefill nodes (KvFetch) */
    _Atomic uint64_t peer_read_blocks, peer_failed_blocks, pins_taken, pins_refused;
    ty__stage_hub_t *hub; /* pipeline stages' hidden states in and out (stage.c) */
    void (*close_cb)(void *);
    void *close_arg;
};

static void peer_release(ty_prefill_t *p, const char *addr, uint64_t pin);

static void job_free(struct pjob *j)
{
    if (!j)
        return;
    if (j->pin && !j->p->stop && /* (stopping: it lapses) */
        !atomic_exchange(&j->pin_released, true)) /* never read: let it go */
        peer_release(j->p, j->peer_addr, j->pin);
    free(j->pin_pages);
    free(j->pin_k);
    free(j->tokens);
    free(j->grammar_schema);
    free(j->dest_pages);
    free(j->k_base);
    free(j);
}

/* ---- worker ------------------------------------------------------------------------------- */

/* Publish the pool's use for ty_prefill_load. Worker only. */
static void publish_pages(ty_prefill_t *p)
{
    atomic_store_explicit(&p->pages_used, ty_kvpool_pages_used(ty_engine_pool(p->o.engine)),
                          memory_order_relaxed);
}

/* A chunk of j's prompt is through all its layers: tokens [from, end) computed. Worker only. */
static void note_progress(struct pjob *j, uint32_t from, uint32_t end)
{
    uint64_t now = ty_clock_us();
    if (!atomic_load_explicit(&j->done, memory_order_relaxed))
        atomic_store_explicit(&j->done0, from, memory_order_relaxed);
    atomic_store_explicit(&j->step_us, now - j->t_step, memory_order_relaxed);
    atomic_store_explicit(&j->busy_us, now - j->t_admit, memory_order_relaxed);
    atomic_store_explicit(&j->done, end, memory_order_relaxed);
    j->t_step = now;
}

/* Writes of this layer's K and V for pages [i0, i1): a run of pages that lie one after the
 * other here and at the destination is one write each for K and V, and the layer's writes go
 * in one submission (for the local transport's device copies one completion, not one per
 * page). Returns 0 or the first error. */
static int write_layer(ty_prefill_t *p, struct pjob *j, const uint32_t *pages, uint32_t layer,
                       uint32_t i0, uint32_t i1)
{
    ty_kvpool_t *pool = ty_engine_pool(p->o.engine);
    struct ty_xfer_request rq[128];
    uint32_t n = 0;
    int rc = 0;
    for (uint32_t i = i0; i < i1 && !rc; i++) {
        uint64_t at = (uint64_t)j->dest_pages[i] * j->stride; /* no overflow: take_destination */
        uint8_t *k = ty_kvpool_k(pool, layer, pages[i]), *v = ty_kvpool_v(pool, layer, pages[i]);
        uint64_t rk = j->k_base[layer] + at, rv = j->v_base[layer] + at;
        if (n && k == (uint8_t *)rq[n - 2].local + rq[n - 2].len &&
            rk == rq[n - 2].remote + rq[n - 2].len &&
            v == (uint8_t *)rq[n - 1].local + rq[n - 1].len &&
            rv == rq[n - 1].remote + rq[n - 1].len) {
            rq[n - 2].len += p->page_bytes; /* the run goes on */
            rq[n - 1].len += p->page_bytes;
            continue;
        }
        if (n == sizeof(rq) / sizeof(rq[0])) {
            rc = ty_xfer_batch_submit(j->batch, rq, n);
            n = 0;
        }
        rq[n++] = (struct ty_xfer_request){TY_XFER_OP_WRITE, k, j->seg, rk, p->page_bytes};
        rq[n++] = (struct ty_xfer_request){TY_XFER_OP_WRITE, v, j->seg, rv, p->page_bytes};
    }
    return rc || !n ? rc : ty_xfer_batch_submit(j->batch, rq, n);
}

/* After layer `layer` of a forward call: write the pages of r's prompt this call completed
 * (all pages after the prompt's last piece) to its decode node. Pages complete in order, so
 * each is sent once per layer. */
static void on_layer(void *arg, ty_breq_t *r, const struct ty_batch_seq *piece, uint32_t layer)
{
    ty_prefill_t *p = arg;
    struct pjob *j = ty_breq_user(r);
    if (j->xfer_err || (atomic_load(&j->cancelled) && !j->test_late))
        return;
    uint32_t end = ty_kvseq_n_tokens(piece->seq) + piece->n;
    uint32_t p1 = end == j->n ? (end + p->B - 1) / p->B : end / p->B;
    const uint32_t *pages = ty_kvseq_pages(piece->seq);
    if (!j->t_first_write && j->pages_sent < p1)
        j->t_first_write = ty_clock_us();
    if (j->pages_sent < p1)
        j->xfer_err = write_layer(p, j, pages, layer, j->pages_sent, p1);
    if (layer + 1 == (j->staged ? j->hi : p->n_layers) && !j->xfer_err) {
        j->pages_sent = p1;
        if (p->test_slow_chunk_ms)
            nanosleep(&(struct timespec){.tv_sec = p->test_slow_chunk_ms / 1000,
                                         .tv_nsec = p->test_slow_chunk_ms % 1000 * 1000000L},
                      NULL);
        note_progress(j, ty_kvseq_n_tokens(piece->seq), end);
    }
    if ((int32_t)layer == p->test_stop_layer && !p->test_stopped) {
        p->test_stopped = j->test_late = true;
        TY_LOG_WARN("prefill", "test hook TYCHO_TEST_STOP_AFTER_LAYER: request %llu stops the "
                    "process after layer %u", (unsigned long long)j->rid, layer);
        raise(SIGSTOP);
    }
}

static int notify_ready(ty_prefill_t *p, struct pjob *j, uint64_t bytes, uint64_t us)
{
    Tycho__V1__KvReady m = TYCHO__V1__KV_READY__INIT;
    m.transport = (char *)ty_xfer_segment_transport(j->seg);
    m.kv_bytes = bytes;
    m.transfer_us = us;
    m.request_id = j->rid;
    m.all_layers = !j->staged;
    m.n_tokens = j->n;
    m.first_token = j->first_token;
    m.has_first_token = !j->staged || j->hi == p->n_layers; /* a group's last stage samples */
    m.layer_begin = j->staged ? j->lo : 0;
    m.layer_end = j->staged ? j->hi : 0;
    m.cached_tokens = j->cached;
    m.attempt = j->attempt;
    struct ty_pb_logprob lp;
    if (j->sp.logprobs || j->sp.n_logprobs > 0) { /* the decode node streams token 1 */
        ty_pb_logprob_pack(&j->first, &lp);
        m.first_logprob = &lp.lp;
    }
    uint8_t buf[TY_XFER_NOTIFY_MAX];
    TY_ASSERT(tycho__v1__kv_ready__get_packed_size(&m) <= sizeof(buf));
    size_t len = tycho__v1__kv_ready__pack(&m, buf);
    return ty_xfer_notify_send(p->o.xfer, j->seg, buf, len);
}

/* The open segment `name` (opened once, kept for later requests; when all slots are taken
 * one not pinned by the running batch is recycled round-robin, TY_EBUSY if every one is),
 * pinned until segment_unpin(). */
static int segment_get(ty_prefill_t *p, const char *name, ty_xfer_segment_t **out, size_t *slot)
{
    static const size_t n = sizeof(p->segs) / sizeof(p->segs[0]);
    size_t free_slot = n;
    for (size_t i = 0; i < n; i++) {
        if (p->segs[i].seg && !strcmp(p->segs[i].name, name)) {
            *out = p->segs[i].seg;
            *slot = i;
            p->segs[i].pins++;
            return 0;
        }
        if (!p->segs[i].seg && free_slot == n)
            free_slot = i;
    }
    if (free_slot == n) {
        static size_t victim;
        for (size_t k = 0; k < n && free_slot == n; k++, victim++)
            if (!p->segs[victim % n].pins)
                free_slot = victim % n;
        if (free_slot == n)
            return TY_EBUSY; /* every slot serves the running batch */
        victim++;
        ty_xfer_segment_close(p->o.xfer, p->segs[free_slot].seg);
        p->segs[free_slot].seg = NULL;
    }
    int rc = ty_xfer_segment_open(p->o.xfer, name, out);
    if (rc)
        return rc;
    snprintf(p->segs[free_slot].name, sizeof(p->segs[free_slot].name), "%s", name);
    p->segs[free_slot].seg = *out;
    p->segs[free_slot].pins = 1;
    *slot = free_slot;
    return 0;
}

/* The batch is done with the job's segment; one that failed is forgotten (its node may have
 * restarted at the same address) once no other job of the batch uses it. */
static void segment_put(ty_prefill_t *p, size_t slot, bool bad)
{
    TY_ASSERT(p->segs[slot].seg && p->segs[slot].pins > 0);
    if (bad)
        p->segs[slot].name[0] = 0; /* no later job finds it by name */
    if (--p->segs[slot].pins == 0 && !p->segs[slot].name[0]) {
        ty_xfer_segment_close(p->o.xfer, p->segs[slot].seg);
        p->segs[slot].seg = NULL;
    }
}

static void segment_unpin(ty_prefill_t *p, struct pjob *j)
{
    if (!j->seg)
        return;
    TY_ASSERT(p->segs[j->seg_slot].seg == j->seg);
    segment_put(p, j->seg_slot, j->seg_bad);
    j->seg = NULL;
}

/* Pages a prompt needs at most (nothing of it cached). */
static uint32_t pages_of(const ty_prefill_t *p, const struct pjob *j)
{
    return (j->n + p->B - 1) / p->B;
}

/* Whether [at, at + len) lies inside one of the regions. */
static bool in_regions(const struct ty_xfer_region_info *rg, size_t n, uint64_t at, uint64_t len)
{
    for (size_t i = 0; i < n; i++)
        if (at >= rg[i].addr && at - rg[i].addr <= rg[i].len &&
            len <= rg[i].len - (at - rg[i].addr))
            return true;
    return false;
}

/* Every page of the destination, every layer, K and V, lies in memory the decode node
 * registered (as far as the open segment knows its regions; none known: not checked, the
 * decode node's engine refuses writes outside them anyway). Pages are spans of one array per
 * layer, so the span from the lowest page id to the highest must lie in one region. Worker. */
static int dest_check_regions(ty_prefill_t *p, struct pjob *j)
{
    size_t n = 0;
    ty_xfer_segment_regions(j->seg, NULL, 0, &n);
    if (!n)
        return 0;
    struct ty_xfer_region_info *rg = malloc(n * sizeof(*rg));
    if (!rg)
        return TY_ENOMEM;
    ty_xfer_segment_regions(j->seg, rg, n, &n); /* n may have shrunk meanwhile */
    uint64_t lo = (uint64_t)j->min_page * j->stride;
    uint64_t len = (uint64_t)(j->max_page - j->min_page) * j->stride + p->page_bytes;
    int rc = 0;
    for (uint32_t l = 0; l < p->n_layers && !rc; l++) {
        for (int v = 0; v < 2 && !rc; v++) {
            uint64_t at = (v ? j->v_base[l] : j->k_base[l]) + lo;
            if (!in_regions(rg, n, at, len)) {
                snprintf(j->why, sizeof(j->why), "kv_destination: layer %u %c pages %u..%u "
                         "([0x%llx, +%llu)) are outside segment %s's registered memory", l,
                         v ? 'V' : 'K', j->min_page, j->max_page, (unsigned long long)at,
                         (unsigned long long)len, j->segment);
                rc = TY_EOUTOFRANGE;
            }
        }
    }
    free(rg);
    if (rc)
        TY_LOG_WARN("prefill", "request %llu [%s]: %s", (unsigned long long)j->rid, j->cid, j->why);
    return rc;
}

/* Read blocks [have, want) of j's prompt from the peer's pinned pages into seq's pages
 * (reserved here) with the transfer engine, and commit them. Returns 0 or the error that made
 * them fail (then nothing is committed: the prompt computes them). Worker. */
static int peer_read_blocks(ty_prefill_t *p, struct pjob *j, ty_kvseq_t *seq, uint32_t have,
                            uint32_t want, uint64_t *bytes)
{
    ty_kvpool_t *pool = ty_engine_pool(p->o.engine);
    uint64_t t0 = ty_clock_us();
    if (t0 - j->pin_t0_us + 100000 >= (uint64_t)j->pin_lease_ms * 1000)
        return TY_ETIMEDOUT; /* the pin may have lapsed while the job queued */
    ty_xfer_segment_t *seg;
    size_t slot;
    int rc = segment_get(p, j->peer_seg, &seg, &slot);
    if (rc)
        return rc;
    ty_xfer_batch_t *b = NULL;
    if ((rc = ty_kvpool_seq_reserve(pool, seq, (want - have) * p->B)) ||
        (rc = ty_xfer_batch_new(p->o.xfer, (size_t)(want - have) * p->n_layers * 2, &b))) {
        segment_put(p, slot, false);
        return rc;
    }
    const uint32_t *pages = ty_kvseq_pages(seq);
    for (uint32_t i = have; i < want && !rc; i++) {
        uint64_t at = (uint64_t)j->pin_pages[i] * j->pin_stride;
        for (uint32_t l = 0; l < p->n_layers && !rc; l++) {
            struct ty_xfer_request rq[2] = {
                {TY_XFER_OP_READ, ty_kvpool_k(pool, l, pages[i]), seg, j->pin_k[l] + at,
                 p->page_bytes},
                {TY_XFER_OP_READ, ty_kvpool_v(pool, l, pages[i]), seg, j->pin_v[l] + at,
                 p->page_bytes}};
            rc = ty_xfer_batch_submit(b, rq, 2);
        }
    }
    int wrc = ty_xfer_batch_wait(b, p->o.peer_timeout_ms);
    if (!rc)
        rc = wrc;
    while (ty_xfer_batch_free(b) == TY_EBUSY) /* no byte may land after we move on */
        ty_xfer_batch_wait(b, 1000);
    /* the peer's lease must have covered the whole read, else its pages may have changed */
    if (!rc && ty_clock_us() - j->pin_t0_us >= (uint64_t)j->pin_lease_ms * 1000)
        rc = TY_ETIMEDOUT;
    if (!rc)
        rc = ty_kvpool_seq_commit(pool, seq, j->tokens + (size_t)have * p->B, (want - have) * p->B);
    if (!rc) {
        *bytes = (uint64_t)(want - have) * p->n_layers * 2 * p->page_bytes;
        ty_node_metrics_peer_read(p->o.metrics, ty_xfer_segment_transport(seg), *bytes,
                                  ty_clock_us() - t0);
    }
    segment_put(p, slot, rc && rc != TY_ENOCAPACITY);
    return rc;
}

/* The planned peer blocks that follow what the page cache gave (the peer pinned them before
 * the job was queued), then the pin goes back. Failures are counted and computed. Worker. */
static void peer_fetch(ty_prefill_t *p, struct pjob *j, ty_kvseq_t *seq)
{
    uint32_t have = ty_kvseq_n_tokens(seq) / p->B, cap = (j->n - 1) / p->B;
    uint32_t planned = j->plan_blocks < cap ? j->plan_blocks : cap;
    uint32_t want = j->pin_n < planned ? j->pin_n : planned;
    uint64_t bytes = 0;
    int rc = 0;
    if (want > have && (rc = peer_read_blocks(p, j, seq, have, want, &bytes)))
        want = have;
    if (want > have)
        j->used_peer = want - have;
    uint32_t failed = planned > have + j->used_peer ? planned - have - j->used_peer : 0;
    j->fetch_failed += failed;
    atomic_fetch_add(&p->peer_read_blocks, j->used_peer);
    atomic_fetch_add(&p->peer_failed_blocks, failed);
    ty_node_metrics_peer_blocks(p->o.metrics, j->used_peer, failed);
    if (failed)
        TY_LOG_DEBUG("prefill",
                     "request %llu [%s]: %u of %u planned blocks from peer %s not read (%s): "
                     "computed",
                     (unsigned long long)j->rid, j->cid, failed, planned, j->peer_addr,
                     rc ? ty_strerror(rc) : j->pin ? "not pinned there" : "no pin");
    if (j->pin && !atomic_exchange(&j->pin_released, true))
        peer_release(p, j->peer_addr, j->pin); /* (posts to the loop) */
}

/* What the plan says of the prefix (local match already done): the peer's or the pool's
 * blocks; without a plan (an older Conductor) or one made without the pool's contents, the
 * pool is asked for whatever follows. Worker. */
static void fetch_prefix(ty_prefill_t *p, struct pjob *j, ty_breq_t *r)
{
    ty_kvseq_t *seq = ty_breq_seq(r);
    j->used_local = ty_kvseq_n_tokens(seq) / p->B;
    if (j->has_plan && j->plan_src == TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_PEER)
        peer_fetch(p, j, seq);
    uint32_t before = ty_kvseq_n_tokens(seq);
    if (p->kvstore && (!j->has_plan || !j->pool_planned)) {
        j->pool_tokens = ty_node_kvstore_fetch(p->kvstore, seq, j->tokens, j->n, UINT32_MAX);
    } else if (p->kvstore && j->plan_src == TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_POOL) {
        uint32_t cap = (j->n - 1) / p->B;
        uint32_t planned = j->plan_blocks < cap ? j->plan_blocks : cap;
        j->pool_tokens = ty_node_kvstore_fetch(p->kvstore, seq, j->tokens, j->n, planned);
        uint32_t have = before / p->B + j->pool_tokens / p->B;
        if (planned > have) {
            j->fetch_failed += planned - have;
            TY_LOG_DEBUG("prefill", "request %llu [%s]: %u planned blocks not in the KV pool: "
                         "computed", (unsigned long long)j->rid, j->cid, planned - have);
        }
    } else if (j->plan_src == TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_POOL) {
        uint32_t cap = (j->n - 1) / p->B;
        uint32_t planned = j->plan_blocks < cap ? j->plan_blocks : cap;
        if (planned > before / p->B) /* planned from a pool this node does not use */
            j->fetch_failed += planned - before / p->B;
    }
    j->used_pool = j->pool_tokens / p->B;
}

/* r is admitted (batcher hook): its decode node's segment, a write batch, and what the plan
 * (or the KV pool) has of its prompt after the page cache's match, read into its pages. */
static int on_admit(void *arg, ty_breq_t *r)
{
    ty_prefill_t *p = arg;
    struct pjob *j = ty_breq_user(r);
    j->t_admit = j->t_step = ty_clock_us();
    pthread_mutex_lock(&p->mu);
    j->admitted = true;
    p->n_queued--;
    p->n_running++;
    p->queued_tokens -= j->n;
    pthread_mutex_unlock(&p->mu);
    if (atomic_load(&j->cancelled))
        return TY_ECANCELED;
    int rc = segment_get(p, j->segment, &j->seg, &j->seg_slot);
    if (rc) {
        TY_LOG_WARN("prefill", "request %llu [%s]: cannot open segment %s: %s",
                    (unsigned long long)j->rid, j->cid, j->segment, ty_strerror(rc));
        j->seg = NULL;
        return rc;
    }
    if (dest_check_regions(p, j)) {
        /* the decode node may have restarted at the same address with its memory elsewhere:
         * what the open segment knew is stale; open it afresh once and check again */
        TY_LOG_INFO("prefill", "request %llu [%s]: opening segment %s again",
                    (unsigned long long)j->rid, j->cid, j->segment);
        j->seg_bad = true;
        segment_unpin(p, j);
        j->seg_bad = false;
        if ((rc = segment_get(p, j->segment, &j->seg, &j->seg_slot))) {
            j->seg = NULL;
            return rc;
        }
        if ((rc = dest_check_regions(p, j)))
            return rc;
    }
    if ((rc = ty_xfer_batch_new(p->o.xfer, (size_t)p->n_layers * pages_of(p, j) * 2, &j->batch)))
        return rc;
    ty_xfer_batch_set_fence(j->batch, j->fence); /* the decode node takes only this attempt's */
    if (!j->staged) /* a stage's KV is its layers' only: no prefix is reused (private pages) */
        fetch_prefix(p, j, r);
    j->cached = ty_kvseq_n_tokens(ty_breq_seq(r));
    return 0;
}

/* The first token (max_tokens 1): a prompt whose writes failed or that was cancelled fails. */
static int on_token(void *arg, ty_breq_t *r, const struct ty_sample *s, enum ty_finish fin)
{
    struct pjob *j = ty_breq_user(r);
    if (j->xfer_err)
        return j->xfer_err;
    if (atomic_load(&j->cancelled))
        return TY_ECANCELED;
    j->first_token = s->id;
    j->first = *s;
    return fin ? fin : TY_FINISH_LENGTH;
}

/* A stage before the last computed its layers for prompt tokens [first, first + n): their
 * hidden states go to the next stage's node (batcher hook). */
static void on_hidden(void *arg, ty_breq_t *r, const float *rows, uint32_t first, uint32_t n)
{
    ty_prefill_t *p = arg;
    struct pjob *j = ty_breq_user(r);
    int rc = ty__stage_hub_send(p->hub, j->next_addr, j->rid, j->attempt, rows, first, n);
    if (rc && !j->xfer_err)
        j->xfer_err = rc;
}

/* Rows from the previous stage into j's request (ty__stage_hub_take's feed). */
static int stage_feed(void *arg, const float *rows, uint32_t first, uint32_t n)
{
    struct pjob *j = arg;
    (void)first;
    return ty_batcher_stage_input(j->p->b, j->r, rows, n);
}

/* The hidden states that came for the stages past layer 0 among the jobs. Worker. */
static void stage_inputs(ty_prefill_t *p)
{
    pthread_mutex_lock(&p->mu);
    for (struct pjob *j = p->jobs; j; j = j->jnext) {
        if (!j->staged || !j->lo || !j->r || j->xfer_err)
            continue;
        int rc = ty__stage_hub_take(p->hub, j->rid, j->attempt, &j->hin_next, stage_feed, j);
        if (rc) {
            TY_LOG_WARN("prefill", "request %llu [%s]: hidden states of stage %u: %s",
                        (unsigned long long)j->rid, j->cid, j->stage, ty_strerror(rc));
            j->xfer_err = rc;
        }
    }
    pthread_mutex_unlock(&p->mu);
}

static void on_job_done(void *arg);

/* r is done (batcher hook): its writes landed (or failed), KvReady, its new full blocks to the
 * KV pool's writer (after KvReady, off the request's time to first token); the batcher then
 * releases its pages (full blocks stay in the page cache). The result goes to the loop. */
static void on_end(void *arg, ty_breq_t *r, enum ty_finish fin, int rc)
{
    ty_prefill_t *p = arg;
    struct pjob *j = ty_breq_user(r);
    uint64_t t1 = ty_clock_us(), t2 = t1;
    if (j->batch) {
        int wrc = ty_xfer_batch_wait(j->batch, p->o.xfer_timeout_ms);
        if (!rc)
            rc = wrc;
        while (ty_xfer_batch_free(j->batch) == TY_EBUSY)
            ty_xfer_batch_wait(j->batch, 1000);
        j->batch = NULL;
        t2 = ty_clock_us();
        uint32_t layers = j->staged ? j->hi - j->lo : p->n_layers;
        uint64_t bytes = (uint64_t)j->pages_sent * layers * 2 * p->page_bytes;
        uint64_t us = j->t_first_write ? t2 - j->t_first_write : 0;
        if (!rc)
            rc = notify_ready(p, j, bytes, us);
        if (!rc)
            ty_node_metrics_kv(p->o.metrics, true, ty_xfer_segment_transport(j->seg), bytes, us);
        const struct ty_batcher_call *c = ty_batcher_call(p->b);
        TY_LOG_DEBUG("prefill",
                     "request %llu [%s]: %u tokens (%u cached, %u of them from the KV "
                     "pool), forward %llu us in a batch of %u, writes landed +%llu us, KvReady "
                     "+%llu us",
                     (unsigned long long)j->rid, j->cid, j->n, j->cached, j->pool_tokens,
                     (unsigned long long)(c ? c->forward_us : 0), c ? c->n_seqs : 0,
                     (unsigned long long)(t2 - t1), (unsigned long long)(ty_clock_us() - t2));
    }
    if (!rc && p->kvstore && ty_breq_seq(r) && !j->staged) /* (a stage has some layers) */
        ty_node_kvstore_store(p->kvstore, ty_breq_seq(r), j->tokens, j->n, j->cached);
    if (j->staged && j->lo)
        ty__stage_hub_forget(p->hub, j->rid);
    j->seg_bad = j->seg && rc && rc != TY_ECANCELED && rc != TY_ERANGE && rc != TY_ENOCAPACITY;
    segment_unpin(p, j);
    j->rc = rc;
    j->r = NULL;
    if (rc && rc != TY_ECANCELED)
        TY_LOG_WARN("prefill", "request %llu [%s]: %s", (unsigned long long)j->rid, j->cid,
                    ty_strerror(rc));
    pthread_mutex_lock(&p->mu); /* a Cancel never sees a job the loop may already have freed */
    for (struct pjob **pp = &p->jobs; *pp; pp = &(*pp)->jnext) {
        if (*pp == j) {
            *pp = j->jnext;
            break;
        }
    }
    if (j->admitted)
        p->n_running--;
    else {
        p->n_queued--;
        p->queued_tokens -= j->n;
    }
    pthread_mutex_unlock(&p->mu);
    ty_rpc_mailbox_post(p->mb, on_job_done, j); /* open until the worker returned */
}

/* Each successful forward call is one timing sample (the fixed cost is paid once per call,
 * placement.c): the prompts' tokens computed, the cached prefixes, the attention term. */
static void on_forward(void *arg, const struct ty_batcher_call *c)
{
    ty_prefill_t *p = arg;
    publish_pages(p);
    if (c->rc)
        return;
    struct ty_timing_sample ts = {.n_tokens = c->n_tokens, .prefix_tokens = c->prefix,
                                  .batch_size = c->n_seqs, .duration_us = c->forward_us,
                                  .attn_work = c->attn_work};
    ty_timing_ring_push(p->o.timings, &ts);
}

static void on_job_done(void *arg)
{
    struct pjob *j = arg;
    if (j->rc) {
        ty_rpc_call_fail(j->call, j->rc, "prefill of request %llu failed: %s",
                         (unsigned long long)j->rid, j->why[0] ? j->why : ty_strerror(j->rc));
    } else {
        Tycho__V1__PrefillAssignReply r = TYCHO__V1__PREFILL_ASSIGN_REPLY__INIT;
        r.request_id = j->rid;
        r.accepted = true;
        r.has_reuse = true; /* what it reused, for the Conductor's plan-vs-used counters */
        r.local_blocks = j->used_local;
        r.pool_blocks = j->used_pool;
        r.peer_blocks = j->used_peer;
        r.fetch_failed_blocks = j->fetch_failed;
        ty_rpc_call_reply_msg(j->call, (const ProtobufCMessage *)&r);
    }
    job_free(j);
}

/* ---- worker: pins of our blocks for peers' reads ------------------------------------------- */

static void on_pin_done(void *arg);

static void pin_drop(ty_prefill_t *p, size_t i)
{
    ty_kvpool_seq_free(ty_engine_pool(p->o.engine), p->pins[i].seq);
    p->pins[i] = p->pins[--p->n_pins];
}

/* Attach the leading blocks of c's tokens that the page cache holds to a pin of their own
 * (their pages are then held: nothing evicts them under the peer's read). None held: nothing
 * pinned, the peer computes them. */
static void pin_take(ty_prefill_t *p, struct pin_cmd *c)
{
    ty_kvpool_t *pool = ty_engine_pool(p->o.engine);
    ty_kvseq_t *seq = NULL;
    if (p->n_pins == p->cap_pins) {
        size_t cap = p->cap_pins ? 2 * p->cap_pins : 16;
        struct pin *np = realloc(p->pins, cap * sizeof(*np));
        if (!np)
            return;
        p->pins = np;
        p->cap_pins = cap;
    }
    if (ty_kvpool_seq_new(pool, &seq))
        return;
    int got = ty_kvpool_seq_match_prefix(pool, seq, c->tokens, c->n_tokens);
    uint32_t n = got > 0 ? (uint32_t)got / p->B : 0;
    if (n > c->n_blocks)
        n = c->n_blocks;
    c->pages = n ? malloc(n * sizeof(uint32_t)) : NULL;
    if (!n || !c->pages) {
        ty_kvpool_seq_free(pool, seq);
        return;
    }
    memcpy(c->pages, ty_kvseq_pages(seq), n * sizeof(uint32_t));
    c->pin = ++p->next_pin;
    c->n_pinned = n;
    p->pins[p->n_pins++] = (struct pin){.id = c->pin, .seq = seq,
                                        .expires_ms = ty_clock_ms() + PIN_LEASE_MS};
}

/* The KvFetch commands queued for the worker: pins taken (answered through the mailbox) or
 * released; pins past their lease dropped. Returns whether pins are held. Worker. */
static bool pins_run(ty_prefill_t *p)
{
    pthread_mutex_lock(&p->mu);
    struct pin_cmd *c = p->pin_q;
    p->pin_q = NULL;
    p->pin_tail = &p->pin_q;
    pthread_mutex_unlock(&p->mu);
    for (struct pin_cmd *next; c; c = next) {
        next = c->next;
        if (c->release) {
            for (size_t i = 0; i < p->n_pins; i++)
                if (p->pins[i].id == c->release) {
                    pin_drop(p, i);
                    break;
                }
            free(c->tokens);
            free(c);
            continue;
        }
        pin_take(p, c);
        atomic_fetch_add(c->n_pinned ? &p->pins_taken : &p->pins_refused, 1);
        ty_rpc_mailbox_post(p->mb, on_pin_done, c);
    }
    uint64_t now = ty_clock_ms();
    for (size_t i = 0; i < p->n_pins;) {
        if (p->pins[i].expires_ms <= now) {
            TY_LOG_DEBUG("prefill", "pin %llu of a peer's read lapsed: released",
                         (unsigned long long)p->pins[i].id);
            pin_drop(p, i);
        } else {
            i++;
        }
    }
    if (p->n_pins)
        publish_pages(p);
    return p->n_pins > 0;
}

/* Hand the queued jobs to the batcher, end the cancelled ones, run a forward call; returns
 * the prompts it computed. */
static int work(ty_prefill_t *p, struct pjob *in)
{
    for (struct pjob *j = in, *next; j; j = next) {
        next = j->next;
        j->next = NULL;
        struct ty_gen_params gen = j->ends;
        gen.sampling = j->sp;
        gen.max_tokens = 1;
        gen.grammar = j->grammar.kind ? &j->grammar : NULL; /* token 1 obeys it too */
        struct ty_breq_opts o = {.id = j->rid, .prompt = j->tokens, .n_prompt = j->n,
                                 .gen = &gen, .user = j, .layer_begin = j->staged ? j->lo : 0,
                                 .layer_end = j->staged ? j->hi : 0};
        int rc = ty_batcher_add(p->b, &o, &j->r);
        if (rc) { /* job_build checked what the batcher checks but the grammar: TY_ENOMEM,
                   * TY_EINVAL (a schema the grammar refuses) */
            pthread_mutex_lock(&p->mu);
            p->n_queued--;
            p->queued_tokens -= j->n;
            pthread_mutex_unlock(&p->mu);
            j->rc = rc;
            ty_rpc_mailbox_post(p->mb, on_job_done, j);
            continue;
        }
        pthread_mutex_lock(&p->mu);
        j->jnext = p->jobs;
        p->jobs = j;
        pthread_mutex_unlock(&p->mu);
    }
    stage_inputs(p);
    /* no more pieces for a prompt whose writes failed or that was cancelled */
    for (bool again = true; again;) {
        again = false;
        pthread_mutex_lock(&p->mu);
        struct pjob *j = p->jobs;
        while (j && !j->xfer_err && !atomic_load(&j->cancelled))
            j = j->jnext;
        pthread_mutex_unlock(&p->mu);
        if (j) { /* on_end unlinks it */
            ty_batcher_end(p->b, j->r, j->xfer_err ? j->xfer_err : TY_ECANCELED);
            again = true;
        }
    }
    int rc = ty_batcher_step(p->b);
    if (rc < 0)
        TY_LOG_WARN("prefill", "forward call failed: %s", ty_strerror(rc));
    publish_pages(p);
    return rc;
}

static void *worker_main(void *arg)
{
    ty_prefill_t *p = arg;
    bool pinned = false;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && !p->queue && !p->jobs && !p->pin_q) {
            if (!pinned) {
                pthread_cond_wait(&p->cv, &p->mu);
                continue;
            }
            struct timespec ts; /* pins held: wake to let the lapsed ones go */
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            if (pthread_cond_timedwait(&p->cv, &p->mu, &ts))
                break;
        }
        if (p->stop)
            break;
        struct pjob *in = p->queue;
        p->queue = NULL;
        p->tail = &p->queue;
        pthread_mutex_unlock(&p->mu);
        pinned = pins_run(p); /* between forward calls: a peer's pin waits one call at most */
        int n = work(p, in);
        pthread_mutex_lock(&p->mu);
        if (!n && !p->queue && !p->stop) { /* nothing could start: wait a little for pages */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 1000000;
            ts.tv_sec += ts.tv_nsec / 1000000000;
            ts.tv_nsec %= 1000000000;
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        }
    }
    pthread_mutex_unlock(&p->mu);
    ty_batcher_end_all(p->b, TY_ESHUTDOWN); /* (what is queued is failed by the loop) */
    while (p->n_pins)
        pin_drop(p, p->n_pins - 1);
    return NULL;
}

/* ---- loop thread: RPC ------------------------------------------------------------------------ */

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The destination's page ids: the prompt's `need` pages, each below the decode node's
 * pool_pages, no page twice (two prompt pages written to one destination page). */
static int take_pages(const Tycho__V1__KvDestination *d, uint32_t need, struct pjob *j,
                      char *why, size_t cap)
{
    if (!d->pool_pages)
        return snprintf(why, cap, "kv_destination.pool_pages is 0"), TY_EINVAL;
    if (d->n_page_ids < need)
        return snprintf(why, cap, "kv_destination has %zu page ids, the prompt needs %u",
                        d->n_page_ids, need), TY_EINVAL;
    for (uint32_t i = 0; i < need; i++)
        if (d->page_ids[i] >= d->pool_pages)
            return snprintf(why, cap, "kv_destination.page_ids[%u] = %u is not a page of the "
                            "destination (pool_pages %u)", i, d->page_ids[i], d->pool_pages),
                   TY_ERANGE;
    j->dest_pages = malloc(2 * (size_t)need * sizeof(uint32_t));
    if (!j->dest_pages)
        return TY_ENOMEM;
    uint32_t *sorted = j->dest_pages + need;
    memcpy(j->dest_pages, d->page_ids, need * sizeof(uint32_t));
    memcpy(sorted, d->page_ids, need * sizeof(uint32_t));
    qsort(sorted, need, sizeof(uint32_t), cmp_u32);
    for (uint32_t i = 1; i < need; i++)
        if (sorted[i] == sorted[i - 1])
            return snprintf(why, cap, "kv_destination.page_ids: page %u appears twice",
                            sorted[i]), TY_EINVAL;
    j->min_page = sorted[0];
    j->max_page = sorted[need - 1];
    return 0;
}

/* One layer's K and V bases: page 0 .. pool_pages - 1 must be addressable (no u64 overflow). */
static int take_layer(const ty_prefill_t *p, const Tycho__V1__KvDestination *d, uint32_t l,
                      struct pjob *j, char *why, size_t cap)
{
    const Tycho__V1__LayerDestination *ld = d->layers[l];
    if (!ld || ld->layer != l)
        return snprintf(why, cap, "kv_destination.layers[%u] is missing or names layer %u", l,
                        ld ? ld->layer : 0), TY_EINVAL;
    uint64_t span, end;
    if (__builtin_mul_overflow((uint64_t)(d->pool_pages - 1), d->page_stride, &span) ||
        __builtin_add_overflow(span, (uint64_t)p->page_bytes, &span) ||
        __builtin_add_overflow(ld->k_base, span, &end) ||
        __builtin_add_overflow(ld->v_base, span, &end))
        return snprintf(why, cap, "kv_destination layer %u: bases 0x%llx/0x%llx + %u pages of "
                        "stride %llu overflow", l, (unsigned long long)ld->k_base,
                        (unsigned long long)ld->v_base, d->pool_pages,
                        (unsigned long long)d->page_stride), TY_ERANGE;
    j->k_base[l] = ld->k_base;
    j->v_base[l] = ld->v_base;
    return 0;
}

/* Check the KV destination against our pool and the prompt; copy its page ids, bases and
 * stride into the job (tycho.proto KvDestination). Every failure says what is wrong. */
static int take_destination(ty_prefill_t *p, const Tycho__V1__KvDestination *d, struct pjob *j,
                            char *why, size_t cap)
{
    uint32_t need = pages_of(p, j);
    if (!d || !d->segment[0] || strlen(d->segment) > TY_XFER_NAME_MAX)
        return snprintf(why, cap, "kv_destination.segment missing"), TY_EINVAL;
    if (d->block_tokens != p->B || d->page_bytes != p->page_bytes)
        return snprintf(why, cap, "KV geometry differs: B %u/%u, page bytes %llu/%zu",
                        d->block_tokens, p->B, (unsigned long long)d->page_bytes,
                        p->page_bytes), TY_EINVAL;
    if (d->n_layers != p->n_layers)
        return snprintf(why, cap, "kv_destination has %zu layers, the model %u", d->n_layers,
                        p->n_layers), TY_EINVAL;
    if (d->page_stride < d->page_bytes) /* 0: a decode node that sends per-page offsets */
        return snprintf(why, cap, "kv_destination.page_stride %llu is below page_bytes %llu%s",
                        (unsigned long long)d->page_stride, (unsigned long long)d->page_bytes,
                        d->page_stride ? "" : " (a decode node older than page-id "
                                              "destinations: upgrade it)"), TY_EINVAL;
    int rc = take_pages(d, need, j, why, cap);
    if (rc)
        return rc;
    j->n_dest_pages = need;
    j->stride = d->page_stride;
    j->fence = ty_kv_fence(d->fence, j->attempt ? j->attempt : 1);
    j->k_base = malloc(2 * (size_t)p->n_layers * sizeof(uint64_t));
    if (!j->k_base)
        return TY_ENOMEM;
    j->v_base = j->k_base + p->n_layers;
    for (uint32_t l = 0; l < p->n_layers && !rc; l++)
        rc = take_layer(p, d, l, j, why, cap);
    if (!rc)
        snprintf(j->segment, sizeof(j->segment), "%s", d->segment);
    return rc;
}

/* PrefillAssign.stage (tycho.proto PipelineStage): every field checked against the model. */
static int take_stage(const ty_prefill_t *p, const Tycho__V1__PipelineStage *st, struct pjob *j,
                      char *why, size_t cap)
{
    if (!st)
        return 0;
    bool last = st->n_stages && st->stage + 1 == st->n_stages;
    if (st->n_stages < 2 || st->stage >= st->n_stages)
        return snprintf(why, cap, "stage: stage %u of %u (a group has 2 or more)", st->stage,
                        st->n_stages), TY_EINVAL;
    if (st->layer_begin >= st->layer_end || st->layer_end > p->n_layers ||
        (st->layer_begin == 0) != (st->stage == 0) || (st->layer_end == p->n_layers) != last)
        return snprintf(why, cap, "stage: layers %u..%u for stage %u of %u (the model has %u: "
                        "the first stage starts at 0, the last ends at %u)", st->layer_begin,
                        st->layer_end, st->stage, st->n_stages, p->n_layers, p->n_layers),
               TY_EINVAL;
    if (last != !st->next_address[0] || strlen(st->next_address) >= sizeof(j->next_addr))
        return snprintf(why, cap, "stage: next_address \"%.64s\" for stage %u of %u (set "
                        "exactly when not the last)", st->next_address, st->stage,
                        st->n_stages), TY_EINVAL;
    j->staged = true;
    j->lo = st->layer_begin;
    j->hi = st->layer_end;
    j->stage = st->stage;
    j->n_stages = st->n_stages;
    snprintf(j->next_addr, sizeof(j->next_addr), "%s", st->next_address);
    return 0;
}

static int job_build(ty_prefill_t *p, const Tycho__V1__PrefillAssign *m, struct pjob **out,
                     char *why, size_t cap)
{
    if (!m->n_prompt_tokens || m->n_prompt_tokens >= ty_engine_max_ctx(p->o.engine))
        return snprintf(why, cap, "prompt of %zu tokens (context %u)", m->n_prompt_tokens,
                        ty_engine_max_ctx(p->o.engine)), TY_ERANGE;
    uint32_t V = p->V;
    for (size_t i = 0; i < m->n_prompt_tokens; i++)
        if (m->prompt_tokens[i] >= V)
            return snprintf(why, cap, "token id %u out of range", m->prompt_tokens[i]),
                   TY_EINVAL;
    struct pjob *j = calloc(1, sizeof(*j));
    if (!j)
        return TY_ENOMEM;
    j->p = p;
    j->rid = m->request_id;
    ty_client_id_copy(j->cid, m->client_request_id);
    j->attempt = m->attempt;
    j->n = (uint32_t)m->n_prompt_tokens;
    j->tokens = malloc(j->n * sizeof(uint32_t));
    int rc = j->tokens ? take_destination(p, m->kv_destination, j, why, cap) : TY_ENOMEM;
    if (!rc)
        rc = take_stage(p, m->stage, j, why, cap);
    if (rc) {
        job_free(j);
        return rc;
    }
    memcpy(j->tokens, m->prompt_tokens, j->n * sizeof(uint32_t));
    if ((rc = ty_pb_sampling_unpack(m->sampling, p->V, &j->sp, why, cap)) ||
        (rc = ty_pb_ends_unpack(m->sampling, p->V, &j->ends, why, cap)) ||
        (rc = ty_pb_grammar_unpack(m->sampling, &j->grammar, &j->grammar_schema, why, cap))) {
        job_free(j);
        return rc;
    }
    *out = j;
    return 0;
}

/* ---- loop thread: peer reads ------------------------------------------------------------- */

/* Our answer to a peer's KvFetch (the worker pinned c->n_pinned blocks, or none). */
static void on_pin_done(void *arg)
{
    struct pin_cmd *c = arg;
    ty_prefill_t *p = c->p;
    Tycho__V1__KvFetchReply r = TYCHO__V1__KV_FETCH_REPLY__INIT;
    Tycho__V1__KvDestination src = TYCHO__V1__KV_DESTINATION__INIT;
    Tycho__V1__LayerDestination *lp = NULL, **lpp = NULL;
    if (c->n_pinned && (lp = calloc(p->n_layers, sizeof(*lp))) &&
        (lpp = calloc(p->n_layers, sizeof(*lpp)))) {
        for (uint32_t l = 0; l < p->n_layers; l++) {
            tycho__v1__layer_destination__init(&lp[l]);
            lp[l].layer = l;
            lp[l].k_base = p->own_k[l];
            lp[l].v_base = p->own_v[l];
            lpp[l] = &lp[l];
        }
        src.segment = (char *)ty_xfer_engine_name(p->o.xfer);
        src.n_page_ids = c->n_pinned;
        src.page_ids = c->pages;
        src.n_layers = p->n_layers;
        src.layers = lpp;
        src.block_tokens = p->B;
        src.page_bytes = p->page_bytes;
        src.page_stride = p->page_bytes;
        src.pool_pages = p->pool_pages;
        r.pin = c->pin;
        r.n_blocks = c->n_pinned;
        r.source = &src;
        r.lease_ms = PIN_LEASE_MS;
    } else if (c->n_pinned) { /* no memory to answer: the peer computes, the pin lapses */
        c->n_pinned = 0;
    }
    ty_node_metrics_peer_pins(p->o.metrics, c->n_pinned);
    ty_rpc_call_reply_msg(c->call, &r.base);
    free(lp);
    free(lpp);
    free(c->pages);
    free(c->tokens);
    free(c);
}

/* KvFetch from a peer prefill node: a pin for the worker to take (answered once taken), or
 * a pin to release (answered at once). */
static void on_kv_fetch(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_prefill_t *p = arg;
    const Tycho__V1__KvFetch *m = msg;
    Tycho__V1__KvFetchReply none = TYCHO__V1__KV_FETCH_REPLY__INIT;
    if (!m->release && (!m->n_blocks || m->n_tokens < (size_t)m->n_blocks * p->B ||
                        m->n_tokens > ty_engine_max_ctx(p->o.engine))) {
        ty_rpc_call_fail(call, TY_EINVAL, "KvFetch: %zu tokens for %u blocks of %u", m->n_tokens,
                         m->n_blocks, p->B);
        return;
    }
    for (size_t i = 0; i < m->n_tokens; i++)
        if (m->tokens[i] >= p->V) {
            ty_rpc_call_fail(call, TY_EINVAL, "KvFetch: token id %u out of range", m->tokens[i]);
            return;
        }
    struct pin_cmd *c = calloc(1, sizeof(*c));
    if (c && m->n_tokens && !(c->tokens = malloc(m->n_tokens * sizeof(uint32_t)))) {
        free(c);
        c = NULL;
    }
    if (!c) {
        ty_rpc_call_fail(call, TY_ENOMEM, "KvFetch: out of memory");
        return;
    }
    c->p = p;
    c->rid = m->request_id;
    c->release = m->release;
    c->n_blocks = m->n_blocks;
    c->n_tokens = (uint32_t)m->n_tokens;
    if (m->n_tokens)
        memcpy(c->tokens, m->tokens, m->n_tokens * sizeof(uint32_t));
    c->call = m->release ? NULL : call;
    pthread_mutex_lock(&p->mu);
    bool stop = p->stop;
    if (!stop) {
        *p->pin_tail = c;
        p->pin_tail = &c->next;
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    if (stop) {
        free(c->tokens);
        free(c);
        ty_rpc_call_fail(call, TY_ESHUTDOWN, "prefill node shutting down");
    } else if (m->release) {
        ty_rpc_call_reply_msg(call, &none.base);
    }
}

struct release_msg {
    ty_prefill_t *p;
    uint64_t pin;
    char addr[128];
};

static void on_release_post(void *arg)
{
    struct release_msg *rm = arg;
    ty_rpc_client_t *c = rm->p->stop ? NULL : ty__peers_get(&rm->p->peers, rm->addr);
    Tycho__V1__KvFetch m = TYCHO__V1__KV_FETCH__INIT;
    m.release = rm->pin;
    struct ty_rpc_call_opts co = {.timeout_ms = 5000};
    if (c) /* fire and forget: a lost one lapses with its lease */
        ty_rpc_client_call_msg(c, TYCHO__V1__METHOD__METHOD_KV_FETCH, &m.base, &co, NULL, NULL,
                               NULL);
    free(rm);
}

/* Give the peer at addr its pin back. Any thread (posts to the loop). */
static void peer_release(ty_prefill_t *p, const char *addr, uint64_t pin)
{
    struct release_msg *rm = malloc(sizeof(*rm));
    if (!rm)
        return; /* it lapses */
    rm->p = p;
    rm->pin = pin;
    snprintf(rm->addr, sizeof(rm->addr), "%s", addr);
    ty_rpc_mailbox_post(p->mb, on_release_post, rm);
}

static void job_queue(ty_prefill_t *p, struct pjob *j);

/* The peer's answer to our pin request: the job keeps where the blocks are and is queued
 * (whatever came: what is not pinned is computed). Loop thread. */
static void on_pin_reply(const struct ty_rpc_result *res, void *arg)
{
    struct pjob *j = arg;
    ty_prefill_t *p = j->p;
    Tycho__V1__KvFetchReply *m = NULL;
    if (res->event == TY_RPC_EVENT_REPLY)
        m = tycho__v1__kv_fetch_reply__unpack(NULL, res->len, res->payload);
    const Tycho__V1__KvDestination *d = m ? m->source : NULL;
    if (m && m->pin)
        j->pin = m->pin; /* from here on released whatever happens (job_free) */
    if (m && m->pin && d && m->n_blocks && d->n_page_ids >= m->n_blocks &&
        d->n_layers == p->n_layers && d->page_bytes == p->page_bytes && d->block_tokens == p->B &&
        d->page_stride >= d->page_bytes) {
        j->pin_lease_ms = m->lease_ms;
        j->pin_stride = d->page_stride;
        j->pin_pages = malloc(m->n_blocks * sizeof(uint32_t));
        j->pin_k = malloc(2 * (size_t)p->n_layers * sizeof(uint64_t));
        bool ok = j->pin_pages && j->pin_k;
        for (uint32_t l = 0; ok && l < p->n_layers; l++) {
            ok = d->layers[l] && d->layers[l]->layer == l;
            if (ok) {
                j->pin_k[l] = d->layers[l]->k_base;
                j->pin_k[p->n_layers + l] = d->layers[l]->v_base;
            }
        }
        if (ok) {
            j->pin_v = j->pin_k + p->n_layers;
            memcpy(j->pin_pages, d->page_ids, m->n_blocks * sizeof(uint32_t));
            j->pin_n = m->n_blocks;
        }
    } else if (res->event != TY_RPC_EVENT_REPLY) {
        TY_LOG_DEBUG("prefill", "request %llu [%s]: pin request to peer %s failed (%s%s%s): "
                     "computing its blocks", (unsigned long long)j->rid, j->cid, j->peer_addr,
                     ty_strerror(res->status), res->message[0] ? ": " : "", res->message);
    }
    if (m)
        tycho__v1__kv_fetch_reply__free_unpacked(m, NULL);
    job_queue(p, j);
}

/* j's plan names a peer: ask it to pin the blocks before the job queues (so the worker
 * never waits on another node), within peer_timeout_ms. Returns 0 when asked (the job is
 * queued by the answer), else nothing was sent. Loop thread. */
static int peer_pin(ty_prefill_t *p, struct pjob *j)
{
    ty_rpc_client_t *c = ty__peers_get(&p->peers, j->peer_addr);
    if (!c)
        return TY_EINVAL;
    uint32_t n = j->plan_blocks * p->B + 1; /* one more token: the match leaves one to compute */
    Tycho__V1__KvFetch m = TYCHO__V1__KV_FETCH__INIT;
    m.request_id = j->rid;
    m.n_blocks = j->plan_blocks;
    m.n_tokens = n < j->n ? n : j->n;
    m.tokens = j->tokens;
    struct ty_rpc_call_opts co = {.timeout_ms = p->o.peer_timeout_ms};
    j->pin_t0_us = ty_clock_us();
    return ty_rpc_client_call_msg(c, TYCHO__V1__METHOD__METHOD_KV_FETCH, &m.base, &co,
                                  on_pin_reply, j, NULL);
}

/* The plan in PrefillAssign.cached_prefix (none: the node decides for itself). */
static void take_plan(ty_prefill_t *p, const Tycho__V1__PrefixLocation *pl, struct pjob *j)
{
    if (!pl)
        return;
    uint32_t cap = (j->n - 1) / p->B;
    j->has_plan = true;
    j->pool_planned = pl->pool_planned;
    j->plan_src = pl->source;
    j->plan_blocks = pl->n_blocks < cap ? pl->n_blocks : cap;
    j->plan_local = pl->local_blocks < j->plan_blocks ? pl->local_blocks : j->plan_blocks;
    if (j->plan_src == TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_PEER &&
        (!pl->address[0] || strlen(pl->address) >= sizeof(j->peer_addr) || !pl->segment[0] ||
         strlen(pl->segment) > TY_XFER_NAME_MAX))
        j->plan_src = TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_NONE; /* nothing to fetch from */
    snprintf(j->peer_addr, sizeof(j->peer_addr), "%s", pl->address);
    snprintf(j->peer_seg, sizeof(j->peer_seg), "%s", pl->segment);
}

static void on_call_cancel(ty_rpc_call_t *call, int reason, void *arg)
{
    struct pjob *j = arg;
    (void)call;
    (void)reason;
    atomic_store(&j->cancelled, true);
}

/* Hand j to the worker (or refuse it: stopping, or the queue full). Loop thread. */
static void job_queue(ty_prefill_t *p, struct pjob *j)
{
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (p->stop || p->n_queued >= p->o.max_queue)
        rc = p->stop ? TY_ESHUTDOWN : TY_EREJECTED;
    if (!rc) {
        *p->tail = j;
        p->tail = &j->next;
        p->n_queued++;
        p->queued_tokens += j->n;
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    if (rc) {
        TY_LOG_WARN("prefill", "PrefillAssign refused: %s", ty_strerror(rc));
        ty_rpc_call_fail(j->call, rc, "%s", ty_strerror(rc));
        job_free(j);
    }
}

static void on_assign(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_prefill_t *p = arg;
    const Tycho__V1__PrefillAssign *m = msg;
    char why[256] = "";
    struct pjob *j = NULL;
    if (ty_node_test_mute(call, "PrefillAssign"))
        return;
    int rc = job_build(p, m, &j, why, sizeof(why));
    if (rc) {
        TY_LOG_WARN("prefill", "PrefillAssign refused: %s (%s)", ty_strerror(rc), why);
        ty_rpc_call_fail(call, rc, "%s", why[0] ? why : ty_strerror(rc));
        return;
    }
    j->call = call;
    ty_rpc_call_set_cancel_cb(call, on_call_cancel, j);
    if (!j->staged) /* (a stage reuses no prefix: its pages hold its layers only) */
        take_plan(p, m->cached_prefix, j);
    /* a plan from a peer's cache: its pin first (the answer queues the job) */
    if (j->plan_src == TYCHO__V1__PREFIX_SOURCE__PREFIX_SOURCE_PEER &&
        j->plan_blocks > j->plan_local && !p->stop && peer_pin(p, j) == 0)
        return;
    job_queue(p, j);
}

static void on_cancel(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_prefill_t *p = arg;
    const Tycho__V1__Cancel *m = msg;
    pthread_mutex_lock(&p->mu);
    for (struct pjob *j = p->queue; j; j = j->next)
        if (j->rid == m->request_id)
            atomic_store(&j->cancelled, true);
    for (struct pjob *j = p->jobs; j; j = j->jnext)
        if (j->rid == m->request_id)
            atomic_store(&j->cancelled, true);
    pthread_mutex_unlock(&p->mu);
    Tycho__V1__Ack a = TYCHO__V1__ACK__INIT;
    a.request_id = m->request_id;
    ty_rpc_call_reply_msg(call, &a.base);
}

void ty_prefill_load(void *arg, struct ty_node_load *out)
{
    ty_prefill_t *p = arg;
    ty_kvpool_t *pool = ty_engine_pool(p->o.engine);
    pthread_mutex_lock(&p->mu);
    out->queued = p->n_queued;
    out->queued_tokens = p->queued_tokens;
    out->running = p->n_running;
    pthread_mutex_unlock(&p->mu);
    uint32_t used = atomic_load_explicit(&p->pages_used, memory_order_relaxed);
    out->free_pages = ty_kvpool_pages_total(pool) - used;
    out->kv_usage = (float)used / (float)ty_kvpool_pages_total(pool);
    struct ty_prefill_stats st;
    ty_prefill_stats(p, &st);
    out->pool_read_blocks = st.pool_hit_blocks;
    out->pool_written_blocks = st.pool_stored_blocks;
    out->pool_errors = st.pool_errors;
}

size_t ty_prefill_progress(void *arg, struct ty_node_progress *out, size_t cap)
{
    ty_prefill_t *p = arg;
    size_t n = 0;
    pthread_mutex_lock(&p->mu);
    for (struct pjob *j = p->jobs; j && n < cap; j = j->jnext) {
        uint32_t done = atomic_load_explicit(&j->done, memory_order_relaxed);
        if (!j->admitted || !done || atomic_load(&j->cancelled))
            continue;
        uint64_t busy = atomic_load_explicit(&j->busy_us, memory_order_relaxed);
        uint32_t computed = done - atomic_load_explicit(&j->done0, memory_order_relaxed);
        out[n++] = (struct ty_node_progress){
            .rid = j->rid, .attempt = j->attempt, .tokens_done = done, .tokens_total = j->n,
            .step_us = atomic_load_explicit(&j->step_us, memory_order_relaxed),
            .tokens_per_s = busy ? (uint64_t)computed * 1000000u / busy : 0};
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

void ty_prefill_stats(const ty_prefill_t *p, struct ty_prefill_stats *out)
{
    struct ty_node_kvstore_stats k = {0};
    if (p->kvstore)
        ty_node_kvstore_stats(p->kvstore, &k);
    *out = (struct ty_prefill_stats){.pool_lookups = k.lookups, .pool_hit_blocks = k.hit_blocks,
                                     .pool_stored_blocks = k.stored_blocks,
                                     .pool_errors = k.errors, .pool_skipped = k.skipped,
                                     .pool_dropped = k.dropped,
                                     .peer_read_blocks = atomic_load(&p->peer_read_blocks),
                                     .peer_failed_blocks = atomic_load(&p->peer_failed_blocks),
                                     .pins_taken = atomic_load(&p->pins_taken),
                                     .pins_refused = atomic_load(&p->pins_refused)};
}

uint16_t ty_prefill_rpc_port(const ty_prefill_t *p)
{
    return ty_node_service_port(p->svc);
}

static void on_stop(void *arg);
static void on_drained(void *arg);
static void on_closed(void *arg);

/* StageHidden from the previous stage of a group (stage.c keeps the rows). */
static void on_stage_hidden(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_prefill_t *p = arg;
    ty__stage_hub_receive(p->hub, call, msg);
}

/* Rows came in: the worker feeds them to their requests. Loop thread. */
static void stage_wake(void *arg)
{
    ty_prefill_t *p = arg;
    pthread_mutex_lock(&p->mu);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static const struct ty_node_handler handlers[] = {
    {TYCHO__V1__METHOD__METHOD_PREFILL_ASSIGN, &tycho__v1__prefill_assign__descriptor, on_assign},
    {TYCHO__V1__METHOD__METHOD_CANCEL, &tycho__v1__cancel__descriptor, on_cancel},
    {TYCHO__V1__METHOD__METHOD_KV_FETCH, &tycho__v1__kv_fetch__descriptor, on_kv_fetch},
    {TYCHO__V1__METHOD__METHOD_STAGE_HIDDEN, &tycho__v1__stage_hidden__descriptor,
     on_stage_hidden},
};

int ty_prefill_new(ty_prefill_t **out, const struct ty_prefill_opts *opts)
{
    if (!out || !opts || !opts->loop || !opts->engine || !opts->xfer)
        return TY_EINVAL;
    ty_prefill_t *p = calloc(1, sizeof(*p));
    if (!p)
        return TY_ENOMEM;
    p->o = *opts;
    p->peers = (struct ty__peers){.loop = opts->loop, .auth = opts->auth,
                                  .connect_timeout_ms = 1000};
    p->o.rpc_host = NULL;
    const char *stop = getenv("TYCHO_TEST_STOP_AFTER_LAYER");
    p->test_stop_layer = stop && *stop ? atoi(stop) : -1;
    const char *slow = getenv("TYCHO_TEST_SLOW_CHUNK_MS");
    p->test_slow_chunk_ms = slow && *slow ? (uint32_t)strtoul(slow, NULL, 10) % 60000 : 0;
    if (!p->o.max_queue)
        p->o.max_queue = 1024;
    if (!p->o.xfer_timeout_ms)
        p->o.xfer_timeout_ms = 10000;
    if (!p->o.max_batch)
        p->o.max_batch = 8;
    if (!p->o.peer_timeout_ms)
        p->o.peer_timeout_ms = 1000;
    if (p->o.max_batch > MAX_BATCH) {
        free(p);
        return TY_EINVAL;
    }
    p->m = ty_engine_model(opts->engine);
    p->n_layers = ty_model_config(p->m)->n_layers;
    p->V = ty_model_config(p->m)->n_vocab;
    p->n_eog = ty_model_eog_list(p->m, p->eog, TY_SAMPLE_MAX_BAN);
    if (p->n_eog > TY_SAMPLE_MAX_BAN)
        p->n_eog = TY_SAMPLE_MAX_BAN;
    p->B = ty_kvpool_block_tokens(ty_engine_pool(opts->engine));
    p->page_bytes = ty_kvpool_page_bytes(ty_engine_pool(opts->engine));
    p->pages_used = ty_kvpool_pages_used(ty_engine_pool(opts->engine)); /* before the worker */
    p->tail = &p->queue;
    p->pin_tail = &p->pin_q;
    p->pool_pages = ty_kvpool_pages_total(ty_engine_pool(opts->engine));
    p->own_k = malloc(2 * (size_t)p->n_layers * sizeof(uint64_t));
    if (!p->own_k) {
        free(p);
        return TY_ENOMEM;
    }
    p->own_v = p->own_k + p->n_layers;
    for (uint32_t l = 0; l < p->n_layers; l++) { /* our page arrays, for peers' reads */
        p->own_k[l] = (uint64_t)(uintptr_t)ty_kvpool_k(ty_engine_pool(opts->engine), l, 0);
        p->own_v[l] = (uint64_t)(uintptr_t)ty_kvpool_v(ty_engine_pool(opts->engine), l, 0);
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    struct ty_node_service_opts so = {.loop = opts->loop, .auth = opts->auth,
                                      .host = opts->rpc_host,
                                      .port = opts->rpc_port, .worker = worker_main,
                                      .stop = on_stop, .drained = on_drained,
                                      .closed = on_closed, .arg = p,
                                      .handlers = handlers,
                                      .n_handlers = sizeof(handlers) / sizeof(handlers[0])};
    struct ty_batcher_opts bo = {
        .engine = opts->engine, .max_running = p->o.max_batch, .lookahead = 64, .no_grow = true,
        .hooks = {.arg = p, .on_token = on_token, .on_end = on_end, .on_admit = on_admit,
                  .on_layer = on_layer, .on_forward = on_forward, .on_hidden = on_hidden}};
    struct ty__stage_hub_opts ho = {.loop = opts->loop, .auth = opts->auth,
                                    .dim = ty_model_config(p->m)->dim, .wake = stage_wake,
                                    .wake_arg = p};
    p->kvstore = opts->kvstore;
    int rc = ty_batcher_new(&p->b, &bo);
    if (!rc)
        rc = ty__stage_hub_new(&p->hub, &ho);
    if (!rc)
        rc = ty_node_service_new(&p->svc, &so);
    if (rc) {
        ty__stage_hub_free(p->hub);
        ty_batcher_free(p->b);
        free(p->own_k);
        free(p);
        return rc;
    }
    p->mb = ty_node_service_mailbox(p->svc);
    ty__stage_hub_set_mailbox(p->hub, p->mb);
    *out = p;
    return 0;
}

/* Service hooks (loop thread): stop asks the worker to return; drained runs once it has (its
 * results all delivered); closed once the RPC server is closed. */
static void on_stop(void *arg)
{
    ty_prefill_t *p = arg;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_signal(&p->cv);
    for (struct pjob *j = p->jobs; j; j = j->jnext)
        atomic_store(&j->cancelled, true);
    pthread_mutex_unlock(&p->mu);
}

static void on_drained(void *arg)
{
    ty_prefill_t *p = arg;
    for (size_t i = 0; i < sizeof(p->segs) / sizeof(p->segs[0]); i++)
        if (p->segs[i].seg)
            ty_xfer_segment_close(p->o.xfer, p->segs[i].seg);
    for (struct pjob *j = p->queue, *n; j; j = n) {
        n = j->next;
        ty_rpc_call_fail(j->call, TY_ESHUTDOWN, "prefill node shutting down");
        job_free(j);
    }
    p->queue = NULL;
    for (struct pin_cmd *c = p->pin_q, *n; c; c = n) { /* pins never taken */
        n = c->next;
        if (c->call)
            ty_rpc_call_fail(c->call, TY_ESHUTDOWN, "prefill node shutting down");
        free(c->tokens);
        free(c);
    }
    p->pin_q = NULL;
    ty__peers_close(&p->peers); /* a pin request pending fails its job (stop) */
    ty__stage_hub_close(p->hub);
}

static void on_closed(void *arg)
{
    ty_prefill_t *p = arg;
    void (*cb)(void *) = p->close_cb;
    void *cb_arg = p->close_arg;
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    ty_batcher_free(p->b);
    ty__stage_hub_free(p->hub);
    free(p->pins);
    free(p->own_k);
    free(p);
    if (cb)
        cb(cb_arg);
}

void ty_prefill_close(ty_prefill_t *p, void (*cb)(void *arg), void *arg)
{
    p->close_cb = cb;
    p->close_arg = arg;
    ty_node_service_close(p->svc);
}
