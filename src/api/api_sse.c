/* Streamed responses: each SSE event (`data: {chunk}\n\n`) is written straight into the
 * connection's output buffer (tycho/http.h frames) by a small JSON writer, with no JSON tree,
 * no intermediate string and no write of its own: the connection's buffer goes out once per
 * loop turn. The bytes are those json_dumps(JSON_COMPACT) gave for the trees this replaces
 * (jansson 2.14: keys in insertion order, `\uXXXX` upper-case for other control characters,
 * reals as %.17g with ".0" added and the exponent's '+' and leading zeros dropped, a string
 * that is not UTF-8 sent as U+FFFD, a non-finite real left out); test_api_sse checks them
 * against jansson. Loop thread, like the rest of the API. */
#include "api-impl.h"

#include "tycho/errors.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define PUT_LIT(f, s) ty_http_frame_put((f), (s), sizeof(s) - 1)

static void put_u64(struct ty_http_frame *f, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[sizeof(tmp) - ++n] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    ty_http_frame_put(f, tmp + sizeof(tmp) - n, n);
}

/* The bytes of a JSON string's inside: `"` `\` and control characters escaped as jansson
 * does; everything else (UTF-8 included) as is. */
static void put_escaped(struct ty_http_frame *f, const char *s, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        ty_http_frame_put(f, s + run, i - run);
        run = i + 1;
        const char *esc;
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        default:
            esc = NULL;
            break;
        }
        if (esc) {
            ty_http_frame_put(f, esc, 2);
            continue;
        }
        char *p = ty_http_frame_room(f, 6);
        memcpy(p, "\\u00", 4);
        p[4] = hex[c >> 4];
        p[5] = hex[c & 15];
        f->p += 6;
    }
    ty_http_frame_put(f, s + run, n - run);
}

/* A JSON string: `s` if it is UTF-8, else U+FFFD (jansson refuses it; the API sent that). */
static void put_text(struct ty_http_frame *f, const char *s, size_t n)
{
    PUT_LIT(f, "\"");
    if (ty_api_utf8_valid(s, n))
        put_escaped(f, s, n);
    else
        PUT_LIT(f, "\xef\xbf\xbd");
    PUT_LIT(f, "\"");
}

/* jansson's real: %.17g, ".0" when it has neither '.' nor 'e', no '+' or leading zeros in the
 * exponent. False (nothing written) for a non-finite value, which json_real refuses. */
static bool put_real(struct ty_http_frame *f, double v)
{
    if (!isfinite(v))
        return false;
    char b[40];
    int n = snprintf(b, sizeof(b), "%.17g", v);
    if (n <= 0 || (size_t)n >= sizeof(b) - 3)
        return false;
    if (!strchr(b, '.') && !strchr(b, 'e')) {
        memcpy(b + n, ".0", 3);
        n += 2;
    }
    char *e = strchr(b, 'e');
    if (e) {
        char *start = e + 1, *end = start + 1;
        if (*start == '-')
            start++;
        while (*end == '0')
            end++;
        if (end != start) {
            memmove(start, end, (size_t)(b + n - end) + 1);
            n -= (int)(end - start);
        }
    }
    ty_http_frame_put(f, b, (size_t)n);
    return true;
}

static void put_ids(struct ty_http_frame *f, const uint32_t *ids, size_t n)
{
    PUT_LIT(f, "[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            PUT_LIT(f, ",");
        put_u64(f, ids[i]);
    }
    PUT_LIT(f, "]");
}

/* A token's text as ty__api_piece_json has it: the piece if UTF-8, else U+FFFD. */
static const char *piece_text(ty_api_t *a, uint32_t id, size_t *n, const char **bytes,
                              size_t *n_bytes)
{
    *bytes = a->tok ? ty_tokenizer_piece(a->tok, id, n_bytes) : "";
    if (!a->tok)
        *n_bytes = 0;
    if (ty_api_utf8_valid(*bytes, *n_bytes)) {
        *n = *n_bytes;
        return *bytes;
    }
    *n = 3;
    return "\xef\xbf\xbd";
}

