/* The batcher (tycho/batcher.h) on the real stories260K model, driven the way `tycho serve`'s
 * worker, the decode node and the prefill node drive it: shared forward calls, preemption and
 * readmission, admission order (lookahead, preempted first, a first block in flight), chunked
 * prompts, requests whose KV comes from elsewhere (add_reserved / kv_landed), no_grow, cancel.
 * Preemption behaves the same everywhere and is tested once, here. The reference for every
 * request's tokens is ty_engine_generate() run alone on an engine of its own, or the story the
 * model is known to tell; nothing expected is produced by the batcher. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/batcher.h"
#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/kvpool.h"
#include "tycho/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REQ 8
#define MAX_OUT 128

static ty_model_t *model;
static uint32_t V, n_layers;

/* What the hooks saw of one request. `calls` values are the forward calls completed before
 * the event (during step k's token hooks that is k - 1). */
struct rec {
    uint64_t id;
    ty_breq_t *r; /* until on_end */
    uint32_t ids[MAX_OUT], n_ids;
    bool admitted, ended, reserved;
    int admit_rank; /* 1: the first on_admit of the run */
    uint64_t admit_calls, first_calls, end_calls;
    uint32_t admit_pages, admit_tokens, first_pages;
    uint32_t requeued_at_admit; /* preempted requests still waiting at its admission */
    uint32_t n_ids_at_preempt;  /* its output when it was last preempted */
    uint32_t n_preempted;
    enum ty_finish fin;
    int rc;
};

/* One batcher on one engine, with every hook recording into it. */
struct harness {
    ty_engine_t *e;
    ty_batcher_t *b;
    uint32_t step_tokens;
    struct rec rec[MAX_REQ];
    size_t n;
    int n_admits;
    uint64_t preempted[64];
    size_t n_preempt;
    uint64_t calls, layer_calls, layer_calls_expected;
    struct ty_batcher_call first, last;
    uint32_t max_running, max_waiting;
};

/* ---- the model and the reference ----------------------------------------------------------- */

/* max_ctx 256; with few pages the engine lowers it to what the pool holds. */
static ty_engine_t *mk_engine(uint32_t B, uint32_t pages, uint32_t max_ctx)
{
    struct ty_engine_opts o = {
        .kv_block_tokens = B, .kv_pages = pages, .max_ctx = max_ctx ? max_ctx : 256};
    ty_engine_t *e;
    assert_int_equal(ty_engine_new(&e, model, &o), 0);
    return e;
}

/* A deterministic prompt of `n` in-vocabulary ids starting with BOS (test_engine.c's). */
static void mk_prompt(uint32_t *p, uint32_t n, uint32_t salt)
{
    p[0] = 1;
    for (uint32_t i = 1; i < n; i++)
        p[i] = 259 + (i * 37 + salt * 101) % 253;
}

/* `text` tokenized with BOS. */
static uint32_t text_prompt(const char *text, uint32_t *ids, uint32_t cap)
{
    int n =
        ty_tokenizer_encode(ty_model_tokenizer(model), text, strlen(text), true, false, ids, cap);
    assert_true(n > 1 && (uint32_t)n <= cap);
    return (uint32_t)n;
}

static struct ty_gen_params greedy(uint32_t max_tokens, bool ignore_eos)
{
    struct ty_gen_params g = {.max_tokens = max_tokens, .ignore_eos = ignore_eos};
    g.sampling.repetition_penalty = 1;
    return g;
}

/* ty_engine_generate alone on a fresh engine (block size B, context max_ctx): the tokens a
 * request must give. */
static void reference(const uint32_t *prompt, uint32_t n, const struct ty_gen_params *g, uint32_t B,
                      uint32_t max_ctx, struct ty_gen_result *out)
{
    ty_engine_t *e = mk_engine(B, 0, max_ctx);
    size_t len = n;
    assert_int_equal(ty_engine_generate(e, &prompt, &len, 1, g, out, NULL, NULL), 0);
    ty_engine_free(e);
}

/* r finished normally with exactly the reference's tokens and finish. */
static void assert_same(const struct rec *r, const struct ty_gen_result *ref)
{
    assert_true(r->ended);
    assert_int_equal(r->rc, 0);
    assert_int_equal(r->n_ids, ref->n_ids);
    assert_memory_equal(r->ids, ref->ids, ref->n_ids * sizeof(uint32_t));
    assert_int_equal(r->fin, ref->finish);
}

/* ---- the hooks: record what a user of the batcher would see -------------------------------- */

static struct rec *rec_of(ty_breq_t *r)
{
    struct rec *x = ty_breq_user(r);
    assert_non_null(x);
    assert_int_equal(ty_breq_id(r), x->id);
    assert_false(x->ended);
    return x;
}

static int on_token(void *arg, ty_breq_t *r, const struct ty_sample *s, enum ty_finish fin)
{
    struct harness *h = arg;
    struct rec *x = rec_of(r);
    assert_false(x->reserved); /* a reserved request takes no token before its KV lands */
    if (!x->n_ids) {
        x->first_calls = h->calls;
        x->first_pages = ty_kvseq_n_pages(ty_breq_seq(r));
    }
    if (fin != TY_FINISH_EOS) {
        assert_true(x->n_ids < MAX_OUT);
        x->ids[x->n_ids++] = s->id;
    }
    assert_int_equal(ty_breq_n_output(r), x->n_ids);
    return fin;
}

