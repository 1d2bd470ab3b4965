/* /v1/models, /tokenize, /detokenize (vLLM's shapes), /metrics (vLLM's metric names), and the
 * prompt tokenization shared with the generation endpoints. */
#include "api-impl.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A token's text for logprobs: {"token": text, "bytes": [...]}; bytes that are not valid
 * UTF-8 on their own (a byte-fallback piece) show as U+FFFD in "token". */
json_t *ty__api_piece_json(ty_api_t *a, uint32_t id)
{
    size_t len = 0;
    const char *p = a->tok ? ty_tokenizer_piece(a->tok, id, &len) : "";
    json_t *bytes = json_array();
    for (size_t i = 0; i < len; i++)
        json_array_append_new(bytes, json_integer((unsigned char)p[i]));
    json_t *t = ty_api_utf8_valid(p, len) ? json_stringn(p, len) : json_string("\xef\xbf\xbd");
    return json_pack("{s:o,s:o}", "token", t, "bytes", bytes);
}

static int encode(ty_api_t *a, ty_arena_t *arena, const char *text, bool special,
                  bool parse_special, uint32_t **ids, size_t *n)
{
    int k = ty_tokenizer_encode(a->tok, text, strlen(text), special, parse_special, NULL, 0);
    if (k < 0)
        return k;
    if (!(*ids = ty_arena_try_alloc(arena, ((size_t)k + 1) * sizeof(uint32_t))))
        return TY_ENOMEM;
    k = ty_tokenizer_encode(a->tok, text, strlen(text), special, parse_special, *ids,
                            (size_t)k + 1);
    if (k < 0)
        return k;
    *n = (size_t)k;
    return 0;
}

int ty__api_tpl_load(ty_api_t *a, const char *override_path)
{
    char err[256] = "";
    if (!a->tok)
        return 0;
    int rc = ty_chat_tpl_new(&a->tpl, a->tok, override_path, err, sizeof(err));
    if (rc == TY_ENOENT && !override_path) {
        a->tpl = NULL;
        TY_LOG_WARN("api", "model has no chat template; chat messages are joined as plain "
                           "text; give one with --chat-template");
        return 0;
    }
    if (rc) {
        a->tpl = NULL;
        TY_LOG_ERROR("api", "chat template%s%s: %s", override_path ? " " : "",
                     override_path ? override_path : "", err[0] ? err : ty_strerror(rc));
        return rc;
    }
    const char *src = ty_chat_tpl_source(a->tpl);
    a->fam = ty__api_fam_detect(src);
    a->think = src && (strstr(src, "<think>") || strstr(src, "</think>"));
    TY_LOG_INFO("api", "chat template%s%s: tool calls parsed as %s%s",
                override_path ? " " : "", override_path ? override_path : "",
                ty__api_fam_name(a->fam), a->think ? ", <think> as reasoning" : "");
    return 0;
}

int ty__api_render(ty_api_t *a, const struct ty_api_request *q, char **text,
                   struct ty_api_error *err)
{
    json_error_t je;
    json_t *req = json_loads(q->tpl_json, 0, &je);
    if (!req)
        return ty_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    char msg[256] = "";
    size_t len;
    int rc = ty_chat_tpl_render(a->tpl, req, text, &len, msg, sizeof(msg));
    json_decref(req);
    if (rc == TY_ENOMEM)
        return ty_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    if (rc)
        return ty_api_error_set(err, 400, "invalid_request_error", "messages", NULL,
                                "the chat template failed: %s", msg[0] ? msg : ty_strerror(rc));
    return 0;
}

/* A model without a chat template: the message contents joined by newlines. */
static char *join_messages(const struct ty_api_request *q)
{
    size_t len = 1;
    for (size_t i = 0; i < q->n_msgs; i++)
        len += strlen(q->msgs[i].content) + 1;
    char *s = malloc(len), *p = s;
    if (!s)
        return NULL;
    for (size_t i = 0; i < q->n_msgs; i++) {
        size_t l = strlen(q->msgs[i].content);
        memcpy(p, q->msgs[i].content, l);
        p += l;
        if (i + 1 < q->n_msgs)
            *p++ = '\n';
    }
    *p = 0;
    return s;
}