/* {"token":..,"bytes":[..],"logprob":x (left out when not finite) */
static void put_piece(struct ty_http_frame *f, ty_api_t *a, uint32_t id, float logprob)
{
    const char *bytes, *t;
    size_t n, nb;
    t = piece_text(a, id, &n, &bytes, &nb);
    PUT_LIT(f, "{\"token\":\"");
    put_escaped(f, t, n);
    PUT_LIT(f, "\",\"bytes\":[");
    for (size_t i = 0; i < nb; i++) {
        if (i)
            PUT_LIT(f, ",");
        put_u64(f, (unsigned char)bytes[i]);
    }
    PUT_LIT(f, "]");
    char *mark = f->p;
    PUT_LIT(f, ",\"logprob\":");
    if (!put_real(f, logprob))
        f->p = mark;
}

/* chat: {"content":[{token, bytes, logprob, "top_logprobs":[{token, bytes, logprob}...]}]} */
static void put_logprobs_chat(struct ty_http_frame *f, struct ty__api_gen *g,
                              const struct ty_sample *s)
{
    PUT_LIT(f, "{\"content\":[");
    put_piece(f, g->a, s->id, s->logprob);
    PUT_LIT(f, ",\"top_logprobs\":[");
    for (uint32_t k = 0; k < s->n_top && k < g->req.top_logprobs; k++) {
        if (k)
            PUT_LIT(f, ",");
        put_piece(f, g->a, s->top[k].id, s->top[k].logprob);
        PUT_LIT(f, "}");
    }
    PUT_LIT(f, "]}]}");
}

/* completion: {"tokens":[t],"token_logprobs":[x],"top_logprobs":[{t: x, ...}],"text_offset":[]}.
 * The top object is keyed by token text (up to a NUL, as a C-string key): a text seen twice
 * keeps its first place and takes the later value, as json_object_set does. */
static void put_logprobs_completion(struct ty_http_frame *f, struct ty__api_gen *g,
                                    const struct ty_sample *s)
{
    const char *bytes, *t;
    size_t n, nb;
    t = piece_text(g->a, s->id, &n, &bytes, &nb);
    PUT_LIT(f, "{\"tokens\":[\"");
    put_escaped(f, t, n);
    PUT_LIT(f, "\"],\"token_logprobs\":[");
    put_real(f, s->logprob);
    PUT_LIT(f, "],\"top_logprobs\":[{");
    struct top_entry {
        const char *key;
        size_t n;
        float v;
    } e[TY_SAMPLE_MAX_LOGPROBS];
    uint32_t n_e = 0;
    for (uint32_t k = 0; k < s->n_top && k < g->req.top_logprobs && k < TY_SAMPLE_MAX_LOGPROBS;
         k++) {
        if (!isfinite(s->top[k].logprob))
            continue;
        const char *key = piece_text(g->a, s->top[k].id, &n, &bytes, &nb);
        n = strnlen(key, n);
        uint32_t j = 0;
        while (j < n_e && !(e[j].n == n && !memcmp(e[j].key, key, n)))
            j++;
        if (j == n_e)
            e[n_e++] = (struct top_entry){key, n, 0};
        e[j].v = s->top[k].logprob;
    }
    for (uint32_t j = 0; j < n_e; j++) {
        if (j)
            PUT_LIT(f, ",");
        PUT_LIT(f, "\"");
        put_escaped(f, e[j].key, e[j].n);
        PUT_LIT(f, "\":");
        put_real(f, e[j].v);
    }
    PUT_LIT(f, "}],\"text_offset\":[]}");
}

