/* OpenAI request validation: JSON body -> struct ty_api_request, with a 400 naming `param`
 * for the first field that is wrong. Ranges follow the OpenAI API reference (temperature
 * 0..2, top_p 0..1, penalties -2..2, top_logprobs 0..20, n >= 1, max_tokens >= 1) and vLLM's
 * extensions (top_k, min_p, repetition_penalty, ignore_eos). Unknown fields are ignored.
 * Everything the request holds (strings, prompts, messages) is allocated from one arena: the
 * caller's (ty_api_parse_request_in) or its own (ty_api_parse_request, freed by
 * ty_api_request_clear). */
#include "tycho/api.h"

#include "api-tools.h"
#include "tycho/arena.h"
#include "tycho/errors.h"

#include <ctype.h>
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
    e->no_retry = false;
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

/* Message content: a string, null (""), or an array of {"type":"text","text":...} parts
 * joined by "\n" as vLLM joins them (each part up to its first NUL, as C strings). */
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
        if (!json_is_object(part) || !json_is_string(type))
            return BAD("messages", "'messages[%zu].content[%zu]' must be a content part with "
                                   "a 'type'", i, k);
        if (strcmp(json_string_value(type), "text"))
            return BAD("messages", "'messages[%zu].content[%zu]' has type '%.40s'; this "
                                   "server takes only text parts", i, k,
                       json_string_value(type));
        if (!json_is_string(text))
            return BAD("messages", "'messages[%zu].content[%zu].text' must be a string", i, k);
        len += strlen(json_string_value(text)) + 1;
    }
    char *s = ty_arena_try_alloc(r->arena, len + 1);
    if (!s)
        return TY_ENOMEM;
    len = 0;
    json_array_foreach(c, k, part) {
        const char *t = json_string_value(json_object_get(part, "text"));
        size_t tl = strlen(t);
        if (k)
            s[len++] = '\n';
        memcpy(s + len, t, tl);
        len += tl;
    }
    s[len] = 0;
    *out = s;
    return 0;
}

/* An assistant message's tool_calls, normalised into `m` as the template gets them: each
 * {id, type: "function", function: {name, arguments}} with the arguments parsed from their
 * JSON string into an object (as vLLM does before rendering). */
static int message_tool_calls(json_t *tc, size_t i, json_t *m, struct ty_api_error *err)
{
    if (!json_is_array(tc))
        return BAD("messages", "'messages[%zu].tool_calls' must be an array", i);
    json_t *out = json_array();
    json_object_set_new(m, "tool_calls", out);
    size_t k;
    json_t *c;
    json_array_foreach(tc, k, c) {
        json_t *fn = json_object_get(c, "function"), *id = json_object_get(c, "id");
        json_t *type = json_object_get(c, "type"), *name = json_object_get(fn, "name");
        json_t *args = json_object_get(fn, "arguments"), *parsed = NULL;
        if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(name))
            return BAD("messages", "'messages[%zu].tool_calls[%zu]' must be {\"id\", \"type\": "
                                   "\"function\", \"function\": {\"name\", \"arguments\"}}", i, k);
        if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function")))
            return BAD("messages", "'messages[%zu].tool_calls[%zu].type' must be \"function\"",
                       i, k);
        if (id && !json_is_string(id))
            return BAD("messages", "'messages[%zu].tool_calls[%zu].id' must be a string", i, k);
        if (json_is_string(args))
            parsed = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
        else if (json_is_object(args))
            parsed = json_incref(args);
        if (!json_is_object(parsed)) {
            json_decref(parsed);
            return BAD("messages", "'messages[%zu].tool_calls[%zu].function.arguments' must be "
                                   "a JSON object encoded as a string", i, k);
        }
        json_array_append_new(out, json_pack("{s:o,s:s,s:{s:O,s:o}}", "id",
                                             id ? json_incref(id) : json_string(""), "type",
                                             "function", "function", "name", name, "arguments",
                                             parsed));
    }
    return 0;
}

