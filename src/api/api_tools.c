/* Tool calls and reasoning in model output: the families' syntaxes (api-tools.h), parsed
 * from the whole text so far on every step (simple, and a stream and a whole response cannot
 * disagree; output texts are small next to what the model costs to make them). */
#include "api-tools.h"

#include "tycho/errors.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"
#define PY_TAG "<|python_tag|>"

static const char *const harmony_markers[] = {"<|start|>", "<|channel|>", "<|message|>",
                                              "<|end|>", "<|call|>", "<|return|>",
                                              "<|constrain|>", NULL};

enum ty__api_fam ty__api_fam_detect(const char *s)
{
    if (!s)
        return TY__API_FAM_NONE;
    if (strstr(s, "<|channel|>") && strstr(s, "<|message|>"))
        return TY__API_FAM_HARMONY;
    if (strstr(s, "tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin"))
        return TY__API_FAM_DEEPSEEK;
    if (strstr(s, HERMES_OPEN))
        return TY__API_FAM_HERMES;
    if (strstr(s, "<|start_header_id|>")) /* tools or not: its JSON calls are the only kind */
        return TY__API_FAM_LLAMA3;
    return TY__API_FAM_NONE;
}

const char *ty__api_fam_name(enum ty__api_fam f)
{
    static const char *const names[] = {"none", "hermes", "harmony", "deepseek_v3", "llama3_json"};
    return (unsigned)f < sizeof(names) / sizeof(names[0]) ? names[f] : "none";
}

static bool eq(const char *a, size_t n, const char *lit)
{
    return strlen(lit) == n && !memcmp(a, lit, n);
}

bool ty__api_fam_marker(enum ty__api_fam f, const char *t, size_t n)
{
    if (f == TY__API_FAM_HARMONY) {
        for (size_t i = 0; harmony_markers[i]; i++)
            if (eq(t, n, harmony_markers[i]))
                return true;
        return false;
    }
    if (eq(t, n, THINK_OPEN) || eq(t, n, THINK_CLOSE))
        return true;
    if (f == TY__API_FAM_HERMES)
        return eq(t, n, HERMES_OPEN) || eq(t, n, HERMES_CLOSE);
    if (f == TY__API_FAM_DEEPSEEK)
        return eq(t, n, DS_CALLS_BEGIN) || eq(t, n, DS_CALLS_END) || eq(t, n, DS_CALL_BEGIN) ||
               eq(t, n, DS_CALL_END) || eq(t, n, DS_SEP);
    if (f == TY__API_FAM_LLAMA3)
        return eq(t, n, PY_TAG);
    return false;
}

/* ---- small helpers ------------------------------------------------------------------------ */

struct sb {
    char *p;
    size_t n, cap;
    bool oom;
};

