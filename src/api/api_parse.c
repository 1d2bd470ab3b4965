/* OpenAI request validation: JSON body -> struct ty_api_request, with a 400 naming `param`
 * for the first field that is wrong. Ranges follow the OpenAI API reference (temperature
 * 0..2, top_p 0..1, penalties -2..2, top_logprobs 0..20, n >= 1, max_tokens >= 1) and vLLM's
 * extensions (top_k, min_p, repetition_penalty, ignore_eos). Unknown fields are ignored.
 * Everything the request holds (strings, prompts, messages) is allocated from one arena: the
 * caller's (ty_api_parse_request_in) or its own (ty_api_parse_request, freed by
 * ty_api_request_clear). */
#include "tycho/api.h"

#include "tycho/arena.h"
#include "tycho/errors.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD(param, ...)                                                                           \
    ty_api_error_set(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

int ty_api_error_set(struct ty_api_error *e, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...)
{
    va_list ap;
    e->status = status;
    e->retry_after_s = 0;
    snprintf(e->type, sizeof(e->type), "%s", type ? type : "invalid_request_error");
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    snprintf(e->code, sizeof(e->code), "%s", code ? code : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return TY_EINVAL;
}

char *ty_api_error_json(const struct ty_api_error *e)
{
    json_t *err = json_object();
    json_object_set_new(err, "message", json_string(e->message));
    json_object_set_new(err, "type", json_string(e->type));
    json_object_set_new(err, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(err, "code", e->code[0] ? json_string(e->code) : json_null());
    json_t *o = json_pack("{s:o}", "error", err);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

bool ty_api_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i], len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3
                                              : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n || (len == 2 && c < 0xc2) || (c == 0xf4 && len == 4 && p[i + 1] > 0x8f) || c > 0xf4)
            return false;
        for (unsigned k = 1; k < len; k++)
            if ((p[i + k] & 0xc0) != 0x80)
                return false;
        if (len == 3 && ((c == 0xe0 && p[i + 1] < 0xa0) || (c == 0xed && p[i + 1] > 0x9f)))
            return false;
        if (len == 4 && c == 0xf0 && p[i + 1] < 0x90)
            return false;
        i += len;
    }
    return true;
}

/* ---- typed field readers: 1 = absent, 0 = read, TY_EINVAL = wrong (err set) -------------- */

static int get_number(json_t *o, const char *key, double lo, double hi, double *out,
                      struct ty_api_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 1;
    if (!json_is_number(v))
        return BAD(key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi)
        return BAD(key, "'%s' must be between %g and %g, got %g", key, lo, hi, d);
    *out = d;
    return 0;
}

static int get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   struct ty_api_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 1;
    if (!json_is_integer(v))
        return BAD(key, "'%s' must be an integer", key);
    json_int_t i = json_integer_value(v);
    if (i < lo || i > hi)
        return BAD(key, "'%s' must be between %lld and %lld, got %lld", key, (long long)lo,
                   (long long)hi, (long long)i);
    *out = i;
    return 0;
}

static int get_bool(json_t *o, const char *key, bool *out, struct ty_api_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 1;
    if (!json_is_boolean(v))
        return BAD(key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

static int set_float(json_t *o, const char *key, double lo, double hi, float *out,
                     struct ty_api_error *err)
{
    double d = 0;
    int rc = get_number(o, key, lo, hi, &d, err);
    if (rc == 0)
        *out = (float)d;
    return rc < 0 ? rc : 0;
}

/* ---- composite fields ----------------------------------------------------------------------- */

/* A copy of a JSON string's text (up to its first NUL, as strdup made it) in the request's
 * arena; NULL when out of memory (request bodies are attacker-sized: try_ allocations). */
static char *adup(struct ty_api_request *r, json_t *v)
{
    const char *s = json_string_value(v);
    size_t n = strlen(s);
    char *d = ty_arena_try_alloc(r->arena, n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}

static int parse_stop(json_t *o, struct ty_api_request *r, struct ty_api_error *err)
{
    json_t *v = json_object_get(o, "stop");
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) && !(r->stop[r->n_stop++] = adup(r, v)))
            return TY_ENOMEM;
        return 0;
    }
    if (!json_is_array(v))
        return BAD("stop", "'stop' must be a string or an array of strings");
    if (json_array_size(v) > TY_SERVE_MAX_STOP)
        return BAD("stop", "'stop' may hold at most %d strings", TY_SERVE_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s))
            return BAD("stop", "'stop[%zu]' must be a string", i);
        if (json_string_length(s) && !(r->stop[r->n_stop++] = adup(r, s)))
            return TY_ENOMEM;
    }
    return 0;
}