/* A rendered chat prompt to ids in `arena`, as the template's tokenizer does it. */
static int tpl_encode(ty_api_t *a, ty_arena_t *arena, const char *text, uint32_t **ids,
                      size_t *n)
{
    size_t len = strlen(text);
    int k = ty_chat_tpl_encode(a->tpl, text, len, NULL, 0);
    if (k < 0)
        return k;
    if (!(*ids = ty_arena_try_alloc(arena, ((size_t)k + 1) * sizeof(uint32_t))))
        return TY_ENOMEM;
    k = ty_chat_tpl_encode(a->tpl, text, len, *ids, (size_t)k + 1);
    if (k < 0)
        return k;
    *n = (size_t)k;
    return 0;
}

/* Where the last `needle` in s starts, plus one (0: none). */
static size_t last_of(const char *s, const char *needle)
{
    size_t at = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        at = (size_t)(p - s) + 1;
    return at;
}

/* A chat conversation to ids: rendered by the template, or (no template) joined. */
static int chat_ids(ty_api_t *a, ty_arena_t *arena, const struct ty_api_request *q,
                    uint32_t **ids, size_t *n, bool *think_open, struct ty_api_error *err)
{
    char *text = NULL;
    int rc;
    if (a->tpl) {
        if ((rc = ty__api_render(a, q, &text, err)))
            return rc;
        if (think_open && a->think) /* the prompt ends inside <think> (the model's output
                                     * opens as reasoning) */
            *think_open = last_of(text, "<think>") > last_of(text, "</think>");
        rc = tpl_encode(a, arena, text, ids, n);
    } else {
        if (!(text = join_messages(q)))
            return ty_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        rc = encode(a, arena, text, true, false, ids, n);
    }
    free(text);
    if (rc || !*n)
        return ty_api_error_set(err, 400, "invalid_request_error", "messages", NULL,
                                "cannot tokenize the conversation (%s)", ty_strerror(rc));
    return 0;
}

int ty__api_tokenize(ty_api_t *a, ty_arena_t *arena, const struct ty_api_request *q, size_t k,
                     uint32_t **ids, size_t *n, bool *think_open, struct ty_api_error *err)
{
    uint32_t V = ty_model_config(a->o.model)->n_vocab;
    const char *param = q->kind == TY_API_CHAT ? "messages" : "prompt";
    const struct ty_api_prompt *p = q->kind == TY_API_CHAT ? NULL : &q->prompts[k];
    char where[32] = "";
    if (q->n_prompts > 1)
        snprintf(where, sizeof(where), " of prompt[%zu]", k);
    if (p && p->ids) {
        for (size_t i = 0; i < p->n_ids; i++)
            if (p->ids[i] >= V)
                return ty_api_error_set(err, 400, "invalid_request_error", "prompt", NULL,
                                        "token id %u at %zu%s is outside the vocabulary (%u)",
                                        p->ids[i], i, where, V);
        if (!(*ids = ty_arena_try_alloc(arena, p->n_ids * sizeof(uint32_t))))
            return ty_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(*ids, p->ids, p->n_ids * sizeof(uint32_t));
        *n = p->n_ids;
        return 0;
    }
    if (!a->tok)
        return ty_api_error_set(err, 400, "invalid_request_error", param, NULL,
                                "the model has no tokenizer; send token ids as 'prompt'");
    if (!p)
        return chat_ids(a, arena, q, ids, n, think_open, err);
    int rc = encode(a, arena, p->text, true, false, ids, n);
    if (rc || !*n)
        return ty_api_error_set(err, 400, "invalid_request_error", param, NULL,
                                "cannot tokenize the prompt%s (%s)", where, ty_strerror(rc));
    return 0;
}