static void sb_put(struct sb *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static const char *find(const char *s, size_t n, const char *lit)
{
    return memmem(s, n, lit, strlen(lit));
}

static bool starts(const char *s, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    return n >= l && !memcmp(s, lit, l);
}

/* The longest suffix of s[0..n) that is a proper prefix of one of `lits` (NULL-ended). */
static size_t partial_tail(const char *s, size_t n, const char *const *lits)
{
    size_t best = 0;
    for (size_t i = 0; lits[i]; i++) {
        size_t l = strlen(lits[i]);
        for (size_t k = l - 1 < n ? l - 1 : n; k > best; k--)
            if (!memcmp(s + n - k, lits[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && isspace((unsigned char)s[i]))
        i++;
    return i;
}

static bool all_ws(const char *s, size_t n)
{
    return skip_ws(s, n, 0) == n;
}

struct parse {
    const struct ty__api_outcfg *c;
    bool final;
    struct sb reasoning, content;
    bool has_reasoning;
    struct ty__api_call *calls;
    size_t n_calls, cap_calls;
    bool oom;
};

static void add_call(struct parse *p, const char *name, size_t nn, const char *args, size_t na)
{
    if (p->n_calls == p->cap_calls) {
        size_t nc = p->cap_calls ? p->cap_calls * 2 : 4;
        struct ty__api_call *c = realloc(p->calls, nc * sizeof(*c));
        if (!c) {
            p->oom = true;
            return;
        }
        p->calls = c;
        p->cap_calls = nc;
    }
    char *a = strndup(args, na), *m = strndup(name, nn);
    if (!a || !m) {
        free(a);
        free(m);
        p->oom = true;
        return;
    }
    p->calls[p->n_calls++] = (struct ty__api_call){m, a};
}

/* A JSON value as compact text into a call (args); false when `v` is not an object. */
static bool add_call_json(struct parse *p, const char *name, json_t *args)
{
    if (!json_is_object(args))
        return false;
    char *s = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!s) {
        p->oom = true;
        return true;
    }
    add_call(p, name, strlen(name), s, strlen(s));
    free(s);
    return true;
}

/* {"name": s, "arguments"|"parameters": {...}} -> a call; false when it is not one. */
static bool add_call_obj(struct parse *p, json_t *o)
{
    json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
    if (!args)
        args = json_object_get(o, "parameters");
    if (!json_is_string(name))
        return false;
    return add_call_json(p, json_string_value(name), args);
}

/* Content text, holding back (when not final) a tail that might start one of `lits`. */
static void put_content(struct parse *p, const char *s, size_t n, const char *const *lits)
{
    size_t hold = p->final || !lits ? 0 : partial_tail(s, n, lits);
    sb_put(&p->content, s, n - hold);
}

/* ---- families ----------------------------------------------------------------------------- */

/* Hermes / Qwen: content, <tool_call>{json}</tool_call> ... */
static void parse_hermes(struct parse *p, const char *s, size_t n)
{
    static const char *const lits[] = {HERMES_OPEN, NULL};
    size_t i = 0;
    while (i < n) {
        const char *o = find(s + i, n - i, HERMES_OPEN);
        if (!o) {
            put_content(p, s + i, n - i, lits);
            return;
        }
        sb_put(&p->content, s + i, (size_t)(o - s) - i);
        size_t b = (size_t)(o - s) + strlen(HERMES_OPEN);
        const char *e = find(s + b, n - b, HERMES_CLOSE);
        if (!e && !p->final)
            return; /* the call is still being written */
        size_t end = e ? (size_t)(e - s) : n;
        json_t *j = json_loadb(s + b, end - b, 0, NULL);
        if (!j || !add_call_obj(p, j)) /* not a call after all: keep it as text */
            sb_put(&p->content, o, (e ? end + strlen(HERMES_CLOSE) : n) - (size_t)(o - s));
        json_decref(j);
        i = e ? end + strlen(HERMES_CLOSE) : n;
    }
}

/* One DeepSeek call's inside: "function<sep>NAME\n```json\nARGS\n```" (V3) or
 * "NAME<sep>ARGS" (V3.1). */
static bool ds_call(struct parse *p, const char *s, size_t n)
{
    const char *sep = find(s, n, DS_SEP);
    if (!sep)
        return false;
    size_t a = (size_t)(sep - s) + strlen(DS_SEP), nb = 0, ne = (size_t)(sep - s), b = a;
    if (eq(s, ne, "function")) {
        const char *nl = memchr(s + a, '\n', n - a);
        if (!nl)
            return false;
        nb = a;
        ne = (size_t)(nl - s);
        b = ne + 1;
        if (starts(s + b, n - b, "```json"))
            b += 7;
    }
    size_t e = n;
    while (e > b && isspace((unsigned char)s[e - 1]))
        e--;
    if (e >= b + 3 && !memcmp(s + e - 3, "```", 3))
        e -= 3;
    json_t *j = json_loadb(s + b, e - b, 0, NULL);
    char *name = strndup(s + nb, ne - nb);
    bool ok = j && name && add_call_json(p, name, j);
    free(name);
    json_decref(j);
    return ok;
}

static void parse_deepseek(struct parse *p, const char *s, size_t n)
{
    static const char *const lits[] = {DS_CALLS_BEGIN, DS_CALL_BEGIN, NULL};
    size_t i = 0;
    while (i < n) {
        const char *o = find(s + i, n - i, DS_CALLS_BEGIN), *o1 = find(s + i, n - i, DS_CALL_BEGIN);
        if (!o || (o1 && o1 < o))
            o = o1;
        if (!o) {
            put_content(p, s + i, n - i, lits);
            return;
        }
        sb_put(&p->content, s + i, (size_t)(o - s) - i);
        i = (size_t)(o - s);
        if (starts(s + i, n - i, DS_CALLS_BEGIN))
            i += strlen(DS_CALLS_BEGIN);
        for (;;) { /* calls until calls_end, or text that is not one */
            i = skip_ws(s, n, i);
            if (starts(s + i, n - i, DS_CALLS_END)) {
                i += strlen(DS_CALLS_END);
                break;
            }
            if (!starts(s + i, n - i, DS_CALL_BEGIN))
                break;
            size_t b = i + strlen(DS_CALL_BEGIN);
            const char *e = find(s + b, n - b, DS_CALL_END);
            if (!e && !p->final)
                return;
            size_t end = e ? (size_t)(e - s) : n;
            if (!ds_call(p, s + b, end - b))
                sb_put(&p->content, s + i, (e ? end + strlen(DS_CALL_END) : n) - i);
            i = e ? end + strlen(DS_CALL_END) : n;
        }
        if (!p->final && i < n && partial_tail(s + i, n - i, (const char *const[]){DS_CALLS_END,
                                                                                    DS_CALL_BEGIN,
                                                                                    NULL}) ==
                                            n - i)
            return; /* what follows may still be another call */
    }
}

/* Llama 3 JSON: the whole output (after <|python_tag|>) is a call, or calls joined by ";". */
static void parse_llama3(struct parse *p, const char *s, size_t n)
{
    size_t w = skip_ws(s, n, 0), i = w;
    if (starts(s + i, n - i, PY_TAG))
        i = skip_ws(s, n, i + strlen(PY_TAG));
    else if (!p->final && partial_tail(s + w, n - w, (const char *const[]){PY_TAG, NULL}) == n - w)
        return; /* nothing yet, or maybe the tag */
    if (i == n && !p->final)
        return;
    if (i == n || s[i] != '{') {
        put_content(p, s, n, NULL);
        return;
    }
    if (!p->final)
        return; /* a JSON call is judged whole */
    while (i < n) {
        json_error_t je;
        json_t *j = json_loadb(s + i, n - i, JSON_DISABLE_EOF_CHECK, &je);
        bool ok = j && add_call_obj(p, j);
        json_decref(j);
        if (!ok)
            break;
        i = skip_ws(s, n, i + (size_t)je.position);
        if (i < n && s[i] == ';')
            i = skip_ws(s, n, i + 1);
    }
    if (i < n) { /* not (only) calls: all of it is content */
        for (size_t k = 0; k < p->n_calls; k++)
            free(p->calls[k].name), free(p->calls[k].args);
        p->n_calls = 0;
        put_content(p, s, n, NULL);
    }
}

/* gpt-oss harmony: messages "[<|start|>assistant]<|channel|>C[ to=functions.N][ <|constrain|>json]
 * <|message|>BODY(<|end|>|<|call|>|<|return|>)"; analysis -> reasoning, final (and commentary
 * without a recipient) -> content, a functions.N recipient -> a call. */
static void parse_harmony(struct parse *p, const char *s, size_t n)
{
    static const char *const ends[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>", NULL};
    size_t i = 0;
    while (i < n) {
        const char *m = find(s + i, n - i, "<|message|>");
        if (!m && i == 0 && p->final) { /* no harmony at all: plain text */
            sb_put(&p->content, s, n);
            return;
        }
        if (!m)
            return; /* a header still being written (or trailing noise at the end) */
        const char *h = s + i;
        size_t nh = (size_t)(m - h), b = (size_t)(m - s) + strlen("<|message|>"), e = b;
        while (e < n) {
            size_t k = 0;
            while (ends[k] && !starts(s + e, n - e, ends[k]))
                k++;
            if (ends[k])
                break;
            e++;
        }
        bool closed = e < n;
        const char *to = find(h, nh, "to=functions.");
        const char *ch = find(h, nh, "<|channel|>");
        bool analysis = ch && starts(ch + 11, nh - (size_t)(ch + 11 - h), "analysis");
        if (to && p->c->mode == TY__API_OUT_AUTO) {
            if (!closed && !p->final)
                return;
            const char *nm = to + 13, *ne = nm;
            while (ne < h + nh && !isspace((unsigned char)*ne) && *ne != '<')
                ne++;
            size_t ab = skip_ws(s, e, b), ae = e;
            while (ae > ab && isspace((unsigned char)s[ae - 1]))
                ae--;
            add_call(p, nm, (size_t)(ne - nm), s + ab, ae - ab);
        } else {
            size_t hold = closed || p->final ? 0 : partial_tail(s + b, e - b, ends);
            struct sb *to_sb = analysis ? &p->reasoning : &p->content;
            if (analysis)
                p->has_reasoning = true;
            sb_put(to_sb, s + b, e - b - hold);
            if (!closed)
                return;
        }
        i = e;
        for (size_t k = 0; ends[k]; k++)
            if (ends[k][2] != 's' && starts(s + i, n - i, ends[k])) /* not <|start|> */
                i += strlen(ends[k]);
    }
}

/* The whole output is JSON: [{"name","parameters"}...] (required) or the named function's
 * arguments; judged at the end only. */
static void parse_forced(struct parse *p, const char *s, size_t n)
{
    if (!p->final)
        return;
    json_t *j = json_loadb(s, n, 0, NULL);
    bool ok = j != NULL;
    if (ok && p->c->mode == TY__API_OUT_NAMED) {
        ok = add_call_json(p, p->c->named ? p->c->named : "", j);
    } else if (ok) {
        size_t k;
        json_t *v;
        ok = json_is_array(j) && json_array_size(j) > 0;
        json_array_foreach(j, k, v) if (ok) ok = add_call_obj(p, v);
    }
    json_decref(j);
    if (!ok) {
        for (size_t k = 0; k < p->n_calls; k++)
            free(p->calls[k].name), free(p->calls[k].args);
        p->n_calls = 0;
        sb_put(&p->content, s, n);
    }
}

/* <think>...</think>: returns where the rest (content) starts. */
static size_t parse_think(struct parse *p, const char *s, size_t n)
{
    size_t i = 0;
    bool open = p->c->think_open;
    if (!open) {
        size_t w = skip_ws(s, n, 0);
        if (starts(s + w, n - w, THINK_OPEN)) {
            open = true;
            i = w + strlen(THINK_OPEN);
        } else if (!p->final && w == n) {
            return n; /* only whitespace yet */
        } else if (!p->final && partial_tail(s + w, n - w, (const char *const[]){THINK_OPEN,
                                                                                 NULL}) == n - w) {
            return n;
        }
    }
    if (!open)
        return 0;
    p->has_reasoning = true;
    const char *e = find(s + i, n - i, THINK_CLOSE);
    if (!e) {
        size_t hold = p->final ? 0 : partial_tail(s + i, n - i, (const char *const[]){THINK_CLOSE,
                                                                                     NULL});
        sb_put(&p->reasoning, s + i, n - i - hold);
        return n;
    }
    sb_put(&p->reasoning, s + i, (size_t)(e - s) - i);
    return (size_t)(e - s) + strlen(THINK_CLOSE);
}

int ty__api_out_parse(const struct ty__api_outcfg *c, const char *s, size_t n, bool final,
                      struct ty__api_snap *out)
{
    struct parse p = {.c = c, .final = final};
    memset(out, 0, sizeof(*out));
    if (c->mode == TY__API_OUT_REQUIRED || c->mode == TY__API_OUT_NAMED) {
        parse_forced(&p, s, n);
    } else if (c->fam == TY__API_FAM_HARMONY) {
        parse_harmony(&p, s, n);
    } else {
        size_t i = c->think || c->think_open ? parse_think(&p, s, n) : 0;
        enum ty__api_fam f = c->mode == TY__API_OUT_AUTO ? c->fam : TY__API_FAM_NONE;
        if (f == TY__API_FAM_HERMES)
            parse_hermes(&p, s + i, n - i);
        else if (f == TY__API_FAM_DEEPSEEK)
            parse_deepseek(&p, s + i, n - i);
        else if (f == TY__API_FAM_LLAMA3)
            parse_llama3(&p, s + i, n - i);
        else
            put_content(&p, s + i, n - i, NULL);
    }
    sb_put(&p.reasoning, "", 0);
    sb_put(&p.content, "", 0);
    out->reasoning = p.reasoning.p;
    out->n_reasoning = p.reasoning.n;
    out->content = p.content.p;
    out->n_content = p.content.n;
    out->has_reasoning = p.has_reasoning;
    out->calls = p.calls;
    out->n_calls = p.n_calls;
    if (p.oom || p.reasoning.oom || p.content.oom) {
        ty__api_snap_clear(out);
        return TY_ENOMEM;
    }
    return 0;
}

void ty__api_snap_clear(struct ty__api_snap *s)
{
    for (size_t i = 0; i < s->n_calls; i++) {
        free(s->calls[i].name);
        free(s->calls[i].args);
    }
    free(s->calls);
    free(s->reasoning);
    free(s->content);
    memset(s, 0, sizeof(*s));
}

const char *ty__api_snap_content(const struct ty__api_snap *s)
{
    if (s->n_calls && all_ws(s->content, s->n_content))
        return NULL;
    return s->content;
}

/* ---- streams ------------------------------------------------------------------------------ */

void ty__api_out_init(struct ty__api_out *o, const struct ty__api_outcfg *c)
{
    memset(o, 0, sizeof(*o));
    o->cfg = *c;
}

void ty__api_out_free(struct ty__api_out *o)
{
    free(o->buf);
    memset(o, 0, sizeof(*o));
}

int ty__api_out_feed(struct ty__api_out *o, const char *text, size_t len)
{
    struct sb b = {o->buf, o->n, o->cap, false};
    sb_put(&b, text, len);
    if (b.oom)
        return TY_ENOMEM;
    o->buf = b.p;
    o->n = b.n;
    o->cap = b.cap;
    return 0;
}

int ty__api_out_step(struct ty__api_out *o, bool final, ty__api_delta_cb cb, void *arg,
                     struct ty__api_snap *snap)
{
    struct ty__api_snap s;
    int rc = ty__api_out_parse(&o->cfg, o->buf ? o->buf : "", o->n, final, &s);
    if (rc)
        return rc;
    if (s.n_reasoning > o->sent_reasoning) {
        cb(arg, &(struct ty__api_delta){.kind = TY__API_DELTA_REASONING,
                                        .text = s.reasoning + o->sent_reasoning,
                                        .len = s.n_reasoning - o->sent_reasoning});
        o->sent_reasoning = s.n_reasoning;
    }
    /* whitespace alone is held back: it may turn out to be the gap before a tool call
     * (then the message's content is null) */
    bool show = !all_ws(s.content, s.n_content) || (final && !s.n_calls);
    if (show && s.n_content > o->sent_content) {
        cb(arg, &(struct ty__api_delta){.kind = TY__API_DELTA_CONTENT,
                                        .text = s.content + o->sent_content,
                                        .len = s.n_content - o->sent_content});
        o->sent_content = s.n_content;
    }
    for (; o->sent_calls < s.n_calls; o->sent_calls++)
        cb(arg, &(struct ty__api_delta){.kind = TY__API_DELTA_CALL, .index = o->sent_calls,
                                        .call = &s.calls[o->sent_calls]});
    if (snap)
        *snap = s;
    else
        ty__api_snap_clear(&s);
    return 0;
}

/* ---- constrained tool choice -------------------------------------------------------------- */

static json_t *params_of(json_t *fn)
{
    json_t *p = json_object_get(fn, "parameters");
    return p ? json_incref(p) : json_pack("{s:s,s:{}}", "type", "object", "properties");
}

char *ty__api_tools_schema(json_t *tools, const char *named)
{
    json_t *any = json_array(), *out = NULL;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (named && name && !strcmp(name, named)) {
            out = params_of(fn);
            break;
        }
        if (!named)
            json_array_append_new(any, json_pack("{s:{s:{s:s,s:[s]},s:o},s:[s,s],s:b}",
                                                 "properties", "name", "type", "string", "enum",
                                                 name, "parameters", params_of(fn), "required",
                                                 "name", "parameters", "additionalProperties",
                                                 0));
    }
    if (!named)
        out = json_pack("{s:s,s:i,s:{s:s,s:O}}", "type", "array", "minItems", 1, "items", "type",
                        "object", "anyOf", any);
    json_decref(any);
    char *s = out ? json_dumps(out, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(out);
    return s;
}

void ty__api_call_id(char *buf, size_t cap, unsigned long long x)
{
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    size_t n = snprintf(buf, cap, "call_");
    x ^= 0x9e3779b97f4a7c15ull;
    for (int k = 0; k < 24 && n + 1 < cap; k++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf[n++] = al[x % 62];
    }
    buf[n] = 0;
}
