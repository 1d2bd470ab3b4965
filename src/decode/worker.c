/* The continuous-batching worker (tycho/decode.h). The token rules (EOS not reported, stop
 * string cut, max_tokens, context full) are those of ty_engine_generate() in
 * src/engine/generate.c, so a request served here gives the ids and text `tycho generate`
 * gives for the same prompt and parameters. */
#include "tycho/decode.h"

#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/backend.h"
#include "tycho/stoptext.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct wseq {
    struct wseq *next;
    uint64_t id;
    uint32_t *hist; /* prompt then output */
    size_t n_hist, cap_hist, n_prompt;
    struct ty_gen_params gen;
    ty_kvseq_t *seq;
    ty_sampler_t *sampler;
    struct ty_stoptext st; /* text, stop strings, what was sent */
    uint32_t n_cached, n_out;
    uint32_t n_preempted; /* times its pages were taken back (recomputed on readmission) */
    bool cancelled;
};

struct ty_decode_worker {
    struct ty_decode_worker_opts o;
    ty_engine_t *e;
    const ty_model_t *m;
    const ty_tokenizer_t *tok;
    uint32_t V;
    uint32_t eog[TY_SAMPLE_MAX_BAN]; /* the model's end-of-generation ids (min_tokens) */
    size_t n_eog;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct wseq *inbox, **inbox_tail; /* under mu */
    uint64_t *cancels;                /* under mu */
    size_t n_cancels, cap_cancels;
    uint32_t n_inbox;
    bool stop;
    struct ty_serve_stats stats;      /* under mu */
    uint32_t requeued_pub;            /* under mu: n_requeued as of the last publish_stats */
    /* worker thread only */
    struct wseq *waiting, **waiting_tail;
    uint32_t n_waiting;
    uint32_t n_requeued;              /* of the waiting: preempted ones (not new requests) */
    struct wseq **running;            /* in admission order: the last is preempted first */
    uint32_t n_running;
    uint32_t watermark;               /* free pages kept when admitting beside others */
    float *logits;                    /* (max_running, V) */
};

static void wseq_free(ty_decode_worker_t *w, struct wseq *s)
{
    if (!s)
        return;
    ty_kvpool_seq_free(ty_engine_pool(w->e), s->seq);
    ty_sampler_free(s->sampler);
    ty_stoptext_clear(&s->st);
    free(s->hist);
    free(s);
}

/* Report an event carrying the text up to `text_end` not sent yet (0: none). */
static void emit(ty_decode_worker_t *w, struct wseq *s, enum ty_serve_event_kind kind,
                 const struct ty_sample *smp, size_t text_end, enum ty_finish fin, int error)
{
    struct ty_serve_event ev = {.id = s->id, .kind = kind, .finish = fin, .error = error};
    if (smp)
        ev.sample = *smp;
    ev.text = ty_stoptext_take(&s->st, text_end, &ev.text_len);
    ev.n_prompt = (uint32_t)s->n_prompt;
    ev.n_cached = s->n_cached;
    ev.n_output = s->n_out;
    w->o.event_cb(w->o.event_arg, &ev);
}

/* ---- submit / cancel / stats (any thread) ----------------------------------------------------- */

static int wseq_build(ty_decode_worker_t *w, const struct ty_serve_request *r, struct wseq **out)
{
    struct wseq *s = calloc(1, sizeof(*s));
    if (!s)
        return TY_ENOMEM;
    s->id = r->id;
    s->gen = r->gen;
    s->gen.stop = NULL;
    s->gen.n_stop = 0;
    s->cap_hist = r->n_prompt + (r->gen.max_tokens < 4096 ? r->gen.max_tokens : 4096) + 1;
    s->hist = malloc(s->cap_hist * sizeof(uint32_t));
    int rc = s->hist ? 0 : TY_ENOMEM;
    size_t n_stop = r->gen.n_stop < TY_SERVE_MAX_STOP ? r->gen.n_stop : TY_SERVE_MAX_STOP;
    if (!rc)
        rc = ty_stoptext_init(&s->st, w->tok, r->gen.stop, n_stop);
    if (!rc)
        rc = ty_sampler_new(&s->sampler, &r->gen.sampling, w->V);
    if (rc) {
        free(s->hist);
        ty_stoptext_clear(&s->st);
        ty_sampler_free(s->sampler);
        free(s);
        return rc;
    }
    memcpy(s->hist, r->prompt, r->n_prompt * sizeof(uint32_t));
    s->n_hist = s->n_prompt = r->n_prompt;
    *out = s;
    return 0;
}