/* Message content: a string, or an array of {"type":"text","text":...} parts (joined; each
 * part up to its first NUL, as C strings). */
static int content_text(struct ty_api_request *r, json_t *c, size_t i, char **out,
                        struct ty_api_error *err)
{
    if (json_is_string(c))
        return (*out = adup(r, c)) ? 0 : TY_ENOMEM;
    if (json_is_null(c))
        return (*out = ty_arena_strdup(r->arena, "")) ? 0 : TY_ENOMEM;
    if (!json_is_array(c))
        return BAD("messages", "'messages[%zu].content' must be a string or an array", i);
    size_t k, len = 0;
    json_t *part;
    json_array_foreach(c, k, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") ||
            !json_is_string(text))
            return BAD("messages", "'messages[%zu].content[%zu]' must be a text part", i, k);
        len += strlen(json_string_value(text));
    }
    char *s = ty_arena_try_alloc(r->arena, len + 1);
    if (!s)
        return TY_ENOMEM;
    len = 0;
    json_array_foreach(c, k, part) {
        const char *t = json_string_value(json_object_get(part, "text"));
        size_t tl = strlen(t);
        memcpy(s + len, t, tl);
        len += tl;
    }
    s[len] = 0;
    *out = s;
    return 0;
}

static int parse_messages(json_t *o, struct ty_api_request *r, struct ty_api_error *err)
{
    json_t *v = json_object_get(o, "messages");
    if (!v)
        return BAD("messages", "'messages' is required");
    if (!json_is_array(v))
        return BAD("messages", "'messages' must be an array");
    size_t n = json_array_size(v);
    if (n == 0 || n > TY_API_MAX_MESSAGES)
        return BAD("messages", "'messages' must hold 1 to %d messages", TY_API_MAX_MESSAGES);
    r->msgs = ty_arena_calloc(r->arena, n, sizeof(*r->msgs));
    size_t i;
    json_t *m;
    json_array_foreach(v, i, m) {
        json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role))
            return BAD("messages", "'messages[%zu]' must be an object with a string 'role'", i);
        const char *rs = json_string_value(role);
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
            strcmp(rs, "tool") && strcmp(rs, "developer"))
            return BAD("messages", "'messages[%zu].role' must be system, user, assistant, "
                                   "tool or developer", i);
        json_t *c = json_object_get(m, "content");
        if (!c)
            return BAD("messages", "'messages[%zu].content' is required", i);
        int rc = content_text(r, c, i, &r->msgs[i].content, err);
        if (rc)
            return rc;
        r->msgs[i].role = ty_arena_strdup(r->arena, strcmp(rs, "developer") ? rs : "system");
        r->n_msgs++;
    }
    return 0;
}

