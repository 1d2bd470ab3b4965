/* The batcher (tycho/batcher.h): admit, grow, preempt, readmit, step, sample. Requests are in
 * exactly one place: the waiting queue (FIFO, preempted ones at its head, oldest first), the
 * reserved list (pages held, KV coming from elsewhere) or the running array (oldest first by
 * `order`, the order in which requests were added: the newest is preempted first, as vLLM
 * does). The token rules (end tokens not in the output, max_tokens, context full) are
 * ty_engine_generate()'s, so a request gives the tokens `tycho generate` gives. */
#include "tycho/batcher.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/grammar.h"
#include "tycho/hash.h"
#include "tycho/log.h"

#include <stdlib.h>
#include <string.h>

enum breq_state { BREQ_WAITING, BREQ_RESERVED, BREQ_RUNNING };

struct ty_breq {
    struct ty_breq *next; /* waiting queue / reserved list */
    uint64_t id, order;
    void *user;
    enum breq_state state;
    uint32_t *hist; /* prompt then output */
    uint32_t n_hist, cap_hist, n_prompt, n_out, n_cached, n_preempted;
    uint32_t n_passed; /* requests admitted past it while it waited and did not fit */
    uint32_t at_admit;  /* KV tokens present when (re)admitted: computing has begun beyond */
    uint64_t head;      /* chained hash of the prompt's first block (0: shorter than a block) */
    struct ty_gen_params gen;
    ty_kvseq_t *seq;
    ty_sampler_t *sampler;
    ty_grammar_t *grammar;      /* structured output (NULL: none) */
    ty_grammar_matcher_t *gm;
    bool admitted_once, stalled;
    /* a pipeline stage (ty_breq_opts.layer_begin/end): layers [lo, hi) */
    bool stage;
    uint32_t lo, hi;
    float *hin;      /* (n_prompt, dim) hidden states in (lo > 0), n_hin rows received */
    uint32_t n_hin;
    uint32_t n_hout; /* prompt tokens whose hidden states went out (hi < n_layers) */
};

struct ty_batcher {
    struct ty_batcher_opts o;
    struct ty_batcher_hooks h;
    ty_engine_t *e;
    ty_kvpool_t *pool;
    const ty_model_t *m;
    uint32_t V, B, max_ctx, watermark;
    uint32_t D, L;   /* the model's dim and layers (pipeline stages) */
    float *hout;     /* (step_tokens, D) a stage's hidden states out; made on first use */
    bool stage_ran;  /* the last step was a stage's: the next one serves the others first */
    uint32_t eog[TY_SAMPLE_MAX_BAN]; /* the model's end-of-generation ids (min_tokens) */
    size_t n_eog;
    struct ty_breq *waiting, **waiting_tail, *reserved;
    struct ty_breq **run; /* oldest first */
    uint32_t n_run, cap_run, n_waiting, n_requeued, n_reserved;
    uint64_t n_added, preemptions, steps;
    float *logits; /* (max_running, V) */
    uint32_t *ids; /* (max_running) greedy picks of a step whose every draw is plain greedy */
    /* a step's draws, carried out by the forward call (struct ty_batch.draws): one per row,
     * their adjustments (grown on demand) and results */
    struct ty_row_draw *draws;
    struct ty_sample *samples;
    struct ty_logit_adj *adj;
    uint32_t adj_cap;
    ty_grammar_vocab_t *gvocab; /* the tokenizer's index, made for the first grammar */
    uint32_t *gmask;            /* (mask words) */
    /* the step in progress, for the layer hook */
    struct ty_breq **call_reqs;
    struct ty_batch_seq *call_pieces;
    uint32_t call_n;
    const struct ty_batcher_call *call; /* the step's call while its token hooks run */
};

static void breq_free(ty_batcher_t *b, struct ty_breq *r)
{
    ty_kvpool_seq_free(b->pool, r->seq);
    ty_sampler_free(r->sampler);
    ty_grammar_matcher_free(r->gm);
    ty_grammar_free(r->grammar);
    free(r->hist);
    free(r->hin);
    free(r);
}

/* ---- where a request is ----------------------------------------------------------------- */

static void run_insert(ty_batcher_t *b, struct ty_breq *r)
{
    if (b->n_run == b->cap_run) {
        uint32_t cap = b->cap_run * 2;
        struct ty_breq **nr = realloc(b->run, cap * sizeof(*nr));
        TY_ASSERT(nr); /* small metadata: abort on OOM */
        b->run = nr;
        b->cap_run = cap;
    }
    uint32_t i = b->n_run;
    while (i > 0 && b->run[i - 1]->order > r->order) {
        b->run[i] = b->run[i - 1];
        i--;
    }
    b->run[i] = r;
    b->n_run++;
    r->state = BREQ_RUNNING;
}

static void run_remove_at(ty_batcher_t *b, uint32_t i)
{
    memmove(&b->run[i], &b->run[i + 1], (b->n_run - i - 1) * sizeof(*b->run));
    b->n_run--;
}

