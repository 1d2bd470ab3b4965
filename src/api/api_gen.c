/* Generation requests: /v1/chat/completions and /v1/completions, streamed (SSE) or not.
 * A request with P prompts (completions) and n choices per prompt becomes P x n backend
 * sequences with ids (seq << 5) | choice, choice = prompt_index * n + j (OpenAI's order); each
 * sequence carries its own prompt, so the backend's prefix cache shares a prompt among its
 * choices as it would among separate requests. Events come back through the sink, on the loop
 * (tycho/serve.h), and are matched by seq in a hash table; a request whose client left is
 * removed at once and its late events are dropped. A choice is marked done before it is
 * cancelled, so the ERROR event a backend may deliver from inside cancel is dropped too.
 * Everything a request holds is allocated from its arena, freed with it (gen_release). */
#include "api-impl.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/grammar.h"
#include "tycho/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct ty__api_gen **bucket(ty_api_t *a, uint64_t seq)
{
    return &a->buckets[seq % TY__API_BUCKETS];
}

static struct ty__api_gen *gen_find(ty_api_t *a, uint64_t seq)
{
    for (struct ty__api_gen *g = *bucket(a, seq); g; g = g->hnext)
        if (g->seq == seq)
            return g;
    return NULL;
}

/* Free a request: its logprob trees, then its arena with everything else, itself included
 * (also for one that never reached the table). */
static void gen_release(struct ty__api_gen *g)
{
    for (uint32_t i = 0; i < TY_API_MAX_CHOICES; i++) {
        json_decref(g->ch[i].logprobs);
        if (g->ch[i].out)
            ty__api_out_free(g->ch[i].out);
    }
    ty_arena_free(g->arena);
}

static void gen_free(struct ty__api_gen *g)
{
    ty_api_t *a = g->a;
    for (struct ty__api_gen **pp = bucket(a, g->seq); *pp; pp = &(*pp)->hnext) {
        if (*pp == g) {
            *pp = g->hnext;
            a->n_inflight--;
            break;
        }
    }
    gen_release(g);
    if (a->draining && !a->n_inflight && a->drain_done) {
        void (*done)(void *) = a->drain_done;
        a->drain_done = NULL;
        done(a->drain_arg);
    }
}

/* Cancel the choices still running; each is marked done first, as its ERROR event may come
 * from inside cancel. */
static void cancel_choices(struct ty__api_gen *g)
{
    const struct ty_serve_backend *b = &g->a->o.backend;
    for (uint32_t i = 0; i < g->n_choices; i++) {
        if (g->ch[i].done)
            continue;
        g->ch[i].done = true;
        b->iface->cancel(b->context, g->ch[i].id);
    }
}

/* The client went away: cancel every choice in the backend (pages freed there). */
static void on_abort(void *arg, ty_http_req_t *r)
{
    struct ty__api_gen *g = arg;
    g->http = NULL;
    cancel_choices(g);
    ty_metrics_counter_inc(g->a->m.ok_abort);
    TY_LOG_DEBUG("api", "%s: client disconnected, cancelled", g->rid);
    gen_free(g);
}

void ty__api_gen_abort_all(ty_api_t *a)
{
    for (size_t b = 0; b < TY__API_BUCKETS; b++)
        while (a->buckets[b]) {
            struct ty__api_gen *g = a->buckets[b];
            if (g->http)
                ty_http_req_set_abort(g->http, NULL, NULL);
            cancel_choices(g);
            gen_free(g);
        }
}

/* ---- JSON pieces ---------------------------------------------------------------------------- */

static uint32_t n_output(const struct ty__api_gen *g)
{
    uint32_t out = 0;
    for (uint32_t i = 0; i < g->n_choices; i++)
        out += g->ch[i].n_out;
    return out;
}

/* Every prompt counts once however many choices it has (as in OpenAI's and vLLM's usage). */
static size_t n_prompt_tokens(const struct ty__api_gen *g, size_t *cached)
{
    size_t n = 0, c = 0;
    for (uint32_t p = 0; p < g->n_prompts; p++) {
        n += g->prompts[p].n;
        c += g->prompts[p].n_cached;
    }
    if (cached)
        *cached = c;
    return n;
}

static json_t *usage_json(const struct ty__api_gen *g)
{
    size_t cached, in = n_prompt_tokens(g, &cached);
    uint32_t out = n_output(g);
    return json_pack("{s:I,s:i,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)in,
                     "completion_tokens", (json_int_t)out, "total_tokens",
                     (json_int_t)(in + out), "prompt_tokens_details", "cached_tokens",
                     (json_int_t)cached);
}

