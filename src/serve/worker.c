/* The continuous-batching worker (tycho/serve_local.h). The token rules (EOS not reported, stop
 * string cut, max_tokens, context full) are those of ty_engine_generate() in
 * src/engine/generate.c, so a request served here gives the ids and text `tycho generate`
 * gives for the same prompt and parameters. */
#include "tycho/serve_local.h"

#include "tycho/batcher.h"

#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/backend.h"
#include "tycho/stoptext.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* What the worker keeps of a request beside the batcher's: its text state for stop strings
 * and the events it reports. */
struct wseq {
    struct wseq *next; /* inbox */
    uint64_t id;
    uint32_t *prompt;  /* until it is handed to the batcher */
    size_t n_prompt;
    struct ty_gen_params gen;
    struct ty_stoptext st; /* text, stop strings, what was sent */
};

struct ty_serve_worker {
    struct ty_serve_worker_opts o;
    ty_engine_t *e;
    const ty_tokenizer_t *tok;
    uint32_t V;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct wseq *inbox, **inbox_tail; /* under mu */
    uint64_t *cancels;                /* under mu */
    size_t n_cancels, cap_cancels;
    uint32_t n_inbox;
    bool stop;
    struct ty_serve_stats stats;      /* under mu */
    uint32_t requeued_pub;            /* under mu: preempted waiting ones as of publish_stats */
    ty_batcher_t *b;                  /* worker thread only */
    bool dropping;                    /* ty_serve_worker_free: requests end without events */
};

static void wseq_free(struct wseq *s)
{
    if (!s)
        return;
    ty_stoptext_clear(&s->st);
    free(s->prompt);
    free(s);
}

/* Report an event carrying the text up to `text_end` not sent yet (0: none). */
static void emit(ty_serve_worker_t *w, struct wseq *s, const ty_breq_t *r,
                 enum ty_serve_event_kind kind, const struct ty_sample *smp, size_t text_end,
                 enum ty_finish fin, int error)
{
    struct ty_serve_event ev = {.id = s->id, .kind = kind, .finish = fin, .error = error};
    if (smp)
        ev.sample = *smp;
    ev.text = ty_stoptext_take(&s->st, text_end, &ev.text_len);
    ev.n_prompt = (uint32_t)s->n_prompt;
    ev.n_cached = r ? ty_breq_n_cached(r) : 0;
    ev.n_output = r ? ty_breq_n_output(r) : 0;
    w->o.event_cb(w->o.event_arg, &ev);
}

/* ---- submit / cancel / stats (any thread) ----------------------------------------------------- */

static int wseq_build(ty_serve_worker_t *w, const struct ty_serve_request *r, struct wseq **out)
{
    struct wseq *s = calloc(1, sizeof(*s));
    if (!s)
        return TY_ENOMEM;
    s->id = r->id;
    s->gen = r->gen;
    s->gen.stop = NULL;
    s->gen.n_stop = 0;
    s->prompt = malloc(r->n_prompt * sizeof(uint32_t));
    int rc = s->prompt ? 0 : TY_ENOMEM;
    size_t n_stop = r->gen.n_stop < TY_SERVE_MAX_STOP ? r->gen.n_stop : TY_SERVE_MAX_STOP;
    if (!rc)
        rc = ty_stoptext_init(&s->st, w->tok, r->gen.stop, n_stop);
    if (rc) {
        wseq_free(s);
        return rc;
    }
    memcpy(s->prompt, r->prompt, r->n_prompt * sizeof(uint32_t));
    s->n_prompt = r->n_prompt;
    *out = s;
    return 0;
}

static int worker_submit(void *ctx, const struct ty_serve_request *r)
{
    ty_serve_worker_t *w = ctx;
    uint32_t max_ctx = ty_engine_max_ctx(w->e);
    if (!r->prompt || !r->n_prompt || !r->gen.max_tokens)
        return TY_EINVAL;
    for (size_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] >= w->V)
            return TY_EINVAL;
    if (r->n_prompt + 1 > max_ctx)
        return TY_ERANGE;
    struct wseq *s;
    int rc = wseq_build(w, r, &s);
    if (rc)
        return rc;
    pthread_mutex_lock(&w->mu);
    if (w->stop)
        rc = TY_ESHUTDOWN;
    else if (w->stats.waiting > w->requeued_pub && /* preempted ones take no new one's room */
             w->stats.waiting - w->requeued_pub >= w->o.max_waiting)
        rc = TY_EREJECTED;
    if (!rc) {
        *w->inbox_tail = s;
        w->inbox_tail = &s->next;
        w->n_inbox++;
        w->stats.waiting++;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    if (rc)
        wseq_free(s);
    return rc;
}