static void list_unlink(struct ty_breq **head, struct ty_breq ***tail, struct ty_breq *r)
{
    for (struct ty_breq **pp = head; *pp; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            if (tail && *tail == &r->next)
                *tail = pp;
            r->next = NULL;
            return;
        }
    }
}

/* Take r out of wherever it is. */
static void detach(ty_batcher_t *b, struct ty_breq *r)
{
    switch (r->state) {
    case BREQ_RUNNING:
        for (uint32_t i = 0; i < b->n_run; i++) {
            if (b->run[i] == r) {
                run_remove_at(b, i);
                break;
            }
        }
        break;
    case BREQ_WAITING:
        list_unlink(&b->waiting, &b->waiting_tail, r);
        b->n_waiting--;
        b->n_requeued -= r->n_preempted ? 1 : 0;
        break;
    case BREQ_RESERVED:
        list_unlink(&b->reserved, NULL, r);
        b->n_reserved--;
        break;
    }
}

static void finish(ty_batcher_t *b, struct ty_breq *r, enum ty_finish fin, int rc)
{
    detach(b, r);
    b->h.on_end(b->h.arg, r, fin, rc);
    breq_free(b, r);
}

void ty_batcher_end(ty_batcher_t *b, ty_breq_t *r, int rc)
{
    finish(b, r, TY_FINISH_NONE, rc < 0 ? rc : TY_ECANCELED);
}

/* ---- adding ----------------------------------------------------------------------------- */

/* Compile r's grammar and start its matcher (the vocabulary index is made once, for the
 * first request with a grammar). TY_EINVAL for a schema the grammar refuses. */
static int grammar_attach(ty_batcher_t *b, struct ty_breq *r, const struct ty_gen_grammar *spec)
{
    char err[256];
    int rc = ty_grammar_compile(&r->grammar, spec, err, sizeof(err));
    if (rc) {
        TY_LOG_WARN("batcher", "request %llu: %s", (unsigned long long)r->id, err);
        return rc == TY_ENOMEM ? rc : TY_EINVAL;
    }
    if (!b->gvocab) {
        const struct ty_tokenizer *tok = ty_model_tokenizer(b->m);
        if (!tok)
            return TY_ENOTSUP;
        if ((rc = ty_grammar_vocab_new(&b->gvocab, tok)))
            return rc;
        b->gmask = malloc((ty_grammar_mask_words(b->gvocab) + 1) * sizeof(uint32_t));
        if (!b->gmask) {
            ty_grammar_vocab_free(b->gvocab);
            b->gvocab = NULL;
            return TY_ENOMEM;
        }
    }
    return ty_grammar_matcher_new(&r->gm, r->grammar, b->gvocab);
}

/* Make r a pipeline stage when o asks for a layer range: TY_EINVAL for a range the model
 * has not, or a stage before the last without an on_hidden hook. */
static int stage_attach(ty_batcher_t *b, struct ty_breq *r, const struct ty_breq_opts *o)
{
    if (!o->layer_begin && !o->layer_end)
        return 0;
    if (o->layer_begin >= o->layer_end || o->layer_end > b->L ||
        (o->layer_end < b->L && !b->h.on_hidden))
        return TY_EINVAL;
    r->stage = true;
    r->lo = o->layer_begin;
    r->hi = o->layer_end;
    if (r->lo && !(r->hin = malloc((size_t)r->n_prompt * b->D * sizeof(float))))
        return TY_ENOMEM;
    return 0;
}

int ty_batcher_stage_input(ty_batcher_t *b, ty_breq_t *r, const float *rows, uint32_t n)
{
    if (!r->stage || !r->lo || n > r->n_prompt - r->n_hin)
        return TY_EINVAL;
    memcpy(r->hin + (size_t)r->n_hin * b->D, rows, (size_t)n * b->D * sizeof(float));
    r->n_hin += n;
    return 0;
}