static json_t *ids_json(const uint32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *text_json(const char *s, size_t n)
{
    json_t *t = json_stringn(s, n);
    return t ? t : json_string("\xef\xbf\xbd");
}

/* One token's logprobs in the request's shape: chat {"token","logprob","bytes",
 * "top_logprobs"}, completion: appended to the tokens/token_logprobs/top_logprobs arrays. */
static void logprob_add(struct ty__api_gen *g, json_t *lp, const struct ty_sample *s)
{
    ty_api_t *a = g->a;
    if (g->req.kind == TY_API_CHAT) {
        json_t *top = json_array();
        for (uint32_t k = 0; k < s->n_top && k < g->req.top_logprobs; k++) {
            json_t *t = ty__api_piece_json(a, s->top[k].id);
            json_object_set_new(t, "logprob", json_real(s->top[k].logprob));
            json_array_append_new(top, t);
        }
        json_t *t = ty__api_piece_json(a, s->id);
        json_object_set_new(t, "logprob", json_real(s->logprob));
        json_object_set_new(t, "top_logprobs", top);
        json_array_append_new(json_object_get(lp, "content"), t);
        return;
    }
    json_t *top = json_object();
    for (uint32_t k = 0; k < s->n_top && k < g->req.top_logprobs; k++) {
        json_t *p = ty__api_piece_json(a, s->top[k].id);
        json_object_set_new(top, json_string_value(json_object_get(p, "token")),
                            json_real(s->top[k].logprob));
        json_decref(p);
    }
    json_t *p = ty__api_piece_json(a, s->id);
    json_array_append(json_object_get(lp, "tokens"), json_object_get(p, "token"));
    json_decref(p);
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(s->logprob));
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
}