/* One prompt: a non-empty string or a non-empty array of token ids; `where` names it. */
static int parse_one_prompt(struct ty_api_request *r, json_t *v, const char *where,
                            struct ty_api_prompt *p, struct ty_api_error *err)
{
    if (json_is_string(v)) {
        if (!json_string_length(v))
            return BAD("prompt", "'%s' must not be empty", where);
        p->text = adup(r, v);
        return p->text ? 0 : TY_ENOMEM;
    }
    size_t n = json_array_size(v), i;
    if (n == 0)
        return BAD("prompt", "'%s' must not be empty", where);
    if (!(p->ids = ty_arena_try_alloc(r->arena, n * sizeof(uint32_t))))
        return TY_ENOMEM;
    json_t *t;
    json_array_foreach(v, i, t) {
        if (!json_is_integer(t) || json_integer_value(t) < 0 ||
            json_integer_value(t) > UINT32_MAX)
            return BAD("prompt", "'%s[%zu]' must be a token id (an integer >= 0)", where, i);
        p->ids[i] = (uint32_t)json_integer_value(t);
    }
    p->n_ids = n;
    return 0;
}

/* prompt, as in the OpenAI reference: a string, an array of token ids (one prompt each), or
 * an array of strings or of token-id arrays (one prompt per element; the two forms are not
 * mixed). At most TY_API_MAX_CHOICES prompts; ty_api_parse_request checks prompts x n. */
static int parse_prompt(json_t *o, struct ty_api_request *r, struct ty_api_error *err)
{
    json_t *v = json_object_get(o, "prompt");
    if (!v)
        return BAD("prompt", "'prompt' is required");
    if (!json_is_string(v) && !json_is_array(v))
        return BAD("prompt", "'prompt' must be a string, an array of strings, an array of "
                             "token ids or an array of token-id arrays");
    bool list = json_is_array(v) && json_array_size(v) && !json_is_integer(json_array_get(v, 0));
    size_t n = list ? json_array_size(v) : 1, i;
    if (n > TY_API_MAX_CHOICES)
        return BAD("prompt", "'prompt' may hold at most %d prompts, got %zu",
                   TY_API_MAX_CHOICES, n);
    r->prompts = ty_arena_calloc(r->arena, n, sizeof(*r->prompts));
    r->n_prompts = n; /* every slot starts empty, so a failure part-way is cleared whole */
    if (!list)
        return parse_one_prompt(r, v, "prompt", &r->prompts[0], err);
    bool strings = json_is_string(json_array_get(v, 0));
    json_t *e;
    json_array_foreach(v, i, e) {
        char where[32];
        if (!json_is_string(e) && !json_is_array(e))
            return BAD("prompt", "'prompt[%zu]' must be a string or an array of token ids", i);
        if ((bool)json_is_string(e) != strings)
            return BAD("prompt", "'prompt' must not mix strings and token-id arrays "
                                 "(element %zu)", i);
        snprintf(where, sizeof(where), "prompt[%zu]", i);
        int rc = parse_one_prompt(r, e, where, &r->prompts[i], err);
        if (rc)
            return rc;
    }
    return 0;
}

static int parse_logprobs(json_t *o, struct ty_api_request *r, struct ty_api_error *err)
{
    int64_t k = 0;
    int rc;
    if (r->kind == TY_API_CHAT) {
        if ((rc = get_bool(o, "logprobs", &r->logprobs, err)) < 0)
            return rc;
        if ((rc = get_int(o, "top_logprobs", 0, TY_SAMPLE_MAX_LOGPROBS, &k, err)) < 0)
            return rc;
        if (rc == 0 && !r->logprobs)
            return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    } else {
        json_t *v = json_object_get(o, "logprobs");
        if (json_is_boolean(v))
            return BAD("logprobs", "'logprobs' must be an integer for completions");
        if ((rc = get_int(o, "logprobs", 0, TY_SAMPLE_MAX_LOGPROBS, &k, err)) < 0)
            return rc;
        r->logprobs = rc == 0;
    }
    r->top_logprobs = (uint32_t)k;
    return 0;
}

static int parse_stream(json_t *o, struct ty_api_request *r, struct ty_api_error *err)
{
    int rc = get_bool(o, "stream", &r->stream, err);
    if (rc < 0)
        return rc;
    json_t *so = json_object_get(o, "stream_options");
    if (!so || json_is_null(so))
        return 0;
    if (!json_is_object(so))
        return BAD("stream_options", "'stream_options' must be an object");
    if (!r->stream)
        return BAD("stream_options", "'stream_options' is only allowed with 'stream': true");
    rc = get_bool(so, "include_usage", &r->include_usage, err);
    return rc < 0 ? rc : 0;
}