static int breq_new(ty_batcher_t *b, const struct ty_breq_opts *o, struct ty_breq **out)
{
    if (!o->prompt || !o->n_prompt || !o->gen || !o->gen->max_tokens)
        return TY_EINVAL;
    for (uint32_t i = 0; i < o->n_prompt; i++)
        if (o->prompt[i] >= b->V)
            return TY_EINVAL;
    if ((uint64_t)o->n_prompt + 1 > b->max_ctx)
        return TY_ERANGE;
    struct ty_breq *r = calloc(1, sizeof(*r));
    if (!r)
        return TY_ENOMEM;
    r->id = o->id;
    r->user = o->user;
    r->gen = *o->gen;
    r->gen.stop = NULL;
    r->gen.n_stop = 0;
    /* the answer's first 256 tokens; the history doubles when it fills (a chat request on a
     * 128k model asks for the whole rest of the context, 512 KiB, while it waits) */
    uint32_t room = b->max_ctx - o->n_prompt, ahead = o->gen->max_tokens < room
                                                         ? o->gen->max_tokens : room;
    r->cap_hist = o->n_prompt + (ahead < 256 ? ahead : 256) + 1;
    r->hist = malloc((size_t)r->cap_hist * sizeof(uint32_t));
    int rc = r->hist ? ty_sampler_new(&r->sampler, &o->gen->sampling, b->V) : TY_ENOMEM;
    if (rc) {
        free(r->hist);
        free(r);
        return rc;
    }
    r->gen.grammar = NULL; /* compiled here; the spec is the caller's */
    if (o->gen->grammar && (rc = grammar_attach(b, r, o->gen->grammar))) {
        breq_free(b, r);
        return rc;
    }
    memcpy(r->hist, o->prompt, o->n_prompt * sizeof(uint32_t));
    r->n_hist = r->n_prompt = o->n_prompt;
    if ((rc = stage_attach(b, r, o))) {
        breq_free(b, r);
        return rc;
    }
    if (o->n_prompt > b->B && !r->stage && /* a stage's blocks are never cached */
        ty_hash_prefix_blocks(o->prompt, b->B, b->B, ty_kvpool_hash_seed(b->pool), &r->head, 1))
        r->head = r->head ? r->head : 1;
    r->order = ++b->n_added;
    *out = r;
    return 0;
}

int ty_batcher_add(ty_batcher_t *b, const struct ty_breq_opts *o, ty_breq_t **out)
{
    struct ty_breq *r;
    int rc = breq_new(b, o, &r);
    if (rc)
        return rc;
    r->state = BREQ_WAITING;
    *b->waiting_tail = r;
    b->waiting_tail = &r->next;
    b->n_waiting++;
    if (out)
        *out = r;
    return 0;
}

/* Pages the preempted requests need to be readmitted. */
static uint64_t requeued_need(const ty_batcher_t *b)
{
    uint64_t need = 0;
    for (const struct ty_breq *r = b->waiting; r && r->n_preempted; r = r->next)
        need += (r->n_hist + b->B - 1) / b->B;
    return need;
}

/* Whether anything but `except` holds pages. */
static bool others_hold_pages(const ty_batcher_t *b, const struct ty_breq *except)
{
    return b->n_run > (except && except->state == BREQ_RUNNING ? 1u : 0u) ||
           b->n_reserved > (except && except->state == BREQ_RESERVED ? 1u : 0u);
}

int ty_batcher_add_reserved(ty_batcher_t *b, const struct ty_breq_opts *o, ty_breq_t **out)
{
    if (o->layer_begin || o->layer_end)
        return TY_EINVAL; /* a stage computes its KV */
    struct ty_breq *r;
    int rc = breq_new(b, o, &r);
    if (rc)
        return rc;
    if (!(rc = ty_kvpool_seq_new(b->pool, &r->seq)))
        rc = ty_kvpool_seq_reserve(b->pool, r->seq, r->n_prompt);
    if (!rc && others_hold_pages(b, NULL) &&
        ty_kvpool_pages_free(b->pool) < b->watermark + requeued_need(b))
        rc = TY_ENOCAPACITY; /* what was preempted gets its pages back first */
    if (rc) {
        breq_free(b, r);
        return rc;
    }
    r->state = BREQ_RESERVED;
    r->next = b->reserved;
    b->reserved = r;
    b->n_reserved++;
    if (out)
        *out = r;
    return 0;
}

/* ---- tokens ------------------------------------------------------------------------------ */

/* Record sampled token `s` of r and apply the finish rules and the hook; true when r ended. */
static bool accept(ty_batcher_t *b, struct ty_breq *r, const struct ty_sample *s)
{
    enum ty_finish fin = TY_FINISH_NONE;
    if (ty_gen_is_end(&r->gen, b->m, s->id)) {
        fin = TY_FINISH_EOS; /* an end or stop token: not in the output */
    } else {
        if (r->gm && ty_grammar_matcher_accept(r->gm, s->id)) {
            finish(b, r, TY_FINISH_NONE, TY_EPROTO); /* e.g. a first token from elsewhere */
            return true;
        }
        if (r->n_hist == r->cap_hist) {
            uint32_t *nh = realloc(r->hist, (size_t)r->cap_hist * 2 * sizeof(uint32_t));
            if (!nh) {
                finish(b, r, TY_FINISH_NONE, TY_ENOMEM);
                return true;
            }
            r->hist = nh;
            r->cap_hist *= 2;
        }
        r->hist[r->n_hist++] = s->id;
        r->n_out++;
        if (r->n_out >= r->gen.max_tokens)
            fin = TY_FINISH_LENGTH;
        else if (ty_kvseq_n_tokens(r->seq) + 1 >= b->max_ctx)
            fin = TY_FINISH_CTX;
    }
    int v = b->h.on_token(b->h.arg, r, s, fin);
    if (v < 0) {
        finish(b, r, TY_FINISH_NONE, v);
        return true;
    }
    if (v == TY_FINISH_NONE)
        return false;
    finish(b, r, (enum ty_finish)v, 0);
    return true;
}