static json_t *logprobs_new(const struct ty__api_gen *g)
{
    if (g->req.kind == TY_API_CHAT)
        return json_pack("{s:[]}", "content");
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

static json_t *envelope(const struct ty__api_gen *g)
{
    const char *obj = g->req.kind == TY_API_CHAT ? "chat.completion" : "text_completion";
    return json_pack("{s:s,s:s,s:I,s:s,s:[]}", "id", g->rid, "object", obj, "created",
                     (json_int_t)g->created, "model", g->a->model_name, "choices");
}

/* ---- parsed chat output: reasoning and tool calls (api-tools.h) ----------------------------- */

/* Whether a chat request's output is parsed: tools offered (not "none"), a constrained tool
 * choice, a template whose output may hold reasoning (<think>, harmony channels). */
static bool out_wanted(const ty_api_t *a, const struct ty_api_request *q)
{
    return q->kind == TY_API_CHAT &&
           (q->tool_choice != TY_API_TOOL_CHOICE_NONE || a->think ||
            a->fam == TY__API_FAM_HARMONY);
}

static void out_setup(struct ty__api_gen *g, bool think_open)
{
    static const enum ty__api_out_mode modes[] = {
        [TY_API_TOOL_CHOICE_NONE] = TY__API_OUT_TEXT, [TY_API_TOOL_CHOICE_AUTO] = TY__API_OUT_AUTO,
        [TY_API_TOOL_CHOICE_REQUIRED] = TY__API_OUT_REQUIRED,
        [TY_API_TOOL_CHOICE_NAMED] = TY__API_OUT_NAMED};
    struct ty__api_outcfg c = {.fam = g->a->fam, .mode = modes[g->req.tool_choice],
                               .think = g->a->think, .think_open = think_open,
                               .named = g->req.tool_name};
    for (uint32_t i = 0; i < g->n_choices; i++) {
        g->ch[i].out = ty_arena_calloc(g->arena, 1, sizeof(*g->ch[i].out));
        ty__api_out_init(g->ch[i].out, &c);
    }
}

/* An event's text into the choice's parser, and the sampled token's own text when it is a
 * control token the detokenizer left out that marks the family's syntax (<|channel|>, ...):
 * the held-back text of earlier tokens comes first. */
static void out_feed(struct ty__api_gen *g, struct ty__api_choice *ch,
                     const struct ty_serve_event *ev)
{
    const ty_tokenizer_t *tok = g->a->tok;
    if (ty__api_out_feed(ch->out, ev->text, ev->text_len))
        abort(); /* output text is bounded by max_tokens: small metadata (STYLE.md) */
    size_t pl = 0, tl = 0;
    if (ev->kind != TY_SERVE_EV_TOKEN || !tok || !ty_tokenizer_piece(tok, ev->sample.id, &pl) ||
        pl)
        return;
    const char *t = ty_tokenizer_token_text(tok, ev->sample.id, &tl);
    if (t && tl && ty__api_fam_marker(g->a->fam, t, tl) && ty__api_out_feed(ch->out, t, tl))
        abort();
}

struct delta_ctx {
    struct ty__api_gen *g;
    uint32_t i;
};

static void call_id(struct ty__api_gen *g, uint32_t i, size_t k, char *buf, size_t cap)
{
    ty__api_call_id(buf, cap, ty_clock_ns() ^ (g->seq << 16) ^ ((uint64_t)i << 8) ^ k);
}

static void on_delta(void *arg, const struct ty__api_delta *d)
{
    struct delta_ctx *x = arg;
    char id[32];
    switch (d->kind) {
    case TY__API_DELTA_REASONING:
        ty__api_sse_text(x->g, x->i, "reasoning_content", d->text, d->len);
        break;
    case TY__API_DELTA_CONTENT:
        ty__api_sse_text(x->g, x->i, "content", d->text, d->len);
        break;
    case TY__API_DELTA_CALL:
        call_id(x->g, x->i, d->index, id, sizeof(id));
        ty__api_sse_call(x->g, x->i, d->index, id, d->call);
        break;
    }
}

static void no_delta(void *arg, const struct ty__api_delta *d)
{
    (void)arg;
    (void)d;
}

/* OpenAI's finish_reason: "tool_calls" when the output made calls and was not cut short. */
static const char *finish_reason(enum ty_finish f, size_t n_calls)
{
    if (n_calls && f != TY_FINISH_LENGTH && f != TY_FINISH_CTX)
        return "tool_calls";
    return ty_finish_name(f);
}

/* Streaming: what the parse says grew since the last event (final: the output ended; then
 * the last chunk with its finish reason). */
static void out_stream(struct ty__api_gen *g, uint32_t i, bool final, enum ty_finish fin)
{
    struct delta_ctx x = {g, i};
    struct ty__api_snap snap;
    if (ty__api_out_step(g->ch[i].out, final, on_delta, &x, final ? &snap : NULL))
        abort();
    if (final) {
        ty__api_sse_finish(g, i, finish_reason(fin, snap.n_calls));
        ty__api_snap_clear(&snap);
    }
}

/* Non-streaming: the choice's message from the whole output, and its finish reason. */
static json_t *out_message(struct ty__api_gen *g, uint32_t i, const char **reason)
{
    struct ty__api_snap snap;
    if (ty__api_out_step(g->ch[i].out, true, no_delta, NULL, &snap))
        abort();
    const char *content = ty__api_snap_content(&snap);
    json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content",
                          content ? text_json(content, snap.n_content) : json_null());
    if (snap.has_reasoning)
        json_object_set_new(m, "reasoning_content",
                            text_json(snap.reasoning, snap.n_reasoning));
    if (snap.n_calls) {
        json_t *calls = json_array();
        for (size_t k = 0; k < snap.n_calls; k++) {
            char id[32];
            call_id(g, i, k, id, sizeof(id));
            json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:o,s:o}}", "id", id, "type",
                                                   "function", "function", "name",
                                                   text_json(snap.calls[k].name,
                                                             strlen(snap.calls[k].name)),
                                                   "arguments",
                                                   text_json(snap.calls[k].args,
                                                             strlen(snap.calls[k].args))));
        }
        json_object_set_new(m, "tool_calls", calls);
    }
    *reason = finish_reason(g->ch[i].finish, snap.n_calls);
    ty__api_snap_clear(&snap);
    return m;
}

/* ---- streaming (the chunks themselves: api_sse.c) ------------------------------------------ */

static void stream_finish(struct ty__api_gen *g)
{
    if (g->req.include_usage) {
        size_t cached, in = n_prompt_tokens(g, &cached);
        ty__api_sse_usage(g, in, cached, n_output(g));
    }
    if (g->http) {
        ty_http_stream_write(g->http, "data: [DONE]\n\n", 14);
        ty_http_stream_end(g->http);
        g->http = NULL;
    }
}

/* Completion text with the echoed prompt in front (in the request's arena, *n set). */
static char *echo_join(struct ty__api_gen *g, const struct ty__api_prompt *p, const char *text,
                       size_t len, size_t *n)
{
    char *s = ty_arena_alloc(g->arena, p->n_echo + len + 1);
    memcpy(s, p->echo, p->n_echo);
    memcpy(s + p->n_echo, text, len);
    s[p->n_echo + len] = 0;
    *n = p->n_echo + len;
    return s;
}