int ty__api_sse_head(struct ty__api_gen *g)
{
    const char *obj = g->req.kind == TY_API_CHAT ? "chat.completion.chunk" : "text_completion";
    json_t *o = json_pack("{s:s,s:s,s:I,s:s}", "id", g->rid, "object", obj, "created",
                          (json_int_t)g->created, "model", g->a->model_name);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s)
        return TY_ENOMEM;
    size_t n = strlen(s); /* {...} -> {...,  (the members that follow go after it) */
    g->sse_head = ty_arena_alloc(g->arena, n + 1);
    memcpy(g->sse_head, s, n - 1);
    g->sse_head[n - 1] = ',';
    g->sse_head[n] = 0;
    g->n_sse_head = n;
    free(s);
    return 0;
}

/* The chunk's "text" (completions) or "delta" (chat). */
static void put_choice_text(struct ty_http_frame *f, struct ty__api_gen *g,
                            struct ty__api_choice *ch, const char *text, size_t len,
                            const char *role)
{
    if (g->req.kind == TY_API_CHAT) {
        PUT_LIT(f, ",\"delta\":{");
        if (role) {
            PUT_LIT(f, "\"role\":");
            put_text(f, role, strlen(role));
            PUT_LIT(f, ",");
        }
        PUT_LIT(f, "\"content\":");
        put_text(f, text, len);
        PUT_LIT(f, "}");
        return;
    }
    PUT_LIT(f, ",\"text\":");
    const struct ty__api_prompt *p = &g->prompts[ch->prompt];
    if (ch->started || !p->echo) {
        put_text(f, text, len);
        return;
    }
    if (ty_api_utf8_valid(p->echo, p->n_echo) && ty_api_utf8_valid(text, len)) {
        PUT_LIT(f, "\"");
        put_escaped(f, p->echo, p->n_echo);
        put_escaped(f, text, len);
        PUT_LIT(f, "\"");
        return;
    }
    /* one of them alone is not UTF-8; together they may be (the API judged them together) */
    char *s = ty_arena_alloc(g->arena, p->n_echo + len + 1);
    memcpy(s, p->echo, p->n_echo);
    memcpy(s + p->n_echo, text, len);
    put_text(f, s, p->n_echo + len);
}

void ty__api_sse_chunk(struct ty__api_gen *g, uint32_t i, const char *text, size_t len,
                       const struct ty_sample *smp, const char *role, enum ty_finish fin)
{
    struct ty__api_choice *ch = &g->ch[i];
    struct ty_http_frame f;
    if (!g->http || ty_http_frame_begin(g->http, &f)) {
        ch->started = true;
        return;
    }
    PUT_LIT(&f, "data: ");
    ty_http_frame_put(&f, g->sse_head, g->n_sse_head);
    PUT_LIT(&f, "\"choices\":[{\"index\":");
    put_u64(&f, i);
    put_choice_text(&f, g, ch, text, len, role);
    if (g->req.kind == TY_API_COMPLETION && !ch->started && g->req.return_token_ids) {
        PUT_LIT(&f, ",\"prompt_token_ids\":");
        put_ids(&f, g->prompts[ch->prompt].ids, g->prompts[ch->prompt].n);
    }
    ch->started = true;
    PUT_LIT(&f, ",\"logprobs\":");
    if (g->req.logprobs && smp && g->req.kind == TY_API_CHAT)
        put_logprobs_chat(&f, g, smp);
    else if (g->req.logprobs && smp)
        put_logprobs_completion(&f, g, smp);
    else
        PUT_LIT(&f, "null");
    PUT_LIT(&f, ",\"finish_reason\":");
    if (fin) {
        const char *name = ty_finish_name(fin);
        put_text(&f, name, strlen(name));
    } else {
        PUT_LIT(&f, "null");
    }
    if (g->req.return_token_ids && smp) {
        PUT_LIT(&f, ",\"token_ids\":[");
        put_u64(&f, smp->id);
        PUT_LIT(&f, "]");
    }
    PUT_LIT(&f, "}]}\n\n");
    ty_http_frame_end(&f);
}