int ty_batcher_kv_landed(ty_batcher_t *b, ty_breq_t *r, const struct ty_sample *first,
                         uint32_t n_cached)
{
    if (r->state != BREQ_RESERVED)
        return TY_EINVAL;
    int rc = first->id < b->V ? ty_kvpool_seq_commit(b->pool, r->seq, r->hist, r->n_prompt)
                              : TY_EPROTO;
    if (rc) {
        finish(b, r, TY_FINISH_NONE, rc);
        return rc;
    }
    struct ty_sample skip; /* the logits row is scratch */
    memset(b->logits, 0, b->V * sizeof(float));
    ty_sampler_sample(r->sampler, b->logits, r->hist, r->n_hist, &skip);
    detach(b, r);
    r->n_cached = n_cached <= r->n_prompt ? n_cached : 0;
    r->admitted_once = true;
    r->at_admit = r->n_prompt;
    run_insert(b, r);
    accept(b, r, first);
    return 0;
}

/* ---- pages ------------------------------------------------------------------------------- */

/* Take running r's pages back; it waits at the queue's head, among the preempted in order. */
static void preempt(ty_batcher_t *b, struct ty_breq *r)
{
    detach(b, r);
    ty_kvpool_seq_free(b->pool, r->seq);
    r->seq = NULL;
    r->stalled = false;
    r->n_preempted++;
    r->state = BREQ_WAITING;
    struct ty_breq **pp = &b->waiting;
    while (*pp && (*pp)->n_preempted && (*pp)->order < r->order)
        pp = &(*pp)->next;
    r->next = *pp;
    if (!*pp)
        b->waiting_tail = &r->next;
    *pp = r;
    b->n_waiting++;
    b->n_requeued++;
    b->preemptions++;
    if (b->h.on_preempt)
        b->h.on_preempt(b->h.arg, r, b->preemptions);
}

/* Room for what every running request computes next, oldest first, preempting the newest
 * while the pool is full. One that finds nothing newer to preempt waits a step while reserved
 * requests hold pages (they become preemptable once they run), else is preempted itself when
 * older ones run, else fails (the pool is smaller than its context). */
static void grow(ty_batcher_t *b)
{
    for (uint32_t i = 0; i < b->n_run; i++) {
        struct ty_breq *r = b->run[i];
        r->stalled = false;
        uint32_t left = r->n_hist - ty_kvseq_n_tokens(r->seq);
        int rc;
        while ((rc = ty_kvpool_seq_reserve(b->pool, r->seq, left)) == TY_ENOCAPACITY &&
               b->n_run > i + 1)
            preempt(b, b->run[b->n_run - 1]);
        if (rc == TY_ENOCAPACITY && b->n_reserved) {
            r->stalled = true;
        } else if (rc == TY_ENOCAPACITY && i > 0) {
            preempt(b, r);
            i--;
        } else if (rc) {
            finish(b, r, TY_FINISH_NONE, rc);
            i--;
        }
    }
}

/* Whether r's first block is being computed by a running request (r then waits, to find it
 * in the page cache, as it would had they come one after the other). */
static bool head_in_flight(const ty_batcher_t *b, const struct ty_breq *r)
{
    if (!r->head || ty_kvpool_holds(b->pool, r->head))
        return false;
    for (uint32_t i = 0; i < b->n_run; i++)
        if (b->run[i]->head == r->head)
            return true;
    return false;
}

/* Try to admit r: its sequence with the cached prefix and the pages of the rest, then (the
 * first time) on_admit's imports. 1: admitted (or ended with an error); 0: not now. */
static int try_admit(ty_batcher_t *b, struct ty_breq *r)
{
    if (head_in_flight(b, r))
        return 0;
    int rc = ty_kvpool_seq_new(b->pool, &r->seq);
    if (!rc && r->stage)
        ty_kvpool_seq_set_private(r->seq); /* some layers' KV only: never a cached prefix */
    int cached = rc ? rc : ty_kvpool_seq_match_prefix(b->pool, r->seq, r->hist, r->n_hist);
    rc = cached < 0 ? cached : ty_kvpool_seq_reserve(b->pool, r->seq, r->n_hist - (uint32_t)cached);
    if (!rc && others_hold_pages(b, NULL) && ty_kvpool_pages_free(b->pool) < b->watermark)
        rc = TY_ENOCAPACITY;
    if (rc == TY_ENOCAPACITY && others_hold_pages(b, NULL)) {
        ty_kvpool_seq_free(b->pool, r->seq); /* wait for pages to free up */
        r->seq = NULL;
        return 0;
    }
    if (!rc && !r->admitted_once && b->h.on_admit)
        rc = b->h.on_admit(b->h.arg, r); /* may commit imported blocks into the reserved pages */
    if (rc) {
        finish(b, r, TY_FINISH_NONE, rc);
        return 1;
    }
    detach(b, r);
    uint32_t have = ty_kvseq_n_tokens(r->seq);
    if (!r->admitted_once)
        r->n_cached = have; /* usage reports what the prompt found */
    r->admitted_once = true;
    r->at_admit = have;
    run_insert(b, r);
    return 1;
}