/* ---- whole responses ------------------------------------------------------------------------ */

static void respond_whole(struct ty__api_gen *g)
{
    json_t *o = envelope(g);
    for (uint32_t i = 0; i < g->n_choices; i++) {
        struct ty__api_choice *ch = &g->ch[i];
        const struct ty__api_prompt *p = &g->prompts[ch->prompt];
        json_t *c = json_pack("{s:i}", "index", (json_int_t)i), *t;
        if (p->echo) {
            size_t n;
            char *s = echo_join(g, p, ch->text ? ch->text : "", ch->n_text, &n);
            t = text_json(s, n);
        } else {
            t = text_json(ch->text ? ch->text : "", ch->n_text);
        }
        const char *reason = ty_finish_name(ch->finish);
        if (ch->out) {
            json_decref(t);
            json_object_set_new(c, "message", out_message(g, i, &reason));
        } else if (g->req.kind == TY_API_CHAT) {
            json_object_set_new(c, "message", json_pack("{s:s,s:o}", "role", "assistant",
                                                        "content", t));
        } else {
            json_object_set_new(c, "text", t);
        }
        json_object_set_new(c, "logprobs", ch->logprobs ? json_incref(ch->logprobs) : json_null());
        json_object_set_new(c, "finish_reason", json_string(reason));
        if (g->req.return_token_ids)
            json_object_set_new(c, "token_ids", ids_json(ch->ids, ch->n_ids));
        if (g->req.return_token_ids && g->req.kind == TY_API_COMPLETION)
            json_object_set_new(c, "prompt_token_ids", ids_json(p->ids, p->n));
        json_array_append_new(json_object_get(o, "choices"), c);
    }
    json_object_set_new(o, "usage", usage_json(g));
    /* top level as before for one prompt; with several, each choice carries its own */
    if (g->req.return_token_ids && g->n_prompts == 1)
        json_object_set_new(o, "prompt_token_ids", ids_json(g->prompts[0].ids, g->prompts[0].n));
    ty__api_send_json(g->http, 200, o);
    g->http = NULL;
}

static void backend_error(struct ty_api_error *e, int rc, const struct ty_serve_reject *rej,
                          const char *what)
{
    if (rc == TY_EREJECTED && rej && rej->code[0]) {
        ty_api_error_set(e, 429, "rate_limit_exceeded", NULL, rej->code, "%s", rej->message);
        e->retry_after_s = rej->retry_after_s;
        e->no_retry = rej->no_retry;
    } else if (rc == TY_EREJECTED)
        ty_api_error_set(e, 429, "rate_limit_exceeded", NULL, "rate_limit_exceeded",
                         "the server is at capacity; retry later");
    else if (rc == TY_ENOTFOUND && rej && rej->message[0])
        ty_api_error_set(e, 400, "invalid_request_error", "slo_class", "unknown_slo_class", "%s",
                         rej->message);
    else if ((rc == TY_ESHUTDOWN || rc == TY_EUNAVAIL) && what && what[0])
        ty_api_error_set(e, 503, "service_unavailable", NULL, "service_unavailable", "%s", what);
    else if (rc == TY_ESHUTDOWN || rc == TY_EUNAVAIL)
        ty_api_error_set(e, 503, "service_unavailable", NULL, "service_unavailable",
                         "no backend is available to serve the request");
    else if (rc == TY_ERANGE || rc == TY_ENOCAPACITY || rc == TY_EINVAL)
        ty_api_error_set(e, 400, "invalid_request_error", NULL, "context_length_exceeded",
                         "the request does not fit the model's context or KV cache (%s)",
                         ty_strerror(rc));
    else if (what && what[0])
        ty_api_error_set(e, 500, "server_error", NULL, NULL, "generation failed: %s (%s)", what,
                         ty_strerror(rc));
    else
        ty_api_error_set(e, 500, "server_error", NULL, NULL, "generation failed: %s",
                         ty_strerror(rc));
}

/* ---- events --------------------------------------------------------------------------------- */

/* Append n elements of el bytes to an array in the request's arena, doubling it when full
 * (the old copy stays in the arena: at most as much again as the final size). */