static int worker_submit(void *ctx, const struct ty_serve_request *r)
{
    ty_decode_worker_t *w = ctx;
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
        wseq_free(w, s);
    return rc;
}

static int worker_cancel(void *ctx, uint64_t id)
{
    ty_decode_worker_t *w = ctx;
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
    ty_decode_worker_t *w = ctx;
    pthread_mutex_lock(&w->mu);
    *out = w->stats;
    pthread_mutex_unlock(&w->mu);
}

/* GET /status of `tycho serve`: the engine under the API. */
static char *worker_status_json(void *ctx)
{
    ty_decode_worker_t *w = ctx;
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

struct ty_serve_backend ty_decode_worker_backend(ty_decode_worker_t *w)
{
    return (struct ty_serve_backend){&worker_iface, w};
}

/* ---- the worker thread ------------------------------------------------------------------------- */

static void publish_stats(ty_decode_worker_t *w)
{
    ty_kvpool_t *p = ty_engine_pool(w->e);
    pthread_mutex_lock(&w->mu);
    w->stats.running = w->n_running;
    w->stats.waiting = w->n_waiting + w->n_inbox;
    w->requeued_pub = w->n_requeued;
    w->stats.kv_pages_total = ty_kvpool_pages_total(p);
    w->stats.kv_usage = w->stats.kv_pages_total
                            ? (double)ty_kvpool_pages_used(p) / w->stats.kv_pages_total
                            : 0;
    pthread_mutex_unlock(&w->mu);
}

/* Remove running[i], keeping the others in admission order. */
static void running_remove(ty_decode_worker_t *w, uint32_t i)
{
    memmove(&w->running[i], &w->running[i + 1], (w->n_running - i - 1) * sizeof(*w->running));
    w->n_running--;
}

/* Drop the running or waiting sequence `id` (an ERROR ECANCELED event). */
static void apply_cancel(ty_decode_worker_t *w, uint64_t id)
{
    for (uint32_t i = 0; i < w->n_running; i++) {
        if (w->running[i]->id == id) {
            struct wseq *s = w->running[i];
            running_remove(w, i);
            emit(w, s, TY_SERVE_EV_ERROR, NULL, 0, TY_FINISH_NONE, TY_ECANCELED);
            wseq_free(w, s);
            return;
        }
    }
    for (struct wseq **pp = &w->waiting; *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id) {
            struct wseq *s = *pp;
            *pp = s->next;
            if (w->waiting_tail == &s->next)
                w->waiting_tail = pp;
            w->n_waiting--;
            w->n_requeued -= s->n_preempted ? 1 : 0;
            emit(w, s, TY_SERVE_EV_ERROR, NULL, 0, TY_FINISH_NONE, TY_ECANCELED);
            wseq_free(w, s);
            return;
        }
    }
}

/* Move the inbox to the waiting queue and apply cancels; block while there is nothing to do.
 * Returns false when the worker must stop. */