static void on_end(void *arg, ty_breq_t *r, enum ty_finish fin, int rc)
{
    struct harness *h = arg;
    struct rec *x = rec_of(r);
    assert_int_equal(ty_breq_n_output(r), x->n_ids);
    x->ended = true;
    x->fin = fin;
    x->rc = rc;
    x->end_calls = h->calls;
    x->n_preempted = ty_breq_n_preempted(r);
    x->r = NULL;
}

static int on_admit(void *arg, ty_breq_t *r)
{
    struct harness *h = arg;
    struct rec *x = rec_of(r);
    assert_false(x->admitted); /* first admission only */
    struct ty_batcher_stats st;
    ty_batcher_stats(h->b, &st);
    x->admitted = true;
    x->admit_rank = ++h->n_admits;
    x->admit_calls = h->calls;
    x->admit_pages = ty_kvseq_n_pages(ty_breq_seq(r));
    x->admit_tokens = ty_kvseq_n_tokens(ty_breq_seq(r));
    x->requeued_at_admit = st.requeued;
    return 0;
}

static void on_layer(void *arg, ty_breq_t *r, const struct ty_batch_seq *piece, uint32_t layer)
{
    struct harness *h = arg;
    rec_of(r);
    assert_ptr_equal(piece->seq, ty_breq_seq(r));
    assert_true(layer < n_layers);
    h->layer_calls++;
}

/* Holds pages and runs: admitted, or landed and not preempted since. */
static bool running(const struct rec *x)
{
    return !x->ended && !x->reserved && x->r && ty_breq_seq(x->r);
}

/* The newest running request is the one preempted: nothing added after it still runs, and
 * something older does (the one that needed the pages). */
static void on_preempt(void *arg, ty_breq_t *r, uint64_t n)
{
    struct harness *h = arg;
    struct rec *x = rec_of(r);
    assert_int_equal(n, h->n_preempt + 1);
    assert_true(h->n_preempt < 64);
    h->preempted[h->n_preempt++] = x->id;
    assert_null(ty_breq_seq(r)); /* its pages went back */
    x->n_ids_at_preempt = x->n_ids;
    bool older_runs = false;
    for (size_t i = 0; i < h->n; i++) {
        const struct rec *o = &h->rec[i];
        if (o->id > x->id)
            assert_false(running(o));
        else if (o->id < x->id)
            older_runs = older_runs || running(o);
    }
    assert_true(older_runs);
}

static void on_forward(void *arg, const struct ty_batcher_call *c)
{
    struct harness *h = arg;
    assert_int_equal(c->rc, 0);
    assert_true(c->n_seqs >= 1 && c->n_tokens >= c->n_seqs);
    assert_true(c->n_tokens <= h->step_tokens);
    if (!h->calls)
        h->first = *c;
    h->last = *c;
    h->calls++;
    h->layer_calls_expected += (uint64_t)c->n_seqs * n_layers;
    struct ty_batcher_stats st;
    ty_batcher_stats(h->b, &st);
    h->max_running = st.running > h->max_running ? st.running : h->max_running;
    h->max_waiting = st.waiting > h->max_waiting ? st.waiting : h->max_waiting;
}

static void harness_init(struct harness *h, ty_engine_t *e, struct ty_batcher_opts o)
{
    memset(h, 0, sizeof(*h));
    h->e = e;
    o.engine = e;
    o.hooks = (struct ty_batcher_hooks){.arg = h,
                                        .on_token = on_token,
                                        .on_end = on_end,
                                        .on_admit = on_admit,
                                        .on_layer = on_layer,
                                        .on_forward = on_forward,
                                        .on_preempt = on_preempt};
    h->step_tokens = o.step_tokens ? o.step_tokens : ty_engine_max_batch_tokens(e);
    assert_int_equal(ty_batcher_new(&h->b, &o), 0);
}

static void harness_close(struct harness *h)
{
    assert_true(ty_batcher_idle(h->b));
    ty_batcher_free(h->b);
    ty_engine_free(h->e);
}

static struct rec *submit(struct harness *h, const uint32_t *prompt, uint32_t n,
                          const struct ty_gen_params *g)
{
    assert_true(h->n < MAX_REQ);
    struct rec *x = &h->rec[h->n++];
    memset(x, 0, sizeof(*x));
    x->id = h->n;
    struct ty_breq_opts o = {.id = x->id, .prompt = prompt, .n_prompt = n, .gen = g, .user = x};
    assert_int_equal(ty_batcher_add(h->b, &o, &x->r), 0);
    return x;
}

/* As the decode node: ty_batcher_add_reserved; NULL and *rc when refused. */
static struct rec *submit_reserved(struct harness *h, const uint32_t *prompt, uint32_t n,
                                   const struct ty_gen_params *g, int *rc)
{
    assert_true(h->n < MAX_REQ);
    struct rec *x = &h->rec[h->n];
    memset(x, 0, sizeof(*x));
    x->id = h->n + 1;
    x->reserved = true;
    struct ty_breq_opts o = {.id = x->id, .prompt = prompt, .n_prompt = n, .gen = g, .user = x};
    *rc = ty_batcher_add_reserved(h->b, &o, &x->r);
    if (*rc)
        return NULL;
    h->n++;
    return x;
}