static void push_bytes(struct ty__api_gen *g, char **buf, size_t *len, size_t *cap, const void *p,
                       size_t n, size_t el)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        while (nc < *len + n + 1)
            nc *= 2;
        char *nb = ty_arena_alloc(g->arena, nc * el);
        if (*len)
            memcpy(nb, *buf, *len * el);
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len * el, p, n * el);
    *len += n;
    if (el == 1)
        (*buf)[*len] = 0;
}

static void record_done(struct ty__api_gen *g)
{
    ty_api_t *a = g->a;
    uint64_t now = ty_clock_ns();
    uint32_t out = n_output(g);
    size_t cached, in = n_prompt_tokens(g, &cached);
    ty_metrics_histogram_observe(a->m.e2e, (double)(now - g->t0_ns) / 1e9);
    if (out > 1 && g->t_first_ns)
        ty_metrics_histogram_observe(a->m.tpot, (double)(g->t_last_ns - g->t_first_ns) / 1e9 /
                                                    (double)(out - 1));
    ty_metrics_counter_add(a->m.prompt, (double)in);
    ty_metrics_counter_add(a->m.gen, (double)out);
    ty_metrics_counter_add(a->m.cache_q, (double)in);
    ty_metrics_counter_add(a->m.cache_hit, (double)cached);
    enum ty_finish f = g->ch[0].finish;
    ty_metrics_counter_inc(f == TY_FINISH_LENGTH || f == TY_FINISH_CTX ? a->m.ok_length
                                                                       : a->m.ok_stop);
}

/* The first token's bytes reached the socket: the last of the front's own time. */
static void on_first_flushed(void *arg, uint64_t t_event_ns, uint64_t t_ns)
{
    ty_api_t *a = arg;
    ty_metrics_histogram_observe(a->m.own_first, (double)(t_ns - t_event_ns) / 1e9);
}

static void on_token(struct ty__api_gen *g, uint32_t i, const struct ty_serve_event *ev)
{
    struct ty__api_choice *ch = &g->ch[i];
    uint64_t now = ty_clock_ns();
    bool first = !g->t_first_ns;
    if (first) {
        g->t_first_ns = now;
        ty_metrics_histogram_observe(g->a->m.ttft, (double)(now - g->t0_ns) / 1e9);
        ty_metrics_histogram_observe(g->a->m.own_relay, ev->relay_us / 1e6);
    } else if (i == 0) {
        ty_metrics_histogram_observe(g->a->m.itl, (double)(now - g->t_last_ns) / 1e9);
    }
    if (i == 0 || !g->t_last_ns)
        g->t_last_ns = now;
    ch->n_out = ev->n_output;
    if (ch->out)
        out_feed(g, ch, ev);
    if (g->req.stream && ch->out) {
        out_stream(g, i, false, TY_FINISH_NONE);
        if (first && g->http)
            ty_http_req_on_flush(g->http, on_first_flushed, g->a, now);
        return;
    }
    if (g->req.stream) {
        ty__api_sse_chunk(g, i, ev->text, ev->text_len, &ev->sample, NULL, TY_FINISH_NONE);
        if (first && g->http)
            ty_http_req_on_flush(g->http, on_first_flushed, g->a, now);
        return;
    }
    push_bytes(g, &ch->text, &ch->n_text, &ch->cap_text, ev->text, ev->text_len, 1);
    push_bytes(g, (char **)&ch->ids, &ch->n_ids, &ch->cap_ids, &ev->sample.id, 1,
               sizeof(uint32_t));
    if (g->req.logprobs) {
        if (!ch->logprobs)
            ch->logprobs = logprobs_new(g);
        logprob_add(g, ch->logprobs, &ev->sample);
        if (g->req.kind == TY_API_COMPLETION)
            json_array_append_new(json_object_get(ch->logprobs, "text_offset"),
                                  json_integer((json_int_t)(ch->n_text - ev->text_len)));
    }
}

static void on_error(struct ty__api_gen *g, const struct ty_serve_event *ev)
{
    struct ty_api_error e;
    backend_error(&e, ev->error, NULL, ev->message);
    g->failed = true;
    cancel_choices(g);
    if (g->req.stream) {
        char *s = ty_api_error_json(&e);
        struct ty_http_frame f;
        if (s && g->http && !ty_http_frame_begin(g->http, &f)) {
            ty_http_frame_put(&f, "data: ", 6);
            ty_http_frame_put(&f, s, strlen(s));
            ty_http_frame_put(&f, "\n\n", 2);
            ty_http_frame_end(&f);
        }
        free(s);
        stream_finish(g);
    } else if (g->http) {
        ty__api_send_error(g->http, &e);
        g->http = NULL;
    }
    gen_free(g);
}