/* Admit waiting requests in order while they fit. The first that does not fit (the blocked
 * head) may be passed by opts.lookahead requests in all, no more (so a stream of small
 * requests does not starve it); a preempted one is never passed. */
static void admit(ty_batcher_t *b)
{
    struct ty_breq *r = b->waiting, *head = NULL;
    while (r && b->n_run < b->o.max_running) {
        struct ty_breq *next = r->next;
        if (head && head->n_passed >= b->o.lookahead)
            return;
        if (try_admit(b, r)) {
            if (head)
                head->n_passed++;
        } else if (r->n_preempted || !b->o.lookahead) {
            return;
        } else if (!head) {
            head = r;
        }
        r = next;
    }
}

/* ---- the step ---------------------------------------------------------------------------- */

static void layer_hook(void *arg, const struct ty_batch *batch, uint32_t layer)
{
    ty_batcher_t *b = arg;
    for (uint32_t k = 0; k < batch->n_seqs; k++)
        for (uint32_t i = 0; i < b->call_n; i++)
            if (b->call_pieces[i].seq == batch->seqs[k].seq) {
                b->h.on_layer(b->h.arg, b->call_reqs[i], &batch->seqs[k], layer);
                break;
            }
}

static uint32_t compose_whole(ty_batcher_t *b, struct ty_breq **who, struct ty_batch_seq *bs);

/* A pipeline stage's call: the oldest stage with prompt tokens it can compute (their hidden
 * states in), alone, up to the budget. 0: none. */
static uint32_t compose_stage(ty_batcher_t *b, struct ty_breq **who, struct ty_batch_seq *bs)
{
    for (uint32_t i = 0; i < b->n_run; i++) {
        struct ty_breq *r = b->run[i];
        uint32_t have = ty_kvseq_n_tokens(r->seq), upto = r->lo ? r->n_hin : r->n_prompt;
        if (!r->stage || r->stalled || have >= upto)
            continue;
        uint32_t take = upto - have < b->o.step_tokens ? upto - have : b->o.step_tokens;
        who[0] = r;
        bs[0] = (struct ty_batch_seq){.seq = r->seq, .tokens = r->hist + have, .n = take};
        return 1;
    }
    return 0;
}

/* Choose the call's pieces: decodes, then prompts that fit whole (half the budget while a
 * longer prompt is part way, so it keeps going), then chunks of the rest, oldest first. A
 * pipeline stage runs alone (its layer range is the call's), every other step while others
 * have work. */
static uint32_t compose(ty_batcher_t *b, struct ty_breq **who, struct ty_batch_seq *bs)
{
    uint32_t n = b->stage_ran ? 0 : compose_stage(b, who, bs);
    if (!n && !(n = compose_whole(b, who, bs)))
        n = compose_stage(b, who, bs);
    b->stage_ran = n == 1 && who[0]->stage;
    return n;
}

/* The pieces of a call of whole-model requests (compose). */
static uint32_t compose_whole(ty_batcher_t *b, struct ty_breq **who, struct ty_batch_seq *bs)
{
    uint32_t n = 0, budget = b->o.step_tokens;
    bool taken[b->n_run ? b->n_run : 1], part_way = false;
    memset(taken, 0, sizeof(taken));
    for (uint32_t i = 0; i < b->n_run; i++) {
        const struct ty_breq *r = b->run[i];
        uint32_t have = ty_kvseq_n_tokens(r->seq);
        part_way = part_way ||
                   (!r->stage && !r->stalled && have > r->at_admit && r->n_hist - have > 1);
    }
    for (int pass = 0; pass < 3; pass++) {
        uint32_t join = pass == 1 && part_way ? budget / 2 : budget;
        for (uint32_t i = 0; i < b->n_run && budget && n < b->o.max_running; i++) {
            struct ty_breq *r = b->run[i];
            uint32_t have = ty_kvseq_n_tokens(r->seq), left = r->n_hist - have;
            if (taken[i] || r->stalled || !left || r->stage)
                continue;
            bool ok = pass == 0   ? left == 1
                      : pass == 1 ? left > 1 && have == r->at_admit && left <= join
                                  : left > 1;
            if (!ok)
                continue;
            uint32_t take = left < budget ? left : budget;
            if (pass == 1)
                join -= take;
            budget -= take;
            taken[i] = true;
            who[n] = r;
            bs[n++] = (struct ty_batch_seq){.seq = r->seq, .tokens = r->hist + have, .n = take};
        }
    }
    return n;
}

/* A complete document may end with any token that ends r (the tokenizer's end tokens are in
 * the mask already; the model's list and r's stop tokens may hold more). */