static void step_once(struct harness *h)
{
    assert_true(ty_batcher_step(h->b) > 0);
}

/* Step until nothing is held; every step must run something (nothing may get stuck). */
static void run_to_idle(struct harness *h)
{
    for (int guard = 0; !ty_batcher_idle(h->b); guard++) {
        assert_true(guard < 2000);
        step_once(h);
    }
    assert_int_equal(ty_kvpool_pages_used(ty_engine_pool(h->e)), 0); /* all pages back */
}

/* The token "." (it ends the model's sentences) as the tokenizer writes it after a word. */
static uint32_t dot_id(void)
{
    uint32_t ids[8];
    const ty_tokenizer_t *tok = ty_model_tokenizer(model);
    int n = ty_tokenizer_encode(tok, "Lily.", 5, false, false, ids, 8);
    assert_true(n >= 2 && n <= 8);
    size_t len;
    const char *p = ty_tokenizer_piece(tok, ids[n - 1], &len);
    assert_true(len == 1 && p[0] == '.');
    return ids[n - 1];
}

/* ---- 1. shared forward calls ------------------------------------------------------------- */

static void test_shared_calls(void **state)
{
    static const char *texts[] = {"Once upon a time",       "Lily and Ben went to the park",
                                  "The little dog was sad", "One day, a bird flew",
                                  "Tom had a big red ball", "The sun was hot and"};
    static const uint32_t max_tokens[] = {60, 25, 40, 10, 80, 33};
    enum { N = 6 };
    uint32_t prompts[N][32], lens[N];
    struct ty_gen_params g[N];
    struct ty_gen_result ref[N];
    struct harness h;
    harness_init(&h, mk_engine(16, 0, 0), (struct ty_batcher_opts){0});
    uint32_t ctx = ty_engine_max_ctx(h.e);
    for (int i = 0; i < N; i++) {
        lens[i] = text_prompt(texts[i], prompts[i], 32);
        g[i] = greedy(max_tokens[i], false);
    }
    /* the model's stories run on past these lengths: the end rules are tried with a stop
     * token (".", ends like EOS, not in the output) and, on another request, min_tokens */
    uint32_t dot = dot_id();
    g[1].stop_ids[0] = g[4].stop_ids[0] = dot;
    g[1].n_stop_ids = g[4].n_stop_ids = 1;
    g[1].min_tokens = 5;
    g[4].min_tokens = 30;
    /* a sampled request with every adjustment a draw carries: penalties, a logit bias, and the
     * min_tokens ban of its stop token (the batcher prepares its draws before each call; the
     * reference samples the rows itself: the same stream, draw for draw) */
    g[5].sampling.temperature = 0.9f;
    g[5].sampling.seed = 5;
    g[5].sampling.top_p = 0.95f;
    g[5].sampling.presence_penalty = 0.4f;
    g[5].sampling.repetition_penalty = 1.2f;
    g[5].sampling.n_logprobs = 2;
    g[5].sampling.n_logit_bias = 1;
    g[5].sampling.logit_bias[0] = (struct ty_logit_bias){dot, 1.0f};
    g[5].stop_ids[0] = dot;
    g[5].n_stop_ids = 1;
    g[5].min_tokens = 12;
    struct ty_gen_result no_min;
    g[4].min_tokens = 0;
    reference(prompts[4], lens[4], &g[4], 16, ctx, &no_min);
    g[4].min_tokens = 30;
    for (int i = 0; i < N; i++) {
        reference(prompts[i], lens[i], &g[i], 16, ctx, &ref[i]);
        submit(&h, prompts[i], lens[i], &g[i]);
    }
    /* the cases are what they claim: answers cut by the stop token, later with min_tokens */
    assert_int_equal(ref[1].finish, TY_FINISH_EOS);
    assert_int_equal(ref[4].finish, TY_FINISH_EOS);
    assert_true(ref[1].n_ids >= 5);
    assert_int_equal(no_min.finish, TY_FINISH_EOS);
    assert_true(no_min.n_ids < 30 && ref[4].n_ids >= 30);
    ty_gen_result_clear(&no_min);
    run_to_idle(&h);
    /* all six prompts in the first call, then one decode call per token of the longest */
    assert_int_equal(h.first.n_seqs, N);
    uint64_t longest = 0;
    for (int i = 0; i < N; i++) {
        assert_same(&h.rec[i], &ref[i]);
        uint64_t draws = h.rec[i].n_ids + (h.rec[i].fin == TY_FINISH_EOS);
        longest = draws > longest ? draws : longest;
    }
    assert_int_equal(h.calls, longest);
    assert_int_equal(h.layer_calls, h.layer_calls_expected);
    /* the story the model tells, independent of generate */
    uint32_t all[32 + MAX_OUT];
    char text[2048];
    memcpy(all, prompts[0], lens[0] * sizeof(uint32_t));
    memcpy(all + lens[0], h.rec[0].ids, h.rec[0].n_ids * sizeof(uint32_t));
    assert_true(ty_tokenizer_decode(ty_model_tokenizer(model), all, lens[0] + h.rec[0].n_ids, true,
                                    text, sizeof(text)) > 0);
    assert_non_null(strstr(text, "Once upon a time, there was a little girl named Lily. She "
                                 "loved to play outside in the park."));
    printf("ok: %d requests shared %llu forward calls (first call %u sequences), each gave "
           "generate's ids (a stop token and min_tokens among them); the story reads as "
           "expected\n",
           N, (unsigned long long)h.calls, h.first.n_seqs);
    for (int i = 0; i < N; i++)
        ty_gen_result_clear(&ref[i]);
    harness_close(&h);
}