void ty__api_on_event(void *arg, const struct ty_serve_event *ev)
{
    ty_api_t *a = arg;
    struct ty__api_gen *g = gen_find(a, ev->id >> TY__API_CHOICE_BITS);
    uint32_t i = (uint32_t)(ev->id & ((1u << TY__API_CHOICE_BITS) - 1));
    if (!g || i >= g->n_choices || g->ch[i].done)
        return; /* the client left, or a late event */
    g->prompts[g->ch[i].prompt].n_cached = ev->n_cached;
    if (ev->kind == TY_SERVE_EV_ERROR) {
        g->ch[i].done = true;
        on_error(g, ev);
        return;
    }
    if (ev->kind == TY_SERVE_EV_TOKEN) {
        on_token(g, i, ev);
        return;
    }
    struct ty__api_choice *ch = &g->ch[i];
    ch->done = true;
    ch->finish = ev->finish;
    ch->n_out = ev->n_output;
    g->n_done++;
    if (ch->out)
        out_feed(g, ch, ev);
    if (g->req.stream && ch->out)
        out_stream(g, i, true, ev->finish);
    else if (g->req.stream)
        ty__api_sse_chunk(g, i, ev->text, ev->text_len, NULL, NULL, ev->finish);
    else
        push_bytes(g, &ch->text, &ch->n_text, &ch->cap_text, ev->text, ev->text_len, 1);
    if (g->n_done < g->n_choices)
        return;
    record_done(g);
    if (g->http)
        ty_http_req_set_abort(g->http, NULL, NULL);
    if (g->req.stream)
        stream_finish(g);
    else
        respond_whole(g);
    gen_free(g);
}

/* ---- a new request ------------------------------------------------------------------------------ */

static bool model_ok(ty_api_t *a, const char *m)
{
    return !m || !strcmp(m, a->model_name) || (a->model_path && !strcmp(m, a->model_path));
}

/* What limits the context besides the model, for a context_length_exceeded message: the KV
 * cache where it holds fewer tokens than the model's context ("" otherwise). */
static void kv_limit_note(const ty_api_t *a, const struct ty_serve_stats *st, char *out,
                          size_t cap)
{
    uint32_t model_ctx = ty_model_config(a->o.model)->ctx_len;
    char pages[64] = "";
    out[0] = 0;
    if (!st->kv_seq_tokens || st->kv_seq_tokens > st->max_ctx || st->kv_seq_tokens >= model_ctx)
        return;
    if (st->kv_pages_total && st->kv_block_tokens)
        snprintf(pages, sizeof(pages), ": %u pages of %u tokens", st->kv_pages_total,
                 st->kv_block_tokens);
    snprintf(out, cap, " (the KV cache holds %u tokens per sequence%s; the model's own context "
             "is %u)", st->kv_seq_tokens, pages, model_ctx);
}

/* max_tokens: given, or (completions) 16 as in OpenAI's reference, or (chat) the rest of the
 * context; every prompt + max_tokens must fit the context, which the backend says anew for
 * every request (a Conductor's shrinks or grows as nodes come and go). */
static int resolve_max_tokens(ty_api_t *a, struct ty__api_gen *g, struct ty_api_error *e)
{
    const char *param = g->req.kind == TY_API_CHAT ? "messages" : "prompt";
    struct ty_serve_stats st;
    ty__api_max_ctx(a, &st);
    size_t longest = 0;
    uint32_t lp = 0;
    for (uint32_t p = 0; p < g->n_prompts; p++)
        if (g->prompts[p].n > longest) {
            longest = g->prompts[p].n;
            lp = p;
        }
    char where[32] = "", kv[160];
    if (g->n_prompts > 1)
        snprintf(where, sizeof(where), " (prompt[%u])", lp);
    kv_limit_note(a, &st, kv, sizeof(kv));
    size_t room = a->max_ctx > longest ? a->max_ctx - longest : 0;
    if (room < 1)
        return ty_api_error_set(e, 400, "invalid_request_error", param,
                                "context_length_exceeded",
                                "this model's maximum context length is %u tokens%s; the "
                                "prompt%s has %zu tokens, which leaves no room for a completion",
                                a->max_ctx, kv, where, longest);
    if (g->req.max_tokens < 0)
        g->req.max_tokens = g->req.kind == TY_API_CHAT ? (int64_t)room
                                                       : (int64_t)(room < 16 ? room : 16);
    if ((uint64_t)g->req.max_tokens > room)
        return ty_api_error_set(e, 400, "invalid_request_error", "max_tokens",
                                "context_length_exceeded",
                                "this model's maximum context length is %u tokens%s; the "
                                "prompt%s has %zu tokens and max_tokens is %lld (%zu tokens in "
                                "all)", a->max_ctx, kv, where, longest,
                                (long long)g->req.max_tokens,
                                longest + (size_t)g->req.max_tokens);
    return 0;
}