static int parse_lengths(json_t *o, struct ty_api_request *r, struct ty_api_error *err)
{
    int64_t v;
    int rc = get_int(o, "max_completion_tokens", 1, INT32_MAX, &v, err);
    if (rc < 0)
        return rc;
    if (rc == 0)
        r->max_tokens = v;
    if ((rc = get_int(o, "max_tokens", 1, INT32_MAX, &v, err)) < 0)
        return rc;
    if (rc == 0)
        r->max_tokens = v;
    if ((rc = get_int(o, "n", 1, TY_API_MAX_N, &v, err)) < 0)
        return rc;
    r->n = rc == 0 ? (uint32_t)v : 1;
    if ((rc = get_int(o, "top_k", -1, 1 << 20, &v, err)) < 0)
        return rc;
    r->top_k = rc == 0 ? (int32_t)v : -1;
    if ((rc = get_int(o, "seed", INT64_MIN, INT64_MAX, &v, err)) < 0)
        return rc;
    r->has_seed = rc == 0;
    r->seed = (uint64_t)v;
    return 0;
}

/* Fields this server does not implement but that would change the answer if it did: refused
 * by name rather than ignored (a client asking for JSON output or tool calls must not get
 * free text as if it had been honoured). Unknown fields stay ignored. */
static int refuse_unsupported(json_t *o, struct ty_api_request *r, struct ty_api_error *err)
{
    static const char *const absent[] = {"tools", "functions", "guided_json", "guided_regex",
                                         "guided_choice", "guided_grammar", "prompt_logprobs"};
    for (size_t i = 0; i < sizeof(absent) / sizeof(absent[0]); i++) {
        json_t *v = json_object_get(o, absent[i]);
        if (v && !json_is_null(v) && !(json_is_array(v) && !json_array_size(v)))
            return BAD(absent[i], "'%s' is not supported by this server", absent[i]);
    }
    json_t *tc = json_object_get(o, "tool_choice");
    if (tc && !json_is_null(tc) &&
        !(json_is_string(tc) && (!strcmp(json_string_value(tc), "none") ||
                                 !strcmp(json_string_value(tc), "auto"))))
        return BAD("tool_choice", "'tool_choice' other than none or auto needs tools, which "
                                  "this server does not support");
    json_t *rf = json_object_get(o, "response_format");
    if (rf && !json_is_null(rf)) {
        const char *t = json_string_value(json_object_get(rf, "type"));
        if (!json_is_object(rf) || !t || strcmp(t, "text"))
            return BAD("response_format", "'response_format' other than {\"type\": \"text\"} "
                                          "(JSON or schema output) is not supported by this "
                                          "server");
    }
    json_t *bo = json_object_get(o, "best_of");
    if (bo && !json_is_null(bo) &&
        !(json_is_integer(bo) && (json_integer_value(bo) == 1 ||
                                  json_integer_value(bo) == (json_int_t)r->n)))
        return BAD("best_of", "'best_of' other than 1 or n is not supported by this server");
    json_t *sfx = json_object_get(o, "suffix");
    if (sfx && !json_is_null(sfx) && !(json_is_string(sfx) && !json_string_length(sfx)))
        return BAD("suffix", "'suffix' (insertion) is not supported by this server");
    return 0;
}

