/* The API front door: routing, authentication, the backend's sink, drain and close
 * (tycho/api.h). */
#include "api-impl.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

void ty__api_send_json(ty_http_req_t *r, int status, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) {
        ty_http_respond(r, 500, "application/json", NULL, "{}", 2);
        return;
    }
    ty_http_respond(r, status, "application/json", NULL, s, strlen(s));
    free(s);
}

void ty__api_send_error(ty_http_req_t *r, const struct ty_api_error *e)
{
    char *s = ty_api_error_json(e);
    char retry[48];
    const char *extra = NULL;
    if (e->status == 429 && e->no_retry) {
        /* no retry can cure it (the request alone misses its SLO): the OpenAI SDKs retry a
         * 429 twice unless told not to, tripling the load of an overloaded server */
        extra = "x-should-retry: false\r\n";
    } else if (e->status == 429 || e->status == 503) {
        uint32_t s_after = e->retry_after_s ? e->retry_after_s : e->status == 429 ? 1 : 5;
        snprintf(retry, sizeof(retry), "Retry-After: %u\r\n", s_after);
        extra = retry;
    } else if (e->status == 401) {
        extra = "WWW-Authenticate: Bearer\r\n";
    }
    ty_http_respond(r, e->status, "application/json", extra, s ? s : "{}", s ? strlen(s) : 2);
    free(s);
}

/* *key_class: the SLO class bound to the key that matched (NULL: none). */
static bool authorized(ty_api_t *a, ty_http_req_t *r, const char **key_class)
{
    *key_class = NULL;
    if (!a->n_keys)
        return true;
    const char *h = ty_http_req_header(r, "authorization");
    if (!h || strncasecmp(h, "Bearer ", 7))
        return false;
    /* The token's digest against every key's (tycho/tls.h): constant time, and every key is
     * compared, whichever matches. */
    uint8_t d[32];
    ty_apikey_digest(h + 7, strlen(h + 7), d);
    bool ok = false;
    for (size_t i = 0; i < a->n_keys; i++) {
        bool eq = ty_apikey_match(&a->keys[i], d);
        ok |= eq;
        if (eq)
            *key_class = a->key_classes[i];
    }
    return ok;
}

enum route_id {
    R_CHAT, R_COMPL, R_MODELS, R_TOKENIZE, R_DETOKENIZE, R_HEALTH, R_READY, R_METRICS, R_STATUS
};

static const struct route {
    const char *path, *method;
    enum route_id id;
} routes[] = {
    {"/v1/chat/completions", "POST", R_CHAT}, {"/v1/completions", "POST", R_COMPL},
    {"/v1/models", "GET", R_MODELS},          {"/tokenize", "POST", R_TOKENIZE},
    {"/detokenize", "POST", R_DETOKENIZE},    {"/health", "GET", R_HEALTH},
    {"/metrics", "GET", R_METRICS},          {"/status", "GET", R_STATUS},
    {"/ready", "GET", R_READY},
};

static void dispatch(ty_api_t *a, ty_http_req_t *r, enum route_id id, const char *key_class)
{
    switch (id) {
    case R_CHAT: ty__api_handle_generate(a, r, TY_API_CHAT, key_class); break;
    case R_COMPL: ty__api_handle_generate(a, r, TY_API_COMPLETION, key_class); break;
    case R_MODELS: ty__api_handle_models(a, r); break;
    case R_TOKENIZE: ty__api_handle_tokenize(a, r); break;
    case R_DETOKENIZE: ty__api_handle_detokenize(a, r); break;
    case R_METRICS: ty__api_handle_metrics(a, r); break;
    case R_STATUS: ty__api_handle_status(a, r); break;
    case R_READY: { /* a load balancer's question: send requests here now? */
        struct ty_serve_stats st = {0};
        a->o.backend.iface->stats(a->o.backend.context, &st);
        if (a->draining)
            ty_http_respond(r, 503, "text/plain", NULL, "draining\n", 9);
        else if (!st.ready)
            ty_http_respond(r, 503, "text/plain", NULL, "no prefill or decode node up\n", 29);
        else
            ty_http_respond(r, 200, "text/plain", NULL, "ready\n", 6);
        break;
    }
    case R_HEALTH:
        if (a->draining)
            ty_http_respond(r, 503, "text/plain", NULL, "draining\n", 9);
        else
            ty_http_respond(r, 200, "text/plain", NULL, "", 0);
        break;
    }
}

static void on_request(void *arg, ty_http_req_t *r)
{
    ty_api_t *a = arg;
    const char *path = ty_http_req_path(r), *method = ty_http_req_method(r);
    struct ty_api_error e;
    bool path_known = false;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (strcmp(path, routes[i].path))
            continue;
        path_known = true;
        bool head = !strcmp(method, "HEAD") && !strcmp(routes[i].method, "GET");
        if (strcmp(method, routes[i].method) && !head)
            continue;
        const char *key_class = NULL;
        bool guarded = !strncmp(path, "/v1/", 4) || routes[i].id == R_STATUS;
        if (guarded && !authorized(a, r, &key_class)) {
            ty_api_error_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key",
                             "missing or invalid API key (send Authorization: Bearer KEY)");
            ty__api_send_error(r, &e);
            return;
        }
        dispatch(a, r, routes[i].id, key_class);
        return;
    }
    if (path_known)
        ty_api_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                         "method %s is not allowed on %s", method, path);
    else
        ty_api_error_set(&e, 404, "invalid_request_error", NULL, "not_found",
                         "no such endpoint: %s %s", method, path);
    ty__api_send_error(r, &e);
}

/* ---- lifecycle ---------------------------------------------------------------------------------- */