static bool take_inbox(ty_decode_worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->stop && !w->inbox && !w->n_cancels && !w->n_running && !w->n_waiting)
        pthread_cond_wait(&w->cv, &w->mu);
    struct wseq *in = w->inbox;
    uint32_t n_in = w->n_inbox;
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
    if (in) {
        *w->waiting_tail = in;
        while (in->next)
            in = in->next;
        w->waiting_tail = &in->next;
        w->n_waiting += n_in;
    }
    for (size_t i = 0; i < nc; i++)
        apply_cancel(w, ids[i]);
    return !stop;
}

/* Admit waiting requests in FIFO order while the pages of what they still have to compute (the
 * prompt; after a preemption, prompt and output so far) can be reserved, keeping `watermark`
 * pages free for the running sequences to grow into. A request alone always gets its chance;
 * if even then its pages do not fit, it fails with TY_ENOCAPACITY. */
static void admit(ty_decode_worker_t *w)
{
    ty_kvpool_t *p = ty_engine_pool(w->e);
    while (w->waiting && w->n_running < w->o.max_running) {
        struct wseq *s = w->waiting;
        int rc = ty_kvpool_seq_new(p, &s->seq);
        int cached = rc ? rc : ty_kvpool_seq_match_prefix(p, s->seq, s->hist, s->n_hist);
        if (cached >= 0)
            rc = ty_kvpool_seq_reserve(p, s->seq, (uint32_t)(s->n_hist - (size_t)cached));
        else
            rc = cached;
        if (!rc && w->n_running && ty_kvpool_pages_free(p) < w->watermark)
            rc = TY_ENOCAPACITY;
        if (rc == TY_ENOCAPACITY && w->n_running) {
            ty_kvpool_seq_free(p, s->seq); /* wait for pages to free up */
            s->seq = NULL;
            return;
        }
        w->waiting = s->next;
        if (!w->waiting)
            w->waiting_tail = &w->waiting;
        w->n_waiting--;
        w->n_requeued -= s->n_preempted ? 1 : 0;
        s->next = NULL;
        if (rc) {
            emit(w, s, TY_SERVE_EV_ERROR, NULL, 0, TY_FINISH_NONE, rc);
            wseq_free(w, s);
            continue;
        }
        if (!s->n_preempted)
            s->n_cached = (uint32_t)cached; /* usage reports what the prompt found */
        w->running[w->n_running++] = s;
    }
}

/* Take running[i]'s pages back: its full blocks stay cached (a readmission finds them unless
 * they were evicted meanwhile), the rest is recomputed from its tokens when it is admitted
 * again, at the head of the queue. Its sampler and text state are kept, so its output is the
 * one it would have given without the preemption. */
static void preempt(ty_decode_worker_t *w, uint32_t i)
{
    struct wseq *s = w->running[i];
    running_remove(w, i);
    ty_kvpool_seq_free(ty_engine_pool(w->e), s->seq);
    s->seq = NULL;
    s->n_preempted++;
    s->next = w->waiting;
    if (!w->waiting)
        w->waiting_tail = &s->next;
    w->waiting = s;
    w->n_waiting++;
    w->n_requeued++;
    pthread_mutex_lock(&w->mu);
    uint64_t n = ++w->stats.preemptions;
    pthread_mutex_unlock(&w->mu);
    TY_LOG_WARN("serve", "KV cache full: request %llu preempted (%llu so far), recomputed when "
                "pages are free; more KV memory or a lower max_batch_size avoids this",
                (unsigned long long)s->id, (unsigned long long)n);
}

/* Pages are reserved as sequences grow, not up front: before a step, every running sequence
 * gets room for the tokens it has left to compute, oldest first; when the pool is full the
 * newest running sequence is preempted (as vLLM does), until the older ones fit. A sequence
 * that cannot grow even alone fails (the pool is smaller than its context). */