static int parse_sampling(json_t *o, struct ty_api_request *r, struct ty_api_error *err)
{
    int rc;
    if ((rc = set_float(o, "temperature", 0, 2, &r->temperature, err)) ||
        (rc = set_float(o, "top_p", 0, 1, &r->top_p, err)) ||
        (rc = set_float(o, "min_p", 0, 1, &r->min_p, err)) ||
        (rc = set_float(o, "presence_penalty", -2, 2, &r->presence_penalty, err)) ||
        (rc = set_float(o, "frequency_penalty", -2, 2, &r->frequency_penalty, err)) ||
        (rc = set_float(o, "repetition_penalty", 0.01, 10, &r->repetition_penalty, err)))
        return rc;
    if (json_object_get(o, "top_p") && r->top_p <= 0)
        return BAD("top_p", "'top_p' must be greater than 0");
    if ((rc = get_bool(o, "ignore_eos", &r->ignore_eos, err)) < 0)
        return rc;
    if ((rc = get_bool(o, "return_token_ids", &r->return_token_ids, err)) < 0)
        return rc;
    if ((rc = get_bool(o, "echo", &r->echo, err)) < 0)
        return rc;
    if (r->echo && r->kind == TY_API_CHAT)
        return BAD("echo", "'echo' is only supported for completions");
    json_t *model = json_object_get(o, "model");
    if (model && !json_is_null(model) && !json_is_string(model))
        return BAD("model", "'model' must be a string");
    if (json_is_string(model) && !(r->model = adup(r, model)))
        return TY_ENOMEM;
    /* OpenAI's latency tier; the Conductor serves it under the SLO class of that name */
    static const char *const tiers[] = {"auto", "default", "flex", "scale", "priority"};
    json_t *tier = json_object_get(o, "service_tier");
    if (tier && !json_is_null(tier)) {
        const char *t = json_is_string(tier) ? json_string_value(tier) : NULL;
        for (size_t i = 0; t && i < sizeof(tiers) / sizeof(tiers[0]) && !r->service_tier[0]; i++)
            if (!strcmp(t, tiers[i]))
                snprintf(r->service_tier, sizeof(r->service_tier), "%s", t);
        if (!r->service_tier[0])
            return BAD("service_tier",
                       "'service_tier' must be one of auto, default, flex, scale, priority");
    }
    /* OpenAI's logit_bias: {"token id": bias}; the ids are checked against the vocabulary
     * when the request is prepared (the parser does not know the model) */
    json_t *lb = json_object_get(o, "logit_bias");
    if (lb && !json_is_null(lb)) {
        if (!json_is_object(lb))
            return BAD("logit_bias", "'logit_bias' must be an object mapping token ids to "
                                     "biases");
        if (json_object_size(lb) > TY_SAMPLE_MAX_LOGIT_BIAS)
            return BAD("logit_bias", "'logit_bias' has %zu entries; at most %d",
                       json_object_size(lb), TY_SAMPLE_MAX_LOGIT_BIAS);
        const char *k;
        json_t *v;
        json_object_foreach(lb, k, v) {
            char *end;
            unsigned long id = strtoul(k, &end, 10);
            if (k[0] < '0' || k[0] > '9' || *end || id > UINT32_MAX)
                return BAD("logit_bias", "'logit_bias' key '%.32s' is not a token id", k);
            double b = json_number_value(v);
            if (!json_is_number(v) || !(b >= -100 && b <= 100))
                return BAD("logit_bias", "'logit_bias' value for token %lu must be a number "
                                         "between -100 and 100", id);
            r->logit_bias[r->n_logit_bias++] = (struct ty_logit_bias){(uint32_t)id, (float)b};
        }
    }
    /* vLLM's stop_token_ids and min_tokens */
    json_t *sti = json_object_get(o, "stop_token_ids");
    if (sti && !json_is_null(sti)) {
        if (!json_is_array(sti) || json_array_size(sti) > TY_GEN_MAX_STOP_IDS)
            return BAD("stop_token_ids", "'stop_token_ids' must be a list of at most %d token "
                                         "ids", TY_GEN_MAX_STOP_IDS);
        size_t i;
        json_t *v;
        json_array_foreach(sti, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > UINT32_MAX)
                return BAD("stop_token_ids", "'stop_token_ids[%zu]' is not a token id", i);
            r->stop_ids[r->n_stop_ids++] = (uint32_t)json_integer_value(v);
        }
    }
    int64_t mt;
    int mrc = get_int(o, "min_tokens", 0, INT32_MAX, &mt, err);
    if (mrc < 0)
        return mrc;
    if (mrc == 0) {
        if (r->max_tokens >= 0 && mt > r->max_tokens)
            return BAD("min_tokens", "'min_tokens' (%lld) is above 'max_tokens' (%lld)",
                       (long long)mt, (long long)r->max_tokens);
        r->min_tokens = (uint32_t)mt;
    }
    /* Tycho's extension: any SLO class the operator configured, by name */
    json_t *cls = json_object_get(o, "slo_class");
    if (cls && !json_is_null(cls)) {
        const char *c = json_is_string(cls) ? json_string_value(cls) : NULL;
        if (!c || !c[0] || strlen(c) >= sizeof(r->slo_class))
            return BAD("slo_class", "'slo_class' must be the name of an SLO class (a string of "
                                    "1 to %zu bytes)", sizeof(r->slo_class) - 1);
        snprintf(r->slo_class, sizeof(r->slo_class), "%s", c);
    }
    return 0;
}