/* ---- 2. preemption ----------------------------------------------------------------------- */

static void test_preemption(void **state)
{
    static const char *texts[] = {"Lily and Ben went to the park", "The little dog was sad",
                                  "Tom had a big red ball", "One day, a bird flew",
                                  "Once upon a time"};
    enum { N = 4, B = 4, PAGES = 24, GEN = 40 };
    uint32_t prompts[N + 1][32], lens[N + 1];
    struct ty_gen_params g[N + 1];
    struct ty_gen_result ref[N + 1];
    struct harness h;
    /* 24 pages of 4 tokens: four answers of ~48 tokens (12 pages each) cannot all grow */
    harness_init(&h, mk_engine(B, PAGES, 0), (struct ty_batcher_opts){.lookahead = 4});
    uint32_t ctx = ty_engine_max_ctx(h.e);
    for (int i = 0; i <= N; i++) {
        lens[i] = text_prompt(texts[i], prompts[i], 32);
        g[i] = greedy(i < N ? GEN : 10, true);
    }
    /* the newest samples with a seed: its sampler is kept across preemption */
    g[N - 1].sampling.temperature = 0.9f;
    g[N - 1].sampling.seed = 1234;
    for (int i = 0; i <= N; i++)
        reference(prompts[i], lens[i], &g[i], B, ctx, &ref[i]);
    for (int i = 0; i < N; i++)
        submit(&h, prompts[i], lens[i], &g[i]);
    /* once something was preempted, a small newcomer must not pass it (preempted first) */
    struct rec *late = NULL;
    uint32_t requeued_when_added = 0;
    for (int guard = 0; !ty_batcher_idle(h.b); guard++) {
        assert_true(guard < 2000);
        step_once(&h);
        struct ty_batcher_stats st;
        ty_batcher_stats(h.b, &st);
        assert_true(ty_kvpool_pages_used(ty_engine_pool(h.e)) <= PAGES);
        if (!late && st.preemptions) {
            requeued_when_added = st.requeued;
            /* nor may a reservation (a decode node's) take the pages they need back */
            uint32_t used = ty_kvpool_pages_used(ty_engine_pool(h.e));
            int rc;
            assert_null(submit_reserved(&h, prompts[N], lens[N], &g[N], &rc));
            assert_int_equal(rc, TY_ENOCAPACITY);
            assert_int_equal(ty_kvpool_pages_used(ty_engine_pool(h.e)), used);
            late = submit(&h, prompts[N], lens[N], &g[N]);
        }
    }
    assert_int_equal(ty_kvpool_pages_used(ty_engine_pool(h.e)), 0);
    struct ty_batcher_stats st;
    ty_batcher_stats(h.b, &st);
    assert_true(st.preemptions > 0);
    assert_int_equal(st.preemptions, h.n_preempt);
    assert_int_equal(st.requeued, 0);
    uint32_t mid_answer = 0;
    for (int i = 0; i < N; i++) {
        assert_same(&h.rec[i], &ref[i]);
        assert_int_equal(h.rec[i].n_ids, GEN);
        if (h.rec[i].n_preempted && h.rec[i].n_ids_at_preempt > 0)
            mid_answer++;
    }
    assert_true(mid_answer > 0); /* preempted with output made, readmitted, finished */
    assert_true(h.rec[N - 1].n_preempted > 0); /* the newest went first */
    assert_int_equal(h.rec[0].n_preempted, 0); /* the oldest never */
    assert_non_null(late);
    assert_true(requeued_when_added > 0);
    assert_true(late->admitted);
    assert_int_equal(late->requeued_at_admit, 0);
    assert_same(late, &ref[N]);
    printf("ok: %llu preemptions (newest running each time), %u requests preempted mid-answer "
           "were readmitted and gave generate's ids (seeded sampling included); a newcomer "
           "waited for the preempted and a reservation was refused; all pages free at the "
           "end\n",
           (unsigned long long)st.preemptions, mid_answer);
    for (int i = 0; i <= N; i++)
        ty_gen_result_clear(&ref[i]);
    harness_close(&h);
}

/* ---- 3. admission order ------------------------------------------------------------------ */

/* A (40-token prompt, growing to 9 pages of 8) runs; Big (88 tokens: 11 pages + the watermark)
 * cannot join it in 16 pages; Small (one page) could. */