static void grow(ty_decode_worker_t *w)
{
    ty_kvpool_t *p = ty_engine_pool(w->e);
    for (uint32_t i = 0; i < w->n_running; i++) {
        struct wseq *s = w->running[i];
        uint32_t left = (uint32_t)(s->n_hist - ty_kvseq_n_tokens(s->seq));
        int rc;
        while ((rc = ty_kvpool_seq_reserve(p, s->seq, left)) == TY_ENOCAPACITY &&
               w->n_running > i + 1)
            preempt(w, w->n_running - 1);
        if (rc == TY_ENOCAPACITY && i > 0) {
            preempt(w, i); /* the newest itself; older ones still run */
        } else if (rc) {
            running_remove(w, i--);
            emit(w, s, TY_SERVE_EV_ERROR, NULL, 0, TY_FINISH_NONE, rc);
            wseq_free(w, s);
        }
    }
}

/* Record sampled token `smp` for `s`. Returns the finish reason (NONE: keeps going). */
static enum ty_finish accept_token(ty_decode_worker_t *w, struct wseq *s,
                                   const struct ty_sample *smp, int *err)
{
    if (ty_gen_is_end(&s->gen, w->m, smp->id)) /* EOS or a stop token: not in the output */
        return TY_FINISH_EOS;
    if (s->n_hist == s->cap_hist) {
        uint32_t *nh = realloc(s->hist, (s->cap_hist * 2) * sizeof(uint32_t));
        if (!nh) {
            *err = TY_ENOMEM;
            return TY_FINISH_NONE;
        }
        s->hist = nh;
        s->cap_hist *= 2;
    }
    s->hist[s->n_hist++] = smp->id;
    s->n_out++;
    enum ty_finish fin = TY_FINISH_NONE;
    int rc = ty_stoptext_push(&s->st, smp->id);
    if (rc < 0) {
        *err = rc;
        return TY_FINISH_NONE;
    }
    if (ty_stoptext_hit(&s->st))
        fin = TY_FINISH_STOP;
    if (!fin && s->n_out >= s->gen.max_tokens)
        fin = TY_FINISH_LENGTH;
    if (!fin && ty_kvseq_n_tokens(s->seq) + 1 >= ty_engine_max_ctx(w->e))
        fin = TY_FINISH_CTX;
    return fin;
}

/* Sample the next token of `s` from its logits row and report it; true when s finished. */
static bool sample_and_report(ty_decode_worker_t *w, struct wseq *s, float *row)
{
    struct ty_sample smp;
    ty_gen_ban_ends(&s->gen, s->n_out, w->eog, w->n_eog, s->sampler);
    int err = ty_sampler_sample(s->sampler, row, s->hist, s->n_hist, &smp);
    enum ty_finish fin = err ? TY_FINISH_NONE : accept_token(w, s, &smp, &err);
    if (err) {
        emit(w, s, TY_SERVE_EV_ERROR, NULL, 0, TY_FINISH_NONE, err);
        return true;
    }
    if (fin != TY_FINISH_EOS)
        emit(w, s, TY_SERVE_EV_TOKEN, &smp, ty_stoptext_safe_end(&s->st, fin != TY_FINISH_NONE),
             fin, 0);
    if (!fin)
        return false;
    ty_stoptext_flush(&s->st); /* nothing after a stop string; TY_ENOMEM: the tail is lost */
    emit(w, s, TY_SERVE_EV_DONE, NULL, ty_stoptext_safe_end(&s->st, true), fin, 0);
    return true;
}

/* One step: every decoding sequence's next token plus prefill chunks of the others (prompts,
 * and what a preempted sequence recomputes), within the step's token budget; then sample the
 * sequences whose pending tokens are all in. */