void ty__api_handle_models(ty_api_t *a, ty_http_req_t *r)
{
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:s,s:i}", "id", a->model_name, "object", "model",
                          "created", (json_int_t)time(NULL), "owned_by", "tycho", "root",
                          a->model_path ? a->model_path : a->model_name, "max_model_len",
                          (json_int_t)ty__api_max_ctx(a, NULL));
    ty__api_send_json(r, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

static int parse_body(ty_http_req_t *r, json_t **o, struct ty_api_error *e)
{
    size_t len;
    const char *body = ty_http_req_body(r, &len);
    json_error_t je;
    if (!ty_api_utf8_valid(body, len))
        return ty_api_error_set(e, 400, "invalid_request_error", NULL, NULL,
                                "the request body is not valid UTF-8");
    *o = json_loadb(body, len, 0, &je);
    if (!*o || !json_is_object(*o)) {
        json_decref(*o);
        return ty_api_error_set(e, 400, "invalid_request_error", NULL, NULL,
                                "the body must be a JSON object (%s)", je.text);
    }
    return 0;
}

/* POST /tokenize {"prompt": text | "messages": [...], "add_special_tokens": bool}
 * -> {"count", "max_model_len", "tokens"} */
void ty__api_handle_tokenize(ty_api_t *a, ty_http_req_t *r)
{
    struct ty_api_error e;
    json_t *o = NULL;
    uint32_t *ids = NULL;
    size_t n = 0;
    ty_arena_t *arena = ty_arena_new(0);
    if (parse_body(r, &o, &e))
        goto fail;
    bool chat = json_object_get(o, "messages") != NULL;
    size_t len;
    const char *body = ty_http_req_body(r, &len);
    struct ty_api_request q;
    if (ty_api_parse_request_in(arena, body, len, chat ? TY_API_CHAT : TY_API_COMPLETION, &q,
                                &e))
        goto fail;
    json_t *add = json_object_get(o, "add_special_tokens");
    if (!chat && q.n_prompts > 1) {
        ty_api_error_set(&e, 400, "invalid_request_error", "prompt", NULL,
                         "/tokenize takes one prompt; got %zu", q.n_prompts);
    } else if (!chat && q.prompts[0].text && json_is_false(add) && a->tok) {
        if (encode(a, arena, q.prompts[0].text, false, false, &ids, &n))
            ty_api_error_set(&e, 400, "invalid_request_error", "prompt", NULL, "cannot tokenize");
    } else if (ty__api_tokenize(a, arena, &q, 0, &ids, &n, NULL, &e)) {
        ids = NULL;
    }
    if (!ids)
        goto fail;
    json_t *t = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(t, json_integer(ids[i]));
    json_decref(o);
    ty_arena_free(arena);
    ty__api_send_json(r, 200, json_pack("{s:i,s:i,s:o}", "count", (json_int_t)n,
                                        "max_model_len", (json_int_t)ty__api_max_ctx(a, NULL),
                                        "tokens", t));
    return;
fail:
    json_decref(o);
    ty_arena_free(arena);
    ty__api_send_error(r, &e);
}

/* POST /detokenize {"tokens": [ids]} -> {"prompt": text} */
void ty__api_handle_detokenize(ty_api_t *a, ty_http_req_t *r)
{
    struct ty_api_error e;
    json_t *o = NULL;
    if (parse_body(r, &o, &e))
        goto fail;
    json_t *t = json_object_get(o, "tokens");
    uint32_t V = ty_model_config(a->o.model)->n_vocab;
    if (!json_is_array(t)) {
        ty_api_error_set(&e, 400, "invalid_request_error", "tokens",
                         NULL, "'tokens' must be an array of token ids");
        goto fail;
    }
    size_t n = json_array_size(t), i;
    uint32_t *ids = malloc((n + 1) * sizeof(uint32_t));
    json_t *v;
    json_array_foreach(t, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= V) {
            free(ids);
            ty_api_error_set(&e, 400, "invalid_request_error", "tokens", NULL,
                             "'tokens[%zu]' is not a token id of this model", i);
            goto fail;
        }
        ids[i] = (uint32_t)json_integer_value(v);
    }
    int k = a->tok ? ty_tokenizer_decode(a->tok, ids, n, true, NULL, 0) : 0;
    char *text = k >= 0 ? malloc((size_t)k + 1) : NULL;
    if (text)
        ty_tokenizer_decode(a->tok, ids, n, true, text, (size_t)k + 1);
    free(ids);
    json_decref(o);
    json_t *pt = text ? json_string(text) : NULL;
    ty__api_send_json(r, 200, json_pack("{s:o}", "prompt", pt ? pt : json_string("")));
    free(text);
    return;
fail:
    json_decref(o);
    ty__api_send_error(r, &e);
}