static void fill_params(const struct ty__api_gen *g, uint32_t i, struct ty_serve_request *sr)
{
    const struct ty_api_request *q = &g->req;
    struct ty_sampling_params *sp = &sr->gen.sampling;
    const struct ty__api_prompt *p = &g->prompts[g->ch[i].prompt];
    uint32_t j = i % q->n; /* the choice's place among its prompt's */
    sr->id = (g->seq << TY__API_CHOICE_BITS) | i;
    sr->prompt = p->ids;
    sr->n_prompt = p->n;
    sr->gen.max_tokens = (uint32_t)q->max_tokens;
    sr->gen.ignore_eos = q->ignore_eos;
    sr->gen.stop = (const char *const *)q->stop;
    sr->gen.n_stop = q->n_stop;
    sr->gen.n_stop_ids = q->n_stop_ids;
    memcpy(sr->gen.stop_ids, q->stop_ids, q->n_stop_ids * sizeof(q->stop_ids[0]));
    sr->gen.min_tokens = q->min_tokens;
    if (q->grammar) { /* the request's arena holds both, as long as the request lives */
        struct ty_gen_grammar *gr = ty_arena_calloc(g->arena, 1, sizeof(*gr));
        gr->kind = (enum ty_grammar_kind)q->grammar;
        gr->schema = q->grammar_schema;
        gr->schema_len = q->grammar_schema ? strlen(q->grammar_schema) : 0;
        sr->gen.grammar = gr;
    }
    /* the key's class, else the one the request names, else OpenAI's tier (a hint) */
    if (g->key_class[0] || q->slo_class[0]) {
        sr->slo_class = g->key_class[0] ? g->key_class : q->slo_class;
        sr->slo_class_strict = true;
    } else {
        sr->slo_class = q->service_tier[0] ? q->service_tier : NULL;
    }
    sp->temperature = q->temperature;
    sp->top_k = q->top_k > 0 ? (uint32_t)q->top_k : 0;
    sp->top_p = q->top_p;
    sp->min_p = q->min_p;
    /* seed + j: with a seed, a prompt's choices sample as in a request of their own */
    uint64_t base = q->has_seed ? q->seed : ty_clock_ns() ^ g->seq * 0x9e3779b97f4a7c15ull;
    sp->seed = base + (q->has_seed ? j : i);
    sp->repetition_penalty = q->repetition_penalty;
    sp->presence_penalty = q->presence_penalty;
    sp->frequency_penalty = q->frequency_penalty;
    sp->n_logprobs = q->logprobs ? q->top_logprobs : 0;
    sp->logprobs = q->logprobs;
    sp->n_logit_bias = q->n_logit_bias;
    memcpy(sp->logit_bias, q->logit_bias, q->n_logit_bias * sizeof(q->logit_bias[0]));
}

/* Hand every choice to the backend; on failure cancel those already queued. */
static int submit_all(ty_api_t *a, struct ty__api_gen *g, struct ty_serve_reject *rej,
                      const char *client_id)
{
    const struct ty_serve_backend *b = &a->o.backend;
    for (uint32_t i = 0; i < g->n_choices; i++) {
        struct ty_serve_request sr = {0};
        fill_params(g, i, &sr);
        sr.reject = rej;
        sr.client_id = client_id; /* the HTTP request's x-request-id */
        g->ch[i].id = sr.id;
        int rc = b->iface->submit(b->context, &sr);
        if (rc) {
            for (uint32_t k = 0; k < i; k++)
                b->iface->cancel(b->context, g->ch[k].id);
            return rc;
        }
    }
    return 0;
}

/* echo: a text prompt as it was sent; a token-id prompt detokenized (special tokens left out,
 * as /detokenize does). */
static void echo_text(ty_api_t *a, ty_arena_t *arena, const struct ty_api_prompt *q,
                      struct ty__api_prompt *p)
{
    if (q->text) {
        p->n_echo = strlen(q->text);
        p->echo = q->text; /* the parsed request's, in the same arena */
        return;
    }
    int k = a->tok ? ty_tokenizer_decode(a->tok, q->ids, q->n_ids, true, NULL, 0) : 0;
    p->n_echo = k > 0 ? (size_t)k : 0;
    p->echo = ty_arena_alloc(arena, p->n_echo + 1);
    if (k > 0)
        ty_tokenizer_decode(a->tok, q->ids, q->n_ids, true, p->echo, p->n_echo + 1);
    p->echo[p->n_echo] = 0;
}