static int step(ty_decode_worker_t *w)
{
    struct ty_batch_seq bs[w->n_running ? w->n_running : 1];
    uint32_t map[w->n_running ? w->n_running : 1], nb = 0, budget = w->o.step_tokens;
    for (int pass = 0; pass < 2; pass++) { /* decodes first, then prefill chunks */
        for (uint32_t i = 0; i < w->n_running && budget; i++) {
            struct wseq *s = w->running[i];
            uint32_t have = ty_kvseq_n_tokens(s->seq), left = (uint32_t)(s->n_hist - have);
            bool decoding = left == 1;
            if (!left || decoding != (pass == 0))
                continue;
            uint32_t n = left < budget ? left : budget;
            bs[nb] = (struct ty_batch_seq){.seq = s->seq, .tokens = s->hist + have, .n = n};
            map[nb++] = i;
            budget -= n;
        }
    }
    if (!nb)
        return 0;
    struct ty_batch b = {.seqs = bs, .n_seqs = nb};
    int rc = ty_engine_forward(w->e, &b, w->logits);
    bool done[w->n_running];
    memset(done, 0, sizeof(done));
    for (uint32_t k = 0; k < nb; k++) {
        struct wseq *s = w->running[map[k]];
        if (rc) {
            emit(w, s, TY_SERVE_EV_ERROR, NULL, 0, TY_FINISH_NONE, rc);
            done[map[k]] = true;
        } else if (ty_kvseq_n_tokens(s->seq) == s->n_hist) {
            done[map[k]] = sample_and_report(w, s, w->logits + (size_t)k * w->V);
        }
    }
    for (uint32_t i = w->n_running; i-- > 0;) {
        if (done[i]) {
            wseq_free(w, w->running[i]);
            running_remove(w, i);
        }
    }
    pthread_mutex_lock(&w->mu);
    w->stats.steps++;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

static void *worker_main(void *arg)
{
    ty_decode_worker_t *w = arg;
    while (take_inbox(w)) {
        grow(w); /* the running first, then what is left for the waiting (vLLM's order) */
        admit(w);
        publish_stats(w);
        int rc = step(w);
        if (rc)
            TY_LOG_WARN("decode", "forward step failed: %s", ty_strerror(rc));
        publish_stats(w);
    }
    return NULL;
}

int ty_decode_worker_new(ty_decode_worker_t **out, const struct ty_decode_worker_opts *opts)
{
    if (!out || !opts || !opts->engine || !opts->event_cb)
        return TY_EINVAL;
    ty_decode_worker_t *w = calloc(1, sizeof(*w));
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
    w->m = ty_engine_model(w->e);
    w->tok = ty_model_tokenizer(w->m);
    w->V = ty_model_config(w->m)->n_vocab;
    w->inbox_tail = &w->inbox;
    w->waiting_tail = &w->waiting;
    w->running = calloc(w->o.max_running, sizeof(*w->running));
    w->logits = malloc((size_t)w->o.max_running * w->V * sizeof(float));
    w->n_eog = ty_model_eog_list(w->m, w->eog, TY_SAMPLE_MAX_BAN);
    if (w->n_eog > TY_SAMPLE_MAX_BAN)
        w->n_eog = TY_SAMPLE_MAX_BAN;
    w->stats.max_ctx = ty_engine_max_ctx(w->e);
    w->stats.kv_block_tokens = ty_kvpool_block_tokens(ty_engine_pool(w->e));
    w->stats.kv_pages_total = ty_kvpool_pages_total(ty_engine_pool(w->e));
    w->watermark = w->stats.kv_pages_total / 100 ? w->stats.kv_pages_total / 100 : 1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (!w->running || !w->logits || pthread_create(&w->thread, NULL, worker_main, w)) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w->running);
        free(w->logits);
        free(w);
        return TY_ENOMEM;
    }
    *out = w;
    return 0;
}

void ty_decode_worker_free(ty_decode_worker_t *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    for (uint32_t i = 0; i < w->n_running; i++)
        wseq_free(w, w->running[i]);
    for (struct wseq *s = w->waiting, *n; s; s = n) {
        n = s->next;
        wseq_free(w, s);
    }
    for (struct wseq *s = w->inbox, *n; s; s = n) {
        n = s->next;
        wseq_free(w, s);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->cancels);
    free(w->running);
    free(w->logits);
    free(w);
}