/* data: {head, "choices":[{"index":i,"delta":  -- the caller writes the delta object, then
 * chunk_end closes it with logprobs null and `reason` (NULL: null). */
static bool chunk_begin(struct ty__api_gen *g, uint32_t i, struct ty_http_frame *f)
{
    g->ch[i].started = true;
    if (!g->http || ty_http_frame_begin(g->http, f))
        return false;
    PUT_LIT(f, "data: ");
    ty_http_frame_put(f, g->sse_head, g->n_sse_head);
    PUT_LIT(f, "\"choices\":[{\"index\":");
    put_u64(f, i);
    PUT_LIT(f, ",\"delta\":");
    return true;
}

static void chunk_end(struct ty_http_frame *f, const char *reason)
{
    PUT_LIT(f, ",\"logprobs\":null,\"finish_reason\":");
    if (reason)
        put_text(f, reason, strlen(reason));
    else
        PUT_LIT(f, "null");
    PUT_LIT(f, "}]}\n\n");
    ty_http_frame_end(f);
}

void ty__api_sse_text(struct ty__api_gen *g, uint32_t i, const char *key, const char *text,
                      size_t len)
{
    struct ty_http_frame f;
    if (!chunk_begin(g, i, &f))
        return;
    PUT_LIT(&f, "{");
    put_text(&f, key, strlen(key));
    PUT_LIT(&f, ":");
    put_text(&f, text, len);
    PUT_LIT(&f, "}");
    chunk_end(&f, NULL);
}

void ty__api_sse_call(struct ty__api_gen *g, uint32_t i, size_t index, const char *id,
                      const struct ty__api_call *call)
{
    struct ty_http_frame f;
    if (!chunk_begin(g, i, &f))
        return;
    PUT_LIT(&f, "{\"tool_calls\":[{\"index\":");
    put_u64(&f, index);
    PUT_LIT(&f, ",\"id\":");
    put_text(&f, id, strlen(id));
    PUT_LIT(&f, ",\"type\":\"function\",\"function\":{\"name\":");
    put_text(&f, call->name, strlen(call->name));
    PUT_LIT(&f, ",\"arguments\":\"\"}}]}");
    chunk_end(&f, NULL);
    if (!chunk_begin(g, i, &f))
        return;
    PUT_LIT(&f, "{\"tool_calls\":[{\"index\":");
    put_u64(&f, index);
    PUT_LIT(&f, ",\"function\":{\"arguments\":");
    put_text(&f, call->args, strlen(call->args));
    PUT_LIT(&f, "}}]}");
    chunk_end(&f, NULL);
}

void ty__api_sse_finish(struct ty__api_gen *g, uint32_t i, const char *reason)
{
    struct ty_http_frame f;
    if (!chunk_begin(g, i, &f))
        return;
    PUT_LIT(&f, "{}");
    chunk_end(&f, reason);
}

void ty__api_sse_usage(struct ty__api_gen *g, uint64_t in, uint64_t cached, uint64_t out)
{
    struct ty_http_frame f;
    if (!g->http || ty_http_frame_begin(g->http, &f))
        return;
    PUT_LIT(&f, "data: ");
    ty_http_frame_put(&f, g->sse_head, g->n_sse_head);
    PUT_LIT(&f, "\"choices\":[],\"usage\":{\"prompt_tokens\":");
    put_u64(&f, in);
    PUT_LIT(&f, ",\"completion_tokens\":");
    put_u64(&f, out);
    PUT_LIT(&f, ",\"total_tokens\":");
    put_u64(&f, in + out);
    PUT_LIT(&f, ",\"prompt_tokens_details\":{\"cached_tokens\":");
    put_u64(&f, cached);
    PUT_LIT(&f, "}}}\n\n");
    ty_http_frame_end(&f);
}