static void grammar_allow_ends(ty_batcher_t *b, const struct ty_breq *r)
{
    uint32_t nv = ty_grammar_vocab_size(b->gvocab);
    for (size_t k = 0; k < b->n_eog + r->gen.n_stop_ids; k++) {
        uint32_t id = k < b->n_eog ? b->eog[k] : r->gen.stop_ids[k - b->n_eog];
        if (id < nv && (k >= b->n_eog || !r->gen.ignore_eos))
            b->gmask[id / 32] |= 1u << (id % 32);
    }
}

/* Sample r's next token from its logits row; true when r ended. */
static bool sample(ty_batcher_t *b, struct ty_breq *r, float *row)
{
    struct ty_sample s;
    if (r->gm) {
        /* tokens it may still make: max_tokens, then the context (see accept()); a prefill
         * batcher's max_tokens 1 is not the request's (the decode node's is) */
        uint32_t left = b->o.no_grow ? UINT32_MAX : r->gen.max_tokens - r->n_out;
        uint32_t ctx = b->max_ctx - r->n_hist;
        int n = ty_grammar_matcher_fill_mask(r->gm, left < ctx ? left : ctx, b->gmask);
        if (n < 0) {
            finish(b, r, TY_FINISH_NONE, n);
            return true;
        }
        if (ty_grammar_matcher_is_complete(r->gm)) /* the model's ends and the stop tokens */
            grammar_allow_ends(b, r);
        ty_grammar_mask_apply(b->gmask, ty_grammar_vocab_size(b->gvocab), row, b->V);
    }
    ty_gen_ban_ends(&r->gen, r->n_out, b->eog, b->n_eog, r->sampler);
    int rc = ty_sampler_sample(r->sampler, row, r->hist, r->n_hist, &s);
    if (rc) {
        finish(b, r, TY_FINISH_NONE, rc);
        return true;
    }
    return accept(b, r, &s);
}

/* Row i's prepared draw after the call: made by the backend, or (a call with an earlier
 * prompt chunk in it) carried out here on the row it sent back. */
static bool draw_done(ty_batcher_t *b, struct ty_breq *r, const struct ty_batch *batch,
                      uint32_t i)
{
    if (batch->samples[i].id == TY_SAMPLE_NOT_DRAWN)
        ty_sampler_draw(r->sampler, b->logits + (size_t)i * b->V, &batch->draws[i],
                        batch->draws[i].n_adj ? b->adj + batch->draws[i].adj_begin : NULL,
                        &batch->samples[i]);
    return accept(b, r, &batch->samples[i]);
}

/* Whether r's draw after this step's forward (if it draws: its last prompt chunk or a decode
 * step) is the plain argmax of its logits row (no grammar, no min_tokens ban, a plain greedy
 * sampler), which the backend may then pick itself (struct ty_batch.ids). */
static bool plain_greedy(const struct ty_breq *r)
{
    return !r->stage && !r->gm && r->n_out >= r->gen.min_tokens &&
           ty_sampler_plain_greedy(r->sampler);
}

/* Whether r draws after a call that computes `piece` of it (its last prompt chunk or a decode
 * step; not an earlier chunk). */
static bool draws_after(const struct ty_breq *r, const struct ty_batch_seq *piece)
{
    return ty_kvseq_n_tokens(r->seq) + piece->n == r->n_hist;
}

/* Whether the step's draws can all go with the forward call (tycho/backend.h struct ty_batch
 * .draws; a device backend makes them on its side): none needs the row here (a grammar's mask,
 * a pipeline stage). Then each row that draws after this call is prepared: its ban, its
 * sampler's adjustments into b->adj and its uniform; the others get a greedy draw that no one
 * reads. TY_ENOTSUP / TY_ENOMEM: nothing consumed, the rows come back and sample() draws. */
static int prepare_draws(ty_batcher_t *b, struct ty_breq **who, const struct ty_batch_seq *bs,
                         uint32_t n)
{
    if ((!b->draws && !(b->draws = malloc(b->o.max_running * sizeof(*b->draws)))) ||
        (!b->samples && !(b->samples = malloc(b->o.max_running * sizeof(*b->samples)))))
        return TY_ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        if (who[i]->gm || who[i]->stage)
            return TY_ENOTSUP;
    uint64_t need = 0;
    for (uint32_t i = 0; i < n; i++) { /* the bans first: they count (sample() sets the same) */
        struct ty_breq *r = who[i];
        if (!draws_after(r, &bs[i]))
            continue;
        ty_gen_ban_ends(&r->gen, r->n_out, b->eog, b->n_eog, r->sampler);
        need += ty_sampler_adj_count(r->sampler, r->n_hist);
    }
    if (need > b->adj_cap) {
        struct ty_logit_adj *a = need > UINT32_MAX ? NULL : realloc(b->adj, need * sizeof(*a));
        if (!a)
            return TY_ENOMEM;
        b->adj = a;
        b->adj_cap = (uint32_t)need;
    }
    uint32_t used = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct ty_breq *r = who[i];
        uint32_t n_adj = 0;
        b->draws[i] = (struct ty_row_draw){0};
        if (!draws_after(r, &bs[i]))
            continue;
        int rc = ty_sampler_prepare(r->sampler, r->hist, r->n_hist, &b->draws[i],
                                    b->adj ? b->adj + used : NULL, b->adj_cap - used, &n_adj);
        if (rc) /* sized above: cannot happen */
            return rc;
        b->draws[i].adj_begin = used;
        used += n_adj;
    }
    return 0;
}