void ty_api_set_keys(ty_api_t *a, const char *const *keys, const char *const *classes,
                     size_t n)
{
    for (size_t i = 0; i < a->n_keys; i++)
        free(a->key_classes[i]);
    free(a->keys);
    free(a->key_classes);
    a->keys = NULL;
    a->key_classes = NULL;
    a->n_keys = n;
    if (!n)
        return;
    /* out of memory here must not leave the server open: no key list means no auth */
    if (!(a->keys = calloc(n, sizeof(*a->keys))) || !(a->key_classes = calloc(n, sizeof(char *))))
        abort();
    for (size_t i = 0; i < n; i++) {
        bool cls = classes && classes[i] && classes[i][0];
        char why[160];
        if (ty_apikey_parse(keys[i], &a->keys[i], why, sizeof(why))) /* matches nothing */
            TY_LOG_ERROR("api", "API key %zu of %zu is ignored: %s", i + 1, n, why);
        if (cls && !(a->key_classes[i] = strdup(classes[i])))
            abort();
    }
}

uint32_t ty__api_max_ctx(ty_api_t *a, struct ty_serve_stats *st)
{
    struct ty_serve_stats own;
    st = st ? st : &own;
    a->o.backend.iface->stats(a->o.backend.context, st);
    if (st->max_ctx)
        a->max_ctx = st->max_ctx;
    return a->max_ctx;
}

int ty_api_new(ty_api_t **out, uv_loop_t *loop, const struct ty_api_opts *o)
{
    if (!out || !loop || !o || !o->model || !o->backend.iface || !o->backend.iface->set_sink ||
        !o->metrics || !o->model_name)
        return TY_EINVAL;
    ty_api_t *a = calloc(1, sizeof(*a));
    if (!a)
        return TY_ENOMEM;
    a->loop = loop;
    a->o = *o;
    a->o.api_keys = a->o.api_key_classes = NULL; /* borrowed for the call only */
    a->o.n_api_keys = 0;
    a->o.tls_cert = a->o.tls_key = NULL;
    a->model_name = strdup(o->model_name);
    a->model_path = o->model_path ? strdup(o->model_path) : NULL;
    a->tok = ty_model_tokenizer(o->model);
    a->next_seq = 1;
    a->started_ms = ty_clock_ms();
    ty__api_max_ctx(a, NULL);
    ty_api_set_keys(a, o->api_keys, o->api_key_classes, o->n_api_keys);
    a->o.chat_template = NULL;
    int rc = ty__api_tpl_load(a, o->chat_template);
    if (!rc)
        rc = ty__api_metrics_init(a);
    struct ty_http_server_opts ho = {
        .host = o->host ? o->host : "127.0.0.1", .port = o->port,
        .max_body_bytes = o->max_body_bytes, .header_timeout_ms = o->header_timeout_ms,
        .body_timeout_ms = o->body_timeout_ms, .max_connections = o->max_connections,
        .max_output_bytes = o->max_output_bytes, .tls_cert = o->tls_cert, .tls_key = o->tls_key,
        .handler = on_request, .arg = a};
    if (!rc)
        rc = ty_http_server_new(&a->http, loop, &ho);
    if (rc) {
        ty_api_set_keys(a, NULL, NULL, 0);
        ty_chat_tpl_free(a->tpl);
        free(a->model_name);
        free(a->model_path);
        free(a);
        return rc;
    }
    o->backend.iface->set_sink(o->backend.context, ty__api_on_event, a);
    *out = a;
    return 0;
}

uint16_t ty_api_port(const ty_api_t *a)
{
    return ty_http_server_port(a->http);
}

bool ty_api_tls(const ty_api_t *a)
{
    return ty_http_server_tls(a->http);
}

int ty_api_reload_tls(ty_api_t *a, const char *cert, const char *key)
{
    bool was = ty_http_server_tls(a->http), now = cert && key;
    if (was != now) {
        TY_LOG_ERROR("api", "reload: switching the front door between %s and %s needs a "
                            "restart; it stays %s", was ? "https" : "http",
                     now ? "https" : "http", was ? "https" : "http");
        return TY_EINVAL;
    }
    if (!now)
        return 0;
    int rc = ty_http_server_set_tls(a->http, cert, key);
    if (rc)
        TY_LOG_ERROR("api", "reload: the new certificate and key did not load (%s); the "
                            "running ones stay", ty_err_name(rc));
    else
        TY_LOG_INFO("api", "reload: new connections use the certificate in %s", cert);
    return rc;
}

uint32_t ty_api_n_inflight(const ty_api_t *a)
{
    return a->n_inflight;
}

void ty_api_drain(ty_api_t *a, void (*done)(void *arg), void *arg)
{
    a->draining = true;
    a->drain_done = done;
    a->drain_arg = arg;
    if (!a->n_inflight && done) {
        a->drain_done = NULL;
        done(arg);
    }
}

static void on_http_closed(void *arg)
{
    ty_api_t *a = arg;
    void (*cb)(void *) = a->close_cb;
    void *cb_arg = a->close_arg;
    ty_api_set_keys(a, NULL, NULL, 0);
    ty_chat_tpl_free(a->tpl);
    free(a->model_name);
    free(a->model_path);
    free(a);
    if (cb)
        cb(cb_arg);
}

void ty_api_close(ty_api_t *a, void (*cb)(void *arg), void *arg)
{
    a->close_cb = cb;
    a->close_arg = arg;
    ty__api_gen_abort_all(a);
    a->o.backend.iface->set_sink(a->o.backend.context, NULL, NULL);
    ty_http_server_close(a->http, on_http_closed, a);
}