static void admit_order(uint32_t lookahead, struct rec out[3])
{
    enum { B = 8, PAGES = 16 };
    uint32_t a[40], big[88], small[16], n_small;
    mk_prompt(a, 40, 1);
    mk_prompt(big, 88, 2);
    n_small = text_prompt("Once upon a time", small, 16);
    struct ty_gen_params ga = greedy(30, true), gb = greedy(10, true), gs = greedy(5, true);
    struct harness h;
    harness_init(&h, mk_engine(B, PAGES, 0), (struct ty_batcher_opts){.lookahead = lookahead});
    uint32_t ctx = ty_engine_max_ctx(h.e);
    struct ty_gen_result ref[3];
    reference(a, 40, &ga, B, ctx, &ref[0]);
    reference(big, 88, &gb, B, ctx, &ref[1]);
    reference(small, n_small, &gs, B, ctx, &ref[2]);
    submit(&h, a, 40, &ga);
    submit(&h, big, 88, &gb);
    submit(&h, small, n_small, &gs);
    run_to_idle(&h);
    for (int i = 0; i < 3; i++) {
        assert_same(&h.rec[i], &ref[i]);
        assert_int_equal(h.rec[i].n_preempted, 0);
        ty_gen_result_clear(&ref[i]);
        out[i] = h.rec[i];
    }
    harness_close(&h);
}

static void test_admission_order(void **state)
{
    struct rec r[3];
    admit_order(0, r); /* strict order: Small waits behind Big though it fits */
    assert_int_equal(r[0].admit_rank, 1);
    assert_int_equal(r[1].admit_rank, 2);
    assert_int_equal(r[2].admit_rank, 3);
    assert_true(r[1].admit_calls > r[0].end_calls); /* Big only once A is done */
    assert_true(r[2].admit_calls >= r[1].admit_calls);
    printf("ok: lookahead 0: admitted A, Big, Small; Small waited %llu calls behind Big\n",
           (unsigned long long)r[2].admit_calls);
    admit_order(1, r); /* Small passes Big */
    assert_int_equal(r[0].admit_rank, 1);
    assert_int_equal(r[2].admit_rank, 2);
    assert_int_equal(r[1].admit_rank, 3);
    assert_int_equal(r[2].admit_calls, 0); /* with A, in the first step */
    assert_true(r[2].end_calls < r[1].admit_calls);
    assert_true(r[1].admit_calls > r[0].end_calls);
    printf("ok: lookahead 1: admitted A, Small, Big; Small done before Big started\n");
}

/* Two prompts that start with the same blocks, queued together: the second waits while the
 * first computes them, then finds them in the page cache (as one after the other would). */
static void test_shared_head_waits(void **state)
{
    enum { B = 16, SHARED = 40, LEN = 50 };
    uint32_t p1[LEN], p2[LEN];
    mk_prompt(p1, LEN, 4);
    memcpy(p2, p1, SHARED * sizeof(uint32_t));
    for (uint32_t i = SHARED; i < LEN; i++)
        p2[i] = 300 + i; /* a different tail */
    struct ty_gen_params g = greedy(12, true);
    struct harness h;
    harness_init(&h, mk_engine(B, 0, 0), (struct ty_batcher_opts){0});
    uint32_t ctx = ty_engine_max_ctx(h.e);
    struct ty_gen_result r1, r2;
    reference(p1, LEN, &g, B, ctx, &r1);
    reference(p2, LEN, &g, B, ctx, &r2);
    struct rec *x1 = submit(&h, p1, LEN, &g), *x2 = submit(&h, p2, LEN, &g);
    run_to_idle(&h);
    assert_int_equal(x1->admit_calls, 0);
    assert_int_equal(x2->admit_calls, 1);               /* the next step */
    assert_int_equal(x2->admit_tokens, SHARED / B * B); /* the shared full blocks, cached */
    assert_same(x1, &r1);
    assert_same(x2, &r2);
    printf("ok: a prompt whose first block another was computing waited one step and found "
           "%u tokens cached; both gave generate's ids\n",
           x2->admit_tokens);
    ty_gen_result_clear(&r1);
    ty_gen_result_clear(&r2);
    harness_close(&h);
}

/* opts.lookahead is a window: with lookahead 1 only the one request right behind a blocked
 * head may pass it. Queue [A, Big, Small, Small2]: Small is admitted with A, Small2 only after
 * Big. */
static void test_lookahead_window(void **state)
{
    enum { B = 8, PAGES = 16 };
    uint32_t a[40], big[88], s1[16], s2[16];
    mk_prompt(a, 40, 1);
    mk_prompt(big, 88, 2);
    uint32_t n1 = text_prompt("Once upon a time", s1, 16);
    uint32_t n2 = text_prompt("Tom had a big red ball", s2, 16);
    struct ty_gen_params ga = greedy(30, true), gb = greedy(10, true), gs = greedy(5, true);
    struct harness h;
    harness_init(&h, mk_engine(B, PAGES, 0), (struct ty_batcher_opts){.lookahead = 1});
    submit(&h, a, 40, &ga);
    struct rec *rb = submit(&h, big, 88, &gb);
    struct rec *r1 = submit(&h, s1, n1, &gs);
    struct rec *r2 = submit(&h, s2, n2, &gs);
    run_to_idle(&h);
    printf("lookahead 1: ranks A %d Big %d Small %d Small2 %d\n", h.rec[0].admit_rank,
           rb->admit_rank, r1->admit_rank, r2->admit_rank);
    assert_int_equal(r1->admit_rank, 2);
    assert_true(r2->admit_rank > rb->admit_rank); /* fails: Small2 passed Big as well */
    harness_close(&h);
}