/* Limits across fields: prompts x n choices (each a backend sequence) and echo. */
static int check_choices(const struct ty_api_request *r, struct ty_api_error *err)
{
    if (r->n_prompts * r->n > TY_API_MAX_CHOICES)
        return BAD("n", "%zu prompts with 'n' = %u make %zu choices; at most %d choices "
                        "(prompts x n) per request", r->n_prompts, r->n,
                   r->n_prompts * r->n, TY_API_MAX_CHOICES);
    if (r->echo && r->logprobs)
        return BAD("echo", "'echo' cannot be combined with 'logprobs': prompt tokens' "
                           "logprobs are not computed");
    return 0;
}

int ty_api_parse_request_in(ty_arena_t *arena, const char *body, size_t len,
                            enum ty_api_kind kind, struct ty_api_request *r,
                            struct ty_api_error *err)
{
    memset(r, 0, sizeof(*r));
    r->arena = arena;
    r->kind = kind;
    r->max_tokens = -1;
    r->temperature = 1;
    r->top_p = 1;
    r->repetition_penalty = 1;
    if (!ty_api_utf8_valid(body, len))
        return BAD(NULL, "the request body is not valid UTF-8");
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return BAD(NULL, "invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
    int rc = 0;
    if (!json_is_object(o))
        rc = BAD(NULL, "the request body must be a JSON object");
    if (!rc)
        rc = kind == TY_API_CHAT ? parse_messages(o, r, err) : parse_prompt(o, r, err);
    if (!rc)
        rc = parse_lengths(o, r, err);
    if (!rc)
        rc = parse_sampling(o, r, err);
    if (!rc)
        rc = refuse_unsupported(o, r, err);
    if (!rc)
        rc = parse_stop(o, r, err);
    if (!rc)
        rc = parse_stream(o, r, err);
    if (!rc)
        rc = parse_logprobs(o, r, err);
    if (!rc)
        rc = check_choices(r, err);
    json_decref(o);
    if (rc == TY_ENOMEM)
        ty_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    if (rc) { /* what it allocated stays in the arena, freed with it */
        memset(r, 0, sizeof(*r));
        r->arena = arena;
    }
    return rc;
}

int ty_api_parse_request(const char *body, size_t len, enum ty_api_kind kind,
                         struct ty_api_request *r, struct ty_api_error *err)
{
    ty_arena_t *a = ty_arena_new(0);
    int rc = ty_api_parse_request_in(a, body, len, kind, r, err);
    if (rc) {
        ty_arena_free(a);
        memset(r, 0, sizeof(*r));
        return rc;
    }
    r->own_arena = true;
    return 0;
}

void ty_api_request_clear(struct ty_api_request *r)
{
    if (r->own_arena)
        ty_arena_free(r->arena);
    memset(r, 0, sizeof(*r));
}