/* One message, checked, into r->msgs[i] and (normalised) `m`. */
static int parse_message(json_t *v, size_t i, struct ty_api_request *r, json_t *m,
                         struct ty_api_error *err)
{
    json_t *role = json_object_get(v, "role");
    if (!json_is_object(v) || !json_is_string(role))
        return BAD("messages", "'messages[%zu]' must be an object with a string 'role'", i);
    const char *rs = json_string_value(role);
    if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
        strcmp(rs, "tool") && strcmp(rs, "developer"))
        return BAD("messages", "'messages[%zu].role' must be system, user, assistant, "
                               "tool or developer", i);
    bool assistant = !strcmp(rs, "assistant");
    json_t *c = json_object_get(v, "content"), *tc = json_object_get(v, "tool_calls");
    if (tc && json_is_null(tc))
        tc = NULL;
    if (tc && !assistant)
        return BAD("messages", "'messages[%zu].tool_calls' is only allowed in assistant "
                               "messages", i);
    if (!c && !tc)
        return BAD("messages", "'messages[%zu].content' is required", i);
    int rc = content_text(r, c ? c : json_null(), i, &r->msgs[i].content, err);
    if (rc)
        return rc;
    r->msgs[i].role = ty_arena_strdup(r->arena, strcmp(rs, "developer") ? rs : "system");
    json_object_set_new(m, "role", json_string(r->msgs[i].role));
    json_object_set_new(m, "content", json_string(r->msgs[i].content));
    if (tc && (rc = message_tool_calls(tc, i, m, err)))
        return rc;
    static const char *const strs[] = {"tool_call_id", "name", "reasoning_content"};
    for (size_t k = 0; k < sizeof(strs) / sizeof(strs[0]); k++) {
        json_t *s = json_object_get(v, strs[k]);
        if (s && !json_is_null(s) && !json_is_string(s))
            return BAD("messages", "'messages[%zu].%s' must be a string", i, strs[k]);
        if (json_is_string(s))
            json_object_set(m, strs[k], s);
    }
    if (!strcmp(rs, "tool") && !json_is_string(json_object_get(v, "tool_call_id")))
        return BAD("messages", "'messages[%zu].tool_call_id' is required in tool messages", i);
    return 0;
}

static int parse_messages(json_t *o, struct ty_api_request *r, json_t *tpl,
                          struct ty_api_error *err)
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
    json_t *arr = json_array();
    json_object_set_new(tpl, "messages", arr);
    size_t i;
    json_t *m;
    json_array_foreach(v, i, m) {
        json_t *nm = json_object();
        json_array_append_new(arr, nm);
        int rc = parse_message(m, i, r, nm, err);
        if (rc)
            return rc;
        r->n_msgs++;
    }
    return 0;
}

/* ---- tools, tool_choice, response_format ------------------------------------------------- */

#if __has_include("tycho/grammar.h")
#include "tycho/grammar.h"
#define HAVE_GRAMMAR 1
#else
#define HAVE_GRAMMAR 0
#endif

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '-' || s[i] == '.'))
            return false;
    return true;
}

/* tools: [{"type": "function", "function": {"name", "description"?, "parameters"?,
 * "strict"?}}], names unique; kept as sent for the template. */
static int parse_tools(json_t *o, struct ty_api_request *r, json_t *tpl,
                       struct ty_api_error *err)
{
    json_t *v = json_object_get(o, "tools");
    if (!v || json_is_null(v) || (json_is_array(v) && !json_array_size(v)))
        return 0;
    if (!json_is_array(v) || json_array_size(v) > TY_API_MAX_TOOLS)
        return BAD("tools", "'tools' must be an array of at most %d tools", TY_API_MAX_TOOLS);
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        json_t *fn = json_object_get(t, "function"), *type = json_object_get(t, "type");
        json_t *name = json_object_get(fn, "name"), *x;
        if (!json_is_object(t) || !json_is_string(type) ||
            strcmp(json_string_value(type), "function"))
            return BAD("tools", "'tools[%zu].type' must be \"function\"", i);
        if (!json_is_object(fn) || !json_is_string(name) || !name_ok(json_string_value(name)))
            return BAD("tools", "'tools[%zu].function.name' must be 1 to 64 letters, digits, "
                                "'_', '-' or '.'", i);
        if ((x = json_object_get(fn, "description")) && !json_is_string(x) && !json_is_null(x))
            return BAD("tools", "'tools[%zu].function.description' must be a string", i);
        if ((x = json_object_get(fn, "parameters")) && !json_is_object(x) && !json_is_null(x))
            return BAD("tools", "'tools[%zu].function.parameters' must be a JSON schema object",
                       i);
        if ((x = json_object_get(fn, "strict")) && !json_is_boolean(x) && !json_is_null(x))
            return BAD("tools", "'tools[%zu].function.strict' must be a boolean", i);
        if (json_is_null(json_object_get(fn, "parameters")))
            json_object_del(fn, "parameters");
        for (size_t k = 0; k < i; k++)
            if (json_equal(name, json_object_get(json_object_get(json_array_get(v, k),
                                                                 "function"), "name")))
                return BAD("tools", "'tools[%zu].function.name' '%s' is used twice", i,
                           json_string_value(name));
    }
    char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    r->tools_json = s ? ty_arena_strdup(r->arena, s) : NULL;
    free(s);
    if (!r->tools_json)
        return TY_ENOMEM;
    r->n_tools = json_array_size(v);
    json_object_set(tpl, "tools", v);
    r->tool_choice = TY_API_TOOL_CHOICE_AUTO;
    return 0;
}