/* A stage's call (r alone in it): its layer range, the hidden states of its tokens in, and
 * (before the last stage) the batcher's rows for those out. TY_ENOMEM: no room for them. */
static int stage_batch(ty_batcher_t *b, struct ty_breq *r, struct ty_batch *batch)
{
    batch->layer_begin = r->lo;
    batch->layer_end = r->hi;
    if (r->lo)
        batch->hidden_in = r->hin + (size_t)ty_kvseq_n_tokens(r->seq) * b->D;
    if (r->hi == b->L)
        return 0;
    if (!b->hout && !(b->hout = malloc((size_t)b->o.step_tokens * b->D * sizeof(float))))
        return TY_ENOMEM;
    batch->hidden_out = b->hout;
    return 0;
}

/* After a call of stage r (before the last) that computed its last n prompt tokens: hand out
 * the rows not handed out before (a preempted stage computes some again), end r once its
 * prompt is done. */
static void stage_out(ty_batcher_t *b, struct ty_breq *r, uint32_t n)
{
    uint32_t end = ty_kvseq_n_tokens(r->seq), start = end - n;
    if (end > r->n_hout) {
        uint32_t from = r->n_hout > start ? r->n_hout : start;
        b->h.on_hidden(b->h.arg, r, b->hout + (size_t)(from - start) * b->D, from, end - from);
        r->n_hout = end;
    }
    if (end == r->n_prompt)
        finish(b, r, TY_FINISH_NONE, 0);
}

int ty_batcher_step(ty_batcher_t *b)
{
    if (!b->o.no_grow)
        grow(b); /* the running first, then what is left for the waiting (vLLM's order) */
    admit(b);
    uint32_t cap = b->o.max_running;
    struct ty_breq *who[cap];
    struct ty_batch_seq bs[cap];
    uint32_t n = compose(b, who, bs);
    int rc = 0;
    if (!n)
        return 0;
    struct ty_batcher_call call = {.n_seqs = n, .decode_only = true};
    for (uint32_t i = 0; i < n; i++) {
        uint64_t p = ty_kvseq_n_tokens(bs[i].seq), l = p + bs[i].n;
        call.n_tokens += bs[i].n;
        call.prefix += (uint32_t)p;
        call.attn_work += l * l - p * p;
        call.context += l;
        call.decode_only = call.decode_only && bs[i].n == 1;
    }
    struct ty_batch batch = {.seqs = bs, .n_seqs = n, .ids = b->ids};
    for (uint32_t i = 0; i < n && batch.ids; i++)
        if (!plain_greedy(who[i]))
            batch.ids = NULL; /* the rows come back for the host's sampler */
    if (!batch.ids && prepare_draws(b, who, bs, n) == 0) { /* or the backend draws them */
        batch.draws = b->draws;
        batch.adj = b->adj;
        batch.samples = b->samples;
    }
    if (who[0]->stage && (rc = stage_batch(b, who[0], &batch)) < 0) {
        finish(b, who[0], TY_FINISH_NONE, rc);
        return rc;
    }
    if (b->h.on_layer) {
        batch.layer_cb = layer_hook;
        batch.layer_arg = b;
        b->call_reqs = who;
        b->call_pieces = bs;
        b->call_n = n;
    }
    uint64_t t0 = ty_clock_us();
    rc = ty_engine_forward(b->e, &batch, b->logits);
    call.forward_us = ty_clock_us() - t0;
    call.rc = rc;
    b->call_n = 0;
    b->steps++;
    b->call = &call;
    for (uint32_t i = 0; i < n && !rc && b->o.trim_window; i++)
        ty_engine_seq_trim(b->e, who[i]->seq);
    for (uint32_t i = 0; i < n; i++) {
        struct ty_breq *r = who[i];
        if (rc)
            finish(b, r, TY_FINISH_NONE, rc);
        else if (r->stage && r->hi < b->L)
            stage_out(b, r, bs[i].n);
        else if (ty_kvseq_n_tokens(r->seq) == r->n_hist && batch.ids)
            accept(b, r, &(struct ty_sample){.id = batch.ids[i]}); /* what sample() picks */
        else if (ty_kvseq_n_tokens(r->seq) == r->n_hist && batch.draws)
            draw_done(b, r, &batch, i);
        else if (ty_kvseq_n_tokens(r->seq) == r->n_hist)
            sample(b, r, b->logits + (size_t)i * b->V);
    }
    call.step_us = ty_clock_us() - t0;
    b->call = NULL;
    if (b->h.on_forward)
        b->h.on_forward(b->h.arg, &call);
    return rc ? rc : (int)n;
}