static int worker_cancel(void *ctx, uint64_t id)
{
    ty_serve_worker_t *w = ctx;
    int rc = 0;
    pthread_mutex_lock(&w->mu);
    if (w->n_cancels == w->cap_cancels) {
        size_t cap = w->cap_cancels ? w->cap_cancels * 2 : 64;
        uint64_t *nc = realloc(w->cancels, cap * sizeof(uint64_t));
        if (nc) {
            w->cancels = nc;
            w->cap_cancels = cap;
        }
    }
    if (w->n_cancels < w->cap_cancels) {
        w->cancels[w->n_cancels++] = id;
        pthread_cond_signal(&w->cv);
    } else {
        rc = TY_ENOMEM;
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

static void worker_stats(void *ctx, struct ty_serve_stats *out)
{
    ty_serve_worker_t *w = ctx;
    pthread_mutex_lock(&w->mu);
    *out = w->stats;
    pthread_mutex_unlock(&w->mu);
    out->ready = true; /* the engine is up once the worker exists */
}

/* GET /status of `tycho serve`: the engine under the API. */
static char *worker_status_json(void *ctx)
{
    ty_serve_worker_t *w = ctx;
    struct ty_serve_stats st;
    worker_stats(w, &st);
    ty_kvpool_t *p = ty_engine_pool(w->e);
    json_t *o = json_pack("{s:s,s:{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I}}", "role", "serve",
                          "engine", "backend", ty_backend_name(ty_engine_backend(w->e)),
                          "kv_cache_dtype", ty_kv_dtype_name(ty_kvpool_dtype(p)), "kv_pages",
                          (json_int_t)st.kv_pages_total, "kv_block_tokens",
                          (json_int_t)ty_kvpool_block_tokens(p), "max_running",
                          (json_int_t)w->o.max_running, "max_waiting",
                          (json_int_t)w->o.max_waiting, "max_batch_tokens",
                          (json_int_t)ty_engine_max_batch_tokens(w->e), "steps",
                          (json_int_t)st.steps);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

static const struct ty_serve_backend_i worker_iface = {
    .submit = worker_submit,
    .cancel = worker_cancel,
    .stats = worker_stats,
    .status_json = worker_status_json,
};

struct ty_serve_backend ty_serve_worker_backend(ty_serve_worker_t *w)
{
    return (struct ty_serve_backend){&worker_iface, w};
}

/* ---- the worker thread: the batcher's hooks ------------------------------------------------ */

/* A token: stop strings are checked here (the batcher has no text); EOS is not reported. */
static int on_token(void *arg, ty_breq_t *r, const struct ty_sample *smp, enum ty_finish fin)
{
    ty_serve_worker_t *w = arg;
    struct wseq *s = ty_breq_user(r);
    if (fin == TY_FINISH_EOS)
        return fin;
    int rc = ty_stoptext_push(&s->st, smp->id);
    if (rc < 0)
        return rc;
    if (ty_stoptext_hit(&s->st))
        fin = TY_FINISH_STOP;
    emit(w, s, r, TY_SERVE_EV_TOKEN, smp, ty_stoptext_safe_end(&s->st, fin != TY_FINISH_NONE),
         fin, 0);
    return fin;
}

static void on_end(void *arg, ty_breq_t *r, enum ty_finish fin, int rc)
{
    ty_serve_worker_t *w = arg;
    struct wseq *s = ty_breq_user(r);
    if (rc && !w->dropping) {
        emit(w, s, r, TY_SERVE_EV_ERROR, NULL, 0, TY_FINISH_NONE, rc);
    } else if (!w->dropping) {
        ty_stoptext_flush(&s->st); /* nothing after a stop string; TY_ENOMEM: the tail is lost */
        emit(w, s, r, TY_SERVE_EV_DONE, NULL, ty_stoptext_safe_end(&s->st, true), fin, 0);
    }
    wseq_free(s);
}

static void on_preempt(void *arg, ty_breq_t *r, uint64_t n)
{
    TY_LOG_WARN("serve", "KV cache full: request %llu preempted (%llu so far), recomputed when "
                "pages are free; more KV memory or a lower max_batch_size avoids this",
                (unsigned long long)ty_breq_id(r), (unsigned long long)n);
}

static void publish_stats(ty_serve_worker_t *w)
{
    ty_kvpool_t *p = ty_engine_pool(w->e);
    struct ty_batcher_stats bs;
    ty_batcher_stats(w->b, &bs);
    pthread_mutex_lock(&w->mu);
    w->stats.running = bs.running;
    w->stats.waiting = bs.waiting + w->n_inbox;
    w->stats.steps = bs.steps;
    w->stats.preemptions = bs.preemptions;
    w->requeued_pub = bs.requeued;
    w->stats.kv_pages_total = ty_kvpool_pages_total(p);
    w->stats.kv_usage = w->stats.kv_pages_total
                            ? (double)ty_kvpool_pages_used(p) / w->stats.kv_pages_total
                            : 0;
    pthread_mutex_unlock(&w->mu);
}

/* Hand a submitted request to the batcher (an ERROR event when it refuses it). */
static void hand_over(ty_serve_worker_t *w, struct wseq *s)
{
    struct ty_breq_opts o = {.id = s->id, .prompt = s->prompt, .n_prompt = (uint32_t)s->n_prompt,
                             .gen = &s->gen, .user = s};
    int rc = ty_batcher_add(w->b, &o, NULL);
    free(s->prompt);
    s->prompt = NULL;
    if (rc) {
        emit(w, s, NULL, TY_SERVE_EV_ERROR, NULL, 0, TY_FINISH_NONE, rc);
        wseq_free(s);
    }
}

/* Move the inbox to the batcher and apply cancels; block while there is nothing to do.
 * Returns false when the worker must stop. */
static bool take_inbox(ty_serve_worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->stop && !w->inbox && !w->n_cancels && ty_batcher_idle(w->b))
        pthread_cond_wait(&w->cv, &w->mu);
    struct wseq *in = w->inbox;
    w->inbox = NULL;
    w->inbox_tail = &w->inbox;
    w->n_inbox = 0;
    size_t nc = w->n_cancels;
    uint64_t ids[64];
    if (nc > 64)
        nc = 64;
    if (nc) {
        memcpy(ids, w->cancels, nc * sizeof(uint64_t));
        memmove(w->cancels, w->cancels + nc, (w->n_cancels - nc) * sizeof(uint64_t));
        w->n_cancels -= nc;
    }
    bool stop = w->stop;
    pthread_mutex_unlock(&w->mu);
    for (struct wseq *s = in, *next; s; s = next) {
        next = s->next;
        hand_over(w, s);
    }
    for (size_t i = 0; i < nc; i++) {
        ty_breq_t *r = ty_batcher_find(w->b, ids[i]);
        if (r)
            ty_batcher_end(w->b, r, TY_ECANCELED);
    }
    return !stop;
}

static void *worker_main(void *arg)
{
    ty_serve_worker_t *w = arg;
    while (take_inbox(w)) {
        publish_stats(w);
        int rc = ty_batcher_step(w->b);
        if (rc < 0)
            TY_LOG_WARN("decode", "forward step failed: %s", ty_strerror(rc));
        publish_stats(w);
    }
    return NULL;
}

int ty_serve_worker_new(ty_serve_worker_t **out, const struct ty_serve_worker_opts *opts)
{
    if (!out || !opts || !opts->engine || !opts->event_cb)
        return TY_EINVAL;
    ty_serve_worker_t *w = calloc(1, sizeof(*w));
    if (!w)
        return TY_ENOMEM;
    w->o = *opts;
    if (!w->o.max_running)
        w->o.max_running = 64;
    if (!w->o.max_waiting)
        w->o.max_waiting = 1024;
    if (!w->o.step_tokens)
        w->o.step_tokens = 256;
    w->e = opts->engine;
    w->tok = ty_model_tokenizer(ty_engine_model(w->e));
    w->V = ty_model_config(ty_engine_model(w->e))->n_vocab;
    w->inbox_tail = &w->inbox;
    w->stats.max_ctx = ty_engine_max_ctx(w->e);
    w->stats.kv_block_tokens = ty_kvpool_block_tokens(ty_engine_pool(w->e));
    w->stats.kv_pages_total = ty_kvpool_pages_total(ty_engine_pool(w->e));
    uint64_t kv = (uint64_t)w->stats.kv_pages_total * w->stats.kv_block_tokens;
    w->stats.kv_seq_tokens = kv < UINT32_MAX ? (uint32_t)kv : UINT32_MAX;
    struct ty_batcher_opts bo = {
        .engine = w->e, .max_running = w->o.max_running, .step_tokens = w->o.step_tokens,
        .trim_window = true, /* no one exports a served request's KV */
        .hooks = {.arg = w, .on_token = on_token, .on_end = on_end, .on_preempt = on_preempt}};
    int rc = ty_batcher_new(&w->b, &bo);
    if (rc) {
        free(w);
        return rc;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w)) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        ty_batcher_free(w->b);
        free(w);
        return TY_ENOMEM;
    }
    *out = w;
    return 0;
}

void ty_serve_worker_free(ty_serve_worker_t *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    w->dropping = true; /* what is in flight goes without events */
    ty_batcher_end_all(w->b, TY_ESHUTDOWN);
    ty_batcher_free(w->b);
    for (struct wseq *s = w->inbox, *n; s; s = n) {
        n = s->next;
        wseq_free(s);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->cancels);
    free(w);
}