static int parse_tool_choice(json_t *o, struct ty_api_request *r, struct ty_api_error *err)
{
    json_t *v = json_object_get(o, "tool_choice"), *tools = json_object_get(o, "tools");
    if (!v || json_is_null(v))
        return 0;
    const char *s = json_string_value(v);
    if (s && !strcmp(s, "none"))
        r->tool_choice = TY_API_TOOL_CHOICE_NONE;
    else if (s && !strcmp(s, "auto"))
        r->tool_choice = r->n_tools ? TY_API_TOOL_CHOICE_AUTO : TY_API_TOOL_CHOICE_NONE;
    else if (s && !strcmp(s, "required"))
        r->tool_choice = TY_API_TOOL_CHOICE_REQUIRED;
    else if (json_is_object(v)) {
        json_t *type = json_object_get(v, "type");
        const char *name = json_string_value(json_object_get(json_object_get(v, "function"),
                                                             "name"));
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") || !name)
            return BAD("tool_choice", "'tool_choice' must be none, auto, required or "
                                      "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            const char *tn = json_string_value(json_object_get(json_object_get(t, "function"),
                                                               "name"));
            if (tn && !strcmp(tn, name))
                break;
        }
        if (!r->n_tools || i == json_array_size(tools))
            return BAD("tool_choice", "'tool_choice' names the function '%.64s', which is not "
                                      "among 'tools'", name);
        r->tool_choice = TY_API_TOOL_CHOICE_NAMED;
        if (!(r->tool_name = ty_arena_strdup(r->arena, name)))
            return TY_ENOMEM;
    } else {
        return BAD("tool_choice", "'tool_choice' must be none, auto, required or "
                                  "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (r->tool_choice == TY_API_TOOL_CHOICE_REQUIRED && !r->n_tools)
        return BAD("tool_choice", "'tool_choice' \"required\" needs 'tools'");
    return 0;
}

/* Compile a schema as the batcher will (tycho/grammar.h): a 400 naming `param` and the
 * grammar's message (the keyword it does not support) when it fails. */
static int check_grammar(struct ty_api_request *r, const char *param, struct ty_api_error *err)
{
#if HAVE_GRAMMAR
    struct ty_gen_grammar spec = {.kind = (enum ty_grammar_kind)r->grammar,
                                  .schema = r->grammar_schema,
                                  .schema_len = r->grammar_schema ? strlen(r->grammar_schema) : 0};
    ty_grammar_t *g = NULL;
    char msg[200] = "";
    int rc = ty_grammar_compile(&g, &spec, msg, sizeof(msg));
    ty_grammar_free(g);
    if (rc == TY_ENOMEM)
        return rc;
    if (rc)
        return BAD(param, "'%s': %s", param, msg[0] ? msg : ty_strerror(rc));
    return 0;
#else
    (void)r;
    return BAD(param, "'%s' needs constrained output, which this build does not have", param);
#endif
}

static int set_schema(struct ty_api_request *r, json_t *schema)
{
    char *s = json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER);
    r->grammar_schema = s ? ty_arena_strdup(r->arena, s) : NULL;
    free(s);
    r->grammar = TY_API_GRAMMAR_JSON_SCHEMA;
    return r->grammar_schema ? 0 : TY_ENOMEM;
}

/* response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {"name",
 * "schema"?, "strict"?}}. */
static int parse_response_format(json_t *o, struct ty_api_request *r, struct ty_api_error *err)
{
    json_t *v = json_object_get(o, "response_format");
    if (!v || json_is_null(v) || r->grammar) /* a constrained tool choice wins */
        return 0;
    const char *t = json_string_value(json_object_get(v, "type"));
    if (!json_is_object(v) || !t)
        return BAD("response_format", "'response_format' must be an object with a 'type'");
    if (!strcmp(t, "text"))
        return 0;
    if (!strcmp(t, "json_object")) {
        r->grammar = TY_API_GRAMMAR_JSON_OBJECT;
        return check_grammar(r, "response_format", err);
    }
    if (strcmp(t, "json_schema"))
        return BAD("response_format", "'response_format.type' must be text, json_object or "
                                      "json_schema, got '%.40s'", t);
    json_t *js = json_object_get(v, "json_schema"), *x;
    if (!json_is_object(js))
        return BAD("response_format", "'response_format.json_schema' must be an object");
    if (!json_is_string(x = json_object_get(js, "name")) || !name_ok(json_string_value(x)))
        return BAD("response_format", "'response_format.json_schema.name' must be 1 to 64 "
                                      "letters, digits, '_', '-' or '.'");
    if ((x = json_object_get(js, "strict")) && !json_is_boolean(x) && !json_is_null(x))
        return BAD("response_format", "'response_format.json_schema.strict' must be a boolean");
    json_t *schema = json_object_get(js, "schema");
    if (schema && !json_is_null(schema) && !json_is_object(schema))
        return BAD("response_format", "'response_format.json_schema.schema' must be a JSON "
                                      "schema object");
    if (!json_is_object(schema)) { /* no schema: any JSON object */
        r->grammar = TY_API_GRAMMAR_JSON_OBJECT;
        return check_grammar(r, "response_format", err);
    }
    int rc = set_schema(r, schema);
    return rc ? rc : check_grammar(r, "response_format", err);
}