const struct ty_batcher_call *ty_batcher_call(const ty_batcher_t *b)
{
    return b->call;
}

/* ---- life -------------------------------------------------------------------------------- */

int ty_batcher_new(ty_batcher_t **out, const struct ty_batcher_opts *opts)
{
    if (!out || !opts || !opts->engine || !opts->hooks.on_token || !opts->hooks.on_end)
        return TY_EINVAL;
    ty_batcher_t *b = calloc(1, sizeof(*b));
    if (!b)
        return TY_ENOMEM;
    b->o = *opts;
    b->h = opts->hooks;
    b->e = opts->engine;
    b->pool = ty_engine_pool(b->e);
    b->m = ty_engine_model(b->e);
    b->V = ty_model_config(b->m)->n_vocab;
    b->B = ty_kvpool_block_tokens(b->pool);
    b->max_ctx = ty_engine_max_ctx(b->e);
    b->D = ty_model_config(b->m)->dim;
    b->L = ty_model_config(b->m)->n_layers;
    if (!b->o.max_running)
        b->o.max_running = 64;
    if (!b->o.step_tokens)
        b->o.step_tokens = ty_engine_max_batch_tokens(b->e);
    uint32_t total = ty_kvpool_pages_total(b->pool);
    b->watermark = total / 100 ? total / 100 : 1;
    b->n_eog = ty_model_eog_list(b->m, b->eog, TY_SAMPLE_MAX_BAN);
    if (b->n_eog > TY_SAMPLE_MAX_BAN)
        b->n_eog = TY_SAMPLE_MAX_BAN;
    b->waiting_tail = &b->waiting;
    b->cap_run = b->o.max_running;
    b->run = malloc(b->cap_run * sizeof(*b->run));
    b->logits = malloc((size_t)b->o.max_running * b->V * sizeof(float));
    b->ids = malloc(b->o.max_running * sizeof(uint32_t));
    if (!b->run || !b->logits || !b->ids) {
        free(b->run);
        free(b->logits);
        free(b->ids);
        free(b);
        return TY_ENOMEM;
    }
    *out = b;
    return 0;
}

void ty_batcher_end_all(ty_batcher_t *b, int rc)
{
    while (b->n_run)
        finish(b, b->run[b->n_run - 1], TY_FINISH_NONE, rc);
    while (b->waiting)
        finish(b, b->waiting, TY_FINISH_NONE, rc);
    while (b->reserved)
        finish(b, b->reserved, TY_FINISH_NONE, rc);
}

void ty_batcher_free(ty_batcher_t *b)
{
    if (!b)
        return;
    for (uint32_t i = 0; i < b->n_run; i++)
        breq_free(b, b->run[i]);
    struct ty_breq *lists[2] = {b->waiting, b->reserved};
    for (int k = 0; k < 2; k++)
        for (struct ty_breq *r = lists[k], *next; r; r = next) {
            next = r->next;
            breq_free(b, r);
        }
    free(b->run);
    free(b->logits);
    free(b->ids);
    free(b->draws);
    free(b->samples);
    free(b->adj);
    free(b->hout);
    ty_grammar_vocab_free(b->gvocab);
    free(b->gmask);
    free(b);
}

ty_breq_t *ty_batcher_find(ty_batcher_t *b, uint64_t id)
{
    for (uint32_t i = 0; i < b->n_run; i++)
        if (b->run[i]->id == id)
            return b->run[i];
    struct ty_breq *lists[2] = {b->waiting, b->reserved};
    for (int k = 0; k < 2; k++)
        for (struct ty_breq *r = lists[k]; r; r = r->next)
            if (r->id == id)
                return r;
    return NULL;
}

void ty_batcher_stats(const ty_batcher_t *b, struct ty_batcher_stats *out)
{
    *out = (struct ty_batcher_stats){.running = b->n_run, .waiting = b->n_waiting,
                                     .requeued = b->n_requeued, .reserved = b->n_reserved,
                                     .preemptions = b->preemptions, .steps = b->steps};
}

bool ty_batcher_idle(const ty_batcher_t *b)
{
    return !b->n_run && !b->n_waiting && !b->n_reserved;
}

uint64_t ty_breq_id(const ty_breq_t *r) { return r->id; }
void *ty_breq_user(const ty_breq_t *r) { return r->user; }
ty_kvseq_t *ty_breq_seq(const ty_breq_t *r) { return r->seq; }
const uint32_t *ty_breq_tokens(const ty_breq_t *r) { return r->hist; }
uint32_t ty_breq_n_prompt(const ty_breq_t *r) { return r->n_prompt; }
uint32_t ty_breq_n_output(const ty_breq_t *r) { return r->n_out; }
uint32_t ty_breq_n_cached(const ty_breq_t *r) { return r->n_cached; }
uint32_t ty_breq_n_preempted(const ty_breq_t *r) { return r->n_preempted; }
uint32_t ty_breq_stage_ready(const ty_breq_t *r) { return r->n_hin; }