static int prepare(ty_api_t *a, ty_http_req_t *r, struct ty__api_gen *g, enum ty_api_kind kind,
                   struct ty_api_error *e)
{
    size_t len;
    const char *body = ty_http_req_body(r, &len);
    int rc = ty_api_parse_request_in(g->arena, body, len, kind, &g->req, e);
    if (rc)
        return rc;
    if (!model_ok(a, g->req.model))
        return ty_api_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                                "the model '%s' does not exist", g->req.model);
    if (a->draining)
        return ty_api_error_set(e, 503, "service_unavailable", NULL, "service_unavailable",
                                "the server is shutting down");
    g->n_prompts = kind == TY_API_CHAT ? 1 : (uint32_t)g->req.n_prompts;
    g->n_choices = g->n_prompts * g->req.n;
    bool think_open = false;
    for (uint32_t p = 0; p < g->n_prompts; p++) {
        if ((rc = ty__api_tokenize(a, g->arena, &g->req, p, &g->prompts[p].ids,
                                   &g->prompts[p].n, &think_open, e)))
            return rc;
        if (g->req.echo)
            echo_text(a, g->arena, &g->req.prompts[p], &g->prompts[p]);
    }
    for (uint32_t i = 0; i < g->n_choices; i++)
        g->ch[i].prompt = i / g->req.n;
    if (out_wanted(a, &g->req))
        out_setup(g, think_open);
    uint32_t V = ty_model_config(a->o.model)->n_vocab;
    for (uint32_t i = 0; i < g->req.n_stop_ids; i++)
        if (g->req.stop_ids[i] >= V)
            return ty_api_error_set(e, 400, "invalid_request_error", "stop_token_ids", NULL,
                                    "'stop_token_ids' token %u is not in the vocabulary (%u "
                                    "tokens)", g->req.stop_ids[i], V);
    for (uint32_t i = 0; i < g->req.n_logit_bias; i++)
        if (g->req.logit_bias[i].id >= V)
            return ty_api_error_set(e, 400, "invalid_request_error", "logit_bias", NULL,
                                    "'logit_bias' token %u is not in the vocabulary (%u tokens)",
                                    g->req.logit_bias[i].id, V);
    return resolve_max_tokens(a, g, e);
}

void ty__api_handle_generate(ty_api_t *a, ty_http_req_t *r, enum ty_api_kind kind,
                             const char *key_class)
{
    ty_arena_t *arena = ty_arena_new(0);
    struct ty__api_gen *g = ty_arena_calloc(arena, 1, sizeof(*g));
    struct ty_api_error e;
    g->arena = arena;
    g->a = a;
    snprintf(g->key_class, sizeof(g->key_class), "%s", key_class ? key_class : "");
    g->t0_ns = ty_clock_ns();
    g->created = (int64_t)time(NULL);
    g->seq = a->next_seq++;
    struct ty_serve_reject rej = {.code = ""};
    int rc = prepare(a, r, g, kind, &e);
    if (!rc && (rc = submit_all(a, g, &rej, ty_http_req_id(r))))
        backend_error(&e, rc, &rej, NULL);
    if (rc) {
        ty__api_send_error(r, &e);
        gen_release(g);
        return;
    }
    ty_metrics_histogram_observe(a->m.own_admit, (double)(ty_clock_ns() - g->t0_ns) / 1e9);
    snprintf(g->rid, sizeof(g->rid), "%s-%016llx%08llx", kind == TY_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)g->t0_ns, (unsigned long long)g->seq);
    g->http = r;
    g->hnext = *bucket(a, g->seq);
    *bucket(a, g->seq) = g;
    a->n_inflight++;
    ty_http_req_set_abort(r, on_abort, g);
    if (!g->req.stream)
        return;
    if (ty__api_sse_head(g))
        abort(); /* small metadata allocation (STYLE.md) */
    ty_http_stream_begin(r, 200, "text/event-stream", NULL);
    if (kind == TY_API_CHAT)
        for (uint32_t i = 0; i < g->n_choices; i++)
            ty__api_sse_chunk(g, i, "", 0, NULL, "assistant", TY_FINISH_NONE);
}