/* ---- metrics ------------------------------------------------------------------------------ */

static const double lat_buckets[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                     0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};

static int family(ty_api_t *a, int type, const char *name, const char *help, const char *label2,
                  const char *value2, ty_metrics_child_t **out)
{
    ty_metrics_family_t *f;
    const char *names[] = {"model_name", label2};
    const char *values[] = {a->model_name, value2};
    size_t nl = label2 ? 2 : 1;
    ty_metrics_registry_t *reg = a->o.metrics;
    int rc = type == 0   ? ty_metrics_counter_new(reg, &f, name, help, names, nl)
             : type == 1 ? ty_metrics_gauge_new(reg, &f, name, help, names, nl)
                         : ty_metrics_histogram_new(reg, &f, name, help, names, nl, lat_buckets,
                                                    sizeof(lat_buckets) / sizeof(lat_buckets[0]));
    return rc ? rc : ty_metrics_child_get(f, values, out);
}

int ty__api_metrics_init(ty_api_t *a)
{
    int rc = 0;
    rc = rc ? rc : family(a, 1, "vllm:num_requests_running", "Sequences in the running batch.",
                          NULL, NULL, &a->m.running);
    rc = rc ? rc : family(a, 1, "vllm:num_requests_waiting", "Sequences waiting for admission.",
                          NULL, NULL, &a->m.waiting);
    rc = rc ? rc : family(a, 1, "vllm:kv_cache_usage_perc", "Fraction of KV pages in use (0-1).",
                          NULL, NULL, &a->m.kv_usage);
    rc = rc ? rc : family(a, 0, "vllm:num_preemptions_total",
                          "Sequences preempted (KV pages taken back, recomputed later).", NULL,
                          NULL, &a->m.preempt);
    rc = rc ? rc : family(a, 2, "vllm:time_to_first_token_seconds", "Time to first token.",
                          NULL, NULL, &a->m.ttft);
    rc = rc ? rc : family(a, 2, "vllm:time_per_output_token_seconds",
                          "Mean time per output token after the first, per request.", NULL,
                          NULL, &a->m.tpot);
    rc = rc ? rc : family(a, 2, "vllm:inter_token_latency_seconds", "Time between tokens.",
                          NULL, NULL, &a->m.itl);
    rc = rc ? rc : family(a, 2, "vllm:e2e_request_latency_seconds", "End-to-end latency.",
                          NULL, NULL, &a->m.e2e);
    rc = rc ? rc : family(a, 0, "vllm:prompt_tokens_total", "Prompt tokens processed.", NULL,
                          NULL, &a->m.prompt);
    rc = rc ? rc : family(a, 0, "vllm:generation_tokens_total", "Tokens generated.", NULL, NULL,
                          &a->m.gen);
    rc = rc ? rc : family(a, 0, "vllm:prefix_cache_queries_total",
                          "Prompt tokens looked up in the prefix cache.", NULL, NULL,
                          &a->m.cache_q);
    rc = rc ? rc : family(a, 0, "vllm:prefix_cache_hits_total",
                          "Prompt tokens found in the prefix cache.", NULL, NULL,
                          &a->m.cache_hit);
    ty_metrics_family_t *f;
    const char *names[] = {"model_name", "finished_reason"};
    if (!rc)
        rc = ty_metrics_counter_new(a->o.metrics, &f, "vllm:request_success_total",
                                    "Requests finished, by reason.", names, 2);
    const char *v_stop[] = {a->model_name, "stop"}, *v_len[] = {a->model_name, "length"},
               *v_ab[] = {a->model_name, "abort"};
    rc = rc ? rc : ty_metrics_child_get(f, v_stop, &a->m.ok_stop);
    rc = rc ? rc : ty_metrics_child_get(f, v_len, &a->m.ok_length);
    rc = rc ? rc : ty_metrics_child_get(f, v_ab, &a->m.ok_abort);
    static const double own_buckets[] = {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
                                         2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0};
    const char *own_names[] = {"model_name", "stage"};
    if (!rc)
        rc = ty_metrics_histogram_new(a->o.metrics, &f, "tycho_conductor_own_seconds",
                                      "The front's own time per request before its first token "
                                      "reaches the client's socket, by stage (admit: arrival to "
                                      "submitted; relay: the backend's share between the "
                                      "nodes; first_token: the first token's event to its "
                                      "write), the nodes' compute left out.",
                                      own_names, 2, own_buckets,
                                      sizeof(own_buckets) / sizeof(own_buckets[0]));
    const char *v_adm[] = {a->model_name, "admit"}, *v_rel[] = {a->model_name, "relay"},
               *v_first[] = {a->model_name, "first_token"};
    rc = rc ? rc : ty_metrics_child_get(f, v_adm, &a->m.own_admit);
    rc = rc ? rc : ty_metrics_child_get(f, v_rel, &a->m.own_relay);
    rc = rc ? rc : ty_metrics_child_get(f, v_first, &a->m.own_first);
    return rc;
}