/* ---- 4. chunked prompts ------------------------------------------------------------------ */

static void test_chunked_prompt(void **state)
{
    enum { B = 16, STEP = 16, LONG = 100 };
    uint32_t lp[LONG], sp[16], ns;
    mk_prompt(lp, LONG, 3);
    ns = text_prompt("Once upon a time", sp, 16);
    struct ty_gen_params gl = greedy(10, true), gs = greedy(30, false);
    struct harness h;
    harness_init(&h, mk_engine(B, 0, 0), (struct ty_batcher_opts){.step_tokens = STEP});
    uint32_t ctx = ty_engine_max_ctx(h.e);
    struct ty_gen_result rl, rs;
    reference(lp, LONG, &gl, B, ctx, &rl);
    reference(sp, ns, &gs, B, ctx, &rs);
    struct rec *xl = submit(&h, lp, LONG, &gl);
    step_once(&h);
    assert_int_equal(h.last.n_seqs, 1);
    assert_int_equal(h.last.n_tokens, STEP); /* a chunk, not the whole prompt */
    struct rec *xs = submit(&h, sp, ns, &gs);
    bool joined = false;
    for (int guard = 0; !ty_batcher_idle(h.b); guard++) {
        assert_true(guard < 2000);
        step_once(&h);
        if (h.last.n_seqs == 2 && !xl->ended && ty_kvseq_n_tokens(ty_breq_seq(xl->r)) < LONG)
            joined = true; /* the short one shared a call with the long one's chunks */
    }
    assert_int_equal(ty_kvpool_pages_used(ty_engine_pool(h.e)), 0);
    assert_true(joined);
    assert_int_equal(xs->first_calls, 1); /* whole, in the call right after it came */
    assert_true(xs->first_calls < xl->first_calls);
    assert_true(xl->first_calls + 1 >= (LONG + STEP - 1) / STEP); /* the long one: chunks */
    assert_same(xl, &rl);
    assert_same(xs, &rs);
    printf("ok: a %d-token prompt in calls of %d: first token after %llu calls; a short prompt "
           "joined them and had its first token in call 2; both gave generate's ids\n",
           LONG, STEP, (unsigned long long)xl->first_calls + 1);
    ty_gen_result_clear(&rl);
    ty_gen_result_clear(&rs);
    harness_close(&h);
}

/* ---- 5. reserved requests (the decode node) ---------------------------------------------- */

static uint32_t argmax(const float *l)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < V; i++)
        best = l[i] > l[best] ? i : best;
    return best;
}

/* What a prefill node does for r: compute the prompt on its own engine, write its KV into r's
 * reserved pages layer by layer (range i to range i, tycho/kvpool.h), sample the first token
 * (greedy). Then the KvReady: ty_batcher_kv_landed. */
static void prefill_and_land(struct harness *h, struct rec *x, const uint32_t *prompt, uint32_t n,
                             uint32_t B)
{
    ty_engine_t *pe = mk_engine(B, 0, 0);
    ty_kvpool_t *src = ty_engine_pool(pe), *dst = ty_engine_pool(h->e);
    assert_true(ty_kvpool_is_host(src) && ty_kvpool_is_host(dst));
    assert_int_equal(ty_kvpool_page_bytes(src), ty_kvpool_page_bytes(dst));
    ty_kvseq_t *s;
    float *logits = malloc((size_t)V * sizeof(float));
    assert_int_equal(ty_kvpool_seq_new(src, &s), 0);
    struct ty_batch_seq bs = {s, prompt, n, false};
    struct ty_batch b = {.seqs = &bs, .n_seqs = 1};
    assert_int_equal(ty_engine_forward(pe, &b, logits), 0);
    struct ty_kv_range rs[64], rd[64];
    for (uint32_t l = 0; l < n_layers; l++) {
        int ns = ty_kvpool_seq_layer_ranges(src, s, l, rs, 64);
        int nd = ty_kvpool_seq_layer_ranges(dst, ty_breq_seq(x->r), l, rd, 64);
        assert_true(ns > 0);
        assert_int_equal(ns, nd);
        for (int i = 0; i < ns; i++)
            memcpy(rd[i].ptr, rs[i].ptr, rs[i].len);
    }
    struct ty_sample first = {.id = argmax(logits)};
    x->reserved = false;
    uint32_t before = x->n_ids;
    assert_int_equal(ty_batcher_kv_landed(h->b, x->r, &first, 0), 0);
    assert_int_equal(x->n_ids, before + 1); /* the first token went through on_token at once */
    ty_kvpool_seq_free(src, s);
    ty_engine_free(pe);
    free(logits);
}

/* 8 pages of 8 tokens. X (10-token prompt, 40 tokens: 7 pages) runs; R (20-token prompt, 3
 * pages) is reserved beside it; X cannot grow past 5 pages while R holds its 3 and stalls. */
struct reserved_setup {
    struct harness h;
    uint32_t xp[16], rp[20], nx;
    struct ty_gen_params gx, gr;
    struct ty_gen_result refx, refr;
    struct rec *x, *r;
};