/* tool_choice required / named: the output is constrained to the calls' JSON (it wins over
 * response_format). */
static int tool_grammar(struct ty_api_request *r, struct ty_api_error *err)
{
    if (r->tool_choice != TY_API_TOOL_CHOICE_REQUIRED && r->tool_choice != TY_API_TOOL_CHOICE_NAMED)
        return 0;
    json_t *tools = json_loads(r->tools_json, 0, NULL);
    char *s = tools ? ty__api_tools_schema(tools, r->tool_name) : NULL;
    json_t *schema = s ? json_loads(s, 0, NULL) : NULL;
    free(s);
    json_decref(tools);
    if (!schema)
        return TY_ENOMEM;
    /* required: at most one call per offered tool (one without parallel_tool_calls), so that a
     * model repeating itself ends its array instead of running to max_tokens */
    if (r->tool_choice == TY_API_TOOL_CHOICE_REQUIRED)
        json_object_set_new(schema, "maxItems",
                            json_integer(r->parallel_tool_calls ? (json_int_t)r->n_tools : 1));
    int rc = set_schema(r, schema);
    json_decref(schema);
    return rc ? rc : check_grammar(r, r->tool_name ? "tool_choice" : "tools", err);
}

/* The chat-only fields: tools, tool_choice, parallel_tool_calls, chat_template_kwargs,
 * add_generation_prompt; then the template's request as JSON text. */
static int parse_chat_extras(json_t *o, struct ty_api_request *r, json_t *tpl,
                             struct ty_api_error *err)
{
    int rc;
    if ((rc = parse_tools(o, r, tpl, err)) || (rc = parse_tool_choice(o, r, err)))
        return rc;
    if ((rc = get_bool(o, "parallel_tool_calls", &r->parallel_tool_calls, err)) < 0 ||
        (rc = get_bool(o, "add_generation_prompt", &r->add_generation_prompt, err)) < 0)
        return rc;
    json_t *kw = json_object_get(o, "chat_template_kwargs");
    if (kw && !json_is_null(kw) && !json_is_object(kw))
        return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (json_is_object(kw))
        json_object_set(tpl, "chat_template_kwargs", kw);
    json_object_set_new(tpl, "add_generation_prompt", json_boolean(r->add_generation_prompt));
    if ((rc = tool_grammar(r, err)))
        return rc;
    char *s = json_dumps(tpl, JSON_COMPACT | JSON_PRESERVE_ORDER);
    r->tpl_json = s ? ty_arena_strdup(r->arena, s) : NULL;
    free(s);
    return r->tpl_json ? 0 : TY_ENOMEM;
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
    static const char *const absent[] = {"functions", "function_call", "guided_json",
                                         "guided_regex", "guided_choice", "guided_grammar",
                                         "prompt_logprobs"};
    for (size_t i = 0; i < sizeof(absent) / sizeof(absent[0]); i++) {
        json_t *v = json_object_get(o, absent[i]);
        if (v && !json_is_null(v) && !(json_is_array(v) && !json_array_size(v)))
            return BAD(absent[i], "'%s' is not supported by this server", absent[i]);
    }
    if (r->kind == TY_API_COMPLETION) {
        static const char *const chat_only[] = {"tools", "tool_choice"};
        for (size_t i = 0; i < 2; i++) {
            json_t *v = json_object_get(o, chat_only[i]);
            if (v && !json_is_null(v) && !(json_is_array(v) && !json_array_size(v)))
                return BAD(chat_only[i], "'%s' is only supported for chat completions",
                           chat_only[i]);
        }
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
    r->parallel_tool_calls = true;
    r->add_generation_prompt = true;
    json_t *tpl = json_object();
    if (!rc)
        rc = kind == TY_API_CHAT ? parse_messages(o, r, tpl, err) : parse_prompt(o, r, err);
    if (!rc && kind == TY_API_CHAT)
        rc = parse_chat_extras(o, r, tpl, err);
    if (!rc)
        rc = parse_response_format(o, r, err);
    json_decref(tpl);
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