void ty__api_handle_metrics(ty_api_t *a, ty_http_req_t *r)
{
    struct ty_serve_stats st;
    a->o.backend.iface->stats(a->o.backend.context, &st);
    ty_metrics_gauge_set(a->m.running, st.running);
    ty_metrics_gauge_set(a->m.waiting, st.waiting);
    ty_metrics_gauge_set(a->m.kv_usage, st.kv_usage);
    /* the backend counts; a cluster's sum drops when a node restarts */
    ty_metrics_counter_follow(a->m.preempt, st.preemptions, &a->m.preempt_seen);
    char *text = NULL;
    size_t len = 0;
    if (ty_metrics_render(a->o.metrics, &text, &len)) {
        ty_http_respond(r, 500, "text/plain", NULL, "metrics unavailable\n", 20);
        return;
    }
    ty_http_respond(r, 200, TY_METRICS_CONTENT_TYPE, NULL, text, len);
    free(text);
}

/* GET /status -> {"model", "uptime_s", "draining", "in_flight", "running", "waiting",
 * "kv_usage", "max_model_len", "preemptions", + the backend's own members (status_json)}. */
void ty__api_handle_status(ty_api_t *a, ty_http_req_t *r)
{
    const struct ty_serve_backend *b = &a->o.backend;
    struct ty_serve_stats st;
    b->iface->stats(b->context, &st);
    json_t *o = json_pack("{s:s,s:f,s:b,s:I,s:I,s:I,s:f,s:I,s:I}", "model", a->model_name,
                          "uptime_s", (double)(ty_clock_ms() - a->started_ms) / 1e3, "draining",
                          a->draining, "in_flight", (json_int_t)a->n_inflight, "running",
                          (json_int_t)st.running, "waiting", (json_int_t)st.waiting, "kv_usage",
                          st.kv_usage, "max_model_len", (json_int_t)st.max_ctx, "preemptions",
                          (json_int_t)st.preemptions);
    if (!o) {
        ty_http_respond(r, 500, "text/plain", NULL, "status unavailable\n", 19);
        return;
    }
    char *more = b->iface->status_json ? b->iface->status_json(b->context) : NULL;
    json_t *m = more ? json_loads(more, 0, NULL) : NULL;
    free(more);
    if (json_is_object(m))
        json_object_update(o, m);
    json_decref(m);
    ty__api_send_json(r, 200, o);
}