static void reserved_start(struct reserved_setup *t)
{
    enum { B = 8, PAGES = 8 };
    t->nx = text_prompt("Lily and Ben went to the park", t->xp, 16);
    mk_prompt(t->rp, 20, 7);
    t->gx = greedy(40, true);
    t->gr = greedy(8, true);
    struct harness *h = &t->h;
    harness_init(h, mk_engine(B, PAGES, 0), (struct ty_batcher_opts){0});
    ty_kvpool_t *pool = ty_engine_pool(h->e);
    uint32_t ctx = ty_engine_max_ctx(h->e);
    reference(t->xp, t->nx, &t->gx, B, ctx, &t->refx);
    reference(t->rp, 20, &t->gr, B, ctx, &t->refr);
    t->x = submit(h, t->xp, t->nx, &t->gx);
    step_once(h);
    uint32_t used = ty_kvpool_pages_used(pool);
    int rc;
    t->r = submit_reserved(h, t->rp, 20, &t->gr, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(ty_kvpool_pages_used(pool), used + 3); /* its prompt's pages, at once */
    assert_int_equal(ty_kvseq_n_pages(ty_breq_seq(t->r->r)), 3);
    /* a second one would leave less than the watermark free: refused, nothing held */
    struct rec *r2 = submit_reserved(h, t->rp, 20, &t->gr, &rc);
    assert_null(r2);
    assert_int_equal(rc, TY_ENOCAPACITY);
    assert_int_equal(ty_kvpool_pages_used(pool), used + 3);
    /* X runs alone until it needs R's pages; R never steps */
    uint64_t steps = 0;
    int n;
    while ((n = ty_batcher_step(h->b)) > 0) {
        assert_int_equal(n, 1);
        assert_int_equal(h->last.n_seqs, 1);
        assert_int_equal(ty_kvseq_n_tokens(ty_breq_seq(t->r->r)), 0);
        assert_true(++steps < 100);
    }
    assert_int_equal(n, 0);
    struct ty_batcher_stats st;
    ty_batcher_stats(h->b, &st);
    assert_int_equal(st.reserved, 1);
    assert_int_equal(st.running, 1);
    assert_int_equal(st.preemptions, 0);
    assert_false(t->x->ended); /* stalled, not failed */
    assert_true(t->x->n_ids < t->gx.max_tokens);
    assert_int_equal(t->r->n_ids, 0);
    assert_int_equal(ty_kvpool_pages_free(pool), 0);
    assert_int_equal(ty_batcher_step(h->b), 0); /* and stays so */
}

static void test_reserved_lands(void **state)
{
    struct reserved_setup t;
    reserved_start(&t);
    uint32_t stalled_at = t.x->n_ids;
    prefill_and_land(&t.h, t.r, t.rp, 20, 8);
    run_to_idle(&t.h);
    /* R ran, was preempted by the older X (the newest running goes), came back, finished */
    assert_true(t.r->n_preempted > 0);
    assert_int_equal(t.x->n_preempted, 0);
    assert_true(t.h.n_preempt > 0 && t.h.preempted[0] == t.r->id);
    assert_same(t.x, &t.refx);
    assert_same(t.r, &t.refr);
    printf("ok: reserved request held 3 pages, never stepped until its KV landed; X stalled at "
           "%u tokens meanwhile; both gave generate's ids\n",
           stalled_at);
    ty_gen_result_clear(&t.refx);
    ty_gen_result_clear(&t.refr);
    harness_close(&t.h);
}

static void test_reserved_expires(void **state)
{
    struct reserved_setup t;
    reserved_start(&t);
    ty_kvpool_t *pool = ty_engine_pool(t.h.e);
    uint32_t used = ty_kvpool_pages_used(pool);
    ty_batcher_end(t.h.b, t.r->r, TY_ETIMEDOUT); /* the decode node's expiry */
    assert_true(t.r->ended);
    assert_int_equal(t.r->rc, TY_ETIMEDOUT);
    assert_int_equal(t.r->n_ids, 0);
    assert_int_equal(ty_kvpool_pages_used(pool), used - 3);
    assert_null(ty_batcher_find(t.h.b, t.r->id));
    run_to_idle(&t.h); /* X goes on into the pages R held */
    assert_same(t.x, &t.refx);
    assert_int_equal(t.h.n_preempt, 0);
    printf("ok: an expired reservation gave its 3 pages back and the stalled request "
           "finished with generate's ids\n");
    ty_gen_result_clear(&t.refx);
    ty_gen_result_clear(&t.refr);
    harness_close(&t.h);
}

/* ---- 6. no_grow (the prefill node) ------------------------------------------------------- */

static void test_no_grow(void **state)
{
    enum { B = 8, PAGES = 16, N = 6, LEN = 40, STEP = 16 };
    uint32_t prompts[N][LEN];
    struct ty_gen_params g = greedy(1, false);
    struct ty_gen_result ref[N];
    struct harness h;
    /* the prefill node's batcher: no_grow, lookahead 64, prompts in chunks */
    harness_init(&h, mk_engine(B, PAGES, 0),
                 (struct ty_batcher_opts){
                     .no_grow = true, .lookahead = 64, .max_running = 8, .step_tokens = STEP});
    uint32_t ctx = ty_engine_max_ctx(h.e);
    for (int i = 0; i < N; i++) {
        mk_prompt(prompts[i], LEN, 10 + (uint32_t)i);
        reference(prompts[i], LEN, &g, B, ctx, &ref[i]);
        submit(&h, prompts[i], LEN, &g);
    }
    run_to_idle(&h);
    for (int i = 0; i < N; i++) {
        const struct rec *x = &h.rec[i];
        assert_same(x, &ref[i]);
        assert_int_equal(x->n_ids, 1);
        assert_int_equal(x->admit_tokens, 0);
        assert_int_equal(x->admit_pages, LEN / B);        /* all it computes, at admission */
        assert_int_equal(x->first_pages, x->admit_pages); /* and never more */
        ty_gen_result_clear(&ref[i]);
    }
    /* five pages each in sixteen with one kept free: three at a time, the others waited */
    assert_int_equal(h.max_running, 3);
    assert_true(h.max_waiting >= N - 3);
    assert_true(h.rec[3].admit_calls > h.rec[0].end_calls); /* when the first was done */
    assert_int_equal(h.n_preempt, 0);
    printf("ok: no_grow: every prompt reserved its %d pages at admission and kept them; 3 of %d "
           "ran at a time, none preempted, first tokens equal generate's\n",
           LEN / B, N);
    harness_close(&h);
}

/* ---- 7. cancel --------------------------------------------------------------------------- */

static void test_cancel(void **state)
{
    static const char *texts[] = {"Once upon a time", "Lily and Ben went to the park",
                                  "The little dog was sad", "One day, a bird flew",
                                  "Tom had a big red ball"};
    enum { N = 5, B = 8 };
    uint32_t prompts[N][32], lens[N];
    struct ty_gen_params g = greedy(30, true);
    struct ty_gen_result ref[N];
    struct harness h;
    harness_init(&h, mk_engine(B, 0, 0), (struct ty_batcher_opts){.max_running = 3});
    ty_kvpool_t *pool = ty_engine_pool(h.e);
    uint32_t ctx = ty_engine_max_ctx(h.e);
    for (int i = 0; i < N; i++) {
        lens[i] = text_prompt(texts[i], prompts[i], 32);
        reference(prompts[i], lens[i], &g, B, ctx, &ref[i]);
        submit(&h, prompts[i], lens[i], &g);
    }
    for (int i = 0; i < 5; i++)
        step_once(&h);
    struct ty_batcher_stats st;
    ty_batcher_stats(h.b, &st);
    assert_int_equal(st.running, 3);
    assert_int_equal(st.waiting, 2);
    /* a running request */
    struct rec *c = &h.rec[1];
    uint32_t used = ty_kvpool_pages_used(pool), held = ty_kvseq_n_pages(ty_breq_seq(c->r));
    ty_batcher_end(h.b, c->r, TY_ECANCELED);
    assert_true(c->ended);
    assert_int_equal(c->rc, TY_ECANCELED);
    assert_int_equal(c->fin, TY_FINISH_NONE);
    assert_int_equal(ty_kvpool_pages_used(pool), used - held);
    assert_null(ty_batcher_find(h.b, c->id));
    assert_memory_equal(c->ids, ref[1].ids, c->n_ids * sizeof(uint32_t)); /* right so far */
    step_once(&h); /* its place goes to the next queued one */
    assert_true(h.rec[3].admitted);
    /* a queued request */
    struct rec *q = &h.rec[4];
    assert_false(q->admitted);
    used = ty_kvpool_pages_used(pool);
    ty_batcher_end(h.b, q->r, TY_ECANCELED);
    assert_true(q->ended);
    assert_int_equal(q->rc, TY_ECANCELED);
    assert_int_equal(q->n_ids, 0);
    assert_int_equal(ty_kvpool_pages_used(pool), used);
    run_to_idle(&h);
    assert_false(q->admitted);
    assert_same(&h.rec[0], &ref[0]);
    assert_same(&h.rec[2], &ref[2]);
    assert_same(&h.rec[3], &ref[3]);
    printf("ok: cancel ended a running request (TY_ECANCELED, %u pages back) and a queued one; "
           "the others gave generate's ids\n",
           held);
    for (int i = 0; i < N; i++)
        ty_gen_result_clear(&ref[i]);
    harness_close(&h);
}

int main(void)
{
    const char *data = getenv("TYCHO_TEST_DATA");
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/models/stories260K/stories260K.gguf",
             data ? data : "../shared");
    if (ty_model_load(&model, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "skip: %s\n", err);
        return 77;
    }
    if (!ty_model_tokenizer(model)) {
        fprintf(stderr, "skip: %s has no tokenizer\n", path);
        ty_model_free(model);
        return 77;
    }
    V = ty_model_config(model)->n_vocab;
    n_layers = ty_model_config(model)->n_layers;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_calls),     cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_admission_order),  cmocka_unit_test(test_shared_head_waits),
        cmocka_unit_test(test_chunked_prompt),   cmocka_unit_test(test_reserved_lands),
        cmocka_unit_test(test_reserved_expires), cmocka_unit_test(test_no_grow),
        cmocka_unit_test(test_cancel),           cmocka_unit_test(test_lookahead_window),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ty_model_free(model);
    return rc;
}
